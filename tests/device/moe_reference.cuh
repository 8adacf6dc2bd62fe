// tests/device/moe_reference.cuh -- what the GPU MoE tests compare with: the experts they run on
// the device (one rounding, so host and device agree bit for bit) and the CPU engine's answer for a
// routing case (every rank's grouped rows, counts, offsets and combined outputs).
#pragma once

#include <cstdint>
#include <vector>

#include "reccl/cpu/expert_exchange.hpp"
#include "reccl/device/agent/expert_exchange.hpp"
#include "reccl/moe/fp8.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "reccl/policy/schedule/all_to_all.hpp"
#include "reccl/policy/telemetry/none.hpp"
#include "tests/cpu/moe_cases.hpp"

namespace moe_test {

using reccl_test::moe_case;

/// The experts the tests run: y = round(x * (1 + e/8)), e the global expert (one rounding, so the
/// host and the device agree bit for bit).
template <class Tok>
__global__ void experts_kernel(Tok const* grouped, Tok* y, std::int32_t const* offsets, std::int32_t const* counts, int epr,
                               int rank, int hidden) {
  for (int l = 0; l < epr; ++l) {
    float const scale = 1.f + float(rank * epr + l) / 8.f;
    std::uint64_t const lo = std::uint64_t(offsets[l]) * hidden, hi = lo + std::uint64_t(counts[l]) * hidden;
    for (std::uint64_t i = lo + blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += std::uint64_t(gridDim.x) * blockDim.x)
      y[i] = reccl::device::moe_detail::from_float<Tok>(__fmul_rn(reccl::device::moe_detail::to_float<Tok>(grouped[i]), scale));
  }
}

/// The same experts on fp8 rows: y = round(v * scale * (1 + e/8)), two fp32 products.
template <class Tok>
__global__ void fp8_experts_kernel(std::uint8_t const* v, float const* sc, Tok* y, std::int32_t const* offsets, std::int32_t const* counts,
                                   int epr, int rank, int hidden) {
  int const S = hidden / reccl::moe::fp8_block;
  for (int l = 0; l < epr; ++l) {
    float const scale = 1.f + float(rank * epr + l) / 8.f;
    std::uint64_t const lo = std::uint64_t(offsets[l]) * hidden, hi = lo + std::uint64_t(counts[l]) * hidden;
    for (std::uint64_t i = lo + blockIdx.x * blockDim.x + threadIdx.x; i < hi; i += std::uint64_t(gridDim.x) * blockDim.x) {
      float const x = __fmul_rn(reccl::moe::e4m3_to_float(v[i]), sc[(i / hidden) * S + (i % hidden) / reccl::moe::fp8_block]);
      y[i] = reccl::device::moe_detail::from_float<Tok>(__fmul_rn(x, scale));
    }
  }
}

template <class H>
H host_expert(H x, int e) {
  return H(static_cast<float>(x) * (1.f + float(e) / 8.f));
}

/// The CPU engine's answer for case `c`: every rank's grouped rows, counts, offsets and outputs.
template <class H>
struct cpu_answer {
  std::vector<std::vector<H>> grouped, out;
  std::vector<std::vector<std::int32_t>> counts, offsets;
};

template <class H>
cpu_answer<H> cpu_reference(moe_case<H> const& c, std::uint64_t max_tokens, int align) {
  int const n = c.g.nranks, epr = c.g.experts_per_rank();
  std::uint64_t const Hd = c.hidden;
  cpu_answer<H> ans;
  ans.grouped.resize(n), ans.out.resize(n), ans.counts.resize(n), ans.offsets.resize(n);
  reccl::cpu::config cfg;
  cfg.nranks = n;
  reccl::cpu::communicator comm(cfg);
  comm.run_ranks([&](int r) {
    reccl::cpu::expert_exchange<H, reccl::schedule::all_to_all, reccl::telemetry::none, reccl::allocator::equal> ex(
        comm, r, {c.g, max_tokens, c.hidden, align});
    ex.dispatch(c.x[r].data(), c.idx[r].data(), c.tokens[r]);
    auto const rec = ex.received();
    std::vector<H> y(rec.size());
    for (int l = 0; l < epr; ++l)
      for (std::int64_t p = ex.expert_offsets()[l]; p < ex.expert_offsets()[l] + ex.expert_counts()[l]; ++p)
        for (std::uint64_t h = 0; h < Hd; ++h) y[p * Hd + h] = host_expert(rec[p * Hd + h], r * epr + l);
    ans.out[r].resize(c.tokens[r] * Hd);
    ex.combine(y.data(), c.w[r].data(), ans.out[r].data());
    ans.grouped[r].assign(rec.begin(), rec.end());
    ans.counts[r].assign(ex.expert_counts().begin(), ex.expert_counts().end());
    ans.offsets[r].assign(ex.expert_offsets().begin(), ex.expert_offsets().end());
  });
  return ans;
}

/// A case's tokens quantised to fp8 rows, per rank (moe::quantize_e4m3_row of each row).
struct fp8_inputs {
  std::vector<std::vector<std::uint8_t>> values;
  std::vector<std::vector<float>> scales;
};

template <class H>
fp8_inputs quantise(moe_case<H> const& c) {
  fp8_inputs q;
  int const S = c.hidden / reccl::moe::fp8_block;
  for (int r = 0; r < c.g.nranks; ++r) {
    q.values.emplace_back(c.tokens[r] * c.hidden);
    q.scales.emplace_back(c.tokens[r] * S);
    std::vector<float> row(c.hidden);
    for (std::uint64_t t = 0; t < c.tokens[r]; ++t) {
      for (int h = 0; h < c.hidden; ++h) row[h] = static_cast<float>(c.x[r][t * c.hidden + h]);
      reccl::moe::quantize_e4m3_row(row.data(), c.hidden, q.values[r].data() + t * c.hidden, q.scales[r].data() + t * S);
    }
  }
  return q;
}

/// The CPU engine's answer for an fp8 dispatch of `q` (and a bf16 combine of the fp8 experts).
template <class H>
struct cpu_fp8_answer {
  std::vector<std::vector<std::uint8_t>> values;
  std::vector<std::vector<float>> scales;
  std::vector<std::vector<H>> out;
  std::vector<std::vector<std::int32_t>> counts, offsets;
};

template <class H>
cpu_fp8_answer<H> cpu_fp8_reference(moe_case<H> const& c, fp8_inputs const& q, std::uint64_t max_tokens, int align) {
  int const n = c.g.nranks, epr = c.g.experts_per_rank(), S = c.hidden / reccl::moe::fp8_block;
  std::uint64_t const Hd = c.hidden;
  cpu_fp8_answer<H> ans;
  ans.values.resize(n), ans.scales.resize(n), ans.out.resize(n), ans.counts.resize(n), ans.offsets.resize(n);
  reccl::cpu::config cfg;
  cfg.nranks = n;
  reccl::cpu::communicator comm(cfg);
  comm.run_ranks([&](int r) {
    reccl::cpu::expert_exchange<H, reccl::schedule::all_to_all, reccl::telemetry::none, reccl::allocator::equal> ex(
        comm, r, {c.g, max_tokens, c.hidden, align, reccl::moe::payload::fp8_e4m3});
    ex.dispatch(reccl::moe::fp8_tokens{q.values[r].data(), q.scales[r].data()}, c.idx[r].data(), c.tokens[r]);
    auto const rec = ex.received_fp8();
    std::vector<H> y(rec.values.size());
    for (int l = 0; l < epr; ++l)
      for (std::int64_t p = ex.expert_offsets()[l]; p < ex.expert_offsets()[l] + ex.expert_counts()[l]; ++p)
        for (std::uint64_t h = 0; h < Hd; ++h) {
          float const x = reccl::moe::e4m3_to_float(rec.values[p * Hd + h]) * rec.scales[p * S + h / reccl::moe::fp8_block];
          y[p * Hd + h] = H(x * (1.f + float(r * epr + l) / 8.f));
        }
    ans.out[r].resize(c.tokens[r] * Hd);
    ex.combine(y.data(), c.w[r].data(), ans.out[r].data());
    ans.values[r].assign(rec.values.begin(), rec.values.end());
    ans.scales[r].assign(rec.scales.begin(), rec.scales.end());
    ans.counts[r].assign(ex.expert_counts().begin(), ex.expert_counts().end());
    ans.offsets[r].assign(ex.expert_offsets().begin(), ex.expert_offsets().end());
  });
  return ans;
}

/// Case `c` as the live ranks see it with rank `dead` masked: it sends nothing, and every slot
/// whose expert it holds is unused (-1).
template <class H>
moe_case<H> without_rank(moe_case<H> c, int dead) {
  c.tokens[dead] = 0, c.x[dead].clear(), c.idx[dead].clear(), c.w[dead].clear();
  for (auto& idx : c.idx)
    for (auto& e : idx)
      if (e >= 0 && c.g.rank_of(e) == dead) e = -1;
  return c;
}

/// Slots of rank r's tokens on rank `dead`, and tokens with at least one such slot.
template <class H>
reccl::moe::drop_report expected_drops(moe_case<H> const& c, int r, int dead) {
  reccl::moe::drop_report d{};
  int const k = c.g.top_k;
  for (std::uint64_t t = 0; t < c.tokens[r]; ++t) {
    int lost = 0;
    for (int j = 0; j < k; ++j) {
      std::int32_t const e = c.idx[r][t * k + j];
      lost += e >= 0 && c.g.rank_of(e) == dead;
    }
    d.slots += lost;
    d.tokens += lost > 0;
  }
  return d;
}

}  // namespace moe_test
