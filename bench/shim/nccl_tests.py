#!/usr/bin/env python3
"""NVIDIA's nccl-tests (unmodified, built outside the repository) under plain NCCL and under
libreccl_nccl.so (LD_PRELOAD), in one run, the two tables side by side.

  bench/shim/nccl_tests.py --bin NCCL_TESTS_BUILD_DIR --shim libreccl_nccl.so --out DIR [--part check|perf|all]

check: every collective (all_reduce, reduce_scatter, all_gather, broadcast, alltoall) with -c 1
       for float, half, bfloat16, int32 and, for the reductions, sum, max, min; 8 B to 1 GiB (-f 8).
perf:  float (sum) 8 B to 1 GiB (-f 2), more iterations, for the busbw comparison.
Writes DIR/nccl_tests.json (every row of every run) and DIR/nccl_tests.md; prints a short table.
A run fails when a row has #wrong > 0, the footer reports out-of-bounds values, or the binary exits
non-zero; a run under the shim also fails unless reccl served some of its calls (the shim prints
its served-call counts at exit under RECCL_NCCL_SERVED_AT_EXIT=1, which the script sets): a shim
that forwarded everything to NCCL would otherwise pass. RECCL_NCCL=0 or RECCL_NCCL_COLLS in the
environment narrow what is expected to be served, as they narrow what the shim serves. Any failed
run makes the script exit 1.

Its logic is tested without a GPU by bench/shim/nccl_tests_test.py.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

COLLS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "alltoall"]
REDUCTIONS = {"all_reduce", "reduce_scatter"}
DTYPES = ["float", "half", "bfloat16", "int32"]
OPS = ["sum", "max", "min"]
# nccl-tests' names -> the shim's (reccl::name(collective))
SHIM_NAMES = {"all_reduce": "all_reduce", "reduce_scatter": "reduce_scatter", "all_gather": "all_gather",
              "broadcast": "broadcast", "alltoall": "all_to_all"}
SERVED_LINE = "reccl: served at exit:"


def parse(text):
    rows, oob, avg = [], None, None
    for line in text.splitlines():
        s = line.strip()
        if s.startswith("# Out of bounds values"):
            oob = int(s.split(":")[1].split()[0])
        elif s.startswith("# Avg bus bandwidth"):
            avg = float(s.split(":")[1].split()[0])
        elif s and s[0].isdigit():
            t = s.split()
            if len(t) < 13:
                continue

            def num(x):
                try:
                    return float(x)
                except ValueError:
                    return None

            rows.append({
                "bytes": int(t[0]), "count": int(t[1]), "type": t[2], "redop": t[3], "root": int(t[4]),
                "oop": {"time_us": num(t[5]), "algbw": num(t[6]), "busbw": num(t[7]), "wrong": num(t[8])},
                "ip": {"time_us": num(t[9]), "algbw": num(t[10]), "busbw": num(t[11]), "wrong": num(t[12])},
            })
    return rows, oob, avg


def parse_served(stderr):
    """The shim's RECCL_NCCL_SERVED_AT_EXIT line as {collective: calls}, or None if there is none."""
    for line in reversed(stderr.splitlines()):
        if line.startswith(SERVED_LINE):
            served = {}
            for t in line[len(SERVED_LINE):].split():
                k, _, v = t.partition("=")
                served[k] = int(v)
            return served
    return None


def expected_served(env):
    """The shim's collectives (its names) that a run under it must serve, given its environment."""
    if env.get("RECCL_NCCL", "") == "0":
        return set()
    colls = env.get("RECCL_NCCL_COLLS", "")
    if not colls:
        return set(SHIM_NAMES.values())
    return {c.strip() for c in colls.split(",")} & set(SHIM_NAMES.values())


def judge(coll, mode, rc, stdout, stderr, env):
    """The verdict on one nccl-tests run: its rows, counts and the reasons it failed (none: ok)."""
    rows, oob, avg = parse(stdout)
    wrong = sum(int(r[k]["wrong"] or 0) for r in rows for k in ("oop", "ip")
                if not (coll == "alltoall" and k == "ip"))  # nccl-tests does not check in-place all-to-all
    problems = []
    if rc != 0:
        problems.append(f"exit status {rc}")
    if not rows:
        problems.append("no result rows")
    if wrong:
        problems.append(f"{wrong} wrong elements")
    if oob:
        problems.append(f"{oob} out-of-bounds values")
    served = parse_served(stderr) if mode == "reccl" else None
    if mode == "reccl" and SHIM_NAMES[coll] in expected_served(env):
        if served is None:
            problems.append(f"no '{SERVED_LINE}' line: the shim was not loaded or the program did not exit normally")
        elif served.get(SHIM_NAMES[coll], 0) == 0:
            problems.append(f"reccl served no {SHIM_NAMES[coll]} call: NCCL ran them all")
    return {"rows": rows, "out_of_bounds": oob, "avg_busbw": avg, "wrong": wrong, "served": served,
            "problems": problems, "ok": not problems}


def run(args, coll, dtype, op, mode, flags):
    exe = os.path.join(args.bin, f"{coll}_perf")
    cmd = [exe, "-g", str(args.ngpus), "-d", dtype, "-o", op] + flags
    env = dict(os.environ)
    env["NCCL_NVLS_ENABLE"] = "0"
    if mode == "reccl":
        env["LD_PRELOAD"] = os.path.abspath(args.shim)
        env["RECCL_NCCL_SERVED_AT_EXIT"] = "1"
    else:
        env.pop("LD_PRELOAD", None)
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    v = judge(coll, mode, p.returncode, p.stdout, p.stderr, env)
    log = [l for l in p.stderr.splitlines() if l.startswith("reccl:")]
    return {"coll": coll, "dtype": dtype, "op": op, "mode": mode, "cmd": " ".join(cmd), "rc": p.returncode,
            "ok": v["ok"], "problems": v["problems"], "wrong": v["wrong"], "out_of_bounds": v["out_of_bounds"],
            "avg_busbw": v["avg_busbw"], "served": v["served"], "rows": v["rows"],
            "reccl_log": log[:20], "stderr_tail": p.stderr[-2000:] if not v["ok"] else ""}


def served_text(r):
    return "" if r["served"] is None else f" served={r['served'].get(SHIM_NAMES[r['coll']], 0)}"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="nccl-tests build directory (the *_perf binaries)")
    ap.add_argument("--shim", required=True, help="path of libreccl_nccl.so")
    ap.add_argument("--out", required=True)
    ap.add_argument("--ngpus", type=int, default=0, help="GPUs (default: all visible)")
    ap.add_argument("--part", choices=["check", "perf", "all"], default="all")
    ap.add_argument("--max", default="1G", help="largest size (-e)")
    ap.add_argument("--timeout", type=int, default=300)
    args = ap.parse_args()
    if args.ngpus == 0:
        out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout
        args.ngpus = max(1, len([l for l in out.splitlines() if l.startswith("GPU")]))
    os.makedirs(args.out, exist_ok=True)

    runs = []
    if args.part in ("check", "all"):
        for coll in COLLS:
            for dtype in DTYPES:
                for op in (OPS if coll in REDUCTIONS else ["sum"]):
                    for mode in ("nccl", "reccl"):
                        r = run(args, coll, dtype, op, mode, ["-b", "8", "-e", args.max, "-f", "8", "-c", "1", "-w", "2", "-n", "3"])
                        r["part"] = "check"
                        runs.append(r)
                        print(f"check {coll:15s} {dtype:9s} {op:4s} {mode:6s} {'ok' if r['ok'] else 'FAILED'}"
                              f" rows={len(r['rows'])} wrong={r['wrong']}{served_text(r)}", flush=True)
    if args.part in ("perf", "all"):
        for coll in COLLS:
            for mode in ("nccl", "reccl"):
                r = run(args, coll, "float", "sum", mode, ["-b", "8", "-e", args.max, "-f", "2", "-c", "1", "-w", "5", "-n", "20"])
                r["part"] = "perf"
                runs.append(r)
                print(f"perf  {coll:15s} {mode:6s} {'ok' if r['ok'] else 'FAILED'} avg busbw {r['avg_busbw']}"
                      f"{served_text(r)}", flush=True)

    meta = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "ngpus": args.ngpus,
            "commit": os.environ.get("RECCL_COMMIT", "unknown"), "nccl_tests_bin": args.bin, "shim": args.shim,
            "host": os.uname().nodename}
    with open(os.path.join(args.out, "nccl_tests.json"), "w") as f:
        json.dump({"meta": meta, "runs": runs}, f, indent=1)

    # markdown: per collective, NCCL's and the shim's out-of-place busbw side by side (perf part),
    # and every check run's verdict
    md = [f"# nccl-tests under NCCL and under libreccl_nccl.so ({args.ngpus} GPUs, {meta['date'][:10]}, commit {meta['commit']})", ""]
    by = {(r["part"], r["coll"], r["dtype"], r["op"], r["mode"]): r for r in runs}
    for coll in COLLS:
        a, b = by.get(("perf", coll, "float", "sum", "nccl")), by.get(("perf", coll, "float", "sum", "reccl"))
        if not a or not b:
            continue
        md += [f"## {coll} (float, sum): out-of-place busbw, GB/s", "",
               "| size | NCCL | shim | shim/NCCL | NCCL in-place | shim in-place |", "|---|---|---|---|---|---|"]
        brow = {r["bytes"]: r for r in b["rows"]}
        for ra in a["rows"]:
            rb = brow.get(ra["bytes"])
            if not rb:
                continue
            x, y = ra["oop"]["busbw"], rb["oop"]["busbw"]
            ratio = f"{y / x:.2f}" if x and y else "-"
            md.append(f"| {ra['bytes']} | {x} | {y} | {ratio} | {ra['ip']['busbw']} | {rb['ip']['busbw']} |")
        md.append("")
    md += ["## correctness (-c 1): wrong elements per run", "", "| collective | dtype | op | NCCL | shim |", "|---|---|---|---|---|"]
    for coll in COLLS:
        for dtype in DTYPES:
            for op in (OPS if coll in REDUCTIONS else ["sum"]):
                a, b = by.get(("check", coll, dtype, op, "nccl")), by.get(("check", coll, dtype, op, "reccl"))
                if a and b:
                    f = lambda r: ("ok" if r["ok"] else "FAILED") + f" ({r['wrong']})"
                    md.append(f"| {coll} | {dtype} | {op} | {f(a)} | {f(b)} |")
    with open(os.path.join(args.out, "nccl_tests.md"), "w") as f:
        f.write("\n".join(md) + "\n")

    failed = [r for r in runs if not r["ok"]]
    print(f"\nnccl-tests: {len(runs)} runs, {len(failed)} failed")
    for r in failed:
        print(f"  FAILED {r['part']} {r['coll']} {r['dtype']} {r['op']} {r['mode']}: {'; '.join(r['problems'])}")
        print("   ", r["stderr_tail"][-400:].replace("\n", "\n    "))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
