// reccl/policy/allocator/allocator.hpp -- the Allocator concept, the shares it updates, and the
// conversion of shares into a split for a given message.
//
// An allocator is a pure, deterministic function of (previous shares, per-VT observations):
// fixed VT order, integer/fixed-point arithmetic only, ties to the lower VT id. Every rank feeds it
// the same inputs (the epoch protocol checks that), so every rank computes the same split to the
// bit, on the host and on the device. An allocator never changes results, only where bytes travel.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "../../config.hpp"
#include "../split.hpp"

namespace reccl {

/// Fixed-point unit of a share: the live shares of a `shares` always sum to exactly share_one.
inline constexpr std::uint32_t share_one = 1u << 30;

/// Persistent allocator state: each VT's fraction of the message, independent of message size.
struct shares {
  std::int32_t n_vts = 0;
  std::uint32_t live_mask = 0;
  std::uint32_t w[max_vts] = {};  ///< Q30; masked VTs hold 0; live ones sum to share_one
};

/// What the last collective taught about each VT. Times are fixed-point (any consistent unit,
/// e.g. nanoseconds from the cost model); 0 means "no estimate" (VT carried no bytes).
struct vt_observation {
  std::int32_t n_vts = 0;
  std::uint32_t live_mask = 0;        ///< VTs that may carry bytes in the next collective
  std::uint64_t time[max_vts] = {};   ///< estimated time of each VT's block in the last collective
};

/// Allocator: trivially copyable, default-constructible, with a deterministic update.
template <class A>
concept Allocator = std::is_trivially_copyable_v<A> && std::default_initializable<A> &&
                    requires(A const a, shares const& s, vt_observation const& o) {
                      { a.update(s, o) } -> std::same_as<shares>;
                    };

}  // namespace reccl
