// reccl/host/p2p.hpp -- the P2P transport's host object: one window per rank mapped into every
// rank's address space, and the device handle (device::memory_handle) that kernels take by value.
//
// Ways to build one; only the last needs NCCL:
//   * create(rank, nranks, exchange): one rank per process. Windows travel as CUDA IPC handles
//     through any rank_exchange (an all-gather: an NCCL communicator's (reccl::nccl_exchange), a
//     torch.distributed group's, shared memory). Processes may use different GPUs with peer access
//     or share one GPU.
//   * create_loopback(nranks, device): every rank in this process, on one GPU (tests, development
//     without NVLink) -- the same kernels and protocols on plain device memory.
//   * adopt(rank, windows, owner): windows the caller mapped itself, e.g. NCCL symmetric windows
//     (create_p2p_on_nccl, host/p2p_nccl.hpp) -- the same handle over the LSA pointers.
//
// Reservations: reserve_flags() and reserve_bytes()/allocate() hand out flags and symmetric bytes
// of the window; every rank must make the same reservations in the same order (they are counters,
// so the results then agree). reccl's collectives reserve theirs when first used; a user kernel
// reserves its own, so it never shares a flag or a byte with them.
//
// Errors: the device records the first fault of a rank in its window (device::fault);
// fault()/check() read it. A fault is sticky until resume(): every live rank calls it once its
// own stream has finished the failed calls, and they go on together (a dead peer stays out of
// every later call: only a collective that takes a dead-rank mask, the expert exchange, can run
// without it; the others time out on it again).
// raise_everywhere() writes a fault into every rank's window from the caller's stream, which is
// how a rank whose host-side check rejected a call stops its peers at once.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <typeindex>
#include <unordered_map>
#include <vector>

#include "../device/agent/plan.hpp"
#include "../device/handle/memory.hpp"
#include "../error.hpp"
#include "../proxy/rank_exchange.hpp"
#include "error.hpp"
#include "ipc_windows.hpp"
#include "launch.hpp"

namespace reccl {

struct p2p_config {
  std::int32_t n_flags = 1 << 14;              ///< flags per window (8 bytes x ranks each)
  std::uint64_t data_bytes = 64ull << 20;       ///< symmetric bytes per window
  std::uint64_t timeout_ns = 3'000'000'000ull;  ///< deadline of the handle's waits, from their first spin
  // the composed collectives' lane (device/agent/plan.hpp), reserved first in every window
  std::int32_t plan_max_ctas = 16;    ///< largest grid (VTs x CTAs per VT) of a composed collective
  std::int32_t plan_depth = 4;        ///< ring slots per (peer, CTA)
  std::uint32_t plan_slot_bytes = 16384;
};

namespace detail {
template <int Unused = 0>
__global__ void raise_everywhere_kernel(device::memory_handle h, device::fault f, std::uint64_t skip) {
  h.raise_everywhere(f, skip);
}
/// resume(): every sequence word of this rank to `base`, every flag in its inbox to at least
/// `base` (an atomic max: a live peer that resumed first may have signalled base + 1 already), and
/// the fault word cleared if it still holds `seen` (a fault a peer raised since stays).
template <int Unused = 0>
__global__ void resume_kernel(device::memory_handle h, std::uint64_t base, std::uint64_t seen) {
  int const n = h.size(), flags = h.layout.n_flags;
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < static_cast<std::int64_t>(flags) * (n + 1);
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    device::flag_id const f{static_cast<std::uint32_t>(i / (n + 1))};
    int const src = static_cast<int>(i % (n + 1)) - 1;
    if (src < 0) *h.sequence(f) = base;
    else atomicMax_system(reinterpret_cast<unsigned long long*>(h.inbox(h.rank(), f, src)), static_cast<unsigned long long>(base));
  }
  if (blockIdx.x == 0 && threadIdx.x == 0)
    atomicCAS_system(reinterpret_cast<unsigned long long*>(h.fault_word(h.rank())), static_cast<unsigned long long>(seen), 0ull);
}
}  // namespace detail

class p2p_communicator {
 public:
  /// One rank of `nranks`, one per process; collective over every rank (see ipc_windows.hpp).
  static p2p_communicator create(int rank, int nranks, proxy::rank_exchange exchange, p2p_config const& cfg = {}) {
    check_config(nranks, cfg);
    device::memory_layout const L = device::memory_layout::make(nranks, cfg.n_flags, cfg.data_bytes);
    p2p_communicator c(rank, cfg, L);
    c.ipc_ = std::make_shared<ipc_windows>(rank, nranks, L.total, fingerprint(L), std::move(exchange), "p2p_communicator");
    for (int r = 0; r < nranks; ++r) c.h_.windows[r] = static_cast<char*>(c.ipc_->base(r));
    return c;
  }

  /// Every rank in this process, on GPU `device`.
  static std::vector<p2p_communicator> create_loopback(int nranks, int device = 0, p2p_config const& cfg = {}) {
    check_config(nranks, cfg);
    device::memory_layout const L = device::memory_layout::make(nranks, cfg.n_flags, cfg.data_bytes);
    RECCL_CUDA_CHECK(cudaSetDevice(device));
    auto mem = std::shared_ptr<loopback_memory>(new loopback_memory);
    for (int r = 0; r < nranks; ++r) {
      void* p = nullptr;
      RECCL_CUDA_CHECK(cudaMalloc(&p, L.total));
      mem->windows.push_back(p);
      RECCL_CUDA_CHECK(cudaMemset(p, 0, L.total));
    }
    RECCL_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<p2p_communicator> out;
    for (int r = 0; r < nranks; ++r) {
      p2p_communicator c(r, cfg, L);
      c.loopback_ = mem;
      // check_config bounds nranks by the handle's array; the min says so to the compiler too
      for (int q = 0; q < std::min(nranks, device::max_memory_ranks); ++q)
        c.h_.windows[q] = static_cast<char*>(mem->windows[static_cast<std::size_t>(q)]);
      out.push_back(std::move(c));
    }
    return out;
  }

  /// Bytes every rank's window needs for `nranks` ranks with `cfg` (what adopt() expects).
  static std::uint64_t window_bytes(int nranks, p2p_config const& cfg = {}) {
    check_config(nranks, cfg);
    return device::memory_layout::make(nranks, cfg.n_flags, cfg.data_bytes).total;
  }

  /// Rank `rank` over windows mapped by the caller: `windows[r]` is rank r's window as this GPU
  /// reaches it (current device), window_bytes(windows.size(), cfg) bytes each, zeroed before any
  /// rank's kernel uses it and the same size and configuration on every rank (the caller's job:
  /// reccl cannot compare layouts without an exchange). `owner` keeps the windows alive; it is
  /// released after everything built on this communicator.
  static p2p_communicator adopt(int rank, std::vector<void*> const& windows, std::shared_ptr<void> owner, p2p_config const& cfg = {}) {
    int const nranks = static_cast<int>(windows.size());
    check_config(nranks, cfg);
    if (rank < 0 || rank >= nranks) throw reccl::error(status::invalid_argument, "p2p_communicator::adopt: rank out of range", rank);
    for (void* w : windows)
      if (w == nullptr || reinterpret_cast<std::uintptr_t>(w) % 4096 != 0)
        throw reccl::error(status::invalid_argument, "p2p_communicator::adopt: a window is null or not 4096-byte aligned", rank);
    p2p_communicator c(rank, cfg, device::memory_layout::make(nranks, cfg.n_flags, cfg.data_bytes));
    c.owner_ = std::move(owner);
    for (int q = 0; q < std::min(nranks, device::max_memory_ranks); ++q) c.h_.windows[q] = static_cast<char*>(windows[static_cast<std::size_t>(q)]);
    return c;
  }

  int rank() const { return h_.my_rank; }
  int size() const { return h_.layout.nranks; }
  int device() const { return dev_; }
  /// Ranks of this process that share this GPU and run at once: all of them for loopback ranks, 1
  /// otherwise (processes sharing a GPU take turns on it). A spinning kernel's grid times this must
  /// be resident at once (host/launch.hpp).
  int ranks_sharing_device() const { return loopback_ ? size() : 1; }
  p2p_config const& config() const { return cfg_; }

  /// The device handle (by value into kernels).
  device::memory_handle const& handle() const { return h_; }
  /// The rings and flags of the composed collectives (reserved at creation).
  device::plan_lane const& plan_lane() const { return lane_; }

  /// `n` consecutive flags, the same on every rank if every rank reserves in the same order.
  device::flag_id reserve_flags(int n) {
    if (n < 1 || next_flag_ + n > h_.layout.n_flags)
      throw reccl::error(status::invalid_argument,
                         "p2p_communicator: cannot reserve " + std::to_string(n) + " flags (" +
                             std::to_string(h_.layout.n_flags - next_flag_) + " left; raise p2p_config::n_flags)",
                         rank());
    device::flag_id const f{static_cast<std::uint32_t>(next_flag_)};
    next_flag_ += n;
    return f;
  }
  /// `bytes` of the symmetric data region (offset), aligned to `align`.
  std::uint64_t reserve_bytes(std::uint64_t bytes, std::uint64_t align = 256) {
    std::uint64_t const off = (next_byte_ + align - 1) / align * align;
    if (off > h_.layout.data_bytes || bytes > h_.layout.data_bytes - off)
      throw reccl::error(status::invalid_argument,
                         "p2p_communicator: cannot reserve " + std::to_string(bytes) + " bytes (" +
                             std::to_string(h_.layout.data_bytes - std::min(off, h_.layout.data_bytes)) +
                             " left; raise p2p_config::data_bytes)",
                         rank());
    next_byte_ = off + bytes;
    return off;
  }
  /// A symmetric buffer: my pointer; peers reach it with handle().peer_ptr(). Zeroed at creation.
  void* allocate(std::uint64_t bytes, std::uint64_t align = 256) { return h_.at(rank(), reserve_bytes(bytes, align)); }

  /// State that a layer built on this communicator keeps per communicator (e.g. the composed
  /// collectives' staging), default-constructed on first use and destroyed with the communicator.
  template <class State>
  State& attachment() {
    std::shared_ptr<void>& slot = (*attachments_)[std::type_index(typeid(State))];
    if (!slot) slot = std::make_shared<State>();
    return *static_cast<State*>(slot.get());
  }

  /// This rank's recorded fault (ok when none). Synchronous: reads device memory.
  device::fault fault() const {
    std::uint64_t w = 0;
    RECCL_CUDA_CHECK(cudaMemcpy(&w, h_.fault_word(rank()), sizeof(w), cudaMemcpyDeviceToHost));
    return device::fault::decode(w);
  }
  /// Throws reccl::error describing this rank's fault, if any.
  void check() const {
    device::fault const f = fault();
    if (f.ok()) return;
    std::string what = "rank " + std::to_string(f.origin) + ": " + device::name(f.cause);
    if (f.peer >= 0) what += " (peer " + std::to_string(f.peer) + ")";
    if (f.origin != rank()) what += "; seen by rank " + std::to_string(rank());
    throw reccl::error(f.st, what, f.origin, f.vt);
  }
  /// Go on after a fault (a peer that timed out, a refused call): clears this rank's fault word and
  /// starts a new generation of every flag -- sequence words and inbox flags jump to
  /// `resumes x 2^40`, so no signal of the failed calls satisfies a later wait, and the ranks'
  /// counters agree again however far each got in the calls that failed. A user kernel that keeps
  /// its epochs in sequence() words goes on with them; one that keeps them elsewhere restarts its own.
  /// When: every live rank calls it once per fault, after its stream finished the failed calls
  /// (check() threw) and the live ranks agreed on the host which rank is dead, and before its next
  /// call on this communicator (the generations must match: a rank that resumes once more than its
  /// peers never meets them again).
  /// Order: reads the fault word now (synchronous), then clears it in stream order only if it still
  /// holds that fault -- one a peer raises in between (e.g. after it resumed first and refused a
  /// call) stays, as does any fault raised after resume().
  void resume(cudaStream_t stream) {
    std::uint64_t const seen = fault().encode();  // fault words are written as encode()'s bits
    ++generation_;
    detail::resume_kernel<0><<<32, 256, 0, stream>>>(h_, static_cast<std::uint64_t>(generation_) << 40, seen);
    RECCL_CUDA_CHECK(cudaGetLastError());
  }
  /// How many times resume() ran: a layer that keeps per-call state on the host compares it, to
  /// refuse continuing a call that began before a resume().
  std::uint32_t generation() const { return generation_; }

  /// Record `f` in every rank's window but those in `skip` (ranks masked as dead), in stream order
  /// (capturable).
  void raise_everywhere(device::fault const& f, cudaStream_t stream, std::uint64_t skip = 0) const {
    detail::raise_everywhere_kernel<0><<<1, 1, 0, stream>>>(h_, f, skip);
    RECCL_CUDA_CHECK(cudaGetLastError());
  }

 private:
  struct loopback_memory {
    std::vector<void*> windows;
    ~loopback_memory() {
      for (void* p : windows) (void)cudaFree(p);  // destructor: cannot report; CUDA keeps the error sticky
    }
  };

  p2p_communicator(int rank, p2p_config const& cfg, device::memory_layout const& L) : cfg_(cfg) {
    RECCL_CUDA_CHECK(cudaGetDevice(&dev_));
    // raise_everywhere runs while peers' kernels spin: its kernel must not be loaded lazily then
    load_kernel(reinterpret_cast<void const*>(&detail::raise_everywhere_kernel<0>));
    load_kernel(reinterpret_cast<void const*>(&detail::resume_kernel<0>));
    h_.layout = L;
    h_.my_rank = rank;
    h_.timeout_ns = cfg.timeout_ns;
    int const per_cta = cfg.plan_max_ctas * device::max_memory_ranks;
    lane_.ready = reserve_flags(cfg.plan_max_ctas);
    lane_.credit = reserve_flags(cfg.plan_max_ctas);
    lane_.sent = reserve_flags(per_cta);
    lane_.received = reserve_flags(per_cta);
    lane_.max_ctas = cfg.plan_max_ctas;
    lane_.depth = cfg.plan_depth;
    lane_.slot_bytes = cfg.plan_slot_bytes;
    lane_.ring_offset = reserve_bytes(device::plan_lane::ring_bytes(L.nranks, cfg.plan_max_ctas, cfg.plan_depth, cfg.plan_slot_bytes), 4096);
  }

  static void check_config(int nranks, p2p_config const& cfg) {
    if (nranks < 1 || nranks > device::max_memory_ranks)
      throw reccl::error(status::invalid_argument, "p2p_communicator: nranks must be in [1, " +
                                                       std::to_string(device::max_memory_ranks) + "]");
    if (cfg.n_flags < 1) throw reccl::error(status::invalid_argument, "p2p_communicator: n_flags must be >= 1");
    if (cfg.timeout_ns == 0) throw reccl::error(status::invalid_argument, "p2p_communicator: timeout_ns must be > 0");
    if (cfg.plan_max_ctas < 1 || cfg.plan_depth < 1 || cfg.plan_slot_bytes < 16 || cfg.plan_slot_bytes % 16 != 0)
      throw reccl::error(status::invalid_argument,
                         "p2p_communicator: plan_max_ctas and plan_depth must be >= 1, plan_slot_bytes a multiple of 16");
    if (4ll * cfg.plan_max_ctas * device::max_memory_ranks > cfg.n_flags)
      throw reccl::error(status::invalid_argument, "p2p_communicator: n_flags too small for plan_max_ctas");
  }
  static std::uint64_t fingerprint(device::memory_layout const& L) {
    std::uint64_t h = 1469598103934665603ull;
    for (std::uint64_t x : {static_cast<std::uint64_t>(L.nranks), static_cast<std::uint64_t>(L.n_flags), L.data_bytes, L.total})
      h = (h ^ x) * 1099511628211ull;
    return h;
  }

  p2p_config cfg_;
  device::memory_handle h_{};
  int dev_ = 0;
  int next_flag_ = 0;
  std::uint64_t next_byte_ = 0;
  std::uint32_t generation_ = 0;  ///< resume() calls; flags of generation g start at g x 2^40
  device::plan_lane lane_{};
  std::shared_ptr<ipc_windows> ipc_;
  std::shared_ptr<loopback_memory> loopback_;
  std::shared_ptr<void> owner_;  ///< adopt(): whatever keeps the caller's windows alive
  // declared last: destroyed first, while the windows still exist
  std::shared_ptr<std::unordered_map<std::type_index, std::shared_ptr<void>>> attachments_ =
      std::make_shared<std::unordered_map<std::type_index, std::shared_ptr<void>>>();
};

}  // namespace reccl
