// The composed broadcast and all-to-all on the P2P transport, per schedule, with loopback ranks
// (every rank on GPU 0, tests/device/p2p_world.hpp): every dtype (int32, int64, fp16, bf16, fp32,
// fp64) × every op × 2, 3, 4 ranks × counts 0, 1, 1001, 4099 (pointers off 16-byte alignment by one
// element), 64 KiB and 1 MiB worth. Random inputs; outputs and guard bands poisoned; each output
// bitwise against the CPU engine on the same schedule and against an independent reference.
// One translation unit per collective family keeps each compile short.
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
