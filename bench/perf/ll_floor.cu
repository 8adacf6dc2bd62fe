// reccl_ll_floor -- the floor of a small all-reduce on loopback ranks of one GPU: a minimal LL
// one-shot with nothing a library needs (no deadline, no status word, no argument agreement), timed
// the way reccl_loopback_perf times reccl (per rank one CUDA graph of `iters` calls on its own
// stream, every rank's graph launched together, median of `reps` replays).
//
// The kernel and its protocol: ll_floor_kernel.cuh. Results are checked against a host sum of
// random bf16 data after each configuration.
//
//   reccl_ll_floor --ranks 2,3,4 --bytes 1024,4096,16384,65536,262144 --ctas 1,2,4,8,16,32,64
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "bench/perf/bf16_words.hpp"
#include "bench/perf/graph_timing.hpp"
#include "bench/perf/ll_floor_kernel.cuh"
#include "examples/common/check.hpp"

namespace {

constexpr int max_ranks = ll_floor_max_ranks;

__global__ void empty_kernel() {}

struct rank_state {
  std::uint32_t *in = nullptr, *out = nullptr, *epochs = nullptr;
  std::uint64_t* slots = nullptr;
  cudaStream_t stream = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a minimal LL one-shot all-reduce (bf16) on loopback ranks of one GPU: the floor reccl's small path is held to"};
  std::vector<int> ranks{2, 3, 4}, ctas{1, 2, 4, 8, 16, 32, 64};
  std::vector<int> sizes{1024, 4096, 16384, 65536, 262144};
  int threads = 256, iters = 100, reps = 20;
  std::string json_path;
  app.add_option("--ranks", ranks, "loopback rank counts")->delimiter(',')->check(CLI::Range(2, max_ranks));
  app.add_option("--bytes", sizes, "message bytes per rank (multiples of 4)")->delimiter(',');
  app.add_option("--ctas", ctas, "CTA counts swept per size")->delimiter(',')->check(CLI::Range(1, 1024));
  app.add_option("--threads", threads, "threads per CTA")->check(CLI::Range(32, 1024));
  app.add_option("--iters", iters, "calls per CUDA graph")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "graph replays (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "write every configuration here");
  CLI11_PARSE(app, argc, argv);

  int const max_words = *std::max_element(sizes.begin(), sizes.end()) / 4, max_ctas = *std::max_element(ctas.begin(), ctas.end());
  nlohmann::json out = {{"tool", "reccl_ll_floor"}, {"threads", threads}, {"iters", iters}, {"reps", reps}, {"results", nlohmann::json::array()}};
  std::mt19937_64 g(7);
  std::printf("%6s %9s %5s %9s %6s\n", "ranks", "bytes", "ctas", "us/call", "check");
  for (int n : ranks) {
    std::vector<rank_state> R(static_cast<std::size_t>(n));
    std::vector<std::vector<std::uint32_t>> host;
    for (int r = 0; r < n; ++r) host.push_back(reccl_bench::random_bf16_words(g, static_cast<std::size_t>(max_words)));
    ll_floor_peers p{};
    std::size_t const slot_words = 2ull * static_cast<std::size_t>(n) * static_cast<std::size_t>(max_words);
    for (int r = 0; r < n; ++r) {
      auto& s = R[static_cast<std::size_t>(r)];
      CK(cudaMalloc(&s.in, static_cast<std::size_t>(max_words) * 4));
      CK(cudaMalloc(&s.out, static_cast<std::size_t>(max_words) * 4));
      CK(cudaMalloc(&s.epochs, static_cast<std::size_t>(max_ctas) * 4));
      CK(cudaMalloc(&s.slots, slot_words * 8));
      CK(cudaMemcpy(s.in, host[static_cast<std::size_t>(r)].data(), static_cast<std::size_t>(max_words) * 4, cudaMemcpyHostToDevice));
      CK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
      p.slots[r] = s.slots;
    }
    for (int bytes : sizes) {
      int const words = bytes / 4;
      for (int c : ctas) {
        if (c > 1 && (c - 1) * threads >= words) continue;  // CTAs with no word to move
        for (auto& s : R) {
          CK(cudaMemset(s.epochs, 0, static_cast<std::size_t>(max_ctas) * 4));
          CK(cudaMemset(s.slots, 0, slot_words * 8));
          CK(cudaMemset(s.out, 0xff, static_cast<std::size_t>(max_words) * 4));
        }
        CK(cudaDeviceSynchronize());
        std::vector<cudaStream_t> streams;
        for (auto& s : R) streams.push_back(s.stream);
        auto exec = reccl_bench::capture_per_rank(streams, iters, [&](int r) {
          auto& s = R[static_cast<std::size_t>(r)];
          ll_floor_allreduce<<<c, threads, 0, s.stream>>>(s.in, s.out, p, r, n, s.epochs, words);
        });
        double const us = reccl_bench::time_graphs(streams, exec, iters, reps);
        CK(cudaDeviceSynchronize());
        long wrong = 0;
        std::vector<std::uint32_t> got(static_cast<std::size_t>(words));
        for (int r = 0; r < n; ++r) {
          CK(cudaMemcpy(got.data(), R[static_cast<std::size_t>(r)].out, got.size() * 4, cudaMemcpyDeviceToHost));
          wrong += reccl_bench::wrong_sums(host, got.data(), got.size());
        }
        std::printf("%6d %9d %5d %9.2f %6s\n", n, bytes, c, us, wrong ? "WRONG" : "ok");
        out["results"].push_back({{"ranks", n}, {"bytes", bytes}, {"ctas", c}, {"median_us", us}, {"wrong", wrong}});
      }
    }
    for (auto& s : R) {
      CK(cudaFree(s.in));
      CK(cudaFree(s.out));
      CK(cudaFree(s.epochs));
      CK(cudaFree(s.slots));
      CK(cudaStreamDestroy(s.stream));
    }
  }
  {  // an empty kernel per call, for scale
    std::vector<cudaStream_t> streams(2);
    for (auto& s : streams) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto exec = reccl_bench::capture_per_rank(streams, iters, [&](int r) { empty_kernel<<<1, 32, 0, streams[static_cast<std::size_t>(r)]>>>(); });
    double const us = reccl_bench::time_graphs(streams, exec, iters, reps);
    std::printf("empty kernel, 2 streams: %.2f us/call\n", us);
    out["empty_kernel_us"] = us;
    for (auto& s : streams) CK(cudaStreamDestroy(s));
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}
