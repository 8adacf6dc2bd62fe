// reccl/device/adaptive/hooks.hpp -- how the adaptive kernels' pipelines wait, count, and inject
// faults: the hooks pipe_range() (device/engine/pipelined.hpp) calls.
//
//   data phase      vt_guard: a wait that has spun vt_timeout while another live VT of this rank
//                   already finished its block ends as a *VT fault* (the VT is recovered, not the
//                   lane failed); a wait with no progress anywhere runs into the lane's deadline
//                   (status::timeout: a lost rank is an error, never a hang)
//   probe           probe_guard: a probe's wait ends (probe failed, nothing else) once every live
//                   CTA of this rank has finished and the probe has waited probe_grace longer
//   recovery        the plain lane_guard: a second loss while recovering the first is an error
//
// Fault injection is part of the hooks, so it composes with every collective the pipelined
// engine runs: `dead` drops every send of the VT (its peers' waits run into the VT deadline, as on
// a dead link); `throttle` paces the VT's receivers to a rate, so their credits come back slowly
// and the senders stall, as on a slow link. Both are keyed by the global epoch, so a CUDA graph
// replay picks them up without recapture.
#pragma once

#include <cstdint>

#include "../flags.hpp"
#include "../primitives.hpp"
#include "../transport/lsa.hpp"
#include "state.hpp"

namespace reccl::device::adaptive {

RECCL_DEVICE unsigned int volatile_load(unsigned int const* p) { return *static_cast<volatile unsigned int const*>(p); }

/// What one CTA's hooks share, in shared memory: the hooks themselves then hold a pointer and a
/// deadline, so the pipeline's inner loops keep about the registers of the plain kernel. Trivial
/// (a __shared__ variable): thread 0 fills it.
struct adaptive_ctx {
  std::uint64_t lane_timeout_ns;   ///< the lane's deadline ...
  std::uint64_t lane_end;          ///< ... started by the first thread of the CTA that spun (0: not yet)
  std::uint32_t* status_word;
  int* cta_abort;
  unsigned int* live_done;         ///< this rank's live CTAs that finished their block
  unsigned int* live_ended;        ///< ... or gave up
  unsigned int live_ctas;          ///< live CTAs of this rank in this collective
  int vt_fault;                    ///< a wait gave up as a VT fault
  int probe_failed;                ///< a probe gave up
  int touched;                     ///< a receiver warp wrote part of the output
  int dead;                        ///< injected: drop every send of this VT
  int count_stalls;                ///< telemetry on: the data phase's waits add to cta_wait_ns
  unsigned long long cta_wait_ns;  ///< this CTA's time in waits that spun (added to the VT's stalls once)
  std::uint64_t const* poll_word;  ///< a word of this GPU's memory the throttle's hold polls
  std::uint64_t vt_timeout_ns, probe_grace_ns;
  std::uint64_t warp_bytes_per_us;  ///< injected throttle: a warp pair's share of the VT's rate (0: none)
  std::uint64_t pace_start[ring_warps], paced_bytes[ring_warps];

  RECCL_DEVICE bool stopped() const {
    return *static_cast<volatile int const*>(cta_abort) || read_status(status_word) != 0;
  }
  /// The lane's deadline passed: record the timeout (a lost rank; the lane fails).
  RECCL_DEVICE bool lane_expired() {
    std::uint64_t const t = globaltimer();
    volatile std::uint64_t* const e = &lane_end;
    if (*e == 0) *e = t + lane_timeout_ns;
    if (t <= *e) return false;
    raise_status(status_word, status::timeout);
    return true;
  }
};

/// Data phase: a wait that has spun vt_timeout while another live CTA of this rank finished its
/// block ends as a VT fault (see the file comment); with no progress anywhere, the lane deadline.
struct vt_guard {
  adaptive_ctx* cx;
  std::uint64_t vt_end = 0;
  static constexpr std::uint32_t period = deadline_check_period;
  RECCL_DEVICE void begin() { vt_end = 0; }
  RECCL_DEVICE bool give_up() {
    if (cx->stopped()) return true;
    std::uint64_t const t = globaltimer();
    if (vt_end == 0) vt_end = t + cx->vt_timeout_ns;
    if (t > vt_end && volatile_load(cx->live_done) > 0) {
      *static_cast<volatile int*>(&cx->vt_fault) = 1;
      return true;
    }
    return cx->lane_expired();
  }
};

/// Probe: the wait ends (probe failed) once every live CTA of this rank is past its data phase and
/// the probe waited probe_grace more.
struct probe_guard {
  adaptive_ctx* cx;
  std::uint64_t end = 0;
  /// A poll of local memory under load takes ~0.4 us, so 256 polls would hold a probe that
  /// cannot arrive ~100 us past the live CTAs: a probe looks at the clock every 4 polls.
  static constexpr std::uint32_t period = 4;
  RECCL_DEVICE void begin() { end = 0; }
  RECCL_DEVICE bool give_up() {
    if (cx->stopped()) return true;
    if (volatile_load(cx->live_ended) >= cx->live_ctas) {
      std::uint64_t const t = globaltimer();
      if (end == 0) end = t + cx->probe_grace_ns;
      if (t > end) {
        *static_cast<volatile int*>(&cx->probe_failed) = 1;
        return true;
      }
    }
    return cx->lane_expired();
  }
};

/// Recovery: only the lane deadline (a second loss while recovering the first is an error).
struct recovery_guard {
  adaptive_ctx* cx;
  static constexpr std::uint32_t period = deadline_check_period;
  RECCL_DEVICE void begin() {}
  RECCL_DEVICE bool give_up() { return cx->stopped() || cx->lane_expired(); }
};

/// The verdict (every CTA's verdict word of every rank): the lane deadline only; this CTA may have given up on its
/// own VT, so its abort flag does not end this wait.
struct verdict_guard {
  adaptive_ctx* cx;
  static constexpr std::uint32_t period = deadline_check_period;
  RECCL_DEVICE void begin() {}
  RECCL_DEVICE bool give_up() { return read_status(cx->status_word) != 0 || cx->lane_expired(); }
};

/// The injected condition of VT `vt` in epoch `e`: returns the throttle rate (bytes/us, 0: none)
/// and sets `dead`.
RECCL_DEVICE std::uint64_t injected(fault_table const& t, int vt, std::uint64_t e, bool& dead) {
  std::uint64_t rate = 0;
  dead = false;
  for (std::uint32_t i = 0; i < t.n && i < static_cast<std::uint32_t>(max_faults); ++i) {
    fault_spec const& f = t.f[i];
    if (f.vt != vt || e < f.from_epoch || e >= f.until_epoch) continue;
    if (f.kind == 2) dead = true;
    if (f.kind == 1 && f.bytes_per_us > 0 && (rate == 0 || f.bytes_per_us < rate)) rate = f.bytes_per_us;
  }
  return rate;
}

/// Hooks of one thread of an adaptive pipeline (pipe_range's hook interface). Guard is vt_guard,
/// probe_guard or recovery_guard. `count` says whether this pipeline's stalls and writes count
/// (data phase) or not (probe, recovery).
template <class Guard>
struct adaptive_hooks {
  Guard g;
  bool count = false;
  std::uint64_t wait_ns = 0;  ///< this thread's time in waits that spun

  RECCL_DEVICE Guard& guard() { return g; }
  RECCL_DEVICE bool sender_dead() const { return g.cx->dead; }
  /// Throttle: hold the receiver until its chunks so far, plus this one, fit the paced rate, as
  /// if the data arrived that late: each round of the hold polls a word of this GPU's memory, like
  /// a wait for data, and counts as a stall spin. A paced wait is the link being slow, not dead: it
  /// ends by time, or when the CTA aborts.
  RECCL_DEVICE bool pace(std::uint64_t /*chunk*/, std::uint64_t chunk_bytes, std::uint64_t& spins) {
    adaptive_ctx& cx = *g.cx;
    if (cx.warp_bytes_per_us == 0) return true;
    int const w = static_cast<int>(threadIdx.x / 32) % ring_warps;
    std::uint64_t const now = globaltimer();
    if (cx.pace_start[w] == 0) cx.pace_start[w] = now;
    cx.paced_bytes[w] += chunk_bytes;
    std::uint64_t const due = cx.pace_start[w] + cx.paced_bytes[w] * 1000u / cx.warp_bytes_per_us;
    while (globaltimer() < due) {
      (void)load_acquire_sys(cx.poll_word);
      if (*static_cast<volatile int const*>(cx.cta_abort)) return false;
      ++spins;
    }
    return true;
  }
  RECCL_DEVICE std::uint64_t wait_clock() const { return count && g.cx->count_stalls ? globaltimer() : 0; }
  RECCL_DEVICE void waited(std::uint64_t t0) {
    if (t0 != 0) wait_ns += globaltimer() - t0;
  }
  RECCL_DEVICE void committed() {
    if (count) *static_cast<volatile int*>(&g.cx->touched) = 1;
  }
  /// End of a warp's pipeline (both roles): its timed waits go to the CTA's total.
  RECCL_DEVICE void sender_spins(std::uint64_t) {
    if (wait_ns != 0) atomicAdd(&g.cx->cta_wait_ns, static_cast<unsigned long long>(wait_ns));
    wait_ns = 0;
  }
  RECCL_DEVICE void receiver_spins(std::uint64_t s) { sender_spins(s); }
};

}  // namespace reccl::device::adaptive
