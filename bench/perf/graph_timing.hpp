// bench/perf/graph_timing.hpp -- how the small-message tools time a call: per rank one CUDA graph of
// `iters` calls captured on its own stream, every rank's graph launched together, wall time between
// two events divided by `iters`; the median of `reps` replays (the first replay warms the graphs).
// reccl_loopback_perf times reccl's collectives the same way.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <vector>

// CK: the tools' check (print and exit). A program that must not exit on a CUDA error (the Python
// extension's measurement helper) defines its own CK before including this file.
#ifndef CK
#include "examples/common/check.hpp"
#endif

namespace reccl_bench {

/// Captures `issue(rank)` `iters` times per rank into one graph per rank (on `streams[rank]`).
template <class Issue>
std::vector<cudaGraphExec_t> capture_per_rank(std::vector<cudaStream_t> const& streams, int iters, Issue&& issue) {
  std::vector<cudaGraphExec_t> exec(streams.size());
  for (std::size_t r = 0; r < streams.size(); ++r) {
    cudaGraph_t g;
    CK(cudaStreamBeginCapture(streams[r], cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < iters; ++k) issue(static_cast<int>(r));
    CK(cudaStreamEndCapture(streams[r], &g));
    CK(cudaGraphInstantiate(&exec[r], g, 0));
    CK(cudaGraphDestroy(g));
  }
  return exec;
}

/// Microseconds per call of each of `reps` replays of every rank's graph launched together, in
/// replay order (one unrecorded replay first warms the graphs).
inline std::vector<double> replay_graphs(std::vector<cudaStream_t> const& streams, std::vector<cudaGraphExec_t> const& exec,
                                         int iters, int reps) {
  cudaEvent_t t0, t1;
  CK(cudaEventCreate(&t0));
  CK(cudaEventCreate(&t1));
  std::vector<cudaEvent_t> done(streams.size());
  for (auto& e : done) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::vector<double> us;
  for (int rep = 0; rep < reps + 1; ++rep) {
    CK(cudaEventRecord(t0, streams[0]));
    for (std::size_t r = 1; r < streams.size(); ++r) CK(cudaStreamWaitEvent(streams[r], t0));
    for (std::size_t r = 0; r < streams.size(); ++r) CK(cudaGraphLaunch(exec[r], streams[r]));
    for (std::size_t r = 1; r < streams.size(); ++r) {
      CK(cudaEventRecord(done[r], streams[r]));
      CK(cudaStreamWaitEvent(streams[0], done[r]));
    }
    CK(cudaEventRecord(t1, streams[0]));
    CK(cudaEventSynchronize(t1));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, t0, t1));
    if (rep > 0) us.push_back(1000.0 * ms / iters);
  }
  CK(cudaEventDestroy(t0));
  CK(cudaEventDestroy(t1));
  for (auto& e : done) CK(cudaEventDestroy(e));
  return us;
}

inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Median microseconds per call over `reps` replays (replay_graphs); destroys the graphs.
inline double time_graphs(std::vector<cudaStream_t> const& streams, std::vector<cudaGraphExec_t>& exec, int iters, int reps) {
  double const us = median_of(replay_graphs(streams, exec, iters, reps));
  for (auto& x : exec) CK(cudaGraphExecDestroy(x));
  return us;
}

}  // namespace reccl_bench
