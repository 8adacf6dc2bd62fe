// python/csrc/adaptive_aimd.cu -- the adaptive lane with reccl::allocator::aimd and stall telemetry.
#include <reccl/policy/allocator/aimd.hpp>

#include "adaptive_lane.cuh"

namespace reccl_torch {

std::unique_ptr<adaptive_path> make_adaptive_aimd(reccl::nvlink_communicator& c, reccl::adaptive_options const& o) {
  return std::make_unique<adaptive_lane_path<reccl::allocator::aimd, reccl::telemetry::stalls>>(c, o);
}

}  // namespace reccl_torch
