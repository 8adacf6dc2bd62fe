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

# The Python package (reccl.torch): its sources byte-compile everywhere; its tests need PyTorch and
# a GPU (they install the package into build/pylib first), so CI reports them as not run.
py_sources=(python/reccl/*.py python/tests/*.py examples/python/*.py bench/perf/torch_ops.py setup.py)
if python3 -m py_compile "${py_sources[@]}"; then
  summary+=("Python sources: ${#py_sources[@]} files byte-compile")
else
  summary+=("Python sources: byte-compile FAILED"); py_failed=1
fi
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' >/dev/null 2>&1; then
  MAX_JOBS=$(nproc) python3 -m pip install --no-build-isolation --no-deps --target build/pylib . >"$logs/python-install.log" 2>&1
  if PYTHONPATH="$PWD/build/pylib" python3 python/tests/test_torch.py 2>&1 | tee "$logs/python-tests.log"; then
    summary+=("Python tests (python/tests/test_torch.py): $(grep -c '^PASS' "$logs/python-tests.log") passed")
  else
    summary+=("Python tests (python/tests/test_torch.py): FAILED ($logs/python-tests.log)"); py_failed=1
  fi
else
  summary+=("Python tests (python/tests/test_torch.py, examples/python/tp_mlp.py): not run (they need PyTorch and a GPU; bench/gpu.sh torch runs them)")
fi

echo
echo "== scripts/test.sh summary =="
printf '%s\n' "${summary[@]}"
[ -z "${py_failed:-}" ]
