"""funcgrad.distributed's runtime on 2 real ranks: initialize's checks, the engine's collectives with
and without the debug check and the timeout, an uncaught exception or a killed rank ending the job,
mismatched collectives caught, a hang turned into an error."""

from __future__ import annotations

import json
import re
import time

import pytest
from launch import RanksResult, run_ranks

COLLECTIVES = r"""
import json, os
import numpy as np
import funcgrad.distributed as dist
engine = dist.initialize(num_processes=2, process_id=int(os.environ["OMPI_COMM_WORLD_RANK"]))
r = dist.process_index()
results = {}
for debug, timeout in (("0", ""), ("1", ""), ("0", "30"), ("1", "30")):
    os.environ["FUNCGRAD_DEBUG_COLLECTIVES"], os.environ["FUNCGRAD_COLLECTIVE_TIMEOUT"] = debug, timeout
    x = np.arange(6, dtype=np.float32).reshape(3, 2) + 10 * r
    got = [engine.allreduce(x).tolist(), engine.allreduce(x, "max").tolist(), engine.allgather(x).tolist(),
           engine.reduce_scatter(np.arange(4.0) + r).tolist(), engine.broadcast(x, root=1).tolist(),
           engine.ppermute(x, [(0, 1), (1, 0)]).tolist()]
    engine.barrier()
    buffer = np.zeros_like(x)
    assert engine.allreduce(x, out=buffer) is buffer and buffer.tolist() == got[0]
    results[debug + timeout] = got
print(json.dumps([dist.process_index(), dist.process_count(), engine.name, dist.launched_by(), results]))
os.environ["FUNCGRAD_DEBUG_COLLECTIVES"], os.environ["FUNCGRAD_COLLECTIVE_TIMEOUT"] = "0", ""
"""


@pytest.fixture(scope="module")
def sections() -> list[dict[str, list[str]]]:
    """One job runs the three programs that end normally (each mpirun costs seconds): per rank, each
    program's lines."""
    code = "\n".join(f"print('=== {name}')\n{text}" for name, text in
                     (("collectives", COLLECTIVES), ("mismatch", MISMATCH), ("checks", CHECKS)))
    result: RanksResult = run_ranks(code, n=2, timeout=90).check()
    per_rank = []
    for out in result.stdout:
        found: dict[str, list[str]] = {}
        for line in out.splitlines():
            if line.startswith("=== "):
                current = found.setdefault(line[4:], [])
            else:
                current.append(line)
        per_rank.append(found)
    return per_rank


def test_collectives_every_mode(sections: list[dict[str, list[str]]]) -> None:
    import numpy as np
    xs = [np.arange(6, dtype=np.float32).reshape(3, 2) + 10 * r for r in range(2)]
    for rank, found in enumerate(sections):
        (line,) = found["collectives"]
        index, count, name, launcher, results = json.loads(line)
        assert (index, count, name, launcher) == (rank, 2, "mpi", "Open MPI (mpirun)")
        assert len(results) == 4
        scatter = (np.arange(4.0) * 2 + 1)[2 * rank: 2 * rank + 2]
        expected = [(xs[0] + xs[1]).tolist(), np.maximum(xs[0], xs[1]).tolist(), np.stack(xs).tolist(),
                    scatter.tolist(), xs[1].tolist(), xs[1 - rank].tolist()]
        for mode, got in results.items():
            assert got == expected, (rank, mode)


CHECKS = r"""
import funcgrad.distributed as dist
from funcgrad.distributed import DistributedError
for kwargs in ({"num_processes": 3}, {"process_id": 5}):
    try:
        dist.initialize(**kwargs)
    except DistributedError as error:
        print("error:", error)
try:
    dist.initialize(coordinator_address="nohost")
except ValueError as error:
    print("error:", error)
dist.initialize(coordinator_address="10.0.0.1:1234")
print("ok", dist.process_index(), dist.process_count(), dist.coordinator_address())
dist.shutdown()
print("after shutdown", dist.process_count(), dist.is_initialized())
"""


def test_initialize_checks_against_the_launcher(sections: list[dict[str, list[str]]]) -> None:
    for rank, found in enumerate(sections):
        lines = found["checks"]
        assert lines[0] == ("error: funcgrad.distributed.initialize: num_processes=3, but the job (Open MPI "
                            "(mpirun), engine mpi) has 2 processes")
        assert lines[1] == (f"error: funcgrad.distributed.initialize: process_id=5, but the launcher (Open MPI "
                            f"(mpirun), engine mpi) made this process rank {rank} of 2")
        assert lines[2] == "error: funcgrad.distributed.initialize: coordinator_address 'nohost' is not 'host:port'"
        assert lines[3:] == [f"ok {rank} 2 10.0.0.1:1234", "after shutdown 1 False"]


def _seconds_since_the_failure(result: RanksResult) -> float:
    """From rank 1's "failing at <time>" to now (just after mpirun ended): about 0.05 s for an exception,
    0.3 s for SIGKILL on an idle machine."""
    (line,) = [line for line in result.stdout[1].splitlines() if line.startswith("failing at")]
    return time.time() - float(line.split()[-1])


RAISES = r"""
import sys, time
import numpy as np
import funcgrad.distributed as dist
engine = dist.initialize()
engine.barrier()
if dist.process_index() == 1:
    print("failing at", time.time())
    raise ValueError("rank 1 fails on purpose")
engine.allreduce(np.ones(4))   # rank 0 waits here for a rank that is gone
print("rank 0 got past the allreduce")
"""


def test_uncaught_exception_aborts_the_job() -> None:
    # plain python (no `-m mpi4py`): funcgrad's own hook must end the job
    result = run_ranks(RAISES, n=2, timeout=30, mpi4py_main=False)
    assert result.returncode != 0, result.describe()
    assert _seconds_since_the_failure(result) < 5, result.describe()
    assert "rank 0 got past" not in result.stdout[0]
    assert "ValueError: rank 1 fails on purpose" in result.stderr[1]
    assert "funcgrad.distributed: rank 1 of 2 raised ValueError; aborting the job (MPI_Abort)" in result.stderr[1]


KILLED = r"""
import os, signal, time
import numpy as np
import funcgrad.distributed as dist
engine = dist.initialize()
engine.barrier()
if dist.process_index() == 1:
    print("failing at", time.time())
    os.kill(os.getpid(), signal.SIGKILL)
engine.allreduce(np.ones(4))
print("rank 0 got past the allreduce")
"""


def test_killed_rank_ends_the_job() -> None:
    result = run_ranks(KILLED, n=2, timeout=30, mpi4py_main=False)
    assert result.returncode != 0, result.describe()
    assert _seconds_since_the_failure(result) < 5, result.describe()
    assert "rank 0 got past" not in result.stdout[0]


MISMATCH = r"""
import os
import numpy as np
import funcgrad.distributed as dist
from funcgrad.distributed import CollectiveMismatchError
os.environ["FUNCGRAD_DEBUG_COLLECTIVES"] = "1"
engine = dist.initialize()
r = dist.process_index()
calls = [lambda: engine.allreduce(np.ones(4, np.float32)) if r == 0 else engine.allgather(np.ones(3, np.float32)),
         lambda: engine.allreduce(np.ones((2, 3))) if r == 0 else engine.allreduce(np.ones((2, 4))),
         lambda: engine.allreduce(np.ones(2), "sum" if r == 0 else "max")]
for call in calls:
    try:
        call()
        print("no error")
    except CollectiveMismatchError as error:
        print(str(error))
print("same call:", engine.allreduce(np.ones(2)).tolist())
os.environ["FUNCGRAD_DEBUG_COLLECTIVES"] = "0"
"""


def test_debug_mode_catches_mismatched_collectives(sections: list[dict[str, list[str]]]) -> None:
    tail = "; every rank must call the same collectives in the same order with the same shapes and dtypes"
    for rank, found in enumerate(sections):
        lines = [re.sub(r"program\.py:\d+", "program.py:N", line) for line in found["mismatch"]]
        mine = ["allreduce(sum) float32[4]", "allgather float32[3]"][rank]
        assert lines[0] == (f"{mine} on rank {rank}: ranks disagree on the collective they call "
                            f"(FUNCGRAD_DEBUG_COLLECTIVES=1): rank 0: allreduce(sum) float32[4] at program.py:N; "
                            f"rank 1: allgather float32[3] at program.py:N" + tail)
        assert "rank 0: allreduce(sum) float64[2, 3] at program.py:N; rank 1: allreduce(sum) float64[2, 4]" in lines[1]
        assert "rank 0: allreduce(sum) float64[2] at program.py:N; rank 1: allreduce(max) float64[2]" in lines[2]
        assert lines[3] == "same call: [2.0, 2.0]"


HANG = r"""
import time
import numpy as np
import funcgrad.distributed as dist
engine = dist.initialize()
engine.barrier()
if dist.process_index() == 1:
    time.sleep(60)   # never joins the allreduce
engine.allreduce(np.ones((2, 2), np.float32))
"""


def test_timeout_turns_a_hang_into_an_error() -> None:
    result = run_ranks(HANG, n=2, timeout=40, mpi4py_main=False, env={"FUNCGRAD_COLLECTIVE_TIMEOUT": "1.5"})
    assert result.returncode != 0, result.describe()
    assert result.seconds < 20, result.describe()
    assert ("CollectiveTimeoutError: allreduce(sum) float32[2, 2]: not complete after 1.5 s "
            "(FUNCGRAD_COLLECTIVE_TIMEOUT) on rank 0 of 2") in result.stderr[0], result.describe()
    assert "rank 0 of 2 raised CollectiveTimeoutError; aborting the job" in result.stderr[0]
