"""funcgrad.lax control flow: forward values, derivatives in both modes, vmap, and errors."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import lax


def central_difference(fn, x, eps=1e-3):
    x = np.asarray(x, np.float64)
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[i] = eps
        grad[i] = (float(fn(fnp.asarray(x + step, dtype="float64"))) -
                   float(fn(fnp.asarray(x - step, dtype="float64")))) / (2 * eps)
    return grad


def piecewise(x):
    return lax.cond(x > 0, lambda y: fnp.sin(y) * y, lambda y: y ** 3, x)


@pytest.mark.parametrize("x", [1.3, -0.7])
def test_cond_values_and_derivatives(x):
    expected = np.sin(x) * x if x > 0 else x ** 3
    assert piecewise(x).item() == pytest.approx(expected, rel=1e-6)
    derivative = np.sin(x) + x * np.cos(x) if x > 0 else 3 * x ** 2
    assert fg.grad(piecewise)(x).item() == pytest.approx(derivative, rel=1e-5)
    assert fg.jvp(piecewise, (x,), (1.0,))[1].item() == pytest.approx(derivative, rel=1e-5)
    second = fg.grad(fg.grad(piecewise))(x).item()
    expected_second = 2 * np.cos(x) - x * np.sin(x) if x > 0 else 6 * x
    assert second == pytest.approx(expected_second, rel=1e-4)


def test_cond_is_one_equation_and_closes_over_values():
    scale = fnp.asarray(3.0)
    ir = fg.make_ir(lambda x: lax.cond(x > 0, lambda y: y * scale, lambda y: -y, x))(1.0)
    assert [e.primitive.name for e in ir.eqns][-1] == "cond"
    assert len(ir.consts) == 1


def test_switch_clamps_the_index_and_picks_the_branch():
    branches = [lambda x: x + 1, lambda x: x * 10, lambda x: -x]
    assert [lax.switch(i, branches, 2.0).item() for i in (-5, 0, 1, 2, 9)] == [3.0, 3.0, 20.0, -2.0, -2.0]
    assert fg.grad(lambda x: lax.switch(1, branches, x))(2.0).item() == 10.0


def test_cond_branches_must_agree():
    with pytest.raises(TypeError, match="branch 1 returns"):
        lax.cond(True, lambda x: x, lambda x: (x, x), 1.0)
    with pytest.raises(TypeError, match="predicate must be a scalar"):
        lax.cond(fnp.ones(2) > 0, lambda x: x, lambda x: x, 1.0)


def test_vmap_of_cond_with_a_batched_predicate_becomes_a_select():
    xs = fnp.asarray([-2.0, -0.5, 0.5, 2.0])
    out = fg.vmap(piecewise)(xs)
    expected = [piecewise(float(v)).item() for v in xs.numpy()]
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)
    ir = fg.make_ir(fg.vmap(piecewise))(xs)
    assert "cond" not in [e.primitive.name for e in ir.eqns] and "select" in str(ir)


def test_vmap_of_cond_with_an_unbatched_predicate_stays_a_cond():
    fn = fg.vmap(lambda x, flag: lax.cond(flag, lambda y: y * 2, lambda y: y, x), in_axes=(0, None))
    assert fn(fnp.arange(3.0), True).tolist() == [0.0, 2.0, 4.0]
    ir = fg.make_ir(fn)(fnp.arange(3.0), True)
    assert "cond" in [e.primitive.name for e in ir.eqns]


def newton_sqrt(a):
    """A while-loop Newton solve for sqrt(a)."""
    def body(state):
        x, i = state
        return 0.5 * (x + a / x), i + 1
    return lax.while_loop(lambda s: (fnp.abs(s[0] * s[0] - a) > 1e-6) & (s[1] < 50), body, (a, 0))[0]


def test_while_loop_forward_and_forward_mode():
    assert newton_sqrt(fnp.asarray(2.0)).item() == pytest.approx(np.sqrt(2), rel=1e-6)
    value, tangent = fg.jvp(newton_sqrt, (fnp.asarray(2.0),), (fnp.asarray(1.0),))
    assert tangent.item() == pytest.approx(0.5 / np.sqrt(2), rel=1e-4)


def test_while_loop_reverse_mode_raises_pointing_to_scan():
    with pytest.raises(NotImplementedError, match="lax.scan.*fori_loop"):
        fg.grad(newton_sqrt)(fnp.asarray(2.0))


def test_vmap_of_while_loop_runs_until_every_lane_is_done():
    counts = fg.vmap(lambda n: lax.while_loop(lambda s: s[0] < n, lambda s: (s[0] + 1, s[1] * 2.0),
                                              (0, 1.0))[1])(fnp.asarray([0, 3, 5]))
    assert counts.tolist() == [1.0, 8.0, 32.0]
    roots = fg.vmap(newton_sqrt)(fnp.asarray([1.0, 4.0, 9.0]))
    np.testing.assert_allclose(roots.numpy(), [1.0, 2.0, 3.0], rtol=1e-5)


def test_while_loop_body_must_keep_types():
    with pytest.raises(TypeError, match="same structure and types"):
        lax.while_loop(lambda x: x < 3, lambda x: (x, x), 0.0)


def test_fori_loop_static_bounds_is_a_scan_and_differentiable():
    def power(x):
        return lax.fori_loop(0, 4, lambda i, v: v * x, 1.0)
    assert power(2.0).item() == 16.0
    assert fg.grad(power)(2.0).item() == pytest.approx(32.0)
    assert "scan" in str(fg.make_ir(power)(2.0))
    traced_bounds = fg.make_ir(lambda x, n: lax.fori_loop(0, n, lambda i, v: v + x, 0.0))(1.0, 3)
    assert "while" in str(traced_bounds)


def rnn_loss(w, xs):
    def step(h, x):
        h = fnp.tanh(h * w + x)
        return h, h * h
    h, ys = lax.scan(step, fnp.zeros_like(fnp.asarray(xs)[0]), xs)
    return h + fnp.sum(ys)


def test_scan_forward_matches_a_python_loop():
    xs = np.array([0.1, -0.4, 0.3, 0.9])
    h, total = 0.0, 0.0
    for x in xs:
        h = np.tanh(h * 0.7 + x)
        total += h * h
    assert rnn_loss(0.7, fnp.asarray(xs)).item() == pytest.approx(h + total, rel=1e-6)


def test_scan_gradients_against_finite_differences():
    xs = np.array([0.1, -0.4, 0.3, 0.9])
    w = 0.7
    dw = fg.grad(rnn_loss)(fnp.asarray(w, dtype="float64"), fnp.asarray(xs, dtype="float64")).item()
    fd = central_difference(lambda v: rnn_loss(v, fnp.asarray(xs, dtype="float64")).item(), np.asarray(w))
    assert dw == pytest.approx(float(fd), rel=1e-6)
    dxs = fg.grad(rnn_loss, argnums=1)(fnp.asarray(w, dtype="float64"), fnp.asarray(xs, dtype="float64"))
    fd_xs = central_difference(lambda v: rnn_loss(fnp.asarray(w, dtype="float64"), v).item(), xs)
    np.testing.assert_allclose(dxs.numpy(), fd_xs, rtol=1e-5, atol=1e-6)  # central differences: O(eps^2)
    jvp_w = fg.jvp(lambda v: rnn_loss(v, fnp.asarray(xs)), (fnp.asarray(w),), (fnp.asarray(1.0),))[1]
    assert jvp_w.item() == pytest.approx(float(fd), rel=1e-4)


def test_scan_reverse_mode_saves_loop_invariants_once():
    def loss(w, xs):
        _, hiddens = lax.scan(lambda h, x: (fnp.tanh(h @ w + x), h), fnp.zeros(3), xs)
        return fnp.sum(hiddens)

    weights = fnp.ones((3, 3))
    ir = fg.make_ir(fg.grad(loss))(weights, fnp.ones((5, 3)))
    scans = [e for e in ir.eqns if e.primitive.name == "scan"]
    assert len(scans) == 2  # forward (emitting residuals) and transposed
    backward = scans[1]
    assert all(a.aval.shape != (5, 3, 3) for a in backward.inputs), "the weights were stacked per step"


def test_scan_reverse_and_pytree_carries():
    def step(carry, x):
        total, count = carry
        return (total + x, count + 1), total
    (total, count), prefix = lax.scan(step, (0.0, 0), fnp.arange(4.0), reverse=True)
    assert (total.item(), count.item()) == (6.0, 4)
    assert prefix.tolist() == [6.0, 5.0, 3.0, 0.0]
    grads = fg.grad(lambda xs: lax.scan(step, (0.0, 0), xs, reverse=True)[1].sum())(fnp.arange(4.0))
    assert grads.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_scan_with_length_and_no_xs():
    carry, ys = lax.scan(lambda c, _: (c * 2, c), 1.0, None, length=4)
    assert carry.item() == 16.0 and ys.tolist() == [1.0, 2.0, 4.0, 8.0]


def test_scan_bad_input():
    with pytest.raises(ValueError, match="disagree on the number of steps"):
        lax.scan(lambda c, x: (c, x), 0.0, (fnp.ones(3), fnp.ones(4)))
    with pytest.raises(TypeError, match="carry of the same structure"):
        lax.scan(lambda c, x: (c.astype("int32"), x), 0.0, fnp.ones(3))
    with pytest.raises(ValueError, match="give xs or an explicit length"):
        lax.scan(lambda c, x: (c, x), 0.0, None)


def test_vmap_of_scan_matches_a_loop():
    ws = fnp.asarray([0.5, 0.7, 0.9])
    xs = fnp.asarray([0.1, -0.4, 0.3])
    batched = fg.vmap(rnn_loss, in_axes=(0, None))(ws, xs)
    looped = [rnn_loss(float(w), xs).item() for w in ws.numpy()]
    np.testing.assert_allclose(batched.numpy(), looped, rtol=1e-6)
    per_example = fg.vmap(fg.grad(rnn_loss), in_axes=(0, None))(ws, xs)
    looped_grads = [fg.grad(rnn_loss)(float(w), xs).item() for w in ws.numpy()]
    np.testing.assert_allclose(per_example.numpy(), looped_grads, rtol=1e-5)
    xs_batch = fnp.asarray(np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32))
    over_xs = fg.vmap(rnn_loss, in_axes=(None, 0))(0.7, xs_batch)
    np.testing.assert_allclose(over_xs.numpy(), [rnn_loss(0.7, x).item() for x in xs_batch], rtol=1e-6)


def test_lax_map():
    assert lax.map(lambda x: x * 2, fnp.arange(3.0)).tolist() == [0.0, 2.0, 4.0]
