// The five collectives over the copy-engine proxy (reccl/proxy/collective.hpp): every op, dtype,
// odd and unaligned size, in and out of place, 2 and 3 ranks, 1 and 3 VTs, against the CPU
// reference on random data (outputs poisoned first, guard bytes checked); back-to-back calls and
// CUDA-graph replays that continue the step counters; bad input rejected on the host; a rank that
// never arrives ends in a timeout naming the rank and VT, no hang; any Allocator split (uneven shares,
// a masked VT) gives the same results. Ranks are loopback ranks on GPU 0; the full matrix also
// runs with one rank per GPU, a case skipped on fewer than two GPUs.
#include "../doctest_main.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <random>
#include <vector>

#include "reccl/policy/allocator/proportional.hpp"
#include "reccl/proxy/collective.hpp"
#include "support.cuh"

using namespace gpu_test;
using reccl::proxy::collective_args;
using reccl::proxy::copy_engine_config;
using reccl::proxy::copy_engine_group;
using reccl::proxy::proxy_collectives;

namespace {

constexpr std::uint64_t guard = 64;

// n ranks with in/out buffers at the same offsets of their symmetric regions.
struct setup {
  std::unique_ptr<copy_engine_group> g;
  std::unique_ptr<proxy_collectives> pc;
  std::vector<cudaStream_t> s;
  std::uint64_t cap = 0;  // bytes of each of in and out (guard excluded)
  int n = 0;

  setup(int nranks, int n_vts, std::uint64_t cap_bytes, bool two_gpus, std::uint64_t area = 64 << 10, std::uint32_t slots = 4,
        proxy_collectives::peer_checks checks = proxy_collectives::peer_checks::automatic,
        std::uint32_t inline_bytes = proxy_collectives::default_inline_bytes) {
    n = nranks;
    cap = cap_bytes;
    copy_engine_config c;
    c.nranks = nranks;
    c.n_vts = n_vts;
    c.area_bytes = area;
    c.queue_capacity = 1024;
    c.push_timeout_ns = test_timeout_ns(1);
    c.symmetric_bytes = 2 * (cap + guard) + 256;
    if (two_gpus) c.devices = {0, 1};
    g = std::make_unique<copy_engine_group>(c);
    pc = std::make_unique<proxy_collectives>(*g, slots, checks, inline_bytes);
    for (int r = 0; r < n; ++r) {
      TEST_CK(cudaSetDevice(g->memory(r).device));
      cudaStream_t x;
      TEST_CK(cudaStreamCreateWithFlags(&x, cudaStreamNonBlocking));
      s.push_back(x);
    }
    TEST_CK(cudaSetDevice(0));
  }
  ~setup() {
    for (auto x : s) cudaStreamDestroy(x);
  }
  char* in(int r) const { return reinterpret_cast<char*>(g->symmetric(r)); }
  char* out(int r) const { return reinterpret_cast<char*>(g->symmetric(r)) + cap + guard; }
  void sync() {
    for (int r = 0; r < n; ++r) {
      TEST_CK(cudaSetDevice(g->memory(r).device));
      TEST_CK(cudaStreamSynchronize(s[r]));
    }
    TEST_CK(cudaSetDevice(0));
  }
};

struct outcome {
  long wrong = 0, guard_hit = 0;
  reccl::status st = reccl::status::ok;
  std::string msg;
};

// Rank r's input and output for collective c (collective_buffers), `shift` bytes off the buffers'
// starts (unaligned cases).
std::pair<char*, char*> buffers(setup const& S, collective c, int r, std::uint64_t seg_bytes, bool in_place, std::uint64_t shift) {
  return collective_buffers(c, r, S.in(r) + shift, S.out(r) + shift, seg_bytes, in_place);
}

// One collective on every rank, random inputs, outputs and guards poisoned, checked against the
// CPU reference.
outcome run_case(setup& S, collective c, dtype t, redop op, std::uint64_t count, bool in_place, int root, std::uint64_t offset_elems,
                 std::mt19937_64& rng, reccl::shares const& vt_shares = {}) {
  int const n = S.n;
  std::size_t const es = reccl::size_of(t);
  std::uint64_t const ib = count * in_segments(c, n) * es, ob = count * out_segments(c, n) * es;
  std::uint64_t const shift = offset_elems * es;
  REQUIRE(ib + shift <= S.cap);
  REQUIRE(ob + shift <= S.cap);
  bool const rs_in_place = in_place && c == collective::reduce_scatter;
  std::vector<std::vector<unsigned char>> in(n, std::vector<unsigned char>(ib));
  for (auto& v : in)
    for (std::size_t i = 0; i < count * in_segments(c, n); ++i) put_elem(v, i, es, random_bits(t, rng));
  std::vector<unsigned char> poison(ob + guard);
  for (auto& b : poison) b = static_cast<unsigned char>(rng());
  // the guard follows the output, or the input when the output lies inside it
  auto guard_at = [&](int r) {
    auto [i, o] = buffers(S, c, r, count * es, in_place, shift);
    return rs_in_place ? i + ib : o + ob;
  };
  for (int r = 0; r < n; ++r) {
    TEST_CK(cudaSetDevice(S.g->memory(r).device));
    auto [inp, out] = buffers(S, c, r, count * es, in_place, shift);
    if (!rs_in_place) TEST_CK(cudaMemcpy(out, poison.data(), ob, cudaMemcpyHostToDevice));
    TEST_CK(cudaMemcpy(guard_at(r), poison.data() + ob, guard, cudaMemcpyHostToDevice));
    // an in-place broadcast's non-root output stays poisoned: only the root's input is read
    if (!(in_place && c == collective::broadcast && r != root)) TEST_CK(cudaMemcpy(inp, in[r].data(), ib, cudaMemcpyHostToDevice));
  }
  for (int r = 0; r < n; ++r) {
    auto [inp, out] = buffers(S, c, r, count * es, in_place, shift);
    collective_args a;
    a.coll = c;
    a.type = t;
    a.op = op;
    a.count = count;
    a.in = inp;
    a.out = out;
    a.root = root;
    a.timeout_ns = test_timeout_ns(5);
    a.vt_shares = vt_shares;
    S.pc->launch(r, a, S.s[r]);
  }
  S.sync();
  outcome o;
  o.st = S.pc->check(&o.msg);
  for (int r = 0; r < n; ++r) {
    TEST_CK(cudaSetDevice(S.g->memory(r).device));
    auto [inp, out] = buffers(S, c, r, count * es, in_place, shift);
    std::vector<unsigned char> got(ob), gd(guard);
    TEST_CK(cudaMemcpy(got.data(), out, ob, cudaMemcpyDeviceToHost));
    TEST_CK(cudaMemcpy(gd.data(), guard_at(r), guard, cudaMemcpyDeviceToHost));
    std::vector<unsigned char> const want = expected_output(c, t, op, root, count, r, in);
    for (std::uint64_t i = 0; i < ob / es; ++i) o.wrong += get_elem(got, i, es) != get_elem(want, i, es);
    for (std::uint64_t i = 0; i < guard; ++i) o.guard_hit += gd[i] != poison[ob + i];
  }
  TEST_CK(cudaSetDevice(0));
  return o;
}

// Every collective, dtype, op, size, in and out of place, offset, 1 and 3 VTs against the CPU
// reference: 2 and 3 loopback ranks on GPU 0, or 2 ranks with one rank per GPU.
void check_every_case(bool two) {
  std::mt19937_64 rng(20261202);
  std::vector<dtype> const types = {dtype::int32, dtype::int64, dtype::float16, dtype::bfloat16, dtype::float32, dtype::float64};
  std::vector<redop> const ops = {redop::sum, redop::prod, redop::min, redop::max, redop::avg};
  std::vector<std::uint64_t> const small = {1, 7, 1000, 4099};
  long cases = 0, bad = 0;
  for (int n : two ? std::vector<int>{2} : std::vector<int>{2, 3}) {
    for (int vts : {1, 3}) {
      // 64 KiB receive areas in 4 slots: the larger cases take many rounds and reuse every slot
      auto S = std::make_unique<setup>(n, vts, 16u << 20, two);
      for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                           collective::all_to_all}) {
        bool const reduce = c == collective::all_reduce || c == collective::reduce_scatter;
        for (dtype t : types) {
          if (!reduce && t != dtype::float16 && t != dtype::float32 && t != dtype::int64) continue;
          for (redop op : ops) {
            if (!reduce && op != redop::sum) continue;
            std::vector<std::uint64_t> sizes = small;
            // large: one float, one 16-bit type and all copies, two ops
            bool const big = !reduce || ((t == dtype::float32 || t == dtype::bfloat16) && (op == redop::sum || op == redop::max));
            if (big) sizes.insert(sizes.end(), {(1u << 18) + 5, (1u << 20) / reccl::size_of(t) * 3 + 1});
            for (std::uint64_t count : sizes)
              for (bool ip : {false, true}) {
                if (ip && c == collective::all_to_all) continue;
                std::uint64_t const cap_elems = S->cap / reccl::size_of(t) / (n + 1);
                if (count > cap_elems) continue;
                for (std::uint64_t off : {std::uint64_t{0}, std::uint64_t{3}}) {
                  if (off != 0 && count > 5000) continue;
                  int const root = c == collective::broadcast ? static_cast<int>(count % static_cast<std::uint64_t>(n)) : 0;
                  outcome const o = run_case(*S, c, t, op, count, ip, root, off, rng);
                  ++cases;
                  if (o.wrong != 0 || o.guard_hit != 0 || o.st != reccl::status::ok) {
                    ++bad;
                    if (bad <= 20)
                      MESSAGE(name(c) << " " << name(t) << " " << name(op) << " count " << count << (ip ? " in-place" : "")
                                      << " offset " << off << " ranks " << n << (two ? " (2 GPUs)" : "") << " VTs " << vts
                                      << ": wrong " << o.wrong << " guard " << o.guard_hit << " " << o.msg);
                    if (o.st != reccl::status::ok) {  // counters out of step: rebuild
                      S.reset();
                      S = std::make_unique<setup>(n, vts, 16u << 20, two);
                    }
                  }
                }
              }
          }
        }
      }
    }
  }
  MESSAGE(cases << " cases, " << bad << " wrong");
  CHECK(bad == 0);
  CHECK(cases > 500);
}

}  // namespace

TEST_CASE("proxy collectives: every collective, dtype, op and size matches the CPU reference, ranks on GPU 0") {
  REQUIRE_GPU();
  check_every_case(false);
}

TEST_CASE("proxy collectives: every collective, dtype, op and size matches the CPU reference, one rank per GPU") {
  REQUIRE_GPUS(2);
  check_every_case(true);
}

TEST_CASE("proxy collectives: the VT split comes from an Allocator, and uneven shares or a masked VT give the same results") {
  REQUIRE_GPU();
  std::mt19937_64 rng(77);
  int const vts = 3;
  // equal; uneven; VT 1 masked (no bytes, still in every step); a proportional allocator's update
  // from observed times (VT 0 slow)
  std::vector<reccl::shares> splits;
  splits.push_back(reccl::equal_shares(vts, reccl::all_live(vts)));
  reccl::shares uneven = splits[0];
  uneven.w[0] = reccl::share_one / 10 * 6;
  uneven.w[1] = reccl::share_one / 10;
  uneven.w[2] = reccl::share_one - uneven.w[0] - uneven.w[1];
  splits.push_back(uneven);
  splits.push_back(reccl::equal_shares(vts, 0b101));
  reccl::vt_observation obs;
  obs.n_vts = vts;
  obs.live_mask = reccl::all_live(vts);
  obs.time[0] = 4000, obs.time[1] = 1000, obs.time[2] = 1000;
  splits.push_back(reccl::allocator::proportional{}.update(splits[0], obs));
  for (auto const& sh : splits) REQUIRE(reccl::check(sh) == reccl::status::ok);
  long cases = 0, bad = 0;
  for (int n : {2, 3}) {
    setup S(n, vts, 8u << 20, false);
    for (std::size_t k = 0; k < splits.size(); ++k)
      for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                           collective::all_to_all})
        for (dtype t : {dtype::float32, dtype::bfloat16})
          for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{4099}, (std::uint64_t{1} << 18) + 5}) {
            std::uint64_t const cap_elems = S.cap / reccl::size_of(t) / (n + 1);
            if (count > cap_elems) continue;
            bool const ip = count == 4099 && c != collective::all_to_all;
            outcome const o = run_case(S, c, t, redop::sum, count, ip, n - 1, 0, rng, splits[k]);
            ++cases;
            if (o.wrong != 0 || o.guard_hit != 0 || o.st != reccl::status::ok) {
              ++bad;
              MESSAGE("split " << k << " " << name(c) << " " << name(t) << " count " << count << " ranks " << n << ": wrong " << o.wrong
                               << " guard " << o.guard_hit << " " << o.msg);
              REQUIRE(o.st == reccl::status::ok);  // counters out of step: stop here
            }
          }
  }
  MESSAGE(cases << " cases over " << splits.size() << " splits, " << bad << " wrong");
  CHECK(bad == 0);
  // a split for another VT count, or one check() rejects, is refused before anything is launched
  setup S(2, vts, 1u << 20, false);
  collective_args a;
  a.coll = collective::all_reduce;
  a.count = 1024;
  a.in = S.in(0);
  a.out = S.out(0);
  a.vt_shares = reccl::equal_shares(2, 0b11);
  CHECK_THROWS_WITH_AS(S.pc->launch(0, a, S.s[0]), doctest::Contains("vt_shares"), reccl::error);
  a.vt_shares = splits[1];
  a.vt_shares.w[0] += 1;  // no longer sums to share_one
  CHECK_THROWS_WITH_AS(S.pc->launch(0, a, S.s[0]), doctest::Contains("vt_shares"), reccl::error);
  CHECK(S.pc->check() == reccl::status::ok);
}

TEST_CASE("proxy collectives: with the peer checks on (as across processes) results are the same") {
  REQUIRE_GPU();
  std::mt19937_64 rng(31);
  long cases = 0, bad = 0;
  for (int n : {2, 3})
    for (int vts : {1, 3}) {
      setup S(n, vts, 4u << 20, false, 64 << 10, 4, proxy_collectives::peer_checks::on);
      for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                           collective::all_to_all})
        for (std::uint64_t count : {std::uint64_t{1}, std::uint64_t{5}, std::uint64_t{4099}, std::uint64_t{(1u << 17) + 3}})
          for (int rep = 0; rep < 2; ++rep) {  // a second call uses the other digest slot
            int const root = c == collective::broadcast ? static_cast<int>(count % static_cast<std::uint64_t>(n)) : 0;
            outcome const o = run_case(S, c, dtype::float32, redop::sum, count, false, root, 0, rng);
            ++cases;
            if (o.wrong || o.guard_hit || o.st != reccl::status::ok) {
              ++bad;
              MESSAGE(name(c) << " count " << count << " ranks " << n << " VTs " << vts << ": wrong " << o.wrong << " " << o.msg);
            }
          }
    }
  MESSAGE(cases << " cases with peer checks, " << bad << " wrong");
  CHECK(bad == 0);
}

TEST_CASE("proxy collectives: puts inline up to 256 bytes, or none inline, give the same results as the default (1 KiB)") {
  REQUIRE_GPU();
  std::mt19937_64 rng(1024);
  long cases = 0, bad = 0;
  for (std::uint32_t ib : {0u, 256u})
    for (int n : {2, 3})
      for (int vts : {1, 3}) {
        // 4 KiB areas (4 slots of 1008 bytes): reductions take rounds whose last chunk is small
        setup S(n, vts, 1u << 20, false, 4 << 10, 4, proxy_collectives::peer_checks::automatic, ib);
        REQUIRE(S.pc->inline_bytes() == ib);
        for (collective c : {collective::all_reduce, collective::reduce_scatter, collective::all_gather, collective::broadcast,
                             collective::all_to_all})
          for (dtype t : {dtype::float32, dtype::bfloat16, dtype::int64})
            for (std::uint64_t count : {1, 3, 63, 64, 65, 127, 128, 129, 255, 256, 257, 500, 1000, 3001}) {
              bool const ip = count % 2 == 1 && c != collective::all_to_all;
              std::uint64_t const off = count % 3 == 0 ? 3 : 0;
              int const root = c == collective::broadcast ? static_cast<int>(count % static_cast<std::uint64_t>(n)) : 0;
              redop const op = count % 4 == 1 ? redop::max : redop::sum;
              outcome const o = run_case(S, c, t, op, count, ip, root, off, rng);
              ++cases;
              if (o.wrong || o.guard_hit || o.st != reccl::status::ok) {
                ++bad;
                MESSAGE("inline " << ib << " " << name(c) << " " << name(t) << " count " << count << " ranks " << n << " VTs " << vts
                                  << ": wrong " << o.wrong << " guard " << o.guard_hit << " " << o.msg);
                REQUIRE(o.st == reccl::status::ok);  // counters out of step: stop here
              }
            }
        // the proxies took inline puts exactly when they were allowed (no peer checks here)
        for (int r = 0; r < n; ++r) {
          std::uint64_t const taken = S.g->inline_puts_taken(r);
          MESSAGE("inline " << ib << " ranks " << n << " VTs " << vts << ": rank " << r << " took " << taken << " inline puts");
          if (ib == 0) CHECK(taken == 0);
          else CHECK(taken > 50);
        }
      }
  MESSAGE(cases << " cases with inline puts of at most 0 and 256 bytes, " << bad << " wrong");
  CHECK(bad == 0);
  // more than an inline put carries is refused
  copy_engine_config c;
  c.nranks = 2;
  c.symmetric_bytes = 4096;
  copy_engine_group g(c);
  CHECK_THROWS_WITH_AS(proxy_collectives(g, 4, proxy_collectives::peer_checks::off, reccl::proxy::max_inline_bytes + 1),
                       doctest::Contains("inline_bytes"), reccl::error);
}

TEST_CASE("proxy collectives: back-to-back calls and CUDA-graph replays continue the counters") {
  REQUIRE_GPU();
  int const n = 2;
  setup S(n, 2, 4u << 20, false);
  std::mt19937_64 rng(5);
  std::uint64_t const count = (1u << 16) + 9;  // floats; 4 rounds per VT with 16 KiB slots
  std::size_t const es = 4;
  std::vector<std::vector<unsigned char>> in(n, std::vector<unsigned char>(count * es));
  auto refill = [&] {
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < count; ++i) put_elem(in[r], i, es, random_bits(dtype::float32, rng));
      TEST_CK(cudaMemcpy(S.in(r), in[r].data(), count * es, cudaMemcpyHostToDevice));
      TEST_CK(cudaMemset(S.out(r), 0xEE, count * es));
    }
  };
  auto args = [&](int r, collective c) {
    collective_args a;
    a.coll = c;
    a.type = dtype::float32;
    a.count = count;
    a.in = S.in(r);
    a.out = S.out(r);
    return a;
  };
  auto verify = [&](char const* what) {
    long wrong = 0;
    for (int r = 0; r < n; ++r) {
      std::vector<unsigned char> got(count * es);
      TEST_CK(cudaMemcpy(got.data(), S.out(r), count * es, cudaMemcpyDeviceToHost));
      auto const want = expected_output(collective::all_reduce, dtype::float32, redop::sum, 0, count, r, in);
      for (std::size_t i = 0; i < count; ++i) wrong += get_elem(got, i, es) != get_elem(want, i, es);
    }
    std::string msg;
    CHECK_MESSAGE(S.pc->check(&msg) == reccl::status::ok, msg);
    CHECK_MESSAGE(wrong == 0, what);
  };
  // 30 all-reduces queued back to back (the same buffers: each rank's next call waits only on its
  // stream), then an all-gather of other buffers, no host synchronisation in between
  refill();
  for (int i = 0; i < 30; ++i)
    for (int r = 0; r < n; ++r) S.pc->launch(r, args(r, collective::all_reduce), S.s[r]);
  S.sync();
  verify("back to back");
  // one graph per rank, replayed with fresh inputs
  std::vector<cudaGraphExec_t> exec(n);
  for (int r = 0; r < n; ++r) {
    cudaGraph_t graph;
    TEST_CK(cudaStreamBeginCapture(S.s[r], cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 3; ++i) S.pc->launch(r, args(r, collective::all_reduce), S.s[r]);
    TEST_CK(cudaStreamEndCapture(S.s[r], &graph));
    TEST_CK(cudaGraphInstantiate(&exec[r], graph, 0));
    cudaGraphDestroy(graph);
  }
  for (int rep = 0; rep < 5; ++rep) {
    refill();
    for (int r = 0; r < n; ++r) TEST_CK(cudaGraphLaunch(exec[r], S.s[r]));
    S.sync();
    verify("graph replay");
  }
  for (auto e : exec) cudaGraphExecDestroy(e);
  reccl::proxy::collective_state const st = S.pc->state(0);
  MESSAGE("rank 0 VT 0: ready step " << st.ready_step[0] << ", rounds " << st.credit_round[0] << ", stalls " << st.stalls[0]);
  CHECK(st.ready_step[0] == st.ready_step[1]);  // both VTs took the same number of steps
}

TEST_CASE("proxy collectives: bad input is rejected on the host, nothing launched") {
  REQUIRE_GPU();
  setup S(2, 1, 1u << 20, false);
  char* plain = nullptr;
  TEST_CK(cudaMalloc(&plain, 1 << 20));
  collective_args a;
  a.coll = collective::all_reduce;
  a.count = 1024;
  a.in = plain;  // not in the symmetric region
  a.out = S.out(0);
  CHECK_THROWS_WITH_AS(S.pc->launch(0, a, S.s[0]), doctest::Contains("symmetric region"), reccl::error);
  a.in = nullptr;
  CHECK_THROWS_AS(S.pc->launch(0, a, S.s[0]), reccl::error);
  a.in = S.in(0);
  a.count = S.cap;  // too long for the region
  CHECK_THROWS_AS(S.pc->launch(0, a, S.s[0]), reccl::error);
  a.count = 1024;
  a.in = S.in(0) + 2;  // misaligned float
  CHECK_THROWS_WITH_AS(S.pc->launch(0, a, S.s[0]), doctest::Contains("aligned"), reccl::error);
  a.coll = collective::all_to_all;
  a.in = S.out(0);
  CHECK_THROWS_WITH_AS(S.pc->launch(0, a, S.s[0]), doctest::Contains("in-place all-to-all"), reccl::error);
  a.coll = collective::broadcast;
  a.in = S.in(0);
  a.root = 2;
  CHECK_THROWS_WITH_AS(S.pc->launch(0, a, S.s[0]), doctest::Contains("root"), reccl::error);
  cudaFree(plain);
  CHECK(S.pc->check() == reccl::status::ok);
  // ranks that disagree: the second rank's launch fails with mismatch before anything is launched
  // for it, and the first rank's kernel times out at its deadline
  setup T(2, 1, 1u << 20, false);
  collective_args b;
  b.coll = collective::all_reduce;
  b.count = 1000;
  b.in = T.in(0);
  b.out = T.out(0);
  b.timeout_ns = 200'000'000ull;
  T.pc->launch(0, b, T.s[0]);
  b.count = 999;
  b.in = T.in(1);
  b.out = T.out(1);
  CHECK_THROWS_WITH_AS(T.pc->launch(1, b, T.s[1]), doctest::Contains("count: 999 vs 1000"), reccl::error);
  T.sync();
  CHECK(T.pc->check() == reccl::status::timeout);
}

TEST_CASE("proxy collectives: a rank that never arrives is a timeout naming the rank and VT, no hang") {
  REQUIRE_GPU();
  for (collective c : {collective::all_reduce, collective::all_gather}) {
    setup S(2, 2, 1u << 20, false);
    collective_args a;
    a.coll = c;
    a.count = 50000;
    a.in = S.in(0);
    a.out = S.out(0);
    a.timeout_ns = 200'000'000ull;
    auto const t0 = std::chrono::steady_clock::now();
    S.pc->launch(0, a, S.s[0]);  // rank 1 never calls
    S.sync();
    double const ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::string msg;
    reccl::status const st = S.pc->check(&msg);
    MESSAGE(name(c) << ": " << msg << " after " << ms << " ms");
    CHECK(st == reccl::status::timeout);
    CHECK(msg.find("rank 0 VT") != std::string::npos);
    CHECK(msg.find("waiting for rank 1") != std::string::npos);
    CHECK(ms < 5000);
  }
}
