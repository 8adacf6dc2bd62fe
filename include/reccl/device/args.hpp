// reccl/device/args.hpp -- the argument block every reccl kernel takes by value, and the index
// arithmetic that maps (VT split, CTA, warp) to element ranges.
//
// Path isolation: VT v owns elements [split.offset(v), split.offset(v) + split.count[v]) of every
// segment; its `ctas_per_vt` CTAs cut that block into near-equal parts whose inner boundaries are
// rounded to whole 16-byte packs. Only VT edges may fall inside a pack, and those packs are moved
// element by element. The reduction order of an element never depends on these boundaries, so
// moving bytes between VTs changes no bit of the result.
#pragma once

#include <cstdint>

#include "../config.hpp"
#include "../policy/split.hpp"
#include "../types.hpp"
#include "collective/all_gather.hpp"
#include "collective/all_reduce.hpp"
#include "collective/all_to_all.hpp"
#include "collective/broadcast.hpp"
#include "collective/reduce_scatter.hpp"
#include "element.hpp"
#include "transport/lsa.hpp"

namespace reccl::device {

/// Device algorithms. Which ones a call may use depends on the collective, the dtype and whether
/// its buffers are registered (see host/tuning.hpp for the automatic choice).
enum class algorithm : std::uint8_t {
  automatic = 0,
  one_shot,   ///< push into the peers' one-shot slots, no barrier: Lamport packets (fp32/fp16/bf16
              ///< reductions) or LL packets (integers, fp64, the copying collectives); small messages
  pipelined,  ///< push through per-warp rings with ready/credit flags (every collective, plain buffers)
  two_shot,   ///< registered all-reduce: pull my part from every rank, reduce, store to every rank
  direct,     ///< registered, one phase: pull (AR out-of-place, RS) or push (AG, broadcast, all-to-all)
};

constexpr char const* name(algorithm a) {
  switch (a) {
    case algorithm::automatic: return "auto";
    case algorithm::one_shot: return "one_shot";
    case algorithm::pipelined: return "pipelined";
    case algorithm::two_shot: return "two_shot";
    case algorithm::direct: return "direct";
  }
  return "?";
}

/// Everything a kernel needs, by value (about 600 bytes). Kernel arguments live in a constant bank
/// that is cold at every launch, and each 64-byte line a kernel first touches costs a miss on its
/// path: the fields every engine reads (the view, the split, the scalars) come first, the arrays
/// only the zero-copy engines read last (0.2 us per small call, bench/NOTES.md 44).
struct coll_args {
  lsa_view view{};
  split sp{};
  collective coll = collective::all_reduce;
  redop op = redop::sum;
  algorithm algo = algorithm::pipelined;
  bool vec_ok = false;       ///< every user pointer (and segment stride) is 16-byte aligned
  bool in_place = false;
  std::int32_t root = 0;
  std::int32_t ctas_per_vt = 1;
  std::int32_t chunk_packs = 0;  ///< pipelined: packs per ring chunk
  std::uint32_t desc = 0;        ///< hash of what every rank must agree on
  std::uint64_t count = 0;       ///< elements per segment (bytes for the copying collectives)
  std::uint64_t seg_bytes = 0;   ///< count * sizeof(element)
  std::uint64_t timeout_ns = 0;
  void const* in = nullptr;
  void* out = nullptr;
  void const* peer_in[max_lsa] = {};  ///< registered input of every rank (direct/two-shot only)
  void* peer_out[max_lsa] = {};       ///< registered output of every rank (direct/two-shot only)
};

RECCL_HOST_DEVICE constexpr pattern make_pattern(collective c, int me, int n, int root) {
  switch (c) {
    case collective::all_reduce: return all_reduce_pattern(me, n);
    case collective::reduce_scatter: return reduce_scatter_pattern(me, n);
    case collective::all_gather: return all_gather_pattern(me, n);
    case collective::broadcast: return broadcast_pattern(me, n, root);
    case collective::all_to_all: return all_to_all_pattern(me, n);
  }
  return pattern{};
}

using reccl::part_of;  // policy/split.hpp

/// Elements of every segment that CTA `cta` handles.
RECCL_HOST_DEVICE constexpr elem_range cta_range(split const& sp, int ctas_per_vt, int cta, int v) {
  int const vt = cta / ctas_per_vt;
  if (vt >= sp.n_vts || !sp.live(vt)) return elem_range{0, 0};
  std::uint64_t const off = sp.offset(vt);
  return part_of(elem_range{off, off + sp.count[vt]}, ctas_per_vt, cta % ctas_per_vt, v);
}

/// Packs [first, end) touched by an element range.
struct pack_span {
  std::uint64_t first = 0, end = 0;
  RECCL_HOST_DEVICE constexpr std::uint64_t size() const { return end - first; }
};
RECCL_HOST_DEVICE constexpr pack_span packs_of(elem_range r, int v) {
  if (r.empty()) return pack_span{0, 0};
  std::uint64_t const V = static_cast<std::uint64_t>(v);
  return pack_span{r.lo / V, (r.hi + V - 1) / V};
}

}  // namespace reccl::device
