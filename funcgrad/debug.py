"""The DEBUG ladder: one place that reads the ``DEBUG`` environment variable.

1: why a jit function retraced, and kernels per realize; 2: each step's time; 3: the kernel IR;
4: the generated source. Read on every use, so tests and notebooks can change it at run time.
"""

from __future__ import annotations

import os


def debug_level() -> int:
    """``DEBUG`` as an int (0 when unset or not a number)."""
    try:
        return int(os.environ.get("DEBUG", "0") or 0)
    except ValueError:
        return 0
