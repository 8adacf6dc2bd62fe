// reccl_sim/background.hpp -- traffic of co-located jobs: flows that share the fabric with the
// collective under test.
//
//   job "GPT" (ring over its GPUs)      job "MoE" (all-to-all)          job (explicit pairs)
//   g4 ─▶ g5 ─▶ g12 ─▶ g13 ─▶ ... ─▶ g4   every ordered pair, i ≠ j      src ─▶ dst
//
//   activity per collective index e:  [from, to) window  ×  on/off chain (duty, mean on-run)
//
// Each job is a set of long-lived elastic flows (they take their max-min share of every link they
// cross, up to an optional per-flow cap) that exist while the job is active. A flow between nodes
// leaves through the sender's own NIC and enters through the receiver's (rail = GPU), with its
// own ECMP label per channel; a flow inside a node uses NVLink. Activity is decided per collective
// of the job under test -- a co-located job's communication phase (hundreds of ms in a training
// step) spans many collectives of the job under test (a few ms each) -- by a two-state chain with
// the job's duty cycle and mean on-run length, from the scenario's seed.
#pragma once

#include <climits>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "engine.hpp"
#include "rng.hpp"
#include "topology.hpp"

namespace reccl_sim {

struct background_job {
  enum class pattern : std::uint8_t { ring, all_to_all, pairs };
  std::string name;
  pattern pat = pattern::ring;
  std::vector<int> gpus;                      ///< ring order / all-to-all members (global GPU ids)
  std::vector<std::pair<int, int>> pairs;     ///< for pattern::pairs: (src GPU, dst GPU)
  int channels = 1;                           ///< parallel flows per pair, each with its own ECMP label
  double flow_cap = std::numeric_limits<double>::infinity();  ///< per-flow demand (B/s); inf: elastic
  int from = 0, to = INT_MAX;                 ///< active for collectives [from, to) ...
  double duty = 1.0;                          ///< ... a `duty` fraction of the time (on/off chain)
  double mean_on = 10;                        ///< mean length of an on-run, in collectives (duty < 1)
  int spine = -1;                             ///< >= 0: every flow crosses this spine (else ECMP)
};

/// The flows of all background jobs, per collective index. Indices must be asked in
/// non-decreasing order only for jobs with duty < 1 (their chain is stepped forward).
class background_model {
 public:
  background_model(topology const& topo, std::vector<background_job> jobs, std::uint64_t seed)
      : jobs_(std::move(jobs)) {
    for (std::size_t j = 0; j < jobs_.size(); ++j) {
      auto const& job = jobs_[j];
      if (job.channels < 1) throw std::invalid_argument("background job '" + job.name + "': channels must be >= 1");
      if (!(job.duty > 0 && job.duty <= 1)) throw std::invalid_argument("background job '" + job.name + "': duty must be in (0, 1]");
      if (job.duty < 1 && !(job.mean_on >= 1)) throw std::invalid_argument("background job '" + job.name + "': mean_on must be >= 1");
      if (!(job.flow_cap > 0)) throw std::invalid_argument("background job '" + job.name + "': flow_cap must be > 0");
      std::vector<std::pair<int, int>> pr;
      switch (job.pat) {
        case background_job::pattern::ring:
          if (job.gpus.size() < 2) throw std::invalid_argument("background job '" + job.name + "': a ring needs >= 2 GPUs");
          for (std::size_t i = 0; i < job.gpus.size(); ++i) pr.emplace_back(job.gpus[i], job.gpus[(i + 1) % job.gpus.size()]);
          break;
        case background_job::pattern::all_to_all:
          if (job.gpus.size() < 2) throw std::invalid_argument("background job '" + job.name + "': all-to-all needs >= 2 GPUs");
          for (int a : job.gpus)
            for (int b : job.gpus)
              if (a != b) pr.emplace_back(a, b);
          break;
        case background_job::pattern::pairs: pr = job.pairs; break;
      }
      std::vector<background_flow> fl;
      for (std::size_t i = 0; i < pr.size(); ++i)
        for (int c = 0; c < job.channels; ++c) {
          auto const [a, b] = pr[i];
          if (a == b) throw std::invalid_argument("background job '" + job.name + "': a flow from a GPU to itself");
          std::uint64_t const label = hash_mix(0xb0b0 + j, static_cast<std::uint64_t>(c), i);
          fl.push_back(background_flow{topo.route(a, b, a, b, label, job.spine), job.flow_cap});
        }
      flows_.push_back(std::move(fl));
      chains_.push_back(chain{rng(hash_mix(seed, 0xbac6 + j)), -1, job.duty >= 1});
    }
  }

  std::vector<background_job> const& jobs() const { return jobs_; }

  /// Whether job j is active during collective `index`.
  bool active(std::size_t j, int index) {
    auto const& job = jobs_.at(j);
    if (index < job.from || index >= job.to) return false;
    if (job.duty >= 1) return true;
    auto& c = chains_[j];
    if (index < c.index) throw std::logic_error("background_model: indices must not decrease");
    // Two-state chain with stationary on-probability `duty` and mean on-run `mean_on`:
    // P(on -> off) = 1/mean_on, P(off -> on) = duty / ((1 - duty) · mean_on).
    double const off_p = 1.0 / job.mean_on, on_p = std::min(1.0, job.duty / ((1.0 - job.duty) * job.mean_on));
    while (c.index < index) {
      if (c.index < 0) {
        c.on = c.r.uniform() < job.duty;
      } else {
        double const u = c.r.uniform();
        c.on = c.on ? !(u < off_p) : (u < on_p);
      }
      ++c.index;
    }
    return c.on;
  }

  /// All background flows active during collective `index`.
  std::vector<background_flow> const& flows(int index) {
    out_.clear();
    for (std::size_t j = 0; j < jobs_.size(); ++j)
      if (active(j, index)) out_.insert(out_.end(), flows_[j].begin(), flows_[j].end());
    return out_;
  }

 private:
  struct chain {
    rng r;
    int index;
    bool on;
  };
  std::vector<background_job> jobs_;
  std::vector<std::vector<background_flow>> flows_;
  std::vector<chain> chains_;
  std::vector<background_flow> out_;
};

}  // namespace reccl_sim
