#!/usr/bin/env bash
M=/tmp/m5
if [[ ! -f $M/master.log ]]; then cp .devbin/master5.sh /tmp/master5.sh; setsid nohup bash /tmp/master5.sh > /dev/null 2>&1 < /dev/null & sleep 2; fi
T=$(( $(date +%s) + ${1:-560} ))
while [[ ! -f $M/DONE && $(date +%s) -lt $T ]]; do sleep 3; done
cd $M && tar czf $OUT/m5.tgz --exclude=m5.tgz . ; cat $M/master.log
