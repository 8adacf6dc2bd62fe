// examples/common/check.hpp -- what the GPU examples share: a CUDA or NCCL call that must succeed,
// or the example exits (status 1) with the call, where it was made and the library's message.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>

/// Exit with CUDA's message if `x` (a cudaError_t expression) fails.
#define CK(x)                                                                                       \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

/// Exit with NCCL's message if `x` (an ncclResult_t expression) fails.
#define NK(x)                                                                                       \
  do {                                                                                              \
    ncclResult_t r_ = (x);                                                                          \
    if (r_ != ncclSuccess) {                                                                        \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, ncclGetErrorString(r_));       \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)
