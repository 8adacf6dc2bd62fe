// reccl/proxy/backend_copy_engine.hpp -- a proxy backend that moves bytes with the GPUs' copy
// engines: a put is a cudaMemcpyAsync into the peer's window, a signal an 8-byte copy of the value
// from a pinned slot into the peer's flag word, both on a stream per peer, so the flag is written
// only after the bytes of every earlier put to that peer have landed; signals to one flag that
// follow each other are coalesced into the last one. No SM is used. (A stream
// memory write, cuStreamWriteValue64, was tried first: signals with no copy before them on the
// stream never landed on an H200 with driver 580 within 20 s.)
//
//   rank r's proxy thread           stream[peer] (copy engine)            peer's GPU memory
//   ┌──────────────────────┐        ┌──────────────────────────────┐     ┌──────────────────┐
//   │ put(r)    ───────────│───────▶│ memcpy  window[r] -> window  │────▶│ window + dst     │
//   │ signal(r) ───────────│───────▶│ memcpy  pinned value -> flag │────▶│ flags[i]         │
//   │ poll_completions ────│──query─│ event after the last op      │     └──────────────────┘
//   └──────────────────────┘        └──────────────────────────────┘
//
// Memory: every rank's window and flags are device memory (cudaMalloc) this process can address
// (the same GPU, or peers with peer access enabled); the kernels that wait on the flags poll them
// with acquire loads. Across processes the windows come from CUDA IPC handles (not done yet).
//
// Completions: each stream records an event after its newest operation when the proxy asks for
// progress; operations up to a completed event are done. get() completes like a put (the proxy
// marks the queue's requests completed only when nothing is outstanding).
//
// Errors: a request outside a window or a flag array is status::invalid_argument (nothing is
// issued); a CUDA error while issuing or querying is status::internal, and message() keeps the
// CUDA text. The backend owns its streams and events; the destructor waits for them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

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

/// Backend of rank `rank` (see the file comment). `ranks[i]` is rank i's memory, mine included;
/// the span's storage must outlive the backend. Streams are created on my GPU.
class copy_engine_backend {
 public:
  copy_engine_backend(int rank, std::span<device_memory const> ranks) : rank_(rank), ranks_(ranks) {
    if (!valid_rank(rank)) {
      fail(cudaErrorInvalidValue, "copy_engine_backend: rank outside the ranks given");
      return;
    }
    if (!check(cudaSetDevice(ranks_[static_cast<std::size_t>(rank)].device), "cudaSetDevice")) return;
    peers_.resize(ranks_.size());
    for (auto& p : peers_) {
      if (!check(cudaStreamCreateWithFlags(&p.stream, cudaStreamNonBlocking), "cudaStreamCreate")) return;
      if (!check(cudaEventCreateWithFlags(&p.done, cudaEventDisableTiming), "cudaEventCreate")) return;
      if (!check(cudaHostAlloc(&p.values, sizeof(std::uint64_t) * value_slots, cudaHostAllocPortable), "cudaHostAlloc")) return;
    }
  }
  copy_engine_backend(copy_engine_backend const&) = delete;
  copy_engine_backend& operator=(copy_engine_backend const&) = delete;
  ~copy_engine_backend() {
    for (auto& p : peers_) {
      if (p.stream != nullptr) {
        cudaStreamSynchronize(p.stream);
        cudaStreamDestroy(p.stream);
      }
      if (p.done != nullptr) cudaEventDestroy(p.done);
      if (p.values != nullptr) cudaFreeHost(p.values);
    }
  }

  /// The first error's text ("" if none).
  std::string const& message() const { return message_; }
  /// Bytes issued to the copy engines (puts and gets).
  std::uint64_t bytes_moved() const { return bytes_moved_; }
  /// Signals that were not written because a later one to the same flag replaced them.
  std::uint64_t signals_coalesced() const { return coalesced_; }

  status put(work_request const& r) { return copy(r, rank_, r.peer, r.dst_offset, r.src_offset, "cudaMemcpyAsync (put)"); }

  /// Signals to one flag that follow each other on a peer's stream are coalesced: only the last
  /// value is written (flags only grow, so a waiter for an earlier value is satisfied by it). The
  /// write is issued before the next copy on that stream and at the latest by the next
  /// poll_completions, so it keeps its place after every earlier put.
  status signal(work_request const& r) {
    if (!ok_) return status::internal;
    if (!valid_rank(r.peer)) return status::invalid_argument;
    device_memory const& peer = ranks_[static_cast<std::size_t>(r.peer)];
    if (r.flag_index >= peer.n_flags) return status::invalid_argument;
    lane& l = peers_[static_cast<std::size_t>(r.peer)];
    std::uint64_t* const flag = peer.flags + r.flag_index;
    if (l.pending_flag == flag) {
      ++coalesced_;  // the pending write of this flag carries this value instead
    } else if (flush(l) != status::ok) {
      return status::internal;
    }
    l.pending_flag = flag;
    l.pending_value = l.pending_value > r.value ? l.pending_value : r.value;
    return status::ok;
  }

  status get(work_request const& r) { return copy(r, r.peer, rank_, r.dst_offset, r.src_offset, "cudaMemcpyAsync (get)"); }

  /// Records an event after each stream's newest operation (if none is pending) and reaps the
  /// ones that completed. Never blocks.
  poll_result poll_completions() {
    if (!ok_) return {status::internal, 0};
    std::uint64_t outstanding = 0;
    for (auto& l : peers_) {
      if (flush(l) != status::ok || reap(l) != status::ok) return {status::internal, 0};
      outstanding += l.issued - l.completed;
    }
    return {status::ok, outstanding};
  }

 private:
  static constexpr std::uint64_t value_slots = 4096;  ///< pinned signal values per peer stream

  struct lane {
    cudaStream_t stream = nullptr;
    std::uint64_t* values = nullptr;  ///< pinned: the source of each signal's 8-byte copy
    cudaEvent_t done = nullptr;
    std::uint64_t issued = 0;     ///< operations issued on the stream
    std::uint64_t recorded = 0;   ///< `issued` when `done` was recorded (0: no event pending)
    std::uint64_t completed = 0;  ///< operations known complete
    std::uint64_t* pending_flag = nullptr;  ///< a signal not written yet (coalescing), or null
    std::uint64_t pending_value = 0;
  };

  // The lane's pending signal as an 8-byte copy of its value from a pinned slot, stream-ordered
  // after the lane's earlier copies, so the flag never overtakes their bytes. A slot is reused
  // only once the copy that read it completed (a slot per operation of the ring's span).
  status flush(lane& l) {
    if (l.pending_flag == nullptr) return status::ok;
    while (l.issued - l.completed >= value_slots) {  // rare: that many operations in flight
      if (!check(cudaEventSynchronize(l.done), "cudaEventSynchronize")) return status::internal;
      if (reap(l) != status::ok) return status::internal;
    }
    std::uint64_t* slot = l.values + (l.issued % value_slots);
    *slot = l.pending_value;
    if (!check(cudaMemcpyAsync(l.pending_flag, slot, sizeof(std::uint64_t), cudaMemcpyHostToDevice, l.stream),
               "cudaMemcpyAsync (signal)"))
      return status::internal;
    l.pending_flag = nullptr;
    l.pending_value = 0;
    ++l.issued;
    return status::ok;
  }
  // Completions of one lane: the pending event, if it completed; a new event after its newest
  // operation if none is pending.
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

  // r.bytes from rank `from`'s window at src_off to rank `to`'s at dst_off, on the stream of r.peer
  status copy(work_request const& r, int from, int to, std::uint64_t dst_off, std::uint64_t src_off, char const* what) {
    if (!ok_) return status::internal;
    if (!valid_rank(r.peer)) return status::invalid_argument;
    device_memory const& src = ranks_[static_cast<std::size_t>(from)];
    device_memory const& dst = ranks_[static_cast<std::size_t>(to)];
    if (!in_range(src_off, r.bytes, src.window_bytes) || !in_range(dst_off, r.bytes, dst.window_bytes)) return status::invalid_argument;
    if (r.bytes == 0) return status::ok;
    lane& l = peers_[static_cast<std::size_t>(r.peer)];
    if (flush(l) != status::ok) return status::internal;  // an earlier signal keeps its place
    if (!check(cudaMemcpyAsync(dst.window + dst_off, src.window + src_off, r.bytes, cudaMemcpyDefault, l.stream), what))
      return status::internal;
    ++l.issued;
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
  std::vector<lane> peers_;
  bool ok_ = true;
  std::string message_;
  std::uint64_t bytes_moved_ = 0;
  std::uint64_t coalesced_ = 0;
};

static_assert(Backend<copy_engine_backend>);

}  // namespace reccl::proxy
