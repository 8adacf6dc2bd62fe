// reccl_sim/max_min.hpp -- max-min fair rates for flows sharing directed links (progressive filling).
//
//   rate ▲                     every unfrozen flow rises at the same pace ("water level");
//        │        ┌── cap       a link whose remaining capacity / unfrozen flows reaches the level
//        │   ┌────┘             freezes its flows there (it is their bottleneck); a flow whose own
//        │───┘ link A full      cap is reached freezes too. Repeat until every flow is frozen.
//        └──────────────▶ time (of the filling, not of the simulation)
//
// The result is the unique max-min fair allocation (Bertsekas & Gallager, Data Networks, 2nd ed.,
// §6.5.2): no flow can get more without taking from a flow that has no more. Link shares sit in a
// min-heap (stale entries skipped by version), so one solve costs O((links + Σ path lengths) ·
// log links); the simulator solves once per change of the flow set (a VT finishing a phase, a
// background job starting), never per packet or per ring step.
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

    // Fair share of every link in a min-heap; an entry is stale once its link changed (version).
    ver_.assign(nl, 0);
    dirty_.assign(nl, 0);
    heap_.clear();
    auto share = [&](std::size_t l) { return std::max(0.0, capacity[l] - used_[l]) / cnt_[l]; };
    for (std::uint32_t l : active_) heap_.push_back({share(l), l, 0});
    std::make_heap(heap_.begin(), heap_.end(), later);
    touched_.clear();
    auto freeze = [&](std::uint32_t f, double r) {
      frozen_[f] = 1;
      rate[f] = r;
      --unfrozen;
      for (int h = 0; h < paths[f].n; ++h) {
        auto const l = static_cast<std::size_t>(paths[f].link[h]);
        --cnt_[l];
        used_[l] += r;
        if (!dirty_[l]) {
          dirty_[l] = 1;
          touched_.push_back(static_cast<std::uint32_t>(l));
        }
      }
    };
    auto republish = [&]() {  // one fresh heap entry per link changed by the last batch
      for (std::uint32_t l : touched_) {
        dirty_[l] = 0;
        ++ver_[l];
        if (cnt_[l] > 0) {
          heap_.push_back({share(l), l, ver_[l]});
          std::push_heap(heap_.begin(), heap_.end(), later);
        }
      }
      touched_.clear();
    };

    while (unfrozen > 0) {
      while (!heap_.empty() && (heap_.front().ver != ver_[heap_.front().link] || cnt_[heap_.front().link] == 0)) {
        std::pop_heap(heap_.begin(), heap_.end(), later);
        heap_.pop_back();
      }
      double const link_level = heap_.empty() ? inf : heap_.front().share;
      while (ci < by_cap_.size() && frozen_[by_cap_[ci]]) ++ci;
      if (ci < by_cap_.size() && caps[by_cap_[ci]] <= link_level * (1.0 + rel_tol) + abs_tol) {
        // Every flow capped below the lowest link share stops at its cap. Freezing a flow below a
        // link's fair share only raises that share, so the whole batch is safe at once.
        double const thr = link_level * (1.0 + rel_tol) + abs_tol;
        for (; ci < by_cap_.size() && (frozen_[by_cap_[ci]] || caps[by_cap_[ci]] <= thr); ++ci)
          if (!frozen_[by_cap_[ci]]) freeze(by_cap_[ci], std::min(caps[by_cap_[ci]], link_level));
        republish();
        continue;
      }
      if (heap_.empty()) break;  // unreachable: every unfrozen flow crosses a link
      auto const top = heap_.front();
      std::pop_heap(heap_.begin(), heap_.end(), later);
      heap_.pop_back();
      // The bottleneck: every unfrozen flow of this link gets its fair share.
      for (std::uint32_t k = start_[top.link]; k < start_[top.link + 1]; ++k)
        if (!frozen_[adj_[k]]) freeze(adj_[k], top.share);
      republish();
    }
  }

  static constexpr double inf = std::numeric_limits<double>::infinity();
  static constexpr double rel_tol = 1e-12;
  static constexpr double abs_tol = 1e-9;  ///< bytes per second: far below anything simulated

 private:
  struct entry {
    double share;
    std::uint32_t link, ver;
  };
  static bool later(entry const& a, entry const& b) {  // min-heap by share, ties to the lower link id
    return a.share > b.share || (a.share == b.share && a.link > b.link);
  }
  std::vector<std::uint8_t> frozen_, dirty_;
  std::vector<std::uint32_t> cnt_, start_, fill_, adj_, active_, by_cap_, touched_, ver_;
  std::vector<double> used_;
  std::vector<entry> heap_;
};

}  // namespace reccl_sim
