// reccl_sysmem_probe -- does a kernel that polls a word of mapped host memory see a host thread's
// stores to it? A host thread increments the word without pause while one GPU thread reads it
// back to back with each load flavour the proxy's work queue could use, optionally storing to
// another line of the same page between reads (as a producer writes its tail). Printed per
// flavour: reads, distinct values seen, and the host's increments meanwhile. A flavour that sees
// one value while the host made thousands of increments returns stale data.
//
//   reccl_sysmem_probe [--reads 200000]
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <thread>

#include <CLI/CLI.hpp>

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
                     unsigned long long* out) {
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
}

void ck(cudaError_t e, char const* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"reccl_sysmem_probe: whether a kernel's loads of mapped host memory see a host thread's stores"};
  long reads = 200000;
  app.add_option("--reads", reads, "loads per flavour");
  CLI11_PARSE(app, argc, argv);
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) {
    std::printf("skipped: no GPU\n");
    return 0;
  }
  void* block = nullptr;
  ck(cudaHostAlloc(&block, 4096, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc");
  auto* word = static_cast<std::uint64_t*>(block);
  std::uint64_t* other = word + 32;  // 256 bytes further: another 128-byte line of the page
  void* dblock = nullptr;
  ck(cudaHostGetDevicePointer(&dblock, block, 0), "cudaHostGetDevicePointer");
  auto* dword = static_cast<std::uint64_t*>(dblock);
  unsigned long long* out = nullptr;
  ck(cudaMallocManaged(&out, 3 * sizeof(unsigned long long)), "cudaMallocManaged");
  std::printf("%-16s %-14s %10s %10s %14s\n", "load", "between reads", "reads", "distinct", "host stores");
  for (int wb = 0; wb < 2; ++wb)
    for (int f = 0; f < n_flavours; ++f) {
      std::atomic<bool> stop{false};
      std::atomic_ref<std::uint64_t>(*word).store(0);
      std::thread host([&] {
        std::uint64_t i = 0;
        while (!stop.load(std::memory_order_relaxed)) std::atomic_ref<std::uint64_t>(*word).store(++i, std::memory_order_release);
      });
      poll<<<1, 1>>>(dword, dword + 32, f, wb != 0, reads, out);
      ck(cudaDeviceSynchronize(), "poll");
      stop = true;
      host.join();
      std::printf("%-16s %-14s %10ld %10llu %14llu\n", names[f], wb ? "store" : "-", reads, out[0],
                  static_cast<unsigned long long>(out[2] - out[1]));
    }
  (void)other;
  cudaFree(out);
  cudaFreeHost(block);
  return 0;
}
