"""What each rank runs under ``launch.run_ranks``: its stdout and stderr go to files of its own (so
a test reads rank 1's output apart from rank 0's, whatever the launcher), its exit status to a
third, then the test's script runs as ``__main__``.

    python3 [-m mpi4py] _rank_main.py OUTPUT_DIR SCRIPT [ARGS...]
"""

from __future__ import annotations

import io
import os
import runpy
import sys

_RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def _rank() -> int:
    for name in _RANK_VARIABLES:
        if name in os.environ:
            return int(os.environ[name])
    return 0


def main() -> None:
    output, script, *arguments = sys.argv[1:]
    rank = _rank()
    sys.stdout.flush()
    sys.stderr.flush()
    for fd, suffix in ((1, "out"), (2, "err")):
        target = os.open(os.path.join(output, f"rank{rank}.{suffix}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(target, fd)
        os.close(target)
    for stream in (sys.stdout, sys.stderr):  # an aborted job loses no line already printed
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(line_buffering=True)
    status: object = 1
    try:
        sys.argv = [script, *arguments]
        runpy.run_path(script, run_name="__main__")
        status = 0
    except SystemExit as exit_:
        status = 0 if exit_.code is None else exit_.code
        raise
    finally:
        with open(os.path.join(output, f"rank{rank}.rc"), "w") as handle:
            handle.write(str(status if isinstance(status, int) else 1))


if __name__ == "__main__":
    main()
