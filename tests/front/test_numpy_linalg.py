"""funcgrad.numpy linear algebra against NumPy (float64 references), eager and traced."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from tests.conftest import assert_close, check_both_modes

TOL = {"rtol": 1e-4, "atol": 1e-4}


def _normal(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.normal(size=shape).astype(np.float32)


def _f64(*arrays: np.ndarray) -> list[np.ndarray]:
    return [a.astype(np.float64) for a in arrays]


# --- matmul, dot family ----------------------------------------------------------------------------


@pytest.mark.parametrize("shapes", [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 3), (3, 4)),
                                    ((5, 2, 3), (3, 4)), ((5, 1, 2, 3), (4, 3, 2))])
def test_matmul_matches_numpy(rng, shapes):
    a, b = _normal(rng, *shapes[0]), _normal(rng, *shapes[1])
    eager, traced = check_both_modes(fnp.matmul, a, b)
    expected = np.matmul(*_f64(a, b))
    assert eager.shape == expected.shape and eager.dtype == np.float32
    assert_close(eager, expected, **TOL)
    assert_close(traced, expected, **TOL)


def test_matmul_dtypes_follow_jax():
    ints = np.arange(6, dtype=np.int32).reshape(2, 3)
    assert fnp.matmul(ints, ints.T).dtype == np.int32
    assert fnp.matmul(ints, np.ones((3, 2), np.float16)).dtype == np.float16
    mask = np.array([[True, False], [False, False]])
    out = fnp.matmul(mask, mask)
    assert out.dtype == np.bool_ and out.tolist() == np.matmul(mask, mask).tolist()


def test_matmul_bad_shapes():
    with pytest.raises(TypeError, match=r"shapes \(2, 3\) and \(4,\) do not align"):
        fnp.matmul(np.ones((2, 3)), np.ones(4))
    with pytest.raises(ValueError, match="rank >= 1"):
        fnp.matmul(np.ones(3), 2.0)


@pytest.mark.parametrize("shapes", [((), (3,)), ((3,), (3,)), ((2, 3), (3,)), ((2, 3), (3, 4)),
                                    ((2, 3, 4), (5, 4, 6)), ((4,), (2, 4, 3))])
def test_dot_follows_numpy(rng, shapes):
    a, b = _normal(rng, *shapes[0]), _normal(rng, *shapes[1])
    eager, traced = check_both_modes(fnp.dot, a, b)
    expected = np.dot(*_f64(a, b))
    assert eager.shape == np.shape(expected)
    assert_close(eager, expected, **TOL)
    assert_close(traced, expected, **TOL)
    with pytest.raises(TypeError, match="not aligned"):
        fnp.dot(np.ones((2, 3)), np.ones((2, 3)))


def test_inner_outer_vdot(rng):
    a, b = _normal(rng, 2, 3), _normal(rng, 4, 3)
    for fn, ref, args in ((fnp.inner, np.inner, (a, b)), (fnp.outer, np.outer, (a, b)),
                          (fnp.vdot, np.vdot, (a, _normal(rng, 3, 2)))):
        eager, traced = check_both_modes(fn, *args)
        expected = ref(*_f64(*args))
        assert eager.shape == np.shape(expected)
        assert_close(eager, expected, **TOL)
        assert_close(traced, expected, **TOL)
    assert fnp.inner(2.0, a).shape == a.shape
    with pytest.raises(TypeError, match="vdot needs inputs of one size"):
        fnp.vdot(np.ones(3), np.ones(4))


@pytest.mark.parametrize("axes", [0, 1, 2, ([1, 0], [0, 1]), ((2,), (1,)), (-1, 0)])
def test_tensordot_matches_numpy(rng, axes):
    a, b = _normal(rng, 3, 4, 5), _normal(rng, 4, 5, 2)
    if axes in (((2,), (1,)),):
        b = _normal(rng, 2, 5, 3)
    if axes in ((-1, 0), 1):
        b = _normal(rng, 5, 2)
    if axes == ([1, 0], [0, 1]):
        b = _normal(rng, 4, 3, 2)
    if axes == 0:
        b = _normal(rng, 2)
    eager, traced = check_both_modes(lambda x, y: fnp.tensordot(x, y, axes=axes), a, b)
    expected = np.tensordot(*_f64(a, b), axes=axes)
    assert eager.shape == expected.shape
    assert_close(eager, expected, **TOL)
    assert_close(traced, expected, **TOL)


def test_tensordot_bad_axes():
    with pytest.raises(TypeError, match=r"axis 1 of shape \(2, 3\) and axis 0 of shape \(4, 2\) differ"):
        fnp.tensordot(np.ones((2, 3)), np.ones((4, 2)), axes=1)
    with pytest.raises(ValueError, match=r"axes=3 must lie in \[0, 2\]"):
        fnp.tensordot(np.ones((2, 3)), np.ones((3, 2)), axes=3)
    with pytest.raises(TypeError, match="axes must be an int or a pair"):
        fnp.tensordot(np.ones((2, 3)), np.ones((3, 2)), axes="ij")


def test_vecdot_broadcasts_and_checks_the_axis(rng):
    a, b = _normal(rng, 4, 1, 3), _normal(rng, 5, 3)
    eager, traced = check_both_modes(fnp.vecdot, a, b)
    expected = np.sum(a.astype(np.float64) * b, axis=-1)
    assert eager.shape == (4, 5)
    assert_close(eager, expected, **TOL)
    assert_close(traced, expected, **TOL)
    c, d = _normal(rng, 3, 2), _normal(rng, 3, 2)
    assert_close(fnp.vecdot(c, d, axis=0).numpy(), np.sum(c.astype(np.float64) * d, axis=0), **TOL)
    with pytest.raises(ValueError, match=r"differ along axis -1 \(3 != 1\)"):
        fnp.vecdot(np.ones((2, 3)), np.ones((2, 1)))


# --- einsum ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec, shapes", [
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ij,jk", [(2, 3), (3, 4)]),
    ("bij,bjk->bik", [(5, 2, 3), (5, 3, 4)]),
    ("ii->i", [(3, 3)]),
    ("ii", [(3, 3)]),
    ("iij->ji", [(3, 3, 2)]),
    ("ij->", [(2, 3)]),
    ("ij->ji", [(2, 3)]),
    ("i,j->ij", [(2,), (3,)]),
    ("i,i->", [(4,), (4,)]),
    ("...ij,...jk->...ik", [(2, 1, 2, 3), (4, 3, 5)]),
    ("...j,j", [(2, 3, 4), (4,)]),
    ("i...->...", [(3, 2, 2)]),
    ("ij,jk,kl->il", [(2, 3), (3, 4), (4, 5)]),
    ("ab,bc,ca->", [(2, 3), (3, 4), (4, 2)]),
    ("ijk,ikl->jl", [(2, 3, 4), (2, 4, 5)]),
    ("ij,ij,ij->i", [(2, 3), (2, 3), (2, 3)]),
    ("ba, cb -> ac", [(3, 2), (4, 3)]),
])
def test_einsum_matches_numpy(rng, spec, shapes):
    operands = [_normal(rng, *s) for s in shapes]
    eager, traced = check_both_modes(lambda *ops: fnp.einsum(spec, *ops), *operands)
    expected = np.einsum(spec, *_f64(*operands))
    assert eager.shape == np.shape(expected)
    assert_close(eager, expected, **TOL)
    assert_close(traced, expected, **TOL)


def test_einsum_bad_input():
    with pytest.raises(ValueError, match="names 2 operands but 1 were given"):
        fnp.einsum("ij,jk", np.ones((2, 2)))
    with pytest.raises(ValueError, match=r"'ijk' has 3 subscripts for an operand of rank 2"):
        fnp.einsum("ijk", np.ones((2, 2)))
    with pytest.raises(ValueError, match="subscript 'j' of sizes 3 and 4"):
        fnp.einsum("ij,jk", np.ones((2, 3)), np.ones((4, 2)))
    with pytest.raises(ValueError, match="output subscript 'z' does not appear"):
        fnp.einsum("ij->z", np.ones((2, 3)))
    with pytest.raises(ValueError, match="invalid subscript '1'"):
        fnp.einsum("i1", np.ones((2, 3)))


def test_einsum_traces_to_one_dot_general_for_a_matmul():
    ir = fg.make_ir(lambda a, b: fnp.einsum("ij,jk->ik", a, b))(np.ones((2, 3), np.float32),
                                                                   np.ones((3, 4), np.float32))
    assert [eqn.primitive.name for eqn in ir.eqns] == ["dot_general"]


# --- diagonal, trace, kron -------------------------------------------------------------------------


@pytest.mark.parametrize("offset, axis1, axis2", [(0, 0, 1), (1, 0, 1), (-1, 0, 1), (2, 1, 2), (-2, 2, 0),
                                                  (5, 0, 1)])
def test_diagonal_and_trace(offset, axis1, axis2):
    x = np.arange(60, dtype=np.int32).reshape(3, 4, 5)
    eager, traced = check_both_modes(lambda t: fnp.diagonal(t, offset, axis1, axis2), x)
    expected = np.diagonal(x, offset, axis1, axis2)
    assert eager.shape == expected.shape
    np.testing.assert_array_equal(eager, expected)
    np.testing.assert_array_equal(traced, expected)
    trace = fnp.trace(x, offset, axis1, axis2)
    np.testing.assert_array_equal(trace.numpy(), np.trace(x, offset, axis1, axis2))
    assert trace.dtype == np.int32


def test_trace_widens_small_ints_and_diagonal_rejects_bad_axes():
    assert fnp.trace(np.ones((3, 3), np.int8)).dtype == np.int32
    with pytest.raises(ValueError, match="axis1 and axis2 must differ"):
        fnp.diagonal(np.ones((2, 2)), 0, 1, -1)
    with pytest.raises(ValueError, match=r"rank >= 2, got shape \(3,\)"):
        fnp.diagonal(np.ones(3))


@pytest.mark.parametrize("shapes", [((2,), (3,)), ((2, 2), (3, 1)), ((2,), (2, 3)), ((2, 1, 3), (2, 2))])
def test_kron_matches_numpy(rng, shapes):
    a, b = _normal(rng, *shapes[0]), _normal(rng, *shapes[1])
    eager, traced = check_both_modes(fnp.kron, a, b)
    expected = np.kron(*_f64(a, b))
    assert eager.shape == expected.shape
    assert_close(eager, expected, **TOL)
    assert_close(traced, expected, **TOL)


# --- norms -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("ord", [1, 2, np.inf, -np.inf, 0, 3, 0.5])
@pytest.mark.parametrize("axis", [None, 1, (0, 1)])
def test_vector_norm(rng, ord, axis):
    x = _normal(rng, 3, 4)
    eager, traced = check_both_modes(lambda t: fnp.vector_norm(t, axis=axis, ord=ord, keepdims=True), x)
    axes = [0, 1] if axis is None else np.atleast_1d(axis).tolist()
    rest = [i for i in range(x.ndim) if i not in axes]
    vectors = np.transpose(x.astype(np.float64), rest + axes).reshape([x.shape[i] for i in rest] + [-1])
    expected = np.linalg.norm(vectors, ord=ord, axis=-1)
    assert_close(eager, np.reshape(expected, eager.shape), **TOL)
    assert_close(traced, np.reshape(expected, eager.shape), **TOL)
    assert eager.shape == np.sum(x, axis=axis, keepdims=True).shape


@pytest.mark.parametrize("ord", ["fro", 1, -1, np.inf, -np.inf])
def test_matrix_norm_and_norm(rng, ord):
    x = _normal(rng, 2, 3, 4)
    eager, traced = check_both_modes(lambda t: fnp.matrix_norm(t, ord=ord), x)
    expected = np.linalg.norm(x.astype(np.float64), ord=ord, axis=(-2, -1))
    assert_close(eager, expected, **TOL)
    assert_close(traced, expected, **TOL)
    assert_close(fnp.norm(x, ord, axis=(2, 0), keepdims=True).numpy(),
                 np.linalg.norm(x.astype(np.float64), ord, axis=(2, 0), keepdims=True), **TOL)
    assert_close(fnp.norm(x[0], ord).numpy(), np.linalg.norm(x[0].astype(np.float64), ord), **TOL)


def test_tensordot_takes_axes_by_position(rng):
    a, b = _normal(rng, 2, 3, 4), _normal(rng, 3, 4, 5)
    assert_close(fnp.tensordot(a, b, 2).numpy(), np.tensordot(*_f64(a, b), 2), **TOL)
    assert_close(fnp.linalg.tensordot(a, b, ([1], [0])).numpy(), np.tensordot(*_f64(a, b), ([1], [0])), **TOL)


def test_norm_defaults_and_errors(rng):
    x = _normal(rng, 2, 3, 4)
    assert_close(fnp.norm(x).numpy(), np.linalg.norm(x.astype(np.float64)), **TOL)
    assert_close(fnp.norm(x, axis=1).numpy(), np.linalg.norm(x.astype(np.float64), axis=1), **TOL)
    assert fnp.norm(np.arange(3)).dtype == np.float32
    x64 = x.astype(np.float64)
    for ord_ in (2, -2, "nuc"):  # through the singular values (the svd primitive)
        assert_close(fnp.matrix_norm(x, ord=ord_).numpy(), np.linalg.norm(x64, ord_, axis=(-2, -1)), **TOL)
    assert_close(fnp.norm(x, "nuc", axis=(2, 0), keepdims=True).numpy(),
                 np.linalg.norm(x64, "nuc", axis=(2, 0), keepdims=True), **TOL)
    with pytest.raises(ValueError, match="1-d or 2-d array"):
        fnp.norm(x, 1)
    with pytest.raises(ValueError, match="ord must be a number"):
        fnp.vector_norm(x, ord="fro")


# --- properties ----------------------------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(batch=st.lists(st.integers(1, 3), max_size=2), m=st.integers(1, 4), k=st.integers(1, 4),
       n=st.integers(1, 4), drop_batch=st.booleans())
def test_matmul_property_random_batched_shapes(batch, m, k, n, drop_batch):
    rng = np.random.default_rng(m * 100 + k * 10 + n)
    a = _normal(rng, *batch, m, k)
    b = _normal(rng, *([] if drop_batch else [1] * len(batch)), k, n)
    eager, traced = check_both_modes(fnp.matmul, a, b)
    expected = np.matmul(*_f64(a, b))
    assert eager.shape == expected.shape
    assert_close(eager, expected, **TOL)
    assert_close(traced, expected, **TOL)


@settings(max_examples=30, deadline=None)
@given(free_a=st.lists(st.integers(1, 3), max_size=2), free_b=st.lists(st.integers(1, 3), max_size=2),
       shared=st.lists(st.integers(1, 3), max_size=2))
def test_tensordot_and_einsum_property(free_a, free_b, shared):
    rng = np.random.default_rng(len(free_a) + 3 * len(free_b) + 9 * len(shared))
    a = _normal(rng, *free_a, *shared)
    b = _normal(rng, *shared, *free_b)
    eager, traced = check_both_modes(lambda x, y: fnp.tensordot(x, y, axes=len(shared)), a, b)
    expected = np.tensordot(*_f64(a, b), axes=len(shared))
    assert_close(eager, expected, **TOL)
    assert_close(traced, expected, **TOL)
    letters_a = "abc"[:len(free_a)]
    letters_s = "xyz"[:len(shared)]
    letters_b = "def"[:len(free_b)]
    spec = f"{letters_a}{letters_s},{letters_s}{letters_b}->{letters_b}{letters_a}"
    eager, traced = check_both_modes(lambda x, y: fnp.einsum(spec, x, y), a, b)
    expected = np.einsum(spec, *_f64(a, b))
    assert eager.shape == expected.shape
    assert_close(eager, expected, **TOL)
    assert_close(traced, expected, **TOL)
