// reccl/policy/schedule/two_shot.hpp -- all-reduce as a direct reduce-scatter followed by a direct
// all-gather; reduce-scatter as the direct reduce-scatter alone.
//
//   all-reduce, N = 3: each VT's block is cut into N contiguous shares; rank r owns share r.
//
//     step 0 (reduce-scatter)                     step 1 (all-gather)
//     r0 ──share1──► r1   r0 ──share2──► r2       r0 ──share0──► r1, r2
//     r1 ──share0──► r0   r1 ──share2──► r2       r1 ──share1──► r0, r2
//     r2 ──share0──► r0   r2 ──share1──► r1       r2 ──share2──► r0, r1
//     rank r folds share r of all N inputs in     every rank stores the complete shares it receives
//     rank order: ((x_0 ⊕ x_1) ⊕ x_2) ⊕ ...
//
//   Which rank folds an element depends on the split; how it is folded does not (always rank order
//   0..N-1), so the result is bitwise that of one_shot, under every split.
//
//   reduce-scatter: step 0 only, with share d = segment d (rank d keeps segment d).
#pragma once

#include <cstdint>

#include "schedule.hpp"

namespace reccl::schedule {

/// Two-shot schedule. Supports all_reduce (2 steps) and reduce_scatter (1 step).
///
/// Guarantees: each element is folded x_0 ⊕ x_1 ⊕ ... ⊕ x_{N-1} (left fold in rank order) exactly
/// once, by one rank, and that value is delivered to every rank that needs it exactly once.
struct two_shot {
  collective coll = collective::all_reduce;
  std::int32_t nranks = 1;

  two_shot() = default;
  RECCL_HOST_DEVICE constexpr explicit two_shot(params const& p) : coll(p.coll), nranks(p.nranks) {}

  RECCL_HOST_DEVICE static constexpr bool supports(collective c) {
    return c == collective::all_reduce || c == collective::reduce_scatter;
  }

  RECCL_HOST_DEVICE static constexpr check_result check(params const& p) {
    if (!supports(p.coll)) return detail::invalid("two_shot: collective not supported (all_reduce, reduce_scatter)");
    return detail::check_common(p);
  }

  RECCL_HOST_DEVICE constexpr int num_steps() const {
    return coll == collective::all_reduce && nranks > 1 ? 2 : 1;
  }

  RECCL_HOST_DEVICE constexpr chunking chunks(buffer) const {
    if (coll == collective::all_reduce) return {chunking::kind::shares, nranks, 1};
    return {chunking::kind::segmented, nranks, 1};
  }

  RECCL_HOST_DEVICE constexpr int segments(buffer b) const {
    if (b == buffer::scratch) return 0;
    return coll == collective::reduce_scatter ? nranks : 1;
  }

  template <class Sink>
  RECCL_HOST_DEVICE constexpr void for_each_op(int rank, int step, Sink&& sink) const {
    int const n = nranks;
    if (step < 0 || step >= num_steps() || rank < 0 || rank >= n) return;
    if (step == 0) {  // direct reduce-scatter: rank r folds chunk r
      for (int d = 0; d < n; ++d)
        if (d != rank) sink(send(d, d, buffer::input));
      for (int j = 0; j < n; ++j) {
        if (j == rank)
          sink(j == 0 ? local_copy(rank, rank) : local_reduce(rank, rank));
        else
          sink(j == 0 ? recv_copy(j, rank) : recv_reduce(j, rank));
      }
      return;
    }
    // direct all-gather of the folded chunks
    for (int d = 0; d < n; ++d)
      if (d != rank) sink(send(d, rank));
    for (int j = 0; j < n; ++j)
      if (j != rank) sink(recv_copy(j, j));
  }
};

static_assert(Schedule<two_shot>);

}  // namespace reccl::schedule
