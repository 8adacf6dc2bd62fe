// reccl/host/error.hpp -- reccl::error (reccl/error.hpp) plus the check that turns a failed CUDA
// call into one, with CUDA's own message, and its counterpart for code that cannot throw.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <string>

#include "../error.hpp"

namespace reccl::detail {
inline void check_cuda(cudaError_t e, char const* what) {
  if (e != cudaSuccess) throw error(status::internal, std::string(what) + ": " + cudaGetErrorString(e));
}

/// For cleanup that cannot throw (destructors, paths already unwinding another error): a failed call
/// is written to stderr instead, and CUDA's last-error state is cleared so that a later, unrelated
/// check does not report it. Returns whether `e` is cudaSuccess.
inline bool report_cuda(cudaError_t e, char const* what) noexcept {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "reccl: warning: %s failed during cleanup: %s\n", what, cudaGetErrorString(e));
  (void)cudaGetLastError();  // clears the state; it returns e (or a sticky error) again
  return false;
}
}  // namespace reccl::detail

/// Throw reccl::error with CUDA's message if `expr` fails.
#define RECCL_CUDA_CHECK(expr) ::reccl::detail::check_cuda((expr), #expr)
/// Report (on stderr, never a throw) if `expr` fails; see report_cuda. For destructors and cleanup.
#define RECCL_CUDA_REPORT(expr) ::reccl::detail::report_cuda((expr), #expr)
