// reccl/proxy/collective.hpp -- the five collectives over the proxy transport: one CTA per VT whose
// thread 0 posts puts and signals and waits for the peers' signals; the copy engines (or the NIC)
// move every byte, and SMs only reduce.
//
// Buffers live in the window's symmetric region, at the same offset on every rank (copy
// collectives write straight into the peers' outputs, reductions stage through the receive areas).
// Each VT owns one contiguous block of every segment, sized by the call's shares (an Allocator's
// output, equal by default) in whole 16-byte packs: the split moves bytes between VTs, never results.
//
//   all-gather, all-to-all, broadcast (3 steps per VT)
//     step b  barrier: signal ready b+1 to every peer, wait for theirs (their outputs are free)
//     step d  put my block straight into each destination's output (peer == me: a local copy),
//             each put followed by ready d+1; wait for ready d+1 from every source
//     end     flush: my puts have read their sources, the caller may reuse the input
//   reduce-scatter (K rounds per VT), all-reduce (K rounds, then one step)
//     round k (slot = global round % slots of my receive area for each peer)
//             post round k + slots - 1: wait for the peer's credit for the round that last used
//             its slot, put the peer's chunk of my input there with ready (rounds 0 .. slots - 2
//             are posted before round 0); wait for every peer's chunk k, reduce in rank order
//             (fp32 accumulation of 16-bit floats, as the NVLink path), credit each peer
//     all-reduce: put my reduced block into every peer's output with ready, wait for theirs
//
// The step and round counters advance alike on every rank (they depend only on the arguments all
// ranks pass), live in device memory, and carry over from one collective to the next: a kernel
// replayed in a CUDA graph continues them. Memory order: SM writes (the reduction) are made
// visible to the copy engines by a system-scope fence before the put that reads them; a wait that
// returns ok acquires the bytes of every put the peer queued before its signal.
//
// Inline puts: a put of at most inline_bytes (a proxy_collectives option, 1 KiB by default) is
// written by thread 0 into the queue itself (put_inline / put_symmetric_inline) instead of being
// copied by the proxy from the window. That saves the proxy a device-to-device copy (~4 us of its
// driver time each, and the copies of all VTs queue behind one proxy thread) for one 16-byte store
// across PCIe per 16 bytes on the posting thread. Measured on one H200 (two loopback ranks, bench/
// NOTES.md 27): calls whose puts all go inline take 0.51-0.79x the time with 4 or 8 VTs; with one
// VT 0.83-1.06x at 1 KiB (one thread's stores cost about what the copy saves). Their sources are
// read by the posting thread (the input, or the CTA's own reduced bytes after a __syncthreads).
//
// Faults: every wait has the collective's deadline; the first failed wait or queue error of a rank
// is recorded (status, VT, peer, step) and that VT's CTA stops. The rank's counters are then out of
// step with its peers: the group must be rebuilt before the next collective.
//
// Peer checks (on where the ranks are in different processes, so the host's call_agreement sees
// one rank only): each VT sends every peer a 32-byte digest of its call (call index, collective,
// dtype, op, count, root, a hash of the split) as an inline put before its first signal to that
// peer, into the last 64 bytes of the peer's receive area (two slots: call index % 2; a peer is at
// most one call ahead of me on a VT). After its first wait on a peer returns, a VT compares the
// peer's digest with its own, before it writes anything a peer reads: a difference is
// status::mismatch naming the peer, the call and the field, and the VT stops. Copy collectives
// send it with their barrier signal; reductions before their first round (the first wait is on
// round 0, or on the final step when the VT has no round). A VT with nothing to exchange (no round,
// reduce-scatter) checks nothing and writes nothing.
//
// Module loading: a kernel that runs beside a proxy collective must be loaded before the collective
// starts. Under lazy loading (CUDA's default since 12.2) a kernel's first launch loads its module,
// which waits for the kernels already running, and the proxy threads' CUDA calls wait with it: a
// collective that needs its proxy then stalls until its deadline (measured: bench/NOTES.md 22). The
// collectives' own kernels are loaded when proxy_collectives is constructed; load the others with
// cudaFuncGetAttributes, or run with CUDA_MODULE_LOADING=EAGER.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../device/element.hpp"
#include "../device/primitives.hpp"
#include "../error.hpp"
#include "../host/error.hpp"
#include "../policy/allocator/allocator.hpp"
#include "../types.hpp"
#include "call_agreement.hpp"
#include "copy_engine_group.hpp"
#include "transport.hpp"

namespace reccl::proxy {

/// One rank's persistent collective state (device memory).
struct collective_state {
  std::uint64_t ready_step[max_vts];    ///< ready values used so far, per VT
  std::uint64_t credit_round[max_vts];  ///< reduce rounds so far (each uses one receive slot), per VT
  std::uint64_t stalls[max_vts];        ///< unsuccessful polls of this rank's waits, per VT, all collectives
  std::uint64_t calls[max_vts];         ///< collectives so far, per VT (the peer check's call index)
  std::uint32_t fault_status;           ///< first fault's reccl::status (0: none)
  std::int32_t fault_vt;
  std::int32_t fault_peer;
  std::uint32_t fault_field;            ///< mismatch: the call_field that differs
  std::uint64_t fault_step;             ///< ready step (or round) the failed wait was for; mismatch: the call index
};

/// What a peer check found different (collective_state::fault_field).
enum class call_field : std::uint32_t { none = 0, call_index, collective, dtype, op, count, root, vt_shares };

constexpr char const* name(call_field f) {
  switch (f) {
    case call_field::none: return "none";
    case call_field::call_index: return "call index (a rank skipped or added a call)";
    case call_field::collective: return "collective";
    case call_field::dtype: return "dtype";
    case call_field::op: return "op";
    case call_field::count: return "count";
    case call_field::root: return "root";
    case call_field::vt_shares: return "vt_shares";
  }
  return "?";
}

/// Arguments of one collective, the same on every rank (except the buffers' addresses, which are
/// each rank's own; their offsets in the symmetric region are the same).
struct collective_args {
  collective coll = collective::all_reduce;
  dtype type = dtype::float32;
  redop op = redop::sum;
  std::uint64_t count = 0;   ///< NCCL's meaning: all-gather's send count, reduce-scatter's receive count, ...
  void const* in = nullptr;  ///< in my symmetric region
  void* out = nullptr;       ///< in my symmetric region
  std::int32_t root = 0;     ///< broadcast
  std::uint64_t timeout_ns = 10'000'000'000ull;  ///< deadline of every wait, from the kernel's start
  std::uint32_t slots = 0;   ///< set by proxy_collectives (its slot count; the same for every call)
  /// Each VT's share of every segment (an Allocator's output; check() must accept it and its n_vts
  /// must be the group's VT count), the same on every rank; a masked VT carries no bytes but still
  /// takes part in every step. n_vts == 0: equal shares over all VTs.
  reccl::shares vt_shares{};
  /// Whether each VT checks, on the device, that every peer's call has the same arguments (set by
  /// proxy_collectives: on where the ranks are in different processes; see the file comment).
  bool peer_checks = false;
  /// Puts of at most this many bytes go inline (set by proxy_collectives; see the file comment).
  /// A rank's own choice: the bytes that land are the same either way.
  std::uint32_t inline_max = 0;
};

namespace detail {

/// Bytes at the end of every receive area that carry the peer check's call digests (two calls in
/// flight at most: slot = call index % 2); the reduce slots share the rest of the area.
inline constexpr std::uint64_t digest_area_bytes = 64;
RECCL_HOST_DEVICE constexpr std::uint64_t data_area(std::uint64_t area_bytes) {
  return area_bytes > digest_area_bytes ? area_bytes - digest_area_bytes : 0;
}

/// A call as the peer check compares it: 32 bytes, sent inline with the first signal to each peer.
struct call_words {
  std::uint64_t call;    ///< this VT's call index
  std::uint64_t count;
  std::uint32_t kind;    ///< collective | dtype << 8 | op << 16
  std::int32_t root;
  std::uint64_t shares;  ///< FNV-1a of the resolved split
};
static_assert(sizeof(call_words) == 32 && 2 * sizeof(call_words) <= digest_area_bytes);

RECCL_HOST_DEVICE call_words make_call_words(collective_args const& a, std::uint64_t call) {
  std::uint64_t h = 1469598103934665603ull;
  auto mix = [&](std::uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xffu;
      h *= 1099511628211ull;
    }
  };
  mix(static_cast<std::uint64_t>(a.vt_shares.n_vts));
  mix(a.vt_shares.live_mask);
  for (int i = 0; i < max_vts; ++i) mix(a.vt_shares.w[i]);
  return {call, a.count, static_cast<std::uint32_t>(a.coll) | static_cast<std::uint32_t>(a.type) << 8 | static_cast<std::uint32_t>(a.op) << 16,
          a.coll == collective::broadcast ? a.root : 0, h};
}
/// The first field in which `theirs` differs from `mine` (none if they agree).
RECCL_HOST_DEVICE call_field first_difference(call_words const& mine, call_words const& theirs) {
  if (theirs.call != mine.call) return call_field::call_index;
  if ((theirs.kind & 0xffu) != (mine.kind & 0xffu)) return call_field::collective;
  if ((theirs.kind >> 8 & 0xffu) != (mine.kind >> 8 & 0xffu)) return call_field::dtype;
  if ((theirs.kind >> 16) != (mine.kind >> 16)) return call_field::op;
  if (theirs.count != mine.count) return call_field::count;
  if (theirs.root != mine.root) return call_field::root;
  if (theirs.shares != mine.shares) return call_field::vt_shares;
  return call_field::none;
}

RECCL_HOST_DEVICE constexpr std::uint64_t ceil_div(std::uint64_t a, std::uint64_t b) { return (a + b - 1) / b; }

/// Elements of each rank's segment for the VT split (all-reduce: the padded block).
RECCL_HOST_DEVICE std::uint64_t segment_elems(collective c, std::uint64_t count, int n, int pack) {
  if (c != collective::all_reduce) return count;
  return ceil_div(ceil_div(count, static_cast<std::uint64_t>(n)), static_cast<std::uint64_t>(pack)) * static_cast<std::uint64_t>(pack);
}
/// Elements of rank p's segment: all-reduce cuts `count` into segments of `seg` (the last ones may
/// be shorter or empty), the others have `count` per segment.
RECCL_HOST_DEVICE std::uint64_t segment_len(collective c, std::uint64_t count, std::uint64_t seg, int p) {
  if (c != collective::all_reduce) return count;
  std::uint64_t const b = static_cast<std::uint64_t>(p) * seg;
  return count > b ? (count - b < seg ? count - b : seg) : 0;
}
/// VT vt's range [lo, hi) of a segment of `seg` elements: its block of the split `s` describes, in
/// whole packs (the last live VT also takes seg % pack).
RECCL_HOST_DEVICE void vt_range(reccl::shares const& s, std::uint64_t seg, int pack, int vt, std::uint64_t& lo, std::uint64_t& hi) {
  reccl::split const sp = reccl::to_split(s, seg, static_cast<std::uint64_t>(pack));
  lo = sp.offset(vt);
  hi = lo + sp.count[vt];
}
/// Elements of slot capacity (a multiple of the pack).
RECCL_HOST_DEVICE std::uint64_t slot_elems(std::uint64_t area_bytes, std::uint32_t slots, std::uint64_t es, int pack) {
  std::uint64_t const e = area_bytes / slots / es;
  return e / static_cast<std::uint64_t>(pack) * static_cast<std::uint64_t>(pack);
}

#if defined(__CUDACC__)

struct cta_control {
  int abort;
  char const* src[max_ranks];
};

// Thread 0: records the first fault of this rank and tells the CTA to stop.
__device__ inline void record_fault(collective_state* st, cta_control& cc, status s, int vt, int peer, std::uint64_t step) {
  if (atomicCAS(&st->fault_status, 0u, static_cast<std::uint32_t>(s)) == 0u) {
    st->fault_vt = vt;
    st->fault_peer = peer;
    st->fault_step = step;
  }
  cc.abort = 1;
}

// Thread 0: one wait, with the fault recorded. false: stop.
__device__ inline bool wait_for(transport::proxy::handle const& h, collective_state* st, cta_control& cc, int vt, int peer, flag f,
                                std::uint64_t v, std::uint64_t dl, std::uint64_t& spins) {
  wait_result const w = h.wait(vt, peer, f, v, dl);
  spins += w.spins;
  if (w.st == status::ok) return true;
  record_fault(st, cc, w.st, vt, peer, v);
  return false;
}

// Thread 0, peer checks: where my call digest lands in peer's receive area (slot call % 2).
__device__ inline std::uint64_t digest_offset(transport::proxy::handle const& h, std::uint64_t call) {
  return data_area(h.layout.area_bytes) + (call & 1u) * sizeof(call_words);
}
// Thread 0, peer checks: after a wait on `peer`'s ready flag returned ok (which acquires the digest
// the peer sent before that signal), compares the peer's digest with mine. false: stop.
__device__ inline bool check_peer(transport::proxy::handle const& h, collective_state* st, cta_control& cc, int vt, int peer,
                                  call_words const& mine) {
  auto const* w = reinterpret_cast<std::uint64_t const volatile*>(h.recv_area(vt, peer) + digest_offset(h, mine.call));
  call_words theirs{};
  theirs.call = w[0];
  theirs.count = w[1];
  std::uint64_t const kr = w[2];
  theirs.kind = static_cast<std::uint32_t>(kr);
  theirs.root = static_cast<std::int32_t>(kr >> 32);
  theirs.shares = w[3];
  call_field const f = first_difference(mine, theirs);
  if (f == call_field::none) return true;
  if (atomicCAS(&st->fault_status, 0u, static_cast<std::uint32_t>(status::mismatch)) == 0u) {
    st->fault_vt = vt;
    st->fault_peer = peer;
    st->fault_field = static_cast<std::uint32_t>(f);
    st->fault_step = mine.call;
  }
  cc.abort = 1;
  return false;
}

// Thread 0: `bytes` at src to peer's window at dst's offset in mine (dst in my symmetric region),
// then ready `val`: inline up to inline_max bytes, else copied from my window; no bytes: the
// signal alone.
__device__ inline void put_symmetric_block(transport::proxy::handle const& h, int vt, int peer, char const* dst, char const* src,
                                           std::uint64_t bytes, std::uint32_t inline_max, std::uint64_t val) {
  if (bytes > 0 && bytes <= inline_max) h.put_symmetric_inline(vt, peer, dst, src, bytes, flag::ready, val);
  else if (bytes > 0) h.put_symmetric_with_signal(vt, peer, dst, src, bytes, flag::ready, val);
  else h.signal(vt, peer, flag::ready, val);
}

// All threads: dst[0, n) = reduction, in rank order, of src[0..nranks)[0, n). Sources and dst may
// be unaligned (element loads then).
template <class T>
__device__ void reduce_block(redop op, int nranks, char const* const* src, char* dst, std::uint64_t n) {
  constexpr int V = device::pack_elems<T>;
  bool vec = (reinterpret_cast<std::uintptr_t>(dst) & 15u) == 0;
  for (int r = 0; r < nranks; ++r) vec = vec && (reinterpret_cast<std::uintptr_t>(src[r]) & 15u) == 0;
  device::elem_range const range{0, n};
  std::uint64_t const packs = ceil_div(n, V);
  for (std::uint64_t j = threadIdx.x; j < packs; j += blockDim.x) {
    device::acc_pack<T> a = device::to_acc<T>(device::load_user<T>(src[0], j, range, vec));
    for (int r = 1; r < nranks; ++r) device::combine_into<T>(op, a, device::load_user<T>(src[r], j, range, vec));
    device::store_user<T>(dst, j, range, vec, device::from_acc<T>(op, a, nranks));
  }
}

// The reduce rounds of reduce-scatter and of all-reduce's first phase, for VT vt. Segment p of the
// input starts at element in_seg * p; my reduced segment goes to `out_mine`. segment_len() clips
// the shared VT grid to segment p's length (all-reduce's last segments may be shorter).
template <class T>
__device__ bool reduce_rounds(transport::proxy::handle const& h, collective_args const& a, collective_state* st, cta_control& cc,
                              int vt, std::uint64_t seg, std::uint64_t in_seg, char* out_mine, std::uint64_t ready0,
                              std::uint64_t round0, std::uint64_t dl, std::uint64_t& spins, std::uint64_t& rounds,
                              call_words const* check) {
  constexpr int V = device::pack_elems<T>;
  constexpr std::uint64_t es = sizeof(T);
  int const me = h.rank, n = h.layout.nranks;
  std::uint64_t lo = 0, hi = 0;
  vt_range(a.vt_shares, seg, V, vt, lo, hi);
  std::uint64_t const S = slot_elems(data_area(h.layout.area_bytes), a.slots, es, V);
  std::uint64_t const slot_bytes = data_area(h.layout.area_bytes) / a.slots;
  rounds = hi > lo ? ceil_div(hi - lo, S) : 0;
  auto const* in = static_cast<char const*>(a.in);
  auto chunk = [&](std::uint64_t k, int p, std::uint64_t& plo, std::uint64_t& phi) {
    std::uint64_t const c_lo = lo + k * S, c_hi = c_lo + S < hi ? c_lo + S : hi, L = segment_len(a.coll, a.count, seg, p);
    plo = c_lo < L ? c_lo : L;
    phi = c_hi < L ? c_hi : L;
  };
  // Thread 0: round k's chunk to every peer, once the peer has freed the slot (its credit for the
  // round that used the slot before).
  auto post = [&](std::uint64_t k) {
    std::uint64_t const g = round0 + k, slot = g % a.slots, val = ready0 + k + 1;
    for (int p = 0; p < n && !cc.abort; ++p)
      if (p != me && g >= a.slots) wait_for(h, st, cc, vt, p, flag::credit, g - a.slots + 1, dl, spins);
    for (int p = 0; p < n && !cc.abort; ++p) {
      if (p == me) continue;
      std::uint64_t plo = 0, phi = 0;
      chunk(k, p, plo, phi);
      char const* const src = in + (in_seg * static_cast<std::uint64_t>(p) + plo) * es;
      std::uint64_t const bytes = (phi - plo) * es;
      if (phi > plo && bytes <= a.inline_max)
        h.put_inline(vt, p, slot * slot_bytes, src, bytes, flag::ready, val);
      else if (phi > plo)
        h.put_with_signal(vt, p, slot * slot_bytes, src, bytes, flag::ready, val);
      else
        h.signal(vt, p, flag::ready, val);
    }
  };
  // slots - 1 rounds posted ahead: the copies of the next rounds run while this CTA reduces
  std::uint64_t const ahead = a.slots - 1;
  if (threadIdx.x == 0)
    for (std::uint64_t k = 0; k < ahead && k < rounds; ++k) post(k);
  for (std::uint64_t k = 0; k < rounds; ++k) {
    std::uint64_t const g = round0 + k, slot = g % a.slots, val = ready0 + k + 1;
    if (threadIdx.x == 0) {
      if (k + ahead < rounds) post(k + ahead);  // its slot's credit is for round k - 1, done by now
      for (int p = 0; p < n && !cc.abort; ++p) {
        if (p == me) continue;
        if (wait_for(h, st, cc, vt, p, flag::ready, val, dl, spins) && check && k == 0) check_peer(h, st, cc, vt, p, *check);
        cc.src[p] = reinterpret_cast<char const*>(h.recv_area(vt, p)) + slot * slot_bytes;
      }
      std::uint64_t plo = 0, phi = 0;
      chunk(k, me, plo, phi);
      cc.src[me] = in + (in_seg * static_cast<std::uint64_t>(me) + plo) * es;
    }
    __syncthreads();
    if (cc.abort) return false;
    std::uint64_t plo = 0, phi = 0;
    chunk(k, me, plo, phi);
    if (phi > plo) reduce_block<T>(a.op, n, cc.src, out_mine + plo * es, phi - plo);
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence_system();  // the reduction's reads of the slots are done before the peers refill them
      for (int p = 0; p < n; ++p)
        if (p != me) h.signal(vt, p, flag::credit, g + 1);
    }
  }
  return true;
}

template <class T>
__global__ void __launch_bounds__(512) collective_kernel(transport::proxy::handle h, collective_args a, collective_state* st) {
  __shared__ cta_control cc;
  int const vt = static_cast<int>(blockIdx.x);
  int const me = h.rank, n = h.layout.nranks;
  if (threadIdx.x == 0) cc.abort = 0;
  __syncthreads();
  std::uint64_t const dl = reccl::proxy::clock_ns() + a.timeout_ns;
  std::uint64_t spins = 0, steps = 0, rounds = 0;
  std::uint64_t const ready0 = st->ready_step[vt], round0 = st->credit_round[vt];
  bool ok = true;
  // peer checks: my call's digest, sent to every peer before my first signal to it (inline, so the
  // signal carries it; file comment), compared with each peer's after my first wait on it
  call_words const mine = make_call_words(a, st->calls[vt]);
  call_words const* const check = a.peer_checks ? &mine : nullptr;

  if constexpr (!std::is_same_v<T, device::raw_byte>) {
    // reductions
    constexpr int V = device::pack_elems<T>;
    constexpr std::uint64_t es = sizeof(T);
    std::uint64_t const seg = segment_elems(a.coll, a.count, n, V);
    char* out = static_cast<char*>(a.out);
    char* out_mine = a.coll == collective::all_reduce ? out + static_cast<std::uint64_t>(me) * seg * es : out;
    std::uint64_t const in_seg = a.coll == collective::all_reduce ? seg : a.count;
    if (check && threadIdx.x == 0)
      for (int p = 0; p < n; ++p)
        if (p != me) h.put_inline(vt, p, digest_offset(h, mine.call), &mine, sizeof mine);
    ok = reduce_rounds<T>(h, a, st, cc, vt, seg, in_seg, out_mine, ready0, round0, dl, spins, rounds, check);
    steps = rounds;
    if (ok && a.coll == collective::all_reduce) {
      // my reduced VT block into every peer's output
      std::uint64_t lo = 0, hi = 0;
      vt_range(a.vt_shares, seg, V, vt, lo, hi);
      std::uint64_t const L = segment_len(a.coll, a.count, seg, me);
      std::uint64_t const plo = lo < L ? lo : L, phi = hi < L ? hi : L;
      std::uint64_t const val = ready0 + rounds + 1;
      if (threadIdx.x == 0) {
        __threadfence_system();  // the CTA's reduced bytes are visible to the copy engines
        char const* p0 = out_mine + plo * es;
        for (int p = 0; p < n; ++p)
          if (p != me) put_symmetric_block(h, vt, p, p0, p0, (phi - plo) * es, a.inline_max, val);
        for (int p = 0; p < n && !cc.abort; ++p)
          if (p != me && wait_for(h, st, cc, vt, p, flag::ready, val, dl, spins) && check && rounds == 0)
            check_peer(h, st, cc, vt, p, mine);  // no reduce round: this was the first wait on p
      }
      steps = rounds + 1;
    }
  } else {
    // copies: in bytes; a.count is the segment's byte count here
    std::uint64_t lo = 0, hi = 0;
    vt_range(a.vt_shares, a.count, 16, vt, lo, hi);
    std::uint64_t const nb = hi - lo;
    auto const* in = static_cast<char const*>(a.in);
    char* out = static_cast<char*>(a.out);
    std::uint64_t const bar = ready0 + 1, val = ready0 + 2;
    if (threadIdx.x == 0) {
      for (int p = 0; p < n; ++p) {
        if (p == me) continue;
        if (check) h.put_inline(vt, p, digest_offset(h, mine.call), &mine, sizeof mine, flag::ready, bar);
        else h.signal(vt, p, flag::ready, bar);
      }
      for (int p = 0; p < n && !cc.abort; ++p)
        if (p != me && wait_for(h, st, cc, vt, p, flag::ready, bar, dl, spins) && check) check_peer(h, st, cc, vt, p, mine);
      if (!cc.abort) {
        auto put = [&](int p, char const* dst, char const* src) { put_symmetric_block(h, vt, p, dst, src, nb, a.inline_max, val); };
        std::uint64_t const mine = static_cast<std::uint64_t>(me) * a.count;
        bool self = true;  // whether I wait for a signal of my own
        if (a.coll == collective::all_gather) {
          self = in + lo != out + mine + lo;
          for (int p = 0; p < n; ++p)
            if (p != me || self) put(p, out + mine + lo, in + lo);
        } else if (a.coll == collective::all_to_all) {
          for (int p = 0; p < n; ++p) put(p, out + mine + lo, in + static_cast<std::uint64_t>(p) * a.count + lo);
        } else if (me == a.root) {  // broadcast
          self = in != out;
          for (int p = 0; p < n; ++p)
            if (p != me || self) put(p, out + lo, in + lo);
        }
        if (a.coll == collective::broadcast) {
          if (me != a.root) wait_for(h, st, cc, vt, a.root, flag::ready, val, dl, spins);
          else if (self) wait_for(h, st, cc, vt, me, flag::ready, val, dl, spins);
        } else {
          for (int p = 0; p < n && !cc.abort; ++p)
            if (p != me || self) wait_for(h, st, cc, vt, p, flag::ready, val, dl, spins);
        }
      }
    }
    steps = 2;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  if (ok && !cc.abort) {
    // my puts have read their sources (the caller may reuse the input; an all-reduce's output,
    // read by my last puts, may be overwritten)
    reccl::proxy::push_result const f = h.flush(vt, dl);
    if (f.st != status::ok) record_fault(st, cc, f.st, vt, me, ready0 + steps);
  }
  st->stalls[vt] += spins;
  if (!cc.abort) {
    st->ready_step[vt] = ready0 + steps;
    st->credit_round[vt] = round0 + rounds;
    st->calls[vt] = mine.call + 1;
  }
}

#endif  // __CUDACC__

}  // namespace detail

#if defined(__CUDACC__)

/// The five collectives on a copy_engine_group: per-rank state, argument checks, launches.
/// Launch on every rank (each on its own stream; on one GPU, loopback ranks run concurrently);
/// stream-ordered and capturable. Not thread-safe per rank.
class proxy_collectives {
 public:
  /// CTAs of one rank's launch: one per VT. Threads per CTA (they reduce).
  static constexpr int threads = 512;
  /// Whether the kernels compare every call's arguments with the peers' (see the file comment).
  /// automatic: on where the ranks are in different processes (the host check sees one rank only).
  enum class peer_checks { automatic, on, off };

  /// Puts of at most this many bytes go inline by default (see the file comment).
  static constexpr std::uint32_t default_inline_bytes = 1024;

  /// `slots`: reduce rounds in flight per peer; each receive area (less 64 bytes for the peer
  /// checks) is cut into that many slots. `inline_bytes`: the largest put that goes inline (0:
  /// none; at most max_inline_bytes); none where the group's backends carry no inline puts.
  explicit proxy_collectives(copy_engine_group& g, std::uint32_t slots = 4, peer_checks checks = peer_checks::automatic,
                             std::uint32_t inline_bytes = default_inline_bytes)
      : g_(g), slots_(slots), agree_(g.nranks()),
        checks_(checks == peer_checks::on || (checks == peer_checks::automatic && g.process_rank() >= 0)),
        inline_max_(g.inline_puts() ? inline_bytes : 0) {
    if (slots_ == 0 || detail::slot_elems(detail::data_area(g.layout().area_bytes), slots_, 8, 2) == 0)
      throw reccl::error(status::invalid_argument, "proxy_collectives: the receive area holds less than 16 bytes per slot (after the 64 bytes of the peer checks)");
    if (inline_bytes > max_inline_bytes)
      throw reccl::error(status::invalid_argument, "proxy_collectives: inline_bytes " + std::to_string(inline_bytes) +
                                                       " is more than an inline put carries (" + std::to_string(max_inline_bytes) + ")");
    int cur = 0;
    RECCL_CUDA_CHECK(cudaGetDevice(&cur));
    state_.resize(static_cast<std::size_t>(g.nranks()), nullptr);
    for (int r = 0; r < g.nranks(); ++r) {
      if (!g.is_local(r)) continue;
      RECCL_CUDA_CHECK(cudaSetDevice(g.memory(r).device));
      RECCL_CUDA_CHECK(cudaMalloc(&state_[static_cast<std::size_t>(r)], sizeof(collective_state)));
      RECCL_CUDA_CHECK(cudaMemset(state_[static_cast<std::size_t>(r)], 0, sizeof(collective_state)));
      load_kernels();  // on every rank's GPU: a lazy load at a launch would stall the proxies (file comment)
    }
    RECCL_CUDA_CHECK(cudaSetDevice(cur));
  }
  proxy_collectives(proxy_collectives const&) = delete;
  proxy_collectives& operator=(proxy_collectives const&) = delete;
  ~proxy_collectives() {  // cannot throw: failures are reported on stderr
    for (auto* s : state_)
      if (s) RECCL_CUDA_REPORT(cudaFree(s));
  }

  /// Checks `a` for rank `rank` and launches its kernel on `stream` (on the rank's GPU). Throws
  /// reccl::error (invalid_argument) for buffers outside the symmetric region or misaligned, an
  /// in-place all-to-all, a bad root or op; nothing is launched then. count == 0 launches nothing.
  /// Every rank must pass the same coll, type, op, count, root and vt_shares, and buffers at the
  /// same offsets of their symmetric regions (the puts land at the sender's offsets): a rank whose
  /// call disagrees with another rank's same call gets reccl::error (mismatch) naming both ranks and
  /// the field, and nothing is launched for it (its peers' kernels then time out at their deadline).
  void launch(int rank, collective_args a, cudaStream_t stream) {
    validate(rank, a);
    a.slots = slots_;
    a.peer_checks = checks_;
    a.inline_max = inline_max_;
    if (a.vt_shares.n_vts == 0) a.vt_shares = reccl::equal_shares(g_.layout().n_vts, reccl::all_live(g_.layout().n_vts));
    call_digest const d{a.coll, a.type, a.op, a.count, a.coll == collective::broadcast ? a.root : 0, a.vt_shares};
    if (g_.process_rank() < 0)
      if (std::string const why = agree_.record(rank, d); !why.empty())
        throw reccl::error(status::mismatch, "proxy collective: " + why, rank);
    if (a.count == 0) return;
    int cur = 0;
    RECCL_CUDA_CHECK(cudaGetDevice(&cur));
    RECCL_CUDA_CHECK(cudaSetDevice(g_.memory(rank).device));
    transport::proxy::handle const h = g_.handle(rank);
    dim3 const grid(static_cast<unsigned>(g_.layout().n_vts));
    collective_state* st = state_[static_cast<std::size_t>(rank)];
    if (!reduces(a.coll)) {
      collective_args b = a;
      b.count = a.count * size_of(a.type);  // copies run in bytes
      detail::collective_kernel<device::raw_byte><<<grid, threads, 0, stream>>>(h, b, st);
    } else {
      device::with_compiled_dtype<bool>(a.type, false, [&](auto e) {
        detail::collective_kernel<typename decltype(e)::type><<<grid, threads, 0, stream>>>(h, a, st);
        return true;
      });
    }
    cudaError_t const e = cudaGetLastError();
    RECCL_CUDA_CHECK(cudaSetDevice(cur));
    RECCL_CUDA_CHECK(e);
  }

  /// Rank `rank`'s state (synchronous copy: call after its stream finished).
  collective_state state(int rank) const {
    if (!g_.is_local(rank)) throw reccl::error(status::invalid_argument, "proxy collectives: rank " + std::to_string(rank) + " is not in this process", rank);
    collective_state s{};
    int cur = 0;
    RECCL_CUDA_CHECK(cudaGetDevice(&cur));
    RECCL_CUDA_CHECK(cudaSetDevice(g_.memory(rank).device));
    RECCL_CUDA_CHECK(cudaMemcpy(&s, state_.at(static_cast<std::size_t>(rank)), sizeof s, cudaMemcpyDeviceToHost));
    RECCL_CUDA_CHECK(cudaSetDevice(cur));
    return s;
  }
  /// ok, or the first fault of any rank of this process as an error naming the rank, VT and peer.
  status check(std::string* message = nullptr) const {
    for (int r = 0; r < g_.nranks(); ++r) {
      if (!g_.is_local(r)) continue;
      collective_state const s = state(r);
      if (s.fault_status != 0) {
        if (message && static_cast<status>(s.fault_status) == status::mismatch)
          *message = "rank " + std::to_string(r) + " VT " + std::to_string(s.fault_vt) + ": mismatch: rank " + std::to_string(s.fault_peer) +
                     "'s call " + std::to_string(s.fault_step) + " differs in " + name(static_cast<call_field>(s.fault_field)) +
                     " (the collective stopped before writing outputs; rebuild the group)";
        else if (message)
          *message = "rank " + std::to_string(r) + " VT " + std::to_string(s.fault_vt) + ": " +
                     std::string(name(static_cast<status>(s.fault_status))) + " waiting for rank " + std::to_string(s.fault_peer) +
                     " (step " + std::to_string(s.fault_step) + ")";
        if (message && static_cast<status>(s.fault_status) == status::timeout && lazy_module_loading())
          *message += " (CUDA loads modules lazily here: if a kernel was first launched while the collective ran, its load "
                      "stalled the proxy; load such kernels first or set CUDA_MODULE_LOADING=EAGER)";
        return static_cast<status>(s.fault_status);
      }
    }
    if (g_.error() != status::ok) {
      if (message) *message = g_.error_message();
      return g_.error();
    }
    return status::ok;
  }
  /// The largest put that goes inline (0: none).
  std::uint32_t inline_bytes() const { return inline_max_; }
  /// Whether CUDA loads modules lazily in this process (CUDA_MODULE_LOADING unset or LAZY): then
  /// every kernel that may run beside a collective must be loaded first (see the file comment).
  static bool lazy_module_loading() {
    char const* m = std::getenv("CUDA_MODULE_LOADING");
    return m == nullptr || std::string(m) != "EAGER";
  }

  /// Bytes one output of `a` spans on a rank (for allocating buffers in the symmetric region).
  static std::uint64_t out_bytes(collective_args const& a, int nranks) {
    std::uint64_t const b = a.count * size_of(a.type);
    return a.coll == collective::all_gather || a.coll == collective::all_to_all ? b * static_cast<std::uint64_t>(nranks) : b;
  }
  static std::uint64_t in_bytes(collective_args const& a, int nranks) {
    std::uint64_t const b = a.count * size_of(a.type);
    return a.coll == collective::reduce_scatter || a.coll == collective::all_to_all ? b * static_cast<std::uint64_t>(nranks) : b;
  }

 private:
  void validate(int rank, collective_args const& a) const {
    auto bad = [](std::string const& m) { throw reccl::error(status::invalid_argument, "proxy collective: " + m); };
    window_layout const& L = g_.layout();
    if (rank < 0 || rank >= L.nranks) bad("rank out of range");
    if (!g_.is_local(rank)) bad("rank " + std::to_string(rank) + " is not in this process");
    if (a.coll == collective::broadcast && (a.root < 0 || a.root >= L.nranks)) bad("root out of range");
    if (static_cast<unsigned>(a.type) > static_cast<unsigned>(dtype::float64)) bad("unknown dtype");
    require_compiled(a.coll, a.type);
    if (a.count == 0) return;
    auto const base = reinterpret_cast<std::uintptr_t>(g_.symmetric(rank));
    std::uint64_t const es = size_of(a.type);
    auto inside = [&](void const* p, std::uint64_t bytes) {
      auto const x = reinterpret_cast<std::uintptr_t>(p);
      return p != nullptr && x >= base && x - base <= L.symmetric_bytes && bytes <= L.symmetric_bytes - (x - base);
    };
    std::uint64_t const ib = in_bytes(a, L.nranks), ob = out_bytes(a, L.nranks);
    bool const reads_in = a.coll != collective::broadcast || rank == a.root;
    if (reads_in && !inside(a.in, ib)) bad("input not inside this rank's symmetric region (null, unregistered or too short)");
    if (!inside(a.out, ob)) bad("output not inside this rank's symmetric region (null, unregistered or too short)");
    if ((reads_in && reinterpret_cast<std::uintptr_t>(a.in) % es != 0) || reinterpret_cast<std::uintptr_t>(a.out) % es != 0)
      bad("buffer not aligned to its element size");
    if (a.coll == collective::all_to_all) {
      auto const i = reinterpret_cast<std::uintptr_t>(a.in), o = reinterpret_cast<std::uintptr_t>(a.out);
      if (i < o + ob && o < i + ib) bad("all-to-all input and output overlap (in-place all-to-all is not supported)");
    }
    if (a.coll == collective::reduce_scatter && a.in != a.out) {
      auto const i = reinterpret_cast<std::uintptr_t>(a.in), o = reinterpret_cast<std::uintptr_t>(a.out);
      if (o != i + static_cast<std::uint64_t>(rank) * a.count * es && i < o + ob && o < i + ib)
        bad("reduce-scatter output overlaps the input other than at this rank's segment");
    }
    if (static_cast<int>(a.op) > static_cast<int>(redop::avg)) bad("unknown op");
    if (a.vt_shares.n_vts != 0 && (a.vt_shares.n_vts != L.n_vts || reccl::check(a.vt_shares) != status::ok))
      bad("vt_shares: not a valid split of this group's " + std::to_string(L.n_vts) + " VTs");
  }

  // cudaFuncGetAttributes loads a kernel's module on the current GPU.
  static void load_kernels() {
    cudaFuncAttributes fa{};
    RECCL_CUDA_CHECK(cudaFuncGetAttributes(&fa, detail::collective_kernel<device::raw_byte>));
    for (dtype t : {dtype::int32, dtype::int64, dtype::float16, dtype::bfloat16, dtype::float32, dtype::float64})
      device::with_compiled_dtype<bool>(t, false, [&](auto e) {
        RECCL_CUDA_CHECK(cudaFuncGetAttributes(&fa, detail::collective_kernel<typename decltype(e)::type>));
        return true;
      });
  }

  copy_engine_group& g_;
  std::uint32_t slots_;
  call_agreement agree_;  ///< every rank's arguments, call by call (all ranks in this process)
  bool checks_;           ///< peer checks in the kernels
  std::uint32_t inline_max_;  ///< the largest inline put (0: none)
  std::vector<collective_state*> state_;
};

#endif  // __CUDACC__

}  // namespace reccl::proxy
