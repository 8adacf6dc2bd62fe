// reccl/moe/routing.hpp -- where a mixture-of-experts token goes: experts spread evenly over ranks,
// the ranks one token visits, and the worst-case sizes a dispatch's receive side needs.
//
//   experts 0 .. E-1, E = nranks * experts_per_rank; expert e lives on rank e / experts_per_rank
//   as local expert e % experts_per_rank.
//
//   token t of rank s, top-k slots j = 0 .. k-1:  topk_idx[t*k + j] = e  (or -1: slot unused)
//     dispatch  sends row t once to each rank that holds one of its experts (one copy per rank,
//               however many of its experts that rank holds), and that rank files it under each
//               of those local experts;
//     combine   returns, for each used slot j, the expert's output row y_j, and rank s computes
//                 out[t] = round( fma(w_{k-1}, y_{k-1}, ... fma(w_1, y_1, fma(w_0, y_0, 0.f)) ) )
//               in fp32, slots in top-k order, one rounding at the end (unused slots skipped).
//
// Everything here is plain arithmetic (host and device): the CPU engine and the GPU kernels use
// the same functions, so both file a row under the same expert at the same place.
#pragma once

#include <cstdint>

#include "../config.hpp"

namespace reccl::moe {

/// The shape of one expert-parallel group: every rank passes the same values.
struct routing {
  int nranks = 1;     ///< ranks of the group
  int n_experts = 1;  ///< experts in total, a multiple of nranks
  int top_k = 1;      ///< slots per token, 1 .. max_top_k

  static constexpr int max_top_k = 32;

  RECCL_HOST_DEVICE constexpr int experts_per_rank() const { return n_experts / nranks; }
  RECCL_HOST_DEVICE constexpr int rank_of(int expert) const { return expert / experts_per_rank(); }
  RECCL_HOST_DEVICE constexpr int local_of(int expert) const { return expert % experts_per_rank(); }
  /// Slots of one token that can land on one rank: a rank files a row under at most this many experts.
  RECCL_HOST_DEVICE constexpr int max_slots_per_rank() const {
    return top_k < experts_per_rank() ? top_k : experts_per_rank();
  }

  /// Null when the shape is valid, else why not.
  constexpr char const* invalid() const {
    if (nranks < 1 || nranks > max_ranks) return "nranks must be in [1, 64]";
    if (n_experts < nranks || n_experts % nranks != 0) return "n_experts must be a positive multiple of nranks";
    if (top_k < 1 || top_k > max_top_k) return "top_k must be in [1, 32]";
    return nullptr;
  }
};

/// The ranks one token visits, as a bit mask (bit r: rank r holds one of its experts), or
/// `bad_token` when a slot names an expert outside [-1, n_experts) or an expert another slot of
/// the token names already (the receive bound counts each expert once per token).
inline constexpr std::uint64_t bad_token = ~std::uint64_t{0};

RECCL_HOST_DEVICE std::uint64_t ranks_of_token(routing const& g, std::int32_t const* topk_row) {
  std::uint64_t mask = 0;
  for (int j = 0; j < g.top_k; ++j) {
    std::int32_t const e = topk_row[j];
    if (e == -1) continue;
    if (e < -1 || e >= g.n_experts) return bad_token;
    for (int i = 0; i < j; ++i)
      if (topk_row[i] == e) return bad_token;
    mask |= std::uint64_t{1} << g.rank_of(e);
  }
  return mask;
}

/// Row counts a dispatch's receive side must hold, for a group whose ranks send at most
/// `max_tokens` tokens each, with each expert's rows starting on a multiple of `align` rows:
///   rows      rows that cross into one rank: nranks * max_tokens (a token reaches a rank once)
///   grouped   rows filed under that rank's experts: rows * max_slots_per_rank, plus
///             experts_per_rank * (align - 1) rows of padding at most
struct receive_bound {
  std::uint64_t rows = 0;
  std::uint64_t grouped = 0;
};

RECCL_HOST_DEVICE constexpr receive_bound receive_bound_of(routing const& g, std::uint64_t max_tokens, int align) {
  std::uint64_t const rows = static_cast<std::uint64_t>(g.nranks) * max_tokens;
  std::uint64_t const pad = static_cast<std::uint64_t>(g.experts_per_rank()) * static_cast<std::uint64_t>(align - 1);
  return {rows, rows * static_cast<std::uint64_t>(g.max_slots_per_rank()) + pad};
}

/// What a dispatch sends: rows of the exchange's token type (what combine returns), or fp8 e4m3
/// values with one fp32 scale per 128 (moe/fp8.hpp; hidden a multiple of 128).
enum class payload : int { tokens = 0, fp8_e4m3 = 1 };

/// What an expert exchange (CPU engine or GPU) is created for; every rank passes the same values.
struct exchange_config {
  routing route;
  std::uint64_t max_tokens = 0;  ///< tokens one rank passes to one dispatch, at most
  int hidden = 0;                ///< values per token row
  int align = 1;                 ///< each expert's first row is a multiple of this (1: packed)
  payload dispatch = payload::tokens;  ///< what dispatch sends (combine always returns token rows)

  /// Bytes of one dispatched row's values, and fp32 scales per row, for tokens of `tok_bytes`.
  constexpr std::uint64_t row_bytes(std::uint64_t tok_bytes) const {
    return static_cast<std::uint64_t>(hidden) * (dispatch == payload::fp8_e4m3 ? 1u : tok_bytes);
  }
  constexpr int scales_per_row() const { return dispatch == payload::fp8_e4m3 ? hidden / 128 : 0; }
  /// Null when hidden, align and the payload fit together, else why not.
  constexpr char const* invalid_rows() const {
    if (hidden < 1 || align < 1) return "hidden and align must be >= 1";
    if (dispatch != payload::tokens && dispatch != payload::fp8_e4m3) return "unknown payload";
    if (dispatch == payload::fp8_e4m3 && hidden % 128 != 0) return "an fp8 dispatch needs hidden a multiple of 128 (one scale per 128 values)";
    return nullptr;
  }
};

/// What a dispatch with dead ranks masked left out (device memory, written by every dispatch):
/// slots of this rank's tokens whose expert lives on a masked rank, and tokens with at least one
/// such slot. Those slots add nothing to combine's sum (as an unused slot: -1).
struct drop_report {
  std::int64_t slots = 0;
  std::int64_t tokens = 0;
};

/// `n` rounded up to a multiple of `align` (align >= 1).
RECCL_HOST_DEVICE constexpr std::uint64_t align_up(std::uint64_t n, std::uint64_t align) {
  return (n + align - 1) / align * align;
}

}  // namespace reccl::moe
