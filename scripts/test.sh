#!/usr/bin/env bash
# Runs reccl's tests on a fresh Debian machine: installs what is missing, builds and runs every CPU
# test (ctest), then compiles every CUDA source for sm_90 when nvcc is present (no GPU needed).
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
reccl_install_deps

cmake --workflow --preset ci-cpu

if command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ]; then
  export PATH="/usr/local/cuda/bin:$PATH"
  cmake --workflow --preset ci-cuda-compile
else
  echo "nvcc not found: CUDA sources not compiled"
fi
