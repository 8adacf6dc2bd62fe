// reccl_sim -- runs scenario files through the flow-level simulator and writes CSV + markdown.
//
//   reccl_sim [--out DIR] [--quiet] SCENARIO.json...
//
// For each file: every case (the sweep's combinations) under every variant (allocator, NCCL-style
// abort or not), collective by collective through reccl's own schedules, allocators and control
// loop; then <DIR>/<name>.csv (per collective), <name>_summary.csv and <name>.md (published and
// simulated side by side). plot.py draws <name>.png from the CSVs.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "src/report.hpp"
#include "src/scenario_file.hpp"

namespace {

void usage() {
  std::fputs(
      "usage: reccl_sim [--out DIR] [--quiet] SCENARIO.json...\n"
      "  Runs each scenario file (sim/scenarios/*.json) and writes DIR/<name>.csv, <name>_summary.csv\n"
      "  and <name>.md (default DIR: sim/results).\n",
      stderr);
}

}  // namespace

int main(int argc, char** argv) {
  std::string out = "sim/results";
  bool quiet = false;
  std::vector<std::string> files;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--out" && i + 1 < argc) out = argv[++i];
    else if (a == "--quiet") quiet = true;
    else if (a == "-h" || a == "--help") return usage(), 0;
    else if (!a.empty() && a[0] == '-') return usage(), std::fprintf(stderr, "unknown option '%s'\n", a.c_str()), 2;
    else files.push_back(a);
  }
  if (files.empty()) return usage(), 2;
  try {
    std::filesystem::create_directories(out);
    for (auto const& path : files) {
      auto const t0 = std::chrono::steady_clock::now();
      auto const f = reccl_sim::file::load(path);
      reccl_sim::report::run_set rs;
      rs.f = &f;
      for (auto const& fc : f.cases) {
        auto const tc = std::chrono::steady_clock::now();
        auto const plan = reccl_sim::compile_named(fc.c.schedule, reccl_sim::schedule_params(fc.c));
        double const compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - tc).count();
        for (auto const& v : f.variants) {
          auto r = reccl_sim::run_case(fc.c, v, plan);
          r.compile_s = compile_s;
          if (!quiet) {
            double const last = r.rows.back().busbw;
            fmt::print("{:<20} {:<48} {:<26} {:3} collectives in {:7.3f} s; last busbw {:7.1f} GB/s\n", f.name, fc.c.label,
                       v.name, r.rows.size(), r.wall_s, last / 1e9);
          }
          rs.runs.push_back(std::move(r));
        }
      }
      reccl_sim::report::write(rs, out);
      fmt::print("{}: {} cases × {} variants in {:.2f} s -> {}/{}.md\n", f.name, f.cases.size(), f.variants.size(),
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), out, f.name);
    }
  } catch (std::exception const& e) {
    std::fprintf(stderr, "reccl_sim: %s\n", e.what());
    return 1;
  }
  return 0;
}
