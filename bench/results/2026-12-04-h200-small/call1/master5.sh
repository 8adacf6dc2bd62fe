#!/usr/bin/env bash
# Device call 1 of the small-message work: ladder breakdown, floors reconciled, small A/B, suites,
# adaptive overhead with the lean fold. Run detached (setsid); stages in priority order.
M=/tmp/m5; mkdir -p $M
exec > $M/master.log 2>&1
END=$(( $(date +%s) + ${BUDGET_S:-520} ))
left() { echo $(( END - $(date +%s) )); }
stamp() { echo "[$(date +%H:%M:%S) left $(left)s] $*"; }
export NCCL_NVLS_ENABLE=0
W=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')/lib
export LD_LIBRARY_PATH=$W:${LD_LIBRARY_PATH:-}
D=$PWD/.devbin
nvidia-smi --query-gpu=index,name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv > $M/machine.txt 2>&1
echo "date $(date -u +%FT%TZ)" >> $M/machine.txt
SMALL=1024,4096,16384,65536,262144
stamp "ladder"
timeout 150 $D/ladder --ranks 2,3,4 --rounds 3 --json $M/ladder.json > $M/ladder.txt 2>&1; stamp "ladder rc=$?"
stamp "floors at the shared tool's grid"
for i in 1 2; do
  timeout 30 $D/ll_floor --ranks 2 --ctas 1,4,16,64 --json $M/floor_$i.json > $M/floor_$i.txt 2>&1; stamp "floor $i rc=$?"
  timeout 20 $D/ll_floor_shared > $M/floor_shared_$i.txt 2>&1; stamp "shared $i rc=$?"
done
stamp "collectives suite (loopback 2, 3, 4 ranks), new"
for n in 2 3 4; do
  RECCL_TEST_LOOPBACK=$n timeout 120 $D/coll_new > $M/coll_new_$n.log 2>&1; stamp "coll $n rc=$? $(grep -E 'test cases|assertions' $M/coll_new_$n.log | tail -2 | tr '\n' ' ')"
done
stamp "small A/B base vs new, all-reduce, 2-4 ranks"
for i in 1 2 3 4 5; do
  for v in base new; do
    for n in 2 3 4; do
      timeout 30 $D/lb_$v --ranks $n --colls all_reduce --bytes $SMALL --reps 20 --label $v --json $M/small_${v}_${n}_$i.json > $M/small_${v}_${n}_$i.txt 2>&1 || echo "$v $n $i failed" >> $M/errors.log
    done
  done
  stamp "small pair $i"
done
stamp "adaptive overhead: old (71d83da) vs lean (HEAD + lean fold), 64 MiB"
i=0
while [[ $(left) -gt 60 && $i -lt 8 ]]; do
  i=$((i+1))
  for v in old lean; do
    timeout 40 $D/ad_$v --bytes 64M --no-graph --no-others --overhead-runs 50 --out $M/ad_${v}_$i > $M/ad_${v}_$i.txt 2>&1
    stamp "ad $v $i rc=$? $(grep -h 'overhead:' $M/ad_${v}_$i.txt | head -1)"
  done
done
stamp "A/B all collectives base vs new (4K-256M)"
i=0
while [[ $(left) -gt 20 && $i -lt 10 ]]; do
  i=$((i+1))
  timeout 20 $D/lb_base --reps 3 --label base --json $M/ab_base_$i.json > /dev/null 2>> $M/ab_err.log || echo "base $i failed" >> $M/ab_err.log
  timeout 20 $D/lb_new --reps 3 --label new --json $M/ab_new_$i.json > /dev/null 2>> $M/ab_err.log || echo "new $i failed" >> $M/ab_err.log
  stamp "pair $i"
done
stamp "done"
touch $M/DONE
