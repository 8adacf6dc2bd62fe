// reccl/policy/allocator/fixed.hpp -- a static split: the shares a loop starts with never move.
//
//   VT0 ████████████   VT1 ██   VT2 ░ (masked: 0)   VT3 ████████      ...collective after collective
//
// Ignores the times. Follows the live mask only: a VT that leaves gives its share to those that
// stay (in proportion), one that joins gets `join_share`. The reference a sweep of static splits
// is measured with (the best static split of a scenario), and a way to pin a split by hand.
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "allocator.hpp"

namespace reccl::allocator {

/// Fixed allocator: the previous shares, moved onto the observation's live mask.
struct fixed {
  std::uint32_t join_share = share_one >> 6;  ///< Q30 share of a VT that joins; default 1/64

  RECCL_HOST_DEVICE constexpr shares update(shares const& prev, vt_observation const& o) const {
    return detail::start_from(prev, o, join_share);
  }
};

}  // namespace reccl::allocator
