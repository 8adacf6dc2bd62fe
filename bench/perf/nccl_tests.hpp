// bench/perf/nccl_tests.hpp -- nccl-tests' conventions, shared by the benchmarks: sizes on the
// command line (a number with an optional K, M or G suffix, powers of 1024), collective names, and
// the busbw factor of each collective.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "reccl/types.hpp"

inline std::uint64_t parse_size(std::string const& s) {
  if (s.empty()) throw CLI::ValidationError("size", "empty");
  std::size_t pos = 0;
  double const v = std::stod(s, &pos);
  std::uint64_t mult = 1;
  if (pos < s.size()) {
    switch (s[pos]) {
      case 'K': case 'k': mult = 1ull << 10; break;
      case 'M': case 'm': mult = 1ull << 20; break;
      case 'G': case 'g': mult = 1ull << 30; break;
      default: throw CLI::ValidationError("size", "unknown suffix in " + s);
    }
  }
  return static_cast<std::uint64_t>(v * static_cast<double>(mult));
}

inline reccl::collective parse_coll(std::string const& s) {
  using reccl::collective;
  if (s == "all_reduce" || s == "allreduce") return collective::all_reduce;
  if (s == "reduce_scatter" || s == "reducescatter") return collective::reduce_scatter;
  if (s == "all_gather" || s == "allgather") return collective::all_gather;
  if (s == "broadcast") return collective::broadcast;
  if (s == "alltoall" || s == "all_to_all") return collective::all_to_all;
  throw CLI::ValidationError("op", "unknown collective " + s);
}

/// nccl-tests' busbw factor.
inline double bus_factor(reccl::collective c, int n) {
  switch (c) {
    case reccl::collective::all_reduce: return 2.0 * (n - 1) / n;
    case reccl::collective::broadcast: return 1.0;
    default: return static_cast<double>(n - 1) / n;
  }
}
