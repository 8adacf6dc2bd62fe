#!/usr/bin/env bash
# Device call 7: broadcast's small calls, the one-shot (LL) path against the automatic choice
# (pipelined on plain buffers, direct on registered), 42d677b, 2-4 loopback ranks, alternating.
M=/tmp/m11; mkdir -p $M
exec > $M/master.log 2>&1
export NCCL_NVLS_ENABLE=0
W=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')/lib
export LD_LIBRARY_PATH=$W:${LD_LIBRARY_PATH:-}
D=$PWD/.devbin
echo "date $(date -u +%FT%TZ)" > $M/machine.txt
SMALL=1024,4096,16384,65536,262144,1048576
for i in 1 2 3; do
  for a in automatic one_shot; do
    for n in 2 3 4; do
      timeout 30 $D/lb_final --ranks $n --colls broadcast --algo $a --bytes $SMALL --reps 20 --label $a --json $M/bc_${a}_${n}_$i.json > $M/bc_${a}_${n}_$i.txt 2>&1 || echo "$a $n $i failed" >> $M/errors.log
    done
  done
  echo "[$(date +%T)] round $i"
done
touch $M/DONE
