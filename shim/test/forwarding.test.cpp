// libreccl_nccl.so in front of a recording stand-in NCCL (mock_nccl.cpp): every call reccl does not
// serve must reach NCCL with exactly its arguments, and the shim must say what it serves. Runs
// without a GPU; each test case is its own process with its own environment (shim/CMakeLists.txt):
//   "off": RECCL_NCCL=0                       -> everything forwarded
//   "on":  RECCL_NCCL_COLLS=all_reduce,all_gather,bogus -> the rest forwarded, a warning for "bogus"
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <nccl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

extern "C" char const* reccl_mock_nccl_calls();
extern "C" void reccl_mock_nccl_clear();

namespace {

// Distinctive arguments: the recorded text must show exactly these.
void* const send = reinterpret_cast<void*>(0x10000);
void* const recv = reinterpret_cast<void*>(0x20000);
auto const comm = reinterpret_cast<ncclComm_t>(0x30000);
auto const stream = reinterpret_cast<cudaStream_t>(0x40000);

std::string calls() { return reccl_mock_nccl_calls(); }

/// Captures what the shim writes to stderr while `f` runs.
template <class F>
std::string stderr_of(F f) {
  std::fflush(stderr);
  char path[] = "/tmp/reccl-shim-stderr-XXXXXX";
  int const fd = mkstemp(path);
  REQUIRE(fd >= 0);
  int const saved = dup(2);
  dup2(fd, 2);
  f();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  std::string out;
  if (FILE* in = std::fopen(path, "r")) {
    char buf[4096];
    std::size_t n;
    while ((n = std::fread(buf, 1, sizeof(buf), in)) > 0) out.append(buf, n);
    std::fclose(in);
  }
  close(fd);
  unlink(path);
  return out;
}

}  // namespace

TEST_CASE("shim off: every collective reaches NCCL unchanged") {
  REQUIRE(std::string(std::getenv("RECCL_NCCL") ? std::getenv("RECCL_NCCL") : "") == "0");
  reccl_mock_nccl_clear();
  std::string const log = stderr_of([] {
    CHECK(ncclAllReduce(send, recv, 1000, ncclFloat32, ncclSum, comm, stream) == ncclSuccess);
  });
  CHECK(log.find("RECCL_NCCL=0: every NCCL call goes to NCCL") != std::string::npos);
  CHECK(ncclReduceScatter(send, recv, 7, ncclBfloat16, ncclMax, comm, stream) == ncclSuccess);
  CHECK(ncclAllGather(send, recv, 9, ncclFloat16, comm, stream) == ncclSuccess);
  CHECK(ncclBroadcast(send, recv, 11, ncclInt32, 1, comm, stream) == ncclSuccess);
  CHECK(ncclBcast(recv, 13, ncclInt64, 0, comm, stream) == ncclSuccess);
  CHECK(ncclAlltoAll(send, recv, 15, ncclFloat64, comm, stream) == ncclSuccess);
  CHECK(ncclGroupStart() == ncclSuccess);
  CHECK(ncclAllReduce(send, recv, 17, ncclFloat32, ncclAvg, comm, stream) == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclSuccess);
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(calls() ==
        "AllReduce(0x10000,0x20000,1000,7,0,0x30000,0x40000)\n"
        "ReduceScatter(0x10000,0x20000,7,9,2,0x30000,0x40000)\n"
        "AllGather(0x10000,0x20000,9,6,0x30000,0x40000)\n"
        "Broadcast(0x10000,0x20000,11,2,1,0x30000,0x40000)\n"
        "Bcast(0x20000,13,4,0,0x30000,0x40000)\n"
        "AlltoAll(0x10000,0x20000,15,8,0x30000,0x40000)\n"
        "GroupStart\n"
        "AllReduce(0x10000,0x20000,17,7,4,0x30000,0x40000)\n"
        "GroupEnd\n"
        "CommDestroy(0x30000)\n");
}

TEST_CASE("shim on: the calls reccl does not serve reach NCCL unchanged, and the init line says what it serves") {
  reccl_mock_nccl_clear();
  std::string const log = stderr_of([] {
    // not in RECCL_NCCL_COLLS
    CHECK(ncclReduceScatter(send, recv, 7, ncclFloat32, ncclSum, comm, stream) == ncclSuccess);
  });
  CHECK(log.find("serves all_reduce, all_gather (allocator equal") != std::string::npos);
  CHECK(log.find("unknown collective 'bogus'") != std::string::npos);
  CHECK(ncclBroadcast(send, recv, 11, ncclInt32, 1, comm, stream) == ncclSuccess);
  CHECK(ncclAlltoAll(send, recv, 15, ncclFloat64, comm, stream) == ncclSuccess);
  // served collectives, but dtype/op pairs reccl does not compute exactly as NCCL
  CHECK(ncclAllReduce(send, recv, 5, ncclInt8, ncclSum, comm, stream) == ncclSuccess);
  CHECK(ncclAllReduce(send, recv, 5, ncclUint32, ncclMax, comm, stream) == ncclSuccess);
  CHECK(ncclAllReduce(send, recv, 5, ncclUint64, ncclAvg, comm, stream) == ncclSuccess);
  CHECK(ncclAllReduce(send, recv, 5, ncclFloat32, static_cast<ncclRedOp_t>(ncclNumOps), comm, stream) == ncclSuccess);
  // an odd byte count cannot be expressed in 2-byte words
  CHECK(ncclAllGather(send, recv, 3, ncclInt8, comm, stream) == ncclSuccess);
  // inside a group: forwarded in place, between the real group calls
  CHECK(ncclGroupStart() == ncclSuccess);
  CHECK(ncclAllReduce(send, recv, 9, ncclUint8, ncclMin, comm, stream) == ncclSuccess);
  CHECK(ncclGroupEnd() == ncclSuccess);
  CHECK(calls() ==
        "ReduceScatter(0x10000,0x20000,7,7,0,0x30000,0x40000)\n"
        "Broadcast(0x10000,0x20000,11,2,1,0x30000,0x40000)\n"
        "AlltoAll(0x10000,0x20000,15,8,0x30000,0x40000)\n"
        "AllReduce(0x10000,0x20000,5,0,0,0x30000,0x40000)\n"
        "AllReduce(0x10000,0x20000,5,3,2,0x30000,0x40000)\n"
        "AllReduce(0x10000,0x20000,5,5,4,0x30000,0x40000)\n"
        "AllReduce(0x10000,0x20000,5,7,5,0x30000,0x40000)\n"
        "AllGather(0x10000,0x20000,3,0,0x30000,0x40000)\n"
        "GroupStart\n"
        "AllReduce(0x10000,0x20000,9,1,3,0x30000,0x40000)\n"
        "GroupEnd\n");

  // A call reccl could serve: this stand-in NCCL has no GPU memory to give, so the shim either
  // finds no usable stream (no GPU here) or fails to build its state (and says so); either way
  // the call reaches NCCL unchanged and the communicator stays with NCCL.
  reccl_mock_nccl_clear();
  CHECK(ncclAllReduce(send, recv, 1024, ncclFloat32, ncclSum, comm, stream) == ncclSuccess);
  CHECK(ncclAllGather(send, recv, 1024, ncclBfloat16, comm, stream) == ncclSuccess);
  CHECK(calls() ==
        "AllReduce(0x10000,0x20000,1024,7,0,0x30000,0x40000)\n"
        "AllGather(0x10000,0x20000,1024,9,0x30000,0x40000)\n");

  // symbols the shim does not define go to NCCL directly
  int v = 0;
  CHECK(ncclGetVersion(&v) == ncclSuccess);
  CHECK(v == NCCL_VERSION_CODE);
  reccl_mock_nccl_clear();
  CHECK(ncclCommDestroy(comm) == ncclSuccess);
  CHECK(calls() == "CommDestroy(0x30000)\n");
}
