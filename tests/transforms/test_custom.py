"""custom_jvp, custom_vjp, stop_gradient, checkpoint and eval_shape."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp


@fg.custom_jvp
def log1pexp(x):
    return fnp.log1p(fnp.exp(x))


@log1pexp.defjvp
def _log1pexp_jvp(primals, tangents):
    (x,), (t,) = primals, tangents
    return log1pexp(x), t * fnp.sigmoid(x)


def test_custom_jvp_rule_is_used_for_both_modes():
    # the naive derivative exp(x) / (1 + exp(x)) overflows to nan at x = 100; the rule does not
    assert fg.grad(log1pexp)(100.0).item() == pytest.approx(1.0)
    assert fg.jvp(log1pexp, (100.0,), (2.0,))[1].item() == pytest.approx(2.0)
    assert fg.grad(lambda x: fnp.log1p(fnp.exp(x)))(100.0).item() != pytest.approx(1.0)
    assert log1pexp(0.0).item() == pytest.approx(np.log(2.0))


def test_custom_jvp_second_order_and_under_vmap_and_jit():
    second = fg.grad(fg.grad(log1pexp))(0.0).item()
    assert second == pytest.approx(0.25)  # sigmoid'(0)
    xs = fnp.asarray([-1.0, 0.0, 100.0])
    sigmoid = 1 / (1 + np.exp(-xs.numpy()))
    np.testing.assert_allclose(fg.vmap(fg.grad(log1pexp))(xs).numpy(), sigmoid, rtol=1e-6)
    np.testing.assert_allclose(fg.grad(lambda v: fnp.sum(fg.vmap(log1pexp)(v)))(xs).numpy(),
                               1 / (1 + np.exp(-xs.numpy())), rtol=1e-6)
    assert fg.jit(fg.grad(log1pexp))(100.0).item() == pytest.approx(1.0)
    assert "custom_jvp_call" in str(fg.make_ir(log1pexp)(1.0))


def test_custom_jvp_without_rule_raises():
    f = fg.custom_jvp(lambda x: x)
    with pytest.raises(AttributeError, match="defjvp"):
        f(1.0)


@fg.custom_vjp
def clip_gradient(x, bound):
    return x


def _clip_fwd(x, bound):
    return x, (bound,)


def _clip_bwd(residuals, ct):
    (bound,) = residuals
    return (fnp.clip(ct, -bound, bound), None)


clip_gradient.defvjp(_clip_fwd, _clip_bwd)


def test_custom_vjp_backward_rule_is_used():
    grad = fg.grad(lambda x: fnp.sum(clip_gradient(x, 0.5) * 3.0))(fnp.ones(3))
    assert grad.tolist() == [0.5, 0.5, 0.5]
    assert clip_gradient(fnp.ones(2), 0.5).tolist() == [1.0, 1.0]
    per_example = fg.vmap(fg.grad(lambda x: clip_gradient(x, 0.5) * 3.0))(fnp.ones(3))
    assert per_example.tolist() == [0.5, 0.5, 0.5]
    assert fg.jit(fg.grad(lambda x: clip_gradient(x, 0.5) * 3.0))(1.0).item() == 0.5


def test_custom_vjp_forward_mode_raises():
    with pytest.raises(TypeError, match="forward-mode"):
        fg.jvp(lambda x: clip_gradient(x, 0.5), (1.0,), (1.0,))


def test_stop_gradient():
    assert fg.grad(lambda x: x * fg.stop_gradient(x))(3.0).item() == 3.0
    assert fg.grad(fg.grad(lambda x: x * x * fg.stop_gradient(x)))(3.0).item() == 6.0
    tree = fg.stop_gradient({"a": fnp.ones(2), "n": fnp.arange(2)})
    assert tree["n"].dtype == fnp.int32
    assert fg.vmap(fg.stop_gradient)(fnp.arange(3.0)).tolist() == [0.0, 1.0, 2.0]


def test_checkpoint_recomputes_in_the_backward_pass():
    def block(x):
        return fnp.sin(fnp.sin(x))

    def loss(x, remat):
        f = fg.checkpoint(block) if remat else block
        return fnp.sum(f(x) * 2.0)
    x = fnp.asarray([0.1, 0.2, 0.3])
    np.testing.assert_allclose(fg.grad(lambda v: loss(v, True))(x).numpy(),
                               fg.grad(lambda v: loss(v, False))(x).numpy(), rtol=1e-6)
    ir = fg.make_ir(fg.grad(lambda v: loss(v, True)))(x)
    checkpoints = [e for e in ir.eqns if e.primitive.name == "checkpoint"]
    assert checkpoints, str(ir)
    backward = checkpoints[-1].param_dict["ir"]
    assert [e.primitive.name for e in backward.eqns].count("sin") >= 1, "the backward pass must recompute sin"
    # the only residual passed to the backward checkpoint is the input itself
    assert all(a.aval.shape == (3,) for a in checkpoints[-1].inputs)
    assert fg.remat is fg.checkpoint


@pytest.mark.parametrize("inner", ["jit", "checkpoint", "cond", "fori_loop"])
def test_grad_of_checkpoint_around_a_call(inner):
    """Found by tests/fuzz: the recomputing body of a checkpoint holds the jvp of any call inside it
    (one equation with primal and tangent outputs), so it must be split before it is transposed
    (was: "mul of two linear operands is not linear")."""
    calls = {"jit": lambda v: fg.jit(fnp.sin)(v), "checkpoint": lambda v: fg.checkpoint(fnp.sin)(v),
             "cond": lambda v: fg.lax.cond(fnp.sum(v) > 0, fnp.sin, fnp.cos, v),
             "fori_loop": lambda v: fg.lax.fori_loop(0, 1, lambda i, c: fnp.sin(c), v)}

    def block(x):
        return calls[inner](x) * x

    x = fnp.asarray([0.1, 0.2, 0.3], dtype="float64")
    expected = np.cos(x.numpy()) * x.numpy() + np.sin(x.numpy())
    np.testing.assert_allclose(fg.grad(lambda v: fnp.sum(fg.checkpoint(block)(v)))(x).numpy(), expected, rtol=1e-12)
    np.testing.assert_allclose(fg.grad(fg.checkpoint(lambda v: fnp.sum(block(v))))(x).numpy(), expected, rtol=1e-12)
    ir = fg.make_ir(fg.grad(lambda v: fnp.sum(fg.checkpoint(block)(v))))(x)
    backward = [e for e in ir.eqns if e.primitive.name == "checkpoint"][-1].param_dict["ir"]
    assert "sin" in str(backward), "the backward pass must still recompute sin"


def test_eval_shape_runs_nothing():
    calls = []

    def fn(x):
        calls.append(1)
        return {"y": x @ x.T, "n": fnp.arange(3)}
    shapes = fg.eval_shape(fn, fnp.ones((4, 2)))
    assert shapes["y"] == fg.ShapedArray((4, 4), fnp.float32)
    assert shapes["n"].dtype == fnp.int32 and calls == [1]
