// reccl/device/flags.hpp -- bounded waits, the sticky status word, and reccl's CTA-pair barrier.
//
// NCCL 2.28's LSA barrier cannot time out, so reccl keeps its own flags in its scratch window:
//  * every wait polls local memory and gives up at a deadline (`%globaltimer`), or as soon as the
//    lane's status word shows an error raised elsewhere;
//  * the first error of a lane wins (atomicCAS from 0) and is sticky: later collectives on that lane
//    do nothing (no hang, no write) until the communicator is rebuilt; the host reads the word;
//  * barriers pair CTA b of every rank only with CTA b of the others (no grid-wide dependency, so
//    no co-residency requirement) and carry a descriptor hash: ranks that disagree on count, dtype,
//    op or algorithm fail with `mismatch` before any peer memory is touched.
#pragma once

#include <cstdint>

#include "../types.hpp"
#include "primitives.hpp"
#include "transport/lsa.hpp"
#include "wait.hpp"

namespace reccl::device {

/// Spin until *flag >= target (acquire). Returns false when the guard gives up. `spins` counts
/// unsuccessful polls (stall telemetry).
template <class Guard>
RECCL_DEVICE bool wait_at_least(std::uint64_t const* flag, std::uint64_t target, Guard& guard, std::uint64_t& spins) {
  return spin_until([&] { return load_acquire_sys(flag) >= target; }, guard, spins);
}

/// wait_at_least under the lane's deadline: false on timeout (after raising it) or when the lane
/// already holds an error.
RECCL_DEVICE bool wait_at_least(std::uint64_t const* flag, std::uint64_t target, deadline_clock& deadline,
                                std::uint32_t* status_word, std::uint64_t& spins) {
  lane_guard g{&deadline, status_word, nullptr};
  return wait_at_least(flag, target, g, spins);
}

/// Ready flags of the pipelined engine: the chunk sequence in the low 48 bits, a 16-bit fold of the
/// call's descriptor in the high 16, so ranks that disagree are caught at their first chunk.
inline constexpr std::uint64_t ready_seq_mask = (1ull << 48) - 1;
RECCL_DEVICE std::uint64_t ready_word(std::uint64_t seq, std::uint32_t desc) {
  return (seq & ready_seq_mask) | (static_cast<std::uint64_t>((desc ^ (desc >> 16)) & 0xffffu) << 48);
}

/// Spin until the sequence in *flag reaches `target`. When it equals `target` exactly, the
/// descriptor fold must match ours (a larger value belongs to a later chunk, maybe a later call);
/// a mismatch is raised on `status_word` and ends the wait.
template <class Guard>
RECCL_DEVICE bool wait_ready(std::uint64_t const* flag, std::uint64_t target, std::uint32_t desc, Guard& guard,
                             std::uint32_t* status_word, std::uint64_t& spins) {
  std::uint64_t const want = ready_word(target, desc);
  bool mismatch = false;
  bool const ok = spin_until(
      [&] {
        std::uint64_t const w = load_acquire_sys(flag);
        std::uint64_t const s = w & ready_seq_mask;
        if (s < target) return false;
        mismatch = s == target && w != want;
        return true;
      },
      guard, spins);
  if (mismatch) raise_status(status_word, status::mismatch, peer_of(guard));
  return ok && !mismatch;
}
RECCL_DEVICE bool wait_ready(std::uint64_t const* flag, std::uint64_t target, std::uint32_t desc, deadline_clock& deadline,
                             std::uint32_t* status_word, std::uint64_t& spins) {
  lane_guard g{&deadline, status_word, nullptr};
  return wait_ready(flag, target, desc, g, status_word, spins);
}

/// Barrier word: epoch in the high half, descriptor hash in the low half.
RECCL_DEVICE std::uint64_t barrier_word(std::uint32_t epoch, std::uint32_t desc) {
  return (static_cast<std::uint64_t>(epoch) << 32) | desc;
}

/// Barrier among CTA `cta` of every rank. Release on arrival (covers every thread of the CTA through
/// the preceding __syncthreads), acquire on completion. Must be called by all threads of the CTA.
/// Returns false (after recording the status) on timeout or descriptor mismatch.
RECCL_DEVICE bool cta_barrier(lsa_view const& v, int cta, std::uint32_t epoch, std::uint32_t desc,
                              deadline_clock& deadline) {
  __shared__ int failed;
  if (threadIdx.x == 0) failed = 0;
  __syncthreads();
  int const t = static_cast<int>(threadIdx.x);
  std::uint32_t* const st = v.status();
  if (t < v.nranks && t != v.rank) {
    store_release_sys(v.bar(t, cta, v.rank), barrier_word(epoch, desc));
    std::uint64_t const* in = v.bar(v.rank, cta, t);
    lane_guard g{&deadline, st, nullptr, t};
    bool mismatch = false;
    bool const arrived = spin_until(
        [&] {
          std::uint64_t const w = load_acquire_sys(in);
          std::int32_t const ahead = static_cast<std::int32_t>(static_cast<std::uint32_t>(w >> 32) - epoch);
          if (ahead < 0) return false;
          // A peer one barrier ahead has already passed this one (it saw our arrival), and its word
          // now carries the next barrier's descriptor: only an exact epoch match checks the hash.
          mismatch = ahead == 0 && static_cast<std::uint32_t>(w) != desc;
          return true;
        },
        g);
    if (mismatch) raise_status(st, status::mismatch, t);
    if (!arrived || mismatch) failed = 1;
  }
  __syncthreads();
  return failed == 0;
}

}  // namespace reccl::device
