// reccl/policy/split.hpp -- the byte split across VTs: the Allocator's output, the kernels' input.
//
// A split gives VT i one contiguous block [offset(i), offset(i) + count[i]) of the message
// (path isolation: each VT finishes on its own, and a boundary can move without touching kernels).
// Counts are in elements of the collective's per-rank count. Plain data, trivially copyable, the same
// bits on host and device.
#pragma once

#include <cstdint>

#include "../config.hpp"

namespace reccl {

struct split {
  std::int32_t n_vts = 0;           ///< VTs in use (1..max_vts)
  std::uint32_t live_mask = 0;      ///< bit i set: VT i is live (a masked VT gets 0 elements)
  std::uint64_t total = 0;          ///< sum of count[] (the per-rank element count)
  std::uint64_t count[max_vts] = {};

  RECCL_HOST_DEVICE constexpr std::uint64_t offset(int vt) const {
    std::uint64_t o = 0;
    for (int i = 0; i < vt; ++i) o += count[i];
    return o;
  }
  RECCL_HOST_DEVICE constexpr bool live(int vt) const { return (live_mask >> vt) & 1u; }
  RECCL_HOST_DEVICE constexpr std::uint64_t sum() const {
    std::uint64_t s = 0;
    for (int i = 0; i < n_vts; ++i) s += count[i];
    return s;
  }
  RECCL_HOST_DEVICE constexpr bool operator==(split const& o) const {
    if (n_vts != o.n_vts || live_mask != o.live_mask || total != o.total) return false;
    for (int i = 0; i < max_vts; ++i)
      if (count[i] != o.count[i]) return false;
    return true;
  }
};

/// Elements [lo, hi) of a segment (a VT's block, a CTA's part of it, a recovery worker's share).
struct elem_range {
  std::uint64_t lo = 0, hi = 0;
  RECCL_HOST_DEVICE constexpr bool empty() const { return hi <= lo; }
};

/// Part `i` of `parts` of [lo, hi): inner boundaries rounded up to a multiple of `v` elements
/// (v = 1: lo + floor(len * i / parts)). How a VT's block is cut among its CTAs, and how a dead
/// VT's block is shared among the live VTs that redo it, on the GPU and on the CPU engine alike.
RECCL_HOST_DEVICE constexpr elem_range part_of(elem_range r, int parts, int i, int v) {
  auto cut = [&](int k) -> std::uint64_t {
    if (k <= 0) return r.lo;
    if (k >= parts) return r.hi;
    std::uint64_t const len = r.hi > r.lo ? r.hi - r.lo : 0;
    std::uint64_t x = r.lo + len / static_cast<std::uint64_t>(parts) * static_cast<std::uint64_t>(k) +
                      len % static_cast<std::uint64_t>(parts) * static_cast<std::uint64_t>(k) /
                          static_cast<std::uint64_t>(parts);
    x = (x + static_cast<std::uint64_t>(v) - 1) / static_cast<std::uint64_t>(v) * static_cast<std::uint64_t>(v);
    return x < r.lo ? r.lo : (x > r.hi ? r.hi : x);
  };
  return elem_range{cut(i), cut(i + 1)};
}

RECCL_HOST_DEVICE constexpr std::uint32_t all_live(int n_vts) {
  return n_vts >= 32 ? 0xffffffffu : ((1u << n_vts) - 1u);
}

}  // namespace reccl
