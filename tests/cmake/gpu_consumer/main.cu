// An engine's view of reccl: its own collective types, composed at compile time, run on two
// loopback ranks of GPU 0 and checked. Without a GPU it exits 77 (built, not run).
//
// 1. two-shot schedule x the P2P transport x stall telemetry x the proportional allocator. On
//    transport::p2p the split is an Allocator's output passed with the call (every rank computes
//    it from the same observations, so every rank gets the same split); here the proportional
//    allocator sees VT 2 take twice as long and gives it half the bytes.
// 2. one-shot x the NVLink fast path x stall telemetry x TeXCP: the loop closed on the device
//    (each VT's waits timed, the split stepped collective by collective; docs/device-layer.md).
#include <cuda_bf16.h>

#include <cstdio>
#include <vector>

#include <reccl/host/nvlink_collective.hpp>
#include <reccl/host/p2p_collective.hpp>
#include <reccl/policy/allocator/proportional.hpp>
#include <reccl/policy/allocator/texcp.hpp>
#include <reccl/policy/schedule/two_shot.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>

using all_reduce = reccl::all_reduce<__nv_bfloat16, reccl::schedule::two_shot, reccl::transport::p2p,
                                     reccl::telemetry::stalls, reccl::allocator::proportional>;
using adaptive_all_reduce = reccl::all_reduce<__nv_bfloat16, reccl::schedule::one_shot, reccl::transport::nvlink,
                                              reccl::telemetry::stalls, reccl::allocator::texcp>;

/// Elements of out[r] (r < 2) that differ from the exact sum of the two ranks' inputs.
long count_wrong(std::vector<__nv_bfloat16*> const& out, std::size_t count) {
  long wrong = 0;
  for (int r = 0; r < 2; ++r) {
    std::vector<__nv_bfloat16> got(count);
    RECCL_CUDA_CHECK(cudaMemcpy(got.data(), out[r], count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < count; ++i) {
      float const want = static_cast<float>((i * 7) % 17) - 8.0f + static_cast<float>((i * 7 + 3) % 17) - 8.0f;  // exact in bf16
      wrong += __bfloat162float(got[i]) != want;
    }
  }
  return wrong;
}

int main() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    std::printf("no GPU: built, not run\n");
    return 77;
  }
  auto comms = reccl::p2p_communicator::create_loopback(2);
  std::size_t const count = 100'003;  // odd: the split and the two-shot halves are uneven
  std::vector<__nv_bfloat16*> in(2), out(2);
  std::vector<cudaStream_t> stream(2);
  for (int r = 0; r < 2; ++r) {
    std::vector<__nv_bfloat16> host(count);
    for (std::size_t i = 0; i < count; ++i) host[i] = __float2bfloat16(static_cast<float>((i * 7 + r * 3) % 17) - 8.0f);
    RECCL_CUDA_CHECK(cudaMalloc(&in[r], count * sizeof(__nv_bfloat16)));
    RECCL_CUDA_CHECK(cudaMalloc(&out[r], count * sizeof(__nv_bfloat16)));
    RECCL_CUDA_CHECK(cudaMemcpy(in[r], host.data(), count * sizeof(__nv_bfloat16), cudaMemcpyHostToDevice));
    RECCL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream[r], cudaStreamNonBlocking));
  }
  RECCL_CUDA_CHECK(cudaDeviceSynchronize());  // the uploads land before the non-blocking streams read
  reccl::vt_observation seen{};
  seen.n_vts = 4;
  seen.live_mask = reccl::all_live(4);
  for (int v = 0; v < 4; ++v) seen.time[v] = v == 2 ? 200 : 100;
  reccl::shares const split = all_reduce::allocator_type{}.update(reccl::equal_shares(4, reccl::all_live(4)), seen);
  reccl::gpu_call_options options;
  options.n_vts = 4;
  options.vt_shares = &split;
  for (int r = 0; r < 2; ++r) all_reduce::run(comms[r], in[r], out[r], count, reccl::redop::sum, stream[r], options);
  for (int r = 0; r < 2; ++r) {
    RECCL_CUDA_CHECK(cudaStreamSynchronize(stream[r]));
    comms[r].check();
  }
  long const wrong = count_wrong(out, count);
  std::printf("two-shot bf16 all-reduce, proportional allocator, 2 loopback ranks: %ld wrong\n", wrong);

  // 2: the same inputs through the adaptive type on the NVLink path's loopback ranks
  auto fast = reccl::nvlink_communicator::create_loopback(2);
  for (auto& c : fast) reccl::setup_lane<adaptive_all_reduce>(c, {.lane = 1, .vts = 4});
  int const calls = 6;
  for (int k = 0; k < calls; ++k) {
    for (int r = 0; r < 2; ++r) RECCL_CUDA_CHECK(cudaMemsetAsync(out[r], 0xff, count * sizeof(__nv_bfloat16), stream[r]));
    for (int r = 0; r < 2; ++r)
      adaptive_all_reduce::run(fast[r], in[r], out[r], count, reccl::redop::sum, stream[r],
                               reccl::nvlink_call_options{.lane = 1});
  }
  for (int r = 0; r < 2; ++r) {
    RECCL_CUDA_CHECK(cudaStreamSynchronize(stream[r]));
    fast[r].check();
  }
  long const wrong_adaptive = count_wrong(out, count);
  auto& loop = reccl::lane_of<adaptive_all_reduce>(fast[0], 1);
  auto const reports = loop.reports(0, loop.epoch());
  std::printf("one-shot bf16 all-reduce, stall telemetry + texcp on the NVLink path: %ld wrong, %zu reports of %d calls\n",
              wrong_adaptive, reports.size(), calls);
  return wrong == 0 && wrong_adaptive == 0 && !reports.empty() ? 0 : 1;
}
