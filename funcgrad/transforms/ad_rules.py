"""Differentiation rules of the first-order primitives: a jvp rule for each, and a transpose rule
for each primitive that is linear in some operand.

jvp rules: ``rule(primals, tangents, **params) -> (out, tangent_out)``; a tangent of ``None`` is a
symbolic zero. Transpose rules: ``rule(cotangent, *operands, **params) -> cotangents per operand``,
where linear operands are ``UndefinedPrimal`` markers (see ``transpose.py``).

Every rule is written with ``bind``, so its output is differentiable again (``grad(grad(f))``), and
every tangent is a *linear* function of the input tangents built only from primitives that have a
transpose rule here (``mul``/``div`` by known values, movement, ``select``, ``scatter`` add...), so
reverse mode (linearize, then transpose) works for every rule.

Conventions the rules share:

* Operands read from literals arrive as NumPy scalars (``np.float32(2.0)``): they never carry a
  tangent, and ``_const(like, value)`` makes scalars of the right dtype the same way.
* Elementwise primitives broadcast rank-0 operands, so a tangent term may have rank 0 while the
  output does not (``_fit`` broadcasts it), and the cotangent of a rank-0 operand is the sum of the
  output cotangent (``_unbroadcast``).
* Integer and boolean results have no tangent (``None``), as do piecewise-constant float
  functions (floor, ceil, round, sign).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.core import ShapedArray
from funcgrad.transforms.jvp import jvp_rules, zeros
from funcgrad.transforms.transpose import UndefinedPrimal, is_undefined, transpose_rules

__all__: list[str] = []  # this module only registers rules

# --- small helpers: the rules read as formulas -------------------------------------------------


def _const(like: Any, value: float) -> np.generic:
    """A NumPy scalar of ``like``'s dtype: becomes an inline literal when traced."""
    return np.array(value, dtype=like.dtype)[()]  # type: ignore[return-value]


def _aval(value: Any) -> ShapedArray:
    if isinstance(value, (Tensor, UndefinedPrimal)):
        return value.aval
    return ShapedArray((), dtypes.canonicalize(value.dtype))  # a NumPy scalar (a literal)


def _add(x: Any, y: Any) -> Any:
    return bind(P.add_p, x, y)


def _sub(x: Any, y: Any) -> Any:
    return bind(P.sub_p, x, y)


def _mul(x: Any, y: Any) -> Any:
    return bind(P.mul_p, x, y)


def _div(x: Any, y: Any) -> Any:
    return bind(P.div_p, x, y)


def _neg(x: Any) -> Any:
    return bind(P.neg_p, x)


def _eq(x: Any, y: Any) -> Any:
    return bind(P.eq_p, x, y)


def _select(pred: Any, on_true: Any, on_false: Any) -> Any:
    return bind(P.select_p, pred, on_true, on_false)


def _convert(x: Any, dtype: np.dtype) -> Any:
    return bind(P.convert_element_type_p, x, new_dtype=dtype)


def _reduce_sum(x: Any, axes: Sequence[int]) -> Any:
    return bind(P.reduce_sum_p, x, axes=tuple(axes))


def _fit(tangent: Any, shape: tuple[int, ...]) -> Any:
    """Broadcast the tangent of a rank-0 operand of an elementwise primitive to the output shape."""
    if tangent is None or tangent.shape == tuple(shape):
        return tangent
    return bind(P.broadcast_in_dim_p, tangent, shape=tuple(shape), broadcast_dimensions=())


def _unbroadcast(ct: Any, operand: Any) -> Any:
    """Elementwise primitives broadcast rank-0 operands; their cotangent is the sum."""
    if ct is None or _aval(operand).shape == ct.shape:
        return ct
    return _reduce_sum(ct, range(ct.ndim))


def _sum_terms(terms: Sequence[Any], shape: tuple[int, ...]) -> Any:
    """Add tangent contributions (each fitted to ``shape``); ``None`` if there are none."""
    total = None
    for term in terms:
        term = _fit(term, shape)
        total = term if total is None else _add(total, term)
    return total


def _zeros_of(value: Any) -> Any:
    return zeros(_aval(value))


def _instantiate(tangent: Any, primal: Any) -> Any:
    return _zeros_of(primal) if tangent is None else tangent


def _iota(shape: tuple[int, ...], dimension: int) -> Any:
    return bind(P.iota_p, dtype=dtypes.int32, shape=tuple(shape), dimension=dimension)


def _take_along_axis(x: Any, index: Any, axis: int) -> Any:
    """``out[..., i, ...] = x[..., index[..., i, ...], ...]`` (NumPy's take_along_axis) as a gather;
    its transpose is a scatter-add, so it serves tangents of permutations and choices."""
    shape = index.shape
    columns = [index if d == axis else _iota(shape, d) for d in range(len(shape))]
    dims = tuple(range(len(shape)))
    stacked = [bind(P.broadcast_in_dim_p, c, shape=shape + (1,), broadcast_dimensions=dims) for c in columns]
    indices = bind(P.concatenate_p, *stacked, axis=len(shape))
    return bind(P.gather_p, x, indices, axes=tuple(range(len(shape))))


# --- rule builders -----------------------------------------------------------------------------

def _zero_jvp(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    """Integer/boolean-valued or piecewise-constant primitives: the output has no tangent."""
    def rule(primals: list[Any], tangents: list[Any], **params: Any) -> tuple[Any, Any]:
        out = bind(primitive, *primals, **params)
        return out, [None] * len(out) if primitive.multiple_results else None
    return rule


def _linear_jvp(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    """For primitives linear in their only operand: the tangent goes through the same op."""
    def rule(primals: list[Any], tangents: list[Any], **params: Any) -> tuple[Any, Any]:
        return bind(primitive, *primals, **params), bind(primitive, *tangents, **params)
    return rule


def _unary_jvp(primitive: P.Primitive, tangent_of: Callable[[Any, Any, Any], Any]) -> Callable[..., Any]:
    """``tangent_of(t, x, y)`` gives the output tangent from the input tangent ``t``, the input
    ``x`` and the output ``y``; it must be ``mul``/``div`` of ``t`` by known values."""
    def rule(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
        (x,), (t,) = primals, tangents
        y = bind(primitive, x)
        return y, tangent_of(t, x, y)
    return rule


def _binary_jvp(primitive: P.Primitive, tangent_x: Callable[..., Any] | None,
                tangent_y: Callable[..., Any] | None) -> Callable[..., Any]:
    """``tangent_x(tx, x, y, out)`` is the contribution of the first operand's tangent (likewise
    ``tangent_y``); ``None`` means that operand's derivative is zero."""
    def rule(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
        (x, y), (tx, ty) = primals, tangents
        out = bind(primitive, x, y)
        terms = []
        if tx is not None and tangent_x is not None:
            terms.append(tangent_x(tx, x, y, out))
        if ty is not None and tangent_y is not None:
            terms.append(tangent_y(ty, x, y, out))
        return out, _sum_terms(terms, out.shape)
    return rule


# --- linear elementwise: add, sub, neg, mul, div -----------------------------------------------

jvp_rules[P.add_p] = _binary_jvp(P.add_p, lambda tx, x, y, out: tx, lambda ty, x, y, out: ty)
jvp_rules[P.sub_p] = _binary_jvp(P.sub_p, lambda tx, x, y, out: tx, lambda ty, x, y, out: _neg(ty))
jvp_rules[P.neg_p] = _linear_jvp(P.neg_p)
jvp_rules[P.mul_p] = _binary_jvp(P.mul_p, lambda tx, x, y, out: _mul(tx, y),
                                 lambda ty, x, y, out: _mul(x, ty))
# d(x/y)/dy = -x/y^2 = -(x/y)/y: reuses the output and stays finite where x/y does
jvp_rules[P.div_p] = _binary_jvp(P.div_p, lambda tx, x, y, out: _div(tx, y),
                                 lambda ty, x, y, out: _neg(_mul(ty, _div(out, y))))


def _add_transpose(ct: Any, x: Any, y: Any) -> list[Any]:
    return [_unbroadcast(ct, x) if is_undefined(x) else None,
            _unbroadcast(ct, y) if is_undefined(y) else None]


def _sub_transpose(ct: Any, x: Any, y: Any) -> list[Any]:
    return [_unbroadcast(ct, x) if is_undefined(x) else None,
            _unbroadcast(_neg(ct), y) if is_undefined(y) else None]


def _mul_transpose(ct: Any, x: Any, y: Any) -> list[Any]:
    if is_undefined(x) and is_undefined(y):
        raise AssertionError("mul of two linear operands is not linear")
    if is_undefined(x):
        return [_unbroadcast(_mul(ct, y), x), None]
    return [None, _unbroadcast(_mul(x, ct), y)]


def _div_transpose(ct: Any, x: Any, y: Any) -> list[Any]:
    if is_undefined(y):
        raise AssertionError("div is linear in its numerator only")
    return [_unbroadcast(_div(ct, y), x), None]


transpose_rules[P.add_p] = _add_transpose
transpose_rules[P.sub_p] = _sub_transpose
transpose_rules[P.neg_p] = lambda ct, x: [_neg(ct)]
transpose_rules[P.mul_p] = _mul_transpose
transpose_rules[P.div_p] = _div_transpose

# --- nonlinear elementwise: unary --------------------------------------------------------------

_LN2 = math.log(2.0)
_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)


def _one_minus_square(v: Any) -> Any:
    return _sub(_const(v, 1), _mul(v, v))


_UNARY_TANGENTS: dict[P.Primitive, Callable[[Any, Any, Any], Any]] = {
    P.exp_p: lambda t, x, y: _mul(t, y),
    P.log_p: lambda t, x, y: _div(t, x),
    P.exp2_p: lambda t, x, y: _mul(t, _mul(y, _const(y, _LN2))),
    P.log2_p: lambda t, x, y: _div(t, _mul(x, _const(x, _LN2))),
    P.expm1_p: lambda t, x, y: _mul(t, _add(y, _const(y, 1))),
    P.log1p_p: lambda t, x, y: _div(t, _add(x, _const(x, 1))),
    P.sin_p: lambda t, x, y: _mul(t, bind(P.cos_p, x)),
    P.cos_p: lambda t, x, y: _mul(t, _neg(bind(P.sin_p, x))),
    P.tan_p: lambda t, x, y: _mul(t, _add(_const(y, 1), _mul(y, y))),            # 1 + tan^2
    P.asin_p: lambda t, x, y: _mul(t, bind(P.rsqrt_p, _one_minus_square(x))),
    P.acos_p: lambda t, x, y: _mul(t, _neg(bind(P.rsqrt_p, _one_minus_square(x)))),
    P.atan_p: lambda t, x, y: _div(t, _add(_const(x, 1), _mul(x, x))),
    P.sinh_p: lambda t, x, y: _mul(t, bind(P.cosh_p, x)),
    P.cosh_p: lambda t, x, y: _mul(t, bind(P.sinh_p, x)),
    P.tanh_p: lambda t, x, y: _mul(t, _one_minus_square(y)),                       # 1 - tanh^2
    P.asinh_p: lambda t, x, y: _mul(t, bind(P.rsqrt_p, _add(_mul(x, x), _const(x, 1)))),
    # (x - 1)(x + 1) rather than x^2 - 1: no cancellation near x = 1
    P.acosh_p: lambda t, x, y: _mul(t, bind(P.rsqrt_p, _mul(_sub(x, _const(x, 1)), _add(x, _const(x, 1))))),
    P.atanh_p: lambda t, x, y: _div(t, _one_minus_square(x)),
    P.sqrt_p: lambda t, x, y: _div(t, _mul(y, _const(y, 2))),
    P.rsqrt_p: lambda t, x, y: _mul(t, _mul(_div(y, x), _const(y, -0.5))),        # -x^(-3/2) / 2
    P.logistic_p: lambda t, x, y: _mul(t, _mul(y, _sub(_const(y, 1), y))),         # s (1 - s)
    P.erf_p: lambda t, x, y: _mul(t, _mul(bind(P.exp_p, _neg(_mul(x, x))), _const(x, _TWO_OVER_SQRT_PI))),
    P.abs_p: lambda t, x, y: _abs_tangent(t, x, y),
}


def _abs_tangent(t: Any, x: Any, y: Any) -> Any:
    """sign(x) t for reals; for complex x, d|x| = re(conj(x) t) / |x| (0 at x = 0, as JAX)."""
    if not dtypes.is_complex(_aval(x).dtype):
        return _mul(t, bind(P.sign_p, x))
    safe = _select(_eq(y, _const(y, 0)), _const(y, 1), y)
    return bind(P.real_p, _mul(t, _div(bind(P.conj_p, x), _convert(safe, _aval(x).dtype))))

for _primitive, _tangent_of in _UNARY_TANGENTS.items():
    jvp_rules[_primitive] = _unary_jvp(_primitive, _tangent_of)

# --- nonlinear elementwise: binary -------------------------------------------------------------


def _replace_zero(x: Any) -> Any:
    return _select(_eq(x, _const(x, 0)), _const(x, 1), x)


def _pow_tangent_base(tx: Any, x: Any, y: Any, out: Any) -> Any:
    """d x^y / dx = y x^(y-1), defined as 0 where y == 0 (so 0^0 has derivative 0), as JAX."""
    slope = _mul(_replace_zero(y), bind(P.pow_p, x, _sub(y, _const(y, 1))))
    return _mul(tx, _select(_eq(y, _const(y, 0)), _const(y, 0), slope))


def _pow_tangent_exponent(ty: Any, x: Any, y: Any, out: Any) -> Any:
    """d x^y / dy = log(x) x^y, with log(0) replaced by 0 (x^y is 0 or 1 there), as JAX."""
    return _mul(ty, _mul(bind(P.log_p, _replace_zero(x)), out))


def _rem_tangent_divisor(ty: Any, x: Any, y: Any, out: Any) -> Any:
    """rem(x, y) = x - y trunc(x / y), so d/dy = -trunc(x / y)."""
    quotient = _div(x, y)
    truncated = _mul(bind(P.sign_p, quotient), bind(P.floor_p, bind(P.abs_p, quotient)))
    return _neg(_mul(ty, truncated))


def _atan2_tangent(tangent: Any, numerator: Any, x: Any, y: Any, sign: float) -> Any:
    """d atan2(x, y) = (y dx - x dy) / (x^2 + y^2)."""
    radius2 = _add(_mul(x, x), _mul(y, y))
    return _mul(tangent, _mul(_div(numerator, radius2), _const(radius2, sign)))


def _balanced_share(x: Any, out: Any, other: Any) -> Any:
    """The part of max/min(x, other)'s tangent that comes from ``x``: 1 where x alone is chosen, 0.5
    at ties (JAX splits the tangent evenly), 0 where ``other`` is chosen."""
    chosen = _select(_eq(x, out), _const(out, 1), _const(out, 0))
    tied = _select(_eq(other, out), _const(out, 2), _const(out, 1))
    return _div(chosen, tied)


jvp_rules[P.pow_p] = _binary_jvp(P.pow_p, _pow_tangent_base, _pow_tangent_exponent)
jvp_rules[P.rem_p] = _binary_jvp(P.rem_p, lambda tx, x, y, out: tx, _rem_tangent_divisor)
jvp_rules[P.atan2_p] = _binary_jvp(P.atan2_p, lambda tx, x, y, out: _atan2_tangent(tx, y, x, y, 1.0),
                                   lambda ty, x, y, out: _atan2_tangent(ty, x, x, y, -1.0))
for _primitive in (P.max_p, P.min_p):
    jvp_rules[_primitive] = _binary_jvp(_primitive,
                                        lambda tx, x, y, out: _mul(tx, _balanced_share(x, out, y)),
                                        lambda ty, x, y, out: _mul(ty, _balanced_share(y, out, x)))

# --- primitives without derivatives ------------------------------------------------------------

_ZERO_DERIVATIVE = [P.sign_p, P.floor_p, P.ceil_p, P.round_p, P.is_finite_p, P.not_p, P.and_p, P.or_p,
                    P.xor_p, P.shift_left_p, P.shift_right_p, P.eq_p, P.ne_p, P.lt_p, P.le_p, P.gt_p,
                    P.ge_p, P.argmax_p, P.argmin_p, P.iota_p, P.threefry2x32_p, P.bitcast_convert_type_p]
for _primitive in _ZERO_DERIVATIVE:
    jvp_rules[_primitive] = _zero_jvp(_primitive)

# --- select and casts --------------------------------------------------------------------------


def _select_jvp(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
    (pred, on_true, on_false), (_, t_true, t_false) = primals, tangents
    out = bind(P.select_p, pred, on_true, on_false)
    zero = _const(out, 0)
    tangent = _select(pred, zero if t_true is None else t_true, zero if t_false is None else t_false)
    return out, _fit(tangent, out.shape)


def _select_transpose(ct: Any, pred: Any, on_true: Any, on_false: Any) -> list[Any]:
    if is_undefined(pred):
        raise AssertionError("select is not linear in its predicate")
    zero = _const(ct, 0)
    return [None,
            _unbroadcast(_select(pred, ct, zero), on_true) if is_undefined(on_true) else None,
            _unbroadcast(_select(pred, zero, ct), on_false) if is_undefined(on_false) else None]


jvp_rules[P.select_p] = _select_jvp
transpose_rules[P.select_p] = _select_transpose


def _convert_jvp(primals: list[Any], tangents: list[Any], *, new_dtype: Any) -> tuple[Any, Any]:
    (x,), (t,) = primals, tangents
    out = bind(P.convert_element_type_p, x, new_dtype=new_dtype)
    if not dtypes.is_inexact(out.dtype):  # float -> int/bool: piecewise constant
        return out, None
    if t is None:
        return out, None
    return out, _convert(t, out.dtype)


jvp_rules[P.convert_element_type_p] = _convert_jvp
transpose_rules[P.convert_element_type_p] = lambda ct, x, *, new_dtype: [_convert(ct, x.aval.dtype)]

# --- reductions --------------------------------------------------------------------------------

jvp_rules[P.reduce_sum_p] = _linear_jvp(P.reduce_sum_p)


def _reduce_sum_transpose(ct: Any, x: Any, *, axes: tuple[int, ...]) -> list[Any]:
    kept = tuple(i for i in range(x.aval.ndim) if i not in axes)
    return [bind(P.broadcast_in_dim_p, ct, shape=x.aval.shape, broadcast_dimensions=kept)]


transpose_rules[P.reduce_sum_p] = _reduce_sum_transpose


def _reduce_chooser_jvp(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    """reduce_max/min: the tangent at the location of the extremum, averaged over ties (as JAX)."""
    def rule(primals: list[Any], tangents: list[Any], *, axes: tuple[int, ...]) -> tuple[Any, Any]:
        (x,), (t,) = primals, tangents
        out = bind(primitive, x, axes=axes)
        if not dtypes.is_float(x.dtype) or any(x.shape[a] == 0 for a in axes):
            return out, None  # an empty reduction gives the constant identity
        kept = tuple(i for i in range(x.ndim) if i not in axes)
        spread = bind(P.broadcast_in_dim_p, out, shape=x.shape, broadcast_dimensions=kept)
        location = _convert(_eq(x, spread), x.dtype)
        counts = _reduce_sum(location, axes)
        return out, _div(_reduce_sum(_mul(t, location), axes), counts)
    return rule


jvp_rules[P.reduce_max_p] = _reduce_chooser_jvp(P.reduce_max_p)
jvp_rules[P.reduce_min_p] = _reduce_chooser_jvp(P.reduce_min_p)


def _pad_last(x: Any, value: float) -> Any:
    low = (0,) * x.ndim
    return bind(P.pad_p, x, _const(x, value), low=low, high=low[:-1] + (1,))


def _last_axis_slice(x: Any, first: int) -> Any:
    return bind(P.slice_p, x, start=(0,) * (x.ndim - 1) + (first,), limit=x.shape,
                strides=(1,) * (x.ndim - 1) + (2,))


def _reduce_prod_jvp(primals: list[Any], tangents: list[Any], *, axes: tuple[int, ...]) -> tuple[Any, Any]:
    """A pairwise tree of products along the reduced elements, pushing (value, tangent) pairs with
    the product rule: exact where elements are zero (no division by x), O(n) work, log n steps."""
    (x,), (t,) = primals, tangents
    out = bind(P.reduce_prod_p, x, axes=axes)
    kept = [i for i in range(x.ndim) if i not in axes]
    size = math.prod(x.shape[a] for a in axes)
    if size == 0:
        return out, None
    order = tuple(kept) + tuple(sorted(axes))
    flat_shape = tuple(x.shape[i] for i in kept) + (size,)

    def flatten(v: Any) -> Any:
        if order != tuple(range(x.ndim)):
            v = bind(P.transpose_p, v, permutation=order)
        return bind(P.reshape_p, v, new_sizes=flat_shape)

    value, tangent = flatten(x), flatten(t)
    while value.shape[-1] > 1:
        if value.shape[-1] % 2:  # pad with the identity (value 1, tangent 0)
            value, tangent = _pad_last(value, 1), _pad_last(tangent, 0)
        even, odd = _last_axis_slice(value, 0), _last_axis_slice(value, 1)
        t_even, t_odd = _last_axis_slice(tangent, 0), _last_axis_slice(tangent, 1)
        value, tangent = _mul(even, odd), _add(_mul(t_even, odd), _mul(even, t_odd))
    return out, bind(P.reshape_p, tangent, new_sizes=out.shape)


jvp_rules[P.reduce_prod_p] = _reduce_prod_jvp

# --- cumulative reductions ---------------------------------------------------------------------

jvp_rules[P.cumsum_p] = _linear_jvp(P.cumsum_p)
transpose_rules[P.cumsum_p] = lambda ct, x, *, axis, reverse: [
    bind(P.cumsum_p, ct, axis=axis, reverse=not reverse)]  # the reverse running sum


def _shift_along(x: Any, shift: int, axis: int, reverse: bool, fill: float) -> Any:
    """Move ``x`` ``shift`` places later in scan order along ``axis``, filling with ``fill``."""
    n = x.shape[axis]
    zeros_pad = (0,) * x.ndim
    pads = tuple(shift if d == axis else 0 for d in range(x.ndim))
    if not reverse:
        kept = bind(P.slice_p, x, start=zeros_pad, limit=tuple(n - shift if d == axis else s
                                                               for d, s in enumerate(x.shape)),
                    strides=(1,) * x.ndim)
        return bind(P.pad_p, kept, _const(x, fill), low=pads, high=zeros_pad)
    kept = bind(P.slice_p, x, start=pads, limit=x.shape, strides=(1,) * x.ndim)
    return bind(P.pad_p, kept, _const(x, fill), low=zeros_pad, high=pads)


def _cumprod_jvp(primals: list[Any], tangents: list[Any], *, axis: int, reverse: bool) -> tuple[Any, Any]:
    """The product rule pushed through a Hillis-Steele prefix scan (log n steps of shifted products),
    as JAX differentiates its associative scan: exact at zeros, unlike ``cumprod(x) cumsum(t / x)``."""
    (x,), (t,) = primals, tangents
    out = bind(P.cumprod_p, x, axis=axis, reverse=reverse)
    value, tangent, shift = x, t, 1
    while shift < x.shape[axis]:
        before = _shift_along(value, shift, axis, reverse, 1)
        t_before = _shift_along(tangent, shift, axis, reverse, 0)
        value, tangent = _mul(before, value), _add(_mul(t_before, value), _mul(before, tangent))
        shift *= 2
    return out, tangent


jvp_rules[P.cumprod_p] = _cumprod_jvp


def _cumulative_chooser_jvp(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    """cummax/cummin: each output takes the tangent of the input where its running extremum was
    last attained (the latest tie in scan order), found by a running max/min of positions."""
    def rule(primals: list[Any], tangents: list[Any], *, axis: int, reverse: bool) -> tuple[Any, Any]:
        (x,), (t,) = primals, tangents
        out = bind(primitive, x, axis=axis, reverse=reverse)
        if not dtypes.is_float(x.dtype) or x.size == 0:
            return out, None
        positions = _iota(x.shape, axis)
        attained = _eq(x, out)
        if not reverse:  # latest attained position at or before i
            marked = _select(attained, positions, np.int32(0))
            source = bind(P.cummax_p, marked, axis=axis, reverse=False)
        else:  # nearest attained position at or after i
            marked = _select(attained, positions, np.int32(x.shape[axis] - 1))
            source = bind(P.cummin_p, marked, axis=axis, reverse=True)
        return out, _take_along_axis(t, source, axis)
    return rule


jvp_rules[P.cummax_p] = _cumulative_chooser_jvp(P.cummax_p)
jvp_rules[P.cummin_p] = _cumulative_chooser_jvp(P.cummin_p)

# --- movement: linear in their (first) operand --------------------------------------------------

for _primitive in (P.broadcast_in_dim_p, P.reshape_p, P.transpose_p, P.slice_p, P.flip_p):
    jvp_rules[_primitive] = _linear_jvp(_primitive)


def _broadcast_transpose(ct: Any, x: Any, *, shape: tuple[int, ...],
                         broadcast_dimensions: tuple[int, ...]) -> list[Any]:
    summed = tuple(i for i in range(len(shape)) if i not in broadcast_dimensions)
    expanded = tuple(d for src, d in enumerate(broadcast_dimensions)
                     if x.aval.shape[src] == 1 and shape[d] != 1)
    out = ct
    if summed or expanded:
        out = _reduce_sum(ct, sorted(summed + expanded))
    if out.shape != x.aval.shape:
        out = bind(P.reshape_p, out, new_sizes=x.aval.shape)
    return [out]


def _transpose_transpose(ct: Any, x: Any, *, permutation: tuple[int, ...]) -> list[Any]:
    inverse = tuple(int(i) for i in np.argsort(permutation))
    return [bind(P.transpose_p, ct, permutation=inverse)]


def _slice_transpose(ct: Any, x: Any, *, start: tuple[int, ...], limit: tuple[int, ...],
                     strides: tuple[int, ...]) -> list[Any]:
    """Put the cotangent back where the slice took it and zeros elsewhere. ``pad`` has no interior
    padding, so a stride ``s`` is undone by appending ``s - 1`` zeros after every element (pad on a
    new unit axis, then merge it), before cropping and padding to the operand's extent."""
    out = ct
    for axis, stride in enumerate(strides):
        length = out.shape[axis]
        if stride == 1 or length == 0:
            continue
        split = out.shape[:axis + 1] + (1,) + out.shape[axis + 1:]
        high = tuple(stride - 1 if d == axis + 1 else 0 for d in range(len(split)))
        spread = bind(P.pad_p, bind(P.reshape_p, out, new_sizes=split), _const(ct, 0),
                      low=(0,) * len(split), high=high)
        merged = out.shape[:axis] + (length * stride,) + out.shape[axis + 1:]
        out = bind(P.reshape_p, spread, new_sizes=merged)
    room = tuple(d - s for d, s in zip(x.aval.shape, start))
    if any(n > r for n, r in zip(out.shape, room)):  # trailing zeros past the operand's end
        limit = tuple(min(n, r) for n, r in zip(out.shape, room))
        out = bind(P.slice_p, out, start=(0,) * out.ndim, limit=limit, strides=(1,) * out.ndim)
    high = tuple(r - n for n, r in zip(out.shape, room))
    return [bind(P.pad_p, out, _const(ct, 0), low=tuple(start), high=high)]


transpose_rules[P.broadcast_in_dim_p] = _broadcast_transpose
transpose_rules[P.reshape_p] = lambda ct, x, *, new_sizes: [bind(P.reshape_p, ct, new_sizes=x.aval.shape)]
transpose_rules[P.transpose_p] = _transpose_transpose
transpose_rules[P.slice_p] = _slice_transpose
transpose_rules[P.flip_p] = lambda ct, x, *, axes: [bind(P.flip_p, ct, axes=axes)]


def _pad_jvp(primals: list[Any], tangents: list[Any], *, low: tuple[int, ...],
             high: tuple[int, ...]) -> tuple[Any, Any]:
    (x, value), (tx, tvalue) = primals, tangents
    out = bind(P.pad_p, x, value, low=low, high=high)
    t_value = _const(x, 0) if tvalue is None else tvalue
    return out, bind(P.pad_p, _instantiate(tx, x), t_value, low=low, high=high)


def _pad_transpose(ct: Any, x: Any, value: Any, *, low: tuple[int, ...], high: tuple[int, ...]) -> list[Any]:
    """The operand's cotangent is the inner region; the padding value's is the sum over the rest."""
    shape = _aval(x).shape
    limit = tuple(lo + d for lo, d in zip(low, shape))
    inner = bind(P.slice_p, ct, start=low, limit=limit, strides=(1,) * len(shape))
    ct_value = None
    if is_undefined(value):
        everything = _reduce_sum(ct, range(ct.ndim))
        ct_value = _sub(everything, _reduce_sum(inner, range(inner.ndim)))
    return [inner if is_undefined(x) else None, ct_value]


jvp_rules[P.pad_p] = _pad_jvp
transpose_rules[P.pad_p] = _pad_transpose


def _concatenate_jvp(primals: list[Any], tangents: list[Any], *, axis: int) -> tuple[Any, Any]:
    out = bind(P.concatenate_p, *primals, axis=axis)
    return out, bind(P.concatenate_p, *(_instantiate(t, x) for x, t in zip(primals, tangents)), axis=axis)


def _concatenate_transpose(ct: Any, *operands: Any, axis: int) -> list[Any]:
    cts, offset = [], 0
    for operand in operands:
        shape = _aval(operand).shape
        if is_undefined(operand):
            start = tuple(offset if d == axis else 0 for d in range(ct.ndim))
            limit = tuple(offset + n if d == axis else n for d, n in enumerate(shape))
            cts.append(bind(P.slice_p, ct, start=start, limit=limit, strides=(1,) * ct.ndim))
        else:
            cts.append(None)
        offset += shape[axis]
    return cts


jvp_rules[P.concatenate_p] = _concatenate_jvp
transpose_rules[P.concatenate_p] = _concatenate_transpose

# --- dynamic slicing ---------------------------------------------------------------------------


def _dynamic_slice_jvp(primals: list[Any], tangents: list[Any], *,
                       slice_sizes: tuple[int, ...]) -> tuple[Any, Any]:
    x, *starts = primals
    out = bind(P.dynamic_slice_p, x, *starts, slice_sizes=slice_sizes)
    return out, bind(P.dynamic_slice_p, tangents[0], *starts, slice_sizes=slice_sizes)


def _dynamic_slice_transpose(ct: Any, x: Any, *starts: Any, slice_sizes: tuple[int, ...]) -> list[Any]:
    # dynamic_update_slice clamps the starts exactly as dynamic_slice did
    return [bind(P.dynamic_update_slice_p, zeros(x.aval), ct, *starts)] + [None] * len(starts)


def _dynamic_update_slice_jvp(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
    x, update, *starts = primals
    tx, tupdate = tangents[:2]
    out = bind(P.dynamic_update_slice_p, x, update, *starts)
    return out, bind(P.dynamic_update_slice_p, _instantiate(tx, x), _instantiate(tupdate, update), *starts)


def _dynamic_update_slice_transpose(ct: Any, x: Any, update: Any, *starts: Any) -> list[Any]:
    update_shape = _aval(update).shape
    ct_x = ct_update = None
    if is_undefined(x):  # the overwritten window passes nothing back
        ct_x = bind(P.dynamic_update_slice_p, ct, _zeros_of(update), *starts)
    if is_undefined(update):
        ct_update = bind(P.dynamic_slice_p, ct, *starts, slice_sizes=update_shape)
    return [ct_x, ct_update] + [None] * len(starts)


jvp_rules[P.dynamic_slice_p] = _dynamic_slice_jvp
transpose_rules[P.dynamic_slice_p] = _dynamic_slice_transpose
jvp_rules[P.dynamic_update_slice_p] = _dynamic_update_slice_jvp
transpose_rules[P.dynamic_update_slice_p] = _dynamic_update_slice_transpose

# --- gather and scatter ------------------------------------------------------------------------


def _index_bounds(indices: Any, operand_shape: tuple[int, ...], axes: tuple[int, ...], last: bool) -> Any:
    """Per-column bounds for ``indices`` (shape ``(..., len(axes))``): the size of each indexed
    axis, or its last valid index when ``last``."""
    bounds = np.array([max(operand_shape[a] - 1, 0) if last else operand_shape[a] for a in axes],
                      dtype=indices.dtype)
    if len(set(bounds.tolist())) == 1:  # one bound for every column: an inline literal
        return bounds[0]
    return bind(P.broadcast_in_dim_p, Tensor(bounds, dtype=indices.dtype), shape=indices.shape,
                broadcast_dimensions=(indices.ndim - 1,))


def _clamp_indices(indices: Any, operand_shape: tuple[int, ...], axes: tuple[int, ...]) -> Any:
    """gather clamps out-of-range indices while scatter drops them: clamp before scattering."""
    low = bind(P.max_p, indices, _const(indices, 0))
    return bind(P.min_p, low, _index_bounds(indices, operand_shape, axes, last=True))


def _in_range(indices: Any, operand_shape: tuple[int, ...], axes: tuple[int, ...]) -> Any:
    """Which index rows (shape ``indices.shape[:-1]``) a scatter applies rather than drops."""
    ok = bind(P.and_p, bind(P.ge_p, indices, _const(indices, 0)),
              bind(P.lt_p, indices, _index_bounds(indices, operand_shape, axes, last=False)))
    return bind(P.reduce_min_p, ok, axes=(indices.ndim - 1,))


def _mask_updates(mask: Any, values: Any) -> Any:
    """Zero the entries of ``values`` (shaped like scatter updates) whose index row is masked out."""
    dims = tuple(range(mask.ndim))
    spread = bind(P.broadcast_in_dim_p, mask, shape=values.shape, broadcast_dimensions=dims)
    return _select(spread, values, _const(values, 0))


def _gather_jvp(primals: list[Any], tangents: list[Any], *, axes: tuple[int, ...]) -> tuple[Any, Any]:
    (x, indices), tx = primals, tangents[0]
    return bind(P.gather_p, x, indices, axes=axes), bind(P.gather_p, tx, indices, axes=axes)


def _gather_transpose(ct: Any, x: Any, indices: Any, *, axes: tuple[int, ...]) -> list[Any]:
    clamped = _clamp_indices(indices, x.aval.shape, axes)
    return [bind(P.scatter_p, zeros(x.aval), clamped, ct, axes=axes, mode="add"), None]


jvp_rules[P.gather_p] = _gather_jvp
transpose_rules[P.gather_p] = _gather_transpose


def _scatter_jvp(primals: list[Any], tangents: list[Any], *, axes: tuple[int, ...],
                 mode: str) -> tuple[Any, Any]:
    (x, indices, updates), (tx, _, tupdates) = primals, tangents
    out = bind(P.scatter_p, x, indices, updates, axes=axes, mode=mode)
    if mode in ("add", "set"):  # linear in (operand, updates) together
        tangent = bind(P.scatter_p, _instantiate(tx, x), indices, _instantiate(tupdates, updates),
                       axes=axes, mode=mode)
        return out, tangent
    if mode == "mul":
        return out, _scatter_mul_tangent(x, indices, updates, tx, tupdates, axes)
    return out, _scatter_extremum_tangent(x, indices, updates, out, tx, tupdates, axes)


def _scatter_mul_tangent(x: Any, indices: Any, updates: Any, tx: Any, tupdates: Any,
                         axes: tuple[int, ...]) -> Any:
    """out[p] = x[p] * prod_k u[k] over the updates k landing on p. The product of the *other*
    updates at p is computed without dividing by a zero update: from the product of the nonzero
    updates and the count of zero ones at each position. The first derivative is exact everywhere;
    higher derivatives with respect to the updates are exact away from zero updates only (the
    zero-count selection is piecewise). JAX supports only unique indices here."""
    terms = []
    ones_like_x = bind(P.broadcast_in_dim_p, _const(x, 1), shape=_aval(x).shape, broadcast_dimensions=())

    def scatter(into: Any, values: Any, mode: str) -> Any:
        return bind(P.scatter_p, into, indices, values, axes=axes, mode=mode)

    factor = scatter(ones_like_x, updates, "mul")
    if tx is not None:
        terms.append(_mul(tx, factor))
    if tupdates is not None:
        zero, one = _const(updates, 0), _const(updates, 1)
        is_zero = _eq(updates, zero)
        nonzero_product = scatter(ones_like_x, _select(is_zero, one, updates), "mul")
        zero_count = scatter(zeros(_aval(x)), _select(is_zero, one, zero), "add")
        nonzero_here = bind(P.gather_p, nonzero_product, indices, axes=axes)
        zeros_here = bind(P.gather_p, zero_count, indices, axes=axes)
        # the product of the others: nonzero_product / u if u != 0, else nonzero_product if u is the only zero
        others = _select(is_zero, _select(_eq(zeros_here, one), nonzero_here, zero),
                         _select(_eq(zeros_here, zero), _div(nonzero_here, _replace_zero(updates)), zero))
        spread = scatter(zeros(_aval(x)), _mul(tupdates, others), "add")
        terms.append(_mul(x, spread))
    return _sum_terms(terms, _aval(x).shape)


def _scatter_extremum_tangent(x: Any, indices: Any, updates: Any, out: Any, tx: Any, tupdates: Any,
                              axes: tuple[int, ...]) -> Any:
    """scatter max/min: each position's tangent is the average of the tangents of the operand and
    the updates that equal the result there (ties split evenly, as JAX)."""
    zero, one = _const(out, 0), _const(out, 1)
    retained = _select(_eq(x, out), one, zero)
    winning = _select(_eq(updates, bind(P.gather_p, out, indices, axes=axes)), one, zero)
    winners = bind(P.scatter_p, zeros(out.aval), indices, winning, axes=axes, mode="add")
    count = bind(P.max_p, _add(retained, winners), one)  # guards NaN positions (no winner)
    terms = []
    if tx is not None:
        terms.append(_mul(tx, retained))
    if tupdates is not None:
        spread = bind(P.scatter_p, zeros(out.aval), indices, _mul(tupdates, winning), axes=axes, mode="add")
        terms.append(spread)
    return _div(_sum_terms(terms, out.shape), count)


def _scatter_transpose(ct: Any, x: Any, indices: Any, updates: Any, *, axes: tuple[int, ...],
                       mode: str) -> list[Any]:
    if mode not in ("add", "set"):
        raise AssertionError(f"scatter with mode {mode!r} is not linear")
    shape = _aval(x).shape
    gathered = bind(P.gather_p, ct, indices, axes=axes)  # gather clamps; dropped updates are masked below
    if mode == "add":
        ct_x = ct
        ct_updates = _mask_updates(_in_range(indices, shape, axes), gathered)
    else:
        # overwritten positions pass nothing back to the operand
        ct_x = bind(P.scatter_p, ct, indices, _zeros_of(updates), axes=axes, mode="set")
        # only the update that lands (the last of duplicates; none if out of range) gets the cotangent:
        # scatter each update's id and read back which id won at its position
        update_shape = _aval(updates).shape
        ids = bind(P.reshape_p, _iota((math.prod(update_shape),), 0), new_sizes=update_shape)
        unset = bind(P.broadcast_in_dim_p, np.int32(-1), shape=shape, broadcast_dimensions=())
        written = bind(P.scatter_p, unset, indices, ids, axes=axes, mode="set")
        landed = bind(P.gather_p, written, indices, axes=axes)
        ct_updates = _select(_eq(landed, ids), gathered, _const(ct, 0))
    return [ct_x if is_undefined(x) else None, None, ct_updates if is_undefined(updates) else None]


jvp_rules[P.scatter_p] = _scatter_jvp
transpose_rules[P.scatter_p] = _scatter_transpose

# --- dot_general -------------------------------------------------------------------------------


def _bilinear_jvp(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    """The jvp of a bilinear primitive f(x, y): f(tx, y) + f(x, ty)."""
    def jvp(primals: list[Any], tangents: list[Any], **params: Any) -> tuple[Any, Any]:
        (x, y), (tx, ty) = primals, tangents
        out = bind(primitive, x, y, **params)
        terms = []
        if tx is not None:
            terms.append(bind(primitive, tx, y, **params))
        if ty is not None:
            terms.append(bind(primitive, x, ty, **params))
        return out, _sum_terms(terms, out.shape)
    return jvp


def _dot_general_transpose(ct: Any, x: Any, y: Any, *, contracting: Any, batch: Any) -> list[Any]:
    """Transpose one operand of a dot_general: contract the cotangent with the other operand over
    its free dims, then permute the result back to the operand's dimension order."""
    if is_undefined(x) and is_undefined(y):
        raise AssertionError("dot_general of two linear operands is not linear")
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


jvp_rules[P.dot_general_p] = _bilinear_jvp(P.dot_general_p)
transpose_rules[P.dot_general_p] = _dot_general_transpose

# --- conv_general_dilated ----------------------------------------------------------------------
# The convolution is bilinear; each transpose is again a convolution (JAX's
# _conv_general_dilated_transpose_lhs/rhs), so the backward pass gets the compiler's conv lowering.


def _conv_transpose(ct: Any, lhs: Any, rhs: Any, *, window_strides: tuple[int, ...],
                    padding: tuple[tuple[int, int], ...], lhs_dilation: tuple[int, ...],
                    rhs_dilation: tuple[int, ...], feature_group_count: int) -> list[Any]:
    if is_undefined(lhs) and is_undefined(rhs):
        raise AssertionError("conv_general_dilated of two linear operands is not linear")
    if is_undefined(lhs):
        return [_conv_transpose_lhs(ct, lhs.aval, rhs, window_strides, padding, lhs_dilation, rhs_dilation,
                                    feature_group_count), None]
    return [None, _conv_transpose_rhs(ct, lhs, rhs.aval, window_strides, padding, lhs_dilation, rhs_dilation,
                                      feature_group_count)]


def _conv_transpose_lhs(ct: Any, lhs_aval: ShapedArray, rhs: Any, strides: Sequence[int],
                        padding: Sequence[tuple[int, int]], lhs_dilation: Sequence[int],
                        rhs_dilation: Sequence[int], groups: int) -> Any:
    """d lhs: the cotangent, dilated by the strides, convolved with the flipped kernel whose in/out
    channels are swapped (per group); striding by lhs_dilation undoes the lhs dilation."""
    out_channels, group_in, *kernel = rhs.shape
    spatial = list(range(2, rhs.ndim))
    swapped = bind(P.reshape_p, rhs, new_sizes=(groups, out_channels // groups, group_in, *kernel))
    swapped = bind(P.transpose_p, swapped, permutation=(0, 2, 1, *range(3, rhs.ndim + 1)))
    swapped = bind(P.reshape_p, swapped, new_sizes=(groups * group_in, out_channels // groups, *kernel))
    flipped = bind(P.flip_p, swapped, axes=tuple(spatial))
    pads = []
    for size, k, out, stride, (lo, _), ld, rd in zip(lhs_aval.shape[2:], kernel, ct.shape[2:], strides, padding,
                                                     lhs_dilation, rhs_dilation):
        span, dilated = (k - 1) * rd + 1, (size - 1) * ld + 1
        before = span - 1 - lo
        pads.append((before, dilated + span - 1 - ((out - 1) * stride + 1) - before))
    return bind(P.conv_general_dilated_p, ct, flipped, window_strides=tuple(lhs_dilation), padding=tuple(pads),
                lhs_dilation=tuple(strides), rhs_dilation=tuple(rhs_dilation), feature_group_count=groups)


def _conv_transpose_rhs(ct: Any, lhs: Any, rhs_aval: ShapedArray, strides: Sequence[int],
                        padding: Sequence[tuple[int, int]], lhs_dilation: Sequence[int],
                        rhs_dilation: Sequence[int], groups: int) -> Any:
    """d rhs: a convolution of lhs (channels as the batch, the batch as features) with the cotangent
    as the kernel (dilated by the strides), giving (C, O, *kernel). Groups are one such conv each
    (there is no batch_group_count), concatenated over O."""
    kernel = rhs_aval.shape[2:]
    pads = []
    for size, k, out, stride, (lo, hi), ld, rd in zip(lhs.shape[2:], kernel, ct.shape[2:], strides, padding,
                                                      lhs_dilation, rhs_dilation):
        padded = (size - 1) * ld + 1 + lo + hi
        extra = padded - (out - 1) * stride - 1 - (k - 1) * rd  # input the forward windows never reached
        pads.append((lo, hi - extra))
    lhs_t = bind(P.transpose_p, lhs, permutation=(1, 0, *range(2, lhs.ndim)))
    ct_t = bind(P.transpose_p, ct, permutation=(1, 0, *range(2, ct.ndim)))
    per_group_in, per_group_out = lhs.shape[1] // groups, ct.shape[1] // groups
    results = []
    for g in range(groups):
        part_lhs, part_ct = lhs_t, ct_t
        if groups > 1:
            part_lhs = _slice_axis0(lhs_t, g * per_group_in, (g + 1) * per_group_in)
            part_ct = _slice_axis0(ct_t, g * per_group_out, (g + 1) * per_group_out)
        grad = bind(P.conv_general_dilated_p, part_lhs, part_ct, window_strides=tuple(rhs_dilation),
                    padding=tuple(pads), lhs_dilation=tuple(lhs_dilation), rhs_dilation=tuple(strides),
                    feature_group_count=1)  # (C / groups, O / groups, *kernel)
        results.append(bind(P.transpose_p, grad, permutation=(1, 0, *range(2, grad.ndim))))
    return results[0] if groups == 1 else bind(P.concatenate_p, *results, axis=0)


def _slice_axis0(x: Any, start: int, stop: int) -> Any:
    return bind(P.slice_p, x, start=(start,) + (0,) * (x.ndim - 1), limit=(stop,) + tuple(x.shape[1:]),
                strides=(1,) * x.ndim)


jvp_rules[P.conv_general_dilated_p] = _bilinear_jvp(P.conv_general_dilated_p)
transpose_rules[P.conv_general_dilated_p] = _conv_transpose

# --- sort --------------------------------------------------------------------------------------


def _sort_jvp(primals: list[Any], tangents: list[Any], *, dimension: int, num_keys: int,
              descending: bool) -> tuple[Any, Any]:
    """Sort positions along with the operands (an extra, non-key iota operand), then move each
    tangent by that permutation."""
    positions = _iota(primals[0].shape, dimension)
    *outs, permutation = bind(P.sort_p, *primals, positions, dimension=dimension, num_keys=num_keys,
                              descending=descending)
    tangents_out = [None if t is None else _take_along_axis(t, permutation, dimension) for t in tangents]
    return outs, tangents_out


jvp_rules[P.sort_p] = _sort_jvp

# --- linear algebra ----------------------------------------------------------------------------
# The rules below act on the last two axes and carry any leading batch axes along. Tangents are
# built from products with known matrices (dot_general), ``solve`` in its right-hand side (linear),
# triangular and diagonal masks (select) and elementwise scalings by known values, so each is
# linear in the input tangent and transposes. Derivations: with A = L L^T, A = Q R, A = V diag(w) V^T
# and A = U diag(s) V^T, differentiate, move the known factors to the other side, and split the
# result by the structure (triangular, skew-symmetric, diagonal) the unknown differential must have.


def _matrix_transpose(x: Any) -> Any:
    return bind(P.transpose_p, x, permutation=tuple(range(x.ndim - 2)) + (x.ndim - 1, x.ndim - 2))


def _matmul(x: Any, y: Any) -> Any:
    batch = tuple(range(x.ndim - 2))
    return bind(P.dot_general_p, x, y, contracting=((x.ndim - 1,), (y.ndim - 2,)), batch=(batch, batch))


def _solve(a: Any, b: Any, transpose_a: bool = False) -> Any:
    return bind(P.solve_p, a, b, transpose_a=transpose_a)


def _band_mask(shape: tuple[int, ...], keep: Callable[[Any, Any], Any]) -> Any:
    """A bool mask of ``shape`` true where ``keep(row, column)`` is (over the last two axes)."""
    return keep(_iota(shape, len(shape) - 2), _iota(shape, len(shape) - 1))


def _masked(x: Any, mask: Any) -> Any:
    return _select(mask, x, _zeros_of(x))


def _strictly_lower(x: Any) -> Any:
    return _masked(x, _band_mask(x.shape, lambda row, col: bind(P.gt_p, row, col)))


def _diagonal_part(x: Any) -> Any:
    """The matrix with only the diagonal of ``x`` kept."""
    return _masked(x, _band_mask(x.shape, _eq))


def _diagonal_of(x: Any) -> Any:
    """The diagonal of the square matrices ``x`` (..., n, n) as (..., n)."""
    return _reduce_sum(_diagonal_part(x), (x.ndim - 1,))


def _symmetric_part(x: Any) -> Any:
    return _mul(_add(x, _matrix_transpose(x)), _const(x, 0.5))


def _scale_columns(x: Any, scale: Any) -> Any:
    """``x * scale[..., None, :]``: column j of each matrix times ``scale[..., j]``."""
    batch = tuple(range(x.ndim - 2))
    return _mul(x, bind(P.broadcast_in_dim_p, scale, shape=x.shape, broadcast_dimensions=batch + (x.ndim - 1,)))


def _scale_rows(x: Any, scale: Any) -> Any:
    batch = tuple(range(x.ndim - 2))
    return _mul(x, bind(P.broadcast_in_dim_p, scale, shape=x.shape, broadcast_dimensions=batch + (x.ndim - 2,)))


def _inverse_gaps(values: Any) -> Any:
    """F[..., i, j] = 1 / (values[j] - values[i]) off the diagonal, 0 where the two are equal
    (the diagonal, and repeated values, whose eigen/singular vectors are not unique: the part of the
    tangent that would be infinite is dropped rather than made NaN)."""
    n, batch = values.shape[-1], tuple(range(values.ndim - 1))
    shape = tuple(values.shape) + (n,)
    as_column = bind(P.broadcast_in_dim_p, values, shape=shape, broadcast_dimensions=batch + (values.ndim - 1,))
    as_row = bind(P.broadcast_in_dim_p, values, shape=shape, broadcast_dimensions=batch + (values.ndim,))
    gaps = _sub(as_row, as_column)
    same = _eq(gaps, _const(gaps, 0.0))
    safe = _select(same, bind(P.broadcast_in_dim_p, _const(gaps, 1.0), shape=shape, broadcast_dimensions=()), gaps)
    return _select(same, _zeros_of(gaps), _div(_const(gaps, 1.0), safe))


def _cholesky_jvp(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
    """A = L L^T gives L^{-1} dA L^{-T} = L^{-1} dL + (L^{-1} dL)^T with L^{-1} dL lower triangular:
    dL = L Phi(L^{-1} dA L^{-T}), Phi keeping the strictly lower part and half the diagonal."""
    (a,), (t,) = primals, tangents
    lower = bind(P.cholesky_p, a)
    if t is None:
        return lower, None
    half_solved = _solve(lower, _symmetric_part(t))  # L^{-1} dA
    middle = _solve(lower, _matrix_transpose(half_solved))  # L^{-1} (L^{-1} dA)^T = L^{-1} dA L^{-T}
    phi = _add(_strictly_lower(middle), _mul(_diagonal_part(middle), _const(middle, 0.5)))
    return lower, _matmul(lower, phi)


def _solve_jvp(primals: list[Any], tangents: list[Any], *, transpose_a: bool) -> tuple[Any, Any]:
    """X = op(A)^{-1} B: dX = op(A)^{-1} (dB - op(dA) X)."""
    (a, b), (ta, tb) = primals, tangents
    x = _solve(a, b, transpose_a)
    rhs = [] if tb is None else [tb]
    if ta is not None:
        rhs.append(_neg(_matmul(_matrix_transpose(ta) if transpose_a else ta, x)))
    if not rhs:
        return x, None
    return x, _solve(a, _sum_terms(rhs, x.shape), transpose_a)


def _solve_transpose(ct: Any, a: Any, b: Any, *, transpose_a: bool) -> list[Any]:
    if is_undefined(a):
        raise NotImplementedError("solve is linear only in its right-hand side b, not in the matrix a")
    return [None, _solve(a, ct, not transpose_a)]


def _slogdet_jvp(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
    """d log|det A| = trace(A^{-1} dA); the sign is piecewise constant."""
    (a,), (t,) = primals, tangents
    sign, logabsdet = bind(P.slogdet_p, a)
    if t is None:
        return [sign, logabsdet], [None, None]
    trace = _reduce_sum(_diagonal_part(_solve(a, t)), (a.ndim - 2, a.ndim - 1))
    return [sign, logabsdet], [None, trace]


def _eigh_jvp(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
    """A = V diag(w) V^T: with P = V^T dA V, dw = diag(P) and dV = V (F o P), F = 1 / (w_j - w_i)."""
    (a,), (t,) = primals, tangents
    w, v = bind(P.eigh_p, a)
    if t is None:
        return [w, v], [None, None]
    projected = _matmul(_matmul(_matrix_transpose(v), _symmetric_part(t)), v)
    return [w, v], [_diagonal_of(projected), _matmul(v, _mul(_inverse_gaps(w), projected))]


def _slice_columns(x: Any, start: int, stop: int) -> Any:
    return bind(P.slice_p, x, start=(0,) * (x.ndim - 1) + (start,), limit=tuple(x.shape[:-1]) + (stop,),
                strides=(1,) * x.ndim)


def _qr_tangents(q: Any, r: Any, t: Any) -> tuple[Any, Any]:
    """A = Q R with A (m, n), m >= n, R (n, n) invertible: C = Q^T dA R^{-1} = Q^T dQ + dR R^{-1},
    Q^T dQ skew-symmetric and dR R^{-1} upper triangular, so Omega = Q^T dQ is the strictly lower
    part of C minus its transpose; dR = (C - Omega) R and dQ = Q Omega + dA R^{-1} - Q C."""
    t_rinv = _matrix_transpose(_solve(r, _matrix_transpose(t), transpose_a=True))  # dA R^{-1}
    c = _matmul(_matrix_transpose(q), t_rinv)
    lower = _strictly_lower(c)
    omega = _sub(lower, _matrix_transpose(lower))
    dq = _add(_matmul(q, _sub(omega, c)), t_rinv)
    return dq, _matmul(_sub(c, omega), r)


def _qr_jvp(primals: list[Any], tangents: list[Any], *, full_matrices: bool) -> tuple[Any, Any]:
    """m >= n: ``_qr_tangents``. m < n: A = Q [R1 R2] with the square part A1 = Q R1 as above and
    dR2 = Q^T (dA2 - dQ R2)."""
    (a,), (t,) = primals, tangents
    q, r = bind(P.qr_p, a, full_matrices=full_matrices)
    if t is None:
        return [q, r], [None, None]
    m, n = a.shape[-2:]
    if full_matrices and m > n:
        raise NotImplementedError(f"the derivative of qr with full_matrices=True (mode='complete') is not "
                                  f"defined for a tall matrix ({m}x{n}: its extra columns of Q are not unique); "
                                  "use mode='reduced'")
    if m >= n:
        dq, dr = _qr_tangents(q, r, t)
        return [q, r], [dq, dr]
    square_r, rest_r = _slice_columns(r, 0, m), _slice_columns(r, m, n)
    dq, square_dr = _qr_tangents(q, square_r, _slice_columns(t, 0, m))
    rest_dr = _matmul(_matrix_transpose(q), _sub(_slice_columns(t, m, n), _matmul(dq, rest_r)))
    return [q, r], [dq, bind(P.concatenate_p, square_dr, rest_dr, axis=r.ndim - 1)]


def _svd_jvp(primals: list[Any], tangents: list[Any], *, full_matrices: bool,
             compute_uv: bool) -> tuple[Any, Any]:
    """A = U diag(s) V^T (reduced, k = min(m, n)). With P = U^T dA V: ds = diag(P),
    dU = U (F o (P S + S P^T)) + (I - U U^T) dA V S^{-1},
    dV = V (F o (S P + P^T S)) + (I - V V^T) dA^T U S^{-1}, F = 1 / (s_j^2 - s_i^2)."""
    (a,), (t,) = primals, tangents
    m, n = a.shape[-2:]
    if compute_uv and full_matrices and m != n:
        raise NotImplementedError(f"the derivative of svd with full_matrices=True is not defined for a "
                                  f"{m}x{n} matrix (its extra singular vectors are not unique); "
                                  "use full_matrices=False")
    u, s, vh = bind(P.svd_p, a, full_matrices=False, compute_uv=True)
    outs = [u, s, vh] if compute_uv else [s]
    if t is None:
        return outs, [None] * len(outs)
    v = _matrix_transpose(vh)
    projected = _matmul(_matmul(_matrix_transpose(u), t), v)
    ds = _diagonal_of(projected)
    if not compute_uv:
        return outs, [ds]
    gaps = _inverse_gaps(_mul(s, s))
    p_s, s_p = _scale_columns(projected, s), _scale_rows(projected, s)
    du = _matmul(u, _mul(gaps, _add(p_s, _matrix_transpose(p_s))))
    dv = _matmul(v, _mul(gaps, _add(s_p, _matrix_transpose(s_p))))
    inverse_s = _div(_const(s, 1.0), s)
    if m > n:  # the part of dA V outside U's columns
        du = _add(du, _scale_columns(_sub(_matmul(t, v), _matmul(u, projected)), inverse_s))
    if n > m:
        dv = _add(dv, _scale_columns(_sub(_matmul(_matrix_transpose(t), u),
                                          _matmul(v, _matrix_transpose(projected))), inverse_s))
    return outs, [du, ds, _matrix_transpose(dv)]


jvp_rules[P.cholesky_p] = _cholesky_jvp
jvp_rules[P.solve_p] = _solve_jvp
transpose_rules[P.solve_p] = _solve_transpose
jvp_rules[P.slogdet_p] = _slogdet_jvp
jvp_rules[P.eigh_p] = _eigh_jvp
jvp_rules[P.qr_p] = _qr_jvp
jvp_rules[P.svd_p] = _svd_jvp
