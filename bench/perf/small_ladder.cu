// reccl_small_ladder -- where a small all-reduce's time goes: a ladder of one-shot kernels from the
// floor up to reccl's, each rung adding one mechanism of reccl's one-shot kernel
// (device/engine/one_shot.hpp), built from reccl's own device primitives and timed the way
// reccl_loopback_perf times reccl (graph_timing.hpp), next to reccl's all-reduce itself.
//
//   floor   LL packets: 8-byte stores of 4 data bytes + a 4-byte epoch, 256 threads (ll_floor)
//   lamport 16-byte Lamport packs (-0.0 sentinel, canonicalised input), re-poisoned after reading,
//           per-CTA sequence in memory; reccl's two-rank and n-rank receive loops; 256 threads
//   +512    512 threads per CTA (reccl's cta_threads)
//   +guard  the lane's status word read in the prologue, a CTA abort flag, every poll under the
//           lane guard (deadline and status checked every 256 polls), the abort checked at the store
//   +header the 16-byte header per slot: descriptor, pack count and sequence, polled and compared
//           per peer, then re-poisoned
//   +args   a 640-byte argument block by value (reccl's coll_args is about 600 bytes)
//   +pdl    launched with programmatic dependent launch (reccl's default)
//   reccl   nvlink_communicator::all_reduce, one-shot, the same CTA count, PDL off and on
//
// Every rung and reccl are checked against a host sum of random bf16 inputs (k/16, exact).
//
//   reccl_small_ladder --ranks 2,3,4 --bytes 1024,4096,16384,65536,262144 --json ladder.json
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "bench/perf/bf16_words.hpp"
#include "bench/perf/graph_timing.hpp"
#include "bench/perf/ll_floor_kernel.cuh"
#include "examples/common/check.hpp"
#include "reccl/host/communicator.hpp"

namespace {

using reccl::device::pack16;
using bf16 = __nv_bfloat16;
namespace dev = reccl::device;

constexpr int max_ranks = 4;
constexpr int max_ctas = 64;
constexpr int unroll = dev::one_shot_unroll;
constexpr std::size_t slot_bytes = 16 + 16u * unroll * 512;  // header + the most packs a CTA holds
constexpr std::size_t slots_bytes = 2ull * max_ranks * max_ctas * slot_bytes;

enum feature : unsigned { wide = 1, guarded = 2, header = 4, pdl = 8 };

struct ladder_args {
  char* slots[max_ranks];  ///< every rank's slots: [phase][source rank][cta], slot_bytes each
  std::uint32_t* status;   ///< this rank's status word
  std::uint64_t* seq;      ///< this rank's per-CTA call sequence
  pack16 const* in;
  pack16* out;
  int me, n, packs;  ///< packs: of the whole message (bf16, a multiple of 16 bytes)
  std::uint32_t desc;
  std::uint64_t timeout_ns;
};
struct big_args : ladder_args {
  char pad[640 - sizeof(ladder_args)];
};

template <bool Guarded>
__device__ bool poll(char const* p, pack16& x, dev::deadline_clock& d, int const* abort_flag, std::uint32_t* st) {
  if constexpr (Guarded) {
    return dev::lamport_poll(p, x, d, abort_flag, st);
  } else {
    do x = dev::load_pack_relaxed_sys(p);
    while (!dev::lamport_arrived(x));
    return true;
  }
}

/// One rung: reccl's one-shot kernel with the mechanisms F leaves out removed (bf16 sum).
template <unsigned F, class Args>
__global__ void __launch_bounds__((F & wide) ? 512 : 256, 1) lamport_rung(__grid_constant__ Args const a) {
  constexpr int threads = (F & wide) ? 512 : 256;
  constexpr bool G = (F & guarded) != 0;
  dev::pdl_wait();
  dev::pdl_trigger();
  int const cta = static_cast<int>(blockIdx.x), tid = static_cast<int>(threadIdx.x), me = a.me, n = a.n;
  int const first = static_cast<int>(static_cast<long long>(a.packs) * cta / gridDim.x);
  int const np = static_cast<int>(static_cast<long long>(a.packs) * (cta + 1) / gridDim.x) - first;
  pack16 mine[unroll];
#pragma unroll
  for (int u = 0; u < unroll; ++u) {
    int const k = tid + u * threads;
    if (k < np) mine[u] = dev::canonical<bf16>(dev::load_pack(a.in + first + k));
  }
  __shared__ int abort_flag;
  if (tid == 0) abort_flag = G ? dev::read_status(a.status) != 0 : 0;
  std::uint64_t const seq = a.seq[cta];
  __syncthreads();
  if (abort_flag) return;
  dev::deadline_clock deadline(a.timeout_ns);
  int const phase = static_cast<int>(seq & 1u);
  auto slot = [&](int owner, int src) {
    return a.slots[owner] + ((static_cast<std::size_t>(phase) * max_ranks + src) * max_ctas + cta) * slot_bytes;
  };
#pragma unroll
  for (int u = 0; u < unroll; ++u) {
    int const k = tid + u * threads;
    if (k < np)
      for (int p = 0; p < n; ++p)
        if (p != me) dev::store_pack_relaxed_sys(slot(p, me) + 16 + k * 16, mine[u]);
  }
  if constexpr ((F & header) != 0) {
    pack16 const h{{a.desc & 0x7fffffffu, static_cast<std::uint32_t>(np), 0x5eedu, static_cast<std::uint32_t>(seq & 0x7fffffffu)}};
    if (tid < n && tid != me) {
      dev::store_pack_relaxed_sys(slot(tid, me), h);
      char* const hp = slot(me, tid);
      pack16 g;
      if (poll<G>(hp, g, deadline, &abort_flag, a.status)) {
        if (g.w[0] != h.w[0] || g.w[1] != h.w[1] || g.w[3] != h.w[3]) {
          dev::raise_status(a.status, reccl::status::mismatch);
          abort_flag = 1;
        }
        dev::store_pack(hp, dev::lamport_poison());
      } else {
        abort_flag = 1;
      }
    }
  }
  bool ok = true;
  if (n == 2) {
    char* const base = slot(me, 1 - me) + 16;
    pack16 x[unroll];
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      int const k = tid + u * threads;
      if (k < np) x[u] = dev::load_pack_relaxed_sys(base + k * 16);
    }
#pragma unroll
    for (int u = 0; u < unroll; ++u) {
      int const k = tid + u * threads;
      if (k < np && ok && !dev::lamport_arrived(x[u])) ok = poll<G>(base + k * 16, x[u], deadline, &abort_flag, a.status);
    }
    if (ok) {
      bool const write = !G || !*static_cast<volatile int*>(&abort_flag);
#pragma unroll
      for (int u = 0; u < unroll; ++u) {
        int const k = tid + u * threads;
        if (k < np) {
          dev::store_pack(base + k * 16, dev::lamport_poison());
          pack16 const y = me == 0 ? dev::reduce_pair<bf16, reccl::redop::sum>(mine[u], x[u])
                                   : dev::reduce_pair<bf16, reccl::redop::sum>(x[u], mine[u]);
          if (write) a.out[first + k] = y;
        }
      }
    }
  } else {
#pragma unroll 1
    for (int u = 0; u < unroll && ok; ++u) {
      int const k = tid + u * threads;
      if (k >= np) break;
      dev::acc_pack<bf16> acc;
      ok = dev::fold_in_rank_order<bf16>(reccl::redop::sum, n, acc, [&](int q, pack16& x) {
        if (q == me) {
          x = dev::load_pack(a.in + first + k);
          return true;
        }
        char* const p = slot(me, q) + 16 + k * 16;
        bool const got = poll<G>(p, x, deadline, &abort_flag, a.status);
        if (got) dev::store_pack(p, dev::lamport_poison());
        return got;
      });
      if (ok && (!G || !*static_cast<volatile int*>(&abort_flag))) a.out[first + k] = dev::from_acc<bf16>(reccl::redop::sum, acc, n);
    }
  }
  __syncthreads();
  if (tid == 0) a.seq[cta] = seq + 1;
}

struct rank_mem {
  std::uint32_t* in = nullptr;  ///< bf16 pairs
  std::uint32_t* out = nullptr;
  char* slots = nullptr;      ///< Lamport slots (poisoned)
  std::uint64_t* llslots = nullptr;  ///< the floor's LL slots
  std::uint32_t* epochs = nullptr;   ///< the floor's per-CTA epochs
  std::uint32_t* status = nullptr;
  std::uint64_t* seq = nullptr;
  cudaStream_t stream = nullptr;
};

struct world {
  int n = 0, max_words = 0;
  std::vector<rank_mem> R;
  std::vector<std::vector<std::uint32_t>> host;  ///< every rank's input
  std::vector<cudaStream_t> streams;

  world(int nranks, int words, std::mt19937_64& g) : n(nranks), max_words(words), R(static_cast<std::size_t>(nranks)) {
    for (int r = 0; r < n; ++r) {
      auto& m = R[static_cast<std::size_t>(r)];
      CK(cudaMalloc(&m.in, static_cast<std::size_t>(words) * 4));
      CK(cudaMalloc(&m.out, static_cast<std::size_t>(words) * 4));
      CK(cudaMalloc(&m.slots, slots_bytes));
      CK(cudaMalloc(&m.llslots, ll_slot_words(n, words) * 8));
      CK(cudaMalloc(&m.epochs, max_ctas * 4));
      CK(cudaMalloc(&m.status, 4));
      CK(cudaMalloc(&m.seq, max_ctas * 8));
      CK(cudaStreamCreateWithFlags(&m.stream, cudaStreamNonBlocking));
      streams.push_back(m.stream);
      std::vector<std::uint32_t> h = reccl_bench::random_bf16_words(g, static_cast<std::size_t>(words));
      CK(cudaMemcpy(m.in, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
      host.push_back(std::move(h));
    }
  }
  static std::size_t ll_slot_words(int n, int words) { return 2ull * static_cast<std::size_t>(n) * static_cast<std::size_t>(words); }

  /// Fresh protocol state (every rank's counters at 0, slots poisoned) and poisoned outputs.
  void reset() {
    for (auto& m : R) {
      reccl::detail::poison_kernel<<<264, 256>>>(reinterpret_cast<std::uint32_t*>(m.slots), slots_bytes / 4);
      CK(cudaGetLastError());
      CK(cudaMemset(m.llslots, 0, ll_slot_words(n, max_words) * 8));
      CK(cudaMemset(m.epochs, 0, max_ctas * 4));
      CK(cudaMemset(m.status, 0, 4));
      CK(cudaMemset(m.seq, 0, max_ctas * 8));
      CK(cudaMemset(m.out, 0xff, static_cast<std::size_t>(max_words) * 4));
    }
    CK(cudaDeviceSynchronize());
  }

  /// Outputs that differ from the host sum over the first `words` words, on every rank.
  long wrong(int words, std::vector<void*> const* outs = nullptr) const {
    long bad = 0;
    std::vector<std::uint32_t> got(static_cast<std::size_t>(words));
    for (int r = 0; r < n; ++r) {
      void const* src = outs ? (*outs)[static_cast<std::size_t>(r)] : R[static_cast<std::size_t>(r)].out;
      CK(cudaMemcpy(got.data(), src, got.size() * 4, cudaMemcpyDeviceToHost));
      bad += reccl_bench::wrong_sums(host, got.data(), got.size());
    }
    return bad;
  }
};

template <unsigned F, class Args>
void launch_rung(Args const& a, int ctas, cudaStream_t s) {
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(static_cast<unsigned>(ctas));
  cfg.blockDim = dim3((F & wide) ? 512 : 256);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = (F & pdl) ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, lamport_rung<F, Args>, a));
}

/// Every rung is timed and checked the same way: `issue(rank)` captured `iters` times per rank,
/// the median of `reps` replays, then the outputs (`outs`, or the world's) against the sums.
template <class Issue>
double time_case(world& w, int words, int iters, int reps, long& bad, Issue&& issue, std::vector<void*> const* outs = nullptr) {
  auto exec = reccl_bench::capture_per_rank(w.streams, iters, issue);
  double const us = reccl_bench::time_graphs(w.streams, exec, iters, reps);
  CK(cudaDeviceSynchronize());
  bad = w.wrong(words, outs);
  return us;
}

template <unsigned F, class Args>
double time_rung(world& w, int words, int ctas, int iters, int reps, long& bad) {
  w.reset();
  std::vector<Args> args(static_cast<std::size_t>(w.n));
  for (int r = 0; r < w.n; ++r) {
    Args& a = args[static_cast<std::size_t>(r)];
    a = Args{};
    for (int q = 0; q < w.n; ++q) a.slots[q] = w.R[static_cast<std::size_t>(q)].slots;
    auto const& m = w.R[static_cast<std::size_t>(r)];
    a.status = m.status;
    a.seq = m.seq;
    a.in = reinterpret_cast<pack16 const*>(m.in);
    a.out = reinterpret_cast<pack16*>(m.out);
    a.me = r;
    a.n = w.n;
    a.packs = words / 4;
    a.desc = 0x1234567u;
    a.timeout_ns = 2'000'000'000ull;
  }
  return time_case(w, words, iters, reps, bad, [&](int r) { launch_rung<F>(args[static_cast<std::size_t>(r)], ctas, w.streams[static_cast<std::size_t>(r)]); });
}

double time_floor(world& w, int words, int ctas, int iters, int reps, long& bad) {
  w.reset();
  ll_floor_peers p{};
  for (int q = 0; q < w.n; ++q) p.slots[q] = w.R[static_cast<std::size_t>(q)].llslots;
  return time_case(w, words, iters, reps, bad, [&](int r) {
    auto const& m = w.R[static_cast<std::size_t>(r)];
    ll_floor_allreduce<<<ctas, 256, 0, m.stream>>>(m.in, m.out, p, r, w.n, m.epochs, words);
  });
}

double time_reccl(world& w, std::vector<reccl::nvlink_communicator>& comms, int words, int ctas, int iters, int reps, long& bad) {
  w.reset();
  reccl::launch_options o;
  o.algo = reccl::algorithm::one_shot;
  o.ctas = ctas;
  std::size_t const count = static_cast<std::size_t>(words) * 2;
  std::vector<void*> outs;
  for (auto& m : w.R) outs.push_back(m.out);
  return time_case(w, words, iters, reps, bad, [&](int r) {
    auto const& m = w.R[static_cast<std::size_t>(r)];
    comms[static_cast<std::size_t>(r)].all_reduce(m.in, m.out, count, reccl::dtype::bfloat16, reccl::redop::sum, m.stream, o);
  }, &outs);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a ladder of one-shot all-reduce kernels from the floor to reccl's, on loopback ranks of one GPU"};
  std::vector<int> ranks{2, 3, 4}, sizes{1024, 4096, 16384, 65536, 262144}, ctas_opt;
  int iters = 100, reps = 20, rounds = 3;
  std::string json_path;
  app.add_option("--ranks", ranks, "loopback rank counts")->delimiter(',')->check(CLI::Range(2, max_ranks));
  app.add_option("--bytes", sizes, "message bytes per rank (multiples of 16, at most 2 MiB)")->delimiter(',');
  app.add_option("--ctas", ctas_opt, "CTA count per size (default: reccl's table, ceil(bytes / 8 KiB))")->delimiter(',');
  app.add_option("--iters", iters, "calls per CUDA graph")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "graph replays (the median is reported)")->check(CLI::PositiveNumber);
  app.add_option("--rounds", rounds, "rounds over every rung (rungs interleave; the median round is reported)")->check(CLI::PositiveNumber);
  app.add_option("--json", json_path, "write every measurement here");
  CLI11_PARSE(app, argc, argv);
  for (int b : sizes)
    if (b % 16 != 0 || b <= 0 || b > (2 << 20)) {
      std::fprintf(stderr, "--bytes: %d is not a positive multiple of 16 up to 2 MiB\n", b);
      return 2;
    }

  int const max_words = *std::max_element(sizes.begin(), sizes.end()) / 4;
  nlohmann::json out = {{"tool", "reccl_small_ladder"}, {"iters", iters}, {"reps", reps}, {"rounds", rounds}, {"results", nlohmann::json::array()}};
  std::mt19937_64 g(11);
  std::vector<std::string> const names{"floor", "lamport", "+512", "+guard", "+header", "+args", "+pdl", "reccl pdl0", "reccl pdl1"};
  std::printf("%5s %8s %4s", "ranks", "bytes", "ctas");
  for (auto const& nm : names) std::printf(" %10s", nm.c_str());
  std::printf("\n");
  for (int n : ranks) {
    world w(n, max_words, g);
    reccl::nvlink_config c0, c1;
    c0.pdl = false;
    c1.pdl = true;
    auto comm0 = reccl::nvlink_communicator::create_loopback(n, 0, c0);
    auto comm1 = reccl::nvlink_communicator::create_loopback(n, 0, c1);
    for (std::size_t si = 0; si < sizes.size(); ++si) {
      int const bytes = sizes[si], words = bytes / 4;
      int const ctas = si < ctas_opt.size() ? ctas_opt[si] : std::clamp((bytes + 8191) / 8192, 1, max_ctas);
      if (words / 4 > ctas * unroll * 256) {
        std::printf("%5d %8d %4d  skipped: more packs than %d CTAs of 256 threads hold\n", n, bytes, ctas, ctas);
        continue;
      }
      std::vector<std::vector<double>> t(names.size());
      std::vector<long> bad(names.size(), 0);
      for (int round = 0; round < rounds; ++round) {
        long b = 0;
        std::size_t i = 0;
        auto rec = [&](double us) {
          t[i].push_back(us);
          bad[i] += b;
          ++i;
        };
        rec(time_floor(w, words, ctas, iters, reps, b));
        rec(time_rung<0, ladder_args>(w, words, ctas, iters, reps, b));
        rec(time_rung<wide, ladder_args>(w, words, ctas, iters, reps, b));
        rec(time_rung<wide | guarded, ladder_args>(w, words, ctas, iters, reps, b));
        rec(time_rung<wide | guarded | header, ladder_args>(w, words, ctas, iters, reps, b));
        rec(time_rung<wide | guarded | header, big_args>(w, words, ctas, iters, reps, b));
        rec(time_rung<wide | guarded | header | pdl, big_args>(w, words, ctas, iters, reps, b));
        rec(time_reccl(w, comm0, words, ctas, iters, reps, b));
        rec(time_reccl(w, comm1, words, ctas, iters, reps, b));
      }
      std::printf("%5d %8d %4d", n, bytes, ctas);
      nlohmann::json row = {{"ranks", n}, {"bytes", bytes}, {"ctas", ctas}};
      for (std::size_t i = 0; i < names.size(); ++i) {
        std::vector<double> s = t[i];
        std::sort(s.begin(), s.end());
        double const med = s[s.size() / 2];
        std::printf(" %9.2f%s", med, bad[i] ? "!" : " ");
        row[names[i]] = {{"median_us", med}, {"rounds_us", t[i]}, {"wrong", bad[i]}};
      }
      std::printf("\n");
      out["results"].push_back(row);
      std::fflush(stdout);
    }
  }
  std::printf("(median of %d rounds of the median of %d replays of %d calls; '!' marks wrong outputs)\n", rounds, reps, iters);
  if (!json_path.empty()) std::ofstream(json_path) << out.dump(1) << "\n";
  return 0;
}
