// Host half / bfloat16: exact widening, round-to-nearest-even narrowing, fp32 accumulation.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include <reccl/cpu/numeric.hpp>

using reccl::bfloat16;
using reccl::half;

namespace {
// The representable neighbours of f in a 16-bit format: brute force over all 65536 patterns would
// be slow per sample, so step from the candidate the conversion gave.
template <class H>
void check_nearest_even(float f) {
  H const h(f);
  float const got = static_cast<float>(h);
  if (std::isinf(got)) return;  // overflow handled separately
  std::uint16_t const b = h.bits;
  for (int d : {-1, 1}) {
    std::uint16_t const nb = static_cast<std::uint16_t>(b + d);
    if ((nb & 0x7fff) == 0 && (b & 0x7fff) == 0) continue;
    float const other = static_cast<float>(H::from_bits(nb));
    if (std::isnan(other) || std::isinf(other)) continue;
    if (std::signbit(other) != std::signbit(got) && other != 0) continue;
    double const eg = std::fabs(static_cast<double>(f) - got), eo = std::fabs(static_cast<double>(f) - other);
    CHECK(eg <= eo);
    if (eg == eo) CHECK((b & 1u) == 0);  // ties to even
  }
}
}  // namespace

TEST_CASE("half: every bit pattern widens exactly and narrows back to itself") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    half const h = half::from_bits(static_cast<std::uint16_t>(b));
    float const f = static_cast<float>(h);
    if (std::isnan(f)) {
      CHECK(std::isnan(static_cast<float>(half(f))));
      continue;
    }
    CHECK(half(f).bits == b);
  }
}

TEST_CASE("half: rounding to nearest even, subnormals, overflow") {
  CHECK(static_cast<float>(half(1.0f)) == 1.0f);
  CHECK(half(1.0f + std::ldexp(1.0f, -11)).bits == half(1.0f).bits);  // tie -> even (1.0)
  CHECK(static_cast<float>(half(1.0f + 3 * std::ldexp(1.0f, -11))) == 1.0f + std::ldexp(1.0f, -9));
  CHECK(static_cast<float>(half(65504.0f)) == 65504.0f);
  CHECK(std::isinf(static_cast<float>(half(65520.0f))));  // halfway to 2^16 -> infinity
  CHECK(static_cast<float>(half(65519.0f)) == 65504.0f);
  CHECK(static_cast<float>(half(std::ldexp(1.0f, -24))) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(half(std::ldexp(1.0f, -25)).bits == 0);                                     // tie -> 0
  CHECK(static_cast<float>(half(3 * std::ldexp(1.0f, -26))) == std::ldexp(1.0f, -24));
  CHECK(half(-0.0f).bits == 0x8000);
  CHECK(std::isnan(static_cast<float>(half(std::nanf("")))));
  std::mt19937 g(3);
  std::uniform_real_distribution<float> u(-70000.0f, 70000.0f);
  std::uniform_real_distribution<float> small(-1e-4f, 1e-4f);
  for (int i = 0; i < 20000; ++i) {
    check_nearest_even<half>(u(g));
    check_nearest_even<half>(small(g));
  }
#if defined(__FLT16_MAX__)
  for (int i = 0; i < 200000; ++i) {
    float const f = std::bit_cast<float>(static_cast<std::uint32_t>(g()));
    if (std::isnan(f)) continue;
    auto const ref = std::bit_cast<std::uint16_t>(static_cast<_Float16>(f));
    CHECK(half(f).bits == ref);
  }
#endif
}

TEST_CASE("bfloat16: widening is exact, narrowing rounds to nearest even") {
  for (std::uint32_t b = 0; b < 65536; ++b) {
    bfloat16 const h = bfloat16::from_bits(static_cast<std::uint16_t>(b));
    float const f = static_cast<float>(h);
    if (std::isnan(f)) continue;
    CHECK(bfloat16(f).bits == b);
  }
  CHECK(bfloat16(1.0f + std::ldexp(1.0f, -8)).bits == bfloat16(1.0f).bits);
  CHECK(static_cast<float>(bfloat16(1.0f + 3 * std::ldexp(1.0f, -8))) == 1.0f + std::ldexp(1.0f, -6));
  CHECK(std::isnan(static_cast<float>(bfloat16(std::nanf("")))));
  std::mt19937 g(4);
  for (int i = 0; i < 50000; ++i) {
    float const f = std::bit_cast<float>(static_cast<std::uint32_t>(g()));
    if (std::isnan(f) || std::isinf(f)) continue;
    check_nearest_even<bfloat16>(f);
  }
}

TEST_CASE("combine: 16-bit types accumulate in fp32 with one rounding, integers wrap") {
  using reccl::redop;
  using reccl::cpu::combine;
  // 2048 + 1 = 2049 in fp32, which rounds to 2048 in half (tie to even); 2048 + 3 = 2051 -> 2052
  CHECK(static_cast<float>(combine(redop::sum, half(2048.0f), half(1.0f))) == 2048.0f);
  CHECK(static_cast<float>(combine(redop::sum, half(2048.0f), half(3.0f))) == 2052.0f);
  CHECK(static_cast<float>(combine(redop::prod, bfloat16(3.0f), bfloat16(3.0f))) == 9.0f);
  CHECK(static_cast<float>(combine(redop::min, half(-1.0f), half(2.0f))) == -1.0f);
  CHECK(static_cast<float>(combine(redop::max, bfloat16(-1.0f), bfloat16(2.0f))) == 2.0f);
  CHECK(combine(redop::sum, INT32_MAX, std::int32_t{1}) == INT32_MIN);
  CHECK(combine(redop::prod, std::int64_t{1} << 62, std::int64_t{4}) == 0);
  CHECK(combine(redop::avg, 3.5, 1.0) == 4.5);
  CHECK(reccl::cpu::average(std::int32_t{-7}, 2) == -3);
  CHECK(static_cast<float>(reccl::cpu::average(half(3.0f), 2)) == 1.5f);
  CHECK(reccl::dtype_of<half>() == reccl::dtype::float16);
  CHECK(reccl::dtype_of<bfloat16>() == reccl::dtype::bfloat16);
}
