"""Array creation: zeros, ones, full, empty, arange, linspace, eye, identity, tril, triu, meshgrid,
diag and the ``*_like`` forms.

Constant fills are a scalar broadcast (one ``broadcast_in_dim`` of a literal), so they fuse into
their consumers instead of occupying memory; ranges are ``iota`` scaled and shifted; triangles
and diagonals are ``iota`` masks fed to ``select``. Sizes must be concrete (they set shapes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.core import check_array_size
from funcgrad.ir.tracing import current_builder
from funcgrad.numpy.conversion import ArrayLike, _to_numpy_scalar, asarray, astype, broadcast_to, promote
from funcgrad.numpy.elementwise import add, divide, floor, multiply, subtract, where

Shape = int | Sequence[int]


def _shape(shape: Shape) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        shape = (shape,)
    elif isinstance(shape, str) or not hasattr(shape, "__iter__"):
        raise TypeError(f"shape must be an int or a sequence of ints, got {shape!r}")
    shape = tuple(shape)
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"shape entries must be integers, got {shape}")
        if d < 0:
            raise ValueError(f"negative dimension in shape {shape}")
    return tuple(int(d) for d in shape)


def full(shape: Shape, fill_value: ArrayLike, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """An array of ``shape`` filled with ``fill_value`` (a scalar, or an array that broadcasts to
    ``shape``). A Python-scalar fill without ``dtype`` gives a weakly typed result, as in JAX.

    >>> full((2,), 7).tolist()
    [7, 7]
    """
    return _fill("full", shape, fill_value, dtype)


def _fill(name: str, shape: Shape, fill_value: ArrayLike, dtype: Any) -> Tensor:
    """``full`` under the name of the function the user called (for its errors)."""
    shape = _shape(shape)
    if isinstance(fill_value, (bool, int, float, complex)) and not isinstance(fill_value, np.generic):
        target = dtypes.python_scalar_dtype(fill_value) if dtype is None else dtypes.canonicalize(dtype)
        check_array_size(shape, target, name)
        out = broadcast_to(_to_numpy_scalar(fill_value, target), shape)
        out._weak = dtype is None and not isinstance(fill_value, bool)
        return out
    value = asarray(fill_value)
    if dtype is not None:
        value = astype(value, dtype)
    check_array_size(shape, value.dtype, name)
    try:
        return broadcast_to(value, shape)
    except ValueError:
        raise ValueError(f"full: fill_value of shape {value.shape} cannot be broadcast "
                         f"to shape {shape}") from None


def zeros(shape: Shape, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """An array of ``shape`` filled with zeros (float32 unless ``dtype`` says otherwise).

    >>> zeros((2, 3)).shape
    (2, 3)
    """
    return _fill("zeros", shape, 0, dtypes.default_float if dtype is None else dtype)


def ones(shape: Shape, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """An array of ``shape`` filled with ones (float32 unless ``dtype`` says otherwise).

    >>> ones(2, dtype='int32').tolist()
    [1, 1]
    """
    return _fill("ones", shape, 1, dtypes.default_float if dtype is None else dtype)


def empty(shape: Shape, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """An array whose contents are unspecified. Outside a trace it is a real, uninitialised buffer
    of the full shape, as NumPy's, PyTorch's and tinygrad's ``empty``, so kernels that read it load
    memory; under a trace (``jit``, ``grad``) it is zeros, as ``jax.numpy.empty``.

    >>> empty((2, 3)).shape
    (2, 3)
    """
    shape = _shape(shape)
    dtype = dtypes.default_float if dtype is None else dtypes.canonicalize(dtype)
    check_array_size(shape, dtype, "empty")
    if current_builder() is not None:
        return zeros(shape, dtype=dtype)
    return Tensor(np.empty(shape, dtype))


def full_like(x: ArrayLike, /, fill_value: bool | int | float, *, dtype: Any = None,
              device: str | None = None) -> Tensor:
    """An array of ``x``'s shape (and dtype, unless ``dtype`` is given) filled with ``fill_value``.

    >>> full_like(asarray([1, 2]), 7).tolist()
    [7, 7]
    """
    x = asarray(x)
    return full(x.shape, fill_value, dtype=x.dtype if dtype is None else dtype)


def zeros_like(x: ArrayLike, /, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """Zeros of ``x``'s shape and dtype (or ``dtype``).

    >>> zeros_like(asarray([1.5, 2.5])).tolist()
    [0.0, 0.0]
    """
    return full_like(x, 0, dtype=dtype)


def ones_like(x: ArrayLike, /, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """Ones of ``x``'s shape and dtype (or ``dtype``).

    >>> ones_like(asarray([1, 2]), dtype='float32').tolist()
    [1.0, 1.0]
    """
    return full_like(x, 1, dtype=dtype)


def empty_like(x: ArrayLike, /, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """Zeros of ``x``'s shape, as ``jax.numpy.empty_like``: a function of ``x`` whose transforms
    (vmap, grad) must agree with running it in a loop, which unspecified contents would not."""
    return zeros_like(x, dtype=dtype)


def _concrete_number(value: Any, name: str, fn: str) -> int | float:
    """A Python number from ``value``; a traced Tensor raises ConcretizationError via ``item()``."""
    if isinstance(value, Tensor):
        if value.shape != ():
            raise ValueError(f"{fn}: {name} must be a scalar, got an array of shape {value.shape}")
        return value.item()
    if isinstance(value, (np.ndarray, np.generic)) and np.ndim(value) == 0:
        return value.item()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{fn}: {name} must be a real number, got {type(value).__name__}")
    return value


def arange(start: int | float, /, stop: int | float | None = None, step: int | float = 1, *,
           dtype: Any = None, device: str | None = None) -> Tensor:
    """Evenly spaced values in [start, stop), ``ceil((stop - start) / step)`` of them, as NumPy.
    Integer arguments give int32, any float gives float32. The bounds must be concrete.

    >>> arange(3).tolist()
    [0, 1, 2]
    >>> arange(5, 0, -2).tolist()
    [5, 3, 1]
    """
    if stop is None:
        start, stop = 0, start
    start, stop, step = (_concrete_number(v, name, "arange")
                         for v, name in ((start, "start"), (stop, "stop"), (step, "step")))
    if step == 0:
        raise ValueError("arange: step must not be zero")
    length = max(math.ceil((stop - start) / step), 0)
    is_float = any(isinstance(v, float) for v in (start, stop, step))
    if dtype is None:
        dtype = dtypes.default_float if is_float else dtypes.default_int
    dtype = dtypes.canonicalize(dtype)
    check_array_size((length,), dtype, "arange")
    if dtypes.is_int(dtype) or dtypes.is_bool(dtype):
        # integer results: count in int32 from the truncated start, as NumPy does for int dtypes
        counter = dtypes.default_int if dtypes.is_bool(dtype) else dtype
        if length > 0:  # the counter and the last value must fit, or the iota wraps around silently
            last = int(start) + (length - 1) * int(step)
            info = np.iinfo(counter)
            if not (info.min <= last <= info.max and length - 1 <= info.max):
                raise OverflowError(f"arange: {length} values from {start} to {last} do not fit in {counter.name} "
                                    f"(range {info.min}..{info.max}); pass dtype='int64'")
        out = bind(P.iota_p, dtype=counter, shape=(length,), dimension=0)
        if step != 1:
            out = out * _to_numpy_scalar(int(step), counter)
        if start != 0:
            out = out + _to_numpy_scalar(int(start), counter)
        return out if counter == dtype else astype(out, dtype)
    # floats: compute in float32 (or wider) and round once into the requested dtype
    work = dtype if dtype.itemsize >= 4 else dtypes.float32
    out = bind(P.iota_p, dtype=work, shape=(length,), dimension=0)
    if step != 1:
        out = out * _to_numpy_scalar(float(step), work)
    if start != 0:
        out = out + _to_numpy_scalar(float(start), work)
    return out if work == dtype else astype(out, dtype)


def linspace(start: float, stop: float, /, num: int, *, dtype: Any = None, device: str | None = None,
             endpoint: bool = True) -> Tensor:
    """``num`` evenly spaced values from ``start`` to ``stop`` (inclusive if ``endpoint``).
    ``start`` and ``stop`` may be traced scalars; integer dtypes floor the values, as NumPy does.

    >>> linspace(0, 1, 5).tolist()
    [0.0, 0.25, 0.5, 0.75, 1.0]
    """
    count = _concrete_number(num, "num", "linspace")
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
        raise TypeError(f"linspace: num must be an integer, got {count!r}")
    num = int(count)
    if num < 0:
        raise ValueError(f"linspace: num must be non-negative, got {num}")
    complex_ends = [v for v in (start, stop) if isinstance(v, (complex, np.complexfloating))
                    or (isinstance(v, Tensor) and dtypes.is_complex(v.dtype))]
    if complex_ends or (dtype is not None and dtypes.is_complex(dtypes.canonicalize(dtype))):
        # complex endpoints: the real and the imaginary parts are two real linspaces
        if dtype is None:
            dtype = max((v.dtype if isinstance(v, Tensor) else dtypes.complex64 for v in complex_ends),
                        key=lambda d: d.itemsize)
        part = dtypes.real_dtype(dtypes.canonicalize(dtype))
        ends = [asarray(v) if isinstance(v, Tensor) else v for v in (start, stop)]
        re = [bind(P.real_p, v) if isinstance(v, Tensor) and dtypes.is_complex(v.dtype) else
              (v.real if isinstance(v, (complex, np.complexfloating)) else v) for v in ends]
        im = [bind(P.imag_p, v) if isinstance(v, Tensor) and dtypes.is_complex(v.dtype) else
              (v.imag if isinstance(v, (complex, np.complexfloating)) else 0.0) for v in ends]
        return bind(P.complex_p, linspace(re[0], re[1], num, dtype=part, endpoint=endpoint),
                    linspace(im[0], im[1], num, dtype=part, endpoint=endpoint))
    if dtype is None:  # as jax.numpy: the floating result type of the endpoints (float32 for scalars)
        endpoints: list[Any] = [start, stop]
        endpoint_dtypes = [v.dtype for v in endpoints if isinstance(v, Tensor) and dtypes.is_float(v.dtype)]
        dtype = max(endpoint_dtypes, key=lambda d: d.itemsize) if endpoint_dtypes else dtypes.default_float
    dtype = dtypes.canonicalize(dtype)
    check_array_size((num,), dtype, "linspace")
    work = dtype if dtypes.is_float(dtype) and dtype.itemsize >= 4 else dtypes.float32
    divisions = (num - 1 if endpoint else num) or 1
    counts = bind(P.iota_p, dtype=work, shape=(num,), dimension=0)
    if isinstance(start, Tensor) or isinstance(stop, Tensor):
        first, last = (astype(asarray(v), work) for v in (start, stop))
        if first.shape != () or last.shape != ():
            raise ValueError(f"linspace: start and stop must be scalars, "
                             f"got shapes {first.shape}, {last.shape}")
        step = divide(subtract(last, first), float(divisions))
    else:
        first = _to_numpy_scalar(float(start), work)
        last = _to_numpy_scalar(float(stop), work)
        step = _to_numpy_scalar((float(stop) - float(start)) / divisions, work)  # exact in float64
    out = add(multiply(counts, step), first)
    if endpoint and num > 1:  # land exactly on stop, as NumPy does
        out = where(counts == _to_numpy_scalar(num - 1, work), last, out)
    if dtypes.is_int(dtype):
        out = floor(out)
    return out if out.dtype == dtype else astype(out, dtype)


def eye(n_rows: int, n_cols: int | None = None, /, *, k: int = 0, dtype: Any = None,
        device: str | None = None) -> Tensor:
    """A 2-d array with ones on the ``k``-th diagonal. >>> eye(2).tolist()  # [[1.0, 0.0], [0.0, 1.0]]"""
    n_cols = n_rows if n_cols is None else n_cols
    shape = _shape((n_rows, n_cols))
    check_array_size(shape, dtypes.default_float if dtype is None else dtypes.canonicalize(dtype), "eye")
    counter = dtypes.int32 if max(shape) + abs(k) < 2**31 else dtypes.int64  # row/column numbers must not wrap
    rows = bind(P.iota_p, dtype=counter, shape=shape, dimension=0)
    cols = bind(P.iota_p, dtype=counter, shape=shape, dimension=1)
    on_diagonal = (cols - rows) == _to_numpy_scalar(k, counter)
    return on_diagonal.astype(dtypes.default_float if dtype is None else dtype)


def identity(n: int, /, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """The n x n identity matrix. >>> identity(2).tolist()  # [[1.0, 0.0], [0.0, 1.0]]"""
    return eye(n, dtype=dtype)


def _triangle_mask(x: Tensor, k: int, lower: bool) -> Tensor:
    shape = x.shape[-2:]
    rows = bind(P.iota_p, dtype=dtypes.int32, shape=shape, dimension=0)
    cols = bind(P.iota_p, dtype=dtypes.int32, shape=shape, dimension=1)
    offset = cols - rows
    return offset <= np.int32(k) if lower else offset >= np.int32(k)


def _triangle(x: ArrayLike, k: int, lower: bool, name: str) -> Tensor:
    x = asarray(x)
    if x.ndim < 2:
        raise ValueError(f"{name} needs an array of rank >= 2, got shape {x.shape}")
    k = int(_concrete_number(k, "k", name))
    mask = broadcast_to(_triangle_mask(x, k, lower), x.shape)
    return where(mask, x, np.zeros((), x.dtype)[()])


def tril(x: ArrayLike, /, *, k: int = 0) -> Tensor:
    """Zero the elements above the ``k``-th diagonal of the last two axes.

    >>> tril(ones((2, 2))).tolist()
    [[1.0, 0.0], [1.0, 1.0]]
    """
    return _triangle(x, k, lower=True, name="tril")


def triu(x: ArrayLike, /, *, k: int = 0) -> Tensor:
    """Zero the elements below the ``k``-th diagonal of the last two axes."""
    return _triangle(x, k, lower=False, name="triu")


def meshgrid(*arrays: ArrayLike, indexing: str = "xy", sparse: bool = False) -> list[Tensor]:
    """Coordinate grids from 1-d arrays: with ``indexing='ij'`` output i varies along axis i;
    'xy' (the default) swaps the first two axes (Cartesian order). ``sparse`` keeps size-1 axes.

    >>> [g.shape for g in meshgrid(arange(3), arange(2))]
    [(2, 3), (2, 3)]
    """
    if indexing not in ("xy", "ij"):
        raise ValueError(f"meshgrid: indexing must be 'xy' or 'ij', got {indexing!r}")
    tensors = [asarray(a) for a in arrays]
    for t in tensors:
        if t.ndim != 1:
            raise ValueError(f"meshgrid takes 1-d arrays, got shapes {[t.shape for t in tensors]}")
    if len(tensors) > 1:
        promoted, _, _ = promote(*tensors)
        tensors = list(promoted)
    sizes = [t.shape[0] for t in tensors]
    dims = list(range(len(tensors)))
    if indexing == "xy" and len(tensors) > 1:
        sizes[0], sizes[1] = sizes[1], sizes[0]
        dims[0], dims[1] = 1, 0
    grids = []
    for t, dim in zip(tensors, dims):
        shape = tuple(sizes) if not sparse else tuple(d if i == dim else 1 for i, d in enumerate(sizes))
        grids.append(bind(P.broadcast_in_dim_p, t, shape=shape, broadcast_dimensions=(dim,)))
    return grids


def diag(v: ArrayLike, /, k: int = 0) -> Tensor:
    """A 1-d ``v`` gives a square matrix with ``v`` on the ``k``-th diagonal; a 2-d ``v`` gives its
    ``k``-th diagonal.

    >>> diag(asarray([1, 2])).tolist()
    [[1, 0], [0, 2]]
    """
    v = asarray(v)
    k = int(_concrete_number(k, "k", "diag"))
    if v.ndim == 2:
        return _diagonal_2d(v, k)
    if v.ndim != 1:
        raise ValueError(f"diag takes a 1-d or 2-d array, got shape {v.shape}")
    n = v.shape[0] + abs(k)
    rows = bind(P.iota_p, dtype=dtypes.int32, shape=(n, n), dimension=0)
    cols = bind(P.iota_p, dtype=dtypes.int32, shape=(n, n), dimension=1)
    zero = np.zeros((), v.dtype)[()]
    padded = bind(P.pad_p, v, zero, low=(0,), high=(abs(k),))
    # on the diagonal, row i holds v[i] when k >= 0, and column j holds v[j] when k < 0
    along = bind(P.broadcast_in_dim_p, padded, shape=(n, n), broadcast_dimensions=(0 if k >= 0 else 1,))
    return where((cols - rows) == np.int32(k), along, zero)


def _diagonal_2d(x: Tensor, k: int) -> Tensor:
    """The k-th diagonal of a matrix: a strided slice of the flattened matrix."""
    n, m = x.shape
    count = max(0, min(n, m - k) if k >= 0 else min(n + k, m))
    flat = bind(P.reshape_p, x, new_sizes=(n * m,))
    if count == 0:
        return bind(P.slice_p, flat, start=(0,), limit=(0,), strides=(1,))
    first = k if k >= 0 else -k * m
    return bind(P.slice_p, flat, start=(first,), limit=(first + (count - 1) * (m + 1) + 1,), strides=(m + 1,))


__all__ = [
    "arange", "diag", "empty", "empty_like", "eye", "full", "full_like", "identity", "linspace",
    "meshgrid", "ones", "ones_like", "tril", "triu", "zeros", "zeros_like",
]
