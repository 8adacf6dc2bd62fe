// GPU test of the usual engine layouts: one process per GPU (forked before any CUDA call), each
// building its own reccl communicator on ncclCommInitRank; and, with no NCCL communicator, 2 and 3
// processes sharing GPU 0 on P2P windows (create_p2p: CUDA IPC over a shared-memory all-gather);
// and the load/store handle of transport::p2p on NCCL symmetric windows (one process per GPU). Every collective runs with each
// algorithm on random inputs, plain and registered buffers, eager and inside a CUDA graph, and is
// checked bitwise against the CPU reference of tests/device/support.cuh (rank order, fp32
// accumulation of 16-bit floats), computed on the host from the same generated inputs.
#include "../doctest_main.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <vector>

#include "../../bench/perf/reference.cuh"
#include "forked_ranks.hpp"
#include "reccl/host/p2p_collective.hpp"
#include "reccl/host/p2p_nccl.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "reccl/policy/schedule/one_shot.hpp"
#include "reccl/policy/schedule/ring.hpp"
#include "reccl/policy/telemetry/none.hpp"
#include "support.cuh"

using namespace gpu_test;

namespace {

/// What a rank runs: sizes, and whether in-graph replays and the largest count are included.
struct case_set {
  std::vector<std::uint64_t> counts;
  std::size_t buffer_bytes;  ///< per registered and per plain buffer
  std::vector<dtype> dtypes;
};

/// Every collective x dtype x count x algorithm (auto, one-shot, pipelined on plain buffers;
/// two-shot and direct on registered ones), eager and in a CUDA graph replayed 3 times, bitwise
/// against the CPU reference. Failures are counted in child_fails.
void every_case(reccl::nvlink_communicator& comm, int rank, int n, cudaStream_t s, case_set const& cs) {
  std::size_t const cap = cs.buffer_bytes;
  void* reg_in = comm.allocate(cap);
  void* reg_out = comm.allocate(cap);
  void *pin, *pout;
  TEST_CK(cudaMalloc(&pin, cap));
  TEST_CK(cudaMalloc(&pout, cap));
  std::uint32_t seed = 1000;
  for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                       collective::all_to_all})
    for (dtype t : cs.dtypes)
      for (std::uint64_t count : cs.counts) {
        ++seed;
        std::vector<unsigned char> const want = host_expected(c, t, redop::sum, 1 % n, count, rank, n, seed);
        for (algorithm a : {algorithm::automatic, algorithm::one_shot, algorithm::pipelined, algorithm::two_shot,
                            algorithm::direct})
          for (int graph = 0; graph < 2; ++graph) {
            bool const reg = a == algorithm::two_shot || a == algorithm::direct;
            if (a == algorithm::one_shot && count > 100000) continue;
            if (a == algorithm::two_shot && c != collective::all_reduce) continue;
            std::uint64_t const ie = count * in_segments(c, n), oe = count * out_segments(c, n);
            REQUIRE(std::max(ie, oe) * reccl::size_of(t) <= cap);
            void* in = reg ? reg_in : pin;
            void* out = reg ? reg_out : pout;
            reccl::bench::fill(t, in, ie, seed, rank, 0, s);
            reccl::bench::poison(t, out, oe, s);
            TEST_CK(cudaStreamSynchronize(s));
            reccl::launch_options lo;
            lo.algo = a;
            auto call = [&] {
              switch (c) {
                case collective::all_reduce: comm.all_reduce(in, out, count, t, redop::sum, s, lo); break;
                case collective::reduce_scatter: comm.reduce_scatter(in, out, count, t, redop::sum, s, lo); break;
                case collective::all_gather: comm.all_gather(in, out, count, t, s, lo); break;
                case collective::broadcast: comm.broadcast(in, out, count, t, 1 % n, s, lo); break;
                case collective::all_to_all: comm.all_to_all(in, out, count, t, s, lo); break;
              }
            };
            if (graph) {
              cudaGraph_t g;
              cudaGraphExec_t ge;
              TEST_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
              call();
              TEST_CK(cudaStreamEndCapture(s, &g));
              TEST_CK(cudaGraphInstantiate(&ge, g, 0));
              for (int k = 0; k < 3; ++k) TEST_CK(cudaGraphLaunch(ge, s));  // idempotent: same inputs, same output
              TEST_CK(cudaStreamSynchronize(s));
              TEST_CK(cudaGraphExecDestroy(ge));
              TEST_CK(cudaGraphDestroy(g));
            } else {
              call();
              TEST_CK(cudaStreamSynchronize(s));
            }
            comm.check();
            char what[160];
            std::snprintf(what, sizeof what, "rank %d of %d: %s %s count=%llu algo=%s graph=%d", rank, n, reccl::name(c).data(),
                          reccl::name(t).data(), static_cast<unsigned long long>(count), reccl::device::name(a), graph);
            std::uint64_t const wrong = count_wrong(t, out, want, what);
            EXPECT(wrong == 0, "%s: %llu wrong of %llu", what, static_cast<unsigned long long>(wrong),
                   static_cast<unsigned long long>(oe));
          }
      }
  TEST_CK(cudaFree(pin));
  TEST_CK(cudaFree(pout));
  comm.free(reg_out);  // collective on a P2P communicator: every rank, in the same order
  comm.free(reg_in);
}

int rank_main(int rank, int n, ncclUniqueId id) {
  TEST_CK(cudaSetDevice(rank));
  ncclComm_t nc;
  TEST_NK(ncclCommInitRank(&nc, n, id, rank));
  cudaStream_t s;
  TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    reccl::nvlink_communicator comm = reccl::nvlink_communicator::create(nc);
    every_case(comm, rank, n, s, {{3, 40000, (1u << 21) + 5}, 64u << 20, {dtype::bfloat16, dtype::float32, dtype::int64}});
  }  // reccl communicator torn down before the NCCL communicator
  TEST_NK(ncclCommFinalize(nc));
  TEST_NK(ncclCommDestroy(nc));
  return child_fails == 0 ? 0 : 1;
}

/// A small P2P configuration for processes that share one GPU: they take turns on it, so every
/// wait may last a time slice or more (a long deadline), and each holds its own scratch.
reccl::nvlink_config shared_gpu_config(std::uint64_t timeout_ns) {
  reccl::nvlink_config cfg;
  cfg.lanes = 1;
  cfg.max_ctas = 8;
  cfg.one_shot_slot_bytes = 16 << 10;
  cfg.ring_chunk_bytes = 8 << 10;
  cfg.timeout_ns = timeout_ns;
  return cfg;
}

/// A rank of processes sharing GPU 0 (exit code: 0 passed, skipped_exit_code without a GPU).
int shared_gpu_rank(int rank, int n, reccl::proxy::rank_exchange ex) {
  int dev = 0;
  if (cudaGetDeviceCount(&dev) != cudaSuccess || dev < 1) return reccl_test::skipped_exit_code;
  TEST_CK(cudaSetDevice(0));
  cudaStream_t s;
  TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    auto comm = reccl::nvlink_communicator::create_p2p(rank, n, std::move(ex), shared_gpu_config(test_timeout_ns(60)));
    EXPECT(comm.p2p() && !comm.loopback() && comm.nccl() == nullptr, "rank %d: not a P2P communicator", rank);
    every_case(comm, rank, n, s, {{1, 1001, 12347}, 1u << 20, {dtype::bfloat16, dtype::float32, dtype::int32}});
  }
  TEST_CK(cudaStreamDestroy(s));
  return child_fails == 0 ? 0 : 1;
}

}  // namespace

/// Forks `n` ranks, one per GPU, that share an NCCL unique id (rank 0 makes it); each runs
/// `rank_fn(rank, n, id)` and exits with its result. Skipped when there are fewer than n GPUs.
template <class RankFn>
void run_nccl_ranks(int n, RankFn&& rank_fn) {
  int fds[2];
  REQUIRE(pipe(fds) == 0);
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    pid_t const pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      close(r == 0 ? fds[0] : fds[1]);  // rank 0 only writes, the others only read: EOF if rank 0 dies
      int dev = 0;
      if (cudaGetDeviceCount(&dev) != cudaSuccess || dev < n) _exit(77);
      ncclUniqueId id;
      if (r == 0) {
        if (ncclGetUniqueId(&id) != ncclSuccess) _exit(2);
        for (int k = 1; k < n; ++k)
          if (write(fds[1], &id, sizeof(id)) != sizeof(id)) _exit(2);
      } else if (read(fds[0], &id, sizeof(id)) != sizeof(id)) {
        _exit(2);
      }
      int rc = 3;
      try {
        rc = rank_fn(r, n, id);
      } catch (std::exception const& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(stderr);
      _exit(rc);
    }
    kids.push_back(pid);
  }
  close(fds[0]);
  close(fds[1]);
  // a rank that finds fewer than n GPUs exits 77: every rank sees the same devices, so either all
  // of them skip or none does
  int skipped = 0;
  for (int r = 0; r < n; ++r) {
    int st = 0;
    waitpid(kids[r], &st, 0);
    REQUIRE(WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) {
      ++skipped;
      continue;
    }
    CHECK_MESSAGE(WEXITSTATUS(st) == 0, "rank " << r << " exit code " << WEXITSTATUS(st));
  }
  REQUIRE_MESSAGE((skipped == 0 || skipped == n), skipped << " of " << n << " ranks found too few GPUs");
  if (skipped) SKIP_CASE("needs " << n << " GPUs (one process per GPU), fewer here");
}

/// The load/store handle over NCCL symmetric windows (create_p2p_on_nccl): the composed ring and
/// one-shot all-reduce on int32 (exact in any order) against the CPU reference.
static int nccl_handle_rank(int rank, int n, ncclUniqueId id) {
  TEST_CK(cudaSetDevice(rank));
  ncclComm_t nc;
  TEST_NK(ncclCommInitRank(&nc, n, id, rank));
  cudaStream_t s;
  TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    reccl::p2p_config cfg;
    cfg.data_bytes = 8u << 20;
    reccl::p2p_communicator comm = reccl::create_p2p_on_nccl(nc, cfg);
    std::uint64_t const count = 1000003;
    std::int32_t *in, *out;
    TEST_CK(cudaMalloc(&in, count * 4));
    TEST_CK(cudaMalloc(&out, count * 4));
    std::vector<unsigned char> const want = host_expected(collective::all_reduce, dtype::int32, redop::sum, 0, count, rank, n, 77);
    auto one = [&]<class S>(char const* name) {
      reccl::bench::fill(dtype::int32, in, count, 77, rank, 0, s);
      reccl::bench::poison(dtype::int32, out, count, s);
      reccl::all_reduce<std::int32_t, S, reccl::transport::p2p, reccl::telemetry::none, reccl::allocator::equal>::run(
          comm, in, out, count, redop::sum, s);
      TEST_CK(cudaStreamSynchronize(s));
      comm.check();
      char what[96];
      std::snprintf(what, sizeof what, "rank %d: %s all-reduce on NCCL windows", rank, name);
      std::uint64_t const wrong = count_wrong(dtype::int32, out, want, what);
      EXPECT(wrong == 0, "%s: %llu wrong", what, static_cast<unsigned long long>(wrong));
    };
    one.template operator()<reccl::schedule::ring>("ring");
    one.template operator()<reccl::schedule::one_shot>("one_shot");
    TEST_CK(cudaFree(in));
    TEST_CK(cudaFree(out));
  }  // the window is deregistered before the NCCL communicator goes
  TEST_NK(ncclCommFinalize(nc));
  TEST_NK(ncclCommDestroy(nc));
  return child_fails == 0 ? 0 : 1;
}

TEST_CASE("one process per GPU: every collective and algorithm, eager and in a CUDA graph") { run_nccl_ranks(2, rank_main); }

TEST_CASE("one process per GPU: the load/store handle on NCCL symmetric windows runs the composed collectives") {
  run_nccl_ranks(2, nccl_handle_rank);
}

TEST_CASE("P2P (CUDA IPC, no NCCL): 2 and 3 processes sharing GPU 0, every collective and algorithm") {
  for (int n : {2, 3})
    gpu_test::run_forked_ranks(n, std::chrono::seconds(120), [](int rank, int nranks, reccl::proxy::rank_exchange ex) {
      return shared_gpu_rank(rank, nranks, std::move(ex));
    });
}

TEST_CASE("P2P: a rank configured differently fails creation on every rank, and a rank that never calls times out") {
  gpu_test::run_forked_ranks(2, std::chrono::seconds(120), [](int rank, int n, reccl::proxy::rank_exchange ex) {
    int dev = 0;
    if (cudaGetDeviceCount(&dev) != cudaSuccess || dev < 1) return reccl_test::skipped_exit_code;
    TEST_CK(cudaSetDevice(0));
    reccl::nvlink_config cfg = shared_gpu_config(test_timeout_ns(60));
    if (rank == 1) cfg.one_shot_slot_bytes *= 2;
    try {
      (void)reccl::nvlink_communicator::create_p2p(rank, n, ex, cfg);
      EXPECT(false, "rank %d: creation with a different configuration on rank 1 succeeded", rank);
    } catch (reccl::error const& e) {
      EXPECT(e.code() == reccl::status::mismatch, "rank %d: expected a mismatch, got: %s", rank, e.what());
    }
    // Now equal configurations; rank 1 never calls the all-reduce. Rank 0 gives up after its
    // deadline (2 s) and says so; rank 1 waits at teardown, which every rank takes together.
    reccl::nvlink_config short_cfg = shared_gpu_config(2'000'000'000ull);
    auto comm = reccl::nvlink_communicator::create_p2p(rank, n, ex, short_cfg);
    if (rank == 0) {
      cudaStream_t s;
      TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      void* buf;
      TEST_CK(cudaMalloc(&buf, 4096));
      TEST_CK(cudaMemset(buf, 0x11, 4096));
      TEST_CK(cudaDeviceSynchronize());
      auto const t0 = std::chrono::steady_clock::now();
      comm.all_reduce(buf, buf, 1024, reccl::dtype::float32, reccl::redop::sum, s);
      TEST_CK(cudaStreamSynchronize(s));
      double const took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      bool threw = false;
      try {
        comm.check();
      } catch (reccl::error const& e) {
        threw = true;
        EXPECT(e.code() == reccl::status::timeout, "rank 0: expected a timeout, got: %s", e.what());
        EXPECT(e.rank() > 0, "rank 0: the timeout names no missing peer: %s", e.what());
      }
      EXPECT(threw, "rank 0: a peer that never called did not time out");
      EXPECT(took < 30.0, "rank 0: the timeout took %.1f s (deadline 2 s)", took);
      TEST_CK(cudaFree(buf));
      TEST_CK(cudaStreamDestroy(s));
    }
    return child_fails == 0 ? 0 : 1;
  });
}
