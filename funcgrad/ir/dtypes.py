"""Data types and JAX-style type promotion.

funcgrad's dtypes are NumPy dtype objects (``np.dtype``), with bfloat16 from ml_dtypes, so every
layer can hand them to NumPy unchanged. ml_dtypes (~8 MB resident, its extension registers a dozen
types) is imported on the first use of bfloat16 (``dtypes.bfloat16``, ``canonicalize("bfloat16")``,
an ml_dtypes array), not by ``import funcgrad``: until then no value can have that dtype, so the
membership tests below answer without it. Promotion follows JAX's lattice: Python scalars are
*weakly typed* (they adopt the other operand's dtype where the kinds agree), mixed signed and
unsigned integers widen, integers meeting floats give the float, and nothing silently becomes
float64: the default float is float32 and the default integer int32.
"""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any, overload

import numpy as np

bool_ = np.dtype(np.bool_)
int8, int16, int32, int64 = (np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64))
uint8, uint16, uint32, uint64 = (np.dtype(t) for t in (np.uint8, np.uint16, np.uint32, np.uint64))
float16, float32, float64 = (np.dtype(t) for t in (np.float16, np.float32, np.float64))
complex64, complex128 = np.dtype(np.complex64), np.dtype(np.complex128)

default_float = float32
default_int = int32



class LazyModule:
    """A module imported on its first attribute access (``ml_dtypes.finfo`` where bfloat16 is used)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        module: ModuleType = importlib.import_module(self._name)
        return getattr(module, attr)


ml_dtypes: Any = LazyModule("ml_dtypes")

_BFLOAT16: np.dtype | None = None  # made by _bfloat16() on first need
_BFLOAT16_LOCK = threading.Lock()


def _bfloat16() -> np.dtype:
    """ml_dtypes' bfloat16, importing ml_dtypes the first time (and adding it to the promotion lattice)."""
    global _BFLOAT16
    if _BFLOAT16 is None:
        with _BFLOAT16_LOCK:
            if _BFLOAT16 is None:
                bf16 = np.dtype(importlib.import_module("ml_dtypes").bfloat16)
                _EDGES[_WEAK_FLOAT] = (bf16, *_EDGES[_WEAK_FLOAT])
                _EDGES[bf16] = (float32,)
                _upper_set.cache_clear()  # f*'s upper sets gain bfloat16; joins not involving it are unchanged
                _join.cache_clear()
                _NAMES[bf16.name] = bf16
                _BFLOAT16 = bf16
    return _BFLOAT16


def _is_bfloat16(value: Any) -> bool:
    """``value == bfloat16`` without importing ml_dtypes where no value can be bfloat16 yet (only the
    name "bfloat16" or an object of ml_dtypes, which is then imported, can equal it)."""
    if _BFLOAT16 is None and "ml_dtypes" not in sys.modules and not (isinstance(value, str) and value == "bfloat16"):
        return False
    return bool(_bfloat16() == value)


is_bfloat16 = _is_bfloat16


def __getattr__(name: str) -> Any:  # PEP 562: dtypes.bfloat16 imports ml_dtypes on first access
    if name == "bfloat16":
        return _bfloat16()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class DtypeTuple(Sequence[np.dtype]):
    """A tuple of dtypes that may hold bfloat16 (written as the string "bfloat16"): ``in`` answers as a
    tuple's would, importing ml_dtypes only when the value could be bfloat16; iterating or indexing
    makes the bfloat16 dtype."""

    def __init__(self, *items: np.dtype | str) -> None:
        self._items = items
        self._eager = tuple(d for d in items if not isinstance(d, str))
        self._lazy = len(self._eager) != len(items)

    def _all(self) -> tuple[np.dtype, ...]:
        return tuple(_bfloat16() if isinstance(d, str) else d for d in self._items)

    def __contains__(self, value: object) -> bool:
        return value in self._eager or (self._lazy and _is_bfloat16(value))

    def __iter__(self) -> Iterator[np.dtype]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._items)

    @overload
    def __getitem__(self, index: int) -> np.dtype: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[np.dtype, ...]: ...
    def __getitem__(self, index: int | slice) -> np.dtype | tuple[np.dtype, ...]:
        return self._all()[index]

    def __eq__(self, other: object) -> bool:
        return self._all() == (other._all() if isinstance(other, DtypeTuple) else other)

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return repr(self._all())


ALL_DTYPES = DtypeTuple(bool_, int8, int16, int32, int64, uint8, uint16, uint32, uint64, "bfloat16", float16, float32,
                        float64, complex64, complex128)
# the dtypes kernels compute in: complex equations run as host steps (lower/schedule.py: kind_of), so no
# renderer sees them
KERNEL_DTYPES = DtypeTuple(*(dt for dt in ALL_DTYPES._items if isinstance(dt, str) or dt.kind != "c"))
LOW_PRECISION = DtypeTuple(float16, "bfloat16")  # 16-bit floats, computed in float32
_FLOATS = (float16, float32, float64)
_SUPPORTED_NAMES = ", ".join(dt if isinstance(dt, str) else dt.name for dt in ALL_DTYPES._items)
_NAMES = {dt.name: dt for dt in ALL_DTYPES._eager}
_NAMES.update({"bool": bool_, "float": float32, "int": int32, "complex": complex64})


def canonicalize(dtype: Any) -> np.dtype:
    """Turn anything dtype-like (``np.float32``, ``"int32"``, ``float``, a dtype) into a funcgrad dtype.

    Raises ``TypeError`` for dtypes funcgrad does not support (strings, objects, longdouble).
    >>> canonicalize("float32")
    dtype('float32')
    """
    if isinstance(dtype, str) and dtype in _NAMES:
        return _NAMES[dtype]
    if isinstance(dtype, str) and dtype == "bfloat16":
        return _bfloat16()
    if dtype is float:
        return default_float
    if dtype is int:
        return default_int
    if dtype is bool:
        return bool_
    if dtype is complex:
        return complex64
    try:
        result = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{dtype!r} is not a dtype funcgrad understands; use one of {_SUPPORTED_NAMES}") from None
    if result not in ALL_DTYPES:
        raise TypeError(f"dtype {result.name} is not supported by funcgrad; supported: {_SUPPORTED_NAMES}")
    return result


def is_float(dtype: np.dtype) -> bool:
    return dtype in _FLOATS or _is_bfloat16(dtype)


def is_complex(dtype: np.dtype) -> bool:
    return dtype in (complex64, complex128)


def is_inexact(dtype: np.dtype) -> bool:
    """Floating or complex (NumPy's ``np.inexact``)."""
    return is_float(dtype) or is_complex(dtype)


def real_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype of a complex dtype's real and imaginary parts (float32 for complex64); others unchanged."""
    return float32 if dtype == complex64 else float64 if dtype == complex128 else dtype


def complex_dtype(dtype: np.dtype) -> np.dtype:
    """The complex dtype holding pairs of ``dtype`` (complex128 for float64, else complex64)."""
    if is_complex(dtype):
        return dtype
    return complex128 if dtype == float64 else complex64


def is_int(dtype: np.dtype) -> bool:
    return dtype.kind in "iu"


def is_unsigned(dtype: np.dtype) -> bool:
    return dtype.kind == "u"


def is_bool(dtype: np.dtype) -> bool:
    return dtype == bool_


def kind_name(dtype: np.dtype) -> str:
    """'bool', 'integer', 'floating' or 'complex', for error messages."""
    return ("bool" if is_bool(dtype) else "integer" if is_int(dtype) else "complex" if is_complex(dtype)
            else "floating")


def finfo(dtype: Any) -> Any:
    """Machine limits of a floating dtype (``eps``, ``max``, ``tiny``, ...), bfloat16 included.

    >>> float(finfo('float16').max)
    65504.0
    """
    dtype = canonicalize(dtype)  # complex: NumPy's finfo describes the parts (float32 for complex64)
    return ml_dtypes.finfo(dtype) if _is_bfloat16(dtype) else np.finfo(dtype)


def iinfo(dtype: Any) -> np.iinfo:
    """The range of an integer dtype (``min``, ``max``, ``bits``).

    >>> iinfo('int8').max
    127
    """
    return np.iinfo(canonicalize(dtype))


# --- promotion lattice -------------------------------------------------------------------------
# Nodes are dtypes plus the three weak kinds "i*" (a Python int), "f*" (a Python float) and "c*" (a
# Python complex), as in JAX. An edge a -> b means b can represent every value of a (up to rounding).
_WEAK_INT, _WEAK_FLOAT, _WEAK_COMPLEX = "i*", "f*", "c*"
_EDGES: dict[Any, tuple[Any, ...]] = {
    bool_: (_WEAK_INT,),
    _WEAK_INT: (uint8, int8),
    uint8: (int16, uint16), uint16: (int32, uint32), uint32: (int64, uint64), uint64: (_WEAK_FLOAT,),
    int8: (int16,), int16: (int32,), int32: (int64,), int64: (_WEAK_FLOAT,),
    _WEAK_FLOAT: (float16, _WEAK_COMPLEX),  # and bfloat16 (-> float32), added when it is first made
    float16: (float32,), float32: (float64, complex64), float64: (complex128,),
    _WEAK_COMPLEX: (complex64,), complex64: (complex128,), complex128: (),
}


@functools.cache
def _upper_set(node: Any) -> frozenset:
    """Every node reachable from ``node`` (including itself)."""
    seen = {node}
    for parent in _EDGES[node]:
        seen |= _upper_set(parent)
    return frozenset(seen)


def _lattice_node(dtype: np.dtype, weak: bool) -> Any:
    if weak and is_int(dtype):
        return _WEAK_INT
    if weak and is_float(dtype):
        return _WEAK_FLOAT
    if weak and is_complex(dtype):
        return _WEAK_COMPLEX
    return dtype


@functools.cache
def _join(a: Any, b: Any) -> Any:
    common = _upper_set(a) & _upper_set(b)
    # the least upper bound is the one common node whose upper set contains all the others
    for node in common:
        if _upper_set(node) >= common:
            return node
    raise AssertionError(f"promotion lattice has no join for {a} and {b}")


def result_type(*dtypes_and_weak: tuple[np.dtype, bool]) -> tuple[np.dtype, bool]:
    """Promote ``(dtype, is_weak)`` pairs the way JAX does; returns ``(dtype, is_weak)``.

    >>> result_type((int32, False), (float32, True))   # int32 array + Python float
    (dtype('float32'), True)
    >>> result_type((uint8, False), (int8, False))
    (dtype('int16'), False)
    """
    if not dtypes_and_weak:
        raise ValueError("result_type needs at least one dtype")
    node = _lattice_node(*dtypes_and_weak[0])
    for dtype, weak in dtypes_and_weak[1:]:
        node = _join(node, _lattice_node(dtype, weak))
    # the result is weakly typed exactly when the join is one of the weak nodes
    if node == _WEAK_INT:
        # i* stands for "the other operand's integer width": pick the widest concrete int seen
        return max((d for d, _ in dtypes_and_weak if is_int(d)), key=lambda d: d.itemsize), True
    if node == _WEAK_FLOAT:
        floats = [d for d, _ in dtypes_and_weak if is_float(d)]
        return (max(floats, key=lambda d: d.itemsize) if floats else default_float), True
    if node == _WEAK_COMPLEX:
        # the complex dtype of the widest float or complex operand: float64 + 1j is complex128
        widest = max((real_dtype(d) for d, _ in dtypes_and_weak if is_inexact(d)), key=lambda d: d.itemsize,
                     default=default_float)
        return complex_dtype(widest), True
    return node, False


def python_scalar_dtype(value: Any) -> np.dtype:
    """The dtype a Python scalar takes before promotion (weakly typed except bool)."""
    if isinstance(value, (bool, np.bool_)):
        return bool_
    if isinstance(value, (int, np.integer)):
        return default_int
    if isinstance(value, (float, np.floating)):
        return default_float
    if isinstance(value, (complex, np.complexfloating)):
        return complex64
    raise TypeError(f"{type(value).__name__} {value!r} is not a supported scalar "
                    "(funcgrad supports bool, int, float and complex)")
