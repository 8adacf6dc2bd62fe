#!/usr/bin/env bash
# bench/gpu.sh -- build, test and benchmark reccl's NVLink path on a multi-GPU machine, in one go.
#
#   bench/gpu.sh [stage ...]      stages: build test sanitize bench-ar bench-other adaptive proxy proxy-ab shim layer moe ab torch all
#                                 (default: all but proxy-ab, layer, moe, ab and torch)
#
# torch: pip install --no-build-isolation . (reccl.torch), the README's quick start,
# python/tests/test_torch.py (2 and 3 processes sharing GPU 0), examples/python/tp_mlp.py with 2
# and 3 ranks, bench/perf/torch_ops.py (the operators against the C++ calls, loopback ranks);
# TORCH_PARTS and TORCH_SCENARIOS pick parts (see the stage).
#
# proxy-ab: the copy-engine proxy's submission modes side by side (batched / one call per operation)
# in reccl_proxy_cost and reccl_proxy_perf, the floods longer than the queue (kernels loaded first,
# lazily loaded, CUDA_MODULE_LOADING=EAGER), reccl_sysmem_probe with and without a kernel beside,
# reccl_call_cost, the proxy collectives with inline puts of at most 0 / 256 / 1024 bytes at small
# sizes (interleaved, three runs each); AB_PARTS="cost flood sysmem calls inline perf" picks the
# parts (default all).
#
# sanitize: compute-sanitizer memcheck over chosen cases of four GPU suites (SAN_PARTS="collectives
# adaptive copy_engine proxy" picks them).
#
# shim: libreccl_nccl.so's GPU test, then NVIDIA's nccl-tests under NCCL and under the shim
# (binaries from $NCCL_TESTS_BIN, default $RECCL_GPU_BIN/nccl-tests: scripts/build-gpu-bin.sh
# nccl_tests builds them from a checkout kept outside this repository) and a torch.distributed
# all-reduce loop (bench/shim/*.py). SHIM_PART=check|perf|all picks the nccl-tests part (default all).
#
# On one GPU the tests run on loopback ranks (create_loopback) and the adaptive bench too; the
# cases that need two GPUs (one rank per GPU) are skipped and counted in the summary, the
# one-process-per-GPU test and the reccl_perf stages too. RECCL_GPU_BIN=dir takes prebuilt binaries from dir (built on
# another machine with the same nvcc: bash bench/gpu.sh build there, or scripts/build-gpu-bin.sh)
# and skips the build stage.
#
# Build: CMake (-DRECCL_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90) when the top-level
# CMakeLists supports it and RECCL_GPU_BUILD is not "nvcc"; otherwise nvcc directly (three
# translation units, in parallel). Results: JSON and logs under $OUT (default ./gpu-out); a short
# table is printed last. NVLink multicast stays off (NCCL_NVLS_ENABLE=0).
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-$ROOT/gpu-out}
BUILD=${BUILD:-$ROOT/build-gpu}
mkdir -p "$OUT" "$BUILD"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export RECCL_COMMIT=${RECCL_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}
STAGES=" ${*:-all} "
STAGES=${STAGES/ all / build test sanitize bench-ar bench-other adaptive proxy shim }
has() { [[ "$STAGES" == *" $1 "* ]]; }
log() { echo "[gpu.sh $(date +%H:%M:%S)] $*"; }
# A doctest log's summary line, and the count of cases skipped (tests/doctest_main.hpp: too few GPUs
# for their placement) where there are any; doctest's own line counts those among the passed. A
# binary whose every case was skipped exits 77.
cases() { echo "$(grep -E 'test cases:' "$1" | tail -1)  $(grep -E '^\[doctest\] skipped:' "$1" | tail -1)"; }
SUMMARY=()

# ---- build ----------------------------------------------------------------------------------------
PERF=$BUILD/reccl_perf
T_COLL=$BUILD/reccl.test.device.collectives
T_MP=$BUILD/reccl.test.device.multiprocess
T_AD=$BUILD/reccl.test.device.adaptive
ADB=$BUILD/reccl_adaptive_bench
T_CE=$BUILD/reccl.test.device.copy_engine
T_PC=$BUILD/reccl.test.device.proxy_collectives
T_PP=$BUILD/reccl.test.device.proxy_processes
PXP=$BUILD/reccl_proxy_perf
PXC=$BUILD/reccl_proxy_cost
SMP=$BUILD/reccl_sysmem_probe
CALLS=$BUILD/reccl_call_cost
SHIM_SO=$BUILD/cmake/shim/libreccl_nccl.so
T_SHIM=$BUILD/cmake/shim/reccl.test.shim.serve
if [[ -n "${RECCL_GPU_BIN:-}" ]]; then
  B=$(cd "$RECCL_GPU_BIN" && pwd)
  PERF=$B/reccl_perf T_COLL=$B/reccl.test.device.collectives T_MP=$B/reccl.test.device.multiprocess
  T_AD=$B/reccl.test.device.adaptive ADB=$B/reccl_adaptive_bench T_CE=$B/reccl.test.device.copy_engine PXC=$B/reccl_proxy_cost
  T_PC=$B/reccl.test.device.proxy_collectives T_PP=$B/reccl.test.device.proxy_processes PXP=$B/reccl_proxy_perf SMP=$B/reccl_sysmem_probe CALLS=$B/reccl_call_cost
  SHIM_SO=$B/libreccl_nccl.so T_SHIM=$B/reccl.test.shim.serve
  NCCL_TESTS_BIN=${NCCL_TESTS_BIN:-$B/nccl-tests}
  # prebuilt binaries were linked against the toolkit's NCCL (2.28.9): run them with PyTorch's copy
  NCCL_WHEEL=$(python3 -c 'import nvidia.nccl as n; print(n.__path__[0])' 2>/dev/null)/lib
  [[ -d "$NCCL_WHEEL" ]] && export LD_LIBRARY_PATH="$NCCL_WHEEL:${LD_LIBRARY_PATH:-}"
  STAGES=${STAGES/ build / }
fi
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
if has build; then
  NPROC=$(nproc 2>/dev/null || echo 4)
  if [[ "${RECCL_GPU_BUILD:-auto}" != nvcc ]] && grep -q RECCL_ENABLE_CUDA CMakeLists.txt 2>/dev/null; then
    log "cmake build"
    cmake -S . -B "$BUILD/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRECCL_ENABLE_CUDA=ON \
      -DRECCL_ENABLE_GPU_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/cmake.log" 2>&1 &&
      cmake --build "$BUILD/cmake" -j "$NPROC" --target reccl_perf reccl.test.device.collectives \
        reccl.test.device.multiprocess reccl.test.device.adaptive reccl_adaptive_bench reccl.test.device.copy_engine \
        reccl.test.device.proxy_collectives reccl.test.device.proxy_processes reccl_proxy_cost reccl_proxy_perf reccl_nccl_shim reccl.test.shim.serve >>"$OUT/cmake.log" 2>&1
    rc=$?
    if [[ $rc -eq 0 ]]; then
      PERF=$(find "$BUILD/cmake" -name reccl_perf -type f | head -1)
      T_COLL=$(find "$BUILD/cmake" -name reccl.test.device.collectives -type f | head -1)
      T_MP=$(find "$BUILD/cmake" -name reccl.test.device.multiprocess -type f | head -1)
      T_AD=$(find "$BUILD/cmake" -name reccl.test.device.adaptive -type f | head -1)
      ADB=$(find "$BUILD/cmake" -name reccl_adaptive_bench -type f | head -1)
      T_CE=$(find "$BUILD/cmake" -name reccl.test.device.copy_engine -type f | head -1)
      T_PC=$(find "$BUILD/cmake" -name reccl.test.device.proxy_collectives -type f | head -1)
      T_PP=$(find "$BUILD/cmake" -name reccl.test.device.proxy_processes -type f | head -1)
      PXC=$(find "$BUILD/cmake" -name reccl_proxy_cost -type f | head -1)
      PXP=$(find "$BUILD/cmake" -name reccl_proxy_perf -type f | head -1)
    else
      log "cmake build failed (see cmake.log), falling back to nvcc"; tail -20 "$OUT/cmake.log"
      RECCL_GPU_BUILD=nvcc
    fi
  else
    RECCL_GPU_BUILD=nvcc
  fi
  if [[ "${RECCL_GPU_BUILD:-auto}" == nvcc ]]; then
    log "nvcc build"
    INC=(-Iinclude -I.)
    [[ -d .deps/include ]] && INC+=(-isystem .deps/include)
    NCCL_INC=$(dirname "$(ls /usr/include/nccl.h /usr/local/cuda/include/nccl.h 2>/dev/null | head -1)")
    FLAGS=(-std=c++20 -arch=sm_90 -O3 --expt-relaxed-constexpr "${INC[@]}")
    # /usr/include is already a system directory; naming it again breaks libstdc++'s #include_next
    [[ "$NCCL_INC" != /usr/include ]] && FLAGS+=(-isystem "$NCCL_INC")
    nvcc "${FLAGS[@]}" bench/perf/reccl_perf.cu -o "$PERF" -lnccl >"$OUT/build_perf.log" 2>&1 &
    p1=$!
    nvcc "${FLAGS[@]}" tests/device/collectives.test.cu -o "$T_COLL" -lnccl >"$OUT/build_coll.log" 2>&1 &
    p2=$!
    nvcc "${FLAGS[@]}" tests/device/multiprocess.test.cu -o "$T_MP" -lnccl >"$OUT/build_mp.log" 2>&1 &
    p3=$!
    nvcc "${FLAGS[@]}" tests/device/adaptive.test.cu -o "$T_AD" -lnccl >"$OUT/build_ad.log" 2>&1 &
    p4=$!
    nvcc "${FLAGS[@]}" bench/adaptive/adaptive_bench.cu -o "$ADB" -lnccl >"$OUT/build_adb.log" 2>&1 &
    p5=$!
    nvcc "${FLAGS[@]}" tests/device/copy_engine.test.cu -o "$T_CE" -lnccl >"$OUT/build_ce.log" 2>&1 &&
      nvcc "${FLAGS[@]}" tests/device/proxy_collectives.test.cu -o "$T_PC" -lnccl >>"$OUT/build_ce.log" 2>&1 &&
      nvcc "${FLAGS[@]}" tests/device/proxy_processes.test.cu -o "$T_PP" -lnccl >>"$OUT/build_ce.log" 2>&1 &&
      nvcc "${FLAGS[@]}" bench/proxy/proxy_cost.cu -o "$PXC" >>"$OUT/build_ce.log" 2>&1 &&
      nvcc "${FLAGS[@]}" bench/proxy/proxy_perf.cu -o "$PXP" -lnccl -lcublas >>"$OUT/build_ce.log" 2>&1 &
    p6=$!
    rc=0
    wait $p1 || { rc=1; tail -30 "$OUT/build_perf.log"; }
    wait $p2 || { rc=1; tail -30 "$OUT/build_coll.log"; }
    wait $p3 || { rc=1; tail -30 "$OUT/build_mp.log"; }
    wait $p4 || { rc=1; tail -30 "$OUT/build_ad.log"; }
    wait $p5 || { rc=1; tail -30 "$OUT/build_adb.log"; }
    wait $p6 || { rc=1; tail -30 "$OUT/build_ce.log"; }
    [[ $rc -ne 0 ]] && { log "build failed"; exit 1; }
  fi
  for op in all_reduce reduce_scatter all_gather broadcast alltoall; do
    ln -sf "$(basename "$PERF")" "$(dirname "$PERF")/reccl_${op}_perf"
  done
  log "built: $PERF"
fi
P=$(dirname "$PERF")

# ---- machine --------------------------------------------------------------------------------------
nvidia-smi --query-gpu=index,name,driver_version,memory.total --format=csv >"$OUT/machine.txt" 2>&1
nvidia-smi topo -m >>"$OUT/machine.txt" 2>&1
echo "commit $RECCL_COMMIT  date $(date -u +%FT%TZ)" >>"$OUT/machine.txt"

# ---- tests ----------------------------------------------------------------------------------------
if has test; then
  log "GPU tests (one process, every GPU; loopback ranks on one GPU)"
  timeout 600 "$T_COLL" >"$OUT/test_collectives.log" 2>&1
  rc=$?; SUMMARY+=("test collectives: rc=$rc  $(cases "$OUT/test_collectives.log")")
  grep -E "ERROR|FAILED|cases,|loopback" "$OUT/test_collectives.log" | head -30
  log "GPU tests of the adaptive loop"
  timeout 600 "$T_AD" >"$OUT/test_adaptive.log" 2>&1
  rc=$?; SUMMARY+=("test adaptive: rc=$rc  $(cases "$OUT/test_adaptive.log")")
  grep -E "ERROR|FAILED|MESSAGE" "$OUT/test_adaptive.log" | head -30
  if [[ $NGPU -ge 2 ]]; then
    log "GPU tests (one process per GPU)"
    timeout 600 "$T_MP" >"$OUT/test_multiprocess.log" 2>&1
    rc=$?; SUMMARY+=("test multiprocess: rc=$rc  $(cases "$OUT/test_multiprocess.log")")
    grep -E "ERROR|FAILED|wrong|rank" "$OUT/test_multiprocess.log" | head -30
  else
    SUMMARY+=("test multiprocess: skipped (one process per GPU needs 2 GPUs, this machine has $NGPU)")
  fi
fi
if has sanitize; then
  # memcheck slows kernels 10-100x, so each suite runs the cases that reach its edges (unaligned
  # ends, uneven and masked splits, graph replays, bad input, inline puts) rather than every size.
  # SAN_PARTS picks suites (default all four). Under the tool a copy that a running kernel waits
  # for may not land (or not be seen) before that kernel gives up, so the copy-engine and proxy
  # suites time out there while their ERROR SUMMARY still counts every access they made
  # (bench/results/2026-12-03-memcheck-proxy-h200/): for them the summary is the verdict.
  memcheck() {  # name, binary, doctest filter
    log "compute-sanitizer memcheck: $1 ($3)"
    RECCL_TEST_TIMEOUT_S=60 timeout 400 compute-sanitizer --tool memcheck --print-limit 20 "$2" -tc="$3" \
      >"$OUT/sanitize_$1.log" 2>&1
    local rc=$?
    SUMMARY+=("memcheck $1: rc=$rc  $(grep -E 'ERROR SUMMARY' "$OUT/sanitize_$1.log" | tail -1)  $(cases "$OUT/sanitize_$1.log")")
  }
  SAN_PARTS=" ${SAN_PARTS:-collectives adaptive copy_engine proxy} "
  [[ "$SAN_PARTS" == *" collectives "* ]] && memcheck collectives "$T_COLL" '*unaligned*,*independent of the VT split*,*rejected on the host*'
  [[ "$SAN_PARTS" == *" adaptive "* ]] && memcheck adaptive "$T_AD" '*dead VT*,*bitwise the same*'
  [[ "$SAN_PARTS" == *" copy_engine "* ]] && memcheck copy_engine "$T_CE" '*'
  [[ "$SAN_PARTS" == *" proxy "* ]] && memcheck proxy "$T_PC" '*VT split*,*peer checks*,*back-to-back*,*rejected on the host*'
fi

# ---- benchmarks -----------------------------------------------------------------------------------
bench() {  # name, args...
  local name=$1; shift
  log "bench $name: $*"
  timeout 600 "$P/$@" -J "$OUT/$name.json" 2>&1 | tee "$OUT/$name.txt" | grep -v '^#' | tail -40
}
if [[ $NGPU -lt 2 ]] && { has bench-ar || has bench-other; }; then
  log "reccl_perf stages skipped: they need two GPUs (this machine has $NGPU)"
  STAGES=${STAGES/ bench-ar / }; STAGES=${STAGES/ bench-other / }
fi
if has bench-ar; then
  bench ar_graph reccl_all_reduce_perf -d bfloat16 -b 1K -e 16M -f 4 -G 10 -n 100 -w 20 --floor 1
  bench ar_eager reccl_all_reduce_perf -d bfloat16 -b 4M -e 1G -f 4 -n 20 -w 5
  bench ar_reg reccl_all_reduce_perf -d bfloat16 -b 1M -e 1G -f 4 -n 20 -w 5 -R 1 --nccl 0
  # NCCL's own channel count at 1 GiB (its INIT log), to compare with reccl's CTAs
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout 120 "$P/reccl_all_reduce_perf" -d bfloat16 -b 1G -e 1G -n 2 -w 1 \
    --reccl 0 >"$OUT/nccl_channels.txt" 2>&1
  log "NCCL channels: $(grep -cE 'Channel [0-9]+/[0-9]+ :' "$OUT/nccl_channels.txt") ring-channel lines; $(grep -oE '[0-9]+ coll channels[^.]*' "$OUT/nccl_channels.txt" | head -1)"
fi
if has sweep; then  # tuning sweep (not part of "all")
  bench sweep_pipelined reccl_all_reduce_perf -d bfloat16 -b 1M -e 1G -f 4 -n 20 -w 5 --nccl 0 --in_place 0 \
    --algo pipelined --ctas 16,32,64,96,128 --chunk 8192,32768 --ring_chunk 32768 --max_ctas 128
  bench sweep_flag reccl_all_gather_perf -d bfloat16 -b 1M -e 1G -f 4 -n 20 -w 5 --nccl 0 --in_place 0 \
    --algo pipelined,direct -R 1 --ctas 16,32,64,96,128 --chunk 8192,32768 --ring_chunk 32768 --max_ctas 128
  bench sweep_one_shot reccl_all_reduce_perf -d bfloat16 -b 16K -e 1M -f 4 -G 5 -n 100 -w 20 --nccl 0 --in_place 0 \
    --algo one_shot,pipelined --ctas 0,4,8,16,32,64
  bench sweep_two_shot reccl_all_reduce_perf -d bfloat16 -b 1M -e 1G -f 4 -n 20 -w 5 -R 1 --nccl 0 --in_place 0 \
    --algo two_shot,direct --ctas 16,32,64,96,128 --max_ctas 128
fi
if has bench-other; then
  for op in reduce_scatter all_gather broadcast alltoall; do
    bench ${op}_graph reccl_${op}_perf -d bfloat16 -b 1K -e 16M -f 4 -G 10 -n 100 -w 20
    bench ${op}_eager reccl_${op}_perf -d bfloat16 -b 64M -e 1G -f 4 -n 10 -w 3
  done
fi

if has adaptive; then
  log "adaptive loop: reccl_adaptive_bench ${ADAPTIVE_ARGS:-}"
  timeout 900 "$ADB" --out "$OUT" ${ADAPTIVE_ARGS:-} >"$OUT/adaptive.txt" 2>&1
  rc=$?; SUMMARY+=("adaptive bench: rc=$rc")
  tail -3 "$OUT/adaptive.txt"
  [[ -f "$OUT/timeline.csv" ]] && python3 bench/adaptive/plot.py "$OUT/timeline.csv" --json "$OUT/adaptive.json" \
    -o "$OUT/timeline.png" >/dev/null 2>&1
fi

if has proxy; then
  log "copy-engine proxy: GPU test, then reccl_proxy_cost"
  timeout 300 "$T_CE" >"$OUT/test_copy_engine.log" 2>&1
  rc=$?; SUMMARY+=("test copy engine: rc=$rc  $(cases "$OUT/test_copy_engine.log")")
  grep -E "ERROR|FAILED|MESSAGE" "$OUT/test_copy_engine.log" | head -10
  log "collectives over the copy-engine proxy"
  timeout 600 "$T_PC" >"$OUT/test_proxy_collectives.log" 2>&1
  rc=$?; SUMMARY+=("test proxy collectives: rc=$rc  $(cases "$OUT/test_proxy_collectives.log")")
  grep -E "ERROR|FAILED|MESSAGE|cases," "$OUT/test_proxy_collectives.log" | head -30
  log "collectives over the copy-engine proxy, one process per rank (CUDA IPC windows)"
  timeout 300 "$T_PP" >"$OUT/test_proxy_processes.log" 2>&1
  rc=$?; SUMMARY+=("test proxy, one process per rank: rc=$rc  $(cases "$OUT/test_proxy_processes.log")")
  grep -E "ERROR|FAILED|cases,|rank 0:" "$OUT/test_proxy_processes.log" | head -20
  timeout 300 "$PXC" -J "$OUT/proxy_cost.json" >"$OUT/proxy_cost.txt" 2>&1
  rc=$?; SUMMARY+=("proxy cost: rc=$rc")
  # a flood twice the queue's capacity: the producer must wait for room (a stall seen before the
  # producer cache); bounded by its own push timeout
  timeout 120 "$PXC" --posts 8192 --reps 1 --iters 100 -J "$OUT/proxy_cost_flood.json" >"$OUT/proxy_cost_flood.txt" 2>&1
  rc=$?; SUMMARY+=("proxy cost, flood of 8192: rc=$rc  $(grep -E 'signals posted|failed' "$OUT/proxy_cost_flood.txt" | head -1)")
  log "collectives over the proxy beside the load/store path (and NCCL on two GPUs), GEMM overlap"
  timeout 400 "$PXP" ${PROXY_PERF_ARGS:-} -J "$OUT/proxy_perf.json" >"$OUT/proxy_perf.txt" 2>&1
  rc=$?; SUMMARY+=("proxy perf: rc=$rc")
fi

if has proxy-ab; then
  AB=" ${AB_PARTS:-cost flood sysmem calls inline perf} "
  if [[ "$AB" == *" cost "* ]]; then
    log "proxy submission A/B: reccl_proxy_cost"
    for mode in batched unbatched inline; do
      flag=$([[ $mode == unbatched ]] && echo --unbatched; [[ $mode == inline ]] && echo --inline)
      timeout 120 "$PXC" $flag -J "$OUT/ab_cost_$mode.json" >"$OUT/ab_cost_$mode.txt" 2>&1
      rc=$?; SUMMARY+=("proxy cost $mode: rc=$rc  $(grep -E 'one-way|signals posted|puts of' "$OUT/ab_cost_$mode.txt" | tr -s ' ' | paste -sd';')")
    done
  fi
  if [[ "$AB" == *" flood "* ]]; then
    # kernels loaded before the runs (the default), left to lazy loading, lazy but CUDA_MODULE_LOADING=EAGER
    log "the flood of 8192 (twice the queue) and of 16384"
    for v in "loaded:--posts 8192" "lazy:--posts 8192 --lazy" "lazy-solo:--posts 8192 --lazy --solo" "eager-env:--posts 8192 --lazy" \
             "loaded-16k:--posts 16384" "loaded-unbatched:--posts 8192 --unbatched"; do
      name=${v%%:*} args=${v#*:}
      env=$([[ $name == eager-env ]] && echo CUDA_MODULE_LOADING=EAGER)
      timeout 90 env $env "$PXC" --reps 1 --iters 100 $args -J "$OUT/ab_flood_$name.json" >"$OUT/ab_flood_$name.txt" 2>&1
      rc=$?; SUMMARY+=("flood $name: rc=$rc  $(grep -E 'signals posted|failed' "$OUT/ab_flood_$name.txt" | head -1 | cut -c1-200)")
    done
  fi
  if [[ "$AB" == *" sysmem "* ]]; then
    log "reccl_sysmem_probe: alone, with a kernel beside, with a paced host writer"
    for v in "alone:" "beside:--beside" "beside-sleep:--beside --beside_sleep_ns 2000" "paced:--host_period_ns 20000" \
             "paced-beside:--host_period_ns 20000 --beside"; do
      name=${v%%:*} args=${v#*:}
      timeout 120 "$SMP" --reads 100000 $args >"$OUT/ab_sysmem_$name.txt" 2>&1
      rc=$?; SUMMARY+=("sysmem probe $name: rc=$rc  distinct/reads: $(awk 'NR>2{printf "%s ", $4}' "$OUT/ab_sysmem_$name.txt")")
    done
  fi
  if [[ "$AB" == *" calls "* ]]; then
    log "reccl_call_cost: the backend's CUDA calls"
    timeout 120 "$CALLS" -J "$OUT/call_cost.json" >"$OUT/call_cost.txt" 2>&1
    rc=$?; SUMMARY+=("call cost: rc=$rc")
  fi
  if [[ "$AB" == *" inline "* ]]; then
    # small collectives with puts inline up to 0 / 256 / 1024 (the default) bytes, interleaved
    log "proxy collectives: inline puts of at most 0 / 256 / 1024 bytes"
    for rep in 1 2 3; do
      for ib in 0 256 1024; do
        timeout 120 "$PXP" --inline_bytes $ib ${PROXY_INLINE_ARGS:---gemm 0 -b 256 -e 64K -f 4 -n 200 -w 20} \
          -J "$OUT/ab_inline_${ib}_$rep.json" >"$OUT/ab_inline_${ib}_$rep.txt" 2>&1
        rc=$?; SUMMARY+=("proxy perf inline $ib (run $rep): rc=$rc")
      done
    done
  fi
  if [[ "$AB" == *" perf "* ]]; then
    log "proxy collectives, batched vs unbatched"
    for mode in batched unbatched; do
      flag=$([[ $mode == unbatched ]] && echo --unbatched)
      timeout 200 "$PXP" $flag ${PROXY_AB_ARGS:---gemm 0 -b 1M -e 256M -f 16} -J "$OUT/ab_perf_$mode.json" >"$OUT/ab_perf_$mode.txt" 2>&1
      rc=$?; SUMMARY+=("proxy perf $mode: rc=$rc")
    done
  fi
fi

if has shim; then
  log "NCCL shim: GPU test"
  timeout 600 "$T_SHIM" >"$OUT/test_shim.log" 2>&1
  rc=$?; SUMMARY+=("test shim: rc=$rc  $(cases "$OUT/test_shim.log")")
  grep -E "ERROR|FAILED|ranks:|reccl:" "$OUT/test_shim.log" | head -10
  if [[ -x "${NCCL_TESTS_BIN:-}/all_reduce_perf" ]]; then
    log "NCCL shim: nccl-tests under NCCL and under the shim (part ${SHIM_PART:-all})"
    timeout 900 python3 bench/shim/nccl_tests.py --bin "$NCCL_TESTS_BIN" --shim "$SHIM_SO" --out "$OUT/shim" \
      --part "${SHIM_PART:-all}" >"$OUT/shim_nccl_tests.txt" 2>&1
    rc=$?; SUMMARY+=("nccl-tests (NCCL, shim): rc=$rc  $(tail -20 "$OUT/shim_nccl_tests.txt" | grep -E 'runs,')")
  else
    SUMMARY+=("nccl-tests: skipped (no binaries in ${NCCL_TESTS_BIN:-NCCL_TESTS_BIN unset})")
  fi
  if [[ $NGPU -ge 2 ]] && python3 -c 'import torch' 2>/dev/null; then
    log "NCCL shim: torch.distributed all-reduce loop"
    timeout 600 python3 bench/shim/torch_allreduce.py --shim "$SHIM_SO" --out "$OUT/shim" >"$OUT/shim_torch.txt" 2>&1
    rc=$?; SUMMARY+=("torch all_reduce (NCCL, shim): rc=$rc")
  fi
fi

# ---- the device layer ------------------------------------------------------------------------------
# layer: the P2P composed collectives (loopback suite, processes sharing the GPU), RECCL_DTYPES, and
# the fused all-reduce + RMSNorm example (its table and JSON). The loopback suite is five
# translation units (p2p_all_reduce, p2p_reduce_scatter_all_gather, p2p_broadcast_all_to_all,
# p2p_calls, p2p_handle), built in parallel.
if has layer; then
  log "device layer: build"
  cmake -S . -B "$BUILD/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRECCL_ENABLE_CUDA=ON -DRECCL_ENABLE_GPU_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/cmake_layer.log" 2>&1 &&
    cmake --build "$BUILD/cmake" -j "$(nproc)" --target reccl.test.device.p2p_all_reduce reccl.test.device.p2p_reduce_scatter_all_gather \
      reccl.test.device.p2p_broadcast_all_to_all reccl.test.device.p2p_calls reccl.test.device.p2p_handle reccl.test.device.p2p_processes \
      reccl.test.device.dtype_subset reccl.example.fused_allreduce_rmsnorm >>"$OUT/cmake_layer.log" 2>&1 ||
    { tail -20 "$OUT/cmake_layer.log"; SUMMARY+=("layer: build failed"); }
  for t in p2p_all_reduce p2p_reduce_scatter_all_gather p2p_broadcast_all_to_all p2p_calls p2p_handle p2p_processes dtype_subset; do
    b=$(find "$BUILD/cmake" -name "reccl.test.device.$t" -type f | head -1)
    [[ -z "$b" ]] && continue
    timeout 600 "$b" >"$OUT/test_$t.log" 2>&1
    rc=$?; SUMMARY+=("test $t: rc=$rc  $(grep -E 'test cases:' "$OUT/test_$t.log" | tail -1)")
    grep -E "ERROR|FAILED|wrong" "$OUT/test_$t.log" | head -20
  done
  f=$(find "$BUILD/cmake" -name fused_allreduce_rmsnorm -type f | head -1)
  if [[ -n "$f" ]]; then
    timeout 300 "$f" --json "$OUT/fused_allreduce_rmsnorm.json" >"$OUT/fused_allreduce_rmsnorm.txt" 2>&1
    rc=$?; SUMMARY+=("fused all-reduce + RMSNorm: rc=$rc")
  fi
fi

# ---- MoE dispatch/combine (loopback ranks on GPU 0; not part of "all") ----------------------------
# moe: the MoE GPU tests (both protocols), moe_layer_gpu, and reccl_moe_perf in DeepEP's shape (2
# ranks, 64 CTAs): the table protocol at 1-4096 tokens and the staged one at 1-512, CUDA graphs.
if has moe; then
  log "moe: build"
  cmake -S . -B "$BUILD/cmake" -G Ninja -DCMAKE_BUILD_TYPE=Release -DRECCL_ENABLE_CUDA=ON -DRECCL_ENABLE_GPU_TESTS=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$OUT/cmake_moe.log" 2>&1 &&
    cmake --build "$BUILD/cmake" -j "$(nproc)" --target reccl.test.device.p2p_expert_exchange reccl.test.device.moe_processes \
      reccl.example.moe_layer_gpu reccl_moe_perf >>"$OUT/cmake_moe.log" 2>&1 ||
    { tail -20 "$OUT/cmake_moe.log"; SUMMARY+=("moe: build failed"); }
  for t in p2p_expert_exchange moe_processes; do
    b=$(find "$BUILD/cmake" -name "reccl.test.device.$t" -type f | head -1)
    [[ -z "$b" ]] && continue
    timeout 600 "$b" >"$OUT/test_$t.log" 2>&1
    rc=$?; SUMMARY+=("test $t: rc=$rc  $(grep -E 'test cases:' "$OUT/test_$t.log" | tail -1)")
    grep -E "ERROR|FAILED|differ" "$OUT/test_$t.log" | head -20
  done
  b=$(find "$BUILD/cmake" -name moe_layer_gpu -type f | head -1)
  if [[ -n "$b" ]]; then
    timeout 300 "$b" >"$OUT/moe_layer_gpu.txt" 2>&1
    rc=$?; SUMMARY+=("moe_layer_gpu: rc=$rc")
  fi
  b=$(find "$BUILD/cmake" -name reccl_moe_perf -type f | head -1)
  if [[ -n "$b" ]]; then
    timeout 300 "$b" --ranks 2 --tokens 1,8,128,512,4096 --ctas 64 --align 16 --reps 20 --json "$OUT/moe_table.json" >"$OUT/moe_perf.txt" 2>&1
    timeout 300 "$b" --ranks 2 --tokens 1,8,128,512 --ctas 64 --align 16 --reps 20 --staged --json "$OUT/moe_staged.json" >>"$OUT/moe_perf.txt" 2>&1
    rc=$?; SUMMARY+=("moe perf: rc=$rc")
  fi
fi

# ---- A/B of two builds on loopback ranks ----------------------------------------------------------
# ab: reccl_loopback_perf built from this tree and from AB_OLD_INCLUDE (the old commit's include/:
# git archive OLD include | tar -x -C DIR), run AB_PAIRS times each, interleaved (old, new, old, ...);
# bench/perf/ab_table.py prints the ratio of medians new / old per configuration.
if has ab; then
  if [[ -z "${AB_OLD_INCLUDE:-}" || ! -d "${AB_OLD_INCLUDE}/reccl" ]]; then
    log "ab: AB_OLD_INCLUDE must name the old commit's include/ directory"; SUMMARY+=("ab: not run (no AB_OLD_INCLUDE)")
  else
    NCCL_INC=$(dirname "$(ls /usr/include/nccl.h /usr/local/cuda/include/nccl.h 2>/dev/null | head -1)")
    ABF=(-std=c++20 -arch=sm_90 -O3 --expt-relaxed-constexpr -I.)
    [[ "$NCCL_INC" != /usr/include ]] && ABF+=(-isystem "$NCCL_INC")
    log "ab: building reccl_loopback_perf (new and old)"
    nvcc "${ABF[@]}" -Iinclude bench/perf/loopback_perf.cu -o "$BUILD/lb_new" -lnccl >"$OUT/ab_build_new.log" 2>&1 &
    pn=$!
    nvcc "${ABF[@]}" -I"$AB_OLD_INCLUDE" bench/perf/loopback_perf.cu -o "$BUILD/lb_old" -lnccl >"$OUT/ab_build_old.log" 2>&1 &
    po=$!
    if wait $pn && wait $po; then
      for i in $(seq 1 "${AB_PAIRS:-20}"); do
        "$BUILD/lb_old" --reps "${AB_REPS:-3}" --label old --json "$OUT/ab_old_$i.json" ${AB_ARGS:-} >/dev/null || log "ab: old run $i failed"
        "$BUILD/lb_new" --reps "${AB_REPS:-3}" --label new --json "$OUT/ab_new_$i.json" ${AB_ARGS:-} >/dev/null || log "ab: new run $i failed"
      done
      python3 bench/perf/ab_table.py "$OUT" >"$OUT/ab_table.txt" 2>&1
      SUMMARY+=("ab: $(grep -c . "$OUT/ab_table.txt") lines in ab_table.txt")
    else
      tail -20 "$OUT/ab_build_new.log" "$OUT/ab_build_old.log"; SUMMARY+=("ab: build failed")
    fi
  fi
fi

# ---- torch: the Python package (pip install), its tests, the TP example, its cost over C++ --------
# TORCH_PARTS picks the parts (default "install quickstart tests examples bench"); without
# "install" the package is taken from the tree (python/reccl/_C*.so, e.g. the one an earlier
# install left in $OUT/torch_so). TORCH_SCENARIOS picks test scenarios (default all).
if has torch; then
  TP=" ${TORCH_PARTS:-install quickstart tests examples bench} "
  tpart() { [[ "$TP" == *" $1 "* ]]; }
  if tpart install; then
    log "torch: pip install --no-build-isolation ."
    PYDIR=$OUT/pylib
    t0=$SECONDS
    if ! MAX_JOBS=$(nproc) python3 -m pip install --no-build-isolation --no-deps . >"$OUT/torch_install.log" 2>&1; then
      # a read-only site-packages: install into a folder of our own
      MAX_JOBS=$(nproc) python3 -m pip install --no-build-isolation --no-deps --target "$PYDIR" . >>"$OUT/torch_install.log" 2>&1 &&
        export PYTHONPATH="$PYDIR:${PYTHONPATH:-}"
    fi
    echo "install took $((SECONDS - t0)) s" >>"$OUT/torch_install.log"
    so=$(cd /tmp && python3 -c 'import reccl._C as c; print(c.__file__)' 2>/dev/null)
    [[ -n "$so" ]] && mkdir -p "$OUT/torch_so" && cp "$so" "$OUT/torch_so/"
  else
    export PYTHONPATH="$ROOT/python:${PYTHONPATH:-}"
    echo "package from the tree (python/)" >"$OUT/torch_install.log"
  fi
  if (cd /tmp && python3 -c 'import reccl.torch') >>"$OUT/torch_install.log" 2>&1; then
    SUMMARY+=("torch package: ok ($(tail -1 "$OUT/torch_install.log"))")
    if tpart quickstart; then
      timeout 120 python3 examples/python/quickstart.py >"$OUT/quickstart.txt" 2>&1
      SUMMARY+=("quickstart: exit $? ($(tail -1 "$OUT/quickstart.txt"))")
    fi
    if tpart tests; then
      timeout ${TORCH_TESTS_TIMEOUT:-540} python3 python/tests/test_torch.py ${TORCH_SCENARIOS:-} >"$OUT/torch_tests.txt" 2>&1
      SUMMARY+=("torch tests: exit $? ($(grep -c '^PASS' "$OUT/torch_tests.txt") PASS, $(grep -c '^FAIL' "$OUT/torch_tests.txt") FAIL)")
    fi
    if tpart examples; then
      timeout 200 python3 examples/python/tp_mlp.py --ranks 2 >"$OUT/tp_mlp.txt" 2>&1
      SUMMARY+=("tp_mlp 2 ranks: exit $? ($(tail -1 "$OUT/tp_mlp.txt"))")
      timeout 200 python3 examples/python/tp_mlp.py --ranks 3 --tokens 8 --hidden 8192 >>"$OUT/tp_mlp.txt" 2>&1
      SUMMARY+=("tp_mlp 3 ranks: exit $? ($(tail -1 "$OUT/tp_mlp.txt"))")
    fi
    if tpart bench; then
      timeout 300 python3 bench/perf/torch_ops.py --ranks 2 --json "$OUT/torch_ops.json" >"$OUT/torch_ops.txt" 2>&1
      SUMMARY+=("torch_ops bench: exit $?")
    fi
  else
    tail -30 "$OUT/torch_install.log"; SUMMARY+=("torch package: FAILED (torch_install.log)")
  fi
fi

# ---- summary --------------------------------------------------------------------------------------
echo
echo "================ summary ($RECCL_COMMIT) ================"
for s in "${SUMMARY[@]}"; do echo "$s"; done
[[ -f "$OUT/adaptive.txt" ]] && sed -n '/reccl_adaptive_bench summary/,$p' "$OUT/adaptive.txt"
[[ -f "$OUT/proxy_cost.txt" ]] && sed -n '/reccl_proxy_cost (/,$p' "$OUT/proxy_cost.txt"
[[ -f "$OUT/proxy_perf.txt" ]] && cat "$OUT/proxy_perf.txt"
[[ -f "$OUT/call_cost.txt" ]] && cat "$OUT/call_cost.txt"
ls "$OUT"/ab_inline_*.json >/dev/null 2>&1 && { echo "-- proxy collectives by inline_bytes (median us, runs)"; python3 bench/proxy/inline_table.py "$OUT"; }
for f in "$OUT"/ab_perf_*.txt; do [[ -f "$f" ]] && { echo "-- $(basename "$f")"; grep -v '^$' "$f"; }; done
[[ -f "$OUT/shim_torch.txt" ]] && sed -n '/torch.distributed all_reduce/,$p' "$OUT/shim_torch.txt"
[[ -f "$OUT/ab_table.txt" ]] && cat "$OUT/ab_table.txt"
[[ -f "$OUT/fused_allreduce_rmsnorm.txt" ]] && cat "$OUT/fused_allreduce_rmsnorm.txt"
[[ -f "$OUT/moe_perf.txt" ]] && grep -vE "^  trace" "$OUT/moe_perf.txt"
[[ -f "$OUT/torch_tests.txt" ]] && grep -E '^(PASS|FAIL)' "$OUT/torch_tests.txt"
[[ -f "$OUT/torch_ops.txt" ]] && cat "$OUT/torch_ops.txt"
[[ -f "$OUT/shim/nccl_tests.md" ]] && grep -A12 '^## all_reduce' "$OUT/shim/nccl_tests.md"
if ls "$OUT"/*.json >/dev/null 2>&1; then
  python3 - "$OUT" <<'PY'
import json, sys, glob, os
for f in sorted(glob.glob(os.path.join(sys.argv[1], "*.json"))):
    d = json.load(open(f))
    if "rows" not in d or "collective" not in d: continue
    print(f"{os.path.basename(f)}: {d['collective']} {d['dtype']} graph={d['graph_launches']} buffers={d['reccl_buffers']}")
    for r in d["rows"]:
        b = r["bytes"]; sz = f"{b>>30}G" if b >= 1<<30 else f"{b>>20}M" if b >= 1<<20 else f"{b>>10}K"
        us = r.get("reccl_oop_us", -1); nu = r["nccl_us"]; su = r["nccl_symm_us"]
        print(f"  {sz:>5} {r.get('reccl_best','-'):>18} reccl {us:9.2f}us {r.get('reccl_oop_busbw',0):6.1f}GB/s "
              f"wrong={r['reccl_oop_wrong']}/{r['reccl_ip_wrong']}  nccl {nu:9.2f} symm {su:9.2f}  ratio {r['ratio_vs_better_nccl']:.2f}")
    if "floor" in d: print("  floor:", d["floor"])
PY
fi

# ---- pack (the device tool returns few files: one archive holds them all) ---------------------------
if [[ "${PACK:-0}" == 1 ]]; then
  (cd "$OUT" && tar czf /tmp/gpu-results.tgz --exclude=gpu-results.tgz . && rm -f ./*.json ./*.txt ./*.log &&
    mv /tmp/gpu-results.tgz .)
  log "packed results into $OUT/gpu-results.tgz"
fi
