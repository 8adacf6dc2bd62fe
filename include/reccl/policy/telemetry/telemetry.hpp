// reccl/policy/telemetry/telemetry.hpp -- the Telemetry concept: what each VT measures in a collective.
//
//   sender of VT i waits for FIFO credit ──▶ add_stalls(i, spins)
//   VT i finishes a chunk of n bytes     ──▶ add_bytes(i, n)
//   end of the collective                ──▶ stall_count(i), byte_count(i) go into the epoch record
//
// A telemetry policy is a small, trivially copyable counter set that kernels take by value (or
// hold in shared memory) and the CPU engine holds per worker. `T::enabled` is a constant: when it
// is false every call is an empty inline function and engines can skip the whole telemetry path
// with `if constexpr (T::enabled)`.
#pragma once

#include <concepts>
#include <cstdint>
#include <type_traits>

#include "../../config.hpp"

namespace reccl {

/// Telemetry: a compile-time `enabled` flag, counters per VT that engines add to, read back and
/// clear. Counter calls with a VT outside [0, max_vts) are ignored.
template <class T>
concept Telemetry = std::is_trivially_copyable_v<T> && std::default_initializable<T> &&
                    requires { typename std::bool_constant<T::enabled>; } &&
                    requires(T t, T const ct, int vt, std::uint64_t n) {
                      t.add_stalls(vt, n);  ///< the sender of `vt` spent n polls waiting for credit
                      t.add_bytes(vt, n);   ///< `vt` moved n more bytes
                      t.merge(ct);          ///< add another counter set (another CTA / worker thread)
                      t.reset();
                      { ct.stall_count(vt) } -> std::same_as<std::uint64_t>;
                      { ct.byte_count(vt) } -> std::same_as<std::uint64_t>;
                    };

}  // namespace reccl
