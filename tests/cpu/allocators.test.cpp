// The allocator never changes results (bitwise identical outputs under equal, proportional, texcp
// and aimd while their splits differ), and a rate-capped VT ends up with a smaller share.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include "support.hpp"

using namespace reccl_test;

namespace {

template <class A, class T, class S, collective Kind>
struct runs {
  std::vector<std::vector<std::vector<std::byte>>> outputs;  ///< [collective][rank]
  std::vector<split> splits;
};

/// Runs `n` collectives of kind Kind / schedule S with allocator A on a communicator whose VT 0 is
/// capped, on general random data from `seed` (the same inputs for every allocator).
template <class A, class T, class S, collective Kind>
runs<A, T, S, Kind> run_with(int n, std::uint64_t seed, redop op) {
  cpu::config c;
  c.nranks = 4;
  c.n_vts = 3;
  c.granule = 1;
  c.slot_bytes = 4096;
  c.poll_quantum_ns = 50'000;
  c.faults.cap(0, 20e6);  // VT 0 at 20 MB/s per link: the adaptive allocators move bytes off it
  cpu::communicator comm(c);
  std::mt19937_64 g(seed);
  runs<A, T, S, Kind> out;
  using C = reccl::collective_op<Kind, T, S, transport::cpu_threads, telemetry::stalls, A>;
  for (int e = 0; e < n; ++e) {
    auto r = run_checked<C>(comm, 30'011, g, op, 0, /*exact=*/false);
    out.outputs.push_back(std::move(r.outputs));
    out.splits.push_back(r.res[0].report.split);
  }
  return out;
}

template <class T, class S, collective Kind>
void same_bits_under_every_allocator(redop op) {
  constexpr int n = 5;
  auto const eq = run_with<allocator::equal, T, S, Kind>(n, 99, op);
  auto const pr = run_with<allocator::proportional, T, S, Kind>(n, 99, op);
  auto const tx = run_with<allocator::texcp, T, S, Kind>(n, 99, op);
  auto const am = run_with<allocator::aimd, T, S, Kind>(n, 99, op);
  bool splits_differ = false;
  for (int e = 0; e < n; ++e) {
    CAPTURE(e);
    CHECK(pr.outputs[e] == eq.outputs[e]);
    CHECK(tx.outputs[e] == eq.outputs[e]);
    CHECK(am.outputs[e] == eq.outputs[e]);
    if (!(tx.splits[e] == eq.splits[e]) || !(pr.splits[e] == eq.splits[e])) splits_differ = true;
  }
  CHECK(splits_differ);  // otherwise the test would prove nothing
}

}  // namespace

TEST_CASE("bitwise identical results under equal, proportional, texcp and aimd") {
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
