// Telemetry: the counter policies and the cost model T = α·stalls + β·bytes + Δ (least-squares fit
// over a sliding window, and the quantized integer form every rank evaluates).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>

#include <reccl/policy/telemetry/cost_model.hpp>
#include <reccl/policy/telemetry/none.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>

using namespace reccl;

static_assert(Telemetry<telemetry::none>);
static_assert(Telemetry<telemetry::stalls>);
static_assert(!telemetry::none::enabled && telemetry::stalls::enabled);
static_assert(std::is_empty_v<telemetry::none>);
static_assert(std::is_trivially_copyable_v<telemetry::cost_model_q>);

namespace {
struct not_constant {  // `enabled` is not a constant expression: not a Telemetry
  bool enabled = true;
  void add_stalls(int, std::uint64_t) {}
  void add_bytes(int, std::uint64_t) {}
  void merge(not_constant const&) {}
  void reset() {}
  std::uint64_t stall_count(int) const { return 0; }
  std::uint64_t byte_count(int) const { return 0; }
};
}  // namespace
static_assert(!Telemetry<not_constant>);

TEST_CASE("telemetry::none counts nothing") {
  telemetry::none t;
  t.add_stalls(0, 5);
  t.add_bytes(3, 100);
  CHECK(t.stall_count(0) == 0);
  CHECK(t.byte_count(3) == 0);
}

TEST_CASE("telemetry::stalls counts per VT, merges, resets, ignores VTs out of range") {
  std::mt19937_64 rng(3);
  telemetry::stalls a{}, b{};
  std::uint64_t want_s[max_vts] = {}, want_b[max_vts] = {};
  for (int k = 0; k < 10000; ++k) {
    int const vt = static_cast<int>(rng() % max_vts);
    std::uint64_t const n = rng() % 1000;
    telemetry::stalls& t = (k & 1) ? a : b;
    if (rng() & 1) t.add_stalls(vt, n), want_s[vt] += n;
    else t.add_bytes(vt, n), want_b[vt] += n;
  }
  a.add_stalls(-1, 7);
  a.add_bytes(max_vts, 7);
  a.merge(b);
  for (int i = 0; i < max_vts; ++i) {
    CHECK(a.stall_count(i) == want_s[i]);
    CHECK(a.byte_count(i) == want_b[i]);
  }
  CHECK(a.stall_count(max_vts) == 0);
  CHECK(a.byte_count(-3) == 0);
  a.reset();
  for (int i = 0; i < max_vts; ++i) CHECK(a.stall_count(i) + a.byte_count(i) == 0);
}

TEST_CASE("cost model: least squares recovers known alpha, beta, delta from noisy samples") {
  double const alpha = 37.5, beta = 0.0215, delta = 25000;  // ns per stall, ns per byte (46.5 GB/s), ns
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<std::uint64_t> stalls(0, 2000);
  std::uniform_real_distribution<double> log_bytes(12, 24);  // 4 KB .. 16 MB, log-uniform
  std::normal_distribution<double> noise(0.0, 0.02);         // 2% multiplicative
  telemetry::cost_model<2048> m;
  for (int k = 0; k < 2048; ++k) {
    std::uint64_t const s = stalls(rng), b = static_cast<std::uint64_t>(std::exp2(log_bytes(rng)));
    double const t = (alpha * static_cast<double>(s) + beta * static_cast<double>(b) + delta) * (1 + noise(rng));
    m.add(s, b, t);
  }
  telemetry::cost_fit const f = m.fit();
  REQUIRE(f.ok);
  CHECK(f.samples == 2048);
  CHECK(f.alpha_identified);
  CHECK(f.beta_identified);
  MESSAGE("fit of alpha=" << alpha << " beta=" << beta << " delta=" << delta << " from 2048 samples with 2% noise: alpha="
                          << f.alpha << " beta=" << f.beta << " delta=" << f.delta << " R2=" << f.r2);
  CHECK(f.alpha == doctest::Approx(alpha).epsilon(0.01));
  CHECK(f.beta == doctest::Approx(beta).epsilon(0.01));
  CHECK(f.delta == doctest::Approx(delta).epsilon(0.01));
  CHECK(f.r2 > 0.99);
  CHECK(f.r2 <= 1.0);
}

TEST_CASE("cost model: the window slides, so the fit follows a change of the path") {
  std::mt19937_64 rng(12);
  std::uniform_int_distribution<std::uint64_t> stalls(0, 5000), bytes(1 << 20, 32 << 20);
  telemetry::cost_model<256> m;
  for (int k = 0; k < 1000; ++k) {  // old regime: fast path
    std::uint64_t const s = stalls(rng), b = bytes(rng);
    m.add(s, b, 10.0 * static_cast<double>(s) + 0.01 * static_cast<double>(b) + 1000);
  }
  for (int k = 0; k < 256; ++k) {  // new regime, exactly one window of it
    std::uint64_t const s = stalls(rng), b = bytes(rng);
    m.add(s, b, 80.0 * static_cast<double>(s) + 0.05 * static_cast<double>(b) + 9000);
  }
  CHECK(m.size() == 256);
  telemetry::cost_fit const f = m.fit();
  REQUIRE(f.ok);
  CHECK(f.alpha == doctest::Approx(80.0).epsilon(1e-6));
  CHECK(f.beta == doctest::Approx(0.05).epsilon(1e-6));
  CHECK(f.delta == doctest::Approx(9000).epsilon(1e-4));
  CHECK(f.r2 == doctest::Approx(1.0).epsilon(1e-9));
  m.clear();
  CHECK(m.size() == 0);
  CHECK(!m.fit().ok);
}

TEST_CASE("cost model: a regressor that does not vary is reported as not identified") {
  std::mt19937_64 rng(13);
  telemetry::cost_model<512> m;
  for (int k = 0; k < 300; ++k) {  // a healthy network: never a stall
    std::uint64_t const b = (1 << 20) + rng() % (16 << 20);
    m.add(0, b, 0.02 * static_cast<double>(b) + 3000);
  }
  telemetry::cost_fit f = m.fit();
  REQUIRE(f.ok);
  CHECK(!f.alpha_identified);
  CHECK(f.beta_identified);
  CHECK(f.alpha == 0);
  CHECK(f.beta == doctest::Approx(0.02).epsilon(1e-9));
  CHECK(f.delta == doctest::Approx(3000).epsilon(1e-6));

  telemetry::cost_model<16> two;
  two.add(1, 1, 1);
  two.add(2, 2, 2);
  CHECK(!two.fit().ok);  // fewer than 3 samples

  telemetry::cost_model<64> lockstep;  // stalls proportional to bytes: only bytes are kept
  for (int k = 1; k <= 50; ++k) lockstep.add(10 * k, 1000 * k, 5.0 * k + 7);
  f = lockstep.fit();
  REQUIRE(f.ok);
  CHECK(!f.alpha_identified);
  CHECK(f.beta == doctest::Approx(0.005).epsilon(1e-9));
}

TEST_CASE("cost_model_q evaluates the quantized model within rounding of the double formula") {
  std::mt19937_64 rng(14);
  for (int k = 0; k < 20000; ++k) {
    telemetry::cost_fit f;
    f.alpha = std::ldexp(static_cast<double>(rng() % 60000), -static_cast<int>(rng() % 12));  // 0 .. 6e4 ns/stall
    f.beta = std::ldexp(static_cast<double>(rng() % 100000), -static_cast<int>(8 + rng() % 16));
    f.delta = static_cast<double>(rng() % 1000000);
    telemetry::cost_model_q const q = quantize(f, 7);
    CHECK(q.from_epoch == 7);
    std::uint64_t const s = rng() % (1u << 24), b = rng() >> (24 + rng() % 24);
    double const want = f.alpha * static_cast<double>(s) + f.beta * static_cast<double>(b) + f.delta;
    double const got = static_cast<double>(q.eval(s, b));
    // Quantization of α and β (2^-25 ns each, times the count) plus two floors.
    double const tol = 2.0 + (static_cast<double>(s) + static_cast<double>(b)) * std::ldexp(1.0, -24) + want * 1e-15;
    CHECK(std::fabs(got - want) <= tol);
  }
}

TEST_CASE("cost_model_q: saturates instead of wrapping, negative or NaN fits become zero") {
  telemetry::cost_model_q q;
  q.alpha = telemetry::cost_model_q::coef_limit;
  q.beta = telemetry::cost_model_q::coef_limit;
  q.delta = 1;
  CHECK(q.eval(~0ull, 0) == ~0ull);
  CHECK(q.eval(0, ~0ull) == ~0ull);
  CHECK(q.eval(1ull << 50, 0) == ~0ull);                   // 2^50 * 2^40 / 2^24 = 2^66
  CHECK(q.eval(1ull << 40, 1ull << 40) == (1ull << 57) - (1ull << 17) + 1);  // 2 * (2^40 - 1) * 2^16 + 1, exact
  telemetry::cost_fit f;
  f.alpha = -3;
  f.beta = std::nan("");
  f.delta = -100;
  telemetry::cost_model_q const z = quantize(f, 0);
  CHECK(z.alpha == 0);
  CHECK(z.beta == 0);
  CHECK(z.delta == 0);
  CHECK(z.eval(12345, 678910) == 0);
  f.alpha = 1e30;  // beyond the Q24 range: clamped
  CHECK(quantize(f, 0).alpha == telemetry::cost_model_q::coef_limit);
}

TEST_CASE("cost_model_q evaluates in constant expressions (integer only)") {
  constexpr telemetry::cost_model_q q{};
  static_assert(q.eval(0, 0) == 0);
  static_assert(q.eval(1, 0) == 100);           // default prior: 100 ns per stall
  static_assert(q.eval(0, 50'000'000) == 999999);  // 50 MB at 50 GB/s: 1 ms, less the Q24 rounding
  CHECK(q.eval(3, 0) == 300);
}
