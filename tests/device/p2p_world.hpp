// The loopback world of the P2P transport's GPU tests (tests/device/p2p_*.test.cu): every rank
// in this process on GPU 0, each on its own non-blocking stream and device arena, every rank's call
// made from this thread in turn and all of them launched before any host synchronisation. One case
// runs a composed collective on every rank, compares each output bit for bit with the CPU engine
// running the same schedule on the same inputs and with an independent reference (long double, a
// tolerance for floats), and checks that inputs and guard bands are untouched.
#pragma once

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

#include <doctest/doctest.h>

#include "p2p_reference.hpp"
#include "reccl/collective.hpp"
#include "reccl/cpu/communicator.hpp"
#include "reccl/host/p2p_collective.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "reccl/policy/telemetry/none.hpp"
#include "support.cuh"
#include "tests/cpu/support.hpp"

namespace p2p_test {

using reccl::gpu_call_options;
using reccl::p2p_communicator;
using reccl::p2p_config;
using reccl_test::plan;

inline constexpr std::size_t guard_bytes = 256;
inline constexpr unsigned char poison_byte = 0xA5;

inline double seconds_since(std::chrono::steady_clock::time_point t0) {
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
  std::vector<std::string> faults();
};

/// What a communicator's check() says: ok and "", or the status and message it throws.
struct outcome {
  reccl::status st = reccl::status::ok;
  std::string what;
};
inline outcome check_outcome(p2p_communicator& c) {
  try {
    c.check();
  } catch (reccl::error const& e) {
    return {e.code(), e.what()};
  }
  return {};
}

inline std::vector<std::string> world::faults() {
  std::vector<std::string> out;
  for (auto& c : comms) out.push_back(check_outcome(c).what);
  return out;
}

/// Worlds reused across cases, rebuilt after a fault (faults are sticky).
inline world& world_of(int n) {
  static std::map<int, std::unique_ptr<world>> worlds;
  auto& w = worlds[n];
  if (w && w->broken) w.reset();
  if (!w) w = std::make_unique<world>(n);
  return *w;
}
inline std::map<int, std::unique_ptr<reccl::cpu::communicator>>& cpu_comms() {
  static std::map<int, std::unique_ptr<reccl::cpu::communicator>> m;
  return m;
}
inline reccl::cpu::communicator& cpu_comm_of(int n) {
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
      gpu_call_options o = c.opts;
      o.root = c.root;
      gpu_op<K, S, H>::run(w.comms[static_cast<std::size_t>(r)], send, reinterpret_cast<D*>(a + L.recv_off), c.count, c.op,
                           w.streams[static_cast<std::size_t>(r)], o);
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

inline std::string describe(plan p, dtype t, redop op, int n, std::uint64_t count, std::size_t shift) {
  return std::string(reccl_test::plan_name(p)) + " " + std::string(reccl::name(t)) + " " + std::string(reccl::name(op)) + " ranks " +
         std::to_string(n) + " count " + std::to_string(count) + (shift ? " (pointers off 16-byte alignment)" : "");
}

/// Every dtype × op × ranks × count of plan P.
template <plan P>
void correctness() {
  plan const p = P;
  std::mt19937_64 g(1000 + static_cast<int>(p));
  reccl_test::with_plan<P>([&]<collective K, class S>() {
    for (int n : {2, 3, 4}) {
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
              check_case<K, S, H>(world_of(n), c, g);  // a world that faulted is rebuilt: one failure stays one
            }
          }
        });
      }
    }
  });
}

/// VT splits (1, 3, 8 VTs x 1, 2 CTAs per VT, uneven shares) of plan P give identical bits (fp32,
/// and bf16 where it reduces), and the first of them is the CPU engine's. 3 ranks.
template <plan P>
void vt_splits() {
  plan const p = P;
  int const n = 3;
  static reccl::shares uneven{};
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
  reccl_test::with_plan<P>([&]<collective K, class S>() {
    for (dtype t : {dtype::float32, dtype::bfloat16}) {
      if (!reccl::reduces(K) && t != dtype::float32) continue;
      reccl_test::with_dtype(t, [&]<class H>() {
        std::mt19937_64 g(77 + static_cast<int>(p));
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
          auto const got = run_gpu<K, S, H>(world_of(n), c, in);
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

/// One 16 MiB fp32 case of plan P on 4 ranks, 8 VTs x 2 CTAs (the "big" suite).
template <plan P>
void big_16mib() {
  plan const p = P;
  reccl_test::with_plan<P>([&]<collective K, class S>() {
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

/// 256 MiB of plan P on 2 ranks, one case per element width (bf16, fp32, fp64; the "big" suite).
template <plan P>
void big_256mib() {
  plan const p = P;
  reccl_test::with_plan<P>([&]<collective K, class S>() {
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

}  // namespace p2p_test
