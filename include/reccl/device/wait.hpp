// reccl/device/wait.hpp -- the device guards of the one guarded wait (spin_until.hpp): the lazy
// deadline, the sticky status word a wait reports into, and the guards plain kernels use.
//
// `spin_until(poll, guard, spins)` polls until `poll()` returns true, counts the polls that failed
// (stall telemetry), and every `Guard::period` polls asks the guard whether to give up. The guard
// decides what ends a wait early and what that means: a deadline recorded as a timeout on the lane
// (`lane_guard`), a VT fault the adaptive loop recovers from (device/adaptive/hooks.hpp), a fault
// word naming the peer and VT (handle/memory.hpp), or an abort raised by another warp or rank.
#pragma once

#include <cstdint>

#include "../types.hpp"
#include "primitives.hpp"
#include "spin_until.hpp"

namespace reccl::device {

/// Record `s` as the lane's error unless an earlier error is already recorded (the first wins).
RECCL_DEVICE void raise_status(std::uint32_t* word, status s) { atomicCAS(word, 0u, static_cast<std::uint32_t>(s)); }

RECCL_DEVICE std::uint32_t read_status(std::uint32_t const* word) { return *static_cast<volatile std::uint32_t const*>(word); }

/// Record `s` as the lane's error (the first wins) and, when this call's error is the one recorded
/// and the peer is known (peer >= 0), 1 + that peer two words after the status word
/// (lsa_view::peer_of_error): the rank a timed-out wait waited for, or whose call differed.
RECCL_DEVICE void raise_status(std::uint32_t* word, status s, int peer) {
  if (atomicCAS(word, 0u, static_cast<std::uint32_t>(s)) == 0u && peer >= 0)
    atomicExch(word + 2, static_cast<std::uint32_t>(peer) + 1u);
}

/// How often (in polls) a spinning thread looks at the clock and the status word.
inline constexpr std::uint32_t deadline_check_period = 256;

/// A thread's deadline, started lazily: the clock is first read when a wait has already spun for a
/// while, so the fast path of a collective never reads %globaltimer. A wait therefore gives up at
/// most `timeout` after it first had to spin.
struct deadline_clock {
  std::uint64_t timeout = 0;
  std::uint64_t end = 0;
  RECCL_DEVICE explicit deadline_clock(std::uint64_t timeout_ns) : timeout(timeout_ns) {}
  RECCL_DEVICE bool expired() {
    std::uint64_t const t = globaltimer();
    if (end == 0) end = t + timeout;
    return t > end;
  }
};

/// The plainest guard: give up at the deadline (nothing is recorded).
struct deadline_guard {
  deadline_clock clock;
  static constexpr std::uint32_t period = deadline_check_period;
  RECCL_DEVICE void begin() {}
  RECCL_DEVICE bool give_up() { return clock.expired(); }
};

/// The rule of every plain kernel: stop when the CTA aborted (another warp failed), when the lane
/// holds an error raised elsewhere (by this rank or, through shared memory, by a peer), or at the
/// lane's deadline, which it records as status::timeout (sticky: the lane is failed). The adaptive
/// kernels use guards that end a wait as a VT fault instead (device/adaptive/hooks.hpp).
struct lane_guard {
  deadline_clock* clock = nullptr;
  std::uint32_t* status_word = nullptr;
  int const* cta_abort = nullptr;  ///< optional: a shared-memory flag set by a failed warp of the CTA
  int peer = -1;                   ///< the rank the current wait waits for, when known (named on timeout)
  static constexpr std::uint32_t period = deadline_check_period;
  RECCL_DEVICE void begin() {}  ///< the lane's deadline spans every wait of the call
  RECCL_DEVICE bool give_up() const {
    if (cta_abort != nullptr && *static_cast<volatile int const*>(cta_abort)) return true;
    if (read_status(status_word) != 0) return true;
    if (clock->expired()) {
      raise_status(status_word, status::timeout, peer);
      return true;
    }
    return false;
  }
};

/// Tell a guard which peer the next wait waits for (guards without a peer ignore it).
template <class Guard>
RECCL_DEVICE void waiting_for(Guard& g, int peer) {
  if constexpr (requires { g.peer = peer; }) g.peer = peer;
}
/// The peer a guard's current wait waits for, or -1.
template <class Guard>
RECCL_DEVICE int peer_of(Guard const& g) {
  if constexpr (requires { g.peer; }) return g.peer;
  else return -1;
}

}  // namespace reccl::device
