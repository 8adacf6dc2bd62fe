// reccl/device/adaptive/kernel.hpp -- the PReCCL loop inside the pipelined collectives: per-VT stall
// telemetry, a split computed on the device from every rank's records, in-kernel recovery from a
// dead VT, probes that bring it back. Stream-ordered and graph-capturable: everything that changes
// from one collective to the next lives in device memory (state.hpp).
//
//   collective e, rank me, grid = data CTAs (VT v owns CTAs [v*c, (v+1)*c)) + 1 control CTA
//
//   data CTAs                                              control CTA
//   1 plan: the plan slot of e (split, probes, digest),    the record of e-1 (its counters and
//     prepared by the control CTA of e-1, minus the        draft) sealed and sent to every rank;
//     quiet VTs of e-1; CTA 0 writes e's record draft      the counters of e-1 reset; then, with
//     (digest, bytes per VT, probes)                       every rank's record of e-1, step
//   2 data phase: live VTs move their block (pipe_range,   chain[(e+1)&1] -> report of e-1, plan
//     stall counting, throttle/dead injection, VT          slot of e+1 (all beside the data phase)
//     deadline); masked VTs with a probe bit move a probe
//     block; the rest idle
//   3 every data CTA sends its verdict word (faulted, probe failed, touched; tagged with e) to
//     every rank, after a system fence, and adds its counters for the record (no return)
//   4 verdict: every data CTA waits for the words of every data CTA of every rank (the lane
//     deadline bounds it: a lost rank is status::timeout with its rank in error_info; each rank
//     also stores an arrival word into every peer at its start, so a data-phase timeout names
//     the rank that never came)
//   5 recovery: the VTs some rank faulted on (D) are redone by the CTAs of the other live VTs,
//     through their own rings (split evenly, the same on every rank); D's own CTAs and those of
//     failed probes re-poison their rings and re-arm their flags (resync), so a later probe
//     starts clean; D and the failed probes are quiet (carried as faults) in e+1
//   6 data CTA 0 closes e (the sample's fault bits and tail, the quiet VTs, the epoch)
//
// So the end of a collective is one fence and one tagged word per CTA and rank, with no counter
// round trip on the way; the record (stalls, bytes, digest, checksum: ~300 bytes, sealed by a
// sequential hash) is exchanged one collective later, beside the data phase, and still reaches
// the step in time: the split of e+1 comes from the records of e-1.
//
// Recovery redoes a dead VT's whole block from the inputs, so an in-place collective whose dead
// VT had already written part of its output (on any rank) cannot be recovered: status::internal.
// Injected faults start at a collective's beginning, so they never hit that case; a real path that
// dies in mid-transfer can. Out-of-place collectives always recover.
//
// Latency: whatever runs between the data phase and the end of the kernel delays every collective,
// so step 1 reads device memory with one parallel load per thread into shared memory and lets
// one thread compute on the copy (a chain of dependent loads costs ~0.7 us each), and steps 3-4
// are one store and one poll per thread.
//
// This file is the data plane (the data CTAs' steps 1-6 and the kernel); the control plane (the
// records, the control CTA's step, step 1's slow path) is control_plane.hpp.
#pragma once

#include <cstdint>
#include <cstring>

#include "control_plane.hpp"
#include "../args.hpp"
#include "../engine/pipelined.hpp"
#include "hooks.hpp"
#include "state.hpp"

namespace reccl::device::adaptive {

/// Step 5's resync of this CTA's rings: poison the slots peers may have written in this
/// collective (the last min(chunks, depth) sequences of each warp pair) and re-arm the flags at
/// the current sequence, as if every earlier chunk had arrived and been credited. Called only
/// after the verdict, when no peer writes into these rings any more (each rank's verdict words
/// follow all of its data-phase stores), and only for VTs that carry nothing in the next collective.
RECCL_DEVICE void resync_rings(lsa_view const& v, int cta, pipe_cta const& cs) {
  int const tid = static_cast<int>(threadIdx.x);
  int const warp = tid / 32, lane = tid % 32;
  std::uint64_t const depth = static_cast<std::uint64_t>(v.L.ring_depth);
  std::uint64_t const slot_packs = (static_cast<std::uint64_t>(v.L.ring_chunk_bytes) + 16u) / 16u;
  if (warp < ring_warps) {
    std::uint64_t const end = cs.base_seq[warp];
    std::uint64_t const used = cs.nchunks[warp] < depth ? cs.nchunks[warp] : depth;
    for (int src = 0; src < v.nranks; ++src) {
      if (src == v.rank) continue;
      for (std::uint64_t s = end - used; s < end; ++s) {
        char* const slot = v.ring_slot(v.rank, src, cta, warp, s);
        for (std::uint64_t i = static_cast<std::uint64_t>(lane); i < slot_packs; i += 32) store_pack(slot + i * 16, lamport_poison());
      }
    }
    __syncwarp();
    if (lane == 0)
      for (int src = 0; src < v.nranks; ++src) {
        if (src == v.rank) continue;
        store_relaxed_sys(v.credit(v.rank, cta, warp, src), end);
        store_relaxed_sys(v.ready(v.rank, cta, warp, src), end);
      }
  }
  fence_sys();
  __syncthreads();
}

/// pipe_range() as a call, for the rare paths (probes, recovery). Not for the data phase: through a
/// call the pipeline reads its arguments from local memory, ~20% slower (bench/NOTES.md, 15).
template <class T, class H>
__device__ __noinline__ bool pipe_range_call(coll_args const& a, pipe_io const& io, pattern const& P, elem_range cr,
                                             pipe_cta& cs, H& hooks) {
  return pipe_range<T>(a, io, P, cr, cs, hooks);
}

template <class T, class M, class A>
__global__ void __launch_bounds__(cta_threads, 1) adaptive_kernel(__grid_constant__ adaptive_args const a) {
  static_assert(Telemetry<M> && Allocator<A>);
  static_assert(sizeof(control<A>) <= static_cast<std::size_t>(chain_bytes), "control state larger than its slot");
  constexpr int V = pack_elems<T>;
  pdl_wait();
  pdl_trigger();
  coll_args const& b = a.base;
  lsa_view const& v = b.view;
  control_region* const R = v.ctl();
  std::uint32_t* const st = v.status();
  int const cta = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x);
  int const me = v.rank, n = v.nranks;
  __shared__ pipe_cta cs;
  __shared__ adaptive_ctx cx;
  __shared__ epoch_plan plan;
  __shared__ plan_slot ps2[2];  // both chains' slots: loaded before the epoch says which is ours
  __shared__ fault_table faults_s;
  __shared__ std::uint64_t epoch_s, quiet_tag_s;
  __shared__ std::uint32_t quiet_s, status_s;
  __shared__ int stop, lost_s;
  __shared__ std::uint32_t dead_s, resync_s, fault_bits_s, probe_fail_s, touched_s;
  __shared__ std::uint64_t verdict_seen;  // CTA 0's tail (vt_sample::tail_ns)
  int const cpv = b.ctas_per_vt;
  int const vt = cta / cpv;
  // ---- 1. plan: every word the prologue needs, one load per thread, all in flight at once
  if (cta != a.data_ctas && !(a.ablate & 16u)) {
    cta_copy_cg(ps2, R->plan, sizeof(ps2));
    cta_copy_cg(&faults_s, &R->faults, sizeof(fault_table));
  } else if (tid == 0) {
    faults_s.n = 0;
  }
  if (tid == 480) status_s = read_status(st);
  if (tid == 481) epoch_s = __ldcg(reinterpret_cast<unsigned long long const*>(&R->epoch));
  if (tid == 482) quiet_tag_s = __ldcg(reinterpret_cast<unsigned long long const*>(&R->quiet_tag));
  if (tid == 483) quiet_s = __ldcg(&R->quiet);
  if (tid >= 488 && tid < 488 + ring_warps) {
    cs.base_seq[tid - 488] = *v.ring_seq(cta, tid - 488);
    cx.pace_start[tid - 488] = cx.paced_bytes[tid - 488] = 0;
  }
  if (tid == 0) dead_s = resync_s = 0;
  __syncthreads();
  if (status_s != 0) return;
  std::uint64_t const e = epoch_s;
  if (cta == a.data_ctas) {  // the control CTA
    control_step<A, M>(a, R, e);
    __syncthreads();
    if (tid == 0) R->samples[e % ring_entries].tail_ns[2] = static_cast<std::int64_t>(globaltimer());
    return;
  }
  plan_slot const& ps = ps2[e & 1u];
  if (tid == 0) {
    cs.abort_flag = 0;
    plan.quiet = quiet_tag_s == e + 1 ? quiet_s : 0u;
    if (a.ablate & 4u) {
      plan.sp = b.sp;
      plan.probes = plan.quiet = 0;
      plan.chain_epoch = plan.digest = 0;
    } else {
      plan.probes = ps.probes & ~plan.quiet;
      plan.chain_epoch = ps.chain_epoch;
      plan.digest = ps.digest;
      if (ps.tag == e + 1 && ps.count == b.count && ps.granule == a.granule && (plan.quiet & ps.live_mask) == 0)
        plan.sp = ps.sp;
      else
        plan_from_chain<A>(a, R, e, ps, plan);
    }
    std::uint32_t nl = 0;
    for (int u = 0; u < plan.sp.n_vts; ++u) nl += plan.sp.live(u) ? 1u : 0u;
    plan.live_ctas = nl * static_cast<std::uint32_t>(cpv);
    if (plan.sp.n_vts == 0) {  // every VT quiet: nothing left to carry the message
      record_fatal(R, st, status::timeout, me, -1);
      cs.abort_flag = 1;
    }
    bool dead = false;
    std::uint64_t const rate = injected(faults_s, vt, e, dead);
    std::uint64_t const pipes = static_cast<std::uint64_t>(cpv) * ring_warps;
    cx.lane_timeout_ns = b.timeout_ns;
    cx.lane_end = 0;
    cx.status_word = st;
    cx.cta_abort = &cs.abort_flag;
    cx.live_done = &R->acc[e & 1u].live_done;
    cx.live_ended = &R->acc[e & 1u].live_ended;
    cx.live_ctas = plan.live_ctas;
    cx.vt_fault = cx.probe_failed = cx.touched = 0;
    cx.dead = dead ? 1 : 0;
    cx.count_stalls = M::enabled ? 1 : 0;
    cx.cta_wait_ns = 0;
    cx.poll_word = &R->epoch;
    cx.vt_timeout_ns = a.vt_timeout_ns;
    cx.probe_grace_ns = a.probe_grace_ns;
    cx.warp_bytes_per_us = rate == 0 ? 0 : (rate / pipes > 0 ? rate / pipes : 1);
  }
  if (cta == 0 && tid < n && tid != me) store_relaxed_sys(v.arrival(tid, me), e + 1);  // for naming a lost rank
  __syncthreads();
  if (cs.abort_flag) return;

  // ---- 2. data phase
  pattern const P = make_pattern(b.coll, me, n, b.root);
  if (cta == 0) write_draft<M>(a, R, e, plan, P);
  split const& sp = plan.sp;
  bool const live = vt < sp.n_vts && sp.live(vt);
  bool const probe = !live && vt < a.n_vts && ((plan.probes >> vt) & 1u) != 0;
  bool data_ok = true;
  std::uint64_t t_start = 0;
  if (M::enabled && tid == 32) t_start = globaltimer();  // the thread that adds the counters
  if (live) {
    adaptive_hooks<vt_guard> h{vt_guard{&cx}, true};
    data_ok = pipe_range<T>(b, pipe_io::of(b), P, cta_range(sp, cpv, cta, V), cs, h);
  } else if (probe) {
    // a probe block: every rank exchanges one small chunk per warp pair through this VT's rings
    // (all-reduce of the probe area, or all-to-all for the copying instantiation); its result is
    // thrown away, so its loss costs nothing but the probe
    constexpr bool raw = std::is_same_v<T, raw_byte>;
    pattern const PP = make_pattern(raw ? collective::all_to_all : collective::all_reduce, me, n, 0);
    std::uint64_t const per_seg = static_cast<std::uint64_t>(ring_warps) * probe_bytes_per_warp;
    char* const area = v.probe_area(cta);
    pipe_io io{area, area + (raw ? max_lsa * per_seg : 0), per_seg, true, !raw};
    std::uint64_t const units = raw ? per_seg : per_seg / sizeof(T);
    adaptive_hooks<probe_guard> h{probe_guard{&cx}, false};
    bool const ok = pipe_range_call<T>(b, io, PP, elem_range{0, units}, cs, h);
    if (!ok && tid == 0) cx.probe_failed = 1;
  }
  __syncthreads();
  if (a.ablate & 8u) {  // measurement only: the data phase alone
    if (tid < ring_warps) *v.ring_seq(cta, tid) = cs.base_seq[tid];
    return;
  }
  // ---- 3. this CTA's verdict word (tagged with e: faulted, probe failed, touched) to every rank,
  // after a system fence that orders the CTA's data-phase stores before it (a resync relies on
  // it); meanwhile another warp adds the CTA's counters for the record (no fence, no return: they
  // are read after the kernel, by the control CTA of e+1) and reads the lane status
  bool const faulted = live && !data_ok;
  if (tid < n && !(a.ablate & 2u)) {
    std::uint32_t const bits = (faulted ? verdict_fault : 0u) | (probe && cx.probe_failed ? verdict_probe_failed : 0u) |
                               (faulted && cx.touched ? verdict_touched : 0u);
    fence_sys();
    store_relaxed_sys(v.verdict(tid, static_cast<int>(e & 1u), me, cta), verdict_word(e, bits));
  }
  if (tid == 32) {
    counters& acc = R->acc[e & 1u];
    std::uint64_t const t_end = globaltimer();
    std::uint32_t const lane_status = read_status(st);
    if (live) {
      if constexpr (M::enabled) {
        if (cx.cta_wait_ns != 0) atomicAdd(&acc.wait_ns[vt], cx.cta_wait_ns);
        atomicMax(&acc.t0[vt], ~static_cast<unsigned long long>(t_start));
        atomicMax(&acc.t1[vt], static_cast<unsigned long long>(t_end));
      }
      if (faulted) {
        atomicOr(&acc.fault_mask, 1u << vt);
      } else {
        atomicAdd(&acc.live_done, 1u);
      }
      atomicAdd(&acc.live_ended, 1u);
    }
    if (probe && cx.probe_failed) atomicOr(&acc.probe_fail_mask, 1u << vt);
    stop = lane_status != 0;
    if (stop) {  // a lane error (deadline, mismatch): name the rank that never came, then stop
      int lost = -1;
      for (int p = 0; p < n && lost < 0; ++p)
        if (p != me && load_relaxed_sys(v.arrival(me, p)) < e + 1) lost = p;
      atomicCAS(&R->error_info, 0u, (static_cast<std::uint32_t>(lost < 0 ? me : lost) << 16) | static_cast<std::uint32_t>(vt + 1));
    }
    fault_bits_s = probe_fail_s = touched_s = 0;
    lost_s = -1;
  }
  __syncthreads();
  if (stop) return;
  if (a.ablate & 2u) {
    if (tid < ring_warps) *v.ring_seq(cta, tid) = cs.base_seq[tid];
    if (cta == 0 && tid == 0) *static_cast<volatile std::uint64_t*>(&R->epoch) = e + 1;
    return;
  }
  // ---- 4. verdict: every data CTA of every rank sent its word of e (one thread per word)
  {
    verdict_guard g{&cx};
    std::uint32_t const tag = static_cast<std::uint32_t>(e + 1);
    for (int i = tid; i < n * a.data_ctas; i += cta_threads) {
      int const src = i / a.data_ctas, k = i % a.data_ctas;
      std::uint32_t bits = 0;
      if (!wait_tagged(v.verdict(me, static_cast<int>(e & 1u), src, k), tag, g, bits)) {
        atomicCAS(&R->error_info, 0u, (static_cast<std::uint32_t>(src) << 16));
        lost_s = src;
        break;
      }
      std::uint32_t const bit = 1u << (k / cpv);
      if (bits & verdict_fault) atomicOr(&fault_bits_s, bit);
      if (bits & verdict_probe_failed) atomicOr(&probe_fail_s, bit);
      if (bits & verdict_touched) atomicOr(&touched_s, bit);
    }
  }
  __syncthreads();
  if (lost_s >= 0) return;
  if (cta == 0 && tid == 0) verdict_seen = globaltimer();
  if (tid == 0) {
    std::uint32_t const D = fault_bits_s & ~plan.quiet & sp.live_mask;
    dead_s = D;
    resync_s = D | (plan.probes & probe_fail_s);
    if (D != 0 && D == sp.live_mask) {
      record_fatal(R, st, status::timeout, me, __ffs(D) - 1);  // no live VT left to recover on
      stop = 1;
    } else if (D != 0 && b.in_place && (touched_s & D) != 0) {
      record_fatal(R, st, status::internal, me, __ffs(touched_s & D) - 1);
      stop = 1;
    }
  }
  __syncthreads();
  if (stop) return;

  // ---- 5. recovery and resync
  std::uint32_t const D = dead_s;
  if (D != 0 && live && ((D >> vt) & 1u) == 0) {
    int nl = 0, j = -1;
    for (int u = 0; u < sp.n_vts; ++u)
      if (sp.live(u) && ((D >> u) & 1u) == 0) {
        if (u == vt) j = nl * cpv + cta % cpv;
        ++nl;
      }
    nl *= cpv;
    adaptive_hooks<recovery_guard> h{recovery_guard{&cx}, false};
    for (int u = 0; u < sp.n_vts; ++u) {
      if (((D >> u) & 1u) == 0) continue;
      std::uint64_t const off = sp.offset(u);
      elem_range const r = part_of(elem_range{off, off + sp.count[u]}, nl, j, V);
      if (!pipe_range_call<T>(b, pipe_io::of(b), P, r, cs, h)) break;
    }
  }
  if (((resync_s >> vt) & 1u) != 0) resync_rings(v, cta, cs);
  if (tid < ring_warps) *v.ring_seq(cta, tid) = cs.base_seq[tid];

  // ---- 6. data CTA 0 closes the epoch (after the verdict, so with every rank's bits)
  if (cta == 0 && tid == 0) {
    vt_sample& smp = R->samples[e % ring_entries];
    smp.fault_mask = D;
    smp.tail_ns[0] = static_cast<std::int64_t>(verdict_seen);  // absolute here; the control CTA of e+1 makes them relative
    smp.tail_ns[1] = static_cast<std::int64_t>(globaltimer());
    if (D != 0) R->recovered += 1;
    R->quiet = resync_s;
    R->quiet_tag = e + 2;
    *static_cast<volatile std::uint64_t*>(&R->epoch) = e + 1;
  }
}

}  // namespace reccl::device::adaptive
