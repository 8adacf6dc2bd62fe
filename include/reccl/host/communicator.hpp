// reccl/host/communicator.hpp -- the host runtime of the NVLink path: a reccl communicator on top
// of an NCCL communicator, its symmetric windows, and the launch API of the five collectives.
//
//   ncclComm_t (yours)
//     └─ nvlink_communicator
//          ├─ scratch window   ncclMemAlloc + ncclCommWindowRegister(NCCL_WIN_COLL_SYMMETRIC):
//          │                   reccl's flags, barriers, one-shot slots, rings (device/transport/lsa.hpp)
//          ├─ ncclDevComm      ncclDevCommCreate: the capability probe (fails without symmetric support)
//          ├─ registered buffers  allocate(): user buffers in symmetric windows (zero-copy path)
//          └─ hello handshake  every rank writes its configuration hash into every peer's scratch;
//                              a rank that differs (tuning table, sizes) fails creation, not a collective
//
// Buffers: any device pointer works (plain cudaMalloc included): the local input is read in place
// and only what a peer must write travels through reccl's scratch window. Buffers returned by
// allocate() on every rank (same size, same order, same offsets in each call) take the zero-copy
// path: peers load from and store to them directly.
//
// Every collective is stream-ordered and CUDA-graph capturable: no host synchronisation, no
// allocation, no host-side state that a graph replay would freeze (sequence counters live in device
// memory). Errors found before launch (null or misaligned pointers, bad enums, unsupported
// combinations) throw reccl::error; those about this rank's buffers (reccl::buffer_error) first fail
// the call's lane on every rank, so that peers already waiting in the call stop at once
// (raise_rejection; check() then names the rank). Errors found on the device (ranks that disagree, a peer that
// never arrives) are recorded in the lane's status word within the configured timeout; status() and
// check() read it. After a device-side error the lane stays failed: rebuild the communicator.
//
// Loopback (create_loopback): N ranks on ONE GPU, driven from one thread, for testing and developing
// on a single-GPU machine. The scratch windows and registered buffers are plain cudaMalloc memory of
// that GPU and every "peer" pointer is simply another rank's allocation, so the same kernels, flags,
// deadlines and graph capture run unchanged; only the link is the GPU's own memory, so its timings
// say nothing about NVLink. Ranks' kernels must run concurrently: each rank needs its own stream,
// PDL is off, and max_ctas is capped at SMs / N so that every rank's grid is resident at once.
//
// P2P (create_p2p): one rank per process on its own or a shared GPU, no NCCL communicator. The
// scratch window and the registered buffers are cudaMalloc memory mapped into every rank's process
// through CUDA IPC (host/ipc_windows.hpp), set up over any all-gather the caller has (a
// proxy::rank_exchange: an NCCL communicator's, a torch.distributed group's, shared memory): the
// way engines that bootstrap their own ranks (CUDA IPC handles over a CPU group) reach the fast
// kernels. The kernels, flags and deadlines are the same as on symmetric windows. allocate() and
// free() are collective there (every rank, same order), and so is destruction. Processes that share
// one GPU take turns on it (no MPS): every spin waits for the next time slice, so that is for
// correctness, with a long timeout_ns, not for speed.
//
// Where the pieces live: nvlink/config.hpp (nvlink_config, launch_options), nvlink/planner.hpp (a
// call's host-side checks and its plan), nvlink/registry.hpp (registered buffers),
// nvlink/setup_kernels.hpp (window resolution, slot poisoning, the hello handshake), call_digest.hpp
// (the digest ranks compare); this file holds the communicator's lifetime and its API.
//
// Teardown (destructor): device synchronise -> ncclDevCommDestroy -> deregister each window ->
// ncclMemFree (loopback: cudaFree). Destroy the reccl communicator before ncclCommFinalize/ncclCommDestroy of the NCCL
// communicator it was built on, and only once no rank still runs a collective on it.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <typeindex>
#include <vector>

#include "../config.hpp"
#include "../device/launch.hpp"
#include "../policy/split.hpp"
#include "../types.hpp"
#include "call_digest.hpp"
#include "error.hpp"
#include "ipc_windows.hpp"
#include "launch.hpp"
#include "nccl.hpp"
#include "nvlink/config.hpp"
#include "nvlink/planner.hpp"
#include "nvlink/registry.hpp"
#include "nvlink/setup_kernels.hpp"
#include "tuning.hpp"

namespace reccl {

/// reccl's communicator for one rank on one GPU (see the file comment).
class nvlink_communicator {
 public:
  /// Build on `comm` (one process or thread per GPU). Collective: every rank calls it with an equal
  /// configuration. Throws reccl::error, with NCCL's message, when the communicator has no
  /// symmetric-memory support (no CUDA P2P between all GPUs, more than one node) -- there is no
  /// silent fallback; callers that want one catch the error and use NCCL.
  static nvlink_communicator create(ncclComm_t comm, nvlink_config const& cfg = {}) {
    std::vector<nvlink_communicator> v = create_all(std::vector<ncclComm_t>{comm}, cfg);
    return std::move(v.front());
  }

  /// Build one communicator per element of `comms` from one thread (one process driving several
  /// GPUs; NCCL's collective setup calls are grouped). With a single element it is create().
  static std::vector<nvlink_communicator> create_all(std::vector<ncclComm_t> const& comms, nvlink_config const& cfg = {}) {
    detail::check_config(cfg);
    std::vector<nvlink_communicator> out;
    out.reserve(comms.size());
    for (ncclComm_t c : comms) out.push_back(nvlink_communicator(c, cfg));
    // scratch windows and device communicators: collective NCCL calls, grouped across comms (a
    // throw inside a group still closes it: an open group would swallow the thread's later calls)
    {
      detail::nccl_group group;
      for (auto& c : out) {
        c.set_device();
        RECCL_NCCL_CHECK(c.s_->comm, ncclCommWindowRegister(c.s_->comm, c.s_->scratch, c.s_->L.total_bytes(),
                                                            &c.s_->scratch_win, NCCL_WIN_COLL_SYMMETRIC));
      }
      group.end();
    }
    ncclDevCommRequirements reqs = detail::empty_requirements();
    {
      detail::nccl_group group;
      for (auto& c : out) {
        c.set_device();
        ncclResult_t const r = ncclDevCommCreate(c.s_->comm, &reqs, &c.s_->devcomm);
        if (r != ncclSuccess)
          throw error(status::invalid_argument,
                    "ncclDevCommCreate failed (no symmetric-memory support on this communicator: all GPUs must "
                    "be CUDA-P2P connected on one node; use NCCL's own collectives instead): " +
                          detail::nccl_message(r, c.s_->comm));
      }
      group.end();
    }
    for (auto& c : out) c.s_->devcomm_valid = true;
    for (auto& c : out) c.finish_setup();
    // hello: launch on every GPU first (each kernel waits for the others), then collect
    for (auto& c : out) c.launch_hello();
    for (auto& c : out) c.collect_hello();
    return out;
  }

  /// Rank `rank` of `nranks`, one per process, on the current CUDA device (see "P2P" in the file
  /// comment). Collective over every rank reached by `exchange`; every rank passes an equal
  /// configuration (a rank whose configuration differs, or is invalid, makes every rank throw). No
  /// NCCL communicator is involved; nccl() returns nullptr. Copies of `exchange` are kept (for
  /// allocate() and teardown): they must share its state.
  static nvlink_communicator create_p2p(int rank, int nranks, proxy::rank_exchange exchange, nvlink_config const& cfg = {}) {
    if (nranks < 1 || nranks > device::max_lsa)
      throw error(status::invalid_argument, "create_p2p: ranks must be in [1, " + std::to_string(device::max_lsa) + "]");
    if (rank < 0 || rank >= nranks) throw error(status::invalid_argument, "create_p2p: rank outside [0, ranks)");
    if (!exchange) throw error(status::invalid_argument, "create_p2p: a rank_exchange is required");
    // `exchange` is copied (the windows keep copies for allocate() and teardown): its copies must
    // share their state, each call of any copy being the rank's next all-gather
    nvlink_communicator c(rank, nranks, std::move(exchange), cfg);
    // every rank learns whether every rank's hello passed, so none goes on with a communicator its
    // peers tore down (their next exchanges would pair with the wrong calls)
    std::string why;
    status code = status::ok;
    try {
      c.launch_hello();
      c.collect_hello();
    } catch (error const& e) {
      why = e.what();
      code = e.code();
    } catch (std::exception const& e) {
      why = e.what();
      code = status::internal;
    }
    c.agree(why, code, "failed the hello handshake");
    return c;
  }

  /// `nranks` ranks on GPU `device` (see "Loopback" in the file comment). max_ctas is capped at
  /// SMs / nranks and PDL is turned off. No NCCL communicator is involved; nccl() returns nullptr.
  static std::vector<nvlink_communicator> create_loopback(int nranks, int device = 0, nvlink_config cfg = {}) {
    if (nranks < 1 || nranks > device::max_lsa)
      throw error(status::invalid_argument, "create_loopback: ranks must be in [1, " + std::to_string(device::max_lsa) + "]");
    int ndev = 0;
    RECCL_CUDA_CHECK(cudaGetDeviceCount(&ndev));
    if (device < 0 || device >= ndev) throw error(status::invalid_argument, "create_loopback: no such CUDA device");
    int sms = 0;
    RECCL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    int const cap = sms / nranks;
    if (cap < 1) throw error(status::invalid_argument, "create_loopback: fewer SMs than ranks");
    if (cfg.max_ctas > cap) cfg.max_ctas = cap;
    cfg.pdl = false;
    detail::check_config(cfg);
    std::vector<nvlink_communicator> out;
    out.reserve(static_cast<std::size_t>(nranks));
    for (int r = 0; r < nranks; ++r) out.push_back(nvlink_communicator(r, nranks, device, cfg));
    for (auto& c : out)
      for (int r = 0; r < nranks; ++r) c.s_->scratch_peers[r] = static_cast<char*>(out[static_cast<std::size_t>(r)].s_->scratch);
    return out;
  }

  nvlink_communicator(nvlink_communicator&&) noexcept = default;
  nvlink_communicator& operator=(nvlink_communicator&&) noexcept = default;
  nvlink_communicator(nvlink_communicator const&) = delete;
  nvlink_communicator& operator=(nvlink_communicator const&) = delete;
  ~nvlink_communicator() = default;

  int rank() const { return s_->rank; }
  int size() const { return s_->nranks; }
  int device() const { return s_->dev; }
  /// The NCCL communicator this was built on (nullptr for a loopback or P2P communicator).
  ncclComm_t nccl() const { return s_->comm; }
  bool loopback() const { return s_->loopback; }
  /// Built with create_p2p() (CUDA IPC windows).
  bool p2p() const { return s_->ipc != nullptr; }
  nvlink_config const& config() const { return s_->cfg; }

  // ---- registered (zero-copy) buffers --------------------------------------------------------

  /// Allocate `bytes` of device memory in a symmetric window (P2P: mapped into every rank through
  /// CUDA IPC). Collective: every rank calls it with the same size, in the same order. Freed by
  /// free() or at destruction.
  void* allocate(std::size_t bytes) { return allocate_all({this}, bytes).front(); }

  /// allocate() for several communicators driven by one thread (NCCL calls grouped).
  static std::vector<void*> allocate_all(std::vector<nvlink_communicator*> const& comms, std::size_t bytes) {
    if (bytes == 0) throw error(status::invalid_argument, "allocate: size 0");
    if (!comms.empty() && comms.front()->loopback()) return allocate_loopback(comms, bytes);
    if (!comms.empty() && comms.front()->p2p()) return allocate_p2p(comms, bytes);
    std::vector<detail::registered_buffer> bufs(comms.size());
    for (std::size_t i = 0; i < comms.size(); ++i) {
      comms[i]->set_device();
      void* p = nullptr;
      RECCL_NCCL_CHECK(comms[i]->s_->comm, ncclMemAlloc(&p, bytes));
      bufs[i].base = static_cast<char*>(p);
      bufs[i].bytes = bytes;
    }
    {
      detail::nccl_group group;
      for (std::size_t i = 0; i < comms.size(); ++i) {
        comms[i]->set_device();
        RECCL_NCCL_CHECK(comms[i]->s_->comm, ncclCommWindowRegister(comms[i]->s_->comm, bufs[i].base, bytes,
                                                                    &bufs[i].win, NCCL_WIN_COLL_SYMMETRIC));
      }
      group.end();
    }
    std::vector<void*> out;
    for (std::size_t i = 0; i < comms.size(); ++i) {
      comms[i]->set_device();
      if (bufs[i].win == nullptr) throw error(status::internal, "ncclCommWindowRegister returned no window");
      comms[i]->resolve(bufs[i].win, bufs[i].peers);
      comms[i]->s_->buffers.push_back(bufs[i]);
      out.push_back(bufs[i].base);
    }
    return out;
  }

  /// Release a buffer from allocate(). No rank may still use it in a collective. Local on symmetric
  /// windows and loopback; collective on a P2P communicator (every rank frees its copy, in the same
  /// order, since each rank unmaps its peers' copies before they are freed).
  void free(void* p) {
    auto& b = s_->buffers;
    for (std::size_t i = 0; i < b.size(); ++i)
      if (b[i].base == p) {
        set_device();
        RECCL_CUDA_CHECK(cudaDeviceSynchronize());
        if (s_->loopback) {
          RECCL_CUDA_CHECK(cudaFree(b[i].base));
        } else if (b[i].ipc) {
          b[i].ipc.reset();  // unmaps the peers' copies, waits for every rank to do so, frees mine
        } else {
          RECCL_NCCL_CHECK(s_->comm, ncclCommWindowDeregister(s_->comm, b[i].win));
          RECCL_NCCL_CHECK(s_->comm, ncclMemFree(b[i].base));
        }
        b.erase(b.begin() + static_cast<std::ptrdiff_t>(i));
        return;
      }
    throw error(status::invalid_argument, "free: pointer was not returned by allocate()");
  }

  /// The scratch layout of `nranks` ranks with `cfg` (every constructor's).
  static device::lsa_layout layout(int nranks, nvlink_config const& cfg) {
    return device::make_lsa_layout(nranks, cfg.lanes, cfg.max_ctas, cfg.one_shot_slot_bytes, cfg.ring_chunk_bytes, cfg.ring_depth);
  }
  /// Device memory a communicator of `nranks` ranks with `cfg` holds on its GPU before any
  /// allocate(): its scratch window (sized by nvlink_config, see its comment) and the hello word.
  static std::uint64_t memory_bytes(int nranks, nvlink_config const& cfg) {
    return layout(nranks, cfg).total_bytes() + sizeof(std::uint32_t);
  }
  /// Device memory this communicator holds on its GPU: memory_bytes(size(), config()) plus every
  /// buffer from allocate() not yet freed. Peers' windows mapped into this process are not counted
  /// (they are the peers' memory).
  std::uint64_t memory_bytes() const {
    std::uint64_t total = s_->L.total_bytes() + sizeof(std::uint32_t);  // scratch + hello word
    for (auto const& b : s_->buffers) total += b.bytes;
    return total;
  }

  /// True when [p, p+bytes) lies inside one buffer from allocate().
  bool is_registered(void const* p, std::size_t bytes) const { return detail::find_registered(s_->buffers, p, bytes) != nullptr; }

  /// The address through which this GPU reaches rank `r`'s copy of registered memory `p` (same
  /// offset inside the buffer), for user kernels that talk to peers directly.
  void* peer_pointer(void const* p, int r) const {
    auto const* b = detail::find_registered(s_->buffers, p, 1);
    if (b == nullptr || r < 0 || r >= s_->nranks)
      throw error(status::invalid_argument, "peer_pointer: not registered memory, or rank out of range");
    return b->peers[r] + (static_cast<char const*>(p) - b->base);
  }

  // ---- collectives -----------------------------------------------------------------------------

  /// out[i] = in_0[i] (op) ... (op) in_{n-1}[i]; `count` elements per rank; in == out is in-place.
  void all_reduce(void const* in, void* out, std::size_t count, dtype t, redop op, cudaStream_t stream,
                  launch_options const& o = {}) {
    run(collective::all_reduce, in, out, count, t, op, 0, stream, o);
  }
  /// out_r[i] = reduce over ranks of in[r*count + i]; `count` = output elements; in holds n*count.
  void reduce_scatter(void const* in, void* out, std::size_t count, dtype t, redop op, cudaStream_t stream,
                      launch_options const& o = {}) {
    run(collective::reduce_scatter, in, out, count, t, op, 0, stream, o);
  }
  /// out[r*count + i] = in_r[i]; `count` = input elements; out holds n*count.
  void all_gather(void const* in, void* out, std::size_t count, dtype t, cudaStream_t stream,
                  launch_options const& o = {}) {
    run(collective::all_gather, in, out, count, t, redop::sum, 0, stream, o);
  }
  /// out[i] = in_root[i]; only the root's `in` is read.
  void broadcast(void const* in, void* out, std::size_t count, dtype t, int root, cudaStream_t stream,
                 launch_options const& o = {}) {
    run(collective::broadcast, in, out, count, t, redop::sum, root, stream, o);
  }
  /// out_q[p*count + i] = in_p[q*count + i]; `count` per pair; not in-place.
  void all_to_all(void const* in, void* out, std::size_t count, dtype t, cudaStream_t stream,
                  launch_options const& o = {}) {
    run(collective::all_to_all, in, out, count, t, redop::sum, 0, stream, o);
  }

  /// The plan a call with these arguments would run (the same on every rank).
  plan plan_for(collective c, void const* in, void const* out, std::size_t count, dtype t,
                launch_options const& o = {}) const {
    return planner().choose(c, in, out, count, t, o);
  }

  // ---- status and telemetry --------------------------------------------------------------------

  /// The lane's status word as the device last wrote it (synchronous read; call after the stream
  /// has been synchronised to see the outcome of every collective issued before).
  status status_of(int lane) const {
    check_lane(lane);
    std::uint32_t w = 0;
    auto* word = view(lane).status();
    set_device();
    RECCL_CUDA_CHECK(cudaMemcpy(&w, word, sizeof(w), cudaMemcpyDeviceToHost));
    return static_cast<status>(w);
  }
  /// Throw reccl::error if any lane holds an error.
  void check() const {
    for (int l = 0; l < s_->cfg.lanes; ++l) {
      // the status word, who rejected a call (raise_rejection), the peer a timed-out wait waited for
      std::uint32_t w[3] = {};
      set_device();
      RECCL_CUDA_CHECK(cudaMemcpy(w, view(l).status(), sizeof(w), cudaMemcpyDeviceToHost));
      status const s = static_cast<status>(w[0]);
      if (s == status::ok || s == status::recovered) continue;
      int const peer = w[2] != 0 ? static_cast<int>(w[2]) - 1 : -1;  // the rank the error concerns, if known
      std::string why = s == status::timeout
                            ? (peer >= 0 ? ": rank " + std::to_string(peer) + " did not arrive within the timeout"
                                         : ": a peer did not arrive within the timeout")
                        : s == status::mismatch
                            ? (peer >= 0 ? ": rank " + std::to_string(peer) + "'s call differs (count, dtype, op, root or algorithm)"
                                         : ": ranks disagree on count, dtype, op, root or algorithm")
                            : ": device error";
      if (s == status::invalid_argument)
        why = w[1] != 0 ? ": rank " + std::to_string(w[1] - 1) + " rejected its call on the host (its exception says why)"
                        : ": a rank rejected its call on the host";
      int const concerned = s == status::invalid_argument ? (w[1] != 0 ? static_cast<int>(w[1]) - 1 : -1) : peer;
      throw error(s, "lane " + std::to_string(l) + " of rank " + std::to_string(s_->rank) + why +
                         "; the lane stays failed: rebuild the communicator", concerned);
    }
  }

  /// After this rank's host-side checks rejected its buffers for a call on `lane` (reccl::buffer_error:
  /// a mistake peers do not share): fail that lane on every rank (status::invalid_argument, naming
  /// this rank), from `stream`, so the peers' kernels of the call stop at their next poll period
  /// instead of at their deadline. The collectives do this before they throw; engines that validate
  /// with prepare() call it themselves. Does nothing for a lane outside the configuration, nor on a
  /// stream that is being captured.
  void raise_rejection(int lane, cudaStream_t stream) const {
    if (lane < 0 || lane >= s_->cfg.lanes) return;
    device_guard g(s_->dev);
    // During graph capture the kernel would be recorded, not run (and would fail every replay):
    // nothing is raised then; the throw ends this rank's capture.
    cudaStreamCaptureStatus cs = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cs) != cudaSuccess || cs != cudaStreamCaptureStatusNone) return;
    detail::raise_rejection_kernel<<<1, 32, 0, stream>>>(view(lane));
    RECCL_CUDA_CHECK(cudaGetLastError());
  }
  /// The object of type L attached to `lane` (the adaptive lane the composed types run there,
  /// host/nvlink_collective.hpp), or nullptr when the lane has none or one of another type. The
  /// object lives as long as the communicator's state (it moves with the communicator).
  template <class L> L* attached(int lane) const {
    check_lane(lane);
    if (static_cast<std::size_t>(lane) >= s_->attached.size()) return nullptr;
    auto const& a = s_->attached[static_cast<std::size_t>(lane)];
    return a.type == std::type_index(typeid(L)) ? static_cast<L*>(a.obj.get()) : nullptr;
  }
  /// Attaches the object `make()` returns to `lane`, replacing an object of the same type; throws
  /// before calling `make` if an object of another type holds the lane (two control loops would
  /// share one control region).
  template <class L, class Make> L& attach(int lane, Make&& make) {
    check_lane(lane);
    if (static_cast<std::size_t>(lane) >= s_->attached.size()) s_->attached.resize(static_cast<std::size_t>(s_->cfg.lanes));
    auto& a = s_->attached[static_cast<std::size_t>(lane)];
    if (a.obj != nullptr && a.type != std::type_index(typeid(L)))
      throw error(status::invalid_argument,
                  "lane " + std::to_string(lane) + " already runs an adaptive lane of other policies: give this one another lane",
                  s_->rank);
    auto p = std::make_shared<L>(make());
    L& ref = *p;
    a = {std::type_index(typeid(L)), std::move(p)};
    return ref;
  }

  /// Stall counts per VT accumulated on `lane` since creation (pipelined senders' credit waits).
  std::array<std::uint64_t, max_vts> stalls(int lane) const {
    check_lane(lane);
    std::array<std::uint64_t, max_vts> a{};
    set_device();
    RECCL_CUDA_CHECK(cudaMemcpy(a.data(), view(lane).stalls(0), sizeof(std::uint64_t) * max_vts, cudaMemcpyDeviceToHost));
    return a;
  }

 private:
  struct state {
    ncclComm_t comm = nullptr;
    bool loopback = false;  ///< create_loopback(): cudaMalloc memory on one GPU, no NCCL
    std::shared_ptr<ipc_windows> ipc;  ///< create_p2p(): the scratch windows, mapped through CUDA IPC
    proxy::rank_exchange exchange;     ///< create_p2p(): the all-gather allocate() takes
    int rank = 0, nranks = 0, dev = 0;
    nvlink_config cfg{};
    device::lsa_layout L{};
    void* scratch = nullptr;
    ncclWindow_t scratch_win = nullptr;
    char* scratch_peers[device::max_lsa] = {};
    ncclDevComm devcomm{};
    bool devcomm_valid = false;
    std::uint32_t* hello_result = nullptr;
    std::vector<detail::registered_buffer> buffers;
    struct attachment {
      std::type_index type = std::type_index(typeid(void));
      std::shared_ptr<void> obj;  ///< keeps its own deleter
    };
    std::vector<attachment> attached;  ///< per lane (attach()); host objects that own no device memory

    /// A destructor cannot throw: each failed call is reported on stderr (RECCL_*_REPORT) and the
    /// teardown goes on, releasing what it still can.
    ~state() {
      if (ipc != nullptr) {
        // P2P: every rank tears down together; each mapping's release waits for its peers (host/ipc_windows.hpp)
        int prev = -1;
        if (!RECCL_CUDA_REPORT(cudaGetDevice(&prev))) prev = -1;
        RECCL_CUDA_REPORT(cudaSetDevice(dev));
        RECCL_CUDA_REPORT(cudaDeviceSynchronize());
        buffers.clear();
        ipc.reset();
        if (hello_result != nullptr) RECCL_CUDA_REPORT(cudaFree(hello_result));
        if (prev >= 0) RECCL_CUDA_REPORT(cudaSetDevice(prev));
        return;
      }
      if (comm == nullptr && !loopback) return;
      int prev = -1;
      if (!RECCL_CUDA_REPORT(cudaGetDevice(&prev))) prev = -1;
      RECCL_CUDA_REPORT(cudaSetDevice(dev));
      RECCL_CUDA_REPORT(cudaDeviceSynchronize());
      if (loopback) {
        for (auto& b : buffers) RECCL_CUDA_REPORT(cudaFree(b.base));
        if (scratch != nullptr) RECCL_CUDA_REPORT(cudaFree(scratch));
        if (hello_result != nullptr) RECCL_CUDA_REPORT(cudaFree(hello_result));
        if (prev >= 0) RECCL_CUDA_REPORT(cudaSetDevice(prev));
        return;
      }
      if (devcomm_valid) RECCL_NCCL_REPORT(ncclDevCommDestroy(comm, &devcomm));
      for (auto& b : buffers) {
        if (b.win != nullptr) RECCL_NCCL_REPORT(ncclCommWindowDeregister(comm, b.win));
        RECCL_NCCL_REPORT(ncclMemFree(b.base));
      }
      if (scratch_win != nullptr) RECCL_NCCL_REPORT(ncclCommWindowDeregister(comm, scratch_win));
      if (scratch != nullptr) RECCL_NCCL_REPORT(ncclMemFree(scratch));
      if (hello_result != nullptr) RECCL_CUDA_REPORT(cudaFree(hello_result));
      if (prev >= 0) RECCL_CUDA_REPORT(cudaSetDevice(prev));
    }
  };
  std::unique_ptr<state> s_;

  /// Makes `dev` current for the scope; the destructor restores the previous device (a failure
  /// there is reported on stderr, since a destructor cannot throw).
  struct device_guard {
    int prev = -1;
    explicit device_guard(int dev) {
      RECCL_CUDA_CHECK(cudaGetDevice(&prev));
      if (prev != dev) RECCL_CUDA_CHECK(cudaSetDevice(dev));
      else prev = -1;
    }
    device_guard(device_guard const&) = delete;
    device_guard& operator=(device_guard const&) = delete;
    ~device_guard() {
      if (prev >= 0) RECCL_CUDA_REPORT(cudaSetDevice(prev));
    }
  };

  nvlink_communicator(ncclComm_t comm, nvlink_config const& cfg) : s_(std::make_unique<state>()) {
    if (comm == nullptr) throw error(status::invalid_argument, "null NCCL communicator");
    detail::require_matching_nccl();
    s_->cfg = cfg;
    RECCL_NCCL_CHECK(comm, ncclCommCuDevice(comm, &s_->dev));
    { device_guard g(s_->dev); load_setup_kernels(); }
    RECCL_NCCL_CHECK(comm, ncclCommUserRank(comm, &s_->rank));
    RECCL_NCCL_CHECK(comm, ncclCommCount(comm, &s_->nranks));
    if (s_->nranks > device::max_lsa)
      throw error(status::invalid_argument, "the NVLink path supports at most " + std::to_string(device::max_lsa) + " ranks");
    s_->L = layout(s_->nranks, cfg);
    device_guard g(s_->dev);
    void* p = nullptr;
    RECCL_NCCL_CHECK(comm, ncclMemAlloc(&p, s_->L.total_bytes()));
    s_->scratch = p;
    s_->comm = comm;  // from here on the state destructor releases what exists
    // every rank's scratch is initialised before the collective window registration that follows
    init_scratch();
  }

  /// Loopback rank `rank` of `nranks` on `dev`: the same scratch layout in cudaMalloc memory.
  nvlink_communicator(int rank, int nranks, int dev, nvlink_config const& cfg) : s_(std::make_unique<state>()) {
    s_->loopback = true;
    s_->cfg = cfg;
    s_->rank = rank;
    s_->nranks = nranks;
    s_->dev = dev;
    s_->L = layout(nranks, cfg);
    device_guard g(dev);
    load_setup_kernels();
    RECCL_CUDA_CHECK(cudaMalloc(&s_->scratch, s_->L.total_bytes()));
    init_scratch();
  }

  /// P2P rank `rank` of `nranks` on the current device: the scratch window is this rank's IPC
  /// window; every rank's is initialised before any rank writes into a peer's (the hello).
  nvlink_communicator(int rank, int nranks, proxy::rank_exchange exchange, nvlink_config const& cfg)
      : s_(std::make_unique<state>()) {
    s_->cfg = cfg;
    s_->rank = rank;
    s_->nranks = nranks;
    s_->exchange = exchange;
    {
      // local checks first, agreed: a rank that fails them alone must not leave its peers waiting
      // in the windows' exchange
      std::string why;
      status code = status::ok;
      try {
        detail::check_config(cfg);
        RECCL_CUDA_CHECK(cudaGetDevice(&s_->dev));
        load_setup_kernels();
      } catch (error const& e) {
        why = e.what();
        code = e.code();
      } catch (std::exception const& e) {
        why = e.what();
        code = status::internal;
      }
      agree(why, code, "could not start");
    }
    s_->L = layout(nranks, cfg);
    // the configuration digest is the windows' fingerprint: a rank configured differently fails here
    s_->ipc = std::make_shared<ipc_windows>(rank, nranks, s_->L.total_bytes(), detail::hello_token(nranks, cfg),
                                            std::move(exchange), "nvlink_communicator::create_p2p");
    s_->scratch = s_->ipc->base(rank);
    for (int r = 0; r < nranks; ++r) s_->scratch_peers[r] = static_cast<char*>(s_->ipc->base(r));
    std::string why;
    status code = status::ok;
    try {
      init_scratch();
    } catch (error const& e) {
      why = e.what();
      code = e.code();
    } catch (std::exception const& e) {
      why = e.what();
      code = status::internal;
    }
    agree(why, code, "could not initialise its scratch window");
  }

  /// Every P2P rank reports whether its step succeeded (`code` ok) or why not; if one failed,
  /// every rank throws that rank's status and reason (so no rank goes on to wait for, or exchange
  /// with, a rank that gave up).
  void agree(std::string const& why, status code, char const* step) {
    struct report {
      std::uint32_t code = 0;
      char why[252] = {};
    } mine{}, all[device::max_lsa]{};
    if (code != status::ok) {
      mine.code = static_cast<std::uint32_t>(code);
      std::strncpy(mine.why, why.c_str(), sizeof(mine.why) - 1);
    }
    s_->exchange(&mine, all, sizeof(report));
    for (int r = 0; r < s_->nranks; ++r)
      if (all[r].code != 0)
        throw error(static_cast<status>(all[r].code), "nvlink_communicator::create_p2p: rank " + std::to_string(r) + " " + step +
                                                          ": " + std::string(all[r].why, strnlen(all[r].why, sizeof(all[r].why))),
                    s_->rank);
  }

  /// The kernels a communicator may launch while a peer's kernel spins on the same GPU (a lazy
  /// module load would wait for it: host/launch.hpp) are loaded at creation.
  static void load_setup_kernels() { load_kernel(reinterpret_cast<void const*>(&detail::raise_rejection_kernel<0>)); }

  /// allocate_all() for a P2P communicator: one CUDA IPC mapping per buffer, over the exchange.
  static std::vector<void*> allocate_p2p(std::vector<nvlink_communicator*> const& comms, std::size_t bytes) {
    if (comms.size() != 1) throw error(status::invalid_argument, "allocate_all on P2P communicators: one rank per process, call allocate()");
    nvlink_communicator& c = *comms.front();
    device_guard g(c.s_->dev);
    detail::registered_buffer b;
    b.ipc = std::make_shared<ipc_windows>(c.s_->rank, c.s_->nranks, bytes, static_cast<std::uint64_t>(bytes), c.s_->exchange,
                                          "nvlink_communicator::allocate");
    b.base = static_cast<char*>(b.ipc->base(c.s_->rank));
    b.bytes = bytes;
    for (int r = 0; r < c.s_->nranks; ++r) b.peers[r] = static_cast<char*>(b.ipc->base(r));
    c.s_->buffers.push_back(b);
    return {b.base};
  }

  /// Zero the scratch window and poison its one-shot and ring slots ("not arrived").
  void init_scratch() {
    void* p = s_->scratch;
    RECCL_CUDA_CHECK(cudaMemset(p, 0, s_->L.total_bytes()));
    for (int l = 0; l < s_->cfg.lanes; ++l) {
      char* lane = static_cast<char*>(p) + s_->L.header_bytes + static_cast<std::uint64_t>(l) * s_->L.lane_bytes;
      // one-shot slots and ring slots (contiguous, to the end of the lane) start "not arrived"
      std::uint64_t const words = (s_->L.lane_bytes - s_->L.one_shot_off) / 4;
      detail::poison_kernel<<<1024, 256>>>(reinterpret_cast<std::uint32_t*>(lane + s_->L.one_shot_off), words);
      RECCL_CUDA_CHECK(cudaGetLastError());
    }
    RECCL_CUDA_CHECK(cudaMalloc(&s_->hello_result, sizeof(std::uint32_t)));
    RECCL_CUDA_CHECK(cudaMemset(s_->hello_result, 0, sizeof(std::uint32_t)));
    RECCL_CUDA_CHECK(cudaDeviceSynchronize());
  }

  /// allocate_all() for a loopback group: every rank's buffer is visible to the others as is.
  static std::vector<void*> allocate_loopback(std::vector<nvlink_communicator*> const& comms, std::size_t bytes) {
    int const n = comms.front()->size();
    if (static_cast<int>(comms.size()) != n)
      throw error(status::invalid_argument, "allocate_all on a loopback group needs every rank, in rank order");
    for (int r = 0; r < n; ++r)
      if (!comms[static_cast<std::size_t>(r)]->loopback() || comms[static_cast<std::size_t>(r)]->rank() != r ||
          comms[static_cast<std::size_t>(r)]->s_->scratch_peers[0] != comms.front()->s_->scratch_peers[0])
        throw error(status::invalid_argument, "allocate_all on a loopback group needs every rank, in rank order");
    std::vector<detail::registered_buffer> bufs(comms.size());
    device_guard g(comms.front()->s_->dev);
    for (auto& b : bufs) {
      void* p = nullptr;
      RECCL_CUDA_CHECK(cudaMalloc(&p, bytes));
      b.base = static_cast<char*>(p);
      b.bytes = bytes;
    }
    std::vector<void*> out;
    for (int r = 0; r < n; ++r) {
      for (int q = 0; q < n; ++q) bufs[static_cast<std::size_t>(r)].peers[q] = bufs[static_cast<std::size_t>(q)].base;
      comms[static_cast<std::size_t>(r)]->s_->buffers.push_back(bufs[static_cast<std::size_t>(r)]);
      out.push_back(bufs[static_cast<std::size_t>(r)].base);
    }
    return out;
  }

  void set_device() const { RECCL_CUDA_CHECK(cudaSetDevice(s_->dev)); }

  void resolve(ncclWindow_t win, char* (&peers)[device::max_lsa]) {
    void** d = nullptr;
    RECCL_CUDA_CHECK(cudaMalloc(&d, sizeof(void*) * device::max_lsa));
    detail::resolve_lsa_kernel<<<1, 32>>>(win, s_->nranks, d);
    cudaError_t const launched = cudaGetLastError();
    void* h[device::max_lsa] = {};
    cudaError_t const copied =
        launched == cudaSuccess ? cudaMemcpy(h, d, sizeof(void*) * s_->nranks, cudaMemcpyDeviceToHost) : cudaSuccess;
    cudaError_t const freed = cudaFree(d);  // before any throw, so that d never leaks
    detail::check_cuda(launched, "resolve_lsa_kernel<<<1, 32>>>");
    detail::check_cuda(copied, "cudaMemcpy(LSA pointers)");
    detail::check_cuda(freed, "cudaFree(LSA pointer staging)");
    for (int r = 0; r < s_->nranks; ++r) {
      if (h[r] == nullptr) throw error(status::internal, "ncclGetLsaPointer returned null");
      peers[r] = static_cast<char*>(h[r]);
    }
  }

  void finish_setup() {
    set_device();
    if (s_->scratch_win == nullptr)
      throw error(status::invalid_argument, "ncclCommWindowRegister produced no window (no symmetric-memory support)");
    if (s_->devcomm.lsaSize != s_->nranks || s_->devcomm.lsaRank != s_->rank)
      throw error(status::invalid_argument, "the NVLink path needs every rank in one LSA team (one node, CUDA P2P): lsaSize=" +
                                                std::to_string(s_->devcomm.lsaSize) + ", ranks=" + std::to_string(s_->nranks));
    resolve(s_->scratch_win, s_->scratch_peers);
  }

  void launch_hello() {
    set_device();
    detail::hello_kernel<<<1, 32>>>(view(0), detail::hello_token(s_->nranks, s_->cfg), s_->cfg.timeout_ns, s_->hello_result);
    RECCL_CUDA_CHECK(cudaGetLastError());
  }
  void collect_hello() {
    set_device();
    RECCL_CUDA_CHECK(cudaDeviceSynchronize());
    std::uint32_t r = 0;
    RECCL_CUDA_CHECK(cudaMemcpy(&r, s_->hello_result, sizeof(r), cudaMemcpyDeviceToHost));
    if (r == static_cast<std::uint32_t>(status::mismatch))
      throw error(status::mismatch, "ranks were created with different nvlink_config (sizes or tuning table)");
    if (r != 0) throw error(status::timeout, "a peer did not complete communicator creation within the timeout");
  }

  device::lsa_view view(int lane) const {
    device::lsa_view v;
    for (int r = 0; r < s_->nranks; ++r) v.scratch[r] = s_->scratch_peers[r];
    v.L = s_->L;
    v.rank = s_->rank;
    v.nranks = s_->nranks;
    v.lane = lane;
    return v;
  }

  void check_lane(int lane) const { planner().check_lane(lane); }

  /// The planner of this rank's calls (references this communicator's state: use it within a call).
  detail::nvlink_planner planner() const { return {s_->cfg, s_->rank, s_->nranks, s_->buffers}; }

  void run(collective c, void const* in, void* out, std::size_t count, dtype t, redop op, int root, cudaStream_t stream,
           launch_options const& o) {
    plan p;
    device::coll_args a;
    try {
      a = prepare(c, in, out, count, t, op, root, o, p);
    } catch (buffer_error const&) {
      raise_rejection(o.lane, stream);  // a peer may already wait in this call
      throw;
    }
    if (count == 0) return;
    device::kernel_fn const k = device::select_kernel(p.algo, c, t);
    if (k == nullptr) throw error(status::invalid_argument, "no kernel for this algorithm and dtype");
    device_guard g(s_->dev);
    cudaError_t const e = device::launch_kernel(k, p.grid, a, stream, s_->cfg.pdl);
    if (e != cudaSuccess) throw error(status::internal, std::string("kernel launch: ") + cudaGetErrorString(e));
  }

 public:
  /// Validates a call and builds its kernel arguments and plan without launching anything (the
  /// adaptive loop, host/adaptive.hpp, launches its own kernels on these). Throws reccl::error on
  /// bad input. For count == 0 it returns after validation with `p` empty.
  device::coll_args prepare(collective c, void const* in, void* out, std::size_t count, dtype t, redop op, int root,
                            launch_options const& o, plan& p) const {
    detail::nvlink_planner const pl = planner();
    detail::checked_call const k = pl.check(c, in, out, count, t, op, root, o.lane);  // throws before any launch
    if (count == 0) return device::coll_args{};
    bool const reads_in = k.reads_in, in_place = k.in_place;
    std::uint64_t const seg = k.seg;
    detail::call_shape const& sh = k.shape;
    split sp;
    p = pl.choose(c, reads_in ? in : out, out, count, t, o, &sp);

    device::coll_args a;
    a.coll = c;
    a.op = op;
    a.algo = p.algo;
    a.in_place = in_place;
    a.root = root;
    a.ctas_per_vt = p.ctas_per_vt;
    a.chunk_packs = p.chunk_packs;
    a.count = reduces(c) ? count : seg;  // copying collectives: a byte stream
    a.seg_bytes = seg;
    a.timeout_ns = s_->cfg.timeout_ns;
    a.in = reads_in ? in : out;
    a.out = out;
    a.sp = sp;
    a.view = view(o.lane);
    bool vec = (reinterpret_cast<std::uintptr_t>(a.in) % 16 == 0) && (reinterpret_cast<std::uintptr_t>(out) % 16 == 0);
    if (sh.in_segments > 1 || sh.out_segments > 1) vec = vec && seg % 16 == 0;
    a.vec_ok = vec;

    std::uint32_t h = detail::fnv_basis;
    h = detail::fnv_add(h, c);
    h = detail::fnv_add(h, op);
    h = detail::fnv_add(h, t);
    h = detail::fnv_add(h, static_cast<std::uint64_t>(count));
    h = detail::fnv_add(h, root);
    h = detail::fnv_add(h, p.algo);
    h = detail::fnv_add(h, p.grid);
    h = detail::fnv_add(h, p.ctas_per_vt);
    h = detail::fnv_add(h, p.chunk_packs);
    h = detail::fnv_add(h, o.lane);
    h = detail::fnv_add(h, sp);
    if (p.algo == algorithm::two_shot || p.algo == algorithm::direct) {
      // peers are reached at the same offset inside the same-size buffer on every rank; both go into
      // the descriptor, so a rank that passes a different offset fails the entry barrier
      bool const pull = c == collective::all_reduce || c == collective::reduce_scatter;
      bool const push = c != collective::reduce_scatter;
      if (pull) {
        auto const* bi = pl.find(a.in, seg * sh.in_segments);
        std::uint64_t const oi = static_cast<std::uint64_t>(static_cast<char const*>(a.in) - bi->base);
        h = detail::fnv_add(h, oi);
        h = detail::fnv_add(h, static_cast<std::uint64_t>(bi->bytes));
        for (int r = 0; r < s_->nranks; ++r) a.peer_in[r] = bi->peers[r] + oi;
      }
      if (push) {
        auto const* bo = pl.find(out, seg * sh.out_segments);
        std::uint64_t const oo = static_cast<std::uint64_t>(static_cast<char const*>(out) - bo->base);
        h = detail::fnv_add(h, oo);
        h = detail::fnv_add(h, static_cast<std::uint64_t>(bo->bytes));
        for (int r = 0; r < s_->nranks; ++r) a.peer_out[r] = bo->peers[r] + oo;
      }
    }
    a.desc = h;
    return a;
  }

  /// The lane's device view (engines built on this communicator).
  device::lsa_view lane_view(int lane) const {
    check_lane(lane);
    return view(lane);
  }
};

}  // namespace reccl
