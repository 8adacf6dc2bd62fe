// bench/lifecycle/lifecycle.cu -- what a parallel-shape switch costs: NCCL's own communicator
// lifecycle, reccl's, and the prewarmed pool (host/pool.hpp), measured in one run.
//
//   reccl_lifecycle [--ranks N] [--trials T] [--switch-trials S] [--window-mib W] [--out FILE]
//                   [--timeout-s S]
//
// One process per GPU (forked before any CUDA call); the world's ncclUniqueId goes through a file,
// the barrier and the per-trial samples through a shared mapping of another. Every timed step
// starts when the common barrier releases; its critical path is the maximum over ranks of the
// ranks' own wall times (host clock around the call; collectives include the stream
// synchronisation). One unrecorded warm-up trial, then T recorded ones; median and p90.
//
// Rows (1 MiB and 64 MiB are bf16 sum all-reduces):
//   NCCL    init, first all-reduce after init (the lazy connect), a second one, split, first
//           all-reduce after split, finalize + destroy, abort, revoke (where the library has it);
//           on-demand rebuild = split + first all-reduce
//   reccl   split, communicator create (scratch window + device communicator + handshake),
//           window register (W MiB), first reccl all-reduce, a second one, communicator destroy;
//           on-demand rebuild = split + create + windows + first all-reduce
//   pool    build time and device memory per shape (cudaMemGetInfo deltas, windows stated),
//           switch (handle swap), first all-reduce after a switch vs the next one (1 and 64 MiB,
//           reccl and NCCL), CUDA-graph recapture, retirement (caller-visible, background, an
//           all-reduce while it runs), rebuild, shutdown; bad input (unknown shape, a shape that
//           does not partition the ranks, a switch with work in flight, a budget too small)
// Output: a table on stdout and JSON (--out).
#include <cuda_bf16.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <emmintrin.h>

#include "reccl/host/pool/nccl_backend.hpp"

namespace {

using reccl::dtype;
using reccl::redop;
using clk = std::chrono::steady_clock;

#define CK(x)                                                                                       \
  do {                                                                                              \
    cudaError_t e_ = (x);                                                                           \
    if (e_ != cudaSuccess) throw std::runtime_error(std::string(#x) + ": " + cudaGetErrorString(e_)); \
  } while (0)
#define NK(x)                                                                                        \
  do {                                                                                               \
    ncclResult_t r_ = (x);                                                                           \
    if (r_ != ncclSuccess) throw std::runtime_error(std::string(#x) + ": " + ncclGetErrorString(r_)); \
  } while (0)

struct options {
  int ranks = 2, trials = 10, switch_trials = 1000, window_mib = 64;
  double timeout_s = 280;
  std::string out = "lifecycle.json";
};

// ---- cross-process barrier and sample exchange --------------------------------------------------

struct shared_area {
  std::atomic<std::uint32_t> count{0}, gen{0};
  std::atomic<std::int32_t> failed{0};
  ncclUniqueId id;
  double v[64];
  char msg[64][512];
};

struct ctx {
  int rank = 0, n = 0;
  shared_area* sh = nullptr;

  void barrier() const {
    std::uint32_t const g = sh->gen.load(std::memory_order_acquire);
    if (sh->count.fetch_add(1, std::memory_order_acq_rel) == static_cast<std::uint32_t>(n - 1)) {
      sh->count.store(0, std::memory_order_relaxed);
      sh->gen.fetch_add(1, std::memory_order_release);
      return;
    }
    auto const deadline = clk::now() + std::chrono::seconds(120);
    std::uint32_t spins = 0;
    while (sh->gen.load(std::memory_order_acquire) == g) {
      _mm_pause();
      if ((++spins & 0xfff) == 0) {
        if (sh->failed.load() != 0) throw std::runtime_error("another rank failed");
        if (clk::now() > deadline) throw std::runtime_error("barrier: a rank did not arrive within 120 s");
      }
    }
  }
  /// Max of x over ranks (every rank gets it).
  double max_over(double x) const {
    sh->v[rank] = x;
    barrier();
    double m = sh->v[0];
    for (int r = 1; r < n; ++r) m = std::max(m, sh->v[r]);
    barrier();
    return m;
  }
  /// Critical path of f in microseconds: from the common barrier to the slowest rank's return.
  template <class F>
  double timed(F&& f) const {
    barrier();
    auto const t0 = clk::now();
    f();
    auto const t1 = clk::now();
    return max_over(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
};

// ---- results ------------------------------------------------------------------------------------

struct row {
  std::string section, name, note;
  std::vector<double> us;  // recorded critical paths
};

double quantile(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  std::size_t k = static_cast<std::size_t>(std::ceil(q * static_cast<double>(v.size())));
  k = std::max<std::size_t>(k, 1);
  return v[k - 1];
}
double median(std::vector<double> const& v) {
  if (v.empty()) return NAN;
  std::vector<double> s = v;
  std::sort(s.begin(), s.end());
  std::size_t const m = s.size() / 2;
  return s.size() % 2 ? s[m] : 0.5 * (s[m - 1] + s[m]);
}

std::string jstr(std::string const& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\', o += c;
    else if (c == '\n') o += "\\n";
    else if (static_cast<unsigned char>(c) < 0x20) o += ' ';
    else o += c;
  }
  return o + "\"";
}
std::string jnum(double x) {
  if (!std::isfinite(x)) return "null";
  char b[64];
  std::snprintf(b, sizeof b, "%.6g", x);
  return b;
}

struct results {
  std::vector<row> rows;
  std::vector<std::pair<std::string, std::string>> facts;  // key -> JSON value
  std::string section = "nccl";

  row& get(std::string const& name, std::string const& note = "") {
    for (auto& r : rows)
      if (r.name == name && r.section == section) return r;
    rows.push_back({section, name, note, {}});
    return rows.back();
  }
  void add(std::string const& name, double us, std::string const& note = "") { get(name, note).us.push_back(us); }
  void fact(std::string const& k, std::string const& json_value) {
    for (auto& f : facts)
      if (f.first == k) {
        f.second = json_value;
        return;
      }
    facts.emplace_back(k, json_value);
  }
  double med(std::string const& sec, std::string const& name) const {
    for (auto const& r : rows)
      if (r.section == sec && r.name == name) return median(r.us);
    return NAN;
  }
  double p90(std::string const& sec, std::string const& name) const {
    for (auto const& r : rows)
      if (r.section == sec && r.name == name) return quantile(r.us, 0.9);
    return NAN;
  }

  void write(std::string const& path) const {
    std::string j = "{\n";
    for (auto const& [k, v] : facts) j += "  " + jstr(k) + ": " + v + ",\n";
    j += "  \"rows\": [\n";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      auto const& r = rows[i];
      j += "    {\"section\": " + jstr(r.section) + ", \"name\": " + jstr(r.name) + ", \"trials\": " +
           std::to_string(r.us.size()) + ", \"median_us\": " + jnum(median(r.us)) + ", \"p90_us\": " +
           jnum(quantile(r.us, 0.9)) + ", \"min_us\": " + jnum(r.us.empty() ? NAN : *std::min_element(r.us.begin(), r.us.end())) +
           ", \"max_us\": " + jnum(r.us.empty() ? NAN : *std::max_element(r.us.begin(), r.us.end()));
      if (!r.note.empty()) j += ", \"note\": " + jstr(r.note);
      if (r.us.size() <= 64) {
        j += ", \"samples_us\": [";
        for (std::size_t k = 0; k < r.us.size(); ++k) j += (k ? ", " : "") + jnum(r.us[k]);
        j += "]";
      }
      j += i + 1 < rows.size() ? "},\n" : "}\n";
    }
    j += "  ]\n}\n";
    std::string const tmp = path + ".tmp";
    if (FILE* f = std::fopen(tmp.c_str(), "w")) {
      std::fputs(j.c_str(), f);
      std::fclose(f);
      std::rename(tmp.c_str(), path.c_str());
    }
  }

  void print() const {
    std::printf("\n%-8s %-58s %6s %12s %12s\n", "section", "step (critical path = max over ranks)", "trials", "median",
                "p90");
    auto fmt = [](double us) {
      char b[32];
      if (!std::isfinite(us)) std::snprintf(b, sizeof b, "-");
      else if (us >= 1e5) std::snprintf(b, sizeof b, "%.1f ms", us / 1e3);
      else if (us >= 1e3) std::snprintf(b, sizeof b, "%.2f ms", us / 1e3);
      else std::snprintf(b, sizeof b, "%.2f us", us);
      return std::string(b);
    };
    for (auto const& r : rows)
      std::printf("%-8s %-58s %6zu %12s %12s%s%s\n", r.section.c_str(), r.name.c_str(), r.us.size(),
                  fmt(median(r.us)).c_str(), fmt(quantile(r.us, 0.9)).c_str(), r.note.empty() ? "" : "  # ",
                  r.note.c_str());
  }
};

// ---- device helpers -----------------------------------------------------------------------------

__global__ void fill_bf16(__nv_bfloat16* p, std::size_t n, std::uint32_t seed) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint32_t x = static_cast<std::uint32_t>(i) * 0x9E3779B1u ^ seed * 0x85EBCA77u;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    p[i] = __float2bfloat16(static_cast<float>(static_cast<int>(x % 2001u) - 1000) / 256.0f);
  }
}
__global__ void count_diff(std::uint16_t const* a, std::uint16_t const* b, std::size_t n, unsigned long long* c) {
  unsigned long long local = 0;
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    local += a[i] != b[i];
  if (local) atomicAdd(c, local);
}

std::string now_utc() {
  std::time_t t = std::time(nullptr);
  char b[64];
  std::strftime(b, sizeof b, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return b;
}

// ---- one rank -----------------------------------------------------------------------------------

int rank_main(options const& opt, int rank, shared_area* sh, std::string const& id_file) {
  ctx c{rank, opt.ranks, sh};
  results res;
  bool const lead = rank == 0;
  auto say = [&](char const* what) {
    if (lead) {
      std::printf("[lifecycle] %s\n", what);
      std::fflush(stdout);
    }
  };
  auto save = [&] {
    if (lead) res.write(opt.out);
  };
  int const T = opt.trials;
  std::size_t const W = static_cast<std::size_t>(opt.window_mib) << 20;
  std::size_t const small = 1u << 20, large = std::min<std::size_t>(64u << 20, W);

  CK(cudaSetDevice(rank));
  CK(cudaFree(nullptr));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  auto sync = [&] { CK(cudaStreamSynchronize(s)); };
  void *pin = nullptr, *pout = nullptr, *pref = nullptr;
  CK(cudaMalloc(&pin, large));
  CK(cudaMalloc(&pout, large));
  CK(cudaMalloc(&pref, large));
  unsigned long long* dcount = nullptr;
  CK(cudaMalloc(&dcount, sizeof(*dcount)));
  fill_bf16<<<264, 512, 0, s>>>(static_cast<__nv_bfloat16*>(pin), large / 2, 1000u + rank);
  CK(cudaGetLastError());
  sync();
  auto mismatches = [&](void const* a, void const* b, std::size_t bytes) {
    CK(cudaMemsetAsync(dcount, 0, sizeof(*dcount), s));
    count_diff<<<264, 512, 0, s>>>(static_cast<std::uint16_t const*>(a), static_cast<std::uint16_t const*>(b), bytes / 2,
                                   dcount);
    unsigned long long h = 0;
    CK(cudaMemcpyAsync(&h, dcount, sizeof(h), cudaMemcpyDeviceToHost, s));
    sync();
    return h;
  };

  // facts
  if (lead) {
    cudaDeviceProp p{};
    CK(cudaGetDeviceProperties(&p, rank));
    int v = 0, drv = 0;
    ncclGetVersion(&v);
    cudaDriverGetVersion(&drv);
    std::size_t fr = 0, tot = 0;
    CK(cudaMemGetInfo(&fr, &tot));
    res.fact("benchmark", jstr("reccl lifecycle"));
    res.fact("date_utc", jstr(now_utc()));
    res.fact("commit", jstr(std::getenv("RECCL_COMMIT") ? std::getenv("RECCL_COMMIT") : "unknown"));
    res.fact("gpu", jstr(p.name));
    res.fact("ranks", std::to_string(opt.ranks));
    res.fact("gpu_memory_bytes", std::to_string(tot));
    res.fact("cuda_driver", std::to_string(drv));
    res.fact("nccl_loaded", std::to_string(v));
    res.fact("nccl_headers", std::to_string(NCCL_VERSION_CODE));
    res.fact("nccl_revoke_available", reccl::nccl_pool_backend::has_revoke() ? "true" : "false");
    res.fact("nccl_nvls_enable", jstr(std::getenv("NCCL_NVLS_ENABLE") ? std::getenv("NCCL_NVLS_ENABLE") : "(unset)"));
    res.fact("trials", std::to_string(T));
    res.fact("window_bytes", std::to_string(W));
    res.fact("collective", jstr("all_reduce, bfloat16, sum; 1 MiB unless named"));
  }

  // world communicator: the id through a file
  ncclUniqueId wid;
  if (lead) {
    NK(ncclGetUniqueId(&wid));
    std::string const tmp = id_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f || std::fwrite(&wid, sizeof wid, 1, f) != 1) throw std::runtime_error("cannot write the id file");
    std::fclose(f);
    std::rename(tmp.c_str(), id_file.c_str());
  }
  c.barrier();
  if (!lead) {
    FILE* f = std::fopen(id_file.c_str(), "rb");
    if (!f || std::fread(&wid, sizeof wid, 1, f) != 1) throw std::runtime_error("cannot read the id file");
    std::fclose(f);
  }
  ncclComm_t world = nullptr;
  NK(ncclCommInitRank(&world, opt.ranks, wid, rank));
  NK(ncclAllReduce(pin, pout, small / 2, ncclBfloat16, ncclSum, world, s));
  sync();
  std::vector<ncclComm_t> leaked;  // children whose teardown is not measured: left to process exit

  auto nccl_ar = [&](ncclComm_t comm, std::size_t bytes) {
    NK(ncclAllReduce(pin, pout, bytes / 2, ncclBfloat16, ncclSum, comm, s));
    sync();
  };
  ncclConfig_t split_cfg = NCCL_CONFIG_INITIALIZER;
  split_cfg.splitShare = 0;
  auto revoke = reccl::detail::nccl_revoke();

  // ---- NCCL's own lifecycle --------------------------------------------------------------------
  say("NCCL lifecycle");
  res.section = "nccl";
  for (int t = 0; t <= T; ++t) {
    bool const rec = t > 0;
    if (lead) NK(ncclGetUniqueId(&sh->id));
    c.barrier();
    ncclUniqueId id = sh->id;
    ncclComm_t ci = nullptr, cs = nullptr;
    double const d_init = c.timed([&] { NK(ncclCommInitRank(&ci, opt.ranks, id, rank)); });
    double const d_first = c.timed([&] { nccl_ar(ci, small); });
    double const d_second = c.timed([&] { nccl_ar(ci, small); });
    double const d_split = c.timed([&] { NK(ncclCommSplit(world, 0, rank, &cs, &split_cfg)); });
    double const d_sfirst = c.timed([&] { nccl_ar(cs, small); });
    double const d_ssecond = c.timed([&] { nccl_ar(cs, small); });
    double const d_destroy = c.timed([&] {
      NK(ncclCommFinalize(cs));
      NK(ncclCommDestroy(cs));
    });
    double const d_abort = c.timed([&] { NK(ncclCommAbort(ci)); });
    double d_revoke = NAN, d_rdestroy = NAN;
    if (revoke != nullptr) {
      ncclComm_t cr = nullptr;
      NK(ncclCommSplit(world, 0, rank, &cr, &split_cfg));
      nccl_ar(cr, small);
      d_revoke = c.timed([&] { NK(revoke(cr, 0)); });
      d_rdestroy = c.timed([&] { NK(ncclCommDestroy(cr)); });
    }
    if (!rec) continue;
    res.add("init (ncclCommInitRank)", d_init);
    res.add("first all-reduce after init (lazy connect)", d_first);
    res.add("second all-reduce after init", d_second);
    res.add("split (ncclCommSplit, same ranks)", d_split);
    res.add("first all-reduce after split (lazy connect)", d_sfirst);
    res.add("second all-reduce after split", d_ssecond);
    res.add("on-demand rebuild = split + first all-reduce", d_split + d_sfirst);
    res.add("finalize + destroy (connected)", d_destroy);
    res.add("abort (connected)", d_abort);
    if (revoke != nullptr) {
      res.add("revoke (connected)", d_revoke);
      res.add("destroy after revoke", d_rdestroy);
    }
  }
  if (revoke == nullptr) res.get("revoke", "ncclCommRevoke not in the loaded NCCL (needs >= 2.28.7): not measured");
  save();

  // ---- reccl's lifecycle -----------------------------------------------------------------------
  say("reccl lifecycle");
  res.section = "reccl";
  reccl::nvlink_config rcfg;
  rcfg.timeout_ns = 5'000'000'000ull;
  for (int t = 0; t <= T; ++t) {
    bool const rec = t > 0;
    ncclComm_t cs = nullptr;
    std::optional<reccl::nvlink_communicator> rc;
    void *w0 = nullptr, *w1 = nullptr;
    double const d_split = c.timed([&] { NK(ncclCommSplit(world, 0, rank, &cs, &split_cfg)); });
    double const d_create = c.timed([&] { rc.emplace(reccl::nvlink_communicator::create(cs, rcfg)); });
    double const d_win0 = c.timed([&] { w0 = rc->allocate(W); });
    double const d_win1 = c.timed([&] { w1 = rc->allocate(W); });
    CK(cudaMemcpyAsync(w0, pin, small, cudaMemcpyDeviceToDevice, s));
    sync();
    double const d_first = c.timed([&] {
      rc->all_reduce(w0, w1, small / 2, dtype::bfloat16, redop::sum, s);
      sync();
    });
    double const d_second = c.timed([&] {
      rc->all_reduce(w0, w1, small / 2, dtype::bfloat16, redop::sum, s);
      sync();
    });
    double const d_plain = c.timed([&] {
      rc->all_reduce(pin, pout, small / 2, dtype::bfloat16, redop::sum, s);
      sync();
    });
    rc->check();
    if (t == T) {  // the result against NCCL's, bit for bit (two ranks: one rounding either way)
      NK(ncclAllReduce(pin, pref, small / 2, ncclBfloat16, ncclSum, world, s));
      sync();
      unsigned long long const bad_w = mismatches(w1, pref, small), bad_p = mismatches(pout, pref, small);
      double const m = c.max_over(static_cast<double>(bad_w + bad_p));
      if (lead) res.fact("reccl_vs_nccl_1MiB_mismatched_elements", jnum(m));
    }
    double const d_destroy = c.timed([&] { rc.reset(); });
    leaked.push_back(cs);
    if (!rec) continue;
    res.add("split (ncclCommSplit, same ranks)", d_split);
    res.add("create (scratch window + ncclDevCommCreate + handshake)", d_create);
    res.add("window register (ncclMemAlloc + WindowRegister, " + std::to_string(opt.window_mib) + " MiB)", d_win0);
    res.add("second window register", d_win1);
    res.add("first reccl all-reduce (windows; no NCCL connect needed)", d_first);
    res.add("second reccl all-reduce (windows)", d_second);
    res.add("reccl all-reduce on plain memory (after the first)", d_plain);
    res.add("on-demand rebuild = split + create + 2 windows + first", d_split + d_create + d_win0 + d_win1 + d_first);
    res.add("communicator destroy (device comm + windows)", d_destroy);
  }
  save();

  // ---- the pool -------------------------------------------------------------------------------
  say("pool");
  res.section = "pool";
  reccl::nccl_pool_options po;
  po.window_bytes = {W, W};
  po.reccl = rcfg;
  po.warm_bytes = small;
  reccl::nccl_pool_backend backend(world, po);
  reccl::pool_options o;
  o.shapes = reccl::tensor_parallel_shapes(opt.ranks);
  o.retire_bound = std::chrono::seconds(20);
  o.shutdown_bound = std::chrono::seconds(30);
  o.switch_wait = std::chrono::seconds(5);
  std::string const wide = o.shapes.front().name, narrow = o.shapes.back().name;
  std::optional<reccl::communicator_pool<reccl::nccl_pool_backend>> pool_storage;
  pool_storage.emplace(backend, o);
  auto& pool = *pool_storage;
  std::size_t fr0 = 0, tot = 0, stack0 = 0, stack1 = 0;
  CK(cudaMemGetInfo(&fr0, &tot));
  CK(cudaDeviceGetLimit(&stack0, cudaLimitStackSize));
  double const d_build = c.timed([&] { pool.build(); });
  std::size_t fr1 = 0;
  CK(cudaMemGetInfo(&fr1, &tot));
  CK(cudaDeviceGetLimit(&stack1, cudaLimitStackSize));
  if (lead) res.fact("cuda_stack_limit_bytes_before_after_build", "[" + std::to_string(stack0) + ", " + std::to_string(stack1) + "]");
  res.add("build every shape (" + std::to_string(o.shapes.size()) + ")", d_build);
  {
    auto rep = pool.report();
    std::string mem = "[";
    std::uint64_t total = 0;
    for (std::size_t i = 0; i < rep.size(); ++i) {
      double const b_ns = c.max_over(static_cast<double>(rep[i].build_ns));
      res.add("build " + rep[i].name + " (split + create + windows + warm-up)", b_ns / 1e3);
      total += rep[i].bytes;
      auto& g = pool.at(static_cast<reccl::shape_id>(i));
      mem += std::string(i ? ", " : "") + "{\"shape\": " + jstr(rep[i].name) + ", \"groups\": " + std::to_string(rep[i].groups) +
             ", \"group_size\": " + std::to_string(rep[i].my_group_size) + ", \"bytes_max_over_ranks\": " +
             std::to_string(rep[i].bytes) + ", \"mib\": " + jnum(static_cast<double>(rep[i].bytes) / (1 << 20)) +
             ", \"fraction_of_gpu\": " + jnum(static_cast<double>(rep[i].bytes) / static_cast<double>(tot)) +
             ", \"reccl\": " + (g.reccl() ? "true" : "false") +
             (g.reccl() ? std::string() : ", \"reccl_unavailable\": " + jstr(g.reccl_unavailable())) + "}";
    }
    mem += "]";
    double const worst_delta = c.max_over(static_cast<double>(fr0) - static_cast<double>(fr1));
    if (lead) {
      res.fact("pool_windows", jstr("2 x " + std::to_string(opt.window_mib) + " MiB per group per rank"));
      res.fact("pool_shapes", mem);
      res.fact("pool_bytes_all_shapes", std::to_string(total));
      res.fact("pool_bytes_build_delta_max_over_ranks", jnum(worst_delta));
      res.fact("pool_fraction_of_gpu_memory", jnum(static_cast<double>(total) / static_cast<double>(tot)));
    }
  }
  save();
  reccl::shape_id const A = pool.find(wide), B = pool.find(narrow);

  // switch: a handle swap, alternating shapes, no recapture
  say("switch");
  // one step on each shape through the group's wrappers, so that each switch checks a real fence
  for (reccl::shape_id id : {B, A}) {
    auto& g = pool.switch_to(id);
    g.nccl_all_reduce(pin, pout, small / 2, ncclBfloat16, ncclSum, s);
    if (g.reccl()) g.all_reduce(g.window(0), g.window(1), small / 2, dtype::bfloat16, redop::sum, s);
    sync();
  }
  for (int i = 0; i <= opt.switch_trials; ++i) {
    c.barrier();
    auto const t0 = clk::now();
    auto& g = pool.switch_to(i % 2 ? A : B);
    auto const t1 = clk::now();
    double const d = c.max_over(std::chrono::duration<double, std::micro>(t1 - t0).count());
    if (g.size() < 1) throw std::runtime_error("switch returned an empty group");
    if (i > 0) res.add("switch (handle swap, no recapture)", d);
  }

  // the first collective after a switch against the next one, same size
  say("first collective after a switch");
  for (std::size_t bytes : {small, large}) {
    std::string const sz = bytes == small ? "1 MiB" : std::to_string(bytes >> 20) + " MiB";
    for (int t = 0; t <= T; ++t) {
      auto step_on_narrow = [&] {
        auto& g1 = pool.switch_to(B);
        if (g1.reccl()) g1.all_reduce(g1.window(0), g1.window(1), bytes / 2, dtype::bfloat16, redop::sum, s);
        else g1.nccl_all_reduce(pin, pout, bytes / 2, ncclBfloat16, ncclSum, s);
        sync();
      };
      step_on_narrow();
      auto& g = pool.switch_to(A);
      CK(cudaMemcpyAsync(g.window(0), pin, bytes, cudaMemcpyDeviceToDevice, s));
      sync();
      double const r_first = c.timed([&] {
        g.all_reduce(g.window(0), g.window(1), bytes / 2, dtype::bfloat16, redop::sum, s);
        sync();
      });
      double const r_next = c.timed([&] {
        g.all_reduce(g.window(0), g.window(1), bytes / 2, dtype::bfloat16, redop::sum, s);
        sync();
      });
      step_on_narrow();
      auto& h = pool.switch_to(A);
      double const n_first = c.timed([&] {
        h.nccl_all_reduce(pin, pout, bytes / 2, ncclBfloat16, ncclSum, s);
        sync();
      });
      double const n_next = c.timed([&] {
        h.nccl_all_reduce(pin, pout, bytes / 2, ncclBfloat16, ncclSum, s);
        sync();
      });
      if (t == T) {
        unsigned long long const bad = mismatches(g.window(1), pout, bytes);
        double const m = c.max_over(static_cast<double>(bad));
        if (lead) res.fact("pool_reccl_vs_nccl_" + std::to_string(bytes >> 20) + "MiB_mismatched_elements", jnum(m));
      }
      if (t == 0) continue;
      res.add("reccl first all-reduce after a switch, " + sz, r_first);
      res.add("reccl next all-reduce (steady), " + sz, r_next);
      res.add("NCCL first all-reduce after a switch, " + sz, n_first);
      res.add("NCCL next all-reduce (steady), " + sz, n_next);
    }
  }
  pool.active().reccl()->check();
  save();

  // CUDA-graph recapture of the step (timed apart from the switch)
  say("graph recapture");
  {
    cudaGraphExec_t exec = nullptr;
    int updates = 0, instantiations = 0;
    for (int t = 0; t <= 2 * T; ++t) {
      auto& g = pool.switch_to(t % 2 ? B : A);
      bool updated = false;
      double const d = c.timed([&] {
        updated = reccl::recapture(s, exec, [&](cudaStream_t st) {
          if (g.reccl()) g.all_reduce(g.window(0), g.window(1), small / 2, dtype::bfloat16, redop::sum, st);
          g.nccl_all_reduce(pin, pout, small / 2, ncclBfloat16, ncclSum, st);
        });
      });
      CK(cudaGraphLaunch(exec, s));
      sync();
      if (t == 0) continue;
      (updated ? updates : instantiations)++;
      res.add("graph recapture after a switch (capture + update or instantiate)", d,
              "one reccl and one NCCL 1 MiB all-reduce per step");
    }
    if (lead) res.fact("graph_recapture_updates_vs_instantiations", "[" + std::to_string(updates) + ", " +
                                                                     std::to_string(instantiations) + "]");
    // the same shape again: the captured graph has the same topology, so it is updated in place
    int same_updates = 0;
    auto& g = pool.switch_to(A);
    for (int t = 0; t <= T; ++t) {
      bool updated = false;
      double const d = c.timed([&] {
        updated = reccl::recapture(s, exec, [&](cudaStream_t st) {
          g.all_reduce(g.window(0), g.window(1), small / 2, dtype::bfloat16, redop::sum, st);
          g.nccl_all_reduce(pin, pout, small / 2, ncclBfloat16, ncclSum, st);
        });
      });
      CK(cudaGraphLaunch(exec, s));
      sync();
      if (t == 0) continue;
      same_updates += updated;
      res.add("graph recapture, same shape (capture + update in place)", d);
    }
    if (lead) res.fact("graph_recapture_same_shape_updates", std::to_string(same_updates));
    if (exec) CK(cudaGraphExecDestroy(exec));
  }
  save();

  // bad input
  say("bad input");
  {
    std::string unknown, partition, busy_fail;
    try {
      pool.switch_to("TP3");
    } catch (reccl::pool_error const& e) {
      unknown = e.what();
    }
    try {
      reccl::validate_shape({"bad", {{0}, {0}}}, opt.ranks);
    } catch (reccl::pool_error const& e) {
      partition = e.what();
    }
    // a switch with work in flight on the old shape: fail at once, or wait for it (bounded)
    auto& g = pool.switch_to(A);
    for (int k = 0; k < 8; ++k) g.all_reduce(g.window(0), g.window(1), large / 2, dtype::bfloat16, redop::sum, s);
    bool const was_busy = pool.backend().in_flight(g);
    try {
      pool.switch_to(B, reccl::busy_policy::fail);
    } catch (reccl::pool_error const& e) {
      busy_fail = e.what();
    }
    auto const t0 = clk::now();
    pool.switch_to(B, reccl::busy_policy::wait);
    double const waited = std::chrono::duration<double, std::micro>(clk::now() - t0).count();
    sync();
    double const waited_max = c.max_over(waited);
    double const busy_any = c.max_over(was_busy ? 1.0 : 0.0);
    if (lead) {
      res.fact("bad_input_unknown_shape", jstr(unknown));
      res.fact("bad_input_not_a_partition", jstr(partition));
      res.fact("bad_input_switch_in_flight_fail", jstr(busy_any > 0 ? busy_fail : "(work had finished already)"));
      res.fact("bad_input_switch_in_flight_wait_us", jnum(waited_max));
    }
  }
  {
    std::string budget_msg;
    reccl::pool_options ob = o;
    ob.memory_budget_bytes = 1 << 20;
    {
      reccl::communicator_pool<reccl::nccl_pool_backend> small_pool(backend, ob);
      try {
        small_pool.build();
      } catch (reccl::pool_error const& e) {
        budget_msg = e.what();
      }
      small_pool.drain(std::chrono::seconds(30));
    }
    if (lead) res.fact("bad_input_budget_too_small", jstr(budget_msg));
  }
  save();

  // retirement: caller-visible cost, background teardown, an all-reduce while it runs, rebuild
  say("retirement");
  auto teardown_of = [&](std::string const& shape) {
    auto rr = pool.retirements();
    for (auto it = rr.rbegin(); it != rr.rend(); ++it)
      if (it->shape == shape) return *it;
    return reccl::retirement_record{};
  };
  std::vector<double> reb_bytes_n, reb_bytes_w;  // memory of each rebuild: no one-time process costs left in it
  for (int t = 0; t <= T; ++t) {
    bool const rec = t > 0;
    auto& g = pool.switch_to(A);
    double const d_ret_n = c.timed([&] { pool.retire(B); });
    double const d_during = c.timed([&] {
      g.all_reduce(g.window(0), g.window(1), small / 2, dtype::bfloat16, redop::sum, s);
      sync();
    });
    if (!pool.drain(std::chrono::seconds(60))) throw std::runtime_error("retirement did not drain");
    auto const rn = teardown_of(narrow);
    double const bg_n = c.max_over(static_cast<double>(rn.teardown_ns()) / 1e3);
    double const d_reb_n = c.timed([&] { pool.rebuild(B); });
    pool.switch_to(B);
    double const d_ret_w = c.timed([&] { pool.retire(A); });
    if (!pool.drain(std::chrono::seconds(60))) throw std::runtime_error("retirement did not drain");
    auto const rw = teardown_of(wide);
    double const bg_w = c.max_over(static_cast<double>(rw.teardown_ns()) / 1e3);
    double const d_reb_w = c.timed([&] { pool.rebuild(A); });
    for (auto const* r : {&rn, &rw})
      if (lead && r->state != reccl::retirement_state::released)
        res.fact("retirement_problem_" + r->shape, jstr(std::string(reccl::name(r->state)) + ": " + r->message));
    if (!rec) continue;
    reb_bytes_n.push_back(static_cast<double>(pool.report()[static_cast<std::size_t>(B)].bytes));
    reb_bytes_w.push_back(static_cast<double>(pool.report()[static_cast<std::size_t>(A)].bytes));
    res.add("retire " + narrow + " (caller-visible)", d_ret_n);
    res.add("retire " + wide + " (caller-visible)", d_ret_w);
    res.add("reccl all-reduce on " + wide + " while " + narrow + " is torn down", d_during);
    res.add("background teardown of " + narrow + " (finalize + destroy)", bg_n);
    res.add("background teardown of " + wide + " (finalize + destroy)", bg_w);
    res.add("rebuild " + narrow, d_reb_n);
    res.add("rebuild " + wide, d_reb_w);
  }
  if (lead) {
    auto mib = [](std::vector<double> const& v) {
      std::string o = "{\"median_mib\": " + jnum(median(v) / (1 << 20)) + ", \"min_mib\": " +
                      jnum(*std::min_element(v.begin(), v.end()) / (1 << 20)) + ", \"max_mib\": " +
                      jnum(*std::max_element(v.begin(), v.end()) / (1 << 20)) + "}";
      return o;
    };
    res.fact("pool_rebuild_memory", "{" + jstr(narrow) + ": " + mib(reb_bytes_n) + ", " + jstr(wide) + ": " +
                                        mib(reb_bytes_w) + "}");
  }
  save();

  say("shutdown");
  reccl::shutdown_report rep;
  double const d_shut = c.timed([&] { rep = pool.shutdown(); });
  res.add("shutdown (retire every shape, drain)", d_shut);
  if (lead) res.fact("shutdown_report", jstr(rep.describe()));

  // verdicts against the issue's targets
  if (lead) {
    double const sw50 = res.med("pool", "switch (handle swap, no recapture)");
    double const sw90 = res.p90("pool", "switch (handle swap, no recapture)");
    auto ratio = [&](std::string const& who, std::string const& sz) {
      return res.med("pool", who + " first all-reduce after a switch, " + sz) /
             res.med("pool", who + " next all-reduce (steady), " + sz);
    };
    std::string const lsz = std::to_string(large >> 20) + " MiB";
    double const rr1 = ratio("reccl", "1 MiB"), rr64 = ratio("reccl", lsz), nr1 = ratio("NCCL", "1 MiB"),
                 nr64 = ratio("NCCL", lsz);
    double const ret = std::max(res.p90("pool", "retire " + narrow + " (caller-visible)"),
                                res.p90("pool", "retire " + wide + " (caller-visible)"));
    double total = 0;
    for (auto const& f : res.facts)
      if (f.first == "pool_fraction_of_gpu_memory") total = std::atof(f.second.c_str());
    std::string v = "{";
    v += "\"switch_p50_us\": " + jnum(sw50) + ", \"switch_p90_us\": " + jnum(sw90) +
         ", \"switch_ok\": " + (sw50 <= 20 && sw90 <= 50 ? "true" : "false");
    v += ", \"nccl_on_demand_rebuild_us\": " + jnum(res.med("nccl", "on-demand rebuild = split + first all-reduce"));
    v += ", \"reccl_on_demand_rebuild_us\": " + jnum(res.med("reccl", "on-demand rebuild = split + create + 2 windows + first"));
    v += ", \"first_over_steady\": {\"reccl_1MiB\": " + jnum(rr1) + ", \"reccl_large\": " + jnum(rr64) +
         ", \"nccl_1MiB\": " + jnum(nr1) + ", \"nccl_large\": " + jnum(nr64) + "}";
    v += ", \"first_within_1_2x\": " + std::string(rr1 <= 1.2 && rr64 <= 1.2 && nr1 <= 1.2 && nr64 <= 1.2 ? "true" : "false");
    v += ", \"retire_caller_p90_us\": " + jnum(ret) + ", \"retire_ok\": " + (ret <= 1000 ? "true" : "false");
    v += ", \"memory_fraction\": " + jnum(total) + ", \"memory_ok\": " + (total <= 0.02 ? "true" : "false");
    v += "}";
    res.fact("verdicts", v);
    res.write(opt.out);
    res.print();
    std::printf("\nfacts:\n");
    for (auto const& [k, val] : res.facts) std::printf("  %s: %s\n", k.c_str(), val.c_str());
    std::printf("\nJSON: %s\n", opt.out.c_str());
    std::fflush(stdout);
  }
  c.barrier();
  pool_storage.reset();
  // The world and the leaked children are left to process exit: their teardown (0.5 s each) is
  // measured above and would only lengthen the run.
  (void)leaked;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  options opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--ranks") opt.ranks = std::stoi(next());
    else if (a == "--trials") opt.trials = std::stoi(next());
    else if (a == "--switch-trials") opt.switch_trials = std::stoi(next());
    else if (a == "--window-mib") opt.window_mib = std::stoi(next());
    else if (a == "--out") opt.out = next();
    else if (a == "--timeout-s") opt.timeout_s = std::stod(next());
    else {
      std::fprintf(stderr,
                   "usage: %s [--ranks N] [--trials T] [--switch-trials S] [--window-mib W] [--out FILE] "
                   "[--timeout-s S]\n",
                   argv[0]);
      return 2;
    }
  }
  if (opt.ranks < 2 || opt.ranks > 64 || opt.trials < 1 || opt.switch_trials < 1 || opt.window_mib < 1) {
    std::fprintf(stderr, "bad arguments\n");
    return 2;
  }
  setenv("NCCL_NVLS_ENABLE", "0", 1);  // never NVLink multicast on the shared machines

  char dir_tmpl[] = "/tmp/reccl_lifecycle_XXXXXX";
  char* dir = mkdtemp(dir_tmpl);
  if (!dir) {
    std::perror("mkdtemp");
    return 1;
  }
  std::string const shm_file = std::string(dir) + "/shared", id_file = std::string(dir) + "/world_id";
  int fd = open(shm_file.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0 || ftruncate(fd, sizeof(shared_area)) != 0) {
    std::perror("shared file");
    return 1;
  }
  void* mem = mmap(nullptr, sizeof(shared_area), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    return 1;
  }
  auto* sh = new (mem) shared_area();

  std::vector<pid_t> kids;
  for (int r = 0; r < opt.ranks; ++r) {
    pid_t const pid = fork();
    if (pid == 0) {
      int rc = 1;
      try {
        rc = rank_main(opt, r, sh, id_file);
      } catch (std::exception const& e) {
        std::snprintf(sh->msg[r], sizeof sh->msg[r], "%s", e.what());
        std::fprintf(stderr, "rank %d: error: %s\n", r, e.what());
        sh->failed.store(1);
      }
      std::fflush(stdout);
      std::fflush(stderr);
      _exit(rc);
    }
    kids.push_back(pid);
  }
  auto const deadline = clk::now() + std::chrono::duration<double>(opt.timeout_s);
  int worst = 0;
  std::size_t left = kids.size();
  while (left > 0) {
    for (auto& k : kids) {
      if (k <= 0) continue;
      int st = 0;
      pid_t const w = waitpid(k, &st, WNOHANG);
      if (w == k) {
        int const code = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        worst = std::max(worst, code);
        k = -1;
        --left;
      }
    }
    if (left == 0) break;
    if (clk::now() > deadline) {
      std::fprintf(stderr, "lifecycle: ranks still running after %.0f s: killed (partial JSON kept)\n", opt.timeout_s);
      for (auto k : kids)
        if (k > 0) kill(k, SIGKILL);
      for (auto k : kids)
        if (k > 0) waitpid(k, nullptr, 0);
      worst = std::max(worst, 124);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  unlink(shm_file.c_str());
  unlink(id_file.c_str());
  rmdir(dir);
  return worst;
}
