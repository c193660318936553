"""Elementwise float32 kernels written on ``<16 x float>`` vectors (the CPU's plain loops, vectorised by
the renderer instead of LLVM).

A one-axis elementwise kernel (the scheduler flattens contiguous elementwise kernels to one axis) whose
outputs are float32 and computed from float32 loads contiguous along that axis, with arithmetic,
``sqrt``, ``abs``, ``max``/``min``, comparisons and selects (``render_tile._vector_expression``: what
a register tile's epilogue renders on vectors), is rendered as one loop over whole vectors and one
masked vector for the rest of the launch's range. Whatever does not move with the loop (an Adam
step's bias corrections ``1 - b1 ** t``, a learning rate read from memory) is computed once, before
the loop, and broadcast.

Such a kernel leaves nothing for LLVM's loop vectoriser or LICM, so it compiles with SROA alone
(``cpu_compiler.PIPELINES[5]``, chosen by ``cpu_pipeline.optimization_level``): an Adam update took
12-13 ms of LLVM at O1 or O3 and takes about 3 ms so. Every value is computed by the same IEEE
operation as in the scalar loops, so the results are the same bits. The source does not depend on the
kernel's length (the launch's range is its arguments): one update of weights of any shape is one
compile.
"""

from __future__ import annotations

import numpy as np

from funcgrad.lower.kernel import Kernel, KExpr
from funcgrad.lower.render_loops import _FunctionBuilder
from funcgrad.lower.render_tile import LANES, _varies, _vector_expression, lane_mask, store_vector, vector_operand

__all__ = ["vector_elementwise", "render_vector", "VECTOR_MIN_ELEMENTS"]

FLOAT32 = np.dtype(np.float32)
# shorter kernels keep their scalar loop, which compiles as fast without optimisation (the CPU's
# cpu_pipeline.SMALL_KERNEL_WORK)
VECTOR_MIN_ELEMENTS = 1 << 12
LOOP = "g0"  # the kernel's one loop variable, at the first lane of the vector


def vector_elementwise(kernel: Kernel) -> bool:
    """Whether ``render_vector`` renders ``kernel``: one axis of at least VECTOR_MIN_ELEMENTS, no
    reduction, no opts but ``thread``, and float32 outputs that ``vector_operand`` computes along it."""
    if kernel.reduce_expr is not None or len(kernel.shape) != 1 or kernel.shape[0] < VECTOR_MIN_ELEMENTS:
        return False
    if any(opt.action != "thread" for opt in kernel.opts or ()):
        return False
    memo: dict[KExpr, bool] = {}
    return all(aval.dtype == FLOAT32 and e.dtype == FLOAT32 and _vector_expression(e, LOOP, memo)
               for e, aval in zip(kernel.outputs, kernel.out_avals))


def _invariants(e: KExpr, found: dict[KExpr, None], memo: dict[KExpr, bool]) -> None:
    """The largest parts of ``e`` that do not move with the loop (in the order they are first met),
    constants too: each is broadcast before the loop, where both the loop and the rest may use it."""
    if not _varies(e, LOOP, memo):
        found.setdefault(e)
        return
    if e.op == "load":
        return  # (its index moves with the loop)
    for a in e.args:
        _invariants(a, found, memo)


def render_vector(b: _FunctionBuilder, kernel: Kernel) -> None:
    """Emit the body of ``kernel`` (``vector_elementwise``) into ``b``: the loop over whole vectors
    from ``%start``, then one masked vector up to ``%end``."""
    b.emit(f"%{LOOP}.addr = alloca i64")
    broadcasts: dict[str, str] = {}
    invariants: dict[KExpr, None] = {}
    memo: dict[KExpr, bool] = {}
    for e in kernel.outputs:
        _invariants(e, invariants, memo)
    for e in invariants:  # computed here, before the loop, and only used in it
        vector_operand(b, e, LOOP, None, {}, broadcasts)
    before_loop = dict(b.cache)
    last = b.instantiate(f"{{out}} = sub i64 %end, {LANES - 1}")  # the last start of a whole vector, + 1
    b.open_loop(LOOP, "%start", last)
    _store(b, kernel, None, broadcasts)
    b.close_loop(LOOP, step=LANES)
    b.cache = dict(before_loop)  # what the loop computed does not reach past it
    rest = b.instantiate(f"{{out}} = load i64, ptr %{LOOP}.addr")
    b.var_names[LOOP] = rest[1:]
    left = b.instantiate("{out} = sub i64 %end, {x}", x=rest)
    mask = lane_mask(b, left)
    _store(b, kernel, mask, broadcasts)  # (an empty rest stores nothing: every lane is masked off)
    del b.var_names[LOOP]


def _store(b: _FunctionBuilder, kernel: Kernel, mask: str | None, broadcasts: dict[str, str]) -> None:
    """Every output at the 16 positions from the loop variable (those ``mask`` keeps)."""
    cache: dict[tuple[KExpr, bool], str] = {}
    position = f"%{b.var_names.get(LOOP, LOOP)}"
    for number, e in enumerate(kernel.outputs):
        value = vector_operand(b, e, LOOP, mask, cache, broadcasts)
        pointer = b.instantiate("{out} = getelementptr inbounds float, ptr %out{n}, i64 {i}", n=number, i=position)
        store_vector(b, value, pointer, mask)
