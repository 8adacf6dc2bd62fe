"""reccl for PyTorch: a communicator over any torch.distributed group and the ``torch.ops.reccl``
operators, which run inside CUDA graphs and under ``torch.compile(fullgraph=True)``.

    import torch, torch.distributed as dist
    import reccl.torch as rt

    dist.init_process_group("gloo")            # any group: gloo or nccl
    comm = rt.Communicator()                   # collective over the group; CUDA IPC windows
    y = comm.all_reduce(x)                     # torch.ops.reccl.all_reduce(comm.handle, x, "sum")
    out, residual = comm.fused_add_rms_norm_all_reduce(x, residual, weight, 1e-6)
    comm.close()                               # collective

Every operator is stream-ordered on the current CUDA stream and never waits on the host. Errors a
rank finds before launching (bad tensors, bad arguments) raise :class:`reccl.Error` at once; those
found on the GPU (a rank that never arrives, ranks that disagree on a call) end the kernels within
the communicator's timeout and are raised by :meth:`Communicator.check` (or
:meth:`Communicator.synchronize`). After a GPU-side error the communicator stays failed: close it
and build a new one.
"""

from __future__ import annotations

import math
from typing import List, Optional, Sequence

import torch
import torch.distributed as dist

from . import _C  # noqa: F401  (registers torch.ops.reccl.*)
from ._errors import Error

__all__ = ["Communicator", "Error", "memory_bound"]

_ALLOCATORS = ("equal", "proportional", "texcp", "aimd")
_TELEMETRY = ("none", "stalls")
_TRANSPORTS = ("p2p", "nccl")

# handle -> rank count, for the fake implementations (they see only the handle)
_world_of: dict = {}


def memory_bound(world_size: int, *, max_ctas: int = 64, fused_max_tokens: int = 512, fused_max_hidden: int = 8192,
                 allocator: str = "equal", telemetry: str = "none", vts: int = 8) -> int:
    """Device bytes one rank's communicator holds with these options, before :meth:`Communicator.empty`."""
    _check_policies("p2p", allocator, telemetry)
    return int(_C.memory_bound(world_size, max_ctas=max_ctas, fused_max_tokens=fused_max_tokens,
                               fused_max_hidden=fused_max_hidden, allocator=allocator, telemetry=telemetry, vts=vts))


def _raise_recorded(e: RuntimeError):
    err = _C.take_last_error()
    if err is not None:
        raise err from None
    raise e


def _group_exchange(group, world: int, device: int):
    """An all-gather of bytes over ``group`` (CPU tensors for gloo, CUDA tensors for nccl)."""
    dev = torch.device("cuda", device) if dist.get_backend(group) == "nccl" else torch.device("cpu")

    def exchange(mine: bytes) -> bytes:
        t = torch.frombuffer(bytearray(mine), dtype=torch.uint8).to(dev)
        parts = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(parts, t, group=group)
        return b"".join(p.cpu().numpy().tobytes() for p in parts)

    return exchange


def _check_policies(transport: str, allocator: str, telemetry: str):
    for what, value, known in (("transport", transport, _TRANSPORTS), ("allocator", allocator, _ALLOCATORS),
                               ("telemetry", telemetry, _TELEMETRY)):
        if value not in known:
            raise ValueError(f"reccl.torch: {what}={value!r} is not available; this version has {', '.join(known)}")
    if allocator != "equal" and telemetry == "none":
        raise ValueError(f"reccl.torch: allocator={allocator!r} adapts from measurements: it needs telemetry='stalls'")


class Communicator:
    """One rank of a reccl communicator.

    ``Communicator(group)`` is collective over ``group`` (a torch.distributed group, gloo or nccl;
    default the world): every rank creates it at the same point, on the CUDA device that is current
    (or ``device``). Ranks may share one GPU (processes take turns on it: correct, not fast).

    Options (equal on every rank): ``max_ctas`` (largest grid; the scratch memory grows with it),
    ``timeout`` (seconds a GPU-side wait gives up after), ``fused_max_tokens`` and
    ``fused_max_hidden`` (the fused op's limits; 0 tokens: no fused op and no memory for it).

    Policies, by name (each maps to a compiled type): ``transport`` is ``"p2p"`` (CUDA IPC windows
    exchanged over the group; ranks may share a GPU) or ``"nccl"`` (an NCCL communicator built over
    the group, the fast path on its symmetric windows; one rank per GPU, as NCCL requires);
    ``allocator`` (``"equal"``, ``"proportional"``, ``"texcp"``, ``"aimd"``) and ``telemetry``
    (``"none"``, ``"stalls"``) choose the adaptive lane. With the defaults (equal, none) every
    collective runs on the fast path. With any other pair, collectives above the one-shot sizes
    (1 MiB) run on an adaptive lane of ``vts`` VTs: the allocator splits each message over the VTs
    from the measured stalls, a VT that stops is masked within the same collective (the result
    stays right) and re-probed later, and :meth:`reports` returns what each collective did. Every
    allocator but ``"equal"`` needs ``telemetry="stalls"``.
    """

    def __init__(self, group=None, *, device: Optional[int] = None, max_ctas: int = 64, timeout: float = 10.0,
                 fused_max_tokens: int = 512, fused_max_hidden: int = 8192, transport: str = "p2p",
                 allocator: str = "equal", telemetry: str = "none", vts: int = 8, _native=None):
        _check_policies(transport, allocator, telemetry)
        if _native is not None:
            self._c = _native
        else:
            group = group if group is not None else dist.group.WORLD
            rank, world = dist.get_rank(group), dist.get_world_size(group)
            device = torch.cuda.current_device() if device is None else int(device)
            with torch.cuda.device(device):
                self._c = _C.create(rank, world, _group_exchange(group, world, device), max_ctas=max_ctas,
                                    timeout=float(timeout), fused_max_tokens=fused_max_tokens,
                                    fused_max_hidden=fused_max_hidden, allocator=allocator, telemetry=telemetry, vts=vts,
                                    transport=transport)
        self.handle: int = self._c.handle()
        self.rank: int = self._c.rank()
        self.world_size: int = self._c.size()
        self.device = torch.device("cuda", self._c.device())
        self._symmetric: dict = {}
        self._next_report = 0
        _world_of[self.handle] = self.world_size

    @classmethod
    def loopback(cls, ranks: int, device: int = 0, *, max_ctas: int = 64, timeout: float = 10.0,
                 fused_max_tokens: int = 512, fused_max_hidden: int = 8192, allocator: str = "equal",
                 telemetry: str = "none", vts: int = 8) -> List["Communicator"]:
        """``ranks`` ranks on one GPU in this process, for tests and measurements. Each rank's calls
        must go on its own stream, and every rank must call before any rank's call is waited for
        (with an adaptive lane, every rank's grid must also fit the GPU at once: ranks x
        (``max_ctas`` - 1) CTAs at most the SM count)."""
        _check_policies("p2p", allocator, telemetry)
        natives = _C.create_loopback(ranks, device, max_ctas=max_ctas, timeout=float(timeout),
                                     fused_max_tokens=fused_max_tokens, fused_max_hidden=fused_max_hidden,
                                     allocator=allocator, telemetry=telemetry, vts=vts)
        return [cls(_native=n) for n in natives]

    # ---- collectives (out-of-place unless named with a trailing underscore) ----------------------
    # Eagerly, plain tensors go straight to the operators' implementation (no dispatcher: about 2 us
    # less host time per call); under torch.compile, and for tensor subclasses (fake tensors, ...),
    # the methods call torch.ops.reccl.*. Both run the same checks and kernels. Each method spells
    # out its torch.compile branch, which is what dynamo traces.

    def _eager(self, name: str, x: torch.Tensor, *args):
        try:
            if type(x) is torch.Tensor:
                return getattr(self._c, name)(x, *args)
            return getattr(torch.ops.reccl, name)(self.handle, x, *args)
        except RuntimeError as e:
            _raise_recorded(e)

    def all_reduce(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.reccl.all_reduce(self.handle, x, op)
        return self._eager("all_reduce", x, op)

    def all_reduce_(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        if torch.compiler.is_compiling():
            torch.ops.reccl.all_reduce_(self.handle, x, op)
        else:
            self._eager("all_reduce_", x, op)
        return x

    def reduce_scatter(self, x: torch.Tensor, op: str = "sum") -> torch.Tensor:
        """Rank r gets the reduction of every rank's r-th slice of ``x`` along dim 0."""
        if torch.compiler.is_compiling():
            return torch.ops.reccl.reduce_scatter(self.handle, x, op)
        return self._eager("reduce_scatter", x, op)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """Every rank's ``x`` concatenated along dim 0, in rank order."""
        if torch.compiler.is_compiling():
            return torch.ops.reccl.all_gather(self.handle, x)
        return self._eager("all_gather", x)

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        """Slice q of ``x`` along dim 0 goes to rank q; slice p of the output came from rank p."""
        if torch.compiler.is_compiling():
            return torch.ops.reccl.all_to_all(self.handle, x)
        return self._eager("all_to_all", x)

    def broadcast(self, x: torch.Tensor, root: int = 0) -> torch.Tensor:
        if torch.compiler.is_compiling():
            return torch.ops.reccl.broadcast(self.handle, x, root)
        return self._eager("broadcast", x, root)

    def broadcast_(self, x: torch.Tensor, root: int = 0) -> torch.Tensor:
        if torch.compiler.is_compiling():
            torch.ops.reccl.broadcast_(self.handle, x, root)
        else:
            self._eager("broadcast_", x, root)
        return x

    def fused_add_rms_norm_all_reduce(self, x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                                      eps: float = 1e-6):
        """bf16: ``residual' = bf16(all_reduce(x)) + residual``, ``out = rmsnorm(residual') * weight``
        in one kernel; returns ``(out, residual')``."""
        if torch.compiler.is_compiling():
            return torch.ops.reccl.fused_add_rms_norm_all_reduce(self.handle, x, residual, weight, eps)
        return self._eager("fused_add_rms_norm_all_reduce", x, residual, weight, eps)

    # ---- symmetric memory ------------------------------------------------------------------------

    def empty(self, shape: Sequence[int], dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        """A tensor in registered memory (the zero-copy path). Collective: every rank asks for the
        same shape and dtype in the same order. It lives until :meth:`free` (collective) or
        :meth:`close`; do not use it after either."""
        shape = tuple(int(s) for s in shape)
        numel = math.prod(shape)
        nbytes = max(numel * torch.empty((), dtype=dtype).element_size(), 16)
        ptr = self._c.allocate(nbytes)
        t = self._c.tensor_at(ptr, list(shape), torch.empty(0, dtype=dtype, device=self.device))
        self._symmetric[ptr] = nbytes
        return t

    def free(self, t: torch.Tensor) -> None:
        """Releases a tensor from :meth:`empty`. Collective."""
        ptr = t.untyped_storage().data_ptr()
        if ptr not in self._symmetric:
            raise Error("reccl invalid_argument: free: tensor was not returned by empty()", 3, self.rank)
        torch.cuda.synchronize(self.device)
        self._c.free(ptr)
        del self._symmetric[ptr]

    def is_symmetric(self, t: torch.Tensor) -> bool:
        return bool(self._c.is_registered(t.data_ptr(), max(t.numel() * t.element_size(), 1)))

    # ---- state -----------------------------------------------------------------------------------

    def memory_bytes(self) -> int:
        """Device bytes this rank holds: scratch windows, the fused op's window, tensors from empty()."""
        return int(self._c.memory_bytes())

    @property
    def fused_max_tokens(self) -> int:
        return int(self._c.fused_max_tokens())

    def check(self) -> None:
        """Raises :class:`reccl.Error` if a GPU-side fault was recorded (names the rank)."""
        self._c.check()

    def synchronize(self) -> None:
        """Waits for the device (bounded by the timeout: a waiting kernel gives up), then check()."""
        torch.cuda.synchronize(self.device)
        self.check()

    @property
    def adaptive(self) -> bool:
        """Whether this communicator has an adaptive lane (policies other than equal + none)."""
        return bool(self._c.adaptive())

    def reports(self, since: Optional[int] = None) -> List[dict]:
        """What each adaptive collective did, oldest first: the reports of collectives ``since``
        (default: the one after the last report returned) up to the newest one written. Collective
        e's report is written when collective e+1 runs (the control step runs one behind), and the
        GPU holds the last 256. Synchronises the device first.

        Each report is a dict: ``epoch`` (the lane's collective index), ``status`` ("ok", or
        "recovered" when a VT died and the live VTs carried its part), ``vts``, ``ranks``, and per
        VT: ``share`` (fraction of the message), ``elements`` (what the VT carried: elements for the
        reductions, bytes for all-gather, broadcast and all-to-all, which split raw bytes), ``bytes`` and ``stalls`` (summed
        over ranks), ``time_ns`` (the cost model's time of the VT's slowest rank), ``gbps`` (per-rank
        bandwidth estimate); and lists of VT indices: ``masked`` (carried nothing), ``faulted``
        (missed their deadline, masked from the next collective), ``probed``, ``rejoined``.
        """
        if not self._c.adaptive():
            raise Error("reccl invalid_argument: reports() needs an adaptive lane: create the communicator with "
                        "telemetry='stalls' (and an allocator)", 3, self.rank)
        torch.cuda.synchronize(self.device)
        epoch = int(self._c.adaptive_epoch())
        first = self._next_report if since is None else int(since)
        out = self._c.reports(max(first, epoch - 256), epoch)  # the GPU holds the last 256
        if out:
            self._next_report = out[-1]["epoch"] + 1
        return out

    def recovered(self) -> int:
        """How many adaptive collectives so far recovered a dead VT (synchronises the device)."""
        if not self._c.adaptive():
            return 0
        torch.cuda.synchronize(self.device)
        return int(self._c.recovered())

    def close(self) -> None:
        """Collective teardown (every rank, same order). Tensors from empty() become invalid."""
        if self._c.closed():
            return
        torch.cuda.synchronize(self.device)
        _world_of.pop(self.handle, None)
        self._symmetric.clear()
        self._c.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- fake implementations (shapes only) for torch.compile and meta tensors ----------------------

def _world(handle: int) -> int:
    if handle not in _world_of:
        raise Error(f"reccl invalid_argument: handle {handle} is not a live communicator", 3)
    return _world_of[handle]


@torch.library.register_fake("reccl::all_reduce")
def _all_reduce_fake(comm, x, op="sum"):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("reccl::all_reduce_")
def _all_reduce_inplace_fake(comm, x, op="sum"):
    return None


@torch.library.register_fake("reccl::reduce_scatter")
def _reduce_scatter_fake(comm, x, op="sum"):
    shape = list(x.shape) or [1]
    shape[0] //= _world(comm)
    return x.new_empty(shape)


@torch.library.register_fake("reccl::all_gather")
def _all_gather_fake(comm, x):
    shape = list(x.shape) or [1]
    shape[0] *= _world(comm)
    return x.new_empty(shape)


@torch.library.register_fake("reccl::all_to_all")
def _all_to_all_fake(comm, x):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("reccl::broadcast")
def _broadcast_fake(comm, x, root):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("reccl::broadcast_")
def _broadcast_inplace_fake(comm, x, root):
    return None


@torch.library.register_fake("reccl::fused_add_rms_norm_all_reduce")
def _fused_fake(comm, x, residual, weight, eps):
    return torch.empty_like(x), torch.empty_like(x)
