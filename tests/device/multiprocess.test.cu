// GPU test of the usual engine layout: one process per GPU (forked before any CUDA call), each
// building its own reccl communicator on ncclCommInitRank. Every collective runs with each
// algorithm on random inputs, plain and registered buffers, eager and inside a CUDA graph, and is
// checked bitwise against the CPU reference of tests/device/support.cuh (rank order, fp32
// accumulation of 16-bit floats), computed on the host from the same generated inputs.
#include "../doctest_main.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cstdio>
#include <vector>

#include "../../bench/perf/reference.cuh"
#include "support.cuh"

using namespace gpu_test;

namespace {

int rank_main(int rank, int n, ncclUniqueId id) {
  TEST_CK(cudaSetDevice(rank));
  ncclComm_t nc;
  TEST_NK(ncclCommInitRank(&nc, n, id, rank));
  cudaStream_t s;
  TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  {
    reccl::nvlink_communicator comm = reccl::nvlink_communicator::create(nc);
    std::size_t const cap = 64u << 20;
    void* reg_in = comm.allocate(cap);
    void* reg_out = comm.allocate(cap);
    void *pin, *pout;
    TEST_CK(cudaMalloc(&pin, cap));
    TEST_CK(cudaMalloc(&pout, cap));
    std::uint32_t seed = 1000;
    for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                         collective::all_to_all})
      for (dtype t : {dtype::bfloat16, dtype::float32, dtype::int64})
        for (std::uint64_t count : {std::uint64_t(3), std::uint64_t(40000), std::uint64_t(1u << 21) + 5}) {
          ++seed;
          std::vector<unsigned char> const want = host_expected(c, t, redop::sum, 1 % n, count, rank, n, seed);
          for (algorithm a : {algorithm::automatic, algorithm::one_shot, algorithm::pipelined, algorithm::two_shot,
                              algorithm::direct})
            for (int graph = 0; graph < 2; ++graph) {
              bool const reg = a == algorithm::two_shot || a == algorithm::direct;
              if (a == algorithm::one_shot && count > 100000) continue;
              if (a == algorithm::two_shot && c != collective::all_reduce) continue;
              std::uint64_t const ie = count * in_segments(c, n), oe = count * out_segments(c, n);
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
              std::snprintf(what, sizeof what, "rank %d: %s %s count=%llu algo=%s graph=%d", rank, reccl::name(c).data(),
                            reccl::name(t).data(), static_cast<unsigned long long>(count), reccl::device::name(a), graph);
              std::uint64_t const wrong = count_wrong(t, out, want, what);
              EXPECT(wrong == 0, "%s: %llu wrong of %llu", what, static_cast<unsigned long long>(wrong),
                     static_cast<unsigned long long>(oe));
            }
        }
    TEST_CK(cudaFree(pin));
    TEST_CK(cudaFree(pout));
  }  // reccl communicator torn down before the NCCL communicator
  TEST_NK(ncclCommFinalize(nc));
  TEST_NK(ncclCommDestroy(nc));
  return child_fails == 0 ? 0 : 1;
}

}  // namespace

TEST_CASE("one process per GPU: every collective and algorithm, eager and in a CUDA graph") {
  int const n = 2;
  std::array<std::array<int, 2>, 2> pipes{};
  for (auto& p : pipes) REQUIRE(pipe(p.data()) == 0);
  std::vector<pid_t> kids;
  for (int r = 0; r < n; ++r) {
    pid_t const pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      int dev = 0;
      if (cudaGetDeviceCount(&dev) != cudaSuccess || dev < n) _exit(77);
      ncclUniqueId id;
      if (r == 0) {
        if (ncclGetUniqueId(&id) != ncclSuccess) _exit(2);
        if (write(pipes[1][1], &id, sizeof(id)) != sizeof(id)) _exit(2);
      } else if (read(pipes[1][0], &id, sizeof(id)) != sizeof(id)) {
        _exit(2);
      }
      int rc = 3;
      try {
        rc = rank_main(r, n, id);
      } catch (std::exception const& e) {
        std::fprintf(stderr, "rank %d: %s\n", r, e.what());
      }
      std::fflush(stderr);
      _exit(rc);
    }
    kids.push_back(pid);
  }
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
