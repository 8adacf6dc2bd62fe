// reccl/cpu/communicator.hpp -- a CPU communicator: N rank threads, V VTs, the shared fabric, the
// control plane (arrival slots, record exchange) and every rank's epoch state.
//
//   communicator (shared by the rank threads)
//   ┌───────────────────────────────────────────────────────────────────────────────┐
//   │ fabric            links[vt][src][dst], fault plan          (data plane)       │
//   │ arrivals[vt][r]   "rank r reached call c on VT vt with these arguments"       │
//   │ aborts            "rank r gave up call c before it arrived: cause"            │
//   │ records[2][r]     what rank r says at the end of a collective (last sync step)│
//   │ ranks[r]          rank r's control state (epoch, shares, probes, model),      │
//   │                   its private buffers, its last report                       │
//   └───────────────────────────────────────────────────────────────────────────────┘
//
// Each rank's state is touched only by that rank's thread; the shared slots are single-writer
// with acquire/release tags. A user calls a collective from N threads, one per rank (run_ranks()
// does that for tests and examples), every rank making the same sequence of calls.
//
// Errors. A rank whose call fails locally, before it arrived on any VT (bad arguments, internal
// buffers it cannot allocate), publishes an abort record for that call (abort_call) and throws its
// own error; every other rank's arrival wait for that call ends at once with an error naming that
// rank and its cause. No data moved and no rank's state advanced, so the communicator stays usable:
// the aborted call counts as one call of the sequence on every rank, and the next call runs
// normally. After any other error (a rank lost, disagreeing arguments, a failure once data moves)
// the communicator is failed: every later call throws (as after an NCCL abort, build a new one).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "../config.hpp"
#include "../error.hpp"
#include "../policy/allocator/allocator.hpp"
#include "../policy/control.hpp"
#include "../policy/epoch.hpp"
#include "../policy/schedule/schedule.hpp"
#include "../policy/telemetry/cost_model.hpp"
#include "../types.hpp"
#include "faults.hpp"
#include "thread_transport.hpp"

namespace reccl::cpu {

/// Everything a CPU communicator is built from. Times are nanoseconds.
struct config {
  int nranks = 1;
  int n_vts = 1;
  int slots = 4;                              ///< FIFO depth per link
  std::size_t slot_bytes = 16384;             ///< bytes per FIFO slot (multiple of 16)
  std::uint64_t poll_quantum_ns = 50'000;     ///< one stall = one quantum of waiting (50 us; at most 65,536 ns when model.alpha is derived from it)
  std::uint64_t wait_timeout_ns = 500'000'000;     ///< a VT that moves nothing this long is dead
  std::uint64_t arrival_timeout_ns = 10'000'000'000;  ///< a rank that does not arrive this long is lost
  std::uint64_t sync_timeout_ns = 60'000'000'000;     ///< a rank that does not report this long is lost
  std::uint64_t granule = 0;                  ///< VT block boundaries: multiples of this many elements (0: 256 bytes' worth)
  std::uint64_t tile = 1024;                  ///< schedule tile (elements) for interleaved chunking
  int ranks_per_node = 0;                     ///< schedule params (0: one node)
  std::vector<schedule::relay_route> relays{};  ///< schedule params: all-to-all relays (at most max_relays)
  std::uint64_t probe_bytes = 4096;           ///< size of the block a probe moves (per probed VT)
  std::uint64_t probe_grace_ns = 2'000'000;   ///< a probe may run this long past the start of the collective
  bool count_data_waits = true;               ///< count waits for data as stalls too (see engine.hpp)
  bool virtual_time = false;                  ///< rate caps on a virtual clock: deterministic stalls (see fabric_config)
  bool poison_internal = false;               ///< fill internal work/scratch with 0xA5 before each collective
  control_config control{};                   ///< probe interval K, rejoin share
  /// Cost model the control step evaluates: by default a stall is one poll quantum of waiting and a
  /// byte costs 0.5 ns of CPU time (set model.alpha = 0 to get it derived from poll_quantum_ns).
  telemetry::cost_model_q model{0, std::uint64_t{1} << 23, 0, 0};
  fault_plan faults{};
};

/// One missed deadline: the VT, where it was seen and what it waited for.
struct fault_event {
  std::uint64_t epoch = 0;
  int vt = -1;
  int rank = -1;        ///< the rank whose worker timed out (this rank)
  int peer = -1;        ///< the peer it waited for
  int step = -1;        ///< the schedule step
  bool on_credit = false;  ///< waited for credit (else for data)
  bool in_recovery = false;  ///< missed while finishing another VT's range
};

/// What one rank gets back from one collective.
struct collective_result {
  status st = status::ok;           ///< ok, or recovered (a VT died; the result is still correct)
  epoch_report report{};            ///< split, shares, stalls, bytes, masks of this epoch (every rank agrees)
  std::vector<fault_event> faults;  ///< deadlines missed on this rank (fault events)
  std::uint32_t fault_mask = 0;     ///< VTs that missed a deadline on any rank (same as report.fault_mask)
  std::uint64_t elapsed_ns = 0;     ///< this rank's wall time in the collective
  std::uint64_t data_ns = 0;        ///< ... of which the data phase (before any recovery)
  std::uint64_t vt_ns[max_vts] = {};  ///< per VT: this rank's time to finish its block
  std::uint64_t vt_virtual_ns[max_vts] = {};  ///< per VT, virtual_time communicators: the same on the virtual clock
};

namespace detail {

/// The arguments every rank must agree on, published on each VT at arrival.
struct call_args {
  std::uint64_t epoch = 0;
  std::uint64_t count = 0;
  std::uint64_t schedule_tag = 0;
  std::int32_t root = 0;
  std::uint8_t coll = 0, type = 0, op = 0, pad = 0;
  bool operator==(call_args const&) const = default;
};

struct alignas(64) arrival_slot {
  std::atomic<std::uint64_t> tag{0};  ///< call number + 1 once args is written (see rank_state::calls)
  call_args args{};
};

/// Largest record the last sync step exchanges.
inline constexpr std::size_t max_record_bytes = 1024;
static_assert(sizeof(epoch_record) <= max_record_bytes);

struct alignas(64) record_slot {
  std::atomic<std::uint64_t> tag{0};  ///< round + 1 once data is written
  alignas(16) std::byte data[max_record_bytes];
};

/// A call that one rank gave up before it arrived on any VT: the call number, the rank, and why.
struct call_abort {
  std::uint64_t call = 0;
  int rank = -1;
  status st = status::ok;
  std::string what;
};

/// Waits with a short backoff (10 us doubling to `quantum`) until pred() or the deadline.
template <class P>
bool poll_until(P&& pred, std::uint64_t deadline, std::uint64_t quantum, std::atomic<bool> const* abort = nullptr) {
  std::uint64_t sleep = 10'000;
  while (!pred()) {
    std::uint64_t const t = now_ns();
    if (t >= deadline || (abort && abort->load(std::memory_order_relaxed))) return pred();
    sleep_until_ns(std::min(t + sleep, deadline));
    sleep = std::min(sleep * 2, quantum);
  }
  return true;
}

}  // namespace detail

/// The A-independent part of control<A>: what a rank keeps between collectives.
struct control_fields {
  control_config config{};
  std::uint64_t epoch = 0;
  shares share{};
  std::uint32_t probe_mask = 0;
  std::int32_t since_probe = 0;
  telemetry::cost_model_q model{}, next_model{};
  bool has_next_model = false;

  template <Allocator A>
  control<A> load(A const& a) const {
    control<A> c{};
    c.allocator = a;
    c.config = config;
    c.epoch = epoch;
    c.share = share;
    c.probe_mask = probe_mask;
    c.since_probe = since_probe;
    c.model = model;
    c.next_model = next_model;
    c.has_next_model = has_next_model;
    return c;
  }
  template <Allocator A>
  void store(control<A> const& c) {
    epoch = c.epoch;
    share = c.share;
    probe_mask = c.probe_mask;
    since_probe = c.since_probe;
    model = c.model;
    next_model = c.next_model;
    has_next_model = c.has_next_model;
  }
};

/// One rank's private state. Only that rank's thread touches it.
struct rank_state {
  control_fields ctl{};
  std::uint64_t round = 0;            ///< record exchanges done (identical on every rank)
  /// Collective calls started, aborted ones included (identical on every rank). Arrival slots and
  /// abort records are keyed by it rather than by the epoch, which an aborted call leaves as it was:
  /// so neither an earlier call's arrival nor its abort can be taken for the current call's.
  std::uint64_t calls = 0;
  std::vector<std::byte> input_copy, work, scratch;  ///< internal buffers, grown as needed
  std::vector<std::byte> probe_input, probe_work, probe_scratch;
  epoch_report last{};                ///< report of the last collective
  bool failed = false;
};

/// Runs f(rank) for rank = 0..n-1 on n threads and joins them; rethrows the exception of the lowest
/// rank that threw, if any.
template <class F>
void run_threads(int n, F&& f) {
  std::vector<std::exception_ptr> errs(static_cast<std::size_t>(n));
  {
    std::vector<std::jthread> ts;
    ts.reserve(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r)
      ts.emplace_back([&, r] {
        try {
          f(r);
        } catch (...) {
          errs[static_cast<std::size_t>(r)] = std::current_exception();
        }
      });
  }
  for (auto& e : errs)
    if (e) std::rethrow_exception(e);
}

/// A CPU communicator of `nranks` rank threads and `n_vts` VTs (see the file comment).
class communicator {
 public:
  /// Builds the fabric and every rank's epoch-0 state (equal shares). Throws reccl::error
  /// (invalid_argument) for nranks outside [1, max_ranks], n_vts outside [1, transport max_vts],
  /// a bad FIFO geometry or zero timeouts.
  explicit communicator(config c) : cfg_(std::move(c)) {
    auto bad = [](std::string const& what) { throw error(status::invalid_argument, what); };
    if (cfg_.nranks < 1 || cfg_.nranks > max_ranks)
      bad("nranks is " + std::to_string(cfg_.nranks) + ", must be in [1, " + std::to_string(max_ranks) + "]");
    if (cfg_.n_vts < 1)
      bad("VT count is " + std::to_string(cfg_.n_vts) + ", must be at least 1");
    if (cfg_.n_vts > transport::cpu_threads::max_vts)
      bad("VT count " + std::to_string(cfg_.n_vts) + " is more than the CPU transport supports (" +
          std::to_string(transport::cpu_threads::max_vts) + ")");
    if (cfg_.slots < 1 || cfg_.slots > queue_depth)
      bad("slots is " + std::to_string(cfg_.slots) + ", must be in [1, " + std::to_string(queue_depth) + "]");
    if (cfg_.slot_bytes < 16 || cfg_.slot_bytes % 16 != 0) bad("slot_bytes must be a positive multiple of 16");
    if (cfg_.poll_quantum_ns == 0 || cfg_.wait_timeout_ns == 0 || cfg_.arrival_timeout_ns == 0 || cfg_.sync_timeout_ns == 0)
      bad("poll quantum and timeouts must be positive");
    if (cfg_.tile == 0) bad("tile must be positive");
    if (cfg_.relays.size() > static_cast<std::size_t>(schedule::max_relays))
      bad("at most " + std::to_string(schedule::max_relays) + " relay routes");
    for (auto const& f : cfg_.faults.faults)
      if (f.vt < 0 || f.vt >= cfg_.n_vts || f.src_rank >= cfg_.nranks)
        bad("fault plan names VT " + std::to_string(f.vt) + " / rank " + std::to_string(f.src_rank) + " outside the communicator");
    if (cfg_.model.alpha == 0) {
      // α in Q24 ns must stay within cost_model_q::coef_limit, or the model would clamp it silently.
      if ((cfg_.poll_quantum_ns << telemetry::cost_model_q::frac_bits) > telemetry::cost_model_q::coef_limit)
        bad("a poll quantum above 65,536 ns cannot price a stall in the fixed-point cost model: lower it or set model.alpha");
      cfg_.model.alpha = cfg_.poll_quantum_ns << telemetry::cost_model_q::frac_bits;
    }
    fab_ = std::make_unique<fabric>(
        fabric_config{cfg_.nranks, cfg_.n_vts, cfg_.slots, cfg_.slot_bytes, cfg_.poll_quantum_ns, cfg_.virtual_time},
        cfg_.faults);
    arrivals_ = std::make_unique<detail::arrival_slot[]>(static_cast<std::size_t>(cfg_.n_vts) * cfg_.nranks);
    records_ = std::make_unique<detail::record_slot[]>(2 * static_cast<std::size_t>(cfg_.nranks));
    ranks_.resize(static_cast<std::size_t>(cfg_.nranks));
    for (auto& r : ranks_) {
      r.ctl.config = cfg_.control;
      r.ctl.share = equal_shares(cfg_.n_vts, all_live(cfg_.n_vts));
      r.ctl.model = cfg_.model;
    }
  }
  communicator(communicator const&) = delete;
  communicator& operator=(communicator const&) = delete;

  int nranks() const { return cfg_.nranks; }
  int n_vts() const { return cfg_.n_vts; }
  config const& cfg() const { return cfg_; }
  fabric const& fab() const { return *fab_; }

  /// Rank r's state. Only rank r's thread may use it while collectives run.
  rank_state& rank(int r) { return ranks_.at(static_cast<std::size_t>(r)); }
  rank_state const& rank(int r) const { return ranks_.at(static_cast<std::size_t>(r)); }

  /// The report of rank r's last collective (identical on every rank).
  epoch_report const& last_report(int r) const { return rank(r).last; }
  /// The epoch (collective number) rank r runs next and the shares it will use.
  std::uint64_t epoch(int r) const { return rank(r).ctl.epoch; }
  shares const& current_shares(int r) const { return rank(r).ctl.share; }

  /// Runs f(rank) on nranks threads and joins them; rethrows the exception of the lowest rank
  /// that threw, if any.
  template <class F>
  void run_ranks(F&& f) {
    run_threads(cfg_.nranks, f);
  }

  // -- control plane (used by the engine) ---------------------------------------------------------

  detail::arrival_slot& arrival(int vt, int r) const { return arrivals_[static_cast<std::size_t>(vt) * cfg_.nranks + r]; }

  /// Marks the communicator failed (first caller wins): waits of every rank end early and their
  /// collectives throw too, instead of waiting out their deadlines for a rank that gave up.
  void mark_failed(int rank, std::uint64_t epoch, status st, std::string const& what) {
    bool expected = false;
    if (failing_.compare_exchange_strong(expected, true)) {
      failed_rank_ = rank;
      failed_epoch_ = epoch;
      failed_status_ = st;
      failed_what_ = what;
      failed_.store(true, std::memory_order_release);
    }
  }
  /// Raised once some rank failed; see mark_failed.
  std::atomic<bool> const& failed_flag() const { return failed_; }
  /// The first failure, once failed_flag() is set: its rank and a description.
  int failed_rank() const {
    wait_failed();
    return failed_rank_;
  }
  std::string failed_description() const {
    wait_failed();
    return "rank " + std::to_string(failed_rank_) + " failed in collective " + std::to_string(failed_epoch_) + " (" +
           std::string(name(failed_status_)) + ": " + failed_what_ + ")";
  }

  /// Publishes that `rank` gave up call `call` locally, before arriving on any VT, with status `st`
  /// and cause `what`. Every rank's arrival wait for that call then ends at once (call_aborted).
  /// The first record of a call is kept; the latest max_call_aborts calls are remembered (a rank
  /// further behind than that falls back to its arrival deadline).
  void abort_call(int rank, std::uint64_t call, status st, std::string const& what) {
    {
      std::lock_guard const lock(abort_mutex_);
      for (auto const& a : aborts_)
        if (a.call == call) return;
      if (aborts_.size() == max_call_aborts) aborts_.erase(aborts_.begin());
      aborts_.push_back({call, rank, st, what});
    }
    // A hint for the polls: they take the lock only once some call at or after theirs aborted.
    std::uint64_t seen = abort_hint_.load(std::memory_order_relaxed);
    while (seen < call + 1 && !abort_hint_.compare_exchange_weak(seen, call + 1, std::memory_order_release)) {}
  }
  /// Whether some rank published an abort record for call `call` (see abort_call).
  bool call_aborted(std::uint64_t call) const {
    if (abort_hint_.load(std::memory_order_acquire) < call + 1) return false;
    std::lock_guard const lock(abort_mutex_);
    return std::ranges::any_of(aborts_, [&](detail::call_abort const& a) { return a.call == call; });
  }
  /// The abort record of call `call`; rank -1 if there is none.
  detail::call_abort abort_record(std::uint64_t call) const {
    std::lock_guard const lock(abort_mutex_);
    for (auto const& a : aborts_)
      if (a.call == call) return a;
    return {};
  }

  /// All-gathers one trivially copyable record per rank through the record slots: publishes
  /// `mine` for round `round`, then waits (until `deadline`) for every rank's record of that round.
  /// Returns -1 on success, else the lowest rank whose record did not come (also when the wait
  /// ended because the communicator failed: see failed_flag()).
  template <class R>
  int exchange(int me, std::uint64_t round, R const& mine, R* all, std::uint64_t deadline) const {
    static_assert(std::is_trivially_copyable_v<R> && sizeof(R) <= detail::max_record_bytes);
    std::size_t const base = static_cast<std::size_t>(round & 1u) * cfg_.nranks;
    detail::record_slot& s = records_[base + me];
    std::memcpy(s.data, &mine, sizeof(R));
    s.tag.store(round + 1, std::memory_order_release);
    for (int r = 0; r < cfg_.nranks; ++r) {
      detail::record_slot const& o = records_[base + r];
      if (!detail::poll_until([&] { return o.tag.load(std::memory_order_acquire) == round + 1; }, deadline,
                              cfg_.poll_quantum_ns, &failed_))
        return r;
      std::memcpy(&all[r], o.data, sizeof(R));
    }
    return -1;
  }

 private:
  config cfg_;
  std::unique_ptr<fabric> fab_;
  std::unique_ptr<detail::arrival_slot[]> arrivals_;
  std::unique_ptr<detail::record_slot[]> records_;
  std::vector<rank_state> ranks_;
  void wait_failed() const {  // the winner of mark_failed publishes right after its CAS
    while (failing_.load(std::memory_order_acquire) && !failed_.load(std::memory_order_acquire)) std::this_thread::yield();
  }

  static constexpr std::size_t max_call_aborts = 64;
  mutable std::mutex abort_mutex_;
  std::vector<detail::call_abort> aborts_;      ///< guarded by abort_mutex_, oldest first
  std::atomic<std::uint64_t> abort_hint_{0};    ///< 1 + the highest aborted call number

  std::atomic<bool> failing_{false}, failed_{false};
  int failed_rank_ = -1;
  std::uint64_t failed_epoch_ = 0;
  status failed_status_ = status::ok;
  std::string failed_what_;
};

}  // namespace reccl::cpu
