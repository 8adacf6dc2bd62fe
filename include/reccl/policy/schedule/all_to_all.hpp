// reccl/policy/schedule/all_to_all.hpp -- direct all-to-all, with part of chosen pairs' bytes relayed
// through a third rank on the source's node (PReCCL's relay for a slow pair).
//
//   Rank s's input segment d goes to rank d's work segment s. A relay route (src, dst, via, ppm)
//   moves the last ppm/10^6 of each VT's block of the pair src -> dst through `via`'s scratch:
//
//     pair src -> dst, one VT's block [begin, end):
//       [begin, cut)   direct head        src ─────────────────────────────► dst   (step 0)
//       [cut, end)     relayed tail       src ──► via.scratch[k]  (step 0)
//                                                 via.scratch[k] ──► dst          (step 1)
//     cut = end - floor((end - begin) * ppm / 10^6)          (integer arithmetic, exact)
//
//     step 0: every rank sends each destination's head (the whole block if the pair has no relay)
//             and each of its relayed tails to the route's via; stores its own segment locally
//     step 1: (only when relays exist) each via forwards the tails it holds to their destinations
//
//   Every element of every pair is delivered exactly once, either directly or via one relay.
//
// Chunk numbering (see for_each_piece below): chunk c < N is segment c of the buffer, restricted
// to the block. For relay k, chunk N + 2k is the pair's direct head and chunk N + 2k + 1 its tail,
// in the input (segment dst) at src, the work (segment src) at dst, and scratch segment k at via.
// Executors must enumerate pieces with schedule::for_each_piece(s, buf, chunk, ...), which uses
// this schedule's own member; chunks(buf) only describes chunks c < N.
#pragma once

#include <cstdint>

#include "schedule.hpp"

namespace reccl::schedule {

/// All-to-all schedule: direct exchange plus the relays in params.relays.
///
/// Guarantees: every element of every (src, dst) pair lands exactly once in dst's work segment
/// src; a relayed element passes through exactly one scratch element of the via rank. The relay
/// boundary is integer arithmetic on the block (the same on host and device).
struct all_to_all {
  /// Millionths: share_ppm is in [0, ppm_one].
  static constexpr std::uint32_t ppm_one = 1000000u;

  std::int32_t nranks = 1;
  std::int32_t ranks_per_node = 0;
  std::int32_t n_relays = 0;
  relay_route relays[max_relays] = {};

  all_to_all() = default;
  RECCL_HOST_DEVICE constexpr explicit all_to_all(params const& p)
      : nranks(p.nranks), ranks_per_node(p.ranks_per_node), n_relays(p.n_relays) {
    for (int k = 0; k < max_relays; ++k) relays[k] = p.relays[k];
  }

  RECCL_HOST_DEVICE static constexpr bool supports(collective c) { return c == collective::all_to_all; }

  RECCL_HOST_DEVICE static constexpr check_result check(params const& p) {
    if (!supports(p.coll)) return detail::invalid("all_to_all: collective not supported (all_to_all only)");
    check_result const c = detail::check_common(p);
    if (!c.ok()) return c;
    int const g = p.ranks_per_node;
    if (g > 0 && p.nranks % g != 0) return detail::invalid("all_to_all: ranks_per_node must divide nranks");
    for (int k = 0; k < p.n_relays; ++k) {
      relay_route const& r = p.relays[k];
      if (r.src < 0 || r.src >= p.nranks || r.dst < 0 || r.dst >= p.nranks || r.via < 0 || r.via >= p.nranks)
        return detail::invalid("all_to_all: relay src, dst and via must be ranks in [0, nranks)");
      if (r.src == r.dst || r.via == r.src || r.via == r.dst)
        return detail::invalid("all_to_all: relay src, dst and via must be three different ranks");
      if (r.share_ppm > ppm_one) return detail::invalid("all_to_all: relay share_ppm must be <= 1000000");
      if (g > 0 && r.via / g != r.src / g) return detail::invalid("all_to_all: relay via must be on the source's node");
      for (int j = 0; j < k; ++j)
        if (p.relays[j].src == r.src && p.relays[j].dst == r.dst)
          return detail::invalid("all_to_all: at most one relay per (src, dst) pair");
    }
    return {};
  }

  /// Elements of a `len`-element block that relay at `ppm`: floor(len * ppm / 10^6), without
  /// overflow for any len.
  RECCL_HOST_DEVICE static constexpr std::uint64_t relayed(std::uint64_t len, std::uint32_t ppm) {
    return (len / ppm_one) * ppm + (len % ppm_one) * ppm / ppm_one;
  }

  /// Index of the relay for pair (src, dst), or -1.
  RECCL_HOST_DEVICE constexpr int relay_of(int src, int dst) const {
    for (int k = 0; k < n_relays; ++k)
      if (relays[k].src == src && relays[k].dst == dst) return k;
    return -1;
  }

  RECCL_HOST_DEVICE constexpr int num_steps() const { return n_relays > 0 ? 2 : 1; }

  /// Describes chunks c < N only (segments); relay chunks need for_each_piece(s, ...).
  RECCL_HOST_DEVICE constexpr chunking chunks(buffer b) const {
    return {chunking::kind::segmented, b == buffer::scratch ? (n_relays > 0 ? n_relays : 1) : nranks, 1};
  }

  RECCL_HOST_DEVICE constexpr int segments(buffer b) const { return b == buffer::scratch ? n_relays : nranks; }

  /// Pieces of chunk `c` of buffer `b` within `blk` (see the chunk numbering above); nothing for a
  /// chunk index outside [0, N + 2 n_relays).
  template <class F>
  RECCL_HOST_DEVICE constexpr void for_each_piece(buffer b, int c, block blk, std::uint64_t count, F&& f) const {
    if (blk.size() == 0 || c < 0) return;
    if (c < nranks) {
      if (b != buffer::scratch) f(static_cast<std::uint64_t>(c) * count + blk.begin, blk.size());
      return;
    }
    int const k = (c - nranks) / 2;
    if (k >= n_relays) return;
    bool const tail = ((c - nranks) % 2) == 1;
    relay_route const& r = relays[k];
    int const seg = b == buffer::input ? r.dst : (b == buffer::work ? r.src : k);
    if (b == buffer::scratch && !tail) return;
    std::uint64_t const cut = blk.end - relayed(blk.size(), r.share_ppm);
    std::uint64_t const base = static_cast<std::uint64_t>(seg) * count;
    if (tail) {
      if (blk.end > cut) f(base + cut, blk.end - cut);
    } else {
      if (cut > blk.begin) f(base + blk.begin, cut - blk.begin);
    }
  }

  template <class Sink>
  RECCL_HOST_DEVICE constexpr void for_each_op(int rank, int step, Sink&& sink) const {
    int const n = nranks;
    if (step < 0 || step >= num_steps() || rank < 0 || rank >= n) return;
    if (step == 0) {
      // To each peer: its direct part first, then the tails this rank relays through it (in relay
      // order); the peer lists its receives from this rank in the same order.
      for (int d = 0; d < n; ++d) {
        if (d == rank) continue;
        int const k = relay_of(rank, d);
        sink(send(d, k < 0 ? d : n + 2 * k, buffer::input));
      }
      for (int k = 0; k < n_relays; ++k)
        if (relays[k].src == rank) sink(send(relays[k].via, n + 2 * k + 1, buffer::input));
      sink(local_copy(rank, rank));
      for (int j = 0; j < n; ++j) {
        if (j == rank) continue;
        int const k = relay_of(j, rank);
        sink(recv_copy(j, k < 0 ? j : n + 2 * k));
      }
      for (int k = 0; k < n_relays; ++k)
        if (relays[k].via == rank) sink(recv_copy(relays[k].src, n + 2 * k + 1, buffer::scratch));
      return;
    }
    for (int k = 0; k < n_relays; ++k)
      if (relays[k].via == rank) sink(send(relays[k].dst, n + 2 * k + 1, buffer::scratch));
    for (int k = 0; k < n_relays; ++k)
      if (relays[k].dst == rank) sink(recv_copy(relays[k].via, n + 2 * k + 1));
  }
};

static_assert(Schedule<all_to_all>);
static_assert(HasOwnPieces<all_to_all>);

}  // namespace reccl::schedule
