// tests/device/p2p_reference.hpp -- shared by the P2P GPU tests: host element types and their GPU
// twins, random inputs that are never zero, and a reference written independently of reccl (long
// double accumulation, a tolerance for floats, exact wrap-around for integers).
//
// Include after defining CUDA_NO_HALF (cuda_fp16.h's global `half` would clash with reccl::half).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "reccl/cpu/numeric.hpp"
#include "reccl/types.hpp"
#include "support.cuh"

namespace p2p_test {

using reccl::collective;
using reccl::dtype;
using reccl::redop;

/// The device element type of a host element type (same size and bits).
template <class H> struct gpu_twin { using type = H; };
template <> struct gpu_twin<reccl::half> { using type = __half; };
template <> struct gpu_twin<reccl::bfloat16> { using type = __nv_bfloat16; };
template <class H> using gpu_t = typename gpu_twin<H>::type;

template <class H> constexpr bool is_int = std::is_integral_v<H>;
template <class H> constexpr bool is_f16 = std::is_same_v<H, reccl::half>;
template <class H> constexpr bool is_bf16 = std::is_same_v<H, reccl::bfloat16>;

template <class H>
constexpr dtype dtype_of() {
  if constexpr (std::is_same_v<H, std::int32_t>) return dtype::int32;
  else if constexpr (std::is_same_v<H, std::int64_t>) return dtype::int64;
  else if constexpr (is_f16<H>) return dtype::float16;
  else if constexpr (is_bf16<H>) return dtype::bfloat16;
  else if constexpr (std::is_same_v<H, float>) return dtype::float32;
  else return dtype::float64;
}

/// Exact value of a float element (conversions from CUDA's host functions and bit arithmetic,
/// not reccl's).
template <class H>
long double value_of(H x) {
  if constexpr (is_f16<H> || is_bf16<H>) {
    std::uint16_t b;
    std::memcpy(&b, &x, 2);
    return is_f16<H> ? gpu_test::half_bits_to_float(b) : gpu_test::bf16_bits_to_float(b);
  } else {
    return static_cast<long double>(x);
  }
}

/// A float element nearest to `v` (round to nearest even).
template <class H>
H element_of(double v) {
  if constexpr (is_f16<H> || is_bf16<H>) {
    std::uint16_t const b = is_f16<H> ? gpu_test::float_to_half_bits(static_cast<float>(v)) : gpu_test::float_to_bf16_bits(static_cast<float>(v));
    H h;
    std::memcpy(&h, &b, 2);
    return h;
  } else {
    return static_cast<H>(v);
  }
}

/// Unit roundoff of each float type (2^-precision).
template <class H>
constexpr long double unit_roundoff() {
  if constexpr (is_f16<H>) return 1.0L / 2048;
  else if constexpr (is_bf16<H>) return 1.0L / 256;
  else if constexpr (std::is_same_v<H, float>) return 1.0L / 16777216;
  else return 1.0L / 9007199254740992.0L;
}

/// Random inputs, never zero: full-range integers; floats of magnitude [1/4, 1) with either sign
/// for sum/avg/min/max and [1/2, 2) for prod (a product of a few stays finite and far from zero).
template <class H>
std::vector<H> random_input(std::mt19937_64& g, std::uint64_t n, redop op) {
  std::vector<H> v(n);
  if constexpr (is_int<H>) {
    for (auto& x : v)
      do x = static_cast<H>(g()); while (x == 0);
  } else {
    bool const prod = op == redop::prod;
    std::uniform_real_distribution<double> u(prod ? 0.5 : 0.25, prod ? 2.0 : 1.0);
    for (auto& x : v) {
      do x = element_of<H>(((g() & 1) ? 1.0 : -1.0) * u(g)); while (value_of(x) == 0);
    }
  }
  return v;
}

/// Per-rank count of the user's send and receive buffers (reccl/collective.hpp).
inline std::uint64_t send_elems(collective c, int n, std::uint64_t count) {
  return (c == collective::reduce_scatter || c == collective::all_to_all) ? count * static_cast<std::uint64_t>(n) : count;
}
inline std::uint64_t recv_elems(collective c, int n, std::uint64_t count) {
  return (c == collective::all_gather || c == collective::all_to_all) ? count * static_cast<std::uint64_t>(n) : count;
}

/// Whether `got` is an acceptable reduction of xs (rank order) with op: integers exactly (sum and
/// prod wrap, avg truncates the wrapped sum), min/max exactly, floats within the rounding of one
/// combine per rank in T (plus avg's division) of the long-double result.
template <class H>
bool reduction_ok(redop op, std::vector<H> const& xs, H got) {
  int const n = static_cast<int>(xs.size());
  if constexpr (is_int<H>) {
    using U = std::make_unsigned_t<H>;
    U acc = static_cast<U>(xs[0]);
    H m = xs[0];
    for (int r = 1; r < n; ++r) {
      switch (op) {
        case redop::prod: acc = static_cast<U>(acc * static_cast<U>(xs[r])); break;
        case redop::min: m = xs[r] < m ? xs[r] : m; break;
        case redop::max: m = xs[r] > m ? xs[r] : m; break;
        default: acc = static_cast<U>(acc + static_cast<U>(xs[r])); break;
      }
    }
    H want = static_cast<H>(acc);
    if (op == redop::min || op == redop::max) want = m;
    if (op == redop::avg) want = static_cast<H>(static_cast<H>(acc) / static_cast<H>(n));
    return got == want;
  } else {
    long double const g = value_of(got);
    if (op == redop::min || op == redop::max) {
      long double m = value_of(xs[0]);
      for (int r = 1; r < n; ++r) {
        long double const x = value_of(xs[r]);
        m = op == redop::min ? (x < m ? x : m) : (x > m ? x : m);
      }
      return g == m;
    }
    long double want = value_of(xs[0]), mag = std::fabs(want);
    for (int r = 1; r < n; ++r) {
      long double const x = value_of(xs[r]);
      if (op == redop::prod) {
        want *= x;
        mag *= std::fabs(x);
      } else {
        want += x;
        mag += std::fabs(x);
      }
    }
    if (op == redop::avg) {
      want /= n;
      mag /= n;
    }
    long double const tol = 2.0L * n * unit_roundoff<H>() * mag;
    return std::isfinite(static_cast<double>(g)) && std::fabs(g - want) <= tol;
  }
}

/// Wrong elements of rank `me`'s output `got`, given every rank's input; `first` describes the first.
template <class H>
long check_output(collective c, redop op, int root, std::uint64_t count, int me, std::vector<std::vector<H>> const& in,
                  std::vector<H> const& got, std::string& first) {
  int const n = static_cast<int>(in.size());
  long wrong = 0;
  auto bits_equal = [](H a, H b) { return std::memcmp(&a, &b, sizeof(H)) == 0; };
  auto miss = [&](std::uint64_t j, std::string const& what) {
    if (wrong++ == 0) first = "element " + std::to_string(j) + ": " + what;
  };
  std::vector<H> xs(static_cast<std::size_t>(n));
  for (std::uint64_t i = 0; i < count; ++i) {
    switch (c) {
      case collective::all_reduce:
      case collective::reduce_scatter: {
        std::uint64_t const src = c == collective::all_reduce ? i : static_cast<std::uint64_t>(me) * count + i;
        for (int r = 0; r < n; ++r) xs[static_cast<std::size_t>(r)] = in[static_cast<std::size_t>(r)][src];
        if (!reduction_ok<H>(op, xs, got[i]))
          miss(i, "got " + std::to_string(static_cast<double>(value_of(got[i]))) + ", not the reduction of the inputs");
        break;
      }
      case collective::all_gather:
        for (int r = 0; r < n; ++r)
          if (!bits_equal(got[static_cast<std::uint64_t>(r) * count + i], in[static_cast<std::size_t>(r)][i]))
            miss(static_cast<std::uint64_t>(r) * count + i, "not rank " + std::to_string(r) + "'s input");
        break;
      case collective::broadcast:
        if (!bits_equal(got[i], in[static_cast<std::size_t>(root)][i])) miss(i, "not the root's input");
        break;
      case collective::all_to_all:
        for (int r = 0; r < n; ++r)
          if (!bits_equal(got[static_cast<std::uint64_t>(r) * count + i], in[static_cast<std::size_t>(r)][static_cast<std::uint64_t>(me) * count + i]))
            miss(static_cast<std::uint64_t>(r) * count + i, "not rank " + std::to_string(r) + "'s block for this rank");
        break;
    }
  }
  return wrong;
}

}  // namespace p2p_test
