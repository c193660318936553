"""The CPU's object code on disk: one checksummed file per key (``funcgrad.util.caches.CheckedFile``),
bounded by ``FUNCGRAD_CACHE_MAX_MB`` (``trim_folder`` deletes the least recently used)."""

from __future__ import annotations

import contextlib
import hashlib
import os
import time
from pathlib import Path

from funcgrad.devices.cpu_target import cache_root, host_target
from funcgrad.util.caches import cache_size, checked_entry, read_checked, write_atomically

_MAGIC = b"FGOBJ01\n"


class DiskCache:
    """Object code on disk, one checksummed file per key; unreadable or corrupt entries read as
    missing. A folder that cannot be created disables the cache silently."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder or cache_root()) / "cpu"
        self.max_bytes = cache_size("FUNCGRAD_CACHE_MAX_MB", 1024, "megabytes") << 20
        self._unchecked_bytes: int | None = None  # written since the folder was last trimmed (None: not yet)

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

    def store(self, key: str, payload: bytes) -> None:
        entry = checked_entry(_MAGIC, payload)
        # not fsynced (an fsync per file is a large part of a cold step): an entry a crash tears or empties
        # fails its checksum and reads as missing
        if not write_atomically(self.path(key), entry):
            return
        # trim on the first store of the process, then after every eighth of the bound written
        if self._unchecked_bytes is None or self._unchecked_bytes + len(entry) > self.max_bytes // 8:
            self._unchecked_bytes = 0
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
