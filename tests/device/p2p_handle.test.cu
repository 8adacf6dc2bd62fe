// The P2P transport's device handle (reccl::device::memory_handle) with loopback ranks: signal and
// wait, put visibility, barriers with growing epochs, a wait's timeout naming peer and VT,
// reservations out of bounds and bad configurations refused, raise_everywhere reaching every rank,
// and a composed collective on a failed communicator leaving its output alone.
#define CUDA_NO_HALF  // reccl::half, not cuda_fp16.h's global `half`
#include "../doctest_main.hpp"

#include "p2p_world.hpp"
#include "reccl/host/launch.hpp"

using namespace p2p_test;

// ---- the device handle -------------------------------------------------------------------------

namespace {

using reccl::device::deadline_clock;
using reccl::device::flag_id;
using reccl::device::memory_handle;

/// Thread t < size() signals rank t and waits for it; then checks that the flag holds at least
/// `value` and that waiting for a smaller value returns at once.
__global__ void signal_wait_kernel(memory_handle h, flag_id f, std::uint64_t value, unsigned* bad) {
  deadline_clock clock(h.timeout_ns);
  int const t = static_cast<int>(threadIdx.x);
  if (t >= h.size() || t == h.rank()) return;
  h.signal(t, f, value);
  if (!h.wait(f, t, value, clock)) atomicAdd(bad, 1u);
  if (h.read(f, t) < value) atomicAdd(bad, 1u);
  if (!h.wait(f, t, value - 1, clock)) atomicAdd(bad, 1u);
}

/// `iters` rounds: put a pattern into every peer's slot for this rank, signal, wait, verify what
/// every peer put here, then a barrier before the next round overwrites it.
__global__ void put_kernel(memory_handle h, flag_id data, flag_id bar, std::uint64_t off, std::uint64_t words, int iters,
                           unsigned long long* bad) {
  deadline_clock clock(h.timeout_ns);
  int const me = h.rank(), n = h.size(), t = static_cast<int>(threadIdx.x);
  __shared__ std::uint64_t e0;
  if (t == 0) e0 = *h.sequence(data);
  __syncthreads();
  for (int it = 1; it <= iters; ++it) {
    std::uint64_t const e = e0 + static_cast<std::uint64_t>(it);
    auto pattern = [&](int src, int dst, std::uint64_t i) { return (e << 40) ^ (static_cast<std::uint64_t>(src) << 32) ^ (static_cast<std::uint64_t>(dst) << 24) ^ i; };
    for (int p = 0; p < n; ++p) {
      if (p == me) continue;
      std::uint64_t* const dst = h.at<std::uint64_t>(p, off) + static_cast<std::uint64_t>(me) * words;
      for (std::uint64_t i = static_cast<std::uint64_t>(t); i < words; i += blockDim.x) dst[i] = pattern(me, p, i);
    }
    __syncthreads();
    if (t < n && t != me) {
      h.signal(t, data, e);
      if (!h.wait(data, t, e, clock)) atomicAdd(bad, 1ull << 32);
    }
    __syncthreads();
    std::uint64_t const* const mine = h.at<std::uint64_t>(me, off);
    for (int q = 0; q < n; ++q) {
      if (q == me) continue;
      for (std::uint64_t i = static_cast<std::uint64_t>(t); i < words; i += blockDim.x)
        if (mine[static_cast<std::uint64_t>(q) * words + i] != pattern(q, me, i)) atomicAdd(bad, 1ull);
    }
    if (!h.barrier(bar, e, clock)) {
      if (t == 0) atomicAdd(bad, 1ull << 32);
      break;
    }
  }
  if (t == 0) *h.sequence(data) = e0 + static_cast<std::uint64_t>(iters);
}

/// `iters` barriers: before barrier e every rank stores e into its slot of every rank's array;
/// after it, every slot must hold e (or e + 1: that peer already went on).
__global__ void barrier_kernel(memory_handle h, flag_id f, std::uint64_t off, int iters, unsigned long long* bad) {
  deadline_clock clock(h.timeout_ns);
  int const me = h.rank(), n = h.size(), t = static_cast<int>(threadIdx.x);
  __shared__ std::uint64_t e0;
  if (t == 0) e0 = *h.sequence(f);
  __syncthreads();
  for (int k = 1; k <= iters; ++k) {
    std::uint64_t const e = e0 + static_cast<std::uint64_t>(k);
    if (t < n) *static_cast<volatile std::uint64_t*>(h.at<std::uint64_t>(t, off) + me) = e;
    if (!h.barrier(f, e, clock)) {
      if (t == 0) atomicAdd(bad, 1ull << 32);
      break;
    }
    if (t < n) {
      std::uint64_t const v = *static_cast<volatile std::uint64_t const*>(h.at<std::uint64_t>(me, off) + t);
      if (v != e && v != e + 1) atomicAdd(bad, 1ull);
    }
  }
  if (t == 0) *h.sequence(f) = e0 + static_cast<std::uint64_t>(iters);
}

/// One wait for a flag nobody signals.
__global__ void lonely_wait_kernel(memory_handle h, flag_id f, int src, int vt, unsigned* result) {
  deadline_clock clock(h.timeout_ns);
  *result = h.wait(f, src, 1, clock, vt) ? 1u : 2u;
}

template <class T>
struct device_counter {
  T* p = nullptr;
  device_counter() {
    TEST_CK(cudaMalloc(&p, sizeof(T)));
    TEST_CK(cudaMemset(p, 0, sizeof(T)));
  }
  ~device_counter() { (void)cudaFree(p); }
  T get() const {
    T v{};
    TEST_CK(cudaMemcpy(&v, p, sizeof(T), cudaMemcpyDeviceToHost));
    return v;
  }
};

}  // namespace

TEST_CASE("p2p handle: signal and wait between ranks") {
  REQUIRE_GPU();
  for (int n : {2, 3, 4, 8}) {
    world w(n);
    std::vector<flag_id> f;
    for (auto& c : w.comms) f.push_back(c.reserve_flags(1));
    for (int r = 1; r < n; ++r) REQUIRE(f[static_cast<std::size_t>(r)].index == f[0].index);
    std::vector<std::unique_ptr<device_counter<unsigned>>> bad;
    for (int round = 1; round <= 3; ++round) {
      for (int r = 0; r < n; ++r) {
        bad.push_back(std::make_unique<device_counter<unsigned>>());
        signal_wait_kernel<<<1, 32, 0, w.streams[static_cast<std::size_t>(r)]>>>(w.comms[static_cast<std::size_t>(r)].handle(), f[0],
                                                                                   static_cast<std::uint64_t>(round) * 10, bad.back()->p);
        TEST_CK(cudaGetLastError());
      }
      w.sync_all();
    }
    for (std::size_t i = 0; i < bad.size(); ++i) CHECK_MESSAGE(bad[i]->get() == 0, n << " ranks, launch " << i << ": " << bad[i]->get() << " failed waits");
    auto const faults = w.faults();
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(faults[static_cast<std::size_t>(r)].empty(), n << " ranks, rank " << r << ": " << faults[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("p2p handle: put, signal and wait make the data visible, and barriers with growing epochs") {
  REQUIRE_GPU();
  for (int n : {2, 3, 4}) {
    world w(n);
    std::uint64_t const words = 4099;
    std::vector<flag_id> data, bar, bar2;
    std::vector<std::uint64_t> off, off2;
    for (auto& c : w.comms) {
      data.push_back(c.reserve_flags(1));
      bar.push_back(c.reserve_flags(1));
      bar2.push_back(c.reserve_flags(1));
      void* p = c.allocate(words * sizeof(std::uint64_t) * static_cast<std::uint64_t>(n));
      off.push_back(static_cast<std::uint64_t>(static_cast<char*>(p) - c.handle().at(c.rank(), 0)));
      CHECK(c.handle().in_window(p, words * 8 * static_cast<std::uint64_t>(n)));
      CHECK_FALSE(c.handle().in_window(p, c.config().data_bytes));
      off2.push_back(c.reserve_bytes(8 * static_cast<std::uint64_t>(n), 128));
    }
    for (int r = 1; r < n; ++r) {
      REQUIRE(off[static_cast<std::size_t>(r)] == off[0]);
      REQUIRE(off2[static_cast<std::size_t>(r)] == off2[0]);
      REQUIRE(data[static_cast<std::size_t>(r)].index == data[0].index);
    }
    auto const& h0 = w.comms[0].handle();
    for (int r = 0; r < n; ++r) CHECK(h0.peer_ptr(r, h0.at<char>(0, off[0])) == h0.at<char>(r, off[0]));

    std::vector<std::unique_ptr<device_counter<unsigned long long>>> bad;
    for (int launch = 0; launch < 3; ++launch) {
      for (int r = 0; r < n; ++r) {
        bad.push_back(std::make_unique<device_counter<unsigned long long>>());
        put_kernel<<<1, 256, 0, w.streams[static_cast<std::size_t>(r)]>>>(w.comms[static_cast<std::size_t>(r)].handle(), data[0], bar[0],
                                                                            off[0], words, 20, bad.back()->p);
        TEST_CK(cudaGetLastError());
      }
      for (int r = 0; r < n; ++r) {
        bad.push_back(std::make_unique<device_counter<unsigned long long>>());
        barrier_kernel<<<1, 128, 0, w.streams[static_cast<std::size_t>(r)]>>>(w.comms[static_cast<std::size_t>(r)].handle(), bar2[0], off2[0],
                                                                                500, bad.back()->p);
        TEST_CK(cudaGetLastError());
      }
      w.sync_all();
    }
    for (std::size_t i = 0; i < bad.size(); ++i) {
      unsigned long long const b = bad[i]->get();
      CHECK_MESSAGE(b == 0, n << " ranks, launch " << i << ": " << (b >> 32) << " failed waits/barriers, " << (b & 0xffffffffu)
                              << " wrong words seen");
    }
    auto const faults = w.faults();
    for (int r = 0; r < n; ++r) CHECK_MESSAGE(faults[static_cast<std::size_t>(r)].empty(), n << " ranks, rank " << r << ": " << faults[static_cast<std::size_t>(r)]);
  }
}

TEST_CASE("p2p handle: a wait nobody answers times out naming the peer and the VT") {
  REQUIRE_GPU();
  p2p_config cfg;
  cfg.timeout_ns = 100'000'000ull;
  world w(3, cfg);
  flag_id const f = w.comms[0].reserve_flags(1);
  device_counter<unsigned> result;
  auto const t0 = std::chrono::steady_clock::now();
  lonely_wait_kernel<<<1, 1, 0, w.streams[0]>>>(w.comms[0].handle(), f, 2, 7, result.p);
  TEST_CK(cudaGetLastError());
  w.sync_all();
  double const s = seconds_since(t0);
  CHECK_MESSAGE(result.get() == 2u, "the wait returned " << (result.get() == 1u ? "true" : "nothing"));
  CHECK_MESSAGE(s >= 0.09, "gave up after " << s << " s, before the 0.1 s deadline");
  CHECK_MESSAGE(s < 2.0, "gave up only after " << s << " s");
  reccl::device::fault const fl = w.comms[0].fault();
  CHECK(fl.st == reccl::status::timeout);
  CHECK(fl.origin == 0);
  CHECK(fl.peer == 2);
  CHECK(fl.vt == 7);
  CHECK(fl.cause == reccl::device::fault_cause::peer_timeout);
  CHECK(w.comms[1].fault().ok());  // a timeout is this rank's alone
  auto const [st, what] = check_outcome(w.comms[0]);
  CHECK(st == reccl::status::timeout);
  CHECK_MESSAGE(what.find("(peer 2)") != std::string::npos, what);
}

TEST_CASE("p2p handle: reservations out of bounds and bad configurations are refused") {
  REQUIRE_GPU();
  p2p_config cfg;
  cfg.plan_max_ctas = 1;
  cfg.n_flags = 4 * reccl::device::max_memory_ranks + 8;  // the smallest the plan lane accepts, and 8
  cfg.data_bytes = 1u << 20;
  // the plan lane's flags: ready and credit per CTA, sent and received per CTA and peer
  int const lane_flags = 2 * cfg.plan_max_ctas * (1 + reccl::device::max_memory_ranks);
  world w(2, cfg);
  auto& c = w.comms[0];
  CHECK(c.reserve_flags(cfg.n_flags - lane_flags).index == static_cast<std::uint32_t>(lane_flags));
  auto refused = [](auto&& f, char const* needle) {
    std::string what;
    try {
      f();
    } catch (reccl::error const& e) {
      what = e.what();
      CHECK(e.code() == reccl::status::invalid_argument);
    }
    CHECK_MESSAGE(what.find(needle) != std::string::npos, "expected an error naming '" << needle << "', got '" << what << "'");
  };
  refused([&] { c.reserve_flags(1); }, "n_flags");
  refused([&] { c.reserve_flags(0); }, "flags");
  std::uint64_t const left = cfg.data_bytes - (c.reserve_bytes(0, 4096));
  CHECK(c.allocate(left - 4096, 4096) != nullptr);
  refused([&] { c.allocate(8192, 4096); }, "data_bytes");
  refused([&] { c.reserve_bytes(~0ull); }, "data_bytes");
  refused([] { p2p_communicator::create_loopback(0); }, "nranks");
  refused([] { p2p_communicator::create_loopback(reccl::device::max_memory_ranks + 1); }, "nranks");
  p2p_config bad = cfg;
  bad.timeout_ns = 0;
  refused([&] { p2p_communicator::create_loopback(2, 0, bad); }, "timeout_ns");
  bad = cfg;
  bad.plan_slot_bytes = 1000;
  refused([&] { p2p_communicator::create_loopback(2, 0, bad); }, "plan_slot_bytes");
  bad = cfg;
  bad.plan_max_ctas = 16;
  refused([&] { p2p_communicator::create_loopback(2, 0, bad); }, "n_flags");
  // the other rank's reservations are its own counters, still untouched
  CHECK(w.comms[1].reserve_flags(8).index == static_cast<std::uint32_t>(lane_flags));
}

TEST_CASE("p2p handle: raise_everywhere from the host reaches every rank's fault word") {
  REQUIRE_GPU();
  int const n = 4;
  world w(n);
  reccl::device::fault const f{reccl::status::internal, 1, 3, 5, reccl::device::fault_cause::user};
  w.comms[1].raise_everywhere(f, w.streams[1]);
  w.sync_all();
  reccl::device::fault const other{reccl::status::timeout, 2, 0, 0, reccl::device::fault_cause::peer_timeout};
  w.comms[2].raise_everywhere(other, w.streams[2]);  // the first fault stays
  w.sync_all();
  for (int r = 0; r < n; ++r) {
    reccl::device::fault const g = w.comms[static_cast<std::size_t>(r)].fault();
    CHECK_MESSAGE(g.encode() == f.encode(), "rank " << r << ": status " << reccl::name(g.st) << " origin " << g.origin << " peer " << g.peer
                                                    << " vt " << g.vt << " cause " << reccl::device::name(g.cause));
    std::string what;
    try {
      w.comms[static_cast<std::size_t>(r)].check();
    } catch (reccl::error const& e) {
      what = e.what();
      CHECK(e.code() == reccl::status::internal);
      CHECK(e.rank() == 1);
      CHECK(e.vt() == 5);
    }
    CHECK_MESSAGE(what.find("rank 1: user fault (peer 3)") != std::string::npos, "rank " << r << ": " << what);
    if (r != 1) CHECK_MESSAGE(what.find("seen by rank " + std::to_string(r)) != std::string::npos, "rank " << r << ": " << what);
  }
  // a composed collective on a failed communicator runs nothing and leaves the output alone
  w.reserve(1 << 16);
  for (int r = 0; r < n; ++r) TEST_CK(cudaMemset(w.arena[static_cast<std::size_t>(r)], poison_byte, 1 << 16));
  TEST_CK(cudaDeviceSynchronize());
  auto const t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < n; ++r) {
    auto* a = reinterpret_cast<float*>(w.arena[static_cast<std::size_t>(r)]);
    gpu_op<collective::all_reduce, reccl::schedule::ring, float>::run(w.comms[static_cast<std::size_t>(r)], a, a + 4096, 4096, redop::sum,
                                                                      w.streams[static_cast<std::size_t>(r)]);
  }
  w.sync_all();
  CHECK(seconds_since(t0) < 1.0);
  std::vector<unsigned char> got(1 << 16);
  TEST_CK(cudaMemcpy(got.data(), w.arena[0], got.size(), cudaMemcpyDeviceToHost));
  long changed = 0;
  for (auto b : got) changed += b != poison_byte;
  CHECK_MESSAGE(changed == 0, changed << " bytes written by a collective on a failed communicator");
}

namespace {
__global__ void count_ctas_kernel(unsigned* n) {
  if (threadIdx.x == 0) atomicAdd(n, 1u);
}
}  // namespace

TEST_CASE("launch_co_resident: grids that cannot all be resident with the other ranks' are refused before launch") {
  REQUIRE_GPU();
  auto const k = reinterpret_cast<void const*>(&count_ctas_kernel);
  int const cap = reccl::co_resident_capacity(k, 256, 0);
  REQUIRE(cap > 0);
  device_counter<unsigned> launched;
  int const ranks = 2, fits = cap / ranks;
  reccl::launch_co_resident(&count_ctas_kernel, fits, 256, 0, nullptr, ranks, launched.p);
  TEST_CK(cudaDeviceSynchronize());
  CHECK(launched.get() == static_cast<unsigned>(fits));
  std::string what;
  try {
    reccl::launch_co_resident(&count_ctas_kernel, fits + 1, 256, 0, nullptr, ranks, launched.p);
  } catch (reccl::error const& e) {
    what = e.what();
    CHECK(e.code() == reccl::status::invalid_argument);
  }
  TEST_CK(cudaDeviceSynchronize());
  CHECK(launched.get() == static_cast<unsigned>(fits));  // nothing launched
  CHECK_MESSAGE(what.find("must be resident at once") != std::string::npos, what);
  CHECK_MESSAGE(what.find(std::to_string(cap)) != std::string::npos, what);
  // every composed collective checks its own grid: loopback ranks of one process share the GPU
  world w(3);
  CHECK(w.comms[0].ranks_sharing_device() == 3);
}
