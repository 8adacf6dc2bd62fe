// reccl/cpu/faults.hpp -- the clock, the poll quantum, and the slow/dead paths the CPU engine injects.
//
//   fault_plan  (fixed for a communicator's life; keyed by epoch = collective number)
//   ┌──────────────────────────────────────────────────────────────────────────────┐
//   │ cap(vt=3, 25e6 B/s, from=20, until=40)   VT 3's links carry 25 MB/s in 20..39 │
//   │ kill(vt=3, from=40, until=60)            VT 3 moves nothing in 40..59         │
//   └──────────────────────────────────────────────────────────────────────────────┘
//
// A rate cap makes a VT's *link* slow: each slot becomes visible to the receiver only after
// bytes / rate of wire time, serialized per link (src -> dst on that VT), so the sender's FIFO
// fills and the sender stalls. A dead VT drops every put and signal on its links, so its waits
// run into their deadline. Either can be limited to the links leaving one rank (`src_rank`), and a
// kill can spare the first `after_bytes` a link carries in the epoch (a VT that dies mid-way).
#pragma once

#include <chrono>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#if defined(__linux__)
#  include <sys/prctl.h>
#endif

namespace reccl::cpu {

/// Monotonic clock in nanoseconds (steady_clock). Deadlines passed to waits use this clock.
inline std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

/// Sleeps until `t` (now_ns() clock); returns at once if t has passed.
inline void sleep_until_ns(std::uint64_t t) {
  std::this_thread::sleep_until(std::chrono::steady_clock::time_point(std::chrono::nanoseconds(t)));
}

/// Asks the OS to wake this thread close to the requested time (Linux timer slack 1 us instead
/// of 50 us), so that a poll quantum of tens of microseconds is honoured. No-op elsewhere.
inline void tighten_timer_slack() {
#if defined(__linux__)
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
#endif
}

inline constexpr std::uint64_t forever = std::numeric_limits<std::uint64_t>::max();

/// One injected condition on a VT's links during epochs [from_epoch, until_epoch).
struct vt_fault {
  enum class kind : std::uint8_t { rate_cap, dead };
  kind k = kind::rate_cap;
  int vt = 0;
  int src_rank = -1;                   ///< -1: the links leaving every rank; else only those leaving src_rank
  std::uint64_t from_epoch = 0;
  std::uint64_t until_epoch = forever;
  double bytes_per_s = 0;              ///< rate_cap: the link's rate
  std::uint64_t after_bytes = 0;       ///< dead: bytes a link still carries in the epoch before it stops
  bool applies(int v, int src, std::uint64_t epoch) const {
    return v == vt && (src_rank < 0 || src_rank == src) && epoch >= from_epoch && epoch < until_epoch;
  }
};

/// The slow and dead paths of a CPU communicator, as a list of epoch ranges. Overlapping caps:
/// the lowest rate wins. Immutable once the communicator is built (every rank reads it unlocked).
struct fault_plan {
  std::vector<vt_fault> faults;

  /// Caps VT `vt` to `bytes_per_s` per link in epochs [from, until) (links leaving `src_rank`, or all).
  fault_plan& cap(int vt, double bytes_per_s, std::uint64_t from = 0, std::uint64_t until = forever, int src_rank = -1) {
    faults.push_back({vt_fault::kind::rate_cap, vt, src_rank, from, until, bytes_per_s, 0});
    return *this;
  }
  /// Stops VT `vt` in epochs [from, until): after `after_bytes` bytes per link in each such epoch,
  /// its puts and signals are dropped.
  fault_plan& kill(int vt, std::uint64_t from, std::uint64_t until = forever, int src_rank = -1,
                   std::uint64_t after_bytes = 0) {
    faults.push_back({vt_fault::kind::dead, vt, src_rank, from, until, 0, after_bytes});
    return *this;
  }

  /// The rate of the link (vt, src -> *) in `epoch`, bytes/s; 0 means uncapped.
  double rate(int vt, int src, std::uint64_t epoch) const {
    double r = 0;
    for (auto const& f : faults)
      if (f.k == vt_fault::kind::rate_cap && f.applies(vt, src, epoch) && f.bytes_per_s > 0 && (r == 0 || f.bytes_per_s < r))
        r = f.bytes_per_s;
    return r;
  }
  /// Bytes the link (vt, src -> *) carries in `epoch` before it stops; forever if it is not dead.
  std::uint64_t dead_after(int vt, int src, std::uint64_t epoch) const {
    std::uint64_t b = forever;
    for (auto const& f : faults)
      if (f.k == vt_fault::kind::dead && f.applies(vt, src, epoch) && f.after_bytes < b) b = f.after_bytes;
    return b;
  }
  bool empty() const { return faults.empty(); }
};

}  // namespace reccl::cpu
