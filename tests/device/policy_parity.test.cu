// Host/device agreement of the policy layer (label gpu): the same random inputs through the same
// headers on the CPU and inside a kernel must give the same bits -- the allocators' updates
// (texcp, proportional, aimd), to_split, the quantized cost model, the epoch checksum and the
// control step with faults and probes. This is what lets every rank, host or device, compute the
// same split. All 20,000 cases must agree; without a GPU the case is skipped.
#include "../doctest_main.hpp"

#include <cstring>
#include <random>
#include <vector>

#include <reccl/policy/allocator/aimd.hpp>
#include <reccl/policy/allocator/proportional.hpp>
#include <reccl/policy/allocator/texcp.hpp>
#include <reccl/policy/control.hpp>
#include <reccl/policy/telemetry/stall_counter.hpp>

using namespace reccl;

struct case_in {
  shares s;
  vt_observation o;
  std::uint64_t total, granule;
  telemetry::cost_model_q model;
  epoch_record recs[4];
  control<allocator::texcp> ctl;
};
struct case_out {
  shares texcp, prop, aimd;
  split sp;
  std::uint64_t eval[max_vts];
  std::uint64_t checksum[4];
  step_result res;
  std::uint64_t digest_after;
  shares share_after;
  epoch_report rep;
};

__host__ __device__ void run_case(case_in const& in, case_out& out) {
  out.texcp = allocator::texcp{}.update(in.s, in.o);
  out.prop = allocator::proportional{}.update(in.s, in.o);
  out.aimd = allocator::aimd{}.update(in.s, in.o);
  out.sp = to_split(out.texcp, in.total, in.granule);
  for (int i = 0; i < max_vts; ++i) out.eval[i] = in.model.eval(in.o.time[i] >> 20, in.o.time[i]);
  for (int r = 0; r < 4; ++r) out.checksum[r] = record_checksum(in.recs[r]);
  auto c = in.ctl;
  out.res = c.step(in.recs, 4, &out.rep);
  out.digest_after = c.digest();
  out.share_after = c.share;
}

__global__ void kernel(case_in const* in, case_out* out, int n) {
  int const k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k < n) run_case(in[k], out[k]);
}

template <class T>
bool bits_equal(T const& a, T const& b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }  // padding-free types only

bool same(case_out const& a, case_out const& b) {
  static_assert(sizeof(shares) == 8 + 4 * max_vts && sizeof(split) == 16 + 8 * max_vts);
  bool ok = bits_equal(a.texcp, b.texcp) && bits_equal(a.prop, b.prop) && bits_equal(a.aimd, b.aimd) &&
            bits_equal(a.sp, b.sp) && bits_equal(a.eval, b.eval) && bits_equal(a.checksum, b.checksum) &&
            a.res.st == b.res.st && a.res.epoch == b.res.epoch && a.res.rank == b.res.rank &&
            a.res.failed == b.res.failed && a.digest_after == b.digest_after && bits_equal(a.share_after, b.share_after);
  epoch_report const &x = a.rep, &y = b.rep;
  ok = ok && x.epoch == y.epoch && x.st == y.st && x.n_vts == y.n_vts && x.nranks == y.nranks &&
       bits_equal(x.share, y.share) && bits_equal(x.bytes, y.bytes) && bits_equal(x.stalls, y.stalls) &&
       bits_equal(x.time_ns, y.time_ns) && bits_equal(x.bw_mbps, y.bw_mbps) && x.masked_mask == y.masked_mask &&
       x.fault_mask == y.fault_mask && x.probe_mask == y.probe_mask && x.rejoined_mask == y.rejoined_mask;
  return ok;
}

TEST_CASE("policy layer: host and device give the same bits on random inputs") {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) SKIP_CASE("no GPU");
  int const n = 20000;
  std::mt19937_64 rng(2026);
  std::vector<case_in> in(n);
  for (auto& c : in) {
    std::memset(&c, 0, sizeof c);
    int const v = 1 + static_cast<int>(rng() % max_vts);
    std::uint32_t mask = 0;
    while (mask == 0) mask = static_cast<std::uint32_t>(rng()) & all_live(v);
    std::uint64_t raw[max_vts] = {};
    for (int i = 0; i < v; ++i) raw[i] = 1 + rng() % (1u << 24);
    c.s.n_vts = v;
    c.s.live_mask = mask;
    detail::distribute(raw, mask, share_one, c.s.w);
    c.o.n_vts = v;
    c.o.live_mask = (rng() % 4 == 0) ? (mask ^ (1u << (rng() % v))) : mask;
    for (int i = 0; i < v; ++i) c.o.time[i] = (rng() % 5 == 0) ? 0 : (rng() >> (rng() % 50));
    c.total = rng() >> (rng() % 40);
    c.granule = 1 + rng() % 4096;
    c.model.alpha = rng() % (1ull << 40);
    c.model.beta = rng() % (1ull << 30);
    c.model.delta = rng() % 100000;
    c.ctl = control<allocator::texcp>::start(v);
    c.ctl.share = c.s;
    c.ctl.model = c.model;
    c.ctl.probe_mask = all_live(v) & ~mask;
    std::uint32_t const dead = (rng() % 3 == 0) ? (1u << (rng() % v)) : 0u;
    for (int r = 0; r < 4; ++r) {
      telemetry::stalls t{};
      for (int i = 0; i < v; ++i) t.add_stalls(i, rng() % 100000), t.add_bytes(i, rng() % (1ull << 34));
      c.recs[r] = c.ctl.record(r, t, r == 1 ? dead : 0u, static_cast<std::uint32_t>(rng()) & c.ctl.probe_mask);
    }
  }
  std::vector<case_out> host(n), dev(n);
  for (int k = 0; k < n; ++k) {
    std::memset(&host[k], 0, sizeof(case_out));
    run_case(in[k], host[k]);
  }
  case_in* din = nullptr;
  case_out* dout = nullptr;
  REQUIRE(cudaMalloc(&din, n * sizeof(case_in)) == cudaSuccess);
  REQUIRE(cudaMalloc(&dout, n * sizeof(case_out)) == cudaSuccess);
  REQUIRE(cudaMemcpy(din, in.data(), n * sizeof(case_in), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemset(dout, 0, n * sizeof(case_out)) == cudaSuccess);
  kernel<<<(n + 127) / 128, 128>>>(din, dout, n);
  cudaError_t const err = cudaDeviceSynchronize();
  REQUIRE_MESSAGE(err == cudaSuccess, "CUDA error: " << cudaGetErrorString(err));
  REQUIRE(cudaMemcpy(dev.data(), dout, n * sizeof(case_out), cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(din);
  cudaFree(dout);
  int bad = 0, errors = 0, recovered = 0, timeouts = 0;
  for (int k = 0; k < n; ++k) {
    if (!same(host[k], dev[k])) ++bad;
    errors += host[k].res.st == status::mismatch || host[k].res.st == status::invalid_argument;
    recovered += host[k].res.st == status::recovered;
    timeouts += host[k].res.st == status::timeout;
  }
  MESSAGE(n << " random cases (texcp/proportional/aimd update, to_split, cost model eval, record checksum, "
              "control step with faults and probes): " << bad << " differ between host and device (steps: "
            << recovered << " recovered, " << timeouts << " timeout, " << errors << " rejected)");
  CHECK(bad == 0);
}
