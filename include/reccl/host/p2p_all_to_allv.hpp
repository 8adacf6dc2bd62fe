// reccl/host/p2p_all_to_allv.hpp -- all_to_allv<T, S, transport::p2p, M, A>: the all-to-allv of
// reccl/all_to_allv.hpp on GPUs, counts and offsets in device memory (e.g. written by the kernel
// before it), no host synchronisation, capturable (device/agent/all_to_allv.hpp).
//
//   using a2av = reccl::all_to_allv<bf16_t, reccl::schedule::all_to_all, reccl::transport::p2p,
//                                   reccl::telemetry::none, reccl::allocator::equal>;
//   T* recv = static_cast<T*>(comm.allocate(cap * sizeof(T)));     // in the window, once
//   a2av::run(comm, {send, send_len, d_send_counts, d_send_offsets},
//                   {recv, cap, d_recv_counts, d_recv_offsets}, stream);
//
// The send buffer and the four count arrays are any device memory this GPU reads (writes, for the
// receive counts); the receive buffer must lie in this rank's window (comm.allocate()), where
// peers write into it directly: one crossing per byte, no staging. On the GPU the exchange is
// direct (each rank puts its block into each peer's buffer) for either Schedule that implements
// all_to_all; the relay schedule runs on the CPU engine only. Telemetry and Allocator have no
// effect here yet (no VT split).
//
// Errors: host-side checks (null count arrays, misaligned buffers, a receive buffer outside the
// window, a bad CTA count) fail the call on every rank at once and throw here, as the composed
// collectives do. Counts are on the device, so their checks run in the kernel: counts or offsets
// outside a rank's send buffer, or more arriving than a rank's receive buffer holds, record a
// fault naming that rank on every rank and move no data; check() throws it. Faults are sticky.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "../all_to_allv.hpp"
#include "../device/agent/all_to_allv.hpp"
#include "p2p_collective.hpp"

namespace reccl {

/// Per-call options of the GPU all-to-allv.
struct a2av_call_options {
  /// CTAs, each moving 1/ctas of every block (at most p2p_config::plan_max_ctas). Every rank passes
  /// the same value in one call (the kernel checks: a mismatch fails every rank, naming one that
  /// differs from rank 0); calls may use different values.
  std::int32_t ctas = 4;
};

namespace detail {
/// The all-to-allv lane of a communicator, reserved on first use (every rank's first all-to-allv).
struct a2av_state {
  device::a2av_lane lane{};
  bool reserved = false;
};
}  // namespace detail

template <class T, Schedule S, Telemetry M, Allocator A>
void run_all_to_allv(p2p_communicator& comm, v_send<T> send, v_recv<T> recv, cudaStream_t stream, a2av_call_options const& o = {}) {
  static_assert(S::supports(collective::all_to_all), "reccl: all_to_allv needs a schedule that implements all_to_all");
  int const me = comm.rank(), n = comm.size();
  auto reject = [&](device::fault_cause cause, std::string const& what) {
    comm.raise_everywhere(device::fault{status::invalid_argument, me, -1, -1, cause}, stream);
    throw reccl::error(status::invalid_argument, "all_to_allv: " + what, me);
  };
  if (send.counts == nullptr || send.offsets == nullptr || recv.counts == nullptr || recv.offsets == nullptr)
    reject(device::fault_cause::null_buffer, "a count or offset array is null");
  if (send.len > 0 && send.data == nullptr) reject(device::fault_cause::null_buffer, "send buffer is null");
  constexpr std::uint64_t max_len = (std::uint64_t{1} << 62) / sizeof(T);  // byte counts stay far from wrapping
  if (send.len > max_len || recv.len > max_len) reject(device::fault_cause::bad_argument, "a buffer length is larger than 2^62 bytes");
  auto misaligned = [](void const* p, std::size_t a) { return reinterpret_cast<std::uintptr_t>(p) % a != 0; };
  if (misaligned(send.data, alignof(T)) || misaligned(recv.data, alignof(T)) || misaligned(send.counts, 8) ||
      misaligned(send.offsets, 8) || misaligned(recv.counts, 8) || misaligned(recv.offsets, 8))
    reject(device::fault_cause::misaligned_buffer, "a buffer is not aligned to its element size");
  if (recv.len > 0 && (recv.data == nullptr || !comm.handle().in_window(recv.data, recv.len * sizeof(T))))
    reject(device::fault_cause::buffer_not_in_window,
           "the receive buffer is not in this rank's window (allocate it with p2p_communicator::allocate)");
  detail::a2av_state& st = comm.attachment<detail::a2av_state>();
  if (!st.reserved) {
    if (detail::capturing(stream))
      reject(device::fault_cause::bad_argument, "the first all_to_allv reserves its flags, which cannot happen during graph capture: "
                                                "run the call once before capturing");
    int const m = comm.config().plan_max_ctas;
    st.lane.counts = comm.reserve_flags(m);
    st.lane.data = comm.reserve_flags(m);
    st.lane.table_offset = comm.reserve_bytes(device::a2av_lane::table_bytes(n, m), 128);
    st.lane.max_ctas = m;
    st.reserved = true;
  }
  if (o.ctas < 1 || o.ctas > st.lane.max_ctas)
    reject(device::fault_cause::bad_argument, "ctas must be in [1, " + std::to_string(st.lane.max_ctas) + "] (p2p_config::plan_max_ctas)");
  load_kernel(reinterpret_cast<void const*>(&device::a2av_kernel<T>));
  if (std::string const why = co_resident_problem(reinterpret_cast<void const*>(&device::a2av_kernel<T>), o.ctas,
                                                  device::a2av_threads, 0, comm.ranks_sharing_device());
      !why.empty())
    reject(device::fault_cause::bad_argument, "ctas: " + why);

  device::a2av_args<T> a{};
  a.h = comm.handle();
  a.lane = st.lane;
  a.send = send.data;
  a.send_len = send.len;
  a.send_counts = send.counts;
  a.send_offsets = send.offsets;
  a.recv = recv.data;
  a.recv_len = recv.len;
  a.recv_counts = recv.counts;
  a.recv_offsets = recv.offsets;
  device::a2av_kernel<T><<<o.ctas, device::a2av_threads, 0, stream>>>(a);
  RECCL_CUDA_CHECK(cudaGetLastError());
}

}  // namespace reccl
