// reccl/proxy/work_queue.hpp -- the single-producer single-consumer ring through which a GPU (or
// any producer thread) hands small work requests to a host proxy thread.
//
//   producer (one GPU thread per queue)                 consumer (the proxy thread)
//   ┌─────────────────────────────────────┐             ┌──────────────────────────────────┐
//   │ wait until tail - head < capacity   │  ring[cap]  │ t = acquire-load tail            │
//   │   (each failed poll: stalls += 1,   │ ┌─┬─┬─┬─┐  │ while head < t:                  │
//   │    bounded by a deadline)           │ │ │ │ │ │  │   copy ring[head % cap], execute │
//   │ ring[tail % cap] = request          │ └─┴─┴─┴─┘  │   release-store head + 1         │
//   │ release-store tail + 1              │ ──────────▶│ when the backend completed them: │
//   │ (flush: acquire-load completed)     │ ◀──────────│   release-store completed        │
//   └─────────────────────────────────────┘             └──────────────────────────────────┘
//
// Memory lives where both sides can address it: plain host memory for CPU producers, and
// cudaHostAlloc'd mapped memory when the producer is a kernel (the same layout; the ring and the
// control block are trivially copyable records with no pointers inside).
//
// Memory order (the whole protocol):
//  - producer: writes the record, then release-stores `tail`; it acquire-loads `head` before
//    reusing a slot, so it never overwrites a record the consumer has not copied out yet;
//  - consumer: acquire-loads `tail`, copies the record, then release-stores `head`;
//  - consumer: once the backend reports the requests up to n complete (their bytes are in the
//    peer's memory, their signals delivered), release-stores `completed = n`; a producer that
//    acquire-loads `completed >= n` may reuse the source bytes of requests < n (flush).
//  - `error` is sticky: the first non-ok status either side hits; readers use acquire.
// On the host these are std::atomic_ref operations; in device code (only under __CUDA_ARCH__)
// they are ld.acquire.sys / st.release.sys, which order against the host through mapped memory.
// (The switch is __CUDA_ARCH__, not RECCL_DEVICE_COMPILE: the latter is also 1 in nvcc's host
// pass, where the host compiler's std::atomic_ref is the right tool.)
//
// Stalls: a producer that finds the ring full polls again; each unsuccessful poll is one stall,
// added to the queue's `stalls` counter (the same counting as a transport wait). A full queue is
// a stall, and a full queue that never drains is a timeout at the caller's deadline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "../config.hpp"
#include "../device/spin_until.hpp"
#include "../types.hpp"

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

namespace reccl::proxy {

/// What a work request asks the proxy to do.
enum class request_kind : std::uint32_t {
  none = 0,
  put = 1,              ///< copy bytes from my window at src_offset to peer's window at dst_offset
  signal = 2,           ///< publish value on peer's flag `flag_index` (ordered after my earlier puts to peer)
  put_with_signal = 3,  ///< put, then signal, as one request
  get = 4,              ///< copy bytes from peer's window at src_offset to my window at dst_offset
  put_inline = 5,       ///< copy the `bytes` carried in the ring right after this request (inline_slots(bytes)
                        ///< records) to peer's window at dst_offset; then signal as put_with_signal if value != 0
};

/// Most bytes a put_inline carries (16 ring records after its own).
inline constexpr std::uint64_t max_inline_bytes = 1024;
/// Ring records the payload of an inline put of `bytes` takes after its request.
RECCL_HOST_DEVICE constexpr std::uint32_t inline_slots(std::uint64_t bytes) { return static_cast<std::uint32_t>((bytes + 63) / 64); }

/// One fixed-size work request (64 bytes: one cache line, one PCIe write burst). Offsets are in
/// window coordinates: every rank registers one window, and requests name bytes by offset in it.
struct alignas(64) work_request {
  request_kind kind = request_kind::none;
  std::int32_t peer = -1;         ///< destination rank (put/signal), source rank (get)
  std::uint32_t flag_index = 0;   ///< signal: which of the peer's flags
  std::uint32_t reserved = 0;
  std::uint64_t src_offset = 0;   ///< put: in my window; get: in peer's window
  std::uint64_t dst_offset = 0;   ///< put: in peer's window; get: in my window
  std::uint64_t bytes = 0;
  std::uint64_t value = 0;        ///< signal: the flag's new value (flags only grow)
  std::uint64_t pad[2] = {};
};
static_assert(sizeof(work_request) == 64);
static_assert(std::is_trivially_copyable_v<work_request>);

/// Builds a put request.
RECCL_HOST_DEVICE work_request make_put(int peer, std::uint64_t src_offset, std::uint64_t dst_offset, std::uint64_t bytes) {
  work_request r;
  r.kind = request_kind::put;
  r.peer = peer;
  r.src_offset = src_offset;
  r.dst_offset = dst_offset;
  r.bytes = bytes;
  return r;
}
/// Builds a signal request.
RECCL_HOST_DEVICE work_request make_signal(int peer, std::uint32_t flag_index, std::uint64_t value) {
  work_request r;
  r.kind = request_kind::signal;
  r.peer = peer;
  r.flag_index = flag_index;
  r.value = value;
  return r;
}
/// Builds a put-then-signal request.
RECCL_HOST_DEVICE work_request make_put_with_signal(int peer, std::uint64_t src_offset, std::uint64_t dst_offset,
                                                    std::uint64_t bytes, std::uint32_t flag_index, std::uint64_t value) {
  work_request r = make_put(peer, src_offset, dst_offset, bytes);
  r.kind = request_kind::put_with_signal;
  r.flag_index = flag_index;
  r.value = value;
  return r;
}
/// Builds an inline put (the payload follows in the ring; push it with push_inline); value 0: no signal.
RECCL_HOST_DEVICE work_request make_put_inline(int peer, std::uint64_t dst_offset, std::uint64_t bytes, std::uint32_t flag_index = 0,
                                               std::uint64_t value = 0) {
  work_request r = make_put(peer, 0, dst_offset, bytes);
  r.kind = request_kind::put_inline;
  r.flag_index = flag_index;
  r.value = value;
  return r;
}
/// Builds a get request.
RECCL_HOST_DEVICE work_request make_get(int peer, std::uint64_t src_offset, std::uint64_t dst_offset, std::uint64_t bytes) {
  work_request r = make_put(peer, src_offset, dst_offset, bytes);
  r.kind = request_kind::get;
  return r;
}

/// The control block of one queue. Each side's counters sit on their own cache line.
struct queue_control {
  alignas(64) std::uint64_t tail = 0;       ///< producer: requests published
  std::uint64_t stalls = 0;                 ///< producer: unsuccessful polls of a full ring
  alignas(64) std::uint64_t head = 0;       ///< consumer: requests copied out of the ring
  alignas(64) std::uint64_t completed = 0;  ///< consumer: requests the backend completed
  alignas(64) std::uint32_t error = 0;      ///< sticky reccl::status (0 = ok)
};
static_assert(std::is_trivially_copyable_v<queue_control>);

// -- the few atomic operations, host or device --------------------------------------------------

RECCL_HOST_DEVICE std::uint64_t load_acquire(std::uint64_t const* p) {
#if defined(__CUDA_ARCH__)
  std::uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
#else
  return std::atomic_ref<std::uint64_t const>(*p).load(std::memory_order_acquire);
#endif
}
RECCL_HOST_DEVICE void store_release(std::uint64_t* p, std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
#else
  std::atomic_ref<std::uint64_t>(*p).store(v, std::memory_order_release);
#endif
}
RECCL_HOST_DEVICE std::uint64_t load_relaxed(std::uint64_t const* p) {
#if defined(__CUDA_ARCH__)
  return *static_cast<std::uint64_t const volatile*>(p);
#else
  return std::atomic_ref<std::uint64_t const>(*p).load(std::memory_order_relaxed);
#endif
}
RECCL_HOST_DEVICE void store_relaxed(std::uint64_t* p, std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  *static_cast<std::uint64_t volatile*>(p) = v;
#else
  std::atomic_ref<std::uint64_t>(*p).store(v, std::memory_order_relaxed);
#endif
}
/// Raises a flag to at least v (flags only grow; concurrent writers keep the maximum).
RECCL_HOST_DEVICE void raise_release(std::uint64_t* p, std::uint64_t v) {
#if defined(__CUDA_ARCH__)
  __threadfence_system();
  atomicMax(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
#else
  std::atomic_ref<std::uint64_t> a(*p);
  std::uint64_t cur = a.load(std::memory_order_relaxed);
  while (cur < v && !a.compare_exchange_weak(cur, v, std::memory_order_release, std::memory_order_relaxed)) {
  }
#endif
}
/// Records the first error (later errors keep the first one).
RECCL_HOST_DEVICE void set_error(std::uint32_t* p, status s) {
#if defined(__CUDA_ARCH__)
  atomicCAS(p, 0u, static_cast<std::uint32_t>(s));
  __threadfence_system();
#else
  std::uint32_t expected = 0;
  std::atomic_ref<std::uint32_t>(*p).compare_exchange_strong(expected, static_cast<std::uint32_t>(s),
                                                             std::memory_order_acq_rel);
#endif
}
RECCL_HOST_DEVICE status get_error(std::uint32_t const* p) {
#if defined(__CUDA_ARCH__)
  return static_cast<status>(*static_cast<std::uint32_t const volatile*>(p));
#else
  return static_cast<status>(std::atomic_ref<std::uint32_t const>(*p).load(std::memory_order_acquire));
#endif
}

/// Between two unsuccessful polls: nothing on the device; on the host a yield, so a spinning
/// producer or waiter does not starve the thread it waits for on an oversubscribed CPU.
RECCL_HOST_DEVICE void relax() {
#if !defined(__CUDA_ARCH__)
  std::this_thread::yield();
#endif
}

/// Nanosecond clock the deadlines use: std::chrono::steady_clock on the host, %globaltimer on the
/// device. A producer and the proxy compare deadlines only against their own clock.
RECCL_HOST_DEVICE std::uint64_t clock_ns() {
#if defined(__CUDA_ARCH__)
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
#else
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
#endif
}

/// The producer's own copies of its queue's counters, kept in memory close to the producer
/// (device memory for a kernel, host memory for a thread). With one, a push reads nothing across
/// PCIe while the ring has room: it writes the record and the tail, and refreshes `head` (and looks
/// at the queue's error word) only when the cached values say the ring is full. Without one (a
/// view whose `cache` is null) every push reads tail, head and error from the queue itself.
/// The cache assumes its producer is the queue's only producer for as long as the cache is in use
/// (a second producer's records would be overwritten; nothing detects it).
/// Zero-initialise it with the queue; it loads the counters at its first push.
struct producer_cache {
  std::uint64_t tail = 0;   ///< == the queue's tail (only the producer writes tail)
  std::uint64_t head = 0;   ///< a head value seen earlier (<= the queue's head: conservative)
  std::uint32_t error = 0;  ///< the sticky error, once this producer has seen or set it
  std::uint32_t valid = 0;  ///< 0 until the first push has loaded tail and head
};
static_assert(std::is_trivially_copyable_v<producer_cache>);

/// The queue's waits (a full ring, a flush) on the one guarded wait: after each failed poll the
/// producer backs off (relax()) and gives up at the absolute deadline on clock_ns(), the clock of
/// the side it runs on. Its polls are atomics on mapped memory, so it looks at the clock every time.
struct queue_guard {
  std::uint64_t deadline_ns;
  static constexpr std::uint32_t period = 1;
  RECCL_HOST_DEVICE void begin() {}
  RECCL_HOST_DEVICE bool give_up() {
    relax();
    return clock_ns() >= deadline_ns;
  }
};

/// Outcome of a bounded push or flush: status::ok, status::timeout (deadline passed), or the
/// queue's sticky error; spins = unsuccessful polls (stalls).
struct push_result {
  status st = status::ok;
  std::uint64_t spins = 0;
};

/// A view of one queue: what producer and consumer each hold (trivially copyable, passed to
/// kernels by value). `capacity` is a power of two. The single producer and the single consumer
/// may be on different devices; each role's calls must come from one thread at a time.
struct work_queue_view {
  work_request* ring = nullptr;
  queue_control* ctl = nullptr;
  std::uint32_t capacity = 0;
  producer_cache* cache = nullptr;  ///< the producer's counters (optional; see producer_cache)

  // -- producer ---------------------------------------------------------------------------------

  /// One attempt: publishes r and returns true, or returns false if the ring is full.
  RECCL_HOST_DEVICE bool try_push(work_request const& r) const { return try_push_records(r, nullptr); }
  /// One attempt at an inline put: publishes r (kind put_inline, bytes <= max_inline_bytes) and the
  /// `r.bytes` at `payload` in the records after it, all at once (one tail update); false if the
  /// ring lacks room for them.
  RECCL_HOST_DEVICE bool try_push_inline(work_request const& r, void const* payload) const { return try_push_records(r, payload); }

  /// Publishes r, polling a full ring until the absolute deadline (clock_ns()). Each unsuccessful
  /// poll is a stall, added to ctl->stalls. Fails fast with the queue's sticky error if one is set
  /// (with a producer cache: once the producer has seen it, which is at the latest when the ring
  /// fills or a wait or flush returns it), and sets status::timeout as the sticky error if the
  /// deadline passes (the request is dropped; every later wait on what it would have delivered
  /// then times out too).
  RECCL_HOST_DEVICE push_result push(work_request const& r, std::uint64_t deadline_ns) const { return push_records(r, nullptr, deadline_ns); }
  /// push for an inline put and its payload (see try_push_inline). An inline put larger than
  /// max_inline_bytes, or than the ring can hold, fails the queue with status::invalid_argument.
  RECCL_HOST_DEVICE push_result push_inline(work_request const& r, void const* payload, std::uint64_t deadline_ns) const {
    if (!inline_fits(r)) {
      fail(status::invalid_argument);
      return {status::invalid_argument, 0};
    }
    return push_records(r, payload, deadline_ns);
  }
  /// push and push_inline: r, and the payload after it if `payload` is not null.
  RECCL_HOST_DEVICE push_result push_records(work_request const& r, void const* payload, std::uint64_t deadline_ns) const {
    std::uint64_t const n = payload != nullptr ? 1 + inline_slots(r.bytes) : 1;
    std::uint64_t t = 0;
    push_result const res = reserve(n, deadline_ns, t);
    if (res.st != status::ok) return res;
    ring[t & (capacity - 1)] = r;
    if (payload != nullptr) copy_payload_in(t + 1, static_cast<unsigned char const*>(payload), r.bytes);
    publish(t, n);
    return res;
  }

#if defined(__CUDACC__)
  /// push_inline by a whole warp: every lane of the calling warp calls it with the same arguments
  /// (converged), and the lanes write the payload's 16-byte pieces into the ring side by side, 32
  /// at a time instead of one thread writing them all. Lane 0 waits for room and publishes. The
  /// result is the same on every lane.
  __device__ push_result push_inline_warp(work_request const& r, void const* payload, std::uint64_t deadline_ns) const {
    unsigned const lane = threadIdx.x & 31u;
    std::uint64_t const n = 1 + inline_slots(r.bytes);
    push_result res;
    std::uint64_t t = 0;
    if (lane == 0) {
      if (!inline_fits(r)) {
        fail(status::invalid_argument);
        res.st = status::invalid_argument;
      } else {
        res = reserve(n, deadline_ns, t);
      }
    }
    res.st = static_cast<status>(__shfl_sync(0xffffffffu, static_cast<int>(res.st), 0));
    res.spins = __shfl_sync(0xffffffffu, res.spins, 0);
    t = __shfl_sync(0xffffffffu, t, 0);
    if (res.st != status::ok) return res;
    auto const* src = static_cast<unsigned char const*>(payload);
    for (std::uint64_t c = lane; c < payload_pieces(r.bytes); c += 32) write_piece(t + 1, c, src, r.bytes);
    __threadfence_system();  // each lane's pieces are visible system-wide before lane 0 publishes
    __syncwarp();
    if (lane == 0) {
      ring[t & (capacity - 1)] = r;
      publish(t, n);
    }
    __syncwarp();
    return res;
  }
#endif

  /// Waits until the ring has room for `n` records (the first in `t`), the deadline passes (sets
  /// status::timeout as the sticky error) or the queue has an error. Each unsuccessful poll is a
  /// stall, added to ctl->stalls. Nothing is written: publish(t, n) follows.
  RECCL_HOST_DEVICE push_result reserve(std::uint64_t n, std::uint64_t deadline_ns, std::uint64_t& t) const {
    push_result res;
    auto room = [&] {
      if (status const e = cached_or_queue_error(); e != status::ok) {
        res.st = e;
        return true;
      }
      if (try_reserve(n, t)) return true;
      if (cache != nullptr) cache->error = static_cast<std::uint32_t>(get_error(&ctl->error));  // full: look at the queue's error
      return false;
    };
    queue_guard guard{deadline_ns};
    if (!device::spin_until(room, guard, res.spins)) {
      fail(status::timeout);
      res.st = status::timeout;
    }
    if (res.spins != 0) store_relaxed(&ctl->stalls, load_relaxed(&ctl->stalls) + res.spins);
    return res;
  }

  /// Requests published so far: the sequence number the next push gets.
  RECCL_HOST_DEVICE std::uint64_t published() const {
    if (cache != nullptr && cache->valid) return cache->tail;
    return load_relaxed(&ctl->tail);
  }

  /// Waits until the proxy completed every request with sequence number < n (their source bytes
  /// may be reused, their destination bytes and signals have arrived), the deadline passes
  /// (status::timeout, not sticky) or the queue has an error. spins = unsuccessful polls.
  RECCL_HOST_DEVICE push_result wait_completed(std::uint64_t n, std::uint64_t deadline_ns) const {
    push_result res;
    auto done = [&] {
      if (load_acquire(&ctl->completed) >= n) return true;
      if (status const e = get_error(&ctl->error); e != status::ok) {
        res.st = e;
        return true;
      }
      return false;
    };
    queue_guard guard{deadline_ns};
    if (!device::spin_until(done, guard, res.spins)) res.st = status::timeout;
    return res;
  }
  /// wait_completed(published(), deadline): everything pushed so far.
  RECCL_HOST_DEVICE push_result flush(std::uint64_t deadline_ns) const { return wait_completed(published(), deadline_ns); }

  // -- consumer ---------------------------------------------------------------------------------

  /// Copies the oldest request into `out` and frees its slot; false if the ring is empty. An
  /// inline put's payload goes to `payload` (max_inline_bytes of room; null: a queue that carries
  /// no inline puts) and its records are freed with it. An inline put with no room given for its
  /// payload comes out with kind `none` (a malformed request; its records are freed too), and so
  /// does one whose size no producer writes (only its own record is freed).
  RECCL_HOST_DEVICE bool try_pop(work_request& out, std::byte* payload = nullptr) const {
    std::uint64_t const h = load_relaxed(&ctl->head);  // only this consumer writes head
    std::uint64_t const t = load_acquire(&ctl->tail);
    if (t == h) return false;
    out = ring[h & (capacity - 1)];
    std::uint64_t used = 1;
    if (out.kind == request_kind::put_inline) {
      std::uint64_t const k = inline_slots(out.bytes);
      if (out.bytes > max_inline_bytes || t - h < 1 + k) {
        out.kind = request_kind::none;  // a size no producer writes: only this record is freed
      } else {
        if (payload != nullptr) copy_payload_out(h + 1, payload, out.bytes);
        else out.kind = request_kind::none;
        used += k;  // the payload's records go with it either way
      }
    }
    store_release(&ctl->head, h + used);
    return true;
  }
  /// Consumer: requests < n are complete.
  RECCL_HOST_DEVICE void mark_completed(std::uint64_t n) const { store_release(&ctl->completed, n); }

  // -- either side ------------------------------------------------------------------------------

  /// The queue's sticky error, read from the queue (a PCIe read for a kernel producer).
  RECCL_HOST_DEVICE status error() const { return get_error(&ctl->error); }
  RECCL_HOST_DEVICE void fail(status s) const {
    set_error(&ctl->error, s);
    if (cache != nullptr && cache->error == 0) cache->error = static_cast<std::uint32_t>(get_error(&ctl->error));
  }
  /// Stalls counted so far (read by the producer; an estimate if read elsewhere while it runs).
  RECCL_HOST_DEVICE std::uint64_t stalls() const { return load_relaxed(&ctl->stalls); }

 private:
  RECCL_HOST_DEVICE status cached_or_queue_error() const {
    return cache != nullptr ? static_cast<status>(cache->error) : get_error(&ctl->error);
  }
  // One attempt to publish r (and, for an inline put, its payload in the records after it).
  RECCL_HOST_DEVICE bool try_push_records(work_request const& r, void const* payload) const {
    std::uint64_t const n = payload != nullptr ? 1 + inline_slots(r.bytes) : 1;
    std::uint64_t t = 0;
    if (!try_reserve(n, t)) return false;
    ring[t & (capacity - 1)] = r;
    if (payload != nullptr) copy_payload_in(t + 1, static_cast<unsigned char const*>(payload), r.bytes);
    publish(t, n);
    return true;
  }
  // Whether n records fit; if so the first one's sequence number in t. With a producer cache, the
  // queue is read only when the cached head says there is no room; then head is reloaded
  // (acquire: the slots' old records were copied out before the consumer published that head).
  RECCL_HOST_DEVICE bool try_reserve(std::uint64_t n, std::uint64_t& t) const {
    if (cache != nullptr) {
      producer_cache& c = *cache;
      if (!c.valid) {
        c.tail = load_relaxed(&ctl->tail);
        c.head = load_acquire(&ctl->head);
        c.valid = 1;
      }
      t = c.tail;
      if (t + n - c.head > capacity) {
        c.head = load_acquire(&ctl->head);
        if (t + n - c.head > capacity) return false;
      }
      return true;
    }
    t = load_relaxed(&ctl->tail);  // only this producer writes tail
    return t + n - load_acquire(&ctl->head) <= capacity;
  }
  // Publishes the n records written from t on: release-stores the tail (the consumer that
  // acquires it sees them).
  RECCL_HOST_DEVICE void publish(std::uint64_t t, std::uint64_t n) const {
    store_release(&ctl->tail, t + n);
    if (cache != nullptr) cache->tail = t + n;
  }
  // Whether r is an inline put this queue can carry (size within the limit and the ring).
  RECCL_HOST_DEVICE bool inline_fits(work_request const& r) const {
    return r.kind == request_kind::put_inline && r.bytes <= max_inline_bytes && 1 + inline_slots(r.bytes) <= capacity;
  }
  // 16-byte pieces of a payload of `bytes`.
  RECCL_HOST_DEVICE static constexpr std::uint64_t payload_pieces(std::uint64_t bytes) { return (bytes + 15) / 16; }
#if defined(__CUDACC__)
  // Piece c of the payload of `bytes` at src into the records from sequence number `seq` on (they
  // may wrap), as one 16-byte store (one PCIe write for mapped memory); the source is read byte by
  // byte when it is not 16-byte aligned, and the last piece is zero-filled.
  __device__ void write_piece(std::uint64_t seq, std::uint64_t c, unsigned char const* src, std::uint64_t bytes) const {
    auto* rec = reinterpret_cast<unsigned char*>(&ring[(seq + c / 4) & (capacity - 1)]) + (c % 4) * 16;
    std::uint64_t const at = c * 16, len = bytes - at < 16 ? bytes - at : 16;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (len == 16 && (reinterpret_cast<std::uintptr_t>(src + at) & 15u) == 0) {
      v = *reinterpret_cast<uint4 const*>(src + at);
    } else {
      auto* b = reinterpret_cast<unsigned char*>(&v);
      for (std::uint64_t i = 0; i < len; ++i) b[i] = src[at + i];
    }
    *reinterpret_cast<uint4*>(rec) = v;
  }
#endif
  // The payload of `bytes` into the records from sequence number `seq` on (they may wrap): on the
  // device piece by piece (write_piece), on the host record by record.
  RECCL_HOST_DEVICE void copy_payload_in(std::uint64_t seq, unsigned char const* src, std::uint64_t bytes) const {
#if defined(__CUDA_ARCH__)
    for (std::uint64_t c = 0; c < payload_pieces(bytes); ++c) write_piece(seq, c, src, bytes);
#else
    for (std::uint64_t done = 0; done < bytes; done += 64, ++seq) {
      auto* rec = reinterpret_cast<unsigned char*>(&ring[seq & (capacity - 1)]);
      std::uint64_t const n = bytes - done < 64 ? bytes - done : 64;
      std::memcpy(rec, src + done, n);
      if (n < 64) std::memset(rec + n, 0, 64 - n);
    }
#endif
  }
  RECCL_HOST_DEVICE void copy_payload_out(std::uint64_t seq, std::byte* dst, std::uint64_t bytes) const {
    for (std::uint64_t done = 0; done < bytes; done += 64, ++seq) {
      std::uint64_t const n = bytes - done < 64 ? bytes - done : 64;
      auto const* rec = reinterpret_cast<std::byte const*>(&ring[seq & (capacity - 1)]);
#if defined(__CUDA_ARCH__)
      for (std::uint64_t i = 0; i < n; ++i) dst[done + i] = rec[i];
#else
      std::memcpy(dst + done, rec, n);
#endif
    }
  }
};
static_assert(std::is_trivially_copyable_v<work_queue_view>);

/// Owns one queue in plain host memory (tests, CPU producers). The host runtime allocates the same
/// layout with cudaHostAlloc(cudaHostAllocMapped) when a kernel produces.
class work_queue {
 public:
  /// capacity: a power of two in [1, 2^20]; anything else is rejected (valid() is false).
  explicit work_queue(std::uint32_t capacity) {
    if (capacity == 0 || (capacity & (capacity - 1)) != 0 || capacity > (1u << 20)) return;
    ring_ = std::make_unique<work_request[]>(capacity);
    ctl_ = std::make_unique<queue_control>();
    capacity_ = capacity;
  }
  bool valid() const { return capacity_ != 0; }
  /// The queue's view without a producer cache (every push reads the counters).
  work_queue_view view() const { return {ring_.get(), ctl_.get(), capacity_}; }
  /// The view with this queue's producer cache: for its one producer.
  work_queue_view producer_view() const { return {ring_.get(), ctl_.get(), capacity_, cache_.get()}; }

 private:
  std::unique_ptr<work_request[]> ring_;
  std::unique_ptr<queue_control> ctl_;
  std::unique_ptr<producer_cache> cache_ = std::make_unique<producer_cache>();
  std::uint32_t capacity_ = 0;
};

}  // namespace reccl::proxy
