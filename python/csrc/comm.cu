// python/csrc/comm.cu -- reccl.torch's communicator (comm.hpp) on reccl's host runtime: the one
// translation unit that instantiates device code.
#include "comm.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <string>
#include <utility>

#include <reccl/host/adaptive.hpp>
#include <reccl/host/communicator.hpp>
#include <reccl/host/p2p.hpp>

#include "adaptive.hpp"
#include "fused_allreduce_rmsnorm.cuh"

namespace reccl_torch {

namespace {

// Lane 0: the fast path; lane 1: the adaptive lane, when the policies ask for one.
constexpr int adaptive_lane_index = 1;

reccl::nvlink_config nvlink_options(options const& o) {
  reccl::nvlink_config c;
  c.lanes = wants_adaptive(o) ? 2 : 1;
  c.max_ctas = o.max_ctas;
  c.timeout_ns = o.timeout_ns;
  return c;
}

fused::limits fused_limits(options const& o) {
  fused::limits l;
  l.max_tokens = o.fused_max_tokens;
  l.max_hidden = o.fused_max_hidden;
  l.lamport_max_tokens = std::min<std::uint32_t>(l.lamport_max_tokens, o.fused_max_tokens);
  return l;
}

reccl::p2p_config fused_config(int nranks, options const& o) {
  reccl::p2p_config c;
  c.timeout_ns = o.timeout_ns;
  c.n_flags = 4096;  // the fused op takes 2 + its CTAs (at most the SM count); the composed lane 4 x 8
  c.plan_max_ctas = 1;
  c.plan_depth = 2;
  c.plan_slot_bytes = 512;
  c.data_bytes = fused::fused_allreduce_rmsnorm::window_bytes(nranks, fused_limits(o)) + (1u << 20);
  return c;
}

reccl::adaptive_options lane_options(options const& o) {
  reccl::adaptive_options a;
  a.lane = adaptive_lane_index;
  a.vts = o.vts;
  // the lane's own deadline for a VT that stalls while another finished stays below the
  // communicator's timeout (adaptive_lane's rule), and never above its 2 ms default
  a.vt_timeout_ns = std::min<std::uint64_t>(a.vt_timeout_ns, o.timeout_ns / 2);
  return a;
}

void check_options(options const& o) {
  if (o.transport != "p2p" && o.transport != "nccl")
    throw reccl::error(reccl::status::invalid_argument, "transport '" + o.transport + "' is not available; this build has p2p and nccl");
  (void)wants_adaptive(o);
  if (o.fused_max_tokens > 0 && fused::packs_per_thread(o.fused_max_hidden) == 0)
    throw reccl::error(reccl::status::invalid_argument,
                       "fused_max_hidden must be a multiple of 256 that splits into at most 512 threads of 1, 2 or 4 packs");
}

__global__ void empty_kernel() {}

/// The options the communicators' own handshakes do not compare (transport, policies, VT count,
/// the fused op's limits) must be equal on every rank: compared here, before anything is built, so a
/// difference fails creation on every rank instead of a collective much later.
void agree_on_options(int rank, int nranks, reccl::proxy::rank_exchange const& ex, options const& o) {
  std::string const key = o.transport + "|" + o.allocator + "|" + o.telemetry + "|" + std::to_string(o.vts) + "|" +
                          std::to_string(o.fused_max_tokens) + "|" + std::to_string(o.fused_max_hidden) + "|" +
                          std::to_string(o.max_ctas);
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : key) h = (h ^ ch) * 1099511628211ull;
  std::vector<std::uint64_t> all(static_cast<std::size_t>(nranks));
  ex(&h, all.data(), sizeof(h));
  for (int r = 0; r < nranks; ++r)
    if (all[static_cast<std::size_t>(r)] != h)
      throw reccl::error(reccl::status::mismatch,
                         "rank " + std::to_string(r) + " created its communicator with other options than rank " +
                             std::to_string(rank) + " (transport, allocator, telemetry, vts, max_ctas or the fused limits)",
                         r);
}

}  // namespace

double empty_launch_us(int device, int calls) {
  RECCL_CUDA_CHECK(cudaSetDevice(device));
  cudaStream_t s = nullptr;
  RECCL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(1);
  cfg.blockDim = dim3(32);
  cfg.stream = s;
  RECCL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, empty_kernel));  // loads the kernel before the clock starts
  RECCL_CUDA_CHECK(cudaStreamSynchronize(s));
  auto const t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < calls; ++i) RECCL_CUDA_CHECK(cudaLaunchKernelEx(&cfg, empty_kernel));
  auto const t1 = std::chrono::steady_clock::now();
  RECCL_CUDA_CHECK(cudaStreamSynchronize(s));
  RECCL_CUDA_CHECK(cudaStreamDestroy(s));
  return std::chrono::duration<double, std::micro>(t1 - t0).count() / calls;
}

std::vector<std::string> const& adaptive_allocators() {
  static std::vector<std::string> const names{"equal", "proportional", "texcp", "aimd"};
  return names;
}

bool wants_adaptive(options const& o) {
  auto bad = [](std::string const& why) { throw reccl::error(reccl::status::invalid_argument, why); };
  auto const& names = adaptive_allocators();
  if (std::find(names.begin(), names.end(), o.allocator) == names.end())
    bad("allocator '" + o.allocator + "' is not available; this build has equal, proportional, texcp and aimd");
  if (o.telemetry != "none" && o.telemetry != "stalls")
    bad("telemetry '" + o.telemetry + "' is not available; this build has none and stalls");
  if (o.allocator == "equal" && o.telemetry == "none") return false;
  if (o.telemetry == "none") bad("allocator '" + o.allocator + "' adapts from measurements: it needs telemetry 'stalls'");
  if (o.vts < 1 || o.vts > reccl::max_vts) bad("vts must be in [1, " + std::to_string(reccl::max_vts) + "]");
  return true;
}

std::unique_ptr<adaptive_path> make_adaptive_path(std::string const& allocator, std::string const& telemetry,
                                                  reccl::nvlink_communicator& c, reccl::adaptive_options const& o) {
  if (telemetry != "stalls") throw reccl::error(reccl::status::invalid_argument, "the adaptive lane needs telemetry 'stalls'");
  if (allocator == "equal") return make_adaptive_equal(c, o);
  if (allocator == "proportional") return make_adaptive_proportional(c, o);
  if (allocator == "texcp") return make_adaptive_texcp(c, o);
  if (allocator == "aimd") return make_adaptive_aimd(c, o);
  throw reccl::error(reccl::status::invalid_argument, "allocator '" + allocator + "' is not available");
}

struct comm::impl {
  std::shared_ptr<std::atomic<bool>> alone = std::make_shared<std::atomic<bool>>(false);
  ncclComm_t nccl = nullptr;  // transport "nccl" only: the communicator nv is built on
  std::unique_ptr<reccl::nvlink_communicator> nv;
  std::unique_ptr<adaptive_path> lane;  // with adaptive policies only
  std::unique_ptr<reccl::p2p_communicator> p2p;
  std::unique_ptr<fused::fused_allreduce_rmsnorm> fused;
  options opt;
  bool loopback = false;

  void require_open() const {
    if (!nv) throw reccl::error(reccl::status::invalid_argument, "reccl.torch: the communicator is closed");
  }
  /// Collective (close()): every rank's windows are deregistered, then the NCCL communicator ends.
  void teardown() {
    fused.reset();
    p2p.reset();
    lane.reset();
    nv.reset();
    if (nccl != nullptr) {
      RECCL_NCCL_CHECK(nccl, ncclCommFinalize(nccl));
      ncclComm_t const n = std::exchange(nccl, nullptr);  // no second teardown if the destroy fails
      RECCL_NCCL_CHECK(n, ncclCommDestroy(n));
    }
  }
  adaptive_path& require_lane() const {
    require_open();
    if (!lane)
      throw reccl::error(reccl::status::invalid_argument,
                         "reccl.torch: no adaptive lane (created with allocator 'equal' and telemetry 'none')", nv->rank());
    return *lane;
  }
  /// Whether a call of `bytes` (nccl-tests' message size) runs on the adaptive lane: it depends on
  /// what every rank passes alike (sizes, dtype), never on its buffers, so all ranks take one lane.
  bool routes(reccl::collective c, std::size_t count, reccl::dtype t) const {
    if (!lane || count == 0) return false;
    bool const reducing = reccl::reduces(c);
    std::uint64_t const seg = static_cast<std::uint64_t>(count) * reccl::size_of(t);
    std::uint64_t const bytes = c == reccl::collective::all_reduce || c == reccl::collective::broadcast
                                    ? seg : seg * static_cast<std::uint64_t>(nv->size());
    return bytes > one_shot_max(t, reducing);
  }
  std::uint64_t one_shot_max(reccl::dtype t, bool reducing) const {
    reccl::tuning const& tu = nv->config().tune;
    bool const lamport = reducing && (t == reccl::dtype::float32 || t == reccl::dtype::float16 || t == reccl::dtype::bfloat16);
    return lamport ? tu.one_shot_max_bytes : tu.ll_max_bytes;
  }
  ~impl() {
    // Not closed collectively: release without waiting for peers (their exchanges would never come).
    alone->store(true);
    if (nccl != nullptr) {
      // NCCL's window deregistration waits for the peers: abort the NCCL communicator and leave the
      // windows (their memory is released with the process)
      fused.reset();
      p2p.reset();
      lane.reset();
      // kernels still on the windows end within the timeout (every device-side wait is bounded)
      RECCL_CUDA_REPORT(cudaDeviceSynchronize());
      (void)nv.release();
      RECCL_NCCL_REPORT(ncclCommAbort(nccl));
      return;
    }
    teardown();
  }
};

comm::comm(std::unique_ptr<impl> p) : p_(std::move(p)) {}
comm::~comm() = default;

std::uint64_t memory_bound(int nranks, options const& o) {
  check_options(o);
  std::uint64_t total = reccl::nvlink_communicator::memory_bytes(nranks, nvlink_options(o));
  if (o.fused_max_tokens > 0) total += reccl::p2p_communicator::window_bytes(nranks, fused_config(nranks, o));
  return total;
}

std::unique_ptr<comm> comm::create(int rank, int nranks, exchange_fn exchange, options const& o) {
  check_options(o);
  auto p = std::make_unique<impl>();
  p->opt = o;
  // Every exchange after a destruction without close() fails at once instead of waiting for peers.
  reccl::proxy::rank_exchange ex = [alone = p->alone, exchange = std::move(exchange)](void const* mine, void* all,
                                                                                      std::size_t bytes) {
    if (alone->load())
      throw reccl::error(reccl::status::internal, "reccl.torch: communicator released without close(); not waiting for peers");
    exchange(mine, all, bytes);
  };
  agree_on_options(rank, nranks, ex, o);
  if (o.transport == "nccl") {
    // rank 0's unique id, over the exchange; then NCCL's own bootstrap (blocking until every rank is in)
    ncclUniqueId id{};
    if (rank == 0) RECCL_NCCL_CHECK(nullptr, ncclGetUniqueId(&id));
    std::vector<char> ids(sizeof(id) * static_cast<std::size_t>(nranks));
    ex(&id, ids.data(), sizeof(id));
    std::memcpy(&id, ids.data(), sizeof(id));  // rank 0's
    ncclComm_t nc = nullptr;  // a failed init may leave it half set: only a successful one is kept
    RECCL_NCCL_CHECK(nullptr, ncclCommInitRank(&nc, nranks, id, rank));
    p->nccl = nc;
    p->nv = std::make_unique<reccl::nvlink_communicator>(reccl::nvlink_communicator::create(p->nccl, nvlink_options(o)));
  } else {
    p->nv = std::make_unique<reccl::nvlink_communicator>(
        reccl::nvlink_communicator::create_p2p(rank, nranks, ex, nvlink_options(o)));
  }
  if (wants_adaptive(o)) p->lane = make_adaptive_path(o.allocator, o.telemetry, *p->nv, lane_options(o));
  if (o.fused_max_tokens > 0) {
    p->p2p = std::make_unique<reccl::p2p_communicator>(reccl::p2p_communicator::create(rank, nranks, ex, fused_config(nranks, o)));
    p->fused = std::make_unique<fused::fused_allreduce_rmsnorm>(*p->p2p, fused_limits(o));
  }
  if (p->lane || p->fused) {
    // Every rank's lane state and sentinel fill are in place before any rank's first call.
    char one = 1;
    std::vector<char> all(static_cast<std::size_t>(nranks));
    ex(&one, all.data(), 1);
  }
  return std::unique_ptr<comm>(new comm(std::move(p)));
}

std::vector<std::unique_ptr<comm>> comm::create_loopback(int nranks, int device, options const& o) {
  check_options(o);
  if (o.transport != "p2p")
    throw reccl::error(reccl::status::invalid_argument, "loopback ranks share one GPU: they use the p2p transport (NCCL refuses two ranks on one GPU)");
  auto nv = reccl::nvlink_communicator::create_loopback(nranks, device, nvlink_options(o));
  std::vector<reccl::p2p_communicator> p2p;
  if (o.fused_max_tokens > 0) p2p = reccl::p2p_communicator::create_loopback(nranks, device, fused_config(nranks, o));
  std::vector<std::unique_ptr<comm>> out;
  for (int r = 0; r < nranks; ++r) {
    auto p = std::make_unique<impl>();
    p->opt = o;
    p->loopback = true;
    p->nv = std::make_unique<reccl::nvlink_communicator>(std::move(nv[static_cast<std::size_t>(r)]));
    if (wants_adaptive(o)) p->lane = make_adaptive_path(o.allocator, o.telemetry, *p->nv, lane_options(o));
    if (o.fused_max_tokens > 0) {
      p->p2p = std::make_unique<reccl::p2p_communicator>(std::move(p2p[static_cast<std::size_t>(r)]));
      fused::limits lim = fused_limits(o);
      int sms = 0;
      RECCL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      lim.max_ctas = std::max(1, sms / nranks);  // every rank's grid resident at once
      p->fused = std::make_unique<fused::fused_allreduce_rmsnorm>(*p->p2p, lim);
    }
    out.push_back(std::unique_ptr<comm>(new comm(std::move(p))));
  }
  return out;
}

int comm::rank() const { p_->require_open(); return p_->nv->rank(); }
int comm::size() const { p_->require_open(); return p_->nv->size(); }
int comm::device() const { p_->require_open(); return p_->nv->device(); }
bool comm::loopback() const { return p_->loopback; }

void comm::all_reduce(void const* in, void* out, std::size_t count, reccl::dtype t, reccl::redop op, cudaStream_t s) {
  p_->require_open();
  if (p_->routes(reccl::collective::all_reduce, count, t)) return p_->lane->all_reduce(in, out, count, t, op, s);
  p_->nv->all_reduce(in, out, count, t, op, s);
}
void comm::reduce_scatter(void const* in, void* out, std::size_t count, reccl::dtype t, reccl::redop op, cudaStream_t s) {
  p_->require_open();
  if (p_->routes(reccl::collective::reduce_scatter, count, t)) return p_->lane->reduce_scatter(in, out, count, t, op, s);
  p_->nv->reduce_scatter(in, out, count, t, op, s);
}
void comm::all_gather(void const* in, void* out, std::size_t count, reccl::dtype t, cudaStream_t s) {
  p_->require_open();
  if (p_->routes(reccl::collective::all_gather, count, t)) return p_->lane->all_gather(in, out, count, t, s);
  p_->nv->all_gather(in, out, count, t, s);
}
void comm::broadcast(void const* in, void* out, std::size_t count, reccl::dtype t, int root, cudaStream_t s) {
  p_->require_open();
  if (p_->routes(reccl::collective::broadcast, count, t)) return p_->lane->broadcast(in, out, count, t, root, s);
  p_->nv->broadcast(in, out, count, t, root, s);
}
void comm::all_to_all(void const* in, void* out, std::size_t count, reccl::dtype t, cudaStream_t s) {
  p_->require_open();
  if (p_->routes(reccl::collective::all_to_all, count, t)) return p_->lane->all_to_all(in, out, count, t, s);
  p_->nv->all_to_all(in, out, count, t, s);
}

void comm::fused_add_rms_norm_all_reduce(void const* x, void const* residual, void const* weight, void* residual_out,
                                         void* out, std::uint32_t tokens, std::uint32_t hidden, float eps, cudaStream_t s) {
  p_->require_open();
  if (!p_->fused)
    throw reccl::error(reccl::status::invalid_argument, "fused_add_rms_norm_all_reduce: created with fused_max_tokens=0", rank());
  using bf16 = fused::bf16;
  (*p_->fused)(static_cast<bf16 const*>(x), static_cast<bf16 const*>(residual), static_cast<bf16 const*>(weight),
               static_cast<bf16*>(residual_out), static_cast<bf16*>(out), tokens, hidden, eps, s);
}
std::uint32_t comm::fused_max_tokens() const { return p_->fused ? p_->fused->limit().max_tokens : 0; }
std::uint32_t comm::fused_max_hidden() const { return p_->fused ? p_->fused->limit().max_hidden : 0; }

void* comm::allocate(std::size_t bytes) {
  p_->require_open();
  return p_->nv->allocate(bytes);
}
void comm::free(void* p) {
  p_->require_open();
  p_->nv->free(p);
}
bool comm::is_registered(void const* p, std::size_t bytes) const { return p_->nv && p_->nv->is_registered(p, bytes); }

std::uint64_t comm::memory_bytes() const {
  if (!p_->nv) return 0;
  std::uint64_t total = p_->nv->memory_bytes();
  if (p_->p2p) total += reccl::p2p_communicator::window_bytes(p_->p2p->size(), p_->p2p->config());
  return total;
}

void comm::check() const {
  p_->require_open();
  try {
    p_->nv->check();
  } catch (reccl::error const& e) {
    // the adaptive lane knows which VT failed, where it knows
    std::uint32_t const info = p_->lane ? p_->lane->error_info() : 0u;
    if (info == 0) throw;
    int const vt = static_cast<int>(info & 0xffffu) - 1;
    int const who = e.rank() >= 0 ? e.rank() : static_cast<int>(info >> 16);
    if (vt < 0 && who == e.rank()) throw;
    throw reccl::error(e.code(), vt >= 0 ? e.detail() + " (on VT " + std::to_string(vt) + ")" : e.detail(), who, vt);
  }
  if (p_->p2p) p_->p2p->check();
}

bool comm::adaptive() const { return p_->lane != nullptr; }
std::uint64_t comm::adaptive_min_bytes(reccl::dtype t, bool reduces) const {
  p_->require_lane();
  return p_->one_shot_max(t, reduces);
}
std::uint64_t comm::adaptive_epoch() const { return p_->require_lane().epoch(); }
std::uint64_t comm::recovered() const { return p_->require_lane().recovered(); }
std::vector<reccl::epoch_report> comm::reports(std::uint64_t from, std::uint64_t to) const {
  return p_->require_lane().reports(from, to);
}

void comm::close() {
  if (!p_->nv) return;
  p_->teardown();
}
bool comm::closed() const { return !p_->nv; }

}  // namespace reccl_torch
