// reccl/device/collective/reduce_scatter.hpp -- out_r[i] = in_0[r*count+i] (op) in_1[r*count+i] ...
//
//   rank r sends input segment p to rank p; rank p reduces segment p of every rank (its own read
//   locally) in rank order:
//
//   in (n segments)   r0: [ s0 | s1 ]        r1: [ s0 | s1 ]
//                            |    \______  ______/    |
//                            |           \/           |
//                            v     ______/\______     v
//   out (1 segment)   r0: s0(r0) op s0(r1)     r1: s1(r0) op s1(r1)
//
// count = output elements per rank; in holds n*count. In-place: out == in + rank*count.
#pragma once

#include "../pattern.hpp"

namespace reccl::device {

RECCL_HOST_DEVICE constexpr pattern reduce_scatter_pattern(int me, int n) {
  pattern p;
  p.coll = collective::reduce_scatter;
  p.me = me;
  p.n = n;
  p.reduces = true;
  p.send_by_peer = true;
  p.in_segments = n;
  return p;
}

}  // namespace reccl::device
