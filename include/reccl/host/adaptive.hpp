// reccl/host/adaptive.hpp -- the PReCCL loop on the GPU: collectives whose byte split across VTs
// adapts on the device, collective by collective, with the Allocator and Telemetry policies chosen
// at compile time.
//
//   auto comms = reccl::nvlink_communicator::create_all(nccl);            // or create_loopback(2)
//   auto loop = reccl::adaptive_lane<reccl::allocator::texcp>::create_all(ptrs(comms), {.lane = 1});
//   loop[r].all_reduce(in, out, count, reccl::dtype::bfloat16, reccl::redop::sum, stream);
//   // ... capture in a CUDA graph, replay: the split still adapts (its state is in device memory)
//   auto reps = loop[r].reports(0, loop[r].epoch());   // split, bytes, stalls, bandwidth, faults
//
// What happens in each collective is in device/adaptive/kernel.hpp; what the state is, in
// device/adaptive/state.hpp. In short: each VT's pipelines time the waits that spun (senders for
// credit, receivers for data); every data CTA ends with a tagged verdict word to every rank (its
// fault and probe bits); a spare CTA of the next collective builds and exchanges each rank's
// epoch_record and runs control<A>::step on them (two chains, even and odd collectives);
// a VT that stops making progress while another VT finished is recovered inside the same kernel by
// the live VTs and masked, and probes riding on later collectives bring it back.
//
// Contract:
//  * The lane belongs to this object: concurrent collectives use other lanes (plain collectives may
//    use this lane too, in stream order).
//  * Every rank makes the same adaptive calls in the same order (as for any collective); counts,
//    dtypes, ops and the injected faults and installed models must agree (faults and models are
//    stream-ordered copies: issue them at the same point of every rank's stream).
//  * A VT fault is not an error: the result is correct, the report says which VT was recovered.
//    A rank that never arrives, ranks that disagree, or the loss of every VT fail the lane (the
//    communicator's check() throws; error_info() names the rank, and the VT where known).
//  * The step runs one collective behind (see state.hpp), so the report and the sample of
//    collective e appear once collective e+1 has run.
//  * All data CTAs of a collective must be resident at once (they wait for each other's verdicts):
//    VTs x CTAs per VT + 1 must fit the GPU (create_all checks it).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <vector>

#include "../device/adaptive/kernel.hpp"
#include "../policy/allocator/allocator.hpp"
#include "../policy/allocator/texcp.hpp"
#include "../policy/control.hpp"
#include "../policy/telemetry/cost_model.hpp"
#include "../policy/telemetry/stall_counter.hpp"
#include "communicator.hpp"

namespace reccl {

/// Injected slow and dead VTs, keyed by global epoch (the adaptive lane's collective index), for
/// tests and demos. Both ranks of a link see the same table.
struct device_faults {
  device::adaptive::fault_table table{};
  static constexpr std::uint64_t forever = ~std::uint64_t{0};

  /// VT `vt` carries at most `bytes_per_s` per rank and direction in epochs [from, until).
  device_faults& throttle(int vt, double bytes_per_s, std::uint64_t from, std::uint64_t until = forever) {
    return add({1u, vt, from, until, static_cast<std::uint64_t>(bytes_per_s / 1e6 < 1 ? 1 : bytes_per_s / 1e6)});
  }
  /// VT `vt` moves nothing in epochs [from, until): its sends are dropped, as on a dead link.
  device_faults& kill(int vt, std::uint64_t from, std::uint64_t until = forever) { return add({2u, vt, from, until, 0}); }

 private:
  device_faults& add(device::adaptive::fault_spec f) {
    if (table.n >= static_cast<std::uint32_t>(device::adaptive::max_faults))
      throw error(status::invalid_argument, "device_faults: at most 8 entries");
    if (f.vt < 0 || f.vt >= max_vts) throw error(status::invalid_argument, "device_faults: VT out of range");
    table.f[table.n++] = f;
    return *this;
  }
};

/// Creation-time parameters of an adaptive lane. Equal on every rank.
struct adaptive_options {
  std::int32_t lane = 1;
  std::int32_t vts = 8;
  std::int32_t ctas_per_vt = 0;  ///< 0: the largest that fits (communicator max_ctas, SMs - 1)
  std::int32_t chunk_bytes = 0;  ///< ring chunk; 0: the tuning table's for large messages
  std::uint64_t vt_timeout_ns = 2'000'000;  ///< a VT stuck this long while another finished has faulted
  std::uint64_t probe_grace_ns = 3'000;     ///< a probe waits this long after the live VTs are done
  control_config control{4, share_one >> 6};  ///< probe every 4 steps of a chain (8 collectives)
  /// The prior cost model until the host installs a fitted one: a stall costs its own duration
  /// (device::adaptive::stall_quantum_ns), a byte 1/50 GB/s, no fixed cost.
  telemetry::cost_model_q model{device::adaptive::stall_quantum_ns << telemetry::cost_model_q::frac_bits, 335544, 0, 0};
  shares initial{};       ///< starting shares of both chains (n_vts 0: equal); e.g. a static split for allocator::fixed
  /// Measurement only, to price the loop's parts (bench/adaptive): bit 0 skips the control CTA's
  /// work (the record exchange and the step), bit 1 the verdict (so also recovery), bit 2 the
  /// device-side plan (the host's equal split is used), bit 3 everything after the data phase (no
  /// record), bit 4 the prologue's loads; bits 1-2 need bit 0, bits 3-4 need bits 0-2. Results stay right without faults; nothing adapts.
  std::uint32_t ablate = 0;
};


/// One rank's adaptive lane (see the file comment). Movable, not copyable; it refers to its
/// nvlink_communicator, which must outlive it.
template <Allocator A = allocator::texcp, Telemetry M = telemetry::stalls>
class adaptive_lane {
 public:
  using allocator_type = A;
  using telemetry_type = M;
  using fault_table = device::adaptive::fault_table;
  using vt_sample = device::adaptive::vt_sample;

  /// Sets up the lane on every communicator of one group (driven from this thread; for one
  /// process per GPU call it on each rank with a one-element vector). Resets the control state to
  /// equal shares; the epoch counter continues where the lane left it.
  static std::vector<adaptive_lane> create_all(std::vector<nvlink_communicator*> const& comms, adaptive_options o = {},
                                               A alloc = {}) {
    if (comms.empty()) throw error(status::invalid_argument, "adaptive_lane: no communicator");
    o = checked(*comms.front(), o);
    std::vector<adaptive_lane> out;
    for (nvlink_communicator* c : comms) out.push_back(adaptive_lane(*c, o, alloc, nullptr));
    return out;
  }

  /// Sets up the lane on one rank's communicator in the order of stream `s`, without synchronising
  /// the device: the lane's kernels issued on `s` after this call see the new control state
  /// (equal shares; the epoch counter continues). Kernels of this lane still in flight on other
  /// streams must have finished. Not inside a stream capture (the state is copied from host memory).
  /// Every rank sets up with the same options before its first collective on the lane.
  static adaptive_lane create_on_stream(nvlink_communicator& c, adaptive_options o, A alloc, cudaStream_t s) {
    return adaptive_lane(c, checked(c, o), alloc, &s);
  }

  adaptive_lane(adaptive_lane&&) noexcept = default;
  adaptive_lane& operator=(adaptive_lane&&) noexcept = default;

  int rank() const { return c_->rank(); }
  adaptive_options const& options() const { return o_; }
  nvlink_communicator& communicator() const { return *c_; }

  // ---- collectives (same meaning and buffer rules as nvlink_communicator's)
  void all_reduce(void const* in, void* out, std::size_t count, dtype t, redop op, cudaStream_t s) {
    run<collective::all_reduce>(in, out, count, t, op, 0, s);
  }
  void reduce_scatter(void const* in, void* out, std::size_t count, dtype t, redop op, cudaStream_t s) {
    run<collective::reduce_scatter>(in, out, count, t, op, 0, s);
  }
  void all_gather(void const* in, void* out, std::size_t count, dtype t, cudaStream_t s) {
    run<collective::all_gather>(in, out, count, t, redop::sum, 0, s);
  }
  void broadcast(void const* in, void* out, std::size_t count, dtype t, int root, cudaStream_t s) {
    run<collective::broadcast>(in, out, count, t, redop::sum, root, s);
  }
  void all_to_all(void const* in, void* out, std::size_t count, dtype t, cudaStream_t s) {
    run<collective::all_to_all>(in, out, count, t, redop::sum, 0, s);
  }

  /// Collective C on T's kernel only (the composed types' path, host/nvlink_collective.hpp: no
  /// other dtype is instantiated). Same meaning and buffer rules as the methods above; returns the plan.
  template <collective C, class T>
  plan run_typed(T const* in, T* out, std::size_t count, redop op, int root, cudaStream_t s) {
    using E = std::conditional_t<reduces(C), T, device::raw_byte>;  // copying collectives move bytes
    return run<C>(in, out, count, device::element_dtype<T>(), op, root, s, &device::adaptive::adaptive_kernel<E, M, A>);
  }

  /// Points this object at its communicator again after that object moved (the lane's state is
  /// the communicator's and moves with it).
  void rebind(nvlink_communicator& c) noexcept { c_ = &c; }

  // ---- control and visibility
  /// Replaces the injected faults from this point of the stream on (stream-ordered copy).
  void inject(device_faults const& f, cudaStream_t s) { copy_in(&region()->faults, &f.table, sizeof(fault_table), s); }
  /// Installs cost model `m` for the records of global epochs >= from_epoch (stream-ordered; call
  /// it at the same point of every rank's stream, e.g. right after the same collective).
  void set_model(telemetry::cost_model_q m, std::uint64_t from_epoch, cudaStream_t s) {
    device::adaptive::pending_model pm{++model_seq_, from_epoch, m};
    copy_in(&region()->model, &pm, sizeof(pm), s);
  }
  /// Index of the next adaptive collective on this lane (synchronous read).
  std::uint64_t epoch() const { return read<std::uint64_t>(&region()->epoch); }
  /// Collectives that recovered a dead VT so far.
  std::uint64_t recovered() const { return read<std::uint64_t>(&region()->recovered); }
  /// First fatal error's rank (>> 16) and VT + 1 (low 16 bits; 0: none); 0 if there was none.
  std::uint32_t error_info() const { return read<std::uint32_t>(&region()->error_info); }
  /// Reports of epochs [from, to) still in the ring (at most 256 back) and already written (the
  /// report of e is written by collective e+1). Synchronous; call after the stream is synchronised.
  std::vector<epoch_report> reports(std::uint64_t from, std::uint64_t to) const {
    return from_ring(region()->reports, from, to, [](auto const& r, std::uint64_t e) { return r.tag == e + 1; },
                     [](auto const& r) { return r.rep; });
  }
  /// How long the control CTA took to step each of epochs [from, to) (ns; same filter as reports).
  std::vector<std::uint64_t> step_ns(std::uint64_t from, std::uint64_t to) const {
    return from_ring(region()->reports, from, to, [](auto const& r, std::uint64_t e) { return r.tag == e + 1; },
                     [](auto const& r) { return r.step_ns; });
  }
  /// This rank's measured samples of epochs [from, to) still in the ring (for the cost model fit).
  std::vector<vt_sample> samples(std::uint64_t from, std::uint64_t to) const {
    return from_ring(region()->samples, from, to, [](auto const& r, std::uint64_t e) { return r.epoch == e && r.n_vts > 0; },
                     [](auto const& r) { return r; });
  }
  /// The cost model in use at creation (the prior).
  telemetry::cost_model_q const& prior() const { return o_.model; }

 private:
  /// `o` checked against the communicator's geometry, defaults filled in.
  static adaptive_options checked(nvlink_communicator const& c, adaptive_options o) {
    nvlink_config const& cfg = c.config();
    if (o.vts < 1 || o.vts > max_vts) throw error(status::invalid_argument, "adaptive_lane: vts outside [1, max_vts]");
    if (o.lane < 0 || o.lane >= cfg.lanes) throw error(status::invalid_argument, "adaptive_lane: no such lane");
    if (o.control.probe_interval < 2)
      throw error(status::invalid_argument, "adaptive_lane: probe_interval must be >= 2 (a failed probe resyncs its rings)");
    if (((o.ablate & 6u) && !(o.ablate & 1u)) || ((o.ablate & 24u) && (o.ablate & 7u) != 7u))
      throw error(status::invalid_argument, "adaptive_lane: ablate bits 1-2 need bit 0, bits 3-4 need bits 0-2");
    if (o.vt_timeout_ns == 0 || o.vt_timeout_ns >= cfg.timeout_ns)
      throw error(status::invalid_argument, "adaptive_lane: vt_timeout_ns must be in (0, the lane timeout)");
    int sms = 0;
    RECCL_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c.device()));
    int const fit = std::min(cfg.max_ctas, c.loopback() ? cfg.max_ctas - 1 : sms - 1);
    if (o.ctas_per_vt == 0) o.ctas_per_vt = fit / o.vts;
    if (o.ctas_per_vt < 1 || o.vts * o.ctas_per_vt > fit)
      throw error(status::invalid_argument, "adaptive_lane: vts x ctas_per_vt + 1 control CTA must fit the GPU (" +
                                                std::to_string(fit + 1) + " CTAs)");
    if (o.chunk_bytes == 0) o.chunk_bytes = std::min(row_for(cfg.tune.pipelined, any_size).chunk_bytes, cfg.ring_chunk_bytes);
    if (o.initial.n_vts != 0 && (o.initial.n_vts != o.vts || check(o.initial) != status::ok))
      throw error(status::invalid_argument, "adaptive_lane: initial shares are not valid shares over vts VTs");
    return o;
  }

  /// Installs a fresh control state from the lane's current epoch on (epochs only grow, so records
  /// and flags of an earlier state on this lane are never mistaken for new ones); the report and
  /// sample rings stay. `ordered_on` null: synchronously, after every kernel on the device;
  /// otherwise in that stream's order.
  adaptive_lane(nvlink_communicator& c, adaptive_options const& o, A const& alloc, cudaStream_t const* ordered_on)
      : c_(&c), o_(o) {
    using device::adaptive::control_region;
    RECCL_CUDA_CHECK(cudaSetDevice(c.device()));
    control_region* R = region();
    std::size_t const head = offsetof(control_region, reports);
    std::vector<unsigned char> h(head, 0);
    auto* H = reinterpret_cast<control_region*>(h.data());
    control<A> start = control<A>::start(o.vts, alloc, o.control, o.model);
    if (o.initial.n_vts != 0) start.share = o.initial;
    for (int k = 0; k < 2; ++k) std::memcpy(H->chain[k], &start, sizeof(start));
    if (ordered_on == nullptr) {
      RECCL_CUDA_CHECK(cudaDeviceSynchronize());
      RECCL_CUDA_CHECK(cudaMemcpy(&H->epoch, &R->epoch, sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
      RECCL_CUDA_CHECK(cudaMemcpy(&H->recovered, &R->recovered, sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
      H->first_epoch = H->epoch;
      RECCL_CUDA_CHECK(cudaMemcpy(R, h.data(), head, cudaMemcpyHostToDevice));
      RECCL_CUDA_CHECK(cudaDeviceSynchronize());
      return;
    }
    // the same image without reading the device: epoch and recovered stay where they are,
    // first_epoch is copied from epoch on the device. Copies from pageable memory return once the
    // source is staged, so `h` may go when this returns.
    cudaStream_t const s = *ordered_on;
    std::size_t const q = offsetof(control_region, quiet_tag), rec = offsetof(control_region, recovered);
    std::size_t const after_rec = rec + sizeof(std::uint64_t);
    auto* const Rb = reinterpret_cast<unsigned char*>(R);
    RECCL_CUDA_CHECK(cudaMemcpyAsync(&R->first_epoch, &R->epoch, sizeof(std::uint64_t), cudaMemcpyDeviceToDevice, s));
    RECCL_CUDA_CHECK(cudaMemcpyAsync(Rb + q, h.data() + q, rec - q, cudaMemcpyHostToDevice, s));
    RECCL_CUDA_CHECK(cudaMemcpyAsync(Rb + after_rec, h.data() + after_rec, head - after_rec, cudaMemcpyHostToDevice, s));
  }

  device::adaptive::control_region* region() const { return c_->lane_view(o_.lane).ctl(); }

  /// The entries of a device ring (indexed by epoch modulo its size) for epochs [from, to) that
  /// `valid` accepts, mapped by `take`. One synchronous copy of the whole ring.
  template <class E, std::size_t N, class Valid, class Take>
  auto from_ring(E const (&ring_d)[N], std::uint64_t from, std::uint64_t to, Valid valid, Take take) const {
    std::vector<E> ring(N);
    copy_out(ring.data(), ring_d, sizeof(E) * N);
    std::vector<decltype(take(ring[0]))> out;
    for (std::uint64_t e = from; e < to; ++e)
      if (valid(ring[e % N], e)) out.push_back(take(ring[e % N]));
    return out;
  }

  template <class V> V read(V const* p) const {
    V x{};
    copy_out(&x, p, sizeof(V));
    return x;
  }
  void copy_out(void* dst, void const* src, std::size_t bytes) const {
    RECCL_CUDA_CHECK(cudaSetDevice(c_->device()));
    RECCL_CUDA_CHECK(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost));
  }
  void copy_in(void* dst, void const* src, std::size_t bytes, cudaStream_t s) {
    RECCL_CUDA_CHECK(cudaSetDevice(c_->device()));
    // through a pinned staging copy owned by this call's stream order: cudaMemcpyAsync from
    // pageable memory is synchronous for the host but ordered on the stream
    RECCL_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  }

  /// The lane's kernel for collective C on dtype t; nullptr when t is left out of this program
  /// (RECCL_DTYPES). Chosen per collective at compile time, so a program that only reduces never
  /// compiles the byte-stream kernel, and one that only moves data compiles no reduction kernel.
  template <collective C>
  static device::adaptive::kernel_fn_t select(dtype t) {
    using device::adaptive::kernel_fn_t;
    if constexpr (!reduces(C)) {
      return &device::adaptive::adaptive_kernel<device::raw_byte, M, A>;
    } else {
      return device::with_compiled_dtype<kernel_fn_t>(t, nullptr, [](auto e) -> kernel_fn_t {
        return &device::adaptive::adaptive_kernel<typename decltype(e)::type, M, A>;
      });
    }
  }

  template <collective C>
  plan run(void const* in, void* out, std::size_t count, dtype t, redop op, int root, cudaStream_t s) {
    return run<C>(in, out, count, t, op, root, s, select<C>(t));
  }

  template <collective C>
  plan run(void const* in, void* out, std::size_t count, dtype t, redop op, int root, cudaStream_t s,
           device::adaptive::kernel_fn_t k) {
    constexpr collective c = C;
    launch_options lo;
    lo.algo = algorithm::pipelined;
    lo.lane = o_.lane;
    lo.vts = o_.vts;
    lo.ctas = o_.vts * o_.ctas_per_vt;
    lo.chunk_bytes = o_.chunk_bytes;
    plan p;
    device::adaptive::adaptive_args a;
    try {
      a.base = c_->prepare(c, in, out, count, t, op, root, lo, p);
    } catch (buffer_error const&) {
      c_->raise_rejection(lo.lane, s);  // peers already waiting in this call stop now
      throw;
    }
    if (count == 0) return p;
    if (p.n_vts != o_.vts || p.ctas_per_vt != o_.ctas_per_vt)
      throw error(status::internal, "adaptive_lane: the communicator changed the VT geometry");
    a.vt_timeout_ns = o_.vt_timeout_ns;
    a.probe_grace_ns = o_.probe_grace_ns;
    a.unit_bytes = reduces(c) ? static_cast<std::uint32_t>(size_of(t)) : 1u;
    int const V = reduces(c) ? static_cast<int>(16 / size_of(t)) : 16;
    a.granule = static_cast<std::uint64_t>(V);
    a.n_vts = o_.vts;
    a.data_ctas = p.grid;
    a.ablate = o_.ablate;
    if (k == nullptr) throw error(status::invalid_argument, "adaptive_lane: unknown dtype");
    RECCL_CUDA_CHECK(cudaSetDevice(c_->device()));
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = dim3(static_cast<unsigned>(p.grid + 1));
    cfg.blockDim = dim3(device::cta_threads);
    cfg.stream = s;
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = attr;
    cfg.numAttrs = c_->config().pdl ? 1 : 0;
    cudaError_t const e = cudaLaunchKernelEx(&cfg, k, a);
    if (e != cudaSuccess) throw error(status::internal, std::string("adaptive kernel launch: ") + cudaGetErrorString(e));
    return p;
  }

  nvlink_communicator* c_;
  adaptive_options o_;
  std::uint64_t model_seq_ = 0;
};

}  // namespace reccl
