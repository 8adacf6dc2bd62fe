// examples/03_fused_allreduce_rmsnorm/fused_allreduce_rmsnorm.cuh -- all-reduce, residual add and
// RMSNorm in ONE kernel, written only from reccl's public device API (device::memory_handle, handed
// out by a reccl::p2p_communicator) and its element helpers (device/element.hpp).
//
// Every rank r holds x_r[tokens][hidden] (bf16, its partial sums), and the same residual[tokens][hidden]
// and weight[hidden]. The kernel computes, with these rounding points:
//
//   y     = bf16( ((x_0 + x_1) + x_2) + ... + x_{n-1} )   fp32 sums in rank order, rounded once
//   r_new = bf16( float(y) + float(residual) )             -> residual_out
//   rstd  = rsqrt( sum(float(r_new)^2) / hidden + eps )    fp32, one block reduction per row
//   out   = bf16( (float(r_new) * rstd) * float(weight) )  -> out
//
// (x's -0 is read as +0: Lamport slots reserve -0.) y is rounded to bf16 before the residual add,
// as when a bf16 all-reduce is followed by a separate add + RMSNorm kernel, so the fused and the
// unfused pipelines give the same bits.
//
// One-shot, rows owned by CTAs: CTA c of every rank handles rows c, c + grid, c + 2 grid, ...
//
//   1. push: for each of its rows, load x (16-byte packs), store them into slot [phase][me][row] of
//      every peer's symmetric slot buffer;
//   2. for each of its rows: wait for the peers' copies of the row in its own buffer, sum them in
//      rank order with its own x, add the residual, reduce the sum of squares over the CTA, write
//      r_new and out (16-byte stores);
//   3. the last CTA to finish advances the call's epoch (memory_handle::sequence, in device memory,
//      so captured CUDA graphs replay correctly).
//
// How a CTA knows that a peer's row has arrived (one protocol per call, chosen by token count):
//   * lamport (small messages): the slot buffer is kept filled with the sentinel -0.0f
//     (memory_handle::lamport_*); data words carry their own arrival, the reader polls its local
//     slots and refills them with the sentinel after reading. One NVLink crossing, no fence.
//   * flag (larger messages): plain 16-byte stores, then one release signal per (CTA, peer) on flag
//     `arrived + c` with value epoch + 1; the reader's thread for that peer waits (acquire) and the
//     CTA reads after a __syncthreads. No sentinel refill traffic, one extra flag crossing.
// Slots alternate between two phases (epoch & 1): a rank writes a phase again only two calls later,
// which needs every peer's data of the call in between, sent after that peer's kernel that read (and
// refilled) the phase had completed.
//
// Every wait is the handle's bounded wait: a peer that never arrives ends the wait at the
// communicator's deadline with a fault naming it (p2p_communicator::check() throws it); once a fault
// is recorded, every other wait of the rank gives up within a poll period.
//
// One call at a time per fused_allreduce_rmsnorm object (its epoch, slots and flags are its own):
// concurrent streams need one object each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>

#include <reccl/device/element.hpp>
#include <reccl/device/handle/memory.hpp>
#include <reccl/host/p2p.hpp>

namespace fused {

using bf16 = __nv_bfloat16;
namespace dev = reccl::device;

enum class protocol { automatic, lamport, flag };

constexpr char const* name(protocol p) {
  switch (p) {
    case protocol::automatic: return "auto";
    case protocol::lamport: return "lamport";
    case protocol::flag: return "flag";
  }
  return "?";
}

namespace detail {

struct kernel_args {
  dev::memory_handle h;
  bf16 const* x;
  bf16 const* residual;
  bf16 const* weight;
  bf16* residual_out;
  bf16* out;
  char* slots;  ///< this rank's slot buffer of the call's protocol: [2 phases][ranks][max_tokens][hidden]
  std::uint32_t max_tokens, tokens, hidden;
  float eps;
  dev::flag_id state;    ///< sequence(state): epoch of the next call; sequence(state + 1): CTAs done
  dev::flag_id arrived;  ///< flag protocol: flag arrived + c, from src: CTA c's rows of src are here
};

RECCL_DEVICE float lo(std::uint32_t w) { return __uint_as_float(w << 16); }
RECCL_DEVICE float hi(std::uint32_t w) { return __uint_as_float(w & 0xffff0000u); }
RECCL_DEVICE std::uint32_t bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

/// kMaxRanks: register capacity for the ranks (>= h.size()); kPacks: 16-byte packs per thread and
/// row (blockDim.x * kPacks * 8 == hidden); kLamport: the arrival protocol.
template <int kMaxRanks, int kPacks, bool kLamport>
__global__ void __launch_bounds__(512) fused_kernel(kernel_args const a) {
  dev::memory_handle const& h = a.h;
  int const n = h.size(), me = h.rank();
  int const tid = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  int const cta = static_cast<int>(blockIdx.x), grid = static_cast<int>(gridDim.x);
  std::uint64_t const row_bytes = std::uint64_t{a.hidden} * sizeof(bf16);
  std::uint64_t* const epoch_word = h.sequence(a.state);
  std::uint64_t* const done_word = h.sequence(dev::flag_id{a.state.index + 1});
  // Written only by the previous call's last CTA (stream order makes it visible here).
  std::uint64_t const epoch = *epoch_word;
  std::uint64_t const phase = epoch & 1u;
  auto slot = [&](int src, std::uint32_t row) {
    return a.slots + ((phase * static_cast<std::uint64_t>(n) + static_cast<std::uint64_t>(src)) * a.max_tokens + row) * row_bytes;
  };
  auto off = [&](int k) { return static_cast<std::uint64_t>(tid + k * nt) * 16u; };
  char const* const x = reinterpret_cast<char const*>(a.x);

  // 1. push my rows to every peer, starting with the next rank (peers are not all hit at once)
  for (int row = cta; row < static_cast<int>(a.tokens); row += grid) {
    dev::pack16 v[kPacks];
#pragma unroll
    for (int k = 0; k < kPacks; ++k) v[k] = dev::canonical<bf16>(dev::load_pack(x + row * row_bytes + off(k)));
    char* const mine = slot(me, static_cast<std::uint32_t>(row));
#pragma unroll
    for (int i = 1; i < kMaxRanks; ++i) {
      if (i >= n) break;
      int const p = (me + i) % n;
      char* const dst = h.peer_ptr(p, mine);
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        if constexpr (kLamport) dev::memory_handle::lamport_store(dst + off(k), v[k]);
        else dev::store_pack(dst + off(k), v[k]);
      }
    }
  }

  dev::deadline_clock clock(h.timeout_ns);
  bool ok = true;
  if constexpr (!kLamport) {
    // The CTA's stores precede the signals (signal() is a release; the barrier extends it to the
    // CTA); thread t then waits for peer t's CTA c (acquire), and the barrier extends that to the CTA.
    dev::flag_id const f{a.arrived.index + static_cast<std::uint32_t>(cta)};
    __syncthreads();
    if (tid < n && tid != me) {
      h.signal(tid, f, epoch + 1);
      ok = h.wait(f, tid, epoch + 1, clock, cta);
    }
    ok = __syncthreads_or(!ok) == 0;
  }

  // 2. reduce, add, normalise, one row at a time
  __shared__ float partial[2][32];
  dev::pack16 w[kPacks];
#pragma unroll
  for (int k = 0; k < kPacks; ++k) w[k] = dev::load_pack(reinterpret_cast<char const*>(a.weight) + off(k));
  int it = 0;
  for (int row = cta; ok && row < static_cast<int>(a.tokens); row += grid, ++it) {
    std::uint64_t const ro = static_cast<std::uint64_t>(row) * row_bytes;
    dev::pack16 in[kMaxRanks][kPacks];
#pragma unroll
    for (int q = 0; q < kMaxRanks; ++q) {
      if (q >= n) break;
      char const* const s = slot(q, static_cast<std::uint32_t>(row));
#pragma unroll
      for (int k = 0; k < kPacks; ++k) {
        if (q == me) in[q][k] = dev::load_pack(x + ro + off(k));
        else if constexpr (kLamport) in[q][k] = dev::memory_handle::lamport_load(s + off(k));
        else in[q][k] = dev::load_pack_cg(s + off(k));  // L2: never an L1 line of an earlier call
      }
    }
    if constexpr (kLamport) {
#pragma unroll
      for (int q = 0; q < kMaxRanks; ++q) {
        if (q >= n) break;
#pragma unroll
        for (int k = 0; k < kPacks; ++k)
          if (q != me && ok && !dev::lamport_arrived(in[q][k]))
            ok = h.lamport_wait(slot(q, static_cast<std::uint32_t>(row)) + off(k), in[q][k], q, clock, cta);
      }
    }
    float r[kPacks][8];
    dev::pack16 rn[kPacks];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      dev::acc_pack<bf16> acc = dev::to_acc<bf16>(in[0][k]);
#pragma unroll
      for (int q = 1; q < kMaxRanks; ++q)
        if (q < n) dev::combine_into<bf16>(reccl::redop::sum, acc, in[q][k]);
      dev::pack16 const y = dev::from_acc<bf16>(reccl::redop::sum, acc, n);
      dev::pack16 const res = dev::load_pack(reinterpret_cast<char const*>(a.residual) + ro + off(k));
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        std::uint32_t const l = bf16_bits(lo(y.w[j]) + lo(res.w[j]));
        std::uint32_t const u = bf16_bits(hi(y.w[j]) + hi(res.w[j]));
        rn[k].w[j] = l | (u << 16);
        r[k][2 * j] = lo(rn[k].w[j]);
        r[k][2 * j + 1] = hi(rn[k].w[j]);
        ss += r[k][2 * j] * r[k][2 * j] + r[k][2 * j + 1] * r[k][2 * j + 1];
      }
    }
    // sum of squares over the CTA: warp butterfly, then every thread adds the warp sums in order
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, m);
    if ((tid & 31) == 0) partial[it & 1][tid >> 5] = ss;  // two buffers: row it+1 never overwrites row it's
    if (__syncthreads_or(!ok)) break;
    float total = 0.f;
    for (int i = 0; i < nt / 32; ++i) total += partial[it & 1][i];
    float const rstd = rsqrtf(total / static_cast<float>(a.hidden) + a.eps);
#pragma unroll
    for (int k = 0; k < kPacks; ++k) {
      dev::pack16 o;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        o.w[j] = bf16_bits(r[k][2 * j] * rstd * lo(w[k].w[j])) | (bf16_bits(r[k][2 * j + 1] * rstd * hi(w[k].w[j])) << 16);
      dev::store_pack(reinterpret_cast<char*>(a.residual_out) + ro + off(k), rn[k]);
      dev::store_pack(reinterpret_cast<char*>(a.out) + ro + off(k), o);
    }
    if constexpr (kLamport) {
#pragma unroll
      for (int q = 0; q < kMaxRanks; ++q) {
        if (q >= n) break;
        if (q == me) continue;
#pragma unroll
        for (int k = 0; k < kPacks; ++k) dev::memory_handle::lamport_clear(slot(q, static_cast<std::uint32_t>(row)) + off(k));
      }
    }
  }

  // 3. the last CTA out advances the epoch for the next call (every CTA read it above)
  __syncthreads();
  if (tid == 0) {
    unsigned long long const before = atomicAdd(reinterpret_cast<unsigned long long*>(done_word), 1ull);
    if (before == static_cast<unsigned long long>(grid - 1)) {
      *done_word = 0;
      *epoch_word = epoch + 1;
    }
  }
}

template <int Unused = 0>
__global__ void fill_sentinel_kernel(std::uint32_t* p, std::uint64_t words) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t{blockDim.x} + threadIdx.x; i < words; i += std::uint64_t{gridDim.x} * blockDim.x)
    p[i] = dev::lamport_sentinel;
}

template <int R, int P>
void launch(bool lamport, int grid, int threads, kernel_args const& a, cudaStream_t stream) {
  if (lamport) fused_kernel<R, P, true><<<grid, threads, 0, stream>>>(a);
  else fused_kernel<R, P, false><<<grid, threads, 0, stream>>>(a);
}
template <int R>
void launch(int packs, bool lamport, int grid, int threads, kernel_args const& a, cudaStream_t stream) {
  if (packs == 1) launch<R, 1>(lamport, grid, threads, a, stream);
  else if (packs == 2) launch<R, 2>(lamport, grid, threads, a, stream);
  else launch<R, 4>(lamport, grid, threads, a, stream);
}

}  // namespace detail

/// Sizes fixed at setup (equal on every rank).
struct limits {
  std::uint32_t max_tokens = 512;
  std::uint32_t max_hidden = 8192;
  std::uint32_t lamport_max_tokens = 128;  ///< protocol::automatic: lamport up to this many tokens
  std::int32_t max_ctas = 0;               ///< largest grid; 0: the GPU's SM count (one rank per GPU)
};

/// Packs per thread for a row of `hidden` elements (threads = hidden / 8 / packs <= 512, a whole
/// number of warps), or 0 when there is none.
constexpr int packs_per_thread(std::uint32_t hidden) {
  if (hidden == 0 || hidden % 256 != 0) return 0;
  for (int p : {1, 2, 4})
    if ((hidden / 8) % (32u * static_cast<unsigned>(p)) == 0 && hidden / 8 / static_cast<unsigned>(p) <= 512) return p;
  return 0;
}

/// One rank's fused all-reduce + residual add + RMSNorm over a p2p_communicator.
class fused_allreduce_rmsnorm {
 public:
  /// Symmetric bytes the object reserves (add them to p2p_config::data_bytes).
  static std::uint64_t window_bytes(int nranks, limits const& lim) {
    return slot_bytes(nranks, lim.max_tokens, lim.max_hidden) + slot_bytes(nranks, std::max(lim.lamport_max_tokens, 1u), lim.max_hidden) +
           2 * 4096;  // each buffer aligned to 4096
  }

  /// Reserves flags and slots: every rank constructs its object at the same point of its
  /// reservation order. Fills this rank's Lamport slots with the sentinel (synchronous): across
  /// processes, put a host barrier between every rank's construction and the first call.
  fused_allreduce_rmsnorm(reccl::p2p_communicator& comm, limits lim) : comm_(&comm), lim_(lim) {
    if (lim_.max_ctas <= 0) {
      RECCL_CUDA_CHECK(cudaDeviceGetAttribute(&lim_.max_ctas, cudaDevAttrMultiProcessorCount, comm.device()));
    }
    if (lim_.max_tokens == 0 || packs_per_thread(lim_.max_hidden) == 0 || lim_.lamport_max_tokens > lim_.max_tokens)
      throw reccl::error(reccl::status::invalid_argument, "fused_allreduce_rmsnorm: bad limits", comm.rank());
    state_ = comm.reserve_flags(2);
    arrived_ = comm.reserve_flags(lim_.max_ctas);
    std::uint64_t const lb = slot_bytes(comm.size(), std::max(lim_.lamport_max_tokens, 1u), lim_.max_hidden);
    lamport_slots_ = static_cast<char*>(comm.allocate(lb, 4096));
    flag_slots_ = static_cast<char*>(comm.allocate(slot_bytes(comm.size(), lim_.max_tokens, lim_.max_hidden), 4096));
    detail::fill_sentinel_kernel<<<256, 256>>>(reinterpret_cast<std::uint32_t*>(lamport_slots_), lb / 4);
    RECCL_CUDA_CHECK(cudaGetLastError());
    RECCL_CUDA_CHECK(cudaDeviceSynchronize());
  }

  limits const& limit() const { return lim_; }

  /// The protocol a call with `tokens` rows runs.
  protocol pick(std::uint32_t tokens, protocol p = protocol::automatic) const {
    if (p != protocol::automatic) return p;
    return tokens <= lim_.lamport_max_tokens ? protocol::lamport : protocol::flag;
  }

  /// residual_out = bf16(bf16(sum over ranks of x) + residual); out = rmsnorm(residual_out) * weight.
  /// Every rank calls it with the same tokens, hidden, eps and protocol, in stream order;
  /// capturable. residual_out may equal residual. Pointers: device memory, 16-byte aligned.
  void operator()(bf16 const* x, bf16 const* residual, bf16 const* weight, bf16* residual_out, bf16* out,
                  std::uint32_t tokens, std::uint32_t hidden, float eps, cudaStream_t stream,
                  protocol p = protocol::automatic) const {
    auto reject = [&](std::string const& why) {
      // stop the peers now rather than at their deadline
      comm_->raise_everywhere(dev::fault{reccl::status::invalid_argument, comm_->rank(), -1, -1, dev::fault_cause::bad_argument},
                              stream);
      throw reccl::error(reccl::status::invalid_argument, "fused_allreduce_rmsnorm: " + why, comm_->rank());
    };
    if (tokens == 0) return;
    int const packs = packs_per_thread(hidden);
    if (packs == 0) reject("hidden must be a multiple of 256 that splits into at most 512 threads of 1, 2 or 4 packs");
    if (hidden > lim_.max_hidden || tokens > lim_.max_tokens) reject("tokens or hidden above the limits it was built with");
    for (void const* q : {static_cast<void const*>(x), static_cast<void const*>(residual), static_cast<void const*>(weight),
                          static_cast<void const*>(residual_out), static_cast<void const*>(out)})
      if (q == nullptr || reinterpret_cast<std::uintptr_t>(q) % 16 != 0) reject("null or not 16-byte aligned buffer");
    protocol const proto = pick(tokens, p);
    if (proto == protocol::lamport && tokens > lim_.lamport_max_tokens) reject("more tokens than lamport_max_tokens for the lamport protocol");
    int const n = comm_->size();
    detail::kernel_args a{comm_->handle(), x,      residual, weight,  residual_out,
                          out,             proto == protocol::lamport ? lamport_slots_ : flag_slots_,
                          proto == protocol::lamport ? std::max(lim_.lamport_max_tokens, 1u) : lim_.max_tokens,
                          tokens,          hidden, eps,      state_,  arrived_};
    int const grid = static_cast<int>(std::min<std::uint32_t>(tokens, static_cast<std::uint32_t>(lim_.max_ctas)));
    int const threads = static_cast<int>(hidden / 8 / static_cast<std::uint32_t>(packs));
    bool const lam = proto == protocol::lamport;
    if (n <= 2) detail::launch<2>(packs, lam, grid, threads, a, stream);
    else if (n <= 4) detail::launch<4>(packs, lam, grid, threads, a, stream);
    else detail::launch<8>(packs, lam, grid, threads, a, stream);
    RECCL_CUDA_CHECK(cudaGetLastError());
  }

 private:
  static std::uint64_t slot_bytes(int nranks, std::uint32_t tokens, std::uint32_t hidden) {
    return 2ull * static_cast<std::uint64_t>(nranks) * tokens * hidden * sizeof(bf16);
  }

  reccl::p2p_communicator* comm_;
  limits lim_;
  dev::flag_id state_{}, arrived_{};
  char* lamport_slots_ = nullptr;
  char* flag_slots_ = nullptr;
};

}  // namespace fused
