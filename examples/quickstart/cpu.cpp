// reccl's CPU engine: 4 ranks (threads) x 4 VTs (channels), three collectives, results checked.
#include <reccl/collective.hpp>                      // collective_op and the CPU engine
#include <reccl/policy/allocator/texcp.hpp>          // allocator::texcp
#include <reccl/policy/schedule/ring.hpp>            // schedule::ring
#include <reccl/policy/telemetry/stall_counter.hpp>  // telemetry::stalls
#include <cstdio>
#include <vector>

using namespace reccl;
template <collective Kind>  // swap one argument to swap a policy, e.g. allocator::equal for NCCL's split
using coll = collective_op<Kind, float, schedule::ring, transport::cpu_threads, telemetry::stalls, allocator::texcp>;

int main() {
  constexpr int n = 4;                   // ranks
  constexpr std::uint64_t count = 1000;  // elements; what it counts depends on the collective
  std::vector<std::vector<float>> in(n), sum(n), mine(n), all(n);
  for (int r = 0; r < n; ++r) {
    in[r].assign(n * count, float(r + 1));  // all-reduce, all-gather read count; reduce-scatter n * count
    sum[r].resize(count);                   // all-reduce: count out
    mine[r].resize(count);                  // reduce-scatter: count out (block r of the sums)
    all[r].resize(n * count);               // all-gather: n * count out (block s from rank s)
  }
  cpu::communicator comm({.nranks = n, .n_vts = 4});
  comm.run_ranks([&](int r) {  // one thread per rank; every rank calls every collective
    auto res = coll<collective::all_reduce>::run(comm, r, in[r].data(), sum[r].data(), count, redop::sum);
    if (res.st == status::recovered) std::printf("rank %d: a VT died; the result is still right\n", r);
    coll<collective::reduce_scatter>::run(comm, r, in[r].data(), mine[r].data(), count, redop::sum);
    coll<collective::all_gather>::run(comm, r, in[r].data(), all[r].data(), count);
  });
  bool good = true;  // every sum is 1 + 2 + 3 + 4 = 10; block s of the all-gather holds s + 1
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < n * count; ++i)
      good = good && all[r][i] == float(i / count + 1) && (i >= count || (sum[r][i] == 10 && mine[r][i] == 10));
  std::puts(good ? "all results correct" : "WRONG RESULT");
  return good ? 0 : 1;
}
