// reccl/host/p2p_nccl.hpp -- the load/store handle (device::memory_handle) over NCCL symmetric
// windows: one window per rank from ncclMemAlloc, registered with NCCL_WIN_COLL_SYMMETRIC, its LSA
// pointers resolved on the device, then adopted by a p2p_communicator. The schedule agent, the
// composed collectives on transport::p2p and user kernels run on it unchanged.
//
//   ncclComm_t nc = ...;                                   // one rank per GPU, one node
//   auto comm = reccl::create_p2p_on_nccl(nc);             // collective over nc's ranks
//   all_reduce_t::run(comm, send, recv, count, reccl::redop::sum, stream);
//
// Needs NCCL >= 2.28.3 with symmetric-memory support (every rank in one LSA team: one node, CUDA
// P2P between all GPUs); otherwise creation throws NCCL's message, with no fallback. Every rank
// calls it with an equal configuration (the window size follows from it; NCCL's registration
// fails when sizes differ). Destroy the communicator (every copy) before the NCCL communicator:
// the window is deregistered and freed then. NCCL refuses two ranks on one GPU, so on a single
// GPU the same handle runs over CUDA IPC windows or loopback memory (host/p2p.hpp) instead.
#pragma once

#include <cuda_runtime.h>
#include <nccl.h>

#include <memory>
#include <string>
#include <vector>

#include "error.hpp"
#include "nccl.hpp"
#include "nvlink/setup_kernels.hpp"
#include "p2p.hpp"

namespace reccl {

namespace detail {

/// One rank's NCCL symmetric window and the device communicator that probed it, released in
/// reverse order of creation (destructor: failures are reported on stderr, never thrown).
struct nccl_symmetric_window {
  ncclComm_t comm = nullptr;
  int dev = 0;
  void* base = nullptr;
  ncclWindow_t win = nullptr;
  ncclDevComm devcomm{};
  bool devcomm_valid = false;

  nccl_symmetric_window() = default;
  nccl_symmetric_window(nccl_symmetric_window const&) = delete;
  nccl_symmetric_window& operator=(nccl_symmetric_window const&) = delete;
  ~nccl_symmetric_window() {
    if (comm == nullptr) return;
    int prev = -1;
    if (!RECCL_CUDA_REPORT(cudaGetDevice(&prev))) prev = -1;
    RECCL_CUDA_REPORT(cudaSetDevice(dev));
    RECCL_CUDA_REPORT(cudaDeviceSynchronize());  // no kernel of this rank still uses the window
    if (devcomm_valid) RECCL_NCCL_REPORT(ncclDevCommDestroy(comm, &devcomm));
    if (win != nullptr) RECCL_NCCL_REPORT(ncclCommWindowDeregister(comm, win));
    if (base != nullptr) RECCL_NCCL_REPORT(ncclMemFree(base));
    if (prev >= 0) RECCL_CUDA_REPORT(cudaSetDevice(prev));
  }
};

}  // namespace detail

/// A p2p_communicator for this rank of `comm` whose windows are NCCL symmetric windows (see the
/// file comment). Collective over `comm`'s ranks; leaves `comm`'s device current.
inline p2p_communicator create_p2p_on_nccl(ncclComm_t comm, p2p_config const& cfg = {}) {
  if (comm == nullptr) throw error(status::invalid_argument, "create_p2p_on_nccl: null NCCL communicator");
  detail::require_matching_nccl();
  int n = 0, rank = 0, dev = 0;
  RECCL_NCCL_CHECK(comm, ncclCommCount(comm, &n));
  RECCL_NCCL_CHECK(comm, ncclCommUserRank(comm, &rank));
  RECCL_NCCL_CHECK(comm, ncclCommCuDevice(comm, &dev));
  RECCL_CUDA_CHECK(cudaSetDevice(dev));
  std::uint64_t const bytes = p2p_communicator::window_bytes(n, cfg);  // throws on a bad configuration
  auto w = std::make_shared<detail::nccl_symmetric_window>();
  w->comm = comm;
  w->dev = dev;
  RECCL_NCCL_CHECK(comm, ncclMemAlloc(&w->base, bytes));
  RECCL_CUDA_CHECK(cudaMemset(w->base, 0, bytes));
  RECCL_CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before the collective registration below
  RECCL_NCCL_CHECK(comm, ncclCommWindowRegister(comm, w->base, bytes, &w->win, NCCL_WIN_COLL_SYMMETRIC));
  if (w->win == nullptr) throw error(status::invalid_argument, "ncclCommWindowRegister produced no window (no symmetric-memory support)", rank);
  ncclDevCommRequirements reqs = detail::empty_requirements();
  ncclResult_t const r = ncclDevCommCreate(comm, &reqs, &w->devcomm);
  if (r != ncclSuccess)
    throw error(status::invalid_argument,
                "ncclDevCommCreate failed (no symmetric-memory support: all GPUs must be CUDA-P2P connected on one node): " +
                    detail::nccl_message(r, comm),
                rank);
  w->devcomm_valid = true;
  if (w->devcomm.lsaSize != n || w->devcomm.lsaRank != rank)
    throw error(status::invalid_argument, "create_p2p_on_nccl: every rank must be in one LSA team (one node, CUDA P2P): lsaSize=" +
                                              std::to_string(w->devcomm.lsaSize) + ", ranks=" + std::to_string(n),
                rank);
  // every rank's window as this GPU reaches it
  void** d = nullptr;
  RECCL_CUDA_CHECK(cudaMalloc(&d, sizeof(void*) * device::max_lsa));
  detail::resolve_lsa_kernel<<<1, 32>>>(w->win, n, d);
  cudaError_t const launched = cudaGetLastError();
  std::vector<void*> windows(static_cast<std::size_t>(n), nullptr);
  cudaError_t const copied =
      launched == cudaSuccess ? cudaMemcpy(windows.data(), d, sizeof(void*) * windows.size(), cudaMemcpyDeviceToHost) : cudaSuccess;
  cudaError_t const freed = cudaFree(d);  // before any throw, so that d never leaks
  detail::check_cuda(launched, "resolve_lsa_kernel<<<1, 32>>>");
  detail::check_cuda(copied, "cudaMemcpy(LSA pointers)");
  detail::check_cuda(freed, "cudaFree(LSA pointer staging)");
  return p2p_communicator::adopt(rank, windows, std::move(w), cfg);
}

}  // namespace reccl
