// The composed reduce-scatter and all-gather on the P2P transport, per schedule, with loopback ranks
// (every rank on GPU 0, tests/device/p2p_world.hpp): every dtype (int32, int64, fp16, bf16, fp32,
// fp64) × every op × 2, 3, 4 ranks × counts 0, 1, 1001, 4099 (pointers off 16-byte alignment by one
// element), 64 KiB and 1 MiB worth. Random inputs; outputs and guard bands poisoned; each output
// bitwise against the CPU engine on the same schedule and against an independent reference.
// VT splits (1, 3, 8 VTs x 1, 2 CTAs per VT, uneven shares) give identical bits. Test suite "big":
// 16 MiB per schedule, 256 MiB per collective and element width. One translation unit per
// collective family keeps each compile short and instantiates each plan once.
#define CUDA_NO_HALF  // reccl::half, not cuda_fp16.h's global `half`
#include "../doctest_main.hpp"

#include "p2p_world.hpp"

using namespace p2p_test;

TEST_CASE("p2p loopback correctness: reduce_scatter/ring") { REQUIRE_GPU(); correctness<plan::rs_ring>(); }
TEST_CASE("p2p loopback correctness: reduce_scatter/one_shot") { REQUIRE_GPU(); correctness<plan::rs_one_shot>(); }
TEST_CASE("p2p loopback correctness: reduce_scatter/two_shot") { REQUIRE_GPU(); correctness<plan::rs_two_shot>(); }
TEST_CASE("p2p loopback correctness: all_gather/ring") { REQUIRE_GPU(); correctness<plan::ag_ring>(); }
TEST_CASE("p2p loopback correctness: all_gather/one_shot") { REQUIRE_GPU(); correctness<plan::ag_one_shot>(); }

TEST_CASE("p2p loopback: VT splits give identical bits: reduce_scatter, all_gather") {
  REQUIRE_GPU();
  vt_splits<plan::rs_ring>();
  vt_splits<plan::rs_one_shot>();
  vt_splits<plan::rs_two_shot>();
  vt_splits<plan::ag_ring>();
  vt_splits<plan::ag_one_shot>();
}

TEST_SUITE("big") {
  TEST_CASE("p2p loopback: 256 MiB per collective and element width: reduce_scatter, all_gather") {
    REQUIRE_GPU();
    big_256mib<plan::rs_ring>();
    big_256mib<plan::ag_ring>();
  }
}
