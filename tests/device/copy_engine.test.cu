// The copy-engine proxy transport on the GPU: kernels push put / signal requests into mapped work
// queues, a proxy thread per rank issues them as copy-engine copies and stream memory writes, and
// the peer's kernel waits on its flags. Random data, every byte checked; bad requests fail their
// queue with a clear error instead of hanging.
#include "../doctest_main.hpp"

#include <cuda_runtime.h>

#include <chrono>
#include <cstdint>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "reccl/proxy/copy_engine_group.hpp"
#include "support.cuh"

using namespace reccl;
using namespace reccl::proxy;
using handle = reccl::transport::proxy::handle;

namespace {

constexpr std::uint64_t second = 1'000'000'000;

// Block vt of rank `me`: `rounds` puts of odd sizes at odd offsets from my send area for `peer` into
// the peer's receive area, each followed by a signal (ready = round + 1); then wait for the peer's
// last signal to me. One thread per VT queue (a queue has a single producer).
__global__ void exchange(handle h, int peer, int rounds, std::uint64_t wait_ns, std::uint64_t* status_out) {
  int const vt = static_cast<int>(blockIdx.x);
  if (threadIdx.x != 0) return;
  std::uint64_t off = 0;
  for (int k = 0; k < rounds; ++k) {
    std::uint64_t const n = 1000 + 136 * static_cast<std::uint64_t>(k) + static_cast<std::uint64_t>(vt);
    h.put_with_signal(vt, peer, off, h.send_area(vt, peer) + off, n, flag::ready, static_cast<std::uint64_t>(k + 1));
    off += n + 3;  // odd offsets: the copy engine takes any alignment
  }
  wait_result const w = h.wait(vt, peer, flag::ready, static_cast<std::uint64_t>(rounds), reccl::proxy::clock_ns() + wait_ns);
  status_out[vt] = static_cast<std::uint64_t>(w.st);
}

// Inline puts: sizes 1 .. 1024 (odd ones too) from unaligned sources in my send area, each to the
// peer's receive area at a running odd offset, with ready = round + 1.
__host__ __device__ std::uint64_t inline_len(int k, int vt) { return 1 + (137 * static_cast<std::uint64_t>(k) + 29 * vt) % 1024; }
// warp: the first warp of the CTA puts together (put_inline_warp), alternating with thread 0 alone
__global__ void exchange_inline(handle h, int peer, int rounds, bool warp, std::uint64_t wait_ns, std::uint64_t* status_out) {
  int const vt = static_cast<int>(blockIdx.x);
  if (threadIdx.x >= 32 || (!warp && threadIdx.x != 0)) return;
  std::uint64_t off = 0;
  for (int k = 0; k < rounds; ++k) {
    std::uint64_t const n = inline_len(k, vt);
    if (warp && k % 2 == 0) {
      h.put_inline_warp(vt, peer, off, h.send_area(vt, peer) + off + 1, n, flag::ready, static_cast<std::uint64_t>(k + 1));
    } else if (threadIdx.x == 0) {
      h.put_inline(vt, peer, off, h.send_area(vt, peer) + off + 1, n, flag::ready, static_cast<std::uint64_t>(k + 1));
    }
    if (warp) __syncwarp();
    off += n + 3;
  }
  if (threadIdx.x != 0) return;
  wait_result const w = h.wait(vt, peer, flag::ready, static_cast<std::uint64_t>(rounds), reccl::proxy::clock_ns() + wait_ns);
  status_out[vt] = static_cast<std::uint64_t>(w.st);
}

__global__ void bad_put(handle h, int peer, std::uint64_t* status_out) {
  if (threadIdx.x != 0) return;
  // a source outside my window: the handle fails the queue, the wait returns at once
  h.put(0, peer, 0, h.window + h.layout.window_bytes(), 64);
  status_out[0] = static_cast<std::uint64_t>(h.wait(0, peer, flag::ready, 1, reccl::proxy::clock_ns() + 10 * second).st);
}

// Random bytes in both ranks' windows; the host copies are returned.
std::vector<std::vector<unsigned char>> randomize_windows(copy_engine_group const& g, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uint64_t const wb = g.layout().window_bytes();
  std::vector<std::vector<unsigned char>> win(2, std::vector<unsigned char>(wb));
  for (int r = 0; r < 2; ++r) {
    for (auto& b : win[r]) b = static_cast<unsigned char>(rng());
    REQUIRE(cudaSetDevice(g.memory(r).device) == cudaSuccess);
    REQUIRE(cudaMemcpy(g.memory(r).window, win[r].data(), wb, cudaMemcpyHostToDevice) == cudaSuccess);
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  return win;
}

// launch(rank, stream, status words of its VTs) on both ranks, each on its GPU and own stream;
// then every VT's status word must be ok and the group without error.
template <class Launch>
void run_both(copy_engine_group const& g, Launch launch) {
  std::uint64_t* st = nullptr;
  REQUIRE(cudaMallocManaged(&st, sizeof(std::uint64_t) * 2 * max_vts) == cudaSuccess);
  for (int i = 0; i < 2 * max_vts; ++i) st[i] = 99;
  std::vector<cudaStream_t> s(2);
  for (int r = 0; r < 2; ++r) {
    REQUIRE(cudaSetDevice(g.memory(r).device) == cudaSuccess);
    REQUIRE(cudaStreamCreateWithFlags(&s[r], cudaStreamNonBlocking) == cudaSuccess);
    launch(r, s[r], st + max_vts * r);
    REQUIRE(cudaGetLastError() == cudaSuccess);
  }
  for (int r = 0; r < 2; ++r) {
    REQUIRE(cudaSetDevice(g.memory(r).device) == cudaSuccess);
    REQUIRE(cudaStreamSynchronize(s[r]) == cudaSuccess);
    cudaStreamDestroy(s[r]);
  }
  REQUIRE(cudaSetDevice(0) == cudaSuccess);
  std::string const msg = g.error_message();
  CHECK_MESSAGE(g.error() == status::ok, msg);
  for (int r = 0; r < 2; ++r)
    for (int v = 0; v < g.layout().n_vts; ++v) {
      std::uint64_t const vt_status = st[max_vts * r + v];
      if (vt_status == static_cast<std::uint64_t>(status::ok)) continue;
      // A VT waits for its peer's last signal. The peer's queue says which side stopped: a push
      // that timed out leaves its sticky error (the proxy reports none), a proxy that stopped
      // popping leaves tail > head; the flag, read now, says whether the signal landed later.
      work_queue_view const& q = g.queue(1 - r, v);
      std::uint64_t flag_now = 0;
      CHECK(cudaMemcpy(&flag_now, g.memory(r).flags + g.layout().flag_index(v, 1 - r, flag::ready), sizeof flag_now,
                       cudaMemcpyDeviceToHost) == cudaSuccess);
      CHECK_MESSAGE(false, "rank ", r, " VT ", v, ": status ", vt_status, "; its flag from rank ", 1 - r, " now ",
                    flag_now, "; rank ", 1 - r, "'s queue: error ", static_cast<unsigned>(q.error()), ", tail ", q.ctl->tail,
                    " head ", q.ctl->head, " completed ", q.ctl->completed, " stalls ", q.ctl->stalls);
    }
  cudaFree(st);
}

// Bytes that differ between what each rank received and what its peer sent: `R` puts per VT of
// len(k, vt) bytes, read at send-area offset off + src_shift, landed at receive-area offset off,
// off advancing by len + 3.
template <class Len>
long count_wrong(copy_engine_group const& g, std::vector<std::vector<unsigned char>> const& win, int R, Len len, std::uint64_t src_shift) {
  window_layout const& L = g.layout();
  long wrong = 0;
  for (int r = 0; r < 2; ++r) {
    std::vector<unsigned char> got(L.window_bytes());
    REQUIRE(cudaMemcpy(got.data(), g.memory(r).window, L.window_bytes(), cudaMemcpyDeviceToHost) == cudaSuccess);
    int const src = 1 - r;
    for (int v = 0; v < L.n_vts; ++v) {
      std::uint64_t off = 0;
      for (int k = 0; k < R; ++k) {
        std::uint64_t const n = len(k, v);
        unsigned char const* want = win[src].data() + L.send_offset(v, r) + off + src_shift;
        unsigned char const* have = got.data() + L.recv_offset(v, src) + off;
        for (std::uint64_t i = 0; i < n; ++i) wrong += want[i] != have[i];
        off += n + 3;
      }
    }
  }
  return wrong;
}

// 2 ranks x 3 VTs: random data with put + signal from kernels, every byte checked; both ranks on
// GPU 0, or one rank per GPU.
void exchange_random_data(bool two_gpus) {
  copy_engine_config cfg;
  cfg.nranks = 2;
  cfg.n_vts = 3;
  cfg.area_bytes = 64 << 10;
  cfg.push_timeout_ns = gpu_test::test_timeout_ns(1);
  if (two_gpus) cfg.devices = {0, 1};
  copy_engine_group g(cfg);
  int const rounds = 40;  // at most; fewer if the puts (growing sizes, odd offsets) would pass the area
  int fit = 0;
  for (std::uint64_t off = 0;; ++fit) {
    std::uint64_t const n = 1000 + 136 * static_cast<std::uint64_t>(fit) + 2;
    if (off + n > g.layout().area_bytes) break;
    off += n + 3;
  }
  int const R = std::min(rounds, fit);
  REQUIRE(R >= 8);
  auto const win = randomize_windows(g, 7);
  run_both(g, [&](int r, cudaStream_t s, std::uint64_t* st) { exchange<<<cfg.n_vts, 32, 0, s>>>(g.handle(r), 1 - r, R, gpu_test::test_timeout_ns(10), st); });
  // every byte each rank received equals what the peer's send area held
  auto const len = [](int k, int v) { return 1000 + 136 * static_cast<std::uint64_t>(k) + static_cast<std::uint64_t>(v); };
  CHECK(count_wrong(g, win, R, len, 0) == 0);
}

}  // namespace

TEST_CASE("copy engine: 2 ranks x 3 VTs move random data with put + signal from kernels, both ranks on GPU 0") {
  REQUIRE_GPU();
  exchange_random_data(false);
}

TEST_CASE("copy engine: 2 ranks x 3 VTs move random data with put + signal from kernels, one rank per GPU") {
  REQUIRE_GPUS(2);
  exchange_random_data(true);
}

TEST_CASE("copy engine: inline puts from kernels (one thread, or a warp) carry random bytes of any size and alignment through the queue") {
  REQUIRE_GPU();
  copy_engine_config cfg;
  cfg.nranks = 2;
  cfg.n_vts = 3;
  cfg.area_bytes = 256 << 10;
  cfg.queue_capacity = 256;  // 17 records per 1 KiB put: the ring wraps many times
  cfg.push_timeout_ns = gpu_test::test_timeout_ns(1);
  for (bool warp : {false, true}) {
    CAPTURE(warp);
    copy_engine_group g(cfg);
    int const R = 200;  // ~100 KiB per VT and peer, inside the area
    auto const win = randomize_windows(g, 8);
    auto const t0 = std::chrono::steady_clock::now();
    run_both(g, [&](int r, cudaStream_t s, std::uint64_t* st) {
      exchange_inline<<<cfg.n_vts, 64, 0, s>>>(g.handle(r), 1 - r, R, warp, gpu_test::test_timeout_ns(10), st);
    });
    MESSAGE(std::string(warp ? "warp" : "one thread"), ": ", R, " inline puts per VT and rank in ",
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), " s");
    CHECK(count_wrong(g, win, R, inline_len, 1) == 0);  // sources start one byte in: unaligned
  }
}

TEST_CASE("copy engine: a bad request from a kernel fails its queue with a clear error, no hang") {
  REQUIRE_GPU();
  copy_engine_config cfg;
  cfg.nranks = 2;
  cfg.n_vts = 2;
  copy_engine_group g(cfg);
  std::uint64_t* st = nullptr;
  REQUIRE(cudaMallocManaged(&st, sizeof(std::uint64_t)) == cudaSuccess);
  st[0] = 99;
  bad_put<<<1, 32>>>(g.handle(0), 1, st);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  CHECK(st[0] == static_cast<std::uint64_t>(status::invalid_argument));
  cudaFree(st);
  // a malformed request that reaches the backend (pushed from the host past the handle's checks,
  // on the other VT: VT 0's queue already failed)
  work_queue_view const& q = g.queue(0, 1);
  REQUIRE(q.push(make_put(1, 0, g.layout().window_bytes() - 8, 64), reccl::proxy::clock_ns() + second).st == status::ok);
  std::uint64_t const dl = reccl::proxy::clock_ns() + 5 * second;
  while (g.error() == status::ok && reccl::proxy::clock_ns() < dl) std::this_thread::yield();
  CHECK(g.error() == status::invalid_argument);
  MESSAGE("proxy error: " << g.error_message());
  CHECK(g.error_message().find("put") != std::string::npos);
}
