// sim/src/report.hpp -- what a scenario's runs mean: summary statistics, CSV and markdown.
//
//   runs (case × variant × collective rows)
//      │ summary.type: steady | fault | congestion | cases | phases | scale
//      ▼
//   stats  {"ratio_mean|reccl TeXCP|oversubscription=2": 1.93, ...}   ──▶ <name>_summary.csv
//      │ "published": [{metric, published, stat}]                       ──▶ <name>.md: published and
//      ▼                                                                    simulated side by side
//   rows ──▶ <name>.csv (one line per collective; plot.py draws from it)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "scenario_file.hpp"

namespace reccl_sim::report {

using file::json;

struct run_set {
  file::scenario_file const* f = nullptr;
  std::vector<case_run> runs;  ///< case-major, then variant (same order as f->cases × f->variants)
  case_run const& at(std::size_t c, std::size_t v) const { return runs.at(c * f->variants.size() + v); }
};

using stats = std::map<std::string, double>;

inline double metric_of(epoch_row const& r, std::string const& metric) {
  if (metric == "busbw") return r.busbw;
  if (metric == "algbw") return r.algbw;
  if (metric == "time") return r.time;
  throw std::invalid_argument("unknown metric '" + metric + "' (busbw, algbw, time)");
}

/// First index i in [from, to) such that every row in [i, to) satisfies ok(row) (to if none).
template <class Ok>
int settles_at(case_run const& r, int from, int to, Ok ok) {
  int first = to;
  for (int i = to - 1; i >= from; --i) {
    auto const& row = r.rows.at(static_cast<std::size_t>(i));
    if (row.aborted || !ok(row)) break;
    first = i;
  }
  return first;
}

/// Label of a case without the sweep keys in `drop`.
inline std::string group_label(file::file_case const& fc, std::vector<std::string> const& drop) {
  std::string s;
  for (auto const& [k, v] : fc.sweep) {
    if (std::find(drop.begin(), drop.end(), k) != drop.end()) continue;
    if (!s.empty()) s += ", ";
    s += (k == "case" || k[0] == '@' ? std::string() : k.substr(k.rfind('.') + 1) + "=") + file::value_label(k, v);
  }
  return s.empty() ? "all" : s;
}

struct table {
  std::vector<std::string> head;
  std::vector<std::vector<std::string>> rows;
};

inline std::string markdown(table const& t) {
  std::string s = "|";
  for (auto const& h : t.head) s += " " + h + " |";
  s += "\n|";
  for (std::size_t i = 0; i < t.head.size(); ++i) s += i == 0 ? "---|" : "---:|";
  s += "\n";
  for (auto const& r : t.rows) {
    s += "|";
    for (auto const& c : r) s += " " + c + " |";
    s += "\n";
  }
  return s;
}

inline std::string gbps(double x) { return std::isfinite(x) ? fmt::format("{:.1f}", x / 1e9) : "—"; }

/// steady: mean of a metric over collectives >= from per case and variant; ratio to the baseline
/// variant per case; aggregated over the sweep keys in `pool` (e.g. ECMP seeds).
inline void steady(run_set const& rs, stats& st, table& t) {
  auto const& s = rs.f->raw.at("summary");
  int const from = s.value("from", 0);
  std::string const metric = s.value("metric", std::string("busbw"));
  std::vector<std::string> const pool = s.value("pool", std::vector<std::string>{});
  auto const& vars = rs.f->variants;
  std::string const base = s.value("baseline", vars.front().name);
  std::size_t bi = 0;
  while (bi < vars.size() && vars[bi].name != base) ++bi;
  if (bi == vars.size()) throw std::invalid_argument("summary.baseline '" + base + "' is not a variant");
  struct acc {
    std::vector<double> val[reccl::max_vts + 8];
    std::vector<double> ratio[reccl::max_vts + 8];
  };
  std::map<std::string, acc> groups;
  std::vector<std::string> order;
  for (std::size_t c = 0; c < rs.f->cases.size(); ++c) {
    std::string const g = group_label(rs.f->cases[c], pool);
    if (!groups.count(g)) order.push_back(g);
    auto& a = groups[g];
    double const b = mean_over(rs.at(c, bi), from, INT32_MAX, [&](epoch_row const& r) { return metric_of(r, metric); });
    for (std::size_t v = 0; v < vars.size(); ++v) {
      double const x = mean_over(rs.at(c, v), from, INT32_MAX, [&](epoch_row const& r) { return metric_of(r, metric); });
      a.val[v].push_back(x);
      a.ratio[v].push_back(x / b);
    }
  }
  t.head = {"case"};
  for (auto const& v : vars) t.head.push_back(v.name + " " + metric + " GB/s");
  for (std::size_t v = 0; v < vars.size(); ++v)
    if (v != bi) t.head.push_back(vars[v].name + " / " + base + (pool.empty() ? "" : " (mean, min–max)"));
  for (auto const& g : order) {
    auto const& a = groups[g];
    std::vector<std::string> row{g};
    for (std::size_t v = 0; v < vars.size(); ++v) {
      double m = 0;
      for (double x : a.val[v]) m += x;
      m /= static_cast<double>(a.val[v].size());
      st["value|" + vars[v].name + "|" + g] = m;
      row.push_back(gbps(m));
    }
    for (std::size_t v = 0; v < vars.size(); ++v) {
      if (v == bi) continue;
      auto const& r = a.ratio[v];
      double m = 0, lo = INFINITY, hi = -INFINITY;
      for (double x : r) m += x, lo = std::min(lo, x), hi = std::max(hi, x);
      m /= static_cast<double>(r.size());
      st["ratio_mean|" + vars[v].name + "|" + g] = m;
      st["ratio_min|" + vars[v].name + "|" + g] = lo;
      st["ratio_max|" + vars[v].name + "|" + g] = hi;
      row.push_back(pool.empty() ? fmt::format("{:.2f}×", m) : fmt::format("{:.2f}× ({:.2f}–{:.2f})", m, lo, hi));
    }
    t.rows.push_back(row);
  }
}

/// fault: a path dies at `fail_at` and returns at `up_at`. One table row per case and variant;
/// the kept fraction and settling counts are also pooled over the cases (e.g. ECMP seeds).
inline void fault(run_set const& rs, stats& st, table& t) {
  auto const& s = rs.f->raw.at("summary");
  int const fail = s.at("fail_at").get<int>(), up = s.at("up_at").get<int>();
  double const tol = s.value("tolerance", 0.05);
  int const pre_from = s.value("pre_from", std::max(0, fail - 5));
  bool const many = rs.f->cases.size() > 1;
  t.head = {"case", "variant", "before GB/s", "failure epoch GB/s", "settled while down GB/s", "kept", "collectives to settle",
            "rejoined at", "collectives to regain 95%", "after GB/s"};
  for (std::size_t v = 0; v < rs.f->variants.size(); ++v) {
    std::string const n = rs.f->variants[v].name;
    std::vector<double> kept, settle_n, regain_n;
    for (std::size_t c = 0; c < rs.f->cases.size(); ++c) {
      auto const& r = rs.at(c, v);
      std::string const k = n + (many ? "|" + r.label : "");
      int const last = static_cast<int>(r.rows.size());
      double const pre = mean_over(r, pre_from, fail, [](epoch_row const& x) { return x.busbw; });
      auto const& fr = r.rows.at(static_cast<std::size_t>(fail));
      std::vector<std::string> row{r.label, n, gbps(pre)};
      st["pre|" + k] = pre;
      if (fr.aborted) {
        st["aborted_at|" + k] = fail;
        row.insert(row.end(), {"aborted", "—", "—", "—", "—", "—", "—"});
        t.rows.push_back(row);
        continue;
      }
      double const down = mean_over(r, std::max(fail + 1, up - 5), up, [](epoch_row const& x) { return x.busbw; });
      int const settle = settles_at(r, fail + 1, up, [&](epoch_row const& x) { return std::abs(x.busbw - down) <= tol * down; });
      int rejoin = -1;
      for (int i = up; i < last; ++i)
        if (r.rows[static_cast<std::size_t>(i)].rejoined_mask != 0) {
          rejoin = i;
          break;
        }
      int regain = -1;
      if (rejoin >= 0) {
        int const i = settles_at(r, rejoin + 1, last, [&](epoch_row const& x) { return x.busbw >= (1 - tol) * pre; });
        if (i < last) regain = i - rejoin;
      }
      double const after = mean_over(r, std::max(up, last - 5), last, [](epoch_row const& x) { return x.busbw; });
      st["failure_epoch|" + k] = fr.busbw;
      st["down|" + k] = down;
      st["kept|" + k] = down / pre;
      st["settle|" + k] = settle - fail;
      st["rejoin_at|" + k] = rejoin;
      st["regain|" + k] = regain;
      st["after|" + k] = after;
      kept.push_back(down / pre);
      settle_n.push_back(settle - fail);
      if (regain >= 0) regain_n.push_back(regain);
      row.insert(row.end(), {gbps(fr.busbw), gbps(down), fmt::format("{:.1f}%", 100 * down / pre), std::to_string(settle - fail),
                             rejoin >= 0 ? std::to_string(rejoin) : "never", regain >= 0 ? std::to_string(regain) : "—", gbps(after)});
      t.rows.push_back(row);
    }
    auto pool = [&](std::vector<double> const& x, std::string const& key) {
      if (x.empty()) return;
      double m = 0, lo = INFINITY, hi = -INFINITY;
      for (double y : x) m += y, lo = std::min(lo, y), hi = std::max(hi, y);
      st[key + "_mean|" + n] = m / static_cast<double>(x.size());
      st[key + "_min|" + n] = lo;
      st[key + "_max|" + n] = hi;
    };
    pool(kept, "kept");
    pool(settle_n, "settle");
    pool(regain_n, "regain");
  }
}

/// congestion: extra traffic during collectives [on, off).
inline void congestion(run_set const& rs, stats& st, table& t) {
  auto const& s = rs.f->raw.at("summary");
  int const on = s.at("on").get<int>(), off = s.at("off").get<int>();
  double const tol = s.value("tolerance", 0.05);
  t.head = {"variant", "before GB/s", "first congested GB/s", "adapted GB/s", "collectives to adapt", "first after GB/s",
            "collectives to recover", "busbw CoV under congestion", "mean |Δshare| per collective"};
  for (std::size_t v = 0; v < rs.f->variants.size(); ++v) {
    auto const& r = rs.at(0, v);
    std::string const n = rs.f->variants[v].name;
    int const last = static_cast<int>(r.rows.size());
    double const before = mean_over(r, std::max(0, on - 5), on, [](epoch_row const& x) { return x.busbw; });
    double const adapted = mean_over(r, std::max(on, off - 3), off, [](epoch_row const& x) { return x.busbw; });
    int const reach = settles_at(r, on, off, [&](epoch_row const& x) { return x.busbw >= (1 - tol) * adapted; });
    int const rec = settles_at(r, off, last, [&](epoch_row const& x) { return x.busbw >= (1 - tol) * before; });
    double m = 0, m2 = 0, dsh = 0;
    int k = 0, kd = 0;
    for (int i = on + 3; i < off; ++i) {
      double const b = r.rows[static_cast<std::size_t>(i)].busbw;
      m += b, m2 += b * b, ++k;
    }
    for (int i = on + 1; i < off; ++i) {
      auto const& a = r.rows[static_cast<std::size_t>(i - 1)];
      auto const& b = r.rows[static_cast<std::size_t>(i)];
      for (int q = 0; q < b.n_vts; ++q) dsh += std::abs(b.share[q] - a.share[q]);
      ++kd;
    }
    m /= k;
    double const cov = k > 1 ? std::sqrt(std::max(0.0, m2 / k - m * m)) / m : 0;
    dsh /= std::max(1, kd);
    st["before|" + n] = before;
    st["onset|" + n] = r.rows.at(static_cast<std::size_t>(on)).busbw;
    st["adapted|" + n] = adapted;
    st["reach|" + n] = reach - on;
    st["after|" + n] = r.rows.at(static_cast<std::size_t>(off)).busbw;
    st["recover|" + n] = rec < last ? rec - off : -1;
    st["cov|" + n] = cov;
    st["dshare|" + n] = dsh;
    st["onset_over_before|" + n] = st["onset|" + n] / before;
    st["adapted_over_onset|" + n] = adapted / st["onset|" + n];
    t.rows.push_back({n, gbps(before), gbps(st["onset|" + n]), gbps(adapted), std::to_string(reach - on), gbps(st["after|" + n]),
                      rec < last ? std::to_string(rec - off) : "not within the run", fmt::format("{:.3f}", cov),
                      fmt::format("{:.4f}", dsh)});
  }
}

/// cases: a metric per (case, variant), and its ratio to the first case.
inline void cases(run_set const& rs, stats& st, table& t) {
  auto const& s = rs.f->raw.at("summary");
  int const from = s.value("from", 0);
  std::string const metric = s.value("metric", std::string("algbw"));
  t.head = {"case"};
  for (auto const& v : rs.f->variants) t.head.push_back(v.name + " " + metric + " GB/s");
  for (auto const& v : rs.f->variants) t.head.push_back(v.name + " vs first case");
  for (std::size_t c = 0; c < rs.f->cases.size(); ++c) {
    std::vector<std::string> row{rs.f->cases[c].c.label};
    std::vector<std::string> ratios;
    for (std::size_t v = 0; v < rs.f->variants.size(); ++v) {
      auto val = [&](std::size_t cc) {
        return mean_over(rs.at(cc, v), from, INT32_MAX, [&](epoch_row const& r) { return metric_of(r, metric); });
      };
      double const x = val(c), x0 = val(0);
      st["value|" + rs.f->cases[c].c.label + "|" + rs.f->variants[v].name] = x;
      st["ratio|" + rs.f->cases[c].c.label + "|" + rs.f->variants[v].name] = x / x0;
      row.push_back(gbps(x));
      ratios.push_back(fmt::format("{:.2f}×", x / x0));
    }
    row.insert(row.end(), ratios.begin(), ratios.end());
    t.rows.push_back(row);
  }
}

/// phases: mean busbw per named index range, per variant.
inline void phases(run_set const& rs, stats& st, table& t) {
  auto const& s = rs.f->raw.at("summary");
  t.head = {"phase", "collectives"};
  for (auto const& v : rs.f->variants) t.head.push_back(v.name + " busbw GB/s");
  t.head.push_back("measured (bench/results)");
  for (auto const& p : s.at("phases")) {
    std::string const n = p.at("name").get<std::string>();
    int const a = p.at("from").get<int>(), b = p.at("to").get<int>();
    std::vector<std::string> row{n, fmt::format("{}–{}", a, b - 1)};
    for (std::size_t v = 0; v < rs.f->variants.size(); ++v) {
      double const x = mean_over(rs.at(0, v), a, b, [](epoch_row const& r) { return r.busbw; });
      st["phase|" + n + "|" + rs.f->variants[v].name] = x;
      row.push_back(gbps(x));
    }
    row.push_back(p.value("measured", std::string("pending")));
    t.rows.push_back(row);
  }
}

/// scale: simulation cost per case.
inline void scale(run_set const& rs, stats& st, table& t) {
  t.head = {"case", "ranks", "collectives run", "plan compile s", "wall s per collective", "CPU s per collective",
            "simulated collectives per wall s", "100 collectives, wall s", "max-min solves per collective", "simulated busbw GB/s"};
  for (std::size_t c = 0; c < rs.f->cases.size(); ++c)
    for (std::size_t v = 0; v < rs.f->variants.size(); ++v) {
      auto const& r = rs.at(c, v);
      double const per = r.wall_s / static_cast<double>(r.rows.size());
      double solves = 0;
      for (auto const& row : r.rows) solves += row.solves;
      solves /= static_cast<double>(r.rows.size());
      double const bw = mean_over(r, 0, INT32_MAX, [](epoch_row const& x) { return x.busbw; });
      std::string const k = r.label + "|" + r.variant;
      double const cpu = r.cpu_s / static_cast<double>(r.rows.size());
      st["wall_per_collective|" + k] = per;
      st["cpu_per_collective|" + k] = cpu;
      st["collectives_per_s|" + k] = 1.0 / per;
      st["hundred_s|" + k] = 100 * per + r.compile_s;
      st["busbw|" + k] = bw;
      t.rows.push_back({r.label, std::to_string(r.nranks), std::to_string(r.rows.size()), fmt::format("{:.3f}", r.compile_s),
                        fmt::format("{:.4f}", per), fmt::format("{:.4f}", cpu), fmt::format("{:.1f}", 1.0 / per),
                        fmt::format("{:.2f}", 100 * per + r.compile_s), fmt::format("{:.1f}", solves), gbps(bw)});
    }
}

inline std::string format_stat(double x, std::string const& f) {
  if (!std::isfinite(x)) return "—";
  if (f == "ratio") return fmt::format("{:.2f}×", x);
  if (f == "pct") return fmt::format("{:.1f}%", 100 * x);
  if (f == "GBps") return fmt::format("{:.1f} GB/s", x / 1e9);
  if (f == "int") return fmt::format("{:.0f}", x);
  if (f == "s") return fmt::format("{:.2f} s", x);
  if (f == "abort") return fmt::format("aborts (collective {:.0f})", x);
  return fmt::format("{:.3g}", x);
}

inline std::string joined(json const& j) {
  if (j.is_string()) return j.get<std::string>();
  std::string s;
  for (auto const& x : j) s += x.get<std::string>() + "\n";
  return s;
}

/// Writes <out>/<name>.csv, <name>_summary.csv and <name>.md; returns the stats.
inline stats write(run_set const& rs, std::string const& out_dir) {
  auto const& f = *rs.f;
  stats st;
  table t;
  std::string const type = f.raw.at("summary").at("type").get<std::string>();
  if (type == "steady") steady(rs, st, t);
  else if (type == "fault") fault(rs, st, t);
  else if (type == "congestion") congestion(rs, st, t);
  else if (type == "cases") cases(rs, st, t);
  else if (type == "phases") phases(rs, st, t);
  else if (type == "scale") scale(rs, st, t);
  else throw std::invalid_argument("unknown summary type '" + type + "'");

  // Per-collective rows.
  std::string const rows_mode = f.raw.value("rows", std::string("all"));
  if (rows_mode != "none") {
    std::ofstream o(out_dir + "/" + f.name + ".csv");
    int nv = 0;
    for (auto const& c : f.cases) nv = std::max(nv, c.c.n_vts);
    o << "case,variant,index,time_us,data_time_us,algbw_GBps,busbw_GBps,status,aborted,live_mask,fault_mask,probe_mask,rejoined_mask";
    for (int v = 0; v < nv; ++v) o << ",share_" << v;
    for (int v = 0; v < nv; ++v) o << ",rate_GBps_" << v;
    o << "\n";
    for (std::size_t i = 0; i < rs.runs.size(); ++i) {
      if (rows_mode == "first" && i >= f.variants.size()) break;
      auto const& r = rs.runs[i];
      for (auto const& row : r.rows) {
        o << '"' << r.label << "\",\"" << r.variant << "\"," << row.index << ','
          << fmt::format("{:.3f},{:.3f},{:.3f},{:.3f}", row.time * 1e6, row.data_time * 1e6, row.algbw / 1e9, row.busbw / 1e9) << ','
          << reccl::name(row.st) << ',' << (row.aborted ? 1 : 0) << ',' << row.live_mask << ',' << row.fault_mask << ','
          << row.probe_mask << ',' << row.rejoined_mask;
        for (int v = 0; v < nv; ++v) o << ',' << fmt::format("{:.5f}", v < row.n_vts ? row.share[v] : 0.0);
        for (int v = 0; v < nv; ++v) o << ',' << fmt::format("{:.3f}", v < row.n_vts ? row.vt_rate[v] / 1e9 : 0.0);
        o << "\n";
      }
    }
  }
  {
    std::ofstream o(out_dir + "/" + f.name + "_summary.csv");
    o << "stat,value\n";
    for (auto const& [k, v] : st) o << '"' << k << "\"," << fmt::format("{:.6g}", v) << "\n";
  }
  // Markdown: published and simulated side by side.
  std::string md = "# " + f.title + "\n\n";
  if (f.raw.contains("description")) md += joined(f.raw.at("description")) + "\n";
  if (f.raw.contains("published")) {
    table p;
    p.head = {"quantity", "published / measured", "source", "simulated", "simulated / published"};
    for (auto const& e : f.raw.at("published")) {
      std::string const key = e.at("stat").get<std::string>();
      auto it = st.find(key);
      if (it == st.end()) {
        std::string known;
        for (auto const& [k, _] : st) known += "\n  " + k;
        throw std::invalid_argument(f.name + ": published entry names unknown stat '" + key + "'; known:" + known);
      }
      std::string const fm = e.value("format", std::string("ratio"));
      std::string diff = "—";
      if (e.contains("published_value")) {
        double const pv = e.at("published_value").get<double>();
        if (pv != 0 && std::isfinite(it->second)) diff = fmt::format("{:.2f}", it->second / pv);
      }
      p.rows.push_back({e.at("metric").get<std::string>(), e.at("published").get<std::string>(), e.value("source", std::string()),
                        format_stat(it->second, fm), diff});
    }
    md += "## Published (or measured) and simulated, side by side\n\n" + markdown(p) + "\n";
  }
  md += "![" + f.name + "](" + f.name + ".png)\n\n";
  md += "## All simulated results\n\n" + markdown(t) + "\n";
  if (f.raw.contains("discussion")) md += "## Where the model differs and why\n\n" + joined(f.raw.at("discussion")) + "\n";
  md += fmt::format("Reproduce: `build/.../sim/reccl_sim sim/scenarios/{}.json` (or `bash sim/run_all.sh`).\n", f.name);
  std::ofstream(out_dir + "/" + f.name + ".md") << md;
  return st;
}

}  // namespace reccl_sim::report
