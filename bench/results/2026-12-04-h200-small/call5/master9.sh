#!/usr/bin/env bash
# Device call 5: the final tree (header published first and checked late, op fixed at compile time in
# the n-rank fold, hot kernel arguments first, the single-pack fold as its own loop) against d3bb4d8
# (lb_base) and 71d83da (ad_old): suites, ladder, small-message A/B at 2-4 ranks, full A/B, adaptive overhead.
M=/tmp/m9; mkdir -p $M
exec > $M/master.log 2>&1
END=$(( $(date +%s) + ${BUDGET_S:-560} ))
left() { echo $(( END - $(date +%s) )); }
stamp() { echo "[$(date +%H:%M:%S) left $(left)s] $*"; }
export NCCL_NVLS_ENABLE=0
W=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')/lib
export LD_LIBRARY_PATH=$W:${LD_LIBRARY_PATH:-}
D=$PWD/.devbin
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > $M/machine.txt 2>&1
echo "date $(date -u +%FT%TZ)" >> $M/machine.txt
SMALL=1024,4096,16384,65536,262144
stamp "collectives suite, 2 loopback ranks"
timeout 100 $D/coll_final > $M/coll_2.log 2>&1; stamp "coll 2 rc=$? $(grep -E 'test cases|assertions' $M/coll_2.log | tail -2 | tr '\n' ' ')"
stamp "proxy suite"
timeout 100 $D/proxy_final > $M/proxy.log 2>&1; stamp "proxy rc=$? $(grep -E 'test cases|assertions' $M/proxy.log | tail -2 | tr '\n' ' ')"
stamp "adaptive suite"
timeout 150 $D/adaptive_test > $M/adaptive.log 2>&1; stamp "adaptive rc=$? $(grep -E 'test cases|assertions' $M/adaptive.log | tail -2 | tr '\n' ' ')"
stamp "ladder"
timeout 90 $D/ladder --ranks 2,3,4 --rounds 3 --json $M/ladder.json > $M/ladder.txt 2>&1; stamp "ladder rc=$?"
stamp "small A/B base (d3bb4d8) vs final, every collective, 2-4 ranks"
for i in 1 2 3 4 5; do
  for v in base final; do
    for n in 2 3 4; do
      timeout 30 $D/lb_$v --ranks $n --bytes $SMALL --reps 20 --label $v --json $M/small_${v}_${n}_$i.json > /dev/null 2>> $M/errors.log || echo "$v $n $i failed" >> $M/errors.log
    done
  done
  stamp "small round $i"
done
stamp "adaptive overhead: old (71d83da) vs final, 64 MiB"
for i in 1 2 3 4 5 6 7 8 9 10; do
  [[ $(left) -lt 150 ]] && break
  for v in old final; do
    timeout 40 $D/ad_$v --bytes 64M --no-graph --no-others --overhead-runs 50 --out $M/ad_${v}_$i > $M/ad_${v}_$i.txt 2>&1
    stamp "ad $v $i rc=$? $(grep -h 'overhead:' $M/ad_${v}_$i.txt | head -1)"
  done
done
stamp "A/B every collective base vs final (4K-256M)"
i=0
while [[ $(left) -gt 120 && $i -lt 20 ]]; do
  i=$((i+1))
  timeout 20 $D/lb_base --reps 3 --label base --json $M/ab_old_$i.json > /dev/null 2>> $M/ab_err.log || echo "base $i failed" >> $M/ab_err.log
  timeout 20 $D/lb_final --reps 3 --label final --json $M/ab_new_$i.json > /dev/null 2>> $M/ab_err.log || echo "final $i failed" >> $M/ab_err.log
done
stamp "A/B pairs $i"
stamp "collectives suite, 3 and 4 loopback ranks"
for n in 3 4; do
  [[ $(left) -lt 20 ]] && break
  RECCL_TEST_LOOPBACK=$n timeout $(( $(left) > 110 ? 110 : $(left) - 5 )) $D/coll_final > $M/coll_$n.log 2>&1; stamp "coll $n rc=$? $(grep -E 'test cases|assertions' $M/coll_$n.log | tail -2 | tr '\n' ' ')"
done
stamp "done"
touch $M/DONE
