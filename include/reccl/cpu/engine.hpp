// reccl/cpu/engine.hpp -- one collective on one rank of a CPU communicator: arrival, data phase,
// fault agreement, recovery, probes, the last sync step and the control step.
//
//   rank r, collective e                                   (every rank runs the same sequence)
//   ┌────────────────────────────────────────────────────────────────────────────────────────┐
//   │ 1. check arguments locally (null buffers, root, op, schedule)         -> invalid_argument│
//   │    any local failure (these, or internal buffers it cannot allocate) publishes an abort │
//   │    record for the call: the other ranks' arrival waits end at once, naming this rank   │
//   │ 2. split = control.split_for(count)   probes = control.probe_mask                       │
//   │ 3. one worker thread per live VT and per probed VT:                                     │
//   │      arrival on the VT: publish the call's arguments, wait for every rank's (deadline) │
//   │        -> a rank that never arrives: timeout naming rank and VT; other arguments:      │
//   │           mismatch naming the rank; a rank's abort record: its status, rank and cause  │
//   │      live VT:   run the schedule on its block [offset(vt), +count[vt])                 │
//   │      probed VT: run the schedule on a private dummy block (never touches the result);  │
//   │                 aborted once the data is done (after a short grace): never holds it up │
//   │ 4. last sync step: all-gather the epoch_record (stalls, bytes, fault and probe bits)   │
//   │ 5. fault mask F = OR over ranks. If F != 0: the live VTs re-run each dead VT's block,  │
//   │    re-split evenly over them, from the input (work is recomputed, never read first);   │
//   │    agree on faults again; repeat while a VT dies; no live VT left -> timeout error     │
//   │ 6. control.step(records): dead VTs masked, probed VTs back, allocator -> split of e+1  │
//   │ 7. reset the link state of every VT that failed or whose probe did not come back       │
//   └────────────────────────────────────────────────────────────────────────────────────────┘
//
// Waits and aborts. Every wait has a deadline and an abort condition. The arrival wait also ends
// on the call's abort record; no later wait needs it, since a rank that aborts a call never
// arrives on any VT, so no rank gets past arrival in that call. A rank that fails later (after
// arrival) marks the communicator failed, which ends every other wait: the executor's progress
// loop and the transport's waits, the record exchanges, and the arrival waits of later calls.
//
// Stalls: every whole poll quantum a worker waits is one stall of its VT. By default waits for
// data count too (config::count_data_waits): with FIFOs much smaller than a VT's chunk the
// sender's credit waits cover most of the VT's time, but not a fixed fraction of it (the last
// FIFO-full of each step is spent waiting for data), which would bias the split against VTs with
// small blocks; counting both keeps α·stalls close to the VT's waiting time whatever its block.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdint>
#include <cstring>
#include <exception>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "../error.hpp"
#include "../policy/allocator/allocator.hpp"
#include "../policy/control.hpp"
#include "../policy/epoch.hpp"
#include "../policy/schedule/schedule.hpp"
#include "../policy/split.hpp"
#include "../policy/telemetry/telemetry.hpp"
#include "../types.hpp"
#include "communicator.hpp"
#include "executor.hpp"
#include "numeric.hpp"

namespace reccl::cpu {

namespace detail {

template <class T>
T* grow(std::vector<std::byte>& v, std::uint64_t elems) {
  if (v.size() < elems * sizeof(T)) v.resize(elems * sizeof(T));
  return reinterpret_cast<T*>(v.data());
}

inline bool overlaps(void const* a, std::uint64_t an, void const* b, std::uint64_t bn) {
  auto const x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return an > 0 && bn > 0 && x < y + bn && y < x + an;
}

/// Elements of the user's send and receive buffers for collective c on n ranks.
inline std::uint64_t user_input_len(collective c, int n, std::uint64_t count) {
  return (c == collective::reduce_scatter || c == collective::all_to_all) ? count * static_cast<std::uint64_t>(n) : count;
}
inline std::uint64_t user_output_len(collective c, int n, std::uint64_t count) {
  return (c == collective::all_gather || c == collective::all_to_all) ? count * static_cast<std::uint64_t>(n) : count;
}

/// What a worker thread reports.
template <Telemetry M>
struct worker_report {
  std::atomic<bool> finished{false};  ///< set last, with release: the rest may be read after it
  bool ran = false, probe = false;
  bool arrival_timeout = false, arrival_mismatch = false, call_aborted = false;
  int other_rank = -1;  ///< the rank that did not arrive / disagreed
  call_args theirs{};
  block_outcome blk{};
  std::uint64_t elapsed_ns = 0;
  M tel{};
  std::string thrown;  ///< what() of an exception a worker thread caught (blk.st is then internal)
};

/// Runs f() on a worker thread; an exception (e.g. bad_alloc) becomes status::internal in `r`
/// instead of std::terminate, so the caller gets a reccl::error, never an abort.
template <class R, class F>
void guarded(R& r, F&& f) noexcept {
  try {
    f();
  } catch (std::exception const& x) {
    r.blk.st = status::internal;
    r.thrown = x.what();
  } catch (...) {
    r.blk.st = status::internal;
    r.thrown = "unknown exception";
  }
}

template <class R>
std::string describe_internal(R const& r) {
  return r.thrown.empty() ? std::string("schedule plan: ") + r.blk.what : "worker thread threw: " + r.thrown;
}

/// The recovery record: faults seen while finishing dead VTs' ranges.
struct recovery_record {
  std::uint64_t epoch = 0;
  std::uint32_t faults = 0;
};

inline std::string describe_args(call_args const& a) {
  return "count " + std::to_string(a.count) + ", " + std::string(name(static_cast<collective>(a.coll))) + ", " +
         std::string(name(static_cast<dtype>(a.type))) + ", " + std::string(name(static_cast<redop>(a.op))) + ", root " +
         std::to_string(a.root);
}

inline char const* name(record_check c) {
  switch (c) {
    case record_check::none: return "none";
    case record_check::nranks: return "rank count";
    case record_check::rank: return "rank slot";
    case record_check::epoch: return "epoch";
    case record_check::n_vts: return "VT count";
    case record_check::checksum: return "checksum";
    case record_check::state: return "control state digest";
  }
  return "?";
}

}  // namespace detail

/// Runs collective `Kind` of schedule S on rank `rank` of `comm`, with telemetry M and allocator
/// `alloc` choosing the next split. Call it from one thread per rank, with the same count, op, root
/// and types on every rank. Returns when this rank's output is complete and correct (status ok or
/// recovered); throws reccl::error otherwise (see engine.hpp's file comment).
template <collective Kind, class T, Schedule S, Telemetry M, Allocator A>
collective_result run_collective(communicator& comm, int rank, T const* send, T* recv, std::uint64_t count, redop op,
                                 int root, A const& alloc = A{}) {
  static_assert(is_element_v<T>, "reccl: element type must be int32_t, int64_t, half, bfloat16, float or double");
  std::uint64_t const t_start = now_ns();
  config const& cfg = comm.cfg();
  int const n = cfg.nranks;
  if (rank < 0 || rank >= n)
    throw error(status::invalid_argument, "rank " + std::to_string(rank) + " outside [0, " + std::to_string(n) + ")");
  rank_state& rs = comm.rank(rank);
  std::int64_t const e64 = static_cast<std::int64_t>(rs.ctl.epoch);
  std::uint64_t const call = rs.calls++;
  // A local failure: publish it for the other ranks of this call, then throw it here.
  auto local_error = [&](status st, std::string const& what) {
    comm.abort_call(rank, call, st, what);
    return error(st, what, rank, -1, e64);
  };
  auto invalid = [&](std::string const& what) { throw local_error(status::invalid_argument, what); };
  if (rs.failed) throw error(status::internal, "the communicator failed in an earlier collective; build a new one", rank, -1, e64);
  if (comm.failed_flag().load(std::memory_order_acquire)) {
    rs.failed = true;
    throw error(status::internal, "the communicator failed; build a new one [" + comm.failed_description() + "]", rank, -1, e64);
  }
  if (!S::supports(Kind)) invalid(std::string("the schedule does not support ") + std::string(name(Kind)));
  if (static_cast<unsigned>(op) > static_cast<unsigned>(redop::avg)) invalid("unknown reduction op");
  if (root < 0 || root >= n) invalid("root " + std::to_string(root) + " outside [0, " + std::to_string(n) + ")");
  schedule::params p{};
  p.coll = Kind;
  p.nranks = n;
  p.root = root;
  p.ranks_per_node = cfg.ranks_per_node;
  p.tile = cfg.tile;
  p.n_relays = static_cast<std::int32_t>(cfg.relays.size());
  for (std::size_t k = 0; k < cfg.relays.size(); ++k) p.relays[k] = cfg.relays[k];
  if constexpr (requires { S::check(p); }) {
    schedule::check_result const c = S::check(p);
    if (!c.ok()) invalid(std::string("schedule parameters: ") + c.reason);
  }
  S const s(p);
  std::uint64_t const in_len = static_cast<std::uint64_t>(s.segments(schedule::buffer::input)) * count;
  std::uint64_t const work_len = static_cast<std::uint64_t>(s.segments(schedule::buffer::work)) * count;
  std::uint64_t const scratch_len = static_cast<std::uint64_t>(s.segments(schedule::buffer::scratch)) * count;
  std::uint64_t const out_len = detail::user_output_len(Kind, n, count);
  if (in_len != detail::user_input_len(Kind, n, count) || work_len < out_len)
    throw local_error(status::internal, "schedule buffer layout does not match the collective");
  bool const reads_send = Kind != collective::broadcast || rank == root;
  if (count > 0 && reads_send && send == nullptr) invalid("send buffer is null");
  if (count > 0 && recv == nullptr) invalid("receive buffer is null");

  // -- split, probes, buffers
  control<A> ctl = rs.ctl.load(alloc);
  std::uint64_t const e = ctl.epoch;
  std::uint64_t const granule = cfg.granule ? cfg.granule : std::max<std::uint64_t>(1, 256 / sizeof(T));
  split const sp = ctl.split_for(count, granule);
  if (sp.n_vts != cfg.n_vts) throw local_error(status::internal, "control state gives no valid split");
  std::uint32_t const probes = ctl.probe_mask & ~sp.live_mask;

  auto grow = [&](std::vector<std::byte>& v, std::uint64_t elems) -> T* {
    try {
      return detail::grow<T>(v, elems);
    } catch (std::exception const& x) {  // bad_alloc, or length_error for a count beyond any buffer
      throw local_error(status::internal, "cannot allocate an internal buffer of " + std::to_string(elems) + " elements: " + x.what());
    }
  };
  T const* input = reads_send ? send : nullptr;
  if (input != nullptr && detail::overlaps(send, in_len * sizeof(T), recv, out_len * sizeof(T))) {
    T* copy = grow(rs.input_copy, in_len);  // in place: keep the input intact for recovery
    std::memcpy(copy, send, in_len * sizeof(T));
    input = copy;
  }
  bool const internal_work = work_len != out_len;
  T* work = internal_work ? grow(rs.work, work_len) : recv;
  T* scratch = scratch_len > 0 ? grow(rs.scratch, scratch_len) : nullptr;
  if (cfg.poison_internal) {
    if (internal_work) std::memset(static_cast<void*>(work), 0xa5, work_len * sizeof(T));
    if (scratch) std::memset(static_cast<void*>(scratch), 0xa5, scratch_len * sizeof(T));
  }
  rank_buffers<T> const bufs{input, work, scratch, count, input ? in_len : 0, work_len, scratch_len};

  // Probes of several VTs run at once: VT v probes the block [v, v + 1) * probe_count of buffers
  // n_vts * probe_count long per segment, so no two probes share memory.
  std::uint64_t const probe_count = std::max<std::uint64_t>(1, cfg.probe_bytes / sizeof(T));
  std::uint64_t const probe_total = probe_count * static_cast<std::uint64_t>(cfg.n_vts);
  rank_buffers<T> pbufs{};
  if (probes != 0) {
    auto seg = [&](schedule::buffer b) { return static_cast<std::uint64_t>(s.segments(b)) * probe_total; };
    T* pin = grow(rs.probe_input, seg(schedule::buffer::input));
    std::memset(static_cast<void*>(pin), 0, seg(schedule::buffer::input) * sizeof(T));
    pbufs = {pin, grow(rs.probe_work, seg(schedule::buffer::work)),
             seg(schedule::buffer::scratch) ? grow(rs.probe_scratch, seg(schedule::buffer::scratch)) : nullptr,
             probe_total, seg(schedule::buffer::input), seg(schedule::buffer::work), seg(schedule::buffer::scratch)};
  }

  // -- data phase: arrival, blocks, probes
  detail::call_args const args{e, count, static_cast<std::uint64_t>(typeid(S).hash_code()), root,
                               static_cast<std::uint8_t>(Kind), static_cast<std::uint8_t>(dtype_of<T>()),
                               static_cast<std::uint8_t>(reduces(Kind) ? op : redop::sum), 0};
  std::atomic<bool> probe_abort{false};
  detail::worker_report<M> rep[max_vts];
  auto worker_body = [&](int vt, bool probe) {
    auto& r = rep[vt];
    struct mark_finished {
      std::atomic<bool>& f;
      ~mark_finished() { f.store(true, std::memory_order_release); }
    } const guard{r.finished};
    r.ran = true;
    r.probe = probe;
    std::atomic<bool> const* abort = probe ? &probe_abort : &comm.failed_flag();
    detail::arrival_slot& mine = comm.arrival(vt, rank);
    mine.args = args;
    mine.tag.store(call + 1, std::memory_order_release);
    std::uint64_t const deadline = now_ns() + cfg.arrival_timeout_ns;
    for (int o = 0; o < n; ++o) {
      detail::arrival_slot const& a = comm.arrival(vt, o);
      auto const came = [&] { return a.tag.load(std::memory_order_acquire) == call + 1; };
      detail::poll_until([&] { return came() || comm.call_aborted(call); }, deadline, cfg.poll_quantum_ns, abort);
      if (!came()) {
        if (comm.call_aborted(call)) {  // a rank gave up this call before arriving: no rank gets past here
          r.call_aborted = true;
          return;
        }
        r.arrival_timeout = true;
        r.other_rank = o;
        return;
      }
      if (!(a.args == args)) {
        r.arrival_mismatch = true;
        r.other_rank = o;
        r.theirs = a.args;
        return;
      }
    }
    std::uint64_t const t0 = now_ns();
    transport::cpu_threads::handle const h{&comm.fab(), rank, e, abort};
    block_executor<T, S> ex(s, h, vt, op, probe ? pbufs : bufs, cfg.wait_timeout_ns, abort);
    std::uint64_t const pb = static_cast<std::uint64_t>(vt) * probe_count;
    schedule::block const blk = probe ? schedule::block{pb, pb + probe_count} : schedule::block{sp.offset(vt), sp.offset(vt) + sp.count[vt]};
    ex.run(blk, r.blk);
    r.elapsed_ns = now_ns() - t0;
    if (!probe) {
      // On the virtual clock a worker costs nothing but waiting, so "every wait" is its duration.
      std::uint64_t const all_waits =
          cfg.virtual_time ? r.blk.virtual_ns / cfg.poll_quantum_ns : r.blk.stalls + r.blk.recv_waits;
      r.tel.add_stalls(vt, cfg.count_data_waits ? all_waits : r.blk.stalls);
      r.tel.add_bytes(vt, r.blk.bytes);
    }
  };
  auto worker = [&](int vt, bool probe) {
    tighten_timer_slack();
    detail::guarded(rep[vt], [&] { worker_body(vt, probe); });
  };
  {
    std::vector<std::jthread> data, probing;
    for (int vt = 0; vt < cfg.n_vts; ++vt) {
      if (sp.live(vt)) data.emplace_back(worker, vt, false);
      else if ((probes >> vt) & 1u) probing.emplace_back(worker, vt, true);
    }
    for (auto& t : data) t.join();
    if (!probing.empty()) {
      // The probe never holds up the collective: it is aborted once the data is done, but is given
      // at least probe_grace_ns from the start of the collective (tiny collectives end sooner).
      std::uint64_t const until = std::max(now_ns(), t_start + cfg.probe_grace_ns);
      detail::poll_until([&] {
        for (int vt = 0; vt < cfg.n_vts; ++vt)
          if (((probes >> vt) & 1u) && !rep[vt].finished.load(std::memory_order_acquire)) return false;
        return true;
      }, until, cfg.poll_quantum_ns);
      probe_abort.store(true, std::memory_order_relaxed);
      for (auto& t : probing) t.join();
    }
  }
  std::uint64_t const t_data = now_ns();

  // -- outcome of the data phase on this rank
  collective_result res;
  auto fail = [&](status st, std::string const& what, int who, int vt) {
    rs.failed = true;
    comm.mark_failed(rank, e, st, what);
    // If another rank failed first, its failure may be why this rank's waits ended: say so.
    if (comm.failed_rank() != rank) throw error(st, what + " [first failure: " + comm.failed_description() + "]", who, vt, e64);
    throw error(st, what, who, vt, e64);
  };
  for (int vt = 0; vt < cfg.n_vts; ++vt) {
    auto const& r = rep[vt];
    if (!r.ran || r.probe || !r.call_aborted) continue;
    // Another rank gave up this call before any data moved: report its cause. Nothing changed on any
    // rank (epoch, shares, links), so the communicator is not marked failed.
    detail::call_abort const a = comm.abort_record(call);
    throw error(a.st, "rank " + std::to_string(a.rank) + " gave up collective " + std::to_string(e) + ": " + a.what, a.rank, -1, e64);
  }
  for (int vt = 0; vt < cfg.n_vts; ++vt) {
    auto const& r = rep[vt];
    if (!r.ran || r.probe) continue;
    if (r.arrival_mismatch)
      fail(status::mismatch,
           "rank " + std::to_string(r.other_rank) + " called collective " + std::to_string(e) + " with other arguments (" +
               detail::describe_args(r.theirs) + ") than rank " + std::to_string(rank) + " (" + detail::describe_args(args) + ")",
           r.other_rank, vt);
  }
  for (int vt = 0; vt < cfg.n_vts; ++vt) {
    auto const& r = rep[vt];
    if (!r.ran || r.probe) continue;
    if (r.arrival_timeout)
      fail(status::timeout,
           "rank " + std::to_string(r.other_rank) + " never arrived at collective " + std::to_string(e) + ": rank " +
               std::to_string(rank) + "'s VT " + std::to_string(vt) + " waited " +
               std::to_string(cfg.arrival_timeout_ns / 1'000'000) + " ms for it",
           r.other_rank, vt);
    if (r.blk.st == status::internal) fail(status::internal, detail::describe_internal(r), rank, vt);
  }
  M tel{};
  std::uint32_t fault_mask = 0, probe_ok = 0;
  for (int vt = 0; vt < cfg.n_vts; ++vt) {
    auto const& r = rep[vt];
    if (!r.ran) continue;
    if (r.probe) {
      if (!r.arrival_timeout && !r.arrival_mismatch && r.blk.st == status::ok) probe_ok |= 1u << vt;
      continue;
    }
    tel.merge(r.tel);
    res.vt_ns[vt] = r.elapsed_ns;
    res.vt_virtual_ns[vt] = r.blk.virtual_ns;
    if (r.blk.st != status::ok) {
      fault_mask |= 1u << vt;
      res.faults.push_back({e, vt, rank, r.blk.peer, r.blk.step, r.blk.on_credit, false});
    }
  }

  // -- last sync step: every rank's record
  std::vector<epoch_record> records(static_cast<std::size_t>(n));
  epoch_record const mine = ctl.record(rank, tel, fault_mask, probe_ok);
  std::uint64_t const sync_deadline = now_ns() + cfg.sync_timeout_ns;
  if (int const missing = comm.exchange(rank, rs.round++, mine, records.data(), sync_deadline); missing >= 0)
    fail(status::timeout, "rank " + std::to_string(missing) + " did not report the end of collective " + std::to_string(e), missing, -1);
  std::uint32_t dead = 0;
  for (auto const& r : records) dead |= r.fault_mask;
  dead &= sp.live_mask;

  // -- recovery: the live VTs finish the dead VTs' blocks
  std::uint32_t live = sp.live_mask & ~dead, recovery_faults = 0;
  std::uint32_t const need = dead;
  while (need != 0) {
    if (live == 0) fail(status::timeout, "every VT missed its deadline (no path left between the ranks)", rank, -1);
    int const n_live = std::popcount(live);
    int live_ids[max_vts] = {};
    for (int vt = 0, k = 0; vt < cfg.n_vts; ++vt)
      if ((live >> vt) & 1u) live_ids[k++] = vt;
    detail::worker_report<M> rrep[max_vts];
    auto rworker_body = [&](int k) {
      int const vt = live_ids[k];
      transport::cpu_threads::handle const h{&comm.fab(), rank, e, &comm.failed_flag()};
      block_executor<T, S> ex(s, h, vt, op, bufs, cfg.wait_timeout_ns, &comm.failed_flag());
      std::uint64_t const t0 = now_ns();
      for (int d = 0; d < cfg.n_vts && rrep[vt].blk.st == status::ok; ++d) {
        if (!((need >> d) & 1u) || sp.count[d] == 0) continue;
        std::uint64_t const b = sp.offset(d);
        elem_range const mine = part_of(elem_range{b, b + sp.count[d]}, n_live, k, 1);  // as the GPU's recovery cuts it
        if (!mine.empty()) ex.run({mine.lo, mine.hi}, rrep[vt].blk);
      }
      rrep[vt].elapsed_ns = now_ns() - t0;
    };
    auto rworker = [&](int k) {
      tighten_timer_slack();
      detail::guarded(rrep[live_ids[k]], [&] { rworker_body(k); });
    };
    {
      std::vector<std::jthread> ts;
      for (int k = 0; k < n_live; ++k) ts.emplace_back(rworker, k);
    }
    detail::recovery_record rmine{e, 0}, rall[max_ranks];
    for (int vt = 0; vt < cfg.n_vts; ++vt) {
      if (!((live >> vt) & 1u)) continue;
      if (rrep[vt].blk.st == status::internal) fail(status::internal, detail::describe_internal(rrep[vt]), rank, vt);
      if (rrep[vt].blk.st != status::ok) {
        rmine.faults |= 1u << vt;
        res.faults.push_back({e, vt, rank, rrep[vt].blk.peer, rrep[vt].blk.step, rrep[vt].blk.on_credit, true});
      }
    }
    if (int const missing = comm.exchange(rank, rs.round++, rmine, rall, now_ns() + cfg.sync_timeout_ns); missing >= 0)
      fail(status::timeout, "rank " + std::to_string(missing) + " did not report recovery of collective " + std::to_string(e), missing, -1);
    std::uint32_t nf = 0;
    for (int r = 0; r < n; ++r) nf |= rall[r].faults;
    nf &= live;
    if (nf == 0) break;
    recovery_faults |= nf;
    live &= ~nf;
  }

  // -- control step (identical on every rank)
  if (recovery_faults != 0)
    for (auto& r : records) {
      r.fault_mask |= recovery_faults;
      seal(r);
    }
  epoch_report report{};
  step_result const st = ctl.step(records.data(), n, &report);
  if (st.st == status::mismatch)
    fail(status::mismatch,
         "ranks disagree at collective " + std::to_string(st.epoch) + ": rank " + std::to_string(st.rank) + "'s record failed the " +
             detail::name(st.failed) + " check",
         st.rank, -1);
  if (st.st == status::timeout) fail(status::timeout, "every VT missed its deadline", rank, -1);
  if (st.st != status::ok && st.st != status::recovered) fail(status::internal, "control step rejected its state", rank, -1);
  report.split = sp;

  // -- links of failed VTs and failed probes start over (every rank is past this epoch's traffic)
  std::uint32_t probe_all_ok = probes;
  for (auto const& r : records) probe_all_ok &= r.probe_ok_mask;
  std::uint32_t const reset = dead | recovery_faults | (probes & ~probe_all_ok);
  for (int vt = 0; vt < cfg.n_vts; ++vt)
    if ((reset >> vt) & 1u) comm.fab().reset_vt(rank, vt);

  // -- output
  if (internal_work && count > 0) {
    T const* from = work + (Kind == collective::reduce_scatter ? static_cast<std::uint64_t>(rank) * count : 0);
    std::memcpy(recv, from, out_len * sizeof(T));
  }
  if (reduces(Kind) && op == redop::avg)
    for (std::uint64_t i = 0; i < out_len; ++i) recv[i] = average(recv[i], n);

  rs.ctl.store(ctl);
  rs.last = report;
  res.st = st.st;
  res.report = report;
  res.fault_mask = report.fault_mask;
  res.data_ns = t_data - t_start;
  res.elapsed_ns = now_ns() - t_start;
  return res;
}

}  // namespace reccl::cpu
