// reccl/policy/schedule/schedule.hpp -- the Schedule concept and the plan a schedule emits.
//
// A schedule is pure index arithmetic: for (rank, step) it lists the ops that rank performs on one
// VT's block [begin, end) of the per-rank count. The CPU engine, the GPU schedule agent
// (device/agent/plan.hpp, behind collective_op on transport::p2p), the flow-level simulator and
// the property tests (testing/schedule_replay.hpp) execute the same plan. The NVLink fast path's
// own kernels (device/engine/) do not use it yet: docs/device-layer.md says which path runs what.
//
// Execution model (what every executor implements):
//  * Each rank holds three buffers, each a whole number of `count`-element segments:
//      input   -- the user's send buffer            (segments(input))
//      work    -- the result buffer                  (segments(work)); output is taken from it
//      scratch -- a relay/staging area               (segments(scratch), 0 if unused)
//  * A chunk of a buffer is an element stream: the pieces for_each_piece() yields, in order.
//  * Steps run in order on every (rank, VT). Within a step a rank may progress its sends and
//    receives in any interleaving, but applies receives and local ops in list order.
//  * A send from a to b in step s pairs with the receive from a listed by b in step s; several
//    sends a->b in one step pair with b's receives from a in list order. Both streams have the
//    same length.
//  * The output is work, except reduce_scatter, whose output is work's segment `rank`.
//  * x ⊕ y is the reduction op; ops are applied to the elements of the stream position by position.
//
// Determinism: the order in which an element's contributions are combined must depend only on
// rank indices and the element's global index (never on VT or chunk boundaries), so moving a VT
// boundary never changes a bit of the result.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "../../config.hpp"
#include "../../types.hpp"

namespace reccl::schedule {

enum class buffer : std::uint8_t { input, work, scratch };

enum class action : std::uint8_t {
  send,          ///< stream chunk `chunk` of `buf` to `peer`
  recv_copy,     ///< receive a stream from `peer` into chunk `chunk` of `buf` (overwrite)
  recv_reduce,   ///< receive from `peer`: buf[chunk] = buf[chunk] ⊕ incoming
  local_copy,    ///< work[chunk] = input[src_chunk]
  local_reduce,  ///< work[chunk] = work[chunk] ⊕ input[src_chunk]
};

struct op {
  action act;
  buffer buf;
  std::int16_t peer;       ///< rank, for send/recv; -1 for local ops
  std::int32_t chunk;      ///< chunk of `buf` (for local ops: of work)
  std::int32_t src_chunk;  ///< for local ops: chunk of input; unused otherwise
};

RECCL_HOST_DEVICE constexpr op send(int peer, int chunk, buffer b = buffer::work) {
  return {action::send, b, static_cast<std::int16_t>(peer), chunk, -1};
}
RECCL_HOST_DEVICE constexpr op recv_copy(int peer, int chunk, buffer b = buffer::work) {
  return {action::recv_copy, b, static_cast<std::int16_t>(peer), chunk, -1};
}
RECCL_HOST_DEVICE constexpr op recv_reduce(int peer, int chunk, buffer b = buffer::work) {
  return {action::recv_reduce, b, static_cast<std::int16_t>(peer), chunk, -1};
}
RECCL_HOST_DEVICE constexpr op local_copy(int chunk, int src_chunk) {
  return {action::local_copy, buffer::work, -1, chunk, src_chunk};
}
RECCL_HOST_DEVICE constexpr op local_reduce(int chunk, int src_chunk) {
  return {action::local_reduce, buffer::work, -1, chunk, src_chunk};
}

/// A VT's block of the per-rank count: elements [begin, end).
struct block {
  std::uint64_t begin = 0, end = 0;
  RECCL_HOST_DEVICE constexpr std::uint64_t size() const { return end - begin; }
};

/// How a buffer is cut into chunks.
///  * interleaved: one segment; chunk c = the elements of the block whose tile index
///    (element / tile) is congruent to c modulo n. Depends only on the global element index, so a
///    ring's reduction order ignores VT boundaries.
///  * segmented: chunk c = segment c restricted to the block: elements c*count + [begin, end).
///  * shares: one segment; chunk c = the c-th of n near-equal contiguous parts of the block.
struct chunking {
  enum class kind : std::uint8_t { interleaved, segmented, shares };
  kind k = kind::segmented;
  std::int32_t n = 1;
  std::uint64_t tile = 1;
};

/// Calls f(offset, length) for each contiguous piece of chunk `c` of a buffer laid out as `ch`,
/// restricted to block `blk`, in stream order. Offsets are element offsets into the buffer.
template <class F>
RECCL_HOST_DEVICE constexpr void for_each_piece(chunking const& ch, int c, block blk, std::uint64_t count, F&& f) {
  if (blk.size() == 0) return;
  switch (ch.k) {
    case chunking::kind::segmented:
      f(static_cast<std::uint64_t>(c) * count + blk.begin, blk.size());
      return;
    case chunking::kind::shares: {
      std::uint64_t const n = static_cast<std::uint64_t>(ch.n), len = blk.size();
      std::uint64_t const b = blk.begin + len * c / n, e = blk.begin + len * (c + 1) / n;
      if (e > b) f(b, e - b);
      return;
    }
    case chunking::kind::interleaved: {
      std::uint64_t const t = ch.tile, n = static_cast<std::uint64_t>(ch.n);
      // first tile index >= tile(begin) that is congruent to c
      std::uint64_t tile = blk.begin / t;
      std::uint64_t const r = tile % n, cc = static_cast<std::uint64_t>(c);
      tile += (cc + n - r) % n;
      for (; tile * t < blk.end; tile += n) {
        std::uint64_t const b = tile * t > blk.begin ? tile * t : blk.begin;
        std::uint64_t const e = (tile + 1) * t < blk.end ? (tile + 1) * t : blk.end;
        f(b, e - b);
      }
      return;
    }
  }
}

/// Number of elements in chunk `c` (the stream length).
RECCL_HOST_DEVICE constexpr std::uint64_t chunk_length(chunking const& ch, int c, block blk, std::uint64_t count) {
  std::uint64_t n = 0;
  for_each_piece(ch, c, blk, count, [&](std::uint64_t, std::uint64_t len) { n += len; });
  return n;
}

/// A relayed share of one (src -> dst) pair's bytes, for all-to-all (PReCCL's relay through a
/// same-node rank). The last `share_ppm` millionths of the pair's block travel src -> via -> dst.
struct relay_route {
  std::int16_t src = -1, dst = -1, via = -1;
  std::uint32_t share_ppm = 0;
};
inline constexpr int max_relays = 8;

/// Everything a schedule is built from. Trivially copyable; identical on every rank.
struct params {
  collective coll = collective::all_reduce;
  std::int32_t nranks = 1;
  std::int32_t root = 0;              ///< broadcast root
  std::int32_t ranks_per_node = 0;    ///< 0: all ranks on one node (multi-rail broadcast, relays)
  std::uint64_t tile = 1024;          ///< elements per tile for interleaved chunking
  std::int32_t n_relays = 0;
  relay_route relays[max_relays] = {};
};

namespace detail {
struct op_sink_archetype {
  RECCL_HOST_DEVICE void operator()(op) const {}
};
}  // namespace detail

/// A Schedule: constructible from params, trivially copyable (kernels take it by value), and able
/// to list its ops for any (rank, step).
template <class S>
concept Schedule = std::is_trivially_copyable_v<S> && std::constructible_from<S, params const&> &&
                   requires(S const s, int rank, int step, buffer b, collective c, detail::op_sink_archetype sink) {
                     { S::supports(c) } -> std::convertible_to<bool>;
                     { s.num_steps() } -> std::convertible_to<int>;
                     { s.chunks(b) } -> std::same_as<chunking>;
                     { s.segments(b) } -> std::convertible_to<int>;
                     s.for_each_op(rank, step, sink);
                   };

// ---------------------------------------------------------------------------------------------------
// Helpers shared by the schedules (ring.hpp, tree.hpp, one_shot.hpp, two_shot.hpp, all_to_all.hpp,
// multirail_broadcast.hpp) and their executors.

/// Outcome of checking `params` against a schedule: `ok`, or `invalid_argument` with a reason that
/// names the offending field. Every schedule provides `static check_result check(params const&)`;
/// a schedule built from params that do not pass its check emits an unspecified (but finite) plan.
struct check_result {
  status st = status::ok;
  char const* reason = "ok";
  RECCL_HOST_DEVICE constexpr bool ok() const { return st == status::ok; }
};

namespace detail {

/// a mod n in [0, n) for any sign of a (n > 0).
RECCL_HOST_DEVICE constexpr int mod(int a, int n) {
  int const m = a % n;
  return m < 0 ? m + n : m;
}

RECCL_HOST_DEVICE constexpr check_result invalid(char const* reason) { return {status::invalid_argument, reason}; }

/// Checks every schedule shares: rank count, tile, root, node size and relay table shape.
RECCL_HOST_DEVICE constexpr check_result check_common(params const& p) {
  if (p.nranks < 1 || p.nranks > max_ranks) return invalid("params.nranks must be in [1, max_ranks]");
  if (p.tile < 1) return invalid("params.tile must be >= 1");
  if (p.root < 0 || p.root >= p.nranks) return invalid("params.root must be in [0, nranks)");
  if (p.ranks_per_node < 0) return invalid("params.ranks_per_node must be >= 0 (0: one node)");
  if (p.n_relays < 0 || p.n_relays > max_relays) return invalid("params.n_relays must be in [0, max_relays]");
  return {};
}

}  // namespace detail

/// True when S describes some chunks with its own member
/// `for_each_piece(buffer, int chunk, block, std::uint64_t count, F&&)` instead of `chunks(buf)`
/// alone (all_to_all with relays splits one segment into a direct head and a relayed tail).
template <class S>
concept HasOwnPieces = requires(S const s, buffer b, int c, block blk, std::uint64_t count,
                                void (*f)(std::uint64_t, std::uint64_t)) { s.for_each_piece(b, c, blk, count, f); };

/// The pieces of chunk `c` of buffer `b` of schedule `s`, restricted to block `blk`, in stream
/// order: f(offset, length) with element offsets into the buffer. Executors call this (not
/// for_each_piece(s.chunks(b), ...)) so that schedules with their own chunk layout work too; for
/// every other schedule it is exactly for_each_piece(s.chunks(b), c, blk, count, f).
template <class S, class F>
RECCL_HOST_DEVICE constexpr void for_each_piece(S const& s, buffer b, int c, block blk, std::uint64_t count, F&& f) {
  if constexpr (HasOwnPieces<S>) {
    s.for_each_piece(b, c, blk, count, f);
  } else {
    for_each_piece(s.chunks(b), c, blk, count, f);
  }
}

/// Number of elements in chunk `c` of buffer `b` of schedule `s` within `blk` (the stream length).
template <class S>
RECCL_HOST_DEVICE constexpr std::uint64_t chunk_length(S const& s, buffer b, int c, block blk, std::uint64_t count) {
  std::uint64_t n = 0;
  for_each_piece(s, b, c, blk, count, [&](std::uint64_t, std::uint64_t len) { n += len; });
  return n;
}

}  // namespace reccl::schedule

namespace reccl {
using schedule::Schedule;
}
