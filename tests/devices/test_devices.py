"""Devices: the registry and placement API, and one specification run on every device.

Tests that take ``device_name`` run once per device chosen with ``--devices=CPU,CL,...`` (default:
every registered device but REFERENCE; an unavailable one is skipped with the reason the registry
gives). On each device they check, against the NumPy kernel evaluator or the reference interpreter:
the kernel-level specification of tests/lower/test_render_llvm.py (every UNARY/BINARY op on every dtype,
casts, bitcasts, where, index arithmetic, reductions), random programs, movement ops, a matmul, a
softmax, grad/vmap/jit of a small MLP and the seed's examples with the device as the default.

Per-device tolerances (``DEVICE_ULPS``, used by the op checks of the imported specification
through ``ulp_budget``): the CPU's transcendental functions are within 4 ulp of NumPy's; OpenCL
allows more for some functions (PoCL's measured worst case here is below 4 ulp too, so the same
budget holds). Exactly rounded operations, integers, casts and bools must agree bit for bit
everywhere. Reductions may sum in another order (OpenCL's local-memory tree): see REDUCTION_RTOL.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices import Device, DeviceUnavailableError, get_device, register_device
from funcgrad.ir.core import ShapedArray
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lazy import DeviceMismatchError
from funcgrad.lower.kernel import INDEX, Kernel, acc, alu, const, evaluate_kernel, load, var
from funcgrad.lower.plan import Plan, compile_plan
from tests.lower.test_render_llvm import (  # the device-independent kernel specification, run here per device
    test_binary_ops_match_reference,
    test_bitcasts_match_reference,
    test_casts_match_reference,
    test_empty_reductions_give_the_identity,
    test_epilogue_reads_the_accumulator,
    test_float64_to_float16_rounds_once,
    test_float_ops_on_chains_of_ops,
    test_float_to_int_saturates_and_maps_nan_to_zero,
    test_full_reduction_to_a_scalar_with_two_reduce_axes,
    test_multi_output_kernel_with_mixed_dtypes,
    test_rank0_kernel,
    test_reduction_over_no_axes_is_the_value_itself,
    test_reductions_match_reference,
    test_reductions_propagate_nan,
    test_transposed_and_broadcast_loads,
    test_unary_ops_match_reference,
    test_where_selects_for_every_dtype,
)
from tests.lower.test_schedule import _opened, _program, ops_strategy

ROOT = Path(__file__).resolve().parents[2]
SPECIFICATION = [test_binary_ops_match_reference, test_bitcasts_match_reference, test_casts_match_reference,
                 test_empty_reductions_give_the_identity, test_epilogue_reads_the_accumulator,
                 test_float64_to_float16_rounds_once, test_float_ops_on_chains_of_ops,
                 test_float_to_int_saturates_and_maps_nan_to_zero,
                 test_full_reduction_to_a_scalar_with_two_reduce_axes, test_multi_output_kernel_with_mixed_dtypes,
                 test_rank0_kernel, test_reduction_over_no_axes_is_the_value_itself, test_reductions_match_reference,
                 test_reductions_propagate_nan, test_transposed_and_broadcast_loads, test_unary_ops_match_reference,
                 test_where_selects_for_every_dtype]
DEVICE_ULPS = {"CPU": 4, "CL": 4}  # transcendental functions against NumPy, float32/float64
REDUCTION_RTOL = {"CPU": 1e-5, "CL": 1e-5}  # float32 sums of O(1) values, any summation order


F64, F32, F16, BF16 = (np.dtype(n) for n in ("float64", "float32", "float16", "bfloat16"))
# the dtypes each imported specification test needs beyond its ``dtype``/``source`` parameter
NEEDS = {
    "test_float_ops_on_chains_of_ops": [F32], "test_transposed_and_broadcast_loads": [F32],
    "test_float_to_int_saturates_and_maps_nan_to_zero": [F32, np.dtype("int8"), np.dtype("uint8")],
    "test_float64_to_float16_rounds_once": [F64, F16], "test_rank0_kernel": [F64, np.dtype(bool)],
    "test_empty_reductions_give_the_identity": [F32, np.dtype("int16"), np.dtype("uint32"), F16],
    "test_reductions_propagate_nan": [F32, F64, BF16], "test_full_reduction_to_a_scalar_with_two_reduce_axes": [F64],
    "test_reduction_over_no_axes_is_the_value_itself": [F32],
    "test_where_selects_for_every_dtype": list(fg.dtypes.ALL_DTYPES),
    "test_multi_output_kernel_with_mixed_dtypes": [F32, np.dtype("int16"), BF16, np.dtype(bool)],
}


def supports(device, dtype: np.dtype) -> bool:
    """Whether ``device`` can hold ``dtype``: its ``supports(dtype)`` if it has one, else whether it
    renders a copy kernel of that dtype."""
    check = getattr(device, "supports", None)
    if check is not None:
        return bool(check(dtype))
    avals = (ShapedArray((2,), np.dtype(dtype)),)
    try:
        getattr(device, "render", str)(Kernel("copy", (2,), avals, avals, (load(0, var("g0"), dtype),)))
    except Exception:  # noqa: BLE001 - any refusal means "unsupported"
        return False
    return True


@pytest.fixture(scope="module")
def device_object(device_name: str):
    return get_device(device_name)


@pytest.fixture
def device(device_object, device_name: str, request: pytest.FixtureRequest):
    """The device object (the imported specification tests take it as their ``device``); a test
    that needs a dtype the device cannot hold is skipped, naming the dtype."""
    params = getattr(request.node, "callspec", None)
    needed = [params.params[key] for key in ("dtype", "source") if params and key in params.params]
    if "source" in (params.params if params else {}):
        needed += list(fg.dtypes.ALL_DTYPES)  # casts and bitcasts reach every other dtype
    needed += NEEDS.get(request.node.originalname, [])
    missing = sorted({np.dtype(dt).name for dt in needed if not supports(device_object, np.dtype(dt))})
    if missing:
        pytest.skip(f"device {device_name} does not support {', '.join(missing)}")
    return device_object


@pytest.fixture
def on_device(device_name: str):
    """Make ``device_name`` the default device for one test."""
    previous = Device.DEFAULT
    Device.DEFAULT = device_name
    yield device_name
    Device.DEFAULT = previous


# --- the registry and the placement API (device-independent: REFERENCE is the second device) -----

def test_default_device_prints_and_follows_the_environment(monkeypatch):
    from funcgrad.devices import _choose_default
    code = "from funcgrad import Device; print(Device.DEFAULT)"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("DEVICE", None)
    monkeypatch.delenv("DEVICE", raising=False)
    best = _choose_default()  # CPU here; CUDA (or CL on a GPU) where one is usable
    assert best in ("CPU", "CUDA", "CL")
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120).stdout.strip() == best
    for asked, expected in (("reference", "REFERENCE"), ("cpu", "CPU")):
        result = subprocess.run([sys.executable, "-c", code], env={**env, "DEVICE": asked}, capture_output=True,
                                text=True, timeout=120)
        assert result.stdout.strip() == expected, result.stderr


def test_an_unknown_default_device_fails_listing_the_available_ones():
    code = "import funcgrad as fg; fg.Tensor([1.0]) + 1"
    result = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(ROOT), "DEVICE": "TPU"},
                            capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "device 'TPU' is not available" in result.stderr and "available devices: CPU" in result.stderr


def test_devices_lists_every_device_with_a_reason():
    infos = {info.name: info for info in fg.devices()}
    assert {"CPU", "CL", "CUDA", "WEBGPU", "REFERENCE"} <= set(infos)
    assert infos["CPU"].available and infos["REFERENCE"].available
    assert all(info.reason for info in infos.values())
    assert "CPU: available" in str(infos["CPU"])


def test_a_missing_backend_is_unavailable_with_its_reason_not_a_crash(monkeypatch):
    import funcgrad.devices as registry
    # the fake devices live in copies of the registry, so later tests see the real one
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    monkeypatch.setattr(registry, "_PROBES", dict(registry._PROBES))

    def broken_probe():
        raise OSError("driver exploded")

    register_device("BROKEN", lambda: None, broken_probe)
    register_device("ABSENT", lambda: None, lambda: (False, "libfoo is not installed"))
    infos = {info.name: info for info in fg.devices()}
    assert not infos["BROKEN"].available and "driver exploded" in infos["BROKEN"].reason
    with pytest.raises(DeviceUnavailableError, match=r"'ABSENT' is not available: libfoo is not installed; "
                                                     r"available devices: CPU"):
        fg.Tensor([1.0], device="absent")
    with pytest.raises(ValueError, match="no such device"):
        get_device("NOPE")


def test_placement_is_visible_and_to_device_put_commit():
    x = fg.Tensor([1.0, 2.0])
    assert x.device == Device.DEFAULT
    moved = x.to("reference")
    assert moved.device == "REFERENCE" and x.device == Device.DEFAULT
    assert (moved * 2).device == "REFERENCE"
    tree = fg.device_put({"w": np.ones(2, np.float32), "b": x}, "REFERENCE")
    assert tree["w"].device == tree["b"].device == "REFERENCE"
    assert fg.Tensor([1.0], device="REFERENCE").device == "REFERENCE"
    assert fg.Tensor.zeros(2, 3, device="reference").device == "REFERENCE"
    assert fg.Tensor.ones(2).device == Device.DEFAULT
    np.testing.assert_array_equal((moved * 2).numpy(), [2.0, 4.0])


def test_uncommitted_values_follow_committed_ones_but_committed_devices_never_mix():
    on_reference = fg.Tensor([1.0, 2.0], device="REFERENCE")
    loose = fg.Tensor([3.0, 4.0])  # created without a device: it may move
    total = on_reference + loose + 1.0
    assert total.device == "REFERENCE"
    np.testing.assert_array_equal(total.numpy(), [5.0, 7.0])
    on_cpu = fg.Tensor([1.0, 2.0], device="CPU")
    with pytest.raises(DeviceMismatchError, match=r"add: operands are on different devices \(REFERENCE and CPU\).*"
                                                  r"x.to\('REFERENCE'\)"):
        on_reference + on_cpu
    np.testing.assert_array_equal((on_reference + on_cpu.to("REFERENCE")).numpy(), [2.0, 4.0])


def test_jit_runs_on_its_arguments_device_and_refuses_mixed_ones():
    f = fg.jit(lambda a, b: a * b + 1)
    on_reference = fg.Tensor([2.0, 3.0], device="REFERENCE")
    out = f(on_reference, fg.Tensor([4.0, 5.0]))
    assert out.device == "REFERENCE"
    np.testing.assert_array_equal(out.numpy(), [9.0, 16.0])
    with pytest.raises(DeviceMismatchError):
        f(on_reference, fg.Tensor([1.0, 1.0], device="CPU"))


def test_plans_are_cached_per_ir_and_device():
    ir = fg.make_ir(lambda a: fnp.sin(a) * 2)(np.ones(3, np.float32))
    cpu, reference = get_device("CPU"), get_device("REFERENCE")
    assert compile_plan(ir, cpu) is compile_plan(ir, cpu)
    assert compile_plan(ir, reference) is not compile_plan(ir, cpu)
    assert compile_plan(ir, reference).device is reference


def test_set_default_device_switches_where_lazy_values_run():
    previous = Device.DEFAULT
    try:
        Device.DEFAULT = "reference"
        assert fg.Tensor([1.0]).device == "REFERENCE" and (fg.Tensor([1.0]) + 1).device == "REFERENCE"
        with pytest.raises(DeviceUnavailableError):
            Device.DEFAULT = "TPU"
    finally:
        Device.DEFAULT = previous


# --- every device: programs against the reference interpreter ---------------------------------------

@settings(max_examples=12, deadline=None)  # each new program is one OpenCL build (~0.45 s cold)
@given(ops=ops_strategy, rows=st.integers(1, 5), cols=st.integers(1, 5))
def test_random_programs_match_the_interpreter(device_object, ops, rows, cols):
    rng = np.random.default_rng(rows * 10 + cols)
    x = rng.normal(size=(rows, cols)).astype(np.float32)
    y = rng.normal(size=(rows, cols)).astype(np.float32)
    ir = fg.make_ir(lambda a, b: _program(ops, a, b))(x, y)
    consts = [c.numpy() for c in ir.consts]
    got = Plan(_opened(ir), device_object).run(consts + [x, y])
    for actual, expected in zip(got, eval_ir(ir, [x, y], consts)):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-5)


MOVEMENT = {
    "transpose": lambda a: a.T + 0, "flip": lambda a: a[::-1, ::2] * 1, "reshape": lambda a: a.reshape(4, 6) + 0,
    "pad": lambda a: fnp.pad(a, ((1, 2), (0, 1))) + 0, "broadcast": lambda a: fnp.broadcast_to(a[:, :1], (6, 4)) + 0,
    "concatenate": lambda a: fnp.concatenate([a, a[:2]]) * 1, "expand": lambda a: fnp.expand_dims(a, 1) * 1,
    "take": lambda a: fnp.take(a, fnp.asarray([3, 0, 1]), axis=0) * 1,
}


@pytest.mark.parametrize("name", list(MOVEMENT))
def test_movement_ops(on_device, name):
    a = np.arange(24, dtype=np.float32).reshape(6, 4)
    got = MOVEMENT[name](fg.Tensor(a))
    assert got.device == on_device
    want = MOVEMENT[name](fg.Tensor(a, device="REFERENCE")).numpy()
    np.testing.assert_array_equal(got.numpy(), want)


def test_matmul_softmax_and_reductions(on_device, rng):
    a, b = rng.normal(size=(33, 70)).astype(np.float32), rng.normal(size=(70, 17)).astype(np.float32)
    x, y = fg.Tensor(a), fg.Tensor(b)
    np.testing.assert_allclose((x @ y).numpy(), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    logits = a @ b
    softmax = fg.nn.softmax(fg.Tensor(logits), axis=-1) if hasattr(fg.nn, "softmax") else None
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    expected /= expected.sum(-1, keepdims=True)
    if softmax is None:
        z = fg.Tensor(logits)
        e = fnp.exp(z - z.max(axis=-1, keepdims=True))
        softmax = e / e.sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(softmax.numpy(), expected, rtol=1e-5, atol=1e-6)
    big = rng.uniform(-1, 1, size=(3, 50_000)).astype(np.float32)  # long rows: OpenCL's local-memory reduction
    total = fg.Tensor(big).sum(axis=1).numpy()
    np.testing.assert_allclose(total, big.astype(np.float64).sum(1), rtol=REDUCTION_RTOL.get(on_device, 1e-5),
                               atol=2e-3)
    np.testing.assert_array_equal(fg.Tensor(big).max(axis=1).numpy(), big.max(1))
    np.testing.assert_array_equal(fg.Tensor(big > 0).any(axis=1).numpy(), (big > 0).any(1))
    ints = rng.integers(-1000, 1000, size=(5, 3000)).astype(np.int32)
    np.testing.assert_array_equal(fg.Tensor(ints).sum(axis=1).numpy(), ints.sum(1))


def _mlp(params, x):
    h = fnp.tanh(x @ params["w1"] + params["b1"])
    return ((h @ params["w2"]) ** 2).mean()


def test_grad_vmap_jit_of_a_small_mlp(on_device, rng):
    params = {"w1": rng.normal(size=(4, 8)).astype(np.float32) * 0.5, "b1": np.zeros(8, np.float32),
              "w2": rng.normal(size=(8, 2)).astype(np.float32) * 0.5}
    x = rng.normal(size=(5, 4)).astype(np.float32)
    on = fg.tree.map(fg.Tensor, params)
    reference = fg.device_put(params, "REFERENCE")
    grads = fg.jit(fg.grad(_mlp))(on, fg.Tensor(x))
    want = fg.grad(_mlp)(reference, fg.Tensor(x, device="REFERENCE"))
    for name in params:
        assert grads[name].device == on_device
        np.testing.assert_allclose(grads[name].numpy(), want[name].numpy(), rtol=1e-5, atol=1e-6)
    per_example = fg.vmap(fg.grad(_mlp), in_axes=(None, 0))(on, fg.Tensor(x[:, None]))
    for row in range(len(x)):
        single = fg.grad(_mlp)(reference, fg.Tensor(x[row:row + 1], device="REFERENCE"))
        np.testing.assert_allclose(per_example["w2"].numpy()[row], single["w2"].numpy(), rtol=1e-5, atol=1e-6)


def test_seed_examples_with_the_device_as_default(on_device):
    from tests.programs.test_seed_examples import BLOCKS
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DEVICE": on_device}
    for block in BLOCKS[1:]:
        result = subprocess.run([sys.executable, "-c", block[1]], env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip()
    python = BLOCKS[2][1]
    result = subprocess.run([sys.executable, "-c", python], env=env, capture_output=True, text=True, timeout=300)
    assert result.stdout.splitlines() == ["[[2.0, 2.0, 2.0], [0.0, 0.0, 0.0], [-2.0, -2.0, -2.0]]",
                                          "[[1.0, 1.0, 1.0]]"]
    command = BLOCKS[0][1].strip()[len("DEBUG=3 python3 -c "):].strip().strip('"')
    result = subprocess.run([sys.executable, "-c", command], env={**env, "DEBUG": "3"}, capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "kernel r_sum_1024_1024 global[1024, 1024] reduce[sum][1024]" in result.stderr


# --- OpenCL specifics ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def cl_device():
    info = {i.name: i for i in fg.devices()}["CL"]
    if not info.available:
        pytest.skip(f"device CL unavailable: {info.reason}")
    return get_device("CL")


def _scaled_kernel(name: str, n: int = 8) -> Kernel:
    avals = (ShapedArray((n,), np.dtype(np.float32)),)
    return Kernel(name, (n,), avals, avals, (alu("mul", load(0, var("g0"), np.float32), const(3, np.float32)),))


def test_cl_builds_one_program_per_plan(cl_device):
    ir = fg.make_ir(lambda a: (fnp.exp(a).sum() * a).T.sum(axis=0) + fnp.sort(a, axis=1)[:, 0])(
        np.ones((3, 4), np.float32) * 0.123)
    before = cl_device.stats["builds"]
    plan = Plan(_opened(ir), cl_device)
    assert len(plan.kernels) >= 2
    assert cl_device.stats["builds"] - before <= 1  # one program for all of them (0 if built before)
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    np.testing.assert_allclose(plan.run([x])[0], eval_ir(ir, [x])[0], rtol=1e-5)


def test_cl_build_failure_shows_the_compiler_log(cl_device, monkeypatch):
    from funcgrad.devices import opencl
    monkeypatch.setattr(opencl, "render_opencl", lambda kernels, names: ("__kernel void broken( { oops", [None]))
    with pytest.raises(opencl.KernelCompileError, match=r"(?s)OpenCL build of bad failed.*error"):
        cl_device.compile(_scaled_kernel("bad"))


def test_cl_refuses_float64_without_cl_khr_fp64(cl_device, monkeypatch):
    from funcgrad.devices import opencl
    monkeypatch.setattr(cl_device, "fp64", False)
    avals = (ShapedArray((4,), np.dtype(np.float64)),)
    kernel = Kernel("f64", (4,), avals, avals, (load(0, var("g0"), np.float64),))
    with pytest.raises(opencl.KernelCompileError, match="does not support float64 .no cl_khr_fp64"):
        cl_device.compile(kernel)


def test_cl_long_reductions_use_a_work_group_and_local_memory(cl_device):
    from funcgrad.lower.render_c import LOCAL_REDUCE
    length = LOCAL_REDUCE["min_length"] * 3 + 17
    values = np.random.default_rng(1).uniform(-1, 1, size=(2, length)).astype(np.float32)
    avals = (ShapedArray((2, length), np.dtype(np.float32)),)
    index = alu("add", alu("mul", var("g0"), const(length, INDEX)), var("r0"))
    kernel = Kernel("long_sum", (2,), avals, (ShapedArray((2,), np.dtype(np.float32)),),
                    (acc(np.dtype(np.float32)),), (length,), "sum", load(0, index, np.float32))
    compiled = cl_device.compile(kernel)
    assert compiled.group == LOCAL_REDUCE["group"] and "__local" in compiled.source and "barrier" in compiled.source
    out = np.empty(2, np.float32)
    compiled([values], [out])
    np.testing.assert_allclose(out, values.astype(np.float64).sum(1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(out, evaluate_kernel(kernel, [values])[0], rtol=1e-5, atol=1e-4)


def test_resident_plans_keep_intermediates_on_the_device(device_object, device_name, monkeypatch):
    """A device with its own memory (CL, WEBGPU, CUDA) gets the plan's input once and gives back only
    the result; the intermediates between its kernels stay there."""
    if not getattr(device_object, "resident", False):
        pytest.skip(f"device {device_name} computes on host arrays: nothing to keep resident")
    ir = fg.make_ir(lambda a: fnp.exp(a).sum(axis=1) * 2 + a.max(axis=1))(np.ones((3, 4), np.float32))
    plan = Plan(_opened(ir), device_object)
    assert len(plan.kernels) >= 2
    moved = {"up": 0, "down": 0}
    upload, download = device_object.upload, device_object.download

    def counting_upload(array):
        moved["up"] += 1
        return upload(array)

    def counting_download(buffer, aval):
        moved["down"] += 1
        return download(buffer, aval)

    monkeypatch.setattr(device_object, "upload", counting_upload)
    monkeypatch.setattr(device_object, "download", counting_download)
    x = np.random.default_rng(2).normal(size=(3, 4)).astype(np.float32)
    (got,) = plan.run([x])
    assert moved == {"up": 1, "down": 1}  # the input in once, the result out once
    np.testing.assert_allclose(got, eval_ir(ir, [x])[0], rtol=1e-5)


def test_benchmarks_run_on_the_chosen_device(device_name, tmp_path):
    out = tmp_path / "results.json"
    process = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--only", "gelu,softmax",
                              "--frameworks", "numpy", "--device", device_name, "--json", str(out)],
                             capture_output=True, text=True, timeout=300)
    assert process.returncode == 0, process.stdout + process.stderr
    report = json.loads(out.read_text())
    assert report["meta"]["device"] == device_name and f"on device {device_name}" in process.stdout
    assert [row["ok"] for row in report["workloads"]] == [True, True]  # funcgrad's results matched NumPy's


def test_devices_is_a_callable_package():
    """fg.devices() lists devices (as jax.devices()) and funcgrad.devices stays an importable package."""
    import importlib

    import funcgrad as fg
    cpu_module = importlib.import_module("funcgrad.devices.cpu")
    import funcgrad.devices.cpu as by_statement  # the form that breaks if a function shadows the package
    assert by_statement is cpu_module
    names = [info.name for info in fg.devices()]
    assert "CPU" in names and "REFERENCE" in names


def test_tanh_and_logistic_saturate_exactly(on_device):
    """tanh is exactly +-1 and logistic exactly 0/1 far out and at infinity, NaN stays NaN (PoCL's
    libm gave tanh(inf) = 1 - ulp, so logistic(-inf) was 3e-8, before the renderer said so itself)."""
    x = np.array([np.inf, -np.inf, 30.0, -30.0, 200.0, -200.0, np.nan, 0.0], np.float32)
    tanh = fnp.tanh(fg.Tensor(x)).numpy()
    logistic = fnp.sigmoid(fg.Tensor(x)).numpy()
    np.testing.assert_array_equal(tanh[:6], [1, -1, 1, -1, 1, -1])
    np.testing.assert_array_equal(logistic[:2], [1, 0])
    np.testing.assert_array_equal(logistic[4:6], [1, 0])
    assert np.isnan(tanh[6]) and np.isnan(logistic[6]) and tanh[7] == 0 and logistic[7] == 0.5
