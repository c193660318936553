"""Transposition of linear IRs: the backward pass of reverse mode.

``transpose_ir(ir, linear)`` takes an IR that is linear in the inputs flagged ``linear`` and
returns the IR ``(non-linear inputs..., output cotangents...) -> (cotangents of the linear
inputs...)``. ``backward_pass`` first evaluates every equation that does not depend on a linear
input (recomputation, as in ``checkpoint``), then walks the linear equations in reverse, calling
``transpose_rules[primitive](cotangents_out, *operands, **params)``.

In a rule, operands that depend on the linear inputs are ``UndefinedPrimal(aval)`` markers and the
others are their values; the rule returns one cotangent per operand (``None`` for non-linear
operands or a zero cotangent). Cotangents arriving at one variable are summed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from funcgrad.core.tensor import Tensor, bind
from funcgrad.core.trace import trace_avals
from funcgrad.ir.core import IR, Literal, ShapedArray, Var
from funcgrad.ir.primitives import Primitive, add_p
from funcgrad.ir.simplify import simplify
from funcgrad.transforms.jvp import instantiate

TransposeRule = Callable[..., Sequence[Any]]
transpose_rules: dict[Primitive, TransposeRule] = {}


@attrs.frozen
class UndefinedPrimal:
    """Stands for a linear operand in a transpose rule: only its type is known."""

    aval: ShapedArray


def is_undefined(value: Any) -> bool:
    return isinstance(value, UndefinedPrimal)


def add_cotangents(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None:
        return b
    if b is None:
        return a
    return bind(add_p, a, b)


def _linear_vars(ir: IR, linear: Sequence[bool]) -> set[int]:
    depends: set[int] = {v.id for v, flag in zip(ir.in_vars, linear) if flag}
    for eqn in ir.eqns:
        if any(isinstance(a, Var) and a.id in depends for a in eqn.inputs):
            depends.update(v.id for v in eqn.outputs)
    return depends


def backward_pass(ir: IR, linear: Sequence[bool], values: Sequence[Any],
                  cotangents_out: Sequence[Tensor | None]) -> list[Tensor | None]:
    """Cotangents of the linear inputs of ``ir``; ``values`` holds the non-linear inputs in order."""
    linear_ids = _linear_vars(ir, linear)
    env: dict[int, Any] = {}
    for var, const in zip(ir.const_vars, ir.consts):
        env[var.id] = const
    supplied = iter(values)
    for var, flag in zip(ir.in_vars, linear):
        if not flag:
            env[var.id] = next(supplied)

    def read(atom: Any) -> Any:
        if isinstance(atom, Literal):
            return atom.value
        return UndefinedPrimal(atom.aval) if atom.id in linear_ids else env[atom.id]

    linear_eqns = []
    for eqn in ir.eqns:  # forward: everything not depending on the linear inputs
        if any(v.id in linear_ids for v in eqn.outputs):
            linear_eqns.append(eqn)
            continue
        outs = bind(eqn.primitive, *(read(a) for a in eqn.inputs), **eqn.param_dict)
        for var, value in zip(eqn.outputs, outs if eqn.primitive.multiple_results else (outs,)):
            env[var.id] = value

    cotangents: dict[int, Tensor | None] = {}
    for atom, cotangent in zip(ir.outputs, cotangents_out):
        if isinstance(atom, Var) and atom.id in linear_ids:
            cotangents[atom.id] = add_cotangents(cotangents.get(atom.id), cotangent)

    for eqn in reversed(linear_eqns):
        cts_out = [cotangents.pop(v.id, None) for v in eqn.outputs]
        if all(ct is None for ct in cts_out):
            continue
        rule = transpose_rules.get(eqn.primitive)
        if rule is None:
            raise NotImplementedError(f"reverse-mode differentiation of '{eqn.primitive.name}' is not "
                                      "implemented (it has no transpose rule)")
        operands = [read(a) for a in eqn.inputs]
        cts_in = rule(cts_out if eqn.primitive.multiple_results else cts_out[0], *operands, **eqn.param_dict)
        for atom, ct in zip(eqn.inputs, cts_in):
            if isinstance(atom, Var) and atom.id in linear_ids and ct is not None:
                cotangents[atom.id] = add_cotangents(cotangents.get(atom.id), ct)
    return [cotangents.get(v.id) for v, flag in zip(ir.in_vars, linear) if flag]


def transpose_ir(ir: IR, linear: Sequence[bool]) -> IR:
    """``(non-linear inputs..., output cotangents...) -> (cotangents of linear inputs...)``; zero
    cotangents are materialized so the calling convention is fixed."""
    nonlinear_avals = [v.aval for v, flag in zip(ir.in_vars, linear) if not flag]
    linear_avals = [v.aval for v, flag in zip(ir.in_vars, linear) if flag]

    def run(*flat: Tensor) -> list[Tensor]:
        values, cts = flat[:len(nonlinear_avals)], flat[len(nonlinear_avals):]
        results = backward_pass(ir, linear, values, list(cts))
        return [instantiate(ct, aval) for ct, aval in zip(results, linear_avals)]

    return simplify(trace_avals(run, nonlinear_avals + list(ir.out_avals), "transpose"))
