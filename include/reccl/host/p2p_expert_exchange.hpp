// reccl/host/p2p_expert_exchange.hpp -- MoE dispatch and combine on the P2P transport: the CPU
// engine's operation (reccl/cpu/expert_exchange.hpp: same layout, same arithmetic, bit for bit)
// with routing in device memory, stream-ordered and capturable (device/agent/expert_exchange.hpp).
//
//   reccl::p2p_expert_exchange<__nv_bfloat16> ex(comm, {{nranks, 256, 8}, max_tokens, 7168, 128});
//   ex.dispatch(x, topk_idx, n_tokens, stream);            // x [n_tokens, H], topk_idx [n_tokens, k]
//   grouped_gemm(ex.received(), ex.expert_offsets(), ex.expert_counts(), y);   // the user's experts
//   ex.combine(y, topk_weights, out, stream);              // out [n_tokens, H]
//
// received() is [expert_offsets()[E_local], H] in this rank's window: local expert l's rows start at
// expert_offsets()[l] (a multiple of `align`), expert_counts()[l] of them, padding rows zeros; both
// arrays are device memory written by dispatch. y is any device memory laid out like received().
//
// fp8 dispatch (config payload::fp8_e4m3, hidden a multiple of 128; moe/fp8.hpp): dispatch takes
// e4m3 values [n_tokens, H] and fp32 scales [n_tokens, H / 128] and moves both bit for bit;
// received_fp8() gives the grouped values and scales, laid out as above (padding: zero values and
// scales). Combine is unchanged: y and out are token rows.
//
//   reccl::p2p_expert_exchange<__nv_bfloat16> ex(comm, {{n, 256, 8}, max_tokens, 7168, 128, reccl::moe::payload::fp8_e4m3});
//   ex.dispatch({x_e4m3, x_scales}, topk_idx, n_tokens, stream);
//   auto [v, sc] = ex.received_fp8();                      // the experts dequantise v * sc
//
// Protocols (the output is the same, bit for bit): moe_protocol::table (the default) exchanges
// counts first and writes each row straight to its grouped place -- two cross-rank rounds, window
// memory for the grouped rows only; moe_protocol::staged sends at once into a per-source staging
// area of 2 x nranks x max_tokens rows on every rank and files locally -- one round, for small
// batches (nranks x max_tokens x top_k <= 16384):
//   reccl::p2p_expert_exchange<__nv_bfloat16> ex(comm, {{n, 256, 8}, 128, 7168, 128}, 32, reccl::moe_protocol::staged);
// A staged exchange's first successful dispatch also checks, before any row moves, that every rank
// created it alike; later ones check after the rows moved (into staging only), before filing.
// Creation reserves the window space (capacity(), memory_bytes()) and is collective: every rank
// creates its exchanges in the same order with the same config.
//
// Errors: host-side checks (too many tokens, null or misaligned pointers, a second combine of one
// dispatch) fail the call on every rank at once and throw here (during graph capture the raising
// kernel is captured too, so the graph's replays fail every rank). Found on the device, before any
// row moves, and recorded on every rank naming the rank at fault: an expert index outside
// [-1, n_experts) or named twice in one token; an exchange created with another config or CTA count
// than rank 0's; a null y on a rank that received rows. check() on the communicator throws it;
// faults are sticky until comm.resume().
//
// A dead rank (its process gone, or a rank that timed out): mask_ranks(dead, stream) on every live
// rank makes the next dispatches leave it out -- nobody waits for it or sends to it, slots whose
// expert it holds are dropped (dropped(): counts in device memory; combine sums the other slots)
// and its experts' rows never arrive. The mask is read on the device by each dispatch, so a
// captured graph follows the latest mask_ranks(); live ranks whose masks differ fail naming the
// rank. After a timeout fault: check() names the rank, then on every live rank, once the live
// ranks agreed on the host which rank is dead,
//   comm.resume(stream); ex.mask_ranks(1ull << dead_rank, stream);   // and dispatch again
// (a combine of a dispatch from before resume() is refused). Ranks must agree: a live rank that
// some ranks mask but that masks none of them is not waited for by them (they go on without it)
// and times out naming one of them.
//
// Loopback ranks (one thread issuing every rank's calls): a kernel of yours launched between the
// ranks' calls, such as the experts, must be loaded before the first dispatch (reccl::load_kernel,
// or CUDA_MODULE_LOADING=EAGER): a lazy load waits for the kernels running, and those wait for the
// next rank's call.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../device/agent/expert_exchange.hpp"
#include "../device/agent/expert_exchange_staged.hpp"
#include "../moe/fp8.hpp"
#include "../moe/routing.hpp"
#include "error.hpp"
#include "launch.hpp"
#include "p2p.hpp"

namespace reccl {

using device::moe_protocol;

namespace detail {
template <int Unused = 0>
__global__ void set_word_kernel(std::uint64_t* word, std::uint64_t value) {
  *word = value;
}
}  // namespace detail

template <class Tok>
class p2p_expert_exchange {
 public:
  /// Reserves this exchange's flags and window bytes on `comm` (collective: see the file comment).
  /// `ctas`: CTAs of the dispatch and combine kernels, in [1, 64]; every rank passes the same
  /// (checked on the device at each dispatch, with the config).
  /// `protocol`: see the file comment (every rank passes the same; checked with the config).
  p2p_expert_exchange(p2p_communicator& comm, moe::exchange_config const& cfg, int ctas = 32, moe_protocol protocol = moe_protocol::table)
      : comm_(&comm), cfg_(cfg) {
    auto bad = [&](std::string const& why) { throw error(status::invalid_argument, "p2p_expert_exchange: " + why, comm.rank()); };
    if (char const* why = cfg.route.invalid()) bad(why);
    if (cfg.route.nranks != comm.size()) bad("route.nranks differs from the communicator's rank count");
    if (cfg.route.n_experts > device::moe_max_experts) bad("at most 1024 experts");
    if (char const* why = cfg.invalid_rows()) bad(why);
    if (ctas < 1 || ctas > 64) bad("ctas must be in [1, 64]");
    if (protocol != moe_protocol::table && protocol != moe_protocol::staged) bad("unknown protocol");
    bool const staged = protocol == moe_protocol::staged;
    if (staged && static_cast<std::uint64_t>(cfg.route.nranks) * cfg.max_tokens * static_cast<std::uint64_t>(cfg.route.top_k) >
                      device::moe_staged_max_slots)
      bad("the staged protocol holds nranks x max_tokens x top_k <= " + std::to_string(device::moe_staged_max_slots) +
          " slots: lower max_tokens, or use moe_protocol::table");
    bound_ = moe::receive_bound_of(cfg.route, cfg.max_tokens, cfg.align);
    if (bound_.grouped >= (1ull << 31)) bad("more than 2^31 grouped rows: lower max_tokens");
    int const n = cfg.route.nranks, k = cfg.route.top_k, epr = cfg.route.experts_per_rank();
    std::uint64_t const H = static_cast<std::uint64_t>(cfg.hidden), T = cfg.max_tokens;
    device::moe_lane& L = lane_;
    L.route = cfg.route;
    L.ctas = ctas;
    L.align = cfg.align;
    L.hidden = cfg.hidden;
    L.max_tokens = T;
    L.row_bytes = cfg.row_bytes(sizeof(Tok));
    L.scale_words = cfg.scales_per_row();
    L.protocol = protocol;
    L.digest = shape_digest(cfg, ctas, protocol);
    // the same flags on every rank whatever its config (and the heads area first, below), so that a
    // rank created with other values fails at its first dispatch (the digest) instead of using
    // other ranks' flags; the window areas after the heads depend on the config and protocol
    L.table = comm.reserve_flags(1);
    L.done = comm.reserve_flags(device::moe_max_ctas);
    L.back = comm.reserve_flags(device::moe_max_ctas);
    // heads first, at the same place whatever the config or protocol (see moe_lane)
    auto reserve = [&](std::uint64_t bytes, std::uint64_t align) {
      window_bytes_ += bytes;
      return comm.reserve_bytes(bytes, align);
    };
    L.heads_off = reserve(L.heads_bytes(), 128);
    if (!staged) L.table_off = reserve(L.table_bytes(), 128);
    L.grouped_off = reserve(bound_.grouped * L.row_bytes, 256);
    L.scales_off = reserve(bound_.grouped * 4ull * static_cast<std::uint64_t>(L.scale_words), 256);
    L.records_off = reserve(bound_.rows * 4ull * static_cast<std::uint64_t>(L.record_words()), 256);
    L.landing_off = reserve(T * static_cast<std::uint64_t>(k) * H * sizeof(Tok), 256);
    if (staged) {  // [2][n][max_tokens] of records, rows and scales
      std::uint64_t const cells = 2ull * static_cast<std::uint64_t>(n) * T;
      L.staged_records_off = reserve(cells * k * 4ull, 256);
      L.staged_rows_off = reserve(cells * L.row_bytes, 256);
      L.staged_scales_off = reserve(cells * 4ull * static_cast<std::uint64_t>(L.scale_words), 256);
    }
    // device scratch: sized by a first pass over the same list that places it
    std::uint64_t const slots = T * static_cast<std::uint64_t>(k);
    char* base = nullptr;
    std::uint64_t used = 0;
    auto take = [&](std::uint64_t bytes) {
      void* p = base == nullptr ? nullptr : base + used;
      used += (bytes + 255) / 256 * 256;
      return p;
    };
    auto place = [&] {
      device::moe_scratch& s = scratch_;
      if (!staged) {  // the table protocol's layout step
        s.erank = static_cast<std::int32_t*>(take(slots * 4));
        s.drank = static_cast<std::int32_t*>(take(slots * 4));
        s.rrank = static_cast<std::int32_t*>(take(T * n * 4));
      }
      s.slot_rows = static_cast<std::int64_t*>(take(slots * 8));
      s.rows_from = static_cast<std::int64_t*>(take((n + 1) * 8ull));
      s.expert_counts = static_cast<std::int32_t*>(take(epr * 4ull));
      s.expert_offsets = static_cast<std::int32_t*>(take((epr + 1) * 4ull));
      s.dead_ranks = static_cast<std::uint64_t*>(take(8));
      s.call_dead = static_cast<std::uint64_t*>(take(8));
      s.agreed = static_cast<std::uint64_t*>(take(8));
      s.report = static_cast<moe::drop_report*>(take(sizeof(moe::drop_report)));
    };
    place();
    scratch_bytes_ = used;
    RECCL_CUDA_CHECK(cudaMalloc(&scratch_mem_, scratch_bytes_));
    base = static_cast<char*>(scratch_mem_), used = 0;
    place();
    RECCL_CUDA_CHECK(cudaMemset(scratch_mem_, 0, scratch_bytes_));
    // table: at most 16 x (1024 + 128) x 4 bytes; staged: 16 x 1024 x 4 + 16384 x 4 -- within sm_90's 227 KiB
    dispatch_smem_ = staged ? device::moe_staged_smem(L) : device::moe_dispatch_smem(L);
    auto const dispatch_k = staged ? reinterpret_cast<void const*>(&device::moe_staged_dispatch_kernel<Tok>)
                                   : reinterpret_cast<void const*>(&device::moe_dispatch_kernel<Tok>);
    auto const combine_k = reinterpret_cast<void const*>(&device::moe_combine_kernel<Tok>);
    // always: the 48 KiB that need no opt-in count the kernel's static shared memory too
    RECCL_CUDA_CHECK(cudaFuncSetAttribute(dispatch_k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dispatch_smem_)));
    for (void const* k_ : {dispatch_k, combine_k, reinterpret_cast<void const*>(&detail::set_word_kernel<0>)}) load_kernel(k_);
    int const here = comm.ranks_sharing_device();
    require_co_resident(dispatch_k, ctas, device::moe_threads, dispatch_smem_, here, "p2p_expert_exchange: ctas", comm.rank());
    require_co_resident(combine_k, ctas, device::moe_threads, 0, here, "p2p_expert_exchange: ctas", comm.rank());
  }
  p2p_expert_exchange(p2p_expert_exchange const&) = delete;
  p2p_expert_exchange& operator=(p2p_expert_exchange const&) = delete;
  ~p2p_expert_exchange() {
    if (scratch_mem_) (void)cudaFree(scratch_mem_);  // destructor: a failed free leaves CUDA's sticky error
  }

  moe::receive_bound capacity() const { return bound_; }
  moe_protocol protocol() const { return lane_.protocol; }
  /// Bytes this exchange holds: its window reservations plus its device scratch.
  std::uint64_t memory_bytes() const { return window_bytes_ + scratch_bytes_; }

  /// The grouped rows of an exchange created for token rows (see the file comment).
  Tok const* received() const {
    if (cfg_.dispatch != moe::payload::tokens)
      throw error(status::invalid_argument, "p2p_expert_exchange: received() of an fp8 exchange: received_fp8()", comm_->rank());
    return comm_->handle().template at<Tok>(comm_->rank(), lane_.grouped_off);
  }
  /// The grouped values and scales of an exchange created with payload::fp8_e4m3.
  moe::fp8_tokens received_fp8() const {
    if (cfg_.dispatch != moe::payload::fp8_e4m3)
      throw error(status::invalid_argument, "p2p_expert_exchange: received_fp8() of a token-row exchange", comm_->rank());
    return {comm_->handle().template at<std::uint8_t>(comm_->rank(), lane_.grouped_off),
            comm_->handle().template at<float>(comm_->rank(), lane_.scales_off)};
  }
  std::int32_t const* expert_counts() const { return scratch_.expert_counts; }   ///< device, experts_per_rank
  std::int32_t const* expert_offsets() const { return scratch_.expert_offsets; } ///< device, experts_per_rank + 1
  /// Device memory: what the latest dispatch dropped for masked ranks (zeros when none is masked).
  moe::drop_report const* dropped() const { return scratch_.report; }

  /// Leave the ranks of `dead` (bit r: rank r) out of the dispatches that follow in `stream`
  /// (and their combines); 0 takes every rank again. Every live rank passes the same mask (checked
  /// at each dispatch). Stream-ordered and capturable; a captured dispatch reads the mask when it
  /// runs. Throws reccl::error(invalid_argument) for a bit outside [0, nranks) or this rank's own.
  void mask_ranks(std::uint64_t dead, cudaStream_t stream) {
    int const n = cfg_.route.nranks, me = comm_->rank();
    if (n < 64 && (dead >> n) != 0)
      throw error(status::invalid_argument, "p2p_expert_exchange: mask_ranks names a rank outside [0, " + std::to_string(n) + ")", me);
    if ((dead >> me) & 1u) throw error(status::invalid_argument, "p2p_expert_exchange: mask_ranks names this rank itself", me);
    detail::set_word_kernel<0><<<1, 1, 0, stream>>>(scratch_.dead_ranks, dead);
    RECCL_CUDA_CHECK(cudaGetLastError());
    dead_ = dead;
  }

  /// Sends each of `n_tokens` rows of `x` (device) to the ranks of its experts (`topk_idx`,
  /// device, [n_tokens, k]); see the file comment. Every rank calls it, on its own stream.
  void dispatch(Tok const* x, std::int32_t const* topk_idx, std::uint64_t n_tokens, cudaStream_t stream) {
    dispatch_rows(x, nullptr, moe::payload::tokens, topk_idx, n_tokens, stream);
  }
  /// The same with fp8 rows (an exchange created with payload::fp8_e4m3): e4m3 values [n_tokens,
  /// H] and fp32 scales [n_tokens, H / 128], device memory, moved bit for bit.
  void dispatch(moe::fp8_tokens x, std::int32_t const* topk_idx, std::uint64_t n_tokens, cudaStream_t stream) {
    dispatch_rows(x.values, x.scales, moe::payload::fp8_e4m3, topk_idx, n_tokens, stream);
  }

 private:
  void dispatch_rows(void const* x, float const* scales, moe::payload as, std::int32_t const* topk_idx, std::uint64_t n_tokens,
                     cudaStream_t stream) {
    bool const fp8 = cfg_.dispatch == moe::payload::fp8_e4m3;
    if (as != cfg_.dispatch)
      reject(device::fault_cause::bad_argument,
             fp8 ? "token rows dispatched on an exchange created for fp8" : "fp8 rows dispatched on an exchange created for token rows", stream);
    if (n_tokens > cfg_.max_tokens)
      reject(device::fault_cause::bad_argument, std::to_string(n_tokens) + " tokens, created for " + std::to_string(cfg_.max_tokens), stream);
    if (n_tokens > 0 && (x == nullptr || topk_idx == nullptr || (fp8 && scales == nullptr)))
      reject(device::fault_cause::null_buffer, fp8 ? "x.values, x.scales or topk_idx is null" : "x or topk_idx is null", stream);
    if (reinterpret_cast<std::uintptr_t>(x) % (fp8 ? 1 : alignof(Tok)) != 0 || reinterpret_cast<std::uintptr_t>(scales) % 4 != 0 ||
        reinterpret_cast<std::uintptr_t>(topk_idx) % 4 != 0)
      reject(device::fault_cause::misaligned_buffer, fp8 ? "x.scales or topk_idx is misaligned" : "x or topk_idx is misaligned", stream);
    device::moe_args<Tok> a = args();
    a.x = x;
    a.x_scales = scales;
    a.topk_idx = topk_idx;
    a.n_tokens = n_tokens;
    tokens_ = n_tokens;
    dispatched_ = true;
    combined_ = false;
    generation_ = comm_->generation();
    if (lane_.protocol == moe_protocol::staged)
      device::moe_staged_dispatch_kernel<Tok><<<lane_.ctas, device::moe_threads, dispatch_smem_, stream>>>(a);
    else
      device::moe_dispatch_kernel<Tok><<<lane_.ctas, device::moe_threads, dispatch_smem_, stream>>>(a);
    RECCL_CUDA_CHECK(cudaGetLastError());
  }

 public:
  /// Returns the experts' outputs `y` (device, laid out like received()) to their tokens' ranks
  /// and writes out[t] (device, [n_tokens, H] of the latest dispatch): the fp32 sum of w * y over
  /// token t's slots in top-k order, rounded once. Every rank calls it, once per dispatch. y may be
  /// null on a rank that received no rows (found on the device otherwise).
  void combine(Tok const* y, float const* topk_weights, Tok* out, cudaStream_t stream) {
    if (!dispatched_) reject(device::fault_cause::bad_argument, "combine before any dispatch", stream);
    // before the second-combine check: a captured layer leaves its dispatch marked combined
    if (generation_ != comm_->generation())
      reject(device::fault_cause::bad_argument, "combine of a dispatch from before comm.resume(): dispatch again", stream);
    if (combined_)
      reject(device::fault_cause::bad_argument, "a second combine of one dispatch (a peer may still read the first's rows)", stream);
    if (tokens_ > 0 && (out == nullptr || topk_weights == nullptr))
      reject(device::fault_cause::null_buffer, "out or topk_weights is null", stream);
    if (reinterpret_cast<std::uintptr_t>(y) % alignof(Tok) != 0 || reinterpret_cast<std::uintptr_t>(out) % alignof(Tok) != 0 ||
        reinterpret_cast<std::uintptr_t>(topk_weights) % 4 != 0)
      reject(device::fault_cause::misaligned_buffer, "y, out or topk_weights is misaligned", stream);
    device::moe_args<Tok> a = args();
    a.y = y;
    a.topk_weights = topk_weights;
    a.out = out;
    a.n_tokens = tokens_;
    combined_ = true;
    device::moe_combine_kernel<Tok><<<lane_.ctas, device::moe_threads, 0, stream>>>(a);
    RECCL_CUDA_CHECK(cudaGetLastError());
  }

 private:
  device::moe_args<Tok> args() const {
    device::moe_args<Tok> a{};
    a.h = comm_->handle();
    a.lane = lane_;
    a.s = scratch_;
    return a;
  }
  /// What every rank must create alike, folded into one word (FNV-1a).
  static std::int64_t shape_digest(moe::exchange_config const& c, int ctas, moe_protocol protocol) {
    std::uint64_t h = 1469598103934665603ull;
    for (std::uint64_t x : {std::uint64_t(c.route.nranks), std::uint64_t(c.route.n_experts), std::uint64_t(c.route.top_k), c.max_tokens,
                            std::uint64_t(c.hidden), std::uint64_t(c.align), std::uint64_t(ctas), std::uint64_t(sizeof(Tok)),
                            std::uint64_t(c.dispatch), std::uint64_t(protocol)})
      h = (h ^ x) * 1099511628211ull;
    return static_cast<std::int64_t>(h | 1u);  // never 0
  }
  [[noreturn]] void reject(device::fault_cause cause, std::string const& what, cudaStream_t stream) {
    comm_->raise_everywhere(device::fault{status::invalid_argument, comm_->rank(), -1, -1, cause}, stream, dead_);
    throw error(status::invalid_argument, "p2p_expert_exchange: " + what, comm_->rank());
  }

  p2p_communicator* comm_;
  moe::exchange_config cfg_;
  moe::receive_bound bound_{};
  device::moe_lane lane_{};
  device::moe_scratch scratch_{};
  void* scratch_mem_ = nullptr;
  std::uint64_t window_bytes_ = 0, scratch_bytes_ = 0, dispatch_smem_ = 0;
  std::uint64_t tokens_ = 0;  // of the latest dispatch
  bool dispatched_ = false, combined_ = false;
  std::uint32_t generation_ = 0;  // the communicator's resume() count at the latest dispatch
  std::uint64_t dead_ = 0;        // the latest mask_ranks(): a refusal raises no fault in those windows
};

}  // namespace reccl
