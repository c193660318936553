"""Reductions and statistics: sum, prod, max, min, mean, var, std, all, any, argmax, argmin,
cumulative sums and products, NaN-ignoring forms and diff.

Each reduction normalises ``axis`` (None, an int or a tuple, negatives allowed), binds one
reduction primitive over those axes, and restores them as size-1 axes when ``keepdims``.
``sum`` and ``prod`` accumulate small integers in the default integer type and bools as int32,
as the Array API and JAX do; ``mean``/``var``/``std`` of integers give the default float.
The order statistics built on sorting (``median``, ``quantile``, ``percentile``) are in
``searching``, above this module.
"""

from __future__ import annotations

import builtins
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import (
    ArrayLike,
    Axis,
    asarray,
    astype,
    broadcast_to,
    normalize_axes,
    normalize_axis,
    result_type,
)
from funcgrad.numpy.creation import full_like
from funcgrad.numpy.elementwise import (
    add,
    divide,
    exp,
    isfinite,
    isnan,
    log,
    logical_not,
    multiply,
    not_equal,
    sqrt,
    subtract,
    where,
)
from funcgrad.numpy.manipulation import concat


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
    """Sum over ``axis`` (all axes by default).

    >>> sum(asarray([[1, 2], [3, 4]]), axis=0).tolist()
    [4, 6]
    """
    x = asarray(x)
    return _reduce(P.reduce_sum_p, astype(x, _accumulation_dtype(x, dtype)), axis, keepdims)


def prod(x: ArrayLike, /, *, axis: Axis = None, dtype: Any = None, keepdims: bool = False) -> Tensor:
    """The product of the elements along ``axis`` (all axes when None), accumulated in ``dtype``
    (small integers widen, as the Array API says).

    >>> prod(asarray([1.0, 2.0, 3.0, 4.0])).item()
    24.0
    """
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
    """The smallest element along ``axis`` (all axes when None); an empty axis raises (no identity).
    Also ``amin``.

    >>> min(asarray([[1.0, 5.0], [-2.0, 3.0]]), axis=0).tolist()
    [-2.0, 3.0]
    """
    x = asarray(x)
    _check_nonempty("min", x, axis)
    return _reduce(P.reduce_min_p, x, axis, keepdims)


amax, amin = max, min


def _as_bool(x: Tensor) -> Tensor:
    return x if dtypes.is_bool(x.dtype) else not_equal(x, 0)


def all(x: ArrayLike, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """True where every element over ``axis`` is nonzero (True for empty axes)."""
    return _reduce(P.reduce_min_p, _as_bool(asarray(x)), axis, keepdims)


def any(x: ArrayLike, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Whether any element along ``axis`` (all axes when None) is true (non-zero).

    >>> any(asarray([[0, 1], [0, 0]]), axis=1).tolist()
    [True, False]
    """
    return _reduce(P.reduce_max_p, _as_bool(asarray(x)), axis, keepdims)


def _count(x: Tensor, axis: Axis) -> int:
    return int(np.prod([x.shape[a] for a in normalize_axes(axis, x.ndim)], dtype=np.int64))


def _float_input(x: ArrayLike, dtype: Any) -> Tensor:
    x = asarray(x)
    if dtype is not None:
        return astype(x, dtype)
    return x if dtypes.is_inexact(x.dtype) else astype(x, dtypes.default_float)


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
    if dtypes.is_complex(x.dtype):  # |x - mean|^2: the variance of complex numbers is real (NumPy, JAX)
        centered = bind(P.abs_p, centered)
    total = sum(multiply(centered, centered), axis=axis, keepdims=keepdims)
    denominator = _count(x, axis) - correction
    return divide(total, float(denominator) if denominator > 0 else np.nan)


def std(x: ArrayLike, /, *, axis: Axis = None, correction: float = 0.0, keepdims: bool = False,
        ddof: float | None = None) -> Tensor:
    """The standard deviation along ``axis``: ``sqrt(var(x))``, dividing by ``N - correction``
    (``ddof`` is NumPy's name for ``correction``).

    >>> std(asarray([1.0, 3.0])).item()
    1.0
    """
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
    """The index of the smallest element along ``axis`` (of the flattened array when None); the first
    one on ties, as NumPy.

    >>> argmin(asarray([3.0, 1.0, 1.0])).item()
    1
    """
    return _arg_reduce(P.argmin_p, "argmin", x, axis, keepdims)


def logsumexp(x: ArrayLike, /, *, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) computed stably (the max is subtracted first)."""
    x = _float_input(x, None)
    peak = max(x, axis=axis, keepdims=True)
    # a constant for differentiation: it cancels out (the gradient is the softmax either way), and
    # differentiating it only adds rounding at the maxima and a backward pass through max
    peak = bind(P.stop_gradient_p, where(isfinite(peak), peak, 0))
    total = log(sum(exp(subtract(x, peak)), axis=axis, keepdims=True))
    out = add(total, peak)
    if not keepdims:
        axes = normalize_axes(axis, x.ndim)
        out = bind(P.reshape_p, out, new_sizes=tuple(d for i, d in enumerate(x.shape) if i not in axes))
    return out


# --- cumulative reductions -------------------------------------------------------------------


def _flat_if_none(x: Tensor, axis: int | None) -> tuple[Tensor, int]:
    """NumPy's ``axis=None``: operate on the flattened array."""
    if axis is None:
        return bind(P.reshape_p, x, new_sizes=(x.size,)) if x.ndim != 1 else x, 0
    return x, normalize_axis(axis, x.ndim)


def _cumulative(primitive: P.Primitive, x: Tensor, axis: int, reverse: bool = False) -> Tensor:
    return bind(primitive, x, axis=axis, reverse=reverse)


def _prepend_identity(x: Tensor, axis: int, identity: int) -> Tensor:
    low = tuple(1 if i == axis else 0 for i in range(x.ndim))
    value = np.asarray(identity).astype(x.dtype)[()]
    return bind(P.pad_p, x, value, low=low, high=(0,) * x.ndim)


def _array_api_cumulative(primitive: P.Primitive, name: str, identity: int, x: ArrayLike, axis: int | None,
                          dtype: Any, include_initial: bool) -> Tensor:
    x = asarray(x)
    if x.ndim == 0:
        raise ValueError(f"{name} needs an array of rank >= 1, got a 0-d array")
    if axis is None and x.ndim > 1:
        raise ValueError(f"{name} needs axis= for an array of rank {x.ndim} (shape {x.shape})")
    axis = normalize_axis(0 if axis is None else axis, x.ndim)
    out = _cumulative(primitive, astype(x, _accumulation_dtype(x, dtype)), axis)
    return _prepend_identity(out, axis, identity) if include_initial else out


def cumulative_sum(x: ArrayLike, /, *, axis: int | None = None, dtype: Any = None,
                   include_initial: bool = False) -> Tensor:
    """Running sum along ``axis`` (the Array API's name); ``include_initial`` prepends a 0.

    >>> cumulative_sum(asarray([1, 2, 3]), include_initial=True).tolist()
    [0, 1, 3, 6]
    """
    return _array_api_cumulative(P.cumsum_p, "cumulative_sum", 0, x, axis, dtype, include_initial)


def cumulative_prod(x: ArrayLike, /, *, axis: int | None = None, dtype: Any = None,
                    include_initial: bool = False) -> Tensor:
    """Running product along ``axis``; ``include_initial`` prepends a 1."""
    return _array_api_cumulative(P.cumprod_p, "cumulative_prod", 1, x, axis, dtype, include_initial)


def cumsum(a: ArrayLike, axis: int | None = None, dtype: Any = None) -> Tensor:
    """NumPy's cumsum: ``axis=None`` runs over the flattened array.

    >>> cumsum(asarray([1, 2])).tolist()
    [1, 3]
    """
    x = asarray(a)
    x, axis = _flat_if_none(x, axis)
    return _cumulative(P.cumsum_p, astype(x, _accumulation_dtype(x, dtype)), axis)


def cumprod(a: ArrayLike, axis: int | None = None, dtype: Any = None) -> Tensor:
    """NumPy's cumprod: ``axis=None`` runs over the flattened array."""
    x = asarray(a)
    x, axis = _flat_if_none(x, axis)
    return _cumulative(P.cumprod_p, astype(x, _accumulation_dtype(x, dtype)), axis)


def cummax(x: ArrayLike, /, axis: int = 0, *, reverse: bool = False) -> Tensor:
    """Running maximum along ``axis`` (``jax.lax.cummax``); NaN propagates forward."""
    x = asarray(x)
    return _cumulative(P.cummax_p, x, normalize_axis(axis, x.ndim), reverse)


def cummin(x: ArrayLike, /, axis: int = 0, *, reverse: bool = False) -> Tensor:
    """Running minimum along ``axis`` (``jax.lax.cummin``); NaN propagates forward."""
    x = asarray(x)
    return _cumulative(P.cummin_p, x, normalize_axis(axis, x.ndim), reverse)


# --- counting, averages, spreads ---------------------------------------------------------------


def count_nonzero(x: ArrayLike, /, axis: Axis = None, *, keepdims: bool = False) -> Tensor:
    """Number of nonzero (True, non-0, NaN) elements, as int32.

    >>> count_nonzero(asarray([0, 3, 5])).item()
    2
    """
    return sum(_as_bool(asarray(x)), axis=axis, keepdims=keepdims)


def average(a: ArrayLike, axis: Axis = None, weights: ArrayLike | None = None, returned: bool = False, *,
            keepdims: bool = False) -> Tensor | tuple[Tensor, Tensor]:
    """Weighted mean ``sum(a * w) / sum(w)``; ``weights`` match ``a`` or, with an int ``axis``, that
    axis alone. ``returned`` also gives the sum of weights.

    >>> average(asarray([1.0, 3.0]), weights=asarray([3.0, 1.0])).item()
    1.5
    """
    x = asarray(a)
    if weights is None:
        out = mean(x, axis=axis, keepdims=keepdims)
        return (out, full_like(out, float(_count(x, axis)))) if returned else out
    w = asarray(weights)
    dtype = result_type(x, w)
    dtype = dtype if dtypes.is_inexact(dtype) else dtypes.default_float
    x, w = astype(x, dtype), astype(w, dtype)
    if w.shape != x.shape:
        if not isinstance(axis, (int, np.integer)) or w.ndim != 1:
            raise ValueError(f"average: weights of shape {w.shape} differ from a's shape {x.shape}; "
                             "1-d weights need an integer axis")
        ax = normalize_axis(axis, x.ndim)
        if w.shape[0] != x.shape[ax]:
            raise ValueError(f"average: weights of length {w.shape[0]} do not match axis {axis} "
                             f"of shape {x.shape}")
        w = bind(P.reshape_p, w, new_sizes=tuple(w.shape[0] if i == ax else 1 for i in range(x.ndim)))
        w = broadcast_to(w, x.shape)
    total_weight = sum(w, axis=axis, keepdims=keepdims)
    out = divide(sum(multiply(x, w), axis=axis, keepdims=keepdims), total_weight)
    return (out, total_weight) if returned else out


def ptp(x: ArrayLike, /, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Peak to peak: ``max - min`` over ``axis``. >>> ptp(asarray([4, 1, 7])).item()  # 6"""
    x = asarray(x)
    return subtract(max(x, axis=axis, keepdims=keepdims), min(x, axis=axis, keepdims=keepdims))


# --- NaN-ignoring reductions -------------------------------------------------------------------


def _nan_filled(x: Tensor, fill: float) -> Tensor:
    return where(isnan(x), fill, x) if dtypes.is_float(x.dtype) else x


def nansum(a: ArrayLike, /, axis: Axis = None, dtype: Any = None, keepdims: bool = False) -> Tensor:
    """Sum treating NaN as 0. >>> nansum(asarray([1.0, float('nan')])).item()  # 1.0"""
    return sum(_nan_filled(asarray(a), 0.0), axis=axis, dtype=dtype, keepdims=keepdims)


def nanmean(a: ArrayLike, /, axis: Axis = None, dtype: Any = None, keepdims: bool = False) -> Tensor:
    """Mean of the non-NaN elements (NaN where there are none)."""
    x = _float_input(a, dtype)
    count = sum(astype(logical_not(isnan(x)), x.dtype), axis=axis, keepdims=keepdims)
    return divide(nansum(x, axis=axis, keepdims=keepdims), count)


def _nan_extremum(reduce: Any, fill: float, a: ArrayLike, axis: Axis, keepdims: bool) -> Tensor:
    x = asarray(a)
    if not dtypes.is_float(x.dtype):
        return reduce(x, axis=axis, keepdims=keepdims)
    out = reduce(_nan_filled(x, fill), axis=axis, keepdims=keepdims)
    return where(all(isnan(x), axis=axis, keepdims=keepdims), np.nan, out)  # all-NaN slices stay NaN


def nanmax(a: ArrayLike, /, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Largest non-NaN element (NaN for all-NaN slices, as NumPy, which also warns)."""
    return _nan_extremum(max, -np.inf, a, axis, keepdims)


def nanmin(a: ArrayLike, /, axis: Axis = None, keepdims: bool = False) -> Tensor:
    """Smallest non-NaN element (NaN for all-NaN slices)."""
    return _nan_extremum(min, np.inf, a, axis, keepdims)


# --- differences -------------------------------------------------------------------------------


def _slice_axis(x: Tensor, axis: int, start: int, stop: int) -> Tensor:
    return bind(P.slice_p, x, start=tuple(start if i == axis else 0 for i in range(x.ndim)),
                limit=tuple(stop if i == axis else d for i, d in enumerate(x.shape)), strides=(1,) * x.ndim)


def diff(a: ArrayLike, n: int = 1, axis: int = -1, prepend: ArrayLike | None = None,
         append: ArrayLike | None = None) -> Tensor:
    """The ``n``-th discrete difference along ``axis`` (``!=`` for bools, as NumPy).

    >>> diff(asarray([1, 4, 9])).tolist()
    [3, 5]
    """
    x = asarray(a)
    if x.ndim == 0:
        raise ValueError("diff needs an array of rank >= 1, got a 0-d array")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise ValueError(f"diff: order n must be a non-negative integer, got {n!r}")
    axis = normalize_axis(axis, x.ndim)
    pieces = []
    for extra in (prepend, x, append):
        if extra is None:
            continue
        extra = asarray(extra)
        if extra.ndim == 0:
            extra = broadcast_to(extra, tuple(1 if i == axis else d for i, d in enumerate(x.shape)))
        pieces.append(extra)
    x = concat(pieces, axis=axis) if len(pieces) > 1 else x
    for _ in range(n):
        length = x.shape[axis]
        if length == 0:
            break
        later, earlier = _slice_axis(x, axis, 1, length), _slice_axis(x, axis, 0, length - 1)
        x = not_equal(later, earlier) if dtypes.is_bool(x.dtype) else subtract(later, earlier)
    return x


def allclose(a: ArrayLike, b: ArrayLike, rtol: float = 1e-05, atol: float = 1e-08, equal_nan: bool = False) -> Tensor:
    """Whether every element of ``a`` is close to ``b`` (``isclose``), as a 0-d bool array (as JAX).

    >>> bool(allclose(asarray([1.0, 2.0]), asarray([1.0, 2.0 + 1e-9])))
    True
    """
    from funcgrad.numpy.elementwise import isclose
    return all(isclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))


def _array_arguments(fn: Any) -> Any:
    """Reject a list or tuple where an array goes, as jax.numpy does (``fnp.sum([1, 2, 3])``: it
    would be converted on every call; convert it once with ``fnp.asarray``)."""
    import functools

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        for position, arg in enumerate(args[:1]):
            if isinstance(arg, (list, tuple)):
                raise TypeError(f"{fn.__name__} requires an array or a scalar, got a {type(arg).__name__} at "
                                f"position {position}; convert it with fnp.asarray(...) first (as jax.numpy asks)")
        return fn(*args, **kwargs)
    return checked


for _name in ("sum", "prod", "max", "min", "all", "any", "mean", "var", "std", "argmax", "argmin", "cumsum",
              "cumprod", "cumulative_sum", "cumulative_prod", "nansum", "nanmean", "nanmax", "nanmin", "ptp",
              "count_nonzero", "logsumexp"):
    globals()[_name] = _array_arguments(globals()[_name])
del _name

__all__ = [
    "allclose", "all", "amax", "amin", "any", "argmax", "argmin", "average", "count_nonzero", "cummax", "cummin",
    "cumprod", "cumsum", "cumulative_prod", "cumulative_sum", "diff", "logsumexp", "max", "mean",
    "min", "nanmax", "nanmean", "nanmin", "nansum", "prod", "ptp", "std", "sum", "var",
]
