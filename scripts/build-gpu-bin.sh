#!/usr/bin/env bash
# Builds the GPU binaries on a machine without a GPU (nvcc and NCCL headers needed), so that the
# GPU machine only runs them: bench/gpu.sh with RECCL_GPU_BIN=<dir>. They link the toolkit's NCCL
# (libnccl.so.2 of the same version must be found at run time; bench/gpu.sh uses PyTorch's copy).
#
#   scripts/build-gpu-bin.sh [dir] [target ...]   targets: coll adaptive mp perf adaptive_bench
#                                                 demo control_step ce proxy_cost (default: all); dir: .gpubin
# Two targets compile at a time; each takes a few minutes on two cores.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpubin}
shift || true
TARGETS=${*:-coll adaptive mp perf adaptive_bench demo control_step ce proxy_cost}
mkdir -p "$DIR"
export PATH="/usr/local/cuda/bin:$PATH"
F=(-std=c++20 -arch=sm_90 -O3 --expt-relaxed-constexpr -Iinclude -I.)
[[ -d .deps/include ]] && F+=(-isystem .deps/include)
build() {  # name source [libs]
  local name=$1 src=$2; shift 2
  nvcc "${F[@]}" "$src" -o "$DIR/$name" "$@" >"$DIR/$name.log" 2>&1 && echo "built $DIR/$name" ||
    { echo "FAILED $name (see $DIR/$name.log)"; tail -5 "$DIR/$name.log"; return 1; }
}
rc=0
running=0
for t in $TARGETS; do
  case $t in
    coll) build reccl.test.device.collectives tests/device/collectives.test.cu -lnccl & ;;
    adaptive) build reccl.test.device.adaptive tests/device/adaptive.test.cu -lnccl & ;;
    mp) build reccl.test.device.multiprocess tests/device/multiprocess.test.cu -lnccl & ;;
    perf) build reccl_perf bench/perf/reccl_perf.cu -lnccl & ;;
    adaptive_bench) build reccl_adaptive_bench bench/adaptive/adaptive_bench.cu -lnccl & ;;
    demo) build adaptive_gpu examples/02_adaptive_gpu/main.cu -lnccl & ;;
    control_step) build reccl_control_step bench/perf/control_step.cu & ;;
    ce) build reccl.test.device.copy_engine tests/device/copy_engine.test.cu & ;;
    proxy_cost) build reccl_proxy_cost bench/proxy/proxy_cost.cu & ;;
    *) echo "unknown target $t"; rc=1; continue ;;
  esac
  running=$((running + 1))
  if [[ $running -ge 2 ]]; then wait -n || rc=1; running=$((running - 1)); fi
done
while [[ $running -gt 0 ]]; do wait -n || rc=1; running=$((running - 1)); done
exit $rc
