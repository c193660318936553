"""Sorting and searching: sort, argsort, top_k, searchsorted, isin, nonzero, argwhere, unique, and
the order statistics built on sort (median, quantile, percentile).

``sort``/``argsort``/``top_k`` bind the ``sort`` primitive (stable, NaN last ascending and first
descending); ``argsort`` sorts the pair (x, iota) by x and keeps the permuted iota.
``searchsorted`` and ``isin`` compare every query with every element (O(len(a) * len(v)) work and
memory) and count or reduce the matches: no data-dependent shapes, so they trace.

``nonzero``/``argwhere``/``flatnonzero``/``unique*`` have output shapes that depend on the values.
Without ``size=`` they realize the array and compute with NumPy, so under tracing they raise
``ConcretizationError``. With ``size=`` (as in JAX) they are compositions of sort, cumsum and
gather, fill missing entries with ``fill_value`` and trace like everything else.

``median``/``quantile``/``percentile`` sort along the reduced axes and gather the neighbouring order
statistics, so they trace like everything else.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.tracing import ConcretizationError
from funcgrad.numpy.conversion import (
    ArrayLike,
    Axis,
    asarray,
    astype,
    broadcast_to,
    normalize_axes,
    normalize_axis,
    promote,
)
from funcgrad.numpy.elementwise import (
    add,
    ceil,
    divide,
    equal,
    floor,
    floor_divide,
    isnan,
    less,
    logical_and,
    logical_not,
    logical_or,
    multiply,
    not_equal,
    remainder,
    round,
    subtract,
    where,
)
from funcgrad.numpy.manipulation import expand_dims, permute_dims, ravel, reshape, stack
from funcgrad.numpy.reductions import _count, _float_input, _keepdims_shape, cumsum
from funcgrad.numpy.reductions import any as any_
from funcgrad.numpy.reductions import sum as sum_

__all__ = ["sort", "argsort", "top_k", "searchsorted", "isin", "nonzero", "argwhere", "flatnonzero",
           "median", "percentile", "quantile", "unique", "unique_values", "unique_counts", "unique_inverse",
           "unique_all",
           "UniqueAllResult", "UniqueCountsResult", "UniqueInverseResult"]

_INDEX = dtypes.default_int


def _iota(shape: tuple[int, ...], dimension: int) -> Tensor:
    return bind(P.iota_p, dtype=_INDEX, shape=shape, dimension=dimension)


def _sort_axis(x: Tensor, axis: int | None) -> tuple[Tensor, int]:
    if axis is None:
        return ravel(x), 0
    return x, normalize_axis(axis, x.ndim)


# --- sorting -----------------------------------------------------------------------------------


def sort(x: ArrayLike, /, *, axis: int | None = -1, descending: bool = False, stable: bool = True) -> Tensor:
    """Sorted copy of ``x`` along ``axis`` (``None`` flattens); always stable, NaN sorts last
    (first when ``descending``).

    >>> sort(asarray([3, 1, 2])).tolist()
    [1, 2, 3]
    """
    x, axis = _sort_axis(asarray(x), axis)
    (out,) = bind(P.sort_p, x, dimension=axis, num_keys=1, descending=bool(descending))
    return out


def argsort(x: ArrayLike, /, *, axis: int | None = -1, descending: bool = False,
            stable: bool = True) -> Tensor:
    """Indices (int32) that sort ``x`` along ``axis``; ties keep their order, also when descending.

    >>> argsort(asarray([3, 1, 2])).tolist()
    [1, 2, 0]
    """
    x, axis = _sort_axis(asarray(x), axis)
    _, order = bind(P.sort_p, x, _iota(x.shape, axis), dimension=axis, num_keys=1,
                    descending=bool(descending))
    return order


def top_k(x: ArrayLike, /, k: int) -> tuple[Tensor, Tensor]:
    """The ``k`` largest entries along the last axis and their indices, largest first (ties: lower
    index first; NaN counts as largest).

    >>> values, indices = top_k(asarray([1, 5, 3]), 2)
    >>> values.tolist(), indices.tolist()
    ([5, 3], [1, 2])
    """
    x = asarray(x)
    if x.ndim == 0:
        raise ValueError("top_k needs an array of rank >= 1, got a 0-d array")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= x.shape[-1]:
        raise ValueError(f"top_k: k must be an integer in [0, {x.shape[-1]}] for shape {x.shape}, got {k!r}")
    last = x.ndim - 1
    values, indices = bind(P.sort_p, x, _iota(x.shape, last), dimension=last, num_keys=1, descending=True)
    limit = x.shape[:-1] + (int(k),)
    start, strides = (0,) * x.ndim, (1,) * x.ndim
    return (bind(P.slice_p, values, start=start, limit=limit, strides=strides),
            bind(P.slice_p, indices, start=start, limit=limit, strides=strides))


# --- searching by comparison -------------------------------------------------------------------


def searchsorted(a: ArrayLike, v: ArrayLike, /, *, side: str = "left",
                 sorter: ArrayLike | None = None) -> Tensor:
    """Insertion points (int32) of ``v`` into the sorted 1-d ``a`` that keep it sorted.

    Counts, for each query, the elements of ``a`` ordered before it (``<`` for side='left',
    ``<=`` for 'right') with NaN ordered last as in ``sort``: O(len(a) * v.size) work and memory,
    fine for the moderate sizes this is used with; no data-dependent shapes, so it traces.
    >>> searchsorted(asarray([1, 2, 2, 3]), asarray([2, 5]), side="right").tolist()
    [3, 4]
    """
    if side not in ("left", "right"):
        raise ValueError(f"searchsorted: side must be 'left' or 'right', got {side!r}")
    (a, v), _, _ = promote(asarray(a), asarray(v))
    if a.ndim != 1:
        raise ValueError(f"searchsorted needs a 1-d sorted array, got shape {a.shape}")
    if sorter is not None:
        order = asarray(sorter)
        if order.shape != a.shape or not dtypes.is_int(order.dtype):
            raise ValueError(f"searchsorted: sorter must be integers of shape {a.shape}, got {order.aval}")
        a = bind(P.gather_p, a, reshape(order, a.shape + (1,)), axes=(0,))
    queries = expand_dims(v, -1)
    if side == "left":
        before = a < queries
        if dtypes.is_float(a.dtype):  # a number is ordered before a NaN query
            before = logical_or(before, logical_and(logical_not(isnan(a)), isnan(queries)))
    else:
        before = a <= queries
        if dtypes.is_float(a.dtype):
            before = logical_or(before, isnan(queries))
    return sum_(before, axis=-1, dtype=_INDEX)


def isin(element: ArrayLike, test_elements: ArrayLike, /, *, assume_unique: bool = False,
         invert: bool = False) -> Tensor:
    """True where an element of ``element`` equals some element of ``test_elements`` (compares all
    pairs: O(element.size * test_elements.size)).

    >>> isin(asarray([1, 2, 3]), asarray([2, 3])).tolist()
    [False, True, True]
    """
    element, tests = asarray(element), ravel(asarray(test_elements))
    found = any_(equal(expand_dims(element, -1), tests), axis=-1)
    return logical_not(found) if invert else found


# --- data-dependent shapes ---------------------------------------------------------------------


def _concrete(x: Tensor, name: str) -> np.ndarray:
    if x.is_traced:
        raise ConcretizationError(
            f"{name}: the output shape depends on the values of the input, which are traced here "
            f"(an abstract {x.aval}). Pass size= (and optionally fill_value=) to fix the output size, "
            "as in JAX, or call it outside the trace.")
    return x.numpy()


def _check_size(size: Any, name: str) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ValueError(f"{name}: size must be a non-negative integer, got {size!r}")
    return int(size)


def _first_true(mask: Tensor, size: int) -> tuple[Tensor, Tensor]:
    """Positions of the first ``size`` True entries of the 1-d ``mask`` (padded with 0) and a mask
    of which of the ``size`` slots hold a real position. A stable sort on ``not mask`` brings the
    True positions to the front in order."""
    length = mask.shape[0]
    key = astype(logical_not(mask), _INDEX)
    _, order = bind(P.sort_p, key, _iota((length,), 0), dimension=0, num_keys=1, descending=False)
    if size <= length:
        order = bind(P.slice_p, order, start=(0,), limit=(size,), strides=(1,))
    else:
        order = bind(P.pad_p, order, np.int32(0), low=(0,), high=(size - length,))
    valid = less(_iota((size,), 0), sum_(mask, dtype=_INDEX))
    return order, valid


def _fill_values(fill_value: Any, count: int, name: str) -> list[Any]:
    if fill_value is None:
        return [0] * count
    if isinstance(fill_value, (tuple, list)):
        if len(fill_value) != count:
            raise ValueError(f"{name}: fill_value needs {count} entries (one per dimension), "
                             f"got {len(fill_value)}")
        return list(fill_value)
    return [fill_value] * count


def nonzero(x: ArrayLike, /, *, size: int | None = None, fill_value: Any = None) -> tuple[Tensor, ...]:
    """Indices (int32) of the nonzero elements, one array per dimension, in row-major order.

    With ``size`` the result has exactly that length (cut, or padded with ``fill_value``, default
    0, a scalar or one value per dimension) and the function traces; without it, it needs a
    concrete array.
    >>> nonzero(asarray([0, 3, 0, 5]))[0].tolist()
    [1, 3]
    """
    x = asarray(x)
    if x.ndim == 0:
        raise ValueError("nonzero of a 0-d array is not allowed; use nonzero(atleast_1d(x)) (as NumPy)")
    if size is None:
        return tuple(asarray(i.astype(np.int32)) for i in np.nonzero(_concrete(x, "nonzero")))
    size = _check_size(size, "nonzero")
    mask = ravel(x if dtypes.is_bool(x.dtype) else not_equal(x, 0))
    flat_index, valid = _first_true(mask, size)
    fills = _fill_values(fill_value, x.ndim, "nonzero")
    coordinates, stride = [], 1
    for dim in reversed(range(x.ndim)):
        coordinate = remainder(floor_divide(flat_index, stride), x.shape[dim]) if x.shape[dim] else flat_index
        coordinates.append(where(valid, coordinate, fills[dim]))
        stride *= x.shape[dim]
    return tuple(astype(c, _INDEX) for c in reversed(coordinates))


def flatnonzero(x: ArrayLike, /, *, size: int | None = None, fill_value: Any = None) -> Tensor:
    """Indices of the nonzero elements of the flattened array.

    >>> flatnonzero(asarray([[0, 1], [1, 0]])).tolist()
    [1, 2]
    """
    return nonzero(ravel(asarray(x)), size=size, fill_value=fill_value)[0]


def argwhere(x: ArrayLike, /, *, size: int | None = None, fill_value: Any = None) -> Tensor:
    """Indices of the nonzero elements as rows of an (N, x.ndim) int32 array.

    >>> argwhere(asarray([[0, 1], [1, 0]])).tolist()
    [[0, 1], [1, 0]]
    """
    x = asarray(x)
    if x.ndim == 0:  # NumPy: a 0-d input has one or no zero-length row
        rows = size if size is not None else int(bool(_concrete(x, "argwhere")))
        return broadcast_to(np.int32(0), (rows, 0))
    return stack(list(nonzero(x, size=size, fill_value=fill_value)), axis=1)


# --- unique ------------------------------------------------------------------------------------


class UniqueAllResult(NamedTuple):
    values: Tensor
    indices: Tensor
    inverse_indices: Tensor
    counts: Tensor


class UniqueCountsResult(NamedTuple):
    values: Tensor
    counts: Tensor


class UniqueInverseResult(NamedTuple):
    values: Tensor
    inverse_indices: Tensor


def _unique_with_size(x: Tensor, size: int, fill_value: Any, equal_nan: bool) -> UniqueAllResult:
    """Traceable unique of the flattened ``x`` with a fixed output ``size``.

    Sort (remembering the permutation), mark the first element of each run of equal values,
    find the first ``size`` marks with ``_first_true``, and read values, first indices and run
    lengths there; the inverse maps each sorted run number back through the inverse permutation.
    Missing slots get ``fill_value`` (default: the smallest value), index 0 and count 0.
    """
    flat = ravel(x)
    length = flat.shape[0]
    sorted_values, permutation = bind(P.sort_p, flat, _iota((length,), 0), dimension=0, num_keys=1,
                                      descending=False)
    if length == 0:
        fill = 0 if fill_value is None else fill_value
        empty_index = bind(P.broadcast_in_dim_p, np.int32(0), shape=(size,), broadcast_dimensions=())
        values = astype(broadcast_to(asarray(fill), (size,)), x.dtype)
        return UniqueAllResult(values, empty_index, reshape(astype(flat, _INDEX), x.shape), empty_index)
    later = bind(P.slice_p, sorted_values, start=(1,), limit=(length,), strides=(1,))
    earlier = bind(P.slice_p, sorted_values, start=(0,), limit=(length - 1,), strides=(1,))
    differs = not_equal(later, earlier)
    if equal_nan and dtypes.is_float(x.dtype):
        differs = logical_and(differs, logical_not(logical_and(isnan(later), isnan(earlier))))
    starts_mask = bind(P.pad_p, differs, np.bool_(True), low=(1,), high=(0,))  # the first run starts at 0
    starts, valid = _first_true(starts_mask, size + 1)  # one extra slot: where the next run starts

    def at(values: Tensor, positions: Tensor) -> Tensor:
        return bind(P.gather_p, values, reshape(positions, positions.shape + (1,)), axes=(0,))

    head = bind(P.slice_p, starts, start=(0,), limit=(size,), strides=(1,))
    next_head = bind(P.slice_p, starts, start=(1,), limit=(size + 1,), strides=(1,))
    valid_head = bind(P.slice_p, valid, start=(0,), limit=(size,), strides=(1,))
    valid_next = bind(P.slice_p, valid, start=(1,), limit=(size + 1,), strides=(1,))
    smallest = reshape(bind(P.slice_p, sorted_values, start=(0,), limit=(1,), strides=(1,)), ())
    fill = smallest if fill_value is None else fill_value
    values = where(valid_head, at(sorted_values, head), fill)
    values = astype(values, x.dtype)
    indices = where(valid_head, at(permutation, head), 0)
    run_end = where(valid_next, next_head, length)
    counts = where(valid_head, subtract(run_end, head), 0)
    run_number = subtract(cumsum(astype(starts_mask, _INDEX)), 1)
    inverse_permutation = argsort(permutation)
    inverse = reshape(at(run_number, inverse_permutation), x.shape)
    return UniqueAllResult(values, astype(indices, _INDEX), astype(inverse, _INDEX), astype(counts, _INDEX))


def _unique_numpy(x: Tensor, name: str, equal_nan: bool) -> UniqueAllResult:
    array = _concrete(x, name)
    values, indices, inverse, counts = np.unique(array, return_index=True, return_inverse=True,
                                                 return_counts=True, equal_nan=equal_nan)
    return UniqueAllResult(asarray(values.astype(array.dtype), array.dtype),
                           *(asarray(i.astype(np.int32)) for i in (indices, inverse.reshape(array.shape),
                                                                   counts)))


def _unique_all(x: ArrayLike, name: str, size: int | None, fill_value: Any,
                equal_nan: bool) -> UniqueAllResult:
    x = asarray(x)
    if size is None:
        return _unique_numpy(x, name, equal_nan)
    return _unique_with_size(x, _check_size(size, name), fill_value, equal_nan)


def unique_values(x: ArrayLike, /, *, size: int | None = None, fill_value: Any = None) -> Tensor:
    """The sorted distinct values of ``x`` (NaNs are each distinct, as the Array API says).

    >>> unique_values(asarray([3, 1, 3])).tolist()
    [1, 3]
    """
    return _unique_all(x, "unique_values", size, fill_value, equal_nan=False).values


def unique_counts(x: ArrayLike, /, *, size: int | None = None, fill_value: Any = None) -> UniqueCountsResult:
    """The distinct values and how often each occurs (int32)."""
    result = _unique_all(x, "unique_counts", size, fill_value, equal_nan=False)
    return UniqueCountsResult(result.values, result.counts)


def unique_inverse(x: ArrayLike, /, *, size: int | None = None,
                   fill_value: Any = None) -> UniqueInverseResult:
    """The distinct values and, per element of ``x`` (same shape), the index of its value."""
    result = _unique_all(x, "unique_inverse", size, fill_value, equal_nan=False)
    return UniqueInverseResult(result.values, result.inverse_indices)


def unique_all(x: ArrayLike, /, *, size: int | None = None, fill_value: Any = None) -> UniqueAllResult:
    """Distinct values, first-occurrence indices, inverse indices and counts."""
    return _unique_all(x, "unique_all", size, fill_value, equal_nan=False)


def unique(ar: ArrayLike, return_index: bool = False, return_inverse: bool = False,
           return_counts: bool = False, axis: int | None = None, *, equal_nan: bool = True,
           size: int | None = None, fill_value: Any = None) -> Tensor | tuple[Tensor, ...]:
    """NumPy's unique: the sorted distinct values, plus the arrays the ``return_*`` flags ask for.

    ``axis`` picks distinct slices along an axis (concrete arrays only; with ``size`` only
    ``axis=None`` is supported). NaNs count as equal unless ``equal_nan=False``.
    >>> unique(asarray([2, 1, 2]), return_counts=True)[1].tolist()
    [1, 2]
    """
    x = asarray(ar)
    if axis is None:
        result = _unique_all(x, "unique", size, fill_value, equal_nan)
        parts = [result.values]
        parts += [result.indices] if return_index else []
        parts += [result.inverse_indices] if return_inverse else []
        parts += [result.counts] if return_counts else []
    else:
        if size is not None:
            raise NotImplementedError("unique with both axis= and size= is not supported; flatten the "
                                      "array or call it outside the trace without size=")
        array = _concrete(x, "unique")
        axis = normalize_axis(axis, x.ndim)
        numpy_unique: Any = np.unique  # its overloads cannot see through runtime flags
        outs = numpy_unique(array, return_index, return_inverse, return_counts, axis=axis,
                            equal_nan=equal_nan)
        outs = outs if isinstance(outs, tuple) else (outs,)
        parts = [asarray(outs[0].astype(array.dtype), array.dtype)]
        parts += [asarray(np.asarray(o).reshape(-1).astype(np.int32)) for o in outs[1:]]
    return parts[0] if len(parts) == 1 else tuple(parts)


# --- order statistics (built on sort) ----------------------------------------------------------

_QUANTILE_METHODS = ("linear", "lower", "higher", "nearest", "midpoint")


def _reduced_axes_last(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    """Move ``axes`` to the end and merge them into one axis."""
    kept = [i for i in range(x.ndim) if i not in axes]
    moved = permute_dims(x, kept + list(axes))
    return reshape(moved, tuple(x.shape[i] for i in kept) + (_count(x, axes),))


def quantile(a: ArrayLike, q: ArrayLike, /, axis: Axis = None, *, method: str = "linear",
             keepdims: bool = False) -> Tensor:
    """The ``q``-th quantiles (``q`` in [0, 1], a scalar or an array) over ``axis``, from a sort.

    The result has shape ``q.shape`` followed by the reduced shape, as NumPy. Methods: linear
    (default), lower, higher, nearest, midpoint. NaN anywhere along the axis gives NaN.
    >>> quantile(asarray([1.0, 2.0, 3.0, 4.0]), 0.5).item()
    2.5
    """
    if method not in _QUANTILE_METHODS:
        raise ValueError(f"quantile: unknown method {method!r}; expected one of {_QUANTILE_METHODS}")
    x = _float_input(a, None)
    q = asarray(q)
    if dtypes.is_bool(q.dtype) or not (dtypes.is_float(q.dtype) or dtypes.is_int(q.dtype)):
        raise TypeError(f"quantile: q must be numeric, got {q.dtype.name}")
    if not q.is_traced and not bool(np.all((q.numpy() >= 0) & (q.numpy() <= 1))):
        raise ValueError(f"quantile: q must lie in [0, 1], got {q.numpy()}")
    axes = normalize_axes(axis, x.ndim)
    n = _count(x, axes)
    if n == 0:
        raise ValueError(f"quantile of an empty axis (shape {x.shape}, axis {axis}) has no answer")
    ordered = sort(_reduced_axes_last(x, axes), axis=-1)
    last = ordered.ndim - 1
    position = multiply(astype(q, dtypes.float32), float(n - 1))
    if method == "nearest":
        low = high = round(position)  # half to even, as NumPy
    else:
        low, high = floor(position), ceil(position)
        if method == "lower":
            high = low
        elif method == "higher":
            low = high

    def take(index: Tensor) -> Tensor:
        indices = bind(P.reshape_p, astype(index, dtypes.int32), new_sizes=q.shape + (1,))
        return bind(P.gather_p, ordered, indices, axes=(last,))

    low_value, high_value = take(low), take(high)
    batch_ones = (1,) * (ordered.ndim - 1)
    if method == "midpoint":
        out = multiply(add(low_value, high_value), 0.5)
    else:
        fraction = astype(bind(P.reshape_p, subtract(position, low), new_sizes=q.shape + batch_ones), x.dtype)
        out = add(low_value, multiply(subtract(high_value, low_value), fraction))
    has_nan = any_(isnan(ordered), axis=-1)
    out = where(has_nan, np.nan, out)
    out_shape = q.shape + (_keepdims_shape(x.shape, axes) if keepdims
                           else tuple(d for i, d in enumerate(x.shape) if i not in axes))
    return bind(P.reshape_p, out, new_sizes=out_shape) if out.shape != out_shape else out


def percentile(a: ArrayLike, q: ArrayLike, /, axis: Axis = None, *, method: str = "linear",
               keepdims: bool = False) -> Tensor:
    """The ``q``-th percentiles (``q`` in [0, 100]); see ``quantile``."""
    q = asarray(q)
    q = divide(q, 100.0) if dtypes.is_float(q.dtype) else divide(astype(q, dtypes.float32), 100.0)
    return quantile(a, q, axis=axis, method=method, keepdims=keepdims)


def median(a: ArrayLike, /, axis: Axis = None, *, keepdims: bool = False) -> Tensor:
    """The middle value (mean of the two middle ones for even counts).

    >>> median(asarray([3, 1, 2])).item()
    2.0
    """
    return quantile(a, 0.5, axis=axis, keepdims=keepdims)
