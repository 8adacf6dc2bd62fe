// reccl_sim/plan.hpp -- a reccl Schedule's plan, compiled into phases of flows.
//
//   schedule.for_each_op(rank, step)          compiled_plan
//   ┌────────┬────────────────────────┐       ┌───────────────────────────────────────────────┐
//   │ step 0 │ r0→r1 c3  r1→r2 c0 ... │ ──┐   │ phase 0: steps 0..2N-3, flows {r→r+1}         │
//   │ step 1 │ r0→r1 c2  r1→r2 c3 ... │   ├─▶ │   flow r→r+1 carries chunks (in, c_r-1),     │
//   │  ...   │ (same pairs)           │ ──┘   │   (work, c_r-2), ... in step order           │
//   │ step k │ r0→r2 ...  (new pairs) │ ────▶ │ phase 1: ...                                  │
//   └────────┴────────────────────────┘       └───────────────────────────────────────────────┘
//
// The simulator runs the project's schedules, not a model of them: it enumerates every op of every
// (rank, step), checks that sends and receives pair up (the executor contract in schedule.hpp), and
// groups consecutive steps that connect the same (sender, receiver) pairs into one phase. Within a
// phase each pair is one flow: its bytes are the sum of the chunk lengths it sends, which depend on
// a VT's block and are computed per collective through schedule::chunk_length -- the same
// function every executor uses. A ring all-reduce is one phase of 2(N−1) steps; a tree or a
// pipelined broadcast is one phase per step whose pairs change.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <reccl/policy/schedule/schedule.hpp>

namespace reccl_sim {

namespace sched = reccl::schedule;

/// A chunk of a buffer: what a send or receive moves.
struct chunk_key {
  sched::buffer buf = sched::buffer::work;
  std::int32_t chunk = 0;
  bool operator==(chunk_key const&) const = default;
};

/// Consecutive steps that connect the same pairs; each pair is one flow.
struct plan_phase {
  std::int32_t first_step = 0;
  std::int32_t n_steps = 0;
  std::vector<std::pair<std::int32_t, std::int32_t>> flows;  ///< (sender rank, receiver rank), sorted
  std::vector<std::uint32_t> send_begin;  ///< flow f sends keys send_keys[send_begin[f] .. send_begin[f+1])
  std::vector<std::uint32_t> send_keys;   ///< indices into compiled_plan::keys
  std::vector<std::uint32_t> recv_begin;  ///< the receiver's matching receives, same layout
  std::vector<std::uint32_t> recv_keys;
};

/// A schedule's plan for one collective shape, independent of the split (the bytes of a chunk
/// depend on a VT's block and are computed per collective with `chunk_length`).
struct compiled_plan {
  reccl::collective coll = reccl::collective::all_reduce;
  std::int32_t nranks = 0;
  std::int32_t num_steps = 0;
  std::string schedule_name;
  std::vector<chunk_key> keys;
  std::vector<plan_phase> phases;
  /// Elements of chunk key k within block `blk` of a per-rank count `count`.
  std::function<std::uint64_t(chunk_key, sched::block, std::uint64_t)> chunk_length;
  std::uint64_t sends = 0;  ///< send ops in the whole plan

  /// Elements of every key for one VT block: lengths[k] for keys[k].
  std::vector<std::uint64_t> key_lengths(sched::block blk, std::uint64_t count) const {
    std::vector<std::uint64_t> len(keys.size());
    for (std::size_t k = 0; k < keys.size(); ++k) len[k] = chunk_length(keys[k], blk, count);
    return len;
  }
};

/// Checks `p` with the schedule's own check(). Rank counts above reccl::max_ranks are allowed here:
/// that limit sizes the epoch records (per-rank slots), not the schedules' index arithmetic, and
/// compile_plan verifies the resulting plan's pairing itself. Throws std::invalid_argument with the
/// schedule's reason otherwise.
template <reccl::Schedule S>
void check_params(sched::params const& p) {
  sched::params q = p;
  if (q.nranks > reccl::max_ranks) {
    q.nranks = reccl::max_ranks;
    if (q.root >= q.nranks) q.root = 0;
  }
  if (p.nranks < 1) throw std::invalid_argument("schedule params: nranks must be >= 1");
  if (p.root < 0 || p.root >= p.nranks) throw std::invalid_argument("schedule params: root must be in [0, nranks)");
  sched::check_result const c = S::check(q);
  if (!c.ok()) throw std::invalid_argument(std::string("schedule params rejected: ") + c.reason);
}

/// Enumerates the whole plan of schedule S for `p` and groups it into phases. Throws
/// std::invalid_argument for params the schedule rejects and std::logic_error if a step's sends and
/// receives do not pair up.
template <reccl::Schedule S>
compiled_plan compile_plan(sched::params const& p, std::string name = "") {
  check_params<S>(p);
  S const s(p);
  compiled_plan out;
  out.coll = p.coll;
  out.nranks = p.nranks;
  out.num_steps = s.num_steps();
  out.schedule_name = std::move(name);
  out.chunk_length = [s](chunk_key k, sched::block blk, std::uint64_t count) {
    return sched::chunk_length(s, k.buf, k.chunk, blk, count);
  };
  // Key table: per buffer, chunk id -> index into out.keys (-1: not seen yet).
  std::vector<std::int64_t> dense[3];
  auto intern = [&](sched::buffer b, int c) -> std::uint32_t {
    if (c < 0) throw std::logic_error("plan: negative chunk id");
    auto& d = dense[static_cast<std::size_t>(b) % 3];
    if (d.size() <= static_cast<std::size_t>(c)) d.resize(static_cast<std::size_t>(c) + 1, -1);
    if (d[static_cast<std::size_t>(c)] < 0) {
      d[static_cast<std::size_t>(c)] = static_cast<std::int64_t>(out.keys.size());
      out.keys.push_back({b, c});
    }
    return static_cast<std::uint32_t>(d[static_cast<std::size_t>(c)]);
  };

  struct xfer {
    std::int32_t src, dst;
    std::uint32_t seq;  // order within the step for this pair
    std::uint32_t key;
    bool operator<(xfer const& o) const {
      if (src != o.src) return src < o.src;
      if (dst != o.dst) return dst < o.dst;
      return seq < o.seq;
    }
  };
  std::vector<xfer> sends, recvs;
  std::vector<std::pair<std::int32_t, std::int32_t>> pairs, prev_pairs;
  plan_phase cur;
  bool have_cur = false;
  // Per flow key lists of the current phase, before flattening.
  std::vector<std::vector<std::uint32_t>> cur_send, cur_recv;

  auto flush = [&]() {
    if (!have_cur) return;
    cur.send_begin.assign(1, 0);
    cur.recv_begin.assign(1, 0);
    for (std::size_t f = 0; f < cur.flows.size(); ++f) {
      cur.send_keys.insert(cur.send_keys.end(), cur_send[f].begin(), cur_send[f].end());
      cur.recv_keys.insert(cur.recv_keys.end(), cur_recv[f].begin(), cur_recv[f].end());
      cur.send_begin.push_back(static_cast<std::uint32_t>(cur.send_keys.size()));
      cur.recv_begin.push_back(static_cast<std::uint32_t>(cur.recv_keys.size()));
    }
    out.phases.push_back(std::move(cur));
    cur = plan_phase{};
    have_cur = false;
  };

  for (int step = 0; step < out.num_steps; ++step) {
    sends.clear();
    recvs.clear();
    for (int r = 0; r < p.nranks; ++r) {
      s.for_each_op(r, step, [&](sched::op const& o) {
        switch (o.act) {
          case sched::action::send:
            if (o.peer < 0 || o.peer >= p.nranks || o.peer == r)
              throw std::logic_error("plan: rank " + std::to_string(r) + " step " + std::to_string(step) +
                                     " sends to invalid peer " + std::to_string(o.peer));
            sends.push_back({r, o.peer, 0, intern(o.buf, o.chunk)});
            break;
          case sched::action::recv_copy:
          case sched::action::recv_reduce:
            if (o.peer < 0 || o.peer >= p.nranks || o.peer == r)
              throw std::logic_error("plan: rank " + std::to_string(r) + " step " + std::to_string(step) +
                                     " receives from invalid peer " + std::to_string(o.peer));
            recvs.push_back({o.peer, r, 0, intern(o.buf, o.chunk)});
            break;
          default: break;
        }
      });
    }
    // Pairing: the k-th send a->b pairs with b's k-th receive from a (list order within a rank is
    // enumeration order, so a stable sort by (src, dst) keeps it).
    auto number = [](std::vector<xfer>& v) {
      std::stable_sort(v.begin(), v.end(), [](xfer const& a, xfer const& b) {
        return a.src != b.src ? a.src < b.src : a.dst < b.dst;
      });
      for (std::size_t i = 0; i < v.size(); ++i)
        v[i].seq = (i > 0 && v[i - 1].src == v[i].src && v[i - 1].dst == v[i].dst) ? v[i - 1].seq + 1 : 0;
    };
    number(sends);
    number(recvs);
    if (sends.size() != recvs.size())
      throw std::logic_error("plan: step " + std::to_string(step) + " has " + std::to_string(sends.size()) +
                             " sends but " + std::to_string(recvs.size()) + " receives");
    for (std::size_t i = 0; i < sends.size(); ++i)
      if (sends[i].src != recvs[i].src || sends[i].dst != recvs[i].dst || sends[i].seq != recvs[i].seq)
        throw std::logic_error("plan: step " + std::to_string(step) + ": send " + std::to_string(sends[i].src) + "->" +
                               std::to_string(sends[i].dst) + " has no matching receive");
    out.sends += sends.size();
    pairs.clear();
    for (auto const& x : sends)
      if (pairs.empty() || pairs.back() != std::make_pair(x.src, x.dst)) pairs.emplace_back(x.src, x.dst);
    if (!have_cur || pairs != prev_pairs) {
      flush();
      cur.first_step = step;
      cur.flows = pairs;
      cur_send.assign(pairs.size(), {});
      cur_recv.assign(pairs.size(), {});
      have_cur = true;
      prev_pairs = pairs;
    }
    ++cur.n_steps;
    std::size_t f = 0;
    for (std::size_t i = 0; i < sends.size(); ++i) {
      while (cur.flows[f] != std::make_pair(sends[i].src, sends[i].dst)) ++f;
      cur_send[f].push_back(sends[i].key);
      cur_recv[f].push_back(recvs[i].key);
    }
  }
  flush();
  return out;
}

}  // namespace reccl_sim
