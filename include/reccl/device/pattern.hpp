// reccl/device/pattern.hpp -- who sends which segment to whom, and what the receiver does with it.
//
// Every engine (one-shot, pipelined, direct) moves data between the same index spaces: a collective
// of `count` elements per segment, an input of `in_segments` segments and an output of
// `out_segments` segments. Element i of a VT's block travels at the same index i in every segment, so
// one split of [0, count) drives every collective. Each collective's file fills in a `pattern`.
#pragma once

#include <cstdint>

#include "../config.hpp"
#include "../types.hpp"

namespace reccl::device {

struct pattern {
  collective coll = collective::all_reduce;
  std::int32_t me = 0, n = 1, root = 0;
  bool reduces = false;          ///< receiver combines contributions (all-reduce, reduce-scatter)
  bool same_source = false;      ///< every peer gets the same input segment (one load, n-1 stores)
  bool send_by_peer = false;     ///< input segment sent to peer p is p (else 0)
  bool recv_by_src = false;      ///< output segment filled from src is src (else 0)
  std::int32_t in_segments = 1, out_segments = 1;

  RECCL_HOST_DEVICE constexpr bool sends_to(int p) const {
    return p != me && (coll != collective::broadcast || me == root);
  }
  RECCL_HOST_DEVICE constexpr bool recvs_from(int p) const {
    return p != me && (coll != collective::broadcast || p == root);
  }
  RECCL_HOST_DEVICE constexpr bool sends_any() const { return n > 1 && (coll != collective::broadcast || me == root); }
  RECCL_HOST_DEVICE constexpr int send_segment(int p) const { return send_by_peer ? p : 0; }
  RECCL_HOST_DEVICE constexpr int recv_segment(int src) const { return recv_by_src ? src : 0; }
  /// Reducing collectives: the input segment this rank contributes, and the output segment written.
  RECCL_HOST_DEVICE constexpr int own_in_segment() const { return coll == collective::reduce_scatter ? me : 0; }
  /// Copying collectives: whether this rank copies its own input into its output.
  RECCL_HOST_DEVICE constexpr bool copies_own() const { return !reduces && (coll != collective::broadcast || me == root); }
};

}  // namespace reccl::device
