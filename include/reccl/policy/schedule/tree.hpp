// reccl/policy/schedule/tree.hpp -- binary-tree all-reduce (reduce to rank 0, broadcast down) and
// binary-tree broadcast from any root, both pipelined over P = pipeline_chunks shares of the block.
//
// Tree positions are heap indices v = (rank - root) mod N: children of v are 2v+1 and 2v+2, the
// parent is (v-1)/2, level(v) = floor(log2(v+1)), D = level(N-1). All-reduce uses root 0.
//
//     level 0                 v0
//                         /          \       (children of v: 2v+1, 2v+2)
//     level 1           v1            v2
//                     /    \        /    \    (N = 7, D = 2)
//     level 2       v3      v4    v5      v6
//
//   all-reduce, share k (P + 2D - 1 steps; shares overlap, so up and down traffic share a step):
//     step k+D-L     a node at level L >= 1 sends share k up (its input if it is a leaf, else its
//                    folded work)
//     step k+D-L-1   a node with children folds share k: work = input ⊕ child(2v+1) ⊕ child(2v+2)
//                    (own value first, then children in index order)
//     step k+D+L     a node at level L sends the final share k down to its children
//     step k+D+L-1   a node at level L >= 1 receives the final share k from its parent
//
//     e.g. N = 7, share 0:  step 0: v3,v4 -> v1; v5,v6 -> v2     step 1: v1,v2 -> v0 (v0 folds)
//                           step 2: v0 -> v1,v2                  step 3: v1 -> v3,v4; v2 -> v5,v6
//
//     value of node v's subtree:  T(v) = (x_v ⊕ T(2v+1)) ⊕ T(2v+2)    (result: T(0) on every rank)
//   The fold order of an element is the tree's, whatever share or VT it falls in, so moving a VT
//   boundary never changes a bit.
//
//   broadcast, share k (P + D - 1 steps): the root sends share k to its children in step k; a node
//   at level L >= 1 receives share k in step k+L-1 and forwards it to its children in step k+L.
#pragma once

#include <cstdint>

#include "schedule.hpp"

namespace reccl::schedule {

/// Binary-tree schedule, pipelined. Supports all_reduce and broadcast.
///
/// Guarantees: every rank ends with the same value T(0) for every element (all-reduce), each rank's
/// contribution folded exactly once in the tree's fixed order; broadcast delivers each element of
/// the root's input exactly once to every other rank. Sends of a step read only data that no op of
/// that step writes.
struct tree {
  /// Shares of a VT's block that travel the tree one after another.
  static constexpr int pipeline_chunks = 8;

  collective coll = collective::all_reduce;
  std::int32_t nranks = 1;
  std::int32_t root = 0;

  tree() = default;
  RECCL_HOST_DEVICE constexpr explicit tree(params const& p) : coll(p.coll), nranks(p.nranks), root(p.root) {}

  RECCL_HOST_DEVICE static constexpr bool supports(collective c) {
    return c == collective::all_reduce || c == collective::broadcast;
  }

  RECCL_HOST_DEVICE static constexpr check_result check(params const& p) {
    if (!supports(p.coll)) return detail::invalid("tree: collective not supported (all_reduce, broadcast)");
    return detail::check_common(p);
  }

  /// Level of heap position v: floor(log2(v + 1)).
  RECCL_HOST_DEVICE static constexpr int level(int v) {
    int l = 0;
    for (unsigned x = static_cast<unsigned>(v) + 1u; x > 1u; x >>= 1) ++l;
    return l;
  }
  /// Depth of the tree: the level of the last position.
  RECCL_HOST_DEVICE constexpr int depth() const { return level(nranks - 1); }

  RECCL_HOST_DEVICE constexpr int num_steps() const {
    if (nranks <= 1) return 1;
    return coll == collective::all_reduce ? pipeline_chunks + 2 * depth() - 1 : pipeline_chunks + depth() - 1;
  }

  RECCL_HOST_DEVICE constexpr chunking chunks(buffer) const { return {chunking::kind::shares, pipeline_chunks, 1}; }

  RECCL_HOST_DEVICE constexpr int segments(buffer b) const { return b == buffer::scratch ? 0 : 1; }

  template <class Sink>
  RECCL_HOST_DEVICE constexpr void for_each_op(int rank, int step, Sink&& sink) const {
    int const n = nranks;
    if (step < 0 || step >= num_steps() || rank < 0 || rank >= n) return;
    if (n == 1) {
      for (int k = 0; k < pipeline_chunks; ++k) sink(local_copy(k, k));
      return;
    }
    int const top = coll == collective::all_reduce ? 0 : root;
    int const v = detail::mod(rank - top, n);
    auto real = [&](int pos) { return detail::mod(pos + top, n); };
    int const lvl = level(v), d = depth();
    int const c1 = 2 * v + 1, c2 = 2 * v + 2;
    bool const has_kids = c1 < n;
    auto valid = [](int k) { return k >= 0 && k < pipeline_chunks; };

    if (coll == collective::broadcast) {
      if (v == 0) {
        if (valid(step)) {
          sink(local_copy(step, step));
          sink(send(real(c1), step, buffer::input));
          if (c2 < n) sink(send(real(c2), step, buffer::input));
        }
        return;
      }
      if (int const k = step - (lvl - 1); valid(k)) sink(recv_copy(real((v - 1) / 2), k));
      if (int const k = step - lvl; has_kids && valid(k)) {
        sink(send(real(c1), k));
        if (c2 < n) sink(send(real(c2), k));
      }
      return;
    }

    // all-reduce
    if (int const k = step - (d - lvl); lvl >= 1 && valid(k))
      sink(send(real((v - 1) / 2), k, has_kids ? buffer::work : buffer::input));
    if (int const k = step - (d - lvl - 1); has_kids && valid(k)) {
      sink(local_copy(k, k));
      sink(recv_reduce(real(c1), k));
      if (c2 < n) sink(recv_reduce(real(c2), k));
    }
    if (int const k = step - (d + lvl - 1); lvl >= 1 && valid(k)) sink(recv_copy(real((v - 1) / 2), k));
    if (int const k = step - (d + lvl); has_kids && valid(k)) {
      sink(send(real(c1), k));
      if (c2 < n) sink(send(real(c2), k));
    }
  }
};

static_assert(Schedule<tree>);

}  // namespace reccl::schedule
