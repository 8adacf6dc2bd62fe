// reccl/proxy/call_agreement.hpp -- checks, on the host, that the ranks of one process call a
// collective with the same arguments, call by call: rank r's k-th call is compared with every
// other rank's k-th call seen so far. The proxy collectives run all their ranks in one process
// (copy_engine_group), so this sees every rank's arguments before anything is launched.
//
// What must agree: the collective, dtype, op, count, root (broadcast) and the VT split. Buffers
// and deadlines may differ (in-place layouts put each rank's input at its own offset).
//
// Thread safety: record() may be called from any thread (one mutex). Memory: calls are kept until
// every rank has made them, so a rank that falls behind costs one entry per call it owes.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "../policy/allocator/allocator.hpp"
#include "../types.hpp"

namespace reccl::proxy {

/// The arguments of one call that every rank must pass alike.
struct call_digest {
  collective coll = collective::all_reduce;
  dtype type = dtype::float32;
  redop op = redop::sum;
  std::uint64_t count = 0;
  std::int32_t root = 0;       ///< broadcast only (0 for the others)
  reccl::shares vt_shares{};  ///< the split as resolved (equal shares filled in)

  /// "" if `o` agrees with this one, else the first field that differs, as "field: mine vs theirs".
  std::string difference(call_digest const& o) const {
    auto s = [](auto v) { return std::to_string(v); };
    if (coll != o.coll) return "collective: " + std::string(name(coll)) + " vs " + std::string(name(o.coll));
    if (type != o.type) return "dtype: " + std::string(name(type)) + " vs " + std::string(name(o.type));
    if (op != o.op) return "op: " + std::string(name(op)) + " vs " + std::string(name(o.op));
    if (count != o.count) return "count: " + s(count) + " vs " + s(o.count);
    if (root != o.root) return "root: " + s(root) + " vs " + s(o.root);
    if (vt_shares.n_vts != o.vt_shares.n_vts || vt_shares.live_mask != o.vt_shares.live_mask)
      return "vt_shares: " + s(vt_shares.n_vts) + " VTs mask " + s(vt_shares.live_mask) + " vs " + s(o.vt_shares.n_vts) + " VTs mask " +
             s(o.vt_shares.live_mask);
    for (int i = 0; i < max_vts; ++i)
      if (vt_shares.w[i] != o.vt_shares.w[i])
        return "vt_shares: VT " + s(i) + " share " + s(vt_shares.w[i]) + " vs " + s(o.vt_shares.w[i]);
    return {};
  }
};

class call_agreement {
 public:
  explicit call_agreement(int nranks) : calls_(static_cast<std::size_t>(nranks > 0 ? nranks : 0), 0) {}

  /// Records rank `rank`'s next call. Returns "" if it agrees with the same call of every rank seen
  /// so far; otherwise a message naming both ranks, the call's index and the first field that
  /// differs (the call still counts, so the ranks' later calls keep their indices).
  std::string record(int rank, call_digest const& d) {
    std::lock_guard<std::mutex> lock(mu_);
    if (rank < 0 || static_cast<std::size_t>(rank) >= calls_.size()) return "rank " + std::to_string(rank) + " out of range";
    std::uint64_t const k = calls_[static_cast<std::size_t>(rank)]++;
    std::size_t const at = static_cast<std::size_t>(k - base_);
    std::string why;
    if (at == open_.size()) {
      open_.push_back({d, rank, 1});
    } else {
      entry& e = open_[at];
      if (std::string const diff = d.difference(e.first); !diff.empty())
        why = "rank " + std::to_string(rank) + "'s call " + std::to_string(k) + " disagrees with rank " + std::to_string(e.first_rank) +
              "'s: " + diff;
      ++e.seen;
    }
    while (!open_.empty() && open_.front().seen == calls_.size()) {  // every rank made it: forget it
      open_.pop_front();
      ++base_;
    }
    return why;
  }

  /// Calls that some rank has made and another has not yet (kept for comparison).
  std::size_t pending() {
    std::lock_guard<std::mutex> lock(mu_);
    return open_.size();
  }

 private:
  struct entry {
    call_digest first;       ///< the first rank's arguments for this call
    int first_rank = 0;
    std::size_t seen = 0;    ///< ranks that made this call
  };
  std::mutex mu_;
  std::vector<std::uint64_t> calls_;  ///< calls made, per rank
  std::deque<entry> open_;            ///< calls not every rank has made yet, from index base_
  std::uint64_t base_ = 0;
};

}  // namespace reccl::proxy
