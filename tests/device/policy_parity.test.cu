// Host/device agreement of the policy layer (label gpu): the same random inputs through the same
// headers on the CPU and inside a kernel must give the same bits -- the allocators' updates
// (texcp, proportional, aimd), to_split, the quantized cost model, the epoch checksum and the
// control step with faults and probes -- and the same step on one warp (device::warp_exec: the
// combine and the texcp / equal / proportional / aimd updates spread over the lanes) against one
// host thread. This is
// what lets every rank, host or device, thread or warp, compute the same split. All 20,000 cases
// must agree; without a GPU the cases are skipped.
#include "../doctest_main.hpp"

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <reccl/device/warp_policy.hpp>
#include <reccl/policy/allocator/aimd.hpp>
#include <reccl/policy/allocator/equal.hpp>
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
  int nranks;
  control<allocator::texcp> ctl;  // ctl.allocator: random tunables
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
  out.texcp = in.ctl.allocator.update(in.s, in.o);
  out.prop = allocator::proportional{}.update(in.s, in.o);
  out.aimd = allocator::aimd{}.update(in.s, in.o);
  out.sp = to_split(out.texcp, in.total, in.granule);
  for (int i = 0; i < max_vts; ++i) out.eval[i] = in.model.eval(in.o.time[i] >> 20, in.o.time[i]);
  for (int r = 0; r < 4; ++r) out.checksum[r] = record_checksum(in.recs[r]);
  auto c = in.ctl;
  out.rep = epoch_report{};  // a step that fails writes no report: both sides start from the same one
  out.res = c.step(in.recs, in.nranks, &out.rep);
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

/// `n` random cases: shares, observations, texcp tunables, 1-4 ranks' records (one in eight with a
/// record that fails a check), faults and probes.
std::vector<case_in> make_cases(int n, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
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
    c.nranks = 1 + static_cast<int>(rng() % 4);
    if (rng() % 8 == 0) {  // one record fails a check: checksum, rank, epoch, VT count or state
      epoch_record& bad = c.recs[rng() % c.nranks];
      switch (rng() % 5) {
        case 0: bad.stalls[0] ^= 1; break;  // not resealed
        case 1: bad.rank += 1, seal(bad); break;
        case 2: bad.epoch += 1, seal(bad); break;
        case 3: bad.n_vts = bad.n_vts % max_vts + 1, seal(bad); break;
        default: bad.state_digest ^= 4, seal(bad); break;
      }
    }
    allocator::texcp& tx = c.ctl.allocator;  // random tunables half of the time
    if (rng() % 2 == 0) {
      tx.eta = static_cast<std::uint32_t>(rng() % 140000);
      tx.min_factor = static_cast<std::uint32_t>(rng() % 65537);
      tx.epsilon = static_cast<std::uint32_t>(rng() % 2048);
      tx.min_share = static_cast<std::uint32_t>(rng() % (share_one >> 5));
      tx.dead_band = rng() % 3 == 0 ? 0u : static_cast<std::uint32_t>(rng() % 8192);
    }
  }
  return in;
}

/// Copies `in` to the device, poisons as many outputs, runs launch(device inputs, device outputs,
/// count) and returns the outputs.
template <class Out, class Launch>
std::vector<Out> run_on_device(std::vector<case_in> const& in, Launch launch) {
  int const n = static_cast<int>(in.size());
  std::vector<Out> out(n);
  case_in* din = nullptr;
  Out* dout = nullptr;
  REQUIRE(cudaMalloc(&din, n * sizeof(case_in)) == cudaSuccess);
  REQUIRE(cudaMalloc(&dout, n * sizeof(Out)) == cudaSuccess);
  REQUIRE(cudaMemcpy(din, in.data(), n * sizeof(case_in), cudaMemcpyHostToDevice) == cudaSuccess);
  REQUIRE(cudaMemset(dout, 0xa5, n * sizeof(Out)) == cudaSuccess);  // poisoned
  launch(din, dout, n);
  cudaError_t const err = cudaDeviceSynchronize();
  REQUIRE_MESSAGE(err == cudaSuccess, "CUDA error: " << cudaGetErrorString(err));
  REQUIRE(cudaMemcpy(out.data(), dout, n * sizeof(Out), cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(din);
  cudaFree(dout);
  return out;
}

TEST_CASE("policy layer: host and device give the same bits on random inputs") {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) SKIP_CASE("no GPU");
  int const n = 20000;
  std::vector<case_in> const in = make_cases(n, 2026);
  std::vector<case_out> host(n);
  for (int k = 0; k < n; ++k) {
    std::memset(&host[k], 0, sizeof(case_out));
    run_case(in[k], host[k]);
  }
  std::vector<case_out> const dev = run_on_device<case_out>(in, [](case_in const* din, case_out* dout, int count) {
    kernel<<<(count + 127) / 128, 128>>>(din, dout, count);
  });
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

// ---- the same step on one warp ------------------------------------------------------------------

struct warp_case_out {
  shares texcp, equal, prop, aimd;
  epoch_summary sum;
  step_result res;
  std::uint64_t digest_after;
  shares share_after;
  epoch_report rep;
};

/// The serial reference (host) of what warp_kernel computes.
void serial_case(case_in const& in, warp_case_out& out) {
  out.texcp = in.ctl.allocator.update(in.s, in.o);
  out.equal = allocator::equal{}.update(in.s, in.o);
  out.prop = allocator::proportional{}.update(in.s, in.o);
  out.aimd = allocator::aimd{}.update(in.s, in.o);
  auto c = in.ctl;
  out.sum = combine(in.recs, in.nranks, epoch_expect{c.epoch, c.share.n_vts, c.digest()}, c.current_model());
  out.res = c.step(in.recs, in.nranks, &out.rep);
  out.digest_after = c.digest();
  out.share_after = c.share;
}

/// One warp per case, every lane computing; lane 0 writes. Lanes other than 0 check that they
/// hold the same result (a lane that differs sets *diverged).
__global__ void warp_kernel(case_in const* in, warp_case_out* out, int n, int* diverged) {
  int const k = static_cast<int>(blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32);
  if (k >= n) return;  // whole warps leave together
  case_in const& c = in[k];
  device::warp_exec const ex{};
  warp_case_out r{};
  r.texcp = ex.update(c.ctl.allocator, c.s, c.o);
  r.equal = ex.update(allocator::equal{}, c.s, c.o);
  r.prop = ex.update(allocator::proportional{}, c.s, c.o);
  r.aimd = ex.update(allocator::aimd{}, c.s, c.o);
  auto ctl = c.ctl;
  r.sum = ex.combine(c.recs, c.nranks, epoch_expect{ctl.epoch, ctl.share.n_vts, ctl.digest()}, ctl.current_model());
  r.res = ctl.step(c.recs, c.nranks, &r.rep, ex);
  r.digest_after = ctl.digest();
  r.share_after = ctl.share;
  std::uint64_t const mine = r.digest_after ^ r.texcp.w[0] ^ (std::uint64_t{r.equal.w[1]} << 32) ^ r.sum.time[0] ^
                             (std::uint64_t{r.prop.w[2]} << 16) ^ (std::uint64_t{r.aimd.w[3]} << 8);
  if (__shfl_sync(0xffffffffu, mine, 0) != mine) atomicAdd(diverged, 1);
  if ((threadIdx.x & 31u) == 0) out[k] = r;
}

bool same_warp(warp_case_out const& a, warp_case_out const& b) {
  epoch_summary const &x = a.sum, &y = b.sum;
  bool ok = bits_equal(a.texcp, b.texcp) && bits_equal(a.equal, b.equal) && bits_equal(a.prop, b.prop) &&
            bits_equal(a.aimd, b.aimd) && x.st == y.st && x.epoch == y.epoch &&
            x.rank == y.rank && x.failed == y.failed && x.n_vts == y.n_vts && x.nranks == y.nranks &&
            x.fault_mask == y.fault_mask && x.probe_ok_mask == y.probe_ok_mask && bits_equal(x.time, y.time) &&
            bits_equal(x.slowest_rank, y.slowest_rank) && bits_equal(x.stalls, y.stalls) &&
            bits_equal(x.bytes, y.bytes);
  ok = ok && a.res.st == b.res.st && a.res.epoch == b.res.epoch && a.res.rank == b.res.rank &&
       a.res.failed == b.res.failed && a.digest_after == b.digest_after && bits_equal(a.share_after, b.share_after);
  epoch_report const &p = a.rep, &q = b.rep;
  return ok && p.epoch == q.epoch && p.st == q.st && p.n_vts == q.n_vts && p.nranks == q.nranks &&
         bits_equal(p.share, q.share) && bits_equal(p.bytes, q.bytes) && bits_equal(p.stalls, q.stalls) &&
         bits_equal(p.time_ns, q.time_ns) && bits_equal(p.bw_mbps, q.bw_mbps) && p.masked_mask == q.masked_mask &&
         p.fault_mask == q.fault_mask && p.probe_mask == q.probe_mask && p.rejoined_mask == q.rejoined_mask;
}

TEST_CASE("policy layer: a warp's step gives the bits of one thread's (combine, the four allocators, step)") {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) SKIP_CASE("no GPU");
  int const n = 20000;
  std::vector<case_in> const in = make_cases(n, 2027);
  std::vector<warp_case_out> host(n);
  for (int k = 0; k < n; ++k) {
    std::memset(&host[k], 0, sizeof(warp_case_out));
    serial_case(in[k], host[k]);
  }
  int* ddiv = nullptr;
  REQUIRE(cudaMalloc(&ddiv, sizeof(int)) == cudaSuccess);
  REQUIRE(cudaMemset(ddiv, 0, sizeof(int)) == cudaSuccess);
  std::vector<warp_case_out> const dev =
      run_on_device<warp_case_out>(in, [&](case_in const* din, warp_case_out* dout, int count) {
        warp_kernel<<<(count + 3) / 4, 128>>>(din, dout, count, ddiv);
      });
  int diverged = -1;
  REQUIRE(cudaMemcpy(&diverged, ddiv, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(ddiv);
  int bad = 0, mismatches = 0, moved = 0, held = 0;
  for (int k = 0; k < n; ++k) {
    if (!same_warp(host[k], dev[k])) ++bad;
    mismatches += host[k].sum.st == status::mismatch;
    moved += !bits_equal(host[k].texcp, in[k].s);
    held += bits_equal(host[k].texcp, in[k].s);
  }
  std::string const msg = std::to_string(n) + " random cases on one warp each: " + std::to_string(bad) +
                          " differ from one host thread; lanes that disagreed: " + std::to_string(diverged) +
                          " (combine rejected " + std::to_string(mismatches) + "; texcp moved the shares in " +
                          std::to_string(moved) + ", kept them in " + std::to_string(held) + ")";
  MESSAGE(msg);
  CHECK(bad == 0);
  CHECK(diverged == 0);
  CHECK(mismatches > n / 20);  // the cases reach every path
  CHECK(moved > n / 4);
}
