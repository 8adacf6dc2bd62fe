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
// A 16-byte header per slot carries the descriptor hash, pack count and call sequence, so ranks that
// disagree fail with `mismatch` instead of reading garbage. It is published before the data and
// checked after it, by lanes of the CTA's last warp (which holds data only when a CTA moves more
// than 15 warps' worth of packs): the check runs beside the receive, not in front of it. Waiting for
// the header first cost 0.9-2.8 us per call at 1 KiB with 2-4 ranks (bench/NOTES.md 44). A
// mismatched call therefore raises `mismatch` possibly after this rank stored its output: the
// output of a call whose ranks disagree is unspecified, the lane's error is not.
#pragma once

#include "../args.hpp"
#include "../element.hpp"
#include "../flags.hpp"

namespace reccl::device {

/// Packs per thread the one-shot kernel keeps in flight (slot capacity <= unroll * CTA threads).
inline constexpr int one_shot_unroll = 4;

/// Poll a Lamport slot pack until it has arrived. Returns false when the guard gives up. `spins`
/// counts unsuccessful polls (stall telemetry).
template <class Guard>
RECCL_DEVICE bool lamport_poll(char const* p, pack16& x, Guard& guard, std::uint64_t& spins) {
  return spin_until(
      [&] {
        x = load_pack_relaxed_sys(p);
        return lamport_arrived(x);
      },
      guard, spins);
}
template <class Guard>
RECCL_DEVICE bool lamport_poll(char const* p, pack16& x, Guard& guard) {
  std::uint64_t spins = 0;
  return lamport_poll(p, x, guard, spins);
}
/// lamport_poll under the lane's deadline: false on timeout (raised), abort or a lane error.
RECCL_DEVICE bool lamport_poll(char const* p, pack16& x, deadline_clock& deadline, int const* abort_flag,
                               std::uint32_t* st, int peer = -1) {
  lane_guard g{&deadline, st, abort_flag, peer};
  return lamport_poll(p, x, g);
}

/// A one-shot slot header: what every rank of the call must agree on. Bit 31 of every word is clear,
/// so a header never equals the sentinel.
RECCL_DEVICE pack16 one_shot_header(std::uint32_t desc, int np, std::uint64_t seq) {
  return pack16{{desc & 0x7fffffffu, static_cast<std::uint32_t>(np), 0x5eedu, static_cast<std::uint32_t>(seq & 0x7fffffffu)}};
}

/// Store this rank's header `h` into every peer's slot for it (thread q stores peer q's). Called
/// before any data is pushed; no ordering against the data is needed (the check below waits).
RECCL_DEVICE void publish_header(lsa_view const& v, int phase, int cta, pack16 const& h) {
  int const q = static_cast<int>(threadIdx.x);
  if (q < v.nranks && q != v.rank) store_pack_relaxed_sys(v.one_shot_slot(q, phase, v.rank, cta), h);
}

/// Lane q of the CTA's last warp waits for peer q's header, compares it with `h` and re-poisons it.
/// A difference raises status::mismatch on the lane; a difference or a wait that gave up sets the
/// CTA's abort flag, which ends the other threads' waits at their next guard check. Every thread
/// of the CTA calls it after its own receive.
static_assert(max_lsa <= 32, "one checking lane per peer in the last warp");
RECCL_DEVICE void check_header(lsa_view const& v, int phase, int cta, pack16 const& h, deadline_clock& deadline,
                               int* abort_flag, std::uint32_t* st) {
  int const q = static_cast<int>(threadIdx.x) - (cta_threads - 32);
  if (q < 0 || q >= v.nranks || q == v.rank) return;
  char* const hp = v.one_shot_slot(v.rank, phase, q, cta);
  pack16 g;
  if (!lamport_poll(hp, g, deadline, abort_flag, st, q)) {
    *abort_flag = 1;
    return;
  }
  if (g.w[0] != h.w[0] || g.w[1] != h.w[1] || g.w[3] != h.w[3]) {
    raise_status(st, status::mismatch, q);
    *abort_flag = 1;
  }
  store_pack(hp, lamport_poison());
}

template <class T>
__global__ void __launch_bounds__(cta_threads, 1) one_shot_kernel(coll_args const a) {
  static_assert(element<T>::is_float && sizeof(T) <= 4, "one-shot Lamport slots carry fp32/fp16/bf16 only");
  constexpr int V = pack_elems<T>;
  constexpr int U = one_shot_unroll;
  pdl_wait();
  // Let the next kernel of the stream launch now: its pdl_wait() still waits for this grid to
  // complete and its writes to be visible, so only the launch latency overlaps.
  pdl_trigger();
  lsa_view const& v = a.view;
  std::uint32_t* const st = v.status();
  int const cta = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  int const me = v.rank, n = v.nranks;
  pattern const P = make_pattern(a.coll, me, n, a.root);
  elem_range const r = cta_range(a.sp, a.ctas_per_vt, cta, V);
  pack_span const ps = packs_of(r, V);
  int const np = static_cast<int>(ps.size());
  char const* const in = static_cast<char const*>(a.in);
  char* const out = static_cast<char*>(a.out);
  char const* const own = in + P.own_in_segment() * a.seg_bytes;

  // Issue the loads of this rank's own contribution first: their latency overlaps the reads of the
  // lane state below (the slot phase depends on it).
  pack16 mine[U];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    int const k = tid + u * cta_threads;
    if (k < np) mine[u] = canonical<T>(load_user<T>(own, ps.first + k, r, a.vec_ok));
  }
  __shared__ int abort_flag;
  if (tid == 0) abort_flag = read_status(st) != 0;
  std::uint64_t const seq = *v.one_shot_seq(cta);
  __syncthreads();
  if (abort_flag) {
    return;
  }
  deadline_clock deadline(a.timeout_ns);
  int const phase = static_cast<int>(seq & 1u);
  pack16 const h = one_shot_header(a.desc, np, seq);
  publish_header(v, phase, cta, h);

  // 1. push: my contribution to every peer's slot [phase][me][cta]
#pragma unroll
  for (int u = 0; u < U; ++u) {
    int const k = tid + u * cta_threads;
    if (k < np) {
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        pack16 const x = P.same_source ? mine[u]
                                       : canonical<T>(load_user<T>(in + P.send_segment(p) * a.seg_bytes, ps.first + k, r, a.vec_ok));
        store_pack_relaxed_sys(v.one_shot_slot(p, phase, me, cta) + 16 + k * 16, x);
      }
    }
  }

  // 2. receive: poll all my packs of a peer at once, combine in rank order, re-poison what was read;
  // 3. check the peers' headers (the last warp's lanes, after their own packs)
  bool ok = true;
  if (n == 2) {
    char* const base = v.one_shot_slot(me, phase, 1 - me, cta) + 16;
    pack16 x[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int const k = tid + u * cta_threads;
      if (k < np) x[u] = load_pack_relaxed_sys(base + k * 16);
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      int const k = tid + u * cta_threads;
      if (k < np && ok && !lamport_arrived(x[u])) ok = lamport_poll(base + k * 16, x[u], deadline, &abort_flag, st, 1 - me);
    }
    if (ok) {
      bool const write = !*static_cast<volatile int*>(&abort_flag);
      with_op(a.op, [&]<redop Op>() {
#pragma unroll
        for (int u = 0; u < U; ++u) {
          int const k = tid + u * cta_threads;
          if (k < np) {
            store_pack(base + k * 16, lamport_poison());
            pack16 const y = me == 0 ? reduce_pair<T, Op>(mine[u], x[u]) : reduce_pair<T, Op>(x[u], mine[u]);
            if (write) store_user<T>(out, ps.first + k, r, a.vec_ok, y);
          }
        }
      });
    }
    check_header(v, phase, cta, h, deadline, &abort_flag, st);
    __syncthreads();
    if (tid == 0) *v.one_shot_seq(cta) = seq + 1;
    return;
  }
  // more than two ranks: one pack at a time, peers polled in rank order, the op fixed at compile time
  // (a run-time op costs a branch per element and rank: 0.5 us per call at 1 KiB with 3 ranks)
  with_op(a.op, [&]<redop Op>() {
#pragma unroll 1
    for (int u = 0; u < U && ok; ++u) {
      int const k = tid + u * cta_threads;
      if (k >= np) break;
      acc_pack<T> acc;
      ok = fold_in_rank_order<T>(Op, n, acc, [&](int q, pack16& x) {
        if (q == me) {
          x = load_user<T>(own, ps.first + k, r, a.vec_ok);  // reloaded: a run-time index into mine[] would spill it
          return true;
        }
        char* const p = v.one_shot_slot(me, phase, q, cta) + 16 + k * 16;
        bool const got = lamport_poll(p, x, deadline, &abort_flag, st, q);
        if (got) store_pack(p, lamport_poison());
        return got;
      });
      if (ok && !*static_cast<volatile int*>(&abort_flag)) store_user<T>(out, ps.first + k, r, a.vec_ok, from_acc<T>(Op, acc, n));
    }
  });
  check_header(v, phase, cta, h, deadline, &abort_flag, st);
  __syncthreads();
  if (tid == 0) *v.one_shot_seq(cta) = seq + 1;
}

}  // namespace reccl::device

namespace reccl::device {

/// LL packets: {data.w0, flag, data.w1, flag}. The flag word is a constant that is never the
/// sentinel; a slot holds either sentinels (poisoned) or the packets of the current call, because
/// every reader re-poisons what it read. Both flag words must be present: only 8-byte halves of a
/// 16-byte store are guaranteed to arrive whole.
inline constexpr std::uint32_t ll_flag = 0x1ee11ee1u;

RECCL_DEVICE bool ll_arrived(pack16 const& p) { return p.w[1] == ll_flag && p.w[3] == ll_flag; }

/// Poll the two LL packets that carry one 16-byte data pack.
RECCL_DEVICE bool ll_poll(char const* p, pack16& data, deadline_clock& deadline, int const* abort_flag, std::uint32_t* st,
                         int peer = -1) {
  pack16 a = load_pack_relaxed_sys(p), b = load_pack_relaxed_sys(p + 16);
  lane_guard g{&deadline, st, abort_flag, peer};
  bool const ok = spin_until(
      [&] {
        if (ll_arrived(a) && ll_arrived(b)) return true;
        if (!ll_arrived(a)) a = load_pack_relaxed_sys(p);
        if (!ll_arrived(b)) b = load_pack_relaxed_sys(p + 16);
        return false;
      },
      g);
  if (!ok) return false;
  data = pack16{{a.w[0], a.w[2], b.w[0], b.w[2]}};
  store_pack(const_cast<char*>(p), lamport_poison());
  store_pack(const_cast<char*>(p) + 16, lamport_poison());
  return true;
}
RECCL_DEVICE void ll_send(char* p, pack16 const& x) {
  store_pack_relaxed_sys(p, pack16{{x.w[0], ll_flag, x.w[1], ll_flag}});
  store_pack_relaxed_sys(p + 16, pack16{{x.w[2], ll_flag, x.w[3], ll_flag}});
}

/// One-shot push for payloads that cannot carry a sentinel (integers, fp64, raw bytes of the
/// copying collectives): the same slots and protocol as one_shot_kernel, but each 16-byte pack
/// travels as two LL packets (8 bytes of data each), so a slot holds half as much.
template <class T>
__global__ void __launch_bounds__(cta_threads, 1) ll_kernel(coll_args const a) {
  constexpr int V = pack_elems<T>;
  constexpr int U = one_shot_unroll / 2;
  pdl_wait();
  pdl_trigger();
  lsa_view const& v = a.view;
  std::uint32_t* const st = v.status();
  int const cta = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  int const me = v.rank, n = v.nranks;
  pattern const P = make_pattern(a.coll, me, n, a.root);
  elem_range const r = cta_range(a.sp, a.ctas_per_vt, cta, V);
  pack_span const ps = packs_of(r, V);
  int const np = static_cast<int>(ps.size());
  char const* const in = static_cast<char const*>(a.in);
  char* const out = static_cast<char*>(a.out);
  __shared__ int abort_flag;
  if (tid == 0) abort_flag = read_status(st) != 0;
  std::uint64_t const seq = *v.one_shot_seq(cta);
  __syncthreads();
  if (abort_flag) return;
  deadline_clock deadline(a.timeout_ns);
  int const phase = static_cast<int>(seq & 1u);
  // Headers go both ways between every pair, also where no data flows (a broadcast's root
  // receives none): each rank then waits for every peer in every call, so no rank runs more than
  // one call ahead and the two slot phases suffice (a root running ahead would overwrite a phase
  // its peers have not read yet).
  pack16 const h = one_shot_header(a.desc, np, seq);
  publish_header(v, phase, cta, h);

  // 1. push
#pragma unroll
  for (int u = 0; u < U; ++u) {
    int const k = tid + u * cta_threads;
    if (k >= np) continue;
    for (int p = 0; p < n; ++p) {
      if (!P.sends_to(p)) continue;
      pack16 const x = load_user<T>(in + P.send_segment(p) * a.seg_bytes, ps.first + k, r, a.vec_ok);
      ll_send(v.one_shot_slot(p, phase, me, cta) + 16 + k * 32, x);
    }
  }

  // 2. receive; 3. check the peers' headers (the last warp's lanes, after their own packs)
  bool ok = true;
#pragma unroll 1
  for (int u = 0; u < U && ok; ++u) {
    int const k = tid + u * cta_threads;
    if (k >= np) break;
    std::uint64_t const j = ps.first + k;
    if (P.reduces) {
      if constexpr (!std::is_same_v<T, raw_byte>) {
        char const* const own = in + P.own_in_segment() * a.seg_bytes;
        with_op(a.op, [&]<redop Op>() {  // the op fixed per pack, not branched on per element
          acc_pack<T> acc;
          ok = fold_in_rank_order<T>(Op, n, acc, [&](int q, pack16& x) {
            if (q == me) {
              x = load_user<T>(own, j, r, a.vec_ok);
              return true;
            }
            return ll_poll(v.one_shot_slot(me, phase, q, cta) + 16 + k * 32, x, deadline, &abort_flag, st, q);
          });
          if (ok && !*static_cast<volatile int*>(&abort_flag)) store_user<T>(out, j, r, a.vec_ok, from_acc<T>(Op, acc, n));
        });
      }
    } else {
      for (int q = 0; q < n && ok; ++q) {
        pack16 x;
        if (P.recvs_from(q)) {
          ok = ll_poll(v.one_shot_slot(me, phase, q, cta) + 16 + k * 32, x, deadline, &abort_flag, st, q);
        } else if (q == me && P.copies_own() && !a.in_place) {
          x = load_user<T>(in + P.send_segment(me) * a.seg_bytes, j, r, a.vec_ok);
        } else {
          continue;
        }
        if (ok && !*static_cast<volatile int*>(&abort_flag))
          store_user<T>(out + P.recv_segment(q) * a.seg_bytes, j, r, a.vec_ok, x);
      }
    }
  }
  check_header(v, phase, cta, h, deadline, &abort_flag, st);
  __syncthreads();
  if (tid == 0) *v.one_shot_seq(cta) = seq + 1;
}

}  // namespace reccl::device
