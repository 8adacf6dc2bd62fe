// Proxy thread + host backend + proxy Transport handle: ranks are threads of this process, each
// with its own window, flags, per-VT queues and proxy thread. Data is random and every byte is
// checked against what the sender generated.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "reccl/cpu/fifo.hpp"
#include "reccl/proxy/backend_host.hpp"
#include "reccl/proxy/proxy.hpp"
#include "reccl/proxy/transport.hpp"
#include "reccl/proxy/work_queue.hpp"

using namespace reccl;
using namespace reccl::proxy;
using handle = reccl::transport::proxy::handle;

namespace {

constexpr std::uint64_t second = 1'000'000'000;

// Bytes rank `src` sends to `dst` on `vt` in round `round`: a deterministic random stream.
void fill(std::byte* p, std::size_t n, int src, int dst, int vt, int round) {
  std::mt19937_64 g(((static_cast<std::uint64_t>(src) * 131 + dst) * 131 + vt) * 100'003 + round);
  for (std::size_t i = 0; i < n; ++i) p[i] = static_cast<std::byte>(g());
}

// Everything N ranks of one process need: windows, flags, queues, backends, proxies.
struct world {
  window_layout layout;
  std::vector<std::unique_ptr<std::byte[]>> windows;
  std::vector<std::unique_ptr<std::uint64_t[]>> flags;
  std::vector<host_memory> memory;
  std::vector<std::vector<work_queue>> queues;          // [rank][vt]
  std::vector<std::vector<work_queue_view>> views;      // [rank][vt]
  std::vector<std::unique_ptr<host_backend>> backends;  // [rank]
  std::vector<std::unique_ptr<reccl::proxy::proxy<host_backend>>> proxies;

  world(int nranks, int n_vts, std::uint64_t area_bytes, std::uint32_t capacity, bool start = true, std::uint64_t symmetric = 0)
      : layout{nranks, n_vts, area_bytes, symmetric} {
    for (int r = 0; r < nranks; ++r) {
      windows.push_back(std::make_unique<std::byte[]>(layout.window_bytes()));
      flags.push_back(std::make_unique<std::uint64_t[]>(layout.n_flags()));
      memory.push_back({windows.back().get(), layout.window_bytes(), flags.back().get(), layout.n_flags()});
      queues.emplace_back();
      views.emplace_back();
      for (int v = 0; v < n_vts; ++v) {
        queues.back().emplace_back(capacity);
        views.back().push_back(queues.back().back().view());
      }
    }
    for (int r = 0; r < nranks; ++r) {
      backends.push_back(std::make_unique<host_backend>(r, memory));
      proxies.push_back(std::make_unique<reccl::proxy::proxy<host_backend>>(*backends[r], views[r]));
      if (start) proxies.back()->start();
    }
  }
  ~world() { stop(); }
  void stop() {
    for (auto& p : proxies) p->stop();
  }

  handle at(int r, std::uint64_t push_timeout_ns = 2 * second) const {
    handle h;
    h.queues = views[r].data();
    h.window = windows[r].get();
    h.flags = flags[r].get();
    h.layout = layout;
    h.rank = r;
    h.push_timeout_ns = push_timeout_ns;
    return h;
  }
};

static_assert(reccl::QueueTransport<reccl::transport::proxy>);

}  // namespace

TEST_CASE("proxy: host backend moves random data between 2-4 ranks with put, signal and credit") {
  for (int nranks : {2, 3, 4}) {
    CAPTURE(nranks);
    constexpr int n_vts = 2, rounds = 40;
    constexpr std::size_t chunk = 3000;  // not a multiple of 8: offsets and sizes need not align
    world w(nranks, n_vts, 4096, 8);
    std::atomic<int> bad_bytes{0}, bad_status{0};
    std::vector<std::thread> threads;
    for (int r = 0; r < nranks; ++r) {
      for (int vt = 0; vt < n_vts; ++vt) {
        // One producer thread per (rank, VT): each queue keeps a single producer.
        threads.emplace_back([&, r, vt] {
          handle const h = w.at(r);
          std::vector<std::byte> expect(chunk);
          for (int round = 0; round < rounds; ++round) {
            for (int p = 0; p < nranks; ++p) {
              if (p == r) continue;
              // Reuse my send area only after p returned the credit for the previous round.
              wait_result c = h.wait(vt, p, flag::credit, static_cast<std::uint64_t>(round), clock_ns() + 5 * second);
              if (c.st != status::ok) ++bad_status;
              fill(h.send_area(vt, p), chunk, r, p, vt, round);
              std::size_t const off = static_cast<std::size_t>(round % 3) * 16 + 1;
              if (round % 2 == 0) {
                h.put_with_signal(vt, p, off, h.send_area(vt, p), chunk, flag::ready, static_cast<std::uint64_t>(round + 1));
              } else {
                h.put(vt, p, off, h.send_area(vt, p), chunk);
                h.signal(vt, p, flag::ready, static_cast<std::uint64_t>(round + 1));
              }
            }
            for (int p = 0; p < nranks; ++p) {
              if (p == r) continue;
              wait_result const a = h.wait(vt, p, flag::ready, static_cast<std::uint64_t>(round + 1), clock_ns() + 5 * second);
              if (a.st != status::ok) {
                ++bad_status;
                continue;
              }
              std::size_t const off = static_cast<std::size_t>(round % 3) * 16 + 1;
              fill(expect.data(), chunk, p, r, vt, round);
              if (std::memcmp(expect.data(), h.recv_area(vt, p) + off, chunk) != 0) ++bad_bytes;
              h.signal(vt, p, flag::credit, static_cast<std::uint64_t>(round + 1));
            }
          }
          if (h.flush(vt, clock_ns() + 5 * second).st != status::ok) ++bad_status;
        });
      }
    }
    for (auto& t : threads) t.join();
    w.stop();
    CHECK(bad_status == 0);
    CHECK(bad_bytes == 0);
    for (int r = 0; r < nranks; ++r) {
      CHECK(w.proxies[r]->error() == status::ok);
      CHECK(w.backends[r]->bytes_moved() == static_cast<std::uint64_t>(n_vts) * rounds * (nranks - 1) * chunk);
      for (int vt = 0; vt < n_vts; ++vt) CHECK(w.views[r][vt].error() == status::ok);
    }
  }
}

TEST_CASE("proxy: get copies a peer's send area into my window") {
  world w(3, 1, 1024, 4);
  // Each rank exposes random bytes to every peer, then tells it so.
  for (int r = 0; r < 3; ++r) {
    handle const h = w.at(r);
    for (int p = 0; p < 3; ++p)
      if (p != r) {
        fill(h.send_area(0, p), 1024, r, p, 0, 99);
        h.signal(0, p, flag::ready, 1);
      }
  }
  for (int r = 0; r < 3; ++r) {
    handle const h = w.at(r);
    for (int p = 0; p < 3; ++p) {
      if (p == r) continue;
      REQUIRE(h.wait(0, p, flag::ready, 1, clock_ns() + 5 * second).st == status::ok);
      std::byte* dst = h.recv_area(0, p);  // any place in my window
      h.get(0, p, 100, dst, 500);
      REQUIRE(h.error(0) == status::ok);
      std::vector<std::byte> expect(1024);
      fill(expect.data(), 1024, p, r, 0, 99);
      CHECK(std::memcmp(dst, expect.data() + 100, 500) == 0);
    }
  }
}

TEST_CASE("proxy: a malformed request fails its queue, names the request, and leaves other queues alone") {
  world w(2, 2, 256, 4);
  // Peer 7 does not exist: pushed raw, past the handle's own checks.
  REQUIRE(w.views[0][1].try_push(make_put(7, 0, 0, 16)));
  push_result const f = w.views[0][1].flush(clock_ns() + 5 * second);
  CHECK(f.st == status::invalid_argument);
  CHECK(w.proxies[0]->error() == status::invalid_argument);
  CHECK(w.proxies[0]->error_message().find("peer 7") != std::string::npos);
  // A later request on the failed queue is discarded; its waits report the error at once.
  handle const h = w.at(0);
  CHECK(h.wait(1, 1, flag::ready, 1, clock_ns() + 5 * second).st == status::invalid_argument);
  // VT 0 still works.
  fill(h.send_area(0, 1), 64, 0, 1, 0, 0);
  h.put_with_signal(0, 1, 0, h.send_area(0, 1), 64, flag::ready, 1);
  handle const h1 = w.at(1);
  REQUIRE(h1.wait(0, 0, flag::ready, 1, clock_ns() + 5 * second).st == status::ok);
  std::vector<std::byte> expect(64);
  fill(expect.data(), 64, 0, 1, 0, 0);
  CHECK(std::memcmp(h1.recv_area(0, 0), expect.data(), 64) == 0);
  CHECK(w.views[0][0].error() == status::ok);
}

TEST_CASE("proxy: the handle rejects a source outside the window and a range past the area") {
  world w(2, 1, 256, 4);
  handle const h = w.at(0);
  std::byte outside[16] = {};
  h.put(0, 1, 0, outside, sizeof outside);
  CHECK(h.error(0) == status::invalid_argument);
  CHECK(h.wait(0, 1, flag::ready, 1, clock_ns() + second).st == status::invalid_argument);

  world w2(2, 1, 256, 4);
  handle const g = w2.at(0);
  g.put(0, 1, 250, g.send_area(0, 1), 16);  // 250 + 16 > 256
  CHECK(g.error(0) == status::invalid_argument);
  world w3(2, 1, 256, 4);
  w3.at(0).signal(0, 5, flag::ready, 1);  // no rank 5
  CHECK(w3.at(0).error(0) == status::invalid_argument);
}

TEST_CASE("proxy: a symmetric put lands at the sender's offset in the peer's symmetric region, and stays inside it") {
  world w(3, 2, 128, 8, true, 4096);
  std::uint64_t const sym = w.layout.symmetric_offset();
  CHECK(w.layout.window_bytes() == sym + 4096);
  handle const h = w.at(0);
  std::byte* const src = h.window + sym + 100;  // my bytes, in my symmetric region
  fill(src, 777, 0, 2, 1, 0);
  std::byte* const dst = h.window + sym + 2001;  // an odd offset: where they land on the peer
  h.put_symmetric_with_signal(1, 2, dst, src, 777, flag::ready, 9);
  h.put_symmetric(1, 0, dst, src, 777);  // to myself: a local copy
  h.signal(1, 0, flag::ready, 4);
  REQUIRE(w.at(2).wait(1, 0, flag::ready, 9, clock_ns() + 5 * second).st == status::ok);
  REQUIRE(h.wait(1, 0, flag::ready, 4, clock_ns() + 5 * second).st == status::ok);
  CHECK(std::memcmp(w.windows[2].get() + sym + 2001, src, 777) == 0);
  CHECK(std::memcmp(w.windows[0].get() + sym + 2001, src, 777) == 0);
  CHECK(h.error(1) == status::ok);
  // a destination in the receive areas, or past the region's end, fails the VT's queue
  h.put_symmetric(0, 1, h.window + 8, src, 16);
  CHECK(h.error(0) == status::invalid_argument);
  handle const g = w.at(1);
  g.put_symmetric(0, 0, g.window + w.layout.window_bytes() - 8, g.window + sym, 16);
  CHECK(g.error(0) == status::invalid_argument);
  CHECK(g.error(1) == status::ok);  // the other VT's queue is untouched
}

TEST_CASE("proxy: inline puts deliver bytes from anywhere, in order with their signal, and bad ones fail the queue") {
  world w(2, 2, 4096, 64);
  handle const h = w.at(0);
  std::mt19937_64 g(3);
  // sources outside the window (a local vector, unaligned), sizes 0 .. 1024, each round signals
  for (int round = 1; round <= 200; ++round) {
    std::size_t const n = g() % (max_inline_bytes + 1);
    std::vector<std::byte> src(n + 1);
    fill(src.data() + 1, n, 0, 1, round % 2, round);
    std::size_t const off = static_cast<std::size_t>(g() % (4096 - n + 1));
    h.put_inline(round % 2, 1, off, src.data() + 1, n, flag::ready, static_cast<std::uint64_t>(round));
    src.assign(src.size(), std::byte{0});  // the bytes were taken at the call: the source is free
    REQUIRE(w.at(1).wait(round % 2, 0, flag::ready, static_cast<std::uint64_t>(round), clock_ns() + 5 * second).st == status::ok);
    std::vector<std::byte> want(n);
    fill(want.data(), n, 0, 1, round % 2, round);
    CHECK(std::equal(want.begin(), want.end(), w.windows[1].get() + w.layout.recv_offset(round % 2, 0) + off));  // n may be 0
  }
  // without a signal (value 0): lands, nothing raised
  std::byte three[3] = {std::byte{1}, std::byte{2}, std::byte{3}};
  h.put_inline(0, 1, 0, three, 3);
  h.signal(0, 1, flag::credit, 1);  // after it: the inline bytes have landed when this arrives
  REQUIRE(w.at(1).wait(0, 0, flag::credit, 1, clock_ns() + 5 * second).st == status::ok);
  CHECK(std::memcmp(w.windows[1].get() + w.layout.recv_offset(0, 0), three, 3) == 0);
  CHECK(h.error(0) == status::ok);
  CHECK(h.error(1) == status::ok);
  // a flush after inline puts returns: completion counts their payload records too
  for (std::size_t n : {std::size_t{1}, std::size_t{64}, std::size_t{65}, max_inline_bytes}) {
    std::vector<std::byte> src(n, std::byte{7});
    h.put_inline(1, 1, 0, src.data(), n);
    CHECK(h.flush(1, clock_ns() + 5 * second).st == status::ok);
  }
  // too many bytes for an inline put, or past the area: the VT's queue fails
  std::vector<std::byte> big(max_inline_bytes + 1);
  h.put_inline(0, 1, 0, big.data(), big.size());
  CHECK(h.error(0) == status::invalid_argument);
  h.put_inline(1, 1, 4000, big.data(), 200);
  CHECK(h.error(1) == status::invalid_argument);
}

TEST_CASE("proxy: a symmetric inline put lands at the sender's offset in the peer's (or my) symmetric region") {
  world w(3, 2, 128, 64, true, 4096);
  std::uint64_t const sym = w.layout.symmetric_offset();
  handle const h = w.at(0);
  std::mt19937_64 g(11);
  for (int round = 1; round <= 100; ++round) {
    std::size_t const n = g() % (max_inline_bytes + 1);
    std::vector<std::byte> src(n + 1);  // outside the window, unaligned
    fill(src.data() + 1, n, 0, 2, round % 2, round);
    std::size_t const off = static_cast<std::size_t>(g() % (4096 - n + 1));
    int const peer = round % 3;  // peer 0: myself
    h.put_symmetric_inline(round % 2, peer, h.window + sym + off, src.data() + 1, n, flag::ready, static_cast<std::uint64_t>(round));
    src.assign(src.size(), std::byte{0});  // taken at the call
    REQUIRE(w.at(peer).wait(round % 2, 0, flag::ready, static_cast<std::uint64_t>(round), clock_ns() + 5 * second).st == status::ok);
    std::vector<std::byte> want(n);
    fill(want.data(), n, 0, 2, round % 2, round);
    CHECK(std::equal(want.begin(), want.end(), w.windows[static_cast<std::size_t>(peer)].get() + sym + off));  // n may be 0
  }
  CHECK(h.error(0) == status::ok);
  CHECK(h.error(1) == status::ok);
  // a destination in the receive areas, past the region's end, too many bytes, or no such peer
  std::vector<std::byte> big(max_inline_bytes + 1);
  auto fails = [&](auto&& post) {
    world x(3, 1, 128, 64, true, 4096);
    handle const k = x.at(0);
    post(k);
    return k.error(0) == status::invalid_argument;
  };
  CHECK(fails([&](handle const& k) { k.put_symmetric_inline(0, 1, k.window + 8, big.data(), 16); }));
  CHECK(fails([&](handle const& k) { k.put_symmetric_inline(0, 1, k.window + k.layout.window_bytes() - 8, big.data(), 16); }));
  CHECK(fails([&](handle const& k) { k.put_symmetric_inline(0, 1, k.window + sym, big.data(), big.size()); }));
  CHECK(fails([&](handle const& k) { k.put_symmetric_inline(0, 3, k.window + sym, big.data(), 16); }));
  CHECK_FALSE(fails([&](handle const& k) { k.put_symmetric_inline(0, 1, k.window + sym, big.data(), max_inline_bytes); }));
}

TEST_CASE("proxy: a wait with no signal times out at its deadline and counts spins") {
  world w(2, 1, 64, 4);
  std::uint64_t const t0 = clock_ns();
  wait_result const r = w.at(0).wait(0, 1, flag::ready, 1, t0 + 10'000'000);
  CHECK(r.st == status::timeout);
  CHECK(r.spins > 0);
  CHECK(clock_ns() - t0 >= 10'000'000);
}

TEST_CASE("proxy: without a proxy running, a full queue stalls the producer and times out") {
  world w(2, 1, 64, 2, /*start=*/false);
  handle const h = w.at(0, 5'000'000);
  h.signal(0, 1, flag::ready, 1);
  h.signal(0, 1, flag::ready, 2);
  CHECK(h.error(0) == status::ok);
  CHECK(h.queue_stalls(0) == 0);
  h.signal(0, 1, flag::ready, 3);  // ring of 2 is full: stalls for 5 ms, then fails the queue
  CHECK(h.queue_stalls(0) > 0);
  CHECK(h.error(0) == status::timeout);
}

TEST_CASE("proxy: stop executes what was queued before it, then joins") {
  world w(2, 1, 4096, 64);
  handle const h = w.at(0);
  fill(h.send_area(0, 1), 4096, 0, 1, 0, 5);
  for (int i = 0; i < 50; ++i) h.put(0, 1, 0, h.send_area(0, 1), 4096);
  h.signal(0, 1, flag::ready, 50);
  w.stop();
  CHECK(w.proxies[0]->error() == status::ok);
  CHECK(w.proxies[0]->issued(0) == 51);
  CHECK(w.views[0][0].flush(clock_ns()).st == status::ok);  // completed == published
  CHECK(w.at(1).wait(0, 0, flag::ready, 50, clock_ns()).st == status::ok);
  std::vector<std::byte> expect(4096);
  fill(expect.data(), 4096, 0, 1, 0, 5);
  CHECK(std::memcmp(w.at(1).recv_area(0, 0), expect.data(), 4096) == 0);
}

TEST_CASE("proxy: run_once drives the proxy on the caller's thread") {
  world w(2, 1, 128, 4, /*start=*/false);
  handle const h = w.at(0);
  fill(h.send_area(0, 1), 128, 0, 1, 0, 1);
  h.put_with_signal(0, 1, 0, h.send_area(0, 1), 128, flag::ready, 9);
  CHECK(w.at(1).wait(0, 0, flag::ready, 9, clock_ns()).st == status::timeout);  // nothing ran yet
  CHECK(w.proxies[0]->run_once());
  CHECK(w.at(1).wait(0, 0, flag::ready, 9, clock_ns()).st == status::ok);
  CHECK(h.flush(0, clock_ns()).st == status::ok);
  CHECK_FALSE(w.proxies[0]->run_once());  // nothing left
}

TEST_CASE("proxy: invalid queues are reported at construction") {
  host_memory mem{};
  host_backend b(0, std::span<host_memory const>(&mem, 1));
  work_queue_view bad{};
  reccl::proxy::proxy<host_backend> p(b, std::span<work_queue_view const>(&bad, 1));
  CHECK(p.error() == status::invalid_argument);
  CHECK(p.error_message().find("queue 0") != std::string::npos);
}

// -- composition: the CPU engine's FIFO slot protocol (reccl/cpu/fifo.hpp) over the proxy handle.

namespace {

// Adds the FIFO geometry and sequence counters the slot protocol needs to a proxy handle. Sources
// are staged in my send area at the slot's own offset: a slot's staging bytes are reused only once
// its credit came back, i.e. after the receiver saw the data, so the asynchronous put has completed.
struct fifo_over_proxy {
  handle h;
  int n_slots = 4;
  std::size_t n_slot_bytes = 1024;
  std::uint64_t* tx = nullptr;  // [vt * nranks + peer]
  std::uint64_t* rx = nullptr;

  void put(int vt, int peer, std::size_t offset, void const* src, std::size_t bytes) const {
    std::byte* stage = h.send_area(vt, peer) + offset;
    if (stage != src) std::memcpy(stage, src, bytes);
    h.put(vt, peer, offset, stage, bytes);
  }
  void get(int vt, int peer, std::size_t offset, void* dst, std::size_t bytes) const { h.get(vt, peer, offset, dst, bytes); }
  void signal(int vt, int peer, flag f, std::uint64_t v) const { h.signal(vt, peer, f, v); }
  wait_result wait(int vt, int peer, flag f, std::uint64_t v, std::uint64_t deadline_ns) const {
    return h.wait(vt, peer, f, v, deadline_ns);
  }
  int slots() const { return n_slots; }
  std::size_t slot_bytes() const { return n_slot_bytes; }
  std::byte* recv_area(int vt, int peer) const { return h.recv_area(vt, peer); }
  std::uint64_t& tx_seq(int vt, int peer) const { return tx[vt * h.layout.nranks + peer]; }
  std::uint64_t& rx_seq(int vt, int peer) const { return rx[vt * h.layout.nranks + peer]; }
};
static_assert(reccl::cpu::FifoHandle<fifo_over_proxy>);

}  // namespace

TEST_CASE("proxy: the CPU engine's credit-based slot protocol runs unchanged over the proxy transport") {
  constexpr int n_slots = 4, messages = 300;
  constexpr std::size_t slot_bytes = 1000;
  world w(2, 1, n_slots * slot_bytes, 4);  // a 4-entry queue: the sender also stalls on the queue
  std::uint64_t tx[2][2] = {}, rx[2][2] = {};
  fifo_over_proxy const sender{w.at(0), n_slots, slot_bytes, tx[0], rx[0]};
  fifo_over_proxy const receiver{w.at(1), n_slots, slot_bytes, tx[1], rx[1]};
  int sent = 0, received = 0, wrong = 0;
  std::thread s([&] {
    std::vector<std::byte> msg(slot_bytes);
    std::uint64_t const deadline = clock_ns() + 10 * second;
    while (sent < messages && clock_ns() < deadline) {
      if (!reccl::cpu::can_send(sender, 0, 1)) {
        std::this_thread::yield();
        continue;
      }
      std::size_t const n = 1 + static_cast<std::size_t>(sent * 37 % slot_bytes);  // every size 1..slot_bytes
      fill(msg.data(), n, 0, 1, 0, sent);
      reccl::cpu::send_slot(sender, 0, 1, msg.data(), n);
      ++sent;
    }
  });
  std::vector<std::byte> expect(slot_bytes);
  std::uint64_t const deadline = clock_ns() + 10 * second;
  while (received < messages && clock_ns() < deadline) {
    std::byte const* slot = reccl::cpu::peek_slot(receiver, 0, 0);
    if (slot == nullptr) {
      std::this_thread::yield();
      continue;
    }
    std::size_t const n = 1 + static_cast<std::size_t>(received * 37 % slot_bytes);
    fill(expect.data(), n, 0, 1, 0, received);
    if (std::memcmp(slot, expect.data(), n) != 0) ++wrong;
    reccl::cpu::release_slot(receiver, 0, 0);
    ++received;
  }
  s.join();
  CHECK(sent == messages);
  CHECK(received == messages);
  CHECK(wrong == 0);
  w.stop();
  CHECK(w.proxies[0]->error() == status::ok);
  CHECK(w.proxies[1]->error() == status::ok);
  MESSAGE("sender queue stalls: " << w.views[0][0].stalls());
}

// -- a backend whose operations complete asynchronously: completion and stop semantics.

namespace {

// Completes each operation `delay` progress calls after it started; `stuck` never completes.
struct deferred_backend {
  int delay = 3;
  bool stuck = false;
  bool fail_progress = false;
  std::vector<int> pending;  // progress calls left per operation in flight
  std::uint64_t started = 0;

  status start() {
    pending.push_back(delay);
    ++started;
    return status::ok;
  }
  status put(work_request const&) { return start(); }
  status signal(work_request const&) { return start(); }
  status get(work_request const&) { return start(); }
  poll_result poll_completions() {
    if (fail_progress) return {status::internal, pending.size()};
    if (!stuck)
      for (int& p : pending) --p;
    std::erase_if(pending, [](int p) { return p <= 0; });
    return {status::ok, pending.size()};
  }
};
static_assert(Backend<deferred_backend>);

}  // namespace

TEST_CASE("proxy: a queue's requests count as completed only once the backend finished them") {
  work_queue q(8);
  work_queue_view const v = q.view();
  deferred_backend b;
  reccl::proxy::proxy<deferred_backend> p(b, std::span(&v, 1));
  REQUIRE(v.try_push(make_put(1, 0, 0, 8)));
  REQUIRE(v.try_push(make_put_with_signal(1, 0, 0, 8, 0, 1)));
  CHECK(p.run_once());  // takes both, starts 3 operations
  CHECK(b.started == 3);
  CHECK(v.flush(clock_ns()).st == status::timeout);  // 3 progress calls needed, 1 made
  p.run_once();
  CHECK(v.flush(clock_ns()).st == status::timeout);
  p.run_once();
  CHECK(v.flush(clock_ns()).st == status::ok);
  CHECK(p.error() == status::ok);
}

TEST_CASE("proxy: stop gives up on a backend that never completes, with a timeout error") {
  work_queue q(8);
  work_queue_view const v = q.view();
  deferred_backend b;
  b.stuck = true;
  proxy_config cfg;
  cfg.drain_timeout_ns = 20'000'000;
  reccl::proxy::proxy<deferred_backend> p(b, std::span(&v, 1), cfg);
  p.start();
  REQUIRE(v.try_push(make_signal(1, 0, 1)));
  std::uint64_t const t0 = clock_ns();
  p.stop();
  CHECK(clock_ns() - t0 < 5 * second);
  CHECK(p.error() == status::timeout);
  CHECK(p.error_message().find("outstanding") != std::string::npos);
  CHECK(v.flush(clock_ns() + second).st == status::timeout);  // the queue's error: no hang
}

TEST_CASE("proxy: a failing backend fails every queue") {
  work_queue q0(4), q1(4);
  work_queue_view const v[2] = {q0.view(), q1.view()};
  deferred_backend b;
  b.fail_progress = true;
  reccl::proxy::proxy<deferred_backend> p(b, std::span(v, 2));
  p.run_once();
  CHECK(p.error() == status::internal);
  CHECK(v[0].error() == status::internal);
  CHECK(v[1].error() == status::internal);
  CHECK(v[1].push(make_signal(0, 0, 1), clock_ns() + second).st == status::internal);
}
