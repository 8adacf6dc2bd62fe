// reccl/host/nvlink/setup_kernels.hpp -- the kernels an NVLink-path communicator runs besides the
// collectives: at creation or registration, resolving a window's peer addresses, poisoning slots
// ("not arrived") and the hello handshake that fails creation when ranks were configured
// differently; and, when its host-side checks reject a call, raising that on every rank's lane.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../../device/primitives.hpp"
#include "../../device/spin_until.hpp"
#include "../../device/transport/lsa.hpp"
#include "../../device/wait.hpp"
#include "../../types.hpp"
#include "../call_digest.hpp"
#include "../nccl.hpp"
#include "config.hpp"

namespace reccl::detail {

template <int Unused = 0>
__global__ void resolve_lsa_kernel(ncclWindow_t win, int n, void** out) {
  int const p = static_cast<int>(threadIdx.x);
  if (p < n) out[p] = ncclGetLsaPointer(win, 0, p);
}

template <int Unused = 0>
__global__ void poison_kernel(std::uint32_t* p, std::uint64_t words) {
  for (std::uint64_t i = blockIdx.x * std::uint64_t(blockDim.x) + threadIdx.x; i < words;
       i += std::uint64_t(gridDim.x) * blockDim.x)
    p[i] = device::lamport_sentinel;
}

/// Each rank writes `token` into every peer's hello word for it, then waits for every peer's.
template <int Unused = 0>
__global__ void hello_kernel(device::lsa_view v, std::uint64_t token, std::uint64_t timeout_ns, std::uint32_t* result) {
  int const t = static_cast<int>(threadIdx.x);
  if (t >= v.nranks || t == v.rank) return;
  device::store_release_sys(reinterpret_cast<std::uint64_t*>(v.scratch[t]) + v.rank, token);
  std::uint64_t const* mine = reinterpret_cast<std::uint64_t const*>(v.scratch[v.rank]) + t;
  device::deadline_guard g{device::deadline_clock(timeout_ns)};  // no lane yet: the deadline alone
  std::uint64_t got = 0;
  if (!device::spin_until([&] { return (got = device::load_acquire_sys(mine)) != 0; }, g)) {
    atomicCAS(result, 0u, static_cast<std::uint32_t>(status::timeout));
  } else if (got != token) {
    atomicCAS(result, 0u, static_cast<std::uint32_t>(status::mismatch));
  }
}

/// A call rejected on the host by rank v.rank: its lane fails on every rank with
/// status::invalid_argument and the rejecting rank recorded, so the peers' kernels of that call
/// stop at their next poll period (lane_guard) instead of at their deadline. An error already on a
/// lane stays (the first wins; check() then ignores the name); `recovered` (not an error) is replaced.
/// System-scope atomics: the owner's own kernels CAS the same word.
template <int Unused = 0>
__global__ void raise_rejection_kernel(device::lsa_view v) {
  int const owner = static_cast<int>(threadIdx.x);
  if (owner >= v.nranks) return;
  // the name first (the first rejecting rank keeps it), then the status a peer's waits react to:
  // whoever sees the status and then reads the name finds it
  atomicCAS_system(v.rejected_by(owner), 0u, static_cast<std::uint32_t>(v.rank + 1));
  __threadfence_system();
  std::uint32_t* const word = v.status_of(owner);
  std::uint32_t const bad = static_cast<std::uint32_t>(status::invalid_argument);
  if (atomicCAS_system(word, 0u, bad) == static_cast<std::uint32_t>(status::recovered))
    atomicCAS_system(word, static_cast<std::uint32_t>(status::recovered), bad);
}

/// The configuration digest each rank sends in the hello handshake: every field that must be equal
/// on all ranks (not timeout_ns, not pdl). Never 0, the "not arrived" value of a hello word.
inline std::uint64_t hello_token(int nranks, nvlink_config const& c) {
  std::uint32_t h = fnv_basis;
  h = fnv_add(h, nranks);
  h = fnv_add(h, c.lanes);
  h = fnv_add(h, c.max_ctas);
  h = fnv_add(h, c.one_shot_slot_bytes);
  h = fnv_add(h, c.ring_chunk_bytes);
  h = fnv_add(h, c.ring_depth);
  h = fnv_add(h, c.tune);
  return (static_cast<std::uint64_t>(h) << 1) | 1u;  // never 0
}

}  // namespace reccl::detail
