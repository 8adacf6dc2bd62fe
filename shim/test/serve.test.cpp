// libreccl_nccl.so on real GPUs, used exactly as an application uses NCCL: one thread, every GPU
// of the machine in one ncclCommInitAll, grouped calls, random data (small nonzero integers, so
// every dtype represents every input, partial sum and product exactly and the results can be
// compared bit for bit against a host reference), outputs poisoned before each call. Checks that
// reccl served what it claims to serve (reccl_nccl.h) and that NCCL computed the rest.
// Labelled gpu; on one GPU the communicator has one rank, without one every case is skipped.
#include "../../tests/doctest_main.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <reccl_shim/reccl_nccl.h>

namespace {

#define CUDA_OK(x) REQUIRE((x) == cudaSuccess)
#define NCCL_OK(x) REQUIRE((x) == ncclSuccess)
/// Teardown in destructors (the_world()'s runs after the last test case, where REQUIRE cannot
/// report): a failed call is printed, and the process's exit status is left to the test cases.
#define CUDA_TEARDOWN(x) \
  ((x) == cudaSuccess ? void() : void(std::fprintf(stderr, "serve.test: teardown: %s failed\n", #x)))
#define NCCL_TEARDOWN(x) \
  ((x) == ncclSuccess ? void() : void(std::fprintf(stderr, "serve.test: teardown: %s failed\n", #x)))

std::size_t type_size(ncclDataType_t t) {
  switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    default: return 8;
  }
}
bool is_float(ncclDataType_t t) {
  return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64;
}
bool is_signed(ncclDataType_t t) { return t == ncclInt8 || t == ncclInt32 || t == ncclInt64 || is_float(t); }

/// Bits of the (exactly representable) value v in dtype t.
std::uint64_t encode(double v, ncclDataType_t t) {
  switch (t) {
    case ncclFloat32: { float f = static_cast<float>(v); std::uint32_t b; std::memcpy(&b, &f, 4); return b; }
    case ncclFloat64: { std::uint64_t b; std::memcpy(&b, &v, 8); return b; }
    case ncclBfloat16: { float f = static_cast<float>(v); std::uint32_t b; std::memcpy(&b, &f, 4); return b >> 16; }
    case ncclFloat16: {
      if (v == 0) return std::signbit(v) ? 0x8000u : 0u;
      int e = 0;
      double const m = std::frexp(std::fabs(v), &e);  // v = m * 2^e, m in [0.5, 1)
      std::uint64_t const mant = static_cast<std::uint64_t>(std::ldexp(m, 11)) & 0x3ffu;
      return (v < 0 ? 0x8000u : 0u) | (static_cast<std::uint64_t>(e - 1 + 15) << 10) | mant;
    }
    default: return static_cast<std::uint64_t>(static_cast<std::int64_t>(v)) & (type_size(t) == 8 ? ~0ull : (1ull << (8 * type_size(t))) - 1);
  }
}

struct world {
  int n = 0;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;
  world() {
    CUDA_OK(cudaGetDeviceCount(&n));
    if (n > 8) n = 8;
    std::vector<int> devs(n);
    for (int i = 0; i < n; ++i) devs[i] = i;
    comms.resize(n);
    NCCL_OK(ncclCommInitAll(comms.data(), n, devs.data()));
    streams.resize(n);
    for (int i = 0; i < n; ++i) {
      CUDA_OK(cudaSetDevice(i));
      CUDA_OK(cudaStreamCreateWithFlags(&streams[i], cudaStreamNonBlocking));
    }
  }
  ~world() {
    for (int i = 0; i < n; ++i) {
      CUDA_TEARDOWN(cudaSetDevice(i));
      CUDA_TEARDOWN(cudaStreamSynchronize(streams[i]));
      NCCL_TEARDOWN(ncclCommDestroy(comms[i]));
      CUDA_TEARDOWN(cudaStreamDestroy(streams[i]));
    }
  }
  void sync() {
    for (int i = 0; i < n; ++i) {
      CUDA_OK(cudaSetDevice(i));
      CUDA_OK(cudaStreamSynchronize(streams[i]));
      ncclResult_t e = ncclSuccess;
      NCCL_OK(ncclCommGetAsyncError(comms[i], &e));
      REQUIRE(e == ncclSuccess);
    }
  }
};

world& the_world() {
  static world w;
  return w;
}

/// Ends the case as skipped (SKIP_CASE) without a GPU.
#define REQUIRE_GPU()                                                                 \
  do {                                                                                \
    int gpus_ = 0;                                                                    \
    if (cudaGetDeviceCount(&gpus_) != cudaSuccess || gpus_ == 0) SKIP_CASE("no GPU"); \
  } while (0)

enum class coll { all_reduce, reduce_scatter, all_gather, broadcast, all_to_all };

struct device_buffers {
  std::vector<void*> in, out;
  std::size_t in_bytes = 0, out_bytes = 0;
  device_buffers(int n, std::size_t ib, std::size_t ob) : in(n), out(n), in_bytes(ib), out_bytes(ob) {
    for (int i = 0; i < n; ++i) {
      CUDA_OK(cudaSetDevice(i));
      CUDA_OK(cudaMalloc(&in[i], ib + 16));
      CUDA_OK(cudaMalloc(&out[i], ob + 16));
    }
  }
  ~device_buffers() {
    for (std::size_t i = 0; i < in.size(); ++i) {
      CUDA_TEARDOWN(cudaSetDevice(static_cast<int>(i)));
      CUDA_TEARDOWN(cudaFree(in[i]));
      CUDA_TEARDOWN(cudaFree(out[i]));
    }
  }
};

std::vector<unsigned char> pack(std::vector<double> const& v, ncclDataType_t t) {
  std::size_t const es = type_size(t);
  std::vector<unsigned char> b(v.size() * es);
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint64_t const bits = encode(v[i], t);
    std::memcpy(b.data() + i * es, &bits, es);  // little endian
  }
  return b;
}

double combine(double a, double b, ncclRedOp_t op) {
  switch (op) {
    case ncclProd: return a * b;
    case ncclMin: return a < b ? a : b;
    case ncclMax: return a > b ? a : b;
    default: return a + b;
  }
}
double finish(double s, ncclRedOp_t op, int n, ncclDataType_t t) {
  if (op != ncclAvg) return s;
  return is_float(t) ? s / n : std::trunc(s / n);
}

/// One collective on every rank (grouped), against the host reference. `count` is NCCL's count
/// argument; in_place uses NCCL's in-place layout. Returns how many ranks reccl served it on.
int run_case(coll c, ncclDataType_t t, ncclRedOp_t op, std::size_t count, bool in_place, int root, std::mt19937& rng) {
  world& w = the_world();
  int const n = w.n;
  std::size_t const es = type_size(t);
  std::size_t const in_elems = c == coll::reduce_scatter || c == coll::all_to_all ? count * n : count;
  std::size_t const out_elems = c == coll::all_gather || c == coll::all_to_all ? count * n : count;
  // outputs large enough for every in-place layout (reduce-scatter in place holds n * count)
  device_buffers b(n, in_elems * es, (in_elems > out_elems ? in_elems : out_elems) * es);
  // inputs: nonzero small integers (products stay in {..., -2, -1, 1, 2, ...})
  std::uniform_int_distribution<int> small(-4, 4), unit(0, 3);
  std::vector<std::vector<double>> in(n, std::vector<double>(in_elems));
  for (auto& r : in)
    for (auto& x : r) {
      int v = op == ncclProd ? (unit(rng) < 2 ? 1 : 2) * (unit(rng) % 2 ? -1 : 1) : small(rng);
      if (v == 0) v = 3;
      if (!is_signed(t)) v = v < 0 ? -v : v;
      x = v;
    }
  // expected outputs
  std::vector<std::vector<double>> ref(n, std::vector<double>(out_elems));
  for (int r = 0; r < n; ++r)
    for (std::size_t i = 0; i < out_elems; ++i) {
      switch (c) {
        case coll::all_reduce:
        case coll::reduce_scatter: {
          std::size_t const j = c == coll::all_reduce ? i : r * count + i;
          double s = in[0][j];
          for (int q = 1; q < n; ++q) s = combine(s, in[q][j], op);
          ref[r][i] = finish(s, op, n, t);
          break;
        }
        case coll::all_gather: ref[r][i] = in[i / count][i % count]; break;
        case coll::broadcast: ref[r][i] = in[root][i]; break;
        case coll::all_to_all: ref[r][i] = in[i / count][r * count + i % count]; break;
      }
    }
  // NCCL's layouts: in place, all-reduce and broadcast use one buffer, reduce-scatter's output is
  // rank r's slice of its input, all-gather's input is rank r's slice of its output. Outputs are
  // poisoned, then the input is written where the layout puts it.
  std::vector<void const*> send(n);
  std::vector<void*> recv(n);
  for (int r = 0; r < n; ++r) {
    CUDA_OK(cudaSetDevice(r));
    CUDA_OK(cudaMemset(b.out[r], 0xA5, b.out_bytes + 16));
    char* const o = static_cast<char*>(b.out[r]);
    char* const slice = o + r * count * es;
    void* src = b.in[r];
    recv[r] = o;
    if (in_place) {
      switch (c) {
        case coll::all_reduce: case coll::broadcast: case coll::all_to_all: src = o; break;
        case coll::reduce_scatter: src = o; recv[r] = slice; break;
        case coll::all_gather: src = slice; break;
      }
    }
    send[r] = src;
    std::vector<unsigned char> const bytes = pack(in[r], t);
    if (!bytes.empty()) CUDA_OK(cudaMemcpy(src, bytes.data(), bytes.size(), cudaMemcpyHostToDevice));
    // the memset and the copy ran on the legacy stream, which does not order the non-blocking
    // streams the collective runs on
    CUDA_OK(cudaDeviceSynchronize());
  }
  std::vector<unsigned long long> before(n);
  for (int r = 0; r < n; ++r) before[r] = reccl_nccl_served_calls(w.comms[r]);
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r) {
    switch (c) {
      case coll::all_reduce: NCCL_OK(ncclAllReduce(send[r], recv[r], count, t, op, w.comms[r], w.streams[r])); break;
      case coll::reduce_scatter: NCCL_OK(ncclReduceScatter(send[r], recv[r], count, t, op, w.comms[r], w.streams[r])); break;
      case coll::all_gather: NCCL_OK(ncclAllGather(send[r], recv[r], count, t, w.comms[r], w.streams[r])); break;
      case coll::broadcast:
        if (in_place) NCCL_OK(ncclBcast(recv[r], count, t, root, w.comms[r], w.streams[r]));
        else NCCL_OK(ncclBroadcast(send[r], recv[r], count, t, root, w.comms[r], w.streams[r]));
        break;
      case coll::all_to_all: NCCL_OK(ncclAlltoAll(send[r], recv[r], count, t, w.comms[r], w.streams[r])); break;
    }
  }
  NCCL_OK(ncclGroupEnd());
  w.sync();
  int served = 0;
  for (int r = 0; r < n; ++r) served += reccl_nccl_served_calls(w.comms[r]) > before[r] ? 1 : 0;
  // compare bit for bit
  for (int r = 0; r < n; ++r) {
    std::vector<unsigned char> got(out_elems * es);
    CUDA_OK(cudaSetDevice(r));
    if (!got.empty()) CUDA_OK(cudaMemcpy(got.data(), recv[r], got.size(), cudaMemcpyDeviceToHost));
    std::vector<unsigned char> const want = pack(ref[r], t);
    std::size_t bad = 0, first = 0;
    for (std::size_t i = 0; i < out_elems; ++i)
      if (std::memcmp(got.data() + i * es, want.data() + i * es, es) != 0 && bad++ == 0) first = i;
    INFO("collective ", int(c), " dtype ", int(t), " op ", int(op), " count ", count, " in_place ", in_place, " root ",
         root, " rank ", r, " of ", n, ": first wrong element ", first);
    CHECK(bad == 0);
  }
  return served;
}

}  // namespace

TEST_CASE("shim serves every collective reccl claims, bit-exact, and NCCL the rest") {
  REQUIRE_GPU();
  world& w = the_world();
  MESSAGE("ranks: ", w.n);
  std::mt19937 rng(20261201);
  std::size_t const counts[] = {0, 1, 3, 1000, 4099, 65541, (1u << 20) + 7};
  ncclDataType_t const reduce_types[] = {ncclFloat32, ncclFloat16, ncclBfloat16, ncclInt32, ncclInt64, ncclFloat64};
  ncclRedOp_t const ops[] = {ncclSum, ncclProd, ncclMin, ncclMax, ncclAvg};
  for (coll c : {coll::all_reduce, coll::reduce_scatter})
    for (ncclDataType_t t : reduce_types)
      for (ncclRedOp_t op : ops)
        for (std::size_t n : counts)
          for (bool ip : {false, true}) {
            int const served = run_case(c, t, op, n, ip, 0, rng);
            CHECK(served == w.n);  // every rank, every dtype/op pair listed above
          }
  // copying collectives: any dtype; an odd byte count goes to NCCL
  for (coll c : {coll::all_gather, coll::broadcast, coll::all_to_all})
    for (ncclDataType_t t : {ncclFloat32, ncclBfloat16, ncclInt8})
      for (std::size_t n : counts)
        for (bool ip : {false, true}) {
          if (c == coll::all_to_all && ip) continue;  // NCCL's in-place all-to-all: forwarded, not checked here
          for (int root : {0, w.n - 1}) {
            if (c != coll::broadcast && root != 0) continue;
            int const served = run_case(c, t, ncclSum, n, ip, root, rng);
            bool const odd = t == ncclInt8 && n % 2 == 1;
            CHECK(served == (odd ? 0 : w.n));
          }
        }
}

TEST_CASE("shim forwards what reccl does not compute exactly as NCCL, and NCCL's results are right") {
  REQUIRE_GPU();
  std::mt19937 rng(7);
  CHECK(run_case(coll::all_reduce, ncclInt8, ncclSum, 4099, false, 0, rng) == 0);
  CHECK(run_case(coll::all_reduce, ncclUint32, ncclMax, 4099, false, 0, rng) == 0);
  CHECK(run_case(coll::all_reduce, ncclUint32, ncclSum, 4099, false, 0, rng) == the_world().n);  // served as int32
  CHECK(run_case(coll::reduce_scatter, ncclUint8, ncclMin, 1000, true, 0, rng) == 0);
}

TEST_CASE("shim: a served all-reduce captured in a CUDA graph replays correctly") {
  REQUIRE_GPU();
  world& w = the_world();
  int const n = w.n;
  std::size_t const count = (1u << 18) + 3;
  device_buffers b(n, count * 4, count * 4);
  std::vector<cudaGraph_t> g(n);
  std::vector<cudaGraphExec_t> ge(n);
  // first call eager (the shim builds its state outside capture), then capture
  for (int r = 0; r < n; ++r) {
    CUDA_OK(cudaSetDevice(r));
    CUDA_OK(cudaMemset(b.in[r], 0, count * 4));
    CUDA_OK(cudaDeviceSynchronize());
  }
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r) NCCL_OK(ncclAllReduce(b.in[r], b.out[r], count, ncclFloat32, ncclSum, w.comms[r], w.streams[r]));
  NCCL_OK(ncclGroupEnd());
  w.sync();
  std::vector<unsigned long long> before(n);
  for (int r = 0; r < n; ++r) before[r] = reccl_nccl_served_calls(w.comms[r]);
  for (int r = 0; r < n; ++r) CUDA_OK(cudaStreamBeginCapture(w.streams[r], cudaStreamCaptureModeThreadLocal));
  NCCL_OK(ncclGroupStart());
  for (int r = 0; r < n; ++r) NCCL_OK(ncclAllReduce(b.in[r], b.out[r], count, ncclFloat32, ncclSum, w.comms[r], w.streams[r]));
  NCCL_OK(ncclGroupEnd());
  for (int r = 0; r < n; ++r) {
    CUDA_OK(cudaStreamEndCapture(w.streams[r], &g[r]));
    CUDA_OK(cudaGraphInstantiate(&ge[r], g[r], nullptr, nullptr, 0));
    CHECK(reccl_nccl_served_calls(w.comms[r]) == before[r] + 1);  // the captured call is reccl's kernel
  }
  for (int rep = 1; rep <= 5; ++rep) {
    std::vector<float> h(count);
    for (int r = 0; r < n; ++r) {
      for (std::size_t i = 0; i < count; ++i) h[i] = static_cast<float>((i * 7 + r * 3 + rep) % 11 + 1);
      CUDA_OK(cudaSetDevice(r));
      CUDA_OK(cudaMemset(b.out[r], 0xA5, count * 4));
      CUDA_OK(cudaMemcpy(b.in[r], h.data(), count * 4, cudaMemcpyHostToDevice));
      CUDA_OK(cudaDeviceSynchronize());  // before the replay on a non-blocking stream
    }
    for (int r = 0; r < n; ++r) {
      CUDA_OK(cudaSetDevice(r));
      CUDA_OK(cudaGraphLaunch(ge[r], w.streams[r]));
    }
    w.sync();
    for (int r = 0; r < n; ++r) {
      CUDA_OK(cudaSetDevice(r));
      CUDA_OK(cudaMemcpy(h.data(), b.out[r], count * 4, cudaMemcpyDeviceToHost));
      std::size_t bad = 0;
      for (std::size_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < n; ++q) want += static_cast<float>((i * 7 + q * 3 + rep) % 11 + 1);
        bad += h[i] != want;
      }
      INFO("replay ", rep, " rank ", r);
      CHECK(bad == 0);
    }
  }
  for (int r = 0; r < n; ++r) {
    CUDA_OK(cudaGraphExecDestroy(ge[r]));
    CUDA_OK(cudaGraphDestroy(g[r]));
    CHECK(reccl_nccl_comm_state(w.comms[r]) == 1);
  }
}
