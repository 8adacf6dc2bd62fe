// reccl/proxy/collective.hpp -- the five collectives over the proxy transport: one CTA per VT whose
// thread 0 posts puts and signals and waits for the peers' signals; the copy engines (or the NIC)
// move every byte, and SMs only reduce.
//
// Buffers live in the window's symmetric region, at the same offset on every rank (copy
// collectives write straight into the peers' outputs, reductions stage through the receive areas).
// Each VT owns one contiguous block of every segment, sized by the call's shares (an Allocator's
// output, equal by default) in whole 16-byte packs: the split moves bytes between VTs, never results.
//
// Pieces: collective/args.hpp (arguments, state), collective/geometry.hpp (segments, VT blocks,
// slots), collective/peer_check.hpp (the call digest peers compare), collective/agent.hpp (the
// device agent and its protocol: steps, rounds, memory order, faults, inline puts, peer checks);
// this file is the host facade (checks, per-rank state, launches).
//
// Module loading: a kernel that runs beside a proxy collective must be loaded before the collective
// starts. Under lazy loading (CUDA's default since 12.2) a kernel's first launch loads its module,
// which waits for the kernels already running, and the proxy threads' CUDA calls wait with it: a
// collective that needs its proxy then stalls until its deadline (measured: bench/NOTES.md 22). The
// collectives' own kernels are loaded when proxy_collectives is constructed; load the others with
// reccl::load_kernel (host/launch.hpp), or run with CUDA_MODULE_LOADING=EAGER.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "../config.hpp"
#include "../device/element.hpp"
#include "../error.hpp"
#include "../host/error.hpp"
#include "../host/launch.hpp"
#include "../policy/allocator/allocator.hpp"
#include "../types.hpp"
#include "call_agreement.hpp"
#include "collective/agent.hpp"
#include "collective/args.hpp"
#include "collective/geometry.hpp"
#include "collective/peer_check.hpp"
#include "copy_engine_group.hpp"
#include "transport.hpp"

namespace reccl::proxy {

#if defined(__CUDACC__)

/// The five collectives on a copy_engine_group: per-rank state, argument checks, launches.
/// Launch on every rank (each on its own stream; on one GPU, loopback ranks run concurrently);
/// stream-ordered and capturable. Not thread-safe per rank.
class proxy_collectives {
 public:
  /// CTAs of one rank's launch: one per VT. Threads per CTA (they reduce).
  static constexpr int threads = 512;
  /// Whether the kernels compare every call's arguments with the peers' (collective/agent.hpp).
  /// automatic: on where the ranks are in different processes (the host check sees one rank only).
  enum class peer_checks { automatic, on, off };

  /// Puts of at most this many bytes go inline by default (collective/agent.hpp).
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
  /// every kernel that may run beside a collective must be loaded first (collective/agent.hpp).
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

  // every kernel a call may launch, on the current GPU (host/launch.hpp's load_kernel)
  static void load_kernels() {
    load_kernel(reinterpret_cast<void const*>(&detail::collective_kernel<device::raw_byte>));
    for (dtype t : {dtype::int32, dtype::int64, dtype::float16, dtype::bfloat16, dtype::float32, dtype::float64})
      device::with_compiled_dtype<bool>(t, false, [&](auto e) {
        load_kernel(reinterpret_cast<void const*>(&detail::collective_kernel<typename decltype(e)::type>));
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
