"""Elementwise float32 kernels on explicit vectors (funcgrad/lower/render_vector.py): which kernels the
renderer writes on ``<16 x float>`` vectors, that pipeline 5 (SROA alone) compiles them to the bits
pipeline 3's loop vectoriser gives the scalar loops (lengths and thread chunks that are not multiples
of 16, NaN, infinities, signed zeros), and that their source does not depend on the length."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import funcgrad.numpy as fnp
from funcgrad.devices import cpu, cpu_threads
from funcgrad.devices import cpu_compiler as compiler
from funcgrad.lower import render_llvm as render_llvm_module
from funcgrad.lower.kernel import Kernel, evaluate_kernel
from funcgrad.lower.optimize import optimize
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.render_vector import VECTOR_MIN_ELEMENTS, vector_elementwise
from tests.devices.test_compile_speed import run_object
from tests.lower.test_render_tile import kernels_of

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU code generation, whatever DEVICE says


@pytest.fixture(scope="module")
def llvm() -> compiler.LLVMCompiler:
    return compiler.LLVMCompiler()


def adam(w, g, m, v, t):  # noqa: ANN001, ANN201 - an Adam update, as nn.optim and the benchmark write it
    m2 = 0.9 * m + 0.1 * g
    v2 = 0.999 * v + 0.001 * g * g
    return m2, v2, w - 0.001 * (m2 / (1 - 0.9 ** t)) / (fnp.sqrt(v2 / (1 - 0.999 ** t)) + 1e-8)


def relu_backward(d, h):  # noqa: ANN001, ANN201
    return fnp.where(h > 0.0, d, 0.0), fnp.maximum(h, d) - fnp.minimum(-h, fnp.abs(d))


def shifted(x, y, s):  # noqa: ANN001, ANN201 - a scalar read from memory, a value that does not move
    return x * s + (s * s) - y / (s + 1.0), x * 0.0 + 2.5


def float32_kernels(f, length: int, scalars: int) -> list[Kernel]:  # noqa: ANN001
    """``f``'s kernels (each output its own: siblings are fused later, in the plan) on arrays of
    ``length`` and ``scalars`` trailing scalars, with the CPU's opts (a thread opt) as they run."""
    arrays = [np.ones(length, np.float32)] * (f.__code__.co_argcount - scalars)
    return [optimize(kernel) for kernel in kernels_of(f, *arrays, *[np.float32(3.0)] * scalars)]


def inputs_for(kernel: Kernel, seed: int) -> list[np.ndarray]:
    """Normal values with NaN, infinities and (signed) zeros spread over the arrays; scalars of 3."""
    rng = np.random.default_rng(seed)
    inputs = []
    for aval in kernel.in_avals:
        if not aval.shape:
            inputs.append(np.asarray(3.0, np.float32))
            continue
        x = rng.standard_normal(aval.shape).astype(np.float32)
        special = rng.choice(x.size, size=min(x.size, 64), replace=False)
        x.reshape(-1)[special] = rng.choice(np.array([np.nan, np.inf, -np.inf, 0.0, -0.0], np.float32), special.size)
        inputs.append(x)
    return inputs


PROGRAMS = [(adam, 1), (relu_backward, 0), (shifted, 1)]


@pytest.mark.parametrize("length", [VECTOR_MIN_ELEMENTS, 4099, 400003])
@pytest.mark.parametrize(("f", "scalars"), PROGRAMS, ids=[f.__name__ for f, _ in PROGRAMS])
def test_vector_loops_give_the_scalar_loops_bits(llvm: compiler.LLVMCompiler, monkeypatch: pytest.MonkeyPatch,
                                                 f, scalars: int, length: int) -> None:  # noqa: ANN001
    monkeypatch.delenv("FUNCGRAD_OPT", raising=False)
    monkeypatch.setattr(cpu_threads, "thread_count", lambda: 2)  # the long ones run in two chunks
    kernels = float32_kernels(f, length, scalars)
    sources = []
    for kernel in kernels:
        assert vector_elementwise(kernel) and cpu.optimization_level(kernel) == 5
        sources.append(render_llvm(kernel))
        assert "<16 x float>" in sources[-1] and "masked.store" in sources[-1]
    assert length < 8192 or any(opt.action == "thread" and opt.amount > 1 for k in kernels for opt in k.opts or ())
    monkeypatch.setattr(render_llvm_module, "vector_elementwise", lambda kernel: False)
    for kernel, source in zip(kernels, sources):
        scalar_source = render_llvm(kernel)
        assert "<16 x float>" not in scalar_source
        for seed in range(2):
            inputs = inputs_for(kernel, seed)
            vectors = run_object(kernel, llvm.compile(source, 5), inputs)
            scalar = run_object(kernel, llvm.compile(scalar_source, 3), inputs)
            for got, want in zip(vectors, scalar):  # the same bits (zeros' signs too), NaN where NaN
                # (which NaN an operation with two NaN operands returns follows operand order, which
                # LLVM may commute: IEEE 754 leaves a NaN's sign and payload open, as NumPy does)
                np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
                numbers = ~np.isnan(want)
                np.testing.assert_array_equal(got[numbers].view(np.uint32), want[numbers].view(np.uint32))


def test_an_adam_update_matches_float64() -> None:
    rng = np.random.default_rng(3)
    for kernel in float32_kernels(adam, 5000, 1):
        inputs = [np.asarray(np.abs(rng.standard_normal(aval.shape)) + (aval.shape == ()), np.float32)
                  for aval in kernel.in_avals]  # (positive second moments; a step count of at least 1)
        got = run_object(kernel, compiler.LLVMCompiler().compile(render_llvm(kernel), 5), inputs)
        expected = evaluate_kernel(attrs.evolve(kernel, opts=None), [x.astype(np.float64) for x in inputs])
        for actual, want in zip(got, expected):
            np.testing.assert_allclose(actual, np.asarray(want, np.float64).reshape(actual.shape), rtol=2e-6)


def test_one_source_serves_every_length() -> None:
    """The loop runs over the launch's range: the Adam updates of a (784, 512) weight and of a 5000-long
    one are one compile (``cpu.shared_source``)."""
    short, long = float32_kernels(adam, 5000, 1)[-1], float32_kernels(adam, 784 * 512, 1)[-1]
    assert short.shape != long.shape and "sqrt" in str(short)
    assert cpu.shared_source(render_llvm(short), short) == cpu.shared_source(render_llvm(long), long)


def test_what_stays_on_the_scalar_loops() -> None:
    """Kernels the vector loop does not cover keep render_loops (and LLVM's vectoriser): a
    transcendental, an integer output, reversed and strided reads, fewer than VECTOR_MIN_ELEMENTS
    elements, and a broadcast along the rows (two axes)."""
    n = 8192
    x32, i32 = np.ones(n, np.float32), np.ones(n, np.int32)
    rows, bias = np.ones((64, 128), np.float32), np.ones(128, np.float32)
    kept = [kernels_of(lambda x: fnp.tanh(x) + 1.0, x32)[0],
            kernels_of(lambda x: x * 2 + 1, i32)[0],
            kernels_of(lambda x: x[::-1] * 2.0, x32)[0],
            kernels_of(lambda x: x[::2] * 2.0, np.ones(2 * n, np.float32))[0],
            kernels_of(lambda x: x * 2.0 + 1.0, np.ones(VECTOR_MIN_ELEMENTS - 1, np.float32))[0],
            kernels_of(lambda r, b: r * b + 1.0, rows, bias)[0]]
    for kernel in kept:
        assert not vector_elementwise(optimize(kernel)), kernel
    assert vector_elementwise(optimize(kernels_of(lambda x: x * 2.0 + 1.0, x32)[0]))
