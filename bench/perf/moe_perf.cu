// reccl_moe_perf -- MoE dispatch and combine (p2p_expert_exchange<bf16>) on loopback ranks of one
// GPU, in the shape of DeepEP's tables: tokens per rank, hidden 7168, top-8 of 256 experts, uniform
// random routing. Timed inside CUDA graphs (graph_timing.hpp: per rank one graph of `iters` calls,
// every rank's graph launched together, median of `reps` replays):
//   dispatch            dispatch alone (dispatches may follow each other)
//   dispatch+combine    a dispatch and a combine (a combine must follow a dispatch)
//   copy floor          a device-to-device copy of the dispatch payload on each rank
//   empty               an empty kernel per call
// Payload (DeepEP's convention): bytes of the token rows a rank receives from other ranks, one copy
// per destination rank (with --fp8: the e4m3 values and their scales). Every size is checked once
// end to end before it is timed: combine's output against a host computation of
// sum_j w_j * round(x * (1 + e_j / 8)) in top-k order (--fp8: x = e4m3 value * scale, dequantised
// by the experts).
//
// Loopback peers share one GPU's memory: the figures say what the protocol and the data movement
// cost on one GPU, not what NVLink gives (that comes with the multi-GPU runs).
//
//   reccl_moe_perf --ranks 2 --tokens 1,8,128,512,4096 --reps 10 [--fp8] [--staged] --json out.json
//   built with -DRECCL_MOE_TRACE it also prints, per size, when CTA 0 of each rank passed each step
//   of one more eager layer (globaltimer; the timed figures then include the stamps' stores)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/perf/graph_timing.hpp"
#include "examples/common/check.hpp"
#include "reccl/host/p2p_expert_exchange.hpp"

namespace {

using bf16 = __nv_bfloat16;

float bf16_to_float(std::uint16_t b) {
  std::uint32_t const u = std::uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
std::uint16_t float_to_bf16(float f) {  // round to nearest even (finite values)
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

/// The experts: y = round(x * (1 + e/8)) for the rows filed under local expert l of `rank`.
__global__ void experts_kernel(bf16 const* grouped, bf16* y, std::int32_t const* offsets, std::int32_t const* counts, int epr,
                               int rank, int hidden) {
  for (int l = 0; l < epr; ++l) {
    float const scale = 1.f + float(rank * epr + l) / 8.f;
    std::uint64_t const lo = std::uint64_t(offsets[l]) * hidden, hi = lo + std::uint64_t(counts[l]) * hidden;
    for (std::uint64_t i = lo + blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += std::uint64_t(gridDim.x) * blockDim.x)
      y[i] = __float2bfloat16_rn(__fmul_rn(__bfloat162float(grouped[i]), scale));
  }
}

/// The same experts on fp8 rows: y = round(v * scale * (1 + e/8)), two fp32 products.
__global__ void fp8_experts_kernel(std::uint8_t const* v, float const* sc, bf16* y, std::int32_t const* offsets,
                                   std::int32_t const* counts, int epr, int rank, int hidden) {
  int const S = hidden / reccl::moe::fp8_block;
  for (int l = 0; l < epr; ++l) {
    float const scale = 1.f + float(rank * epr + l) / 8.f;
    std::uint64_t const lo = std::uint64_t(offsets[l]) * hidden, hi = lo + std::uint64_t(counts[l]) * hidden;
    for (std::uint64_t i = lo + blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += std::uint64_t(gridDim.x) * blockDim.x) {
      float const x = __fmul_rn(reccl::moe::e4m3_to_float(v[i]), sc[(i / hidden) * S + (i % hidden) / reccl::moe::fp8_block]);
      y[i] = __float2bfloat16_rn(__fmul_rn(x, scale));
    }
  }
}

__global__ void empty_kernel() {}

int iters_for(std::uint64_t tokens) { return tokens >= 512 ? 5 : 20; }

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"MoE dispatch and combine on loopback ranks, next to a copy floor and an empty kernel"};
  int ranks = 2, reps = 10, hidden = 7168, experts = 256, top_k = 8, ctas = 64, align = 16;
  std::vector<std::uint64_t> token_counts{1, 8, 128, 512, 4096};
  std::string json_path;
  app.add_option("--ranks", ranks, "loopback ranks")->check(CLI::Range(1, 8));
  app.add_option("--tokens", token_counts, "tokens per rank")->delimiter(',');
  app.add_option("--hidden", hidden, "values per token");
  app.add_option("--experts", experts, "experts in total");
  app.add_option("--top-k", top_k, "experts per token");
  app.add_option("--ctas", ctas, "CTAs of the dispatch and combine kernels");
  app.add_option("--align", align, "rows each expert's block starts on a multiple of");
  app.add_option("--reps", reps, "timed replays per configuration (median)");
  app.add_option("--json", json_path, "write the results here");
  bool fp8 = false;
  app.add_flag("--fp8", fp8, "dispatch fp8 e4m3 rows with one fp32 scale per 128 values (combine stays bf16)");
  bool staged = false;
  app.add_flag("--staged", staged, "the staged protocol: one round, rows through per-source staging (small batches)");
  CLI11_PARSE(app, argc, argv);
  auto const protocol = staged ? reccl::moe_protocol::staged : reccl::moe_protocol::table;

  std::uint64_t const T = *std::max_element(token_counts.begin(), token_counts.end());
  reccl::moe::exchange_config const cfg{{ranks, experts, top_k}, T, hidden, align,
                                        fp8 ? reccl::moe::payload::fp8_e4m3 : reccl::moe::payload::tokens};
  if (char const* why = cfg.route.invalid() ? cfg.route.invalid() : cfg.invalid_rows()) {
    std::fprintf(stderr, "bad shape: %s\n", why);
    return 2;
  }
  std::uint64_t const S = static_cast<std::uint64_t>(cfg.scales_per_row());
  std::uint64_t const row_bytes = cfg.row_bytes(2) + 4 * S;  // one dispatched row: values and scales
  auto const bound = reccl::moe::receive_bound_of(cfg.route, T, align);
  std::uint64_t const H = hidden, k = top_k;
  reccl::p2p_config pc;
  pc.data_bytes = (bound.grouped + T * k) * H * 2 + bound.rows * 8 * k + (64u << 20);
  if (staged) pc.data_bytes += 2 * bound.rows * (row_bytes + 4 * k);  // staging: [2][ranks][T] rows and records
  pc.plan_max_ctas = std::max(16, ctas);
  auto comms = reccl::p2p_communicator::create_loopback(ranks, 0, pc);
  std::vector<cudaStream_t> st(ranks);
  for (auto& s : st) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<std::unique_ptr<reccl::p2p_expert_exchange<bf16>>> ex;
  std::vector<bf16*> x(ranks), y(ranks), out(ranks), floor_src(ranks), floor_dst(ranks);
  std::vector<std::int32_t*> idx(ranks);
  std::vector<float*> w(ranks), xs(ranks);
  std::vector<std::uint8_t*> xq(ranks);
  // launched between the ranks' calls from this thread: loaded now, not lazily behind a spinning rank
  reccl::load_kernel(reinterpret_cast<void const*>(&experts_kernel));
  reccl::load_kernel(reinterpret_cast<void const*>(&fp8_experts_kernel));
  reccl::load_kernel(reinterpret_cast<void const*>(&empty_kernel));
  for (int r = 0; r < ranks; ++r) {
    ex.push_back(std::make_unique<reccl::p2p_expert_exchange<bf16>>(comms[r], cfg, ctas, protocol));
    CK(cudaMalloc(&x[r], T * H * 2));
    CK(cudaMalloc(&xq[r], T * H + 16));
    CK(cudaMalloc(&xs[r], T * S * 4 + 16));
    CK(cudaMalloc(&out[r], T * H * 2));
    CK(cudaMalloc(&y[r], bound.grouped * H * 2));
    CK(cudaMalloc(&floor_src[r], bound.rows * row_bytes));
    CK(cudaMalloc(&floor_dst[r], bound.rows * row_bytes));
    CK(cudaMalloc(&idx[r], T * k * 4));
    CK(cudaMalloc(&w[r], T * k * 4));
  }
  std::printf("%d ranks, hidden %d, top-%d of %d experts, %d CTAs, align %d, dispatch %s, %s protocol; window %.1f MB per rank\n", ranks,
              hidden, top_k, experts, ctas, align, fp8 ? "fp8 e4m3 + scales" : "bf16", staged ? "staged" : "table", double(pc.data_bytes) / 1e6);
  std::printf("%8s %12s %12s %14s %12s %10s %12s %8s\n", "tokens", "dispatch_us", "combine_us", "disp+comb_us", "floor_us", "empty_us",
              "payload_MB", "wrong");
  nlohmann::json js{{"tool", "reccl_moe_perf"}, {"ranks", ranks}, {"hidden", hidden}, {"experts", experts}, {"top_k", top_k},
                    {"ctas", ctas}, {"align", align}, {"reps", reps}, {"dispatch", fp8 ? "fp8_e4m3" : "bf16"}, {"protocol", staged ? "staged" : "table"},
                    {"results", nlohmann::json::array()}};
  std::mt19937 g(20261205);
  int const epr = experts / ranks;
  for (std::uint64_t tokens : token_counts) {
    // inputs: random values, distinct experts per token, weights
    std::vector<std::vector<std::uint16_t>> hx(ranks, std::vector<std::uint16_t>(tokens * H));
    std::vector<std::vector<std::int32_t>> hidx(ranks, std::vector<std::int32_t>(tokens * k));
    std::vector<std::vector<float>> hw(ranks, std::vector<float>(tokens * k)), hs(ranks);
    std::vector<std::vector<std::uint8_t>> hq(ranks);
    std::uint64_t payload_rows = 0;  // rows rank 0 receives from other ranks
    std::vector<int> pool(experts);
    for (int r = 0; r < ranks; ++r) {
      for (auto& v : hx[r]) v = float_to_bf16(float(int(g() % 2001) - 1000) / 256.f);
      for (std::uint64_t t = 0; t < tokens; ++t) {
        for (int e = 0; e < experts; ++e) pool[e] = e;
        std::shuffle(pool.begin(), pool.end(), g);
        bool to0 = false;
        for (std::uint64_t j = 0; j < k; ++j) {
          hidx[r][t * k + j] = pool[j];
          hw[r][t * k + j] = float(g() % 1000 + 1) / 4096.f;
          to0 = to0 || pool[j] / epr == 0;
        }
        if (r != 0 && to0) ++payload_rows;
      }
      CK(cudaMemcpy(x[r], hx[r].data(), tokens * H * 2, cudaMemcpyHostToDevice));
      if (fp8) {  // the same tokens, quantised; the reference below reads them back as the experts do
        std::vector<float> xf(H);
        hq[r].assign(tokens * H, 0);
        hs[r].assign(tokens * S, 0.f);
        for (std::uint64_t t = 0; t < tokens; ++t) {
          for (std::uint64_t h = 0; h < H; ++h) xf[h] = bf16_to_float(hx[r][t * H + h]);
          reccl::moe::quantize_e4m3_row(xf.data(), hidden, hq[r].data() + t * H, hs[r].data() + t * S);
        }
        CK(cudaMemcpy(xq[r], hq[r].data(), tokens * H, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(xs[r], hs[r].data(), tokens * S * 4, cudaMemcpyHostToDevice));
      }
      CK(cudaMemcpy(idx[r], hidx[r].data(), tokens * k * 4, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(w[r], hw[r].data(), tokens * k * 4, cudaMemcpyHostToDevice));
      CK(cudaMemset(out[r], 0xff, tokens * H * 2));
    }
    auto dispatch = [&](int r) {
      if (fp8) ex[r]->dispatch(reccl::moe::fp8_tokens{xq[r], xs[r]}, idx[r], tokens, st[r]);
      else ex[r]->dispatch(x[r], idx[r], tokens, st[r]);
    };
    auto layer = [&](int r) {
      dispatch(r);
      if (fp8) {
        auto const rec = ex[r]->received_fp8();
        fp8_experts_kernel<<<132, 256, 0, st[r]>>>(rec.values, rec.scales, y[r], ex[r]->expert_offsets(), ex[r]->expert_counts(), epr, r,
                                                   hidden);
      } else {
        experts_kernel<<<132, 256, 0, st[r]>>>(ex[r]->received(), y[r], ex[r]->expert_offsets(), ex[r]->expert_counts(), epr, r, hidden);
      }
      ex[r]->combine(y[r], w[r], out[r], st[r]);
    };
    auto combine_pair = [&](int r) {  // the expert kernel is not part of either figure: timed with dispatch only
      dispatch(r);
      ex[r]->combine(y[r], w[r], out[r], st[r]);
    };
    // check once, end to end
    for (int r = 0; r < ranks; ++r) layer(r);
    for (auto s : st) CK(cudaStreamSynchronize(s));
    for (auto& c : comms) c.check();
    long wrong = 0;
    std::vector<std::uint16_t> got(tokens * H);
    for (int r = 0; r < ranks; ++r) {
      CK(cudaMemcpy(got.data(), out[r], tokens * H * 2, cudaMemcpyDeviceToHost));
      for (std::uint64_t t = 0; t < tokens; ++t)
        for (std::uint64_t h = 0; h < H; ++h) {
          float acc = 0.f;
          for (std::uint64_t j = 0; j < k; ++j) {
            int const e = hidx[r][t * k + j];
            float const xv = fp8 ? reccl::moe::e4m3_to_float(hq[r][t * H + h]) * hs[r][t * S + h / reccl::moe::fp8_block]
                                 : bf16_to_float(hx[r][t * H + h]);
            float const yv = bf16_to_float(float_to_bf16(xv * (1.f + float(e) / 8.f)));
            acc = std::fma(hw[r][t * k + j], yv, acc);
          }
          wrong += got[t * H + h] != float_to_bf16(acc);
        }
    }
    int const iters = iters_for(tokens);
    auto time = [&](auto&& issue) {
      auto exec = reccl_bench::capture_per_rank(st, iters, issue);
      return reccl_bench::time_graphs(st, exec, iters, reps);
    };
    double const us_dispatch = time(dispatch);
    double const us_pair = time(combine_pair);
    std::uint64_t const payload = payload_rows * row_bytes;
    double const us_floor = time([&](int r) {
      CK(cudaMemcpyAsync(floor_dst[r], floor_src[r], std::max<std::uint64_t>(payload, 2), cudaMemcpyDeviceToDevice, st[r]));
    });
    double const us_empty = time([&](int r) { empty_kernel<<<1, 32, 0, st[r]>>>(); });
    for (auto& c : comms) c.check();
#ifdef RECCL_MOE_TRACE
    {  // one more eager layer; CTA 0's timestamps per step, in us after rank 0's layout began
      for (int r = 0; r < ranks; ++r) layer(r);
      for (auto s : st) CK(cudaStreamSynchronize(s));
      unsigned long long tr[reccl::device::max_memory_ranks][16];
      CK(cudaMemcpyFromSymbol(tr, reccl::device::moe_detail::moe_trace, sizeof(tr)));
      char const* const table_names[12] = {"dispatch", "layout end", "table", "plan", "sent", "padded", "waited", "dispatch end",
                                           "combine", "returned", "waited", "combine end"};
      char const* const staged_names[12] = {"dispatch", "published", "agreed", "planned", "sent", "filed", "waited", "dispatch end",
                                            "combine", "returned", "waited", "combine end"};
      int const table_order[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, staged_order[12] = {0, 1, 2, 4, 6, 3, 5, 7, 8, 9, 10, 11};
      for (int r = 0; r < ranks; ++r) {
        std::printf("  trace rank %d, %llu tokens:", r, static_cast<unsigned long long>(tokens));
        for (int i = 0; i < 12; ++i) {
          int const q = staged ? staged_order[i] : table_order[i];
          std::printf(" %s %.1f", (staged ? staged_names : table_names)[q], (double(tr[r][q]) - double(tr[0][0])) / 1e3);
          if (staged && q == 0) std::printf(" routed %.1f", (double(tr[r][15]) - double(tr[0][0])) / 1e3);
          if (staged && q == 6)  // the plan's parts, between waited and planned
            for (int p : {12, 13, 14}) std::printf(" %s %.1f", p == 12 ? "checked" : p == 13 ? "ranked" : "scanned", (double(tr[r][p]) - double(tr[0][0])) / 1e3);
        }
        std::printf("\n");
      }
    }
#endif
    double const us_combine = us_pair - us_dispatch;
    std::printf("%8llu %12.2f %12.2f %14.2f %12.2f %10.2f %12.3f %8ld\n", static_cast<unsigned long long>(tokens), us_dispatch, us_combine,
                us_pair, us_floor, us_empty, double(payload) / 1e6, wrong);
    js["results"].push_back({{"tokens", tokens}, {"dispatch_us", us_dispatch}, {"combine_us", us_combine}, {"dispatch_combine_us", us_pair},
                             {"copy_floor_us", us_floor}, {"empty_us", us_empty}, {"payload_bytes_rank0", payload},
                             {"dispatch_payload_GBps", double(payload) / (us_dispatch * 1e3)}, {"wrong", wrong}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << js.dump(1) << "\n";
  for (int r = 0; r < ranks; ++r) {
    ex[r].reset();
    for (void* p : {static_cast<void*>(x[r]), static_cast<void*>(xq[r]), static_cast<void*>(xs[r]), static_cast<void*>(y[r]), static_cast<void*>(out[r]), static_cast<void*>(floor_src[r]),
                    static_cast<void*>(floor_dst[r]), static_cast<void*>(idx[r]), static_cast<void*>(w[r])})
      CK(cudaFree(p));
  }
  return 0;
}
