// reccl_call_cost -- what the copy-engine proxy's CUDA calls cost the proxy thread, and how long the
// copies they issue take to complete, on one GPU (host side only: no kernel runs). For each way
// the backend can issue a pass (see proxy/backend_copy_engine.hpp):
//   issue_us     the CPU time of the call(s) that issue one put of --bytes and its 8-byte signal
//   complete_us  from the start of issuing until an event recorded after them reports done
//                (polled with cudaEventQuery, as the proxy does)
// plus the cost of cudaEventRecord and of a cudaEventQuery that returns "done". Medians of --reps.
// Then whether a device-to-device copy needs SMs: a 64 MiB cudaMemcpyAsync alone, and issued while
// a kernel holds every SM (as many spinning 1,024-thread CTAs as fit) for 50 ms; a copy
// that finishes long before the kernel ran on the copy engines, one that finishes only after it
// waited for SMs.
//
//   reccl_call_cost [--bytes 1024] [--reps 2000] [-J out.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "bench_util.hpp"

using bench::ck;
using bench::median;

namespace {

double now_us() {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// Holds its SM for `ns` nanoseconds (launched with enough CTAs to fill every SM).
__global__ void sm_hog(unsigned long long ns) {
  unsigned long long t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"reccl_call_cost: the copy-engine proxy's CUDA calls, per call and to completion"};
  std::uint64_t bytes = 1024;
  int reps = 2000;
  std::string json_out;
  app.add_option("--bytes", bytes, "bytes per put");
  app.add_option("--reps", reps, "repetitions per measure (the median is reported)");
  app.add_option("-J,--json", json_out, "write the results as JSON");
  CLI11_PARSE(app, argc, argv);
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) {
    std::printf("skipped: no GPU\n");
    return 0;
  }
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  char *src = nullptr, *dst = nullptr;
  std::uint64_t* flag = nullptr;
  ck(cudaMalloc(&src, bytes * 8), "cudaMalloc");
  ck(cudaMalloc(&dst, bytes * 8), "cudaMalloc");
  ck(cudaMalloc(&flag, 64), "cudaMalloc");
  std::uint64_t* pinned = nullptr;
  ck(cudaHostAlloc(&pinned, 4096, cudaHostAllocPortable), "cudaHostAlloc");
  cudaStream_t s = nullptr;
  ck(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t ev = nullptr;
  ck(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");

  std::uint64_t value = 0;
  // the ways of issuing `puts` puts and their signals (one per put, to distinct flags)
  auto unbatched = [&](int puts) {
    for (int i = 0; i < puts; ++i) {
      ck(cudaMemcpyAsync(dst + i * bytes, src + i * bytes, bytes, cudaMemcpyDeviceToDevice, s), "put");
      pinned[i] = ++value;
      ck(cudaMemcpyAsync(flag + i, pinned + i, 8, cudaMemcpyHostToDevice, s), "signal");
    }
  };
  auto batched = [&](int puts) {
    void* d[8];
    void const* sr[8];
    std::size_t sz[8];
    std::uint64_t vals[8];
    for (int i = 0; i < puts; ++i) d[i] = dst + i * bytes, sr[i] = src + i * bytes, sz[i] = bytes;
    cudaMemcpyAttributes a{};
    a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    a.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    std::size_t first = 0;
    ck(cudaMemcpyBatchAsync(d, sr, sz, static_cast<std::size_t>(puts), &a, &first, 1, s), "batch puts");
    for (int i = 0; i < puts; ++i) d[i] = flag + i, vals[i] = ++value, sr[i] = &vals[i], sz[i] = 8;
    a.srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
    a.flags = 0;
    ck(cudaMemcpyBatchAsync(d, sr, sz, static_cast<std::size_t>(puts), &a, &first, 1, s), "batch signals");
  };
  struct row {
    std::string name;
    double issue_us, complete_us;
  };
  std::vector<row> rows;
  auto measure = [&](std::string const& name, std::function<void()> const& issue) {
    std::vector<double> is, cs;
    for (int r = -20; r < reps; ++r) {
      double const t0 = now_us();
      issue();
      double const t1 = now_us();
      ck(cudaEventRecord(ev, s), "cudaEventRecord");
      cudaError_t q;
      while ((q = cudaEventQuery(ev)) == cudaErrorNotReady) {
      }
      ck(q, "cudaEventQuery");
      double const t2 = now_us();
      if (r >= 0) is.push_back(t1 - t0), cs.push_back(t2 - t0);
    }
    rows.push_back({name, median(is), median(cs)});
  };
  measure("unbatched, 1 put + signal", [&] { unbatched(1); });
  measure("batched, 1 put + signal", [&] { batched(1); });
  measure("unbatched, 8 puts + signals", [&] { unbatched(8); });
  measure("batched, 8 puts + signals", [&] { batched(8); });
  measure("put only (cudaMemcpyAsync)", [&] { ck(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "put"); });
  measure("signal only (batched, DuringApiCall)", [&] {
    std::uint64_t v = ++value;
    void* d = flag;
    void const* sr = &v;
    std::size_t sz = 8, first = 0;
    cudaMemcpyAttributes a{};
    a.srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
    ck(cudaMemcpyBatchAsync(&d, &sr, &sz, 1, &a, &first, 1, s), "signal");
  });
  // event calls alone
  std::vector<double> rec, qdone;
  for (int r = 0; r < reps; ++r) {
    double const t0 = now_us();
    ck(cudaEventRecord(ev, s), "cudaEventRecord");
    double const t1 = now_us();
    ck(cudaEventSynchronize(ev), "cudaEventSynchronize");
    double const t2 = now_us();
    ck(cudaEventQuery(ev), "cudaEventQuery");
    double const t3 = now_us();
    rec.push_back(t1 - t0);
    qdone.push_back(t3 - t2);
    (void)t2;
  }

  // ---- does a device-to-device copy need SMs?
  std::uint64_t const big = 64ull << 20;
  char *bs = nullptr, *bd = nullptr;
  ck(cudaMalloc(&bs, big), "cudaMalloc");
  ck(cudaMalloc(&bd, big), "cudaMalloc");
  cudaStream_t hs = nullptr;
  ck(cudaStreamCreateWithFlags(&hs, cudaStreamNonBlocking), "cudaStreamCreate");
  cudaEvent_t c0, c1;
  ck(cudaEventCreate(&c0), "cudaEventCreate");
  ck(cudaEventCreate(&c1), "cudaEventCreate");
  auto copy_ms = [&](bool busy, bool hint) {
    int per_sm = 0;
    ck(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, sm_hog, 1024, 0), "occupancy");
    if (busy) {
      sm_hog<<<prop.multiProcessorCount * per_sm, 1024, 0, hs>>>(50'000'000ull);
      ck(cudaGetLastError(), "sm_hog");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));  // the hog holds every SM by now
    }
    double const t0 = now_us();
    ck(cudaEventRecord(c0, s), "cudaEventRecord");
    if (hint) {  // as the batched backend issues its puts
      void* d = bd;
      void const* sr = bs;
      std::size_t sz = big, first = 0;
      cudaMemcpyAttributes a{};
      a.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
      a.flags = cudaMemcpyFlagPreferOverlapWithCompute;
      ck(cudaMemcpyBatchAsync(&d, &sr, &sz, 1, &a, &first, 1, s), "copy (batch, hint)");
    } else {
      ck(cudaMemcpyAsync(bd, bs, big, cudaMemcpyDeviceToDevice, s), "copy");
    }
    ck(cudaEventRecord(c1, s), "cudaEventRecord");
    ck(cudaEventSynchronize(c1), "cudaEventSynchronize");
    double const host_ms = (now_us() - t0) / 1e3;
    ck(cudaStreamSynchronize(hs), "hog");
    float gpu_ms = 0;
    ck(cudaEventElapsedTime(&gpu_ms, c0, c1), "cudaEventElapsedTime");
    return std::pair<double, double>{host_ms, gpu_ms};
  };
  copy_ms(false, false);  // warm-up
  copy_ms(false, true);
  auto const alone = copy_ms(false, false);
  auto const beside = copy_ms(true, false);
  auto const alone_h = copy_ms(false, true);
  auto const beside_h = copy_ms(true, true);

  std::printf("reccl_call_cost (%s; %llu-byte puts, device to device on one GPU; medians of %d)\n", prop.name,
              static_cast<unsigned long long>(bytes), reps);
  std::printf("%-40s %10s %12s\n", "issue", "issue_us", "complete_us");
  for (auto const& r : rows) std::printf("%-40s %10.2f %12.2f\n", r.name.c_str(), r.issue_us, r.complete_us);
  std::printf("%-40s %10.2f\n", "cudaEventRecord", median(rec));
  std::printf("%-40s %10.2f\n", "cudaEventQuery (done)", median(qdone));
  std::printf("64 MiB device-to-device copy: alone %.3f ms; issued 5 ms into a 50 ms kernel holding every SM: done %.3f ms after issue"
              " (%s)\n", alone.first, beside.first, beside.first < 25 ? "copy engines: no SM needed" : "it waited for SMs");
  std::printf("the same through cudaMemcpyBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute: alone %.3f ms; beside the kernel %.3f ms"
              " (%s)\n", alone_h.first, beside_h.first, beside_h.first < 25 ? "copy engines: no SM needed" : "it waited for SMs");
  if (!json_out.empty()) {
    nlohmann::json J;
    J["bench"] = "reccl_call_cost";
    J["gpu"] = prop.name;
    J["bytes"] = bytes;
    J["reps"] = reps;
    for (auto const& r : rows) J["rows"].push_back({{"issue", r.name}, {"issue_us", r.issue_us}, {"complete_us", r.complete_us}});
    J["event_record_us"] = median(rec);
    J["event_query_done_us"] = median(qdone);
    J["copy_64MiB_alone_ms"] = alone.first;
    J["copy_64MiB_beside_sm_hog_ms"] = beside.first;
    J["copy_64MiB_batch_hint_alone_ms"] = alone_h.first;
    J["copy_64MiB_batch_hint_beside_sm_hog_ms"] = beside_h.first;
    std::ofstream(json_out) << J.dump(2) << "\n";
  }
  cudaEventDestroy(ev);
  cudaStreamDestroy(s);
  cudaFreeHost(pinned);
  cudaFree(src);
  cudaFree(dst);
  cudaFree(flag);
  return 0;
}
