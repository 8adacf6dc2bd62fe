#!/bin/bash
# call 1: where the illegal memory access of the agent's packs is
export NCCL_NVLS_ENABLE=0
cd .devbin
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/machine.txt
which compute-sanitizer || ls /usr/local/cuda/bin | head -50
CS=$(which compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 120 $CS --tool memcheck --print-limit 5 ./agent_perf --ranks 2 --bytes 65536 --reps 2 > $OUT/san_agent.log 2>&1; echo "san_agent rc=$?"
head -60 $OUT/san_agent.log
timeout 60 ./agent_perf --ranks 2 --bytes 65536,1048576 --reps 3 > $OUT/agent.log 2>&1; echo "agent rc=$?"; tail -15 $OUT/agent.log
timeout 150 ./p2p_all_reduce -tc="*ring*" > $OUT/ar_ring.log 2>&1; echo "ar_ring rc=$?"; grep -m5 -B2 -A8 "ERROR\|illegal" $OUT/ar_ring.log | head -40; tail -4 $OUT/ar_ring.log
