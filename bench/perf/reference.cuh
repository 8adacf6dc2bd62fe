// bench/perf/reference.cuh -- reproducible inputs and an on-device expected result for every
// collective, used by the perf binaries' check (-c 1). The GPU tests write their inputs with it
// too, but check the results against the CPU reference of tests/device/support.cuh (expect() here
// uses the library's own device::combine, so it cannot catch an error in that arithmetic).
//
// Input element j of rank r is a pure function gen(seed, r, j), so any rank can compute what every
// other rank contributed and build the expected output locally. The expected value follows the
// library's documented arithmetic (rank order, fp32 accumulation of 16-bit floats, -0 read as +0).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "reccl/device/element.hpp"
#include "reccl/error.hpp"
#include "reccl/types.hpp"

namespace reccl::bench {

__host__ __device__ inline std::uint64_t splitmix(std::uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

/// Bits of input element j of rank r: small signed multiples of 1/16 for floats (sums stay exact-ish
/// and never overflow), full-range values for integers (sums wrap). -0 never appears.
template <class T>
__host__ __device__ inline reccl::device::bits_t<T> gen_bits(std::uint32_t seed, int r, std::uint64_t j) {
  std::uint64_t const h = splitmix((static_cast<std::uint64_t>(seed) << 40) ^ (static_cast<std::uint64_t>(r) << 56) ^ j);
  float const f = static_cast<float>(static_cast<int>(h % 2001u) - 1000) / 16.0f;
  if constexpr (std::is_same_v<T, float>) {
    float x = f;
    std::uint32_t b;
    memcpy(&b, &x, 4);
    return b;
  } else if constexpr (std::is_same_v<T, double>) {
    double x = static_cast<double>(f) + static_cast<double>(h >> 40) * 0x1p-30;
    std::uint64_t b;
    memcpy(&b, &x, 8);
    return b;
  } else if constexpr (std::is_same_v<T, __half>) {
    return __half_as_ushort(__float2half_rn(f / 8.0f));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat16_as_ushort(__float2bfloat16_rn(f));
  } else if constexpr (std::is_same_v<T, std::int32_t>) {
    return static_cast<std::uint32_t>(h >> 13);
  } else {
    return static_cast<std::uint64_t>(h * 0x2545f4914f6cdd1dull);
  }
}

template <class T>
__global__ void fill_kernel(reccl::device::bits_t<T>* p, std::uint64_t n, std::uint32_t seed, int r, std::uint64_t first) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < n; i += std::uint64_t(gridDim.x) * blockDim.x)
    p[i] = gen_bits<T>(seed, r, first + i);
}

template <class T>
__global__ void poison_kernel(reccl::device::bits_t<T>* p, std::uint64_t n) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < n; i += std::uint64_t(gridDim.x) * blockDim.x)
    p[i] = static_cast<reccl::device::bits_t<T>>(0x7ff7a5a5a5a5a5a5ull);  // a NaN-ish pattern nothing produces
}

/// Reduce element j of segment `seg` over all ranks, in rank order.
template <class T>
__device__ reccl::device::bits_t<T> reduce_ref(reccl::redop op, int n, std::uint32_t seed, std::uint64_t j) {
  using E = reccl::device::element<T>;
  auto acc = E::to_acc(gen_bits<T>(seed, 0, j));
  for (int r = 1; r < n; ++r) acc = reccl::device::combine(op, acc, E::to_acc(gen_bits<T>(seed, r, j)));
  return E::from_acc(reccl::device::finalize(op, acc, n));
}

/// Expected output of collective `c` on rank `me` (out_elems elements), into `exp`.
template <class T>
__global__ void expect_kernel(reccl::collective c, reccl::redop op, int me, int n, int root, std::uint32_t seed,
                              std::uint64_t count, reccl::device::bits_t<T>* exp, std::uint64_t out_elems) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < out_elems;
       i += std::uint64_t(gridDim.x) * blockDim.x) {
    std::uint64_t const seg = i / count, j = i % count;
    reccl::device::bits_t<T> v{};
    switch (c) {
      case reccl::collective::all_reduce:
        if constexpr (!std::is_same_v<T, reccl::device::raw_byte>) v = reduce_ref<T>(op, n, seed, i);
        break;
      case reccl::collective::reduce_scatter:
        if constexpr (!std::is_same_v<T, reccl::device::raw_byte>) v = reduce_ref<T>(op, n, seed, me * count + i);
        break;
      case reccl::collective::all_gather: v = gen_bits<T>(seed, static_cast<int>(seg), j); break;
      case reccl::collective::broadcast: v = gen_bits<T>(seed, root, i); break;
      case reccl::collective::all_to_all: v = gen_bits<T>(seed, static_cast<int>(seg), me * count + j); break;
    }
    exp[i] = v;
  }
}

template <class T>
__global__ void diff_kernel(reccl::device::bits_t<T> const* a, reccl::device::bits_t<T> const* b, std::uint64_t n,
                            unsigned long long* wrong) {
  unsigned long long w = 0;
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < n; i += std::uint64_t(gridDim.x) * blockDim.x)
    w += a[i] != b[i];
  if (w) atomicAdd(wrong, w);
}

/// Calls f.template operator()<T>() with T the storage type of `t`. Only for the dtypes this program's
/// reducing kernels are compiled for (RECCL_DTYPES): the kernels here are instantiated for those
/// alone, and another dtype throws reccl::error.
template <class F>
void dispatch_dtype(reccl::dtype t, F&& f) {
  bool const ran = reccl::device::with_compiled_dtype<bool>(t, false, [&](auto e) {
    f.template operator()<typename decltype(e)::type>();
    return true;
  });
  if (!ran)
    throw reccl::error(reccl::status::invalid_argument,
                       std::string("bench reference: dtype ") + std::string(reccl::name(t)) + " is not in RECCL_DTYPES");
}

/// Fill `n` elements at `p` with rank r's input elements [first, first+n).
inline void fill(reccl::dtype t, void* p, std::uint64_t n, std::uint32_t seed, int r, std::uint64_t first, cudaStream_t s) {
  if (n == 0) return;
  dispatch_dtype(t, [&]<class T>() {
    fill_kernel<T><<<512, 256, 0, s>>>(static_cast<reccl::device::bits_t<T>*>(p), n, seed, r, first);
  });
}
inline void poison(reccl::dtype t, void* p, std::uint64_t n, cudaStream_t s) {
  if (n == 0) return;
  dispatch_dtype(t, [&]<class T>() { poison_kernel<T><<<512, 256, 0, s>>>(static_cast<reccl::device::bits_t<T>*>(p), n); });
}
inline void expect(reccl::dtype t, reccl::collective c, reccl::redop op, int me, int n, int root, std::uint32_t seed,
                   std::uint64_t count, void* exp, std::uint64_t out_elems, cudaStream_t s) {
  if (out_elems == 0) return;
  dispatch_dtype(t, [&]<class T>() {
    expect_kernel<T><<<1024, 256, 0, s>>>(c, op, me, n, root, seed, count, static_cast<reccl::device::bits_t<T>*>(exp), out_elems);
  });
}
/// Elements of a and b (n each) whose bits differ; synchronises `s`.
inline unsigned long long count_diff(reccl::dtype t, void const* a, void const* b, std::uint64_t n, unsigned long long* scratch,
                                     cudaStream_t s) {
  if (n == 0) return 0;
  cudaMemsetAsync(scratch, 0, sizeof(unsigned long long), s);
  dispatch_dtype(t, [&]<class T>() {
    diff_kernel<T><<<1024, 256, 0, s>>>(static_cast<reccl::device::bits_t<T> const*>(a),
                                        static_cast<reccl::device::bits_t<T> const*>(b), n, scratch);
  });
  unsigned long long w = 0;
  cudaMemcpyAsync(&w, scratch, sizeof(w), cudaMemcpyDeviceToHost, s);
  cudaStreamSynchronize(s);
  return w;
}

}  // namespace reccl::bench
