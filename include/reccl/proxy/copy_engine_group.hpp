// reccl/proxy/copy_engine_group.hpp -- N ranks of one process on the copy-engine proxy transport:
// each rank's window and flags in device memory, its per-VT work queues in mapped host memory
// (kernels push, the rank's proxy thread pops), a copy_engine_backend and a proxy thread per rank.
//
//   kernel of rank r ──push──▶ queues[r][vt] (cudaHostAlloc, mapped) ──▶ proxy thread r
//        ▲                                                                  │ cudaMemcpyAsync,
//        └──── wait: poll flags[r] (device memory) ◀──── copy engine ◀──────┘ (signals: 8-byte copies)
//
// Ranks may share a GPU (loopback: development and tests on one GPU) or sit on different GPUs of
// the machine (peer access is enabled between them). Across processes the windows would come from
// CUDA IPC handles exchanged over the communicator; that is not done yet.
//
// Lifetime: the group owns all of it; handles stay valid until the group is destroyed, which
// stops the proxies (draining what was queued) before it frees the memory. Not copyable.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <cstring>
#include <span>

#include "../error.hpp"
#include "../host/error.hpp"
#include "backend_copy_engine.hpp"
#include "proxy.hpp"
#include "transport.hpp"
#include "work_queue.hpp"

namespace reccl::proxy {

struct copy_engine_config {
  std::int32_t nranks = 2;
  std::int32_t n_vts = 1;
  std::uint64_t area_bytes = 1u << 20;    ///< one receive or send area (window_layout)
  std::uint64_t symmetric_bytes = 0;      ///< the window's symmetric region (collectives' buffers)
  std::uint32_t queue_capacity = 1024;    ///< requests per VT queue (a power of two)
  std::vector<int> devices;               ///< GPU of each rank; empty: every rank on the current GPU
  proxy_config proxy{};
  copy_engine_options backend{};         ///< how each rank's backend submits (batched by default)
  std::uint64_t push_timeout_ns = 1'000'000'000;  ///< a kernel's longest wait for room in a full queue
};

class copy_engine_group {
 public:
  explicit copy_engine_group(copy_engine_config cfg) : cfg_(std::move(cfg)), layout_{cfg_.nranks, cfg_.n_vts, cfg_.area_bytes, cfg_.symmetric_bytes} {
    if (!layout_.valid() || cfg_.area_bytes == 0 || cfg_.queue_capacity == 0 || (cfg_.queue_capacity & (cfg_.queue_capacity - 1)) != 0)
      throw reccl::error(status::invalid_argument, "copy_engine_group: bad ranks, VTs, area or queue capacity");
    int cur = 0;
    RECCL_CUDA_CHECK(cudaGetDevice(&cur));
    if (cfg_.devices.empty()) cfg_.devices.assign(static_cast<std::size_t>(cfg_.nranks), cur);
    if (static_cast<int>(cfg_.devices.size()) != cfg_.nranks)
      throw reccl::error(status::invalid_argument, "copy_engine_group: one device per rank");
    for (int a : cfg_.devices)
      for (int b : cfg_.devices) {
        if (a == b) continue;
        int ok = 0;
        RECCL_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
        if (!ok) throw reccl::error(status::invalid_argument, "copy_engine_group: no peer access between GPUs " + std::to_string(a) + " and " + std::to_string(b));
        RECCL_CUDA_CHECK(cudaSetDevice(a));
        cudaError_t const e = cudaDeviceEnablePeerAccess(b, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) RECCL_CUDA_CHECK(e);
        (void)cudaGetLastError();
      }
    ranks_.resize(static_cast<std::size_t>(cfg_.nranks));
    mem_.resize(static_cast<std::size_t>(cfg_.nranks));
    for (int r = 0; r < cfg_.nranks; ++r) {
      rank_state& s = ranks_[static_cast<std::size_t>(r)];
      RECCL_CUDA_CHECK(cudaSetDevice(cfg_.devices[static_cast<std::size_t>(r)]));
      RECCL_CUDA_CHECK(cudaMalloc(&s.window, layout_.window_bytes()));
      RECCL_CUDA_CHECK(cudaMalloc(&s.flags, sizeof(std::uint64_t) * layout_.n_flags()));
      RECCL_CUDA_CHECK(cudaMemset(s.flags, 0, sizeof(std::uint64_t) * layout_.n_flags()));
      // the queues (rings and control blocks) in one mapped block; the kernels' views of them and
      // their producer caches in device memory, so that a push reads nothing across PCIe while
      // its ring has room (see producer_cache)
      std::size_t const ring_bytes = sizeof(work_request) * cfg_.queue_capacity * static_cast<std::size_t>(cfg_.n_vts);
      std::size_t const ctl_bytes = sizeof(queue_control) * static_cast<std::size_t>(cfg_.n_vts);
      RECCL_CUDA_CHECK(cudaHostAlloc(&s.host_block, ring_bytes + ctl_bytes, cudaHostAllocMapped | cudaHostAllocPortable));
      std::memset(s.host_block, 0, ring_bytes + ctl_bytes);
      void* dev_block = nullptr;
      RECCL_CUDA_CHECK(cudaHostGetDevicePointer(&dev_block, s.host_block, 0));
      std::size_t const views_bytes = sizeof(work_queue_view) * static_cast<std::size_t>(cfg_.n_vts);
      std::size_t const caches_bytes = sizeof(producer_cache) * static_cast<std::size_t>(cfg_.n_vts);
      RECCL_CUDA_CHECK(cudaMalloc(&s.dev_block, views_bytes + caches_bytes));
      RECCL_CUDA_CHECK(cudaMemset(s.dev_block, 0, views_bytes + caches_bytes));
      auto* h = static_cast<unsigned char*>(s.host_block);
      auto* d = static_cast<unsigned char*>(dev_block);
      auto* caches = reinterpret_cast<producer_cache*>(static_cast<unsigned char*>(s.dev_block) + views_bytes);
      std::vector<work_queue_view> dev_views;
      for (int v = 0; v < cfg_.n_vts; ++v) {
        std::size_t const ro = sizeof(work_request) * cfg_.queue_capacity * static_cast<std::size_t>(v);
        std::size_t const co = ring_bytes + sizeof(queue_control) * static_cast<std::size_t>(v);
        s.views.push_back({reinterpret_cast<work_request*>(h + ro), reinterpret_cast<queue_control*>(h + co), cfg_.queue_capacity});
        dev_views.push_back({reinterpret_cast<work_request*>(d + ro), reinterpret_cast<queue_control*>(d + co), cfg_.queue_capacity,
                             caches + v});
      }
      RECCL_CUDA_CHECK(cudaMemcpy(s.dev_block, dev_views.data(), views_bytes, cudaMemcpyHostToDevice));
      s.dev_views = static_cast<work_queue_view const*>(s.dev_block);
      mem_[static_cast<std::size_t>(r)] = {static_cast<std::byte*>(s.window), layout_.window_bytes(), s.flags, layout_.n_flags(),
                                           cfg_.devices[static_cast<std::size_t>(r)]};
    }
    for (int r = 0; r < cfg_.nranks; ++r) {
      rank_state& s = ranks_[static_cast<std::size_t>(r)];
      s.backend = std::make_unique<copy_engine_backend>(r, std::span<device_memory const>(mem_), cfg_.backend);
      if (!s.backend->message().empty()) throw reccl::error(status::internal, "copy_engine_group: " + s.backend->message());
      s.runner = std::make_unique<proxy<copy_engine_backend>>(*s.backend, std::span<work_queue_view const>(s.views), cfg_.proxy);
      s.runner->start();
    }
    RECCL_CUDA_CHECK(cudaSetDevice(cur));
  }
  copy_engine_group(copy_engine_group const&) = delete;
  copy_engine_group& operator=(copy_engine_group const&) = delete;
  ~copy_engine_group() {
    for (auto& s : ranks_) s.runner.reset();  // stop: drains what was queued
    for (auto& s : ranks_) s.backend.reset();
    for (auto& s : ranks_) {
      if (s.window) cudaFree(s.window);
      if (s.flags) cudaFree(s.flags);
      if (s.host_block) cudaFreeHost(s.host_block);
      if (s.dev_block) cudaFree(s.dev_block);
    }
  }

  int nranks() const { return cfg_.nranks; }
  window_layout const& layout() const { return layout_; }
  device_memory const& memory(int rank) const { return mem_.at(static_cast<std::size_t>(rank)); }
  /// Rank `rank`'s symmetric region (layout().symmetric_bytes bytes of device memory on its GPU):
  /// buffers placed at the same offset on every rank are what the proxy collectives move.
  std::byte* symmetric(int rank) const { return memory(rank).window + layout_.symmetric_offset(); }
  /// What rank `rank`'s kernels hold (trivially copyable; pass it by value).
  transport::proxy::handle handle(int rank) const {
    rank_state const& s = ranks_.at(static_cast<std::size_t>(rank));
    transport::proxy::handle h;
    h.queues = s.dev_views;
    h.window = static_cast<std::byte*>(s.window);
    h.flags = s.flags;
    h.layout = layout_;
    h.rank = rank;
    h.push_timeout_ns = cfg_.push_timeout_ns;
    return h;
  }
  /// The host's view of rank `rank`'s queue for `vt` (a host thread may produce into it instead of
  /// the rank's kernels, never besides them: the kernels' producer cache assumes they are the
  /// queue's only producer).
  work_queue_view const& queue(int rank, int vt) const { return ranks_.at(static_cast<std::size_t>(rank)).views.at(static_cast<std::size_t>(vt)); }
  /// The first error of any rank's proxy (status::ok if none) and its message.
  status error() const {
    for (auto const& s : ranks_)
      if (s.runner && s.runner->error() != status::ok) return s.runner->error();
    return status::ok;
  }
  std::string error_message() const {
    for (auto const& s : ranks_)
      if (s.runner && s.runner->error() != status::ok) return s.runner->error_message();
    return {};
  }

 private:
  struct rank_state {
    void* window = nullptr;
    std::uint64_t* flags = nullptr;
    void* host_block = nullptr;
    void* dev_block = nullptr;  ///< the kernels' views and producer caches
    std::vector<work_queue_view> views;        ///< host pointers (the proxy)
    work_queue_view const* dev_views = nullptr;  ///< device pointers (the kernels)
    std::unique_ptr<copy_engine_backend> backend;
    std::unique_ptr<proxy<copy_engine_backend>> runner;  ///< the rank's proxy thread
  };

  copy_engine_config cfg_;
  window_layout layout_;
  std::vector<device_memory> mem_;
  std::vector<rank_state> ranks_;
};

}  // namespace reccl::proxy
