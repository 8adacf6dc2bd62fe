#!/usr/bin/env bash
# Device call 8: the one-shot and LL kernels with their argument block staged into shared memory by
# one parallel read (lb_stage) against the same tree without it (lb_head, e50a8f4), every collective
# at 1-256 KiB, 2-4 loopback ranks, alternating; then the collectives suite on 2 ranks.
M=/tmp/m12; mkdir -p $M
exec > $M/master.log 2>&1
export NCCL_NVLS_ENABLE=0
W=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')/lib
export LD_LIBRARY_PATH=$W:${LD_LIBRARY_PATH:-}
D=$PWD/.devbin
echo "date $(date -u +%FT%TZ)" > $M/machine.txt
SMALL=1024,4096,16384,65536,262144
for i in 1 2 3 4; do
  for v in head stage; do
    for n in 2 3 4; do
      timeout 30 $D/lb_$v --ranks $n --bytes $SMALL --reps 20 --label $v --json $M/small_${v}_${n}_$i.json > /dev/null 2>> $M/errors.log || echo "$v $n $i failed" >> $M/errors.log
    done
  done
  echo "[$(date +%T)] round $i"
done
timeout 100 stdbuf -oL $D/coll_stage --duration=true > $M/coll_2.log 2>&1; echo "[$(date +%T)] coll 2 rc=$? $(grep -E 'test cases|assertions' $M/coll_2.log | tail -2 | tr '\n' ' ')"
touch $M/DONE
