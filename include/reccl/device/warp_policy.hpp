// reccl/device/warp_policy.hpp -- the control step's heavy parts on one warp: lane i holds VT i.
//
//   serial (one thread)                      warp (32 lanes, the same bits)
//   for r: check record r                    lane r checks record r; the lowest failing lane wins
//   for r: for i: T_i = max(T_i, model(r,i)) lane i: T_i = max over r of model(r,i)
//   for i: sums, slowest, ratios, factors    lane i: its ratio and factor; sums and the slowest VT
//   largest remainder: one pick at a time      are warp reductions; lane i counts the VTs ahead of it
//
// On one thread control<A>::step is a chain of dependent 64-bit operations over up to 16 VTs and
// 8 ranks: texcp's update alone took ~15 us on an H100, the records' combine 5-18 us
// (bench/NOTES.md 56-57), and the adaptive kernels run it once per collective. Here each VT's and
// each rank's work runs on its own lane, and everything over VTs is a warp reduction (one H100:
// texcp's update 4.0 us, combine 1.3 / 2.1 us with 2 / 8 ranks). The results
// are the serial ones bit for bit (tests/device/policy_parity.test.cu), so a rank that steps on a
// warp and a rank or host that steps on one thread still compute the same split.
//
// Use: every lane of one warp (all 32, converged; 1-D blocks: the lane is threadIdx.x % 32) calls
//     ctl.step(records, nranks, &report, reccl::device::warp_exec{});
// with the same arguments and gets the same result. `records` may live in shared, global or each
// lane's local memory; lane r reads record r in full and lane i reads field i of every record.
// The four allocators of policy/allocator/ have a warp form here; others (users' own) run their
// serial update on every lane: as fast as on one thread, and still the same result everywhere.
//
// Device-only; included only by nvcc-compiled translation units.
#pragma once

#include <cstdint>
#include <type_traits>

#include "../config.hpp"
#include "../policy/allocator/aimd.hpp"
#include "../policy/allocator/allocator.hpp"
#include "../policy/allocator/equal.hpp"
#include "../policy/allocator/proportional.hpp"
#include "../policy/allocator/texcp.hpp"
#include "../policy/control.hpp"
#include "../policy/epoch.hpp"

#if !defined(__CUDACC__)
#error "reccl/device headers need a CUDA compiler (nvcc)"
#endif

namespace reccl::device {

namespace warp {

inline constexpr unsigned full_mask = 0xffffffffu;
static_assert(max_vts <= 32, "one lane per VT");

RECCL_DEVICE int lane() { return static_cast<int>(threadIdx.x & 31u); }

/// Whether this lane's VT is in `mask` (lanes >= max_vts never are: the serial loops stop there).
RECCL_DEVICE bool in(std::uint32_t mask) {
  int const i = lane();
  return i < max_vts && ((mask >> i) & 1u) != 0;
}

RECCL_DEVICE std::uint64_t sum(std::uint64_t x) {
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(full_mask, x, o);
  return x;
}

RECCL_DEVICE std::uint64_t max(std::uint64_t x) {
  for (int o = 16; o > 0; o >>= 1) {
    std::uint64_t const y = __shfl_xor_sync(full_mask, x, o);
    x = y > x ? y : x;
  }
  return x;
}

RECCL_DEVICE std::uint32_t ballot(bool p) { return __ballot_sync(full_mask, p); }

/// Every lane's copy of lane j's value, j < max_vts, written into out[j].
template <class T, class U>
RECCL_DEVICE void gather(U v, T* out) {
  RECCL_UNROLL
  for (int j = 0; j < max_vts; ++j) out[j] = static_cast<T>(__shfl_sync(full_mask, v, j));
}

/// detail::give_leftover with q and rem held one VT per lane: this lane's new q.
RECCL_DEVICE std::uint64_t give_leftover(std::uint64_t q, std::uint64_t rem, std::uint32_t mask,
                                         std::uint64_t leftover) {
  mask &= all_live(max_vts);
  if (leftover == 0 || mask == 0) return q;
  int const i = lane();
  std::uint64_t const n = static_cast<std::uint64_t>(__popc(mask));
  std::uint64_t const rounds = leftover / n, extra = leftover % n;
  std::uint64_t ahead = 0;  // VTs in mask before this one: a larger remainder, or the same and a lower id
  RECCL_UNROLL
  for (int j = 0; j < max_vts; ++j) {
    std::uint64_t const rj = __shfl_sync(full_mask, rem, j);
    ahead += ((mask >> j) & 1u) != 0 && (rj > rem || (rj == rem && j < i));
  }
  return in(mask) ? q + rounds + (ahead < extra ? 1u : 0u) : q;
}

/// detail::distribute for this lane's `raw`: its part of `target` (meaningful on lanes in mask).
RECCL_DEVICE std::uint64_t distribute(std::uint64_t raw, std::uint32_t mask, std::uint64_t target) {
  bool const mine = in(mask);
  std::uint64_t const hi = max(mine ? raw : 0);
  int shift = 0;
  while ((hi >> shift) >= (std::uint64_t{1} << 32)) ++shift;
  std::uint64_t r = mine ? raw >> shift : 0;
  std::uint64_t s = sum(r);
  if (s == 0) {
    r = mine ? 1 : 0;
    s = static_cast<std::uint64_t>(__popc(mask & all_live(max_vts)));
  }
  std::uint64_t q = 0, rem = 0;
  if (mine) {
    q = r * target / s;
    rem = r * target - q * s;
  }
  return give_leftover(q, rem, mask, target - sum(q));
}

/// detail::apply_floor for this lane's share `w`: its new share.
RECCL_DEVICE std::uint32_t apply_floor(std::uint32_t w, std::uint32_t mask, std::uint32_t floor) {
  bool const mine = in(mask);
  int const n = __popc(mask & all_live(max_vts));
  std::uint64_t const total = sum(mine ? w : 0u);
  if (n == 0) return w;
  if (static_cast<std::uint64_t>(floor) * static_cast<std::uint64_t>(n) > total)
    floor = static_cast<std::uint32_t>(total / static_cast<std::uint64_t>(n));
  bool const donor = mine && w >= floor;
  std::uint64_t const deficit = sum(mine && !donor ? floor - w : 0u);
  std::uint64_t const excess = donor ? w - floor : 0u;
  std::uint64_t const excess_total = sum(excess);
  std::uint32_t const donors = ballot(donor);
  if (deficit == 0) return w;
  std::uint64_t const kept = distribute(excess, donors, excess_total - deficit);
  return mine ? (donor ? floor + static_cast<std::uint32_t>(kept) : floor) : w;
}

/// detail::normalize_times for this lane's time: its scaled time.
RECCL_DEVICE std::uint64_t normalize_time(std::uint64_t time, std::uint32_t mask) {
  bool const mine = in(mask);
  std::uint64_t const hi = max(mine ? time : 0);
  int shift = 0;
  while ((hi >> shift) >= (std::uint64_t{1} << 43)) ++shift;
  std::uint64_t const top = hi >> shift;
  if (!mine || time == 0 || top == 0) return 0;
  std::uint64_t const v = ((time >> shift) << 20) / top;
  return v == 0 ? 1 : v;
}

/// Where the adaptive updates start, one VT per lane: `prev` moved onto the observation's live
/// mask (detail::start_from, rare work: every lane), this lane's share and normalized time, the
/// VTs with an estimate and their total share. `ok` false: `s` is what the update returns.
struct update_start {
  shares s;
  bool ok = false;
  std::uint32_t w = 0;     ///< this lane's share
  std::uint32_t est = 0;   ///< live VTs with an estimate
  bool e = false;          ///< this lane's VT is in est
  std::uint64_t t = 0;     ///< this lane's time, normalized (detail::normalize_times)
  std::uint64_t mass = 0;  ///< the shares of est, summed
};

RECCL_DEVICE update_start start_update(shares const& prev, vt_observation const& o, std::uint32_t min_share) {
  update_start u;
  u.s = reccl::detail::start_from(prev, o, min_share);
  u.ok = check(u.s) == status::ok;
  if (!u.ok) return u;
  int const i = lane();
  u.w = i < max_vts ? u.s.w[i] : 0u;
  std::uint64_t const time = i < max_vts ? o.time[i] : 0u;
  u.est = ballot(in(u.s.live_mask) && time > 0);
  u.e = in(u.est);
  u.t = normalize_time(time, u.est);
  u.mass = sum(u.e ? u.w : 0u);
  return u;
}

/// Ends an update: this lane's share `w` raised to the floor with the others', gathered into s.
RECCL_DEVICE shares finish_update(shares s, std::uint32_t w, std::uint32_t min_share) {
  gather(apply_floor(w, s.live_mask, min_share), s.w);
  return s;
}

/// allocator::texcp::update, one VT per lane.
RECCL_DEVICE shares update(allocator::texcp const& a, shares const& prev, vt_observation const& o) {
  update_start const u = start_update(prev, o, a.min_share);
  if (!u.ok) return u.s;
  int const i = lane();
  std::uint32_t w = u.w;
  std::uint32_t const est = u.est;
  bool const e = u.e;
  std::uint64_t const t = u.t, mass = u.mass;
  std::uint64_t const weighted = sum(e ? w * t : 0u);
  if (__popc(est) < 2 || mass == 0) return finish_update(u.s, w, a.min_share);
  // The slowest estimated VT, ties to the lower id (estimated VTs have t >= 1).
  std::uint64_t const t_max = max(e ? t : 0u);
  int const slowest = __ffs(ballot(e && t == t_max)) - 1;
  std::uint64_t mean = weighted / mass;
  if (mean == 0) mean = 1;
  std::int64_t const ratio = e ? static_cast<std::int64_t>((t << 16) / mean) : 0;
  bool const hold = __all_sync(full_mask, !e || (ratio <= 65536 + static_cast<std::int64_t>(a.dead_band) &&
                                                 ratio + a.dead_band >= 65536));
  if (hold) return finish_update(u.s, w, a.min_share);
  std::int64_t const step = a.eta < 131072u ? a.eta : 131072;
  std::uint64_t raw = 0;
  bool clamp = false;
  if (e) {
    std::int64_t f = 65536 + step * (65536 - ratio) / 65536;
    clamp = f < static_cast<std::int64_t>(a.min_factor);
    if (clamp) f = a.min_factor;
    if (i == slowest) f += a.epsilon;
    raw = static_cast<std::uint64_t>(w) * static_cast<std::uint64_t>(f);
  }
  std::uint32_t const clamped = ballot(clamp);
  std::uint64_t const clamped_sum = sum(clamp ? raw >> 16 : 0u);
  std::uint32_t const unclamped = est & ~clamped;
  if (clamped != 0 && unclamped != 0 && clamped_sum < mass) {
    std::uint64_t const q = distribute(raw, unclamped, mass - clamped_sum);
    if (clamp) w = static_cast<std::uint32_t>(raw >> 16);
    else if (e) w = static_cast<std::uint32_t>(q);
  } else {
    std::uint64_t const q = distribute(raw, est, mass);
    if (e) w = static_cast<std::uint32_t>(q);
  }
  return finish_update(u.s, w, a.min_share);
}

/// allocator::equal::update (equal_shares), one VT per lane.
RECCL_DEVICE shares update(allocator::equal const&, shares const&, vt_observation const& o) {
  shares s{};
  if (o.n_vts < 1 || o.n_vts > max_vts) return s;
  s.n_vts = o.n_vts;
  s.live_mask = o.live_mask & all_live(o.n_vts);
  if (s.live_mask == 0) return s;
  std::uint64_t const q = distribute(1, s.live_mask, share_one);
  gather(in(s.live_mask) ? q : 0u, s.w);
  return s;
}

/// allocator::proportional::update, one VT per lane.
RECCL_DEVICE shares update(allocator::proportional const& a, shares const& prev, vt_observation const& o) {
  update_start const u = start_update(prev, o, a.min_share);
  if (!u.ok) return u.s;
  std::uint32_t w = u.w;
  std::uint64_t const raw = u.e ? (static_cast<std::uint64_t>(w) << 20) / u.t : 0u;  // t >= 1 on estimated VTs
  if (u.est != 0) {
    std::uint64_t const q = distribute(raw, u.est, u.mass);
    if (u.e) w = static_cast<std::uint32_t>(q);
  }
  return finish_update(u.s, w, a.min_share);
}

/// allocator::aimd::update, one VT per lane.
RECCL_DEVICE shares update(allocator::aimd const& a, shares const& prev, vt_observation const& o) {
  update_start const u = start_update(prev, o, a.min_share);
  if (!u.ok) return u.s;
  std::uint32_t w = u.w;
  std::uint64_t const weighted = sum(u.e ? w * u.t : 0u);
  if (u.mass == 0) return finish_update(u.s, w, a.min_share);
  std::uint64_t const mean = weighted / u.mass;
  std::uint64_t const limit = mean * (65536 + static_cast<std::uint64_t>(a.tolerance));
  std::uint64_t raw = 0;
  if (u.e) {
    bool const congested = (u.t << 16) > limit;
    raw = congested ? static_cast<std::uint64_t>(w) * a.decrease >> 16 : static_cast<std::uint64_t>(w) + a.increase;
  }
  std::uint64_t const q = distribute(raw, u.est, u.mass);
  if (u.e) w = static_cast<std::uint32_t>(q);
  return finish_update(u.s, w, a.min_share);
}

/// reccl::combine, one rank per lane for the checks and one VT per lane for the estimates.
RECCL_DEVICE epoch_summary combine(epoch_record const* records, int nranks, epoch_expect const& expect,
                                   telemetry::cost_model_q const& model) {
  epoch_summary s = start_summary(records, nranks, expect);
  if (s.st != status::ok) return s;
  int const me = lane();
  std::uint32_t fault = 0, probe_ok = ~0u;
  for (int base = 0; base < nranks; base += 32) {
    int const r = base + me;
    record_check bad = record_check::none;
    if (r < nranks) {
      bad = check_record(records[r], r, expect);
      fault |= records[r].fault_mask;
      probe_ok &= records[r].probe_ok_mask;
    }
    std::uint32_t const failing = ballot(bad != record_check::none);
    if (failing != 0) {  // the lowest failing rank, as the serial loop finds it first
      int const src = __ffs(failing) - 1;
      s.st = status::mismatch;
      s.rank = base + src;
      s.failed = static_cast<record_check>(__shfl_sync(full_mask, static_cast<int>(bad), src));
      return s;
    }
  }
  int const n = expect.n_vts;
  s.fault_mask = __reduce_or_sync(full_mask, fault) & all_live(n);
  s.probe_ok_mask = __reduce_and_sync(full_mask, probe_ok) & all_live(n);
  std::uint64_t stalls = 0, bytes = 0, time = 0;
  int slowest = me < n ? -1 : 0;  // the serial summary leaves VTs >= n at 0
  if (me < n) {
    for (int r = 0; r < nranks; ++r) {
      std::uint64_t const st = records[r].stalls[me], by = records[r].bytes[me];
      stalls += st;
      bytes += by;
      if (by == 0 && st == 0) continue;  // this rank had no part in the VT
      std::uint64_t const t = model.eval(st, by);
      if (slowest < 0 || t > time) {
        time = t;
        slowest = r;
      }
    }
    if (bytes == 0) time = 0;  // stalls without bytes: no estimate of the VT's speed
  }
  gather(stalls, s.stalls);
  gather(bytes, s.bytes);
  gather(time, s.time);
  gather(slowest, s.slowest_rank);
  return s;
}

}  // namespace warp

/// control<A>::step's executor for one warp (see the file comment): the records' combine and the
/// allocator's update spread over the lanes. Every lane must call step with it, converged.
/// Memory: reads its arguments only; no shared memory, no fences (lanes exchange through shuffles).
struct warp_exec {
  RECCL_DEVICE epoch_summary combine(epoch_record const* records, int nranks, epoch_expect const& expect,
                                     telemetry::cost_model_q const& model) const {
    return warp::combine(records, nranks, expect, model);
  }
  template <Allocator A>
  RECCL_DEVICE shares update(A const& a, shares const& s, vt_observation const& o) const {
    if constexpr (std::is_same_v<A, allocator::texcp> || std::is_same_v<A, allocator::equal> ||
                  std::is_same_v<A, allocator::proportional> || std::is_same_v<A, allocator::aimd>)
      return warp::update(a, s, o);
    else
      return a.update(s, o);
  }
};

}  // namespace reccl::device
