// reccl/moe/fp8.hpp -- fp8 token rows for a MoE dispatch: e4m3 values with one fp32 scale per
// block of 128 values (DeepSeek-V3's activation format; value = e4m3 * scale), and the e4m3
// arithmetic (host and device) a reference or a user's kernel needs to make and read them.
//
//   row t of a dispatch of T tokens, hidden H (a multiple of fp8_block):
//     values[t * H + c]               e4m3 bits of value c (OCP "e4m3fn": bias 7, no infinities,
//                                     0x7f / 0xff are NaN, largest finite 448)
//     scales[t * (H / 128) + c / 128]  the block's fp32 scale
//
// A dispatch moves these bits unchanged: the receiver gets each row's values and scales bit for
// bit, laid out like the bf16 rows (received_fp8()). Quantising and dequantising are the user's,
// with the helpers below or their own kernels (cuda_fp8.h's __nv_fp8_e4m3 has the same bits).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "../config.hpp"

namespace reccl::moe {

inline constexpr int fp8_block = 128;   ///< values per scale
inline constexpr float e4m3_max = 448.f;

/// One dispatch's fp8 rows: values [T, H] (e4m3 bits) and scales [T, H / fp8_block].
struct fp8_tokens {
  std::uint8_t const* values = nullptr;
  float const* scales = nullptr;
};

/// The value of e4m3 bits `b` (NaN for 0x7f / 0xff).
RECCL_HOST_DEVICE float e4m3_to_float(std::uint8_t b) {
  int const e = (b >> 3) & 15, m = b & 7;
  float v;
  if (e == 15 && m == 7) v = NAN;
  else if (e == 0) v = ldexpf(static_cast<float>(m), -9);  // subnormal: m / 8 * 2^-6
  else v = ldexpf(static_cast<float>(8 + m), e - 10);       // (1 + m / 8) * 2^(e - 7)
  return (b & 0x80) ? -v : v;
}

/// The e4m3 bits nearest to `x` (ties to the even code), saturating at +-448; NaN gives 0x7f.
RECCL_HOST_DEVICE std::uint8_t e4m3_from_float(float x) {
  if (x != x) return 0x7f;
  std::uint32_t bits;
  memcpy(&bits, &x, 4);
  std::uint8_t const sign = (bits >> 31) ? 0x80 : 0;  // -0 too
  float const a = fabsf(x);
  if (a >= e4m3_max) return sign | 0x7e;
  // the positive codes 0 .. 0x7e are ordered like their values: the largest code whose value is <= a
  int lo = 0, hi = 0x7e;
  while (lo < hi) {
    int const mid = (lo + hi + 1) / 2;
    if (e4m3_to_float(static_cast<std::uint8_t>(mid)) <= a) lo = mid;
    else hi = mid - 1;
  }
  float const below = e4m3_to_float(static_cast<std::uint8_t>(lo)), above = e4m3_to_float(static_cast<std::uint8_t>(lo + 1));
  int code = lo;
  if (a - below > above - a || (a - below == above - a && (lo & 1))) code = lo + 1;
  return static_cast<std::uint8_t>(sign | code);
}

/// Quantises one row of `hidden` values (a multiple of fp8_block): each block's scale is its
/// largest magnitude / 448 (1 for a block of zeros), each value e4m3_from_float(x / scale). Each
/// value x comes back as e4m3_to_float(v) * scale within about 2^-4 * |x| + 2^-10 * scale (half a
/// step of e4m3's 3-bit mantissa, and of its subnormals).
RECCL_HOST_DEVICE void quantize_e4m3_row(float const* x, int hidden, std::uint8_t* values, float* scales) {
  for (int b = 0; b < hidden / fp8_block; ++b) {
    float amax = 0.f;
    for (int c = 0; c < fp8_block; ++c) amax = fmaxf(amax, fabsf(x[b * fp8_block + c]));
    float const scale = amax > 0.f ? amax / e4m3_max : 1.f;
    scales[b] = scale;
    for (int c = 0; c < fp8_block; ++c) values[b * fp8_block + c] = e4m3_from_float(x[b * fp8_block + c] / scale);
  }
}

}  // namespace reccl::moe
