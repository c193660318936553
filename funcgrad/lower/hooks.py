"""Hooks: how front modules take part in lowering without lower importing them.

A front module registers a function here when it is imported; lower calls every registered one.
``debug_nans`` (``funcgrad.nan_check``) registers two: ``check_step``, called after each step of a
plan while ``util.config.nonfinite_checks()`` is on, and ``carry_source``, called when lowering
renames a value (inlining a jit call), so the new variable keeps the user's source line.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.ir.core import IR, Var

StepChecker = Callable[[IR, Any, Callable[[Var], np.ndarray], Sequence[str]], None]
RenameHook = Callable[[Any, Any], None]

STEP_CHECKERS: list[StepChecker] = []
RENAME_HOOKS: list[RenameHook] = []


def register_step_checker(checker: StepChecker) -> None:
    """``checker(ir, step, read, checks)`` runs after every plan step while checks are on; it raises to stop."""
    if checker not in STEP_CHECKERS:
        STEP_CHECKERS.append(checker)


def register_rename_hook(hook: RenameHook) -> None:
    """``hook(old, new)`` runs when lowering makes ``new`` (a Var) stand for ``old``."""
    if hook not in RENAME_HOOKS:
        RENAME_HOOKS.append(hook)


def check_step(ir: IR, step: Any, read: Callable[[Var], np.ndarray], checks: Sequence[str]) -> None:
    for checker in STEP_CHECKERS:
        checker(ir, step, read, checks)


def renamed(old: Any, new: Any) -> None:
    for hook in RENAME_HOOKS:
        hook(old, new)
