// Flow-level engine: conservation, link bandwidth, the α–β closed forms, work conservation, plan
// compilation checks.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include <reccl/policy/allocator/allocator.hpp>
#include <reccl_sim/scenario.hpp>

using namespace reccl_sim;
namespace sch = reccl::schedule;

namespace {

std::vector<int> first_gpus(int n) {
  std::vector<int> g(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) g[static_cast<std::size_t>(i)] = i;
  return g;
}

/// A split of `total` over `nv` VTs with random shares (every VT gets at least one granule).
reccl::split random_split(rng& r, int nv, std::uint64_t total, std::uint64_t granule) {
  std::uint64_t raw[reccl::max_vts] = {}, sum = 0;
  for (int v = 0; v < nv; ++v) sum += (raw[v] = 64 + r.next() % 1000);
  reccl::shares s{};
  s.n_vts = nv;
  s.live_mask = reccl::all_live(nv);
  std::uint64_t given = 0;
  for (int v = 0; v < nv; ++v) given += (s.w[v] = static_cast<std::uint32_t>(raw[v] * reccl::share_one / sum));
  s.w[nv - 1] += static_cast<std::uint32_t>(reccl::share_one - given);
  REQUIRE(reccl::check(s) == reccl::status::ok);
  return reccl::to_split(s, total, granule);
}

/// Bytes the schedule's sends carry for split `sp`, enumerated op by op (independently of
/// compile_plan's grouping).
template <class S>
double plan_send_bytes(sch::params const& p, reccl::split const& sp, std::size_t elem) {
  S const s(p);
  double total = 0;
  for (int v = 0; v < sp.n_vts; ++v) {
    if (sp.count[v] == 0) continue;
    sch::block const blk{sp.offset(v), sp.offset(v) + sp.count[v]};
    for (int step = 0; step < s.num_steps(); ++step)
      for (int r = 0; r < p.nranks; ++r)
        s.for_each_op(r, step, [&](sch::op const& o) {
          if (o.act == sch::action::send) total += static_cast<double>(sch::chunk_length(s, o.buf, o.chunk, blk, sp.total)) * elem;
        });
  }
  return total;
}

template <class S>
void check_conservation(sch::params p, cluster_params cp, int nv, rail_policy rails, std::uint64_t seed) {
  rng r(seed);
  topology topo(cp);
  p.nranks = cp.nodes * cp.gpus_per_node;
  auto const plan = compile_plan<S>(p, "test");
  comm_layout comm(topo, first_gpus(p.nranks), nv, 7, rails);
  collective_engine eng(topo, plan, comm);
  std::uint64_t const count = 4096 + r.next() % 200000;
  auto const sp = random_split(r, nv, count, 16);
  REQUIRE(sp.n_vts == nv);
  auto const res = eng.run(sp, 4);
  double const expect = plan_send_bytes<S>(p, sp, 4);
  INFO("collective " << reccl::name(p.coll) << ", count " << count);
  REQUIRE(expect > 0);
  CHECK(res.bytes_sent == expect);
  CHECK(res.bytes_received == expect);
  CHECK(res.bytes_delivered == doctest::Approx(expect).epsilon(1e-9));
  double per_rank = 0;
  for (double b : res.rank_vt_bytes) per_rank += b;
  CHECK(per_rank == expect);
  // Every byte that leaves through a NIC enters through one; the same for NVLink ports.
  double nic_out = 0, nic_in = 0, nvl_out = 0, nvl_in = 0;
  for (int g = 0; g < topo.gpus(); ++g) {
    nic_out += res.link_bytes[static_cast<std::size_t>(topo.nic_out(g))];
    nic_in += res.link_bytes[static_cast<std::size_t>(topo.nic_in(g))];
    nvl_out += res.link_bytes[static_cast<std::size_t>(topo.nvl_out(g))];
    nvl_in += res.link_bytes[static_cast<std::size_t>(topo.nvl_in(g))];
  }
  CHECK(nic_out == doctest::Approx(nic_in).epsilon(1e-9));
  CHECK(nvl_out == doctest::Approx(nvl_in).epsilon(1e-9));
  CHECK(nic_out + nvl_out >= expect * (1 - 1e-9));  // each byte crosses at least one port
  for (int v = 0; v < nv; ++v) CHECK(std::isfinite(res.vt[v].time));
}

}  // namespace

TEST_CASE("conservation: bytes delivered = bytes sent = bytes received, for every schedule") {
  cluster_params cp;
  cp.nodes = 3;
  cp.gpus_per_node = 4;
  cp.nodes_per_tor = 2;
  sch::params p{};
  std::uint64_t seed = 1;
  for (auto c : {reccl::collective::all_reduce, reccl::collective::reduce_scatter, reccl::collective::all_gather,
                 reccl::collective::broadcast}) {
    p.coll = c;
    p.root = 5;
    check_conservation<sch::ring>(p, cp, 4, rail_policy::per_vt, ++seed);
  }
  for (auto c : {reccl::collective::all_reduce, reccl::collective::broadcast}) {
    p.coll = c;
    check_conservation<sch::tree>(p, cp, 3, rail_policy::per_vt, ++seed);
  }
  p.coll = reccl::collective::all_reduce;
  check_conservation<sch::one_shot>(p, cp, 2, rail_policy::per_vt, ++seed);
  check_conservation<sch::two_shot>(p, cp, 5, rail_policy::sender, ++seed);
  p.coll = reccl::collective::broadcast;
  p.root = 0;
  p.ranks_per_node = 4;
  check_conservation<sch::multirail_broadcast>(p, cp, 4, rail_policy::sender, ++seed);
  p.coll = reccl::collective::all_to_all;
  p.n_relays = 2;
  p.relays[0] = {0, 5, 1, 250000};
  p.relays[1] = {6, 2, 7, 600000};
  check_conservation<sch::all_to_all>(p, cp, 3, rail_policy::sender, ++seed);
}

TEST_CASE("a single uncontended VT reaches its link bandwidth") {
  cluster_params cp;
  cp.nodes = 2;
  cp.gpus_per_node = 1;
  cp.nodes_per_tor = 2;  // (with a ToR per node, ECMP would put the flow on one of two half-rate uplinks)
  topology topo(cp);
  sch::params p{};
  p.nranks = 2;
  auto const plan = compile_plan<sch::ring>(p);
  comm_layout comm(topo, {0, 1}, 1);
  collective_engine eng(topo, plan, comm);
  reccl::split sp{};
  sp.n_vts = 1;
  sp.live_mask = 1;
  sp.total = sp.count[0] = 1u << 28;  // 1 GiB of float
  auto const res = eng.run(sp, 4);
  CHECK(res.vt[0].bottleneck_rate == doctest::Approx(cp.nic_payload_rate()).epsilon(1e-12));
  // 2(N-1)/N * S = S bytes per direction, at the NIC's rate, plus 2 steps of latency.
  double const alpha = topo.latency(topo.route(0, 1, 0, 1, 0)) + engine_options{}.step_overhead;
  CHECK(res.time == doctest::Approx(2 * alpha + 4.0 * (1u << 28) / cp.nic_payload_rate()).epsilon(1e-12));
}

TEST_CASE("ring all-reduce matches T = 2(N-1)·α + 2(N-1)/N · S/B on an uncontended topology") {
  for (int n : {2, 3, 5, 8}) {
    for (bool nvlink : {false, true}) {
      cluster_params cp;
      cp.nodes = nvlink ? 1 : n;
      cp.gpus_per_node = nvlink ? n : 1;
      cp.nodes_per_tor = cp.nodes;  // one ToR: no spine
      topology topo(cp);
      sch::params p{};
      p.nranks = n;
      auto const plan = compile_plan<sch::ring>(p);
      REQUIRE(plan.phases.size() == 1);  // all 2(N-1) steps connect the same pairs
      REQUIRE(plan.phases[0].n_steps == 2 * (n - 1));
      comm_layout comm(topo, first_gpus(n), 1);
      collective_engine eng(topo, plan, comm);
      reccl::split sp{};
      sp.n_vts = 1;
      sp.live_mask = 1;
      sp.total = sp.count[0] = static_cast<std::uint64_t>(n) * 1024 * 733;  // whole tiles per chunk
      auto const res = eng.run(sp, 4);
      double const S = 4.0 * static_cast<double>(sp.total);
      double const B = nvlink ? cp.nvlink_bw : cp.nic_payload_rate();
      double const alpha = (nvlink ? cp.nvlink_latency : 2 * cp.nic_latency + cp.switch_latency) + engine_options{}.step_overhead;
      double const closed = 2 * (n - 1) * alpha + 2.0 * (n - 1) / n * S / B;
      INFO("N = " << n << (nvlink ? " on NVLink" : " over NICs"));
      CHECK(res.time == doctest::Approx(closed).epsilon(1e-12));
    }
  }
}

TEST_CASE("tree all-reduce matches the α–β model step by step (N = 7, one rank per node)") {
  // Heap tree v0 <- v1, v2 <- v3..v6, P = 8 pipelined shares, P + 2D - 1 = 11 steps. In step s the
  // busiest NIC carries m_s flows, each moving one share S/P at B/m_s. From tree.hpp's step rules:
  // leaves send up in steps 0-7, level 1 in 1-8, the root sends down in 2-9 and level 1 in 3-10, so
  // from step 2 to 8 a level-1 NIC carries three flows (in: two leaves + the root; out: its parent +
  // two leaves), and two in the other steps.
  int const m[11] = {2, 2, 3, 3, 3, 3, 3, 3, 3, 2, 2};
  cluster_params cp;
  cp.nodes = 7;
  cp.gpus_per_node = 1;
  cp.nodes_per_tor = 7;
  topology topo(cp);
  sch::params p{};
  p.nranks = 7;
  auto const plan = compile_plan<sch::tree>(p);
  REQUIRE(plan.num_steps == 11);
  comm_layout comm(topo, first_gpus(7), 1);
  collective_engine eng(topo, plan, comm);
  reccl::split sp{};
  sp.n_vts = 1;
  sp.live_mask = 1;
  sp.total = sp.count[0] = 8ull * 123457;
  auto const res = eng.run(sp, 4);
  double const share = 4.0 * static_cast<double>(sp.total) / 8, B = cp.nic_payload_rate();
  double const alpha = 2 * cp.nic_latency + cp.switch_latency + engine_options{}.step_overhead;
  double closed = 0;
  for (int s = 0; s < 11; ++s) closed += alpha + m[s] * share / B;
  CHECK(res.time == doctest::Approx(closed).epsilon(1e-12));
}

TEST_CASE("event-driven: bandwidth a finished VT leaves goes to the others at once") {
  // Two VTs of a 4-rank ring share each NIC (one GPU per node). When the smaller block is done, the
  // larger gets the whole NIC: the total takes as long as one VT moving both blocks. (Latencies are
  // zero here so that the bandwidth terms can be compared exactly.)
  cluster_params cp;
  cp.nodes = 4;
  cp.gpus_per_node = 1;
  cp.nodes_per_tor = 4;
  cp.nic_latency = cp.switch_latency = 0;
  topology topo(cp);
  sch::params p{};
  p.nranks = 4;
  auto const plan = compile_plan<sch::ring>(p);
  comm_layout comm(topo, first_gpus(4), 2);
  engine_options eo;
  eo.step_overhead = 0;
  collective_engine eng(topo, plan, comm, eo);
  reccl::split sp{};
  sp.n_vts = 2;
  sp.live_mask = 3;
  sp.count[0] = 4 * 1024 * 100;
  sp.count[1] = 4 * 1024 * 300;
  sp.total = sp.count[0] + sp.count[1];
  auto const res = eng.run(sp, 4);
  double const B = cp.nic_payload_rate();
  double const per = 2.0 * 3 / 4 * 4;  // bytes per flow per element of a block: 2(N-1)/N × 4 B
  CHECK(res.vt[0].time == doctest::Approx(per * sp.count[0] / (B / 2)).epsilon(1e-12));
  CHECK(res.vt[1].time == doctest::Approx(per * static_cast<double>(sp.total) / B).epsilon(1e-12));
  // Solved once per phase instead, VT 1 keeps half the NIC to the end.
  eo.per_phase = true;
  collective_engine eng2(topo, plan, comm, eo);
  auto const res2 = eng2.run(sp, 4);
  CHECK(res2.vt[1].time == doctest::Approx(per * sp.count[1] / (B / 2)).epsilon(1e-12));
}

namespace {
/// A schedule whose step 1 sends without a matching receive (to exercise compile_plan's check).
struct unpaired {
  std::int32_t nranks = 2;
  unpaired() = default;
  explicit unpaired(sch::params const& p) : nranks(p.nranks) {}
  static constexpr bool supports(reccl::collective) { return true; }
  static constexpr sch::check_result check(sch::params const&) { return {}; }
  constexpr int num_steps() const { return 2; }
  constexpr sch::chunking chunks(sch::buffer) const { return {}; }
  constexpr int segments(sch::buffer) const { return 1; }
  template <class Sink>
  constexpr void for_each_op(int rank, int step, Sink&& sink) const {
    if (rank == 0) sink(sch::send(1, 0));
    if (rank == 1 && step == 0) sink(sch::recv_copy(0, 0));
  }
};
static_assert(reccl::Schedule<unpaired>);
}  // namespace

TEST_CASE("plan: unpaired sends are an error, rank counts above max_ranks compile") {
  sch::params p{};
  p.nranks = 2;
  CHECK_THROWS_AS(compile_plan<unpaired>(p), std::logic_error);
  p.nranks = 200;  // beyond reccl::max_ranks: the ring's index arithmetic does not depend on it
  auto const plan = compile_plan<sch::ring>(p);
  CHECK(plan.phases.size() == 1);
  CHECK(plan.phases[0].flows.size() == 200);
  p.root = 300;
  CHECK_THROWS_AS(compile_plan<sch::ring>(p), std::invalid_argument);
  p.root = 0;
  p.coll = reccl::collective::all_to_all;
  CHECK_THROWS_AS(compile_plan<sch::ring>(p), std::invalid_argument);
}
