// Topology, routing and the go-back-N goodput model.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <stdexcept>

#include <reccl_sim/loss.hpp>
#include <reccl_sim/topology.hpp>

using namespace reccl_sim;

TEST_CASE("topology: capacities follow the parameters") {
  cluster_params p;
  p.nodes = 8;
  p.nodes_per_tor = 2;
  p.spines = 4;
  p.oversubscription = 2;
  topology t(p);
  double const nic = 50e9 * 4096.0 / 4178.0;
  CHECK(p.nic_payload_rate() == doctest::Approx(nic));
  CHECK(t.links()[static_cast<std::size_t>(t.nic_out(3))].capacity == doctest::Approx(nic));
  CHECK(t.links()[static_cast<std::size_t>(t.nvl_in(3))].capacity == doctest::Approx(450e9));
  // A ToR has 2 nodes x 8 NICs below it; 4 spines at 2:1 give each uplink 16 NICs / 8.
  CHECK(t.links()[static_cast<std::size_t>(t.tor_up(1, 2))].capacity == doctest::Approx(16 * nic / 8));
  p.routing = cluster_params::spine_routing::spray;
  topology ts(p);
  CHECK(ts.links()[static_cast<std::size_t>(ts.tor_up(1, 0))].capacity == doctest::Approx(16 * nic / 2));
}

TEST_CASE("topology: routes inside a node, under one ToR, across spines") {
  cluster_params p;
  p.nodes = 4;
  p.nodes_per_tor = 2;
  topology t(p);
  path const in_node = t.route(1, 5, 1, 5, 0);
  REQUIRE(in_node.n == 2);
  CHECK(in_node.link[0] == t.nvl_out(1));
  CHECK(in_node.link[1] == t.nvl_in(5));
  // Node 0 -> node 1, same ToR, own rails: NIC out, NIC in.
  path const same_tor = t.route(2, 10, 2, 10, 0);
  REQUIRE(same_tor.n == 2);
  CHECK(same_tor.link[0] == t.nic_out(2));
  CHECK(same_tor.link[1] == t.nic_in(10));
  // Through rail 6 on both sides (PXN): NVLink to GPU 6, its NIC, NIC of GPU 14, NVLink to 10.
  path const pxn = t.route(2, 10, 6, 14, 0);
  REQUIRE(pxn.n == 6);
  CHECK(pxn.link[2] == t.nic_out(6));
  CHECK(pxn.link[3] == t.nic_in(14));
  // Node 0 -> node 2 crosses a spine; the same label always picks the same one.
  path const far = t.route(3, 19, 3, 19, 77);
  REQUIRE(far.n == 4);
  CHECK(t.links()[static_cast<std::size_t>(far.link[1])].kind == link_kind::tor_up);
  CHECK(t.links()[static_cast<std::size_t>(far.link[2])].kind == link_kind::spine_down);
  CHECK(t.route(3, 19, 3, 19, 77) == far);
  path const pinned = t.route(3, 19, 3, 19, 77, 1);
  CHECK(pinned.link[1] == t.tor_up(0, 1));
  CHECK(t.latency(far) == doctest::Approx(2 * 0.8e-6 + 3 * 0.6e-6));
  CHECK_THROWS_AS(t.route(3, 19, 11, 19, 0), std::invalid_argument);  // rail on another node
  CHECK_THROWS_AS(t.route(3, 99, 3, 99, 0), std::invalid_argument);
}

TEST_CASE("topology: ECMP spreads labels over every spine") {
  cluster_params p;
  p.nodes = 2;
  p.spines = 4;
  topology t(p);
  int used[4] = {};
  for (std::uint64_t label = 0; label < 400; ++label) {
    path const r = t.route(0, 8, 0, 8, label);
    ++used[t.links()[static_cast<std::size_t>(r.link[1])].spine];
  }
  for (int s = 0; s < 4; ++s) CHECK(used[s] > 60);
}

TEST_CASE("topology: NIC state and loss") {
  cluster_params p;
  p.nodes = 2;
  topology t(p);
  path const r = t.route(0, 9, 0, 9, 0);
  CHECK(t.path_up(r));
  t.set_nic_up(9, false);
  CHECK_FALSE(t.path_up(r));
  t.set_nic_up(9, true);
  t.set_nic_loss(0, 0.01);
  CHECK(t.loss(r) == doctest::Approx(0.01));
  t.set_nic_loss(9, 0.02);
  CHECK(t.loss(r) == doctest::Approx(1 - 0.99 * 0.98));
  CHECK_THROWS_AS(t.set_nic_loss(0, 1.5), std::invalid_argument);
}

TEST_CASE("loss: go-back-N goodput") {
  CHECK(go_back_n_goodput(0, 49e9, 6.8e-6, 4096) == 1.0);
  // K = 49e9 * 6.8e-6 / 4096 = 81.35 packets per round trip: (1 - p) / (1 + (K - 1) p).
  double const k = 49e9 * 6.8e-6 / 4096;
  CHECK(go_back_n_goodput(0.01, 49e9, 6.8e-6, 4096) == doctest::Approx(0.99 / (1 + (k - 1) * 0.01)));
  CHECK(go_back_n_goodput(0.01, 49e9, 6.8e-6, 4096) == doctest::Approx(0.549).epsilon(0.002));
  // Worse with more loss and with more packets in flight.
  CHECK(go_back_n_goodput(0.02, 49e9, 6.8e-6, 4096) < go_back_n_goodput(0.01, 49e9, 6.8e-6, 4096));
  CHECK(go_back_n_goodput(0.01, 49e9, 20e-6, 4096) < go_back_n_goodput(0.01, 49e9, 6.8e-6, 4096));
  CHECK(go_back_n_goodput(1.0, 49e9, 6.8e-6, 4096) == 0.0);
}
