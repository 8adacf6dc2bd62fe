// reccl_adaptive_bench -- the PReCCL loop on the GPU, every scenario in one binary and one run.
//
//   reccl_adaptive_bench [--bytes 64M] [--vts 8] [--out DIR] [--loopback N] ...   (--help for all)
//
// One process drives every rank: NCCL-backed ranks on >= 2 GPUs, or loopback ranks on one GPU
// (--loopback N, or automatically with a single GPU; then the "link" is that GPU's memory and the
// absolute figures say nothing about NVLink). Every collective below is timed with CUDA events on
// every rank's stream (the slower rank counts) and checked against an on-device reference.
//
//   1 healthy       texcp lane, no faults: the throttled VT's healthy rate (bytes / measured ns)
//   2 overhead      plain pipelined kernel (fixed equal split, no telemetry, no control) against
//                   the texcp lane, interleaved, medians; NCCL in the same process where present
//   3 references    under the throttle (VT rate / 4): a sweep of static splits (allocator::fixed)
//                   -> best static and equal split; healthy with the dead VT masked (7 VTs)
//   4 timeline      100 collectives: throttle VT from 20, dead from 40, healthy from 70 (texcp),
//                   eager; then the same 100 captured in one CUDA graph and replayed (results
//                   checked inside the graph); then the same timeline for reduce-scatter and
//                   all-gather
//   5 stability     a long throttled run for texcp and aimd: share std/mean of the throttled VT
//   6 cost model    least-squares fit of the measured VT times against stalls and bytes (R^2)
//
// Output: DIR/adaptive.json (everything), DIR/timeline.csv (per collective: time, busbw, shares,
// stalls, masked and faulted VTs), a table printed last. bench/adaptive/plot.py draws the CSV.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "../perf/reference.cuh"
#include "reccl/host/adaptive.hpp"
#include "reccl/policy/allocator/aimd.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "reccl/policy/allocator/fixed.hpp"
#include "reccl/policy/allocator/texcp.hpp"
#include "reccl/policy/telemetry/none.hpp"

namespace {

using reccl::collective;
using reccl::dtype;
using reccl::redop;
using json = nlohmann::json;

#define CK(x)                                                                                       \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)

struct options {
  std::string bytes = "64M";
  int vts = 8, ctas_per_vt = 0, chunk = 0, loopback = 0;
  int collectives = 100, throttle_at = 20, dead_at = 40, back_at = 70, vt = 3;
  int overhead_runs = 50, stability_runs = 60, static_runs = 8, probe_interval = 3;
  double vt_timeout_ms = 2.0, min_factor = 0.25;
  std::vector<std::string> study_bytes{"1M", "256M"};
  std::string out = ".";
  bool graph = true, others = true, study = false;
};

std::uint64_t parse_size(std::string const& s) {
  std::size_t pos = 0;
  double v = std::stod(s, &pos);
  std::uint64_t m = 1;
  if (pos < s.size()) m = s[pos] == 'K' ? 1ull << 10 : s[pos] == 'M' ? 1ull << 20 : s[pos] == 'G' ? 1ull << 30 : 1;
  return static_cast<std::uint64_t>(v * static_cast<double>(m));
}

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

struct world {
  int n = 0;
  bool loop = false;
  std::vector<ncclComm_t> nccl;
  std::vector<reccl::nvlink_communicator> comms;
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> ev0, ev1;
  std::vector<void*> in, out, exp;
  unsigned long long* wrong = nullptr;  // per rank, on that rank's device: [n]
  std::vector<unsigned long long*> wrong_d;
  int dev(int r) const { return loop ? 0 : r; }
  std::vector<reccl::nvlink_communicator*> ptrs() {
    std::vector<reccl::nvlink_communicator*> p;
    for (auto& c : comms) p.push_back(&c);
    return p;
  }
};

/// The collective of the scenario: sizes and the reference.
struct call {
  collective c = collective::all_reduce;
  dtype t = dtype::bfloat16;
  std::uint64_t bytes = 0;  // nccl-tests size: AR count*es, RS input, AG output
  std::uint64_t count(int n) const {
    std::uint64_t const es = reccl::size_of(t);
    return c == collective::all_reduce ? bytes / es : bytes / es / static_cast<std::uint64_t>(n);
  }
  std::uint64_t in_elems(int n) const { return c == collective::reduce_scatter ? count(n) * n : count(n); }
  std::uint64_t out_elems(int n) const { return c == collective::all_gather ? count(n) * n : count(n); }
  double busbw(int n, double us) const {
    double const f = c == collective::all_reduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
    return static_cast<double>(bytes) * f / (us * 1e3);
  }
};

void prepare_data(world& w, call const& k) {
  for (int r = 0; r < w.n; ++r) {
    CK(cudaSetDevice(w.dev(r)));
    reccl::bench::fill(k.t, w.in[r], k.in_elems(w.n), 2026, r, 0, w.streams[r]);
    reccl::bench::expect(k.t, k.c, redop::sum, r, w.n, 0, 2026, k.count(w.n), w.exp[r], k.out_elems(w.n), w.streams[r]);
    CK(cudaStreamSynchronize(w.streams[r]));
  }
}

/// On every rank: poison the output (and wait for it, so no rank's timing includes another's
/// poisoning), then [ev0] launch(r) [ev1] and a compare into wrong[r] (queued, no sync).
void queue_one(world& w, call const& k, std::function<void(int)> const& launch, bool timed = true) {
  for (int r = 0; r < w.n; ++r) {
    CK(cudaSetDevice(w.dev(r)));
    reccl::bench::poison(k.t, w.out[r], k.out_elems(w.n), w.streams[r]);
  }
  for (int r = 0; r < w.n; ++r) {
    CK(cudaSetDevice(w.dev(r)));
    CK(cudaStreamSynchronize(w.streams[r]));
    if (timed) CK(cudaEventRecord(w.ev0[r], w.streams[r]));
  }
  for (int r = 0; r < w.n; ++r) {
    CK(cudaSetDevice(w.dev(r)));
    launch(r);
    if (timed) CK(cudaEventRecord(w.ev1[r], w.streams[r]));
  }
  for (int r = 0; r < w.n; ++r) {
    CK(cudaSetDevice(w.dev(r)));
    reccl::bench::dispatch_dtype(k.t, [&]<class T>() {
      reccl::bench::diff_kernel<T><<<1024, 256, 0, w.streams[r]>>>(static_cast<reccl::device::bits_t<T> const*>(w.out[r]),
                                                                   static_cast<reccl::device::bits_t<T> const*>(w.exp[r]),
                                                                   k.out_elems(w.n), w.wrong_d[r]);
    });
  }
}

/// Synchronise; returns the slower rank's time of the last queued collective (us).
double finish(world& w) {
  double us = 0;
  for (int r = 0; r < w.n; ++r) {
    CK(cudaSetDevice(w.dev(r)));
    CK(cudaStreamSynchronize(w.streams[r]));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, w.ev0[r], w.ev1[r]));
    us = std::max(us, static_cast<double>(ms) * 1e3);
  }
  return us;
}

unsigned long long take_wrong(world& w) {
  unsigned long long total = 0;
  for (int r = 0; r < w.n; ++r) {
    CK(cudaSetDevice(w.dev(r)));
    unsigned long long x = 0;
    CK(cudaMemcpy(&x, w.wrong_d[r], sizeof(x), cudaMemcpyDeviceToHost));
    CK(cudaMemset(w.wrong_d[r], 0, sizeof(x)));
    total += x;
  }
  return total;
}

void check_lanes(world& w) {
  for (auto& c : w.comms) c.check();
}

template <class L>
void launch_lane(std::vector<L>& lanes, world& w, call const& k, int r) {
  std::uint64_t const cnt = k.count(w.n);
  switch (k.c) {
    case collective::all_reduce: lanes[r].all_reduce(w.in[r], w.out[r], cnt, k.t, redop::sum, w.streams[r]); break;
    case collective::reduce_scatter: lanes[r].reduce_scatter(w.in[r], w.out[r], cnt, k.t, redop::sum, w.streams[r]); break;
    case collective::all_gather: lanes[r].all_gather(w.in[r], w.out[r], cnt, k.t, w.streams[r]); break;
    default: break;
  }
}

reccl::adaptive_options lane_options(options const& o, int lane) {
  reccl::adaptive_options a;
  a.lane = lane;
  a.vts = o.vts;
  a.ctas_per_vt = o.ctas_per_vt;
  a.chunk_bytes = o.chunk;
  a.vt_timeout_ns = static_cast<std::uint64_t>(o.vt_timeout_ms * 1e6);
  a.control.probe_interval = o.probe_interval;
  return a;
}

/// Shares with VT `vt` at `s` (fraction) and the rest equal; VT `vt` masked when s == 0.
reccl::shares static_shares(int n_vts, int vt, double s) {
  reccl::shares sh{};
  sh.n_vts = n_vts;
  sh.live_mask = reccl::all_live(n_vts) & (s > 0 ? ~0u : ~(1u << vt));
  std::uint64_t const one = reccl::share_one;
  std::uint64_t const mine = s > 0 ? static_cast<std::uint64_t>(s * static_cast<double>(one)) : 0;
  std::uint64_t const rest = one - mine;
  int const others = n_vts - 1;
  std::uint64_t given = mine;
  for (int i = 0; i < n_vts; ++i) {
    if (i == vt) {
      sh.w[i] = static_cast<std::uint32_t>(mine);
      continue;
    }
    sh.w[i] = static_cast<std::uint32_t>(rest / others);
    given += sh.w[i];
  }
  for (int i = 0; i < n_vts && given < one; ++i)
    if (i != vt) ++sh.w[i], ++given;
  return sh;
}

/// Per-collective record of a timeline run (rank 0's report joined with the measured time).
struct step_row {
  std::uint64_t epoch = 0;
  double us = 0, busbw = 0;
  reccl::epoch_report rep{};
  bool have_rep = false;
};

template <class L>
std::vector<step_row> collect(std::vector<L>& lanes, std::uint64_t e0, std::vector<double> const& us, call const& k,
                              int n) {
  auto const reps = lanes[0].reports(e0, e0 + us.size());
  std::vector<step_row> rows(us.size());
  for (std::size_t i = 0; i < us.size(); ++i) {
    rows[i].epoch = i;
    rows[i].us = us[i];
    rows[i].busbw = k.busbw(n, us[i]);
  }
  for (auto const& r : reps)
    if (r.epoch >= e0 && r.epoch < e0 + us.size()) {
      rows[r.epoch - e0].rep = r;
      rows[r.epoch - e0].have_rep = true;
    }
  return rows;
}

json row_json(step_row const& r, int vts) {
  json j{{"i", r.epoch}, {"us", r.us}, {"busbw", r.busbw}};
  if (r.have_rep) {
    std::vector<double> share;
    std::vector<std::uint64_t> stalls, bytes;
    for (int v = 0; v < vts; ++v) {
      share.push_back(static_cast<double>(r.rep.split.count[v]) / static_cast<double>(std::max<std::uint64_t>(1, r.rep.split.total)));
      stalls.push_back(r.rep.stalls[v]);
      bytes.push_back(r.rep.bytes[v]);
    }
    j["split_share"] = share;
    j["stalls"] = stalls;
    j["bytes"] = bytes;
    j["masked"] = r.rep.masked_mask;
    j["fault"] = r.rep.fault_mask;
    j["probe"] = r.rep.probe_mask;
    j["rejoined"] = r.rep.rejoined_mask;
  }
  return j;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  CLI::App app{"reccl_adaptive_bench: the adaptive loop's scenarios against static splits, in one run"};
  app.add_option("--bytes", o.bytes, "message size (nccl-tests size, K/M/G)");
  app.add_option("--vts", o.vts, "VTs");
  app.add_option("--ctas-per-vt", o.ctas_per_vt, "CTAs per VT (0: the most that fit)");
  app.add_option("--chunk", o.chunk, "ring chunk bytes (0: the table's)");
  app.add_option("--loopback", o.loopback, "N loopback ranks on GPU 0 (0: NCCL when >= 2 GPUs)");
  app.add_option("--collectives", o.collectives, "timeline length");
  app.add_option("--throttle-at", o.throttle_at, "first throttled collective");
  app.add_option("--dead-at", o.dead_at, "first collective with the VT dead");
  app.add_option("--back-at", o.back_at, "first collective with the VT healthy again");
  app.add_option("--vt", o.vt, "the throttled / dead VT");
  app.add_option("--overhead-runs", o.overhead_runs, "interleaved pairs for the overhead");
  app.add_option("--stability-runs", o.stability_runs, "collectives of the long throttled run");
  app.add_option("--static-runs", o.static_runs, "collectives per static split");
  app.add_option("--probe-interval", o.probe_interval, "probe every K steps of a chain");
  app.add_option("--vt-timeout-ms", o.vt_timeout_ms, "VT deadline");
  app.add_option("--out", o.out, "output folder");
  app.add_flag("!--no-graph", o.graph, "skip the CUDA-graph timeline");
  app.add_flag("!--no-others", o.others, "skip reduce-scatter and all-gather");
  app.add_flag("--study", o.study, "also price the loop's parts (ablations; measurement only)");
  app.add_option("--study-bytes", o.study_bytes, "other sizes for the overhead pairs of --study");
  app.add_option("--min-factor", o.min_factor, "texcp: a VT keeps at least this fraction of its share per step");
  CLI11_PARSE(app, argc, argv);
  try {
    world w;
    int ndev = 0;
    CK(cudaGetDeviceCount(&ndev));
    w.loop = o.loopback > 0 || ndev < 2;
    w.n = w.loop ? std::max(2, o.loopback) : std::min(ndev, 8);
    reccl::nvlink_config cfg;
    cfg.lanes = 3;
    if (w.loop) {
      w.comms = reccl::nvlink_communicator::create_loopback(w.n, 0, cfg);
    } else {
      w.nccl.resize(w.n);
      std::vector<int> devs(w.n);
      std::iota(devs.begin(), devs.end(), 0);
      if (ncclCommInitAll(w.nccl.data(), w.n, devs.data()) != ncclSuccess) throw std::runtime_error("ncclCommInitAll");
      w.comms = reccl::nvlink_communicator::create_all(w.nccl, cfg);
    }
    std::uint64_t const bytes = parse_size(o.bytes);
    std::uint64_t most = bytes;
    if (o.study)
      for (auto const& sb : o.study_bytes) most = std::max(most, parse_size(sb));
    std::uint64_t const buf = most + (1u << 20);
    for (int r = 0; r < w.n; ++r) {
      CK(cudaSetDevice(w.dev(r)));
      cudaStream_t s;
      CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      w.streams.push_back(s);
      cudaEvent_t a, b;
      CK(cudaEventCreate(&a));
      CK(cudaEventCreate(&b));
      w.ev0.push_back(a);
      w.ev1.push_back(b);
      void *x, *y, *z;
      unsigned long long* d;
      CK(cudaMalloc(&x, buf));
      CK(cudaMalloc(&y, buf));
      CK(cudaMalloc(&z, buf));
      CK(cudaMalloc(&d, sizeof(*d)));
      CK(cudaMemset(d, 0, sizeof(*d)));
      w.in.push_back(x);
      w.out.push_back(y);
      w.exp.push_back(z);
      w.wrong_d.push_back(d);
    }
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    json J;
    J["bench"] = "adaptive";
    J["machine"] = {{"gpu", prop.name}, {"gpus", ndev}, {"ranks", w.n}, {"loopback", w.loop}};
    char const* commit = std::getenv("RECCL_COMMIT");
    J["commit"] = commit ? commit : "";
    std::time_t now = std::time(nullptr);
    char date[32];
    std::strftime(date, sizeof date, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    J["date"] = date;
    std::vector<std::string> table;
    auto say = [&](std::string const& s) {
      std::printf("%s\n", s.c_str());
      std::fflush(stdout);
      table.push_back(s);
    };
    char line[512];
    call ar{collective::all_reduce, dtype::bfloat16, bytes};
    int const n = w.n;

    using texcp_lane = reccl::adaptive_lane<reccl::allocator::texcp>;
    using fixed_lane = reccl::adaptive_lane<reccl::allocator::fixed>;
    using aimd_lane = reccl::adaptive_lane<reccl::allocator::aimd>;

    // ---- 1. healthy: the VT's measured rate
    prepare_data(w, ar);
    reccl::allocator::texcp tx{};
    tx.min_factor = reccl::q16(o.min_factor);
    auto lanes = texcp_lane::create_all(w.ptrs(), lane_options(o, 1), tx);
    reccl::adaptive_options const& lo = lanes[0].options();
    J["geometry"] = {{"vts", lo.vts}, {"ctas_per_vt", lo.ctas_per_vt}, {"ctas", lo.vts * lo.ctas_per_vt + 1},
                     {"chunk_bytes", lo.chunk_bytes}, {"vt_timeout_ms", o.vt_timeout_ms},
                     {"probe_interval", o.probe_interval}, {"alpha_ns_per_stall_q24", lanes[0].prior().alpha}};
    std::uint64_t e_h = lanes[0].epoch();
    std::vector<double> t_healthy;
    for (int k = 0; k < 12; ++k) {
      queue_one(w, ar, [&](int r) { launch_lane(lanes, w, ar, r); });
      t_healthy.push_back(finish(w));
    }
    check_lanes(w);
    if (take_wrong(w) != 0) throw std::runtime_error("healthy run: wrong results");
    auto smp = lanes[0].samples(e_h + 2, lanes[0].epoch());
    std::vector<double> rate;
    for (auto const& s : smp)
      if (s.ns[o.vt] > 0) rate.push_back(static_cast<double>(s.bytes[o.vt]) / static_cast<double>(s.ns[o.vt]) * 1e9);
    double const vt_rate = median(rate);  // bytes/s per rank and direction... per rank sent
    double const sends = n - 1;
    double const throttle_rate = vt_rate / sends / 4.0;
    std::snprintf(line, sizeof line, "healthy: %.1f us median (%.1f GB/s busbw); VT %d moves %.2f GB/s -> throttle to %.2f GB/s",
                  median(t_healthy), ar.busbw(n, median(t_healthy)), o.vt, vt_rate / 1e9, throttle_rate / 1e9);
    say(line);
    J["healthy"] = {{"us_median", median(t_healthy)}, {"vt_rate_Bps", vt_rate}, {"throttle_Bps", throttle_rate}};

    // ---- 2. overhead: plain kernels (equal split, no telemetry) vs the texcp lane, interleaved
    reccl::launch_options pl;  // the plain pipelined kernel with the lane's geometry
    pl.algo = reccl::algorithm::pipelined;
    pl.lane = 0;
    pl.vts = lo.vts;
    pl.ctas = lo.vts * lo.ctas_per_vt;
    pl.chunk_bytes = lo.chunk_bytes;
    // `count` interleaved rounds (after `warm` unrecorded ones) of: the plain kernel, `other`, and
    // `third` if given; the slower rank's time of each, per series
    auto rounds = [&](call const& k, int count, int warm, std::function<void(int)> const& other,
                      std::function<void(int)> const& third = {}) {
      std::vector<std::vector<double>> t(3);
      for (int j = 0; j < count + warm; ++j) {
        queue_one(w, k, [&](int r) {
          w.comms[r].all_reduce(w.in[r], w.out[r], k.count(n), k.t, redop::sum, w.streams[r], pl);
        });
        double const x = finish(w);
        queue_one(w, k, other);
        double const y = finish(w);
        double z = 0;
        if (third) {
          queue_one(w, k, third);
          z = finish(w);
        }
        if (j >= warm) t[0].push_back(x), t[1].push_back(y), t[2].push_back(z);
      }
      return t;
    };
    {
      std::function<void(int)> nccl;
      if (!w.loop)
        nccl = [&](int r) { ncclAllReduce(w.in[r], w.out[r], ar.count(n), ncclBfloat16, ncclSum, w.nccl[r], w.streams[r]); };
      auto t = rounds(ar, o.overhead_runs, 5, [&](int r) { launch_lane(lanes, w, ar, r); }, nccl);
      std::vector<double> const &tp = t[0], &ta = t[1], &tn = t[2];
      check_lanes(w);
      if (take_wrong(w) != 0) throw std::runtime_error("overhead run: wrong results");
      double const mp = median(tp), ma = median(ta), mn = median(tn);
      std::snprintf(line, sizeof line,
                    "overhead: plain %.1f us, texcp+telemetry %.1f us -> %+.2f%% (target <= +1%%; %d interleaved pairs)%s",
                    mp, ma, (ma / mp - 1) * 100, o.overhead_runs,
                    w.loop ? "" : (std::string("; NCCL ") + std::to_string(mn) + " us").c_str());
      say(line);
      J["overhead"] = {{"plain_us", mp}, {"adaptive_us", ma}, {"slowdown_pct", (ma / mp - 1) * 100}, {"pairs", o.overhead_runs},
                       {"nccl_us", w.loop ? json(nullptr) : json(mn)}, {"plain_all", tp}, {"adaptive_all", ta}};
    }

    // ---- 2b. where the overhead goes: the same interleaving with parts of the loop switched off
    if (o.study) {
      using none_lane = reccl::adaptive_lane<reccl::allocator::equal, reccl::telemetry::none>;
      using equal_stalls_lane = reccl::adaptive_lane<reccl::allocator::equal, reccl::telemetry::stalls>;
      enum class kind { texcp_stalls, texcp_frozen, equal_none, equal_stalls };
      struct variant {
        char const* name;
        std::uint32_t ablate;
        kind k;
      };
      std::vector<variant> const vs = {{"texcp+stalls", 0, kind::texcp_stalls},
                                       {"texcp+stalls, shares frozen (eta 0)", 0, kind::texcp_frozen},
                                       {"no control step", 1, kind::texcp_stalls},
                                       {"no step, no verdict", 3, kind::texcp_stalls},
                                       {"no step, no verdict, host split", 7, kind::texcp_stalls},
                                       {"equal+stalls", 0, kind::equal_stalls},
                                       {"equal+none", 0, kind::equal_none},
                                       {"equal+none, all off", 7, kind::equal_none},
                                       {"data phase only", 15, kind::equal_none},
                                       {"data phase only, no prologue loads", 31, kind::equal_none}};
      json st = json::array();
      for (auto const& vr : vs) {
        reccl::adaptive_options ao = lane_options(o, 1);
        ao.ablate = vr.ablate;
        std::vector<std::vector<double>> t;
        double span = 0, ctl_end = 0;  // medians: data phase span (us), control CTA done after the last data CTA (us)
        auto measure = [&](auto& L) {
          std::uint64_t const e_from = L[0].epoch();
          t = rounds(ar, o.overhead_runs / 2, 3, [&](int r) { launch_lane(L, w, ar, r); });
          std::vector<double> sp, ce;
          for (auto const& x : L[0].samples(e_from + 2, L[0].epoch())) {
            std::uint64_t m = 0;
            for (int v = 0; v < x.n_vts; ++v) m = std::max<std::uint64_t>(m, x.ns[v]);
            if (m == 0) continue;
            sp.push_back(static_cast<double>(m) / 1e3);
            ce.push_back(static_cast<double>(x.tail_ns[2]) / 1e3);
          }
          if (!sp.empty()) span = median(sp), ctl_end = median(ce);
        };
        if (vr.k == kind::equal_none) {
          auto L = none_lane::create_all(w.ptrs(), ao);
          measure(L);
        } else if (vr.k == kind::equal_stalls) {
          auto L = equal_stalls_lane::create_all(w.ptrs(), ao);
          measure(L);
        } else {
          reccl::allocator::texcp frozen = tx;
          frozen.eta = 0;
          frozen.epsilon = 0;
          auto L = texcp_lane::create_all(w.ptrs(), ao, vr.k == kind::texcp_frozen ? frozen : tx);
          measure(L);
        }
        std::vector<double> const &tp = t[0], &ta = t[1];
        check_lanes(w);
        if (take_wrong(w) != 0) throw std::runtime_error(std::string("study ") + vr.name + ": wrong results");
        double const mp = median(tp), ma = median(ta);
        std::snprintf(line, sizeof line, "  study %-36s plain %.1f us, this %.1f us: %+.2f%%  (data span %.1f us, control CTA done %+.1f us)",
                      vr.name, mp, ma, (ma / mp - 1) * 100, span, ctl_end);
        say(line);
        st.push_back({{"variant", vr.name}, {"plain_us", mp}, {"us", ma}, {"slowdown_pct", (ma / mp - 1) * 100},
                      {"data_span_us", span}, {"control_done_after_last_data_us", ctl_end}});
      }
      // the same pairs at other sizes: what the loop's fixed cost per collective is
      for (auto const& sb : o.study_bytes) {
        call k{collective::all_reduce, dtype::bfloat16, parse_size(sb)};
        prepare_data(w, k);
        auto L = texcp_lane::create_all(w.ptrs(), lane_options(o, 1), tx);
        auto t = rounds(k, o.overhead_runs / 2, 3, [&](int r) { launch_lane(L, w, k, r); });
        std::vector<double> const &tp = t[0], &ta = t[1];
        check_lanes(w);
        if (take_wrong(w) != 0) throw std::runtime_error("study size: wrong results");
        double const mp = median(tp), ma = median(ta);
        std::snprintf(line, sizeof line, "  study %-34s plain %.1f us, texcp %.1f us: %+.2f%% (%+.1f us)", sb.c_str(), mp, ma,
                      (ma / mp - 1) * 100, ma - mp);
        say(line);
        st.push_back({{"variant", "texcp+stalls"}, {"bytes", k.bytes}, {"plain_us", mp}, {"us", ma}, {"slowdown_pct", (ma / mp - 1) * 100}});
      }
      prepare_data(w, ar);
      J["overhead_study"] = st;
    }

    // ---- 3. references under the throttle: static splits; healthy with the VT masked
    double best_static = 0, equal_static = 0, best_s = 0, masked7 = 0;
    {
      json sweep = json::array();
      for (double s : {1.0 / o.vts, 1.0 / (1.5 * o.vts), 1.0 / (2.0 * o.vts), 1.0 / (3.0 * o.vts), 1.0 / (4.0 * o.vts),
                       1.0 / (6.0 * o.vts), 1.0 / (8.0 * o.vts)}) {
        reccl::adaptive_options fo = lane_options(o, 1);
        fo.initial = static_shares(o.vts, o.vt, s);
        auto fl = fixed_lane::create_all(w.ptrs(), fo);
        reccl::device_faults f;
        f.throttle(o.vt, throttle_rate, 0);
        for (int r = 0; r < n; ++r) fl[r].inject(f, w.streams[r]);
        std::vector<double> t;
        for (int k = 0; k < o.static_runs; ++k) {
          queue_one(w, ar, [&](int r) { launch_lane(fl, w, ar, r); });
          t.push_back(finish(w));
        }
        check_lanes(w);
        if (take_wrong(w) != 0) throw std::runtime_error("static sweep: wrong results");
        double const m = median(t);
        sweep.push_back({{"share", s}, {"us", m}});
        if (s == 1.0 / o.vts) equal_static = m;
        if (best_static == 0 || m < best_static) best_static = m, best_s = s;
        reccl::device_faults none;
        for (int r = 0; r < n; ++r) fl[r].inject(none, w.streams[r]);
      }
      reccl::adaptive_options fo = lane_options(o, 1);
      fo.initial = static_shares(o.vts, o.vt, 0);
      auto fl = fixed_lane::create_all(w.ptrs(), fo);
      std::vector<double> t;
      for (int k = 0; k < o.static_runs; ++k) {
        queue_one(w, ar, [&](int r) { launch_lane(fl, w, ar, r); });
        t.push_back(finish(w));
      }
      check_lanes(w);
      if (take_wrong(w) != 0) throw std::runtime_error("masked reference: wrong results");
      masked7 = median(t);
      std::snprintf(line, sizeof line,
                    "references: throttled VT %d: equal split %.1f us, best static %.1f us (its share %.4f); healthy with VT %d masked %.1f us",
                    o.vt, equal_static, best_static, best_s, o.vt, masked7);
      say(line);
      J["references"] = {{"equal_throttled_us", equal_static}, {"best_static_us", best_static}, {"best_static_share", best_s},
                         {"masked_healthy_us", masked7}, {"sweep", sweep}};
    }

    // ---- 4. timelines
    auto faults_for = [&](std::uint64_t e0) {
      reccl::device_faults f;
      f.throttle(o.vt, throttle_rate, e0 + o.throttle_at, e0 + o.dead_at).kill(o.vt, e0 + o.dead_at, e0 + o.back_at);
      return f;
    };
    struct refs {
      double best_static, equal_static, masked7, healthy;
    };
    auto summarize = [&](char const* name, std::vector<step_row> const& rows, refs const& rf, json& out) {
      double const best_static = rf.best_static, equal_static = rf.equal_static, masked7 = rf.masked7;
      double const healthy_us = rf.healthy;
      auto bw = [&](int i) { return rows[i].us; };
      // throttle: first collective >= 0.9x best static
      int first_ok = -1;
      for (int i = o.throttle_at; i < o.dead_at; ++i)
        if (best_static / bw(i) >= 0.9) {
          first_ok = i - o.throttle_at;
          break;
        }
      std::vector<double> steady_thr, steady_dead, steady_back;
      for (int i = o.throttle_at + 5; i < o.dead_at; ++i) steady_thr.push_back(rows[i].us);
      for (int i = o.dead_at + 5; i < o.back_at; ++i) steady_dead.push_back(rows[i].us);
      for (int i = o.back_at + 12; i < static_cast<int>(rows.size()); ++i) steady_back.push_back(rows[i].us);
      int back_in = -1;
      for (int i = o.back_at; i < static_cast<int>(rows.size()); ++i)
        if (rows[i].have_rep && ((rows[i].rep.split.live_mask >> o.vt) & 1u) && rows[i].rep.split.count[o.vt] > 0) {
          back_in = i - o.back_at;
          break;
        }
      double const at5 = o.throttle_at + 5 < o.dead_at ? best_static / rows[o.throttle_at + 4].us : 0;
      out = {{"first_within_0.9_of_best_static", first_ok},
             {"ratio_to_best_static_at_5th", at5},
             {"throttled_steady_us", median(steady_thr)},
             {"ratio_steady_to_best_static", best_static / median(steady_thr)},
             {"ratio_steady_to_equal", equal_static / median(steady_thr)},
             {"faulting_collective_us", rows[o.dead_at].us},
             {"dead_steady_us", median(steady_dead)},
             {"ratio_dead_steady_to_masked_healthy", masked7 / median(steady_dead)},
             {"back_in_split_after", back_in},
             {"back_steady_us", median(steady_back)},
             {"ratio_back_to_healthy", healthy_us / median(steady_back)}};
      std::snprintf(line, sizeof line,
                    "%s: throttle: >=0.9x best static after %d collectives (5th: %.2fx), steady %.2fx best static, %.2fx "
                    "equal | dead: faulting collective %.0f us, steady %.2fx masked-healthy | back in split after %d, "
                    "%.2fx healthy",
                    name, first_ok, at5, best_static / median(steady_thr), equal_static / median(steady_thr),
                    rows[o.dead_at].us, masked7 / median(steady_dead), back_in, healthy_us / median(steady_back));
      say(line);
    };
    std::vector<reccl::device::adaptive::vt_sample> all_samples;
    {
      auto tl = texcp_lane::create_all(w.ptrs(), lane_options(o, 1), tx);
      std::uint64_t const e0 = tl[0].epoch();
      auto f = faults_for(e0);
      for (int r = 0; r < n; ++r) tl[r].inject(f, w.streams[r]);
      std::vector<double> us;
      unsigned long long wrong = 0;
      json fits = json::array();
      for (int k = 0; k < o.collectives + 1; ++k) {  // +1: the last report appears one collective later
        queue_one(w, ar, [&](int r) { launch_lane(tl, w, ar, r); });
        double const t = finish(w);
        if (k < o.collectives) us.push_back(t);
        wrong += take_wrong(w);
        if (k == o.throttle_at + 10) {
          // refit the cost model on what the timeline measured so far; every rank installs it at the
          // same point of its stream, applying from 4 collectives ahead
          reccl::telemetry::cost_model<1024> cm;
          for (auto const& s : tl[0].samples(e0, tl[0].epoch()))
            for (int v = 0; v < s.n_vts; ++v)
              if (s.ns[v] > 0 && !((s.fault_mask >> v) & 1u)) cm.add(s.stalls[v], s.bytes[v], static_cast<double>(s.ns[v]));
          reccl::telemetry::cost_fit const fit = cm.fit();
          if (fit.ok && fit.alpha_identified && fit.beta_identified && fit.r2 > 0.5) {
            reccl::telemetry::cost_model_q const q = reccl::telemetry::quantize(fit, 0);
            std::uint64_t const from = tl[0].epoch() + 4;
            for (int r = 0; r < n; ++r) tl[r].set_model(q, from, w.streams[r]);
            fits.push_back({{"at", k}, {"from_epoch", from - e0}, {"alpha_ns", fit.alpha}, {"beta_ns_per_B", fit.beta},
                            {"delta_ns", fit.delta}, {"r2", fit.r2}, {"installed", true}});
          } else {
            fits.push_back({{"at", k}, {"r2", fit.r2}, {"installed", false}});
          }
        }
      }
      check_lanes(w);
      auto rows = collect(tl, e0, us, ar, n);
      json out;
      summarize("all_reduce eager", rows, refs{best_static, equal_static, masked7, median(t_healthy)}, out);
      out["wrong_elements"] = wrong;
      out["errors"] = tl[0].error_info();
      out["model_fits"] = fits;
      {
        // where the end of a collective goes (after this rank's last data CTA, healthy collectives)
        char const* names[3] = {"verdict seen", "closed", "control CTA done"};
        auto sm = tl[0].samples(e0 + 2, e0 + std::min(o.throttle_at, o.collectives));
        json tail = json::object();
        std::string tl_line = "tail of a healthy collective (us after the last data CTA's data phase):";
        for (int i = 0; i < 3; ++i) {
          std::vector<double> d;
          for (auto const& x : sm) d.push_back(static_cast<double>(x.tail_ns[i]) / 1e3);
          tail[names[i]] = median(d);
          char b[64];
          std::snprintf(b, sizeof b, " %s %.2f", names[i], median(d));
          tl_line += b;
        }
        out["tail_us"] = tail;
        say(tl_line);
      }
      {
        auto sn = tl[0].step_ns(e0, e0 + o.collectives);
        std::vector<double> d(sn.begin(), sn.end());
        out["control_step_us_median"] = median(d) / 1e3;
        std::snprintf(line, sizeof line, "control CTA: the step takes %.1f us (median over the timeline), beside a %.1f us collective",
                      median(d) / 1e3, median(t_healthy));
        say(line);
      }
      json jr = json::array();
      for (auto const& r : rows) jr.push_back(row_json(r, o.vts));
      out["rows"] = jr;
      J["timeline"]["all_reduce"] = out;
      auto s = tl[0].samples(e0, tl[0].epoch());
      all_samples.insert(all_samples.end(), s.begin(), s.end());
      // CSV of this run
      std::ofstream csv(o.out + "/timeline.csv");
      csv << "collective,us,busbw_GBps,masked,fault,probe,rejoined";
      for (int v = 0; v < o.vts; ++v) csv << ",share" << v;
      for (int v = 0; v < o.vts; ++v) csv << ",stalls" << v;
      csv << "\n";
      for (auto const& r : rows) {
        csv << r.epoch << "," << r.us << "," << r.busbw << "," << r.rep.masked_mask << "," << r.rep.fault_mask << ","
            << r.rep.probe_mask << "," << r.rep.rejoined_mask;
        for (int v = 0; v < o.vts; ++v)
          csv << "," << (r.have_rep ? static_cast<double>(r.rep.split.count[v]) / static_cast<double>(r.rep.split.total) : 0.0);
        for (int v = 0; v < o.vts; ++v) csv << "," << r.rep.stalls[v];
        csv << "\n";
      }
      std::snprintf(line, sizeof line, "all_reduce eager: %llu wrong elements over %d collectives, lane errors: %u",
                    wrong, o.collectives, tl[0].error_info());
      say(line);
    }
    if (o.graph) {
      // the same timeline captured once in a CUDA graph and replayed: the split adapts, the dead VT
      // is recovered, the results are checked by compare kernels captured after each collective
      auto tl = texcp_lane::create_all(w.ptrs(), lane_options(o, 2), tx);
      std::uint64_t const e0 = tl[0].epoch();
      auto f = faults_for(e0);
      int const N = o.collectives;
      std::vector<std::vector<cudaEvent_t>> evs(n, std::vector<cudaEvent_t>(N + 1));
      std::vector<cudaGraphExec_t> execs(n);
      for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(w.dev(r)));
        tl[r].inject(f, w.streams[r]);
        for (auto& e : evs[r]) CK(cudaEventCreate(&e));
        CK(cudaStreamSynchronize(w.streams[r]));
        cudaGraph_t g;
        CK(cudaStreamBeginCapture(w.streams[r], cudaStreamCaptureModeThreadLocal));
        CK(cudaEventRecordWithFlags(evs[r][0], w.streams[r], cudaEventRecordExternal));
        for (int k = 0; k < N; ++k) {
          launch_lane(tl, w, ar, r);
          CK(cudaEventRecordWithFlags(evs[r][k + 1], w.streams[r], cudaEventRecordExternal));
          reccl::bench::dispatch_dtype(ar.t, [&]<class T>() {
            reccl::bench::diff_kernel<T><<<1024, 256, 0, w.streams[r]>>>(
                static_cast<reccl::device::bits_t<T> const*>(w.out[r]), static_cast<reccl::device::bits_t<T> const*>(w.exp[r]),
                ar.out_elems(n), w.wrong_d[r]);
          });
        }
        CK(cudaStreamEndCapture(w.streams[r], &g));
        CK(cudaGraphInstantiate(&execs[r], g, 0));
        CK(cudaGraphDestroy(g));
      }
      for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(w.dev(r)));
        CK(cudaGraphLaunch(execs[r], w.streams[r]));
      }
      for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(w.dev(r)));
        CK(cudaStreamSynchronize(w.streams[r]));
      }
      check_lanes(w);
      // one more eager collective so the last report is written
      queue_one(w, ar, [&](int r) { launch_lane(tl, w, ar, r); });
      finish(w);
      unsigned long long const wrong = take_wrong(w);
      std::vector<double> us(N, 0);
      for (int k = 0; k < N; ++k)
        for (int r = 0; r < n; ++r) {
          float ms = 0;
          CK(cudaEventElapsedTime(&ms, evs[r][k], evs[r][k + 1]));
          us[k] = std::max(us[k], static_cast<double>(ms) * 1e3);  // includes the compare kernel
        }
      auto rows = collect(tl, e0, us, ar, n);
      json out;
      summarize("all_reduce graph (times include a compare kernel)", rows,
                refs{best_static, equal_static, masked7, median(t_healthy)}, out);
      out["wrong_elements"] = wrong;
      out["errors"] = tl[0].error_info();
      out["epochs_run"] = tl[0].epoch() - e0;
      json jr = json::array();
      for (auto const& r : rows) jr.push_back(row_json(r, o.vts));
      out["rows"] = jr;
      J["timeline"]["all_reduce_graph"] = out;
      std::snprintf(line, sizeof line, "all_reduce graph: %d collectives in one graph, %llu wrong elements, lane errors %u, no recapture",
                    N, wrong, tl[0].error_info());
      say(line);
      for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(w.dev(r)));
        CK(cudaGraphExecDestroy(execs[r]));
        for (auto& e : evs[r]) CK(cudaEventDestroy(e));
      }
    }
    if (o.others) {
      for (collective c : {collective::reduce_scatter, collective::all_gather}) {
        call k{c, dtype::bfloat16, bytes};
        prepare_data(w, k);
        // this collective's own references: best static and masked-healthy under the same throttle
        double bs = 0, eq = 0, m7 = 0, hu = 0;
        for (double s : {1.0 / o.vts, 1.0 / (2.0 * o.vts), 1.0 / (4.0 * o.vts), 1.0 / (8.0 * o.vts), 0.0, -1.0}) {
          reccl::adaptive_options fo = lane_options(o, 1);
          fo.initial = static_shares(o.vts, o.vt, s < 0 ? 1.0 / o.vts : s);
          auto fl = fixed_lane::create_all(w.ptrs(), fo);
          reccl::device_faults f;
          if (s > 0) f.throttle(o.vt, throttle_rate, 0);
          for (int r = 0; r < n; ++r) fl[r].inject(f, w.streams[r]);
          std::vector<double> t;
          for (int j = 0; j < o.static_runs; ++j) {
            queue_one(w, k, [&](int r) { launch_lane(fl, w, k, r); });
            t.push_back(finish(w));
          }
          if (take_wrong(w) != 0) throw std::runtime_error("static reference: wrong results");
          double const m = median(t);
          if (s == 0) m7 = m;
          else if (s < 0) hu = m;
          else {
            if (s == 1.0 / o.vts) eq = m;
            if (bs == 0 || m < bs) bs = m;
          }
          reccl::device_faults none;
          for (int r = 0; r < n; ++r) fl[r].inject(none, w.streams[r]);
        }
        auto tl = texcp_lane::create_all(w.ptrs(), lane_options(o, 1), tx);
        std::uint64_t const e0 = tl[0].epoch();
        auto f = faults_for(e0);
        for (int r = 0; r < n; ++r) tl[r].inject(f, w.streams[r]);
        std::vector<double> us;
        unsigned long long wrong = 0;
        for (int j = 0; j < o.collectives + 1; ++j) {
          queue_one(w, k, [&](int r) { launch_lane(tl, w, k, r); });
          double const t = finish(w);
          if (j < o.collectives) us.push_back(t);
          wrong += take_wrong(w);
        }
        check_lanes(w);
        auto rows = collect(tl, e0, us, k, n);
        json out;
        summarize(std::string(reccl::name(c)).c_str(), rows, refs{bs, eq, m7, hu}, out);
        out["wrong_elements"] = wrong;
        out["references"] = {{"best_static_us", bs}, {"equal_throttled_us", eq}, {"masked_healthy_us", m7}, {"healthy_us", hu}};
        json jr = json::array();
        for (auto const& r : rows) jr.push_back(row_json(r, o.vts));
        out["rows"] = jr;
        J["timeline"][std::string(reccl::name(c))] = out;
        std::snprintf(line, sizeof line, "%s: %llu wrong elements", std::string(reccl::name(c)).c_str(), wrong);
        say(line);
      }
      prepare_data(w, ar);
    }

    // ---- 5. stability: texcp against AIMD under a steady throttle
    {
      auto run = [&](auto& lanes2, char const* name) {
        std::uint64_t const e0 = lanes2[0].epoch();
        reccl::device_faults f;
        f.throttle(o.vt, throttle_rate, e0);
        for (int r = 0; r < n; ++r) lanes2[r].inject(f, w.streams[r]);
        std::vector<double> us;
        for (int k = 0; k < o.stability_runs + 1; ++k) {
          queue_one(w, ar, [&](int r) { launch_lane(lanes2, w, ar, r); });
          us.push_back(finish(w));
        }
        check_lanes(w);
        if (take_wrong(w) != 0) throw std::runtime_error("stability run: wrong results");
        auto reps = lanes2[0].reports(e0 + o.stability_runs - 20, e0 + o.stability_runs);
        std::vector<double> sh;
        for (auto const& r : reps) sh.push_back(static_cast<double>(r.share[o.vt]) / reccl::share_one);
        double const mean = std::accumulate(sh.begin(), sh.end(), 0.0) / std::max<std::size_t>(1, sh.size());
        double var = 0;
        for (double x : sh) var += (x - mean) * (x - mean);
        double const sd = sh.empty() ? 0 : std::sqrt(var / sh.size());
        std::vector<double> last(us.end() - 21, us.end() - 1);
        std::snprintf(line, sizeof line, "stability %s: throttled VT share over the last 20: mean %.4f, std/mean %.1f%%, time %.1f us (%.2fx best static)",
                      name, mean, mean > 0 ? sd / mean * 100 : 0, median(last), best_static / median(last));
        say(line);
        J["stability"][name] = {{"share_mean", mean}, {"share_cv_pct", mean > 0 ? sd / mean * 100 : 0}, {"shares", sh},
                                {"us_median", median(last)}};
      };
      auto tl = texcp_lane::create_all(w.ptrs(), lane_options(o, 1), tx);
      run(tl, "texcp");
      auto al = aimd_lane::create_all(w.ptrs(), lane_options(o, 1));
      run(al, "aimd");
    }

    // ---- 6. cost model fit over the eager timeline's samples
    {
      reccl::telemetry::cost_model<1024> cm;
      for (auto const& s : all_samples)
        for (int v = 0; v < s.n_vts; ++v)
          if (s.ns[v] > 0 && !((s.fault_mask >> v) & 1u)) cm.add(s.stalls[v], s.bytes[v], static_cast<double>(s.ns[v]));
      reccl::telemetry::cost_fit const fit = cm.fit();
      std::snprintf(line, sizeof line,
                    "cost model T = a*stalls + b*bytes + d over %d VT samples: a = %.1f ns/stall, b = %.4f ns/B (%.1f GB/s), d = %.0f ns, R^2 = %.3f",
                    fit.samples, fit.alpha, fit.beta, fit.beta > 0 ? 1 / fit.beta : 0.0, fit.delta, fit.r2);
      say(line);
      J["cost_model"] = {{"samples", fit.samples}, {"alpha_ns", fit.alpha}, {"beta_ns_per_B", fit.beta}, {"delta_ns", fit.delta},
                         {"r2", fit.r2}, {"alpha_identified", fit.alpha_identified}, {"beta_identified", fit.beta_identified}};
    }

    J["summary"] = table;
    std::ofstream(o.out + "/adaptive.json") << J.dump(1) << "\n";
    std::printf("\n======== reccl_adaptive_bench summary (%s, %d ranks%s, %s) ========\n", prop.name, n,
                w.loop ? " loopback on one GPU" : "", o.bytes.c_str());
    for (auto const& s : table) std::printf("%s\n", s.c_str());
    w.comms.clear();
    for (auto c : w.nccl) ncclCommDestroy(c);
    return 0;
  } catch (std::exception const& e) {
    std::fprintf(stderr, "reccl_adaptive_bench: %s\n", e.what());
    return 1;
  }
}
