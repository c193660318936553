"""The lowering facts of the primitive registry, and that the lowering layer follows them.

``funcgrad/ir/primitives.py`` holds every fact of a primitive, the lowering ones included: the kernel
op computing an elementwise primitive and its cost class. These tests fail when a renderer cannot
render an elementwise primitive the registry has (on a dtype it supports), when the kernel IR's op
lists are no longer the registry's, or when one of the three "costly op" sets stops being derived
from the cost classes (someone edits it by hand). Rendering only: no device is needed.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from funcgrad.devices import cpu
from funcgrad.ir import dtypes
from funcgrad.ir.core import ShapedArray
from funcgrad.ir.primitives import COST_CLASSES, REGISTRY, Primitive, with_cost
from funcgrad.lower import kernel as K
from funcgrad.lower import render_llvm, render_loops, schedule
from funcgrad.lower.render_c import render_opencl
from funcgrad.lower.render_cuda import render_cuda
from funcgrad.lower.render_wgsl import WGSLDtypeError, render_wgsl

RENDERERS: dict[str, Callable[[K.Kernel], object]] = {
    "llvm": render_llvm.render_llvm,
    "opencl": lambda kernel: render_opencl([kernel]),
    "cuda": lambda kernel: render_cuda([kernel]),
    "wgsl": render_wgsl,
}
WIDE = (dtypes.int64, dtypes.uint64, dtypes.float64)
# (renderer, dtypes, the error it raises, why): every kernel op on these dtypes is refused, with that error
UNSUPPORTED: list[tuple[str, tuple[np.dtype, ...], type[Exception], str]] = [
    ("wgsl", WIDE, WGSLDtypeError, "WGSL has no 64-bit types"),
]
ELEMENTWISE = [p for p in REGISTRY.values() if p.kernel_op is not None]


def accepted_dtypes(primitive: Primitive) -> list[np.dtype]:
    """The dtypes the primitive's shape rule accepts (for all operands at once), complex dtypes left
    out: an equation touching a complex value is a host step (schedule.kind_of), never a kernel."""
    found = []
    for dtype in dtypes.ALL_DTYPES:
        if dtypes.is_complex(dtype):
            continue
        try:
            primitive.abstract_eval(*[ShapedArray((), dtype)] * (primitive.arity or 0))
        except TypeError:
            continue
        found.append(dtype)
    return found


def one_op_kernel(op: str, arity: int, dtype: np.dtype, out_dtype: np.dtype, n: int = 8) -> K.Kernel:
    """``out[i] = op(in0[i], ...)`` over ``n`` elements."""
    operands = [K.load(i, K.var("g0"), dtype) for i in range(arity)]
    expr = K.alu(op, *operands, dtype=out_dtype)
    return K.Kernel(f"{op}_{np.dtype(dtype).name}", (n,), tuple(ShapedArray((n,), dtype) for _ in operands),
                    (ShapedArray((n,), expr.dtype),), (expr,))


def refusal(renderer: str, dtype: np.dtype) -> tuple[type[Exception], str] | None:
    for name, refused, error, reason in UNSUPPORTED:
        if name == renderer and dtype in refused:
            return error, reason
    return None


@pytest.mark.parametrize("renderer", list(RENDERERS))
@pytest.mark.parametrize("primitive", ELEMENTWISE, ids=lambda p: p.name)
def test_every_renderer_renders_every_elementwise_primitive(renderer: str, primitive: Primitive) -> None:
    assert primitive.kernel_op is not None and primitive.arity is not None
    accepted = accepted_dtypes(primitive)
    assert accepted, f"{primitive.name}'s shape rule accepts no dtype"
    failures = []
    for dtype in accepted:
        out_dtype = primitive.abstract_eval(*[ShapedArray((), dtype)] * primitive.arity).dtype
        kernel = one_op_kernel(primitive.kernel_op, primitive.arity, dtype, out_dtype)
        refused = refusal(renderer, dtype)
        if refused is not None:
            error, reason = refused
            with pytest.raises(error, match=np.dtype(dtype).name):
                RENDERERS[renderer](kernel)
            continue
        try:
            RENDERERS[renderer](kernel)
        except Exception as exc:  # noqa: BLE001 - every failure is collected and reported at once
            failures.append(f"{primitive.kernel_op} on {np.dtype(dtype).name}: {type(exc).__name__}: {exc}")
    assert not failures, f"the {renderer} renderer cannot render: " + "; ".join(failures)


@pytest.mark.parametrize("primitive", ELEMENTWISE, ids=lambda p: p.name)
def test_the_kernel_evaluator_computes_every_elementwise_primitive(primitive: Primitive) -> None:
    assert primitive.kernel_op is not None and primitive.arity is not None
    for dtype in accepted_dtypes(primitive):
        out_dtype = primitive.abstract_eval(*[ShapedArray((), dtype)] * primitive.arity).dtype
        kernel = one_op_kernel(primitive.kernel_op, primitive.arity, dtype, out_dtype)
        inputs = [np.ones(8, dtype) for _ in range(primitive.arity)]
        with np.errstate(all="ignore"):
            (result,) = K.evaluate_kernel(kernel, inputs)
        assert result.dtype == out_dtype and result.shape == (8,), (primitive.name, dtype)


@pytest.mark.parametrize("renderer", list(RENDERERS))
def test_renderers_refuse_an_unknown_op_clearly(renderer: str) -> None:
    """What the test above relies on: an op a renderer lacks raises, naming the op."""
    kernel = one_op_kernel("no_such_op", 1, dtypes.float32, dtypes.float32)
    with pytest.raises((ValueError, KeyError), match="no_such_op"):
        RENDERERS[renderer](kernel)


def test_kernel_op_lists_are_the_registry_facts() -> None:
    unary, binary = K.UNARY, K.BINARY
    assert unary == tuple(p.kernel_op for p in ELEMENTWISE if p.arity == 1)
    assert binary == tuple(p.kernel_op for p in ELEMENTWISE if p.arity == 2)
    assert set(K.COMPARISONS) <= set(binary)
    # the schedule lowers a primitive with a kernel op to that op, and treats it as elementwise
    assert {p.name for p in ELEMENTWISE} <= schedule.ELEMENTWISE


def test_every_primitive_has_a_known_cost_class() -> None:
    assert all(p.cost in COST_CLASSES for p in REGISTRY.values())
    # the classes above "cheap" are facts of elementwise primitives
    assert all(p.kernel_op is not None for p in REGISTRY.values() if p.cost != "cheap")
    with pytest.raises(ValueError, match="unknown cost class"):
        with_cost("costly")


def test_the_costly_op_sets_are_derived_from_the_cost_classes() -> None:
    """schedule.EXPENSIVE (primitives whose values a product should not recompute), render_loops.COSTLY
    (a row reduction's term worth keeping for the outputs) and devices/cpu.TRANSCENDENTAL (library calls,
    in the work estimate) are each a union of cost classes; COST_CLASSES says why they differ."""
    def ops(*classes: str) -> set[str]:
        return {p.kernel_op for p in with_cost(*classes) if p.kernel_op is not None}

    expensive, costly, transcendental = schedule.EXPENSIVE, render_loops.COSTLY, cpu.TRANSCENDENTAL
    assert expensive == {p.name for p in with_cost("divide", "transcendental", "transcendental_no_row_reuse")}
    assert costly == ops("divide", "transcendental")
    assert transcendental == ops("transcendental", "transcendental_no_row_reuse", "float_call")
    # where they agree and where they differ, by class
    common = expensive & costly & transcendental
    assert common == ops("transcendental")
    assert expensive - costly == ops("transcendental_no_row_reuse")
    assert expensive - transcendental == ops("divide")
    assert transcendental - expensive == ops("float_call") == {"rem"}
    assert {"exp", "tanh", "logistic", "log"} <= common and "add" not in expensive | transcendental
