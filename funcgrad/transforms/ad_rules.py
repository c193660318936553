"""Differentiation rules of the first-order primitives: a jvp rule for each, and a transpose rule
for each primitive that is linear in some operand.

jvp rules: ``rule(primals, tangents, **params) -> (out, tangent_out)``; a tangent of ``None`` is a
symbolic zero. Transpose rules: ``rule(cotangent, *operands, **params) -> cotangents per operand``,
where linear operands are ``UndefinedPrimal`` markers (see ``transpose.py``).
"""

from __future__ import annotations

from typing import Any

from funcgrad.ir import primitives as P
from funcgrad.tensor import bind
from funcgrad.transforms.jvp import jvp_rules
from funcgrad.transforms.transpose import is_undefined, transpose_rules


def _unbroadcast_scalar(ct: Any, operand: Any) -> Any:
    """Elementwise primitives broadcast rank-0 operands; their cotangent is the sum."""
    if ct is None or operand.aval.shape == ct.shape:
        return ct
    return bind(P.reduce_sum_p, ct, axes=tuple(range(ct.ndim)))


# --- linear elementwise ------------------------------------------------------------------------

def _add_jvp(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
    x, y = primals
    out = bind(P.add_p, x, y)
    tx, ty = tangents
    if tx is None or ty is None:
        tangent = tx if ty is None else ty
        if tangent.shape != out.shape:  # the tangent of a broadcast rank-0 operand
            tangent = bind(P.broadcast_in_dim_p, tangent, shape=out.shape, broadcast_dimensions=())
        return out, tangent
    return out, bind(P.add_p, tx, ty)


def _add_transpose(ct: Any, x: Any, y: Any) -> list[Any]:
    return [_unbroadcast_scalar(ct, x) if is_undefined(x) else None,
            _unbroadcast_scalar(ct, y) if is_undefined(y) else None]


jvp_rules[P.add_p] = _add_jvp
transpose_rules[P.add_p] = _add_transpose


def _mul_jvp(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
    x, y = primals
    out = bind(P.mul_p, x, y)
    tx, ty = tangents
    terms = []
    if tx is not None:
        terms.append(bind(P.mul_p, tx, y))
    if ty is not None:
        terms.append(bind(P.mul_p, x, ty))
    tangent = terms[0] if len(terms) == 1 else bind(P.add_p, *terms)
    if tangent.shape != out.shape:
        tangent = bind(P.broadcast_in_dim_p, tangent, shape=out.shape, broadcast_dimensions=())
    return out, tangent


def _mul_transpose(ct: Any, x: Any, y: Any) -> list[Any]:
    if is_undefined(x) and is_undefined(y):
        raise AssertionError("mul of two linear operands is not linear")
    if is_undefined(x):
        return [_unbroadcast_scalar(bind(P.mul_p, ct, y), x), None]
    return [None, _unbroadcast_scalar(bind(P.mul_p, x, ct), y)]


jvp_rules[P.mul_p] = _mul_jvp
transpose_rules[P.mul_p] = _mul_transpose


# --- nonlinear elementwise ---------------------------------------------------------------------

def _sin_jvp(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
    (x,), (t,) = primals, tangents
    return bind(P.sin_p, x), bind(P.mul_p, t, bind(P.cos_p, x))


def _cos_jvp(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
    (x,), (t,) = primals, tangents
    return bind(P.cos_p, x), bind(P.mul_p, t, bind(P.neg_p, bind(P.sin_p, x)))


jvp_rules[P.sin_p] = _sin_jvp
jvp_rules[P.cos_p] = _cos_jvp


# --- reductions and movement -------------------------------------------------------------------

def _linear_jvp(primitive: P.Primitive) -> Any:
    """For primitives linear in their only operand: the tangent goes through the same op."""
    def rule(primals: list[Any], tangents: list[Any], **params: Any) -> tuple[Any, Any]:
        return bind(primitive, *primals, **params), bind(primitive, *tangents, **params)
    return rule


jvp_rules[P.reduce_sum_p] = _linear_jvp(P.reduce_sum_p)
jvp_rules[P.broadcast_in_dim_p] = _linear_jvp(P.broadcast_in_dim_p)


def _reduce_sum_transpose(ct: Any, x: Any, *, axes: tuple[int, ...]) -> list[Any]:
    kept = tuple(i for i in range(x.aval.ndim) if i not in axes)
    return [bind(P.broadcast_in_dim_p, ct, shape=x.aval.shape, broadcast_dimensions=kept)]


def _broadcast_transpose(ct: Any, x: Any, *, shape: tuple[int, ...], broadcast_dimensions: tuple[int, ...]) -> list[Any]:
    summed = tuple(i for i in range(len(shape)) if i not in broadcast_dimensions)
    expanded = tuple(d for src, d in enumerate(broadcast_dimensions) if x.aval.shape[src] == 1 and shape[d] != 1)
    out = ct
    if summed or expanded:
        out = bind(P.reduce_sum_p, ct, axes=tuple(sorted(summed + expanded)))
    if out.shape != x.aval.shape:
        out = bind(P.reshape_p, out, new_sizes=x.aval.shape)
    return [out]


transpose_rules[P.reduce_sum_p] = _reduce_sum_transpose
transpose_rules[P.broadcast_in_dim_p] = _broadcast_transpose


def _dot_general_jvp(primals: list[Any], tangents: list[Any], **params: Any) -> tuple[Any, Any]:
    (x, y), (tx, ty) = primals, tangents
    out = bind(P.dot_general_p, x, y, **params)
    terms = []
    if tx is not None:
        terms.append(bind(P.dot_general_p, tx, y, **params))
    if ty is not None:
        terms.append(bind(P.dot_general_p, x, ty, **params))
    return out, terms[0] if len(terms) == 1 else bind(P.add_p, *terms)


def _dot_general_transpose(ct: Any, x: Any, y: Any, *, contracting: Any, batch: Any) -> list[Any]:
    """Transpose one operand of a dot_general: contract the cotangent with the other operand over
    its free dims, then permute the result back to the operand's dimension order."""
    if is_undefined(x):
        return [_dot_transpose_operand(ct, x.aval, y, contracting, batch, lhs=True), None]
    return [None, _dot_transpose_operand(ct, y.aval, x, (contracting[1], contracting[0]),
                                         (batch[1], batch[0]), lhs=False)]


def _dot_transpose_operand(ct: Any, aval: Any, other: Any, contracting: Any, batch: Any, lhs: bool) -> Any:
    (own_c, other_c), (own_b, other_b) = contracting, batch
    own_free = [i for i in range(aval.ndim) if i not in own_c and i not in own_b]
    other_free = [i for i in range(other.ndim) if i not in other_c and i not in other_b]
    nb = len(own_b)
    # ct dims: batch, then lhs free, then rhs free; contract away the other operand's free dims
    first_other = nb if not lhs else nb + len(own_free)
    ct_other_free = list(range(first_other, first_other + len(other_free)))
    result = bind(P.dot_general_p, ct, other, contracting=(tuple(ct_other_free), tuple(other_free)),
                  batch=(tuple(range(nb)), tuple(other_b)))
    # result dims: batch (own_b order), ct_own_free (own_free order), other's contracting (other_c order)
    produced = list(own_b) + own_free + [own_c[list(other_c).index(oc)] for oc in sorted(other_c)]
    permutation = tuple(produced.index(i) for i in range(aval.ndim))
    if permutation != tuple(range(aval.ndim)):
        result = bind(P.transpose_p, result, permutation=permutation)
    return result


jvp_rules[P.dot_general_p] = _dot_general_jvp
transpose_rules[P.dot_general_p] = _dot_general_transpose
