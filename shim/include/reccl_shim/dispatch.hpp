// reccl_shim/dispatch.hpp -- what libreccl_nccl.so decides for each NCCL collective call: serve it
// with reccl or forward it to the real NCCL, when to build reccl's per-communicator state, and how
// calls inside ncclGroupStart/ncclGroupEnd are ordered. No CUDA and no NCCL here: the library's
// glue (shim/src/nccl_shim.cu) supplies a Backend, the tests a fake one.
//
// Per communicator, a state machine:  unknown --(first served call: create)--> ready
//                                            \--(creation fails)-------------> forwarded (for good)
// Every rank must take the same transitions at the same call, so the decisions depend only on what
// every rank of an SPMD program passes alike (collective, count, dtype, op, group nesting):
//  * creation is collective (NCCL window registration, a device handshake). Outside a group it runs
//    at the call. Inside a group it waits for the outermost ncclGroupEnd and then builds every
//    communicator of the group together (one thread driving several GPUs, as nccl-tests -g 2 does),
//    after the real ncclGroupEnd has run the group's forwarded calls.
//  * a first call on a stream that is being captured into a CUDA graph is forwarded and creates
//    nothing (creation allocates and synchronises, which a capture forbids); the first eager call
//    creates. SPMD programs capture on every rank alike.
//  * calls on a ready communicator inside a group are launched at once (kernel launches do not
//    block); calls behind a deferred creation keep their order and run at group end. When creation
//    failed, those calls go to the real NCCL inside one real group.
//
// Thread safety: the communicator table is shared and locked; creation runs without the lock (it
// waits for the other ranks, which may be other threads of this process), and publishes its result
// under the lock. Another thread may reach a communicator's state only through with_served(). Group nesting and the
// deferred calls are per thread, like NCCL's own group state. A communicator is used by one thread
// at a time (NCCL's rule).
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <reccl/types.hpp>

namespace reccl::shim {

/// One collective call in reccl's vocabulary (the glue maps NCCL's enums; calls it cannot map are
/// forwarded before they reach the dispatcher).
struct request {
  collective coll = collective::all_reduce;
  void const* in = nullptr;
  void* out = nullptr;
  std::size_t count = 0;
  dtype type = dtype::float32;
  redop op = redop::sum;
  int root = 0;
  void* stream = nullptr;  ///< cudaStream_t
};

enum class comm_state : std::uint8_t { unknown, ready, forwarded };

/// What the dispatcher needs from the glue. `Comm` is ncclComm_t there; results are NCCL result
/// codes (0 = success).
template <class B>
concept Backend = requires(B& b, typename B::comm_type c, typename B::state_type& s, request const& r,
                           std::vector<typename B::comm_type> const& cs, std::string const& m) {
  // builds reccl's state for every communicator in `cs` together (collective; throws on failure)
  { b.create(cs) } -> std::same_as<std::vector<std::unique_ptr<typename B::state_type>>>;
  { b.run(s, r) } -> std::same_as<int>;            // launches one served call
  { b.capturing(r.stream) } -> std::same_as<bool>;  // the stream is being captured
  { b.real_group_start() } -> std::same_as<int>;
  { b.real_group_end() } -> std::same_as<int>;
  b.log(m);
};

template <Backend B>
class dispatcher {
 public:
  using comm_type = typename B::comm_type;
  using state_type = typename B::state_type;
  using forward_fn = std::function<int()>;  ///< issues this call on the real NCCL

  explicit dispatcher(B& backend) : b_(backend) {}

  /// A mappable collective call on `c`: served, deferred to group end, or forwarded via `fwd`.
  int submit(comm_type c, request const& r, forward_fn fwd) {
    entry& e = entry_for(c);
    group& g = this_thread();
    if (e.state == comm_state::forwarded) return fwd();
    if (e.state == comm_state::unknown && b_.capturing(r.stream) && !g.defers(c)) return fwd();
    if (g.depth > 0 && (e.state == comm_state::unknown || g.defers(c))) {
      g.deferred.push_back({c, r, std::move(fwd)});
      return 0;
    }
    if (e.state == comm_state::unknown) {
      create({c});
      if (e.state != comm_state::ready) return fwd();
    }
    return b_.run(*e.served, r);
  }

  /// ncclGroupStart: the real one is called by the glue; this tracks the nesting.
  void group_start() { ++this_thread().depth; }

  /// ncclGroupEnd: the real group end first (the group's forwarded calls), then, at the outermost
  /// level, the deferred creations and calls. Returns the first failure.
  int group_end() {
    group& g = this_thread();
    int rc = b_.real_group_end();
    if (g.depth > 0) --g.depth;
    if (g.depth > 0 || g.deferred.empty()) return rc;
    std::vector<deferred_call> calls = std::move(g.deferred);
    g.deferred.clear();
    std::vector<comm_type> fresh;
    for (auto const& d : calls)
      if (entry_for(d.comm).state == comm_state::unknown && !contains(fresh, d.comm)) fresh.push_back(d.comm);
    if (!fresh.empty()) create(fresh);
    bool any_forwarded = false;
    for (auto const& d : calls) any_forwarded = any_forwarded || entry_for(d.comm).state != comm_state::ready;
    if (any_forwarded) keep_first(rc, b_.real_group_start());
    for (auto& d : calls) {
      entry& e = entry_for(d.comm);
      keep_first(rc, e.state == comm_state::ready ? b_.run(*e.served, d.req) : d.fwd());
    }
    if (any_forwarded) keep_first(rc, b_.real_group_end());
    return rc;
  }

  /// The communicator is being destroyed or aborted: drop reccl's state (before NCCL's own
  /// teardown). A later communicator at the same address starts again from `unknown`.
  void destroy(comm_type c) {
    std::unique_ptr<entry> gone;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = table_.find(c);
      if (it == table_.end()) return;
      gone = std::move(it->second);
      table_.erase(it);
    }
    gone.reset();  // state destructors synchronise the GPU: outside the lock
  }

  /// The communicator is being aborted: unlink reccl's state and hand it to the caller without
  /// destroying it (its teardown synchronises the GPU and calls NCCL, which an abort must not
  /// wait for; the glue leaks it).
  std::unique_ptr<state_type> forget(comm_type c) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = table_.find(c);
    if (it == table_.end()) return nullptr;
    std::unique_ptr<state_type> s = std::move(it->second->served);
    table_.erase(it);
    return s;
  }

  comm_state state_of(comm_type c) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = table_.find(c);
    return it == table_.end() ? comm_state::unknown : it->second->state;
  }
  /// The served state of a ready communicator, else nullptr. Only for the thread that uses the
  /// communicator (another thread's destroy() may free it); other threads use with_served().
  state_type* served(comm_type c) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = table_.find(c);
    return it == table_.end() ? nullptr : it->second->served.get();
  }
  /// Calls f(state) for a ready communicator, with the table locked so that a concurrent destroy()
  /// (which unlinks under the lock) cannot free the state meanwhile; returns whether it did. For
  /// calls that may come from another thread than the communicator's (NCCL's async-error query
  /// is made by watchdog threads). f must not call back into the dispatcher.
  template <class F>
  bool with_served(comm_type c, F&& f) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = table_.find(c);
    if (it == table_.end() || !it->second->served) return false;
    f(*it->second->served);
    return true;
  }
  int group_depth() { return this_thread().depth; }

 private:
  struct entry {
    comm_state state = comm_state::unknown;
    std::unique_ptr<state_type> served;
  };
  struct deferred_call {
    comm_type comm;
    request req;
    forward_fn fwd;
  };
  struct group {
    int depth = 0;
    std::vector<deferred_call> deferred;
    bool defers(comm_type c) const {
      for (auto const& d : deferred)
        if (d.comm == c) return true;
      return false;
    }
  };

  static group& this_thread() {
    static thread_local group g;
    return g;
  }
  static bool contains(std::vector<comm_type> const& v, comm_type c) {
    for (auto x : v)
      if (x == c) return true;
    return false;
  }
  static void keep_first(int& rc, int r) {
    if (rc == 0) rc = r;
  }

  entry& entry_for(comm_type c) {
    std::lock_guard<std::mutex> lk(mu_);
    auto& p = table_[c];
    if (!p) p = std::make_unique<entry>();
    return *p;  // entries are heap-allocated: the reference survives rehashing
  }

  /// Builds the state of `cs` together; on failure every one of them is forwarded from now on.
  void create(std::vector<comm_type> const& cs) {
    std::vector<std::unique_ptr<state_type>> made;
    std::string why;
    try {
      made = b_.create(cs);
      if (made.size() != cs.size()) why = "the backend built " + std::to_string(made.size()) + " states for " +
                                          std::to_string(cs.size()) + " communicators";
    } catch (std::exception const& ex) {
      why = ex.what();
    }
    for (std::size_t i = 0; i < cs.size(); ++i) {
      entry& e = entry_for(cs[i]);
      std::lock_guard<std::mutex> lk(mu_);  // with_served() may read the entry from another thread
      if (why.empty()) {
        e.served = std::move(made[i]);
        e.state = comm_state::ready;
      } else {
        e.state = comm_state::forwarded;
      }
    }
    if (!why.empty())
      b_.log("reccl: not serving " + std::to_string(cs.size()) +
             " communicator(s); their collectives go to NCCL: " + why);
  }

  B& b_;
  std::mutex mu_;
  std::unordered_map<comm_type, std::unique_ptr<entry>> table_;
};

}  // namespace reccl::shim
