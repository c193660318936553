"""Specification of funcgrad.numpy's creation functions: values and dtypes against NumPy (eager
and traced), JAX's defaults (float32, int32, weak Python-scalar fills), and bad input."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, check_both_modes

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir import dtypes


@pytest.mark.parametrize(("fn", "value"), [(fnp.zeros, 0), (fnp.ones, 1), (fnp.empty, 0)])
@pytest.mark.parametrize("shape", [(), 3, (2, 0), (2, 3, 1)])
def test_constant_fills_default_to_float32(fn, value, shape):  # type: ignore[no-untyped-def]
    eager, traced = check_both_modes(lambda: fn(shape))
    expected_shape = (shape,) if isinstance(shape, int) else shape
    for result in (eager, traced):
        assert result.dtype == np.float32 and result.shape == expected_shape
        if fn is not fnp.empty:
            np.testing.assert_array_equal(result, np.full(expected_shape, value))
    assert fn(shape, dtype="int8").dtype == dtypes.int8


@pytest.mark.parametrize(("fill", "dtype", "expected"), [
    (7, None, "int32"), (2.5, None, "float32"), (True, None, "bool"), (1.5, "int32", "int32"),
    (np.float16(1.5), None, "float16"), (3, "bfloat16", "bfloat16"), (1, "bool", "bool"),
])
def test_full_dtype_follows_fill_value(fill, dtype, expected):  # type: ignore[no-untyped-def]
    out = fnp.full((2, 2), fill, dtype=dtype)
    assert out.dtype == dtypes.canonicalize(expected)
    expected_values = np.full((2, 2), fill, dtype=dtypes.canonicalize(expected)).astype(np.float64)
    np.testing.assert_array_equal(out.numpy().astype(np.float64), expected_values)


def test_full_with_python_scalar_is_weakly_typed_like_jax():
    half = fnp.ones(3, dtype="float16")
    assert (fnp.full(3, 2.0) + half).dtype == dtypes.float16
    assert (fnp.full(3, 2.0, dtype="float32") + half).dtype == dtypes.float32


def test_full_broadcasts_array_fill_values_and_traced_fills():
    np.testing.assert_array_equal(fnp.full((2, 3), [1, 2, 3]).numpy(), np.full((2, 3), [1, 2, 3]))
    eager, traced = check_both_modes(lambda v: fnp.full((2, 2), v), np.float32(4.0))
    np.testing.assert_array_equal(traced, np.full((2, 2), 4.0, np.float32))
    with pytest.raises(ValueError, match=r"shape \(2,\).*\(3, 3\)"):
        fnp.full((3, 3), [1, 2])


@pytest.mark.parametrize(("fn", "reference"), [(fnp.zeros_like, np.zeros_like), (fnp.ones_like, np.ones_like),
                                               (lambda x: fnp.full_like(x, 7), lambda x: np.full_like(x, 7))])
@pytest.mark.parametrize("dtype", ["int8", "float16", "bool", "uint32"])
def test_like_functions_copy_shape_and_dtype(fn, reference, dtype):  # type: ignore[no-untyped-def]
    x = np.arange(6).reshape(2, 3).astype(dtype)
    eager, traced = check_both_modes(fn, x)
    assert eager.dtype == np.dtype(dtype) and eager.shape == (2, 3)
    np.testing.assert_array_equal(eager, reference(x))
    np.testing.assert_array_equal(traced, reference(x))
    assert fnp.empty_like(x).shape == (2, 3)
    assert fnp.zeros_like(x, dtype="float32").dtype == dtypes.float32


@pytest.mark.parametrize("args", [(5,), (2, 9), (2, 9, 3), (9, 2, -2), (5, 0, -1), (3, 3), (0, 1, 0.1),
                                  (-1.5, 2.25, 0.5), (1.0, -2.0, -0.3), (10, 0), (0.5, 4)])
def test_arange_matches_numpy(args):  # type: ignore[no-untyped-def]
    expected = np.arange(*args)
    is_float = any(isinstance(a, float) for a in args)
    eager, traced = check_both_modes(lambda: fnp.arange(*args))
    for result in (eager, traced):
        assert result.dtype == (np.float32 if is_float else np.int32)
        assert result.shape == expected.shape
        assert_close(result, expected, result.dtype)


def test_arange_dtypes_and_concrete_tensor_bounds():
    assert fnp.arange(5, dtype="float16").dtype == dtypes.float16
    np.testing.assert_array_equal(fnp.arange(3, dtype="bool").numpy(), np.arange(3).astype(bool))
    np.testing.assert_array_equal(fnp.arange(fnp.asarray(4)).numpy(), np.arange(4))
    with pytest.raises(fg.ConcretizationError):
        fg.make_ir(lambda n: fnp.arange(n))(3)
    with pytest.raises(ValueError, match="step must not be zero"):
        fnp.arange(0, 3, 0)
    with pytest.raises(TypeError, match="stop must be a real number"):
        fnp.arange(0, "3")


@pytest.mark.parametrize(("start", "stop", "num", "endpoint"), [
    (0, 1, 5, True), (0, 1, 5, False), (-3.5, 7.25, 11, True), (2, -2, 4, False), (1, 5, 1, True),
    (1, 5, 0, True), (1, 5, 1, False), (10, 20, 100, True),
])
def test_linspace_matches_numpy(start, stop, num, endpoint):  # type: ignore[no-untyped-def]
    expected = np.linspace(start, stop, num, endpoint=endpoint)
    eager, traced = check_both_modes(lambda: fnp.linspace(start, stop, num, endpoint=endpoint))
    for result in (eager, traced):
        assert result.dtype == np.float32 and result.shape == expected.shape
        assert_close(result, expected, np.float32)
    if endpoint and num > 1:
        assert eager[-1] == np.float32(stop)  # lands exactly on stop


def test_linspace_dtypes_and_traced_bounds():
    np.testing.assert_array_equal(fnp.linspace(-1, 1, 5, dtype="int32").numpy(),
                                  np.linspace(-1, 1, 5, dtype=np.int32))  # floors, as NumPy
    assert fnp.linspace(0, 1, 3, dtype="float16").dtype == dtypes.float16
    eager, traced = check_both_modes(lambda a, b: fnp.linspace(a, b, 4), np.float32(1.0), np.float32(4.0))
    assert_close(traced, np.linspace(1.0, 4.0, 4), np.float32)
    with pytest.raises(ValueError, match="num must be non-negative"):
        fnp.linspace(0, 1, -1)


@pytest.mark.parametrize(("n", "m", "k"), [(3, None, 0), (3, 4, 1), (4, 3, -2), (2, 5, 7), (0, 0, 0),
                                           (3, 3, -1)])
def test_eye_matches_numpy(n, m, k):  # type: ignore[no-untyped-def]
    expected = np.eye(n, m, k=k)
    for result in check_both_modes(lambda: fnp.eye(n, m, k=k)):
        assert result.dtype == np.float32
        np.testing.assert_array_equal(result, expected)
    assert fnp.eye(n, m, k=k, dtype="int8").dtype == dtypes.int8
    np.testing.assert_array_equal(fnp.identity(3).numpy(), np.identity(3))


@pytest.mark.parametrize("k", [-3, -1, 0, 1, 2, 5])
@pytest.mark.parametrize("shape", [(4, 4), (3, 5), (2, 4, 3)])
def test_tril_triu_match_numpy(k, shape):  # type: ignore[no-untyped-def]
    x = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) + 1
    for fn, reference in ((fnp.tril, np.tril), (fnp.triu, np.triu)):
        for result in check_both_modes(lambda v, fn=fn: fn(v, k=k), x):
            assert result.dtype == np.float32
            np.testing.assert_array_equal(result, reference(x, k))
    assert fnp.tril(x.astype(np.int8)).dtype == dtypes.int8


@pytest.mark.parametrize("indexing", ["xy", "ij"])
@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("sizes", [(3,), (3, 2), (2, 3, 4)])
def test_meshgrid_matches_numpy(indexing, sparse, sizes):  # type: ignore[no-untyped-def]
    arrays = [np.arange(n, dtype=np.float32) * (i + 1) for i, n in enumerate(sizes)]
    expected = np.meshgrid(*arrays, indexing=indexing, sparse=sparse)
    eager, traced = check_both_modes(lambda *a: fnp.meshgrid(*a, indexing=indexing, sparse=sparse), *arrays)
    for results in (eager, traced):
        results = results if isinstance(results, (list, tuple)) else [results]  # one output comes back bare
        assert len(results) == len(expected)
        for result, ref in zip(results, expected):
            assert result.shape == ref.shape
            np.testing.assert_array_equal(result, ref)


def test_meshgrid_promotes_and_rejects_bad_input():
    grids = fnp.meshgrid(np.arange(2, dtype=np.int32), np.arange(3, dtype=np.float16))
    assert {g.dtype for g in grids} == {dtypes.float16}
    with pytest.raises(ValueError, match="indexing must be 'xy' or 'ij'"):
        fnp.meshgrid(np.arange(2), indexing="yx")
    with pytest.raises(ValueError, match=r"1-d arrays.*\(2, 2\)"):
        fnp.meshgrid(np.ones((2, 2)))


@pytest.mark.parametrize("k", [-4, -2, -1, 0, 1, 3, 5])
def test_diag_matches_numpy(k):
    vector = np.arange(1, 4, dtype=np.int32)
    matrix = np.arange(12, dtype=np.float32).reshape(3, 4)
    for arg in (vector, matrix):
        for result in check_both_modes(lambda v: fnp.diag(v, k), arg):
            assert result.dtype == arg.dtype
            np.testing.assert_array_equal(result, np.diag(arg, k))


def test_bad_shapes_and_arguments():
    with pytest.raises(ValueError, match=r"negative dimension in shape \(2, -1\)"):
        fnp.zeros((2, -1))
    with pytest.raises(TypeError, match="shape entries must be integers"):
        fnp.ones((2.5, 1))
    with pytest.raises(ValueError, match=r"rank >= 2, got shape \(3,\)"):
        fnp.tril(np.ones(3))
    with pytest.raises(ValueError, match=r"1-d or 2-d array, got shape \(2, 2, 2\)"):
        fnp.diag(np.ones((2, 2, 2)))
    with pytest.raises(ValueError, match="negative dimension"):
        fnp.eye(-1)


def test_functions_have_docstrings_or_are_simple_fills():
    documented = [name for name in fnp.creation.__all__ if getattr(fnp.creation, name).__doc__]
    for name in ("full", "arange", "linspace", "eye", "identity", "tril", "triu", "meshgrid", "diag"):
        assert name in documented
