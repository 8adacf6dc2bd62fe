// control_step -- what the device-side control step costs a collective: one thread runs
// control<A>::step on every rank's epoch record and turns the new shares into a split, as the
// adaptive kernels do once per collective. Times 2,000 dependent steps with CUDA events and prints
// nanoseconds per step, per allocator and VT count (JSON with --json FILE).
//
//   control_step [--json out.json]
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>

#include <reccl/policy/allocator/aimd.hpp>
#include <reccl/policy/allocator/equal.hpp>
#include <reccl/policy/allocator/texcp.hpp>
#include <reccl/policy/control.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      std::fprintf(stderr, "%s: %s\n", #x, cudaGetErrorString(e_));                   \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

namespace {

/// `steps` control steps in a row on `nranks` records whose stall counts depend on the previous
/// split (so no step can be hoisted or folded); the final split goes to `out`.
template <class A>
__global__ void step_kernel(int n_vts, int nranks, int steps, std::uint64_t count, reccl::split* out,
                            unsigned long long* cycles) {
  using namespace reccl;
  auto ctl = control<A>::start(n_vts);
  epoch_record recs[8];
  split sp = ctl.split_for(count, 8);
  long long const c0 = clock64();
  for (int k = 0; k < steps; ++k) {
    for (int r = 0; r < nranks; ++r) {
      telemetry::stalls tel{};
      for (int v = 0; v < n_vts; ++v) {
        tel.add_bytes(v, sp.count[v] * 2);
        tel.add_stalls(v, (v == 3 ? 4000u : 100u) + ((sp.count[v] >> 4) & 63u) + static_cast<unsigned>(r));
      }
      recs[r] = ctl.record(r, tel, 0, 0);
    }
    ctl.step(recs, nranks, nullptr);
    sp = ctl.split_for(count, 8);
  }
  *cycles = static_cast<unsigned long long>(clock64() - c0);
  *out = sp;
}

template <class A>
double time_steps(char const* name, int n_vts, int nranks, std::string& json) {
  reccl::split* d_sp = nullptr;
  unsigned long long* d_cyc = nullptr;
  CK(cudaMalloc(&d_sp, sizeof(reccl::split)));
  CK(cudaMalloc(&d_cyc, sizeof(unsigned long long)));
  int const steps = 2000;
  std::uint64_t const count = 64ull << 20;
  step_kernel<A><<<1, 1>>>(n_vts, nranks, 10, count, d_sp, d_cyc);  // warm-up (module load)
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  step_kernel<A><<<1, 1>>>(n_vts, nranks, steps, count, d_sp, d_cyc);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  unsigned long long cyc = 0;
  CK(cudaMemcpy(&cyc, d_cyc, sizeof(cyc), cudaMemcpyDeviceToHost));
  reccl::split sp{};
  CK(cudaMemcpy(&sp, d_sp, sizeof(sp), cudaMemcpyDeviceToHost));
  double const ns = ms * 1e6 / steps;
  std::printf("%-8s vts=%2d ranks=%d  %8.0f ns/step  %8.0f cycles/step  (VT 3 share after %d steps: %.4f)\n", name,
              n_vts, nranks, ns, static_cast<double>(cyc) / steps, steps,
              static_cast<double>(sp.count[3]) / static_cast<double>(sp.total));
  char buf[256];
  std::snprintf(buf, sizeof buf, "%s{\"allocator\":\"%s\",\"vts\":%d,\"ranks\":%d,\"ns_per_step\":%.1f,\"cycles_per_step\":%.0f}",
                json.empty() ? "" : ",", name, n_vts, nranks, ns, static_cast<double>(cyc) / steps);
  json += buf;
  CK(cudaFree(d_sp));
  CK(cudaFree(d_cyc));
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0) out = argv[i + 1];
  std::string rows;
  for (int ranks : {2, 8})
    for (int v : {8, 16}) {
      time_steps<reccl::allocator::texcp>("texcp", v, ranks, rows);
      time_steps<reccl::allocator::aimd>("aimd", v, ranks, rows);
      time_steps<reccl::allocator::equal>("equal", v, ranks, rows);
    }
  if (!out.empty()) {
    FILE* f = std::fopen(out.c_str(), "w");
    if (f == nullptr) return 1;
    std::fprintf(f, "{\"bench\":\"control_step\",\"rows\":[%s]}\n", rows.c_str());
    std::fclose(f);
  }
  return 0;
}
