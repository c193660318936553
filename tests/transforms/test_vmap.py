"""The public ``vmap``: in_axes/out_axes (ints, None, negative, pytree prefixes), axis_size, nesting,
vmap of funcgrad.numpy functions against Python loops, the batched IR, and bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir.core import typecheck
from tests.conftest import assert_close, check_both_modes

rng = np.random.default_rng(0)
A = rng.standard_normal((5, 3, 4)).astype(np.float32)
B = rng.standard_normal((5, 4, 2)).astype(np.float32)
W = rng.standard_normal((4, 2)).astype(np.float32)


def loop(fn: Any, args: tuple, in_axes: tuple, size: int) -> Any:
    """The reference: ``fn`` applied (eagerly) to each example, results stacked on axis 0."""
    outs = []
    for b in range(size):
        example = [a if ax is None else np.take(a, b, axis=ax) for a, ax in zip(args, in_axes)]
        outs.append(fn(*(fnp.asarray(e) for e in example)))
    return np.stack([np.asarray(o) for o in outs])


def check_vmap(fn: Any, args: tuple, in_axes: tuple, rtol: float = 2e-5, atol: float = 1e-5) -> np.ndarray:
    """vmap(fn) equals the loop, eagerly and traced; returns the eager result."""
    size = next(np.shape(a)[ax] for a, ax in zip(args, in_axes) if ax is not None)
    expected = loop(fn, args, in_axes, size)
    eager, traced = check_both_modes(fg.vmap(fn, in_axes=in_axes), *(fnp.asarray(a) for a in args))
    assert eager.shape == expected.shape and eager.dtype == expected.dtype
    np.testing.assert_allclose(eager, expected, rtol=rtol, atol=atol)
    np.testing.assert_allclose(traced, expected, rtol=rtol, atol=atol)
    return eager


# --- in_axes ----------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, 2, -1, -2, -3])
def test_in_axes_int_picks_the_mapped_axis(axis):
    out = fg.vmap(lambda x: fnp.sin(x) * 2 + x.sum(), in_axes=axis)(fnp.asarray(A))
    moved = np.moveaxis(A.astype(np.float64), axis, 0)
    expected = np.sin(moved) * 2 + moved.sum(axis=tuple(range(1, 3)), keepdims=True)
    assert_close(out.numpy(), expected, np.float32, atol=1e-5)


def test_in_axes_none_shares_an_argument_across_the_batch():
    out = check_vmap(lambda x, w: x @ w, (A, W), (0, None))
    assert_close(out, np.einsum("bij,jk->bik", A.astype(np.float64), W), np.float32, atol=1e-5)


def test_in_axes_list_means_the_argument_tuple():
    out = fg.vmap(lambda x, w: x @ w, in_axes=[2, None])(fnp.asarray(np.moveaxis(A, 0, 2)), fnp.asarray(W))
    assert_close(out.numpy(), np.einsum("bij,jk->bik", A.astype(np.float64), W), np.float32, atol=1e-5)


def test_in_axes_tuple_prefix_of_a_pytree_argument():
    bias = rng.standard_normal((5, 2)).astype(np.float32)

    def layer(params: tuple, x: Any) -> Any:
        w, b = params
        return fnp.tanh(x @ w + b)

    out = fg.vmap(layer, in_axes=((None, 0), 0))((fnp.asarray(W), fnp.asarray(bias)), fnp.asarray(A))
    expected = np.stack([np.tanh(A[i].astype(np.float64) @ W + bias[i]) for i in range(5)])
    assert_close(out.numpy(), expected, np.float32, atol=1e-5)


def test_in_axes_dict_prefix():
    def fn(d: dict) -> Any:
        return d["x"].sum(axis=0) * d["scale"]

    x = np.moveaxis(A, 0, 1)  # mapped along axis 1
    out = fg.vmap(fn, in_axes=({"x": 1, "scale": None},))({"x": fnp.asarray(x), "scale": fnp.asarray(3.0)})
    assert_close(out.numpy(), A.astype(np.float64).sum(axis=1) * 3, np.float32, atol=1e-5)


def test_python_scalar_arguments_with_in_axes_none():
    out = fg.vmap(lambda x, s: x * s, in_axes=(0, None))(fnp.asarray(A), 2.0)
    assert out.dtype == np.float32
    assert_close(out.numpy(), A.astype(np.float64) * 2, np.float32)


# --- out_axes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("out_axes,expected_shape", [(0, (5, 3, 2)), (1, (3, 5, 2)), (2, (3, 2, 5)),
                                                     (-1, (3, 2, 5)), (-3, (5, 3, 2))])
def test_out_axes_places_the_batch_axis(out_axes, expected_shape):
    out = fg.vmap(lambda x, y: x @ y, out_axes=out_axes)(fnp.asarray(A), fnp.asarray(B))
    assert out.shape == expected_shape
    reference = np.einsum("bij,bjk->bik", A.astype(np.float64), B)
    assert_close(np.moveaxis(out.numpy(), out_axes, 0), reference, np.float32, atol=1e-5)


def test_out_axes_none_for_an_unbatched_output():
    def fn(x: Any, w: Any) -> tuple:
        return x @ w, w.sum()

    batched, shared = fg.vmap(fn, in_axes=(0, None), out_axes=(0, None))(fnp.asarray(A), fnp.asarray(W))
    assert batched.shape == (5, 3, 2) and shared.shape == ()
    assert_close(shared.numpy(), W.astype(np.float64).sum(), np.float32, atol=1e-5)


def test_out_axes_pytree_prefix():
    def fn(x: Any) -> dict:
        return {"rows": x.sum(axis=1), "both": (x, x * 2)}

    out = fg.vmap(fn, out_axes={"rows": 0, "both": (1, -1)})(fnp.asarray(A))
    assert out["rows"].shape == (5, 3)
    assert out["both"][0].shape == (3, 5, 4) and out["both"][1].shape == (3, 4, 5)
    np.testing.assert_allclose(out["both"][1].numpy(), np.moveaxis(A * 2, 0, -1))


def test_unbatched_output_is_broadcast_to_the_batch():
    out = fg.vmap(lambda x, w: w * 2, in_axes=(0, None))(fnp.asarray(A), fnp.asarray(W))
    assert out.shape == (5, 4, 2)
    np.testing.assert_allclose(out.numpy(), np.broadcast_to(W * 2, (5, 4, 2)))


# --- axis_size and nesting ---------------------------------------------------------------------


def test_axis_size_without_mapped_inputs():
    out = fg.vmap(lambda w: w + 1, in_axes=None, axis_size=4)(fnp.asarray(W))
    assert out.shape == (4, 4, 2)
    np.testing.assert_allclose(out.numpy(), np.broadcast_to(W + 1, (4, 4, 2)))
    made = fg.vmap(lambda: fnp.arange(3), in_axes=(), axis_size=2)()
    np.testing.assert_array_equal(made.numpy(), [[0, 1, 2], [0, 1, 2]])


def test_axis_size_agrees_with_mapped_inputs():
    out = fg.vmap(lambda x: x * 2, axis_size=5)(fnp.asarray(A))
    np.testing.assert_allclose(out.numpy(), A * 2)


def test_nested_vmap_matches_a_double_loop():
    def pair(x: Any, y: Any) -> Any:
        return fnp.dot(x, y) + fnp.max(x)

    xs = rng.standard_normal((3, 4)).astype(np.float32)
    ys = rng.standard_normal((6, 4)).astype(np.float32)
    inner = fg.vmap(pair, in_axes=(None, 0))  # over ys
    outer = fg.vmap(inner, in_axes=(0, None))  # over xs
    eager, traced = check_both_modes(outer, fnp.asarray(xs), fnp.asarray(ys))
    expected = xs.astype(np.float64) @ ys.T.astype(np.float64) + xs.max(axis=1, keepdims=True)
    assert eager.shape == (3, 6)
    assert_close(eager, expected, np.float32, atol=1e-5)
    assert_close(traced, expected, np.float32, atol=1e-5)


def test_nested_vmap_over_different_axes_of_one_argument():
    fn = fg.vmap(fg.vmap(lambda v: fnp.cumsum(v) * v[0], in_axes=0), in_axes=2)
    out = fn(fnp.asarray(A))  # outer over axis 2 (size 4), inner over axis 0 (size 5): vectors of 3
    moved = np.moveaxis(A.astype(np.float64), [2, 0], [0, 1])
    assert_close(out.numpy(), np.cumsum(moved, axis=-1) * moved[..., :1], np.float32, atol=1e-5)


# --- funcgrad.numpy functions against loops -----------------------------------------------------


def _softmax(x: Any) -> Any:
    shifted = x - fnp.max(x, axis=-1, keepdims=True)
    e = fnp.exp(shifted)
    return e / fnp.sum(e, axis=-1, keepdims=True)


def _cross_entropy(logits: Any, label: Any) -> Any:
    return -(fnp.log(_softmax(logits))[label])


NUMPY_CASES = {
    "matmul_both": (lambda x, y: fnp.matmul(x, y), (A, B), (0, 0)),
    "matmul_lhs": (lambda x, w: fnp.matmul(x, w), (A, W), (0, None)),
    "matmul_rhs": (lambda w, x: fnp.matmul(w.T, x), (W, np.moveaxis(B, 0, 2)), (None, 2)),
    "sum_axes": (lambda x: fnp.sum(x, axis=(0, 2)), (A.reshape(5, 3, 2, 2),), (1,)),
    "mean_var": (lambda x: fnp.mean(x, axis=0) + fnp.var(x, axis=-1).sum(), (A,), (0,)),
    "softmax": (_softmax, (A,), (-1,)),
    "logsumexp": (lambda x: fnp.logsumexp(x, axis=1), (A,), (0,)),
    "cross_entropy": (_cross_entropy, (A[:, 0, :], np.array([0, 3, 1, 2, 3], np.int32)), (0, 0)),
    "where_clip": (lambda x: fnp.where(x > 0, fnp.clip(x, 0.1, 0.5), -x), (A,), (2,)),
    "sort_argmax": (lambda x: fnp.sort(x, axis=0) + fnp.argmax(x, axis=1)[:, None], (A,), (1,)),
    "transpose_reshape": (lambda x: fnp.reshape(fnp.transpose(x), (2, -1)), (A,), (0,)),
    "concatenate_stack": (lambda x, w: fnp.concatenate([x, fnp.stack([w[:, 0]] * 3)], axis=0),
                          (A, W), (0, None)),
    "index_batched_i": (lambda x, i: x[i], (A, np.array([0, 2, 1, 2, 0], np.int32)), (0, 0)),
    "index_shared_x": (lambda x, i: x[i, 1:], (A[0], np.array([2, 0, 1, -1, 1], np.int32)), (None, 0)),
    "index_two_arrays": (lambda x, i: x[i, i + 1], (A, np.array([0, 1, 1, 0, 2], np.int32)), (0, 0)),
    "at_set": (lambda x, i, v: x.at[i].set(v), (A, np.array([0, 2, 1, 2, 0], np.int32), B[:, :, 0]),
               (0, 0, 0)),
    "at_add_shared_x": (lambda x, i: x.at[i].add(1.0), (A[0], np.array([0, 2, 1, 2, 0], np.int32)),
                        (None, 0)),
    "take_along_axis": (lambda x, i: fnp.take_along_axis(x, i, 1),
                        (A, np.argsort(A, axis=2).astype(np.int32)), (0, 0)),
    "pad": (lambda x: fnp.pad(x, ((1, 0), (0, 2))), (A,), (2,)),
    "cumsum_flip": (lambda x: fnp.flip(fnp.cumsum(x, axis=1), axis=0), (A,), (0,)),
}


@pytest.mark.parametrize("label", sorted(NUMPY_CASES))
def test_vmap_of_numpy_functions_matches_a_loop(label):
    fn, args, in_axes = NUMPY_CASES[label]
    check_vmap(fn, args, in_axes)


def test_vmap_of_random_draws_matches_a_loop_over_keys():
    keys = fg.random.split(fg.random.PRNGKey(0), 4)
    out = fg.vmap(lambda k: fg.random.normal(k, (3,)))(keys)
    expected = np.stack([fg.random.normal(keys[i], (3,)).numpy() for i in range(4)])
    np.testing.assert_array_equal(out.numpy(), expected)


def test_vmap_of_jit_stays_one_call_and_matches_a_loop():
    jitted = fg.jit(lambda x, y: fnp.tanh(x @ y))
    check_vmap(jitted, (A, B), (0, 0))
    ir = fg.make_ir(fg.vmap(jitted))(fnp.asarray(A), fnp.asarray(B))
    assert [e.primitive.name for e in ir.eqns] == ["jit"]


def test_vmap_of_grad_matches_a_loop():
    f = fg.grad(lambda x: fnp.sum(fnp.sin(x) * x))
    try:
        out = fg.vmap(f)(fnp.asarray(A))
    except NotImplementedError as err:  # jvp/transpose rules are being written alongside
        pytest.skip(f"a differentiation rule is missing: {err}")
    x = A.astype(np.float64)
    assert_close(out.numpy(), np.cos(x) * x + np.sin(x), np.float32, atol=1e-5)


def test_grad_of_vmap_matches_the_analytic_gradient():
    def loss(w: Any) -> Any:
        return fnp.sum(fg.vmap(lambda x: fnp.tanh(x @ w))(fnp.asarray(A)))
    try:
        out = fg.grad(loss)(fnp.asarray(W))
    except NotImplementedError as err:
        pytest.skip(f"a differentiation rule is missing: {err}")
    z = np.einsum("bij,jk->bik", A.astype(np.float64), W)
    expected = np.einsum("bij,bik->jk", A.astype(np.float64), 1 - np.tanh(z) ** 2)
    assert_close(out.numpy(), expected, np.float32, atol=1e-4)


# --- the batched IR -----------------------------------------------------------------------------


def test_vmap_under_make_ir_shows_the_batched_ir():
    ir = fg.make_ir(fg.vmap(lambda x, y: x @ y))(fnp.asarray(A), fnp.asarray(B))
    typecheck(ir)
    assert [v.aval.shape for v in ir.in_vars] == [(5, 3, 4), (5, 4, 2)]
    assert [a.aval.shape for a in ir.outputs] == [(5, 3, 2)]
    (dot,) = [e for e in ir.eqns if e.primitive.name == "dot_general"]
    assert dot.param_dict["batch"] == ((0,), (0,))
    assert "dot_general" in str(ir)


def test_batched_indexing_ir_is_a_gather_with_an_iota_column():
    ir = fg.make_ir(fg.vmap(lambda x, i: x[i]))(fnp.asarray(A), fnp.asarray(np.zeros(5, np.int32)))
    typecheck(ir)
    names = [e.primitive.name for e in ir.eqns]
    assert "gather" in names and "iota" in names


# --- hypothesis: random shapes and mapped axes --------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=3), st.integers(1, 4), st.data())
def test_softmax_over_random_shapes_and_axes(shape, size, data):
    axis = data.draw(st.integers(-len(shape) - 1, len(shape)))
    full = list(shape)
    full.insert(axis % (len(shape) + 1), size)
    x = np.random.default_rng(size).standard_normal(full).astype(np.float32)
    check_vmap(_softmax, (x,), (axis,))


# --- bad input ------------------------------------------------------------------------------------


def test_in_axes_out_of_range_names_the_argument():
    with pytest.raises(ValueError, match=r"in_axes 3 is out of range for argument\[1\] of rank 2"):
        fg.vmap(lambda x, w: x, in_axes=(0, 3))(fnp.asarray(A), fnp.asarray(W))
    with pytest.raises(ValueError, match=r"argument\[0\]\['x'\]"):
        fg.vmap(lambda d: d["x"], in_axes=({"x": -4},))({"x": fnp.asarray(W)})


def test_inconsistent_mapped_sizes_name_the_sizes():
    with pytest.raises(ValueError, match=r"inconsistent sizes.*size 5.*size 4"):
        fg.vmap(lambda x, w: x)(fnp.asarray(A), fnp.asarray(W))


def test_axis_size_disagreeing_with_the_inputs():
    with pytest.raises(ValueError, match="axis_size=3 but the mapped axes have size 5"):
        fg.vmap(lambda x: x, axis_size=3)(fnp.asarray(A))


def test_out_axes_none_on_a_batched_output():
    with pytest.raises(ValueError, match="out_axes=None depends on the mapped axis"):
        fg.vmap(lambda x: x.sum(), out_axes=None)(fnp.asarray(A))


def test_out_axes_out_of_range():
    with pytest.raises(ValueError, match="out_axes 4 is out of range for an output of rank 3"):
        fg.vmap(lambda x: x, out_axes=4)(fnp.asarray(A))


def test_in_axes_tuple_length_must_match_the_arguments():
    with pytest.raises(ValueError, match="in_axes has 3 entries but the function was called with 2"):
        fg.vmap(lambda x, y: x, in_axes=(0, 0, 0))(fnp.asarray(A), fnp.asarray(B))


def test_all_in_axes_none_needs_axis_size():
    with pytest.raises(ValueError, match="at least one mapped input.*axis_size"):
        fg.vmap(lambda x: x, in_axes=None)(fnp.asarray(A))


def test_in_axes_must_be_ints():
    with pytest.raises(TypeError, match=r"in_axes must be ints or None, got 1.5 for argument\[0\]"):
        fg.vmap(lambda x: x, in_axes=1.5)(fnp.asarray(A))


def test_python_control_flow_on_a_batched_value_is_a_concretization_error():
    with pytest.raises(fg.ConcretizationError):
        fg.vmap(lambda x: x if x.sum() > 0 else -x)(fnp.asarray(A))


def test_vmap_of_grad_returns_per_example_module_gradients():
    """The output of vmap may be a Module (vmap(grad) over a model): its treedef only counts
    array-valued attributes, so the out_axes placeholders must be arrays."""
    from funcgrad import nn
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    xs = fg.Tensor(np.linspace(-1, 1, 20, dtype=np.float32).reshape(5, 4))

    def loss(m, x):
        return fnp.sum(m(x) ** 2)

    grads = fg.vmap(fg.grad(loss), in_axes=(None, 0))(model, xs)
    assert isinstance(grads, nn.Sequential)
    assert grads[0].weight.shape == (5, 3, 4)
    for i in range(5):
        single = fg.grad(loss)(model, xs[i])
        np.testing.assert_allclose(grads[0].weight.numpy()[i], single[0].weight.numpy(), rtol=1e-5, atol=1e-6)
