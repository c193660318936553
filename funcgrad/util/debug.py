"""The DEBUG ladder's level: one place that reads the ``DEBUG`` environment variable (on every use, so
tests and notebooks can change it at run time). What each level prints: docs/architecture.md."""

from __future__ import annotations

from funcgrad.util.config import env_value


def debug_level() -> int:
    """``DEBUG`` as an int (0 when unset or not a number)."""
    try:
        return int(env_value("DEBUG") or 0)
    except ValueError:
        return 0
