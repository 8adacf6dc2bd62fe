"""reccl.torch's cost over the C++ call it wraps, on loopback ranks of one GPU in one process.

  * graph: per rank, one CUDA graph of ITERS in-place bf16 all-reduces captured through torch
    (torch.ops.reccl.all_reduce_ under torch.cuda.graph), and one captured from C++ (the same
    communicators, tensors and method). Both sets are replayed by the same loop
    (bench/perf/graph_timing.hpp: every rank's graph launched together, timed with events), in
    PAIRS interleaved batches of REPS replays; median us per call, and the ratio torch / C++: the
    operator's cost inside a graph. Also timed: the torch graphs replayed with CUDAGraph.replay()
    (each rank's replay entered in turn from Python), whose per-replay host time delays the later
    ranks' start -- a cost of driving loopback ranks from one thread, not of the operator.
  * eager host time: microseconds of host time per call while issuing CALLS calls per rank, the
    ranks taking turns of CHUNK calls each on their own streams (the clock runs only inside a turn;
    no synchronisation inside it): the operator (torch.ops), the Python method (comm.all_reduce_,
    with its error translation), the out-of-place operator and method, the C++ call (same turns),
    and the launch of an empty kernel (the floor under all of them).
  * adaptive lane (--adaptive, default on): the same graphs on a communicator with
    allocator="texcp", telemetry="stalls" against the default one (torch ops both, interleaved), at
    sizes above the one-shot limit; and the false faults: adaptive collectives that recovered a VT
    although nothing was injected (comm.recovered()), and the faulted VTs in the reports held.

    python3 bench/perf/torch_ops.py [--ranks 2] [--json out.json] [--no-adaptive]
"""

import argparse
import json
import statistics
import time

import torch

import reccl.torch as rt
from reccl import _C

SIZES = (4 << 10, 64 << 10, 1 << 20, 16 << 20)
ADAPTIVE_SIZES = (4 << 20, 16 << 20)


class TorchGraphs:
    """Per rank, one CUDA graph of ITERS torch.ops.reccl.all_reduce_ calls on its own stream;
    time(reps) replays every rank's graph together reps + 1 times (the first is not counted)."""

    def __init__(self, comms, xs, iters):
        self.iters = iters
        self.streams = [torch.cuda.Stream() for _ in comms]
        self.graphs = []
        for c, x, s in zip(comms, xs, self.streams):
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=s):
                for _ in range(iters):
                    torch.ops.reccl.all_reduce_(c.handle, x, "sum")
            self.graphs.append(g)

    def execs(self):
        return [g.raw_cuda_graph_exec() for g in self.graphs]

    def time(self, reps):
        t0, t1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        done = [torch.cuda.Event() for _ in self.streams]
        us = []
        for rep in range(reps + 1):
            t0.record(self.streams[0])
            for s in self.streams[1:]:
                s.wait_event(t0)
            for g, s in zip(self.graphs, self.streams):
                with torch.cuda.stream(s):
                    g.replay()
            for e, s in zip(done[1:], self.streams[1:]):
                e.record(s)
                self.streams[0].wait_event(e)
            t1.record(self.streams[0])
            t1.synchronize()
            if rep > 0:
                us.append(1000.0 * t0.elapsed_time(t1) / self.iters)
        return us


def host_us_ops(comms, xs, calls, chunk, fn):
    """Host microseconds per call of `fn`: the ranks take turns issuing `chunk` calls each on their
    own streams (entered outside the clock), `calls` per rank in all; no synchronisation inside a
    turn. Turns keep each rank at most `chunk` calls ahead of the others, as the C++ loop does."""
    streams = [torch.cuda.Stream() for _ in comms]
    torch.cuda.synchronize()
    total = 0.0
    for start in range(0, calls, chunk):
        k = min(chunk, calls - start)
        for c, x, s in zip(comms, xs, streams):
            with torch.cuda.stream(s):
                t0 = time.perf_counter()
                for _ in range(k):
                    fn(c, x)
                total += time.perf_counter() - t0
    torch.cuda.synchronize()
    return 1e6 * total / (calls * len(comms))


def interleaved(a, sets):
    """Median us per call of each graph set, timed in a.pairs interleaved batches (each first in turn)."""
    times = [[] for _ in sets]
    for p in range(a.pairs):
        order = range(len(sets)) if p % 2 == 0 else reversed(range(len(sets)))
        for i in order:
            times[i] += list(sets[i].time(a.reps))
    return [statistics.median(t) for t in times]


def adaptive_rows(a):
    """The adaptive lane (texcp, stalls) against the fast path, and its false faults."""
    plain = rt.Communicator.loopback(a.ranks, fused_max_tokens=0)
    ad = rt.Communicator.loopback(a.ranks, fused_max_tokens=0, allocator="texcp", telemetry="stalls")
    rows = []
    for nbytes in ADAPTIVE_SIZES:
        n = nbytes // 2
        xs = [torch.randn(n, device="cuda").to(torch.bfloat16) for _ in plain]
        want = sum(x.float() for x in xs)
        outs, streams = [], [torch.cuda.Stream() for _ in ad]
        for c, x, s in zip(ad, xs, streams):
            with torch.cuda.stream(s):
                outs.append(c.all_reduce(x))
        torch.cuda.synchronize()
        for o in outs:
            torch.testing.assert_close(o.float(), want, rtol=1e-2, atol=5e-2)
        iters = max(10, a.iters * (1 << 20) // nbytes)
        tp, ta = TorchGraphs(plain, xs, iters), TorchGraphs(ad, xs, iters)
        t_plain, t_ad = interleaved(a, [_C._CppGraphs.adopt(tp.execs(), iters), _C._CppGraphs.adopt(ta.execs(), iters)])
        del tp, ta
        for c in plain + ad:
            c.check()
        rows.append({"bytes": nbytes, "fast_path_us": t_plain, "adaptive_us": t_ad, "ratio": t_ad / t_plain, "iters": iters})
    torch.cuda.synchronize()
    epochs = int(ad[0]._c.adaptive_epoch())
    held = ad[0].reports(since=max(0, epochs - 256))
    summary = {"collectives": epochs, "recovered": ad[0].recovered(), "reports_held": len(held),
               "reports_with_faulted_vts": sum(1 for r in held if r["faulted"]),
               "last_share": held[-1]["share"] if held else []}
    for c in plain + ad:
        c.close()
    return rows, summary


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--iters", type=int, default=100)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--pairs", type=int, default=10, help="torch/C++ measurements interleaved per size")
    ap.add_argument("--calls", type=int, default=400)
    ap.add_argument("--chunk", type=int, default=8, help="calls per rank per turn in the host-time loops")
    ap.add_argument("--json")
    ap.add_argument("--no-adaptive", dest="adaptive", action="store_false")
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
        tg, cg = TorchGraphs(comms, xs, a.iters), _C._CppGraphs([c._c for c in comms], xs, a.iters)
        tx = _C._CppGraphs.adopt(tg.execs(), a.iters)  # torch's graphs, replayed by the C++ graphs' loop
        # each first in turn: drift and warm-up hit all alike
        t_torch, t_cpp, t_replay = interleaved(a, [tx, cg, tg])
        del tx, tg, cg
        for c in comms:
            c.check()
        row = {"bytes": nbytes, "graph_torch_us": t_torch, "graph_cpp_us": t_cpp, "graph_torch_replay_us": t_replay}
        row["graph_ratio"] = row["graph_torch_us"] / row["graph_cpp_us"]
        ops = {"host_op_us": lambda c, x: torch.ops.reccl.all_reduce_(c.handle, x, "sum"),
               "host_method_us": lambda c, x: c.all_reduce_(x),
               "host_pybind_us": lambda c, x: c._c.all_reduce_(x, "sum"),
               "host_out_of_place_us": lambda c, x: torch.ops.reccl.all_reduce(c.handle, x, "sum"),
               "host_method_out_us": lambda c, x: c.all_reduce(x)}
        for key, fn in ops.items():
            row[key] = host_us_ops(comms, xs, a.calls, a.chunk, fn)
        row["host_cpp_us"] = _C._host_us_cpp([c._c for c in comms], xs, a.calls, a.chunk)
        row["host_empty_launch_us"] = _C._empty_launch_us(comms[0].device.index, a.calls)
        for c in comms:
            c.check()
        rows.append(row)
    for c in comms:
        c.close()
    ad_rows, ad_summary = adaptive_rows(a) if a.adaptive else ([], {})

    print(f"reccl.torch on {a.ranks} loopback ranks, {torch.cuda.get_device_name()}, bf16 in-place all-reduce")
    print("host us per call: op = torch.ops.reccl.all_reduce_, method = comm.all_reduce_ (eager fast path),")
    print("binding = the extension's method called straight (no Python method), op out / method out = the out-of-place")
    print("all_reduce, C++ = comm->all_reduce from C++, empty = an empty kernel's launch")
    print("graph torch / C++: torch- and C++-captured graphs replayed by one loop; torch replay(): the torch graphs "
          "replayed with CUDAGraph.replay()")
    print(f"{'bytes':>10} {'graph torch us':>15} {'graph C++ us':>13} {'ratio':>7} {'torch replay()':>15} {'op':>6} {'method':>7} "
          f"{'binding':>8} {'op out':>7} {'method out':>11} {'C++':>6} {'empty':>6}")
    for r in rows:
        print(f"{r['bytes']:>10} {r['graph_torch_us']:>15.2f} {r['graph_cpp_us']:>13.2f} {r['graph_ratio']:>7.3f} "
              f"{r['graph_torch_replay_us']:>15.2f} "
              f"{r['host_op_us']:>6.2f} {r['host_method_us']:>7.2f} {r['host_pybind_us']:>8.2f} {r['host_out_of_place_us']:>7.2f} {r['host_method_out_us']:>11.2f} "
              f"{r['host_cpp_us']:>6.2f} {r['host_empty_launch_us']:>6.2f}")
    if ad_rows:
        print("adaptive lane (allocator texcp, telemetry stalls) against the fast path, graphs of torch ops, us per call:")
        print(f"{'bytes':>10} {'fast path':>10} {'adaptive':>9} {'ratio':>7}")
        for r in ad_rows:
            print(f"{r['bytes']:>10} {r['fast_path_us']:>10.2f} {r['adaptive_us']:>9.2f} {r['ratio']:>7.3f}")
        print(f"false faults: {ad_summary['recovered']} of {ad_summary['collectives']} adaptive collectives recovered a VT "
              f"(nothing injected); {ad_summary['reports_with_faulted_vts']} of the {ad_summary['reports_held']} reports held "
              f"name a faulted VT")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"ranks": a.ranks, "iters": a.iters, "reps": a.reps, "pairs": a.pairs, "calls": a.calls, "chunk": a.chunk,
                       "device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows,
                       "adaptive_rows": ad_rows, "adaptive_summary": ad_summary}, f, indent=1)


if __name__ == "__main__":
    main()
