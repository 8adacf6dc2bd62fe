// reccl/proxy/collective/peer_check.hpp -- the 32-byte digest of a call that each VT sends its
// peers where ranks live in different processes, and the comparison that names the first field
// that differs (the protocol: agent.hpp).
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "../../types.hpp"
#include "args.hpp"

namespace reccl::proxy::detail {

/// Bytes at the end of every receive area that carry the peer check's call digests (two calls in
/// flight at most: slot = call index % 2); the reduce slots share the rest of the area.
inline constexpr std::uint64_t digest_area_bytes = 64;
RECCL_HOST_DEVICE constexpr std::uint64_t data_area(std::uint64_t area_bytes) {
  return area_bytes > digest_area_bytes ? area_bytes - digest_area_bytes : 0;
}

/// A call as the peer check compares it: 32 bytes, sent inline with the first signal to each peer.
struct call_words {
  std::uint64_t call;    ///< this VT's call index
  std::uint64_t count;
  std::uint32_t kind;    ///< collective | dtype << 8 | op << 16
  std::int32_t root;
  std::uint64_t shares;  ///< FNV-1a of the resolved split
};
static_assert(sizeof(call_words) == 32 && 2 * sizeof(call_words) <= digest_area_bytes);

RECCL_HOST_DEVICE call_words make_call_words(collective_args const& a, std::uint64_t call) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<std::uint64_t>(a.vt_shares.n_vts));
  mix(a.vt_shares.live_mask);
  for (int i = 0; i < max_vts; ++i) mix(a.vt_shares.w[i]);
  return {call, a.count, static_cast<std::uint32_t>(a.coll) | static_cast<std::uint32_t>(a.type) << 8 | static_cast<std::uint32_t>(a.op) << 16,
          a.coll == collective::broadcast ? a.root : 0, h};
}
/// The first field in which `theirs` differs from `mine` (none if they agree).
RECCL_HOST_DEVICE call_field first_difference(call_words const& mine, call_words const& theirs) {
  if (theirs.call != mine.call) return call_field::call_index;
  if ((theirs.kind & 0xffu) != (mine.kind & 0xffu)) return call_field::collective;
  if ((theirs.kind >> 8 & 0xffu) != (mine.kind >> 8 & 0xffu)) return call_field::dtype;
  if ((theirs.kind >> 16) != (mine.kind >> 16)) return call_field::op;
  if (theirs.count != mine.count) return call_field::count;
  if (theirs.root != mine.root) return call_field::root;
  if (theirs.shares != mine.shares) return call_field::vt_shares;
  return call_field::none;
}

}  // namespace reccl::proxy::detail
