"""initialize's detection and checks, the abort hook and the safety settings, in this process (no
mpirun): the launcher's variables and the engine are faked where a real job would set them."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.distributed as dist
from funcgrad.util import collective_engine
from funcgrad.util.config import EnvironmentVariableError

LAUNCHER_VARIABLES = ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_SIZE", "PMI_RANK", "SLURM_STEP_NUM_TASKS",
                      "SLURM_PROCID", "SLURM_NTASKS")


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch) -> Any:
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    yield monkeypatch
    dist.shutdown()


@pytest.mark.parametrize("variables, expected", [
    ({}, None),
    ({"SLURM_NTASKS": "8", "SLURM_PROCID": "0"}, None),  # a batch script run by plain python: one process
    ({"SLURM_STEP_NUM_TASKS": "8", "SLURM_PROCID": "3"}, ("Slurm (srun)", 8, 3)),
    ({"PMI_SIZE": "4", "PMI_RANK": "2"}, ("MPICH / Hydra (mpiexec)", 4, 2)),
    ({"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "SLURM_STEP_NUM_TASKS": "1", "SLURM_PROCID": "0"},
     ("Open MPI (mpirun)", 2, 1)),  # mpirun inside a Slurm allocation
])
def test_launcher_detection(clean: pytest.MonkeyPatch, variables: dict[str, str], expected: Any) -> None:
    for name, value in variables.items():
        clean.setenv(name, value)
    assert dist.launcher_view() == expected
    assert dist.launched_by() == (None if expected is None else expected[0])


class FakeEngine:
    """A job of ``size`` processes as rank ``rank`` sees it (the collectives are the local engine's)."""

    name = "fake"

    def __init__(self, rank: int, size: int) -> None:
        self.rank, self.size = rank, size
        self.aborted: list[int] = []
        local = collective_engine.LocalEngine()
        self.allreduce, self.allgather, self.reduce_scatter = local.allreduce, local.allgather, local.reduce_scatter
        self.broadcast, self.ppermute, self.barrier = local.broadcast, local.ppermute, local.barrier

    def abort(self, code: int = 1) -> None:
        self.aborted.append(code)


def test_launcher_and_mpi_disagree(clean: pytest.MonkeyPatch) -> None:
    """srun without PMI: Slurm says 3 of 8, MPI (a singleton) says 0 of 1."""
    import funcgrad.distributed.mpi as mpi
    clean.setenv("SLURM_STEP_NUM_TASKS", "8")
    clean.setenv("SLURM_PROCID", "3")
    clean.setattr(mpi, "MPIEngine", lambda: FakeEngine(0, 1))
    with pytest.raises(dist.DistributedError, match=r"^funcgrad\.distributed\.initialize: Slurm \(srun\) started "
                       r"this process as 3 of 8, but MPI sees rank 0 of 1: mpi4py's MPI is not the launcher's "
                       r"\(under srun use `srun --mpi=pmix`"):
        dist.initialize()
    assert not dist.is_initialized()


def test_abort_hook(clean: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    before = sys.excepthook
    engine = FakeEngine(1, 2)
    assert dist.initialize(engine=engine, num_processes=2, process_id=1) is engine
    assert (dist.process_index(), dist.process_count(), dist.is_initialized()) == (1, 2, True)
    assert dist.initialize() is engine  # again: the engine installed
    assert sys.excepthook is not before
    try:
        raise KeyError("boom")
    except KeyError as error:
        sys.excepthook(KeyError, error, error.__traceback__)
    assert engine.aborted == [1]
    err = capsys.readouterr().err
    assert "KeyError: 'boom'" in err
    assert "funcgrad.distributed: rank 1 of 2 raised KeyError; aborting the job (MPI_Abort)" in err
    dist.shutdown()
    assert sys.excepthook is before and not dist.is_initialized()


def test_no_abort_hook_when_asked_or_alone(clean: pytest.MonkeyPatch) -> None:
    before = sys.excepthook
    dist.initialize(engine=FakeEngine(0, 2), abort_on_error=False)
    assert sys.excepthook is before
    dist.shutdown()
    dist.initialize()  # no launcher: the local engine, no hook
    assert sys.excepthook is before and dist.engine().name == "local"


def test_engine_argument_checked(clean: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="unknown engine 'gloo'; expected 'mpi', 'nccl' or 'local'"):
        dist.initialize(engine="gloo")
    with pytest.raises(TypeError, match="engine must be 'mpi', 'nccl', 'local' or a collective engine, got 3"):
        dist.initialize(engine=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="process_id 2 is not below num_processes 2"):
        dist.initialize(num_processes=2, process_id=2)
    with pytest.raises(ValueError, match="num_processes must be a non-negative integer, got -1"):
        dist.initialize(num_processes=-1)


def test_mismatch_message_groups_ranks() -> None:
    same = [("allreduce(sum) float32[4]", "a.py:1")] * 3
    assert collective_engine.mismatch_message(same) is None
    calls = [("allreduce(sum) float32[4]", "a.py:1"), ("allreduce(sum) float32[5]", "a.py:2"),
             ("allreduce(sum) float32[4]", "a.py:1")]
    message = collective_engine.mismatch_message(calls)
    assert message is not None
    assert "ranks 0, 2: allreduce(sum) float32[4] at a.py:1; rank 1: allreduce(sum) float32[5] at a.py:2" in message
    assert collective_engine.describe_call("broadcast", np.zeros((2, 3), np.int32), "root=1") == \
        "broadcast(root=1) int32[2, 3]"
    assert collective_engine.describe_call("barrier", None) == "barrier"


@pytest.mark.parametrize("text, expected", [("", None), ("0", None), ("2.5", 2.5), (" 600 ", 600.0)])
def test_collective_timeout_setting(monkeypatch: pytest.MonkeyPatch, text: str, expected: float | None) -> None:
    monkeypatch.setenv("FUNCGRAD_COLLECTIVE_TIMEOUT", text)
    assert collective_engine.collective_timeout() == expected


@pytest.mark.parametrize("text", ["-1", "inf", "nan", "soon"])
def test_collective_timeout_refuses(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv("FUNCGRAD_COLLECTIVE_TIMEOUT", text)
    with pytest.raises(EnvironmentVariableError, match="FUNCGRAD_COLLECTIVE_TIMEOUT="):
        collective_engine.collective_timeout()


def test_debug_collectives_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCGRAD_DEBUG_COLLECTIVES", "1")
    assert collective_engine.debug_collectives()
    with fg.config.override(debug_collectives=False):
        assert not collective_engine.debug_collectives()
    monkeypatch.setenv("FUNCGRAD_DEBUG_COLLECTIVES", "0")
    assert not collective_engine.debug_collectives()
