"""Forward-mode differentiation as an IR-to-IR transformation.

``jvp_ir(ir, has_tangent)`` returns an IR taking ``(primals..., tangents...)`` (one tangent per
input flagged in ``has_tangent``) and returning ``(outputs..., output tangents...)``. It is built by
tracing ``jvp_eval``, which walks the input IR and, for each equation, either re-binds it (when no
input carries a tangent) or calls the primitive's rule in ``jvp_rules``.

A rule is ``rule(primals, tangents, **params) -> (primal_out, tangent_out)``: ``primals`` and
``tangents`` are lists of Tensors (traced); a tangent of ``None`` is a *symbolic zero*, which keeps
the printed IR free of zeros and lets rules skip work. Rules are written with ``bind``, so their
output is differentiable again (higher-order derivatives) and linear in the tangents (which
reverse mode relies on: see ``partial_eval.py`` and ``transpose.py``). Integer and boolean values
never carry tangents.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.core.trace import trace_avals
from funcgrad.ir import dtypes
from funcgrad.ir.core import IR, Literal, ShapedArray
from funcgrad.ir.primitives import Primitive, broadcast_in_dim_p
from funcgrad.ir.simplify import simplify

JvpRule = Callable[..., tuple[Any, Any]]
jvp_rules: dict[Primitive, JvpRule] = {}


def is_differentiable(aval: ShapedArray) -> bool:
    """Only floating-point and complex values carry tangents and cotangents."""
    return dtypes.is_inexact(aval.dtype)


def zeros(aval: ShapedArray) -> Tensor:
    """A materialized zero of ``aval`` (a broadcast literal, free after fusion)."""
    zero = np.zeros((), aval.dtype)[()]
    return bind(broadcast_in_dim_p, zero, shape=aval.shape, broadcast_dimensions=())


def instantiate(tangent: Tensor | None, aval: ShapedArray) -> Tensor:
    return zeros(aval) if tangent is None else tangent


def jvp_eval(ir: IR, primals: Sequence[Any], tangents: Sequence[Tensor | None]) -> tuple[list[Any], list[Any]]:
    """Evaluate ``ir`` on ``primals`` while pushing ``tangents`` forward; returns (outs, out tangents)."""
    env: dict[int, Any] = {}
    tangent_env: dict[int, Tensor | None] = {}
    for var, value in zip(ir.const_vars, ir.consts):
        env[var.id] = value
    for var, primal, tangent in zip(ir.in_vars, primals, tangents):
        env[var.id] = primal
        tangent_env[var.id] = tangent if is_differentiable(var.aval) else None

    def read(atom: Any) -> Any:
        return atom.value if isinstance(atom, Literal) else env[atom.id]

    def read_tangent(atom: Any) -> Tensor | None:
        return None if isinstance(atom, Literal) else tangent_env.get(atom.id)

    for eqn in ir.eqns:
        ins = [read(a) for a in eqn.inputs]
        tangents_in = [read_tangent(a) for a in eqn.inputs]
        multiple = eqn.primitive.multiple_results
        if all(t is None for t in tangents_in):
            outs = bind(eqn.primitive, *ins, **eqn.param_dict)
            tangents_out: Any = [None] * len(eqn.outputs) if multiple else None
        else:
            rule = jvp_rules.get(eqn.primitive)
            if rule is None:
                raise NotImplementedError(f"differentiation rule for '{eqn.primitive.name}' is not implemented")
            outs, tangents_out = rule(ins, tangents_in, **eqn.param_dict)
        outs_list = list(outs) if multiple else [outs]
        tangents_list = list(tangents_out) if multiple else [tangents_out]
        for var, value, tangent in zip(eqn.outputs, outs_list, tangents_list):
            env[var.id] = value
            tangent_env[var.id] = tangent if is_differentiable(var.aval) else None
    return [read(a) for a in ir.outputs], [read_tangent(a) for a in ir.outputs]


def jvp_ir(ir: IR, has_tangent: Sequence[bool],
           instantiate_outputs: bool | Sequence[bool] = False) -> tuple[IR, list[bool]]:
    """The JVP of ``ir``: inputs ``(primals, tangents of flagged inputs)``, outputs ``(outs, tangents
    of outputs that are not symbolically zero)``. Returns the IR and which outputs have tangents
    (all differentiable ones if ``instantiate_outputs``)."""
    has_tangent = [h and is_differentiable(v.aval) for h, v in zip(has_tangent, ir.in_vars)]
    if isinstance(instantiate_outputs, bool):
        instantiate_outputs = [instantiate_outputs] * len(ir.outputs)
    out_has_tangent: list[bool] = []

    def run(*flat: Tensor) -> list[Any]:
        primals = flat[:len(ir.in_vars)]
        supplied = iter(flat[len(ir.in_vars):])
        tangents = [next(supplied) if h else None for h in has_tangent]
        outs, out_tangents = jvp_eval(ir, primals, tangents)
        for i, (atom, tangent) in enumerate(zip(ir.outputs, out_tangents)):
            if tangent is None and instantiate_outputs[i] and is_differentiable(atom.aval):
                out_tangents[i] = zeros(atom.aval)
        out_has_tangent[:] = [t is not None for t in out_tangents]
        return list(outs) + [t for t in out_tangents if t is not None]

    avals = list(ir.in_avals) + [v.aval for v, h in zip(ir.in_vars, has_tangent) if h]
    return simplify(trace_avals(run, avals, "jvp")), out_has_tangent
