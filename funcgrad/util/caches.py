"""Bounded caches: every cache that grows with the programs a process runs is an ``LRUCache``.

An ``LRUCache`` is a dict with a maximum number of entries that evicts the least recently used
one, and that several threads may use at once (one lock around each operation; the values are
computed outside it, so two threads missing the same key at once both compute it and the first
one stored wins: wasteful, never wrong). Each cache reads its size from an environment variable
when it is created (``cache_size``); docs/architecture.md, "Caches and their bounds", lists them.

On disk, a cache entry is a *checked file* (``checked_entry``, ``read_checked``): a magic line naming
its kind, the SHA-256 of the payload, the payload's length (8 bytes, little-endian), the payload. A
missing, truncated or corrupt file reads as None (a miss), never as data.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Hashable
from pathlib import Path
from typing import Generic, TypeVar

from funcgrad.util.config import env_int

Key = TypeVar("Key", bound=Hashable)
Value = TypeVar("Value")


def cache_size(variable: str, default: int, unit: str = "cache entries") -> int:
    """The positive integer in the environment variable ``variable``, else ``default``.

    >>> cache_size("FUNCGRAD_PLAN_CACHE_SIZE", 1024)  # 1024 unless the variable is set
    1024
    """
    return env_int(variable, default, minimum=1, what=f"a whole number of {unit}")


class LRUCache(Generic[Key, Value]):
    """At most ``max_entries`` entries; a lookup makes an entry the most recently used.

    >>> cache = LRUCache[str, int](2); cache.put("a", 1); cache.put("b", 2); cache.put("c", 3)
    >>> cache.get("a"), len(cache)   # "a" was the least recently used: evicted
    (None, 2)
    """

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"LRUCache: max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries  # may be changed at any time; applies from the next put
        self._entries: OrderedDict[Key, Value] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = 0

    def get(self, key: Key) -> Value | None:
        with self._lock:
            value = self._entries.get(key)
            if value is not None:
                self._entries.move_to_end(key)
            return value

    def put(self, key: Key, value: Value) -> Value:
        """Store ``value`` under ``key`` unless another thread stored one first; return the stored one."""
        with self._lock:
            stored = self._entries.setdefault(key, value)
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
                self.evictions += 1
            return stored

    def __contains__(self, key: Key) -> bool:
        with self._lock:
            return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def values(self) -> list[Value]:
        with self._lock:
            return list(self._entries.values())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()


def write_atomically(path: Path, data: bytes, *, durable: bool = False) -> bool:
    """Write ``data`` to ``path`` through a temporary file in the same folder and ``os.replace``, so
    a reader sees the old file or the new one, never a torn one (``durable``: fsync before the
    rename). An OSError leaves nothing behind and returns False; the caches then just do not keep
    the entry."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=path.suffix)
    except OSError:
        return False
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(temporary, path)
        return True
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        return False


_CHECKSUM_BYTES = 32
_LENGTH_BYTES = 8


def checked_entry(magic: bytes, payload: bytes) -> bytes:
    """``payload`` as a checked file's bytes: ``magic``, its SHA-256, its length, itself."""
    return magic + hashlib.sha256(payload).digest() + len(payload).to_bytes(_LENGTH_BYTES, "little") + payload


def read_checked(path: Path, magic: bytes) -> bytes | None:
    """The payload of the checked file at ``path`` (written from ``checked_entry(magic, ...)``), or None
    when it is missing, unreadable, of another kind, truncated or fails its checksum."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    header = len(magic) + _CHECKSUM_BYTES + _LENGTH_BYTES
    if len(data) < header or not data.startswith(magic):
        return None
    checksum = data[len(magic):len(magic) + _CHECKSUM_BYTES]
    length = int.from_bytes(data[header - _LENGTH_BYTES:header], "little")
    payload = data[header:]
    if len(payload) != length or hashlib.sha256(payload).digest() != checksum:
        return None
    return payload
