// tests/device/support.cuh -- shared by the GPU tests: an independent CPU reference of reccl's
// documented arithmetic, random inputs, and a world of communicators driven from one process.
// Inputs written on the GPU by reccl::bench::fill are checked against the same CPU reference:
// host_expected / count_wrong, and all_reduce_wrong for outputs too large to hold twice on the host.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../bench/perf/reference.cuh"
#include "reccl/host/communicator.hpp"

namespace gpu_test {

using reccl::algorithm;
using reccl::collective;
using reccl::dtype;
using reccl::redop;

#define TEST_CK(x)                                                                                   \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#define TEST_NK(x)                                                                                   \
  do {                                                                                               \
    ncclResult_t r_ = (x);                                                                           \
    if (r_ != ncclSuccess) throw std::runtime_error(std::string(#x) + ": " + ncclGetErrorString(r_)); \
  } while (0)

/// Failed expectations of a forked rank (doctest's checks do not reach the parent from a child):
/// EXPECT prints the message to stderr and counts it; the child's exit code reports the count.
inline int child_fails = 0;
#define EXPECT(cond, ...)                    \
  do {                                       \
    if (!(cond)) {                           \
      ++::gpu_test::child_fails;             \
      std::fprintf(stderr, __VA_ARGS__);     \
      std::fprintf(stderr, "\n");            \
    }                                        \
  } while (0)

/// Rank r's input and output for collective c, from its own `in` and `out` buffers: themselves, or
/// NCCL's in-place layouts (the input is the output for all-reduce and broadcast, this rank's
/// segment of it for all-gather; reduce-scatter's output is this rank's segment of the input).
inline std::pair<char*, char*> collective_buffers(collective c, int r, char* in, char* out, std::uint64_t seg_bytes, bool in_place) {
  if (!in_place) return {in, out};
  std::uint64_t const mine = static_cast<std::uint64_t>(r) * seg_bytes;
  if (c == collective::all_gather) return {out + mine, out};
  if (c == collective::reduce_scatter) return {in, in + mine};
  return {out, out};
}

/// The deadline, in ns, of a call that should finish well inside `default_s` seconds:
/// RECCL_TEST_TIMEOUT_S overrides it for tools that slow kernels and CUDA calls down
/// (compute-sanitizer: bench/gpu.sh sanitize sets 60). Tests of a missing rank keep their own
/// short deadlines.
inline std::uint64_t test_timeout_ns(double default_s) {
  char const* to = std::getenv("RECCL_TEST_TIMEOUT_S");
  return static_cast<std::uint64_t>((to ? std::atof(to) : default_s) * 1e9);
}

/// The CUDA devices this process sees (0 without a GPU or a driver).
inline int gpu_count() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}
/// REQUIRE_GPUS(k) ends the doctest case as skipped (SKIP_CASE, tests/doctest_main.hpp) where fewer
/// than k GPUs are present; REQUIRE_GPU() is REQUIRE_GPUS(1).
#define REQUIRE_GPUS(k)                                                                 \
  do {                                                                                  \
    int const gpus_ = ::gpu_test::gpu_count();                                          \
    if (gpus_ == 0) SKIP_CASE("no GPU");                                                \
    if (gpus_ < (k)) SKIP_CASE("needs " << (k) << " GPUs, this machine has " << gpus_); \
  } while (0)
#define REQUIRE_GPU() REQUIRE_GPUS(1)

// ---- CPU reference: element conversions written independently of the device headers ----------

inline float half_bits_to_float(std::uint16_t b) {
  __half_raw r;
  r.x = b;
  return __half2float(__half(r));
}
inline std::uint16_t float_to_half_bits(float f) {
  __half h = __float2half_rn(f);
  return static_cast<__half_raw>(h).x;
}
inline float bf16_bits_to_float(std::uint16_t b) {
  std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint16_t float_to_bf16_bits(float f) {  // round to nearest even (finite inputs)
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<std::uint16_t>(u >> 16);
}

/// Reduce the `n` raw elements `xs` (each `es` bytes) as reccl documents: -0 read as +0, rank order,
/// fp32 accumulation for 16-bit floats, avg = sum / n, integer sum/prod wrap.
inline std::uint64_t reduce_ref(dtype t, redop op, std::vector<std::uint64_t> const& xs) {
  int const n = static_cast<int>(xs.size());
  auto fcomb = [&](auto a, auto b) {
    switch (op) {
      case redop::prod: return a * b;
      case redop::min: return std::fmin(a, b);
      case redop::max: return std::fmax(a, b);
      default: return a + b;
    }
  };
  auto icomb = [&](auto a, auto b) {
    using S = decltype(a);
    using U = std::make_unsigned_t<S>;
    switch (op) {
      case redop::prod: return static_cast<S>(static_cast<U>(a) * static_cast<U>(b));
      case redop::min: return a < b ? a : b;
      case redop::max: return a < b ? b : a;
      default: return static_cast<S>(static_cast<U>(a) + static_cast<U>(b));
    }
  };
  switch (t) {
    case dtype::float32: {
      auto cv = [](std::uint64_t b) { std::uint32_t u = b == 0x80000000u ? 0u : static_cast<std::uint32_t>(b); float f; std::memcpy(&f, &u, 4); return f; };
      float a = cv(xs[0]);
      for (int r = 1; r < n; ++r) a = fcomb(a, cv(xs[r]));
      if (op == redop::avg) a = a / static_cast<float>(n);
      std::uint32_t u;
      std::memcpy(&u, &a, 4);
      return u;
    }
    case dtype::float64: {
      auto cv = [](std::uint64_t b) { std::uint64_t u = b == 0x8000000000000000ull ? 0ull : b; double f; std::memcpy(&f, &u, 8); return f; };
      double a = cv(xs[0]);
      for (int r = 1; r < n; ++r) a = fcomb(a, cv(xs[r]));
      if (op == redop::avg) a = a / static_cast<double>(n);
      std::uint64_t u;
      std::memcpy(&u, &a, 8);
      return u;
    }
    case dtype::float16:
    case dtype::bfloat16: {
      bool const h = t == dtype::float16;
      auto cv = [&](std::uint64_t b) { std::uint16_t v = b == 0x8000u ? 0 : static_cast<std::uint16_t>(b); return h ? half_bits_to_float(v) : bf16_bits_to_float(v); };
      float a = cv(xs[0]);
      for (int r = 1; r < n; ++r) a = fcomb(a, cv(xs[r]));
      if (op == redop::avg) a = a / static_cast<float>(n);
      return h ? float_to_half_bits(a) : float_to_bf16_bits(a);
    }
    case dtype::int32: {
      std::int32_t a = static_cast<std::int32_t>(static_cast<std::uint32_t>(xs[0]));
      for (int r = 1; r < n; ++r) a = icomb(a, static_cast<std::int32_t>(static_cast<std::uint32_t>(xs[r])));
      if (op == redop::avg) a = a / n;
      return static_cast<std::uint32_t>(a);
    }
    case dtype::int64: {
      std::int64_t a = static_cast<std::int64_t>(xs[0]);
      for (int r = 1; r < n; ++r) a = icomb(a, static_cast<std::int64_t>(xs[r]));
      if (op == redop::avg) a = a / n;
      return static_cast<std::uint64_t>(a);
    }
  }
  return 0;
}

/// Random raw element of type t: finite floats of varied magnitude (about 1 in 64 is -0), full-range integers.
inline std::uint64_t random_bits(dtype t, std::mt19937_64& g) {
  std::uint64_t const h = g();
  bool const negzero = (h & 63u) == 7u;
  std::normal_distribution<double> nd(0.0, 8.0);
  double const v = nd(g);
  switch (t) {
    case dtype::float32: {
      if (negzero) return 0x80000000u;
      float f = static_cast<float>(v);
      std::uint32_t u;
      std::memcpy(&u, &f, 4);
      return u;
    }
    case dtype::float64: {
      if (negzero) return 0x8000000000000000ull;
      std::uint64_t u;
      std::memcpy(&u, &v, 8);
      return u;
    }
    case dtype::float16: return negzero ? 0x8000u : float_to_half_bits(static_cast<float>(v));
    case dtype::bfloat16: return negzero ? 0x8000u : float_to_bf16_bits(static_cast<float>(v));
    case dtype::int32: return static_cast<std::uint32_t>(h >> 7);
    case dtype::int64: return h * 0x9e3779b97f4a7c15ull;
  }
  return 0;
}

inline std::uint64_t get_elem(std::vector<unsigned char> const& v, std::size_t i, std::size_t es) {
  std::uint64_t x = 0;
  std::memcpy(&x, v.data() + i * es, es);
  return x;
}
inline void put_elem(std::vector<unsigned char>& v, std::size_t i, std::size_t es, std::uint64_t x) {
  std::memcpy(v.data() + i * es, &x, es);
}

/// Segments of input and output per rank.
inline int in_segments(collective c, int n) { return c == collective::reduce_scatter || c == collective::all_to_all ? n : 1; }
inline int out_segments(collective c, int n) { return c == collective::all_gather || c == collective::all_to_all ? n : 1; }

/// Expected output of rank `me` given every rank's input.
inline std::vector<unsigned char> expected_output(collective c, dtype t, redop op, int root, std::uint64_t count, int me,
                                                  std::vector<std::vector<unsigned char>> const& in) {
  int const n = static_cast<int>(in.size());
  std::size_t const es = reccl::size_of(t);
  std::vector<unsigned char> out(count * out_segments(c, n) * es);
  std::vector<std::uint64_t> xs(n);
  for (std::uint64_t i = 0; i < count; ++i) {
    switch (c) {
      case collective::all_reduce:
        for (int r = 0; r < n; ++r) xs[r] = get_elem(in[r], i, es);
        put_elem(out, i, es, reduce_ref(t, op, xs));
        break;
      case collective::reduce_scatter:
        for (int r = 0; r < n; ++r) xs[r] = get_elem(in[r], me * count + i, es);
        put_elem(out, i, es, reduce_ref(t, op, xs));
        break;
      case collective::all_gather:
        for (int r = 0; r < n; ++r) put_elem(out, r * count + i, es, get_elem(in[r], i, es));
        break;
      case collective::broadcast: put_elem(out, i, es, get_elem(in[root], i, es)); break;
      case collective::all_to_all:
        for (int r = 0; r < n; ++r) put_elem(out, r * count + i, es, get_elem(in[r], me * count + i, es));
        break;
    }
  }
  return out;
}

// ---- CPU reference for inputs written on the GPU by reccl::bench::fill ---------------------------

/// Elements [first, first + len) of rank r's input as reccl::bench::fill(t, p, len, seed, r, first)
/// writes them, generated on the host (only the generator is shared with the GPU side).
inline std::vector<unsigned char> generated_input(dtype t, std::uint32_t seed, int r, std::uint64_t first, std::uint64_t len) {
  std::size_t const es = reccl::size_of(t);
  std::vector<unsigned char> v(len * es);
  reccl::bench::dispatch_dtype(t, [&]<class T>() {
    for (std::uint64_t j = 0; j < len; ++j) {
      auto const b = reccl::bench::gen_bits<T>(seed, r, first + j);
      std::memcpy(v.data() + j * es, &b, es);
    }
  });
  return v;
}

/// Rank me's expected output of collective c over n ranks whose inputs reccl::bench::fill wrote
/// with `seed` (count elements per segment), from the CPU reference.
inline std::vector<unsigned char> host_expected(collective c, dtype t, redop op, int root, std::uint64_t count, int me, int n,
                                                std::uint32_t seed) {
  std::vector<std::vector<unsigned char>> in(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) in[r] = generated_input(t, seed, r, 0, count * in_segments(c, n));
  return expected_output(c, t, op, root, count, me, in);
}

/// Elements of the device buffer `out` (want.size() / es elements of type t) whose bits differ from
/// `want`; the first difference is printed to stderr with `what`.
inline std::uint64_t count_wrong(dtype t, void const* out, std::vector<unsigned char> const& want, char const* what) {
  std::size_t const es = reccl::size_of(t);
  std::vector<unsigned char> got(want.size());
  if (!got.empty()) TEST_CK(cudaMemcpy(got.data(), out, got.size(), cudaMemcpyDefault));
  std::uint64_t wrong = 0;
  for (std::size_t i = 0; i < want.size() / es; ++i) {
    if (std::memcmp(got.data() + i * es, want.data() + i * es, es) == 0) continue;
    if (wrong++ == 0)
      std::fprintf(stderr, "%s: element %zu is 0x%llx, the reference 0x%llx\n", what, i,
                   static_cast<unsigned long long>(get_elem(got, i, es)), static_cast<unsigned long long>(get_elem(want, i, es)));
  }
  return wrong;
}

/// Per rank, the elements of an all-reduce's output (device memory outs[r] on device devs[r],
/// count elements) whose bits differ from the CPU reference, for inputs that reccl::bench::fill
/// wrote with `seed`. The reference is built slice by slice on every host core, so an output of
/// any size is checked in full without a second copy of it on the host.
inline std::vector<std::uint64_t> all_reduce_wrong(dtype t, redop op, std::uint32_t seed, std::uint64_t count,
                                                   std::vector<void const*> const& outs, std::vector<int> const& devs) {
  int const n = static_cast<int>(outs.size());
  std::size_t const es = reccl::size_of(t);
  std::uint64_t const slice = std::uint64_t{1} << 22;
  unsigned const workers = std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::uint64_t> wrong(static_cast<std::size_t>(n), 0);
  std::vector<unsigned char> want, got;
  for (std::uint64_t first = 0; first < count; first += slice) {
    std::uint64_t const len = std::min(slice, count - first);
    want.resize(len * es);
    std::vector<std::thread> pool;
    std::uint64_t const part = (len + workers - 1) / workers;
    for (std::uint64_t lo = 0; lo < len; lo += part) {
      pool.emplace_back([&, lo] {
        std::uint64_t const m = std::min(part, len - lo);
        std::vector<std::vector<unsigned char>> in(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) in[r] = generated_input(t, seed, r, first + lo, m);
        std::vector<unsigned char> const e = expected_output(collective::all_reduce, t, op, 0, m, 0, in);
        std::memcpy(want.data() + lo * es, e.data(), e.size());
      });
    }
    for (auto& th : pool) th.join();
    got.resize(want.size());
    for (int r = 0; r < n; ++r) {
      TEST_CK(cudaSetDevice(devs[r]));
      TEST_CK(cudaMemcpy(got.data(), static_cast<unsigned char const*>(outs[r]) + first * es, got.size(), cudaMemcpyDefault));
      if (std::memcmp(got.data(), want.data(), got.size()) == 0) continue;
      for (std::uint64_t i = 0; i < len; ++i) {
        if (std::memcmp(got.data() + i * es, want.data() + i * es, es) == 0) continue;
        if (wrong[r]++ == 0)
          std::fprintf(stderr, "rank %d: element %llu is 0x%llx, the reference 0x%llx\n", r,
                       static_cast<unsigned long long>(first + i), static_cast<unsigned long long>(get_elem(got, i, es)),
                       static_cast<unsigned long long>(get_elem(want, i, es)));
      }
    }
  }
  return wrong;
}

}  // namespace gpu_test
