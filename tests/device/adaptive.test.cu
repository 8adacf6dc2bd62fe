// GPU tests of the adaptive loop (host/adaptive.hpp): results stay bitwise right while the device
// moves bytes between VTs, a dead VT is recovered inside the collective and brought back by a
// probe, a captured graph adapts on replay, and a lost rank is a clean error that names it.
// One process drives every rank: NCCL-backed ranks on >= 2 GPUs, else loopback ranks on GPU 0
// (RECCL_TEST_LOOPBACK=N forces N loopback ranks).
#include "../doctest_main.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>

#include "../../bench/perf/reference.cuh"
#include "reccl/host/adaptive.hpp"
#include "reccl/host/nvlink_collective.hpp"
#include "reccl/policy/allocator/aimd.hpp"
#include "reccl/policy/allocator/equal.hpp"
#include "reccl/policy/telemetry/none.hpp"
#include "support.cuh"

using namespace gpu_test;

namespace {

constexpr std::size_t cap = 16u << 20;  // bytes per test buffer

struct world {
  int n = 0;
  bool loop = false;
  std::vector<ncclComm_t> nccl;
  std::vector<reccl::nvlink_communicator> comms;
  std::vector<cudaStream_t> streams;
  std::vector<char*> in, out;
  std::mt19937_64 rng{20261201};
  int dev(int r) const { return loop ? 0 : r; }
  std::vector<reccl::nvlink_communicator*> ptrs() {
    std::vector<reccl::nvlink_communicator*> p;
    for (auto& c : comms) p.push_back(&c);
    return p;
  }
  void sync() {
    for (int r = 0; r < n; ++r) {
      TEST_CK(cudaSetDevice(dev(r)));
      TEST_CK(cudaStreamSynchronize(streams[r]));
    }
  }
};

world* g_world = nullptr;

reccl::nvlink_config test_config(world const& w) {
  reccl::nvlink_config cfg;
  cfg.lanes = 3;
  cfg.timeout_ns = 2'000'000'000ull;
  if (w.loop) {
    int sms = 0;
    TEST_CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    cfg.max_ctas = sms / w.n;
  }
  return cfg;
}

void build_comms(world& w) {
  w.comms.clear();
  reccl::nvlink_config const cfg = test_config(w);
  w.comms = w.loop ? reccl::nvlink_communicator::create_loopback(w.n, 0, cfg)
                   : reccl::nvlink_communicator::create_all(w.nccl, cfg);
}

world* get_world() {
  if (g_world != nullptr) return g_world;
  int ndev = 0;
  if (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev < 1) return nullptr;
  auto* w = new world;
  char const* lb = std::getenv("RECCL_TEST_LOOPBACK");
  w->loop = ndev < 2 || (lb != nullptr && std::atoi(lb) > 0);
  if (w->loop) {
    w->n = lb != nullptr && std::atoi(lb) > 0 ? std::min(std::atoi(lb), 8) : 2;
  } else {
    w->n = std::min(ndev, 8);
    w->nccl.resize(w->n);
    std::vector<int> devs(w->n);
    for (int i = 0; i < w->n; ++i) devs[i] = i;
    TEST_NK(ncclCommInitAll(w->nccl.data(), w->n, devs.data()));
  }
  build_comms(*w);
  for (int r = 0; r < w->n; ++r) {
    TEST_CK(cudaSetDevice(w->dev(r)));
    cudaStream_t s;
    TEST_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    w->streams.push_back(s);
    char *a, *b;
    TEST_CK(cudaMalloc(&a, cap));
    TEST_CK(cudaMalloc(&b, cap));
    w->in.push_back(a);
    w->out.push_back(b);
  }
  std::string const world = std::string(w->loop ? "loopback: " : "NCCL: ") + std::to_string(w->n) + " ranks";
  MESSAGE(world);
  g_world = w;
  return w;
}

#define REQUIRE_WORLD()                   \
  world* wp = get_world();                \
  if (wp == nullptr) SKIP_CASE("no GPU"); \
  world& w = *wp

/// One collective on every rank through `lanes`, checked bitwise against the CPU reference on
/// fresh random inputs (outputs poisoned first). Returns "" or what went wrong.
template <class L>
std::string run_checked(world& w, std::vector<L>& lanes, collective c, dtype t, redop op, std::uint64_t count,
                        bool in_place, int root = 0) {
  int const n = w.n;
  std::size_t const es = reccl::size_of(t);
  std::uint64_t const ie = count * in_segments(c, n), oe = count * out_segments(c, n);
  if (std::max(ie, oe) * es > cap) return "case too large";
  std::vector<std::vector<unsigned char>> in(n, std::vector<unsigned char>(ie * es));
  for (int r = 0; r < n; ++r)
    for (std::uint64_t i = 0; i < ie; ++i) put_elem(in[r], i, es, random_bits(t, w.rng));
  std::vector<char*> ip(n), op_(n);
  for (int r = 0; r < n; ++r) {
    if (!in_place) {
      ip[r] = w.in[r];
      op_[r] = w.out[r];
    } else {
      switch (c) {
        case collective::reduce_scatter: ip[r] = w.out[r]; op_[r] = w.out[r] + r * count * es; break;
        case collective::all_gather: op_[r] = w.out[r]; ip[r] = w.out[r] + r * count * es; break;
        default: ip[r] = op_[r] = w.out[r]; break;
      }
    }
    TEST_CK(cudaSetDevice(w.dev(r)));
    std::vector<unsigned char> poison(oe * es, 0xA5);
    if (!poison.empty()) TEST_CK(cudaMemcpy(op_[r], poison.data(), poison.size(), cudaMemcpyHostToDevice));
    std::size_t const in_bytes = (in_place && c == collective::all_gather) ? count * es : ie * es;
    if (in_bytes) TEST_CK(cudaMemcpy(ip[r], in[r].data(), in_bytes, cudaMemcpyHostToDevice));
  }
  for (int r = 0; r < n; ++r) {
    TEST_CK(cudaSetDevice(w.dev(r)));
    TEST_CK(cudaDeviceSynchronize());
  }
  for (int r = 0; r < n; ++r) {
    switch (c) {
      case collective::all_reduce: lanes[r].all_reduce(ip[r], op_[r], count, t, op, w.streams[r]); break;
      case collective::reduce_scatter: lanes[r].reduce_scatter(ip[r], op_[r], count, t, op, w.streams[r]); break;
      case collective::all_gather: lanes[r].all_gather(ip[r], op_[r], count, t, w.streams[r]); break;
      case collective::broadcast: lanes[r].broadcast(ip[r], op_[r], count, t, root, w.streams[r]); break;
      case collective::all_to_all: lanes[r].all_to_all(ip[r], op_[r], count, t, w.streams[r]); break;
    }
  }
  w.sync();
  for (int r = 0; r < n; ++r) {
    try {
      w.comms[r].check();
    } catch (reccl::error const& e) {
      return std::string("rank ") + std::to_string(r) + ": " + e.what() + " (error_info " +
             std::to_string(lanes[r].error_info()) + ")";
    }
    std::vector<unsigned char> got(oe * es);
    TEST_CK(cudaSetDevice(w.dev(r)));
    if (!got.empty()) TEST_CK(cudaMemcpy(got.data(), op_[r], got.size(), cudaMemcpyDeviceToHost));
    std::vector<unsigned char> const exp = expected_output(c, t, op, root, count, r, in);
    for (std::uint64_t i = 0; i < oe; ++i)
      if (get_elem(got, i, es) != get_elem(exp, i, es)) {
        std::ostringstream o;
        o << "rank " << r << " element " << i << " of " << oe << ": got 0x" << std::hex << get_elem(got, i, es)
          << " expected 0x" << get_elem(exp, i, es);
        return o.str();
      }
  }
  return "";
}

template <class L>
std::vector<L> make_lanes(world& w, reccl::adaptive_options o) {
  return L::create_all(w.ptrs(), o);
}


/// The composed types collective_op<K, T, schedule::one_shot, transport::nvlink, M, A> behind the
/// interface run_checked drives (one per rank): the loop is the one the communicator's lane holds.
template <class A, class M>
struct composed_lane {
  using any_op = reccl::all_reduce<float, reccl::schedule::one_shot, reccl::transport::nvlink, M, A>;
  reccl::nvlink_communicator* comm;
  int lane;
  template <collective K>
  void go(void const* in, void* out, std::uint64_t count, dtype t, redop op, int root, cudaStream_t s) {
    bool const ok = reccl::device::with_compiled_dtype<bool>(t, false, [&](auto e) {
      using T = typename decltype(e)::type;
      using op_t = reccl::collective_op<K, T, reccl::schedule::one_shot, reccl::transport::nvlink, M, A>;
      reccl::nvlink_call_options o;
      o.lane = lane;
      o.root = root;
      reccl::plan const p = op_t::run(*comm, static_cast<T const*>(in), static_cast<T*>(out), count, op, s, o);
      if (count != 0 && p.algo != reccl::algorithm::pipelined)
        throw reccl::error(reccl::status::internal, "the adaptive composed type ran another engine");
      return true;
    });
    if (!ok) throw reccl::error(reccl::status::invalid_argument, "dtype not compiled");
  }
  void all_reduce(void const* i, void* o, std::uint64_t n, dtype t, redop op, cudaStream_t s) { go<collective::all_reduce>(i, o, n, t, op, 0, s); }
  void reduce_scatter(void const* i, void* o, std::uint64_t n, dtype t, redop op, cudaStream_t s) {
    go<collective::reduce_scatter>(i, o, n, t, op, 0, s);
  }
  void all_gather(void const* i, void* o, std::uint64_t n, dtype t, cudaStream_t s) { go<collective::all_gather>(i, o, n, t, redop::sum, 0, s); }
  void broadcast(void const* i, void* o, std::uint64_t n, dtype t, int root, cudaStream_t s) {
    go<collective::broadcast>(i, o, n, t, redop::sum, root, s);
  }
  void all_to_all(void const* i, void* o, std::uint64_t n, dtype t, cudaStream_t s) { go<collective::all_to_all>(i, o, n, t, redop::sum, 0, s); }
  reccl::adaptive_lane<A, M>& loop() const { return reccl::lane_of<any_op>(*comm, lane); }
  std::uint32_t error_info() const { return loop().error_info(); }
};
}  // namespace

/// Captures `per_graph` float sum all-reduces of `count` elements through lanes[r] into one graph
/// per rank (inputs filled from `seed`; before_capture(r) runs first, on rank r's device), then
/// replays the graphs `replays` times, outputs poisoned before each replay, and checks every rank
/// against the CPU reference after each.
template <class L, class Before>
void capture_and_replay(world& w, std::vector<L>& lanes, std::uint64_t count, int per_graph, int replays, int seed,
                       char const* label, Before before_capture) {
  std::vector<cudaGraphExec_t> execs(w.n);
  std::vector<unsigned char> const want =
      host_expected(collective::all_reduce, dtype::float32, redop::sum, 0, count, 0, w.n, seed);
  for (int r = 0; r < w.n; ++r) {
    TEST_CK(cudaSetDevice(w.dev(r)));
    before_capture(r);
    reccl::bench::fill(dtype::float32, w.in[r], count, seed, r, 0, w.streams[r]);
    TEST_CK(cudaStreamSynchronize(w.streams[r]));
    cudaGraph_t g;
    TEST_CK(cudaStreamBeginCapture(w.streams[r], cudaStreamCaptureModeThreadLocal));
    for (int k = 0; k < per_graph; ++k) lanes[r].all_reduce(w.in[r], w.out[r], count, dtype::float32, redop::sum, w.streams[r]);
    TEST_CK(cudaStreamEndCapture(w.streams[r], &g));
    TEST_CK(cudaGraphInstantiate(&execs[r], g, 0));
    TEST_CK(cudaGraphDestroy(g));
  }
  for (int rep = 0; rep < replays; ++rep) {
    for (int r = 0; r < w.n; ++r) {
      TEST_CK(cudaSetDevice(w.dev(r)));
      reccl::bench::poison(dtype::float32, w.out[r], count, w.streams[r]);
      TEST_CK(cudaGraphLaunch(execs[r], w.streams[r]));
    }
    w.sync();
    for (int r = 0; r < w.n; ++r) {
      w.comms[r].check();
      TEST_CK(cudaSetDevice(w.dev(r)));
      std::string const what = std::string(label) + " replay " + std::to_string(rep) + " rank " + std::to_string(r);
      std::uint64_t const wrong = count_wrong(dtype::float32, w.out[r], want, what.c_str());
      CHECK_MESSAGE(wrong == 0, what << ": " << wrong << " wrong");
    }
  }
  for (int r = 0; r < w.n; ++r) {
    TEST_CK(cudaSetDevice(w.dev(r)));
    TEST_CK(cudaGraphExecDestroy(execs[r]));
  }
}

TEST_CASE("adaptive collectives match the CPU reference while the split moves") {
  REQUIRE_WORLD();
  using lane_t = reccl::adaptive_lane<reccl::allocator::texcp>;
  reccl::adaptive_options o;
  o.lane = 1;
  o.vts = 4;
  o.ctas_per_vt = 2;
  o.chunk_bytes = 4096;
  auto lanes = make_lanes<lane_t>(w, o);
  // VT 1 slowed to 100 MB/s from the second collective: texcp moves bytes off it collective by
  // collective, so every case below runs on a different split
  reccl::device_faults f;
  f.throttle(1, 100e6, lanes[0].epoch() + 1);
  for (int r = 0; r < w.n; ++r) lanes[r].inject(f, w.streams[r]);
  struct c_t {
    collective c;
    dtype t;
    redop op;
  };
  std::vector<c_t> const kinds = {
      {collective::all_reduce, dtype::bfloat16, redop::sum}, {collective::all_reduce, dtype::float32, redop::max},
      {collective::all_reduce, dtype::int32, redop::sum},    {collective::all_reduce, dtype::float16, redop::avg},
      {collective::all_reduce, dtype::float64, redop::min},  {collective::all_reduce, dtype::int64, redop::prod},
      {collective::reduce_scatter, dtype::bfloat16, redop::sum}, {collective::reduce_scatter, dtype::float32, redop::prod},
      {collective::all_gather, dtype::bfloat16, redop::sum}, {collective::all_gather, dtype::int32, redop::sum},
      {collective::broadcast, dtype::float32, redop::sum},   {collective::all_to_all, dtype::bfloat16, redop::sum},
  };
  std::uint64_t const counts[] = {1, 7, 1001, 65539, 400003};
  int failures = 0, cases = 0;
  for (auto const& k : kinds)
    for (std::uint64_t count : counts)
      for (int ip = 0; ip < 2; ++ip) {
        if (ip && k.c == collective::all_to_all) continue;
        std::string const why = run_checked(w, lanes, k.c, k.t, k.op, count, ip != 0, count % 2 == 1 ? w.n - 1 : 0);
        ++cases;
        if (!why.empty()) {
          ++failures;
          FAIL_CHECK(reccl::name(k.c) << " " << reccl::name(k.t) << " " << reccl::name(k.op) << " count=" << count
                                      << (ip ? " in-place" : " out-of-place") << ": " << why);
          if (failures > 10) return;
        }
      }
  MESSAGE(cases << " cases");
  CHECK(failures == 0);
  // the loop reacted: VT 1's share fell well below the equal 1/4
  auto const reps = lanes[0].reports(0, lanes[0].epoch());
  REQUIRE(!reps.empty());
  MESSAGE("VT 1 share in the newest report: " << static_cast<double>(reps.back().share[1]) / reccl::share_one);
  CHECK(reps.back().share[1] < reccl::share_one / 8);
  // every rank computed the same splits
  for (int r = 1; r < w.n; ++r) {
    auto const other = lanes[r].reports(0, lanes[r].epoch());
    REQUIRE(other.size() == reps.size());
    for (std::size_t i = 0; i < reps.size(); ++i) CHECK(other[i].split == reps[i].split);
  }
  // the samples the host fits the cost model on: every VT that carried bytes has a measured time
  // (its first CTA's start to its last CTA's end: more than zero, less than a second)
  for (int r = 0; r < w.n; ++r) {
    auto const smp = lanes[r].samples(0, lanes[r].epoch());
    REQUIRE(smp.size() + 1 >= reps.size());
    int bad = 0;
    for (auto const& s : smp)
      for (int v = 0; v < s.n_vts; ++v)
        if (s.bytes[v] > 0 && !((s.fault_mask >> v) & 1u) && (s.ns[v] == 0 || s.ns[v] > 1'000'000'000ull)) ++bad;
    CHECK(bad == 0);
  }
}

TEST_CASE("results are bitwise the same on the adaptive path, the plain path and any split") {
  REQUIRE_WORLD();
  using lane_t = reccl::adaptive_lane<reccl::allocator::texcp>;
  reccl::adaptive_options o;
  o.lane = 1;
  o.vts = 8;
  o.ctas_per_vt = 1;
  auto lanes = make_lanes<lane_t>(w, o);
  reccl::device_faults f;
  f.throttle(5, 200e6, lanes[0].epoch() + 1);
  for (int r = 0; r < w.n; ++r) lanes[r].inject(f, w.streams[r]);
  std::uint64_t const count = 1000003;
  std::vector<std::vector<std::uint16_t>> ref;
  for (int k = 0; k < 6; ++k) {
    for (int r = 0; r < w.n; ++r) {
      TEST_CK(cudaSetDevice(w.dev(r)));
      reccl::bench::fill(dtype::bfloat16, w.in[r], count, 4242, r, 0, w.streams[r]);
      reccl::bench::poison(dtype::bfloat16, w.out[r], count, w.streams[r]);
      if (k == 0) w.comms[r].all_reduce(w.in[r], w.out[r], count, dtype::bfloat16, redop::sum, w.streams[r]);
      else lanes[r].all_reduce(w.in[r], w.out[r], count, dtype::bfloat16, redop::sum, w.streams[r]);
    }
    w.sync();
    for (int r = 0; r < w.n; ++r) {
      w.comms[r].check();
      std::vector<std::uint16_t> got(count);
      TEST_CK(cudaSetDevice(w.dev(r)));
      TEST_CK(cudaMemcpy(got.data(), w.out[r], count * 2, cudaMemcpyDeviceToHost));
      if (k == 0) ref.push_back(got);
      else CHECK_MESSAGE(got == ref[r], "collective " << k << " rank " << r << " differs from the plain path");
    }
  }
}

TEST_CASE("a dead VT is recovered inside the collective, masked, probed and brought back") {
  REQUIRE_WORLD();
  using lane_t = reccl::adaptive_lane<reccl::allocator::texcp>;
  reccl::adaptive_options o;
  o.lane = 1;
  o.vts = 4;
  o.ctas_per_vt = 2;
  o.chunk_bytes = 8192;
  o.vt_timeout_ns = 1'000'000;
  o.control.probe_interval = 2;
  auto lanes = make_lanes<lane_t>(w, o);
  std::uint64_t const e0 = lanes[0].epoch();
  std::uint64_t const rec0 = lanes[0].recovered();
  reccl::device_faults f;
  f.kill(2, e0 + 3, e0 + 9);
  for (int r = 0; r < w.n; ++r) lanes[r].inject(f, w.streams[r]);
  int failures = 0;
  for (int k = 0; k < 24; ++k) {
    bool const ip = k % 3 == 2;
    collective const c = k % 4 == 3 ? collective::reduce_scatter : collective::all_reduce;
    std::string const why = run_checked(w, lanes, c, k % 2 ? dtype::float32 : dtype::bfloat16, redop::sum, 200003, ip);
    if (!why.empty()) {
      ++failures;
      FAIL_CHECK("collective " << k << (ip ? " in-place: " : ": ") << why);
      if (failures > 3) return;
    }
  }
  CHECK(failures == 0);
  for (int r = 0; r < w.n; ++r) CHECK(lanes[r].error_info() == 0u);
  std::uint64_t const e1 = lanes[0].epoch();
  auto const reps = lanes[0].reports(e0, e1);
  std::ostringstream log;
  bool faulted = false, masked = false, back = false;
  for (auto const& rep : reps) {
    log << rep.epoch - e0 << ":" << (rep.split.live_mask >> 2 & 1u ? "live" : "masked") << (rep.fault_mask & 4u ? "+fault" : "")
        << (rep.probe_mask & 4u ? "+probe" : "") << (rep.rejoined_mask & 4u ? "+rejoin" : "") << " ";
    faulted |= (rep.fault_mask & 4u) != 0 && rep.epoch >= e0 + 3;
    masked |= !((rep.split.live_mask >> 2) & 1u) && rep.epoch > e0 + 3 && rep.epoch < e0 + 9;
    back |= ((rep.split.live_mask >> 2) & 1u) && rep.epoch > e0 + 9 && rep.split.count[2] > 0;
  }
  MESSAGE("VT 2 by epoch: " << log.str());
  CHECK(faulted);
  CHECK(masked);
  CHECK(back);
  CHECK(lanes[0].recovered() > rec0);
}

TEST_CASE("a captured graph adapts and recovers on replay without recapture") {
  REQUIRE_WORLD();
  using lane_t = reccl::adaptive_lane<reccl::allocator::texcp>;
  reccl::adaptive_options o;
  o.lane = 2;
  o.vts = 4;
  o.ctas_per_vt = 2;
  o.chunk_bytes = 8192;
  o.vt_timeout_ns = 1'000'000;
  o.control.probe_interval = 2;
  auto lanes = make_lanes<lane_t>(w, o);
  std::uint64_t const e0 = lanes[0].epoch();
  std::uint64_t const count = 300001;
  int const per_graph = 10, replays = 4;
  // throttle VT 0 from the 5th collective, kill VT 3 during the 2nd replay
  reccl::device_faults f;
  f.throttle(0, 50e6, e0 + 5).kill(3, e0 + per_graph + 3, e0 + per_graph + 6);
  capture_and_replay(w, lanes, count, per_graph, replays, 77, "graph",
                     [&](int r) { lanes[r].inject(f, w.streams[r]); });
  auto const reps = lanes[0].reports(e0, lanes[0].epoch());
  bool adapted = false, recovered = false;
  for (auto const& rp : reps) {
    adapted |= rp.share[0] < reccl::share_one / 8;
    recovered |= (rp.fault_mask & 8u) != 0;
  }
  CHECK(lanes[0].epoch() == e0 + per_graph * replays);
  CHECK(adapted);
  CHECK(recovered);
}

TEST_CASE("no-telemetry and AIMD instantiations run and stay correct") {
  REQUIRE_WORLD();
  reccl::adaptive_options o;
  o.lane = 1;
  o.vts = 2;
  o.ctas_per_vt = 2;
  {
    auto lanes = make_lanes<reccl::adaptive_lane<reccl::allocator::equal, reccl::telemetry::none>>(w, o);
    for (int k = 0; k < 3; ++k) CHECK(run_checked(w, lanes, collective::all_reduce, dtype::float32, redop::sum, 12345, false) == "");
    auto const reps = lanes[0].reports(0, lanes[0].epoch());
    REQUIRE(!reps.empty());
    CHECK(reps.back().stalls[0] == 0);
    CHECK(reps.back().share[0] == reccl::share_one / 2);
  }
  {
    auto lanes = make_lanes<reccl::adaptive_lane<reccl::allocator::aimd>>(w, o);
    for (int k = 0; k < 3; ++k) CHECK(run_checked(w, lanes, collective::all_gather, dtype::int64, redop::sum, 3333, false) == "");
  }
}

TEST_CASE("the composed types with stall telemetry and texcp close the loop on the GPU") {
  REQUIRE_WORLD();
  using lane_t = composed_lane<reccl::allocator::texcp, reccl::telemetry::stalls>;
  using any_op = lane_t::any_op;
  reccl::adaptive_options o;
  o.lane = 1;
  o.vts = 4;
  o.ctas_per_vt = 2;
  o.chunk_bytes = 4096;
  std::vector<lane_t> lanes;
  for (auto& c : w.comms) {
    reccl::setup_lane<any_op>(c, o);
    lanes.push_back({&c, 1});
  }
  // VT 1 slowed from the second collective: every case below runs on another split
  reccl::device_faults f;
  f.throttle(1, 100e6, lanes[0].loop().epoch() + 1);
  for (int r = 0; r < w.n; ++r) lanes[r].loop().inject(f, w.streams[r]);
  struct c_t {
    collective c;
    dtype t;
    redop op;
  };
  std::vector<c_t> const kinds = {
      {collective::all_reduce, dtype::bfloat16, redop::sum},     {collective::all_reduce, dtype::float32, redop::max},
      {collective::all_reduce, dtype::int64, redop::prod},       {collective::reduce_scatter, dtype::float16, redop::sum},
      {collective::all_gather, dtype::bfloat16, redop::sum},     {collective::broadcast, dtype::int32, redop::sum},
      {collective::all_to_all, dtype::float32, redop::sum},
  };
  std::uint64_t const counts[] = {0, 1, 7, 1001, 65539, 400003};
  int failures = 0, cases = 0;
  for (auto const& k : kinds)
    for (std::uint64_t count : counts)
      for (int ip = 0; ip < 2; ++ip) {
        if (ip && k.c == collective::all_to_all) continue;
        std::string const why = run_checked(w, lanes, k.c, k.t, k.op, count, ip != 0, count % 2 == 1 ? w.n - 1 : 0);
        ++cases;
        if (!why.empty() && ++failures <= 10)
          FAIL_CHECK(reccl::name(k.c) << " " << reccl::name(k.t) << " " << reccl::name(k.op) << " count=" << count
                                      << (ip ? " in-place" : " out-of-place") << ": " << why);
      }
  MESSAGE(cases << " composed adaptive cases");
  CHECK(failures == 0);
  auto const reps = lanes[0].loop().reports(0, lanes[0].loop().epoch());
  REQUIRE(!reps.empty());
  MESSAGE("VT 1 share in the newest report: " << static_cast<double>(reps.back().share[1]) / reccl::share_one);
  CHECK(reps.back().share[1] < reccl::share_one / 8);
  for (int r = 1; r < w.n; ++r) {
    auto const other = lanes[r].loop().reports(0, lanes[r].loop().epoch());
    REQUIRE(other.size() == reps.size());
    for (std::size_t i = 0; i < reps.size(); ++i) CHECK(other[i].split == reps[i].split);
  }

  // a captured graph of composed calls replays on the lane's loop (epochs advance per replay)
  std::uint64_t const count = 300001;
  std::uint64_t const e0 = lanes[0].loop().epoch();
  capture_and_replay(w, lanes, count, 4, 2, 91, "composed", [](int) {});
  CHECK(lanes[0].loop().epoch() == e0 + 8);
}

TEST_CASE("a composed adaptive type sets its lane up on first use, and refuses what would lose state") {
  REQUIRE_WORLD();
  using lane_t = composed_lane<reccl::allocator::texcp, reccl::telemetry::stalls>;
  using other_op = reccl::all_reduce<float, reccl::schedule::one_shot, reccl::transport::nvlink, reccl::telemetry::stalls,
                                     reccl::allocator::aimd>;
  auto code = [](auto&& f) {
    try {
      f();
    } catch (reccl::error const& e) {
      MESSAGE(std::string(e.what()));
      return e.code();
    }
    return reccl::status::ok;
  };
  // lane 0 was never set up: inside a stream capture the set-up (host copies) is refused
  for (int r = 0; r < w.n; ++r) REQUIRE(w.comms[r].attached<reccl::adaptive_lane<reccl::allocator::texcp>>(0) == nullptr);
  {
    lane_t l{&w.comms[0], 0};
    TEST_CK(cudaSetDevice(w.dev(0)));
    cudaGraph_t g;
    TEST_CK(cudaStreamBeginCapture(w.streams[0], cudaStreamCaptureModeThreadLocal));
    reccl::status const st = code([&] { l.all_reduce(w.in[0], w.out[0], 1000, dtype::float32, redop::sum, w.streams[0]); });
    TEST_CK(cudaStreamEndCapture(w.streams[0], &g));
    TEST_CK(cudaGraphDestroy(g));
    CHECK(st == reccl::status::invalid_argument);
    CHECK(w.comms[0].attached<reccl::adaptive_lane<reccl::allocator::texcp>>(0) == nullptr);
  }
  {  // a call that brings its own split is refused before any set-up
    reccl::shares const eq = reccl::equal_shares(8, 0xffu);
    reccl::nvlink_call_options with_split;
    with_split.vt_shares = &eq;
    CHECK(code([&] {
            lane_t::any_op::run(w.comms[0], reinterpret_cast<float const*>(w.in[0]), reinterpret_cast<float*>(w.out[0]), 100,
                                redop::sum, w.streams[0], with_split);
          }) == reccl::status::invalid_argument);
    CHECK(w.comms[0].attached<reccl::adaptive_lane<reccl::allocator::texcp>>(0) == nullptr);
  }
  // outside capture the first call sets the lane up with the defaults (8 VTs) and runs right
  std::vector<lane_t> lanes;
  for (auto& c : w.comms) lanes.push_back({&c, 0});
  CHECK(run_checked(w, lanes, collective::all_reduce, dtype::bfloat16, redop::sum, 100003, false) == "");
  CHECK(run_checked(w, lanes, collective::all_gather, dtype::float32, redop::sum, 5001, false) == "");
  CHECK(lanes[0].loop().options().vts == 8);
  CHECK(lanes[0].loop().epoch() >= 2);
  // another policy pair on the same lane is refused before anything is reset
  std::uint64_t const e = lanes[0].loop().epoch();
  CHECK(code([&] { reccl::setup_lane<other_op>(w.comms[0], {.lane = 0}); }) == reccl::status::invalid_argument);
  CHECK(lanes[0].loop().epoch() == e);
  // a call that asks for another geometry than the lane's, or brings its own split, is refused
  reccl::nvlink_call_options bad;
  bad.lane = 0;
  bad.vts = 3;
  using op_t = lane_t::any_op;
  CHECK(code([&] {
          op_t::run(w.comms[0], reinterpret_cast<float const*>(w.in[0]), reinterpret_cast<float*>(w.out[0]), 100, redop::sum,
                    w.streams[0], bad);
        }) == reccl::status::invalid_argument);
  reccl::shares const eq = reccl::equal_shares(8, 0xffu);
  bad.vts = 0;
  bad.vt_shares = &eq;
  CHECK(code([&] {
          op_t::run(w.comms[0], reinterpret_cast<float const*>(w.in[0]), reinterpret_cast<float*>(w.out[0]), 100, redop::sum,
                    w.streams[0], bad);
        }) == reccl::status::invalid_argument);
  // the lane still works on every rank
  CHECK(run_checked(w, lanes, collective::all_reduce, dtype::float32, redop::sum, 4097, true) == "");
}

TEST_CASE("a rank that never arrives is a clean error naming it, within the lane deadline") {
  REQUIRE_WORLD();
  if (w.n < 2) return;
  using lane_t = reccl::adaptive_lane<reccl::allocator::texcp>;
  reccl::adaptive_options o;
  o.lane = 2;
  o.vts = 2;
  o.ctas_per_vt = 1;
  o.vt_timeout_ns = 500'000;
  // a fresh communicator set with a short deadline (the lane stays failed afterwards)
  reccl::nvlink_config cfg = test_config(w);
  cfg.timeout_ns = 300'000'000ull;
  std::vector<reccl::nvlink_communicator> comms =
      w.loop ? reccl::nvlink_communicator::create_loopback(w.n, 0, cfg) : reccl::nvlink_communicator::create_all(w.nccl, cfg);
  std::vector<reccl::nvlink_communicator*> ptrs;
  for (auto& c : comms) ptrs.push_back(&c);
  auto lanes = lane_t::create_all(ptrs, o);
  auto t0 = std::chrono::steady_clock::now();
  lanes[0].all_reduce(w.in[0], w.out[0], 1 << 20, dtype::bfloat16, redop::sum, w.streams[0]);  // rank 0 alone
  TEST_CK(cudaSetDevice(w.dev(0)));
  TEST_CK(cudaStreamSynchronize(w.streams[0]));
  double const secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(comms[0].status_of(2) == reccl::status::timeout);
  CHECK(secs < 3.0);
  std::uint32_t const info = lanes[0].error_info();
  MESSAGE("error_info: rank " << (info >> 16) << ", vt+1 " << (info & 0xffffu));
  CHECK((info >> 16) == 1u);  // rank 1 never started
  CHECK((info & 0xffffu) >= 1u);  // and the VT that waited for it
  bool threw = false;
  try {
    comms[0].check();
  } catch (reccl::error const&) {
    threw = true;
  }
  CHECK(threw);
}

TEST_CASE("bad adaptive options are rejected at creation") {
  REQUIRE_WORLD();
  using lane_t = reccl::adaptive_lane<reccl::allocator::texcp>;
  auto code = [&](reccl::adaptive_options o) {
    try {
      lane_t::create_all(w.ptrs(), o);
    } catch (reccl::error const& e) {
      return e.code();
    }
    return reccl::status::ok;
  };
  reccl::adaptive_options o;
  o.vts = 0;
  CHECK(code(o) == reccl::status::invalid_argument);
  o = {};
  o.lane = 7;
  CHECK(code(o) == reccl::status::invalid_argument);
  o = {};
  o.ctas_per_vt = 1000;
  CHECK(code(o) == reccl::status::invalid_argument);
  o = {};
  o.control.probe_interval = 1;
  CHECK(code(o) == reccl::status::invalid_argument);
  o = {};
  o.vt_timeout_ns = 0;
  CHECK(code(o) == reccl::status::invalid_argument);
}

TEST_CASE("teardown") {
  if (g_world == nullptr) return;
  world* w = g_world;
  g_world = nullptr;
  w->comms.clear();
  for (int r = 0; r < w->n; ++r) {
    cudaSetDevice(w->dev(r));
    cudaFree(w->in[r]);
    cudaFree(w->out[r]);
    cudaStreamDestroy(w->streams[r]);
  }
  if (!w->loop) {
    for (auto c : w->nccl) ncclCommFinalize(c);
    for (auto c : w->nccl) ncclCommDestroy(c);
  }
  delete w;
}
