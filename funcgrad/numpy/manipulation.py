"""Shape manipulation: reshape, permute_dims, expand_dims, squeeze, concat, stack, moveaxis, ...

These bind movement primitives (reshape, transpose, broadcast_in_dim, concatenate, slice, pad,
flip); the compiler turns them into index arithmetic rather than copies. A reshape or transpose
that changes nothing binds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
import numpy as np

from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import ArrayLike, asarray, broadcast_arrays, broadcast_to, promote
from funcgrad.numpy.reductions import normalize_axes, normalize_axis
from funcgrad.tensor import Tensor, bind

__all__ = ["reshape", "permute_dims", "transpose", "matrix_transpose", "expand_dims", "squeeze", "concat",
           "concatenate", "stack", "moveaxis", "swapaxes", "ravel", "flatten", "broadcast_to",
           "broadcast_arrays"]


def _resolve_shape(shape: Sequence[int] | int, size: int) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
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
    x = asarray(x)
    a, b = normalize_axis(axis1, x.ndim), normalize_axis(axis2, x.ndim)
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return permute_dims(x, perm)


def moveaxis(x: ArrayLike, source: int | Sequence[int], destination: int | Sequence[int], /) -> Tensor:
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
                raise ValueError(f"cannot squeeze axis {a} of shape {x.shape}: its size is {x.shape[a]}, not 1")
    return reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes))


def ravel(x: ArrayLike, /) -> Tensor:
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

