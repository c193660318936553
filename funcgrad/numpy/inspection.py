"""What the Array API standard calls inspection and data-type functions: ``__array_namespace_info__``,
``can_cast``, ``finfo``/``iinfo``.

``finfo`` and ``iinfo`` return NumPy's facts with Python numbers (the standard wants ``float``/``int``,
NumPy gives NumPy scalars).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor
from funcgrad.ir import dtypes

_KINDS: dict[str, tuple[str, ...]] = {
    "bool": ("bool",), "signed integer": ("int8", "int16", "int32", "int64"),
    "unsigned integer": ("uint8", "uint16", "uint32", "uint64"), "real floating": ("float32", "float64"),
    "complex floating": ("complex64", "complex128"),
}
_KINDS["integral"] = _KINDS["signed integer"] + _KINDS["unsigned integer"]
_KINDS["numeric"] = _KINDS["integral"] + _KINDS["real floating"] + _KINDS["complex floating"]


def _dtype_named(name: str) -> np.dtype | None:
    """The dtype called ``name`` if funcgrad has it (complex ones arrive with complex support)."""
    found = getattr(dtypes, "bool_" if name == "bool" else name, None)
    return found if isinstance(found, np.dtype) else None


class Info:
    """The standard's inspection namespace (``fnp.__array_namespace_info__()``)."""

    def capabilities(self) -> dict[str, Any]:
        """Boolean-mask indexing and data-dependent shapes (``nonzero``, ``unique``) work outside
        ``jit``, so both are reported; no limit on the number of dimensions."""
        return {"boolean indexing": True, "data-dependent shapes": True, "max dimensions": None}

    def default_device(self) -> str:
        from funcgrad.devices import Device
        return Device.DEFAULT

    def devices(self) -> list[str]:
        """The devices this machine can run (a list, as the standard 2024.12 says)."""
        from funcgrad.devices import available_devices
        return list(available_devices())

    def default_dtypes(self, *, device: str | None = None) -> dict[str, np.dtype]:
        out: dict[str, np.dtype] = {"real floating": dtypes.default_float, "integral": dtypes.default_int,
               "indexing": dtypes.default_int}
        complex64 = _dtype_named("complex64")
        if complex64 is not None:
            out["complex floating"] = complex64
        return out

    def dtypes(self, *, device: str | None = None, kind: str | tuple[str, ...] | None = None) -> dict[str, np.dtype]:
        """The supported dtypes by name, of one kind, of several (a tuple) or all (None)."""
        if kind is None:
            kinds: tuple[str, ...] = ("bool", "numeric")
        elif isinstance(kind, str):
            kinds = (kind,)
        else:
            kinds = tuple(kind)
        names: list[str] = []
        for k in kinds:
            if k not in _KINDS:
                raise ValueError(f"__array_namespace_info__().dtypes: unknown kind {k!r}; the kinds are "
                                 f"{', '.join(_KINDS)}")
            names += [n for n in _KINDS[k] if n not in names and _dtype_named(n) is not None]
        return {name: _dtype_named(name) for name in names}  # type: ignore[misc]


def __array_namespace_info__() -> Info:  # noqa: N807 - the standard's name
    """The standard's inspection namespace. >>> __array_namespace_info__().default_dtypes()['integral']"""
    return Info()


def _dtype_of(x: Any) -> np.dtype:
    return x.dtype if isinstance(x, Tensor) else dtypes.canonicalize(x)


def can_cast(from_: Any, to: Any, /, casting: str = "safe") -> bool:
    """Whether values of dtype ``from_`` (a dtype or an array) convert to ``to`` under NumPy's
    ``casting`` rule ('safe' by default, as ``jax.numpy.can_cast``).

    >>> can_cast(dtypes.int8, dtypes.int16), can_cast(dtypes.int16, dtypes.int8)
    (True, False)
    """
    source, target = _dtype_of(from_), dtypes.canonicalize(to)
    return bool(np.can_cast(source, target, casting=casting))  # type: ignore[arg-type]


class finfo:  # noqa: N801 - NumPy's name
    """Machine limits of a float dtype (or of an array's), as Python floats: ``bits``, ``eps``,
    ``max``, ``min``, ``smallest_normal``, ``tiny``, ``resolution``, ``dtype``.

    >>> finfo(dtypes.float32).bits
    32
    """

    def __init__(self, dtype: Any) -> None:
        facts = dtypes.finfo(_dtype_of(dtype))
        self.bits: int = int(facts.bits)
        self.eps, self.max, self.min = float(facts.eps), float(facts.max), float(facts.min)
        self.smallest_normal = float(facts.smallest_normal)
        self.tiny, self.resolution = self.smallest_normal, float(facts.resolution)
        self.dtype: np.dtype = np.dtype(facts.dtype)

    def __repr__(self) -> str:
        return (f"finfo(bits={self.bits}, eps={self.eps}, max={self.max}, min={self.min}, "
                f"smallest_normal={self.smallest_normal}, dtype={self.dtype.name})")


class iinfo:  # noqa: N801 - NumPy's name
    """Limits of an integer dtype (or of an array's) as Python ints: ``bits``, ``max``, ``min``, ``dtype``.

    >>> iinfo(dtypes.int8).max
    127
    """

    def __init__(self, dtype: Any) -> None:
        facts = dtypes.iinfo(_dtype_of(dtype))
        self.bits, self.max, self.min = int(facts.bits), int(facts.max), int(facts.min)
        self.dtype: np.dtype = np.dtype(facts.dtype)

    def __repr__(self) -> str:
        return f"iinfo(bits={self.bits}, max={self.max}, min={self.min}, dtype={self.dtype.name})"


__all__ = ["__array_namespace_info__", "can_cast", "finfo", "iinfo"]
