// The composed all-reduce on the P2P transport, per schedule, with loopback ranks
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

TEST_CASE("p2p loopback correctness: all_reduce/ring") { REQUIRE_GPU(); correctness<plan::ar_ring>(); }
TEST_CASE("p2p loopback correctness: all_reduce/tree") { REQUIRE_GPU(); correctness<plan::ar_tree>(); }
TEST_CASE("p2p loopback correctness: all_reduce/one_shot") { REQUIRE_GPU(); correctness<plan::ar_one_shot>(); }
TEST_CASE("p2p loopback correctness: all_reduce/two_shot") { REQUIRE_GPU(); correctness<plan::ar_two_shot>(); }

TEST_CASE("p2p loopback: VT splits give identical bits: all_reduce") {
  REQUIRE_GPU();
  vt_splits<plan::ar_ring>();
  vt_splits<plan::ar_tree>();
  vt_splits<plan::ar_one_shot>();
  vt_splits<plan::ar_two_shot>();
}

TEST_SUITE("big") {
  TEST_CASE("p2p loopback: 16 MiB per schedule: ring, tree, one_shot, two_shot") {
    REQUIRE_GPU();
    big_16mib<plan::ar_ring>();
    big_16mib<plan::ar_tree>();
    big_16mib<plan::ar_one_shot>();
    big_16mib<plan::ar_two_shot>();
  }
  TEST_CASE("p2p loopback: 256 MiB per collective and element width: all_reduce") {
    REQUIRE_GPU();
    big_256mib<plan::ar_ring>();
  }
}
