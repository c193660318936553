"""Render a ``Kernel`` (funcgrad/lower/kernel.py) as LLVM IR text for the CPU device.

``render_llvm`` checks the kernel's opts (``funcgrad.lower.optimize.check_opts``; a kernel without
opts gets ``heuristic_opts``) and renders it with what they choose: a register-tiled micro-kernel
(``render_tile``, a ``tile`` opt), 16 x 16 transposed blocks (``render_transpose``, a ``transpose``
opt), an elementwise float32 loop on explicit vectors (``render_vector``), or plain loop nests
(``render_loops``, which also holds the function builder the others use).
"""

from __future__ import annotations

import attrs

from funcgrad.lower.kernel import Kernel
from funcgrad.lower.optimize import check_opts, heuristic_opts
from funcgrad.lower.render_loops import _FunctionBuilder, _module, begin_kernel, render_loops
from funcgrad.lower.render_tile import render_tile
from funcgrad.lower.render_transpose import render_transpose
from funcgrad.lower.render_vector import render_vector, vector_elementwise

__all__ = ["render_llvm"]


def render_llvm(kernel: Kernel) -> str:
    """The LLVM IR module (text) for ``kernel``; its function is named ``llvm_function_name(kernel)``.

    >>> print(render_llvm(k))  # doctest: +SKIP
    define void @add(ptr noalias %out0, ptr noalias %in0, ptr noalias %in1, i64 %start, i64 %end) #0 { ...

    The loop nest follows ``kernel.opts`` (the optimiser's named actions); a kernel that was never
    optimised gets ``funcgrad.lower.optimize.heuristic_opts``.
    """
    begin_kernel()
    if kernel.opts is None:
        kernel = attrs.evolve(kernel, opts=heuristic_opts(kernel))
    else:
        check_opts(kernel, kernel.opts)
    assert kernel.opts is not None
    if any(opt.action == "tile" for opt in kernel.opts):  # a register-tiled micro-kernel (render_tile.py)
        builder = _FunctionBuilder()
        render_tile(builder, kernel)
        return _module(kernel, builder)
    if any(opt.action == "transpose" for opt in kernel.opts):  # 16 x 16 blocks (render_transpose.py)
        builder = _FunctionBuilder()
        render_transpose(builder, kernel)
        return _module(kernel, builder)
    if vector_elementwise(kernel):  # an elementwise float32 loop on explicit vectors (render_vector.py)
        builder = _FunctionBuilder()
        render_vector(builder, kernel)
        return _module(kernel, builder)
    return render_loops(kernel)
