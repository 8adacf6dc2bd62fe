// reccl/proxy/transport.hpp -- the proxy Transport: a handle that turns put/get/signal into work
// requests on a per-VT queue, and waits on flag words the proxy (or a peer's proxy) raises.
//
//   rank r's window (registered once; the same layout on every rank)
//   ┌─────────────────────────────────┬─────────────────────────────────┬──────────────────────┐
//   │ receive areas [vt][src]         │ send areas [vt][dst]            │ symmetric region     │
//   │ (peers put here)                │ (peers get from here)           │ (collectives' I/O)   │
//   └─────────────────────────────────┴─────────────────────────────────┴──────────────────────┘
//   rank r's flags [vt][src][flag]  (signals land here; wait() polls them)
//
//   handle.put(vt, peer, off, src, n)  ─▶ queues[vt].push(put{src - window, peer,
//                                                            recv_offset(vt, r) + off, n})
//   handle.signal(vt, peer, f, v)      ─▶ queues[vt].push(signal{peer, flag_index(vt, r, f), v})
//   handle.wait(vt, peer, f, v, dl)    ─▶ poll flags[flag_index(vt, peer, f)] >= v until dl
//   handle.put_symmetric(vt, peer, d, s, n) ─▶ queues[vt].push(put{s - window, peer, d - window, n})
//                                       (d in my symmetric region: the same offset on peer)
//   handle.put_inline(vt, peer, off, src, n, f, v) ─▶ queues[vt].push_inline(put_inline{peer,
//                                       recv_offset(vt, r) + off, n, f, v}, the n bytes at src)
//
// Differences from a load/store transport, all documented on the members:
//  - put is asynchronous: `src` must lie in this rank's window (stage data in a send area), and its
//    bytes may be reused only after flush(vt) or after the peer's answer (e.g. a credit) arrived;
//  - a put or signal that cannot be queued before push_timeout_ns, or that is malformed, marks the
//    VT's queue failed (sticky): the proxy discards its later requests and every wait of this rank
//    on that VT returns the error at once; the peers' waits end at their deadlines. A fault
//    surfaces as an error or a timeout, never as a hang;
//  - stalls: a full queue is a stall (queue_control::stalls, per VT), as is every unsuccessful
//    poll of a wait (wait_result::spins).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "../config.hpp"
#include "../transport.hpp"
#include "../types.hpp"
#include "work_queue.hpp"

namespace reccl::proxy {

/// Geometry of a rank's window and flags; identical on every rank.
struct window_layout {
  std::int32_t nranks = 1;
  std::int32_t n_vts = 1;
  std::uint64_t area_bytes = 0;  ///< bytes of one receive or send area
  std::uint64_t symmetric_bytes = 0;  ///< bytes of the symmetric region (after the areas)

  /// Offset of my receive area for (vt, src): where src's puts land.
  RECCL_HOST_DEVICE std::uint64_t recv_offset(int vt, int src) const {
    return (static_cast<std::uint64_t>(vt) * static_cast<std::uint64_t>(nranks) + static_cast<std::uint64_t>(src)) * area_bytes;
  }
  /// Offset of my send area for (vt, dst): what dst's gets read.
  RECCL_HOST_DEVICE std::uint64_t send_offset(int vt, int dst) const {
    return (static_cast<std::uint64_t>(n_vts + vt) * static_cast<std::uint64_t>(nranks) + static_cast<std::uint64_t>(dst)) * area_bytes;
  }
  /// Offset of the symmetric region: buffers every rank holds at the same offset.
  RECCL_HOST_DEVICE std::uint64_t symmetric_offset() const {
    return 2 * static_cast<std::uint64_t>(n_vts) * static_cast<std::uint64_t>(nranks) * area_bytes;
  }
  RECCL_HOST_DEVICE std::uint64_t window_bytes() const { return symmetric_offset() + symmetric_bytes; }
  /// Index of my flag f from (vt, src).
  RECCL_HOST_DEVICE std::uint32_t flag_index(int vt, int src, flag f) const {
    return (static_cast<std::uint32_t>(vt) * static_cast<std::uint32_t>(nranks) + static_cast<std::uint32_t>(src)) * 2u +
           static_cast<std::uint32_t>(f);
  }
  RECCL_HOST_DEVICE std::uint32_t n_flags() const { return static_cast<std::uint32_t>(n_vts) * static_cast<std::uint32_t>(nranks) * 2u; }
  /// nranks in [1, max_ranks], n_vts in [1, max_vts].
  RECCL_HOST_DEVICE bool valid() const { return nranks >= 1 && nranks <= max_ranks && n_vts >= 1 && n_vts <= max_vts; }
};

}  // namespace reccl::proxy

namespace reccl::transport {

/// Transport whose data moves through a host proxy thread (host memcpy, copy engine, IB verbs).
struct proxy {
  static constexpr int max_vts = reccl::max_vts;

  /// What a rank's producer threads (or a kernel's CTAs) hold. Trivially copyable; the pointed-to
  /// memory (queues array, window, flags) must be addressable by the producer and outlive it.
  /// One producer thread per VT at a time (each queue is single-producer).
  struct handle {
    reccl::proxy::work_queue_view const* queues = nullptr;  ///< [n_vts]
    std::byte* window = nullptr;                            ///< my window (layout.window_bytes())
    std::uint64_t const* flags = nullptr;                   ///< my flags (layout.n_flags())
    reccl::proxy::window_layout layout{};
    std::int32_t rank = 0;
    std::uint64_t push_timeout_ns = 1'000'000'000;  ///< longest wait for room in a full queue

    /// My receive area for (vt, peer): where peer's puts land.
    RECCL_HOST_DEVICE std::byte* recv_area(int vt, int peer) const { return window + layout.recv_offset(vt, peer); }
    /// My send area for (vt, peer): what peer's gets read, and where puts to peer are staged.
    RECCL_HOST_DEVICE std::byte* send_area(int vt, int peer) const { return window + layout.send_offset(vt, peer); }

    /// Queues a copy of `bytes` at `src` (inside my window) into peer's receive area for (vt, me)
    /// at `offset`. Asynchronous: see flush(). A src outside my window or a range past the area
    /// fails the VT's queue with status::invalid_argument.
    RECCL_HOST_DEVICE void put(int vt, int peer, std::size_t offset, void const* src, std::size_t bytes) const {
      std::uint64_t src_off = 0;
      if (!check(vt, peer, offset, src, bytes, src_off)) return;
      queues[vt].push(reccl::proxy::make_put(peer, src_off, layout.recv_offset(vt, rank) + offset, bytes),
                      reccl::proxy::clock_ns() + push_timeout_ns);
    }

    /// put then signal(vt, peer, f, value) as one request (one queue slot, one RDMA write with
    /// immediate on the verbs backend).
    RECCL_HOST_DEVICE void put_with_signal(int vt, int peer, std::size_t offset, void const* src, std::size_t bytes, flag f,
                                           std::uint64_t value) const {
      std::uint64_t src_off = 0;
      if (!check(vt, peer, offset, src, bytes, src_off)) return;
      queues[vt].push(reccl::proxy::make_put_with_signal(peer, src_off, layout.recv_offset(vt, rank) + offset, bytes,
                                                         layout.flag_index(vt, rank, f), value),
                      reccl::proxy::clock_ns() + push_timeout_ns);
    }

    /// An inline put: copies `bytes` (at most proxy::max_inline_bytes) from `src` into the VT's
    /// queue itself, to land in peer's receive area for (vt, me) at `offset`; then, if value != 0,
    /// signal(vt, peer, f, value) as part of the same request. `src` may be any memory this
    /// producer can read (not only my window), and it may be reused as soon as the call returns.
    /// It saves the proxy a copy of window bytes (~6 us of driver time per copy-engine put, against
    /// ~2 us for bytes read from the queue), so it suits small messages. Too many bytes, or a
    /// range past the area, fail the VT's queue with status::invalid_argument; so does a backend
    /// without inline puts (the verbs backend) when the proxy executes it.
    RECCL_HOST_DEVICE void put_inline(int vt, int peer, std::size_t offset, void const* src, std::size_t bytes, flag f = flag::ready,
                                      std::uint64_t value = 0) const {
      if (vt < 0 || vt >= layout.n_vts) return;
      if (!inline_ok(peer, offset, src, bytes)) {
        queues[vt].fail(status::invalid_argument);
        return;
      }
      queues[vt].push_inline(inline_request(vt, peer, offset, bytes, f, value), src, reccl::proxy::clock_ns() + push_timeout_ns);
    }

#if defined(__CUDACC__)
    /// put_inline by a whole warp: every lane calls it with the same arguments (converged), and the
    /// lanes write the payload into the queue 32 pieces at a time (work_queue_view::push_inline_warp).
    __device__ void put_inline_warp(int vt, int peer, std::size_t offset, void const* src, std::size_t bytes, flag f = flag::ready,
                                    std::uint64_t value = 0) const {
      if (vt < 0 || vt >= layout.n_vts) return;
      if (!inline_ok(peer, offset, src, bytes)) {
        if ((threadIdx.x & 31u) == 0) queues[vt].fail(status::invalid_argument);
        __syncwarp();
        return;
      }
      queues[vt].push_inline_warp(inline_request(vt, peer, offset, bytes, f, value), src, reccl::proxy::clock_ns() + push_timeout_ns);
    }
#endif

    /// Queues a copy of `bytes` at `src` (inside my window) to peer's window at the offset that
    /// `dst` has in mine (`dst` inside my symmetric region: every rank holds its buffers there at
    /// the same offsets); peer == rank is a local copy. Asynchronous like put(). A range outside
    /// the window or the symmetric region fails the VT's queue with status::invalid_argument.
    RECCL_HOST_DEVICE void put_symmetric(int vt, int peer, void const* dst, void const* src, std::size_t bytes) const {
      std::uint64_t d = 0, s = 0;
      if (!check_symmetric(vt, peer, dst, src, bytes, d, s)) return;
      queues[vt].push(reccl::proxy::make_put(peer, s, d, bytes), reccl::proxy::clock_ns() + push_timeout_ns);
    }
    /// put_symmetric then signal(vt, peer, f, value) as one request.
    RECCL_HOST_DEVICE void put_symmetric_with_signal(int vt, int peer, void const* dst, void const* src, std::size_t bytes,
                                                     flag f, std::uint64_t value) const {
      std::uint64_t d = 0, s = 0;
      if (!check_symmetric(vt, peer, dst, src, bytes, d, s)) return;
      queues[vt].push(reccl::proxy::make_put_with_signal(peer, s, d, bytes, layout.flag_index(vt, rank, f), value),
                      reccl::proxy::clock_ns() + push_timeout_ns);
    }

    /// put_inline to peer's window at the offset that `dst` has in mine (`dst` inside my symmetric
    /// region, as put_symmetric; peer == rank lands in my own window), then, if value != 0,
    /// signal(vt, peer, f, value) as part of the same request. `src` may be any memory this
    /// producer can read and may be reused as soon as the call returns. Too many bytes or a range
    /// outside the symmetric region fail the VT's queue with status::invalid_argument.
    RECCL_HOST_DEVICE void put_symmetric_inline(int vt, int peer, void const* dst, void const* src, std::size_t bytes,
                                                flag f = flag::ready, std::uint64_t value = 0) const {
      if (vt < 0 || vt >= layout.n_vts) return;
      std::uint64_t d = 0;
      if (peer < 0 || peer >= layout.nranks || bytes > reccl::proxy::max_inline_bytes || (src == nullptr && bytes != 0) ||
          !in_window(dst, bytes, layout.symmetric_offset(), d)) {
        queues[vt].fail(status::invalid_argument);
        return;
      }
      queues[vt].push_inline(reccl::proxy::make_put_inline(peer, d, bytes, layout.flag_index(vt, rank, f), value), src,
                             reccl::proxy::clock_ns() + push_timeout_ns);
    }

    /// Copies `bytes` from peer's send area for (vt, me) at `offset` to `dst` (inside my window).
    /// Synchronous: returns once the proxy completed it, or after push_timeout_ns (the queue is
    /// then failed with status::timeout and dst is unspecified).
    RECCL_HOST_DEVICE void get(int vt, int peer, std::size_t offset, void* dst, std::size_t bytes) const {
      std::uint64_t dst_off = 0;
      if (!check(vt, peer, offset, dst, bytes, dst_off)) return;
      reccl::proxy::work_queue_view const& q = queues[vt];
      std::uint64_t const deadline = reccl::proxy::clock_ns() + push_timeout_ns;
      if (q.push(reccl::proxy::make_get(peer, layout.send_offset(vt, rank) + offset, dst_off, bytes), deadline).st != status::ok)
        return;
      std::uint64_t const seq = q.published();
      if (q.wait_completed(seq, deadline).st == status::timeout) q.fail(status::timeout);
    }

    /// Queues: publish `value` on peer's flag f for (vt, me), after the puts queued before it.
    RECCL_HOST_DEVICE void signal(int vt, int peer, flag f, std::uint64_t value) const {
      if (vt < 0 || vt >= layout.n_vts) return;
      if (peer < 0 || peer >= layout.nranks) {
        queues[vt].fail(status::invalid_argument);
        return;
      }
      queues[vt].push(reccl::proxy::make_signal(peer, layout.flag_index(vt, rank, f), value),
                      reccl::proxy::clock_ns() + push_timeout_ns);
    }

    /// Polls my flag f from (vt, peer) until it is >= value, the absolute deadline
    /// (proxy::clock_ns()) passes, or the VT's queue holds an error (seen within 32 polls).
    RECCL_HOST_DEVICE wait_result wait(int vt, int peer, flag f, std::uint64_t value, std::uint64_t deadline_ns) const {
      wait_result res;
      if (vt < 0 || vt >= layout.n_vts || peer < 0 || peer >= layout.nranks) {
        res.st = status::invalid_argument;
        return res;
      }
      std::uint64_t const* w = flags + layout.flag_index(vt, peer, f);
      flag_guard guard{queues[vt], deadline_ns};
      if (!device::spin_until([&] { return reccl::proxy::load_acquire(w) >= value; }, guard, res.spins)) res.st = guard.st;
      return res;
    }

    /// Waits until every request queued on VT vt so far has completed (its source bytes may be
    /// reused). status::timeout if the deadline passes first, or the queue's error.
    RECCL_HOST_DEVICE reccl::proxy::push_result flush(int vt, std::uint64_t deadline_ns) const {
      return queues[vt].flush(deadline_ns);
    }
    /// Stalls of VT vt's producer: polls of a full queue.
    RECCL_HOST_DEVICE std::uint64_t queue_stalls(int vt) const { return queues[vt].stalls(); }
    /// The VT's sticky error (status::ok if none).
    RECCL_HOST_DEVICE status error(int vt) const { return queues[vt].error(); }

   private:
    // A wait for a flag on the one guarded wait: after each failed poll back off, and give up at
    // the deadline (status::timeout) or when the VT's queue holds an error. The queue's error word
    // is across PCIe for a kernel: it is read every 32 failed polls, starting with the first.
    struct flag_guard {
      reccl::proxy::work_queue_view const& queue;
      std::uint64_t deadline_ns;
      status st = status::ok;
      std::uint32_t polls = 0;
      static constexpr std::uint32_t period = 1;
      RECCL_HOST_DEVICE void begin() {}
      RECCL_HOST_DEVICE bool give_up() {
        if (polls++ % 32 == 0) {
          if (status const e = queue.error(); e != status::ok) {
            st = e;
            return true;
          }
        }
        reccl::proxy::relax();
        if (reccl::proxy::clock_ns() >= deadline_ns) {
          st = status::timeout;
          return true;
        }
        return false;
      }
    };

    // Whether an inline put's peer, range in the receive area, size and source are valid.
    RECCL_HOST_DEVICE bool inline_ok(int peer, std::size_t offset, void const* src, std::size_t bytes) const {
      return peer >= 0 && peer < layout.nranks && offset <= layout.area_bytes && bytes <= layout.area_bytes - offset &&
             bytes <= reccl::proxy::max_inline_bytes && (src != nullptr || bytes == 0);
    }
    // The request of an inline put into peer's receive area for (vt, me) at `offset`.
    RECCL_HOST_DEVICE reccl::proxy::work_request inline_request(int vt, int peer, std::size_t offset, std::size_t bytes, flag f,
                                                                std::uint64_t value) const {
      return reccl::proxy::make_put_inline(peer, layout.recv_offset(vt, rank) + offset, bytes, layout.flag_index(vt, rank, f), value);
    }
    // Validates (vt, peer, offset, bytes) and that [p, p + bytes) lies in my window; on failure
    // fails the VT's queue (if vt names one) and returns false.
    RECCL_HOST_DEVICE bool check(int vt, int peer, std::size_t offset, void const* p, std::size_t bytes,
                                 std::uint64_t& window_off) const {
      if (vt < 0 || vt >= layout.n_vts) return false;  // no queue to report on; the caller's waits time out
      bool const ok = peer >= 0 && peer < layout.nranks && offset <= layout.area_bytes && bytes <= layout.area_bytes - offset &&
                      in_window(p, bytes, 0, window_off);
      if (!ok) queues[vt].fail(status::invalid_argument);
      return ok;
    }
    // Validates (vt, peer), that [src, src + bytes) lies in my window and [dst, dst + bytes) in my
    // symmetric region; on failure fails the VT's queue and returns false.
    RECCL_HOST_DEVICE bool check_symmetric(int vt, int peer, void const* dst, void const* src, std::size_t bytes,
                                           std::uint64_t& dst_off, std::uint64_t& src_off) const {
      if (vt < 0 || vt >= layout.n_vts) return false;
      bool const ok = peer >= 0 && peer < layout.nranks && in_window(dst, bytes, layout.symmetric_offset(), dst_off) &&
                      in_window(src, bytes, 0, src_off);
      if (!ok) queues[vt].fail(status::invalid_argument);
      return ok;
    }
    // Whether [p, p + bytes) lies in my window at offset `lo` or above; if so, its offset in `off`.
    // Addresses compared as integers: p may point anywhere, not only into the window.
    RECCL_HOST_DEVICE bool in_window(void const* p, std::size_t bytes, std::uint64_t lo, std::uint64_t& off) const {
      auto const a = reinterpret_cast<std::uintptr_t>(p), w = reinterpret_cast<std::uintptr_t>(window);
      std::uint64_t const wb = layout.window_bytes();
      if (a < w || a - w < lo || a - w > wb || bytes > wb - (a - w)) return false;
      off = static_cast<std::uint64_t>(a - w);
      return true;
    }
  };
};

static_assert(QueueTransport<proxy>);

}  // namespace reccl::transport
