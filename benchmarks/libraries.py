"""funcgrad's own code against the well-kept libraries issue 22 weighed (docs/architecture.md, "Well-kept
libraries"): safetensors checkpoint save/load (200 MB) and pytree flatten/unflatten (optree) on a
100-leaf pytree with the jitted call taking it (a dict and a list of 100 arrays), against another
checkout (`--before`, e.g. the commit before util/tree.py moved onto optree). Rounds are interleaved;
read ratios, not absolute times.

    python3 benchmarks/libraries.py [--quick] [--pytrees-only] [--before CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
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


def pytree_round(number: int) -> dict[str, float]:
    """One round of the 100-leaf pytree figures (us) for the funcgrad this process imports."""
    params = {f"layer{i}": {"w": fnp.ones(2), "b": fnp.zeros(2)} for i in range(50)}  # 100 leaves
    as_list = [fnp.ones(2) for _ in range(100)]
    leaves, treedef = tree.flatten(params)

    def best(fn, n: int = number) -> float:
        # process CPU time: on a loaded machine wall time mostly measures the waits for a core
        return min(timeit.repeat(fn, number=n, repeat=5, timer=time.process_time)) / n * 1e6

    step = fg.jit(lambda p: fg.tree.map(lambda x: x + 1, p))
    step_list = fg.jit(lambda p: [x + 1 for x in p])
    step(params), step_list(as_list)
    figures = {"flatten": best(lambda: tree.flatten(params)), "unflatten": best(lambda: treedef.unflatten(leaves)),
               "jit dict": best(lambda: step(params), max(1, number // 10)),
               "jit list": best(lambda: step_list(as_list), max(1, number // 10))}
    try:
        import optree
    except ImportError:
        return figures
    o_leaves, o_treedef = optree.tree_flatten(params)
    figures["optree flatten"] = best(lambda: optree.tree_flatten(params))
    figures["optree unflatten"] = best(lambda: optree.tree_unflatten(o_treedef, o_leaves))
    return figures


def pytrees(number: int, rounds: int, before: str | None) -> None:
    """100-leaf pytree figures; with ``before`` (a checkout of funcgrad, e.g. the commit before
    util/tree.py moved onto optree), rounds of it and of this checkout alternate, each in its own
    process."""
    print("100-leaf pytree (dict of 50 dicts of 2 arrays; jit list: a list of 100), best of 5, CPU us:")
    checkouts = [("before", before), ("now", os.path.dirname(os.path.dirname(os.path.abspath(__file__))))] \
        if before else [("now", None)]
    for _ in range(rounds):
        for name, path in checkouts:
            if path is None:
                figures = pytree_round(number)
            else:
                env = dict(os.environ, PYTHONPATH=path)
                code = (f"import json, runpy; ns = runpy.run_path({os.path.abspath(__file__)!r}); "
                        f"print(json.dumps(ns['pytree_round']({number})))")
                out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True, cwd=path).stdout
                figures = json.loads(out.strip().splitlines()[-1])
            print(f"  {name:6s} " + ", ".join(f"{k} {v:7.1f}" for k, v in figures.items()))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke test)")
    parser.add_argument("--pytrees-only", action="store_true", help="skip the checkpoint figures")
    parser.add_argument("--before", metavar="CHECKOUT", help="another funcgrad checkout to alternate "
                        "pytree rounds with (e.g. git worktree add /tmp/fg-before <commit>)")
    args = parser.parse_args()
    if not args.pytrees_only:
        checkpoint(arrays=2 if args.quick else 50, rounds=1 if args.quick else 4)
    pytrees(number=20 if args.quick else 2000, rounds=1 if args.quick else 3, before=args.before)
