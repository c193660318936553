"""Sibling fusion: elementwise kernels over the same elements, one after another, become one kernel.

The scheduler makes one kernel per stored value. An optimiser step stores three values per
parameter (Adam's first moment, second moment and the parameter), each read back by the next:
three passes over memory that read the gradient twice and the new moments once more. Merging them
reads every array once and writes each result once (7 array passes instead of 10 for Adam), and
launches one kernel instead of three.

``fuse_siblings(steps)`` walks the steps in order and merges a kernel step B into an earlier one A
when both are elementwise (no reduction) over the same loop shape, B shares an input with A or
reads an output of A, every other input of B already exists where A runs, and B reads A's outputs
element for element (the same position), so B's loads of them become A's expressions for them. B
moves up to A's place, which is safe because every buffer is written once. The merged kernel keeps
every output of both (they are stored as before). Plans ask for it where the device's renderer
takes multi-output kernels cheaply (``CPUDevice.fuse_siblings``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from funcgrad.lower import kernel as K
from funcgrad.lower.kernel import KExpr, with_args
from funcgrad.lower.schedule import KernelStep, Step

__all__ = ["fuse_siblings", "MAX_BUFFERS", "LOOKBACK"]

MAX_BUFFERS = 12  # inputs + outputs of a merged kernel (function arguments; registers for their addresses)
LOOKBACK = 8  # earlier steps searched for a sibling


def _elementwise(step: Step) -> bool:
    return isinstance(step, KernelStep) and step.kernel.reduce_op is None and not step.kernel.reduce_shape


def _identity(index: KExpr, shape: Sequence[int]) -> bool:
    """Whether ``index`` is the row-major position of the loop variables in ``shape``."""
    def terms(e: KExpr) -> dict[KExpr | None, int] | None:
        found = K._affine(e)
        return None if found is None else {atom: coef for atom, coef in found.items() if coef}
    return terms(index) == terms(K.flat_index([K.var(f"g{axis}") for axis in range(len(shape))], shape))


def _substitute(e: KExpr, loads: dict[int, KExpr | int], shape: Sequence[int],
                memo: dict[KExpr, KExpr]) -> KExpr | None:
    """``e`` with each load renumbered (``loads``: old number -> new number) or replaced by an
    expression (old number -> KExpr, only where the load reads the same position); None if a
    replaced buffer is read elsewhere than at the same position."""
    if e in memo:
        return memo[e]
    if e.op == "load":
        target = loads[e.arg]
        if isinstance(target, KExpr):
            if not _identity(e.args[0], shape):
                return None
            memo[e] = target
            return target
        index = _substitute(e.args[0], loads, shape, memo)
        if index is None:
            return None
        out: KExpr | None = KExpr("load", e.dtype, (index,), target)
    else:
        args = []
        for a in e.args:
            new = _substitute(a, loads, shape, memo)
            if new is None:
                return None
            args.append(new)
        out = with_args(e, tuple(args))
    memo[e] = out  # type: ignore[assignment]
    return out


def _merge(a: KernelStep, b: KernelStep) -> KernelStep | None:
    """``b`` merged into ``a`` (see the module docstring), or None when it cannot be."""
    ka, kb = a.kernel, b.kernel
    if ka.shape != kb.shape:
        return None
    produced = {var.id: number for number, var in enumerate(a.outputs)}
    inputs = list(a.inputs)
    position = {var.id: number for number, var in enumerate(inputs)}
    in_avals = list(ka.in_avals)
    loads: dict[int, KExpr | int] = {}
    shared = False
    for number, var in enumerate(b.inputs):
        if var.id in produced:
            loads[number] = ka.outputs[produced[var.id]]
            shared = True
        elif var.id in position:
            loads[number] = position[var.id]
            shared = True
        else:
            position[var.id] = loads[number] = len(inputs)
            inputs.append(var)
            in_avals.append(kb.in_avals[number])
    if not shared or len(inputs) + len(a.outputs) + len(b.outputs) > MAX_BUFFERS:
        return None
    memo: dict[KExpr, KExpr] = {}
    outputs = []
    for expr in kb.outputs:
        new = _substitute(expr, loads, kb.shape, memo)
        if new is None:
            return None
        outputs.append(new)
    merged = K.Kernel(name=ka.name, shape=ka.shape, in_avals=tuple(in_avals), out_avals=ka.out_avals + kb.out_avals,
                      outputs=ka.outputs + tuple(outputs))
    return KernelStep(merged, tuple(inputs), a.outputs + b.outputs)


def fuse_siblings(steps: Sequence[Step]) -> list[Step]:
    """``steps`` with sibling elementwise kernels merged (see the module docstring)."""
    out: list[Step] = []
    made_at: dict[int, int] = {}  # buffer id -> index in ``out`` of the step that writes it
    for step in steps:
        placed = False
        if _elementwise(step) and int(np.prod(step.kernel.shape)) > 1:  # type: ignore[union-attr]
            assert isinstance(step, KernelStep)
            for at in range(len(out) - 1, max(-1, len(out) - 1 - LOOKBACK), -1):
                earlier = out[at]
                if not _elementwise(earlier):
                    continue
                assert isinstance(earlier, KernelStep)
                written = {var.id for var in earlier.outputs}
                # every other input of ``step`` must exist where ``earlier`` runs
                if any(made_at.get(var.id, -1) >= at and var.id not in written for var in step.inputs):
                    continue
                merged = _merge(earlier, step)
                if merged is None:
                    continue
                out[at] = merged
                for var in step.outputs:
                    made_at[var.id] = at
                placed = True
                break
        if not placed:
            out.append(step)
            for var in (step.outputs if isinstance(step, KernelStep) else step.eqn.outputs):
                made_at[var.id] = len(out) - 1
    return out
