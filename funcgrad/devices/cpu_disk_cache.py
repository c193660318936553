"""The CPU's object code on disk: one checksummed file per key (``funcgrad.util.caches.CheckedFile``),
bounded by ``FUNCGRAD_CACHE_MAX_MB`` (``trim_folder`` deletes the least recently used).

Processes share the folder. Cross-process locks (the ``filelock`` package; at most 257 ``.lock-*`` files
in the folder) make processes that start together (a data-parallel job, pytest-xdist workers) compile
each kernel once: the one holding a key's lock compiles and stores it, the others wait and read it. Only
one process trims at a time. A process holds each lock file for all its threads at once
(``_ProcessStripes``): its compiling threads never wait for each other on a file. A lock is an
optimisation, never a dependency: one that cannot be taken in ``COMPILE_LOCK_WAIT`` seconds (or at all,
on a read-only folder) is skipped and the kernel compiled.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import filelock

from funcgrad.devices.cpu_target import cache_root, host_target
from funcgrad.util.caches import cache_size, checked_entry, read_checked, write_atomically

_MAGIC = b"FGOBJ01\n"
COMPILE_LOCK_WAIT = 120.0  # seconds a process waits for another compiling the same kernel
# how often a process waiting for another's lock looks again (filelock's default, 50 ms, is longer than
# most kernels' compile)
LOCK_POLL_S = 0.005
LOCK_PREFIX = ".lock-"
# a key's lock is one of 256 files (the key's first two hex digits): locks are never deleted (deleting a
# lock file another process waits on would let two hold "the" lock), so their number must stay bounded;
# two kernels sharing a stripe compile one after the other across processes, which is rare and harmless
LOCK_STRIPE_DIGITS = 2


class _Stripe:
    def __init__(self, path: Path) -> None:
        # thread_local=False: the thread that releases the file may not be the one that took it
        self.file = filelock.FileLock(path, timeout=COMPILE_LOCK_WAIT, thread_local=False)
        self.entering = threading.Lock()  # one thread of this process takes or gives back the file at a time
        self.users = 0  # this process's threads inside, while it holds the file


class _ProcessStripes:
    """The lock files held by this process, each shared by all its threads inside it. A lock file
    excludes other processes; threads of one process compile different keys (``compile_many`` builds
    each source once), so two of its threads whose keys share a stripe both go in. Were each thread
    to take the file on its own, the second would wait on a lock its own process holds, looking again
    every poll interval (measured: 50 ms of a 0.25 s first MLP step, on filelock's default interval),
    where 21 kernels share one of 256 stripes about half the time."""

    def __init__(self) -> None:
        self.guard = threading.Lock()
        self.stripes: dict[Path, _Stripe] = {}

    @contextlib.contextmanager
    def holding(self, path: Path) -> Iterator[bool]:
        """Inside: this process holds ``path`` (True), or it could not be had in time or at all (False)."""
        with self.guard:
            stripe = self.stripes.get(path) or self.stripes.setdefault(path, _Stripe(path))
        with stripe.entering:
            held = stripe.users > 0
            if not held:
                with contextlib.suppress(filelock.Timeout, OSError):
                    stripe.file.acquire(poll_interval=LOCK_POLL_S, timeout=COMPILE_LOCK_WAIT)
                    held = True
            stripe.users += held
        if not held:
            yield False
            return
        try:
            yield True
        finally:
            with stripe.entering:
                stripe.users -= 1
                if stripe.users == 0:
                    stripe.file.release()


_PROCESS_STRIPES = _ProcessStripes()


class DiskCache:
    """Object code on disk, one checksummed file per key; unreadable or corrupt entries read as
    missing. A folder that cannot be created disables the cache silently."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder or cache_root()) / "cpu"
        self.max_bytes = cache_size("FUNCGRAD_CACHE_MAX_MB", 1024, "megabytes") << 20
        self._unchecked_bytes: int | None = None  # written since the folder was last trimmed (None: not yet)
        self._stored: set[str] = set()  # keys this process wrote

    def key(self, source: str) -> str:
        return hashlib.sha256((host_target().fingerprint + "\n" + source).encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.o"

    def load(self, key: str) -> bytes | None:
        payload = read_checked(self.path(key), _MAGIC)
        if payload is None:
            return None
        with contextlib.suppress(OSError):
            os.utime(self.path(key))  # a hit makes the entry recently used for trim_folder
        return payload

    @contextlib.contextmanager
    def compiling(self, key: str) -> Iterator[None]:
        """Hold ``key``'s cross-process lock for the body (compile, then ``store``): another process
        compiling the same kernel waits, then finds it on disk with ``load``."""
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            yield  # compile without it
            return
        with _PROCESS_STRIPES.holding(self.folder / f"{LOCK_PREFIX}{key[:LOCK_STRIPE_DIGITS]}"):
            yield  # (compile without it when it could not be had)

    def store(self, key: str, payload: bytes) -> None:
        if key in self._stored:  # written by this process already (inside ``compiling``)
            return
        self._stored.add(key)
        entry = checked_entry(_MAGIC, payload)
        # not fsynced (an fsync per file is a large part of a cold step): an entry a crash tears or empties
        # fails its checksum and reads as missing
        if not write_atomically(self.path(key), entry):
            return
        # trim on the first store of the process, then after every eighth of the bound written
        if self._unchecked_bytes is None or self._unchecked_bytes + len(entry) > self.max_bytes // 8:
            self._unchecked_bytes = 0
            lock = filelock.FileLock(self.folder / f"{LOCK_PREFIX}trim", blocking=False)
            with contextlib.suppress(filelock.Timeout, OSError), lock:  # another process trimming: skip
                trim_folder(self.folder, self.max_bytes)
        else:
            self._unchecked_bytes += len(entry)


def trim_folder(folder: Path, max_bytes: int, keep_fraction: float = 0.75) -> int:
    """When the files in ``folder`` add up to more than ``max_bytes``, delete the least recently used
    (oldest modification time: a disk-cache hit touches its file) down to ``keep_fraction`` of it;
    temporary files over an hour old (their writer died) go always. Other processes may use or trim
    the folder meanwhile: a file read while it is deleted stays readable (POSIX), a missing one is a
    miss. Returns the bytes deleted."""
    try:
        paths = list(folder.iterdir())
    except OSError:
        return 0
    entries = []
    for path in paths:
        if path.name.startswith(LOCK_PREFIX):  # held or idle locks (empty files) are never trimmed
            continue
        with contextlib.suppress(OSError):  # deleted by another process meanwhile
            info = path.stat()
            entries.append((info.st_mtime, info.st_size, path))
    deleted = 0
    stale = time.time() - 3600
    for mtime, size, path in entries:
        if path.name.startswith(".tmp-") and mtime < stale:
            with contextlib.suppress(OSError):
                path.unlink()
                deleted += size
    total = sum(size for _, size, path in entries if not path.name.startswith(".tmp-"))
    if total <= max_bytes:
        return deleted
    for _, size, path in sorted(entry for entry in entries if not entry[2].name.startswith(".tmp-")):
        if total <= max_bytes * keep_fraction:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            deleted += size
        total -= size
    return deleted
