#!/usr/bin/env python3
"""Draws reccl_adaptive_bench's timeline.csv: the split (stacked shares per VT) and busbw against
the collective index, with the injected phases marked.

    python3 bench/adaptive/plot.py DIR/timeline.csv [--json DIR/adaptive.json] [-o DIR/timeline.png]
"""
import argparse
import csv
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--json", help="adaptive.json of the same run (adds the reference lines)")
    ap.add_argument("-o", "--out", default=None)
    a = ap.parse_args()
    rows = list(csv.DictReader(open(a.csv)))
    if not rows:
        raise SystemExit("empty CSV")
    vts = sum(1 for k in rows[0] if k.startswith("share"))
    x = [int(r["collective"]) for r in rows]
    shares = [[float(r[f"share{v}"]) for r in rows] for v in range(vts)]
    bw = [float(r["busbw_GBps"]) for r in rows]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    ax1.stackplot(x, shares, labels=[f"VT {v}" for v in range(vts)], step="mid")
    ax1.set_ylabel("share of the message")
    ax1.set_ylim(0, 1)
    ax1.legend(loc="upper right", ncol=vts, fontsize=7)
    ax2.plot(x, bw, ".-", label="reccl texcp (this run)")
    title = "reccl adaptive loop"
    if a.json:
        j = json.load(open(a.json))
        ref = j.get("references", {})
        n = j["machine"]["ranks"]
        size = None
        for r in j["timeline"]["all_reduce"]["rows"]:
            if r["us"] > 0:
                size = r["busbw"] * r["us"] * 1e3 / (2.0 * (n - 1) / n)
                break
        def bus(us):
            return size * 2.0 * (n - 1) / n / (us * 1e3) if size and us else None
        for key, label, style in (("best_static_us", "best static split (throttled)", "--"),
                                  ("equal_throttled_us", "equal split (throttled)", ":"),
                                  ("masked_healthy_us", "healthy, VT masked", "-.")):
            v = bus(ref.get(key))
            if v:
                ax2.axhline(v, linestyle=style, color="gray", linewidth=1, label=label)
        title += f" -- {j['machine']['gpu']}, {n} ranks" + (" (loopback on one GPU)" if j["machine"]["loopback"] else "")
    for r, nxt in zip(rows, rows[1:] + [None]):
        f = int(r["fault"])
        if f:
            for ax in (ax1, ax2):
                ax.axvline(int(r["collective"]), color="red", alpha=0.3, linewidth=1)
    ax2.set_ylabel("busbw (GB/s)")
    ax2.set_xlabel("collective")
    ax2.legend(loc="lower right", fontsize=7)
    fig.suptitle(title + "  (red: a VT recovered inside the collective)")
    fig.tight_layout()
    out = a.out or a.csv.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=110)
    print("wrote", out)


if __name__ == "__main__":
    main()
