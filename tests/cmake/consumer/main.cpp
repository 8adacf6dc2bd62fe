// A consumer of the installed / fetched package: the README's first example, run for real on the
// CPU engine (4 ranks x 4 VTs), checked against a reference.
#include <reccl/collective.hpp>
#include <reccl/policy/allocator/texcp.hpp>
#include <reccl/policy/schedule/ring.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>

#include <cstdio>
#include <vector>

using ar = reccl::all_reduce<float, reccl::schedule::ring, reccl::transport::cpu_threads, reccl::telemetry::stalls,
                             reccl::allocator::texcp>;

int main() {
  constexpr int nranks = 4;
  constexpr std::uint64_t count = 10007;
  std::vector<std::vector<float>> send(nranks, std::vector<float>(count)), recv(nranks, std::vector<float>(count, -1.f));
  for (int r = 0; r < nranks; ++r)
    for (std::uint64_t i = 0; i < count; ++i) send[r][i] = static_cast<float>((i * 7 + r * 13) % 64);  // exact sums

  reccl::cpu::communicator comm({.nranks = nranks, .n_vts = 4});
  comm.run_ranks([&](int rank) {
    auto res = ar::run(comm, rank, send[rank].data(), recv[rank].data(), count, reccl::redop::sum);
    if (res.st != reccl::status::ok) throw reccl::error(res.st, "unexpected status");
  });

  for (int r = 0; r < nranks; ++r)
    for (std::uint64_t i = 0; i < count; ++i) {
      float want = 0;
      for (int s = 0; s < nranks; ++s) want += send[s][i];
      if (recv[r][i] != want) {
        std::printf("rank %d element %llu: %g, want %g\n", r, static_cast<unsigned long long>(i), recv[r][i], want);
        return 1;
      }
    }
  std::printf("reccl %d.%d.%d consumer ok\n", RECCL_VERSION_MAJOR, RECCL_VERSION_MINOR, RECCL_VERSION_PATCH);
  return 0;
}
