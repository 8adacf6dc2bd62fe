// Shared helpers of the CPU engine tests: random data that never is all zeros, references, and a
// runtime dispatch over (collective, schedule) plans and element types.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include <reccl/collective.hpp>
#include <reccl/cpu/numeric.hpp>
#include <reccl/policy/allocator/aimd.hpp>
#include <reccl/policy/allocator/equal.hpp>
#include <reccl/policy/allocator/proportional.hpp>
#include <reccl/policy/allocator/texcp.hpp>
#include <reccl/policy/schedule/all_to_all.hpp>
#include <reccl/policy/schedule/multirail_broadcast.hpp>
#include <reccl/policy/schedule/one_shot.hpp>
#include <reccl/testing/schedule_replay.hpp>
#include <reccl/policy/schedule/ring.hpp>
#include <reccl/policy/schedule/tree.hpp>
#include <reccl/policy/schedule/two_shot.hpp>
#include <reccl/policy/telemetry/none.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>

namespace reccl_test {

using namespace reccl;

/// A (collective, schedule) pair the CPU engine runs.
enum class plan : int {
  ar_ring, ar_tree, ar_one_shot, ar_two_shot,
  rs_ring, rs_one_shot, rs_two_shot,
  ag_ring, ag_one_shot,
  bc_ring, bc_tree, bc_one_shot, bc_multirail,
  a2a_direct, a2a_one_shot,
  count_
};
inline constexpr int n_plans = static_cast<int>(plan::count_);

inline char const* plan_name(plan p) {
  static char const* const names[] = {"all_reduce/ring", "all_reduce/tree", "all_reduce/one_shot", "all_reduce/two_shot",
                                      "reduce_scatter/ring", "reduce_scatter/one_shot", "reduce_scatter/two_shot",
                                      "all_gather/ring", "all_gather/one_shot",
                                      "broadcast/ring", "broadcast/tree", "broadcast/one_shot", "broadcast/multirail",
                                      "all_to_all/direct", "all_to_all/one_shot"};
  return names[static_cast<int>(p)];
}

/// Calls f.template operator()<Kind, S>() for plan P (a translation unit instantiates only P).
template <plan P, class F>
decltype(auto) with_plan(F&& f) {
  using namespace reccl::schedule;
  if constexpr (P == plan::ar_ring) return f.template operator()<collective::all_reduce, ring>();
  else if constexpr (P == plan::ar_tree) return f.template operator()<collective::all_reduce, tree>();
  else if constexpr (P == plan::ar_one_shot) return f.template operator()<collective::all_reduce, one_shot>();
  else if constexpr (P == plan::ar_two_shot) return f.template operator()<collective::all_reduce, two_shot>();
  else if constexpr (P == plan::rs_ring) return f.template operator()<collective::reduce_scatter, ring>();
  else if constexpr (P == plan::rs_one_shot) return f.template operator()<collective::reduce_scatter, one_shot>();
  else if constexpr (P == plan::rs_two_shot) return f.template operator()<collective::reduce_scatter, two_shot>();
  else if constexpr (P == plan::ag_ring) return f.template operator()<collective::all_gather, ring>();
  else if constexpr (P == plan::ag_one_shot) return f.template operator()<collective::all_gather, one_shot>();
  else if constexpr (P == plan::bc_ring) return f.template operator()<collective::broadcast, ring>();
  else if constexpr (P == plan::bc_tree) return f.template operator()<collective::broadcast, tree>();
  else if constexpr (P == plan::bc_one_shot) return f.template operator()<collective::broadcast, one_shot>();
  else if constexpr (P == plan::bc_multirail) return f.template operator()<collective::broadcast, multirail_broadcast>();
  else if constexpr (P == plan::a2a_direct) return f.template operator()<collective::all_to_all, reccl::schedule::all_to_all>();
  else {
    static_assert(P == plan::a2a_one_shot);
    return f.template operator()<collective::all_to_all, one_shot>();
  }
}

/// Calls f.template operator()<Kind, S>() for plan p (instantiates every plan).
template <class F>
decltype(auto) with_plan(plan p, F&& f) {
  switch (p) {
    case plan::ar_ring: return with_plan<plan::ar_ring>(f);
    case plan::ar_tree: return with_plan<plan::ar_tree>(f);
    case plan::ar_one_shot: return with_plan<plan::ar_one_shot>(f);
    case plan::ar_two_shot: return with_plan<plan::ar_two_shot>(f);
    case plan::rs_ring: return with_plan<plan::rs_ring>(f);
    case plan::rs_one_shot: return with_plan<plan::rs_one_shot>(f);
    case plan::rs_two_shot: return with_plan<plan::rs_two_shot>(f);
    case plan::ag_ring: return with_plan<plan::ag_ring>(f);
    case plan::ag_one_shot: return with_plan<plan::ag_one_shot>(f);
    case plan::bc_ring: return with_plan<plan::bc_ring>(f);
    case plan::bc_tree: return with_plan<plan::bc_tree>(f);
    case plan::bc_one_shot: return with_plan<plan::bc_one_shot>(f);
    case plan::bc_multirail: return with_plan<plan::bc_multirail>(f);
    case plan::a2a_direct: return with_plan<plan::a2a_direct>(f);
    case plan::a2a_one_shot:
    default: return with_plan<plan::a2a_one_shot>(f);
  }
}

inline constexpr dtype all_dtypes[] = {dtype::int32, dtype::int64, dtype::float16, dtype::bfloat16, dtype::float32,
                                       dtype::float64};

/// Calls f.template operator()<T>() for dtype t.
template <class F>
decltype(auto) with_dtype(dtype t, F&& f) {
  switch (t) {
    case dtype::int32: return f.template operator()<std::int32_t>();
    case dtype::int64: return f.template operator()<std::int64_t>();
    case dtype::float16: return f.template operator()<half>();
    case dtype::bfloat16: return f.template operator()<bfloat16>();
    case dtype::float32: return f.template operator()<float>();
    case dtype::float64:
    default: return f.template operator()<double>();
  }
}

template <class T> constexpr bool is_16bit_float = std::is_same_v<T, half> || std::is_same_v<T, bfloat16>;

template <class T>
T from_double(double x) {
  if constexpr (is_16bit_float<T>) return T(static_cast<float>(x));
  else return static_cast<T>(x);
}
template <class T>
double to_double(T x) {
  if constexpr (is_16bit_float<T>) return static_cast<double>(static_cast<float>(x));
  else return static_cast<double>(x);
}

/// Random nonzero data. `exact`: values for which every fold order gives the same bits (integers
/// with wrap-around; floats: small nonzero integers for sum/avg, ±{1/2, 1, 2} for prod).
/// Otherwise general values (full-range integers, uniform floats in ±[1/64, 1)).
template <class T>
std::vector<T> random_data(std::mt19937_64& g, std::uint64_t n, redop op, bool exact) {
  std::vector<T> v(n);
  if constexpr (std::is_integral_v<T>) {
    for (auto& x : v) {
      do x = static_cast<T>(g()); while (x == 0);
    }
  } else {
    std::uniform_real_distribution<double> u(1.0 / 64, 1.0);
    for (auto& x : v) {
      double const sign = (g() & 1) ? 1.0 : -1.0;
      if (!exact || op == redop::min || op == redop::max) x = from_double<T>(sign * u(g));
      else if (op == redop::prod) {
        static constexpr double p[] = {0.5, 1.0, 2.0};
        x = from_double<T>(sign * p[g() % 3]);
      } else {
        x = from_double<T>(sign * static_cast<double>(1 + g() % 8));
      }
    }
  }
  return v;
}

template <class T>
void poison(std::vector<T>& v) {
  if (!v.empty()) std::memset(static_cast<void*>(v.data()), 0xa5, v.size() * sizeof(T));
}

template <class T>
bool bitwise_equal(std::vector<T> const& a, std::vector<T> const& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

/// Index of the first difference, or -1.
template <class T>
long first_difference(std::vector<T> const& a, std::vector<T> const& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0) return static_cast<long>(i);
  return -1;
}

// ---- Reference arithmetic, written here independently of reccl/cpu/numeric.hpp -----------------
// What README.md and numeric.hpp document: integer sum and prod wrap, 16-bit floats compute in
// float and round once to nearest even per combine, avg divides the combined sum once at the end.

/// float -> bfloat16 bits, round to nearest even: scale to an integer significand of at most 8
/// bits (the subnormal quantum 2^-133 below that), round it with nearbyint, scale back.
inline std::uint16_t ref_bf16_bits(float f) {
  if (f == 0.0f || !std::isfinite(f)) return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(f) >> 16);
  int e = 0;
  (void)std::frexp(f, &e);  // |f| = m * 2^e, 1/2 <= m < 1
  int const q = std::max(e - 8, -133);
  float const r = std::ldexp(std::nearbyint(std::ldexp(f, -q)), q);  // overflow rounds to infinity
  return static_cast<std::uint16_t>(std::bit_cast<std::uint32_t>(r) >> 16);
}

template <class T>
float ref_widen(T x) {
  if constexpr (std::is_same_v<T, half>) return static_cast<float>(std::bit_cast<_Float16>(x.bits));
  else return std::bit_cast<float>(static_cast<std::uint32_t>(x.bits) << 16);
}
template <class T>
T ref_narrow(float f) {
  if constexpr (std::is_same_v<T, half>) return half::from_bits(std::bit_cast<std::uint16_t>(static_cast<_Float16>(f)));
  else return bfloat16::from_bits(ref_bf16_bits(f));
}

/// a ⊕ b (avg combines as sum).
template <class T>
T ref_combine(redop op, T a, T b) {
  if constexpr (std::is_integral_v<T>) {
    using U = std::make_unsigned_t<T>;
    U const x = static_cast<U>(a), y = static_cast<U>(b);
    switch (op) {
      case redop::sum:
      case redop::avg: return static_cast<T>(static_cast<U>(x + y));
      case redop::prod: return static_cast<T>(static_cast<U>(x * y));
      case redop::min: return std::min(a, b);
      case redop::max: return std::max(a, b);
    }
  } else if constexpr (is_16bit_float<T>) {
    float const x = ref_widen(a), y = ref_widen(b);
    switch (op) {
      case redop::sum:
      case redop::avg: return ref_narrow<T>(x + y);
      case redop::prod: return ref_narrow<T>(x * y);
      case redop::min: return y < x ? b : a;
      case redop::max: return x < y ? b : a;
    }
  } else {
    switch (op) {
      case redop::sum:
      case redop::avg: return a + b;
      case redop::prod: return a * b;
      case redop::min: return std::min(a, b);
      case redop::max: return std::max(a, b);
    }
  }
  return a;
}

/// avg's final step: the combined sum divided once by the rank count (integers truncate).
template <class T>
T ref_average(T sum, int nranks) {
  if constexpr (is_16bit_float<T>) return ref_narrow<T>(ref_widen(sum) / static_cast<float>(nranks));
  else return static_cast<T>(sum / static_cast<T>(nranks));
}

/// The naive reference: what rank `rank` must hold, each reduced element folded left in rank order
/// 0, 1, ..., N-1 with ref_combine, then avg's division.
template <class T>
std::vector<T> reference(collective c, int nranks, int root, std::uint64_t count, std::vector<std::vector<T>> const& in,
                         redop op, int rank) {
  auto const seg = [&](int r, int s) { return in[r].begin() + static_cast<std::ptrdiff_t>(static_cast<std::uint64_t>(s) * count); };
  std::vector<T> out;
  switch (c) {
    case collective::all_reduce:
    case collective::reduce_scatter: {
      int const s = c == collective::reduce_scatter ? rank : 0;
      out.assign(seg(0, s), seg(0, s) + static_cast<std::ptrdiff_t>(count));
      for (int r = 1; r < nranks; ++r)
        for (std::uint64_t i = 0; i < count; ++i) out[i] = ref_combine(op, out[i], seg(r, s)[static_cast<std::ptrdiff_t>(i)]);
      if (op == redop::avg)
        for (auto& x : out) x = ref_average(x, nranks);
      break;
    }
    case collective::all_gather:
      for (int r = 0; r < nranks; ++r) out.insert(out.end(), seg(r, 0), seg(r, 0) + static_cast<std::ptrdiff_t>(count));
      break;
    case collective::broadcast: out.assign(seg(root, 0), seg(root, 0) + static_cast<std::ptrdiff_t>(count)); break;
    case collective::all_to_all:
      for (int r = 0; r < nranks; ++r) out.insert(out.end(), seg(r, rank), seg(r, rank) + static_cast<std::ptrdiff_t>(count));
      break;
  }
  return out;
}

/// Elements of the user's send / receive buffers.
inline std::uint64_t send_len(collective c, int n, std::uint64_t count) {
  return (c == collective::reduce_scatter || c == collective::all_to_all) ? count * n : count;
}
inline std::uint64_t recv_len(collective c, int n, std::uint64_t count) {
  return (c == collective::all_gather || c == collective::all_to_all) ? count * n : count;
}

}  // namespace reccl_test

namespace reccl_test {

/// One collective on every rank of `comm` with fresh random data (exact mode), poisoned outputs,
/// checked against the naive reference. `correct` is false on any wrong element.
struct checked_run {
  std::vector<cpu::collective_result> res;
  bool correct = true;
  std::vector<std::vector<std::byte>> outputs;  ///< each rank's output bytes
  std::vector<std::vector<std::byte>> inputs;   ///< each rank's input bytes
};

template <class T>
std::vector<std::byte> bytes_of(std::vector<T> const& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  if (!b.empty()) std::memcpy(b.data(), v.data(), b.size());
  return b;
}

template <class C>
checked_run run_checked(cpu::communicator& comm, std::uint64_t count, std::mt19937_64& g, redop op = redop::sum,
                        int root = 0, bool exact = true) {
  using T = typename C::value_type;
  collective const k = C::kind;
  int const n = comm.nranks();
  std::vector<std::vector<T>> in(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    in[r] = reccl_test::random_data<T>(g, send_len(k, n, count), op, exact);
    out[r].resize(recv_len(k, n, count));
    poison(out[r]);
  }
  checked_run cr;
  cr.res.resize(static_cast<std::size_t>(n));
  comm.run_ranks([&](int r) { cr.res[r] = C::run(comm, r, in[r].data(), out[r].data(), count, op, root); });
  for (int r = 0; r < n; ++r) {
    if (exact && first_difference(out[r], reccl_test::reference<T>(k, n, root, count, in, op, r)) != -1) cr.correct = false;
    cr.outputs.push_back(bytes_of(out[r]));
    cr.inputs.push_back(bytes_of(in[r]));
  }
  return cr;
}

}  // namespace reccl_test
