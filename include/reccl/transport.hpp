// reccl/transport.hpp -- the Transport concept: how bytes and signals reach a peer on one VT.
//
// A transport hands out a trivially copyable `handle` (what a rank's threads or a kernel's CTAs
// hold). Through it a VT writes bytes into a peer's receive area (put), reads a peer's exposed
// area (get), publishes a flag value to a peer (signal), and waits for a flag a peer published
// (wait). Every wait is bounded by a deadline and counts the spins it spent: those counts are the
// stall telemetry, and a missed deadline is how a dead VT or a lost rank is detected.
//
// Memory order: bytes put (or written locally) before signal(vt, peer, f, v) are visible to the
// peer once its wait(vt, me, f, >= v) returns ok (signal is a release, a successful wait an acquire).
#pragma once

#include <concepts>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "config.hpp"
#include "types.hpp"

namespace reccl {

/// Result of a bounded wait: its outcome and the spins it took (each spin is one unsuccessful poll).
struct wait_result {
  status st = status::ok;
  std::uint64_t spins = 0;
};

/// Flags a VT uses per peer. `ready` goes sender -> receiver (data published), `credit` goes
/// receiver -> sender (slot released).
enum class flag : std::uint8_t { ready = 0, credit = 1 };

template <class H>
concept TransportHandle =
    std::is_trivially_copyable_v<H> &&
    requires(H h, int vt, int peer, std::size_t offset, void const* src, void* dst, std::size_t bytes, flag f,
             std::uint64_t value, std::uint64_t deadline_ns) {
      h.put(vt, peer, offset, src, bytes);  ///< copy into peer's receive area for (vt, me) at offset
      h.get(vt, peer, offset, dst, bytes);  ///< copy from peer's send area for (vt, me) at offset
      h.signal(vt, peer, f, value);         ///< publish value on peer's flag f for (vt, me)
      { h.wait(vt, peer, f, value, deadline_ns) } -> std::same_as<wait_result>;  ///< until my flag f from (vt, peer) >= value
    };

/// A Transport names its handle type (what a rank's threads or a kernel's CTAs hold, trivially
/// copyable) and how many VTs it can carry. The CPU-thread and proxy transports hand out
/// TransportHandles (above); the load/store GPU transports hand kernels a device handle
/// (device/handle/memory.hpp) whose members are device functions, so a host compiler cannot check
/// them here. A transport that a collective_op runs on also names its `communicator` (host object).
template <class T>
concept Transport = requires {
  typename T::handle;
  { T::max_vts } -> std::convertible_to<int>;
} && std::is_trivially_copyable_v<typename T::handle>;

/// A Transport whose handle is a TransportHandle (checked by the host compiler).
template <class T>
concept QueueTransport = Transport<T> && TransportHandle<typename T::handle>;

}  // namespace reccl
