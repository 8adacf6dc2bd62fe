// MoE dispatch/combine on the P2P transport with loopback ranks (every rank in this process on
// GPU 0), compared bit for bit with the CPU engine's expert exchange on the same routing: the
// grouped rows, the per-expert counts and offsets, and the combined outputs. Uniform, skewed,
// sparse and one-rank routing, bf16 and float, 2 and 3 ranks, packed and aligned layouts, each
// exchange used twice; fp8 dispatch (values and scales bit for bit); graph capture and replay with
// new routing; an expert index out of range on one rank fails every rank, naming it. Every case
// runs with both protocols (table and staged), which must give the same results bit for bit.
#define CUDA_NO_HALF
#include "../doctest_main.hpp"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "reccl/cpu/expert_exchange.hpp"
#include "reccl/host/p2p_expert_exchange.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "reccl/policy/schedule/all_to_all.hpp"
#include "reccl/policy/telemetry/none.hpp"
#include "support.cuh"
#include "moe_reference.cuh"
#include "tests/cpu/moe_cases.hpp"

namespace {

using namespace reccl_test;
using namespace moe_test;
using reccl::p2p_communicator;

/// The protocol the rigs below create their exchanges with (each test case runs with both).
reccl::moe_protocol protocol = reccl::moe_protocol::table;
template <class F>
void for_each_protocol(F&& f) {
  for (auto p : {reccl::moe_protocol::table, reccl::moe_protocol::staged}) {
    protocol = p;
    INFO("protocol " << (p == reccl::moe_protocol::staged ? "staged" : "table"));
    f();
  }
  protocol = reccl::moe_protocol::table;
}

/// Loopback ranks with one expert exchange each and device copies of a case's inputs.
template <class H, class D>
struct rig {
  int n;
  std::uint64_t max_tokens;
  int hidden, epr;
  std::vector<p2p_communicator> comms;
  std::vector<cudaStream_t> streams;
  std::vector<std::unique_ptr<reccl::p2p_expert_exchange<D>>> ex;
  std::vector<D*> x, y, out;
  std::vector<std::int32_t*> idx;
  std::vector<float*> w;

  /// Every rank's exchange has `ctas` CTAs, but rank `odd_rank` (if any) has `odd_ctas`. The
  /// waits' deadline is `timeout_s` seconds (RECCL_TEST_TIMEOUT_S, else 20, when 0).
  rig(reccl::moe::exchange_config const& cfg, int ctas, int odd_rank = -1, int odd_ctas = 0, double timeout_s = 0)
      : n(cfg.route.nranks), max_tokens(cfg.max_tokens), hidden(cfg.hidden), epr(cfg.route.experts_per_rank()) {
    // launched between the ranks' calls from this thread: loaded now, not lazily behind a spinning rank
    reccl::load_kernel(reinterpret_cast<void const*>(&experts_kernel<D>));
    reccl::p2p_config pc;
    pc.timeout_ns = timeout_s > 0 ? static_cast<std::uint64_t>(timeout_s * 1e9) : gpu_test::test_timeout_ns(20);
    pc.data_bytes = 96ull << 20;
    comms = p2p_communicator::create_loopback(n, 0, pc);
    std::uint64_t const grouped = reccl::moe::receive_bound_of(cfg.route, cfg.max_tokens, cfg.align).grouped;
    for (int r = 0; r < n; ++r) {
      cudaStream_t s;
      TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
      streams.push_back(s);
      ex.push_back(std::make_unique<reccl::p2p_expert_exchange<D>>(comms[r], cfg, r == odd_rank ? odd_ctas : ctas, protocol));
      x.push_back(alloc<D>(max_tokens * hidden));
      out.push_back(alloc<D>(max_tokens * hidden));
      y.push_back(alloc<D>(grouped * hidden + 1));
      idx.push_back(alloc<std::int32_t>(max_tokens * cfg.route.top_k + 1));
      w.push_back(alloc<float>(max_tokens * cfg.route.top_k + 1));
    }
  }
  ~rig() {
    (void)cudaDeviceSynchronize();
    ex.clear();
    for (int r = 0; r < n; ++r) {
      (void)cudaFree(x[r]), (void)cudaFree(out[r]), (void)cudaFree(y[r]), (void)cudaFree(idx[r]), (void)cudaFree(w[r]);
      (void)cudaStreamDestroy(streams[r]);
    }
  }
  template <class T>
  static T* alloc(std::uint64_t elems) {
    T* p = nullptr;
    TEST_CK(cudaMalloc(&p, elems * sizeof(T) + 16));
    return p;
  }
  void upload(moe_case<H> const& c) {
    static_assert(sizeof(H) == sizeof(D));
    for (int r = 0; r < n; ++r) {
      TEST_CK(cudaMemcpy(x[r], c.x[r].data(), c.x[r].size() * sizeof(H), cudaMemcpyHostToDevice));
      TEST_CK(cudaMemcpy(idx[r], c.idx[r].data(), c.idx[r].size() * 4, cudaMemcpyHostToDevice));
      TEST_CK(cudaMemcpy(w[r], c.w[r].data(), c.w[r].size() * 4, cudaMemcpyHostToDevice));
      TEST_CK(cudaMemset(out[r], 0xA5, max_tokens * hidden * sizeof(D)));
    }
    TEST_CK(cudaDeviceSynchronize());
  }
  /// dispatch, experts, combine on rank r's stream.
  void layer(int r, std::uint64_t tokens) {
    ex[r]->dispatch(x[r], idx[r], tokens, streams[r]);
    experts_kernel<D><<<64, 256, 0, streams[r]>>>(ex[r]->received(), y[r], ex[r]->expert_offsets(), ex[r]->expert_counts(), epr, r, hidden);
    ex[r]->combine(y[r], w[r], out[r], streams[r]);
  }
  /// One layer of rank r (tokens fixed) captured in a CUDA graph.
  cudaGraphExec_t capture_layer(int r, std::uint64_t tokens) {
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    TEST_CK(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal));
    layer(r, tokens);
    TEST_CK(cudaStreamEndCapture(streams[r], &graph));
    TEST_CK(cudaGraphInstantiate(&exec, graph, 0));
    TEST_CK(cudaGraphDestroy(graph));
    return exec;
  }
  std::vector<std::string> faults() {
    std::vector<std::string> f;
    for (auto& c : comms) {
      try {
        c.check();
        f.emplace_back();
      } catch (reccl::error const& e) {
        f.emplace_back(e.what());
      }
    }
    return f;
  }
  /// Compares the device results of every rank in `live` (bit r: rank r) with the CPU engine's.
  void verify(moe_case<H> const& c, cpu_answer<H> const& ans, std::string const& what, std::uint64_t live = ~0ull) {
    auto const f = faults();
    for (int r = 0; r < n; ++r) {
      if (!((live >> r) & 1u)) continue;
      REQUIRE_MESSAGE(f[r].empty(), what << ": " << f[r]);
    }
    for (int r = 0; r < n; ++r) {
      if (!((live >> r) & 1u)) continue;
      INFO(what << ", rank " << r);
      std::vector<std::int32_t> counts(epr), offsets(epr + 1);
      TEST_CK(cudaMemcpy(counts.data(), ex[r]->expert_counts(), epr * 4, cudaMemcpyDeviceToHost));
      TEST_CK(cudaMemcpy(offsets.data(), ex[r]->expert_offsets(), (epr + 1) * 4, cudaMemcpyDeviceToHost));
      REQUIRE(counts == ans.counts[r]);
      REQUIRE(offsets == ans.offsets[r]);
      std::vector<H> got(ans.grouped[r].size());
      TEST_CK(cudaMemcpy(got.data(), ex[r]->received(), got.size() * sizeof(H), cudaMemcpyDeviceToHost));
      REQUIRE(std::memcmp(got.data(), ans.grouped[r].data(), got.size() * sizeof(H)) == 0);
      std::vector<H> o(c.tokens[r] * hidden);
      TEST_CK(cudaMemcpy(o.data(), out[r], o.size() * sizeof(H), cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < o.size(); ++i) {
        INFO("output element " << i);
        REQUIRE(std::memcmp(&o[i], &ans.out[r][i], sizeof(H)) == 0);
      }
    }
  }
};

/// A case for a captured graph (fixed token counts): every rank sends `T` tokens, rank 0 with
/// uniform routing, the others the rows and routing of `others`' rank 0.
template <class H>
moe_case<H> fixed_case(reccl::moe::routing g, int hidden, std::uint64_t T, routing_kind others, std::uint32_t seed) {
  auto c = make_moe_case<H>(g, hidden, T, routing_kind::uniform, seed);
  auto const o = make_moe_case<H>(g, hidden, T, others, seed + 1000);
  for (int r = 1; r < g.nranks; ++r) c.tokens[r] = T, c.x[r] = o.x[0], c.idx[r] = o.idx[0], c.w[r] = o.w[0];
  return c;
}

template <class H, class D>
void check_cases(int n, int experts, int k, int hidden, std::uint64_t max_tokens, int align, int ctas) {
  reccl::moe::routing const g{n, experts, k};
  rig<H, D> rg({g, max_tokens, hidden, align}, ctas);
  for (routing_kind kind : {routing_kind::uniform, routing_kind::skewed, routing_kind::sparse, routing_kind::one_rank})
    for (int round = 0; round < 2; ++round) {  // each exchange used again with other routing
      auto const c = make_moe_case<H>(g, hidden, max_tokens, kind, 17u * n + 5u * k + 3u * unsigned(kind) + round);
      auto const ans = cpu_reference(c, max_tokens, align);
      rg.upload(c);
      if (round == 1)  // a dispatch with no combine before the layer: the table's two copies alternate
        for (int r = 0; r < n; ++r) rg.ex[r]->dispatch(rg.x[r], rg.idx[r], c.tokens[r], rg.streams[r]);
      for (int r = 0; r < n; ++r) rg.layer(r, c.tokens[r]);
      TEST_CK(cudaDeviceSynchronize());
      rg.verify(c, ans, "n " + std::to_string(n) + " kind " + std::to_string(int(kind)) + " round " + std::to_string(round));
    }
}

}  // namespace

TEST_CASE("p2p expert exchange: bf16 and float, 2 and 3 loopback ranks, the CPU engine's layout and outputs bit for bit") {
  REQUIRE_GPU();
  for_each_protocol([&] {
    check_cases<reccl::bfloat16, __nv_bfloat16>(2, 8, 4, 256, 96, 1, 4);
    check_cases<reccl::bfloat16, __nv_bfloat16>(3, 12, 8, 136, 40, 16, 2);  // aligned for a grouped GEMM; k > experts per rank
    check_cases<float, float>(3, 6, 2, 33, 17, 4, 1);                       // odd hidden
    check_cases<reccl::bfloat16, __nv_bfloat16>(2, 256, 8, 7168, 64, 16, 8);  // DeepSeek-V3 hidden, experts and top-k, 64 tokens per rank
    // a few tokens on many warps: rows, padding and returns cut into many pieces per row
    check_cases<reccl::bfloat16, __nv_bfloat16>(2, 256, 8, 7168, 2, 16, 16);
    check_cases<float, float>(3, 6, 2, 1001, 3, 4, 8);  // rows of 4,004 bytes: pieces that are not whole 16-byte packs
  });
}

TEST_CASE("p2p expert exchange: fp8 dispatch, values and scales bit for bit in the CPU engine's layout, and the combine after it") {
  REQUIRE_GPU();
  for_each_protocol([&] {
    struct shape {
      int n, experts, k, hidden;
      std::uint64_t T;
      int align, ctas;
    };
    for (shape sh : {shape{2, 8, 4, 256, 40, 1, 4}, shape{3, 12, 8, 128, 24, 16, 2}, shape{2, 256, 8, 7168, 32, 16, 8}}) {
      CAPTURE(sh.n);
      CAPTURE(sh.hidden);
      reccl::moe::routing const g{sh.n, sh.experts, sh.k};
      int const S = sh.hidden / reccl::moe::fp8_block;
      reccl::moe::exchange_config const cfg{g, sh.T, sh.hidden, sh.align, reccl::moe::payload::fp8_e4m3};
      rig<reccl::bfloat16, __nv_bfloat16> rg(cfg, sh.ctas);
      reccl::load_kernel(reinterpret_cast<void const*>(&fp8_experts_kernel<__nv_bfloat16>));
      std::vector<std::uint8_t*> v(sh.n);
      std::vector<float*> sc(sh.n);
      for (int r = 0; r < sh.n; ++r) v[r] = rg.alloc<std::uint8_t>(sh.T * sh.hidden + 1), sc[r] = rg.alloc<float>(sh.T * S + 1);
      for (routing_kind kind : {routing_kind::uniform, routing_kind::skewed, routing_kind::sparse}) {
        auto const c = make_moe_case<reccl::bfloat16>(g, sh.hidden, sh.T, kind, 91u * sh.n + unsigned(kind));
        auto const q = quantise(c);
        auto const ans = cpu_fp8_reference(c, q, sh.T, sh.align);
        rg.upload(c);
        for (int r = 0; r < sh.n; ++r) {
          TEST_CK(cudaMemcpy(v[r], q.values[r].data(), q.values[r].size(), cudaMemcpyHostToDevice));
          TEST_CK(cudaMemcpy(sc[r], q.scales[r].data(), q.scales[r].size() * 4, cudaMemcpyHostToDevice));
        }
        for (int r = 0; r < sh.n; ++r) {
          rg.ex[r]->dispatch(reccl::moe::fp8_tokens{v[r], sc[r]}, rg.idx[r], c.tokens[r], rg.streams[r]);
          auto const rec = rg.ex[r]->received_fp8();
          fp8_experts_kernel<__nv_bfloat16><<<64, 256, 0, rg.streams[r]>>>(rec.values, rec.scales, rg.y[r], rg.ex[r]->expert_offsets(),
                                                                           rg.ex[r]->expert_counts(), rg.epr, r, sh.hidden);
          rg.ex[r]->combine(rg.y[r], rg.w[r], rg.out[r], rg.streams[r]);
        }
        TEST_CK(cudaDeviceSynchronize());
        for (std::string const& f : rg.faults()) REQUIRE_MESSAGE(f.empty(), f);
        for (int r = 0; r < sh.n; ++r) {
          INFO("kind " << int(kind) << ", rank " << r);
          std::vector<std::int32_t> counts(rg.epr), offsets(rg.epr + 1);
          TEST_CK(cudaMemcpy(counts.data(), rg.ex[r]->expert_counts(), rg.epr * 4, cudaMemcpyDeviceToHost));
          TEST_CK(cudaMemcpy(offsets.data(), rg.ex[r]->expert_offsets(), (rg.epr + 1) * 4, cudaMemcpyDeviceToHost));
          REQUIRE(counts == ans.counts[r]);
          REQUIRE(offsets == ans.offsets[r]);
          auto const rec = rg.ex[r]->received_fp8();
          std::vector<std::uint8_t> got_v(ans.values[r].size());
          std::vector<float> got_s(ans.scales[r].size());
          TEST_CK(cudaMemcpy(got_v.data(), rec.values, got_v.size(), cudaMemcpyDeviceToHost));
          TEST_CK(cudaMemcpy(got_s.data(), rec.scales, got_s.size() * 4, cudaMemcpyDeviceToHost));
          REQUIRE(got_v == ans.values[r]);
          REQUIRE(std::memcmp(got_s.data(), ans.scales[r].data(), got_s.size() * 4) == 0);
          std::vector<reccl::bfloat16> o(c.tokens[r] * sh.hidden);
          TEST_CK(cudaMemcpy(o.data(), rg.out[r], o.size() * 2, cudaMemcpyDeviceToHost));
          REQUIRE(std::memcmp(o.data(), ans.out[r].data(), o.size() * 2) == 0);
        }
      }
      // token rows on an fp8 exchange: refused on the host, every rank faults naming the rank
      std::string what;
      try {
        rg.ex[1]->dispatch(rg.x[1], rg.idx[1], 1, rg.streams[1]);
      } catch (reccl::error const& e) {
        what = e.what();
      }
      CHECK(what.find("token rows dispatched on an exchange created for fp8") != std::string::npos);
      TEST_CK(cudaDeviceSynchronize());
      for (std::string const& f : rg.faults()) CHECK(f.find("rank 1: bad argument") != std::string::npos);
      for (int r = 0; r < sh.n; ++r) (void)cudaFree(v[r]), (void)cudaFree(sc[r]);
    }
  });
}

TEST_CASE("p2p expert exchange: captured in a CUDA graph, replayed with new routing") {
  REQUIRE_GPU();
  for_each_protocol([&] {
    int const n = 3, hidden = 512;
    std::uint64_t const T = 48;
    reccl::moe::routing const g{n, 24, 6};
    rig<reccl::bfloat16, __nv_bfloat16> rg({g, T, hidden, 8}, 4);
    auto fixed = [&](std::uint32_t seed) { return fixed_case<reccl::bfloat16>(g, hidden, T, routing_kind::sparse, seed); };
    auto const first = fixed(1);
    rg.upload(first);
    for (int r = 0; r < n; ++r) rg.layer(r, T);  // eager first
    TEST_CK(cudaDeviceSynchronize());
    rg.verify(first, cpu_reference(first, T, 8), "eager");
    std::vector<cudaGraphExec_t> exec(n);
    for (int r = 0; r < n; ++r) exec[r] = rg.capture_layer(r, T);
    for (std::uint32_t round = 0; round < 3; ++round) {
      auto const c = fixed(50 + round);
      rg.upload(c);
      for (int r = 0; r < n; ++r) TEST_CK(cudaGraphLaunch(exec[r], rg.streams[r]));
      TEST_CK(cudaDeviceSynchronize());
      rg.verify(c, cpu_reference(c, T, 8), "replay " + std::to_string(round));
    }
    for (auto e : exec) TEST_CK(cudaGraphExecDestroy(e));
  });
}

TEST_CASE("p2p expert exchange: bad input on one rank fails every rank, naming it, and moves nothing") {
  REQUIRE_GPU();
  for_each_protocol([&] {
    int const n = 3;
    reccl::moe::routing const g{n, 6, 2};
    auto c = make_moe_case<float>(g, 16, 8, routing_kind::uniform, 3);
    REQUIRE(std::count_if(c.idx[0].begin(), c.idx[0].end(), [&](std::int32_t e) { return e >= 0 && g.rank_of(e) == 1; }) > 0);
    // 0: an expert out of range; 1: an expert twice in a token; 2: rank 2 created with 1 CTA, not 2;
    // 3: rank 1 passes a null y although it received rows; 4: rank 0 combines one dispatch twice
    char const* const expect[] = {"rank 0: bad argument", "rank 0: bad argument", "rank 2: arguments disagree", "rank 1: null buffer",
                                  "rank 0: bad argument"};
    for (int how : {0, 1, 2, 3, 4}) {
      CAPTURE(how);
      rig<float, float> rg({g, 8, 16, 1}, 2, how == 2 ? 2 : -1, 1);
      if (protocol == reccl::moe_protocol::staged && how != 2) {  // a good layer first: the shapes agreed, the later
        rg.upload(c);                                             // checks come after the rows moved into staging
        for (int r = 0; r < n; ++r) rg.layer(r, c.tokens[r]);
        TEST_CK(cudaDeviceSynchronize());
        for (std::string const& f : rg.faults()) REQUIRE_MESSAGE(f.empty(), f);
      }
      auto bad = c;
      if (how == 0) bad.idx[0][3] = 6;  // rank 0 sends 8 tokens (make_moe_case fills rank 0)
      if (how == 1) bad.idx[0][2] = 4, bad.idx[0][3] = 4;
      rg.upload(bad);
      std::string thrown;
      for (int r = 0; r < n; ++r) {
        rg.ex[r]->dispatch(rg.x[r], rg.idx[r], bad.tokens[r], rg.streams[r]);
        experts_kernel<float><<<64, 256, 0, rg.streams[r]>>>(rg.ex[r]->received(), rg.y[r], rg.ex[r]->expert_offsets(),
                                                            rg.ex[r]->expert_counts(), rg.epr, r, rg.hidden);
        try {
          rg.ex[r]->combine(how == 3 && r == 1 ? nullptr : rg.y[r], rg.w[r], rg.out[r], rg.streams[r]);
          if (how == 4 && r == 0) rg.ex[r]->combine(rg.y[r], rg.w[r], rg.out[r], rg.streams[r]);
        } catch (reccl::error const& e) {
          thrown = e.what();
        }
      }
      TEST_CK(cudaDeviceSynchronize());
      auto const f = rg.faults();
      for (int r = 0; r < n; ++r) {
        CAPTURE(r);
        CAPTURE(f[r]);
        CHECK(f[r].find(expect[how]) != std::string::npos);
      }
      if (how == 4) CHECK(thrown.find("a second combine of one dispatch") != std::string::npos);
      if (how < 4) {  // nothing summed: every rank's output keeps its poison
        std::vector<unsigned char> o(8 * 16 * 4);
        for (int r = 0; r < n; ++r) {
          TEST_CK(cudaMemcpy(o.data(), rg.out[r], o.size(), cudaMemcpyDeviceToHost));
          for (unsigned char b : o) REQUIRE(b == 0xA5);
        }
      }
      if (how == 0) {  // and too many tokens is refused on the host, before anything is launched
        std::string what;
        try {
          rg.ex[1]->dispatch(rg.x[1], rg.idx[1], 9, rg.streams[1]);
        } catch (reccl::error const& e) {
          what = e.what();
        }
        CHECK(what.find("9 tokens, created for 8") != std::string::npos);
      }
    }
  });
}

TEST_CASE("p2p expert exchange: a rank that stops is named, the others resume, mask it and replay their graphs, its slots reported dropped") {
  REQUIRE_GPU();
  for_each_protocol([&] {
    int const n = 3, dead = 2, align = 4, hidden = 96;
    std::uint64_t const T = 24;
    std::uint64_t const live = 0b011;
    reccl::moe::routing const g{n, 12, 4};
    rig<reccl::bfloat16, __nv_bfloat16> rg({g, T, hidden, align}, 2, -1, 0, /*timeout_s=*/0.25);
    auto fixed = [&](std::uint32_t seed) { return fixed_case<reccl::bfloat16>(g, hidden, T, routing_kind::uniform, seed); };
    auto drops_of = [&](int r) {
      reccl::moe::drop_report got{};
      TEST_CK(cudaMemcpy(&got, rg.ex[r]->dropped(), sizeof(got), cudaMemcpyDeviceToHost));
      return got;
    };
    // the live ranks' results against the CPU engine's answer without rank 2, and their drop counts
    auto verify_masked = [&](moe_case<reccl::bfloat16> const& c, std::string const& what) {
      rg.verify(without_rank(c, dead), cpu_reference(without_rank(c, dead), T, align), what, live);
      for (int r : {0, 1}) {
        INFO(what << ", rank " << r);
        auto const got = drops_of(r), want = expected_drops(c, r, dead);
        CHECK(got.slots == want.slots);
        CHECK(got.tokens == want.tokens);
      }
    };

    // 1. a layer captured on every rank, replayed by all three
    std::vector<cudaGraphExec_t> exec(n);
    for (int r = 0; r < n; ++r) exec[r] = rg.capture_layer(r, T);
    auto const c0 = fixed(401);
    rg.upload(c0);
    for (int r = 0; r < n; ++r) TEST_CK(cudaGraphLaunch(exec[r], rg.streams[r]));
    TEST_CK(cudaDeviceSynchronize());
    rg.verify(c0, cpu_reference(c0, T, align), "all three");
    CHECK(drops_of(0).slots == 0);

    // 2. rank 2 stops: ranks 0 and 1 give up at the deadline, naming it; nothing is summed
    auto const c1 = fixed(402);
    REQUIRE(expected_drops(c1, 0, dead).slots > 0);
    REQUIRE(expected_drops(c1, 1, dead).slots > 0);
    rg.upload(c1);
    for (int r : {0, 1}) TEST_CK(cudaGraphLaunch(exec[r], rg.streams[r]));
    TEST_CK(cudaDeviceSynchronize());
    {
      auto const f = rg.faults();
      for (int r : {0, 1}) {
        CAPTURE(f[r]);
        CHECK(f[r].find("rank " + std::to_string(r) + ": timed out waiting for a peer (peer 2)") != std::string::npos);
        std::vector<unsigned char> o(T * hidden * 2);
        TEST_CK(cudaMemcpy(o.data(), rg.out[r], o.size(), cudaMemcpyDeviceToHost));
        for (unsigned char b : o) REQUIRE(b == 0xA5);
      }
    }

    // 3. they resume with rank 2 masked and replay the same graphs (the mask is read when a dispatch
    // runs): rank 2's slots dropped and reported, the rest exact -- the CPU engine's answer for the
    // same routing without rank 2's tokens and slots
    for (int r : {0, 1}) rg.comms[r].resume(rg.streams[r]), rg.ex[r]->mask_ranks(1ull << dead, rg.streams[r]);
    {  // the failed dispatch cannot be combined after resume(): refused, every live rank faults naming rank 0
      std::string what;
      try {
        rg.ex[0]->combine(rg.y[0], rg.w[0], rg.out[0], rg.streams[0]);
      } catch (reccl::error const& e) {
        what = e.what();
      }
      CHECK(what.find("combine of a dispatch from before comm.resume()") != std::string::npos);
      TEST_CK(cudaDeviceSynchronize());
      auto const f = rg.faults();
      for (int r : {0, 1}) {
        CAPTURE(f[r]);
        CHECK(f[r].find("rank 0: bad argument") != std::string::npos);
      }
      for (int r : {0, 1}) rg.comms[r].resume(rg.streams[r]);  // a second resume(): generation 2 on both
    }
    for (std::uint32_t round = 0; round < 4; ++round) {
      auto const c = round == 0 ? c1 : fixed(410 + round);
      rg.upload(c);
      for (int r : {0, 1}) TEST_CK(cudaGraphLaunch(exec[r], rg.streams[r]));
      TEST_CK(cudaDeviceSynchronize());
      verify_masked(c, "masked replay " + std::to_string(round));
    }
    // 4. and eager calls with any token counts, skewed routing too
    for (std::uint32_t round = 0; round < 2; ++round) {
      auto const c = make_moe_case<reccl::bfloat16>(g, hidden, T, round == 0 ? routing_kind::skewed : routing_kind::uniform, 420 + round);
      rg.upload(c);
      for (int r : {0, 1}) rg.layer(r, c.tokens[r]);
      TEST_CK(cudaDeviceSynchronize());
      verify_masked(c, "masked eager " + std::to_string(round));
    }
    for (int r = 0; r < n; ++r) TEST_CK(cudaGraphExecDestroy(exec[r]));
  });
}

TEST_CASE("p2p expert exchange: masks that name the rank itself or no rank are refused, masks that differ fail naming the rank") {
  REQUIRE_GPU();
  for_each_protocol([&] {
    int const n = 3;
    reccl::moe::routing const g{n, 6, 2};
    rig<float, float> rg({g, 8, 16, 1}, 2, -1, 0, /*timeout_s=*/0.25);
    auto thrown = [&](int r, std::uint64_t mask) {
      try {
        rg.ex[r]->mask_ranks(mask, rg.streams[r]);
      } catch (reccl::error const& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    CHECK(thrown(1, 0b010).find("names this rank itself") != std::string::npos);
    CHECK(thrown(1, 0b1000).find("names a rank outside [0, 3)") != std::string::npos);
    rg.ex[0]->mask_ranks(0b100, rg.streams[0]);  // ranks 1 and 2 mask nobody
    auto const c = make_moe_case<float>(g, 16, 8, routing_kind::uniform, 440);
    rg.upload(c);
    for (int r = 0; r < n; ++r) rg.layer(r, c.tokens[r]);
    TEST_CK(cudaDeviceSynchronize());
    auto const f = rg.faults();
    for (int r : {0, 1}) {
      CAPTURE(f[r]);
      CHECK(f[r].find("rank 1: arguments disagree with a peer's (peer 0)") != std::string::npos);
    }
    CAPTURE(f[2]);
    CHECK(f[2].find("rank 2: timed out waiting for a peer (peer 0)") != std::string::npos);  // rank 0 never signals it
  });
}
