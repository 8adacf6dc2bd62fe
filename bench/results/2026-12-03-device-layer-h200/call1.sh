#!/usr/bin/env bash
# call 1: configure + build the GPU targets and the A/B binaries in parallel, then the new tests and the fused example
export NCCL_NVLS_ENABLE=0 PATH=/usr/local/cuda/bin:$PATH
set -o pipefail
START=$(date +%s)
cmake --preset gpu -DCMAKE_CUDA_ARCHITECTURES=90 >$OUT/cfg.log 2>&1 || { tail -20 $OUT/cfg.log; exit 1; }
mkdir -p build-gpu
NCCL_INC=$(dirname "$(ls /usr/include/nccl.h /usr/local/cuda/include/nccl.h 2>/dev/null | head -1)")
ABF=(-std=c++20 -arch=sm_90 -O3 --expt-relaxed-constexpr -I.)
[[ "$NCCL_INC" != /usr/include ]] && ABF+=(-isystem "$NCCL_INC")
(nvcc "${ABF[@]}" -Iinclude bench/perf/loopback_perf.cu -o build-gpu/lb_new -lnccl > $OUT/ab_new.log 2>&1; echo "ab_new rc=$?" >> $OUT/ab_new.log) &
(nvcc "${ABF[@]}" -I.devbin/old-include bench/perf/loopback_perf.cu -o build-gpu/lb_old -lnccl > $OUT/ab_old.log 2>&1; echo "ab_old rc=$?" >> $OUT/ab_old.log) &
T="reccl.test.device.p2p_collectives reccl.test.device.p2p_processes reccl.example.fused_allreduce_rmsnorm reccl.test.device.collectives reccl.test.device.adaptive reccl.test.device.multiprocess reccl.test.device.copy_engine reccl.test.device.proxy_collectives reccl.test.device.proxy_processes reccl.test.device.policy_parity reccl.test.device.dtype_subset reccl.example.quickstart_gpu"
SECONDS=0
timeout 420 cmake --build build/gpu -j 16 --target $T > $OUT/build.log 2>&1; echo "build rc=$? ${SECONDS}s"
grep -m3 -A12 "error" $OUT/build.log
B=build/gpu
P2P=$(find $B -name reccl.test.device.p2p_collectives -type f | head -1)
PP=$(find $B -name reccl.test.device.p2p_processes -type f | head -1)
FU=$(find $B -name fused_allreduce_rmsnorm -type f | head -1)
QS=$(find $B -name quickstart_gpu -type f | head -1)
[[ -n "$P2P" ]] && { SECONDS=0; timeout 150 $P2P > $OUT/p2p.log 2>&1; echo "p2p rc=$? ${SECONDS}s"; grep -E "FAILED|ERROR|test cases|assertions|skipped" $OUT/p2p.log | head -20; }
[[ -n "$PP" ]] && { SECONDS=0; timeout 90 $PP > $OUT/p2pproc.log 2>&1; echo "p2pproc rc=$? ${SECONDS}s"; grep -E "FAILED|ERROR|test cases|assertions|skipped" $OUT/p2pproc.log | head -10; }
[[ -n "$QS" ]] && { timeout 60 $QS > $OUT/quickstart.log 2>&1; echo "quickstart rc=$?"; tail -2 $OUT/quickstart.log; }
[[ -n "$FU" ]] && { SECONDS=0; timeout 120 $FU --json $OUT/fused.json > $OUT/fused.txt 2>&1; echo "fused rc=$? ${SECONDS}s"; tail -30 $OUT/fused.txt; }
wait; tail -1 $OUT/ab_new.log $OUT/ab_old.log
left() { echo $(( 560 - $(date +%s) + START )); }
if [[ -x build-gpu/lb_new && -x build-gpu/lb_old && $(left) -gt 150 ]]; then
  for i in 1 2 3 4 5 6 7 8; do
    [[ $(left) -lt 120 ]] && break
    build-gpu/lb_old --reps 3 --label old --json $OUT/ab_old_$i.json >/dev/null 2>>$OUT/ab_err.log
    build-gpu/lb_new --reps 3 --label new --json $OUT/ab_new_$i.json >/dev/null 2>>$OUT/ab_err.log
  done
  python3 bench/perf/ab_table.py $OUT > $OUT/ab_table.txt 2>&1; cat $OUT/ab_table.txt
fi
C=$(find build/gpu -name reccl.test.device.collectives -type f | head -1)
[[ -n "$C" && $(left) -gt 60 ]] && { timeout $(( $(left) - 10 )) $C > $OUT/coll.log 2>&1; echo "collectives rc=$?"; grep -E "FAILED|ERROR|test cases|skipped" $OUT/coll.log | head; }
(cd $OUT && tar czf /tmp/all.tgz . && rm -rf ./* && mv /tmp/all.tgz .); ls $OUT
