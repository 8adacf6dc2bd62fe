// reccl/device/engine/pipelined.hpp -- push through per-warp rings: any collective, any dtype, plain
// (cudaMalloc) user buffers. Only what a peer must write is staged; the local input is read in place.
//
//   CTA c, warp pair w (sender warp w, receiver warp 8+w), chunk k, sequence s = base + k:
//
//   sender (rank a)                                  receiver (rank b)
//   wait credit[b->a] >= s-depth+1  (slot free)
//   in[chunk k] ──st──► b.ring[src=a][c][w][s%depth]
//     Lamport mode (fp32/fp16/bf16 reductions): the
//     data is its own flag, no fence ─────────────────► poll packs until no word is the sentinel
//     flag mode (everything else): __syncwarp;
//     fence.sys; ready[a->b] = s+1 ───────────────────► wait ready >= s+1 (acquire)
//                                                    reduce own in + ring slots in rank order
//                                                    (or copy them) ──► out[chunk k];
//                                                    re-poison the slot (both modes)
//                  ◄──────────────────────────────── credit[b->a] = s+1 (release)
//
// A 16-byte header follows each slot's payload (Lamport mode): descriptor hash and sequence, so ranks
// that disagree fail with `mismatch`; flag mode carries a 16-bit descriptor fold in the ready word.
// Every slot is poisoned at creation and re-poisoned by its reader, so calls in either mode may
// follow each other on one lane. Each warp pair is an independent pipeline: a wait stalls one warp,
// never the CTA. Sequence numbers persist per (lane, CTA, warp) in device memory, so slots and flags
// continue across calls and graph replays without resets. The receiver also waits until its own
// sender has read chunk k before it writes chunk k of the output (in-place safety).
// Stall telemetry: spins of the senders' credit waits, added to the VT's counter. The adaptive
// kernels time every wait that spun instead, the receivers' waits for data included (where a slow
// link shows on NVLink: a store never blocks software, the data just arrives late).
//
// The pipeline itself is pipe_range(): one CTA moves one element range through its eight rings.
// The plain kernel runs it once over its VT's block; the adaptive kernels (device/adaptive/) run
// it again over the ranges of a dead VT, with hooks that count stalls, pace a throttled VT, drop
// a dead VT's sends and end a wait as a VT fault instead of a lane error.
#pragma once

#include "../args.hpp"
#include "../element.hpp"
#include "../flags.hpp"
#include "one_shot.hpp"

namespace reccl::device {

/// Packs each lane keeps in flight per step of a chunk copy.
inline constexpr int pipelined_unroll = 4;

/// Element types whose reductions travel as Lamport packets (the data is its own arrival flag).
template <class T> inline constexpr bool lamport_capable = element<T>::is_float && sizeof(T) <= 4;

/// The user-side memory a pipeline reads and writes (a collective's buffers, or a probe block).
struct pipe_io {
  char const* in = nullptr;
  char* out = nullptr;
  std::uint64_t seg_bytes = 0;  ///< bytes between segments of in and out
  bool vec_ok = false;          ///< in, out and seg_bytes are 16-byte aligned
  bool in_place = false;
  RECCL_HOST_DEVICE static pipe_io of(coll_args const& a) {
    return pipe_io{static_cast<char const*>(a.in), static_cast<char*>(a.out), a.seg_bytes, a.vec_ok, a.in_place};
  }
};

/// Per-CTA shared-memory state of the pipelined engine.
struct pipe_cta {
  int abort_flag;                      ///< a warp failed: every warp of the CTA stops
  std::uint64_t base_seq[ring_warps];  ///< ring sequence of each warp pair before the current range
  std::uint64_t nchunks[ring_warps];   ///< chunks of the current range per warp pair
  std::uint32_t sent[ring_warps];      ///< chunks the sender warp has read (the in-place guard)
};

/// The plain kernel's hooks: waits end only at the lane's deadline (an error), nothing is paced or
/// dropped, and the senders' credit spins go to the lane's cumulative per-VT stall counters.
struct plain_pipe_hooks {
  deadline_clock* clock;
  std::uint32_t* status_word;
  int* cta_abort;
  std::uint64_t* vt_stalls;  ///< this CTA's VT counter, or nullptr
  RECCL_DEVICE lane_guard guard() const { return lane_guard{clock, status_word, cta_abort}; }
  RECCL_DEVICE bool sender_dead() const { return false; }
  RECCL_DEVICE bool pace(std::uint64_t /*chunk*/, std::uint64_t /*chunk_bytes*/, std::uint64_t& /*spins*/) { return true; }
  RECCL_DEVICE void committed() {}
  RECCL_DEVICE std::uint64_t wait_clock() const { return 0; }  // waits are not timed here
  RECCL_DEVICE void waited(std::uint64_t) {}
  RECCL_DEVICE void receiver_spins(std::uint64_t) {}  // the lane's counters keep the senders' credit stalls only
  RECCL_DEVICE void sender_spins(std::uint64_t spins) {
    if (spins != 0 && vt_stalls != nullptr)
      atomicAdd(reinterpret_cast<unsigned long long*>(vt_stalls), static_cast<unsigned long long>(spins));
  }
};

/// Moves the elements `cr` of every segment of `io` through this CTA's rings (all threads of the
/// CTA call it; `a` gives the lane, the chunk size and the descriptor). Sequences continue from cs.base_seq and are advanced past this range on return, so a CTA
/// may call it several times in one kernel; every rank must make the same calls with the same
/// ranges. Returns false if a wait gave up (cs.abort_flag is then set).
///
/// Hooks (per thread): guard() ends waits; sender_dead() drops this VT's sends (fault injection);
/// pace(k, bytes, spins) delays the receiver before it consumes chunk k (throttle: the data
/// arrives late, and the hold counts as a wait); wait_clock() / waited(t0) time each wait that spun
/// (the adaptive kernels' stall telemetry); committed() is told after a receiver warp wrote a
/// chunk of the output; sender_spins(n) and receiver_spins(n) get each warp's wait spins
/// (credits, and data) at the end.
template <class T, class H>
RECCL_DEVICE bool pipe_range(coll_args const& a, pipe_io const& io, pattern const& P, elem_range cr, pipe_cta& cs,
                             H& hooks) {
  constexpr int V = pack_elems<T>;
  constexpr int U = pipelined_unroll;
  constexpr bool lam = lamport_capable<T>;
  lsa_view const& v = a.view;
  std::uint32_t* const st = v.status();
  int const cta = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  int const warp = tid / 32, lane = tid % 32;
  int const me = v.rank, n = v.nranks;
  int const w = warp % ring_warps;
  bool const sender = warp < ring_warps;
  elem_range const wr = part_of(cr, ring_warps, w, V);
  pack_span const ps = packs_of(wr, V);
  // K = ceil(packs / chunk_packs) chunks of nearly equal size, so no chunk is a leftover of a few
  // packs. (Each round costs a pipeline step whatever its size: a ninth round for 16 more bytes
  // per pipe cost ~8 us on one H200 either way; bench/NOTES.md, 20.)
  std::uint64_t const Cmax = static_cast<std::uint64_t>(a.chunk_packs);
  std::uint64_t const K = (ps.size() + Cmax - 1) / Cmax;
  std::uint64_t const C = K == 0 ? Cmax : (ps.size() + K - 1) / K;
  std::uint64_t const s0 = cs.base_seq[w];
  if (sender && lane == 0) {
    cs.nchunks[w] = K;
    cs.sent[w] = 0;
  }
  __syncthreads();
  std::uint64_t const depth = static_cast<std::uint64_t>(v.L.ring_depth);
  std::uint64_t const hdr_off = static_cast<std::uint64_t>(v.L.ring_chunk_bytes);
  char const* const in = io.in;
  char* const out = io.out;
  unsigned const full = 0xffffffffu;
  volatile int* const abort_v = &cs.abort_flag;
  auto&& guard = hooks.guard();

  if (sender) {
    std::uint64_t spins = 0;
    if (P.sends_any() && !hooks.sender_dead() && !*abort_v) {
      for (std::uint64_t k = 0; k < K; ++k) {
        std::uint64_t const s = s0 + k;
        int ok = 1;
        if (lane == 0 && s >= depth) {
          std::uint64_t const spun = spins, t0 = hooks.wait_clock();
          for (int p = 0; p < n && ok; ++p)
            if (P.sends_to(p)) {
              waiting_for(guard, p);
              ok = wait_at_least(v.credit(me, cta, w, p), s - depth + 1, guard, spins);
            }
          if (spins != spun) hooks.waited(t0);
        }
        if (lane == 0 && !ok) *abort_v = 1;
        if (!__shfl_sync(full, ok, 0)) break;
        std::uint64_t const first = ps.first + k * C;
        int const cnt = static_cast<int>((ps.end - first) < C ? (ps.end - first) : C);
        for (int p = 0; p < n; ++p) {
          if (!P.sends_to(p)) continue;
          // same-source collectives load once per pack; the compiler keeps x[] across peers
          char const* const src = in + P.send_segment(p) * io.seg_bytes;
          char* const slot = v.ring_slot(p, me, cta, w, s);
          for (int b = 0; b < cnt; b += 32 * U) {
            pack16 x[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) x[u] = load_user<T>(src, first + i, wr, io.vec_ok);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) {
                if constexpr (lam) store_pack_relaxed_sys(slot + i * 16, canonical<T>(x[u]));
                else store_pack(slot + i * 16, x[u]);
              }
            }
          }
          if constexpr (lam) {
            if (lane == 0) {
              pack16 const h{{a.desc & 0x7fffffffu, static_cast<std::uint32_t>(s & 0x7fffffffu), 0x5eedu,
                              static_cast<std::uint32_t>(cnt)}};
              store_pack_relaxed_sys(slot + hdr_off, h);
            }
          }
        }
        __syncwarp();
        if (lane == 0) {
          if constexpr (!lam) {
            fence_sys();
            for (int p = 0; p < n; ++p)
              if (P.sends_to(p)) store_relaxed_sys(v.ready(p, cta, w, me), ready_word(s + 1, a.desc));
          }
          *static_cast<volatile std::uint32_t*>(&cs.sent[w]) = static_cast<std::uint32_t>(k + 1);
        }
        __syncwarp();
      }
    } else if (lane == 0) {
      // nothing is sent (broadcast off the root, or a dropped VT): the input is never read here
      *static_cast<volatile std::uint32_t*>(&cs.sent[w]) = static_cast<std::uint32_t>(K);
    }
    if (lane == 0) hooks.sender_spins(spins);
  } else {
    std::uint64_t spins = 0;
    bool const guard_in = P.sends_any();
    for (std::uint64_t k = 0; k < K; ++k) {
      std::uint64_t const s = s0 + k;
      int ok = *abort_v ? 0 : 1;
      std::uint64_t const first = ps.first + k * C;
      int const cnt = static_cast<int>((ps.end - first) < C ? (ps.end - first) : C);
      if (lane == 0 && ok) {
        std::uint64_t const spun = spins, t0 = hooks.wait_clock();
        // in-place safety: my own sender must have read chunk k of the input before I overwrite it
        if (guard_in) {
          std::uint64_t own_spins = 0;  // waiting for my own sender is not a stall of the link
          ok = spin_until([&] { return *static_cast<volatile std::uint32_t*>(&cs.sent[w]) >= k + 1; }, guard, own_spins);
        }
        for (int p = 0; p < n && ok; ++p) {
          if (!P.recvs_from(p)) continue;
          waiting_for(guard, p);
          if constexpr (lam) {
            char* const hp = v.ring_slot(me, p, cta, w, s) + hdr_off;
            pack16 g;
            ok = lamport_poll(hp, g, guard, spins);
            if (ok && (g.w[0] != (a.desc & 0x7fffffffu) || g.w[1] != static_cast<std::uint32_t>(s & 0x7fffffffu))) {
              raise_status(st, status::mismatch, p);
              ok = 0;
            }
            if (ok) store_pack(hp, lamport_poison());
          } else {
            ok = wait_ready(v.ready(me, cta, w, p), s + 1, a.desc, guard, st, spins);
          }
        }
        if (ok) ok = hooks.pace(k, static_cast<std::uint64_t>(cnt) * 16u, spins);
        if (spins != spun) hooks.waited(t0);
        if (!ok) *abort_v = 1;
      }
      if (!__shfl_sync(full, ok, 0)) break;
      bool good = true;
      if (P.reduces && n == 2) {
        // two ranks: issue the local and the staged loads together, then combine pack by pack
        if constexpr (!std::is_same_v<T, raw_byte>) {
          char const* const own = in + P.own_in_segment() * io.seg_bytes;
          char* const slot = v.ring_slot(me, 1 - me, cta, w, s);
          waiting_for(guard, 1 - me);
          for (int b = 0; b < cnt && good; b += 32 * U) {
            pack16 xo[U], xp[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) {
                xo[u] = load_user<T>(own, first + i, wr, io.vec_ok);
                xp[u] = lam ? load_pack_relaxed_sys(slot + i * 16) : load_pack_cg(slot + i * 16);
              }
            }
            if constexpr (lam) {
#pragma unroll
              for (int u = 0; u < U; ++u) {
                int const i = b + u * 32 + lane;
                if (i < cnt && good && !lamport_arrived(xp[u])) good = lamport_poll(slot + i * 16, xp[u], guard);
              }
              if (!good) break;
            }
            with_op(a.op, [&]<redop Op>() {
#pragma unroll
              for (int u = 0; u < U; ++u) {
                int const i = b + u * 32 + lane;
                if (i < cnt) {
                  store_pack(slot + i * 16, lamport_poison());
                  pack16 const y = me == 0 ? reduce_pair<T, Op>(xo[u], xp[u]) : reduce_pair<T, Op>(xp[u], xo[u]);
                  store_user<T>(out, first + i, wr, io.vec_ok, y);
                }
              }
            });
          }
        }
      } else if (P.reduces) {
        // more than two ranks: one pack per lane at a time, contributions in rank order
        if constexpr (!std::is_same_v<T, raw_byte>) {
          char const* const own = in + P.own_in_segment() * io.seg_bytes;
#pragma unroll 1
          for (int i = lane; i < cnt && good; i += 32) {
            acc_pack<T> acc;
            good = fold_in_rank_order<T>(a.op, n, acc, [&](int q, pack16& x) {
              if (q == me) {
                x = load_user<T>(own, first + i, wr, io.vec_ok);
                return true;
              }
              char* const p = v.ring_slot(me, q, cta, w, s) + i * 16;
              bool got = true;
              if constexpr (lam) {
                waiting_for(guard, q);
                got = lamport_poll(p, x, guard);
              } else {
                x = load_pack_cg(p);
              }
              store_pack(p, lamport_poison());
              return got;
            });
            if (good) store_user<T>(out, first + i, wr, io.vec_ok, from_acc<T>(a.op, acc, n));
          }
        }
      } else {
        for (int q = 0; q < n; ++q) {
          bool const from_peer = P.recvs_from(q);
          bool const from_self = q == me && P.copies_own() && !io.in_place;
          if (!from_peer && !from_self) continue;
          char* const dst = out + P.recv_segment(q) * io.seg_bytes;
          char* const slot = from_peer ? v.ring_slot(me, q, cta, w, s) : nullptr;
          char const* const src = in + P.send_segment(me) * io.seg_bytes;
          for (int b = 0; b < cnt; b += 32 * U) {
            pack16 x[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) x[u] = from_peer ? load_pack_cg(slot + i * 16) : load_user<T>(src, first + i, wr, io.vec_ok);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) {
                store_user<T>(dst, first + i, wr, io.vec_ok, x[u]);
                if (from_peer) store_pack(slot + i * 16, lamport_poison());
              }
            }
          }
        }
      }
      if (!__all_sync(full, good)) {
        if (lane == 0) *abort_v = 1;
        break;
      }
      __syncwarp();
      // Credit every peer, also one this rank received nothing from (broadcast): each credit
      // counter then tracks the shared sequence whichever way traffic flowed, so a later call
      // with another root (or another collective) finds its slots released.
      if (lane == 0) {
        hooks.committed();
        for (int p = 0; p < n; ++p)
          if (p != me) store_release_sys(v.credit(p, cta, w, me), s + 1);
      }
      __syncwarp();
    }
    if (lane == 0) hooks.receiver_spins(spins);
  }
  __syncthreads();
  bool const ok = cs.abort_flag == 0;
  if (tid < ring_warps) cs.base_seq[tid] += cs.nchunks[tid];
  __syncthreads();
  return ok;
}

template <class T>
__global__ void __launch_bounds__(cta_threads, 1) pipelined_kernel(coll_args const a) {
  pdl_wait();
  // Let the next kernel of the stream launch now: its pdl_wait() still waits for this grid to
  // complete and its writes to be visible, so only the launch latency overlaps.
  pdl_trigger();
  lsa_view const& v = a.view;
  std::uint32_t* const st = v.status();
  int const cta = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  __shared__ pipe_cta cs;
  if (tid == 0) cs.abort_flag = read_status(st) != 0;
  if (tid < ring_warps) cs.base_seq[tid] = *v.ring_seq(cta, tid);
  __syncthreads();
  if (cs.abort_flag) {
    return;
  }
  deadline_clock deadline(a.timeout_ns);
  pattern const P = make_pattern(a.coll, v.rank, v.nranks, a.root);
  elem_range const cr = cta_range(a.sp, a.ctas_per_vt, cta, pack_elems<T>);
  plain_pipe_hooks hooks{&deadline, st, &cs.abort_flag, a.ctas_per_vt > 0 ? v.stalls(cta / a.ctas_per_vt) : nullptr};
  pipe_range<T>(a, pipe_io::of(a), P, cr, cs, hooks);
  if (tid < ring_warps) *v.ring_seq(cta, tid) = cs.base_seq[tid];
}

}  // namespace reccl::device
