// reccl_sysmem_probe -- does a kernel that polls a word of mapped host memory see a host thread's
// stores to it? A host thread increments the word (without pause, or once every
// --host_period_ns, as a proxy publishes its head once per pass) while one GPU thread reads it
// back to back with each load flavour the proxy's work queue could use, optionally storing to
// another line of the same page between reads (as a producer writes its tail). With --beside, a
// second kernel polls a word of device memory on another stream for the whole run (a waiter
// kernel of another rank; the case in which bench/NOTES.md 22's flood stalled). Printed per
// flavour: reads, distinct values seen, and the host's increments meanwhile. A flavour that sees
// one value while the host made thousands of increments returns stale data.
//
//   reccl_sysmem_probe [--reads 200000] [--host_period_ns 0] [--beside] [--beside_sleep_ns 0]
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <thread>

#include <CLI/CLI.hpp>

#include "bench_util.hpp"

using bench::ck;

namespace {

enum flavour : int { acquire_sys = 0, relaxed_sys = 1, volatile_ld = 2, cv = 3, n_flavours = 4 };
char const* const names[] = {"ld.acquire.sys", "ld.relaxed.sys", "ld.volatile", "ld.global.cv"};

__device__ std::uint64_t load(std::uint64_t const* p, int f) {
  std::uint64_t v = 0;
  switch (f) {
    case acquire_sys: asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); break;
    case relaxed_sys: asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); break;
    case volatile_ld: asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); break;
    default: asm volatile("ld.global.cv.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); break;
  }
  return v;
}

// out[0] = distinct values seen, out[1] = first value, out[2] = last value
__global__ void poll(std::uint64_t const* word, std::uint64_t* other, int f, bool write_between, long reads,
                     unsigned long long* out, unsigned* done) {
  std::uint64_t last = load(word, f), first = last, distinct = 1;
  for (long i = 0; i < reads; ++i) {
    if (write_between) asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(other), "l"(static_cast<std::uint64_t>(i)) : "memory");
    std::uint64_t const v = load(word, f);
    if (v != last) {
      ++distinct;
      last = v;
    }
  }
  out[0] = distinct;
  out[1] = first;
  out[2] = last;
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(done), "r"(1u) : "memory");
}

// The kernel beside: polls a device word nobody writes until the probe kernel says it is done
// (or 30 s pass), with an acquire load as a transport wait does; optionally sleeping between polls.
__global__ void beside(unsigned const* done, unsigned sleep_ns, unsigned long long* polls) {
  unsigned long long n = 0, t0 = 0, t = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  for (;;) {
    unsigned v;
    asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(done) : "memory");
    if (v != 0) break;
    ++n;
    if (sleep_ns != 0) __nanosleep(sleep_ns);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    if (t - t0 > 30'000'000'000ull) break;
  }
  *polls = n;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"reccl_sysmem_probe: whether a kernel's loads of mapped host memory see a host thread's stores"};
  long reads = 200000;
  unsigned long long host_period_ns = 0;
  bool with_beside = false;
  unsigned beside_sleep_ns = 0;
  app.add_option("--reads", reads, "loads per flavour");
  app.add_option("--host_period_ns", host_period_ns, "the host thread's pause between increments (0: none)");
  app.add_flag("--beside", with_beside, "run a second kernel polling device memory on another stream meanwhile");
  app.add_option("--beside_sleep_ns", beside_sleep_ns, "the second kernel's sleep between polls");
  CLI11_PARSE(app, argc, argv);
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) {
    std::printf("skipped: no GPU\n");
    return 0;
  }
  void* block = nullptr;
  ck(cudaHostAlloc(&block, 4096, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
  auto* word = static_cast<std::uint64_t*>(block);
  void* dblock = nullptr;
  ck(cudaHostGetDevicePointer(&dblock, block, 0), "cudaHostGetDevicePointer");
  auto* dword = static_cast<std::uint64_t*>(dblock);  // dword + 32: another 128-byte line of the page
  unsigned long long* out = nullptr;
  ck(cudaMallocManaged(&out, 4 * sizeof(unsigned long long)), "cudaMallocManaged");
  unsigned* done = nullptr;  // device memory: the probe kernel's "finished", which ends the kernel beside
  ck(cudaMalloc(&done, sizeof(unsigned)), "cudaMalloc");
  cudaStream_t sp = nullptr, sb = nullptr;
  ck(cudaStreamCreateWithFlags(&sp, cudaStreamNonBlocking), "cudaStreamCreate");
  ck(cudaStreamCreateWithFlags(&sb, cudaStreamNonBlocking), "cudaStreamCreate");
  std::printf("host: %s; beside: %s\n", host_period_ns ? ("one increment per " + std::to_string(host_period_ns) + " ns").c_str() : "increments without pause",
              with_beside ? ("a kernel polling device memory, sleep " + std::to_string(beside_sleep_ns) + " ns").c_str() : "nothing");
  std::printf("%-16s %-14s %10s %10s %14s %12s\n", "load", "between reads", "reads", "distinct", "host stores", "beside polls");
  for (int wb = 0; wb < 2; ++wb)
    for (int f = 0; f < n_flavours; ++f) {
      std::atomic<bool> stop{false};
      std::atomic_ref<std::uint64_t>(*word).store(0);
      ck(cudaMemset(done, 0, sizeof(unsigned)), "cudaMemset");
      out[3] = 0;
      std::thread host([&] {
        std::uint64_t i = 0;
        while (!stop.load(std::memory_order_relaxed)) {
          std::atomic_ref<std::uint64_t>(*word).store(++i, std::memory_order_release);
          if (host_period_ns != 0) {
            auto const until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(host_period_ns);
            while (std::chrono::steady_clock::now() < until) {
            }
          }
        }
      });
      if (with_beside) beside<<<1, 32, 0, sb>>>(done, beside_sleep_ns, out + 3);
      poll<<<1, 1, 0, sp>>>(dword, dword + 32, f, wb != 0, reads, out, done);
      ck(cudaStreamSynchronize(sp), "poll");
      ck(cudaStreamSynchronize(sb), "beside");
      stop = true;
      host.join();
      std::printf("%-16s %-14s %10ld %10llu %14llu %12llu\n", names[f], wb ? "store" : "-", reads, out[0],
                  static_cast<unsigned long long>(out[2] - out[1]), out[3]);
    }
  cudaStreamDestroy(sp);
  cudaStreamDestroy(sb);
  cudaFree(done);
  cudaFree(out);
  cudaFreeHost(block);
  return 0;
}
