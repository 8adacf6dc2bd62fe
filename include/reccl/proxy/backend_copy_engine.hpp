// reccl/proxy/backend_copy_engine.hpp -- a proxy backend that moves bytes with the GPUs' copy
// engines: a put is a copy into the peer's window, a signal an 8-byte copy of the value into the
// peer's flag word, both on a stream per peer. No SM is used. (A stream memory write,
// cuStreamWriteValue64, was tried first: signals with no copy before them on the stream never
// landed on an H200 with driver 580 within 20 s.)
//
//   rank r's proxy thread              stream[peer] (copy engine)              peer's GPU memory
//   ┌─────────────────────────┐        ┌─────────────────────────────────┐     ┌──────────────────┐
//   │ put(r), get(r)  (queued)│        │                                 │     │                  │
//   │ signal(r)       (queued)│        │                                 │     │                  │
//   │ poll_completions:       │        │                                 │     │                  │
//   │   the pass's copies ────│───────▶│ one batch: window[r] -> window  │────▶│ window + dst     │
//   │   the pass's signals ───│───────▶│ one batch: values -> flags      │────▶│ flags[i]         │
//   │   reap ─────────────────│──query─│ event after the last batch      │     └──────────────────┘
//   └─────────────────────────┘        └─────────────────────────────────┘
//
// Submission: put/get/signal only validate and queue; poll_completions, which the proxy calls at
// the end of every pass over its queues, issues each lane's queued copies as one
// cudaMemcpyBatchAsync and then its signals as a second one (the values are read during the call,
// so they need no pinned slots), then records the completion event. That is about four CUDA calls
// per pass instead of one per request; the proxy thread's CUDA calls are what bound the proxy's
// rate (bench/NOTES.md 23, 24). With `batched = false` (or a CUDA runtime older than 13.0) every
// copy is its own cudaMemcpyAsync and every signal a copy from a pinned slot, in the same order.
//
// Inline puts (put_inline): the payload came through the queue; it is kept in host memory until
// the pass is issued and joins the pass's copy batch with its source read during the call (~2 us
// of driver time for the thread against ~6 us for a copy from the window; bench/NOTES.md 24).
//
// Ordering (what a peer may rely on): a signal is written only after the bytes of every put and
// get to that peer handed to the backend before it have landed. A put handed over after a signal
// may land before that signal (both are issued at the end of the same pass, copies first). No
// request can depend on such a signal having arrived: nothing of a pass is issued before the pass
// ends, so whatever reacts to the signal is handed over in a later pass. Signals to one flag in a
// pass are coalesced into the largest value (flags only grow, so a waiter for an earlier value is
// satisfied by it).
//
// Memory: every rank's window and flags are device memory (cudaMalloc) this process can address
// (the same GPU, or peers with peer access enabled); the kernels that wait on the flags poll them
// with acquire loads. Across processes the peers' windows and flags are opened from CUDA IPC
// handles (copy_engine_group with a process_rank).
//
// Completions: each stream records an event after its newest submission when the proxy asks for
// progress; submissions up to a completed event are done. get() completes like a put (the proxy
// marks the queue's requests completed only when nothing is outstanding).
//
// Errors: a request outside a window or a flag array is status::invalid_argument (nothing is
// queued); a CUDA error while issuing or querying is status::internal, and message() keeps the
// CUDA text. The backend owns its streams and events; the destructor issues what is queued and
// waits for the streams.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../host/error.hpp"
#include "proxy.hpp"
#include "work_queue.hpp"

namespace reccl::proxy {

/// One rank's device memory as the copy-engine backend sees it.
struct device_memory {
  std::byte* window = nullptr;  ///< device pointer (usable from this process)
  std::uint64_t window_bytes = 0;
  std::uint64_t* flags = nullptr;  ///< device pointer
  std::uint32_t n_flags = 0;
  int device = 0;  ///< the GPU that holds window and flags
};

/// How the backend submits its work (see the file comment).
struct copy_engine_options {
  bool batched = true;  ///< one cudaMemcpyBatchAsync for a pass's copies and one for its signals
};

/// Backend of rank `rank` (see the file comment). `ranks[i]` is rank i's memory, mine included;
/// the span's storage must outlive the backend. Streams are created on my GPU.
class copy_engine_backend {
 public:
  copy_engine_backend(int rank, std::span<device_memory const> ranks, copy_engine_options opt = {})
      : rank_(rank), ranks_(ranks), batched_(opt.batched && have_batch) {
    if (!valid_rank(rank)) {
      fail(cudaErrorInvalidValue, "copy_engine_backend: rank outside the ranks given");
      return;
    }
    if (!check(cudaSetDevice(ranks_[static_cast<std::size_t>(rank)].device), "cudaSetDevice")) return;
    peers_.resize(ranks_.size());
    for (auto& p : peers_) {
      if (!check(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking), "cudaStreamCreate")) return;
      if (!check(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming), "cudaEventCreate")) return;
      if (!batched_ && !check(cudaHostAlloc(&p.slots, sizeof(std::uint64_t) * value_slots, cudaHostAllocPortable), "cudaHostAlloc"))
        return;
    }
  }
  copy_engine_backend(copy_engine_backend const&) = delete;
  copy_engine_backend& operator=(copy_engine_backend const&) = delete;
  ~copy_engine_backend() {  // cannot throw: failures are reported on stderr
    for (auto& p : peers_) {
      if (p.stream != nullptr) {
        if (ok_) (void)submit(p);
        RECCL_CUDA_REPORT(cudaStreamSynchronize(p.stream));
        RECCL_CUDA_REPORT(cudaStreamDestroy(p.stream));
      }
      if (p.done != nullptr) RECCL_CUDA_REPORT(cudaEventDestroy(p.done));
      if (p.slots != nullptr) RECCL_CUDA_REPORT(cudaFreeHost(p.slots));
    }
  }

  /// The first error's text ("" if none).
  std::string const& message() const { return message_; }
  /// Bytes issued to the copy engines (puts and gets).
  std::uint64_t bytes_moved() const { return bytes_moved_; }
  /// Signals that were not written because a later one to the same flag in the pass replaced them.
  std::uint64_t signals_coalesced() const { return coalesced_; }
  /// Inline puts taken so far (any thread may read it while the proxy runs).
  std::uint64_t inline_puts() const { return inline_puts_.load(std::memory_order_relaxed); }
  /// Whether a backend built with `opt` carries inline puts (they need the batched submission).
  static constexpr bool carries_inline(copy_engine_options opt) { return opt.batched && have_batch; }

  status put(work_request const& r) { return copy(r, rank_, r.peer, r.dst_offset, r.src_offset); }
  status get(work_request const& r) { return copy(r, r.peer, rank_, r.dst_offset, r.src_offset); }

  /// An inline put: the payload (taken out of the queue by the proxy) is kept until the pass is
  /// issued, then copied into the peer's window from host memory, read during the issuing call.
  /// Needs the batched submission (CUDA 13): status::invalid_argument without it.
  status put_inline(work_request const& r, std::span<std::byte const> payload) {
    if (!ok_) return status::internal;
    if (!batched_ || !valid_rank(r.peer) || payload.size() != r.bytes) return status::invalid_argument;
    device_memory const& dst = ranks_[static_cast<std::size_t>(r.peer)];
    if (!in_range(r.dst_offset, r.bytes, dst.window_bytes)) return status::invalid_argument;
    if (r.bytes == 0) return status::ok;
    lane& l = peers_[static_cast<std::size_t>(r.peer)];
    l.inline_dsts.push_back(dst.window + r.dst_offset);
    l.inline_at.push_back(l.inline_data.size());
    l.inline_data.insert(l.inline_data.end(), payload.begin(), payload.end());
    bytes_moved_ += r.bytes;
    inline_puts_.fetch_add(1, std::memory_order_relaxed);
    return status::ok;
  }

  status signal(work_request const& r) {
    if (!ok_) return status::internal;
    if (!valid_rank(r.peer)) return status::invalid_argument;
    device_memory const& peer = ranks_[static_cast<std::size_t>(r.peer)];
    if (r.flag_index >= peer.n_flags) return status::invalid_argument;
    lane& l = peers_[static_cast<std::size_t>(r.peer)];
    void* const flag = peer.flags + r.flag_index;
    for (std::size_t i = 0; i < l.flags.size(); ++i) {
      if (l.flags[i] != flag) continue;
      ++coalesced_;  // the queued write of this flag carries the larger value instead
      if (r.value > l.values[i]) l.values[i] = r.value;
      return status::ok;
    }
    l.flags.push_back(flag);
    l.values.push_back(r.value);
    return status::ok;
  }

  /// Issues what the pass queued (copies, then signals, per lane), records an event after each
  /// stream's newest submission if none is pending, and reaps the ones that completed. Never blocks
  /// (except, without batching, when every pinned signal slot is in flight).
  poll_result poll_completions() {
    if (!ok_) return {status::internal, 0};
    std::uint64_t outstanding = 0;
    for (auto& l : peers_) {
      if (submit(l) != status::ok || reap(l) != status::ok) return {status::internal, 0};
      outstanding += l.issued - l.completed;
    }
    return {status::ok, outstanding};
  }

 private:
#if CUDART_VERSION >= 13000
  static constexpr bool have_batch = true;
#else
  static constexpr bool have_batch = false;  // cudaMemcpyBatchAsync has another signature before 13.0
#endif
  static constexpr std::uint64_t value_slots = 4096;  ///< unbatched: pinned signal values per stream

  struct lane {
    cudaStream_t stream = nullptr;
    cudaEvent_t done = nullptr;
    std::uint64_t issued = 0;     ///< submissions on the stream
    std::uint64_t recorded = 0;   ///< `issued` when `done` was recorded (0: no event pending)
    std::uint64_t completed = 0;  ///< submissions known complete
    // this pass's queued operations
    std::vector<void*> dsts;
    std::vector<void const*> srcs;
    std::vector<std::size_t> sizes;
    std::vector<void*> flags;  ///< the peer's flag words
    std::vector<std::uint64_t> values;
    std::vector<void const*> value_srcs;  ///< batched: &values[i], built at submit
    std::vector<std::size_t> value_sizes;
    std::uint64_t* slots = nullptr;       ///< unbatched: pinned sources of the signal copies
    std::vector<void*> inline_dsts;        ///< this pass's inline puts: where each goes,
    std::vector<std::size_t> inline_at;    ///< where its payload starts in inline_data
    std::vector<std::byte> inline_data;
  };

  status submit(lane& l) {
    std::size_t const n_device = l.dsts.size();
    for (std::size_t i = 0; i < l.inline_dsts.size(); ++i) {  // inline puts join the batch, read during the call
      std::size_t const end = i + 1 < l.inline_at.size() ? l.inline_at[i + 1] : l.inline_data.size();
      l.dsts.push_back(l.inline_dsts[i]);
      l.srcs.push_back(l.inline_data.data() + l.inline_at[i]);
      l.sizes.push_back(end - l.inline_at[i]);
    }
    if (!l.dsts.empty()) {
      if (batched_) {
        cudaMemcpyAttributes attr[2]{};
        attr[0].srcAccessOrder = cudaMemcpySrcAccessOrderStream;  // window bytes: read in stream order
        attr[0].flags = cudaMemcpyFlagPreferOverlapWithCompute;
        attr[1].srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;  // inline payloads
        std::size_t idx[2] = {0, n_device};
        std::size_t const n_attr = n_device == 0 || n_device == l.dsts.size() ? 1 : 2;
        if (n_device == 0) attr[0] = attr[1];
        if (!issue(batch(l.dsts.data(), l.srcs.data(), l.sizes.data(), l.dsts.size(), attr, idx, n_attr, l.stream), l,
                   "cudaMemcpyBatchAsync (puts)"))
          return status::internal;
        l.inline_dsts.clear();
        l.inline_at.clear();
        l.inline_data.clear();
      } else {
        for (std::size_t i = 0; i < l.dsts.size(); ++i)
          if (!issue(cudaMemcpyAsync(l.dsts[i], l.srcs[i], l.sizes[i], cudaMemcpyDefault, l.stream), l, "cudaMemcpyAsync (put)"))
            return status::internal;
      }
      l.dsts.clear();
      l.srcs.clear();
      l.sizes.clear();
    }
    if (!l.flags.empty()) {
      if (batched_) {
        // the values are read during the call (DuringApiCall), so the vectors may change after it
        l.value_srcs.clear();
        for (auto const& v : l.values) l.value_srcs.push_back(&v);
        l.value_sizes.assign(l.flags.size(), sizeof(std::uint64_t));
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderDuringApiCall;
        std::size_t first = 0;
        if (!issue(batch(l.flags.data(), l.value_srcs.data(), l.value_sizes.data(), l.flags.size(), &attr, &first, 1,
                         l.stream),
                   l, "cudaMemcpyBatchAsync (signals)"))
          return status::internal;
      } else {
        for (std::size_t i = 0; i < l.flags.size(); ++i) {
          while (l.issued - l.completed >= value_slots) {  // rare: that many operations in flight
            if (!check(cudaEventSynchronize(l.done), "cudaEventSynchronize")) return status::internal;
            if (reap(l) != status::ok) return status::internal;
          }
          std::uint64_t* slot = l.slots + (l.issued % value_slots);  // reused once the copy that read it completed
          *slot = l.values[i];
          if (!issue(cudaMemcpyAsync(l.flags[i], slot, sizeof(std::uint64_t), cudaMemcpyHostToDevice, l.stream), l,
                     "cudaMemcpyAsync (signal)"))
            return status::internal;
        }
      }
      l.flags.clear();
      l.values.clear();
    }
    return status::ok;
  }
  bool issue(cudaError_t e, lane& l, char const* what) {
    if (!check(e, what)) return false;
    ++l.issued;
    return true;
  }
  static cudaError_t batch(void* const* dsts, void const* const* srcs, std::size_t const* sizes, std::size_t count, cudaMemcpyAttributes* attrs,
                           std::size_t* attr_idx, std::size_t n_attrs, cudaStream_t stream) {
#if CUDART_VERSION >= 13000
    return cudaMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attr_idx, n_attrs, stream);
#else
    (void)dsts, (void)srcs, (void)sizes, (void)count, (void)attrs, (void)attr_idx, (void)n_attrs, (void)stream;
    return cudaErrorNotSupported;
#endif
  }

  // Completions of one lane: the pending event, if it completed; a new event after its newest
  // submission if none is pending.
  status reap(lane& l) {
    if (l.recorded != 0) {
      cudaError_t const q = cudaEventQuery(l.done);
      if (q == cudaSuccess) {
        l.completed = l.recorded;
        l.recorded = 0;
      } else if (q != cudaErrorNotReady) {
        check(q, "cudaEventQuery");
        return status::internal;
      }
    }
    if (l.recorded == 0 && l.issued > l.completed) {
      if (!check(cudaEventRecord(l.done, l.stream), "cudaEventRecord")) return status::internal;
      l.recorded = l.issued;
    }
    return status::ok;
  }

  // Queues r.bytes from rank `from`'s window at src_off to rank `to`'s at dst_off, on the lane of r.peer.
  status copy(work_request const& r, int from, int to, std::uint64_t dst_off, std::uint64_t src_off) {
    if (!ok_) return status::internal;
    if (!valid_rank(r.peer)) return status::invalid_argument;
    device_memory const& src = ranks_[static_cast<std::size_t>(from)];
    device_memory const& dst = ranks_[static_cast<std::size_t>(to)];
    if (!in_range(src_off, r.bytes, src.window_bytes) || !in_range(dst_off, r.bytes, dst.window_bytes)) return status::invalid_argument;
    if (r.bytes == 0) return status::ok;
    lane& l = peers_[static_cast<std::size_t>(r.peer)];
    l.dsts.push_back(dst.window + dst_off);
    l.srcs.push_back(src.window + src_off);
    l.sizes.push_back(r.bytes);
    bytes_moved_ += r.bytes;
    return status::ok;
  }
  bool valid_rank(int r) const { return r >= 0 && static_cast<std::size_t>(r) < ranks_.size(); }
  static bool in_range(std::uint64_t off, std::uint64_t bytes, std::uint64_t size) { return off <= size && bytes <= size - off; }
  bool check(cudaError_t e, char const* what) {
    if (e == cudaSuccess) return true;
    fail(e, what);
    return false;
  }
  void fail(cudaError_t e, char const* what) { fail_text(std::string(what) + ": " + cudaGetErrorString(e)); }
  void fail_text(std::string m) {
    if (ok_) message_ = std::move(m);
    ok_ = false;
  }

  int rank_;
  std::span<device_memory const> ranks_;
  bool batched_;
  std::vector<lane> peers_;
  bool ok_ = true;
  std::string message_;
  std::uint64_t bytes_moved_ = 0;
  std::uint64_t coalesced_ = 0;
  std::atomic<std::uint64_t> inline_puts_{0};
};

static_assert(InlineBackend<copy_engine_backend>);

}  // namespace reccl::proxy
