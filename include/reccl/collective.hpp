// reccl/collective.hpp -- the composed collective: Op × Schedule × Transport × Telemetry × Allocator.
//
//   using ar = reccl::all_reduce<float, reccl::schedule::ring, reccl::transport::cpu_threads,
//                                reccl::telemetry::stalls, reccl::allocator::texcp>;
//   ar::run(comm, rank, send, recv, count, reccl::redop::sum);   // from each rank's thread
//
// Swapping one template argument swaps the policy: e.g. allocator::equal for NCCL's fixed split.
// run() dispatches to the transport's engine through an unqualified call of
// run_collective<Kind, T, S, M, A>(comm, ...), found by argument-dependent lookup in the namespace
// of the transport's communicator type (reccl::cpu for transport::cpu_threads). Another transport
// plugs in by declaring its own communicator type and run_collective overload in its namespace:
// reccl::p2p_communicator (reccl/host/p2p_collective.hpp) runs the same types on GPUs through the
// schedule agent, reccl::nvlink_communicator (reccl/host/nvlink_collective.hpp) on the fast engines.
#pragma once

#include <cstdint>
#include <type_traits>

#include "policy/allocator/allocator.hpp"
#include "policy/schedule/schedule.hpp"
#include "policy/telemetry/telemetry.hpp"
#include "transport.hpp"
#include "types.hpp"
#include "cpu/engine.hpp"

namespace reccl {

/// A collective of kind `Kind` on elements T, composed from its four policies at compile time.
template <collective Kind, class T, Schedule S, Transport X, Telemetry M, Allocator A>
struct collective_op {
  static_assert(S::supports(Kind), "reccl: this schedule does not implement this collective");

  static constexpr collective kind = Kind;
  using value_type = T;
  using schedule_type = S;
  using transport_type = X;
  using telemetry_type = M;
  using allocator_type = A;
  using communicator = typename X::communicator;

  /// Runs the collective on `rank` (call from every rank). Counts are per rank, in elements:
  ///  * all_reduce:     send[count] -> recv[count]
  ///  * reduce_scatter: send[nranks*count] -> recv[count] (rank r gets block r)
  ///  * all_gather:     send[count] -> recv[nranks*count]
  ///  * broadcast:      root's send[count] -> recv[count] (send may be null off the root)
  ///  * all_to_all:     send[nranks*count] (block d for rank d) -> recv[nranks*count] (block s from rank s)
  /// `op` matters for all_reduce and reduce_scatter, `root` for broadcast, `alloc` carries the
  /// allocator's tunables. Returns the transport's result (for cpu_threads: cpu::collective_result,
  /// status ok or recovered); throws reccl::error on bad input, disagreeing ranks, a lost rank or
  /// the loss of every VT.
  static auto run(communicator& comm, int rank, T const* send, T* recv, std::uint64_t count, redop op = redop::sum,
                  int root = 0, A const& alloc = A{}) {
    return run_collective<Kind, T, S, M, A>(comm, rank, send, recv, count, op, root, alloc);
  }

  /// Any other call shape the transport's run_collective takes, e.g. the GPU transports'
  /// run(comm, send, recv, count, op, stream, options) (reccl/host/p2p_collective.hpp): one
  /// communicator per rank, so no rank argument (a first argument that converts to int is the
  /// rank of the call above, whose pointers may then be nullptr).
  template <class First, class... Args>
    requires(!std::is_convertible_v<First, int>)
  static auto run(communicator& comm, First&& first, Args&&... args) {
    return run_collective<Kind, T, S, M, A>(comm, static_cast<First&&>(first), static_cast<Args&&>(args)...);
  }
};

template <class T, Schedule S, Transport X, Telemetry M, Allocator A>
using all_reduce = collective_op<collective::all_reduce, T, S, X, M, A>;
template <class T, Schedule S, Transport X, Telemetry M, Allocator A>
using reduce_scatter = collective_op<collective::reduce_scatter, T, S, X, M, A>;
template <class T, Schedule S, Transport X, Telemetry M, Allocator A>
using all_gather = collective_op<collective::all_gather, T, S, X, M, A>;
template <class T, Schedule S, Transport X, Telemetry M, Allocator A>
using broadcast = collective_op<collective::broadcast, T, S, X, M, A>;
template <class T, Schedule S, Transport X, Telemetry M, Allocator A>
using all_to_all = collective_op<collective::all_to_all, T, S, X, M, A>;

}  // namespace reccl
