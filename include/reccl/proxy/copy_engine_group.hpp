// reccl/proxy/copy_engine_group.hpp -- the ranks of the copy-engine proxy transport: each rank's
// window and flags in device memory, its per-VT work queues in mapped host memory (kernels push,
// the rank's proxy thread pops), a copy_engine_backend and a proxy thread per rank.
//
//   kernel of rank r ──push──▶ queues[r][vt] (cudaHostAlloc, mapped) ──▶ proxy thread r
//        ▲                                                                  │ cudaMemcpyAsync,
//        └──── wait: poll flags[r] (device memory) ◀──── copy engine ◀──────┘ (signals: 8-byte copies)
//
// Two layouts:
//   - every rank in this process (process_rank = -1): ranks share a GPU (loopback: development and
//     tests on one GPU) or sit on different GPUs of the machine (peer access is enabled between them);
//   - one rank per process (process_rank = r, the usual engine layout): this process holds rank r's
//     memory, queues and proxy; the other ranks' windows and flags are opened from CUDA IPC handles
//     that the ranks all-gather with `exchange` (reccl::nccl_exchange over their communicator, or
//     any rank_exchange). The processes may share a GPU or use peer GPUs.
//
// Setup in the second layout is collective: every rank constructs its group at the same time, with
// the same nranks, VTs, area, symmetric region and queue capacity. Every rank always takes part in
// both exchanges of the setup, even when its own allocation failed, so that either every rank's
// constructor returns or every rank's throws (a rank's failure or a layout that differs is named in
// the message); no rank waits for one that gave up.
//
// Lifetime: the group owns all of it; handles stay valid until the group is destroyed, which
// stops the proxies (draining what was queued) before it frees the memory. With one rank per
// process the destructor is collective too: after its proxy stopped, a barrier (no peer writes into
// this rank's memory any more), the peers' windows closed, a second barrier, then its own memory
// freed. Destroy every rank's group after the collectives on it finished. Not copyable.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../host/error.hpp"
#include "backend_copy_engine.hpp"
#include "proxy.hpp"
#include "rank_exchange.hpp"
#include "transport.hpp"
#include "work_queue.hpp"

namespace reccl::proxy {

struct copy_engine_config {
  std::int32_t nranks = 2;
  std::int32_t n_vts = 1;
  std::uint64_t area_bytes = 1u << 20;    ///< one receive or send area (window_layout)
  std::uint64_t symmetric_bytes = 0;      ///< the window's symmetric region (collectives' buffers)
  std::uint32_t queue_capacity = 1024;    ///< requests per VT queue (a power of two)
  /// GPU of each rank; empty: every rank on the current GPU. With one rank per process only
  /// devices[process_rank] is used (this process's numbering).
  std::vector<int> devices;
  proxy_config proxy{};
  copy_engine_options backend{};         ///< how each rank's backend submits (batched by default)
  std::uint64_t push_timeout_ns = 1'000'000'000;  ///< a kernel's longest wait for room in a full queue
  /// -1: every rank is in this process. r: this process holds rank r only, and `exchange`
  /// all-gathers between the ranks' processes (see the file comment).
  std::int32_t process_rank = -1;
  rank_exchange exchange{};
};

class copy_engine_group {
 public:
  explicit copy_engine_group(copy_engine_config cfg) : cfg_(std::move(cfg)), layout_{cfg_.nranks, cfg_.n_vts, cfg_.area_bytes, cfg_.symmetric_bytes} {
    if (!layout_.valid() || cfg_.area_bytes == 0 || cfg_.queue_capacity == 0 || (cfg_.queue_capacity & (cfg_.queue_capacity - 1)) != 0)
      throw reccl::error(status::invalid_argument, "copy_engine_group: bad ranks, VTs, area or queue capacity");
    if (cfg_.process_rank < -1 || cfg_.process_rank >= cfg_.nranks)
      throw reccl::error(status::invalid_argument, "copy_engine_group: process_rank outside [-1, nranks)");
    if (cfg_.process_rank >= 0 && !cfg_.exchange)
      throw reccl::error(status::invalid_argument, "copy_engine_group: one rank per process needs an exchange");
    int cur = 0;
    RECCL_CUDA_CHECK(cudaGetDevice(&cur));
    if (cfg_.devices.empty()) cfg_.devices.assign(static_cast<std::size_t>(cfg_.nranks), cur);
    if (static_cast<int>(cfg_.devices.size()) != cfg_.nranks)
      throw reccl::error(status::invalid_argument, "copy_engine_group: one device per rank");
    ranks_.resize(static_cast<std::size_t>(cfg_.nranks));
    mem_.resize(static_cast<std::size_t>(cfg_.nranks));
    try {
      if (cfg_.process_rank < 0) {
        enable_peer_access();
        for (int r = 0; r < cfg_.nranks; ++r) allocate(r);
      } else {
        open_peers();
      }
      for (int r = 0; r < cfg_.nranks; ++r)
        if (is_local(r)) start(r);
    } catch (...) {
      release(false);
      RECCL_CUDA_REPORT(cudaSetDevice(cur));  // the error in flight is what matters
      throw;
    }
    RECCL_CUDA_CHECK(cudaSetDevice(cur));
  }
  copy_engine_group(copy_engine_group const&) = delete;
  copy_engine_group& operator=(copy_engine_group const&) = delete;
  ~copy_engine_group() { release(cfg_.process_rank >= 0); }

  int nranks() const { return cfg_.nranks; }
  /// -1 if every rank is in this process, else the one rank it holds.
  int process_rank() const { return cfg_.process_rank; }
  /// Whether this process holds rank `rank` (its queues, proxy and kernels).
  bool is_local(int rank) const { return cfg_.process_rank < 0 ? rank >= 0 && rank < cfg_.nranks : rank == cfg_.process_rank; }
  window_layout const& layout() const { return layout_; }
  /// Whether the ranks' backends carry inline puts (transport::proxy::handle::put_inline).
  bool inline_puts() const { return copy_engine_backend::carries_inline(cfg_.backend); }
  /// Inline puts (with a payload) rank `rank`'s proxy has taken so far. A local rank only.
  std::uint64_t inline_puts_taken(int rank) const {
    rank_state const& s = local(rank);
    return s.backend ? s.backend->inline_puts() : 0;
  }
  /// Rank `rank`'s memory as this process addresses it (another process's rank: its opened window).
  device_memory const& memory(int rank) const { return mem_.at(static_cast<std::size_t>(rank)); }
  /// Rank `rank`'s symmetric region (layout().symmetric_bytes bytes of device memory on its GPU):
  /// buffers placed at the same offset on every rank are what the proxy collectives move.
  std::byte* symmetric(int rank) const { return memory(rank).window + layout_.symmetric_offset(); }
  /// What rank `rank`'s kernels hold (trivially copyable; pass it by value). A local rank only.
  transport::proxy::handle handle(int rank) const {
    rank_state const& s = local(rank);
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
  /// queue's only producer). A local rank only.
  work_queue_view const& queue(int rank, int vt) const { return local(rank).views.at(static_cast<std::size_t>(vt)); }
  /// The first error of any local rank's proxy (status::ok if none) and its message.
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
    bool opened = false;        ///< another process's memory, opened from its IPC handles
    void* host_block = nullptr;
    void* dev_block = nullptr;  ///< the kernels' views and producer caches
    std::vector<work_queue_view> views;        ///< host pointers (the proxy)
    work_queue_view const* dev_views = nullptr;  ///< device pointers (the kernels)
    std::unique_ptr<copy_engine_backend> backend;
    std::unique_ptr<proxy<copy_engine_backend>> runner;  ///< the rank's proxy thread
  };

  /// What one rank's process tells the others at setup (both exchanges use it).
  struct ipc_record {
    std::uint64_t magic = 0;
    std::int32_t rank = 0, nranks = 0, n_vts = 0;
    std::uint32_t queue_capacity = 0;
    std::uint64_t area_bytes = 0, symmetric_bytes = 0;
    std::int32_t failed = 0;  ///< this rank's step failed; `why` says how
    std::int32_t device = 0;
    cudaIpcMemHandle_t window{}, flags{};
    char why[160] = {};
  };
  static constexpr std::uint64_t record_magic = 0x726563636c697063ull;  // "recclipc"

  rank_state const& local(int rank) const {
    if (!is_local(rank))
      throw reccl::error(status::invalid_argument, "copy_engine_group: rank " + std::to_string(rank) + " is not in this process", rank);
    return ranks_[static_cast<std::size_t>(rank)];
  }

  void enable_peer_access() {
    for (int a : cfg_.devices)
      for (int b : cfg_.devices) {
        if (a == b) continue;
        int ok = 0;
        RECCL_CUDA_CHECK(cudaDeviceCanAccessPeer(&ok, a, b));
        if (!ok) throw reccl::error(status::invalid_argument, "copy_engine_group: no peer access between GPUs " + std::to_string(a) + " and " + std::to_string(b));
        RECCL_CUDA_CHECK(cudaSetDevice(a));
        cudaError_t const e = cudaDeviceEnablePeerAccess(b, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) RECCL_CUDA_CHECK(e);
        (void)cudaGetLastError();  // clears "already enabled" (its result is that error)
      }
  }

  // Rank r's window, flags and queues, in this process.
  void allocate(int r) {
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

  // One rank per process: allocate mine, all-gather the records, open every peer's window and
  // flags, all-gather whether that worked. Every rank takes both exchanges whatever happened before.
  void open_peers() {
    int const me = cfg_.process_rank;
    ipc_record mine{};
    mine.magic = record_magic;
    mine.rank = me;
    mine.nranks = cfg_.nranks;
    mine.n_vts = cfg_.n_vts;
    mine.queue_capacity = cfg_.queue_capacity;
    mine.area_bytes = cfg_.area_bytes;
    mine.symmetric_bytes = cfg_.symmetric_bytes;
    mine.device = cfg_.devices[static_cast<std::size_t>(me)];
    try {
      allocate(me);
      rank_state& s = ranks_[static_cast<std::size_t>(me)];
      RECCL_CUDA_CHECK(cudaIpcGetMemHandle(&mine.window, s.window));
      RECCL_CUDA_CHECK(cudaIpcGetMemHandle(&mine.flags, s.flags));
    } catch (std::exception const& e) {
      note_failure(mine, e.what());
    }
    std::vector<ipc_record> all(static_cast<std::size_t>(cfg_.nranks));
    cfg_.exchange(&mine, all.data(), sizeof(ipc_record));
    std::string why = first_failure(all, "could not set up its memory");
    if (!why.empty()) throw reccl::error(status::internal, "copy_engine_group: " + why);
    for (int r = 0; r < cfg_.nranks && why.empty(); ++r) {
      ipc_record const& o = all[static_cast<std::size_t>(r)];
      if (o.magic != record_magic || o.rank != r)
        why = "rank " + std::to_string(r) + "'s setup record is not a copy_engine_group's (ranks must construct their groups together)";
      else if (o.nranks != mine.nranks || o.n_vts != mine.n_vts || o.queue_capacity != mine.queue_capacity || o.area_bytes != mine.area_bytes ||
               o.symmetric_bytes != mine.symmetric_bytes)
        why = "rank " + std::to_string(r) + "'s layout (" + describe(o) + ") differs from rank " + std::to_string(me) + "'s (" + describe(mine) + ")";
    }
    if (!why.empty()) throw reccl::error(status::mismatch, "copy_engine_group: " + why);
    ipc_record opened{};
    opened.magic = record_magic;
    opened.rank = me;
    try {
      RECCL_CUDA_CHECK(cudaSetDevice(cfg_.devices[static_cast<std::size_t>(me)]));
      for (int r = 0; r < cfg_.nranks; ++r) {
        if (r == me) continue;
        rank_state& s = ranks_[static_cast<std::size_t>(r)];
        ipc_record const& o = all[static_cast<std::size_t>(r)];
        RECCL_CUDA_CHECK(cudaIpcOpenMemHandle(&s.window, o.window, cudaIpcMemLazyEnablePeerAccess));
        s.opened = true;
        void* f = nullptr;
        RECCL_CUDA_CHECK(cudaIpcOpenMemHandle(&f, o.flags, cudaIpcMemLazyEnablePeerAccess));
        s.flags = static_cast<std::uint64_t*>(f);
        mem_[static_cast<std::size_t>(r)] = {static_cast<std::byte*>(s.window), layout_.window_bytes(), s.flags, layout_.n_flags(), o.device};
      }
      make_backend(me);  // its streams: the last step that may fail on one rank only
    } catch (std::exception const& e) {
      note_failure(opened, e.what());
    }
    cfg_.exchange(&opened, all.data(), sizeof(ipc_record));
    why = first_failure(all, "could not open its peers' memory");
    if (!why.empty()) {
      close_peers();
      barrier();  // every rank closed mine before I free it (release)
      throw reccl::error(status::internal, "copy_engine_group: " + why);
    }
  }

  void make_backend(int r) {
    rank_state& s = ranks_[static_cast<std::size_t>(r)];
    s.backend = std::make_unique<copy_engine_backend>(r, std::span<device_memory const>(mem_), cfg_.backend);
    if (!s.backend->message().empty()) throw reccl::error(status::internal, "copy_engine_group: " + s.backend->message());
  }
  void start(int r) {
    rank_state& s = ranks_[static_cast<std::size_t>(r)];
    RECCL_CUDA_CHECK(cudaSetDevice(cfg_.devices[static_cast<std::size_t>(r)]));
    if (!s.backend) make_backend(r);
    s.runner = std::make_unique<proxy<copy_engine_backend>>(*s.backend, std::span<work_queue_view const>(s.views), cfg_.proxy);
    s.runner->start();
  }

  // Stops the proxies (draining what was queued), then frees. `collective`: one rank per process,
  // set up completely: the two barriers of the file comment around closing the peers' windows.
  void release(bool collective) noexcept {
    for (auto& s : ranks_) s.runner.reset();
    for (auto& s : ranks_) s.backend.reset();
    bool synced = collective;
    if (synced) synced = barrier_noexcept();  // no peer's proxy writes into my memory any more
    close_peers();
    if (synced) (void)barrier_noexcept();     // no peer maps my memory any more
    for (auto& s : ranks_) {
      if (s.opened) continue;
      if (s.window) RECCL_CUDA_REPORT(cudaFree(s.window));
      if (s.flags) RECCL_CUDA_REPORT(cudaFree(s.flags));
      if (s.host_block) RECCL_CUDA_REPORT(cudaFreeHost(s.host_block));
      if (s.dev_block) RECCL_CUDA_REPORT(cudaFree(s.dev_block));
      s = rank_state{};
    }
  }
  void close_peers() noexcept {
    for (auto& s : ranks_) {
      if (!s.opened) continue;
      if (s.window) RECCL_CUDA_REPORT(cudaIpcCloseMemHandle(s.window));
      if (s.flags) RECCL_CUDA_REPORT(cudaIpcCloseMemHandle(s.flags));
      s = rank_state{};
    }
  }
  void barrier() {
    std::vector<char> all(static_cast<std::size_t>(cfg_.nranks));
    char const mine = 1;
    cfg_.exchange(&mine, all.data(), 1);
  }
  bool barrier_noexcept() noexcept {
    try {
      barrier();
      return true;
    } catch (...) {
      return false;  // a rank gave up: free anyway (its process is going away)
    }
  }

  static void note_failure(ipc_record& r, char const* what) {
    r.failed = 1;
    std::strncpy(r.why, what, sizeof(r.why) - 1);
  }
  static std::string first_failure(std::vector<ipc_record> const& all, char const* step) {
    for (std::size_t r = 0; r < all.size(); ++r)
      if (all[r].failed != 0) {
        ipc_record const& o = all[r];
        std::string const why(o.why, strnlen(o.why, sizeof(o.why)));
        return "rank " + std::to_string(r) + " " + step + ": " + why;
      }
    return {};
  }
  static std::string describe(ipc_record const& o) {
    return std::to_string(o.nranks) + " ranks, " + std::to_string(o.n_vts) + " VTs, area " + std::to_string(o.area_bytes) + ", symmetric " +
           std::to_string(o.symmetric_bytes) + ", queue " + std::to_string(o.queue_capacity);
  }

  copy_engine_config cfg_;
  window_layout layout_;
  std::vector<device_memory> mem_;
  std::vector<rank_state> ranks_;
};

}  // namespace reccl::proxy
