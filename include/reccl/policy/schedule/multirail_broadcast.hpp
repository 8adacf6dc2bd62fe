// reccl/policy/schedule/multirail_broadcast.hpp -- broadcast that puts every NIC of the root's node to
// work: scatter over the root's node (NVLink), one share per rail across nodes, all-gather in
// every node, the three phases pipelined.
//
// Ranks are node-contiguous: node m holds ranks m*G .. m*G+G-1 (G = ranks_per_node, 0 meaning all
// ranks on one node); local rank l of every node shares a rail (its NIC). Each VT's block is cut
// into G contiguous shares, share l carried by local rank l, and each share into P = pipeline_chunks
// contiguous pieces: chunk c = l*P + p is piece p of share l (shares chunking with n = G*P, so the
// P pieces of share l cover exactly share l of a G-way cut).
//
// Piece p goes through the phases in consecutive steps: scatter in step p, rails in step p+1,
// all-gather in step p+2. So in step s the root scatters pieces s, local rank l forwards piece s-1
// of share l on its rail while every node all-gathers pieces s-2: NVLink out of the root, the rails
// and NVLink inside the receiving nodes all busy in the same step.
//
//   2 nodes x G = 4, root = rank 0 (node 0, local 0), P pieces; lk.p = piece p of share k:
//
//             node 0 (root's)                    node 1
//           l0    l1    l2    l3            l0    l1    l2    l3
//   step s  R ─l1.s─►●                                                 scatter (pieces s):
//           R ─l2.s───────►●                                           root to local rank l
//           R ─l3.s─────────────►●
//           R ──────────────l0.s-1─────────────► ●                     rails (pieces s-1): local
//                 ● ──────────l1.s-1──────────────►●                   rank l to local rank l of
//                       ● ──────────l2.s-1──────────────►●             every other node
//                             ● ──────────l3.s-1──────────────►●
//           every rank sends lk.s-2 (its own share k) to the other local ranks of its node (the
//           root sends l0.s-2; nobody sends to the root, which holds the whole block): all-gather
//
//   steps 0 .. P+1: a phase whose piece index is outside [0, P) is idle (fill and drain).
//   Receives and sends of one step touch different pieces: a rank forwards in step s only what it
//   received in an earlier step.
//
//   A phase that has nothing to do is dropped: G = 1 leaves the rail phase alone (a direct
//   broadcast, the root on its own rail to every node, in one step and one piece: there is
//   nothing to overlap), one node leaves scatter + all-gather (P + 1 steps), and N = 1 is a local
//   copy.
#pragma once

#include <cstdint>

#include "schedule.hpp"

namespace reccl::schedule {

/// Multi-rail broadcast (seed 003), pipelined. Supports broadcast.
///
/// Guarantees: every rank other than the root receives each element of the root's block exactly
/// once; across nodes, local rank l's rail carries share l only (pieces l*P .. l*P+P-1), so the G
/// rails of the root's node carry the block together; no send reads a piece written in the same
/// step.
struct multirail_broadcast {
  /// Pieces per share (P): the pipeline depth. With P pieces the three phases overlap except for
  /// the first and last two steps, so the time approaches that of the slowest phase; each step
  /// carries 1/(G*P) of the block per transfer, so P must stay small enough for a piece to stay
  /// large (the ring broadcast uses the same depth).
  static constexpr int pipeline_chunks = 8;

  std::int32_t nranks = 1;
  std::int32_t root = 0;
  std::int32_t ranks_per_node = 0;

  multirail_broadcast() = default;
  RECCL_HOST_DEVICE constexpr explicit multirail_broadcast(params const& p)
      : nranks(p.nranks), root(p.root), ranks_per_node(p.ranks_per_node) {}

  RECCL_HOST_DEVICE static constexpr bool supports(collective c) { return c == collective::broadcast; }

  RECCL_HOST_DEVICE static constexpr check_result check(params const& p) {
    if (!supports(p.coll)) return detail::invalid("multirail_broadcast: collective not supported (broadcast only)");
    check_result const c = detail::check_common(p);
    if (!c.ok()) return c;
    if (p.ranks_per_node > p.nranks || (p.ranks_per_node > 0 && p.nranks % p.ranks_per_node != 0))
      return detail::invalid("multirail_broadcast: ranks_per_node must divide nranks");
    return {};
  }

  /// Ranks per node (G).
  RECCL_HOST_DEVICE constexpr int group() const { return ranks_per_node > 0 ? ranks_per_node : nranks; }
  RECCL_HOST_DEVICE constexpr int nodes() const { return nranks / group(); }

  RECCL_HOST_DEVICE constexpr bool has_scatter() const { return group() > 1; }
  RECCL_HOST_DEVICE constexpr bool has_rails() const { return nodes() > 1; }

  /// Number of phases present (0 for a single rank).
  RECCL_HOST_DEVICE constexpr int num_phases() const { return (has_scatter() ? 2 : 0) + (has_rails() ? 1 : 0); }

  /// Pieces per share: pipeline_chunks when there are phases to overlap, else 1.
  RECCL_HOST_DEVICE constexpr int pieces() const { return num_phases() > 1 ? pipeline_chunks : 1; }

  RECCL_HOST_DEVICE constexpr int num_steps() const {
    int const ph = num_phases();
    return ph > 0 ? pieces() + ph - 1 : 1;
  }

  /// The phase that is the i-th present one: 0 scatter, 1 rails, 2 all-gather; -1 if none.
  RECCL_HOST_DEVICE constexpr int phase_at(int i) const {
    int ph[3] = {-1, -1, -1};
    int n = 0;
    if (has_scatter()) ph[n++] = 0;
    if (has_rails()) ph[n++] = 1;
    if (has_scatter()) ph[n++] = 2;
    return i >= 0 && i < n ? ph[i] : -1;
  }

  /// Chunk of piece p of share l.
  RECCL_HOST_DEVICE constexpr int chunk_of(int share, int piece) const { return share * pieces() + piece; }

  RECCL_HOST_DEVICE constexpr chunking chunks(buffer) const { return {chunking::kind::shares, group() * pieces(), 1}; }

  RECCL_HOST_DEVICE constexpr int segments(buffer b) const { return b == buffer::scratch ? 0 : 1; }

  template <class Sink>
  RECCL_HOST_DEVICE constexpr void for_each_op(int rank, int step, Sink&& sink) const {
    if (step < 0 || step >= num_steps() || rank < 0 || rank >= nranks) return;
    int const g = group(), node = rank / g, local = rank % g;
    int const root_node = root / g, np = pieces();
    bool const is_root = rank == root;
    if (is_root && step == 0)
      for (int c = 0; c < g * np; ++c) sink(local_copy(c, c));
    if (nranks == 1) return;

    // The i-th present phase works on piece step - i. Phases are listed in order (scatter, rails,
    // all-gather) on both sides, so the root's two sends to one local rank in a step (a scatter
    // piece and an all-gather piece) pair with that rank's receives in the same order.
    for (int i = 0; i < num_phases(); ++i) {
      int const p = step - i;
      if (p < 0 || p >= np) continue;
      switch (phase_at(i)) {
        case 0:  // scatter over the root's node
          if (is_root) {
            for (int l = 0; l < g; ++l)
              if (l != local) sink(send(node * g + l, chunk_of(l, p), buffer::input));
          } else if (node == root_node) {
            sink(recv_copy(root, chunk_of(local, p)));
          }
          break;
        case 1:  // one share per rail, to the same local rank of every other node
          if (node == root_node) {
            for (int m = 0; m < nodes(); ++m)
              if (m != node)
                sink(send(m * g + local, chunk_of(local, p), is_root ? buffer::input : buffer::work));
          } else {
            sink(recv_copy(root_node * g + local, chunk_of(local, p)));
          }
          break;
        case 2:  // all-gather inside every node; the root only sends
          for (int l = 0; l < g; ++l) {
            int const peer = node * g + l;
            if (l == local || peer == root) continue;
            sink(send(peer, chunk_of(local, p), is_root ? buffer::input : buffer::work));
          }
          if (!is_root)
            for (int l = 0; l < g; ++l)
              if (l != local) sink(recv_copy(node * g + l, chunk_of(l, p)));
          break;
        default: break;
      }
    }
  }
};

static_assert(Schedule<multirail_broadcast>);

}  // namespace reccl::schedule
