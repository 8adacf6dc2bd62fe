// reccl/device/primitives.hpp -- the few memory instructions the NVLink data path is built from.
//
//  * 16-byte packs: every bulk move is one 16-byte vector per thread (the widest access on sm_90).
//  * System-scope flags: write remote, poll local. A flag store is a release (or a relaxed store after
//    an explicit fence); a successful poll is an acquire. Cross-GPU flags always use `.sys` scope.
//  * Staged data written by a peer is read with `ld.global.cg` (L2 only), so a line cached in L1 by
//    an earlier use of the same ring slot can never be returned.
//  * Time: `%globaltimer` (nanoseconds, same clock for every SM of a GPU) bounds every wait.
//  * Programmatic dependent launch (PDL): a kernel may be launched while its predecessor runs;
//    `pdl_wait()` (griddepcontrol.wait) returns once every prerequisite grid has completed and its
//    memory operations are visible, and must precede the first access to anything they wrote.
//    `pdl_trigger()` only lets the next grid be scheduled, so reccl kernels call it right away.
//
// Device-only; included only by nvcc-compiled translation units.
#pragma once

#include <cstdint>

#include "../config.hpp"

#if !defined(__CUDACC__)
#error "reccl/device headers need a CUDA compiler (nvcc)"
#endif

namespace reccl::device {

/// Threads per CTA of every reccl kernel; the warp roles of each engine are fixed against it.
inline constexpr int cta_threads = 512;
inline constexpr int cta_warps = cta_threads / 32;

/// Ranks one device-path kernel reaches through LSA pointers (one NVLink domain of one node).
inline constexpr int max_lsa = 8;

/// One 16-byte pack: the unit of every vector load and store.
struct alignas(16) pack16 {
  std::uint32_t w[4];
};

/// The word a poisoned (not yet written) Lamport slot holds: the bit pattern of -0.0f. Float
/// payloads are canonicalised (-0 becomes +0) before they travel, so no payload word equals it.
inline constexpr std::uint32_t lamport_sentinel = 0x80000000u;

RECCL_DEVICE std::uint64_t globaltimer() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// ---- 16-byte packs -----------------------------------------------------------------------------

/// Plain (weak) 16-byte load; the pointer must be 16-byte aligned.
RECCL_DEVICE pack16 load_pack(void const* p) {
  uint4 v = *static_cast<uint4 const*>(p);
  return pack16{{v.x, v.y, v.z, v.w}};
}
/// 16-byte load that bypasses L1 (data a peer wrote into this GPU's memory).
RECCL_DEVICE pack16 load_pack_cg(void const* p) {
  uint4 v = __ldcg(static_cast<uint4 const*>(p));
  return pack16{{v.x, v.y, v.z, v.w}};
}
/// Plain 16-byte store (local or peer memory).
RECCL_DEVICE void store_pack(void* p, pack16 v) {
  *static_cast<uint4*>(p) = make_uint4(v.w[0], v.w[1], v.w[2], v.w[3]);
}
/// Relaxed system-scope 16-byte load: always observes the newest value in L2/HBM (Lamport polling).
RECCL_DEVICE pack16 load_pack_relaxed_sys(void const* p) {
  pack16 v;
  asm volatile("ld.relaxed.sys.global.v4.b32 {%0,%1,%2,%3}, [%4];"
               : "=r"(v.w[0]), "=r"(v.w[1]), "=r"(v.w[2]), "=r"(v.w[3])
               : "l"(p)
               : "memory");
  return v;
}
/// Relaxed system-scope 16-byte store (a Lamport packet: data and its own "arrived" flag at once).
RECCL_DEVICE void store_pack_relaxed_sys(void* p, pack16 v) {
  asm volatile("st.relaxed.sys.global.v4.b32 [%0], {%1,%2,%3,%4};" ::"l"(p), "r"(v.w[0]), "r"(v.w[1]), "r"(v.w[2]),
               "r"(v.w[3])
               : "memory");
}
/// True when no 4-byte word of the pack still holds the Lamport sentinel. Every word is checked:
/// only 8-byte atomicity is architecturally guaranteed for a 16-byte store.
RECCL_DEVICE bool lamport_arrived(pack16 const& v) {
  return v.w[0] != lamport_sentinel && v.w[1] != lamport_sentinel && v.w[2] != lamport_sentinel &&
         v.w[3] != lamport_sentinel;
}
RECCL_DEVICE pack16 lamport_poison() { return pack16{{lamport_sentinel, lamport_sentinel, lamport_sentinel, lamport_sentinel}}; }

// ---- 64-bit flags ------------------------------------------------------------------------------

RECCL_DEVICE std::uint64_t load_acquire_sys(std::uint64_t const* p) {
  std::uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
RECCL_DEVICE std::uint64_t load_relaxed_sys(std::uint64_t const* p) {
  std::uint64_t v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
RECCL_DEVICE void store_release_sys(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
RECCL_DEVICE void store_relaxed_sys(std::uint64_t* p, std::uint64_t v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}
/// Release+acquire fence at system scope: orders everything this thread (and, through a preceding
/// warp/CTA barrier, its group) did before it against everything after it, for every observer.
RECCL_DEVICE void fence_sys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

// ---- programmatic dependent launch -------------------------------------------------------------

/// Wait until the preceding kernel in the stream has completed and its writes are visible.
/// A no-op when the kernel was launched without the PDL attribute.
RECCL_DEVICE void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
/// Allow the next kernel in the stream to start launching (its pdl_wait still waits for us).
RECCL_DEVICE void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

}  // namespace reccl::device
