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


def compiled_ops(tmp_path_factory: pytest.TempPathFactory, name: str, x: np.ndarray,
                 ops: tuple[str, ...]) -> dict[str, np.ndarray]:
    """Each of ``ops`` applied to ``x`` by one compiled CPU kernel (an output per op)."""
    kernel = Kernel(name, (x.size,), (ShapedArray(x.shape, F32),), tuple(ShapedArray(x.shape, F32) for _ in ops),
                    tuple(alu(op, load(0, var("g0"), F32)) for op in ops))
    outputs = [np.empty_like(x) for _ in ops]
    CPUDevice(cache_dir=tmp_path_factory.mktemp("cache")).compile(kernel)([x], outputs)
    return dict(zip(ops, outputs))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    positive = np.arange(0, 0x7F800000, STEP, dtype=np.uint32).view(np.float32)
    x = np.concatenate([positive, -positive, np.array(SPECIAL, np.float32)])
    return x, compiled_ops(tmp_path_factory, "math_sweep", x, ("exp", "tanh", "logistic"))


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


LOG_OPS = ("log", "log2", "log1p", "expm1")
LOG_SPECIAL = [1.0, -1.0, 2.0, 0.5, -0.5, -2.0, 1e-8, -1e-8, 2.0 ** -24, -(2.0 ** -25), 0.70710677, 1.4142135,
               -17.4, -20.0, -21.0, 88.72, 88.73, 1e-38, 1.17549435e-38]


@pytest.fixture(scope="module")
def log_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """log, log2, log1p and expm1 over the sweep, every power of two, and their own edge values."""
    positive = np.arange(0, 0x7F800000, STEP, dtype=np.uint32).view(np.float32)
    powers = np.ldexp(np.float32(1.0), np.arange(-149, 128)).astype(np.float32)
    x = np.concatenate([positive, -positive, powers, np.array(SPECIAL + LOG_SPECIAL, np.float32)])
    return x, compiled_ops(tmp_path_factory, "log_sweep", x, LOG_OPS)


# the worst errors over every 256th float32 (8.4 M values a sign): log 0.82, log2 1.18, log1p 0.82,
# expm1 1.42 ulp (NumPy's own float32 loops there: 3.19, 2.04, 1.16, 2.54)
@pytest.mark.parametrize(("op", "bound"), [("log", 1.0), ("log2", 1.25), ("log1p", 1.0), ("expm1", 1.5)])
def test_log_family_is_within_its_bound_of_float64(log_sweep: tuple[np.ndarray, dict[str, np.ndarray]],
                                                   op: str, bound: float) -> None:
    x, outputs = log_sweep
    got = outputs[op]
    with np.errstate(all="ignore"):
        want = getattr(np, op)(x.astype(np.float64))
        error = ulp_error(got, want)
    worst = int(np.argmax(error))
    assert error[worst] <= bound, f"{op}({x[worst]!r}) = {got[worst]!r}, want {want[worst]!r}: {error[worst]} ulp"
    zeros = want == 0
    assert (np.signbit(got[zeros]) == np.signbit(want[zeros])).all()  # log1p(-0) = expm1(-0) = -0


def test_log_family_special_values(log_sweep: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
    x, outputs = log_sweep

    def at(op: str, value: float) -> float:
        return float(outputs[op][np.flatnonzero(x.view(np.uint32) == np.float32(value).view(np.uint32))[0]])

    for op in ("log", "log2"):
        assert at(op, 0.0) == -np.inf and at(op, -0.0) == -np.inf and at(op, np.inf) == np.inf
        assert np.isnan(at(op, -1.0)) and np.isnan(at(op, -np.inf)) and np.isnan(at(op, -1e-45))
    assert at("log", 1e-45) == np.float32(np.log(np.float64(np.float32(1e-45))))  # 2^-149, scaled first
    powers = np.ldexp(np.float32(1.0), np.arange(-149, 128)).astype(np.float32)
    assert [at("log2", p) for p in powers] == list(range(-149, 128))  # exact at every power of two
    assert at("log", 1.0) == 0.0 and not np.signbit(at("log", 1.0))
    assert at("log1p", -1.0) == -np.inf and at("log1p", np.inf) == np.inf and np.isnan(at("log1p", -2.0))
    assert np.isnan(at("log1p", -np.inf)) and at("log1p", 1e-8) == np.float32(1e-8)
    assert at("expm1", np.inf) == np.inf and at("expm1", -np.inf) == -1.0 and at("expm1", 88.73) == np.inf
    assert at("expm1", -20.0) == -1.0 and at("expm1", 2.0 ** -24) == np.float32(2.0 ** -24)
    for op in LOG_OPS:
        assert np.isnan(outputs[op][np.isnan(x)]).all(), op


def test_log_family_is_arithmetic_the_loop_vectoriser_can_widen() -> None:
    """No libm call or scalar-only intrinsic is left: LLVM's loop vectoriser widens the loop to AVX-512
    (llvm.log.f32 and @log1pf are a scalar call per element, 3-10x slower: docs/performance.md)."""
    x = load(0, var("g0"), F32)
    kernel = Kernel("logs", (64,), (ShapedArray((64,), F32),), tuple(ShapedArray((64,), F32) for _ in LOG_OPS),
                    tuple(alu(op, x) for op in LOG_OPS))
    source = render_llvm(kernel)
    for call in ("@llvm.log.", "@llvm.log2.", "@llvm.exp.", "@log1pf", "@expm1f", "@logf"):
        assert call not in source, call
    assert '!"llvm.loop.interleave.count", i32 4' in source  # latency-bound chains, as exp's


TRIG_OPS = ("sin", "cos")


@pytest.fixture(scope="module")
def trig_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """sin and cos over the sweep, the float32 nearest to k pi/2 (k < 2^21: the reductions' hardest
    inputs below 2^20 and past it), both sides of TRIG_LARGE, and the powers of two."""
    positive = np.arange(0, 0x7F800000, STEP, dtype=np.uint32).view(np.float32)
    near = (np.arange(1, 1 << 21, 7, dtype=np.float64) * (np.pi / 2)).astype(np.float32)
    edge = np.float32(render_llvm_module.TRIG_LARGE)
    around = np.nextafter(np.float32([edge, edge]), np.float32([0, np.inf]))
    powers = np.ldexp(np.float32(1.0), np.arange(-149, 128)).astype(np.float32)
    x = np.concatenate([positive, -positive, near, -near, around, -around, np.float32([edge, -edge]), powers,
                        -powers, np.array(SPECIAL, np.float32)])
    return x, compiled_ops(tmp_path_factory, "trig_sweep", x, TRIG_OPS)


@pytest.mark.parametrize("op", TRIG_OPS)
def test_sin_and_cos_round_to_within_half_an_ulp_and_a_little_for_every_magnitude(
        trig_sweep: tuple[np.ndarray, dict[str, np.ndarray]], op: str) -> None:
    """Over every 256th float32 the worst was 0.50010 ulp (sin at 3.3e37) and 0.50007 (cos at 4.5e17):
    double from the reduction on, and Payne and Hanek's reduction from 2^20 up to FLT_MAX (NumPy's own
    float32 loops there: 1.46 and 1.43 ulp)."""
    x, outputs = trig_sweep
    got = outputs[op]
    with np.errstate(invalid="ignore"):
        want = getattr(np, op)(x.astype(np.float64))  # glibc reduces float64 exactly
        error = ulp_error(got, want)
    worst = int(np.argmax(error))
    assert error[worst] <= 0.501, f"{op}({x[worst]!r}) = {got[worst]!r}, want {want[worst]!r}: {error[worst]} ulp"
    finite = np.isfinite(x)
    assert np.isnan(got[~finite]).all() and (np.abs(got[finite]) <= 1).all()


def test_sin_and_cos_special_values(trig_sweep: tuple[np.ndarray, dict[str, np.ndarray]]) -> None:
    x, outputs = trig_sweep
    sin, cos = outputs["sin"], outputs["cos"]
    zero, negative_zero = x.view(np.uint32) == 0, x.view(np.uint32) == 0x80000000
    assert (sin[zero] == 0).all() and not np.signbit(sin[zero]).any()
    assert (sin[negative_zero] == 0).all() and np.signbit(sin[negative_zero]).all()  # sin(-0) = -0
    assert (cos[zero | negative_zero] == 1).all()
    tiny = (np.abs(x) < 2.0 ** -12) & (x != 0)
    assert (sin[tiny] == x[tiny]).all() and (cos[tiny] == 1).all()  # denormals included
    for op in TRIG_OPS:
        got = outputs[op]
        assert np.isnan(got[np.isinf(x)]).all() and np.isnan(got[np.isnan(x)]).all(), op
    half = len(np.arange(0, 0x7F800000, STEP))  # the sweep's positive half, then its negation
    assert sin[:half].tobytes() == (-sin[half:2 * half]).tobytes()  # odd, bit for bit
    assert cos[:half].tobytes() == cos[half:2 * half].tobytes()  # even


def test_sin_and_cos_are_arithmetic_the_loop_vectoriser_can_widen() -> None:
    x = load(0, var("g0"), F32)
    kernel = Kernel("trig", (64,), (ShapedArray((64,), F32),), tuple(ShapedArray((64,), F32) for _ in TRIG_OPS),
                    tuple(alu(op, x) for op in TRIG_OPS))
    source = render_llvm(kernel)
    for call in ("@llvm.sin.", "@llvm.cos.", "@sinf", "@cosf", "@llvm.sin.f64"):
        assert call not in source, call
    assert " constant [" not in source  # 2/pi's words are selected among constants, not gathered from a table
    assert '!"llvm.loop.interleave.count", i32 4' in source


@pytest.fixture(scope="module")
def erf_sweep(tmp_path_factory: pytest.TempPathFactory) -> tuple[np.ndarray, np.ndarray]:
    """erf over the sweep and, densely, every 64th float32 below 4.5 (where it is not yet 1)."""
    positive = np.arange(0, 0x7F800000, STEP, dtype=np.uint32).view(np.float32)
    dense = np.arange(0, 0x40900000, 64, dtype=np.uint32).view(np.float32)
    split = np.float32(render_llvm_module.ERF_SPLIT)
    edges = np.float32([split, np.nextafter(split, np.float32(0)), 3.92, 4.0, 4.5])
    x = np.concatenate([positive, -positive, dense, -dense, edges, -edges, np.array(SPECIAL, np.float32)])
    return x, compiled_ops(tmp_path_factory, "erf_sweep", x, ("erf",))["erf"]


def test_erf_is_within_one_ulp_of_float64(erf_sweep: tuple[np.ndarray, np.ndarray]) -> None:
    """Every 16th float32 below 5 (152 M values) gave 0.982 ulp at worst (at 0.941, just past the split)."""
    special = pytest.importorskip("scipy.special")
    x, got = erf_sweep
    want = special.erf(x.astype(np.float64))
    error = ulp_error(got, want)
    worst = int(np.argmax(error))
    assert error[worst] <= 1.0, f"erf({x[worst]!r}) = {got[worst]!r}, want {want[worst]!r}: {error[worst]} ulp"


def test_erf_special_values_and_symmetry(erf_sweep: tuple[np.ndarray, np.ndarray]) -> None:
    x, got = erf_sweep
    bits = x.view(np.uint32)
    assert (got[bits == 0] == 0).all() and not np.signbit(got[bits == 0]).any()
    assert (got[bits == 0x80000000] == 0).all() and np.signbit(got[bits == 0x80000000]).all()  # erf(-0) = -0
    assert (got[x == np.inf] == 1).all() and (got[x == -np.inf] == -1).all() and np.isnan(got[np.isnan(x)]).all()
    assert (got[np.abs(x) >= 3.92] == np.sign(x[np.abs(x) >= 3.92])).all()  # rounds to +-1 from 3.92
    tiny = (np.abs(x) < 2.0 ** -30) & (x != 0)
    assert (np.abs(got[tiny]) >= np.abs(x[tiny])).all()  # 2/sqrt(pi) x, denormals not flushed
    half = len(np.arange(0, 0x7F800000, STEP))
    assert got[:half].tobytes() == (-got[half:2 * half]).tobytes()  # odd, bit for bit
    assert (np.abs(got[np.isfinite(x)]) <= 1).all()


def test_erf_is_arithmetic_the_loop_vectoriser_can_widen() -> None:
    kernel = Kernel("erf", (64,), (ShapedArray((64,), F32),), (ShapedArray((64,), F32),),
                    (alu("erf", load(0, var("g0"), F32)),))
    source = render_llvm(kernel)
    assert "@erff" not in source and '!"llvm.loop.interleave.count", i32 4' in source
