"""Indexing: ``x[index]``, the ``x.at[index]`` updates, ``take``, ``take_along_axis``, ``select``
and the index helpers (``ix_``, ``diag_indices``, ``tril_indices``, ...).

An index is parsed once (``_parse_index``) into an ``_IndexPlan``: one ``_AxisIndex`` per axis of
``x`` after the ``None`` axes are inserted, each a slice, a static integer or an integer array (an
"advanced" index; boolean masks and scalar bools become integer arrays here). Two lowerings share
the plan:

* reading (``getitem``) binds reshape (new axes), one ``slice`` (+ ``flip`` for negative steps),
  reshape (dropped integer axes) and one ``gather`` for all the advanced indices;
* writing (``x.at[index].set(v)`` and friends) turns every axis into an explicit coordinate array
  (an ``iota`` for slices) and binds one ``scatter``, so every index kind takes one update path.

Out-of-range semantics are jax.numpy's: negative indices (integers and entries of index arrays)
wrap once (``size`` is added); reads then clamp to the axis (``x.at[i].get(mode="fill")`` gives a
fill value instead) and updates out of range are dropped; only an axis of size 0 raises IndexError.
Boolean masks need concrete values (the result's shape depends on them), so under tracing they
raise ``ConcretizationError``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.tracing import ConcretizationError
from funcgrad.numpy.conversion import (
    ArrayLike,
    _to_numpy_scalar,
    asarray,
    astype,
    broadcast_shapes,
    broadcast_to,
    normalize_axis,
    promote,
)
from funcgrad.numpy.elementwise import (
    add,
    clip,
    divide,
    equal,
    greater_equal,
    less,
    logical_and,
    multiply,
    negative,
    power,
    remainder,
    where,
)
from funcgrad.numpy.manipulation import permute_dims, ravel, reshape, stack

__all__ = ["take", "take_along_axis", "put_along_axis", "select", "compress", "choose", "ix_",
           "diag_indices", "diag_indices_from", "tril_indices", "tril_indices_from", "triu_indices",
           "triu_indices_from"]

IndexArray = np.ndarray | Tensor  # static (NumPy, int64) or dynamic (Tensor, int32) indices

_VALID_INDICES = ("only integers, slices (`:`), ellipsis (`...`), None (`fnp.newaxis`) and integer or "
                  "boolean arrays are valid indices")

# --- parsing an index ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _AxisIndex:
    """How one axis of ``x`` (after new axes are inserted) is indexed.

    kind "slice": elements ``start + k * step`` for ``k < count`` (new axes are slices of size 1);
    kind "int": the single static element ``start``, and the axis is dropped;
    kind "array": the integer ``array`` (negatives already wrapped), an advanced index.
    ``source`` is the axis of ``x`` it indexes, or None for an inserted axis.
    """

    kind: str
    source: int | None
    start: int = 0
    count: int = 1
    step: int = 1
    array: IndexArray | None = None


@dataclass(frozen=True)
class _IndexPlan:
    """A parsed index: one entry per axis of the expanded array, and where the advanced dims go."""

    axes: tuple[_AxisIndex, ...]
    expanded_shape: tuple[int, ...]
    batch_shape: tuple[int, ...]  # the broadcast shape of the advanced index arrays
    batch_position: int  # where the advanced dims go in the result

    @property
    def array_positions(self) -> tuple[int, ...]:
        return tuple(i for i, ax in enumerate(self.axes) if ax.kind == "array")

    @property
    def kept_positions(self) -> tuple[int, ...]:
        """Expanded axes that survive as result dims of their own (the slices), in order."""
        return tuple(i for i, ax in enumerate(self.axes) if ax.kind == "slice")

    def result_dim(self, position: int) -> int:
        """The result dim of the kept (sliced) expanded axis ``position``."""
        rank = self.kept_positions.index(position)
        return rank if rank < self.batch_position else rank + len(self.batch_shape)

    @property
    def result_shape(self) -> tuple[int, ...]:
        kept = tuple(self.axes[i].count for i in self.kept_positions)
        p = self.batch_position
        return kept[:p] + self.batch_shape + kept[p:]


def _invalid_index(item: Any) -> IndexError:
    what = f"an array of dtype {item.dtype}" if hasattr(item, "dtype") else repr(item)
    return IndexError(f"{_VALID_INDICES}; got {what}")


def _classify(item: Any) -> tuple[str, Any]:
    """One index item as (kind, value): kind is new, ellipsis, slice, int, bool, array or mask."""
    if item is None:
        return "new", None
    if item is Ellipsis:
        return "ellipsis", None
    if isinstance(item, slice):
        return "slice", item
    if isinstance(item, (bool, np.bool_)):
        return "bool", bool(item)
    if isinstance(item, (int, np.integer)):
        return "int", int(item)
    if isinstance(item, (list, tuple)):
        if _contains_tensor(item):
            item = asarray(item)
        else:
            array = np.asarray(item)
            item = array.astype(np.int64) if array.size == 0 else array  # [] indexes nothing
    if isinstance(item, Tensor):
        if dtypes.is_bool(item.dtype):
            if item.is_traced:
                raise ConcretizationError(
                    f"boolean indexing has a value-dependent shape, so it needs a concrete mask, but "
                    f"this mask is traced ({item.aval}). Use fnp.where(mask, x, other) to select "
                    "values with a fixed shape instead.")
            return _classify(item.numpy())
        if not dtypes.is_int(item.dtype):
            raise _invalid_index(item)
        return "array", item
    if isinstance(item, np.ndarray):
        if item.dtype == np.bool_:
            return ("bool", bool(item)) if item.ndim == 0 else ("mask", item)
        if item.dtype.kind not in "iu":
            raise _invalid_index(item)
        return ("int", int(item)) if item.ndim == 0 else ("array", item)
    raise _invalid_index(item)


def _contains_tensor(items: list[Any] | tuple[Any, ...]) -> bool:
    return any(isinstance(item, Tensor) or (isinstance(item, (list, tuple)) and _contains_tensor(item))
               for item in items)


def _normalize_static(index: np.ndarray, size: int) -> np.ndarray:
    """Wrap negative entries once, then clip to [-1, size]: beyond that every value reads as the
    nearest edge and writes nowhere, and the clip keeps the int32 conversion from wrapping."""
    if index.dtype.kind == "u":
        index = np.minimum(index, size)
    index = index.astype(np.int64)
    return np.clip(np.where(index < 0, index + size, index), -1, size)


def _normalize_dynamic(index: Tensor, size: int) -> Tensor:
    """The traced counterpart of ``_normalize_static``, as int32."""
    signed = not dtypes.is_unsigned(index.dtype)
    if index.dtype.itemsize > 4 or index.dtype == dtypes.uint32:
        low = np.asarray(-size - 1 if signed else 0, index.dtype)[()]
        index = clip(index, low, np.asarray(size, index.dtype)[()])
    index = astype(index, dtypes.int32)
    return where(less(index, 0), add(index, size), index) if signed else index


def _normalize_index(index: IndexArray, size: int) -> IndexArray:
    if isinstance(index, Tensor):
        return _normalize_dynamic(index, size)
    return _normalize_static(index, size)


def _consumed(kind: str, value: Any) -> int:
    """How many axes of ``x`` an index item indexes."""
    if kind in ("int", "slice", "array"):
        return 1
    return value.ndim if kind == "mask" else 0


def _expand_ellipsis(items: list[tuple[str, Any]], ndim: int) -> list[tuple[str, Any]]:
    """Replace ``...`` with full slices. An ellipsis that expands to nothing still separates the
    advanced indices around it (NumPy's rule), so it leaves a "gap" item behind."""
    consumed = sum(_consumed(kind, value) for kind, value in items)
    if consumed > ndim:
        raise IndexError(f"too many indices for array: array is {ndim}-dimensional, but {consumed} "
                         "were indexed")
    ellipses = [i for i, (kind, _) in enumerate(items) if kind == "ellipsis"]
    if len(ellipses) > 1:
        raise IndexError("an index can only have a single ellipsis ('...')")
    if not ellipses:
        return items + [("slice", slice(None))] * (ndim - consumed)
    at = ellipses[0]
    fill: list[tuple[str, Any]] = [("slice", slice(None))] * (ndim - consumed) or [("gap", None)]
    return items[:at] + fill + items[at + 1:]


def _parse_index(shape: tuple[int, ...], index: Any) -> _IndexPlan:
    items = _expand_ellipsis([_classify(item) for item in (index if isinstance(index, tuple) else (index,))],
                             len(shape))
    advanced = any(kind in ("array", "mask", "bool") for kind, _ in items) or _any_int_out_of_range(items, shape)
    axes: list[_AxisIndex] = []
    gap = -1  # where an empty ellipsis sits among the axes
    source = 0
    for kind, value in items:
        if kind == "gap":
            gap = len(axes)
            continue
        if kind == "new":
            axes.append(_AxisIndex("slice", None))
            continue
        if kind == "bool":  # x[True] is x[None][[0]]; x[False] is x[None][[]]
            axes.append(_AxisIndex("array", None, array=np.zeros(int(value), np.int64)))
            continue
        if kind == "mask":
            axes.extend(_mask_axes(value, shape, source))
            source += value.ndim
            continue
        size = shape[source]
        if kind == "slice":
            start, stop, step = _slice_bounds(value, size)
            axes.append(_AxisIndex("slice", source, start, len(range(start, stop, step)), step))
        elif kind == "int":
            if not -size <= value < size:  # as jax.numpy: reads clamp, updates are dropped
                if size == 0:
                    raise IndexError(f"index {value} is out of bounds for axis {source} with size 0")
                axes.append(_AxisIndex("array", source, array=_normalize_static(np.asarray(value), size)))
            elif advanced:  # with array indices present, NumPy treats integers as 0-d arrays
                axes.append(_AxisIndex("array", source, array=np.asarray(value % size, np.int64)))
            else:
                axes.append(_AxisIndex("int", source, value % size))
        else:
            axes.append(_AxisIndex("array", source, array=_normalize_index(value, size)))
        source += 1
    expanded = tuple(shape[ax.source] if ax.source is not None else 1 for ax in axes)
    arrays = [ax.array for ax in axes if ax.kind == "array"]
    try:
        batch_shape = broadcast_shapes(*(a.shape for a in arrays))  # type: ignore[union-attr]
    except ValueError:
        raise IndexError("shape mismatch: indexing arrays could not be broadcast together with shapes "
                         + " ".join(str(a.shape) for a in arrays)) from None  # type: ignore[union-attr]
    positions = [i for i, ax in enumerate(axes) if ax.kind == "array"]
    adjacent = (bool(positions) and positions == list(range(positions[0], positions[-1] + 1))
                and not positions[0] < gap <= positions[-1])
    # NumPy's rule: adjacent advanced indices replace their axes in place; separated ones go first
    batch_position = sum(ax.kind == "slice" for ax in axes[:positions[0]]) if adjacent else 0
    return _IndexPlan(tuple(axes), expanded, batch_shape, batch_position)


def _any_int_out_of_range(items: list[tuple[str, Any]], shape: tuple[int, ...]) -> bool:
    """Whether an integer index lies outside its axis: it then becomes a 0-d index array (clamped on
    reads, dropped on updates), and so do the other integers, as NumPy treats integers among arrays."""
    source = 0
    for kind, value in items:
        if kind == "int" and source < len(shape) and not -shape[source] <= value < shape[source]:
            return True
        source += _consumed(kind, value) if kind != "gap" else 0
    return False


def _slice_bounds(index: slice, size: int) -> tuple[int, int, int]:
    try:
        return index.indices(size)
    except ConcretizationError:
        raise ConcretizationError(
            f"slice bounds must be concrete, since they decide the result's shape, but {index} has a traced "
            "bound. For a window of fixed size k at a traced offset i, index with i + fnp.arange(k) "
            "instead.") from None


def _mask_axes(mask: np.ndarray, shape: tuple[int, ...], source: int) -> list[_AxisIndex]:
    for k, mask_size in enumerate(mask.shape):
        size = shape[source + k]
        if mask_size != size:
            raise IndexError(f"boolean index did not match indexed array along axis {source + k}; size "
                             f"of axis is {size} but size of corresponding boolean axis is {mask_size}")
    return [_AxisIndex("array", source + k, array=coords.astype(np.int64))
            for k, coords in enumerate(np.nonzero(mask))]


def _stacked_indices(arrays: Sequence[IndexArray], batch_shape: tuple[int, ...]) -> Tensor:
    """The index arrays broadcast to ``batch_shape`` and stacked on a new last axis, as int32."""
    if all(isinstance(a, np.ndarray) for a in arrays):
        columns = [np.broadcast_to(a, batch_shape) for a in arrays]
        return Tensor(np.stack(columns, axis=-1).astype(np.int32).reshape(batch_shape + (len(arrays),)))
    tensors = [broadcast_to(asarray(a, dtypes.int32), batch_shape) for a in arrays]
    return stack(tensors, axis=-1)


# --- reading: x[index] --------------------------------------------------------------------------


def getitem(x: ArrayLike, index: Any) -> Tensor:
    """NumPy indexing with jax.numpy's out-of-range rules (what ``x[index]`` calls).

    >>> getitem(asarray([[1, 2], [3, 4]]), (slice(None), [1, -1, 7])).tolist()  # 7 clamps to 1
    [[2, 2, 2], [4, 4, 4]]
    """
    x = asarray(x)
    plan = _parse_index(x.shape, index)
    out = reshape(x, plan.expanded_shape)
    starts, limits, strides, flips = [], [], [], []
    for i, ax in enumerate(plan.axes):
        size = plan.expanded_shape[i]
        if ax.kind == "array" or (ax.kind == "slice" and ax.count == size and ax.step == 1):
            start, limit, stride = 0, size, 1
        elif ax.kind == "int":
            start, limit, stride = ax.start, ax.start + 1, 1
        elif ax.count == 0:
            start, limit, stride = 0, 0, 1
        elif ax.step > 0:
            start, limit, stride = ax.start, ax.start + (ax.count - 1) * ax.step + 1, ax.step
        else:  # take the same elements in increasing order, then flip them
            start, limit, stride = ax.start + (ax.count - 1) * ax.step, ax.start + 1, -ax.step
            if ax.count > 1:
                flips.append(i)
        starts.append(start)
        limits.append(limit)
        strides.append(stride)
    if (starts, limits, strides) != ([0] * out.ndim, list(out.shape), [1] * out.ndim):
        out = bind(P.slice_p, out, start=tuple(starts), limit=tuple(limits), strides=tuple(strides))
    if flips:
        out = bind(P.flip_p, out, axes=tuple(flips))
    out = reshape(out, tuple(d for d, ax in zip(out.shape, plan.axes) if ax.kind != "int"))
    if plan.array_positions:
        out = _gather(out, plan)
    return out


def _gather(x: Tensor, plan: _IndexPlan) -> Tensor:
    """Apply the advanced indices of ``plan`` to ``x`` (whose basic indices are already applied)."""
    arrays = [plan.axes[i].array for i in plan.array_positions]
    indices = _stacked_indices(arrays, plan.batch_shape)  # type: ignore[arg-type]
    out = bind(P.gather_p, x, indices, axes=plan.array_positions)
    batch, rest, p = len(plan.batch_shape), out.ndim - len(plan.batch_shape), plan.batch_position
    if p == 0:
        return out
    # gather puts the batch dims first; move them to where NumPy puts adjacent advanced indices
    return permute_dims(out, [*range(batch, batch + p), *range(batch), *range(batch + p, batch + rest)])


# --- writing: x.at[index] -----------------------------------------------------------------------


def _coordinates(plan: _IndexPlan) -> Tensor:
    """For every element of ``x[index]``, its coordinates in ``x``: shape (*result_shape, ndim)."""
    shape = plan.result_shape
    batch_dims = tuple(range(plan.batch_position, plan.batch_position + len(plan.batch_shape)))
    columns: list[Tensor] = []
    for position, ax in enumerate(plan.axes):
        if ax.source is None:
            continue
        if ax.kind == "slice":
            column = bind(P.iota_p, dtype=dtypes.int32, shape=shape, dimension=plan.result_dim(position))
            if ax.step != 1:
                column = multiply(column, np.int32(ax.step))
            if ax.start != 0:
                column = add(column, np.int32(ax.start))
            columns.append(column)
        elif ax.kind == "int":
            columns.append(broadcast_to(np.int32(ax.start), shape))
        else:
            array = broadcast_to(asarray(ax.array, dtypes.int32), plan.batch_shape)
            columns.append(bind(P.broadcast_in_dim_p, array, shape=shape, broadcast_dimensions=batch_dims))
    if not columns:  # a 0-d x: ``_scatter`` gives it one axis of size 1, indexed at 0
        return Tensor(np.zeros(shape + (1,), np.int32))
    return stack(columns, axis=-1)


def _scatter(x: Tensor, index: Any, values: ArrayLike, mode: str) -> Tensor:
    plan = _parse_index(x.shape, index)
    shape = plan.result_shape
    updates: Any
    if isinstance(values, (bool, int, float, complex)):
        updates = _to_numpy_scalar(values, x.dtype)
    else:
        updates = astype(asarray(values), x.dtype)
        extra = updates.ndim - len(shape)
        if extra > 0 and all(d == 1 for d in updates.shape[:extra]):  # NumPy drops leading 1s
            updates = reshape(updates, updates.shape[extra:])
    try:
        updates = broadcast_to(updates, shape)
    except ValueError:
        raise ValueError(f"x.at[...]: values of shape {getattr(updates, 'shape', ())} cannot be broadcast "
                         f"to the indexed shape {shape} of an array of shape {x.shape}") from None
    operand = x if x.ndim else reshape(x, (1,))  # a scatter needs at least one axis to index
    out = bind(P.scatter_p, operand, _coordinates(plan), updates, axes=tuple(range(operand.ndim)), mode=mode)
    return reshape(out, x.shape)


class IndexUpdateRef:
    """``x.at[index]``: methods return a copy of ``x`` updated at ``index`` (x is unchanged).

    Values broadcast to the shape of ``x[index]`` and are cast to ``x``'s dtype. Negative indices
    wrap once; updates at out-of-range indices are dropped. With repeated indices ``add``,
    ``multiply``, ``min`` and ``max`` combine every update, while which update ``set`` keeps is
    unspecified (as in JAX).

    >>> asarray([0, 0, 0]).at[[0, 0, 2]].add(1).tolist()
    [2, 0, 1]
    """

    __slots__ = ("array", "index")

    def __init__(self, array: Tensor, index: Any) -> None:
        self.array = array
        self.index = index

    def __repr__(self) -> str:
        return f"IndexUpdateRef({self.array!r}, {self.index!r})"

    def get(self, *, mode: str | None = None, fill_value: Any = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Tensor:
        """``x[index]``. ``mode``: None, "clip" or "promise_in_bounds" clamp out-of-range indices to
        the axis; "fill" gives ``fill_value`` there instead (default NaN for floats, the smallest
        value for signed integers, the largest for unsigned ones, True for bools), as JAX's."""
        if mode in (None, "clip", "promise_in_bounds"):
            return getitem(self.array, self.index)
        if mode != "fill":
            raise ValueError(f"x.at[...].get: mode must be None, 'clip', 'fill' or 'promise_in_bounds', got {mode!r}")
        x = self.array
        out = getitem(x, self.index)
        plan = _parse_index(x.shape, self.index)
        if not x.ndim:  # a 0-d array has no index to be out of range
            return out
        coords = _coordinates(plan)  # (*out.shape, x.ndim): where each element comes from
        inside = logical_and(greater_equal(coords, np.int32(0)), less(coords, asarray(np.asarray(x.shape, np.int32))))
        from funcgrad.numpy.reductions import all as all_
        valid = all_(inside, axis=-1)
        fill = _default_fill(x.dtype) if fill_value is None else fill_value
        return where(valid, out, astype(asarray(fill), x.dtype))

    def set(self, values: ArrayLike, *, mode: str | None = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Tensor:
        """``x[index] = values``."""
        _check_update_mode("set", mode)
        return _scatter(self.array, self.index, values, "set")

    def add(self, values: ArrayLike, *, mode: str | None = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Tensor:
        """``x[index] += values``."""
        _check_update_mode("add", mode)
        return _scatter(self.array, self.index, values, "add")

    def subtract(self, values: ArrayLike, *, mode: str | None = None, indices_are_sorted: bool = False,
                 unique_indices: bool = False) -> Tensor:
        """``x[index] -= values``."""
        _check_update_mode("subtract", mode)
        return _scatter(self.array, self.index, negative(astype(asarray(values), self.array.dtype)), "add")

    def multiply(self, values: ArrayLike, *, mode: str | None = None, indices_are_sorted: bool = False,
                 unique_indices: bool = False) -> Tensor:
        """``x[index] *= values``."""
        _check_update_mode("multiply", mode)
        return _scatter(self.array, self.index, values, "mul")

    mul = multiply

    def divide(self, values: ArrayLike, *, mode: str | None = None, indices_are_sorted: bool = False,
               unique_indices: bool = False) -> Tensor:
        """``x[index] /= values`` (true division, so integer arrays give floats, as in JAX)."""
        _check_update_mode("divide", mode)
        return divide(self.array, _scatter(_ones_like(self.array), self.index, values, "mul"))

    def power(self, values: ArrayLike, *, mode: str | None = None, indices_are_sorted: bool = False,
              unique_indices: bool = False) -> Tensor:
        """``x[index] **= values``."""
        _check_update_mode("power", mode)
        return power(self.array, _scatter(_ones_like(self.array), self.index, values, "mul"))

    def min(self, values: ArrayLike, *, mode: str | None = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Tensor:
        """``x[index] = minimum(x[index], values)``."""
        _check_update_mode("min", mode)
        return _scatter(self.array, self.index, values, "min")

    def max(self, values: ArrayLike, *, mode: str | None = None, indices_are_sorted: bool = False,
            unique_indices: bool = False) -> Tensor:
        """``x[index] = maximum(x[index], values)``."""
        _check_update_mode("max", mode)
        return _scatter(self.array, self.index, values, "max")


def _check_update_mode(method: str, mode: str | None) -> None:
    """Updates drop out-of-range indices (JAX's default, "drop"; "fill" means the same for updates and
    "promise_in_bounds" lets JAX assume there are none); JAX's "clip" is not supported."""
    if mode not in (None, "drop", "fill", "promise_in_bounds"):
        raise ValueError(f"x.at[...].{method}: mode must be None, 'drop', 'fill' or 'promise_in_bounds', got "
                         f"{mode!r} (out-of-range updates are dropped; clamping them, mode='clip', is not supported)")


def _default_fill(dtype: np.dtype) -> Any:
    """JAX's fill value for ``mode="fill"`` reads: NaN, the smallest signed or largest unsigned integer, True."""
    if dtypes.is_float(dtype):
        return np.asarray(np.nan, dtype)[()]
    if dtypes.is_bool(dtype):
        return np.True_
    info = np.iinfo(dtype)
    return np.asarray(info.max if dtypes.is_unsigned(dtype) else info.min, dtype)[()]


def _ones_like(x: Tensor) -> Tensor:
    return broadcast_to(np.ones((), x.dtype)[()], x.shape)


class AtIndexer:
    """The ``x.at`` property: ``x.at[index]`` is an ``IndexUpdateRef``."""

    __slots__ = ("array",)

    def __init__(self, array: ArrayLike) -> None:
        self.array = asarray(array)

    def __getitem__(self, index: Any) -> IndexUpdateRef:
        return IndexUpdateRef(self.array, index)

    def __repr__(self) -> str:
        return f"AtIndexer({self.array!r})"


# --- take and friends ---------------------------------------------------------------------------

_TAKE_MODES = ("clip", "wrap", "raise")


def _concrete_indices(indices: ArrayLike, what: str) -> np.ndarray:
    if isinstance(indices, Tensor):
        if indices.is_traced:
            raise ConcretizationError(f"{what} needs concrete indices, but they are traced ({indices.aval})")
        return indices.numpy()
    return np.asarray(indices)


def take(x: ArrayLike, indices: ArrayLike, /, *, axis: int | None = None, mode: str | None = None) -> Tensor:
    """Elements of ``x`` at ``indices`` along ``axis`` (the flattened ``x`` if None).

    mode "clip" (the default) wraps negative indices once and clamps the rest, "wrap" takes them
    modulo the axis size, "raise" checks them (concrete indices only).

    >>> take(asarray([10, 20, 30]), asarray([2, -1, 5])).tolist()
    [30, 30, 30]
    """
    x = asarray(x)
    if axis is None:
        x, axis = ravel(x), 0
    axis = normalize_axis(axis, x.ndim)
    mode = "clip" if mode is None else mode
    if mode not in _TAKE_MODES:
        raise ValueError(f"take: mode must be one of {_TAKE_MODES}, got {mode!r}")
    size = x.shape[axis]
    if isinstance(indices, Tensor) and not dtypes.is_int(indices.dtype):
        raise IndexError(f"take: indices must be integers, got dtype {indices.dtype.name}")
    if isinstance(indices, Tensor) and mode != "raise":
        if mode == "wrap":
            indices = remainder(indices, size) if size else indices
        return getitem(x, (slice(None),) * axis + (indices,))
    static = _concrete_indices(indices, "take(mode='raise')")
    if static.dtype.kind not in "iu":
        raise IndexError(f"take: indices must be integers, got dtype {static.dtype}")
    if mode == "raise" and static.size and not ((static >= -size) & (static < size)).all():
        raise IndexError(f"take: an index in {static.tolist()} is out of bounds for axis {axis} "
                         f"with size {size}")
    if mode == "wrap" and size:
        static = np.mod(static, size)
    static = np.clip(_normalize_static(static, size), 0, max(size - 1, 0))  # now in range (if size > 0)
    return getitem(x, (slice(None),) * axis + (static,))


def _along_axis_index(arr: Tensor, indices: ArrayLike, axis: int | None,
                      name: str) -> tuple[Tensor, tuple[Any, ...]]:
    """The array (flattened or broadcast) and the advanced index tuple that pick ``indices``
    along ``axis`` and the matching position on every other axis."""
    index = indices if isinstance(indices, Tensor) else np.asarray(indices)
    if index.dtype.kind not in "iu":
        raise IndexError(f"{name}: indices must be an integer array, got dtype {index.dtype}")
    if axis is None:
        if index.ndim != 1:
            raise ValueError(f"{name} with axis=None needs 1-d indices, got shape {index.shape}")
        arr, axis = ravel(arr), 0
    axis = normalize_axis(axis, arr.ndim)
    if index.ndim != arr.ndim:
        raise ValueError(f"{name}: indices of shape {index.shape} must have the same rank as the "
                         f"array of shape {arr.shape}")
    without_axis = [tuple(1 if i == axis else d for i, d in enumerate(s)) for s in (arr.shape, index.shape)]
    try:
        batch = broadcast_shapes(*without_axis)
    except ValueError:
        raise ValueError(f"{name}: indices of shape {index.shape} do not broadcast against the array of "
                         f"shape {arr.shape} (outside axis {axis})") from None
    arr = broadcast_to(arr, tuple(arr.shape[axis] if i == axis else d for i, d in enumerate(batch)))
    positions: list[Any] = [np.arange(d).reshape([-1 if j == i else 1 for j in range(arr.ndim)])
                            for i, d in enumerate(batch)]
    positions[axis] = index
    return arr, tuple(positions)


def take_along_axis(arr: ArrayLike, indices: ArrayLike, /, axis: int | None) -> Tensor:
    """Pick ``arr`` values along ``axis`` at ``indices`` (same rank as ``arr``; other axes
    broadcast), as ``np.take_along_axis``; out-of-range indices clamp.

    >>> take_along_axis(asarray([[3, 1], [0, 5]]), asarray([[1], [0]]), 1).tolist()
    [[1], [0]]
    """
    arr, index = _along_axis_index(asarray(arr), indices, axis, "take_along_axis")
    return getitem(arr, index)


def put_along_axis(arr: ArrayLike, indices: ArrayLike, values: ArrayLike, axis: int | None,
                   inplace: bool = True) -> Tensor:
    """A copy of ``arr`` with ``values`` put at ``indices`` along ``axis`` (JAX's signature:
    arrays are immutable, so ``inplace=False`` must be passed).

    >>> put_along_axis(asarray([[0, 0], [0, 0]]), asarray([[1], [0]]), 7, 1, inplace=False).tolist()
    [[0, 7], [7, 0]]
    """
    if inplace:
        raise ValueError("put_along_axis cannot modify arrays in place (funcgrad arrays are immutable); "
                         "pass inplace=False to get an updated copy")
    arr = asarray(arr)
    target = ravel(arr) if axis is None else arr
    broadcast, index = _along_axis_index(target, indices, 0 if axis is None else axis, "put_along_axis")
    if broadcast.shape != target.shape:
        raise ValueError(f"put_along_axis: indices of shape {np.shape(indices)} must not broadcast the array "
                         f"of shape {arr.shape}")
    return reshape(_scatter(target, index, values, "set"), arr.shape)


def select(condlist: Sequence[ArrayLike], choicelist: Sequence[ArrayLike], default: ArrayLike = 0) -> Tensor:
    """Elementwise, the entry of the first choice whose condition holds, else ``default``.

    >>> x = asarray([-2, 0, 3])
    >>> select([x < 0, x > 0], [-x, x * 10], default=99).tolist()
    [2, 99, 30]
    """
    if len(condlist) != len(choicelist):
        raise ValueError(f"select: condlist and choicelist must have the same length, got {len(condlist)} "
                         f"and {len(choicelist)}")
    if not condlist:
        raise ValueError("select with an empty condition list is not possible")
    conditions = [asarray(c) for c in condlist]
    for i, condition in enumerate(conditions):
        if not dtypes.is_bool(condition.dtype):
            raise TypeError(f"select: condlist entry {i} must be a bool array, got {condition.dtype.name}")
    choices, _, _ = promote(*choicelist, default)  # one result dtype over every choice and the default
    result: Any = choices[-1]
    for condition, choice in zip(reversed(conditions), reversed(choices[:-1])):
        result = where(condition, choice, result)
    return result


def compress(condition: ArrayLike, a: ArrayLike, axis: int | None = None) -> Tensor:
    """The slices of ``a`` along ``axis`` where the 1-d ``condition`` holds (concrete only: the
    result's shape depends on it). >>> compress([True, False, True], asarray([1, 2, 3])).tolist()  # [1, 3]"""
    if isinstance(condition, Tensor) and condition.is_traced:
        raise ConcretizationError("compress has a value-dependent shape, so its condition must be concrete, "
                                  f"but it is traced ({condition.aval}); use fnp.where instead")
    mask = np.asarray(condition.numpy() if isinstance(condition, Tensor) else condition)
    if mask.ndim != 1:
        raise ValueError(f"compress: condition must be 1-d, got shape {mask.shape}")
    a = asarray(a)
    if axis is None:
        a, axis = ravel(a), 0
    axis = normalize_axis(axis, a.ndim)
    selected = np.nonzero(mask.astype(bool))[0]
    if selected.size and selected[-1] >= a.shape[axis]:
        raise IndexError(f"compress: condition of length {mask.size} selects index {selected[-1]}, out of "
                         f"bounds for axis {axis} with size {a.shape[axis]}")
    return getitem(a, (slice(None),) * axis + (selected,))


def choose(a: ArrayLike, choices: Sequence[ArrayLike], mode: str = "raise") -> Tensor:
    """``choices[a[i]][i]`` for every position ``i`` (all broadcast together), as ``np.choose``.

    mode "raise" checks ``a`` (concrete only), "clip" clamps it, "wrap" takes it modulo.

    >>> choose(asarray([1, 0]), [asarray([1, 2]), asarray([10, 20])]).tolist()
    [10, 2]
    """
    selector = asarray(a)
    count = len(choices)
    if not dtypes.is_int(selector.dtype):
        raise TypeError(f"choose: a must be an integer array, got {selector.dtype.name}")
    if count == 0:
        raise ValueError("choose needs at least one choice")
    if mode == "raise":
        values = _concrete_indices(selector, "choose(mode='raise')")
        if ((values < 0) | (values >= count)).any():
            raise ValueError(f"choose: entries of a must be in [0, {count}), got {values.tolist()}")
    elif mode == "clip":
        selector = clip(selector, 0, count - 1)
    elif mode == "wrap":
        selector = remainder(selector, count)
    else:
        raise ValueError(f"choose: mode must be 'raise', 'clip' or 'wrap', got {mode!r}")
    options, _, _ = promote(*choices)
    result = asarray(options[-1])
    for k in reversed(range(count - 1)):
        result = where(equal(selector, k), options[k], result)
    return broadcast_to(result, broadcast_shapes(selector.shape, result.shape))


# --- index helpers ------------------------------------------------------------------------------


def _index_tensors(arrays: Sequence[np.ndarray]) -> tuple[Tensor, ...]:
    return tuple(Tensor(np.asarray(a, np.int32)) for a in arrays)


def ix_(*args: ArrayLike) -> tuple[Tensor, ...]:
    """An open mesh from 1-d index arrays (bool arrays give their nonzero positions), so that
    ``x[ix_(rows, cols)]`` picks the sub-array at the cross product.

    >>> [a.shape for a in ix_([0, 1], [2, 3, 4])]
    [(2, 1), (1, 3)]
    """
    out = []
    for k, arg in enumerate(args):
        if isinstance(arg, Tensor) and dtypes.is_int(arg.dtype):
            value: Any = arg
        else:
            if isinstance(arg, Tensor) and arg.is_traced:
                raise ConcretizationError(f"ix_ needs concrete bool arrays, argument {k} is traced "
                                          f"({arg.aval})")
            value = np.asarray(arg.numpy() if isinstance(arg, Tensor) else arg)
            if value.size == 0 and value.dtype.kind == "f":
                value = value.astype(np.int32)
            if value.dtype.kind not in "iub":
                raise TypeError(f"ix_: arguments must be integer or bool arrays, argument {k} has dtype "
                                f"{value.dtype}")
        if value.ndim != 1:
            raise ValueError(f"ix_: cross index must be 1-dimensional, argument {k} has shape {value.shape}")
        if isinstance(value, np.ndarray):
            value = Tensor(np.nonzero(value)[0] if value.dtype == np.bool_ else value, dtypes.int32)
        out.append(reshape(value, tuple(-1 if i == k else 1 for i in range(len(args)))))
    return tuple(out)


def diag_indices(n: int, ndim: int = 2) -> tuple[Tensor, ...]:
    """Indices of the main diagonal of an (n, n, ..., n) array.

    >>> [a.tolist() for a in diag_indices(2)]
    [[0, 1], [0, 1]]
    """
    n, ndim = operator.index(n), operator.index(ndim)
    if n < 0 or ndim < 0:
        raise ValueError(f"diag_indices needs n >= 0 and ndim >= 0, got n={n}, ndim={ndim}")
    return _index_tensors([np.arange(n)] * ndim)


def diag_indices_from(arr: ArrayLike) -> tuple[Tensor, ...]:
    """``diag_indices`` for an array whose axes all have one size."""
    shape = np.shape(arr) if not isinstance(arr, Tensor) else arr.shape
    if len(shape) < 2 or len(set(shape)) != 1:
        raise ValueError(f"diag_indices_from needs at least 2 axes of equal size, got shape {shape}")
    return diag_indices(shape[0], len(shape))


def tril_indices(n: int, k: int = 0, m: int | None = None) -> tuple[Tensor, Tensor]:
    """Row and column indices of the lower triangle (diagonal offset ``k``) of an (n, m) array."""
    cols_count = None if m is None else operator.index(m)
    rows, cols = np.tril_indices(operator.index(n), operator.index(k), cols_count)
    return _index_tensors([rows, cols])  # type: ignore[return-value]


def triu_indices(n: int, k: int = 0, m: int | None = None) -> tuple[Tensor, Tensor]:
    """Row and column indices of the upper triangle (diagonal offset ``k``) of an (n, m) array."""
    cols_count = None if m is None else operator.index(m)
    rows, cols = np.triu_indices(operator.index(n), operator.index(k), cols_count)
    return _index_tensors([rows, cols])  # type: ignore[return-value]


def _matrix_shape(arr: ArrayLike, name: str) -> tuple[int, int]:
    shape = arr.shape if isinstance(arr, Tensor) else np.shape(arr)
    if len(shape) != 2:
        raise ValueError(f"{name} needs a 2-d array, got shape {shape}")
    return shape[0], shape[1]


def tril_indices_from(arr: ArrayLike, k: int = 0) -> tuple[Tensor, Tensor]:
    """``tril_indices`` for the shape of the 2-d ``arr``."""
    n, m = _matrix_shape(arr, "tril_indices_from")
    return tril_indices(n, k, m)


def triu_indices_from(arr: ArrayLike, k: int = 0) -> tuple[Tensor, Tensor]:
    """``triu_indices`` for the shape of the 2-d ``arr``."""
    n, m = _matrix_shape(arr, "triu_indices_from")
    return triu_indices(n, k, m)
