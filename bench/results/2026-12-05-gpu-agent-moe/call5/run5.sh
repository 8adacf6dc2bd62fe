#!/bin/bash
# call 5: all_to_allv and MoE with 2 and 3 processes sharing the GPU; the loopback suites again
# (their shared pieces moved to headers)
export NCCL_NVLS_ENABLE=0
cd .devbin
O=$OUT/r; mkdir -p $O
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $O/machine.txt
step() {
  local name=$1 max=$2; shift 2
  local t0=$SECONDS
  timeout $max "$@" > $O/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - t0))s $(grep -h 'test cases:' $O/$name.log | tail -1)" | tee -a $O/summary.txt
}
step moe_processes 240 ./moe_processes
grep -h "rank .* of\|never dispatches\|ERROR\|differ\|fault" $O/moe_processes.log | head -30
step a2av_test 90 ./p2p_all_to_allv
step moe_test 90 ./p2p_expert_exchange
tar czf $OUT/call5.tgz -C $OUT r
