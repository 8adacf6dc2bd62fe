// reccl/device/engine/one_shot.hpp -- barrier-free one-shot push with Lamport slots.
//
//   call s, phase = s & 1 (per CTA), CTA c of rank me:
//
//     in ──canonicalise──► st.relaxed.sys ──NVLink──► peer p: slot[phase][src=me][c]
//     own in ─────────────────────────────┐
//     my slot[phase][src=q][c] ──poll─────┴──► reduce in rank order ──► out
//                                   └──► re-poison (-0.0f words) for call s+2
//
// A slot word equal to the sentinel means "not arrived"; payloads never contain it because float
// inputs are canonicalised (-0 -> +0). Two phases suffice: a peer writes phase (s & 1) again only at
// call s+2, which needs this rank's data of call s+1, sent after this kernel (and its re-poison)
// finished. No flag, no fence, no barrier: one NVLink crossing per call.
// A 16-byte header per slot carries the descriptor hash and pack count, so ranks that disagree fail
// with `mismatch` instead of reading garbage.
#pragma once

#include "../args.hpp"
#include "../element.hpp"
#include "../flags.hpp"

namespace reccl::device {

/// Packs per thread the one-shot kernel keeps in flight (slot capacity <= unroll * CTA threads).
inline constexpr int one_shot_unroll = 4;

template <class T>
__global__ void __launch_bounds__(cta_threads, 1) one_shot_kernel(coll_args const a) {
  static_assert(element<T>::is_float && sizeof(T) <= 4, "one-shot Lamport slots carry fp32/fp16/bf16 only");
  constexpr int V = pack_elems<T>;
  pdl_wait();
  lsa_view const& v = a.view;
  std::uint32_t* const st = v.status();
  int const cta = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  __shared__ int abort_flag;
  if (tid == 0) abort_flag = read_status(st) != 0;
  std::uint64_t const seq = *v.one_shot_seq(cta);
  __syncthreads();
  if (abort_flag) {
    pdl_trigger();
    return;
  }
  std::uint64_t const deadline = globaltimer() + a.timeout_ns;
  int const phase = static_cast<int>(seq & 1u);
  int const me = v.rank, n = v.nranks;
  pattern const P = make_pattern(a.coll, me, n, a.root);
  elem_range const r = cta_range(a.sp, a.ctas_per_vt, cta, V);
  pack_span const ps = packs_of(r, V);
  int const np = static_cast<int>(ps.size());
  char const* const in = static_cast<char const*>(a.in);
  char* const out = static_cast<char*>(a.out);

  // 1. push: my contribution to every peer's slot [phase][me][cta]
#pragma unroll
  for (int u = 0; u < one_shot_unroll; ++u) {
    int const k = tid + u * cta_threads;
    if (k < np) {
      std::uint64_t const j = ps.first + k;
      if (P.same_source) {
        pack16 const x = canonical<T>(load_user<T>(in, j, r, a.vec_ok));
        for (int p = 0; p < n; ++p)
          if (p != me) store_pack_relaxed_sys(v.one_shot_slot(p, phase, me, cta) + 16 + k * 16, x);
      } else {
        for (int p = 0; p < n; ++p)
          if (p != me) {
            pack16 const x = canonical<T>(load_user<T>(in + P.send_segment(p) * a.seg_bytes, j, r, a.vec_ok));
            store_pack_relaxed_sys(v.one_shot_slot(p, phase, me, cta) + 16 + k * 16, x);
          }
      }
    }
  }
  if (tid < n && tid != me) {
    // header words never equal the sentinel (bit 31 clear)
    pack16 const h{{a.desc & 0x7fffffffu, static_cast<std::uint32_t>(np), 0x5eedu, static_cast<std::uint32_t>(seq & 0x7fffffffu)}};
    store_pack_relaxed_sys(v.one_shot_slot(tid, phase, me, cta), h);
    // 2. check the peer's header (thread `tid` checks peer `tid`)
    char* const hp = v.one_shot_slot(me, phase, tid, cta);
    for (std::uint32_t k = 1;; ++k) {
      pack16 const g = load_pack_relaxed_sys(hp);
      if (lamport_arrived(g)) {
        if (g.w[0] != h.w[0] || g.w[1] != h.w[1] || g.w[3] != h.w[3]) {
          raise_status(st, status::mismatch);
          abort_flag = 1;
        }
        store_pack(hp, lamport_poison());
        break;
      }
      if (k % deadline_check_period == 0) {
        if (read_status(st) != 0) { abort_flag = 1; break; }
        if (globaltimer() > deadline) { raise_status(st, status::timeout); abort_flag = 1; break; }
      }
    }
  }

  // 3. receive: reduce own input and every peer's packs in rank order, re-poison what was read
  char const* const own = in + P.own_in_segment() * a.seg_bytes;
  bool ok = true;
#pragma unroll
  for (int u = 0; u < one_shot_unroll; ++u) {
    int const k = tid + u * cta_threads;
    if (k < np && ok) {
      std::uint64_t const j = ps.first + k;
      pack16 const mine = load_user<T>(own, j, r, a.vec_ok);
      acc_pack<T> acc;
      for (int q = 0; q < n && ok; ++q) {
        pack16 x;
        if (q == me) {
          x = mine;
        } else {
          char* const sp = v.one_shot_slot(me, phase, q, cta) + 16 + k * 16;
          for (std::uint32_t s = 1;; ++s) {
            x = load_pack_relaxed_sys(sp);
            if (lamport_arrived(x)) break;
            if (s % deadline_check_period == 0) {
              if (*static_cast<volatile int*>(&abort_flag) || read_status(st) != 0) { ok = false; break; }
              if (globaltimer() > deadline) { raise_status(st, status::timeout); ok = false; break; }
            }
          }
          if (!ok) break;
          store_pack(sp, lamport_poison());
        }
        if (q == 0) acc = to_acc<T>(x);
        else combine_into<T>(a.op, acc, x);
      }
      if (ok && !*static_cast<volatile int*>(&abort_flag)) store_user<T>(out, j, r, a.vec_ok, from_acc<T>(a.op, acc, n));
    }
  }
  __syncthreads();
  if (tid == 0) *v.one_shot_seq(cta) = seq + 1;
  pdl_trigger();
}

}  // namespace reccl::device
