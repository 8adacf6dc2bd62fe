#!/bin/bash
# reccl GPU run: the staged MoE protocol (one round) against the table protocol (two rounds), the
# tests with both, the table protocol's current build (fused) against the five-kernel build of
# 9ac7926 (mask), and call2: the staged protocol's second version (batched copies, block scan)
# against its first (v1, call1's binary). Most important first: a run cut short still says something.
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:$LD_LIBRARY_PATH NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")"
mkdir -p /tmp/r && R=/tmp/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
date -u | tee -a $OUT/machine.txt
for t in p2p_expert_exchange moe_processes p2p_calls; do
  echo "== $t"; timeout 240 ./reccl.test.device.$t 2>&1 | tail -25; echo "rc=${PIPESTATUS[0]}"
done > $OUT/tests.log 2>&1
grep -E "==|test cases|rc=" $OUT/tests.log
echo "== moe_layer_gpu"; timeout 120 ./moe_layer_gpu > $OUT/moe_layer.log 2>&1; echo "rc=$?" >> $OUT/moe_layer.log; tail -3 $OUT/moe_layer.log
run() {  # name, binary, args...
  local name=$1 bin=$2; shift 2
  echo "== $name"; timeout 150 ./$bin "$@" --json $R/$name.json > $R/$name.log 2>&1; echo "rc=$?"; tail -6 $R/$name.log
}
S="--ranks 2 --tokens 1,8,128,512 --ctas 64 --align 16 --reps 20"
V="--ranks 2 --tokens 1,8,128 --ctas 64 --align 16 --reps 20"
P="--ranks 2 --tokens 1,8,128,512,4096 --ctas 64 --align 16 --reps 20"
{
  run staged_1 moe_perf_fused $S --staged
  run v1_1 moe_perf_v1 $V --staged
  run table_1 moe_perf_fused $P
  echo "== traces"
  timeout 100 ./moe_perf_trace --ranks 2 --tokens 1,8,128 --ctas 64 --align 16 --reps 5 --staged 2>&1 | tail -12
  timeout 100 ./moe_perf_trace --ranks 2 --tokens 1,8,128 --ctas 64 --align 16 --reps 5 2>&1 | tail -12
  run v1_2 moe_perf_v1 $V --staged
  run staged_2 moe_perf_fused $S --staged
  run mask_1 moe_perf_mask $P
  run table_2 moe_perf_fused $P
  run staged_fp8 moe_perf_fused $S --staged --fp8
  run table_fp8 moe_perf_fused $S --fp8
  run staged_c32 moe_perf_fused --ranks 2 --tokens 1,8,128 --ctas 32 --align 16 --reps 20 --staged
  run staged_r4 moe_perf_fused --ranks 4 --tokens 1,128 --ctas 32 --align 16 --reps 20 --staged
  run table_r4 moe_perf_fused --ranks 4 --tokens 1,128 --ctas 32 --align 16 --reps 20
  run mask_2 moe_perf_mask $P
} > $OUT/perf.log 2>&1
tar -C $R -czf $OUT/perf_json.tgz .
grep -E "^==|^ +[0-9]+ |what" $OUT/perf.log | tail -90
