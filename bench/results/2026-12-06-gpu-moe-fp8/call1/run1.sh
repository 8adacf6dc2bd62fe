#!/bin/bash
# session 10 call 1: fp8 MoE dispatch tests, GPU example, processes, perf old/new bf16 + fp8, trace, sanitizer
cd "$(dirname "$0")"
export NCCL_NVLS_ENABLE=0 CUDA_MODULE_LOADING=EAGER
o=$OUT/call1; mkdir -p $o
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $o/gpu.txt 2>&1
date -u > $o/date.txt
step() { local name=$1 t=$2; shift 2; timeout $t "$@" > $o/$name.txt 2>&1; echo "$name rc=$?" >> $o/summary.txt; (cd $OUT && tar czf call1.tgz call1); }
step p2p_expert_exchange 240 ./p2p_expert_exchange
step moe_layer_gpu 60 ./moe_layer_gpu
step moe_layer_gpu_fp8 60 ./moe_layer_gpu --ranks 3 --experts 12 --top-k 6 --hidden 256 --fp8
step moe_layer_gpu_fp8_big 60 ./moe_layer_gpu --ranks 2 --experts 256 --top-k 8 --hidden 256 --tokens 64 --fp8
step old_bf16 90 ./moe_perf_old --ranks 2 --ctas 64 --tokens 1,8,128,512,4096 --reps 10 --json $o/old_bf16.json
step new_bf16 90 ./moe_perf --ranks 2 --ctas 64 --tokens 1,8,128,512,4096 --reps 10 --json $o/new_bf16.json
step new_fp8 90 ./moe_perf --ranks 2 --ctas 64 --fp8 --tokens 1,8,128,512,4096 --reps 10 --json $o/new_fp8.json
step trace 60 ./moe_perf_trace --ranks 2 --ctas 64 --tokens 1,8,128,4096 --reps 3
step moe_processes 120 ./moe_processes
step sanitizer_fp8 120 compute-sanitizer --tool memcheck ./p2p_expert_exchange -tc='*fp8*'
cd $OUT
cat call1/summary.txt
for f in call1/old_bf16.txt call1/new_bf16.txt call1/new_fp8.txt; do echo "== $f"; tail -7 $f; done
tail -3 call1/moe_layer_gpu*.txt call1/p2p_expert_exchange.txt call1/moe_processes.txt call1/sanitizer_fp8.txt
