// reccl/cpu/executor.hpp -- runs one VT's block of any Schedule's plan on one rank, over the
// CPU-thread transport, with bounded waits and stall counting.
//
//   for step in 0 .. num_steps-1:                  (one worker thread per (rank, VT))
//     ops = schedule.for_each_op(rank, step)
//     ┌─ progress loop ─────────────────────────────────────────────────────────────┐
//     │ sends:   every send streams its chunk slot by slot as credit allows          │
//     │          (sends to one peer go in list order: they share the link's FIFO)    │
//     │ applies: receives and local ops in list order; a receive takes slots as they │
//     │          arrive, copies or folds them into its chunk, and returns credit     │
//     │ idle:    nothing moved -> sleep (10 us doubling up to one poll quantum); the │
//     │          time waited while a send is blocked on credit is stall time, else   │
//     │          data-wait time; no progress for `timeout_ns` -> timeout              │
//     └──────────────────────────────────────────────────────────────────────────────┘
//
// A stream is cut into slots by stream position (slot j = elements [j*E, (j+1)*E) of the stream,
// E = slot_bytes / sizeof(T)), so sender and receiver agree on every slot without a header even
// when their chunks are laid out differently. A slot may span several pieces of a chunk: the
// sender fills it with one put per piece part, the receiver scatters it the same way.
//
// Stall counts: a stall is one poll quantum (fabric_config::poll_quantum_ns) of waiting. The
// counts are the waited time divided by the quantum, so they are proportional to waiting time and
// do not depend on how often the worker happened to poll.
//
// Virtual time (fabric_config::virtual_time): the waits are measured on a virtual clock instead.
// A slot is handed over at max(its stream's previous slot, the time its credit came back), the
// capped wire delivers it bytes/rate later (serialized per link), the receiver applies it at
// max(its previous apply, delivery) and returns credit then; a step starts when the previous one
// ended. Every time is a max-plus function of its causal predecessors, so stalls do not depend on
// how threads happened to be scheduled: they are deterministic.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "../policy/schedule/schedule.hpp"
#include "../types.hpp"
#include "fifo.hpp"
#include "numeric.hpp"
#include "thread_transport.hpp"

namespace reccl::cpu {

/// One rank's buffers for one collective, in elements: input (read only), work, scratch, each a
/// whole number of `count`-element segments as the schedule asks.
template <class T>
struct rank_buffers {
  T const* input = nullptr;
  T* work = nullptr;
  T* scratch = nullptr;
  std::uint64_t count = 0;
  std::uint64_t input_len = 0, work_len = 0, scratch_len = 0;
};

/// What running a VT's block produced on one rank.
struct block_outcome {
  status st = status::ok;     ///< ok, timeout (no progress within the deadline or aborted), internal
  bool aborted = false;       ///< the abort flag ended it
  bool on_credit = false;     ///< timed out waiting for credit (else for data)
  int peer = -1;              ///< whom it waited for when it timed out
  int step = -1;              ///< the step it timed out in
  char const* what = "";      ///< for status::internal: the broken invariant
  std::uint64_t stalls = 0;      ///< whole poll quanta during which a send waited for credit
  std::uint64_t recv_waits = 0;  ///< whole poll quanta spent waiting for data only
  std::uint64_t stall_ns = 0, recv_wait_ns = 0;  ///< the same waits in nanoseconds
  std::uint64_t virtual_ns = 0;  ///< virtual_time fabrics: the block's duration on the virtual clock
  std::uint64_t bytes = 0;       ///< bytes this rank sent on the VT
};

/// Executes schedule S for one (rank, VT) over element type T. Holds reusable scratch vectors;
/// one instance per worker thread.
template <class T, Schedule S>
class block_executor {
 public:
  using handle = transport::cpu_threads::handle;

  block_executor(S const& s, handle h, int vt, redop op, rank_buffers<T> const& b, std::uint64_t timeout_ns,
                 std::atomic<bool> const* abort = nullptr)
      : s_(s), h_(h), vt_(vt), op_(op), b_(b), timeout_ns_(timeout_ns), abort_(abort),
        slot_elems_(h.slot_bytes() / sizeof(T)), quantum_(h.poll_quantum_ns()), virtual_(h.fab->config().virtual_time) {}

  /// Runs every step of the plan for block `blk`, adding to `out` (counters accumulate across
  /// calls). Stops at the first timeout or broken invariant.
  void run(schedule::block blk, block_outcome& out) {
    int const steps = s_.num_steps();
    for (int step = 0; step < steps && out.st == status::ok; ++step) run_step(step, blk, out);
  }

 private:
  struct piece {
    std::uint64_t off, len;
  };
  struct stream {
    schedule::op o;
    std::size_t p_begin = 0, p_end = 0;  ///< its pieces in pieces_
    std::size_t src_begin = 0, src_end = 0;  ///< local ops: the input chunk's pieces
    std::uint64_t len = 0, pos = 0;      ///< elements in the stream, elements done
    std::size_t piece = 0;               ///< current piece (index into pieces_)
    std::uint64_t piece_off = 0;         ///< elements done in the current piece
    int after = -1;                      ///< sends: the previous send to the same peer
    std::uint64_t v = 0;                 ///< sends, virtual time: when its last slot was handed over
    bool done() const { return pos == len; }
  };

  T* buf(schedule::buffer b) const {
    switch (b) {
      case schedule::buffer::input: return const_cast<T*>(b_.input);  // only ever read (checked below)
      case schedule::buffer::work: return b_.work;
      case schedule::buffer::scratch: return b_.scratch;
    }
    return nullptr;
  }
  std::uint64_t buf_len(schedule::buffer b) const {
    switch (b) {
      case schedule::buffer::input: return b_.input_len;
      case schedule::buffer::work: return b_.work_len;
      case schedule::buffer::scratch: return b_.scratch_len;
    }
    return 0;
  }

  /// Appends the pieces of chunk c of buffer b to pieces_; returns the stream length, or
  /// ~0 if a piece lies outside the buffer.
  std::uint64_t collect(schedule::buffer b, int c, schedule::block blk) {
    std::uint64_t len = 0;
    std::uint64_t const cap = buf_len(b);
    bool bad = false;
    schedule::for_each_piece(s_, b, c, blk, b_.count, [&](std::uint64_t off, std::uint64_t n) {
      if (off + n > cap || off + n < off) bad = true;
      pieces_.push_back({off, n});
      len += n;
    });
    return bad ? ~std::uint64_t{0} : len;
  }

  static void fail(block_outcome& out, char const* what, int step) {
    out.st = status::internal;
    out.what = what;
    out.step = step;
  }

  void run_step(int step, schedule::block blk, block_outcome& out) {
    ops_.clear();
    pieces_.clear();
    streams_.clear();
    int const rank = h_.rank, nranks = h_.fab->config().nranks;
    s_.for_each_op(rank, step, [&](schedule::op o) { ops_.push_back(o); });
    for (schedule::op const& o : ops_) {
      stream st;
      st.o = o;
      bool const is_send = o.act == schedule::action::send;
      bool const is_recv = o.act == schedule::action::recv_copy || o.act == schedule::action::recv_reduce;
      if ((is_send || is_recv) && (o.peer < 0 || o.peer >= nranks)) return fail(out, "op names a peer outside [0, nranks)", step);
      if (!is_send && o.buf == schedule::buffer::input) return fail(out, "op writes the input buffer", step);
      st.p_begin = pieces_.size();
      st.len = collect(o.buf, o.chunk, blk);
      st.p_end = pieces_.size();
      if (st.len == ~std::uint64_t{0}) return fail(out, "chunk piece outside its buffer", step);
      if (!is_send && !is_recv) {
        st.src_begin = pieces_.size();
        std::uint64_t const n = collect(schedule::buffer::input, o.src_chunk, blk);
        st.src_end = pieces_.size();
        if (n != st.len) return fail(out, "local op: source and destination lengths differ", step);
      }
      st.piece = st.p_begin;
      if (is_send)
        for (int k = static_cast<int>(streams_.size()) - 1; k >= 0; --k)
          if (streams_[k].o.act == schedule::action::send && streams_[k].o.peer == o.peer) {
            st.after = k;
            break;
          }
      streams_.push_back(st);
    }

    for (stream& st : streams_) st.v = vclock_;
    apply_v_ = vclock_;
    std::size_t head = 0;  // first receive / local op not yet complete (list order)
    auto next_apply = [&] {
      while (head < streams_.size() && streams_[head].o.act == schedule::action::send) ++head;
    };
    next_apply();
    std::uint64_t last_progress = now_ns();
    for (;;) {
      bool progressed = false, credit_blocked = false, all_sent = true;
      int blocked_peer = -1;
      for (std::size_t k = 0; k < streams_.size(); ++k) {
        stream& st = streams_[k];
        if (st.o.act != schedule::action::send || st.done()) continue;
        all_sent = false;
        if (st.after >= 0 && !streams_[st.after].done()) continue;
        while (!st.done()) {
          if (!can_send(h_, vt_, st.o.peer)) {
            credit_blocked = true;
            if (blocked_peer < 0) blocked_peer = st.o.peer;
            break;
          }
          send_one(st, out);
          progressed = true;
        }
      }
      while (head < streams_.size()) {
        stream& st = streams_[head];
        if (st.o.act == schedule::action::local_copy || st.o.act == schedule::action::local_reduce) {
          apply_local(st);
        } else {
          while (!st.done()) {
            std::byte const* slot = peek_slot(h_, vt_, st.o.peer);
            if (slot == nullptr) break;
            receive_one(st, slot, out);
            release_slot(h_, vt_, st.o.peer);
            progressed = true;
          }
          if (!st.done()) break;
        }
        ++head;
        next_apply();
        progressed = true;
      }
      bool const applied = head >= streams_.size();
      if (applied && (all_sent || all_sends_done())) {
        // virtual clock: the step ends when its last slot is handed over or applied
        vclock_ = apply_v_;
        for (stream const& st : streams_)
          if (st.o.act == schedule::action::send && st.v > vclock_) vclock_ = st.v;
        out.virtual_ns = vclock_;
        return;
      }
      if (progressed) {
        last_progress = now_ns();
        continue;
      }
      // Idle: poll with a short backoff (10 us doubling up to the quantum) until something can
      // move. The waited time is what counts (see count_wait), not the number of polls.
      std::uint64_t const t0 = now_ns();
      for (std::uint64_t sleep = first_poll_ns;; sleep = sleep * 2 < quantum_ ? sleep * 2 : quantum_) {
        sleep_until_ns(wake_time(head, now_ns(), sleep));
        std::uint64_t const t = now_ns();
        if (could_progress(head)) {
          count_wait(out, credit_blocked, t - t0);
          last_progress = t;
          break;
        }
        bool const aborted = abort_ != nullptr && abort_->load(std::memory_order_relaxed);
        if (aborted || t - last_progress >= timeout_ns_) {
          count_wait(out, credit_blocked, t - t0);
          out.st = status::timeout;
          out.aborted = aborted;
          out.step = step;
          bool const recv_waiting = head < streams_.size();
          out.on_credit = !recv_waiting;
          out.peer = recv_waiting ? streams_[head].o.peer : blocked_peer;
          return;
        }
      }
    }
  }

  /// Adds a wait of `ns` to the stall time (a send was blocked on credit) or the data-wait time,
  /// and refreshes the counts in whole poll quanta.
  void count_wait(block_outcome& out, bool credit_blocked, std::uint64_t ns) const {
    if (virtual_) return;  // waits are measured on the virtual clock instead
    (credit_blocked ? out.stall_ns : out.recv_wait_ns) += ns;
    out.stalls = out.stall_ns / quantum_;
    out.recv_waits = out.recv_wait_ns / quantum_;
  }

  bool all_sends_done() const {
    for (stream const& st : streams_)
      if (st.o.act == schedule::action::send && !st.done()) return false;
    return true;
  }

  /// When to poll next: at the earliest time the wire can deliver what the step waits for, if
  /// the fabric knows it for everything waited on; else after `backoff`. Never later than 10 poll
  /// quanta from now (aborts and deadlines are checked at each wake-up).
  std::uint64_t wake_time(std::size_t head, std::uint64_t now, std::uint64_t backoff) const {
    std::uint64_t eta = now + 10 * quantum_;
    bool unknown = false;
    auto consider = [&](std::uint64_t t) {
      if (t <= now) unknown = true;
      else if (t < eta) eta = t;
    };
    if (head < streams_.size()) consider(h_.ready_eta(vt_, streams_[head].o.peer));
    std::uint64_t const slots = static_cast<std::uint64_t>(h_.slots());
    for (stream const& st : streams_)
      if (st.o.act == schedule::action::send && !st.done() && (st.after < 0 || streams_[st.after].done())) {
        std::uint64_t const k = h_.tx_seq(vt_, st.o.peer);
        if (k >= slots) consider(h_.credit_eta(vt_, st.o.peer, k - slots));
      }
    return unknown && now + backoff < eta ? now + backoff : eta;
  }

  /// One poll of everything the step waits for.
  bool could_progress(std::size_t head) const {
    for (stream const& st : streams_)
      if (st.o.act == schedule::action::send && !st.done() && (st.after < 0 || streams_[st.after].done()) &&
          can_send(h_, vt_, st.o.peer))
        return true;
    if (head < streams_.size()) {
      int const peer = streams_[head].o.peer;
      std::uint64_t const seq = h_.rx_seq(vt_, peer);
      if (h_.test(vt_, peer, flag::ready, seq + 1)) return true;
    }
    return false;
  }

  /// Fills and publishes the stream's next slot.
  void send_one(stream& st, block_outcome& out) {
    std::uint64_t n = st.len - st.pos < slot_elems_ ? st.len - st.pos : slot_elems_;
    std::size_t const base = next_slot_offset(h_, vt_, st.o.peer);
    if (virtual_) {
      // handed over once the stream's previous slot is and the slot's credit came back
      std::uint64_t const k = h_.tx_seq(vt_, st.o.peer), slots = static_cast<std::uint64_t>(h_.slots());
      std::uint64_t const credit = k >= slots ? h_.credit_time(vt_, st.o.peer, k - slots) : 0;
      if (credit > st.v) {
        out.stall_ns += credit - st.v;
        st.v = credit;
      }
      h_.virtual_send(vt_, st.o.peer, st.v, n * sizeof(T));
      out.stalls = out.stall_ns / quantum_;
    }
    T const* src = buf(st.o.buf);
    std::uint64_t filled = 0;
    while (filled < n) {
      piece const& p = pieces_[st.piece];
      std::uint64_t const part = (p.len - st.piece_off) < (n - filled) ? (p.len - st.piece_off) : (n - filled);
      h_.put(vt_, st.o.peer, base + filled * sizeof(T), src + p.off + st.piece_off, part * sizeof(T));
      filled += part;
      st.piece_off += part;
      if (st.piece_off == p.len) {
        ++st.piece;
        st.piece_off = 0;
      }
    }
    publish_slot(h_, vt_, st.o.peer);
    st.pos += n;
    out.bytes += n * sizeof(T);
  }

  /// Copies or folds the stream's next slot into its chunk.
  void receive_one(stream& st, std::byte const* slot, block_outcome& out) {
    std::uint64_t n = st.len - st.pos < slot_elems_ ? st.len - st.pos : slot_elems_;
    if (virtual_) {
      std::uint64_t const t = h_.slot_time(vt_, st.o.peer);
      if (t > apply_v_) {
        out.recv_wait_ns += t - apply_v_;
        out.recv_waits = out.recv_wait_ns / quantum_;
        apply_v_ = t;
      }
      h_.set_release_time(vt_, st.o.peer, apply_v_);
    }
    T* dst = buf(st.o.buf);
    bool const fold = st.o.act == schedule::action::recv_reduce;
    std::uint64_t used = 0;
    alignas(16) T tmp[256];
    while (used < n) {
      piece const& p = pieces_[st.piece];
      std::uint64_t const part = (p.len - st.piece_off) < (n - used) ? (p.len - st.piece_off) : (n - used);
      T* d = dst + p.off + st.piece_off;
      std::byte const* s = slot + used * sizeof(T);
      if (!fold) {
        std::memcpy(d, s, part * sizeof(T));
      } else {
        // The slot may not be aligned for T in general; fold through an aligned bounce buffer.
        for (std::uint64_t k = 0; k < part; k += 256) {
          std::uint64_t const m = part - k < 256 ? part - k : 256;
          std::memcpy(tmp, s + k * sizeof(T), m * sizeof(T));
          combine_into(op_, d + k, tmp, m);
        }
      }
      used += part;
      st.piece_off += part;
      if (st.piece_off == p.len) {
        ++st.piece;
        st.piece_off = 0;
      }
    }
    st.pos += n;
  }

  /// work[chunk] = input[src_chunk]  or  work[chunk] = work[chunk] ⊕ input[src_chunk].
  void apply_local(stream& st) {
    T* dst = buf(st.o.buf);
    T const* src = b_.input;
    bool const fold = st.o.act == schedule::action::local_reduce;
    std::size_t dp = st.p_begin, sp = st.src_begin;
    std::uint64_t doff = 0, soff = 0;
    while (dp < st.p_end && sp < st.src_end) {
      piece const& d = pieces_[dp];
      piece const& s = pieces_[sp];
      std::uint64_t const part = (d.len - doff) < (s.len - soff) ? (d.len - doff) : (s.len - soff);
      if (fold) combine_into(op_, dst + d.off + doff, src + s.off + soff, part);
      else if (dst + d.off + doff != src + s.off + soff) std::memcpy(dst + d.off + doff, src + s.off + soff, part * sizeof(T));
      doff += part;
      soff += part;
      if (doff == d.len) ++dp, doff = 0;
      if (soff == s.len) ++sp, soff = 0;
    }
    st.pos = st.len;
  }

  static constexpr std::uint64_t first_poll_ns = 10'000;

  S s_;
  handle h_;
  int vt_;
  redop op_;
  rank_buffers<T> b_;
  std::uint64_t timeout_ns_;
  std::atomic<bool> const* abort_;
  std::uint64_t slot_elems_;
  std::uint64_t quantum_;
  bool virtual_;
  std::uint64_t vclock_ = 0;   ///< virtual time at which the current step started
  std::uint64_t apply_v_ = 0;  ///< virtual time of the last applied receive in this step
  std::vector<schedule::op> ops_;
  std::vector<piece> pieces_;
  std::vector<stream> streams_;
};

}  // namespace reccl::cpu
