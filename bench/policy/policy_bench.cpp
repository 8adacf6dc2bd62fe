// Micro-benchmarks of the policy layer: what a rank spends per collective on the split, the
// allocator update and the control step (these run on every rank, at every collective), and the
// host-side cost-model fit (run now and then on one rank).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include <reccl/policy/allocator/aimd.hpp>
#include <reccl/policy/allocator/proportional.hpp>
#include <reccl/policy/allocator/texcp.hpp>
#include <reccl/policy/control.hpp>
#include <reccl/policy/telemetry/cost_model.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>

namespace {

reccl::shares skewed_shares(int n) {
  std::uint64_t raw[reccl::max_vts] = {};
  for (int i = 0; i < n; ++i) raw[i] = 1000 + 137 * static_cast<std::uint64_t>(i * i);
  reccl::shares s{};
  s.n_vts = n;
  s.live_mask = reccl::all_live(n);
  reccl::detail::distribute(raw, s.live_mask, reccl::share_one, s.w);
  return s;
}

reccl::vt_observation skewed_times(int n) {
  reccl::vt_observation o{};
  o.n_vts = n;
  o.live_mask = reccl::all_live(n);
  for (int i = 0; i < n; ++i) o.time[i] = 1'000'000 + 250'000 * static_cast<std::uint64_t>(i % 5);
  return o;
}

void to_split(benchmark::State& st) {
  int const n = static_cast<int>(st.range(0));
  reccl::shares const s = skewed_shares(n);
  std::uint64_t total = 64ull << 20;
  for (auto _ : st) {
    benchmark::DoNotOptimize(total);
    reccl::split const sp = reccl::to_split(s, total, 256);
    benchmark::DoNotOptimize(sp);
  }
}
BENCHMARK(to_split)->Arg(2)->Arg(8)->Arg(16);

template <class A>
void allocator_update(benchmark::State& st) {
  int const n = static_cast<int>(st.range(0));
  A const a{};
  reccl::shares s = skewed_shares(n);
  reccl::vt_observation const o = skewed_times(n);
  for (auto _ : st) {
    benchmark::DoNotOptimize(s);
    reccl::shares const next = a.update(s, o);
    benchmark::DoNotOptimize(next);
  }
}
BENCHMARK(allocator_update<reccl::allocator::texcp>)->Name("texcp_update")->Arg(2)->Arg(8)->Arg(16);
BENCHMARK(allocator_update<reccl::allocator::proportional>)->Name("proportional_update")->Arg(8);
BENCHMARK(allocator_update<reccl::allocator::aimd>)->Name("aimd_update")->Arg(8);

/// One control step (check + combine every rank's record + allocator + probes) for nranks x n VTs.
void control_step(benchmark::State& st) {
  int const nranks = static_cast<int>(st.range(0)), n = static_cast<int>(st.range(1));
  auto const start = reccl::control<reccl::allocator::texcp>::start(n);
  reccl::split const sp = start.split_for(64ull << 20, 256);
  std::vector<reccl::epoch_record> recs(static_cast<std::size_t>(nranks));
  for (int r = 0; r < nranks; ++r) {
    reccl::telemetry::stalls tel{};
    for (int i = 0; i < n; ++i) {
      tel.add_bytes(i, sp.count[i] * 4);
      tel.add_stalls(i, 1000 + 100 * static_cast<std::uint64_t>((i + r) % 7));
    }
    recs[static_cast<std::size_t>(r)] = start.record(r, tel, 0, 0);
  }
  for (auto _ : st) {
    auto c = start;
    benchmark::DoNotOptimize(c);
    reccl::epoch_report rep{};
    reccl::step_result const res = c.step(recs.data(), nranks, &rep);
    benchmark::DoNotOptimize(res);
    benchmark::DoNotOptimize(c);
  }
}
BENCHMARK(control_step)->Args({8, 8})->Args({64, 8})->Args({64, 16});

void cost_model_fit(benchmark::State& st) {
  reccl::telemetry::cost_model<1024> m;
  std::mt19937_64 rng(1);
  for (int k = 0; k < 1024; ++k) {
    std::uint64_t const s = rng() % 5000, b = (1u << 20) + rng() % (32u << 20);
    m.add(s, b, 40.0 * static_cast<double>(s) + 0.02 * static_cast<double>(b) + 5000);
  }
  for (auto _ : st) {
    reccl::telemetry::cost_fit const f = m.fit();
    benchmark::DoNotOptimize(f);
  }
}
BENCHMARK(cost_model_fit);

}  // namespace
