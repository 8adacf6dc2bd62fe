// reccl/cpu/expert_exchange.hpp -- MoE dispatch and combine on the CPU engine (the reference of
// the operation, and what the tests check the GPU against). Routing: reccl/moe/routing.hpp.
//
//   dispatch(x[T, H], topk_idx[T, k])      rank s -> every rank d holding one of token t's experts:
//     one row per (token, rank): H values + the token's index + its slots' local experts on d
//     (all-to-allv of 4-byte words); rank d files each row under each of its experts the token
//     chose, experts in order, each expert's rows ordered by (source rank, token, slot) and starting
//     on a multiple of `align` rows (padding rows are zeros): received(), expert_counts(),
//     expert_offsets() -- the layout a grouped GEMM takes
//   dispatch(fp8_tokens{values, scales}, topk_idx)   the same with fp8 rows (an exchange created
//     with payload::fp8_e4m3): H e4m3 bytes and H / 128 fp32 scales per row, moved bit for bit,
//     filed the same way: received_fp8() (padding rows: zero values, zero scales)
//   combine(y, topk_weights) -> out[T, H]  y: the experts' outputs, row p of y for row p of
//     received(); each used slot's row goes back to its token's rank (one row per (token, slot):
//     what makes the fp32 sum in top-k order, rounded once, the same on every path), which computes
//     out[t] = round(fma(w_{k-1}, y_{k-1}, ... fma(w_0, y_0, 0.f))); a token with no used slot gets 0
//
// combine() uses the layout of the latest dispatch(): call them in pairs, from every rank.
// Receive buffers are sized once, at creation, for `max_tokens` tokens per rank
// (moe::receive_bound_of); memory_bytes() says what the exchange holds.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include "../moe/fp8.hpp"
#include "../moe/routing.hpp"
#include "all_to_allv.hpp"

namespace reccl::cpu {

/// What dispatch returns on each rank.
struct dispatch_result {
  status st = status::ok;           ///< ok, or recovered (a VT died; the result is still right)
  std::uint64_t rows_in = 0;        ///< token rows that reached this rank (one per (token, source))
  std::uint64_t grouped_rows = 0;   ///< rows filed under this rank's experts, padding included
};

/// MoE dispatch/combine for token rows of `Tok` on one rank of a CPU communicator (see the file
/// comment). The Schedule (which must implement all_to_all), Telemetry and Allocator are those of
/// the all-to-allv steps underneath.
template <class Tok, Schedule S, Telemetry M, Allocator A>
class expert_exchange {
 public:
  /// Throws reccl::error(invalid_argument) on a config no rank could use (checked alike on every rank).
  expert_exchange(communicator& comm, int rank, moe::exchange_config cfg, A alloc = A{})
      : comm_(comm), rank_(rank), cfg_(cfg), alloc_(alloc) {
    auto bad = [&](std::string const& why) { throw error(status::invalid_argument, "expert_exchange: " + why, rank); };
    if (char const* why = cfg.route.invalid()) bad(why);
    if (cfg.route.nranks != comm.nranks()) bad("route.nranks differs from the communicator's rank count");
    if (rank < 0 || rank >= comm.nranks()) bad("rank outside [0, nranks)");
    if (char const* why = cfg.invalid_rows()) bad(why);
    auto const k = static_cast<std::uint64_t>(cfg.route.top_k);
    value_words_ = (cfg.row_bytes(sizeof(Tok)) + 3) / 4;
    row_words_ = value_words_ + static_cast<std::uint64_t>(cfg.scales_per_row()) + 1 + k;
    bound_ = moe::receive_bound_of(cfg.route, cfg.max_tokens, cfg.align);
    in_words_.resize(bound_.rows * row_words_);
    if (cfg.dispatch == moe::payload::fp8_e4m3) {
      grouped_fp8_.resize(bound_.grouped * static_cast<std::uint64_t>(cfg.hidden));
      grouped_scales_.resize(bound_.grouped * static_cast<std::uint64_t>(cfg.scales_per_row()));
    } else {
      grouped_.resize(bound_.grouped * static_cast<std::uint64_t>(cfg.hidden));
    }
    counts_.resize(static_cast<std::size_t>(cfg.route.experts_per_rank()));
    offsets_.resize(counts_.size() + 1);
  }

  moe::receive_bound capacity() const { return bound_; }
  /// Bytes this exchange holds between calls (receive areas and layouts; a call's staging is extra).
  std::uint64_t memory_bytes() const {
    return in_words_.size() * 4 + grouped_.size() * sizeof(Tok) + grouped_fp8_.size() + grouped_scales_.size() * 4 +
           (counts_.size() + offsets_.size()) * 4 +
           (back_positions_.capacity() + slot_rows_.capacity()) * 8;
  }

  /// The latest dispatch's rows filed under this rank's experts: [expert_offsets().back(), hidden]
  /// (an exchange created for token rows).
  std::span<Tok const> received() const {
    if (cfg_.dispatch != moe::payload::tokens) throw error(status::invalid_argument, "expert_exchange: received() of an fp8 exchange: received_fp8()", rank_);
    return {grouped_.data(), grouped_rows_ * static_cast<std::uint64_t>(cfg_.hidden)};
  }
  /// The same for an exchange created with payload::fp8_e4m3: values [rows, hidden] and scales
  /// [rows, hidden / 128], rows = expert_offsets().back().
  struct fp8_rows {
    std::span<std::uint8_t const> values;
    std::span<float const> scales;
  };
  fp8_rows received_fp8() const {
    if (cfg_.dispatch != moe::payload::fp8_e4m3) throw error(status::invalid_argument, "expert_exchange: received_fp8() of a token-row exchange", rank_);
    return {{grouped_fp8_.data(), grouped_rows_ * static_cast<std::uint64_t>(cfg_.hidden)},
            {grouped_scales_.data(), grouped_rows_ * static_cast<std::uint64_t>(cfg_.scales_per_row())}};
  }
  std::span<std::int32_t const> expert_counts() const { return counts_; }  ///< rows per local expert
  std::span<std::int32_t const> expert_offsets() const { return offsets_; }  ///< first row per local expert, then the end

  /// Sends each of `n_tokens` rows of `x` to the ranks of its experts (see the file comment).
  /// Every rank calls it; a rank with bad input (an expert index outside [-1, n_experts) or an expert twice in one token, more
  /// tokens than max_tokens, null pointers, token rows on an fp8 exchange) makes every rank throw
  /// reccl::error(invalid_argument) naming it, before any row moves.
  dispatch_result dispatch(Tok const* x, std::int32_t const* topk_idx, std::uint64_t n_tokens) {
    return dispatch_rows(x, nullptr, moe::payload::tokens, topk_idx, n_tokens);
  }
  /// The same with fp8 rows (an exchange created with payload::fp8_e4m3): values and scales are
  /// moved bit for bit.
  dispatch_result dispatch(moe::fp8_tokens x, std::int32_t const* topk_idx, std::uint64_t n_tokens) {
    return dispatch_rows(x.values, x.scales, moe::payload::fp8_e4m3, topk_idx, n_tokens);
  }

 private:
  dispatch_result dispatch_rows(void const* x, float const* scales, moe::payload as, std::int32_t const* topk_idx, std::uint64_t n_tokens) {
    dispatched_ = false;  // until this one has filed its rows: combine needs a whole layout
    moe::routing const& g = cfg_.route;
    int const n = g.nranks, k = g.top_k;
    auto const H = static_cast<std::uint64_t>(cfg_.hidden);
    std::uint64_t const row_bytes = cfg_.row_bytes(sizeof(Tok));
    auto const SW = static_cast<std::uint64_t>(cfg_.scales_per_row());
    bool const fp8 = cfg_.dispatch == moe::payload::fp8_e4m3;
    call_reject refuse = call_reject::none;
    std::string why;
    if (as != cfg_.dispatch) {
      refuse = call_reject::bad_arguments;
      why = fp8 ? "token rows dispatched on an exchange created for fp8" : "fp8 rows dispatched on an exchange created for token rows";
    } else if (n_tokens > cfg_.max_tokens) {
      refuse = call_reject::too_many_tokens;
      why = std::to_string(n_tokens) + " tokens, created for " + std::to_string(cfg_.max_tokens);
    } else if (n_tokens > 0 && (x == nullptr || topk_idx == nullptr || (fp8 && scales == nullptr))) {
      refuse = call_reject::bad_arguments;
      why = fp8 ? "x.values, x.scales or topk_idx is null" : "x or topk_idx is null";
    }
    std::vector<std::uint64_t> masks(refuse == call_reject::none ? n_tokens : 0);
    for (std::uint64_t t = 0; t < masks.size() && refuse == call_reject::none; ++t) {
      masks[t] = moe::ranks_of_token(g, topk_idx + t * k);
      if (masks[t] == moe::bad_token) {
        refuse = call_reject::bad_expert;
        why = "token " + std::to_string(t) + " names an expert outside [-1, " + std::to_string(g.n_experts) + ") or one expert twice";
      }
    }
    if (refuse != call_reject::none) masks.clear();

    // Rows out, packed by destination: [values | scales | token index | k local experts (-1: not here)].
    std::vector<std::int64_t> rows_to(n, 0), out_counts(n), out_offsets(n), in_counts(n), in_offsets(n);
    for (std::uint64_t m : masks)
      for (int d = 0; d < n; ++d) rows_to[d] += (m >> d) & 1u;
    std::int64_t total_out = 0;
    for (int d = 0; d < n; ++d) {
      out_offsets[d] = total_out * static_cast<std::int64_t>(row_words_);
      out_counts[d] = rows_to[d] * static_cast<std::int64_t>(row_words_);
      total_out += rows_to[d];
    }
    std::vector<std::int32_t> out_words(static_cast<std::uint64_t>(total_out) * row_words_);
    std::vector<std::int64_t> cursor(n, 0);
    pairs_to_.assign(n, 0);
    slot_rows_.assign(masks.size() * static_cast<std::size_t>(k), -1);
    for (std::uint64_t t = 0; t < masks.size(); ++t)
      for (int d = 0; d < n; ++d) {
        if (!((masks[t] >> d) & 1u)) continue;
        std::int32_t* row = out_words.data() + out_offsets[d] + cursor[d]++ * static_cast<std::int64_t>(row_words_);
        std::memcpy(row, static_cast<char const*>(x) + t * row_bytes, row_bytes);
        if (SW > 0) std::memcpy(row + value_words_, scales + t * SW, SW * 4);
        std::int32_t* meta = row + (row_words_ - 1 - k);
        meta[0] = static_cast<std::int32_t>(t);
        for (int j = 0; j < k; ++j) {
          std::int32_t const e = topk_idx[t * k + j];
          bool const here = e >= 0 && g.rank_of(e) == d;
          meta[1 + j] = here ? g.local_of(e) : -1;
          if (here) slot_rows_[t * k + j] = pairs_to_[d]++;  // index within d's returned block, made global below
        }
      }
    std::int64_t base = 0;  // combine receives d's rows after those of ranks < d
    std::vector<std::int64_t> pair_base(n);
    for (int d = 0; d < n; ++d) pair_base[d] = base, base += pairs_to_[d];
    for (std::uint64_t t = 0; t < masks.size(); ++t)
      for (int j = 0; j < k; ++j)
        if (slot_rows_[t * k + j] >= 0) slot_rows_[t * k + j] += pair_base[g.rank_of(topk_idx[t * k + j])];
    tokens_ = masks.size();

    auto const moved = run_all_to_allv<std::int32_t, S, M, A>(
        comm_, rank_, v_send<std::int32_t>{out_words.data(), out_words.size(), out_counts.data(), out_offsets.data()},
        v_recv<std::int32_t>{in_words_.data(), in_words_.size(), in_counts.data(), in_offsets.data()}, alloc_, refuse,
        why, "moe dispatch");

    // File every (row, slot) under its local expert: count, place, remember where each goes back.
    int const epr = g.experts_per_rank();
    std::uint64_t const rows_in = moved.received / row_words_;
    auto meta_of = [&](std::uint64_t i) { return in_words_.data() + i * row_words_ + (row_words_ - 1 - k); };
    std::fill(counts_.begin(), counts_.end(), 0);
    for (std::uint64_t i = 0; i < rows_in; ++i)
      for (int j = 0; j < k; ++j)
        if (std::int32_t const l = meta_of(i)[1 + j]; l >= 0) ++counts_[l];
    std::uint64_t at = 0;
    for (int l = 0; l < epr; ++l) {
      offsets_[l] = static_cast<std::int32_t>(at);
      at = moe::align_up(at + static_cast<std::uint64_t>(counts_[l]), static_cast<std::uint64_t>(cfg_.align));
    }
    offsets_[epr] = static_cast<std::int32_t>(at);
    grouped_rows_ = at;
    if (fp8) {
      std::fill(grouped_fp8_.begin(), grouped_fp8_.begin() + at * H, std::uint8_t{0});
      std::fill(grouped_scales_.begin(), grouped_scales_.begin() + at * SW, 0.f);
    } else {
      std::fill(grouped_.begin(), grouped_.begin() + at * H, Tok{});
    }
    std::vector<std::int64_t> fill(offsets_.begin(), offsets_.end() - 1);
    back_positions_.clear();
    back_counts_.assign(n, 0);
    for (int s = 0; s < n; ++s)
      for (std::int64_t r = 0; r < in_counts[s] / static_cast<std::int64_t>(row_words_); ++r) {
        std::uint64_t const i = static_cast<std::uint64_t>(in_offsets[s]) / row_words_ + r;
        for (int j = 0; j < k; ++j) {
          std::int32_t const l = meta_of(i)[1 + j];
          if (l < 0) continue;
          std::int64_t const p = fill[l]++;
          std::int32_t const* const row = in_words_.data() + i * row_words_;
          if (fp8) {
            std::memcpy(grouped_fp8_.data() + p * H, row, H);
            std::memcpy(grouped_scales_.data() + p * SW, row + value_words_, SW * 4);
          } else {
            std::memcpy(static_cast<void*>(grouped_.data() + p * H), row, H * sizeof(Tok));
          }
          back_positions_.push_back(p);
          ++back_counts_[s];
        }
      }
    dispatched_ = true;
    return {moved.st, rows_in, grouped_rows_};
  }

 public:
  /// Returns the experts' outputs `y` (laid out like received()) to their tokens' ranks and writes
  /// out[t] = the fp32 weighted sum of token t's slots in top-k order, rounded once (file comment).
  /// `topk_weights` is [n_tokens, k] of the latest dispatch on this rank. Every rank calls it.
  status combine(Tok const* y, float const* topk_weights, Tok* out) {
    if (!dispatched_) throw error(status::invalid_argument, "expert_exchange: combine before any dispatch", rank_);
    int const n = cfg_.route.nranks, k = cfg_.route.top_k;
    auto const H = static_cast<std::int64_t>(cfg_.hidden);
    call_reject refuse = call_reject::none;
    std::string why;
    if (tokens_ > 0 && (out == nullptr || topk_weights == nullptr)) refuse = call_reject::bad_arguments, why = "out or topk_weights is null";
    else if (!back_positions_.empty() && y == nullptr) refuse = call_reject::bad_arguments, why = "y is null";
    std::vector<Tok> back(back_positions_.size() * static_cast<std::uint64_t>(H));
    std::vector<std::int64_t> out_counts(n), out_offsets(n), in_counts(n), in_offsets(n);
    if (refuse == call_reject::none)
      for (std::size_t q = 0; q < back_positions_.size(); ++q)
        std::memcpy(static_cast<void*>(back.data() + q * H), y + back_positions_[q] * H, H * sizeof(Tok));
    std::int64_t at = 0;
    for (int s = 0; s < n; ++s) {
      out_offsets[s] = at * H;
      out_counts[s] = refuse == call_reject::none ? back_counts_[s] * H : 0;
      at += back_counts_[s];
    }
    std::int64_t pairs = 0;
    for (std::int64_t p : pairs_to_) pairs += p;
    std::vector<Tok> landed(static_cast<std::uint64_t>(pairs * H));
    auto const moved = run_all_to_allv<Tok, S, M, A>(
        comm_, rank_, v_send<Tok>{back.data(), back.size(), out_counts.data(), out_offsets.data()},
        v_recv<Tok>{landed.data(), landed.size(), in_counts.data(), in_offsets.data()}, alloc_, refuse, why,
        "moe combine");
    for (std::uint64_t t = 0; t < tokens_; ++t)
      for (std::int64_t h = 0; h < H; ++h) {
        float acc = 0.f;
        for (int j = 0; j < k; ++j)
          if (std::int64_t const row = slot_rows_[t * k + j]; row >= 0)
            acc = std::fma(topk_weights[t * k + j], static_cast<float>(landed[row * H + h]), acc);
        out[t * H + h] = Tok(acc);
      }
    return moved.st;
  }

 private:
  communicator& comm_;
  int rank_;
  moe::exchange_config cfg_;
  A alloc_;
  std::uint64_t value_words_ = 0;                  // words of a row's values (then its scales)
  std::uint64_t row_words_ = 0;
  moe::receive_bound bound_{};
  std::vector<std::int32_t> in_words_;             // rows that arrived, packed by source
  std::vector<Tok> grouped_;                       // received(): rows filed by local expert
  std::vector<std::uint8_t> grouped_fp8_;          // received_fp8(): the same for an fp8 exchange
  std::vector<float> grouped_scales_;
  std::vector<std::int32_t> counts_, offsets_;     // per local expert
  std::uint64_t grouped_rows_ = 0;
  bool dispatched_ = false;
  // The latest dispatch's layout, kept for combine:
  std::uint64_t tokens_ = 0;                       // tokens this rank sent
  std::vector<std::int64_t> pairs_to_;             // (token, slot) pairs this rank sent to each rank
  std::vector<std::int64_t> slot_rows_;            // [tokens, k]: row of combine's input for each slot, -1 unused
  std::vector<std::int64_t> back_positions_;       // rows of y to return, in return order
  std::vector<std::int64_t> back_counts_;          // ... how many to each source rank
};

}  // namespace reccl::cpu
