// reccl/device/adaptive/control_plane.hpp -- the control plane of the adaptive loop (the protocol:
// kernel.hpp's file comment): the kernel's arguments, step 1's slow path (a plan from the chain),
// the record each rank drafts, seals and sends (step 3's counters, exchanged one collective later),
// and the control CTA's step, which turns every rank's record of e-1 into the split of e+1 and the
// report of e-1. Everything here runs beside the data phase or on its rare paths; what it computes
// is the same on every rank (the same records, the same Allocator and Telemetry code).
#pragma once

#include <cstdint>
#include <cstring>

#include "../../policy/control.hpp"
#include "../../policy/telemetry/stall_counter.hpp"
#include "../../policy/telemetry/telemetry.hpp"
#include "../args.hpp"
#include "../warp_policy.hpp"
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

/// The control CTA's first warp: set_model, step, the plan of e+1 (on shared copies). Every lane
/// computes the same step (warp_exec spreads its combine and update over the lanes); lane 0 alone
/// writes the results. Returns 0 on every lane after a fatal error (recorded on the lane).
template <class A>
__device__ __noinline__ int step_chain(adaptive_args const& a, control_region* R, std::uint64_t e, int c, unsigned char* chain_s,
                                       tele_slot const* recs_s, report_entry& rep_s, plan_slot& plan_s,
                                       pending_model const& pm_s, std::uint64_t t_begin) {
  lsa_view const& v = a.base.view;
  std::uint32_t* const st = v.status();
  bool const lead = (threadIdx.x & 31u) == 0;
  control<A> C;  // a local copy: the step runs ~4x slower on the shared-memory object itself
  std::memcpy(&C, chain_s, sizeof(C));
  int ok_s = 1;
  bool const new_model = pm_s.seq != 0 && pm_s.seq != R->chain_model_seq[c];
  if (new_model) {
    telemetry::cost_model_q m = pm_s.model;
    m.from_epoch = chain_epoch_from(pm_s.from_epoch, c, R->first_epoch);
    C.set_model(m);
  }
  epoch_record recs[max_lsa];
  for (int r = 0; r < v.nranks; ++r) recs[r] = recs_s[r].rec;
  epoch_report rep{};
  rep.split = rep_s.rep.split;
  step_result const res = C.step(recs, v.nranks, &rep, warp_exec{});
  __syncwarp();  // every lane has read the shared copies before lane 0 overwrites them
  if (!lead) return res.st == status::mismatch || res.st == status::invalid_argument || res.st == status::timeout ? 0 : 1;
  if (new_model) R->chain_model_seq[c] = pm_s.seq;
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
  if (tid < 32) {  // the first warp steps (warp_exec); lane 0 writes
    int const ok = step_chain<A>(a, R, e, c, chain_s, recs_s, rep_s, plan_s, pm_s, t_begin);
    if (tid == 0) ok_s = ok;
  }
  __syncthreads();
  if (!ok_s) return;
  cta_copy(R->chain[c], chain_s, padded_bytes<control<A>>);
  cta_copy(&R->plan[c], &plan_s, sizeof(plan_slot));
  cta_copy(&R->reports[(e - 1) % ring_entries], &rep_s, sizeof(report_entry));
}

}  // namespace reccl::device::adaptive
