// A small mixture-of-experts layer on the GPU: loopback expert-parallel ranks on GPU 0 (each with
// its own stream and p2p_expert_exchange), every step on the device and no host synchronisation
// inside a layer: router kernel (top-k of E logits, softmax weights) -> dispatch (bf16 rows, or
// fp8 e4m3 rows with one scale per 128 values, quantised by a kernel) -> one matmul per local
// expert on its grouped rows (offsets and counts read from device memory) -> combine. The layers
// are then captured in one CUDA graph per rank and replayed on new tokens.
//
// Checked bitwise against a single-rank reference that runs the same arithmetic with every expert
// local (the same router, quantiser and expert kernels on the token's own row; the fp32 sum over
// slots in top-k order, rounded once, as combine computes it).
//
//   moe_layer_gpu [--ranks 2] [--tokens 48] [--experts 16] [--top-k 4] [--hidden 256] [--layers 3] [--fp8]
//
// Exit status: 0 if every output matched, 1 if one did not or reccl reported an error, 2 on a
// usage error, 77 without a GPU.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include <reccl/host/p2p_expert_exchange.hpp>
#include <reccl/moe/fp8.hpp>

#include "../common/check.hpp"

namespace {

using bf16 = __nv_bfloat16;

struct layer_shape {
  int ranks = 2, tokens = 48, experts = 16, top_k = 4, hidden = 256, layers = 3;
  bool fp8 = false;
};

// ---- the model's arithmetic: one function per step, used by the layer and by the reference ----

/// Logits of one token (fp32, inputs in order), its top-k experts (ties to the lower index) and
/// their softmax weights. One thread per token.
__global__ void router_kernel(bf16 const* x, float const* router, int tokens, int hidden, int experts, int k, std::int32_t* idx,
                              float* w) {
  int const t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  float logit[256];
  for (int e = 0; e < experts; ++e) {
    float acc = 0.f;
    for (int h = 0; h < hidden; ++h) acc = __fmaf_rn(__bfloat162float(x[std::size_t(t) * hidden + h]), router[std::size_t(h) * experts + e], acc);
    logit[e] = acc;
  }
  float top = 0.f, sum = 0.f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    for (int e = 0; e < experts; ++e)
      if (logit[e] > -INFINITY && (best < 0 || logit[e] > logit[best])) best = e;
    if (j == 0) top = logit[best];
    idx[t * k + j] = best;
    w[t * k + j] = __expf(logit[best] - top);
    sum += w[t * k + j];
    logit[best] = -INFINITY;
  }
  for (int j = 0; j < k; ++j) w[t * k + j] = __fdiv_rn(w[t * k + j], sum);
}

/// fp8 rows of the tokens (moe::quantize_e4m3_row per row). One thread per token.
__global__ void quantise_kernel(bf16 const* x, int tokens, int hidden, std::uint8_t* values, float* scales) {
  int const t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  float row[reccl::moe::fp8_block];
  for (int b = 0; b < hidden / reccl::moe::fp8_block; ++b) {
    for (int c = 0; c < reccl::moe::fp8_block; ++c) row[c] = __bfloat162float(x[std::size_t(t) * hidden + b * reccl::moe::fp8_block + c]);
    reccl::moe::quantize_e4m3_row(row, reccl::moe::fp8_block, values + std::size_t(t) * hidden + b * reccl::moe::fp8_block,
                                  scales + std::size_t(t) * (hidden / reccl::moe::fp8_block) + b);
  }
}

/// One input row of an expert: bf16 values, or fp8 values times their block's scale.
struct row_in {
  bf16 const* x = nullptr;
  std::uint8_t const* v = nullptr;
  float const* s = nullptr;
  __device__ float operator()(std::uint64_t row, int hidden, int i) const {
    if (x) return __bfloat162float(x[row * hidden + i]);
    return __fmul_rn(reccl::moe::e4m3_to_float(v[row * hidden + i]), s[row * (hidden / reccl::moe::fp8_block) + i / reccl::moe::fp8_block]);
  }
};

/// Output o of expert W ([H, H], fp32) on input row `row`: fp32, inputs in order, rounded once.
__device__ bf16 expert_out(row_in in, std::uint64_t row, float const* W, int hidden, int o) {
  float acc = 0.f;
  for (int i = 0; i < hidden; ++i) acc = __fmaf_rn(in(row, hidden, i), W[std::size_t(i) * hidden + o], acc);
  return __float2bfloat16_rn(acc);
}

/// The grouped matmul: every received row p, filed under local expert l, through expert
/// first_expert + l. Offsets and counts are device memory written by dispatch; `rows_max` bounds p.
__global__ void grouped_experts_kernel(row_in in, float const* weights, int first_expert, int epr, std::int32_t const* offsets,
                                       std::int32_t const* counts, std::uint64_t rows_max, int hidden, bf16* y) {
  std::uint64_t const total = rows_max * hidden;
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < total; i += std::uint64_t(gridDim.x) * blockDim.x) {
    std::uint64_t const p = i / hidden;
    int const o = int(i % hidden);
    if (p >= std::uint64_t(offsets[epr])) return;  // rows are visited in order
    int l = 0;
    while (l + 1 < epr && std::uint64_t(offsets[l + 1]) <= p) ++l;
    if (p >= std::uint64_t(offsets[l] + counts[l])) continue;  // padding
    y[p * hidden + o] = expert_out(in, p, weights + std::size_t(first_expert + l) * hidden * hidden, hidden, o);
  }
}

/// The single-rank reference: each token's slots through their experts on the token's own row,
/// summed in fp32 in top-k order and rounded once. One thread per (token, output).
__global__ void reference_kernel(row_in in, float const* weights, std::int32_t const* idx, float const* w, int tokens, int k,
                                 int hidden, bf16* out) {
  std::uint64_t const i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x;
  if (i >= std::uint64_t(tokens) * hidden) return;
  std::uint64_t const t = i / hidden;
  int const o = int(i % hidden);
  float acc = 0.f;
  for (int j = 0; j < k; ++j) {
    int const e = idx[t * k + j];
    acc = __fmaf_rn(w[t * k + j], __bfloat162float(expert_out(in, t, weights + std::size_t(e) * hidden * hidden, hidden, o)), acc);
  }
  out[i] = __float2bfloat16_rn(acc);
}

template <class T>
T* device_alloc(std::uint64_t n) {
  T* p = nullptr;
  CK(cudaMalloc(&p, n * sizeof(T) + 16));
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  layer_shape s;
  CLI::App app{"A mixture-of-experts layer on loopback expert-parallel ranks of one GPU, checked against one rank"};
  app.add_option("--ranks", s.ranks, "expert-parallel ranks (loopback, one stream each)")->check(CLI::Range(1, 8));
  app.add_option("--tokens", s.tokens, "tokens on rank 0 (rank r has tokens - 3r, at least 1)")->check(CLI::Range(1, 4096));
  app.add_option("--experts", s.experts, "experts in total, a multiple of ranks")->check(CLI::Range(1, 256));
  app.add_option("--top-k", s.top_k, "experts per token")->check(CLI::Range(1, 32));
  app.add_option("--hidden", s.hidden, "values per token (a multiple of 128 with --fp8)")->check(CLI::Range(1, 8192));
  app.add_option("--layers", s.layers, "layers, each through the same experts")->check(CLI::Range(1, 64));
  app.add_flag("--fp8", s.fp8, "dispatch fp8 e4m3 rows with one scale per 128 values");
  CLI11_PARSE(app, argc, argv);
  if (s.experts % s.ranks != 0 || s.top_k > s.experts || (s.fp8 && s.hidden % reccl::moe::fp8_block != 0)) {
    std::fprintf(stderr, "experts must be a multiple of ranks, top-k <= experts, hidden a multiple of 128 with --fp8\n");
    return 2;
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no GPU: skipped (the CPU engine's version is moe_layer)\n");
    return 77;
  }
  int const n = s.ranks, H = s.hidden, E = s.experts, k = s.top_k, epr = E / n, S = H / reccl::moe::fp8_block;
  std::uint64_t const T = std::uint64_t(s.tokens);
  std::vector<std::uint64_t> tokens(n);
  for (int r = 0; r < n; ++r) tokens[r] = std::uint64_t(std::max(1, s.tokens - 3 * r));

  // the model, the same on every rank: router [H, E], experts E x [H, H]
  std::mt19937 rng(2026);
  std::normal_distribution<float> nd(0.f, 1.f / std::sqrt(float(H)));
  std::vector<float> h_router(std::size_t(H) * E), h_weights(std::size_t(E) * H * H);
  for (float& v : h_router) v = nd(rng);
  for (float& v : h_weights) v = nd(rng);
  float* router = device_alloc<float>(h_router.size());
  float* weights = device_alloc<float>(h_weights.size());
  CK(cudaMemcpy(router, h_router.data(), h_router.size() * 4, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(weights, h_weights.data(), h_weights.size() * 4, cudaMemcpyHostToDevice));

  try {
    reccl::moe::exchange_config const cfg{{n, E, k}, T, H, 8, s.fp8 ? reccl::moe::payload::fp8_e4m3 : reccl::moe::payload::tokens};
    auto const bound = reccl::moe::receive_bound_of(cfg.route, T, cfg.align);
    reccl::p2p_config pc;
    pc.data_bytes = (bound.grouped + T * k) * H * 2 + bound.rows * 8 * k + (16u << 20);
    auto comms = reccl::p2p_communicator::create_loopback(n, 0, pc);
    // kernels launched between the ranks' calls from this thread: loaded now, not lazily behind a
    // spinning rank (docs/moe.md, loopback ranks)
    for (void const* f : {reinterpret_cast<void const*>(&router_kernel), reinterpret_cast<void const*>(&quantise_kernel),
                          reinterpret_cast<void const*>(&grouped_experts_kernel), reinterpret_cast<void const*>(&reference_kernel)})
      reccl::load_kernel(f);

    struct rank_state {
      std::unique_ptr<reccl::p2p_expert_exchange<bf16>> ex;
      cudaStream_t st{};
      bf16 *x = nullptr, *h = nullptr, *y = nullptr;  // tokens in, hidden state, experts' outputs
      bf16 *ref = nullptr, *ref_in = nullptr;         // the reference's state and its previous layer's
      std::uint8_t* q = nullptr;
      float *qs = nullptr, *w = nullptr;
      std::int32_t* idx = nullptr;
    };
    std::vector<rank_state> rk(n);
    for (int r = 0; r < n; ++r) {
      rank_state& R = rk[r];
      R.ex = std::make_unique<reccl::p2p_expert_exchange<bf16>>(comms[r], cfg, 8);
      CK(cudaStreamCreateWithFlags(&R.st, cudaStreamNonBlocking));
      R.x = device_alloc<bf16>(T * H), R.h = device_alloc<bf16>(T * H), R.ref = device_alloc<bf16>(T * H), R.ref_in = device_alloc<bf16>(T * H);
      R.y = device_alloc<bf16>(bound.grouped * H);
      R.q = device_alloc<std::uint8_t>(T * H), R.qs = device_alloc<float>(T * std::max(S, 1));
      R.w = device_alloc<float>(T * k), R.idx = device_alloc<std::int32_t>(T * k);
    }
    auto upload_tokens = [&](std::uint32_t seed) {
      std::mt19937 g(seed);
      std::uniform_real_distribution<float> ud(-1.f, 1.f);
      for (int r = 0; r < n; ++r) {
        std::vector<bf16> hx(tokens[r] * H);
        for (bf16& v : hx) v = __float2bfloat16_rn(ud(g));
        CK(cudaMemcpy(rk[r].x, hx.data(), hx.size() * 2, cudaMemcpyHostToDevice));
      }
    };
    int const tb = 128;
    auto blocks = [&](std::uint64_t threads) { return unsigned((threads + tb - 1) / tb); };
    auto input_of = [&](rank_state const& R, bf16 const* x) { return s.fp8 ? row_in{nullptr, R.q, R.qs} : row_in{x, nullptr, nullptr}; };
    // The layers of rank r on its stream: h = x, then per layer route, dispatch, experts, combine.
    auto layers = [&](int r) {
      rank_state& R = rk[r];
      std::uint64_t const t_n = tokens[r];
      CK(cudaMemcpyAsync(R.h, R.x, t_n * H * 2, cudaMemcpyDeviceToDevice, R.st));
      for (int l = 0; l < s.layers; ++l) {
        router_kernel<<<blocks(t_n), tb, 0, R.st>>>(R.h, router, int(t_n), H, E, k, R.idx, R.w);
        if (s.fp8) {
          quantise_kernel<<<blocks(t_n), tb, 0, R.st>>>(R.h, int(t_n), H, R.q, R.qs);
          R.ex->dispatch(reccl::moe::fp8_tokens{R.q, R.qs}, R.idx, t_n, R.st);
          auto const rec = R.ex->received_fp8();
          grouped_experts_kernel<<<264, tb, 0, R.st>>>(row_in{nullptr, rec.values, rec.scales}, weights, r * epr, epr,
                                                       R.ex->expert_offsets(), R.ex->expert_counts(), bound.grouped, H, R.y);
        } else {
          R.ex->dispatch(R.h, R.idx, t_n, R.st);
          grouped_experts_kernel<<<264, tb, 0, R.st>>>(row_in{R.ex->received(), nullptr, nullptr}, weights, r * epr, epr,
                                                       R.ex->expert_offsets(), R.ex->expert_counts(), bound.grouped, H, R.y);
        }
        R.ex->combine(R.y, R.w, R.h, R.st);
      }
    };
    // The reference of rank r's tokens, every expert local (on the same stream, after its layers).
    auto reference = [&](int r) {
      rank_state& R = rk[r];
      std::uint64_t const t_n = tokens[r];
      CK(cudaMemcpyAsync(R.ref, R.x, t_n * H * 2, cudaMemcpyDeviceToDevice, R.st));
      for (int l = 0; l < s.layers; ++l) {
        CK(cudaMemcpyAsync(R.ref_in, R.ref, t_n * H * 2, cudaMemcpyDeviceToDevice, R.st));
        router_kernel<<<blocks(t_n), tb, 0, R.st>>>(R.ref_in, router, int(t_n), H, E, k, R.idx, R.w);
        if (s.fp8) quantise_kernel<<<blocks(t_n), tb, 0, R.st>>>(R.ref_in, int(t_n), H, R.q, R.qs);
        reference_kernel<<<blocks(t_n * H), tb, 0, R.st>>>(input_of(R, R.ref_in), weights, R.idx, R.w, int(t_n), k, H, R.ref);
      }
    };
    auto compare = [&](char const* what) {
      long wrong = 0;
      for (int r = 0; r < n; ++r) {
        std::vector<std::uint16_t> got(tokens[r] * H), want(tokens[r] * H);
        CK(cudaMemcpy(got.data(), rk[r].h, got.size() * 2, cudaMemcpyDeviceToHost));
        CK(cudaMemcpy(want.data(), rk[r].ref, want.size() * 2, cudaMemcpyDeviceToHost));
        for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != want[i];
      }
      std::printf("%-34s %s\n", what, wrong == 0 ? "every output matches the single-rank reference bitwise" : "WRONG RESULT");
      return wrong;
    };
    auto sync_all = [&] {
      for (auto& R : rk) CK(cudaStreamSynchronize(R.st));
      for (auto& c : comms) c.check();  // throws reccl::error naming the rank at fault
    };

    std::printf("%d loopback ranks, %d experts, top-%d, hidden %d, %d layers, dispatch %s\n", n, E, k, H, s.layers,
                s.fp8 ? "fp8 e4m3 + scales" : "bf16");
    long wrong = 0;
    upload_tokens(1);
    for (int r = 0; r < n; ++r) layers(r);  // every rank's layers are in flight before any is waited for
    sync_all();
    for (int r = 0; r < n; ++r) reference(r);
    sync_all();
    wrong += compare("eager:");

    // the same layers captured once per rank, replayed on new tokens
    std::vector<cudaGraphExec_t> exec(n);
    for (int r = 0; r < n; ++r) {
      cudaGraph_t graph = nullptr;
      CK(cudaStreamBeginCapture(rk[r].st, cudaStreamCaptureModeThreadLocal));
      layers(r);
      CK(cudaStreamEndCapture(rk[r].st, &graph));
      CK(cudaGraphInstantiate(&exec[r], graph, 0));
      CK(cudaGraphDestroy(graph));
    }
    for (std::uint32_t round = 0; round < 2; ++round) {
      upload_tokens(100 + round);
      for (int r = 0; r < n; ++r) CK(cudaGraphLaunch(exec[r], rk[r].st));
      sync_all();
      for (int r = 0; r < n; ++r) reference(r);
      sync_all();
      wrong += compare(round == 0 ? "CUDA graph, new tokens:" : "CUDA graph, new tokens again:");
    }
    for (auto e : exec) CK(cudaGraphExecDestroy(e));
    for (int r = 0; r < n; ++r) {
      std::printf("rank %d: %llu tokens; exchange holds %.1f MB (receive bound %llu rows, %llu grouped)\n", r,
                  static_cast<unsigned long long>(tokens[r]), double(rk[r].ex->memory_bytes()) / 1e6,
                  static_cast<unsigned long long>(bound.rows), static_cast<unsigned long long>(bound.grouped));
      rk[r].ex.reset();
      for (void* p : {static_cast<void*>(rk[r].x), static_cast<void*>(rk[r].h), static_cast<void*>(rk[r].y), static_cast<void*>(rk[r].ref), static_cast<void*>(rk[r].ref_in),
                      static_cast<void*>(rk[r].q), static_cast<void*>(rk[r].qs), static_cast<void*>(rk[r].w), static_cast<void*>(rk[r].idx)})
        CK(cudaFree(p));
      CK(cudaStreamDestroy(rk[r].st));
    }
    CK(cudaFree(router));
    CK(cudaFree(weights));
    return wrong == 0 ? 0 : 1;
  } catch (reccl::error const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
