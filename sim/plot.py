#!/usr/bin/python3
"""Draws sim/results/<name>.png from the CSVs reccl_sim writes (one figure per scenario).

Usage: /usr/bin/python3 sim/plot.py [RESULTS_DIR]

Needs matplotlib (Debian: python3-matplotlib); without it, prints "plots skipped" and exits 0 so
that run_all.sh still produces the CSV and markdown results.
"""
import csv
import os
import sys

try:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
except ImportError:  # pragma: no cover - depends on the machine
    print("matplotlib not found: plots skipped")
    sys.exit(0)


def read_rows(path):
    if not os.path.exists(path):
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_stats(path):
    out = {}
    for r in read_rows(path):
        out[r["stat"]] = float(r["value"])
    return out


def series(rows, case=None, variant=None, key="busbw_GBps"):
    xs, ys = [], []
    for r in rows:
        if (case is None or r["case"] == case) and (variant is None or r["variant"] == variant):
            xs.append(int(r["index"]))
            ys.append(float(r[key]) if r["aborted"] == "0" else float("nan"))
    return xs, ys


def ordered(values):
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def timeline(ax, rows, case, title, shade=None, marks=()):
    for v in ordered(r["variant"] for r in rows if r["case"] == case):
        xs, ys = series(rows, case, v)
        ax.plot(xs, ys, marker="o", ms=3, label=v)
    if shade:
        ax.axvspan(shade[0] - 0.5, shade[1] - 0.5, color="orange", alpha=0.15, label=shade[2])
    for x, label in marks:
        ax.axvline(x - 0.5, color="grey", ls="--", lw=0.8)
        ax.annotate(label, (x - 0.4, ax.get_ylim()[1] * 0.97), fontsize=7, va="top")
    ax.set_xlabel("collective")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def shares(ax, rows, case, variant, title):
    picked = [r for r in rows if r["case"] == case and r["variant"] == variant]
    if not picked:
        return
    n = len([k for k in picked[0] if k.startswith("share_")])
    xs = [int(r["index"]) for r in picked]
    for v in range(n):
        ax.plot(xs, [float(r["share_%d" % v]) for r in picked], lw=1, label="VT %d" % v)
    ax.set_xlabel("collective")
    ax.set_ylabel("share of the message")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6, ncol=2)


def plot_steady(name, rows, stats, published=None):
    groups = ordered(k.split("|", 2)[2] for k in stats if k.startswith("ratio_mean|"))
    variant = ordered(k.split("|", 2)[1] for k in stats if k.startswith("ratio_mean|"))[0]
    mean = [stats["ratio_mean|%s|%s" % (variant, g)] for g in groups]
    lo = [m - stats["ratio_min|%s|%s" % (variant, g)] for m, g in zip(mean, groups)]
    hi = [stats["ratio_max|%s|%s" % (variant, g)] - m for m, g in zip(mean, groups)]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8), gridspec_kw={"width_ratios": [3, 2]})
    ax = axes[0]
    ax.barh(range(len(groups)), mean, xerr=[lo, hi], color="tab:blue", alpha=0.8)
    ax.set_yticks(range(len(groups)))
    ax.set_yticklabels(groups, fontsize=6)
    ax.invert_yaxis()
    ax.axvline(1.0, color="black", lw=0.8)
    if published:
        ax.axvline(published[0], color="tab:red", ls="--", label=published[1])
        ax.legend(fontsize=7)
    ax.set_xlabel("%s busbw / equal-split busbw (bars: mean, whiskers: min–max over ECMP seeds)" % variant, fontsize=8)
    ax.grid(alpha=0.3, axis="x")
    if rows:
        case = rows[0]["case"]
        timeline(axes[1], rows, case, "per collective: " + case)
    fig.tight_layout()
    return fig


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
    made = 0
    for fname in sorted(os.listdir(out)):
        if not fname.endswith("_summary.csv"):
            continue
        name = fname[: -len("_summary.csv")]
        rows = read_rows(os.path.join(out, name + ".csv"))
        stats = read_stats(os.path.join(out, fname))
        fig = None
        if name == "colocated":
            fig = plot_steady(name, rows, stats, (1.8, "PReCCL: 1.8× (testbed, ≥ 64 MB)"))
        elif name == "loss":
            fig = plot_steady(name, rows, stats, (2.9, "PReCCL: 2.9× (1% loss)"))
        elif name == "fault":
            case = rows[0]["case"]
            fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
            timeline(axes[0], rows, case, "one of 8 NICs down at 10, up at 30 (" + case + ")",
                     marks=[(10, "NIC down"), (30, "NIC up")])
            shares(axes[1], rows, case, ordered(r["variant"] for r in rows)[-1], "TeXCP shares")
            fig.tight_layout()
        elif name == "congestion":
            case = rows[0]["case"]
            fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
            timeline(axes[0], rows, case, "congested spine during collectives 11–20", shade=(10, 20, "congestion"))
            variants = ordered(r["variant"] for r in rows)
            shares(axes[1], rows, case, variants[1], variants[1] + " shares")
            shares(axes[2], rows, case, variants[2], variants[2] + " shares")
            fig.tight_layout()
        elif name == "calibration":
            case = rows[0]["case"]
            fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
            timeline(axes[0], rows, case, "2 GPUs, one NVLink: VT 1 throttled 10–24, VT 2 dead 25–39",
                     marks=[(10, "VT1 ¼"), (25, "VT2 dead"), (40, "VT2 back")])
            shares(axes[1], rows, case, ordered(r["variant"] for r in rows)[-1], "TeXCP shares")
            fig.tight_layout()
        elif name == "broadcast":
            cases = ordered(k.split("|")[1] for k in stats if k.startswith("value|"))
            vals = [stats["value|%s|equal split" % c] for c in cases]
            fig, ax = plt.subplots(figsize=(10, 4.2))
            labels = ["published: 1 source-node rank (NCCL)", "published: 8 source-node ranks (NCCL)"] + cases
            data = [47.86, 290.17] + [v / 1e9 for v in vals]
            colors = ["tab:red", "tab:red"] + ["tab:blue"] * len(cases)
            ax.barh(range(len(data)), data, color=colors, alpha=0.8)
            for i, d in enumerate(data):
                ax.annotate("%.1f" % d, (d, i), fontsize=7, va="center")
            ax.set_yticks(range(len(data)))
            ax.set_yticklabels(labels, fontsize=7)
            ax.invert_yaxis()
            ax.set_xlabel("broadcast throughput, 1 GiB (GB/s)")
            ax.grid(alpha=0.3, axis="x")
            fig.tight_layout()
        elif name == "scale":
            keys = ordered(k.split("|", 1)[1] for k in stats if k.startswith("collectives_per_s|"))
            fig, ax = plt.subplots(figsize=(10, 4))
            ax.barh(range(len(keys)), [stats["collectives_per_s|" + k] for k in keys], color="tab:green", alpha=0.8)
            ax.set_yticks(range(len(keys)))
            ax.set_yticklabels([k.split("|")[0] for k in keys], fontsize=7)
            ax.invert_yaxis()
            ax.set_xscale("log")
            ax.set_xlabel("simulated collectives per second of wall time (2-core CPU machine)")
            ax.grid(alpha=0.3, axis="x")
            fig.tight_layout()
        if fig is not None:
            fig.savefig(os.path.join(out, name + ".png"), dpi=110)
            plt.close(fig)
            made += 1
    print("plots written: %d" % made)


if __name__ == "__main__":
    main()
