// An engine's view of reccl: its own collective type, composed at compile time from a schedule
// (two-shot), the P2P transport, stall telemetry and the proportional allocator, run on two
// loopback ranks of GPU 0 and checked. Without a GPU it exits 77 (built, not run).
//
// On transport::p2p the split is an Allocator's output passed with the call (every rank computes it
// from the same observations, so every rank gets the same split); here the proportional allocator
// sees VT 2 take twice as long and gives it half the bytes. The closed loop inside the call
// (telemetry -> allocator on the device) is the adaptive lane's for now (docs/device-layer.md).
#include <cuda_bf16.h>

#include <cstdio>
#include <vector>

#include <reccl/host/p2p_collective.hpp>
#include <reccl/policy/allocator/proportional.hpp>
#include <reccl/policy/schedule/two_shot.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>

using all_reduce = reccl::all_reduce<__nv_bfloat16, reccl::schedule::two_shot, reccl::transport::p2p,
                                     reccl::telemetry::stalls, reccl::allocator::proportional>;

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
  long wrong = 0;
  for (int r = 0; r < 2; ++r) {
    RECCL_CUDA_CHECK(cudaStreamSynchronize(stream[r]));
    comms[r].check();
    std::vector<__nv_bfloat16> got(count);
    RECCL_CUDA_CHECK(cudaMemcpy(got.data(), out[r], count * sizeof(__nv_bfloat16), cudaMemcpyDeviceToHost));
    for (std::size_t i = 0; i < count; ++i) {
      float const want = static_cast<float>((i * 7) % 17) - 8.0f + static_cast<float>((i * 7 + 3) % 17) - 8.0f;  // exact in bf16
      wrong += __bfloat162float(got[i]) != want;
    }
  }
  std::printf("two-shot bf16 all-reduce, proportional allocator, 2 loopback ranks: %ld wrong\n", wrong);
  return wrong == 0 ? 0 : 1;
}
