// reccl/cpu/all_to_allv.hpp -- all-to-allv on the CPU engine, from three of its collectives.
//
//   1. counts   all_to_all<int64>, one element per pair: rank d learns send_counts[d] of every rank
//   2. agree    all_reduce<int64, max> of {why this rank refuses the call, its largest count}:
//               a refusal anywhere ends the call on every rank before data moves; else every rank
//               learns the largest count B of any pair
//   3. data     all_to_all<T> of blocks padded to B elements, then unpacked by source
//
// Each step is a CPU-engine collective with the caller's Schedule, Telemetry and Allocator, so it
// is split over the VTs, survives a dying VT and bounds every wait like the others. Padding to B
// moves nranks * B elements per rank whatever the counts: this engine is the reference and the
// test bed of the operation, not a fast path for skewed traffic.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "../all_to_allv.hpp"
#include "../collective.hpp"
#include "../policy/schedule/one_shot.hpp"

namespace reccl::cpu {

/// What all_to_allv returns on each rank.
struct all_to_allv_result {
  status st = status::ok;       ///< ok, or recovered (a VT died in one of its steps; the result is still right)
  std::uint64_t received = 0;   ///< elements written to recv.data
  std::uint64_t block = 0;      ///< B: the padded block of the data step (the largest count of any pair)
};

namespace detail {

/// Checks one rank's send side against its buffer: the first problem, or empty.
template <class T>
std::string check_send(v_send<T> const& s, int n) {
  if (s.counts == nullptr || s.offsets == nullptr) return "send counts or offsets are null";
  for (int d = 0; d < n; ++d) {
    std::int64_t const c = s.counts[d], o = s.offsets[d];
    std::string const at = " for rank " + std::to_string(d);
    if (c < 0 || o < 0) return "negative count or offset" + at;
    if (static_cast<std::uint64_t>(o) > s.len || static_cast<std::uint64_t>(c) > s.len - static_cast<std::uint64_t>(o))
      return "count " + std::to_string(c) + " at offset " + std::to_string(o) + at + " runs past the send buffer (" +
             std::to_string(s.len) + " elements)";
    if (c > 0 && s.data == nullptr) return "send buffer is null";
  }
  return {};
}

/// The agreement word: the refusal (high bits) and the refusing rank + 1 (low bits); the max over
/// ranks names one refusing rank and the gravest refusal.
constexpr std::int64_t reject_word(call_reject why, int rank) {
  return why == call_reject::none ? 0 : (static_cast<std::int64_t>(why) << 8) | (rank + 1);
}

}  // namespace detail

/// all-to-allv on rank `rank` of `comm` (see reccl/all_to_allv.hpp). `refuse` and `why` let a
/// caller built on it (MoE dispatch) fold its own checks into the agreement step; `op_name`
/// begins its error messages.
template <class T, Schedule S, Telemetry M, Allocator A>
all_to_allv_result run_all_to_allv(communicator& comm, int rank, v_send<T> send, v_recv<T> recv, A const& alloc = A{},
                                   call_reject refuse = call_reject::none, std::string why = {},
                                   char const* op_name = "all_to_allv") {
  int const n = comm.nranks();
  if (rank < 0 || rank >= n) throw error(status::invalid_argument, "rank outside [0, nranks)", rank);
  using i64 = std::int64_t;
  using counts_op = collective_op<collective::all_to_all, i64, S, transport::cpu_threads, M, A>;
  using agree_op = collective_op<collective::all_reduce, i64, schedule::one_shot, transport::cpu_threads, M, A>;
  using data_op = collective_op<collective::all_to_all, T, S, transport::cpu_threads, M, A>;
  all_to_allv_result res;
  auto note = [&](auto const& r) {
    if (r.st == status::recovered) res.st = status::recovered;
  };

  // -- 1. counts (zeros from a rank that refuses: it still takes part, so no peer waits on it)
  if (refuse == call_reject::none) {
    why = detail::check_send(send, n);
    if (!why.empty()) refuse = call_reject::bad_arguments;
    else if (recv.counts == nullptr || recv.offsets == nullptr) refuse = call_reject::bad_arguments, why = "receive counts or offsets are null";
  }
  std::vector<i64> out_counts(n, 0), in_counts(n, 0);
  if (refuse == call_reject::none) std::copy(send.counts, send.counts + n, out_counts.begin());
  note(counts_op::run(comm, rank, out_counts.data(), in_counts.data(), 1, redop::sum, 0, alloc));

  // -- 2. agree
  std::uint64_t total = 0;
  for (i64 c : in_counts) total += static_cast<std::uint64_t>(c);
  if (refuse == call_reject::none && total > 0 && (total > recv.len || recv.data == nullptr)) {
    refuse = call_reject::overflow;
    why = std::to_string(total) + " elements arrive, the receive buffer holds " + std::to_string(recv.data ? recv.len : 0);
  }
  i64 const largest = *std::max_element(out_counts.begin(), out_counts.end());
  i64 mine[2] = {detail::reject_word(refuse, rank), largest}, all[2] = {};
  note(agree_op::run(comm, rank, mine, all, 2, redop::max, 0, alloc));
  if (all[0] != 0) {
    int const who = static_cast<int>(all[0] & 0xff) - 1;
    auto const kind = static_cast<call_reject>(all[0] >> 8);
    std::string const what = who == rank ? why : "rank " + std::to_string(who) + " refused the call: " + std::string(describe(kind));
    throw error(status::invalid_argument, std::string(op_name) + ": " + what, who);
  }

  // -- 3. data
  i64 offset = 0;
  for (int s = 0; s < n; ++s) {
    recv.counts[s] = in_counts[s];
    recv.offsets[s] = offset;
    offset += in_counts[s];
  }
  res.received = total;
  res.block = static_cast<std::uint64_t>(all[1]);
  if (res.block == 0) return res;
  std::uint64_t const b = res.block;
  std::vector<T> staged(n * b), landed(n * b);
  for (int d = 0; d < n; ++d)
    if (send.counts[d] > 0)
      std::memcpy(static_cast<void*>(staged.data() + d * b), send.data + send.offsets[d], send.counts[d] * sizeof(T));
  note(data_op::run(comm, rank, staged.data(), landed.data(), b, redop::sum, 0, alloc));
  for (int s = 0; s < n; ++s)
    if (in_counts[s] > 0)
      std::memcpy(static_cast<void*>(recv.data + recv.offsets[s]), landed.data() + s * b, in_counts[s] * sizeof(T));
  return res;
}

}  // namespace reccl::cpu
