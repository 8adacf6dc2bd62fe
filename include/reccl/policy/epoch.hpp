// reccl/policy/epoch.hpp -- what every rank reports at the end of a collective, how the reports are
// checked and combined, and the per-epoch record users read.
//
//   collective e on rank r                         every rank, after the last sync step
//   ┌─────────────────────────────┐  all-gather   ┌───────────────────────────────────────────┐
//   │ epoch_record                │ ────────────▶ │ combine(): each record's epoch, rank slot, │
//   │  epoch e, rank r, VT count  │               │ VT count, checksum and state digest must   │
//   │  stalls[vt], bytes[vt]      │               │ match, else {mismatch, e, rank}            │
//   │  fault bits, probe-ok bits  │               │ per VT: T = max over ranks of model(counts)│
//   │  state digest, checksum     │               │ ──▶ control::step() ──▶ split of e+1       │
//   └─────────────────────────────┘               └───────────────────────────────────────────┘
//
// Every rank runs the same deterministic step on the same checked inputs, so every rank computes
// the same next split without another round trip; a disagreement is an error value naming the
// epoch and the rank, never a silent divergence.
//
// Usage (the CPU engine and the device runtime do this around every collective; see control.hpp):
//
//   #include <reccl/policy/control.hpp>
//   #include <reccl/policy/allocator/texcp.hpp>
//   #include <reccl/policy/telemetry/stall_counter.hpp>
//
//   auto ctl = reccl::control<reccl::allocator::texcp>::start(n_vts);  // identical on every rank
//   for (;;) {                                                          // one collective per turn
//     reccl::split const sp = ctl.split_for(count, granule);  // VT i moves [sp.offset(i), +sp.count[i])
//     std::uint32_t const probes = ctl.probe_mask;             // masked VTs: send a small probe block
//     reccl::telemetry::stalls tel{};                           // counted while the collective runs
//     std::uint32_t faults = 0, probe_ok = 0;                   // VTs that missed a deadline / probes that came back
//     /* ... run the collective ... */
//     reccl::epoch_record const mine = ctl.record(my_rank, tel, faults, probe_ok);
//     /* ... all-gather `mine` into recs[0..nranks) on the collective's last sync step ... */
//     reccl::epoch_report rep{};
//     rep.split = sp;
//     reccl::step_result const r = ctl.step(recs, nranks, &rep);  // ctl now holds epoch e+1
//     if (r.st == reccl::status::mismatch) { /* ranks disagree at epoch r.epoch, rank r.rank */ }
//     if (r.st == reccl::status::timeout) { /* every VT is lost: a clean error, no hang */ }
//   }
//
// The record checksum is xxHash64-style over 64-bit words: starting from h = P5, for each word v
//   h ^= rotl64(v · P2, 31) · P1;   h = rotl64(h, 27) · P1 + P4
// (xxHash64's step for a trailing 8-byte lane), then xxHash64's avalanche
//   h ^= h >> 33; h ·= P2; h ^= h >> 29; h ·= P3; h ^= h >> 32,
// with P1..P5 = 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0x85EBCA77C2B2AE63,
// 0x27D4EB2F165667C5 and all arithmetic mod 2^64. The words, in order: epoch; rank | n_vts << 32;
// fault_mask | probe_ok_mask << 32; state_digest; stalls[0..n_vts); bytes[0..n_vts) (32-bit fields
// as unsigned). Defined on values, not memory layout, so it is the same on any host or device; it
// detects corruption and stale or misplaced records, it is not a MAC. control::digest() uses the
// same hash.
#pragma once

#include <cstdint>

#include "../config.hpp"
#include "../types.hpp"
#include "allocator/allocator.hpp"
#include "split.hpp"
#include "telemetry/cost_model.hpp"

namespace reccl {

namespace detail {
inline constexpr std::uint64_t hash_p1 = 0x9E3779B185EBCA87ull, hash_p2 = 0xC2B2AE3D27D4EB4Full,
                               hash_p3 = 0x165667B19E3779F9ull, hash_p4 = 0x85EBCA77C2B2AE63ull,
                               hash_seed = 0x27D4EB2F165667C5ull;

RECCL_HOST_DEVICE constexpr std::uint64_t rotl64(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

/// Adds one 64-bit word to a running hash (see the file comment).
RECCL_HOST_DEVICE constexpr std::uint64_t hash_word(std::uint64_t h, std::uint64_t v) {
  h ^= rotl64(v * hash_p2, 31) * hash_p1;
  return rotl64(h, 27) * hash_p1 + hash_p4;
}

/// Two 32-bit values as one word: lo | hi << 32.
RECCL_HOST_DEVICE constexpr std::uint64_t pack32(std::uint32_t lo, std::uint32_t hi) {
  return lo | (static_cast<std::uint64_t>(hi) << 32);
}

/// The final avalanche (see the file comment).
RECCL_HOST_DEVICE constexpr std::uint64_t hash_finish(std::uint64_t h) {
  h ^= h >> 33;
  h *= hash_p2;
  h ^= h >> 29;
  h *= hash_p3;
  return h ^ (h >> 32);
}
}  // namespace detail

/// One rank's report for one epoch (one collective). Plain data; travels on the collective's
/// last sync step. Only the first n_vts entries of the arrays are meaningful.
struct epoch_record {
  std::uint64_t epoch = 0;
  std::int32_t rank = 0;
  std::int32_t n_vts = 0;
  std::uint32_t fault_mask = 0;     ///< bit i: VT i missed its deadline on this rank
  std::uint32_t probe_ok_mask = 0;  ///< bit i: the probe block on (masked) VT i arrived on this rank
  std::uint64_t state_digest = 0;   ///< digest of this rank's control state for `epoch` (control::digest)
  std::uint64_t stalls[max_vts] = {};
  std::uint64_t bytes[max_vts] = {};
  std::uint64_t checksum = 0;       ///< record_checksum() of the fields above
};

/// The record's checksum (see the file comment for the exact definition).
RECCL_HOST_DEVICE constexpr std::uint64_t record_checksum(epoch_record const& r) {
  int const n = r.n_vts < 0 ? 0 : (r.n_vts > max_vts ? max_vts : r.n_vts);
  std::uint64_t h = detail::hash_seed;
  h = detail::hash_word(h, r.epoch);
  h = detail::hash_word(h, detail::pack32(static_cast<std::uint32_t>(r.rank), static_cast<std::uint32_t>(r.n_vts)));
  h = detail::hash_word(h, detail::pack32(r.fault_mask, r.probe_ok_mask));
  h = detail::hash_word(h, r.state_digest);
  for (int i = 0; i < n; ++i) h = detail::hash_word(h, r.stalls[i]);
  for (int i = 0; i < n; ++i) h = detail::hash_word(h, r.bytes[i]);
  return detail::hash_finish(h);
}

/// Sets r.checksum; call after the last field is written.
RECCL_HOST_DEVICE constexpr void seal(epoch_record& r) { r.checksum = record_checksum(r); }

/// Which check a record failed.
enum class record_check : std::uint8_t {
  none = 0,
  nranks,    ///< rank count outside [1, max_ranks] (the rank field names no rank: -1)
  rank,      ///< records[k].rank != k
  epoch,     ///< a record of another epoch (stale or from the future)
  n_vts,     ///< another VT count
  checksum,  ///< corrupted record
  state,     ///< the rank's control state differs (it would compute another split)
};

/// What every record must carry: the local rank's own view of the epoch.
struct epoch_expect {
  std::uint64_t epoch = 0;
  std::int32_t n_vts = 0;
  std::uint64_t state_digest = 0;
};

/// Every rank's records of one epoch, checked and combined. On a failed check `st` is
/// status::mismatch (or invalid_argument for a bad rank count), `epoch` is the expected epoch,
/// `rank` the lowest rank whose record failed and `failed` the check; the per-VT fields are then
/// not filled.
struct epoch_summary {
  status st = status::ok;
  std::uint64_t epoch = 0;
  std::int32_t rank = -1;
  record_check failed = record_check::none;
  std::int32_t n_vts = 0;
  std::int32_t nranks = 0;
  std::uint32_t fault_mask = 0;      ///< OR over ranks: VT missed a deadline somewhere
  std::uint32_t probe_ok_mask = 0;   ///< AND over ranks: probe arrived everywhere
  std::uint64_t time[max_vts] = {};  ///< ns, max over ranks of the cost model; 0 if the VT moved no bytes anywhere
  std::int32_t slowest_rank[max_vts] = {};  ///< the rank whose estimate counted (lowest on ties; -1 if none)
  std::uint64_t stalls[max_vts] = {};       ///< sum over ranks
  std::uint64_t bytes[max_vts] = {};        ///< sum over ranks
};

/// The first check record `rec`, rank `r`'s, fails against `expect` (record_check::none if none).
RECCL_HOST_DEVICE constexpr record_check check_record(epoch_record const& rec, int r, epoch_expect const& expect) {
  if (rec.checksum != record_checksum(rec)) return record_check::checksum;
  if (rec.rank != r) return record_check::rank;
  if (rec.epoch != expect.epoch) return record_check::epoch;
  if (rec.n_vts != expect.n_vts) return record_check::n_vts;
  if (rec.state_digest != expect.state_digest) return record_check::state;
  return record_check::none;
}

/// A summary of `nranks` records against `expect` before any record is read: its header fields,
/// and status::invalid_argument (record_check::nranks) for a rank count, VT count or pointer that
/// no records can have.
RECCL_HOST_DEVICE constexpr epoch_summary start_summary(epoch_record const* records, int nranks,
                                                        epoch_expect const& expect) {
  epoch_summary s{};
  s.epoch = expect.epoch;
  s.n_vts = expect.n_vts;
  s.nranks = nranks;
  if (nranks < 1 || nranks > max_ranks || records == nullptr || expect.n_vts < 1 || expect.n_vts > max_vts) {
    s.st = status::invalid_argument;
    s.failed = record_check::nranks;
  }
  return s;
}

/// Checks records[0..nranks) against `expect` (in rank order; the first failure wins) and combines
/// them: per VT the slowest rank's cost-model estimate counts. Deterministic; no allocation.
RECCL_HOST_DEVICE constexpr epoch_summary combine(epoch_record const* records, int nranks, epoch_expect const& expect,
                                                  telemetry::cost_model_q const& model) {
  epoch_summary s = start_summary(records, nranks, expect);
  if (s.st != status::ok) return s;
  for (int r = 0; r < nranks; ++r) {
    record_check const bad = check_record(records[r], r, expect);
    if (bad != record_check::none) {
      s.st = status::mismatch;
      s.rank = r;
      s.failed = bad;
      return s;
    }
  }
  s.probe_ok_mask = all_live(expect.n_vts);
  int const n = expect.n_vts;
  // VT loops run to max_vts and skip VTs >= n: unrolled on the device, the summary stays in registers
  RECCL_UNROLL
  for (int i = 0; i < max_vts; ++i)
    if (i < n) s.slowest_rank[i] = -1;
  for (int r = 0; r < nranks; ++r) {
    epoch_record const& rec = records[r];
    s.fault_mask |= rec.fault_mask;
    s.probe_ok_mask &= rec.probe_ok_mask;
    RECCL_UNROLL
    for (int i = 0; i < max_vts; ++i) {
      if (i >= n) continue;
      s.stalls[i] += rec.stalls[i];
      s.bytes[i] += rec.bytes[i];
      if (rec.bytes[i] == 0 && rec.stalls[i] == 0) continue;  // this rank had no part in VT i
      std::uint64_t const t = model.eval(rec.stalls[i], rec.bytes[i]);
      if (s.slowest_rank[i] < 0 || t > s.time[i]) {
        s.time[i] = t;
        s.slowest_rank[i] = r;
      }
    }
  }
  s.fault_mask &= all_live(expect.n_vts);
  RECCL_UNROLL
  for (int i = 0; i < max_vts; ++i)
    if (i < n && s.bytes[i] == 0) s.time[i] = 0;  // stalls without bytes: no estimate of the VT's speed
  return s;
}

/// Outcome of control::step: ok; recovered (a VT missed its deadline, the live VTs finished its
/// range, it is masked from the next epoch); mismatch (ranks disagree: `epoch` and `rank` say where);
/// timeout (every VT is lost); invalid_argument (bad rank count or control state).
struct step_result {
  status st = status::ok;
  std::uint64_t epoch = 0;  ///< the epoch whose records were processed
  std::int32_t rank = -1;   ///< the rank whose record failed a check, else -1
  record_check failed = record_check::none;
};

/// What users read about one collective (epoch). control::step fills every field but `split`,
/// which the engine sets to the split it ran (the control state knows fractions, not counts).
struct epoch_report {
  std::uint64_t epoch = 0;
  status st = status::ok;           ///< ok or recovered
  std::int32_t n_vts = 0;
  std::int32_t nranks = 0;
  reccl::split split{};             ///< elements per VT in this epoch (set by the engine)
  std::uint32_t share[max_vts] = {};     ///< Q30 fraction of the message per VT in this epoch
  std::uint64_t bytes[max_vts] = {};     ///< bytes moved per VT, summed over ranks
  std::uint64_t stalls[max_vts] = {};    ///< credit stalls per VT, summed over ranks
  std::uint64_t time_ns[max_vts] = {};   ///< cost-model time of the VT's slowest rank (0: no estimate)
  std::uint64_t bw_mbps[max_vts] = {};   ///< per-rank bandwidth estimate: bytes / nranks / time_ns, in 10^6 B/s
  std::uint32_t masked_mask = 0;    ///< VTs that carried no share in this epoch
  std::uint32_t fault_mask = 0;     ///< live VTs that missed their deadline (masked from the next epoch)
  std::uint32_t probe_mask = 0;     ///< masked VTs probed in this epoch
  std::uint32_t rejoined_mask = 0;  ///< probed VTs that came back on every rank (live from the next epoch)
};

}  // namespace reccl
