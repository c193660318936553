"""The CPU kernel cache's cross-process locks (filelock): a process compiling a kernel holds its key's
lock, so another process wants the same kernel waits and then reads it from disk instead of compiling
it again; a lock that cannot be had in time is skipped, never an error; lock files are never trimmed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from funcgrad.devices import cpu_disk_cache
from funcgrad.devices.cpu_disk_cache import DiskCache, trim_folder

ROOT = Path(__file__).resolve().parents[2]

HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from funcgrad.devices.cpu_disk_cache import DiskCache
    cache = DiskCache(sys.argv[1])
    with cache.compiling("k1"):
        Path(sys.argv[2]).write_text("holding")
        time.sleep(1.5)  # "compiling"
        cache.store("k1", b"object code from the other process")
""")


def test_a_second_process_waits_for_the_first_and_reads_its_result(tmp_path: Path) -> None:
    flag = tmp_path / "holding"
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path), str(flag)],
                              env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    try:
        deadline = time.monotonic() + 60
        while not flag.exists():
            assert time.monotonic() < deadline and holder.poll() is None, "the holder did not start"
            time.sleep(0.02)
        cache = DiskCache(tmp_path)
        assert cache.load("k1") is None
        started = time.monotonic()
        with cache.compiling("k1"):
            waited = time.monotonic() - started
            assert cache.load("k1") == b"object code from the other process"
        assert waited > 0.3
    finally:
        holder.wait(timeout=60)
    assert holder.returncode == 0


def test_a_lock_that_cannot_be_had_is_skipped(tmp_path: Path, monkeypatch) -> None:
    import filelock

    cache = DiskCache(tmp_path)
    other = filelock.FileLock(cache.folder / f"{cpu_disk_cache.LOCK_PREFIX}k2", thread_local=False)
    cache.folder.mkdir(parents=True)
    monkeypatch.setattr(cpu_disk_cache, "COMPILE_LOCK_WAIT", 0.2)
    with other:
        started = time.monotonic()
        entered = False
        with cache.compiling("k2"):  # held elsewhere for longer than we wait: compile anyway
            entered = True
        assert entered and time.monotonic() - started < 5


def test_trimming_keeps_lock_files(tmp_path: Path) -> None:
    (tmp_path / "old.o").write_bytes(b"x" * 1000)
    (tmp_path / f"{cpu_disk_cache.LOCK_PREFIX}abc").write_bytes(b"")
    assert trim_folder(tmp_path, max_bytes=10) == 1000
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"{cpu_disk_cache.LOCK_PREFIX}abc"]


def _stripe_mates(count: int) -> list[str]:
    """Keys that share one lock file (the same first LOCK_STRIPE_DIGITS hex digits)."""
    return [f"ab{number:062x}" for number in range(count)]


def test_threads_of_one_process_share_a_lock_file_and_the_last_one_out_releases_it(tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """Two threads compiling different kernels whose keys share a stripe both go in at once (a thread
    waiting on its own process's lock once cost a first MLP step 50 ms); while either is inside, another
    process (here: a lock of its own on the same file) is kept out, also after the thread that took the
    file has left, and once both are out it gets in."""
    import threading

    import filelock

    monkeypatch.setattr(cpu_disk_cache, "COMPILE_LOCK_WAIT", 2.0)  # (a thread that waited for the other gives up)
    cache = DiskCache(tmp_path)
    first, second = _stripe_mates(2)
    lock_file = cache.folder / f"{cpu_disk_cache.LOCK_PREFIX}{first[:cpu_disk_cache.LOCK_STRIPE_DIGITS]}"
    other_process = filelock.FileLock(lock_file, thread_local=False)
    first_inside, second_inside, first_may_leave = threading.Event(), threading.Event(), threading.Event()

    def hold_first() -> None:
        with cache.compiling(first):
            first_inside.set()
            first_may_leave.wait(60)

    holder = threading.Thread(target=hold_first)
    holder.start()
    try:
        assert first_inside.wait(60)
        with cache.compiling(second):  # the first thread is still inside the same lock file
            second_inside.set()
            first_may_leave.set()
            holder.join(60)
            assert not holder.is_alive()
            with pytest.raises(filelock.Timeout):  # the second thread holds it for the process now
                other_process.acquire(timeout=0)
        assert second_inside.is_set()
        other_process.acquire(timeout=0)  # both out: the file is free
        other_process.release()
    finally:
        first_may_leave.set()
        holder.join(60)

