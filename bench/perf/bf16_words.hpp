// bench/perf/bf16_words.hpp -- the host side of the small-message tools' checks: 4-byte words that
// each hold two bf16 values k/16 in [-4, 4), whose sums over up to four ranks are exact in bf16, and
// a count of the outputs that differ from those sums.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

namespace reccl_bench {

inline float bf16_to_float(std::uint16_t b) {
  std::uint32_t const u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

/// `words` random words of two bf16 k/16, k in [-64, 63].
inline std::vector<std::uint32_t> random_bf16_words(std::mt19937_64& g, std::size_t words) {
  std::vector<std::uint32_t> out(words);
  auto one = [&] {
    float const f = static_cast<float>(std::uniform_int_distribution<int>(-64, 63)(g)) / 16.f;
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    return u >> 16;
  };
  for (auto& w : out) w = one() | (one() << 16);
  return out;
}

/// Words of `got` (the first `words`) whose two bf16 differ from the sums of `inputs` (every rank's).
inline long wrong_sums(std::vector<std::vector<std::uint32_t>> const& inputs, std::uint32_t const* got, std::size_t words) {
  long bad = 0;
  for (std::size_t i = 0; i < words; ++i) {
    float lo = 0, hi = 0;
    for (auto const& in : inputs) {
      lo += bf16_to_float(static_cast<std::uint16_t>(in[i] & 0xffffu));
      hi += bf16_to_float(static_cast<std::uint16_t>(in[i] >> 16));
    }
    bad += bf16_to_float(static_cast<std::uint16_t>(got[i] & 0xffffu)) != lo || bf16_to_float(static_cast<std::uint16_t>(got[i] >> 16)) != hi;
  }
  return bad;
}

}  // namespace reccl_bench
