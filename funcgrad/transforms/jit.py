"""The jit primitive's transformation rules: each transforms the called sub-IR and stays one call.

A ``jit`` equation holds an open IR (its consts as leading inputs, see ``ir.higher_order``). Under
``jvp`` the sub-IR is differentiated (cached per IR and tangent pattern) and called as a new jit
equation; partial evaluation splits it into a known and an unknown call joined by residuals;
transposition and batching transform it and call the result. ``call_transpose_rule`` and
``call_batch_rule`` serve every primitive that calls a sub-IR named ``ir`` (``checkpoint`` too).
The runtime that traces and calls jit functions is ``funcgrad/jit_runtime.py``.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

from funcgrad.core.tensor import bind
from funcgrad.ir.core import IR, Eqn, Var
from funcgrad.ir.higher_order import jit_p, open_ir
from funcgrad.transforms.batching import batch_rules, vmap_ir
from funcgrad.transforms.jvp import instantiate, jvp_ir, jvp_rules
from funcgrad.transforms.partial_eval import partial_eval, pe_rules
from funcgrad.transforms.transpose import is_undefined, transpose_ir, transpose_rules

__all__ = ["call_batch_rule", "call_transpose_rule"]


@functools.lru_cache(maxsize=512)
def _jvp_of(ir: IR, has_tangent: tuple[bool, ...]) -> tuple[IR, tuple[Any, ...], tuple[bool, ...]]:
    new_ir, out_has_tangent = jvp_ir(ir, has_tangent)
    return open_ir(new_ir), tuple(new_ir.consts), tuple(out_has_tangent)


def _jit_jvp(primals: list[Any], tangents: list[Any], *, ir: IR, name: str) -> tuple[Any, Any]:
    has_tangent = tuple(t is not None for t in tangents)
    new_ir, consts, out_has_tangent = _jvp_of(ir, has_tangent)
    outs = bind(jit_p, *consts, *primals, *(t for t in tangents if t is not None), ir=new_ir, name=f"jvp({name})")
    n = len(ir.outputs)
    supplied = iter(outs[n:])
    return list(outs[:n]), [next(supplied) if h else None for h in out_has_tangent]


jvp_rules[jit_p] = _jit_jvp


def _jit_partial_eval(eqn: Eqn, unknown: Sequence[bool]) -> tuple[list[Eqn], list[Eqn], list[bool]]:
    params = eqn.param_dict
    sub: IR = params["ir"]
    known_ir, unknown_ir, out_unknown, num_res = partial_eval(sub, list(unknown))
    assert not known_ir.consts and not unknown_ir.consts, "open sub-IRs split into open sub-IRs"
    residuals = [Var(a.aval) for a in known_ir.outputs[len(known_ir.outputs) - num_res:]]
    known_outs = [v for v, u in zip(eqn.outputs, out_unknown) if not u]
    unknown_outs = [v for v, u in zip(eqn.outputs, out_unknown) if u]
    known_eqn = Eqn(jit_p, [a for a, u in zip(eqn.inputs, unknown) if not u],
                    {"ir": known_ir, "name": params["name"]}, known_outs + residuals)
    unknown_eqn = Eqn(jit_p, residuals + [a for a, u in zip(eqn.inputs, unknown) if u],
                      {"ir": unknown_ir, "name": params["name"]}, unknown_outs)
    return [known_eqn], [unknown_eqn], list(out_unknown)


pe_rules[jit_p] = _jit_partial_eval


def call_transpose_rule(primitive: Any) -> Any:
    """The transpose rule of a primitive that calls its sub-IR ``ir`` (jit, checkpoint): transpose
    the sub-IR and call that."""
    def rule(cts: list[Any], *operands: Any, ir: IR, name: str) -> list[Any]:
        linear = [is_undefined(op) for op in operands]
        transposed = transpose_ir(ir, linear)
        values = [op for op in operands if not is_undefined(op)]
        cts = [instantiate(ct, aval) for ct, aval in zip(cts, ir.out_avals)]
        results = iter(bind(primitive, *transposed.consts, *values, *cts, ir=open_ir(transposed),
                            name=f"transpose({name})"))
        return [next(results) if lin else None for lin in linear]
    return rule


def call_batch_rule(primitive: Any) -> Any:
    """The batching rule of a primitive that calls its sub-IR ``ir``: batch the sub-IR, call that."""
    def rule(args: list[Any], dims: list[Any], *, axis_size: int, ir: IR, name: str,
             **params: Any) -> tuple[Any, Any]:
        batched, out_dims = vmap_ir(ir, dims, axis_size)
        outs = bind(primitive, *batched.consts, *args, ir=open_ir(batched), name=f"vmap({name})", **params)
        return list(outs), out_dims
    return rule


transpose_rules[jit_p] = call_transpose_rule(jit_p)
batch_rules[jit_p] = call_batch_rule(jit_p)
