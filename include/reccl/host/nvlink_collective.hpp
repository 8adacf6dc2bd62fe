// reccl/host/nvlink_collective.hpp -- the composed collective types on the NVLink fast path:
// collective_op<Kind, T, Schedule, transport::nvlink, Telemetry, Allocator> runs the fast path's
// engine for Schedule, instantiated for T only, on an nvlink_communicator (NCCL symmetric windows,
// CUDA IPC windows from create_p2p(), or loopback ranks).
//
//   using ar = reccl::all_reduce<__nv_bfloat16, reccl::schedule::one_shot, reccl::transport::nvlink,
//                                reccl::telemetry::none, reccl::allocator::equal>;
//   ar::run(comm, send, recv, count, reccl::redop::sum, stream);              // every rank
//   ar::run(comm, send, recv, count, reccl::redop::sum, stream, reccl::nvlink_call_options{.vt_shares = &s});
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
// Policies: with telemetry::none and allocator::equal the type runs the engine above (the same
// kernel as the runtime API: nothing is counted, the split is the tuning table's or `vt_shares`).
// Any other pair closes the loop on the GPU: the type runs the adaptive lane of host/adaptive.hpp
// with that Allocator and Telemetry (the one-shot pattern through the pipelined rings, any size;
// each VT's waits timed, the split stepped on the device collective by collective, a dead VT
// recovered inside the collective and probed back), so schedule::one_shot is the only schedule
// there. The lane's loop state lives in the communicator (one per lane, attached at set-up):
//
//   using ar = reccl::all_reduce<__nv_bfloat16, reccl::schedule::one_shot, reccl::transport::nvlink,
//                                reccl::telemetry::stalls, reccl::allocator::texcp>;
//   reccl::setup_lane<ar>(comm, {.lane = 1, .vts = 8});    // every rank; before capturing a graph
//   ar::run(comm, send, recv, count, reccl::redop::sum, stream, reccl::nvlink_call_options{.lane = 1});
//   auto reports = reccl::lane_of<ar>(comm, 1).reports(0, reccl::lane_of<ar>(comm, 1).epoch());
//
// A first run on a lane that was not set up sets it up with the defaults (adaptive_options, with
// the call's lane and VTs), in the call's stream order; inside a stream capture it is refused. Every type
// with the same Allocator and Telemetry shares the lane's loop (the split adapts to all of them);
// another pair on the same lane is refused.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "../collective.hpp"
#include "../device/launch.hpp"
#include "../policy/allocator/allocator.hpp"
#include "../policy/allocator/equal.hpp"
#include "../policy/schedule/one_shot.hpp"
#include "../policy/schedule/schedule.hpp"
#include "../policy/schedule/two_shot.hpp"
#include "../policy/telemetry/telemetry.hpp"
#include "adaptive.hpp"
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

/// Whether the composed type with these policies runs the adaptive lane (see the file comment).
template <Telemetry M, Allocator A>
inline constexpr bool nvlink_adaptive = M::enabled || !std::is_same_v<A, allocator::equal>;

/// The adaptive lane the composed type Op (transport::nvlink, adaptive policies) runs on lane
/// `lane` of `comm`: reports, samples, injected faults, cost models. Throws if it is not set up.
template <class Op>
adaptive_lane<typename Op::allocator_type, typename Op::telemetry_type>& lane_of(nvlink_communicator& comm, int lane) {
  using L = adaptive_lane<typename Op::allocator_type, typename Op::telemetry_type>;
  L* l = comm.attached<L>(lane);
  if (l == nullptr)
    throw error(status::invalid_argument, "lane " + std::to_string(lane) + " runs no adaptive lane of these policies", comm.rank());
  l->rebind(comm);
  return *l;
}

/// Sets up (or resets to equal shares) the adaptive lane of Op's policies on lane `o.lane` of this
/// rank's communicator: call it on every rank with the same options, outside stream capture
/// (it synchronises the device). Returns the lane.
template <class Op>
adaptive_lane<typename Op::allocator_type, typename Op::telemetry_type>& setup_lane(nvlink_communicator& comm,
                                                                                     adaptive_options const& o = {},
                                                                                     typename Op::allocator_type alloc = {}) {
  using L = adaptive_lane<typename Op::allocator_type, typename Op::telemetry_type>;
  static_assert(std::is_same_v<typename Op::transport_type, transport::nvlink> &&
                    nvlink_adaptive<typename Op::telemetry_type, typename Op::allocator_type>,
                "reccl: setup_lane is for composed types on transport::nvlink with a Telemetry or Allocator other than "
                "none / equal");
  return comm.attach<L>(o.lane, [&] { return std::move(L::create_all({&comm}, o, alloc).front()); });
}

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

/// The plain engines: Schedule S's kernel for T, the split from `vt_shares` or the tuning table.
template <collective Kind, class T, class S>
plan run_plain(nvlink_communicator& comm, T const* send, T* recv, std::uint64_t count, redop op, cudaStream_t stream,
               nvlink_call_options const& o) {
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

}  // namespace detail

/// collective_op<Kind, T, S, transport::nvlink, M, A>::run(comm, send, recv, count, op, stream, options).
/// Counts as in the runtime API: per rank, in elements (reccl/collective.hpp). Returns the plan run.
template <collective Kind, class T, Schedule S, Telemetry M, Allocator A>
plan run_collective(nvlink_communicator& comm, T const* send, T* recv, std::uint64_t count, redop op, cudaStream_t stream,
                    nvlink_call_options const& o = {}) {
  static_assert(S::supports(Kind), "reccl: this schedule does not implement this collective");
  if constexpr (nvlink_adaptive<M, A>) {
    static_assert(std::is_same_v<S, schedule::one_shot>,
                  "reccl: the adaptive lane (a Telemetry or Allocator other than none / equal on transport::nvlink) runs "
                  "the one-shot pattern through pipelined rings: compose it with schedule::one_shot");
    using L = adaptive_lane<A, M>;
    if (o.vt_shares != nullptr)  // before any set-up: a refused call changes nothing
      throw error(status::invalid_argument,
                  "vt_shares: the adaptive lane chooses the split (adaptive_options::initial sets where it starts)", comm.rank());
    L* lane = comm.attached<L>(o.lane);
    if (lane == nullptr) {
      cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
      RECCL_CUDA_CHECK(cudaStreamIsCapturing(stream, &cs));
      if (cs != cudaStreamCaptureStatusNone)
        throw error(status::invalid_argument,
                    "lane " + std::to_string(o.lane) +
                        " has no adaptive lane yet and its set-up copies from host memory, which a graph cannot "
                        "replay: call reccl::setup_lane<Op>(comm, options) on every rank before capturing",
                    comm.rank());
      if (o.vts < 0 || o.ctas < 0 || (o.ctas != 0 && o.ctas % (o.vts != 0 ? o.vts : adaptive_options{}.vts) != 0))
        throw error(status::invalid_argument,
                    "ctas " + std::to_string(o.ctas) + " is not a whole number of CTAs per VT for lane " +
                        std::to_string(o.lane),
                    comm.rank());
      adaptive_options ao;
      ao.lane = o.lane;
      if (o.vts != 0) ao.vts = o.vts;
      if (o.ctas != 0) ao.ctas_per_vt = o.ctas / ao.vts;
      // in the call's stream order: a device-wide synchronisation here would wait for the
      // kernels of peers driven from this process, which wait for this rank
      lane = &comm.attach<L>(o.lane, [&] { return L::create_on_stream(comm, ao, A{}, stream); });
    }
    lane->rebind(comm);
    adaptive_options const& lo = lane->options();
    if ((o.vts != 0 && o.vts != lo.vts) || (o.ctas != 0 && o.ctas != lo.vts * lo.ctas_per_vt))
      throw error(status::invalid_argument,
                  "lane " + std::to_string(o.lane) + " was set up with " + std::to_string(lo.vts) + " VTs x " +
                      std::to_string(lo.ctas_per_vt) + " CTAs; this call asks for other VTs or CTAs",
                  comm.rank());
    return lane->template run_typed<Kind>(send, recv, count, op, o.root, stream);
  } else {
    return detail::run_plain<Kind, T, S>(comm, send, recv, count, op, stream, o);
  }
}

}  // namespace reccl
