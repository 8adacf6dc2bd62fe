// reccl/host/launch.hpp -- launching kernels that spin-wait on other ranks.
//
// A kernel that waits for another rank's kernel (every reccl collective, and a user's kernel built
// on a device handle) makes progress only if the CTAs it waits for run at the same time. On one GPU
// shared by loopback ranks of one process, every CTA of every rank's grid must therefore be
// resident at once: grid x ranks <= (CTAs one SM holds of this kernel) x SMs. A grid larger than
// that does not fail; it waits for itself until the deadline. These helpers check the bound before
// the launch and say what to change. The bound is necessary, not sufficient: other work on the GPU
// (another kernel running beside, MPS limits) can still keep CTAs off the SMs. Processes that share
// one GPU without MPS take turns on it (time slices), so each process's grid counts alone.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>

#include "../error.hpp"
#include "error.hpp"

namespace reccl {

/// Loads `kernel`'s module on the current GPU now, if CUDA loads modules lazily (the default since
/// CUDA 12.2). A lazy load happens at a kernel's first launch and waits for the kernels already
/// running on the GPU; when one of those spins until this thread's next call (loopback ranks issue
/// their calls from one thread), it waits until that kernel's deadline. So every kernel a call may
/// launch is loaded before the call launches its first. Cached per (kernel, device): after the
/// first call this is a lookup.
inline void load_kernel(void const* kernel) {
  int dev = 0;
  RECCL_CUDA_CHECK(cudaGetDevice(&dev));
  static std::mutex m;
  static std::map<std::pair<void const*, int>, bool> loaded;
  std::lock_guard<std::mutex> lock(m);
  auto& done = loaded[{kernel, dev}];
  if (done) return;
  cudaFuncAttributes fa{};
  RECCL_CUDA_CHECK(cudaFuncGetAttributes(&fa, kernel));  // loads the kernel's module on this GPU
  done = true;
}

/// How many CTAs of `kernel` (with `threads` per CTA and `smem` bytes of dynamic shared memory)
/// the current device holds at once: per SM (CUDA's occupancy calculator) times its SMs. Cached
/// per (kernel, device, threads, smem); the first call for a kernel costs a few microseconds.
inline int co_resident_capacity(void const* kernel, int threads, std::size_t smem) {
  int dev = 0;
  RECCL_CUDA_CHECK(cudaGetDevice(&dev));
  using key = std::tuple<void const*, int, int, std::size_t>;
  static std::mutex m;
  static std::map<key, int> cache;
  std::lock_guard<std::mutex> lock(m);
  auto const k = key{kernel, dev, threads, smem};
  if (auto it = cache.find(k); it != cache.end()) return it->second;
  int per_sm = 0, sms = 0;
  RECCL_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  RECCL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
  return cache[k] = per_sm * sms;
}

/// Why `grid` CTAs per rank of `kernel`, with `ranks_here` ranks on this GPU at once, cannot all be
/// resident ("" when they can).
inline std::string co_resident_problem(void const* kernel, int grid, int threads, std::size_t smem, int ranks_here) {
  int const cap = co_resident_capacity(kernel, threads, smem);
  long const need = static_cast<long>(grid) * ranks_here;
  if (need <= cap) return {};
  return std::to_string(grid) + " CTAs x " + std::to_string(ranks_here) + " ranks on this GPU = " + std::to_string(need) +
         " CTAs must be resident at once, but this GPU holds " + std::to_string(cap) + " of this kernel (" +
         std::to_string(threads) + " threads, " + std::to_string(smem) + " bytes of shared memory each): use fewer CTAs per rank";
}

/// Throws reccl::error(invalid_argument) naming `what` and the numbers when the CTAs cannot all be
/// resident at once (see co_resident_problem).
inline void require_co_resident(void const* kernel, int grid, int threads, std::size_t smem, int ranks_here, std::string const& what,
                                int rank = -1) {
  if (std::string const p = co_resident_problem(kernel, grid, threads, smem, ranks_here); !p.empty())
    throw error(status::invalid_argument, what + ": " + p, rank);
}

/// Launches `kernel<<<grid, threads, smem, stream>>>(args...)` after load_kernel and
/// require_co_resident. For
/// users' kernels on a device handle; `ranks_here` is how many ranks of this process share the GPU
/// (p2p_communicator::ranks_sharing_device()).
template <class... Params, class... Args>
void launch_co_resident(void (*kernel)(Params...), int grid, int threads, std::size_t smem, cudaStream_t stream, int ranks_here,
                        Args&&... args) {
  load_kernel(reinterpret_cast<void const*>(kernel));
  require_co_resident(reinterpret_cast<void const*>(kernel), grid, threads, smem, ranks_here, "launch_co_resident");
  kernel<<<grid, threads, smem, stream>>>(static_cast<Args&&>(args)...);
  RECCL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace reccl
