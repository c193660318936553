"""Hessian-vector products (jvp of grad) of MLPs: the rules their kernels rely on.

* ``schedule.products_in_reader_layout``: ``transpose(p1 + p2)`` of products (a middle layer's weight
  gradient under jvp: ``transpose(dY.T @ X + dY'.T @ X')``, as ``dot_general``'s transpose rule writes
  it) is computed as the swapped products, so no product is stored in the transposed layout and read
  with a stride of a row by the other's epilogue;
* ``simplify``'s commutative CSE (``t * c + c * t`` computes ``t * c`` once) and the folding of
  elementwise equations on broadcast scalars (``c + c``).

Results against the reference interpreter, float64 NumPy finite differences and JAX."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir import primitives as P
from funcgrad.ir.core import IR
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower import kernel as K
from funcgrad.lower import schedule as S

ACTIVATIONS: dict[str, Callable[[Any, Any], Any]] = {
    "tanh": lambda xp, h: xp.tanh(h),
    "relu": lambda xp, h: xp.maximum(h, 0.0),
    "gelu": lambda xp, h: 0.5 * h * (1.0 + xp.tanh(0.7978845608 * (h + 0.044715 * h * h * h))),
}


def _opened(ir: IR) -> IR:
    return IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)


def _kernels(fn: Callable[..., Any], *args: Any) -> list[K.Kernel]:
    ir = fg.make_ir(fn)(*args)
    return [s.kernel for s in S.schedule(_opened(ir), row_reductions=True) if isinstance(s, S.KernelStep)]


def _params(rng: np.random.Generator, widths: tuple[int, ...]) -> list[np.ndarray]:
    out = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        out += [(rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32),
                (0.1 * rng.standard_normal(fan_out)).astype(np.float32)]
    return out


def _loss(xp: Any, activation: str, params: list[Any], x: Any, y: Any) -> Any:
    h = x
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        if i + 2 < len(params):
            h = ACTIVATIONS[activation](xp, h)
    return xp.mean((h - y) * (h - y))


def _hvp(grad: Any, jvp: Any, xp: Any, activation: str) -> Callable[..., Any]:
    gradient = grad(lambda p, x, y: _loss(xp, activation, p, x, y))
    return lambda params, tangents, x, y: jvp(lambda p: gradient(p, x, y), (params,), (tangents,))[1]


def _inputs(batch: int, widths: tuple[int, ...], seed: int = 0) -> tuple[list[np.ndarray], ...]:
    rng = np.random.default_rng(seed)
    return (_params(rng, widths), _params(rng, widths),
            [rng.standard_normal((batch, widths[0])).astype(np.float32)],
            [rng.standard_normal((batch, widths[-1])).astype(np.float32)])


_DERIVATIVES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "tanh": lambda z: 1.0 - np.tanh(z) ** 2,
    "relu": lambda z: (z > 0).astype(np.float64),
    "gelu": lambda z: _gelu_derivative(z),
}


def _gelu_derivative(z: np.ndarray) -> np.ndarray:
    """d/dz of 0.5 z (1 + tanh(u)), u = c (z + a z^3)."""
    t = np.tanh(0.7978845608 * (z + 0.044715 * z ** 3))
    return 0.5 * (1.0 + t) + 0.5 * z * (1.0 - t * t) * 0.7978845608 * (1.0 + 3 * 0.044715 * z * z)


def _numpy_gradient(activation: str, params: list[np.ndarray], x: np.ndarray, y: np.ndarray) -> list[np.ndarray]:
    """The loss's gradient by hand-written backpropagation in NumPy float64."""
    h, inputs, pre = x, [], []
    for i in range(0, len(params), 2):
        inputs.append(h)
        z = h @ params[i] + params[i + 1]
        pre.append(z)
        h = ACTIVATIONS[activation](np, z) if i + 2 < len(params) else z
    dz = 2.0 * (h - y) / h.size
    grads: list[np.ndarray] = [np.empty(0)] * len(params)
    for layer in reversed(range(len(params) // 2)):
        grads[2 * layer], grads[2 * layer + 1] = inputs[layer].T @ dz, dz.sum(axis=0)
        if layer:
            dz = (dz @ params[2 * layer].T) * _DERIVATIVES[activation](pre[layer - 1])
    return grads


def _float64_hvp(activation: str, params: list[np.ndarray], tangents: list[np.ndarray], x: np.ndarray,
                 y: np.ndarray, eps: float = 1e-5) -> list[np.ndarray]:
    """Central differences of the float64 NumPy gradient along the tangents."""
    p64, x64, y64 = [p.astype(np.float64) for p in params], x.astype(np.float64), y.astype(np.float64)
    plus = _numpy_gradient(activation, [p + eps * t for p, t in zip(p64, tangents)], x64, y64)
    minus = _numpy_gradient(activation, [p - eps * t for p, t in zip(p64, tangents)], x64, y64)
    return [(a - b) / (2 * eps) for a, b in zip(plus, minus)]


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
@pytest.mark.parametrize("batch,widths", [(7, (6, 9, 5, 3)), (12, (20, 33, 17, 4)), (5, (8, 16, 16, 16, 2))])
def test_hvp_matches_the_references(activation: str, batch: int, widths: tuple[int, ...]) -> None:
    params, tangents, (x,), (y,) = _inputs(batch, widths)
    hvp = _hvp(fg.grad, fg.jvp, fnp, activation)
    got = [g.numpy() for g in fg.jit(hvp)([fnp.asarray(p) for p in params], [fnp.asarray(t) for t in tangents],
                                           fnp.asarray(x), fnp.asarray(y))]
    ir = fg.make_ir(hvp)(params, tangents, x, y)
    interpreted = eval_ir(ir, [*params, *tangents, x, y])
    expected = _float64_hvp(activation, params, tangents, x, y)
    assert all(e.dtype == np.float64 for e in expected)
    for g, i, e in zip(got, interpreted, expected):
        scale = float(np.abs(e).max()) or 1.0
        np.testing.assert_allclose(g, i, atol=2e-5 * scale, rtol=0)
        np.testing.assert_allclose(g, e, atol=2e-3 * scale, rtol=0)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_hvp_matches_jax(activation: str) -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    params, tangents, (x,), (y,) = _inputs(12, (20, 33, 17, 4))
    hvp = _hvp(fg.grad, fg.jvp, fnp, activation)
    got = fg.jit(hvp)([fnp.asarray(p) for p in params], [fnp.asarray(t) for t in tangents], fnp.asarray(x),
                      fnp.asarray(y))
    jaxed = jax.jit(_hvp(jax.grad, jax.jvp, jnp, activation))(params, tangents, x, y)
    for g, j in zip(got, jaxed):
        j = np.asarray(j)
        np.testing.assert_allclose(g.numpy(), j, atol=2e-5 * (float(np.abs(j).max()) or 1.0), rtol=0)


@pytest.mark.parametrize("activation", sorted(ACTIVATIONS))
def test_no_weight_gradient_is_stored_in_the_transposed_layout(activation: str) -> None:
    """Every product kernel of the HVP iterates over (batch, out), (batch, in) or a weight's own (in, out)
    layout: none over a weight's (out, in), which a later kernel would read with a stride of a row."""
    batch, widths = 12, (20, 33, 17, 4)
    params, tangents, (x,), (y,) = _inputs(batch, widths)
    kernels = _kernels(_hvp(fg.grad, fg.jvp, fnp, activation), params, tangents, x, y)
    transposed = {(b, a) for a, b in zip(widths[:-1], widths[1:])}
    shapes = [tuple(k.shape) for k in kernels if k.reduce_op == "sum"]
    assert not transposed & set(shapes), shapes
    for a, b in zip(widths[:-1], widths[1:]):
        assert (a, b) in shapes  # the weights' gradients, in their own layout


def _loads(e: K.KExpr, found: list[K.KExpr]) -> list[K.KExpr]:
    if e.op == "load":
        found.append(e)
    for a in e.args:
        _loads(a, found)
    return found


@pytest.mark.parametrize("rows,inner,columns", [(40, 24, 56), (9, 64, 33)])
def test_a_sum_of_transposed_products_is_computed_in_its_layout(rows: int, inner: int, columns: int) -> None:
    """``x.T @ g + (g2.T @ x2).T`` and ``(g.T @ x + g2.T @ x2).T``: both products iterate over the result's
    (columns of x, columns of g) layout; the epilogue reads the stored one contiguously; values exact."""
    rng = np.random.default_rng(3)
    x, x2 = (rng.standard_normal((inner, rows)).astype(np.float32) for _ in range(2))
    g, g2 = (rng.standard_normal((inner, columns)).astype(np.float32) for _ in range(2))
    for fn in (lambda x, g, x2, g2: x.T @ g + (g2.T @ x2).T, lambda x, g, x2, g2: (g.T @ x + g2.T @ x2).T):
        kernels = _kernels(fn, x, g, x2, g2)
        assert [tuple(k.shape) for k in kernels] == [(rows, columns)] * 2
        reader = kernels[-1]
        stored = [ld for ld in _loads(reader.outputs[0], []) if reader.in_avals[ld.arg].shape == (rows, columns)]
        strides = [{k: v for k, v in (K._affine(ld.args[0]) or {}).items() if k is not None} for ld in stored]
        assert strides and all(s == {K.var("g1"): 1, K.var("g0"): columns} for s in strides), strides
        got = fg.jit(fn)(*(fnp.asarray(a) for a in (x, g, x2, g2))).numpy()
        want = x.astype(np.float64).T @ g + x2.astype(np.float64).T @ g2
        np.testing.assert_allclose(got, want, atol=1e-4 * np.abs(want).max(), rtol=0)


def test_the_rewrite_keeps_batch_axes_and_leaves_other_transposes() -> None:
    """A batched product's transpose that swaps its free axes becomes the swapped batched product; a
    transpose that moves the batch axis, or of a product read elsewhere too, is left alone."""
    rng = np.random.default_rng(4)
    a, b, c, d = (rng.standard_normal(s).astype(np.float32) for s in ((3, 5, 4), (3, 4, 6), (3, 5, 4), (3, 4, 6)))

    def swapped(a: Any, b: Any, c: Any, d: Any) -> Any:
        return fnp.swapaxes(a @ b - c @ d, 1, 2)

    def batch_moved(a: Any, b: Any, c: Any, d: Any) -> Any:
        return fnp.transpose(a @ b + c @ d, (1, 0, 2))

    def read_twice(a: Any, b: Any, c: Any, d: Any) -> Any:
        p = a @ b + c @ d
        return fnp.swapaxes(p, 1, 2), p

    def transposes(fn: Callable[..., Any]) -> int:
        ir = S.products_in_reader_layout(S.inline_calls(_opened(fg.make_ir(fn)(a, b, c, d))))
        return sum(1 for e in ir.eqns if e.primitive is P.transpose_p and e.inputs[0].aval.ndim == 3)

    assert transposes(swapped) == 0
    assert transposes(batch_moved) == 1
    assert transposes(read_twice) == 1
    for fn in (swapped, batch_moved, read_twice):
        got = fg.jit(fn)(*(fnp.asarray(v) for v in (a, b, c, d)))
        want = eval_ir(fg.make_ir(fn)(a, b, c, d), [a, b, c, d])
        for g, w in zip(fg.tree.leaves(got), want):
            np.testing.assert_allclose(g.numpy(), w, atol=1e-5, rtol=1e-5)


def test_commutative_products_and_sums_are_computed_once() -> None:
    """``x * y + y * x`` has one ``mul`` (the same bits as ``2 * (x * y)``); ``max`` keeps both orders
    (``max(-0.0, 0.0)`` depends on it)."""
    rng = np.random.default_rng(5)
    x, y = (rng.standard_normal((4, 5)).astype(np.float32) for _ in range(2))
    ir = fg.make_ir(lambda x, y: x * y + y * x)(x, y)
    assert [e.primitive.name for e in ir.eqns] == ["mul", "add"]
    got = fg.jit(lambda x, y: x * y + y * x)(fnp.asarray(x), fnp.asarray(y)).numpy()
    np.testing.assert_array_equal(got, (x * y) + (x * y))
    ir = fg.make_ir(lambda x, y: (x + y) * (y + x))(x, y)
    assert [e.primitive.name for e in ir.eqns] == ["add", "mul"]
    ir = fg.make_ir(lambda x, y: fnp.maximum(x, y) - fnp.maximum(y, x))(x, y)
    assert [e.primitive.name for e in ir.eqns].count("max") == 2


def test_the_squared_error_tangent_multiplies_once() -> None:
    """The jvp of the gradient of ``mean((h - y) * (h - y))`` is ``t * c + c * t``: ``t * c`` computed once."""
    rng = np.random.default_rng(6)
    h, y, t = (rng.standard_normal((6, 3)).astype(np.float32) for _ in range(3))
    loss = lambda h: fnp.mean((h - y) * (h - y))
    ir = fg.make_ir(lambda h, t: fg.jvp(fg.grad(loss), (h,), (t,))[1])(h, t)
    assert [e.primitive.name for e in ir.eqns] == ["broadcast_in_dim", "mul", "add"], ir
    got = fg.jit(lambda h, t: fg.jvp(fg.grad(loss), (h,), (t,))[1])(fnp.asarray(h), fnp.asarray(t)).numpy()
    np.testing.assert_allclose(got, 2 * t.astype(np.float64) / h.size, rtol=1e-6)


def test_broadcast_scalars_fold() -> None:
    """An elementwise equation of broadcast scalar literals is the broadcast of the folded scalar."""
    ir = fg.make_ir(lambda x: x * (fnp.full((3,), 0.25, dtype=fnp.float32) + fnp.full((3,), 0.25, dtype=fnp.float32)))(
        np.ones(3, np.float32))
    consts = [e for e in ir.eqns if e.primitive is P.broadcast_in_dim_p]
    assert [e.primitive.name for e in ir.eqns] == ["broadcast_in_dim", "mul"], ir
    assert float(consts[0].inputs[0].value) == 0.5
