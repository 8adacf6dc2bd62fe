#!/bin/bash
# call 4: MoE with the padding spread over warps and the expert prefix as a warp scan; moe_perf
# old (04fb0aa) and new in one run; an nsys kernel table of dispatch+combine at 8 tokens
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
step moe_test 90 ./p2p_expert_exchange
grep -B3 -A10 "ERROR" $O/moe_test.log | head -30
step moe_perf_old_64 90 ./moe_perf_old --ranks 2 --reps 5 --ctas 64 --json $O/moe_perf_old_64.json
step moe_perf_new_64 90 ./moe_perf --ranks 2 --reps 5 --ctas 64 --json $O/moe_perf_new_64.json
step moe_perf_new_16 90 ./moe_perf --ranks 2 --reps 5 --ctas 16 --json $O/moe_perf_new_16.json
NS=$(which nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
echo "nsys: $NS"
if [ -n "$NS" ]; then
  timeout 120 $NS profile -t cuda --cuda-graph-trace=node -o $O/moe8 --force-overwrite true ./moe_perf --ranks 2 --tokens 8 --reps 3 --ctas 64 > $O/nsys_run.log 2>&1
  timeout 60 $NS stats -r cuda_gpu_kern_sum -f csv -o $O/moe8 $O/moe8.nsys-rep > $O/nsys_stats.log 2>&1
  cut -c1-200 $O/moe8_cuda_gpu_kern_sum.csv 2>/dev/null | head -12
  rm -f $O/moe8.nsys-rep $O/moe8.sqlite
fi
echo "--- moe old64 / new64 / new16"; for f in moe_perf_old_64 moe_perf_new_64 moe_perf_new_16; do tail -6 $O/$f.log; done
tar czf $OUT/call4.tgz -C $OUT r
