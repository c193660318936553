"""Collectives over named axes in one process: every collective under ``vmap(axis_name=...)`` against
a Python loop over the members (values, jvp, grad, and vmap of grad), against JAX where it is
installed, nested vmaps with two names, collectives inside jit, pmap and shard_map of one process,
and the errors."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import lax
from funcgrad.ir.core import typecheck
from funcgrad.parallel import P

N = 3  # members of the axis
rng = np.random.default_rng(0)
X = rng.standard_normal((N, 3)).astype(np.float32)          # member k holds X[k]
S = rng.standard_normal((N, N, 2)).astype(np.float32)        # for psum_scatter: dimension 0 of size N
T6 = rng.standard_normal((N, 6)).astype(np.float32)          # tiled psum_scatter: 6 = N * 2
W = rng.standard_normal((N, 3)).astype(np.float32)
PERM = ((0, 1), (1, 2), (2, 0))
PARTIAL = ((0, 2), (2, 1))                                   # member 0 receives nothing: zeros


def stack(rows: list[Any]) -> Any:
    return fnp.stack(rows)


# name -> (per-member function using collectives, the loop reference over the whole batch, input)
# Each reference computes member k's output from the whole batch with plain array functions.
CASES: dict[str, tuple[Callable[[Any], Any], Callable[[Any], Any], np.ndarray]] = {
    "psum": (lambda x: fnp.sin(x) * lax.psum(x * x, "i"),
             lambda xs: stack([fnp.sin(xs[k]) * (xs * xs).sum(0) for k in range(N)]), X),
    "pmean": (lambda x: x - lax.pmean(x, "i"),
              lambda xs: stack([xs[k] - xs.mean(0) for k in range(N)]), X),
    "pmax": (lambda x: lax.pmax(x, "i") + 0 * x, lambda xs: stack([xs.max(0)] * N), X),
    "pmin": (lambda x: lax.pmin(x, "i") + 0 * x, lambda xs: stack([xs.min(0)] * N), X),
    "all_gather": (lambda x: lax.all_gather(x, "i") * fnp.cos(x),
                   lambda xs: stack([xs * fnp.cos(xs[k]) for k in range(N)]), X),
    "all_gather_axis1": (lambda x: lax.all_gather(fnp.tanh(x), "i", axis=1),
                         lambda xs: stack([fnp.tanh(xs).T for _ in range(N)]), X),
    "all_gather_tiled": (lambda x: lax.all_gather(x * x, "i", tiled=True),
                         lambda xs: stack([(xs * xs).reshape(-1) for _ in range(N)]), X),
    "psum_scatter": (lambda x: lax.psum_scatter(x * x, "i"),
                     lambda xs: stack([(xs * xs).sum(0)[k] for k in range(N)]), S),
    "psum_scatter_dim1": (lambda x: lax.psum_scatter(fnp.sin(x), "i", scatter_dimension=1),
                          lambda xs: stack([fnp.sin(xs).sum(0)[:, k] for k in range(N)]),
                          np.ascontiguousarray(S.transpose(0, 2, 1))),
    "psum_scatter_tiled": (lambda x: lax.psum_scatter(x * x, "i", tiled=True),
                           lambda xs: stack([(xs * xs).sum(0)[2 * k:2 * k + 2] for k in range(N)]), T6),
    "ppermute": (lambda x: lax.ppermute(x * x, "i", PERM) * x,
                 lambda xs: stack([xs[(k - 1) % N] ** 2 * xs[k] for k in range(N)]), X),
    "ppermute_partial": (lambda x: lax.ppermute(fnp.exp(x), "i", PARTIAL),
                         lambda xs: stack([fnp.zeros(3), fnp.exp(xs[2]), fnp.exp(xs[0])]), X),
    "axis_index": (lambda x: x * lax.axis_index("i"),
                   lambda xs: stack([xs[k] * k for k in range(N)]), X),
}
LINEAR = [name for name in CASES if name not in ("pmax", "pmin")]


def batched(name: str) -> Callable[[Any], Any]:
    return fg.vmap(CASES[name][0], axis_name="i")


@pytest.mark.parametrize("name", sorted(CASES))
def test_collective_under_vmap_equals_a_loop_over_members(name):
    fn, reference, xs = CASES[name]
    np.testing.assert_allclose(batched(name)(xs), reference(fnp.asarray(xs)), rtol=1e-5, atol=1e-6)
    ir = fg.make_ir(batched(name))(xs)
    typecheck(ir)
    assert name.startswith("axis") or not any(e.primitive.name in ("psum", "all_gather") for e in ir.eqns)


@pytest.mark.parametrize("name", LINEAR)
def test_jvp_of_vmap_equals_the_loops_jvp(name):
    fn, reference, xs = CASES[name]
    tangent = rng.standard_normal(xs.shape).astype(np.float32)
    out, out_tangent = fg.jvp(batched(name), (xs,), (tangent,))
    ref_out, ref_tangent = fg.jvp(reference, (fnp.asarray(xs),), (fnp.asarray(tangent),))
    np.testing.assert_allclose(out, ref_out, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out_tangent, ref_tangent, rtol=1e-5, atol=1e-5)
    # and the tangent is the directional derivative (central differences in float64)
    eps = 1e-3
    xs64, t64 = xs.astype(np.float64), tangent.astype(np.float64)
    diff = (np.asarray(reference(fnp.asarray(xs64 + eps * t64)), np.float64)
            - np.asarray(reference(fnp.asarray(xs64 - eps * t64)), np.float64)) / (2 * eps)
    np.testing.assert_allclose(out_tangent, diff, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("name", LINEAR)
def test_grad_of_vmap_and_vmap_of_grad_equal_the_loops_gradient(name):
    fn, reference, xs = CASES[name]
    weights = rng.standard_normal(np.shape(reference(fnp.asarray(xs)))).astype(np.float32)
    expected = fg.grad(lambda a: (reference(a) * weights).sum())(fnp.asarray(xs))
    got = fg.grad(lambda a: (batched(name)(a) * weights).sum())(xs)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    # vmap of grad: member k's gradient of its own loss takes cotangents from every member's output
    # (psum transposes to psum, as in JAX), so it is the gradient of the sum of every member's loss
    per_member = fg.vmap(fg.grad(lambda x, w: (fn(x) * w).sum()), axis_name="i")(xs, weights)
    np.testing.assert_allclose(per_member, expected, rtol=1e-5, atol=1e-5)


JAX_CASES = {
    "psum": lambda lx, x: lx.psum(x * x, "i") * x,
    "pmean": lambda lx, x: x - lx.pmean(x, "i"),
    "all_gather": lambda lx, x: lx.all_gather(x, "i", axis=1).sum(0) * x,
    "all_gather_tiled": lambda lx, x: lx.all_gather(x, "i", tiled=True)[:3] * x,
    "ppermute": lambda lx, x: lx.ppermute(x * x, "i", PERM) * x,
    "axis_index": lambda lx, x: x * lx.axis_index("i"),
}


@pytest.mark.parametrize("name", sorted(JAX_CASES))
def test_values_and_gradients_match_jax(name):
    jax = pytest.importorskip("jax")
    fn = JAX_CASES[name]
    ours_f = fg.vmap(lambda x: fn(lax, x), axis_name="i")
    theirs_f = jax.vmap(lambda x: fn(jax.lax, x), axis_name="i")
    np.testing.assert_allclose(ours_f(X), theirs_f(X), rtol=1e-5, atol=1e-6)
    ours = fg.vmap(fg.grad(lambda x: fn(lax, x).sum()), axis_name="i")(X)
    theirs = jax.vmap(jax.grad(lambda x: fn(jax.lax, x).sum()), axis_name="i")(X)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)


def test_psum_scatter_values_and_gradients_match_jax():
    jax = pytest.importorskip("jax")

    def fn(lx, v):
        return lx.psum_scatter(v * v, "i", scatter_dimension=0, tiled=False) * lx.axis_index("i")
    np.testing.assert_allclose(fg.vmap(lambda v: fn(lax, v), axis_name="i")(S),
                               jax.vmap(lambda v: fn(jax.lax, v), axis_name="i")(S), rtol=1e-5)
    np.testing.assert_allclose(fg.vmap(fg.grad(lambda v: fn(lax, v).sum()), axis_name="i")(S),
                               jax.vmap(jax.grad(lambda v: fn(jax.lax, v).sum()), axis_name="i")(S), rtol=1e-5)


def test_nested_vmaps_bind_two_names_and_a_collective_over_both():
    xs = rng.standard_normal((2, N, 2)).astype(np.float32)     # axis i of 2, j of N
    inner = fg.vmap(lambda x: (lax.psum(x, ("i", "j")), lax.psum(x, "i"), lax.axis_index(("i", "j")),
                               lax.all_gather(x, ("i", "j"))), axis_name="j")
    total, over_i, index, gathered = fg.vmap(inner, axis_name="i")(xs)
    np.testing.assert_allclose(total, np.broadcast_to(xs.sum((0, 1)), xs.shape), rtol=1e-5)
    np.testing.assert_allclose(over_i, np.broadcast_to(xs.sum(0), xs.shape), rtol=1e-5)
    np.testing.assert_array_equal(index, np.arange(2 * N).reshape(2, N))   # row-major: i slowest
    np.testing.assert_allclose(gathered, np.broadcast_to(xs.reshape(2 * N, 2), (2, N, 2 * N, 2)))
    jax = pytest.importorskip("jax")
    theirs = jax.vmap(jax.vmap(lambda x: jax.lax.axis_index(("i", "j")), axis_name="j"), axis_name="i")(xs)
    np.testing.assert_array_equal(index, theirs)


def test_unmapped_operand_of_psum_counts_every_member():
    out = fg.vmap(lambda x, y: x + lax.psum(y, "i"), in_axes=(0, None), axis_name="i")(X, np.float32(2.0))
    np.testing.assert_allclose(out, X + 2.0 * N)
    assert fg.vmap(lambda x: lax.psum(1, "i"), axis_name="i")(X).tolist() == [N] * N


def test_collectives_inside_jit_scan_and_cond_see_the_vmapped_axis():
    def body(carry, x):
        return carry + lax.psum(x, "i"), lax.axis_index("i") * x
    inside_jit = fg.vmap(fg.jit(lambda x: x / lax.psum(x, "i")), axis_name="i")(X)
    np.testing.assert_allclose(inside_jit, X / X.sum(0), rtol=1e-5)
    carry, ys = fg.vmap(lambda x: lax.scan(body, np.float32(0.0), x), axis_name="i")(X)
    np.testing.assert_allclose(carry, np.full(N, X.sum()), rtol=1e-5)
    np.testing.assert_allclose(ys, X * np.arange(N)[:, None], rtol=1e-5)
    branch = fg.vmap(lambda x: lax.cond(x.sum() > 0, lambda v: lax.pmax(v, "i"), lambda v: lax.pmin(v, "i"), x),
                     axis_name="i")(X)
    expected = [X.max(0) if X[k].sum() > 0 else X.min(0) for k in range(N)]
    np.testing.assert_allclose(branch, expected)
    np.testing.assert_allclose(fg.jit(fg.vmap(lambda x: x - lax.pmean(x, "i"), axis_name="i"))(X),
                               X - X.mean(0), rtol=1e-5, atol=1e-6)


def test_a_jit_traced_under_one_axis_size_is_retraced_for_another():
    gather = fg.jit(lambda x: lax.all_gather(x, "i"))
    assert fg.vmap(gather, axis_name="i")(X).shape == (N, N, 3)
    assert fg.vmap(gather, axis_name="i")(X[:2]).shape == (2, 2, 3)


def test_unbound_axis_name_raises_a_name_error_naming_it():
    with pytest.raises(NameError, match="unbound axis name: 'k'.*names bound here: 'i'"):
        fg.vmap(lambda x: lax.psum(x, "k"), axis_name="i")(X)
    with pytest.raises(NameError, match="unbound axis name: 'i'"):
        lax.axis_index("i")
    with pytest.raises(NameError, match="unbound axis name: 'i'"):
        fg.vmap(lambda x: lax.all_gather(x, "i"))(X)   # vmap without a name binds none


def test_bad_arguments_name_the_collective():
    with pytest.raises(ValueError, match="psum_scatter: dimension 0 .* must have the size 3"):
        fg.vmap(lambda x: lax.psum_scatter(x, "i"), axis_name="i")(np.ones((N, 4), np.float32))
    with pytest.raises(ValueError, match="ppermute.*names a destination more than once"):
        fg.vmap(lambda x: lax.ppermute(x, "i", [(0, 1), (2, 1)]), axis_name="i")(X)
    with pytest.raises(ValueError, match="outside 0..2"):
        fg.vmap(lambda x: lax.ppermute(x, "i", [(0, 3)]), axis_name="i")(X)
    with pytest.raises(NotImplementedError, match="differentiation rule for 'pmax'"):
        fg.vmap(fg.grad(lambda x: lax.pmax(x, "i").sum()), axis_name="i")(X)


def test_pmap_in_one_process_equals_vmap():
    fn = CASES["psum"][0]
    np.testing.assert_allclose(fg.pmap(fn, axis_name="i")(X), batched("psum")(X), rtol=1e-6)
    grads = fg.pmap(fg.grad(lambda x: lax.pmean((x * x).sum(), "i")), axis_name="i")(X)
    np.testing.assert_allclose(grads, 2 * X, rtol=1e-5)   # pmean's transpose: psum / N of the ones
    np.testing.assert_allclose(fg.pmap(lambda x: x + 1)(X), X + 1)


def test_shard_map_in_one_process_sees_one_block():
    step = fg.shard_map(lambda g, w: (w - lax.pmean(g, "i"), g * 2), in_specs=(P("i"), P()),
                        out_specs=(P(), P("i")))
    replicated, sharded = step(X, W)
    np.testing.assert_allclose(replicated, W - X, rtol=1e-6)
    np.testing.assert_allclose(sharded, 2 * X)
    with pytest.raises(ValueError, match="an output of spec P\\(\\) differs between processes"):
        fg.shard_map(lambda g: g * 2, in_specs=P("i"), out_specs=P())(X)
    with pytest.raises(NameError, match="names axis 'j'"):
        fg.shard_map(lambda g: g, in_specs=P("j"), out_specs=P("j"))(X)


def test_higher_derivatives_and_jacobians_through_collectives_match_jax():
    jax = pytest.importorskip("jax")
    x = X[:, 0]
    ours = fg.vmap(fg.hessian(lambda v: lax.psum(v ** 3, "i")), axis_name="i")(x)
    theirs = jax.vmap(jax.hessian(lambda v: jax.lax.psum(v ** 3, "i")), axis_name="i")(x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    ours = fg.jacfwd(fg.vmap(lambda v: lax.all_gather(v * v, "i") * v, axis_name="i"))(x)
    theirs = jax.jacfwd(jax.vmap(lambda v: jax.lax.all_gather(v * v, "i") * v, axis_name="i"))(x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    ours = fg.jacrev(fg.vmap(lambda v: lax.ppermute(v, "i", PERM) * v, axis_name="i"))(x)
    theirs = jax.jacrev(jax.vmap(lambda v: jax.lax.ppermute(v, "i", PERM) * v, axis_name="i"))(x)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


def test_a_call_or_loop_using_the_axis_is_batched_even_with_unbatched_operands():
    y = np.float32(2.0)
    mapped = {"in_axes": (0, None), "axis_name": "i"}
    index = np.arange(N, dtype=np.float32)
    np.testing.assert_allclose(
        fg.vmap(lambda x, y: fg.jit(lambda y: y * lax.axis_index("i"))(y), **mapped)(X, y), 2 * index)
    np.testing.assert_allclose(
        fg.vmap(lambda x, y: lax.cond(y > 1, lambda y: lax.psum(y, "i"), lambda y: y, y), **mapped)(X, y),
        np.full(N, 2 * N))
    np.testing.assert_allclose(fg.vmap(lambda x, y: lax.scan(lambda c, _: (c + lax.axis_index("i"), None), y, None,
                                                             length=2)[0], **mapped)(X, y), 2 + 2 * index)
    np.testing.assert_allclose(  # 2 -> 2 + N = 5: stops
        fg.vmap(lambda x, y: lax.while_loop(lambda c: c < 5, lambda c: c + lax.psum(1.0, "i"), y), **mapped)(X, y),
        np.full(N, 5.0))
