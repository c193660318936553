"""funcgrad across processes and hosts: ``initialize()`` once per process, then the same program on
every rank (JAX's ``jax.distributed``). The engine is MPI through mpi4py.

>>> import funcgrad as fg
>>> fg.distributed.process_count()   # before initialize(), or not launched by mpirun: one process
1
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Any

from funcgrad.util.collective_engine import (
    CollectiveEngine,
    CollectiveMismatchError,
    CollectiveTimeoutError,
    LocalEngine,
    get_engine,
    set_engine,
)

__all__ = ["initialize", "shutdown", "is_initialized", "process_index", "process_count", "engine",
           "coordinator_address", "launched_by", "DistributedError", "CollectiveMismatchError",
           "CollectiveTimeoutError"]

# variables a launcher sets in each process it starts: (size, rank) per launcher, the first found wins
# (mpirun inside a Slurm allocation sets both Open MPI's and Slurm's). Slurm's are the job *step*'s
# (srun's): a batch script run by plain ``python`` sees SLURM_NTASKS of the allocation but is one process.
_LAUNCHERS = {
    "Open MPI (mpirun)": ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    "MPICH / Hydra (mpiexec)": ("PMI_SIZE", "PMI_RANK"),
    "Slurm (srun)": ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID"),
}


class DistributedError(RuntimeError):
    """The job is not what ``initialize`` was told or what the launcher said (docs/distributed.md)."""


def launched_by() -> str | None:
    """The launcher that started this process as one of several, from its environment, or ``None``."""
    found = launcher_view()
    return None if found is None else found[0]


def launcher_view() -> tuple[str, int, int] | None:
    """(launcher, process count, this process's index) as the launcher's environment variables say, or None."""
    for name, (size, rank) in _LAUNCHERS.items():
        if size in os.environ:
            try:
                return name, int(os.environ[size]), int(os.environ.get(rank, "0"))
            except ValueError:
                raise DistributedError(f"funcgrad.distributed.initialize: {name} set {size}="
                                       f"{os.environ[size]!r}, {rank}={os.environ.get(rank)!r}: not integers") from None
    return None


_state: dict[str, Any] = {"previous_hook": None, "coordinator_address": None}


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, engine: str | CollectiveEngine | None = None,
               abort_on_error: bool = True) -> CollectiveEngine:
    """Join the job this process was launched in and install its engine for every collective.

    - ``engine``: "mpi" (MPI.COMM_WORLD through mpi4py), "nccl" (NCCL on this process's GPU, wired up
      over MPI; not yet run on a GPU), "local" (one process) or an engine object;
      by default "mpi" when a launcher (mpirun/mpiexec, srun) started this process, else "local".
    - ``num_processes``, ``process_id`` (JAX's arguments): what this process expects; MPI's launcher
      decides both, so they are checked against it and a difference raises ``DistributedError``.
      ``coordinator_address`` ("host:port") is kept (``coordinator_address()``) but MPI does not need
      it: the launcher connects the processes.
    - ``abort_on_error``: in a job of several processes, an exception no code catches on any rank ends
      the whole job (``MPI_Abort``) after its traceback is printed, instead of leaving the other ranks
      waiting in their next collective.

    Calling it again returns the engine already installed (after the same checks).
    """
    if coordinator_address is not None and (not isinstance(coordinator_address, str)
                                            or not coordinator_address.rpartition(":")[2].isdigit()):
        raise ValueError(f"funcgrad.distributed.initialize: coordinator_address {coordinator_address!r} is "
                         f"not 'host:port'")
    for label, value in (("num_processes", num_processes), ("process_id", process_id)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ValueError(f"funcgrad.distributed.initialize: {label} must be a non-negative integer, got {value!r}")
    if num_processes is not None and process_id is not None and process_id >= num_processes:
        raise ValueError(f"funcgrad.distributed.initialize: process_id {process_id} is not below "
                         f"num_processes {num_processes}")
    current = get_engine()
    if isinstance(current, LocalEngine):
        current = _install(engine)
    _check_job(current, num_processes, process_id)
    _state["coordinator_address"] = coordinator_address or _state["coordinator_address"]
    if abort_on_error and current.size > 1 and hasattr(current, "abort"):
        _install_abort_hook()
    return current


def _install(engine: str | CollectiveEngine | None) -> CollectiveEngine:
    if engine is not None and not isinstance(engine, str):
        if not isinstance(engine, CollectiveEngine):
            raise TypeError(f"funcgrad.distributed.initialize: engine must be 'mpi', 'nccl', 'local' or a collective "
                            f"engine, got {engine!r}")
        set_engine(engine)
        return engine
    choice = engine if engine is not None else ("mpi" if launched_by() else "local")
    if choice == "local":
        return get_engine()
    if choice not in ("mpi", "nccl"):
        raise ValueError(f"funcgrad.distributed.initialize: unknown engine {choice!r}; expected 'mpi', 'nccl' "
                         f"or 'local'")
    installed: CollectiveEngine
    if choice == "nccl":
        from funcgrad.distributed.nccl import NCCLEngine
        installed = NCCLEngine()
    else:
        from funcgrad.distributed.mpi import MPIEngine
        installed = MPIEngine()
    view = launcher_view()
    if view is not None and (view[1], view[2]) != (installed.size, installed.rank):
        raise DistributedError(
            f"funcgrad.distributed.initialize: {view[0]} started this process as {view[2]} of {view[1]}, but MPI "
            f"sees rank {installed.rank} of {installed.size}: mpi4py's MPI is not the launcher's (under srun use "
            f"`srun --mpi=pmix` or mpirun; check `python -m mpi4py --mpi-library` against `mpirun --version`)")
    set_engine(installed)
    return installed


def _check_job(current: CollectiveEngine, num_processes: int | None, process_id: int | None) -> None:
    where = launched_by() or "no launcher"
    if num_processes is not None and num_processes != current.size:
        raise DistributedError(f"funcgrad.distributed.initialize: num_processes={num_processes}, but the job "
                               f"({where}, engine {current.name}) has {current.size} process"
                               f"{'es' if current.size != 1 else ''}")
    if process_id is not None and process_id != current.rank:
        raise DistributedError(f"funcgrad.distributed.initialize: process_id={process_id}, but the launcher "
                               f"({where}, engine {current.name}) made this process rank {current.rank} of "
                               f"{current.size}")


def _install_abort_hook() -> None:
    if _state["previous_hook"] is not None:
        return
    previous = sys.excepthook
    _state["previous_hook"] = previous

    def abort_job(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
        job = get_engine()
        try:
            previous(kind, error, trace)
            sys.stderr.write(f"funcgrad.distributed: rank {job.rank} of {job.size} raised {kind.__name__}; "
                             f"aborting the job (MPI_Abort) so that the other ranks do not wait for it\n")
            sys.stderr.flush()
            sys.stdout.flush()
        finally:
            abort = getattr(job, "abort", None)
            if abort is not None and job.size > 1:
                abort(1)

    sys.excepthook = abort_job


def coordinator_address() -> str | None:
    """The ``coordinator_address`` given to ``initialize`` (MPI itself does not use it)."""
    return _state["coordinator_address"]


def is_initialized() -> bool:
    return not isinstance(get_engine(), LocalEngine)


def shutdown() -> None:
    """Leave the job: collectives are local (one process) again and an uncaught exception no longer
    aborts the job. MPI itself is finalized at exit (mpi4py's ``atexit``)."""
    previous = _state["previous_hook"]
    if previous is not None:
        sys.excepthook = previous
        _state["previous_hook"] = None
    _state["coordinator_address"] = None
    set_engine(None)


def engine() -> CollectiveEngine:
    """The engine collectives use now (the local one before ``initialize``)."""
    return get_engine()


def process_index() -> int:
    return get_engine().rank


def process_count() -> int:
    return get_engine().size
