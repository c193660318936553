"""Reductions and statistics: sum, prod, max, min, mean, var, std, all, any, argmax, argmin.

Each reduction normalises ``axis`` (None, an int or a tuple, negatives allowed), binds one
reduction primitive over those axes, and restores them as size-1 axes when ``keepdims``.
``sum`` and ``prod`` accumulate small integers in the default integer type and bools as int32,
as the Array API and JAX do; ``mean``/``var``/``std`` of integers give the default float.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import ArrayLike, asarray, astype
from funcgrad.numpy.elementwise import divide, multiply, sqrt, subtract
from funcgrad.tensor import Tensor, bind

Axis = int | Sequence[int] | None


def normalize_axis(axis: int, ndim: int, name: str = "axis") -> int:
    """A non-negative axis, or a ``ValueError`` naming the rank. >>> normalize_axis(-1, 3)  # 2"""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, got {type(axis).__name__}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"{name} {axis} is out of bounds for an array of rank {ndim}")
    return int(axis) % ndim


def normalize_axes(axis: Axis, ndim: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    normalized = tuple(normalize_axis(a, ndim) for a in axes)
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"repeated axis in {axis}")
    return normalized


def _keepdims_shape(shape: tuple[int, ...], axes: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(1 if i in axes else d for i, d in enumerate(shape))


def _reduce(primitive: P.Primitive, x: Tensor, axis: Axis, keepdims: bool) -> Tensor:
    axes = normalize_axes(axis, x.ndim)
    out = bind(primitive, x, axes=tuple(sorted(axes)))
    if keepdims:
        out = bind(P.reshape_p, out, new_sizes=_keepdims_shape(x.shape, axes))
    return out


def _accumulation_dtype(x: Tensor, dtype: Any) -> np.dtype:
    if dtype is not None:
        return dtypes.canonicalize(dtype)
    if dtypes.is_bool(x.dtype):
        return dtypes.default_int
    if dtypes.is_int(x.dtype) and x.dtype.itemsize < 4:
        return dtypes.uint32 if dtypes.is_unsigned(x.dtype) else dtypes.default_int
    return x.dtype


def sum(x: ArrayLike, /, *, axis: Axis = None, dtype: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (all axes by default). >>> sum(asarray([[1, 2], [3, 4]]), axis=0).tolist()  # [4, 6]"""
    x = asarray(x)
    return _reduce(P.reduce_sum_p, astype(x, _accumulation_dtype(x, dtype)), axis, keepdims)


def prod(x: ArrayLike, /, *, axis: Axis = None, dtype: Any = None, keepdims: bool = False) -> Tensor:
    x = asarray(x)
    return _reduce(P.reduce_prod_p, astype(x, _accumulation_dtype(x, dtype)), axis, keepdims)


def _check_nonempty(name: str, x: Tensor, axis: Axis) -> None:
    axes = normalize_axes(axis, x.ndim)
    if builtins.any(x.shape[a] == 0 for a in axes):
        raise ValueError(f"{name} of an empty axis has no identity (shape {x.shape}, axis {axis}); "
                         "reduce over non-empty axes only")


def max(x: ArrayLike, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Largest element over ``axis``; NaN propagates. Empty reductions raise ValueError."""
    x = asarray(x)
    _check_nonempty("max", x, axis)
    return _reduce(P.reduce_max_p, x, axis, keepdims)


def min(x: ArrayLike, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    x = asarray(x)
    _check_nonempty("min", x, axis)
    return _reduce(P.reduce_min_p, x, axis, keepdims)


amax, amin = max, min


def _as_bool(x: Tensor) -> Tensor:
    from funcgrad.numpy.elementwise import not_equal
    return x if dtypes.is_bool(x.dtype) else not_equal(x, 0)


def all(x: ArrayLike, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """True where every element over ``axis`` is nonzero (True for empty axes)."""
    return _reduce(P.reduce_min_p, _as_bool(asarray(x)), axis, keepdims)


def any(x: ArrayLike, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    return _reduce(P.reduce_max_p, _as_bool(asarray(x)), axis, keepdims)


def _count(x: Tensor, axis: Axis) -> int:
    return int(np.prod([x.shape[a] for a in normalize_axes(axis, x.ndim)], dtype=np.int64))


def _float_input(x: ArrayLike, dtype: Any) -> Tensor:
    x = asarray(x)
    if dtype is not None:
        return astype(x, dtype)
    return x if dtypes.is_float(x.dtype) else astype(x, dtypes.default_float)


def mean(x: ArrayLike, /, *, axis: Axis = None, keepdims: bool = False, dtype: Any = None) -> Tensor:
    """Arithmetic mean; integers give the default float. Empty axes give NaN, as NumPy does."""
    x = _float_input(x, dtype)
    count = _count(x, axis)
    return divide(sum(x, axis=axis, keepdims=keepdims), float(count) if count else np.nan)


def var(x: ArrayLike, /, *, axis: Axis = None, correction: float = 0.0, keepdims: bool = False,
        ddof: float | None = None) -> Tensor:
    """Variance with ``correction`` (NumPy's ``ddof``) subtracted from the count; two-pass for accuracy."""
    x = _float_input(x, None)
    correction = correction if ddof is None else ddof
    centered = subtract(x, mean(x, axis=axis, keepdims=True))
    total = sum(multiply(centered, centered), axis=axis, keepdims=keepdims)
    denominator = _count(x, axis) - correction
    return divide(total, float(denominator) if denominator > 0 else np.nan)


def std(x: ArrayLike, /, *, axis: Axis = None, correction: float = 0.0, keepdims: bool = False,
        ddof: float | None = None) -> Tensor:
    return sqrt(var(x, axis=axis, correction=correction, keepdims=keepdims, ddof=ddof))


def _arg_reduce(primitive: P.Primitive, name: str, x: ArrayLike, axis: int | None, keepdims: bool) -> Tensor:
    x = asarray(x)
    if axis is None:
        flat = bind(P.reshape_p, x, new_sizes=(x.size,))
        out = _arg_reduce(primitive, name, flat, 0, False)
        return bind(P.reshape_p, out, new_sizes=(1,) * x.ndim) if keepdims else out
    axis = normalize_axis(axis, x.ndim)
    if x.shape[axis] == 0:
        raise ValueError(f"{name} of an empty axis (shape {x.shape}, axis {axis}) has no answer")
    out = bind(primitive, x, axis=axis, index_dtype=dtypes.default_int)
    return bind(P.reshape_p, out, new_sizes=_keepdims_shape(x.shape, (axis,))) if keepdims else out


def argmax(x: ArrayLike, /, *, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Index of the first largest element (NaN counts as largest), as int32."""
    return _arg_reduce(P.argmax_p, "argmax", x, axis, keepdims)


def argmin(x: ArrayLike, /, *, axis: int | None = None, keepdims: bool = False) -> Tensor:
    return _arg_reduce(P.argmin_p, "argmin", x, axis, keepdims)


def logsumexp(x: ArrayLike, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) computed stably (the max is subtracted first)."""
    from funcgrad.numpy.elementwise import add, exp, isfinite, log, where
    x = _float_input(x, None)
    peak = max(x, axis=axis, keepdims=True)
    peak = where(isfinite(peak), peak, 0)
    total = log(sum(exp(subtract(x, peak)), axis=axis, keepdims=True))
    out = add(total, peak)
    if not keepdims:
        axes = normalize_axes(axis, x.ndim)
        out = bind(P.reshape_p, out, new_sizes=tuple(d for i, d in enumerate(x.shape) if i not in axes))
    return out


# every public function defined above (aliases included) is part of funcgrad.numpy
__all__ = [name for name, value in list(globals().items())
           if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == __name__]
