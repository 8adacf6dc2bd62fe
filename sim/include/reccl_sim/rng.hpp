// reccl_sim/rng.hpp -- the simulator's random numbers: seeded, portable, reproducible.
//
//   seed ──splitmix64──▶ xoshiro256** state ──▶ uniform() in [0,1) ──Box–Muller──▶ normal()
//
// The standard library's distributions are implementation-defined (libstdc++ and libc++ give
// different sequences for the same engine), so the simulator carries its own: the same seed gives
// the same numbers on every compiler and platform, which is what "same seed, same output" needs.
#pragma once

#include <cmath>
#include <cstdint>

namespace reccl_sim {

/// splitmix64 step (Steele, Lea, Flood 2014): a good 64-bit mixer; also used as a stateless hash.
inline std::uint64_t splitmix64(std::uint64_t& x) {
  std::uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/// Stateless hash of up to four values (ECMP path choice, per-collective coin flips).
inline std::uint64_t hash_mix(std::uint64_t a, std::uint64_t b = 0, std::uint64_t c = 0, std::uint64_t d = 0) {
  std::uint64_t x = a;
  std::uint64_t h = splitmix64(x);
  x ^= b + h;
  h ^= splitmix64(x);
  x ^= c + h;
  h ^= splitmix64(x);
  x ^= d + h;
  return h ^ splitmix64(x);
}

/// xoshiro256** (Blackman, Vigna 2018) seeded through splitmix64.
class rng {
 public:
  explicit rng(std::uint64_t seed = 1) {
    std::uint64_t x = seed;
    for (auto& w : s_) w = splitmix64(x);
  }
  std::uint64_t next() {
    std::uint64_t const result = rotl(s_[1] * 5, 7) * 9;
    std::uint64_t const t = s_[1] << 17;
    s_[2] ^= s_[0];
    s_[3] ^= s_[1];
    s_[1] ^= s_[2];
    s_[0] ^= s_[3];
    s_[2] ^= t;
    s_[3] = rotl(s_[3], 45);
    return result;
  }
  /// Uniform in [0, 1), 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  /// Standard normal (Box–Muller; the second value of each pair is kept for the next call).
  double normal() {
    if (has_spare_) {
      has_spare_ = false;
      return spare_;
    }
    double u = 0;
    do u = uniform();
    while (u <= 0);
    double const v = uniform();
    double const r = std::sqrt(-2.0 * std::log(u)), a = 6.283185307179586 * v;
    spare_ = r * std::sin(a);
    has_spare_ = true;
    return r * std::cos(a);
  }

 private:
  static std::uint64_t rotl(std::uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  std::uint64_t s_[4] = {};
  double spare_ = 0;
  bool has_spare_ = false;
};

}  // namespace reccl_sim
