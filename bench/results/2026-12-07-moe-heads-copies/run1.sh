#!/bin/bash
# reccl GPU run: one head check for both protocols, drops and prologues shared, copy_each only for
# one-pack pieces, the staged publish step several tokens per warp round (new) against e0641b1
# (base), interleaved in one call; the MoE tests with both protocols first.
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
P="--ranks 2 --tokens 1,8,128,512,4096 --ctas 64 --align 16 --reps 20"
{
  run new_staged_1 moe_perf_new $S --staged
  run base_staged_1 moe_perf_base $S --staged
  run new_table_1 moe_perf_new $P
  run base_table_1 moe_perf_base $P
  echo "== traces"
  timeout 100 ./moe_perf_trace_new --ranks 2 --tokens 1,8,128 --ctas 64 --align 16 --reps 5 --staged 2>&1 | tail -12
  timeout 100 ./moe_perf_trace_base --ranks 2 --tokens 1,8,128 --ctas 64 --align 16 --reps 5 --staged 2>&1 | tail -12
  timeout 100 ./moe_perf_trace_new --ranks 2 --tokens 1,8,128 --ctas 64 --align 16 --reps 5 2>&1 | tail -12
  run base_staged_2 moe_perf_base $S --staged
  run new_staged_2 moe_perf_new $S --staged
  run base_table_2 moe_perf_base $P
  run new_table_2 moe_perf_new $P
  run new_staged_fp8 moe_perf_new $S --staged --fp8
  run base_staged_fp8 moe_perf_base $S --staged --fp8
  run new_staged_r4 moe_perf_new --ranks 4 --tokens 1,128 --ctas 32 --align 16 --reps 20 --staged
  run base_staged_r4 moe_perf_base --ranks 4 --tokens 1,128 --ctas 32 --align 16 --reps 20 --staged
} > $OUT/perf.log 2>&1
tar -C $R -czf $OUT/perf_json.tgz .
grep -E "^==|^ +[0-9]+ |what" $OUT/perf.log | tail -100
