// reccl/policy/allocator/aimd.hpp -- per-VT additive increase, multiplicative decrease (for comparison).
//
//   each VT on its own:   T_i > T̄ · (1 + tolerance)  ?   w_i ← w_i · decrease      (congested)
//                                                      :   w_i ← w_i + increase      (not congested)
//   then all shares are renormalized exactly to share_one and raised to the floor.
//
//   share of a slow VT over time (expected: a sawtooth, it never settles)
//     ▲    /|    /|    /|
//     │   / |   / |   / |
//     │  /  |  /  |  /  |
//     └─/───┴─/───┴─/───┴──▶ collectives
//
// The baseline PReCCL compares TeXCP against: each VT reacts only to its own congestion signal, so
// the shares keep oscillating around the optimum instead of converging. T̄ is the share-weighted
// mean time, the same congestion reference TeXCP uses. Integer arithmetic, deterministic.
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "allocator.hpp"

namespace reccl::allocator {

/// AIMD allocator (see the file comment).
struct aimd {
  std::uint32_t increase = share_one >> 5;    ///< additive increase per collective, Q30; default 1/32
  std::uint32_t decrease = 32768;             ///< multiplicative decrease factor, Q16; default q16(0.5)
  std::uint32_t tolerance = 3277;             ///< congested when T_i > T̄ · (1 + tolerance), Q16; default q16(0.05)
  std::uint32_t min_share = share_one >> 10;  ///< every live VT ends an update with at least this share, Q30; default 1/1024 (also the share a joining VT gets)

  /// Next shares; VTs without an estimate (time 0) keep their share; then a live VT below
  /// min_share is lifted to it. Deterministic.
  RECCL_HOST_DEVICE constexpr shares update(shares const& prev, vt_observation const& o) const {
    shares s = detail::start_from(prev, o, min_share);
    if (check(s) != status::ok) return s;
    std::uint32_t const est = detail::estimated(s, o);
    std::uint64_t t[max_vts] = {}, raw[max_vts] = {}, mass = 0, weighted = 0;
    detail::normalize_times(o.time, est, t);
    for (int i = 0; i < max_vts; ++i) {
      if (!((est >> i) & 1u)) continue;
      mass += s.w[i];
      weighted += s.w[i] * t[i];
    }
    if (mass == 0) {
      detail::apply_floor(s.w, s.live_mask, min_share);
      return s;
    }
    std::uint64_t const mean = weighted / mass;  // T̄, at most 2^20
    std::uint64_t const limit = mean * (65536 + static_cast<std::uint64_t>(tolerance));  // T̄(1 + tol), Q16
    for (int i = 0; i < max_vts; ++i) {
      if (!((est >> i) & 1u)) continue;
      bool const congested = (t[i] << 16) > limit;
      raw[i] = congested ? static_cast<std::uint64_t>(s.w[i]) * decrease >> 16
                         : static_cast<std::uint64_t>(s.w[i]) + increase;
    }
    detail::distribute(raw, est, mass, s.w);
    detail::apply_floor(s.w, s.live_mask, min_share);
    return s;
  }
};

}  // namespace reccl::allocator
