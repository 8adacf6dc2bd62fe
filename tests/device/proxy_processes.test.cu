// The copy-engine proxy with one process per rank (the usual engine layout): each process holds one
// rank's window, queues and proxy thread and opens its peers' windows from CUDA IPC handles that
// the ranks all-gather at setup. Processes are forked before any CUDA call and all-gather through
// shared memory (process_exchange), so this runs on one GPU (every process on GPU 0) as well as on
// several (rank r on GPU r % count).
//
// Checked in every process against the CPU reference on random data, outputs poisoned first: the
// five collectives over dtypes, ops, odd sizes and placements; graph replays; a rank that skips a
// call (the others time out naming it, nobody hangs, the group is rebuilt); a rank whose count or
// split differs (every rank's kernels stop with mismatch naming the field, no output written); ranks whose layouts
// differ (every rank's constructor throws mismatch); a rank whose setup fails (every rank throws).
#include "../doctest_main.hpp"

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "forked_ranks.hpp"
#include "reccl/host/exchange.hpp"
#include "reccl/proxy/collective.hpp"
#include "support.cuh"

using namespace gpu_test;
using reccl::proxy::collective_args;
using reccl::proxy::copy_engine_config;
using reccl::proxy::copy_engine_group;
using reccl::proxy::proxy_collectives;

// The exchange an engine uses (ranks of an NCCL communicator; NCCL refuses two ranks on one GPU,
// so here it is compiled, not run).
static_assert(std::is_same_v<decltype(reccl::nccl_exchange(ncclComm_t{})), reccl::proxy::rank_exchange>);

namespace {

constexpr std::uint64_t guard = 64;
constexpr int skip_code = reccl_test::skipped_exit_code;

struct rank_setup {
  std::unique_ptr<copy_engine_group> g;
  std::unique_ptr<proxy_collectives> pc;
  cudaStream_t s = nullptr;
  std::uint64_t cap = 0;
  int me = 0, n = 0;

  rank_setup(int rank, int nranks, int vts, std::uint64_t cap_bytes, reccl::proxy::rank_exchange ex) : cap(cap_bytes), me(rank), n(nranks) {
    copy_engine_config c;
    c.nranks = nranks;
    c.n_vts = vts;
    c.area_bytes = 64 << 10;
    c.push_timeout_ns = test_timeout_ns(1);
    c.symmetric_bytes = 2 * (cap + guard) + 256;
    c.process_rank = rank;
    c.exchange = std::move(ex);
    g = std::make_unique<copy_engine_group>(c);
    pc = std::make_unique<proxy_collectives>(*g);
    TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  }
  ~rank_setup() {
    if (s) cudaStreamDestroy(s);
  }
  char* in() const { return reinterpret_cast<char*>(g->symmetric(me)); }
  char* out() const { return in() + cap + guard; }
};

// Every process draws every rank's input from the same generator, so each can compute its expected
// output; only its own input goes to its GPU.
struct case_result {
  long wrong = 0, guard_hit = 0;
  reccl::status st = reccl::status::ok;
  std::string msg;
};

case_result run_case(rank_setup& S, collective c, dtype t, redop op, std::uint64_t count, bool in_place, int root, std::mt19937_64& rng) {
  int const n = S.n, me = S.me;
  std::size_t const es = reccl::size_of(t);
  std::uint64_t const ib = count * in_segments(c, n) * es, ob = count * out_segments(c, n) * es;
  std::vector<std::vector<unsigned char>> in(n, std::vector<unsigned char>(ib));
  for (auto& v : in)
    for (std::size_t i = 0; i < count * in_segments(c, n); ++i) put_elem(v, i, es, random_bits(t, rng));
  std::vector<unsigned char> poison(ob + guard);
  for (auto& b : poison) b = static_cast<unsigned char>(rng());
  bool const rs_in_place = in_place && c == collective::reduce_scatter;
  auto const [inp, out] = collective_buffers(c, me, S.in(), S.out(), count * es, in_place);
  char* const guard_at = rs_in_place ? inp + ib : out + ob;
  if (!rs_in_place) TEST_CK(cudaMemcpy(out, poison.data(), ob, cudaMemcpyHostToDevice));
  TEST_CK(cudaMemcpy(guard_at, poison.data() + ob, guard, cudaMemcpyHostToDevice));
  if (!(in_place && c == collective::broadcast && me != root)) TEST_CK(cudaMemcpy(inp, in[me].data(), ib, cudaMemcpyHostToDevice));
  collective_args a;
  a.coll = c;
  a.type = t;
  a.op = op;
  a.count = count;
  a.in = inp;
  a.out = out;
  a.root = root;
  a.timeout_ns = test_timeout_ns(5);
  S.pc->launch(me, a, S.s);
  TEST_CK(cudaStreamSynchronize(S.s));
  case_result o;
  o.st = S.pc->check(&o.msg);
  std::vector<unsigned char> got(ob), gd(guard);
  TEST_CK(cudaMemcpy(got.data(), out, ob, cudaMemcpyDeviceToHost));
  TEST_CK(cudaMemcpy(gd.data(), guard_at, guard, cudaMemcpyDeviceToHost));
  std::vector<unsigned char> const want = expected_output(c, t, op, root, count, me, in);
  for (std::uint64_t i = 0; i < ob / es; ++i) o.wrong += get_elem(got, i, es) != get_elem(want, i, es);
  for (std::uint64_t i = 0; i < guard; ++i) o.guard_hit += gd[i] != poison[ob + i];
  return o;
}

void correctness(int me, int n, reccl::proxy::rank_exchange const& ex) {
  long cases = 0, bad = 0;
  for (int vts : {1, 3}) {
    auto S = std::make_unique<rank_setup>(me, n, vts, 8u << 20, ex);
    std::mt19937_64 rng(4242 + vts);
    for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                         collective::all_to_all}) {
      bool const reduce = c == collective::all_reduce || c == collective::reduce_scatter;
      for (dtype t : {dtype::int32, dtype::bfloat16, dtype::float32, dtype::float64}) {
        if (!reduce && t != dtype::bfloat16 && t != dtype::float32) continue;
        for (redop op : {redop::sum, redop::prod, redop::min, redop::max, redop::avg}) {
          if (!reduce && op != redop::sum) continue;
          std::vector<std::uint64_t> sizes = {1, 7, 4099};
          if (op == redop::sum) sizes.push_back((1u << 18) + 5);
          for (std::uint64_t count : sizes)
            for (bool ip : {false, true}) {
              if (ip && c == collective::all_to_all) continue;
              if (count * reccl::size_of(t) * static_cast<std::uint64_t>(n) > S->cap) continue;
              int const root = c == collective::broadcast ? static_cast<int>(count % static_cast<std::uint64_t>(n)) : 0;
              case_result const o = run_case(*S, c, t, op, count, ip, root, rng);
              ++cases;
              if (o.wrong || o.guard_hit || o.st != reccl::status::ok) {
                ++bad;
                if (bad <= 10)
                  std::fprintf(stderr, "rank %d: %s %s %s count %llu%s VTs %d: wrong %ld guard %ld %s\n", me, name(c).data(), name(t).data(),
                               name(op).data(), static_cast<unsigned long long>(count), ip ? " in-place" : "", vts, o.wrong, o.guard_hit,
                               o.msg.c_str());
              }
            }
        }
      }
    }
  }
  std::fprintf(stderr, "rank %d of %d: %ld cases, %ld wrong\n", me, n, cases, bad);
  EXPECT(bad == 0, "rank %d: %ld of %ld cases wrong", me, bad, cases);
  EXPECT(cases > 100, "rank %d: only %ld cases", me, cases);
}

void graph_replays(int me, int n, reccl::proxy::rank_exchange const& ex) {
  rank_setup S(me, n, 2, 4u << 20, ex);
  std::mt19937_64 rng(77);
  std::uint64_t const count = (1u << 16) + 9;
  std::size_t const es = 4;
  std::vector<std::vector<unsigned char>> in(n, std::vector<unsigned char>(count * es));
  collective_args a;
  a.coll = collective::all_reduce;
  a.type = dtype::float32;
  a.count = count;
  a.in = S.in();
  a.out = S.out();
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  TEST_CK(cudaStreamBeginCapture(S.s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < 3; ++i) S.pc->launch(me, a, S.s);
  TEST_CK(cudaStreamEndCapture(S.s, &graph));
  TEST_CK(cudaGraphInstantiate(&exec, graph, 0));
  cudaGraphDestroy(graph);
  long wrong = 0;
  for (int rep = 0; rep < 5; ++rep) {
    for (auto& v : in)
      for (std::size_t i = 0; i < count; ++i) put_elem(v, i, es, random_bits(dtype::float32, rng));
    TEST_CK(cudaMemcpy(S.in(), in[me].data(), count * es, cudaMemcpyHostToDevice));
    TEST_CK(cudaMemset(S.out(), 0xEE, count * es));
    TEST_CK(cudaGraphLaunch(exec, S.s));
    TEST_CK(cudaStreamSynchronize(S.s));
    std::vector<unsigned char> got(count * es);
    TEST_CK(cudaMemcpy(got.data(), S.out(), count * es, cudaMemcpyDeviceToHost));
    auto const want = expected_output(collective::all_reduce, dtype::float32, redop::sum, 0, count, me, in);
    for (std::size_t i = 0; i < count; ++i) wrong += get_elem(got, i, es) != get_elem(want, i, es);
  }
  cudaGraphExecDestroy(exec);
  std::string msg;
  EXPECT(S.pc->check(&msg) == reccl::status::ok, "rank %d: graph replays: %s", me, msg.c_str());
  EXPECT(wrong == 0, "rank %d: graph replays: %ld wrong", me, wrong);
}

// The last rank skips one all-reduce: the others time out naming it; then everyone rebuilds.
void missing_rank(int me, int n, reccl::proxy::rank_exchange const& ex) {
  {
    rank_setup S(me, n, 2, 1u << 20, ex);
    if (me != n - 1) {
      collective_args a;
      a.coll = collective::all_reduce;
      a.count = 50000;
      a.in = S.in();
      a.out = S.out();
      a.timeout_ns = 300'000'000ull;
      auto const t0 = std::chrono::steady_clock::now();
      S.pc->launch(me, a, S.s);
      TEST_CK(cudaStreamSynchronize(S.s));
      double const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::string msg;
      reccl::status const st = S.pc->check(&msg);
      std::fprintf(stderr, "rank %d: missing rank: %s after %.0f ms\n", me, msg.c_str(), ms);
      EXPECT(st == reccl::status::timeout, "rank %d: expected a timeout, got %s", me, name(st).data());
      EXPECT(msg.find("waiting for rank " + std::to_string(n - 1)) != std::string::npos, "rank %d: message does not name rank %d: %s", me,
             n - 1, msg.c_str());
      EXPECT(ms < 5000, "rank %d: the timeout took %.0f ms", me, ms);
    }
  }  // destroyed together
  rank_setup S(me, n, 2, 1u << 20, ex);
  std::mt19937_64 rng(9);
  case_result const o = run_case(S, collective::all_reduce, dtype::float32, redop::sum, 50000, false, 0, rng);
  EXPECT(o.wrong == 0 && o.st == reccl::status::ok, "rank %d: after the rebuild: wrong %ld %s", me, o.wrong, o.msg.c_str());
}

// The last rank passes another count, then another split: every rank's kernels stop with mismatch
// naming the field (the host sees one rank only: the peer checks in the kernels catch it), and no
// output is written; the group is rebuilt after each.
void argument_mismatch(int me, int n, reccl::proxy::rank_exchange const& ex) {
  for (collective c : {collective::all_gather, collective::all_reduce})
    for (int what = 0; what < 2; ++what) {
      rank_setup S(me, n, 2, 1u << 20, ex);
      std::uint64_t const count = 20000;
      collective_args a;
      a.coll = c;
      a.count = me == n - 1 && what == 0 ? count + 1 : count;
      if (me == n - 1 && what == 1) {
        a.vt_shares = reccl::equal_shares(2, reccl::all_live(2));
        a.vt_shares.w[0] += 1024;  // another valid split
        a.vt_shares.w[1] -= 1024;
      }
      a.in = S.in();
      a.out = S.out();
      a.timeout_ns = 2'000'000'000ull;
      std::vector<unsigned char> poison(count * static_cast<std::uint64_t>(n) * 4, 0xA5);
      TEST_CK(cudaMemcpy(S.out(), poison.data(), poison.size(), cudaMemcpyHostToDevice));
      TEST_CK(cudaMemset(S.in(), 0x11, count * 4 * static_cast<std::uint64_t>(n)));
      S.pc->launch(me, a, S.s);
      TEST_CK(cudaStreamSynchronize(S.s));
      std::string msg;
      reccl::status const st = S.pc->check(&msg);
      char const* field = what == 0 ? "count" : "vt_shares";
      if (me == 0) std::fprintf(stderr, "rank 0: %s, rank %d passes another %s: %s\n", name(c).data(), n - 1, field, msg.c_str());
      EXPECT(st == reccl::status::mismatch, "rank %d: %s: expected mismatch, got %s (%s)", me, name(c).data(), name(st).data(), msg.c_str());
      EXPECT(msg.find(field) != std::string::npos, "rank %d: message does not name %s: %s", me, field, msg.c_str());
      std::vector<unsigned char> got(poison.size());
      TEST_CK(cudaMemcpy(got.data(), S.out(), got.size(), cudaMemcpyDeviceToHost));
      EXPECT(got == poison, "rank %d: %s: output written despite the mismatch", me, name(c).data());
    }
}

// Constructs and destroys a group: its error's status and message (ok and "" if none).
std::pair<reccl::status, std::string> try_group(copy_engine_config const& c) {
  try {
    copy_engine_group g(c);
  } catch (reccl::error const& e) {
    return {e.code(), e.what()};
  }
  return {reccl::status::ok, {}};
}

// Ranks whose layouts differ, or one whose setup fails: every rank's constructor throws, naming it.
void setup_failures(int me, int n, reccl::proxy::rank_exchange const& ex) {
  {
    copy_engine_config c;
    c.nranks = n;
    c.n_vts = me == 1 ? 3 : 2;
    c.symmetric_bytes = 1 << 20;
    c.process_rank = me;
    c.exchange = ex;
    auto const [st, what] = try_group(c);
    EXPECT(st == reccl::status::mismatch, "rank %d: layouts differ: expected mismatch, got %s (%s)", me, name(st).data(), what.c_str());
    EXPECT(what.find("layout") != std::string::npos, "rank %d: message: %s", me, what.c_str());
    if (me == 0) std::fprintf(stderr, "rank 0: layouts differ: %s\n", what.c_str());
  }
  {
    copy_engine_config c;
    c.nranks = n;
    c.n_vts = 2;
    c.symmetric_bytes = me == n - 1 ? (std::uint64_t{1} << 50) : (1u << 20);  // the last rank's cudaMalloc fails
    c.process_rank = me;
    c.exchange = ex;
    auto const [st, what] = try_group(c);
    (void)cudaGetLastError();
    EXPECT(st == reccl::status::internal, "rank %d: a failed setup: expected internal, got %s", me, name(st).data());
    EXPECT(what.find("rank " + std::to_string(n - 1)) != std::string::npos, "rank %d: a failed setup: message %s", me, what.c_str());
    if (me == 0) std::fprintf(stderr, "rank 0: a rank's allocation fails: %s\n", what.c_str());
  }
  // a rank that is not this process's is refused by the host checks
  rank_setup S(me, n, 1, 1u << 20, ex);
  collective_args a;
  a.count = 16;
  a.in = S.in();
  a.out = S.out();
  bool refused = false;
  try {
    S.pc->launch((me + 1) % n, a, S.s);
  } catch (reccl::error const& e) {
    refused = std::string(e.what()).find("not in this process") != std::string::npos;
  }
  EXPECT(refused, "rank %d: a launch for another process's rank was not refused", me);
}

int child_main(int me, int n, reccl::proxy::rank_exchange ex) {
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) return skip_code;
  TEST_CK(cudaSetDevice(me % ngpu));
  correctness(me, n, ex);
  graph_replays(me, n, ex);
  missing_rank(me, n, ex);
  argument_mismatch(me, n, ex);
  setup_failures(me, n, ex);
  return child_fails == 0 ? 0 : 1;
}

void run_ranks(int n) { gpu_test::run_forked_ranks(n, std::chrono::seconds(120), child_main); }

}  // namespace

TEST_CASE("copy-engine proxy, one process per rank: 2 ranks") { run_ranks(2); }
TEST_CASE("copy-engine proxy, one process per rank: 3 ranks") { run_ranks(3); }
