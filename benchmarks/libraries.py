"""funcgrad's own code against the well-kept libraries issue 22 weighed (docs/architecture.md, "Well-kept
libraries"): safetensors checkpoint save/load (200 MB) and pytree flatten/unflatten (optree) on a
100-leaf pytree with the jitted call taking it. Rounds are interleaved; read ratios, not absolute times.

    python3 benchmarks/libraries.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import timeit

import numpy as np

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor
from funcgrad.core.tensor import tensor_from_host
from funcgrad.nn.state import safe_load, safe_save
from funcgrad.util import tree


def checkpoint(arrays: int, rounds: int) -> None:
    from safetensors import safe_open
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    state = {f"layer{i}.weight": Tensor(rng.standard_normal((1000, 1000), dtype=np.float32)) for i in range(arrays)}
    folder = tempfile.mkdtemp()

    def package_save(path: str) -> None:  # with the same atomic, durable write around it
        fd, temp = tempfile.mkstemp(dir=folder)
        os.close(fd)
        save_file({k: np.asarray(v) for k, v in state.items()}, temp)
        with open(temp, "rb+") as file:
            os.fsync(file.fileno())
        os.replace(temp, path)

    def package_load(path: str) -> dict[str, Tensor]:
        with safe_open(path, framework="np") as opened:
            return {k: tensor_from_host(opened.get_tensor(k)) for k in opened.keys()}  # noqa: SIM118

    def timed(fn) -> float:
        start = time.perf_counter()
        fn()
        return time.perf_counter() - start

    ours, theirs = os.path.join(folder, "ours.safetensors"), os.path.join(folder, "package.safetensors")
    print(f"checkpoint of {arrays * 4} MB ({arrays} float32 arrays of 1000 x 1000):")
    for _ in range(rounds):
        a, b = timed(lambda: safe_save(state, ours)), timed(lambda: package_save(theirs))
        c, d = timed(lambda: safe_load(ours)), timed(lambda: package_load(theirs))
        print(f"  save: funcgrad {a:.3f} s, package {b:.3f} s | load: funcgrad {c:.3f} s, package {d:.3f} s")


def pytrees(number: int) -> None:
    params = {f"layer{i}": {"w": fnp.ones(2), "b": fnp.zeros(2)} for i in range(50)}  # 100 leaves
    leaves, treedef = tree.flatten(params)

    def best(fn, n: int = number) -> float:
        return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6

    step = fg.jit(lambda p: fg.tree.map(lambda x: x + 1, p))
    step(params)
    try:
        import optree
    except ImportError:
        optree = None
    o_leaves, o_treedef = optree.tree_flatten(params) if optree is not None else (None, None)
    print("100-leaf pytree (best of 5):")
    for _ in range(2):
        line = f"  flatten funcgrad {best(lambda: tree.flatten(params)):7.1f} us"
        line += f", unflatten {best(lambda: treedef.unflatten(leaves)):7.1f} us"
        if optree is not None:
            line += f" | optree flatten {best(lambda: optree.tree_flatten(params)):7.1f} us"
            line += f", unflatten {best(lambda: optree.tree_unflatten(o_treedef, o_leaves)):7.1f} us"
        print(line + f" | jitted call taking it {best(lambda: step(params), max(1, number // 10)):8.1f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    args = parser.parse_args()
    checkpoint(arrays=2 if args.quick else 50, rounds=1 if args.quick else 4)
    pytrees(number=20 if args.quick else 2000)
