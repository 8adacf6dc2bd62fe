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
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "bench/perf/ll_floor_kernel.cuh"
#include "examples/common/check.hpp"

namespace {

constexpr int max_ranks = ll_floor_max_ranks;

__global__ void empty_kernel() {}

float bf16_to_float(std::uint16_t b) {
  std::uint32_t const u = static_cast<std::uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

struct rank_state {
  std::uint32_t *in = nullptr, *out = nullptr, *epochs = nullptr;
  std::uint64_t* slots = nullptr;
  cudaStream_t stream = nullptr;
  cudaGraphExec_t exec = nullptr;
};

/// Median microseconds per call over `reps` replays of every rank's graph launched together.
double time_graphs(std::vector<rank_state>& R, int iters, int reps) {
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  std::vector<cudaEvent_t> done(R.size());
  for (auto& e : done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::vector<double> us;
  for (int rep = 0; rep < reps + 1; ++rep) {
    CK(cudaEventRecord(t0, R[0].stream));
    for (std::size_t r = 1; r < R.size(); ++r) CK(cudaStreamWaitEvent(R[r].stream, t0));
    for (auto& s : R) CK(cudaGraphLaunch(s.exec, s.stream));
    for (std::size_t r = 1; r < R.size(); ++r) {
      CK(cudaEventRecord(done[r], R[r].stream));
      CK(cudaStreamWaitEvent(R[0].stream, done[r]));
    }
    CK(cudaEventRecord(t1, R[0].stream));
    CK(cudaEventSynchronize(t1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t0, t1));
    if (rep > 0) us.push_back(1000.0 * ms / iters);  // the first replay warms the graphs
  }
  CK(cudaEventDestroy(t0));
  CK(cudaEventDestroy(t1));
  for (auto& e : done) CK(cudaEventDestroy(e));
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

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
    std::vector<std::vector<std::uint32_t>> host(static_cast<std::size_t>(n), std::vector<std::uint32_t>(static_cast<std::size_t>(max_words)));
    for (auto& h : host)
      for (auto& w : h) {  // two bf16 k/16 in [-4, 4): sums of up to 4 ranks are exact in bf16
        float const a = static_cast<float>(std::uniform_int_distribution<int>(-64, 63)(g)) / 16.f;
        float const b = static_cast<float>(std::uniform_int_distribution<int>(-64, 63)(g)) / 16.f;
        std::uint32_t ua, ub;
        std::memcpy(&ua, &a, 4);
        std::memcpy(&ub, &b, 4);
        w = (ua >> 16) | (ub & 0xffff0000u);
      }
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
        for (int r = 0; r < n; ++r) {
          auto& s = R[static_cast<std::size_t>(r)];
          cudaGraph_t gr;
          CK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
          for (int k = 0; k < iters; ++k) ll_floor_allreduce<<<c, threads, 0, s.stream>>>(s.in, s.out, p, r, n, s.epochs, words);
          CK(cudaStreamEndCapture(s.stream, &gr));
          CK(cudaGraphInstantiate(&s.exec, gr, 0));
          CK(cudaGraphDestroy(gr));
        }
        double const us = time_graphs(R, iters, reps);
        CK(cudaDeviceSynchronize());
        long wrong = 0;
        std::vector<std::uint32_t> got(static_cast<std::size_t>(words));
        for (int r = 0; r < n; ++r) {
          CK(cudaMemcpy(got.data(), R[static_cast<std::size_t>(r)].out, static_cast<std::size_t>(words) * 4, cudaMemcpyDeviceToHost));
          for (int i = 0; i < words; ++i) {
            float lo = 0, hi = 0;
            for (int q = 0; q < n; ++q) {
              std::uint32_t const w = host[static_cast<std::size_t>(q)][static_cast<std::size_t>(i)];
              lo += bf16_to_float(static_cast<std::uint16_t>(w & 0xffffu));
              hi += bf16_to_float(static_cast<std::uint16_t>(w >> 16));
            }
            wrong += bf16_to_float(static_cast<std::uint16_t>(got[static_cast<std::size_t>(i)] & 0xffffu)) != lo ||
                     bf16_to_float(static_cast<std::uint16_t>(got[static_cast<std::size_t>(i)] >> 16)) != hi;
          }
        }
        for (auto& s : R) CK(cudaGraphExecDestroy(s.exec));
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
    std::vector<rank_state> R(2);
    for (auto& s : R) {
      CK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
      cudaGraph_t gr;
      CK(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeThreadLocal));
      for (int k = 0; k < iters; ++k) empty_kernel<<<1, 32, 0, s.stream>>>();
      CK(cudaStreamEndCapture(s.stream, &gr));
      CK(cudaGraphInstantiate(&s.exec, gr, 0));
      CK(cudaGraphDestroy(gr));
    }
    double const us = time_graphs(R, iters, reps);
    std::printf("empty kernel, 2 streams: %.2f us/call\n", us);
    out["empty_kernel_us"] = us;
    for (auto& s : R) {
      CK(cudaGraphExecDestroy(s.exec));
      CK(cudaStreamDestroy(s.stream));
    }
  }
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}
