// Dead VTs: the collective still returns the correct result with a fault event, the VT is masked
// from the next collective, probes bring it back once it recovers, and losing every VT is an error.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "support.hpp"

using namespace reccl_test;

namespace {

cpu::config base(int nranks, int n_vts) {
  cpu::config c;
  c.nranks = nranks;
  c.n_vts = n_vts;
  c.granule = 1;
  c.slot_bytes = 4096;
  c.poll_quantum_ns = 50'000;
  c.wait_timeout_ns = 300'000'000;  // 300 ms without progress: dead (far above any CPU hiccup)
  c.poison_internal = true;
  return c;
}

using ar_ring = reccl::all_reduce<float, schedule::ring, transport::cpu_threads, telemetry::stalls, allocator::texcp>;

}  // namespace

TEST_CASE("dead VT: correct result and a fault event, then masked from the next collective") {
  cpu::config c = base(4, 3);
  c.faults.kill(1, 2);  // VT 1 dies at collective 2 for good
  c.control.probe_interval = 0;  // no probes in this test
  cpu::communicator comm(c);
  std::mt19937_64 g(11);
  for (int e = 0; e < 5; ++e) {
    CAPTURE(e);
    auto const r = run_checked<ar_ring>(comm, 50'001, g, redop::sum);
    CHECK(r.correct);
    for (auto const& res : r.res) {
      CHECK(res.report.epoch == static_cast<std::uint64_t>(e));
      if (e < 2) {
        CHECK(res.st == status::ok);
        CHECK(res.report.split.count[1] > 0);
      } else if (e == 2) {
        CHECK(res.st == status::recovered);
        CHECK(res.fault_mask == 0b010u);
        CHECK(res.report.fault_mask == 0b010u);
      } else {
        CHECK(res.st == status::ok);
        CHECK(res.report.split.count[1] == 0);        // masked
        CHECK((res.report.masked_mask & 0b010u) != 0);
        CHECK(res.elapsed_ns < c.wait_timeout_ns);   // no deadline is waited out any more
      }
    }
    if (e == 2) {
      // the fault event: some rank saw VT 1 miss its deadline, and says whom it waited for
      int events = 0;
      for (auto const& res : r.res)
        for (auto const& f : res.faults) {
          CHECK(f.vt == 1);
          CHECK(f.epoch == 2);
          CHECK(f.peer >= 0);
          ++events;
        }
      CHECK(events > 0);
    }
  }
  CHECK(comm.current_shares(0).live_mask == 0b101u);
}

TEST_CASE("a VT that dies mid-way through its block on one rank: its range is finished by the others") {
  cpu::config c = base(4, 4);
  c.faults.kill(2, 1, 2, /*src_rank=*/3, /*after_bytes=*/3 * 4096);
  cpu::communicator comm(c);
  std::mt19937_64 g(12);
  for (int e = 0; e < 3; ++e) {
    CAPTURE(e);
    auto const r = run_checked<ar_ring>(comm, 200'000, g, redop::sum);
    CHECK(r.correct);
    CHECK(r.res[0].st == (e == 1 ? status::recovered : status::ok));
  }
}

TEST_CASE("dead VT under every collective and schedule: the result stays correct") {
  for (int p = 0; p < n_plans; ++p) {
    CAPTURE(plan_name(static_cast<plan>(p)));
    with_plan(static_cast<plan>(p), [&]<collective Kind, class S>() {
      cpu::config c = base(3, 3);
      c.faults.kill(0, 1);
      cpu::communicator comm(c);
      std::mt19937_64 g(13 + p);
      using C = reccl::collective_op<Kind, std::int32_t, S, transport::cpu_threads, telemetry::stalls, allocator::texcp>;
      for (int e = 0; e < 3; ++e) {
        CAPTURE(e);
        auto const r = run_checked<C>(comm, 20'011, g, redop::max, 1);
        CHECK(r.correct);
        CHECK(r.res[0].st == (e == 1 ? status::recovered : status::ok));
      }
    });
  }
}

TEST_CASE("probe: a masked VT is tried every K collectives without holding them up, and rejoins when healthy") {
  cpu::config c = base(4, 3);
  c.faults.kill(2, 1, 6);  // dead in collectives 1..5
  c.control.probe_interval = 2;
  cpu::communicator comm(c);
  std::mt19937_64 g(14);
  int rejoined_at = -1;
  std::uint32_t first_share = 0;
  std::vector<std::uint32_t> shares_after;
  for (int e = 0; e < 16; ++e) {
    CAPTURE(e);
    auto const r = run_checked<ar_ring>(comm, 100'000, g, redop::sum);
    CHECK(r.correct);
    auto const& rep = r.res[0].report;
    if (e >= 2 && e < 6) {
      CHECK(rep.split.count[2] == 0);
      if (rep.probe_mask != 0) {
        CHECK(rep.rejoined_mask == 0);  // still dead: the probe fails ...
        CHECK(r.res[0].elapsed_ns < c.wait_timeout_ns);  // ... without holding the collective up
      }
    }
    if (rep.rejoined_mask & 0b100u) {
      CHECK(e >= 6);
      rejoined_at = e;
    }
    if (rejoined_at >= 0 && e == rejoined_at + 1) first_share = rep.share[2];
    if (rejoined_at >= 0 && e > rejoined_at + 1) shares_after.push_back(rep.share[2]);
  }
  REQUIRE(rejoined_at >= 6);
  CHECK(rejoined_at <= 6 + 2 * c.control.probe_interval);  // within K collectives of recovering (plus one)
  CHECK(first_share == c.control.rejoin_share);            // back with a small share ...
  REQUIRE_FALSE(shares_after.empty());
  CHECK(shares_after.back() > 4 * first_share);            // ... that then grows
  CHECK(comm.current_shares(0).live_mask == 0b111u);
}

TEST_CASE("losing every VT is a clean error, not a hang") {
  cpu::config c = base(2, 2);
  c.faults.kill(0, 1).kill(1, 1);
  cpu::communicator comm(c);
  std::mt19937_64 g(15);
  auto const ok = run_checked<ar_ring>(comm, 1000, g);
  CHECK(ok.correct);
  std::uint64_t const t0 = cpu::now_ns();
  try {
    run_checked<ar_ring>(comm, 1000, g);
    FAIL("expected reccl::error");
  } catch (reccl::error const& err) {
    CHECK(err.code() == status::timeout);
    CHECK(err.epoch() == 1);
    CHECK(std::string(err.what()).find("every VT") != std::string::npos);
  }
  CHECK(cpu::now_ns() - t0 < 5'000'000'000);
  // the communicator is failed from now on
  CHECK_THROWS_AS(run_checked<ar_ring>(comm, 10, g), reccl::error);
}
