// reccl/host/nvlink/planner.hpp -- from a call to its plan on the NVLink path: the host-side checks
// that throw before anything is launched, then the algorithm, grid, VT split and chunk, from the
// tuning table or the caller's launch_options. It reads only what every rank passes alike (sizes,
// the configuration, whether buffers are registered), so every rank plans the same call the same
// way; the kernels' entry barrier compares the resulting digest.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "../../device/launch.hpp"
#include "../../policy/allocator/allocator.hpp"
#include "../../policy/split.hpp"
#include "../../types.hpp"
#include "../error.hpp"
#include "../tuning.hpp"
#include "config.hpp"
#include "registry.hpp"

namespace reccl::detail {

/// How many segments of `count` elements a rank's input and output hold, and the message size
/// nccl-tests would report.
struct call_shape {
  int in_segments, out_segments;
  std::uint64_t bytes;
};

/// What the checks found out about a call's buffers.
struct checked_call {
  bool reads_in = false;  ///< this rank reads `in` (all but a broadcast's non-roots)
  bool in_place = false;
  std::uint64_t seg = 0;  ///< bytes per segment
  call_shape shape{};
};

/// Plans calls for one rank; holds references to the communicator's state, so it lives for one call.
class nvlink_planner {
 public:
  nvlink_planner(nvlink_config const& cfg, int rank, int nranks, std::vector<registered_buffer> const& buffers)
      : cfg_(cfg), rank_(rank), nranks_(nranks), buffers_(buffers) {}

  registered_buffer const* find(void const* p, std::size_t bytes) const { return find_registered(buffers_, p, bytes); }

  void check_lane(int lane) const {
    if (lane < 0 || lane >= cfg_.lanes)
      throw error(status::invalid_argument, "lane " + std::to_string(lane) + " outside [0, " + std::to_string(cfg_.lanes) + ")");
  }

  /// Host-side validation of a call; throws reccl::error(invalid_argument) on bad input. For
  /// count == 0 only the enums, the root and the lane are checked.
  checked_call check(collective c, void const* in, void const* out, std::size_t count, dtype t, redop op, int root,
                     int lane) const {
    if (static_cast<unsigned>(t) > static_cast<unsigned>(dtype::float64))
      throw error(status::invalid_argument, "unknown dtype");
    if (static_cast<unsigned>(op) > static_cast<unsigned>(redop::avg)) throw error(status::invalid_argument, "unknown redop");
    require_compiled(c, t);
    if (root < 0 || root >= nranks_) throw error(status::invalid_argument, "root outside [0, ranks)");
    check_lane(lane);
    checked_call k;
    if (count == 0) return k;
    if (count > (std::uint64_t(1) << 40)) throw error(status::invalid_argument, "count above 2^40 elements");
    k.reads_in = c != collective::broadcast || rank_ == root;
    if ((k.reads_in && in == nullptr) || out == nullptr) throw buffer_error("null buffer pointer");
    std::size_t const es = size_of(t);
    // reductions load whole elements; copying collectives move raw bytes (any alignment)
    std::size_t const align = reduces(c) ? es : 1;
    if ((k.reads_in && reinterpret_cast<std::uintptr_t>(in) % align != 0) || reinterpret_cast<std::uintptr_t>(out) % align != 0)
      throw buffer_error("buffer pointer not aligned to the element size");
    k.shape = shape_of(c, count, t);
    k.seg = static_cast<std::uint64_t>(count) * es;
    k.in_place = k.reads_in && is_in_place(c, in, out, k.seg);
    if (c == collective::all_to_all && k.in_place) throw buffer_error("all_to_all cannot run in place");
    if (k.reads_in && !k.in_place) {
      auto const* i0 = static_cast<char const*>(in);
      auto const* o0 = static_cast<char const*>(out);
      if (i0 < o0 + k.seg * k.shape.out_segments && o0 < i0 + k.seg * k.shape.in_segments)
        throw buffer_error("input and output overlap (other than the in-place layout)");
    }
    return k;
  }

  call_shape shape_of(collective c, std::size_t count, dtype t) const {
    device::pattern const P = device::make_pattern(c, rank_, nranks_, 0);
    std::uint64_t const seg = static_cast<std::uint64_t>(count) * size_of(t);
    std::uint64_t const bytes = c == collective::reduce_scatter ? seg * P.in_segments : seg * P.out_segments;
    return {P.in_segments, P.out_segments, bytes};
  }

  /// Largest pack count any CTA gets (one-shot slot capacity check).
  static std::uint64_t max_cta_packs(split const& sp, int ctas_per_vt, int grid, int v) {
    std::uint64_t m = 0;
    for (int c = 0; c < grid; ++c) {
      std::uint64_t const np = device::packs_of(device::cta_range(sp, ctas_per_vt, c, v), v).size();
      m = np > m ? np : m;
    }
    return m;
  }

  plan choose(collective c, void const* in, void const* out, std::size_t count, dtype t, launch_options const& o,
              split* sp_out = nullptr) const {
    nvlink_config const& cfg = cfg_;
    tuning const& tu = cfg.tune;
    call_shape const sh = shape_of(c, count, t);
    std::uint64_t const seg = static_cast<std::uint64_t>(count) * size_of(t);
    bool const registered = zero_copy_ready(c, in, out, seg, sh);
    bool const in_place = is_in_place(c, in, out, seg);
    bool const lamport = reduces(c) && (t == dtype::float32 || t == dtype::float16 || t == dtype::bfloat16);
    int const V = t == dtype::float16 || t == dtype::bfloat16 ? 8 : t == dtype::float64 || t == dtype::int64 ? 2 : 4;
    int const Vb = reduces(c) ? V : 16;  // copying collectives move raw bytes
    std::uint64_t const units = reduces(c) ? count : seg;  // what the kernel's split counts

    plan p;
    p.algo = o.algo;
    if (p.algo == algorithm::automatic) {
      std::uint64_t const one_shot_max = lamport                                     ? tu.one_shot_max_bytes
                                         : c == collective::broadcast && registered ? tu.broadcast_registered_one_shot_max_bytes
                                                                                    : tu.ll_max_bytes;
      if (sh.bytes <= one_shot_max)
        p.algo = algorithm::one_shot;
      else if (registered)
        p.algo = c == collective::all_reduce ? algorithm::two_shot : algorithm::direct;
      else
        p.algo = algorithm::pipelined;
    }
    // validity of the (possibly explicit) algorithm
    switch (p.algo) {
      case algorithm::one_shot: break;
      case algorithm::two_shot:
        if (c != collective::all_reduce) throw error(status::invalid_argument, "two_shot is an all_reduce algorithm");
        [[fallthrough]];
      case algorithm::direct:
        if (!registered)
          throw buffer_error(std::string(device::name(p.algo)) + " needs buffers from allocate() (registered symmetric windows)");
        if (p.algo == algorithm::direct && c == collective::all_reduce && in_place)
          throw buffer_error("direct all_reduce is out-of-place only (use two_shot)");
        break;
      case algorithm::pipelined: break;
      case algorithm::automatic: break;
    }

    // geometry
    int grid = o.ctas;
    int chunk = o.chunk_bytes;
    if (p.algo == algorithm::one_shot) {
      if (grid == 0) {
        std::uint64_t const per = static_cast<std::uint64_t>(tu.one_shot_bytes_per_cta);
        grid = static_cast<int>((sh.bytes + per - 1) / per);
      }
    } else if (p.algo == algorithm::pipelined) {
      tune_row const& r = row_for(tu.pipelined, sh.bytes);
      if (grid == 0) grid = r.ctas;
      if (chunk == 0) chunk = r.chunk_bytes;
    } else {
      if (grid == 0) grid = row_for(tu.zero_copy, sh.bytes).ctas;
    }
    if (grid < 1) grid = 1;
    if (grid > cfg.max_ctas) {
      if (o.ctas != 0) throw error(status::invalid_argument, "ctas above the communicator's max_ctas");
      grid = cfg.max_ctas;
    }
    split sp;
    if (o.vt_split != nullptr) {
      sp = *o.vt_split;
      if (sp.n_vts < 1 || sp.n_vts > max_vts || sp.sum() != count)
        throw error(status::invalid_argument, "vt_split: VT count outside [1, max_vts] or counts do not sum to count");
      if (!reduces(c)) {  // copying collectives run on bytes: scale the element split
        for (int i = 0; i < max_vts; ++i) sp.count[i] *= size_of(t);
        sp.total *= size_of(t);
      }
      for (int i = 0; i < sp.n_vts; ++i)
        if (!sp.live(i) && sp.count[i] != 0) throw error(status::invalid_argument, "vt_split: a masked VT holds elements");
      p.n_vts = sp.n_vts;
    } else {
      int nv = o.vts != 0 ? o.vts : tu.vts;
      if (nv < 1) nv = 1;
      if (nv > max_vts) throw error(status::invalid_argument, "vts above max_vts");
      p.n_vts = nv < grid ? nv : grid;
      // equal shares, VT boundaries on whole 16-byte packs
      sp = to_split(equal_shares(p.n_vts, all_live(p.n_vts)), units, static_cast<std::uint64_t>(Vb));
    }
    p.ctas_per_vt = grid / p.n_vts;
    if (p.ctas_per_vt < 1) p.ctas_per_vt = 1;
    p.grid = p.n_vts * p.ctas_per_vt;
    if (p.grid > cfg.max_ctas) throw error(status::invalid_argument, "VTs x CTAs per VT above max_ctas");
    if (p.algo == algorithm::one_shot) {
      // a slot holds one Lamport packet or half an LL packet pair per 16 bytes of payload
      std::uint64_t const cap = static_cast<std::uint64_t>(cfg.one_shot_slot_bytes) / (lamport ? 16 : 32);
      if (max_cta_packs(sp, p.ctas_per_vt, p.grid, Vb) > cap) {
        if (o.algo == algorithm::one_shot)
          throw error(status::invalid_argument, "message too large for the one-shot slots with this CTA count");
        // automatic choice: fall back to the next path, as the table would for a larger message
        p.algo = registered ? (c == collective::all_reduce ? algorithm::two_shot : algorithm::direct) : algorithm::pipelined;
        tune_row const& r = row_for(registered ? tu.zero_copy : tu.pipelined, sh.bytes);
        chunk = o.chunk_bytes != 0 ? o.chunk_bytes : r.chunk_bytes;
      }
    }
    if (p.algo == algorithm::pipelined) {
      if (o.chunk_bytes == 0 && chunk > cfg.ring_chunk_bytes) chunk = cfg.ring_chunk_bytes;  // table vs smaller rings
      if (chunk <= 0 || chunk % 16 != 0 || chunk > cfg.ring_chunk_bytes)
        throw error(status::invalid_argument, "chunk_bytes must be a positive multiple of 16 up to ring_chunk_bytes");
      p.chunk_packs = chunk / 16;
    }
    if (sp_out != nullptr) *sp_out = sp;
    return p;
  }

  /// Whether the buffers peers must reach are registered: all-reduce pulls inputs and pushes
  /// outputs, reduce-scatter pulls inputs, the others push into outputs. Depends only on what every
  /// rank passes alike, so every rank decides the same.
  bool zero_copy_ready(collective c, void const* in, void const* out, std::uint64_t seg, call_shape const& sh) const {
    bool const ri = in != nullptr && find(in, seg * sh.in_segments) != nullptr;
    bool const ro = find(out, seg * sh.out_segments) != nullptr;
    switch (c) {
      case collective::all_reduce: return ri && ro;
      case collective::reduce_scatter: return ri;
      default: return ro;
    }
  }

  bool is_in_place(collective c, void const* in, void const* out, std::uint64_t seg) const {
    auto const* i = static_cast<char const*>(in);
    auto const* o = static_cast<char const*>(out);
    switch (c) {
      case collective::all_reduce:
      case collective::broadcast:
      case collective::all_to_all: return i == o;
      case collective::reduce_scatter: return o == i + seg * rank_;
      case collective::all_gather: return i == o + seg * rank_;
    }
    return false;
  }

 private:
  nvlink_config const& cfg_;
  int rank_, nranks_;
  std::vector<registered_buffer> const& buffers_;
};

}  // namespace reccl::detail
