// python/csrc/adaptive_equal.cu -- the adaptive lane with reccl::allocator::equal and stall telemetry.
#include <reccl/policy/allocator/equal.hpp>

#include "adaptive_lane.cuh"

namespace reccl_torch {

std::unique_ptr<adaptive_path> make_adaptive_equal(reccl::nvlink_communicator& c, reccl::adaptive_options const& o) {
  return std::make_unique<adaptive_lane_path<reccl::allocator::equal, reccl::telemetry::stalls>>(c, o);
}

}  // namespace reccl_torch
