// The control loop driving the simulator: a dead NIC is masked and carries nothing afterwards, a
// probe brings it back, NCCL's behaviour aborts, the allocator moves bytes off a lossy NIC, and the
// same seed gives the same output.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include <reccl_sim/scenario.hpp>

using namespace reccl_sim;

namespace {

/// 2 nodes × 4 GPUs, ring all-reduce over all 8, 4 VTs (one per NIC), 16 MiB.
scenario_case small_case() {
  scenario_case c;
  c.cluster.nodes = 2;
  c.cluster.gpus_per_node = 4;
  c.cluster.nodes_per_tor = 2;
  for (int g = 0; g < 8; ++g) c.rank_gpus.push_back(g);
  c.n_vts = 4;
  c.bytes = 16u << 20;
  c.control.probe_interval = 3;
  c.collectives = 16;
  return c;
}

}  // namespace

TEST_CASE("a dead NIC: fault, recovery, masking, no bytes on it afterwards, probe and rejoin") {
  scenario_case c = small_case();
  topology topo(c.cluster);
  auto const plan = compile_named(c.schedule, schedule_params(c));
  comm_layout comm(topo, c.rank_gpus, c.n_vts, 3);
  collective_engine eng(topo, plan, comm);
  background_model bg(topo, {}, 1);
  driver<reccl::allocator::texcp> d(topo, eng, bg, c.coll, c.bytes / 4, 4, 64, reccl::allocator::texcp{}, c.control,
                                    c.telemetry, c.faults, 9);
  int const dead_gpu = 1;  // node 0, rail 1: VT 1's NIC
  auto nic_bytes = [&]() {
    auto const& lb = d.last_result().link_bytes;
    return lb[static_cast<std::size_t>(topo.nic_out(dead_gpu))] + lb[static_cast<std::size_t>(topo.nic_in(dead_gpu))];
  };
  epoch_row r = d.run_one(0);
  CHECK(r.st == reccl::status::ok);
  CHECK(nic_bytes() > 0);
  double const healthy = r.busbw;

  topo.set_nic_up(dead_gpu, false);
  r = d.run_one(1);
  CHECK(r.st == reccl::status::recovered);
  CHECK(r.fault_mask == 0b0010u);
  CHECK(std::isfinite(r.time));
  CHECK(r.time > c.faults.deadline);  // it waited for the deadline, then the live VTs finished
  int rejoined_at = -1;
  for (int e = 2; e < 16; ++e) {
    if (e == 8) topo.set_nic_up(dead_gpu, true);
    r = d.run_one(e);
    REQUIRE(r.st == reccl::status::ok);
    if (e < 8) {
      CHECK((r.live_mask & 0b0010u) == 0);  // masked
      CHECK(r.share[1] == 0.0);
      CHECK(nic_bytes() == 0.0);            // the dead NIC carries nothing
      // Three VTs of four keep most of it -- except in a probe epoch: a failed probe holds the
      // collective until probe_grace after its start (as the CPU engine does).
      if (r.probe_mask == 0) CHECK(r.busbw > 0.5 * healthy);
      else CHECK(r.time >= c.faults.probe_grace);
    }
    if (r.rejoined_mask != 0 && rejoined_at < 0) {
      CHECK(r.rejoined_mask == 0b0010u);
      rejoined_at = e;
    }
  }
  REQUIRE(rejoined_at >= 8);
  CHECK(rejoined_at <= 8 + c.control.probe_interval);
  CHECK((r.live_mask & 0b0010u) != 0);
  CHECK(nic_bytes() > 0);
}

TEST_CASE("NCCL's behaviour: a dead path aborts the communicator") {
  scenario_case c = small_case();
  c.events.push_back({4, timeline_event::kind::nic_down, 2});
  auto const r = run_case(c, variant{"nccl", "equal", true});
  for (int e = 0; e < 4; ++e) CHECK_FALSE(r.rows[static_cast<std::size_t>(e)].aborted);
  for (int e = 4; e < c.collectives; ++e) CHECK(r.rows[static_cast<std::size_t>(e)].aborted);
}

TEST_CASE("TeXCP moves bytes off a lossy NIC and beats the equal split") {
  scenario_case c = small_case();
  c.cluster.routing = cluster_params::spine_routing::spray;
  c.events.push_back({0, timeline_event::kind::nic_loss, 0, -1, 0.01});
  auto const eq = run_case(c, variant{"equal", "equal"});
  auto const tx = run_case(c, variant{"texcp", "texcp"});
  double const beq = mean_over(eq, 8, c.collectives, [](epoch_row const& r) { return r.busbw; });
  double const btx = mean_over(tx, 8, c.collectives, [](epoch_row const& r) { return r.busbw; });
  CHECK(btx > 1.2 * beq);
  CHECK(tx.rows.back().share[0] < 0.2);  // VT 0 rides the lossy NIC: below its equal 1/4
  CHECK(eq.rows.back().share[0] == doctest::Approx(0.25).epsilon(1e-6));
}

TEST_CASE("same seed, same output, another seed, other telemetry noise") {
  scenario_case c = small_case();
  c.background.push_back(background_job{"bg", background_job::pattern::ring, {0, 5, 2, 7}, {}, 1,
                                        std::numeric_limits<double>::infinity(), 0, 1000, 0.5, 3});
  c.events.push_back({5, timeline_event::kind::nic_down, 3});
  c.events.push_back({9, timeline_event::kind::nic_up, 3});
  auto const a = run_case(c, variant{"t", "texcp"});
  auto const b = run_case(c, variant{"t", "texcp"});
  REQUIRE(a.rows.size() == b.rows.size());
  for (std::size_t i = 0; i < a.rows.size(); ++i) {
    CHECK(a.rows[i].time == b.rows[i].time);
    CHECK(std::memcmp(a.rows[i].share, b.rows[i].share, sizeof a.rows[i].share) == 0);
    CHECK(std::memcmp(a.rows[i].est_ns, b.rows[i].est_ns, sizeof a.rows[i].est_ns) == 0);
  }
  c.seed = 2;
  auto const d = run_case(c, variant{"t", "texcp"});
  bool differs = false;
  for (std::size_t i = 0; i < a.rows.size(); ++i)
    differs = differs || std::memcmp(a.rows[i].est_ns, d.rows[i].est_ns, sizeof a.rows[i].est_ns) != 0;
  CHECK(differs);
}

TEST_CASE("more ranks than an epoch record set holds (128 > max_ranks)") {
  scenario_case c;
  c.cluster.nodes = 16;
  c.cluster.nodes_per_tor = 4;
  c.cluster.spines = 4;
  for (int g = 0; g < 128; ++g) c.rank_gpus.push_back(g);
  c.bytes = 64u << 20;
  c.collectives = 4;
  c.events.push_back({1, timeline_event::kind::nic_down, 77});
  auto const r = run_case(c, variant{"t", "texcp"});
  CHECK(r.rows[0].st == reccl::status::ok);
  CHECK(r.rows[1].st == reccl::status::recovered);
  CHECK(r.rows[1].fault_mask == (1u << (77 % 8)));
  CHECK(r.rows[3].st == reccl::status::ok);
  CHECK(r.rows[3].busbw > 0);
}
