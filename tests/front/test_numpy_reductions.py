"""funcgrad.numpy reductions and statistics against NumPy (float64 references), eager and traced."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from tests.conftest import assert_close, check_both_modes


def _data(rng: np.random.Generator, shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) > 0.5
    if np.dtype(dtype).kind in "iu":
        return rng.integers(0, 5, shape).astype(dtype)
    return rng.normal(size=shape).astype(dtype)


# --- sum, prod, max, min, mean, var, std ---------------------------------------------------------


@pytest.mark.parametrize("name", ["sum", "prod", "max", "min", "mean", "var", "std"])
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_basic_reductions_match_numpy(rng, name, axis, keepdims):
    x = _data(rng, (2, 3, 4))
    eager, traced = check_both_modes(lambda t: getattr(fnp, name)(t, axis=axis, keepdims=keepdims), x)
    expected = getattr(np, name)(x.astype(np.float64), axis=axis, keepdims=keepdims)
    assert eager.dtype == np.float32
    assert_close(eager, expected, rtol=1e-4, atol=1e-5)
    assert_close(traced, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("dtype, expected", [("bool", "int32"), ("int8", "int32"), ("uint8", "uint32"),
                                             ("int16", "int32"), ("int32", "int32"), ("float16", "float16")])
def test_sum_and_prod_widen_small_integers_as_jax(rng, dtype, expected):
    x = _data(rng, (3, 4), dtype)
    for name in ("sum", "prod", "cumsum"):
        eager, _ = check_both_modes(getattr(fnp, name), x)
        assert eager.dtype == np.dtype(expected), (name, eager.dtype)
    assert fnp.sum(x).item() == pytest.approx(float(np.sum(x.astype(np.float64))), rel=1e-2)


def test_sum_dtype_argument_casts_first():
    x = np.array([200, 100], np.uint8)
    out = fnp.sum(x, dtype="uint8")
    assert out.dtype == np.uint8 and out.item() == 44  # wraps in the requested dtype, as JAX does
    assert fnp.sum(x, dtype=fnp.float32).dtype == np.float32


def test_mean_of_integers_is_float32_and_mean_dtype_is_honoured():
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    eager, traced = check_both_modes(lambda t: fnp.mean(t, axis=1), x)
    assert eager.dtype == np.float32
    assert_close(eager, [1.0, 4.0])
    assert fnp.mean(x, dtype=fnp.float16).dtype == np.float16


def test_empty_reductions():
    empty = np.zeros((0, 3), np.float32)
    assert_close(fnp.sum(empty, axis=0).numpy(), np.zeros(3))
    assert_close(fnp.prod(empty, axis=0).numpy(), np.ones(3))
    assert fnp.all(empty).item() is True and fnp.any(empty).item() is False
    assert np.isnan(fnp.mean(empty).item())
    with pytest.raises(ValueError, match=r"max of an empty axis.*\(0, 3\)"):
        fnp.max(empty, axis=0)
    with pytest.raises(ValueError, match="argmin of an empty axis"):
        fnp.argmin(empty, axis=0)


def test_nan_propagates_through_max_min_sum():
    x = np.array([[1.0, np.nan], [2.0, 3.0]], np.float32)
    assert_close(fnp.max(x, axis=1).numpy(), [np.nan, 3.0])
    assert_close(fnp.min(x, axis=1).numpy(), [np.nan, 2.0])
    assert_close(fnp.sum(x, axis=0).numpy(), [3.0, np.nan])
    assert fnp.argmax(x, axis=1).tolist() == [1, 1]


def test_bad_axes_name_the_rank():
    x = np.ones((2, 3), np.float32)
    with pytest.raises(ValueError, match="axis 2 is out of bounds for an array of rank 2"):
        fnp.sum(x, axis=2)
    with pytest.raises(ValueError, match="repeated axis"):
        fnp.sum(x, axis=(0, -2))
    with pytest.raises(TypeError, match="axis must be an integer"):
        fnp.mean(x, axis=1.5)


def test_all_any_on_numbers():
    x = np.array([[0, 1], [2, 3]], np.int32)
    assert fnp.all(x, axis=1).tolist() == [False, True]
    assert fnp.any(x, axis=0).tolist() == [True, True]
    assert fnp.all(x).dtype == np.bool_


@pytest.mark.parametrize("axis", [None, 0, 1])
def test_argmax_argmin_first_occurrence_and_keepdims(axis):
    x = np.array([[3, 1, 3], [0, 0, 2]], np.int32)
    for name in ("argmax", "argmin"):
        eager, _ = check_both_modes(lambda t, n=name: getattr(fnp, n)(t, axis=axis, keepdims=True), x)
        expected = getattr(np, name)(x, axis=axis, keepdims=True)
        assert eager.dtype == np.int32 and eager.shape == expected.shape
        np.testing.assert_array_equal(eager, expected)


def test_var_std_correction(rng):
    x = _data(rng, (5, 3))
    assert_close(fnp.var(x, axis=0, correction=1).numpy(), np.var(x.astype(np.float64), axis=0, ddof=1),
                 rtol=1e-4)
    assert_close(fnp.std(x, ddof=1).numpy(), np.std(x.astype(np.float64), ddof=1), rtol=1e-4)


def test_logsumexp_is_stable():
    x = np.array([[1000.0, 1000.0], [-5.0, 3.0]], np.float32)
    eager, traced = check_both_modes(lambda t: fnp.logsumexp(t, axis=1), x)
    expected = np.logaddexp.reduce(x.astype(np.float64), axis=1)
    assert np.isfinite(eager).all()
    assert_close(eager, expected)
    assert_close(traced, expected)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 4), min_size=1, max_size=4), data=st.data())
def test_reductions_over_random_shapes_axes_keepdims(shape, data):
    shape = tuple(shape)
    x = np.random.default_rng(len(shape)).normal(size=shape).astype(np.float32)
    axes = data.draw(st.lists(st.integers(-len(shape), len(shape) - 1), unique_by=lambda a: a % len(shape),
                              max_size=len(shape)))
    axis = data.draw(st.sampled_from([None, tuple(axes)] + ([axes[0]] if axes else [])))
    keepdims = data.draw(st.booleans())
    name = data.draw(st.sampled_from(["sum", "max", "min", "mean", "prod", "var", "logsumexp"]))
    eager, traced = check_both_modes(lambda t: getattr(fnp, name)(t, axis=axis, keepdims=keepdims), x)
    x64 = x.astype(np.float64)
    if name == "logsumexp":
        expected = np.log(np.sum(np.exp(x64), axis=axis, keepdims=keepdims))
    else:
        expected = getattr(np, name)(x64, axis=axis, keepdims=keepdims)
    assert eager.shape == np.shape(expected)
    assert_close(eager, expected, rtol=1e-4, atol=1e-5)
    assert_close(traced, expected, rtol=1e-4, atol=1e-5)


# --- cumulative ----------------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumulative_sum_and_prod_with_include_initial(rng, axis):
    x = _data(rng, (3, 4))
    for fn, ref, identity in ((fnp.cumulative_sum, np.cumsum, 0.0), (fnp.cumulative_prod, np.cumprod, 1.0)):
        eager, traced = check_both_modes(lambda t, f=fn: f(t, axis=axis, include_initial=True), x)
        body = ref(x.astype(np.float64), axis=axis)
        pad_shape = list(x.shape)
        pad_shape[axis] = 1
        expected = np.concatenate([np.full(pad_shape, identity), body], axis=axis)
        assert_close(eager, expected, rtol=1e-4)
        assert_close(traced, expected, rtol=1e-4)
        assert_close(fn(x, axis=axis).numpy(), body, rtol=1e-4)


def test_cumulative_sum_needs_axis_for_matrices():
    with pytest.raises(ValueError, match=r"needs axis= for an array of rank 2 \(shape \(2, 2\)\)"):
        fnp.cumulative_sum(np.ones((2, 2)))
    assert fnp.cumulative_sum(np.array([True, True, False])).tolist() == [1, 2, 2]


def test_cumsum_cumprod_flatten_without_axis():
    x = np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    np.testing.assert_array_equal(fnp.cumsum(x).numpy(), np.cumsum(x))
    np.testing.assert_array_equal(fnp.cumprod(x, axis=1).numpy(), np.cumprod(x, axis=1))
    assert fnp.asarray(x).cumsum(0).tolist() == np.cumsum(x, 0).tolist()


def test_cummax_cummin_forward_and_reverse():
    x = np.array([[1.0, 3.0, 2.0, 5.0], [4.0, np.nan, 0.0, 1.0]], np.float32)
    eager, traced = check_both_modes(lambda t: fnp.cummax(t, axis=1), x)
    assert_close(eager, np.maximum.accumulate(x, axis=1))  # NaN propagates forward
    assert_close(traced, eager)
    assert_close(fnp.cummin(x, axis=1, reverse=True).numpy(),
                 np.flip(np.minimum.accumulate(np.flip(x, 1), axis=1), 1))


# --- counting, averages, order statistics --------------------------------------------------------


def test_count_nonzero():
    x = np.array([[0, 1, 2], [0, 0, 3]], np.int32)
    eager, traced = check_both_modes(lambda t: fnp.count_nonzero(t, axis=1), x)
    np.testing.assert_array_equal(eager, [2, 1])
    assert eager.dtype == np.int32
    assert fnp.count_nonzero(x).item() == 3
    assert fnp.count_nonzero(x, axis=0, keepdims=True).shape == (1, 3)


def test_average_with_weights(rng):
    x = _data(rng, (3, 4))
    w = rng.random((3, 4)).astype(np.float32)
    eager, traced = check_both_modes(lambda a, b: fnp.average(a, axis=1, weights=b), x, w)
    expected = np.average(x.astype(np.float64), axis=1, weights=w.astype(np.float64))
    assert_close(eager, expected, rtol=1e-4)
    assert_close(traced, expected, rtol=1e-4)
    w1 = rng.random(3).astype(np.float32)
    out, total = fnp.average(x, axis=0, weights=w1, returned=True)
    exp_out, exp_total = np.average(x.astype(np.float64), axis=0, weights=w1.astype(np.float64),
                                    returned=True)
    assert_close(out.numpy(), exp_out, rtol=1e-4)
    assert_close(total.numpy(), exp_total, rtol=1e-5)
    assert fnp.average(np.arange(4)).dtype == np.float32
    with pytest.raises(ValueError, match=r"weights of length 2 do not match axis 0 of shape \(3, 4\)"):
        fnp.average(x, axis=0, weights=np.ones(2))


def test_ptp(rng):
    x = _data(rng, (3, 5))
    eager, traced = check_both_modes(lambda t: fnp.ptp(t, axis=1), x)
    assert_close(eager, np.ptp(x.astype(np.float64), axis=1))
    assert fnp.ptp(np.array([4, 1, 7], np.int8)).dtype == np.int8


@pytest.mark.parametrize("method", ["linear", "lower", "higher", "nearest", "midpoint"])
@pytest.mark.parametrize("axis", [None, 1, (0, 2)])
def test_quantile_matches_numpy(rng, method, axis):
    x = _data(rng, (3, 5, 2))
    q = np.array([0.0, 0.25, 0.5, 0.9, 1.0], np.float32)
    eager, traced = check_both_modes(lambda t, s: fnp.quantile(t, s, axis=axis, method=method), x, q)
    expected = np.quantile(x.astype(np.float64), q.astype(np.float64), axis=axis, method=method)
    assert eager.shape == expected.shape
    assert_close(eager, expected, rtol=1e-5, atol=1e-5)
    assert_close(traced, expected, rtol=1e-5, atol=1e-5)


def test_median_percentile_keepdims_and_ints(rng):
    x = rng.integers(0, 100, (4, 6)).astype(np.int32)
    eager, traced = check_both_modes(lambda t: fnp.median(t, axis=0, keepdims=True), x)
    assert eager.dtype == np.float32
    assert_close(eager, np.median(x.astype(np.float64), axis=0, keepdims=True))
    assert_close(fnp.percentile(x, 30.0, axis=1).numpy(), np.percentile(x.astype(np.float64), 30.0, axis=1),
                 rtol=1e-5)
    assert_close(fnp.median(np.array([1.0, np.nan, 3.0], np.float32)).item(), np.nan)


def test_quantile_bad_input():
    with pytest.raises(ValueError, match=r"q must lie in \[0, 1\]"):
        fnp.quantile(np.ones(3), 1.5)
    with pytest.raises(ValueError, match="unknown method 'cubic'"):
        fnp.quantile(np.ones(3), 0.5, method="cubic")
    with pytest.raises(ValueError, match="quantile of an empty axis"):
        fnp.median(np.ones((0, 2)), axis=0)


# --- NaN-ignoring, diff ----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["nansum", "nanmean", "nanmax", "nanmin"])
def test_nan_reductions_ignore_nan(name):
    x = np.array([[1.0, np.nan, 3.0], [np.nan, np.nan, np.nan], [-2.0, 5.0, np.nan]], np.float32)
    eager, traced = check_both_modes(lambda t: getattr(fnp, name)(t, axis=1), x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # NumPy warns on all-NaN slices
        expected = getattr(np, name)(x.astype(np.float64), axis=1)
    assert_close(eager, expected)
    assert_close(traced, expected)


def test_nan_reductions_on_integers_are_plain():
    x = np.array([3, 1, 2], np.int32)
    assert fnp.nanmax(x).item() == 3 and fnp.nansum(x).item() == 6
    assert fnp.nanmean(x).dtype == np.float32


@pytest.mark.parametrize("n, axis", [(1, -1), (2, 0), (3, 1), (0, 1)])
def test_diff_matches_numpy(rng, n, axis):
    x = _data(rng, (4, 5))
    eager, traced = check_both_modes(lambda t: fnp.diff(t, n=n, axis=axis), x)
    expected = np.diff(x.astype(np.float64), n=n, axis=axis)
    assert eager.shape == expected.shape
    assert_close(eager, expected, rtol=1e-4, atol=1e-5)


def test_diff_prepend_append_and_bool():
    x = np.array([1, 4, 9], np.int32)
    expected = np.diff(x, prepend=0, append=[20]).tolist()
    assert fnp.diff(x, prepend=0, append=np.array([20])).tolist() == expected
    b = np.array([True, True, False, True])
    assert fnp.diff(b).tolist() == np.diff(b).tolist()
    with pytest.raises(ValueError, match="non-negative integer"):
        fnp.diff(x, n=-1)


def test_reductions_trace_to_one_primitive_each():
    ir = fg.make_ir(lambda t: fnp.sum(t, axis=1, keepdims=True))(np.ones((2, 3), np.float32))
    names = [eqn.primitive.name for eqn in ir.eqns]
    assert names == ["reduce_sum", "reshape"]


@pytest.mark.parametrize("axes", [(0, 2, 3), None])
def test_long_float32_sums_stay_accurate(axes):
    """A float32 sum over 200k+ values (BatchNorm's statistics at batch 512) adds partial sums: one
    running float32 accumulator was ~1e-4 off, which BatchNorm's backward magnified to percents."""
    rng = np.random.default_rng(0)
    x = (1.0001 + 1e-3 * rng.standard_normal((512, 4, 24, 24))).astype(np.float32)
    got = fnp.sum(fg.Tensor(x), axis=axes).numpy()
    expected = x.astype(np.float64).sum(axis=axes)
    np.testing.assert_allclose(got, expected, rtol=2e-6)
