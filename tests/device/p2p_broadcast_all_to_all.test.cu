// The composed broadcast and all-to-all on the P2P transport, per schedule, with loopback ranks
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

TEST_CASE("p2p loopback correctness: broadcast/ring") { REQUIRE_GPU(); correctness<plan::bc_ring>(); }
TEST_CASE("p2p loopback correctness: broadcast/tree") { REQUIRE_GPU(); correctness<plan::bc_tree>(); }
TEST_CASE("p2p loopback correctness: broadcast/one_shot") { REQUIRE_GPU(); correctness<plan::bc_one_shot>(); }
TEST_CASE("p2p loopback correctness: broadcast/multirail") { REQUIRE_GPU(); correctness<plan::bc_multirail>(); }
TEST_CASE("p2p loopback correctness: all_to_all/direct") { REQUIRE_GPU(); correctness<plan::a2a_direct>(); }
TEST_CASE("p2p loopback correctness: all_to_all/one_shot") { REQUIRE_GPU(); correctness<plan::a2a_one_shot>(); }

TEST_CASE("p2p loopback: VT splits give identical bits: broadcast, all_to_all") {
  REQUIRE_GPU();
  vt_splits<plan::bc_ring>();
  vt_splits<plan::bc_tree>();
  vt_splits<plan::bc_one_shot>();
  vt_splits<plan::bc_multirail>();
  vt_splits<plan::a2a_direct>();
  vt_splits<plan::a2a_one_shot>();
}

TEST_SUITE("big") {
  TEST_CASE("p2p loopback: 16 MiB per schedule: multirail_broadcast, all_to_all") {
    REQUIRE_GPU();
    big_16mib<plan::bc_multirail>();
    big_16mib<plan::a2a_direct>();
  }
  TEST_CASE("p2p loopback: 256 MiB per collective and element width: broadcast, all_to_all") {
    REQUIRE_GPU();
    big_256mib<plan::bc_ring>();
    big_256mib<plan::a2a_one_shot>();
  }
}
