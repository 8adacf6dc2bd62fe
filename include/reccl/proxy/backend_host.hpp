// reccl/proxy/backend_host.hpp -- a proxy backend whose ranks share one address space: a put is a
// memcpy into the peer's window, a signal a release-store (max) into the peer's flag word.
//
//   rank r's proxy thread                       memory of every rank (host_memory[])
//   ┌──────────────────────┐  memcpy            ┌────────────────────────────────────────┐
//   │ host_backend{r, ...} │───────────────────▶│ window[peer] + dst_offset              │
//   │                      │  raise_release     │ flags[peer][flag_index]  (only grows)  │
//   └──────────────────────┘───────────────────▶└────────────────────────────────────────┘
//
// It makes the whole proxy path (queue, proxy thread, transport handle) testable on a CPU, and it
// is the model a copy-engine backend follows: that one issues cudaMemcpyAsync on a stream per peer
// and reports outstanding copies until their events complete.
//
// Every operation completes before put/signal/get return, so poll_completions always reports
// nothing outstanding. Ordering: the bytes a put copied happen-before the flag store of a later
// signal (release), so a waiter that acquire-loads the flag sees them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <span>

#include "proxy.hpp"
#include "work_queue.hpp"

namespace reccl::proxy {

/// One rank's memory as the host backend sees it: its window (puts land here, puts and gets read
/// from here) and its flag words (signals land here).
struct host_memory {
  std::byte* window = nullptr;
  std::uint64_t window_bytes = 0;
  std::uint64_t* flags = nullptr;
  std::uint32_t n_flags = 0;
};

/// Backend for ranks that are threads of one process. `ranks[i]` is rank i's memory (including
/// mine); the span's storage must outlive the backend.
class host_backend {
 public:
  host_backend(int rank, std::span<host_memory const> ranks) : rank_(rank), ranks_(ranks) {}

  status put(work_request const& r) {
    if (!valid_rank(rank_) || !valid_rank(r.peer)) return status::invalid_argument;
    host_memory const& me = ranks_[static_cast<std::size_t>(rank_)];
    host_memory const& peer = ranks_[static_cast<std::size_t>(r.peer)];
    if (!in_range(r.src_offset, r.bytes, me.window_bytes) || !in_range(r.dst_offset, r.bytes, peer.window_bytes))
      return status::invalid_argument;
    if (r.bytes != 0) std::memmove(peer.window + r.dst_offset, me.window + r.src_offset, r.bytes);
    bytes_moved_ += r.bytes;
    return status::ok;
  }

  /// An inline put: the payload the proxy took out of the queue, into the peer's window.
  status put_inline(work_request const& r, std::span<std::byte const> payload) {
    if (!valid_rank(r.peer) || payload.size() != r.bytes) return status::invalid_argument;
    host_memory const& peer = ranks_[static_cast<std::size_t>(r.peer)];
    if (!in_range(r.dst_offset, r.bytes, peer.window_bytes)) return status::invalid_argument;
    if (r.bytes != 0) std::memcpy(peer.window + r.dst_offset, payload.data(), r.bytes);
    bytes_moved_ += r.bytes;
    return status::ok;
  }

  status signal(work_request const& r) {
    if (!valid_rank(r.peer)) return status::invalid_argument;
    host_memory const& peer = ranks_[static_cast<std::size_t>(r.peer)];
    if (r.flag_index >= peer.n_flags) return status::invalid_argument;
    raise_release(&peer.flags[r.flag_index], r.value);
    return status::ok;
  }

  status get(work_request const& r) {
    if (!valid_rank(rank_) || !valid_rank(r.peer)) return status::invalid_argument;
    host_memory const& me = ranks_[static_cast<std::size_t>(rank_)];
    host_memory const& peer = ranks_[static_cast<std::size_t>(r.peer)];
    if (!in_range(r.src_offset, r.bytes, peer.window_bytes) || !in_range(r.dst_offset, r.bytes, me.window_bytes))
      return status::invalid_argument;
    if (r.bytes != 0) std::memmove(me.window + r.dst_offset, peer.window + r.src_offset, r.bytes);
    bytes_moved_ += r.bytes;
    return status::ok;
  }

  poll_result poll_completions() { return {status::ok, 0}; }

  /// Bytes this backend copied (puts and gets).
  std::uint64_t bytes_moved() const { return bytes_moved_; }

 private:
  bool valid_rank(int r) const { return r >= 0 && static_cast<std::size_t>(r) < ranks_.size(); }
  static bool in_range(std::uint64_t off, std::uint64_t bytes, std::uint64_t size) {
    return off <= size && bytes <= size - off;
  }

  int rank_;
  std::span<host_memory const> ranks_;
  std::uint64_t bytes_moved_ = 0;
};

static_assert(InlineBackend<host_backend>);

}  // namespace reccl::proxy
