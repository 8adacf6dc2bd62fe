// reccl/testing/schedule_replay.hpp -- a host-only, sequential reference executor of any Schedule:
// the checker a schedule author (and reccl's own tests) runs a new schedule through. No engine uses it.
//
// replay runs a schedule's plan for N ranks over a given split of VT blocks exactly as the
// execution model in schedule.hpp says, one VT after another, one step after another:
//
//   for each VT v (block [offset(v), offset(v) + count[v])):
//     for each step s:
//       1. every rank lists its ops for s; sends read their chunk (a snapshot) and queue the stream
//          on the (sender -> receiver) channel of step s, in list order
//       2. every rank applies its receives and local ops in list order; a receive from peer p takes
//          the next stream that p queued for it in step s
//       3. a stream left in a channel, or a receive with nothing queued, is an error
//
// It also checks what an executor may take for granted and a schedule must guarantee:
//  * peers, buffers and chunk indices are in range; nothing writes the input buffer;
//  * every piece lies inside the VT's block (of some segment) and inside the buffer;
//  * a send never reads an element that an op of the same step (on that rank) writes, so any
//    interleaving of sends and receives within a step gives the same result;
//  * paired streams have the same length;
//  * (symbolic mode) nothing sends or folds an element that was never written.
// A violation ends the replay with a message naming the VT, step, rank and op.
//
// Two modes:
//  * data     -- replay_data<S>(params, count, split, inputs, op): real values of any type T and a
//                binary op (acc, incoming) -> acc ⊕ incoming; the reference other engines compare with.
//  * symbolic -- replay_symbolic<S>(params, count, split, arena): every element holds an expression
//                (a hash-consed tree over leaves "rank r's input element i"), so a test can see which
//                contributions an output holds, in which order they were combined, and how many
//                times each element was written or delivered.
//
// Host only: std::vector and friends, errors reported as strings in the result (no exceptions).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <utility>
#include <vector>

#include "../types.hpp"
#include "../policy/split.hpp"
#include "../policy/schedule/schedule.hpp"

namespace reccl::schedule {

/// Traffic a replay counted, summed over all VTs.
struct replay_stats {
  int steps = 0;                        ///< the schedule's num_steps()
  std::uint64_t messages = 0;           ///< matched send/receive pairs
  std::vector<std::uint64_t> sent;      ///< elements sent, per rank
  std::vector<std::uint64_t> received;  ///< elements received, per rank
};

// ------------------------------------------------------------------------------------------------
// Expressions (symbolic mode)

/// Hash-consed expression trees over input leaves. Two expressions built in the same arena are the
/// same tree (same leaves, same combination order) if and only if their ids are equal.
class expr_arena {
 public:
  using id = std::uint64_t;
  /// The value of an element nothing has written yet.
  static constexpr id none = ~std::uint64_t{0};

  /// What a tree holds, computed once per node.
  struct info {
    std::uint64_t rank_mask = 0;   ///< bit r: some leaf comes from rank r
    std::uint32_t leaves = 0;      ///< number of leaves
    bool repeated_rank = false;    ///< some rank contributes more than one leaf
    bool one_index = true;         ///< every leaf has the same element index
    std::uint64_t index = 0;       ///< that index (when one_index)
  };

  /// Rank `rank`'s input element `index` (rank < 128, index < 2^56).
  static constexpr id leaf(int rank, std::uint64_t index) {
    return leaf_bit | (static_cast<std::uint64_t>(rank) << 56) | (index & index_mask);
  }
  static constexpr bool is_leaf(id e) { return e != none && (e & leaf_bit) != 0; }
  static constexpr int leaf_rank(id e) { return static_cast<int>((e >> 56) & 0x7f); }
  static constexpr std::uint64_t leaf_index(id e) { return e & index_mask; }

  /// The expression a ⊕ b (a on the left: the accumulator; b: the incoming value).
  id combine(id a, id b) {
    if (2 * (nodes_.size() + 1) > slots_.size()) grow();
    std::size_t const mask = slots_.size() - 1;
    for (std::size_t h = hash(a, b) & mask;; h = (h + 1) & mask) {
      slot& s = slots_[h];
      if (s.node == none) {  // absent: build it
        info const ia = describe(a), ib = describe(b);
        info r;
        r.rank_mask = ia.rank_mask | ib.rank_mask;
        r.leaves = ia.leaves + ib.leaves;
        r.repeated_rank = ia.repeated_rank || ib.repeated_rank || (ia.rank_mask & ib.rank_mask) != 0;
        r.one_index = ia.one_index && ib.one_index && ia.index == ib.index;
        r.index = ia.index;
        nodes_.push_back({a, b, r});
        s = {a, b, nodes_.size() - 1};
        return s.node;
      }
      if (s.a == a && s.b == b) return s.node;
    }
  }

  info describe(id e) const {
    if (is_leaf(e)) return {std::uint64_t{1} << leaf_rank(e), 1, false, true, leaf_index(e)};
    return nodes_[e].what;
  }
  id left(id e) const { return nodes_[e].a; }
  id right(id e) const { return nodes_[e].b; }

  /// The canonical left fold ((x_0 ⊕ x_1) ⊕ x_2) ⊕ ... ⊕ x_{n-1} of element `index` of each input.
  id left_fold(int nranks, std::uint64_t index) {
    id e = leaf(0, index);
    for (int r = 1; r < nranks; ++r) e = combine(e, leaf(r, index));
    return e;
  }

  /// Readable form, e.g. "((x0[5] + x1[5]) + x2[5])"; "none" for an unwritten element.
  std::string to_string(id e) const {
    if (e == none) return "none";
    if (is_leaf(e)) return "x" + std::to_string(leaf_rank(e)) + "[" + std::to_string(leaf_index(e)) + "]";
    return "(" + to_string(left(e)) + " + " + to_string(right(e)) + ")";
  }

  /// Number of interior nodes built so far.
  std::size_t size() const { return nodes_.size(); }

 private:
  static constexpr std::uint64_t leaf_bit = std::uint64_t{1} << 63;
  static constexpr std::uint64_t index_mask = (std::uint64_t{1} << 56) - 1;
  struct node {
    id a, b;
    info what;
  };
  static std::size_t hash(id a, id b) {
    std::uint64_t h = a * 0x9e3779b97f4a7c15ull ^ (b + 0x632be59bd9b4e019ull) * 0xc2b2ae3d27d4eb4full;
    h ^= h >> 31;
    h *= 0x94d049bb133111ebull;
    return static_cast<std::size_t>(h ^ (h >> 29));
  }
  struct slot {
    id a = none, b = none, node = none;
  };
  void grow() {
    std::vector<slot> bigger(slots_.empty() ? 1024 : 2 * slots_.size());
    std::size_t const mask = bigger.size() - 1;
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      std::size_t h = hash(nodes_[i].a, nodes_[i].b) & mask;
      while (bigger[h].node != none) h = (h + 1) & mask;
      bigger[h] = {nodes_[i].a, nodes_[i].b, i};
    }
    slots_ = std::move(bigger);
  }
  std::vector<node> nodes_;
  std::vector<slot> slots_;  ///< open addressing with linear probing, at most half full
};

// ------------------------------------------------------------------------------------------------
// Results

/// Where a collective's output lives in work: all of it, or segment `rank` for reduce_scatter.
inline std::pair<std::uint64_t, std::uint64_t> output_range(collective coll, int rank, std::uint64_t count,
                                                            std::uint64_t work_size) {
  if (coll == collective::reduce_scatter) return {static_cast<std::uint64_t>(rank) * count, count};
  return {0, work_size};
}

/// Outcome of replay_data.
template <class T>
struct data_result {
  std::string error;                       ///< empty when the plan ran cleanly
  collective coll = collective::all_reduce;
  std::uint64_t count = 0;
  std::vector<std::vector<T>> work;        ///< per rank: segments(work) * count elements
  std::vector<std::vector<T>> scratch;     ///< per rank: segments(scratch) * count elements
  replay_stats stats;

  bool ok() const { return error.empty(); }
  /// The collective's output on `rank` (work, or work's segment `rank` for reduce_scatter).
  std::vector<T> output(int rank) const {
    auto const [b, n] = output_range(coll, rank, count, work[rank].size());
    return std::vector<T>(work[rank].begin() + static_cast<std::ptrdiff_t>(b),
                          work[rank].begin() + static_cast<std::ptrdiff_t>(b + n));
  }
};

/// Outcome of replay_symbolic.
struct symbolic_result {
  std::string error;                                   ///< empty when the plan ran cleanly
  collective coll = collective::all_reduce;
  std::uint64_t count = 0;
  std::vector<std::vector<expr_arena::id>> work;       ///< per rank, per work element: its expression
  std::vector<std::vector<expr_arena::id>> scratch;    ///< per rank, per scratch element
  std::vector<std::vector<std::uint32_t>> work_writes;    ///< per rank, per work element: ops that wrote it
  std::vector<std::vector<std::uint32_t>> work_receives;  ///< per rank, per work element: receives into it
  std::vector<std::vector<std::uint32_t>> scratch_writes; ///< per rank, per scratch element
  replay_stats stats;

  bool ok() const { return error.empty(); }
  /// [offset, length) of the collective's output within `rank`'s work.
  std::pair<std::uint64_t, std::uint64_t> output(int rank) const {
    return output_range(coll, rank, count, work[rank].size());
  }
};

// ------------------------------------------------------------------------------------------------
// The executor

namespace detail {

inline char const* name(action a) {
  switch (a) {
    case action::send: return "send";
    case action::recv_copy: return "recv_copy";
    case action::recv_reduce: return "recv_reduce";
    case action::local_copy: return "local_copy";
    case action::local_reduce: return "local_reduce";
  }
  return "?";
}
inline char const* name(buffer b) {
  switch (b) {
    case buffer::input: return "input";
    case buffer::work: return "work";
    case buffer::scratch: return "scratch";
  }
  return "?";
}
inline std::string describe(op const& o) {
  std::string s = std::string(name(o.act)) + "(";
  if (o.act == action::local_copy || o.act == action::local_reduce)
    return s + "work chunk " + std::to_string(o.chunk) + " <- input chunk " + std::to_string(o.src_chunk) + ")";
  return s + "peer " + std::to_string(o.peer) + ", " + name(o.buf) + " chunk " + std::to_string(o.chunk) + ")";
}

inline bool writes(action a) { return a != action::send; }
inline bool is_recv(action a) { return a == action::recv_copy || a == action::recv_reduce; }
inline bool is_local(action a) { return a == action::local_copy || a == action::local_reduce; }
inline bool folds(action a) { return a == action::recv_reduce || a == action::local_reduce; }

/// Element indices of the stream of chunk `c` of buffer `b` within `blk`, checked against the
/// buffer size and the block. Returns an error message or "".
template <class S>
std::string stream_indices(S const& s, buffer b, int c, block blk, std::uint64_t count, std::uint64_t buf_size,
                           std::vector<std::uint64_t>& out) {
  out.clear();
  if constexpr (!HasOwnPieces<S>) {
    chunking const ch = s.chunks(b);
    if (ch.n < 1) return std::string("chunks(") + name(b) + ").n < 1";
    if (ch.k == chunking::kind::interleaved && ch.tile < 1) return std::string("chunks(") + name(b) + ").tile is 0";
    int const limit = ch.k == chunking::kind::segmented ? s.segments(b) : ch.n;
    if (c < 0 || c >= limit)
      return std::string(name(b)) + " chunk " + std::to_string(c) + " out of range [0, " + std::to_string(limit) + ")";
  }
  std::string err;
  for_each_piece(s, b, c, blk, count, [&](std::uint64_t off, std::uint64_t len) {
    if (!err.empty() || len == 0) return;
    if (count == 0 || off + len < off || off + len > buf_size) {
      err = std::string(name(b)) + " piece [" + std::to_string(off) + ", +" + std::to_string(len) +
            ") outside the buffer (" + std::to_string(buf_size) + " elements)";
      return;
    }
    std::uint64_t const lo = off % count;
    if (lo < blk.begin || lo + len > blk.end) {
      err = std::string(name(b)) + " piece [" + std::to_string(off) + ", +" + std::to_string(len) +
            ") outside the VT's block [" + std::to_string(blk.begin) + ", " + std::to_string(blk.end) + ")";
      return;
    }
    for (std::uint64_t i = 0; i < len; ++i) out.push_back(off + i);
  });
  return err;
}

/// Per-rank buffers of values V: input, work, scratch (indexed by buffer).
template <class V>
using rank_buffers = std::array<std::vector<V>, 3>;

/// Runs the plan. Model provides:
///   using value = V;
///   char const* check_readable(V const&)                        -- nullptr if it may be sent/folded
///   void store(int rank, buffer b, std::uint64_t i, V& slot, V const& v, bool received)
///   void fold(int rank, buffer b, std::uint64_t i, V& slot, V const& v, bool received)  -- slot = slot ⊕ v
template <class S, class Model>
std::string execute(S const& s, int n, std::uint64_t count, split const& sp,
                    std::vector<rank_buffers<typename Model::value>>& bufs, Model& m, replay_stats& st) {
  using V = typename Model::value;
  int const steps = s.num_steps();
  st.steps = steps;
  st.messages = 0;
  st.sent.assign(static_cast<std::size_t>(n), 0);
  st.received.assign(static_cast<std::size_t>(n), 0);
  if (steps < 0) return "num_steps() is negative";

  // stamp[r][b][i] == clock: element i of buffer b on rank r is written in the current step
  std::vector<std::array<std::vector<std::uint32_t>, 3>> stamp(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < 3; ++b) stamp[r][b].assign(bufs[r][b].size(), 0);
  std::uint32_t clock = 0;

  std::vector<std::vector<op>> ops(static_cast<std::size_t>(n));
  std::vector<std::deque<std::vector<V>>> chan(static_cast<std::size_t>(n) * n);  // [from * n + to]
  std::vector<std::uint64_t> idx, src;

  for (int vt = 0; vt < sp.n_vts; ++vt) {
    block const blk{sp.offset(vt), sp.offset(vt) + sp.count[vt]};
    for (int step = 0; step < steps; ++step) {
      ++clock;
      auto where = [&](int r, op const& o) {
        return "VT " + std::to_string(vt) + ", step " + std::to_string(step) + ", rank " + std::to_string(r) + ", " +
               describe(o) + ": ";
      };
      // 1. list, validate, mark this step's writes
      for (int r = 0; r < n; ++r) {
        ops[r].clear();
        s.for_each_op(r, step, [&](op o) { ops[r].push_back(o); });
        for (op const& o : ops[r]) {
          if (static_cast<int>(o.act) > 4) return where(r, o) + "unknown action";
          if (static_cast<int>(o.buf) > 2) return where(r, o) + "unknown buffer";
          if (!is_local(o.act)) {
            if (o.peer < 0 || o.peer >= n || o.peer == r) return where(r, o) + "peer out of range or self";
          } else if (o.buf != buffer::work) {
            return where(r, o) + "local ops write work";
          }
          if (is_recv(o.act) && o.buf == buffer::input) return where(r, o) + "the input buffer is read-only";
          buffer const wb = is_local(o.act) ? buffer::work : o.buf;
          auto const& vec = bufs[r][static_cast<int>(wb)];
          std::string err = stream_indices(s, wb, o.chunk, blk, count, vec.size(), idx);
          if (!err.empty()) return where(r, o) + err;
          if (is_local(o.act)) {
            err = stream_indices(s, buffer::input, o.src_chunk, blk, count, bufs[r][0].size(), src);
            if (!err.empty()) return where(r, o) + err;
            if (src.size() != idx.size())
              return where(r, o) + "source has " + std::to_string(src.size()) + " elements, target " +
                     std::to_string(idx.size());
          }
          if (writes(o.act))
            for (std::uint64_t i : idx) stamp[r][static_cast<int>(wb)][i] = clock;
        }
      }
      // 2. sends read their streams
      for (int r = 0; r < n; ++r) {
        for (op const& o : ops[r]) {
          if (o.act != action::send) continue;
          int const b = static_cast<int>(o.buf);
          std::string err = stream_indices(s, o.buf, o.chunk, blk, count, bufs[r][b].size(), idx);
          if (!err.empty()) return where(r, o) + err;
          std::vector<V> stream;
          stream.reserve(idx.size());
          for (std::uint64_t i : idx) {
            if (stamp[r][b][i] == clock)
              return where(r, o) + "sends element " + std::to_string(i) + " that the same step writes";
            if (char const* why = m.check_readable(bufs[r][b][i]))
              return where(r, o) + "sends element " + std::to_string(i) + ": " + why;
            stream.push_back(bufs[r][b][i]);
          }
          st.sent[r] += stream.size();
          chan[static_cast<std::size_t>(r) * n + o.peer].push_back(std::move(stream));
        }
      }
      // 3. receives and local ops, in list order
      for (int r = 0; r < n; ++r) {
        for (op const& o : ops[r]) {
          if (o.act == action::send) continue;
          buffer const wb = is_local(o.act) ? buffer::work : o.buf;
          auto& vec = bufs[r][static_cast<int>(wb)];
          stream_indices(s, wb, o.chunk, blk, count, vec.size(), idx);  // validated in 1.
          if (is_recv(o.act)) {
            auto& q = chan[static_cast<std::size_t>(o.peer) * n + r];
            if (q.empty()) return where(r, o) + "no matching send from rank " + std::to_string(o.peer);
            std::vector<V> const stream = std::move(q.front());
            q.pop_front();
            if (stream.size() != idx.size())
              return where(r, o) + "stream of " + std::to_string(stream.size()) + " elements into a chunk of " +
                     std::to_string(idx.size());
            for (std::size_t k = 0; k < idx.size(); ++k) {
              if (folds(o.act)) {
                if (char const* why = m.check_readable(vec[idx[k]]))
                  return where(r, o) + "folds into element " + std::to_string(idx[k]) + ": " + why;
                m.fold(r, wb, idx[k], vec[idx[k]], stream[k], true);
              } else {
                m.store(r, wb, idx[k], vec[idx[k]], stream[k], true);
              }
            }
            st.received[r] += stream.size();
            ++st.messages;
          } else {
            stream_indices(s, buffer::input, o.src_chunk, blk, count, bufs[r][0].size(), src);
            for (std::size_t k = 0; k < idx.size(); ++k) {
              if (folds(o.act)) {
                if (char const* why = m.check_readable(vec[idx[k]]))
                  return where(r, o) + "folds into element " + std::to_string(idx[k]) + ": " + why;
                m.fold(r, wb, idx[k], vec[idx[k]], bufs[r][0][src[k]], false);
              } else {
                m.store(r, wb, idx[k], vec[idx[k]], bufs[r][0][src[k]], false);
              }
            }
          }
        }
      }
      // 4. every stream sent in this step was received
      for (int a = 0; a < n; ++a)
        for (int b = 0; b < n; ++b)
          if (auto& q = chan[static_cast<std::size_t>(a) * n + b]; !q.empty())
            return "VT " + std::to_string(vt) + ", step " + std::to_string(step) + ": rank " + std::to_string(a) +
                   " sent " + std::to_string(q.size()) + " stream(s) to rank " + std::to_string(b) +
                   " that it never received";
    }
  }
  return "";
}

template <class S>
std::string check_setup(params const& p, std::uint64_t count, split const& sp) {
  if constexpr (requires { S::check(p); }) {
    check_result const c = S::check(p);
    if (!c.ok()) return std::string("invalid params: ") + c.reason;
  } else {
    if (p.nranks < 1 || p.nranks > max_ranks) return "invalid params: nranks out of [1, max_ranks]";
    if (!S::supports(p.coll)) return "invalid params: collective not supported by the schedule";
  }
  if (sp.n_vts < 1 || sp.n_vts > max_vts) return "split.n_vts must be in [1, max_vts]";
  if (sp.sum() != count) return "split counts sum to " + std::to_string(sp.sum()) + ", not count " + std::to_string(count);
  return "";
}

template <class T, class Op>
struct data_model {
  using value = T;
  Op op;
  char const* check_readable(T const&) const { return nullptr; }
  void store(int, buffer, std::uint64_t, T& slot, T const& v, bool) { slot = v; }
  void fold(int, buffer, std::uint64_t, T& slot, T const& v, bool) { slot = op(slot, v); }
};

struct symbolic_model {
  using value = expr_arena::id;
  expr_arena* arena;
  symbolic_result* res;
  char const* check_readable(value const& v) const { return v == expr_arena::none ? "never written" : nullptr; }
  void count(int r, buffer b, std::uint64_t i, bool received) {
    if (b == buffer::work) {
      ++res->work_writes[r][i];
      if (received) ++res->work_receives[r][i];
    } else if (b == buffer::scratch) {
      ++res->scratch_writes[r][i];
    }
  }
  void store(int r, buffer b, std::uint64_t i, value& slot, value const& v, bool received) {
    slot = v;
    count(r, b, i, received);
  }
  void fold(int r, buffer b, std::uint64_t i, value& slot, value const& v, bool received) {
    slot = arena->combine(slot, v);
    count(r, b, i, received);
  }
};

}  // namespace detail

/// Data mode: runs schedule S (built from `p`) over `p.nranks` ranks on `inputs` (per rank,
/// segments(input) * count elements) with `op(acc, incoming)` as ⊕. Work and scratch start as
/// `poison`. On success result.work holds every rank's work buffer; on any violation of the
/// execution model result.error says where.
template <Schedule S, class T, class Op>
data_result<T> replay_data(params const& p, std::uint64_t count, split const& sp,
                           std::vector<std::vector<T>> const& inputs, Op op, T poison = T{}) {
  data_result<T> res;
  res.coll = p.coll;
  res.count = count;
  res.error = detail::check_setup<S>(p, count, sp);
  if (!res.ok()) return res;
  S const s(p);
  int const n = p.nranks;
  if (static_cast<int>(inputs.size()) != n) {
    res.error = "inputs has " + std::to_string(inputs.size()) + " ranks, params.nranks is " + std::to_string(n);
    return res;
  }
  std::vector<detail::rank_buffers<T>> bufs(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    std::uint64_t const want = static_cast<std::uint64_t>(s.segments(buffer::input)) * count;
    if (inputs[r].size() != want) {
      res.error = "inputs[" + std::to_string(r) + "] has " + std::to_string(inputs[r].size()) + " elements, expected " +
                  std::to_string(want);
      return res;
    }
    bufs[r][0] = inputs[r];
    bufs[r][1].assign(static_cast<std::size_t>(s.segments(buffer::work)) * count, poison);
    bufs[r][2].assign(static_cast<std::size_t>(s.segments(buffer::scratch)) * count, poison);
  }
  detail::data_model<T, Op> m{op};
  res.error = detail::execute(s, n, count, sp, bufs, m, res.stats);
  res.work.resize(static_cast<std::size_t>(n));
  res.scratch.resize(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    res.work[r] = std::move(bufs[r][1]);
    res.scratch[r] = std::move(bufs[r][2]);
  }
  return res;
}

/// Symbolic mode: runs schedule S (built from `p`) with input element i of rank r being the leaf
/// expr_arena::leaf(r, i); every op that writes an element is counted. Expressions are built in
/// `arena`, so results of several replays sharing an arena compare by id.
template <Schedule S>
symbolic_result replay_symbolic(params const& p, std::uint64_t count, split const& sp, expr_arena& arena) {
  symbolic_result res;
  res.coll = p.coll;
  res.count = count;
  res.error = detail::check_setup<S>(p, count, sp);
  if (!res.ok()) return res;
  S const s(p);
  int const n = p.nranks;
  std::vector<detail::rank_buffers<expr_arena::id>> bufs(static_cast<std::size_t>(n));
  res.work_writes.resize(static_cast<std::size_t>(n));
  res.work_receives.resize(static_cast<std::size_t>(n));
  res.scratch_writes.resize(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    std::uint64_t const in = static_cast<std::uint64_t>(s.segments(buffer::input)) * count;
    bufs[r][0].resize(in);
    for (std::uint64_t i = 0; i < in; ++i) bufs[r][0][i] = expr_arena::leaf(r, i);
    bufs[r][1].assign(static_cast<std::size_t>(s.segments(buffer::work)) * count, expr_arena::none);
    bufs[r][2].assign(static_cast<std::size_t>(s.segments(buffer::scratch)) * count, expr_arena::none);
    res.work_writes[r].assign(bufs[r][1].size(), 0);
    res.work_receives[r].assign(bufs[r][1].size(), 0);
    res.scratch_writes[r].assign(bufs[r][2].size(), 0);
  }
  detail::symbolic_model m{&arena, &res};
  res.error = detail::execute(s, n, count, sp, bufs, m, res.stats);
  res.work.resize(static_cast<std::size_t>(n));
  res.scratch.resize(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    res.work[r] = std::move(bufs[r][1]);
    res.scratch[r] = std::move(bufs[r][2]);
  }
  return res;
}

/// The straightforward reference: the output `rank` must hold for collective p.coll over `inputs`
/// (per rank: nranks * count elements for reduce_scatter and all_to_all, count otherwise), with
/// reductions folded left in rank order 0, 1, ..., N-1.
template <class T, class Op>
std::vector<T> reference_output(params const& p, std::uint64_t count, std::vector<std::vector<T>> const& inputs, Op op,
                                int rank) {
  int const n = p.nranks;
  std::vector<T> out;
  switch (p.coll) {
    case collective::all_reduce:
    case collective::reduce_scatter: {
      std::uint64_t const base = p.coll == collective::reduce_scatter ? static_cast<std::uint64_t>(rank) * count : 0;
      out.resize(count);
      for (std::uint64_t i = 0; i < count; ++i) {
        T acc = inputs[0][base + i];
        for (int r = 1; r < n; ++r) acc = op(acc, inputs[r][base + i]);
        out[i] = acc;
      }
      break;
    }
    case collective::all_gather:
      for (int r = 0; r < n; ++r) out.insert(out.end(), inputs[r].begin(), inputs[r].begin() + static_cast<std::ptrdiff_t>(count));
      break;
    case collective::broadcast: out.assign(inputs[p.root].begin(), inputs[p.root].begin() + static_cast<std::ptrdiff_t>(count)); break;
    case collective::all_to_all:
      for (int r = 0; r < n; ++r) {
        auto const b = inputs[r].begin() + static_cast<std::ptrdiff_t>(static_cast<std::uint64_t>(rank) * count);
        out.insert(out.end(), b, b + static_cast<std::ptrdiff_t>(count));
      }
      break;
  }
  return out;
}

}  // namespace reccl::schedule
