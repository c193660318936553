"""Distributed benchmarks (issue 21): the all-reduce through funcgrad against raw mpi4py, and a
data-parallel training step on 2 ranks against 1 rank.

    python3 benchmarks/distributed.py [--quick] [--json out.json] [--tcp]

The script launches its parts with ``mpirun`` itself (as root it sets Open MPI's
``OMPI_ALLOW_RUN_AS_ROOT``); each part runs this file again as a worker on every rank:

* ``allreduce`` (2 ranks): float32 buffers of 8 values to 40 MB, summed over the ranks. Three ways on
  the same buffers, timed in interleaved blocks: raw mpi4py (``comm.Allreduce`` into a preallocated
  buffer), funcgrad's engine (``get_engine().allreduce``, which allocates its result) and
  ``nn.data_parallel.allreduce_gradients`` on a Tensor (read the Tensor, pack, all-reduce, divide,
  make a Tensor). Reported: the median time per call (latency for the small sizes) and the bandwidth
  (bytes of the buffer / time); target: funcgrad >= 90% of raw mpi4py's bandwidth at 40 MB.
* ``step`` (1 rank, then 2 ranks): a data-parallel step of a 784-512-512-10 MLP with Adam, batch
  ``--batch`` rows per rank: ``fg.jit(value_and_grad)``, ``allreduce_gradients``, ``fg.jit(update)``.
  Throughput is rows per second over all ranks; target: 2 ranks >= 1.7x one rank. Open MPI binds each
  rank to one core (``--bind-to core``), and funcgrad then uses one thread per rank (its thread count
  is the CPUs the process may use: ``funcgrad.devices.cpu_threads.thread_count``, printed per rank).

``--tcp`` forces Open MPI's TCP transport over loopback instead of shared memory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # one core a rank: no BLAS threads beside it
os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
SIZES_FLOATS = (8, 256, 8 * 1024, 256 * 1024, 1024 * 1024, 10 * 1024 * 1024)  # 32 B .. 40 MB
TARGET_BANDWIDTH_FRACTION = 0.90
TARGET_SPEEDUP = 1.7


# --- workers (run on every rank under mpirun) --------------------------------------------------------

def _repetitions(nbytes: int, quick: bool) -> int:
    budget = 0.03 if quick else 0.1  # seconds a timed block aims at (at ~5 GB/s, ~5 us latency)
    estimate = 5e-6 + nbytes / 5e9
    return max(2, min(2000, int(budget / estimate)))


def _time_ways(comm: Any, ways: dict[str, Any], reps: int, blocks: int) -> dict[str, float]:
    """The median over ``blocks`` of each way's time per call (the slowest rank's), blocks interleaved
    across the ways so that load on the machine hits each alike."""
    from mpi4py import MPI
    times: dict[str, list[float]] = {name: [] for name in ways}
    for _ in range(blocks):
        for name, way in ways.items():
            way()
            comm.Barrier()
            start = time.perf_counter()
            for _ in range(reps):
                way()
            times[name].append(comm.allreduce((time.perf_counter() - start) / reps, op=MPI.MAX))
    return {name: statistics.median(values) for name, values in times.items()}


def _ways(comm: Any, send: np.ndarray) -> tuple[dict[str, Any], dict[str, Any]]:
    """The three ways of summing ``send`` over the ranks, and for each a call that returns its result."""
    from mpi4py import MPI

    from funcgrad import Tensor
    from funcgrad.nn import data_parallel as dp
    from funcgrad.util.collective_engine import get_engine
    engine, recv, tensor = get_engine(), np.empty_like(send), Tensor(send)
    ways = {"mpi4py": lambda: comm.Allreduce(send, recv, op=MPI.SUM),
            "engine": lambda: engine.allreduce(send, "sum"),
            "allreduce_gradients": lambda: dp.allreduce_gradients(tensor, op="sum").realize()}
    results = {"mpi4py": lambda: (ways["mpi4py"](), recv)[1], "engine": ways["engine"],
               "allreduce_gradients": lambda: dp.allreduce_gradients(tensor, op="sum").numpy()}
    return ways, results


def worker_allreduce(quick: bool) -> list[dict[str, Any]]:
    from mpi4py import MPI

    import funcgrad as fg
    fg.distributed.initialize()
    comm = MPI.COMM_WORLD
    rows = []
    for count in SIZES_FLOATS:
        send = np.random.default_rng(comm.Get_rank()).normal(size=count).astype(np.float32)
        expected = comm.allreduce(float(send.astype(np.float64).sum()))
        ways, results = _ways(comm, send)
        ok = {name: bool(np.isclose(float(np.asarray(result(), np.float64).sum()), expected, rtol=1e-4))
              for name, result in results.items()}
        reps = _repetitions(send.nbytes, quick)
        medians = _time_ways(comm, ways, reps, 3 if quick else 5)
        for name, seconds in medians.items():
            rows.append({"bytes": int(send.nbytes), "way": name, "seconds": seconds,
                         "gb_per_s": send.nbytes / seconds / 1e9, "ok": ok[name], "repetitions": reps})
    return rows


def _mlp(key: Any, sizes: tuple[int, ...]) -> list[dict[str, Any]]:
    import funcgrad.numpy as fnp
    import funcgrad.random as fr
    params = []
    for k, (fan_in, fan_out) in zip(fr.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:])):
        bound = float(np.sqrt(6.0 / fan_in))
        params.append({"w": fr.uniform(k, (fan_in, fan_out), minval=-bound, maxval=bound), "b": fnp.zeros(fan_out)})
    return params


def _training_setup(rank: int, batch: int) -> tuple[Any, ...]:
    """The data-parallel step's pieces on this rank: (jitted value_and_grad, jitted Adam update,
    parameters broadcast from rank 0, optimizer state, this rank's batch x, y)."""
    import funcgrad as fg
    import funcgrad.random as fr
    from funcgrad import Tensor, nn
    from funcgrad.nn import data_parallel as dp
    from funcgrad.nn import functional as F

    def loss_fn(params: list[dict[str, Any]], x: Any, y: Any) -> Any:
        for layer in params[:-1]:
            x = F.relu(x @ layer["w"] + layer["b"])
        return F.cross_entropy(x @ params[-1]["w"] + params[-1]["b"], y)

    optimizer = nn.optim.adam(1e-3)
    params = dp.broadcast(_mlp(fr.key(0), (784, 512, 512, 10)))
    rng = np.random.default_rng(rank)
    x = Tensor(rng.normal(size=(batch, 784)).astype(np.float32))
    y = Tensor(rng.integers(0, 10, batch).astype(np.int32))
    return (fg.jit(fg.value_and_grad(loss_fn)), fg.jit(optimizer.update), params, optimizer.init(params), x, y)


def worker_step(quick: bool, batch: int) -> dict[str, Any]:
    import funcgrad as fg
    from funcgrad.devices.cpu_threads import thread_count
    from funcgrad.nn import data_parallel as dp

    fg.distributed.initialize()
    rank, ranks = fg.distributed.process_index(), fg.distributed.process_count()

    value_and_grad, update, params, state, x, y = _training_setup(rank, batch)

    in_allreduce = [0.0]

    def step() -> None:
        nonlocal params, state
        _, grads = value_and_grad(params, x, y)
        fg.tree.leaves(grads)[-1].realize()
        start = time.perf_counter()
        grads = dp.allreduce_gradients(grads)
        in_allreduce[0] += time.perf_counter() - start
        params, state = update(grads, state, params)
        params[-1]["b"].realize()

    for _ in range(3):  # compile, then settle
        step()
    from funcgrad.util.collective_engine import get_engine
    engine = get_engine()
    steps = 10 if quick else 40
    engine.barrier()
    in_allreduce[0] = 0.0
    start = time.perf_counter()
    for _ in range(steps):
        step()
    engine.barrier()
    seconds = float(engine.allreduce(np.array([(time.perf_counter() - start) / steps]), "max")[0])
    threads = engine.allgather(np.array([thread_count()]))[:, 0].tolist()
    cpus = engine.allgather(np.array([min(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else -1]))
    return {"ranks": ranks, "batch_per_rank": batch, "seconds_per_step": seconds,
            "allreduce_seconds_per_step": in_allreduce[0] / steps, "rows_per_s": ranks * batch / seconds,
            "threads_per_rank": threads, "first_cpu_per_rank": cpus[:, 0].tolist()}


def worker_interleaved(quick: bool, batch: int) -> dict[str, Any]:
    """One 2-rank job that alternates rounds of rank 0 training alone (the local engine; rank 1 sleeps,
    leaving its core free) with rounds of both ranks training together: on a loaded machine each
    ratio compares neighbouring moments. Returns the median of the rounds' throughput ratios."""
    from mpi4py import MPI

    import funcgrad as fg
    from funcgrad.nn import data_parallel as dp
    from funcgrad.util.collective_engine import get_engine, set_engine

    fg.distributed.initialize()
    comm, engine = MPI.COMM_WORLD, get_engine()
    rank = comm.Get_rank()

    value_and_grad, update, params, state, x, y = _training_setup(rank, batch)

    def steps(count: int) -> float:
        nonlocal params, state
        start = time.perf_counter()
        for _ in range(count):
            _, grads = value_and_grad(params, x, y)
            params, state = update(dp.allreduce_gradients(grads), state, params)
            params[-1]["b"].realize()
        return (time.perf_counter() - start) / count

    def idle_barrier() -> None:  # a barrier that sleeps instead of spinning (MPI's Barrier spins)
        request = comm.Ibarrier()
        while not request.Test():
            time.sleep(0.001)

    steps(3)  # compile, then settle (together: the same plans serve both modes)
    per_round = 5 if quick else 12
    alone, independent, together = [], [], []
    for _ in range(3 if quick else 6):
        set_engine(None)
        if rank == 0:
            alone.append(steps(per_round))
        idle_barrier()
        comm.Barrier()  # both ranks at once, each with the local engine: what the machine's cores allow
        independent.append(comm.allreduce(steps(per_round), op=MPI.MAX))
        idle_barrier()
        set_engine(engine)
        comm.Barrier()
        together.append(float(engine.allreduce(np.array([steps(per_round)]), "max")[0]))
    alone = comm.bcast(alone)
    ratios = [2 * a / t for a, t in zip(alone, together)]
    ceilings = [2 * a / i for a, i in zip(alone, independent)]
    return {"batch_per_rank": batch, "alone_seconds": alone, "independent_seconds": independent,
            "together_seconds": together, "speedups": ratios, "speedup": statistics.median(ratios),
            "ceilings": ceilings, "ceiling": statistics.median(ceilings)}


# --- the driver ---------------------------------------------------------------------------------------

def _mpirun() -> str:
    found = shutil.which("mpirun", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if found is None:
        raise SystemExit("benchmarks/distributed.py: mpirun is not installed; pip install funcgrad[distributed] "
                         "(mpi4py and Open MPI)")
    return found


def launch(ranks: int, worker: str, arguments: list[str], tcp: bool, timeout: float = 600.0) -> Any:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    command = [_mpirun(), "-n", str(ranks), "--bind-to", "core", "-x", "PYTHONPATH", "-x", "OPENBLAS_NUM_THREADS",
               "-x", "OMP_NUM_THREADS"]
    if tcp:
        command += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]
    command += [sys.executable, "-m", "mpi4py", str(Path(__file__).resolve()), "--worker", worker, *arguments]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=timeout)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}")
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    return json.loads(lines[0][len("RESULT "):])


def _size(nbytes: int) -> str:
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:g} {unit}"
    return f"{nbytes} B"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter repetitions")
    parser.add_argument("--json", default=None, help="write the figures here")
    parser.add_argument("--tcp", action="store_true", help="Open MPI's TCP transport over loopback")
    parser.add_argument("--batch", type=int, default=256, help="rows per rank of the data-parallel step")
    parser.add_argument("--worker", choices=["allreduce", "step", "interleaved"], help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.worker:
        workers = {"allreduce": lambda: worker_allreduce(args.quick),
                   "step": lambda: worker_step(args.quick, args.batch),
                   "interleaved": lambda: worker_interleaved(args.quick, args.batch)}
        result = workers[args.worker]()
        from funcgrad.distributed import process_index
        if process_index() == 0:
            print("RESULT " + json.dumps(result), flush=True)
        return

    flags = ["--quick"] if args.quick else []
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f} at the start "
          f"(other processes share the cores: compare the ratios, not the times)")
    rows = launch(2, "allreduce", flags, args.tcp)
    print(f"\nallreduce of float32 over 2 ranks ({'TCP loopback' if args.tcp else 'default transport'}): "
          "median time per call and bandwidth (buffer bytes / time)")
    print(f"{'size':>8}  {'mpi4py':>18}  {'funcgrad engine':>24}  {'allreduce_gradients':>24}")
    by_size: dict[int, dict[str, Any]] = {}
    for row in rows:
        by_size.setdefault(row["bytes"], {})[row["way"]] = row
    for nbytes, ways in by_size.items():
        raw = ways["mpi4py"]
        cells = [f"{raw['seconds'] * 1e6:9.1f} us {raw['gb_per_s']:5.2f} GB/s"]
        for name in ("engine", "allreduce_gradients"):
            row = ways[name]
            share = raw["seconds"] / row["seconds"]
            cells.append(f"{row['seconds'] * 1e6:9.1f} us {row['gb_per_s']:5.2f} GB/s {share:4.0%}"
                         + ("" if row["ok"] else " WRONG"))
        print(f"{_size(nbytes):>8}  " + "  ".join(cells))
    largest = by_size[max(by_size)]
    fraction = {name: largest["mpi4py"]["seconds"] / largest[name]["seconds"]
                for name in ("engine", "allreduce_gradients")}

    one = launch(1, "step", flags + ["--batch", str(args.batch)], args.tcp)
    two = launch(2, "step", flags + ["--batch", str(args.batch)], args.tcp)
    separate = two["rows_per_s"] / one["rows_per_s"]
    mixed = launch(2, "interleaved", flags + ["--batch", str(args.batch)], args.tcp)
    speedup = mixed["speedup"]
    print(f"\ndata-parallel step (784-512-512-10 MLP, Adam, batch {args.batch} a rank, one core and "
          f"{one['threads_per_rank'][0]} funcgrad thread a rank):")
    for result in (one, two):
        print(f"  {result['ranks']} rank(s): {result['seconds_per_step'] * 1e3:7.2f} ms a step "
              f"({result['allreduce_seconds_per_step'] * 1e3:.2f} ms of it in allreduce_gradients), "
              f"{result['rows_per_s']:8.0f} rows/s (threads per rank {result['threads_per_rank']}, "
              f"first CPUs {result['first_cpu_per_rank']})")
    print(f"  separate jobs: 2 ranks {separate:.2f}x one rank's rows/s")
    print(f"  interleaved in one job (rank 0 alone, then both, {len(mixed['speedups'])} rounds): 2 ranks "
          f"{speedup:.2f}x (median; rounds {', '.join(f'{r:.2f}' for r in mixed['speedups'])}; "
          f"alone {statistics.median(mixed['alone_seconds']) * 1e3:.1f} ms, together "
          f"{statistics.median(mixed['together_seconds']) * 1e3:.1f} ms a step)")
    print(f"  the machine's ceiling: both ranks stepping at once without communicating, "
          f"{mixed['ceiling']:.2f}x one rank alone ({statistics.median(mixed['independent_seconds']) * 1e3:.1f} ms "
          f"a step); data-parallel efficiency against it {speedup / mixed['ceiling']:.0%}")
    largest_size = _size(max(by_size))
    bandwidth_met = min(fraction.values()) >= TARGET_BANDWIDTH_FRACTION
    print(f"\ntargets: allreduce at {largest_size}: engine {fraction['engine']:.0%}, allreduce_gradients "
          f"{fraction['allreduce_gradients']:.0%} of raw mpi4py's bandwidth (target >= "
          f"{TARGET_BANDWIDTH_FRACTION:.0%}: {'met' if bandwidth_met else 'not met'}); "
          f"2 ranks {speedup:.2f}x one rank's throughput (target >= {TARGET_SPEEDUP}x: "
          f"{'met' if speedup >= TARGET_SPEEDUP else 'not met'})")
    if args.json:
        Path(args.json).write_text(json.dumps({"allreduce": rows, "step": [one, two], "interleaved": mixed,
                                               "speedup": speedup, "separate_speedup": separate,
                                               "bandwidth_fraction": fraction, "tcp": args.tcp}, indent=1))


if __name__ == "__main__":
    main()
