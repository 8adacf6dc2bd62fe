#!/usr/bin/env bash
# The adaptive path's healthy overhead before (71d83da) and after (HEAD): reccl_adaptive_bench
# (bf16 only, RECCL_DTYPES=bfloat16) of each tree, alternated, 2 loopback ranks, 64 MiB and 1 MiB.
M=/tmp/m4; mkdir -p $M
exec > $M/master.log 2>&1
END=$(( $(date +%s) + ${BUDGET_S:-170} ))
left() { echo $(( END - $(date +%s) )); }
stamp() { echo "[$(date +%H:%M:%S) left $(left)s] $*"; }
export NCCL_NVLS_ENABLE=0
W=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')/lib
export LD_LIBRARY_PATH=$W:${LD_LIBRARY_PATH:-}
REPO=$PWD
i=0
while [[ $(left) -gt 40 && $i -lt 3 ]]; do
  i=$((i+1))
  for v in old new; do
    for b in 64M 1M; do
      timeout 40 $REPO/.devbin/ad_$v --bytes $b --no-graph --no-others --overhead-runs 50 --out $M/${v}_${b}_$i > $M/${v}_${b}_$i.txt 2>&1
      stamp "$v $b $i rc=$? $(grep -h 'overhead:' $M/${v}_${b}_$i.txt | head -1)"
    done
  done
done
stamp "done"; touch $M/DONE
