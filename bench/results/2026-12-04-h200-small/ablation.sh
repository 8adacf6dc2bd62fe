#!/usr/bin/env bash
# The ablation runs of calls 2-4 (each call's master.log has its timestamps). Binaries: lb_<variant>
# = bench/perf/loopback_perf.cu built with
#   nvcc -O3 -std=c++20 --expt-relaxed-constexpr -arch=sm_90 -I<tree>/include -I. bench/perf/loopback_perf.cu -lnccl [-D...]
# where <tree> is a scratch copy of include/:
#   a0, nohdr, hdrlate, hdrearly, noguard, bare, sumonly, nohdrsum, hdrearlysum:
#     d3bb4d8's include/ with the single-pack fold of NOTES 41 and ablation_one_shot.patch; macros
#     a0 (none), nohdr (-DABL_NOHDR), hdrlate (-DABL_HDRLATE), hdrearly (-DABL_HDRLATE -DABL_HDREARLY),
#     noguard (-DABL_NOGUARD), bare (-DABL_NOHDR -DABL_NOGUARD), sumonly (-DABL_SUMONLY),
#     nohdrsum (-DABL_NOHDR -DABL_SUMONLY), hdrearlysum (-DABL_HDRLATE -DABL_HDREARLY -DABL_SUMONLY);
#   lib: the library change (header published first, checked late by the last warp; op fixed at
#     compile time in the n-rank fold), without the argument reorder;
#   reorder: lib plus ablation_args_reorder.patch (what landed, before the LL fold's op was fixed too).
# Variants per call: call2 a0 nohdr hdrlate noguard bare; call3 a0 nohdr hdrlate hdrearly sumonly
# nohdrsum hdrearlysum; call4 a0 lib reorder nohdrsum.
VARIANTS=${VARIANTS:-"a0 lib reorder nohdrsum"}
M=${M:-/tmp/abl}; mkdir -p $M
SMALL=1024,4096,16384,65536,262144
for i in 1 2 3 4; do
  for v in $VARIANTS; do
    for n in 2 3 4; do
      timeout 30 .devbin/lb_$v --ranks $n --colls all_reduce --bytes $SMALL --reps 20 --label $v --json $M/abl_${v}_${n}_$i.json > /dev/null
    done
  done
done
