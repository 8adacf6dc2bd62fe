// reccl/host/tuning.hpp -- the tuning table: which algorithm and how many CTAs for which size.
//
// The table is part of the communicator's configuration and is hashed into the hello handshake at
// creation, so every rank provably uses the same one: the choice is a pure function of (table,
// collective, dtype, size, buffer kind) and is never made per rank. Defaults come from
// measurements on 2 x H200 (NV18); bench/results/ holds the runs they come from.
#pragma once

#include <cstdint>
#include <limits>

#include "../device/args.hpp"

namespace reccl {

using device::algorithm;

/// One row: messages up to `max_bytes` run on `ctas` CTAs (and, pipelined, with `chunk_bytes`
/// per warp chunk).
struct tune_row {
  std::uint64_t max_bytes = 0;
  std::int32_t ctas = 0;
  std::int32_t chunk_bytes = 0;
};

inline constexpr int tune_rows = 8;
inline constexpr std::uint64_t any_size = std::numeric_limits<std::uint64_t>::max();

/// The tuning table (no padding bytes: it is hashed as raw bytes). "bytes" is the message size as nccl-tests reports it: all-reduce and broadcast
/// count*size, reduce-scatter the input (nranks*count*size), all-gather and all-to-all the output.
struct tuning {
  /// One-shot with Lamport packets (fp32/fp16/bf16 all-reduce, reduce-scatter) up to this size;
  /// below it the one-shot beats every other path on any buffer (bench/results/2026-11-30-*).
  std::uint64_t one_shot_max_bytes = 1u << 20;
  /// One-shot with LL packets (integers, fp64, all-gather, broadcast, all-to-all) up to this size.
  std::uint64_t ll_max_bytes = 1u << 20;
  /// A broadcast on registered buffers takes the one-shot only up to this size: above it the
  /// direct push is as fast (one H200, loopback ranks: one-shot 0.44-0.79x of direct at 1-256 KiB,
  /// 1.02x at 1 MiB; bench/results/2026-12-04-h200-small/call7).
  std::uint64_t broadcast_registered_one_shot_max_bytes = 256u << 10;
  /// One-shot CTA count = ceil(bytes / one_shot_bytes_per_cta), at most the configured max.
  std::int32_t one_shot_bytes_per_cta = 8 << 10;
  /// VTs per collective: min(vts, CTAs), CTAs rounded down to a multiple of it.
  std::int32_t vts = 8;
  /// Plain buffers above the one-shot sizes (measured: more CTAs win at every size, 32 KiB chunks
  /// from 64 MiB).
  tune_row pipelined[tune_rows] = {{64u << 10, 4, 4 << 10},    {256u << 10, 16, 8 << 10},
                                   {1u << 20, 64, 8 << 10},    {16u << 20, 128, 8 << 10},
                                   {any_size, 128, 32 << 10}};
  /// Registered buffers above the one-shot sizes (two-shot all-reduce, direct others).
  tune_row zero_copy[tune_rows] = {{1u << 20, 64, 0}, {4u << 20, 96, 0}, {any_size, 128, 0}};
};

/// Row of `rows` that covers `bytes` (the last non-empty row if none does).
inline tune_row const& row_for(tune_row const (&rows)[tune_rows], std::uint64_t bytes) {
  int last = 0;
  for (int i = 0; i < tune_rows; ++i) {
    if (rows[i].ctas == 0) break;
    last = i;
    if (bytes <= rows[i].max_bytes) return rows[i];
  }
  return rows[last];
}

/// What a call runs: algorithm and geometry. Identical on every rank for identical arguments.
struct plan {
  algorithm algo = algorithm::automatic;
  std::int32_t grid = 0;         ///< CTAs
  std::int32_t n_vts = 0;        ///< VTs (grid = n_vts * ctas_per_vt)
  std::int32_t ctas_per_vt = 0;
  std::int32_t chunk_packs = 0;  ///< pipelined only
};

}  // namespace reccl
