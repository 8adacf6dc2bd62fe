"""reccl.torch on one GPU: 2 and 3 processes sharing it over a gloo group (P2P transport, CUDA IPC
windows), each checking its own results against torch reference math on random data.

Runs with pytest, or as ``python3 python/tests/test_torch.py`` where pytest is missing. Needs a
CUDA GPU and reccl installed (``pip install --no-build-isolation .``); skips otherwise. Processes
that share one GPU take turns on it: these tests show correctness, not speed.
"""

import os
import socket
import sys
import time
import traceback
import zlib

try:
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
except ImportError:  # pragma: no cover
    torch = None

try:
    import pytest
except ImportError:  # pragma: no cover
    pytest = None

WORLDS = tuple(int(w) for w in os.environ.get("RECCL_TEST_WORLDS", "2,3").split(","))  # processes sharing GPU 0
TIMEOUT_S = 20.0  # GPU-side waits; processes sharing a GPU wait for each other's time slices
DTYPES = ("float32", "bfloat16", "float16", "int32")
OPS = ("sum", "prod", "min", "max", "avg")
SIZES = (0, 1, 7, 1001, 65536 + 3, 1 << 20)  # per-rank elements (per slice for reduce_scatter, all_to_all)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gpu_ready():
    if torch is None or not torch.cuda.is_available():
        return "no CUDA GPU"
    try:
        import reccl.torch  # noqa: F401
    except Exception as e:  # noqa: BLE001
        return f"reccl.torch not importable: {e}"
    return None


# ---- inputs and reference math ------------------------------------------------------------------

def _input(case, rank, shape, dtype, op="sum"):
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{rank}".encode()))  # the same in every process
    dt = getattr(torch, dtype)
    if dtype == "int32":
        lo, hi = (-3, 4) if op == "prod" else (-1000, 1001)
        return torch.randint(lo, hi, shape, generator=g, dtype=torch.int32)
    x = torch.rand(shape, generator=g, dtype=torch.float32) * 2 - 1
    if op == "prod":
        x = 0.5 + x.abs()  # products of a few values near 1 stay in range
    return x.to(dt)


def _reduce(xs, op, dtype):
    """Rank order, fp32 accumulation for floats, one rounding (reccl's fast-path arithmetic)."""
    if dtype == "int32":
        acc = xs[0].to(torch.int64)
        for x in xs[1:]:
            x = x.to(torch.int64)
            acc = {"sum": acc + x, "avg": acc + x, "prod": acc * x, "min": torch.minimum(acc, x), "max": torch.maximum(acc, x)}[op]
        if op == "avg":
            acc = torch.div(acc, len(xs), rounding_mode="trunc")
        return acc.to(torch.int32)
    acc = xs[0].float()
    for x in xs[1:]:
        x = x.float()
        acc = {"sum": acc + x, "avg": acc + x, "prod": acc * x, "min": torch.minimum(acc, x), "max": torch.maximum(acc, x)}[op]
    if op == "avg":
        acc = acc / len(xs)
    return acc.to(getattr(torch, dtype))


def _close(got, want, dtype, what):
    got = got.cpu()
    if dtype == "int32" or got.numel() == 0:
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[:5].flatten().tolist()
            raise AssertionError(f"{what}: differs at {bad}")
        return
    tol = {"float32": (1e-5, 1e-6), "bfloat16": (1e-2, 1e-2), "float16": (2e-3, 1e-3)}[dtype]
    torch.testing.assert_close(got.float(), want.float(), rtol=tol[0], atol=tol[1], msg=lambda m: f"{what}: {m}")


def _poison(shape, dtype, device):
    """Leaves a block of this size full of poison in the caching allocator, so the operator's output
    (same size, same stream) most likely lands on it: an element the operator does not write shows."""
    t = torch.empty(shape, dtype=getattr(torch, dtype), device=device)
    if t.numel():
        t.view(torch.uint8 if t.element_size() == 1 else {2: torch.int16, 4: torch.int32}[t.element_size()]).fill_(-17)
    del t


# ---- scenarios (run in each process) ------------------------------------------------------------

def _collectives(comm, rank, world):
    import reccl.torch as rt  # noqa: F401

    dev = comm.device
    checks = 0
    for dtype in DTYPES:
        for n in SIZES:
            ops = OPS if n in (7, 65536 + 3) else ("sum",)
            for op in ops:
                if dtype != "int32" and op == "prod" and n > 10000:
                    continue
                case = f"ar/{dtype}/{n}/{op}"
                xs = [_input(case, r, (n,), dtype, op) for r in range(world)]
                want = _reduce(xs, op, dtype)
                _poison((n,), dtype, dev)
                _close(comm.all_reduce(xs[rank].to(dev), op), want, dtype, case)
                y = xs[rank].to(dev)
                comm.all_reduce_(y, op)
                _close(y, want, dtype, case + "/inplace")
                case = f"rs/{dtype}/{n}/{op}"
                xs = [_input(case, r, (world * n,), dtype, op) for r in range(world)]
                want = _reduce([x[rank * n:(rank + 1) * n] for x in xs], op, dtype)
                _poison((n,), dtype, dev)
                _close(comm.reduce_scatter(xs[rank].to(dev), op), want, dtype, case)
                checks += 3
            case = f"ag/{dtype}/{n}"
            xs = [_input(case, r, (n,), dtype) for r in range(world)]
            _poison((world * n,), dtype, dev)
            _close(comm.all_gather(xs[rank].to(dev)), torch.cat(xs), dtype, case)
            case = f"a2a/{dtype}/{n}"
            xs = [_input(case, r, (world * n,), dtype) for r in range(world)]
            want = torch.cat([xs[p][rank * n:(rank + 1) * n] for p in range(world)])
            _poison((world * n,), dtype, dev)
            _close(comm.all_to_all(xs[rank].to(dev)), want, dtype, case)
            for root in range(world):
                case = f"bc/{dtype}/{n}/{root}"
                xs = [_input(case, r, (n,), dtype) for r in range(world)]
                _poison((n,), dtype, dev)
                _close(comm.broadcast(xs[rank].to(dev), root), xs[root], dtype, case)
                y = xs[rank].to(dev)
                comm.broadcast_(y, root)
                _close(y, xs[root], dtype, case + "/inplace")
            checks += 2 + 2 * world
    # shapes: the first dimension is what reduce_scatter, all_gather and all_to_all split and join
    x = _input("shape", rank, (world * 3, 5, 2), "float32").to(dev)
    assert comm.reduce_scatter(x).shape == (3, 5, 2)
    assert comm.all_gather(x).shape == (world * world * 3, 5, 2)
    assert comm.all_to_all(x).shape == x.shape
    # one-byte tensors move as pairs
    b = torch.arange(8, dtype=torch.uint8, device=dev) + rank
    assert torch.equal(comm.all_gather(b).cpu(), torch.cat([torch.arange(8, dtype=torch.uint8) + r for r in range(world)]))
    comm.synchronize()
    return checks


def _fused_reference(xs, residual, weight, eps):
    y = _reduce(xs, "sum", "bfloat16")
    r = (y.float() + residual.float()).to(torch.bfloat16)
    rf = r.float()
    rstd = torch.rsqrt(rf.pow(2).mean(dim=-1, keepdim=True) + eps)
    return (rf * rstd * weight.float()).to(torch.bfloat16), r


def _fused(comm, rank, world):
    dev = comm.device
    for tokens, hidden in ((1, 4096), (8, 8192), (32, 4096), (129, 1024), (512, 8192)):
        case = f"fused/{tokens}/{hidden}"
        xs = [_input(case, r, (tokens, hidden), "bfloat16") for r in range(world)]
        residual = _input(case + "/res", 0, (tokens, hidden), "bfloat16")
        weight = _input(case + "/w", 0, (hidden,), "bfloat16")
        out, res = comm.fused_add_rms_norm_all_reduce(xs[rank].to(dev), residual.to(dev), weight.to(dev), 1e-6)
        want_out, want_res = _fused_reference(xs, residual, weight, 1e-6)
        _close(res, want_res, "bfloat16", case + "/residual")
        _close(out, want_out, "bfloat16", case + "/out")
    comm.synchronize()
    return 5


def _graphs(comm, rank, world):
    """Capture a few calls once, replay with new inputs copied into the static ones."""
    dev = comm.device
    n, tokens, hidden = 4099, 8, 4096
    sx = torch.empty(n, dtype=torch.bfloat16, device=dev)
    sy = torch.empty(world * n, dtype=torch.float32, device=dev)
    fx = torch.empty(tokens, hidden, dtype=torch.bfloat16, device=dev)
    fr = torch.empty(tokens, hidden, dtype=torch.bfloat16, device=dev)
    fw = torch.empty(hidden, dtype=torch.bfloat16, device=dev)
    sym = comm.empty((n,), torch.float32)
    assert comm.is_symmetric(sym)
    stream = torch.cuda.Stream(device=dev)

    def step():
        a = comm.all_reduce(sx)
        b = comm.reduce_scatter(sy, "max")
        c = comm.all_gather(sx)
        comm.all_reduce_(sym)
        o, r = comm.fused_add_rms_norm_all_reduce(fx, fr, fw, 1e-5)
        return a, b, c, o, r

    with torch.cuda.stream(stream):
        step()  # warm-up, eager
    torch.cuda.current_stream(dev).wait_stream(stream)
    comm.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        outs = step()
    for it in range(4):
        case = f"graph/{it}"
        xs = [_input(case, r, (n,), "bfloat16") for r in range(world)]
        ys = [_input(case + "/y", r, (world * n,), "float32") for r in range(world)]
        ss = [_input(case + "/s", r, (n,), "float32") for r in range(world)]
        fxs = [_input(case + "/f", r, (tokens, hidden), "bfloat16") for r in range(world)]
        res = _input(case + "/fr", 0, (tokens, hidden), "bfloat16")
        w = _input(case + "/fw", 0, (hidden,), "bfloat16")
        sx.copy_(xs[rank])
        sy.copy_(ys[rank])
        sym.copy_(ss[rank])
        fx.copy_(fxs[rank])
        fr.copy_(res)
        fw.copy_(w)
        torch.cuda.synchronize(dev)
        dist.barrier()  # every rank's inputs are in place before any rank's replay reads a peer's
        g.replay()
        comm.synchronize()
        a, b, c, o, r = outs
        _close(a, _reduce(xs, "sum", "bfloat16"), "bfloat16", case + "/all_reduce")
        _close(b, _reduce([y[rank * n:(rank + 1) * n] for y in ys], "max", "float32"), "float32", case + "/reduce_scatter")
        _close(c, torch.cat(xs), "bfloat16", case + "/all_gather")
        _close(sym, _reduce(ss, "sum", "float32"), "float32", case + "/symmetric in place")
        want_o, want_r = _fused_reference(fxs, res, w, 1e-5)
        _close(r, want_r, "bfloat16", case + "/fused residual")
        _close(o, want_o, "bfloat16", case + "/fused out")
        dist.barrier()  # no rank's next inputs overwrite what a peer may still read
    del g
    comm.free(sym)
    return 24


def _compiled(comm, rank, world):
    dev = comm.device
    hidden = 4096

    @torch.compile(fullgraph=True)
    def layer(x, residual, weight):
        y = comm.all_reduce(x * 2.0)
        z = comm.all_gather(y[:8])
        out, res = comm.fused_add_rms_norm_all_reduce(x, residual, weight, 1e-6)
        return y + 1.0, z, out, res

    for it in range(2):
        case = f"compile/{it}"
        xs = [_input(case, r, (16, hidden), "bfloat16") for r in range(world)]
        res = _input(case + "/r", 0, (16, hidden), "bfloat16")
        w = _input(case + "/w", 0, (hidden,), "bfloat16")
        y, z, out, r = layer(xs[rank].to(dev), res.to(dev), w.to(dev))
        comm.synchronize()
        want_y = _reduce([(x.float() * 2.0).to(torch.bfloat16) for x in xs], "sum", "bfloat16")
        _close(y, (want_y.float() + 1.0).to(torch.bfloat16), "bfloat16", case + "/y")
        _close(z, torch.cat([want_y[:8]] * world), "bfloat16", case + "/z")
        want_o, want_r = _fused_reference(xs, res, w, 1e-6)
        _close(r, want_r, "bfloat16", case + "/residual")
        _close(out, want_o, "bfloat16", case + "/out")
    return 8


def _bad_input(comm, rank, world):
    import reccl
    import reccl.torch as rt

    dev = comm.device
    x = torch.ones(64, device=dev)

    def refused(fn, status, what):
        try:
            fn()
        except reccl.Error as e:
            assert e.status == status, f"{what}: status {e.status}, wanted {status}: {e}"
            return
        raise AssertionError(f"{what}: no reccl.Error")

    refused(lambda: comm.all_reduce(torch.ones(64)), "invalid_argument", "CPU tensor")
    refused(lambda: comm.all_reduce(torch.ones(8, 8, device=dev).t()), "invalid_argument", "non-contiguous")
    refused(lambda: comm.all_reduce(x, "xor"), "invalid_argument", "bad op")
    refused(lambda: comm.all_reduce(torch.ones(4, dtype=torch.float64, device=dev)), "invalid_argument", "float64 reduction")
    refused(lambda: comm.reduce_scatter(torch.ones(world * 3 + 1, device=dev)), "invalid_argument", "reduce_scatter split")
    refused(lambda: comm.broadcast(x, world), "invalid_argument", "broadcast root")
    refused(lambda: comm.fused_add_rms_norm_all_reduce(x.view(8, 8), x.view(8, 8), x[:8], 1e-6), "invalid_argument", "fused fp32")
    try:
        torch.ops.reccl.all_reduce(12345, x, "sum")
        raise AssertionError("dead handle accepted")
    except RuntimeError as e:
        assert "not a live communicator" in str(e), str(e)
    # the communicator still works after refusals that every rank made alike
    y = comm.all_reduce(torch.full((5,), float(rank + 1), device=dev))
    comm.synchronize()
    assert torch.equal(y.cpu(), torch.full((5,), float(world * (world + 1) // 2)))

    # shapes that differ across ranks: every rank's call fails on the GPU, naming a rank
    t0 = time.monotonic()
    comm.all_reduce(torch.ones(100 + rank, device=dev))
    try:
        comm.synchronize()
        raise AssertionError("mismatched counts not detected")
    except reccl.Error as e:
        assert e.status == "mismatch", str(e)
        assert 0 <= e.rank < world and e.rank != rank and f"rank {e.rank}'s call differs" in str(e), str(e)
    took = time.monotonic() - t0
    assert took < TIMEOUT_S, f"mismatch took {took:.1f} s"
    comm.close()
    # a new communicator over the same group works
    again = rt.Communicator(timeout=TIMEOUT_S, fused_max_tokens=0)
    z = again.all_reduce(torch.full((3,), 1.0, device=dev))
    again.synchronize()
    assert torch.equal(z.cpu(), torch.full((3,), float(world)))
    again.close()
    return 10


def _missing_rank(comm, rank, world):
    """Rank 0 never calls; the others' call ends at the timeout with an error naming rank 0."""
    import reccl

    dev = comm.device
    if rank != 0:
        t0 = time.monotonic()
        comm.all_reduce(torch.ones(1000, device=dev))
        try:
            comm.synchronize()
            raise AssertionError("a missing rank was not detected")
        except reccl.Error as e:
            took = time.monotonic() - t0
            assert e.status == "timeout", str(e)
            assert e.rank == 0 and "rank 0 did not arrive" in str(e), str(e)
            assert took < 3 * MISSING_TIMEOUT_S + 5, f"took {took:.1f} s"
    dist.barrier()
    return 1


MISSING_TIMEOUT_S = 3.0


def _memory(comm, rank, world):
    import reccl.torch as rt

    bound = rt.memory_bound(world, fused_max_tokens=512, fused_max_hidden=8192)
    held = comm.memory_bytes()
    assert held <= bound, f"holds {held} bytes, bound {bound}"
    t = comm.empty((1000, 1000), torch.bfloat16)
    assert comm.memory_bytes() == held + 2_000_000, comm.memory_bytes() - held
    comm.free(t)
    assert comm.memory_bytes() == held
    # what the whole GPU loses while every rank builds a second communicator, against their accounting
    torch.cuda.synchronize()
    dist.barrier()
    free_before = torch.cuda.mem_get_info()[0]
    dist.barrier()
    second = rt.Communicator(timeout=TIMEOUT_S)
    torch.cuda.synchronize()
    dist.barrier()
    lost = free_before - torch.cuda.mem_get_info()[0]
    slack = 64 << 20  # per process: CUDA's own allocations (kernel images, IPC bookkeeping)
    assert lost <= world * (second.memory_bytes() + slack), f"GPU lost {lost} bytes, the ranks hold {world} x {second.memory_bytes()}"
    second.close()
    return 4


def _adaptive(comm, rank, world):
    """Every allocator on the adaptive lane: results against the reference for the five collectives
    above the one-shot sizes, the reports (one per collective, shares summing to 1), CUDA-graph
    replays that keep the loop running, and the policy names that are refused."""
    import reccl.torch as rt

    dev = comm.device
    for bad in ({"allocator": "fastest"}, {"telemetry": "psychic"}, {"allocator": "texcp", "telemetry": "none"}):
        try:
            rt.Communicator(**bad)
            raise AssertionError(f"{bad} accepted")
        except ValueError:
            pass
    checks = 0
    vts = 4
    for allocator in ("equal", "proportional", "texcp", "aimd"):
        c = rt.Communicator(timeout=TIMEOUT_S, fused_max_tokens=0, allocator=allocator, telemetry="stalls", vts=vts)
        assert c.adaptive and c.memory_bytes() <= rt.memory_bound(world, fused_max_tokens=0, allocator=allocator,
                                                                   telemetry="stalls", vts=vts)
        calls = 0
        dtypes = DTYPES if allocator == "texcp" else ("float32", "bfloat16")
        for dtype in dtypes:
            for n in (1 << 20, 3 * (1 << 18) + 5):  # 2-4 MiB: above the one-shot sizes
                case = f"adaptive/{allocator}/ar/{dtype}/{n}"
                xs = [_input(case, r, (n,), dtype) for r in range(world)]
                x = xs[rank].to(dev)  # before the poison, so that the output (not x) lands on it
                _poison((n,), dtype, dev)
                _close(c.all_reduce(x), _reduce(xs, "sum", dtype), dtype, case)
                calls += 1
        n = (1 << 18) + 3  # fp32: every collective's message is above 1 MiB
        case = f"adaptive/{allocator}/rs"
        xs = [_input(case, r, (world * n,), "float32") for r in range(world)]
        _poison((n,), "float32", dev)
        _close(c.reduce_scatter(xs[rank].to(dev), "max"), _reduce([x[rank * n:(rank + 1) * n] for x in xs], "max", "float32"),
               "float32", case)
        case = f"adaptive/{allocator}/ag"
        xs = [_input(case, r, (n,), "float32") for r in range(world)]
        _poison((world * n,), "float32", dev)
        _close(c.all_gather(xs[rank].to(dev)), torch.cat(xs), "float32", case)
        case = f"adaptive/{allocator}/a2a"
        xs = [_input(case, r, (world * n,), "float32") for r in range(world)]
        x = xs[rank].to(dev)
        _poison((world * n,), "float32", dev)
        _close(c.all_to_all(x), torch.cat([xs[p][rank * n:(rank + 1) * n] for p in range(world)]), "float32", case)
        case = f"adaptive/{allocator}/bc"
        xs = [_input(case, r, (n + (1 << 18),), "float32") for r in range(world)]
        x = xs[rank].to(dev)
        _poison((n + (1 << 18),), "float32", dev)
        _close(c.broadcast(x, world - 1), xs[world - 1], "float32", case)
        calls += 4
        small = c.all_reduce(torch.ones(1000, device=dev))  # the one-shot fast path: no report
        c.synchronize()
        assert torch.equal(small.cpu(), torch.full((1000,), float(world)))
        reps = c.reports()
        # the report of collective e is written by collective e + 1: all but the last are there
        assert [r["epoch"] for r in reps] == list(range(calls - 1)), [r["epoch"] for r in reps]
        for r in reps:
            assert r["vts"] == vts and r["ranks"] == world and r["status"] in ("ok", "recovered"), r
            assert abs(sum(r["share"]) - 1.0) < 1e-6, r["share"]
            assert sum(r["bytes"]) > 0 and len(r["stalls"]) == vts, r
            if allocator == "equal" and not r["masked"]:
                assert max(r["share"]) - min(r["share"]) < 1e-6, r["share"]
        assert c.reports() == [], "reports returned twice"
        checks += calls + len(reps)
        if allocator == "texcp":
            checks += _adaptive_graph(c, rank, world, first_epoch=calls)
        c.close()
    return checks


def _adaptive_graph(c, rank, world, first_epoch):
    """Adaptive all-reduces captured once and replayed on new inputs: each replay runs the loop
    (its state is in device memory) and adds reports."""
    dev = c.device
    n = (1 << 20) + 1
    sx = torch.empty(n, dtype=torch.bfloat16, device=dev)
    stream = torch.cuda.Stream(device=dev)
    with torch.cuda.stream(stream):
        c.all_reduce(sx)  # warm-up
    torch.cuda.current_stream(dev).wait_stream(stream)
    c.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        out = c.all_reduce(sx)
        c.all_reduce_(sx)
    for it in range(3):
        case = f"adaptive/graph/{it}"
        xs = [_input(case, r, (n,), "bfloat16") for r in range(world)]
        sx.copy_(xs[rank])
        torch.cuda.synchronize(dev)
        dist.barrier()
        g.replay()
        c.synchronize()
        want = _reduce(xs, "sum", "bfloat16")
        _close(out, want, "bfloat16", case + "/out")
        _close(sx, want, "bfloat16", case + "/in place")
        dist.barrier()
    del g
    reps = c.reports()
    # the warm-up and 3 x 2 replayed calls; the report of the last is not written yet
    assert [r["epoch"] for r in reps] == list(range(first_epoch - 1, first_epoch + 6)), [r["epoch"] for r in reps]
    return 6


def _nccl_transport(comm, rank, world):
    """transport="nccl" with the processes on one GPU: NCCL refuses two ranks on one GPU, and every
    rank gets a reccl.Error saying so (no hang); the P2P communicator beside it still works. (On one
    rank per GPU it is the fast path on NCCL's symmetric windows: that needs two GPUs.)"""
    import reccl
    import reccl.torch as rt

    t0 = time.monotonic()
    try:
        rt.Communicator(transport="nccl", timeout=TIMEOUT_S)
        raise AssertionError("two ranks on one GPU accepted by the nccl transport")
    except reccl.Error as e:
        assert "ncclCommInitRank" in str(e), str(e)
    assert time.monotonic() - t0 < 60, "the refusal took over a minute"
    y = comm.all_reduce(torch.full((9,), float(rank), device=comm.device))
    comm.synchronize()
    assert torch.equal(y.cpu(), torch.full((9,), float(world * (world - 1) // 2)))
    return 2


SCENARIOS = {"collectives": _collectives, "fused": _fused, "graphs": _graphs, "compile": _compiled,
             "bad_input": _bad_input, "missing_rank": _missing_rank, "memory": _memory, "adaptive": _adaptive,
             "nccl_transport": _nccl_transport}


def _worker(rank, world, port, scenario, results):
    try:
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        torch.cuda.set_device(0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        import reccl.torch as rt

        timeout = MISSING_TIMEOUT_S if scenario == "missing_rank" else TIMEOUT_S
        comm = rt.Communicator(timeout=timeout)
        n = SCENARIOS[scenario](comm, rank, world)
        if not comm._c.closed():
            comm.close()
        dist.barrier()
        dist.destroy_process_group()
        results.put((rank, "ok", n))
    except BaseException:  # noqa: BLE001
        results.put((rank, "fail", traceback.format_exc()))


def run_scenario(scenario, world, limit_s=600):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, scenario, results)) for r in range(world)]
    for p in procs:
        p.start()
    got = {}
    deadline = time.monotonic() + limit_s
    while len(got) < world and time.monotonic() < deadline:
        try:
            rank, state, info = results.get(timeout=1.0)
            got[rank] = (state, info)
        except Exception:  # noqa: BLE001
            if all(not p.is_alive() for p in procs) and results.empty():
                break
    for p in procs:
        p.join(timeout=5)
        if p.is_alive():
            p.kill()
    missing = [r for r in range(world) if r not in got]
    failures = [f"rank {r}:\n{info}" for r, (state, info) in sorted(got.items()) if state != "ok"]
    if missing:
        failures.append(f"ranks {missing} reported nothing within {limit_s} s (hang or crash)")
    if failures:
        raise AssertionError(f"{scenario} with {world} processes:\n" + "\n".join(failures))
    return sum(info for state, info in got.values())


# ---- pytest entry points ------------------------------------------------------------------------

if pytest is not None:
    _skip = _gpu_ready()
    pytestmark = pytest.mark.skipif(_skip is not None, reason=_skip or "")

    @pytest.mark.parametrize("world", WORLDS)
    @pytest.mark.parametrize("scenario", list(SCENARIOS))
    def test_scenario(scenario, world):
        run_scenario(scenario, world)


if __name__ == "__main__":
    why = _gpu_ready()
    if why is not None:
        print(f"SKIP python/tests/test_torch.py: {why}")
        sys.exit(0)
    only = sys.argv[1:]
    failed = 0
    for scenario in SCENARIOS:
        if only and scenario not in only:
            continue
        for world in WORLDS:
            t0 = time.monotonic()
            try:
                n = run_scenario(scenario, world)
                print(f"PASS {scenario} x{world}: {n} checks, {time.monotonic() - t0:.1f} s", flush=True)
            except AssertionError as e:
                failed += 1
                print(f"FAIL {scenario} x{world} ({time.monotonic() - t0:.1f} s):\n{e}", flush=True)
    sys.exit(1 if failed else 0)
