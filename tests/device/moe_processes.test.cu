// all_to_allv and MoE dispatch/combine on the P2P transport with one process per rank: 2 and 3
// processes forked before any CUDA call, every one on GPU 0, windows mapped through CUDA IPC.
// Processes that share a GPU take turns on it (no MPS), so deadlines are long and the cases small.
// Every process draws every rank's inputs from one seed and checks its own outputs: the
// all-to-allv's received blocks, counts and offsets against the send data (float, random counts
// with zeros and gaps); the MoE layer's grouped rows, per-expert counts and offsets and combined
// outputs bit for bit against the CPU engine (bf16, uniform and skewed routing, one exchange used
// twice), with both protocols (table and staged). Then a rank that leaves without dispatching: the
// others time out naming it, near the deadline, resume with it masked and go on (its slots dropped
// and reported), with both protocols.
#define CUDA_NO_HALF
#include "../doctest_main.hpp"

#include <cuda_bf16.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "a2av_plan.hpp"
#include "forked_ranks.hpp"
#include "moe_reference.cuh"
#include "reccl/host/p2p_all_to_allv.hpp"
#include "reccl/host/p2p_expert_exchange.hpp"
#include "support.cuh"

using gpu_test::child_fails;
using reccl::p2p_communicator;
using reccl::p2p_config;
using namespace reccl_test;
using namespace moe_test;

namespace {

constexpr int skip_code = reccl_test::skipped_exit_code;
using a2av = reccl::all_to_allv<float, reccl::schedule::all_to_all, reccl::transport::p2p, reccl::telemetry::none,
                                reccl::allocator::equal>;

p2p_config config(std::uint64_t timeout_ns) {
  p2p_config c;
  c.timeout_ns = timeout_ns;
  c.data_bytes = 8u << 20;
  return c;
}

std::string fault_text(p2p_communicator const& comm) {
  try {
    comm.check();
  } catch (reccl::error const& e) {
    return e.what();
  }
  return {};
}

template <class T>
T* device_alloc(std::uint64_t elems) {
  T* p = nullptr;
  TEST_CK(cudaMalloc(&p, elems * sizeof(T) + 16));
  return p;
}

void all_to_allv(int me, int n, p2p_communicator& comm, cudaStream_t s) {
  std::int64_t const max_count = 5000;
  std::uint64_t const cap = n * max_count * sizeof(float) + 4096;
  a2av_test::plan const p = a2av_test::make_plan<float>(n, 77u + n, max_count);
  char* send = device_alloc<char>(p.data[me].size());
  auto* recv = static_cast<char*>(comm.allocate(cap));  // collective: every rank, same order
  std::int64_t* counts = device_alloc<std::int64_t>(4 * n);
  TEST_CK(cudaMemcpy(send, p.data[me].data(), p.data[me].size(), cudaMemcpyHostToDevice));
  TEST_CK(cudaMemcpy(counts, p.counts[me].data(), n * 8, cudaMemcpyHostToDevice));
  TEST_CK(cudaMemcpy(counts + n, p.offsets[me].data(), n * 8, cudaMemcpyHostToDevice));
  TEST_CK(cudaMemset(recv, a2av_test::poison, cap));
  TEST_CK(cudaMemset(counts + 2 * n, 0xff, 2 * n * 8));
  TEST_CK(cudaDeviceSynchronize());
  a2av::run(comm, {reinterpret_cast<float const*>(send), p.data[me].size() / 4, counts, counts + n},
            {reinterpret_cast<float*>(recv), cap / 4, counts + 2 * n, counts + 3 * n}, s, reccl::a2av_call_options{2});
  TEST_CK(cudaStreamSynchronize(s));
  std::string const f = fault_text(comm);
  EXPECT(f.empty(), "rank %d: all_to_allv fault: %s", me, f.c_str());
  std::vector<unsigned char> got(cap);
  std::vector<std::int64_t> rc(n), ro(n);
  TEST_CK(cudaMemcpy(got.data(), recv, cap, cudaMemcpyDeviceToHost));
  TEST_CK(cudaMemcpy(rc.data(), counts + 2 * n, n * 8, cudaMemcpyDeviceToHost));
  TEST_CK(cudaMemcpy(ro.data(), counts + 3 * n, n * 8, cudaMemcpyDeviceToHost));
  std::uint64_t at = 0;
  for (int src = 0; src < n; ++src) {
    EXPECT(rc[src] == p.counts[src][me], "rank %d: %lld elements from %d, %lld expected", me, (long long)rc[src], src,
           (long long)p.counts[src][me]);
    EXPECT(ro[src] == std::int64_t(at), "rank %d: offset %lld from %d, %llu expected", me, (long long)ro[src], src, (unsigned long long)at);
    std::uint64_t const bytes = p.counts[src][me] * sizeof(float);
    EXPECT(std::memcmp(got.data() + at * 4, p.data[src].data() + p.offsets[src][me] * 4, bytes) == 0, "rank %d: block from %d differs", me,
           src);
    at += p.counts[src][me];
  }
  std::uint64_t past = 0;
  for (std::uint64_t i = at * 4; i < cap; ++i) past += got[i] != a2av_test::poison;
  EXPECT(past == 0, "rank %d: %llu bytes written past what arrived", me, (unsigned long long)past);
  std::fprintf(stderr, "rank %d of %d: all_to_allv received %llu elements\n", me, n, (unsigned long long)at);
  TEST_CK(cudaFree(send));
  TEST_CK(cudaFree(counts));
}

void expert_exchange(int me, int n, p2p_communicator& comm, cudaStream_t s, reccl::moe_protocol protocol) {
  reccl::moe::routing const g{n, 4 * n, 4};
  int const hidden = 256, align = 8, epr = g.experts_per_rank();
  std::uint64_t const T = 48;
  reccl::load_kernel(reinterpret_cast<void const*>(&experts_kernel<__nv_bfloat16>));
  reccl::p2p_expert_exchange<__nv_bfloat16> ex(comm, {g, T, hidden, align}, 4, protocol);
  int const proto = static_cast<int>(protocol);
  auto const grouped = ex.capacity().grouped;
  auto* x = device_alloc<__nv_bfloat16>(T * hidden);
  auto* y = device_alloc<__nv_bfloat16>(grouped * hidden);
  auto* out = device_alloc<__nv_bfloat16>(T * hidden);
  auto* idx = device_alloc<std::int32_t>(T * g.top_k);
  auto* w = device_alloc<float>(T * g.top_k);
  for (routing_kind kind : {routing_kind::uniform, routing_kind::skewed}) {
    auto const c = make_moe_case<reccl::bfloat16>(g, hidden, T, kind, 31u + unsigned(kind));
    auto const ans = cpu_reference(c, T, align);  // every rank's answer; this process checks its own
    TEST_CK(cudaMemcpy(x, c.x[me].data(), c.x[me].size() * 2, cudaMemcpyHostToDevice));
    TEST_CK(cudaMemcpy(idx, c.idx[me].data(), c.idx[me].size() * 4, cudaMemcpyHostToDevice));
    TEST_CK(cudaMemcpy(w, c.w[me].data(), c.w[me].size() * 4, cudaMemcpyHostToDevice));
    TEST_CK(cudaMemset(out, 0xA5, T * hidden * 2));
    TEST_CK(cudaDeviceSynchronize());
    ex.dispatch(x, idx, c.tokens[me], s);
    experts_kernel<__nv_bfloat16><<<16, 256, 0, s>>>(ex.received(), y, ex.expert_offsets(), ex.expert_counts(), epr, me, hidden);
    ex.combine(y, w, out, s);
    TEST_CK(cudaStreamSynchronize(s));
    std::string const f = fault_text(comm);
    EXPECT(f.empty(), "rank %d: moe fault: %s", me, f.c_str());
    std::vector<std::int32_t> counts(epr), offsets(epr + 1);
    TEST_CK(cudaMemcpy(counts.data(), ex.expert_counts(), epr * 4, cudaMemcpyDeviceToHost));
    TEST_CK(cudaMemcpy(offsets.data(), ex.expert_offsets(), (epr + 1) * 4, cudaMemcpyDeviceToHost));
    EXPECT(counts == ans.counts[me] && offsets == ans.offsets[me], "rank %d, routing %d, protocol %d: expert counts or offsets differ", me,
           int(kind), proto);
    std::vector<reccl::bfloat16> got(ans.grouped[me].size());
    TEST_CK(cudaMemcpy(got.data(), ex.received(), got.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT(std::memcmp(got.data(), ans.grouped[me].data(), got.size() * 2) == 0, "rank %d, routing %d, protocol %d: grouped rows differ", me,
           int(kind), proto);
    std::vector<reccl::bfloat16> o(c.tokens[me] * hidden);
    TEST_CK(cudaMemcpy(o.data(), out, o.size() * 2, cudaMemcpyDeviceToHost));
    EXPECT(std::memcmp(o.data(), ans.out[me].data(), o.size() * 2) == 0, "rank %d, routing %d, protocol %d: combined outputs differ", me,
           int(kind), proto);
    std::fprintf(stderr, "rank %d of %d: moe routing %d, protocol %d: %llu tokens, %d grouped rows\n", me, n, int(kind), proto,
                 (unsigned long long)c.tokens[me], offsets[epr]);
  }
  for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(out), static_cast<void*>(idx), static_cast<void*>(w)})
    TEST_CK(cudaFree(p));
}

// The last rank creates its exchange and leaves (its process exits) without dispatching: the
// others' first waits (the table, or the staged protocol's first-call check) time out naming it, after about the 5 s deadline. Then they resume, mask
// it and go on: a layer whose slots on the missing rank are dropped and reported, the rest bit for
// bit the CPU engine's answer without that rank.
void missing_rank(int me, int n, reccl::proxy::rank_exchange const& exch, reccl::moe_protocol protocol) {
  p2p_communicator comm = p2p_communicator::create(me, n, exch, config(5'000'000'000ull));
  reccl::moe::routing const g{n, 2 * n, 2};
  int const hidden = 64, epr = g.experts_per_rank();
  std::uint64_t const T = 8;
  reccl::load_kernel(reinterpret_cast<void const*>(&experts_kernel<__nv_bfloat16>));
  reccl::p2p_expert_exchange<__nv_bfloat16> ex(comm, {g, T, hidden, 1}, 2, protocol);
  int const missing = n - 1;
  if (me == missing) return;  // destroys its communicator with the others, never calling
  auto const c = make_moe_case<reccl::bfloat16>(g, hidden, T, routing_kind::uniform, 5);
  auto* x = device_alloc<__nv_bfloat16>(T * hidden);
  auto* y = device_alloc<__nv_bfloat16>(ex.capacity().grouped * hidden);
  auto* out = device_alloc<__nv_bfloat16>(T * hidden);
  auto* idx = device_alloc<std::int32_t>(T * 2);
  auto* w = device_alloc<float>(T * 2);
  TEST_CK(cudaMemcpy(x, c.x[me].data(), c.x[me].size() * 2, cudaMemcpyHostToDevice));
  TEST_CK(cudaMemcpy(idx, c.idx[me].data(), c.idx[me].size() * 4, cudaMemcpyHostToDevice));
  TEST_CK(cudaMemcpy(w, c.w[me].data(), c.w[me].size() * 4, cudaMemcpyHostToDevice));
  cudaStream_t s;
  TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  TEST_CK(cudaDeviceSynchronize());
  auto const t0 = std::chrono::steady_clock::now();
  ex.dispatch(x, idx, c.tokens[me], s);
  TEST_CK(cudaStreamSynchronize(s));
  double const secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::string const f = fault_text(comm);
  std::fprintf(stderr, "rank %d: rank %d never dispatches: after %.3f s: %s\n", me, missing, secs, f.c_str());
  EXPECT(f.find("timed out") != std::string::npos, "rank %d: check() gave '%s'", me, f.c_str());
  EXPECT(f.find("(peer " + std::to_string(missing) + ")") != std::string::npos, "rank %d: check() does not name rank %d: '%s'", me, missing,
         f.c_str());
  EXPECT(secs < 20.0, "rank %d: gave up only after %.3f s (deadline 5 s)", me, secs);

  comm.resume(s);
  ex.mask_ranks(1ull << missing, s);
  TEST_CK(cudaMemsetAsync(out, 0xA5, T * hidden * 2, s));
  ex.dispatch(x, idx, c.tokens[me], s);
  experts_kernel<__nv_bfloat16><<<16, 256, 0, s>>>(ex.received(), y, ex.expert_offsets(), ex.expert_counts(), epr, me, hidden);
  ex.combine(y, w, out, s);
  TEST_CK(cudaStreamSynchronize(s));
  std::string const f2 = fault_text(comm);
  EXPECT(f2.empty(), "rank %d: after resume() with rank %d masked: %s", me, missing, f2.c_str());
  auto const ans = cpu_reference(without_rank(c, missing), T, 1);
  std::vector<reccl::bfloat16> o(c.tokens[me] * hidden);
  TEST_CK(cudaMemcpy(o.data(), out, o.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT(std::memcmp(o.data(), ans.out[me].data(), o.size() * 2) == 0, "rank %d: combined outputs with rank %d masked differ", me, missing);
  std::vector<reccl::bfloat16> got(ans.grouped[me].size());
  TEST_CK(cudaMemcpy(got.data(), ex.received(), got.size() * 2, cudaMemcpyDeviceToHost));
  EXPECT(std::memcmp(got.data(), ans.grouped[me].data(), got.size() * 2) == 0, "rank %d: grouped rows with rank %d masked differ", me, missing);
  reccl::moe::drop_report d{};
  TEST_CK(cudaMemcpy(&d, ex.dropped(), sizeof(d), cudaMemcpyDeviceToHost));
  auto const want = expected_drops(c, me, missing);
  EXPECT(d.slots == want.slots && d.tokens == want.tokens, "rank %d: dropped %lld slots / %lld tokens, %lld / %lld expected", me,
         (long long)d.slots, (long long)d.tokens, (long long)want.slots, (long long)want.tokens);
  std::fprintf(stderr, "rank %d: after resume() with rank %d masked: %lld slots of %lld tokens dropped, the rest exact\n", me, missing,
               (long long)d.slots, (long long)d.tokens);
  TEST_CK(cudaStreamDestroy(s));
  for (void* p : {static_cast<void*>(x), static_cast<void*>(y), static_cast<void*>(out), static_cast<void*>(idx), static_cast<void*>(w)})
    TEST_CK(cudaFree(p));
}

int child_main(int me, int n, reccl::proxy::rank_exchange exch) {
  int ngpu = 0;
  if (cudaGetDeviceCount(&ngpu) != cudaSuccess || ngpu < 1) return skip_code;
  TEST_CK(cudaSetDevice(0));
  {
    p2p_communicator comm = p2p_communicator::create(me, n, exch, config(gpu_test::test_timeout_ns(60)));
    cudaStream_t s;
    TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    all_to_allv(me, n, comm, s);
    for (auto p : {reccl::moe_protocol::table, reccl::moe_protocol::staged}) expert_exchange(me, n, comm, s, p);
    TEST_CK(cudaStreamDestroy(s));
  }
  for (auto p : {reccl::moe_protocol::table, reccl::moe_protocol::staged}) missing_rank(me, n, exch, p);
  return child_fails == 0 ? 0 : 1;
}

}  // namespace

TEST_CASE("all_to_allv and MoE, one process per rank on one GPU: 2 processes") {
  gpu_test::run_forked_ranks(2, std::chrono::seconds(300), child_main);
}
TEST_CASE("all_to_allv and MoE, one process per rank on one GPU: 3 processes") {
  gpu_test::run_forked_ranks(3, std::chrono::seconds(300), child_main);
}
