// reccl/policy/allocator/equal.hpp -- NCCL's split: every live VT carries the same share.
//
//   VT0 ██████   VT1 ██████   VT2 ░░░░░░ (masked: 0)   VT3 ██████
//
// Ignores the times; follows the live mask. The baseline the adaptive allocators are compared to.
#pragma once

#include "../../config.hpp"
#include "allocator.hpp"

namespace reccl::allocator {

/// Equal allocator: share_one / live per live VT, the rounding remainder to the lowest ids.
struct equal {
  /// Equal shares over the observation's live VTs, whatever the previous shares were.
  RECCL_HOST_DEVICE constexpr shares update(shares const&, vt_observation const& o) const {
    return equal_shares(o.n_vts, o.live_mask);
  }
};

}  // namespace reccl::allocator
