// reccl/policy/telemetry/none.hpp -- no telemetry: every counter call compiles to nothing.
//
//   add_stalls / add_bytes ──▶ (nothing)      stall_count / byte_count ──▶ 0
//
// For small collectives (below the size where re-splitting pays off) and for engines that run a
// fixed split. An empty struct: it costs neither registers nor shared memory.
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "telemetry.hpp"

namespace reccl::telemetry {

/// Telemetry that measures nothing; reads are always 0.
struct none {
  static constexpr bool enabled = false;
  RECCL_HOST_DEVICE constexpr void add_stalls(int, std::uint64_t) {}
  RECCL_HOST_DEVICE constexpr void add_bytes(int, std::uint64_t) {}
  RECCL_HOST_DEVICE constexpr void merge(none const&) {}
  RECCL_HOST_DEVICE constexpr void reset() {}
  RECCL_HOST_DEVICE constexpr std::uint64_t stall_count(int) const { return 0; }
  RECCL_HOST_DEVICE constexpr std::uint64_t byte_count(int) const { return 0; }
};

}  // namespace reccl::telemetry
