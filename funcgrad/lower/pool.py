"""A pool of large array buffers for plan replays, so repeated calls do not fault fresh memory in.

glibc serves allocations above its mmap threshold (at most 32 MB) with fresh ``mmap``s and returns
them with ``munmap``: every call of a plan with large outputs or intermediates (a 64 MB GELU output,
the CNN's 37-51 MB activations) made the kernel touch new pages, each a page fault that zeroes 4 KB
(thousands of page faults a CNN step, each one system time: docs/performance.md).

``empty(shape, dtype)`` hands out arrays of at least ``POOL_MIN_BYTES`` from buffers that come back
to the pool when the array and every view of it are gone; a request takes a free buffer of its size,
else the smallest free one at most ``FIT_FACTOR`` times larger (a first CNN step then faults in 280 MB
of fresh memory instead of 340 MB, and the pool holds that much less) (the array's base is a ctypes object whose
``__del__`` returns its memory), as PyTorch's caching allocator does for GPU memory. Smaller arrays
come from ``np.empty``. The pool keeps at most ``FUNCGRAD_POOL_MB`` (default 1024) of free buffers,
dropping the oldest beyond that; ``release()`` empties it. Arrays from the pool behave as any
ndarray (writable, C-contiguous, 64-byte aligned).
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import numpy as np

from funcgrad.util.config import env_int

__all__ = ["allocator", "empty", "release", "stats", "POOL_MIN_BYTES"]

POOL_MIN_BYTES = 1 << 20  # smaller buffers are glibc's business (its heap reuses them without faults)
ALIGN = 64
FIT_FACTOR = 2  # a request without a free buffer of its size takes the smallest free one up to this much larger
_LOCK = threading.Lock()
_FREE: OrderedDict[int, list[Any]] = OrderedDict()  # size -> free raw buffers, least recently freed size first
_STATS = {"hits": 0, "misses": 0, "free_bytes": 0}
_LEASE_TYPES: dict[int, Any] = {}  # size -> its ctypes array type with a __del__


def _limit_bytes() -> int:
    return env_int("FUNCGRAD_POOL_MB", 1024, what="a number of megabytes (0: no pool)") << 20


def _lease_type(size: int) -> Any:
    """A ctypes char array type of ``size`` bytes whose instances give their raw buffer back when they die."""
    kind = _LEASE_TYPES.get(size)
    if kind is None:
        def __del__(self: Any) -> None:  # noqa: N807 - the ctypes object's finaliser
            try:  # noqa: SIM105 - not contextlib: at interpreter exit module globals may be gone
                _give_back(size, self.raw_buffer)
            except Exception:  # noqa: BLE001, S110
                pass
        kind = type(f"PooledBuffer{size}", (ctypes.c_char * size,), {"__del__": __del__})
        _LEASE_TYPES[size] = kind
    return kind


def _give_back(size: int, raw: np.ndarray) -> None:
    limit = _limit_bytes()
    with _LOCK:
        if size > limit:
            return
        _FREE.setdefault(size, []).append(raw)
        _FREE.move_to_end(size)
        _STATS["free_bytes"] += size
        while _STATS["free_bytes"] > limit and _FREE:  # drop the sizes freed longest ago
            oldest, buffers = next(iter(_FREE.items()))
            buffers.pop(0)
            _STATS["free_bytes"] -= oldest
            if not buffers:
                del _FREE[oldest]


def empty(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An uninitialised C-contiguous array, from the pool when it is large (see the module docstring)."""
    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    if size < POOL_MIN_BYTES:
        return np.empty(shape, dtype)
    return _pooled(shape, dtype, size)


def allocator(shape: tuple[int, ...], dtype: np.dtype) -> Callable[[], np.ndarray]:
    """``empty(shape, dtype)`` as a function of no arguments, with the size and the pool-or-not choice
    made once (a plan's replay allocates each output this way; ``empty`` makes that choice again at
    every call: docs/performance.md)."""
    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    if size < POOL_MIN_BYTES:
        return functools.partial(np.empty, shape, dtype)
    return functools.partial(_pooled, shape, dtype, size)


def _pooled(shape: tuple[int, ...], dtype: np.dtype, size: int) -> np.ndarray:
    with _LOCK:
        room = size if size in _FREE else min((free for free in _FREE if size < free <= size * FIT_FACTOR), default=0)
        raw = _FREE[room].pop() if room else None
        if raw is not None:
            _STATS["free_bytes"] -= room
            _STATS["hits"] += 1
            if not _FREE[room]:
                del _FREE[room]
        else:
            _STATS["misses"] += 1
            room = size
    if raw is None:
        padded = np.empty(size + ALIGN, np.uint8)
        offset = (-padded.ctypes.data) % ALIGN
        raw = padded[offset:offset + size]
    lease = _lease_type(room).from_buffer(raw)
    lease.raw_buffer = raw  # kept alive by the lease; given back (as a buffer of ``room`` bytes) by its __del__
    return np.frombuffer(lease, dtype=dtype, count=size // dtype.itemsize).reshape(shape)


def release() -> None:
    """Free every pooled buffer no array uses (they go back to the C library)."""
    with _LOCK:
        _FREE.clear()
        _STATS["free_bytes"] = 0


def stats() -> dict[str, int]:
    """Hits, misses and the bytes held free (for tests and debug.live_counts)."""
    with _LOCK:
        return dict(_STATS)
