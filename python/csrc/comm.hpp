// python/csrc/comm.hpp -- the communicator behind reccl.torch: what the torch bindings call, with
// no CUDA kernels or torch headers in sight, so that the kernels compile once in comm.cu (nvcc)
// and the bindings in bindings.cpp (the host compiler, torch's headers).
//
// One rank of a P2P communicator (CUDA IPC windows set up over the caller's all-gather, no NCCL
// communicator), or one of N loopback ranks on one GPU driven from one process:
//   * the five collectives run on reccl::nvlink_communicator's fast-path kernels, on CUDA IPC
//     windows or, with transport "nccl", on an NCCL communicator's symmetric windows (its tuning table
//     picks the algorithm per size; RECCL_DTYPES limits the reducing kernels to int32, fp16, bf16
//     and fp32);
//   * with adaptive policies (an allocator other than "equal", or telemetry "stalls"), the
//     collectives above the one-shot sizes run on an adaptive lane instead (adaptive.hpp): the
//     message split over VTs by the allocator, from the telemetry, dead VTs masked and re-probed,
//     a report per collective;
//   * fused_add_rms_norm_all_reduce runs examples/03_fused_allreduce_rmsnorm's kernel on its own
//     reccl::p2p_communicator (bf16), when fused_max_tokens > 0.
// Every call is stream-ordered and capturable; host-side refusals throw reccl::error before
// anything is launched (buffer errors first fail the call on every rank), device-side faults are
// read by check().
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <reccl/policy/epoch.hpp>
#include <reccl/types.hpp>

namespace reccl_torch {

/// An all-gather over the ranks (reccl::proxy::rank_exchange's contract).
using exchange_fn = std::function<void(void const* mine, void* all, std::size_t bytes)>;

/// Sizes fixed at creation; equal on every rank (checked at creation).
struct options {
  /// "p2p": CUDA IPC windows exchanged over the caller's all-gather (any ranks, also ranks that
  /// share a GPU); "nccl": an NCCL communicator built over the same exchange, with the fast path on
  /// its symmetric windows (one rank per GPU: NCCL refuses two ranks on one GPU).
  std::string transport = "p2p";
  std::int32_t max_ctas = 64;             ///< largest grid of a collective (scratch grows with it)
  std::uint64_t timeout_ns = 10'000'000'000ull;  ///< every device-side wait gives up after this
  std::uint32_t fused_max_tokens = 512;   ///< rows of the fused op (0: no fused op, no memory for it)
  std::uint32_t fused_max_hidden = 8192;  ///< its largest hidden size (a multiple of 256)
  std::string allocator = "equal";        ///< equal, proportional, texcp or aimd
  std::string telemetry = "none";         ///< none or stalls (every allocator but equal needs stalls)
  std::int32_t vts = 8;                   ///< VTs of the adaptive lane
};

/// Whether these options ask for an adaptive lane (anything but allocator "equal" with telemetry
/// "none"); throws reccl::error(invalid_argument) for names this build does not have.
bool wants_adaptive(options const& o);

/// Device memory one rank's communicator holds on its GPU with these options (peer mappings not
/// counted), before any buffer from allocate().
std::uint64_t memory_bound(int nranks, options const& o);

class comm {
 public:
  /// P2P rank `rank` of `nranks` on the current CUDA device; collective over `exchange`.
  static std::unique_ptr<comm> create(int rank, int nranks, exchange_fn exchange, options const& o);
  /// `nranks` loopback ranks on `device`, one process; each rank's calls go on its own stream.
  static std::vector<std::unique_ptr<comm>> create_loopback(int nranks, int device, options const& o);

  ~comm();
  comm(comm const&) = delete;
  comm& operator=(comm const&) = delete;

  int rank() const;
  int size() const;
  int device() const;
  bool loopback() const;

  // count: elements (all_reduce: per rank; reduce_scatter: output elements; all_gather: input
  // elements; all_to_all: per pair), as reccl::nvlink_communicator's API.
  void all_reduce(void const* in, void* out, std::size_t count, reccl::dtype t, reccl::redop op, cudaStream_t s);
  void reduce_scatter(void const* in, void* out, std::size_t count, reccl::dtype t, reccl::redop op, cudaStream_t s);
  void all_gather(void const* in, void* out, std::size_t count, reccl::dtype t, cudaStream_t s);
  void broadcast(void const* in, void* out, std::size_t count, reccl::dtype t, int root, cudaStream_t s);
  void all_to_all(void const* in, void* out, std::size_t count, reccl::dtype t, cudaStream_t s);

  /// bf16: residual_out = bf16(bf16(sum over ranks of x) + residual); out = rmsnorm(residual_out) * weight.
  void fused_add_rms_norm_all_reduce(void const* x, void const* residual, void const* weight, void* residual_out,
                                     void* out, std::uint32_t tokens, std::uint32_t hidden, float eps, cudaStream_t s);
  std::uint32_t fused_max_tokens() const;
  std::uint32_t fused_max_hidden() const;

  /// Registered memory (the zero-copy path): collective, same size and order on every rank.
  void* allocate(std::size_t bytes);
  void free(void* p);  ///< collective
  bool is_registered(void const* p, std::size_t bytes) const;

  std::uint64_t memory_bytes() const;

  // ---- the adaptive lane (only with adaptive policies; otherwise these throw)
  bool adaptive() const;
  /// Collectives at most this many bytes (nccl-tests' message size) stay on the one-shot fast path.
  std::uint64_t adaptive_min_bytes(reccl::dtype t, bool reduces) const;
  /// Index of the next adaptive collective; the report of collective e is written when e+1 runs.
  std::uint64_t adaptive_epoch() const;
  std::uint64_t recovered() const;
  /// Reports of adaptive collectives [from, to) that are written and still held (the last 256).
  std::vector<reccl::epoch_report> reports(std::uint64_t from, std::uint64_t to) const;
  /// Throws reccl::error for a fault recorded on the device (timeout, mismatch, a peer's
  /// rejection), naming the rank. Reads device memory (synchronous with respect to the host).
  void check() const;

  /// Collective teardown over the exchange; afterwards every call throws. A communicator destroyed
  /// without close() releases its memory without waiting for its peers.
  void close();
  bool closed() const;

 private:
  struct impl;
  explicit comm(std::unique_ptr<impl> p);
  std::unique_ptr<impl> p_;
};

/// Host microseconds per launch of an empty kernel (cudaLaunchKernelEx, one CTA) on a stream of
/// `device`, over `calls` launches: the floor under any operator's eager host time (benchmarks).
double empty_launch_us(int device, int calls);

}  // namespace reccl_torch
