"""The harness itself: per-rank output, TCP loopback, the hard timeout."""

from __future__ import annotations

import time

import pytest
from launch import RanksTimedOut, run_ranks

RANKS = """
from mpi4py import MPI
import numpy as np
comm = MPI.COMM_WORLD
x = np.full(4, comm.Get_rank() + 1.0)
out = np.empty_like(x)
comm.Allreduce(x, out)
print(comm.Get_rank(), comm.Get_size(), out.tolist())
"""


@pytest.mark.parametrize("tcp", [False, True], ids=["shm", "tcp"])
def test_each_rank_output_apart(tcp: bool) -> None:
    result = run_ranks(RANKS, n=2, timeout=60, tcp=tcp).check()
    assert [line.strip() for line in result.stdout] == ["0 2 [3.0, 3.0, 3.0, 3.0]", "1 2 [3.0, 3.0, 3.0, 3.0]"]
    if tcp:
        assert "btl_tcp_if_include" in result.command


def test_timeout_kills_the_job_and_names_it() -> None:
    start = time.monotonic()
    code = "import time\nprint('started', flush=True)\ntime.sleep(120)\n"
    with pytest.raises(RanksTimedOut, match=r"ran past its timeout of 3 s") as caught:
        run_ranks(code, n=2, timeout=3)
    assert time.monotonic() - start < 15
    assert "started" in str(caught.value)
