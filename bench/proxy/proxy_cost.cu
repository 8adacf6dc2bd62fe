// reccl_proxy_cost -- what one request through the copy-engine proxy costs, two ranks (on one GPU
// when the machine has one, else on GPUs 0 and 1):
//   latency   a kernel of rank 0 puts `bytes` + signals rank 1, whose kernel waits and answers the
//             same way; one way = round trip / 2 (median of --reps runs of --iters round trips)
//   posts/s   a kernel of rank 0 pushes --posts signal requests (and, second row, puts of --bytes
//             with a signal on the last) as fast as its queue takes them; the time from the launch
//             until rank 1's kernel saw the last one
//
//   reccl_proxy_cost [--iters 2000] [--reps 5] [--bytes 1024] [--posts 8192] [--unbatched]
//                    [--solo] [--await_sleep_ns N] [--lazy] [--inline]
//                    [--inline_warp]
//                    [-J out.json]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "reccl/proxy/copy_engine_group.hpp"
#include "bench_util.hpp"

using namespace reccl;
using namespace reccl::proxy;
using handle = reccl::transport::proxy::handle;

using bench::ck;
using bench::median;

namespace {

constexpr std::uint64_t second = 1'000'000'000;

// Round trips: rank 0 puts + signals value base+i, rank 1 waits for it and answers with the same.
// mode 0: put_with_signal; 1: put_inline (thread 0); 2: put_inline_warp (the first warp)
__global__ void ping_pong(handle h, int peer, bool first, int iters, std::uint64_t base, std::uint64_t bytes, int mode,
                          unsigned long long* ns, int* err) {
  if (threadIdx.x >= 32 || (mode != 2 && threadIdx.x != 0)) return;
  bool const lead = threadIdx.x == 0;
  std::uint64_t const dl = reccl::proxy::clock_ns() + 30 * second;
  std::uint64_t const t0 = reccl::proxy::clock_ns();
  for (int i = 1; i <= iters; ++i) {
    std::uint64_t const v = base + static_cast<std::uint64_t>(i);
    int bad = 0;
    if (lead && !first && h.wait(0, peer, flag::ready, v, dl).st != status::ok) bad = 1;
    if (mode == 2) bad = __shfl_sync(0xffffffffu, bad, 0);
    if (bad) { if (lead) *err = 1; return; }
    if (mode == 2) h.put_inline_warp(0, peer, 0, h.send_area(0, peer), bytes, flag::ready, v);
    else if (mode == 1) h.put_inline(0, peer, 0, h.send_area(0, peer), bytes, flag::ready, v);
    else h.put_with_signal(0, peer, 0, h.send_area(0, peer), bytes, flag::ready, v);
    if (lead && first && h.wait(0, peer, flag::ready, v, dl).st != status::ok) bad = 1;
    if (mode == 2) bad = __shfl_sync(0xffffffffu, bad, 0);
    if (bad) { if (lead) *err = 1; return; }
  }
  if (lead) *ns = reccl::proxy::clock_ns() - t0;
}

// Rank 0 floods its queue: `posts` requests (signals, or puts with a signal on the last).
__global__ void flood(handle h, int peer, std::uint64_t posts, std::uint64_t base, std::uint64_t bytes, int* err,
                      unsigned long long* pushed) {
  if (threadIdx.x != 0) return;
  for (std::uint64_t i = 1; i <= posts; ++i) {
    if (bytes == 0) h.signal(0, peer, flag::ready, base + i);
    else if (i < posts) h.put(0, peer, 0, h.send_area(0, peer), bytes);
    else h.put_with_signal(0, peer, 0, h.send_area(0, peer), bytes, flag::ready, base + i);
    // the queue's error word is across PCIe: look every 1024 posts and at the end, as a
    // collective would (a failed queue also fails the waits that follow)
    if ((i % 1024 == 0 || i == posts) && h.error(0) != status::ok) { *err = 2; return; }
    *static_cast<volatile unsigned long long*>(pushed) = i;
  }
}
__global__ void await(handle h, int peer, std::uint64_t value, int* err, unsigned long long* seen, unsigned sleep_ns) {
  if (threadIdx.x != 0) return;
  if (sleep_ns != 0) {  // a gentler waiter: poll the flag only, sleeping between polls
    std::uint64_t const* f = h.flags + h.layout.flag_index(0, peer, flag::ready);
    std::uint64_t const dl = reccl::proxy::clock_ns() + 20 * second;
    while (reccl::proxy::load_acquire(f) < value && reccl::proxy::clock_ns() < dl) __nanosleep(sleep_ns);
    *seen = reccl::proxy::load_acquire(f);
    if (*seen < value) *err = 3;
    return;
  }
  wait_result const w = h.wait(0, peer, flag::ready, value, reccl::proxy::clock_ns() + 20 * second);
  *seen = reccl::proxy::load_acquire(h.flags + h.layout.flag_index(0, peer, flag::ready));
  if (w.st != status::ok) *err = 3;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"reccl_proxy_cost: latency and post rate of the copy-engine proxy"};
  int iters = 2000, reps = 5;
  std::uint64_t bytes = 1024, posts = 8192;  // twice the queue: the producer also waits for room
  std::string json_out;
  bool solo = false;
  unsigned await_sleep_ns = 0;
  bool unbatched = false;
  bool lazy = false;
  bool inl = false, inl_warp = false;
  app.add_option("--iters", iters, "round trips per latency run");
  app.add_flag("--solo", solo, "post-rate runs: launch the waiter only after the producer finished");
  app.add_option("--await_sleep_ns", await_sleep_ns, "post-rate runs: the waiter sleeps this long between polls (0: the transport's wait)");
  app.add_flag("--unbatched", unbatched, "the backend issues one CUDA call per copy and per signal (the way before batching)");
  app.add_flag("--inline", inl, "latency runs: the put carries its bytes in the queue (put_inline, at most 1024 B)");
  app.add_flag("--inline_warp", inl_warp, "latency runs: put_inline by a whole warp (the payload written 32 pieces at a time)");
  app.add_flag("--lazy", lazy, "do not load the kernels before the runs (the flood then stalls under lazy module loading; NOTES 24)");
  app.add_option("--reps", reps, "latency runs (the median is reported)");
  app.add_option("--bytes", bytes, "bytes per put");
  app.add_option("--posts", posts, "requests per post-rate run");
  app.add_option("-J,--json", json_out, "write the results as JSON");
  CLI11_PARSE(app, argc, argv);

  int ngpu = 0;
  ck(cudaGetDeviceCount(&ngpu), "cudaGetDeviceCount");
  if (ngpu < 1) {
    std::printf("skipped: no GPU\n");
    return 0;
  }
  copy_engine_config cfg;
  cfg.nranks = 2;
  cfg.n_vts = 1;
  cfg.area_bytes = std::max<std::uint64_t>(bytes, 4096);
  cfg.queue_capacity = 4096;
  cfg.proxy.idle_spins = 1u << 30;  // a dedicated proxy thread keeps spinning (latency over CPU time)
  cfg.push_timeout_ns = 20 * second;
  if (ngpu >= 2) cfg.devices = {0, 1};
  cfg.backend.batched = !unbatched;
  copy_engine_group g(cfg);
  // Load every kernel before any runs: under lazy module loading (CUDA's default) a kernel's first
  // launch loads its module, which waits for the kernels already running and holds up the proxy
  // threads' CUDA calls meanwhile; a producer that needs the proxy to make room then stalls until its
  // timeout (bench/NOTES.md 24).
  if (!lazy) {
    cudaFuncAttributes fa{};
    for (int r = 0; r < 2; ++r) {
      ck(cudaSetDevice(g.memory(r).device), "cudaSetDevice");
      ck(cudaFuncGetAttributes(&fa, ping_pong), "load ping_pong");
      ck(cudaFuncGetAttributes(&fa, flood), "load flood");
      ck(cudaFuncGetAttributes(&fa, await), "load await");
    }
  }
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::string const where = ngpu >= 2 ? "GPU 0 -> GPU 1" : "two ranks on one GPU";

  unsigned long long* ns = nullptr;
  int* err = nullptr;
  ck(cudaMallocManaged(&ns, sizeof(unsigned long long) * 4), "cudaMallocManaged");
  ns[2] = ns[3] = 0;
  ck(cudaMallocManaged(&err, sizeof(int)), "cudaMallocManaged");
  *err = 0;
  std::vector<cudaStream_t> s(2);
  for (int r = 0; r < 2; ++r) {
    ck(cudaSetDevice(g.memory(r).device), "cudaSetDevice");
    ck(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking), "cudaStreamCreate");
  }
  std::uint64_t base = 0;  // flags only grow: every run continues from the last value
  auto sync = [&] {
    for (int r = 0; r < 2; ++r) {
      ck(cudaSetDevice(g.memory(r).device), "cudaSetDevice");
      ck(cudaStreamSynchronize(s[r]), "cudaStreamSynchronize");
    }
    if (*err != 0 || g.error() != status::ok) {
      // the queue's counters as the host sees them: which side stopped
      queue_control const* c = g.queue(0, 0).ctl;
      std::fprintf(stderr,
                   "proxy run failed (phase code %d; pushed %llu, last flag seen %llu, base %llu; queue: %s; tail %llu head %llu "
                   "completed %llu stalls %llu): %s\n",
                   *err, ns[2], ns[3], static_cast<unsigned long long>(base), std::string(name(g.queue(0, 0).error())).c_str(),
                   static_cast<unsigned long long>(load_acquire(&c->tail)), static_cast<unsigned long long>(load_acquire(&c->head)),
                   static_cast<unsigned long long>(load_acquire(&c->completed)), static_cast<unsigned long long>(c->stalls),
                   g.error_message().c_str());
      std::exit(1);
    }
  };

  // ---- latency
  std::vector<double> one_way;
  for (int rep = -1; rep < reps; ++rep) {  // rep -1: warm-up
    for (int r = 0; r < 2; ++r) {
      ck(cudaSetDevice(g.memory(r).device), "cudaSetDevice");
      ping_pong<<<1, 32, 0, s[r]>>>(g.handle(r), 1 - r, r == 0, iters, base, bytes, inl_warp ? 2 : inl ? 1 : 0, ns + r, err);  // err 1
      ck(cudaGetLastError(), "launch ping_pong");
    }
    sync();
    base += static_cast<std::uint64_t>(iters);
    if (rep >= 0) one_way.push_back(static_cast<double>(ns[0]) / (2.0 * iters) / 1e3);
  }
  double const lat_us = median(one_way);
  std::printf("latency done: %.2f us one way\n", lat_us);
  std::fflush(stdout);

  // ---- posts per second (signals, then puts)
  auto rate = [&](std::uint64_t b) {
    auto const t0 = std::chrono::steady_clock::now();
    // the producer first: the waiter only ends the measurement (on one GPU the two kernels were
    // seen not to overlap when the waiter was launched first)
    ck(cudaSetDevice(g.memory(0).device), "cudaSetDevice");
    flood<<<1, 32, 0, s[0]>>>(g.handle(0), 1, posts, base, b, err, ns + 2);
    ck(cudaGetLastError(), "launch flood");
    if (solo) ck(cudaStreamSynchronize(s[0]), "cudaStreamSynchronize (solo)");
    ck(cudaSetDevice(g.memory(1).device), "cudaSetDevice");
    await<<<1, 32, 0, s[1]>>>(g.handle(1), 0, base + posts, err, ns + 3, await_sleep_ns);
    ck(cudaGetLastError(), "launch await");
    sync();
    double const sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    base += posts;
    return static_cast<double>(posts) / sec;
  };
  double const sig_rate = rate(0);
  std::printf("signals done: %.0f /s\n", sig_rate);
  std::fflush(stdout);
  double const put_rate = rate(bytes);

  std::printf("reccl_proxy_cost (%s, %s; copy-engine backend, %s, one proxy thread per rank)\n", prop.name, where.c_str(),
              unbatched ? "a CUDA call per copy and signal" : "a pass's copies and signals batched");
  std::printf("%-44s %12s %10s\n", "measure", "value", "target");
  std::printf("%-44s %9.2f us %10s\n", ((inl_warp ? "one-way warp inline put (" : inl ? "one-way inline put (" : "one-way put (") + std::to_string(bytes) + " B) + signal").c_str(),
              lat_us, "<= 10 us");
  std::printf("%-44s %10.0f /s %10s\n", "signals posted and delivered", sig_rate, ">= 500000");
  std::printf("%-44s %10.0f /s %10s\n", ("puts of " + std::to_string(bytes) + " B posted and delivered").c_str(), put_rate, "");
  if (!json_out.empty()) {
    nlohmann::json J;
    J["bench"] = "reccl_proxy_cost";
    J["gpu"] = prop.name;
    J["placement"] = where;
    J["bytes"] = bytes;
    J["iters"] = iters;
    J["latency_one_way_us"] = {{"median", lat_us}, {"runs", one_way}};
    J["signals_per_s"] = sig_rate;
    J["puts_per_s"] = put_rate;
    J["posts"] = posts;
    J["batched"] = !unbatched;
    J["solo"] = solo;
    J["kernels_loaded_first"] = !lazy;
    J["latency_put"] = inl_warp ? "put_inline_warp" : inl ? "put_inline" : "put_with_signal";
    std::ofstream(json_out) << J.dump(2) << "\n";
  }
  for (auto x : s) cudaStreamDestroy(x);
  cudaFree(ns);
  cudaFree(err);
  return 0;
}
