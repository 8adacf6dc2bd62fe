// Epochs and the control loop: record checksums, the checks that make every rank compute the same
// split (a mismatch names the epoch and the rank), and the loop itself on a simulated communicator:
// convergence, a VT that dies (masked, its share spread), probes, rejoin, losing every VT.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <reccl/policy/allocator/equal.hpp>
#include <reccl/policy/allocator/proportional.hpp>
#include <reccl/policy/allocator/texcp.hpp>
#include <reccl/policy/control.hpp>
#include <reccl/policy/epoch.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>

using namespace reccl;
using texcp_control = control<allocator::texcp>;

static_assert(std::is_trivially_copyable_v<epoch_record>);
static_assert(std::is_trivially_copyable_v<epoch_report>);
static_assert(std::is_trivially_copyable_v<texcp_control>);
static_assert(std::is_trivially_copyable_v<control<allocator::equal>>);

namespace {

/// Independent reference of the documented checksum: the words in order, then xxHash64's tail
/// step for each and its avalanche (written with std::rotl, from the definition in epoch.hpp).
std::uint64_t reference_checksum(epoch_record const& r) {
  std::vector<std::uint64_t> words{r.epoch,
                                   static_cast<std::uint32_t>(r.rank) | std::uint64_t{static_cast<std::uint32_t>(r.n_vts)} << 32,
                                   r.fault_mask | std::uint64_t{r.probe_ok_mask} << 32, r.state_digest};
  for (int i = 0; i < r.n_vts; ++i) words.push_back(r.stalls[i]);
  for (int i = 0; i < r.n_vts; ++i) words.push_back(r.bytes[i]);
  std::uint64_t const p1 = 11400714785074694791ull, p2 = 14029467366897019727ull, p3 = 1609587929392839161ull,
                      p4 = 9650029242287828579ull, p5 = 2870177450012600261ull;
  std::uint64_t h = p5;
  for (std::uint64_t v : words) {
    h ^= std::rotl(v * p2, 31) * p1;
    h = std::rotl(h, 27) * p1 + p4;
  }
  h = (h ^ (h >> 33)) * p2;
  h = (h ^ (h >> 29)) * p3;
  return h ^ (h >> 32);
}

epoch_record random_record(std::mt19937_64& rng, int rank, int n_vts, std::uint64_t epoch, std::uint64_t digest) {
  epoch_record r{};
  r.epoch = epoch;
  r.rank = rank;
  r.n_vts = n_vts;
  r.state_digest = digest;
  for (int i = 0; i < n_vts; ++i) {
    r.stalls[i] = rng() % 100000;
    r.bytes[i] = rng() % (1ull << 32);
  }
  seal(r);
  return r;
}

bool same_shares(shares const& a, shares const& b) {
  return a.n_vts == b.n_vts && a.live_mask == b.live_mask && std::equal(a.w, a.w + max_vts, b.w);
}

/// Everything of a control state that decides the next split (a pending model that is not due yet
/// may arrive at different epochs on different ranks, so it is left out).
bool same_state(texcp_control const& a, texcp_control const& b) {
  return a.epoch == b.epoch && same_shares(a.share, b.share) && a.probe_mask == b.probe_mask &&
         a.since_probe == b.since_probe && a.current_model() == b.current_model() && a.digest() == b.digest();
}

template <class T>
bool same_array(T const (&a)[max_vts], T const (&b)[max_vts]) {
  return std::equal(a, a + max_vts, b);
}

bool same_report(epoch_report const& a, epoch_report const& b) {
  return a.epoch == b.epoch && a.st == b.st && a.n_vts == b.n_vts && a.nranks == b.nranks && a.split == b.split &&
         same_array(a.share, b.share) && same_array(a.bytes, b.bytes) && same_array(a.stalls, b.stalls) &&
         same_array(a.time_ns, b.time_ns) && same_array(a.bw_mbps, b.bw_mbps) && a.masked_mask == b.masked_mask &&
         a.fault_mask == b.fault_mask && a.probe_mask == b.probe_mask && a.rejoined_mask == b.rejoined_mask;
}

/// 1 ns per stall, nothing per byte: in the simulation below the stall count is the time in ns.
telemetry::cost_model_q stall_clock() {
  telemetry::cost_model_q m{};
  m.alpha = std::uint64_t{1} << telemetry::cost_model_q::frac_bits;
  m.beta = 0;
  m.delta = 0;
  return m;
}

/// A communicator of `nranks` ranks, each holding its own control state, over VTs of the given
/// bandwidths (bytes per ns). One call of collective() runs one epoch on every rank.
struct communicator {
  int nranks, n_vts;
  std::vector<double> bw;
  std::uint32_t dead = 0;               // VTs whose path is down
  std::uint64_t total = 16ull << 20;    // elements of 4 bytes
  std::uint64_t granule = 256;
  std::vector<texcp_control> ranks;

  communicator(int nr, std::vector<double> b, control_config cfg = {})
      : nranks(nr), n_vts(static_cast<int>(b.size())), bw(std::move(b)) {
    for (int r = 0; r < nranks; ++r) ranks.push_back(texcp_control::start(n_vts, {}, cfg, stall_clock()));
  }

  /// The records every rank contributes for the current epoch (before anyone steps).
  std::vector<epoch_record> records(split& used) {
    std::vector<epoch_record> recs(nranks);
    used = ranks[0].split_for(total, granule);
    for (int r = 0; r < nranks; ++r) {
      texcp_control const& c = ranks[r];
      split const sp = c.split_for(total, granule);
      REQUIRE(sp == used);  // every rank runs the same split
      REQUIRE(sp.sum() == total);
      telemetry::stalls tel{};
      std::uint32_t faults = 0, probe_ok = 0;
      for (int i = 0; i < n_vts; ++i) {
        if (sp.count[i] > 0) {
          if ((dead >> i) & 1u) {
            tel.add_stalls(i, 5'000'000);  // waited until the deadline
            if (r == 1) faults |= 1u << i;  // one rank noticing is enough
            continue;
          }
          std::uint64_t const bytes = sp.count[i] * 4;
          tel.add_bytes(i, bytes);
          // rank r is 1% slower per rank index: the slowest rank's estimate must count
          tel.add_stalls(i, static_cast<std::uint64_t>(static_cast<double>(bytes) / bw[i] * (1 + 0.01 * r)));
        }
        if ((c.probe_mask >> i) & 1u) {
          tel.add_bytes(i, 4096);  // the probe block
          if (!((dead >> i) & 1u)) probe_ok |= 1u << i;
        }
      }
      recs[r] = c.record(r, tel, faults, probe_ok);
    }
    return recs;
  }

  struct outcome {
    step_result res;
    epoch_report rep;
    split used;
  };

  /// Runs one epoch on every rank; requires every rank to agree on the outcome and the next state.
  outcome collective() {
    outcome o{};
    std::vector<epoch_record> const recs = records(o.used);
    o.rep.split = o.used;
    for (int r = 0; r < nranks; ++r) {
      epoch_report rep{};
      rep.split = o.used;
      step_result const res = ranks[r].step(recs.data(), nranks, &rep);
      if (r == 0) o.res = res, o.rep = rep;
      REQUIRE(res.st == o.res.st);
      REQUIRE(res.epoch == o.res.epoch);
      REQUIRE(same_report(rep, o.rep));
    }
    for (int r = 1; r < nranks; ++r) REQUIRE(same_state(ranks[r], ranks[0]));  // same next state, to the bit
    return o;
  }

  /// max over live VTs of bytes / bw, over the optimum total / Σ bw (live).
  double time_ratio() const {
    split const sp = ranks[0].split_for(total, granule);
    double sum_bw = 0, tmax = 0;
    for (int i = 0; i < n_vts; ++i) {
      if (!sp.live(i)) continue;
      sum_bw += bw[i];
      tmax = std::max(tmax, static_cast<double>(sp.count[i] * 4) / bw[i]);
    }
    return tmax / (static_cast<double>(total * 4) / sum_bw);
  }
};

}  // namespace

TEST_CASE("record checksum follows its documented definition, and every field is covered") {
  std::mt19937_64 rng(1);
  for (int trial = 0; trial < 200; ++trial) {
    int const n = 1 + static_cast<int>(rng() % max_vts);
    epoch_record r = random_record(rng, static_cast<int>(rng() % max_ranks), n, rng(), rng());
    r.fault_mask = static_cast<std::uint32_t>(rng()) & all_live(n);
    r.probe_ok_mask = static_cast<std::uint32_t>(rng()) & all_live(n);
    seal(r);
    CHECK(r.checksum == reference_checksum(r));
    // Changing any one covered field changes the checksum.
    auto changed = [&](auto mutate) {
      epoch_record x = r;
      mutate(x);
      return record_checksum(x) != r.checksum;
    };
    CHECK(changed([](epoch_record& x) { x.epoch ^= 1; }));
    CHECK(changed([](epoch_record& x) { x.rank += 1; }));
    CHECK(changed([](epoch_record& x) { x.n_vts -= 1; }));
    CHECK(changed([](epoch_record& x) { x.fault_mask ^= 1; }));
    CHECK(changed([](epoch_record& x) { x.probe_ok_mask ^= 4; }));
    CHECK(changed([](epoch_record& x) { x.state_digest ^= 1ull << 63; }));
    int const vt = static_cast<int>(rng() % n);
    CHECK(changed([&](epoch_record& x) { x.stalls[vt] += 1; }));
    CHECK(changed([&](epoch_record& x) { x.bytes[vt] ^= 1ull << 40; }));
  }
}

TEST_CASE("combine: a failed check names the epoch, the rank and the check") {
  std::mt19937_64 rng(2);
  int const nranks = 8, n = 6;
  std::uint64_t const epoch = 41, digest = 0x1234abcd;
  epoch_expect const expect{epoch, n, digest};
  telemetry::cost_model_q const model{};
  std::vector<epoch_record> good;
  for (int r = 0; r < nranks; ++r) good.push_back(random_record(rng, r, n, epoch, digest));
  REQUIRE(combine(good.data(), nranks, expect, model).st == status::ok);

  auto expect_failure = [&](int bad_rank, record_check what, auto mutate, bool reseal) {
    std::vector<epoch_record> recs = good;
    mutate(recs[bad_rank]);
    if (reseal) seal(recs[bad_rank]);
    epoch_summary const s = combine(recs.data(), nranks, expect, model);
    CHECK(s.st == status::mismatch);
    CHECK(s.epoch == epoch);
    CHECK(s.rank == bad_rank);
    CHECK(s.failed == what);
  };
  expect_failure(3, record_check::checksum, [](epoch_record& r) { r.bytes[2] += 1; }, false);  // corrupted
  expect_failure(5, record_check::epoch, [](epoch_record& r) { r.epoch = epoch - 1; }, true);  // stale
  expect_failure(0, record_check::n_vts, [](epoch_record& r) { r.n_vts = n + 1; }, true);
  expect_failure(7, record_check::state, [](epoch_record& r) { r.state_digest ^= 2; }, true);
  expect_failure(2, record_check::rank, [](epoch_record& r) { r.rank = 6; }, true);  // misplaced

  std::vector<epoch_record> two_bad = good;  // the lowest failing rank is reported
  two_bad[6].bytes[0] ^= 1;
  two_bad[4].stalls[1] ^= 1;
  CHECK(combine(two_bad.data(), nranks, expect, model).rank == 4);

  CHECK(combine(good.data(), 0, expect, model).st == status::invalid_argument);
  CHECK(combine(good.data(), max_ranks + 1, expect, model).st == status::invalid_argument);
  CHECK(combine(nullptr, 1, expect, model).st == status::invalid_argument);
}

TEST_CASE("combine: per VT the slowest rank's estimate counts, faults OR and probes AND over ranks") {
  std::mt19937_64 rng(3);
  int const nranks = 5, n = 4;
  telemetry::cost_model_q model{};
  model.alpha = 3ull << 24;
  model.beta = 1ull << 20;  // 1/16 ns per byte
  model.delta = 500;
  std::vector<epoch_record> recs;
  for (int r = 0; r < nranks; ++r) {
    epoch_record x = random_record(rng, r, n, 9, 77);
    x.fault_mask = r == 2 ? 0b0100u : 0u;
    x.probe_ok_mask = r == 4 ? 0b0001u : 0b1001u;
    x.bytes[3] = 0;  // nobody moves bytes on VT3: no estimate
    seal(x);
    recs.push_back(x);
  }
  epoch_summary const s = combine(recs.data(), nranks, {9, n, 77}, model);
  REQUIRE(s.st == status::ok);
  CHECK(s.fault_mask == 0b0100u);
  CHECK(s.probe_ok_mask == 0b0001u);
  for (int i = 0; i < n; ++i) {
    std::uint64_t tmax = 0, bytes = 0, stalls = 0;
    int who = -1;
    for (int r = 0; r < nranks; ++r) {
      double const t = 3.0 * static_cast<double>(recs[r].stalls[i]) + static_cast<double>(recs[r].bytes[i]) / 16 + 500;
      if (who < 0 || static_cast<std::uint64_t>(t) > tmax) tmax = static_cast<std::uint64_t>(t), who = r;
      bytes += recs[r].bytes[i];
      stalls += recs[r].stalls[i];
    }
    CHECK(s.bytes[i] == bytes);
    CHECK(s.stalls[i] == stalls);
    if (i == 3) {
      CHECK(s.time[i] == 0);
    } else {
      CHECK(s.time[i] == tmax);
      CHECK(s.slowest_rank[i] == who);
    }
  }
}

TEST_CASE("control loop: every rank computes the same splits and they converge") {
  communicator c(4, {1, 4, 4, 4, 2, 2, 3, 4});
  int steps = -1;
  for (int e = 0; e < 12; ++e) {
    if (steps < 0 && c.time_ratio() <= 1.05) steps = e;
    auto const o = c.collective();
    CHECK(o.res.st == status::ok);
    CHECK(o.res.epoch == static_cast<std::uint64_t>(e));
    CHECK(o.rep.epoch == static_cast<std::uint64_t>(e));
  }
  MESSAGE("control loop (4 ranks, 8 VTs, kappa = 4): collective time within 5% of T* after " << steps << " epochs");
  CHECK(steps >= 1);
  CHECK(steps <= 5);
  CHECK(c.time_ratio() <= 1.02);
  CHECK(c.ranks[0].epoch == 12);
}

TEST_CASE("control loop: a dead VT is masked, probed every K collectives, and rejoins when it heals") {
  control_config cfg{};
  cfg.probe_interval = 4;
  communicator c(3, {2, 2, 2, 2, 2, 2}, cfg);
  for (int e = 0; e < 3; ++e) REQUIRE(c.collective().res.st == status::ok);
  shares const before = c.ranks[0].share;

  c.dead = 1u << 3;  // VT3's path dies during epoch 3
  auto o = c.collective();
  CHECK(o.res.st == status::recovered);
  CHECK(o.res.epoch == 3);
  CHECK(o.rep.st == status::recovered);
  CHECK(o.rep.fault_mask == (1u << 3));
  shares const after = c.ranks[0].share;
  CHECK(after.w[3] == 0);
  CHECK(c.ranks[0].masked() == (1u << 3));
  CHECK(c.ranks[0].split_for(c.total, c.granule).count[3] == 0);
  for (int i = 0; i < 6; ++i) {  // its share is spread in proportion: ratios kept
    if (i == 3) continue;
    CHECK(after.w[i] / static_cast<double>(after.w[0]) == doctest::Approx(before.w[i] / static_cast<double>(before.w[0])).epsilon(1e-6));
  }

  // Probes: K = 4 collectives after the fault, then every 4; a probe on a dead path fails.
  std::vector<int> probed_at;
  for (int e = 4; e < 16; ++e) {
    if (c.ranks[0].probe_mask != 0) {
      CHECK(c.ranks[0].probe_mask == (1u << 3));
      probed_at.push_back(e);
    }
    o = c.collective();
    CHECK(o.res.st == status::ok);
    CHECK(c.ranks[0].masked() == (1u << 3));
  }
  CHECK(probed_at == std::vector<int>{7, 11, 15});

  // The path heals; the next probe (epoch 19) brings VT3 back with the rejoin share.
  c.dead = 0;
  for (int e = 16; e < 20; ++e) {
    bool const probing = c.ranks[0].probe_mask != 0;
    o = c.collective();
    CHECK(probing == (e == 19));
    if (probing) CHECK(o.rep.rejoined_mask == (1u << 3));
  }
  CHECK(c.ranks[0].masked() == 0);
  CHECK(c.ranks[0].share.w[3] == cfg.rejoin_share);
  CHECK(c.ranks[0].probe_mask == 0);
  // ... and the allocator grows it back to an equal share (all paths are equal again).
  int grown = -1;
  for (int e = 0; e < 20 && grown < 0; ++e) {
    c.collective();
    if (std::fabs(c.ranks[0].share.w[3] / static_cast<double>(share_one) - 1.0 / 6) < 0.1 / 6) grown = e + 1;
  }
  MESSAGE("a VT back from a probe at share 1/64 reached 10% of its equal share 1/6 after " << grown << " collectives");
  CHECK(grown > 0);
  CHECK(grown <= 8);
}

TEST_CASE("control loop: a probe that fails on one rank keeps the VT masked") {
  control_config cfg{};
  cfg.probe_interval = 2;
  communicator c(4, {1, 1, 1}, cfg);
  c.dead = 1u << 1;
  REQUIRE(c.collective().res.st == status::recovered);
  c.dead = 0;
  c.collective();  // the second collective since the fault: the probe goes out in the next one
  REQUIRE(c.ranks[0].probe_mask == (1u << 1));
  split used{};
  std::vector<epoch_record> recs = c.records(used);
  recs[2].probe_ok_mask = 0;  // rank 2 never saw the probe block
  seal(recs[2]);
  for (int r = 0; r < c.nranks; ++r) CHECK(c.ranks[r].step(recs.data(), c.nranks).st == status::ok);
  CHECK(c.ranks[0].masked() == (1u << 1));
}

TEST_CASE("control loop: losing every VT is a timeout and leaves the state as it was") {
  communicator c(2, {1, 2, 3});
  c.collective();
  c.dead = 0b111;
  texcp_control const before = c.ranks[0];
  split used{};
  std::vector<epoch_record> const recs = c.records(used);
  step_result const r = c.ranks[0].step(recs.data(), c.nranks);
  CHECK(r.st == status::timeout);
  CHECK(r.epoch == 1);
  CHECK(same_state(before, c.ranks[0]));
}

TEST_CASE("control loop: a rank whose state diverged is reported by the others, naming epoch and rank") {
  communicator c(4, {1, 2, 3, 4});
  for (int e = 0; e < 3; ++e) c.collective();
  c.ranks[2].share.w[0] += 1;  // rank 2 drifted (e.g. lost an update)
  c.ranks[2].share.w[1] -= 1;
  split used{};
  std::vector<epoch_record> recs(c.nranks);
  for (int r = 0; r < c.nranks; ++r) recs[r] = c.ranks[r].record(r, telemetry::stalls{}, 0, 0);
  texcp_control const before = c.ranks[0];
  step_result const res = c.ranks[0].step(recs.data(), c.nranks);
  CHECK(res.st == status::mismatch);
  CHECK(res.epoch == 3);
  CHECK(res.rank == 2);
  CHECK(res.failed == record_check::state);
  CHECK(same_state(before, c.ranks[0]));  // no step on a mismatch
  step_result const on_two = c.ranks[2].step(recs.data(), c.nranks);  // rank 2 sees everyone else differ
  CHECK(on_two.st == status::mismatch);
  CHECK(on_two.rank == 0);
  (void)used;
}

TEST_CASE("control loop: a new cost model switches at its epoch on every rank, a late rank is caught") {
  communicator c(3, {1, 2, 4});
  for (int e = 0; e < 2; ++e) c.collective();
  telemetry::cost_model_q next = stall_clock();
  next.delta = 1000;  // a fixed cost per block
  next.from_epoch = 6;
  c.ranks[0].set_model(next);  // ranks receive it at different epochs, all before epoch 6
  c.collective();
  c.ranks[1].set_model(next);
  c.collective();
  c.ranks[2].set_model(next);
  c.collective();  // epoch 4
  CHECK(c.ranks[0].current_model().delta == 0);
  c.collective();  // epoch 5
  CHECK(c.ranks[0].epoch == 6);
  CHECK(c.ranks[0].current_model() == next);
  c.collective();  // epoch 6 evaluated with the new model on every rank (collective() requires agreement)
  CHECK(c.ranks[0].model == next);

  // A rank that gets a model after its from_epoch passed disagrees at that epoch: an error.
  telemetry::cost_model_q later = next;
  later.delta = 2000;
  later.from_epoch = 8;
  c.collective();  // epoch 7
  c.ranks[0].set_model(later);
  c.ranks[2].set_model(later);
  split used{};
  std::vector<epoch_record> const recs = c.records(used);  // epoch 8: rank 1 still on the old model
  step_result const res = c.ranks[0].step(recs.data(), c.nranks);
  CHECK(res.st == status::mismatch);
  CHECK(res.epoch == 8);
  CHECK(res.rank == 1);
}

TEST_CASE("epoch report: bytes, stalls, time and bandwidth per VT as the user reads them") {
  communicator c(2, {1, 4});
  auto const o = c.collective();
  REQUIRE(o.res.st == status::ok);
  CHECK(o.rep.n_vts == 2);
  CHECK(o.rep.nranks == 2);
  CHECK(o.rep.split == o.used);
  CHECK(o.rep.masked_mask == 0);
  for (int i = 0; i < 2; ++i) {
    std::uint64_t const bytes = o.used.count[i] * 4;
    CHECK(o.rep.bytes[i] == 2 * bytes);
    CHECK(o.rep.share[i] == equal_shares(2, 3).w[i]);
    // rank 1 is 1% slower: its time counts
    double const t = static_cast<double>(bytes) / c.bw[i] * 1.01;
    CHECK(static_cast<double>(o.rep.time_ns[i]) == doctest::Approx(t).epsilon(1e-6));
    // per-rank bandwidth in 10^6 B/s: bytes per ns * 1000, from the slowest rank
    CHECK(static_cast<double>(o.rep.bw_mbps[i]) == doctest::Approx(c.bw[i] / 1.01 * 1000).epsilon(1e-3));
  }
}

TEST_CASE("control: invalid VT counts and rank counts are errors, not crashes") {
  texcp_control bad = texcp_control::start(0);
  CHECK(bad.split_for(1000, 1).n_vts == 0);
  epoch_record r{};
  CHECK(bad.step(&r, 1).st == status::invalid_argument);
  CHECK(texcp_control::start(max_vts + 1).split_for(1000, 1).n_vts == 0);
  texcp_control good = texcp_control::start(4);
  CHECK(good.step(&r, 0).st == status::invalid_argument);
  CHECK(good.step(nullptr, 1).st == status::invalid_argument);
}

TEST_CASE("control step runs in constant evaluation (plain integer code, no UB)") {
  constexpr auto run = [] {
    auto ctl = control<allocator::proportional>::start(4);
    for (int e = 0; e < 4; ++e) {
      split const sp = ctl.split_for(1 << 20, 64);
      epoch_record recs[2];
      for (int r = 0; r < 2; ++r) {
        telemetry::stalls tel{};
        for (int i = 0; i < 4; ++i) {
          tel.add_bytes(i, sp.count[i] * 4);
          tel.add_stalls(i, sp.count[i] * (i + 1));
        }
        recs[r] = ctl.record(r, tel, e == 2 ? 0b10u : 0u, 0);
      }
      if (ctl.step(recs, 2).st == status::mismatch) return false;
    }
    return ctl.epoch == 4 && ctl.masked() == 0b10u && ctl.split_for(1 << 20, 64).sum() == (1u << 20);
  };
  static_assert(run());
  CHECK(run());
}
