// reccl/policy/allocator/texcp.hpp -- TeXCP: move bytes from slower-than-mean VTs to faster ones.
//
//   shares w_i (Q30)     estimated time T_i       r_i = T_i / T̄     factor f_i (Q16)
//   VT0 ████████         ████████████████  slow   1.6               max(1 + η(1 − r_0), f_min)
//   VT1 ████████         ██████            fast   0.6               1 + η(1 − r_1)
//   VT2 ████████         ████████                 0.8               1 + η(1 − r_2)
//                        T̄ = Σ w_i T_i / Σ w_i  (share-weighted mean: Σ w_i (1 − r_i) = 0)
//
//   w_i ← w_i · f_i  (+ ε on the slowest VT), renormalized exactly, then raised to the floor;
//   nothing moves while every |r_i − 1| <= the dead band (balancing could gain about that much).
//
// This is PReCCL's update ΔD_i = η · D_i · (T̄ − T_i) / T̄ with the gaps of the paper closed:
//  * dimensionless: the step is relative (D_i · (T̄ − T_i)/T̄), so η carries no units;
//  * the share-weighted mean T̄ makes the unclamped moves sum to zero;
//  * the relative decrease is clamped at f_min: with the raw rule a VT that is r = T_i/T̄ times the
//    mean gets 1 + η(1 − r), which is <= 0 for r >= 1 + 1/η (from the equal split a VT
//    κN/(N − 1 + κ) times slower than the mean: 2.9 at κ = 4, N = 8). A clamped VT keeps exactly
//    f_min of its share (so at worst it halves); the unclamped VTs share the rest in proportion to
//    w_i · f_i, which keeps the total at share_one;
//  * ε (explicit) is added to the slowest VT's factor: the VT that looks slowest is the one whose
//    estimate is most likely inflated by noise (the slowest rank's estimate counts, a max), so its
//    cut is damped a little. The price: at equilibrium the slowest VT stays ε/η above the others'
//    relative time (defaults: 2^-10 / 0.75, 0.13% of the collective time);
//  * a floor (min_share) so a live VT never sticks at zero bytes: a multiplicative rule cannot
//    grow a share of 0;
//  * rounding: Q30 shares, floor division plus largest remainder, ties to the lower VT id, so the
//    live shares sum to exactly share_one; to_split() then rounds to granules the same way.
// Everything is integer arithmetic: the same bits on every rank, host or device.
//
// Choice of η and f_min (tests/policy/allocator.test.cpp sweeps N = 2..8, κ = 1.25..4, one slow
// VT first or last, one fast VT, linear spread, 4 random bandwidth sets in [1, κ], each also with a
// VT masked: 520 cases, from the equal split, exact times T_i = D_i / B_i). Near the optimum the map
// r → r(1 + η(1 − r)) has slope 1 − η: η near 1 converges fastest, η > 1 alternates around the
// optimum and amplifies noise. Measured (worst case over the sweep / over the noisy sweep):
//     η      collective time within 5% of T*   shares within 10%   share std/mean, ±5% noise
//     0.625  4 steps                           4 steps             2.7%
//     0.75   4 steps                           4 steps             3.0-3.5%   <- default
//     0.875  3 steps                           3 steps             3.4-3.9%
//     1.0    3 steps                           3 steps             3.9%
// η = 3/4 with f_min = 1/2: at most 4 steps for both bounds, no VT that starts above its optimum
// ever drops below 0.87 of it, and the shares stay still once converged (change < 10^-3 per step).
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "allocator.hpp"

namespace reccl::allocator {

/// TeXCP allocator (see the file comment). Tunables are Q16 fractions (q16(x)) or Q30 shares.
struct texcp {
  std::uint32_t eta = 49152;               ///< step size η, Q16, used up to 2.0; default q16(0.75)
  std::uint32_t min_factor = 32768;        ///< a VT keeps at least this fraction of its share per step, Q16; default q16(0.5)
  std::uint32_t epsilon = 64;              ///< added to the slowest VT's factor, Q16; default q16(1/1024)
  std::uint32_t min_share = share_one >> 10;  ///< every live VT ends an update with at least this share, Q30; default 1/1024 (also the share a joining VT gets)
  /// Dead band, Q16: while every estimated VT's time is within this fraction of the mean (so
  /// balancing could gain about that much at most), the shares stay as they are; default
  /// q16(1/64). Moving bytes is not free on the GPU: a VT block a little larger than before gives
  /// its pipelines one more round, and on an H200 the 0.1-1% share jitter of a healthy link cost a
  /// 64 MiB all-reduce up to ~4% (bench/NOTES.md, 20). 0 moves on every estimate.
  std::uint32_t dead_band = 1024;

  /// Next shares from the previous shares and the times of the last collective. VTs without an
  /// estimate (time 0) keep their share, with fewer than two estimates nothing moves, except that
  /// a live VT below min_share is lifted to it (taking from the others in proportion to their
  /// excess). Deterministic.
  RECCL_HOST_DEVICE constexpr shares update(shares const& prev, vt_observation const& o) const {
    shares s = detail::start_from(prev, o, min_share);
    if (check(s) != status::ok) return s;
    std::uint32_t const est = detail::estimated(s, o);
    std::uint64_t t[max_vts] = {};
    detail::normalize_times(o.time, est, t);
    std::uint64_t mass = 0, weighted = 0;  // Σ w_i and Σ w_i t_i (< 2^50) over the estimated VTs
    int n_est = 0, slowest = -1;
    for (int i = 0; i < max_vts; ++i) {
      if (!((est >> i) & 1u)) continue;
      ++n_est;
      mass += s.w[i];
      weighted += s.w[i] * t[i];
      if (slowest < 0 || t[i] > t[slowest]) slowest = i;  // ties: the lower id
    }
    if (n_est < 2 || mass == 0) {
      detail::apply_floor(s.w, s.live_mask, min_share);
      return s;
    }
    std::uint64_t mean = weighted / mass;  // T̄ in the units of t (max 2^20)
    if (mean == 0) mean = 1;
    std::int64_t ratio[max_vts] = {};  // T_i / T̄, Q16
    bool hold = true;                  // balanced within the dead band: every estimated VT
    for (int i = 0; i < max_vts; ++i) {
      if (!((est >> i) & 1u)) continue;
      ratio[i] = static_cast<std::int64_t>((t[i] << 16) / mean);
      hold = hold && ratio[i] <= 65536 + static_cast<std::int64_t>(dead_band) && ratio[i] + dead_band >= 65536;
    }
    if (hold) {
      detail::apply_floor(s.w, s.live_mask, min_share);
      return s;
    }
    std::int64_t const step = eta < 131072u ? eta : 131072;  // η <= 2 keeps step * ratio in 64 bits
    // Clamped VTs keep exactly w_i · f_min (+ ε); the others share the rest of `mass` in proportion
    // to w_i · f_i, so the clamp is a guarantee, not just a bound before renormalization.
    std::uint64_t raw[max_vts] = {}, clamped_sum = 0;
    std::uint32_t clamped = 0;
    for (int i = 0; i < max_vts; ++i) {
      if (!((est >> i) & 1u)) continue;
      std::int64_t f = 65536 + step * (65536 - ratio[i]) / 65536;
      bool const clamp = f < static_cast<std::int64_t>(min_factor);
      if (clamp) f = min_factor;
      if (i == slowest) f += epsilon;
      raw[i] = static_cast<std::uint64_t>(s.w[i]) * static_cast<std::uint64_t>(f);  // < 2^30 * 2^33
      if (clamp) {
        clamped |= 1u << i;
        clamped_sum += raw[i] >> 16;
      }
    }
    std::uint32_t const unclamped = est & ~clamped;
    if (clamped != 0 && unclamped != 0 && clamped_sum < mass) {
      for (int i = 0; i < max_vts; ++i)
        if ((clamped >> i) & 1u) s.w[i] = static_cast<std::uint32_t>(raw[i] >> 16);
      detail::distribute(raw, unclamped, mass - clamped_sum, s.w);
    } else {
      detail::distribute(raw, est, mass, s.w);
    }
    detail::apply_floor(s.w, s.live_mask, min_share);
    return s;
  }
};

}  // namespace reccl::allocator
