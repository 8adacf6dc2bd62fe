// GPU test of RECCL_DTYPES (types.hpp) in a program built with bf16 reductions only: those run and
// are right, a reduction on any other dtype throws a reccl::error naming the macro before anything
// is launched (plain communicator, adaptive lane), and collectives that only move data still run on
// every dtype. Two loopback ranks on GPU 0.
#define RECCL_DTYPES bfloat16
#include "../doctest_main.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include "reccl/host/adaptive.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "support.cuh"

using namespace gpu_test;

namespace {

constexpr int n = 2;
constexpr std::size_t count = 1 << 20;  // 2 MiB of bf16: above the one-shot sizes

struct world {
  std::vector<reccl::nvlink_communicator> comms;
  std::vector<cudaStream_t> streams;
  std::vector<char*> in, out;
  void sync() {
    for (auto s : streams) TEST_CK(cudaStreamSynchronize(s));
    for (auto& c : comms) c.check();
  }
};

world* get_world() {
  static world* w = nullptr;
  if (w != nullptr || ::gpu_test::gpu_count() == 0) return w;
  w = new world;
  TEST_CK(cudaSetDevice(0));
  int sms = 0;
  TEST_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  reccl::nvlink_config cfg;
  cfg.lanes = 2;
  cfg.max_ctas = sms / n;
  cfg.timeout_ns = test_timeout_ns(2.0);
  w->comms = reccl::nvlink_communicator::create_loopback(n, 0, cfg);
  for (int r = 0; r < n; ++r) {
    cudaStream_t s;
    TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    w->streams.push_back(s);
    char *a, *b;
    TEST_CK(cudaMalloc(&a, count * 8 * n));
    TEST_CK(cudaMalloc(&b, count * 8 * n));
    w->in.push_back(a);
    w->out.push_back(b);
  }
  return w;
}

#define REQUIRE_WORLD()                  \
  world* wp = get_world();               \
  if (wp == nullptr) SKIP_CASE("no GPU"); \
  world& w = *wp

/// Rank r's bf16 input element i: a small integer, so the sum over ranks is exact.
float input(int r, std::size_t i) { return static_cast<float>(static_cast<int>(i % 13) - 6 + 3 * r); }

void put_bf16_inputs(world& w, std::size_t elems = count) {
  std::vector<std::uint16_t> h(elems);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < elems; ++i) h[i] = float_to_bf16_bits(input(r, i));
    TEST_CK(cudaMemcpy(w.in[r], h.data(), elems * 2, cudaMemcpyHostToDevice));
    TEST_CK(cudaMemset(w.out[r], 0xff, elems * 2));
  }
}

/// Elements of every rank's bf16 all-reduce output that differ from the exact sum.
std::size_t wrong_bf16_sums(world& w, std::size_t elems = count) {
  std::size_t bad = 0;
  std::vector<std::uint16_t> h(elems);
  for (int r = 0; r < n; ++r) {
    TEST_CK(cudaMemcpy(h.data(), w.out[r], elems * 2, cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < elems; ++i) {
      float sum = 0;
      for (int q = 0; q < n; ++q) sum += input(q, i);
      bad += h[i] != float_to_bf16_bits(sum);
    }
  }
  return bad;
}

/// Runs `call` expecting reccl::error(invalid_argument) that names RECCL_DTYPES and the dtype.
template <class F>
void check_left_out(F&& call, std::string const& what) {
  try {
    call();
    FAIL("no error for a reduction on a dtype left out: " << what);
  } catch (reccl::error const& e) {
    CHECK(e.code() == reccl::status::invalid_argument);
    std::string const m = e.what();
    INFO(m);
    CHECK(m.find("RECCL_DTYPES=bfloat16") != std::string::npos);
    CHECK(m.find(what) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("only bf16 reductions are compiled in") {
  static_assert(reccl::compiled_dtypes == reccl::dtype_bits::bfloat16);
  for (auto a : {reccl::algorithm::one_shot, reccl::algorithm::two_shot, reccl::algorithm::pipelined}) {
    CHECK((reccl::device::select_kernel(a, collective::all_reduce, dtype::bfloat16) != nullptr));
    CHECK((reccl::device::select_kernel(a, collective::all_gather, dtype::float64) != nullptr));
    for (dtype t : {dtype::int32, dtype::int64, dtype::float16, dtype::float32, dtype::float64})
      CHECK((reccl::device::select_kernel(a, collective::all_reduce, t) == nullptr));
  }
}

TEST_CASE("the communicator reduces bf16 and refuses other dtypes before launching") {
  REQUIRE_WORLD();
  // the automatic choice: one-shot (Lamport) for the small message, pipelined for the large one
  // (plain cudaMalloc buffers)
  REQUIRE(w.comms[0].plan_for(collective::all_reduce, w.in[0], w.out[0], 1024, dtype::bfloat16).algo ==
          reccl::algorithm::one_shot);
  REQUIRE(w.comms[0].plan_for(collective::all_reduce, w.in[0], w.out[0], count, dtype::bfloat16).algo ==
          reccl::algorithm::pipelined);
  for (std::size_t elems : {std::size_t{1024}, count}) {
    put_bf16_inputs(w, elems);
    for (int r = 0; r < n; ++r) w.comms[r].all_reduce(w.in[r], w.out[r], elems, dtype::bfloat16, redop::sum, w.streams[r]);
    w.sync();
    CHECK(wrong_bf16_sums(w, elems) == 0);
  }
  check_left_out([&] { w.comms[0].all_reduce(w.in[0], w.out[0], count, dtype::float32, redop::sum, w.streams[0]); },
                 "all_reduce on float");
  check_left_out([&] { w.comms[1].reduce_scatter(w.in[1], w.out[1], count / n, dtype::float64, redop::max, w.streams[1]); },
                 "reduce_scatter on double");
  // nothing was launched: the ranks are still in step for the next collective
  put_bf16_inputs(w);
  for (int r = 0; r < n; ++r)
    w.comms[r].all_reduce(w.in[r], w.out[r], count, dtype::bfloat16, redop::sum, w.streams[r]);
  w.sync();
  CHECK(wrong_bf16_sums(w) == 0);
}

TEST_CASE("collectives that move data run on a dtype left out") {
  REQUIRE_WORLD();
  std::vector<double> h(count);
  for (int r = 0; r < n; ++r) {
    for (std::size_t i = 0; i < count; ++i) h[i] = r * 1e6 + static_cast<double>(i) + 0.25;
    TEST_CK(cudaMemcpy(w.in[r], h.data(), count * 8, cudaMemcpyHostToDevice));
    TEST_CK(cudaMemset(w.out[r], 0xff, count * 8 * n));
  }
  for (int r = 0; r < n; ++r) w.comms[r].all_gather(w.in[r], w.out[r], count, dtype::float64, w.streams[r]);
  w.sync();
  std::vector<double> got(count * n);
  std::size_t bad = 0;
  for (int r = 0; r < n; ++r) {
    TEST_CK(cudaMemcpy(got.data(), w.out[r], count * 8 * n, cudaMemcpyDeviceToHost));
    for (int q = 0; q < n; ++q)
      for (std::size_t i = 0; i < count; ++i) bad += got[q * count + i] != q * 1e6 + static_cast<double>(i) + 0.25;
  }
  CHECK(bad == 0);
}

TEST_CASE("the adaptive lane reduces bf16 and refuses other dtypes before launching") {
  REQUIRE_WORLD();
  std::vector<reccl::nvlink_communicator*> ptrs;
  for (auto& c : w.comms) ptrs.push_back(&c);
  reccl::adaptive_options o;
  o.lane = 1;
  o.vts = 4;
  auto lanes = reccl::adaptive_lane<reccl::allocator::equal>::create_all(ptrs, o);
  check_left_out([&] { lanes[0].all_reduce(w.in[0], w.out[0], count, dtype::float32, redop::sum, w.streams[0]); },
                 "all_reduce on float");
  for (int k = 0; k < 3; ++k) {
    put_bf16_inputs(w);
    for (int r = 0; r < n; ++r) lanes[r].all_reduce(w.in[r], w.out[r], count, dtype::bfloat16, redop::sum, w.streams[r]);
    w.sync();
    CHECK(wrong_bf16_sums(w) == 0);
  }
}

TEST_CASE("teardown") {
  world* w = get_world();
  if (w == nullptr) return;
  w->comms.clear();
}
