// Allocators: shares, to_split rounding, remask, and the convergence of TeXCP (what README.md and
// texcp.hpp state: exact totals, masked VTs at zero, over 520 cases the collective time within 5% of
// T* and the shares within 10% of B_i/ΣB in at most 4 steps, once there always there, no VT that
// starts above its optimum below 0.87 of it, identical splits on every rank).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <reccl/policy/allocator/aimd.hpp>
#include <reccl/policy/allocator/equal.hpp>
#include <reccl/policy/allocator/fixed.hpp>
#include <reccl/policy/allocator/proportional.hpp>
#include <reccl/policy/allocator/texcp.hpp>

using namespace reccl;

static_assert(Allocator<allocator::equal>);
static_assert(Allocator<allocator::fixed>);
static_assert(Allocator<allocator::proportional>);
static_assert(Allocator<allocator::texcp>);
static_assert(Allocator<allocator::aimd>);

// The documented defaults, spelled as the values they encode.
static_assert(allocator::texcp{}.eta == q16(0.75) && allocator::texcp{}.min_factor == q16(0.5) &&
              allocator::texcp{}.epsilon == q16(1.0 / 1024) && allocator::texcp{}.min_share == share_one / 1024);
static_assert(allocator::aimd{}.decrease == q16(0.5) && allocator::aimd{}.tolerance == q16(0.05) &&
              allocator::aimd{}.increase == share_one / 32);
static_assert(q16(-1) == 0 && q16(1e9) == 0xffffffffu);

namespace {

constexpr double one = static_cast<double>(share_one);

/// Random valid shares over `mask` (random weights, then exact normalization).
shares random_shares(std::mt19937_64& rng, int n, std::uint32_t mask) {
  std::uint64_t raw[max_vts] = {};
  std::uniform_int_distribution<std::uint64_t> d(1, 1u << 20);
  for (int i = 0; i < n; ++i) raw[i] = d(rng);
  shares s{};
  s.n_vts = n;
  s.live_mask = mask;
  detail::distribute(raw, mask, share_one, s.w);
  return s;
}

bool same(shares const& a, shares const& b) {
  return a.n_vts == b.n_vts && a.live_mask == b.live_mask && std::equal(a.w, a.w + max_vts, b.w);
}

std::uint32_t random_mask(std::mt19937_64& rng, int n) {
  std::uint32_t m = 0;
  while (m == 0) m = static_cast<std::uint32_t>(rng()) & all_live(n);
  return m;
}

/// Reference for to_split, with 128-bit products: floor(w * G / 2^30) plus largest remainder, ties
/// to the lower id, remainder of total % granule on the last live VT.
split reference_split(shares const& s, std::uint64_t total, std::uint64_t granule) {
  split out{};
  out.n_vts = s.n_vts;
  out.live_mask = s.live_mask;
  out.total = total;
  unsigned __int128 const g = total / granule;
  std::vector<std::pair<unsigned __int128, int>> rems;
  std::uint64_t given = 0;
  int last = -1;
  for (int i = 0; i < s.n_vts; ++i) {
    if (!((s.live_mask >> i) & 1u)) continue;
    unsigned __int128 const p = g * s.w[i];
    out.count[i] = static_cast<std::uint64_t>(p >> 30);
    given += out.count[i];
    rems.push_back({p & (share_one - 1), i});
    last = i;
  }
  std::stable_sort(rems.begin(), rems.end(), [](auto const& a, auto const& b) { return a.first > b.first; });
  for (std::uint64_t k = 0; k < static_cast<std::uint64_t>(g) - given; ++k) out.count[rems[k].second] += 1;
  for (int i = 0; i < s.n_vts; ++i) out.count[i] *= granule;
  out.count[last] += total % granule;
  return out;
}

}  // namespace

TEST_CASE("equal_shares: exact sum, masked VTs zero, remainder to the lowest live ids") {
  for (int n = 1; n <= max_vts; ++n) {
    for (std::uint32_t mask : {all_live(n), all_live(n) & 0xaaaau, all_live(n) & 0x5555u, 1u << (n - 1)}) {
      if (mask == 0) continue;
      shares const s = equal_shares(n, mask);
      REQUIRE(check(s) == status::ok);
      int live = __builtin_popcount(mask);
      std::uint32_t const base = share_one / live, extra = share_one % live;
      std::uint32_t seen = 0;
      for (int i = 0; i < max_vts; ++i) {
        if (!((mask >> i) & 1u)) {
          CHECK(s.w[i] == 0);
          continue;
        }
        CHECK(s.w[i] == base + (seen < extra ? 1u : 0u));
        ++seen;
      }
    }
  }
  CHECK(check(equal_shares(0, 1)) == status::invalid_argument);
  CHECK(check(equal_shares(max_vts + 1, 1)) == status::invalid_argument);
  CHECK(check(equal_shares(4, 0)) == status::invalid_argument);
  CHECK(equal_shares(3, 0xffu).live_mask == 7u);  // bits at or above n_vts are ignored
}

TEST_CASE("check rejects malformed shares") {
  shares s = equal_shares(4, 0xf);
  REQUIRE(check(s) == status::ok);
  shares a = s;
  a.w[0] += 1;
  CHECK(check(a) == status::invalid_argument);  // sum off by one
  shares b = s;
  b.live_mask = 0x7;
  CHECK(check(b) == status::invalid_argument);  // masked VT holding a share
  shares c = s;
  c.live_mask |= 1u << 5;
  CHECK(check(c) == status::invalid_argument);  // live bit beyond n_vts
  shares d = s;
  d.n_vts = max_vts + 1;
  CHECK(check(d) == status::invalid_argument);
}

TEST_CASE("to_split matches a 128-bit reference on random shares, totals and granules") {
  std::mt19937_64 rng(12345);
  std::uint64_t const granules[] = {1, 3, 64, 4096, 1u << 20};
  int checked = 0;
  for (int trial = 0; trial < 4000; ++trial) {
    int const n = 1 + static_cast<int>(rng() % max_vts);
    std::uint32_t const mask = random_mask(rng, n);
    shares const s = random_shares(rng, n, mask);
    REQUIRE(check(s) == status::ok);
    std::uint64_t const granule = granules[rng() % 5];
    std::uint64_t total = 0;
    switch (trial % 4) {
      case 0: total = rng() % 1000; break;                    // often below one granule
      case 1: total = rng() % (std::uint64_t{1} << 32); break;
      case 2: total = rng() >> 8; break;                      // up to 2^56: exercises the split multiply
      case 3: total = rng(); break;                           // up to 2^64
    }
    split const sp = to_split(s, total, granule);
    split const ref = reference_split(s, total, granule);
    REQUIRE(sp.n_vts == n);
    CHECK(sp.sum() == total);
    CHECK(sp == ref);
    int last = 31 - __builtin_clz(mask);
    for (int i = 0; i < n; ++i) {
      if (!((mask >> i) & 1u)) CHECK(sp.count[i] == 0);
      if (i != last) CHECK(sp.count[i] % granule == 0);
      if (i <= last) CHECK(sp.offset(i) % granule == 0);  // every block starts on a granule
    }
    ++checked;
  }
  CHECK(checked == 4000);
}

TEST_CASE("to_split: rounding ties go to the lower VT id, the last live VT takes the remainder") {
  shares const s = equal_shares(3, 0x7);  // 357913942, 357913941, 357913941
  split const sp = to_split(s, 4 * 10 + 7, 10);
  // 4 granules over 3 equal-ish shares: 1 each plus a leftover granule; VT0 has the largest remainder
  CHECK(sp.count[0] == 20);
  CHECK(sp.count[1] == 10);
  CHECK(sp.count[2] == 17);
  shares const t = equal_shares(4, 0b0110);  // exact halves: the leftover tie goes to VT1
  split const tp = to_split(t, 3 * 8, 8);
  CHECK(tp.count[0] == 0);
  CHECK(tp.count[1] == 16);
  CHECK(tp.count[2] == 8);
  CHECK(tp.count[3] == 0);
}

TEST_CASE("largest-remainder rounding: one pick at a time, a new round once every live VT is served") {
  // The rule give_leftover implements (and device::warp's counted form, checked against it in
  // tests/device/policy_parity.test.cu), written the plain way: `leftover` times, +1 to the live VT
  // with the largest remainder not yet served (ties: the lower id); all served: a new round.
  auto reference = [](std::uint64_t* q, std::uint64_t const* rem, std::uint32_t mask, std::uint64_t leftover) {
    std::uint32_t taken = 0;
    mask &= all_live(max_vts);
    if (mask == 0) return;
    while (leftover > 0) {
      int best = -1;
      for (int i = 0; i < max_vts; ++i)
        if (((mask >> i) & 1u) && !((taken >> i) & 1u) && (best < 0 || rem[i] > rem[best])) best = i;
      if (best < 0) {
        taken = 0;
        continue;
      }
      ++q[best];
      taken |= 1u << best;
      --leftover;
    }
  };
  std::mt19937_64 rng(7);
  int checked = 0;
  for (int k = 0; k < 20000; ++k) {
    std::uint32_t const mask = static_cast<std::uint32_t>(rng()) & all_live(max_vts);
    std::uint64_t rem[max_vts], q0[max_vts], q1[max_vts];
    std::uint64_t const range = k % 3 == 0 ? 3 : (k % 3 == 1 ? 1000 : ~0ull);  // many ties, some, few
    for (int i = 0; i < max_vts; ++i) {
      rem[i] = range == ~0ull ? rng() : rng() % range;
      q0[i] = q1[i] = rng() % 100;
    }
    std::uint64_t const leftover = k % 5 == 0 ? rng() % 40 : rng() % (max_vts + 1);  // also >= the live count
    detail::give_leftover(q0, rem, mask, leftover);
    reference(q1, rem, mask, leftover);
    bool same = true;
    for (int i = 0; i < max_vts; ++i) same = same && q0[i] == q1[i];
    CHECK_MESSAGE(same, "mask " << mask << " leftover " << leftover);
    ++checked;
  }
  CHECK(checked == 20000);
}

TEST_CASE("to_split rejects bad input with an empty split") {
  shares bad = equal_shares(4, 0xf);
  bad.w[1] -= 5;
  CHECK(to_split(bad, 1000, 1).n_vts == 0);
  CHECK(to_split(equal_shares(4, 0xf), 1000, 0).n_vts == 0);
  CHECK(to_split(shares{}, 1000, 1).n_vts == 0);
  split const z = to_split(equal_shares(4, 0xf), 0, 64);
  CHECK(z.n_vts == 4);
  CHECK(z.sum() == 0);
}

TEST_CASE("remask spreads a leaving VT's share in proportion and gives a joining VT its share") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 500; ++trial) {
    int const n = 2 + static_cast<int>(rng() % (max_vts - 1));
    std::uint32_t const mask = random_mask(rng, n);
    shares const s = random_shares(rng, n, mask);
    std::uint32_t const next = random_mask(rng, n);
    std::uint32_t const join_share = share_one >> 6;
    shares const r = remask(s, next, join_share);
    REQUIRE(check(r) == status::ok);
    CHECK(r.live_mask == next);
    std::uint32_t const stay = mask & next, join = next & ~mask;
    if (stay == 0) {
      CHECK(same(r, equal_shares(n, next)));
      continue;
    }
    int const n_join = __builtin_popcount(join);
    std::uint32_t const js = std::min<std::uint32_t>(join_share, share_one / 2 / std::max(n_join, 1));
    double stay_sum = 0;
    for (int i = 0; i < n; ++i)
      if ((stay >> i) & 1u) stay_sum += s.w[i];
    for (int i = 0; i < n; ++i) {
      if ((join >> i) & 1u) CHECK(r.w[i] == js);
      if ((stay >> i) & 1u) {  // proportional to the old share, within rounding
        double const want = s.w[i] / stay_sum * (one - static_cast<double>(js) * n_join);
        CHECK(std::fabs(r.w[i] - want) <= 2.0 + want * 1e-9);
      }
    }
  }
}

// ---- convergence sweep -------------------------------------------------------------------------------

namespace {

struct scenario {
  std::string name;
  std::vector<double> bw;  // bytes per ns of each VT
  std::uint32_t mask;
};

std::vector<scenario> scenarios(int n, double kappa, std::mt19937_64& rng) {
  std::vector<scenario> out;
  auto add = [&](std::string name, std::vector<double> bw) {
    out.push_back({name, bw, all_live(n)});
    if (n >= 3) out.push_back({name + "+mask1", bw, all_live(n) & ~2u});  // VT1 masked throughout
  };
  std::vector<double> b(n, kappa);
  b[0] = 1;
  add("one_slow_first", b);
  b.assign(n, kappa);
  b[n - 1] = 1;
  add("one_slow_last", b);
  b.assign(n, 1);
  b[0] = kappa;
  add("one_fast", b);
  for (int i = 0; i < n; ++i) b[i] = 1 + (kappa - 1) * i / (n - 1);
  add("linear", b);
  std::uniform_real_distribution<double> u(1, kappa);
  for (int k = 0; k < 4; ++k) {
    for (int i = 0; i < n; ++i) b[i] = u(rng);
    b[rng() % n] = 1;  // span exactly [1, kappa]
    int j = static_cast<int>(rng() % n);
    if (b[j] == 1) j = (j + 1) % n;
    b[j] = kappa;
    add("random" + std::to_string(k), b);
  }
  return out;
}

constexpr std::uint64_t total_elems = 64ull << 20;  // 256 MB of 4-byte elements
constexpr std::uint64_t granule = 256;
constexpr std::uint64_t elem_bytes = 4;

/// Per-VT times of a split on VTs of bandwidth bw (ns), optionally with multiplicative noise.
vt_observation observe(split const& sp, std::vector<double> const& bw, std::mt19937_64* noise_rng) {
  vt_observation o{};
  o.n_vts = sp.n_vts;
  o.live_mask = sp.live_mask;
  std::uniform_real_distribution<double> u(-0.05, 0.05);
  for (int i = 0; i < sp.n_vts; ++i) {
    if (!sp.live(i)) continue;
    double t = static_cast<double>(sp.count[i] * elem_bytes) / bw[i];
    if (noise_rng) t *= 1 + u(*noise_rng);
    o.time[i] = static_cast<std::uint64_t>(t);
  }
  return o;
}

struct quality {
  double time_ratio;   // max over live VTs of D_i/B_i, over T* = D / ΣB
  double share_error;  // max over live VTs of |w_i - b_i| / b_i
};

quality measure(shares const& s, split const& sp, scenario const& sc) {
  double sum_bw = 0, tmax = 0, err = 0;
  for (int i = 0; i < s.n_vts; ++i)
    if ((sc.mask >> i) & 1u) sum_bw += sc.bw[i];
  for (int i = 0; i < s.n_vts; ++i) {
    if (!((sc.mask >> i) & 1u)) continue;
    tmax = std::max(tmax, static_cast<double>(sp.count[i] * elem_bytes) / sc.bw[i]);
    double const b = sc.bw[i] / sum_bw;
    err = std::max(err, std::fabs(s.w[i] / one - b) / b);
  }
  double const tstar = static_cast<double>(total_elems * elem_bytes) / sum_bw;
  return {tmax / tstar, err};
}

}  // namespace

TEST_CASE("texcp converges from the equal split for kappa <= 4 and 2..8 VTs, without oscillation") {
  allocator::texcp const alloc{};
  std::mt19937_64 rng(2024);
  int worst_time_steps = 0, worst_share_steps = 0, cases = 0;
  std::string worst_time_case, worst_share_case;
  double worst_dip = 10;  // smallest share / optimal share of a VT that started above its optimum
  for (int n = 2; n <= 8; ++n) {
    for (double kappa : {1.25, 1.5, 2.0, 3.0, 4.0}) {
      for (scenario const& sc : scenarios(n, kappa, rng)) {
        CAPTURE(n);
        CAPTURE(kappa);
        CAPTURE(sc.name);
        ++cases;
        shares s = equal_shares(n, sc.mask);
        shares other_rank = s;  // a second rank's copy, fed the same observations
        int time_steps = -1, share_steps = -1;
        double sum_bw = 0;
        for (int i = 0; i < n; ++i)
          if ((sc.mask >> i) & 1u) sum_bw += sc.bw[i];
        for (int step = 0; step <= 40; ++step) {
          split const sp = to_split(s, total_elems, granule);
          REQUIRE(sp.sum() == total_elems);
          for (int i = 0; i < n; ++i)
            if (!((sc.mask >> i) & 1u)) REQUIRE(sp.count[i] == 0);
          REQUIRE(to_split(other_rank, total_elems, granule) == sp);
          quality const q = measure(s, sp, sc);
          if (time_steps < 0 && q.time_ratio <= 1.05) time_steps = step;
          if (share_steps < 0 && q.share_error <= 0.10) share_steps = step;
          for (int i = 0; i < n; ++i)
            if (((sc.mask >> i) & 1u) && 1.0 / __builtin_popcount(sc.mask) > sc.bw[i] / sum_bw)
              worst_dip = std::min(worst_dip, s.w[i] / one / (sc.bw[i] / sum_bw));
          if (time_steps >= 0) REQUIRE(q.time_ratio <= 1.05);  // once within a bound, never out of it again
          if (share_steps >= 0) REQUIRE(q.share_error <= 0.10);
          vt_observation const o = observe(sp, sc.bw, nullptr);
          shares const next = alloc.update(s, o);
          REQUIRE(check(next) == status::ok);
          if (step >= 20)  // converged: still
            for (int i = 0; i < n; ++i) REQUIRE(std::abs(static_cast<double>(next.w[i]) - s.w[i]) <= one * 1e-3);
          other_rank = alloc.update(other_rank, o);
          s = next;
        }
        REQUIRE(time_steps >= 0);
        REQUIRE(share_steps >= 0);
        CHECK(time_steps <= 4);
        CHECK(share_steps <= 4);
        if (time_steps > worst_time_steps) worst_time_steps = time_steps, worst_time_case = sc.name;
        if (share_steps > worst_share_steps) worst_share_steps = share_steps, worst_share_case = sc.name;
      }
    }
  }
  MESSAGE("texcp (eta=3/4, min_factor=1/2, eps=1/1024) over " << cases << " cases: time within 5% of T* after <= "
                                                                << worst_time_steps << " steps (" << worst_time_case
                                                                << "), shares within 10% after <= " << worst_share_steps
                                                                << " steps (" << worst_share_case
                                                                << "); smallest share/optimal on the way: " << worst_dip);
  CHECK(cases == 520);
  CHECK(worst_dip >= 0.87);  // the clamp keeps a VT from overshooting far below its optimum
}

TEST_CASE("texcp under +-5% noise: the slow VT's share is steady after convergence") {
  allocator::texcp const alloc{};
  std::mt19937_64 rng(99), noise(4242);
  double worst = 0;
  std::string worst_case;
  for (int n = 2; n <= 8; ++n) {
    for (double kappa : {1.5, 2.0, 4.0}) {
      for (scenario const& sc : scenarios(n, kappa, rng)) {
        CAPTURE(n);
        CAPTURE(kappa);
        CAPTURE(sc.name);
        int slow = -1;
        for (int i = 0; i < n; ++i)
          if (((sc.mask >> i) & 1u) && (slow < 0 || sc.bw[i] < sc.bw[slow])) slow = i;
        shares s = equal_shares(n, sc.mask);
        std::vector<double> tail;
        for (int step = 0; step < 30; ++step) {
          split const sp = to_split(s, total_elems, granule);
          REQUIRE(sp.sum() == total_elems);
          if (step >= 10) tail.push_back(s.w[slow] / one);
          s = alloc.update(s, observe(sp, sc.bw, &noise));
        }
        double mean = 0, var = 0;
        for (double x : tail) mean += x;
        mean /= static_cast<double>(tail.size());
        for (double x : tail) var += (x - mean) * (x - mean);
        double const cv = std::sqrt(var / static_cast<double>(tail.size())) / mean;
        CHECK(cv < 0.035);  // texcp.hpp: 3.0-3.5% at eta = 3/4
        if (cv > worst) worst = cv, worst_case = sc.name + " n=" + std::to_string(n) + " kappa=" + std::to_string(kappa);
      }
    }
  }
  MESSAGE("texcp with +-5% noise: worst std/mean of the slow VT's share over 20 steps = " << worst << " ("
                                                                                          << worst_case << ")");
}

TEST_CASE("texcp: the raw rule's trap is closed and a VT at the floor comes back") {
  // The raw rule with eta = 0.8 takes a VT 2.9x slower than the mean to a negative share.
  // Clamped, the slow VT loses at most half per step and never drops below the floor.
  allocator::texcp a{};
  a.eta = q16(0.8);
  int const n = 8;
  std::vector<double> bw(n, 4.0);
  bw[0] = 1;
  shares s = equal_shares(n, all_live(n));
  for (int step = 0; step < 10; ++step) {
    shares const next = a.update(s, observe(to_split(s, total_elems, granule), bw, nullptr));
    CHECK(next.w[0] * 2 + 2 >= s.w[0]);
    CHECK(next.w[0] >= a.min_share);
    s = next;
  }
  CHECK(std::fabs(s.w[0] / one - 1.0 / 29) < 0.1 / 29);

  // A VT held at the floor becomes the fastest: it grows back to its optimal share.
  shares low = equal_shares(4, 0xf);
  std::uint64_t raw[max_vts] = {1, 1000, 1000, 1000};
  detail::distribute(raw, 0xf, share_one, low.w);
  detail::apply_floor(low.w, low.live_mask, a.min_share);
  CHECK(low.w[0] == a.min_share);
  std::vector<double> fast0{4, 1, 1, 1};
  int steps = 0;
  while (std::fabs(low.w[0] / one - 4.0 / 7) > 0.1 * 4.0 / 7 && steps < 50) {
    low = a.update(low, observe(to_split(low, total_elems, granule), fast0, nullptr));
    ++steps;
  }
  MESSAGE("a VT at the floor share (1/1024) whose path became the fastest reached 10% of its optimal share in "
          << steps << " steps");
  CHECK(steps <= 12);
}

TEST_CASE("texcp: VTs without an estimate keep their share, the floor holds, identical calls agree") {
  allocator::texcp const a{};
  std::mt19937_64 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    int const n = 1 + static_cast<int>(rng() % max_vts);
    std::uint32_t const mask = random_mask(rng, n);
    shares const s = random_shares(rng, n, mask);
    vt_observation o{};
    o.n_vts = n;
    o.live_mask = mask;
    for (int i = 0; i < n; ++i) o.time[i] = (rng() % 4 == 0) ? 0 : rng() >> (rng() % 60);
    shares const r1 = a.update(s, o), r2 = a.update(s, o);
    REQUIRE(check(r1) == status::ok);
    CHECK(same(r1, r2));
    int const live = __builtin_popcount(mask);
    bool lifted = false;  // some VT ended at the floor: the floor may have taken from everyone
    for (int i = 0; i < n; ++i) {
      if (!((mask >> i) & 1u)) continue;
      CHECK(r1.w[i] >= std::min<std::uint32_t>(a.min_share, share_one / live));
      lifted |= r1.w[i] <= a.min_share;
    }
    if (!lifted)
      for (int i = 0; i < n; ++i)
        if (((mask >> i) & 1u) && o.time[i] == 0) CHECK(r1.w[i] == s.w[i]);
  }
}

TEST_CASE("texcp's dead band: times within it leave the shares bit-exact, times outside it move them") {
  allocator::texcp const a{};  // dead band q16(1/64) = 1.56%
  allocator::texcp nb{};
  nb.dead_band = 0;
  std::mt19937_64 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    int const n = 2 + static_cast<int>(rng() % (max_vts - 1));
    shares const s = equal_shares(n, all_live(n));
    vt_observation o{};
    o.n_vts = n;
    o.live_mask = all_live(n);
    // healthy jitter: every time within +-1% of 100 us, so within the band around the mean
    for (int i = 0; i < n; ++i) o.time[i] = 100'000 - 1'000 + rng() % 2'001;
    o.time[static_cast<int>(rng() % n)] = 100'000 + 1'000;  // so not all times are equal
    CHECK(same(a.update(s, o), s));
    CHECK(!same(nb.update(s, o), s));  // without the band the jitter moves bytes
    // one VT 5% slower than the others: outside the band, it loses bytes
    int const slow = static_cast<int>(rng() % n);
    for (int i = 0; i < n; ++i) o.time[i] = i == slow ? 105'000 : 100'000;
    shares const m = a.update(s, o);
    CHECK(m.w[slow] < s.w[slow]);
  }
}

TEST_CASE("a VT that joins with a zero share is lifted to the floor, so it cannot stick at zero") {
  shares const s = equal_shares(4, 0b0111);
  vt_observation o{};
  o.n_vts = 4;
  o.live_mask = 0xf;
  for (int i = 0; i < 3; ++i) o.time[i] = 1000 + 100 * i;
  shares const joined = remask(s, 0xf, 0);
  REQUIRE(check(joined) == status::ok);
  CHECK(joined.w[3] == 0);
  CHECK(allocator::texcp{}.update(joined, o).w[3] == allocator::texcp{}.min_share);
  CHECK(allocator::proportional{}.update(joined, o).w[3] == allocator::proportional{}.min_share);
  CHECK(allocator::aimd{}.update(joined, o).w[3] == allocator::aimd{}.min_share);
}

TEST_CASE("texcp follows a mask change: a masked VT gets zero, a joining VT its floor share") {
  allocator::texcp const a{};
  shares s = equal_shares(4, 0xf);
  vt_observation o{};
  o.n_vts = 4;
  o.live_mask = 0b1011;  // VT2 leaves
  for (int i = 0; i < 4; ++i) o.time[i] = 1000;
  shares const r = a.update(s, o);
  REQUIRE(check(r) == status::ok);
  CHECK(r.w[2] == 0);
  o.live_mask = 0xf;  // VT2 joins, no estimate for it yet
  o.time[2] = 0;
  shares const j = a.update(r, o);
  REQUIRE(check(j) == status::ok);
  CHECK(j.w[2] == a.min_share);
  o.n_vts = 5;  // another VT count: start over from equal shares
  o.live_mask = 0x1f;
  for (int i = 0; i < 5; ++i) o.time[i] = 0;
  CHECK(same(a.update(j, o), equal_shares(5, 0x1f)));
}

TEST_CASE("proportional: one step to the bandwidth split from exact times") {
  allocator::proportional const a{};
  std::mt19937_64 rng(77);
  for (int n = 2; n <= 8; ++n) {
    for (scenario const& sc : scenarios(n, 4.0, rng)) {
      CAPTURE(sc.name);
      shares s = equal_shares(n, sc.mask);
      split sp = to_split(s, total_elems, granule);
      s = a.update(s, observe(sp, sc.bw, nullptr));
      sp = to_split(s, total_elems, granule);
      CHECK(sp.sum() == total_elems);
      quality const q = measure(s, sp, sc);
      CHECK(q.share_error < 0.001);
      CHECK(q.time_ratio < 1.001);
    }
  }
}

TEST_CASE("aimd: congested VTs are cut by the decrease factor, the others grow by the increase") {
  allocator::aimd const a{};
  std::mt19937_64 rng(31);
  for (int trial = 0; trial < 1000; ++trial) {
    int const n = 2 + static_cast<int>(rng() % (max_vts - 1));
    shares const s = random_shares(rng, n, all_live(n));
    vt_observation o{};
    o.n_vts = n;
    o.live_mask = all_live(n);
    for (int i = 0; i < n; ++i) o.time[i] = 1000 + rng() % 1000000;
    shares const r = a.update(s, o);
    REQUIRE(check(r) == status::ok);
    // Reference in double: same congestion test, same moves, then renormalize and floor.
    double tmax = 0, mean = 0;
    for (int i = 0; i < n; ++i) tmax = std::max(tmax, static_cast<double>(o.time[i]));
    for (int i = 0; i < n; ++i) mean += s.w[i] / one * std::floor(o.time[i] * 1048576.0 / tmax);
    std::vector<double> raw(n);
    double sum = 0;
    for (int i = 0; i < n; ++i) {
      double const t = std::floor(o.time[i] * 1048576.0 / tmax);
      bool const congested = t > mean * (1 + a.tolerance / 65536.0);
      raw[i] = congested ? s.w[i] * (a.decrease / 65536.0) : s.w[i] + static_cast<double>(a.increase);
      sum += raw[i];
    }
    bool any_floor = false;
    for (int i = 0; i < n; ++i) any_floor |= raw[i] / sum * one < a.min_share;
    if (any_floor) continue;  // the floor's redistribution is covered elsewhere
    for (int i = 0; i < n; ++i) CHECK(std::fabs(r.w[i] - raw[i] / sum * one) <= 1 + one * 1e-6);
  }
}

TEST_CASE("aimd keeps oscillating where texcp settles (the comparison PReCCL makes)") {
  int const n = 4;
  std::vector<double> bw{1, 3, 3, 3};
  auto swing = [&](auto alloc) {
    shares s = equal_shares(n, all_live(n));
    double lo = 1, hi = 0;
    for (int step = 0; step < 60; ++step) {
      if (step >= 30) lo = std::min(lo, s.w[0] / one), hi = std::max(hi, s.w[0] / one);
      s = alloc.update(s, observe(to_split(s, total_elems, granule), bw, nullptr));
    }
    return (hi - lo) / (1.0 / 10);  // relative to the optimal share 1/10
  };
  double const aimd_swing = swing(allocator::aimd{}), texcp_swing = swing(allocator::texcp{});
  MESSAGE("slow VT's share swing over steps 30..60 (relative to optimal): aimd " << aimd_swing << ", texcp "
                                                                                << texcp_swing);
  CHECK(aimd_swing > 0.2);
  CHECK(texcp_swing < 0.01);
}

TEST_CASE("equal allocator ignores the times and follows the mask") {
  allocator::equal const a{};
  shares s = equal_shares(4, 0xf);
  vt_observation o{};
  o.n_vts = 4;
  o.live_mask = 0b1101;
  o.time[0] = 1, o.time[1] = 100, o.time[2] = 10000, o.time[3] = 5;
  CHECK(same(a.update(s, o), equal_shares(4, 0b1101)));
}

TEST_CASE("the allocators run in constant evaluation (no UB, no host-only calls)") {
  constexpr auto run = [] {
    shares s = equal_shares(8, 0xff);
    vt_observation o{};
    o.n_vts = 8;
    o.live_mask = 0xff;
    for (int step = 0; step < 6; ++step) {
      split const sp = to_split(s, 1ull << 40, 64);
      for (int i = 0; i < 8; ++i) o.time[i] = sp.count[i] / (i == 0 ? 1 : 4) + 1;
      s = allocator::texcp{}.update(s, o);
      s = allocator::proportional{}.update(s, o);
      s = allocator::aimd{}.update(s, o);
    }
    return check(s) == status::ok && to_split(s, 1ull << 40, 64).sum() == (1ull << 40);
  };
  static_assert(run());
  CHECK(run());
}

TEST_CASE("fixed: the shares never move with the times, only with the live mask") {
  shares s{};
  s.n_vts = 4;
  s.live_mask = 0xf;
  s.w[0] = share_one / 2;
  s.w[1] = share_one / 4;
  s.w[2] = share_one / 8;
  s.w[3] = share_one / 8;
  REQUIRE(check(s) == status::ok);
  vt_observation o{};
  o.n_vts = 4;
  o.live_mask = 0xf;
  for (int i = 0; i < 4; ++i) o.time[i] = 1000u * static_cast<unsigned>(i + 1) * static_cast<unsigned>(i + 1);
  shares const kept = allocator::fixed{}.update(s, o);
  CHECK(same(kept, s));
  o.live_mask = 0xb;  // VT 2 leaves: its 1/8 goes to the others in proportion
  shares const left = allocator::fixed{}.update(s, o);
  CHECK(check(left) == status::ok);
  CHECK(left.w[2] == 0);
  CHECK(left.w[0] > s.w[0]);
  CHECK(left.w[0] <= 2 * left.w[1] + 2);  // the 1/2 : 1/4 ratio is kept (to rounding)
  CHECK(left.w[0] + 2 >= 2 * left.w[1]);
  o.live_mask = 0xf;  // and comes back with the join share
  shares const back = allocator::fixed{}.update(left, o);
  CHECK(check(back) == status::ok);
  CHECK(back.w[2] == allocator::fixed{}.join_share);
}
