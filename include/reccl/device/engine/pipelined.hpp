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
// Stall telemetry: spins of the senders' credit waits, added to the VT's counter.
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

template <class T>
__global__ void __launch_bounds__(cta_threads, 1) pipelined_kernel(coll_args const a) {
  constexpr int V = pack_elems<T>;
  constexpr int U = pipelined_unroll;
  constexpr bool lam = lamport_capable<T>;
  pdl_wait();
  // Let the next kernel of the stream launch now: its pdl_wait() still waits for this grid to
  // complete and its writes to be visible, so only the launch latency overlaps.
  pdl_trigger();
  lsa_view const& v = a.view;
  std::uint32_t* const st = v.status();
  int const cta = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  int const warp = tid / 32, lane = tid % 32;
  __shared__ int abort_flag;
  __shared__ std::uint64_t base_seq[ring_warps];
  __shared__ std::uint64_t nchunks[ring_warps];
  __shared__ std::uint32_t sent[ring_warps];
  if (tid == 0) abort_flag = read_status(st) != 0;
  if (tid < ring_warps) {
    base_seq[tid] = *v.ring_seq(cta, tid);
    sent[tid] = 0;
  }
  __syncthreads();
  if (abort_flag) {
    return;
  }
  deadline_clock deadline(a.timeout_ns);
  int const me = v.rank, n = v.nranks;
  pattern const P = make_pattern(a.coll, me, n, a.root);
  elem_range const cr = cta_range(a.sp, a.ctas_per_vt, cta, V);
  int const w = warp % ring_warps;
  bool const sender = warp < ring_warps;
  elem_range const wr = part_of(cr, ring_warps, w, V);
  pack_span const ps = packs_of(wr, V);
  std::uint64_t const C = static_cast<std::uint64_t>(a.chunk_packs);
  std::uint64_t const K = (ps.size() + C - 1) / C;
  std::uint64_t const s0 = base_seq[w];
  if (sender && lane == 0) nchunks[w] = K;
  std::uint64_t const depth = static_cast<std::uint64_t>(v.L.ring_depth);
  std::uint64_t const hdr_off = static_cast<std::uint64_t>(v.L.ring_chunk_bytes);
  char const* const in = static_cast<char const*>(a.in);
  char* const out = static_cast<char*>(a.out);
  unsigned const full = 0xffffffffu;
  volatile int* const abort_v = &abort_flag;

  if (sender) {
    std::uint64_t spins = 0;
    if (P.sends_any()) {
      for (std::uint64_t k = 0; k < K; ++k) {
        std::uint64_t const s = s0 + k;
        int ok = 1;
        if (lane == 0 && s >= depth)
          for (int p = 0; p < n && ok; ++p)
            if (P.sends_to(p)) ok = wait_at_least(v.credit(me, cta, w, p), s - depth + 1, deadline, st, spins);
        if (lane == 0 && !ok) *abort_v = 1;
        if (!__shfl_sync(full, ok, 0)) break;
        std::uint64_t const first = ps.first + k * C;
        int const cnt = static_cast<int>((ps.end - first) < C ? (ps.end - first) : C);
        for (int p = 0; p < n; ++p) {
          if (!P.sends_to(p)) continue;
          // same-source collectives load once per pack; the compiler keeps x[] across peers
          char const* const src = in + P.send_segment(p) * a.seg_bytes;
          char* const slot = v.ring_slot(p, me, cta, w, s);
          for (int b = 0; b < cnt; b += 32 * U) {
            pack16 x[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) x[u] = load_user<T>(src, first + i, wr, a.vec_ok);
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
          *static_cast<volatile std::uint32_t*>(&sent[w]) = static_cast<std::uint32_t>(k + 1);
        }
        __syncwarp();
      }
    }
    if (lane == 0 && spins != 0 && a.ctas_per_vt > 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(v.stalls(cta / a.ctas_per_vt)), static_cast<unsigned long long>(spins));
    }
  } else {
    std::uint64_t spins = 0;
    bool const guard = P.sends_any();
    for (std::uint64_t k = 0; k < K; ++k) {
      std::uint64_t const s = s0 + k;
      int ok = 1;
      if (lane == 0) {
        // in-place safety: my own sender must have read chunk k of the input before I overwrite it
        for (std::uint32_t t = 1; ok && guard && *static_cast<volatile std::uint32_t*>(&sent[w]) < k + 1; ++t) {
          if (t % deadline_check_period == 0) {
            if (*abort_v || read_status(st) != 0) ok = 0;
            else if (deadline.expired()) { raise_status(st, status::timeout); ok = 0; }
          }
        }
        for (int p = 0; p < n && ok; ++p) {
          if (!P.recvs_from(p)) continue;
          if constexpr (lam) {
            char* const hp = v.ring_slot(me, p, cta, w, s) + hdr_off;
            pack16 g;
            ok = lamport_poll(hp, g, deadline, &abort_flag, st);
            if (ok && (g.w[0] != (a.desc & 0x7fffffffu) || g.w[1] != static_cast<std::uint32_t>(s & 0x7fffffffu))) {
              raise_status(st, status::mismatch);
              ok = 0;
            }
            if (ok) store_pack(hp, lamport_poison());
          } else {
            ok = wait_ready(v.ready(me, cta, w, p), s + 1, a.desc, deadline, st, spins);
          }
        }
        if (!ok) *abort_v = 1;
      }
      if (!__shfl_sync(full, ok, 0)) break;
      std::uint64_t const first = ps.first + k * C;
      int const cnt = static_cast<int>((ps.end - first) < C ? (ps.end - first) : C);
      bool good = true;
      if (P.reduces && n == 2) {
        // two ranks: issue the local and the staged loads together, then combine pack by pack
        if constexpr (!std::is_same_v<T, raw_byte>) {
          char const* const own = in + P.own_in_segment() * a.seg_bytes;
          char* const slot = v.ring_slot(me, 1 - me, cta, w, s);
          for (int b = 0; b < cnt && good; b += 32 * U) {
            pack16 xo[U], xp[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) {
                xo[u] = load_user<T>(own, first + i, wr, a.vec_ok);
                xp[u] = lam ? load_pack_relaxed_sys(slot + i * 16) : load_pack_cg(slot + i * 16);
              }
            }
            if constexpr (lam) {
#pragma unroll
              for (int u = 0; u < U; ++u) {
                int const i = b + u * 32 + lane;
                if (i < cnt && good && !lamport_arrived(xp[u])) good = lamport_poll(slot + i * 16, xp[u], deadline, &abort_flag, st);
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
                  store_user<T>(out, first + i, wr, a.vec_ok, y);
                }
              }
            });
          }
        }
      } else if (P.reduces) {
        // more than two ranks: one pack per lane at a time, contributions in rank order
        if constexpr (!std::is_same_v<T, raw_byte>) {
          char const* const own = in + P.own_in_segment() * a.seg_bytes;
#pragma unroll 1
          for (int i = lane; i < cnt && good; i += 32) {
            acc_pack<T> acc;
            for (int q = 0; q < n && good; ++q) {
              pack16 x;
              if (q == me) {
                x = load_user<T>(own, first + i, wr, a.vec_ok);
              } else {
                char* const p = v.ring_slot(me, q, cta, w, s) + i * 16;
                if constexpr (lam) {
                  good = lamport_poll(p, x, deadline, &abort_flag, st);
                } else {
                  x = load_pack_cg(p);
                }
                store_pack(p, lamport_poison());
              }
              if (q == 0) acc = to_acc<T>(x);
              else combine_into<T>(a.op, acc, x);
            }
            if (good) store_user<T>(out, first + i, wr, a.vec_ok, from_acc<T>(a.op, acc, n));
          }
        }
      } else {
        for (int q = 0; q < n; ++q) {
          bool const from_peer = P.recvs_from(q);
          bool const from_self = q == me && P.copies_own() && !a.in_place;
          if (!from_peer && !from_self) continue;
          char* const dst = out + P.recv_segment(q) * a.seg_bytes;
          char* const slot = from_peer ? v.ring_slot(me, q, cta, w, s) : nullptr;
          char const* const src = in + P.send_segment(me) * a.seg_bytes;
          for (int b = 0; b < cnt; b += 32 * U) {
            pack16 x[U];
#pragma unroll
            for (int u = 0; u < U; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) x[u] = from_peer ? load_pack_cg(slot + i * 16) : load_user<T>(src, first + i, wr, a.vec_ok);
            }
#pragma unroll
            for (int u = 0; u < U; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) {
                store_user<T>(dst, first + i, wr, a.vec_ok, x[u]);
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
      if (lane == 0)
        for (int p = 0; p < n; ++p)
          if (p != me) store_release_sys(v.credit(p, cta, w, me), s + 1);
      __syncwarp();
    }
  }
  __syncthreads();
  if (tid < ring_warps) *v.ring_seq(cta, tid) = base_seq[tid] + nchunks[tid];
}

}  // namespace reccl::device
