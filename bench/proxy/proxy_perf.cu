// reccl_proxy_perf -- the five collectives over the copy-engine proxy against the load/store path
// (and NCCL where the ranks sit on different GPUs), in one process, same sizes, same run; then the
// overlap case: a bf16 GEMM that fills the GPU runs beside an all-reduce loop, and its slowdown is
// reported for each transport.
//
//   reccl_proxy_perf [-b 1M] [-e 256M] [-f 4] [-n 20] [-w 5] [--vts 4] [--area 1M] [--slots 4]
//                    [--inline_bytes 1024] [--colls all_reduce,...] [--gemm 8192] [--overlap_bytes 256M]
//                    [-J out.json]
//
// Ranks: one per GPU when there are two or more GPUs (two ranks), else two loopback ranks on GPU 0
// (the "peer" copies are then copies inside one GPU: the figures show the protocol's cost and the
// SM footprint, not NVLink's speed). dtype bf16, sum; sizes are bytes per rank's output (nccl-tests'
// convention for all-gather and all-to-all: the whole output). busbw uses nccl-tests' factors.
// The proxy path's SM use is its grid: one CTA per VT per rank (thread 0 posts, the CTA reduces).
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "reccl/host/communicator.hpp"
#include "reccl/proxy/collective.hpp"
#include "bench/perf/nccl_tests.hpp"
#include "bench_util.hpp"

using namespace reccl;

using bench::ck;

namespace {

void nk(ncclResult_t e, char const* what) {
  if (e != ncclSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, ncclGetErrorString(e));
    std::exit(1);
  }
}
void bk(cublasStatus_t e, char const* what) {
  if (e != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", what, static_cast<int>(e));
    std::exit(1);
  }
}

// The per-rank element count of collective c for an output of `bytes` (bf16).
std::uint64_t count_for(collective c, std::uint64_t bytes, int n) {
  std::uint64_t const e = bytes / 2;
  return c == collective::all_gather || c == collective::all_to_all ? e / static_cast<std::uint64_t>(n) : e;
}

struct rank_io {
  cudaStream_t s = nullptr;
  char* in = nullptr;   // proxy: in the symmetric region; others: plain cudaMalloc
  char* out = nullptr;
  char* pin = nullptr;  // plain buffers (load/store path, NCCL)
  char* pout = nullptr;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"reccl_proxy_perf: collectives over the copy-engine proxy beside the load/store path and NCCL"};
  std::string b_s = "1M", e_s = "256M", ov_s = "256M", json_out;
  int factor = 4, iters = 20, warm = 5, vts = 4, gemm_n = 8192, gemm_iters = 0;
  std::string area_s = "1M";
  std::uint32_t slots = 4, inline_bytes = proxy::proxy_collectives::default_inline_bytes;
  bool unbatched = false, peer_checks = false;
  std::vector<std::string> colls{"all_reduce", "reduce_scatter", "all_gather", "broadcast", "alltoall"};
  app.add_option("-b,--minbytes", b_s);
  app.add_option("-e,--maxbytes", e_s);
  app.add_option("-f,--stepfactor", factor);
  app.add_option("-n,--iters", iters);
  app.add_option("-w,--warmup_iters", warm);
  app.add_option("--vts", vts, "VTs of the proxy path (CTAs per rank)");
  app.add_option("--area", area_s, "receive area per VT and peer (reduction staging)");
  app.add_option("--slots", slots, "reduce rounds in flight per peer");
  app.add_option("--inline_bytes", inline_bytes, "puts of at most this many bytes go inline (0: none)");
  app.add_option("--colls", colls)->delimiter(',');
  app.add_option("--gemm", gemm_n, "M = N = K of the overlap GEMM (0: no overlap study)");
  app.add_option("--gemm_iters", gemm_iters, "GEMMs per overlap measurement (0: about 1 s worth)");
  app.add_option("--overlap_bytes", ov_s, "all-reduce size of the overlap study");
  app.add_flag("--unbatched", unbatched, "the proxy backend issues one CUDA call per copy and per signal");
  app.add_flag("--peer_checks", peer_checks, "the kernels check the peers' arguments (as with one process per rank)");
  app.add_option("-J,--json", json_out);
  CLI11_PARSE(app, argc, argv);
  std::uint64_t const min_b = parse_size(b_s), max_b = parse_size(e_s), area = parse_size(area_s), ov_b = parse_size(ov_s);

  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) {
    std::printf("skipped: no GPU\n");
    return 0;
  }
  int const n = 2;
  bool const loop = ngpu < 2;
  auto dev = [&](int r) { return loop ? 0 : r; };
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::uint64_t const cap = static_cast<std::uint64_t>(n) * std::max(max_b, ov_b);  // reduce-scatter's input is n outputs

  // ---- the three transports
  proxy::copy_engine_config pcfg;
  pcfg.nranks = n;
  pcfg.n_vts = vts;
  pcfg.area_bytes = area;
  pcfg.queue_capacity = 4096;
  pcfg.symmetric_bytes = 2 * cap + 4096;
  pcfg.proxy.idle_spins = 1u << 30;  // a dedicated proxy thread keeps spinning
  pcfg.backend.batched = !unbatched;
  if (!loop) pcfg.devices = {0, 1};
  proxy::copy_engine_group group(pcfg);
  proxy::proxy_collectives pc(group, slots,
                              peer_checks ? proxy::proxy_collectives::peer_checks::on : proxy::proxy_collectives::peer_checks::off,
                              inline_bytes);

  nvlink_config lcfg;
  std::vector<ncclComm_t> nccl;
  std::vector<nvlink_communicator> ls;
  if (loop) {
    ls = nvlink_communicator::create_loopback(n, 0, lcfg);
  } else {
    nccl.resize(n);
    int devs[2] = {0, 1};
    nk(ncclCommInitAll(nccl.data(), n, devs), "ncclCommInitAll");
    ls = nvlink_communicator::create_all(nccl, lcfg);
  }
  std::vector<rank_io> io(n);
  for (int r = 0; r < n; ++r) {
    ck(cudaSetDevice(dev(r)), "cudaSetDevice");
    ck(cudaStreamCreateWithFlags(&io[r].s, cudaStreamNonBlocking), "cudaStreamCreate");
    io[r].in = reinterpret_cast<char*>(group.symmetric(r));
    io[r].out = io[r].in + cap + 2048;
    ck(cudaMalloc(&io[r].pin, cap), "cudaMalloc");
    ck(cudaMalloc(&io[r].pout, cap), "cudaMalloc");
    ck(cudaMemset(io[r].in, 0x3c, cap), "cudaMemset");  // bf16 ~1.0: sums stay finite
    ck(cudaMemset(io[r].pin, 0x3c, cap), "cudaMemset");
  }
  ck(cudaSetDevice(0), "cudaSetDevice");

  enum class impl { proxy, loadstore, nccl };
  auto launch = [&](impl m, collective c, std::uint64_t count) {
    if (m == impl::nccl) nk(ncclGroupStart(), "ncclGroupStart");
    for (int r = 0; r < n; ++r) {
      ck(cudaSetDevice(dev(r)), "cudaSetDevice");
      if (m == impl::proxy) {
        proxy::collective_args a;
        a.coll = c;
        a.type = dtype::bfloat16;
        a.count = count;
        a.in = io[r].in;
        a.out = io[r].out;
        pc.launch(r, a, io[r].s);
      } else if (m == impl::loadstore) {
        switch (c) {
          case collective::all_reduce: ls[r].all_reduce(io[r].pin, io[r].pout, count, dtype::bfloat16, redop::sum, io[r].s); break;
          case collective::reduce_scatter: ls[r].reduce_scatter(io[r].pin, io[r].pout, count, dtype::bfloat16, redop::sum, io[r].s); break;
          case collective::all_gather: ls[r].all_gather(io[r].pin, io[r].pout, count, dtype::bfloat16, io[r].s); break;
          case collective::broadcast: ls[r].broadcast(io[r].pin, io[r].pout, count, dtype::bfloat16, 0, io[r].s); break;
          case collective::all_to_all: ls[r].all_to_all(io[r].pin, io[r].pout, count, dtype::bfloat16, io[r].s); break;
        }
      } else {
        switch (c) {
          case collective::all_reduce: nk(ncclAllReduce(io[r].pin, io[r].pout, count, ncclBfloat16, ncclSum, nccl[r], io[r].s), "nccl"); break;
          case collective::reduce_scatter: nk(ncclReduceScatter(io[r].pin, io[r].pout, count, ncclBfloat16, ncclSum, nccl[r], io[r].s), "nccl"); break;
          case collective::all_gather: nk(ncclAllGather(io[r].pin, io[r].pout, count, ncclBfloat16, nccl[r], io[r].s), "nccl"); break;
          case collective::broadcast: nk(ncclBroadcast(io[r].pin, io[r].pout, count, ncclBfloat16, 0, nccl[r], io[r].s), "nccl"); break;
          case collective::all_to_all: nk(ncclAlltoAll(io[r].pin, io[r].pout, count, ncclBfloat16, nccl[r], io[r].s), "nccl"); break;
        }
      }
    }
    if (m == impl::nccl) nk(ncclGroupEnd(), "ncclGroupEnd");
  };
  std::vector<cudaEvent_t> ev0(n), ev1(n);
  for (int r = 0; r < n; ++r) {
    ck(cudaSetDevice(dev(r)), "cudaSetDevice");
    ck(cudaEventCreate(&ev0[r]), "cudaEventCreate");
    ck(cudaEventCreate(&ev1[r]), "cudaEventCreate");
  }
  auto sync_all = [&] {
    for (int r = 0; r < n; ++r) {
      ck(cudaSetDevice(dev(r)), "cudaSetDevice");
      ck(cudaStreamSynchronize(io[r].s), "cudaStreamSynchronize");
    }
    std::string msg;
    if (pc.check(&msg) != status::ok) {
      std::fprintf(stderr, "proxy collective failed: %s\n", msg.c_str());
      std::exit(1);
    }
  };
  // microseconds per call: the slowest rank's stream, over `iters` calls after `warm`
  auto time_us = [&](impl m, collective c, std::uint64_t count, int it, int wu) {
    for (int i = 0; i < wu; ++i) launch(m, c, count);
    sync_all();
    for (int r = 0; r < n; ++r) {
      ck(cudaSetDevice(dev(r)), "cudaSetDevice");
      ck(cudaEventRecord(ev0[r], io[r].s), "cudaEventRecord");
    }
    for (int i = 0; i < it; ++i) launch(m, c, count);
    for (int r = 0; r < n; ++r) {
      ck(cudaSetDevice(dev(r)), "cudaSetDevice");
      ck(cudaEventRecord(ev1[r], io[r].s), "cudaEventRecord");
    }
    sync_all();
    float worst = 0;
    for (int r = 0; r < n; ++r) {
      float ms = 0;
      ck(cudaEventElapsedTime(&ms, ev0[r], ev1[r]), "cudaEventElapsedTime");
      worst = std::max(worst, ms);
    }
    return 1e3 * static_cast<double>(worst) / it;
  };

  std::string const where = loop ? "two loopback ranks on one GPU" : "one rank per GPU, GPUs 0 and 1";
  std::printf("# reccl_proxy_perf: %s, %s; bf16 sum; proxy: %d VTs (= CTAs per rank), %s receive areas in %u slots, %s%s, "
              "puts inline up to %u bytes\n",
              prop.name, where.c_str(), vts, area_s.c_str(), slots, unbatched ? "unbatched" : "batched submission", peer_checks ? ", peer checks" : "",
              pc.inline_bytes());
  std::printf("# %-14s %10s %11s %9s %11s %9s %5s %11s %9s %8s\n", "collective", "bytes", "proxy_us", "busbw", "ldst_us", "busbw",
              "ctas", "nccl_us", "busbw", "px/best");
  nlohmann::json J;
  J["bench"] = "reccl_proxy_perf";
  J["gpu"] = prop.name;
  J["placement"] = where;
  J["vts"] = vts;
  J["area_bytes"] = area;
  J["slots"] = slots;
  J["batched"] = !unbatched;
  J["peer_checks"] = peer_checks;
  J["inline_bytes"] = pc.inline_bytes();
  J["rows"] = nlohmann::json::array();
  for (auto const& cs : colls) {
    collective const c = parse_coll(cs);
    for (std::uint64_t b = min_b; b <= max_b; b *= static_cast<std::uint64_t>(factor)) {
      std::uint64_t const count = count_for(c, b, n);
      if (count == 0) continue;
      double const px = time_us(impl::proxy, c, count, iters, warm);
      double const ld = time_us(impl::loadstore, c, count, iters, warm);
      double const nc = loop ? 0.0 : time_us(impl::nccl, c, count, iters, warm);
      auto bw = [&](double us) { return us > 0 ? static_cast<double>(b) / (us * 1e3) * bus_factor(c, n) : 0.0; };
      int const ld_ctas = ls[0].plan_for(c, io[0].pin, io[0].pout, count, dtype::bfloat16).grid;
      double const best = nc > 0 ? std::min(ld, nc) : ld;
      std::printf("  %-14s %10llu %11.1f %9.1f %11.1f %9.1f %5d %11.1f %9.1f %8.2f\n", cs.c_str(), static_cast<unsigned long long>(b), px,
                  bw(px), ld, bw(ld), ld_ctas, nc, bw(nc), best / px);
      std::fflush(stdout);
      J["rows"].push_back({{"collective", cs}, {"bytes", b}, {"proxy_us", px}, {"proxy_busbw", bw(px)}, {"proxy_ctas_per_rank", vts},
                           {"loadstore_us", ld}, {"loadstore_busbw", bw(ld)}, {"loadstore_ctas", ld_ctas}, {"nccl_us", nc},
                           {"nccl_busbw", bw(nc)}, {"best_other_over_proxy", best / px}});
    }
  }

  // ---- overlap: a GEMM on every GPU beside an all-reduce loop
  if (gemm_n > 0) {
    int const gpus = loop ? 1 : n;
    std::vector<cublasHandle_t> blas(gpus);
    std::vector<cudaStream_t> gs(gpus);
    std::vector<__nv_bfloat16*> A(gpus), B(gpus), C(gpus);
    std::vector<cudaEvent_t> g0(gpus), g1(gpus);
    std::size_t const mat = static_cast<std::size_t>(gemm_n) * static_cast<std::size_t>(gemm_n);
    for (int d = 0; d < gpus; ++d) {
      ck(cudaSetDevice(d), "cudaSetDevice");
      ck(cudaStreamCreateWithFlags(&gs[d], cudaStreamNonBlocking), "cudaStreamCreate");
      bk(cublasCreate(&blas[d]), "cublasCreate");
      bk(cublasSetStream(blas[d], gs[d]), "cublasSetStream");
      ck(cudaMalloc(&A[d], mat * 2), "cudaMalloc");
      ck(cudaMalloc(&B[d], mat * 2), "cudaMalloc");
      ck(cudaMalloc(&C[d], mat * 2), "cudaMalloc");
      ck(cudaMemset(A[d], 0x3c, mat * 2), "cudaMemset");
      ck(cudaMemset(B[d], 0x3c, mat * 2), "cudaMemset");
      ck(cudaEventCreate(&g0[d]), "cudaEventCreate");
      ck(cudaEventCreate(&g1[d]), "cudaEventCreate");
    }
    float const one = 1.0f, zero = 0.0f;
    auto gemms = [&](int k) {
      for (int d = 0; d < gpus; ++d) {
        ck(cudaSetDevice(d), "cudaSetDevice");
        ck(cudaEventRecord(g0[d], gs[d]), "cudaEventRecord");
        for (int i = 0; i < k; ++i)
          bk(cublasGemmEx(blas[d], CUBLAS_OP_N, CUBLAS_OP_N, gemm_n, gemm_n, gemm_n, &one, A[d], CUDA_R_16BF, gemm_n, B[d], CUDA_R_16BF,
                          gemm_n, &zero, C[d], CUDA_R_16BF, gemm_n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
             "cublasGemmEx");
        ck(cudaEventRecord(g1[d], gs[d]), "cudaEventRecord");
      }
    };
    auto gemm_ms = [&] {  // per GEMM, the slowest GPU
      float worst = 0;
      for (int d = 0; d < gpus; ++d) {
        ck(cudaSetDevice(d), "cudaSetDevice");
        ck(cudaEventSynchronize(g1[d]), "cudaEventSynchronize");
        float ms = 0;
        ck(cudaEventElapsedTime(&ms, g0[d], g1[d]), "cudaEventElapsedTime");
        worst = std::max(worst, ms);
      }
      return static_cast<double>(worst);
    };
    gemms(3);
    double const probe = gemm_ms() / 3;
    int const k = gemm_iters > 0 ? gemm_iters : std::max(10, static_cast<int>(1000.0 / probe));
    gemms(k);
    double const alone = gemm_ms() / k;
    double const tflops = 2.0 * gemm_n * static_cast<double>(gemm_n) * gemm_n / (alone * 1e-3) / 1e12;
    std::uint64_t const count = ov_b / 2;
    std::printf("\n# overlap: bf16 GEMM %d^3 on every GPU (%.3f ms alone, %.0f TFLOP/s, %d GEMMs) beside a loop of %s all-reduces\n",
                gemm_n, alone, tflops, k, ov_s.c_str());
    std::printf("# %-10s %12s %14s %14s %12s %6s\n", "transport", "gemm_ms", "gemm_slowdown", "ar_us_alone", "ar_us_beside", "ctas");
    J["overlap"] = {{"gemm_n", gemm_n}, {"gemm_ms_alone", alone}, {"gemm_tflops", tflops}, {"gemms", k}, {"all_reduce_bytes", ov_b},
                    {"rows", nlohmann::json::array()}};
    std::vector<impl> ms{impl::proxy, impl::loadstore};
    if (!loop) ms.push_back(impl::nccl);
    for (impl m : ms) {
      double const ar_alone = time_us(m, collective::all_reduce, count, 5, 2);
      int const loops = static_cast<int>(alone * k * 1e3 / ar_alone) + 2;  // the all-reduces outlast the GEMMs
      for (int r = 0; r < n; ++r) {
        ck(cudaSetDevice(dev(r)), "cudaSetDevice");
        ck(cudaEventRecord(ev0[r], io[r].s), "cudaEventRecord");
      }
      for (int i = 0; i < loops; ++i) launch(m, collective::all_reduce, count);
      for (int r = 0; r < n; ++r) {
        ck(cudaSetDevice(dev(r)), "cudaSetDevice");
        ck(cudaEventRecord(ev1[r], io[r].s), "cudaEventRecord");
      }
      gemms(k);
      double const beside = gemm_ms() / k;
      sync_all();
      float ar_ms = 0;
      ck(cudaEventElapsedTime(&ar_ms, ev0[0], ev1[0]), "cudaEventElapsedTime");
      double const ar_beside = 1e3 * static_cast<double>(ar_ms) / loops;
      char const* nm = m == impl::proxy ? "proxy (CE)" : m == impl::loadstore ? "load/store" : "NCCL";
      int const ctas = m == impl::proxy ? vts : m == impl::loadstore ? ls[0].plan_for(collective::all_reduce, io[0].pin, io[0].pout, count,
                                                                                          dtype::bfloat16).grid
                                                                     : -1;
      std::printf("  %-10s %12.3f %13.1f%% %14.1f %12.1f %6d\n", nm, beside, 100.0 * (beside / alone - 1.0), ar_alone, ar_beside, ctas);
      std::fflush(stdout);
      J["overlap"]["rows"].push_back({{"transport", nm}, {"gemm_ms_beside", beside}, {"gemm_slowdown", beside / alone - 1.0},
                                      {"all_reduce_us_alone", ar_alone}, {"all_reduce_us_beside", ar_beside},
                                      {"all_reduce_loops", loops}, {"ctas_per_rank", ctas}});
    }
    for (int d = 0; d < gpus; ++d) {
      cublasDestroy(blas[d]);
      cudaFree(A[d]);
      cudaFree(B[d]);
      cudaFree(C[d]);
    }
  }
  if (!json_out.empty()) std::ofstream(json_out) << J.dump(2) << "\n";
  for (auto& c : nccl) ncclCommDestroy(c);
  return 0;
}
