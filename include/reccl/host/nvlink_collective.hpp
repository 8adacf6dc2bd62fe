// reccl/host/nvlink_collective.hpp -- the composed collective types on the NVLink fast path:
// collective_op<Kind, T, Schedule, transport::nvlink, Telemetry, Allocator> runs the fast path's
// engine for Schedule, instantiated for T only, on an nvlink_communicator (NCCL symmetric windows,
// CUDA IPC windows from create_p2p(), or loopback ranks).
//
//   using ar = reccl::all_reduce<__nv_bfloat16, reccl::schedule::one_shot, reccl::transport::nvlink,
//                                reccl::telemetry::none, reccl::allocator::equal>;
//   ar::run(comm, send, recv, count, reccl::redop::sum, stream);              // every rank
//   ar::run(comm, send, recv, count, reccl::redop::sum, stream, {.vt_shares = &s});
//
// Schedule -> engine (device/engine/), chosen at compile time:
//   schedule::one_shot   every collective     one_shot_kernel<T> for fp32/fp16/bf16 reductions
//                                             (Lamport packets), ll_kernel<T> otherwise (LL packets)
//   schedule::two_shot   all_reduce           direct_kernel<T> as two-shot  } buffers from
//                        reduce_scatter       direct_kernel<T>, pulling      } comm.allocate()
// Ring, tree, all-to-all relay and multi-rail broadcast have no engine on this path and fail to
// compile; they run on transport::p2p's schedule agent (host/p2p_collective.hpp). The fast path's
// pipelined engine pushes to every peer at once (no ring): the runtime API reaches it
// (algorithm::pipelined), a Schedule type does not name it.
//
// Counts, call shape, stream ordering, graph capture and errors are the runtime API's
// (host/communicator.hpp): this is the same plan with the algorithm fixed by the type, launched as
// T's kernel directly (RECCL_DTYPES still applies: a dtype left out is refused at run time).
// Buffers this rank's checks reject fail the lane on every rank (raise_rejection) before the throw.
//
// Arithmetic: the fast path's (rank order, fp32 accumulation of 16-bit floats, one rounding), not
// the schedule's round-after-every-combine: with 16-bit floats and 3 or more ranks the bits can
// differ from the CPU engine's and transport::p2p's; with 2 ranks, and for every other dtype, they
// are the same.
//
// Split: the Allocator's output passed as `vt_shares` (the same on every rank), else the tuning
// table's VTs with equal shares. Telemetry: the one-shot and two-shot engines count no stalls, so
// only a Telemetry with `enabled == false` composes with this transport (static_assert).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../collective.hpp"
#include "../device/launch.hpp"
#include "../policy/allocator/allocator.hpp"
#include "../policy/schedule/one_shot.hpp"
#include "../policy/schedule/schedule.hpp"
#include "../policy/schedule/two_shot.hpp"
#include "../policy/telemetry/telemetry.hpp"
#include "communicator.hpp"
#include "error.hpp"

namespace reccl {

namespace transport {
/// The NVLink fast path: an nvlink_communicator's lane views (device::lsa_view) and its engines.
struct nvlink {
  using communicator = nvlink_communicator;
  using handle = device::lsa_view;
  static constexpr int max_vts = reccl::max_vts;
};
static_assert(Transport<nvlink>);
}  // namespace transport

/// Per-call options of the composed types on transport::nvlink.
struct nvlink_call_options {
  std::int32_t root = 0;                ///< broadcast
  std::int32_t lane = 0;
  std::int32_t ctas = 0;                ///< 0: from the tuning table
  std::int32_t vts = 0;                 ///< 0: from the tuning table (ignored with vt_shares)
  shares const* vt_shares = nullptr;    ///< the split (an Allocator's output); equal when null
};

namespace detail {

/// The engine a Schedule runs as on the fast path, for collective K.
template <collective K, class S>
consteval algorithm nvlink_algorithm() {
  if constexpr (std::is_same_v<S, schedule::one_shot>) {
    return algorithm::one_shot;
  } else {
    static_assert(std::is_same_v<S, schedule::two_shot>,
                  "reccl: transport::nvlink runs schedule::one_shot and schedule::two_shot; ring, tree, all-to-all "
                  "relay and multi-rail broadcast run on transport::p2p (host/p2p_collective.hpp)");
    return K == collective::all_reduce ? algorithm::two_shot : algorithm::direct;
  }
}

/// T's kernel for that engine: the only instantiation the composed type names.
template <collective K, class T, algorithm A>
constexpr device::kernel_fn nvlink_kernel() {
  using E = std::conditional_t<reduces(K), T, device::raw_byte>;  // copying collectives move bytes
  if constexpr (A == algorithm::one_shot) {
    if constexpr (reduces(K) && device::element<T>::is_float && sizeof(T) <= 4) return &device::one_shot_kernel<T>;
    else return &device::ll_kernel<E>;
  } else {
    return &device::direct_kernel<E>;
  }
}

}  // namespace detail

/// collective_op<Kind, T, S, transport::nvlink, M, A>::run(comm, send, recv, count, op, stream, options).
/// Counts as in the runtime API: per rank, in elements (reccl/collective.hpp). Returns the plan run.
template <collective Kind, class T, Schedule S, Telemetry M, Allocator A>
plan run_collective(nvlink_communicator& comm, T const* send, T* recv, std::uint64_t count, redop op, cudaStream_t stream,
                    nvlink_call_options const& o = {}) {
  static_assert(S::supports(Kind), "reccl: this schedule does not implement this collective");
  static_assert(!M::enabled,
                "reccl: the one-shot and two-shot engines count no stalls: compose transport::nvlink with telemetry::none "
                "(stall telemetry: transport::p2p, or the adaptive lane of host/adaptive.hpp)");
  constexpr dtype t = device::element_dtype<T>();
  constexpr algorithm algo = detail::nvlink_algorithm<Kind, S>();
  launch_options lo;
  lo.algo = algo;
  lo.lane = o.lane;
  lo.ctas = o.ctas;
  lo.vts = o.vts;
  split sp{};
  plan p;
  device::coll_args a;
  try {
    if (o.vt_shares != nullptr) {
      if (check(*o.vt_shares) != status::ok) throw error(status::invalid_argument, "vt_shares is not a valid split", comm.rank());
      sp = to_split(*o.vt_shares, count, 16 / sizeof(T));  // VT edges on whole 16-byte packs, as the table's
      lo.vt_split = &sp;
    }
    a = comm.prepare(Kind, send, recv, count, t, op, o.root, lo, p);
  } catch (buffer_error const&) {
    comm.raise_rejection(o.lane, stream);  // peers already waiting in this call stop now, not at their deadline
    throw;
  }
  if (count == 0) return p;
  int prev = -1;
  RECCL_CUDA_CHECK(cudaGetDevice(&prev));
  if (prev != comm.device()) RECCL_CUDA_CHECK(cudaSetDevice(comm.device()));
  cudaError_t const e = device::launch_kernel(detail::nvlink_kernel<Kind, T, algo>(), p.grid, a, stream, comm.config().pdl);
  if (prev != comm.device()) RECCL_CUDA_CHECK(cudaSetDevice(prev));
  if (e != cudaSuccess) throw error(status::internal, std::string("kernel launch: ") + cudaGetErrorString(e), comm.rank());
  return p;
}

}  // namespace reccl
