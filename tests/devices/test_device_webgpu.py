"""The WGSL renderer and the WEBGPU device, checked against the NumPy kernel evaluator and NumPy.

Kernels are built by hand (as in test_render_llvm.py) and run on WEBGPU and by ``evaluate_kernel``.
Integers and bools must agree bit for bit. Floats: each float32 op has a documented tolerance
(``FLOAT32_TOLERANCE``: 4 ulp for the transcendental functions, which the renderer writes out
because the driver's are rough); float16 and bfloat16 results may be one unit of
their last place off (a float32 value a few ulps off rounds the other way). Subnormal floats may be
flushed to zero by the driver, so inputs avoid them (and results near them get an absolute
tolerance of the smallest normal float32). Many ops go into one kernel, since
compiling a shader costs ~0.1 s.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_render_llvm import aval, check, defined, elementwise_kernel, g, reduction_kernel, sample, ulp_distance

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir import dtypes
from funcgrad.lower.kernel import (
    BINARY,
    BOOL,
    INDEX,
    UNARY,
    Kernel,
    acc,
    alu,
    bitcast,
    cast,
    const,
    evaluate_kernel,
    load,
    var,
)

webgpu = pytest.importorskip("funcgrad.devices.webgpu")
USABLE, REASON = webgpu.probe()
pytestmark = pytest.mark.skipif(not USABLE, reason=f"WEBGPU unavailable: {REASON}")

DTYPES = (dtypes.float32, dtypes.int32, dtypes.bool_, dtypes.uint8, dtypes.int8, dtypes.int16, dtypes.uint16,
          dtypes.uint32, dtypes.float16, dtypes.bfloat16)
TINY = float(np.finfo(np.float32).tiny)

# float32 tolerance per op as (ulps, relative, absolute); a result passes when any one holds.
# exact: neg abs sign sqrt rsqrt floor ceil round add sub mul div rem max min (and comparisons).
FLOAT32_TOLERANCE: dict[str, tuple[float, float, float]] = {
    **{op: (4, 0, TINY) for op in ("exp", "exp2", "expm1", "log", "log2", "log1p", "sin", "cos", "tan", "asin", "acos",
                                   "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "atan2", "pow")},
    "logistic": (4, 0, 4 * float(np.finfo(np.float32).eps)),  # 0.5 tanh(x/2) + 0.5, as the reference
}


def test_the_adapter_in_use_is_named() -> None:
    """Every test here runs on whichever adapter wgpu picks; the probe (and the pytest header) names it."""
    name, _, backend = REASON.partition(" via ")
    assert name not in ("", "?") and backend in ("Vulkan", "OpenGL", "Metal", "D3D12"), REASON


@pytest.fixture(scope="module")
def device() -> webgpu.WebGPUDevice:
    return webgpu.WebGPUDevice()


def run(device: webgpu.WebGPUDevice, kernel: Kernel, inputs: list[np.ndarray]) -> list[np.ndarray]:
    outputs = [np.empty(a.shape, a.dtype) for a in kernel.out_avals]
    device.compile(kernel)(inputs, outputs)
    return outputs


def normal_sample(dtype: np.dtype, seed: int = 0, small: bool = False, n: int = 256) -> np.ndarray:
    """``sample`` with subnormal floats replaced (the driver may flush them) and trig-sized values."""
    values = sample(dtype, n=n, seed=seed, small=small)
    if np.dtype(dtype).kind == "f" or dtype == dtypes.bfloat16:
        wide = values.astype(np.float32)
        wide = np.where((np.abs(wide) < TINY) & (wide != 0), 1e-30, wide)
        values = wide.astype(dtype)
    return values


def compare(label: str, op: str, got: np.ndarray, want: np.ndarray) -> str | None:
    """None when ``got`` is within ``op``'s tolerance of ``want``."""
    if got.dtype.kind in "biu" or op in ("eq", "ne", "lt", "le", "gt", "ge", "is_finite"):
        return check(label, got, want)
    if got.dtype != np.float32:  # float16 / bfloat16: one unit in their last place
        atol = FLOAT32_TOLERANCE["logistic"][2] if op == "logistic" else TINY
        return check(label, got, want, max_ulp=1 if op in FLOAT32_TOLERANCE else 0, atol=atol)
    ulps, rtol, atol = FLOAT32_TOLERANCE.get(op, (0, 0, 0))
    wide_got, wide_want = got.astype(np.float64), want.astype(np.float64)
    with np.errstate(invalid="ignore"):
        error = np.abs(wide_got - wide_want)
        ok = (got == want) | (ulp_distance(got, want) <= ulps) | (error <= atol) \
            | (error <= rtol * np.abs(wide_want))
    if ok.all():
        return None
    first = int(np.argwhere(~ok)[0][0])
    return f"{label}: {int((~ok).sum())} mismatches, e.g. at {first} got {got[first]!r} expected {want[first]!r}"


# --- the op grid ----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dt: dt.name)
def test_unary_ops_match_reference(device: webgpu.WebGPUDevice, dtype: np.dtype) -> None:
    ops = [op for op in UNARY if defined(op, dtype)]
    x = load(0, g(), dtype)
    kernel = elementwise_kernel(f"unary_{dtype.name}", [dtype],
                                [alu(op, x, dtype=BOOL if op == "is_finite" else None) for op in ops])
    inputs = [normal_sample(dtype)]
    failures = [compare(op, op, got, want) for op, got, want in
                zip(ops, run(device, kernel, inputs), evaluate_kernel(kernel, inputs))]
    assert ops and not any(failures), [f for f in failures if f]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda dt: dt.name)
def test_binary_ops_match_reference(device: webgpu.WebGPUDevice, dtype: np.dtype) -> None:
    ops = [op for op in BINARY if defined(op, dtype, dtype)]
    x, y, small = load(0, g(), dtype), load(1, g(), dtype), load(2, g(), dtype)
    exprs, labels = [alu(op, x, y) for op in ops], list(ops)
    if dtype.kind in "iu":  # shifts and powers by amounts around the bit width
        exprs += [alu(op, x, small) for op in ("shift_left", "shift_right", "pow")]
        labels += ["shift_left (small)", "shift_right (small)", "pow (small)"]
    kernel = elementwise_kernel(f"binary_{dtype.name}", [dtype] * 3, exprs)
    inputs = [normal_sample(dtype, seed=1), normal_sample(dtype, seed=2), normal_sample(dtype, seed=3, small=True)]
    if dtype.kind in "iu":  # division by zero and MIN / -1 for certain
        inputs[1][:4] = [0, 0, -1 if dtype.kind == "i" else 0, 1]
        inputs[0][:4] = [5, np.iinfo(dtype).min, np.iinfo(dtype).min, 3]
    failures = [compare(label, label.split()[0], got, want) for label, got, want in
                zip(labels, run(device, kernel, inputs), evaluate_kernel(kernel, inputs))]
    assert ops and not any(failures), [f for f in failures if f]


def test_nan_infinity_and_signed_zero_semantics(device: webgpu.WebGPUDevice) -> None:
    # the driver compiles comparisons as ordered and folds x != x, 0 / y and x / 0.0 (to 0)
    f32 = np.dtype(np.float32)
    x, y = load(0, g(), f32), load(1, g(), f32)
    ops = ["max", "min", "ne", "eq", "lt", "div", "atan2"]
    kernel = elementwise_kernel("specials", [f32, f32], [alu(op, x, y) for op in ops] + [
        alu("div", x, const(0.0, f32)), alu("div", const(0.0, f32), y), cast(x, np.dtype(np.int32)),
        alu("is_finite", x, dtype=BOOL)], n=8)
    a = np.array([np.nan, 1.0, 0.0, -0.0, np.inf, -1.0, 0.0, -np.inf], np.float32)
    b = np.array([1.0, np.nan, -0.0, 0.0, np.inf, 0.0, 0.0, 3e9], np.float32)
    labels = ops + ["div by constant 0", "constant 0 / y", "to int32", "is_finite"]
    for label, got, want in zip(labels, run(device, kernel, [a, b]), evaluate_kernel(kernel, [a, b])):
        assert check(label, got, want) is None, check(label, got, want)
        if got.dtype.kind == "f":  # signed zeros too (a NaN's sign is not specified)
            numbers = ~np.isnan(want)
            assert np.array_equal(np.signbit(got[numbers]), np.signbit(want[numbers])), (label, got, want)


def test_trig_of_huge_arguments_reduces_exactly(device: webgpu.WebGPUDevice) -> None:
    # the driver's sin(3e38) is -1; Payne-Hanek reduction with 2/pi's bits keeps every float32 right
    f32 = np.dtype(np.float32)
    x = np.exp(np.random.default_rng(3).uniform(0, np.log(3e38), 512)).astype(np.float32)
    x[:4] = [3.4028235e38, 2.0**100, 1e10, 8.0e6 + 0.5]
    ops = ("sin", "cos", "tan")
    kernel = elementwise_kernel("trig", [f32], [alu(op, load(0, g(), f32)) for op in ops], n=x.size)
    for op, got, want in zip(ops, run(device, kernel, [x]), evaluate_kernel(kernel, [x])):
        assert ulp_distance(got, want).max() <= 4, (op, x[np.argmax(ulp_distance(got, want))])


def test_fmod_is_exact_where_x_minus_y_trunc_x_over_y_is_not(device: webgpu.WebGPUDevice) -> None:
    f32 = np.dtype(np.float32)
    a = np.array([1.0, 3e38, -3e38, 7.5, -0.0, 1e-30, 5.0, np.nan, 1.0], np.float32)
    b = np.array([0.1, 1e-3, 7e-5, -2.0, 3.0, 3e-31, np.inf, 1.0, np.nan], np.float32)
    kernel = elementwise_kernel("fmod", [f32, f32], [alu("rem", load(0, g(), f32), load(1, g(), f32))], n=a.size)
    (got,) = run(device, kernel, [a, b])
    with np.errstate(invalid="ignore"):
        assert np.array_equal(got, np.fmod(a, b), equal_nan=True), (got, np.fmod(a, b))
    assert np.array_equal(np.signbit(got[:7]), np.signbit(np.fmod(a, b)[:7]))


@pytest.mark.parametrize("source", DTYPES, ids=lambda dt: dt.name)
def test_casts_match_reference(device: webgpu.WebGPUDevice, source: np.dtype) -> None:
    x = load(0, g(), source)
    targets = [t for t in DTYPES if t != source]
    kernel = elementwise_kernel(f"cast_{source.name}", [source], [cast(x, t) for t in targets])
    values = normal_sample(source)
    if source.kind == "f" or source == dtypes.bfloat16:  # saturation and NaN for every integer target
        with np.errstate(over="ignore"):  # 1e10 is infinite in float16
            values[-6:] = np.array([1e10, -1e10, np.nan, 300.7, -129.5, 65535.9]).astype(source)
    inputs = [values]
    failures = [check(t.name, got, want, atol=TINY if t.kind == "f" else 0) for t, got, want in
                zip(targets, run(device, kernel, inputs), evaluate_kernel(kernel, inputs))]
    assert not any(failures), [f for f in failures if f]


def test_bitcasts_match_reference(device: webgpu.WebGPUDevice) -> None:
    pairs = [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.uint32, dtypes.float32),
             (dtypes.int8, dtypes.uint8), (dtypes.uint8, dtypes.int8), (dtypes.float16, dtypes.int16),
             (dtypes.int16, dtypes.float16), (dtypes.bfloat16, dtypes.uint16), (dtypes.uint16, dtypes.bfloat16)]
    kernel = elementwise_kernel("bitcasts", [a for a, _ in pairs], [bitcast(load(i, g(), a), b)
                                                                  for i, (a, b) in enumerate(pairs)])
    inputs = [normal_sample(a, seed=i) for i, (a, _) in enumerate(pairs)]
    inputs[1] = np.abs(inputs[1]) % (1 << 23) + (100 << 23)  # int bits of normal, finite floats
    inputs[2] = (np.abs(inputs[2].astype(np.int64)) % (1 << 23) + (100 << 23)).astype(np.uint32)
    inputs[6] = (np.abs(inputs[6].astype(np.int32)) % 0x7000 + 0x0400).astype(np.int16)
    inputs[8] = (inputs[8] % 0x7000 + 0x0080).astype(np.uint16)
    failures = [check(f"{a.name}->{b.name}", got, want) for (a, b), got, want in
                zip(pairs, run(device, kernel, inputs), evaluate_kernel(kernel, inputs))]
    assert not any(failures), [f for f in failures if f]


# --- reductions and kernels with loops --------------------------------------------------------------

@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.uint8, dtypes.int8, dtypes.bool_,
                                   dtypes.float16], ids=lambda dt: dt.name)
def test_reductions_match_reference(device: webgpu.WebGPUDevice, dtype: np.dtype) -> None:
    shape = (3, 37, 4)
    for op in ("sum", "prod", "max", "min"):
        kernel = reduction_kernel(f"reduce_{op}_{dtype.name}", op, dtype, shape, epilogue=True)
        values = normal_sample(dtype, n=int(np.prod(shape))).reshape(shape)
        if dtype.kind == "f":
            values = np.where(np.isfinite(values.astype(np.float32)), values, 1).astype(dtype)
            if op == "prod":
                values = (np.sign(values.astype(np.float32)) * 1.05).astype(dtype)
            else:
                values = np.clip(values.astype(np.float32), -100, 100).astype(dtype)
        bias = normal_sample(dtype, seed=7, n=shape[2])
        if dtype.kind == "f":
            bias = np.clip(np.nan_to_num(bias.astype(np.float32)), -100, 100).astype(dtype)
        (got,), (want,) = run(device, kernel, [values, bias]), evaluate_kernel(kernel, [values, bias])
        if dtype.kind == "f" and op in ("sum", "prod"):  # summation order differs from NumPy's pairwise sum
            rtol = 1e-2 if dtype == dtypes.float16 else 1e-5
            np.testing.assert_allclose(got.astype(np.float64), want.astype(np.float64), rtol=rtol,
                                       atol=rtol * float(np.abs(values.astype(np.float64)).sum()))
        else:
            assert check(op, got, want) is None, check(op, got, want)


def test_empty_reduction_and_nan_propagation(device: webgpu.WebGPUDevice) -> None:
    f32 = np.dtype(np.float32)
    for op, identity in (("sum", 0.0), ("prod", 1.0), ("max", -np.inf), ("min", np.inf)):
        empty = reduction_kernel(f"empty_{op}", op, f32, (2, 0, 3))
        (got,) = run(device, empty, [np.zeros((2, 0, 3), f32)])
        assert np.array_equal(got, np.full((2, 3), identity, f32)), (op, got)
    values = np.ones((2, 5, 3), f32)
    values[1, 2, 0] = np.nan
    for op in ("max", "min", "sum"):
        (got,) = run(device, reduction_kernel(f"nan_{op}", op, f32, (2, 5, 3)), [values])
        assert np.isnan(got[1, 0]) and not np.isnan(np.delete(got.reshape(-1), 3)).any(), (op, got)


def test_two_reduce_axes_into_a_scalar(device: webgpu.WebGPUDevice) -> None:
    shape = (5, 7)
    value = load(0, alu("add", alu("mul", var("r0"), const(7, INDEX)), var("r1")), np.dtype(np.int32))
    kernel = Kernel("total", (), (aval(shape, np.int32),), (aval((), np.int32),), (acc(np.dtype(np.int32)),), shape,
                    "sum", value)
    values = np.arange(35, dtype=np.int32).reshape(shape)
    assert run(device, kernel, [values])[0] == values.sum()


def test_large_dispatch_uses_a_two_dimensional_grid(device: webgpu.WebGPUDevice) -> None:
    assert webgpu.dispatch_grid(64 * 65535) == (65535, 1, 1)
    assert webgpu.dispatch_grid(64 * 65535 + 1) == (65535, 2, 1)
    n = 64 * 65535 + 1000  # past one row of workgroups
    f32 = np.dtype(np.float32)
    kernel = elementwise_kernel("big", [f32], [alu("add", load(0, g(), f32), const(1.0, f32))], n=n)
    x = np.arange(n, dtype=np.float32)
    (got,) = run(device, kernel, [x])
    assert np.array_equal(got, x + 1)


# --- programs through plans: movement ops, matmul, softmax, an MLP's gradient under jit ---------------

def on_webgpu(*arrays: np.ndarray) -> list[fg.Tensor]:
    return [fg.device_put(a, "WEBGPU") for a in arrays]


def test_movement_ops_matmul_and_softmax(device: webgpu.WebGPUDevice) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    x, y = on_webgpu(a, b)
    cases = {
        "transpose+reshape": (x.T.reshape(4, 12), a.T.reshape(4, 12), 0),
        "slice+flip": (x[1:5, ::-2], a[1:5, ::-2], 0),
        "pad": (fnp.pad(x, ((1, 0), (0, 2))), np.pad(a, ((1, 0), (0, 2))), 0),
        "broadcast": (x[:, None, :] + x[None, :, :], a[:, None, :] + a[None, :, :], 0),
        "concatenate": (fnp.concatenate([x, x * 2], axis=1), np.concatenate([a, a * 2], axis=1), 0),
        "matmul": (x @ y, a @ b, 1e-5),
        "softmax": (x.softmax(-1), np.exp(a - a.max(-1, keepdims=True)) /
                    np.exp(a - a.max(-1, keepdims=True)).sum(-1, keepdims=True), 1e-5),
    }
    for label, (result, expected, rtol) in cases.items():
        assert result.device == "WEBGPU", label
        np.testing.assert_allclose(result.numpy(), expected, rtol=rtol, atol=rtol, err_msg=label)


def test_mlp_gradient_under_jit_matches_cpu(device: webgpu.WebGPUDevice) -> None:
    rng = np.random.default_rng(1)
    params = {"w1": rng.standard_normal((4, 16)).astype(np.float32) * 0.5, "b1": np.zeros(16, np.float32),
              "w2": rng.standard_normal((16, 3)).astype(np.float32) * 0.5, "b2": np.zeros(3, np.float32)}
    data = rng.standard_normal((10, 4)).astype(np.float32)

    def loss(p: dict, x: fg.Tensor) -> fg.Tensor:
        hidden = fnp.tanh(x @ p["w1"] + p["b1"])
        return ((hidden @ p["w2"] + p["b2"]) ** 2).mean()

    step = fg.jit(fg.value_and_grad(loss))
    value, grads = step(fg.device_put(params, "WEBGPU"), fg.device_put(data, "WEBGPU"))
    want_value, want_grads = step(fg.device_put(params, "CPU"), fg.device_put(data, "CPU"))
    assert grads["w1"].device == "WEBGPU"
    np.testing.assert_allclose(value.numpy(), want_value.numpy(), rtol=1e-5)
    for name in params:
        np.testing.assert_allclose(grads[name].numpy(), want_grads[name].numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


# (residency of plans: tests/devices/test_devices.py, on every resident device)


# --- limits and errors ------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [dtypes.float64, dtypes.int64, dtypes.uint64], ids=lambda dt: dt.name)
def test_64_bit_arrays_are_refused_naming_webgpu(device: webgpu.WebGPUDevice, dtype: np.dtype) -> None:
    kernel = elementwise_kernel(f"wide_{dtype.name}", [dtype], [alu("add", load(0, g(), dtype), load(0, g(), dtype))])
    with pytest.raises(webgpu.WebGPUError, match=f"WEBGPU cannot .*{dtype.name}"):
        device.compile(kernel)


def test_sizes_beyond_i32_indexing_are_refused(device: webgpu.WebGPUDevice) -> None:
    f32 = np.dtype(np.float32)
    kernel = elementwise_kernel("huge", [f32], [load(0, g(), f32)], n=2**31)
    with pytest.raises(webgpu.WebGPUError, match="2\\^31"):
        device.compile(kernel)


def test_buffers_over_the_binding_limit_are_refused(device: webgpu.WebGPUDevice,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    f32 = np.dtype(np.float32)
    compiled = device.compile(elementwise_kernel("limited", [f32], [load(0, g(), f32)], n=512))
    monkeypatch.setattr(device, "max_binding_size", 1024)
    with pytest.raises(webgpu.WebGPUError, match="2048-byte .*max_storage_buffer_binding_size of 1024"):
        compiled([np.zeros(512, f32)], [np.empty(512, f32)])


def test_kernels_with_more_arrays_than_bindings_pack_them_by_dtype(device: webgpu.WebGPUDevice,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # a wide fusion can read ~40 arrays; the device has 32 bindings
    kinds = [dtypes.float32, dtypes.int32, dtypes.uint8, dtypes.bool_] * 10
    loads = [load(i, g(), dt) for i, dt in enumerate(kinds)]
    total = loads[0]
    for item in loads[1:]:
        total = alu("add", total, cast(item, np.float32))
    outputs = [total, alu("lt", total, const(0.0, np.dtype(np.float32))), cast(loads[1], np.float32)]
    kernel = elementwise_kernel("wide", kinds, outputs, n=64)
    inputs = [normal_sample(dt, seed=i, n=64) for i, dt in enumerate(kinds)]
    inputs = [np.nan_to_num(x, nan=1.0, posinf=1.0, neginf=-1.0).astype(x.dtype) for x in inputs]
    inputs = [np.clip(x, -100, 100).astype(x.dtype) if x.dtype.kind == "f" else x for x in inputs]
    want = evaluate_kernel(kernel, inputs)
    for limit in (32, 5):  # 5: the outputs are packed too (three input and two output storage types)
        monkeypatch.setattr(device, "max_buffers", limit)
        compiled = device.compile(kernel)
        assert len(compiled.layout.bindings) <= limit
        for got, expected in zip(run(device, kernel, inputs), want):
            np.testing.assert_allclose(got, expected, rtol=1e-6)
    monkeypatch.setattr(device, "max_buffers", 4)
    with pytest.raises(webgpu.WebGPUError, match="needs 5 storage buffers even packed by dtype"):
        device.compile(kernel)


def test_shader_compile_errors_show_the_device_message(device: webgpu.WebGPUDevice,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    f32 = np.dtype(np.float32)
    kernel = elementwise_kernel("broken", [f32], [load(0, g(), f32)], n=4)
    monkeypatch.setattr(webgpu, "render_wgsl", lambda kernel, layout: "fn main( {")
    with pytest.raises(webgpu.WebGPUError, match="kernel broken failed to compile on WEBGPU: (?s:.*)expected"):
        device.compile(kernel)


def test_pipelines_are_cached_by_source(device: webgpu.WebGPUDevice) -> None:
    f32 = np.dtype(np.float32)
    kernel = elementwise_kernel("cached", [f32], [alu("mul", load(0, g(), f32), const(3.0, f32))], n=16)
    first = device.compile(kernel)
    cached = device.stats["cached"]
    second = device.compile(kernel)
    assert second.pipeline is first.pipeline and device.stats["cached"] == cached + 1
    (got,) = run(device, kernel, [np.arange(16, dtype=np.float32)])
    assert np.array_equal(got, np.arange(16, dtype=np.float32) * 3)


def test_low_precision_storage_round_trips(device: webgpu.WebGPUDevice) -> None:
    # float16/bfloat16 travel as float32 and bool/int8 as 32-bit words; values come back exact
    names = [dtypes.float16, dtypes.bfloat16, dtypes.bool_, dtypes.int8, dtypes.uint16]
    kernel = elementwise_kernel("copies", names, [load(i, g(), dt) for i, dt in enumerate(names)])
    inputs = [sample(dt, seed=i) for i, dt in enumerate(names)]
    for dt, got, want in zip(names, run(device, kernel, inputs), inputs):
        assert got.dtype == dt and np.array_equal(got.view(np.uint8), np.asarray(want, dt).view(np.uint8)), dt


def test_probe_reports_the_adapter() -> None:
    ok, reason = webgpu.probe()
    assert ok and " via " in reason


def test_reductions_longer_than_the_software_loop_cap(device: webgpu.WebGPUDevice) -> None:
    """lavapipe ends a shader's loops after 65,535 iterations: longer reductions run in two kernels
    (funcgrad/lower/split_reductions.py), here sums, max and min over up to 294,912 values per output."""
    rng = np.random.default_rng(5)
    x = (1.0001 + 1e-3 * rng.standard_normal((512, 4, 24, 24))).astype(np.float32)
    (t,) = on_webgpu(x)
    np.testing.assert_allclose(fnp.sum(t, axis=(0, 2, 3)).numpy(), x.astype(np.float64).sum(axis=(0, 2, 3)), rtol=2e-6)
    np.testing.assert_allclose(fnp.sum(t).numpy(), x.astype(np.float64).sum(), rtol=2e-6)
    assert fnp.max(t, axis=(0, 2, 3)).numpy().tolist() == x.max(axis=(0, 2, 3)).tolist()
    assert fnp.min(t).numpy() == x.min()
    ones = np.ones(70001, np.int32)  # a length no chunk divides: padded with the identity
    assert fnp.sum(on_webgpu(ones)[0]).numpy() == 70001


def test_a_value_minus_or_over_itself_keeps_ieee_semantics(device: webgpu.WebGPUDevice) -> None:
    """lavapipe folds x - x to 0 and x / x to 1; inf - inf and 0 / 0 are NaN (the renderer hides
    that the operands are one value: fg_opaque)."""
    (x,) = on_webgpu(np.array([np.inf, 0.0, 2.0, -np.inf, np.nan], np.float32))
    e = fnp.exp(on_webgpu(np.array([1000.0, 1.0], np.float32))[0])
    np.testing.assert_array_equal((x - x).numpy(), [np.nan, 0.0, 0.0, np.nan, np.nan])
    np.testing.assert_array_equal((x / x).numpy(), [np.nan, np.nan, 1.0, np.nan, np.nan])
    np.testing.assert_array_equal((e - e).numpy(), [np.nan, 0.0])


def test_long_float_sums_add_partial_sums(device: webgpu.WebGPUDevice) -> None:
    """A 4096-term float32 sum per row (softmax's) in blocks of 64 partial sums: as accurate as the
    CPU's (a serial sum was 1.6e-5 off the benchmark's softmax)."""
    x = (1.0 + 1e-3 * np.random.default_rng(6).standard_normal((8, 4096))).astype(np.float32)
    (t,) = on_webgpu(x)
    np.testing.assert_allclose(fnp.sum(t, axis=1).numpy(), x.astype(np.float64).sum(axis=1), rtol=5e-7)
