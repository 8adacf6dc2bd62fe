// The composed collectives' call behaviour on the P2P transport with loopback ranks
// (tests/device/p2p_world.hpp):
//  * graph capture: refused with a clear error before the first call, replayed with new inputs after;
//  * bad input on one rank (null, misaligned, bad root, bad split): that rank throws, every other
//    rank stops at once (well before its deadline) and its check() names the rank and the cause;
//  * a rank that never calls: the others time out naming it; after resume() on every rank the
//    same call runs again, exact.
// The VT splits and the big cases of each plan live with its correctness cases
// (p2p_all_reduce, p2p_reduce_scatter_all_gather, p2p_broadcast_all_to_all), which instantiate it.
#define CUDA_NO_HALF  // reccl::half, not cuda_fp16.h's global `half`
#include "../doctest_main.hpp"

#include "p2p_world.hpp"

using namespace p2p_test;

TEST_CASE("p2p loopback: graph capture and replay with new inputs") {
  REQUIRE_GPU();
  using ar = gpu_op<collective::all_reduce, reccl::schedule::ring, float>;
  int const n = 3;
  world w(n);
  std::uint64_t const count = (1u << 18) + 5;
  std::size_t const bytes = count * sizeof(float);
  w.reserve(2 * bytes + 512);
  auto send = [&](int r) { return reinterpret_cast<float*>(w.arena[static_cast<std::size_t>(r)]); };
  auto recv = [&](int r) { return reinterpret_cast<float*>(w.arena[static_cast<std::size_t>(r)] + bytes + 256); };
  gpu_call_options o;
  o.n_vts = 3;

  // Without a call before capture, the staging would have to grow inside it: refused.
  for (int r = 0; r < n; ++r) {
    auto const s = w.streams[static_cast<std::size_t>(r)];
    TEST_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    std::string what;
    try {
      ar::run(w.comms[static_cast<std::size_t>(r)], send(r), recv(r), count, redop::sum, s, o);
    } catch (reccl::error const& e) {
      what = e.what();
    }
    cudaGraph_t graph = nullptr;
    TEST_CK(cudaStreamEndCapture(s, &graph));
    if (graph) TEST_CK(cudaGraphDestroy(graph));
    CHECK_MESSAGE(what.find("capture") != std::string::npos, "rank " << r << ": a first call during capture gave: '" << what << "'");
    CHECK_MESSAGE(what.find("run the call once before capturing") != std::string::npos, "rank " << r << ": " << what);
  }
  TEST_CK(cudaGetLastError());
  for (int r = 0; r < n; ++r) {
    CHECK_MESSAGE(w.comms[static_cast<std::size_t>(r)].fault().ok(), "rank " << r << ": a refused capture left a fault");
  }

  // Warm-up call, then capture two calls per rank and replay with new inputs.
  std::mt19937_64 g(5);
  auto upload = [&](std::vector<std::vector<float>> const& in) {
    for (int r = 0; r < n; ++r) {
      TEST_CK(cudaMemcpy(send(r), in[static_cast<std::size_t>(r)].data(), bytes, cudaMemcpyHostToDevice));
      TEST_CK(cudaMemset(recv(r), poison_byte, bytes));
    }
    TEST_CK(cudaDeviceSynchronize());
  };
  auto verify = [&](std::vector<std::vector<float>> const& in, std::string const& when) {
    std::vector<float> got(count);
    for (int r = 0; r < n; ++r) {
      TEST_CK(cudaMemcpy(got.data(), recv(r), bytes, cudaMemcpyDeviceToHost));
      std::string first;
      long const wrong = check_output<float>(collective::all_reduce, redop::sum, 0, count, r, in, got, first);
      CHECK_MESSAGE(wrong == 0, when << " rank " << r << ": " << wrong << " wrong, first " << first);
    }
  };
  // The calls a graph holds: recv -> recv in place (the input is staged), then send -> recv; the
  // result is the plain all-reduce of send.
  auto calls = [&](int r, cudaStream_t s) {
    ar::run(w.comms[static_cast<std::size_t>(r)], recv(r), recv(r), count, redop::max, s, o);
    ar::run(w.comms[static_cast<std::size_t>(r)], send(r), recv(r), count, redop::sum, s, o);
  };
  auto in = make_inputs<collective::all_reduce, float>(n, count, redop::sum, g);
  upload(in);
  for (int r = 0; r < n; ++r) calls(r, w.streams[static_cast<std::size_t>(r)]);
  w.sync_all();
  verify(in, "warm-up calls");

  std::vector<cudaGraphExec_t> exec(static_cast<std::size_t>(n));
  for (int r = 0; r < n; ++r) {
    auto const s = w.streams[static_cast<std::size_t>(r)];
    cudaGraph_t graph;
    TEST_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    calls(r, s);
    TEST_CK(cudaStreamEndCapture(s, &graph));
    TEST_CK(cudaGraphInstantiate(&exec[static_cast<std::size_t>(r)], graph, 0));
    TEST_CK(cudaGraphDestroy(graph));
  }
  for (int rep = 0; rep < 5; ++rep) {
    in = make_inputs<collective::all_reduce, float>(n, count, redop::sum, g);
    upload(in);
    for (int r = 0; r < n; ++r) TEST_CK(cudaGraphLaunch(exec[static_cast<std::size_t>(r)], w.streams[static_cast<std::size_t>(r)]));
    w.sync_all();
    verify(in, "replay " + std::to_string(rep));
  }
  for (auto e : exec) TEST_CK(cudaGraphExecDestroy(e));
  auto const f = w.faults();
  for (int r = 0; r < n; ++r) CHECK_MESSAGE(f[static_cast<std::size_t>(r)].empty(), "rank " << r << ": " << f[static_cast<std::size_t>(r)]);
}

namespace {

/// One rank of `n` makes a bad call; the others make a good one. The bad rank must throw naming
/// `cause`; every other rank must stop within 1 s (deadline 10 s) with check() naming the bad rank
/// and `cause`.
template <collective K, class S>
void bad_call(int n, int bad, std::string const& thrown_cause, std::string const& cause,
              std::function<void(float const*&, float*&, gpu_call_options&)> spoil) {
  INFO(reccl::name(K) << ": rank " << bad << " of " << n << " passes: " << thrown_cause);
  using op = gpu_op<K, S, float>;
  p2p_config cfg;
  cfg.timeout_ns = 10'000'000'000ull;
  world w(n, cfg);
  std::uint64_t const count = 1u << 16;
  std::size_t const bytes = count * sizeof(float) * static_cast<std::size_t>(n);
  w.reserve(2 * bytes + 512);
  for (int r = 0; r < n; ++r) TEST_CK(cudaMemset(w.arena[static_cast<std::size_t>(r)], 0x3c, 2 * bytes + 512));
  TEST_CK(cudaDeviceSynchronize());
  std::string thrown;
  auto const t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    float const* send = reinterpret_cast<float const*>(w.arena[static_cast<std::size_t>(r)]);
    float* recv = reinterpret_cast<float*>(w.arena[static_cast<std::size_t>(r)] + bytes + 256);
    gpu_call_options o;
    o.n_vts = 2;
    o.root = 0;
    if (r == bad) spoil(send, recv, o);
    try {
      op::run(w.comms[static_cast<std::size_t>(r)], send, recv, count, redop::sum, w.streams[static_cast<std::size_t>(r)], o);
      CHECK_MESSAGE(r != bad, "the bad call on rank " << r << " did not throw");
    } catch (reccl::error const& e) {
      CHECK_MESSAGE(r == bad, "rank " << r << "'s good call threw: " << e.what());
      if (r == bad) thrown = e.what();
    }
  }
  for (int r = 0; r < n; ++r) {
    TEST_CK(cudaStreamSynchronize(w.streams[static_cast<std::size_t>(r)]));
    double const s = seconds_since(t0);
    CHECK_MESSAGE(s < 1.0, "rank " << r << " stopped only after " << s << " s (deadline 10 s)");
  }
  CHECK_MESSAGE(thrown.find(thrown_cause) != std::string::npos, "the bad rank's error does not name '" << thrown_cause << "': " << thrown);
  CHECK_MESSAGE(thrown.find("rank " + std::to_string(bad)) != std::string::npos, "the bad rank's error does not name it: " << thrown);
  for (int r = 0; r < n; ++r) {
    auto const [st, what] = check_outcome(w.comms[static_cast<std::size_t>(r)]);
    CHECK_MESSAGE(st == reccl::status::invalid_argument, "rank " << r << ": check() gave " << reccl::name(st) << ": " << what);
    CHECK_MESSAGE(what.find("rank " + std::to_string(bad) + ":") != std::string::npos, "rank " << r << ": check() does not name rank " << bad << ": " << what);
    CHECK_MESSAGE(what.find(cause) != std::string::npos, "rank " << r << ": check() does not name '" << cause << "': " << what);
  }
}

}  // namespace

TEST_CASE("p2p loopback: a bad call on one rank stops every rank at once") {
  REQUIRE_GPU();
  using reccl::schedule::one_shot;
  using reccl::schedule::ring;
  for (int n : {2, 3, 4}) {
    bad_call<collective::all_reduce, ring>(n, n - 1, "send buffer is null", "null buffer", [](float const*& s, float*&, gpu_call_options&) { s = nullptr; });
    bad_call<collective::all_reduce, ring>(n, 0, "receive buffer is null", "null buffer", [](float const*&, float*& r, gpu_call_options&) { r = nullptr; });
  }
  bad_call<collective::all_gather, one_shot>(3, 1, "not aligned", "misaligned buffer",
                                             [](float const*&, float*& r, gpu_call_options&) { r = reinterpret_cast<float*>(reinterpret_cast<char*>(r) + 2); });
  bad_call<collective::broadcast, ring>(3, 2, "root 3 outside", "bad argument", [](float const*&, float*&, gpu_call_options& o) { o.root = 3; });
  static reccl::shares broken{};
  broken = reccl::equal_shares(2, reccl::all_live(2));
  broken.w[0] += 1;  // no longer sums to share_one
  bad_call<collective::reduce_scatter, one_shot>(3, 1, "vt_shares", "bad argument", [](float const*&, float*&, gpu_call_options& o) { o.vt_shares = &broken; });
  bad_call<collective::all_to_all, one_shot>(4, 2, "n_vts", "bad argument", [](float const*&, float*&, gpu_call_options& o) { o.n_vts = 17; });
}

namespace {

/// The last rank never calls: every other rank's check() throws timeout naming it, after about
/// the 200 ms deadline.
template <collective K, class S>
void missing_rank(int n) {
  int const missing = n - 1;
  INFO(reccl::name(K) << ": rank " << missing << " of " << n << " never calls");
  using op = gpu_op<K, S, float>;
  p2p_config cfg;
  cfg.timeout_ns = 200'000'000ull;
  world w(n, cfg);
  std::uint64_t const count = 1u << 16;
  std::size_t const bytes = count * sizeof(float) * static_cast<std::size_t>(n);
  w.reserve(2 * bytes + 512);
  for (int r = 0; r < n; ++r) TEST_CK(cudaMemset(w.arena[static_cast<std::size_t>(r)], 0x3c, 2 * bytes + 512));
  TEST_CK(cudaDeviceSynchronize());
  auto const t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < missing; ++r) {
    char* const a = w.arena[static_cast<std::size_t>(r)];
    gpu_call_options o;
    o.n_vts = 2;
    op::run(w.comms[static_cast<std::size_t>(r)], reinterpret_cast<float const*>(a), reinterpret_cast<float*>(a + bytes + 256), count,
            redop::sum, w.streams[static_cast<std::size_t>(r)], o);
  }
  for (int r = 0; r < missing; ++r) {
    TEST_CK(cudaStreamSynchronize(w.streams[static_cast<std::size_t>(r)]));
    double const s = seconds_since(t0);
    CHECK_MESSAGE(s < 3.0, "rank " << r << " gave up only after " << s << " s (deadline 0.2 s)");
    auto const [st, what] = check_outcome(w.comms[static_cast<std::size_t>(r)]);
    MESSAGE("rank " << r << " after " << s << " s: " << what);
    CHECK_MESSAGE(st == reccl::status::timeout, "rank " << r << ": check() gave " << reccl::name(st) << ": " << what);
    CHECK_MESSAGE(what.find("(peer " + std::to_string(missing) + ")") != std::string::npos,
                  "rank " << r << ": check() does not name the missing rank " << missing << ": " << what);
  }
  // Then every rank resumes (the missing one too: it comes back) and the same call runs again,
  // whatever state the failed call left in the rings and flags: input of rank r = r + 1.
  for (int r = 0; r < n; ++r) w.comms[static_cast<std::size_t>(r)].resume(w.streams[static_cast<std::size_t>(r)]);
  std::uint64_t const in_count = send_elems(K, n, count), out_count = recv_elems(K, n, count);
  for (int r = 0; r < n; ++r) {
    std::vector<float> in(in_count, static_cast<float>(r + 1));
    TEST_CK(cudaMemcpy(w.arena[static_cast<std::size_t>(r)], in.data(), in_count * 4, cudaMemcpyHostToDevice));
  }
  TEST_CK(cudaDeviceSynchronize());
  for (int r = 0; r < n; ++r) {
    char* const a = w.arena[static_cast<std::size_t>(r)];
    gpu_call_options o;
    o.n_vts = 2;
    op::run(w.comms[static_cast<std::size_t>(r)], reinterpret_cast<float const*>(a), reinterpret_cast<float*>(a + bytes + 256),
            count, redop::sum, w.streams[static_cast<std::size_t>(r)], o);
  }
  TEST_CK(cudaDeviceSynchronize());
  for (int r = 0; r < n; ++r) {
    INFO("after resume(), rank " << r);
    CHECK(check_outcome(w.comms[static_cast<std::size_t>(r)]).what.empty());
    std::vector<float> out(out_count);
    TEST_CK(cudaMemcpy(out.data(), w.arena[static_cast<std::size_t>(r)] + bytes + 256, out.size() * 4, cudaMemcpyDeviceToHost));
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < out.size(); ++i) {
      float const want = K == collective::all_gather ? static_cast<float>(i / count + 1) : static_cast<float>(n * (n + 1) / 2);
      wrong += out[i] != want;
    }
    CHECK(wrong == 0);
  }
}

}  // namespace

TEST_CASE("p2p loopback: a rank that never calls times out, named by the others, and after resume() they go on") {
  REQUIRE_GPU();
  // Every rank waits for the missing one directly here; in a ring of 3 or more a rank two hops
  // away waits for its live neighbour, whom it would name instead.
  missing_rank<collective::all_reduce, reccl::schedule::ring>(2);
  missing_rank<collective::all_reduce, reccl::schedule::one_shot>(3);
  missing_rank<collective::all_gather, reccl::schedule::one_shot>(4);
}
