// reccl_sim/max_min.hpp -- max-min fair rates for flows sharing directed links (progressive filling).
//
//   rate ▲                     every unfrozen flow rises at the same pace ("water level");
//        │        ┌── cap       a link whose remaining capacity / unfrozen flows reaches the level
//        │   ┌────┘             freezes its flows there (it is their bottleneck); a flow whose own
//        │───┘ link A full      cap is reached freezes too. Repeat until every flow is frozen.
//        └──────────────▶ time (of the filling, not of the simulation)
//
// The result is the unique max-min fair allocation (Bertsekas & Gallager, Data Networks, 2nd ed.,
// §6.5.2): no flow can get more without taking from a flow that has no more. One solve costs
// O(levels × active links + Σ path lengths); the simulator solves once per change of the flow set
// (a VT finishing a phase, a background job starting), never per packet or per ring step.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <vector>

#include "topology.hpp"

namespace reccl_sim {

/// Reusable max-min solver (keeps its buffers between solves; not thread-safe).
class max_min_solver {
 public:
  /// Computes rate[f] for flows f with paths[f] and rate caps caps[f] (+inf: none) over links with
  /// capacities `capacity` (0 for a dead link). A flow with an empty path gets its cap (or +inf).
  void solve(std::vector<double> const& capacity, std::vector<path> const& paths, std::vector<double> const& caps,
             std::vector<double>& rate) {
    std::size_t const nf = paths.size(), nl = capacity.size();
    rate.assign(nf, 0.0);
    frozen_.assign(nf, 0);
    cnt_.assign(nl, 0);
    used_.assign(nl, 0.0);
    // Link -> flows adjacency (CSR).
    start_.assign(nl + 1, 0);
    for (std::size_t f = 0; f < nf; ++f)
      for (int h = 0; h < paths[f].n; ++h) ++start_[static_cast<std::size_t>(paths[f].link[h]) + 1];
    for (std::size_t l = 0; l < nl; ++l) start_[l + 1] += start_[l];
    adj_.resize(start_[nl]);
    fill_ = start_;
    for (std::size_t f = 0; f < nf; ++f)
      for (int h = 0; h < paths[f].n; ++h) adj_[fill_[static_cast<std::size_t>(paths[f].link[h])]++] = static_cast<std::uint32_t>(f);
    active_.clear();
    for (std::size_t l = 0; l < nl; ++l) {
      cnt_[l] = start_[l + 1] - start_[l];
      if (cnt_[l] > 0) active_.push_back(static_cast<std::uint32_t>(l));
    }
    std::size_t unfrozen = nf;
    for (std::size_t f = 0; f < nf; ++f)
      if (paths[f].n == 0) {  // local: no shared resource
        rate[f] = caps[f];
        frozen_[f] = 1;
        --unfrozen;
      }
    by_cap_.clear();
    for (std::size_t f = 0; f < nf; ++f)
      if (!frozen_[f] && caps[f] < inf) by_cap_.push_back(static_cast<std::uint32_t>(f));
    std::sort(by_cap_.begin(), by_cap_.end(), [&](std::uint32_t a, std::uint32_t b) {
      return caps[a] < caps[b] || (caps[a] == caps[b] && a < b);
    });
    std::size_t ci = 0;

    auto freeze = [&](std::uint32_t f, double r) {
      frozen_[f] = 1;
      rate[f] = r;
      --unfrozen;
      for (int h = 0; h < paths[f].n; ++h) {
        auto const l = static_cast<std::size_t>(paths[f].link[h]);
        --cnt_[l];
        used_[l] += r;
      }
    };

    while (unfrozen > 0) {
      double level = inf;
      for (std::uint32_t l : active_) {
        double const share = std::max(0.0, capacity[l] - used_[l]) / cnt_[l];
        level = std::min(level, share);
      }
      while (ci < by_cap_.size() && frozen_[by_cap_[ci]]) ++ci;
      if (ci < by_cap_.size()) level = std::min(level, caps[by_cap_[ci]]);
      if (level == inf) break;  // unreachable: every unfrozen flow crosses a link
      double const thr = level * (1.0 + rel_tol) + abs_tol;
      bottleneck_.clear();
      for (std::uint32_t l : active_)
        if (std::max(0.0, capacity[l] - used_[l]) / cnt_[l] <= thr) bottleneck_.push_back(l);
      for (std::uint32_t l : bottleneck_)
        for (std::uint32_t k = start_[l]; k < start_[l + 1]; ++k)
          if (!frozen_[adj_[k]]) freeze(adj_[k], level);
      while (ci < by_cap_.size() && (frozen_[by_cap_[ci]] || caps[by_cap_[ci]] <= thr)) {
        if (!frozen_[by_cap_[ci]]) freeze(by_cap_[ci], level);
        ++ci;
      }
      std::size_t w = 0;
      for (std::uint32_t l : active_)
        if (cnt_[l] > 0) active_[w++] = l;
      active_.resize(w);
    }
  }

  static constexpr double inf = std::numeric_limits<double>::infinity();
  static constexpr double rel_tol = 1e-12;
  static constexpr double abs_tol = 1e-9;  ///< bytes per second: far below anything simulated

 private:
  std::vector<std::uint8_t> frozen_;
  std::vector<std::uint32_t> cnt_, start_, fill_, adj_, active_, by_cap_, bottleneck_;
  std::vector<double> used_;
};

}  // namespace reccl_sim
