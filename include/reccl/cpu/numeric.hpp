// reccl/cpu/numeric.hpp -- host element types and the reduction arithmetic of the CPU engine.
//
//   reccl::half      IEEE binary16   1 sign | 5 exponent | 10 mantissa
//   reccl::bfloat16  bfloat16        1 sign | 8 exponent |  7 mantissa
//
// Both are plain 16-bit value types: conversion from float rounds to nearest, ties to even
// (NaN stays NaN, overflow goes to infinity); conversion to float is exact. Reductions on them
// accumulate in fp32: a ⊕ b = round(float(a) op float(b)), one rounding per combine, which is
// what a GPU kernel loading __half and adding in float does.
//
// Integer sum and prod wrap modulo 2^bits (computed in the unsigned type: defined behaviour, and
// order-independent). avg is a sum during the collective; the engine divides by the rank count at
// the end (integers: truncation toward zero of the wrapped sum; floats: one division).
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

#include "../types.hpp"

namespace reccl {

namespace detail {

/// float -> binary16 bits, round to nearest even.
constexpr std::uint16_t float_to_half_bits(float f) {
  std::uint32_t x = std::bit_cast<std::uint32_t>(f);
  std::uint32_t const sign = (x >> 16) & 0x8000u;
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) return static_cast<std::uint16_t>(sign | (x > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (x < 0x38800000u) {  // below 2^-14: a half subnormal or zero
    std::uint32_t const e = x >> 23;
    if (e < 102) return static_cast<std::uint16_t>(sign);  // below 2^-25: rounds to zero
    std::uint32_t const m = (x & 0x7fffffu) | 0x800000u;
    std::uint32_t const shift = 126 - e;  // 14 .. 24
    std::uint32_t h = m >> shift;
    std::uint32_t const rem = m & ((1u << shift) - 1u), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (h & 1u))) ++h;
    return static_cast<std::uint16_t>(sign | h);
  }
  std::uint32_t h = (x >> 13) - (112u << 10);  // rebias the exponent 127 -> 15
  std::uint32_t const rem = x & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;  // a carry may reach infinity: correct
  if (h >= 0x7c00u) h = 0x7c00u;
  return static_cast<std::uint16_t>(sign | h);
}

/// binary16 bits -> float, exact.
constexpr float half_bits_to_float(std::uint16_t h) {
  std::uint32_t const sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  std::uint32_t const e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float const mag = static_cast<float>(m) * 5.9604644775390625e-8f;  // m * 2^-24, exact
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(mag));
  }
  if (e == 31) return std::bit_cast<float>(sign | 0x7f800000u | (m << 13));
  return std::bit_cast<float>(sign | ((e + 112u) << 23) | (m << 13));
}

/// float -> bfloat16 bits, round to nearest even (NaN stays a quiet NaN).
constexpr std::uint16_t float_to_bf16_bits(float f) {
  std::uint32_t const x = std::bit_cast<std::uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((x >> 16) | 0x40u);
  return static_cast<std::uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

constexpr float bf16_bits_to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

}  // namespace detail

/// IEEE binary16 value (host). Conversions round to nearest even; arithmetic is done in float.
struct half {
  std::uint16_t bits = 0;
  constexpr half() = default;
  constexpr explicit half(float f) : bits(detail::float_to_half_bits(f)) {}
  static constexpr half from_bits(std::uint16_t b) {
    half h;
    h.bits = b;
    return h;
  }
  constexpr explicit operator float() const { return detail::half_bits_to_float(bits); }
  constexpr bool operator==(half const&) const = default;  ///< bitwise equality
};

/// bfloat16 value (host). Conversions round to nearest even; arithmetic is done in float.
struct bfloat16 {
  std::uint16_t bits = 0;
  constexpr bfloat16() = default;
  constexpr explicit bfloat16(float f) : bits(detail::float_to_bf16_bits(f)) {}
  static constexpr bfloat16 from_bits(std::uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }
  constexpr explicit operator float() const { return detail::bf16_bits_to_float(bits); }
  constexpr bool operator==(bfloat16 const&) const = default;  ///< bitwise equality
};

static_assert(sizeof(half) == 2 && std::is_trivially_copyable_v<half>);
static_assert(sizeof(bfloat16) == 2 && std::is_trivially_copyable_v<bfloat16>);

/// The dtype of a host element type (for validation and messages).
template <class T> inline constexpr bool is_element_v =
    std::is_same_v<T, std::int32_t> || std::is_same_v<T, std::int64_t> || std::is_same_v<T, half> ||
    std::is_same_v<T, bfloat16> || std::is_same_v<T, float> || std::is_same_v<T, double>;

template <class T>
constexpr dtype dtype_of() {
  static_assert(is_element_v<T>, "reccl: element type must be int32_t, int64_t, half, bfloat16, float or double");
  if constexpr (std::is_same_v<T, std::int32_t>) return dtype::int32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return dtype::int64;
  else if constexpr (std::is_same_v<T, half>) return dtype::float16;
  else if constexpr (std::is_same_v<T, bfloat16>) return dtype::bfloat16;
  else if constexpr (std::is_same_v<T, float>) return dtype::float32;
  else return dtype::float64;
}

namespace cpu {

/// a ⊕ b for the reduction `op` (avg combines as sum). 16-bit types: one rounding per combine.
template <class T>
constexpr T combine(redop op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    switch (op) {
      case redop::sum:
      case redop::avg: return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
      case redop::prod: return static_cast<T>(static_cast<U>(static_cast<U>(a) * static_cast<U>(b)));
      case redop::min: return b < a ? b : a;
      case redop::max: return a < b ? b : a;
    }
    return a;
  } else if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>) {
    float const x = static_cast<float>(a), y = static_cast<float>(b);
    switch (op) {
      case redop::sum:
      case redop::avg: return T(x + y);
      case redop::prod: return T(x * y);
      case redop::min: return y < x ? b : a;
      case redop::max: return x < y ? b : a;
    }
    return a;
  } else {
    switch (op) {
      case redop::sum:
      case redop::avg: return a + b;
      case redop::prod: return a * b;
      case redop::min: return b < a ? b : a;
      case redop::max: return a < b ? b : a;
    }
    return a;
  }
}

/// The final step of redop::avg: the combined sum divided by the rank count.
template <class T>
constexpr T average(T sum, int nranks) {
  if constexpr (std::is_integral_v<T>) return static_cast<T>(sum / static_cast<T>(nranks));
  else if constexpr (std::is_same_v<T, half> || std::is_same_v<T, bfloat16>)
    return T(static_cast<float>(sum) / static_cast<float>(nranks));
  else return sum / static_cast<T>(nranks);
}

/// dst[i] = dst[i] ⊕ src[i] for i < n. The switch is outside the loop so each loop vectorizes.
template <class T>
inline void combine_into(redop op, T* dst, T const* src, std::uint64_t n) {
  switch (op) {
    case redop::sum:
    case redop::avg:
      for (std::uint64_t i = 0; i < n; ++i) dst[i] = combine(redop::sum, dst[i], src[i]);
      return;
    case redop::prod:
      for (std::uint64_t i = 0; i < n; ++i) dst[i] = combine(redop::prod, dst[i], src[i]);
      return;
    case redop::min:
      for (std::uint64_t i = 0; i < n; ++i) dst[i] = combine(redop::min, dst[i], src[i]);
      return;
    case redop::max:
      for (std::uint64_t i = 0; i < n; ++i) dst[i] = combine(redop::max, dst[i], src[i]);
      return;
  }
}

}  // namespace cpu
}  // namespace reccl
