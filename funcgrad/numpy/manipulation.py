"""Shape manipulation: reshape, permute_dims, concat, stack, flip, roll, tile, repeat, pad, split, ...

Everything here binds movement primitives (reshape, transpose, broadcast_in_dim, concatenate,
slice, pad, flip, and gather for ``repeat`` with per-element counts); the compiler turns them
into index arithmetic rather than copies. A reshape or transpose that changes nothing binds
nothing. Functions whose output shape depends on values (``repeat`` counts, ``split`` indices,
``pad`` widths) need those values concrete: under a trace they raise a ``ConcretizationError``.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import (
    ArrayLike,
    _to_numpy_scalar,
    asarray,
    astype,
    broadcast_arrays,
    broadcast_to,
    normalize_axes,
    normalize_axis,
    promote,
)
from funcgrad.numpy.elementwise import remainder, subtract

__all__ = ["reshape", "permute_dims", "transpose", "matrix_transpose", "expand_dims", "squeeze", "concat",
           "concatenate", "stack", "moveaxis", "swapaxes", "ravel", "flatten", "broadcast_to",
           "broadcast_arrays", "flip", "fliplr", "flipud", "rot90", "roll", "tile", "repeat", "pad",
           "split", "array_split", "hsplit", "vsplit", "dsplit", "unstack", "atleast_1d", "atleast_2d",
           "atleast_3d", "hstack", "vstack", "dstack", "column_stack", "append"]


def _resolve_shape(shape: Sequence[int] | int, size: int) -> tuple[int, ...]:
    try:
        shape = (operator.index(shape),) if not hasattr(shape, "__iter__") else tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"reshape: the shape must be an int or a sequence of ints, got {shape!r}") from None
    unknown = [i for i, d in enumerate(shape) if d == -1]
    if len(unknown) > 1:
        raise ValueError(f"reshape: only one dimension may be -1, got shape {shape}")
    if any(d < -1 for d in shape):
        raise ValueError(f"reshape: negative dimension in shape {shape}")
    if unknown:
        known = int(np.prod([d for d in shape if d != -1], dtype=np.int64))
        if known == 0 or size % known:
            raise ValueError(f"cannot reshape an array of {size} elements into shape {shape}")
        shape = tuple(size // known if d == -1 else d for d in shape)
    return shape


def reshape(x: ArrayLike, /, shape: Sequence[int] | int, *, copy: bool | None = None) -> Tensor:
    """Give ``x`` a new shape with the same number of elements; one dimension may be -1.

    >>> reshape(asarray([1, 2, 3, 4]), (2, -1)).shape
    (2, 2)
    """
    x = asarray(x)
    new_shape = _resolve_shape(shape, x.size)
    if new_shape == x.shape:
        return x
    return bind(P.reshape_p, x, new_sizes=new_shape)


def permute_dims(x: ArrayLike, /, axes: Sequence[int]) -> Tensor:
    """Reorder the axes: output axis i is input axis ``axes[i]``."""
    x = asarray(x)
    axes = tuple(axes)
    if len(axes) != x.ndim:
        raise ValueError(f"permute_dims needs {x.ndim} axes for shape {x.shape}, got {axes}")
    perm = tuple(normalize_axis(a, x.ndim) for a in axes)
    if sorted(perm) != list(range(x.ndim)):
        raise ValueError(f"{axes} is not a permutation of the axes of an array of rank {x.ndim}")
    if perm == tuple(range(x.ndim)):
        return x
    return bind(P.transpose_p, x, permutation=perm)


def transpose(x: ArrayLike, /, axes: Sequence[int] | None = None) -> Tensor:
    """NumPy's transpose: reverses the axes by default."""
    x = asarray(x)
    return permute_dims(x, tuple(reversed(range(x.ndim))) if axes is None else axes)


def matrix_transpose(x: ArrayLike, /) -> Tensor:
    """Swap the last two axes."""
    x = asarray(x)
    if x.ndim < 2:
        raise ValueError(f"matrix_transpose needs at least 2 dimensions, got shape {x.shape}")
    return swapaxes(x, -1, -2)


def swapaxes(x: ArrayLike, axis1: int, axis2: int) -> Tensor:
    """``x`` with axes ``axis1`` and ``axis2`` exchanged.

    >>> swapaxes(zeros((2, 3, 4)), 0, 2).shape
    (4, 3, 2)
    """
    x = asarray(x)
    a, b = normalize_axis(axis1, x.ndim), normalize_axis(axis2, x.ndim)
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return permute_dims(x, perm)


def moveaxis(x: ArrayLike, source: int | Sequence[int], destination: int | Sequence[int], /) -> Tensor:
    """``x`` with the axes ``source`` moved to the positions ``destination``; the others keep their order.

    >>> moveaxis(zeros((2, 3, 4)), 0, -1).shape
    (3, 4, 2)
    """
    x = asarray(x)
    src = normalize_axes(source, x.ndim)
    dst = normalize_axes(destination, x.ndim)
    if len(src) != len(dst):
        raise ValueError(f"moveaxis: source {source} and destination {destination} differ in length")
    rest = [a for a in range(x.ndim) if a not in src]
    perm: list[int] = [0] * x.ndim
    for s, d in zip(src, dst):
        perm[d] = s
    others = iter(rest)
    placed = set(dst)
    return permute_dims(x, [perm[i] if i in placed else next(others) for i in range(x.ndim)])


def expand_dims(x: ArrayLike, /, axis: int | Sequence[int] = 0) -> Tensor:
    """Insert size-1 axes at ``axis`` (positions in the result)."""
    x = asarray(x)
    if not isinstance(axis, (int, np.integer, Sequence)):
        raise TypeError(f"expand_dims: axis must be an int or a sequence of ints, got {axis!r}")
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out_ndim = x.ndim + len(axes)
    positions = set(normalize_axes(axes, out_ndim))
    dims = iter(x.shape)
    return reshape(x, tuple(1 if i in positions else next(dims) for i in range(out_ndim)))


def squeeze(x: ArrayLike, /, axis: int | Sequence[int] | None = None) -> Tensor:
    """Remove size-1 axes (all of them, or those named; naming a non-1 axis is a ValueError)."""
    x = asarray(x)
    if axis is None:
        axes = tuple(i for i, d in enumerate(x.shape) if d == 1)
    else:
        axes = normalize_axes(axis, x.ndim)
        for a in axes:
            if x.shape[a] != 1:
                raise ValueError(f"cannot squeeze axis {a} of shape {x.shape}: "
                                 f"its size is {x.shape[a]}, not 1")
    return reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def ravel(x: ArrayLike, /) -> Tensor:
    """``x`` flattened to one axis, in C (row-major) order.

    >>> ravel(asarray([[1, 2], [3, 4]])).tolist()
    [1, 2, 3, 4]
    """
    x = asarray(x)
    return reshape(x, (x.size,))


def flatten(x: ArrayLike, /, start_dim: int = 0, end_dim: int = -1) -> Tensor:
    """Merge axes ``start_dim..end_dim`` into one (PyTorch/tinygrad's ``flatten``)."""
    x = asarray(x)
    if x.ndim == 0:
        return reshape(x, (1,))
    start, end = normalize_axis(start_dim, x.ndim), normalize_axis(end_dim, x.ndim)
    if start > end:
        raise ValueError(f"flatten: start_dim {start_dim} comes after end_dim {end_dim}")
    merged = int(np.prod(x.shape[start:end + 1], dtype=np.int64))
    return reshape(x, x.shape[:start] + (merged,) + x.shape[end + 1:])


def concat(arrays: Sequence[ArrayLike], /, *, axis: int | None = 0) -> Tensor:
    """Join arrays along an existing axis (``axis=None`` flattens first); dtypes are promoted."""
    if isinstance(arrays, Tensor) or not isinstance(arrays, (list, tuple)):
        raise TypeError("concat takes a list or tuple of arrays")
    if not arrays:
        raise ValueError("concat needs at least one array")
    values, _, _ = promote(*(asarray(a) for a in arrays))
    tensors: list[Tensor] = [v if isinstance(v, Tensor) else asarray(v) for v in values]
    if axis is None:
        tensors = [ravel(t) for t in tensors]
        axis = 0
    ndim = tensors[0].ndim
    if ndim == 0:
        raise ValueError("concat cannot join 0-d arrays; use stack")
    if any(t.ndim != ndim for t in tensors):
        raise ValueError(f"concat needs arrays of one rank, got shapes {[t.shape for t in tensors]}")
    axis = normalize_axis(axis, ndim)
    if len(tensors) == 1:
        return tensors[0]
    return bind(P.concatenate_p, *tensors, axis=axis)


concatenate = concat


def stack(arrays: Sequence[ArrayLike], /, *, axis: int = 0) -> Tensor:
    """Join arrays of one shape along a new axis."""
    if isinstance(arrays, Tensor) or not isinstance(arrays, (list, tuple)):
        raise TypeError("stack takes a list or tuple of arrays")
    if not arrays:
        raise ValueError("stack needs at least one array")
    tensors = [asarray(a) for a in arrays]
    shapes = {t.shape for t in tensors}
    if len(shapes) != 1:
        raise ValueError(f"stack needs arrays of one shape, got {[t.shape for t in tensors]}")
    axis = normalize_axis(axis, tensors[0].ndim + 1)
    return concat([expand_dims(t, axis) for t in tensors], axis=axis)



def _concrete_ints(value: Any, what: str) -> np.ndarray:
    """``value`` as a NumPy integer array; traced Tensors raise ConcretizationError (a shape
    cannot depend on a traced value)."""
    array = value.numpy() if isinstance(value, Tensor) else np.asarray(value)
    if array.dtype.kind not in "iubf" or (array.dtype.kind == "f" and not np.all(array == np.floor(array))):
        raise TypeError(f"{what} must be integers, got {value!r}")
    return array.astype(np.int64)


def _slice_axis(x: Tensor, axis: int, start: int, stop: int, step: int = 1) -> Tensor:
    """x[..., start:stop:step, ...] along ``axis`` (bounds already valid and non-negative)."""
    if (start, stop, step) == (0, x.shape[axis], 1):
        return x
    starts = [0] * x.ndim
    limits = list(x.shape)
    strides = [1] * x.ndim
    starts[axis], limits[axis], strides[axis] = start, stop, step
    return bind(P.slice_p, x, start=tuple(starts), limit=tuple(limits), strides=tuple(strides))


def flip(x: ArrayLike, /, *, axis: int | Sequence[int] | None = None) -> Tensor:
    """Reverse the order of elements along ``axis`` (all axes when None).

    >>> flip(asarray([[1, 2], [3, 4]]), axis=1).tolist()
    [[2, 1], [4, 3]]
    """
    x = asarray(x)
    axes = tuple(sorted(normalize_axes(axis, x.ndim)))
    if not axes:
        return x
    return bind(P.flip_p, x, axes=axes)


def fliplr(x: ArrayLike, /) -> Tensor:
    """Flip along axis 1 (needs rank >= 2)."""
    x = asarray(x)
    if x.ndim < 2:
        raise ValueError(f"fliplr needs an array of rank >= 2, got shape {x.shape}")
    return flip(x, axis=1)


def flipud(x: ArrayLike, /) -> Tensor:
    """Flip along axis 0 (needs rank >= 1)."""
    x = asarray(x)
    if x.ndim < 1:
        raise ValueError("flipud needs an array of rank >= 1, got a 0-d array")
    return flip(x, axis=0)


def rot90(m: ArrayLike, /, k: int = 1, axes: tuple[int, int] = (0, 1)) -> Tensor:
    """Rotate by 90 degrees ``k`` times in the plane of ``axes`` (from the first axis toward the second)."""
    m = asarray(m)
    if len(axes) != 2:
        raise ValueError(f"rot90: axes must name two axes, got {axes}")
    a, b = normalize_axes(axes, m.ndim)
    k %= 4
    if k == 0:
        return m
    if k == 2:
        return flip(m, axis=(a, b))
    perm = list(range(m.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    if k == 1:
        return permute_dims(flip(m, axis=b), perm)
    return flip(permute_dims(m, perm), axis=b)


def roll(x: ArrayLike, /, shift: int | Sequence[int] | Tensor, *,
         axis: int | Sequence[int] | None = None) -> Tensor:
    """Shift elements cyclically along ``axis`` (the flattened array when None). Shifts may be
    traced scalars; a tuple of shifts pairs with a tuple of axes (repeated axes add up).

    >>> roll(asarray([1, 2, 3, 4]), 1).tolist()
    [4, 1, 2, 3]
    """
    x = asarray(x)
    if axis is None:
        return reshape(roll(ravel(x), shift, axis=0), x.shape)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if isinstance(shift, Tensor) and shift.is_traced:
        if shift.ndim > 1 or not dtypes.is_int(shift.dtype):
            raise TypeError(f"roll: shift must be an integer scalar or 1-d array, got {shift.aval}")
        shifts: list[Any] = [shift] if shift.ndim == 0 else [
            reshape(_slice_axis(shift, 0, i, i + 1), ()) for i in range(shift.shape[0])]
    else:
        shifts = [int(s) for s in np.atleast_1d(_concrete_ints(shift, "roll shifts"))]
    if len(shifts) == 1:
        shifts = shifts * len(axes)
    if len(axes) == 1:
        axes = axes * len(shifts)
    if len(shifts) != len(axes):
        raise ValueError(f"roll: {len(shifts)} shifts do not pair with {len(axes)} axes {axes}")
    for ax, s in zip(axes, shifts):
        x = _roll_one_axis(x, s, normalize_axis(ax, x.ndim))
    return x


def _roll_one_axis(x: Tensor, shift: Any, axis: int) -> Tensor:
    n = x.shape[axis]
    if n == 0:
        return x
    if isinstance(shift, Tensor):  # traced: read a window of x concatenated with itself
        start = astype(remainder(subtract(n, remainder(shift, n)), n), dtypes.int32)
        zero = np.int32(0)
        doubled = concat([x, x], axis=axis)
        starts = [start if i == axis else zero for i in range(x.ndim)]
        return bind(P.dynamic_slice_p, doubled, *starts, slice_sizes=x.shape)
    shift %= n
    if shift == 0:
        return x
    return concat([_slice_axis(x, axis, n - shift, n), _slice_axis(x, axis, 0, n - shift)], axis=axis)


def tile(x: ArrayLike, repetitions: int | Sequence[int], /) -> Tensor:
    """Repeat the whole of ``x`` ``repetitions[i]`` times along axis i (NumPy's ``tile``).

    >>> tile(asarray([1, 2]), 2).tolist()
    [1, 2, 1, 2]
    """
    x = asarray(x)
    reps = tuple(int(r) for r in np.atleast_1d(_concrete_ints(repetitions, "tile repetitions")))
    if any(r < 0 for r in reps):
        raise ValueError(f"tile: repetitions must be non-negative, got {reps}")
    ndim = max(len(reps), x.ndim)
    reps = (1,) * (ndim - len(reps)) + reps
    shape = (1,) * (ndim - x.ndim) + x.shape
    x = reshape(x, shape)
    if all(r == 1 for r in reps):
        return x
    interleaved = tuple(v for r, d in zip(reps, shape) for v in (r, d))
    out = bind(P.broadcast_in_dim_p, x, shape=interleaved, broadcast_dimensions=tuple(range(1, 2 * ndim, 2)))
    return reshape(out, tuple(r * d for r, d in zip(reps, shape)))


def repeat(x: ArrayLike, repeats: int | Sequence[int] | Tensor, /, *, axis: int | None = None) -> Tensor:
    """Repeat each element ``repeats`` times along ``axis`` (the flattened array when None);
    ``repeats`` may give one count per element. Counts must be concrete (they set the shape).

    >>> repeat(asarray([1, 2]), 2).tolist()
    [1, 1, 2, 2]
    >>> repeat(asarray([1, 2]), [1, 3]).tolist()
    [1, 2, 2, 2]
    """
    x = asarray(x)
    if axis is None:
        x, axis = ravel(x), 0
    axis = normalize_axis(axis, x.ndim)
    counts = _concrete_ints(repeats, "repeat counts")
    n = x.shape[axis]
    if counts.ndim > 1 or counts.size not in (1, n):
        raise ValueError(f"repeat: repeats of shape {counts.shape} do not match axis {axis} of size {n} "
                         f"(shape {x.shape}); give one count or {n}")
    if np.any(counts < 0):
        raise ValueError(f"repeat: counts must be non-negative, got {counts.tolist()}")
    if counts.size == 1:  # one count: broadcast a new axis after ``axis`` and merge the two
        r = int(counts.reshape(()))
        expanded = x.shape[:axis + 1] + (r,) + x.shape[axis + 1:]
        dims = tuple(i for i in range(x.ndim + 1) if i != axis + 1)
        out = bind(P.broadcast_in_dim_p, x, shape=expanded, broadcast_dimensions=dims)
        return reshape(out, x.shape[:axis] + (n * r,) + x.shape[axis + 1:])
    index = np.repeat(np.arange(n), counts).astype(np.int32)
    if index.size == 0:
        return _slice_axis(x, axis, 0, 0)
    gathered = bind(P.gather_p, x, Tensor(index.reshape(-1, 1)), axes=(axis,))  # the repeated axis leads
    return moveaxis(gathered, 0, axis)


_PAD_MODES = ("constant", "empty", "edge", "reflect", "symmetric", "wrap")


def _pad_pairs(pad_width: Any, ndim: int, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    widths = _concrete_ints(pad_width, "pad widths")
    try:
        pairs = np.broadcast_to(widths, (ndim, 2))
    except ValueError:
        raise ValueError(f"pad: pad_width of shape {widths.shape} does not fit an array of shape {shape} "
                         f"(give an int, (before, after), or one pair per axis)") from None
    if np.any(pairs < 0):
        raise ValueError(f"pad: pad widths must be non-negative, got {pairs.tolist()}")
    return [(int(lo), int(hi)) for lo, hi in pairs]


def pad(array: ArrayLike, pad_width: int | Sequence[int] | Sequence[Sequence[int]], mode: str = "constant", *,
        constant_values: Any = 0, reflect_type: str = "even") -> Tensor:
    """NumPy's ``pad`` with modes 'constant' (``constant_values``: a scalar or per-axis pairs),
    'empty' (zeros here), 'edge', 'reflect', 'symmetric' and 'wrap'.

    >>> pad(asarray([1, 2, 3]), 2, mode="reflect").tolist()
    [3, 2, 1, 2, 3, 2, 1]
    """
    x = asarray(array)
    if mode not in _PAD_MODES:
        raise ValueError(f"pad mode {mode!r} is not supported; use one of {_PAD_MODES}")
    if reflect_type != "even":
        raise NotImplementedError(f"pad: reflect_type={reflect_type!r} is not supported (only 'even')")
    pairs = _pad_pairs(pad_width, x.ndim, x.shape)
    if mode in ("constant", "empty"):
        return _pad_constant(x, pairs, 0 if mode == "empty" else constant_values)
    for axis, (lo, hi) in enumerate(pairs):
        if lo == 0 and hi == 0:
            continue
        if x.shape[axis] == 0:
            raise ValueError(f"pad: cannot extend the empty axis {axis} of shape {x.shape} with mode "
                             f"{mode!r}; use mode='constant'")
        x = _pad_by_index(x, axis, lo, hi, mode)
    return x


def _pad_value(x: Tensor, value: Any) -> Any:
    if isinstance(value, Tensor):
        if value.shape != ():
            raise ValueError(f"pad: constant_values must be scalars, got shape {value.shape}")
        return astype(value, x.dtype)
    return _to_numpy_scalar(np.asarray(value).item(), x.dtype)


def _pad_constant(x: Tensor, pairs: list[tuple[int, int]], constant_values: Any) -> Tensor:
    if all(lo == 0 and hi == 0 for lo, hi in pairs):
        return x
    if isinstance(constant_values, Tensor) or np.ndim(constant_values) == 0:
        return bind(P.pad_p, x, _pad_value(x, constant_values), low=tuple(p[0] for p in pairs),
                    high=tuple(p[1] for p in pairs))
    try:
        values = np.broadcast_to(np.asarray(constant_values), (x.ndim, 2))
    except ValueError:
        raise ValueError(f"pad: constant_values of shape {np.shape(constant_values)} do not fit an array "
                         f"of shape {x.shape}") from None
    for axis, ((lo, hi), (v_lo, v_hi)) in enumerate(zip(pairs, values)):  # later axes cover the corners
        for width, value, is_low in ((lo, v_lo, True), (hi, v_hi, False)):
            if width:
                widths = [0] * x.ndim
                widths[axis] = width
                zeros = (0,) * x.ndim
                x = bind(P.pad_p, x, _pad_value(x, value), low=tuple(widths) if is_low else zeros,
                         high=zeros if is_low else tuple(widths))
    return x


def _pad_by_index(x: Tensor, axis: int, lo: int, hi: int, mode: str) -> Tensor:
    """Pad one axis by copying elements of x: NumPy's own ``pad`` of ``arange(n)`` says which
    element lands where; each run of consecutive indices becomes one slice (flipped if descending)."""
    n = x.shape[axis]
    index = np.pad(np.arange(n), (lo, hi), mode=mode)  # type: ignore[call-overload]
    pieces = _index_runs(x, axis, index[:lo]) + [x] + _index_runs(x, axis, index[lo + n:])
    return concat(pieces, axis=axis)


def _index_runs(x: Tensor, axis: int, index: np.ndarray) -> list[Tensor]:
    pieces = []
    i = 0
    while i < len(index):
        step = int(index[i + 1] - index[i]) if i + 1 < len(index) else 0
        j = i + 1
        if step in (-1, 0, 1):
            while j < len(index) and index[j] - index[j - 1] == step:
                j += 1
        length, first = j - i, int(index[i])
        if step == 1:
            pieces.append(_slice_axis(x, axis, first, first + length))
        elif step == -1:
            pieces.append(flip(_slice_axis(x, axis, first - length + 1, first + 1), axis=axis))
        else:  # one element, repeated ``length`` times
            one = _slice_axis(x, axis, first, first + 1)
            shape = x.shape[:axis] + (length,) + x.shape[axis + 1:]
            pieces.append(broadcast_to(one, shape))
        i = j
    return pieces


def _split_bounds(n: int, indices: Sequence[int]) -> list[tuple[int, int]]:
    """NumPy's ``split`` at ``indices``: Python slice rules (negative, clamped, empty if reversed)."""
    edges = [0, *indices, n]
    bounds = []
    for start, stop in zip(edges[:-1], edges[1:]):
        begin, end, _ = slice(start, stop).indices(n)
        bounds.append((begin, max(begin, end)))
    return bounds


def _split(x: Tensor, indices_or_sections: Any, axis: int, name: str, equal: bool) -> list[Tensor]:
    axis = normalize_axis(axis, x.ndim)
    n = x.shape[axis]
    spec = _concrete_ints(indices_or_sections, f"{name} sections or indices")
    if spec.ndim == 0:
        sections = int(spec)
        if sections <= 0:
            raise ValueError(f"{name}: the number of sections must be positive, got {sections}")
        if equal and n % sections:
            raise ValueError(f"{name}: axis {axis} of size {n} (shape {x.shape}) does not divide into "
                             f"{sections} equal sections; use array_split")
        size, extra = divmod(n, sections)
        sizes = [size + 1] * extra + [size] * (sections - extra)
        indices = list(np.cumsum(sizes)[:-1])
    else:
        indices = [int(i) for i in spec.ravel()]
    return [_slice_axis(x, axis, begin, end) for begin, end in _split_bounds(n, indices)]


def split(x: ArrayLike, indices_or_sections: int | Sequence[int], /, axis: int = 0) -> list[Tensor]:
    """Split into equal sections (an int) or at ``indices`` along ``axis``.

    >>> [t.tolist() for t in split(asarray([1, 2, 3, 4]), [1, 3])]
    [[1], [2, 3], [4]]
    """
    return _split(asarray(x), indices_or_sections, axis, "split", equal=True)


def array_split(x: ArrayLike, indices_or_sections: int | Sequence[int], /, axis: int = 0) -> list[Tensor]:
    """Like ``split``, but an int number of sections need not divide the axis (the first ones are
    one longer)."""
    return _split(asarray(x), indices_or_sections, axis, "array_split", equal=False)


def hsplit(x: ArrayLike, indices_or_sections: int | Sequence[int], /) -> list[Tensor]:
    """Split along axis 1 (axis 0 for 1-d arrays)."""
    x = asarray(x)
    if x.ndim == 0:
        raise ValueError("hsplit needs an array of rank >= 1, got a 0-d array")
    return _split(x, indices_or_sections, 1 if x.ndim > 1 else 0, "hsplit", equal=True)


def vsplit(x: ArrayLike, indices_or_sections: int | Sequence[int], /) -> list[Tensor]:
    """Split along axis 0 (needs rank >= 2)."""
    x = asarray(x)
    if x.ndim < 2:
        raise ValueError(f"vsplit needs an array of rank >= 2, got shape {x.shape}")
    return _split(x, indices_or_sections, 0, "vsplit", equal=True)


def dsplit(x: ArrayLike, indices_or_sections: int | Sequence[int], /) -> list[Tensor]:
    """Split along axis 2 (needs rank >= 3)."""
    x = asarray(x)
    if x.ndim < 3:
        raise ValueError(f"dsplit needs an array of rank >= 3, got shape {x.shape}")
    return _split(x, indices_or_sections, 2, "dsplit", equal=True)


def unstack(x: ArrayLike, /, *, axis: int = 0) -> tuple[Tensor, ...]:
    """The slices of ``x`` along ``axis``, as a tuple. >>> len(unstack(asarray([[1, 2], [3, 4]])))  # 2"""
    x = asarray(x)
    if x.ndim == 0:
        raise ValueError("unstack needs an array of rank >= 1, got a 0-d array")
    axis = normalize_axis(axis, x.ndim)
    rest = x.shape[:axis] + x.shape[axis + 1:]
    return tuple(reshape(_slice_axis(x, axis, i, i + 1), rest) for i in range(x.shape[axis]))


def _lift(a: ArrayLike, ndim: int) -> Tensor:
    """``a`` with at least ``ndim`` axes, placed as NumPy's atleast_1d/2d/3d place them."""
    t = asarray(a)
    if t.ndim >= ndim:
        return t
    if ndim == 3 and t.ndim == 2:
        return reshape(t, t.shape + (1,))
    if ndim == 3 and t.ndim == 1:
        return reshape(t, (1,) + t.shape + (1,))
    return reshape(t, (1,) * (ndim - t.ndim) + t.shape)


def _atleast(arrays: tuple[ArrayLike, ...], ndim: int) -> Tensor | list[Tensor]:
    out = [_lift(a, ndim) for a in arrays]
    return out[0] if len(out) == 1 else out


def atleast_1d(*arrays: ArrayLike) -> Tensor | list[Tensor]:
    """Each input with at least one axis (one Tensor for one input, else a list, as JAX)."""
    return _atleast(arrays, 1)


def atleast_2d(*arrays: ArrayLike) -> Tensor | list[Tensor]:
    """Each input with at least two axes; a 1-d array of size n becomes shape (1, n)."""
    return _atleast(arrays, 2)


def atleast_3d(*arrays: ArrayLike) -> Tensor | list[Tensor]:
    """Each input with at least three axes: (n,) -> (1, n, 1), (m, n) -> (m, n, 1)."""
    return _atleast(arrays, 3)


def _as_sequence(arrays: Any, name: str) -> list[Tensor]:
    if isinstance(arrays, (Tensor, np.ndarray)):
        if arrays.ndim == 0 or arrays.shape[0] == 0:
            raise ValueError(f"{name} needs at least one array, got an array of shape {arrays.shape} to unstack")
        return list(unstack(asarray(arrays)))
    if not isinstance(arrays, (list, tuple)):
        raise TypeError(f"{name} takes a list or tuple of arrays, got {type(arrays).__name__}")
    if not arrays:
        raise ValueError(f"{name} needs at least one array")
    return [asarray(a) for a in arrays]


def hstack(arrays: Sequence[ArrayLike], /) -> Tensor:
    """Concatenate along axis 1 (axis 0 for 1-d arrays).

    >>> hstack([asarray([1]), asarray([2])]).tolist()
    [1, 2]
    """
    tensors = [_lift(t, 1) for t in _as_sequence(arrays, "hstack")]
    return concat(tensors, axis=0 if tensors[0].ndim == 1 else 1)


def vstack(arrays: Sequence[ArrayLike], /) -> Tensor:
    """Stack rows: concatenate along axis 0 after making every input at least 2-d."""
    return concat([_lift(t, 2) for t in _as_sequence(arrays, "vstack")], axis=0)


def dstack(arrays: Sequence[ArrayLike], /) -> Tensor:
    """Concatenate along axis 2 after making every input at least 3-d."""
    return concat([_lift(t, 3) for t in _as_sequence(arrays, "dstack")], axis=2)


def column_stack(arrays: Sequence[ArrayLike], /) -> Tensor:
    """Stack 1-d arrays as columns of a 2-d array (2-d inputs are joined as they are)."""
    tensors = _as_sequence(arrays, "column_stack")
    columns = [reshape(t, (t.size, 1)) if t.ndim < 2 else t for t in tensors]
    return concat(columns, axis=1)


def append(arr: ArrayLike, values: ArrayLike, /, axis: int | None = None) -> Tensor:
    """``values`` joined after ``arr`` along ``axis`` (both flattened when None)."""
    return concat([asarray(arr), asarray(values)], axis=axis)
