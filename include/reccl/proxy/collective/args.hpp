// reccl/proxy/collective/args.hpp -- the vocabulary of the proxy collectives shared by the host
// facade and the device agent: a call's arguments, a rank's persistent state, and the fields a
// peer check names.
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "../../policy/allocator/allocator.hpp"
#include "../../types.hpp"

namespace reccl::proxy {

/// One rank's persistent collective state (device memory).
struct collective_state {
  std::uint64_t ready_step[max_vts];    ///< ready values used so far, per VT
  std::uint64_t credit_round[max_vts];  ///< reduce rounds so far (each uses one receive slot), per VT
  std::uint64_t stalls[max_vts];        ///< unsuccessful polls of this rank's waits, per VT, all collectives
  std::uint64_t calls[max_vts];         ///< collectives so far, per VT (the peer check's call index)
  std::uint32_t fault_status;           ///< first fault's reccl::status (0: none)
  std::int32_t fault_vt;
  std::int32_t fault_peer;
  std::uint32_t fault_field;            ///< mismatch: the call_field that differs
  std::uint64_t fault_step;             ///< ready step (or round) the failed wait was for; mismatch: the call index
};

/// What a peer check found different (collective_state::fault_field).
enum class call_field : std::uint32_t { none = 0, call_index, collective, dtype, op, count, root, vt_shares };

constexpr char const* name(call_field f) {
  switch (f) {
    case call_field::none: return "none";
    case call_field::call_index: return "call index (a rank skipped or added a call)";
    case call_field::collective: return "collective";
    case call_field::dtype: return "dtype";
    case call_field::op: return "op";
    case call_field::count: return "count";
    case call_field::root: return "root";
    case call_field::vt_shares: return "vt_shares";
  }
  return "?";
}

/// Arguments of one collective, the same on every rank (except the buffers' addresses, which are
/// each rank's own; their offsets in the symmetric region are the same).
struct collective_args {
  collective coll = collective::all_reduce;
  dtype type = dtype::float32;
  redop op = redop::sum;
  std::uint64_t count = 0;   ///< NCCL's meaning: all-gather's send count, reduce-scatter's receive count, ...
  void const* in = nullptr;  ///< in my symmetric region
  void* out = nullptr;       ///< in my symmetric region
  std::int32_t root = 0;     ///< broadcast
  std::uint64_t timeout_ns = 10'000'000'000ull;  ///< deadline of every wait, from the kernel's start
  std::uint32_t slots = 0;   ///< set by proxy_collectives (its slot count; the same for every call)
  /// Each VT's share of every segment (an Allocator's output; check() must accept it and its n_vts
  /// must be the group's VT count), the same on every rank; a masked VT carries no bytes but still
  /// takes part in every step. n_vts == 0: equal shares over all VTs.
  reccl::shares vt_shares{};
  /// Whether each VT checks, on the device, that every peer's call has the same arguments (set by
  /// proxy_collectives: on where the ranks are in different processes; see agent.hpp's file comment).
  bool peer_checks = false;
  /// Puts of at most this many bytes go inline (set by proxy_collectives; see agent.hpp's file comment).
  /// A rank's own choice: the bytes that land are the same either way.
  std::uint32_t inline_max = 0;
};

}  // namespace reccl::proxy
