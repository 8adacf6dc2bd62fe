// reccl/proxy/collective/agent.hpp -- the device agent of the proxy collectives: one CTA per VT
// whose thread 0 posts puts and signals on the proxy handle and waits for the peers' signals; the
// copy engines (or the NIC) move every byte, and the CTA's threads only reduce.
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
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "../../config.hpp"
#include "../../device/element.hpp"
#include "../../device/primitives.hpp"
#include "../../error.hpp"
#include "../../types.hpp"
#include "../transport.hpp"
#include "args.hpp"
#include "geometry.hpp"
#include "peer_check.hpp"

#if defined(__CUDACC__)

namespace reccl::proxy::detail {

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
    device::acc_pack<T> a;
    device::fold_in_rank_order<T>(op, nranks, a, [&](int r, device::pack16& x) {
      x = device::load_user<T>(src[r], j, range, vec);
      return true;
    });
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

}  // namespace reccl::proxy::detail

#endif  // __CUDACC__
