// Work queue: FIFO order, wrap-around, capacity, a producer and a consumer on two threads, a full
// queue that stalls (counted) until its deadline, and inline puts whose payload rides in the ring.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>
#include <thread>

#include "reccl/proxy/work_queue.hpp"

using namespace reccl;
using namespace reccl::proxy;

namespace {

// A request whose every field derives from (seed, i): the consumer regenerates it to compare.
work_request random_request(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t state = seed * 1'000'003 + i;
  auto g = [&state] {  // splitmix64: cheap, and every field differs
    std::uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  switch (g() % 4) {
    case 0: return make_put(static_cast<int>(g() % 64), g(), g(), g());
    case 1: return make_signal(static_cast<int>(g() % 64), static_cast<std::uint32_t>(g()), g());
    case 2: return make_put_with_signal(static_cast<int>(g() % 64), g(), g(), g(), static_cast<std::uint32_t>(g()), g());
    default: return make_get(static_cast<int>(g() % 64), g(), g(), g());
  }
}

bool same(work_request const& a, work_request const& b) {
  return a.kind == b.kind && a.peer == b.peer && a.flag_index == b.flag_index && a.src_offset == b.src_offset &&
         a.dst_offset == b.dst_offset && a.bytes == b.bytes && a.value == b.value;
}

// Each producer-side test runs twice: on the plain view (every push reads the counters) and on
// the view with a producer cache (pushes read nothing while the ring has room).
#define GENERATE_VIEW(q) [&] {                                   \
  work_queue_view w = (q).view();                                \
  SUBCASE("plain view") {}                                       \
  SUBCASE("with a producer cache") { w = (q).producer_view(); }  \
  return w;                                                      \
}()

}  // namespace

TEST_CASE("work_queue: capacity must be a power of two") {
  CHECK_FALSE(work_queue(0).valid());
  CHECK_FALSE(work_queue(3).valid());
  CHECK_FALSE(work_queue(12).valid());
  CHECK_FALSE(work_queue((1u << 20) * 2).valid());
  CHECK(work_queue(1).valid());
  CHECK(work_queue(8).valid());
}

TEST_CASE("work_queue: FIFO order and wrap-around on one thread") {
  work_queue q(4);
  REQUIRE(q.valid());
  auto const v = GENERATE_VIEW(q);
  std::mt19937 g(7);
  std::uint64_t pushed = 0, popped = 0;
  // Random bursts of pushes and pops wrap the 4-slot ring hundreds of times.
  while (popped < 2000) {
    int const burst = static_cast<int>(g() % 6);
    for (int k = 0; k < burst; ++k) {
      bool const room = pushed - popped < 4;
      CHECK(v.try_push(random_request(1, pushed)) == room);
      if (room) ++pushed;
    }
    int const take = static_cast<int>(g() % 6);
    for (int k = 0; k < take; ++k) {
      work_request r;
      bool const any = popped < pushed;
      REQUIRE(v.try_pop(r) == any);
      if (!any) break;
      REQUIRE(same(r, random_request(1, popped)));
      ++popped;
    }
  }
  CHECK(v.published() == pushed);
  CHECK(v.stalls() == 0);
  CHECK(v.error() == status::ok);
}

TEST_CASE("work_queue: a producer thread and a consumer thread keep order") {
  work_queue q(16);
  auto const v = GENERATE_VIEW(q);
  constexpr std::uint64_t n = 50'000;
  std::thread producer([&] {
    for (std::uint64_t i = 0; i < n; ++i) {
      push_result const r = v.push(random_request(2, i), clock_ns() + 20'000'000'000ull);
      if (r.st != status::ok) return;
    }
  });
  std::uint64_t got = 0, mismatches = 0;
  std::uint64_t const deadline = clock_ns() + 20'000'000'000ull;
  while (got < n && clock_ns() < deadline) {
    work_request r;
    if (!v.try_pop(r)) {
      std::this_thread::yield();
      continue;
    }
    if (!same(r, random_request(2, got))) ++mismatches;
    ++got;
    if (got % 1000 == 0) v.mark_completed(got);
  }
  producer.join();
  CHECK(got == n);
  CHECK(mismatches == 0);
  CHECK(v.error() == status::ok);
  // A 16-slot ring against a consumer on another thread: the producer must have found it full.
  MESSAGE("producer stalls: " << v.stalls());
}

TEST_CASE("work_queue: a full queue stalls until its deadline, then fails sticky with timeout") {
  work_queue q(2);
  auto const v = GENERATE_VIEW(q);
  REQUIRE(v.try_push(make_signal(0, 0, 1)));
  REQUIRE(v.try_push(make_signal(0, 0, 2)));
  std::uint64_t const t0 = clock_ns();
  push_result const r = v.push(make_signal(0, 0, 3), t0 + 20'000'000);
  std::uint64_t const waited = clock_ns() - t0;
  CHECK(r.st == status::timeout);
  CHECK(r.spins > 0);
  CHECK(v.stalls() == r.spins);
  CHECK(waited >= 20'000'000);
  CHECK(waited < 2'000'000'000);
  CHECK(v.error() == status::timeout);
  // Sticky: even with room again, a later push reports the error at once.
  work_request out;
  REQUIRE(v.try_pop(out));
  CHECK(out.value == 1);
  push_result const again = v.push(make_signal(0, 0, 4), clock_ns() + 1'000'000'000);
  CHECK(again.st == status::timeout);
  CHECK(again.spins == 0);
}

TEST_CASE("work_queue: a stalled push succeeds once the consumer frees a slot") {
  work_queue q(1);
  auto const v = GENERATE_VIEW(q);
  REQUIRE(v.try_push(make_signal(1, 5, 10)));
  std::thread consumer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    work_request r;
    (void)v.try_pop(r);
  });
  push_result const r = v.push(make_signal(1, 5, 11), clock_ns() + 2'000'000'000);
  consumer.join();
  CHECK(r.st == status::ok);
  // Usually r.spins > 0, but a producer descheduled for the consumer's 10 ms finds room at once:
  // on a loaded machine only the bookkeeping is certain.
  CHECK(v.stalls() == r.spins);
  work_request out;
  REQUIRE(v.try_pop(out));
  CHECK(out.value == 11);
}

TEST_CASE("work_queue: flush waits for completions and is bounded") {
  work_queue q(8);
  auto const v = q.view();
  for (int i = 0; i < 3; ++i) REQUIRE(v.try_push(make_put(1, 0, 0, 8)));
  CHECK(v.flush(clock_ns() + 5'000'000).st == status::timeout);  // nobody completes them
  CHECK(v.error() == status::ok);                                 // a flush timeout is not sticky
  std::thread consumer([&] {
    work_request r;
    int n = 0;
    while (n < 3)
      if (v.try_pop(r)) ++n;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    v.mark_completed(3);
  });
  push_result const r = v.flush(clock_ns() + 2'000'000'000);
  consumer.join();
  CHECK(r.st == status::ok);
  CHECK(v.flush(clock_ns()).st == status::ok);  // completed == published now: one poll suffices
  v.fail(status::internal);
  CHECK(v.wait_completed(4, clock_ns() + 1'000'000'000).st == status::internal);
}

TEST_CASE("work_queue: with a producer cache, a push reads the queue only when the ring looks full") {
  work_queue q(4);
  auto const v = q.producer_view();
  work_queue_view const consumer = q.view();
  for (int i = 0; i < 4; ++i) REQUIRE(v.try_push(make_signal(0, 0, static_cast<std::uint64_t>(i))));
  CHECK(v.published() == 4);
  // the consumer frees two slots: the cached head is stale, the push that finds the ring full
  // reloads it and goes on
  work_request r;
  REQUIRE(consumer.try_pop(r));
  REQUIRE(consumer.try_pop(r));
  CHECK(v.cache->head == 0);
  CHECK(v.try_push(make_signal(0, 0, 4)));
  CHECK(v.cache->head == 2);
  CHECK(v.try_push(make_signal(0, 0, 5)));
  CHECK_FALSE(v.try_push(make_signal(0, 0, 6)));
  for (std::uint64_t want = 2; want < 6; ++want) {
    REQUIRE(consumer.try_pop(r));
    CHECK(r.value == want);
  }
}

TEST_CASE("work_queue: with a producer cache, the consumer's error stops pushes once the ring fills, and waits at once") {
  work_queue q(2);
  auto const v = q.producer_view();
  work_queue_view const consumer = q.view();
  REQUIRE(v.push(make_signal(0, 0, 1), clock_ns() + 1'000'000'000).st == status::ok);
  consumer.fail(status::internal);
  // room left: the push is not told yet (reading the error word is what the cache saves)
  CHECK(v.push(make_signal(0, 0, 2), clock_ns() + 1'000'000'000).st == status::ok);
  // full: the producer looks, finds the error, and stops without waiting for the deadline
  std::uint64_t const t0 = clock_ns();
  push_result const r = v.push(make_signal(0, 0, 3), t0 + 5'000'000'000ull);
  CHECK(r.st == status::internal);
  CHECK(clock_ns() - t0 < 1'000'000'000ull);
  CHECK(v.push(make_signal(0, 0, 4), clock_ns() + 1'000'000'000).st == status::internal);  // sticky, at once
  CHECK(v.flush(clock_ns() + 1'000'000'000).st == status::internal);
}

TEST_CASE("work_queue: a producer cache picks up a queue that already holds requests") {
  work_queue q(8);
  work_queue_view const plain = q.view();
  for (int i = 0; i < 3; ++i) REQUIRE(plain.try_push(make_signal(0, 0, static_cast<std::uint64_t>(i))));
  auto const v = q.producer_view();  // first use loads tail and head
  REQUIRE(v.try_push(make_signal(0, 0, 3)));
  CHECK(v.published() == 4);
  work_request r;
  for (std::uint64_t want = 0; want < 4; ++want) {
    REQUIRE(plain.try_pop(r));
    CHECK(r.value == want);
  }
}

TEST_CASE("work_queue: inline puts carry their payload through the ring, wrapping, mixed with other requests") {
  work_queue q(32);
  REQUIRE(q.valid());
  auto const v = GENERATE_VIEW(q);
  std::mt19937_64 g(11);
  std::uint64_t pushed = 0, popped = 0, records = 0;  // records: ring slots in use
  std::vector<std::vector<unsigned char>> sent;       // payloads in push order (empty: a plain request)
  std::vector<std::byte> out(max_inline_bytes);
  while (popped < 3000) {
    for (int k = static_cast<int>(g() % 4); k > 0; --k) {
      if (g() % 2) {
        std::uint64_t const n = g() % (max_inline_bytes + 1);  // 0 .. 1024 bytes, any length
        std::vector<unsigned char> p(n + 3);
        for (auto& b : p) b = static_cast<unsigned char>(g());
        std::uint64_t const need = 1 + inline_slots(n);
        bool const room = records + need <= 32;
        // the source starts 3 bytes in: not aligned
        CHECK(v.try_push_inline(make_put_inline(1, pushed, n, 5, pushed + 1), p.data() + 3) == room);
        if (room) {
          sent.emplace_back(p.begin() + 3, p.end());
          records += need;
          ++pushed;
        }
      } else {
        bool const room = records + 1 <= 32;
        CHECK(v.try_push(random_request(3, pushed)) == room);
        if (room) {
          sent.emplace_back();
          records += 1;
          ++pushed;
        }
      }
    }
    for (int k = static_cast<int>(g() % 4); k > 0 && popped < pushed; --k) {
      work_request r;
      REQUIRE(v.try_pop(r, out.data()));
      auto const& want = sent[popped];
      if (r.kind == request_kind::put_inline) {
        REQUIRE(r.bytes == want.size());
        CHECK(r.dst_offset == popped);
        CHECK(r.value == popped + 1);
        CHECK((want.empty() || std::memcmp(out.data(), want.data(), want.size()) == 0));  // a 0-byte put: nothing to compare
        records -= 1 + inline_slots(r.bytes);
      } else {
        REQUIRE(want.empty());
        CHECK(same(r, random_request(3, popped)));
        records -= 1;
      }
      ++popped;
    }
  }
  CHECK(v.error() == status::ok);
}

TEST_CASE("work_queue: an inline put too large for the limit or the ring fails the queue, and one the consumer cannot take comes out malformed") {
  std::vector<unsigned char> p(max_inline_bytes + 64, 7);
  {
    work_queue q(64);
    auto const v = q.view();
    CHECK(v.push_inline(make_put_inline(0, 0, max_inline_bytes + 1), p.data(), 0).st == status::invalid_argument);
    CHECK(v.error() == status::invalid_argument);
  }
  {
    work_queue q(8);  // 1 + 16 records do not fit in 8
    auto const v = q.view();
    CHECK(v.push_inline(make_put_inline(0, 0, max_inline_bytes), p.data(), 0).st == status::invalid_argument);
  }
  {
    work_queue q(64);
    auto const v = q.view();
    REQUIRE(v.push_inline(make_put_inline(0, 0, 100), p.data(), ~0ull).st == status::ok);
    work_request r;
    REQUIRE(v.try_pop(r));  // no room for a payload given: malformed, its records skipped
    CHECK(r.kind == request_kind::none);
    CHECK_FALSE(v.try_pop(r));
  }
}
