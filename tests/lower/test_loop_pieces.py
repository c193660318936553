"""An elementwise loop split into ranges where its index comparisons change (``render_loops._pieces``).

A concatenation or a pad tests, per element, which input it reads (``where(0 <= g - 384 < 384, ...)``)
and keeps each index in bounds with a select. Between two points where such a test of the innermost
loop's variable changes, every test is decided (``kernel.fold_comparisons``): the loop runs in pieces,
each with its tests folded away and its index arithmetic simplified, so a concatenation along the last
axis is a contiguous copy per input. Checked against the kernel evaluator, NumPy and the reference
interpreter, with the rendered source showing the pieces.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices.cpu import CPUDevice
from funcgrad.ir.core import IR, ShapedArray
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower import kernel as K
from funcgrad.lower import schedule as S
from funcgrad.lower.kernel import BOOL, INDEX, Kernel, Opt, alu, const, load, var, where
from funcgrad.lower.optimize import optimize
from funcgrad.lower.render_llvm import render_llvm

FLOAT32 = np.dtype(np.float32)


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> CPUDevice:
    return CPUDevice(cache_dir=tmp_path_factory.mktemp("cache"))


def _index(value: int) -> K.KExpr:
    return const(value, INDEX)


def _concat_kernel(shape: tuple[int, ...], widths: tuple[int, ...], opts: tuple[Opt, ...] | None = None) -> Kernel:
    """out[..., j] = input i at (..., j - offset_i) where offset_i <= j < offset_i + width_i, else 0: the
    guarded gathers a concatenation along the last axis becomes (each index kept in bounds by a select)."""
    last = f"g{len(shape)}"
    total = sum(widths)
    out_shape = (*shape, total)
    avals = tuple(ShapedArray((*shape, w), FLOAT32) for w in widths)
    value = const(0.0, FLOAT32)
    offset = 0
    for number, width in enumerate(widths):
        local = alu("add", var(last), _index(-offset))
        inside = alu("and", alu("ge", local, _index(0)), alu("lt", local, _index(width)))
        index = K.flat_index([*(var(f"g{d}") for d in range(len(shape))), where(inside, local, _index(0))],
                             (*shape, width))
        value = alu("add", value, where(inside, load(number, index, FLOAT32), const(0.0, FLOAT32)))
        offset += width
    return Kernel("E_concat", out_shape, avals, (ShapedArray(out_shape, FLOAT32),), (value,), opts=opts)


def test_breaks_are_where_a_test_of_the_loop_alone_changes() -> None:
    x = var("g1")
    tests = [alu("ge", alu("add", x, _index(-3)), _index(0)),  # x >= 3
             alu("lt", alu("mul", x, _index(2)), _index(9)),  # 2x < 9: x <= 4
             alu("eq", x, _index(7)),  # one point: 7 and 8 change it
             alu("lt", alu("add", x, var("g0")), _index(5))]  # moves with g0 too: not a break
    assert K.comparison_breaks(tests, "g1", 10) == [3, 5, 7, 8]
    assert K.comparison_breaks(tests, "g1", 6) == [3, 5]  # a change at the end or beyond is no break
    assert K.comparison_breaks(tests[3:], "g1", 10) == []


def test_fold_decides_the_tests_a_range_lies_on_one_side_of() -> None:
    x = var("g0")
    inside = alu("and", alu("ge", alu("add", x, _index(-4)), _index(0)), alu("lt", alu("add", x, _index(-4)),
                                                                             _index(4)))
    picked = where(inside, const(1.0, FLOAT32), const(2.0, FLOAT32))
    assert K.fold_comparisons(picked, {"g0": 4}) == const(2.0, FLOAT32)  # x in [0, 4): x - 4 < 0
    shifted = K.fold_comparisons(alu("add", x, _index(4)), {"g0": 4})
    inner = K.fold_comparisons(where(alu("and", alu("ge", shifted, _index(4)), alu("lt", shifted, _index(8))),
                                     const(1.0, FLOAT32), const(2.0, FLOAT32)), {"g0": 4})
    assert inner == const(1.0, FLOAT32)  # x + 4 in [4, 8)
    undecided = alu("lt", x, _index(2))
    assert K.fold_comparisons(undecided, {"g0": 4}) == undecided
    assert K.fold_comparisons(alu("ne", x, _index(9)), {"g0": 4}) == const(True, BOOL)
    assert K.fold_comparisons(alu("eq", x, _index(0)), {"g0": 1}) == const(True, BOOL)


@pytest.mark.parametrize("shape, widths, opts", [
    ((3, 5), (7, 16, 1), None),  # an inner loop in three pieces, one of a single column
    ((2,), (40, 3, 17, 5), (Opt("thread", 0, 2),)),
    ((), (100, 37), (Opt("thread", 0, 2),)),  # loop 0 in pieces: each thread's chunk clipped to each piece
])
def test_a_concatenation_runs_in_pieces_and_matches_the_evaluator(device: CPUDevice, shape: Any, widths: Any,
                                                                   opts: Any) -> None:
    kernel = _concat_kernel(shape, widths, opts)
    kernel = optimize(kernel) if kernel.opts is None else kernel  # the renderer takes checked opts
    source = render_llvm(kernel)
    assert all(f".p{n}.body" in source for n in range(len(widths))) and f".p{len(widths)}." not in source
    assert "select" not in source  # every test was decided: no guarded gather is left
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(a.shape).astype(np.float32) for a in kernel.in_avals]
    out = np.empty(kernel.out_avals[0].shape, np.float32)
    device.compile(kernel)(inputs, [out])
    (expected,) = K.evaluate_kernel(kernel, inputs)
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_array_equal(out, np.concatenate(inputs, axis=-1))


def _jit_source(fn: Any, *args: np.ndarray) -> str:
    """The rendered LLVM source of every kernel of ``fn``'s jit plan."""
    ir = fg.make_ir(fn)(*(fg.Tensor(a) for a in args))
    ir = IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)
    return "\n".join(render_llvm(optimize(step.kernel)) for step in S.schedule(ir, row_reductions=True)
                     if isinstance(step, S.KernelStep))


@settings(max_examples=6, deadline=None)
@given(rows=st.integers(1, 6), widths=st.lists(st.integers(1, 40), min_size=2, max_size=5),
       pad=st.tuples(st.integers(0, 5), st.integers(0, 5)), crop=st.tuples(st.integers(0, 3), st.integers(0, 3)),
       seed=st.integers(0, 2 ** 16))
def test_concatenations_and_pads_match_numpy_and_the_interpreter(rows: int, widths: list[int], pad: tuple[int, int],
                                                                  crop: tuple[int, int], seed: int) -> None:
    """fg.jit of a concatenation along the last axis of computed inputs, cropped, then padded with 0.5,
    against NumPy and the reference interpreter; its gradient against the cotangent's slices."""
    rng = np.random.default_rng(seed)
    inputs = [rng.standard_normal((rows, w)).astype(np.float32) for w in widths]
    total = sum(widths)
    if crop[0] + crop[1] >= total:
        return
    kept = slice(crop[0], total - crop[1])

    def fn(*xs: Any) -> Any:
        joined = fnp.concatenate([x * (i + 1) for i, x in enumerate(xs)], axis=-1)
        return fg.lax.pad(joined[:, kept], np.float32(0.5), [(0, 0, 0), (pad[0], pad[1], 0)])

    joined = np.concatenate([x * (i + 1) for i, x in enumerate(inputs)], axis=-1)
    expected = np.pad(joined[:, kept], ((0, 0), pad), constant_values=0.5)
    got = fg.jit(fn)(*(fnp.asarray(x) for x in inputs)).numpy()
    np.testing.assert_array_equal(got, expected)
    (interpreted,) = eval_ir(fg.make_ir(fn)(*(fg.Tensor(x) for x in inputs)), inputs)
    np.testing.assert_array_equal(got, interpreted)

    cotangent = rng.standard_normal(expected.shape).astype(np.float32)
    grads = fg.jit(fg.grad(lambda *xs: (fn(*xs) * fnp.asarray(cotangent)).sum(), argnums=tuple(range(len(inputs)))))(
        *(fnp.asarray(x) for x in inputs))
    full = np.zeros((rows, total), np.float32)  # the cotangent of the concatenation
    full[:, kept] = cotangent[:, pad[0]:cotangent.shape[1] - pad[1]]
    offsets = np.cumsum([0, *widths])
    for i, grad in enumerate(grads):
        np.testing.assert_allclose(grad.numpy(), full[:, offsets[i]:offsets[i + 1]] * (i + 1), rtol=1e-6, atol=0)


def test_a_jitted_concatenation_of_computed_heads_renders_pieces_without_selects() -> None:
    """The three-way concatenation attention's fused projection gradient builds, through reshapes: each
    piece reads its input contiguously (no select left in the concatenation's kernel)."""
    rng = np.random.default_rng(1)
    a, b, c = (rng.standard_normal((2, 3, 8, 4)).astype(np.float32) for _ in range(3))

    def heads(a: Any, b: Any, c: Any) -> Any:
        merged = [fnp.swapaxes(x * 2.0, 1, 2).reshape((2, 8, 12)) for x in (a, b, c)]
        return fnp.concatenate(merged, axis=-1)

    source = _jit_source(heads, a, b, c)
    assert ".p2.body" in source
    got = fg.jit(heads)(fnp.asarray(a), fnp.asarray(b), fnp.asarray(c)).numpy()
    expected = np.concatenate([np.swapaxes(x * 2.0, 1, 2).reshape((2, 8, 12)) for x in (a, b, c)], axis=-1)
    np.testing.assert_array_equal(got, expected)
