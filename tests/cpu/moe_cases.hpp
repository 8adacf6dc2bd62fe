// Random MoE routing cases shared by the CPU engine's and the GPU's expert-exchange tests: every
// rank's tokens, top-k expert indices and weights, for uniform, skewed (experts with no token),
// sparse (unused slots, tokens with none) and one-rank (every token to the last rank) routing.
#pragma once

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <reccl/moe/routing.hpp>

namespace reccl_test {

enum class routing_kind { uniform, skewed, one_rank, sparse };

/// Every rank's tokens and routing for one case.
template <class Tok>
struct moe_case {
  reccl::moe::routing g;
  int hidden;
  std::vector<std::uint64_t> tokens;            // per rank
  std::vector<std::vector<Tok>> x;              // [tokens, hidden]
  std::vector<std::vector<std::int32_t>> idx;   // [tokens, k]
  std::vector<std::vector<float>> w;            // [tokens, k]
};

template <class Tok>
moe_case<Tok> make_moe_case(reccl::moe::routing g, int hidden, std::uint64_t max_tokens, routing_kind kind, std::uint32_t seed) {
  std::mt19937 rng(seed);
  moe_case<Tok> c{g, hidden, {}, {}, {}, {}};
  int const n = g.nranks, k = g.top_k;
  for (int r = 0; r < n; ++r) {
    std::uint64_t const t_n = r == 0 ? max_tokens : rng() % (max_tokens + 1);  // rank 0 full, others any (0 too)
    c.tokens.push_back(t_n);
    std::vector<Tok> x(t_n * hidden);
    for (auto& v : x) v = Tok(float(int(rng() % 2001) - 1000) / 64.f);
    std::vector<std::int32_t> idx(t_n * k);
    std::vector<float> w(t_n * k);
    for (std::uint64_t t = 0; t < t_n; ++t) {
      std::vector<int> pool(g.n_experts);
      for (int e = 0; e < g.n_experts; ++e) pool[e] = e;
      if (kind == routing_kind::skewed) {  // most slots on the first experts: rank 0's, half of the rest never chosen
        for (int j = 0; j < k; ++j) idx[t * k + j] = -1;
        int const hot = std::max(k, g.n_experts / 4);
        std::shuffle(pool.begin(), pool.begin() + hot, rng);
        for (int j = 0; j < k; ++j) idx[t * k + j] = pool[j];
      } else if (kind == routing_kind::one_rank) {  // every token to experts of rank n-1
        int const epr = g.experts_per_rank();
        std::shuffle(pool.begin() + (n - 1) * epr, pool.end(), rng);
        for (int j = 0; j < k; ++j) idx[t * k + j] = j < epr ? pool[(n - 1) * epr + j] : -1;
      } else {
        std::shuffle(pool.begin(), pool.end(), rng);
        for (int j = 0; j < k; ++j) idx[t * k + j] = pool[j];
        if (kind == routing_kind::sparse)
          for (int j = 0; j < k; ++j)
            if (rng() % 3 == 0) idx[t * k + j] = -1;  // unused slots, some tokens with none
      }
      for (int j = 0; j < k; ++j) w[t * k + j] = float(rng() % 1000 + 1) / 1024.f + 1e-3f * float(j);
    }
    c.x.push_back(std::move(x));
    c.idx.push_back(std::move(idx));
    c.w.push_back(std::move(w));
  }
  return c;
}

}  // namespace reccl_test
