// bench/perf/reccl_perf.cu -- reccl's collectives against NCCL, measured in the same process.
//
// One binary; the collective comes from the name it is called by (reccl_all_reduce_perf,
// reccl_reduce_scatter_perf, reccl_all_gather_perf, reccl_broadcast_perf, reccl_alltoall_perf are
// links to it) or from --op. One process per GPU (forked), as engines run. Flags and table follow
// nccl-tests: -b/-e/-f/-i sizes (K/M/G suffixes), -g GPUs, -n iterations, -w warm-up, -c check,
// -d dtype, -o op, -r root, -G graph launches (0: eager; N: -n calls captured in one CUDA graph,
// launched N times), -J JSON file. Per size: reccl out-of-place and in-place, NCCL on the same
// plain buffers and on NCCL symmetric windows, and the ratio of the better NCCL time to reccl's.
// Sizes are nccl-tests sizes (total buffer bytes); busbw uses nccl-tests' factors.
// --floor adds a latency floor measured in the same run: a CUDA graph of empty kernels (with and
// without programmatic dependent launch) and a two-GPU flag ping-pong over NVLink.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "reccl/host/communicator.hpp"
#include "reference.cuh"
#include "nccl_tests.hpp"

namespace {

using reccl::algorithm;
using reccl::collective;
using reccl::dtype;
using reccl::redop;

struct options {
  std::string op = "all_reduce";
  std::string min_bytes = "32M", max_bytes = "32M", step_bytes = "1M";
  double step_factor = 1.0;
  int ngpus = 2, iters = 20, warmup = 5, check = 1, root = 0, graph = 0, reg = 0, nccl = 1, reccl = 1, floor = 0;
  int pdl = 1, lane = 0, vts = 0, in_place = 1, ring_chunk = 0, max_ctas = 0;
  std::string dtype = "float", redop = "sum", json;
  std::vector<std::string> algos{"auto"};
  std::vector<int> ctas{0}, chunks{0};
  double timeout_s = 10.0;
};

dtype parse_dtype(std::string const& s) {
  if (s == "float" || s == "float32" || s == "f32") return dtype::float32;
  if (s == "half" || s == "float16" || s == "f16") return dtype::float16;
  if (s == "bfloat16" || s == "bf16") return dtype::bfloat16;
  if (s == "double" || s == "float64" || s == "f64") return dtype::float64;
  if (s == "int32" || s == "int") return dtype::int32;
  if (s == "int64") return dtype::int64;
  throw CLI::ValidationError("dtype", "unknown dtype " + s);
}
redop parse_redop(std::string const& s) {
  if (s == "sum") return redop::sum;
  if (s == "prod") return redop::prod;
  if (s == "min") return redop::min;
  if (s == "max") return redop::max;
  if (s == "avg") return redop::avg;
  throw CLI::ValidationError("op", "unknown op " + s);
}
algorithm parse_algo(std::string const& s) {
  if (s == "auto") return algorithm::automatic;
  if (s == "one_shot") return algorithm::one_shot;
  if (s == "pipelined") return algorithm::pipelined;
  if (s == "two_shot") return algorithm::two_shot;
  if (s == "direct") return algorithm::direct;
  throw CLI::ValidationError("algo", "unknown algorithm " + s);
}
ncclDataType_t nccl_type(dtype t) {
  switch (t) {
    case dtype::int32: return ncclInt32;
    case dtype::int64: return ncclInt64;
    case dtype::float16: return ncclFloat16;
    case dtype::bfloat16: return ncclBfloat16;
    case dtype::float32: return ncclFloat32;
    case dtype::float64: return ncclFloat64;
  }
  return ncclFloat32;
}
ncclRedOp_t nccl_op(redop o) {
  switch (o) {
    case redop::sum: return ncclSum;
    case redop::prod: return ncclProd;
    case redop::min: return ncclMin;
    case redop::max: return ncclMax;
    case redop::avg: return ncclAvg;
  }
  return ncclSum;
}

#define CK(x)                                                                                        \
  do {                                                                                               \
    cudaError_t e_ = (x);                                                                            \
    if (e_ != cudaSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
      std::exit(2);                                                                                  \
    }                                                                                                \
  } while (0)
#define NK(c, x)                                                                                     \
  do {                                                                                               \
    ncclResult_t r_ = (x);                                                                           \
    if (r_ != ncclSuccess) {                                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, reccl::detail::nccl_message(r_, c).c_str()); \
      std::exit(2);                                                                                  \
    }                                                                                                \
  } while (0)

struct rank_ctx {
  int rank = 0, n = 0;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  double* dtime = nullptr;
  int* dbar = nullptr;

  void barrier() {
    NK(comm, ncclAllReduce(dbar, dbar, 1, ncclInt32, ncclSum, comm, stream));
    CK(cudaStreamSynchronize(stream));
  }
  /// Largest value over ranks.
  double max_over_ranks(double v) {
    CK(cudaMemcpyAsync(dtime, &v, sizeof(v), cudaMemcpyHostToDevice, stream));
    NK(comm, ncclAllReduce(dtime, dtime, 1, ncclFloat64, ncclMax, comm, stream));
    CK(cudaMemcpyAsync(&v, dtime, sizeof(v), cudaMemcpyDeviceToHost, stream));
    CK(cudaStreamSynchronize(stream));
    return v;
  }
  /// Microseconds per call of `launch` (eager, or `graph` launches of a graph of `iters` calls).
  double time_us(std::function<void()> const& launch, int iters, int warmup, int graph) {
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    double us = 0;
    if (graph == 0) {
      for (int i = 0; i < warmup; ++i) launch();
      CK(cudaStreamSynchronize(stream));
      barrier();
      CK(cudaEventRecord(a, stream));
      for (int i = 0; i < iters; ++i) launch();
      CK(cudaEventRecord(b, stream));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      us = ms * 1e3 / iters;
    } else {
      for (int i = 0; i < warmup; ++i) launch();
      CK(cudaStreamSynchronize(stream));
      cudaGraph_t g;
      cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < iters; ++i) launch();
      CK(cudaStreamEndCapture(stream, &g));
      CK(cudaGraphInstantiate(&ge, g, 0));
      CK(cudaGraphLaunch(ge, stream));
      CK(cudaStreamSynchronize(stream));
      barrier();
      CK(cudaEventRecord(a, stream));
      for (int i = 0; i < graph; ++i) CK(cudaGraphLaunch(ge, stream));
      CK(cudaEventRecord(b, stream));
      CK(cudaEventSynchronize(b));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a, b));
      us = ms * 1e3 / (static_cast<double>(iters) * graph);
      CK(cudaGraphExecDestroy(ge));
      CK(cudaGraphDestroy(g));
    }
    CK(cudaEventDestroy(a));
    CK(cudaEventDestroy(b));
    return max_over_ranks(us);
  }
};

__global__ void empty_kernel() {}

__global__ void ping_pong_kernel(std::uint64_t* mine, std::uint64_t* peer, int rank, int rounds, unsigned long long* ns) {
  std::uint64_t const t0 = reccl::device::globaltimer();
  for (int i = 1; i <= rounds; ++i) {
    if (rank == 0) {
      reccl::device::store_release_sys(peer, static_cast<std::uint64_t>(i));
      while (reccl::device::load_acquire_sys(mine) < static_cast<std::uint64_t>(i)) {
      }
    } else {
      while (reccl::device::load_acquire_sys(mine) < static_cast<std::uint64_t>(i)) {
      }
      reccl::device::store_release_sys(peer, static_cast<std::uint64_t>(i));
    }
  }
  *ns = reccl::device::globaltimer() - t0;
}

nlohmann::json latency_floor(rank_ctx& ctx, reccl::nvlink_communicator& comm) {
  nlohmann::json j;
  // (a) a CUDA graph of 100 empty kernels, plain and with programmatic dependent launch
  for (int pdl = 0; pdl < 2; ++pdl) {
    auto launch = [&] {
      cudaLaunchConfig_t cfg{};
      cfg.gridDim = dim3(1);
      cfg.blockDim = dim3(32);
      cfg.stream = ctx.stream;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr;
      cfg.numAttrs = pdl;
      CK(cudaLaunchKernelEx(&cfg, empty_kernel));
    };
    double const us = ctx.time_us(launch, 100, 2, 20);
    j[pdl ? "empty_kernel_graph_pdl_us" : "empty_kernel_graph_us"] = us;
  }
  // (b) flag ping-pong between the two GPUs through a registered buffer (rank 0 <-> rank 1)
  if (ctx.n >= 2) {
    auto* buf = static_cast<std::uint64_t*>(comm.allocate(4096));
    CK(cudaMemset(buf, 0, 4096));
    CK(cudaDeviceSynchronize());
    ctx.barrier();
    unsigned long long* dns = nullptr;
    CK(cudaMalloc(&dns, sizeof(*dns)));
    int const rounds = 10000;
    if (ctx.rank < 2) {
      auto* peer = static_cast<std::uint64_t*>(comm.peer_pointer(buf, 1 - ctx.rank));
      ping_pong_kernel<<<1, 1, 0, ctx.stream>>>(buf, peer, ctx.rank, rounds, dns);
      CK(cudaGetLastError());
    }
    CK(cudaStreamSynchronize(ctx.stream));
    unsigned long long ns = 0;
    CK(cudaMemcpy(&ns, dns, sizeof(ns), cudaMemcpyDeviceToHost));
    double const one_way = ctx.max_over_ranks(ctx.rank == 0 ? ns / (2.0 * rounds) / 1e3 : 0.0);
    j["flag_one_way_us"] = one_way;
    CK(cudaFree(dns));
    comm.free(buf);
  }
  return j;
}

struct buffers {
  void* send = nullptr;
  void* recv = nullptr;
};

int run_rank(int rank, options const& o, ncclUniqueId id) {
  collective const coll = parse_coll(o.op);
  dtype const dt = parse_dtype(o.dtype);
  redop const op = parse_redop(o.redop);
  int const n = o.ngpus;
  std::size_t const es = reccl::size_of(dt);
  CK(cudaSetDevice(rank));
  rank_ctx ctx;
  ctx.rank = rank;
  ctx.n = n;
  NK(nullptr, ncclCommInitRank(&ctx.comm, n, id, rank));
  CK(cudaStreamCreateWithFlags(&ctx.stream, cudaStreamNonBlocking));
  CK(cudaMalloc(&ctx.dtime, sizeof(double)));
  CK(cudaMalloc(&ctx.dbar, sizeof(int)));
  CK(cudaMemset(ctx.dbar, 0, sizeof(int)));

  reccl::nvlink_config cfg;
  cfg.pdl = o.pdl != 0;
  cfg.timeout_ns = static_cast<std::uint64_t>(o.timeout_s * 1e9);
  if (o.lane >= cfg.lanes) cfg.lanes = o.lane + 1;
  if (o.ring_chunk > 0) cfg.ring_chunk_bytes = o.ring_chunk;
  if (o.max_ctas > 0) cfg.max_ctas = o.max_ctas;
  reccl::nvlink_communicator comm = reccl::nvlink_communicator::create(ctx.comm, cfg);

  std::uint64_t const min_b = parse_size(o.min_bytes), max_b = parse_size(o.max_bytes);
  std::uint64_t const step_b = parse_size(o.step_bytes);
  // per-rank send/recv bytes for the largest size (nccl-tests sizes: total buffer bytes)
  auto sizes_of = [&](std::uint64_t bytes, std::uint64_t& count, std::uint64_t& send_b, std::uint64_t& recv_b) {
    std::uint64_t const total = bytes / es;
    switch (coll) {
      case collective::all_reduce:
      case collective::broadcast: count = total; send_b = recv_b = count * es; break;
      case collective::reduce_scatter: count = total / n; send_b = count * n * es; recv_b = count * es; break;
      case collective::all_gather: count = total / n; send_b = count * es; recv_b = count * n * es; break;
      case collective::all_to_all: count = total / n; send_b = recv_b = count * n * es; break;
    }
  };
  std::uint64_t cnt_max, sb_max, rb_max;
  sizes_of(max_b, cnt_max, sb_max, rb_max);
  sb_max = std::max<std::uint64_t>(sb_max, 256);
  rb_max = std::max<std::uint64_t>(rb_max, 256);

  buffers plain, reg, symm;
  CK(cudaMalloc(&plain.send, sb_max));
  CK(cudaMalloc(&plain.recv, rb_max));
  if (o.reg) {
    reg.send = comm.allocate(sb_max);
    reg.recv = comm.allocate(rb_max);
  }
  ncclWindow_t wins[2] = {nullptr, nullptr};
  if (o.nccl) {
    NK(ctx.comm, ncclMemAlloc(&symm.send, sb_max));
    NK(ctx.comm, ncclMemAlloc(&symm.recv, rb_max));
    NK(ctx.comm, ncclCommWindowRegister(ctx.comm, symm.send, sb_max, &wins[0], NCCL_WIN_COLL_SYMMETRIC));
    NK(ctx.comm, ncclCommWindowRegister(ctx.comm, symm.recv, rb_max, &wins[1], NCCL_WIN_COLL_SYMMETRIC));
  }
  void* expected = nullptr;
  unsigned long long* dwrong = nullptr;
  CK(cudaMalloc(&expected, rb_max));
  CK(cudaMalloc(&dwrong, sizeof(*dwrong)));
  buffers const& rb = o.reg ? reg : plain;

  nlohmann::json rows = nlohmann::json::array();
  if (rank == 0) {
    std::printf("# reccl %s perf: %d ranks (one process per GPU), dtype %s, op %s, root %d, %s, reccl buffers %s, pdl %d\n",
                reccl::name(coll).data(), n, reccl::name(dt).data(), reccl::name(op).data(), o.root,
                o.graph ? ("graph: " + std::to_string(o.iters) + " calls x " + std::to_string(o.graph) + " launches").c_str()
                        : "eager",
                o.reg ? "registered" : "plain cudaMalloc", o.pdl);
    std::printf("#%11s %12s %8s %6s | %-16s %9s %7s %7s %6s | %9s %7s %6s | %9s %7s | %9s %7s | %6s\n", "size", "count",
                "type", "redop", "reccl algo/ctas", "oop us", "algbw", "busbw", "#wrong", "ip us", "busbw", "#wrong",
                "nccl us", "busbw", "symm us", "busbw", "ratio");
  }

  std::uint32_t seed = 12345;
  auto run_reccl = [&](void const* in, void* out, std::uint64_t count, reccl::launch_options const& lo) {
    switch (coll) {
      case collective::all_reduce: comm.all_reduce(in, out, count, dt, op, ctx.stream, lo); break;
      case collective::reduce_scatter: comm.reduce_scatter(in, out, count, dt, op, ctx.stream, lo); break;
      case collective::all_gather: comm.all_gather(in, out, count, dt, ctx.stream, lo); break;
      case collective::broadcast: comm.broadcast(in, out, count, dt, o.root, ctx.stream, lo); break;
      case collective::all_to_all: comm.all_to_all(in, out, count, dt, ctx.stream, lo); break;
    }
  };
  auto run_nccl = [&](void const* in, void* out, std::uint64_t count) {
    ncclDataType_t const t = nccl_type(dt);
    switch (coll) {
      case collective::all_reduce: NK(ctx.comm, ncclAllReduce(in, out, count, t, nccl_op(op), ctx.comm, ctx.stream)); break;
      case collective::reduce_scatter:
        NK(ctx.comm, ncclReduceScatter(in, out, count, t, nccl_op(op), ctx.comm, ctx.stream));
        break;
      case collective::all_gather: NK(ctx.comm, ncclAllGather(in, out, count, t, ctx.comm, ctx.stream)); break;
      case collective::broadcast: NK(ctx.comm, ncclBroadcast(in, out, count, t, o.root, ctx.comm, ctx.stream)); break;
      case collective::all_to_all:
        NK(ctx.comm, ncclGroupStart());
        for (int p = 0; p < n; ++p) {
          NK(ctx.comm, ncclSend(static_cast<char const*>(in) + p * count * es, count, t, p, ctx.comm, ctx.stream));
          NK(ctx.comm, ncclRecv(static_cast<char*>(out) + p * count * es, count, t, p, ctx.comm, ctx.stream));
        }
        NK(ctx.comm, ncclGroupEnd());
        break;
    }
  };
  // in-place pointers (nccl-tests layout); all_to_all has none
  auto in_place_ptrs = [&](buffers const& b, std::uint64_t count, void*& in, void*& out) -> bool {
    char* s = static_cast<char*>(b.send);
    char* r = static_cast<char*>(b.recv);
    switch (coll) {
      case collective::all_reduce:
      case collective::broadcast: in = out = r; return true;
      case collective::reduce_scatter: in = s; out = s + rank * count * es; return true;
      case collective::all_gather: out = r; in = r + rank * count * es; return true;
      case collective::all_to_all: return false;
    }
    return false;
  };
  // one checked run: fresh inputs, poisoned output, compare with the expected bits
  auto checked = [&](void* in, void* out, std::uint64_t count, std::uint64_t send_b, std::uint64_t recv_b,
                     reccl::launch_options const& lo, bool ip) -> long long {
    if (!o.check) return -1;
    ++seed;
    std::uint64_t const out_elems = recv_b / es;
    reccl::bench::poison(dt, out, out_elems, ctx.stream);
    // the input occupies [in, in + send_b); rank-local input element j is gen(seed, rank, j)
    if (ip && coll == collective::all_gather)
      reccl::bench::fill(dt, in, count, seed, rank, 0, ctx.stream);
    else
      reccl::bench::fill(dt, in, send_b / es, seed, rank, 0, ctx.stream);
    reccl::bench::expect(dt, coll, op, rank, n, o.root, seed, count, expected, out_elems, ctx.stream);
    CK(cudaStreamSynchronize(ctx.stream));
    ctx.barrier();
    run_reccl(in, out, count, lo);
    CK(cudaStreamSynchronize(ctx.stream));
    comm.check();
    // in-place reduce-scatter: the output is segment `rank` of the input buffer
    return static_cast<long long>(reccl::bench::count_diff(dt, out, expected, out_elems, dwrong, ctx.stream));
  };

  for (std::uint64_t bytes = min_b; bytes <= max_b;
       bytes = o.step_factor > 1.0 ? static_cast<std::uint64_t>(static_cast<double>(bytes) * o.step_factor) : bytes + step_b) {
    std::uint64_t count, send_b, recv_b;
    sizes_of(bytes, count, send_b, recv_b);
    if (count == 0) {
      if (step_b == 0 && o.step_factor <= 1.0) break;
      continue;
    }
    std::uint64_t const size = coll == collective::reduce_scatter ? send_b : recv_b;
    double const bf = bus_factor(coll, n);
    nlohmann::json row;
    row["bytes"] = size;
    row["count"] = count;

    // reccl out-of-place: every (algo, ctas, chunk) asked for; the best is reported
    double best = 1e300;
    std::string best_cfg;
    long long oop_wrong = -1;
    reccl::launch_options best_lo;
    nlohmann::json variants = nlohmann::json::array();
    if (o.reccl) {
      for (auto const& an : o.algos)
        for (int ct : o.ctas)
          for (int ch : o.chunks) {
            reccl::launch_options lo;
            lo.algo = parse_algo(an);
            lo.ctas = ct;
            lo.chunk_bytes = ch;
            lo.vts = o.vts;
            lo.lane = o.lane;
            reccl::plan pl;
            try {
              pl = comm.plan_for(coll, rb.send, rb.recv, count, dt, lo);
            } catch (reccl::error const& e) {
              continue;  // combination not valid at this size
            }
            long long const w = checked(rb.send, rb.recv, count, send_b, recv_b, lo, false);
            double const us = ctx.time_us([&] { run_reccl(rb.send, rb.recv, count, lo); }, o.iters, o.warmup, o.graph);
            comm.check();
            std::string const cfgname = std::string(reccl::device::name(pl.algo)) + "/" + std::to_string(pl.grid) +
                                        (pl.chunk_packs ? "/" + std::to_string(pl.chunk_packs * 16 / 1024) + "K" : "");
            variants.push_back({{"algo", reccl::device::name(pl.algo)}, {"ctas", pl.grid}, {"vts", pl.n_vts},
                                {"chunk_bytes", pl.chunk_packs * 16}, {"us", us}, {"busbw", size / us / 1e3 * bf},
                                {"wrong", w}});
            if (w > 0) oop_wrong = std::max(oop_wrong, w);
            else if (oop_wrong < 0) oop_wrong = w;
            if (us < best) {
              best = us;
              best_cfg = cfgname;
              best_lo = lo;
            }
          }
    }
    double ip_us = -1;
    long long ip_wrong = -1;
    void *ipi = nullptr, *ipo = nullptr;
    if (o.reccl && o.in_place && best < 1e300 && in_place_ptrs(rb, count, ipi, ipo)) {
      ip_wrong = checked(ipi, ipo, count, send_b, recv_b, best_lo, true);
      ip_us = ctx.time_us([&] { run_reccl(ipi, ipo, count, best_lo); }, o.iters, o.warmup, o.graph);
      comm.check();
    }
    double nccl_us = -1, symm_us = -1;
    if (o.nccl) {
      nccl_us = ctx.time_us([&] { run_nccl(plain.send, plain.recv, count); }, o.iters, o.warmup, o.graph);
      symm_us = ctx.time_us([&] { run_nccl(symm.send, symm.recv, count); }, o.iters, o.warmup, o.graph);
    }
    double const better = nccl_us > 0 ? std::min(nccl_us, symm_us) : -1;
    double const ratio = (better > 0 && best < 1e300) ? better / best : -1;
    row["reccl"] = variants;
    if (best < 1e300) {
      row["reccl_best"] = best_cfg;
      row["reccl_oop_us"] = best;
      row["reccl_oop_busbw"] = size / best / 1e3 * bf;
    }
    row["reccl_oop_wrong"] = oop_wrong;
    row["reccl_ip_us"] = ip_us;
    row["reccl_ip_wrong"] = ip_wrong;
    row["nccl_us"] = nccl_us;
    row["nccl_symm_us"] = symm_us;
    row["ratio_vs_better_nccl"] = ratio;
    rows.push_back(row);
    if (rank == 0) {
      auto bw = [&](double us) { return us > 0 ? size / us / 1e3 * bf : 0.0; };
      std::printf("%12llu %12llu %8s %6s | %-16s %9.2f %7.1f %7.1f %6lld | %9.2f %7.1f %6lld | %9.2f %7.1f | %9.2f %7.1f | %6.2f\n",
                  static_cast<unsigned long long>(size), static_cast<unsigned long long>(count), reccl::name(dt).data(),
                  reccl::name(op).data(), best_cfg.c_str(), best < 1e300 ? best : -1.0, best < 1e300 ? size / best / 1e3 : 0.0,
                  best < 1e300 ? bw(best) : 0.0, oop_wrong, ip_us, bw(ip_us), ip_wrong, nccl_us, bw(nccl_us), symm_us,
                  bw(symm_us), ratio);
      std::fflush(stdout);
    }
    if (o.step_factor <= 1.0 && step_b == 0) break;
  }

  nlohmann::json floor;
  if (o.floor) {
    floor = latency_floor(ctx, comm);
    if (rank == 0) {
      std::printf("# latency floor: empty-kernel graph %.2f us/kernel (with PDL %.2f), NVLink flag one-way %.2f us\n",
                  floor.value("empty_kernel_graph_us", -1.0), floor.value("empty_kernel_graph_pdl_us", -1.0),
                  floor.value("flag_one_way_us", -1.0));
    }
  }
  if (rank == 0 && !o.json.empty()) {
    cudaDeviceProp prop{};
    CK(cudaGetDeviceProperties(&prop, 0));
    int ncclv = 0;
    ncclGetVersion(&ncclv);
    char const* commit = std::getenv("RECCL_COMMIT");
    std::time_t const now = std::time(nullptr);
    char date[64];
    std::strftime(date, sizeof(date), "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
    nlohmann::json doc = {{"collective", reccl::name(coll)}, {"dtype", reccl::name(dt)}, {"redop", reccl::name(op)},
                          {"ranks", n}, {"root", o.root}, {"graph_launches", o.graph}, {"iters", o.iters},
                          {"reccl_buffers", o.reg ? "registered" : "plain"}, {"pdl", o.pdl}, {"nccl_version", ncclv},
                          {"device", prop.name}, {"commit", commit ? commit : ""}, {"date", date}, {"rows", rows}};
    if (o.floor) doc["floor"] = floor;
    std::ofstream(o.json) << doc.dump(1) << "\n";
  }

  ctx.barrier();
  CK(cudaFree(plain.send));
  CK(cudaFree(plain.recv));
  CK(cudaFree(expected));
  CK(cudaFree(dwrong));
  if (o.nccl) {
    NK(ctx.comm, ncclCommWindowDeregister(ctx.comm, wins[0]));
    NK(ctx.comm, ncclCommWindowDeregister(ctx.comm, wins[1]));
    NK(ctx.comm, ncclMemFree(symm.send));
    NK(ctx.comm, ncclMemFree(symm.recv));
  }
  { reccl::nvlink_communicator gone = std::move(comm); }
  NK(ctx.comm, ncclCommFinalize(ctx.comm));
  NK(ctx.comm, ncclCommDestroy(ctx.comm));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options o;
  std::string self = argv[0];
  self = self.substr(self.find_last_of('/') + 1);
  for (char const* c : {"all_reduce", "reduce_scatter", "all_gather", "broadcast", "alltoall"})
    if (self == std::string("reccl_") + c + "_perf") o.op = c;

  CLI::App app{"reccl collective benchmark (nccl-tests flags), reccl vs NCCL in the same process"};
  app.add_option("--op", o.op, "collective: all_reduce reduce_scatter all_gather broadcast alltoall");
  app.add_option("-b,--minbytes", o.min_bytes, "smallest size (K/M/G suffixes)");
  app.add_option("-e,--maxbytes", o.max_bytes, "largest size");
  app.add_option("-i,--stepbytes", o.step_bytes, "additive step (when -f is 1)");
  app.add_option("-f,--stepfactor", o.step_factor, "multiplicative step");
  app.add_option("-g,--ngpus", o.ngpus, "GPUs (one process each)")->check(CLI::Range(1, 8));
  app.add_option("-n,--iters", o.iters, "timed iterations (calls per graph with -G)")->check(CLI::PositiveNumber);
  app.add_option("-w,--warmup_iters", o.warmup, "warm-up iterations");
  app.add_option("-c,--check", o.check, "check results (bitwise, against the expected values)");
  app.add_option("-d,--datatype", o.dtype, "float half bfloat16 double int32 int64");
  app.add_option("-o,--op_type", o.redop, "sum prod min max avg");
  app.add_option("-r,--root", o.root, "broadcast root");
  app.add_option("-G,--cudagraph", o.graph, "0: eager; N: capture -n calls in a graph, launch it N times");
  app.add_option("-J,--output_file", o.json, "write results as JSON");
  app.add_option("-R,--registered", o.reg, "reccl buffers: 0 plain cudaMalloc, 1 allocate() (zero-copy)");
  app.add_option("--nccl", o.nccl, "measure NCCL (plain and symmetric) too");
  app.add_option("--reccl", o.reccl, "measure reccl");
  app.add_option("--in_place", o.in_place, "measure reccl in-place too");
  app.add_option("--algo", o.algos, "reccl algorithms to try: auto one_shot pipelined two_shot direct")->delimiter(',');
  app.add_option("--ctas", o.ctas, "reccl CTA counts to try (0: tuning table)")->delimiter(',');
  app.add_option("--chunk", o.chunks, "pipelined chunk bytes to try (0: tuning table)")->delimiter(',');
  app.add_option("--vts", o.vts, "VTs (0: tuning table)");
  app.add_option("--ring_chunk", o.ring_chunk, "ring slot payload bytes of the communicator (0: default)");
  app.add_option("--max_ctas", o.max_ctas, "largest grid of the communicator (0: default)");
  app.add_option("--lane", o.lane, "reccl lane");
  app.add_option("--pdl", o.pdl, "programmatic dependent launch");
  app.add_option("--timeout", o.timeout_s, "device wait timeout, seconds");
  app.add_option("--floor", o.floor, "measure the latency floor too");
  CLI11_PARSE(app, argc, argv);
  try {
    parse_coll(o.op);
    parse_dtype(o.dtype);
    parse_redop(o.redop);
    for (auto const& a : o.algos) parse_algo(a);
    parse_size(o.min_bytes);
    parse_size(o.max_bytes);
  } catch (CLI::Error const& e) {
    return app.exit(e);
  }

  // one process per GPU; rank 0 makes the NCCL id and hands it to the others through pipes
  int const n = o.ngpus;
  std::vector<std::array<int, 2>> pipes(n);
  for (auto& p : pipes)
    if (pipe(p.data()) != 0) return 2;
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    pid_t const pid = fork();
    if (pid == 0) {
      ncclUniqueId id;
      if (r == 0) {
        if (ncclGetUniqueId(&id) != ncclSuccess) _exit(2);
        for (int k = 1; k < n; ++k)
          if (write(pipes[k][1], &id, sizeof(id)) != sizeof(id)) _exit(2);
      } else if (read(pipes[r][0], &id, sizeof(id)) != sizeof(id)) {
        _exit(2);
      }
      int rc = 0;
      try {
        rc = run_rank(r, o, id);
      } catch (std::exception const& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
        rc = 3;
      }
      std::fflush(stdout);
      _exit(rc);
    }
    kids.push_back(pid);
  }
  int rc = 0;
  for (pid_t pid : kids) {
    int st = 0;
    waitpid(pid, &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) rc = 1;
  }
  return rc;
}
