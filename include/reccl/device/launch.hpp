// reccl/device/launch.hpp -- picks the kernel instantiation for (algorithm, dtype) at run time and
// launches it, stream-ordered and capturable, optionally with programmatic dependent launch.
//
// Instantiations are kept few on purpose (CI compiles every device source for sm_90 on 2 cores):
// the reduction op and the collective are run-time values inside one kernel per (engine, element
// type); collectives that only move data use a single byte-stream instantiation. A program that
// reduces only some dtypes compiles only theirs with RECCL_DTYPES (types.hpp).
#pragma once

#include <cuda_runtime.h>

#include "../types.hpp"
#include "args.hpp"
#include "engine/direct.hpp"
#include "engine/one_shot.hpp"
#include "engine/pipelined.hpp"

namespace reccl::device {

using kernel_fn = void (*)(coll_args);


/// The kernel that runs `algo` on elements of type `t` (raw bytes for collectives that do not reduce),
/// or nullptr when that combination does not exist or `t` is left out of this program's reducing
/// kernels (RECCL_DTYPES).
inline kernel_fn select_kernel(algorithm algo, collective c, dtype t) {
  bool const raw = !reduces(c);
  switch (algo) {
    case algorithm::one_shot:
      // Lamport packets for 16- and 32-bit float reductions, LL packets (data + flag) for everything else
      if (raw) return &ll_kernel<raw_byte>;
      return with_compiled_dtype<kernel_fn>(t, nullptr, [](auto e) -> kernel_fn {
        using T = typename decltype(e)::type;
        if constexpr (element<T>::is_float && sizeof(T) <= 4) return &one_shot_kernel<T>;
        else return &ll_kernel<T>;
      });
    case algorithm::pipelined:
      if (raw) return &pipelined_kernel<raw_byte>;
      return with_compiled_dtype<kernel_fn>(t, nullptr, [](auto e) -> kernel_fn {
        return &pipelined_kernel<typename decltype(e)::type>;
      });
    case algorithm::two_shot:
    case algorithm::direct:
      if (raw) return &direct_kernel<raw_byte>;
      return with_compiled_dtype<kernel_fn>(t, nullptr, [](auto e) -> kernel_fn {
        return &direct_kernel<typename decltype(e)::type>;
      });
    case algorithm::automatic: return nullptr;
  }
  return nullptr;
}

/// Launch `k` with `grid` CTAs of cta_threads on `stream`. With `pdl`, the kernel may start while
/// the previous kernel of the stream drains (it calls pdl_wait() before touching memory).
inline cudaError_t launch_kernel(kernel_fn k, int grid, coll_args const& a, cudaStream_t stream, bool pdl) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(grid));
  cfg.blockDim = dim3(cta_threads);
  cfg.dynamicSmemBytes = 0;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, k, a);
}

}  // namespace reccl::device
