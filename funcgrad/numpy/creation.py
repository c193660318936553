"""Array creation: zeros, ones, full, empty, arange, linspace, eye and the ``*_like`` forms.

Constant fills are a scalar broadcast (one ``broadcast_in_dim`` of a literal), so they fuse into
their consumers instead of occupying memory; ranges are ``iota`` scaled and shifted.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import ArrayLike, _to_numpy_scalar, asarray, broadcast_to
from funcgrad.tensor import Tensor, bind

Shape = int | Sequence[int]


def _shape(shape: Shape) -> tuple[int, ...]:
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    for d in shape:
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)):
            raise TypeError(f"shape entries must be integers, got {shape}")
        if d < 0:
            raise ValueError(f"negative dimension in shape {shape}")
    return tuple(int(d) for d in shape)


def full(shape: Shape, fill_value: bool | int | float, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """An array of ``shape`` filled with ``fill_value``. >>> full((2,), 7).tolist()  # [7, 7]"""
    if isinstance(fill_value, Tensor):
        value = fill_value if dtype is None else fill_value.astype(dtype)
        if value.shape != ():
            raise ValueError(f"full needs a scalar fill_value, got shape {value.shape}")
        return broadcast_to(value, _shape(shape))
    dtype = dtypes.python_scalar_dtype(fill_value) if dtype is None else dtypes.canonicalize(dtype)
    return broadcast_to(_to_numpy_scalar(fill_value, dtype), _shape(shape))


def zeros(shape: Shape, *, dtype: Any = None, device: str | None = None) -> Tensor:
    return full(shape, 0, dtype=dtypes.default_float if dtype is None else dtype)


def ones(shape: Shape, *, dtype: Any = None, device: str | None = None) -> Tensor:
    return full(shape, 1, dtype=dtypes.default_float if dtype is None else dtype)


def empty(shape: Shape, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """An array whose contents are unspecified (funcgrad gives zeros, which cost nothing lazily)."""
    return zeros(shape, dtype=dtype)


def full_like(x: ArrayLike, /, fill_value: bool | int | float, *, dtype: Any = None,
              device: str | None = None) -> Tensor:
    x = asarray(x)
    return full(x.shape, fill_value, dtype=x.dtype if dtype is None else dtype)


def zeros_like(x: ArrayLike, /, *, dtype: Any = None, device: str | None = None) -> Tensor:
    return full_like(x, 0, dtype=dtype)


def ones_like(x: ArrayLike, /, *, dtype: Any = None, device: str | None = None) -> Tensor:
    return full_like(x, 1, dtype=dtype)


def empty_like(x: ArrayLike, /, *, dtype: Any = None, device: str | None = None) -> Tensor:
    return zeros_like(x, dtype=dtype)


def arange(start: int | float, /, stop: int | float | None = None, step: int | float = 1, *,
           dtype: Any = None, device: str | None = None) -> Tensor:
    """Evenly spaced values in [start, stop). >>> arange(3).tolist()  # [0, 1, 2]"""
    if stop is None:
        start, stop = 0, start
    if step == 0:
        raise ValueError("arange: step must not be zero")
    for name, value in (("start", start), ("stop", stop), ("step", step)):
        if isinstance(value, Tensor) or not isinstance(value, (int, float, np.integer, np.floating)):
            raise TypeError(f"arange: {name} must be a Python number (a concrete value), got {type(value).__name__}")
    length = max(math.ceil((stop - start) / step), 0)
    is_float = any(isinstance(v, (float, np.floating)) for v in (start, stop, step))
    dtype = (dtypes.default_float if is_float else dtypes.default_int) if dtype is None else dtypes.canonicalize(dtype)
    counter_dtype = dtype if not dtypes.is_bool(dtype) else dtypes.default_int
    out = bind(P.iota_p, dtype=counter_dtype, shape=(length,), dimension=0)
    if step != 1:
        out = out * _to_numpy_scalar(step, counter_dtype)
    if start != 0:
        out = out + _to_numpy_scalar(start, counter_dtype)
    return out if counter_dtype == dtype else out.astype(dtype)


def linspace(start: float, stop: float, /, num: int, *, dtype: Any = None, device: str | None = None,
             endpoint: bool = True) -> Tensor:
    """``num`` evenly spaced values from ``start`` to ``stop`` (inclusive if ``endpoint``)."""
    if num < 0:
        raise ValueError(f"linspace: num must be non-negative, got {num}")
    dtype = dtypes.default_float if dtype is None else dtypes.canonicalize(dtype)
    divisions = (num - 1 if endpoint else num) or 1
    step = (float(stop) - float(start)) / divisions
    counts = bind(P.iota_p, dtype=dtypes.default_float, shape=(num,), dimension=0)
    out = counts * np.float32(step) + np.float32(start)
    if endpoint and num > 1:  # land exactly on stop, as NumPy does
        from funcgrad.numpy.elementwise import where
        out = where(counts == np.float32(num - 1), np.float32(stop), out)
    return out if out.dtype == dtype else out.astype(dtype)


def eye(n_rows: int, n_cols: int | None = None, /, *, k: int = 0, dtype: Any = None,
        device: str | None = None) -> Tensor:
    """A 2-d array with ones on the ``k``-th diagonal. >>> eye(2).tolist()  # [[1.0, 0.0], [0.0, 1.0]]"""
    n_cols = n_rows if n_cols is None else n_cols
    shape = _shape((n_rows, n_cols))
    rows = bind(P.iota_p, dtype=dtypes.int32, shape=shape, dimension=0)
    cols = bind(P.iota_p, dtype=dtypes.int32, shape=shape, dimension=1)
    on_diagonal = (cols - rows) == np.int32(k)
    return on_diagonal.astype(dtypes.default_float if dtype is None else dtype)


# every public function defined above (aliases included) is part of funcgrad.numpy
__all__ = [name for name, value in list(globals().items())
           if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == __name__]
