#!/usr/bin/env bash
# Runs reccl's tests on a fresh Debian machine: installs what is missing, builds and runs every CPU
# test (ctest), then compiles every CUDA source for sm_90 when nvcc and NCCL are present and runs
# the CUDA build's tests: the host tests, and the GPU tests, which report as skipped where there is
# no GPU (they run for real on a GPU machine: bench/gpu.sh). In CI (CI=true) a missing CUDA toolkit
# or NCCL is an error; elsewhere that stage is skipped and the closing summary says so.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
reccl_install_deps

logs=build/test-logs
mkdir -p "$logs"

# ctest's verdict for one stage: its "N% tests passed, ... out of M" line and how many did not run.
verdict() {
  local passed skipped
  passed=$(grep -E '^[0-9]+% tests passed' "$1" | tail -1 || true)
  skipped=$(grep -cE '^[[:space:]]+[0-9]+ - .* \((Skipped|Disabled|Not Run)\)$' "$1" || true)
  echo "${passed:-no ctest summary}; ${skipped} skipped"
}

cmake --workflow --preset ci-cpu 2>&1 | tee "$logs/ci-cpu.log"
summary=("CPU tests (ci-cpu): $(verdict "$logs/ci-cpu.log")")

export PATH="/usr/local/cuda/bin:$PATH"
cuda_missing=""
if ! command -v nvcc >/dev/null 2>&1; then
  cuda_missing="no nvcc on this machine"
elif [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  cuda_missing="no NCCL headers: the NVLink path needs NCCL >= 2.28.3"
fi
if [ -n "$cuda_missing" ]; then
  if [ "${CI:-}" = true ]; then
    echo "error: CUDA compile cannot run in CI: $cuda_missing" >&2
    exit 1
  fi
  summary+=("CUDA compile and its tests (ci-cuda-compile): skipped ($cuda_missing)")
else
  cmake --workflow --preset ci-cuda-compile 2>&1 | tee "$logs/ci-cuda-compile.log"
  summary+=("CUDA compile and its tests (ci-cuda-compile): $(verdict "$logs/ci-cuda-compile.log")")
fi

echo
echo "== scripts/test.sh summary =="
printf '%s\n' "${summary[@]}"
