"""funcgrad across processes and hosts: ``initialize()`` once per process, then the same program on
every rank (JAX's ``jax.distributed``). The engine is MPI through mpi4py.

>>> import funcgrad as fg
>>> fg.distributed.process_count()   # before initialize(), or not launched by mpirun: one process
1
"""

from __future__ import annotations

import os

from funcgrad.util.collective_engine import CollectiveEngine, LocalEngine, get_engine, set_engine

__all__ = ["initialize", "shutdown", "is_initialized", "process_index", "process_count", "engine"]

# variables a launcher sets in each process it starts: (size, rank) per launcher
_LAUNCHERS = {
    "Open MPI (mpirun)": ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    "MPICH / Hydra (mpiexec)": ("PMI_SIZE", "PMI_RANK"),
    "Slurm (srun)": ("SLURM_NTASKS", "SLURM_PROCID"),
}


def launched_by() -> str | None:
    """The launcher that started this process as one of several, from its environment, or ``None``."""
    for name, (size, _rank) in _LAUNCHERS.items():
        if size in os.environ:
            return name
    return None


def initialize(engine: str | None = None) -> CollectiveEngine:
    """Join the job this process was launched in and install its engine for every collective.

    ``engine``: "mpi" (MPI.COMM_WORLD through mpi4py) or "local" (one process); by default "mpi"
    when a launcher (mpirun/mpiexec, srun) started this process, else "local". Calling it again
    returns the engine already installed.
    """
    current = get_engine()
    if not isinstance(current, LocalEngine):
        return current
    choice = engine if engine is not None else ("mpi" if launched_by() else "local")
    if choice == "local":
        return current
    if choice != "mpi":
        raise ValueError(f"funcgrad.distributed.initialize: unknown engine {choice!r}; expected 'mpi' or 'local'")
    from funcgrad.distributed.mpi import MPIEngine
    installed = MPIEngine()
    set_engine(installed)
    return installed


def is_initialized() -> bool:
    return not isinstance(get_engine(), LocalEngine)


def shutdown() -> None:
    """Leave the job: collectives are local (one process) again. MPI itself is finalized at exit."""
    set_engine(None)


def engine() -> CollectiveEngine:
    """The engine collectives use now (the local one before ``initialize``)."""
    return get_engine()


def process_index() -> int:
    return get_engine().rank


def process_count() -> int:
    return get_engine().size
