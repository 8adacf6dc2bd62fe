// tests/device/forked_ranks.hpp -- one process per rank, forked from the test before any CUDA call
// (a child cannot use CUDA initialised before fork()), the ranks all-gathering through a
// process_exchange. A child returns its exit status: 0 passed, skipped_exit_code when it found no
// GPU (every rank sees the same devices, so all of them skip or none does), anything else failed
// (its messages on stderr). The parent makes no CUDA call: it checks the statuses and reports the
// case as skipped when every rank skipped.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <vector>

#include "../doctest_main.hpp"
#include "process_exchange.hpp"

namespace gpu_test {

/// Forks `n` ranks, runs child(rank, n, exchange) in each, and checks how they ended.
template <class Child>
void run_forked_ranks(int n, std::chrono::seconds exchange_timeout, Child&& child) {
  process_exchange ex(n, 4096, exchange_timeout);
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    pid_t const pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int rc = 3;
      try {
        rc = child(r, n, ex.for_rank(r));
      } catch (std::exception const& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(stderr);
      _exit(rc);
    }
    kids.push_back(pid);
  }
  int skipped = 0;
  for (int r = 0; r < n; ++r) {
    int st = 0;
    waitpid(kids[static_cast<std::size_t>(r)], &st, 0);
    REQUIRE(WIFEXITED(st));
    if (WEXITSTATUS(st) == reccl_test::skipped_exit_code) {
      ++skipped;
      continue;
    }
    CHECK_MESSAGE(WEXITSTATUS(st) == 0, "rank " << r << " of " << n << " exit code " << WEXITSTATUS(st) << " (its messages are on stderr)");
  }
  REQUIRE_MESSAGE((skipped == 0 || skipped == n), skipped << " of " << n << " ranks found no GPU");
  if (skipped) SKIP_CASE("no GPU");
}

}  // namespace gpu_test
