// tests/device/a2av_plan.hpp -- one all-to-allv case for the GPU tests: per-pair counts with zeros
// and odd values, offsets with gaps, and every source's send bytes, drawn from a seed (every
// process of a multi-process test draws the same case).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace a2av_test {

constexpr unsigned char poison = 0xA5;  ///< receive buffers are filled with it before a call

/// One case: counts[s][d] in elements of T, offsets with gaps; host copies of the send data.
/// Receivers d with bit d of `full` get max_count elements from every source.
struct plan {
  std::vector<std::vector<std::int64_t>> counts, offsets;
  std::vector<std::vector<unsigned char>> data;  // per source, bytes
};

template <class T>
plan make_plan(int n, std::uint32_t seed, std::int64_t max_count, std::uint64_t full = 0) {
  std::mt19937 rng(seed);
  plan p;
  p.counts.assign(n, std::vector<std::int64_t>(n));
  p.offsets.assign(n, std::vector<std::int64_t>(n));
  p.data.resize(n);
  for (int s = 0; s < n; ++s) {
    std::int64_t at = 0;
    for (int d = 0; d < n; ++d) {
      p.counts[s][d] = rng() % 5 == 0 ? 0 : std::int64_t(rng() % (max_count + 1));
      if ((full >> d) & 1u) p.counts[s][d] = max_count;
      p.offsets[s][d] = at;
      at += p.counts[s][d] + std::int64_t(rng() % 3);  // gaps (and misaligned starts)
    }
    p.data[s].resize(at * sizeof(T));
    for (auto& b : p.data[s]) b = static_cast<unsigned char>(rng() % 251 + 1);  // never the poison pattern alone
  }
  return p;
}

}  // namespace a2av_test
