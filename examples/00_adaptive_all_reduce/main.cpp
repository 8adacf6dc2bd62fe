// Adaptive all-reduce on the CPU engine: 4 ranks x 4 VTs whose links are rate-capped far below what
// the CPU can move, so the caps set the times. Four phases:
//   1. healthy       every VT at the base rate
//   2. slow          VT 3 capped to 1/4 of the others: the allocator moves bytes off it
//   3. dead          VT 3 moves nothing: the faulting collective still returns the right result,
//                    then VT 3 is masked and the three live VTs carry everything
//   4. recovered     VT 3 healthy again: a probe brings it back, its share grows
// Every collective prints its split, the measured time and, labelled as a model, the times the
// caps allow for that split, for the equal split and for the optimal split; every result is
// checked against a reference. The run ends with target checks and a JSON summary.
//
//   adaptive_all_reduce [--allocator texcp|proportional|aimd|equal] [--json FILE]
//
// Exit status: 0 if every result was correct (targets are reported, not enforced), 1 if a result
// was wrong, 2 on a usage error.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/core.h>
#include <nlohmann/json.hpp>

#include <reccl/collective.hpp>
#include <reccl/policy/allocator/aimd.hpp>
#include <reccl/policy/allocator/equal.hpp>
#include <reccl/policy/allocator/proportional.hpp>
#include <reccl/policy/allocator/texcp.hpp>
#include <reccl/policy/schedule/ring.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>

namespace {

constexpr int nranks = 4;
constexpr int n_vts = 4;
constexpr int slow_vt = 3;
constexpr double base_rate = 5e6;           // bytes/s per link of a healthy VT
constexpr double slow_rate = base_rate / 4;  // phase 2
constexpr std::uint64_t count = 1 << 19;     // floats per rank: 2 MiB
// Ring all-reduce: each link carries 2(N-1)/N of its VT's block.
constexpr double ring_factor = 2.0 * (nranks - 1) / nranks;

struct phase {
  char const* name;
  int collectives;
  int settle;  // collectives before the steady part
};
constexpr phase phases[] = {{"healthy", 10, 2}, {"slow", 16, 5}, {"dead", 14, 2}, {"recovered", 16, 10}};
constexpr int n_phases = 4;

int phase_start(int p) {
  int s = 0;
  for (int k = 0; k < p; ++k) s += phases[k].collectives;
  return s;
}

/// The link rate of VT v in phase p (0: dead).
double rate(int p, int v) {
  if (v != slow_vt) return base_rate;
  if (p == 1) return slow_rate;
  if (p == 2) return 0;
  return base_rate;
}

/// Model time (seconds) of a split: the slowest VT's block over its link, times the ring factor.
double model_time(int p, std::uint64_t const* counts, std::uint32_t live) {
  double t = 0;
  for (int v = 0; v < n_vts; ++v) {
    if (!((live >> v) & 1u) || counts[v] == 0) continue;
    double const r = rate(p, v);
    if (r <= 0) return 1e30;
    t = std::max(t, ring_factor * static_cast<double>(counts[v]) * sizeof(float) / r);
  }
  return t;
}
double model_equal(int p) {
  std::uint64_t c[n_vts];
  for (auto& x : c) x = count / n_vts;
  return model_time(p, c, 0xfu);
}
double model_optimal(int p) {
  double sum = 0;
  for (int v = 0; v < n_vts; ++v) sum += rate(p, v);
  return ring_factor * static_cast<double>(count) * sizeof(float) / sum;
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  std::size_t const m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

struct row {
  int index, phase;
  double time_ms, model_split_ms, model_equal_ms, model_opt_ms;
  double share[n_vts];
  std::uint64_t counts[n_vts];
  std::uint64_t stalls[n_vts];
  std::string status;
  bool correct;
};

template <class A>
int run(char const* alloc_name, std::string const& json_path) {
  reccl::cpu::config cfg;
  cfg.nranks = nranks;
  cfg.n_vts = n_vts;
  // 8 slots of 8 KiB: 13 ms of wire time in flight per link at the base rate, so a worker that the
  // OS wakes a few milliseconds late does not leave its link idle.
  cfg.slots = 8;
  cfg.slot_bytes = 8192;
  cfg.wait_timeout_ns = 250'000'000;  // a VT that moves nothing for 250 ms is dead
  cfg.control.probe_interval = 4;     // try a masked VT every 4 collectives
  for (int v = 0; v < n_vts; ++v) cfg.faults.cap(v, base_rate);
  cfg.faults.cap(slow_vt, slow_rate, static_cast<std::uint64_t>(phase_start(1)), static_cast<std::uint64_t>(phase_start(2)));
  cfg.faults.kill(slow_vt, static_cast<std::uint64_t>(phase_start(2)), static_cast<std::uint64_t>(phase_start(3)));
  reccl::cpu::communicator comm(cfg);
  using all_reduce = reccl::all_reduce<float, reccl::schedule::ring, reccl::transport::cpu_threads,
                                       reccl::telemetry::stalls, A>;

  fmt::print("reccl adaptive all-reduce on the CPU engine: {} ranks x {} VTs, ring, {} + stall telemetry\n", nranks,
             n_vts, alloc_name);
  fmt::print("message {} KiB per rank; link caps {:.2f} MB/s per VT ({:.2f} MB/s for VT {} in phase 2); "
             "model = ring factor x block / cap (not measured)\n\n",
             count * sizeof(float) >> 10, base_rate / 1e6, slow_rate / 1e6, slow_vt);
  fmt::print("{:>4} {:<10} {:>31}  {:>8}  {:>27}  {}\n", "#", "phase", "split % (VT0 VT1 VT2 VT3)", "time",
             "model ms: split equal optimal", "status");

  std::mt19937_64 g(2026);
  std::vector<std::vector<float>> in(nranks, std::vector<float>(count)), out(nranks, std::vector<float>(count));
  std::vector<float> expect(count);
  std::vector<row> rows;
  bool all_correct = true;
  int total = phase_start(n_phases);
  for (int i = 0; i < total; ++i) {
    int p = 0;
    while (p + 1 < n_phases && i >= phase_start(p + 1)) ++p;
    // fresh data whose sum is exact in any order (small nonzero integers); poisoned outputs
    std::fill(expect.begin(), expect.end(), 0.0f);
    for (int r = 0; r < nranks; ++r)
      for (std::uint64_t k = 0; k < count; ++k) {
        std::uint64_t const x = g();
        float const v = static_cast<float>(1 + x % 8) * ((x >> 8) & 1 ? 1.0f : -1.0f);
        in[r][k] = v;
        expect[k] += v;
      }
    for (auto& o : out) std::fill(o.begin(), o.end(), std::numeric_limits<float>::quiet_NaN());
    std::vector<reccl::cpu::collective_result> res(nranks);
    comm.run_ranks([&](int r) { res[r] = all_reduce::run(comm, r, in[r].data(), out[r].data(), count, reccl::redop::sum); });
    bool correct = true;
    for (int r = 0; r < nranks; ++r)
      correct = correct && std::equal(out[r].begin(), out[r].end(), expect.begin());
    all_correct = all_correct && correct;
    std::uint64_t t = 0;
    for (auto const& x : res) t = std::max(t, x.elapsed_ns);
    auto const& rep = res[0].report;
    row w{};
    w.index = i;
    w.phase = p;
    w.time_ms = static_cast<double>(t) / 1e6;
    w.model_split_ms = model_time(p, rep.split.count, rep.split.live_mask) * 1e3;
    w.model_equal_ms = model_equal(p) * 1e3;
    w.model_opt_ms = model_optimal(p) * 1e3;
    for (int v = 0; v < n_vts; ++v) {
      w.share[v] = 100.0 * static_cast<double>(rep.split.count[v]) / static_cast<double>(count);
      w.counts[v] = rep.split.count[v];
      w.stalls[v] = rep.stalls[v];
    }
    w.status = res[0].st == reccl::status::recovered ? "recovered (fault event: VT " +
                                                           std::to_string(std::countr_zero(res[0].fault_mask)) + " missed its deadline)"
                                                     : "ok";
    if (rep.rejoined_mask) w.status += " (probe ok: VT " + std::to_string(std::countr_zero(rep.rejoined_mask)) + " rejoins)";
    else if (rep.probe_mask) w.status += " (probe of VT " + std::to_string(std::countr_zero(rep.probe_mask)) + " failed)";
    w.correct = correct;
    if (!correct) w.status += "  WRONG RESULT";
    rows.push_back(w);
    auto const fmt_ms = [](double ms) { return ms > 1e20 ? std::string("   inf") : fmt::format("{:6.1f}", ms); };
    fmt::print("{:>4} {:<10} {:>7.2f} {:>7.2f} {:>7.2f} {:>7.2f}  {:>6.1f} ms  {:>13} {:>6} {:>7}  {}\n", i,
               phases[p].name, w.share[0], w.share[1], w.share[2], w.share[3], w.time_ms, fmt_ms(w.model_split_ms),
               fmt_ms(w.model_equal_ms), fmt_ms(w.model_opt_ms), w.status);
  }

  // -- targets, on the median of each phase's steady part
  auto steady = [&](int p, auto f) {
    std::vector<double> v;
    for (auto const& w : rows)
      if (w.phase == p && w.index >= phase_start(p) + phases[p].settle) v.push_back(f(w));
    return median(v);
  };
  auto time_of = [](row const& w) { return w.time_ms; };
  double const t1 = steady(0, time_of), t2 = steady(1, time_of), t3 = steady(2, time_of), t4 = steady(3, time_of);
  double const ideal_share = 100.0 * slow_rate / (3 * base_rate + slow_rate);
  // phase 2: the slow VT's share within 10% of B_i / sum B after at most 5 collectives
  int converged_after = -1;
  for (auto const& w : rows) {
    if (w.phase != 1) continue;
    bool const in_band = std::abs(w.share[slow_vt] - ideal_share) <= 0.1 * ideal_share;
    if (in_band && converged_after < 0) converged_after = w.index - phase_start(1);
    if (!in_band) converged_after = -1;  // must stay in the band
  }
  double const share2 = steady(1, [](row const& w) { return w.share[slow_vt]; });
  double const opt2 = model_optimal(1) * 1e3, eq2 = model_equal(1) * 1e3, ideal3 = model_optimal(2) * 1e3;
  row const& faulting = rows[static_cast<std::size_t>(phase_start(2))];
  int rejoined_after = -1;
  for (auto const& w : rows)
    if (w.phase == 3 && w.counts[slow_vt] > 0 && rejoined_after < 0) rejoined_after = w.index - phase_start(3);

  struct target {
    std::string what;
    bool pass;
  };
  std::vector<target> targets = {
      {fmt::format("every result correct ({} collectives)", rows.size()), all_correct},
      {fmt::format("phase 2: slow VT share within 10% of B/sum(B) = {:.2f}% after <= 5 collectives "
                   "(in band from collective {} of the phase on; steady median {:.2f}%)",
                   ideal_share, converged_after, share2),
       converged_after >= 0 && converged_after <= 5},
      {fmt::format("phase 2: steady median time {:.1f} ms within 10% of the model optimum {:.1f} ms "
                   "({:.2f}x faster than the model's equal split {:.1f} ms; ideal {:.2f}x)",
                   t2, opt2, eq2 / t2, eq2, eq2 / opt2),
       t2 <= 1.1 * opt2},
      {fmt::format("phase 3: faulting collective #{} correct and reported ({}, {:.1f} ms)", faulting.index,
                   faulting.status, faulting.time_ms),
       faulting.correct && faulting.status.rfind("recovered", 0) == 0},
      {fmt::format("phase 3: steady throughput {:.1f}% of the live VTs' model ideal ({:.1f} ms vs {:.1f} ms; "
                   "{:.1f}% of phase 1's measured throughput, ideal 75%)",
                   100.0 * ideal3 / t3, t3, ideal3, 100.0 * t1 / t3),
       ideal3 / t3 >= 0.95},
      {fmt::format("phase 4: VT {} back in the split within 10 collectives (after {})", slow_vt, rejoined_after),
       rejoined_after >= 0 && rejoined_after <= 10},
  };
  fmt::print("\nsteady medians: healthy {:.1f} ms (model {:.1f}), slow {:.1f} ms (model optimum {:.1f}), dead {:.1f} ms "
             "(model {:.1f}), recovered {:.1f} ms (model {:.1f})\n",
             t1, model_optimal(0) * 1e3, t2, opt2, t3, ideal3, t4, model_optimal(3) * 1e3);
  fmt::print("targets:\n");
  for (auto const& t : targets) fmt::print("  [{}] {}\n", t.pass ? "pass" : "FAIL", t.what);

  nlohmann::json j;
  j["engine"] = "cpu";
  j["allocator"] = alloc_name;
  j["telemetry"] = "stalls";
  j["schedule"] = "ring";
  j["ranks"] = nranks;
  j["vts"] = n_vts;
  j["bytes_per_rank"] = count * sizeof(float);
  j["base_rate_bytes_per_s"] = base_rate;
  j["slow_rate_bytes_per_s"] = slow_rate;
  j["all_correct"] = all_correct;
  for (int p = 0; p < n_phases; ++p) {
    nlohmann::json ph;
    ph["name"] = phases[p].name;
    ph["first_collective"] = phase_start(p);
    ph["collectives"] = phases[p].collectives;
    ph["steady_from"] = phase_start(p) + phases[p].settle;
    ph["steady_median_ms"] = steady(p, time_of);
    ph["model_optimal_ms"] = model_optimal(p) * 1e3;
    ph["model_equal_ms"] = model_equal(p) > 1e20 ? -1.0 : model_equal(p) * 1e3;
    j["phases"].push_back(ph);
  }
  j["faulting_collective"] = {{"index", faulting.index}, {"time_ms", faulting.time_ms}, {"correct", faulting.correct}};
  for (auto const& t : targets) j["targets"].push_back({{"target", t.what}, {"pass", t.pass}});
  for (auto const& w : rows) {
    nlohmann::json r;
    r["index"] = w.index;
    r["phase"] = phases[w.phase].name;
    r["time_ms"] = w.time_ms;
    r["model_split_ms"] = w.model_split_ms > 1e20 ? -1.0 : w.model_split_ms;
    r["split"] = std::vector<std::uint64_t>(w.counts, w.counts + n_vts);
    r["stalls"] = std::vector<std::uint64_t>(w.stalls, w.stalls + n_vts);
    r["status"] = w.status;
    r["correct"] = w.correct;
    j["collectives"].push_back(r);
  }
  if (!json_path.empty()) {
    std::ofstream f(json_path);
    f << j.dump(2) << "\n";
    fmt::print("JSON summary written to {}\n", json_path);
  } else {
    nlohmann::json brief = j;
    brief.erase("collectives");
    fmt::print("{}\n", brief.dump());
  }
  return all_correct ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string alloc = "texcp", json;
  for (int i = 1; i < argc; ++i) {
    std::string const a = argv[i];
    if (a == "--allocator" && i + 1 < argc) alloc = argv[++i];
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else {
      fmt::print(stderr, "usage: {} [--allocator texcp|proportional|aimd|equal] [--json FILE]\n", argv[0]);
      return 2;
    }
  }
  try {
    if (alloc == "texcp") return run<reccl::allocator::texcp>("texcp", json);
    if (alloc == "proportional") return run<reccl::allocator::proportional>("proportional", json);
    if (alloc == "aimd") return run<reccl::allocator::aimd>("aimd", json);
    if (alloc == "equal") return run<reccl::allocator::equal>("equal", json);
  } catch (reccl::error const& e) {
    fmt::print(stderr, "{}\n", e.what());
    return 1;
  }
  fmt::print(stderr, "unknown allocator '{}'\n", alloc);
  return 2;
}
