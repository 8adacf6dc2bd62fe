// call_agreement: the proxy collectives' host-side check that every rank of the process passes the
// same arguments, call by call, whatever order the ranks' calls come in.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <random>
#include <string>
#include <thread>
#include <vector>

#include "reccl/proxy/call_agreement.hpp"

using namespace reccl;
using namespace reccl::proxy;

namespace {

call_digest call(std::uint64_t count, collective c = collective::all_reduce) {
  call_digest d;
  d.coll = c;
  d.count = count;
  d.vt_shares = equal_shares(4, all_live(4));
  return d;
}

}  // namespace

TEST_CASE("call_agreement: ranks that agree pass, in any interleaving, and finished calls are forgotten") {
  int const n = 3;
  call_agreement a(n);
  std::mt19937 g(5);
  std::vector<int> next(n, 0);
  int const calls = 500;
  for (int done = 0; done < n * calls;) {
    int const r = static_cast<int>(g() % n);
    if (next[r] == calls) continue;
    CHECK(a.record(r, call(static_cast<std::uint64_t>(next[r]) * 7 + 1)).empty());
    ++next[r];
    ++done;
  }
  CHECK(a.pending() == 0);
}

TEST_CASE("call_agreement: each field that differs is named, with both ranks and the call") {
  call_digest const base = call(1000);
  auto differ = [&](call_digest other) {
    call_agreement a(2);
    CHECK(a.record(0, base).empty());
    return a.record(1, other);
  };
  call_digest d = base;
  d.count = 999;
  std::string m = differ(d);
  CHECK(m.find("rank 1's call 0 disagrees with rank 0's") != std::string::npos);
  CHECK(m.find("count: 999 vs 1000") != std::string::npos);
  d = base;
  d.coll = collective::all_gather;
  CHECK(differ(d).find("collective") != std::string::npos);
  d = base;
  d.type = dtype::bfloat16;
  CHECK(differ(d).find("dtype") != std::string::npos);
  d = base;
  d.op = redop::max;
  CHECK(differ(d).find("op") != std::string::npos);
  d = base;
  d.root = 1;
  CHECK(differ(d).find("root") != std::string::npos);
  d = base;
  d.vt_shares = equal_shares(4, 0b0111);
  CHECK(differ(d).find("vt_shares") != std::string::npos);
  d = base;
  d.vt_shares.w[0] += 1, d.vt_shares.w[1] -= 1;
  CHECK(differ(d).find("vt_shares: VT 0") != std::string::npos);
}

TEST_CASE("call_agreement: a late rank is compared with the call of the same index, and a mismatch keeps later calls aligned") {
  call_agreement a(2);
  for (int k = 0; k < 5; ++k) CHECK(a.record(0, call(100 + k)).empty());  // rank 0 runs ahead
  CHECK(a.record(1, call(100)).empty());
  CHECK_FALSE(a.record(1, call(555)).empty());  // call 1 disagrees
  CHECK(a.record(1, call(102)).empty());        // call 2 is compared with rank 0's call 2
  CHECK(a.record(0, call(105)).empty());
  CHECK(a.record(1, call(103)).empty());
  CHECK(a.record(1, call(104)).empty());
  CHECK(a.pending() == 1);
  CHECK(a.record(1, call(105)).empty());
  CHECK(a.pending() == 0);
  CHECK_FALSE(a.record(2, call(1)).empty());  // no rank 2
}

TEST_CASE("call_agreement: ranks on threads, one of them off by one element at one call") {
  int const n = 4, calls = 2000;
  call_agreement a(n);
  std::vector<std::vector<std::string>> seen(n);
  std::vector<std::thread> ts;
  for (int r = 0; r < n; ++r)
    ts.emplace_back([&, r] {
      for (int k = 0; k < calls; ++k) {
        std::uint64_t count = static_cast<std::uint64_t>(k) + 1;
        if (r == 2 && k == 1234) ++count;
        if (std::string m = a.record(r, call(count)); !m.empty()) seen[r].push_back(m);
      }
    });
  for (auto& t : ts) t.join();
  // whoever came second to call 1234 among rank 2 and the others reports it: at least one report,
  // every report about call 1234 and about rank 2's count
  std::size_t reports = 0;
  for (auto const& v : seen)
    for (auto const& m : v) {
      ++reports;
      CHECK(m.find("call 1234") != std::string::npos);
      CHECK((m.find("1235") != std::string::npos));
    }
  CHECK(reports >= 1);
}
