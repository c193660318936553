"""Accuracy of the CPU renderer's own float32 math (render_llvm's exp, tanh, logistic, written out as
vectorisable arithmetic) against float64 over a dense sweep of float32 bit patterns, both signs, with
the special values: denormal results, the overflow threshold, NaN, +-inf and -0."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from funcgrad.devices.cpu import CPUDevice
from funcgrad.ir.core import ShapedArray
from funcgrad.lower import render_loops as render_llvm_module  # the plain loops and their hints
from funcgrad.lower.kernel import Kernel, alu, load, var
from funcgrad.lower.render_llvm import render_llvm

F32 = np.dtype(np.float32)
STEP = 1 << 11  # every 2048th positive float32: ~1M values per sign, every binade covered densely
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.1754944e-38, 88.72283, 88.72284, 88.75, 89.0,
           -87.33655, -103.27893, -103.97208, -104.0, -110.0, 9.0, 9.01, 9.1, 10.0, -9.01, 0.625, -0.625,
           0.62499994, 3e38, -3e38, 1e-30, -1e-30]


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    positive = np.arange(0, 0x7F800000, STEP, dtype=np.uint32).view(np.float32)
    x = np.concatenate([positive, -positive, np.array(SPECIAL, np.float32)])
    ops = ("exp", "tanh", "logistic")
    kernel = Kernel("math_sweep", (x.size,), (ShapedArray(x.shape, F32),),
                    tuple(ShapedArray(x.shape, F32) for _ in ops),
                    tuple(alu(op, load(0, var("g0"), F32)) for op in ops))
    outputs = [np.empty_like(x) for _ in ops]
    CPUDevice(cache_dir=tmp_path_factory.mktemp("cache")).compile(kernel)([x], outputs)
    return x, dict(zip(ops, outputs))


def ulp_error(got: np.ndarray, want: np.ndarray) -> np.ndarray:
    """|got - want| in units of the float32 spacing at the rounded float64 result (the denormal
    spacing at least); 0 where both are NaN or the same infinity, inf where only one is."""
    with np.errstate(over="ignore", invalid="ignore"):
        want32 = want.astype(np.float32)
        spacing = np.maximum(np.spacing(np.abs(want32)).astype(np.float64), 2.0 ** -149)
        error = np.abs(got.astype(np.float64) - want) / spacing
    error = np.where(np.isinf(want32), np.where(got == want32, 0.0, np.inf), error)
    both_nan = np.isnan(want) & np.isnan(got)
    return np.where(both_nan, 0.0, np.where(np.isnan(want) | np.isnan(got), np.inf, error))


def test_exp_is_within_one_ulp_of_float64(sweep: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
    x, outputs = sweep
    with np.errstate(over="ignore"):
        error = ulp_error(outputs["exp"], np.exp(x.astype(np.float64)))
    worst = int(np.argmax(error))
    assert error[worst] <= 1.0, f"exp({x[worst]!r}) = {outputs['exp'][worst]!r}: {error[worst]} ulp"
    special = dict(zip(SPECIAL, outputs["exp"][-len(SPECIAL):]))
    assert special[np.inf] == np.inf and special[-np.inf] == 0.0 and special[-0.0] == 1.0
    assert special[88.75] == np.inf and special[88.72283] < np.inf  # log(FLT_MAX) = 88.7228391
    assert 0 < special[-103.27893] < 1.2e-38  # a denormal result, not flushed to zero
    assert np.isnan(outputs["exp"][np.isnan(x)]).all()


def test_exp_below_ln_2_to_the_minus_150_is_zero_and_computed_on_a_safe_input(
        sweep: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
    """Below EXP_ZERO_BELOW float32 exp rounds to +0: those lanes run the polynomial on 0 and select +0,
    so a masked score (-1e9, -inf) never scales into the underflow range (a microcode assist per element
    on Intel); just above it the results are the denormals they round to."""
    x, outputs = sweep
    got = outputs["exp"]
    below = x < render_llvm_module.EXP_ZERO_BELOW
    assert below.sum() > 1000 and (got[below] == 0).all() and not np.signbit(got[below]).any()
    assert (np.exp(x[below].astype(np.float64)) < 2.0 ** -150).all()  # what the float32 result rounds from
    at = x == np.float32(-103.27893)
    assert (got[at] > 0).all()
    source = render_llvm(Kernel("exp_only", (64,), (ShapedArray((64,), F32),), (ShapedArray((64,), F32),),
                                (alu("exp", load(0, var("g0"), F32)),)))
    compare = next(line for line in source.splitlines() if "fcmp olt float" in line)
    flag, clamped = compare.split(" = ")[0].strip(), compare.split("fcmp olt float ")[1].split(",")[0]
    safe = next(line for line in source.splitlines() if f"select i1 {flag}, float 0.0, float {clamped}" in line)
    scaled = next(line for line in source.splitlines() if "fmul float" in line and "0x3FF7154760000000" in line)
    assert safe.split(" = ")[0].strip() in scaled  # the exponent comes from the safe input, not the clamped one


def test_tanh_is_within_one_and_a_half_ulp_of_float64_and_keeps_signs(
        sweep: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
    x, outputs = sweep
    got = outputs["tanh"]
    error = ulp_error(got, np.tanh(x.astype(np.float64)))
    worst = int(np.argmax(error))
    assert error[worst] <= 1.5, f"tanh({x[worst]!r}) = {got[worst]!r}: {error[worst]} ulp"
    assert (np.signbit(got) == np.signbit(x))[~np.isnan(x)].all()  # tanh(-0) = -0, odd everywhere
    assert got[x == np.inf][0] == 1.0 and got[x == -np.inf][0] == -1.0
    assert np.isnan(got[np.isnan(x)]).all()
    assert (np.abs(got[~np.isnan(got)]) <= 1).all()


def test_logistic_is_within_an_ulp_of_one_half_of_float64(sweep: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
    # logistic is 0.5 * tanh(x / 2) + 0.5, as the reference interpreter computes it: absolute error
    x, outputs = sweep
    got = outputs["logistic"].astype(np.float64)
    want = 0.5 * np.tanh(0.5 * x.astype(np.float64)) + 0.5
    finite = ~np.isnan(x)
    assert np.abs(got - want)[finite].max() <= 2.0 ** -24
    assert np.isnan(got[~finite]).all()


def test_exp_and_tanh_use_fused_multiply_adds_and_ldexp_not_integer_scaling() -> None:
    x = load(0, var("g0"), F32)
    kernel = Kernel("shape", (64,), (ShapedArray((64,), F32),), (ShapedArray((64,), F32),) * 2,
                    (alu("exp", x), alu("tanh", x)))
    source = render_llvm(kernel)
    assert source.count("@llvm.ldexp.f32.i32(") == 3  # two calls and the declaration
    assert "@llvm.fmuladd.f32" in source and " shl i32 " not in source
    assert source.count("fdiv") == 1  # tanh's 2 / (exp(2|x|) + 1); exp divides nothing


def test_elementwise_inline_math_loops_interleave_four_vectors_with_the_same_bits(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sweep: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
    """An elementwise loop computing float32 exp/tanh/logistic asks LLVM for 4 vectors per iteration (the
    polynomials are latency-bound chains); the hint changes the schedule, never an element's bits."""
    x, with_hint = sweep
    ops = ("exp", "tanh", "logistic")
    kernel = Kernel("math_sweep", (x.size,), (ShapedArray(x.shape, F32),),
                    tuple(ShapedArray(x.shape, F32) for _ in ops),
                    tuple(alu(op, load(0, var("g0"), F32)) for op in ops))
    assert '!"llvm.loop.interleave.count", i32 4' in render_llvm(kernel)
    plain = Kernel("plain", (64,), (ShapedArray((64,), F32),), (ShapedArray((64,), F32),),
                   (alu("mul", load(0, var("g0"), F32), load(0, var("g0"), F32)),))
    assert "interleave" not in render_llvm(plain)  # nothing to hide: LLVM's own choice
    monkeypatch.setattr(render_llvm_module, "_interleave_hints", lambda kernel, choices: ())
    assert "interleave" not in render_llvm(kernel)
    outputs = [np.empty_like(x) for _ in ops]
    CPUDevice(cache_dir=tmp_path).compile(kernel)([x], outputs)
    for op, got in zip(ops, outputs):
        assert got.tobytes() == with_hint[op].tobytes(), op
