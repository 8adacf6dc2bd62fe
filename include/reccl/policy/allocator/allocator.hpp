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
#include "../../types.hpp"
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

/// Q16 fixed-point encoding of an allocator tunable (1.0 -> 65536), rounded to nearest, clamped to
/// [0, 65535.99...]. Tunables are stored as these integers, so no allocator computes with floats.
RECCL_HOST_DEVICE constexpr std::uint32_t q16(double x) {
  if (!(x > 0)) return 0;
  return x >= 65535.99 ? 0xffffffffu : static_cast<std::uint32_t>(x * 65536.0 + 0.5);
}

/// Whether `s` is a well-formed `shares`: 1 <= n_vts <= max_vts, no live bit at or above n_vts,
/// masked VTs hold 0 and the live ones sum to exactly share_one. `status::invalid_argument` if not.
RECCL_HOST_DEVICE constexpr status check(shares const& s) {
  if (s.n_vts < 1 || s.n_vts > max_vts) return status::invalid_argument;
  if ((s.live_mask & ~all_live(s.n_vts)) != 0 || s.live_mask == 0) return status::invalid_argument;
  std::uint64_t sum = 0;
  for (int i = 0; i < max_vts; ++i) {
    if (!((s.live_mask >> i) & 1u) && s.w[i] != 0) return status::invalid_argument;
    sum += s.w[i];
  }
  return sum == share_one ? status::ok : status::invalid_argument;
}

namespace detail {

/// Largest-remainder rounding: adds 1 to q[i] for the `leftover` live VTs with the largest rem[i];
/// ties go to the lower VT id. O(leftover * max_vts); leftover is below the live VT count.
RECCL_HOST_DEVICE constexpr void give_leftover(std::uint64_t* q, std::uint64_t const* rem, std::uint32_t mask,
                                               std::uint64_t leftover) {
  std::uint32_t taken = 0;
  for (; leftover > 0; --leftover) {
    int best = -1;
    for (int i = 0; i < max_vts; ++i) {
      if (!((mask >> i) & 1u) || ((taken >> i) & 1u)) continue;
      if (best < 0 || rem[i] > rem[best]) best = i;  // strict '>': ties stay with the lower id
    }
    if (best < 0) {  // only for inconsistent inputs (leftover >= live VTs): start another round
      if (taken == 0) return;
      taken = 0;
      ++leftover;
      continue;
    }
    q[best] += 1;
    taken |= 1u << best;
  }
}

/// Splits `target` Q30 units over the VTs in `mask` in proportion to raw[i] (any scale, 0 allowed),
/// exactly (sum == target), by floor division plus largest remainder. All raw zero: equal parts.
/// Writes out[i] for i in mask only.
RECCL_HOST_DEVICE constexpr void distribute(std::uint64_t const* raw, std::uint32_t mask, std::uint64_t target,
                                            std::uint32_t* out) {
  // Scale raw down so the largest is below 2^32: then raw * target (target <= 2^31) fits in 64 bits.
  std::uint64_t hi = 0;
  for (int i = 0; i < max_vts; ++i)
    if ((mask >> i) & 1u && raw[i] > hi) hi = raw[i];
  int shift = 0;
  while ((hi >> shift) >= (std::uint64_t{1} << 32)) ++shift;
  std::uint64_t r[max_vts] = {}, sum = 0;
  for (int i = 0; i < max_vts; ++i)
    if ((mask >> i) & 1u) sum += (r[i] = raw[i] >> shift);
  if (sum == 0) {
    for (int i = 0; i < max_vts; ++i)
      if ((mask >> i) & 1u) sum += (r[i] = 1);
  }
  std::uint64_t q[max_vts] = {}, rem[max_vts] = {}, given = 0;
  for (int i = 0; i < max_vts; ++i) {
    if (!((mask >> i) & 1u)) continue;
    q[i] = r[i] * target / sum;
    rem[i] = r[i] * target % sum;
    given += q[i];
  }
  give_leftover(q, rem, mask, target - given);
  for (int i = 0; i < max_vts; ++i)
    if ((mask >> i) & 1u) out[i] = static_cast<std::uint32_t>(q[i]);
}

/// Raises every share in `mask` below `floor` to `floor`, taking the difference from the others in
/// `mask` in proportion to their excess above `floor`: the sum over `mask` stays exact, VTs outside
/// `mask` are untouched, and nobody in `mask` drops below the floor. A floor above the mask's sum
/// divided by its VT count is lowered to that.
RECCL_HOST_DEVICE constexpr void apply_floor(std::uint32_t* w, std::uint32_t mask, std::uint32_t floor) {
  int n = 0;
  std::uint64_t total = 0;
  for (int i = 0; i < max_vts; ++i)
    if ((mask >> i) & 1u) ++n, total += w[i];
  if (n == 0) return;
  if (static_cast<std::uint64_t>(floor) * n > total) floor = static_cast<std::uint32_t>(total / n);
  std::uint64_t deficit = 0, excess[max_vts] = {}, excess_total = 0;
  std::uint32_t donors = 0;
  for (int i = 0; i < max_vts; ++i) {
    if (!((mask >> i) & 1u)) continue;
    if (w[i] < floor) {
      deficit += floor - w[i];
    } else {
      donors |= 1u << i;
      excess_total += (excess[i] = w[i] - floor);
    }
  }
  if (deficit == 0) return;
  // Donors keep floor plus their excess scaled down to excess_total - deficit.
  std::uint32_t kept[max_vts] = {};
  distribute(excess, donors, excess_total - deficit, kept);
  for (int i = 0; i < max_vts; ++i)
    if ((mask >> i) & 1u) w[i] = ((donors >> i) & 1u) ? floor + kept[i] : floor;
}

/// Normalizes the estimated times of the VTs in `mask` so that the largest becomes 2^20, keeping
/// ratios (floor division); 0 (no estimate) stays 0. Returns the scaled times through `t`.
RECCL_HOST_DEVICE constexpr void normalize_times(std::uint64_t const* time, std::uint32_t mask, std::uint64_t* t) {
  std::uint64_t hi = 0;
  for (int i = 0; i < max_vts; ++i)
    if ((mask >> i) & 1u && time[i] > hi) hi = time[i];
  int shift = 0;  // keep time << 20 below 2^63
  while ((hi >> shift) >= (std::uint64_t{1} << 43)) ++shift;
  std::uint64_t const top = hi >> shift;
  for (int i = 0; i < max_vts; ++i) {
    t[i] = 0;
    if (!((mask >> i) & 1u) || time[i] == 0 || top == 0) continue;
    std::uint64_t const v = ((time[i] >> shift) << 20) / top;
    t[i] = v == 0 ? 1 : v;  // a real but tiny time stays an estimate, not "none"
  }
}

/// VTs that are live in `s` and have an estimate (time > 0) in `o`.
RECCL_HOST_DEVICE constexpr std::uint32_t estimated(shares const& s, vt_observation const& o) {
  std::uint32_t m = 0;
  for (int i = 0; i < max_vts; ++i)
    if (((s.live_mask >> i) & 1u) && o.time[i] > 0) m |= 1u << i;
  return m;
}

}  // namespace detail

/// Equal shares over the live VTs (NCCL's split): share_one / live each, the remainder one unit
/// each to the lowest live ids. Bits of `live_mask` at or above n_vts are ignored. Invalid n_vts
/// or no live VT gives a `shares` that check() rejects (all zero).
RECCL_HOST_DEVICE constexpr shares equal_shares(int n_vts, std::uint32_t live_mask) {
  shares s{};
  if (n_vts < 1 || n_vts > max_vts) return s;
  s.n_vts = n_vts;
  s.live_mask = live_mask & all_live(n_vts);
  std::uint64_t one[max_vts] = {};
  for (int i = 0; i < max_vts; ++i) one[i] = 1;
  if (s.live_mask != 0) detail::distribute(one, s.live_mask, share_one, s.w);
  return s;
}

/// Moves `s` to a new live mask. VTs that leave give their share to the VTs that stay, in
/// proportion to what those hold; VTs that join get `join_share` each (at most half of share_one
/// in all), taken from the staying VTs in proportion. If no VT stays, the new live VTs get equal
/// shares. Exact: live shares still sum to share_one. Invalid `s` or an empty mask: as equal_shares.
RECCL_HOST_DEVICE constexpr shares remask(shares const& s, std::uint32_t live_mask, std::uint32_t join_share) {
  live_mask &= all_live(s.n_vts);
  std::uint32_t const stay = s.live_mask & live_mask, join = live_mask & ~s.live_mask;
  if (check(s) != status::ok || stay == 0) return equal_shares(s.n_vts, live_mask);
  if (stay == s.live_mask && join == 0) return s;
  int n_join = 0;
  for (int i = 0; i < max_vts; ++i) n_join += (join >> i) & 1u;
  if (n_join > 0 && join_share > share_one / 2 / n_join) join_share = share_one / 2 / n_join;
  shares out{};
  out.n_vts = s.n_vts;
  out.live_mask = live_mask;
  std::uint64_t raw[max_vts] = {};
  for (int i = 0; i < max_vts; ++i) raw[i] = s.w[i];
  detail::distribute(raw, stay, share_one - static_cast<std::uint64_t>(join_share) * n_join, out.w);
  for (int i = 0; i < max_vts; ++i)
    if ((join >> i) & 1u) out.w[i] = join_share;
  return out;
}

/// The split of `total` elements that `s` describes. Each live VT but the last gets a whole number
/// of `granule`s, rounded by largest remainder (ties to the lower VT id), so every block boundary
/// is granule-aligned; the last live VT also takes total % granule. Masked VTs get 0 and the counts
/// sum to exactly `total`. Invalid input (check(s) fails, granule == 0) gives a split with
/// n_vts == 0, which no engine accepts.
RECCL_HOST_DEVICE constexpr split to_split(shares const& s, std::uint64_t total, std::uint64_t granule) {
  split out{};
  if (check(s) != status::ok || granule == 0) return out;
  out.n_vts = s.n_vts;
  out.live_mask = s.live_mask;
  out.total = total;
  std::uint64_t const granules = total / granule;
  // w * granules / 2^30 without 128-bit products: granules = hi * 2^30 + lo.
  std::uint64_t const hi = granules >> 30, lo = granules & (share_one - 1);
  std::uint64_t q[max_vts] = {}, rem[max_vts] = {}, given = 0;
  int last = 0;
  for (int i = 0; i < s.n_vts; ++i) {
    if (!((s.live_mask >> i) & 1u)) continue;
    std::uint64_t const low = s.w[i] * lo;  // < 2^61
    q[i] = s.w[i] * hi + (low >> 30);
    rem[i] = low & (share_one - 1);
    given += q[i];
    last = i;
  }
  detail::give_leftover(q, rem, s.live_mask, granules - given);
  for (int i = 0; i < s.n_vts; ++i) out.count[i] = q[i] * granule;
  out.count[last] += total % granule;
  return out;
}

namespace detail {
/// The shares an allocator starts its update from: `prev` moved onto the observation's live mask
/// (remask, joining VTs get `join_share`), or equal shares when `prev` is invalid or describes a
/// different VT count (a new communicator shape starts over).
RECCL_HOST_DEVICE constexpr shares start_from(shares const& prev, vt_observation const& o, std::uint32_t join_share) {
  if (check(prev) != status::ok || prev.n_vts != o.n_vts) return equal_shares(o.n_vts, o.live_mask);
  return remask(prev, o.live_mask, join_share);
}
}  // namespace detail

}  // namespace reccl
