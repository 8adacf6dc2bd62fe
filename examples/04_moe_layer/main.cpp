// A small mixture-of-experts layer over 4 expert-parallel ranks on the CPU engine (ranks are
// threads): router -> dispatch -> one matmul per expert on its grouped rows -> combine. Every
// token's output is checked bitwise against a single-rank reference that runs the same layer with
// every expert local.
//
//   moe_layer [--ranks N] [--tokens T] [--experts E] [--top-k K] [--hidden H] [--layers L]
//
// Exit status: 0 if every output matched, 1 if one did not, 2 on a usage error.
// The same layer on the GPU, every step on the device: gpu.cu (moe_layer_gpu).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <reccl/cpu/expert_exchange.hpp>
#include <reccl/policy/allocator/equal.hpp>
#include <reccl/policy/schedule/all_to_all.hpp>
#include <reccl/policy/telemetry/none.hpp>

using namespace reccl;
using bf16 = reccl::bfloat16;
using exchange = cpu::expert_exchange<bf16, schedule::all_to_all, telemetry::none, allocator::equal>;

namespace {

struct layer_shape {
  int ranks = 4, tokens = 64, experts = 16, top_k = 4, hidden = 64, layers = 3;
};

/// The model: a router [H, E] and one [H, H] matrix per expert (float), the same on every rank.
struct model {
  std::vector<float> router;                 // [H, E]
  std::vector<std::vector<float>> expert_w;  // E x [H, H]
};

model make_model(layer_shape const& s, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f / std::sqrt(float(s.hidden)));
  model m;
  m.router.resize(std::size_t(s.hidden) * s.experts);
  for (float& v : m.router) v = nd(rng);
  m.expert_w.assign(s.experts, std::vector<float>(std::size_t(s.hidden) * s.hidden));
  for (auto& w : m.expert_w)
    for (float& v : w) v = nd(rng);
  return m;
}

/// Router: the top-k experts of each token by logit (ties to the lower index) and their softmax weights.
void route(layer_shape const& s, model const& m, bf16 const* x, int tokens, std::int32_t* idx, float* w) {
  std::vector<float> logit(s.experts);
  std::vector<int> order(s.experts);
  for (int t = 0; t < tokens; ++t) {
    for (int e = 0; e < s.experts; ++e) {
      float acc = 0.f;
      for (int h = 0; h < s.hidden; ++h) acc += float(x[std::size_t(t) * s.hidden + h]) * m.router[std::size_t(h) * s.experts + e];
      logit[e] = acc;
    }
    for (int e = 0; e < s.experts; ++e) order[e] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return logit[a] > logit[b]; });
    float sum = 0.f;
    for (int j = 0; j < s.top_k; ++j) sum += std::exp(logit[order[j]] - logit[order[0]]);
    for (int j = 0; j < s.top_k; ++j) {
      idx[t * s.top_k + j] = order[j];
      w[t * s.top_k + j] = std::exp(logit[order[j]] - logit[order[0]]) / sum;
    }
  }
}

/// One expert on `rows` rows: y = bf16(x @ W_e), accumulated in fp32.
void expert_matmul(layer_shape const& s, model const& m, int e, bf16 const* x, bf16* y, std::int64_t rows) {
  std::vector<float> acc(s.hidden);
  for (std::int64_t r = 0; r < rows; ++r) {
    std::fill(acc.begin(), acc.end(), 0.f);
    for (int i = 0; i < s.hidden; ++i) {
      float const xi = float(x[r * s.hidden + i]);
      for (int o = 0; o < s.hidden; ++o) acc[o] += xi * m.expert_w[e][std::size_t(i) * s.hidden + o];
    }
    for (int o = 0; o < s.hidden; ++o) y[r * s.hidden + o] = bf16(acc[o]);
  }
}

/// The layer on one rank with every expert local: each slot's expert output, then the fp32 sum in
/// top-k order, rounded once (what combine computes).
std::vector<bf16> reference_layer(layer_shape const& s, model const& m, std::vector<bf16> const& x, int tokens) {
  std::vector<std::int32_t> idx(std::size_t(tokens) * s.top_k);
  std::vector<float> w(idx.size());
  route(s, m, x.data(), tokens, idx.data(), w.data());
  std::vector<bf16> out(x.size()), y(s.hidden);
  for (int t = 0; t < tokens; ++t) {
    std::vector<float> acc(s.hidden, 0.f);
    for (int j = 0; j < s.top_k; ++j) {
      expert_matmul(s, m, idx[t * s.top_k + j], x.data() + std::size_t(t) * s.hidden, y.data(), 1);
      for (int h = 0; h < s.hidden; ++h) acc[h] = std::fma(w[t * s.top_k + j], float(y[h]), acc[h]);
    }
    for (int h = 0; h < s.hidden; ++h) out[std::size_t(t) * s.hidden + h] = bf16(acc[h]);
  }
  return out;
}

bool parse(int argc, char** argv, layer_shape& s) {
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const k = argv[i];
    int const v = std::atoi(argv[i + 1]);
    if (k == "--ranks") s.ranks = v;
    else if (k == "--tokens") s.tokens = v;
    else if (k == "--experts") s.experts = v;
    else if (k == "--top-k") s.top_k = v;
    else if (k == "--hidden") s.hidden = v;
    else if (k == "--layers") s.layers = v;
    else return false;
  }
  return argc % 2 == 1 && s.ranks >= 1 && s.tokens >= 0 && s.hidden >= 1 && s.layers >= 1 && s.top_k >= 1 &&
         s.top_k <= s.experts && s.experts % s.ranks == 0;
}

}  // namespace

int main(int argc, char** argv) {
  layer_shape s;
  if (!parse(argc, argv, s)) {
    std::fprintf(stderr, "usage: moe_layer [--ranks N] [--tokens T] [--experts E] [--top-k K] [--hidden H] [--layers L]\n"
                         "  (E a multiple of N, 1 <= K <= E)\n");
    return 2;
  }
  model const m = make_model(s, 2026);
  // Every rank's tokens: rank r holds a different number of them (tokens - 3r, at least 1).
  std::vector<std::vector<bf16>> x(s.ranks);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> ud(-1.f, 1.f);
  for (int r = 0; r < s.ranks; ++r) {
    x[r].resize(std::size_t(std::max(1, s.tokens - 3 * r)) * s.hidden);
    for (bf16& v : x[r]) v = bf16(ud(rng));
  }
  std::vector<std::vector<bf16>> expect = x;
  for (int l = 0; l < s.layers; ++l)  // the reference: layer after layer, each token alone
    for (int r = 0; r < s.ranks; ++r) expect[r] = reference_layer(s, m, expect[r], int(expect[r].size() / s.hidden));

  try {
    cpu::config cfg;
    cfg.nranks = s.ranks;
    cfg.n_vts = 2;
    cpu::communicator comm(cfg);
    std::vector<std::uint64_t> received_rows(s.ranks), held(s.ranks);
    comm.run_ranks([&](int r) {
      int const tokens = int(x[r].size() / s.hidden);
      exchange ex(comm, r, {{s.ranks, s.experts, s.top_k}, std::uint64_t(std::max(1, s.tokens)), s.hidden, 8});
      std::vector<std::int32_t> idx(std::size_t(tokens) * s.top_k);
      std::vector<float> w(idx.size());
      std::vector<bf16> h = x[r], y;
      int const epr = s.experts / s.ranks;
      for (int l = 0; l < s.layers; ++l) {
        route(s, m, h.data(), tokens, idx.data(), w.data());
        auto const d = ex.dispatch(h.data(), idx.data(), std::uint64_t(tokens));
        received_rows[r] += d.rows_in;
        auto const rows = ex.received();
        y.assign(rows.size(), bf16{});
        for (int e = 0; e < epr; ++e)  // the grouped matmul: each local expert on its rows
          expert_matmul(s, m, r * epr + e, rows.data() + std::size_t(ex.expert_offsets()[e]) * s.hidden,
                        y.data() + std::size_t(ex.expert_offsets()[e]) * s.hidden, ex.expert_counts()[e]);
        ex.combine(y.data(), w.data(), h.data());
      }
      x[r] = h;
      held[r] = ex.memory_bytes();
    });
    int wrong = 0;
    for (int r = 0; r < s.ranks; ++r)
      for (std::size_t i = 0; i < x[r].size(); ++i) wrong += !(x[r][i] == expect[r][i]);
    for (int r = 0; r < s.ranks; ++r)
      std::printf("rank %d: %zu tokens, %llu token rows received over %d layers, exchange holds %llu bytes\n", r,
                  x[r].size() / s.hidden, static_cast<unsigned long long>(received_rows[r]), s.layers,
                  static_cast<unsigned long long>(held[r]));
    std::printf("%d ranks, %d experts, top-%d, hidden %d, %d layers: %s\n", s.ranks, s.experts, s.top_k, s.hidden, s.layers,
                wrong == 0 ? "every output matches the single-rank reference bitwise" : "WRONG RESULT");
    return wrong == 0 ? 0 : 1;
  } catch (reccl::error const& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
