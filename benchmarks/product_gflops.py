"""GFLOP/s of product kernels, by wall time and per CPU-second (the process's CPU time over each call:
robust to other processes' turns on a shared machine), funcgrad and JAX interleaved (docs/performance.md).

    PYTHONPATH=. python3 benchmarks/product_gflops.py [name fragment ...]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import funcgrad as fg
import funcgrad.numpy as fnp

Case = tuple[str, Callable[[Any], Callable[..., Any]], tuple[tuple[int, ...], ...], int]
CASES: list[Case] = [  # name, the product given a NumPy-like namespace, operand shapes, multiply-adds
    ("matmul 1024^3", lambda xp: lambda a, b: a @ b, ((1024, 1024), (1024, 1024)), 1024 ** 3),
    ("batched 96x(64x64@64x64)", lambda xp: lambda a, b: a @ b, ((96, 64, 64), (96, 64, 64)), 96 * 64 ** 3),
    ("batched 12x(256x192@(320x192).T)", lambda xp: lambda a, b: a @ xp.swapaxes(b, -1, -2),
     ((12, 256, 192), (12, 320, 192)), 12 * 256 * 192 * 320),
    ("scores 16x8x(256x64@(256x64).T)", lambda xp: lambda a, b: a @ xp.swapaxes(b, -1, -2),
     ((16, 8, 256, 64), (16, 8, 256, 64)), 128 * 256 * 256 * 64),
    ("x(8,128,256) @ W(256,768)", lambda xp: lambda a, b: a @ b, ((8, 128, 256), (256, 768)), 1024 * 256 * 768),
    ("dY(8,128,768) @ W(256,768).T", lambda xp: lambda a, b: xp.einsum("btn,kn->btk", a, b),
     ((8, 128, 768), (256, 768)), 1024 * 256 * 768),
    ("x.T @ dY over (8,128): dW", lambda xp: lambda a, b: xp.einsum("btk,btn->kn", a, b),
     ((8, 128, 256), (8, 128, 768)), 1024 * 256 * 768),
    ("2-D x(1024,256) @ W(256,768)", lambda xp: lambda a, b: a @ b, ((1024, 256), (256, 768)), 1024 * 256 * 768),
    ("2-D dY(1024,768) @ W(256,768).T", lambda xp: lambda a, b: a @ b.T, ((1024, 768), (256, 768)), 1024 * 256 * 768),
    ("2-D x.T @ dY: dW", lambda xp: lambda a, b: a.T @ b, ((1024, 256), (1024, 768)), 1024 * 256 * 768),
]


def main(fragments: list[str]) -> None:
    rng = np.random.default_rng(0)
    for name, make, shapes, macs in CASES:
        if fragments and not any(fragment in name for fragment in fragments):
            continue
        args = [rng.standard_normal(shape, dtype=np.float32) for shape in shapes]
        f, j = fg.jit(make(fnp)), jax.jit(make(jnp))
        fa, ja = [fnp.asarray(a) for a in args], [jax.device_put(a) for a in args]
        calls = {"fg": lambda f=f, fa=fa: f(*fa).realize(), "jax": lambda j=j, ja=ja: j(*ja).block_until_ready()}
        for call in (*calls.values(), *calls.values()):  # compile and warm up
            call()
        wall: dict[str, list[float]] = {key: [] for key in calls}
        cpu: dict[str, list[float]] = {key: [] for key in calls}
        for _ in range(7):
            for key, call in calls.items():
                started, cpu_started = time.perf_counter(), time.process_time()
                call()
                wall[key].append(time.perf_counter() - started)
                cpu[key].append(time.process_time() - cpu_started)
        gflop = 2.0 * macs / 1e9
        print(f"{name:36s}  " + "  ".join(f"{key} {gflop / np.median(wall[key]):6.1f} wall, "
                                          f"{gflop / np.median(cpu[key]):6.1f} per CPU-s" for key in calls), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
