// The main example on GPUs: reccl's NVLink all-reduce next to NCCL's, one process driving every
// GPU of the machine (>= 2, joined by NVLink/P2P).
//
//   1. correctness: bf16 sum of small integers (exact in bf16) on plain cudaMalloc buffers, at
//      4 KiB, 1 MiB and 64 MiB, every element checked on every rank;
//   2. path isolation: the same fp32 all-reduce on random data under an equal 4-VT split and under
//      a skewed one with a masked VT (what the control loop does to a slow or dead path): the
//      results must be bitwise identical;
//   3. speed: mean time of 20 eager all-reduces per size, reccl against ncclAllReduce on the same
//      buffers and streams, and the ratio.
// Ends with a JSON summary (--json FILE). Exit status: 0 when every result is right.
//
//   gpu_demo [--json FILE]          (NCCL_NVLS_ENABLE=0: NVLink multicast stays off)
// It reduces bf16 and fp32 only, so only their reduction kernels are compiled (RECCL_DTYPES,
// reccl/types.hpp).
#define RECCL_DTYPES bfloat16 | float32

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <reccl/host/communicator.hpp>
#include <reccl/policy/allocator/allocator.hpp>

#include "../common/check.hpp"

namespace {

std::uint16_t bf16_of_small_int(int v) {  // exact: |v| < 256
  float f = static_cast<float>(v);
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);
}

struct machine {
  int n = 0;
  std::vector<ncclComm_t> nccl;
  std::vector<reccl::nvlink_communicator> comms;
  std::vector<cudaStream_t> streams;
  void sync() {
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaStreamSynchronize(streams[r]));
    }
  }
};

/// Runs reccl's all-reduce on every rank (launched from this one thread, then synchronised).
void reccl_all_reduce(machine& m, std::vector<void*> const& in, std::vector<void*> const& out, std::uint64_t count,
                      reccl::dtype t, reccl::launch_options const& lo = {}) {
  for (int r = 0; r < m.n; ++r) m.comms[r].all_reduce(in[r], out[r], count, t, reccl::redop::sum, m.streams[r], lo);
  m.sync();
  for (auto& c : m.comms) c.check();
}

void nccl_all_reduce(machine& m, std::vector<void*> const& in, std::vector<void*> const& out, std::uint64_t count,
                     ncclDataType_t t) {
  NK(ncclGroupStart());
  for (int r = 0; r < m.n; ++r) NK(ncclAllReduce(in[r], out[r], count, t, ncclSum, m.nccl[r], m.streams[r]));
  NK(ncclGroupEnd());
  m.sync();
}

template <class F>
double mean_us(machine& m, int iters, F&& launch) {
  std::vector<cudaEvent_t> a(m.n), b(m.n);
  for (int r = 0; r < m.n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaEventCreate(&a[r]));
    CK(cudaEventCreate(&b[r]));
    CK(cudaEventRecord(a[r], m.streams[r]));
  }
  for (int i = 0; i < iters; ++i) launch();
  double worst = 0;
  for (int r = 0; r < m.n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaEventRecord(b[r], m.streams[r]));
    CK(cudaEventSynchronize(b[r]));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a[r], b[r]));
    worst = std::max(worst, 1e3 * ms / iters);
    CK(cudaEventDestroy(a[r]));
    CK(cudaEventDestroy(b[r]));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--json" && i + 1 < argc) json_path = argv[++i];
  }
  machine m;
  CK(cudaGetDeviceCount(&m.n));
  if (m.n < 2) {
    std::fprintf(stderr, "gpu_demo needs at least 2 GPUs (found %d); run the CPU engine example instead\n", m.n);
    return 2;
  }
  m.n = std::min(m.n, 8);
  m.nccl.resize(m.n);
  m.streams.resize(m.n);
  std::vector<int> devs(m.n);
  for (int r = 0; r < m.n; ++r) devs[r] = r;
  NK(ncclCommInitAll(m.nccl.data(), m.n, devs.data()));
  m.comms = reccl::nvlink_communicator::create_all(m.nccl);
  for (int r = 0; r < m.n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaStreamCreateWithFlags(&m.streams[r], cudaStreamNonBlocking));
  }
  std::printf("reccl gpu_demo: %d GPUs, one process, plain cudaMalloc buffers\n", m.n);

  std::uint64_t const max_bytes = 64ull << 20;
  std::vector<void*> in(m.n), out(m.n);
  for (int r = 0; r < m.n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMalloc(&in[r], max_bytes));
    CK(cudaMalloc(&out[r], max_bytes));
  }
  bool all_ok = true;
  std::string json = "{\n  \"gpus\": " + std::to_string(m.n) + ",\n  \"sizes\": [";

  // 1 + 3: bf16 correctness and speed at three sizes
  std::printf("\n%12s %10s %12s %12s %8s\n", "bytes", "correct", "reccl us", "nccl us", "ratio");
  bool first = true;
  for (std::uint64_t bytes : {4ull << 10, 1ull << 20, 64ull << 20}) {
    std::uint64_t const count = bytes / 2;
    std::vector<std::uint16_t> h(count);
    for (int r = 0; r < m.n; ++r) {
      for (std::uint64_t i = 0; i < count; ++i) h[i] = bf16_of_small_int(static_cast<int>((i * 7 + 3 * r) % 16));
      CK(cudaSetDevice(r));
      CK(cudaMemcpy(in[r], h.data(), bytes, cudaMemcpyHostToDevice));
      CK(cudaMemset(out[r], 0xff, bytes));  // poison
    }
    reccl_all_reduce(m, in, out, count, reccl::dtype::bfloat16);
    bool ok = true;
    for (int r = 0; r < m.n && ok; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaMemcpy(h.data(), out[r], bytes, cudaMemcpyDeviceToHost));
      for (std::uint64_t i = 0; i < count && ok; ++i) {
        int want = 0;
        for (int s = 0; s < m.n; ++s) want += static_cast<int>((i * 7 + 3 * s) % 16);
        ok = h[i] == bf16_of_small_int(want);
      }
    }
    all_ok = all_ok && ok;
    int const iters = 20;
    reccl_all_reduce(m, in, out, count, reccl::dtype::bfloat16);  // warm
    double const t_reccl = mean_us(m, iters, [&] {
      for (int r = 0; r < m.n; ++r) m.comms[r].all_reduce(in[r], out[r], count, reccl::dtype::bfloat16, reccl::redop::sum, m.streams[r]);
    });
    nccl_all_reduce(m, in, out, count, ncclBfloat16);  // warm (NCCL connects lazily)
    double const t_nccl = mean_us(m, iters, [&] {
      NK(ncclGroupStart());
      for (int r = 0; r < m.n; ++r) NK(ncclAllReduce(in[r], out[r], count, ncclBfloat16, ncclSum, m.nccl[r], m.streams[r]));
      NK(ncclGroupEnd());
    });
    for (auto& c : m.comms) c.check();
    std::printf("%12llu %10s %12.2f %12.2f %8.2f\n", static_cast<unsigned long long>(bytes), ok ? "yes" : "NO", t_reccl,
                t_nccl, t_nccl / t_reccl);
    json += std::string(first ? "" : ",") + "\n    {\"bytes\": " + std::to_string(bytes) + ", \"correct\": " +
            (ok ? "true" : "false") + ", \"reccl_us\": " + std::to_string(t_reccl) + ", \"nccl_us\": " +
            std::to_string(t_nccl) + "}";
    first = false;
  }
  json += "\n  ],\n";

  // 2: path isolation -- moving VT boundaries (and masking a VT) never changes a bit
  {
    std::uint64_t const count = (16ull << 20) / 4 + 13;  // fp32, not a multiple of any pack
    std::mt19937 g(7);
    std::normal_distribution<float> nd(0.f, 10.f);
    std::vector<float> h(count);
    for (int r = 0; r < m.n; ++r) {
      for (auto& x : h) x = nd(g);
      CK(cudaSetDevice(r));
      CK(cudaMemcpy(in[r], h.data(), count * 4, cudaMemcpyHostToDevice));
    }
    reccl::split equal = reccl::to_split(reccl::equal_shares(4, reccl::all_live(4)), count, 1);
    reccl::split skew{};
    skew.n_vts = 4;
    skew.live_mask = 0b1011;  // VT 2 masked, the others uneven: what the allocator makes of a dead path
    skew.count[0] = count / 10;
    skew.count[1] = count / 3;
    skew.count[3] = count - skew.count[0] - skew.count[1];
    skew.total = count;
    std::vector<std::vector<float>> res[2];
    reccl::split const* splits[2] = {&equal, &skew};
    for (int k = 0; k < 2; ++k) {
      reccl::launch_options lo;
      lo.algo = reccl::algorithm::pipelined;
      lo.vt_split = splits[k];
      for (int r = 0; r < m.n; ++r) {
        CK(cudaSetDevice(r));
        CK(cudaMemset(out[r], 0xff, count * 4));
      }
      reccl_all_reduce(m, in, out, count, reccl::dtype::float32, lo);
      res[k].resize(m.n, std::vector<float>(count));
      for (int r = 0; r < m.n; ++r) {
        CK(cudaSetDevice(r));
        CK(cudaMemcpy(res[k][r].data(), out[r], count * 4, cudaMemcpyDeviceToHost));
      }
    }
    bool same = true;
    for (int r = 0; r < m.n; ++r) same = same && std::memcmp(res[0][r].data(), res[1][r].data(), count * 4) == 0;
    for (int r = 1; r < m.n; ++r) same = same && std::memcmp(res[0][0].data(), res[0][r].data(), count * 4) == 0;
    std::printf("\npath isolation: fp32 all-reduce of %llu elements, equal 4-VT split vs skewed split with VT 2 "
                "masked: %s\n",
                static_cast<unsigned long long>(count), same ? "bitwise identical on every rank" : "RESULTS DIFFER");
    all_ok = all_ok && same;
    json += std::string("  \"split_independent\": ") + (same ? "true" : "false") + ",\n";
  }
  json += std::string("  \"all_correct\": ") + (all_ok ? "true" : "false") + "\n}\n";
  if (!json_path.empty()) std::ofstream(json_path) << json;

  for (int r = 0; r < m.n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaFree(in[r]));
    CK(cudaFree(out[r]));
  }
  m.comms.clear();  // reccl communicators go before the NCCL ones they were built on
  for (auto c : m.nccl) NK(ncclCommDestroy(c));
  std::printf("%s\n", all_ok ? "every result correct" : "SOME RESULTS WRONG");
  return all_ok ? 0 : 1;
}
