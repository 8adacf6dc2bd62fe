// reccl/device/collective/all_gather.hpp -- out[r*count + i] = in_r[i] on every rank.
//
//   in (1 segment)    r0: [a]            r1: [b]
//                      |  \________  ______/  |
//                      v           \/         v
//   out (n segments)  r0: [a | b]        r1: [a | b]
//
// count = input elements per rank; out holds n*count. In-place: in == out + rank*count.
#pragma once

#include "../pattern.hpp"

namespace reccl::device {

RECCL_HOST_DEVICE constexpr pattern all_gather_pattern(int me, int n) {
  pattern p;
  p.coll = collective::all_gather;
  p.me = me;
  p.n = n;
  p.same_source = true;
  p.recv_by_src = true;
  p.out_segments = n;
  return p;
}

}  // namespace reccl::device
