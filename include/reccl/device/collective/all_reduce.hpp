// reccl/device/collective/all_reduce.hpp -- all-reduce: out[i] = in_0[i] (op) in_1[i] ... on every rank.
//
//   one-shot (Lamport push)        two-shot (registered)             pipelined (plain buffers)
//   r0: in --push--> r1.slot[0]    r0 owns half 0, r1 owns half 1    r0: in --chunks--> r1.ring[0]
//   r1: in --push--> r0.slot[1]    each: pull its half from peers,   r1: in --chunks--> r0.ring[1]
//   each: poll slots, reduce in    reduce, store the result into     each: wait ready, reduce own in
//   rank order, write out          every rank's output               + ring in rank order -> out,
//                                                                    credit the slot back
//
// count = elements per rank; in and out hold `count` elements; in == out is in-place.
#pragma once

#include "../pattern.hpp"

namespace reccl::device {

RECCL_HOST_DEVICE constexpr pattern all_reduce_pattern(int me, int n) {
  pattern p;
  p.coll = collective::all_reduce;
  p.me = me;
  p.n = n;
  p.reduces = true;
  p.same_source = true;
  return p;
}

}  // namespace reccl::device
