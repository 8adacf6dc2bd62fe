// reccl/device/agent/plan.hpp -- the schedule agent: runs any Schedule's plan on the GPU through a
// load/store device handle (device::memory_handle), the way the CPU engine runs it on threads.
//
//   grid: one CTA per (VT, part): CTA c runs the whole plan on its part of VT c / parts's block
//   CTA (512 threads):  warps 0..7   senders: warp p streams every send to peer p, in list order
//                       warps 8..15  appliers: receives and local ops, in list order, together
//   step s:  senders and appliers progress at once; __syncthreads() ends the step
//
//   a send  ──► peer's ring [src = me][cta] (depth slots of slot_bytes) ──► peer's apply
//               ready flag (src → dst): slots published        credit flag (dst → src): slots freed
//
// A stream (the pieces of one chunk, in order) is cut into slots by stream position, so sender and
// receiver agree on every slot however their chunks are laid out (the CPU executor's rule). The
// counters of published and freed slots live in the window (sequence words) and only grow, so
// calls and graph replays follow each other without resets.
//
// Arithmetic: what the plan says, element by element, rounded to T after each combine (the CPU
// engine's arithmetic, cpu/numeric.hpp): the GPU and CPU runs of one schedule give the same bits.
// Data moves in 16-byte packs where source and destination agree modulo 16 (apply_span, and the
// handle's copy for sends), element by element elsewhere.
// Deadlock freedom is the CPU executor's: sends to one peer go in list order, applies go in list
// order, and everything else progresses independently.
//
// Waits: the handle's (one guarded wait, device/wait.hpp): a peer that never comes records a
// timeout naming the peer and the VT in this rank's fault word; any fault stops every wait of the
// rank within a poll period, and nothing more is written to the output after it.
#pragma once

#include <cstdint>

#include "../../policy/schedule/schedule.hpp"
#include "../../policy/split.hpp"
#include "../../types.hpp"
#include "../args.hpp"
#include "../element.hpp"
#include "../handle/memory.hpp"
#include "../wait.hpp"

namespace reccl::device {

/// Threads of a schedule-agent CTA and its warp roles.
inline constexpr int plan_threads = 512;
inline constexpr int plan_send_warps = 8;  ///< warp p sends to peer p (max_memory_ranks peers)
inline constexpr int plan_apply_threads = plan_threads - 32 * plan_send_warps;
static_assert(plan_send_warps >= max_memory_ranks);

/// Where a schedule agent's rings and flags are, in every rank's window (the same everywhere).
struct plan_lane {
  flag_id ready{}, credit{};  ///< ready.index + cta: slots src published to me; credit: slots I freed
  flag_id sent{}, received{};  ///< sequence words: sent.index + cta*max + peer (local counters)
  std::uint64_t ring_offset = 0;  ///< data-region offset of the rings
  std::int32_t max_ctas = 0, depth = 0;
  std::uint32_t slot_bytes = 0;

  /// Slot `seq` of the ring that `src` fills for CTA `cta` in `owner`'s window.
  RECCL_HOST_DEVICE char* slot(memory_handle const& h, int owner, int src, int cta, std::uint64_t seq) const {
    std::uint64_t const idx = (static_cast<std::uint64_t>(src) * static_cast<std::uint64_t>(max_ctas) + static_cast<std::uint64_t>(cta)) *
                                  static_cast<std::uint64_t>(depth) + seq % static_cast<std::uint64_t>(depth);
    return h.at(owner, ring_offset + idx * slot_bytes);
  }
  RECCL_HOST_DEVICE static constexpr std::uint64_t ring_bytes(int nranks, int max_ctas, int depth, std::uint32_t slot_bytes) {
    return static_cast<std::uint64_t>(nranks) * static_cast<std::uint64_t>(max_ctas) * static_cast<std::uint64_t>(depth) * slot_bytes;
  }
};

/// One rank's buffers for one call, in elements (schedule::buffer order: input, work, scratch).
template <class T>
struct plan_buffers {
  T const* input = nullptr;
  T* work = nullptr;
  T* scratch = nullptr;
  std::uint64_t count = 0;
};

/// Everything the agent takes by value.
template <class T, class S>
struct plan_args {
  memory_handle h{};
  plan_lane lane{};
  S schedule{};
  plan_buffers<T> buf{};
  split sp{};
  std::int32_t parts = 1;           ///< CTAs per VT
  redop op = redop::sum;
  std::uint64_t* stalls = nullptr;  ///< per VT: failed polls waiting for credit (telemetry), or null
};

namespace detail {

template <class T>
RECCL_DEVICE T* plan_buffer(plan_buffers<T> const& b, schedule::buffer which) {
  switch (which) {
    case schedule::buffer::input: return const_cast<T*>(b.input);  // only ever read
    case schedule::buffer::work: return b.work;
    case schedule::buffer::scratch: return b.scratch;
  }
  return nullptr;
}

/// L1-bypassing element load (data a peer wrote into this GPU's memory).
template <class T>
RECCL_DEVICE T load_cg(T const* p) {
  using B = bits_t<T>;
  B const b = __ldcg(reinterpret_cast<B const*>(p));
  T t;
  memcpy(&t, &b, sizeof(T));
  return t;
}

/// dst[i] = x[i], or dst[i] = dst[i] (op) x[i] rounded to T, for i < n, with x = src (`Peer`: written
/// by another rank into this GPU's memory, read around L1). Thread t of `threads` takes every
/// threads-th element, or 16-byte pack where dst and src agree modulo 16 (the elements before the
/// first whole pack, and after the last, one by one). Each element is touched by one thread, so
/// the arithmetic is the element-wise one whatever the split.
template <class T, bool Peer>
RECCL_DEVICE void apply_span(T* dst, T const* src, std::uint64_t n, bool reduce, redop op, int t, int threads) {
  constexpr std::uint64_t V = 16 / sizeof(T);
  static_assert(16 % sizeof(T) == 0);
  std::uint64_t const T_ = static_cast<std::uint64_t>(threads);
  auto one = [&](std::uint64_t i) {
    T const x = Peer ? load_cg(src + i) : src[i];
    dst[i] = reduce ? combine_rounded<T>(op, dst[i], x) : x;
  };
  std::uintptr_t const da = reinterpret_cast<std::uintptr_t>(dst);
  bool const vec = ((da ^ reinterpret_cast<std::uintptr_t>(src)) & 15u) == 0;
  std::uint64_t const head = !vec ? n : ((16 - da % 16) % 16 / sizeof(T) < n ? (16 - da % 16) % 16 / sizeof(T) : n);
  for (std::uint64_t i = static_cast<std::uint64_t>(t); i < head; i += T_) one(i);
  if (!vec) return;
  std::uint64_t const packs = (n - head) / V;
  uint4* const dp = reinterpret_cast<uint4*>(dst + head);
  uint4 const* const sp = reinterpret_cast<uint4 const*>(src + head);
  for (std::uint64_t p = static_cast<std::uint64_t>(t); p < packs; p += T_) {
    uint4 x = Peer ? __ldcg(sp + p) : sp[p];
    if (reduce) {
      uint4 const y = dp[p];
      T xs[V], ys[V];
      memcpy(xs, &x, 16);
      memcpy(ys, &y, 16);
#pragma unroll
      for (std::uint64_t k = 0; k < V; ++k) ys[k] = combine_rounded<T>(op, ys[k], xs[k]);
      memcpy(&x, ys, 16);
    }
    dp[p] = x;
  }
  for (std::uint64_t i = head + packs * V + static_cast<std::uint64_t>(t); i < n; i += T_) one(i);
}

/// The sender side of one stream: fills slots of `peer`'s ring and publishes them.
template <class T, class S>
struct stream_sender {
  plan_args<T, S> const& a;
  int peer, cta, lane;
  std::uint64_t* seq;  ///< slots published to `peer` by this CTA (lane 0's copy is authoritative)
  deadline_clock& clock;
  std::uint64_t& spins;
  bool ok = true;
  std::uint64_t pos = 0;

  RECCL_DEVICE std::uint64_t slot_elems() const { return a.lane.slot_bytes / sizeof(T); }
  RECCL_DEVICE void publish() {
    __syncwarp();
    if (lane == 0) a.h.signal(peer, flag_id{a.lane.ready.index + static_cast<std::uint32_t>(cta)}, *seq + 1);
    *seq += 1;
  }
  RECCL_DEVICE void piece(T const* src, std::uint64_t len) {
    std::uint64_t const E = slot_elems();
    while (len > 0 && ok) {
      std::uint64_t const in_slot = pos % E;
      if (in_slot == 0) {
        // credit: at most `depth` slots ahead of what the receiver freed
        std::uint64_t const need = *seq + 1 > static_cast<std::uint64_t>(a.lane.depth) ? *seq + 1 - a.lane.depth : 0;
        int good = 1;
        if (lane == 0 && need > 0)
          good = a.h.wait(flag_id{a.lane.credit.index + static_cast<std::uint32_t>(cta)}, peer, need, clock, cta / a.parts, spins);
        ok = __shfl_sync(0xffffffffu, good, 0) != 0;
        if (!ok) return;
      }
      std::uint64_t const take = len < E - in_slot ? len : E - in_slot;
      T* const dst = reinterpret_cast<T*>(a.lane.slot(a.h, peer, a.h.rank(), cta, *seq)) + in_slot;
      memory_handle::copy(dst, src, take * sizeof(T), lane, 32);
      pos += take;
      src += take;
      len -= take;
      if (pos % E == 0) publish();
    }
  }
  RECCL_DEVICE void finish() {
    if (ok && pos % slot_elems() != 0) publish();
  }
};

/// Named barrier of the apply group (warps plan_send_warps..15).
RECCL_DEVICE void apply_sync() { asm volatile("bar.sync 1, %0;" ::"n"(plan_apply_threads) : "memory"); }

/// The receiver side of one stream: takes slots of my ring from `src` as they arrive. Run by every
/// thread of the apply group alike; `good` is the group's verdict, the same in every thread (it is
/// read only right after a group barrier that follows the one write of `*gave_up`).
template <class T, class S>
struct stream_receiver {
  plan_args<T, S> const& a;
  int src, cta, tid;  ///< tid: 0 .. plan_apply_threads-1
  bool reduce;
  std::uint64_t seq;   ///< slots taken from `src` by this CTA so far
  deadline_clock& clock;
  int* gave_up;        ///< shared: written by tid 0 only, just before a group barrier
  bool& good;
  std::uint64_t pos = 0;

  RECCL_DEVICE std::uint64_t slot_elems() const { return a.lane.slot_bytes / sizeof(T); }
  RECCL_DEVICE void release() {
    apply_sync();  // every thread has read the slot
    if (tid == 0) a.h.signal(src, flag_id{a.lane.credit.index + static_cast<std::uint32_t>(cta)}, seq + 1);
    seq += 1;
  }
  RECCL_DEVICE void piece(T* dst, std::uint64_t len) {
    std::uint64_t const E = slot_elems();
    while (len > 0 && good) {
      std::uint64_t const in_slot = pos % E;
      if (in_slot == 0) {
        if (tid == 0 && !a.h.wait(flag_id{a.lane.ready.index + static_cast<std::uint32_t>(cta)}, src, seq + 1, clock, cta / a.parts))
          *gave_up = 1;
        apply_sync();
        good = *static_cast<volatile int*>(gave_up) == 0;
        if (!good) return;
      }
      std::uint64_t const take = len < E - in_slot ? len : E - in_slot;
      T const* const s = reinterpret_cast<T const*>(a.lane.slot(a.h, a.h.rank(), src, cta, seq)) + in_slot;
      apply_span<T, true>(dst, s, take, reduce, a.op, tid, plan_apply_threads);
      pos += take;
      dst += take;
      len -= take;
      if (pos % E == 0) release();
    }
  }
  RECCL_DEVICE void finish() {
    if (good && pos % slot_elems() != 0) release();
  }
};

}  // namespace detail

/// The schedule agent. Launch with n_vts * parts CTAs of plan_threads threads.
template <class T, class S>
__global__ void __launch_bounds__(plan_threads, 1) plan_kernel(plan_args<T, S> const a) {
  int const cta = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  int const warp = tid / 32, lane = tid % 32;
  int const vt = cta / a.parts;
  memory_handle const& h = a.h;
  int const me = h.rank(), n = h.size();
  elem_range const r = cta_range(a.sp, a.parts, cta, 1);
  schedule::block const blk{r.lo, r.hi};
  std::uint64_t const count = a.buf.count;
  __shared__ int gave_up;  // see stream_receiver
  if (tid == 0) gave_up = 0;
  // A rank that already failed (e.g. a peer's host-side check raised a fault) runs nothing. Every
  // thread takes the same verdict: a shared word written later in the loop could be read here late.
  if (__syncthreads_or(tid == 0 && h.faulted()) || blk.size() == 0) return;
  bool good = true;  // the apply group's verdict
  deadline_clock clock(h.timeout_ns);
  std::uint64_t spins = 0;
  bool const sender = warp < plan_send_warps;
  int const peer = warp;
  std::uint64_t* const sent = sender && peer < n ? h.sequence(flag_id{a.lane.sent.index + static_cast<std::uint32_t>(cta * max_memory_ranks + peer)}) : nullptr;
  std::uint64_t sent_seq = sent ? *sent : 0;
  __shared__ std::uint64_t recv_seq[max_memory_ranks];
  if (tid < n) recv_seq[tid] = *h.sequence(flag_id{a.lane.received.index + static_cast<std::uint32_t>(cta * max_memory_ranks + tid)});
  __syncthreads();

  int const steps = a.schedule.num_steps();
  for (int step = 0; step < steps; ++step) {
    if (sender) {
      if (peer < n && peer != me) {
        a.schedule.for_each_op(me, step, [&](schedule::op const& o) {
          if (o.act != schedule::action::send || o.peer != peer || !good) return;
          detail::stream_sender<T, S> tx{a, peer, cta, lane, &sent_seq, clock, spins};
          T const* const base = detail::plan_buffer(a.buf, o.buf);
          schedule::for_each_piece(a.schedule, o.buf, o.chunk, blk, count,
                                   [&](std::uint64_t off, std::uint64_t len) { tx.piece(base + off, len); });
          tx.finish();
          if (!tx.ok) good = false;  // warp-uniform
        });
      }
    } else {
      int const t = tid - 32 * plan_send_warps;
      a.schedule.for_each_op(me, step, [&](schedule::op const& o) {
        if (o.act == schedule::action::send || !good) return;
        T* const work = a.buf.work;
        switch (o.act) {
          case schedule::action::recv_copy:
          case schedule::action::recv_reduce: {
            detail::stream_receiver<T, S> rx{a, o.peer, cta, t, o.act == schedule::action::recv_reduce, recv_seq[o.peer], clock, &gave_up, good};
            T* const base = detail::plan_buffer(a.buf, o.buf);
            schedule::for_each_piece(a.schedule, o.buf, o.chunk, blk, count,
                                     [&](std::uint64_t off, std::uint64_t len) { rx.piece(base + off, len); });
            rx.finish();
            detail::apply_sync();  // every thread has its copy of recv_seq[o.peer]: update it
            if (t == 0) recv_seq[o.peer] = rx.seq;
            detail::apply_sync();
            break;
          }
          case schedule::action::local_copy:
          case schedule::action::local_reduce: {
            bool const red = o.act == schedule::action::local_reduce;
            // the two chunks have the same stream length; walk them side by side
            std::uint64_t dpos = 0;
            schedule::for_each_piece(a.schedule, schedule::buffer::work, o.chunk, blk, count, [&](std::uint64_t doff, std::uint64_t dlen) {
              std::uint64_t spos = 0;
              schedule::for_each_piece(a.schedule, schedule::buffer::input, o.src_chunk, blk, count,
                                       [&](std::uint64_t soff, std::uint64_t slen) {
                                         std::uint64_t const lo = dpos > spos ? dpos : spos;
                                         std::uint64_t const hi = dpos + dlen < spos + slen ? dpos + dlen : spos + slen;
                                         if (lo < hi)
                                           detail::apply_span<T, false>(work + doff + (lo - dpos), a.buf.input + soff + (lo - spos),
                                                                        hi - lo, red, a.op, t, plan_apply_threads);
                                         spos += slen;
                                       });
              dpos += dlen;
            });
            detail::apply_sync();
            break;
          }
          default: break;
        }
      });
    }
    // The step's verdict, the same in every thread: a sender warp or the apply group failed.
    if (__syncthreads_or(good ? 0 : 1)) break;
  }
  // counters carry over to the next call; after a fault the rank is failed (sticky) anyway
  if (sent && lane == 0) *sent = sent_seq;
  __syncthreads();
  if (tid < n) *h.sequence(flag_id{a.lane.received.index + static_cast<std::uint32_t>(cta * max_memory_ranks + tid)}) = recv_seq[tid];
  if (a.stalls != nullptr && sender && lane == 0 && spins > 0) atomicAdd(reinterpret_cast<unsigned long long*>(a.stalls + vt), spins);
}

}  // namespace reccl::device
