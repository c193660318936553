"""The MPI engine: funcgrad's collectives on mpi4py's buffer (upper-case) calls, one copy at most.

mpi4py comes with the ``distributed`` extra (``pip install funcgrad[distributed]`` brings mpi4py and
Open MPI's wheel); it is imported only when a job asks for this engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.lower import pool
from funcgrad.util.collective_engine import check_permutation, check_reduction


def import_mpi() -> Any:
    try:
        from mpi4py import MPI
    except ImportError as error:  # pragma: no cover - depends on the installation
        raise ImportError("funcgrad.distributed: the MPI engine needs mpi4py; install it with "
                          "`pip install funcgrad[distributed]` (mpi4py and Open MPI)") from error
    return MPI


class MPIEngine:
    """Collectives over an MPI communicator (``MPI.COMM_WORLD`` unless one is given)."""

    name = "mpi"

    def __init__(self, comm: Any = None) -> None:
        self.MPI = import_mpi()
        self.comm = self.MPI.COMM_WORLD if comm is None else comm

    @property
    def rank(self) -> int:
        return int(self.comm.Get_rank())

    @property
    def size(self) -> int:
        return int(self.comm.Get_size())

    def _op(self, what: str, op: str) -> Any:
        check_reduction(what, op)
        return {"sum": self.MPI.SUM, "max": self.MPI.MAX, "min": self.MPI.MIN}[op]

    def allreduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        send = np.ascontiguousarray(x)
        # from the pool of large buffers: a fresh 40 MB np.empty costs page faults (~10% of the
        # all-reduce itself); the pool's buffer comes back once the result and its views are gone
        out = pool.empty(send.shape, send.dtype)
        self.comm.Allreduce(send, out, op=self._op("allreduce", op))
        return out

    def allgather(self, x: np.ndarray) -> np.ndarray:
        send = np.ascontiguousarray(x)
        out = np.empty((self.size, *send.shape), send.dtype)
        self.comm.Allgather(send, out)
        return out

    def reduce_scatter(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        send = np.ascontiguousarray(x)
        if send.ndim == 0 or send.shape[0] % self.size:
            raise ValueError(f"reduce_scatter: the leading axis of shape {send.shape} does not split into "
                             f"{self.size} equal parts")
        out = np.empty((send.shape[0] // self.size, *send.shape[1:]), send.dtype)
        self.comm.Reduce_scatter_block(send, out, op=self._op("reduce_scatter", op))
        return out

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        if not 0 <= root < self.size:
            raise ValueError(f"broadcast: root {root} is not a rank of a job of {self.size} processes")
        buffer = np.array(x, copy=True, order="C")
        self.comm.Bcast(buffer, root=root)
        return buffer

    def ppermute(self, x: np.ndarray, perm: Sequence[tuple[int, int]]) -> np.ndarray:
        check_permutation("ppermute", perm, self.size)
        send = np.ascontiguousarray(x)
        out = np.zeros_like(send)
        rank = self.rank
        destinations = [d for s, d in perm if s == rank]
        sources = [s for s, d in perm if d == rank]
        requests = []
        if sources:
            requests.append(self.comm.Irecv(out, source=sources[0], tag=7))
        if destinations:
            requests.append(self.comm.Isend(send, dest=destinations[0], tag=7))
        self.MPI.Request.Waitall(requests)
        return out

    def barrier(self) -> None:
        self.comm.Barrier()

    def __repr__(self) -> str:
        return f"MPIEngine(rank={self.rank}, size={self.size})"
