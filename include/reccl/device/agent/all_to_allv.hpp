// reccl/device/agent/all_to_allv.hpp -- all-to-allv on the load/store handle, with the counts in
// device memory: one kernel, no host synchronisation, capturable in a CUDA graph.
//
//   CTA c of G, on every rank (each CTA runs the whole protocol on its share of every block):
//   1. publish  my row of the table in my window: send_counts[0..n), recv.len, the data-region
//               offset of my receive buffer, a refusal code (counts or offsets outside my send
//               buffer) and my grid size; signal flag counts+c to every rank, wait for theirs
//   2. agree    read every rank's row (the whole n x n count matrix). Every rank sees the same
//               table, so every rank takes the same decision without another round, in this
//               order: grid sizes that differ (the first rank whose size is not rank 0's), a
//               refusal (the lowest refusing rank), a receive buffer too small for what arrives
//               (the lowest such rank). The fault is recorded on every rank and no data moves.
//               A CTA that another rank's grid lacks waits until its rank's CTA 0 records the
//               mismatch (waits end on a recorded fault)
//   3. put      for each destination d: my block to d goes to d's receive buffer (at the offset d
//               published) at sum_{s < me} counts[s][d] (packed by source), CTA c copying its 1/G
//   4. done     signal flag data+c to every rank, wait for theirs; CTA 0 writes recv_counts and
//               recv_offsets
//
// Reuse: rank d's receive buffer is written only after d's kernel has published its row (step 1),
// so d's earlier stream work on that buffer is over. My row is rewritten in the next call only
// after every rank's data signal (step 4), which each gives after reading the table (step 2).
// Epochs come from per-CTA sequence words in the window, so graph replays continue them.
#pragma once

#include <cstdint>

#include "../handle/memory.hpp"
#include "../wait.hpp"

namespace reccl::device {

inline constexpr int a2av_threads = 512;

/// Flags and symmetric bytes of the all-to-allv kernel, reserved once per communicator.
struct a2av_lane {
  flag_id counts{};               ///< counts.index + cta: CTA cta of the source published its row
  flag_id data{};                 ///< data.index + cta: CTA cta of the source finished its puts to me
  std::uint64_t table_offset = 0; ///< data-region offset of my rows: [max_ctas][row_words(n)] int64
  std::int32_t max_ctas = 0;

  /// A row: counts[n], receive length, receive buffer's window offset, refusal, grid size.
  RECCL_HOST_DEVICE static constexpr int row_words(int n) { return n + 4; }
  RECCL_HOST_DEVICE static constexpr std::uint64_t table_bytes(int n, int max_ctas) {
    return 8ull * static_cast<std::uint64_t>(row_words(n)) * static_cast<std::uint64_t>(max_ctas);
  }
};

/// What a refusal in the table means (row word n + 2).
enum class a2av_refusal : std::int64_t { none = 0, bad_counts = 1 };

template <class T>
struct a2av_args {
  memory_handle h;
  a2av_lane lane;
  T const* send = nullptr;                    ///< any device memory this GPU reads
  std::uint64_t send_len = 0;
  std::int64_t const* send_counts = nullptr;  ///< device memory, nranks entries
  std::int64_t const* send_offsets = nullptr;
  T* recv = nullptr;                          ///< in my window's data region (any offset)
  std::uint64_t recv_len = 0;
  std::int64_t* recv_counts = nullptr;        ///< device memory, written
  std::int64_t* recv_offsets = nullptr;
};

template <class T>
__global__ void __launch_bounds__(a2av_threads) a2av_kernel(a2av_args<T> const a) {
  memory_handle const& h = a.h;
  int const n = h.size(), me = h.rank(), tid = static_cast<int>(threadIdx.x);
  int const cta = static_cast<int>(blockIdx.x), G = static_cast<int>(gridDim.x);
  int const row = a2av_lane::row_words(n);
  flag_id const fc{a.lane.counts.index + static_cast<std::uint32_t>(cta)};
  flag_id const fd{a.lane.data.index + static_cast<std::uint32_t>(cta)};
  std::uint64_t* const seq = h.sequence(fc);
  std::uint64_t const epoch = *seq + 1;
  auto row_of = [&](int r) { return h.at<std::int64_t>(r, a.lane.table_offset) + static_cast<std::int64_t>(cta) * row; };

  // 1. publish
  __shared__ int refused;
  if (tid == 0) refused = 0;
  __syncthreads();
  std::int64_t* const mine = row_of(me);
  if (tid < n) {
    std::int64_t const c = a.send_counts[tid], o = a.send_offsets[tid];
    bool const bad = c < 0 || o < 0 || static_cast<std::uint64_t>(o) > a.send_len ||
                     static_cast<std::uint64_t>(c) > a.send_len - static_cast<std::uint64_t>(o);
    if (bad) atomicOr(&refused, 1);
    mine[tid] = c;
  }
  __syncthreads();
  if (tid == 0) {
    mine[n] = static_cast<std::int64_t>(a.recv_len);
    mine[n + 1] = a.recv ? reinterpret_cast<char const*>(a.recv) - h.at<char>(me, 0) : -1;
    mine[n + 2] = static_cast<std::int64_t>(refused ? a2av_refusal::bad_counts : a2av_refusal::none);
    mine[n + 3] = G;
  }
  deadline_clock clock(h.timeout_ns);
  bool ok = true;
  __syncthreads();  // the row precedes the signals
  if (tid < n && tid != me) {
    h.signal(tid, fc, epoch);
    ok = h.wait(fc, tid, epoch, clock);
  }
  if (__syncthreads_and(ok ? 1 : 0) == 0) return;  // the fault word says why (a peer that never came)

  // 2. agree
  __shared__ std::int64_t table[max_memory_ranks][max_memory_ranks + 4];
  for (int i = tid; i < n * row; i += blockDim.x)
    table[i / row][i % row] = static_cast<std::int64_t>(
        load_relaxed_sys(reinterpret_cast<std::uint64_t const*>(row_of(i / row) + i % row)));
  __syncthreads();
  __shared__ std::uint64_t verdict;  // a fault's encoding, 0 when the call goes ahead
  if (tid == 0) {
    fault f{};
    for (int s = 0; s < n && f.ok(); ++s)
      if (table[s][n + 3] != table[0][n + 3]) f = fault{status::invalid_argument, s, 0, -1, fault_cause::peer_mismatch};
    for (int s = 0; s < n && f.ok(); ++s)
      if (table[s][n + 2] != 0) f = fault{status::invalid_argument, s, -1, -1, fault_cause::bad_argument};
    // no refusal: every count lies in [0, its sender's send_len], so the sums below are of
    // non-negative values; they saturate instead of wrapping
    for (int s = 0; s < n && f.ok(); ++s) {
      std::uint64_t total = 0;
      for (int r = 0; r < n; ++r) {
        std::uint64_t const c = static_cast<std::uint64_t>(table[r][s]);
        total = total + c < total ? ~std::uint64_t{0} : total + c;
      }
      if (total > static_cast<std::uint64_t>(table[s][n]) || (total > 0 && table[s][n + 1] < 0))
        f = fault{status::invalid_argument, s, -1, -1, fault_cause::receive_overflow};
    }
    verdict = f.ok() ? 0 : f.encode();
    if (!f.ok()) h.record_fault(f);
  }
  __syncthreads();
  if (verdict != 0) return;

  // 3. put: my block to d, this CTA's share of it, in 16-byte-aligned pieces
  std::int64_t placed[max_memory_ranks];
  for (int d = 0; d < n; ++d) {
    std::int64_t at = 0;
    for (int s = 0; s < me; ++s) at += table[s][d];
    placed[d] = at;
  }
  for (int i = 0; i < n; ++i) {
    int const d = (me + 1 + i) % n;  // spread the first puts over the peers
    std::uint64_t const bytes = static_cast<std::uint64_t>(table[me][d]) * sizeof(T);
    if (bytes == 0) continue;
    std::uint64_t const share = (bytes + G - 1) / G;
    std::uint64_t const piece = (share + 15) / 16 * 16;
    std::uint64_t const lo = piece * static_cast<std::uint64_t>(cta);
    if (lo >= bytes) continue;
    std::uint64_t const hi = lo + piece < bytes ? lo + piece : bytes;
    char* const dst = h.at<char>(d, static_cast<std::uint64_t>(table[d][n + 1])) + placed[d] * sizeof(T) + lo;
    char const* const src = reinterpret_cast<char const*>(a.send + a.send_offsets[d]) + lo;
    memory_handle::copy(dst, src, hi - lo, tid, static_cast<int>(blockDim.x));
  }

  // 4. done
  __syncthreads();  // every thread's puts precede the signals
  ok = true;
  if (tid < n) {
    h.signal(tid, fd, epoch);
    ok = h.wait(fd, tid, epoch, clock);
  }
  if (__syncthreads_and(ok ? 1 : 0) == 0) return;
  if (cta == 0 && tid < n) {
    a.recv_counts[tid] = table[tid][me];
    std::int64_t at = 0;
    for (int s = 0; s < tid; ++s) at += table[s][me];
    a.recv_offsets[tid] = at;
  }
  if (tid == 0) *seq = epoch;
}

}  // namespace reccl::device
