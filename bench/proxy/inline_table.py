#!/usr/bin/env python3
"""Table of reccl_proxy_perf runs that differ only in --inline_bytes (bench/gpu.sh proxy-ab, part
"inline"): the median over the runs of each setting's proxy time per collective and size, and its
ratio to the runs without inline puts.

    python3 bench/proxy/inline_table.py DIR [--markdown]     (reads DIR/ab_inline_<bytes>_<run>.json)
"""
import glob
import json
import os
import re
import statistics
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    out, md = sys.argv[1], "--markdown" in sys.argv[2:]
    times = {}  # (collective, bytes) -> {inline_bytes: [us, ...]}
    for f in glob.glob(os.path.join(out, "ab_inline_*_*.json")):
        m = re.search(r"ab_inline_(\d+)_\d+\.json$", f)
        if not m:
            continue
        d = json.load(open(f))
        ib = int(d.get("inline_bytes", m.group(1)))
        for r in d["rows"]:
            times.setdefault((r["collective"], r["bytes"]), {}).setdefault(ib, []).append(r["proxy_us"])
    if not times:
        print(f"no ab_inline_*.json in {out}")
        return
    settings = sorted({ib for v in times.values() for ib in v})
    head = ["collective", "bytes"] + [f"inline<={ib} us" for ib in settings] + [f"{ib}/0" for ib in settings if ib]
    rows = []
    for (c, b), v in sorted(times.items()):
        med = {ib: statistics.median(v[ib]) for ib in settings if ib in v}
        cells = [c, str(b)] + [f"{med[ib]:.1f} ({len(v[ib])})" if ib in med else "-" for ib in settings]
        cells += [f"{med[ib] / med[0]:.2f}" if ib in med and 0 in med and med[0] > 0 else "-" for ib in settings if ib]
        rows.append(cells)
    if md:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for r in rows:
            print("| " + " | ".join(r) + " |")
    else:
        w = [max(len(x) for x in col) for col in zip(head, *rows)]
        for r in [head] + rows:
            print("  ".join(x.rjust(n) for x, n in zip(r, w)))


if __name__ == "__main__":
    main()
