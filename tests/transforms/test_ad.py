"""The public differentiation API: jvp, vjp, grad, value_and_grad, linearize, jacfwd, jacrev, hessian."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp

rng = np.random.default_rng(0)
W = rng.normal(size=(3, 4))
X = rng.normal(size=(5, 3))


def f64(x):
    return fnp.asarray(x, dtype="float64")


def mlp_loss(params, x):
    w, b = params["w"], params["b"]
    return fnp.sum(fnp.tanh(x @ w + b) ** 2)


def numeric_grad(fn, x, eps=1e-6):
    x = np.asarray(x, np.float64)
    out = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = eps
        out[i] = (fn(x + step) - fn(x - step)) / (2 * eps)
    return out


def test_grad_of_pytree_params_matches_finite_differences():
    params = {"w": f64(W), "b": f64(np.zeros(4))}
    grads = fg.grad(mlp_loss)(params, f64(X))
    assert set(grads) == {"w", "b"} and grads["w"].shape == (3, 4)
    expected = numeric_grad(lambda w: mlp_loss({"w": f64(w), "b": f64(np.zeros(4))}, f64(X)).item(), W)
    np.testing.assert_allclose(grads["w"].numpy(), expected, rtol=1e-6, atol=1e-8)


def test_value_and_grad_argnums_tuple_and_has_aux():
    def loss(w, x):
        pred = x @ w
        return fnp.sum(pred ** 2), {"pred": pred}
    (value, aux), (gw, gx) = fg.value_and_grad(loss, argnums=(0, 1), has_aux=True)(f64(W), f64(X))
    assert value.item() == pytest.approx(float(np.sum((X @ W) ** 2)))
    np.testing.assert_allclose(aux["pred"].numpy(), X @ W)
    np.testing.assert_allclose(gw.numpy(), 2 * X.T @ (X @ W), rtol=1e-10)
    np.testing.assert_allclose(gx.numpy(), 2 * (X @ W) @ W.T, rtol=1e-10)
    g, aux2 = fg.grad(loss, has_aux=True)(f64(W), f64(X))
    assert g.shape == W.shape and aux2["pred"].shape == (5, 4)


def test_grad_rejects_integer_inputs_and_nonscalar_outputs():
    with pytest.raises(TypeError, match="requires real-valued.*argument 0 .*int32"):
        fg.grad(lambda n: n * 2.0)(fnp.arange(3))
    with pytest.raises(TypeError, match="requires a function returning a real scalar.*shape \\(3,\\)"):
        fg.grad(lambda x: x * 2)(fnp.ones(3))
    with pytest.raises(ValueError, match="argnums 2 is out of range"):
        fg.grad(lambda x, y: x * y, argnums=2)(1.0, 2.0)


def test_integer_inputs_get_zero_cotangents_in_vjp():
    out, pullback = fg.vjp(lambda x, n: x * n, fnp.ones(3), fnp.arange(3))
    ct_x, ct_n = pullback(fnp.ones(3))
    assert ct_x.tolist() == [0.0, 1.0, 2.0]
    assert ct_n.tolist() == [0, 0, 0] and ct_n.dtype == fnp.int32


def test_jvp_and_vjp_agree():
    a, b = f64(rng.normal(size=(3, 4))), f64(rng.normal(size=(3, 4)))
    ta, tb = f64(rng.normal(size=(3, 4))), f64(rng.normal(size=(3, 4)))
    ct = f64(rng.normal(size=(3, 4)))
    _, tangent_out = fg.jvp(lambda a, b: fnp.sin(a) * b, (a, b), (ta, tb))
    _, pullback = fg.vjp(lambda a, b: fnp.sin(a) * b, a, b)
    cta, ctb = pullback(ct)
    lhs = float(np.sum(tangent_out.numpy() * ct.numpy()))
    rhs = float(np.sum(cta.numpy() * ta.numpy()) + np.sum(ctb.numpy() * tb.numpy()))
    assert lhs == pytest.approx(rhs, rel=1e-12)


def test_jvp_checks_tangent_structure_and_types():
    with pytest.raises(ValueError, match="different structures"):
        fg.jvp(lambda x, y: x * y, (1.0, 2.0), (1.0,))
    with pytest.raises(ValueError, match="tangent 0 has shape \\(2,\\)"):
        fg.jvp(fnp.sin, (fnp.ones(3),), (fnp.ones(2),))
    with pytest.raises(TypeError, match="dtype float16 but its primal has dtype float32"):
        fg.jvp(fnp.sin, (fnp.ones(3),), (fnp.ones(3, dtype="float16"),))
    with pytest.raises(TypeError, match="tuples"):
        fg.jvp(fnp.sin, fnp.ones(3), fnp.ones(3))


def test_vjp_checks_cotangent_shape():
    _, pullback = fg.vjp(fnp.sin, fnp.ones(3))
    with pytest.raises(ValueError, match="cotangent 0 has shape \\(2,\\)"):
        pullback(fnp.ones(2))


def test_linearize_reuses_the_forward_pass():
    x = f64([0.3, 0.7])
    out, jvp_fn = fg.linearize(lambda v: fnp.exp(v) * fnp.sin(v), x)
    np.testing.assert_allclose(out.numpy(), np.exp([0.3, 0.7]) * np.sin([0.3, 0.7]))
    t = f64([1.0, -2.0])
    expected = fg.jvp(lambda v: fnp.exp(v) * fnp.sin(v), (x,), (t,))[1]
    np.testing.assert_allclose(jvp_fn(t).numpy(), expected.numpy(), rtol=1e-12)


def test_jacobians_match_each_other_and_the_analytic_jacobian():
    def fn(x):
        return fnp.tanh(f64(W).T @ x) * 2
    x = f64(rng.normal(size=3))
    j_fwd, j_rev = fg.jacfwd(fn)(x), fg.jacrev(fn)(x)
    inner = W.T @ x.numpy()
    analytic = 2 * (1 - np.tanh(inner) ** 2)[:, None] * W.T
    np.testing.assert_allclose(j_fwd.numpy(), analytic, rtol=1e-10)
    np.testing.assert_allclose(j_rev.numpy(), analytic, rtol=1e-10)


def test_jacobian_of_pytrees_and_matrix_shapes():
    def fn(params):
        return {"out": params["a"] @ params["b"]}
    params = {"a": f64(rng.normal(size=(2, 3))), "b": f64(rng.normal(size=(3,)))}
    jac = fg.jacrev(fn)(params)
    assert jac["out"]["a"].shape == (2, 2, 3) and jac["out"]["b"].shape == (2, 3)
    jac_fwd = fg.jacfwd(fn)(params)
    np.testing.assert_allclose(jac_fwd["out"]["a"].numpy(), jac["out"]["a"].numpy(), rtol=1e-12)
    np.testing.assert_allclose(jac["out"]["b"].numpy(), params["a"].numpy(), rtol=1e-12)


def test_hessian_of_a_quadratic_and_of_logsumexp():
    A = rng.normal(size=(3, 3))
    A = A + A.T
    H = fg.hessian(lambda x: 0.5 * x @ (fnp.asarray(A, dtype="float64") @ x))(f64(np.ones(3)))
    np.testing.assert_allclose(H.numpy(), A, rtol=1e-10)
    x = f64([0.1, 0.5, -0.3])
    p = np.exp(x.numpy()) / np.exp(x.numpy()).sum()
    H2 = fg.hessian(lambda v: fnp.logsumexp(v))(x)
    np.testing.assert_allclose(H2.numpy(), np.diag(p) - np.outer(p, p), rtol=1e-8, atol=1e-12)


def test_higher_order_grad_of_grad():
    d3 = fg.grad(fg.grad(fg.grad(lambda x: x ** 4)))(f64(1.5))
    assert d3.item() == pytest.approx(24 * 1.5)
    mixed = fg.jacfwd(fg.jacrev(lambda x: fnp.sum(fnp.sin(x) * x[::-1])))(f64([0.2, 0.4]))
    assert mixed.shape == (2, 2)
    assert mixed.numpy()[0, 1] == pytest.approx(np.cos(0.2) + np.cos(0.4))


def test_grad_ir_is_clean():
    ir = fg.make_ir(fg.grad(lambda x: fnp.sum(fnp.sin(x))))(fnp.ones(3))
    text = str(ir)
    assert "0.0" not in text, text  # no trail of zeros
    assert [e.primitive.name for e in ir.eqns] == ["cos"], text  # d/dx sum(sin x) = cos x
