// reccl/config.hpp -- compiler switches, version, limits shared by host and device code.
#pragma once

#include <cstdint>

#define RECCL_VERSION_MAJOR 0
#define RECCL_VERSION_MINOR 1
#define RECCL_VERSION_PATCH 0

// RECCL_HOST_DEVICE marks policy code that both the host (CPU engine, tests, simulator) and the
// device (kernels) call. Under a host compiler it is plain `inline`, so the policy headers build
// and test without CUDA.
#if defined(__CUDACC__)
#  define RECCL_HOST_DEVICE __host__ __device__ inline
#  define RECCL_DEVICE __device__ __forceinline__
#  define RECCL_DEVICE_COMPILE 1
#else
#  define RECCL_HOST_DEVICE inline
#  define RECCL_DEVICE inline
#  define RECCL_DEVICE_COMPILE 0
#endif

// RECCL_EXEC_CHECK_DISABLE before a host-and-device template whose arguments may bring
// device-only code (control::step with device::warp_exec): each instantiation is then checked only
// where it is called.
#if defined(__CUDACC__)
#  define RECCL_EXEC_CHECK_DISABLE _Pragma("nv_exec_check_disable")
#else
#  define RECCL_EXEC_CHECK_DISABLE
#endif

// RECCL_UNROLL before a loop over a compile-time trip count (max_vts) in policy code: on the device
// the loop is unrolled, so arrays indexed by its counter stay in registers instead of the thread's
// local memory. Used where it measured faster (combine); in the allocators the unrolled code ran
// slower than the rolled one on one thread (bench/NOTES.md 56-57). Nothing on the host.
#if defined(__CUDA_ARCH__)
#  define RECCL_UNROLL _Pragma("unroll")
#else
#  define RECCL_UNROLL
#endif

namespace reccl {

/// Most virtual topologies (VTs, channels) one collective may use. Fixed so that splits, telemetry
/// records and epoch records are plain fixed-size structs that kernels take by value.
inline constexpr int max_vts = 16;

/// Most ranks a schedule or epoch record describes.
inline constexpr int max_ranks = 64;

}  // namespace reccl
