// reccl/device/transport/lsa.hpp -- the NVLink (LSA) transport's memory layout and device handle.
//
// Every rank owns one scratch window (ncclMemAlloc + NCCL_WIN_COLL_SYMMETRIC), the same size and
// layout on every rank, mapped into every peer's address space by NCCL (LSA pointers). Peers write
// into it (flags, staged data); its owner polls and reads it locally ("write remote, poll local").
//
//   scratch window of rank r
//   +--------------------+----------------------------------+----------------------------------+
//   | header: hello[r']  | lane 0                           | lane 1 ...                       |
//   +--------------------+----------------------------------+----------------------------------+
//   lane = | state (local only): status (+ who rejected a call), per-CTA sequence/epoch counters, |
//          |                     per-VT stall counters                                           |
//          | barrier inbox   [cta][src]          (u64: epoch << 32 | descriptor)             |
//          | ready inbox     [cta][warp][src]    (u64: staged chunk sequence published)        |
//          | credit inbox    [cta][warp][src]    (u64: ring slot sequence released)            |
//          | adaptive loop   control region (local), telemetry inbox [parity][src], arrival    |
//          |                 words [src], verdict words [parity][src][cta], probe area [cta]   |
//          | one-shot slots  [phase][src][cta] x (16-byte header + slot bytes), Lamport-poisoned |
//          | ring slots      [src][cta][warp][depth] x (chunk bytes + 16-byte header), poisoned|
//
// A lane is the unit of concurrency: collectives that may run at the same time (different streams)
// use different lanes; collectives on one lane are ordered by the caller's stream. Counters only
// grow, so flags never need resetting and CUDA-graph replays keep working.
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "../adaptive/state.hpp"
#include "../primitives.hpp"

namespace reccl::device {

/// Warps per CTA that send (pipelined engine); as many receive. Each pair owns one ring.
inline constexpr int ring_warps = 8;

/// Byte layout of one rank's scratch window. Identical on every rank (the hello handshake at
/// communicator creation checks it).
struct lsa_layout {
  std::int32_t nranks = 0;
  std::int32_t lanes = 0;
  std::int32_t max_ctas = 0;
  std::int32_t one_shot_slot_bytes = 0;  ///< per (phase, src, cta), excluding the 16-byte header
  std::int32_t ring_chunk_bytes = 0;     ///< payload per ring slot (a 16-byte header follows it)
  std::int32_t ring_depth = 0;
  std::uint64_t header_bytes = 0;
  std::uint64_t lane_bytes = 0;
  // offsets inside a lane
  std::uint64_t status_off = 0, one_shot_seq_off = 0, bar_epoch_off = 0, ring_seq_off = 0, stalls_off = 0;
  std::uint64_t bar_off = 0, ready_off = 0, credit_off = 0, one_shot_off = 0, ring_off = 0;
  std::uint64_t ctl_off = 0, tele_off = 0, probe_off = 0;  ///< the adaptive loop (device/adaptive/state.hpp)

  RECCL_HOST_DEVICE constexpr std::uint64_t total_bytes() const { return header_bytes + lane_bytes * lanes; }
  RECCL_HOST_DEVICE constexpr std::uint64_t one_shot_stride() const { return 16u + one_shot_slot_bytes; }
};

RECCL_HOST_DEVICE constexpr std::uint64_t round_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }

/// Probe area of one CTA: an input and an output of max_lsa segments, one block per warp pair.
RECCL_HOST_DEVICE constexpr std::uint64_t probe_cta_bytes() {
  return 2ull * max_lsa * ring_warps * adaptive::probe_bytes_per_warp;
}

/// The layout for `nranks` ranks and the given sizes. Pure arithmetic, same on host and device.
RECCL_HOST_DEVICE constexpr lsa_layout make_lsa_layout(int nranks, int lanes, int max_ctas, int one_shot_slot_bytes,
                                                      int ring_chunk_bytes, int ring_depth) {
  lsa_layout L;
  L.nranks = nranks;
  L.lanes = lanes;
  L.max_ctas = max_ctas;
  L.one_shot_slot_bytes = one_shot_slot_bytes;
  L.ring_chunk_bytes = ring_chunk_bytes;
  L.ring_depth = ring_depth;
  L.header_bytes = 4096;
  std::uint64_t const mc = static_cast<std::uint64_t>(max_ctas);
  std::uint64_t o = 0;
  L.status_off = o;  o += 128;
  L.one_shot_seq_off = o;  o += 8 * mc;
  L.bar_epoch_off = o;  o += 8 * mc;
  L.ring_seq_off = o;  o += 8 * mc * ring_warps;
  L.stalls_off = o;  o += 8 * max_vts;
  o = round_up(o, 4096);
  L.bar_off = o;  o = round_up(o + 8 * mc * max_lsa, 4096);
  L.ready_off = o;  o = round_up(o + 8 * mc * ring_warps * max_lsa, 4096);
  L.credit_off = o;  o = round_up(o + 8 * mc * ring_warps * max_lsa, 4096);
  L.ctl_off = o;  o = round_up(o + sizeof(adaptive::control_region), 4096);
  L.tele_off = o;
  o = round_up(o + 2ull * max_lsa * sizeof(adaptive::tele_slot) + 8ull * max_lsa + 2ull * max_lsa * 8u * mc, 4096);
  L.probe_off = o;  o = round_up(o + mc * probe_cta_bytes(), 4096);
  L.one_shot_off = o;
  o = round_up(o + 2ull * nranks * mc * (16u + static_cast<std::uint64_t>(one_shot_slot_bytes)), 4096);
  L.ring_off = o;
  o = round_up(o + static_cast<std::uint64_t>(nranks) * mc * ring_warps * ring_depth * (ring_chunk_bytes + 16u), 4096);
  L.lane_bytes = o;
  return L;
}

/// What a kernel needs to reach every rank's scratch window on one lane. Trivially copyable,
/// passed by value inside the kernel arguments.
struct lsa_view {
  char* scratch[max_lsa] = {};  ///< scratch window of each rank, as seen from this GPU (LSA address)
  lsa_layout L{};
  std::int32_t rank = 0, nranks = 0, lane = 0;

  RECCL_HOST_DEVICE char* lane_base(int owner) const {
    return scratch[owner] + L.header_bytes + static_cast<std::uint64_t>(lane) * L.lane_bytes;
  }
  // local state
  RECCL_HOST_DEVICE std::uint32_t* status() const { return status_of(rank); }
  /// `owner`'s status word (a peer's: where a rank that rejected a call on the host raises it).
  RECCL_HOST_DEVICE std::uint32_t* status_of(int owner) const {
    return reinterpret_cast<std::uint32_t*>(lane_base(owner) + L.status_off);
  }
  /// Next to `owner`'s status word: 1 + the rank whose host-side checks rejected a call and raised
  /// the lane's error everywhere, or 0 (the error, if any, was found on the device).
  RECCL_HOST_DEVICE std::uint32_t* rejected_by(int owner) const {
    return reinterpret_cast<std::uint32_t*>(lane_base(owner) + L.status_off) + 1;
  }
  /// Two words after `owner`'s status word: 1 + the peer the lane's error concerns (a timed-out
  /// wait's peer, or the rank whose call differed: device/wait.hpp raise_status), or 0.
  RECCL_HOST_DEVICE std::uint32_t* peer_of_error(int owner) const {
    return reinterpret_cast<std::uint32_t*>(lane_base(owner) + L.status_off) + 2;
  }
  RECCL_HOST_DEVICE std::uint64_t* one_shot_seq(int cta) const {
    return reinterpret_cast<std::uint64_t*>(lane_base(rank) + L.one_shot_seq_off) + cta;
  }
  RECCL_HOST_DEVICE std::uint64_t* bar_epoch(int cta) const {
    return reinterpret_cast<std::uint64_t*>(lane_base(rank) + L.bar_epoch_off) + cta;
  }
  RECCL_HOST_DEVICE std::uint64_t* ring_seq(int cta, int warp) const {
    return reinterpret_cast<std::uint64_t*>(lane_base(rank) + L.ring_seq_off) + cta * ring_warps + warp;
  }
  RECCL_HOST_DEVICE std::uint64_t* stalls(int vt) const {
    return reinterpret_cast<std::uint64_t*>(lane_base(rank) + L.stalls_off) + vt;
  }
  RECCL_HOST_DEVICE adaptive::control_region* ctl() const {
    return reinterpret_cast<adaptive::control_region*>(lane_base(rank) + L.ctl_off);
  }
  /// Telemetry inbox slot in `owner`'s memory for records of parity `parity` from rank `src`.
  RECCL_HOST_DEVICE adaptive::tele_slot* tele(int owner, int parity, int src) const {
    return reinterpret_cast<adaptive::tele_slot*>(lane_base(owner) + L.tele_off) + parity * max_lsa + src;
  }
  /// Arrival word in `owner`'s memory: the last adaptive epoch + 1 that rank `src` started.
  RECCL_HOST_DEVICE std::uint64_t* arrival(int owner, int src) const {
    return reinterpret_cast<std::uint64_t*>(lane_base(owner) + L.tele_off + 2ull * max_lsa * sizeof(adaptive::tele_slot)) + src;
  }
  /// Verdict word (adaptive::verdict_word) in `owner`'s memory from data CTA `cta` of rank `src`.
  RECCL_HOST_DEVICE std::uint64_t* verdict(int owner, int parity, int src, int cta) const {
    return arrival(owner, max_lsa) +  // right after the arrival words
           (static_cast<std::uint64_t>(parity) * max_lsa + static_cast<std::uint64_t>(src)) * static_cast<std::uint64_t>(L.max_ctas) + cta;
  }
  RECCL_HOST_DEVICE char* probe_area(int cta) const {
    return lane_base(rank) + L.probe_off + static_cast<std::uint64_t>(cta) * probe_cta_bytes();
  }
  // inboxes: `owner` is the rank whose memory holds the word, `src` the rank that writes it
  RECCL_HOST_DEVICE std::uint64_t* bar(int owner, int cta, int src) const {
    return reinterpret_cast<std::uint64_t*>(lane_base(owner) + L.bar_off) + cta * max_lsa + src;
  }
  RECCL_HOST_DEVICE std::uint64_t* ready(int owner, int cta, int warp, int src) const {
    return reinterpret_cast<std::uint64_t*>(lane_base(owner) + L.ready_off) + (cta * ring_warps + warp) * max_lsa + src;
  }
  RECCL_HOST_DEVICE std::uint64_t* credit(int owner, int cta, int warp, int src) const {
    return reinterpret_cast<std::uint64_t*>(lane_base(owner) + L.credit_off) + (cta * ring_warps + warp) * max_lsa + src;
  }
  /// One-shot slot: 16-byte header, then the payload packs.
  RECCL_HOST_DEVICE char* one_shot_slot(int owner, int phase, int src, int cta) const {
    std::uint64_t const idx = (static_cast<std::uint64_t>(phase) * L.nranks + src) * L.max_ctas + cta;
    return lane_base(owner) + L.one_shot_off + idx * L.one_shot_stride();
  }
  RECCL_HOST_DEVICE char* ring_slot(int owner, int src, int cta, int warp, std::uint64_t seq) const {
    std::uint64_t const slot = seq % static_cast<std::uint64_t>(L.ring_depth);
    std::uint64_t const idx =
        ((static_cast<std::uint64_t>(src) * L.max_ctas + cta) * ring_warps + warp) * L.ring_depth + slot;
    return lane_base(owner) + L.ring_off + idx * (static_cast<std::uint64_t>(L.ring_chunk_bytes) + 16u);
  }
};

}  // namespace reccl::device
