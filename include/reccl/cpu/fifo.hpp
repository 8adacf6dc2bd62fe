// reccl/cpu/fifo.hpp -- one link's shared-memory FIFO ring with credits, and the slot protocol.
//
//   link (vt, src -> dst), `slots` slots of `slot_bytes` in dst's receive area:
//
//      sender (src)                                   receiver (dst)
//      tx_seq = k  ── wait credit >= k-slots+1 ──┐
//                  ── put slot k%slots ─────────▶│ recv_area[k % slots]
//                  ── signal ready = k+1 ──[wire: visible after bytes/rate]──▶ wait ready >= k+1
//                  ◀── signal credit = k+1 ──────┘ (after the receiver consumed slot k)
//
// The ready flag travels through a small single-producer/single-consumer queue of
// (value, visible_at) entries: that is where a rate-capped link's wire time lives. The receiver
// sees a value only once its time has come, so a slow link fills the FIFO and the sender waits
// for credit: it stalls. Credits are not delayed (acknowledgements are small).
//
// Sequence numbers persist across collectives; after a VT failed, each rank resets the link
// state it owns (see fabric::reset_vt) at a point where no thread of that VT runs anywhere.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "../transport.hpp"

namespace reccl::cpu {

/// Entries of a link's ready queue: the most ready values in flight on one link. The FIFO protocol
/// keeps at most `slots` in flight, so a communicator accepts slots <= queue_depth.
inline constexpr int queue_depth = 64;

/// The shared state of one directed link of one VT. Fields are grouped by owner; each owner's
/// group sits on its own cache lines.
struct fifo_link {
  std::byte* recv_area = nullptr;  ///< in dst's memory: slots * slot_bytes
  std::byte* send_area = nullptr;  ///< in src's memory: what dst may get()

  // -- written by the receiver (dst)
  alignas(64) std::uint64_t ready_seen = 0;  ///< latest ready value that became visible
  std::uint64_t rx_seq = 0;                  ///< slots consumed (FIFO protocol)
  alignas(64) std::atomic<std::uint64_t> q_head{0};

  // -- written by the sender (src)
  alignas(64) std::atomic<std::uint64_t> q_tail{0};
  struct entry {
    std::uint64_t value = 0;
    std::uint64_t visible_ns = 0;
  } q[queue_depth];
  std::uint64_t tx_seq = 0;             ///< slots published (FIFO protocol)
  std::uint64_t wire_free_ns = 0;       ///< when the (capped) wire finishes what was put so far
  std::uint64_t last_visible_ns = 0;    ///< visibility time of the latest put
  std::uint64_t slot_visible_ns[queue_depth] = {};  ///< per slot (seq % slots): when the receiver can see it
  std::uint64_t bytes_epoch = ~std::uint64_t{0};  ///< epoch that epoch_bytes counts
  std::uint64_t epoch_bytes = 0;        ///< bytes put in that epoch
  bool dropping = false;                ///< the link died in this epoch: signals are dropped

  // -- written by the receiver, read by the sender
  alignas(64) std::atomic<std::uint64_t> credit{0};

  // -- virtual time (fabric_config::virtual_time): each slot's visibility and each credit's
  //    release on the collective's virtual clock, published with the ready / credit values
  std::uint64_t slot_vtime[queue_depth] = {};     ///< written by the sender before `ready`
  std::uint64_t credit_vtime[queue_depth] = {};   ///< written by the receiver before `credit`
  std::uint64_t credit_vepoch[queue_depth] = {};  ///< epoch + 1 of that credit (older: time 0)
  std::uint64_t v_wire_free = 0;                  ///< sender: virtual time the wire is free
  std::uint64_t v_epoch = ~std::uint64_t{0};      ///< sender: epoch v_wire_free belongs to

  /// Receiver side: moves queue entries whose time has come into ready_seen.
  void drain(std::uint64_t now) {
    std::uint64_t head = q_head.load(std::memory_order_relaxed);
    std::uint64_t const tail = q_tail.load(std::memory_order_acquire);
    while (head < tail) {
      entry const& e = q[head % queue_depth];
      if (e.visible_ns > now) break;
      ready_seen = e.value;
      ++head;
    }
    q_head.store(head, std::memory_order_release);
  }

  /// Sender side: queues `value`, visible at `visible_ns`. False if the queue is full.
  bool push(std::uint64_t value, std::uint64_t visible_ns) {
    std::uint64_t const tail = q_tail.load(std::memory_order_relaxed);
    if (tail - q_head.load(std::memory_order_acquire) >= static_cast<std::uint64_t>(queue_depth)) return false;
    q[tail % queue_depth] = {value, visible_ns};
    q_tail.store(tail + 1, std::memory_order_release);
    return true;
  }

  /// Receiver side: when the oldest value still in the queue becomes visible; 0 if none is queued.
  std::uint64_t head_visible_ns() const {
    std::uint64_t const head = q_head.load(std::memory_order_relaxed);
    if (head >= q_tail.load(std::memory_order_acquire)) return 0;
    return q[head % queue_depth].visible_ns;
  }

  /// Back to the freshly built state (both sides quiescent).
  void reset_receiver() {
    ready_seen = 0;
    rx_seq = 0;
    q_head.store(q_tail.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
  void reset_sender() {
    tx_seq = 0;
    wire_free_ns = last_visible_ns = 0;
    dropping = false;
    v_wire_free = 0;
    v_epoch = ~std::uint64_t{0};
    for (auto& e : credit_vepoch) e = 0;
    credit.store(0, std::memory_order_relaxed);
  }
};

/// A handle the slot protocol can drive: a TransportHandle that also exposes the FIFO geometry,
/// its receive areas and the per-link sequence counters.
template <class H>
concept FifoHandle = TransportHandle<H> && requires(H const h, int vt, int peer) {
  { h.slots() } -> std::convertible_to<int>;
  { h.slot_bytes() } -> std::convertible_to<std::size_t>;
  { h.recv_area(vt, peer) } -> std::same_as<std::byte*>;
  { h.tx_seq(vt, peer) } -> std::same_as<std::uint64_t&>;
  { h.rx_seq(vt, peer) } -> std::same_as<std::uint64_t&>;
};

/// True if the next slot to `peer` on `vt` has credit (the FIFO is not full). One poll.
template <FifoHandle H>
bool can_send(H const& h, int vt, int peer) {
  std::uint64_t const seq = h.tx_seq(vt, peer), slots = static_cast<std::uint64_t>(h.slots());
  return seq < slots || h.wait(vt, peer, flag::credit, seq - slots + 1, 0).st == status::ok;
}

/// Byte offset in peer's receive area of the next slot to `peer` on `vt` (fill it with put()s,
/// then publish_slot()).
template <FifoHandle H>
std::size_t next_slot_offset(H const& h, int vt, int peer) {
  return static_cast<std::size_t>(h.tx_seq(vt, peer) % static_cast<std::uint64_t>(h.slots())) * h.slot_bytes();
}

/// Hands the slot filled at next_slot_offset() to the receiver (ready = slots published).
template <FifoHandle H>
void publish_slot(H const& h, int vt, int peer) {
  std::uint64_t& seq = h.tx_seq(vt, peer);
  ++seq;
  h.signal(vt, peer, flag::ready, seq);
}

/// Publishes `bytes` (<= slot_bytes) from `src` as the next slot to `peer`; call only after
/// can_send() returned true.
template <FifoHandle H>
void send_slot(H const& h, int vt, int peer, void const* src, std::size_t bytes) {
  h.put(vt, peer, next_slot_offset(h, vt, peer), src, bytes);
  publish_slot(h, vt, peer);
}

/// The next slot from `peer` on `vt` if it has arrived (one poll), else nullptr.
template <FifoHandle H>
std::byte const* peek_slot(H const& h, int vt, int peer) {
  std::uint64_t const seq = h.rx_seq(vt, peer);
  if (h.wait(vt, peer, flag::ready, seq + 1, 0).st != status::ok) return nullptr;
  return h.recv_area(vt, peer) + static_cast<std::size_t>(seq % static_cast<std::uint64_t>(h.slots())) * h.slot_bytes();
}

/// Hands the slot returned by peek_slot() back to the sender (credit).
template <FifoHandle H>
void release_slot(H const& h, int vt, int peer) {
  std::uint64_t& seq = h.rx_seq(vt, peer);
  ++seq;
  h.signal(vt, peer, flag::credit, seq);
}

}  // namespace reccl::cpu
