// The full cross product the CPU tests sample: every (collective/schedule, op, dtype, ranks, VTs,
// count), each run on a fresh communicator, poisoned outputs, checked bit for bit against the naive
// reference on data whose every fold order gives the same bits. Runnable by hand (it takes long):
//
//   cpu_sweep [--max-ranks N] [--max-vts N] [--counts a,b,c] [--shard i/n] [--dead]
//
// --shard i/n runs every n-th case starting at i (to spread the sweep over machines); --dead also
// kills VT 0 in the second of two collectives per case (recovery under every combination).
// Prints one line per failure and a summary; exit status 1 if any case failed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

#include "../../tests/cpu/support.hpp"

using namespace reccl_test;

namespace {

struct options {
  int max_ranks = 8, max_vts = 8;
  std::vector<std::uint64_t> counts = {0, 1, 7, 1000, 4097, 65537, 1000003};
  int shard = 0, shards = 1;
  bool dead = false;
};

template <collective Kind, class S, class T>
bool run_one(redop op, int nranks, int n_vts, std::uint64_t count, std::uint64_t seed, bool dead) {
  cpu::config cfg;
  cfg.nranks = nranks;
  cfg.n_vts = n_vts;
  cfg.granule = 1;
  cfg.poison_internal = true;
  cfg.slot_bytes = count > 70000 ? 32768 : 4096;
  cfg.wait_timeout_ns = dead ? 200'000'000 : 5'000'000'000;
  if (dead && n_vts > 1) cfg.faults.kill(0, 1, 2);
  cpu::communicator comm(cfg);
  std::mt19937_64 g(seed);
  using C = reccl::collective_op<Kind, T, S, transport::cpu_threads, telemetry::stalls, allocator::texcp>;
  int const rounds = dead ? 2 : 1;
  for (int k = 0; k < rounds; ++k) {
    auto const r = run_checked<C>(comm, count, g, reduces(Kind) ? op : redop::sum, nranks - 1);
    if (!r.correct) return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--max-ranks") o.max_ranks = std::stoi(next());
    else if (a == "--max-vts") o.max_vts = std::stoi(next());
    else if (a == "--dead") o.dead = true;
    else if (a == "--counts") {
      o.counts.clear();
      std::stringstream ss(next());
      for (std::string t; std::getline(ss, t, ',');) o.counts.push_back(std::stoull(t));
    } else if (a == "--shard") {
      std::string const s = next();
      o.shard = std::stoi(s.substr(0, s.find('/')));
      o.shards = std::stoi(s.substr(s.find('/') + 1));
    } else {
      std::fprintf(stderr, "usage: %s [--max-ranks N] [--max-vts N] [--counts a,b,c] [--shard i/n] [--dead]\n", argv[0]);
      return 2;
    }
  }
  constexpr redop ops[] = {redop::sum, redop::prod, redop::min, redop::max, redop::avg};
  long index = 0, run = 0, failed = 0;
  auto const t0 = std::chrono::steady_clock::now();
  for (int p = 0; p < n_plans; ++p)
    for (redop op : ops)
      for (dtype t : all_dtypes)
        for (int nr = 1; nr <= o.max_ranks; ++nr)
          for (int nv = 1; nv <= o.max_vts; ++nv)
            for (std::uint64_t count : o.counts) {
              bool const red = p <= static_cast<int>(plan::rs_two_shot);
              if (!red && op != redop::sum) continue;  // op only matters when reducing
              if (index++ % o.shards != o.shard) continue;
              ++run;
              bool ok = false;
              try {
                ok = with_plan(static_cast<plan>(p), [&]<collective Kind, class S>() {
                  return with_dtype(t, [&]<class T>() { return run_one<Kind, S, T>(op, nr, nv, count, 1000 + index, o.dead); });
                });
              } catch (std::exception const& e) {
                std::printf("error: %s\n", e.what());
              }
              if (!ok) {
                ++failed;
                std::printf("FAIL %s op=%s dtype=%s ranks=%d vts=%d count=%llu\n", plan_name(static_cast<plan>(p)),
                            std::string(name(op)).c_str(), std::string(name(t)).c_str(), nr, nv,
                            static_cast<unsigned long long>(count));
                std::fflush(stdout);
              }
              if (run % 500 == 0) {
                std::printf("... %ld cases, %ld failed\n", run, failed);
                std::fflush(stdout);
              }
            }
  double const secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("cpu_sweep: %ld cases, %ld failed, %.1f s\n", run, failed, secs);
  return failed ? 1 : 0;
}
