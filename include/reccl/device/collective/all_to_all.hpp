// reccl/device/collective/all_to_all.hpp -- out_q[p*count + i] = in_p[q*count + i].
//
//   in  (n segments)  r0: [a0 | a1]        r1: [b0 | b1]
//                             \________  ______/
//                                      \/
//   out (n segments)  r0: [a0 | b0]        r1: [a1 | b1]
//
// count = elements per (source, destination) pair. Not in-place (a peer's segment would be
// overwritten before it is sent).
#pragma once

#include "../pattern.hpp"

namespace reccl::device {

RECCL_HOST_DEVICE constexpr pattern all_to_all_pattern(int me, int n) {
  pattern p;
  p.coll = collective::all_to_all;
  p.me = me;
  p.n = n;
  p.send_by_peer = true;
  p.recv_by_src = true;
  p.in_segments = n;
  p.out_segments = n;
  return p;
}

}  // namespace reccl::device
