// reccl/device/handle/memory.hpp -- the device handle of the load/store transports: every rank's
// window mapped into this GPU's address space, flags with bounded waits, puts, barriers and the
// fault word. The same handle serves NVLink P2P through CUDA IPC, loopback ranks on one GPU and
// (later) NCCL symmetric windows: they differ only in how the host object maps the windows.
//
//   window of rank r (same size and layout on every rank; `memory_layout`)
//   +--------+-----------------------------+------------------------------+----------------------+
//   | fault  | sequences [flag] (local)    | inbox [flag][src] (u64)      | data (symmetric)     |
//   +--------+-----------------------------+------------------------------+----------------------+
//
// Flags are reserved on the host (every rank in the same order, so a flag has the same index
// everywhere); reccl's collectives and a user's kernels each reserve their own, so they never share
// state. A flag word only grows: signal() stores a larger value, wait() waits for "at least", so
// flags never need resetting and captured CUDA graphs replay. `sequence(f)` is a counter in the
// owner's memory for the kernel's own bookkeeping (e.g. the epoch of the next call), carried over
// between calls and graph replays.
//
// Memory order (system scope, so it holds across GPUs and processes):
//  * signal(p, f, v) is a release: the calling thread's earlier stores -- and, through a preceding
//    __syncthreads()/__syncwarp(), those of its CTA/warp -- are visible to a thread of rank p whose
//    wait(f, me, >= v) returned true (an acquire);
//  * put() is a plain store (no ordering): follow it with a barrier of the storing threads and a
//    signal; the peer reads the data after its wait;
//  * barrier() orders everything the CTA did before it against everything any rank's CTA does after;
//  * lamport_store()/lamport_wait() order nothing: each 16-byte pack carries its own arrival (see
//    "Lamport slots" below).
//
// Faults: the first failure a rank sees is written into its fault word (one 64-bit CAS: status,
// origin rank, peer, VT and a cause code), and is sticky. Every wait gives up once the word is set,
// so one failed thread stops its whole rank's kernel within a poll period; `raise_everywhere()`
// writes it into every rank's word (a rank whose host-side check rejected a call does this from a
// one-thread kernel, so its peers stop at once instead of at their deadline).
#pragma once

#include <cstdint>
#include <type_traits>

#include "../../config.hpp"
#include "../../types.hpp"
#include "../primitives.hpp"
#include "../wait.hpp"

namespace reccl::device {

/// Why a rank failed, carried in the fault word next to the status.
enum class fault_cause : std::uint16_t {
  none = 0,
  peer_timeout,       ///< a wait for `peer` passed its deadline
  peer_mismatch,      ///< `peer`'s call disagrees with this rank's (count, dtype, op, ...)
  null_buffer,        ///< host-side check: a null input or output
  misaligned_buffer,  ///< host-side check: a pointer not aligned to its element size
  buffer_not_in_window,  ///< host-side check: a buffer the call needs in the window is not there
  bad_argument,       ///< host-side check: another argument out of range
  user,               ///< a user kernel's own fault (record_fault with a user status)
  receive_overflow,   ///< more data arrives than the rank's receive buffer holds (all-to-allv)
};

constexpr char const* name(fault_cause c) {
  switch (c) {
    case fault_cause::none: return "none";
    case fault_cause::peer_timeout: return "timed out waiting for a peer";
    case fault_cause::peer_mismatch: return "arguments disagree with a peer's";
    case fault_cause::null_buffer: return "null buffer";
    case fault_cause::misaligned_buffer: return "misaligned buffer";
    case fault_cause::buffer_not_in_window: return "buffer not in the communicator's window";
    case fault_cause::bad_argument: return "bad argument";
    case fault_cause::user: return "user fault";
    case fault_cause::receive_overflow: return "receive buffer too small for what arrives";
  }
  return "?";
}

/// The fault word: status (8 bits) | origin rank (8) | peer (8, 0xff none) | VT (8, 0xff none) |
/// cause (16) | spare (16). Zero means healthy.
struct fault {
  status st = status::ok;
  std::int32_t origin = -1;  ///< the rank that failed first
  std::int32_t peer = -1;    ///< the peer it was waiting for, or -1
  std::int32_t vt = -1;      ///< the VT (or CTA group) that failed, or -1
  fault_cause cause = fault_cause::none;

  RECCL_HOST_DEVICE constexpr bool ok() const { return st == status::ok; }
  RECCL_HOST_DEVICE constexpr std::uint64_t encode() const {
    auto b = [](std::int32_t x) { return static_cast<std::uint64_t>(x < 0 ? 0xff : (x & 0xff)); };
    return static_cast<std::uint64_t>(static_cast<std::uint32_t>(st) & 0xffu) | b(origin) << 8 | b(peer) << 16 |
           b(vt) << 24 | static_cast<std::uint64_t>(cause) << 32;
  }
  RECCL_HOST_DEVICE static constexpr fault decode(std::uint64_t w) {
    auto i = [](std::uint64_t x) { return x == 0xff ? -1 : static_cast<std::int32_t>(x); };
    fault f;
    f.st = static_cast<status>(w & 0xffu);
    f.origin = i((w >> 8) & 0xffu);
    f.peer = i((w >> 16) & 0xffu);
    f.vt = i((w >> 24) & 0xffu);
    f.cause = static_cast<fault_cause>((w >> 32) & 0xffffu);
    return f;
  }
};

/// A reserved flag (the same index on every rank).
struct flag_id {
  std::uint32_t index = 0;
};

/// Byte layout of one rank's window. Pure arithmetic, the same on every rank.
struct memory_layout {
  std::int32_t nranks = 0;
  std::int32_t n_flags = 0;
  std::uint64_t data_bytes = 0;
  std::uint64_t fault_off = 0, sequence_off = 0, inbox_off = 0, data_off = 0, total = 0;

  RECCL_HOST_DEVICE static constexpr std::uint64_t round_up(std::uint64_t x, std::uint64_t a) { return (x + a - 1) / a * a; }
  RECCL_HOST_DEVICE static constexpr memory_layout make(int nranks, int n_flags, std::uint64_t data_bytes) {
    memory_layout L;
    L.nranks = nranks;
    L.n_flags = n_flags;
    L.data_bytes = data_bytes;
    L.fault_off = 0;
    L.sequence_off = 128;
    L.inbox_off = round_up(L.sequence_off + 8ull * static_cast<std::uint64_t>(n_flags), 128);
    L.data_off = round_up(L.inbox_off + 8ull * static_cast<std::uint64_t>(n_flags) * static_cast<std::uint64_t>(nranks), 4096);
    L.total = round_up(L.data_off + data_bytes, 4096);
    return L;
  }
};

/// Ranks one load/store handle reaches (one NVLink domain, or the ranks sharing one GPU).
inline constexpr int max_memory_ranks = max_lsa;

/// The device handle: trivially copyable, passed to kernels by value (about 120 bytes).
struct memory_handle {
  char* windows[max_memory_ranks] = {};  ///< every rank's window, as seen from this GPU
  memory_layout layout{};
  std::int32_t my_rank = 0;
  std::uint64_t timeout_ns = 0;  ///< the deadline of wait() and barrier() from their first spin

  RECCL_HOST_DEVICE int rank() const { return my_rank; }
  RECCL_HOST_DEVICE int size() const { return layout.nranks; }

  // ---- addresses ----------------------------------------------------------------------------
  /// Rank r's data region at `offset`, as seen from this GPU (r == rank(): local memory).
  template <class T = char>
  RECCL_HOST_DEVICE T* at(int r, std::uint64_t offset) const {
    return reinterpret_cast<T*>(windows[r] + layout.data_off + offset);
  }
  /// The address in rank r's window that corresponds to `p` in mine (p must lie in my data region).
  template <class T>
  RECCL_HOST_DEVICE T* peer_ptr(int r, T* p) const {
    auto const off = reinterpret_cast<char const*>(p) - windows[my_rank];
    return reinterpret_cast<T*>(windows[r] + off);
  }
  /// Whether [p, p + bytes) lies in my data region.
  RECCL_HOST_DEVICE bool in_window(void const* p, std::uint64_t bytes) const {
    char const* const lo = windows[my_rank] + layout.data_off;
    char const* const c = static_cast<char const*>(p);
    return c >= lo && bytes <= layout.data_bytes && static_cast<std::uint64_t>(c - lo) <= layout.data_bytes - bytes;
  }

  // ---- flags --------------------------------------------------------------------------------
  /// The owner's counter for flag f (local memory; never touched by peers).
  RECCL_HOST_DEVICE std::uint64_t* sequence(flag_id f) const {
    return reinterpret_cast<std::uint64_t*>(windows[my_rank] + layout.sequence_off) + f.index;
  }
  /// Flag f from `src`, in `owner`'s window.
  RECCL_HOST_DEVICE std::uint64_t* inbox(int owner, flag_id f, int src) const {
    return reinterpret_cast<std::uint64_t*>(windows[owner] + layout.inbox_off) +
           static_cast<std::uint64_t>(f.index) * static_cast<std::uint64_t>(layout.nranks) + src;
  }
  RECCL_HOST_DEVICE std::uint64_t* fault_word(int owner) const {
    return reinterpret_cast<std::uint64_t*>(windows[owner] + layout.fault_off);
  }

  /// Publish `value` on peer's flag f from me (release, system scope). Values must grow.
  RECCL_DEVICE void signal(int peer, flag_id f, std::uint64_t value) const {
    store_release_sys(inbox(peer, f, my_rank), value);
  }
  /// The current value of flag f from `src` in my window (acquire).
  RECCL_DEVICE std::uint64_t read(flag_id f, int src) const { return load_acquire_sys(inbox(my_rank, f, src)); }

  /// The guard of this handle's waits: stop when my fault word is set (by this rank or a peer), or
  /// at the deadline, which records a timeout naming `peer` and `vt`.
  struct guard {
    memory_handle const* h;
    deadline_clock* clock;
    std::int32_t peer = -1, vt = -1;
    static constexpr std::uint32_t period = deadline_check_period;
    RECCL_DEVICE void begin() {}
    RECCL_DEVICE bool give_up() const {
      if (h->faulted()) return true;
      if (clock->expired()) {
        h->record_fault(fault{status::timeout, h->my_rank, peer, vt, fault_cause::peer_timeout});
        return true;
      }
      return false;
    }
  };
  RECCL_DEVICE guard make_guard(deadline_clock& clock, int peer, int vt = -1) const { return guard{this, &clock, peer, vt}; }

  /// Wait until flag f from `src` is at least `value` (acquire). False when the wait gave up: the
  /// fault word then holds why (a timeout naming src and vt, or an earlier fault). `spins` counts
  /// the failed polls (stall telemetry).
  RECCL_DEVICE bool wait(flag_id f, int src, std::uint64_t value, deadline_clock& clock, int vt,
                         std::uint64_t& spins) const {
    std::uint64_t const* w = inbox(my_rank, f, src);
    guard g = make_guard(clock, src, vt);
    return spin_until([&] { return load_acquire_sys(w) >= value; }, g, spins);
  }
  RECCL_DEVICE bool wait(flag_id f, int src, std::uint64_t value, deadline_clock& clock, int vt = -1) const {
    std::uint64_t spins = 0;
    return wait(f, src, value, clock, vt, spins);
  }

  /// Barrier of CTA-group `f` over every rank: thread t < size() signals rank t and waits for it.
  /// Call from every thread of the CTA, with the same growing `epoch` on every rank (e.g. from
  /// sequence(f)). False (fault recorded) on timeout or an earlier fault; the same in every thread
  /// of the CTA, so the caller may leave a loop on it.
  RECCL_DEVICE bool barrier(flag_id f, std::uint64_t epoch, deadline_clock& clock) const {
    __syncthreads();  // the CTA's earlier stores precede the signals
    int const t = static_cast<int>(threadIdx.x);
    bool ok = true;
    if (t < size() && t != my_rank) {
      signal(t, f, epoch);
      ok = wait(f, t, epoch, clock);
    }
    if (t == 0) ok = ok && !faulted();
    return __syncthreads_and(ok ? 1 : 0) != 0;
  }

  // ---- Lamport slots ------------------------------------------------------------------------
  // A Lamport slot is 16 bytes of the data region that carry their own arrival: the reader keeps it
  // filled with lamport_sentinel words (the bits of -0.0f) and polls until no word holds the
  // sentinel; the writer stores a pack none of whose words is the sentinel (float data made
  // canonical(): -0 becomes +0). No flag, no fence: one crossing per pack.
  //
  // Memory order: lamport_store is a relaxed system-scope store and lamport_wait polls with relaxed
  // system-scope loads. An arrived pack says nothing about any other memory: read only the packs
  // you polled. Each 4-byte word is checked, since a 16-byte store is only guaranteed to land in
  // whole 8-byte halves. Reuse: the reader re-poisons a slot after reading it (lamport_clear, a
  // plain local store); a writer may fill the same slot again only once it knows the reader is past
  // that point -- e.g. slots alternate between two phases per call, and every call waits for data
  // from every peer, so a writer reaches phase p again only after the reader's kernel that cleared
  // phase p has completed (stream order).

  /// Store pack `x` (no sentinel word) into a Lamport slot in any rank's memory.
  RECCL_DEVICE static void lamport_store(void* slot, pack16 const& x) { store_pack_relaxed_sys(slot, x); }
  /// One poll of a slot in my memory (issue many, then lamport_wait only the ones not arrived).
  RECCL_DEVICE static pack16 lamport_load(void const* slot) { return load_pack_relaxed_sys(slot); }
  /// Poll the slot `slot` in my memory, written by rank `src`, until it holds a pack with no
  /// sentinel word; the pack is left in `x`. False when the wait gave up, as wait(): a timeout
  /// naming src and vt is then in the fault word (or an earlier fault was).
  RECCL_DEVICE bool lamport_wait(void const* slot, pack16& x, int src, deadline_clock& clock, int vt = -1) const {
    guard g = make_guard(clock, src, vt);
    return spin_until(
        [&] {
          x = load_pack_relaxed_sys(slot);
          return lamport_arrived(x);
        },
        g);
  }
  /// Refill a slot with the sentinel after reading it (plain store: the slot is in my memory).
  RECCL_DEVICE static void lamport_clear(void* slot) { store_pack(slot, lamport_poison()); }

  // ---- puts ---------------------------------------------------------------------------------
  /// Copy `bytes` from `src` (any memory this GPU reads) to `dst` in rank `peer`'s memory, by thread
  /// `lane` of `lanes` cooperating threads. 16-byte stores where both pointers allow, else bytes.
  /// No ordering: see the header.
  RECCL_DEVICE static void copy(void* dst, void const* src, std::uint64_t bytes, int lane, int lanes) {
    char* const d = static_cast<char*>(dst);
    char const* const s = static_cast<char const*>(src);
    if (((reinterpret_cast<std::uintptr_t>(d) | reinterpret_cast<std::uintptr_t>(s)) & 15u) == 0) {
      std::uint64_t const packs = bytes / 16;
      for (std::uint64_t i = static_cast<std::uint64_t>(lane); i < packs; i += static_cast<std::uint64_t>(lanes))
        store_pack(d + i * 16, load_pack(s + i * 16));
      for (std::uint64_t i = packs * 16 + static_cast<std::uint64_t>(lane); i < bytes; i += static_cast<std::uint64_t>(lanes))
        d[i] = s[i];
    } else {
      for (std::uint64_t i = static_cast<std::uint64_t>(lane); i < bytes; i += static_cast<std::uint64_t>(lanes)) d[i] = s[i];
    }
  }
  /// put: copy into peer's data region at `offset`.
  RECCL_DEVICE void put(int peer, std::uint64_t offset, void const* src, std::uint64_t bytes, int lane, int lanes) const {
    copy(at(peer, offset), src, bytes, lane, lanes);
  }

  // ---- faults -------------------------------------------------------------------------------
  /// Record `f` as this rank's fault unless one is recorded already (the first wins; sticky).
  RECCL_DEVICE void record_fault(fault const& f) const {
    atomicCAS_system(reinterpret_cast<unsigned long long*>(fault_word(my_rank)), 0ull,
                     static_cast<unsigned long long>(f.encode()));
  }
  /// Record `f` on every rank (each keeps its own first fault): peers stop within a poll period.
  /// Ranks in `skip` (bit r: rank r, e.g. ranks masked as dead) are left alone.
  RECCL_DEVICE void raise_everywhere(fault const& f, std::uint64_t skip = 0) const {
    for (int r = 0; r < size(); ++r)
      if (!((skip >> r) & 1u)) atomicCAS_system(reinterpret_cast<unsigned long long*>(fault_word(r)), 0ull,
                       static_cast<unsigned long long>(f.encode()));
  }
  RECCL_DEVICE bool faulted() const { return *static_cast<volatile std::uint64_t const*>(fault_word(my_rank)) != 0; }
  RECCL_DEVICE fault current_fault() const {
    return fault::decode(*static_cast<volatile std::uint64_t const*>(fault_word(my_rank)));
  }
};

static_assert(std::is_trivially_copyable_v<memory_handle>);

}  // namespace reccl::device
