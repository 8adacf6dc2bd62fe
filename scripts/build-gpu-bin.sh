#!/usr/bin/env bash
# Builds the GPU binaries on a machine without a GPU (nvcc and NCCL headers needed), so that the
# GPU machine only runs them: bench/gpu.sh with RECCL_GPU_BIN=<dir>. They link the toolkit's NCCL
# (libnccl.so.2 of the same version must be found at run time; bench/gpu.sh uses PyTorch's copy).
#
#   scripts/build-gpu-bin.sh [dir] [target ...]   targets: coll adaptive mp perf adaptive_bench
#                                                 demo control_step ce pcoll pprocs proxy_cost proxy_perf sysmem_probe call_cost
#                                                 shim (default: all);
#                                                 nccl_tests (not in the default); dir: .gpubin
# shim: libreccl_nccl.so and its GPU test. nccl_tests: NVIDIA's nccl-tests, unmodified, from the
# source tree in $NCCL_TESTS_SRC (a checkout kept outside this repository), into dir/nccl-tests.
# Two targets compile at a time; each takes a few minutes on two cores.
set -uo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.gpubin}
shift || true
TARGETS=${*:-coll adaptive mp perf adaptive_bench demo control_step ce pcoll pprocs proxy_cost proxy_perf sysmem_probe call_cost shim}
mkdir -p "$DIR"
export PATH="/usr/local/cuda/bin:$PATH"
F=(-std=c++20 -arch=sm_90 -O3 --expt-relaxed-constexpr -Iinclude -I.)
[[ -d .deps/include ]] && F+=(-isystem .deps/include)
build() {  # name source [libs]
  local name=$1 src=$2; shift 2
  nvcc "${F[@]}" "$src" -o "$DIR/$name" "$@" >"$DIR/$name.log" 2>&1 && echo "built $DIR/$name" ||
    { echo "FAILED $name (see $DIR/$name.log)"; tail -5 "$DIR/$name.log"; return 1; }
}
shim() {
  build libreccl_nccl.so shim/src/nccl_shim.cu -Ishim/include -shared -Xcompiler -fPIC -Xcompiler -fvisibility=hidden \
    -Xlinker --version-script=shim/src/exports.map -Xlinker --no-undefined -lnccl -ldl &&
    g++ -std=c++20 -O2 shim/test/serve.test.cpp -Ishim/include -isystem /usr/local/cuda/include -o "$DIR/reccl.test.shim.serve" \
      -L"$DIR" -lreccl_nccl -L/usr/local/cuda/lib -lnccl -L/usr/local/cuda/lib64 -lcudart -Wl,-rpath,'$ORIGIN' \
      >"$DIR/reccl.test.shim.serve.log" 2>&1 && echo "built $DIR/reccl.test.shim.serve"
}
nccl_tests() {
  [[ -d "${NCCL_TESTS_SRC:-}/src" ]] || { echo "nccl_tests: set NCCL_TESTS_SRC to an nccl-tests source tree"; return 1; }
  make -C "$NCCL_TESTS_SRC/src" -j2 MPI=0 NCCL_HOME=/usr/local/cuda CUDA_HOME=/usr/local/cuda \
    NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" BUILDDIR="$(cd "$DIR" && pwd)/nccl-tests" >"$DIR/nccl-tests.log" 2>&1 &&
    echo "built $DIR/nccl-tests" || { echo "FAILED nccl-tests (see $DIR/nccl-tests.log)"; tail -5 "$DIR/nccl-tests.log"; return 1; }
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
    ce) build reccl.test.device.copy_engine tests/device/copy_engine.test.cu -lnccl & ;;
    pcoll) build reccl.test.device.proxy_collectives tests/device/proxy_collectives.test.cu -lnccl & ;;
    pprocs) build reccl.test.device.proxy_processes tests/device/proxy_processes.test.cu -lnccl & ;;
    proxy_cost) build reccl_proxy_cost bench/proxy/proxy_cost.cu & ;;
    sysmem_probe) build reccl_sysmem_probe bench/proxy/sysmem_probe.cu & ;;
    call_cost) build reccl_call_cost bench/proxy/call_cost.cu & ;;
    proxy_perf) build reccl_proxy_perf bench/proxy/proxy_perf.cu -lnccl -lcublas & ;;
    shim) shim & ;;
    nccl_tests) nccl_tests & ;;
    *) echo "unknown target $t"; rc=1; continue ;;
  esac
  running=$((running + 1))
  if [[ $running -ge 2 ]]; then wait -n || rc=1; running=$((running - 1)); fi
done
while [[ $running -gt 0 ]]; do wait -n || rc=1; running=$((running - 1)); done
exit $rc
