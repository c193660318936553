"""Primitives that carry sub-IRs: ``jit`` calls (and, in ``funcgrad.lax``, control flow).

A sub-IR held as a parameter is *open*: it has no consts; the values it closed over are passed
as leading operands. That keeps parameters hashable by identity and lets every transformation
treat consts like any other operand.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from funcgrad.ir.core import IR, ShapedArray, avals_str
from funcgrad.ir.interpreter import eval_ir
from funcgrad.ir.primitives import Primitive


def open_ir(ir: IR) -> IR:
    """``ir`` with its consts turned into leading inputs (values passed separately)."""
    if not ir.const_vars:
        return ir
    return IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)


def check_operands(name: str, ir: IR, avals: tuple[ShapedArray, ...]) -> None:
    if ir.consts:
        raise ValueError(f"{name}: sub-IRs must be open (no consts); pass the consts as operands")
    if tuple(avals) != ir.in_avals:
        raise TypeError(f"{name}: operands typed {avals_str(avals)} do not match the sub-IR's inputs "
                        f"{avals_str(ir.in_avals)}")


def _jit_rule(*avals: ShapedArray, ir: IR, name: str) -> tuple[ShapedArray, ...]:
    check_operands(f"jit call {name}", ir, avals)
    return ir.out_avals


def _jit_impl(*args: np.ndarray, ir: IR, name: str) -> list[Any]:
    return eval_ir(ir, args)


jit_p = Primitive("jit", _jit_rule, _jit_impl, multiple_results=True)
