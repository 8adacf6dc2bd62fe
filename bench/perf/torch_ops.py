"""reccl.torch's cost over the C++ call it wraps, on loopback ranks of one GPU in one process.

  * graph: per rank, one CUDA graph of ITERS in-place bf16 all-reduces (torch.ops.reccl.all_reduce_),
    every rank's graph replayed together and timed with events; the same with the graphs captured
    from C++ (reccl._C._time_graphs_cpp: the same communicators, tensors and method). Median of REPS
    replays, us per call, and the ratio torch / C++.
  * eager host time: microseconds of host time per call while issuing CALLS calls per rank (no
    synchronisation inside the timed loop): the operator (torch.ops), the Python method
    (comm.all_reduce_, with its error translation), the out-of-place operator, and C++.

    python3 bench/perf/torch_ops.py [--ranks 2] [--json out.json]
"""

import argparse
import json
import statistics
import time

import torch

import reccl.torch as rt
from reccl import _C

SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)


def time_torch_graphs(comms, xs, iters, reps):
    streams = [torch.cuda.Stream() for _ in comms]
    graphs = []
    for c, x, s in zip(comms, xs, streams):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            for _ in range(iters):
                torch.ops.reccl.all_reduce_(c.handle, x, "sum")
        graphs.append(g)
    t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    us = []
    for rep in range(reps + 1):
        t0.record(streams[0])
        for s in streams[1:]:
            s.wait_event(t0)
        for g, s in zip(graphs, streams):
            with torch.cuda.stream(s):
                g.replay()
        for s in streams[1:]:
            e = torch.cuda.Event()
            e.record(s)
            streams[0].wait_event(e)
        t1.record(streams[0])
        t1.synchronize()
        if rep > 0:
            us.append(1000.0 * t0.elapsed_time(t1) / iters)
    return us


def host_us(comms, xs, calls, fn):
    streams = [torch.cuda.Stream() for _ in comms]
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        for c, x, s in zip(comms, xs, streams):
            with torch.cuda.stream(s):
                fn(c, x)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    return 1e6 * (t1 - t0) / (calls * len(comms))


def host_us_ops(comms, xs, calls, fn):
    """As host_us, with the stream switches outside the timed calls (one stream per rank set once)."""
    streams = [torch.cuda.Stream() for _ in comms]
    torch.cuda.synchronize()
    total = 0.0
    for c, x, s in zip(comms, xs, streams):
        with torch.cuda.stream(s):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn(c, x)
            total += time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e6 * total / (calls * len(comms))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--pairs", type=int, default=5, help="torch/C++ measurements alternated per size")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--json")
    a = ap.parse_args()

    comms = rt.Communicator.loopback(a.ranks, fused_max_tokens=0)
    rows = []
    for nbytes in SIZES:
        n = nbytes // 2
        xs = [torch.randn(n, device="cuda").to(torch.bfloat16) for _ in comms]
        # correctness once, eagerly: every rank's call goes out before any is waited for
        want = sum(x.float() for x in xs).to(torch.bfloat16)
        outs = []
        streams = [torch.cuda.Stream() for _ in comms]
        for c, x, s in zip(comms, xs, streams):
            with torch.cuda.stream(s):
                outs.append(c.all_reduce(x))
        torch.cuda.synchronize()
        for c in comms:
            c.check()
        for o in outs:
            torch.testing.assert_close(o.float(), want.float(), rtol=1e-2, atol=1e-2)
        t_torch, t_cpp = [], []
        for _ in range(a.pairs):  # alternate, so drift hits both alike
            t_torch += time_torch_graphs(comms, xs, a.iters, a.reps)
            t_cpp += list(_C._time_graphs_cpp([c._c for c in comms], xs, a.iters, a.reps))
        for c in comms:
            c.check()
        row = {"bytes": nbytes, "graph_torch_us": statistics.median(t_torch), "graph_cpp_us": statistics.median(t_cpp)}
        row["graph_ratio"] = row["graph_torch_us"] / row["graph_cpp_us"]
        row["host_op_us"] = host_us_ops(comms, xs, a.calls, lambda c, x: torch.ops.reccl.all_reduce_(c.handle, x, "sum"))
        row["host_method_us"] = host_us_ops(comms, xs, a.calls, lambda c, x: c.all_reduce_(x))
        row["host_out_of_place_us"] = host_us_ops(comms, xs, a.calls, lambda c, x: torch.ops.reccl.all_reduce(c.handle, x, "sum"))
        row["host_cpp_us"] = _C._host_us_cpp([c._c for c in comms], xs, a.calls)
        for c in comms:
            c.check()
        rows.append(row)
    for c in comms:
        c.close()

    print(f"reccl.torch on {a.ranks} loopback ranks, {torch.cuda.get_device_name()}, bf16 in-place all-reduce")
    print(f"{'bytes':>10} {'graph torch us':>15} {'graph C++ us':>13} {'ratio':>7} {'host op':>8} {'host method':>12} {'host out':>9} {'host C++':>9}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['graph_torch_us']:>15.2f} {r['graph_cpp_us']:>13.2f} {r['graph_ratio']:>7.3f} "
              f"{r['host_op_us']:>8.2f} {r['host_method_us']:>12.2f} {r['host_out_of_place_us']:>9.2f} {r['host_cpp_us']:>9.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ranks": a.ranks, "iters": a.iters, "reps": a.reps, "pairs": a.pairs, "calls": a.calls,
                       "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
