// python/csrc/comm.cu -- reccl.torch's communicator (comm.hpp) on reccl's host runtime: the one
// translation unit that instantiates device code.
#include "comm.hpp"

#include <atomic>
#include <string>
#include <utility>

#include <reccl/host/communicator.hpp>
#include <reccl/host/p2p.hpp>

#include "fused_allreduce_rmsnorm.cuh"

namespace reccl_torch {

namespace {

reccl::nvlink_config nvlink_options(options const& o) {
  reccl::nvlink_config c;
  c.lanes = 1;
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

void check_options(options const& o) {
  if (o.fused_max_tokens > 0 && fused::packs_per_thread(o.fused_max_hidden) == 0)
    throw reccl::error(reccl::status::invalid_argument,
                       "fused_max_hidden must be a multiple of 256 that splits into at most 512 threads of 1, 2 or 4 packs");
}

}  // namespace

struct comm::impl {
  std::shared_ptr<std::atomic<bool>> alone = std::make_shared<std::atomic<bool>>(false);
  std::unique_ptr<reccl::nvlink_communicator> nv;
  std::unique_ptr<reccl::p2p_communicator> p2p;
  std::unique_ptr<fused::fused_allreduce_rmsnorm> fused;
  options opt;
  bool loopback = false;

  void require_open() const {
    if (!nv) throw reccl::error(reccl::status::invalid_argument, "reccl.torch: the communicator is closed");
  }
  void teardown() {
    fused.reset();
    p2p.reset();
    nv.reset();
  }
  ~impl() {
    // Not closed collectively: release without waiting for peers (their exchanges would never come).
    alone->store(true);
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
  p->nv = std::make_unique<reccl::nvlink_communicator>(
      reccl::nvlink_communicator::create_p2p(rank, nranks, ex, nvlink_options(o)));
  if (o.fused_max_tokens > 0) {
    p->p2p = std::make_unique<reccl::p2p_communicator>(reccl::p2p_communicator::create(rank, nranks, ex, fused_config(nranks, o)));
    p->fused = std::make_unique<fused::fused_allreduce_rmsnorm>(*p->p2p, fused_limits(o));
    // Every rank's sentinel fill is done before any rank's first fused call.
    char one = 1;
    std::vector<char> all(static_cast<std::size_t>(nranks));
    ex(&one, all.data(), 1);
  }
  return std::unique_ptr<comm>(new comm(std::move(p)));
}

std::vector<std::unique_ptr<comm>> comm::create_loopback(int nranks, int device, options const& o) {
  check_options(o);
  auto nv = reccl::nvlink_communicator::create_loopback(nranks, device, nvlink_options(o));
  std::vector<reccl::p2p_communicator> p2p;
  if (o.fused_max_tokens > 0) p2p = reccl::p2p_communicator::create_loopback(nranks, device, fused_config(nranks, o));
  std::vector<std::unique_ptr<comm>> out;
  for (int r = 0; r < nranks; ++r) {
    auto p = std::make_unique<impl>();
    p->opt = o;
    p->loopback = true;
    p->nv = std::make_unique<reccl::nvlink_communicator>(std::move(nv[static_cast<std::size_t>(r)]));
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
  p_->nv->all_reduce(in, out, count, t, op, s);
}
void comm::reduce_scatter(void const* in, void* out, std::size_t count, reccl::dtype t, reccl::redop op, cudaStream_t s) {
  p_->require_open();
  p_->nv->reduce_scatter(in, out, count, t, op, s);
}
void comm::all_gather(void const* in, void* out, std::size_t count, reccl::dtype t, cudaStream_t s) {
  p_->require_open();
  p_->nv->all_gather(in, out, count, t, s);
}
void comm::broadcast(void const* in, void* out, std::size_t count, reccl::dtype t, int root, cudaStream_t s) {
  p_->require_open();
  p_->nv->broadcast(in, out, count, t, root, s);
}
void comm::all_to_all(void const* in, void* out, std::size_t count, reccl::dtype t, cudaStream_t s) {
  p_->require_open();
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
  p_->nv->check();
  if (p_->p2p) p_->p2p->check();
}

void comm::close() {
  if (!p_->nv) return;
  p_->teardown();
}
bool comm::closed() const { return !p_->nv; }

}  // namespace reccl_torch
