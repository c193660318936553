"""IR clean-up passes: constant folding, algebraic identities, common-subexpression elimination
and dead-code elimination, run together by ``simplify``.

Transforms produce correct but wordy IRs (a gradient recomputes values the forward pass had, a
jvp multiplies by one); ``make_ir`` and ``jit`` simplify what they trace so listings read like the
hand-written program. Every rewrite keeps the result bit-for-bit: ``x + 0.0`` is *not* rewritten
(it turns -0.0 into 0.0), ``x * 1.0`` is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.ir import primitives as P
from funcgrad.ir.core import IR, Eqn, Literal, ShapedArray, Var
from funcgrad.ir.primitives import Primitive

# primitives with effects that DCE must keep even when their outputs are unused (none yet)
effectful: set[Primitive] = set()

_NO_CSE = {"checkpoint", "custom_vjp_call", "custom_jvp_call", "custom_lin"}
# x + y and y + x, x * y and y * x are the same bits (IEEE addition and multiplication commute; max and
# min do not: max(-0.0, 0.0) depends on the order), so CSE keys their operands unordered: the product
# rule's ``t * c + c * t`` (a jvp of ``c * c``) computes ``t * c`` once
_COMMUTATIVE = {"add", "mul"}


def _is_literal(atom: Any, value: float, splats: dict[int, Any] | None = None) -> bool:
    """Is ``atom`` the constant ``value`` (a literal, or a broadcast of one)?"""
    if isinstance(atom, Var) and splats is not None and atom.id in splats:
        atom = splats[atom.id]
    return isinstance(atom, Literal) and not isinstance(atom.value, np.bool_) and atom.value == value


def _is_negative_zero(atom: Any, splats: dict[int, Any]) -> bool:
    if isinstance(atom, Var) and atom.id in splats:
        atom = splats[atom.id]
    return isinstance(atom, Literal) and bool(np.signbit(atom.value)) and atom.value == 0


def _identity_operand(eqn: Eqn, splats: dict[int, Any]) -> Any:
    """The input an equation merely passes through, or None."""
    prim, ins, out = eqn.primitive, eqn.inputs, eqn.outputs[0] if eqn.outputs else None
    if out is None or prim.multiple_results:
        return None
    if prim is P.mul_p:
        for keep, other in ((ins[0], ins[1]), (ins[1], ins[0])):
            if _is_literal(other, 1, splats) and keep.aval == out.aval:
                return keep
    if prim is P.pow_p and _is_literal(ins[1], 1, splats) and ins[0].aval == out.aval:
        return ins[0]
    if prim is P.select_p and isinstance(ins[0], Literal):
        chosen = ins[1] if bool(ins[0].value) else ins[2]
        return chosen if chosen.aval == out.aval else None
    if prim in (P.sub_p, P.div_p) and _is_literal(ins[1], 0 if prim is P.sub_p else 1, splats) \
            and ins[0].aval == out.aval and not (prim is P.sub_p and _is_negative_zero(ins[1], splats)):
        return ins[0]  # x - 0.0 and x / 1 are exact, -0.0 included (x - -0.0 is x + 0.0: not for x = -0.0)
    if prim in (P.reshape_p, P.broadcast_in_dim_p, P.convert_element_type_p, P.transpose_p) \
            and ins[0].aval == out.aval:
        params = eqn.param_dict
        if prim is P.transpose_p and params["permutation"] != tuple(range(out.aval.ndim)):
            return None
        if prim is P.broadcast_in_dim_p and params["broadcast_dimensions"] != tuple(range(out.aval.ndim)):
            return None
        return ins[0]
    return None


def _fold(eqn: Eqn) -> Literal | None:
    """Evaluate a scalar equation whose inputs are all literals."""
    if eqn.primitive.multiple_results or not eqn.inputs or not all(isinstance(a, Literal) for a in eqn.inputs):
        return None
    out = eqn.outputs[0]
    if out.aval.shape != ():
        return None
    with np.errstate(all="ignore"):
        value = np.asarray(eqn.primitive.impl(*(a.value for a in eqn.inputs if isinstance(a, Literal)),
                                              **eqn.param_dict))
    return Literal(value.astype(out.aval.dtype)[()], out.aval)


def _fold_splats(eqn: Eqn, splats: dict[int, Literal]) -> Eqn | None:
    """An elementwise equation whose operands are all scalar literals or broadcasts of one, as the
    broadcast of its folded scalar (``c + c`` of a broadcast ``c``: the product rule on ``mean(c * x)``)."""
    if eqn.primitive.multiple_results or eqn.primitive.kernel_op is None or len(eqn.outputs) != 1:
        return None
    scalars: list[Literal] = []
    for atom in eqn.inputs:
        if isinstance(atom, Var) and atom.id in splats:
            atom = splats[atom.id]
        elif not (isinstance(atom, Literal) and atom.aval.shape == ()):
            return None
        scalars.append(atom)
    if not any(isinstance(a, Var) for a in eqn.inputs):
        return None
    out = eqn.outputs[0]
    with np.errstate(all="ignore"):
        value = np.asarray(eqn.primitive.impl(*(a.value for a in scalars), **eqn.param_dict))
    if value.shape != ():
        return None
    literal = Literal(value.astype(out.aval.dtype)[()], ShapedArray((), out.aval.dtype))
    return Eqn(P.broadcast_in_dim_p, [literal], {"broadcast_dimensions": (), "shape": out.aval.shape}, [out])


def _atom_key(atom: Var | Literal) -> Any:
    if isinstance(atom, Literal):  # by its bits: 0.0 and -0.0 are equal numbers but not one literal
        return ("literal", atom.aval.dtype, atom.value.tobytes())
    return ("var", atom.id)


def simplify(ir: IR) -> IR:
    """Fold constants, drop identities, merge duplicate equations, remove dead code."""
    substitution: dict[int, Any] = {}

    def resolve(atom: Any) -> Any:
        while isinstance(atom, Var) and atom.id in substitution:
            atom = substitution[atom.id]
        return atom

    seen: dict[Any, Eqn] = {}
    splats: dict[int, Literal] = {}  # vars known to be a broadcast scalar literal
    kept: list[Eqn] = []
    for eqn in ir.eqns:
        eqn = Eqn(eqn.primitive, [resolve(a) for a in eqn.inputs], eqn.params, eqn.outputs)
        folded = _fold(eqn)
        if folded is not None:
            substitution[eqn.outputs[0].id] = folded
            continue
        eqn = _fold_splats(eqn, splats) or eqn
        if eqn.primitive is P.broadcast_in_dim_p and isinstance(eqn.inputs[0], Literal):
            splats[eqn.outputs[0].id] = eqn.inputs[0]
        passthrough = _identity_operand(eqn, splats)
        if passthrough is not None:
            substitution[eqn.outputs[0].id] = passthrough
            continue
        if eqn.primitive.name not in _NO_CSE:
            operands = tuple(_atom_key(a) for a in eqn.inputs)
            if eqn.primitive.name in _COMMUTATIVE and len(operands) == 2 and eqn.inputs[0].aval == eqn.inputs[1].aval:
                operands = tuple(sorted(operands, key=repr))
            key = (eqn.primitive.name, operands, eqn.params)
            try:
                previous = seen.get(key)
                hashable = True
            except TypeError:  # an unhashable parameter: leave the equation alone
                previous, hashable = None, False
            if previous is not None:
                for old, new in zip(eqn.outputs, previous.outputs):
                    substitution[old.id] = new
                continue
            if hashable:
                seen[key] = eqn
        kept.append(eqn)
    outputs = [resolve(a) for a in ir.outputs]
    return dce(IR(ir.in_vars, kept, outputs, ir.const_vars, ir.consts))


def dce(ir: IR, used_outputs: Sequence[bool] | None = None) -> IR:
    """Drop equations whose results are never used (and outputs not in ``used_outputs``).
    Inputs are kept so the calling convention does not change; unused consts are dropped."""
    outputs = ir.outputs if used_outputs is None else [a for a, u in zip(ir.outputs, used_outputs) if u]
    live: set[int] = {a.id for a in outputs if isinstance(a, Var)}
    kept: list[Eqn] = []
    for eqn in reversed(ir.eqns):
        if eqn.primitive in effectful or any(v.id in live for v in eqn.outputs):
            kept.append(eqn)
            live.update(a.id for a in eqn.inputs if isinstance(a, Var))
    kept.reverse()
    consts = [(v, c) for v, c in zip(ir.const_vars, ir.consts) if v.id in live]
    return IR(ir.in_vars, kept, outputs, [v for v, _ in consts], [c for _, c in consts])

