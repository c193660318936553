"""Long reductions in two stages, for devices that cap the loop iterations of one kernel invocation.

Mesa's software rasterisers (llvmpipe and lavapipe: WebGPU here) stop any shader loop after 65,535
iterations to keep a runaway shader from hanging the machine, silently: a sum over 294,912 values
(BatchNorm's statistics at batch 512) came out as the sum of its first ~65,300. A device with
``max_reduction`` set gets its plans' IR rewritten first: a ``reduce_sum/prod/max/min`` over more
values than that becomes

    transpose (kept axes first) -> reshape (kept..., n) -> pad n to chunks * chunk with the identity
    -> reshape (kept..., chunks, chunk) -> reduce the last axis -> ... (again while chunks > limit)
    -> reduce the last axis

so each kernel's loop runs at most ``max_reduction`` times (the transpose and reshapes are index
arithmetic in the first kernel's loads, not copies). The result is the same reduction in another
order (a float sum in two levels is, if anything, more accurate).
"""

from __future__ import annotations

import math

import numpy as np

from funcgrad.ir import primitives as P
from funcgrad.ir.core import IR, Literal, Var
from funcgrad.lower.conv import _Builder

__all__ = ["split_long_reductions"]

_SPLITTABLE = {P.reduce_sum_p: lambda dtype: 0, P.reduce_prod_p: lambda dtype: 1,
               P.reduce_max_p: lambda dtype: P._lowest(dtype), P.reduce_min_p: lambda dtype: P._highest(dtype)}


def split_long_reductions(ir: IR, limit: int) -> IR:
    """``ir`` with every splittable reduction over more than ``limit`` values done in two stages."""
    def too_long(eqn: object) -> bool:
        if getattr(eqn, "primitive", None) not in _SPLITTABLE:
            return False
        if eqn.inputs[0].aval.dtype != eqn.outputs[0].aval.dtype:  # type: ignore[attr-defined]
            return False  # (a reduction that changes the dtype is not re-applied to its own result)
        shape = eqn.inputs[0].aval.shape  # type: ignore[attr-defined]
        return math.prod(shape[a] for a in eqn.param_dict["axes"]) > limit  # type: ignore[attr-defined]

    if not any(too_long(eqn) for eqn in ir.eqns):
        return ir
    b = _Builder()
    for eqn in ir.eqns:
        if too_long(eqn):
            _split(b, eqn, limit)
        else:
            b.eqns.append(eqn)
    return IR(ir.in_vars, b.eqns, ir.outputs, ir.const_vars, ir.consts)


def _split(b: _Builder, eqn: object, limit: int) -> None:
    primitive = eqn.primitive  # type: ignore[attr-defined]
    x: Var = eqn.inputs[0]  # type: ignore[attr-defined]
    out: Var = eqn.outputs[0]  # type: ignore[attr-defined]
    axes = tuple(sorted(eqn.param_dict["axes"]))  # type: ignore[attr-defined]
    shape = x.aval.shape
    kept = [a for a in range(len(shape)) if a not in axes]
    kept_shape = tuple(shape[a] for a in kept)
    total = math.prod(shape[a] for a in axes)
    value = b.reshape(b.transpose(x, kept + list(axes)), kept_shape + (total,))
    count = total
    while count > limit:  # stages of at most ``limit`` values until what is left fits in one
        chunks = -(-count // limit)
        chunk = -(-count // chunks)
        if chunks * chunk > count:  # pad with the reduction's identity
            identity = Literal.of(np.dtype(x.aval.dtype).type(_SPLITTABLE[primitive](np.dtype(x.aval.dtype))))
            lows, highs = [0] * (len(kept) + 1), [0] * len(kept) + [chunks * chunk - count]
            value = b.bind(P.pad_p, value, identity, low=tuple(lows), high=tuple(highs))
        value = b.bind(primitive, b.reshape(value, kept_shape + (chunks, chunk)), axes=(len(kept) + 1,))
        count = chunks
    b.bind(primitive, value, axes=(len(kept),), out=out)
