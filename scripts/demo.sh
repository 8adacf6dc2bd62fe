#!/usr/bin/env bash
# Runs reccl's main example: on the GPUs when this machine has at least two, with NCCL and nvcc; otherwise
# on the CPU engine (4 ranks x 4 VTs, rate-capped VTs: healthy, one slow, one dead, recovered).
# Extra arguments go to the example; a JSON summary is written to build/demo-summary.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
reccl_install_deps

export PATH="/usr/local/cuda/bin:$PATH"
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi

if [ "$gpus" -ge 2 ] && command -v nvcc >/dev/null 2>&1; then
  export NCCL_NVLS_ENABLE=0   # never NVLink multicast
  cmake --preset gpu >/dev/null
  cmake --build --preset gpu --target reccl.example.gpu_demo
  exec build/gpu/examples/gpu_demo/gpu_demo --json build/demo-summary.json "$@"
fi
[ "$gpus" -eq 1 ] && echo "one GPU: the NVLink path needs two; running the CPU engine example"

cmake --preset cpu >/dev/null
cmake --build --preset cpu --target reccl.example.adaptive_all_reduce
exec build/cpu/examples/adaptive_all_reduce --json build/demo-summary.json "$@"
