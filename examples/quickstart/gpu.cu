// reccl's NVLink path: one process drives every GPU (2 to 8 GPUs of one node with CUDA P2P, or two
// loopback ranks on a single GPU); an all-reduce on plain cudaMalloc buffers, checked.
#include <reccl/host/communicator.hpp>  // needs nvcc and NCCL >= 2.28.3
#include <cstdio>
#include <vector>

int main() {
  int gpus = 0;
  RECCL_CUDA_CHECK(cudaGetDeviceCount(&gpus));
  std::vector<ncclComm_t> nccl(gpus > 1 ? gpus : 0);
  if (gpus > 1) RECCL_NCCL_CHECK(nullptr, ncclCommInitAll(nccl.data(), gpus, nullptr));  // rank r on GPU r
  auto comms = gpus > 1 ? reccl::nvlink_communicator::create_all(nccl)    // collective over the ranks
                        : reccl::nvlink_communicator::create_loopback(2);  // two ranks on GPU 0, no NVLink
  int const n = static_cast<int>(comms.size());
  std::size_t const count = 1 << 20, bytes = count * sizeof(float);  // elements per rank, in and out
  std::vector<float*> in(n), out(n);
  std::vector<cudaStream_t> stream(n);
  std::vector<float> host(count);
  for (int r = 0; r < n; ++r) {
    host.assign(count, float(r + 1));
    RECCL_CUDA_CHECK(cudaSetDevice(comms[r].device()));
    RECCL_CUDA_CHECK(cudaMalloc(&in[r], 2 * bytes));  // any device memory; out[r] is its second half
    out[r] = in[r] + count;
    RECCL_CUDA_CHECK(cudaMemcpy(in[r], host.data(), bytes, cudaMemcpyHostToDevice));
    RECCL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream[r], cudaStreamNonBlocking));
  }
  for (int r = 0; r < n; ++r)  // stream-ordered, and CUDA-graph capturable
    comms[r].all_reduce(in[r], out[r], count, reccl::dtype::float32, reccl::redop::sum, stream[r]);
  bool good = true;
  for (int r = 0; r < n; ++r) {
    RECCL_CUDA_CHECK(cudaSetDevice(comms[r].device()));
    RECCL_CUDA_CHECK(cudaStreamSynchronize(stream[r]));
    comms[r].check();  // throws reccl::error if a device-side wait failed (a timeout, ranks that disagree)
    RECCL_CUDA_CHECK(cudaMemcpy(host.data(), out[r], bytes, cudaMemcpyDeviceToHost));
    for (float x : host) good = good && x == float(n * (n + 1) / 2);
  }
  comms.clear();  // reccl's communicators go before the NCCL communicators they were built on
  for (ncclComm_t c : nccl) RECCL_NCCL_CHECK(c, ncclCommDestroy(c));
  std::printf("%d ranks: %s\n", n, good ? "all results correct" : "WRONG RESULT");
  return good ? 0 : 1;
}
