// Verbs backend. The immediate encoding of signals is plain arithmetic and always tested. The
// backend itself is built only with RECCL_HAVE_IBVERBS, and its tests need an RDMA device: where
// ibv_get_device_list finds none they print "skipped: no RDMA device" and are reported as skipped
// (SKIP_CASE), never passed. It has not yet run on hardware.
#include "../doctest_main.hpp"

#include <cstdint>
#include <random>

#include "reccl/proxy/signal_imm.hpp"

using namespace reccl;
using namespace reccl::proxy;

TEST_CASE("signal immediate: flag index and value survive the 32-bit encoding") {
  std::mt19937_64 g(11);
  for (int i = 0; i < 100'000; ++i) {
    std::uint32_t const flag = static_cast<std::uint32_t>(g() % imm_max_flags);
    std::uint64_t const last = g() >> static_cast<int>(g() % 64);  // small and huge values alike
    std::uint64_t const step = g() % (imm_value_mask + 1);           // any representable step
    if (last > ~std::uint64_t{0} - step) continue;
    std::uint64_t const value = last + step;
    REQUIRE(signal_delta_ok(last, value));
    std::uint32_t const imm = encode_signal_imm(flag, value);
    REQUIRE(imm_flag_index(imm) == flag);
    REQUIRE(decode_signal_value(imm, last) == value);
  }
  // The edges: a step of exactly 2^20 - 1 across a wrap of the low bits, and the rejected cases.
  CHECK(decode_signal_value(encode_signal_imm(7, 0x1'0000'0000 + 5), 0x1'0000'0000 + 6 - (1u << 20)) == 0x1'0000'0000 + 5);
  CHECK(decode_signal_value(encode_signal_imm(4095, 1u << 20), (1u << 20) - 1) == (1u << 20));
  CHECK_FALSE(signal_delta_ok(10, 9));                      // flags never decrease
  CHECK_FALSE(signal_delta_ok(0, std::uint64_t{1} << 20));  // step too large to rebuild
  CHECK(signal_delta_ok(5, 5));
}

#if !defined(RECCL_HAVE_IBVERBS)

TEST_CASE("ibverbs backend") {
  SKIP_CASE("built without RECCL_HAVE_IBVERBS (libibverbs-dev not found at configure time)");
}

#else

#include <barrier>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "reccl/proxy/backend_ibverbs.hpp"
#include "reccl/proxy/proxy.hpp"
#include "reccl/proxy/transport.hpp"

namespace {

bool const no_rdma_device = ib_device_count() == 0;

// All-gather among the threads of this process (the host runtime passes an ncclAllGather).
struct thread_all_gather {
  explicit thread_all_gather(int n) : n(n), sync(n), staging(static_cast<std::size_t>(n) * sizeof(ib_endpoint)) {}
  int n;
  std::barrier<> sync;
  std::vector<std::byte> staging;
  ibverbs_backend::all_gather_fn for_rank(int r) {
    return [this, r](void const* mine, void* all, std::size_t bytes) {
      if (bytes * static_cast<std::size_t>(n) > staging.size()) return status::invalid_argument;
      std::memcpy(staging.data() + static_cast<std::size_t>(r) * bytes, mine, bytes);
      sync.arrive_and_wait();
      std::memcpy(all, staging.data(), bytes * static_cast<std::size_t>(n));
      sync.arrive_and_wait();
      return status::ok;
    };
  }
};

}  // namespace

TEST_CASE("ibverbs: RDMA device present") {
  if (no_rdma_device) SKIP_CASE("no RDMA device");
  int const n = ib_device_count();
  MESSAGE("RDMA devices: " << n);
  CHECK(n > 0);
}

TEST_CASE("ibverbs: two ranks in one process move random data with put, signal and get") {
  if (no_rdma_device) SKIP_CASE("no RDMA device");
  constexpr int nranks = 2, rounds = 20;
  window_layout const layout{nranks, 1, 1 << 16};
  std::vector<std::unique_ptr<std::byte[]>> windows;
  std::vector<std::unique_ptr<std::uint64_t[]>> flags;
  std::vector<work_queue> queues;
  for (int r = 0; r < nranks; ++r) {
    windows.push_back(std::make_unique<std::byte[]>(layout.window_bytes()));
    flags.push_back(std::make_unique<std::uint64_t[]>(layout.n_flags()));
    queues.emplace_back(64);
  }
  std::vector<std::unique_ptr<ibverbs_backend>> backends(nranks);
  thread_all_gather ag(nranks);
  {
    std::vector<std::thread> t;
    for (int r = 0; r < nranks; ++r)
      t.emplace_back([&, r] {
        backends[r] = std::make_unique<ibverbs_backend>(
            r, nranks, host_memory{windows[r].get(), layout.window_bytes(), flags[r].get(), layout.n_flags()}, ib_config{},
            ag.for_rank(r));
      });
    for (auto& x : t) x.join();
  }
  for (int r = 0; r < nranks; ++r) {
    INFO("rank " << r << ": " << backends[r]->last_error());
    REQUIRE(backends[r]->status_code() == status::ok);
  }
  std::vector<work_queue_view> views;
  for (auto& q : queues) views.push_back(q.view());
  std::vector<std::unique_ptr<reccl::proxy::proxy<ibverbs_backend>>> proxies;
  for (int r = 0; r < nranks; ++r) {
    proxies.push_back(std::make_unique<reccl::proxy::proxy<ibverbs_backend>>(*backends[r], std::span(&views[r], 1)));
    proxies.back()->start();
  }
  std::vector<int> bad(nranks, 0);
  {
    std::vector<std::thread> t;
    for (int r = 0; r < nranks; ++r)
      t.emplace_back([&, r] {
        reccl::transport::proxy::handle h;
        h.queues = &views[r];
        h.window = windows[r].get();
        h.flags = flags[r].get();
        h.layout = layout;
        h.rank = r;
        int const p = 1 - r;
        std::size_t const n = 40'000;
        for (int round = 0; round < rounds; ++round) {
          std::uint64_t const dl = clock_ns() + 5'000'000'000ull;
          if (h.wait(0, p, flag::credit, static_cast<std::uint64_t>(round), dl).st != status::ok) ++bad[r];
          std::mt19937_64 g(static_cast<std::uint64_t>(r) * 1000 + round);
          for (std::size_t i = 0; i < n; ++i) h.send_area(0, p)[i] = static_cast<std::byte>(g());
          h.put_with_signal(0, p, 0, h.send_area(0, p), n, flag::ready, static_cast<std::uint64_t>(round + 1));
          if (h.wait(0, p, flag::ready, static_cast<std::uint64_t>(round + 1), dl).st != status::ok) ++bad[r];
          std::mt19937_64 e(static_cast<std::uint64_t>(p) * 1000 + round);
          for (std::size_t i = 0; i < n; ++i)
            if (h.recv_area(0, p)[i] != static_cast<std::byte>(e())) {
              ++bad[r];
              break;
            }
          // get: read back what the peer staged for me this round.
          h.get(0, p, 0, h.recv_area(0, p), 1024);
          std::mt19937_64 e2(static_cast<std::uint64_t>(p) * 1000 + round);
          for (std::size_t i = 0; i < 1024; ++i)
            if (h.recv_area(0, p)[i] != static_cast<std::byte>(e2())) {
              ++bad[r];
              break;
            }
          h.signal(0, p, flag::credit, static_cast<std::uint64_t>(round + 1));
        }
        if (h.flush(0, clock_ns() + 5'000'000'000ull).st != status::ok) ++bad[r];
      });
    for (auto& x : t) x.join();
  }
  for (auto& p : proxies) p->stop();
  for (int r = 0; r < nranks; ++r) {
    INFO("rank " << r << ": " << proxies[r]->error_message());
    CHECK(bad[r] == 0);
    CHECK(proxies[r]->error() == status::ok);
  }
}

TEST_CASE("ibverbs: a bad device name is a clear error on every rank, not a hang") {
  if (no_rdma_device) SKIP_CASE("no RDMA device");
  std::byte window[64];
  std::uint64_t flags[4] = {};
  thread_all_gather ag(2);
  std::unique_ptr<ibverbs_backend> b[2];
  std::thread t0([&] {
    ib_config c;
    c.device_name = "no_such_device";
    b[0] = std::make_unique<ibverbs_backend>(0, 2, host_memory{window, 64, flags, 2}, c, ag.for_rank(0));
  });
  std::byte window1[64];
  std::uint64_t flags1[4] = {};
  std::thread t1([&] {
    b[1] = std::make_unique<ibverbs_backend>(1, 2, host_memory{window1, 64, flags1, 2}, ib_config{}, ag.for_rank(1));
  });
  t0.join();
  t1.join();
  CHECK(b[0]->status_code() == status::invalid_argument);
  CHECK(b[0]->last_error().find("no_such_device") != std::string::npos);
  CHECK(b[1]->status_code() == status::mismatch);  // rank 0 could not open: rank 1 learns it in the exchange
}

#endif
