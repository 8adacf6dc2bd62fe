// reccl/policy/schedule/multirail_broadcast.hpp -- broadcast that puts every NIC of the root's node to
// work: scatter over the root's node (NVLink), one share per rail across nodes, all-gather in
// every node.
//
// Ranks are node-contiguous: node m holds ranks m*G .. m*G+G-1 (G = ranks_per_node, 0 meaning all
// ranks on one node); local rank l of every node shares a rail (its NIC). Each VT's block is cut
// into G contiguous shares; share l is carried by local rank l.
//
//   2 nodes x G = 4, root = rank 0 (node 0, local 0):
//
//             node 0 (root's)                    node 1
//           l0    l1    l2    l3            l0    l1    l2    l3
//   step 0  R ─s1─►●                                                   scatter over NVLink:
//           R ─s2────────►●                                            root sends share l to
//           R ─s3──────────────►●                                      local rank l
//   step 1  R ─────────────s0──────────────► ●                         rails: local rank l sends
//                 ● ──────────s1──────────────────►●                   share l to local rank l
//                       ● ──────────s2──────────────────►●             of every other node
//                             ● ──────────s3──────────────────►●
//   step 2  every rank sends its share l to the other local ranks of its node (the root sends
//           share l0; nobody sends to the root, which holds the whole block): all-gather in node
//
//   3 steps; a phase that has nothing to do is dropped: G = 1 leaves the rail step alone (a direct
//   broadcast, the root on its own rail to every node), one node leaves scatter + all-gather, and
//   N = 1 is a local copy.
#pragma once

#include <cstdint>

#include "schedule.hpp"

namespace reccl::schedule {

/// Multi-rail broadcast (seed 003). Supports broadcast.
///
/// Guarantees: every rank other than the root receives each element of the root's block exactly
/// once; across nodes, local rank l's rail carries share l only, so the G rails of the root's node
/// carry the block together.
struct multirail_broadcast {
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

  RECCL_HOST_DEVICE constexpr int num_steps() const {
    int const s = (has_scatter() ? 2 : 0) + (has_rails() ? 1 : 0);
    return s > 0 ? s : 1;
  }

  /// Phase of a step: 0 scatter, 1 rails, 2 all-gather (phases with nothing to do are dropped).
  RECCL_HOST_DEVICE constexpr int phase_of(int step) const {
    int ph[3] = {-1, -1, -1};
    int n = 0;
    if (has_scatter()) ph[n++] = 0;
    if (has_rails()) ph[n++] = 1;
    if (has_scatter()) ph[n++] = 2;
    return step >= 0 && step < n ? ph[step] : -1;
  }

  RECCL_HOST_DEVICE constexpr chunking chunks(buffer) const { return {chunking::kind::shares, group(), 1}; }

  RECCL_HOST_DEVICE constexpr int segments(buffer b) const { return b == buffer::scratch ? 0 : 1; }

  template <class Sink>
  RECCL_HOST_DEVICE constexpr void for_each_op(int rank, int step, Sink&& sink) const {
    if (step < 0 || step >= num_steps() || rank < 0 || rank >= nranks) return;
    int const g = group(), node = rank / g, local = rank % g;
    int const root_node = root / g;
    bool const is_root = rank == root;
    if (is_root && step == 0)
      for (int k = 0; k < g; ++k) sink(local_copy(k, k));
    if (nranks == 1) return;

    switch (phase_of(step)) {
      case 0:  // scatter over the root's node
        if (is_root) {
          for (int l = 0; l < g; ++l)
            if (l != local) sink(send(node * g + l, l, buffer::input));
        } else if (node == root_node) {
          sink(recv_copy(root, local));
        }
        return;
      case 1:  // one share per rail, to the same local rank of every other node
        if (node == root_node) {
          for (int m = 0; m < nodes(); ++m)
            if (m != node) sink(send(m * g + local, local, is_root ? buffer::input : buffer::work));
        } else {
          sink(recv_copy(root_node * g + local, local));
        }
        return;
      case 2:  // all-gather inside every node; the root only sends
        for (int l = 0; l < g; ++l) {
          int const peer = node * g + l;
          if (l == local || peer == root) continue;
          sink(send(peer, local, is_root ? buffer::input : buffer::work));
        }
        if (!is_root)
          for (int l = 0; l < g; ++l)
            if (l != local) sink(recv_copy(node * g + l, l));
        return;
      default: return;
    }
  }
};

static_assert(Schedule<multirail_broadcast>);

}  // namespace reccl::schedule
