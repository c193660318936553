"""Render ``Kernel``s as CUDA C: the CUDA dialect of the C-family renderer (funcgrad/lower/render_c.py).

Everything but the dialect points is shared with OpenCL C: the same expressions, integer and float
helpers, reductions (a thread per output, or a block per output with a shared-memory tree for long
reductions) and the same semantics. What CUDA changes:

* kernels are ``extern "C" __global__`` (unmangled names for ``cuModuleGetFunction``), helpers
  ``__device__``, pointers ``__restrict__``; thread indices come from ``blockIdx``/``threadIdx``;
  local memory is ``__shared__`` and the barrier ``__syncthreads()``;
* OpenCL's short type names (uchar, ushort, uint, ulong) are typedefs in the preamble, and int8 is
  ``schar`` (``signed char``: plain char's signedness is the platform's);
* float32 math calls the ``f``-suffixed functions (``sinf``, ``expm1f``, ...); float -> integer
  conversions saturate and send NaN to 0 in a helper; bit casts use ``__float_as_int`` & co.;
* float16 and bfloat16 use the base renderer's integer conversions (no ``cuda_fp16.h``), so CUDA and
  OpenCL round identically on every architecture; float64 -> float16 truncates with
  ``__double2float_rz`` before its single rounding.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.lower.kernel import Kernel
from funcgrad.lower.render_c import MATH, CRenderer, kind_of, render_program

__all__ = ["CUDARenderer", "render_cuda", "PREAMBLE"]

PREAMBLE = """typedef signed char schar;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;"""

# float -> integer: truncate toward zero, saturate to the target's range, NaN -> 0 (the reference);
# {lo} and {limit} (2^bits or 2^(bits-1), the first value past the maximum) are exact in {F}
FLOAT_TO_INT = ("{T} fg_{F}_to_{T}({F} x) {{ return isnan(x) ? ({T})0 : x <= ({F}){lo} ? ({T}){lo_int} : "
                "x >= ({F}){limit} ? ({T}){hi_int} : ({T})x; }}")


class CUDARenderer(CRenderer):
    """CUDA C (see the module docstring)."""

    dialect = "CUDA C"
    TYPES = {**CRenderer.TYPES, "int8": "schar"}
    kernel_qualifier = 'extern "C" __global__'
    global_qualifier = ""
    local_qualifier = "__shared__"
    barrier = "__syncthreads();"
    helper_qualifier = "__device__"

    def global_id(self) -> str:
        return "((long)blockIdx.x * blockDim.x + threadIdx.x)"

    def local_id(self) -> str:
        return "threadIdx.x"

    def group_id(self) -> str:
        return "blockIdx.x"

    def signature(self, name: str, parameters: list[str], group_size: int | None) -> str:
        bounds = f"__launch_bounds__({group_size}) " if group_size else ""
        return f"{self.kernel_qualifier} void {bounds}{name}({', '.join(parameters)})"

    def pointer(self, dtype: np.dtype, name: str, const: bool) -> str:
        return f"{'const ' if const else ''}{self.storage_type(dtype)}* __restrict__ {name}"

    def local_array(self, type_name: str, name: str, size: int) -> str:
        return f"__shared__ {type_name} {name}[{size}];"

    def preamble(self) -> list[str]:
        return [PREAMBLE]

    def constant(self, value: Any, dtype: np.dtype) -> str:
        dtype = np.dtype(dtype)
        if kind_of(dtype) in "fh":
            number = float(np.asarray(value, dtype).astype(np.float64))
            if not np.isfinite(number):  # no NAN/INFINITY macros needed
                if dtype.name == "float64":
                    bits = int(np.asarray(number, np.float64).view(np.int64))
                    return f"__longlong_as_double({bits}ll)"
                bits = int(np.asarray(number, np.float32).view(np.int32))
                return f"__int_as_float({bits})"
        return super().constant(value, dtype)

    def math_function(self, op: str, dtype: np.dtype) -> str:
        return MATH[op] + ("f" if np.dtype(dtype).name == "float32" else "")

    def convert(self, x: str, source: np.dtype, target: np.dtype) -> str:
        to_type = self.value_type(target)
        if kind_of(source) == "f" and kind_of(target) in "su":
            from_type = self.value_type(source)
            info = np.iinfo(target)
            lo = "0" if info.min == 0 else f"-{2.0 ** (8 * target.itemsize - 1)!r}"
            limit = f"{2.0 ** (8 * target.itemsize - (info.min != 0))!r}"
            helper = FLOAT_TO_INT.format(T=to_type, F=from_type, lo=lo, limit=limit,
                                         lo_int=f"({info.min + 1}ll - 1)" if info.min else "0",
                                         hi_int=f"{info.max}ull" if info.max >= 2**63 else f"{info.max}ll")
            self.helper(f"{from_type}_to_{to_type}", helper)
            return f"fg_{from_type}_to_{to_type}({x})"
        return f"({to_type})({x})"  # C's int -> float conversion rounds to nearest even

    def reinterpret(self, x: str, source: np.dtype, target: np.dtype) -> str:
        to_type = self.value_type(target)
        wide = np.dtype(source).itemsize == 8
        if kind_of(source) == "f":
            return f"({to_type})({'__double_as_longlong' if wide else '__float_as_int'}({x}))"
        if kind_of(target) == "f":
            return f"__longlong_as_double((long long)({x}))" if wide else f"__int_as_float((int)({x}))"
        return f"({to_type})({x})"

    def double_to_float_toward_zero(self, x: str) -> str:
        return f"__double2float_rz({x})"


def render_cuda(kernels: Sequence[Kernel], names: Sequence[str] | None = None) -> tuple[str, list[int | None]]:
    """One CUDA C translation unit holding every kernel (helpers once), and each kernel's block size
    for a shared-memory reduction (None: any size).

    >>> source, blocks = render_cuda([kernel])  # doctest: +SKIP
    """
    return render_program(kernels, names, CUDARenderer)
