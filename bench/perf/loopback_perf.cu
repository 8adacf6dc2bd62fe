// reccl_loopback_perf -- the NVLink path's collectives on loopback ranks of one GPU, timed inside
// CUDA graphs: per rank one graph of `iters` calls captured on its own stream, every rank's graph
// launched together, wall time between two events, divided by `iters`; the median of `reps`
// replays per configuration. Plain (cudaMalloc) and registered (allocate_all) buffers.
//
// It measures what the kernels and their protocol cost on one GPU (no link: loopback peers share
// HBM), which is what an A/B comparison of two builds needs: run two binaries interleaved
// (bench/gpu.sh ab) and compare the medians.
//
//   reccl_loopback_perf --ranks 2 --bytes 4096,262144,4194304 --reps 20 --json out.json
//   reccl_loopback_perf --colls all_reduce --bytes 1024,4096 --ctas 0,1,2,4 --algo one_shot --pdl 0
//     (a CTA sweep of one algorithm, launched with or without programmatic dependent launch)
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/perf/graph_timing.hpp"
#include "examples/common/check.hpp"
#include "reccl/host/communicator.hpp"

namespace {

struct config {
  reccl::collective coll;
  std::size_t bytes;  ///< of each rank's input (all-gather: per rank; reduce-scatter/all-to-all: whole)
  bool registered;
  reccl::launch_options launch{};  ///< algorithm and CTA count (0: the tuning table's)
};

/// Calls per graph: enough to hide the launch at small sizes, few at large ones.
int iters_for(std::size_t bytes) { return static_cast<int>(std::clamp<std::size_t>((64u << 20) / std::max<std::size_t>(bytes, 1), 2, 100)); }

double run_one(std::vector<reccl::nvlink_communicator>& comms, config const& c, int reps, std::vector<double>& all_us) {
  int const n = static_cast<int>(comms.size());
  std::size_t const elems_in = c.bytes / sizeof(__nv_bfloat16);
  bool const per_peer = c.coll == reccl::collective::reduce_scatter || c.coll == reccl::collective::all_to_all;
  std::size_t const count = per_peer ? elems_in / static_cast<std::size_t>(n) : elems_in;
  std::size_t const out_elems = c.coll == reccl::collective::all_gather ? count * n
                                : c.coll == reccl::collective::reduce_scatter ? count
                                : c.coll == reccl::collective::all_to_all ? count * n
                                                                          : count;
  std::size_t const in_b = (per_peer ? count * n : count) * sizeof(__nv_bfloat16), out_b = out_elems * sizeof(__nv_bfloat16);
  std::vector<void*> in(n), out(n);
  std::vector<cudaStream_t> st(n);
  std::vector<reccl::nvlink_communicator*> group;
  for (auto& cm : comms) group.push_back(&cm);
  if (c.registered) {
    in = reccl::nvlink_communicator::allocate_all(group, in_b);
    out = reccl::nvlink_communicator::allocate_all(group, out_b);
  } else {
    for (int r = 0; r < n; ++r) {
      CK(cudaMalloc(&in[r], in_b));
      CK(cudaMalloc(&out[r], out_b));
    }
  }
  for (int r = 0; r < n; ++r) {
    CK(cudaMemset(in[r], 0x3c, in_b));  // bf16 1.0-ish, finite
    CK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
  }
  auto issue = [&](int r) {
    auto& cm = comms[static_cast<std::size_t>(r)];
    switch (c.coll) {
      case reccl::collective::all_reduce: cm.all_reduce(in[r], out[r], count, reccl::dtype::bfloat16, reccl::redop::sum, st[r], c.launch); break;
      case reccl::collective::reduce_scatter: cm.reduce_scatter(in[r], out[r], count, reccl::dtype::bfloat16, reccl::redop::sum, st[r], c.launch); break;
      case reccl::collective::all_gather: cm.all_gather(in[r], out[r], count, reccl::dtype::bfloat16, st[r], c.launch); break;
      case reccl::collective::broadcast: cm.broadcast(in[r], out[r], count, reccl::dtype::bfloat16, 0, st[r], c.launch); break;
      case reccl::collective::all_to_all: cm.all_to_all(in[r], out[r], count, reccl::dtype::bfloat16, st[r], c.launch); break;
    }
  };
  int const iters = iters_for(c.bytes);
  for (int w = 0; w < 3; ++w)
    for (int r = 0; r < n; ++r) issue(r);
  CK(cudaDeviceSynchronize());
  std::vector<cudaGraphExec_t> exec = reccl_bench::capture_per_rank(st, iters, issue);
  all_us = reccl_bench::replay_graphs(st, exec, iters, reps);
  for (auto& cm : comms) cm.check();
  for (int r = 0; r < n; ++r) {
    CK(cudaGraphExecDestroy(exec[r]));
    CK(cudaStreamDestroy(st[r]));
    if (c.registered) {
      comms[static_cast<std::size_t>(r)].free(in[r]);
      comms[static_cast<std::size_t>(r)].free(out[r]);
    } else {
      CK(cudaFree(in[r]));
      CK(cudaFree(out[r]));
    }
  }
  return reccl_bench::median_of(all_us);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"reccl's NVLink-path collectives on loopback ranks of one GPU, in CUDA graphs"};
  int ranks = 2, reps = 20;
  std::vector<std::size_t> sizes{4096, 262144, 4u << 20, 64u << 20, 256u << 20};
  std::vector<std::string> colls{"all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_to_all"};
  std::vector<int> ctas{0};
  std::string json_path, label = "run", algo = "automatic";
  bool pdl = true;
  app.add_option("--ranks", ranks, "loopback ranks")->check(CLI::Range(2, 8));
  app.add_option("--bytes", sizes, "input bytes per rank")->delimiter(',');
  app.add_option("--colls", colls, "collectives")->delimiter(',');
  app.add_option("--reps", reps, "graph replays per configuration (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "write every replay's time here");
  app.add_option("--label", label, "a name for this binary in the JSON (e.g. its commit)");
  app.add_option("--ctas", ctas, "CTA counts to sweep (0: the tuning table's)")->delimiter(',');
  app.add_option("--algo", algo, "algorithm")->check(CLI::IsMember({"automatic", "one_shot", "pipelined", "two_shot", "direct"}));
  app.add_option("--pdl", pdl, "programmatic dependent launch (1) or plain launches (0)");
  CLI11_PARSE(app, argc, argv);

  reccl::nvlink_config cfg;
  cfg.pdl = pdl;
  reccl::algorithm const al = algo == "one_shot"    ? reccl::algorithm::one_shot
                              : algo == "pipelined" ? reccl::algorithm::pipelined
                              : algo == "two_shot"  ? reccl::algorithm::two_shot
                              : algo == "direct"    ? reccl::algorithm::direct
                                                    : reccl::algorithm::automatic;
  auto comms = reccl::nvlink_communicator::create_loopback(ranks, 0, cfg);
  nlohmann::json out = {{"label", label}, {"ranks", ranks}, {"dtype", "bf16"}, {"algo", algo}, {"pdl", pdl}, {"results", nlohmann::json::array()}};
  std::printf("%-15s %12s %5s %5s %12s\n", "collective", "bytes", "reg", "ctas", "us/call");
  for (auto const& name : colls) {
    reccl::collective c = reccl::collective::all_reduce;
    if (name == "reduce_scatter") c = reccl::collective::reduce_scatter;
    else if (name == "all_gather") c = reccl::collective::all_gather;
    else if (name == "broadcast") c = reccl::collective::broadcast;
    else if (name == "all_to_all") c = reccl::collective::all_to_all;
    else if (name != "all_reduce") {
      std::fprintf(stderr, "unknown collective %s\n", name.c_str());
      return 2;
    }
    for (std::size_t b : sizes)
      for (int k : ctas)
        for (bool reg : {false, true}) {
          config cf{c, b, reg};
          cf.launch.algo = al;
          cf.launch.ctas = k;
          std::vector<double> all;
          double med = 0;
          try {
            med = run_one(comms, cf, reps, all);
          } catch (reccl::error const& e) {  // e.g. a CTA count the algorithm refuses at this size
            std::printf("%-15s %12zu %5s %5d   refused: %s\n", name.c_str(), b, reg ? "yes" : "no", k, e.what());
            continue;
          }
          std::printf("%-15s %12zu %5s %5d %12.2f\n", name.c_str(), b, reg ? "yes" : "no", k, med);
          nlohmann::json row = {{"collective", name}, {"bytes", b}, {"registered", reg}, {"median_us", med}, {"us", all}};
          if (k != 0) row["ctas"] = k;
          out["results"].push_back(row);
        }
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}
