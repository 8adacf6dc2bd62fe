// The adaptive loop on the GPU: an all-reduce whose byte split across VTs adapts on the device,
// next to the same kernels with NCCL's equal split (allocator::equal: equal over the live VTs),
// through four phases:
//
//   1 healthy      2 one VT slowed to a quarter of its rate      3 that VT dead      4 recovered
//
// Every result is checked on every rank. Runs on every GPU of the machine (>= 2: NCCL-backed
// ranks) or, with one GPU, on two loopback ranks of it (the "link" is then the GPU's own memory:
// the kernels, the telemetry, the recovery and the probes are the real ones, the speeds are not
// NVLink's). Prints one line per collective and a summary; --json FILE writes it.
//
//   adaptive_gpu [--mib 64] [--json FILE]       (NCCL_NVLS_ENABLE=0: NVLink multicast stays off)
// It reduces bf16 only, so only bf16's reduction kernels are compiled (RECCL_DTYPES, reccl/types.hpp):
// about a third of the build time with every dtype.
#define RECCL_DTYPES bfloat16

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include <reccl/host/adaptive.hpp>
#include <reccl/policy/allocator/equal.hpp>
#include <reccl/policy/allocator/texcp.hpp>

#include "../../bench/perf/reference.cuh"
#include "../common/check.hpp"

namespace {

struct ranks {
  int n = 0;
  bool loopback = false;
  std::vector<ncclComm_t> nccl;
  std::vector<reccl::nvlink_communicator> comms;
  std::vector<cudaStream_t> streams;
  std::vector<cudaEvent_t> t0, t1;
  std::vector<void*> in, out, expect;
  std::vector<unsigned long long*> wrong;
  int dev(int r) const { return loopback ? 0 : r; }
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

/// One all-reduce on every rank through `lanes`: returns the slower rank's time (us) and adds the
/// wrong elements of every rank's output to `bad`.
template <class L>
double all_reduce(ranks& R, std::vector<L>& lanes, std::uint64_t count, unsigned long long& bad) {
  for (int r = 0; r < R.n; ++r) {
    CK(cudaSetDevice(R.dev(r)));
    reccl::bench::poison(reccl::dtype::bfloat16, R.out[r], count, R.streams[r]);
    CK(cudaStreamSynchronize(R.streams[r]));
  }
  for (int r = 0; r < R.n; ++r) {
    CK(cudaSetDevice(R.dev(r)));
    CK(cudaEventRecord(R.t0[r], R.streams[r]));
    lanes[r].all_reduce(R.in[r], R.out[r], count, reccl::dtype::bfloat16, reccl::redop::sum, R.streams[r]);
    CK(cudaEventRecord(R.t1[r], R.streams[r]));
  }
  double us = 0;
  for (int r = 0; r < R.n; ++r) {
    CK(cudaSetDevice(R.dev(r)));
    bad += reccl::bench::count_diff(reccl::dtype::bfloat16, R.out[r], R.expect[r], count, R.wrong[r], R.streams[r]);
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, R.t0[r], R.t1[r]));
    us = std::max(us, static_cast<double>(ms) * 1e3);
    R.comms[r].check();  // throws if the lane failed (a lost rank); a recovered VT is not an error
  }
  return us;
}

}  // namespace

int main(int argc, char** argv) {
  std::uint64_t mib = 64;
  std::string json;
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--mib") == 0) mib = std::strtoull(argv[i + 1], nullptr, 10);
    if (std::strcmp(argv[i], "--json") == 0) json = argv[i + 1];
  }
  int ndev = 0;
  CK(cudaGetDeviceCount(&ndev));
  if (ndev < 1) {
    std::fprintf(stderr, "no GPU\n");
    return 1;
  }
  ranks R;
  R.loopback = ndev < 2;
  R.n = R.loopback ? 2 : std::min(ndev, 8);
  reccl::nvlink_config cfg;
  cfg.lanes = 2;
  if (R.loopback) {
    R.comms = reccl::nvlink_communicator::create_loopback(R.n, 0, cfg);
  } else {
    R.nccl.resize(R.n);
    std::vector<int> devs(R.n);
    std::iota(devs.begin(), devs.end(), 0);
    if (ncclCommInitAll(R.nccl.data(), R.n, devs.data()) != ncclSuccess) return 1;
    R.comms = reccl::nvlink_communicator::create_all(R.nccl, cfg);
  }
  std::uint64_t const count = mib << 19;  // bf16 elements
  for (int r = 0; r < R.n; ++r) {
    CK(cudaSetDevice(R.dev(r)));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    R.streams.push_back(s);
    cudaEvent_t a, b;
    CK(cudaEventCreate(&a));
    CK(cudaEventCreate(&b));
    R.t0.push_back(a);
    R.t1.push_back(b);
    void *x, *y, *z;
    unsigned long long* w;
    CK(cudaMalloc(&x, count * 2));
    CK(cudaMalloc(&y, count * 2));
    CK(cudaMalloc(&z, count * 2));
    CK(cudaMalloc(&w, sizeof(*w)));
    reccl::bench::fill(reccl::dtype::bfloat16, x, count, 7, r, 0, s);
    reccl::bench::expect(reccl::dtype::bfloat16, reccl::collective::all_reduce, reccl::redop::sum, r, R.n, 0, 7, count, z,
                         count, s);
    R.in.push_back(x);
    R.out.push_back(y);
    R.expect.push_back(z);
    R.wrong.push_back(w);
  }
  std::vector<reccl::nvlink_communicator*> ptrs;
  for (auto& c : R.comms) ptrs.push_back(&c);

  // The adaptive lane (texcp, stall telemetry) and, for comparison, the same kernels with the
  // equal split (allocator::equal), both on lane 1, 8 VTs.
  reccl::adaptive_options o;
  o.lane = 1;
  o.vts = 8;
  o.control.probe_interval = 3;
  int const slow = 3;
  std::printf("reccl adaptive all-reduce, %d %s, %llu MiB bf16, 8 VTs, VT %d slowed then killed\n", R.n,
              R.loopback ? "loopback ranks on one GPU" : "GPUs", static_cast<unsigned long long>(mib), slow);

  struct phase {
    char const* name;
    int first, last;  // collectives [first, last)
  };
  phase const phases[] = {{"healthy", 0, 10}, {"VT slowed to 1/4", 10, 30}, {"VT dead", 30, 50}, {"recovered", 50, 70}};
  unsigned long long bad = 0;
  double healthy_rate = 0;  // the slowed VT's bytes per second when healthy
  std::string summary = "{\"ranks\":" + std::to_string(R.n) + ",\"loopback\":" + (R.loopback ? "true" : "false") + ",\"mib\":" +
                        std::to_string(mib) + ",\"runs\":[";
  for (int pass = 0; pass < 2; ++pass) {
    bool const adaptive = pass == 0;
    std::vector<double> t(70);
    std::vector<reccl::epoch_report> reps;
    auto run = [&](auto& lanes) {
      std::uint64_t const e0 = lanes[0].epoch();
      for (int k = 0; k < 70; ++k) {
        if (k == 10) {  // from here on: the slowed VT, then dead from 30 to 50
          reccl::device_faults f;
          f.throttle(slow, healthy_rate / 4, e0 + 10, e0 + 30).kill(slow, e0 + 30, e0 + 50);
          for (int r = 0; r < R.n; ++r) lanes[r].inject(f, R.streams[r]);
        }
        t[k] = all_reduce(R, lanes, count, bad);
        if (adaptive && k == 9) {  // the healthy rate of the VT to slow, measured by the kernels
          std::vector<double> rate;
          for (auto const& s : lanes[0].samples(e0 + 2, e0 + 10))
            if (s.ns[slow] > 0) rate.push_back(static_cast<double>(s.bytes[slow]) / (R.n - 1) / (s.ns[slow] * 1e-9));
          healthy_rate = median(rate);
        }
      }
      all_reduce(R, lanes, count, bad);  // writes the report of the last one
      reps = lanes[0].reports(e0, e0 + 70);
    };
    if (adaptive) {
      // two control chains (even and odd collectives) each step every other collective, so a
      // VT may lose up to 3/4 of its share per step (texcp's default floor is 1/2)
      reccl::allocator::texcp tx{};
      tx.min_factor = reccl::q16(0.25);
      auto lanes = reccl::adaptive_lane<reccl::allocator::texcp>::create_all(ptrs, o, tx);
      run(lanes);
    } else {
      auto lanes = reccl::adaptive_lane<reccl::allocator::equal>::create_all(ptrs, o);
      run(lanes);
    }
    std::printf("\n%s\n", adaptive ? "texcp (adapts on the device)" : "equal split (the same kernels, NCCL's split)");
    std::printf("  %-18s %10s %10s %12s %s\n", "phase", "median us", "GB/s", "VT share", "events");
    summary += std::string(pass ? "," : "") + "{\"allocator\":\"" + (adaptive ? "texcp" : "equal") + "\",\"phases\":[";
    for (auto const& ph : phases) {
      std::vector<double> tt(t.begin() + ph.first + 2, t.begin() + ph.last);
      double const us = median(tt);
      double share = 0;
      int faults = 0, rejoins = 0;
      for (auto const& rp : reps)
        if (rp.epoch - reps.front().epoch >= static_cast<std::uint64_t>(ph.first) &&
            rp.epoch - reps.front().epoch < static_cast<std::uint64_t>(ph.last)) {
          share = static_cast<double>(rp.split.count[slow]) / static_cast<double>(rp.split.total);
          faults += (rp.fault_mask >> slow) & 1u;
          rejoins += (rp.rejoined_mask >> slow) & 1u;
        }
      double const gbs = count * 2.0 / (us * 1e3);
      std::printf("  %-18s %10.1f %10.1f %12.4f %s%s\n", ph.name, us, gbs, share, faults ? "recovered in-kernel " : "",
                  rejoins ? "probe brought it back" : "");
      summary += std::string(&ph == phases ? "" : ",") + "{\"phase\":\"" + ph.name + "\",\"us\":" + std::to_string(us) +
                 ",\"vt_share\":" + std::to_string(share) + "}";
    }
    summary += "]}";
  }
  summary += "],\"wrong_elements\":" + std::to_string(bad) + "}";
  std::printf("\nwrong elements over 2 x 71 collectives on %d ranks: %llu\n", R.n, bad);
  if (!json.empty()) std::ofstream(json) << summary << "\n";
  R.comms.clear();
  for (auto c : R.nccl) ncclCommDestroy(c);
  return bad == 0 ? 0 : 1;
}
