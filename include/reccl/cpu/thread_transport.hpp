// reccl/cpu/thread_transport.hpp -- the CPU-thread Transport: ranks are threads, links are
// shared-memory FIFO rings, and slow or dead paths are injected from a fault_plan.
//
//   fabric (one per communicator: the memory every rank thread shares)
//   ┌───────────────────────────────────────────────────────────────────┐
//   │ links[vt][src][dst] : fifo_link (receive area, ready queue, credit) │
//   │ fault_plan          : rate caps and dead epochs per VT             │
//   └───────────────────────────────────────────────────────────────────┘
//        ▲ handle{fabric*, rank, epoch, abort*}  -- what a rank's worker threads hold
//
// Waits: a wait polls its flag once per poll quantum (fabric_config::poll_quantum_ns) and
// reports as `spins` the number of whole quanta it waited, so a stall count is proportional to
// waiting time whatever the thread's wake-up jitter. A wait ends at its deadline (status::timeout)
// or when the handle's abort flag is raised.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>

#include "../config.hpp"
#include "../transport.hpp"
#include "../types.hpp"
#include "faults.hpp"
#include "fifo.hpp"

namespace reccl::cpu {

class communicator;

/// Geometry and timing of a fabric.
struct fabric_config {
  int nranks = 1;
  int n_vts = 1;
  int slots = 4;                           ///< FIFO depth per link (1..queue_depth)
  std::size_t slot_bytes = 16384;          ///< bytes per slot (a multiple of 16)
  std::uint64_t poll_quantum_ns = 50'000;  ///< one spin of a wait: 50 us
  /// Rate caps act on a virtual clock instead of the wall clock: slots are visible at once, each
  /// carries the virtual time its wire would deliver it, and the executor derives stalls from those
  /// times. Stall counts (and so splits) then depend only on the plan, the split and the caps:
  /// deterministic, whatever the machine's load. Dead links still time out on the wall clock.
  bool virtual_time = false;
};

/// The shared memory of a CPU communicator: every link of every VT between every ordered rank
/// pair, plus the fault plan. Not copyable; lives as long as the communicator.
class fabric {
 public:
  fabric(fabric_config const& c, fault_plan plan) : cfg_(c), plan_(std::move(plan)) {
    std::size_t const n = static_cast<std::size_t>(c.n_vts) * c.nranks * c.nranks;
    std::size_t const area = static_cast<std::size_t>(c.slots) * c.slot_bytes;
    links_ = std::make_unique<fifo_link[]>(n);
    recv_ = std::make_unique_for_overwrite<std::byte[]>(n * area);
    send_ = std::make_unique_for_overwrite<std::byte[]>(n * area);
    for (std::size_t i = 0; i < n; ++i) {
      links_[i].recv_area = recv_.get() + i * area;
      links_[i].send_area = send_.get() + i * area;
    }
  }
  fabric(fabric const&) = delete;
  fabric& operator=(fabric const&) = delete;

  fifo_link& at(int vt, int src, int dst) const {
    return links_[(static_cast<std::size_t>(vt) * cfg_.nranks + src) * cfg_.nranks + dst];
  }
  fabric_config const& config() const { return cfg_; }
  fault_plan const& faults() const { return plan_; }

  /// Resets the link state rank `rank` owns on VT `vt`: the receiving side of links into it and
  /// the sending side of links out of it. Call only when no thread of VT `vt` runs on any rank
  /// and before this rank uses the VT again (the engine does it between collectives).
  void reset_vt(int rank, int vt) const {
    for (int p = 0; p < cfg_.nranks; ++p) {
      at(vt, p, rank).reset_receiver();
      at(vt, rank, p).reset_sender();
    }
  }

 private:
  fabric_config cfg_;
  fault_plan plan_;
  std::unique_ptr<fifo_link[]> links_;
  std::unique_ptr<std::byte[]> recv_, send_;
};

}  // namespace reccl::cpu

namespace reccl::transport {

/// Transport whose ranks are threads of one process (tests, simulation, GPU-less examples).
struct cpu_threads {
  static constexpr int max_vts = reccl::max_vts;
  using communicator = cpu::communicator;

  /// What a rank's threads hold: the fabric, the rank, the epoch (which selects the faults in
  /// force) and an optional abort flag that ends waits early. Trivially copyable.
  struct handle {
    cpu::fabric const* fab = nullptr;
    std::int32_t rank = 0;
    std::uint64_t epoch = 0;
    std::atomic<bool> const* abort = nullptr;

    int slots() const { return fab->config().slots; }
    std::size_t slot_bytes() const { return fab->config().slot_bytes; }
    std::uint64_t poll_quantum_ns() const { return fab->config().poll_quantum_ns; }
    /// My receive area for (vt, peer): where peer's puts land.
    std::byte* recv_area(int vt, int peer) const { return fab->at(vt, peer, rank).recv_area; }
    /// My exposed area for (vt, peer): what peer's get() reads.
    std::byte* send_area(int vt, int peer) const { return fab->at(vt, rank, peer).send_area; }
    std::uint64_t& tx_seq(int vt, int peer) const { return fab->at(vt, rank, peer).tx_seq; }
    std::uint64_t& rx_seq(int vt, int peer) const { return fab->at(vt, peer, rank).rx_seq; }

    /// Copies into peer's receive area for (vt, me). On a capped link the bytes take
    /// bytes / rate of wire time after what is already on the wire; on a dead link they are lost.
    void put(int vt, int peer, std::size_t offset, void const* src, std::size_t bytes) const {
      cpu::fifo_link& l = fab->at(vt, rank, peer);
      if (l.bytes_epoch != epoch) {
        l.bytes_epoch = epoch;
        l.epoch_bytes = 0;
        l.dropping = false;
      }
      if (l.dropping || l.epoch_bytes + bytes > fab->faults().dead_after(vt, rank, epoch)) {
        l.dropping = true;
        return;
      }
      std::memcpy(l.recv_area + offset, src, bytes);
      l.epoch_bytes += bytes;
      double const rate = fab->config().virtual_time ? 0.0 : fab->faults().rate(vt, rank, epoch);
      if (rate > 0) {
        std::uint64_t const start = std::max(cpu::now_ns(), l.wire_free_ns);
        l.wire_free_ns = start + static_cast<std::uint64_t>(static_cast<double>(bytes) * 1e9 / rate);
        l.last_visible_ns = l.wire_free_ns;
      } else {
        l.last_visible_ns = 0;
      }
      l.slot_visible_ns[l.tx_seq % static_cast<std::uint64_t>(slots())] = l.last_visible_ns;
    }

    /// Copies from peer's exposed area for (vt, me). Not rate-capped (the engine pushes); on a dead
    /// link nothing is copied.
    void get(int vt, int peer, std::size_t offset, void* dst, std::size_t bytes) const {
      if (fab->faults().dead_after(vt, peer, epoch) == 0) return;
      std::memcpy(dst, fab->at(vt, peer, rank).send_area + offset, bytes);
    }

    /// ready: publishes `value` to peer for (vt, me), visible once the bytes put so far have
    /// crossed the wire. credit: publishes at once. Dropped on a dead link.
    void signal(int vt, int peer, flag f, std::uint64_t value) const {
      if (f == flag::ready) {
        cpu::fifo_link& l = fab->at(vt, rank, peer);
        if (l.bytes_epoch != epoch) {
          l.bytes_epoch = epoch;
          l.epoch_bytes = 0;
          l.dropping = false;
        }
        if (l.dropping || fab->faults().dead_after(vt, rank, epoch) == 0) return;
        // The FIFO protocol keeps at most `slots` (<= queue_depth) values in flight, so this
        // only waits if a caller signals far ahead of its receiver. Bounded like every wait: after
        // 10^4 poll quanta (or on abort) the value is dropped and the receiver's wait times out.
        std::uint64_t const deadline = cpu::now_ns() + 10'000 * poll_quantum_ns();
        while (!l.push(value, l.last_visible_ns)) {
          if (cpu::now_ns() >= deadline || (abort && abort->load(std::memory_order_relaxed))) return;
          cpu::sleep_until_ns(cpu::now_ns() + poll_quantum_ns());
        }
      } else {
        if (fab->faults().dead_after(vt, rank, epoch) == 0) return;
        fab->at(vt, peer, rank).credit.store(value, std::memory_order_release);
      }
    }

    // -- virtual time (fabric_config::virtual_time); the slot protocol of fifo.hpp calls these
    //    around the slot it sends or consumes.

    /// Sender: the next slot to peer is handed over at virtual time `t_ready` with `bytes`; returns
    /// and records (for the receiver) when the capped wire delivers it.
    std::uint64_t virtual_send(int vt, int peer, std::uint64_t t_ready, std::size_t bytes) const {
      cpu::fifo_link& l = fab->at(vt, rank, peer);
      if (l.v_epoch != epoch) {  // every collective starts its virtual clock at 0
        l.v_epoch = epoch;
        l.v_wire_free = 0;
      }
      double const rate = fab->faults().rate(vt, rank, epoch);
      std::uint64_t const start = std::max(t_ready, l.v_wire_free);
      l.v_wire_free = start + (rate > 0 ? static_cast<std::uint64_t>(static_cast<double>(bytes) * 1e9 / rate) : 0);
      l.slot_vtime[l.tx_seq % static_cast<std::uint64_t>(slots())] = l.v_wire_free;
      return l.v_wire_free;
    }
    /// Sender: virtual time at which the receiver released slot `k` to me (0 if in an earlier epoch).
    std::uint64_t credit_time(int vt, int peer, std::uint64_t k) const {
      cpu::fifo_link const& l = fab->at(vt, rank, peer);
      std::size_t const i = static_cast<std::size_t>(k % static_cast<std::uint64_t>(slots()));
      return l.credit_vepoch[i] == epoch + 1 ? l.credit_vtime[i] : 0;
    }
    /// Receiver: virtual time at which the next slot from peer became visible.
    std::uint64_t slot_time(int vt, int peer) const {
      cpu::fifo_link const& l = fab->at(vt, peer, rank);
      return l.slot_vtime[l.rx_seq % static_cast<std::uint64_t>(slots())];
    }
    /// Receiver: the next slot from peer is consumed at virtual time t (call before release_slot).
    void set_release_time(int vt, int peer, std::uint64_t t) const {
      cpu::fifo_link& l = fab->at(vt, peer, rank);
      std::size_t const i = static_cast<std::size_t>(l.rx_seq % static_cast<std::uint64_t>(slots()));
      l.credit_vtime[i] = t;
      l.credit_vepoch[i] = epoch + 1;
    }

    // -- wake-up hints: when a wait can end at the earliest, if the fabric knows (0: unknown).
    //    A rate-capped wire knows when each slot arrives; the executor sleeps until then instead
    //    of polling, which keeps its many waiting threads off the CPU.

    /// Receiver: when the next queued ready value from peer becomes visible (0: none queued yet).
    std::uint64_t ready_eta(int vt, int peer) const { return fab->at(vt, peer, rank).head_visible_ns(); }
    /// Sender: when slot `k` to peer becomes visible to the receiver, i.e. the earliest its credit
    /// can come back (0: unknown or already visible).
    std::uint64_t credit_eta(int vt, int peer, std::uint64_t k) const {
      return fab->at(vt, rank, peer).slot_visible_ns[k % static_cast<std::uint64_t>(slots())];
    }

    /// One poll: whether my flag f from (vt, peer) is >= value now.
    bool test(int vt, int peer, flag f, std::uint64_t value) const {
      if (f == flag::ready) {
        cpu::fifo_link& l = fab->at(vt, peer, rank);
        if (l.ready_seen >= value) return true;
        l.drain(cpu::now_ns());
        return l.ready_seen >= value;
      }
      return fab->at(vt, rank, peer).credit.load(std::memory_order_acquire) >= value;
    }

    /// Waits until my flag f from (vt, peer) is >= value, the absolute deadline (now_ns() clock)
    /// passes, or the abort flag is raised. spins = whole poll quanta waited. A deadline in the
    /// past makes it a single poll.
    wait_result wait(int vt, int peer, flag f, std::uint64_t value, std::uint64_t deadline_ns) const {
      if (test(vt, peer, f, value)) return {status::ok, 0};
      std::uint64_t const t0 = cpu::now_ns(), q = poll_quantum_ns();
      if (t0 >= deadline_ns) return {status::timeout, 0};
      for (std::uint64_t k = 1;; ++k) {
        std::uint64_t next = t0 + k * q;
        if (next > deadline_ns) next = deadline_ns;
        cpu::sleep_until_ns(next);
        std::uint64_t const t = cpu::now_ns();
        if (test(vt, peer, f, value)) return {status::ok, (t - t0) / q};
        if (t >= deadline_ns || (abort && abort->load(std::memory_order_relaxed))) return {status::timeout, (t - t0) / q};
        k = std::max(k, (t - t0) / q);  // overslept: skip the quanta already gone
      }
    }
  };
};

static_assert(QueueTransport<cpu_threads>);
static_assert(cpu::FifoHandle<cpu_threads::handle>);

}  // namespace reccl::transport
