"""The engine that carries collectives between processes, as every layer sees it.

A collective that spans processes (``lax.psum`` under ``pmap`` across ranks, a data-parallel
gradient all-reduce) ends in one call on the current engine with host NumPy buffers. The engine
lives here, at the bottom, so that a primitive's implementation (``ir``), a plan step (``lower``)
and the training layer (``nn``) all reach the same one without importing the front:
``funcgrad.distributed.initialize()`` installs an MPI engine with ``set_engine``; before that, and
in a program that never calls it, :class:`LocalEngine` stands for a job of one process.

Every method takes and returns C-contiguous NumPy arrays, the same dtype and shape on every rank:

- ``allreduce(x, op)``: the elementwise ``op`` ("sum", "max", "min") over ranks, on every rank (the
  local and MPI engines also take ``out=``, a buffer to write the result into);
- ``allgather(x)``: every rank's ``x`` stacked on a new leading axis of length ``size``;
- ``reduce_scatter(x, op)``: ``x``'s leading axis (``size * k`` long) reduced over ranks, rank
  ``r`` keeps rows ``r*k : (r+1)*k``;
- ``broadcast(x, root)``: rank ``root``'s ``x`` on every rank;
- ``ppermute(x, perm)``: ``perm`` is ``((source, destination), ...)``; a rank that is no
  destination receives zeros;
- ``barrier()``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from funcgrad.util import config as _config

REDUCTIONS = ("sum", "max", "min")


@runtime_checkable
class CollectiveEngine(Protocol):
    name: str

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def allreduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray: ...

    def allgather(self, x: np.ndarray) -> np.ndarray: ...

    def reduce_scatter(self, x: np.ndarray, op: str = "sum") -> np.ndarray: ...

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray: ...

    def ppermute(self, x: np.ndarray, perm: Sequence[tuple[int, int]]) -> np.ndarray: ...

    def barrier(self) -> None: ...


def check_reduction(what: str, op: str) -> None:
    if op not in REDUCTIONS:
        raise ValueError(f"{what}: unknown reduction {op!r}; expected one of {', '.join(REDUCTIONS)}")


def check_permutation(what: str, perm: Sequence[tuple[int, int]], size: int) -> None:
    """``perm`` pairs ranks in ``range(size)``, each rank at most once as a source and once as a destination."""
    pairs = [tuple(pair) for pair in perm]
    if any(len(pair) != 2 for pair in pairs):
        raise ValueError(f"{what}: perm must be (source, destination) pairs, got {perm!r}")
    for source, destination in pairs:
        if not (0 <= source < size and 0 <= destination < size):
            raise ValueError(f"{what}: perm pair ({source}, {destination}) names a rank outside 0..{size - 1}")
    for index, side in ((0, "source"), (1, "destination")):
        seen = [pair[index] for pair in pairs]
        if len(set(seen)) != len(seen):
            raise ValueError(f"{what}: perm {perm!r} names a {side} more than once")


class LocalEngine:
    """A job of one process: every collective is the identity (or its one-rank meaning)."""

    name = "local"
    rank = 0
    size = 1

    def allreduce(self, x: np.ndarray, op: str = "sum", out: np.ndarray | None = None) -> np.ndarray:
        check_reduction("allreduce", op)
        if out is None:
            return np.array(x, copy=True)
        np.copyto(out, x)
        return out

    def allgather(self, x: np.ndarray) -> np.ndarray:
        return np.array(x, copy=True)[None]

    def reduce_scatter(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        check_reduction("reduce_scatter", op)
        return np.array(x, copy=True)

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        if root != 0:
            raise ValueError(f"broadcast: root {root} is not a rank of a job of 1 process")
        return np.array(x, copy=True)

    def ppermute(self, x: np.ndarray, perm: Sequence[tuple[int, int]]) -> np.ndarray:
        check_permutation("ppermute", perm, 1)
        return np.array(x, copy=True) if any(tuple(p) == (0, 0) for p in perm) else np.zeros_like(x)

    def barrier(self) -> None:
        pass

    def __repr__(self) -> str:
        return "LocalEngine(rank=0, size=1)"


_LOCAL = LocalEngine()
_current: list[CollectiveEngine] = [_LOCAL]


def get_engine() -> CollectiveEngine:
    """The engine collectives run on now: the one ``funcgrad.distributed.initialize`` installed, else the local one."""
    return _current[0]


def set_engine(engine: CollectiveEngine | None) -> None:
    """Install ``engine`` (``None``: back to the local engine of one process)."""
    _current[0] = _LOCAL if engine is None else engine


# --- safety: every rank calls the same collective; no collective waits forever -----------------------

class CollectiveMismatchError(RuntimeError):
    """With ``FUNCGRAD_DEBUG_COLLECTIVES=1``: the ranks called different collectives (or the same one
    with different shapes, dtypes, reductions); raised on every rank, naming each rank's call."""


class CollectiveTimeoutError(TimeoutError):
    """A collective did not complete within ``FUNCGRAD_COLLECTIVE_TIMEOUT`` seconds."""


def debug_collectives() -> bool:
    """``FUNCGRAD_DEBUG_COLLECTIVES`` (or ``fg.config.update("debug_collectives", True)``), read per call
    (about a microsecond when neither is set: a collective of 8 floats takes 2 us)."""
    value = _config.config._set.get("debug_collectives")
    if value is not None:
        return value
    if not _config.environment_get(b"FUNCGRAD_DEBUG_COLLECTIVES"):
        return False
    return _config._env_flag("FUNCGRAD_DEBUG_COLLECTIVES")


def collective_timeout() -> float | None:
    """``FUNCGRAD_COLLECTIVE_TIMEOUT`` in seconds, read per call; unset, empty or 0: no timeout."""
    raw = _config.environment_get(b"FUNCGRAD_COLLECTIVE_TIMEOUT")
    if raw is None:
        return None
    text = raw.decode(errors="replace").strip()
    if not text:
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise _config.env_error("FUNCGRAD_COLLECTIVE_TIMEOUT", text, "a number of seconds >= 0 (0: no timeout)",
                                "no timeout")
    return value or None


def describe_call(what: str, x: np.ndarray | None, detail: str = "") -> str:
    """``allreduce(sum) float32[4, 3]``: what the debug check compares between ranks."""
    name = f"{what}({detail})" if detail else what
    if x is None:
        return name
    return f"{name} {np.dtype(x.dtype).name}[{', '.join(str(n) for n in x.shape)}]"


def caller_location() -> str:
    """``file.py:12`` of the innermost frame outside funcgrad: the user's line that led to the collective."""
    import os
    import sys
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(package + os.sep):
            return f"{os.path.basename(filename)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def mismatch_message(calls: Sequence[tuple[str, str]]) -> str | None:
    """``calls[r]`` is rank r's (call, location); None when every rank made the same call."""
    if all(call == calls[0][0] for call, _ in calls):
        return None
    groups: dict[str, list[int]] = {}
    for rank, (call, _) in enumerate(calls):
        groups.setdefault(call, []).append(rank)
    parts = []
    for call, ranks in groups.items():
        where = ", ".join(dict.fromkeys(calls[r][1] for r in ranks))
        names = ", ".join(str(r) for r in ranks)
        parts.append(f"rank{'s' if len(ranks) > 1 else ''} {names}: {call} at {where}")
    return ("ranks disagree on the collective they call (FUNCGRAD_DEBUG_COLLECTIVES=1): " + "; ".join(parts)
            + "; every rank must call the same collectives in the same order with the same shapes and dtypes")


def timeout_message(call: str, rank: int, size: int, seconds: float) -> str:
    return (f"{call}: not complete after {seconds:g} s (FUNCGRAD_COLLECTIVE_TIMEOUT) on rank {rank} of {size}: "
            f"another rank has not called it (it failed, finished, or waits in another collective; "
            f"FUNCGRAD_DEBUG_COLLECTIVES=1 names each rank's call)")
