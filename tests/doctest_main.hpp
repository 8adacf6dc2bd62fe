// tests/doctest_main.hpp -- doctest's main for test binaries with cases that cannot run everywhere
// (no GPU, fewer GPUs than the case needs, no RDMA device). Such a case calls SKIP_CASE(reason): it
// prints "skipped: <reason>", leaves the case, and is reported as skipped, never as passed.
// Include this header instead of defining DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN, in the binary's one
// translation unit.
//
// Exit status: doctest's when a case failed; skipped_exit_code (77, the tests' SKIP_RETURN_CODE in
// CTest) when every case that ran was skipped; 1 when the filters selected no case (a filter that
// matches nothing must not pass). A run that skipped some of its cases lists them after doctest's
// summary, which counts them among the passed.
#pragma once

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

namespace reccl_test {

inline constexpr int skipped_exit_code = 77;

struct run_record {
  std::string current;               // the test case running now
  int cases_run = 0;
  std::vector<std::string> skipped;  // "case: reason"
};
inline run_record& record() {
  static run_record r;
  return r;
}

inline void record_skip(std::string const& reason) { record().skipped.push_back(record().current + ": " + reason); }

/// Follows which test case runs, so that SKIP_CASE can name it.
struct case_listener : doctest::IReporter {
  explicit case_listener(doctest::ContextOptions const&) {}
  void test_case_start(doctest::TestCaseData const& tc) override {
    record().current = tc.m_name;
    ++record().cases_run;
  }
  void report_query(doctest::QueryData const&) override {}
  void test_run_start() override {}
  void test_run_end(doctest::TestRunStats const&) override {}
  void test_case_reenter(doctest::TestCaseData const&) override {}
  void test_case_end(doctest::CurrentTestCaseStats const&) override {}
  void test_case_exception(doctest::TestCaseException const&) override {}
  void subcase_start(doctest::SubcaseSignature const&) override {}
  void subcase_end() override {}
  void log_assert(doctest::AssertData const&) override {}
  void log_message(doctest::MessageData const&) override {}
  void test_case_skipped(doctest::TestCaseData const&) override {}
};
REGISTER_LISTENER("reccl_case_listener", 1, case_listener);

}  // namespace reccl_test

/// Ends the current test case as skipped; the reason is a stream expression ("needs " << n << " GPUs").
#define SKIP_CASE(...)                                     \
  do {                                                     \
    std::ostringstream reccl_skip_reason_;                 \
    reccl_skip_reason_ << __VA_ARGS__;                     \
    MESSAGE("skipped: " << reccl_skip_reason_.str());      \
    ::reccl_test::record_skip(reccl_skip_reason_.str());   \
    return;                                                \
  } while (0)

int main(int argc, char** argv) {
  doctest::Context context(argc, argv);
  int const rc = context.run();
  if (context.shouldExit() || rc != 0) return rc;
  auto const& r = reccl_test::record();
  if (r.cases_run == 0) {
    std::fprintf(stderr, "[doctest] no test case matched the filters\n");
    return 1;
  }
  if (r.skipped.empty()) return 0;
  std::printf("[doctest] skipped: %zu of %d test cases (counted as passed above)\n", r.skipped.size(), r.cases_run);
  for (auto const& s : r.skipped) std::printf("[doctest]   skipped: %s\n", s.c_str());
  std::fflush(stdout);
  return static_cast<int>(r.skipped.size()) == r.cases_run ? reccl_test::skipped_exit_code : 0;
}
