// The composed collectives on the P2P transport with loopback ranks (every rank in this process on
// GPU 0, each on its own stream; every rank's call is made from this thread in turn, and all of
// them are launched before any host synchronisation), and the device handle they run on.
//
//  * correctness: every (collective, schedule) pair × int32, int64, fp16, bf16, fp32, fp64 × every
//    op of the reducing ones × 2, 3, 4 ranks × counts 0, 1, 1001, 4099 (pointers off 16-byte
//    alignment by one element), 64 KiB and 1 MiB worth. Random inputs; outputs and guard bands
//    poisoned. Each output is compared bit for bit with the CPU engine running the same schedule
//    on the same inputs, and with an independent reference (long double, a tolerance for floats);
//    inputs and guard bands must be untouched;
//  * VT splits (1, 3, 8 VTs × 1, 2 CTAs per VT, uneven shares) give identical bits;
//  * graph capture: refused with a clear error before the first call, replayed with new inputs after;
//  * bad input on one rank (null, misaligned, bad root, bad split): that rank throws, every other
//    rank stops at once (well before its deadline) and its check() names the rank and the cause;
//  * a rank that never calls: the others time out naming it;
//  * the handle: signal/wait, put visibility, barriers with growing epochs, a wait's timeout,
//    reservations out of bounds, raise_everywhere reaching every rank.
// Test suite "big": one 16 MiB case per schedule and one 256 MiB case per collective and width.
#define CUDA_NO_HALF  // reccl::half, not cuda_fp16.h's global `half`
#include "../doctest_main.hpp"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "p2p_reference.hpp"
#include "reccl/collective.hpp"
#include "reccl/cpu/communicator.hpp"
#include "reccl/host/p2p_collective.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "reccl/policy/telemetry/none.hpp"
#include "support.cuh"
#include "tests/cpu/support.hpp"

using namespace p2p_test;
using reccl::gpu_call_options;
using reccl::p2p_communicator;
using reccl::p2p_config;
using reccl_test::plan;

namespace {

constexpr std::size_t guard_bytes = 256;
constexpr unsigned char poison_byte = 0xA5;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

/// Loopback ranks on GPU 0, a non-blocking stream and one device arena per rank, and a CPU
/// communicator of as many ranks for the bitwise reference.
struct world {
  int n = 0;
  std::vector<p2p_communicator> comms;
  std::vector<cudaStream_t> streams;
  std::vector<char*> arena;
  std::size_t arena_bytes = 0;
  bool broken = false;  ///< a rank recorded a fault (sticky): world_of() builds a new world

  explicit world(int nranks, p2p_config const& cfg = default_config()) : n(nranks) {
    comms = p2p_communicator::create_loopback(nranks, 0, cfg);
    streams.resize(static_cast<std::size_t>(n));
    for (auto& s : streams) TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    arena.assign(static_cast<std::size_t>(n), nullptr);
  }
  world(world const&) = delete;
  world& operator=(world const&) = delete;
  ~world() {
    (void)cudaDeviceSynchronize();
    for (auto s : streams) (void)cudaStreamDestroy(s);
    for (auto p : arena) (void)cudaFree(p);
  }
  static p2p_config default_config() {
    p2p_config c;
    c.timeout_ns = gpu_test::test_timeout_ns(20);
    return c;
  }
  /// Arenas of at least `bytes` (only between cases: cudaFree waits for the device).
  void reserve(std::size_t bytes) {
    if (bytes <= arena_bytes) return;
    TEST_CK(cudaDeviceSynchronize());
    for (auto& p : arena) {
      if (p) TEST_CK(cudaFree(p));
      TEST_CK(cudaMalloc(&p, bytes));
    }
    arena_bytes = bytes;
  }
  void sync_all() {
    for (auto s : streams) TEST_CK(cudaStreamSynchronize(s));
  }
  /// Every rank's recorded fault, as check() throws it ("" when none).
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

/// Worlds reused across cases, rebuilt after a fault (faults are sticky).
world& world_of(int n) {
  static std::map<int, std::unique_ptr<world>> worlds;
  auto& w = worlds[n];
  if (w && w->broken) w.reset();
  if (!w) w = std::make_unique<world>(n);
  return *w;
}
std::map<int, std::unique_ptr<reccl::cpu::communicator>>& cpu_comms() {
  static std::map<int, std::unique_ptr<reccl::cpu::communicator>> m;
  return m;
}
reccl::cpu::communicator& cpu_comm_of(int n) {
  auto& c = cpu_comms()[n];
  if (!c) {
    reccl::cpu::config cfg;
    cfg.nranks = n;
    cfg.n_vts = 1;
    cfg.wait_timeout_ns = 60'000'000'000ull;  // a slow machine must not look like a dead VT
    c = std::make_unique<reccl::cpu::communicator>(cfg);
  }
  return *c;
}

/// Where a case's buffers lie in a rank's arena: guard | send | guard | recv | guard. `shift` moves
/// both buffers off 16-byte alignment (still aligned to the element).
struct layout {
  std::size_t send_off = 0, send_bytes = 0, recv_off = 0, recv_bytes = 0, total = 0;
  static layout make(std::size_t send_bytes, std::size_t recv_bytes, std::size_t shift) {
    layout L;
    L.send_off = guard_bytes + shift;
    L.send_bytes = send_bytes;
    L.recv_off = (L.send_off + send_bytes + guard_bytes + 255) / 256 * 256 + shift;
    L.recv_bytes = recv_bytes;
    L.total = L.recv_off + recv_bytes + guard_bytes;
    return L;
  }
};

struct case_desc {
  std::string what;  ///< collective/schedule dtype op ranks count (for every message)
  std::uint64_t count = 0;
  redop op = redop::sum;
  int root = 0;
  std::size_t shift = 0;
  gpu_call_options opts{};
};

template <collective K, class S, class H>
using gpu_op = reccl::collective_op<K, gpu_t<H>, S, reccl::transport::p2p, reccl::telemetry::none, reccl::allocator::equal>;
template <collective K, class S, class H>
using cpu_op = reccl::collective_op<K, H, S, reccl::transport::cpu_threads, reccl::telemetry::none, reccl::allocator::equal>;

/// Runs one collective on every rank of `w` (inputs `in`, per rank); returns each rank's output.
/// Checks that every call returned, no rank recorded a fault, and nothing but the output changed.
template <collective K, class S, class H>
std::vector<std::vector<H>> run_gpu(world& w, case_desc const& c, std::vector<std::vector<H>> const& in) {
  int const n = w.n;
  using D = gpu_t<H>;
  std::uint64_t const se = send_elems(K, n, c.count), re = recv_elems(K, n, c.count);
  layout const L = layout::make(se * sizeof(H), re * sizeof(H), c.shift);
  w.reserve(L.total);
  for (int r = 0; r < n; ++r) {
    char* const a = w.arena[static_cast<std::size_t>(r)];
    TEST_CK(cudaMemset(a, poison_byte, L.total));
    if (se) TEST_CK(cudaMemcpy(a + L.send_off, in[static_cast<std::size_t>(r)].data(), L.send_bytes, cudaMemcpyHostToDevice));
  }
  TEST_CK(cudaDeviceSynchronize());
  for (int r = 0; r < n; ++r) {
    char* const a = w.arena[static_cast<std::size_t>(r)];
    D const* send = reinterpret_cast<D const*>(a + L.send_off);
    if (K == collective::broadcast && r != c.root) send = nullptr;  // documented: unused off the root
    try {
      gpu_op<K, S, H>::run(w.comms[static_cast<std::size_t>(r)], send, reinterpret_cast<D*>(a + L.recv_off), c.count, c.op,
                           w.streams[static_cast<std::size_t>(r)], c.opts);
    } catch (std::exception const& e) {
      w.broken = true;
      FAIL_CHECK(c.what << " rank " << r << ": run threw: " << e.what());
    }
  }
  w.sync_all();
  auto const f = w.faults();
  for (int r = 0; r < n; ++r) {
    if (!f[static_cast<std::size_t>(r)].empty()) w.broken = true;
    CHECK_MESSAGE(f[static_cast<std::size_t>(r)].empty(), c.what << " rank " << r << ": " << f[static_cast<std::size_t>(r)]);
  }
  std::vector<std::vector<H>> out(static_cast<std::size_t>(n));
  std::vector<unsigned char> all(L.total);
  for (int r = 0; r < n; ++r) {
    TEST_CK(cudaMemcpy(all.data(), w.arena[static_cast<std::size_t>(r)], L.total, cudaMemcpyDeviceToHost));
    out[static_cast<std::size_t>(r)].resize(re);
    if (re) std::memcpy(out[static_cast<std::size_t>(r)].data(), all.data() + L.recv_off, L.recv_bytes);
    long touched = 0;
    for (std::size_t i = 0; i < L.total; ++i) {
      bool const in_send = i >= L.send_off && i < L.send_off + L.send_bytes;
      bool const in_recv = i >= L.recv_off && i < L.recv_off + L.recv_bytes;
      if (!in_send && !in_recv) touched += all[i] != poison_byte;
    }
    CHECK_MESSAGE(touched == 0, c.what << " rank " << r << ": " << touched << " guard-band bytes overwritten");
    bool const input_kept = se == 0 || std::memcmp(all.data() + L.send_off, in[static_cast<std::size_t>(r)].data(), L.send_bytes) == 0;
    CHECK_MESSAGE(input_kept, c.what << " rank " << r << ": the send buffer changed");
  }
  return out;
}

/// The CPU engine on the same schedule and inputs (the bitwise reference).
template <collective K, class S, class H>
std::vector<std::vector<H>> run_cpu(int n, case_desc const& c, std::vector<std::vector<H>> const& in) {
  std::vector<std::vector<H>> out(static_cast<std::size_t>(n));
  for (auto& o : out) o.assign(recv_elems(K, n, c.count), H{});
  auto& comm = cpu_comm_of(n);
  try {
    comm.run_ranks([&](int r) {
      H const* send = K == collective::broadcast && r != c.root ? nullptr : in[static_cast<std::size_t>(r)].data();
      cpu_op<K, S, H>::run(comm, r, send, out[static_cast<std::size_t>(r)].data(), c.count, c.op, c.root);
    });
  } catch (std::exception const& e) {
    cpu_comms().erase(n);
    FAIL_CHECK(c.what << ": the CPU engine threw: " << e.what());
  }
  return out;
}

template <class H>
long first_bit_difference(std::vector<H> const& a, std::vector<H> const& b) {
  if (a.size() != b.size()) return 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(H)) != 0) return static_cast<long>(i);
  return -1;
}

template <collective K, class H>
std::vector<std::vector<H>> make_inputs(int n, std::uint64_t count, redop op, std::mt19937_64& g) {
  std::vector<std::vector<H>> in(static_cast<std::size_t>(n));
  for (auto& v : in) v = random_input<H>(g, send_elems(K, n, count), op);
  return in;
}

/// One case: GPU run, CPU engine run (bitwise), independent reference. False if anything differs.
template <collective K, class S, class H>
void check_case(world& w, case_desc const& c, std::mt19937_64& g, bool with_cpu = true) {
  int const n = w.n;
  auto const in = make_inputs<K, H>(n, c.count, c.op, g);
  auto const got = run_gpu<K, S, H>(w, c, in);
  std::vector<std::vector<H>> ref;
  if (with_cpu) ref = run_cpu<K, S, H>(n, c, in);
  for (int r = 0; r < n; ++r) {
    auto const& o = got[static_cast<std::size_t>(r)];
    if (with_cpu) {
      long const d = first_bit_difference(o, ref[static_cast<std::size_t>(r)]);
      CHECK_MESSAGE(d == -1, c.what << " rank " << r << ": differs from the CPU engine's bits first at element " << d);
    }
    std::string first;
    long const wrong = check_output<H>(K, c.op, c.root, c.count, r, in, o, first);
    CHECK_MESSAGE(wrong == 0, c.what << " rank " << r << ": " << wrong << " elements wrong against the reference; first " << first);
  }
}

std::string describe(plan p, dtype t, redop op, int n, std::uint64_t count, std::size_t shift) {
  return std::string(reccl_test::plan_name(p)) + " " + std::string(reccl::name(t)) + " " + std::string(reccl::name(op)) + " ranks " +
         std::to_string(n) + " count " + std::to_string(count) + (shift ? " (pointers off 16-byte alignment)" : "");
}

/// Every dtype × op × ranks × count of plan p.
void correctness(plan p) {
  std::mt19937_64 g(1000 + static_cast<int>(p));
  reccl_test::with_plan(p, [&]<collective K, class S>() {
    for (int n : {2, 3, 4}) {
      world& w = world_of(n);
      for (dtype t : reccl_test::all_dtypes) {
        reccl_test::with_dtype(t, [&]<class H>() {
          for (redop op : {redop::sum, redop::prod, redop::min, redop::max, redop::avg}) {
            if (!reccl::reduces(K) && op != redop::sum) continue;
            std::uint64_t const kib64 = 65536 / sizeof(H), mib = (1u << 20) / sizeof(H);
            for (std::uint64_t count : {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{1001}, std::uint64_t{4099}, kib64, mib}) {
              case_desc c;
              c.count = count;
              c.op = op;
              c.root = static_cast<int>(count % static_cast<std::uint64_t>(n));
              c.shift = count == 4099 ? sizeof(H) : 0;
              c.opts.n_vts = 4;
              c.what = describe(p, t, op, n, count, c.shift);
              check_case<K, S, H>(w, c, g);
            }
          }
        });
      }
    }
  });
}

}  // namespace

TEST_CASE("p2p loopback correctness: all_reduce/ring") { REQUIRE_GPU(); correctness(plan::ar_ring); }
TEST_CASE("p2p loopback correctness: all_reduce/tree") { REQUIRE_GPU(); correctness(plan::ar_tree); }
TEST_CASE("p2p loopback correctness: all_reduce/one_shot") { REQUIRE_GPU(); correctness(plan::ar_one_shot); }
TEST_CASE("p2p loopback correctness: all_reduce/two_shot") { REQUIRE_GPU(); correctness(plan::ar_two_shot); }
TEST_CASE("p2p loopback correctness: reduce_scatter/ring") { REQUIRE_GPU(); correctness(plan::rs_ring); }
TEST_CASE("p2p loopback correctness: reduce_scatter/one_shot") { REQUIRE_GPU(); correctness(plan::rs_one_shot); }
TEST_CASE("p2p loopback correctness: reduce_scatter/two_shot") { REQUIRE_GPU(); correctness(plan::rs_two_shot); }
TEST_CASE("p2p loopback correctness: all_gather/ring") { REQUIRE_GPU(); correctness(plan::ag_ring); }
TEST_CASE("p2p loopback correctness: all_gather/one_shot") { REQUIRE_GPU(); correctness(plan::ag_one_shot); }
TEST_CASE("p2p loopback correctness: broadcast/ring") { REQUIRE_GPU(); correctness(plan::bc_ring); }
TEST_CASE("p2p loopback correctness: broadcast/tree") { REQUIRE_GPU(); correctness(plan::bc_tree); }
TEST_CASE("p2p loopback correctness: broadcast/one_shot") { REQUIRE_GPU(); correctness(plan::bc_one_shot); }
TEST_CASE("p2p loopback correctness: broadcast/multirail") { REQUIRE_GPU(); correctness(plan::bc_multirail); }
TEST_CASE("p2p loopback correctness: all_to_all/direct") { REQUIRE_GPU(); correctness(plan::a2a_direct); }
TEST_CASE("p2p loopback correctness: all_to_all/one_shot") { REQUIRE_GPU(); correctness(plan::a2a_one_shot); }

TEST_CASE("p2p loopback: VT splits give identical bits") {
  REQUIRE_GPU();
  int const n = 3;
  world& w = world_of(n);
  reccl::shares uneven{};
  uneven.n_vts = 3;
  uneven.live_mask = reccl::all_live(3);
  uneven.w[0] = reccl::share_one / 10 * 6;
  uneven.w[1] = reccl::share_one / 10;
  uneven.w[2] = reccl::share_one - uneven.w[0] - uneven.w[1];
  REQUIRE(reccl::check(uneven) == reccl::status::ok);
  struct split_choice {
    int vts, cpv;
    reccl::shares const* sh;
  };
  split_choice const splits[] = {{1, 1, nullptr}, {1, 2, nullptr}, {3, 1, nullptr}, {3, 2, nullptr},
                                 {8, 1, nullptr}, {8, 2, nullptr}, {3, 2, &uneven}};
  for (int pi = 0; pi < reccl_test::n_plans; ++pi) {
    plan const p = static_cast<plan>(pi);
    reccl_test::with_plan(p, [&]<collective K, class S>() {
      for (dtype t : {dtype::float32, dtype::bfloat16}) {
        if (!reccl::reduces(K) && t != dtype::float32) continue;
        reccl_test::with_dtype(t, [&]<class H>() {
          std::mt19937_64 g(77 + pi);
          std::uint64_t const count = (1u << 20) / sizeof(H) + 7;
          redop const op = redop::sum;
          auto const in = make_inputs<K, H>(n, count, op, g);
          std::vector<std::vector<H>> first;
          for (auto const& sc : splits) {
            case_desc c;
            c.count = count;
            c.op = op;
            c.root = 1;
            c.opts.n_vts = sc.vts;
            c.opts.ctas_per_vt = sc.cpv;
            c.opts.vt_shares = sc.sh;
            c.what = describe(p, t, op, n, count, 0) + " VTs " + std::to_string(sc.vts) + " x " + std::to_string(sc.cpv) +
                     (sc.sh ? " CTAs, uneven shares" : " CTAs");
            auto const got = run_gpu<K, S, H>(w, c, in);
            if (first.empty()) {
              first = got;
              auto const ref = run_cpu<K, S, H>(n, c, in);
              for (int r = 0; r < n; ++r)
                CHECK_MESSAGE(first_bit_difference(got[static_cast<std::size_t>(r)], ref[static_cast<std::size_t>(r)]) == -1,
                              c.what << " rank " << r << ": differs from the CPU engine");
              continue;
            }
            for (int r = 0; r < n; ++r) {
              long const d = first_bit_difference(got[static_cast<std::size_t>(r)], first[static_cast<std::size_t>(r)]);
              CHECK_MESSAGE(d == -1, c.what << " rank " << r << ": bits differ from 1 VT x 1 CTA first at element " << d);
            }
          }
        });
      }
    });
  }
}

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
    std::string what;
    reccl::status st = reccl::status::ok;
    try {
      w.comms[static_cast<std::size_t>(r)].check();
    } catch (reccl::error const& e) {
      what = e.what();
      st = e.code();
    }
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
    std::string what;
    reccl::status st = reccl::status::ok;
    try {
      w.comms[static_cast<std::size_t>(r)].check();
    } catch (reccl::error const& e) {
      what = e.what();
      st = e.code();
    }
    MESSAGE("rank " << r << " after " << s << " s: " << what);
    CHECK_MESSAGE(st == reccl::status::timeout, "rank " << r << ": check() gave " << reccl::name(st) << ": " << what);
    CHECK_MESSAGE(what.find("(peer " + std::to_string(missing) + ")") != std::string::npos,
                  "rank " << r << ": check() does not name the missing rank " << missing << ": " << what);
  }
}

}  // namespace

TEST_CASE("p2p loopback: a rank that never calls times out, named by the others") {
  REQUIRE_GPU();
  // Every rank waits for the missing one directly here; in a ring of 3 or more a rank two hops
  // away waits for its live neighbour, whom it would name instead.
  missing_rank<collective::all_reduce, reccl::schedule::ring>(2);
  missing_rank<collective::all_reduce, reccl::schedule::one_shot>(3);
  missing_rank<collective::all_gather, reccl::schedule::one_shot>(4);
}

// ---- big cases ---------------------------------------------------------------------------------

TEST_SUITE("big") {
  TEST_CASE("p2p loopback: 16 MiB per schedule") {
    REQUIRE_GPU();
    plan const per_schedule[] = {plan::ar_ring, plan::ar_tree, plan::ar_one_shot, plan::ar_two_shot, plan::bc_multirail, plan::a2a_direct};
    for (plan p : per_schedule) {
      reccl_test::with_plan(p, [&]<collective K, class S>() {
        int const n = 4;
        std::mt19937_64 g(16 + static_cast<int>(p));
        case_desc c;
        c.count = (16u << 20) / sizeof(float) / (K == collective::all_to_all ? n : 1);
        c.op = redop::sum;
        c.opts.n_vts = 8;
        c.opts.ctas_per_vt = 2;
        c.what = describe(p, dtype::float32, c.op, n, c.count, 0) + " [16 MiB]";
        check_case<K, S, float>(world_of(n), c, g);
      });
    }
  }

  TEST_CASE("p2p loopback: 256 MiB per collective and element width") {
    REQUIRE_GPU();
    plan const per_collective[] = {plan::ar_ring, plan::rs_ring, plan::ag_ring, plan::bc_ring, plan::a2a_one_shot};
    for (plan p : per_collective) {
      reccl_test::with_plan(p, [&]<collective K, class S>() {
        for (dtype t : {dtype::bfloat16, dtype::float32, dtype::float64}) {
          reccl_test::with_dtype(t, [&]<class H>() {
            int const n = 2;
            std::mt19937_64 g(256 + static_cast<int>(p));
            case_desc c;
            c.count = (256ull << 20) / sizeof(H) / (K == collective::reduce_scatter || K == collective::all_to_all ? n : 1);
            c.op = redop::sum;
            c.opts.n_vts = 8;
            c.what = describe(p, t, c.op, n, c.count, 0) + " [256 MiB]";
            check_case<K, S, H>(world_of(n), c, g);
          });
        }
      });
    }
  }
}

// ---- the device handle -------------------------------------------------------------------------

namespace {

using reccl::device::deadline_clock;
using reccl::device::flag_id;
using reccl::device::memory_handle;

/// Thread t < size() signals rank t and waits for it; then checks that the flag holds at least
/// `value` and that waiting for a smaller value returns at once.
__global__ void signal_wait_kernel(memory_handle h, flag_id f, std::uint64_t value, unsigned* bad) {
  deadline_clock clock(h.timeout_ns);
  int const t = static_cast<int>(threadIdx.x);
  if (t >= h.size() || t == h.rank()) return;
  h.signal(t, f, value);
  if (!h.wait(f, t, value, clock)) atomicAdd(bad, 1u);
  if (h.read(f, t) < value) atomicAdd(bad, 1u);
  if (!h.wait(f, t, value - 1, clock)) atomicAdd(bad, 1u);
}

/// `iters` rounds: put a pattern into every peer's slot for this rank, signal, wait, verify what
/// every peer put here, then a barrier before the next round overwrites it.
__global__ void put_kernel(memory_handle h, flag_id data, flag_id bar, std::uint64_t off, std::uint64_t words, int iters,
                           unsigned long long* bad) {
  deadline_clock clock(h.timeout_ns);
  int const me = h.rank(), n = h.size(), t = static_cast<int>(threadIdx.x);
  __shared__ std::uint64_t e0;
  if (t == 0) e0 = *h.sequence(data);
  __syncthreads();
  for (int it = 1; it <= iters; ++it) {
    std::uint64_t const e = e0 + static_cast<std::uint64_t>(it);
    auto pattern = [&](int src, int dst, std::uint64_t i) { return (e << 40) ^ (static_cast<std::uint64_t>(src) << 32) ^ (static_cast<std::uint64_t>(dst) << 24) ^ i; };
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      std::uint64_t* const dst = h.at<std::uint64_t>(p, off) + static_cast<std::uint64_t>(me) * words;
      for (std::uint64_t i = static_cast<std::uint64_t>(t); i < words; i += blockDim.x) dst[i] = pattern(me, p, i);
    }
    __syncthreads();
    if (t < n && t != me) {
      h.signal(t, data, e);
      if (!h.wait(data, t, e, clock)) atomicAdd(bad, 1ull << 32);
    }
    __syncthreads();
    std::uint64_t const* const mine = h.at<std::uint64_t>(me, off);
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      for (std::uint64_t i = static_cast<std::uint64_t>(t); i < words; i += blockDim.x)
        if (mine[static_cast<std::uint64_t>(q) * words + i] != pattern(q, me, i)) atomicAdd(bad, 1ull);
    }
    if (!h.barrier(bar, e, clock)) {
      if (t == 0) atomicAdd(bad, 1ull << 32);
      break;
    }
  }
  if (t == 0) *h.sequence(data) = e0 + static_cast<std::uint64_t>(iters);
}

/// `iters` barriers: before barrier e every rank stores e into its slot of every rank's array;
/// after it, every slot must hold e (or e + 1: that peer already went on).
__global__ void barrier_kernel(memory_handle h, flag_id f, std::uint64_t off, int iters, unsigned long long* bad) {
  deadline_clock clock(h.timeout_ns);
  int const me = h.rank(), n = h.size(), t = static_cast<int>(threadIdx.x);
  __shared__ std::uint64_t e0;
  if (t == 0) e0 = *h.sequence(f);
  __syncthreads();
  for (int k = 1; k <= iters; ++k) {
    std::uint64_t const e = e0 + static_cast<std::uint64_t>(k);
    if (t < n) *static_cast<volatile std::uint64_t*>(h.at<std::uint64_t>(t, off) + me) = e;
    if (!h.barrier(f, e, clock)) {
      if (t == 0) atomicAdd(bad, 1ull << 32);
      break;
    }
    if (t < n) {
      std::uint64_t const v = *static_cast<volatile std::uint64_t const*>(h.at<std::uint64_t>(me, off) + t);
      if (v != e && v != e + 1) atomicAdd(bad, 1ull);
    }
  }
  if (t == 0) *h.sequence(f) = e0 + static_cast<std::uint64_t>(iters);
}

/// One wait for a flag nobody signals.
__global__ void lonely_wait_kernel(memory_handle h, flag_id f, int src, int vt, unsigned* result) {
  deadline_clock clock(h.timeout_ns);
  *result = h.wait(f, src, 1, clock, vt) ? 1u : 2u;
}

template <class T>
struct device_counter {
  T* p = nullptr;
  device_counter() {
    TEST_CK(cudaMalloc(&p, sizeof(T)));
    TEST_CK(cudaMemset(p, 0, sizeof(T)));
  }
  ~device_counter() { (void)cudaFree(p); }
  T get() const {
    T v{};
    TEST_CK(cudaMemcpy(&v, p, sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

}  // namespace

TEST_CASE("p2p handle: signal and wait between ranks") {
  REQUIRE_GPU();
  for (int n : {2, 3, 4, 8}) {
    world w(n);
    std::vector<flag_id> f;
    for (auto& c : w.comms) f.push_back(c.reserve_flags(1));
    for (int r = 1; r < n; ++r) REQUIRE(f[static_cast<std::size_t>(r)].index == f[0].index);
    std::vector<std::unique_ptr<device_counter<unsigned>>> bad;
    for (int round = 1; round <= 3; ++round) {
      for (int r = 0; r < n; ++r) {
        bad.push_back(std::make_unique<device_counter<unsigned>>());
        signal_wait_kernel<<<1, 32, 0, w.streams[static_cast<std::size_t>(r)]>>>(w.comms[static_cast<std::size_t>(r)].handle(), f[0],
                                                                                   static_cast<std::uint64_t>(round) * 10, bad.back()->p);
        TEST_CK(cudaGetLastError());
      }
      w.sync_all();
    }
    for (std::size_t i = 0; i < bad.size(); ++i) CHECK_MESSAGE(bad[i]->get() == 0, n << " ranks, launch " << i << ": " << bad[i]->get() << " failed waits");
    auto const faults = w.faults();
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(faults[static_cast<std::size_t>(r)].empty(), n << " ranks, rank " << r << ": " << faults[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("p2p handle: put, signal and wait make the data visible, and barriers with growing epochs") {
  REQUIRE_GPU();
  for (int n : {2, 3, 4}) {
    world w(n);
    std::uint64_t const words = 4099;
    std::vector<flag_id> data, bar, bar2;
    std::vector<std::uint64_t> off, off2;
    for (auto& c : w.comms) {
      data.push_back(c.reserve_flags(1));
      bar.push_back(c.reserve_flags(1));
      bar2.push_back(c.reserve_flags(1));
      void* p = c.allocate(words * sizeof(std::uint64_t) * static_cast<std::uint64_t>(n));
      off.push_back(static_cast<std::uint64_t>(static_cast<char*>(p) - c.handle().at(c.rank(), 0)));
      CHECK(c.handle().in_window(p, words * 8 * static_cast<std::uint64_t>(n)));
      CHECK_FALSE(c.handle().in_window(p, c.config().data_bytes));
      off2.push_back(c.reserve_bytes(8 * static_cast<std::uint64_t>(n), 128));
    }
    for (int r = 1; r < n; ++r) {
      REQUIRE(off[static_cast<std::size_t>(r)] == off[0]);
      REQUIRE(off2[static_cast<std::size_t>(r)] == off2[0]);
      REQUIRE(data[static_cast<std::size_t>(r)].index == data[0].index);
    }
    auto const& h0 = w.comms[0].handle();
    for (int r = 0; r < n; ++r) CHECK(h0.peer_ptr(r, h0.at<char>(0, off[0])) == h0.at<char>(r, off[0]));

    std::vector<std::unique_ptr<device_counter<unsigned long long>>> bad;
    for (int launch = 0; launch < 3; ++launch) {
      for (int r = 0; r < n; ++r) {
        bad.push_back(std::make_unique<device_counter<unsigned long long>>());
        put_kernel<<<1, 256, 0, w.streams[static_cast<std::size_t>(r)]>>>(w.comms[static_cast<std::size_t>(r)].handle(), data[0], bar[0],
                                                                            off[0], words, 20, bad.back()->p);
        TEST_CK(cudaGetLastError());
      }
      for (int r = 0; r < n; ++r) {
        bad.push_back(std::make_unique<device_counter<unsigned long long>>());
        barrier_kernel<<<1, 128, 0, w.streams[static_cast<std::size_t>(r)]>>>(w.comms[static_cast<std::size_t>(r)].handle(), bar2[0], off2[0],
                                                                                500, bad.back()->p);
        TEST_CK(cudaGetLastError());
      }
      w.sync_all();
    }
    for (std::size_t i = 0; i < bad.size(); ++i) {
      unsigned long long const b = bad[i]->get();
      CHECK_MESSAGE(b == 0, n << " ranks, launch " << i << ": " << (b >> 32) << " failed waits/barriers, " << (b & 0xffffffffu)
                              << " wrong words seen");
    }
    auto const faults = w.faults();
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(faults[static_cast<std::size_t>(r)].empty(), n << " ranks, rank " << r << ": " << faults[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("p2p handle: a wait nobody answers times out naming the peer and the VT") {
  REQUIRE_GPU();
  p2p_config cfg;
  cfg.timeout_ns = 100'000'000ull;
  world w(3, cfg);
  flag_id const f = w.comms[0].reserve_flags(1);
  device_counter<unsigned> result;
  auto const t0 = std::chrono::steady_clock::now();
  lonely_wait_kernel<<<1, 1, 0, w.streams[0]>>>(w.comms[0].handle(), f, 2, 7, result.p);
  TEST_CK(cudaGetLastError());
  w.sync_all();
  double const s = seconds_since(t0);
  CHECK_MESSAGE(result.get() == 2u, "the wait returned " << (result.get() == 1u ? "true" : "nothing"));
  CHECK_MESSAGE(s >= 0.09, "gave up after " << s << " s, before the 0.1 s deadline");
  CHECK_MESSAGE(s < 2.0, "gave up only after " << s << " s");
  reccl::device::fault const fl = w.comms[0].fault();
  CHECK(fl.st == reccl::status::timeout);
  CHECK(fl.origin == 0);
  CHECK(fl.peer == 2);
  CHECK(fl.vt == 7);
  CHECK(fl.cause == reccl::device::fault_cause::peer_timeout);
  CHECK(w.comms[1].fault().ok());  // a timeout is this rank's alone
  std::string what;
  try {
    w.comms[0].check();
  } catch (reccl::error const& e) {
    what = e.what();
    CHECK(e.code() == reccl::status::timeout);
  }
  CHECK_MESSAGE(what.find("(peer 2)") != std::string::npos, what);
}

TEST_CASE("p2p handle: reservations out of bounds and bad configurations are refused") {
  REQUIRE_GPU();
  p2p_config cfg;
  cfg.plan_max_ctas = 1;
  cfg.n_flags = 4 * reccl::device::max_memory_ranks + 8;  // the smallest the plan lane accepts, and 8
  cfg.data_bytes = 1u << 20;
  // the plan lane's flags: ready and credit per CTA, sent and received per CTA and peer
  int const lane_flags = 2 * cfg.plan_max_ctas * (1 + reccl::device::max_memory_ranks);
  world w(2, cfg);
  auto& c = w.comms[0];
  CHECK(c.reserve_flags(cfg.n_flags - lane_flags).index == static_cast<std::uint32_t>(lane_flags));
  auto refused = [](auto&& f, char const* needle) {
    std::string what;
    try {
      f();
    } catch (reccl::error const& e) {
      what = e.what();
      CHECK(e.code() == reccl::status::invalid_argument);
    }
    CHECK_MESSAGE(what.find(needle) != std::string::npos, "expected an error naming '" << needle << "', got '" << what << "'");
  };
  refused([&] { c.reserve_flags(1); }, "n_flags");
  refused([&] { c.reserve_flags(0); }, "flags");
  std::uint64_t const left = cfg.data_bytes - (c.reserve_bytes(0, 4096));
  CHECK(c.allocate(left - 4096, 4096) != nullptr);
  refused([&] { c.allocate(8192, 4096); }, "data_bytes");
  refused([&] { c.reserve_bytes(~0ull); }, "data_bytes");
  refused([] { p2p_communicator::create_loopback(0); }, "nranks");
  refused([] { p2p_communicator::create_loopback(reccl::device::max_memory_ranks + 1); }, "nranks");
  p2p_config bad = cfg;
  bad.timeout_ns = 0;
  refused([&] { p2p_communicator::create_loopback(2, 0, bad); }, "timeout_ns");
  bad = cfg;
  bad.plan_slot_bytes = 1000;
  refused([&] { p2p_communicator::create_loopback(2, 0, bad); }, "plan_slot_bytes");
  bad = cfg;
  bad.plan_max_ctas = 16;
  refused([&] { p2p_communicator::create_loopback(2, 0, bad); }, "n_flags");
  // the other rank's reservations are its own counters, still untouched
  CHECK(w.comms[1].reserve_flags(8).index == static_cast<std::uint32_t>(lane_flags));
}

TEST_CASE("p2p handle: raise_everywhere from the host reaches every rank's fault word") {
  REQUIRE_GPU();
  int const n = 4;
  world w(n);
  reccl::device::fault const f{reccl::status::internal, 1, 3, 5, reccl::device::fault_cause::user};
  w.comms[1].raise_everywhere(f, w.streams[1]);
  w.sync_all();
  reccl::device::fault const other{reccl::status::timeout, 2, 0, 0, reccl::device::fault_cause::peer_timeout};
  w.comms[2].raise_everywhere(other, w.streams[2]);  // the first fault stays
  w.sync_all();
  for (int r = 0; r < n; ++r) {
    reccl::device::fault const g = w.comms[static_cast<std::size_t>(r)].fault();
    CHECK_MESSAGE(g.encode() == f.encode(), "rank " << r << ": status " << reccl::name(g.st) << " origin " << g.origin << " peer " << g.peer
                                                    << " vt " << g.vt << " cause " << reccl::device::name(g.cause));
    std::string what;
    try {
      w.comms[static_cast<std::size_t>(r)].check();
    } catch (reccl::error const& e) {
      what = e.what();
      CHECK(e.code() == reccl::status::internal);
      CHECK(e.rank() == 1);
      CHECK(e.vt() == 5);
    }
    CHECK_MESSAGE(what.find("rank 1: user fault (peer 3)") != std::string::npos, "rank " << r << ": " << what);
    if (r != 1) CHECK_MESSAGE(what.find("seen by rank " + std::to_string(r)) != std::string::npos, "rank " << r << ": " << what);
  }
  // a composed collective on a failed communicator runs nothing and leaves the output alone
  w.reserve(1 << 16);
  for (int r = 0; r < n; ++r) TEST_CK(cudaMemset(w.arena[static_cast<std::size_t>(r)], poison_byte, 1 << 16));
  TEST_CK(cudaDeviceSynchronize());
  auto const t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    auto* a = reinterpret_cast<float*>(w.arena[static_cast<std::size_t>(r)]);
    gpu_op<collective::all_reduce, reccl::schedule::ring, float>::run(w.comms[static_cast<std::size_t>(r)], a, a + 4096, 4096, redop::sum,
                                                                      w.streams[static_cast<std::size_t>(r)]);
  }
  w.sync_all();
  CHECK(seconds_since(t0) < 1.0);
  std::vector<unsigned char> got(1 << 16);
  TEST_CK(cudaMemcpy(got.data(), w.arena[0], got.size(), cudaMemcpyDeviceToHost));
  long changed = 0;
  for (auto b : got) changed += b != poison_byte;
  CHECK_MESSAGE(changed == 0, changed << " bytes written by a collective on a failed communicator");
}
