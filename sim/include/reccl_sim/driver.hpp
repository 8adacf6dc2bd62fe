// reccl_sim/driver.hpp -- reccl's own control loop driving simulated collectives.
//
//   epoch e                                                                    epoch e+1
//   reccl::control<A>::split_for ──▶ engine.run(split) ──▶ per-VT times, bytes
//        ▲                               │ stuck VT? ── deadline ──▶ live VTs finish its range
//        │                               │ probe_mask? ── probe the masked VTs' paths
//        │                               ▼
//        │              telemetry: each rank's time × (1 + σ·N(0,1)) ──▶ stall counts
//        │              (a stall = one failed credit poll; see stall_model)
//        │                               ▼
//        └──── control.step() ◀── epoch_record per rank (control.record: digest, checksum)
//              (combine: max over ranks of the cost model; fault ⇒ mask; probe ⇒ rejoin;
//               otherwise Allocator::update)
//
// Nothing of the control logic is re-implemented here: the split, the records and their checks,
// the cost-model evaluation, masking, probing, rejoining and the allocator update are the calls a
// GPU or CPU engine makes (reccl/policy/control.hpp). What the simulator supplies is what the
// hardware would: times, the stall counts they imply, fault bits when a VT misses its deadline,
// probe results.
//
// Rank counts above reccl::max_ranks (64, the size of an epoch record set): the records are
// formed per group of ceil(N / 64) consecutive ranks, each carrying, per VT, the counts of the
// group member whose cost-model time is largest. combine() takes the maximum over records, so
// the per-VT estimate it passes to the allocator is exactly the maximum over all N ranks; only the
// summed byte and stall counts in the report cover the representatives.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <reccl/policy/allocator/allocator.hpp>
#include <reccl/policy/control.hpp>
#include <reccl/policy/epoch.hpp>
#include <reccl/policy/telemetry/cost_model.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>
#include <reccl/types.hpp>

#include "background.hpp"
#include "engine.hpp"
#include "rng.hpp"

namespace reccl_sim {

/// How the simulated hardware produces the counters the telemetry reads.
///
/// A VT's sender pushes its bytes into a FIFO at `push_rate` when nothing downstream is slow; the
/// rest of the VT's time, beyond its fixed latency part, it waits for credit, polling once every
/// `poll_ns`: stalls = (T̂ − latency − bytes / push_rate) / poll_ns, where T̂ is the rank's time as
/// the hardware experienced it, T × (1 + noise·N(0,1)) -- the noise stands for everything the
/// counters do not explain (PReCCL's fitted model explains 94% of the variance of sub-task times).
struct stall_model {
  double noise = 0.03;       ///< relative σ of each rank's per-VT time
  double poll_ns = 100;      ///< one failed credit poll (a load of a flag in GPU memory)
  double push_rate = 450e9;  ///< an unobstructed sender filling its FIFO (bounded by NVLink's 450 GB/s)
  /// Cost model the control loop evaluates: fitted at start-up on calibration samples drawn from
  /// this stall model (as PReCCL fits offline), or reccl's uncalibrated prior (cost_model_q{}).
  bool calibrate = true;
  int calibration_samples = 2048;
  /// Refit every K collectives on rank 0's samples (direct timing, noisy) and switch at the next
  /// epoch; 0: keep the start-up model.
  int refit_every = 0;
};

/// Deadlines (the GPU engine's bounded waits) and probes.
struct fault_model {
  double deadline = 5e-3;        ///< a VT that makes no progress this long is declared dead (s)
  double probe_grace = 1e-3;     ///< a failed probe holds the collective until this long after its start (s)
  bool abort_on_fault = false;   ///< NCCL's behaviour: a dead path aborts the communicator
};

/// One collective as the driver saw it.
struct epoch_row {
  int index = 0;
  double time = 0;             ///< s, including deadline and recovery
  double data_time = 0;        ///< s, slowest VT before any recovery (+inf if one was stuck)
  double algbw = 0, busbw = 0; ///< B/s
  reccl::status st = reccl::status::ok;
  bool aborted = false;        ///< the communicator aborted (abort_on_fault) or lost every VT
  std::uint32_t live_mask = 0, fault_mask = 0, probe_mask = 0, rejoined_mask = 0;
  int n_vts = 0;
  double share[reccl::max_vts] = {};     ///< fraction of the message per VT in this epoch
  double vt_time[reccl::max_vts] = {};   ///< s (0: no bytes; inf: stuck)
  double vt_rate[reccl::max_vts] = {};   ///< bottleneck goodput of the VT (B/s)
  double est_ns[reccl::max_vts] = {};    ///< the control loop's estimate (max over ranks)
  int solves = 0;
};

/// nccl-tests' bus-bandwidth factor for collective `c` over n ranks.
inline double busbw_factor(reccl::collective c, int n) {
  switch (c) {
    case reccl::collective::all_reduce: return 2.0 * (n - 1) / n;
    case reccl::collective::reduce_scatter:
    case reccl::collective::all_gather:
    case reccl::collective::all_to_all: return static_cast<double>(n - 1) / n;
    case reccl::collective::broadcast: return 1.0;
  }
  return 1.0;
}

/// Fits reccl's cost model on `n` samples drawn from the stall model for VT latencies around
/// `latency` (s) and per-rank VT bytes around `bytes`, with VT rates in [rate/8, rate]. Returns the
/// quantized model (from epoch 0).
inline reccl::telemetry::cost_model_q calibrate_model(stall_model const& sm, double latency, double bytes, double rate,
                                                      std::uint64_t seed) {
  reccl::telemetry::cost_model<4096> fit_window;
  rng r(hash_mix(seed, 0xca11b));
  int const n = std::min(sm.calibration_samples, 4096);
  for (int i = 0; i < n; ++i) {
    double const b = bytes * (0.25 + 1.75 * r.uniform());
    double const bw = std::min(rate * (0.125 + 0.875 * r.uniform()), sm.push_rate);
    double const t = (latency + b / bw) * std::max(0.0, 1.0 + sm.noise * r.normal());
    double const wait_ns = (t - latency - b / sm.push_rate) * 1e9;
    auto const stalls = static_cast<std::uint64_t>(std::max(0.0, std::floor(wait_ns / sm.poll_ns)));
    fit_window.add(stalls, static_cast<std::uint64_t>(b), t * 1e9);
  }
  auto const f = fit_window.fit();
  if (!f.ok) return reccl::telemetry::cost_model_q{};
  return reccl::telemetry::quantize(f, 0);
}

/// Runs collectives of one engine under reccl::control<A>: split, simulate, telemetry, records,
/// step. Owns the control state; the topology (link states) and background model belong to the
/// caller, which may change them between collectives.
template <reccl::Allocator A>
class driver {
 public:
  driver(topology& topo, collective_engine& engine, background_model& bg, reccl::collective coll,
         std::uint64_t count, std::size_t elem_bytes, std::uint64_t granule, A alloc, reccl::control_config cfg,
         stall_model sm, fault_model fm, std::uint64_t seed)
      : topo_(&topo), eng_(&engine), bg_(&bg), coll_(coll), count_(count), elem_(elem_bytes), granule_(granule),
        sm_(sm), fm_(fm), noise_(hash_mix(seed, 0x7e1e)) {
    if (count == 0) throw std::invalid_argument("collective count must be > 0");
    if (granule == 0) throw std::invalid_argument("granule must be > 0");
    int const nv = engine.comm().n_vts();
    reccl::telemetry::cost_model_q model{};
    // Latency part and bytes per rank of a VT under the equal split: where the calibration samples lie.
    double lat = 0;
    for (std::size_t ph = 0; ph < engine.plan().phases.size(); ++ph) lat += engine.phase_latency(ph, 0);
    double const per_rank_vt = static_cast<double>(count) * static_cast<double>(elem_bytes) / nv *
                               busbw_factor(coll, engine.plan().nranks);
    double const nic = topo.params().nic_payload_rate();
    if (sm.calibrate) model = calibrate_model(sm, lat, std::max(per_rank_vt, 1.0), nic, seed);
    ctl_ = reccl::control<A>::start(nv, alloc, cfg, model);
    if (reccl::check(ctl_.share) != reccl::status::ok) throw std::invalid_argument("control state rejected the VT count");
  }

  reccl::control<A> const& control() const { return ctl_; }
  /// The engine's result for the data phase of the last collective (before any recovery run).
  collective_result const& last_result() const { return last_; }
  bool aborted() const { return aborted_; }

  /// Runs collective number `index` (the index selects background activity).
  epoch_row run_one(int index) {
    epoch_row row;
    row.index = index;
    int const nv = eng_->comm().n_vts();
    int const nranks = eng_->plan().nranks;
    row.n_vts = nv;
    if (aborted_) {
      row.aborted = true;
      row.st = reccl::status::timeout;
      return row;
    }
    reccl::split const sp = ctl_.split_for(count_, granule_);
    row.live_mask = sp.live_mask;
    for (int v = 0; v < nv; ++v) row.share[v] = static_cast<double>(ctl_.share.w[v]) / reccl::share_one;
    std::uint32_t const probes = ctl_.probe_mask;
    row.probe_mask = probes;
    auto const& bg = bg_->flows(index);
    collective_result r = eng_->run(sp, elem_, bg);
    last_ = r;
    row.solves = r.solves;
    row.data_time = r.time;
    std::vector<double> rank_bytes = r.rank_vt_bytes;
    double vt_time[reccl::max_vts] = {};
    for (int v = 0; v < nv; ++v) {
      vt_time[v] = r.vt[v].time;
      row.vt_rate[v] = r.vt[v].bottleneck_rate;
    }

    // Deadline and recovery: the live VTs finish a stuck VT's remaining range.
    std::uint32_t faults = 0;
    double total = r.time;
    if (r.any_stuck()) {
      if (fm_.abort_on_fault) {
        aborted_ = true;
        row.aborted = true;
        row.st = reccl::status::timeout;
        row.time = std::numeric_limits<double>::infinity();
        return row;
      }
      double fault_time = 0, live_done = 0;
      std::uint64_t remaining = 0;
      for (int v = 0; v < nv; ++v) {
        if (r.vt[v].stuck) {
          faults |= 1u << v;
          fault_time = std::max(fault_time, r.vt[v].stuck_at + fm_.deadline);
          double const left = r.vt[v].bytes_sent > 0 ? 1.0 - r.vt[v].bytes_delivered / r.vt[v].bytes_sent : 0.0;
          remaining += static_cast<std::uint64_t>(std::ceil(left * static_cast<double>(sp.count[v])));
        } else if (r.vt[v].elements > 0) {
          live_done = std::max(live_done, r.vt[v].time);
        }
      }
      std::uint32_t const live = sp.live_mask & ~faults;
      double recovery = 0;
      if (live != 0 && remaining > 0) {
        // The remaining range, spread over the live VTs in proportion to their shares.
        reccl::shares const rs = reccl::remask(ctl_.share, live, 0);
        reccl::split const rsp = reccl::to_split(rs, remaining, granule_);
        collective_result r2 = eng_->run(rsp, elem_, bg);
        row.solves += r2.solves;
        recovery = r2.time;
        for (std::size_t k = 0; k < rank_bytes.size(); ++k) rank_bytes[k] += r2.rank_vt_bytes[k];
        for (int v = 0; v < nv; ++v)
          if (r2.vt[v].elements > 0) vt_time[v] = std::max(fault_time, live_done) + r2.vt[v].time;
        if (r2.any_stuck()) {  // a second VT died during recovery: report it too; a timeout if none is left
          for (int v = 0; v < nv; ++v)
            if (r2.vt[v].stuck) faults |= 1u << v;
          recovery = std::numeric_limits<double>::infinity();
        }
      }
      total = std::max(fault_time, live_done) + recovery;
    }

    // Probes: a small block on each masked VT; it arrives if the VT's paths are up.
    std::uint32_t probe_ok = 0;
    if (probes != 0) {
      for (int v = 0; v < nv; ++v)
        if ((probes >> v) & 1u && vt_paths_up(v)) probe_ok |= 1u << v;
      if ((probes & ~probe_ok) != 0) total = std::max(total, fm_.probe_grace);
    }

    // Telemetry and records (every rank's), then the control step.
    make_records(rank_bytes, vt_time, faults, probe_ok, nranks, nv);
    reccl::epoch_report rep{};
    rep.split = sp;
    reccl::step_result const st = ctl_.step(records_.data(), static_cast<int>(records_.size()), &rep);
    row.st = st.st;
    if (st.st == reccl::status::mismatch || st.st == reccl::status::invalid_argument)
      throw std::logic_error(std::string("control step failed: ") + std::string(reccl::name(st.st)));
    if (st.st == reccl::status::timeout || !std::isfinite(total)) {
      aborted_ = true;
      row.aborted = true;
      row.time = std::numeric_limits<double>::infinity();
      return row;
    }
    row.fault_mask = rep.fault_mask;
    row.rejoined_mask = rep.rejoined_mask;
    for (int v = 0; v < nv; ++v) {
      row.vt_time[v] = vt_time[v];
      row.est_ns[v] = static_cast<double>(rep.time_ns[v]);
    }
    row.time = total;
    double const bytes = static_cast<double>(count_) * static_cast<double>(elem_);
    row.algbw = bytes / total;
    row.busbw = row.algbw * busbw_factor(coll_, nranks);
    maybe_refit();
    return row;
  }

 private:
  bool vt_paths_up(int v) const {
    if (eng_->vt_dead(v)) return false;
    auto const& plan = eng_->plan();
    for (std::size_t ph = 0; ph < plan.phases.size(); ++ph)
      for (std::size_t f = 0; f < plan.phases[ph].flows.size(); ++f)
        if (!topo_->path_up(eng_->route(ph, v, f))) return false;
    return true;
  }

  /// The stalls a rank's sender counted for a VT that took `t` s (with noise applied by the caller).
  std::uint64_t stalls_for(double t, double bytes, double latency) const {
    double const wait_ns = (t - latency - bytes / sm_.push_rate) * 1e9;
    return static_cast<std::uint64_t>(std::max(0.0, std::floor(wait_ns / sm_.poll_ns)));
  }

  void make_records(std::vector<double> const& rank_bytes, double const* vt_time, std::uint32_t faults,
                    std::uint32_t probe_ok, int nranks, int nv) {
    int const per = (nranks + reccl::max_ranks - 1) / reccl::max_ranks;  // ranks per record
    int const n_rec = (nranks + per - 1) / per;
    records_.assign(static_cast<std::size_t>(n_rec), reccl::epoch_record{});
    auto const& model = ctl_.current_model();
    double lat[reccl::max_vts] = {};
    for (int v = 0; v < nv; ++v)
      for (std::size_t ph = 0; ph < eng_->plan().phases.size(); ++ph) lat[v] += eng_->phase_latency(ph, v);
    rank0_.clear();
    for (int g = 0; g < n_rec; ++g) {
      reccl::telemetry::stalls tel{};
      std::uint64_t best[reccl::max_vts] = {};
      for (int rank = g * per; rank < std::min(nranks, (g + 1) * per); ++rank) {
        for (int v = 0; v < nv; ++v) {
          double const b = rank_bytes[static_cast<std::size_t>(rank) * static_cast<std::size_t>(nv) + static_cast<std::size_t>(v)];
          if (!(b > 0) || !std::isfinite(vt_time[v])) continue;
          double const t = vt_time[v] * std::max(0.0, 1.0 + sm_.noise * noise_.normal());
          std::uint64_t const s = stalls_for(t, b, lat[v]);
          auto const bytes = static_cast<std::uint64_t>(b);
          if (rank == 0) rank0_.push_back({s, bytes, t * 1e9});
          std::uint64_t const est = model.eval(s, bytes);
          if (tel.byte_count(v) == 0 || est > best[v]) {  // the group's slowest member counts
            tel.stall_counts[v] = s;
            tel.byte_counts[v] = bytes;
            best[v] = est;
          }
        }
      }
      records_[static_cast<std::size_t>(g)] = ctl_.record(g, tel, faults, probe_ok);
    }
  }

  void maybe_refit() {
    if (sm_.refit_every <= 0) return;
    // Rank 0's own samples: its counts and its directly timed VT durations.
    for (auto const& x : rank0_) fit_.add(x.stalls, x.bytes, x.time_ns);
    if (++since_fit_ >= sm_.refit_every) {
      since_fit_ = 0;
      auto const f = fit_.fit();
      if (f.ok) ctl_.set_model(reccl::telemetry::quantize(f, ctl_.epoch));
    }
  }

  topology* topo_;
  collective_engine* eng_;
  background_model* bg_;
  reccl::collective coll_;
  std::uint64_t count_;
  std::size_t elem_;
  std::uint64_t granule_;
  stall_model sm_;
  fault_model fm_;
  rng noise_;
  reccl::control<A> ctl_{};
  std::vector<reccl::epoch_record> records_;
  collective_result last_{};
  std::vector<reccl::telemetry::cost_sample> rank0_;
  reccl::telemetry::cost_model<256> fit_;
  int since_fit_ = 0;
  bool aborted_ = false;
};

}  // namespace reccl_sim
