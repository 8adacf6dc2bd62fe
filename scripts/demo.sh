#!/usr/bin/env bash
# Runs reccl's main example on the GPU when this machine has one (with nvcc and NCCL's headers):
# examples/02_adaptive_gpu, the adaptive all-reduce through a healthy, a slowed, a dead and a
# recovered VT, on every GPU (>= 2) or on two loopback ranks of one GPU; with two or more GPUs it
# first runs examples/gpu_demo (correctness, path isolation and speed against NCCL). Without a GPU:
# the same four phases on the CPU engine (4 ranks x 4 VTs, rate-capped VTs).
# Extra arguments go to the example; a JSON summary is written to build/demo-summary.json.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/deps.sh
reccl_install_deps

export PATH="/usr/local/cuda/bin:$PATH"
gpus=0
if command -v nvidia-smi >/dev/null 2>&1; then gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true); fi

if [ "$gpus" -ge 1 ] && command -v nvcc >/dev/null 2>&1; then
  export NCCL_NVLS_ENABLE=0   # never NVLink multicast
  cmake --preset gpu >/dev/null
  # Each example is one CUDA file, compiled for the dtypes it reduces only (RECCL_DTYPES); ninja
  # prints one line per file and nothing while nvcc runs, so say up front what is being built.
  if [ "$gpus" -ge 2 ]; then
    echo "demo: compiling examples/02_adaptive_gpu and examples/gpu_demo for sm_90 (bf16/fp32 kernels only):" \
      "about a minute when not built yet (one nvcc process per file, silent while it runs)" >&2
    cmake --build --preset gpu --target reccl.example.gpu_demo reccl.example.adaptive_gpu
    build/gpu/examples/gpu_demo/gpu_demo --json build/demo-nvlink-summary.json
  else
    echo "demo: compiling examples/02_adaptive_gpu for sm_90 (bf16 kernels only):" \
      "about a minute when not built yet (one nvcc process per file, silent while it runs)" >&2
    cmake --build --preset gpu --target reccl.example.adaptive_gpu
  fi
  exec build/gpu/examples/02_adaptive_gpu/adaptive_gpu --json build/demo-summary.json "$@"
fi

cmake --preset cpu >/dev/null
cmake --build --preset cpu --target reccl.example.adaptive_all_reduce
exec build/cpu/examples/adaptive_all_reduce --json build/demo-summary.json "$@"
