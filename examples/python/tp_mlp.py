"""A tensor-parallel MLP step with reccl.torch: each rank holds a column shard of W1 and a row shard
of W2, computes its partial output, and one fused operator all-reduces the partials, adds the
residual and applies RMSNorm. The step runs under torch.compile(fullgraph=True), is captured in a
CUDA graph and replayed on new tokens; every rank checks its new residual bit for bit, and its
normalised output to within one bf16 rounding step, against a single-process reference that
computes the same shards' partials and sums them in rank order (the reference's sum of squares
adds in another order than the kernel's).

    python3 examples/python/tp_mlp.py [--ranks 2] [--tokens 32] [--hidden 4096]

The ranks are processes sharing GPU 0 over a gloo group (on a machine with one GPU per rank, give
each process its own device instead): correctness, not speed.
"""

import argparse
import os
import socket
import sys
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def weights(hidden, ffn, seed=0):
    g = torch.Generator().manual_seed(seed)
    w1 = (torch.randn(hidden, ffn, generator=g) / hidden**0.5).to(torch.bfloat16)
    w2 = (torch.randn(ffn, hidden, generator=g) / ffn**0.5).to(torch.bfloat16)
    norm = (1.0 + 0.1 * torch.randn(hidden, generator=g)).to(torch.bfloat16)
    return w1, w2, norm


def tokens_for(step, t, hidden):
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(t, hidden, generator=g).to(torch.bfloat16)
    residual = torch.randn(t, hidden, generator=g).to(torch.bfloat16)
    return x, residual


def partial(x, w1_shard, w2_shard):
    # ReLU: exact in any kernel, so the compiled step and the eager reference round alike
    return torch.relu(x @ w1_shard) @ w2_shard


def reference(x, residual, w1, w2, norm, ranks, eps):
    """One process: every shard's partial, summed in rank order in fp32 and rounded once, then the
    residual add and RMSNorm with the fused operator's rounding points."""
    f = w1.shape[1] // ranks
    # contiguous shards, as the ranks hold them (a strided operand may take another GEMM algorithm)
    parts = [partial(x, w1[:, r * f:(r + 1) * f].contiguous(), w2[r * f:(r + 1) * f].contiguous()) for r in range(ranks)]
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    y = acc.to(torch.bfloat16)
    res = (y.float() + residual.float()).to(torch.bfloat16)
    rf = res.float()
    rstd = torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps)
    return (rf * rstd * norm.float()).to(torch.bfloat16), res


def rank_main(rank, ranks, port, a, results):
    try:
        torch.cuda.set_device(0)
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=ranks)
        import reccl.torch as rt

        dev = torch.device("cuda", 0)
        comm = rt.Communicator(timeout=30.0, fused_max_tokens=max(a.tokens, 1))
        w1, w2, norm = weights(a.hidden, a.ffn)
        f = a.ffn // ranks
        w1_r, w2_r = w1[:, rank * f:(rank + 1) * f].contiguous().to(dev), w2[rank * f:(rank + 1) * f].contiguous().to(dev)
        norm_d = norm.to(dev)
        eps = 1e-6

        @torch.compile(fullgraph=True)
        def step(x, residual):
            return comm.fused_add_rms_norm_all_reduce(partial(x, w1_r, w2_r), residual, norm_d, eps)

        # static buffers for the graph; eager compiled warm-up first (compiles, loads the kernels)
        sx = torch.empty(a.tokens, a.hidden, dtype=torch.bfloat16, device=dev)
        sr = torch.empty_like(sx)
        x0, r0 = tokens_for(0, a.tokens, a.hidden)
        sx.copy_(x0), sr.copy_(r0)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            for _ in range(2):
                out, res = step(sx, sr)
        torch.cuda.current_stream().wait_stream(s)
        comm.synchronize()
        want = reference(x0.to(dev), r0.to(dev), w1.to(dev), w2.to(dev), norm_d, ranks, eps)
        checks = [("eager", out, res, want)]

        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            gout, gres = step(sx, sr)
        for it in range(1, a.steps + 1):
            xi, ri = tokens_for(it, a.tokens, a.hidden)
            sx.copy_(xi), sr.copy_(ri)
            torch.cuda.synchronize()
            dist.barrier()  # every rank's new tokens are in place before any replay
            g.replay()
            comm.synchronize()
            checks.append((f"graph replay {it}", gout.clone(), gres.clone(),
                           reference(xi.to(dev), ri.to(dev), w1.to(dev), w2.to(dev), norm_d, ranks, eps)))
            dist.barrier()
        bad, exact = [], [0]
        for name, o, r, (wo, wr) in checks:
            # residual': bit for bit. out: within one bf16 rounding step of the reference, whose sum of
            # squares adds the row in another order than the kernel's block reduction
            ulp = torch.exp2(torch.floor(torch.log2(wo.float().abs().clamp_min(2**-100))) - 7)
            off = (o.float() - wo.float()).abs() > ulp
            if not torch.equal(r, wr) or bool(off.any()):
                bad.append(f"{name}: residual bitwise {torch.equal(r, wr)}, out elements off by more than one "
                           f"rounding step: {int(off.sum())}")
            exact[0] += int(torch.equal(o, wo))
        del g
        comm.close()
        dist.destroy_process_group()
        results.put((rank, bad, len(checks), exact[0]))
    except BaseException:  # noqa: BLE001
        results.put((rank, [traceback.format_exc()], 0, 0))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--hidden", type=int, default=4096)
    ap.add_argument("--ffn", type=int, default=8192)
    ap.add_argument("--steps", type=int, default=3)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("tp_mlp: no CUDA GPU; nothing to run")
        return 77
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(r, a.ranks, port, a, results)) for r in range(a.ranks)]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    failed = False
    for rank, bad, n, exact in sorted(got):
        for b in bad:
            print(f"rank {rank}: {b}")
        failed |= bool(bad)
        print(f"rank {rank}: {n - len(bad)}/{n} steps match the single-process reference (residual bit for bit, "
              f"output within one bf16 rounding step; {exact}/{n} outputs bit for bit)")
    print(f"tp_mlp: {a.ranks} ranks, {a.tokens} tokens, hidden {a.hidden}, ffn {a.ffn}, torch.compile + CUDA graph: "
          + ("FAILED" if failed else "all outputs match"))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
