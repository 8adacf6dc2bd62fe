// The CPU engine against references on random data: a pairwise-covering sample of
// (collective/schedule, op, dtype, ranks, VTs, count), plus seeded random cases.
//
// Matrix: plan (15 collective/schedule pairs) × op {sum, prod, min, max, avg} × dtype (6) ×
// ranks 1..8 × VTs 1..8 × count {0, 1, 7, 1000, 4097, 65537, 1000003}. The full product is
// 15·5·6·8·8·7 ≈ 200k runs; the test covers every pair of parameter values at least once (op only
// with the reducing plans), chosen greedily from a fixed seed (about 130 cases), plus 24 seeded
// random cases with random FIFO geometry, tiles and all-to-all relays. Each case runs two
// collectives on one communicator (the second on the split the allocator moved to):
//  1. data on which every fold order gives the same bits, checked against the naive reference;
//  2. general random data, checked bit for bit against the sequential replay of the same schedule
//     (counts up to 70k; above, exact data again).
// Both references fold with the arithmetic of support.hpp (ref_combine), written independently of
// the engine's reccl/cpu/numeric.hpp.
// Outputs are poisoned before each run. bench/cpu/cpu_sweep.cpp runs the full product by hand.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <array>
#include <set>

#include "support.hpp"

using namespace reccl_test;

namespace {

constexpr redop ops[] = {redop::sum, redop::prod, redop::min, redop::max, redop::avg};
constexpr std::uint64_t counts[] = {0, 1, 7, 1000, 4097, 65537, 1000003};

struct case_params {
  plan pl = plan::ar_ring;
  redop op = redop::sum;
  dtype type = dtype::float32;
  int nranks = 1, n_vts = 1;
  std::uint64_t count = 0;
  // geometry
  int slots = 4;
  std::size_t slot_bytes = 16384;
  std::uint64_t tile = 1024;
  int root = 0;
  bool relays = false;
  std::uint64_t seed = 1;
};

std::string describe(case_params const& c) {
  return std::string(plan_name(c.pl)) + " op=" + std::string(name(c.op)) + " dtype=" + std::string(name(c.type)) +
         " ranks=" + std::to_string(c.nranks) + " vts=" + std::to_string(c.n_vts) + " count=" + std::to_string(c.count) +
         " slots=" + std::to_string(c.slots) + "x" + std::to_string(c.slot_bytes) + " tile=" + std::to_string(c.tile) +
         " root=" + std::to_string(c.root) + (c.relays ? " relays" : "") + " seed=" + std::to_string(c.seed);
}

template <collective Kind, class S, class T>
void run_case(case_params const& c) {
  INFO(describe(c));
  std::mt19937_64 g(c.seed);
  cpu::config cfg;
  cfg.nranks = c.nranks;
  cfg.n_vts = c.n_vts;
  cfg.slots = c.slots;
  cfg.slot_bytes = c.slot_bytes;
  cfg.tile = c.tile;
  cfg.granule = 1;  // odd block boundaries
  cfg.poison_internal = true;
  cfg.wait_timeout_ns = 5'000'000'000;  // a loaded CI machine must not look like a dead VT here
  if (c.relays && c.nranks >= 3) {
    int const k = 1 + static_cast<int>(g() % 3);
    for (int i = 0; i < k; ++i) {
      schedule::relay_route r;
      r.src = static_cast<std::int16_t>(g() % c.nranks);
      do r.dst = static_cast<std::int16_t>(g() % c.nranks); while (r.dst == r.src);
      do r.via = static_cast<std::int16_t>(g() % c.nranks); while (r.via == r.src || r.via == r.dst);
      r.share_ppm = static_cast<std::uint32_t>(g() % 1'000'001);
      cfg.relays.push_back(r);
    }
  }
  cpu::communicator comm(cfg);
  int const n = c.nranks;
  redop const op = reduces(Kind) ? c.op : redop::sum;
  for (int round = 0; round < 2; ++round) {
    bool const general = round == 1 && c.count <= 70000;
    CAPTURE(round);
    std::vector<std::vector<T>> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      in[r] = reccl_test::random_data<T>(g, send_len(Kind, n, c.count), op, !general);
      out[r].resize(recv_len(Kind, n, c.count));
      poison(out[r]);
    }
    std::vector<cpu::collective_result> res(static_cast<std::size_t>(n));
    comm.run_ranks([&](int r) {
      res[r] = reccl::collective_op<Kind, T, S, transport::cpu_threads, telemetry::stalls, allocator::texcp>::run(
          comm, r, in[r].data(), out[r].data(), c.count, op, c.root);
    });
    for (int r = 0; r < n; ++r) {
      CHECK(res[r].st == status::ok);
      CHECK(res[r].report.split.sum() == c.count);
      CHECK(res[r].report.split == res[0].report.split);
    }
    if (!general) {
      for (int r = 0; r < n; ++r) {
        auto const ref = reccl_test::reference<T>(Kind, n, c.root, c.count, in, op, r);
        long const d = first_difference(out[r], ref);
        CAPTURE(r);
        CAPTURE(d);
        CHECK(d == -1);
      }
    } else {
      schedule::params p{};
      p.coll = Kind;
      p.nranks = n;
      p.root = c.root;
      p.tile = c.tile;
      p.n_relays = static_cast<int>(cfg.relays.size());
      for (std::size_t k = 0; k < cfg.relays.size(); ++k) p.relays[k] = cfg.relays[k];
      S const s(p);
      std::vector<std::vector<T>> full(static_cast<std::size_t>(n));
      for (int r = 0; r < n; ++r) {
        full[r] = in[r];
        full[r].resize(static_cast<std::size_t>(s.segments(schedule::buffer::input)) * c.count);
      }
      split sp = to_split(equal_shares(1, 1), c.count, 1);
      auto const rep = schedule::replay_data<S>(p, c.count, sp, full, [op](T a, T b) { return ref_combine(op, a, b); });
      REQUIRE_MESSAGE(rep.ok(), rep.error);
      for (int r = 0; r < n; ++r) {
        auto ref = rep.output(r);
        if (reduces(Kind) && op == redop::avg)
          for (auto& x : ref) x = ref_average(x, n);
        long const d = first_difference(out[r], ref);
        CAPTURE(r);
        CAPTURE(d);
        CHECK(d == -1);
      }
    }
  }
}

void run(case_params const& c) {
  with_plan(c.pl, [&]<collective Kind, class S>() {
    with_dtype(c.type, [&]<class T>() { run_case<Kind, S, T>(c); });
  });
}

/// Tiny slots only on small messages (each slot is a round trip through the FIFO).
std::size_t slot_size(std::mt19937_64& g, std::uint64_t count) {
  if (count > 70000) return 32768;
  if (count > 2000) return std::size_t{1024} << (g() % 5);
  return std::size_t{16} << (g() % 10);
}

bool reducing(plan p) { return p <= plan::rs_two_shot; }

/// Greedy pairwise covering array over the six matrix parameters.
std::vector<case_params> pairwise_cases() {
  constexpr int n_params = 6;
  std::array<int, n_params> const sizes = {n_plans, 5, 6, 8, 8, 7};
  auto required = [&](int i, int vi, int j, int vj) {
    // (plan, op) pairs matter only for reducing plans
    if (i == 0 && j == 1) return reducing(static_cast<plan>(vi));
    (void)vj;
    return true;
  };
  std::set<std::array<int, 4>> uncovered;
  for (int i = 0; i < n_params; ++i)
    for (int j = i + 1; j < n_params; ++j)
      for (int a = 0; a < sizes[i]; ++a)
        for (int b = 0; b < sizes[j]; ++b)
          if (required(i, a, j, b)) uncovered.insert({i, a, j, b});
  auto covers = [&](std::array<int, n_params> const& v) {
    int k = 0;
    bool const red = reducing(static_cast<plan>(v[0]));
    for (int i = 0; i < n_params; ++i)
      for (int j = i + 1; j < n_params; ++j) {
        if ((i == 1 || j == 1) && !red) continue;  // op is ignored by non-reducing plans
        k += static_cast<int>(uncovered.count({i, v[i], j, v[j]}));
      }
    return k;
  };
  std::mt19937_64 g(20261130);
  std::vector<case_params> out;
  while (!uncovered.empty()) {
    std::array<int, n_params> best{};
    int best_k = -1;
    for (int t = 0; t < 300; ++t) {
      std::array<int, n_params> v{};
      for (int i = 0; i < n_params; ++i) v[i] = static_cast<int>(g() % sizes[i]);
      if (t == 0) {  // seed the candidate set with one uncovered pair
        auto const& u = *uncovered.begin();
        v[u[0]] = u[1];
        v[u[2]] = u[3];
        if (u[0] == 1 || u[2] == 1) v[0] = static_cast<int>(g() % 7);  // a reducing plan
      }
      int const k = covers(v);
      if (k > best_k) best_k = k, best = v;
    }
    bool const red = reducing(static_cast<plan>(best[0]));
    for (int i = 0; i < n_params; ++i)
      for (int j = i + 1; j < n_params; ++j)
        if (!((i == 1 || j == 1) && !red)) uncovered.erase({i, best[i], j, best[j]});
    case_params c;
    c.pl = static_cast<plan>(best[0]);
    c.op = ops[best[1]];
    c.type = all_dtypes[best[2]];
    c.nranks = 1 + best[3];
    c.n_vts = 1 + best[4];
    c.count = counts[best[5]];
    c.seed = g();
    c.root = static_cast<int>(g() % c.nranks);
    c.tile = 1 + g() % 3000;
    // small slots on small messages exercise slots that span pieces and long slot sequences
    c.slot_bytes = slot_size(g, c.count);
    c.slots = 1 + static_cast<int>(g() % 6);
    out.push_back(c);
  }
  return out;
}

}  // namespace

TEST_CASE("sampled matrix: every pair of parameter values, checked against references") {
  auto const cases = pairwise_cases();
  MESSAGE("pairwise cases: " << cases.size());
  CHECK(cases.size() < 200);
  for (auto const& c : cases) {
    auto t0 = cpu::now_ns();
    run(c);
    if (std::getenv("RECCL_TEST_TIMES")) MESSAGE(describe(c) << " : " << (cpu::now_ns() - t0) / 1000000 << " ms");
  }
}

TEST_CASE("seeded random cases") {
  std::mt19937_64 g(7);
  for (int k = 0; k < 24; ++k) {
    case_params c;
    c.pl = static_cast<plan>(g() % n_plans);
    c.op = ops[g() % 5];
    c.type = all_dtypes[g() % 6];
    c.nranks = 1 + static_cast<int>(g() % 8);
    c.n_vts = 1 + static_cast<int>(g() % 8);
    c.count = g() % 3 == 0 ? g() % 20 : g() % 50000;
    c.seed = g();
    c.root = static_cast<int>(g() % c.nranks);
    c.tile = 1 + g() % 4096;
    c.slot_bytes = slot_size(g, c.count);
    c.slots = 1 + static_cast<int>(g() % 8);
    c.relays = g() % 2 == 0;
    run(c);
  }
}
