// reccl_sim/engine.hpp -- one collective on the modelled cluster, at flow level.
//
//   split (from the allocator)      compiled plan (from the schedule)       topology + background
//        │ VT i: block [b_i, e_i)        │ phases of (sender, receiver) flows        │ link states
//        ▼                               ▼                                           ▼
//   ┌──────────────────────────────────────────────────────────────────────────────────────────┐
//   │ per VT: phase p, flow f carries B_f = Σ chunk_length(chunk, block) × element size bytes   │
//   │ event loop:  max-min solve over all active flows (+ background) ──▶ rate_f                │
//   │              VT progress  p_v = min_f goodput_f / B_f   (the VT's flows move in lockstep: │
//   │                                                          a ring runs at its slowest hop)  │
//   │              phase time   D_v = L_v + 1/p_v,  L_v = steps × (max path latency + overhead) │
//   │              advance to the next VT phase completion, re-solve                            │
//   └──────────────────────────────────────────────────────────────────────────────────────────┘
//        ▼
//   per-VT completion time (the collective's is the slowest VT's), bytes, per-link bytes
//
// Granularity: never per step or packet. Event-driven (default): one max-min solve per change of
// the set of flows -- a VT finishing a phase -- so a 2(N−1)-step ring costs one solve per VT and a
// finished VT's bandwidth goes to the others at once. Per phase (engine_options::per_phase): one
// solve per schedule phase with every VT in it, each VT's phase lasting L + 1/p at those rates --
// fewer solves for schedules with many phases (a pipelined tree) at large scale. Flows of one VT phase are
// coupled: a flow that is faster than its VT's bottleneck only moves B_f × p_v bytes per second,
// so after a solve it is capped at that demand and the solve is repeated (coupling_rounds times)
// to hand the bandwidth it cannot use to other flows. A flow on a lossy path delivers
// goodput = rate × go_back_n_goodput(...) (loss.hpp); its retransmissions still load every link
// it crosses. A VT that needs a flow across a dead link cannot finish: it is reported `stuck`
// with the fraction of its bytes delivered, and the driver applies the deadline and recovery.
//
// The step latency model is the α–β model's: every step of a phase pays the slowest path's
// latency plus a per-step overhead; bandwidth terms add up per flow. For an uncontended ring this
// is exactly T = 2(N−1)·α + 2(N−1)/N · S/B.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <reccl/config.hpp>
#include <reccl/policy/split.hpp>

#include "loss.hpp"
#include "max_min.hpp"
#include "plan.hpp"
#include "rng.hpp"
#include "topology.hpp"

namespace reccl_sim {

/// Which NIC a transfer between nodes uses.
///  * per_vt: VT v leaves and enters every node through the NIC of the (v mod m)-th member GPU of
///    that node (members in local order, m of them), reaching it over NVLink when the sender is
///    another GPU (as NCCL's PXN does). The transport pins each VT to one NIC: with 8 members and 8
///    VTs, one VT per NIC (PReCCL's setup); with one member, every VT shares its NIC.
///  * sender: every GPU uses its own NIC, on both ends (a schedule that spreads traffic over local
///    ranks itself, e.g. multi-rail broadcast, all-to-all).
enum class rail_policy : std::uint8_t { per_vt, sender };

/// Where a communicator's ranks sit and how its VTs map onto rails.
class comm_layout {
 public:
  comm_layout(topology const& topo, std::vector<int> rank_gpu, int n_vts, std::uint64_t label = 0,
              rail_policy rails = rail_policy::per_vt)
      : rank_gpu_(std::move(rank_gpu)), n_vts_(n_vts), label_(label), rails_(rails) {
    if (rank_gpu_.empty()) throw std::invalid_argument("communicator has no ranks");
    if (n_vts < 1 || n_vts > reccl::max_vts)
      throw std::invalid_argument("VT count " + std::to_string(n_vts) + " outside [1, " + std::to_string(reccl::max_vts) + "]");
    members_.assign(static_cast<std::size_t>(topo.params().nodes), {});
    std::vector<char> seen(static_cast<std::size_t>(topo.gpus()), 0);
    for (int g : rank_gpu_) {
      if (g < 0 || g >= topo.gpus()) throw std::invalid_argument("rank placed on GPU " + std::to_string(g) + ", which does not exist");
      if (seen[static_cast<std::size_t>(g)]) throw std::invalid_argument("two ranks placed on GPU " + std::to_string(g));
      seen[static_cast<std::size_t>(g)] = 1;
      members_[static_cast<std::size_t>(topo.node_of(g))].push_back(g);
    }
    for (auto& m : members_) std::sort(m.begin(), m.end());
  }
  int nranks() const { return static_cast<int>(rank_gpu_.size()); }
  int n_vts() const { return n_vts_; }
  int gpu(int rank) const { return rank_gpu_.at(static_cast<std::size_t>(rank)); }
  std::uint64_t label() const { return label_; }
  rail_policy rails() const { return rails_; }
  std::vector<int> const& member_gpus(int node) const { return members_.at(static_cast<std::size_t>(node)); }
  /// The GPU whose NIC VT `vt` uses on `node` under rail_policy::per_vt (node must host a rank).
  int rail_gpu(int node, int vt) const {
    auto const& m = members_.at(static_cast<std::size_t>(node));
    if (m.empty()) throw std::logic_error("rail_gpu: node hosts no rank");
    return m[static_cast<std::size_t>(vt) % m.size()];
  }
  /// The path of VT `vt`'s transfer from rank a to rank b.
  path route(topology const& topo, int a, int b, int vt) const {
    int const ga = gpu(a), gb = gpu(b);
    std::uint64_t const lab = hash_mix(label_, static_cast<std::uint64_t>(vt), static_cast<std::uint64_t>(a),
                                       static_cast<std::uint64_t>(b));
    if (rails_ == rail_policy::sender) return topo.route(ga, gb, ga, gb, lab);
    return topo.route(ga, gb, rail_gpu(topo.node_of(ga), vt), rail_gpu(topo.node_of(gb), vt), lab);
  }

 private:
  std::vector<int> rank_gpu_;
  int n_vts_;
  std::uint64_t label_;
  rail_policy rails_;
  std::vector<std::vector<int>> members_;
};

/// A flow of another job sharing the fabric (elastic up to `cap`).
struct background_flow {
  path route;
  double cap = std::numeric_limits<double>::infinity();
};

struct engine_options {
  /// Per-step cost on top of the slowest path's latency: the receiver sees the flag, and the credit
  /// goes back (one flag write each way inside a node, ~1 µs).
  double step_overhead = 1.0e-6;
  /// Extra solves that hand bandwidth a VT's non-bottleneck flows cannot use to other flows.
  int coupling_rounds = 2;
  /// Accumulate wire bytes per link (needed for the dead-NIC and conservation checks).
  bool link_accounting = true;
  /// false (default): event driven -- re-solve whenever a VT finishes a phase, so bandwidth a
  /// finished VT leaves is picked up by the others at once. true: one solve per schedule phase with
  /// every VT in it (each VT's phase then lasts L + 1/p at those rates; a VT that finishes early does
  /// not hand its bandwidth on) -- cheaper for schedules with many phases at large scale.
  bool per_phase = false;
};

/// One VT's outcome in one collective.
struct vt_result {
  std::uint64_t elements = 0;     ///< elements of the VT's block
  double time = 0;                ///< completion time from the collective's start (s); +inf if stuck
  bool stuck = false;             ///< a flow it needs crosses a dead link
  double stuck_at = 0;            ///< when it stopped progressing (s), if stuck
  double bytes_sent = 0;          ///< Σ over its sends of chunk bytes (the plan)
  double bytes_delivered = 0;     ///< integrated goodput of its flows
  double bottleneck_rate = 0;     ///< goodput of its slowest flow in its last bandwidth-bound phase (B/s)
};

struct collective_result {
  double time = 0;  ///< slowest VT's completion time; +inf if any VT is stuck
  int n_vts = 0;
  vt_result vt[reccl::max_vts] = {};
  double bytes_sent = 0, bytes_delivered = 0, bytes_received = 0;  ///< all VTs; received = receivers' declared chunks
  std::vector<double> rank_vt_bytes;  ///< [rank × n_vts + vt]: bytes rank sent in VT vt
  std::vector<double> link_bytes;     ///< wire bytes per link (retransmissions included), this collective only
  int solves = 0;
  bool any_stuck() const {
    for (int v = 0; v < n_vts; ++v)
      if (vt[v].stuck) return true;
    return false;
  }
};

/// Simulates collectives of one compiled plan for one communicator layout. Routes and step
/// latencies are computed once; each run() takes the current link states of the topology.
class collective_engine {
 public:
  collective_engine(topology const& topo, compiled_plan const& plan, comm_layout const& comm, engine_options opt = {})
      : topo_(&topo), plan_(&plan), comm_(&comm), opt_(opt) {
    if (plan.nranks != comm.nranks())
      throw std::invalid_argument("plan has " + std::to_string(plan.nranks) + " ranks, communicator " +
                                  std::to_string(comm.nranks()));
    int const nv = comm.n_vts();
    std::fill(std::begin(vt_cap_), std::end(vt_cap_), std::numeric_limits<double>::infinity());
    routes_.resize(plan.phases.size());
    latency_.resize(plan.phases.size());
    for (std::size_t ph = 0; ph < plan.phases.size(); ++ph) {
      auto const& P = plan.phases[ph];
      routes_[ph].resize(static_cast<std::size_t>(nv));
      latency_[ph].assign(static_cast<std::size_t>(nv), 0.0);
      for (int v = 0; v < nv; ++v) {
        auto& rs = routes_[ph][static_cast<std::size_t>(v)];
        rs.reserve(P.flows.size());
        double worst = 0;
        for (auto const& [a, b] : P.flows) {
          rs.push_back(comm.route(topo, a, b, v));
          worst = std::max(worst, topo.latency(rs.back()));
        }
        latency_[ph][static_cast<std::size_t>(v)] = P.n_steps * (worst + opt.step_overhead);
      }
    }
  }

  /// Caps every flow of VT `vt` at `rate` B/s (+inf: no cap): a VT slowed by its own engine (the
  /// GPU control-loop demo throttles a VT in software), not by the network.
  void set_vt_cap(int vt, double rate) {
    check_vt(vt);
    if (!(rate > 0)) throw std::invalid_argument("VT rate cap must be > 0 (use set_vt_dead for a dead VT)");
    vt_cap_[vt] = rate;
  }
  /// Marks VT `vt` dead (its engine stops moving data) or alive again.
  void set_vt_dead(int vt, bool dead) {
    check_vt(vt);
    vt_dead_ = dead ? (vt_dead_ | (1u << vt)) : (vt_dead_ & ~(1u << vt));
  }
  double vt_cap(int vt) const { return vt_cap_[vt]; }
  bool vt_dead(int vt) const { return (vt_dead_ >> vt) & 1u; }

  compiled_plan const& plan() const { return *plan_; }
  comm_layout const& comm() const { return *comm_; }
  /// Route of flow f of phase ph for VT v.
  path const& route(std::size_t ph, int v, std::size_t f) const { return routes_[ph][static_cast<std::size_t>(v)][f]; }
  /// Latency part of phase ph for VT v (s).
  double phase_latency(std::size_t ph, int v) const { return latency_[ph][static_cast<std::size_t>(v)]; }

  /// Runs one collective with split `sp` (counts in elements of `elem_bytes` bytes each) while the
  /// background flows `bg` share the fabric.
  collective_result run(reccl::split const& sp, std::size_t elem_bytes, std::vector<background_flow> const& bg = {}) {
    int const nv = comm_->n_vts();
    if (sp.n_vts != nv)
      throw std::invalid_argument("split has " + std::to_string(sp.n_vts) + " VTs, communicator " + std::to_string(nv));
    if (elem_bytes == 0) throw std::invalid_argument("element size must be > 0");
    auto const& topo = *topo_;
    auto const& plan = *plan_;
    std::size_t const nph = plan.phases.size();
    collective_result res;
    res.n_vts = nv;
    res.rank_vt_bytes.assign(static_cast<std::size_t>(plan.nranks) * static_cast<std::size_t>(nv), 0.0);
    if (opt_.link_accounting) res.link_bytes.assign(topo.num_links(), 0.0);

    // Per VT and phase: bytes of each flow (the schedule's chunk lengths on the VT's block).
    std::uint64_t const count = sp.total;
    for (int v = 0; v < nv; ++v) {
      auto& st = vts_[v];
      st = vt_state{};
      std::uint64_t const n = sp.live(v) ? sp.count[v] : 0;
      res.vt[v].elements = n;
      if (n == 0) {
        st.done = true;
        continue;
      }
      std::uint64_t const b = sp.offset(v);
      auto const len = plan.key_lengths(sched::block{b, b + n}, count);
      st.bytes.resize(nph);
      for (std::size_t ph = 0; ph < nph; ++ph) {
        auto const& P = plan.phases[ph];
        auto& B = st.bytes[ph];
        B.assign(P.flows.size(), 0.0);
        for (std::size_t f = 0; f < P.flows.size(); ++f) {
          std::uint64_t e = 0, er = 0;
          for (std::uint32_t k = P.send_begin[f]; k < P.send_begin[f + 1]; ++k) e += len[P.send_keys[k]];
          for (std::uint32_t k = P.recv_begin[f]; k < P.recv_begin[f + 1]; ++k) er += len[P.recv_keys[k]];
          B[f] = static_cast<double>(e) * static_cast<double>(elem_bytes);
          res.vt[v].bytes_sent += B[f];
          res.bytes_received += static_cast<double>(er) * static_cast<double>(elem_bytes);
          res.rank_vt_bytes[static_cast<std::size_t>(P.flows[f].first) * static_cast<std::size_t>(nv) +
                            static_cast<std::size_t>(v)] += B[f];
        }
      }
      res.bytes_sent += res.vt[v].bytes_sent;
    }

    if (opt_.per_phase) {
      // One solve per schedule phase with every VT in it; a VT's phase lasts L + 1/p at those rates.
      double clock[reccl::max_vts] = {};
      for (std::size_t ph = 0; ph < nph; ++ph) {
        for (int v = 0; v < nv; ++v) vts_[v].ph = ph;
        if (!gather_and_solve(clock, bg, res)) break;
        for (int v = 0; v < nv; ++v) {
          auto& st = vts_[v];
          if (st.done || st.stuck) continue;
          if (st.duration == max_min_solver::inf) {
            mark_stuck(v, clock[v], res);
            continue;
          }
          advance(v, 1.0, res);
          clock[v] += st.duration;
          if (ph + 1 == nph) {
            st.done = true;
            res.vt[v].time = clock[v];
          }
        }
      }
    } else {
      // Event driven: re-solve whenever a VT finishes a phase.
      double t = 0;
      double clock[reccl::max_vts] = {};
      for (;;) {
        for (int v = 0; v < nv; ++v) clock[v] = t;
        if (!gather_and_solve(clock, bg, res)) break;
        double dt = max_min_solver::inf;
        for (int v = 0; v < nv; ++v) {
          auto const& st = vts_[v];
          if (!st.done && !st.stuck && st.duration < max_min_solver::inf) dt = std::min(dt, st.rem * st.duration);
        }
        if (dt == max_min_solver::inf) {  // nothing can progress: everyone left is starved
          for (int v = 0; v < nv; ++v)
            if (!vts_[v].done && !vts_[v].stuck) mark_stuck(v, t, res);
          break;
        }
        t += dt;
        for (int v = 0; v < nv; ++v) {
          auto& st = vts_[v];
          if (st.done || st.stuck || st.duration == max_min_solver::inf) continue;
          double const frac = st.duration > 0 ? std::min(st.rem, dt / st.duration) : st.rem;
          advance(v, frac, res);
          st.rem -= frac;
          if (st.rem <= 1e-12 || (st.duration > 0 && st.rem * st.duration <= 1e-15)) {
            st.rem = 1.0;
            ++st.ph;
            if (st.ph >= nph) {
              st.done = true;
              res.vt[v].time = t;
            }
          }
        }
      }
    }
    res.time = 0;
    for (int v = 0; v < nv; ++v) {
      res.bytes_delivered += res.vt[v].bytes_delivered;
      res.time = std::max(res.time, res.vt[v].time);
    }
    return res;
  }

 private:
  void mark_stuck(int v, double at, collective_result& res) {
    vts_[v].stuck = true;
    res.vt[v].stuck = true;
    res.vt[v].stuck_at = at;
    res.vt[v].time = std::numeric_limits<double>::infinity();
  }

  /// Collects the current-phase flows of every active VT (a VT that needs a dead link or whose
  /// engine is dead becomes stuck at clock[v]) plus the background, solves max-min with the
  /// coupling rounds, and sets each active VT's progress, bottleneck and phase duration. False if
  /// no VT is active.
  bool gather_and_solve(double const* clock, std::vector<background_flow> const& bg, collective_result& res) {
    auto const& topo = *topo_;
    int const nv = comm_->n_vts();
    paths_.clear();
    caps_.clear();
    owner_.clear();
    bool any_active = false;
    for (int v = 0; v < nv; ++v) {
      auto& st = vts_[v];
      if (st.done || st.stuck) continue;
      auto const& B = st.bytes[st.ph];
      auto const& rs = routes_[st.ph][static_cast<std::size_t>(v)];
      bool dead = (vt_dead_ >> v) & 1u;
      for (std::size_t f = 0; f < B.size() && !dead; ++f)
        if (B[f] > 0 && !topo.path_up(rs[f])) dead = true;
      if (dead) {
        mark_stuck(v, clock[v], res);
        continue;
      }
      any_active = true;
      st.flow_begin = paths_.size();
      for (std::size_t f = 0; f < B.size(); ++f)
        if (B[f] > 0) {
          paths_.push_back(rs[f]);
          caps_.push_back(vt_cap_[v]);
          owner_.push_back({v, static_cast<std::uint32_t>(f)});
        }
      st.flow_end = paths_.size();
    }
    if (!any_active) return false;
    std::size_t const n_vt_flows = paths_.size();
    for (auto const& b : bg) {
      paths_.push_back(b.route);
      caps_.push_back(b.cap);
    }
    capacity_.resize(topo.num_links());
    for (std::size_t l = 0; l < topo.num_links(); ++l) capacity_[l] = topo.links()[l].effective_capacity();

    solver_.solve(capacity_, paths_, caps_, rate_);
    ++res.solves;
    eff_.assign(n_vt_flows, 1.0);
    auto update_progress = [&]() {
      for (std::size_t i = 0; i < n_vt_flows; ++i) {
        path const& r = paths_[i];
        double const p = topo.loss(r);
        eff_[i] = p > 0 ? go_back_n_goodput(p, rate_[i], 2.0 * topo.latency(r), topo.params().mtu) : 1.0;
      }
      for (int v = 0; v < nv; ++v) {
        auto& st = vts_[v];
        if (st.done || st.stuck) continue;
        st.progress = max_min_solver::inf;
        for (std::size_t i = st.flow_begin; i < st.flow_end; ++i) {
          double const g = rate_[i] * eff_[i];
          double const p = g / st.bytes[st.ph][owner_[i].flow];
          if (p < st.progress) {
            st.progress = p;
            st.bottleneck = g;
          }
        }
      }
    };
    update_progress();
    for (int round = 0; round < opt_.coupling_rounds && n_vt_flows > 0; ++round) {
      bool capped = false;
      for (std::size_t i = 0; i < n_vt_flows; ++i) {
        auto const& st = vts_[owner_[i].vt];
        double const need = st.progress * st.bytes[st.ph][owner_[i].flow] / std::max(eff_[i], 1e-300);
        if (rate_[i] > need * (1.0 + 1e-9)) {
          caps_[i] = std::min(need, vt_cap_[owner_[i].vt]);
          capped = true;
        } else {
          caps_[i] = vt_cap_[owner_[i].vt];
        }
      }
      if (!capped) break;
      solver_.solve(capacity_, paths_, caps_, rate_);
      ++res.solves;
      update_progress();
    }
    for (int v = 0; v < nv; ++v) {
      auto& st = vts_[v];
      if (st.done || st.stuck) continue;
      double const lat = latency_[st.ph][static_cast<std::size_t>(v)];
      bool const has_flows = st.flow_end > st.flow_begin;
      if (has_flows && !(st.progress > 0)) {
        st.duration = max_min_solver::inf;  // a flow with zero rate (zero-capacity link)
        continue;
      }
      st.duration = lat + (has_flows ? 1.0 / st.progress : 0.0);
      if (has_flows) res.vt[v].bottleneck_rate = st.bottleneck;
    }
    return true;
  }

  /// Moves fraction `frac` of VT v's current phase: its flows deliver frac × B_f, and every link
  /// they cross carries that divided by the flow's goodput fraction (retransmissions).
  void advance(int v, double frac, collective_result& res) {
    auto const& st = vts_[v];
    for (std::size_t i = st.flow_begin; i < st.flow_end; ++i) {
      double const moved = st.bytes[st.ph][owner_[i].flow] * frac;
      res.vt[v].bytes_delivered += moved;
      if (opt_.link_accounting) {
        double const wire = moved / std::max(eff_[i], 1e-300);
        for (int h = 0; h < paths_[i].n; ++h) res.link_bytes[static_cast<std::size_t>(paths_[i].link[h])] += wire;
      }
    }
  }

  struct vt_state {
    std::vector<std::vector<double>> bytes;  ///< [phase][flow]
    std::size_t ph = 0;
    double rem = 1.0;  ///< fraction of the current phase still to go
    bool done = false, stuck = false;
    std::size_t flow_begin = 0, flow_end = 0;  ///< its flows in the current solve
    double progress = 0;  ///< phases per second, bandwidth part
    double bottleneck = 0;  ///< goodput of the flow that sets `progress` (B/s)
    double duration = 0;  ///< of the current phase at the current rates
  };
  struct flow_owner {
    int vt;
    std::uint32_t flow;
  };

  void check_vt(int vt) const {
    if (vt < 0 || vt >= comm_->n_vts())
      throw std::invalid_argument("VT " + std::to_string(vt) + " outside [0, " + std::to_string(comm_->n_vts()) + ")");
  }

  topology const* topo_;
  compiled_plan const* plan_;
  comm_layout const* comm_;
  engine_options opt_;
  std::vector<std::vector<std::vector<path>>> routes_;  ///< [phase][vt][flow]
  std::vector<std::vector<double>> latency_;            ///< [phase][vt]
  vt_state vts_[reccl::max_vts];
  double vt_cap_[reccl::max_vts] = {};  ///< +inf: no cap (set in the constructor)
  std::uint32_t vt_dead_ = 0;
  max_min_solver solver_;
  std::vector<path> paths_;
  std::vector<double> caps_, rate_, eff_, capacity_;
  std::vector<flow_owner> owner_;
};

}  // namespace reccl_sim
