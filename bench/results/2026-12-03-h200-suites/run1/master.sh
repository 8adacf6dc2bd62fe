#!/usr/bin/env bash
# One device session, run detached (setsid) so no single call's 600 s limit cuts it: prebuilt
# binaries (built on the workstation with the same nvcc 13.0, Release, sm_90) are unpacked at the
# build tree's own absolute path so CTest's files resolve; then, in priority order, each stage
# writing under $M: the gpu-labelled CTest suite but the big cases, the fused example's full table,
# the big cases, then A/B pairs of the loopback perf binaries (old = 71d83da) until the deadline.
M=/tmp/m; mkdir -p $M
exec > $M/master.log 2>&1
END=$(( $(date +%s) + ${BUDGET_S:-1150} ))
left() { echo $(( END - $(date +%s) )); }
stamp() { echo "[$(date +%H:%M:%S) left $(left)s] $*"; }
export NCCL_NVLS_ENABLE=0 PATH=/usr/local/cuda/bin:$PATH
W=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')/lib
export LD_LIBRARY_PATH=$W:${LD_LIBRARY_PATH:-}
REPO=$PWD
stamp "unpack"; mkdir -p /work/wt/gpubuild && tar xJf .devbin/gpubuild.txz -C /work/wt/gpubuild && stamp "unpacked"
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:/work/wt/gpubuild/lib
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > $M/machine.txt 2>&1
echo "commit $(cat .devbin/COMMIT) date $(date -u +%FT%TZ)" >> $M/machine.txt
B=/work/wt/gpubuild/build/gpu
for b in $(find $B -type f -perm -u+x \( -name "reccl.*" -o -name fused_allreduce_rmsnorm \)) $REPO/.devbin/lb_new $REPO/.devbin/ll_floor; do ldd $b | grep -E "not found|nccl" | sed "s|^|$(basename $b): |"; done >> $M/machine.txt
BIG='16 MiB per schedule|256 MiB per collective|1 GiB'
stamp "ctest (gpu label, not the big cases)"
(cd $B && timeout $(( $(left) - 420 )) ctest -L gpu -E "$BIG" --timeout 400 --output-on-failure > $M/ctest.log 2>&1; echo "ctest rc=$?" >> $M/ctest.log)
stamp "$(tail -1 $M/ctest.log)"
FU=$B/examples/03_fused_allreduce_rmsnorm/fused_allreduce_rmsnorm
stamp "fused example"
timeout $(( $(left) > 300 ? 240 : $(left) / 2 )) $FU --json $M/fused.json > $M/fused.txt 2>&1; stamp "fused rc=$?"
stamp "small messages: floor, the shared floor tool, reccl (lb_new) at 1 KiB-256 KiB, 2-4 ranks"
timeout 120 $REPO/.devbin/ll_floor --json $M/floor.json > $M/floor.txt 2>&1; stamp "floor rc=$?"
timeout 60 $REPO/.devbin/ll_floor_shared > $M/floor_shared.txt 2>&1; stamp "shared floor rc=$?"
SMALL=1024,4096,16384,65536,262144
for n in 2 3 4; do
  timeout 150 $REPO/.devbin/lb_new --ranks $n --bytes $SMALL --reps 20 --label small_$n --json $M/small_$n.json > $M/small_$n.txt 2>&1
  stamp "reccl small, $n ranks rc=$?"
done
timeout 150 $REPO/.devbin/lb_new --ranks 2 --colls all_reduce --bytes $SMALL --algo one_shot --ctas 1,2,4,8,16,32,64 --reps 20 --label sweep --json $M/small_sweep.json > $M/small_sweep.txt 2>&1; stamp "reccl one-shot CTA sweep rc=$?"
timeout 100 $REPO/.devbin/lb_new --ranks 2 --colls all_reduce --bytes $SMALL --pdl 0 --reps 20 --label nopdl --json $M/small_nopdl.json > $M/small_nopdl.txt 2>&1; stamp "reccl without PDL rc=$?"
stamp "big cases"
(cd $B && timeout $(( $(left) - 200 )) ctest -L gpu -R "$BIG" --timeout 300 --output-on-failure > $M/ctest_big.log 2>&1; echo "ctest big rc=$?" >> $M/ctest_big.log)
stamp "$(tail -1 $M/ctest_big.log)"
stamp "A/B loopback perf"
i=0
while [[ $(left) -gt 60 && $i -lt 20 ]]; do
  i=$((i+1))
  timeout 60 $REPO/.devbin/lb_old --reps 3 --label old --json $M/ab_old_$i.json > /dev/null 2>> $M/ab_err.log || echo "old $i failed" >> $M/ab_err.log
  timeout 60 $REPO/.devbin/lb_new --reps 3 --label new --json $M/ab_new_$i.json > /dev/null 2>> $M/ab_err.log || echo "new $i failed" >> $M/ab_err.log
  stamp "pair $i"
done
python3 $REPO/bench/perf/ab_table.py $M > $M/ab_table.txt 2>&1
stamp "done"
touch $M/DONE
