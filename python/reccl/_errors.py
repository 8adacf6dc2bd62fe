"""The exception reccl raises from Python."""

STATUS_NAMES = ("ok", "recovered", "timeout", "invalid_argument", "mismatch", "internal")


class Error(RuntimeError):
    """A reccl error: the status, and the rank, VT and collective number concerned (-1 when not known).

    ``str(e)`` reads e.g. ``reccl timeout (rank 1): ...``; ``e.status`` is one of ``timeout``,
    ``invalid_argument``, ``mismatch``, ``internal``.
    """

    def __init__(self, message, code=5, rank=-1, vt=-1, epoch=-1, detail=""):
        super().__init__(message)
        self.code = int(code)
        self.status = STATUS_NAMES[self.code] if 0 <= self.code < len(STATUS_NAMES) else "internal"
        self.rank = int(rank)
        self.vt = int(vt)
        self.epoch = int(epoch)
        self.detail = detail
