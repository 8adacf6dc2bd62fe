#!/usr/bin/env bash
# Device call 6: the suites call 5 cut off (timeouts set too short there), same binaries.
M=/tmp/m10; mkdir -p $M
exec > $M/master.log 2>&1
END=$(( $(date +%s) + ${BUDGET_S:-440} ))
left() { echo $(( END - $(date +%s) )); }
stamp() { echo "[$(date +%H:%M:%S) left $(left)s] $*"; }
export NCCL_NVLS_ENABLE=0
W=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])')/lib
export LD_LIBRARY_PATH=$W:${LD_LIBRARY_PATH:-}
D=$PWD/.devbin
echo "date $(date -u +%FT%TZ)" > $M/machine.txt
stamp "adaptive suite"
timeout 60 stdbuf -oL $D/adaptive_test --duration=true > $M/adaptive.log 2>&1; stamp "adaptive rc=$? $(grep -E 'test cases|assertions' $M/adaptive.log | tail -2 | tr '\n' ' ')"
stamp "proxy suite"
timeout 200 stdbuf -oL $D/proxy_final --duration=true > $M/proxy.log 2>&1; stamp "proxy rc=$? $(grep -E 'test cases|assertions' $M/proxy.log | tail -2 | tr '\n' ' ')"
stamp "collectives suite, 4 loopback ranks"
RECCL_TEST_LOOPBACK=4 timeout $(( $(left) - 10 )) stdbuf -oL $D/coll_final --duration=true > $M/coll_4.log 2>&1; stamp "coll 4 rc=$? $(grep -E 'test cases|assertions' $M/coll_4.log | tail -2 | tr '\n' ' ')"
stamp "done"
touch $M/DONE
