"""Differential fuzzing of the kernel optimiser (issue 8, point 1: random kernel-optimisation
choices against the unoptimised kernel).

Hypothesis draws a small program (matrix products, batched products, reductions over random axes
including long sums, elementwise chains, softmax) with random shapes, schedules it into kernels,
and draws ``CHOICES`` random valid opt tuples for each kernel (reorder, row blocks, loop swaps,
unroll counts, vector widths, thread chunks, split depths). Each kernel compiled at O3 with those opts must compute
what the NumPy kernel evaluator (``evaluate_kernel``) computes on the same random inputs.

``FUNCGRAD_FUZZ_EXAMPLES`` sets the number of programs (20 by default); ``FUNCGRAD_FUZZ_SEED``
``random`` draws fresh cases, an integer a seed's cases (default: the same cases every run).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs
import numpy as np
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices import cpu
from funcgrad.lower.kernel import Kernel, Opt, dtype_class, evaluate_kernel
from funcgrad.lower.optimize import canonical, check_opts
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.render_loops import MAX_ROW, accumulator_dtype, llvm_function_name, partial_sum_split
from funcgrad.lower.render_transpose import _transposed_loads
from funcgrad.lower.schedule import KernelStep, schedule

EXAMPLES = int(os.environ.get("FUNCGRAD_FUZZ_EXAMPLES", "20"))
SEED = os.environ.get("FUNCGRAD_FUZZ_SEED", "")
CHOICES = 3  # opt tuples tried per kernel (a compile each)


def fuzz_settings(test: Callable[..., None]) -> Callable[..., None]:
    configured = settings(max_examples=EXAMPLES, deadline=None, derandomize=SEED == "", database=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])(test)
    return seed(int(SEED))(configured) if SEED not in ("", "random") else configured


ELEMENTWISE: dict[str, Callable[[Any], Any]] = {
    "tanh": fnp.tanh, "exp": lambda x: fnp.exp(fnp.minimum(x, 3.0)), "square": lambda x: x * x + 0.5,
    "sqrt": lambda x: fnp.sqrt(fnp.abs(x)), "relu": lambda x: fnp.maximum(x, 0.0), "neg": lambda x: -x * 1.5,
}


@st.composite
def programs(draw: st.DrawFn) -> tuple[str, Callable[..., Any], list[np.ndarray]]:
    """(label, function, float32 inputs) of one small program."""
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))

    def array(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    def dim(low: int, high: int) -> int:
        return draw(st.integers(low, high))

    kind = draw(st.sampled_from(["matmul", "batched", "reduce", "long sum", "elementwise", "softmax", "transposed"]))
    if kind == "transposed":  # a channels-last array read in NCHW order beside an NCHW one (render_transpose)
        n, p, c = dim(1, 3), dim(1, 40), dim(1, 40)
        return kind, lambda x, y, b: fnp.maximum(fnp.transpose(x, (0, 2, 1)) + b[:, None], 0.0) * y, \
            [array(n, p, c), array(n, c, p), array(c)]
    if kind == "matmul":
        m, k, n = dim(2, 40), dim(1, 70), dim(1, 90)
        return kind, lambda x, y, b: fnp.maximum(x @ y + b, 0.0), [array(m, k), array(k, n), array(n)]
    if kind == "batched":
        b, m, k, n = dim(1, 4), dim(2, 20), dim(1, 40), dim(1, 50)
        return kind, lambda x, y: fnp.einsum("bij,bjk->bik", x, y), [array(b, m, k), array(b, k, n)]
    if kind == "reduce":
        shape = tuple(dim(1, 40) for _ in range(dim(2, 3)))
        axes = tuple(sorted(draw(st.sets(st.integers(0, len(shape) - 1), min_size=1, max_size=len(shape) - 1))))
        op = draw(st.sampled_from(["sum", "max", "mean"]))
        return f"{op}{axes}", lambda x: getattr(x, op)(axis=axes), [array(*shape)]
    if kind == "long sum":  # >= 4096 values over >= 2 loops: partial sums (a split)
        shape = (dim(20, 70), dim(1, 6), dim(64, 130))
        return kind, lambda x: (x * 2.0).sum(axis=(0, 2)), [array(*shape)]
    if kind == "elementwise":
        shape = tuple(dim(1, 70) for _ in range(dim(1, 3)))
        chain = draw(st.lists(st.sampled_from(sorted(ELEMENTWISE)), min_size=1, max_size=4))

        def run_chain(x: Any) -> Any:
            for name in chain:
                x = ELEMENTWISE[name](x)
            return x
        return f"elementwise {chain}", run_chain, [array(*shape)]
    return kind, lambda x: fnp.exp(x - x.max(axis=1, keepdims=True)).sum(axis=1), [array(dim(1, 30), dim(1, 200))]


@st.composite
def random_opts(draw: st.DrawFn, kernel: Kernel) -> tuple[Opt, ...]:
    """A random valid opt tuple for ``kernel``, drawn action by action."""
    opts: list[Opt] = []
    reduces = kernel.reduce_expr is not None and bool(kernel.reduce_shape)
    if reduces and kernel.shape and kernel.shape[-1] <= MAX_ROW and draw(st.booleans()):
        opts.append(Opt("reorder"))
        if len(kernel.shape) >= 2:
            rows = draw(st.integers(1, min(4, kernel.shape[-2])))
            if rows > 1:
                opts.append(Opt("upcast", len(kernel.shape) - 2, rows))
    rank = len(kernel.shape)
    transposable = [axis for axis in range(1, rank - 1) if not reduces and _transposed_loads(kernel, axis)]
    if transposable and draw(st.booleans()):  # the blocked transpose takes no other loop actions
        opts.append(Opt("transpose", draw(st.sampled_from(transposable)), 16))
        if kernel.shape[0] > 1 and draw(st.booleans()):
            opts.append(Opt("thread", 0, draw(st.integers(1, min(4, kernel.shape[0])))))
        return canonical(opts)
    if "reorder" not in {opt.action for opt in opts} and rank >= 3 and draw(st.booleans()):
        first, second = draw(st.lists(st.integers(1, rank - 1), min_size=2, max_size=2, unique=True))
        opts.append(Opt("swap", first, second))
    if reduces and draw(st.booleans()):
        opts.append(Opt("unroll", draw(st.integers(0, len(kernel.reduce_shape) - 1)),
                        draw(st.sampled_from([1, 2, 3, 4, 8]))))
    if (kernel.shape or reduces) and draw(st.booleans()):
        opts.append(Opt("vectorize", 0, draw(st.sampled_from([0, 1, 2, 4, 8, 16]))))
    if kernel.shape and kernel.shape[0] > 1 and draw(st.booleans()):
        opts.append(Opt("thread", 0, draw(st.integers(1, min(4, kernel.shape[0])))))
    acc = kernel.acc_dtype
    if acc is not None and partial_sum_split(kernel, accumulator_dtype(acc)) is not None:
        opts.append(Opt("split", draw(st.integers(1, len(kernel.reduce_shape) - 1))))
    return canonical(opts)


def compile_o3(kernel: Kernel) -> cpu.CompiledKernel:
    """Compile at O3 whatever the kernel's size (the loop hints only matter to an optimised build)."""
    target = cpu.host_target()
    source = render_llvm(kernel)
    engine, address = target.load(target.compile(source, 3), llvm_function_name(kernel))
    cpu.keep_engine(engine)
    return cpu.CompiledKernel(kernel, source, address, "compiled", 0.0)


@fuzz_settings
@given(program=programs(), data=st.data())
def test_random_opts_compute_what_the_unoptimised_kernel_computes(
        program: tuple[str, Callable[..., Any], list[np.ndarray]], data: st.DataObject) -> None:
    label, fn, args = program
    ir = fg.make_ir(fn)(*args)
    rng = np.random.default_rng(0)
    for step in schedule(ir):
        if not isinstance(step, KernelStep):
            continue
        kernel = step.kernel
        inputs = [rng.standard_normal(a.shape).astype(a.dtype) if dtype_class(a.dtype) in "fh"
                  else np.zeros(a.shape, a.dtype) for a in kernel.in_avals]
        want = evaluate_kernel(kernel, inputs)
        terms = max(1, int(np.prod(kernel.reduce_shape)))
        for _ in range(CHOICES):
            chosen = data.draw(random_opts(kernel), label=f"opts of {kernel.name}")
            check_opts(kernel, chosen)
            got = [np.full(a.shape, 7, a.dtype) for a in kernel.out_avals]  # an output not written stays 7
            compile_o3(attrs.evolve(kernel, opts=chosen))(inputs, got)
            for number, (g, w) in enumerate(zip(got, want)):
                scale = max(1.0, float(np.nanmax(np.abs(w)))) if w.size else 1.0
                np.testing.assert_allclose(g, w, rtol=1e-5, atol=4e-7 * terms * scale, equal_nan=True,
                                           err_msg=f"{label}: kernel {kernel.name} output {number} with opts "
                                                   f"{' '.join(map(str, chosen))}")
