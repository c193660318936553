"""Scheduling: fusion is a contract (kernel counts), and scheduled kernels compute what the
reference interpreter computes (a differential property test over random programs)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices.reference import ReferenceDevice
from funcgrad.ir.core import IR
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower.kernel import Kernel, evaluate_kernel
from funcgrad.lower.plan import Plan
from funcgrad.lower.schedule import HostStep, KernelStep, schedule


def _opened(ir: IR) -> IR:
    return IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)


def kernels_of(fn, *args) -> list[Kernel]:
    ir = fg.make_ir(fn)(*args)
    return [s.kernel for s in schedule(_opened(ir)) if isinstance(s, KernelStep)]


def run_both(fn, *args, device=None):
    """(scheduled result, interpreter result) for ``fn`` traced on ``args``."""
    ir = fg.make_ir(fn)(*args)
    inputs = [np.asarray(a.numpy() if isinstance(a, fg.Tensor) else a, dtype=v.aval.dtype)
              for a, v in zip(fg.tree.leaves(args), ir.in_vars)]
    consts = [c.numpy() for c in ir.consts]
    plan = Plan(_opened(ir), device or ReferenceDevice())
    return plan.run(consts + inputs), eval_ir(ir, inputs, consts)


def _device(name: str):
    from funcgrad.devices.cpu import CPUDevice
    return ReferenceDevice() if name == "reference" else CPUDevice()


N = 16
A = np.random.default_rng(0).normal(size=(N, N)).astype(np.float32)
B = np.random.default_rng(1).normal(size=(N, N)).astype(np.float32)


def test_seed_matmul_is_one_kernel_without_an_n_cubed_intermediate():
    kernels = kernels_of(lambda a, b: (a.reshape(N, 1, N) * b.T.reshape(1, N, N)).sum(axis=2), A, B)
    assert len(kernels) == 1
    (k,) = kernels
    assert k.reduce_op == "sum" and k.shape == (N, N) and k.reduce_shape == (N,)
    assert all(a.shape == (N, N) for a in k.in_avals), "an N^3 intermediate was stored"


def test_elementwise_chain_of_ten_ops_is_one_kernel():
    def chain(x):
        for op in (fnp.sin, fnp.exp, fnp.tanh, fnp.abs, fnp.sqrt):
            x = op(x) * 1.5 + 0.25
        return x
    assert len(fg.make_ir(chain)(A).eqns) >= 10
    assert len(kernels_of(chain, A)) == 1


def test_relu_of_affine_is_one_kernel():
    assert len(kernels_of(lambda x, w, b: fnp.maximum(x @ w + b, 0.0), A, B, A[0])) == 1


def test_softmax_is_at_most_three_kernels():
    assert len(kernels_of(lambda x: x.softmax(-1), A)) <= 3


def test_layernorm_kernels():
    def layernorm(x):
        mean = x.mean(-1, keepdims=True)
        centered = x - mean
        return centered / fnp.sqrt((centered * centered).mean(-1, keepdims=True) + 1e-5)
    assert len(kernels_of(layernorm, A)) == 3  # mean, variance, normalize


def test_reduction_epilogue_fuses_but_broadcast_back_is_stored():
    (k,) = kernels_of(lambda x: fnp.sqrt(x.sum(-1) * 2.0 + 1.0), fnp.abs(fnp.asarray(A)))
    assert k.reduce_op == "sum" and "sqrt" in str(k)


MLP_SHAPES = [(8, 4), (4, 3), (3,)]


def mlp_loss(params, x):
    w1, w2, b2 = params
    hidden = fnp.tanh(x @ w1)
    logits = hidden @ w2 + b2
    return fnp.mean(-(logits - fnp.logsumexp(logits, axis=-1, keepdims=True))[:, 0])


def test_mlp_forward_and_backward_kernel_count_is_small_and_documented():
    params = [np.random.default_rng(i).normal(size=s).astype(np.float32) for i, s in enumerate(MLP_SHAPES)]
    x = np.random.default_rng(9).normal(size=(5, 8)).astype(np.float32)
    kernels = kernels_of(fg.value_and_grad(mlp_loss), params, x)
    # documented in docs/architecture.md: forward 6 (x@w1+tanh, logits, max, sum-exp, loss), backward 5
    assert len(kernels) <= 12, [k.name for k in kernels]


def test_host_steps_for_primitives_without_kernels():
    ir = fg.make_ir(lambda x: fnp.sort(x * 2, axis=-1) + 1)(A)
    steps = schedule(_opened(ir))
    assert [type(s).__name__ for s in steps] == ["KernelStep", "HostStep", "KernelStep"]
    assert isinstance(steps[1], HostStep) and steps[1].eqn.primitive.name == "sort"


def test_jit_calls_are_inlined_so_fusion_crosses_them():
    inner = fg.jit(lambda x: fnp.sin(x) * 2)
    assert len(kernels_of(lambda x: inner(x) + 1, A)) == 1


@pytest.mark.parametrize("fn", [
    lambda a, b: (a.reshape(N, 1, N) * b.T.reshape(1, N, N)).sum(axis=2),
    lambda a, b: fnp.maximum(a @ b + a[0], 0.0),
    lambda a, b: a.softmax(-1) * b,
    lambda a, b: fnp.tanh(fnp.pad(a, ((1, 2), (0, 3)), constant_values=3.0)[::2, ::-1]),
    lambda a, b: fnp.concatenate([a, b * 2], axis=1).T.reshape(4, -1)[:, 1:7],
    lambda a, b: a.reshape(2, 8, 16).transpose(1, 0, 2).reshape(16, 16) + b,
    lambda a, b: fnp.flip(a, axis=0).max(axis=0, keepdims=True) - b.min(),
    lambda a, b: fnp.where(a > b, a, b * 3).prod(axis=1),
    lambda a, b: fnp.einsum("ij,jk->ki", a, b) + fnp.arange(16.0),
    lambda a, b: (a.astype("float16") * b.astype("float16")).sum(0).astype("float32"),
    lambda a, b: ((a > 0) & (b < 0)).astype("int32").sum(axis=1) + fnp.argmax(a, axis=1),
    fg.grad(lambda a, b: fnp.sum(fnp.tanh(a @ b) ** 2)),
])
@pytest.mark.parametrize("device", ["reference", "cpu"])
def test_scheduled_programs_match_the_interpreter(fn, device):
    got, want = run_both(fn, A, B, device=_device(device))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g.astype(np.float64), w.astype(np.float64), rtol=2e-3 if g.dtype == np.float16
                                   else 1e-5, atol=1e-5)


# --- differential property test over random programs ------------------------------------------

UNARY = [fnp.sin, fnp.exp, fnp.tanh, fnp.abs, fnp.negative, lambda x: fnp.sqrt(fnp.abs(x)), fnp.floor]
BINARY = [fnp.add, fnp.multiply, fnp.subtract, fnp.maximum, lambda a, b: a / (fnp.abs(b) + 1.0)]


def _program(draw_ops, x, y):
    """Apply a drawn list of operations to a pool that starts as [x, y]; returns a few values."""
    pool = [x, y]
    for kind, i, j, arg in draw_ops:
        a, b = pool[i % len(pool)], pool[j % len(pool)]
        if kind == "unary":
            out = UNARY[arg % len(UNARY)](a)
        elif kind == "binary":
            if a.shape != b.shape:
                b = fnp.broadcast_to(b.sum(), a.shape) if b.ndim else fnp.broadcast_to(b, a.shape)
            out = BINARY[arg % len(BINARY)](a, b)
        elif kind == "reduce" and a.ndim:
            axis = arg % a.ndim
            # max/min of an empty axis (a[1:] of one row) has no identity and raises: sum it instead
            reducers = [a.sum, a.max, a.min] if a.shape[axis] else [a.sum]
            out = reducers[arg % len(reducers)](axis=axis, keepdims=bool(arg % 2))
        elif kind == "move" and a.ndim >= 2:
            choice = arg % 5
            out = (a.T if choice == 0 else a[::-1] if choice == 1 else a.reshape(-1) if choice == 2
                   else fnp.pad(a, ((1, 0), (0, 2))) if choice == 3 else a[1:, ::2])
        elif kind == "broadcast" and a.ndim == 1:
            out = fnp.broadcast_to(a[:, None], (a.shape[0], 3))
        else:
            out = a * 2.0
        pool.append(out)
    return pool[-1], pool[len(pool) // 2]


ops_strategy = st.lists(st.tuples(st.sampled_from(["unary", "binary", "reduce", "move", "broadcast"]),
                                  st.integers(0, 20), st.integers(0, 20), st.integers(0, 20)),
                        min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(ops=ops_strategy, rows=st.integers(1, 5), cols=st.integers(1, 5), device=st.sampled_from(["reference", "cpu"]))
def test_random_programs_schedule_to_the_interpreters_result(ops, rows, cols, device):
    rng = np.random.default_rng(rows * 10 + cols)
    x = rng.normal(size=(rows, cols)).astype(np.float32)
    y = rng.normal(size=(rows, cols)).astype(np.float32)
    got, want = run_both(lambda a, b: _program(ops, a, b), x, y, device=_device(device))
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(ops=ops_strategy, rows=st.integers(1, 4), cols=st.integers(1, 4))
def test_random_programs_lazily_and_under_jit_match_the_interpreter(ops, rows, cols):
    """The user-facing paths: eager (lazy realize on the default device) and fg.jit."""
    rng = np.random.default_rng(rows * 7 + cols)
    x = rng.normal(size=(rows, cols)).astype(np.float32)
    y = rng.normal(size=(rows, cols)).astype(np.float32)
    fn = lambda a, b: _program(ops, a, b)  # noqa: E731
    ir = fg.make_ir(fn)(x, y)
    want = eval_ir(ir, [x, y], [c.numpy() for c in ir.consts])
    eager = fn(fg.Tensor(x), fg.Tensor(y))
    jitted = fg.jit(fn)(fg.Tensor(x), fg.Tensor(y))
    for e, j, w in zip(eager, jitted, want):
        np.testing.assert_allclose(e.numpy(), w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(j.numpy(), w, rtol=1e-5, atol=1e-5)


def test_evaluate_kernel_handles_an_empty_reduction():
    ir = fg.make_ir(lambda x: x.sum(axis=1))(np.zeros((3, 0), np.float32))
    (step,) = [s for s in schedule(ir) if isinstance(s, KernelStep)]
    (out,) = evaluate_kernel(step.kernel, [np.zeros((3, 0), np.float32)])
    assert out.tolist() == [0.0, 0.0, 0.0]


def test_plans_release_intermediate_buffers_after_their_last_use():
    ir = _opened(fg.make_ir(lambda x: x.softmax(-1))(A))
    plan = Plan(ir, ReferenceDevice())
    stored = [s.outputs[0].id for s in plan.steps if isinstance(s, KernelStep)]
    released = [var_id for step_ids in plan.release_after for var_id in step_ids]
    # the max and the sum of exps are dropped once the last kernel has read them; the output is not
    assert sorted(released) == sorted(stored[:-1])
    assert plan.release_after[-1] == stored[:-1] or set(plan.release_after[-1]) == set(stored[:-1])
    (out,) = plan.run([A])
    np.testing.assert_allclose(out.sum(axis=-1), np.ones(N), rtol=1e-5)


def test_an_expensive_operand_of_a_product_is_stored_not_recomputed():
    """softmax's gradient feeding the output layer's weight gradient: each of its elements is read
    once per row of the other operand, so it is computed once into memory, not inside the product."""
    x = np.random.default_rng(3).normal(size=(64, 40)).astype(np.float32)
    h = np.random.default_rng(4).normal(size=(64, 30)).astype(np.float32)
    kernels = kernels_of(lambda x, h: h.T @ fnp.exp(x), x, h)
    product = [k for k in kernels if k.reduce_op == "sum"]
    assert len(product) == 1 and "exp" not in str(product[0]), [str(k) for k in kernels]
    assert any("exp" in str(k) for k in kernels)
    cheap = kernels_of(lambda x, h: h.T @ (x * 2.0 + 1.0), x, h)
    assert len(cheap) == 1  # a cheap elementwise operand stays fused
    want = h.T.astype(np.float64) @ np.exp(x.astype(np.float64))
    np.testing.assert_allclose(np.asarray(fg.jit(lambda x, h: h.T @ fnp.exp(x))(x, h)), want, rtol=1e-5,
                               atol=1e-5 * np.abs(want).max())
