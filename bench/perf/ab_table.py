#!/usr/bin/env python3
"""Ratio of medians new / old per configuration, from reccl_loopback_perf's JSON files in a folder
(ab_old_*.json, ab_new_*.json: every replay of every run pooled per configuration).
Also writes ab_summary.json there."""
import glob
import json
import os
import statistics
import sys

out = sys.argv[1]
pools = {}
for label in ("old", "new"):
    for f in sorted(glob.glob(os.path.join(out, f"ab_{label}_*.json"))):
        d = json.load(open(f))
        for r in d["results"]:
            key = (r["collective"], r["bytes"], r["registered"], r.get("ctas", 0))
            pools.setdefault(key, {"old": [], "new": []})[label].extend(r["us"])
rows, worst = [], 0.0
print(f"{'collective':15} {'bytes':>10} {'reg':>4} {'old us':>9} {'new us':>9} {'new/old':>8} {'n':>5}")
for (coll, b, reg, ctas), p in sorted(pools.items()):
    if not p["old"] or not p["new"]:
        continue
    mo, mn = statistics.median(p["old"]), statistics.median(p["new"])
    ratio = mn / mo
    worst = max(worst, ratio)
    flag = "  > 1.03" if ratio > 1.03 else ""
    print(f"{coll:15} {b:>10} {'yes' if reg else 'no':>4} {mo:9.2f} {mn:9.2f} {ratio:8.3f} {min(len(p['old']), len(p['new'])):>5}{flag}")
    rows.append({"collective": coll, "bytes": b, "registered": reg, "ctas": ctas, "old_median_us": mo, "new_median_us": mn, "ratio": ratio,
                 "samples_old": len(p["old"]), "samples_new": len(p["new"])})
print(f"worst new/old: {worst:.3f}")
json.dump({"rows": rows, "worst_ratio": worst}, open(os.path.join(out, "ab_summary.json"), "w"), indent=1)
