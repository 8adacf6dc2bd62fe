// reccl/policy/schedule/ring.hpp -- ring all-reduce, reduce-scatter, all-gather, pipelined broadcast.
//
// Ranks form the ring r -> r+1 (mod N). Each VT runs the plan on its own block.
//
//   all-reduce: the block is cut into N interleaved chunks (chunk c = the block's elements whose
//   global tile index, element / tile, is c mod N). Chunk sent by each rank to rank+1, N = 4:
//
//                 r0   r1   r2   r3
//     step 0      c3   c0   c1   c2    reduce-scatter: sent from the input; the receiver folds it
//     step 1      c2   c3   c0   c1      into its own input (work[c] = input[c] ⊕ incoming)
//     step 2      c1   c2   c3   c0    -> rank r holds chunk r complete
//     step 3      c0   c1   c2   c3    all-gather: rank r starts with its complete chunk r; the
//     step 4      c3   c0   c1   c2      receiver stores what arrives and forwards it next step
//     step 5      c2   c3   c0   c1    -> every rank holds every chunk (2(N-1) steps)
//
//     chunk c, complete on rank c:  x_c ⊕ (x_{c-1} ⊕ ( ... ⊕ (x_{c+2} ⊕ x_{c+1})))   (ranks mod N)
//
//   The fold order of an element depends only on its tile index mod N (its chunk) and rank indices,
//   never on where a VT's block starts or ends, so moving a boundary never changes a bit.
//
//   reduce-scatter: the same reduce-scatter phase with chunk c = segment c (rank r keeps segment r).
//   all-gather: rank r's input enters the ring at r and travels N-1 hops (chunk c = segment c).
//
//   broadcast: a pipelined chain root -> root+1 -> ... -> root+N-1; each VT's block travels as
//   P = broadcast_chunks contiguous shares k0 .. k(P-1). Share on each link per step:
//
//                 root->+1   +1->+2   +2->+3
//     step 0        k0
//     step 1        k1         k0
//     step 2        k2         k1       k0
//     step 3        k3         k2       k1
//      ...
//   The rank at distance d from the root receives share k in step k+d-1 and forwards it in step
//   k+d: P + N - 2 steps.
#pragma once

#include <cstdint>

#include "schedule.hpp"

namespace reccl::schedule {

/// Ring schedule. Supports all_reduce, reduce_scatter, all_gather, broadcast.
///
/// Guarantees: every element of every rank's output is produced exactly once from each needed
/// contribution; for reductions the fold order of an element is fixed by its chunk (tile index mod
/// N for all-reduce, segment for reduce-scatter) and rank indices, independent of the VT split.
/// Sends of a step read only data that no op of that step writes.
struct ring {
  /// Pipeline depth of the broadcast: a VT's block travels as this many contiguous shares.
  static constexpr int broadcast_chunks = 8;

  collective coll = collective::all_reduce;
  std::int32_t nranks = 1;
  std::int32_t root = 0;
  std::uint64_t tile = 1024;

  ring() = default;
  RECCL_HOST_DEVICE constexpr explicit ring(params const& p)
      : coll(p.coll), nranks(p.nranks), root(p.root), tile(p.tile) {}

  RECCL_HOST_DEVICE static constexpr bool supports(collective c) {
    return c == collective::all_reduce || c == collective::reduce_scatter || c == collective::all_gather ||
           c == collective::broadcast;
  }

  RECCL_HOST_DEVICE static constexpr check_result check(params const& p) {
    if (!supports(p.coll)) return detail::invalid("ring: collective not supported (all_reduce, reduce_scatter, all_gather, broadcast)");
    return detail::check_common(p);
  }

  RECCL_HOST_DEVICE constexpr int num_steps() const {
    int const n = nranks;
    if (n <= 1) return 1;
    switch (coll) {
      case collective::all_reduce: return 2 * (n - 1);
      case collective::broadcast: return broadcast_chunks + n - 2;
      default: return n - 1;
    }
  }

  RECCL_HOST_DEVICE constexpr chunking chunks(buffer b) const {
    switch (coll) {
      case collective::all_reduce: return {chunking::kind::interleaved, nranks, tile};
      case collective::broadcast: return {chunking::kind::shares, broadcast_chunks, 1};
      case collective::reduce_scatter: return {chunking::kind::segmented, nranks, 1};
      case collective::all_gather:
        return b == buffer::input ? chunking{chunking::kind::segmented, 1, 1} : chunking{chunking::kind::segmented, nranks, 1};
      default: return {};
    }
  }

  RECCL_HOST_DEVICE constexpr int segments(buffer b) const {
    if (b == buffer::scratch) return 0;
    if (coll == collective::reduce_scatter) return nranks;
    if (coll == collective::all_gather && b == buffer::work) return nranks;
    return 1;
  }

  template <class Sink>
  RECCL_HOST_DEVICE constexpr void for_each_op(int rank, int step, Sink&& sink) const {
    int const n = nranks;
    if (step < 0 || step >= num_steps() || rank < 0 || rank >= n) return;
    int const next = detail::mod(rank + 1, n), prev = detail::mod(rank - 1, n);
    switch (coll) {
      case collective::all_reduce:
      case collective::reduce_scatter: {
        if (n == 1) {
          sink(local_copy(0, 0));
          return;
        }
        if (step < n - 1) {  // reduce-scatter phase
          int const out = detail::mod(rank - 1 - step, n), in = detail::mod(rank - 2 - step, n);
          sink(send(next, out, step == 0 ? buffer::input : buffer::work));
          sink(local_copy(in, in));
          sink(recv_reduce(prev, in));
        } else {  // all-gather phase (all-reduce only)
          int const t = step - (n - 1);
          sink(send(next, detail::mod(rank - t, n)));
          sink(recv_copy(prev, detail::mod(rank - 1 - t, n)));
        }
        return;
      }
      case collective::all_gather: {
        if (step == 0) {
          sink(local_copy(rank, 0));
          if (n > 1) sink(send(next, 0, buffer::input));
        } else {
          sink(send(next, detail::mod(rank - step, n)));
        }
        if (n > 1) sink(recv_copy(prev, detail::mod(rank - 1 - step, n)));
        return;
      }
      case collective::broadcast: {
        int const d = detail::mod(rank - root, n);  // distance from the root along the ring
        if (n == 1) {
          for (int k = 0; k < broadcast_chunks; ++k) sink(local_copy(k, k));
          return;
        }
        if (d == 0) {
          if (step < broadcast_chunks) {
            sink(send(next, step, buffer::input));
            sink(local_copy(step, step));
          }
          return;
        }
        int const fwd = step - d;  // share forwarded this step (received in the previous one)
        if (d < n - 1 && fwd >= 0 && fwd < broadcast_chunks) sink(send(next, fwd));
        int const got = step - d + 1;
        if (got >= 0 && got < broadcast_chunks) sink(recv_copy(prev, got));
        return;
      }
      default: return;
    }
  }
};

static_assert(Schedule<ring>);

}  // namespace reccl::schedule
