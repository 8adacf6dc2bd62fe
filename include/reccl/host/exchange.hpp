// reccl/host/exchange.hpp -- a proxy::rank_exchange over an NCCL communicator: the bytes go
// through an ncclAllGather on a stream of its own, staged in device memory (NCCL moves device
// memory only), and the call returns after that stream finished.
//
// Every rank of `comm` must make the same calls, in the same order, with the same byte counts (as
// for any NCCL collective). The communicator must outlive the exchange. Not for use while the
// communicator is being captured into a CUDA graph on another thread.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "../proxy/rank_exchange.hpp"
#include "error.hpp"
#include "nccl.hpp"

namespace reccl {

inline proxy::rank_exchange nccl_exchange(ncclComm_t comm) {
  return [comm](void const* mine, void* all, std::size_t bytes) {
    int n = 0;
    detail::check_nccl(ncclCommCount(comm, &n), comm, "ncclCommCount");
    // device staging: [n * bytes] gathered, then my bytes
    std::byte* d = nullptr;
    cudaStream_t s = nullptr;
    RECCL_CUDA_CHECK(cudaMalloc(&d, bytes * static_cast<std::size_t>(n + 1) + 1));
    struct release {
      std::byte* d;
      cudaStream_t& s;
      ~release() {  // cannot throw: failures are reported on stderr
        if (s) RECCL_CUDA_REPORT(cudaStreamDestroy(s));
        RECCL_CUDA_REPORT(cudaFree(d));
      }
    } const guard{d, s};
    RECCL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    std::byte* const my = d + bytes * static_cast<std::size_t>(n);
    RECCL_CUDA_CHECK(cudaMemcpyAsync(my, mine, bytes, cudaMemcpyHostToDevice, s));
    detail::check_nccl(ncclAllGather(my, d, bytes, ncclUint8, comm, s), comm, "ncclAllGather (rank exchange)");
    RECCL_CUDA_CHECK(cudaMemcpyAsync(all, d, bytes * static_cast<std::size_t>(n), cudaMemcpyDeviceToHost, s));
    RECCL_CUDA_CHECK(cudaStreamSynchronize(s));
  };
}

}  // namespace reccl
