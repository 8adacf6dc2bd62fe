// python/csrc/adaptive.hpp -- the adaptive lane behind reccl.torch's policy names: the
// (allocator, telemetry) pair a Communicator is created with picks one compiled
// reccl::adaptive_lane<Allocator, Telemetry>, reached through this interface so that the
// communicator (comm.cu) and the bindings need not know which. One translation unit per allocator
// (adaptive_<name>.cu) instantiates its lane's kernels, so the builds compile them in parallel.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <reccl/policy/epoch.hpp>
#include <reccl/types.hpp>

namespace reccl {
class nvlink_communicator;
struct adaptive_options;
}  // namespace reccl

namespace reccl_torch {

/// One rank's adaptive lane with its policies erased: same calls and rules as reccl::adaptive_lane.
class adaptive_path {
 public:
  virtual ~adaptive_path() = default;
  virtual void all_reduce(void const* in, void* out, std::size_t count, reccl::dtype t, reccl::redop op, cudaStream_t s) = 0;
  virtual void reduce_scatter(void const* in, void* out, std::size_t count, reccl::dtype t, reccl::redop op, cudaStream_t s) = 0;
  virtual void all_gather(void const* in, void* out, std::size_t count, reccl::dtype t, cudaStream_t s) = 0;
  virtual void broadcast(void const* in, void* out, std::size_t count, reccl::dtype t, int root, cudaStream_t s) = 0;
  virtual void all_to_all(void const* in, void* out, std::size_t count, reccl::dtype t, cudaStream_t s) = 0;
  /// Index of the next adaptive collective (synchronous read).
  virtual std::uint64_t epoch() const = 0;
  /// Collectives that recovered a dead VT so far (synchronous read).
  virtual std::uint64_t recovered() const = 0;
  /// First fatal error's rank (>> 16) and VT + 1 (low 16 bits); 0 if none (synchronous read).
  virtual std::uint32_t error_info() const = 0;
  /// Reports of epochs [from, to) still in the device ring and already written (synchronous).
  virtual std::vector<reccl::epoch_report> reports(std::uint64_t from, std::uint64_t to) const = 0;
};

/// The lane of `c` for these policy names; throws reccl::error(invalid_argument) for names this
/// build does not have. Sets up the lane's control state (synchronous): every rank creates its
/// lane before any rank's first adaptive collective.
std::unique_ptr<adaptive_path> make_adaptive_path(std::string const& allocator, std::string const& telemetry,
                                                  reccl::nvlink_communicator& c, reccl::adaptive_options const& o);

/// The policy names this build has (allocator with telemetry "stalls"; "equal" + "none" is the
/// plain fast path, without an adaptive lane).
std::vector<std::string> const& adaptive_allocators();

// One per translation unit (adaptive_<name>.cu).
std::unique_ptr<adaptive_path> make_adaptive_equal(reccl::nvlink_communicator& c, reccl::adaptive_options const& o);
std::unique_ptr<adaptive_path> make_adaptive_proportional(reccl::nvlink_communicator& c, reccl::adaptive_options const& o);
std::unique_ptr<adaptive_path> make_adaptive_texcp(reccl::nvlink_communicator& c, reccl::adaptive_options const& o);
std::unique_ptr<adaptive_path> make_adaptive_aimd(reccl::nvlink_communicator& c, reccl::adaptive_options const& o);

}  // namespace reccl_torch
