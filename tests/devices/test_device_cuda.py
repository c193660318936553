"""The CUDA C renderer, compiled with nvcc, and the CUDA device (pycuda).

Without a GPU the renderer is still checked: every kernel generated for a broad set of programs
(every UNARY/BINARY op on every dtype, casts, bit casts, reductions (a thread per output and a block
per output), movement ops, a matrix product, a softmax and an MLP's gradient under jit) goes
into one .cu file compiled to PTX with ``nvcc -ptx -arch=sm_90``; a compile error fails with nvcc's
log. ``ptxas -v`` then assembles the PTX and reports registers; no kernel may spill.
The run tests need pycuda and a driver, and skip with the probe's reason otherwise.
"""

from __future__ import annotations

import re
import sys
import types

import numpy as np
import pytest
from test_render_llvm import (
    ALL_DTYPES,
    check,
    defined,
    elementwise_kernel,
    g,
    reduction_kernel,
    sample,
    ulp_budget,
)

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices import cuda
from funcgrad.ir import dtypes
from funcgrad.ir.core import IR
from funcgrad.lower.kernel import BINARY, BOOL, UNARY, Kernel, alu, bitcast, cast, evaluate_kernel, load
from funcgrad.lower.render_c import LOCAL_REDUCE, kernel_function_name
from funcgrad.lower.render_cuda import render_cuda
from funcgrad.lower.schedule import KernelStep, schedule

needs_nvcc = pytest.mark.skipif(cuda.nvcc_path() is None, reason="nvcc not found (CUDA toolkit not installed)")
USABLE, REASON = cuda.probe()
needs_gpu = pytest.mark.skipif(not USABLE, reason=f"CUDA unavailable: {REASON}")


# --- the kernels of many programs ------------------------------------------------------------------

def op_grid_kernels() -> list[Kernel]:
    kernels = []
    for dtype in ALL_DTYPES:
        x, y = load(0, g(), dtype), load(1, g(), dtype)
        unary = [alu(op, x, dtype=BOOL if op == "is_finite" else None) for op in UNARY if defined(op, dtype)]
        binary = [alu(op, x, y) for op in BINARY if defined(op, dtype, dtype)]
        kernels.append(elementwise_kernel(f"unary_{dtype.name}", [dtype], unary))
        kernels.append(elementwise_kernel(f"binary_{dtype.name}", [dtype, dtype], binary))
        others = [t for t in ALL_DTYPES if t != dtype]
        kernels.append(elementwise_kernel(f"cast_{dtype.name}", [dtype], [cast(x, t) for t in others]))
        same_width = [t for t in others if t.itemsize == dtype.itemsize and BOOL not in (t, dtype)]
        if same_width:
            kernels.append(elementwise_kernel(f"bitcast_{dtype.name}", [dtype], [bitcast(x, t) for t in same_width]))
    return kernels


def reduction_kernels() -> list[Kernel]:
    kernels = []
    for dtype in (dtypes.float32, dtypes.float64, dtypes.float16, dtypes.bfloat16, dtypes.int32, dtypes.int8,
                  dtypes.uint64, dtypes.bool_):
        for op in ("sum", "prod", "max", "min"):
            kernels.append(reduction_kernel(f"reduce_{op}_{dtype.name}", op, dtype, (3, 37, 4), epilogue=True))
            # long reductions into few outputs: a block per output with a shared-memory tree
            kernels.append(reduction_kernel(f"local_{op}_{dtype.name}", op, dtype, (2, 4096, 1)))
    return kernels


def program_kernels() -> list[Kernel]:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 8)).astype(np.float32), rng.standard_normal((8, 5)).astype(np.float32)
    params = {"w1": rng.standard_normal((4, 16)).astype(np.float32), "b1": np.zeros(16, np.float32),
              "w2": rng.standard_normal((16, 3)).astype(np.float32), "b2": np.zeros(3, np.float32)}
    data = rng.standard_normal((10, 4)).astype(np.float32)

    def loss(p: dict, x: fg.Tensor) -> fg.Tensor:
        return ((fnp.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]) ** 2).mean()

    programs = [
        (lambda x: x.T.reshape(4, 12)[1:3, ::-2], (a,)),
        (lambda x: fnp.pad(x, ((1, 0), (0, 2))) + 1, (a,)),
        (lambda x: fnp.concatenate([x, x * 2], axis=1).sum(0), (a,)),
        (lambda x, y: x @ y, (a, b)),
        (lambda x: x.softmax(-1), (a,)),
        (lambda x: fnp.argmax(x, axis=1), (a,)),
        (fg.value_and_grad(loss), (params, data)),
        (fg.jit(fg.value_and_grad(loss)), (params, data)),
    ]
    kernels = []
    for function, args in programs:
        ir = fg.make_ir(function)(*args)
        opened = IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)
        kernels += [step.kernel for step in schedule(opened) if isinstance(step, KernelStep)]
    return kernels


@needs_nvcc
def test_every_generated_kernel_compiles_to_ptx_with_nvcc() -> None:
    kernels = op_grid_kernels() + reduction_kernels() + program_kernels()
    names = [f"k{number}_{kernel_function_name(kernel)}" for number, kernel in enumerate(kernels)]
    source, blocks = render_cuda(kernels, names)
    assert blocks.count(LOCAL_REDUCE["group"]) >= 32, "the long reductions should use a block per output"
    try:
        ptx = cuda.compile_cuda(source, "sm_90", "ptx").decode()
    except cuda.CUDAError as error:
        numbered = "\n".join(f"{n + 1:5d} {line}" for n, line in enumerate(source.splitlines()))
        pytest.fail(f"{error}\n--- source ---\n{numbered}")
    for name in names:  # extern "C": every kernel is an entry point under its own name
        assert f".entry {name}(" in ptx, name
    report = cuda.ptxas_report(ptx.encode(), "sm_90")
    registers = [int(n) for n in re.findall(r"Used (\d+) registers", report)]
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
    assert len(registers) == len(kernels) and not any(spills), report
    print(f"{len(kernels)} kernels: at most {max(registers)} registers, no spills")


def test_cuda_source_uses_the_cuda_dialect() -> None:
    f16 = np.dtype(np.float16)
    kernel = elementwise_kernel("dialect", [f16], [alu("sin", load(0, g(), f16)), cast(load(0, g(), f16), np.int8)])
    source, (block,) = render_cuda([kernel])
    assert 'extern "C" __global__ void dialect(' in source and "__restrict__" in source
    assert "blockIdx.x" in source and "threadIdx.x" in source and block is None
    assert "typedef signed char schar;" in source and "sinf(" in source
    assert "__device__ schar fg_float_to_schar(float x)" in source
    local, (group,) = render_cuda([reduction_kernel("long_sum", "sum", np.dtype(np.float32), (1, 5000, 1))])
    assert group == LOCAL_REDUCE["group"] and "__shared__ float partial" in local and "__syncthreads();" in local


@needs_nvcc
def test_nvcc_errors_carry_the_log() -> None:
    with pytest.raises(cuda.CUDAError, match="nvcc failed(?s:.*)error"):
        cuda.compile_cuda('extern "C" __global__ void broken(float* x) { x[0] = undefined_name; }')


def test_probe_reason_without_a_runtime() -> None:
    ok, reason = cuda.probe()
    if not ok:
        assert reason.startswith(("pycuda not installed", "no CUDA driver", "no CUDA device", "nvcc not found"))
        with pytest.raises(cuda.CUDAError, match="CUDA is not available"):
            cuda.CUDADevice()
    info = {d.name: d for d in fg.devices()}["CUDA"]
    assert info.available == ok and info.reason == reason


def test_launch_shapes() -> None:
    # a thread per output in blocks of BLOCK_SIZE, or a block per output for a shared-memory reduction
    elementwise = elementwise_kernel("launch", [np.dtype(np.float32)], [load(0, g(), np.float32)], n=1000)
    plain = cuda.CUDAKernel(None, elementwise, "", None, None)
    assert plain.launch_shape() == ((-(-1000 // cuda.BLOCK_SIZE), 1, 1), (cuda.BLOCK_SIZE, 1, 1))
    long_sum = reduction_kernel("long", "sum", np.dtype(np.float32), (3, 5000, 1))
    (group,) = render_cuda([long_sum])[1]
    assert cuda.CUDAKernel(None, long_sum, "", None, group).launch_shape() == ((3, 1, 1), (group, 1, 1))


# --- the device's driver calls, against a stand-in for pycuda.driver --------------------------------

class FakeAllocation(bytearray):
    """A fake device allocation: its bytes, and ``int()`` its device address, as pycuda's DeviceAllocation."""

    address = 0

    def __int__(self) -> int:
        return self.address


class FakeDriver(types.ModuleType):
    """Enough of ``pycuda.driver`` to run the device's code: memory is host bytes, and a launched
    function runs its kernel with the NumPy evaluator (found by name in ``kernels``)."""

    class Error(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("pycuda.driver")
        self.kernels: dict[str, Kernel] = {}
        self.launches: list[tuple[str, tuple[int, ...], tuple[int, ...]]] = []
        self.copies = {"htod": 0, "dtoh": 0}
        driver = self

        class Device:
            @staticmethod
            def count() -> int:
                return 1

            def __init__(self, ordinal: int) -> None:
                pass

            def name(self) -> str:
                return "Fake H200"

            def compute_capability(self) -> tuple[int, int]:
                return 9, 0

            def retain_primary_context(self) -> object:
                return types.SimpleNamespace(push=lambda: None)

        class Function:
            def __init__(self, name: str, source: str = "") -> None:
                self.name, self.source = name, source

            def __call__(self, *allocations: bytearray, grid: tuple[int, ...], block: tuple[int, ...]) -> None:
                kernel = driver.by_source.get(self.source) or driver.kernels[self.name]
                driver.launches.append((self.name, grid, block))
                outs = len(kernel.out_avals)
                inputs = [np.frombuffer(bytes(memory), a.dtype)[:int(np.prod(a.shape))].reshape(a.shape)
                          for memory, a in zip(allocations[outs:], kernel.in_avals)]
                for memory, value in zip(allocations, evaluate_kernel(kernel, inputs)):
                    memory[:value.nbytes] = value.tobytes()

        self.Device = Device
        self.Context = types.SimpleNamespace(pop=lambda: None, synchronize=lambda: None)
        self.init = lambda: None
        self.allocations: list[FakeAllocation] = []
        self.module_from_buffer = lambda cubin: types.SimpleNamespace(
            get_function=lambda name: Function(name, cubin.decode()))
        self.by_source: dict[str, Kernel] = {}  # a module's CUDA source -> its kernel (``register_kernels``)

    def mem_alloc(self, nbytes: int) -> FakeAllocation:
        """Host bytes standing in for device memory, at a made-up device address (``int(allocation)``)."""
        allocation = FakeAllocation(nbytes)
        allocation.address = (len(self.allocations) + 1) << 32
        self.allocations.append(allocation)
        return allocation

    def memcpy_dtod(self, dest: int, src: int, size: int) -> None:
        """cuMemcpyDtoD on raw device addresses (an allocation's address plus an offset), range-checked."""
        self.copies["dtod"] = self.copies.get("dtod", 0) + 1

        def find(address: int) -> tuple[FakeAllocation, int]:
            allocation = self.allocations[(address >> 32) - 1]
            offset = address - allocation.address
            assert offset >= 0 and offset + size <= len(allocation), (address, size, len(allocation))
            return allocation, offset
        (target, at), (source, start) = find(dest), find(src)
        target[at:at + size] = source[start:start + size]

    def memcpy_htod(self, memory: bytearray, data: np.ndarray) -> None:
        self.copies["htod"] += 1
        memory[:data.nbytes] = data.tobytes()

    def memcpy_dtoh(self, out: np.ndarray, memory: bytearray) -> None:
        self.copies["dtoh"] += 1
        out[...] = np.frombuffer(bytes(memory[:out.nbytes]), out.dtype)


@pytest.fixture
def fake_driver(monkeypatch: pytest.MonkeyPatch) -> FakeDriver:
    driver = FakeDriver()
    package = types.ModuleType("pycuda")
    package.driver = driver  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "pycuda", package)
    monkeypatch.setitem(sys.modules, "pycuda.driver", driver)
    monkeypatch.setattr(cuda, "compile_cuda", lambda source, arch, output: source.encode())
    return driver


def test_device_runs_plans_resident_through_the_driver(fake_driver: FakeDriver) -> None:
    from funcgrad.lower.plan import Plan

    assert cuda.probe() == (True, "Fake H200")
    device = cuda.CUDADevice()
    assert device.arch == "sm_90" and device.resident
    ir = fg.make_ir(lambda a: fnp.exp(a).sum(axis=1) * 2 + a.max(axis=1))(np.ones((3, 4), np.float32))
    opened = IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)
    for step in schedule(opened):
        if isinstance(step, KernelStep):
            fake_driver.kernels[kernel_function_name(step.kernel)] = step.kernel
    plan = Plan(opened, device)
    x = np.random.default_rng(0).normal(size=(3, 4)).astype(np.float32)
    (got,) = plan.run([x])
    np.testing.assert_allclose(got, np.exp(x).sum(1) * 2 + x.max(1), rtol=1e-6)
    assert fake_driver.copies == {"htod": 1, "dtoh": 1}  # the input in once, the result out once
    assert len(fake_driver.launches) == len(plan.kernels) >= 2
    # a bfloat16 array travels as bytes (NumPy cannot export it through the buffer protocol)
    bf16 = np.dtype(dtypes.bfloat16)
    kernel = elementwise_kernel("bf16_copy", [bf16], [alu("neg", load(0, g(), bf16))], n=4)
    fake_driver.kernels["bf16_copy"] = kernel
    out = np.empty(4, bf16)
    device.compile(kernel)([np.arange(4).astype(bf16)], [out])
    assert np.array_equal(out, -np.arange(4).astype(bf16)) and fake_driver.launches[-1][1:] == ((1, 1, 1),
                                                                                              (cuda.BLOCK_SIZE, 1, 1))


def test_scans_run_on_device_buffers_through_the_driver(fake_driver: FakeDriver,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA's ``copy_within`` (memcpy_dtod on offset pointers) driving a scan and its gradient (never run on
    a GPU: this stand-in evaluates the launches with NumPy): results against the interpreter, and the same
    host copies at 5 and 50 steps."""
    from funcgrad import Tensor, lax
    from funcgrad.ir.interpreter import eval_ir
    from funcgrad.lower import plan as plan_module
    from funcgrad.util.caches import LRUCache

    monkeypatch.setattr(plan_module, "_PLANS", LRUCache(64))  # keep the stand-in's plans out of the real cache
    compile_kernel = cuda.CUDADevice.compile

    def registering_compile(self: cuda.CUDADevice, kernel: Kernel) -> cuda.CUDAKernel:
        fake_driver.by_source[render_cuda([kernel])[0]] = kernel
        return compile_kernel(self, kernel)
    monkeypatch.setattr(cuda.CUDADevice, "compile", registering_compile)
    device = cuda.CUDADevice()

    def rnn(w: fg.Tensor, xs: fg.Tensor, h0: fg.Tensor) -> fg.Tensor:
        def step(h: fg.Tensor, x: fg.Tensor) -> tuple[fg.Tensor, fg.Tensor]:
            h = fnp.tanh(h @ w + x)
            return h, h * h
        h, ys = lax.scan(step, h0, xs)
        return fnp.sum(ys) + fnp.sum(h)
    rng = np.random.default_rng(5)
    moved = {}
    for steps in (5, 50):
        args = [rng.standard_normal(shape).astype(np.float32) * 0.5 for shape in ((4, 4), (steps, 3, 4), (3, 4))]
        lowered = fg.jit(fg.grad(rnn, argnums=(0, 2))).lower(*[Tensor(a) for a in args])
        arrays = [c.numpy() for c in lowered.consts] + args
        plan = plan_module.compile_plan(lowered.ir, device)
        fake_driver.copies = {"htod": 0, "dtoh": 0}
        got = plan.run(arrays)
        moved[steps] = dict(fake_driver.copies)
        for value, want in zip(got, eval_ir(lowered.ir, arrays)):
            np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)
    assert (moved[5]["htod"], moved[5]["dtoh"]) == (moved[50]["htod"], moved[50]["dtoh"])
    assert moved[50]["dtod"] > moved[5]["dtod"] > 0
    with pytest.raises(ValueError, match=r"CUDA copy_within: bytes \[8, 24\) are out of range of the source"):
        device.copy_within(device.upload(np.zeros(4, np.float32)), 8, device.allocate(plan.ir.out_avals[0]), 0, 16)


# --- on a GPU ------------------------------------------------------------------------------------------

@needs_gpu
@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.int32, dtypes.bool_, dtypes.uint8, dtypes.float16,
                                   dtypes.float64], ids=lambda dt: dt.name)
def test_op_grid_runs_on_the_gpu(dtype: np.dtype) -> None:
    device = cuda.CUDADevice()
    x, y = load(0, g(), dtype), load(1, g(), dtype)
    ops = [op for op in UNARY if defined(op, dtype)] + [op for op in BINARY if defined(op, dtype, dtype)]
    exprs = [alu(op, x, dtype=BOOL if op == "is_finite" else None) if op in UNARY else alu(op, x, y) for op in ops]
    kernel = elementwise_kernel(f"grid_{dtype.name}", [dtype, dtype], exprs)
    inputs = [sample(dtype, seed=1), sample(dtype, seed=2)]
    outputs = [np.empty(a.shape, a.dtype) for a in kernel.out_avals]
    device.compile(kernel)(inputs, outputs)
    # CUDA's libdevice differs from NumPy by a few ulps in transcendental functions
    failures = [check(op, got, want, max(2, ulp_budget(op, dtype)) if op in ulp_sensitive else 0)
                for op, got, want in zip(ops, outputs, evaluate_kernel(kernel, inputs))]
    assert not any(failures), [f for f in failures if f]


ulp_sensitive = {"exp", "log", "exp2", "log2", "expm1", "log1p", "sin", "cos", "tan", "asin", "acos", "atan", "sinh",
                 "cosh", "tanh", "asinh", "acosh", "atanh", "logistic", "erf", "pow", "atan2", "rsqrt", "div"}


@needs_gpu
def test_mlp_gradient_under_jit_matches_cpu() -> None:
    rng = np.random.default_rng(1)
    params = {"w": rng.standard_normal((4, 8)).astype(np.float32), "b": np.zeros(8, np.float32)}
    data = rng.standard_normal((10, 4)).astype(np.float32)
    step = fg.jit(fg.grad(lambda p, x: (fnp.tanh(x @ p["w"] + p["b"]) ** 2).mean()))
    got = step(fg.device_put(params, "CUDA"), fg.device_put(data, "CUDA"))
    want = step(fg.device_put(params, "CPU"), fg.device_put(data, "CPU"))
    for name in params:
        np.testing.assert_allclose(got[name].numpy(), want[name].numpy(), rtol=1e-5, atol=1e-6)
