// A tensor-parallel MLP step as an inference engine runs it: on each of the GPUs (tensor-parallel
// degree = GPU count, one process driving all of them),
//
//     H_r = relu(X · W1_r)          X: tokens × hidden (replicated), W1_r: hidden × ffn/tp (column shard)
//     Y_r = H_r · W2_r              W2_r: ffn/tp × hidden (row shard): Y_r is a partial sum
//     Y   = all_reduce(Y_r)         reccl, bf16 sum, on the GEMM's own output buffer (in place)
//
// captured once per GPU in a CUDA graph (cuBLAS GEMMs, the activation kernel and reccl's
// all-reduce) and replayed: the way a decode step is launched. The result is checked against a
// CPU reference, and the replay time is reported next to the same graph with ncclAllReduce.
//
//   tp_mlp_graph [--tokens 16] [--hidden 4096] [--ffn 14336] [--replays 200]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <reccl/host/communicator.hpp>

#include "../common/check.hpp"

namespace {

#define BK(x)                                                                                      \
  do {                                                                                             \
    cublasStatus_t s_ = (x);                                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                             \
      std::fprintf(stderr, "%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, int(s_));       \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

__global__ void relu_bf16(__nv_bfloat16* x, std::size_t n) {
  std::size_t const i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  if (i < n && __bfloat162float(x[i]) < 0.f) x[i] = __float2bfloat16(0.f);
}

float bf(float f) { return __bfloat162float(__float2bfloat16(f)); }

struct rank_state {
  cublasHandle_t blas = nullptr;
  cudaStream_t stream = nullptr;
  void* workspace = nullptr;
  __nv_bfloat16 *x = nullptr, *w1 = nullptr, *w2 = nullptr, *h = nullptr, *y = nullptr;
  cudaGraphExec_t graph[2] = {nullptr, nullptr};  // [0] reccl, [1] NCCL
};

}  // namespace

int main(int argc, char** argv) {
  int tokens = 16, hidden = 4096, ffn = 14336, replays = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string const a = argv[i];
    int const v = std::atoi(argv[i + 1]);
    if (a == "--tokens") tokens = v;
    else if (a == "--hidden") hidden = v;
    else if (a == "--ffn") ffn = v;
    else if (a == "--replays") replays = v;
  }
  int n = 0;
  CK(cudaGetDeviceCount(&n));
  if (n < 2) {
    std::fprintf(stderr, "tp_mlp_graph needs at least 2 GPUs (found %d)\n", n);
    return 2;
  }
  n = std::min(n, 8);
  if (ffn % n != 0) {
    std::fprintf(stderr, "ffn (%d) must divide by the GPU count (%d)\n", ffn, n);
    return 2;
  }
  int const shard = ffn / n;
  std::vector<ncclComm_t> nccl(n);
  std::vector<int> devs(n);
  for (int r = 0; r < n; ++r) devs[r] = r;
  NK(ncclCommInitAll(nccl.data(), n, devs.data()));
  auto comms = reccl::nvlink_communicator::create_all(nccl);

  // weights and activations: small random values so bf16 sums stay accurate
  std::mt19937 g(11);
  std::uniform_real_distribution<float> u(-0.05f, 0.05f);
  std::vector<float> X(std::size_t(tokens) * hidden), W1(std::size_t(hidden) * ffn), W2(std::size_t(ffn) * hidden);
  for (auto& v : X) v = bf(u(g) * 20);
  for (auto& v : W1) v = bf(u(g));
  for (auto& v : W2) v = bf(u(g));
  auto to_bf16 = [](std::vector<float> const& f) {
    std::vector<__nv_bfloat16> b(f.size());
    for (std::size_t i = 0; i < f.size(); ++i) b[i] = __float2bfloat16(f[i]);
    return b;
  };

  std::vector<rank_state> rs(n);
  for (int r = 0; r < n; ++r) {
    auto& s = rs[r];
    CK(cudaSetDevice(r));
    CK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
    BK(cublasCreate(&s.blas));
    BK(cublasSetStream(s.blas, s.stream));
    std::size_t const ws = 32 << 20;  // a fixed workspace: cuBLAS allocates nothing during capture
    CK(cudaMalloc(&s.workspace, ws));
    BK(cublasSetWorkspace(s.blas, s.workspace, ws));
    CK(cudaMalloc(&s.x, X.size() * 2));
    CK(cudaMalloc(&s.w1, std::size_t(hidden) * shard * 2));
    CK(cudaMalloc(&s.w2, std::size_t(shard) * hidden * 2));
    CK(cudaMalloc(&s.h, std::size_t(tokens) * shard * 2));
    CK(cudaMalloc(&s.y, std::size_t(tokens) * hidden * 2));
    // Row-major matrices; W1_r = columns [r*shard, (r+1)*shard) of W1, W2_r = rows of W2.
    std::vector<float> w1r(std::size_t(hidden) * shard), w2r(std::size_t(shard) * hidden);
    for (int k = 0; k < hidden; ++k)
      for (int j = 0; j < shard; ++j) w1r[std::size_t(k) * shard + j] = W1[std::size_t(k) * ffn + r * shard + j];
    std::memcpy(w2r.data(), W2.data() + std::size_t(r) * shard * hidden, w2r.size() * 4);
    auto bx = to_bf16(X), b1 = to_bf16(w1r), b2 = to_bf16(w2r);
    CK(cudaMemcpy(s.x, bx.data(), bx.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.w1, b1.data(), b1.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(s.w2, b2.data(), b2.size() * 2, cudaMemcpyHostToDevice));
  }

  // One step on rank r's stream. Row-major C = A·B is column-major Cᵀ = Bᵀ·Aᵀ.
  auto step = [&](int r, bool use_reccl) {
    auto& s = rs[r];
    float const one = 1.f, zero = 0.f;
    BK(cublasGemmEx(s.blas, CUBLAS_OP_N, CUBLAS_OP_N, shard, tokens, hidden, &one, s.w1, CUDA_R_16BF, shard, s.x,
                    CUDA_R_16BF, hidden, &zero, s.h, CUDA_R_16BF, shard, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    std::size_t const nh = std::size_t(tokens) * shard;
    relu_bf16<<<unsigned((nh + 255) / 256), 256, 0, s.stream>>>(s.h, nh);
    BK(cublasGemmEx(s.blas, CUBLAS_OP_N, CUBLAS_OP_N, hidden, tokens, shard, &one, s.w2, CUDA_R_16BF, hidden, s.h,
                    CUDA_R_16BF, shard, &zero, s.y, CUDA_R_16BF, hidden, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    std::size_t const ny = std::size_t(tokens) * hidden;
    if (use_reccl) comms[r].all_reduce(s.y, s.y, ny, reccl::dtype::bfloat16, reccl::redop::sum, s.stream);
  };

  for (int v = 0; v < 2; ++v) {
    bool const use_reccl = v == 0;
    if (!use_reccl) {  // NCCL: warm its lazy connect outside the capture
      NK(ncclGroupStart());
      for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(r));
        NK(ncclAllReduce(rs[r].y, rs[r].y, std::size_t(tokens) * hidden, ncclBfloat16, ncclSum, nccl[r], rs[r].stream));
      }
      NK(ncclGroupEnd());
      for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(r));
        CK(cudaStreamSynchronize(rs[r].stream));
      }
    }
    std::vector<cudaGraph_t> gr(n);
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaStreamBeginCapture(rs[r].stream, cudaStreamCaptureModeRelaxed));
      step(r, use_reccl);
    }
    if (!use_reccl) {  // NCCL's grouped call spans the streams of every GPU being captured
      NK(ncclGroupStart());
      for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(r));
        NK(ncclAllReduce(rs[r].y, rs[r].y, std::size_t(tokens) * hidden, ncclBfloat16, ncclSum, nccl[r], rs[r].stream));
      }
      NK(ncclGroupEnd());
    }
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaStreamEndCapture(rs[r].stream, &gr[r]));
      CK(cudaGraphInstantiate(&rs[r].graph[v], gr[r], 0));
      CK(cudaGraphDestroy(gr[r]));
    }
  }

  // check one replay of the reccl graph against the CPU reference
  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMemset(rs[r].y, 0xff, std::size_t(tokens) * hidden * 2));
    CK(cudaGraphLaunch(rs[r].graph[0], rs[r].stream));
  }
  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaStreamSynchronize(rs[r].stream));
  }
  for (auto& c : comms) c.check();
  std::vector<float> ref(std::size_t(tokens) * hidden, 0.f);
  for (int r = 0; r < n; ++r) {  // per shard, with the GPU's bf16 roundings of H and of Y_r
    std::vector<float> h(std::size_t(tokens) * shard);
    for (int t = 0; t < tokens; ++t)
      for (int j = 0; j < shard; ++j) {
        double a = 0;
        for (int k = 0; k < hidden; ++k) a += double(X[std::size_t(t) * hidden + k]) * W1[std::size_t(k) * ffn + r * shard + j];
        h[std::size_t(t) * shard + j] = std::max(0.f, bf(float(a)));
      }
    for (int t = 0; t < tokens; ++t)
      for (int o = 0; o < hidden; ++o) {
        double a = 0;
        for (int j = 0; j < shard; ++j) a += double(h[std::size_t(t) * shard + j]) * W2[(std::size_t(r) * shard + j) * hidden + o];
        ref[std::size_t(t) * hidden + o] += bf(float(a));
      }
  }
  double max_err = 0, max_ref = 0;
  bool identical = true;
  std::vector<__nv_bfloat16> y0(ref.size()), yr(ref.size());
  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    CK(cudaMemcpy((r == 0 ? y0 : yr).data(), rs[r].y, ref.size() * 2, cudaMemcpyDeviceToHost));
    if (r > 0) identical = identical && std::memcmp(y0.data(), yr.data(), ref.size() * 2) == 0;
  }
  for (std::size_t i = 0; i < ref.size(); ++i) {
    max_err = std::max(max_err, std::fabs(double(__bfloat162float(y0[i])) - ref[i]));
    max_ref = std::max(max_ref, std::fabs(double(ref[i])));
  }
  // bf16 keeps 8 bits: the GEMMs' accumulation order differs from the reference's, so allow a few ulps
  bool const ok = identical && max_err <= 0.02 * max_ref + 1e-3;

  double us[2] = {0, 0};
  for (int v = 0; v < 2; ++v) {
    std::vector<cudaEvent_t> a(n), b(n);
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaEventCreate(&a[r]));
      CK(cudaEventCreate(&b[r]));
      CK(cudaGraphLaunch(rs[r].graph[v], rs[r].stream));  // warm
      CK(cudaEventRecord(a[r], rs[r].stream));
    }
    for (int i = 0; i < replays; ++i)
      for (int r = 0; r < n; ++r) {
        CK(cudaSetDevice(r));
        CK(cudaGraphLaunch(rs[r].graph[v], rs[r].stream));
      }
    for (int r = 0; r < n; ++r) {
      CK(cudaSetDevice(r));
      CK(cudaEventRecord(b[r], rs[r].stream));
      CK(cudaEventSynchronize(b[r]));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, a[r], b[r]));
      us[v] = std::max(us[v], 1e3 * ms / replays);
    }
  }
  for (auto& c : comms) c.check();
  std::printf("tp_mlp_graph: %d GPUs, tokens %d, hidden %d, ffn %d (shard %d), bf16, one CUDA graph per GPU\n", n,
              tokens, hidden, ffn, shard);
  std::printf("result: %s (ranks bitwise identical: %s, max |err| %.3g of max |y| %.3g)\n", ok ? "correct" : "WRONG",
              identical ? "yes" : "no", max_err, max_ref);
  std::printf("step time per replay: reccl %.2f us, NCCL %.2f us (all-reduce of %d KiB)\n", us[0], us[1],
              tokens * hidden * 2 / 1024);

  for (int r = 0; r < n; ++r) {
    CK(cudaSetDevice(r));
    for (auto& ge : rs[r].graph) CK(cudaGraphExecDestroy(ge));
    BK(cublasDestroy(rs[r].blas));
    for (void* p : {static_cast<void*>(rs[r].x), static_cast<void*>(rs[r].w1), static_cast<void*>(rs[r].w2),
                    static_cast<void*>(rs[r].h), static_cast<void*>(rs[r].y), rs[r].workspace})
      CK(cudaFree(p));
  }
  comms.clear();
  for (auto c : nccl) NK(ncclCommDestroy(c));
  return ok ? 0 : 1;
}
