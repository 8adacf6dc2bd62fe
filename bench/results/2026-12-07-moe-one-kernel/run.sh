#!/bin/bash
# reccl GPU run: MoE dispatch and combine as one kernel each -- the tests, the example, and the speed
# of two builds in one run, interleaved: mask (9ac7926: five kernels with the dead-rank mask) and
# fused (one dispatch kernel, one combine kernel). call1 also ran old (b81ce50, before the mask).
# Most important first: what a cut-short run leaves in $OUT is still worth reading.
export LD_LIBRARY_PATH=$(python3 -c 'import nvidia.nccl as n;print(n.__path__[0])')/lib:$LD_LIBRARY_PATH NCCL_NVLS_ENABLE=0
cd "$(dirname "$0")"
mkdir -p /tmp/r && R=/tmp/r
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
date -u | tee -a $OUT/machine.txt
for t in p2p_expert_exchange moe_processes p2p_calls; do
  echo "== $t"; timeout 240 ./reccl.test.device.$t 2>&1 | tail -12; echo "rc=${PIPESTATUS[0]}"
done > $OUT/tests.log 2>&1
grep -E "==|test cases|rc=" $OUT/tests.log
echo "== moe_layer_gpu"; timeout 120 ./moe_layer_gpu > $OUT/moe_layer.log 2>&1; echo "rc=$?" >> $OUT/moe_layer.log; tail -3 $OUT/moe_layer.log
P="--ranks 2 --tokens 1,8,128,512,4096 --ctas 64 --align 16 --reps 20"
run() {  # name, binary, args...
  local name=$1 bin=$2; shift 2
  echo "== $name"; timeout 150 ./$bin "$@" --json $R/$name.json > $R/$name.log 2>&1; echo "rc=$?"; tail -6 $R/$name.log
}
{
  run fused_bf16_1 moe_perf_fused $P
  run mask_bf16_1 moe_perf_mask $P
  echo "== fused trace"; timeout 150 ./moe_perf_trace --ranks 2 --tokens 1,8,128,4096 --ctas 64 --align 16 --reps 5 2>&1 | tail -16
  for c in 8 16 32; do run fused_c$c moe_perf_fused --ranks 2 --tokens 1,8,128 --ctas $c --align 16 --reps 20; done
  run mask_bf16_2 moe_perf_mask $P
  run fused_bf16_2 moe_perf_fused $P
  run fused_fp8 moe_perf_fused $P --fp8
  run mask_fp8 moe_perf_mask $P --fp8
  for n in 3 4; do
    E=$([ $n = 3 ] && echo 255 || echo 256)  # experts spread evenly: 255 over 3 ranks
    for v in mask fused; do run ${v}_r$n moe_perf_$v --ranks $n --experts $E --tokens 1,128,4096 --ctas 32 --align 16 --reps 20; done
  done
} > $OUT/perf.log 2>&1
tar -C $R -czf $OUT/perf_json.tgz .
tail -50 $OUT/perf.log
