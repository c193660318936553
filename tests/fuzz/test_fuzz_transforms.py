"""Differential fuzzing of the transforms on random programs of primitives (tests/fuzz/programs.py).

Every drawn program runs as NumPy float64 (the reference) and through funcgrad: eagerly (lazy
Tensors, compiled kernels), under ``jit``, as ``make_ir`` + the reference interpreter, and under
``grad``, ``jvp``, ``vmap`` and the compositions ``jit(grad)``, ``grad(jit)``, ``jit(jvp)``,
``vmap(grad)``, ``jit(vmap(grad))`` and ``jvp(grad)``. Derivatives are checked against central
finite differences of the NumPy float64 program, never against another transform.

Tolerances, all of the form ``|got - expected| <= rtol * (|expected| + scale)`` (measured over a few
hundred cases; a wrong rule is off by far more):

- float32 forward values against float64: ``FORWARD_RTOL``, ``scale`` the largest magnitude of any
  value the program computes (>= 1): float32 rounding amplified by cancellation (largest seen ~1e-7);
- float64 derivatives against central differences of step ``FD_STEP``: ``FD_RTOL``, ``scale`` the
  largest magnitude of the expected derivative (>= 1): truncation (h^2 times the third derivative)
  plus rounding (eps |f| / h), largest seen ~3e-10;
- the Hessian-vector product against central differences of the gradient (step ``HVP_STEP``):
  ``HVP_RTOL`` likewise;
- ``vmap`` against a Python loop over the examples, both float64: ``VMAP_RTOL`` likewise (batched
  kernels may sum in another order);
- large programs (up to 20,000 elements) compiled in float32 against the interpreter's float64 run
  of the same IR, values and gradients: ``LARGE_RTOL`` (largest seen ~3e-7).

``FUNCGRAD_FUZZ_EXAMPLES`` sets the number of cases per test, ``FUNCGRAD_FUZZ_SEED`` the seed
(tests/fuzz/README.md).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from programs import FuzzCase, as_function, fuzz, fuzz_cases, program_values, run_program

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir.core import typecheck
from funcgrad.ir.interpreter import eval_ir

FORWARD_RTOL = 2e-6
FD_STEP = 1e-6
FD_RTOL = 1e-6
HVP_STEP = 1e-5
HVP_RTOL = 1e-5
VMAP_RTOL = 1e-10
LARGE_RTOL = 1e-5


def f32(arrays: Sequence[np.ndarray]) -> list[fg.Tensor]:
    return [fnp.asarray(a.astype(np.float32)) for a in arrays]


def f64(arrays: Sequence[np.ndarray]) -> list[fg.Tensor]:
    return [fnp.asarray(a, dtype="float64") for a in arrays]


def numpy_leaves(value: Any) -> list[np.ndarray]:
    return [leaf.numpy() for leaf in fg.tree.leaves(value)]


def output_weights(case: FuzzCase, seed: int = 0) -> list[np.ndarray]:
    """Random weights of the linear functional ``sum_i sum(output_i * weights_i)``."""
    rng = np.random.default_rng(seed)
    return [rng.normal(size=np.shape(out)) for out in run_program(case.program, np, case.inputs)]


def functional(case: FuzzCase, weights: Sequence[np.ndarray]) -> Any:
    """The funcgrad scalar ``sum_i sum(output_i * weights_i)`` of the program (float64)."""
    program, weight_tensors = as_function(case.program), f64(weights)

    def scalar(*inputs: Any) -> Any:
        return sum(fnp.sum(out * w) for out, w in zip(program(*inputs), weight_tensors))
    return scalar


def numpy_functional(case: FuzzCase, weights: Sequence[np.ndarray], inputs: Sequence[np.ndarray]) -> float:
    return float(sum(np.sum(out * w) for out, w in zip(run_program(case.program, np, inputs), weights)))


def finite_difference_gradient(case: FuzzCase, weights: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Central differences of the NumPy functional in every coordinate of every input."""
    gradients = []
    for i, x in enumerate(case.inputs):
        gradient = np.zeros(x.shape)
        for index in np.ndindex(x.shape):
            plus, minus = [a.copy() for a in case.inputs], [a.copy() for a in case.inputs]
            plus[i][index] += FD_STEP
            minus[i][index] -= FD_STEP
            gradient[index] = (numpy_functional(case, weights, plus)
                               - numpy_functional(case, weights, minus)) / (2 * FD_STEP)
        gradients.append(gradient)
    return gradients


def assert_matches(got: Sequence[np.ndarray], expected: Sequence[np.ndarray], rtol: float, what: str,
                   scale: float | None = None) -> None:
    """``|got - expected| <= rtol * (|expected| + scale)`` leaf by leaf, shapes equal; ``scale`` is the
    largest magnitude in ``expected`` (at least 1) unless given."""
    assert len(got) == len(expected), (what, len(got), len(expected))
    if scale is None:
        scale = max([1.0] + [float(np.max(np.abs(e))) for e in expected if np.size(e)])
    for i, (g, e) in enumerate(zip(got, expected)):
        assert np.shape(g) == np.shape(e), (what, i, np.shape(g), np.shape(e))
        np.testing.assert_allclose(g, e, rtol=rtol, atol=rtol * scale, err_msg=f"{what}, output {i}")


@fuzz
@given(case=fuzz_cases())
def test_forward_eager_jit_and_interpreter_match_numpy(case: FuzzCase) -> None:
    expected = [np.asarray(out) for out in run_program(case.program, np, case.inputs)]
    program = as_function(case.program)
    eager = numpy_leaves(program(*f32(case.inputs)))
    assert all(leaf.dtype == np.float32 for leaf in eager), [leaf.dtype for leaf in eager]
    assert_matches(eager, expected, FORWARD_RTOL, "eager", scale=case.scale)
    jitted = numpy_leaves(fg.jit(program)(*f32(case.inputs)))
    assert_matches(jitted, expected, FORWARD_RTOL, "jit", scale=case.scale)
    ir = fg.make_ir(program)(*f32(case.inputs))
    typecheck(ir)
    interpreted = eval_ir(ir, [x.astype(np.float32) for x in case.inputs], [c.numpy() for c in ir.consts])
    assert_matches(interpreted, expected, FORWARD_RTOL, "interpreter", scale=case.scale)


@fuzz
@given(case=fuzz_cases())
def test_lazy_values_realized_in_any_order_match_numpy(case: FuzzCase) -> None:
    """Eager values share one pending graph: realizing some intermediates first (in a random order)
    must not change any value, the ones realized later included."""
    expected = program_values(case.program, np, case.inputs)
    values = program_values(case.program, fnp, f32(case.inputs))
    order = np.random.default_rng(6).permutation(len(values))
    got: dict[int, np.ndarray] = {}
    for k in order[:len(order) // 2]:
        got[int(k)] = values[k].numpy()
    outputs = numpy_leaves(run_program(case.program, fnp, values[:len(case.inputs)]))   # a fresh graph
    for k in order[len(order) // 2:]:
        got[int(k)] = values[k].numpy()
    assert_matches([got[k] for k in range(len(values))], [np.asarray(v) for v in expected], FORWARD_RTOL, "value",
                   scale=case.scale)
    assert_matches(outputs, [np.asarray(expected[o]) for o in case.program.outputs], FORWARD_RTOL, "output",
                   scale=case.scale)


@fuzz
@given(case=fuzz_cases())
def test_grad_and_jvp_match_finite_differences(case: FuzzCase) -> None:
    weights = output_weights(case)
    scalar = functional(case, weights)
    argnums = tuple(range(len(case.inputs)))
    expected = finite_difference_gradient(case, weights)
    for name, transformed in [("grad", fg.grad(scalar, argnums)), ("jit(grad)", fg.jit(fg.grad(scalar, argnums))),
                              ("grad(jit)", fg.grad(fg.jit(scalar), argnums))]:
        gradients = transformed(*f64(case.inputs))
        assert all(g.dtype == np.float64 for g in gradients), (name, [g.dtype for g in gradients])
        assert_matches(numpy_leaves(gradients), expected, FD_RTOL, name)

    rng = np.random.default_rng(1)
    directions = [rng.normal(size=x.shape) for x in case.inputs]
    plus = run_program(case.program, np, [x + FD_STEP * t for x, t in zip(case.inputs, directions)])
    minus = run_program(case.program, np, [x - FD_STEP * t for x, t in zip(case.inputs, directions)])
    expected_tangents = [(p - m) / (2 * FD_STEP) for p, m in zip(plus, minus)]
    expected_outputs = [np.asarray(out) for out in run_program(case.program, np, case.inputs)]
    program = as_function(case.program)

    def jit_of_jvp(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> Any:
        return fg.jit(lambda p, t: fg.jvp(program, p, t))(primals, tangents)

    for name, jvp in [("jvp", lambda p, t: fg.jvp(program, p, t)), ("jit(jvp)", jit_of_jvp)]:
        outputs, tangents = jvp(tuple(f64(case.inputs)), tuple(f64(directions)))
        assert_matches(numpy_leaves(outputs), expected_outputs, 1e-12, f"{name} primal")
        assert_matches(numpy_leaves(tangents), expected_tangents, FD_RTOL, name)


@fuzz
@given(case=fuzz_cases())
def test_hessian_vector_product_matches_differences_of_the_gradient(case: FuzzCase) -> None:
    weights = output_weights(case)
    gradient = fg.grad(functional(case, weights), tuple(range(len(case.inputs))))
    rng = np.random.default_rng(2)
    directions = [rng.normal(size=x.shape) for x in case.inputs]
    _, hvp = fg.jvp(gradient, tuple(f64(case.inputs)), tuple(f64(directions)))
    plus = numpy_leaves(gradient(*f64([x + HVP_STEP * t for x, t in zip(case.inputs, directions)])))
    minus = numpy_leaves(gradient(*f64([x - HVP_STEP * t for x, t in zip(case.inputs, directions)])))
    expected = [(p - m) / (2 * HVP_STEP) for p, m in zip(plus, minus)]
    assert_matches(numpy_leaves(hvp), expected, HVP_RTOL, "jvp(grad)")


@fuzz
@given(case=fuzz_cases())
def test_vmap_matches_a_loop(case: FuzzCase) -> None:
    rng = np.random.default_rng(3)
    # each input batched along a random axis or not at all; at least one batched
    in_axes: list[int | None] = [None if rng.random() < 0.3 else int(rng.integers(0, x.ndim + 1))
                                 for x in case.inputs]
    if all(axis is None for axis in in_axes):
        in_axes[0] = 0
    examples = [[x if axis is None else x + 0.01 * rng.normal(size=x.shape) for x, axis in zip(case.inputs, in_axes)]
                for _ in range(3)]
    stacked = [x if axis is None else np.stack([example[i] for example in examples], axis=axis)
               for i, (x, axis) in enumerate(zip(case.inputs, in_axes))]
    program = as_function(case.program)
    gradient = fg.grad(functional(case, output_weights(case)), tuple(range(len(case.inputs))))
    looped_outputs = [numpy_leaves(program(*f64(example))) for example in examples]
    looped_gradients = [numpy_leaves(gradient(*f64(example))) for example in examples]
    expected_outputs = [np.stack(outputs) for outputs in zip(*looped_outputs)]
    expected_gradients = [np.stack(gradients) for gradients in zip(*looped_gradients)]
    axes = tuple(in_axes)
    # the batch axis of the outputs first or last
    out_axis = int(rng.integers(2)) - 1
    batched_outputs = numpy_leaves(fg.vmap(program, in_axes=axes, out_axes=out_axis)(*f64(stacked)))
    assert_matches([np.moveaxis(out, out_axis, 0) for out in batched_outputs], expected_outputs, VMAP_RTOL, "vmap")
    for name, batched in [("vmap(grad)", fg.vmap(gradient, in_axes=axes)),
                          ("jit(vmap(grad))", fg.jit(fg.vmap(gradient, in_axes=axes)))]:
        assert_matches(numpy_leaves(batched(*f64(stacked))), expected_gradients, VMAP_RTOL, name)


def finite_difference_jacobian(case: FuzzCase) -> list[np.ndarray]:
    """d output_o / d input_i by central differences, output-major: [(o0, i0), (o0, i1), ..., (o1, i0), ...]."""
    outputs = [np.asarray(out) for out in run_program(case.program, np, case.inputs)]
    jacobians = [[np.zeros(out.shape + x.shape) for x in case.inputs] for out in outputs]
    for i, x in enumerate(case.inputs):
        for index in np.ndindex(x.shape):
            plus, minus = [a.copy() for a in case.inputs], [a.copy() for a in case.inputs]
            plus[i][index] += FD_STEP
            minus[i][index] -= FD_STEP
            for o, (p, m) in enumerate(zip(run_program(case.program, np, plus), run_program(case.program, np, minus))):
                jacobians[o][i][(...,) + index] = (np.asarray(p) - np.asarray(m)) / (2 * FD_STEP)
    return [jacobian for per_output in jacobians for jacobian in per_output]


@fuzz
@given(case=fuzz_cases())
def test_jacobians_linearize_and_vjp_match_finite_differences(case: FuzzCase) -> None:
    program = as_function(case.program)
    argnums = tuple(range(len(case.inputs)))
    expected = finite_difference_jacobian(case)
    for name, jacobian in [("jacfwd", fg.jacfwd(program, argnums)), ("jacrev", fg.jacrev(program, argnums))]:
        assert_matches(numpy_leaves(jacobian(*f64(case.inputs))), expected, FD_RTOL, name)

    rng = np.random.default_rng(4)
    count = len(case.inputs)
    by_output = [expected[o * count:(o + 1) * count] for o in range(len(expected) // count)]
    directions = [rng.normal(size=x.shape) for x in case.inputs]
    expected_tangents = [sum(np.tensordot(j, t, axes=t.ndim) for j, t in zip(row, directions)) for row in by_output]
    _, linearized = fg.linearize(program, *f64(case.inputs))
    assert_matches(numpy_leaves(linearized(*f64(directions))), expected_tangents, FD_RTOL, "linearize")

    cotangents = [rng.normal(size=row[0].shape[:row[0].ndim - case.inputs[0].ndim]) for row in by_output]
    expected_cotangents = [sum(np.tensordot(ct, row[i], axes=ct.ndim) for ct, row in zip(cotangents, by_output))
                           for i in range(count)]
    _, pullback = fg.vjp(program, *f64(case.inputs))
    assert_matches(numpy_leaves(pullback(tuple(f64(cotangents)))), expected_cotangents, FD_RTOL, "vjp")


@fuzz
@given(case=fuzz_cases())
def test_nested_vmap_and_vmap_of_jvp_match_loops(case: FuzzCase) -> None:
    rng = np.random.default_rng(5)
    program = as_function(case.program)
    # two batch axes on the first input (outer 2, inner 3), the others unbatched
    first = case.inputs[0]
    grid = [[first + 0.01 * rng.normal(size=first.shape) for _ in range(3)] for _ in range(2)]
    rest = list(case.inputs[1:])
    looped = [[numpy_leaves(program(*f64([x] + rest))) for x in row] for row in grid]
    expected = [np.stack([np.stack([outs[j] for outs in row]) for row in looped]) for j in range(len(looped[0][0]))]
    in_axes = (0,) + (None,) * len(rest)
    nested = fg.vmap(fg.vmap(program, in_axes=in_axes), in_axes=in_axes)
    assert_matches(numpy_leaves(nested(*f64([np.stack([np.stack(row) for row in grid])] + rest))), expected,
                   VMAP_RTOL, "vmap(vmap)")

    directions = [rng.normal(size=first.shape) for _ in range(3)]
    def tangent_of(x: Any, t: Any) -> Any:
        return fg.jvp(program, tuple([x] + f64(rest)), tuple([t] + f64([np.zeros_like(r) for r in rest])))[1]
    looped_tangents = [numpy_leaves(tangent_of(*f64([x, t]))) for x, t in zip(grid[0], directions)]
    expected_tangents = [np.stack(leaves) for leaves in zip(*looped_tangents)]
    batched = fg.vmap(tangent_of)(*f64([np.stack(grid[0]), np.stack(directions)]))
    assert_matches(numpy_leaves(batched), expected_tangents, VMAP_RTOL, "vmap(jvp)")


def interpret(fn: Any, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``fn`` traced with make_ir (typechecked) and run by the reference interpreter (NumPy)."""
    ir = fg.make_ir(fn)(*[fnp.asarray(a, dtype=a.dtype.name) for a in args])
    typecheck(ir)
    return eval_ir(ir, list(args), [c.numpy() for c in ir.consts])


@functools.partial(fuzz, share=0.1)   # each large case compiles kernels of its own shapes (seconds)
@given(case=fuzz_cases(large=True))
def test_large_programs_and_their_gradients_compile_like_the_interpreter(case: FuzzCase) -> None:
    """Values up to 20,000 elements reach the compiler's vectorised and split-sum kernels: the
    compiled float32 program and its gradient against the interpreter's float64 run of the same IR."""
    program = as_function(case.program)
    expected = interpret(program, [x.astype(np.float64) for x in case.inputs])
    assert_matches(numpy_leaves(program(*f32(case.inputs))), expected, LARGE_RTOL, "eager", scale=case.scale)
    assert_matches(numpy_leaves(fg.jit(program)(*f32(case.inputs))), expected, LARGE_RTOL, "jit", scale=case.scale)
    weights = output_weights(case)
    gradient = fg.grad(functional(case, weights), tuple(range(len(case.inputs))))
    expected_gradients = interpret(gradient, [x.astype(np.float64) for x in case.inputs])
    compiled_gradients = fg.jit(fg.grad(functional32(case, weights), tuple(range(len(case.inputs)))))
    assert_matches(numpy_leaves(compiled_gradients(*f32(case.inputs))), expected_gradients, LARGE_RTOL, "jit(grad)")


def functional32(case: FuzzCase, weights: Sequence[np.ndarray]) -> Any:
    """``functional`` in float32."""
    program, weight_tensors = as_function(case.program), f32(weights)

    def scalar(*inputs: Any) -> Any:
        return sum(fnp.sum(out * w) for out, w in zip(program(*inputs), weight_tensors))
    return scalar


def _batch_of_one(fn: Any) -> Any:
    """``fn`` through vmap over a batch of one (every argument batched), unbatched again."""
    def batched(*args: Any) -> Any:
        out = fg.vmap(fn)(*[fnp.expand_dims(a, 0) for a in args])
        return fg.tree.map(lambda leaf: leaf[0], out)
    return batched


def _batch_of_two(fn: Any) -> Any:
    """``fn`` through vmap over two copies of the first argument (the others unbatched), first copy kept."""
    def batched(first: Any, *rest: Any) -> Any:
        out = fg.vmap(fn, in_axes=(0,) + (None,) * len(rest))(fnp.stack([first, first]), *rest)
        return fg.tree.map(lambda leaf: leaf[1], out)
    return batched


def _jvp_primal(fn: Any) -> Any:
    """The primal output of ``jvp`` along a zero tangent."""
    return lambda *args: fg.jvp(fn, args, tuple(fnp.zeros_like(a) for a in args))[0]


def _linearize_primal(fn: Any) -> Any:
    return lambda *args: fg.linearize(fn, *args)[0]


# wrappers that keep a function's signature and value, so any stack of them around (or inside) grad
# must still give the finite-difference gradient
WRAPPERS = {"jit": fg.jit, "checkpoint": fg.checkpoint, "vmap(batch of 1)": _batch_of_one,
            "vmap(batch of 2)": _batch_of_two, "jvp primal": _jvp_primal, "linearize primal": _linearize_primal}


@fuzz
@given(case=fuzz_cases(max_steps=5), inner=st.lists(st.sampled_from(sorted(WRAPPERS)), max_size=2),
       outer=st.lists(st.sampled_from(sorted(WRAPPERS)), max_size=2))
def test_random_stacks_of_transforms_around_grad_match_finite_differences(case: FuzzCase, inner: list[str],
                                                                          outer: list[str]) -> None:
    weights = output_weights(case)
    scalar = functional(case, weights)
    for name in inner:
        scalar = WRAPPERS[name](scalar)
    gradient = fg.grad(scalar, tuple(range(len(case.inputs))))
    for name in outer:
        gradient = WRAPPERS[name](gradient)
    what = " o ".join(reversed(outer)) + (" o " if outer else "") + "grad" + "".join(f" o {n}" for n in inner)
    assert_matches(numpy_leaves(gradient(*f64(case.inputs))), finite_difference_gradient(case, weights), FD_RTOL, what)
