// reccl/cpu/pool_backend.hpp -- the CPU-engine backend of the communicator pool (host/pool.hpp):
// each group of a shape is a CPU communicator over the thread-ranks it lists, so CI runs the pool's
// logic (shape validation, switch semantics, retirement ordering and bounds, budget errors) with
// real collectives and no GPU.
//
//   pool_world (shared by the N rank threads of one process)
//   ┌──────────────────────────────────────────────────────────────────────────────────┐
//   │ rendezvous   (build_seq, group) -> the group's cpu::communicator, made by the   │
//   │              first member to arrive, shared by the others (as a split would)    │
//   │ all_max      generation-counted max over the world (the pool's agreement step)  │
//   │ bytes[r]     memory rank r's live groups hold (FIFO areas, windows, the engine's │
//   │              internal buffers as the warm-up left them)                          │
//   │ log          teardowns in completion order (shape, group, rank, kind)            │
//   └──────────────────────────────────────────────────────────────────────────────────┘
//   pool_backend (one per rank thread): build = rendezvous + windows; warm = one all-reduce
//   checked against its exact value; teardown = wait for the rank's in-flight collectives, then
//   drop the rank's share (the communicator goes with the last member).
//
// Hooks (pool_hooks) make a teardown slow or stuck, or a build fail on one rank, so tests can
// check the pool's bounds and error agreement.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../error.hpp"
#include "../host/pool.hpp"
#include "../policy/allocator/equal.hpp"
#include "../policy/schedule/ring.hpp"
#include "../policy/telemetry/none.hpp"
#include "communicator.hpp"
#include "engine.hpp"

namespace reccl::cpu {

/// Fault injection for the pool's tests.
struct pool_hooks {
  std::chrono::nanoseconds teardown_delay{0};  ///< every teardown sleeps this long (a slow destroy)
  /// When set, a teardown blocks until *teardown_gate is true (a destroy that hangs).
  std::shared_ptr<std::atomic<bool>> teardown_gate;
  int fail_build_rank = -1;                    ///< build() throws on this world rank ...
  std::string fail_build_shape;                ///< ... for the shape of this name
};

/// What the rank threads of one CPU pool share (see the file comment). Hold it by shared_ptr:
/// teardown jobs keep it alive.
class pool_world {
 public:
  /// `nranks` thread-ranks; agreement waits give up after `agree_timeout`.
  explicit pool_world(int nranks, std::chrono::nanoseconds agree_timeout = std::chrono::seconds(30))
      : n_(nranks), agree_timeout_(agree_timeout), bytes_(static_cast<std::size_t>(nranks > 0 ? nranks : 0)) {
    if (nranks < 1 || nranks > max_ranks)
      throw error(status::invalid_argument, "pool_world: nranks " + std::to_string(nranks) + " outside [1, " +
                                                std::to_string(max_ranks) + "]");
  }
  pool_world(pool_world const&) = delete;
  pool_world& operator=(pool_world const&) = delete;

  int size() const { return n_; }

  /// Max of v over every rank (each rank calls it once per round, rounds in the same order).
  /// Throws reccl::error(timeout) if a rank does not arrive within the agreement timeout; the
  /// agreement is then broken for good (a half-counted round cannot be resumed), so every later
  /// call on any rank throws at once.
  std::uint64_t all_max(int rank, std::uint64_t v) {
    std::unique_lock lk(m_);
    auto broken = [&] {
      return error(status::timeout, "pool agreement: a rank did not arrive within the timeout in an earlier round", rank);
    };
    if (broken_) throw broken();
    std::uint64_t const gen = gen_;
    acc_ = arrived_ == 0 ? v : std::max(acc_, v);
    if (++arrived_ == n_) {
      result_ = acc_;
      arrived_ = 0;
      ++gen_;
      cv_.notify_all();
      return result_;
    }
    if (!cv_.wait_for(lk, agree_timeout_, [&] { return gen_ != gen || broken_; })) {
      broken_ = true;
      cv_.notify_all();
      throw error(status::timeout, "pool agreement: not every rank arrived within the timeout", rank);
    }
    if (gen_ == gen) throw broken();
    return result_;  // valid until the next round completes, which needs this rank again
  }

  /// The communicator of group (build_seq, group_index): the first member to ask makes it with
  /// `cfg`, every member gets the same one.
  std::shared_ptr<communicator> rendezvous(std::uint64_t build_seq, int group_index, int members, config const& cfg) {
    std::lock_guard lk(m_);
    auto key = std::make_pair(build_seq, group_index);
    auto it = groups_.find(key);
    if (it == groups_.end()) {
      config c = cfg;
      c.nranks = members;
      it = groups_.emplace(key, entry{std::make_shared<communicator>(std::move(c)), 0}).first;
    }
    std::shared_ptr<communicator> comm = it->second.comm;
    if (++it->second.joined == members) groups_.erase(it);
    return comm;
  }

  /// Bytes rank r's live groups hold.
  std::uint64_t bytes(int rank) const { return bytes_[static_cast<std::size_t>(rank)].load(); }
  void add_bytes(int rank, std::uint64_t b) { bytes_[static_cast<std::size_t>(rank)] += b; }
  void sub_bytes(int rank, std::uint64_t b) { bytes_[static_cast<std::size_t>(rank)] -= b; }

  /// Teardowns in completion order: "shape/group g/rank r/kind".
  std::vector<std::string> teardown_log() const {
    std::lock_guard lk(log_m_);
    return log_;
  }
  void log_teardown(std::string s) {
    std::lock_guard lk(log_m_);
    log_.push_back(std::move(s));
  }

 private:
  struct entry {
    std::shared_ptr<communicator> comm;
    int joined = 0;
  };
  int n_;
  std::chrono::nanoseconds agree_timeout_;
  std::mutex m_;
  std::condition_variable cv_;
  std::uint64_t gen_ = 0, acc_ = 0, result_ = 0;
  int arrived_ = 0;
  bool broken_ = false;  ///< a round timed out: the agreement cannot be trusted again
  std::map<std::pair<std::uint64_t, int>, entry> groups_;
  std::vector<std::atomic<std::uint64_t>> bytes_;
  mutable std::mutex log_m_;
  std::vector<std::string> log_;
};

/// Settings of every group the CPU backend builds.
struct pool_backend_options {
  config group_config{};                  ///< CPU communicator geometry and timeouts (nranks is set per group)
  std::vector<std::size_t> window_bytes;  ///< buffers each member gets per group (the symmetric windows' stand-in)
  std::uint64_t warm_count = 4096;        ///< elements of the warm-up all-reduce (float)
  pool_hooks hooks{};
};

/// One rank's member of a built group: the CPU communicator, this rank's windows, and the count
/// of collectives it has in flight. Collectives go through run() (or all_reduce()) so that the
/// pool sees them.
class pool_group {
 public:
  int rank() const { return s_->position; }
  int size() const { return static_cast<int>(s_->members.size()); }
  /// World rank of group rank r.
  int world_rank(int r) const { return s_->members.at(static_cast<std::size_t>(r)); }
  std::string const& shape_name() const { return s_->shape; }
  int group_index() const { return s_->group_index; }
  communicator& comm() { return *s_->comm; }
  std::span<std::byte> window(std::size_t i) { return s_->windows.at(i); }
  std::size_t windows() const { return s_->windows.size(); }
  /// Memory this rank's share of the group holds (what the pool's accounting sees).
  std::uint64_t bytes() const { return s_->bytes; }
  /// Collectives this rank has started on the group and not finished.
  int in_flight() const { return s_->in_flight->load(std::memory_order_acquire); }

  /// Runs a collective of the CPU engine on this rank of the group (see cpu/engine.hpp), counted
  /// as in flight while it runs.
  template <collective Kind, class T, Schedule S = schedule::ring, Telemetry M = telemetry::none,
            Allocator A = allocator::equal>
  collective_result run(T const* send, T* recv, std::uint64_t count, redop op = redop::sum, int root = 0,
                        A const& alloc = A{}) {
    auto keep = s_;  // a retirement cannot free the communicator under a running collective
    keep->in_flight->fetch_add(1, std::memory_order_acq_rel);
    struct done {
      std::atomic<int>* c;
      ~done() { c->fetch_sub(1, std::memory_order_acq_rel); }
    } d{keep->in_flight.get()};
    return run_collective<Kind, T, S, M, A>(*keep->comm, keep->position, send, recv, count, op, root, alloc);
  }
  template <class T>
  collective_result all_reduce(T const* send, T* recv, std::uint64_t count, redop op = redop::sum) {
    return run<collective::all_reduce, T>(send, recv, count, op);
  }

 private:
  friend class pool_backend;
  struct state {
    std::shared_ptr<communicator> comm;
    std::vector<int> members;
    int position = 0, group_index = 0, world_rank = 0;
    std::string shape;
    std::vector<std::vector<std::byte>> windows;
    std::shared_ptr<std::atomic<int>> in_flight = std::make_shared<std::atomic<int>>(0);
    std::uint64_t bytes = 0;
  };
  std::shared_ptr<state> s_;
};

/// The PoolBackend of one rank thread (see the file comment).
class pool_backend {
 public:
  using group = pool_group;

  pool_backend(std::shared_ptr<pool_world> world, int world_rank, pool_backend_options opts = {})
      : w_(std::move(world)), rank_(world_rank), opt_(std::move(opts)) {
    if (!w_) throw error(status::invalid_argument, "pool_backend: no pool_world");
    if (rank_ < 0 || rank_ >= w_->size())
      throw error(status::invalid_argument,
                  "pool_backend: rank " + std::to_string(rank_) + " outside [0, " + std::to_string(w_->size()) + ")");
    if (opt_.warm_count == 0) throw error(status::invalid_argument, "pool_backend: warm_count must be positive");
  }

  int world_rank() const { return rank_; }
  int world_size() const { return w_->size(); }
  pool_world& world() { return *w_; }

  /// Makes (or joins) the group's communicator and this rank's windows.
  pool_group build(group_spec const& spec) {
    if (spec.world_rank == opt_.hooks.fail_build_rank && spec.shape_name == opt_.hooks.fail_build_shape)
      throw error(status::internal, "injected build failure of shape '" + std::string(spec.shape_name) + "'", rank_);
    pool_group g;
    g.s_ = std::make_shared<pool_group::state>();
    auto& s = *g.s_;
    s.members.assign(spec.members.begin(), spec.members.end());
    s.position = spec.position;
    s.group_index = spec.group_index;
    s.world_rank = rank_;
    s.shape = std::string(spec.shape_name);
    s.comm = w_->rendezvous(spec.build_seq, spec.group_index, static_cast<int>(spec.members.size()), opt_.group_config);
    for (std::size_t b : opt_.window_bytes) s.windows.emplace_back(b, std::byte{0x5a});
    return g;
  }

  /// One all-reduce over the group on pseudo-random integers in [-2000, 2000] (sums of up to
  /// max_ranks of them are exact in float, whatever the order), checked element by element; it also grows the engine's internal buffers, as a first
  /// NCCL collective allocates its connections. Then the group's memory is counted.
  void warm(pool_group& g) {
    auto& s = *g.s_;
    std::uint64_t const n = opt_.warm_count;
    int const members = static_cast<int>(s.members.size());
    auto value = [&](int pos, std::uint64_t i) {
      std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (static_cast<std::uint64_t>(pos) + 1) * 0xC2B2AE3D27D4EB4Full;
      x ^= x >> 29;
      return static_cast<float>(static_cast<std::int64_t>(x % 4001) - 2000);
    };
    std::vector<float> in(n), out(n, -1.0f);
    for (std::uint64_t i = 0; i < n; ++i) in[i] = value(s.position, i);
    g.all_reduce(in.data(), out.data(), n);
    for (std::uint64_t i = 0; i < n; ++i) {
      float expect = 0;
      for (int p = 0; p < members; ++p) expect += value(p, i);
      if (out[i] != expect)
        throw error(status::internal, "warm-up all-reduce of shape '" + s.shape + "' group " + std::to_string(s.group_index) +
                                          " gave " + std::to_string(out[i]) + " at " + std::to_string(i) + ", expected " +
                                          std::to_string(expect),
                    rank_);
    }
    s.bytes = measure(g);
    w_->add_bytes(rank_, s.bytes);
  }

  std::uint64_t memory_in_use() const { return w_->bytes(rank_); }
  std::uint64_t agree_max(std::uint64_t v) { return w_->all_max(rank_, v); }
  bool in_flight(pool_group const& g) const { return g.in_flight() > 0; }
  bool wait_idle(pool_group const& g, std::chrono::steady_clock::time_point deadline) const {
    while (g.in_flight() > 0) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
  }

  /// finalize: wait for this rank's in-flight collectives, then drop its share. revoke / abort:
  /// drop it at once (a running collective keeps the communicator alive until it returns).
  teardown_job make_teardown(pool_group&& g, teardown_kind k) {
    return [s = std::move(g.s_), w = w_, k, hooks = opt_.hooks]() mutable -> teardown_outcome {
      teardown_outcome o;
      o.used = k == teardown_kind::finalize ? teardown_kind::finalize : teardown_kind::abort;  // no revoke on CPU
      if (k == teardown_kind::finalize)
        while (s->in_flight->load(std::memory_order_acquire) > 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
      if (hooks.teardown_delay.count() > 0) std::this_thread::sleep_for(hooks.teardown_delay);
      if (hooks.teardown_gate)
        while (!hooks.teardown_gate->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      w->sub_bytes(s->world_rank, s->bytes);
      w->log_teardown(s->shape + "/group " + std::to_string(s->group_index) + "/rank " + std::to_string(s->world_rank) +
                      "/" + std::string(name(o.used)));
      s.reset();
      return o;
    };
  }

 private:
  /// This rank's share: its send and receive FIFO areas on every VT and peer, its windows and the
  /// engine's per-rank buffers as they stand.
  std::uint64_t measure(pool_group const& g) const {
    auto const& s = *g.s_;
    config const& c = s.comm->cfg();
    std::uint64_t b = 2ull * static_cast<std::uint64_t>(c.n_vts) * static_cast<std::uint64_t>(c.nranks) *
                      static_cast<std::uint64_t>(c.slots) * c.slot_bytes;
    for (auto const& w : s.windows) b += w.size();
    rank_state const& rs = s.comm->rank(s.position);
    b += rs.input_copy.capacity() + rs.work.capacity() + rs.scratch.capacity() + rs.probe_input.capacity() +
         rs.probe_work.capacity() + rs.probe_scratch.capacity();
    return b;
  }

  std::shared_ptr<pool_world> w_;
  int rank_;
  pool_backend_options opt_;
};

static_assert(PoolBackend<pool_backend>);

}  // namespace reccl::cpu
