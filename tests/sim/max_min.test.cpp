// Max-min solver: hand-checked allocations, and on random instances the two properties that define
// max-min fairness (feasibility, and a saturated bottleneck for every flow on which it is largest).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <reccl_sim/max_min.hpp>
#include <reccl_sim/rng.hpp>

using namespace reccl_sim;

namespace {

path make_path(std::initializer_list<int> links) {
  path p;
  for (int l : links) p.push(l);
  return p;
}

constexpr double inf = std::numeric_limits<double>::infinity();

}  // namespace

TEST_CASE("max-min: the textbook example") {
  // Links 0 (cap 10) and 1 (cap 4). Flow A crosses both, B only link 0, C only link 1.
  // Link 1 is the bottleneck of A and C (2 each); B takes what is left of link 0 (8).
  std::vector<double> cap{10, 4};
  std::vector<path> paths{make_path({0, 1}), make_path({0}), make_path({1})};
  std::vector<double> caps{inf, inf, inf}, rate;
  max_min_solver s;
  s.solve(cap, paths, caps, rate);
  CHECK(rate[0] == doctest::Approx(2));
  CHECK(rate[1] == doctest::Approx(8));
  CHECK(rate[2] == doctest::Approx(2));
}

TEST_CASE("max-min: caps, dead links and local flows") {
  std::vector<double> cap{9, 0};
  std::vector<path> paths{make_path({0}), make_path({0}), make_path({0}), make_path({1}), path{}};
  std::vector<double> caps{1.5, inf, inf, inf, 7.0}, rate;
  max_min_solver s;
  s.solve(cap, paths, caps, rate);
  CHECK(rate[0] == doctest::Approx(1.5));  // its own cap
  CHECK(rate[1] == doctest::Approx(3.75)); // (9 - 1.5) / 2
  CHECK(rate[2] == doctest::Approx(3.75));
  CHECK(rate[3] == 0.0);                   // dead link
  CHECK(rate[4] == 7.0);                   // no link: its cap
}

TEST_CASE("max-min: random instances are feasible and every flow has a bottleneck") {
  rng r(42);
  max_min_solver s;
  for (int trial = 0; trial < 200; ++trial) {
    int const nl = 3 + static_cast<int>(r.next() % 30), nf = 1 + static_cast<int>(r.next() % 60);
    std::vector<double> cap(static_cast<std::size_t>(nl));
    for (auto& c : cap) c = 1 + 99 * r.uniform();
    std::vector<path> paths(static_cast<std::size_t>(nf));
    std::vector<double> caps(static_cast<std::size_t>(nf), inf), rate;
    for (int f = 0; f < nf; ++f) {
      int const hops = 1 + static_cast<int>(r.next() % static_cast<std::uint64_t>(std::min(5, nl)));
      std::vector<int> ls;
      while (static_cast<int>(ls.size()) < hops) {
        int const l = static_cast<int>(r.next() % static_cast<std::uint64_t>(nl));
        if (std::find(ls.begin(), ls.end(), l) == ls.end()) ls.push_back(l);
      }
      for (int l : ls) paths[static_cast<std::size_t>(f)].push(l);
      if (r.uniform() < 0.3) caps[static_cast<std::size_t>(f)] = 50 * r.uniform() + 0.1;
    }
    s.solve(cap, paths, caps, rate);
    std::vector<double> load(static_cast<std::size_t>(nl), 0.0);
    for (int f = 0; f < nf; ++f) {
      REQUIRE(rate[static_cast<std::size_t>(f)] >= 0);
      REQUIRE(rate[static_cast<std::size_t>(f)] <= caps[static_cast<std::size_t>(f)] * (1 + 1e-9));
      for (int h = 0; h < paths[static_cast<std::size_t>(f)].n; ++h)
        load[static_cast<std::size_t>(paths[static_cast<std::size_t>(f)].link[h])] += rate[static_cast<std::size_t>(f)];
    }
    for (int l = 0; l < nl; ++l) REQUIRE(load[static_cast<std::size_t>(l)] <= cap[static_cast<std::size_t>(l)] * (1 + 1e-9));
    // Each flow is at its cap, or crosses a saturated link on which no flow gets more than it.
    for (int f = 0; f < nf; ++f) {
      double const x = rate[static_cast<std::size_t>(f)];
      if (x >= caps[static_cast<std::size_t>(f)] * (1 - 1e-9)) continue;
      bool has_bottleneck = false;
      for (int h = 0; h < paths[static_cast<std::size_t>(f)].n && !has_bottleneck; ++h) {
        int const l = paths[static_cast<std::size_t>(f)].link[h];
        if (load[static_cast<std::size_t>(l)] < cap[static_cast<std::size_t>(l)] * (1 - 1e-9)) continue;
        bool largest = true;
        for (int g = 0; g < nf && largest; ++g)
          for (int k = 0; k < paths[static_cast<std::size_t>(g)].n; ++k)
            if (paths[static_cast<std::size_t>(g)].link[k] == l && rate[static_cast<std::size_t>(g)] > x * (1 + 1e-9)) largest = false;
        has_bottleneck = largest;
      }
      INFO("trial " << trial << " flow " << f);
      REQUIRE(has_bottleneck);
    }
  }
}
