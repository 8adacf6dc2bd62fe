// reccl/device/agent/expert_exchange.hpp -- MoE dispatch and combine on the load/store handle:
// the same layout and arithmetic as the CPU engine's (reccl/cpu/expert_exchange.hpp), with the
// routing in device memory and no host synchronisation (capturable in a CUDA graph).
//
//   dispatch: one kernel on every rank (stream order), lane.ctas CTAs, all resident at once:
//   1. layout   (CTA 0)   rank every slot among this rank's slots of the same expert and of the same
//                         destination rank, and every token among this rank's tokens to each rank,
//                         in (token, slot) order; publish my head in my window -- a digest of the
//                         exchange's shape (config, CTAs, token size, protocol), a refusal (an
//                         expert index outside [-1, n_experts), or twice in a token), my mask and
//                         token count -- and my row of the table: counts per expert, rows and
//                         (token, slot) pairs per destination; signal it to every rank, this one
//                         included
//   2. plan     (every CTA) wait for every rank's row; every rank then sees the same table: a shape
//                         or mask that differs from the first live rank's, a token count above
//                         max_tokens, or a refusal records the same fault (naming the first such
//                         rank) everywhere, and nothing moves (check_heads). From the table: where
//                         each expert's rows start on its rank (aligned), and how many rows of each
//                         expert lower ranks send
//   3. send     (every CTA) each token row crosses once to each rank it visits, into the grouped
//                         position of its first slot there, with a record {grouped position, return
//                         index} per slot; signal done; zero my padding rows meanwhile
//   4. file     (every CTA) wait for every rank's done; copy each row to its other slots' positions
//                         (local)
//   A dispatched row is lane.row_bytes of values (token rows, or fp8 e4m3 bytes) and, for fp8,
//   lane.scale_words fp32 scales that travel beside it into a second grouped area (scales_off):
//   the kernels move bytes and never read them, so fp8 rows arrive bit for bit.
//   combine: one kernel, lane.ctas CTAs, all resident at once:
//   5. return   for each record, put y's row at each slot's position into the token's rank, at
//               the slot's return index there; signal done
//   6. sum      wait for every rank's done; out[t] = round(fma over slots in top-k order)
//   Row copies are spread as (row, piece) pairs over the grid's warps: a few rows are cut into
//   pieces of at least 512 bytes so that every warp has work; many rows go one per warp.
//   This is the table protocol (moe_protocol::table); the staged protocol
//   (expert_exchange_staged.hpp) does dispatch in one round through per-source staging areas and
//   leaves the same output and records, so combine is this kernel for both.
//
// Dead ranks: the word scratch.dead_ranks (bit r: rank r is out; host: mask_ranks) is read by each
// dispatch when it runs and kept for the call (scratch.call_dead, which its combine uses too).
// A masked rank is never waited for, signalled or written to; its counts read as zero; slots whose
// expert it holds are dropped (counted in scratch.report, and skipped by the sum as an unused slot).
// Every live rank publishes its mask in its head (heads_off), and a live rank whose mask differs from
// the first live rank's records a mismatch naming it; a rank masked by itself refuses the call.
//
// Reuse across calls needs no extra round: a rank writes into rank d's window (grouped rows,
// records) only after d's layout step of the same call has published its row, which comes after
// d's previous dispatch kernel in d's stream; combine writes into the token's rank only after that
// rank's dispatch of the same call, which follows its previous combine. Padding rows are never
// written by peers. Table rows alternate between two copies by the parity of the call: rank s
// rewrites copy p only in call i + 2, after its dispatch of call i + 1 waited for every rank's
// sends of call i + 1, which follow that rank's reads of copy p in call i -- so dispatches may
// follow each other without a combine. Combine must follow a dispatch (the host object refuses a
// second combine of one dispatch). Epochs are per-CTA sequence words (done, back).
#pragma once

#include <cstdint>

#include "../../moe/routing.hpp"
#include "../element.hpp"
#include "../handle/memory.hpp"
#include "../wait.hpp"

namespace reccl::device {

inline constexpr int moe_threads = 512;  ///< threads of a dispatch or combine CTA
inline constexpr int moe_max_experts = 1024;
inline constexpr int moe_max_ctas = 64;  ///< flags are reserved for this many CTAs, whatever the exchange uses
/// Slots (ranks x max_tokens x top_k) a staged exchange holds at most: its receive side ranks them
/// all in each CTA's shared memory.
inline constexpr std::uint64_t moe_staged_max_slots = 16384;

/// How a dispatch moves rows (the output layout is the same):
///   table   two rounds -- every rank publishes its counts, then rows go straight to their grouped
///           place on the receiver; window memory: the grouped rows.
///   staged  one round -- rows go at once to a per-source staging area on the receiver (by token
///           index, two copies by call parity), which files them into the grouped rows itself;
///           window memory: also 2 x nranks x max_tokens rows. For small batches (latency).
enum class moe_protocol : int { table = 0, staged = 1 };

/// Window offsets and flags of one expert exchange (reserved at its creation, in the same order on
/// every rank), and its local scratch (plain device memory).
struct moe_lane {
  flag_id table{};  ///< heads published (table: and the layout CTA's row of counts)
  flag_id done{};   ///< done.index + cta: dispatch's puts of CTA cta finished (moe_max_ctas reserved)
  flag_id back{};   ///< back.index + cta: combine's puts of CTA cta finished (moe_max_ctas reserved)
  std::uint64_t heads_off = 0;   ///< heads [2][n][head_words] int64: both protocols, reserved first
  std::uint64_t table_off = 0;   ///< table only: counts [2][counts_words()] int64
  std::uint64_t grouped_off = 0, records_off = 0, landing_off = 0;
  std::uint64_t scales_off = 0;   ///< fp8: grouped rows' scales [grouped][scale_words]
  std::uint64_t row_bytes = 0;    ///< bytes of one dispatched row's values
  std::int32_t scale_words = 0;   ///< fp32 scales per dispatched row (0: token rows)
  std::int64_t digest = 0;  ///< of the shape every rank must agree on (host: moe_shape_digest)
  std::int32_t ctas = 1;
  std::int32_t align = 1;
  std::int32_t hidden = 0;
  moe::routing route{};
  std::uint64_t max_tokens = 0;
  moe_protocol protocol = moe_protocol::table;
  /// staged only: records [2][n][max_tokens][k] int32 (local expert of each slot, -1: not here);
  /// rows [2][n][max_tokens][row_bytes]; fp8 scales [2][n][max_tokens][scale_words]
  std::uint64_t staged_records_off = 0, staged_rows_off = 0, staged_scales_off = 0;

  /// A head is {shape digest, refusal, dead mask, tokens} (int64 words); heads_off holds one per
  /// (call parity, source rank). Table protocol: each rank writes its own into its own window
  /// (heads[p][me]) and readers load heads[p][s] from rank s's window; staged: each source pushes
  /// its head into heads[p][source] of every live rank's window. The area comes first and has the
  /// same size whatever the config or protocol, so that a rank created otherwise writes only heads
  /// before its digest is caught.
  static constexpr int head_words = 4;
  /// The table protocol's counts at table_off, per call parity: counts per expert [E], rows per
  /// rank [n], (token, slot) pairs per rank [n].
  RECCL_HOST_DEVICE constexpr int counts_words() const { return route.n_experts + 2 * route.nranks; }
  RECCL_HOST_DEVICE constexpr std::uint64_t heads_bytes() const { return 2ull * route.nranks * head_words * 8; }
  RECCL_HOST_DEVICE constexpr std::uint64_t table_bytes() const { return 2ull * counts_words() * 8; }
  RECCL_HOST_DEVICE constexpr int record_words() const { return 2 * route.top_k; }
};

struct moe_scratch {
  std::int32_t* erank = nullptr;     ///< table: [max_tokens * k] slot's rank among my slots of its expert
  std::int32_t* drank = nullptr;     ///< table: [max_tokens * k] ... among my slots to its rank
  std::int32_t* rrank = nullptr;     ///< table: [max_tokens * n] token's rank among my tokens to rank d (-1: none)
  std::int64_t* slot_rows = nullptr; ///< [max_tokens * k] where each slot's row comes back (-1: unused)
  std::int64_t* rows_from = nullptr; ///< [n + 1] prefix of records per source (dispatch's plan step)
  std::int32_t* expert_counts = nullptr;   ///< [experts_per_rank]
  std::int32_t* expert_offsets = nullptr;  ///< [experts_per_rank + 1]
  std::uint64_t* dead_ranks = nullptr;     ///< the mask the next dispatch takes (bit r: rank r is out)
  std::uint64_t* call_dead = nullptr;      ///< the mask of the latest dispatch (its combine uses it)
  std::uint64_t* agreed = nullptr;         ///< staged: nonzero once a dispatch found every rank's shape equal to mine
  moe::drop_report* report = nullptr;      ///< what the latest dispatch dropped
};

template <class Tok>
struct moe_args {
  memory_handle h;
  moe_lane lane;
  moe_scratch s;
  void const* x = nullptr;            ///< dispatch: [n_tokens, row_bytes]
  float const* x_scales = nullptr;    ///< dispatch, fp8: [n_tokens, scale_words]
  std::int32_t const* topk_idx = nullptr;
  Tok const* y = nullptr;             ///< combine: experts' outputs, laid out like the grouped rows
  float const* topk_weights = nullptr;
  Tok* out = nullptr;                 ///< combine: [n_tokens, hidden]
  std::uint64_t n_tokens = 0;
};

namespace moe_detail {

RECCL_DEVICE std::uint32_t lanes_below() {
  std::uint32_t m;
  asm("mov.u32 %0, %%lanemask_lt;" : "=r"(m));
  return m;
}

/// One warp ranks `key` (any int; -1 and below take no part) among the warp's lanes and the
/// running counts `count[key]`: returns count[key] before this round + the lanes below with the
/// same key, and adds the round's lanes to count[key]. Lanes of the warp must all call it.
RECCL_DEVICE std::int32_t rank_in_round(std::int32_t key, std::int32_t* count, int lane) {
  std::uint32_t const peers = __match_any_sync(0xffffffffu, key < 0 ? -1 - lane - 64 : key);
  std::int32_t rank = -1;
  if (key >= 0) rank = count[key] + __popc(peers & lanes_below());
  __syncwarp();
  if (key >= 0 && (__ffs(peers) - 1) == lane) count[key] += __popc(peers);
  __syncwarp();
  return rank;
}

template <class Tok>
RECCL_DEVICE float to_float(Tok v) {
  using bits = typename bits_of<sizeof(Tok)>::type;
  bits b;
  memcpy(&b, &v, sizeof(Tok));
  return static_cast<float>(element<Tok>::to_acc(b));
}
template <class Tok>
RECCL_DEVICE Tok from_float(float f) {
  auto const b = element<Tok>::from_acc(f);
  Tok v;
  memcpy(&v, &b, sizeof(Tok));
  return v;
}

/// Source src's head of the call with epoch `epoch` (its parity picks the copy) in owner's window.
RECCL_DEVICE std::int64_t* head_at(memory_handle const& h, moe_lane const& L, int owner, int src, std::uint64_t epoch) {
  return h.at<std::int64_t>(owner, L.heads_off) +
         ((epoch & 1u) * static_cast<std::uint64_t>(L.route.nranks) + static_cast<std::uint64_t>(src)) * moe_lane::head_words;
}
/// Rank s's counts (table protocol) of the call with epoch `epoch`.
RECCL_DEVICE std::int64_t* table_counts(memory_handle const& h, moe_lane const& L, int s, std::uint64_t epoch) {
  return h.at<std::int64_t>(s, L.table_off) + static_cast<std::int64_t>(epoch & 1u) * L.counts_words();
}
RECCL_HOST_DEVICE constexpr bool is_dead(std::uint64_t dead, int r) { return ((dead >> r) & 1u) != 0; }

/// One warp copies a row of `bytes` (any memory this GPU reads or writes, peers' windows too):
/// four 16-byte packs per lane in flight where both pointers and the length are 16-byte multiples,
/// memory_handle::copy otherwise. No ordering (as copy()).
RECCL_DEVICE void copy_row(void* dst, void const* src, std::uint64_t bytes, int lane) {
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src) | bytes) & 15u) != 0) {
    memory_handle::copy(dst, src, bytes, lane, 32);
    return;
  }
  constexpr int U = 4;
  uint4* const d = static_cast<uint4*>(dst);
  uint4 const* const s = static_cast<uint4 const*>(src);
  std::uint64_t const packs = bytes / 16;
  std::uint64_t i = static_cast<std::uint64_t>(lane);
  for (; i + 32 * (U - 1) < packs; i += 32 * U) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = s[i + 32 * u];
#pragma unroll
    for (int u = 0; u < U; ++u) d[i + 32 * u] = v[u];
  }
  for (; i < packs; i += 32) d[i] = s[i];
}

/// One warp copies a piece of `len` bytes from src(j) to dst(j) for each slot j set in `on`
/// (ascending; src and dst are called with the same j in every lane, and may shuffle). Up to 4
/// slots' packs are loaded before any is stored, so that their loads overlap where a copy_row()
/// per slot would wait for each load in turn; a batch of one slot is a copy_row(). No ordering.
template <class Src, class Dst>
RECCL_DEVICE void copy_each(std::uint64_t on, Src const& src, Dst const& dst, std::uint64_t len, int lane) {
  constexpr int G = 4;
  while (on != 0) {
    char const* s[G];
    char* d[G];
    std::uintptr_t bits = static_cast<std::uintptr_t>(len);
    int m = 0;
#pragma unroll
    for (int i = 0; i < G; ++i) {
      s[i] = nullptr, d[i] = nullptr;
      if (on != 0) {
        int const j = __ffsll(static_cast<long long>(on)) - 1;
        on &= on - 1;
        s[i] = src(j), d[i] = dst(j), m = i + 1;
        bits |= reinterpret_cast<std::uintptr_t>(s[i]) | reinterpret_cast<std::uintptr_t>(d[i]);
      }
    }
    if (m == 1 || (bits & 15u) != 0) {
#pragma unroll
      for (int i = 0; i < G; ++i)
        if (d[i] != nullptr) copy_row(d[i], s[i], len, lane);
      continue;
    }
    for (std::uint64_t c = static_cast<std::uint64_t>(lane); c < len / 16; c += 32) {
      uint4 v[G];
#pragma unroll
      for (int i = 0; i < G; ++i)
        if (d[i] != nullptr) v[i] = reinterpret_cast<uint4 const*>(s[i])[c];
#pragma unroll
      for (int i = 0; i < G; ++i)
        if (d[i] != nullptr) reinterpret_cast<uint4*>(d[i])[c] = v[i];
    }
  }
}

/// One warp zeroes `bytes` at `dst` (16-byte packs where dst and bytes allow).
RECCL_DEVICE void zero_row(void* dst, std::uint64_t bytes, int lane) {
  if (((reinterpret_cast<std::uintptr_t>(dst) | bytes) & 15u) == 0) {
    for (std::uint64_t c = lane; c < bytes / 16; c += 32) static_cast<uint4*>(dst)[c] = make_uint4(0, 0, 0, 0);
  } else {
    for (std::uint64_t c = lane; c < bytes; c += 32) static_cast<unsigned char*>(dst)[c] = 0;
  }
}

#ifdef RECCL_MOE_TRACE
/// Benchmark builds only: globaltimer stamps of CTA 0's thread 0, per rank (reccl_moe_perf reads
/// them). Points: dispatch 0-7 (start, layout end, table checked, plan, sent, padded, waited, end),
/// combine 8-11 (start, returned, waited, end); staged dispatch also 12-15 (heads checked after
/// the wait, slots ranked, starts scanned; routing read, before the publish step's barriers).
__device__ unsigned long long moe_trace[max_memory_ranks][16];
#define RECCL_MOE_MARK(h, point) \
  do { \
    if (blockIdx.x == 0 && threadIdx.x == 0) ::reccl::device::moe_detail::moe_trace[(h).rank()][point] = globaltimer(); \
  } while (0)
#else
#define RECCL_MOE_MARK(h, point) \
  do { \
  } while (0)
#endif

/// Reads the fault word once per CTA: true in every thread when the rank has failed.
RECCL_DEVICE bool cta_faulted(memory_handle const& h) {
  __shared__ int f;
  if (threadIdx.x == 0) f = h.faulted() ? 1 : 0;
  __syncthreads();
  return f != 0;
}

/// What every CTA of a dispatch or combine knows from its start.
struct moe_call {
  std::uint64_t dead = 0;         ///< ranks left out of this call (bit r: rank r)
  std::uint64_t epoch = 0;        ///< the call's epoch: one past the CTA's sequence word
  std::uint64_t* seq = nullptr;   ///< this CTA's sequence word (set to epoch when the call succeeds)
};
/// The call's mask from `dead_word` (only a stream-ordered kernel writes it: every thread of every
/// CTA reads the same value; loaded first so that its latency overlaps the rest), and its epoch
/// from CTA c's sequence word of flags `seqs` + c -- the same on every CTA and rank, since each
/// successful call advances every one of them and resume() sets them all alike.
RECCL_DEVICE moe_call begin_call(memory_handle const& h, flag_id seqs, std::uint64_t const* dead_word) {
  moe_call c;
  c.dead = *dead_word;
  c.seq = h.sequence(flag_id{seqs.index + blockIdx.x});
  c.epoch = *c.seq + 1;
  return c;
}

/// A dispatch's CTA 0, every thread: the call's refusal (any thread's `bad`), the slots and tokens
/// dropped for masked ranks (summed over the threads) into scratch.report, and the call's mask into
/// scratch.call_dead. Returns the refusal (0 or 1) in every thread.
RECCL_DEVICE int note_routing(moe_scratch const& s, std::uint64_t dead, bool bad, unsigned long long lost_slots,
                              unsigned long long lost_tokens) {
  __shared__ unsigned long long dropped[2];  // slots, tokens
  if (threadIdx.x == 0) dropped[0] = dropped[1] = 0;
  int const refused = __syncthreads_or(bad ? 1 : 0);
  if (lost_slots != 0) atomicAdd(&dropped[0], lost_slots);
  if (lost_tokens != 0) atomicAdd(&dropped[1], lost_tokens);
  __syncthreads();
  if (threadIdx.x == 0) {
    s.report->slots = static_cast<std::int64_t>(dropped[0]), s.report->tokens = static_cast<std::int64_t>(dropped[1]);
    *s.call_dead = dead;
  }
  return refused;
}

/// Column c of per-warp counts (hist[w * width + c], warps w < used) becomes per-warp bases (the
/// counts of the warps before); returns the column's total.
RECCL_DEVICE std::int32_t counts_to_bases(std::int32_t* hist, int width, int used, int c) {
  std::int32_t run = 0;
  for (int w = 0; w < used; ++w) {
    std::int32_t const v = hist[w * width + c];
    hist[w * width + c] = run;
    run += v;
  }
  return run;
}

/// Every CTA: waits for flag `table` from every live rank (each rank signals it after its head).
/// False in every thread on a timeout or an earlier fault (recorded).
RECCL_DEVICE bool wait_heads(memory_handle const& h, moe_lane const& L, std::uint64_t dead, std::uint64_t epoch) {
  int const tid = static_cast<int>(threadIdx.x);
  deadline_clock clock(h.timeout_ns);
  bool ok = true;
  if (tid < L.route.nranks && !is_dead(dead, tid)) ok = h.wait(L.table, tid, epoch, clock);
  return __syncthreads_and(ok ? 1 : 0) != 0;
}

/// Every CTA, once every live rank's head of this call is visible: loads them into heads[s] (one
/// thread per source, in one round trip; source s's from owner(s)'s window) and checks them -- a
/// shape or mask that differs from the first live rank's, a token count above max_tokens, or a
/// refusal fails the call the same way on every rank, naming the rank (CTA 0 records it); a rank
/// masked by itself refuses. True in every thread when the call goes on.
template <class Owner>
RECCL_DEVICE bool check_heads(memory_handle const& h, moe_lane const& L, std::uint64_t dead, std::uint64_t epoch, Owner owner,
                              std::int64_t (*heads)[moe_lane::head_words]) {
  int const n = L.route.nranks, me = h.rank(), tid = static_cast<int>(threadIdx.x);
  __shared__ int refused;
  if (tid < n && !is_dead(dead, tid)) {
    auto const* const w = reinterpret_cast<std::uint64_t const*>(head_at(h, L, owner(tid), tid, epoch));
    std::uint64_t v[moe_lane::head_words];
#pragma unroll
    for (int i = 0; i < moe_lane::head_words; ++i) v[i] = load_relaxed_sys(w + i);
#pragma unroll
    for (int i = 0; i < moe_lane::head_words; ++i) heads[tid][i] = static_cast<std::int64_t>(v[i]);
  }
  __syncthreads();
  if (tid == 0) {
    fault f{};
    if (is_dead(dead, me)) {
      f = fault{status::invalid_argument, me, -1, -1, fault_cause::bad_argument};
    } else {
      int first = 0;  // the first live rank (this one at the latest): its shape and mask are the reference
      while (is_dead(dead, first)) ++first;
      for (int s = 0; s < n && f.ok(); ++s)
        if (!is_dead(dead, s) && (heads[s][0] != heads[first][0] || heads[s][2] != heads[first][2] || heads[s][3] < 0 ||
                                  static_cast<std::uint64_t>(heads[s][3]) > L.max_tokens))
          f = fault{status::invalid_argument, s, first, -1, fault_cause::peer_mismatch};
      for (int s = 0; s < n && f.ok(); ++s)
        if (!is_dead(dead, s) && heads[s][1] != 0) f = fault{status::invalid_argument, s, -1, -1, fault_cause::bad_argument};
    }
    if (!f.ok() && blockIdx.x == 0) h.record_fault(f);
    refused = f.ok() ? 0 : 1;
  }
  __syncthreads();
  return refused == 0;
}

}  // namespace moe_detail

/// Dynamic shared memory of the dispatch kernel: the layout step's per-warp counts, then per-warp
/// bases [warps][counts_words] (CTA 0 uses it; at most 16 x (1024 + 128) x 4 bytes).
RECCL_HOST_DEVICE constexpr std::uint64_t moe_dispatch_smem(moe_lane const& L) {
  return 4ull * (moe_threads / 32) * static_cast<std::uint64_t>(L.counts_words());
}

namespace moe_detail {

/// Where one CTA puts rows, from every live rank's row of the table (shared memory, per CTA).
struct plan {
  std::int32_t below[moe_max_experts];    ///< rows of expert e that lower ranks send
  std::int32_t start[moe_max_experts];    ///< first grouped row of expert e on its rank
  std::int32_t count[moe_max_experts];    ///< my experts (first experts_per_rank entries): rows received
  std::int32_t pad_end[moe_max_experts];  ///< my experts: padding rows of experts 0 .. l (inclusive prefix)
  std::int64_t rows_below[max_memory_ranks];  ///< (token) rows lower ranks send to rank d
  std::int64_t rows_in;                       ///< rows every rank sends me
};

/// `items` rows of `bytes` each, cut into pieces so that `warps` warps all have work when rows are
/// few (a piece is at least 512 bytes: one 16-byte pack per lane) and one piece per row when they
/// are many. Pieces are 16-byte multiples: a row that is 16-byte aligned stays so in every piece.
struct row_pieces {
  std::uint64_t per_row = 1, bytes = 0, row_bytes = 0;
  RECCL_DEVICE row_pieces(std::uint64_t items, std::uint64_t row, std::uint64_t warps) : row_bytes(row) {
    std::uint64_t const most = (row + 511) / 512;
    std::uint64_t p = items == 0 ? 1 : warps / items;
    p = p > most ? most : p;
    p = p < 1 ? 1 : p;
    bytes = ((row + p - 1) / p + 15) / 16 * 16;
    per_row = bytes == 0 ? 1 : (row + bytes - 1) / bytes;
  }
  RECCL_DEVICE std::uint64_t offset(std::uint64_t piece) const { return piece * bytes; }
  RECCL_DEVICE std::uint64_t size(std::uint64_t piece) const {
    std::uint64_t const o = piece * bytes;
    return o >= row_bytes ? 0 : (row_bytes - o < bytes ? row_bytes - o : bytes);
  }
};

/// Inclusive sum over the warp's lanes (every lane calls it).
RECCL_DEVICE std::int32_t warp_inclusive_sum(std::int32_t v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o *= 2) {
    std::int32_t const y = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += y;
  }
  return v;
}

/// Global warp index and count of the grid.
RECCL_DEVICE int grid_warp() { return static_cast<int>(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32); }
RECCL_DEVICE int grid_warps() { return static_cast<int>(gridDim.x * (blockDim.x / 32)); }

/// Calls fn(item, piece, offset, bytes) for every piece of `items` rows of `row_bytes` each (cut
/// as row_pieces does for the grid), one warp per call, spread over the grid's warps: every lane of
/// the warp calls it with the same arguments (fn may use warp collectives). CTA 0's warps come
/// last: when pieces are fewer than warps, CTA 0 (which has the layout or head step besides) gets none.
template <class F>
RECCL_DEVICE void for_each_piece(std::uint64_t items, std::uint64_t row_bytes, F&& fn) {
  std::uint64_t const warps = static_cast<std::uint64_t>(grid_warps()), per_cta = blockDim.x / 32;
  row_pieces const cut(items, row_bytes, warps);
  for (std::uint64_t u = (static_cast<std::uint64_t>(grid_warp()) + warps - per_cta) % warps; u < items * cut.per_row; u += warps) {
    std::uint64_t const item = u / cut.per_row, piece = u % cut.per_row;
    fn(item, piece, cut.offset(piece), cut.size(piece));
  }
}

/// Dispatch, CTA 0: rank every slot and token (layout step of the file comment), publish this
/// rank's row of the table and signal it to every live rank, this one included (the signal's
/// release orders CTA 0's scratch writes before the other CTAs' reads of them).
template <class Tok>
RECCL_DEVICE void layout_step(moe_args<Tok> const& a, std::uint64_t dead, std::uint64_t epoch, std::int32_t* hist) {
  memory_handle const& h = a.h;
  moe::routing const g = a.lane.route;
  int const n = g.nranks, k = g.top_k, E = g.n_experts, me = h.rank();
  int const W = a.lane.counts_words();
  int const tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32, warps = static_cast<int>(blockDim.x / 32);
  std::uint64_t const T = a.n_tokens;
  // warp w ranks tokens [t0, t1): runs of `chunk`; only the `used` warps that hold tokens zero and
  // scan their counts (one warp at a handful of tokens)
  std::uint64_t const chunk = (T + warps - 1) / warps;
  int const used = chunk == 0 ? 0 : static_cast<int>((T + chunk - 1) / chunk);
  std::uint64_t const t0 = chunk * warp < T ? chunk * warp : T, t1 = t0 + chunk < T ? t0 + chunk : T;
  std::int32_t* const mine = hist + static_cast<std::int64_t>(warp) * W;  // [warps][W] in dynamic shared memory
  if (warp < used)
    for (int i = lane; i < W; i += 32) mine[i] = 0;
  __syncwarp();  // rank_in_round reads counts other lanes zeroed
  bool bad = tid == 0 && is_dead(dead, me);  // masked by itself: refused, naming this rank
  unsigned long long lost_slots = 0, lost_tokens = 0;
  // slots of this warp's tokens, in (token, slot) order: rank by expert and by destination rank.
  // The routing of B rounds is loaded at once, so that their loads overlap.
  constexpr int B = 4;
  std::uint64_t const q_end = t1 * k;
  for (std::uint64_t q0 = t0 * k; q0 < q_end; q0 += 32 * B) {
    std::int32_t idx[B];
#pragma unroll
    for (int b = 0; b < B; ++b) idx[b] = q0 + 32 * b + lane < q_end ? a.topk_idx[q0 + 32 * b + lane] : -1;
#pragma unroll
    for (int b = 0; b < B; ++b) {
      if (q0 + 32 * b >= q_end) break;  // the same in every lane
      std::uint64_t const q = q0 + 32 * b + lane;
      std::int32_t e = idx[b];
      if (e < -1 || e >= E) bad = true, e = -1;
      std::int32_t d = e < 0 ? -1 : g.rank_of(e);
      if (d >= 0 && is_dead(dead, d)) ++lost_slots, e = -1, d = -1;  // dropped: as an unused slot
      std::int32_t const er = rank_in_round(e, mine, lane);
      std::int32_t const dr = rank_in_round(d, mine + E + n, lane);
      if (q < q_end) a.s.erank[q] = er, a.s.drank[q] = dr;
    }
  }
  // tokens of this warp: rank among the tokens to each rank
  for (std::uint64_t u0 = t0; u0 < t1; u0 += 32) {
    std::uint64_t const t = u0 + lane;
    std::uint64_t m = t < t1 ? moe::ranks_of_token(g, a.topk_idx + t * k) : 0;
    if (m == moe::bad_token) bad = true, m = 0;
    if ((m & dead) != 0) ++lost_tokens, m &= ~dead;
    for (int d = 0; d < n; ++d) {
      std::int32_t const r = rank_in_round((m >> d) & 1u ? d : -1, mine + E, lane);
      if (t < t1) a.s.rrank[t * n + d] = r;
    }
  }
  int const refused = note_routing(a.s, dead, bad, lost_slots, lost_tokens);
  // per-warp counts -> per-warp bases; the totals are this rank's row of the table
  std::int64_t* const row = table_counts(h, a.lane, me, epoch);
  __shared__ std::int64_t pair_base[max_memory_ranks];  // (token, slot) pairs to rank d, then their prefix
  for (int c = tid; c < W; c += static_cast<int>(blockDim.x)) {
    std::int32_t const total = counts_to_bases(hist, W, used, c);
    row[c] = total;
    if (c >= E + n) pair_base[c - E - n] = total;
  }
  if (tid == 0) {
    std::int64_t* const head = head_at(h, a.lane, me, me, epoch);
    head[0] = a.lane.digest, head[1] = refused, head[2] = static_cast<std::int64_t>(dead), head[3] = static_cast<std::int64_t>(T);
  }
  __syncthreads();
  // final ranks, and where each slot's row comes back in combine (after the pairs of lower ranks)
  if (tid == 0) {
    std::int64_t at = 0;
    for (int d = 0; d < n; ++d) {
      std::int64_t const pairs = pair_base[d];
      pair_base[d] = at, at += pairs;
    }
  }
  __syncthreads();
  // B slots per thread loaded at once (their loads overlap), then finished
  std::uint64_t const slots = T * k, stride = blockDim.x;
  for (std::uint64_t q0 = tid; q0 < slots; q0 += B * stride) {
    std::int32_t ev[B], erv[B], drv[B];
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (std::uint64_t const q = q0 + b * stride; q < slots) ev[b] = a.topk_idx[q], erv[b] = a.s.erank[q], drv[b] = a.s.drank[q];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      std::uint64_t const q = q0 + b * stride;
      if (q >= slots) break;
      std::int32_t const e = ev[b];
      if (refused || e < 0 || is_dead(dead, g.rank_of(e))) {
        a.s.slot_rows[q] = -1;
        continue;
      }
      std::int32_t const w = static_cast<std::int32_t>((q / k) / chunk), d = g.rank_of(e);
      std::int32_t const dr = drv[b] + hist[w * W + E + n + d];
      a.s.erank[q] = erv[b] + hist[w * W + e];
      a.s.drank[q] = dr;
      a.s.slot_rows[q] = pair_base[d] + dr;
    }
  }
  for (std::uint64_t i0 = tid; i0 < T * n; i0 += B * stride) {
    std::int32_t rv[B];
#pragma unroll
    for (int b = 0; b < B; ++b)
      if (std::uint64_t const i = i0 + b * stride; i < T * n) rv[b] = a.s.rrank[i];
#pragma unroll
    for (int b = 0; b < B; ++b) {
      std::uint64_t const i = i0 + b * stride;
      if (i >= T * n) break;
      std::int32_t const w = static_cast<std::int32_t>((i / n) / chunk);
      if (rv[b] >= 0) a.s.rrank[i] = rv[b] + hist[w * W + E + static_cast<int>(i % n)];
    }
  }
  __syncthreads();  // the row and the scratch precede the signals
  if (tid < n && !is_dead(dead, tid)) h.signal(tid, a.lane.table, epoch);
}

/// Dispatch, every CTA: the plan from the table (a masked rank sends nothing). CTA 0 also writes
/// the per-expert counts and offsets for the grouped GEMM and where each source's rows start.
template <class Tok>
RECCL_DEVICE void make_plan(moe_args<Tok> const& a, std::uint64_t dead, std::uint64_t epoch, plan& P) {
  memory_handle const& h = a.h;
  moe::routing const g = a.lane.route;
  int const n = g.nranks, E = g.n_experts, epr = g.experts_per_rank(), me = h.rank();
  int const tid = static_cast<int>(threadIdx.x), lane = tid % 32, cta = static_cast<int>(blockIdx.x);
  auto table = [&](int s, int w) {
    return is_dead(dead, s) ? std::int64_t{0}
                            : static_cast<std::int64_t>(load_relaxed_sys(
                                  reinterpret_cast<std::uint64_t const*>(table_counts(h, a.lane, s, epoch) + w)));
  };
  for (int e = tid; e < E; e += static_cast<int>(blockDim.x)) {
    std::int32_t b = 0, total = 0;
    for (int s = 0; s < n; ++s) {
      std::int32_t const c = static_cast<std::int32_t>(table(s, e));
      if (s < me) b += c;
      total += c;
    }
    P.below[e] = b;
    P.start[e] = total;  // the total for now; turned into the start below
  }
  if (tid < n) {
    std::int64_t b = 0;
    for (int s = 0; s < me; ++s) b += table(s, E + tid);
    P.rows_below[tid] = b;
  }
  if (tid == 32) {  // another warp than the one above
    std::int64_t at = 0;
    for (int s = 0; s < n; ++s) {
      if (cta == 0) a.s.rows_from[s] = at;
      at += table(s, E + me);
    }
    if (cta == 0) a.s.rows_from[n] = at;
    P.rows_in = at;
  }
  __syncthreads();
  // rank d's experts start at the exclusive prefix of their aligned totals (every start is a
  // multiple of align, so align_up(start + total) = start + align_up(total)): one warp per rank
  std::int32_t const al = a.lane.align;
  for (int d = tid / 32; d < n; d += static_cast<int>(blockDim.x / 32)) {
    std::int32_t carry = 0, pad_carry = 0;
    for (int base = 0; base < epr; base += 32) {
      int const l = base + lane;
      std::int32_t const total = l < epr ? P.start[d * epr + l] : 0;
      std::int32_t const size = (total + al - 1) / al * al;
      std::int32_t const incl = warp_inclusive_sum(size, lane);
      if (l < epr) P.start[d * epr + l] = carry + incl - size;
      if (d == me) {
        std::int32_t const pads = warp_inclusive_sum(size - total, lane);
        if (l < epr) {
          P.count[l] = total, P.pad_end[l] = pad_carry + pads;
          if (cta == 0) a.s.expert_counts[l] = total, a.s.expert_offsets[l] = carry + incl - size;
        }
        pad_carry += __shfl_sync(0xffffffffu, pads, 31);
      }
      carry += __shfl_sync(0xffffffffu, incl, 31);
    }
    if (d == me && cta == 0 && lane == 0) a.s.expert_offsets[epr] = carry;
  }
  __syncthreads();
}

/// Dispatch, every CTA: one crossing per (token, rank it visits), into the grouped position of its
/// first slot there, and a record {grouped position, return index} per slot. Work: (token, piece)
/// pairs over the grid's warps; the piece-0 warp writes the records and the fp8 scales.
template <class Tok>
RECCL_DEVICE void send_rows(moe_args<Tok> const& a, std::uint64_t dead, plan const& P) {
  memory_handle const& h = a.h;
  moe::routing const g = a.lane.route;
  int const n = g.nranks, k = g.top_k, R = a.lane.record_words(), lane = static_cast<int>(threadIdx.x % 32);
  std::uint64_t const RB = a.lane.row_bytes, SW = static_cast<std::uint64_t>(a.lane.scale_words);
  for_each_piece(a.n_tokens, RB, [&](std::uint64_t t, std::uint64_t piece, std::uint64_t o, std::uint64_t len) {
    // the slot's expert, rank and return index loaded together, before they are needed
    std::int32_t const e = lane < k ? a.topk_idx[t * k + lane] : -1;
    std::int32_t const er = lane < k ? a.s.erank[t * k + lane] : 0;
    std::int64_t const ret = lane < k && piece == 0 ? a.s.slot_rows[t * k + lane] : -1;
    std::uint64_t const mask = moe::ranks_of_token(g, a.topk_idx + t * k) & ~dead;
    for (int d = 0; d < n; ++d) {
      if (!((mask >> d) & 1u)) continue;
      bool const here = e >= 0 && g.rank_of(e) == d;
      std::int32_t const pos = here ? P.start[e] + P.below[e] + er : -1;
      std::uint32_t const on = __ballot_sync(0xffffffffu, here);
      std::int32_t const p0 = __shfl_sync(0xffffffffu, pos, __ffs(on) - 1);
      if (piece == 0) {
        std::int64_t const rec = P.rows_below[d] + a.s.rrank[t * n + d];
        std::int32_t* const r = h.at<std::int32_t>(d, a.lane.records_off) + rec * R;
        if (lane < k) {
          r[lane] = pos;
          r[k + lane] = here ? static_cast<std::int32_t>(ret) : -1;
        }
        if (SW > 0)
          copy_row(h.at<float>(d, a.lane.scales_off) + static_cast<std::uint64_t>(p0) * SW, a.x_scales + t * SW, SW * 4, lane);
      }
      copy_row(h.at<char>(d, a.lane.grouped_off) + static_cast<std::uint64_t>(p0) * RB + o, static_cast<char const*>(a.x) + t * RB + o,
               len, lane);
    }
  });
}

/// Dispatch, every CTA: zero this rank's padding rows (after each expert's received rows, up to
/// the aligned start of the next). Peers never write them, so this overlaps their sends.
template <class Tok>
RECCL_DEVICE void zero_padding(moe_args<Tok> const& a, plan const& P) {
  memory_handle const& h = a.h;
  int const epr = a.lane.route.experts_per_rank(), me = h.rank(), lane = static_cast<int>(threadIdx.x % 32);
  std::uint64_t const RB = a.lane.row_bytes, SW = static_cast<std::uint64_t>(a.lane.scale_words);
  char* const grouped = h.at<char>(me, a.lane.grouped_off);
  float* const scales = h.at<float>(me, a.lane.scales_off);
  std::uint64_t const pads = epr > 0 ? static_cast<std::uint64_t>(P.pad_end[epr - 1]) : 0;
  for_each_piece(pads, RB, [&](std::uint64_t item, std::uint64_t piece, std::uint64_t o, std::uint64_t len) {
    std::int64_t const j = static_cast<std::int64_t>(item);
    int lo = 0, hi = epr - 1;  // expert of padding row j: the first with pad_end > j
    while (lo < hi) {
      int const mid = (lo + hi) / 2;
      if (P.pad_end[mid] > j) hi = mid;
      else lo = mid + 1;
    }
    std::int64_t const before = lo == 0 ? 0 : P.pad_end[lo - 1];
    std::uint64_t const p = static_cast<std::uint64_t>(P.start[me * epr + lo] + P.count[lo] + (j - before));
    zero_row(grouped + p * RB + o, len, lane);
    if (SW > 0 && piece == 0) zero_row(scales + p * SW, SW * 4, lane);
  });
}

/// Dispatch, every CTA, after every rank's sends: copy each received row to its other slots'
/// positions (local). Work: (row, piece) pairs; the piece-0 warp copies the fp8 scales.
template <class Tok>
RECCL_DEVICE void file_rows(moe_args<Tok> const& a, plan const& P) {
  memory_handle const& h = a.h;
  int const k = a.lane.route.top_k, R = a.lane.record_words(), lane = static_cast<int>(threadIdx.x % 32);
  std::uint64_t const RB = a.lane.row_bytes, SW = static_cast<std::uint64_t>(a.lane.scale_words);
  char* const grouped = h.at<char>(h.rank(), a.lane.grouped_off);
  float* const scales = h.at<float>(h.rank(), a.lane.scales_off);
  std::int32_t const* const records = h.at<std::int32_t>(h.rank(), a.lane.records_off);
  std::uint64_t const rows = static_cast<std::uint64_t>(P.rows_in);
  for_each_piece(rows, RB, [&](std::uint64_t i, std::uint64_t piece, std::uint64_t o, std::uint64_t len) {
    std::int32_t const pos = lane < k ? records[i * R + lane] : -1;
    std::uint32_t on = __ballot_sync(0xffffffffu, pos >= 0);
    std::uint64_t const p0 = static_cast<std::uint64_t>(__shfl_sync(0xffffffffu, pos, __ffs(on) - 1));
    on &= on - 1;  // the first slot's row is in place already
    auto at = [&](int j) { return static_cast<std::uint64_t>(__shfl_sync(0xffffffffu, pos, j)); };
    copy_each(
        on, [&](int) { return grouped + p0 * RB + o; }, [&](int j) { return grouped + at(j) * RB + o; }, len, lane);
    if (SW > 0 && piece == 0)
      for (std::uint32_t b = on; b != 0; b &= b - 1) copy_row(scales + at(__ffs(b) - 1) * SW, scales + p0 * SW, SW * 4, lane);
  });
}

}  // namespace moe_detail

/// Waits, in every thread of the CTA, until CTA c of every rank not in `dead` signalled flag base
/// + c at least `epoch` (c < ctas). False (fault recorded) on a timeout or an earlier fault.
RECCL_DEVICE bool moe_wait_all(memory_handle const& h, flag_id base, int ctas, std::uint64_t epoch, std::uint64_t dead) {
  deadline_clock clock(h.timeout_ns);
  bool ok = true;
  for (int i = static_cast<int>(threadIdx.x); i < h.size() * ctas; i += static_cast<int>(blockDim.x))
    if (!moe_detail::is_dead(dead, i / ctas))
      ok = ok && h.wait(flag_id{base.index + static_cast<std::uint32_t>(i % ctas)}, i / ctas, epoch, clock, i % ctas);
  return __syncthreads_and(ok ? 1 : 0) != 0;
}

/// Dispatch: lane.ctas CTAs of moe_threads, moe_dispatch_smem() bytes of dynamic shared memory,
/// every CTA resident at once (CTAs wait for each other through the flags).
template <class Tok>
__global__ void __launch_bounds__(moe_threads) moe_dispatch_kernel(moe_args<Tok> const a) {
  using namespace moe_detail;
  memory_handle const& h = a.h;
  int const n = a.lane.route.nranks, tid = static_cast<int>(threadIdx.x), cta = static_cast<int>(blockIdx.x);
  RECCL_MOE_MARK(h, 0);
  moe_call const call = begin_call(h, a.lane.done, a.s.dead_ranks);
  std::uint64_t const dead = call.dead, epoch = call.epoch;
  extern __shared__ std::int32_t hist[];
  __shared__ std::int64_t heads[max_memory_ranks][moe_lane::head_words];
  if (cta_faulted(h)) return;
  if (cta == 0) layout_step(a, dead, epoch, hist);
  RECCL_MOE_MARK(h, 1);
  // every live rank's row of this call (this rank's too), then the heads: each rank's own
  if (!wait_heads(h, a.lane, dead, epoch) || !check_heads(h, a.lane, dead, epoch, [](int s) { return s; }, heads)) return;
  RECCL_MOE_MARK(h, 2);
  __shared__ plan P;
  make_plan(a, dead, epoch, P);
  RECCL_MOE_MARK(h, 3);
  send_rows(a, dead, P);
  __syncthreads();  // every thread's puts precede the signals
  if (tid < n && !is_dead(dead, tid)) h.signal(tid, flag_id{a.lane.done.index + static_cast<std::uint32_t>(cta)}, epoch);
  RECCL_MOE_MARK(h, 4);
  zero_padding(a, P);
  RECCL_MOE_MARK(h, 5);
  if (!moe_wait_all(h, a.lane.done, a.lane.ctas, epoch, dead)) return;
  RECCL_MOE_MARK(h, 6);
  file_rows(a, P);
  if (tid == 0) *call.seq = epoch;
  RECCL_MOE_MARK(h, 7);
}

/// Combine: lane.ctas CTAs of moe_threads, every CTA resident at once. Returns y's row at each
/// slot's position to the token's rank, at the slot's return index there (work: (row, piece) pairs
/// over the grid's warps), signals, waits for every live rank's returns, then out[t] = round(fma
/// over slots in top-k order).
template <class Tok>
__global__ void __launch_bounds__(moe_threads) moe_combine_kernel(moe_args<Tok> const a) {
  using namespace moe_detail;
  memory_handle const& h = a.h;
  int const n = a.lane.route.nranks, k = a.lane.route.top_k, R = a.lane.record_words();
  int const tid = static_cast<int>(threadIdx.x), cta = static_cast<int>(blockIdx.x), lane = tid % 32;
  std::uint64_t const H = static_cast<std::uint64_t>(a.lane.hidden);
  RECCL_MOE_MARK(h, 8);
  moe_call const call = begin_call(h, a.lane.back, a.s.call_dead);  // the dispatch's mask
  std::uint64_t const dead = call.dead, epoch = call.epoch;
  if (cta_faulted(h)) return;
  std::uint64_t const rows = static_cast<std::uint64_t>(a.s.rows_from[n]);  // records (staged: one per source token)
  if (a.y == nullptr && a.s.expert_offsets[a.lane.route.experts_per_rank()] > 0) {  // rows came in, so y was needed: no rank's sum runs
    if (cta == 0 && tid == 0) h.raise_everywhere(fault{status::invalid_argument, h.rank(), -1, -1, fault_cause::null_buffer}, dead);
    return;
  }
  std::uint64_t const RB = H * sizeof(Tok);
  std::int32_t const* const records = h.at<std::int32_t>(h.rank(), a.lane.records_off);
  for_each_piece(rows, RB, [&](std::uint64_t i, std::uint64_t, std::uint64_t o, std::uint64_t len) {
    int s = 0;
    while (s + 1 < n && static_cast<std::uint64_t>(a.s.rows_from[s + 1]) <= i) ++s;
    std::int32_t const pos = lane < k ? records[i * R + lane] : -1;
    std::int32_t const ret = lane < k ? records[i * R + k + lane] : -1;
    char* const landing = h.at<char>(s, a.lane.landing_off);
    copy_each(
        __ballot_sync(0xffffffffu, pos >= 0),
        [&](int j) { return reinterpret_cast<char const*>(a.y) + static_cast<std::uint64_t>(__shfl_sync(0xffffffffu, pos, j)) * RB + o; },
        [&](int j) { return landing + static_cast<std::uint64_t>(__shfl_sync(0xffffffffu, ret, j)) * RB + o; }, len, lane);
  });
  __syncthreads();  // every thread's puts precede the signals
  if (tid < n && !is_dead(dead, tid)) h.signal(tid, flag_id{a.lane.back.index + static_cast<std::uint32_t>(cta)}, epoch);
  RECCL_MOE_MARK(h, 9);
  if (!moe_wait_all(h, a.lane.back, a.lane.ctas, epoch, dead)) return;
  RECCL_MOE_MARK(h, 10);
  Tok const* const landing = h.at<Tok>(h.rank(), a.lane.landing_off);
  std::uint64_t const total = a.n_tokens * H;
  constexpr int V = 16 / sizeof(Tok);  // values per 16-byte pack
  if (H % V == 0 && reinterpret_cast<std::uintptr_t>(a.out) % 16 == 0) {
    // a pack of V values per thread: the same fma chain per value, 16-byte loads and stores
    for (std::uint64_t i = (cta * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x) * V; i < total;
         i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x * V) {
      std::uint64_t const t = i / H, c = i % H;
      float acc[V];
#pragma unroll
      for (int v = 0; v < V; ++v) acc[v] = 0.f;
      for (int j = 0; j < k; ++j)
        if (std::int64_t const r = a.s.slot_rows[t * k + j]; r >= 0) {
          float const w = a.topk_weights[t * k + j];
          uint4 const pk = *reinterpret_cast<uint4 const*>(landing + static_cast<std::uint64_t>(r) * H + c);
          Tok vals[V];
          memcpy(vals, &pk, 16);
#pragma unroll
          for (int v = 0; v < V; ++v) acc[v] = __fmaf_rn(w, to_float<Tok>(vals[v]), acc[v]);
        }
      Tok outv[V];
#pragma unroll
      for (int v = 0; v < V; ++v) outv[v] = from_float<Tok>(acc[v]);
      uint4 pk;
      memcpy(&pk, outv, 16);
      *reinterpret_cast<uint4*>(a.out + i) = pk;
    }
  } else {
    for (std::uint64_t i = cta * static_cast<std::uint64_t>(blockDim.x) + threadIdx.x; i < total;
         i += static_cast<std::uint64_t>(gridDim.x) * blockDim.x) {
      std::uint64_t const t = i / H, c = i % H;
      float acc = 0.f;
      for (int j = 0; j < k; ++j)
        if (std::int64_t const r = a.s.slot_rows[t * k + j]; r >= 0)
          acc = __fmaf_rn(a.topk_weights[t * k + j], to_float<Tok>(landing[static_cast<std::uint64_t>(r) * H + c]), acc);
      a.out[i] = from_float<Tok>(acc);
    }
  }
  if (tid == 0) *call.seq = epoch;
  RECCL_MOE_MARK(h, 11);
}

}  // namespace reccl::device
