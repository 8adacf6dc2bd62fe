#!/usr/bin/env python3
"""torch.distributed (backend nccl, one process per GPU) all-reduce loop, run twice in one call:
under plain NCCL and with libreccl_nccl.so in LD_PRELOAD. Checks every result (small integers, so
bf16 and fp32 sums are exact) and times each size with CUDA events.

  bench/shim/torch_allreduce.py --shim libreccl_nccl.so --out DIR [--ngpus N] [--iters 50]

Writes DIR/torch_allreduce.json and prints a short table; exits 1 if any result was wrong, a
worker failed, or the shim served no call while preloaded.
"""
import argparse
import ctypes
import datetime
import json
import os
import socket
import subprocess
import sys

SIZES = [1 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20, 256 << 20]  # bytes


def worker(args):
    import torch
    import torch.distributed as dist
    rank, world = args.rank, args.world
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    dist.init_process_group("nccl", rank=rank, world_size=world, init_method=f"tcp://127.0.0.1:{args.port}",
                            device_id=dev)
    results = []
    for dtype in (torch.bfloat16, torch.float32):
        esize = torch.tensor([], dtype=dtype).element_size()
        for nbytes in SIZES:
            n = nbytes // esize
            base = (torch.arange(n, device=dev) % 13).to(dtype)
            x = base + (rank + 1)
            want = base * world + world * (world + 1) // 2
            y = x.clone()
            dist.all_reduce(y)
            torch.cuda.synchronize()
            ok = bool(torch.equal(y, want))
            for _ in range(5):
                dist.all_reduce(y)
            torch.cuda.synchronize()
            start = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
            stop = [torch.cuda.Event(enable_timing=True) for _ in range(args.iters)]
            for i in range(args.iters):
                start[i].record()
                dist.all_reduce(y)
                stop[i].record()
            torch.cuda.synchronize()
            ts = sorted(s.elapsed_time(e) * 1e3 for s, e in zip(start, stop))
            results.append({"dtype": str(dtype).replace("torch.", ""), "bytes": nbytes, "ok": ok,
                            "median_us": ts[len(ts) // 2], "min_us": ts[0]})
    served = None
    try:
        lib = ctypes.CDLL(None)
        f = lib.reccl_nccl_total_served_calls
        f.restype = ctypes.c_ulonglong
        served = int(f())
    except (AttributeError, OSError):
        pass
    dist.destroy_process_group()
    print("RESULT " + json.dumps({"rank": rank, "results": results, "served": served}), flush=True)


def launch(args, mode):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ)
    env["NCCL_NVLS_ENABLE"] = "0"
    env.pop("LD_PRELOAD", None)
    if mode == "reccl":
        env["LD_PRELOAD"] = os.path.abspath(args.shim)
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--rank", str(r), "--world", str(args.ngpus),
                               "--port", str(port), "--iters", str(args.iters)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(args.ngpus)]
    outs = []
    for p in procs:
        try:
            o, e = p.communicate(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            o, e = p.communicate()
        outs.append((p.returncode, o, e))
    ranks = []
    for rc, o, e in outs:
        res = [json.loads(l[7:]) for l in o.splitlines() if l.startswith("RESULT ")]
        ranks.append({"rc": rc, "result": res[0] if res else None,
                      "reccl_log": [l for l in e.splitlines() if l.startswith("reccl:")][:10],
                      "stderr_tail": e[-1500:] if rc != 0 or not res else ""})
    return ranks


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--world", type=int, default=1)
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--shim", default="")
    ap.add_argument("--out", default=".")
    ap.add_argument("--ngpus", type=int, default=0)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--timeout", type=int, default=240)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    if args.ngpus == 0:
        import torch
        args.ngpus = torch.cuda.device_count()
    os.makedirs(args.out, exist_ok=True)
    report = {"meta": {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(), "ngpus": args.ngpus,
                       "commit": os.environ.get("RECCL_COMMIT", "unknown"), "shim": args.shim,
                       "host": os.uname().nodename}}
    for mode in ("nccl", "reccl"):
        report[mode] = launch(args, mode)
    with open(os.path.join(args.out, "torch_allreduce.json"), "w") as f:
        json.dump(report, f, indent=1)

    failed = False
    for mode in ("nccl", "reccl"):
        for r in report[mode]:
            if r["rc"] != 0 or r["result"] is None or not all(x["ok"] for x in r["result"]["results"]):
                failed = True
                print(f"FAILED: {mode} rank rc={r['rc']}\n{r['stderr_tail']}")
    served = [r["result"]["served"] for r in report["reccl"] if r["result"]]
    if not served or any(s is None or s == 0 for s in served):
        failed = True
        print(f"FAILED: the preloaded shim served no call (served per rank: {served})")
    print(f"\ntorch.distributed all_reduce, {args.ngpus} processes (median of {args.iters}, rank 0)")
    print(f"{'dtype':9s} {'bytes':>10s} {'NCCL us':>9s} {'shim us':>9s} {'NCCL/shim':>9s} ok")
    a = report["nccl"][0]["result"]
    b = report["reccl"][0]["result"]
    if a and b:
        for x, y in zip(a["results"], b["results"]):
            print(f"{x['dtype']:9s} {x['bytes']:>10d} {x['median_us']:9.1f} {y['median_us']:9.1f} "
                  f"{x['median_us'] / y['median_us']:9.2f} {x['ok'] and y['ok']}")
    print(f"shim served calls per rank: {served}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
