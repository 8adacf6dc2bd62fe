// reccl/device/collective/broadcast.hpp -- out[i] = in_root[i] on every rank.
//
//   root: in --push--> every peer (ring slots or, registered, the peer's output directly)
//   root copies in -> out unless in == out; the other ranks' `in` is not read.
//
//        root [x] ----> r1 [x]
//             \-------> r2 [x] ...
//
// count = elements; in-place: in == out.
#pragma once

#include "../pattern.hpp"

namespace reccl::device {

RECCL_HOST_DEVICE constexpr pattern broadcast_pattern(int me, int n, int root) {
  pattern p;
  p.coll = collective::broadcast;
  p.me = me;
  p.n = n;
  p.root = root;
  p.same_source = true;
  return p;
}

}  // namespace reccl::device
