// reccl/device/element.hpp -- element types, reduction arithmetic and masked 16-byte pack moves.
//
// Arithmetic rules, identical in every algorithm (one-shot, two-shot, pipelined) so that the result
// of a collective has the same bits whichever algorithm ran:
//  * each element is reduced over ranks 0, 1, ..., n-1 in that order, acc = x0; acc = acc (op) x_r;
//  * 16-bit floats accumulate in fp32 and are rounded once (round-to-nearest-even) at the end;
//  * avg = sum in the accumulator type, then one division by the rank count (integers truncate);
//  * integer sum and prod wrap (two's complement), as in NCCL;
//  * float min/max follow fminf/fmaxf (a NaN operand loses to a number);
//  * float inputs are canonicalised: -0 becomes +0 before they are combined (the Lamport one-shot
//    path uses -0 as its "not yet arrived" marker, and the other paths do the same so all agree).
//
// A pack is 16 bytes of V = 16 / sizeof(T) elements. Pack j of a segment covers elements
// [j*V, j*V+V); a range [lo, hi) that does not start or end on a pack boundary is moved element by
// element at its ends, and entirely element by element when the user pointer is not 16-byte aligned.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "../policy/split.hpp"
#include "../types.hpp"
#include "primitives.hpp"

namespace reccl::device {

/// Raw byte stream: the element type of collectives that only move data (all-gather, broadcast,
/// all-to-all). Never reduced.
struct raw_byte {
  std::uint8_t b;
};

template <int Size> struct bits_of;
template <> struct bits_of<1> { using type = std::uint8_t; };
template <> struct bits_of<2> { using type = std::uint16_t; };
template <> struct bits_of<4> { using type = std::uint32_t; };
template <> struct bits_of<8> { using type = std::uint64_t; };

/// Per-type facts: accumulator type, whether canonicalisation applies, conversions.
template <class T> struct element;

template <> struct element<float> {
  using acc = float;
  static constexpr bool is_float = true;
  RECCL_DEVICE static acc to_acc(std::uint32_t b) { return __uint_as_float(b == 0x80000000u ? 0u : b); }
  RECCL_DEVICE static std::uint32_t from_acc(acc a) { return __float_as_uint(a); }
};
template <> struct element<double> {
  using acc = double;
  static constexpr bool is_float = true;
  RECCL_DEVICE static acc to_acc(std::uint64_t b) {
    return __longlong_as_double(static_cast<long long>(b == 0x8000000000000000ull ? 0ull : b));
  }
  RECCL_DEVICE static std::uint64_t from_acc(acc a) { return static_cast<std::uint64_t>(__double_as_longlong(a)); }
};
template <> struct element<__half> {
  using acc = float;
  static constexpr bool is_float = true;
  RECCL_DEVICE static acc to_acc(std::uint16_t b) {
    return __half2float(__ushort_as_half(b == 0x8000u ? std::uint16_t(0) : b));
  }
  RECCL_DEVICE static std::uint16_t from_acc(acc a) { return __half_as_ushort(__float2half_rn(a)); }
};
template <> struct element<__nv_bfloat16> {
  using acc = float;
  static constexpr bool is_float = true;
  RECCL_DEVICE static acc to_acc(std::uint16_t b) {
    return __bfloat162float(__ushort_as_bfloat16(b == 0x8000u ? std::uint16_t(0) : b));
  }
  RECCL_DEVICE static std::uint16_t from_acc(acc a) { return __bfloat16_as_ushort(__float2bfloat16_rn(a)); }
};
template <> struct element<std::int32_t> {
  using acc = std::int32_t;
  static constexpr bool is_float = false;
  RECCL_DEVICE static acc to_acc(std::uint32_t b) { return static_cast<acc>(b); }
  RECCL_DEVICE static std::uint32_t from_acc(acc a) { return static_cast<std::uint32_t>(a); }
};
template <> struct element<std::int64_t> {
  using acc = std::int64_t;
  static constexpr bool is_float = false;
  RECCL_DEVICE static acc to_acc(std::uint64_t b) { return static_cast<acc>(b); }
  RECCL_DEVICE static std::uint64_t from_acc(acc a) { return static_cast<std::uint64_t>(a); }
};
template <> struct element<raw_byte> {
  using acc = std::uint8_t;
  static constexpr bool is_float = false;
};

/// The element type of dtype D.
template <dtype D> struct dtype_element;
template <> struct dtype_element<dtype::int32> { using type = std::int32_t; };
template <> struct dtype_element<dtype::int64> { using type = std::int64_t; };
template <> struct dtype_element<dtype::float16> { using type = __half; };
template <> struct dtype_element<dtype::bfloat16> { using type = __nv_bfloat16; };
template <> struct dtype_element<dtype::float32> { using type = float; };
template <> struct dtype_element<dtype::float64> { using type = double; };
template <dtype D> using dtype_element_t = typename dtype_element<D>::type;

/// The dtype of element type T (the inverse of dtype_element).
template <class T>
consteval dtype element_dtype() {
  if constexpr (std::is_same_v<T, std::int32_t>) return dtype::int32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return dtype::int64;
  else if constexpr (std::is_same_v<T, __half>) return dtype::float16;
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return dtype::bfloat16;
  else if constexpr (std::is_same_v<T, float>) return dtype::float32;
  else {
    static_assert(std::is_same_v<T, double>, "reccl: GPU element types are int32_t, int64_t, __half, __nv_bfloat16, float, double");
    return dtype::float64;
  }
}

namespace detail {
template <dtype D, class R, class F> R if_compiled(R none, F& f) {
  if constexpr (dtype_compiled(D)) return f(std::type_identity<dtype_element_t<D>>{});
  else return none;
}
}  // namespace detail

/// f(std::type_identity<T>{}) with T the element type of `t`; `none` when t is left out of this
/// program's reducing kernels (RECCL_DTYPES, types.hpp). `f` is then never instantiated for T, so
/// the kernels it names for T are not compiled: every per-dtype kernel table goes through here.
template <class R, class F> R with_compiled_dtype(dtype t, R none, F&& f) {
  switch (t) {
    case dtype::int32: return detail::if_compiled<dtype::int32>(none, f);
    case dtype::int64: return detail::if_compiled<dtype::int64>(none, f);
    case dtype::float16: return detail::if_compiled<dtype::float16>(none, f);
    case dtype::bfloat16: return detail::if_compiled<dtype::bfloat16>(none, f);
    case dtype::float32: return detail::if_compiled<dtype::float32>(none, f);
    case dtype::float64: return detail::if_compiled<dtype::float64>(none, f);
  }
  return none;
}

/// Elements per 16-byte pack.
template <class T> inline constexpr int pack_elems = 16 / static_cast<int>(sizeof(T));
template <class T> using bits_t = typename bits_of<static_cast<int>(sizeof(T))>::type;

/// a (op) b in the accumulator type. `avg` combines like `sum`; finalize() divides.
template <class A> RECCL_DEVICE A combine(redop op, A a, A b) {
  if constexpr (std::is_integral_v<A>) {
    using U = std::make_unsigned_t<A>;
    switch (op) {
      case redop::prod: return static_cast<A>(static_cast<U>(a) * static_cast<U>(b));
      case redop::min: return a < b ? a : b;
      case redop::max: return a < b ? b : a;
      default: return static_cast<A>(static_cast<U>(a) + static_cast<U>(b));
    }
  } else {
    switch (op) {
      case redop::prod: return a * b;
      case redop::min: return fmin(a, b);
      case redop::max: return fmax(a, b);
      default: return a + b;
    }
  }
}
template <> RECCL_DEVICE float combine<float>(redop op, float a, float b) {
  switch (op) {
    case redop::prod: return __fmul_rn(a, b);
    case redop::min: return fminf(a, b);
    case redop::max: return fmaxf(a, b);
    default: return __fadd_rn(a, b);
  }
}
template <> RECCL_DEVICE double combine<double>(redop op, double a, double b) {
  switch (op) {
    case redop::prod: return __dmul_rn(a, b);
    case redop::min: return fmin(a, b);
    case redop::max: return fmax(a, b);
    default: return __dadd_rn(a, b);
  }
}

/// Last step of a reduction over `nranks` contributions.
template <class A> RECCL_DEVICE A finalize(redop op, A a, int nranks) {
  if (op != redop::avg) return a;
  if constexpr (std::is_same_v<A, float>) return __fdiv_rn(a, static_cast<float>(nranks));
  else if constexpr (std::is_same_v<A, double>) return __ddiv_rn(a, static_cast<double>(nranks));
  else return static_cast<A>(a / static_cast<A>(nranks));
}

/// V accumulators for one pack.
template <class T> struct acc_pack {
  typename element<T>::acc v[pack_elems<T>];
};

template <class T> RECCL_DEVICE acc_pack<T> to_acc(pack16 const& p) {
  using B = bits_t<T>;
  B const* e = reinterpret_cast<B const*>(&p);
  acc_pack<T> a;
#pragma unroll
  for (int i = 0; i < pack_elems<T>; ++i) a.v[i] = element<T>::to_acc(e[i]);
  return a;
}
template <class T> RECCL_DEVICE void combine_into(redop op, acc_pack<T>& a, pack16 const& p) {
  using B = bits_t<T>;
  B const* e = reinterpret_cast<B const*>(&p);
#pragma unroll
  for (int i = 0; i < pack_elems<T>; ++i) a.v[i] = combine(op, a.v[i], element<T>::to_acc(e[i]));
}
template <class T> RECCL_DEVICE pack16 from_acc(redop op, acc_pack<T> const& a, int nranks) {
  using B = bits_t<T>;
  pack16 p;
  B* e = reinterpret_cast<B*>(&p);
#pragma unroll
  for (int i = 0; i < pack_elems<T>; ++i) e[i] = element<T>::from_acc(finalize(op, a.v[i], nranks));
  return p;
}
/// The rank-order reduction of the NVLink path and the proxy: acc[b] = x_0[b] (op) x_1[b] (op) ...
/// (op) x_{n-1}[b] for B packs at once, accumulated in element<T>::acc (fp32 for 16-bit floats) and
/// rounded once by from_acc, so every rank and every engine gives the same bits. `fetch(q, x)`
/// fills x[0..B) with rank q's packs and returns whether to go on (false: a wait failed; the fold
/// stops and acc must not be used). Returns whether every rank's packs were fetched. B > 1 lets an
/// engine issue B independent loads per rank before combining them.
template <class T, int B, class Fetch>
RECCL_DEVICE bool fold_in_rank_order(redop op, int nranks, acc_pack<T> (&acc)[B], Fetch&& fetch) {
  bool ok = true;
  for (int q = 0; q < nranks && ok; ++q) {
    pack16 x[B];
    ok = fetch(q, x);
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if (q == 0) acc[b] = to_acc<T>(x[b]);
      else combine_into<T>(op, acc[b], x[b]);
    }
  }
  return ok;
}
/// One pack: the same fold with `fetch(q, x)` filling a single pack. Written as its own loop, not as
/// the B = 1 case of the batch form: wrapped (a one-element array and an inner lambda) it costs
/// registers in the kernels that inline it (bench/NOTES.md 40-41). Like the batch form, it combines
/// what a failed fetch left before it stops (acc is unused then): returning at once spilled more.
template <class T, class Fetch>
RECCL_DEVICE bool fold_in_rank_order(redop op, int nranks, acc_pack<T>& acc, Fetch&& fetch) {
  bool ok = true;
  for (int q = 0; q < nranks && ok; ++q) {
    pack16 x;
    ok = fetch(q, x);
    if (q == 0) acc = to_acc<T>(x);
    else combine_into<T>(op, acc, x);
  }
  return ok;
}
/// Two-rank reduction of one pack with the op fixed at compile time: rank 0's values (Op) rank 1's,
/// finalised. Same arithmetic as combine()/finalize(), without a per-element switch.
template <class T, redop Op> RECCL_DEVICE pack16 reduce_pair(pack16 const& r0, pack16 const& r1) {
  using B = bits_t<T>;
  B const* e0 = reinterpret_cast<B const*>(&r0);
  B const* e1 = reinterpret_cast<B const*>(&r1);
  pack16 p;
  B* o = reinterpret_cast<B*>(&p);
#pragma unroll
  for (int i = 0; i < pack_elems<T>; ++i)
    o[i] = element<T>::from_acc(finalize(Op, combine(Op, element<T>::to_acc(e0[i]), element<T>::to_acc(e1[i])), 2));
  return p;
}

/// a (op) b for one element, rounded to T after every combine (the arithmetic of the schedule
/// plans, step by step, as the CPU engine runs them: cpu/numeric.hpp). No canonicalisation: the
/// plans never carry Lamport sentinels. `avg` combines like `sum`; divide once at the end.
template <class T> RECCL_DEVICE T combine_rounded(redop op, T a, T b) {
  using A = typename element<T>::acc;
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(combine<A>(op, __half2float(a), __half2float(b)));
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(combine<A>(op, __bfloat162float(a), __bfloat162float(b)));
  } else {
    return static_cast<T>(combine<A>(op, static_cast<A>(a), static_cast<A>(b)));
  }
}
/// The last step of redop::avg on one element rounded to T (cpu::average's arithmetic).
template <class T> RECCL_DEVICE T average_rounded(T sum, int nranks) {
  using A = typename element<T>::acc;
  if constexpr (std::is_same_v<T, __half>) return __float2half_rn(finalize(redop::avg, __half2float(sum), nranks));
  else if constexpr (std::is_same_v<T, __nv_bfloat16>) return __float2bfloat16_rn(finalize(redop::avg, __bfloat162float(sum), nranks));
  else return static_cast<T>(finalize(redop::avg, static_cast<A>(sum), nranks));
}

/// Calls f.template operator()<Op>() with `op` as a compile-time value.
template <class F> RECCL_DEVICE void with_op(redop op, F&& f) {
  switch (op) {
    case redop::sum: f.template operator()<redop::sum>(); break;
    case redop::prod: f.template operator()<redop::prod>(); break;
    case redop::min: f.template operator()<redop::min>(); break;
    case redop::max: f.template operator()<redop::max>(); break;
    case redop::avg: f.template operator()<redop::avg>(); break;
  }
}

/// The pack with -0 replaced by +0 in every float element (identity for integer and raw types).
template <class T> RECCL_DEVICE pack16 canonical(pack16 p) {
  if constexpr (element<T>::is_float) {
    using B = bits_t<T>;
    constexpr B negzero = B(1) << (8 * sizeof(B) - 1);
    B* e = reinterpret_cast<B*>(&p);
#pragma unroll
    for (int i = 0; i < pack_elems<T>; ++i) e[i] = e[i] == negzero ? B(0) : e[i];
  }
  return p;
}

using reccl::elem_range;  // policy/split.hpp

/// Load pack j of segment `base` restricted to [lo, hi); elements outside read as zero bits.
/// `vec_ok`: base is 16-byte aligned, so full packs are one vector load.
template <class T>
RECCL_DEVICE pack16 load_user(void const* base, std::uint64_t j, elem_range r, bool vec_ok) {
  constexpr int V = pack_elems<T>;
  std::uint64_t const e0 = j * V;
  if (vec_ok && e0 >= r.lo && e0 + V <= r.hi) return load_pack(static_cast<char const*>(base) + j * 16);
  using B = bits_t<T>;
  pack16 p{{0, 0, 0, 0}};
  B* e = reinterpret_cast<B*>(&p);
  B const* src = static_cast<B const*>(base);
#pragma unroll
  for (int i = 0; i < V; ++i)
    if (e0 + i >= r.lo && e0 + i < r.hi) e[i] = src[e0 + i];
  return p;
}
/// Store the elements of pack j that fall in [lo, hi) into segment `base`.
template <class T>
RECCL_DEVICE void store_user(void* base, std::uint64_t j, elem_range r, bool vec_ok, pack16 const& p) {
  constexpr int V = pack_elems<T>;
  std::uint64_t const e0 = j * V;
  if (vec_ok && e0 >= r.lo && e0 + V <= r.hi) {
    store_pack(static_cast<char*>(base) + j * 16, p);
    return;
  }
  using B = bits_t<T>;
  B const* e = reinterpret_cast<B const*>(&p);
  B* dst = static_cast<B*>(base);
#pragma unroll
  for (int i = 0; i < V; ++i)
    if (e0 + i >= r.lo && e0 + i < r.hi) dst[e0 + i] = e[i];
}

}  // namespace reccl::device
