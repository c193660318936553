"""funcgrad.numpy: a jax.numpy-like function surface following the Array API standard (2023.12).

Import it as ``fnp``. Every function accepts Tensors, NumPy arrays and Python scalars, works the
same eagerly (lazily evaluated) and inside traces, and is built on the primitives of
``funcgrad.ir.primitives``. The submodules group the functions as the standard does.

>>> import funcgrad.numpy as fnp
>>> fnp.sum(fnp.arange(4) * 2.0).item()
12.0
"""

from funcgrad.ir.dtypes import (
    bfloat16, bool_, finfo, float16, float32, float64, iinfo, int8, int16, int32, int64, uint8, uint16,
    uint32, uint64,
)
from funcgrad.ir.dtypes import bool_ as bool  # noqa: A001 - the Array API name
from funcgrad.numpy.conversion import (
    asarray, astype, broadcast_arrays, broadcast_shapes, broadcast_to, result_type,
)
from funcgrad.numpy.creation import *  # noqa: F403
from funcgrad.numpy.elementwise import *  # noqa: F403
from funcgrad.numpy.indexing import *  # noqa: F403
from funcgrad.numpy.linalg import *  # noqa: F403
from funcgrad.numpy.manipulation import *  # noqa: F403
from funcgrad.numpy.reductions import *  # noqa: F403
from funcgrad.numpy.searching import *  # noqa: F403
from funcgrad.tensor import Array, Tensor

array = asarray
e, pi, inf, nan, newaxis = 2.718281828459045, 3.141592653589793, float("inf"), float("nan"), None


def isdtype(dtype, kind):  # type: ignore[no-untyped-def]
    """The Array API's dtype classification: kind is a dtype, a kind name, or a tuple of them."""
    from funcgrad.ir import dtypes as _dt
    if isinstance(kind, tuple):
        return any(isdtype(dtype, k) for k in kind)
    dtype = _dt.canonicalize(dtype)
    if not isinstance(kind, str):
        return dtype == _dt.canonicalize(kind)
    checks = {
        "bool": _dt.is_bool, "signed integer": lambda d: d.kind == "i",
        "unsigned integer": _dt.is_unsigned, "integral": _dt.is_int,
        "real floating": _dt.is_float, "complex floating": lambda d: False,
        "numeric": lambda d: not _dt.is_bool(d),
    }
    if kind not in checks:
        raise ValueError(f"unknown dtype kind {kind!r}; expected one of {sorted(checks)}")
    return checks[kind](dtype)
