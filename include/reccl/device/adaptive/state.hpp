// reccl/device/adaptive/state.hpp -- what the adaptive (PReCCL) loop keeps in device memory, per
// lane of a rank's scratch window. Plain data: the host writes the initial state and reads the
// reports and samples with cudaMemcpy; the kernels do the rest.
//
//   control region (local: only its own rank reads or writes it)
//   ┌─────────────────────────────────────────────────────────────────────────────────────────┐
//   │ epoch            index of the next adaptive collective on this lane (global epoch e);   │
//   │                  first_epoch: where the current control state (chains) started          │
//   │ quiet            VTs that faulted or failed a probe in e-1: carried as faults in e      │
//   │ counters[2]      per parity of the collective: stalls, VT times, fault / probe bits,    │
//   │                  live CTA counts (reset by the control CTA of the next one)             │
//   │ drafts[2]        per parity: what the collective's record carries besides its counters  │
//   │ faults           injected throttles and dead VTs, keyed by epoch (host-written)         │
//   │ model            a cost model the host installed, with the epoch it applies from        │
//   │ chain[2], plan[2] control<A> of the even and of the odd collectives; what the control   │
//   │                  CTA prepared for each one's next collective (digest, probes, split)    │
//   │ reports[R]       epoch_report of every collective (written one collective later)       │
//   │ samples[R]       this rank's per-VT stalls, bytes and measured ns (for the host fit)    │
//   └─────────────────────────────────────────────────────────────────────────────────────────┘
//   telemetry inbox (written by every rank into every rank): tele_slot[2 parities][src rank],
//   arrival words [src rank], verdict words [2 parities][src rank][cta]
//
// The end of collective e is the verdict: every data CTA sends one tagged word (its fault, probe
// and touched bits) to every rank, and every data CTA waits for all of them, which is all that
// recovery needs to agree on (no counter round trip on the way). The full record of e (stalls,
// bytes, digest, checksum) is built and exchanged by the control CTA of e+1, beside e+1's data
// phase, just before that CTA steps with those records: the records reach the step as early as
// before, and the tail of every collective carries only the verdict.
//
// Two control chains. One GPU thread needs ~39 us for control<texcp>::step with 8 VTs and 2 ranks
// (bench/perf/control_step.cu on an H200): more than a 64 MiB collective can spend between two
// kernels. So a spare CTA of collective e computes the split of collective e+1 while e moves data,
// from the records of e-1 (the newest complete ones). For each update to stay consistent (an
// allocator moves the shares that produced the times it sees), the even and the odd collectives
// run one control<A> each: split(e+1) = chain[(e+1)&1] stepped with records(e-1), and e-1 ran on
// that same chain. Each chain is exactly the loop the policy tests check. A VT that faults in e is
// also carried into e+1 as a fault (quiet), so the other chain never sends into a dead VT.
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "../../policy/epoch.hpp"
#include "../../policy/split.hpp"
#include "../../policy/telemetry/cost_model.hpp"
#include "../primitives.hpp"

namespace reccl::device::adaptive {

/// The stall unit of the adaptive kernels: a VT's stalls are the time its pipelines spent in waits
/// that spun (senders waiting for credit, receivers waiting for data), averaged over the VT's
/// warp pairs, in units of this. So waits on any kind of flag or slot count alike, and the cost
/// model's prior prices one stall at exactly this (adaptive_options::model).
inline constexpr std::uint64_t stall_quantum_ns = 256;

/// Entries of the report and sample rings (by epoch modulo this).
inline constexpr int ring_entries = 256;
/// Bytes reserved for one control<A> (static_assert'ed by the kernels).
inline constexpr int chain_bytes = 1024;
/// Probe block per warp pair, bytes (one ring chunk of this size per warp pair).
inline constexpr int probe_bytes_per_warp = 256;

/// One injected condition (see reccl::device_faults on the host side).
struct fault_spec {
  std::uint32_t kind = 0;  ///< 0 none, 1 throttle, 2 dead
  std::int32_t vt = -1;
  std::uint64_t from_epoch = 0, until_epoch = 0;  ///< active in [from, until)
  std::uint64_t bytes_per_us = 0;                 ///< throttle: the VT's rate per rank and direction
};
inline constexpr int max_faults = 8;
struct fault_table {
  std::uint32_t n = 0, pad = 0;
  fault_spec f[max_faults] = {};
};

/// A cost model installed by the host: it evaluates the records of global epochs >= from_epoch.
/// `seq` grows with each install; each chain takes a model once (chain_seq).
struct pending_model {
  std::uint64_t seq = 0;
  std::uint64_t from_epoch = 0;
  telemetry::cost_model_q model{};
};

/// A collective's counters on this rank (one set per parity of the collective index). Reset by
/// the control CTA of the next collective once it has read them into the record.
struct counters {
  unsigned long long wait_ns[max_vts];  ///< time the VT's warps spent in waits that spun (summed)
  unsigned long long t0[max_vts];      ///< first start of a CTA of the VT (%globaltimer)
  unsigned long long t1[max_vts];      ///< last end of a CTA of the VT
  unsigned int fault_mask;             ///< VTs whose data CTAs gave up (VT deadline)
  unsigned int probe_fail_mask;        ///< probed VTs whose probe did not arrive in its window
  unsigned int live_done;              ///< CTAs of live VTs that finished their block
  unsigned int live_ended;             ///< CTAs of live VTs past their data phase (finished or faulted)
  unsigned int pad[4];
};

/// What collective e's record carries besides its counters, written by data CTA 0 when e starts
/// (the data CTAs all compute the same plan), read by the control CTA of e+1.
struct record_draft {
  std::uint64_t chain_epoch = 0;  ///< the record's epoch
  std::uint64_t digest = 0;       ///< the record's state_digest
  std::uint32_t quiet = 0;        ///< carried faults (in the record's fault_mask)
  std::uint32_t probes = 0;       ///< probed VTs
  std::int32_t n_vts = 0;
  std::uint32_t pipes = 1;        ///< warp pairs per VT (a VT's stalls are its pipes' mean wait)
  std::uint64_t bytes[max_vts] = {};  ///< the bytes each VT carried (0 without telemetry)
};

/// What the control CTA of collective e-1 prepares for collective e (one per chain): the chain
/// epoch and state digest e's record carries, the probes, and the split for a count (valid when
/// the call's count and granule match; a data CTA computes it otherwise). Read by every data CTA
/// with one 16-byte load per lane, so a collective starts without a chain of dependent loads.
struct alignas(16) plan_slot {
  std::uint64_t tag = 0;          ///< global epoch + 1 this slot is for (0: none)
  std::uint64_t chain_epoch = 0;  ///< the record's epoch
  std::uint64_t digest = 0;       ///< the record's state_digest
  std::uint32_t probes = 0;       ///< masked VTs that carry a probe block
  std::uint32_t live_mask = 0;    ///< VTs with a share
  std::uint64_t count = ~std::uint64_t{0}, granule = 0;  ///< what `sp` is for
  split sp{};
};

/// This rank's counters of one collective, for the host-side cost model fit.
struct vt_sample {
  std::uint64_t epoch = 0;
  std::int32_t n_vts = 0;
  std::uint32_t fault_mask = 0;  ///< recovered VTs (OR over ranks)
  std::uint64_t stalls[max_vts] = {};
  std::uint64_t bytes[max_vts] = {};
  std::uint64_t ns[max_vts] = {};  ///< measured: last CTA end - first CTA start of the VT
  /// The end of the collective on this rank, ns after its last data CTA finished its data phase
  /// (a diagnostic, with telemetry on; 0 without): every rank's verdict seen (by CTA 0), the
  /// epoch closed, the control CTA done (negative: before the last data CTA).
  std::int64_t tail_ns[3] = {};
};

struct report_entry {
  std::uint64_t tag = 0;      ///< epoch + 1 (0: never written)
  std::uint64_t step_ns = 0;  ///< how long the control CTA took to step this epoch's records
  epoch_report rep{};
};

struct control_region {
  std::uint64_t epoch;
  std::uint64_t first_epoch;  ///< the epoch this lane's current control state started at
  std::uint64_t quiet_tag;  ///< epoch + 1 that `quiet` applies to
  std::uint32_t quiet;
  std::uint32_t error_info;  ///< first fatal error: rank << 16 | (vt + 1), 0 if none
  std::uint64_t recovered;   ///< collectives that recovered a VT (cumulative)
  counters acc[2];
  record_draft drafts[2];
  fault_table faults;
  pending_model model;
  std::uint64_t chain_model_seq[2];
  plan_slot plan[2];
  alignas(16) unsigned char chain[2][chain_bytes];
  report_entry reports[ring_entries];
  vt_sample samples[ring_entries];
};

/// One rank's record of one collective, as delivered into every rank's inbox. `flag` (global
/// epoch + 1) is stored last, with release semantics: a reader that acquires it sees the rest.
struct alignas(16) tele_slot {
  epoch_record rec;
  std::uint64_t pad = 0;
  std::uint64_t flag = 0;
};

/// The verdict word each data CTA of a rank sends every rank at the end of collective e: the tag
/// uint32(e + 1) in its high half (so it needs no flag: a slot of parity p last held collective
/// e - 2's word), these bits in its low half.
inline constexpr std::uint32_t verdict_fault = 1;         ///< the CTA's VT gave up (VT deadline)
inline constexpr std::uint32_t verdict_probe_failed = 2;  ///< the CTA's probe did not arrive
inline constexpr std::uint32_t verdict_touched = 4;       ///< ... after writing part of the output
RECCL_HOST_DEVICE constexpr std::uint64_t verdict_word(std::uint64_t e, std::uint32_t bits) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(e + 1)) << 32) | bits;
}

}  // namespace reccl::device::adaptive
