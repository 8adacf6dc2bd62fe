#!/usr/bin/env bash
# Starts the master script once (detached), then follows it for up to $1 seconds; copies $M to $OUT.
M=/tmp/m
if [[ ! -f $M/master.log ]]; then cp .devbin/${MASTER:-master.sh} /tmp/master.sh; setsid nohup bash /tmp/master.sh > /dev/null 2>&1 < /dev/null & sleep 2; fi
T=$(( $(date +%s) + ${1:-540} ))
while [[ ! -f $M/DONE && $(date +%s) -lt $T ]]; do sleep 10; done
cd $M && tar czf $OUT/m.tgz --exclude=m.tgz . ; cp $M/master.log $OUT/ 2>/dev/null
cat $M/master.log; grep -E "tests passed|tests failed|Skipped|\*\*\*Failed|Failed|Timeout" $M/ctest.log | head -40
[[ -f $M/DONE ]] && { tail -40 $M/fused.txt; cat $M/ab_table.txt; }
