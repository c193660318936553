"""Turning user values into Tensors: ``asarray``, dtype promotion, broadcasting and axis arguments.

Every function of ``funcgrad.numpy`` starts here. ``promote`` applies JAX's promotion lattice with
weakly typed Python scalars (``x_f16 * 2.0`` stays float16); ``broadcast_arrays`` follows NumPy's
broadcasting rules and inserts explicit ``broadcast_in_dim`` equations; ``apply_elementwise``
combines both and binds an elementwise primitive. Python scalars reach the IR as inline literals.
``normalize_axis``/``normalize_axes`` check the ``axis`` arguments of every module.

This is the bottom of the package, whose modules import one another in one order: conversion,
elementwise, creation, manipulation, reductions, searching, then indexing and linalg, each only from
those before it (no cycles, no imports inside functions needed).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, cast

import numpy as np

from funcgrad.core.tensor import Tensor, bind, tensor_from_host
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.primitives import Primitive

_PY_SCALARS = (bool, int, float, complex)
ArrayLike = Any  # Tensor | np.ndarray | bool | int | float | nested sequences
Axis = int | Sequence[int] | None


def asarray(obj: ArrayLike, dtype: Any = None, *, copy: bool | None = None,
            device: str | None = None) -> Tensor:
    """Convert ``obj`` to a Tensor; Tensors pass through (cast if ``dtype`` differs).

    >>> asarray([1, 2, 3]).dtype
    dtype('int32')
    """
    if device is not None:
        Tensor(0, device=device)  # validates the device name
    if isinstance(obj, Tensor):
        return obj if dtype is None else astype(obj, dtype, copy=bool(copy))
    if isinstance(obj, _PY_SCALARS) and not isinstance(obj, np.generic) and dtype is None:
        return scalar_tensor(obj)
    if isinstance(obj, (list, tuple)) and any(isinstance(o, Tensor) for o in _flat_items(obj)):
        return _stack_rows([asarray(o, dtype) for o in obj])
    return Tensor(obj, dtype=dtype)


def _stack_rows(rows: list[Tensor]) -> Tensor:
    """``manipulation.stack(rows)`` (axis 0): the same check and equations (a leading size-1 axis on
    each row, promotion, one concatenate), written out here because manipulation builds on this module."""
    if len({row.shape for row in rows}) != 1:
        raise ValueError(f"stack needs arrays of one shape, got {[row.shape for row in rows]}")
    values, _, _ = promote(*(bind(P.reshape_p, row, new_sizes=(1,) + row.shape) for row in rows))
    return values[0] if len(values) == 1 else bind(P.concatenate_p, *values, axis=0)


def _flat_items(obj: Any) -> list[Any]:
    items: list[Any] = []
    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, (list, tuple)):
            stack.extend(item)
        else:
            items.append(item)
    return items


def scalar_tensor(value: bool | int | float | complex, dtype: np.dtype | None = None) -> Tensor:
    """A rank-0 Tensor for a Python scalar; weakly typed unless ``dtype`` is given or it is a bool."""
    dtype = dtypes.python_scalar_dtype(value) if dtype is None else dtype
    tensor = Tensor._wrap(Tensor(_to_numpy_scalar(value, dtype))._data)
    tensor._weak = dtype != dtypes.bool_ and not isinstance(value, np.generic)
    return tensor


def _to_numpy_scalar(value: Any, dtype: np.dtype) -> np.generic:
    if dtypes.is_int(dtype) and not isinstance(value, (bool, np.bool_)):
        if isinstance(value, (float, np.floating)):
            value = int(value)
        info = np.iinfo(dtype)
        if not info.min <= value <= info.max:
            raise OverflowError(f"Python int {value} does not fit in {dtype.name} "
                                f"(range {info.min}..{info.max})")
    return cast(np.generic, np.asarray(value).astype(dtype)[()])  # () on a 0-d array gives a scalar


def dtype_and_weak(x: Any) -> tuple[np.dtype, bool]:
    if isinstance(x, Tensor):
        return x.dtype, x._weak
    if isinstance(x, np.generic):
        return dtypes.canonicalize(_host_dtype(x.dtype)), False
    if isinstance(x, _PY_SCALARS):
        dtype = dtypes.python_scalar_dtype(x)
        return dtype, dtype != dtypes.bool_
    if isinstance(x, np.ndarray):
        return _host_dtype(x.dtype), False
    raise TypeError(f"expected an array or a scalar, got {type(x).__name__}")


# NumPy's 64-bit defaults (np.array([1.0]), np.int64 scalars) become funcgrad's 32-bit ones, as in JAX
_HOST_TO_DEFAULT: dict[np.dtype, np.dtype] = {dtypes.float64: dtypes.float32, dtypes.int64: dtypes.int32,
                                              dtypes.uint64: dtypes.uint32, dtypes.complex128: dtypes.complex64}


def _host_dtype(dtype: np.dtype) -> np.dtype:
    return _HOST_TO_DEFAULT.get(np.dtype(dtype), np.dtype(dtype))


def result_type(*args: Any) -> np.dtype:
    """The dtype operations on ``args`` (arrays, dtypes or scalars) produce.

    >>> result_type(asarray([1], "uint8"), 1000)  # a Python int is weak: the array's dtype wins
    dtype('uint8')
    """
    pairs = []
    for a in args:
        if isinstance(a, (Tensor, np.ndarray, np.generic, *_PY_SCALARS)):
            pairs.append(dtype_and_weak(a))
        else:
            pairs.append((dtypes.canonicalize(a), False))
    return dtypes.result_type(*pairs)[0]


def isdtype(dtype: Any, kind: Any) -> bool:
    """The Array API's dtype classification: kind is a dtype, a kind name, or a tuple of them."""
    if isinstance(kind, tuple):
        return any(isdtype(dtype, k) for k in kind)
    dtype = dtypes.canonicalize(dtype)
    if not isinstance(kind, str):
        return dtype == dtypes.canonicalize(kind)
    checks = {
        "bool": dtypes.is_bool, "signed integer": lambda d: d.kind == "i",
        "unsigned integer": dtypes.is_unsigned, "integral": dtypes.is_int,
        "real floating": dtypes.is_float, "complex floating": dtypes.is_complex,
        "numeric": lambda d: not dtypes.is_bool(d),
    }
    if kind not in checks:
        raise ValueError(f"unknown dtype kind {kind!r}; expected one of {sorted(checks)}")
    return checks[kind](dtype)


def issubdtype(arg1: Any, arg2: Any) -> bool:
    """NumPy's dtype hierarchy test, with bfloat16 a floating type (as ``jax.numpy.issubdtype``).

    >>> issubdtype('bfloat16', np.floating), issubdtype('int32', np.integer)
    (True, True)
    """
    first = dtypes.canonicalize(arg1)
    if dtypes.is_bfloat16(first):  # ml_dtypes' bfloat16 is not under np.floating in NumPy's own tree
        first = dtypes.float16  # the nearest NumPy type in the hierarchy
        if not (isinstance(arg2, type) and issubclass(arg2, np.generic)) and np.dtype(arg2) == dtypes.bfloat16:
            return True
    return bool(np.issubdtype(first, arg2))


def from_dlpack(x: Any, /, *, device: str | None = None, copy: bool | None = None) -> Tensor:
    """A Tensor from any DLPack exporter on the CPU (a NumPy array, a PyTorch tensor, ...): zero-copy
    where the memory is C-contiguous (the Tensor then shares it: do not write to it afterwards).

    >>> from_dlpack(np.arange(3)).tolist()
    [0, 1, 2]
    """
    array = np.from_dlpack(x, copy=copy)
    tensor = tensor_from_host(array)
    return tensor if device is None else tensor.to(device)


def astype(x: ArrayLike, dtype: Any, /, *, copy: bool = True, device: str | None = None) -> Tensor:
    """Cast ``x`` to ``dtype`` (float -> int truncates toward zero and saturates)."""
    x = asarray(x)
    dtype = dtypes.canonicalize(dtype)
    if x.dtype == dtype:
        return x
    return bind(P.convert_element_type_p, x, new_dtype=dtype)


def promote(*args: ArrayLike) -> tuple[list[Any], np.dtype, bool]:
    """Bring ``args`` to one dtype. Tensors are cast; scalars become NumPy scalars of the result
    dtype (which the tracer writes as literals). Returns (values, dtype, weak)."""
    converted = [a if isinstance(a, (Tensor, *_PY_SCALARS, np.generic)) else asarray(a) for a in args]
    dtype, weak = dtypes.result_type(*(dtype_and_weak(a) for a in converted))
    values: list[Any] = []
    for a in converted:
        if isinstance(a, Tensor):
            values.append(astype(a, dtype))
        else:
            values.append(_to_numpy_scalar(a, dtype))
    return values, dtype, weak


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
    if isinstance(axis, (int, np.integer)):
        axes: tuple[Any, ...] = (axis,)
    elif isinstance(axis, (tuple, list, range, np.ndarray)):
        axes = tuple(axis)
    else:
        raise TypeError(f"axis must be an integer, a tuple of integers or None, got {axis!r}")
    normalized = tuple(normalize_axis(a, ndim) for a in axes)
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"repeated axis in {axis}")
    return normalized


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """NumPy's broadcasting of shapes. >>> broadcast_shapes((3, 1), (4,))  # (3, 4)"""
    shapes = tuple(_shape_tuple(s, "broadcast_shapes") for s in shapes)
    ndim = max((len(s) for s in shapes), default=0)
    result = []
    for axis in range(ndim):
        sizes = {s[axis - ndim + len(s)] for s in shapes if axis - ndim + len(s) >= 0}
        sizes.discard(1)
        if len(sizes) > 1:
            listed = ", ".join(str(tuple(s)) for s in shapes)
            raise ValueError(f"shapes {listed} cannot be broadcast together")
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def _shape_tuple(shape: Any, name: str) -> tuple[int, ...]:
    """``shape`` (an int or a sequence of ints) as a tuple, or a TypeError naming ``name``."""
    try:
        if not hasattr(shape, "__iter__"):
            return (operator.index(shape),)
        return tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"{name}: a shape must be an int or a sequence of ints, got {shape!r}") from None


def broadcast_to(x: ArrayLike, shape: Sequence[int]) -> Tensor:
    """Broadcast ``x`` to ``shape`` following NumPy's rules (leading axes added, size-1 axes expanded)."""
    shape = _shape_tuple(shape, "broadcast_to")
    if isinstance(x, np.generic):  # stays an inline literal when traced
        return bind(P.broadcast_in_dim_p, x, shape=shape, broadcast_dimensions=())
    x = asarray(x)
    if x.shape == shape:
        return x
    if len(shape) < x.ndim or broadcast_shapes(x.shape, shape) != shape:
        raise ValueError(f"cannot broadcast an array of shape {x.shape} to shape {shape}")
    offset = len(shape) - x.ndim
    return bind(P.broadcast_in_dim_p, x, shape=shape, broadcast_dimensions=tuple(range(offset, len(shape))))


def broadcast_arrays(*args: ArrayLike) -> list[Tensor]:
    """The arguments broadcast against each other to one shape (NumPy's broadcasting rules).

    >>> [t.shape for t in broadcast_arrays(asarray([1, 2]), asarray([[0], [1], [2]]))]
    [(3, 2), (3, 2)]
    """
    tensors = [asarray(a) for a in args]
    shape = broadcast_shapes(*(t.shape for t in tensors))
    return [broadcast_to(t, shape) for t in tensors]


def apply_elementwise(primitive: Primitive, *args: ArrayLike, to_float: bool = False,
                      keep_weak: bool = True) -> Tensor:
    """Promote, broadcast and bind an elementwise primitive. ``to_float`` promotes bool/integer
    inputs to the default float first (for sin, exp, true division, ...), as JAX does."""
    values, dtype, weak = promote(*args)
    if to_float and not dtypes.is_inexact(dtype):
        values = [astype(v, dtypes.default_float) if isinstance(v, Tensor)
                  else _to_numpy_scalar(v, dtypes.default_float) for v in values]
    shapes = [v.shape for v in values if isinstance(v, Tensor)]
    shape = broadcast_shapes(*shapes)
    operands = [broadcast_to(v, shape) if isinstance(v, Tensor) and v.shape not in (shape, ()) else v
                for v in values]
    out = bind(primitive, *operands)
    out._weak = weak and keep_weak
    return out
