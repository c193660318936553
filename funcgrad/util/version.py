"""funcgrad's version: one place, read by packaging, ``fg.__version__`` and the on-disk caches' keys."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__version__ = "0.1.0"


@functools.cache
def code_version() -> str:
    """funcgrad's version and a digest of its source files: a plan made by other code is stale
    (the version number alone does not change when the scheduler does)."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256(__version__.encode())
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return f"{__version__}+{digest.hexdigest()[:16]}"
