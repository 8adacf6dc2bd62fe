// reccl/device/engine/pipelined.hpp -- push through per-warp rings: any collective, any dtype, plain
// (cudaMalloc) user buffers. Only what a peer must write is staged; the local input is read in place.
//
//   CTA c, warp pair w (sender warp w, receiver warp 8+w), chunk k, sequence s = base + k:
//
//   sender (rank a)                                  receiver (rank b)
//   wait credit[b->a] >= s-depth+1  (slot free)
//   in[chunk k] ──st──► b.ring[src=a][c][w][s%depth]
//   __syncwarp; fence.sys; ready[a->b] = s+1 ──────► wait ready >= s+1 (acquire; descriptor
//                                                    fold checked: ranks that disagree fail)
//                                                    reduce own in + ring slots in rank order
//                                                    (or copy them) ──► out[chunk k]
//                  ◄──────────────────────────────── credit[b->a] = s+1 (release)
//
// Each warp pair is an independent pipeline: a fence stalls one warp, never the CTA, and the
// receiver of chunk k overlaps the senders of chunks k+1 ... k+depth-1. Sequence numbers persist per
// (lane, CTA, warp) in device memory, so ring slots and flags continue across calls and graph
// replays without resets. The receiver also waits until its own sender has read chunk k before it
// writes chunk k of the output (in-place safety).
// Stall telemetry: spins of the senders' credit waits, added to the VT's counter.
#pragma once

#include "../args.hpp"
#include "../element.hpp"
#include "../flags.hpp"

namespace reccl::device {

/// Packs each lane keeps in flight per step of a chunk copy.
inline constexpr int pipelined_unroll = 4;

template <class T>
__global__ void __launch_bounds__(cta_threads, 1) pipelined_kernel(coll_args const a) {
  constexpr int V = pack_elems<T>;
  pdl_wait();
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
    pdl_trigger();
    return;
  }
  std::uint64_t const deadline = globaltimer() + a.timeout_ns;
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
  char const* const in = static_cast<char const*>(a.in);
  char* const out = static_cast<char*>(a.out);
  unsigned const full = 0xffffffffu;

  if (sender) {
    std::uint64_t spins = 0;
    if (P.sends_any()) {
      for (std::uint64_t k = 0; k < K; ++k) {
        std::uint64_t const s = s0 + k;
        int ok = 1;
        if (lane == 0 && s >= depth)
          for (int p = 0; p < n && ok; ++p)
            if (P.sends_to(p)) ok = wait_at_least(v.credit(me, cta, w, p), s - depth + 1, deadline, st, spins);
        if (!__shfl_sync(full, ok, 0)) break;
        std::uint64_t const first = ps.first + k * C;
        int const cnt = static_cast<int>((ps.end - first) < C ? (ps.end - first) : C);
        for (int b = 0; b < cnt; b += 32 * pipelined_unroll) {
          if (P.same_source) {
            pack16 x[pipelined_unroll];
#pragma unroll
            for (int u = 0; u < pipelined_unroll; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) x[u] = load_user<T>(in, first + i, wr, a.vec_ok);
            }
            for (int p = 0; p < n; ++p) {
              if (!P.sends_to(p)) continue;
              char* const slot = v.ring_slot(p, me, cta, w, s);
#pragma unroll
              for (int u = 0; u < pipelined_unroll; ++u) {
                int const i = b + u * 32 + lane;
                if (i < cnt) store_pack(slot + i * 16, x[u]);
              }
            }
          } else {
            for (int p = 0; p < n; ++p) {
              if (!P.sends_to(p)) continue;
              char const* const src = in + P.send_segment(p) * a.seg_bytes;
              char* const slot = v.ring_slot(p, me, cta, w, s);
              pack16 x[pipelined_unroll];
#pragma unroll
              for (int u = 0; u < pipelined_unroll; ++u) {
                int const i = b + u * 32 + lane;
                if (i < cnt) x[u] = load_user<T>(src, first + i, wr, a.vec_ok);
              }
#pragma unroll
              for (int u = 0; u < pipelined_unroll; ++u) {
                int const i = b + u * 32 + lane;
                if (i < cnt) store_pack(slot + i * 16, x[u]);
              }
            }
          }
        }
        __syncwarp();
        if (lane == 0) {
          fence_sys();
          for (int p = 0; p < n; ++p)
            if (P.sends_to(p)) store_relaxed_sys(v.ready(p, cta, w, me), ready_word(s + 1, a.desc));
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
        for (int p = 0; p < n && ok; ++p)
          if (P.recvs_from(p)) ok = wait_ready(v.ready(me, cta, w, p), s + 1, a.desc, deadline, st, spins);
        // in-place safety: my own sender must have read chunk k of the input before I overwrite it
        for (std::uint32_t t = 1; ok && guard && *static_cast<volatile std::uint32_t*>(&sent[w]) < k + 1; ++t) {
          if (t % deadline_check_period == 0) {
            if (read_status(st) != 0) ok = 0;
            else if (globaltimer() > deadline) { raise_status(st, status::timeout); ok = 0; }
          }
        }
      }
      if (!__shfl_sync(full, ok, 0)) break;
      std::uint64_t const first = ps.first + k * C;
      int const cnt = static_cast<int>((ps.end - first) < C ? (ps.end - first) : C);
      if (P.reduces) {
        if constexpr (!std::is_same_v<T, raw_byte>) {
          char const* const own = in + P.own_in_segment() * a.seg_bytes;
          for (int b = 0; b < cnt; b += 32 * pipelined_unroll) {
            acc_pack<T> acc[pipelined_unroll];
            for (int q = 0; q < n; ++q) {
              pack16 x[pipelined_unroll];
              if (q == me) {
#pragma unroll
                for (int u = 0; u < pipelined_unroll; ++u) {
                  int const i = b + u * 32 + lane;
                  if (i < cnt) x[u] = load_user<T>(own, first + i, wr, a.vec_ok);
                }
              } else {
                char const* const slot = v.ring_slot(me, q, cta, w, s);
#pragma unroll
                for (int u = 0; u < pipelined_unroll; ++u) {
                  int const i = b + u * 32 + lane;
                  if (i < cnt) x[u] = load_pack_cg(slot + i * 16);
                }
              }
#pragma unroll
              for (int u = 0; u < pipelined_unroll; ++u) {
                if (q == 0) acc[u] = to_acc<T>(x[u]);
                else combine_into<T>(a.op, acc[u], x[u]);
              }
            }
#pragma unroll
            for (int u = 0; u < pipelined_unroll; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) store_user<T>(out, first + i, wr, a.vec_ok, from_acc<T>(a.op, acc[u], n));
            }
          }
        }
      } else {
        for (int q = 0; q < n; ++q) {
          bool const from_peer = P.recvs_from(q);
          bool const from_self = q == me && P.copies_own() && !a.in_place;
          if (!from_peer && !from_self) continue;
          char* const dst = out + P.recv_segment(q) * a.seg_bytes;
          char const* const src = from_peer ? v.ring_slot(me, q, cta, w, s) : in + P.send_segment(me) * a.seg_bytes;
          for (int b = 0; b < cnt; b += 32 * pipelined_unroll) {
            pack16 x[pipelined_unroll];
#pragma unroll
            for (int u = 0; u < pipelined_unroll; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) x[u] = from_peer ? load_pack_cg(src + i * 16) : load_user<T>(src, first + i, wr, a.vec_ok);
            }
#pragma unroll
            for (int u = 0; u < pipelined_unroll; ++u) {
              int const i = b + u * 32 + lane;
              if (i < cnt) store_user<T>(dst, first + i, wr, a.vec_ok, x[u]);
            }
          }
        }
      }
      __syncwarp();
      if (lane == 0)
        for (int p = 0; p < n; ++p)
          if (P.recvs_from(p)) store_release_sys(v.credit(p, cta, w, me), s + 1);
      __syncwarp();
    }
  }
  __syncthreads();
  if (tid < ring_warps) *v.ring_seq(cta, tid) = base_seq[tid] + nchunks[tid];
  pdl_trigger();
}

}  // namespace reccl::device
