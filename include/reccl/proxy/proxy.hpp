// reccl/proxy/proxy.hpp -- the Backend concept and the proxy thread that drains work queues into it.
//
//   queues (one per producer, e.g. per VT)       proxy thread                backend
//   ┌──────────┐                                 ┌──────────────────────┐    ┌──────────────────┐
//   │ queue 0  │── try_pop (up to batch) ───────▶│ validate, dispatch   │───▶│ put / signal /   │
//   │ queue 1  │── ...                           │ issued[q] += 1       │    │ get (may be      │
//   │   ...    │                                 │ poll_completions ────│───▶│ asynchronous)    │
//   └──────────┘◀── mark_completed(issued[q]) ───│ when nothing is      │    └──────────────────┘
//                   (all outstanding done)       │ outstanding          │
//                                                └──────────────────────┘
//
// Ordering: requests of one queue are handed to the backend in queue order; a backend must make
// a put's bytes visible to the peer no later than a later signal to the same peer (the host
// backend copies then release-stores the flag; the verbs backend posts both on the peer's RC QP,
// whose write-with-immediate completes at the receiver only after the earlier writes; the
// copy-engine backend issues a pass's copies before its signals on the peer's stream). A backend
// may hold what it is handed until the pass's poll_completions (the copy-engine backend batches
// a pass into a few CUDA calls); so a put may overtake an earlier signal of the same pass, which
// no producer can observe: it handed the put over before that signal was issued.
//
// Completion: a queue's `completed` counter advances to everything issued once the backend
// reports nothing outstanding. That is conservative (a busy backend delays every queue's
// completion a little) and needs no per-request bookkeeping from the backend.
//
// Errors: the first failure (a bad request, a backend error, a completion that never came) is
// recorded with a message; the failing queue gets a sticky error word, so its producer's push,
// flush and waits return that status instead of hanging. Later requests of a failed queue are
// discarded. Every wait the proxy does is bounded (proxy_config::drain_timeout_ns at stop).
#pragma once

#include <atomic>
#include <chrono>
#include <concepts>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "../types.hpp"
#include "work_queue.hpp"

namespace reccl::proxy {

/// What a backend's progress call reports: its health and how many operations are in flight.
struct poll_result {
  status st = status::ok;
  std::uint64_t outstanding = 0;
};

/// How requests are carried out. Called only from the proxy thread, so a backend needs no locks.
/// put/signal/get start (or queue) one operation and return status::invalid_argument for a request
/// out of range (peer, offsets, flag index) or another non-ok status if it cannot be started;
/// poll_completions, called after every pass, issues what was queued and makes progress (reaps
/// completions, delivers incoming signals) without blocking.
template <class B>
concept Backend = requires(B& b, work_request const& r) {
  { b.put(r) } -> std::same_as<status>;
  { b.signal(r) } -> std::same_as<status>;
  { b.get(r) } -> std::same_as<status>;
  { b.poll_completions() } -> std::same_as<poll_result>;
};

/// A backend that also takes inline puts (work_request kind put_inline): the payload the proxy
/// copied out of the ring, valid only during the call. The proxy signals afterwards (value != 0).
template <class B>
concept InlineBackend = Backend<B> && requires(B& b, work_request const& r, std::span<std::byte const> payload) {
  { b.put_inline(r, payload) } -> std::same_as<status>;
};

/// Proxy thread tuning.
struct proxy_config {
  std::uint32_t batch = 64;                        ///< most requests taken from one queue per pass
  std::uint32_t idle_spins = 256;                  ///< empty passes before the thread starts sleeping
  std::uint64_t idle_sleep_ns = 20'000;            ///< sleep per empty pass after that
  std::uint64_t drain_timeout_ns = 1'000'000'000;  ///< stop(): longest wait for outstanding work
};

/// Drains a fixed set of queues into one backend on its own thread. The backend and the queues'
/// memory must outlive the proxy. Not copyable.
template <Backend B>
class proxy {
 public:
  proxy(B& backend, std::span<work_queue_view const> queues, proxy_config cfg = {})
      : backend_(backend), queues_(queues.begin(), queues.end()), issued_(queues.size(), 0),
        failed_(queues.size(), false), cfg_(cfg) {
    if (cfg_.batch == 0) cfg_.batch = 1;
    for (std::size_t q = 0; q < queues_.size(); ++q) {
      issued_[q] = queues_[q].ctl ? load_relaxed(&queues_[q].ctl->head) : 0;
      if (queues_[q].ring == nullptr || queues_[q].ctl == nullptr || queues_[q].capacity == 0 ||
          (queues_[q].capacity & (queues_[q].capacity - 1)) != 0)
        record(status::invalid_argument, "queue " + std::to_string(q) + " is not a valid work queue", q);
    }
  }
  proxy(proxy const&) = delete;
  proxy& operator=(proxy const&) = delete;
  ~proxy() { stop(); }

  /// Starts the thread (once; later calls do nothing).
  void start() {
    if (thread_.joinable() || stopped_) return;
    thread_ = std::thread([this] { loop(); });
  }

  /// Asks the thread to finish: it executes what the queues hold, waits up to drain_timeout_ns for
  /// the backend's outstanding operations (a miss is a timeout error), and exits. Idempotent.
  void stop() {
    stop_requested_.store(true, std::memory_order_release);
    if (thread_.joinable()) thread_.join();
    stopped_ = true;
  }

  /// One pass over every queue and one progress call, on the caller's thread (for a caller that
  /// drives the proxy itself; never while the thread runs). Returns whether anything happened.
  bool run_once() {
    bool did = false;
    for (std::size_t q = 0; q < queues_.size(); ++q) {
      if (queues_[q].ctl == nullptr) continue;
      work_request r;
      for (std::uint32_t n = 0; n < cfg_.batch && queues_[q].try_pop(r, payload_); ++n) {
        did = true;
        std::uint64_t const seq = issued_[q];
        issued_[q] = load_relaxed(&queues_[q].ctl->head);  // records, not requests: an inline put's payload counts
        if (failed_[q]) continue;  // discard: the producer already sees the queue's error
        status const st = execute(r);
        if (st != status::ok) {
          record(st, "queue " + std::to_string(q) + " request " + std::to_string(seq) + " (" + describe(r) + ")", q);
        }
      }
    }
    poll_result const p = backend_.poll_completions();
    outstanding_ = p.outstanding;
    if (p.st != status::ok) {
      for (std::size_t q = 0; q < queues_.size(); ++q) record(p.st, "backend progress failed", q);
    }
    if (p.outstanding == 0) {
      for (std::size_t q = 0; q < queues_.size(); ++q) {
        if (failed_[q] || queues_[q].ctl == nullptr) continue;
        if (load_relaxed(&queues_[q].ctl->completed) != issued_[q]) {
          queues_[q].mark_completed(issued_[q]);
          did = true;
        }
      }
    }
    return did;
  }

  /// First error (status::ok if none) and its message.
  status error() const { return static_cast<status>(error_.load(std::memory_order_acquire)); }
  std::string error_message() const {
    std::lock_guard<std::mutex> lock(mu_);
    return message_;
  }
  /// Ring records taken from queue q so far (a request is one, an inline put one more per 64 bytes
  /// of payload: the producer's sequence numbers count records, and so does mark_completed; read
  /// after stop(), or from the proxy thread).
  std::uint64_t issued(std::size_t q) const { return issued_[q]; }

 private:
  status execute(work_request const& r) {
    switch (r.kind) {
      case request_kind::put: return backend_.put(r);
      case request_kind::signal: return backend_.signal(r);
      case request_kind::put_with_signal: {
        status const st = backend_.put(r);
        return st != status::ok ? st : backend_.signal(r);
      }
      case request_kind::get: return backend_.get(r);
      case request_kind::put_inline: {
        if constexpr (InlineBackend<B>) {
          status const st = backend_.put_inline(r, std::span<std::byte const>(payload_, r.bytes));
          return st != status::ok || r.value == 0 ? st : backend_.signal(r);
        } else {
          return status::invalid_argument;  // this backend carries no inline puts
        }
      }
      default: return status::invalid_argument;
    }
  }

  static std::string describe(work_request const& r) {
    static char const* const kinds[] = {"none", "put", "signal", "put_with_signal", "get", "put_inline"};
    auto const k = static_cast<std::uint32_t>(r.kind);
    std::string s = k < 6 ? kinds[k] : "unknown kind " + std::to_string(k);
    if (r.kind == request_kind::put_inline && !InlineBackend<B>) s += " (this backend takes no inline puts)";
    s += " peer " + std::to_string(r.peer) + " src " + std::to_string(r.src_offset) + " dst " +
         std::to_string(r.dst_offset) + " bytes " + std::to_string(r.bytes) + " flag " +
         std::to_string(r.flag_index) + " value " + std::to_string(r.value);
    return s;
  }

  // The proxy's error and message are set before the queue's error word, so a producer that sees
  // its queue failed also sees why. Runs on the proxy's thread only (or run_once's caller).
  void record(status st, std::string const& what, std::size_t q) {
    if (error_.load(std::memory_order_relaxed) == 0) {
      std::lock_guard<std::mutex> lock(mu_);
      message_ = std::string("proxy: ") + std::string(name(st)) + ": " + what;
      error_.store(static_cast<std::uint32_t>(st), std::memory_order_release);
    }
    if (q < failed_.size() && !failed_[q]) {
      failed_[q] = true;
      if (queues_[q].ctl) queues_[q].fail(st);
    }
  }

  void loop() {
    std::uint32_t idle = 0;
    while (!stop_requested_.load(std::memory_order_acquire)) {
      if (run_once()) {
        idle = 0;
      } else if (++idle > cfg_.idle_spins) {
        std::this_thread::sleep_for(std::chrono::nanoseconds(cfg_.idle_sleep_ns));
      }
    }
    // Drain: what the producers published before stop, then the backend's outstanding work.
    std::uint64_t const deadline = clock_ns() + cfg_.drain_timeout_ns;
    for (;;) {
      bool const did = run_once();
      if (!did && outstanding_ == 0) return;
      if (clock_ns() >= deadline) {
        if (outstanding_ != 0)
          for (std::size_t q = 0; q < queues_.size(); ++q)
            record(status::timeout, std::to_string(outstanding_) + " operations still outstanding at stop", q);
        return;
      }
      if (!did) std::this_thread::sleep_for(std::chrono::nanoseconds(cfg_.idle_sleep_ns));
    }
  }

  B& backend_;
  std::byte payload_[max_inline_bytes];  ///< the inline put being executed
  std::vector<work_queue_view> queues_;
  std::vector<std::uint64_t> issued_;
  std::vector<bool> failed_;
  proxy_config cfg_;
  std::uint64_t outstanding_ = 0;
  std::atomic<bool> stop_requested_{false};
  bool stopped_ = false;
  std::atomic<std::uint32_t> error_{0};
  mutable std::mutex mu_;
  std::string message_;
  std::thread thread_;
};

}  // namespace reccl::proxy
