#!/usr/bin/env bash
# Runs reccl's tests on a fresh Debian machine: installs what is missing, builds and runs every CPU
# test (ctest), then compiles every CUDA source for sm_90 when nvcc and NCCL's headers are present
# (no GPU needed; the GPU tests themselves run on a GPU machine: bench/gpu.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
reccl_install_deps

cmake --workflow --preset ci-cpu

export PATH="/usr/local/cuda/bin:$PATH"
if ! command -v nvcc >/dev/null 2>&1; then
  echo "skipped: CUDA compile (no nvcc on this machine)"
elif [ ! -f /usr/local/cuda/include/nccl.h ] && [ ! -f /usr/include/nccl.h ]; then
  echo "skipped: CUDA compile (no NCCL headers: the NVLink path needs NCCL >= 2.28.3)"
else
  cmake --workflow --preset ci-cuda-compile
fi
