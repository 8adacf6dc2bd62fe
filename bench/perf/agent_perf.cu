// reccl_agent_perf -- the schedule agent (collective_op<all_reduce, bf16, Schedule, transport::p2p>)
// on loopback ranks of one GPU, next to the NVLink fast path's all-reduce (runtime API, automatic
// algorithm, plain buffers) on the same GPU in the same run. Timed inside CUDA graphs: per rank one
// graph of `iters` calls on its own stream, every rank's graph launched together; the median of
// `reps` replays (graph_timing.hpp). Every configuration is checked once before it is timed (sums of
// k/16 values, exact in bf16 in any order).
//
// Loopback peers share one GPU's memory, so the figures say what the agent's protocol and data
// movement cost, not what a link gives: an A/B of two builds of the agent (bench/NOTES.md).
//
//   reccl_agent_perf --ranks 2 --bytes 65536,1048576,16777216,67108864 --reps 10 --json out.json
//   RECCL_DTYPES=bfloat16 keeps the build to the bf16 kernels
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/perf/bf16_words.hpp"
#include "bench/perf/graph_timing.hpp"
#include "examples/common/check.hpp"
#include "reccl/host/communicator.hpp"
#include "reccl/host/p2p_collective.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "reccl/policy/schedule/one_shot.hpp"
#include "reccl/policy/schedule/ring.hpp"
#include "reccl/policy/schedule/tree.hpp"
#include "reccl/policy/schedule/two_shot.hpp"
#include "reccl/policy/telemetry/none.hpp"

namespace {

using bf16 = __nv_bfloat16;
template <class S>
using agent_all_reduce = reccl::all_reduce<bf16, S, reccl::transport::p2p, reccl::telemetry::none, reccl::allocator::equal>;

int iters_for(std::size_t bytes) { return static_cast<int>(std::clamp<std::size_t>((64u << 20) / std::max<std::size_t>(bytes, 1), 2, 50)); }

/// Per-rank inputs (random k/16 words) and outputs of `bytes`, uploaded and poisoned.
struct buffers {
  std::vector<bf16*> in, out;
  std::vector<std::vector<std::uint32_t>> host;
  std::size_t words;
  buffers(int n, std::size_t bytes, std::mt19937_64& g) : in(n), out(n), host(n), words(bytes / 4) {
    for (int r = 0; r < n; ++r) {
      host[r] = reccl_bench::random_bf16_words(g, words);
      CK(cudaMalloc(&in[r], bytes));
      CK(cudaMalloc(&out[r], bytes));
      CK(cudaMemcpy(in[r], host[r].data(), bytes, cudaMemcpyHostToDevice));
    }
  }
  ~buffers() {
    for (std::size_t r = 0; r < in.size(); ++r) {
      (void)cudaFree(in[r]);
      (void)cudaFree(out[r]);
    }
  }
  void poison() {
    for (auto* p : out) CK(cudaMemset(p, 0xff, words * 4));
    CK(cudaDeviceSynchronize());
  }
  long wrong() const {
    long bad = 0;
    std::vector<std::uint32_t> got(words);
    for (auto* p : out) {
      CK(cudaMemcpy(got.data(), p, words * 4, cudaMemcpyDeviceToHost));
      bad += reccl_bench::wrong_sums(host, got.data(), words);
    }
    return bad;
  }
};

/// Checks `issue` once on poisoned outputs, then times it; median us per call, or -1 if wrong.
template <class Issue>
double check_and_time(buffers& b, std::vector<cudaStream_t> const& st, std::size_t bytes, int reps, Issue&& issue, long& wrong) {
  b.poison();
  for (std::size_t r = 0; r < st.size(); ++r) issue(static_cast<int>(r));
  for (auto s : st) CK(cudaStreamSynchronize(s));
  wrong = b.wrong();
  int const iters = iters_for(bytes);
  auto exec = reccl_bench::capture_per_rank(st, iters, issue);
  return reccl_bench::time_graphs(st, exec, iters, reps);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"the schedule agent's all-reduce on loopback ranks, next to the NVLink fast path's"};
  int ranks = 2, reps = 10, vts = 4, ctas_per_vt = 2;
  std::vector<std::size_t> sizes{65536, 1u << 20, 16u << 20, 64u << 20};
  std::vector<std::string> scheds{"ring", "one_shot", "two_shot", "tree"};
  std::string json_path;
  app.add_option("--ranks", ranks, "loopback ranks")->check(CLI::Range(2, 8));
  app.add_option("--bytes", sizes, "message sizes (bytes per rank, multiples of 4)")->delimiter(',');
  app.add_option("--schedules", scheds, "ring, one_shot, two_shot, tree")->delimiter(',');
  app.add_option("--vts", vts, "VTs of the agent's split");
  app.add_option("--ctas-per-vt", ctas_per_vt, "CTAs per VT");
  app.add_option("--reps", reps, "timed replays per configuration (median)");
  app.add_option("--json", json_path, "write the results here");
  CLI11_PARSE(app, argc, argv);

  reccl::p2p_config pc;
  pc.plan_max_ctas = std::max(16, vts * ctas_per_vt);
  auto agents = reccl::p2p_communicator::create_loopback(ranks, 0, pc);
  auto fast = reccl::nvlink_communicator::create_loopback(ranks, 0);
  std::vector<cudaStream_t> st(ranks);
  for (auto& s : st) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::mt19937_64 g(20261205);
  nlohmann::json out{{"tool", "reccl_agent_perf"}, {"ranks", ranks}, {"vts", vts}, {"ctas_per_vt", ctas_per_vt}, {"reps", reps},
                     {"results", nlohmann::json::array()}};
  std::printf("%-10s %12s %12s %10s %7s\n", "path", "bytes", "us", "GB/s", "wrong");
  reccl::gpu_call_options o;
  o.n_vts = vts;
  o.ctas_per_vt = ctas_per_vt;
  auto report = [&](std::string const& path, std::size_t bytes, double us, long wrong) {
    double const gbs = static_cast<double>(bytes) / (us * 1e3);  // algorithm bandwidth, bytes per rank
    std::printf("%-10s %12zu %12.2f %10.1f %7ld\n", path.c_str(), bytes, us, gbs, wrong);
    out["results"].push_back({{"path", path}, {"bytes", bytes}, {"median_us", us}, {"algbw_GBps", gbs}, {"wrong", wrong}});
  };
  for (std::size_t bytes : sizes) {
    buffers b(ranks, bytes, g);
    std::uint64_t const count = bytes / sizeof(bf16);
    long wrong = 0;
    double const us_fast = check_and_time(b, st, bytes, reps, [&](int r) {
      fast[r].all_reduce(b.in[r], b.out[r], count, reccl::dtype::bfloat16, reccl::redop::sum, st[r]);
    }, wrong);
    report("nvlink", bytes, us_fast, wrong);
    for (auto const& name : scheds) {
      auto run = [&]<class S>() {
        double const us = check_and_time(b, st, bytes, reps, [&](int r) {
          agent_all_reduce<S>::run(agents[r], b.in[r], b.out[r], count, reccl::redop::sum, st[r], o);
        }, wrong);
        report("agent/" + name, bytes, us, wrong);
      };
      if (name == "ring") run.template operator()<reccl::schedule::ring>();
      else if (name == "one_shot") run.template operator()<reccl::schedule::one_shot>();
      else if (name == "two_shot") run.template operator()<reccl::schedule::two_shot>();
      else if (name == "tree") run.template operator()<reccl::schedule::tree>();
      else std::fprintf(stderr, "unknown schedule %s\n", name.c_str());
    }
    for (auto& a : agents) a.check();
    for (auto& f : fast) f.check();
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}
