#!/usr/bin/env bash
# One device session, run detached (setsid) so no single call's limit cuts it. Binaries: the CI
# clone's cuda-compile build (/tmp/ci on the workstation, nvcc 13.0, sm_90), unpacked at the same
# absolute path (/tmp/ci -> this tree) so CTest's files resolve; lb_new/lb_old: reccl_loopback_perf
# built by one nvcc command against this tree's include/ and 71d83da's. Stages in priority order.
M=/tmp/m; mkdir -p $M
exec > $M/master.log 2>&1
END=$(( $(date +%s) + ${BUDGET_S:-450} ))
left() { echo $(( END - $(date +%s) )); }
stamp() { echo "[$(date +%H:%M:%S) left $(left)s] $*"; }
export NCCL_NVLS_ENABLE=0 PATH=/usr/local/cuda/bin:$PATH
W=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')/lib
export LD_LIBRARY_PATH=$W:${LD_LIBRARY_PATH:-}
REPO=$PWD
stamp "unpack"; ln -sfn $REPO /tmp/ci && tar xJf .devbin/cibuild.txz -C $REPO && stamp "unpacked"
export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$REPO/lib
B=/tmp/ci/build/cuda-compile
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > $M/machine.txt 2>&1
echo "commit p2p suites 4f23843, coll_fold/proxy_fold/lb_fold 44fee8e+fold (uncommitted), lb_old 71d83da date $(date -u +%FT%TZ)" >> $M/machine.txt
for b in $B/tests/device/reccl.test.device.p2p_all_reduce $REPO/.devbin/lb_fold $REPO/.devbin/lb_old $REPO/.devbin/coll_fold $REPO/.devbin/proxy_fold $REPO/.devbin/ll_floor; do ldd $b | grep -E "not found|nccl" | sed "s|^|$(basename $b): |"; done >> $M/machine.txt
BIG='16 MiB per schedule|256 MiB per collective|1 GiB'
stamp "ctest p2p suites (not the big cases)"
(cd $B && timeout 130 ctest -L gpu -R "p2p" -E "$BIG" --timeout 60 --output-on-failure > $M/ctest_p2p.log 2>&1; echo "ctest rc=$?" >> $M/ctest_p2p.log)
stamp "$(grep -E 'tests passed' $M/ctest_p2p.log) $(tail -1 $M/ctest_p2p.log)"
stamp "NVLink-path collectives suite, HEAD with the one rank-order fold (coll_fold)"
timeout 90 $REPO/.devbin/coll_fold > $M/coll_fold.log 2>&1; stamp "coll_fold rc=$? $(tail -2 $M/coll_fold.log | head -1)"
stamp "proxy collectives suite, HEAD with the fold (proxy_fold)"
timeout 90 $REPO/.devbin/proxy_fold > $M/proxy_fold.log 2>&1; stamp "proxy_fold rc=$? $(tail -2 $M/proxy_fold.log | head -1)"
timeout 45 $REPO/.devbin/ll_floor --ranks 2 --reps 20 --json $M/floor.json > $M/floor.txt 2>&1; stamp "floor rc=$?"
timeout 20 $REPO/.devbin/ll_floor_shared > $M/floor_shared.txt 2>&1; stamp "shared floor rc=$?"
timeout 30 $REPO/.devbin/lb_fold --ranks 2 --colls all_reduce --bytes $SMALL --reps 20 --label small_2 --json $M/small_2.json > $M/small_2.txt 2>&1; stamp "reccl small 2 ranks rc=$?"
stamp "A/B loopback perf: old = 71d83da, new = HEAD with the fold"
i=0
while [[ $(left) -gt 25 && $i -lt 20 ]]; do
  i=$((i+1))
  timeout 20 $REPO/.devbin/lb_old --reps 3 --label old --json $M/ab_old_$i.json > /dev/null 2>> $M/ab_err.log || echo "old $i failed" >> $M/ab_err.log
  timeout 20 $REPO/.devbin/lb_fold --reps 3 --label new --json $M/ab_new_$i.json > /dev/null 2>> $M/ab_err.log || echo "new $i failed" >> $M/ab_err.log
  stamp "pair $i"
done
python3 $REPO/bench/perf/ab_table.py $M > $M/ab_table.txt 2>&1
stamp "done"
touch $M/DONE
