// reccl/policy/telemetry/stall_counter.hpp -- per-VT stall and byte counters (PReCCL's signal).
//
//   VT i:  sender ──data──▶ FIFO slots ──▶ receiver
//                 ◀─credit──
//          FIFO full: the sender waits; each unit of waiting is a stall ──▶ stall_counts[i] += stalls
//          (the transport defines the unit: one failed poll of a spin loop, or, on the CPU engine,
//          one poll quantum of waiting time, waits for data included by default)
//          each finished chunk                                         ──▶ byte_counts[i]  += bytes
//
// The stall count covers every hop of the VT's path (NVLink, PCIe, NIC, switch): whichever one is
// slow, the FIFO fills and the sender waits. It costs one add per wait. Fixed arrays, no atomics:
// each counter set has one writer (one CTA, one worker thread); combine sets with merge().
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "telemetry.hpp"

namespace reccl::telemetry {

/// Stall and byte counters per VT, as used by the epoch record and the cost model.
struct stalls {
  static constexpr bool enabled = true;
  std::uint64_t stall_counts[max_vts] = {};
  std::uint64_t byte_counts[max_vts] = {};

  RECCL_HOST_DEVICE constexpr void add_stalls(int vt, std::uint64_t n) {
    if (static_cast<unsigned>(vt) < static_cast<unsigned>(max_vts)) stall_counts[vt] += n;
  }
  RECCL_HOST_DEVICE constexpr void add_bytes(int vt, std::uint64_t n) {
    if (static_cast<unsigned>(vt) < static_cast<unsigned>(max_vts)) byte_counts[vt] += n;
  }
  RECCL_HOST_DEVICE constexpr void merge(stalls const& o) {
    for (int i = 0; i < max_vts; ++i) {
      stall_counts[i] += o.stall_counts[i];
      byte_counts[i] += o.byte_counts[i];
    }
  }
  RECCL_HOST_DEVICE constexpr void reset() {
    for (int i = 0; i < max_vts; ++i) stall_counts[i] = byte_counts[i] = 0;
  }
  RECCL_HOST_DEVICE constexpr std::uint64_t stall_count(int vt) const {
    return static_cast<unsigned>(vt) < static_cast<unsigned>(max_vts) ? stall_counts[vt] : 0;
  }
  RECCL_HOST_DEVICE constexpr std::uint64_t byte_count(int vt) const {
    return static_cast<unsigned>(vt) < static_cast<unsigned>(max_vts) ? byte_counts[vt] : 0;
  }
};

}  // namespace reccl::telemetry
