// Bad input gets a clear error: reccl::error with a status, the rank / VT / epoch involved and a
// readable message. No hang, no abort.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "support.hpp"

using namespace reccl_test;

namespace {

using ar = reccl::all_reduce<float, schedule::ring, transport::cpu_threads, telemetry::stalls, allocator::texcp>;
using ar_double = reccl::all_reduce<double, schedule::ring, transport::cpu_threads, telemetry::stalls, allocator::texcp>;
using bc = reccl::broadcast<float, schedule::ring, transport::cpu_threads, telemetry::stalls, allocator::texcp>;

cpu::config small(int nranks, int n_vts) {
  cpu::config c;
  c.nranks = nranks;
  c.n_vts = n_vts;
  c.arrival_timeout_ns = 200'000'000;
  c.wait_timeout_ns = 200'000'000;
  return c;
}

/// Default deadlines (a 10 s arrival deadline): a peer that waited it out would fail the timing checks.
cpu::config with_default_deadlines(int nranks, int n_vts) {
  cpu::config c;
  c.nranks = nranks;
  c.n_vts = n_vts;
  return c;
}

bool contains(std::string const& s, std::string const& what) { return s.find(what) != std::string::npos; }

/// Runs f on every rank and returns each rank's error (status::ok if it did not throw).
template <class F>
std::vector<reccl::error> errors_of(cpu::communicator& comm, F&& f) {
  std::vector<reccl::error> errs(static_cast<std::size_t>(comm.nranks()), reccl::error(status::ok, "none"));
  comm.run_ranks([&](int r) {
    try {
      f(r);
    } catch (reccl::error const& e) {
      errs[r] = e;
    }
  });
  return errs;
}

}  // namespace

TEST_CASE("VT count 0, too many VTs, bad rank count: the communicator refuses to build") {
  cpu::config c = small(2, 0);
  try {
    cpu::communicator comm(c);
    FAIL("expected an error");
  } catch (reccl::error const& e) {
    CHECK(e.code() == status::invalid_argument);
    CHECK(contains(e.what(), "VT count is 0"));
  }
  c.n_vts = transport::cpu_threads::max_vts + 1;
  try {
    cpu::communicator comm(c);
    FAIL("expected an error");
  } catch (reccl::error const& e) {
    CHECK(e.code() == status::invalid_argument);
    CHECK(contains(e.what(), "more than the CPU transport supports"));
  }
  c.n_vts = 2;
  c.nranks = 0;
  CHECK_THROWS_AS(cpu::communicator{c}, reccl::error);
  c.nranks = 2;
  c.slots = 0;
  CHECK_THROWS_AS(cpu::communicator{c}, reccl::error);
  c.slots = 4;
  c.faults.kill(5, 0);  // names a VT the communicator does not have
  CHECK_THROWS_AS(cpu::communicator{c}, reccl::error);
}

TEST_CASE("a poll quantum the fixed-point cost model cannot price is refused, unless alpha is given") {
  cpu::config c = small(2, 2);
  c.poll_quantum_ns = 100'000;  // 100 us in Q24 ns is above cost_model_q::coef_limit
  try {
    cpu::communicator comm(c);
    FAIL("expected an error");
  } catch (reccl::error const& e) {
    CHECK(e.code() == status::invalid_argument);
    CHECK(contains(e.what(), "poll quantum"));
  }
  c.model.alpha = std::uint64_t{60'000} << telemetry::cost_model_q::frac_bits;
  CHECK_NOTHROW(cpu::communicator{c});
}

TEST_CASE("null buffers are invalid_argument (but fine with count 0, and off the broadcast root)") {
  cpu::communicator comm(small(2, 2));
  std::vector<float> buf(16, 1.0f);
  auto errs = errors_of(comm, [&](int r) { ar::run(comm, r, nullptr, buf.data() + 8 * r, 8); });
  for (int r = 0; r < 2; ++r) {
    CHECK(errs[r].code() == status::invalid_argument);
    CHECK(errs[r].rank() == r);
    CHECK(contains(errs[r].what(), "send buffer is null"));
  }
  errs = errors_of(comm, [&](int r) { ar::run(comm, r, buf.data(), nullptr, 8); });
  for (int r = 0; r < 2; ++r) CHECK(contains(errs[r].what(), "receive buffer is null"));
  // local argument errors leave the communicator usable
  errs = errors_of(comm, [&](int r) { ar::run(comm, r, nullptr, nullptr, 0); });
  for (auto const& e : errs) CHECK(e.code() == status::ok);
  std::vector<float> root_in(8, 3.0f), out0(8, 0.0f), out1(8, 0.0f);
  errs = errors_of(comm, [&](int r) { bc::run(comm, r, r == 0 ? root_in.data() : nullptr, r == 0 ? out0.data() : out1.data(), 8, redop::sum, 0); });
  for (auto const& e : errs) CHECK(e.code() == status::ok);
  CHECK(out1 == root_in);
}

TEST_CASE("root and reduction op out of range are invalid_argument") {
  cpu::communicator comm(small(2, 1));
  std::vector<float> a(4, 1.0f), b(4);
  auto errs = errors_of(comm, [&](int r) { bc::run(comm, r, a.data(), b.data(), 4, redop::sum, 2); });
  for (auto const& e : errs) {
    CHECK(e.code() == status::invalid_argument);
    CHECK(contains(e.what(), "root 2"));
  }
  errs = errors_of(comm, [&](int r) { ar::run(comm, r, a.data(), b.data(), 4, static_cast<redop>(9)); });
  for (auto const& e : errs) CHECK(e.code() == status::invalid_argument);
  CHECK_THROWS_AS(ar::run(comm, 5, a.data(), b.data(), 4), reccl::error);
}

TEST_CASE("counts that disagree across ranks: every rank gets a mismatch naming a rank, no hang") {
  cpu::communicator comm(small(3, 2));
  std::vector<std::vector<float>> in(3, std::vector<float>(100, 1.0f)), out(3, std::vector<float>(100));
  auto errs = errors_of(comm, [&](int r) { ar::run(comm, r, in[r].data(), out[r].data(), r == 2 ? 99 : 100); });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(errs[r].code() == status::mismatch);
    CHECK(errs[r].epoch() == 0);
    CHECK(errs[r].vt() >= 0);
    CHECK(contains(errs[r].what(), "count 99"));
    CHECK(contains(errs[r].what(), "count 100"));
  }
  // after a cross-rank error the communicator is failed
  errs = errors_of(comm, [&](int r) { ar::run(comm, r, in[r].data(), out[r].data(), 100); });
  for (auto const& e : errs) CHECK(contains(e.what(), "failed in an earlier collective"));
}

TEST_CASE("element types that disagree across ranks are a mismatch") {
  cpu::communicator comm(small(2, 1));
  std::vector<float> f(10, 1.0f), fo(10);
  std::vector<double> d(10, 1.0), dout(10);
  auto errs = errors_of(comm, [&](int r) {
    if (r == 0) ar::run(comm, r, f.data(), fo.data(), 10);
    else ar_double::run(comm, r, d.data(), dout.data(), 10);
  });
  for (auto const& e : errs) {
    CHECK(e.code() == status::mismatch);
    CHECK((contains(e.what(), "double") && contains(e.what(), "float")));
  }
}

TEST_CASE("a rank that never arrives: the others time out with an error naming that rank and a VT") {
  cpu::communicator comm(small(4, 2));
  std::vector<std::vector<float>> in(4, std::vector<float>(64, 1.0f)), out(4, std::vector<float>(64));
  std::uint64_t const t0 = cpu::now_ns();
  auto errs = errors_of(comm, [&](int r) {
    if (r != 3) ar::run(comm, r, in[r].data(), out[r].data(), 64);
  });
  CHECK(cpu::now_ns() - t0 < 3'000'000'000);
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(errs[r].code() == status::timeout);
    CHECK(errs[r].rank() == 3);
    CHECK(errs[r].vt() >= 0);
    CHECK(errs[r].vt() < 2);
    CHECK(errs[r].epoch() == 0);
    CHECK(contains(errs[r].what(), "rank 3 never arrived"));
  }
}

TEST_CASE("a rank that arrives after the others gave up fails fast instead of waiting out its deadlines") {
  cpu::config c = small(3, 2);
  c.sync_timeout_ns = 60'000'000'000;
  cpu::communicator comm(c);
  std::vector<std::vector<float>> in(3, std::vector<float>(64, 1.0f)), out(3, std::vector<float>(64));
  std::uint64_t late_took = 0;
  auto errs = errors_of(comm, [&](int r) {
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(600));
    std::uint64_t const t0 = cpu::now_ns();
    ar::run(comm, r, in[r].data(), out[r].data(), 64);
    if (r == 2) late_took = cpu::now_ns() - t0;
  });
  CHECK(errs[0].code() == status::timeout);
  CHECK(errs[1].code() == status::timeout);
  CHECK(errs[2].code() != status::ok);
  CHECK(contains(errs[2].what(), "never arrived"));
  CHECK(late_took == 0);  // it threw
}

/// Each rank's wall time in its call, in nanoseconds (filled by timed()).
struct call_times {
  std::vector<std::uint64_t> ns;
  explicit call_times(int n) : ns(static_cast<std::size_t>(n), 0) {}
  template <class F>
  void timed(int r, F&& f) {
    std::uint64_t const t0 = cpu::now_ns();
    try {
      f();
    } catch (...) {
      ns[r] = cpu::now_ns() - t0;
      throw;
    }
    ns[r] = cpu::now_ns() - t0;
  }
};

/// A correct all-reduce on every rank of `comm`: every output must be the sum.
void check_usable(cpu::communicator& comm) {
  int const n = comm.nranks();
  std::vector<std::vector<float>> in(n, std::vector<float>(256)), out(n, std::vector<float>(256, -1.0f));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < 256; ++i) in[r][i] = static_cast<float>(r + 1);
  comm.run_ranks([&](int r) { ar::run(comm, r, in[r].data(), out[r].data(), 256); });
  float const sum = static_cast<float>(n * (n + 1) / 2);
  for (int r = 0; r < n; ++r) CHECK(out[r] == std::vector<float>(256, sum));
}

TEST_CASE("a rank that passes a null buffer releases its peers at once: every rank's error names it and the cause") {
  cpu::communicator comm(with_default_deadlines(4, 2));
  REQUIRE(comm.cfg().arrival_timeout_ns >= 10'000'000'000);
  std::vector<std::vector<float>> in(4, std::vector<float>(64, 1.0f)), out(4, std::vector<float>(64));
  call_times t(4);
  auto errs = errors_of(comm, [&](int r) {
    if (r == 2) std::this_thread::sleep_for(std::chrono::milliseconds(50));  // the others are waiting by then
    t.timed(r, [&] { ar::run(comm, r, r == 2 ? nullptr : in[r].data(), out[r].data(), 64); });
  });
  for (int r = 0; r < 4; ++r) {
    CAPTURE(r);
    CHECK(errs[r].code() == status::invalid_argument);
    CHECK(errs[r].rank() == 2);
    CHECK(errs[r].epoch() == 0);
    CHECK(contains(errs[r].what(), "null"));
    if (r != 2) CHECK(contains(errs[r].what(), "rank 2 gave up collective 0"));
    CHECK(t.ns[r] < 500'000'000);
  }
  // No data moved and no rank's state advanced: the communicator stays usable, and the aborted
  // call's record does not end the next call (still epoch 0, but the next call).
  check_usable(comm);
  CHECK(comm.epoch(0) == 1);
}

TEST_CASE("a root out of range on one rank releases the others at once with that rank's cause") {
  cpu::communicator comm(with_default_deadlines(3, 2));
  std::vector<std::vector<float>> in(3, std::vector<float>(64, 2.0f)), out(3, std::vector<float>(64));
  call_times t(3);
  auto errs = errors_of(comm, [&](int r) {
    if (r == 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    t.timed(r, [&] { bc::run(comm, r, in[r].data(), out[r].data(), 64, redop::sum, r == 1 ? 7 : 0); });
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(errs[r].code() == status::invalid_argument);
    CHECK(errs[r].rank() == 1);
    CHECK(contains(errs[r].what(), "root 7 outside [0, 3)"));
    CHECK(t.ns[r] < 500'000'000);
  }
  check_usable(comm);
}

TEST_CASE("a rank that fails locally twice before its peers start: each call ends with its own cause, in order") {
  cpu::communicator comm(with_default_deadlines(3, 1));
  std::vector<std::vector<float>> in(3, std::vector<float>(64, 1.0f)), out(3, std::vector<float>(64));
  std::vector<std::vector<reccl::error>> errs(3, std::vector<reccl::error>(2, reccl::error(status::ok, "none")));
  call_times t(3);
  comm.run_ranks([&](int r) {
    if (r != 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));  // rank 0 is two calls ahead by then
    for (int k = 0; k < 2; ++k) {
      try {
        t.timed(r, [&] {
          if (r == 0 && k == 0) ar::run(comm, r, nullptr, out[r].data(), 64);
          else if (r == 0) ar::run(comm, r, in[r].data(), nullptr, 64);
          else ar::run(comm, r, in[r].data(), out[r].data(), 64);
        });
      } catch (reccl::error const& e) {
        errs[r][k] = e;
      }
      if (r != 0) CHECK(t.ns[r] < 500'000'000);
    }
  });
  for (int r = 0; r < 3; ++r) {
    CAPTURE(r);
    CHECK(errs[r][0].rank() == 0);
    CHECK(contains(errs[r][0].what(), "send buffer is null"));
    CHECK(errs[r][1].rank() == 0);
    CHECK(contains(errs[r][1].what(), "receive buffer is null"));
  }
  check_usable(comm);
}

TEST_CASE("reccl::error: what() names status, rank, VT and epoch") {
  reccl::error const e(status::timeout, "something", 2, 1, 5);
  CHECK(std::string(e.what()) == "reccl timeout (rank 2, VT 1, epoch 5): something");
  CHECK(e.detail() == "something");
  reccl::error const f(status::invalid_argument, "bad");
  CHECK(std::string(f.what()) == "reccl invalid_argument: bad");
}

TEST_CASE("without RECCL_DTYPES every dtype's reductions are compiled") {
  static_assert(reccl::compiled_dtypes == reccl::dtype_bits::all);
  for (dtype t : all_dtypes) {
    CHECK(reccl::dtype_compiled(t));
    CHECK_NOTHROW(reccl::require_compiled(collective::all_reduce, t));
  }
}
