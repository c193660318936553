"""GB/s of memory-bound kernels against this machine's copy bandwidth (issue 18, item 6; docs/performance.md).

    PYTHONPATH=. python3 benchmarks/memory_bandwidth.py [name fragment ...]

The copy bandwidth is an ``np.copyto`` of the kernels' size (2^22 float32, 16 MiB: inside this machine's
300 MiB L3) and of 512 MiB (past it), on one thread and on one thread per CPU (each copying its share;
NumPy releases the GIL for the copy), counting the bytes read plus the bytes written, as STREAM's "copy"
does. Each kernel's GB/s is its compulsory traffic (every input read once, every output written once; a
key or a scalar counts as nothing) over its median wall time, for ``fg.jit`` and ``jax.jit`` interleaved;
the last column is funcgrad's GB/s over the best copy bandwidth of the kernels' size. Wall time: on a
shared machine the figures are the load's, not the machine's. The samplers are compute-bound (the hash,
and erfinv's ``log``/``sqrt`` for normal): their GB/s says how far from the memory bound they are.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import funcgrad as fg
import funcgrad.numpy as fnp
import funcgrad.random as fr

N = 1 << 22  # elements of the kernels' arrays (16 MiB of float32: past L2, inside this machine's 300 MiB L3)
BIG = 1 << 27  # a copy of 512 MiB float32: past the L3, from memory
REPEATS = 7


def copy_bandwidth(threads: int, floats: int) -> float:
    """GB/s (read + written bytes) of copying ``floats`` float32 with ``threads`` threads, best of REPEATS."""
    source = np.ones(floats, dtype=np.float32)
    target = np.empty_like(source)
    bounds = [floats * k // threads for k in range(threads + 1)]
    parts = [(target[lo:hi], source[lo:hi]) for lo, hi in zip(bounds, bounds[1:])]
    np.copyto(target, source)  # fault the pages in
    best = float("inf")
    for _ in range(REPEATS):
        workers = [threading.Thread(target=np.copyto, args=part) for part in parts[1:]]
        started = time.perf_counter()
        for worker in workers:
            worker.start()
        np.copyto(*parts[0])
        for worker in workers:
            worker.join()
        best = min(best, time.perf_counter() - started)
    return 2 * source.nbytes / best / 1e9


# name, funcgrad's function, JAX's, the inputs (NumPy arrays; "key" for a random key), bytes moved
Case = tuple[str, Callable[..., Any], Callable[..., Any], list[Any], int]


def cases() -> list[Case]:
    rng = np.random.default_rng(1)
    x, y, z = (rng.standard_normal(N, dtype=np.float32) for _ in range(3))
    rows = rng.standard_normal((N // 4096, 4096), dtype=np.float32)
    floats = 4 * N

    def gelu(xp: Any) -> Callable[[Any], Any]:
        return lambda a: 0.5 * a * (1.0 + xp.tanh(0.7978845608 * (a + 0.044715 * a * a * a)))

    def softmax(xp: Any) -> Callable[[Any], Any]:
        def run(a: Any) -> Any:
            e = xp.exp(a - xp.max(a, axis=-1, keepdims=True))
            return e / xp.sum(e, axis=-1, keepdims=True)
        return run
    return [
        ("random.normal 2^22", lambda k: fr.normal(k, (N,)), lambda k: jax.random.normal(k, (N,)), ["key"], floats),
        ("random.uniform 2^22", lambda k: fr.uniform(k, (N,)), lambda k: jax.random.uniform(k, (N,)), ["key"], floats),
        ("random.bernoulli 2^22", lambda k: fr.bernoulli(k, 0.3, (N,)), lambda k: jax.random.bernoulli(k, 0.3, (N,)),
         ["key"], N),
        ("copy-like x * 1.5", lambda a: a * 1.5, lambda a: a * 1.5, [x], 2 * floats),
        ("x * y + z", lambda a, b, c: a * b + c, lambda a, b, c: a * b + c, [x, y, z], 4 * floats),
        ("gelu (tanh)", gelu(fnp), gelu(jnp), [x], 2 * floats),
        ("sum", lambda a: fnp.sum(a), lambda a: jnp.sum(a), [x], floats),
        ("softmax rows of 4096", softmax(fnp), softmax(jnp), [rows], 2 * floats),
    ]


def main(fragments: list[str]) -> None:
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    bandwidth = {}
    for floats in (N, BIG):
        bandwidth[floats] = [copy_bandwidth(1, floats), copy_bandwidth(cpus, floats)]
        print(f"copy bandwidth, np.copyto of {floats * 4 >> 20} MiB (read + write, best of {REPEATS}): "
              f"{bandwidth[floats][0]:.1f} GB/s on 1 thread, {bandwidth[floats][1]:.1f} GB/s on {cpus}")
    peak = max(bandwidth[N])  # the kernels' arrays are the small copy's size
    print(f"load average {os.getloadavg()[0]:.1f}; fg/copy: against {peak:.1f} GB/s (the {N * 4 >> 20} MiB copy)")
    for name, fg_fn, jax_fn, inputs, moved in cases():
        if fragments and not any(fragment in name for fragment in fragments):
            continue
        fa = [fr.key(0) if isinstance(a, str) else fnp.asarray(a) for a in inputs]
        ja = [jax.random.PRNGKey(0) if isinstance(a, str) else jax.device_put(a) for a in inputs]
        f, j = fg.jit(fg_fn), jax.jit(jax_fn)
        calls = {"fg": lambda f=f, fa=fa: f(*fa).realize(), "jax": lambda j=j, ja=ja: j(*ja).block_until_ready()}
        for call in (*calls.values(), *calls.values()):  # compile and warm up
            call()
        wall: dict[str, list[float]] = {key: [] for key in calls}
        for _ in range(REPEATS):
            for key, call in calls.items():
                started = time.perf_counter()
                call()
                wall[key].append(time.perf_counter() - started)
        rates = {key: moved / float(np.median(times)) / 1e9 for key, times in wall.items()}
        ms = {key: float(np.median(times)) * 1e3 for key, times in wall.items()}
        print(f"{name:24s} {moved / 1e6:6.1f} MB  fg {ms['fg']:7.2f} ms {rates['fg']:6.2f} GB/s  "
              f"jax {ms['jax']:7.2f} ms {rates['jax']:6.2f} GB/s  fg/copy {rates['fg'] / peak:5.1%}")


if __name__ == "__main__":
    main(sys.argv[1:])
