// The allocator never changes results (bitwise identical outputs under equal, proportional, texcp
// and aimd while their splits differ, each checked against a reference computed here in plain
// double arithmetic), and a rate-capped VT ends up with a smaller share.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <optional>

#include "support.hpp"

using namespace reccl_test;

namespace {

/// Runs `n` collectives of kind Kind / schedule S with allocator A on a communicator whose VT 0 is
/// capped, on random data from `seed` (the same inputs for every allocator); `exact` picks data
/// whose every partial result is exact (see random_data). Every run's status on every rank is checked.
template <class A, class T, class S, collective Kind>
std::vector<checked_run> run_with(int n, std::uint64_t seed, redop op, bool exact) {
  cpu::config c;
  c.nranks = 4;
  c.n_vts = 3;
  c.granule = 1;
  c.slot_bytes = 4096;
  c.poll_quantum_ns = 50'000;
  c.faults.cap(0, 20e6);  // VT 0 at 20 MB/s per link: the adaptive allocators move bytes off it
  cpu::communicator comm(c);
  std::mt19937_64 g(seed);
  std::vector<checked_run> out;
  using C = reccl::collective_op<Kind, T, S, transport::cpu_threads, telemetry::stalls, A>;
  for (int e = 0; e < n; ++e) {
    out.push_back(run_checked<C>(comm, 30'011, g, op, 0, exact));
    for (int r = 0; r < c.nranks; ++r) {
      CAPTURE(e);
      CAPTURE(r);
      CHECK(out.back().res[r].st == status::ok);
    }
  }
  return out;
}

/// Element i of a T buffer held as bytes, widened to long double (exact for every element type).
template <class T>
long double element_at(std::vector<std::byte> const& b, std::uint64_t i) {
  T x;
  std::memcpy(&x, b.data() + i * sizeof(T), sizeof(T));
  if constexpr (std::is_same_v<T, half>) return static_cast<long double>(std::bit_cast<_Float16>(x.bits));
  else if constexpr (std::is_same_v<T, bfloat16>) return static_cast<long double>(std::bit_cast<float>(std::uint32_t{x.bits} << 16));
  else return static_cast<long double>(x);
}

/// The bits of T holding exactly `x`, or nothing if T cannot hold it exactly.
template <class T>
std::optional<std::uint64_t> exact_bits(long double x) {
  if (static_cast<long double>(static_cast<double>(x)) != x) return std::nullopt;
  double const d = static_cast<double>(x);
  if constexpr (std::is_same_v<T, half>) {
    auto const h = static_cast<_Float16>(d);
    if (static_cast<double>(h) != d) return std::nullopt;
    return std::bit_cast<std::uint16_t>(h);
  } else if constexpr (std::is_same_v<T, bfloat16>) {
    auto const u = std::bit_cast<std::uint32_t>(static_cast<float>(d));
    if (static_cast<double>(static_cast<float>(d)) != d || (u & 0xffffu) != 0) return std::nullopt;
    return u >> 16;
  } else if constexpr (std::is_same_v<T, float>) {
    auto const f = static_cast<float>(d);
    if (static_cast<double>(f) != d) return std::nullopt;
    return std::bit_cast<std::uint32_t>(f);
  } else {
    return std::bit_cast<std::uint64_t>(d);
  }
}

/// Unit roundoff of T's format (half a unit in the last place, relative).
template <class T>
constexpr double unit_roundoff() {
  if constexpr (std::is_same_v<T, half>) return 0x1p-11;
  else if constexpr (std::is_same_v<T, bfloat16>) return 0x1p-8;
  else if constexpr (std::is_same_v<T, float>) return 0x1p-24;
  else return 0x1p-53;
}

/// Output elements of `run` that differ from a reference written here in plain long double
/// arithmetic (64-bit significand; rank order; avg divides once at the end). On exact data every
/// partial result is exact, so any fold order gives the reference's bits and they must match; on
/// general data the output must lie within the rounding error of its n - 1 folds in T (and avg's
/// division), n * u * (Σ|x_r| or |Πx_r|), the reference's own error being 2^-64 relative.
template <class T, collective Kind>
std::uint64_t wrong_elements(checked_run const& run, redop op, bool exact) {
  static_assert(Kind == collective::all_reduce || Kind == collective::reduce_scatter);
  int const n = static_cast<int>(run.inputs.size());
  std::uint64_t wrong = 0;
  for (int rank = 0; rank < n; ++rank) {
    std::uint64_t const count = run.outputs[rank].size() / sizeof(T);
    std::uint64_t const base = Kind == collective::reduce_scatter ? static_cast<std::uint64_t>(rank) * count : 0;
    for (std::uint64_t i = 0; i < count; ++i) {
      long double acc = element_at<T>(run.inputs[0], base + i), mag = std::fabs(acc);
      for (int r = 1; r < n; ++r) {
        long double const x = element_at<T>(run.inputs[r], base + i);
        switch (op) {
          case redop::sum:
          case redop::avg: acc += x, mag += std::fabs(x); break;
          case redop::prod: acc *= x, mag = std::fabs(acc); break;
          case redop::min: acc = std::min(acc, x); break;
          case redop::max: acc = std::max(acc, x); break;
        }
      }
      if (op == redop::avg) acc /= n, mag /= n;
      long double const got = element_at<T>(run.outputs[rank], i);
      bool ok = false;
      if (exact) {
        std::optional<std::uint64_t> const want = exact_bits<T>(acc);
        std::uint64_t bits = 0;
        std::memcpy(&bits, run.outputs[rank].data() + i * sizeof(T), sizeof(T));
        ok = want && *want == bits;
      } else {
        ok = std::fabs(got - acc) <= n * unit_roundoff<T>() * mag;
      }
      if (!ok && wrong++ == 0)
        MESSAGE("rank " << rank << " element " << i << ": " << static_cast<double>(got) << ", reference " << static_cast<double>(acc));
    }
  }
  return wrong;
}

template <class T, class S, collective Kind>
void same_bits_under_every_allocator(redop op) {
  constexpr int n = 5;
  for (bool const exact : {false, true}) {
    CAPTURE(exact);
    std::vector<checked_run> const runs[] = {
        run_with<allocator::equal, T, S, Kind>(n, 99, op, exact), run_with<allocator::proportional, T, S, Kind>(n, 99, op, exact),
        run_with<allocator::texcp, T, S, Kind>(n, 99, op, exact), run_with<allocator::aimd, T, S, Kind>(n, 99, op, exact)};
    std::string const names[] = {"equal", "proportional", "texcp", "aimd"};
    auto const& eq = runs[0];
    bool splits_differ = false;
    for (int e = 0; e < n; ++e) {
      CAPTURE(e);
      for (int a = 0; a < 4; ++a) {
        CAPTURE(names[a]);
        CHECK(runs[a][e].outputs == eq[e].outputs);
        CHECK(wrong_elements<T, Kind>(runs[a][e], op, exact) == 0);
      }
      split const& eq_split = eq[e].res[0].report.split;
      if (!(runs[1][e].res[0].report.split == eq_split) || !(runs[2][e].res[0].report.split == eq_split)) splits_differ = true;
    }
    CHECK(splits_differ);  // otherwise the test would prove nothing
  }
}

}  // namespace

TEST_CASE("bitwise identical results under equal, proportional, texcp and aimd, and equal to a plain reference") {
  SUBCASE("all_reduce ring float sum") { same_bits_under_every_allocator<float, schedule::ring, collective::all_reduce>(redop::sum); }
  SUBCASE("all_reduce two_shot half sum") { same_bits_under_every_allocator<half, schedule::two_shot, collective::all_reduce>(redop::sum); }
  SUBCASE("all_reduce tree double prod") { same_bits_under_every_allocator<double, schedule::tree, collective::all_reduce>(redop::prod); }
  SUBCASE("reduce_scatter ring bfloat16 avg") {
    same_bits_under_every_allocator<bfloat16, schedule::ring, collective::reduce_scatter>(redop::avg);
  }
}

// Timing-free in what it asserts: no duration is compared, only the order of the shares. The cap
// makes VT 1's links carry >= 1.5 * 64 KiB / 1 MB/s = 98 ms of wire time per collective, far more
// than the CPU needs to move VT 0's uncapped block even on a starved machine (a ThreadSanitizer
// build under a parallel ctest), so the stall counts, and with them the shares, can only go one way.
TEST_CASE("a rate-capped VT gets a smaller share (texcp and proportional, from the equal split)") {
  auto check_allocator = [&]<class A>() {
    cpu::config c;
    c.nranks = 4;
    c.n_vts = 2;
    c.slot_bytes = 4096;
    c.poll_quantum_ns = 50'000;
    c.faults.cap(1, 1e6);
    cpu::communicator comm(c);
    std::mt19937_64 g(5);
    using C = reccl::all_reduce<float, schedule::ring, transport::cpu_threads, telemetry::stalls, A>;
    for (int e = 0; e < 4; ++e) {
      CAPTURE(e);
      auto const r = run_checked<C>(comm, 32'768, g);
      CHECK(r.correct);
      // on the equal split the capped VT stalls far more; later the split evens out the times
      if (e == 0) CHECK(r.res[0].report.stalls[1] > 2 * r.res[0].report.stalls[0]);
      CHECK(comm.current_shares(0).w[1] < share_one / 2);
    }
    CHECK(comm.current_shares(0).w[1] < share_one / 4);
  };
  SUBCASE("texcp") { check_allocator.template operator()<allocator::texcp>(); }
  SUBCASE("proportional") { check_allocator.template operator()<allocator::proportional>(); }
}

TEST_CASE("telemetry::none: no estimates, so the split stays equal, results still correct") {
  cpu::config c;
  c.nranks = 3;
  c.n_vts = 2;
  c.faults.cap(1, 8e6);
  cpu::communicator comm(c);
  std::mt19937_64 g(6);
  using C = reccl::all_reduce<std::int64_t, schedule::ring, transport::cpu_threads, telemetry::none, allocator::texcp>;
  for (int e = 0; e < 3; ++e) {
    auto const r = run_checked<C>(comm, 10'000, g);
    CHECK(r.correct);
    CHECK(r.res[0].report.stalls[1] == 0);
  }
  CHECK(comm.current_shares(0).w[0] == share_one / 2);
}

// Deterministic: on a virtual clock the stall counts depend only on the plan, the split and the
// caps, never on scheduling, so two communicators produce the same shares to the bit, and the share
// of a VT capped at 1/4 of the other's rate converges to 1/5.
TEST_CASE("virtual time: a capped VT gets a smaller share, the same on every run") {
  auto run_shares = [] {
    cpu::config c;
    c.nranks = 4;
    c.n_vts = 2;
    c.granule = 1;
    c.slot_bytes = 4096;
    c.virtual_time = true;
    c.faults.cap(0, 16e6).cap(1, 4e6);
    cpu::communicator comm(c);
    std::mt19937_64 g(8);
    using C = reccl::all_reduce<float, schedule::ring, transport::cpu_threads, telemetry::stalls, allocator::texcp>;
    std::vector<std::uint32_t> shares;
    std::vector<std::uint64_t> stalls;
    for (int e = 0; e < 6; ++e) {
      auto const r = run_checked<C>(comm, 65'536, g);
      CHECK(r.correct);
      shares.push_back(comm.current_shares(0).w[1]);
      stalls.push_back(r.res[0].report.stalls[0]);
      stalls.push_back(r.res[0].report.stalls[1]);
    }
    return std::make_pair(shares, stalls);
  };
  auto const a = run_shares();
  auto const b = run_shares();
  CHECK(a.first == b.first);    // the same splits ...
  CHECK(a.second == b.second);  // ... from the same stall counts, on a loaded machine or not
  CHECK(a.second[1] > 3 * a.second[0]);  // equal split: the capped VT waits about 4x as long
  CHECK(a.first[0] < share_one / 2);  // the first step moves bytes off the capped VT
  double const final_share = static_cast<double>(a.first.back()) / share_one;
  CHECK(final_share == doctest::Approx(0.2).epsilon(0.05));  // B_1 / (B_0 + B_1) = 4 / 20
}
