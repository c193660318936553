"""funcgrad.numpy: a jax.numpy-like function surface following the Array API standard (2024.12).

Import it as ``fnp``. Every function accepts Tensors, NumPy arrays and Python scalars, works the
same eagerly (lazily evaluated) and inside traces, and is built on the primitives of
``funcgrad.ir.primitives``. The submodules group the functions as the standard does.

>>> import funcgrad.numpy as fnp
>>> fnp.sum(fnp.arange(4) * 2.0).item()
12.0
"""

from funcgrad.ir.dtypes import (
    bool_, complex64, complex128, float16, float32, float64, int8, int16, int32, int64, uint8,
    uint16, uint32, uint64,
)
from funcgrad.ir.dtypes import bool_ as bool  # noqa: A001 - the Array API name
from funcgrad.numpy.conversion import (
    asarray, astype, broadcast_arrays, broadcast_shapes, broadcast_to, from_dlpack, isdtype, issubdtype,
    result_type,
)
from funcgrad.numpy.creation import *  # noqa: F403
from funcgrad.numpy.elementwise import *  # noqa: F403
from funcgrad.numpy.indexing import *  # noqa: F403
from funcgrad.numpy.inspection import *  # noqa: F403
from funcgrad.numpy.products import *  # noqa: F403
from funcgrad.numpy.manipulation import *  # noqa: F403
from funcgrad.numpy.reductions import *  # noqa: F403
from funcgrad.numpy.searching import *  # noqa: F403
from funcgrad.numpy import fft  # noqa: E402 - the fft extension, as fnp.fft.fft
from funcgrad.core.tensor import Array, Tensor
from funcgrad.numpy import linalg  # the standard's linalg extension: fnp.linalg.cholesky, ...

array = asarray
__array_api_version__ = "2024.12"  # the standard this namespace implements (as jax.numpy 0.10 declares)
e, pi, inf, nan, newaxis = 2.718281828459045, 3.141592653589793, float("inf"), float("nan"), None


def __getattr__(name: str) -> object:  # fnp.bfloat16: ml_dtypes is imported on first use (funcgrad/ir/dtypes.py)
    if name == "bfloat16":
        from funcgrad.ir import dtypes
        return dtypes.bfloat16
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
