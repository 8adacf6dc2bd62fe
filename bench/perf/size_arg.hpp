// bench/perf/size_arg.hpp -- sizes on the benchmarks' command lines, as nccl-tests writes them:
// a number with an optional K, M or G suffix (powers of 1024).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

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
