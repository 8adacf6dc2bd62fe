// reccl_sim/scenario.hpp -- one simulated configuration ("case"), run under one allocator variant.
//
//   scenario_case ──compile_plan<Schedule>──▶ plan ─┐
//        │ cluster, ranks, VTs, rails              ├─▶ collective_engine ─▶ driver<Allocator>
//        │ background jobs, timeline events        │                        (reccl::control)
//        ▼                                          │
//   for e in 0 .. collectives-1: apply events at e; run_one(e)  ──▶  epoch_row per collective
//
// Schedules and allocators are chosen by name at run time (the CLI reads them from scenario files)
// and dispatched to the project's types: ring, tree, one_shot, two_shot, all_to_all,
// multirail_broadcast; equal, proportional, texcp, aimd. Everything a case needs is in the struct;
// the same case with the same seed gives the same rows.
#pragma once

#include <chrono>
#include <ctime>
#include <climits>
#include <cstdint>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <reccl/policy/allocator/aimd.hpp>
#include <reccl/policy/allocator/equal.hpp>
#include <reccl/policy/allocator/proportional.hpp>
#include <reccl/policy/allocator/texcp.hpp>
#include <reccl/policy/schedule/all_to_all.hpp>
#include <reccl/policy/schedule/multirail_broadcast.hpp>
#include <reccl/policy/schedule/one_shot.hpp>
#include <reccl/policy/schedule/ring.hpp>
#include <reccl/policy/schedule/tree.hpp>
#include <reccl/policy/schedule/two_shot.hpp>

#include "background.hpp"
#include "driver.hpp"
#include "engine.hpp"
#include "plan.hpp"
#include "topology.hpp"

namespace reccl_sim {

/// A change of the simulated world before collective `at` runs.
struct timeline_event {
  enum class kind : std::uint8_t {
    nic_down,  ///< GPU `gpu`'s NIC fails (both directions)
    nic_up,    ///< ... comes back
    nic_loss,  ///< packet loss probability `value` on GPU `gpu`'s NIC
    vt_cap,    ///< VT `vt` throttled to `value` B/s per flow by its own engine (inf: lifted)
    vt_dead,   ///< VT `vt`'s engine stops
    vt_alive,  ///< ... and restarts
  };
  int at = 0;
  kind what = kind::nic_down;
  int gpu = -1;
  int vt = -1;
  double value = 0;
};

/// An allocator under test and how the communicator treats a dead path.
struct variant {
  std::string name;             ///< label in outputs
  std::string allocator = "equal";
  bool abort_on_fault = false;  ///< NCCL: a dead path aborts the communicator
};

/// Everything one simulated configuration needs.
struct scenario_case {
  std::string label;
  cluster_params cluster{};
  // The communicator and its collective.
  std::vector<int> rank_gpus;  ///< rank r sits on GPU rank_gpus[r]
  int n_vts = 8;
  rail_policy rails = rail_policy::per_vt;
  reccl::collective coll = reccl::collective::all_reduce;
  std::string schedule = "ring";
  int root = 0;
  int ranks_per_node = 0;      ///< schedule params (multi-rail broadcast, relays)
  std::uint64_t tile = 1024;   ///< schedule params: elements per tile of interleaved chunking
  std::uint64_t bytes = 256ull << 20;  ///< per-rank message size
  reccl::dtype type = reccl::dtype::float32;
  std::uint64_t granule = 0;   ///< VT boundaries on multiples of this many elements (0: 256 bytes' worth)
  // The world around it.
  std::vector<background_job> background;
  std::vector<timeline_event> events;
  int collectives = 30;
  stall_model telemetry{};
  fault_model faults{};
  engine_options engine{};
  reccl::control_config control{};
  std::uint64_t seed = 1;
};

/// Rows of one case under one variant.
struct case_run {
  std::string label, variant;
  std::vector<epoch_row> rows;
  double wall_s = 0;        ///< wall time of the collectives (not of the plan compilation)
  double cpu_s = 0;         ///< CPU time of the same (the machine may be shared: wall >= CPU)
  double compile_s = 0;     ///< wall time to enumerate and compile the plan
  int nranks = 0;
};

/// Compiles the plan of schedule `name` for `p`. Throws std::invalid_argument for an unknown name
/// or params the schedule rejects.
inline compiled_plan compile_named(std::string const& name, reccl::schedule::params const& p) {
  namespace s = reccl::schedule;
  auto need = [&](bool ok) {
    if (!ok) throw std::invalid_argument("schedule '" + name + "' does not support " + std::string(reccl::name(p.coll)));
  };
  if (name == "ring") return need(s::ring::supports(p.coll)), compile_plan<s::ring>(p, name);
  if (name == "tree") return need(s::tree::supports(p.coll)), compile_plan<s::tree>(p, name);
  if (name == "one_shot") return need(s::one_shot::supports(p.coll)), compile_plan<s::one_shot>(p, name);
  if (name == "two_shot") return need(s::two_shot::supports(p.coll)), compile_plan<s::two_shot>(p, name);
  if (name == "all_to_all") return need(s::all_to_all::supports(p.coll)), compile_plan<s::all_to_all>(p, name);
  if (name == "multirail_broadcast")
    return need(s::multirail_broadcast::supports(p.coll)), compile_plan<s::multirail_broadcast>(p, name);
  throw std::invalid_argument("unknown schedule '" + name +
                              "' (ring, tree, one_shot, two_shot, all_to_all, multirail_broadcast)");
}

namespace detail {

struct any_driver {
  virtual ~any_driver() = default;
  virtual epoch_row run_one(int index) = 0;
};
template <reccl::Allocator A>
struct driver_box final : any_driver {
  template <class... Args>
  explicit driver_box(Args&&... a) : d(std::forward<Args>(a)...) {}
  epoch_row run_one(int index) override { return d.run_one(index); }
  driver<A> d;
};

}  // namespace detail

/// Schedule params of a case.
inline reccl::schedule::params schedule_params(scenario_case const& c) {
  reccl::schedule::params p{};
  p.coll = c.coll;
  p.nranks = static_cast<int>(c.rank_gpus.size());
  p.root = c.root;
  p.ranks_per_node = c.ranks_per_node;
  p.tile = c.tile;
  return p;
}

/// Runs `c` under `v` with an already compiled plan (compile it once per case with compile_named).
inline case_run run_case(scenario_case const& c, variant const& v, compiled_plan const& plan) {
  if (c.collectives < 1) throw std::invalid_argument("case '" + c.label + "': collectives must be >= 1");
  std::size_t const elem = reccl::size_of(c.type);
  if (c.bytes < elem || c.bytes % elem != 0)
    throw std::invalid_argument("case '" + c.label + "': bytes must be a positive multiple of the element size");
  topology topo(c.cluster);
  comm_layout comm(topo, c.rank_gpus, c.n_vts, hash_mix(c.seed, 0xc0), c.rails);
  collective_engine eng(topo, plan, comm, c.engine);
  background_model bg(topo, c.background, c.seed);
  fault_model fm = c.faults;
  fm.abort_on_fault = v.abort_on_fault;
  std::uint64_t const granule = c.granule > 0 ? c.granule : std::max<std::uint64_t>(1, 256 / elem);
  auto d = [&]() {
    namespace al = reccl::allocator;
    auto mk = [&](auto alloc) -> std::unique_ptr<detail::any_driver> {
      using A = decltype(alloc);
      return std::make_unique<detail::driver_box<A>>(topo, eng, bg, c.coll, c.bytes / elem, elem, granule, alloc, c.control,
                                                      c.telemetry, fm, c.seed);
    };
    if (v.allocator == "equal") return mk(al::equal{});
    if (v.allocator == "texcp") return mk(al::texcp{});
    if (v.allocator == "aimd") return mk(al::aimd{});
    if (v.allocator == "proportional") return mk(al::proportional{});
    throw std::invalid_argument("unknown allocator '" + v.allocator + "' (equal, proportional, texcp, aimd)");
  }();
  case_run out;
  out.label = c.label;
  out.variant = v.name;
  out.nranks = plan.nranks;
  auto const t0 = std::chrono::steady_clock::now();
  std::clock_t const c0 = std::clock();
  for (int e = 0; e < c.collectives; ++e) {
    for (auto const& ev : c.events) {
      if (ev.at != e) continue;
      switch (ev.what) {
        case timeline_event::kind::nic_down: topo.set_nic_up(ev.gpu, false); break;
        case timeline_event::kind::nic_up: topo.set_nic_up(ev.gpu, true); break;
        case timeline_event::kind::nic_loss: topo.set_nic_loss(ev.gpu, ev.value); break;
        case timeline_event::kind::vt_cap: eng.set_vt_cap(ev.vt, ev.value); break;
        case timeline_event::kind::vt_dead: eng.set_vt_dead(ev.vt, true); break;
        case timeline_event::kind::vt_alive: eng.set_vt_dead(ev.vt, false); break;
      }
    }
    out.rows.push_back(d->run_one(e));
  }
  out.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out.cpu_s = static_cast<double>(std::clock() - c0) / CLOCKS_PER_SEC;
  return out;
}

/// Compiles the case's plan and runs it under `v`.
inline case_run run_case(scenario_case const& c, variant const& v) {
  auto const t0 = std::chrono::steady_clock::now();
  compiled_plan const plan = compile_named(c.schedule, schedule_params(c));
  double const compile_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  case_run r = run_case(c, v, plan);
  r.compile_s = compile_s;
  return r;
}

/// Mean of `field` over rows with index in [from, to) that did not abort.
template <class F>
double mean_over(case_run const& r, int from, int to, F field) {
  double s = 0;
  int n = 0;
  for (auto const& row : r.rows)
    if (row.index >= from && row.index < to && !row.aborted) {
      s += field(row);
      ++n;
    }
  return n > 0 ? s / n : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace reccl_sim
