"""The DEBUG ladder's level: one place that reads the ``DEBUG`` environment variable (on every use, so
tests and notebooks can change it at run time). What each level prints: docs/architecture.md."""

from __future__ import annotations

from funcgrad.util.config import env_int


def debug_level() -> int:
    """``DEBUG`` as an int (0 when unset); a value that is not a level raises, naming the variable."""
    return env_int("DEBUG", 0, what="a level 0..4 (an integer)")
