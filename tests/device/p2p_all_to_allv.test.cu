// all_to_allv on the P2P transport with loopback ranks (every rank in this process on GPU 0, each
// on its own stream, every rank's call launched before any host synchronisation): counts and
// offsets in device memory, checked against the send buffers on random counts (zeros, odd counts,
// gapped offsets), element sizes 1, 2, 4 and 8, 2 and 3 ranks, 1 and 4 CTAs; receive buffers
// poisoned, nothing written past what arrives; graph capture and replay with counts a kernel
// writes; counts too large for a receiver, negative counts and a receive buffer outside the
// window fail every rank, naming the rank.
#define CUDA_NO_HALF
#include "../doctest_main.hpp"

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reccl/host/p2p_all_to_allv.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "reccl/policy/schedule/all_to_all.hpp"
#include "reccl/policy/telemetry/none.hpp"
#include "a2av_plan.hpp"
#include "support.cuh"

namespace {

using reccl::p2p_communicator;
template <class T>
using a2av = reccl::all_to_allv<T, reccl::schedule::all_to_all, reccl::transport::p2p, reccl::telemetry::none,
                                reccl::allocator::equal>;
using a2av_test::make_plan;
using a2av_test::plan;
using a2av_test::poison;

/// Loopback ranks, a stream each, and per rank: a send buffer (plain device memory), a receive
/// buffer in the window of `cap` bytes, and the four count arrays.
struct rig {
  int n;
  std::uint64_t cap;
  std::vector<p2p_communicator> comms;
  std::vector<cudaStream_t> streams;
  std::vector<char*> send, recv;
  std::vector<std::int64_t*> counts;  // [4][n]: send counts, send offsets, recv counts, recv offsets

  rig(int nranks, std::uint64_t send_bytes, std::uint64_t recv_bytes) : n(nranks), cap(recv_bytes) {
    reccl::p2p_config cfg;
    cfg.timeout_ns = gpu_test::test_timeout_ns(20);
    cfg.data_bytes = recv_bytes + (8u << 20);
    comms = p2p_communicator::create_loopback(n, 0, cfg);
    streams.resize(n);
    send.resize(n);
    recv.resize(n);
    counts.resize(n);
    for (int r = 0; r < n; ++r) {
      TEST_CK(cudaStreamCreateWithFlags(&streams[r], cudaStreamNonBlocking));
      TEST_CK(cudaMalloc(&send[r], send_bytes + 16));
      recv[r] = static_cast<char*>(comms[r].allocate(recv_bytes));
      TEST_CK(cudaMalloc(&counts[r], 4 * n * sizeof(std::int64_t)));
    }
  }
  ~rig() {
    (void)cudaDeviceSynchronize();
    for (int r = 0; r < n; ++r) {
      (void)cudaStreamDestroy(streams[r]);
      (void)cudaFree(send[r]);
      (void)cudaFree(counts[r]);
    }
  }
  std::int64_t* sc(int r) { return counts[r]; }
  std::int64_t* so(int r) { return counts[r] + n; }
  std::int64_t* rc(int r) { return counts[r] + 2 * n; }
  std::int64_t* ro(int r) { return counts[r] + 3 * n; }
  std::vector<std::string> faults() {
    std::vector<std::string> out;
    for (auto& c : comms) {
      try {
        c.check();
        out.emplace_back();
      } catch (reccl::error const& e) {
        out.emplace_back(e.what());
      }
    }
    return out;
  }
};

template <class T>
void upload(rig& g, plan const& p) {
  int const n = g.n;
  for (int r = 0; r < n; ++r) {
    TEST_CK(cudaMemcpy(g.send[r], p.data[r].data(), p.data[r].size(), cudaMemcpyHostToDevice));
    TEST_CK(cudaMemcpy(g.sc(r), p.counts[r].data(), n * 8, cudaMemcpyHostToDevice));
    TEST_CK(cudaMemcpy(g.so(r), p.offsets[r].data(), n * 8, cudaMemcpyHostToDevice));
    TEST_CK(cudaMemset(g.recv[r], poison, g.cap));
    TEST_CK(cudaMemset(g.rc(r), 0xff, 2 * n * 8));
  }
  TEST_CK(cudaDeviceSynchronize());
}

template <class T>
void verify(rig& g, plan const& p, std::string const& what) {
  int const n = g.n;
  std::vector<unsigned char> got(g.cap);
  std::vector<std::int64_t> rc(n), ro(n);
  for (int d = 0; d < n; ++d) {
    TEST_CK(cudaMemcpy(got.data(), g.recv[d], g.cap, cudaMemcpyDeviceToHost));
    TEST_CK(cudaMemcpy(rc.data(), g.rc(d), n * 8, cudaMemcpyDeviceToHost));
    TEST_CK(cudaMemcpy(ro.data(), g.ro(d), n * 8, cudaMemcpyDeviceToHost));
    std::uint64_t at = 0;
    for (int s = 0; s < n; ++s) {
      INFO(what << ": rank " << d << " from " << s);
      REQUIRE(rc[s] == p.counts[s][d]);
      REQUIRE(ro[s] == std::int64_t(at));
      std::uint64_t const bytes = p.counts[s][d] * sizeof(T);
      REQUIRE(std::memcmp(got.data() + at * sizeof(T), p.data[s].data() + p.offsets[s][d] * sizeof(T), bytes) == 0);
      at += p.counts[s][d];
    }
    for (std::uint64_t i = at * sizeof(T); i < g.cap; ++i) {
      INFO(what << ": rank " << d << " byte " << i << " past what arrived");
      REQUIRE(got[i] == poison);
    }
  }
}

}  // namespace

TEST_CASE_TEMPLATE("p2p all_to_allv: random counts with zeros, 2 and 3 loopback ranks, 1 and 4 CTAs", T, std::uint8_t,
                   std::uint16_t, float, double) {
  REQUIRE_GPU();
  for (int n : {2, 3}) {
    std::int64_t const max_count = (1 << 17) / sizeof(T) + 3;
    rig g(n, (n * (max_count + 2)) * sizeof(T), n * max_count * sizeof(T) + 4096);
    for (int ctas : {1, 4})
      for (std::uint32_t seed : {1u, 2u, 3u}) {
        plan const p = make_plan<T>(n, seed * 7 + ctas + n, seed == 3 ? 5 : max_count);  // seed 3: tiny counts
        upload<T>(g, p);
        for (int r = 0; r < n; ++r)
          a2av<T>::run(g.comms[r], {reinterpret_cast<T const*>(g.send[r]), p.data[r].size() / sizeof(T), g.sc(r), g.so(r)},
                       {reinterpret_cast<T*>(g.recv[r]), g.cap / sizeof(T), g.rc(r), g.ro(r)}, g.streams[r], reccl::a2av_call_options{ctas});
        TEST_CK(cudaDeviceSynchronize());
        for (std::string const& f : g.faults()) REQUIRE(f.empty());
        verify<T>(g, p, "n " + std::to_string(n) + " ctas " + std::to_string(ctas) + " seed " + std::to_string(seed));
      }
  }
}

namespace {
__global__ void copy_counts(std::int64_t* dst, std::int64_t const* src, int words) {
  for (int i = threadIdx.x; i < words; i += blockDim.x) dst[i] = src[i];
}
}  // namespace

TEST_CASE("p2p all_to_allv: captured in a CUDA graph after a kernel that writes the counts, replayed with new counts") {
  REQUIRE_GPU();
  int const n = 3;
  std::int64_t const max_count = 40000;
  reccl::load_kernel(reinterpret_cast<void const*>(&copy_counts));  // launched between ranks' calls: not lazily
  rig g(n, n * (max_count + 2) * 4, n * max_count * 4 + 4096);
  std::vector<std::int64_t*> staged(n);  // what the "router" kernel copies into the count arrays
  for (auto& p : staged) TEST_CK(cudaMalloc(&p, 2 * n * 8));
  std::uint64_t const send_len = n * (max_count + 2);
  auto stage = [&](plan const& p) {
    upload<float>(g, p);
    for (int r = 0; r < n; ++r) {
      TEST_CK(cudaMemcpy(staged[r], p.counts[r].data(), n * 8, cudaMemcpyHostToDevice));
      TEST_CK(cudaMemcpy(staged[r] + n, p.offsets[r].data(), n * 8, cudaMemcpyHostToDevice));
      TEST_CK(cudaMemset(g.sc(r), 0, 2 * n * 8));  // only the kernel gives the right counts
    }
    TEST_CK(cudaDeviceSynchronize());
  };
  auto call = [&](int r) {
    copy_counts<<<1, 64, 0, g.streams[r]>>>(g.sc(r), staged[r], 2 * n);
    a2av<float>::run(g.comms[r], {reinterpret_cast<float const*>(g.send[r]), send_len, g.sc(r), g.so(r)},
                     {reinterpret_cast<float*>(g.recv[r]), g.cap / 4, g.rc(r), g.ro(r)}, g.streams[r], reccl::a2av_call_options{2});
  };
  plan const first = make_plan<float>(n, 11, max_count);
  stage(first);
  for (int r = 0; r < n; ++r) call(r);  // the first call reserves the lane: outside capture
  TEST_CK(cudaDeviceSynchronize());
  verify<float>(g, first, "eager");
  std::vector<cudaGraphExec_t> exec(n);
  for (int r = 0; r < n; ++r) {
    cudaGraph_t graph = nullptr;
    TEST_CK(cudaStreamBeginCapture(g.streams[r], cudaStreamCaptureModeThreadLocal));
    call(r);
    TEST_CK(cudaStreamEndCapture(g.streams[r], &graph));
    TEST_CK(cudaGraphInstantiate(&exec[r], graph, 0));
    TEST_CK(cudaGraphDestroy(graph));
  }
  for (std::uint32_t round = 0; round < 4; ++round) {
    plan const p = make_plan<float>(n, 100 + round, round == 2 ? 0 : max_count);  // round 2: every count 0
    stage(p);
    for (int r = 0; r < n; ++r) TEST_CK(cudaGraphLaunch(exec[r], g.streams[r]));
    TEST_CK(cudaDeviceSynchronize());
    for (std::string const& f : g.faults()) REQUIRE(f.empty());
    verify<float>(g, p, "replay " + std::to_string(round));
  }
  for (auto e : exec) TEST_CK(cudaGraphExecDestroy(e));
  for (auto p : staged) TEST_CK(cudaFree(p));
}

TEST_CASE("p2p all_to_allv: bad counts, a receiver too small, a buffer outside the window or another CTA count fail every rank, naming the rank") {
  REQUIRE_GPU();
  int const n = 3, bad = 1;
  // 0: rank 1's receive buffer one element short; 1: a negative count on rank 1; 2: rank 1's receive
  // buffer outside the window (host check); 3: rank 1 runs 2 CTAs, the others 4; 4: rank 0's buffer
  // too small and a negative count on rank 2 (the refusal is named first, whatever the rank order)
  char const* const expect[] = {"rank 1: receive buffer too small", "rank 1: bad argument", "rank 1: buffer not in the communicator's window",
                                "rank 1: arguments disagree with a peer's (peer 0)", "rank 2: bad argument"};
  for (int how : {0, 1, 2, 3, 4}) {
    CAPTURE(how);
    rig g(n, 3 * 1002 * 4, 3 * 1000 * 4);
    plan const p = make_plan<float>(n, 5, 1000, 0b011);  // ranks 0 and 1 receive 3000 elements, what their buffers hold
    upload<float>(g, p);
    int const negative_on = how == 1 ? bad : how == 4 ? 2 : -1;
    if (negative_on >= 0) {
      std::vector<std::int64_t> neg = p.counts[negative_on];
      neg[0] = -4;
      TEST_CK(cudaMemcpy(g.sc(negative_on), neg.data(), n * 8, cudaMemcpyHostToDevice));
    }
    std::string thrown;
    for (int r = 0; r < n; ++r) {
      std::uint64_t const cap = (how == 0 && r == bad) || (how == 4 && r == 0) ? 2999 : g.cap / 4;
      float* recv = how == 2 && r == bad ? reinterpret_cast<float*>(g.send[r]) : reinterpret_cast<float*>(g.recv[r]);
      try {
        a2av<float>::run(g.comms[r], {reinterpret_cast<float const*>(g.send[r]), p.data[r].size() / 4, g.sc(r), g.so(r)},
                         {recv, cap, g.rc(r), g.ro(r)}, g.streams[r], reccl::a2av_call_options{how == 3 && r == bad ? 2 : 4});
      } catch (reccl::error const& e) {
        CHECK(r == bad);
        thrown = e.what();
      }
    }
    TEST_CK(cudaDeviceSynchronize());
    auto const f = g.faults();
    for (int r = 0; r < n; ++r) {
      CAPTURE(r);
      CAPTURE(f[r]);
      CHECK(f[r].find(expect[how]) != std::string::npos);
    }
    if (how == 2) CHECK(thrown.find("allocate it with p2p_communicator::allocate") != std::string::npos);
    std::vector<unsigned char> got(g.cap);
    for (int r = 0; r < n; ++r) {  // no data moved
      TEST_CK(cudaMemcpy(got.data(), g.recv[r], g.cap, cudaMemcpyDeviceToHost));
      for (unsigned char b : got) REQUIRE(b == poison);
    }
  }
}
