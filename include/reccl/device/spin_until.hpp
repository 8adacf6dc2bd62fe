// reccl/device/spin_until.hpp -- the one guarded wait: poll until a condition holds or a guard gives
// up. Every spinning wait in reccl is this loop: the kernels' flag, barrier, Lamport, LL, ring and
// verdict waits (through device/wait.hpp's guards), a user kernel's waits through a device handle,
// and the proxy queue's producer waits (proxy/work_queue.hpp), which run on the host as well as in
// kernels -- hence host and device here, and nothing but config.hpp included.
//
// Memory order: spin_until adds none. `poll()` performs the acquire (e.g. ld.acquire.sys of a flag)
// whose success makes the writer's earlier stores visible to the polling thread.
#pragma once

#include <concepts>
#include <cstdint>

#include "../config.hpp"

namespace reccl::device {

/// What ends a spinning wait without its condition. `begin()` is called when a wait starts,
/// `give_up()` every `period` failed polls; true stops the wait (spin_until then returns false).
template <class G>
concept WaitGuard = requires(G g) {
  { G::period } -> std::convertible_to<std::uint32_t>;
  g.begin();
  { g.give_up() } -> std::convertible_to<bool>;
};

/// The wait: poll until `poll()` is true (returns true) or the guard gives up (returns false).
/// `spins` is incremented once per failed poll.
template <class Poll, WaitGuard Guard>
RECCL_HOST_DEVICE bool spin_until(Poll&& poll, Guard& guard, std::uint64_t& spins) {
  guard.begin();
  for (std::uint32_t k = 1;; ++k) {
    if (poll()) return true;
    ++spins;
    if (k % Guard::period == 0 && guard.give_up()) return false;
  }
}
template <class Poll, WaitGuard Guard>
RECCL_HOST_DEVICE bool spin_until(Poll&& poll, Guard& guard) {
  std::uint64_t spins = 0;
  return spin_until(static_cast<Poll&&>(poll), guard, spins);
}

}  // namespace reccl::device
