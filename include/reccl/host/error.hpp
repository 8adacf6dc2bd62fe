// reccl/host/error.hpp -- the exception the host runtime throws, carrying a reccl::status and, for
// failures inside NCCL or CUDA, their own message.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "../types.hpp"

namespace reccl {

/// A failed host call or a collective that reported an error status. `code()` says which kind;
/// `what()` says what happened, with NCCL's or CUDA's own message where one exists.
class error : public std::runtime_error {
 public:
  error(status code, std::string const& message)
      : std::runtime_error("reccl: " + std::string(name(code)) + ": " + message), code_(code) {}
  status code() const noexcept { return code_; }

 private:
  status code_;
};

namespace detail {
inline void check_cuda(cudaError_t e, char const* what) {
  if (e != cudaSuccess) throw error(status::internal, std::string(what) + ": " + cudaGetErrorString(e));
}
}  // namespace detail

}  // namespace reccl

/// Throw reccl::error with CUDA's message if `expr` fails.
#define RECCL_CUDA_CHECK(expr) ::reccl::detail::check_cuda((expr), #expr)
