// control_step -- what the device-side control step costs a collective: one thread (serial_exec)
// or one warp (device::warp_exec, as the adaptive kernels run it) runs control<A>::step on every
// rank's epoch record and turns the new shares into a split, as the adaptive kernels do once per
// collective. Times 2,000 dependent steps with CUDA events and prints nanoseconds per step, per
// allocator, VT count and executor (JSON with --json FILE).
//
//   control_step [--parts] [--json out.json]      --parts: the texcp step's parts one at a time
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <type_traits>

#include <reccl/device/warp_policy.hpp>
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

/// The step's executor: one thread, or the whole warp (the kernel is then launched with 32 threads).
template <bool warp>
using exec_t = std::conditional_t<warp, reccl::device::warp_exec, reccl::serial_exec>;

/// `steps` control steps in a row on `nranks` records whose stall counts depend on the previous
/// split (so no step can be hoisted or folded); the final split goes to `out`.
template <class A, bool warp>
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
    ctl.step(recs, nranks, nullptr, exec_t<warp>{});
    sp = ctl.split_for(count, 8);
  }
  if (threadIdx.x != 0) return;
  *cycles = static_cast<unsigned long long>(clock64() - c0);
  *out = sp;
}

/// The step's parts one at a time (--parts): each kernel runs `steps` iterations of one piece on one
/// thread, its input perturbed by the previous result so nothing is hoisted. `what`: 0 records
/// built and sealed (nranks), 1 + step without report, 2 + step with report, 3 + split_for (the
/// lane's whole step), 4 combine alone, 5 the allocator's update alone, 6 digest alone,
/// 7 to_split alone, 8 record_checksum alone (nranks). With `warp`, parts 1-5 on one warp.
template <class A, int what, bool warp>
__global__ void part_kernel(int n_vts, int nranks, int steps, std::uint64_t count, unsigned long long* sink) {
  using namespace reccl;
  auto ctl = control<A>::start(n_vts);
  epoch_record recs[8];
  split sp = ctl.split_for(count, 8);
  unsigned long long acc = 0;
  auto build = [&](int k) {
    for (int r = 0; r < nranks; ++r) {
      telemetry::stalls tel{};
      for (int v = 0; v < n_vts; ++v) {
        tel.add_bytes(v, sp.count[v] * 2 + static_cast<unsigned>(k & 1));
        tel.add_stalls(v, (v == 3 ? 4000u : 100u) + ((sp.count[v] >> 4) & 63u) + static_cast<unsigned>(r));
      }
      recs[r] = ctl.record(r, tel, 0, 0);
    }
  };
  if constexpr (what <= 3) {
    for (int k = 0; k < steps; ++k) {
      build(k);
      if constexpr (what == 0) {
        acc += recs[nranks - 1].checksum;
        sp.count[0] += recs[0].checksum & 1u;  // feeds the next records
        ++ctl.epoch;
        continue;
      }
      epoch_report rep{};
      step_result const res = ctl.step(recs, nranks, what >= 2 ? &rep : nullptr, exec_t<warp>{});
      acc += static_cast<unsigned long long>(res.st) + rep.bw_mbps[0];
      if constexpr (what == 3) sp = ctl.split_for(count, 8);
      else sp.count[0] += ctl.share.w[0] & 1u;
    }
  } else {
    build(0);
    telemetry::cost_model_q m{};
    shares sh = ctl.share;
    vt_observation obs{};
    obs.n_vts = n_vts;
    obs.live_mask = all_live(n_vts);
    for (int v = 0; v < n_vts; ++v) obs.time[v] = v == 3 ? 4000 : 1000;
    for (int k = 0; k < steps; ++k) {
      if constexpr (what == 4) {
        epoch_summary const su =
            exec_t<warp>{}.combine(recs, nranks, epoch_expect{ctl.epoch, n_vts, recs[0].state_digest}, m);
        acc += su.time[0];
        m.delta += su.time[1] & 1u;
      } else if constexpr (what == 5) {
        sh = exec_t<warp>{}.update(ctl.allocator, sh, obs);
        obs.time[1] += sh.w[1] & 7u;
        acc += sh.w[3];
      } else if constexpr (what == 6) {
        acc += ctl.digest();
        ctl.epoch += acc & 1u;
        ++ctl.since_probe;
      } else if constexpr (what == 7) {
        split const t = to_split(sh, count + (acc & 15u), 8);
        acc += t.count[1];
      } else {
        for (int r = 0; r < nranks; ++r) {
          acc += record_checksum(recs[r]);
          recs[r].stalls[0] += acc & 1u;
        }
      }
    }
  }
  if (threadIdx.x == 0) *sink = acc;
}

/// Runs launch(10) once (module load, warm-up), then times launch(steps): ns per step.
template <class Launch>
double time_launches(int steps, Launch launch) {
  launch(10);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  CK(cudaEventRecord(e0));
  launch(steps);
  CK(cudaEventRecord(e1));
  CK(cudaEventSynchronize(e1));
  float ms = 0;
  CK(cudaEventElapsedTime(&ms, e0, e1));
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  return ms * 1e6 / steps;
}

template <int what, bool warp>
double time_part(int n_vts, int nranks, int steps) {
  unsigned long long* d = nullptr;
  CK(cudaMalloc(&d, sizeof(unsigned long long)));
  std::uint64_t const count = 64ull << 20;
  double const ns = time_launches(steps, [&](int k) {
    part_kernel<reccl::allocator::texcp, what, warp><<<1, warp ? 32 : 1>>>(n_vts, nranks, k, count, d);
  });
  CK(cudaFree(d));
  return ns;
}

template <class A, bool warp>
double time_steps(char const* name, int n_vts, int nranks, std::string& json) {
  reccl::split* d_sp = nullptr;
  unsigned long long* d_cyc = nullptr;
  CK(cudaMalloc(&d_sp, sizeof(reccl::split)));
  CK(cudaMalloc(&d_cyc, sizeof(unsigned long long)));
  int const steps = 2000;
  std::uint64_t const count = 64ull << 20;
  double const ns = time_launches(steps, [&](int k) {
    step_kernel<A, warp><<<1, warp ? 32 : 1>>>(n_vts, nranks, k, count, d_sp, d_cyc);
  });
  unsigned long long cyc = 0;
  CK(cudaMemcpy(&cyc, d_cyc, sizeof(cyc), cudaMemcpyDeviceToHost));
  reccl::split sp{};
  CK(cudaMemcpy(&sp, d_sp, sizeof(sp), cudaMemcpyDeviceToHost));
  char const* const exec = warp ? "warp" : "thread";
  std::printf("%-8s %-6s vts=%2d ranks=%d  %8.0f ns/step  %8.0f cycles/step  (VT 3 share after %d steps: %.4f)\n", name,
              exec, n_vts, nranks, ns, static_cast<double>(cyc) / steps, steps,
              static_cast<double>(sp.count[3]) / static_cast<double>(sp.total));
  char buf[256];
  std::snprintf(buf, sizeof buf,
                "%s{\"allocator\":\"%s\",\"exec\":\"%s\",\"vts\":%d,\"ranks\":%d,\"ns_per_step\":%.1f,\"cycles_per_step\":%.0f}",
                json.empty() ? "" : ",", name, exec, n_vts, nranks, ns, static_cast<double>(cyc) / steps);
  json += buf;
  CK(cudaFree(d_sp));
  CK(cudaFree(d_cyc));
  return ns;
}

}  // namespace

int main(int argc, char** argv) {
  std::string out;
  bool parts = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) out = argv[i + 1];
    if (std::strcmp(argv[i], "--parts") == 0) parts = true;
  }
  std::string rows;
  if (parts) {
    // texcp, 8 VTs: what each part of the lane's step costs one thread, and parts 1-5 on one warp
    using part_fn = double (*)(int, int, int);
    static part_fn const thread_parts[] = {time_part<0, false>, time_part<1, false>, time_part<2, false>,
                                           time_part<3, false>, time_part<4, false>, time_part<5, false>,
                                           time_part<6, false>, time_part<7, false>, time_part<8, false>};
    static part_fn const warp_parts[] = {nullptr, time_part<1, true>, time_part<2, true>,
                                         time_part<3, true>, time_part<4, true>, time_part<5, true>};
    static char const* const names[] = {"records built (bench only)", "+ step, no report", "+ step with report",
                                        "+ split_for (the lane's step)", "combine alone", "texcp update alone",
                                        "digest alone", "to_split alone", "record_checksum x nranks"};
    for (int ranks : {2, 8}) {
      for (int what = 0; what <= 8; ++what) {
        for (bool warp : {false, true}) {
          if (warp && (what < 1 || what > 5)) continue;
          double const ns = (warp ? warp_parts : thread_parts)[what](8, ranks, 2000);
          std::printf("texcp vts=8 ranks=%d  %-6s %-32s %8.0f ns\n", ranks, warp ? "warp" : "thread", names[what], ns);
          char buf[256];
          std::snprintf(buf, sizeof buf, "%s{\"part\":\"%s\",\"exec\":\"%s\",\"ranks\":%d,\"ns\":%.1f}",
                        rows.empty() ? "" : ",", names[what], warp ? "warp" : "thread", ranks, ns);
          rows += buf;
        }
      }
    }
  } else {
    for (int ranks : {2, 8})
      for (int v : {8, 16}) {
        time_steps<reccl::allocator::texcp, false>("texcp", v, ranks, rows);
        time_steps<reccl::allocator::texcp, true>("texcp", v, ranks, rows);
        time_steps<reccl::allocator::aimd, false>("aimd", v, ranks, rows);
        time_steps<reccl::allocator::aimd, true>("aimd", v, ranks, rows);
        time_steps<reccl::allocator::equal, false>("equal", v, ranks, rows);
        time_steps<reccl::allocator::equal, true>("equal", v, ranks, rows);
      }
  }
  if (!out.empty()) {
    FILE* f = std::fopen(out.c_str(), "w");
    if (f == nullptr) return 1;
    std::fprintf(f, "{\"bench\":\"control_step\",\"rows\":[%s]}\n", rows.c_str());
    std::fclose(f);
  }
  return 0;
}
