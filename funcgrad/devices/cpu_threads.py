"""The CPU's threads: the Python worker pool threaded kernels use where the native pool (``cpu_pool``)
does not run, the threads that run LLVM for ``CPUDevice.compile_many``, and ``thread_count`` (the
CPUs this process may use; tests pin it here)."""

from __future__ import annotations

import contextlib
import functools
import os
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

_POOL_LOCK = threading.Lock()  # one pool, even when threads make their first parallel call at once


class _WorkerPool:
    """Persistent daemon threads, one per extra CPU; the calling thread runs the first chunk. Threaded
    kernels use it where the native pool (``cpu_pool``) is off, unsupported or not built yet.

    Workers are not pinned to CPUs (``FUNCGRAD_PIN_WORKERS=1`` pins worker k to the k+1-th CPU, as
    before): the caller is not pinned, and a worker's wake-up of the caller (the last chunk done) lets
    the scheduler place the caller on the worker's CPU, so the next launch's worker, pinned there,
    waited for the caller's whole chunk: two chunks ran one after the other on one CPU (seen here:
    the caller on the worker's CPU after 40 of 40 launches)."""

    def __init__(self, workers: int) -> None:
        self.tasks: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], queue.SimpleQueue[Any]]] = \
            queue.SimpleQueue()
        pin = os.environ.get("FUNCGRAD_PIN_WORKERS") == "1" and hasattr(os, "sched_getaffinity")
        cpus = sorted(os.sched_getaffinity(0)) if pin else []
        for number in range(workers):
            cpu = cpus[(number + 1) % len(cpus)] if cpus else None
            threading.Thread(target=self._work, args=(cpu,), name=f"funcgrad-cpu-{number}", daemon=True).start()
        self.workers = workers

    def _work(self, cpu: int | None) -> None:
        if cpu is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, {cpu})
        while True:
            function, arguments, done = self.tasks.get()
            try:
                function(*arguments)
                done.put(None)
            except BaseException as error:  # noqa: BLE001 - handed back to the caller
                done.put(error)

    def run(self, function: Callable[..., Any], argument_sets: Sequence[tuple[Any, ...]]) -> None:
        if not self.workers:  # one CPU (a kernel's thread opt may still ask for chunks): the caller runs them all
            for arguments in argument_sets:
                function(*arguments)
            return
        done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for arguments in argument_sets[1:]:
            self.tasks.put((function, arguments, done))
        function(*argument_sets[0])
        errors = [done.get() for _ in argument_sets[1:]]
        for error in errors:
            if error is not None:
                raise error


_compile_pool_lock = threading.Lock()  # one compile_many at a time uses the pool's threads


def compile_cost(source: str, pipeline: int) -> float:
    """A rough estimate of LLVM's milliseconds for ``source`` at ``pipeline`` (to compile the heaviest
    first): mostly code generation, in proportion to its lines, plus a constant for a standard
    pipeline's passes (coefficients measured: docs/performance.md)."""
    lines = source.count("\n")
    return lines * (0.02 if pipeline == 0 else 0.035) + (0.0 if pipeline in (0, 5) else 10.0)


@functools.cache
def compile_pool() -> ThreadPoolExecutor:
    """Threads that run LLVM for ``CPUDevice.compile_many`` (one per CPU)."""
    return ThreadPoolExecutor(max_workers=thread_count(), thread_name_prefix="funcgrad-llvm")


def thread_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@functools.cache
def _make_worker_pool() -> _WorkerPool:
    return _WorkerPool(thread_count() - 1)


def worker_pool() -> _WorkerPool:
    with _POOL_LOCK:
        return _make_worker_pool()
