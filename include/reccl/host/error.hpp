// reccl/host/error.hpp -- reccl::error (reccl/error.hpp) plus the check that turns a failed CUDA
// call into one, with CUDA's own message.
#pragma once

#include <cuda_runtime.h>

#include <string>

#include "../error.hpp"

namespace reccl::detail {
inline void check_cuda(cudaError_t e, char const* what) {
  if (e != cudaSuccess) throw error(status::internal, std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace reccl::detail

/// Throw reccl::error with CUDA's message if `expr` fails.
#define RECCL_CUDA_CHECK(expr) ::reccl::detail::check_cuda((expr), #expr)
