// reccl/policy/allocator/proportional.hpp -- shares proportional to each VT's estimated bandwidth.
//
//   VT   bytes D_i ∝ w_i   time T_i     bandwidth D_i / T_i      next share
//   0    ████████          ████████     ████                     ████
//   1    ████████          ████         ████████                 ████████
//
//   w_i ← (w_i / T_i) / Σ_j (w_j / T_j)   over the VTs with an estimate, in one step.
//
// Exact when T_i = D_i / B_i; with a fixed overhead per collective (T_i = Δ + D_i / B_i) it
// undershoots the spread, and with noisy T_i it jumps by the full noise every step (TeXCP damps).
// Integer arithmetic: times are normalized so the largest is 2^20, then w_i · 2^20 / t_i.
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "allocator.hpp"

namespace reccl::allocator {

/// Proportional allocator (see the file comment).
struct proportional {
  std::uint32_t min_share = share_one >> 10;  ///< every live VT ends an update with at least this share, Q30; default 1/1024 (also the share a joining VT gets)

  /// Next shares: each VT with an estimate gets a part of the estimated VTs' total share in
  /// proportion to w_i / T_i; VTs without an estimate (time 0) keep their share; then a live VT
  /// below min_share is lifted to it. Deterministic.
  RECCL_HOST_DEVICE constexpr shares update(shares const& prev, vt_observation const& o) const {
    shares s = detail::start_from(prev, o, min_share);
    if (check(s) != status::ok) return s;
    std::uint32_t const est = detail::estimated(s, o);
    std::uint64_t t[max_vts] = {}, raw[max_vts] = {}, mass = 0;
    detail::normalize_times(o.time, est, t);
    for (int i = 0; i < max_vts; ++i) {
      if (!((est >> i) & 1u)) continue;
      mass += s.w[i];
      raw[i] = (static_cast<std::uint64_t>(s.w[i]) << 20) / t[i];  // t_i >= 1
    }
    if (est != 0) detail::distribute(raw, est, mass, s.w);
    detail::apply_floor(s.w, s.live_mask, min_share);
    return s;
  }
};

}  // namespace reccl::allocator
