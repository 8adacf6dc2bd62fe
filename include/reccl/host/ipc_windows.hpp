// reccl/host/ipc_windows.hpp -- one device allocation per rank, mapped into every other rank's
// process through CUDA IPC, with set-up and tear-down that every rank takes together.
//
// Set-up (every rank, in the same order as its peers):
//   1. allocate my window (cudaMalloc, zeroed) and export its IPC handle;
//   2. all-gather the records (handle, size, a fingerprint of the layout, and whether step 1
//      failed and why) through the caller's rank_exchange -- every rank takes this exchange even
//      when its own step failed, so no rank waits for one that gave up;
//   3. open every peer's handle and all-gather whether that worked.
// Any failure, or a size or fingerprint that differs, makes every rank's constructor throw
// reccl::error naming the first rank that failed or differs.
//
// Tear-down (the destructor): close the peers' windows, exchange once (no peer maps my window any
// more), free mine. Ranks must destroy their windows together, as they created them; if a peer is
// gone the exchange throws and the window is freed anyway (that process is going away).
//
// Ranks may live on different GPUs with peer access (cudaIpcMemLazyEnablePeerAccess) or share one
// GPU: two or more processes on one device map each other's memory the same way.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../error.hpp"
#include "../proxy/rank_exchange.hpp"
#include "error.hpp"

namespace reccl {

class ipc_windows {
 public:
  /// Collective over the `nranks` ranks reached by `exchange`. `fingerprint` summarises the
  /// layout every rank must agree on (e.g. a hash of the window's layout); `what` names the owner
  /// in error messages.
  ipc_windows(int rank, int nranks, std::size_t bytes, std::uint64_t fingerprint, proxy::rank_exchange exchange,
              std::string what)
      : rank_(rank), nranks_(nranks), bytes_(bytes), exchange_(std::move(exchange)), what_(std::move(what)),
        base_(static_cast<std::size_t>(nranks), nullptr) {
    if (!exchange_) throw reccl::error(status::invalid_argument, what_ + ": a rank_exchange is required across processes", rank);
    if (rank < 0 || rank >= nranks) throw reccl::error(status::invalid_argument, what_ + ": rank out of range", rank);
    record mine{};
    mine.rank = rank;
    mine.nranks = nranks;
    mine.bytes = bytes;
    mine.fingerprint = fingerprint;
    try {
      RECCL_CUDA_CHECK(cudaGetDevice(&mine.device));
      RECCL_CUDA_CHECK(cudaMalloc(&base_[static_cast<std::size_t>(rank)], bytes));
      RECCL_CUDA_CHECK(cudaMemset(base_[static_cast<std::size_t>(rank)], 0, bytes));
      RECCL_CUDA_CHECK(cudaDeviceSynchronize());  // zeroed before any peer maps it
      RECCL_CUDA_CHECK(cudaIpcGetMemHandle(&mine.handle, base_[static_cast<std::size_t>(rank)]));
    } catch (std::exception const& e) {
      mine.note(e.what());
    }
    std::vector<record> all(static_cast<std::size_t>(nranks));
    exchange_(&mine, all.data(), sizeof(record));
    std::string why = first_failure(all, "could not allocate its window");
    for (int r = 0; r < nranks && why.empty(); ++r) {
      record const& o = all[static_cast<std::size_t>(r)];
      if (o.magic != record::expected || o.rank != r || o.nranks != nranks)
        why = "rank " + std::to_string(r) + "'s set-up record does not match (ranks must create their windows together)";
      else if (o.bytes != bytes || o.fingerprint != fingerprint)
        why = "rank " + std::to_string(r) + "'s window layout differs from rank " + std::to_string(rank) + "'s";
    }
    if (!why.empty()) {
      free_mine();
      throw reccl::error(status::mismatch, what_ + ": " + why, rank);
    }
    record opened{};
    opened.rank = rank;
    try {
      for (int r = 0; r < nranks; ++r) {
        if (r == rank) continue;
        RECCL_CUDA_CHECK(cudaIpcOpenMemHandle(&base_[static_cast<std::size_t>(r)], all[static_cast<std::size_t>(r)].handle,
                                              cudaIpcMemLazyEnablePeerAccess));
      }
    } catch (std::exception const& e) {
      opened.note(e.what());
    }
    exchange_(&opened, all.data(), sizeof(record));
    why = first_failure(all, "could not open its peers' windows");
    if (!why.empty()) {
      release();
      throw reccl::error(status::internal, what_ + ": " + why, rank);
    }
  }

  ipc_windows(ipc_windows const&) = delete;
  ipc_windows& operator=(ipc_windows const&) = delete;
  ~ipc_windows() { release(); }

  /// Rank r's window as seen from this process (r == rank(): my own allocation).
  void* base(int r) const { return base_[static_cast<std::size_t>(r)]; }
  std::size_t bytes() const { return bytes_; }

 private:
  struct record {
    static constexpr std::uint64_t expected = 0x7265636c69706377ull;  // "reclipcw"
    std::uint64_t magic = expected;
    std::int32_t rank = 0, nranks = 0, device = 0, failed = 0;
    std::uint64_t bytes = 0, fingerprint = 0;
    cudaIpcMemHandle_t handle{};
    char why[160] = {};
    void note(char const* what) {
      failed = 1;
      std::strncpy(why, what, sizeof(why) - 1);
    }
  };

  static std::string first_failure(std::vector<record> const& all, char const* step) {
    for (std::size_t r = 0; r < all.size(); ++r)
      if (all[r].failed != 0)
        return "rank " + std::to_string(r) + " " + step + ": " + std::string(all[r].why, strnlen(all[r].why, sizeof(all[r].why)));
    return {};
  }

  void release() noexcept {
    for (int r = 0; r < nranks_; ++r) {
      if (r == rank_ || base_[static_cast<std::size_t>(r)] == nullptr) continue;
      // Destructor path: nothing to report to; a failing close leaves the mapping to process exit.
      (void)cudaIpcCloseMemHandle(base_[static_cast<std::size_t>(r)]);
      base_[static_cast<std::size_t>(r)] = nullptr;
    }
    try {
      char const one = 1;
      std::vector<char> all(static_cast<std::size_t>(nranks_));
      exchange_(&one, all.data(), 1);  // every peer closed my window before I free it
    } catch (...) {
      // a peer is gone: free anyway
    }
    free_mine();
  }
  void free_mine() noexcept {
    void*& mine = base_[static_cast<std::size_t>(rank_)];
    if (mine != nullptr) (void)cudaFree(mine);  // destructor path: cannot throw; the error stays sticky in CUDA
    mine = nullptr;
  }

  int rank_ = 0, nranks_ = 0;
  std::size_t bytes_ = 0;
  proxy::rank_exchange exchange_;
  std::string what_;
  std::vector<void*> base_;
};

}  // namespace reccl
