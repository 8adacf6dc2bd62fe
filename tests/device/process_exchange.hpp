// tests/device/process_exchange.hpp -- a proxy::rank_exchange between processes forked from one
// parent: an anonymous shared mapping made before the fork holds two generations of every rank's
// bytes and an arrival counter. A rank that does not arrive within the timeout is an error naming
// the ranks missing (so a test never hangs on a dead child).
//
// Why two generations suffice: a rank writes generation g + 2 only after every rank arrived at
// g + 1, and a rank arrives at g + 1 only after it copied out generation g.
#pragma once

#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>

#include "reccl/proxy/rank_exchange.hpp"

namespace gpu_test {

class process_exchange {
 public:
  /// Call before fork(); every child then takes its rank's exchange with for_rank().
  process_exchange(int nranks, std::size_t max_bytes, std::chrono::milliseconds timeout)
      : n_(nranks), max_(max_bytes), timeout_(timeout), bytes_(sizeof(control) + 2 * static_cast<std::size_t>(nranks) * max_bytes) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("process_exchange: mmap failed");
    base_ = static_cast<std::byte*>(p);
    new (base_) control{};
  }
  process_exchange(process_exchange const&) = delete;
  process_exchange& operator=(process_exchange const&) = delete;
  ~process_exchange() { munmap(base_, bytes_); }

  reccl::proxy::rank_exchange for_rank(int rank) {
    auto gen = std::make_shared<std::uint64_t>(0);
    return [this, rank, gen](void const* mine, void* all, std::size_t bytes) {
      if (bytes > max_) throw std::runtime_error("process_exchange: " + std::to_string(bytes) + " bytes, more than the slots hold");
      std::uint64_t const g = (*gen)++;
      std::byte* const slots = base_ + sizeof(control) + (g % 2) * static_cast<std::size_t>(n_) * max_;
      std::memcpy(slots + static_cast<std::size_t>(rank) * max_, mine, bytes);
      std::atomic_ref<std::uint64_t> arrived(ctl().arrived);
      std::atomic_ref<std::uint64_t> seen(ctl().seen[rank]);
      seen.store(g + 1, std::memory_order_relaxed);
      arrived.fetch_add(1, std::memory_order_acq_rel);
      std::uint64_t const want = static_cast<std::uint64_t>(n_) * (g + 1);
      auto const until = std::chrono::steady_clock::now() + timeout_;
      while (arrived.load(std::memory_order_acquire) < want) {
        if (std::chrono::steady_clock::now() > until) {
          std::string missing;
          for (int r = 0; r < n_; ++r)
            if (std::atomic_ref<std::uint64_t>(ctl().seen[r]).load(std::memory_order_relaxed) < g + 1) missing += " " + std::to_string(r);
          throw std::runtime_error("process_exchange: rank(s)" + missing + " did not arrive at exchange " + std::to_string(g));
        }
        std::this_thread::yield();
      }
      for (int r = 0; r < n_; ++r) std::memcpy(static_cast<std::byte*>(all) + static_cast<std::size_t>(r) * bytes, slots + static_cast<std::size_t>(r) * max_, bytes);
    };
  }

 private:
  struct control {
    alignas(64) std::uint64_t arrived = 0;
    alignas(64) std::uint64_t seen[64] = {};
  };
  control& ctl() { return *reinterpret_cast<control*>(base_); }

  int n_;
  std::size_t max_;
  std::chrono::milliseconds timeout_;
  std::size_t bytes_;
  std::byte* base_ = nullptr;
};

}  // namespace gpu_test
