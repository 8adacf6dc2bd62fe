// libreccl_nccl.so -- NCCL's collective API served by reccl's NVLink path, everything else by NCCL.
//
//   LD_PRELOAD=libreccl_nccl.so ./all_reduce_perf ...        (or link it before libnccl)
//
// Exports ncclAllReduce, ncclReduceScatter, ncclAllGather, ncclBroadcast, ncclBcast, ncclAlltoAll
// and, to keep its own state right, ncclGroupStart/End, ncclCommFinalize/Destroy/Abort and
// ncclCommGetAsyncError. Every other NCCL symbol is not defined here, so the dynamic linker binds
// it to the real NCCL; the calls reccl does not serve go to the real NCCL's definition, found with
// dlsym(RTLD_NEXT) (or in libnccl.so.2 when the shim was loaded after it). Which calls are served
// and when state is built: shim/include/reccl_shim/dispatch.hpp and shim/src/nccl_map.hpp.
//
// Environment (read once):
//   RECCL_NCCL=0                 forward everything (reccl off)
//   RECCL_NCCL_COLLS=a,b         serve only these (all_reduce, reduce_scatter, all_gather,
//                                broadcast, all_to_all; default: all five)
//   RECCL_NCCL_ALLOCATOR=equal|proportional|texcp
//                                equal (default): the tuned fixed-split kernels. proportional or
//                                texcp: messages of at least RECCL_NCCL_ADAPTIVE_MIN_BYTES (default
//                                16 MiB) run on an adaptive lane whose split follows the telemetry
//   RECCL_NCCL_TIMEOUT_MS=n      deadline of every device-side wait (default 10000)
//   RECCL_NCCL_QUIET=1           no informational log lines (errors are still printed)
//   RECCL_NCCL_SERVED_AT_EXIT=1  at exit, print the calls reccl served, per collective, as one line
//                                "reccl: served at exit: all_reduce=N reduce_scatter=N all_gather=N
//                                broadcast=N all_to_all=N total=N" (for tools that run a program
//                                under the shim and must know that reccl, not NCCL, ran its calls)
//
// Memory and lifetime: reccl's state of a communicator (scratch window, device communicator, and
// for an adaptive allocator a second lane) is built at its first served collective, on every rank
// together (two agreement all-reduces make every rank serve or every rank forward), and released
// at ncclCommFinalize/Destroy, before NCCL's own teardown; ncclCommAbort leaves it allocated.
// Errors: bad arguments are returned at the call (ncclInvalidArgument, with a log line); a device
// wait that fails (a rank that never arrives, ranks that disagree on count/dtype/op) is reported by
// ncclCommGetAsyncError (ncclRemoteError for a timeout, ncclInvalidUsage for a mismatch).
#include <dlfcn.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <reccl/host/adaptive.hpp>
#include <reccl/host/communicator.hpp>
#include <reccl/policy/allocator/proportional.hpp>
#include <reccl/policy/allocator/texcp.hpp>
#include <reccl_shim/dispatch.hpp>
#include <reccl_shim/reccl_nccl.h>

#include "nccl_map.hpp"

#define RECCL_SHIM_EXPORT extern "C" __attribute__((visibility("default")))

namespace reccl::shim {
namespace {

// ---- the real NCCL ---------------------------------------------------------------------------------

void* real_symbol(char const* name) {
  void* p = dlsym(RTLD_NEXT, name);
  if (p == nullptr) {
    // loaded before libnccl (or libnccl opened with RTLD_LOCAL): look in it directly
    static void* lib = [] {
      void* h = dlopen("libnccl.so.2", RTLD_LAZY | RTLD_NOLOAD);
      return h != nullptr ? h : dlopen("libnccl.so.2", RTLD_LAZY);
    }();
    if (lib != nullptr) p = dlsym(lib, name);
  }
  if (p == nullptr) {
    std::fprintf(stderr, "reccl: fatal: the real NCCL's %s was not found (%s)\n", name, dlerror());
    std::abort();
  }
  return p;
}

/// The real NCCL's `name`, resolved once per call site.
#define RECCL_REAL(name)                                                                  \
  ([] {                                                                                   \
    static auto const fn = reinterpret_cast<decltype(&::name)>(::reccl::shim::real_symbol(#name)); \
    return fn;                                                                            \
  }())

/// Set while reccl itself calls NCCL (building or releasing state): the exported functions then
/// go straight to the real NCCL, so reccl's own ncclGroupStart/End are not taken for the user's.
thread_local int passthrough_depth = 0;
struct passthrough_scope {
  passthrough_scope() { ++passthrough_depth; }
  ~passthrough_scope() { --passthrough_depth; }
  passthrough_scope(passthrough_scope const&) = delete;
  passthrough_scope& operator=(passthrough_scope const&) = delete;
};
bool passthrough() { return passthrough_depth > 0; }

/// Restores the caller's current device (reccl's calls select the communicator's).
struct device_restore {
  int dev = -1;
  device_restore() {
    if (cudaGetDevice(&dev) != cudaSuccess) dev = -1;
  }
  ~device_restore() {  // cannot throw: a failure is reported on stderr
    if (dev >= 0) RECCL_CUDA_REPORT(cudaSetDevice(dev));
  }
  device_restore(device_restore const&) = delete;
  device_restore& operator=(device_restore const&) = delete;
};

// ---- configuration ---------------------------------------------------------------------------------

enum class allocator_choice { equal, proportional, texcp };

struct settings {
  bool enabled = true;
  bool quiet = false;
  bool served_at_exit = false;
  bool serve[5] = {true, true, true, true, true};  // by reccl::collective
  allocator_choice alloc = allocator_choice::equal;
  std::uint64_t adaptive_min_bytes = 16ull << 20;
  std::uint64_t timeout_ns = 10'000'000'000ull;
  std::string problems;  // unrecognised values, reported in the init line

  static settings read() {
    settings s;
    auto env = [](char const* n) -> std::string {
      char const* v = std::getenv(n);
      return v != nullptr ? v : "";
    };
    std::string const on = env("RECCL_NCCL");
    s.enabled = !(on == "0" || on == "off" || on == "false");
    s.quiet = env("RECCL_NCCL_QUIET") == "1";
    s.served_at_exit = env("RECCL_NCCL_SERVED_AT_EXIT") == "1";
    if (std::string const colls = env("RECCL_NCCL_COLLS"); !colls.empty()) {
      for (bool& b : s.serve) b = false;
      std::size_t pos = 0;
      while (pos <= colls.size()) {
        std::size_t const comma = colls.find(',', pos);
        std::size_t const end = comma == std::string::npos ? colls.size() : comma;
        std::string const name = colls.substr(pos, end - pos);
        bool found = false;
        for (int c = 0; c < 5; ++c)
          if (name == reccl::name(static_cast<collective>(c))) s.serve[c] = found = true;
        if (!found && !name.empty()) s.problems += " unknown collective '" + name + "' in RECCL_NCCL_COLLS;";
        pos = end + 1;
      }
    }
    std::string const a = env("RECCL_NCCL_ALLOCATOR");
    if (a == "proportional") s.alloc = allocator_choice::proportional;
    else if (a == "texcp") s.alloc = allocator_choice::texcp;
    else if (!a.empty() && a != "equal") s.problems += " unknown RECCL_NCCL_ALLOCATOR '" + a + "' (using equal);";
    if (std::string const m = env("RECCL_NCCL_ADAPTIVE_MIN_BYTES"); !m.empty()) s.adaptive_min_bytes = std::strtoull(m.c_str(), nullptr, 10);
    if (std::string const t = env("RECCL_NCCL_TIMEOUT_MS"); !t.empty()) {
      std::uint64_t const ms = std::strtoull(t.c_str(), nullptr, 10);
      if (ms > 0) s.timeout_ns = ms * 1'000'000ull;
      else s.problems += " RECCL_NCCL_TIMEOUT_MS must be a positive integer;";
    }
    return s;
  }
  char const* alloc_name() const {
    return alloc == allocator_choice::texcp ? "texcp" : alloc == allocator_choice::proportional ? "proportional" : "equal";
  }
};

std::atomic<std::uint64_t> total_served{0};
std::atomic<std::uint64_t> served_by_kind[5]{};  // by reccl::collective

/// RECCL_NCCL_SERVED_AT_EXIT's line (an atexit handler: counters only, no CUDA or NCCL call).
void print_served() {
  std::string line = "reccl: served at exit:";
  for (int c = 0; c < 5; ++c)
    line += " " + std::string(reccl::name(static_cast<collective>(c))) + "=" +
            std::to_string(served_by_kind[c].load(std::memory_order_relaxed));
  line += " total=" + std::to_string(total_served.load(std::memory_order_relaxed));
  std::fprintf(stderr, "%s\n", line.c_str());
}

settings const& config() {
  static settings const s = [] {
    settings x = settings::read();
    int v = 0;
    if (RECCL_REAL(ncclGetVersion)(&v) != ncclSuccess) v = 0;  // only printed: "NCCL 0" says it is unknown
    std::string line;
    if (!x.enabled) {
      line = "reccl: RECCL_NCCL=0: every NCCL call goes to NCCL " + std::to_string(v);
    } else {
      line = "reccl: libreccl_nccl serves";
      bool first = true;
      for (int c = 0; c < 5; ++c)
        if (x.serve[c]) {
          line += (first ? " " : ", ") + std::string(reccl::name(static_cast<collective>(c)));
          first = false;
        }
      if (first) line += " nothing";
      line += std::string(" (allocator ") + x.alloc_name() + "; NCCL " + std::to_string(v) +
              " serves everything else, communicators spanning nodes and dtype/op pairs reccl lacks)";
    }
    if (!x.problems.empty()) line += "; warning:" + x.problems;
    if (!x.quiet || !x.problems.empty()) std::fprintf(stderr, "%s\n", line.c_str());
    if (x.served_at_exit && std::atexit(print_served) != 0)
      std::fprintf(stderr, "reccl: warning: RECCL_NCCL_SERVED_AT_EXIT=1, but the exit handler could not be registered\n");
    return x;
  }();
  return s;
}

void info(std::string const& m) {
  if (!config().quiet) std::fprintf(stderr, "%s\n", m.c_str());
}
void fail(std::string const& m) { std::fprintf(stderr, "%s\n", m.c_str()); }

// ---- the backend: reccl's communicators on NCCL's ------------------------------------------------

struct served_comm {
  nvlink_communicator comm;
  std::unique_ptr<adaptive_lane<allocator::texcp>> texcp_lane;
  std::unique_ptr<adaptive_lane<allocator::proportional>> proportional_lane;
  cudaEvent_t order = nullptr;   ///< orders this communicator's calls across streams, as NCCL does
  cudaStream_t last = nullptr;
  bool has_last = false;
  cudaStream_t poll = nullptr;   ///< reads the lanes' status words without waiting for the user's streams
  std::uint32_t* status_h = nullptr;  // pinned, one word per lane
  std::chrono::steady_clock::time_point last_poll{};
  ncclResult_t async = ncclSuccess;
  std::atomic<std::uint64_t> served{0};  ///< calls launched (read by other threads)

  explicit served_comm(nvlink_communicator&& c) : comm(std::move(c)) {}
  served_comm(served_comm const&) = delete;
  served_comm& operator=(served_comm const&) = delete;
  ~served_comm() {  // cannot throw: failures are reported on stderr
    texcp_lane.reset();
    proportional_lane.reset();
    RECCL_CUDA_REPORT(cudaSetDevice(comm.device()));
    if (order != nullptr) RECCL_CUDA_REPORT(cudaEventDestroy(order));
    if (poll != nullptr) RECCL_CUDA_REPORT(cudaStreamDestroy(poll));
    if (status_h != nullptr) RECCL_CUDA_REPORT(cudaFreeHost(status_h));
    // comm (declared first) is destroyed last: synchronise, device communicator, windows
  }
  bool adaptive() const { return texcp_lane != nullptr || proportional_lane != nullptr; }
};

/// Every rank's verdict on `ok`, for every communicator of `cs` (one grouped int32 min all-reduce
/// on the real NCCL): true only if every rank of every one said yes. So a rank that cannot build
/// its state never leaves the others serving, or waiting in a collective it will not join.
/// A rank joins the all-reduce whatever failed before it (its peers would wait in NCCL forever
/// otherwise): its flag falls back to pinned host memory if cudaMalloc fails, its stream to the
/// legacy default stream if a stream cannot be created, and it then says no. Only a rank with
/// neither device nor pinned memory for four bytes stays out.
bool all_ranks_agree(std::vector<ncclComm_t> const& cs, bool ok) {
  std::vector<int*> flag(cs.size(), nullptr);
  std::vector<bool> pinned(cs.size(), false);
  std::vector<cudaStream_t> st(cs.size(), nullptr);
  bool agreed = ok;
  bool joinable = true;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    int dev = 0;
    bool fine = RECCL_REAL(ncclCommCuDevice)(cs[i], &dev) == ncclSuccess && cudaSetDevice(dev) == cudaSuccess;
    if (cudaMalloc(&flag[i], sizeof(int)) != cudaSuccess) {
      (void)cudaGetLastError();  // handled here (fallback below): clear it for later checks
      fine = false;
      flag[i] = nullptr;
      void* h = nullptr;
      if (cudaHostAlloc(&h, sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable) == cudaSuccess) {
        flag[i] = static_cast<int*>(h);
        pinned[i] = true;
      }
    }
    if (cudaStreamCreateWithFlags(&st[i], cudaStreamNonBlocking) != cudaSuccess) {
      (void)cudaGetLastError();  // handled here (fallback below): clear it for later checks
      fine = false;
      st[i] = nullptr;  // the legacy default stream
    }
    agreed = agreed && fine;
    joinable = joinable && flag[i] != nullptr;
  }
  int const mine = agreed ? 1 : 0;
  for (std::size_t i = 0; i < cs.size(); ++i) {
    if (flag[i] == nullptr) continue;
    if (pinned[i]) *flag[i] = mine;
    else if (cudaMemcpy(flag[i], &mine, sizeof(int), cudaMemcpyHostToDevice) != cudaSuccess) {
      agreed = false;  // still joins, with a zeroed flag if the GPU takes even that
      // Unchecked on purpose: if even this fails the GPU is unusable (a sticky error), and the
      // all-reduce below fails on this rank too; there is nothing better to send.
      (void)cudaMemset(flag[i], 0, sizeof(int));
    }
  }
  if (joinable) {
    agreed = RECCL_REAL(ncclGroupStart)() == ncclSuccess && agreed;  // joins even so: its peers wait for it
    for (std::size_t i = 0; i < cs.size(); ++i)
      agreed = RECCL_REAL(ncclAllReduce)(flag[i], flag[i], 1, ncclInt32, ncclMin, cs[i], st[i]) == ncclSuccess && agreed;
    agreed = RECCL_REAL(ncclGroupEnd)() == ncclSuccess && agreed;
  } else {
    agreed = false;  // no memory at all for the flag: this rank cannot join (its peers wait in NCCL)
  }
  for (std::size_t i = 0; i < cs.size(); ++i) {
    int all = 0;
    int dev = 0;
    agreed = RECCL_REAL(ncclCommCuDevice)(cs[i], &dev) == ncclSuccess && cudaSetDevice(dev) == cudaSuccess && agreed;
    if (joinable) {
      bool const done = cudaStreamSynchronize(st[i]) == cudaSuccess;
      if (pinned[i]) all = *flag[i];
      else if (!done || cudaMemcpy(&all, flag[i], sizeof(int), cudaMemcpyDeviceToHost) != cudaSuccess) all = 0;
      agreed = agreed && done && all == 1;
    }
    // cleanup: a failure is reported on stderr; the verdict is already made
    if (st[i] != nullptr) RECCL_CUDA_REPORT(cudaStreamDestroy(st[i]));
    if (flag[i] != nullptr) RECCL_CUDA_REPORT(pinned[i] ? cudaFreeHost(flag[i]) : cudaFree(flag[i]));
  }
  return agreed;
}

struct nccl_backend {
  using comm_type = ncclComm_t;
  using state_type = served_comm;

  std::vector<std::unique_ptr<served_comm>> create(std::vector<ncclComm_t> const& cs) {
    passthrough_scope ps;
    device_restore dr;
    settings const& s = config();
    nvlink_config cfg;
    cfg.lanes = s.alloc == allocator_choice::equal ? 1 : 2;
    cfg.timeout_ns = s.timeout_ns;
    // Before any collective setup call: can every rank allocate its scratch? (the failure that is
    // local to one rank; the collective calls that follow fail on every rank alike)
    bool can = true;
    for (ncclComm_t c : cs) {
      int n = 0, dev = 0;
      std::size_t free_b = 0, total_b = 0;
      can = can && RECCL_REAL(ncclCommCount)(c, &n) == ncclSuccess && n >= 1 && n <= device::max_lsa &&
            RECCL_REAL(ncclCommCuDevice)(c, &dev) == ncclSuccess && cudaSetDevice(dev) == cudaSuccess &&
            cudaMemGetInfo(&free_b, &total_b) == cudaSuccess &&
            free_b >= device::make_lsa_layout(n, cfg.lanes, cfg.max_ctas, cfg.one_shot_slot_bytes, cfg.ring_chunk_bytes,
                                              cfg.ring_depth).total_bytes() + (std::size_t{256} << 20);
    }
    if (!all_ranks_agree(cs, can))
      throw reccl::error(status::invalid_argument,
                         "a rank cannot hold reccl's scratch window (GPU memory, rank count) or its CUDA state failed");
    std::vector<nvlink_communicator> made;
    std::string failure;
    try {
      made = nvlink_communicator::create_all(cs, cfg);
    } catch (std::exception const& e) {
      failure = e.what();
    }
    // after: did every rank succeed? (a rank that failed alone must not be the only one forwarding)
    if (!all_ranks_agree(cs, failure.empty()))
      throw reccl::error(status::internal, failure.empty() ? "another rank failed to build reccl's state" : failure);
    std::vector<std::unique_ptr<served_comm>> out;
    std::vector<nvlink_communicator*> ptrs;
    for (auto& c : made) {
      out.push_back(std::make_unique<served_comm>(std::move(c)));
      served_comm& sc = *out.back();
      ptrs.push_back(&sc.comm);
      RECCL_CUDA_CHECK(cudaSetDevice(sc.comm.device()));
      RECCL_CUDA_CHECK(cudaEventCreateWithFlags(&sc.order, cudaEventDisableTiming));
      RECCL_CUDA_CHECK(cudaStreamCreateWithFlags(&sc.poll, cudaStreamNonBlocking));
      RECCL_CUDA_CHECK(cudaMallocHost(&sc.status_h, sizeof(std::uint32_t) * 2));
    }
    adaptive_options o;
    o.lane = 1;
    if (s.alloc == allocator_choice::texcp) {
      auto lanes = adaptive_lane<allocator::texcp>::create_all(ptrs, o);
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i]->texcp_lane = std::make_unique<adaptive_lane<allocator::texcp>>(std::move(lanes[i]));
    } else if (s.alloc == allocator_choice::proportional) {
      auto lanes = adaptive_lane<allocator::proportional>::create_all(ptrs, o);
      for (std::size_t i = 0; i < out.size(); ++i)
        out[i]->proportional_lane = std::make_unique<adaptive_lane<allocator::proportional>>(std::move(lanes[i]));
    }
    std::string ranks;
    for (auto const& sc : out) ranks += (ranks.empty() ? "" : ",") + std::to_string(sc->comm.rank());
    info("reccl: serving " + std::to_string(out.size()) + " communicator(s) of " + std::to_string(out.front()->comm.size()) +
         " ranks (rank " + ranks + " here; allocator " + s.alloc_name() + ")");
    return out;
  }

  int run(served_comm& s, request const& r) {
    device_restore dr;
    auto const stream = static_cast<cudaStream_t>(r.stream);
    try {
      RECCL_CUDA_CHECK(cudaSetDevice(s.comm.device()));
      order_after_last(s, stream);
      std::uint64_t const bytes = static_cast<std::uint64_t>(r.count) * size_of(r.type);
      if (s.adaptive() && bytes >= config().adaptive_min_bytes) {
        if (s.texcp_lane) launch(*s.texcp_lane, r, stream);
        else launch(*s.proportional_lane, r, stream);
      } else {
        launch(s.comm, r, stream);
      }
      s.last = stream;
      s.has_last = true;
      ++s.served;
      total_served.fetch_add(1, std::memory_order_relaxed);
      served_by_kind[static_cast<int>(r.coll)].fetch_add(1, std::memory_order_relaxed);
      return ncclSuccess;
    } catch (reccl::error const& e) {
      fail(std::string("reccl: ") + std::string(reccl::name(r.coll)) + ": " + e.what());
      return e.code() == status::invalid_argument ? ncclInvalidArgument : ncclInternalError;
    }
  }

  bool capturing(void* stream) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(static_cast<cudaStream_t>(stream), &st) != cudaSuccess) return true;  // be safe
    return st != cudaStreamCaptureStatusNone;
  }
  int real_group_start() { return RECCL_REAL(ncclGroupStart)(); }
  int real_group_end() { return RECCL_REAL(ncclGroupEnd)(); }
  void log(std::string const& m) { fail(m); }

  /// The first device-side failure on any lane, polled at most once a millisecond (the poll is a
  /// small copy on a private stream: it never waits for the user's work). Called under the
  /// dispatcher's lock, from any thread; it touches only the poll's own fields.
  ncclResult_t async_error(served_comm& s) {
    if (s.async != ncclSuccess) return s.async;
    auto const now = std::chrono::steady_clock::now();
    if (now - s.last_poll < std::chrono::milliseconds(1)) return ncclSuccess;
    s.last_poll = now;
    device_restore dr;
    // the caller may be a watchdog thread while another thread captures a graph in global mode:
    // the poll's copy and synchronisation must not invalidate that capture
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaError_t const e = cudaThreadExchangeStreamCaptureMode(&mode); e != cudaSuccess)
      return poll_failed(e, "cudaThreadExchangeStreamCaptureMode");
    struct restore_mode {
      cudaStreamCaptureMode m;
      ~restore_mode() { RECCL_CUDA_REPORT(cudaThreadExchangeStreamCaptureMode(&m)); }
    } restore{mode};
    int const lanes = s.comm.config().lanes;
    if (cudaError_t const e = cudaSetDevice(s.comm.device()); e != cudaSuccess) return poll_failed(e, "cudaSetDevice");
    for (int l = 0; l < lanes; ++l)
      if (cudaError_t const e = cudaMemcpyAsync(s.status_h + l, s.comm.lane_view(l).status(), sizeof(std::uint32_t),
                                                cudaMemcpyDeviceToHost, s.poll);
          e != cudaSuccess)
        return poll_failed(e, "cudaMemcpyAsync (status word)");
    if (cudaError_t const e = cudaStreamSynchronize(s.poll); e != cudaSuccess) return poll_failed(e, "cudaStreamSynchronize");
    for (int l = 0; l < lanes; ++l) {
      auto const st = static_cast<status>(s.status_h[l]);
      if (st == status::ok || st == status::recovered) continue;
      s.async = st == status::timeout ? ncclRemoteError : st == status::mismatch ? ncclInvalidUsage : ncclInternalError;
      fail("reccl: rank " + std::to_string(s.comm.rank()) + ", lane " + std::to_string(l) + ": " +
           std::string(reccl::name(st)) +
           (st == status::timeout    ? " (a peer did not arrive within the deadline)"
            : st == status::mismatch ? " (ranks disagree on count, dtype, op or root)"
                                     : "") +
           "; the communicator must be rebuilt");
      break;
    }
    return s.async;
  }

 private:
  /// The status-word poll could not run: say why; the caller gets ncclUnhandledCudaError (and
  /// polls again on its next call: a failed poll is not a device-side failure of the lanes).
  ncclResult_t poll_failed(cudaError_t e, char const* what) {
    fail(std::string("reccl: polling the lanes' status: ") + what + ": " + cudaGetErrorString(e));
    (void)cudaGetLastError();  // reported above: clear it for later, unrelated checks
    return ncclUnhandledCudaError;
  }

  /// NCCL runs one communicator's calls in issue order whatever their streams; reccl's lanes
  /// need that too. Streams under capture are left alone (their order is the graph's). A stream
  /// whose capture status cannot be read fails the call (reccl::error) rather than running
  /// unordered.
  static void order_after_last(served_comm& s, cudaStream_t stream) {
    if (!s.has_last || s.last == stream) return;
    cudaStreamCaptureStatus a = cudaStreamCaptureStatusNone, b = cudaStreamCaptureStatusNone;
    RECCL_CUDA_CHECK(cudaStreamIsCapturing(s.last, &a));
    RECCL_CUDA_CHECK(cudaStreamIsCapturing(stream, &b));
    if (a != cudaStreamCaptureStatusNone || b != cudaStreamCaptureStatusNone) return;
    RECCL_CUDA_CHECK(cudaEventRecord(s.order, s.last));
    RECCL_CUDA_CHECK(cudaStreamWaitEvent(stream, s.order, 0));
  }

  template <class C>
  static void launch(C& c, request const& r, cudaStream_t st) {
    switch (r.coll) {
      case collective::all_reduce: c.all_reduce(r.in, r.out, r.count, r.type, r.op, st); break;
      case collective::reduce_scatter: c.reduce_scatter(r.in, r.out, r.count, r.type, r.op, st); break;
      case collective::all_gather: c.all_gather(r.in, r.out, r.count, r.type, st); break;
      case collective::broadcast: c.broadcast(r.in, r.out, r.count, r.type, r.root, st); break;
      case collective::all_to_all: c.all_to_all(r.in, r.out, r.count, r.type, st); break;
    }
  }
};

// Never destroyed: a static destructor would release GPU state after the CUDA runtime is gone.
nccl_backend& backend() {
  static nccl_backend* b = new nccl_backend;
  return *b;
}
dispatcher<nccl_backend>& dispatch() {
  static auto* d = new dispatcher<nccl_backend>(backend());
  return *d;
}

bool serving(collective c) {
  if (passthrough()) return false;
  settings const& s = config();
  return s.enabled && s.serve[static_cast<int>(c)];
}

template <class Fwd>
ncclResult_t submit(ncclComm_t comm, request const& r, Fwd fwd) {
  return static_cast<ncclResult_t>(dispatch().submit(comm, r, std::function<int()>([fwd] { return static_cast<int>(fwd()); })));
}

ncclResult_t reduction(collective c, void const* in, void* out, std::size_t count, ncclDataType_t t, ncclRedOp_t op,
                       ncclComm_t comm, cudaStream_t st, auto fwd) {
  if (!serving(c)) return fwd();
  std::optional<redop> const o = map_op(op);
  std::optional<dtype> const d = o ? map_reduction_type(t, *o) : std::nullopt;
  if (!d) return fwd();
  request r;
  r.coll = c;
  r.in = in;
  r.out = out;
  r.count = count;
  r.type = *d;
  r.op = *o;
  r.stream = st;
  return submit(comm, r, fwd);
}

ncclResult_t copy(collective c, void const* in, void* out, std::size_t count, ncclDataType_t t, int root, ncclComm_t comm,
                  cudaStream_t st, auto fwd) {
  if (!serving(c)) return fwd();
  std::optional<words> const w = map_bytes(t, count);
  if (!w) return fwd();
  if (c == collective::all_to_all && in == out) return fwd();  // reccl's all-to-all is out-of-place
  request r;
  r.coll = c;
  r.in = in;
  r.out = out;
  r.count = w->count;
  r.type = w->type;
  r.root = root;
  r.stream = st;
  return submit(comm, r, fwd);
}

void release(ncclComm_t comm) {
  if (passthrough() || !config().enabled) return;
  passthrough_scope ps;
  device_restore dr;
  dispatch().destroy(comm);
}

}  // namespace
}  // namespace reccl::shim

// ---- the exported NCCL API ---------------------------------------------------------------------------

using reccl::collective;
namespace shim = reccl::shim;

RECCL_SHIM_EXPORT ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                             ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return shim::reduction(collective::all_reduce, sendbuff, recvbuff, count, datatype, op, comm, stream, [=] {
    return RECCL_REAL(ncclAllReduce)(sendbuff, recvbuff, count, datatype, op, comm, stream);
  });
}

RECCL_SHIM_EXPORT ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                 cudaStream_t stream) {
  return shim::reduction(collective::reduce_scatter, sendbuff, recvbuff, recvcount, datatype, op, comm, stream, [=] {
    return RECCL_REAL(ncclReduceScatter)(sendbuff, recvbuff, recvcount, datatype, op, comm, stream);
  });
}

RECCL_SHIM_EXPORT ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                             ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return shim::copy(collective::all_gather, sendbuff, recvbuff, sendcount, datatype, 0, comm, stream, [=] {
    return RECCL_REAL(ncclAllGather)(sendbuff, recvbuff, sendcount, datatype, comm, stream);
  });
}

RECCL_SHIM_EXPORT ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                             int root, ncclComm_t comm, cudaStream_t stream) {
  return shim::copy(collective::broadcast, sendbuff, recvbuff, count, datatype, root, comm, stream, [=] {
    return RECCL_REAL(ncclBroadcast)(sendbuff, recvbuff, count, datatype, root, comm, stream);
  });
}

RECCL_SHIM_EXPORT ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                                         cudaStream_t stream) {
  return shim::copy(collective::broadcast, buff, buff, count, datatype, root, comm, stream,
                    [=] { return RECCL_REAL(ncclBcast)(buff, count, datatype, root, comm, stream); });
}

RECCL_SHIM_EXPORT ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                                            ncclComm_t comm, cudaStream_t stream) {
  return shim::copy(collective::all_to_all, sendbuff, recvbuff, count, datatype, 0, comm, stream, [=] {
    return RECCL_REAL(ncclAlltoAll)(sendbuff, recvbuff, count, datatype, comm, stream);
  });
}

RECCL_SHIM_EXPORT ncclResult_t ncclGroupStart() {
  ncclResult_t const r = RECCL_REAL(ncclGroupStart)();
  if (r == ncclSuccess && !shim::passthrough() && shim::config().enabled) shim::dispatch().group_start();
  return r;
}

RECCL_SHIM_EXPORT ncclResult_t ncclGroupEnd() {
  if (shim::passthrough() || !shim::config().enabled) return RECCL_REAL(ncclGroupEnd)();
  return static_cast<ncclResult_t>(shim::dispatch().group_end());
}

RECCL_SHIM_EXPORT ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  shim::release(comm);
  return RECCL_REAL(ncclCommFinalize)(comm);
}

RECCL_SHIM_EXPORT ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  shim::release(comm);
  return RECCL_REAL(ncclCommDestroy)(comm);
}

RECCL_SHIM_EXPORT ncclResult_t ncclCommAbort(ncclComm_t comm) {
  // An abort must not wait: reccl's state is unlinked and left allocated (its teardown would
  // synchronise the GPU, behind whatever hung, and call NCCL on the communicator being aborted).
  if (!shim::passthrough() && shim::config().enabled) (void)shim::dispatch().forget(comm).release();
  return RECCL_REAL(ncclCommAbort)(comm);
}

RECCL_SHIM_EXPORT ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  ncclResult_t const r = RECCL_REAL(ncclCommGetAsyncError)(comm, asyncError);
  if (r != ncclSuccess || asyncError == nullptr || *asyncError != ncclSuccess) return r;
  if (shim::passthrough() || !shim::config().enabled) return r;
  // often called from a watchdog thread: the state is reached under the dispatcher's lock
  shim::dispatch().with_served(comm, [&](shim::served_comm& s) { *asyncError = shim::backend().async_error(s); });
  return r;
}

// ---- introspection (reccl_nccl.h) ------------------------------------------------------------------

RECCL_SHIM_EXPORT int reccl_nccl_comm_state(ncclComm* comm) {
  if (!shim::config().enabled) return 2;
  switch (shim::dispatch().state_of(comm)) {
    case shim::comm_state::unknown: return 0;
    case shim::comm_state::ready: return 1;
    case shim::comm_state::forwarded: return 2;
  }
  return 0;
}

RECCL_SHIM_EXPORT unsigned long long reccl_nccl_served_calls(ncclComm* comm) {
  if (!shim::config().enabled) return 0;
  unsigned long long n = 0;
  shim::dispatch().with_served(comm, [&](shim::served_comm const& s) { n = s.served; });
  return n;
}

RECCL_SHIM_EXPORT unsigned long long reccl_nccl_total_served_calls(void) {
  return shim::total_served.load(std::memory_order_relaxed);
}
