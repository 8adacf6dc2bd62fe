#!/bin/bash
# call 2: which change holds the agent's null read (sanitizer on HEAD, v1 = old apply loops,
# v2 = old handle copy), the SASS at the faulting PC; the fixed all-to-allv and MoE suites, moe_perf
export NCCL_NVLS_ENABLE=0
cd .devbin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
for v in "" _v1 _v2; do
  timeout 90 compute-sanitizer --tool memcheck --print-limit 2 ./agent_perf$v --ranks 2 --bytes 65536 --reps 2 > $OUT/san_agent$v.log 2>&1
  echo "san agent$v rc=$? $(grep -m1 'ERROR SUMMARY' $OUT/san_agent$v.log) $(grep -m1 ' at void' $OUT/san_agent$v.log | cut -c1-150)"
done
F=$(cuobjdump -sass ./agent_perf 2>/dev/null | grep -m1 -o 'Function : _ZN5reccl6device11plan_kernelI13__nv_bfloat16NS_8schedule8two_shot[^ ]*')
echo "function: $F"
cuobjdump -sass ./agent_perf 2>/dev/null | awk -v f="${F#Function : }" '$0 ~ "Function : "f {on=1} on && /Function : / && $0 !~ f {on=0} on' > $OUT/sass_two_shot.txt
grep -n "/\*2270\*/" $OUT/sass_two_shot.txt | head -2
L=$(grep -n "/\*2270\*/" $OUT/sass_two_shot.txt | head -1 | cut -d: -f1)
[ -n "$L" ] && sed -n "$((L-70)),$((L+4))p" $OUT/sass_two_shot.txt | cut -c1-110
timeout 120 ./p2p_all_to_allv > $OUT/a2av.log 2>&1; echo "a2av rc=$?"; grep -B3 -A12 "ERROR" $OUT/a2av.log | head -60; tail -3 $OUT/a2av.log
timeout 150 ./p2p_expert_exchange > $OUT/moe.log 2>&1; echo "moe rc=$?"; grep -B3 -A12 "ERROR" $OUT/moe.log | head -60; tail -3 $OUT/moe.log
timeout 120 ./moe_perf --ranks 2 --tokens 1,128,4096 --reps 5 --json $OUT/moe_perf.json > $OUT/moe_perf.log 2>&1; echo "moe_perf rc=$?"; tail -8 $OUT/moe_perf.log
