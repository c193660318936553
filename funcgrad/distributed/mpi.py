"""The MPI engine: funcgrad's collectives on mpi4py's buffer (upper-case) calls, one copy at most.

mpi4py comes with the ``distributed`` extra (``pip install funcgrad[distributed]`` brings mpi4py and
Open MPI's wheel); it is imported only when a job asks for this engine.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.lower import pool
from funcgrad.util.collective_engine import (
    CollectiveMismatchError,
    CollectiveTimeoutError,
    caller_location,
    check_permutation,
    check_reduction,
    collective_timeout,
    debug_collectives,
    describe_call,
    mismatch_message,
    timeout_message,
)

_SIGNATURE_BYTES = 256  # each rank's call in the debug check: JSON [call, file:line], zero-padded


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

    # Each collective: with FUNCGRAD_DEBUG_COLLECTIVES on, first an allgather of every rank's call
    # (name, reduction, dtype, shape) that raises on every rank where they differ; with
    # FUNCGRAD_COLLECTIVE_TIMEOUT set, the nonblocking form polled against the deadline; with neither,
    # the blocking call (MPI's own fastest path: nothing is added).

    def _prepare(self, what: str, x: np.ndarray | None, detail: str = "") -> float | None:
        timeout = collective_timeout()
        if debug_collectives() and self.size > 1:
            self._check_same_call(describe_call(what, x, detail), timeout)
        return timeout

    def _check_same_call(self, call: str, timeout: float | None) -> None:
        mine = json.dumps([call, caller_location()]).encode()
        if len(mine) > _SIGNATURE_BYTES:
            mine = json.dumps([call[:_SIGNATURE_BYTES // 2], "?"]).encode()
        send = np.zeros(_SIGNATURE_BYTES, np.uint8)
        send[:len(mine)] = np.frombuffer(mine, np.uint8)
        gathered = np.empty((self.size, _SIGNATURE_BYTES), np.uint8)
        if timeout is None:
            self.comm.Allgather(send, gathered)
        else:
            self._wait([self.comm.Iallgather(send, gathered)], f"{call} (the debug check before it)", timeout)
        calls = [tuple(json.loads(bytes(row).rstrip(b"\0").decode())) for row in gathered]
        message = mismatch_message(calls)
        if message is not None:
            raise CollectiveMismatchError(f"{call} on rank {self.rank}: {message}")

    def _wait(self, requests: list[Any], call: str, timeout: float) -> None:
        """Poll ``requests`` (each poll also drives MPI's progress) until done or ``timeout`` seconds pass."""
        deadline = time.monotonic() + timeout
        spins = 0
        while not self.MPI.Request.Testall(requests):
            spins += 1
            if spins > 1000:  # past the first microseconds, yield the core between polls
                if time.monotonic() > deadline:
                    raise CollectiveTimeoutError(timeout_message(call, self.rank, self.size, timeout))
                time.sleep(0)

    def allreduce(self, x: np.ndarray, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
        """``out`` (optional; C-contiguous, ``x``'s shape and dtype): written and returned, saving the
        result's allocation (40 MB of fresh pages cost about as much as the copy between two ranks)."""
        send = np.ascontiguousarray(x)
        if out is None:
            # from the pool of large buffers: a fresh 40 MB np.empty costs page faults (~10% of the
            # all-reduce itself); the pool's buffer comes back once the result and its views are gone
            out = pool.empty(send.shape, send.dtype)
        elif out.shape != send.shape or out.dtype != send.dtype or not out.flags.c_contiguous:
            raise ValueError(f"allreduce: out must be a C-contiguous {send.dtype}{list(send.shape)} array, got "
                             f"{out.dtype}{list(out.shape)}{'' if out.flags.c_contiguous else ' (not contiguous)'}")
        mpi_op = self._op("allreduce", op)
        timeout = self._prepare("allreduce", send, op)
        if timeout is None:
            self.comm.Allreduce(send, out, op=mpi_op)
        else:
            self._wait([self.comm.Iallreduce(send, out, op=mpi_op)], describe_call("allreduce", send, op), timeout)
        return out

    def allgather(self, x: np.ndarray) -> np.ndarray:
        send = np.ascontiguousarray(x)
        out = np.empty((self.size, *send.shape), send.dtype)
        timeout = self._prepare("allgather", send)
        if timeout is None:
            self.comm.Allgather(send, out)
        else:
            self._wait([self.comm.Iallgather(send, out)], describe_call("allgather", send), timeout)
        return out

    def reduce_scatter(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        send = np.ascontiguousarray(x)
        mpi_op = self._op("reduce_scatter", op)
        if send.ndim == 0 or send.shape[0] % self.size:
            raise ValueError(f"reduce_scatter: the leading axis of shape {send.shape} does not split into "
                             f"{self.size} equal parts")
        out = np.empty((send.shape[0] // self.size, *send.shape[1:]), send.dtype)
        timeout = self._prepare("reduce_scatter", send, op)
        if timeout is None:
            self.comm.Reduce_scatter_block(send, out, op=mpi_op)
        else:
            self._wait([self.comm.Ireduce_scatter_block(send, out, op=mpi_op)],
                       describe_call("reduce_scatter", send, op), timeout)
        return out

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        if not 0 <= root < self.size:
            raise ValueError(f"broadcast: root {root} is not a rank of a job of {self.size} processes")
        buffer = np.array(x, copy=True, order="C")
        timeout = self._prepare("broadcast", buffer, f"root={root}")
        if timeout is None:
            self.comm.Bcast(buffer, root=root)
        else:
            self._wait([self.comm.Ibcast(buffer, root=root)], describe_call("broadcast", buffer, f"root={root}"),
                       timeout)
        return buffer

    def ppermute(self, x: np.ndarray, perm: Sequence[tuple[int, int]]) -> np.ndarray:
        check_permutation("ppermute", perm, self.size)
        send = np.ascontiguousarray(x)
        out = np.zeros_like(send)
        detail = "perm=" + ",".join(f"{s}>{d}" for s, d in sorted(tuple(p) for p in perm))
        timeout = self._prepare("ppermute", send, detail)
        rank = self.rank
        destinations = [d for s, d in perm if s == rank]
        sources = [s for s, d in perm if d == rank]
        requests = []
        if sources:
            requests.append(self.comm.Irecv(out, source=sources[0], tag=7))
        if destinations:
            requests.append(self.comm.Isend(send, dest=destinations[0], tag=7))
        if timeout is None:
            self.MPI.Request.Waitall(requests)
        else:
            self._wait(requests, describe_call("ppermute", send, detail), timeout)
        return out

    def barrier(self) -> None:
        timeout = self._prepare("barrier", None)
        if timeout is None:
            self.comm.Barrier()
        else:
            self._wait([self.comm.Ibarrier()], "barrier", timeout)

    def abort(self, code: int = 1) -> None:
        """End every process of the job now (``MPI_Abort``): what an uncaught exception on one rank does."""
        self.comm.Abort(code)

    def __repr__(self) -> str:
        return f"MPIEngine(rank={self.rank}, size={self.size})"
