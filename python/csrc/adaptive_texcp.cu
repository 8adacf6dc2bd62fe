// python/csrc/adaptive_texcp.cu -- the adaptive lane with reccl::allocator::texcp and stall telemetry.
#include <reccl/policy/allocator/texcp.hpp>

#include "adaptive_lane.cuh"

namespace reccl_torch {

std::unique_ptr<adaptive_path> make_adaptive_texcp(reccl::nvlink_communicator& c, reccl::adaptive_options const& o) {
  return std::make_unique<adaptive_lane_path<reccl::allocator::texcp, reccl::telemetry::stalls>>(c, o);
}

}  // namespace reccl_torch
