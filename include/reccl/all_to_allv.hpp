// reccl/all_to_allv.hpp -- the composed all-to-allv: per-peer counts that differ, chosen at run time.
//
//   using a2av = reccl::all_to_allv<float, reccl::schedule::all_to_all, reccl::transport::cpu_threads,
//                                   reccl::telemetry::none, reccl::allocator::equal>;
//   a2av::run(comm, rank, {send, send_len, send_counts, send_offsets},
//                         {recv, recv_len, recv_counts, recv_offsets});
//
// Rank s sends send_counts[d] elements from send + send_offsets[d] to each rank d (itself
// included). Rank d receives them packed by source: recv_counts[s] elements at recv + recv_offsets[s],
// recv_offsets[0] = 0 and recv_offsets[s+1] = recv_offsets[s] + recv_counts[s]; both arrays are
// written by the call, so a receiver needs to know only how much room it has (recv.len).
//
// Bad input never moves data and never leaves a peer waiting: each rank's checks (counts or offsets
// negative or beyond its send buffer, more incoming elements than its receive buffer holds) are
// agreed on before any data moves, and every rank throws reccl::error(invalid_argument) naming the
// rank at fault; the communicator stays usable.
//
// Like collective_op, run() reaches the transport's engine through an unqualified call of
// run_all_to_allv<T, S, M, A>(comm, ...), found by argument-dependent lookup: the CPU engine's is in
// reccl/cpu/all_to_allv.hpp, the P2P transport's (counts in device memory) in
// reccl/host/p2p_all_to_allv.hpp.
#pragma once

#include <cstdint>
#include <string_view>
#include <type_traits>
#include <utility>

#include "policy/allocator/allocator.hpp"
#include "policy/schedule/schedule.hpp"
#include "policy/telemetry/telemetry.hpp"
#include "transport.hpp"
#include "types.hpp"

namespace reccl {

/// The send side of an all-to-allv: `len` elements at `data`; counts[d] of them, from offsets[d],
/// go to rank d (arrays of nranks entries).
template <class T>
struct v_send {
  T const* data = nullptr;
  std::uint64_t len = 0;
  std::int64_t const* counts = nullptr;
  std::int64_t const* offsets = nullptr;
};

/// The receive side: room for `len` elements at `data`; the call writes counts[s] and offsets[s]
/// (nranks entries each) for every source rank s.
template <class T>
struct v_recv {
  T* data = nullptr;
  std::uint64_t len = 0;
  std::int64_t* counts = nullptr;
  std::int64_t* offsets = nullptr;
};

/// Why a rank refused a call whose checks all ranks agree on before data moves (larger values
/// win when several ranks refuse: the error names one of them).
enum class call_reject : std::uint8_t {
  none = 0,
  bad_arguments,  ///< null arrays, or counts/offsets negative or beyond the send buffer
  overflow,       ///< more incoming elements than the receive buffer holds
  bad_expert,     ///< MoE: a slot names an expert outside [-1, n_experts), or one a token names already
  too_many_tokens,  ///< MoE: more tokens than the size the exchange was created for
};

constexpr std::string_view describe(call_reject r) {
  switch (r) {
    case call_reject::none: return "nothing";
    case call_reject::bad_arguments: return "its counts, offsets or buffers are invalid";
    case call_reject::overflow: return "it would receive more than its receive buffer holds";
    case call_reject::bad_expert: return "its routing names an expert outside [-1, n_experts), or one expert twice in a token";
    case call_reject::too_many_tokens: return "it passed more tokens than the exchange was created for";
  }
  return "?";
}

/// All-to-allv on elements T, composed from its policies; S must implement all_to_all.
template <class T, Schedule S, Transport X, Telemetry M, Allocator A>
struct all_to_allv_op {
  static_assert(S::supports(collective::all_to_all), "reccl: all_to_allv needs a schedule that implements all_to_all");

  using value_type = T;
  using schedule_type = S;
  using transport_type = X;
  using telemetry_type = M;
  using allocator_type = A;
  using communicator = typename X::communicator;

  /// Runs the exchange on `rank` (call from every rank); see the file comment.
  static auto run(communicator& comm, int rank, v_send<T> send, v_recv<T> recv, A const& alloc = A{}) {
    return run_all_to_allv<T, S, M, A>(comm, rank, send, recv, alloc);
  }

  /// The GPU transports' shape: one communicator per rank, then the stream and options, e.g.
  /// run(comm, send, recv, stream) (reccl/host/p2p_all_to_allv.hpp).
  template <class... Args>
  static auto run(communicator& comm, v_send<T> send, v_recv<T> recv, Args&&... args) {
    return run_all_to_allv<T, S, M, A>(comm, send, recv, std::forward<Args>(args)...);
  }
};

template <class T, Schedule S, Transport X, Telemetry M, Allocator A>
using all_to_allv = all_to_allv_op<T, S, X, M, A>;

}  // namespace reccl
