// reccl/host/pool.hpp -- the prewarmed communicator pool: every parallel shape the engine may switch
// to is built, warmed and priced at start-up; a switch at a step boundary is a handle swap; retired
// shapes are torn down on a background thread under a time bound.
//
//   start-up: build() (collective: every rank, same shapes, same order)
//   ┌──────────────────────────────────────────────────────────────────────────────────────┐
//   │ for each shape S, in declared order:                                                 │
//   │   m0 = backend.memory_in_use()                                                       │
//   │   g  = backend.build(S, the group holding this rank)   split from the parent          │
//   │   backend.warm(g)                                      pays every lazy connect now    │
//   │   bytes[S] = max over ranks (m1 - m0)     the same verdict on every rank:            │
//   │   max over ranks of the running total > budget  ->  pool_error naming S              │
//   └──────────────────────────────────────────────────────────────────────────────────────┘
//   step boundary: switch_to(S)              (owner thread; no backend call but one check)
//   ┌──────────────────────────────────────────────────────────────────────────────────────┐
//   │ old shape still has collectives in flight?  busy_policy::wait -> bounded wait,       │
//   │                                             busy_policy::fail -> pool_error          │
//   │ active = S;  return S's group (the ready handles)                                    │
//   └──────────────────────────────────────────────────────────────────────────────────────┘
//   retire(S) -> queue ──▶ background thread: one job at a time, each on its own worker
//                          thread; past retire_bound the job is abandoned and reported (never
//                          waited on forever); shutdown() drains under shutdown_bound and says
//                          what it could not release
//
// The pool is generic over a PoolBackend that knows how to build, warm, measure and tear down one
// group: cpu/pool_backend.hpp (groups are CPU-engine communicators over thread-ranks; CI tests the
// pool's logic with it) and host/pool/nccl_backend.hpp (ncclCommSplit + reccl's NVLink
// communicator + symmetric windows + warm-up collectives, cudaMemGetInfo deltas, finalize /
// revoke / abort in the background).
//
// Threads: build(), rebuild(), switch_to(), retire() and shutdown() belong to one owner thread per
// rank (the engine's); retirements(), drain() and the backend's in-flight checks may run anywhere.
// The background thread touches only the retirement queue and records, never the shape table, so
// the switch takes no lock. Plain C++20: no CUDA, no NCCL in this header.
#pragma once

#include <algorithm>
#include <chrono>
#include <concepts>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "../types.hpp"

namespace reccl {

// ---- shapes -----------------------------------------------------------------------------------

/// One parallel shape: a partition of the world's ranks into groups. A group's communicator ranks
/// its members in the order listed (member k is rank k of the group).
struct shape {
  std::string name;
  std::vector<std::vector<int>> groups;
};

/// Index of a shape in the pool (its position in pool_options::shapes).
using shape_id = int;

/// Error of a pool operation: what went wrong and, where one is concerned, the shape's name.
/// what() reads e.g. "reccl pool invalid_argument (shape 'TP4x2'): rank 3 appears in groups 0 and 1".
class pool_error : public std::runtime_error {
 public:
  pool_error(status code, std::string shape_name, std::string const& detail)
      : std::runtime_error(compose(code, shape_name, detail)), code_(code), shape_(std::move(shape_name)) {}
  status code() const noexcept { return code_; }
  /// The shape concerned, empty if none.
  std::string const& shape_name() const noexcept { return shape_; }

 private:
  static std::string compose(status code, std::string const& shape_name, std::string const& detail) {
    std::string s = "reccl pool ";
    s += name(code);
    if (!shape_name.empty()) s += " (shape '" + shape_name + "')";
    return s + ": " + detail;
  }
  status code_;
  std::string shape_;
};

/// Groups of `tp` consecutive ranks: {0..tp-1}, {tp..2tp-1}, ...; named "TP<tp>" when one group
/// holds the world, else "TP<tp>x<groups>" (TP8, TP4x2, TP2x4, TP1x8 on 8 ranks). Throws
/// pool_error(invalid_argument) unless 1 <= tp <= world and tp divides world.
inline shape tensor_parallel(int world, int tp) {
  if (world < 1 || tp < 1 || tp > world || world % tp != 0)
    throw pool_error(status::invalid_argument, "",
                     "tensor_parallel: TP degree " + std::to_string(tp) + " must divide the world size " +
                         std::to_string(world));
  shape s;
  int const n = world / tp;
  s.name = "TP" + std::to_string(tp) + (n == 1 ? std::string() : "x" + std::to_string(n));
  for (int g = 0; g < n; ++g) {
    std::vector<int> members;
    for (int k = 0; k < tp; ++k) members.push_back(g * tp + k);
    s.groups.push_back(std::move(members));
  }
  return s;
}

/// Every tensor-parallel shape of `world` ranks, widest first (each divisor of world once).
inline std::vector<shape> tensor_parallel_shapes(int world) {
  std::vector<shape> v;
  for (int tp = world; tp >= 1; --tp)
    if (world % tp == 0) v.push_back(tensor_parallel(world, tp));
  return v;
}

/// Throws pool_error(invalid_argument), naming the shape, unless its groups partition the ranks
/// [0, world): no empty group, every rank in range, every rank in exactly one group.
inline void validate_shape(shape const& s, int world) {
  auto bad = [&](std::string const& what) { throw pool_error(status::invalid_argument, s.name, what); };
  if (s.name.empty()) throw pool_error(status::invalid_argument, "", "a shape has no name");
  if (world < 1) bad("world size " + std::to_string(world) + " must be at least 1");
  if (s.groups.empty()) bad("the shape has no groups");
  std::vector<int> owner(static_cast<std::size_t>(world), -1);
  for (std::size_t g = 0; g < s.groups.size(); ++g) {
    if (s.groups[g].empty()) bad("group " + std::to_string(g) + " is empty");
    for (int r : s.groups[g]) {
      if (r < 0 || r >= world)
        bad("group " + std::to_string(g) + " names rank " + std::to_string(r) + ", outside [0, " + std::to_string(world) +
            ")");
      int& o = owner[static_cast<std::size_t>(r)];
      if (o >= 0)
        bad("rank " + std::to_string(r) + " appears in groups " + std::to_string(o) + " and " + std::to_string(g) +
            " (groups must not overlap)");
      o = static_cast<int>(g);
    }
  }
  for (int r = 0; r < world; ++r)
    if (owner[static_cast<std::size_t>(r)] < 0)
      bad("rank " + std::to_string(r) + " is in no group (the groups must cover every rank)");
}

/// validate_shape() for each shape, plus: at least one shape, names unique.
inline void validate_shapes(std::vector<shape> const& shapes, int world) {
  if (shapes.empty()) throw pool_error(status::invalid_argument, "", "the pool needs at least one shape");
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    validate_shape(shapes[i], world);
    for (std::size_t j = 0; j < i; ++j)
      if (shapes[j].name == shapes[i].name)
        throw pool_error(status::invalid_argument, shapes[i].name, "two shapes have this name");
  }
}

// ---- the backend concept ------------------------------------------------------------------------

/// What the pool asks a backend to build: one group of one shape, seen from one rank.
struct group_spec {
  shape_id shape_index = 0;
  std::string_view shape_name;
  int group_index = 0;                ///< which group of the shape holds this rank (the split colour)
  std::span<int const> members;       ///< the group's world ranks, in group-rank order
  int position = 0;                   ///< this rank's rank inside the group (the split key)
  int world_rank = 0, world_size = 0;
  std::uint64_t build_seq = 0;        ///< counts group builds of the pool; equal on every rank
};

/// How a group is torn down: finalize (flush, then destroy), revoke (stop in-flight work, then
/// destroy; needs NCCL >= 2.28.7) or abort.
enum class teardown_kind : std::uint8_t { finalize, revoke, abort };

constexpr std::string_view name(teardown_kind k) {
  switch (k) {
    case teardown_kind::finalize: return "finalize";
    case teardown_kind::revoke: return "revoke";
    case teardown_kind::abort: return "abort";
  }
  return "?";
}

/// What a teardown job reports.
struct teardown_outcome {
  bool ok = true;
  teardown_kind used = teardown_kind::finalize;  ///< what actually ran (a failed finalize escalates)
  std::string message;                           ///< empty when ok and nothing worth saying
};

/// A job that releases one group; self-contained (it may outlive the backend and the pool when
/// it is abandoned), runs on a worker thread of its own.
using teardown_job = std::function<teardown_outcome()>;

/// A pool backend: builds, warms, measures and tears down the groups of one rank.
///  * build(spec)       collective over the world (every rank calls it for every shape, in order)
///  * warm(g)           collective over the group: one collective per transport in use
///  * memory_in_use()   bytes in use on this rank's device (the pool takes deltas)
///  * agree_max(v)      max of v over the world (collective; every rank gets the same value)
///  * in_flight(g)      whether work issued on g on this rank has not completed (cheap, lock-free)
///  * wait_idle(g, t)   wait until !in_flight(g) or the deadline; true if idle
///  * make_teardown(g, k) a teardown_job that releases g's resources
template <class B>
concept PoolBackend =
    std::movable<typename B::group> &&
    requires(B& b, B const& cb, typename B::group& g, group_spec const& spec, std::uint64_t v,
             std::chrono::steady_clock::time_point deadline, teardown_kind k) {
      { cb.world_rank() } -> std::convertible_to<int>;
      { cb.world_size() } -> std::convertible_to<int>;
      { b.build(spec) } -> std::same_as<typename B::group>;
      b.warm(g);
      { b.memory_in_use() } -> std::convertible_to<std::uint64_t>;
      { b.agree_max(v) } -> std::convertible_to<std::uint64_t>;
      { b.in_flight(g) } -> std::convertible_to<bool>;
      { b.wait_idle(g, deadline) } -> std::convertible_to<bool>;
      { b.make_teardown(std::move(g), k) } -> std::convertible_to<teardown_job>;
    };

// ---- options and reports --------------------------------------------------------------------

/// What switch_to() does when the shape it leaves still has collectives in flight on this rank.
enum class busy_policy : std::uint8_t {
  wait,  ///< wait for them, at most pool_options::switch_wait, then pool_error(timeout)
  fail,  ///< pool_error(invalid_argument) at once; the active shape stays
};

struct pool_options {
  std::vector<shape> shapes;                         ///< the shapes to prepare, in build order
  std::uint64_t memory_budget_bytes = 0;             ///< per rank, all shapes together; 0: no limit
  busy_policy on_busy = busy_policy::wait;
  std::chrono::nanoseconds switch_wait = std::chrono::seconds(1);
  std::chrono::nanoseconds retire_bound = std::chrono::seconds(5);     ///< per retirement
  std::chrono::nanoseconds shutdown_bound = std::chrono::seconds(10);  ///< whole shutdown
};

enum class shape_state : std::uint8_t { unbuilt, ready, retired };

/// One shape as this rank sees it.
struct shape_report {
  std::string name;
  int groups = 0;
  int my_group = -1, my_group_size = 0;
  shape_state state = shape_state::unbuilt;
  std::uint64_t bytes = 0;       ///< device memory of building + warming it: max over ranks of the delta
  std::uint64_t bytes_mine = 0;  ///< ... on this rank
  std::uint64_t build_ns = 0;    ///< this rank's wall time of build + warm (the last build)
  std::uint64_t builds = 0;      ///< times built (rebuild() adds one)
};

enum class retirement_state : std::uint8_t {
  queued,
  running,
  released,        ///< the teardown finished within its bound
  failed,          ///< it finished within its bound but reported an error (message)
  abandoned,       ///< still running past its bound: the pool stopped waiting (resources may leak)
  released_late,   ///< abandoned, then finished after all
  not_started,     ///< still queued when shutdown's bound passed
};

constexpr std::string_view name(retirement_state s) {
  switch (s) {
    case retirement_state::queued: return "queued";
    case retirement_state::running: return "running";
    case retirement_state::released: return "released";
    case retirement_state::failed: return "failed";
    case retirement_state::abandoned: return "abandoned";
    case retirement_state::released_late: return "released_late";
    case retirement_state::not_started: return "not_started";
  }
  return "?";
}

/// One retirement, in queue order (seq). Times are nanoseconds since the pool was made.
struct retirement_record {
  std::uint64_t seq = 0;
  std::string shape;
  teardown_kind requested = teardown_kind::finalize, used = teardown_kind::finalize;
  retirement_state state = retirement_state::queued;
  std::uint64_t queued_ns = 0, started_ns = 0, finished_ns = 0;
  std::string message;
  /// Background time of the teardown (0 until it finished).
  std::uint64_t teardown_ns() const { return finished_ns > started_ns ? finished_ns - started_ns : 0; }
};

/// What shutdown() could and could not release.
struct shutdown_report {
  std::vector<retirement_record> records;  ///< every retirement of the pool's life, in order
  std::uint64_t elapsed_ns = 0;
  /// Retirements that did not end released (failed, abandoned, not started).
  std::vector<retirement_record> unreleased() const {
    std::vector<retirement_record> v;
    for (auto const& r : records)
      if (r.state != retirement_state::released && r.state != retirement_state::released_late) v.push_back(r);
    return v;
  }
  bool clean() const { return unreleased().empty(); }
  /// "all N released" or one line per retirement not released.
  std::string describe() const {
    auto u = unreleased();
    if (u.empty()) return "all " + std::to_string(records.size()) + " retirements released";
    std::string s = "could not release:";
    for (auto const& r : u)
      s += "\n  " + r.shape + " (" + std::string(name(r.requested)) + "): " + std::string(name(r.state)) +
           (r.message.empty() ? "" : " -- " + r.message);
    return s;
  }
};

/// Why a shape is retired: a healthy shape is finalized; a failed one is revoked where the backend
/// can, else aborted.
enum class retire_reason : std::uint8_t { normal, failed };

// ---- the pool -----------------------------------------------------------------------------------

namespace detail {

/// The retirement machinery shared by the pool, its background thread and the worker threads.
struct retire_ticket {
  std::mutex m;
  std::condition_variable cv;
  bool done = false, cancel = false;
  teardown_outcome out;
  std::chrono::steady_clock::time_point finished{};
};

struct retire_state {
  std::mutex m;
  std::condition_variable cv;
  struct job {
    std::size_t record = 0;
    teardown_job fn;
  };
  std::deque<job> queue;
  bool stopping = false, hard_stop = false, busy = false;
  std::shared_ptr<retire_ticket> current;
  std::vector<retirement_record> records;
  std::vector<std::pair<std::size_t, std::shared_ptr<retire_ticket>>> abandoned;
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  std::chrono::nanoseconds bound{};

  std::uint64_t since_t0(std::chrono::steady_clock::time_point t) const {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(t - t0).count());
  }
  /// Folds late completions of abandoned jobs into their records (caller holds m).
  void refresh_abandoned() {
    for (auto it = abandoned.begin(); it != abandoned.end();) {
      std::shared_ptr<retire_ticket> const t = it->second;  // outlives the erase below
      bool done = false;
      {
        std::lock_guard tl(t->m);
        done = t->done;
        if (done) {
          auto& r = records[it->first];
          r.state = retirement_state::released_late;
          r.used = t->out.used;
          r.finished_ns = since_t0(t->finished);
          if (!t->out.ok) r.message += "; finished late with: " + t->out.message;
        }
      }
      it = done ? abandoned.erase(it) : it + 1;
    }
  }
};

/// Runs the queue: one job at a time, each on a detached worker, waited for at most `bound`.
inline void retire_loop(std::shared_ptr<retire_state> st) {
  std::unique_lock lk(st->m);
  for (;;) {
    st->cv.wait(lk, [&] { return !st->queue.empty() || st->stopping || st->hard_stop; });
    if (st->hard_stop || (st->queue.empty() && st->stopping)) break;
    retire_state::job j = std::move(st->queue.front());
    st->queue.pop_front();
    st->busy = true;
    auto const start = std::chrono::steady_clock::now();
    {
      auto& r = st->records[j.record];
      r.state = retirement_state::running;
      r.started_ns = st->since_t0(start);
    }
    auto t = std::make_shared<retire_ticket>();
    st->current = t;
    lk.unlock();

    // The job runs on a thread of its own so that a teardown stuck inside a library call can be
    // abandoned: this thread stops waiting at the bound and moves on; the worker keeps only the
    // ticket and the job's own state alive.
    try {
      std::thread([t, fn = std::move(j.fn)]() mutable {
        teardown_outcome o;
        try {
          o = fn();
        } catch (std::exception const& e) {
          o.ok = false;
          o.message = e.what();
        } catch (...) {
          o.ok = false;
          o.message = "unknown exception";
        }
        fn = nullptr;  // release the group's resources before reporting completion
        {
          std::lock_guard tl(t->m);
          t->out = std::move(o);
          t->done = true;
          t->finished = std::chrono::steady_clock::now();
        }
        t->cv.notify_all();
      }).detach();
    } catch (std::exception const& e) {
      std::lock_guard tl(t->m);
      t->out.ok = false;
      t->out.message = std::string("could not start a teardown thread: ") + e.what();
      t->done = true;
      t->finished = std::chrono::steady_clock::now();
    }
    bool done = false;
    {
      std::unique_lock tl(t->m);
      t->cv.wait_until(tl, start + st->bound, [&] { return t->done || t->cancel; });
      done = t->done;
    }

    lk.lock();
    st->current.reset();
    st->busy = false;
    auto& r = st->records[j.record];
    if (done) {
      std::lock_guard tl(t->m);
      r.state = t->out.ok ? retirement_state::released : retirement_state::failed;
      r.used = t->out.used;
      r.message = t->out.message;
      r.finished_ns = st->since_t0(t->finished);
    } else {
      r.state = retirement_state::abandoned;
      double const s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      r.message = "teardown still running after " + std::to_string(s) + " s (bound " +
                  std::to_string(std::chrono::duration<double>(st->bound).count()) + " s); abandoned";
      st->abandoned.emplace_back(j.record, t);
    }
    st->cv.notify_all();
  }
  st->busy = false;
  st->cv.notify_all();
}

inline std::uint64_t ns_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(b - a).count());
}

}  // namespace detail

/// The pool of one rank (see the file comment). Backend B is held by reference and must outlive
/// the pool's build/switch/retire calls; teardown jobs it makes must not refer to it.
template <PoolBackend B>
class communicator_pool {
 public:
  using group = typename B::group;

  /// Validates the shapes against the backend's world (pool_error naming the bad shape) and starts
  /// the background thread. Builds nothing: call build().
  communicator_pool(B& backend, pool_options opts) : b_(backend), opt_(std::move(opts)) {
    validate_shapes(opt_.shapes, b_.world_size());
    if (opt_.retire_bound <= std::chrono::nanoseconds::zero() || opt_.shutdown_bound <= std::chrono::nanoseconds::zero() ||
        opt_.switch_wait < std::chrono::nanoseconds::zero())
      throw pool_error(status::invalid_argument, "", "retire_bound and shutdown_bound must be positive, switch_wait >= 0");
    int const me = b_.world_rank();
    slots_.resize(opt_.shapes.size());
    for (std::size_t i = 0; i < opt_.shapes.size(); ++i) {
      auto const& s = opt_.shapes[i];
      auto& sl = slots_[i];
      for (std::size_t g = 0; g < s.groups.size(); ++g)
        for (std::size_t k = 0; k < s.groups[g].size(); ++k)
          if (s.groups[g][k] == me) {
            sl.my_group = static_cast<int>(g);
            sl.position = static_cast<int>(k);
          }
    }
    rs_ = std::make_shared<detail::retire_state>();
    rs_->bound = opt_.retire_bound;
    thread_ = std::thread(detail::retire_loop, rs_);
  }

  communicator_pool(communicator_pool const&) = delete;
  communicator_pool& operator=(communicator_pool const&) = delete;

  /// Shuts down (bounded) if shutdown() was not called.
  ~communicator_pool() {
    if (!shut_down_) shutdown();
  }

  /// Builds and warms every shape, in order, and checks the memory budget after each (collective:
  /// every rank calls it). On error -- a group that fails to build or warm on any rank, or the
  /// budget exceeded -- every rank throws pool_error naming the shape, and what was built is
  /// retired in the background. Call once.
  void build() {
    if (built_) throw pool_error(status::invalid_argument, "", "build() was already called");
    built_ = true;
    for (std::size_t i = 0; i < slots_.size(); ++i) build_one(static_cast<shape_id>(i));
  }

  /// Builds again a shape that was retired (collective, same checks as build()).
  void rebuild(shape_id id) {
    check_id(id);
    if (slots_[static_cast<std::size_t>(id)].state == shape_state::ready)
      throw pool_error(status::invalid_argument, name_of(id), "rebuild: the shape is already built");
    build_one(id);
  }

  /// The id of the shape called `name`; pool_error(invalid_argument) listing the pool's shapes if
  /// there is none.
  shape_id find(std::string_view name) const {
    for (std::size_t i = 0; i < opt_.shapes.size(); ++i)
      if (opt_.shapes[i].name == name) return static_cast<shape_id>(i);
    std::string list;
    for (auto const& s : opt_.shapes) list += (list.empty() ? "" : ", ") + s.name;
    throw pool_error(status::invalid_argument, std::string(name), "unknown shape (the pool holds: " + list + ")");
  }

  /// Makes `id` the active shape and returns this rank's group of it: the ready handles. A handle
  /// swap: no allocation, no lock, no collective; the only backend call is the in-flight check of
  /// the shape it leaves (see busy_policy). Local: each rank switches at its own step boundary;
  /// the collectives a rank then issues must match its group's.
  group& switch_to(shape_id id) { return switch_to(id, opt_.on_busy); }
  group& switch_to(std::string_view name) { return switch_to(find(name), opt_.on_busy); }
  /// switch_to() with this call's own busy policy.
  group& switch_to(shape_id id, busy_policy on_busy) {
    if (id < 0 || static_cast<std::size_t>(id) >= slots_.size()) unknown_id(id);
    auto& to = slots_[static_cast<std::size_t>(id)];
    if (to.state != shape_state::ready) not_ready(id);
    if (active_ >= 0 && active_ != id) {
      auto& from = slots_[static_cast<std::size_t>(active_)];
      if (b_.in_flight(*from.g)) {
        if (on_busy == busy_policy::fail)
          throw pool_error(status::invalid_argument, name_of(id),
                           "switch while a collective is still in flight on shape '" + name_of(active_) +
                               "' (busy_policy::fail): finish the step first, or use busy_policy::wait");
        if (!b_.wait_idle(*from.g, std::chrono::steady_clock::now() + opt_.switch_wait))
          throw pool_error(status::timeout, name_of(id),
                           "switch: collectives on shape '" + name_of(active_) + "' did not finish within " +
                               std::to_string(std::chrono::duration<double>(opt_.switch_wait).count()) + " s");
      }
    }
    active_ = id;
    ++switches_;
    return *to.g;
  }

  /// The active shape (-1 before the first switch).
  shape_id active_id() const { return active_; }
  /// This rank's group of the active shape; pool_error if none is active.
  group& active() {
    if (active_ < 0) throw pool_error(status::invalid_argument, "", "no shape is active: call switch_to() first");
    return *slots_[static_cast<std::size_t>(active_)].g;
  }
  /// This rank's group of a ready shape, without switching (e.g. to capture graphs ahead).
  group& at(shape_id id) {
    check_id(id);
    if (slots_[static_cast<std::size_t>(id)].state != shape_state::ready) not_ready(id);
    return *slots_[static_cast<std::size_t>(id)].g;
  }

  /// Queues the teardown of a shape and returns at once (the caller pays a queue push). The
  /// active shape cannot be retired (switch away first). All ranks must retire the same shapes in
  /// the same order: the teardowns are collective in the backend (finalize).
  void retire(shape_id id, retire_reason why = retire_reason::normal) {
    check_id(id);
    auto& sl = slots_[static_cast<std::size_t>(id)];
    if (sl.state != shape_state::ready)
      throw pool_error(status::invalid_argument, name_of(id), "retire: the shape is not built (or already retired)");
    if (id == active_)
      throw pool_error(status::invalid_argument, name_of(id), "retire: the shape is active; switch to another first");
    enqueue(id, why == retire_reason::failed ? teardown_kind::revoke : teardown_kind::finalize);
  }
  void retire(std::string_view name, retire_reason why = retire_reason::normal) { retire(find(name), why); }

  /// Waits until every queued retirement has finished or been abandoned; false if `bound` passed.
  bool drain(std::chrono::nanoseconds bound) {
    std::unique_lock lk(rs_->m);
    return rs_->cv.wait_for(lk, bound, [&] { return rs_->queue.empty() && !rs_->busy; });
  }

  /// Every retirement so far, in queue order (late completions of abandoned ones folded in).
  std::vector<retirement_record> retirements() const {
    std::lock_guard lk(rs_->m);
    rs_->refresh_abandoned();
    return rs_->records;
  }

  /// Retires every shape still built (the active one too; if it still has work in flight past
  /// the bound, it is aborted rather than finalized), drains the queue within shutdown_bound and
  /// stops the background thread. Never hangs: what is not released by then is abandoned and
  /// listed. Idempotent; the destructor calls it.
  shutdown_report shutdown() {
    if (shut_down_) return last_report_;
    shut_down_ = true;
    auto const t0 = std::chrono::steady_clock::now();
    auto const deadline = t0 + opt_.shutdown_bound;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      auto& sl = slots_[i];
      if (sl.state != shape_state::ready) continue;
      teardown_kind k = teardown_kind::finalize;
      if (static_cast<shape_id>(i) == active_ && b_.in_flight(*sl.g)) {
        // give the step a share of the bound, then stop it
        auto const wait_until = t0 + opt_.shutdown_bound / 4;
        if (!b_.wait_idle(*sl.g, wait_until)) k = teardown_kind::abort;
      }
      enqueue(static_cast<shape_id>(i), k);
    }
    active_ = -1;
    {
      std::unique_lock lk(rs_->m);
      rs_->stopping = true;
      rs_->cv.notify_all();
      bool const drained = rs_->cv.wait_until(lk, deadline, [&] { return rs_->queue.empty() && !rs_->busy; });
      if (!drained) {
        rs_->hard_stop = true;
        for (auto& j : rs_->queue) {
          auto& r = rs_->records[j.record];
          r.state = retirement_state::not_started;
          r.message = "still queued when the shutdown bound passed";
        }
        // The jobs hold the groups: dropping them here would run the teardowns on this thread.
        // Hand them to a detached thread that releases them in order (and so never blocks us).
        std::deque<detail::retire_state::job> rest;
        rest.swap(rs_->queue);
        if (!rest.empty()) {
          try {
            std::thread([q = std::move(rest)]() mutable { q.clear(); }).detach();
          } catch (...) {
            // no thread: leak the jobs rather than block the caller
            new std::deque<detail::retire_state::job>(std::move(rest));
          }
        }
        if (rs_->current) {
          std::lock_guard tl(rs_->current->m);
          rs_->current->cancel = true;
          rs_->current->cv.notify_all();
        }
        rs_->cv.notify_all();
      }
    }
    if (thread_.joinable()) thread_.join();
    for (auto& sl : slots_) sl.g.reset();
    shutdown_report rep;
    {
      std::lock_guard lk(rs_->m);
      rs_->refresh_abandoned();
      rep.records = rs_->records;
    }
    rep.elapsed_ns = detail::ns_between(t0, std::chrono::steady_clock::now());
    last_report_ = rep;
    return rep;
  }

  /// Every shape as this rank sees it.
  std::vector<shape_report> report() const {
    std::vector<shape_report> v;
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      auto const& sl = slots_[i];
      shape_report r;
      r.name = opt_.shapes[i].name;
      r.groups = static_cast<int>(opt_.shapes[i].groups.size());
      r.my_group = sl.my_group;
      r.my_group_size = static_cast<int>(opt_.shapes[i].groups[static_cast<std::size_t>(sl.my_group)].size());
      r.state = sl.state;
      r.bytes = sl.bytes;
      r.bytes_mine = sl.bytes_mine;
      r.build_ns = sl.build_ns;
      r.builds = sl.builds;
      v.push_back(std::move(r));
    }
    return v;
  }

  /// Device memory of every shape now built: sum over them of max-over-ranks bytes.
  std::uint64_t bytes_in_use() const {
    std::uint64_t s = 0;
    for (auto const& sl : slots_)
      if (sl.state == shape_state::ready) s += sl.bytes;
    return s;
  }

  std::size_t size() const { return slots_.size(); }
  shape const& shape_of(shape_id id) const {
    check_id(id);
    return opt_.shapes[static_cast<std::size_t>(id)];
  }
  pool_options const& options() const { return opt_; }
  std::uint64_t switches() const { return switches_; }
  B& backend() { return b_; }

 private:
  struct slot {
    std::optional<group> g;
    shape_state state = shape_state::unbuilt;
    int my_group = -1, position = 0;
    std::uint64_t bytes = 0, bytes_mine = 0, build_ns = 0, builds = 0;
  };

  std::string const& name_of(shape_id id) const { return opt_.shapes[static_cast<std::size_t>(id)].name; }

  void check_id(shape_id id) const {
    if (id < 0 || static_cast<std::size_t>(id) >= slots_.size()) unknown_id(id);
  }
  [[noreturn]] void unknown_id(shape_id id) const {
    throw pool_error(status::invalid_argument, "",
                     "unknown shape id " + std::to_string(id) + " (the pool holds " + std::to_string(slots_.size()) +
                         " shapes)");
  }
  [[noreturn]] void not_ready(shape_id id) const {
    auto const st = slots_[static_cast<std::size_t>(id)].state;
    throw pool_error(status::invalid_argument, name_of(id),
                     st == shape_state::retired ? "the shape was retired (rebuild() it first)"
                                                : "the shape is not built (call build() first)");
  }

  void build_one(shape_id id) {
    auto& sl = slots_[static_cast<std::size_t>(id)];
    auto const& s = opt_.shapes[static_cast<std::size_t>(id)];
    auto const& members = s.groups[static_cast<std::size_t>(sl.my_group)];
    group_spec spec;
    spec.shape_index = id;
    spec.shape_name = s.name;
    spec.group_index = sl.my_group;
    spec.members = std::span<int const>(members.data(), members.size());
    spec.position = sl.position;
    spec.world_rank = b_.world_rank();
    spec.world_size = b_.world_size();
    spec.build_seq = build_seq_++;

    std::string local_error;
    std::uint64_t delta = 0;
    auto const t0 = std::chrono::steady_clock::now();
    try {
      std::uint64_t const m0 = b_.memory_in_use();
      group g = b_.build(spec);
      sl.g.emplace(std::move(g));
      b_.warm(*sl.g);
      std::uint64_t const m1 = b_.memory_in_use();
      delta = m1 > m0 ? m1 - m0 : 0;  // a concurrent release can make it negative: count 0
    } catch (std::exception const& e) {
      local_error = e.what();
    }
    auto const t1 = std::chrono::steady_clock::now();
    if (sl.g) sl.state = shape_state::ready;  // retire path below needs it marked built

    // Every rank reaches the same verdict: a failure anywhere fails the shape everywhere.
    std::uint64_t constexpr failed = ~std::uint64_t{0};
    std::uint64_t const agreed = b_.agree_max(local_error.empty() ? delta : failed);
    if (agreed == failed) {
      release_after_error(id);
      throw pool_error(status::internal, s.name,
                       local_error.empty() ? "building or warming the shape failed on another rank"
                                           : "building or warming the shape failed: " + local_error);
    }
    sl.bytes = agreed;
    sl.bytes_mine = delta;
    sl.build_ns = detail::ns_between(t0, t1);
    ++sl.builds;
    mine_total_ += delta;
    std::uint64_t const total = b_.agree_max(mine_total_);
    if (opt_.memory_budget_bytes != 0 && total > opt_.memory_budget_bytes) {
      release_after_error(id);
      throw pool_error(status::invalid_argument, s.name,
                       "memory budget exceeded: the shape takes " + std::to_string(agreed) +
                           " bytes per rank (max over ranks), bringing the pool to " + std::to_string(total) +
                           " bytes on the busiest rank, above the budget of " + std::to_string(opt_.memory_budget_bytes) +
                           " bytes");
    }
  }

  /// After a failed build: retire every shape built so far, including `failing` if it was built.
  void release_after_error(shape_id failing) {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      auto& sl = slots_[i];
      if (sl.state != shape_state::ready) continue;
      bool const bad = static_cast<shape_id>(i) == failing;
      if (static_cast<shape_id>(i) == active_) active_ = -1;
      enqueue(static_cast<shape_id>(i), bad ? teardown_kind::revoke : teardown_kind::finalize);
    }
  }

  void enqueue(shape_id id, teardown_kind k) {
    auto& sl = slots_[static_cast<std::size_t>(id)];
    group g = std::move(*sl.g);
    sl.g.reset();
    sl.state = shape_state::retired;
    mine_total_ -= std::min(mine_total_, sl.bytes_mine);
    teardown_job job = b_.make_teardown(std::move(g), k);
    std::lock_guard lk(rs_->m);
    retirement_record r;
    r.seq = rs_->records.size();
    r.shape = name_of(id);
    r.requested = r.used = k;
    r.queued_ns = rs_->since_t0(std::chrono::steady_clock::now());
    rs_->records.push_back(std::move(r));
    rs_->queue.push_back({rs_->records.size() - 1, std::move(job)});
    rs_->cv.notify_all();
  }

  B& b_;
  pool_options opt_;
  std::vector<slot> slots_;
  shape_id active_ = -1;
  std::uint64_t switches_ = 0;
  std::uint64_t build_seq_ = 0;
  std::uint64_t mine_total_ = 0;
  bool built_ = false, shut_down_ = false;
  shutdown_report last_report_;
  std::shared_ptr<detail::retire_state> rs_;
  std::thread thread_;
};

}  // namespace reccl
