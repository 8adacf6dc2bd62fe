// reccl/policy/control.hpp -- the control loop of one communicator: from epoch e's records to the
// state (shares, mask, probes, cost model) of epoch e+1, identically on every rank.
//
//   state of epoch e                     records of e (all ranks)         state of epoch e+1
//   ┌──────────────────────┐             ┌──────────────────────┐         ┌──────────────────────┐
//   │ shares, live mask    │──split_for─▶│ combine: checks, per │         │ faulted VTs masked,  │
//   │ probe_mask           │  (engine)   │ VT max-over-ranks T  │──step──▶│ share spread; probed │
//   │ cost model, epoch    │──record────▶│ fault OR, probe AND  │         │ VTs back at a small  │
//   └──────────────────────┘             └──────────────────────┘         │ share; Allocator(T)  │
//                                                                          └──────────────────────┘
//
// Rules of step() (all integer, fixed VT order, so identical inputs give identical outputs):
//  * A live VT with its fault bit set on any rank is masked: share 0, its share spread over the
//    live VTs in proportion to theirs. In such an epoch the allocator does not run (the live VTs
//    also carried the dead VT's range, so their times do not match their shares).
//  * Otherwise the allocator updates the shares from T_i = max over ranks of the cost model.
//  * While any VT is masked, every `probe_interval` collectives all masked VTs are probed at once
//    (one deadline for all of them): probe_mask tells the engine to send a small block on them that
//    the result does not depend on. A probed VT whose probe arrived on every rank (and that did not
//    fault) is live again from the next epoch with `rejoin_share`, which the allocator then grows.
//  * Losing every VT is status::timeout and leaves the state as it was.
//  * A failed record check is status::mismatch naming the epoch and the rank; the state stays.
//  * A cost model from set_model() evaluates the records of epochs >= its from_epoch. It is part of
//    the state digest, so a rank that switched at another epoch is reported, not followed.
#pragma once

#include <cstdint>

#include "../config.hpp"
#include "../types.hpp"
#include "allocator/allocator.hpp"
#include "epoch.hpp"
#include "split.hpp"
#include "telemetry/cost_model.hpp"
#include "telemetry/telemetry.hpp"

namespace reccl {

/// Tunables of the control loop.
struct control_config {
  std::int32_t probe_interval = 16;             ///< K: probe masked VTs every K collectives; <= 0: never
  std::uint32_t rejoin_share = share_one >> 6;  ///< Q30 share a VT gets when its probe succeeds; default 1/64
};

/// A sealed record from its parts: what control::record() builds, for engines that keep the
/// state digest precomputed (the adaptive kernels build records without reading the whole state).
template <Telemetry T>
RECCL_HOST_DEVICE constexpr epoch_record make_record(std::uint64_t epoch, int rank, int n_vts, std::uint64_t state_digest,
                                                     T const& tel, std::uint32_t fault_mask, std::uint32_t probe_ok_mask) {
  epoch_record r{};
  r.epoch = epoch;
  r.rank = rank;
  r.n_vts = n_vts;
  r.fault_mask = fault_mask;
  r.probe_ok_mask = probe_ok_mask;
  r.state_digest = state_digest;
  int const n = n_vts < 0 ? 0 : (n_vts > max_vts ? max_vts : n_vts);
  for (int i = 0; i < n; ++i) {
    r.stalls[i] = tel.stall_count(i);
    r.bytes[i] = tel.byte_count(i);
  }
  seal(r);
  return r;
}

/// How control::step runs its two heavy parts, the records' combine and the allocator's update.
/// This one runs them on the calling thread; reccl/device/warp_policy.hpp's warp_exec spreads them
/// over the lanes of a warp with the same results, bit for bit.
struct serial_exec {
  RECCL_HOST_DEVICE constexpr epoch_summary combine(epoch_record const* records, int nranks, epoch_expect const& expect,
                                                    telemetry::cost_model_q const& model) const {
    return reccl::combine(records, nranks, expect, model);
  }
  template <Allocator A>
  RECCL_HOST_DEVICE constexpr shares update(A const& a, shares const& s, vt_observation const& o) const {
    return a.update(s, o);
  }
};

/// Control-loop state of one communicator, templated on the Allocator. Fixed size, trivially
/// copyable (kernels take it by value); every member function is RECCL_HOST_DEVICE.
template <Allocator A>
struct control {
  A allocator{};
  control_config config{};
  std::uint64_t epoch = 0;        ///< the collective this state is for
  shares share{};                 ///< shares of the current epoch
  std::uint32_t probe_mask = 0;   ///< masked VTs the engine probes in the current epoch
  std::int32_t since_probe = 0;   ///< collectives since the last probe while some VT is masked
  telemetry::cost_model_q model{};       ///< the model in use
  telemetry::cost_model_q next_model{};  ///< pending model (if has_next_model), from next_model.from_epoch
  bool has_next_model = false;

  /// Epoch 0 with equal shares over all n_vts VTs. An n_vts outside [1, max_vts] gives a state whose
  /// split_for() is empty (n_vts == 0) and whose step() returns invalid_argument.
  RECCL_HOST_DEVICE static constexpr control start(int n_vts, A alloc = {}, control_config cfg = {},
                                                   telemetry::cost_model_q m = {}) {
    control c{};
    c.allocator = alloc;
    c.config = cfg;
    c.model = m;
    c.share = equal_shares(n_vts, n_vts >= 1 && n_vts <= max_vts ? all_live(n_vts) : 0u);
    return c;
  }

  /// The split of `total` elements for the current epoch (see to_split).
  RECCL_HOST_DEVICE constexpr split split_for(std::uint64_t total, std::uint64_t granule) const {
    return to_split(share, total, granule);
  }

  /// VTs without a share in the current epoch.
  RECCL_HOST_DEVICE constexpr std::uint32_t masked() const {
    return share.n_vts >= 1 && share.n_vts <= max_vts ? all_live(share.n_vts) & ~share.live_mask : 0u;
  }

  /// Schedules a new cost model: it evaluates the records of epochs >= m.from_epoch. Every rank
  /// must receive the same model before reaching m.from_epoch (broadcast it with a margin).
  RECCL_HOST_DEVICE constexpr void set_model(telemetry::cost_model_q const& m) {
    next_model = m;
    has_next_model = true;
  }

  /// The model that evaluates the current epoch's records.
  RECCL_HOST_DEVICE constexpr telemetry::cost_model_q const& current_model() const {
    return has_next_model && next_model.from_epoch <= epoch ? next_model : model;
  }

  /// Digest (the record checksum's hash) of the state step() reads besides the records: epoch,
  /// shares, mask, probe bookkeeping, the model for this epoch. Not covered: the allocator's
  /// tunables and control_config (probe interval, rejoin share), which every rank must configure
  /// alike (they are compile-time or creation-time choices). Equal on every rank that will compute
  /// the same split from the same configuration.
  RECCL_HOST_DEVICE constexpr std::uint64_t digest() const {
    std::uint64_t h = detail::hash_seed;
    h = detail::hash_word(h, epoch);
    h = detail::hash_word(h, detail::pack32(static_cast<std::uint32_t>(share.n_vts), share.live_mask));
    for (int i = 0; i < max_vts; i += 2) h = detail::hash_word(h, detail::pack32(share.w[i], share.w[i + 1]));
    h = detail::hash_word(h, detail::pack32(probe_mask, static_cast<std::uint32_t>(since_probe)));
    telemetry::cost_model_q const& m = current_model();
    h = detail::hash_word(h, m.alpha);
    h = detail::hash_word(h, m.beta);
    h = detail::hash_word(h, m.delta);
    return detail::hash_finish(h);
  }

  /// This rank's sealed record of the current epoch from its telemetry and its fault / probe bits.
  template <Telemetry T>
  RECCL_HOST_DEVICE constexpr epoch_record record(int rank, T const& tel, std::uint32_t fault_mask,
                                                  std::uint32_t probe_ok_mask) const {
    return make_record(epoch, rank, share.n_vts, digest(), tel, fault_mask, probe_ok_mask);
  }

  /// Processes every rank's records of the current epoch (records[k] from rank k) and, unless the
  /// result is an error (mismatch, timeout, invalid_argument), moves this state to the next epoch.
  /// If `report` is given, fills it (all but report->split) for the processed epoch. `ex` runs the
  /// combine and the update (serial_exec: on this thread; device::warp_exec: on a whole warp, every
  /// lane calling with the same arguments); the result does not depend on it.
  RECCL_EXEC_CHECK_DISABLE
  template <class Exec = serial_exec>
  RECCL_HOST_DEVICE constexpr step_result step(epoch_record const* records, int nranks,
                                               epoch_report* report = nullptr, Exec const& ex = {}) {
    step_result res{};
    res.epoch = epoch;
    if (check(share) != status::ok) {
      res.st = status::invalid_argument;
      return res;
    }
    telemetry::cost_model_q const m = current_model();
    epoch_summary const sum = ex.combine(records, nranks, epoch_expect{epoch, share.n_vts, digest()}, m);
    if (sum.st != status::ok) {
      res.st = sum.st;
      res.rank = sum.rank;
      res.failed = sum.failed;
      return res;
    }
    std::uint32_t const faults = sum.fault_mask & share.live_mask;
    std::uint32_t const back = sum.probe_ok_mask & probe_mask & ~sum.fault_mask;
    std::uint32_t const live = (share.live_mask & ~faults) | back;
    if (live == 0) {
      res.st = status::timeout;
      return res;
    }
    res.st = faults != 0 ? status::recovered : status::ok;
    if (report != nullptr) fill(*report, sum, res.st, faults, back);

    shares next = remask(share, live, config.rejoin_share);
    if (faults == 0) {
      vt_observation obs{};
      obs.n_vts = share.n_vts;
      obs.live_mask = live;
      for (int i = 0; i < share.n_vts; ++i)
        obs.time[i] = ((share.live_mask >> i) & 1u) ? sum.time[i] : 0;  // a VT back from a probe: no estimate yet
      next = ex.update(allocator, next, obs);
    }
    std::uint32_t const masked_next = all_live(share.n_vts) & ~live;
    probe_mask = 0;
    if (masked_next == 0 || config.probe_interval <= 0) {
      since_probe = 0;
    } else if (++since_probe >= config.probe_interval) {
      probe_mask = masked_next;
      since_probe = 0;
    }
    if (has_next_model && next_model.from_epoch <= epoch) {
      model = next_model;
      has_next_model = false;
    }
    share = next;
    ++epoch;
    return res;
  }

 private:
  RECCL_HOST_DEVICE constexpr void fill(epoch_report& rep, epoch_summary const& sum, status st, std::uint32_t faults,
                                        std::uint32_t back) const {
    rep.epoch = epoch;
    rep.st = st;
    rep.n_vts = share.n_vts;
    rep.nranks = sum.nranks;
    rep.masked_mask = masked();
    rep.fault_mask = faults;
    rep.probe_mask = probe_mask;
    rep.rejoined_mask = back;
    for (int i = 0; i < max_vts; ++i) {
      rep.share[i] = share.w[i];
      rep.bytes[i] = sum.bytes[i];
      rep.stalls[i] = sum.stalls[i];
      rep.time_ns[i] = sum.time[i];
      // bytes / nranks per ns is GB/s; * 1000 gives 10^6 B/s. Divide first: no overflow.
      rep.bw_mbps[i] = sum.time[i] > 0 ? sum.bytes[i] / static_cast<std::uint64_t>(sum.nranks) * 1000 / sum.time[i] : 0;
    }
  }
};

}  // namespace reccl
