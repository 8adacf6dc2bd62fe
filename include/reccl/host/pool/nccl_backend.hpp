// reccl/host/pool/nccl_backend.hpp -- the GPU backend of the communicator pool (host/pool.hpp):
// each group is an NCCL communicator split from the parent, reccl's NVLink communicator on it,
// the symmetric windows the user asked for, and warm-up collectives that leave nothing to connect.
//
//   build(spec)    ncclCommSplit(parent, colour = group, key = position)
//                  nvlink_communicator::create      scratch window + ncclDevCommCreate + hello
//                  allocate(window_bytes[i])        ncclMemAlloc + ncclCommWindowRegister
//   warm(g)        NCCL all-reduce on plain memory  (the lazy P2P connect, ~130 ms on NVLink)
//                  NCCL all-reduce on the windows   (NCCL's symmetric kernels)
//                  reccl all-reduce on the windows and on plain memory (every reccl path)
//                  each checked against its exact value
//   memory         cudaMemGetInfo: total - free, before and after (the pool takes the delta)
//   in flight      cudaEventQuery on the group's fence event (recorded by note_issued())
//   teardown       on the pool's worker thread, device set first:
//                    finalize: wait for the fence -> reccl communicator -> ncclCommFinalize ->
//                              ncclCommDestroy (in-flight work that never completes: abort)
//                    revoke:   ncclCommRevoke (NCCL >= 2.28.7, looked up at run time) ->
//                              reccl communicator -> ncclCommDestroy; without it: abort
//                    abort:    ncclCommAbort first (it ends a collective stuck on a dead peer);
//                              the reccl communicator's windows, registered on that communicator,
//                              are then left allocated (reported in the outcome's message)
//
// NCCL's rules that shape this: a communicator is used by one thread at a time (the pool's
// teardown touches only retired groups); communicators split with splitShare=1 must not be used
// concurrently with their parent, and the teardown runs while the engine uses other shapes, so
// split_share defaults to off (set it only if no NCCL call overlaps a retirement).
#pragma once

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../communicator.hpp"
#include "../error.hpp"
#include "../nccl.hpp"
#include "../pool.hpp"

namespace reccl {

/// Settings of every group the NCCL backend builds.
struct nccl_pool_options {
  std::vector<std::size_t> window_bytes;         ///< symmetric windows per group (per rank), e.g. {64 MiB, 64 MiB}
  nvlink_config reccl{};                         ///< reccl's communicator on each group
  std::size_t warm_bytes = 1 << 20;              ///< size of each warm-up collective
  bool split_share = false;                      ///< ncclConfig_t::splitShare (see the file comment)
  bool reccl_on_singletons = true;               ///< also build reccl's communicator on one-rank groups
  std::chrono::nanoseconds drain_bound = std::chrono::seconds(2);  ///< teardown's wait for in-flight work
};

namespace detail {

using nccl_revoke_fn = ncclResult_t (*)(ncclComm_t, int);

/// ncclCommRevoke of the loaded library, or null (NCCL < 2.28.7 has none): looked up at run time,
/// so one binary uses it where the library has it.
inline nccl_revoke_fn nccl_revoke() {
  static nccl_revoke_fn const f = reinterpret_cast<nccl_revoke_fn>(dlsym(RTLD_DEFAULT, "ncclCommRevoke"));
  return f;
}

}  // namespace detail

/// One rank's member of a built group: the NCCL communicator, reccl's NVLink communicator (absent
/// only on a one-rank group where it could not be built; see reccl_unavailable()), the windows,
/// and the fence event through which the pool sees in-flight work.
class nccl_group {
 public:
  ncclComm_t nccl() const { return s_->comm; }
  /// reccl's communicator, or nullptr (one-rank group without one).
  nvlink_communicator* reccl() { return s_->rc ? &*s_->rc : nullptr; }
  nvlink_communicator const* reccl() const { return s_->rc ? &*s_->rc : nullptr; }
  /// Why reccl() is null ("" when it is not).
  std::string const& reccl_unavailable() const { return s_->reccl_unavailable; }
  int rank() const { return s_->position; }
  int size() const { return static_cast<int>(s_->members.size()); }
  int device() const { return s_->dev; }
  std::string const& shape_name() const { return s_->shape; }
  int group_index() const { return s_->group_index; }
  std::size_t windows() const { return s_->windows.size(); }
  /// Window i (symmetric: same size and offset on every member; zero-copy for reccl).
  void* window(std::size_t i) const { return s_->windows.at(i); }
  std::size_t window_bytes(std::size_t i) const { return s_->window_bytes.at(i); }

  /// Marks everything issued so far on `stream` as work of this group: the pool's in-flight check
  /// and the teardown wait for it. Capturable (inside a CUDA graph it records an event node).
  void note_issued(cudaStream_t stream) {
    RECCL_CUDA_CHECK(cudaEventRecord(s_->fence, stream));
    s_->fenced = true;
  }
  /// reccl all-reduce on this group, noted as in flight.
  void all_reduce(void const* in, void* out, std::size_t count, dtype t, redop op, cudaStream_t stream,
                  launch_options const& o = {}) {
    if (!s_->rc) throw error(status::invalid_argument, "no reccl communicator on this group: " + s_->reccl_unavailable);
    s_->rc->all_reduce(in, out, count, t, op, stream, o);
    note_issued(stream);
  }
  /// NCCL all-reduce on this group, noted as in flight.
  void nccl_all_reduce(void const* in, void* out, std::size_t count, ncclDataType_t t, ncclRedOp_t op,
                       cudaStream_t stream) {
    RECCL_NCCL_CHECK(s_->comm, ncclAllReduce(in, out, count, t, op, s_->comm, stream));
    note_issued(stream);
  }
  /// Whether work noted on this group has not finished (cudaEventQuery; no NCCL call). A query
  /// that fails counts as finished: the error is the device's, and the next checked call on its
  /// stream reports it.
  bool in_flight() const { return s_->fenced && cudaEventQuery(s_->fence) == cudaErrorNotReady; }

 private:
  friend class nccl_pool_backend;
  struct state {
    ncclComm_t comm = nullptr;
    std::optional<nvlink_communicator> rc;
    std::string reccl_unavailable;
    std::vector<void*> windows;
    std::vector<std::size_t> window_bytes;
    std::vector<int> members;
    int position = 0, group_index = 0, dev = 0;
    std::string shape;
    cudaEvent_t fence = nullptr;
    bool fenced = false;

    /// Releases what a teardown did not (a job dropped unrun): abort, which needs no peer. A
    /// destructor cannot throw: failures are reported on stderr.
    ~state() {
      if (comm == nullptr && fence == nullptr) return;
      RECCL_CUDA_REPORT(cudaSetDevice(dev));
      if (comm != nullptr) {
        RECCL_NCCL_REPORT(ncclCommAbort(comm));
        if (rc) new std::optional<nvlink_communicator>(std::move(rc));  // its comm is gone: leave it
      }
      if (fence != nullptr) RECCL_CUDA_REPORT(cudaEventDestroy(fence));
    }
  };
  std::shared_ptr<state> s_;
};

/// The PoolBackend of one process (one GPU, one rank of `parent`).
class nccl_pool_backend {
 public:
  using group = nccl_group;

  /// `parent`: the world communicator the groups are split from (yours; it must outlive the pool).
  nccl_pool_backend(ncclComm_t parent, nccl_pool_options opts = {}) : parent_(parent), opt_(std::move(opts)) {
    if (parent_ == nullptr) throw error(status::invalid_argument, "nccl_pool_backend: null parent communicator");
    if (opt_.warm_bytes < 16 || opt_.warm_bytes % 16 != 0)
      throw error(status::invalid_argument, "nccl_pool_backend: warm_bytes must be a positive multiple of 16");
    for (std::size_t b : opt_.window_bytes)
      if (b == 0) throw error(status::invalid_argument, "nccl_pool_backend: a window of 0 bytes");
    RECCL_NCCL_CHECK(parent_, ncclCommUserRank(parent_, &rank_));
    RECCL_NCCL_CHECK(parent_, ncclCommCount(parent_, &size_));
    RECCL_NCCL_CHECK(parent_, ncclCommCuDevice(parent_, &dev_));
    RECCL_CUDA_CHECK(cudaSetDevice(dev_));
    RECCL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    RECCL_CUDA_CHECK(cudaMalloc(&agree_buf_, sizeof(std::uint64_t)));
  }
  nccl_pool_backend(nccl_pool_backend const&) = delete;
  nccl_pool_backend& operator=(nccl_pool_backend const&) = delete;
  ~nccl_pool_backend() {  // cannot throw: failures are reported on stderr
    RECCL_CUDA_REPORT(cudaSetDevice(dev_));
    if (agree_buf_ != nullptr) RECCL_CUDA_REPORT(cudaFree(agree_buf_));
    if (stream_ != nullptr) RECCL_CUDA_REPORT(cudaStreamDestroy(stream_));
  }

  int world_rank() const { return rank_; }
  int world_size() const { return size_; }
  int device() const { return dev_; }
  /// The stream the backend's own work (warm-ups, agreement) runs on.
  cudaStream_t stream() const { return stream_; }
  /// Whether the loaded NCCL offers ncclCommRevoke.
  static bool has_revoke() { return detail::nccl_revoke() != nullptr; }

  nccl_group build(group_spec const& spec) {
    RECCL_CUDA_CHECK(cudaSetDevice(dev_));
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.splitShare = opt_.split_share ? 1 : 0;
    ncclComm_t c = nullptr;
    RECCL_NCCL_CHECK(parent_, ncclCommSplit(parent_, spec.group_index, spec.position, &c, &cfg));
    if (c == nullptr) throw error(status::internal, "ncclCommSplit gave no communicator");
    nccl_group g;
    g.s_ = std::make_shared<nccl_group::state>();
    auto& s = *g.s_;
    s.comm = c;  // from here on the state releases it if anything below throws
    s.dev = dev_;
    s.members.assign(spec.members.begin(), spec.members.end());
    s.position = spec.position;
    s.group_index = spec.group_index;
    s.shape = std::string(spec.shape_name);
    RECCL_CUDA_CHECK(cudaEventCreateWithFlags(&s.fence, cudaEventDisableTiming));
    bool const single = spec.members.size() == 1;
    if (!single || opt_.reccl_on_singletons) {
      try {
        s.rc.emplace(nvlink_communicator::create(c, opt_.reccl));
      } catch (std::exception const& e) {
        if (!single) throw;
        s.reccl_unavailable = e.what();  // a one-rank group needs no communication; reported, not fatal
      }
    } else {
      s.reccl_unavailable = "not built on one-rank groups (reccl_on_singletons = false)";
    }
    if (s.rc)
      for (std::size_t b : opt_.window_bytes) {
        s.windows.push_back(s.rc->allocate(b));
        s.window_bytes.push_back(b);
      }
    return g;
  }

  void warm(nccl_group& g) {
    auto& s = *g.s_;
    RECCL_CUDA_CHECK(cudaSetDevice(dev_));
    std::size_t const bytes = opt_.warm_bytes;
    std::size_t const count = bytes / 4;
    int const n = static_cast<int>(s.members.size());
    std::uint32_t expect_u = 0;
    for (int p = 0; p < n; ++p) expect_u += 0x01010101u * static_cast<std::uint32_t>(p + 1);
    std::int32_t expect;
    std::memcpy(&expect, &expect_u, sizeof(expect));

    void* tmp = nullptr;
    RECCL_CUDA_CHECK(cudaMalloc(&tmp, 2 * bytes));
    struct freer {
      void* p;
      ~freer() { RECCL_CUDA_REPORT(cudaFree(p)); }
    } f{tmp};
    char* const in = static_cast<char*>(tmp);
    char* const out = in + bytes;
    std::vector<std::int32_t> host(count);
    auto check = [&](void const* o, char const* what) {
      RECCL_CUDA_CHECK(cudaStreamSynchronize(stream_));
      RECCL_CUDA_CHECK(cudaMemcpy(host.data(), o, bytes, cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < count; ++i)
        if (host[i] != expect)
          throw error(status::internal, "warm-up " + std::string(what) + " on shape '" + s.shape + "' group " +
                                            std::to_string(s.group_index) + " gave " + std::to_string(host[i]) +
                                            " at element " + std::to_string(i) + ", expected " + std::to_string(expect));
    };
    auto fill = [&](void* i, void* o) {
      RECCL_CUDA_CHECK(cudaMemsetAsync(i, s.position + 1, bytes, stream_));
      RECCL_CUDA_CHECK(cudaMemsetAsync(o, 0xEE, bytes, stream_));
    };
    bool const win_ok = s.windows.size() >= 2 && s.window_bytes[0] >= bytes && s.window_bytes[1] >= bytes;

    // NCCL: plain memory (the lazy connect), then the windows (its symmetric kernels)
    fill(in, out);
    RECCL_NCCL_CHECK(s.comm, ncclAllReduce(in, out, count, ncclInt32, ncclSum, s.comm, stream_));
    check(out, "NCCL all-reduce");
    if (win_ok) {
      fill(s.windows[0], s.windows[1]);
      RECCL_NCCL_CHECK(s.comm, ncclAllReduce(s.windows[0], s.windows[1], count, ncclInt32, ncclSum, s.comm, stream_));
      check(s.windows[1], "NCCL all-reduce on the windows");
    }
    // reccl: the windows (zero-copy) and plain memory (through its scratch window)
    if (s.rc) {
      if (win_ok) {
        fill(s.windows[0], s.windows[1]);
        s.rc->all_reduce(s.windows[0], s.windows[1], count, dtype::int32, redop::sum, stream_);
        check(s.windows[1], "reccl all-reduce on the windows");
      }
      fill(in, out);
      s.rc->all_reduce(in, out, count, dtype::int32, redop::sum, stream_);
      check(out, "reccl all-reduce");
      s.rc->check();
    }
  }

  std::uint64_t memory_in_use() const {
    RECCL_CUDA_CHECK(cudaSetDevice(dev_));
    std::size_t free = 0, total = 0;
    RECCL_CUDA_CHECK(cudaMemGetInfo(&free, &total));
    return total - free;
  }

  /// Max over the parent's ranks (an NCCL all-reduce on the parent; start-up path only).
  std::uint64_t agree_max(std::uint64_t v) {
    RECCL_CUDA_CHECK(cudaSetDevice(dev_));
    RECCL_CUDA_CHECK(cudaMemcpyAsync(agree_buf_, &v, sizeof(v), cudaMemcpyHostToDevice, stream_));
    RECCL_NCCL_CHECK(parent_, ncclAllReduce(agree_buf_, agree_buf_, 1, ncclUint64, ncclMax, parent_, stream_));
    std::uint64_t r = 0;
    RECCL_CUDA_CHECK(cudaMemcpyAsync(&r, agree_buf_, sizeof(r), cudaMemcpyDeviceToHost, stream_));
    RECCL_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return r;
  }

  bool in_flight(nccl_group const& g) const { return g.in_flight(); }

  bool wait_idle(nccl_group const& g, std::chrono::steady_clock::time_point deadline) const {
    while (g.in_flight()) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    }
    return true;
  }

  teardown_job make_teardown(nccl_group&& g, teardown_kind k) {
    return [s = std::move(g.s_), k, drain = opt_.drain_bound]() -> teardown_outcome {
      teardown_outcome o;
      o.used = k;
      std::string notes;
      auto nccl_ok = [&](ncclResult_t r, char const* what) {
        if (r == ncclSuccess) return true;
        o.ok = false;
        notes += std::string(notes.empty() ? "" : "; ") + what + ": " + ncclGetErrorString(r);
        return false;
      };
      auto cuda_ok = [&](cudaError_t e, char const* what) {
        if (e == cudaSuccess) return true;
        o.ok = false;
        notes += std::string(notes.empty() ? "" : "; ") + what + ": " + cudaGetErrorString(e);
        (void)cudaGetLastError();  // recorded in the outcome: clear it for later, unrelated checks
        return false;
      };
      cuda_ok(cudaSetDevice(s->dev), "cudaSetDevice");  // the worker thread starts on device 0
      if (k == teardown_kind::finalize && s->fenced) {
        auto const deadline = std::chrono::steady_clock::now() + drain;
        while (cudaEventQuery(s->fence) == cudaErrorNotReady) {  // another error: the work is over (failed)
          if (std::chrono::steady_clock::now() >= deadline) {
            o.used = teardown_kind::abort;
            notes = "in-flight work did not finish within the drain bound: aborted";
            break;
          }
          std::this_thread::sleep_for(std::chrono::microseconds(100));
        }
      }
      if (o.used == teardown_kind::revoke && detail::nccl_revoke() == nullptr) {
        o.used = teardown_kind::abort;
        notes = "ncclCommRevoke not in the loaded NCCL: aborted";
      }
      ncclComm_t const c = s->comm;
      s->comm = nullptr;  // whatever happens below, the state's destructor must not abort it again
      switch (o.used) {
        case teardown_kind::finalize:
          s->rc.reset();
          s->windows.clear();
          if (nccl_ok(ncclCommFinalize(c), "ncclCommFinalize")) nccl_ok(ncclCommDestroy(c), "ncclCommDestroy");
          else nccl_ok(ncclCommAbort(c), "ncclCommAbort");
          break;
        case teardown_kind::revoke:
          nccl_ok(detail::nccl_revoke()(c, 0), "ncclCommRevoke");
          s->rc.reset();
          s->windows.clear();
          nccl_ok(ncclCommDestroy(c), "ncclCommDestroy");
          break;
        case teardown_kind::abort:
          nccl_ok(ncclCommAbort(c), "ncclCommAbort");
          if (s->rc) {
            new std::optional<nvlink_communicator>(std::move(s->rc));  // registered on the aborted comm: left allocated
            s->rc.reset();
            notes += std::string(notes.empty() ? "" : "; ") + "reccl windows of the aborted communicator left allocated";
          }
          break;
      }
      if (s->fence != nullptr) {
        cuda_ok(cudaEventDestroy(s->fence), "cudaEventDestroy");
        s->fence = nullptr;
      }
      o.message = notes;
      return o;
    };
  }

 private:
  ncclComm_t parent_;
  nccl_pool_options opt_;
  int rank_ = 0, size_ = 0, dev_ = 0;
  cudaStream_t stream_ = nullptr;
  void* agree_buf_ = nullptr;
};

static_assert(PoolBackend<nccl_pool_backend>);

/// Re-captures the engine's step graph after a switch: `record(stream)` issues the step's work on
/// `stream` under capture; `exec` then runs it -- updated in place (cudaGraphExecUpdate) when it
/// already holds a graph of the same shape, instantiated afresh otherwise. Returns true if it was
/// updated in place. Timed apart from the switch: the switch itself never captures.
template <class F>
bool recapture(cudaStream_t stream, cudaGraphExec_t& exec, F&& record) {
  cudaGraph_t graph = nullptr;
  RECCL_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  try {
    record(stream);
  } catch (...) {  // the error in flight is what matters: failures here are only reported
    RECCL_CUDA_REPORT(cudaStreamEndCapture(stream, &graph));
    if (graph != nullptr) RECCL_CUDA_REPORT(cudaGraphDestroy(graph));
    throw;
  }
  RECCL_CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
  struct graph_guard {
    cudaGraph_t g;
    ~graph_guard() { RECCL_CUDA_REPORT(cudaGraphDestroy(g)); }
  } gg{graph};
  if (exec != nullptr) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(exec, graph, &info) == cudaSuccess) return true;
    (void)cudaGetLastError();  // clears the failed update's error (its result is that error)
    cudaGraphExec_t const old = exec;
    exec = nullptr;
    RECCL_CUDA_CHECK(cudaGraphExecDestroy(old));
  }
  RECCL_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  return false;
}

}  // namespace reccl
