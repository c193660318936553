"""Row reductions fused into their rows' pass (schedule(ir, row_reductions=True), the CPU device's
choice): a reduction over trailing axes that is broadcast back over its input is computed inside the
elementwise kernel that reads it, once per row (render_llvm opens the output loops it does not read
after it), and a costly term both read (softmax's exp) is kept in a stack row. Kernel counts, the
loop structure, and results equal to the unfused kernels' (up to a sum's order) and close to float64."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices.cpu import CPUDevice
from funcgrad.devices.reference import ReferenceDevice
from funcgrad.ir.core import IR
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower.kernel import Kernel
from funcgrad.lower.plan import Plan
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.render_loops import loop_variables
from funcgrad.lower.schedule import KernelStep, schedule

RNG = np.random.default_rng(7)
X = (RNG.standard_normal((24, 40)) * 4).astype(np.float32)
W, B = RNG.standard_normal(40).astype(np.float32), RNG.standard_normal(40).astype(np.float32)


def softmax(x: Any) -> Any:
    shifted = x - fnp.max(x, axis=-1, keepdims=True)
    e = fnp.exp(shifted)
    return e / fnp.sum(e, axis=-1, keepdims=True)


def layernorm(x: Any, w: Any, b: Any) -> Any:
    mean = fnp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = fnp.mean(centered * centered, axis=-1, keepdims=True)
    return centered / fnp.sqrt(var + 1e-5) * w + b


def log_softmax(x: Any) -> Any:
    shifted = x - fnp.max(x, axis=-1, keepdims=True)
    return shifted - fnp.log(fnp.sum(fnp.exp(shifted), axis=-1, keepdims=True))


def kernels(fn: Callable[..., Any], *args: Any, row_reductions: bool = True) -> list[Kernel]:
    ir = fg.make_ir(fn)(*args)
    return [s.kernel for s in schedule(ir, row_reductions) if isinstance(s, KernelStep)]


@pytest.mark.parametrize("fn, args, fused, unfused", [
    (softmax, (X,), 2, 3), (layernorm, (X, W, B), 2, 3), (log_softmax, (X,), 2, 3),
    (lambda x: x.softmax(-1), (X,), 2, 3),
    (lambda x: softmax(x.reshape(4, 6, 40)), (X,), 2, 3),  # attention-shaped: (batch, query, key)
])
def test_row_reductions_make_softmax_and_layernorm_two_kernels(fn: Callable[..., Any], args: tuple[Any, ...],
                                                               fused: int, unfused: int) -> None:
    assert len(kernels(fn, *args, row_reductions=False)) == unfused
    found = kernels(fn, *args)
    assert len(found) == fused
    last = found[-1]  # the row pass: the full shape, a reduction that reads only the leading loops
    out = fg.make_ir(fn)(*args).outputs[0].aval.shape  # its leading loops may be merged (kernel.merge_loops)
    assert last.shape[-1] == out[-1] and np.prod(last.shape) == np.prod(out) and last.reduce_expr is not None
    assert f"g{len(last.shape) - 1}" not in loop_variables(last.reduce_expr)


@pytest.mark.parametrize("fn", [
    lambda x: softmax(x.T).T,  # over the leading axis: the reduction would not be once per row
    lambda x: (x - fnp.max(x, axis=-1, keepdims=True)).reshape(-1),  # a per-row value reshaped
    lambda x: (x - fnp.sum(x, axis=-1, keepdims=True)).sum(axis=-1),  # a per-row value reduced again
    lambda x: fnp.exp(x - fnp.max(x, axis=-1, keepdims=True)) + fnp.max(x, axis=-1, keepdims=True) * x,  # read twice
])
def test_a_per_row_value_that_leaves_its_row_pass_keeps_its_reduction_stored(fn: Callable[..., Any]) -> None:
    for kernel in kernels(fn, X):
        if kernel.reduce_expr is not None:  # every reduction varies with every output loop: none was fused
            assert loop_variables(kernel.reduce_expr) >= {f"g{axis}" for axis, n in enumerate(kernel.shape) if n > 1}
    assert len(kernels(fn, X)) == len(kernels(fn, X, row_reductions=False))


def test_only_devices_that_ask_fuse_row_reductions(tmp_path: Path) -> None:
    ir = fg.make_ir(softmax)(X)
    assert len(Plan(ir, ReferenceDevice()).kernels) == 3
    assert CPUDevice.row_reductions and len(Plan(ir, CPUDevice(tmp_path)).kernels) == 2


def test_the_reduction_runs_before_the_output_loop_and_softmax_keeps_its_exps_in_a_row() -> None:
    fused_softmax = kernels(softmax, X)[-1]
    source = render_llvm(fused_softmax)
    body = source[source.index("define void"):]
    assert body.index("r0.exit:") < body.index("g1.cond:")  # once per row, then the row's outputs
    assert "%row.addr = alloca [40 x float]" in source and body.count("call float @llvm.ldexp") == 1  # one exp
    fused_layernorm = kernels(layernorm, X, W, B)[-1]
    assert "%row.addr" not in render_llvm(fused_layernorm)  # (x - mean) is cheaper to recompute than to keep


PROGRAMS: list[tuple[Callable[..., Any], tuple[Any, ...]]] = [
    (softmax, (X,)), (layernorm, (X, W, B)), (log_softmax, (X,)),
    (lambda x: softmax(x.reshape(4, 6, 40)), (X,)),
    (lambda x: softmax(x.astype("float16")).astype("float32"), (X,)),
    (lambda x: softmax(fnp.concatenate([x, fnp.full((24, 1), np.inf, dtype=np.float32)], axis=1)), (X,)),  # NaN rows
    (lambda x: fnp.exp(x - fnp.max(x, axis=-1, keepdims=True)) * x, (X,)),  # max fused: the max loop per row
    (lambda x: fnp.sqrt(fnp.sum(x * x, axis=-1, keepdims=True)) + x[:1], (X,)),  # a broadcast row read
    (lambda x: (x.reshape(4, 6, 40) - fnp.mean(x.reshape(4, 6, 40), axis=(1, 2), keepdims=True)) * 2.0, (X,)),
    (fg.grad(lambda x: fnp.sum(softmax(x) * X)), (X,)),
    (fg.grad(lambda x: fnp.sum(layernorm(x, W, B) ** 2)), (X,)),
]


@pytest.mark.parametrize("index", range(len(PROGRAMS)))
def test_fused_rows_match_the_unfused_kernels_and_float64(index: int, tmp_path: Path) -> None:
    # the same operations; only a sum's order may differ (the loop vectorizer's choice per kernel)
    fn, args = PROGRAMS[index]
    ir = fg.make_ir(fn)(*args)
    opened = IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)
    inputs = [c.numpy() for c in ir.consts] + [np.asarray(a) for a in args]
    unfused_device = CPUDevice(tmp_path)
    unfused_device.row_reductions = False
    fused_plan = Plan(opened, CPUDevice(tmp_path))
    unfused_plan = Plan(opened, unfused_device)
    assert len(fused_plan.kernels) < len(unfused_plan.kernels)
    fused, unfused = fused_plan.run(inputs), unfused_plan.run(inputs)
    want = eval_ir(ir, [np.asarray(a) for a in args], [c.numpy() for c in ir.consts])
    for got, same, reference in zip(fused, unfused, want):
        np.testing.assert_allclose(got, same, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(got, reference, rtol=2e-5, atol=2e-6)
