// reccl/host/nvlink/config.hpp -- what an NVLink-path communicator fixes at creation
// (nvlink_config) and what each call may choose (launch_options), with the creation-time check.
#pragma once

#include <cstdint>
#include <string>

#include "../../device/launch.hpp"
#include "../../policy/split.hpp"
#include "../../types.hpp"
#include "../error.hpp"
#include "../tuning.hpp"

namespace reccl {

/// Sizes and behaviour fixed at creation. Every field except `timeout_ns` and `pdl` must be equal on
/// all ranks (checked by the hello handshake).
struct nvlink_config {
  std::int32_t lanes = 2;                  ///< independent flag/slot sets (concurrent streams)
  std::int32_t max_ctas = 128;             ///< largest grid of any collective (<= SMs: CTAs pair by index)
  std::int32_t one_shot_slot_bytes = 32 << 10;
  std::int32_t ring_chunk_bytes = 32 << 10;
  std::int32_t ring_depth = 4;
  // Scratch memory per lane = 2 * ranks * max_ctas * (16 + one_shot_slot_bytes)
  //                         + ranks * max_ctas * 8 * ring_depth * (16 + ring_chunk_bytes) + flags;
  // with the defaults and 2 ranks about 264 MiB per lane. Smaller values cap the largest grids and
  // chunks that the tuning table may pick (nvlink_planner::choose() clamps to them).
  std::uint64_t timeout_ns = 10'000'000'000ull;  ///< every device-side wait gives up after this
  bool pdl = true;                          ///< programmatic dependent launch
  tuning tune{};
};

/// Per-call choices; the defaults let the tuning table decide.
struct launch_options {
  algorithm algo = algorithm::automatic;
  std::int32_t lane = 0;
  std::int32_t ctas = 0;         ///< 0: from the table
  std::int32_t vts = 0;          ///< 0: from the table
  std::int32_t chunk_bytes = 0;  ///< pipelined ring chunk; 0: from the table
  split const* vt_split = nullptr;  ///< explicit byte split (an Allocator's output); sum must equal the count
};

namespace detail {

/// Throws reccl::error(invalid_argument) naming the first field outside its range.
inline void check_config(nvlink_config const& c) {
  auto bad = [](char const* what) { throw error(status::invalid_argument, std::string("nvlink_config: ") + what); };
  if (c.lanes < 1 || c.lanes > 64) bad("lanes must be in [1, 64]");
  if (c.max_ctas < 1 || c.max_ctas > 256) bad("max_ctas must be in [1, 256]");
  if (c.one_shot_slot_bytes < 16 || c.one_shot_slot_bytes % 16 != 0 ||
      c.one_shot_slot_bytes > 16 * device::cta_threads * device::one_shot_unroll)
    bad("one_shot_slot_bytes must be a multiple of 16, at most 16 * threads * unroll");
  if (c.ring_chunk_bytes < 512 || c.ring_chunk_bytes % 512 != 0) bad("ring_chunk_bytes must be a multiple of 512");
  if (c.ring_depth < 2) bad("ring_depth must be >= 2");
  if (c.timeout_ns == 0) bad("timeout_ns must be > 0");
}

}  // namespace detail
}  // namespace reccl
