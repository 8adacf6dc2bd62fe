// python/csrc/adaptive_proportional.cu -- the adaptive lane with reccl::allocator::proportional and stall telemetry.
#include <reccl/policy/allocator/proportional.hpp>

#include "adaptive_lane.cuh"

namespace reccl_torch {

std::unique_ptr<adaptive_path> make_adaptive_proportional(reccl::nvlink_communicator& c, reccl::adaptive_options const& o) {
  return std::make_unique<adaptive_lane_path<reccl::allocator::proportional, reccl::telemetry::stalls>>(c, o);
}

}  // namespace reccl_torch
