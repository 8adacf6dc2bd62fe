// reccl/host/p2p_collective.hpp -- the composed collective types on GPUs: collective_op<Kind, T,
// Schedule, transport::p2p, Telemetry, Allocator> runs Schedule's plan with the schedule agent
// (device/agent/plan.hpp) over a p2p_communicator's device handle.
//
//   using ar = reccl::all_reduce<float, reccl::schedule::ring, reccl::transport::p2p,
//                                reccl::telemetry::stalls, reccl::allocator::equal>;
//   ar::run(comm, send, recv, count, reccl::redop::sum, stream);         // every rank, own stream
//   ar::run(comm, send, recv, count, reccl::redop::sum, stream, reccl::gpu_call_options{.n_vts = 4, .vt_shares = &s});
//
// Counts as in the CPU engine (reccl/collective.hpp). Stream-ordered and capturable: no host
// synchronisation. Buffers are any device memory this GPU can read and write (plain cudaMalloc
// memory included); only the rings travel between ranks. Swapping the Schedule changes the kernel
// instantiated (plan_kernel<T, Schedule>); telemetry::none compiles the stall counting away.
//
// The split: equal shares over `n_vts` VTs, or the caller's `vt_shares` (an Allocator's output, the
// same on every rank: e.g. `ar::allocator_type{}.update(prev, observations)` with observations every
// rank agrees on). The call itself does not run the Allocator yet. The per-VT stalls of the last
// calls are read with plan_stalls(); closing the loop on the GPU (device-side split and recovery)
// is the adaptive lane's (host/adaptive.hpp) for now.
//
// Errors: a call that fails its host-side checks on one rank (null or misaligned buffer, bad root,
// bad split, a schedule that rejects the parameters) writes the fault into every rank's window from
// the stream and throws reccl::error; the peers' kernels stop within a poll period, and their
// check() names the rank and the cause. Device-side faults (a peer that never comes) are sticky:
// check() throws them; rebuild the communicator.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <array>
#include <string>
#include <vector>

#include "../collective.hpp"
#include "../device/agent/plan.hpp"
#include "../policy/allocator/allocator.hpp"
#include "../policy/schedule/schedule.hpp"
#include "../policy/telemetry/telemetry.hpp"
#include "error.hpp"
#include "launch.hpp"
#include "p2p.hpp"

namespace reccl {

namespace transport {
/// NVLink P2P (CUDA IPC) and loopback ranks: the load/store device handle of a p2p_communicator.
struct p2p {
  using communicator = p2p_communicator;
  using handle = device::memory_handle;
  static constexpr int max_vts = reccl::max_vts;
};
static_assert(Transport<p2p>);
}  // namespace transport

/// Per-call options of the GPU composed collectives.
struct gpu_call_options {
  std::int32_t root = 0;                ///< broadcast
  std::int32_t n_vts = 4;               ///< VTs (contiguous blocks of the message)
  std::int32_t ctas_per_vt = 1;         ///< CTAs per VT (each runs the plan on its part of the block)
  shares const* vt_shares = nullptr;    ///< the split (an Allocator's output); equal when null
};

/// What a call launched (the split it used).
struct gpu_call_result {
  split sp{};
  int grid = 0;
};

namespace detail {

template <class T>
__global__ void plan_average_kernel(T* p, std::uint64_t n, int nranks) {
  for (std::uint64_t i = blockIdx.x * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x)
    p[i] = device::average_rounded<T>(p[i], nranks);
}

/// Device scratch of one communicator for the composed collectives: internal work and scratch
/// buffers, a copy of an in-place input, per-VT stall counters. Grows outside graph capture only.
/// Growing never frees (cudaFree waits for every kernel of the device, and a peer's kernel on this
/// GPU may be waiting for this rank's next call): outgrown buffers are freed with the communicator.
struct plan_staging {
  void* mem = nullptr;
  std::uint64_t bytes = 0;
  std::uint64_t* stalls = nullptr;  ///< max_vts counters
  std::vector<void*> retired;
  ~plan_staging() {
    // destructor: nothing to report to; a failed free leaves CUDA's sticky error
    for (void* p : retired) (void)cudaFree(p);
    if (mem) (void)cudaFree(mem);
    if (stalls) (void)cudaFree(stalls);
  }
};

inline bool capturing(cudaStream_t s) {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  RECCL_CUDA_CHECK(cudaStreamIsCapturing(s, &st));
  return st != cudaStreamCaptureStatusNone;
}

}  // namespace detail

inline detail::plan_staging& plan_staging_of(p2p_communicator& comm, cudaStream_t stream);

template <collective Kind, class T, Schedule S, Telemetry M, Allocator A>
gpu_call_result run_collective(p2p_communicator& comm, T const* send, T* recv, std::uint64_t count, redop op,
                               cudaStream_t stream, gpu_call_options const& o = {}) {
  static_assert(S::supports(Kind), "reccl: this schedule does not implement this collective");
  int const me = comm.rank(), n = comm.size();
  device::plan_lane const& lane = comm.plan_lane();
  // Host-side checks. A failure is raised on every rank (so peers stop now) and thrown here.
  auto reject = [&](device::fault_cause cause, std::string const& what) {
    comm.raise_everywhere(device::fault{status::invalid_argument, me, -1, -1, cause}, stream);
    throw reccl::error(status::invalid_argument, std::string(name(Kind)) + ": " + what, me);
  };
  if (static_cast<unsigned>(op) > static_cast<unsigned>(redop::avg)) reject(device::fault_cause::bad_argument, "unknown reduction op");
  if (o.root < 0 || o.root >= n) reject(device::fault_cause::bad_argument, "root " + std::to_string(o.root) + " outside [0, " + std::to_string(n) + ")");
  if (o.n_vts < 1 || o.n_vts > max_vts || o.ctas_per_vt < 1 || o.n_vts * o.ctas_per_vt > lane.max_ctas)
    reject(device::fault_cause::bad_argument, "n_vts x ctas_per_vt must be in [1, " + std::to_string(lane.max_ctas) + "] (p2p_config::plan_max_ctas)");
  schedule::params p{};
  p.coll = Kind;
  p.nranks = n;
  p.root = o.root;
  if constexpr (requires { S::check(p); }) {
    schedule::check_result const c = S::check(p);
    if (!c.ok()) reject(device::fault_cause::bad_argument, std::string("schedule parameters: ") + c.reason);
  }
  S const s(p);
  std::uint64_t const seg = count;
  std::uint64_t const in_len = static_cast<std::uint64_t>(s.segments(schedule::buffer::input)) * seg;
  std::uint64_t const work_len = static_cast<std::uint64_t>(s.segments(schedule::buffer::work)) * seg;
  std::uint64_t const scratch_len = static_cast<std::uint64_t>(s.segments(schedule::buffer::scratch)) * seg;
  std::uint64_t const out_len = (Kind == collective::all_gather || Kind == collective::all_to_all) ? count * n : count;
  bool const reads_send = Kind != collective::broadcast || me == o.root;
  if (count > 0 && reads_send && send == nullptr) reject(device::fault_cause::null_buffer, "send buffer is null");
  if (count > 0 && recv == nullptr) reject(device::fault_cause::null_buffer, "receive buffer is null");
  if (reinterpret_cast<std::uintptr_t>(send) % alignof(T) != 0 || reinterpret_cast<std::uintptr_t>(recv) % alignof(T) != 0)
    reject(device::fault_cause::misaligned_buffer, "a buffer is not aligned to its element size");
  // Every kernel this call may launch is loaded before the first launch (host/launch.hpp).
  load_kernel(reinterpret_cast<void const*>(&device::plan_kernel<T, S>));
  if (reduces(Kind) && op == redop::avg) load_kernel(reinterpret_cast<void const*>(&detail::plan_average_kernel<T>));
  // Every CTA of every rank on this GPU spins on the others: they must all be resident at once.
  if (std::string const why = co_resident_problem(reinterpret_cast<void const*>(&device::plan_kernel<T, S>), o.n_vts * o.ctas_per_vt,
                                                  device::plan_threads, 0, comm.ranks_sharing_device());
      !why.empty())
    reject(device::fault_cause::bad_argument, "n_vts x ctas_per_vt: " + why);
  shares sh = o.vt_shares ? *o.vt_shares : equal_shares(o.n_vts, all_live(o.n_vts));
  if (check(sh) != status::ok || sh.n_vts != o.n_vts) reject(device::fault_cause::bad_argument, "vt_shares is not a valid split of n_vts VTs");
  split const sp = to_split(sh, count, 1);

  // Buffers: work is the output unless the schedule's work is larger (reduce-scatter); an input that
  // overlaps the output is copied first (the plan reads it after writing work).
  bool const internal_work = work_len != out_len;
  bool const overlap = reads_send && count > 0 &&
                       reinterpret_cast<std::uintptr_t>(send) < reinterpret_cast<std::uintptr_t>(recv + out_len) &&
                       reinterpret_cast<std::uintptr_t>(recv) < reinterpret_cast<std::uintptr_t>(send + in_len);
  std::uint64_t const need = ((internal_work ? work_len : 0) + scratch_len + (overlap ? in_len : 0)) * sizeof(T) + 3 * 256;
  detail::plan_staging& st = comm.attachment<detail::plan_staging>();
  if (need > st.bytes || st.stalls == nullptr) {
    // Checked before any allocation: cudaMalloc during a capture invalidates it with CUDA's own error.
    if (detail::capturing(stream))
      reject(device::fault_cause::bad_argument, "the composed collectives' staging must grow (" + std::to_string(need) +
                                                    " bytes), which cannot happen during graph capture: run the call once before capturing");
    plan_staging_of(comm, stream);
  }
  if (need > st.bytes) {
    void* grown = nullptr;
    RECCL_CUDA_CHECK(cudaMalloc(&grown, need));
    if (st.mem) st.retired.push_back(st.mem);  // earlier calls on the stream may still use it
    st.mem = grown;
    st.bytes = need;
  }
  char* cursor = static_cast<char*>(st.mem);
  auto take = [&](std::uint64_t elems) {
    T* p = reinterpret_cast<T*>(cursor);
    cursor += (elems * sizeof(T) + 255) / 256 * 256;
    return p;
  };
  device::plan_buffers<T> b{};
  b.count = count;
  b.work = internal_work ? take(work_len) : recv;
  b.scratch = scratch_len ? take(scratch_len) : nullptr;
  b.input = reads_send ? send : nullptr;
  if (overlap) {
    T* copy = take(in_len);
    RECCL_CUDA_CHECK(cudaMemcpyAsync(copy, send, in_len * sizeof(T), cudaMemcpyDeviceToDevice, stream));
    b.input = copy;
  }

  device::plan_args<T, S> a{};
  a.h = comm.handle();
  a.lane = lane;
  a.schedule = s;
  a.buf = b;
  a.sp = sp;
  a.parts = o.ctas_per_vt;
  a.op = op;
  a.stalls = M::enabled ? st.stalls : nullptr;
  int const grid = o.n_vts * o.ctas_per_vt;
  if (count > 0) {
    device::plan_kernel<T, S><<<grid, device::plan_threads, 0, stream>>>(a);
    RECCL_CUDA_CHECK(cudaGetLastError());
  }
  if (internal_work && count > 0) {
    T const* from = b.work + (Kind == collective::reduce_scatter ? static_cast<std::uint64_t>(me) * count : 0);
    RECCL_CUDA_CHECK(cudaMemcpyAsync(recv, from, out_len * sizeof(T), cudaMemcpyDeviceToDevice, stream));
  }
  if (reduces(Kind) && op == redop::avg && count > 0) {
    detail::plan_average_kernel<T><<<128, 256, 0, stream>>>(recv, out_len, n);
    RECCL_CUDA_CHECK(cudaGetLastError());
  }
  return {sp, grid};
}

/// Failed polls per VT waiting for credit, summed over the calls so far (telemetry::stalls).
inline std::array<std::uint64_t, max_vts> plan_stalls(p2p_communicator& comm) {
  std::array<std::uint64_t, max_vts> out{};
  detail::plan_staging& st = comm.attachment<detail::plan_staging>();
  if (st.stalls != nullptr) RECCL_CUDA_CHECK(cudaMemcpy(out.data(), st.stalls, sizeof(out), cudaMemcpyDeviceToHost));
  return out;
}

/// The staging of `comm`, created on first use. Nothing here may wait for the device: another
/// rank's kernel on this GPU may be waiting for this rank's call (loopback ranks).
inline detail::plan_staging& plan_staging_of(p2p_communicator& comm, cudaStream_t stream) {
  auto& slot = comm.attachment<detail::plan_staging>();
  if (slot.stalls == nullptr) {
    RECCL_CUDA_CHECK(cudaMalloc(&slot.stalls, sizeof(std::uint64_t) * max_vts));
    RECCL_CUDA_CHECK(cudaMemsetAsync(slot.stalls, 0, sizeof(std::uint64_t) * max_vts, stream));
  }
  return slot;
}

}  // namespace reccl
