#!/bin/bash
# reccl GPU run: the dead-rank mask and resume() tests, the MoE example, MoE speed old vs new.
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:$LD_LIBRARY_PATH NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
date -u | tee -a $OUT/machine.txt
for t in p2p_expert_exchange p2p_calls moe_processes; do
  echo "== $t"; timeout 240 ./reccl.test.device.$t 2>&1 | tail -12; echo "rc=${PIPESTATUS[0]}"
done > $OUT/tests.log 2>&1
grep -E "==|test cases|rc=" $OUT/tests.log
echo "== moe_layer_gpu"; timeout 120 ./moe_layer_gpu > $OUT/moe_layer.log 2>&1; echo "rc=$?" >> $OUT/moe_layer.log; tail -3 $OUT/moe_layer.log
for round in 1 2; do
  for v in old new; do
    echo "== moe_perf $v round $round"
    timeout 150 ./moe_perf_$v --ranks 2 --tokens 1 128 4096 --ctas 64 --align 16 --reps 20 --json $OUT/perf_${v}_$round.json > /tmp/perf_${v}_$round.log 2>&1
    echo "rc=$?"; tail -4 /tmp/perf_${v}_$round.log
  done
done | tee $OUT/perf.log
