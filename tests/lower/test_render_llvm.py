"""The LLVM renderer and the CPU device, checked against the NumPy kernel evaluator.

Kernels are built by hand with the constructors of funcgrad/lower/kernel.py and run twice: compiled
by ``CPUDevice`` and evaluated by ``evaluate_kernel`` (the oracle). Integers, bools, casts and
correctly rounded float operations must agree bit for bit; transcendental functions (libm and
NumPy's own implementations differ) within a few ulps. Each test packs many operations into one
multi-output kernel, because compiling a kernel costs tens of milliseconds.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from funcgrad.devices import cpu as cpu_module
from funcgrad.devices import cpu_threads
from funcgrad.devices.cpu import PARALLEL_MIN_WORK, CPUDevice, KernelCompileError
from funcgrad.ir import dtypes
from funcgrad.ir.core import ShapedArray
from funcgrad.ir.primitives import REGISTRY, with_cost
from funcgrad.lower.kernel import (
    BINARY,
    BOOL,
    INDEX,
    UNARY,
    Kernel,
    KExpr,
    acc,
    alu,
    bitcast,
    cast,
    const,
    evaluate_kernel,
    flat_index,
    load,
    var,
    where,
)
from funcgrad.lower.render_llvm import render_llvm

ALL_DTYPES = dtypes.KERNEL_DTYPES  # the dtypes kernels see (complex runs on the host)
FLOATS = (dtypes.bfloat16, dtypes.float16, dtypes.float32, dtypes.float64)
# results of these may differ from NumPy's by rounding (different libm algorithms)
TRANSCENDENTAL = {p.kernel_op for p in with_cost("transcendental", "transcendental_no_row_reuse")}
N = 256


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> CPUDevice:
    return CPUDevice(cache_dir=tmp_path_factory.mktemp("cache"))


def g(i: int = 0) -> KExpr:
    return var(f"g{i}")


def aval(shape: tuple[int, ...], dtype: np.dtype) -> ShapedArray:
    return ShapedArray(tuple(shape), np.dtype(dtype))


def elementwise_kernel(name: str, in_dtypes: list[np.dtype], outputs: list[KExpr], n: int = N) -> Kernel:
    return Kernel(name, (n,), tuple(aval((n,), dt) for dt in in_dtypes),
                  tuple(aval((n,), e.dtype) for e in outputs), tuple(outputs))


def run(device: CPUDevice, kernel: Kernel, inputs: list[np.ndarray]) -> list[np.ndarray]:
    outputs = [np.empty(a.shape, a.dtype) for a in kernel.out_avals]
    device.compile(kernel)(inputs, outputs)
    return outputs


def defined(op: str, *operand_dtypes: np.dtype) -> bool:
    try:
        REGISTRY[op].abstract_eval(*(aval((), dt) for dt in operand_dtypes))
    except TypeError:
        return False
    return True


def ulp_distance(actual: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """Distance in units in the last place; 0 where both are NaN, infinite where only one is."""
    width = actual.dtype.itemsize
    unsigned = {2: np.uint16, 4: np.uint32, 8: np.uint64}[width]
    top = 1 << (8 * width - 1)

    def ordered(x: np.ndarray) -> np.ndarray:  # sign-magnitude bits -> a monotonic line of Python ints
        bits = x.view(unsigned).astype(object)
        return np.where(bits >= top, top - bits, bits)

    distance = np.abs(ordered(actual) - ordered(expected)).astype(np.float64)
    nan_a = np.isnan(actual.astype(np.float64))
    nan_b = np.isnan(expected.astype(np.float64))
    return np.where(nan_a & nan_b, 0, np.where(nan_a | nan_b, np.inf, distance))


def check(label: str, actual: np.ndarray, expected: np.ndarray, max_ulp: float = 0, atol: float = 0) -> str | None:
    """None when ``actual`` matches (to within ``max_ulp`` ulps or ``atol``); otherwise a description
    of the first mismatch."""
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (label, actual.dtype, expected.dtype)
    if actual.dtype.kind in "biu":
        bad = actual != expected
    else:
        # -0.0 and 0.0 compare equal; everything else to within max_ulp
        with np.errstate(invalid="ignore"):  # inf - inf
            close = np.abs(actual.astype(np.float64) - expected.astype(np.float64)) <= atol
        bad = ~((actual == expected) | (ulp_distance(actual, expected) <= max_ulp) | close)
    if not bad.any():
        return None
    first = np.argwhere(bad)[0]
    return f"{label}: {int(bad.sum())} mismatches, e.g. at {tuple(first)} got {actual[tuple(first)]!r} " \
           f"expected {expected[tuple(first)]!r}"


def ulp_budget(op: str, dtype: np.dtype) -> float:
    if op not in TRANSCENDENTAL:
        return 0
    return 1 if dtype in (dtypes.float16, dtypes.bfloat16) else 4


def sample(dtype: np.dtype, n: int = N, seed: int = 0, small: bool = False) -> np.ndarray:
    """Values that exercise edge cases: specials and extremes first, then random ones."""
    rng = np.random.default_rng(seed)
    dtype = np.dtype(dtype)
    if dtype == BOOL:
        return rng.random(n) < 0.5
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        if small:  # shift amounts and exponents: around and beyond the bit width
            low = -3 if dtype.kind == "i" else 0
            return rng.integers(low, dtype.itemsize * 8 + 3, n).astype(dtype)
        edges = [info.min, info.max, 0, 1, info.max // 2 + 1, 2, 3, 7] + ([-1, -2, info.min + 1] if info.min else [])
        parts = [np.array(edges, dtype), rng.integers(max(info.min, -20), 21, n // 2).astype(dtype),
                 rng.integers(info.min, info.max, n, dtype=dtype, endpoint=True)]
        return np.concatenate(parts)[:n]
    finfo = ml_dtypes.finfo(dtype)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, -0.5, 1.5, 2.5, -2.5, 3.0, 1e-3, 0.999, -0.999,
               float(finfo.max), float(finfo.tiny), float(finfo.smallest_subnormal), 100.0, -100.0]
    parts = [np.array(special), rng.uniform(-4, 4, n // 2), rng.uniform(-1, 1, n // 4), rng.standard_normal(n) * 30]
    return np.concatenate(parts)[:n].astype(dtype)


# --- elementwise ALU operations ------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda dt: dt.name)
def test_unary_ops_match_reference(device: CPUDevice, dtype: np.dtype) -> None:
    ops = [op for op in UNARY if defined(op, dtype)]
    x = load(0, g(), dtype)
    kernel = elementwise_kernel(f"unary_{dtype.name}", [dtype],
                                [alu(op, x, dtype=BOOL if op == "is_finite" else None) for op in ops])
    inputs = [sample(dtype)]
    # logistic is 0.5 * tanh(x / 2) + 0.5 (as the reference computes it): tanh's last-place
    # differences show up as absolute errors of about one ulp of 1.0, even where the result is tiny
    failures = [check(op, got, want, ulp_budget(op, dtype), atol=4 * float(ml_dtypes.finfo(dtype).eps)
                      if op == "logistic" else 0)
                for op, got, want in zip(ops, run(device, kernel, inputs), evaluate_kernel(kernel, inputs))]
    assert ops and not any(failures), [f for f in failures if f]


@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=lambda dt: dt.name)
def test_binary_ops_match_reference(device: CPUDevice, dtype: np.dtype) -> None:
    ops = [op for op in BINARY if defined(op, dtype, dtype)]
    x, y, small = load(0, g(), dtype), load(1, g(), dtype), load(2, g(), dtype)
    # integer shifts and powers also get amounts around the bit width
    exprs = [alu(op, x, y) for op in ops]
    labels = list(ops)
    if dtype.kind in "iu":
        exprs += [alu(op, x, small) for op in ("shift_left", "shift_right", "pow")]
        labels += ["shift_left (small)", "shift_right (small)", "pow (small)"]
    kernel = elementwise_kernel(f"binary_{dtype.name}", [dtype] * 3, exprs)
    inputs = [sample(dtype, seed=1), sample(dtype, seed=2), sample(dtype, seed=3, small=True)]
    if dtype.kind in "iu":  # make division by zero and MIN / -1 certain to occur
        inputs[1][:4] = [0, 0, -1 if dtype.kind == "i" else 0, 1]
        inputs[0][:4] = [5, np.iinfo(dtype).min, np.iinfo(dtype).min, 3]
    failures = [check(label, got, want, ulp_budget(label, dtype))
                for label, got, want in zip(labels, run(device, kernel, inputs), evaluate_kernel(kernel, inputs))]
    assert ops and not any(failures), [f for f in failures if f]


def test_float_ops_on_chains_of_ops(device: CPUDevice) -> None:
    # a chain of exact operations stays bit-identical (no fused multiply-add, no fast-math)
    x, y = load(0, g(), np.float32), load(1, g(), np.float32)
    chain = alu("sub", alu("mul", x, y), alu("div", y, alu("add", x, const(3, np.float32))))
    chain = alu("max", alu("sqrt", alu("abs", chain)), alu("floor", alu("neg", x)))
    kernel = elementwise_kernel("chain", [np.float32] * 2, [chain, alu("lt", chain, y)])
    inputs = [sample(np.float32, seed=4), sample(np.float32, seed=5)]
    for got, want in zip(run(device, kernel, inputs), evaluate_kernel(kernel, inputs)):
        assert check("chain", got, want) is None


# --- casts, bitcasts, where ------------------------------------------------------------------------

@pytest.mark.parametrize("source", ALL_DTYPES, ids=lambda dt: dt.name)
def test_casts_match_reference(device: CPUDevice, source: np.dtype) -> None:
    targets = [dt for dt in ALL_DTYPES if dt != source]
    x = load(0, g(), source)
    kernel = elementwise_kernel(f"cast_{source.name}", [source], [cast(x, dt) for dt in targets])
    values = sample(source)
    if source.kind == "f":  # saturation: values beyond every integer range, and exact boundaries
        values = values.astype(np.float64)
        values[-12:] = [1e30, -1e30, 300.7, -129.5, 255.9, 2.0**31, -2.0**31 - 4096, 2.0**63, 2.0**64, 65519.0,
                        65520.0, -3.999]
        with np.errstate(over="ignore"):
            values = values.astype(source)
    failures = [check(f"{source.name}->{dt.name}", got, want)
                for dt, got, want in zip(targets, run(device, kernel, [values]), evaluate_kernel(kernel, [values]))]
    assert not any(failures), [f for f in failures if f]


def test_float_to_int_saturates_and_maps_nan_to_zero(device: CPUDevice) -> None:
    values = np.array([np.nan, np.inf, -np.inf, 1e10, -1e10, 3.9, -3.9, 127.5, -128.9], np.float32)
    x = load(0, g(), np.float32)
    kernel = elementwise_kernel("saturate", [np.float32], [cast(x, np.int8), cast(x, np.uint8)], n=len(values))
    as_int8, as_uint8 = run(device, kernel, [values])
    assert as_int8.tolist() == [0, 127, -128, 127, -128, 3, -3, 127, -128]
    assert as_uint8.tolist() == [0, 255, 0, 255, 0, 3, 0, 127, 0]


def test_float64_to_float16_rounds_once(device: CPUDevice) -> None:
    # 1 + 2^-11 + 2^-40 rounds up in one step but to 1.0 through float32 (a double rounding)
    values = np.array([1 + 2.0**-11 + 2.0**-40, 1 + 2.0**-11, -(1 + 3 * 2.0**-11), 65519.99, 2.0**-25 + 2.0**-60])
    kernel = elementwise_kernel("f64_to_f16", [np.float64], [cast(load(0, g(), np.float64), np.float16)],
                                n=len(values))
    (got,) = run(device, kernel, [values])
    np.testing.assert_array_equal(got.view(np.uint16), values.astype(np.float16).view(np.uint16))


def test_bfloat16_keeps_denormals(device: CPUDevice) -> None:
    values = np.array([1e-39, -3e-40, 1e-45, 9.2e-41, np.nan, 3.4e38], np.float32)
    kernel = elementwise_kernel("to_bf16", [np.float32], [cast(load(0, g(), np.float32), dtypes.bfloat16)],
                                n=len(values))
    (got,) = run(device, kernel, [values])
    expected = values.astype(dtypes.bfloat16)
    assert check("bf16", got, expected) is None


@pytest.mark.parametrize("source", [dt for dt in ALL_DTYPES if dt != BOOL], ids=lambda dt: dt.name)
def test_bitcasts_match_reference(device: CPUDevice, source: np.dtype) -> None:
    targets = [dt for dt in ALL_DTYPES if dt.itemsize == source.itemsize and dt not in (source, BOOL)]
    x = load(0, g(), source)
    kernel = elementwise_kernel(f"bitcast_{source.name}", [source], [bitcast(x, dt) for dt in targets])
    values = sample(source)
    for dt, got, want in zip(targets, run(device, kernel, [values]), evaluate_kernel(kernel, [values])):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=f"{source}->{dt}")


def test_where_selects_for_every_dtype(device: CPUDevice) -> None:
    condition = load(0, g(), BOOL)
    exprs = [where(condition, load(1 + 2 * i, g(), dt), load(2 + 2 * i, g(), dt)) for i, dt in enumerate(ALL_DTYPES)]
    in_dtypes = [BOOL] + [dt for dt in ALL_DTYPES for _ in range(2)]
    kernel = elementwise_kernel("where_all", in_dtypes, exprs)
    inputs = [sample(BOOL)] + [sample(dt, seed=s) for dt in ALL_DTYPES for s in (6, 7)]
    for dt, got, want in zip(ALL_DTYPES, run(device, kernel, inputs), evaluate_kernel(kernel, inputs)):
        np.testing.assert_array_equal(got.view(np.uint8), want.view(np.uint8), err_msg=dt.name)


# --- index arithmetic ------------------------------------------------------------------------------

def test_transposed_and_broadcast_loads(device: CPUDevice) -> None:
    rows, cols = 5, 7
    a = load(0, flat_index([g(1), g(0)], (cols, rows)), np.float32)  # a is (cols, rows): read transposed
    b = load(1, flat_index([g(1)], (cols,)), np.float32)  # broadcast along rows
    flat = flat_index([g(0), g(1)], (rows, cols))
    # a reshape-style read: the flat position re-split as (flat // 5, flat % 5) of a (7, 5) array
    c = load(0, alu("add", alu("mul", alu("div", flat, const(rows, INDEX)), const(rows, INDEX)),
                    alu("rem", flat, const(rows, INDEX))), np.float32)
    kernel = Kernel("index_arith", (rows, cols), (aval((cols, rows), np.float32), aval((cols,), np.float32)),
                    (aval((rows, cols), np.float32), aval((rows, cols), np.float32)), (alu("mul", a, b), c))
    inputs = [np.arange(rows * cols, dtype=np.float32).reshape(cols, rows), np.arange(cols, dtype=np.float32)]
    got = run(device, kernel, inputs)
    np.testing.assert_array_equal(got[0], inputs[0].T * inputs[1])
    np.testing.assert_array_equal(got[1], inputs[0].reshape(rows, cols))
    for actual, expected in zip(got, evaluate_kernel(kernel, inputs)):
        np.testing.assert_array_equal(actual, expected)


def test_rank0_kernel(device: CPUDevice) -> None:
    x = load(0, const(0, INDEX), np.float64)
    kernel = Kernel("scalar", (), (aval((), np.float64),), (aval((), np.float64), aval((), BOOL)),
                    (alu("mul", x, const(2.5, np.float64)), alu("gt", x, const(0, np.float64))))
    got = run(device, kernel, [np.array(4.0)])
    assert got[0].shape == () and float(got[0]) == 10.0 and bool(got[1]) is True


# --- reductions --------------------------------------------------------------------------------------

REDUCTION_DTYPES = (dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int32, dtypes.int8,
                    dtypes.uint8, dtypes.uint64, dtypes.bool_)


def reduction_kernel(name: str, op: str, dtype: np.dtype, shape: tuple[int, int, int],
                     epilogue: bool = False) -> Kernel:
    """Reduce axis 1 of a (a, b, c) array: global loops over (a, c), reduction over b."""
    a, b, c = shape
    value = load(0, flat_index([g(0), var("r0"), g(1)], shape), dtype)
    result = acc(dtype)
    if epilogue:  # out = acc * 2 + bias[g1] (floats) or acc ^ bias (ints), reading another input
        bias = load(1, g(1), dtype)
        result = alu("add", alu("mul", result, const(2, dtype)), bias) if dtype.kind == "f" or \
            dtype in (dtypes.bfloat16,) else alu("xor" if dtype != BOOL else "or", result, bias)
    in_avals = (aval(shape, dtype),) + ((aval((c,), dtype),) if epilogue else ())
    return Kernel(name, (a, c), in_avals, (aval((a, c), dtype),), (result,), (b,), op, value)


def reduction_tolerance(op: str, dtype: np.dtype, got: np.ndarray, want: np.ndarray, values: np.ndarray) -> None:
    if dtype.kind in "biu" or op in ("max", "min"):
        assert check(op, got, want) is None, check(op, got, want)
        return
    # sums and products may round differently (NumPy sums pairwise): compare with a tolerance
    rtol = {2: 1e-2, 4: 1e-5, 8: 1e-12}[dtype.itemsize]
    np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                               atol=rtol * float(np.abs(values.astype(np.float64)).sum()) if op == "sum" else 0)


@pytest.mark.parametrize("dtype", REDUCTION_DTYPES, ids=lambda dt: dt.name)
def test_reductions_match_reference(device: CPUDevice, dtype: np.dtype) -> None:
    shape = (3, 37, 4)
    ops = [op for op in ("sum", "prod", "max", "min") if defined(f"reduce_{op}", dtype) or dtype == BOOL]
    for op in ops:
        kernel = reduction_kernel(f"reduce_{op}_{dtype.name}", op, dtype, shape)
        values = sample(dtype, int(np.prod(shape))).reshape(shape)
        if dtype.kind == "f" or dtype == dtypes.bfloat16:
            values = np.where(np.isfinite(values.astype(np.float64)), values, 1).astype(dtype)
            if op == "prod":  # keep products finite
                values = (np.sign(values.astype(np.float32)) * 1.05).astype(dtype)
        (got,) = run(device, kernel, [values])
        (want,) = evaluate_kernel(kernel, [values])
        reduction_tolerance(op, dtype, got, want, values)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min"])
def test_empty_reductions_give_the_identity(device: CPUDevice, op: str) -> None:
    for dtype in (dtypes.float32, dtypes.int16, dtypes.uint32, dtypes.float16):
        kernel = reduction_kernel(f"empty_{op}_{dtype.name}", op, dtype, (2, 0, 3))
        values = np.zeros((2, 0, 3), dtype)
        (got,) = run(device, kernel, [values])
        (want,) = evaluate_kernel(kernel, [values])
        np.testing.assert_array_equal(got, want)
        assert got.dtype == dtype


@pytest.mark.parametrize("op", ["max", "min", "sum"])
def test_reductions_propagate_nan(device: CPUDevice, op: str) -> None:
    for dtype in (dtypes.float32, dtypes.float64, dtypes.bfloat16):
        values = sample(dtype, 3 * 40 * 2, seed=8).reshape(3, 40, 2)
        values = np.where(np.isfinite(values.astype(np.float64)), values, 0).astype(dtype)
        values[1, 17, 0] = np.nan
        values[2, 0, 1] = np.nan
        kernel = reduction_kernel(f"nan_{op}_{dtype.name}", op, dtype, values.shape)
        (got,) = run(device, kernel, [values])
        nan = np.isnan(got.astype(np.float64))
        assert nan[1, 0] and nan[2, 1] and not nan[0].any()


@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.bfloat16, dtypes.int64, dtypes.bool_],
                         ids=lambda dt: dt.name)
def test_epilogue_reads_the_accumulator(device: CPUDevice, dtype: np.dtype) -> None:
    kernel = reduction_kernel(f"epilogue_{dtype.name}", "max", dtype, (4, 9, 3), epilogue=True)
    inputs = [sample(dtype, 4 * 9 * 3, seed=9).reshape(4, 9, 3), sample(dtype, 3, seed=10)]
    (got,) = run(device, kernel, inputs)
    (want,) = evaluate_kernel(kernel, inputs)
    assert check("epilogue", got, want) is None, check("epilogue", got, want)


def test_full_reduction_to_a_scalar_with_two_reduce_axes(device: CPUDevice) -> None:
    shape = (6, 50)
    value = alu("mul", load(0, flat_index([var("r0"), var("r1")], shape), np.float64), const(0.5, np.float64))
    kernel = Kernel("sum_all", (), (aval(shape, np.float64),), (aval((), np.float64), aval((), np.int32)),
                    (acc(np.float64), cast(acc(np.float64), np.int32)), shape, "sum", value)
    values = np.random.default_rng(11).standard_normal(shape) * 100
    total, as_int = run(device, kernel, [values])
    np.testing.assert_allclose(float(total), values.sum() * 0.5, rtol=1e-12)
    assert int(as_int) == int(np.trunc(float(total)))


def test_reduction_over_no_axes_is_the_value_itself(device: CPUDevice) -> None:
    x = load(0, g(), np.float32)
    kernel = Kernel("reduce_nothing", (4,), (aval((4,), np.float32),), (aval((4,), np.float32),),
                    (acc(np.float32),), (), "sum", x)
    values = np.array([-0.0, 1.5, np.nan, -np.inf], np.float32)
    (got,) = run(device, kernel, [values])
    np.testing.assert_array_equal(got, values)
    assert np.signbit(got[0])


def test_multi_output_kernel_with_mixed_dtypes(device: CPUDevice) -> None:
    x = load(0, g(), np.float32)
    outputs = [alu("exp", x), alu("lt", x, const(0, np.float32)), cast(x, np.int16), cast(x, dtypes.bfloat16)]
    kernel = elementwise_kernel("multi", [np.float32], outputs)
    values = sample(np.float32, seed=12)
    for label, got, want in zip("abcd", run(device, kernel, [values]), evaluate_kernel(kernel, [values])):
        assert check(label, got, want, 4) is None


# --- threads ----------------------------------------------------------------------------------------

def test_large_kernels_are_split_across_threads(device: CPUDevice) -> None:
    rows, cols = 1001, 600  # rows not divisible by the thread count
    x = load(0, flat_index([g(0), g(1)], (rows, cols)), np.float32)
    kernel = Kernel("big", (rows, cols), (aval((rows, cols), np.float32),), (aval((rows, cols), np.float32),),
                    (alu("add", alu("mul", x, x), const(1, np.float32)),))
    compiled = device.compile(kernel)
    assert compiled.work >= PARALLEL_MIN_WORK
    assert compiled.parallel == (cpu_threads.thread_count() > 1)
    values = np.random.default_rng(13).standard_normal((rows, cols)).astype(np.float32)
    out = np.empty_like(values)
    compiled([values], [out])
    np.testing.assert_array_equal(out, values * values + 1)
    assert not device.compile(small_kernel("tiny")).parallel


def test_bad_buffers_are_rejected(device: CPUDevice) -> None:
    kernel = elementwise_kernel("neg16", [np.float32], [alu("neg", load(0, g(), np.float32))], n=16)
    compiled = device.compile(kernel)
    with pytest.raises(ValueError, match="neg16: output 0 must be a C-contiguous"):
        compiled([np.zeros(16, np.float32)], [np.zeros(16, np.float64)])
    with pytest.raises(ValueError, match="input 0 must be"):
        compiled([np.zeros(8, np.float32)], [np.zeros(16, np.float32)])
    with pytest.raises(ValueError, match="takes 1 inputs and 1 outputs"):
        compiled([], [np.zeros(16, np.float32)])


# --- random expression trees ------------------------------------------------------------------------

EXACT_FLOAT_UNARY = ("neg", "abs", "sign", "sqrt", "floor", "ceil", "round")
EXACT_FLOAT_BINARY = ("add", "sub", "mul", "div", "rem", "max", "min")
INT_BINARY = ("add", "sub", "mul", "div", "rem", "max", "min", "and", "or", "xor", "shift_left", "shift_right")


@st.composite
def expressions(draw: st.DrawFn, dtype: np.dtype, depth: int = 0) -> KExpr:
    """Random trees of exactly rounded operations on two float32 and two int32 inputs."""
    leaf = depth >= 4 or draw(st.integers(0, 3)) == 0
    if dtype == np.float32:
        if leaf:
            return draw(st.sampled_from([load(0, g(), dtype), load(1, g(), dtype), const(1.5, dtype)]))
        choice = draw(st.integers(0, 4))
        if choice == 0:
            return alu(draw(st.sampled_from(EXACT_FLOAT_UNARY)), draw(expressions(dtype, depth + 1)))
        if choice == 1:
            return cast(draw(expressions(np.dtype(np.int32), depth + 1)), dtype)
        if choice == 2:
            condition = alu(draw(st.sampled_from(["lt", "ge", "ne"])), draw(expressions(dtype, depth + 1)),
                            draw(expressions(dtype, depth + 1)))
            return where(condition, draw(expressions(dtype, depth + 1)), draw(expressions(dtype, depth + 1)))
        return alu(draw(st.sampled_from(EXACT_FLOAT_BINARY)), draw(expressions(dtype, depth + 1)),
                   draw(expressions(dtype, depth + 1)))
    if leaf:
        return draw(st.sampled_from([load(2, g(), dtype), load(3, g(), dtype), const(-7, dtype)]))
    choice = draw(st.integers(0, 3))
    if choice == 0:
        return alu(draw(st.sampled_from(["neg", "abs", "not", "sign"])), draw(expressions(dtype, depth + 1)))
    if choice == 1:
        return cast(draw(expressions(np.dtype(np.float32), depth + 1)), dtype)
    return alu(draw(st.sampled_from(INT_BINARY)), draw(expressions(dtype, depth + 1)),
               draw(expressions(dtype, depth + 1)))


@settings(max_examples=30, deadline=None)
@given(float_tree=expressions(np.dtype(np.float32)), int_tree=expressions(np.dtype(np.int32)))
def test_random_expression_trees_match_reference(device: CPUDevice, float_tree: KExpr, int_tree: KExpr) -> None:
    in_dtypes = [np.dtype(np.float32)] * 2 + [np.dtype(np.int32)] * 2
    kernel = elementwise_kernel("random_tree", in_dtypes, [float_tree, int_tree], n=64)
    inputs = [sample(dt, 64, seed=s) for s, dt in enumerate(in_dtypes)]
    for got, want in zip(run(device, kernel, inputs), evaluate_kernel(kernel, inputs)):
        assert check(str(kernel), got, want) is None, check(str(kernel), got, want)


# --- the compile cache -------------------------------------------------------------------------------

def small_kernel(name: str = "cached") -> Kernel:
    x = load(0, g(), np.float32)
    return elementwise_kernel(name, [np.float32], [alu("mul", alu("exp", x), const(3, np.float32))], n=8)


def test_same_source_compiles_once_per_device(device: CPUDevice) -> None:
    before = dict(device.stats)
    first = device.compile(small_kernel("twice"))
    second = device.compile(small_kernel("twice"))
    assert second is first and second.origin in ("compiled", "disk")
    assert device.stats["memory_hits"] == before["memory_hits"] + 1


def test_fresh_device_loads_object_code_from_disk(tmp_path: Path) -> None:
    first = CPUDevice(cache_dir=tmp_path)
    assert first.compile(small_kernel()).origin == "compiled"
    second = CPUDevice(cache_dir=tmp_path)
    compiled = second.compile(small_kernel())
    assert compiled.origin == "disk" and second.stats == {"compiled": 0, "disk_hits": 1, "memory_hits": 0}
    out = np.empty(8, np.float32)
    values = np.linspace(-1, 1, 8, dtype=np.float32)
    compiled([values], [out])
    np.testing.assert_allclose(out, np.exp(values) * 3, rtol=1e-6)
    assert not [p for p in (tmp_path / "cpu").iterdir() if p.name.startswith(".tmp")]


def test_second_process_loads_from_disk(tmp_path: Path) -> None:
    CPUDevice(cache_dir=tmp_path).compile(small_kernel())
    script = (
        "import numpy as np, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from tests.lower.test_render_llvm import small_kernel\n"
        "from funcgrad.devices.cpu import CPUDevice\n"
        "device = CPUDevice()\n"
        "compiled = device.compile(small_kernel())\n"
        "out = np.empty(8, np.float32)\n"
        "compiled([np.zeros(8, np.float32)], [out])\n"
        "print(compiled.origin, device.stats['compiled'], out[0])\n")
    root = str(Path(__file__).resolve().parents[2])
    result = subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "FUNCGRAD_CACHE": str(tmp_path)}, cwd=root)
    assert result.stdout.split() == ["disk", "0", "3.0"], result.stderr


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_corrupt_cache_entry_is_recompiled(tmp_path: Path, damage: str) -> None:
    CPUDevice(cache_dir=tmp_path).compile(small_kernel())
    (entry,) = (tmp_path / "cpu").glob("*.o")
    data = bytearray(entry.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    entry.write_bytes(bytes(data[: len(data) // 2] if damage == "truncate" else b"" if damage == "empty" else data))
    device = CPUDevice(cache_dir=tmp_path)
    compiled = device.compile(small_kernel())
    assert compiled.origin == "compiled" and device.stats["disk_hits"] == 0
    out = np.empty(8, np.float32)
    compiled([np.zeros(8, np.float32)], [out])
    assert (out == 3).all()
    assert CPUDevice(cache_dir=tmp_path).compile(small_kernel()).origin == "disk"  # the entry was rewritten


# --- errors ---------------------------------------------------------------------------------------------

def test_unsupported_operation_error_names_the_kernel(device: CPUDevice) -> None:
    bad = KExpr("frobnicate", np.dtype(np.float32), (load(0, g(), np.float32),))
    with pytest.raises(KernelCompileError, match="kernel my_bad_kernel .*frobnicate"):
        device.compile(elementwise_kernel("my_bad_kernel", [np.float32], [bad], n=4))


def test_llvm_failure_names_the_kernel_and_shows_source_with_debug(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    def broken(kernel: Kernel) -> str:
        return render_llvm(kernel).replace("ret void", "ret i32 undef_thing")
    monkeypatch.setattr(cpu_module, "render_llvm", broken)
    device = CPUDevice(cache_dir=tmp_path)
    with pytest.raises(KernelCompileError, match="kernel broken_one failed to compile") as info:
        device.compile(small_kernel("broken_one"))
    assert "define void" not in str(info.value)
    monkeypatch.setenv("DEBUG", "4")
    with pytest.raises(KernelCompileError, match="kernel broken_one failed") as info:
        device.compile(small_kernel("broken_one"))
    assert "define void @broken_one" in str(info.value)
    folder = tmp_path / "cpu"
    stored = [p for p in folder.glob("*") if not p.name.startswith(".lock-")] if folder.exists() else []
    assert not stored, stored  # nothing cached for a kernel that failed (a compile lock file may stay)


def test_unresolvable_function_is_refused_before_running(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    def calls_missing(kernel: Kernel) -> str:
        return render_llvm(kernel).replace("@asinhf(", "@fg_no_such_function(")
    x = load(0, g(), np.float32)
    kernel = elementwise_kernel("needs_missing", [np.float32], [alu("asinh", x)], n=4)
    assert "asinhf" in cpu_module.undefined_symbols(cpu_module.host_target().compile(render_llvm(kernel)))
    monkeypatch.setattr(cpu_module, "render_llvm", calls_missing)
    monkeypatch.setattr(cpu_module, "external_symbols", lambda source: [])  # get past the source check
    with pytest.raises(KernelCompileError, match="needs_missing .*fg_no_such_function"):
        CPUDevice(cache_dir=tmp_path).compile(kernel)


def test_rendered_source_is_plain_llvm_with_wide_vectors() -> None:
    source = render_llvm(small_kernel("shown"))
    assert "define void @shown(ptr noalias %out0, ptr noalias %in0, i64 %start, i64 %end)" in source
    assert '"prefer-vector-width"="512"' in source
    # float32 exp is written out as vectorizable arithmetic, not a call per element
    assert "@llvm.exp.f32" not in source and "declare float @llvm.roundeven.f32(float)" in source


def test_matrix_products_use_the_reduce_outer_loop_order_and_stay_exact_enough():
    """A matmul-shaped reduction runs its reduction outside the last output loop (i-k-j), and
    row sums (contiguous along the reduction) keep the plain order; both match the reference."""
    import funcgrad as fg
    import funcgrad.numpy as fnp
    from funcgrad.lower.render_loops import reduce_outer
    from funcgrad.lower.schedule import KernelStep, schedule

    rng = np.random.default_rng(5)
    a, b = rng.normal(size=(24, 40)).astype(np.float32), rng.normal(size=(40, 32)).astype(np.float32)
    for fn, expected_order in ((lambda x, y: fnp.maximum(x @ y + 1.0, 0.0), True),
                               (lambda x, y: (x * 2).sum(axis=1), False)):
        ir = fg.make_ir(fn)(a, b)
        (step,) = [s for s in schedule(ir) if isinstance(s, KernelStep)]
        assert reduce_outer(step.kernel) is expected_order
        outputs = [np.empty(av.shape, av.dtype) for av in step.kernel.out_avals]
        CPUDevice().compile(step.kernel)([a, b][:len(step.kernel.in_avals)], outputs)
        reference = evaluate_kernel(step.kernel, [a, b][:len(step.kernel.in_avals)])
        np.testing.assert_allclose(outputs[0], reference[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 2, 3, 7])
def test_blocked_matrix_rows_handle_any_row_count(rows):
    """Rows are computed in blocks of ROW_BLOCK with a remainder loop; every row count, and both
    a threaded split and a single chunk, must give the reference result."""
    import funcgrad as fg
    import funcgrad.numpy as fnp
    from funcgrad.lower.schedule import KernelStep, schedule

    rng = np.random.default_rng(rows)
    a, b = rng.normal(size=(rows, 24)).astype(np.float32), rng.normal(size=(24, 48)).astype(np.float32)
    ir = fg.make_ir(lambda x, y: fnp.tanh(x @ y))(a, b)
    (step,) = [s for s in schedule(ir) if isinstance(s, KernelStep)]
    outputs = [np.empty(av.shape, av.dtype) for av in step.kernel.out_avals]
    CPUDevice().compile(step.kernel)([a, b], outputs)
    np.testing.assert_allclose(outputs[0], np.tanh(a.astype(np.float64) @ b), rtol=1e-5, atol=1e-6)


# --- the swap action: loop order of the output axes ----------------------------------------------

def test_swapped_loops_compute_the_same_values(device: CPUDevice) -> None:
    """A transposing read (channels-last to channels-first) with every order of its inner loops."""
    import attrs

    import funcgrad as fg
    import funcgrad.numpy as fnp
    from funcgrad.lower.kernel import Opt
    from funcgrad.lower.optimize import check_opts, heuristic_opts
    from funcgrad.lower.schedule import KernelStep, inline_calls, schedule

    rng = np.random.default_rng(5)
    x, y = (rng.standard_normal((3, 7, 9, 40)).astype(np.float32) for _ in range(2))
    bias = rng.standard_normal(40).astype(np.float32)

    def f(x, y, bias):  # noqa: ANN001, ANN202
        return fnp.maximum(fnp.transpose(x * y, (0, 3, 1, 2)) + bias[:, None, None], 0.0)

    ir = fg.make_ir(f)(x, y, bias)
    (kernel,) = [step.kernel for step in schedule(inline_calls(ir)) if isinstance(step, KernelStep)]
    # two large inputs are contiguous along the channels, the output along the last axis: the
    # heuristic moves the channel loop innermost
    last = len(kernel.shape) - 1  # 3, or 2 once the image's height and width merge into one loop
    assert Opt("swap", 1, last) in heuristic_opts(kernel)
    want = np.maximum(np.transpose(x * y, (0, 3, 1, 2)) + bias[:, None, None], 0.0)
    for swap in [None] + [(a, b) for a in range(1, last + 1) for b in range(a + 1, last + 1)]:
        opts = () if swap is None else (Opt("swap", *swap),)
        check_opts(kernel, opts)
        out = np.empty(want.shape, np.float32)
        device.compile(attrs.evolve(kernel, opts=opts))([x, y, bias], [out])
        np.testing.assert_array_equal(out, want)
    with pytest.raises(ValueError, match="axis 0 stays outermost"):
        check_opts(kernel, (Opt("swap", 0, last),))
    with pytest.raises(ValueError, match="reorder"):
        check_opts(kernel, (Opt("swap", 1, last), Opt("reorder")))
    np.testing.assert_array_equal(np.asarray(fg.jit(f)(x, y, bias)), want)


def test_swap_with_a_short_reduction(device: CPUDevice) -> None:
    """Max-pooling of a channels-last array read in channels-first order: the 2 x 2 window is
    unrolled, the channel loop innermost."""
    import funcgrad as fg
    import funcgrad.numpy as fnp
    from funcgrad.lower.kernel import Opt
    from funcgrad.lower.optimize import heuristic_opts

    x = np.random.default_rng(7).standard_normal((4, 16, 12, 32)).astype(np.float32)

    def pool(x):  # noqa: ANN001, ANN202
        nchw = fnp.transpose(x, (0, 3, 1, 2))
        return fnp.max(nchw.reshape(4, 32, 8, 2, 6, 2), axis=(3, 5))

    (info,) = fg.jit(pool).lower(x).kernels
    assert Opt("swap", 1, 3) in heuristic_opts(info.kernel)
    want = np.transpose(x, (0, 3, 1, 2)).reshape(4, 32, 8, 2, 6, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(np.asarray(fg.jit(pool)(x)), want)


def test_compile_many_compiles_each_source_once_in_parallel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CPUDevice.compile_many (a plan's first build): LLVM runs on several threads, one compile per
    distinct source, results equal to the evaluator's; a failure names its kernel."""
    device = CPUDevice(cache_dir=tmp_path)
    ops = ["exp", "sin", "tanh", "sqrt", "log1p"]
    kernels = [elementwise_kernel(f"k_{op}", [dtypes.float32], [alu(op, load(0, g(), dtypes.float32))], n=1 << 13)
               for op in ops]
    kernels.append(kernels[1])  # a twin: compiled once
    monkeypatch.setattr(cpu_threads, "thread_count", lambda: 2)
    compiled = device.compile_many(kernels)
    assert device.stats["compiled"] == len(ops)
    x = np.abs(sample(dtypes.float32, n=1 << 13)) + 0.5
    for kernel, done in zip(kernels, compiled):
        out = np.empty(1 << 13, np.float32)
        done([x], [out])
        (want,) = evaluate_kernel(kernel, [x])
        np.testing.assert_allclose(out, want, rtol=1e-6)

    def broken(source: str, level: int = 3) -> bytes:
        raise RuntimeError("LLVM said no")

    monkeypatch.setattr(cpu_module.host_target(), "compile_alone", broken)
    fresh = [elementwise_kernel(f"fresh_{op}", [dtypes.float32], [alu(op, load(0, g(), dtypes.float32))], n=999)
             for op in ("cos", "exp2")]
    with pytest.raises(KernelCompileError, match="kernel fresh_cos failed to compile: LLVM said no"):
        device.compile_many(fresh)


def test_merge_loops_joins_loops_that_every_index_treats_as_one(device: CPUDevice) -> None:
    """kernel.merge_loops: an elementwise kernel over contiguous arrays becomes one loop, a sum over
    an NCHW image's pixels one long inner loop (the batch loop stays apart for partial sums); a
    broadcast operand (a different stride) keeps its loops apart. Results equal the evaluator's."""
    import attrs

    from funcgrad.lower.kernel import merge_loops

    def affine(*terms: tuple[str, int]) -> KExpr:
        total = const(0, INDEX)
        for name, coefficient in terms:
            total = alu("add", total, alu("mul", var(name), const(coefficient, INDEX)))
        return total

    x = affine(("g0", 60), ("g1", 12), ("g2", 1))
    flat = Kernel("flat", (2, 5, 12), (aval((2, 5, 12), dtypes.float32),), (aval((2, 5, 12), dtypes.float32),),
                  (alu("exp", load(0, x, dtypes.float32)),))
    assert merge_loops(flat).shape == (120,)
    row = affine(("g0", 12), ("g2", 1))  # reads (2, 12), broadcast along axis 1
    broadcast = attrs.evolve(flat, in_avals=(aval((2, 12), dtypes.float32),),
                             outputs=(alu("exp", load(0, row, dtypes.float32)),))
    assert merge_loops(broadcast).shape == (2, 5, 12)
    image = affine(("g0", 36), ("r0", 108), ("r1", 6), ("r2", 1))
    pixels = Kernel("pixels", (3,), (aval((4, 3, 6, 6), dtypes.float32),), (aval((3,), dtypes.float32),),
                    (acc(dtypes.float32),), (4, 6, 6), "sum", load(0, image, dtypes.float32))
    assert merge_loops(pixels).reduce_shape == (4, 36)
    values = np.random.default_rng(9).standard_normal((4, 3, 6, 6)).astype(np.float32)
    for kernel, inputs in ((flat, [values.reshape(-1)[:120].copy()]), (pixels, [values])):
        merged = merge_loops(kernel)
        for a, b in zip(run(device, merged, inputs), evaluate_kernel(kernel, inputs)):
            np.testing.assert_allclose(a.reshape(-1), np.asarray(b).reshape(-1), rtol=1e-6)
