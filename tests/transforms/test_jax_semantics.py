"""Transform semantics a JAX user relies on (issue 19): each test states JAX's behaviour and checks
funcgrad against a NumPy float64 or finite-difference reference, and against JAX where installed.

Covered: Python control flow under grad/jvp/vjp outside jit (concrete values) and its error under
jit; custom_jvp.defjvps, nondiff_argnums, how often the primal function runs; checkpoint policies
(residual counts and gradients); the function vjp returns as a pytree; vmap of keyword arguments
and its out_axes errors.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp

# --- concrete values outside jit ----------------------------------------------------------------------


def piecewise(x: Any) -> Any:
    if x < 3:  # Python control flow on the value
        return x * x
    return 3 * x


def halving(x: Any) -> Any:
    while x > 1:
        x = x / 2
    return x


def test_grad_jvp_vjp_outside_jit_see_concrete_values() -> None:
    assert fg.grad(piecewise)(2.0).item() == pytest.approx(4.0)  # d(x^2) = 2x
    assert fg.grad(piecewise)(5.0).item() == pytest.approx(3.0)
    out, tangent = fg.jvp(piecewise, (2.0,), (1.0,))
    assert (out.item(), tangent.item()) == pytest.approx((4.0, 4.0))
    value, pullback = fg.vjp(piecewise, 4.0)
    assert (value.item(), pullback(1.0)[0].item()) == pytest.approx((12.0, 3.0))
    assert fg.grad(halving)(10.0).item() == pytest.approx(1 / 16)  # four halvings
    assert fg.grad(fg.grad(lambda x: x ** 3 if x < 3 else x))(2.0).item() == pytest.approx(12.0)
    assert fg.value_and_grad(lambda x: x.sum() if x.sum().item() > 0 else -x.sum())(fnp.ones(3))[1].tolist() == \
        [1.0, 1.0, 1.0]


def test_control_flow_on_traced_values_still_raises_under_jit_and_vmap() -> None:
    with pytest.raises(fg.ConcretizationError, match="jit"):
        fg.jit(fg.grad(piecewise))(2.0)
    with pytest.raises(fg.ConcretizationError):
        fg.grad(fg.jit(piecewise))(2.0)
    with pytest.raises(fg.ConcretizationError):
        fg.vmap(fg.grad(piecewise))(fnp.ones(2))
    with pytest.raises(fg.ConcretizationError):  # np.asarray raises under grad in JAX too
        fg.grad(lambda x: x * float(np.asarray(x)))(2.0)


def test_concrete_control_flow_matches_jax() -> None:
    jax = pytest.importorskip("jax")
    for x in (1.5, 2.5, 7.0):
        assert fg.grad(piecewise)(x).item() == pytest.approx(float(jax.grad(piecewise)(x)))
        assert fg.grad(halving)(x).item() == pytest.approx(float(jax.grad(halving)(x)))


# --- custom_jvp / custom_vjp ----------------------------------------------------------------------------


def test_defjvps_sums_one_rule_per_argument() -> None:
    @fg.custom_jvp
    def f(x, y):
        return fnp.sin(x) * y

    f.defjvps(lambda tx, ans, x, y: fnp.cos(x) * y * tx, lambda ty, ans, x, y: fnp.sin(x) * ty)
    gx, gy = fg.grad(f, argnums=(0, 1))(0.5, 2.0)
    assert (gx.item(), gy.item()) == pytest.approx((np.cos(0.5) * 2.0, np.sin(0.5)), rel=1e-6)
    out, tangent = fg.jvp(f, (0.5, 2.0), (1.0, 0.0))
    assert tangent.item() == pytest.approx(np.cos(0.5) * 2.0, rel=1e-6)

    @fg.custom_jvp
    def g(x, y):
        return x * y

    g.defjvps(None, lambda ty, ans, x, y: x * ty)  # None: no tangent through x
    assert fg.grad(g)(3.0, 4.0).item() == 0.0
    assert fg.grad(g, argnums=1)(3.0, 4.0).item() == 3.0


def test_custom_jvp_nondiff_argnums_passes_them_first_to_the_rule() -> None:
    @partial(fg.custom_jvp, nondiff_argnums=(0,))
    def apply(fn, x):
        return fn(x)

    @apply.defjvp
    def apply_jvp(fn, primals, tangents):
        (x,), (t,) = primals, tangents
        return fn(x), 2.0 * t  # a deliberately wrong rule, to see it is used

    assert apply(fnp.sin, 0.3).item() == pytest.approx(np.sin(0.3), rel=1e-6)
    assert fg.grad(apply, argnums=1)(fnp.sin, 0.3).item() == 2.0
    assert fg.jit(lambda x: fg.grad(lambda y: apply(fnp.exp, y))(x))(0.3).item() == 2.0


def test_custom_vjp_nondiff_argnums() -> None:
    @partial(fg.custom_vjp, nondiff_argnums=(1,))
    def scale(x, factor):
        return x * factor

    def fwd(x, factor):
        return scale(x, factor), None

    def bwd(factor, residuals, ct):
        return (ct * factor * 10,)  # deliberately scaled: the rule is used

    scale.defvjp(fwd, bwd)
    assert scale(fnp.ones(2), 3.0).tolist() == [3.0, 3.0]
    assert fg.grad(lambda x: scale(x, 3.0).sum())(fnp.ones(2)).tolist() == [30.0, 30.0]
    assert fg.vmap(fg.grad(lambda x: scale(x, 2.0)))(fnp.ones(3)).tolist() == [20.0] * 3


def _counting_functions(np_: Any, fg_: Any) -> tuple[dict[str, int], Any, Any]:
    calls = {"f": 0, "rule": 0, "g": 0, "fwd": 0, "bwd": 0}

    @fg_.custom_jvp
    def f(x):
        calls["f"] += 1
        return np_.sin(x)

    @f.defjvp
    def f_jvp(primals, tangents):
        calls["rule"] += 1
        (x,), (t,) = primals, tangents
        return f(x), np_.cos(x) * t

    @fg_.custom_vjp
    def g(x):
        calls["g"] += 1
        return np_.sin(x)

    def g_fwd(x):
        calls["fwd"] += 1
        return g(x), np_.cos(x)

    def g_bwd(residual, ct):
        calls["bwd"] += 1
        return (residual * ct,)

    g.defvjp(g_fwd, g_bwd)
    return calls, f, g


SCENARIOS = {
    "call f": lambda fg_, np_, f, g: f(1.0),
    "grad f": lambda fg_, np_, f, g: fg_.grad(f)(1.0),
    "jvp f": lambda fg_, np_, f, g: fg_.jvp(f, (1.0,), (1.0,)),
    "jit grad f": lambda fg_, np_, f, g: fg_.jit(fg_.grad(f))(1.0),
    "vmap f": lambda fg_, np_, f, g: fg_.vmap(f)(np_.ones(3)),
    "grad g": lambda fg_, np_, f, g: fg_.grad(g)(1.0),
    "vjp g": lambda fg_, np_, f, g: fg_.vjp(g, 1.0),
    "jit grad g": lambda fg_, np_, f, g: fg_.jit(fg_.grad(g))(1.0),
}


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_custom_functions_run_no_more_often_than_in_jax(scenario: str) -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    counts = {}
    for name, (fg_, np_) in {"jax": (jax, jnp), "funcgrad": (fg, fnp)}.items():
        calls, f, g = _counting_functions(np_, fg_)
        SCENARIOS[scenario](fg_, np_, f, g)
        counts[name] = dict(calls)
    assert counts["funcgrad"] == counts["jax"], counts


def test_custom_jvp_gradient_is_right_with_a_single_trace() -> None:
    calls, f, g = _counting_functions(fnp, fg)
    assert fg.grad(f)(0.7).item() == pytest.approx(np.cos(0.7), rel=1e-6)
    assert fg.grad(g)(0.7).item() == pytest.approx(np.cos(0.7), rel=1e-6)
    assert calls["f"] == 1 and calls["g"] == 1


# --- checkpoint policies ----------------------------------------------------------------------------------

W = (np.arange(9, dtype=np.float32).reshape(3, 3) - 4) / 10
X = np.linspace(-1, 1, 3).astype(np.float32)


def two_layers(np_: Any, name: Any) -> Any:
    def f(w, x):
        h = np_.sin(name(np_.dot(w, x), "a"))
        h2 = np_.cos(name(np_.dot(w, h), "b"))
        return np_.sum(h2 * h2)
    return f


def _reference_gradient() -> np.ndarray:
    w, x = W.astype(np.float64), X.astype(np.float64)
    eps, grad = 1e-6, np.zeros_like(w)
    f = two_layers(np, lambda v, _: v)
    for i in np.ndindex(*w.shape):
        up, down = w.copy(), w.copy()
        up[i] += eps
        down[i] -= eps
        grad[i] = (f(up, x) - f(down, x)) / (2 * eps)
    return grad


POLICIES = {  # name -> (policy factory on a checkpoint_policies namespace, residuals saved)
    "default": (None, 2), "nothing_saveable": (lambda cp: cp.nothing_saveable, 2),
    "everything_saveable": (lambda cp: cp.everything_saveable, 6), "dots_saveable": (lambda cp: cp.dots_saveable, 4),
    "dots_with_no_batch_dims_saveable": (lambda cp: cp.dots_with_no_batch_dims_saveable, 4),
    "save_only_these_names": (lambda cp: cp.save_only_these_names("a"), 3),
    "save_any_names_but_these": (lambda cp: cp.save_any_names_but_these("a"), 3),
    "save_from_both_policies": (lambda cp: cp.save_from_both_policies(cp.save_only_these_names("a"),
                                                                      cp.save_only_these_names("b")), 4),
}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_checkpoint_policy_changes_what_is_saved_and_keeps_gradients(policy: str) -> None:
    make, count = POLICIES[policy]
    f = two_layers(fnp, fg.checkpoint_name)
    g = fg.checkpoint(f) if make is None else fg.checkpoint(f, policy=make(fg.checkpoint_policies))
    residuals = fg.saved_residuals(g, W, X)
    assert len(residuals) == count, residuals
    np.testing.assert_allclose(fg.grad(g)(W, X).numpy(), _reference_gradient(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fg.jit(fg.grad(g))(W, X).numpy(), _reference_gradient(), rtol=1e-4, atol=1e-5)
    if policy in ("save_only_these_names", "save_any_names_but_these"):
        kept = "a" if policy == "save_only_these_names" else "b"
        assert any(source == f"named '{kept}'" for _, source in residuals)


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_checkpoint_residual_counts_match_jax(policy: str) -> None:
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp
    from jax._src.ad_checkpoint import saved_residuals
    from jax.ad_checkpoint import checkpoint_name
    make, count = POLICIES[policy]
    f = two_layers(jnp, checkpoint_name)
    g = jax.checkpoint(f) if make is None else jax.checkpoint(f, policy=make(jax.checkpoint_policies))
    assert len(saved_residuals(g, jnp.asarray(W), jnp.asarray(X))) == count
    np.testing.assert_allclose(np.asarray(jax.grad(g)(W, X)), _reference_gradient(), rtol=1e-4, atol=1e-5)


def test_print_saved_residuals_and_checkpoint_name_outside_a_checkpoint(capsys: Any) -> None:
    f = fg.checkpoint(two_layers(fnp, fg.checkpoint_name), policy=fg.checkpoint_policies.save_only_these_names("b"))
    fg.print_saved_residuals(f, W, X)
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["f32[3,3] from the argument 'w'", "f32[3] from the argument 'x'", "f32[3] named 'b'"]
    assert fg.checkpoint_name(fnp.arange(3.0), "z").tolist() == [0.0, 1.0, 2.0]
    assert fg.jit(lambda x: fg.checkpoint_name(x * 2, "z") + 1)(fnp.arange(3.0)).tolist() == [1.0, 3.0, 5.0]
    with pytest.raises(TypeError, match="policy"):
        fg.checkpoint(f, policy=3)


# --- the vjp function is a pytree --------------------------------------------------------------------------


def test_the_vjp_function_leaves_jit_and_make_ir() -> None:
    x = fnp.arange(3.0)
    out, pullback = fg.jit(lambda x: fg.vjp(fnp.sin, x))(x)
    np.testing.assert_allclose(pullback(fnp.ones(3))[0].numpy(), np.cos(np.arange(3.0)), rtol=1e-6)
    np.testing.assert_allclose(fg.jit(lambda fn, ct: fn(ct))(pullback, fnp.full(3, 2.0))[0].numpy(),
                               2 * np.cos(np.arange(3.0)), rtol=1e-6)
    assert len(fg.tree.leaves(pullback)) == 1  # the residual cos(x)
    ir = fg.make_ir(lambda x: fg.vjp(fnp.sin, x))(x)
    assert [e.primitive.name for e in ir.eqns] == ["sin", "cos"]
    _, jvp_fn = fg.jit(lambda x: fg.linearize(fnp.exp, x))(x)
    np.testing.assert_allclose(jvp_fn(fnp.ones(3)).numpy(), np.exp(np.arange(3.0)), rtol=1e-6)


# --- vmap: keyword arguments and out_axes ------------------------------------------------------------------


def test_vmap_maps_keyword_arguments_over_their_leading_axis() -> None:
    x, b = np.arange(6.0, dtype=np.float32).reshape(3, 2), np.arange(3.0, dtype=np.float32)
    out = fg.vmap(lambda x, b: x.sum() + b)(x, b=b)
    np.testing.assert_allclose(out.numpy(), [x[i].sum() + b[i] for i in range(3)])
    out = fg.vmap(lambda x, scale: x * scale, in_axes=(1,))(x, scale=np.full((2, 1), 2.0, np.float32))
    np.testing.assert_allclose(out.numpy(), np.stack([x[:, j] * 2 for j in range(2)]))


def test_vmap_out_axes_errors_are_clear() -> None:
    with pytest.raises(TypeError, match="vmap out_axes must be an int, None, or a pytree of them.*'x'"):
        fg.vmap(lambda x: x, out_axes="x")
    with pytest.raises(ValueError, match=r"vmap out_axes=\(0,\) does not match the structure of the function's "
                                         r"output PyTreeDef\(\(\*, \*\)\)"):
        fg.vmap(lambda x: (x, x), out_axes=(0,))(fnp.ones(3))
