#!/bin/bash
# call 3: MoE with the shared-memory layout, unrolled row copies and packed sums (tests, then
# moe_perf old/new in one run); the p2p suites and the agent A/B on the fixed handle copy
export NCCL_NVLS_ENABLE=0
cd .devbin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
step() {  # step NAME MAX_S CMD...
  local name=$1 max=$2; shift 2
  local left=$((540 - SECONDS))
  if [ $left -lt 15 ]; then echo "$name: not run (time)" | tee -a $OUT/summary.txt; return; fi
  [ $max -gt $left ] && max=$left
  local t0=$SECONDS
  timeout $max "$@" > $OUT/$name.log 2>&1
  echo "$name rc=$? $((SECONDS - t0))s $(grep -h 'test cases:' $OUT/$name.log | tail -1)" | tee -a $OUT/summary.txt
}
step a2av_test 90 ./p2p_all_to_allv
step moe_test 90 ./p2p_expert_exchange
grep -B3 -A10 "ERROR" $OUT/moe_test.log | head -40
step moe_perf_old_16 90 ./moe_perf_old --ranks 2 --reps 5 --ctas 16 --json $OUT/moe_perf_old_16.json
step moe_perf_new_16 90 ./moe_perf --ranks 2 --reps 5 --ctas 16 --json $OUT/moe_perf_new_16.json
step moe_perf_new_64 90 ./moe_perf --ranks 2 --reps 5 --ctas 64 --json $OUT/moe_perf_new_64.json
step san_agent 60 compute-sanitizer --tool memcheck --print-limit 2 ./agent_perf --ranks 2 --bytes 65536 --reps 2
step p2p_all_reduce 150 ./p2p_all_reduce -tse=big
step p2p_rs_ag 100 ./p2p_reduce_scatter_all_gather -tse=big
step agent_old_1 45 ./agent_perf_old --ranks 2 --bytes 65536,1048576,16777216 --reps 10 --json $OUT/agent_old_1.json
step agent_new_1 45 ./agent_perf --ranks 2 --bytes 65536,1048576,16777216 --reps 10 --json $OUT/agent_new_1.json
step agent_old_2 45 ./agent_perf_old --ranks 2 --bytes 65536,1048576,16777216 --reps 10 --json $OUT/agent_old_2.json
step agent_new_2 45 ./agent_perf --ranks 2 --bytes 65536,1048576,16777216 --reps 10 --json $OUT/agent_new_2.json
step multiprocess 60 ./multiprocess
step collectives_2 90 env RECCL_TEST_LOOPBACK=2 ./collectives
grep -h "composed cases\|rank 0 stopped" $OUT/collectives_2.log | head -5
echo "--- moe old / new16 / new64"; for f in moe_perf_old_16 moe_perf_new_16 moe_perf_new_64; do tail -6 $OUT/$f.log; done
echo "--- agent old/new round 2"; tail -13 $OUT/agent_old_2.log; tail -13 $OUT/agent_new_2.log
