// The composed collectives on the P2P transport with one process per rank: 2 and 3 processes forked
// before any CUDA call, every one on GPU 0, windows mapped through CUDA IPC after an all-gather of
// their handles over shared memory (process_exchange). Processes that share a GPU take turns on it
// (no MPS), so deadlines are long and the cases small.
//
// In every process, against the independent reference on random data (every process draws every
// rank's input from one generator), outputs and guard bands poisoned first: every collective ×
// fp32, bf16, int32 × sum, max × ring and one_shot (where the schedule supports it) × 1, 1001 and
// 65539 elements. Then a null buffer on one process (it throws; the others stop at once, naming it),
// and a process that never calls (the others time out naming it).
#define CUDA_NO_HALF  // reccl::half, not cuda_fp16.h's global `half`
#include "../doctest_main.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "p2p_reference.hpp"
#include "forked_ranks.hpp"
#include "reccl/host/p2p_collective.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "reccl/policy/schedule/one_shot.hpp"
#include "reccl/policy/schedule/ring.hpp"
#include "reccl/policy/telemetry/none.hpp"
#include "support.cuh"

using namespace p2p_test;
using gpu_test::child_fails;
using reccl::gpu_call_options;
using reccl::p2p_communicator;
using reccl::p2p_config;

namespace {

constexpr int skip_code = reccl_test::skipped_exit_code;
constexpr std::size_t guard_bytes = 256;
constexpr unsigned char poison_byte = 0xA5;

template <collective K, class S, class H>
using gpu_op = reccl::collective_op<K, gpu_t<H>, S, reccl::transport::p2p, reccl::telemetry::none, reccl::allocator::equal>;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// This process's rank: its communicator, stream and one device arena.
struct rank_setup {
  int me, n;
  p2p_communicator comm;
  cudaStream_t s = nullptr;
  char* arena = nullptr;
  std::size_t bytes;

  rank_setup(int rank, int nranks, reccl::proxy::rank_exchange ex, std::uint64_t timeout_ns, std::size_t arena_bytes)
      : me(rank), n(nranks), comm(p2p_communicator::create(rank, nranks, std::move(ex), config(timeout_ns))), bytes(arena_bytes) {
    TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    TEST_CK(cudaMalloc(&arena, bytes));
  }
  ~rank_setup() {
    (void)cudaStreamSynchronize(s);
    (void)cudaStreamDestroy(s);
    (void)cudaFree(arena);
  }
  static p2p_config config(std::uint64_t timeout_ns) {
    p2p_config c;
    c.timeout_ns = timeout_ns;
    c.data_bytes = 4u << 20;
    c.plan_max_ctas = 4;
    c.n_flags = 1024;
    return c;
  }
  std::string fault_text() const {
    try {
      comm.check();
    } catch (reccl::error const& e) {
      return e.what();
    }
    return {};
  }
};

/// One case on this process's rank; false (and a message on stderr) if anything is wrong.
template <collective K, class S, class H>
bool run_case(rank_setup& R, std::uint64_t count, redop op, std::mt19937_64& g, char const* sched) {
  int const n = R.n, me = R.me;
  std::uint64_t const se = send_elems(K, n, count), re = recv_elems(K, n, count);
  std::vector<std::vector<H>> in(static_cast<std::size_t>(n));
  for (auto& v : in) v = random_input<H>(g, se, op);
  int const root = static_cast<int>(count % static_cast<std::uint64_t>(n));
  std::size_t const send_off = guard_bytes, recv_off = (send_off + se * sizeof(H) + guard_bytes + 255) / 256 * 256;
  std::size_t const total = recv_off + re * sizeof(H) + guard_bytes;
  char what[200];
  std::snprintf(what, sizeof(what), "rank %d of %d: %s/%s %s %s count %llu", me, n, reccl::name(K).data(), sched,
                reccl::name(dtype_of<H>()).data(), reccl::name(op).data(), static_cast<unsigned long long>(count));
  if (total > R.bytes) {
    EXPECT(false, "%s: the arena is too small", what);
    return false;
  }
  TEST_CK(cudaMemset(R.arena, poison_byte, total));
  TEST_CK(cudaMemcpy(R.arena + send_off, in[static_cast<std::size_t>(me)].data(), se * sizeof(H), cudaMemcpyHostToDevice));
  // A memset, and a copy from pageable memory, may return before the data lands; the collective
  // runs on a non-blocking stream, which does not wait for the legacy stream's work.
  TEST_CK(cudaDeviceSynchronize());
  gpu_call_options o;
  o.n_vts = 2;
  o.root = root;
  try {
    gpu_op<K, S, H>::run(R.comm, reinterpret_cast<gpu_t<H> const*>(R.arena + send_off), reinterpret_cast<gpu_t<H>*>(R.arena + recv_off), count,
                         op, R.s, o);
  } catch (std::exception const& e) {
    EXPECT(false, "%s: run threw: %s", what, e.what());
    return false;
  }
  TEST_CK(cudaStreamSynchronize(R.s));
  std::string const fault = R.fault_text();
  EXPECT(fault.empty(), "%s: %s", what, fault.c_str());
  std::vector<unsigned char> all(total);
  TEST_CK(cudaMemcpy(all.data(), R.arena, total, cudaMemcpyDeviceToHost));
  std::vector<H> got(re);
  if (re) std::memcpy(got.data(), all.data() + recv_off, re * sizeof(H));
  std::string first;
  long const wrong = check_output<H>(K, op, root, count, me, in, got, first);
  EXPECT(wrong == 0, "%s: %ld elements wrong, first %s", what, wrong, first.c_str());
  long touched = 0;
  for (std::size_t i = 0; i < total; ++i) {
    bool const data = (i >= send_off && i < send_off + se * sizeof(H)) || (i >= recv_off && i < recv_off + re * sizeof(H));
    if (!data) touched += all[i] != poison_byte;
  }
  EXPECT(touched == 0, "%s: %ld guard-band bytes overwritten", what, touched);
  bool const kept = se == 0 || std::memcmp(all.data() + send_off, in[static_cast<std::size_t>(me)].data(), se * sizeof(H)) == 0;
  EXPECT(kept, "%s: the send buffer changed", what);
  return fault.empty() && wrong == 0 && touched == 0 && kept;
}

template <collective K, class S>
void cases_of(rank_setup& R, char const* sched, std::mt19937_64& g, long& cases, long& bad) {
  auto each_type = [&]<class H>() {
    for (redop op : {redop::sum, redop::max}) {
      if (!reccl::reduces(K) && op != redop::sum) continue;
      for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{1001}, std::uint64_t{65539}}) {
        ++cases;
        if (!run_case<K, S, H>(R, count, op, g, sched)) ++bad;
      }
    }
  };
  each_type.template operator()<float>();
  each_type.template operator()<reccl::bfloat16>();
  each_type.template operator()<std::int32_t>();
}

void correctness(int me, int n, reccl::proxy::rank_exchange const& ex) {
  using reccl::schedule::one_shot;
  using reccl::schedule::ring;
  rank_setup R(me, n, ex, gpu_test::test_timeout_ns(30), 8u << 20);
  std::mt19937_64 g(4242);
  long cases = 0, bad = 0;
  cases_of<collective::all_reduce, ring>(R, "ring", g, cases, bad);
  cases_of<collective::all_reduce, one_shot>(R, "one_shot", g, cases, bad);
  cases_of<collective::reduce_scatter, ring>(R, "ring", g, cases, bad);
  cases_of<collective::reduce_scatter, one_shot>(R, "one_shot", g, cases, bad);
  cases_of<collective::all_gather, ring>(R, "ring", g, cases, bad);
  cases_of<collective::all_gather, one_shot>(R, "one_shot", g, cases, bad);
  cases_of<collective::broadcast, ring>(R, "ring", g, cases, bad);
  cases_of<collective::broadcast, one_shot>(R, "one_shot", g, cases, bad);
  cases_of<collective::all_to_all, one_shot>(R, "one_shot", g, cases, bad);
  std::fprintf(stderr, "rank %d of %d: %ld cases, %ld wrong\n", me, n, cases, bad);
  EXPECT(cases == 117, "rank %d: %ld cases run, 117 expected", me, cases);
}

// The last rank passes a null send buffer: it throws naming null; the others stop within a second
// (deadline 10 s) and their check() names the last rank and the null buffer.
void null_buffer(int me, int n, reccl::proxy::rank_exchange const& ex) {
  rank_setup R(me, n, ex, 10'000'000'000ull, 1u << 20);
  int const bad = n - 1;
  std::uint64_t const count = 20000;
  TEST_CK(cudaMemset(R.arena, 0x3c, R.bytes));
  TEST_CK(cudaDeviceSynchronize());
  TEST_CK(cudaDeviceSynchronize());
  auto const t0 = std::chrono::steady_clock::now();
  std::string thrown;
  try {
    gpu_op<collective::all_reduce, reccl::schedule::ring, float>::run(
        R.comm, me == bad ? nullptr : reinterpret_cast<float const*>(R.arena), reinterpret_cast<float*>(R.arena + (512u << 10)), count,
        redop::sum, R.s, gpu_call_options{});
  } catch (reccl::error const& e) {
    thrown = e.what();
  }
  TEST_CK(cudaStreamSynchronize(R.s));
  double const s = seconds_since(t0);
  std::string const fault = R.fault_text();
  std::fprintf(stderr, "rank %d: null buffer on rank %d: after %.3f s: %s\n", me, bad, s, fault.c_str());
  if (me == bad) EXPECT(thrown.find("null") != std::string::npos, "rank %d: the bad call threw '%s'", me, thrown.c_str());
  else EXPECT(thrown.empty(), "rank %d: a good call threw '%s'", me, thrown.c_str());
  EXPECT(s < 2.0, "rank %d: stopped only after %.3f s (deadline 10 s)", me, s);
  EXPECT(fault.find("rank " + std::to_string(bad) + ": null buffer") != std::string::npos, "rank %d: check() gave '%s'", me, fault.c_str());
  EXPECT(fault.find("invalid_argument") != std::string::npos, "rank %d: check() gave '%s'", me, fault.c_str());
}

// The last rank never calls: the others time out naming it (one_shot: every rank waits for it
// directly), after about the 1 s deadline.
void missing_rank(int me, int n, reccl::proxy::rank_exchange const& ex) {
  rank_setup R(me, n, ex, 1'000'000'000ull, 1u << 20);
  int const missing = n - 1;
  if (me == missing) return;  // destroys its communicator with the others, never calling
  TEST_CK(cudaMemset(R.arena, 0x3c, R.bytes));
  TEST_CK(cudaDeviceSynchronize());
  TEST_CK(cudaDeviceSynchronize());
  auto const t0 = std::chrono::steady_clock::now();
  gpu_op<collective::all_reduce, reccl::schedule::one_shot, float>::run(R.comm, reinterpret_cast<float const*>(R.arena),
                                                                        reinterpret_cast<float*>(R.arena + (512u << 10)), 20000, redop::sum,
                                                                        R.s, gpu_call_options{});
  TEST_CK(cudaStreamSynchronize(R.s));
  double const s = seconds_since(t0);
  std::string const fault = R.fault_text();
  std::fprintf(stderr, "rank %d: rank %d missing: after %.3f s: %s\n", me, missing, s, fault.c_str());
  EXPECT(fault.find("timeout") != std::string::npos, "rank %d: check() gave '%s'", me, fault.c_str());
  EXPECT(fault.find("(peer " + std::to_string(missing) + ")") != std::string::npos, "rank %d: check() does not name rank %d: '%s'", me,
         missing, fault.c_str());
  EXPECT(s < 10.0, "rank %d: gave up only after %.3f s (deadline 1 s)", me, s);
}

int child_main(int me, int n, reccl::proxy::rank_exchange ex) {
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) return skip_code;
  TEST_CK(cudaSetDevice(0));
  correctness(me, n, ex);
  null_buffer(me, n, ex);
  missing_rank(me, n, ex);
  return child_fails == 0 ? 0 : 1;
}

void run_ranks(int n) { gpu_test::run_forked_ranks(n, std::chrono::seconds(300), child_main); }

}  // namespace

TEST_CASE("p2p, one process per rank on one GPU: 2 processes") { run_ranks(2); }
TEST_CASE("p2p, one process per rank on one GPU: 3 processes") { run_ranks(3); }
