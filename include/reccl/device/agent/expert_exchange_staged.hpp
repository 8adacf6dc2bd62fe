// reccl/device/agent/expert_exchange_staged.hpp -- MoE dispatch in one round (moe_protocol::staged):
// the same output as the table protocol's dispatch (expert_exchange.hpp: grouped rows in (source
// rank, token, slot) order per expert, counts, offsets, zeroed padding, records for combine), for
// small batches where the table round costs more than the rows.
//
//   one kernel on every rank (stream order), lane.ctas CTAs, all resident at once:
//   1. publish  (CTA 0)     check my routing (an expert outside [-1, n_experts) or twice in a token:
//                           a refusal), count what a mask drops, push my head {digest, refusal,
//                           mask, tokens} into every live rank's window and signal `table` to it
//   2. agree    (every CTA) only until a dispatch of this exchange succeeded: wait for every live
//                           rank's `table` and check the heads before any row moves (a rank created
//                           with another config could otherwise write past the staging it has)
//   3. send     (every CTA) token t's row goes once to each rank it visits, into my staging slot
//                           t there, with a record of each slot's local expert there (-1: not
//                           there) -- every token gets a record at every live rank; signal done
//   4. check    (every CTA) wait for every live rank's done (which follows its head); the heads of
//                           this call (check_heads): a shape or mask that differs from the first
//                           live rank's, a token count above max_tokens, or a refusal records the
//                           same fault everywhere and nothing is filed
//   5. plan     (every CTA) rank the received slots per local expert in (source, token, slot)
//                           order, in shared memory; aligned starts per expert (CTA 0 writes the
//                           counts, offsets, and where each source's records start)
//   6. file     (every CTA) copy each staged row to its slots' grouped positions, write combine's
//                           records {position, return index t * k + j}; zero the padding rows
//   Combine is the table protocol's kernel: it returns y's rows to landing[t * k + j] of the
//   token's rank, which is where the sender's slot_rows point.
//
// Reuse across calls: staging, records and heads have two copies by call parity. Source s writes
// copy p in call i, then again in call i + 2 only after its dispatch of call i + 1 waited for my
// done of call i + 1, which I signal after filing call i (stream order). Combine writes landing
// as in the table protocol. Epochs are the per-CTA sequence words of `done`.
#pragma once

#include <cub/block/block_scan.cuh>

#include "expert_exchange.hpp"

namespace reccl::device {

/// Dynamic shared memory of the staged dispatch kernel: the plan step's per-warp counts [warps][E /
/// n], then one word per received slot [n * max_tokens * k] (at most 64 + 64 KiB).
RECCL_HOST_DEVICE constexpr std::uint64_t moe_staged_smem(moe_lane const& L) {
  return 4ull * (moe_threads / 32) * static_cast<std::uint64_t>(L.route.experts_per_rank()) +
         4ull * static_cast<std::uint64_t>(L.route.nranks) * L.max_tokens * static_cast<std::uint64_t>(L.route.top_k);
}

namespace moe_detail {

/// Index of (call parity, source, token) in a staged area of `owner`'s window.
RECCL_DEVICE std::uint64_t staged_index(moe_lane const& L, int src, std::uint64_t t, std::uint64_t epoch) {
  return ((epoch & 1u) * static_cast<std::uint64_t>(L.route.nranks) + static_cast<std::uint64_t>(src)) * L.max_tokens + t;
}
/// Staged step 1 (CTA 0): refusal and drop counts of my routing; my head pushed to every live
/// rank, each followed by `table` (release: the head is visible to whoever acquires the flag).
template <class Tok>
RECCL_DEVICE void staged_publish(moe_args<Tok> const& a, std::uint64_t dead, std::uint64_t epoch) {
  memory_handle const& h = a.h;
  moe::routing const g = a.lane.route;
  int const n = g.nranks, k = g.top_k, E = g.n_experts, me = h.rank(), tid = static_cast<int>(threadIdx.x);
  int const warp = tid / 32, lane = tid % 32, warps = static_cast<int>(blockDim.x / 32);
  bool bad = tid == 0 && is_dead(dead, me);  // masked by itself: refused, naming this rank
  unsigned long long lost_slots = 0, lost_tokens = 0;
  // a round of a warp: 32 / k whole tokens, lane i on slot i % k of the round's token i / k (what
  // moe::ranks_of_token checks, with warp votes); B rounds' routing loaded at once so that their
  // loads overlap
  constexpr int B = 4;
  int const per = 32 / k, tl = lane / k, j = lane % k;  // top_k <= 32
  bool const on = tl < per;
  std::uint32_t const slots_of_token = k == 32 ? 0xffffffffu : (1u << k) - 1u;
  std::uint64_t const T = a.n_tokens, step = static_cast<std::uint64_t>(per) * B;
  for (std::uint64_t t0 = static_cast<std::uint64_t>(warp) * step; t0 < T; t0 += static_cast<std::uint64_t>(warps) * step) {
    std::int32_t idx[B];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      std::uint64_t const t = t0 + static_cast<std::uint64_t>(b * per + tl);
      idx[b] = on && t < T ? a.topk_idx[t * k + j] : -1;
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if (t0 + static_cast<std::uint64_t>(b * per) >= T) break;  // the same in every lane
      bool const mine = on && t0 + static_cast<std::uint64_t>(b * per + tl) < T;
      std::int32_t const e = idx[b];
      bool const used = e >= 0 && e < E;
      // a used expert named twice in one token (experts < 1024: the round's token in the bits above)
      std::uint32_t const same = __match_any_sync(0xffffffffu, used ? (tl << 10 | e) : -1 - lane);
      if (mine && ((e < -1 || e >= E) || (used && __popc(same) > 1))) bad = true;
      std::uint32_t const lost = __ballot_sync(0xffffffffu, mine && used && is_dead(dead, g.rank_of(e)));
      if (mine && j == 0)
        if (std::uint32_t const slots = (lost >> (tl * k)) & slots_of_token; slots != 0) lost_slots += static_cast<unsigned>(__popc(slots)), ++lost_tokens;
    }
  }
  RECCL_MOE_MARK(h, 15);
  int const refused = note_routing(a.s, dead, bad, lost_slots, lost_tokens);
  if (tid < n && !is_dead(dead, tid)) {
    std::int64_t* const head = head_at(h, a.lane, tid, me, epoch);
    head[0] = a.lane.digest, head[1] = refused, head[2] = static_cast<std::int64_t>(dead);
    head[3] = static_cast<std::int64_t>(T);
    h.signal(tid, a.lane.table, epoch);
  }
}

/// Staged step 3 (every CTA): (token, piece) pairs over the grid's warps; lane j < k holds slot j.
/// The piece-0 warp writes the token's record at every live rank, its fp8 scales where it goes,
/// and where each of its slots comes back (slot_rows: t * k + j, or -1).
template <class Tok>
RECCL_DEVICE void staged_send(moe_args<Tok> const& a, std::uint64_t dead, std::uint64_t epoch) {
  memory_handle const& h = a.h;
  moe::routing const g = a.lane.route;
  int const n = g.nranks, k = g.top_k, E = g.n_experts, me = h.rank(), lane = static_cast<int>(threadIdx.x % 32);
  std::uint64_t const RB = a.lane.row_bytes, SW = static_cast<std::uint64_t>(a.lane.scale_words);
  for_each_piece(a.n_tokens, RB, [&](std::uint64_t t, std::uint64_t piece, std::uint64_t o, std::uint64_t len) {
    std::int32_t e = lane < k ? a.topk_idx[t * k + lane] : -1;
    if (e < 0 || e >= E) e = -1;  // a bad index refuses the call (the head says so): sent as unused
    int const d_of = e >= 0 ? g.rank_of(e) : -1;
    if (d_of >= 0 && is_dead(dead, d_of)) e = -1;
    std::uint64_t const bit = e >= 0 ? std::uint64_t{1} << d_of : 0;
    std::uint64_t const visits = static_cast<std::uint64_t>(__reduce_or_sync(0xffffffffu, static_cast<std::uint32_t>(bit))) |
                                 static_cast<std::uint64_t>(__reduce_or_sync(0xffffffffu, static_cast<std::uint32_t>(bit >> 32))) << 32;
    std::uint64_t const at = staged_index(a.lane, me, t, epoch);
    if (piece == 0 && lane < k) a.s.slot_rows[t * k + lane] = e >= 0 ? static_cast<std::int64_t>(t * k + lane) : -1;
    if (piece == 0)
      for (int d = 0; d < n; ++d) {
        if (is_dead(dead, d)) continue;
        if (lane < k) h.at<std::int32_t>(d, a.lane.staged_records_off)[at * k + lane] = e >= 0 && d_of == d ? g.local_of(e) : -1;
        if ((visits >> d) & 1u && SW > 0) copy_row(h.at<float>(d, a.lane.staged_scales_off) + at * SW, a.x_scales + t * SW, SW * 4, lane);
      }
    copy_each(
        visits, [&](int) { return static_cast<char const*>(a.x) + t * RB + o; },
        [&](int d) { return h.at<char>(d, a.lane.staged_rows_off) + at * RB + o; }, len, lane);
  });
}

/// Source rank of record `item` (items in source order; base: [n + 1] prefix of source tokens).
RECCL_DEVICE int source_of(std::int32_t const* base, int n, std::uint64_t item) {
  int s = 0;
  while (s + 1 < n && static_cast<std::uint64_t>(base[s + 1]) <= item) ++s;
  return s;
}

/// Staged step 5 (every CTA, after check_heads filled `heads`): base[s] = first record of source s
/// (prefix of the heads' token counts), and slot_pos[(item) * k + j] = the grouped position of received slot j of record item
/// (-1: not here); P's start (this rank's experts), count and pad_end as the table protocol's plan.
template <class Tok>
RECCL_DEVICE void staged_plan(moe_args<Tok> const& a, std::uint64_t dead, std::uint64_t epoch, std::int64_t const (*heads)[moe_lane::head_words],
                              plan& P, std::int32_t* base, std::int32_t* smem) {
  memory_handle const& h = a.h;
  moe::routing const g = a.lane.route;
  int const n = g.nranks, k = g.top_k, epr = g.experts_per_rank(), me = h.rank();
  int const tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, warps = static_cast<int>(blockDim.x / 32);
  int const cta = static_cast<int>(blockIdx.x);
  if (tid == 0) {
    std::int32_t at = 0;
    for (int s = 0; s < n; ++s) {
      base[s] = at;
      if (!is_dead(dead, s)) at += static_cast<std::int32_t>(heads[s][3]);  // checked: within max_tokens
    }
    base[n] = at;
  }
  __syncthreads();
  std::uint64_t const N = static_cast<std::uint64_t>(base[n]) * k;  // received slots, in (source, token, slot) order
  std::int32_t* const hist = smem;                                  // [warps][epr]
  std::int32_t* const slot_pos = smem + warps * epr;                // [N]: (local expert << 16 | rank in warp), then the position
  // whole rounds of 32 slots per warp: a handful of slots takes one warp (one count to scan)
  std::uint64_t const chunk = ((N + warps - 1) / warps + 31) / 32 * 32;
  int const used = chunk == 0 ? 0 : static_cast<int>((N + chunk - 1) / chunk);
  std::uint64_t const q0 = chunk * warp < N ? chunk * warp : N, q1 = q0 + chunk < N ? q0 + chunk : N;
  std::int32_t* const mine = hist + warp * epr;
  if (warp < used)
    for (int i = lane; i < epr; i += 32) mine[i] = 0;
  __syncwarp();  // rank_in_round reads counts other lanes zeroed
  std::int32_t const* const records = h.at<std::int32_t>(me, a.lane.staged_records_off);
  constexpr int B = 4;  // rounds whose records are loaded at once
  for (std::uint64_t r0 = q0; r0 < q1; r0 += 32 * B) {
    std::int32_t key[B];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      std::uint64_t const q = r0 + 32 * b + lane;
      key[b] = -1;
      if (q < q1) {
        std::uint64_t const item = q / k;
        int const s = source_of(base, n, item);
        key[b] = records[staged_index(a.lane, s, item - base[s], epoch) * k + q % k];
      }
    }
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if (r0 + 32 * b >= q1) break;  // the same in every lane
      std::uint64_t const q = r0 + 32 * b + lane;
      std::int32_t const l = key[b] >= 0 && key[b] < epr ? key[b] : -1;
      std::int32_t const r = rank_in_round(l, mine, lane);
      if (q < q1) slot_pos[q] = l < 0 ? -1 : (l << 16 | r);
    }
  }
  __syncthreads();
  RECCL_MOE_MARK(h, 13);
  // per-warp counts -> per-warp bases; totals are the counts per local expert
  for (int l = tid; l < epr; l += static_cast<int>(blockDim.x)) P.count[l] = counts_to_bases(hist, epr, used, l);
  __syncthreads();
  {  // aligned starts (exclusive prefix of the aligned counts) and padding (inclusive prefix), in
     // one block scan of (size << 32 | padding): both sums stay below 2^31
    using scan = cub::BlockScan<std::uint64_t, moe_threads>;
    __shared__ typename scan::TempStorage scan_space;
    constexpr int per = moe_max_experts / moe_threads;  // experts per thread, blocked
    static_assert(moe_max_experts % moe_threads == 0);
    std::uint64_t const al = static_cast<std::uint64_t>(a.lane.align);
    std::uint64_t v[per], below[per], sum;
#pragma unroll
    for (int i = 0; i < per; ++i) {
      int const l = tid * per + i;
      std::uint64_t const c = l < epr ? static_cast<std::uint64_t>(P.count[l]) : 0, size = (c + al - 1) / al * al;
      v[i] = size << 32 | (size - c);
    }
    scan(scan_space).ExclusiveSum(v, below, sum);
#pragma unroll
    for (int i = 0; i < per; ++i)
      if (int const l = tid * per + i; l < epr) {
        std::int32_t const start = static_cast<std::int32_t>(below[i] >> 32);
        P.start[me * epr + l] = start, P.pad_end[l] = static_cast<std::int32_t>((below[i] + v[i]) & 0xffffffffu);
        if (cta == 0) a.s.expert_counts[l] = P.count[l], a.s.expert_offsets[l] = start;
      }
    if (cta == 0 && tid == 0) a.s.expert_offsets[epr] = static_cast<std::int32_t>(sum >> 32);
  }
  if (cta == 0 && tid >= 32 && tid <= 32 + n) a.s.rows_from[tid - 32] = base[tid - 32];
  __syncthreads();
  RECCL_MOE_MARK(h, 14);
  for (std::uint64_t q = tid; q < N; q += blockDim.x) {
    std::int32_t const v = slot_pos[q];
    if (v < 0) continue;
    int const l = v >> 16, w = static_cast<int>(q / chunk);
    slot_pos[q] = P.start[me * epr + l] + hist[w * epr + l] + (v & 0xffff);
  }
  __syncthreads();
}

/// Staged step 6 (every CTA): (record, piece) pairs over the grid's warps: the staged row to each
/// of its slots' positions; the piece-0 warp copies the fp8 scales and writes combine's record.
template <class Tok>
RECCL_DEVICE void staged_file(moe_args<Tok> const& a, std::uint64_t epoch, std::int32_t const* base, std::int32_t const* slot_pos) {
  memory_handle const& h = a.h;
  int const n = a.lane.route.nranks, k = a.lane.route.top_k, R = a.lane.record_words(), me = h.rank();
  int const lane = static_cast<int>(threadIdx.x % 32);
  std::uint64_t const RB = a.lane.row_bytes, SW = static_cast<std::uint64_t>(a.lane.scale_words);
  char* const grouped = h.at<char>(me, a.lane.grouped_off);
  float* const scales = h.at<float>(me, a.lane.scales_off);
  char const* const rows_in = h.at<char>(me, a.lane.staged_rows_off);
  float const* const scales_in = h.at<float>(me, a.lane.staged_scales_off);
  std::int32_t* const records = h.at<std::int32_t>(me, a.lane.records_off);
  std::uint64_t const items = static_cast<std::uint64_t>(base[n]);
  for_each_piece(items, RB, [&](std::uint64_t item, std::uint64_t piece, std::uint64_t o, std::uint64_t len) {
    int const s = source_of(base, n, item);
    std::uint64_t const t = item - static_cast<std::uint64_t>(base[s]), at = staged_index(a.lane, s, t, epoch);
    std::int32_t const pos = lane < k ? slot_pos[item * k + lane] : -1;
    if (piece == 0 && lane < k)
      records[item * R + lane] = pos, records[item * R + k + lane] = pos >= 0 ? static_cast<std::int32_t>(t * k + lane) : -1;
    std::uint32_t const on = __ballot_sync(0xffffffffu, pos >= 0);
    auto place = [&](int j) { return static_cast<std::uint64_t>(__shfl_sync(0xffffffffu, pos, j)); };
    copy_each(
        on, [&](int) { return rows_in + at * RB + o; }, [&](int j) { return grouped + place(j) * RB + o; }, len, lane);
    if (SW > 0 && piece == 0)
      for (std::uint32_t b = on; b != 0; b &= b - 1) copy_row(scales + place(__ffs(b) - 1) * SW, scales_in + at * SW, SW * 4, lane);
  });
}

}  // namespace moe_detail

/// Staged dispatch: lane.ctas CTAs of moe_threads, moe_staged_smem() bytes of dynamic shared
/// memory, every CTA resident at once.
template <class Tok>
__global__ void __launch_bounds__(moe_threads) moe_staged_dispatch_kernel(moe_args<Tok> const a) {
  using namespace moe_detail;
  memory_handle const& h = a.h;
  int const n = a.lane.route.nranks, tid = static_cast<int>(threadIdx.x), cta = static_cast<int>(blockIdx.x);
  RECCL_MOE_MARK(h, 0);
  moe_call const call = begin_call(h, a.lane.done, a.s.dead_ranks);
  std::uint64_t const dead = call.dead, epoch = call.epoch;
  bool const agreed = *a.s.agreed != 0;  // written only by an earlier dispatch's CTA 0
  extern __shared__ std::int32_t smem[];
  __shared__ std::int64_t heads[max_memory_ranks][moe_lane::head_words];
  auto const pushed_here = [me = h.rank()](int) { return me; };  // every source's head is in my window
  if (cta_faulted(h)) return;
  if (cta == 0) staged_publish(a, dead, epoch);
  RECCL_MOE_MARK(h, 1);
  if (!agreed && (!wait_heads(h, a.lane, dead, epoch) || !check_heads(h, a.lane, dead, epoch, pushed_here, heads))) return;
  RECCL_MOE_MARK(h, 2);
  staged_send(a, dead, epoch);
  __syncthreads();  // every thread's puts precede the signals
  if (tid < n && !is_dead(dead, tid)) h.signal(tid, flag_id{a.lane.done.index + static_cast<std::uint32_t>(cta)}, epoch);
  RECCL_MOE_MARK(h, 4);
  if (!moe_wait_all(h, a.lane.done, a.lane.ctas, epoch, dead)) return;
  RECCL_MOE_MARK(h, 6);
  if (!check_heads(h, a.lane, dead, epoch, pushed_here, heads)) return;
  RECCL_MOE_MARK(h, 12);
  __shared__ plan P;
  __shared__ std::int32_t base[max_memory_ranks + 1];
  staged_plan(a, dead, epoch, heads, P, base, smem);
  RECCL_MOE_MARK(h, 3);
  staged_file(a, epoch, base, smem + (moe_threads / 32) * a.lane.route.experts_per_rank());
  zero_padding(a, P);
  RECCL_MOE_MARK(h, 5);
  if (tid == 0) *call.seq = epoch;
  if (cta == 0 && tid == 0) *a.s.agreed = 1;
  RECCL_MOE_MARK(h, 7);
}

}  // namespace reccl::device
