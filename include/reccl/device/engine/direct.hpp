// reccl/device/engine/direct.hpp -- zero-copy collectives on registered (symmetric-window) buffers.
//
//   entry barrier (CTA pairs; descriptor check; acquire: peers' inputs are ready and nobody still
//   uses the outputs we are about to write)
//     two_shot  AR : my rank part of the CTA range: pull from every rank, reduce in rank order,
//                    store the result into every rank's output (RS by loads, AG by stores, no
//                    barrier between them: the values never leave registers)
//     direct    AR : pull the whole CTA range from every rank, reduce, store locally (out-of-place)
//               RS : pull segment `me` from every rank, reduce, store locally
//               AG : push my input into segment `me` of every rank's output
//               BC : root pushes its input into every rank's output
//               A2A: push input segment p into segment `me` of rank p's output
//   exit barrier (release: my remote stores are visible; acquire: peers' stores into my output are)
#pragma once

#include "../args.hpp"
#include "../element.hpp"
#include "../flags.hpp"

namespace reccl::device {

inline constexpr int direct_unroll = 4;

template <class T>
__global__ void __launch_bounds__(cta_threads, 1) direct_kernel(coll_args const a) {
  constexpr int V = pack_elems<T>;
  pdl_wait();
  // Let the next kernel of the stream launch now: its pdl_wait() still waits for this grid to
  // complete and its writes to be visible, so only the launch latency overlaps.
  pdl_trigger();
  lsa_view const& v = a.view;
  std::uint32_t* const st = v.status();
  int const cta = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  __shared__ int abort_flag;
  if (tid == 0) abort_flag = read_status(st) != 0;
  std::uint64_t const epoch64 = *v.bar_epoch(cta);
  __syncthreads();
  if (abort_flag) {
    return;
  }
  std::uint32_t const epoch = static_cast<std::uint32_t>(epoch64);
  deadline_clock deadline(a.timeout_ns);
  int const me = v.rank, n = v.nranks;
  pattern const P = make_pattern(a.coll, me, n, a.root);
  elem_range const cr = cta_range(a.sp, a.ctas_per_vt, cta, V);

  if (cta_barrier(v, cta, epoch + 1, a.desc, deadline)) {
    if (P.reduces) {
      if constexpr (!std::is_same_v<T, raw_byte>) {
        bool const two = a.algo == algorithm::two_shot;
        elem_range const r = two ? part_of(cr, n, me, V) : cr;
        pack_span const ps = packs_of(r, V);
        std::uint64_t const seg = static_cast<std::uint64_t>(P.own_in_segment()) * a.seg_bytes;  // RS: segment me
        for (std::uint64_t b = 0; b < ps.size(); b += static_cast<std::uint64_t>(cta_threads) * direct_unroll) {
          acc_pack<T> acc[direct_unroll];
          fold_in_rank_order<T, direct_unroll>(a.op, n, acc, [&](int q, pack16 (&x)[direct_unroll]) {
            char const* const src = static_cast<char const*>(a.peer_in[q]) + seg;
#pragma unroll
            for (int u = 0; u < direct_unroll; ++u) {  // all loads in flight before the combines
              std::uint64_t const i = b + static_cast<std::uint64_t>(u * cta_threads + tid);
              if (i < ps.size()) x[u] = load_user<T>(src, ps.first + i, r, a.vec_ok);
            }
            return true;
          });
#pragma unroll
          for (int u = 0; u < direct_unroll; ++u) {
            std::uint64_t const i = b + static_cast<std::uint64_t>(u * cta_threads + tid);
            if (i >= ps.size()) continue;
            pack16 const y = from_acc<T>(a.op, acc[u], n);
            if (two) {
              for (int k = 0; k < n; ++k) {
                int const q = (me + k) % n;  // start with the local copy, then stagger peers
                store_user<T>(a.peer_out[q], ps.first + i, r, a.vec_ok, y);
              }
            } else {
              store_user<T>(a.out, ps.first + i, r, a.vec_ok, y);
            }
          }
        }
      }
    } else {
      pack_span const ps = packs_of(cr, V);
      for (int k = 0; k < n; ++k) {
        int const q = (me + k) % n;
        bool const send = (q == me) ? (P.copies_own() && !a.in_place) : P.sends_to(q);
        if (!send) continue;
        char const* const src = static_cast<char const*>(a.in) + P.send_segment(q) * a.seg_bytes;
        char* const dst = static_cast<char*>(a.peer_out[q]) + P.recv_segment(me) * a.seg_bytes;
        for (std::uint64_t b = 0; b < ps.size(); b += static_cast<std::uint64_t>(cta_threads) * direct_unroll) {
          pack16 x[direct_unroll];
#pragma unroll
          for (int u = 0; u < direct_unroll; ++u) {
            std::uint64_t const i = b + static_cast<std::uint64_t>(u * cta_threads + tid);
            if (i < ps.size()) x[u] = load_user<T>(src, ps.first + i, cr, a.vec_ok);
          }
#pragma unroll
          for (int u = 0; u < direct_unroll; ++u) {
            std::uint64_t const i = b + static_cast<std::uint64_t>(u * cta_threads + tid);
            if (i < ps.size()) store_user<T>(dst, ps.first + i, cr, a.vec_ok, x[u]);
          }
        }
      }
    }
    cta_barrier(v, cta, epoch + 2, a.desc, deadline);
  }
  __syncthreads();
  if (tid == 0) *v.bar_epoch(cta) = epoch64 + 2;
}

}  // namespace reccl::device
