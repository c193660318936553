"""funcgrad.numpy sorting and searching against NumPy, eager and traced."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from tests.conftest import check_both_modes


def _stable_descending_argsort(x: np.ndarray, axis: int) -> np.ndarray:
    """NumPy has no stable descending sort: reverse a stable ascending sort of the reversed input."""
    flipped = np.flip(x, axis)
    order = np.argsort(flipped, axis=axis, kind="stable")
    return np.flip(x.shape[axis] - 1 - order, axis)


# --- sort, argsort, top_k ------------------------------------------------------------------------


@pytest.mark.parametrize("axis", [0, 1, -1, None])
@pytest.mark.parametrize("dtype", ["float32", "int32", "uint8", "bool", "float16"])
def test_sort_and_argsort_match_numpy(rng, axis, dtype):
    x = (rng.integers(0, 4, (3, 5)) > 1 if dtype == "bool" else rng.integers(0, 4, (3, 5))).astype(dtype)
    eager, traced = check_both_modes(lambda t: fnp.sort(t, axis=axis), x)
    np.testing.assert_array_equal(eager, np.sort(x, axis=axis))
    np.testing.assert_array_equal(traced, np.sort(x, axis=axis))
    assert eager.dtype == np.dtype(dtype)
    eager, traced = check_both_modes(lambda t: fnp.argsort(t, axis=axis), x)
    expected = np.argsort(x, axis=axis, kind="stable")
    np.testing.assert_array_equal(eager, expected)  # ties keep their order
    np.testing.assert_array_equal(traced, expected)
    assert eager.dtype == np.int32


def test_nan_sorts_last_ascending_and_first_descending():
    x = np.array([2.0, np.nan, -1.0, np.nan, 2.0, -np.inf], np.float32)
    np.testing.assert_array_equal(fnp.sort(x).numpy(), np.sort(x))
    assert fnp.argsort(x).tolist() == np.argsort(x, kind="stable").tolist()
    assert fnp.argsort(x, descending=True).tolist() == [1, 3, 0, 4, 2, 5]
    np.testing.assert_array_equal(fnp.sort(x, descending=True).numpy(), x[[1, 3, 0, 4, 2, 5]])


def test_sort_errors_name_the_rank():
    with pytest.raises(ValueError, match="axis -1 is out of bounds for an array of rank 0"):
        fnp.sort(np.float32(1.0))
    with pytest.raises(ValueError, match="axis 2 is out of bounds for an array of rank 2"):
        fnp.argsort(np.ones((2, 2)), axis=2)


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), descending=st.booleans(),
       with_nan=st.booleans(), data=st.data())
def test_sort_argsort_stable_property(shape, descending, with_nan, data):
    rng = np.random.default_rng(sum(shape))
    x = rng.integers(0, 3, shape).astype(np.float32)  # few distinct values: many ties
    if with_nan:
        x[rng.random(shape) < 0.3] = np.nan
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    order, traced_order = check_both_modes(lambda t: fnp.argsort(t, axis=axis, descending=descending), x)
    expected = (_stable_descending_argsort(x, axis) if descending
                else np.argsort(x, axis=axis, kind="stable"))
    np.testing.assert_array_equal(order, expected)
    np.testing.assert_array_equal(traced_order, expected)
    values = fnp.sort(x, axis=axis, descending=descending).numpy()
    np.testing.assert_array_equal(values, np.take_along_axis(x, expected, axis))


def test_top_k_largest_first_with_ties_by_index():
    x = np.array([[1.0, 5.0, 3.0, 5.0], [0.0, -1.0, 2.0, 2.0]], np.float32)
    (values, indices), (traced_values, traced_indices) = check_both_modes(lambda t: fnp.top_k(t, 3), x)
    np.testing.assert_array_equal(values, [[5.0, 5.0, 3.0], [2.0, 2.0, 0.0]])
    np.testing.assert_array_equal(indices, [[1, 3, 2], [2, 3, 0]])
    np.testing.assert_array_equal(traced_indices, indices)
    assert indices.dtype == np.int32
    with pytest.raises(ValueError, match=r"k must be an integer in \[0, 4\]"):
        fnp.top_k(x, 5)


# --- searchsorted, isin ----------------------------------------------------------------------------


@pytest.mark.parametrize("side", ["left", "right"])
def test_searchsorted_matches_numpy_including_nan(side):
    a = np.array([-1.0, 0.0, 0.0, 2.5, 7.0, np.nan, np.nan], np.float32)
    v = np.array([[-5.0, 0.0, 1.0], [7.0, np.nan, 100.0]], np.float32)
    eager, traced = check_both_modes(lambda s, t: fnp.searchsorted(s, t, side=side), a, v)
    expected = np.searchsorted(a, v, side=side)
    np.testing.assert_array_equal(eager, expected)
    np.testing.assert_array_equal(traced, expected)
    assert eager.dtype == np.int32


def test_searchsorted_with_sorter_and_errors():
    a = np.array([3, 1, 2], np.int32)
    sorter = np.argsort(a)
    assert fnp.searchsorted(a, np.array([2, 4]), sorter=sorter).tolist() == \
        np.searchsorted(a, [2, 4], sorter=sorter).tolist()
    assert fnp.searchsorted(a[sorter], 2.5).item() == 2  # a float query promotes the int array
    with pytest.raises(ValueError, match="side must be 'left' or 'right'"):
        fnp.searchsorted(a, 1, side="middle")
    with pytest.raises(ValueError, match=r"1-d sorted array, got shape \(1, 3\)"):
        fnp.searchsorted(a[None], 1)


def test_isin(rng):
    x = rng.integers(0, 6, (3, 4)).astype(np.int32)
    tests = np.array([[1, 4], [5, 9]], np.int32)
    eager, traced = check_both_modes(lambda s, t: fnp.isin(s, t), x, tests)
    np.testing.assert_array_equal(eager, np.isin(x, tests))
    np.testing.assert_array_equal(traced, np.isin(x, tests))
    np.testing.assert_array_equal(fnp.isin(x, tests, invert=True).numpy(), np.isin(x, tests, invert=True))
    assert fnp.isin(np.array([np.nan], np.float32), np.array([np.nan], np.float32)).tolist() == [False]


# --- nonzero, argwhere, flatnonzero ----------------------------------------------------------------


def test_nonzero_concrete_matches_numpy(rng):
    x = rng.integers(0, 3, (3, 4, 2)).astype(np.float32)
    result = fnp.nonzero(x)
    expected = np.nonzero(x)
    assert len(result) == 3
    for got, want in zip(result, expected):
        np.testing.assert_array_equal(got.numpy(), want)
        assert got.dtype == np.int32
    np.testing.assert_array_equal(fnp.argwhere(x).numpy(), np.argwhere(x))
    np.testing.assert_array_equal(fnp.flatnonzero(x).numpy(), np.flatnonzero(x))
    assert fnp.argwhere(np.int32(5)).shape == np.argwhere(np.int32(5)).shape
    with pytest.raises(ValueError, match="nonzero of a 0-d array"):
        fnp.nonzero(np.float32(1.0))


@pytest.mark.parametrize("fn", [fnp.nonzero, fnp.argwhere, fnp.flatnonzero, fnp.unique, fnp.unique_values,
                                fnp.unique_counts, fnp.unique_inverse, fnp.unique_all])
def test_data_dependent_shapes_raise_under_tracing(fn):
    with pytest.raises(fg.ConcretizationError, match="output shape depends on the values.*size="):
        fg.make_ir(fn)(np.array([1, 0, 2], np.int32))


@pytest.mark.parametrize("size", [2, 4, 9])
def test_nonzero_with_size_traces_and_pads(rng, size):
    x = np.array([[0, 3, 0], [1, 0, 2]], np.int32)
    eager, traced = check_both_modes(lambda t: fnp.nonzero(t, size=size, fill_value=-1), x)
    rows, cols = np.nonzero(x)
    pad = max(size - rows.size, 0)
    expected_rows = np.concatenate([rows, np.full(pad, -1)])[:size]
    expected_cols = np.concatenate([cols, np.full(pad, -1)])[:size]
    for result in (eager, traced):
        np.testing.assert_array_equal(result[0], expected_rows)
        np.testing.assert_array_equal(result[1], expected_cols)
    eager_rows, _ = check_both_modes(lambda t: fnp.argwhere(t, size=size), x)
    np.testing.assert_array_equal(eager_rows, np.stack([expected_rows, expected_cols], 1).clip(min=0))
    flat, _ = check_both_modes(lambda t: fnp.flatnonzero(t, size=size, fill_value=7), x)
    np.testing.assert_array_equal(flat, np.concatenate([np.flatnonzero(x), np.full(pad, 7)])[:size])


def test_nonzero_fill_value_per_dimension_and_bad_size():
    rows, cols = fnp.nonzero(np.eye(2, dtype=np.float32), size=3, fill_value=(8, 9))
    assert rows.tolist() == [0, 1, 8] and cols.tolist() == [0, 1, 9]
    with pytest.raises(ValueError, match="size must be a non-negative integer"):
        fnp.nonzero(np.ones(3), size=-1)
    with pytest.raises(ValueError, match="fill_value needs 2 entries"):
        fnp.nonzero(np.ones((2, 2)), size=1, fill_value=(1, 2, 3))


# --- unique -----------------------------------------------------------------------------------------


def test_unique_family_matches_numpy():
    x = np.array([[3.0, 1.0, np.nan], [1.0, 2.0, np.nan]], np.float32)
    np.testing.assert_array_equal(fnp.unique_values(x).numpy(), np.unique_values(x))  # NaNs stay distinct
    counts = fnp.unique_counts(x)
    np.testing.assert_array_equal(counts.counts.numpy(), np.unique_counts(x).counts)
    inverse = fnp.unique_inverse(x)
    assert inverse.inverse_indices.shape == x.shape
    np.testing.assert_array_equal(inverse.inverse_indices.numpy(), np.unique_inverse(x).inverse_indices)
    full = fnp.unique_all(x)
    expected = np.unique_all(x)
    for field in ("values", "indices", "inverse_indices", "counts"):
        np.testing.assert_array_equal(getattr(full, field).numpy(), getattr(expected, field))
    assert full.counts.dtype == np.int32 and full.values.dtype == np.float32


def test_numpy_style_unique_flags_and_axis():
    x = np.array([2, 1, 2, 5, 1, 1], np.int32)
    got = fnp.unique(x, return_index=True, return_inverse=True, return_counts=True)
    expected = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    for g, e in zip(got, expected):
        np.testing.assert_array_equal(g.numpy(), e)
    assert fnp.unique(np.array([np.nan, np.nan, 1.0])).numpy().size == 2  # equal_nan=True, as NumPy
    rows = np.array([[1, 2], [0, 1], [1, 2]], np.int32)
    values, counts = fnp.unique(rows, return_counts=True, axis=0)
    np.testing.assert_array_equal(values.numpy(), np.unique(rows, axis=0))
    assert counts.tolist() == [1, 2]
    with pytest.raises(NotImplementedError, match="axis= and size="):
        fnp.unique(rows, axis=0, size=2)


@pytest.mark.parametrize("size", [1, 3, 6])
def test_unique_with_size_traces(size):
    x = np.array([[4, 1, 4], [2, 1, 1]], np.int32)
    fn = lambda t: fnp.unique(t, return_index=True, return_inverse=True, return_counts=True, size=size)
    eager, traced = check_both_modes(fn, x)
    values, index, inverse, counts = np.unique(x, return_index=True, return_inverse=True, return_counts=True)
    pad = max(size - values.size, 0)
    expected = [np.concatenate([values, np.full(pad, values.min())])[:size],
                np.concatenate([index, np.zeros(pad, int)])[:size],
                inverse,
                np.concatenate([counts, np.zeros(pad, int)])[:size]]
    for result in (eager, traced):
        for got, want in zip(result, expected):
            np.testing.assert_array_equal(got, want)
    filled, _ = check_both_modes(lambda t: fnp.unique_values(t, size=size, fill_value=-3), x)
    np.testing.assert_array_equal(filled, np.concatenate([values, np.full(pad, -3)])[:size])


def test_unique_with_size_treats_nans():
    x = np.array([np.nan, 1.0, np.nan], np.float32)
    values, counts = fnp.unique(x, return_counts=True, size=3, fill_value=0.0)
    np.testing.assert_array_equal(values.numpy(), [1.0, np.nan, 0.0])
    assert counts.tolist() == [1, 2, 0]
    np.testing.assert_array_equal(fnp.unique_values(x, size=3).numpy(), [1.0, np.nan, np.nan])
