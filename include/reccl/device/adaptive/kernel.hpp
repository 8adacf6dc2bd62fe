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
#pragma once

#include <cstdint>
#include <cstring>

#include "../../policy/control.hpp"
#include "../../policy/telemetry/stall_counter.hpp"
#include "../../policy/telemetry/telemetry.hpp"
#include "../args.hpp"
#include "../engine/pipelined.hpp"
#include "hooks.hpp"
#include "state.hpp"

namespace reccl::device::adaptive {

/// Kernel arguments: the collective (its split field unused: the device computes the split) and
/// the loop's parameters.
struct adaptive_args {
  coll_args base;
  std::uint64_t vt_timeout_ns = 0;   ///< a VT whose wait spins this long while another VT finished has faulted
  std::uint64_t probe_grace_ns = 0;  ///< a probe waits this long after the live CTAs are done
  std::uint64_t granule = 1;         ///< split granule in kernel units (whole packs)
  std::uint32_t unit_bytes = 1;      ///< bytes per kernel unit
  std::int32_t n_vts = 1;
  std::int32_t data_ctas = 1;        ///< n_vts * ctas_per_vt; the control CTA is blockIdx.x == data_ctas
  std::uint32_t ablate = 0;          ///< measurement only (adaptive_options::ablate); 0 in use
};

using kernel_fn_t = void (*)(adaptive_args);

template <class A>
RECCL_HOST_DEVICE control<A>* chain_at(control_region* R, int c) {
  return reinterpret_cast<control<A>*>(R->chain[c]);
}

/// Chain c's epoch k is global epoch base + 2k, base being the first epoch >= `first` of parity
/// c; a model from global epoch G applies from the first chain epoch whose global epoch is >= G.
RECCL_HOST_DEVICE constexpr std::uint64_t chain_epoch_from(std::uint64_t global, int c, std::uint64_t first) {
  std::uint64_t const base = first + (((first & 1u) != static_cast<std::uint64_t>(c)) ? 1u : 0u);
  return global <= base ? 0 : (global - base + 1) / 2;
}

/// Copies `bytes` (a multiple of 8, 8-byte aligned) written by another GPU, bypassing L1.
RECCL_DEVICE void copy_cg(void* dst, void const* src, std::size_t bytes) {
  auto* d = static_cast<unsigned long long*>(dst);
  auto const* s = static_cast<unsigned long long const*>(src);
  for (std::size_t i = 0; i < bytes / 8; ++i) d[i] = __ldcg(s + i);
}

/// Fails the lane with `s`, naming the rank (and VT, or -1) in error_info if it is the first error.
RECCL_DEVICE void record_fatal(control_region* R, std::uint32_t* st, status s, int rank, int vt) {
  atomicCAS(&R->error_info, 0u, (static_cast<std::uint32_t>(rank) << 16) | static_cast<std::uint32_t>(vt + 1));
  raise_status(st, s);
}

/// What the data CTAs of one collective run: effective split, probes, carried faults.
struct epoch_plan {
  split sp;
  std::uint32_t probes;  ///< masked VTs that carry a probe block
  std::uint32_t quiet;   ///< VTs that faulted or failed a probe in e-1 (carried as faults)
  std::uint32_t live_ctas;
  std::uint64_t chain_epoch, digest;  ///< for this rank's record
};

/// CTA-wide copies of small structs (4-byte words, every thread one word at a time, so all loads
/// are in flight at once); _cg reads from L2 (data another GPU or an earlier kernel wrote).
RECCL_DEVICE void cta_copy_cg(void* dst, void const* src, std::size_t bytes) {
  for (std::size_t i = threadIdx.x; i < bytes / 4; i += blockDim.x)
    static_cast<unsigned int*>(dst)[i] = __ldcg(static_cast<unsigned int const*>(src) + i);
}
RECCL_DEVICE void cta_copy(void* dst, void const* src, std::size_t bytes) {
  for (std::size_t i = threadIdx.x; i < bytes / 4; i += blockDim.x)
    static_cast<unsigned int*>(dst)[i] = static_cast<unsigned int const*>(src)[i];
}
RECCL_DEVICE void cta_zero(void* dst, std::size_t bytes) {
  for (std::size_t i = threadIdx.x; i < bytes / 4; i += blockDim.x) static_cast<unsigned int*>(dst)[i] = 0;
}
template <class T> inline constexpr std::size_t padded_bytes = (sizeof(T) + 3) / 4 * 4;
static_assert(sizeof(split) % 4 == 0 && sizeof(report_entry) % 4 == 0 && sizeof(vt_sample) % 4 == 0 &&
              sizeof(plan_slot) % 4 == 0 && sizeof(counters) % 4 == 0 && sizeof(pending_model) % 4 == 0);

/// Step 1, slow path (thread 0 of a data CTA, only when the plan slot does not fit: the first
/// collective of a chain, a new count, or quiet VTs to take out of the split).
template <class A>
__device__ __noinline__ void plan_from_chain(adaptive_args const& a, control_region* R, std::uint64_t e, plan_slot const& ps,
                                             epoch_plan& out) {
  control<A> const& C = *chain_at<A>(R, static_cast<int>(e & 1u));
  std::uint64_t const count = a.base.count;
  if ((out.quiet & C.share.live_mask) != 0) {
    shares const sh = remask(C.share, C.share.live_mask & ~out.quiet, 0);
    out.sp = to_split(sh, count, a.granule);
  } else {
    out.sp = C.split_for(count, a.granule);
  }
  if (ps.tag != e + 1) {
    out.probes = C.probe_mask & ~out.quiet;
    out.chain_epoch = C.epoch;
    out.digest = C.digest();
  }
}

/// Step 1 (every thread of data CTA 0): what this collective's record will carry besides its
/// counters (read by the control CTA of e+1), and its split for the report.
template <Telemetry M>
RECCL_DEVICE void write_draft(adaptive_args const& a, control_region* R, std::uint64_t e, epoch_plan const& plan, pattern const& P) {
  lsa_view const& v = a.base.view;
  int const tid = static_cast<int>(threadIdx.x);
  record_draft& d = R->drafts[e & 1u];
  if (tid < max_vts) {
    std::uint64_t sends = 0;
    for (int p = 0; p < v.nranks; ++p) sends += P.sends_to(p) ? 1u : 0u;
    d.bytes[tid] = (M::enabled && tid < plan.sp.n_vts) ? plan.sp.count[tid] * a.unit_bytes * sends : 0;
  }
  if (tid == 32) {
    d.chain_epoch = plan.chain_epoch;
    d.digest = plan.digest;
    d.quiet = plan.quiet;
    d.probes = plan.probes;
    d.n_vts = plan.sp.n_vts;
    d.pipes = static_cast<std::uint32_t>(a.base.ctas_per_vt) * ring_warps;
  }
  cta_copy(&R->reports[e % ring_entries].rep.split, &plan.sp, sizeof(split));
}

/// The control CTA of e+1 (every thread): collective e's record (its counters and draft) into
/// every rank's inbox (flag last, release), its sample into the ring. One thread per field, one
/// thread seals (a chain of loads and stores on one thread took ~8 us).
template <Telemetry M>
RECCL_DEVICE void publish_record(adaptive_args const& a, control_region* R, std::uint64_t e) {
  lsa_view const& v = a.base.view;
  int const tid = static_cast<int>(threadIdx.x);
  counters const& acc = R->acc[e & 1u];
  record_draft const& d = R->drafts[e & 1u];
  vt_sample& smp = R->samples[e % ring_entries];
  __shared__ tele_slot slot;
  __shared__ unsigned long long t_last;
  if (tid == 0) t_last = 0;
  __syncthreads();
  int const n_vts = __ldcg(&d.n_vts);
  if (tid < max_vts) {
    // the VT's stalls: its warps' time in waits that spun, averaged over its pipelines, in quanta
    std::uint64_t const pipes = __ldcg(&d.pipes);
    std::uint64_t const quanta = __ldcg(&acc.wait_ns[tid]) / (pipes * stall_quantum_ns);
    std::uint64_t const a0 = ~static_cast<std::uint64_t>(__ldcg(&acc.t0[tid])), a1 = __ldcg(&acc.t1[tid]);
    bool const counted = M::enabled && tid < n_vts;
    std::uint64_t const st_v = counted ? quanta : 0;
    std::uint64_t const by_v = __ldcg(&d.bytes[tid]);
    slot.rec.stalls[tid] = smp.stalls[tid] = st_v;
    slot.rec.bytes[tid] = smp.bytes[tid] = by_v;
    smp.ns[tid] = (M::enabled && a1 != 0 && a1 > a0) ? a1 - a0 : 0;
    atomicMax(&t_last, static_cast<unsigned long long>(a1));
  }
  __syncthreads();
  if (tid == 33) {  // CTA 0's tail stamps, relative to this rank's last data CTA end (telemetry on)
    for (auto& t : smp.tail_ns) {
      auto const x = static_cast<std::int64_t>(__ldcg(reinterpret_cast<unsigned long long const*>(&t)));
      t = t_last != 0 && x != 0 ? x - static_cast<std::int64_t>(t_last) : 0;
    }
  }
  if (tid == 32) {
    slot.rec.epoch = __ldcg(&d.chain_epoch);
    slot.rec.rank = v.rank;
    slot.rec.n_vts = n_vts;
    slot.rec.fault_mask = __ldcg(&acc.fault_mask) | __ldcg(&d.quiet);
    slot.rec.probe_ok_mask = __ldcg(&d.probes) & ~__ldcg(&acc.probe_fail_mask);
    slot.rec.state_digest = __ldcg(&d.digest);
    slot.pad = 0;
    slot.flag = e + 1;
    smp.epoch = e;
    smp.n_vts = n_vts;
  }
  __syncthreads();
  if (tid == 0) seal(slot.rec);  // make_record's checksum, on the fields above
  __syncthreads();
  constexpr int slot_packs = static_cast<int>(sizeof(tele_slot) / 16) - 1;  // the last pack holds the flag
  for (int i = tid; i < v.nranks * slot_packs; i += cta_threads) {
    int const p = i / slot_packs, k = i % slot_packs;
    store_pack(reinterpret_cast<pack16*>(v.tele(p, static_cast<int>(e & 1u), v.rank)) + k,
               reinterpret_cast<pack16 const*>(&slot)[k]);
  }
  __syncthreads();
  if (tid < v.nranks) {
    fence_sys();  // after the barrier: covers the stores of every thread above (cumulative)
    store_release_sys(&v.tele(tid, static_cast<int>(e & 1u), v.rank)->flag, slot.flag);
  }
}

/// Polls a verdict word until it carries `tag` (its high half); its low half into `payload`.
template <class Guard>
RECCL_DEVICE bool wait_tagged(std::uint64_t const* word, std::uint32_t tag, Guard& guard, std::uint32_t& payload) {
  return spin_until(
      [&] {
        std::uint64_t const x = load_acquire_sys(word);
        payload = static_cast<std::uint32_t>(x);
        return static_cast<std::uint32_t>(x >> 32) == tag;
      },
      guard);
}

/// The control CTA's one thread of work: set_model, step, the plan of e+1 (on shared copies).
/// Returns 0 after a fatal error (recorded on the lane).
template <class A>
__device__ __noinline__ int step_chain(adaptive_args const& a, control_region* R, std::uint64_t e, int c, unsigned char* chain_s,
                                       tele_slot const* recs_s, report_entry& rep_s, plan_slot& plan_s,
                                       pending_model const& pm_s, std::uint64_t t_begin) {
  lsa_view const& v = a.base.view;
  std::uint32_t* const st = v.status();
  control<A> C;  // a local copy: the step runs ~4x slower on the shared-memory object itself
  std::memcpy(&C, chain_s, sizeof(C));
  int ok_s = 1;
  if (pm_s.seq != 0 && pm_s.seq != R->chain_model_seq[c]) {
    telemetry::cost_model_q m = pm_s.model;
    m.from_epoch = chain_epoch_from(pm_s.from_epoch, c, R->first_epoch);
    C.set_model(m);
    R->chain_model_seq[c] = pm_s.seq;
  }
  epoch_record recs[max_lsa];
  for (int r = 0; r < v.nranks; ++r) recs[r] = recs_s[r].rec;
  epoch_report rep{};
  rep.split = rep_s.rep.split;
  step_result const res = C.step(recs, v.nranks, &rep);
  if (res.st == status::mismatch || res.st == status::invalid_argument) {
    record_fatal(R, st, status::mismatch, res.rank < 0 ? v.rank : res.rank, -1);
    ok_s = 0;
  } else if (res.st == status::timeout) {  // every VT lost
    record_fatal(R, st, status::timeout, v.rank, -1);
    ok_s = 0;
  } else {
    rep.epoch = e - 1;
    rep_s.rep = rep;
    rep_s.tag = e;
    plan_s.tag = e + 2;
    plan_s.chain_epoch = C.epoch;
    plan_s.digest = C.digest();
    plan_s.probes = C.probe_mask;
    plan_s.live_mask = C.share.live_mask;
    plan_s.count = a.base.count;
    plan_s.granule = a.granule;
    plan_s.sp = C.split_for(a.base.count, a.granule);
    std::memcpy(chain_s, &C, sizeof(C));
    rep_s.step_ns = globaltimer() - t_begin;
  }
  return ok_s;
}

/// The control CTA (every thread): the record of e-1 built, sent to every rank and the counters
/// of e-1 reset; then, with every rank's record of e-1, chain[(e+1)&1] stepped -> state of e+1,
/// its plan slot, the report of e-1. Thread 0 computes on shared-memory copies.
template <class A, Telemetry M>
RECCL_DEVICE void control_step(adaptive_args const& a, control_region* R, std::uint64_t e) {
  if (e == 0) return;
  lsa_view const& v = a.base.view;
  std::uint32_t* const st = v.status();
  int const tid = static_cast<int>(threadIdx.x);
  int const c = static_cast<int>((e + 1) & 1u);  // the parity of e-1 and of e+1
  bool const stepped = e - 1 >= R->first_epoch && !(a.ablate & 1u);  // a record of this state's chains
  __shared__ alignas(16) unsigned char chain_s[chain_bytes];
  __shared__ tele_slot recs_s[max_lsa];
  __shared__ report_entry rep_s;
  __shared__ plan_slot plan_s;
  __shared__ pending_model pm_s;
  __shared__ int ok_s;
  std::uint64_t const t_begin = globaltimer();
  if (stepped) publish_record<M>(a, R, e - 1);
  __syncthreads();
  cta_zero(&R->acc[c], sizeof(counters));  // collective e+1 counts into them
  if (!stepped) return;
  if (tid == 0) ok_s = 1;
  __syncthreads();
  if (tid < v.nranks) {  // every rank's record of e-1 (its control CTA of e sends it)
    deadline_clock dl(a.base.timeout_ns);
    std::uint64_t spins = 0;
    if (!wait_at_least(&v.tele(v.rank, c, tid)->flag, e, dl, st, spins)) {
      record_fatal(R, st, status::timeout, tid, -1);
      ok_s = 0;
    }
  }
  cta_copy_cg(chain_s, R->chain[c], padded_bytes<control<A>>);
  cta_copy_cg(&pm_s, &R->model, sizeof(pending_model));
  cta_copy_cg(&rep_s.rep.split, &R->reports[(e - 1) % ring_entries].rep.split, sizeof(split));
  __syncthreads();  // the records only once every flag was seen
  if (!ok_s) return;
  for (int r = 0; r < v.nranks; ++r) cta_copy_cg(&recs_s[r], v.tele(v.rank, c, r), sizeof(tele_slot));
  __syncthreads();
  if (tid == 0) ok_s = step_chain<A>(a, R, e, c, chain_s, recs_s, rep_s, plan_s, pm_s, t_begin);
  __syncthreads();
  if (!ok_s) return;
  cta_copy(R->chain[c], chain_s, padded_bytes<control<A>>);
  cta_copy(&R->plan[c], &plan_s, sizeof(plan_slot));
  cta_copy(&R->reports[(e - 1) % ring_entries], &rep_s, sizeof(report_entry));
}

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
