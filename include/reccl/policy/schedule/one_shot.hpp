// reccl/policy/schedule/one_shot.hpp -- every rank sends its data straight to every destination in
// one step: the lowest latency, N-1 times the bytes of a ring.
//
//   all-reduce (N = 3, one step):
//
//     r0 input ──┬──────────────► r1 ──┐        every rank receives every other rank's input and
//                └──────────────► r2   │        folds all N in canonical rank order:
//     r1 input ──┬──────────────► r0   │
//                └──────────────► r2   │          work = ((x_0 ⊕ x_1) ⊕ x_2) ⊕ ... ⊕ x_{N-1}
//     r2 input ──┬──────────────► r0   │
//                └──────────────► r1 ──┘        (x_rank itself comes from a local op)
//
//   reduce-scatter: rank r sends input segment d to rank d; rank d folds segment d of all inputs
//                   in rank order into work segment d.
//   all-gather:     rank r sends its input to every rank; rank d stores it in work segment r.
//   broadcast:      the root sends its input to every other rank.
//   all-to-all:     rank r sends input segment d to rank d, which stores it in work segment r.
//
// The fold order of every element is 0, 1, ..., N-1 whatever the split, so a one-shot and a
// two-shot all-reduce give the same bits.
#pragma once

#include <cstdint>

#include "schedule.hpp"

namespace reccl::schedule {

/// One-shot (direct) schedule: one step. Supports all five collectives.
///
/// Guarantees: reductions fold each element as the left fold x_0 ⊕ x_1 ⊕ ... ⊕ x_{N-1} (first term
/// copied, then folded in rank order), identical on every rank; copies deliver every element exactly
/// once.
struct one_shot {
  collective coll = collective::all_reduce;
  std::int32_t nranks = 1;
  std::int32_t root = 0;

  one_shot() = default;
  RECCL_HOST_DEVICE constexpr explicit one_shot(params const& p) : coll(p.coll), nranks(p.nranks), root(p.root) {}

  RECCL_HOST_DEVICE static constexpr bool supports(collective) { return true; }

  RECCL_HOST_DEVICE static constexpr check_result check(params const& p) { return detail::check_common(p); }

  RECCL_HOST_DEVICE constexpr int num_steps() const { return 1; }

  RECCL_HOST_DEVICE constexpr chunking chunks(buffer b) const {
    return {chunking::kind::segmented, b == buffer::scratch ? 1 : segments(b), 1};
  }

  RECCL_HOST_DEVICE constexpr int segments(buffer b) const {
    switch (b) {
      case buffer::input: return coll == collective::reduce_scatter || coll == collective::all_to_all ? nranks : 1;
      case buffer::work:
        return coll == collective::all_reduce || coll == collective::broadcast ? 1 : nranks;
      default: return 0;
    }
  }

  template <class Sink>
  RECCL_HOST_DEVICE constexpr void for_each_op(int rank, int step, Sink&& sink) const {
    int const n = nranks;
    if (step != 0 || rank < 0 || rank >= n) return;
    switch (coll) {
      case collective::all_reduce:
      case collective::reduce_scatter: {
        bool const rs = coll == collective::reduce_scatter;
        for (int d = 0; d < n; ++d)
          if (d != rank) sink(send(d, rs ? d : 0, buffer::input));
        int const mine = rs ? rank : 0;  // the chunk this rank folds
        for (int j = 0; j < n; ++j) {
          if (j == rank)
            sink(j == 0 ? local_copy(mine, mine) : local_reduce(mine, mine));
          else
            sink(j == 0 ? recv_copy(j, mine) : recv_reduce(j, mine));
        }
        return;
      }
      case collective::all_gather:
        for (int d = 0; d < n; ++d)
          if (d != rank) sink(send(d, 0, buffer::input));
        sink(local_copy(rank, 0));
        for (int j = 0; j < n; ++j)
          if (j != rank) sink(recv_copy(j, j));
        return;
      case collective::broadcast:
        if (rank == root) {
          for (int d = 0; d < n; ++d)
            if (d != rank) sink(send(d, 0, buffer::input));
          sink(local_copy(0, 0));
        } else {
          sink(recv_copy(root, 0));
        }
        return;
      case collective::all_to_all:
        for (int d = 0; d < n; ++d)
          if (d != rank) sink(send(d, d, buffer::input));
        sink(local_copy(rank, rank));
        for (int j = 0; j < n; ++j)
          if (j != rank) sink(recv_copy(j, j));
        return;
    }
  }
};

static_assert(Schedule<one_shot>);

}  // namespace reccl::schedule
