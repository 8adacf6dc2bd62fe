#!/usr/bin/env bash
# Second device call: the small-message stage (issue 24's baseline): the floor with 2-4 ranks,
# reccl (HEAD with the fold) at 1-256 KiB for every collective with 2, 3 and 4 loopback ranks,
# plain and registered, and the one-shot all-reduce's CTA sweep with 2 ranks.
M=/tmp/m3; mkdir -p $M
exec > $M/master.log 2>&1
END=$(( $(date +%s) + ${BUDGET_S:-200} ))
left() { echo $(( END - $(date +%s) )); }
stamp() { echo "[$(date +%H:%M:%S) left $(left)s] $*"; }
export NCCL_NVLS_ENABLE=0
W=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')/lib
export LD_LIBRARY_PATH=$W:${LD_LIBRARY_PATH:-}
REPO=$PWD
SMALL=1024,4096,16384,65536,262144
timeout 60 $REPO/.devbin/ll_floor --ranks 2,3,4 --reps 20 --json $M/floor.json > $M/floor.txt 2>&1; stamp "floor 2-4 ranks rc=$?"
timeout 20 $REPO/.devbin/ll_floor_shared > $M/floor_shared.txt 2>&1; stamp "shared floor rc=$?"
for n in 2 3 4; do
  timeout 40 $REPO/.devbin/lb_fold --ranks $n --bytes $SMALL --reps 20 --label small_$n --json $M/small_$n.json > $M/small_$n.txt 2>&1
  stamp "reccl small, $n ranks rc=$?"
done
timeout 40 $REPO/.devbin/lb_fold --ranks 2 --colls all_reduce --bytes $SMALL --algo one_shot --ctas 1,2,4,8,16,32,64 --reps 20 --label sweep --json $M/small_sweep.json > $M/small_sweep.txt 2>&1; stamp "one-shot CTA sweep rc=$?"
stamp "done"
touch $M/DONE
