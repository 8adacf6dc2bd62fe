// reccl/proxy/collective/geometry.hpp -- how a proxy collective cuts its buffers: segments per
// rank, each VT's block of a segment (from the call's shares, in whole packs), and the elements one
// receive slot holds. Pure functions of the arguments every rank passes alike.
#pragma once

#include <cstdint>

#include "../../config.hpp"
#include "../../policy/allocator/allocator.hpp"
#include "../../policy/split.hpp"
#include "../../types.hpp"

namespace reccl::proxy::detail {

RECCL_HOST_DEVICE constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

/// Elements of each rank's segment for the VT split (all-reduce: the padded block).
RECCL_HOST_DEVICE std::uint64_t segment_elems(collective c, std::uint64_t count, int n, int pack) {
  if (c != collective::all_reduce) return count;
  return ceil_div(ceil_div(count, static_cast<std::uint64_t>(n)), static_cast<std::uint64_t>(pack)) * static_cast<std::uint64_t>(pack);
}
/// Elements of rank p's segment: all-reduce cuts `count` into segments of `seg` (the last ones may
/// be shorter or empty), the others have `count` per segment.
RECCL_HOST_DEVICE std::uint64_t segment_len(collective c, std::uint64_t count, std::uint64_t seg, int p) {
  if (c != collective::all_reduce) return count;
  std::uint64_t const b = static_cast<std::uint64_t>(p) * seg;
  return count > b ? (count - b < seg ? count - b : seg) : 0;
}
/// VT vt's range [lo, hi) of a segment of `seg` elements: its block of the split `s` describes, in
/// whole packs (the last live VT also takes seg % pack).
RECCL_HOST_DEVICE void vt_range(reccl::shares const& s, std::uint64_t seg, int pack, int vt, std::uint64_t& lo, std::uint64_t& hi) {
  reccl::split const sp = reccl::to_split(s, seg, static_cast<std::uint64_t>(pack));
  lo = sp.offset(vt);
  hi = lo + sp.count[vt];
}
/// Elements of slot capacity (a multiple of the pack).
RECCL_HOST_DEVICE std::uint64_t slot_elems(std::uint64_t area_bytes, std::uint32_t slots, std::uint64_t es, int pack) {
  std::uint64_t const e = area_bytes / slots / es;
  return e / static_cast<std::uint64_t>(pack) * static_cast<std::uint64_t>(pack);
}

}  // namespace reccl::proxy::detail
