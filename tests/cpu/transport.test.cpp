// The CPU-thread transport: FIFO protocol, bounded waits and their spin counts, rate caps,
// dead links, abort, get, reset.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <reccl/cpu/fifo.hpp>
#include <reccl/cpu/thread_transport.hpp>

using namespace reccl;
using handle = transport::cpu_threads::handle;

static_assert(QueueTransport<transport::cpu_threads>);
static_assert(transport::cpu_threads::max_vts == reccl::max_vts);

namespace {

cpu::fabric make_fabric(int slots, std::size_t slot_bytes, std::uint64_t quantum, cpu::fault_plan plan = {}) {
  return cpu::fabric(cpu::fabric_config{2, 2, slots, slot_bytes, quantum}, std::move(plan));
}

/// Streams `data` from rank 0 to rank 1 on `vt` through the FIFO; returns what arrived and the
/// sender's stall quanta.
struct stream_result {
  std::vector<std::byte> got;
  std::uint64_t sender_spins = 0;
  bool timed_out = false;
};

stream_result stream(cpu::fabric const& fab, int vt, std::vector<std::byte> const& data, std::uint64_t epoch,
                     std::uint64_t timeout_ns = 2'000'000'000) {
  stream_result r;
  r.got.resize(data.size());
  std::size_t const sb = fab.config().slot_bytes;
  std::thread tx([&] {
    handle const h{&fab, 0, epoch, nullptr};
    for (std::size_t off = 0; off < data.size(); off += sb) {
      std::uint64_t const seq = h.tx_seq(vt, 1);
      if (seq >= static_cast<std::uint64_t>(h.slots())) {
        auto w = h.wait(vt, 1, flag::credit, seq - h.slots() + 1, cpu::now_ns() + timeout_ns);
        r.sender_spins += w.spins;
        if (w.st != status::ok) return;
      }
      cpu::send_slot(h, vt, 1, data.data() + off, std::min(sb, data.size() - off));
    }
  });
  handle const h{&fab, 1, epoch, nullptr};
  for (std::size_t off = 0; off < data.size(); off += sb) {
    auto w = h.wait(vt, 0, flag::ready, h.rx_seq(vt, 0) + 1, cpu::now_ns() + timeout_ns);
    if (w.st != status::ok) {
      r.timed_out = true;
      break;
    }
    std::byte const* slot = cpu::peek_slot(h, vt, 0);
    REQUIRE(slot != nullptr);
    std::memcpy(r.got.data() + off, slot, std::min(sb, data.size() - off));
    cpu::release_slot(h, vt, 0);
  }
  tx.join();
  return r;
}

std::vector<std::byte> random_bytes(std::size_t n, unsigned seed) {
  std::mt19937 g(seed);
  std::vector<std::byte> v(n);
  for (auto& b : v) b = static_cast<std::byte>(g() & 0xff);
  return v;
}

}  // namespace

TEST_CASE("FIFO: a long stream through a 2-slot ring arrives intact, in order") {
  auto fab = make_fabric(2, 64, 20'000);
  auto const data = random_bytes(64 * 500 + 17, 1);
  auto const r = stream(fab, 1, data, 0);
  CHECK_FALSE(r.timed_out);
  CHECK(r.got == data);
  // a second stream continues the sequence numbers
  auto const data2 = random_bytes(64 * 30, 2);
  auto const r2 = stream(fab, 1, data2, 1);
  CHECK(r2.got == data2);
}

TEST_CASE("wait: ends at its deadline with timeout, spins = whole poll quanta waited") {
  auto fab = make_fabric(2, 64, 1'000'000);  // 1 ms quantum
  handle const h{&fab, 1, 0, nullptr};
  std::uint64_t const t0 = cpu::now_ns();
  auto const w = h.wait(0, 0, flag::ready, 1, t0 + 20'000'000);
  std::uint64_t const waited = cpu::now_ns() - t0;
  CHECK(w.st == status::timeout);
  CHECK(waited >= 20'000'000);
  CHECK(w.spins >= 19);                      // floor((t - t0) / q) with t >= deadline
  CHECK(w.spins <= waited / 1'000'000 + 1);  // never more quanta than time waited
  // a deadline in the past is one poll
  auto const once = h.wait(0, 0, flag::ready, 1, 0);
  CHECK(once.st == status::timeout);
  CHECK(once.spins == 0);
}

TEST_CASE("wait: the abort flag ends it early") {
  auto fab = make_fabric(2, 64, 100'000);
  std::atomic<bool> abort{false};
  handle const h{&fab, 1, 0, &abort};
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    abort.store(true);
  });
  std::uint64_t const t0 = cpu::now_ns();
  auto const w = h.wait(0, 0, flag::ready, 1, t0 + 10'000'000'000);
  t.join();
  CHECK(w.st == status::timeout);
  CHECK(cpu::now_ns() - t0 < 2'000'000'000);
}

TEST_CASE("rate cap: slots take bytes/rate of wire time, the FIFO fills and the sender stalls") {
  cpu::fault_plan plan;
  plan.cap(0, 10e6, 0, cpu::forever);  // VT 0: 10 MB/s
  auto fab = make_fabric(4, 4096, 100'000, plan);
  auto const data = random_bytes(4096 * 50, 3);  // 200 KB -> >= 20 ms of wire time
  std::uint64_t const t0 = cpu::now_ns();
  auto const r = stream(fab, 0, data, 0);
  std::uint64_t const took = cpu::now_ns() - t0;
  CHECK(r.got == data);
  CHECK(took >= 20'000'000);
  // the sender waited for credit for most of the wire time (4 slots of it are in flight at the end)
  CHECK(r.sender_spins * 100'000 >= 10'000'000);
  // the uncapped VT 1 moves the same bytes much faster and without waiting that long
  auto const r1 = stream(fab, 1, data, 0);
  CHECK(r1.got == data);
  CHECK(r1.sender_spins < r.sender_spins);
}

TEST_CASE("rate cap applies only in its epochs and to its source rank") {
  cpu::fault_plan plan;
  plan.cap(0, 1e6, 5, 6, 1);
  CHECK(plan.rate(0, 1, 5) == 1e6);
  CHECK(plan.rate(0, 1, 4) == 0);
  CHECK(plan.rate(0, 1, 6) == 0);
  CHECK(plan.rate(0, 0, 5) == 0);
  CHECK(plan.rate(1, 1, 5) == 0);
  plan.cap(0, 5e5, 0);
  CHECK(plan.rate(0, 1, 5) == 5e5);  // the lowest cap wins
}

TEST_CASE("dead link: nothing moves in the dead epochs, waits time out, it works again after") {
  cpu::fault_plan plan;
  plan.kill(1, 3, 4);
  auto fab = make_fabric(2, 64, 50'000, plan);
  auto const data = random_bytes(64 * 4, 4);
  auto const dead = stream(fab, 1, data, 3, 30'000'000);
  CHECK(dead.timed_out);
  fab.reset_vt(0, 1);
  fab.reset_vt(1, 1);
  auto const alive = stream(fab, 1, data, 4);
  CHECK_FALSE(alive.timed_out);
  CHECK(alive.got == data);
}

TEST_CASE("dead link after some bytes: the first bytes arrive, then the link stops") {
  cpu::fault_plan plan;
  plan.kill(0, 0, 1, 0, 64 * 3);
  auto fab = make_fabric(8, 64, 50'000, plan);
  auto const data = random_bytes(64 * 6, 5);
  auto const r = stream(fab, 0, data, 0, 30'000'000);
  CHECK(r.timed_out);
  CHECK(std::memcmp(r.got.data(), data.data(), 64 * 3) == 0);
}

TEST_CASE("get reads the peer's exposed area, a dead link copies nothing") {
  cpu::fault_plan plan;
  plan.kill(1, 2, 3);
  auto fab = make_fabric(2, 64, 50'000, plan);
  handle const owner{&fab, 0, 0, nullptr};
  auto const data = random_bytes(100, 6);
  std::memcpy(owner.send_area(0, 1), data.data(), data.size());
  std::memcpy(owner.send_area(1, 1), data.data(), data.size());
  std::vector<std::byte> got(60, std::byte{0});
  handle const reader{&fab, 1, 0, nullptr};
  reader.get(0, 0, 20, got.data(), 60);
  CHECK(std::memcmp(got.data(), data.data() + 20, 60) == 0);
  std::vector<std::byte> none(60, std::byte{0x5a});
  handle const dead_reader{&fab, 1, 2, nullptr};
  dead_reader.get(1, 0, 0, none.data(), 60);
  CHECK(none == std::vector<std::byte>(60, std::byte{0x5a}));
}

TEST_CASE("signal far ahead of the receiver: bounded, never a hang") {
  auto fab = cpu::fabric(cpu::fabric_config{2, 1, 1, 64, 1'000}, {});  // 1 us quantum: the bound is 10 ms
  handle const h{&fab, 0, 0, nullptr};
  std::uint64_t const t0 = cpu::now_ns();
  for (int k = 1; k <= cpu::queue_depth + 1; ++k) h.signal(0, 1, flag::ready, static_cast<std::uint64_t>(k));
  CHECK(cpu::now_ns() - t0 < 2'000'000'000);
  handle const rx{&fab, 1, 0, nullptr};
  CHECK(rx.test(0, 0, flag::ready, cpu::queue_depth));
  CHECK_FALSE(rx.test(0, 0, flag::ready, cpu::queue_depth + 1));  // the dropped one
}
