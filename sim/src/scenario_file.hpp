// sim/src/scenario_file.hpp -- scenario files (JSON) into scenario_case structs.
//
//   scenario.json                               cases
//   { "base": {...},                 ──────▶    base with sweep values 1 × 1 × ... applied,
//     "sweep": {"a.b": [x, y], ...},            one scenario_case per combination, each labelled
//     "variants": [...], "summary": {...} }     with its sweep values
//
// A sweep key is a dotted path into "base" ("cluster.oversubscription", "collective.bytes"); the
// combinations are the Cartesian product, first key outermost. Every field has a default (see
// scenario_case and cluster_params); unknown fields are an error, so a typo is not silently
// ignored. Units in field names: _GBps = 10^9 bytes/s, _us / _ms = micro/milliseconds; sizes are
// bytes or strings "64MiB", "1GiB", "512KiB".
#pragma once

#include <cstdint>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <reccl_sim/scenario.hpp>

namespace reccl_sim::file {

using json = nlohmann::ordered_json;  // keeps the order of sweep keys as written

/// One case of a scenario file with the sweep values that made it.
struct file_case {
  scenario_case c;
  std::vector<std::pair<std::string, json>> sweep;  ///< (dotted key, value) in sweep order
};

struct scenario_file {
  std::string name, title;
  json raw;  ///< the whole file (summary, published, discussion are read by the reporter)
  std::vector<variant> variants;
  std::vector<file_case> cases;
};

inline void reject_unknown(json const& j, std::set<std::string> const& known, std::string const& where) {
  if (!j.is_object()) throw std::invalid_argument(where + ": expected an object");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (!known.count(it.key())) throw std::invalid_argument(where + ": unknown field '" + it.key() + "'");
}

/// "64MiB", "1GiB", "512KiB", "100MB" (10^6), or a plain number of bytes.
inline std::uint64_t parse_size(json const& j, std::string const& where) {
  if (j.is_number_unsigned() || j.is_number_integer()) {
    if (j.get<long long>() <= 0) throw std::invalid_argument(where + ": size must be > 0");
    return j.get<std::uint64_t>();
  }
  if (!j.is_string()) throw std::invalid_argument(where + ": size must be a number or a string like \"64MiB\"");
  std::string const s = j.get<std::string>();
  std::size_t pos = 0;
  double v = 0;
  try {
    v = std::stod(s, &pos);
  } catch (...) {
    throw std::invalid_argument(where + ": cannot read size '" + s + "'");
  }
  std::string const unit = s.substr(pos);
  static std::map<std::string, double> const units = {{"", 1},          {"B", 1},          {"KiB", 1024.0},
                                                      {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"KB", 1e3},
                                                      {"MB", 1e6},        {"GB", 1e9}};
  auto it = units.find(unit);
  if (it == units.end() || !(v > 0)) throw std::invalid_argument(where + ": cannot read size '" + s + "'");
  return static_cast<std::uint64_t>(v * it->second + 0.5);
}

inline std::string size_label(std::uint64_t b) {
  auto fmt = [](double v, char const* u) {
    std::string s = std::to_string(v);
    s.erase(s.find_last_not_of('0') + 1);
    if (!s.empty() && s.back() == '.') s.pop_back();
    return s + u;
  };
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return fmt(static_cast<double>(b >> 30), "GiB");
  if (b >= (1ull << 20)) return fmt(static_cast<double>(b) / (1 << 20), "MiB");
  if (b >= (1ull << 10)) return fmt(static_cast<double>(b) / (1 << 10), "KiB");
  return std::to_string(b) + "B";
}

inline reccl::collective parse_collective(std::string const& s) {
  for (auto c : {reccl::collective::all_reduce, reccl::collective::reduce_scatter, reccl::collective::all_gather,
                 reccl::collective::broadcast, reccl::collective::all_to_all})
    if (s == reccl::name(c)) return c;
  throw std::invalid_argument("unknown collective '" + s + "' (all_reduce, reduce_scatter, all_gather, broadcast, all_to_all)");
}

inline reccl::dtype parse_dtype(std::string const& s) {
  for (auto t : {reccl::dtype::int32, reccl::dtype::int64, reccl::dtype::float16, reccl::dtype::bfloat16,
                 reccl::dtype::float32, reccl::dtype::float64})
    if (s == reccl::name(t)) return t;
  if (s == "float16") return reccl::dtype::float16;
  if (s == "float32") return reccl::dtype::float32;
  if (s == "float64") return reccl::dtype::float64;
  throw std::invalid_argument("unknown dtype '" + s + "' (int32, int64, half, bfloat16, float, double)");
}

inline cluster_params parse_cluster(json const& j) {
  reject_unknown(j, {"nodes", "gpus_per_node", "nodes_per_tor", "spines", "oversubscription", "nvlink_GBps",
                     "nvlink_latency_us", "nic_Gbps", "mtu", "packet_overhead", "nic_latency_us", "switch_latency_us",
                     "ecmp_seed", "spine_routing"},
                 "cluster");
  cluster_params p;
  p.nodes = j.value("nodes", p.nodes);
  p.gpus_per_node = j.value("gpus_per_node", p.gpus_per_node);
  p.nodes_per_tor = j.value("nodes_per_tor", p.nodes_per_tor);
  p.spines = j.value("spines", p.spines);
  p.oversubscription = j.value("oversubscription", p.oversubscription);
  p.nvlink_bw = j.value("nvlink_GBps", p.nvlink_bw / 1e9) * 1e9;
  p.nvlink_latency = j.value("nvlink_latency_us", p.nvlink_latency * 1e6) * 1e-6;
  p.nic_line_rate = j.value("nic_Gbps", p.nic_line_rate * 8 / 1e9) * 1e9 / 8;
  p.mtu = j.value("mtu", p.mtu);
  p.packet_overhead = j.value("packet_overhead", p.packet_overhead);
  p.nic_latency = j.value("nic_latency_us", p.nic_latency * 1e6) * 1e-6;
  p.switch_latency = j.value("switch_latency_us", p.switch_latency * 1e6) * 1e-6;
  p.ecmp_seed = j.value("ecmp_seed", p.ecmp_seed);
  std::string const routing = j.value("spine_routing", std::string("ecmp"));
  if (routing == "ecmp") p.routing = cluster_params::spine_routing::ecmp;
  else if (routing == "spray") p.routing = cluster_params::spine_routing::spray;
  else throw std::invalid_argument("cluster.spine_routing must be \"ecmp\" or \"spray\"");
  return p;
}

/// GPUs named by {"gpus": [...]} or {"nodes": "all"|[...], "local_gpus": "all"|[...]} (node-major).
inline std::vector<int> parse_gpus(json const& j, cluster_params const& cl, std::string const& where) {
  std::vector<int> out;
  if (j.contains("gpus")) {
    out = j.at("gpus").get<std::vector<int>>();
  } else {
    auto list = [&](char const* key, int n) {
      std::vector<int> v;
      if (!j.contains(key) || (j.at(key).is_string() && j.at(key).get<std::string>() == "all")) {
        for (int i = 0; i < n; ++i) v.push_back(i);
      } else {
        v = j.at(key).get<std::vector<int>>();
      }
      for (int x : v)
        if (x < 0 || x >= n) throw std::invalid_argument(where + ": " + key + " entry " + std::to_string(x) + " out of range");
      return v;
    };
    auto const nodes = list("nodes", cl.nodes);
    auto const locals = list("local_gpus", cl.gpus_per_node);
    for (int n : nodes)
      for (int l : locals) out.push_back(n * cl.gpus_per_node + l);
  }
  for (int g : out)
    if (g < 0 || g >= cl.nodes * cl.gpus_per_node) throw std::invalid_argument(where + ": GPU " + std::to_string(g) + " does not exist");
  return out;
}

inline int parse_gpu_ref(json const& j, cluster_params const& cl, std::string const& where) {
  if (j.is_number_integer()) return j.get<int>();
  reject_unknown(j, {"node", "local", "p"}, where);
  int const n = j.at("node").get<int>(), l = j.at("local").get<int>();
  if (n < 0 || n >= cl.nodes || l < 0 || l >= cl.gpus_per_node) throw std::invalid_argument(where + ": no such GPU");
  return n * cl.gpus_per_node + l;
}

inline scenario_case parse_case(json const& j, std::uint64_t default_seed) {
  reject_unknown(j, {"cluster", "communicator", "collective", "background", "events", "collectives", "telemetry", "faults",
                     "control", "engine", "seed"},
                 "case");
  scenario_case c;
  c.cluster = parse_cluster(j.value("cluster", json::object()));
  json const comm = j.value("communicator", json::object());
  reject_unknown(comm, {"gpus", "nodes", "local_gpus", "vts", "rails"}, "communicator");
  c.rank_gpus = parse_gpus(comm, c.cluster, "communicator");
  c.n_vts = comm.value("vts", c.n_vts);
  std::string const rails = comm.value("rails", std::string("per_vt"));
  if (rails == "per_vt") c.rails = rail_policy::per_vt;
  else if (rails == "sender") c.rails = rail_policy::sender;
  else throw std::invalid_argument("communicator.rails must be \"per_vt\" or \"sender\"");

  json const col = j.value("collective", json::object());
  reject_unknown(col, {"op", "schedule", "bytes", "dtype", "root", "ranks_per_node", "tile", "granule"}, "collective");
  c.coll = parse_collective(col.value("op", std::string("all_reduce")));
  c.schedule = col.value("schedule", c.schedule);
  if (col.contains("bytes")) c.bytes = parse_size(col.at("bytes"), "collective.bytes");
  c.type = parse_dtype(col.value("dtype", std::string("float")));
  c.root = col.value("root", 0);
  c.ranks_per_node = col.value("ranks_per_node", 0);
  c.tile = col.value("tile", c.tile);
  c.granule = col.value("granule", c.granule);

  for (auto const& b : j.value("background", json::array())) {
    reject_unknown(b, {"name", "pattern", "gpus", "nodes", "local_gpus", "pairs", "channels", "flow_cap_GBps", "from", "to",
                       "duty", "mean_on", "spine"},
                   "background job");
    background_job job;
    job.name = b.value("name", std::string("job"));
    std::string const pat = b.value("pattern", std::string("ring"));
    if (pat == "ring") job.pat = background_job::pattern::ring;
    else if (pat == "all_to_all") job.pat = background_job::pattern::all_to_all;
    else if (pat == "pairs") job.pat = background_job::pattern::pairs;
    else throw std::invalid_argument("background job '" + job.name + "': pattern must be ring, all_to_all or pairs");
    if (job.pat == background_job::pattern::pairs) {
      for (auto const& pr : b.at("pairs")) {
        if (!pr.is_array() || pr.size() != 2) throw std::invalid_argument("background job '" + job.name + "': pairs are [src, dst]");
        job.pairs.emplace_back(parse_gpu_ref(pr[0], c.cluster, "pair"), parse_gpu_ref(pr[1], c.cluster, "pair"));
      }
    } else {
      job.gpus = parse_gpus(b, c.cluster, "background job '" + job.name + "'");
    }
    job.channels = b.value("channels", 1);
    if (b.contains("flow_cap_GBps")) job.flow_cap = b.at("flow_cap_GBps").get<double>() * 1e9;
    job.from = b.value("from", 0);
    job.to = b.value("to", INT_MAX);
    job.duty = b.value("duty", 1.0);
    job.mean_on = b.value("mean_on", 10.0);
    job.spine = b.value("spine", -1);
    c.background.push_back(std::move(job));
  }

  for (auto const& e : j.value("events", json::array())) {
    timeline_event ev;
    ev.at = e.at("at").get<int>();
    int n = 0;
    if (e.contains("nic_down")) ev.what = timeline_event::kind::nic_down, ev.gpu = parse_gpu_ref(e.at("nic_down"), c.cluster, "nic_down"), ++n;
    if (e.contains("nic_up")) ev.what = timeline_event::kind::nic_up, ev.gpu = parse_gpu_ref(e.at("nic_up"), c.cluster, "nic_up"), ++n;
    if (e.contains("nic_loss")) {
      ev.what = timeline_event::kind::nic_loss;
      ev.gpu = parse_gpu_ref(e.at("nic_loss"), c.cluster, "nic_loss");
      ev.value = e.at("nic_loss").at("p").get<double>();
      ++n;
    }
    if (e.contains("vt_cap_GBps")) {
      ev.what = timeline_event::kind::vt_cap;
      ev.vt = e.at("vt_cap_GBps").at("vt").get<int>();
      auto const& r = e.at("vt_cap_GBps").at("rate");
      ev.value = r.is_null() ? std::numeric_limits<double>::infinity() : r.get<double>() * 1e9;
      ++n;
    }
    if (e.contains("vt_dead")) ev.what = timeline_event::kind::vt_dead, ev.vt = e.at("vt_dead").get<int>(), ++n;
    if (e.contains("vt_alive")) ev.what = timeline_event::kind::vt_alive, ev.vt = e.at("vt_alive").get<int>(), ++n;
    if (n != 1) throw std::invalid_argument("event at " + std::to_string(ev.at) + ": exactly one of nic_down, nic_up, nic_loss, vt_cap_GBps, vt_dead, vt_alive");
    c.events.push_back(ev);
  }

  c.collectives = j.value("collectives", c.collectives);
  json const tel = j.value("telemetry", json::object());
  reject_unknown(tel, {"noise", "poll_ns", "push_GBps", "calibrate", "calibration_samples", "refit_every"}, "telemetry");
  c.telemetry.noise = tel.value("noise", c.telemetry.noise);
  c.telemetry.poll_ns = tel.value("poll_ns", c.telemetry.poll_ns);
  c.telemetry.push_rate = tel.value("push_GBps", c.telemetry.push_rate / 1e9) * 1e9;
  c.telemetry.calibrate = tel.value("calibrate", c.telemetry.calibrate);
  c.telemetry.calibration_samples = tel.value("calibration_samples", c.telemetry.calibration_samples);
  c.telemetry.refit_every = tel.value("refit_every", c.telemetry.refit_every);
  json const fl = j.value("faults", json::object());
  reject_unknown(fl, {"deadline_ms", "probe_grace_ms"}, "faults");
  c.faults.deadline = fl.value("deadline_ms", c.faults.deadline * 1e3) * 1e-3;
  c.faults.probe_grace = fl.value("probe_grace_ms", c.faults.probe_grace * 1e3) * 1e-3;
  json const ctl = j.value("control", json::object());
  reject_unknown(ctl, {"probe_interval", "rejoin_share"}, "control");
  c.control.probe_interval = ctl.value("probe_interval", c.control.probe_interval);
  if (ctl.contains("rejoin_share")) {
    double const s = ctl.at("rejoin_share").get<double>();
    if (!(s > 0 && s <= 0.5)) throw std::invalid_argument("control.rejoin_share must be in (0, 0.5]");
    c.control.rejoin_share = static_cast<std::uint32_t>(s * reccl::share_one);
  }
  json const en = j.value("engine", json::object());
  reject_unknown(en, {"step_overhead_us", "coupling_rounds", "mode"}, "engine");
  std::string const mode = en.value("mode", std::string("event"));
  if (mode != "event" && mode != "per_phase") throw std::invalid_argument("engine.mode must be \"event\" or \"per_phase\"");
  c.engine.per_phase = mode == "per_phase";
  c.engine.step_overhead = en.value("step_overhead_us", c.engine.step_overhead * 1e6) * 1e-6;
  c.engine.coupling_rounds = en.value("coupling_rounds", c.engine.coupling_rounds);
  c.seed = j.value("seed", default_seed);
  return c;
}

/// Sets the value at dotted path `key` inside `j` (creating objects on the way; a numeric part
/// indexes an existing array, e.g. "background.0.duty").
inline void set_path(json& j, std::string const& key, json const& v) {
  json* cur = &j;
  std::size_t start = 0;
  for (;;) {
    std::size_t const dot = key.find('.', start);
    std::string const part = key.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    json* next = nullptr;
    if (cur->is_array()) {
      std::size_t idx = 0;
      try {
        idx = std::stoul(part);
      } catch (...) {
        throw std::invalid_argument("sweep key '" + key + "': '" + part + "' indexes a list, it must be a number");
      }
      if (idx >= cur->size()) throw std::invalid_argument("sweep key '" + key + "': index " + part + " past the end of the list");
      next = &(*cur)[idx];
    } else {
      next = &(*cur)[part];
    }
    if (dot == std::string::npos) {
      *next = v;
      return;
    }
    cur = next;
    start = dot + 1;
  }
}

inline std::string value_label(std::string const& key, json const& v) {
  if (key.size() >= 5 && key.compare(key.size() - 5, 5, "bytes") == 0) return size_label(parse_size(v, key));
  if (v.is_string()) return v.get<std::string>();
  return v.dump();
}

inline scenario_file load(std::string const& path) {
  std::ifstream in(path);
  if (!in) throw std::invalid_argument("cannot open scenario file '" + path + "'");
  json j;
  try {
    j = json::parse(in, nullptr, true, /*ignore_comments=*/true);
  } catch (json::parse_error const& e) {
    throw std::invalid_argument(path + ": " + e.what());
  }
  reject_unknown(j, {"name", "title", "description", "published", "discussion", "summary", "base", "sweep", "variants",
                     "rows", "cases"},
                 path);
  scenario_file f;
  f.raw = j;
  f.name = j.at("name").get<std::string>();
  f.title = j.value("title", f.name);
  for (auto const& v : j.at("variants")) {
    reject_unknown(v, {"name", "allocator", "abort_on_fault"}, "variant");
    f.variants.push_back(variant{v.at("name").get<std::string>(), v.value("allocator", std::string("equal")),
                                 v.value("abort_on_fault", false)});
  }
  if (f.variants.empty()) throw std::invalid_argument(path + ": no variants");
  json const base = j.value("base", json::object());
  // Either a sweep over base, or an explicit list of named cases (each merged over base).
  std::vector<std::pair<json, std::vector<std::pair<std::string, json>>>> combos;
  if (j.contains("cases")) {
    for (auto const& cj : j.at("cases")) {
      json b = base;
      std::string label = cj.value("label", std::string("case"));
      for (auto it = cj.begin(); it != cj.end(); ++it)
        if (it.key() != "label") set_path(b, it.key(), it.value());
      combos.push_back({b, {{"case", json(label)}}});
    }
  } else {
    combos.push_back({base, {}});
    json const sweep = j.value("sweep", json::object());
    for (auto const& [key, values] : sweep.items()) {
      if (!values.is_array() || values.empty()) throw std::invalid_argument(path + ": sweep '" + key + "' must be a non-empty list");
      std::vector<std::pair<json, std::vector<std::pair<std::string, json>>>> next;
      for (auto const& [b, tags] : combos)
        for (auto const& v : values) {
          json nb = b;
          auto nt = tags;
          if (!key.empty() && key[0] == '@') {
            // A named setting of several keys at once: {"label": "...", "set": {"a.b": x, ...}}.
            if (!v.is_object() || !v.contains("label") || !v.contains("set"))
              throw std::invalid_argument(path + ": sweep '" + key + "' entries must be {\"label\": ..., \"set\": {...}}");
            for (auto const& [k2, v2] : v.at("set").items()) set_path(nb, k2, v2);
            nt.emplace_back(key, v.at("label"));
          } else {
            set_path(nb, key, v);
            nt.emplace_back(key, v);
          }
          next.push_back({nb, nt});
        }
      combos = std::move(next);
    }
  }
  for (auto const& [b, tags] : combos) {
    file_case fc;
    try {
      fc.c = parse_case(b, 1);
    } catch (std::exception const& e) {
      throw std::invalid_argument(path + ": " + e.what());
    }
    fc.sweep = tags;
    std::string label;
    for (auto const& [k, v] : tags) {
      if (!label.empty()) label += ", ";
      label += (k == "case" || k[0] == '@' ? std::string() : k.substr(k.rfind('.') + 1) + "=") + value_label(k, v);
    }
    fc.c.label = label.empty() ? f.name : label;
    f.cases.push_back(std::move(fc));
  }
  return f;
}

}  // namespace reccl_sim::file
