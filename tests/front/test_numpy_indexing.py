"""Tests for funcgrad/numpy/indexing.py: ``x[index]``, ``x.at[index]``, take, take_along_axis,
put_along_axis, select, compress, choose and the index helpers, against NumPy, eagerly and traced.

Out-of-range rules are jax.numpy's: array indices wrap once when negative, then reads clamp and
updates are dropped; static Python integers out of range raise IndexError as in NumPy.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.numpy.indexing import getitem
from tests.conftest import assert_close, assert_device_matches_reference, check_both_modes

X = np.arange(60, dtype=np.float32).reshape(3, 4, 5)


def both_modes_equal(fn: Any, *args: Any) -> np.ndarray:
    """Run ``fn`` eagerly and traced on the NumPy arguments as Tensors (Python scalars stay as they
    are: static eagerly, traced under make_ir); both must agree (exactly for integers, within a few
    ulps for floats: eager runs compiled kernels, traced the reference interpreter). Returns the result."""
    args = tuple(fnp.asarray(a) if isinstance(a, (np.ndarray, np.generic)) else a for a in args)
    eager, traced = check_both_modes(fn, *args)
    assert_device_matches_reference(eager, traced)
    return eager


# --- x[index] -----------------------------------------------------------------------------------

BASIC_AND_ADVANCED = [
    1, -1, (0, 2), (-3, -4, -5), (slice(None), 2), (slice(1, None),), (slice(None, None, -1),),
    (slice(3, 0, -2), None, Ellipsis, 1), (slice(-1, -4, -1), slice(None, None, 2)), (slice(5, 1),),
    (slice(0, 0), 1), (Ellipsis, slice(None, None, -3)), (None,), (Ellipsis, None), (1, Ellipsis, None, 2),
    ([0, 2],), ([[0], [2]],), ([],), ((0, 2),), (0, slice(None), [1, 2]), (slice(None), [0, 1], [2, 3]),
    ([[0], [1]], slice(None), [1, 2, 3]), (None, 1, [0, -1], slice(None, None, 2)),
    (slice(None), [0, 3], None, [1, 4]), (np.array([2, 0]), Ellipsis), (np.int64(-2), [1]),
    (True,), (False,), (slice(None), True, [0, 1]), (0, True), ([0], slice(None), True),
    (X[..., 0] > 20,), (X > 30,), (slice(None), np.array([True, False, True, False])),
    (Ellipsis, np.array([False] * 5)), (np.array(1),), (np.array(True), 0),
    (0, [1, 2], slice(None)), (0, Ellipsis, [1, 2], slice(None)), ([0, 1], Ellipsis, [1, 2], 3),  # NumPy: an
    (slice(None), True, Ellipsis, [0, 1], slice(None)),  # ellipsis separates advanced indices, even if empty
]


@pytest.mark.parametrize("index", BASIC_AND_ADVANCED, ids=repr)
def test_getitem_matches_numpy(index: Any) -> None:
    out = both_modes_equal(lambda a: a[index], X)
    expected = X[index]
    assert out.shape == expected.shape and out.dtype == np.float32
    np.testing.assert_array_equal(out, expected)


def test_getitem_keeps_dtype_and_accepts_numpy_and_lists_as_x() -> None:
    for dtype in ("int8", "uint8", "int32", "bool", "float16", "bfloat16"):
        x = fnp.asarray(np.arange(6).reshape(2, 3) % 2).astype(dtype)
        for out in (x[:, [0, 2]], x[1], x[::-1, None], x.at[0].set(1)):
            assert out.dtype == x.dtype
        np.testing.assert_array_equal(x[:, [2, 0]].numpy().astype(np.float32), [[0, 0], [1, 1]])
    np.testing.assert_array_equal(fnp.take(np.array([[1, 2], [3, 4]]), [3]).numpy(), [4])
    np.testing.assert_array_equal(getitem([[1, 2], [3, 4]], (slice(None), -1)).numpy(), [2, 4])
    np.testing.assert_array_equal(getitem(np.arange(4), [3, 0]).numpy(), [3, 0])


def test_index_arrays_of_any_integer_dtype_and_tensors() -> None:
    for dtype in ("int8", "int16", "uint8", "uint32", "int64", "int32"):
        index = np.array([2, 0, 1], dtype=dtype)
        out = both_modes_equal(lambda a, i: a[i], X, fnp.asarray(index, dtype))
        np.testing.assert_array_equal(out, X[index.astype(np.int64)])


def test_traced_index_arrays_follow_numpys_placement_rules() -> None:
    rows, cols = np.array([[0], [2]]), np.array([1, 3, -1])
    out = both_modes_equal(lambda a, r, c: a[r, :, c], X, rows, cols)  # separated: batch dims first
    np.testing.assert_array_equal(out, X[rows, :, cols])
    out = both_modes_equal(lambda a, r, c: a[:, r, c], X, rows, cols)  # adjacent: in place
    np.testing.assert_array_equal(out, X[:, rows, cols])


def test_traced_integer_scalar_index_inside_make_ir() -> None:
    ir = fg.make_ir(lambda a, i: a[i])(X, 2)
    assert ir.in_vars[1].aval.dtype == np.int32 and ir.in_vars[1].aval.shape == ()
    assert [eqn.primitive.name for eqn in ir.eqns].count("gather") == 1
    assert ir.out_avals[0].shape == (4, 5)
    for i in (0, 2, -1, -3):
        np.testing.assert_array_equal(both_modes_equal(lambda a, j: a[j], X, i), X[i])
        np.testing.assert_array_equal(both_modes_equal(lambda a, j: a[1, :, j], X, np.int32(i)), X[1, :, i])
    # a traced scalar mixed with slices and None, and with an array index
    out = both_modes_equal(lambda a, j: a[None, ::-1, j, 1:], X, 3)
    np.testing.assert_array_equal(out, X[None, ::-1, 3, 1:])
    np.testing.assert_array_equal(both_modes_equal(lambda a, j: a[[0, 2], :, j], X, 4), X[[0, 2], :, 4])


def test_traced_slice_bounds_raise_concretization_error() -> None:
    with pytest.raises(fg.ConcretizationError, match=r"slice bounds must be concrete.*i \+ fnp.arange\(k\)"):
        fg.make_ir(lambda a, i: a[i:i + 2])(X, 1)
    window = both_modes_equal(lambda a, i: a[i + fnp.arange(2)], X, 1)  # the suggested fix
    np.testing.assert_array_equal(window, X[1:3])


def test_traced_scalar_index_out_of_range_clamps() -> None:
    # as jax.numpy: wrap once if negative, then clamp into the axis
    for i, expected in ((3, 2), (10**9, 2), (-4, 0), (-(10**9), 0)):
        out = fg.make_ir(lambda a, j: a[j])(X, i)  # a Python int argument is traced (int32)
        assert out.in_avals[1].shape == () and out.in_avals[1].dtype == np.int32
        np.testing.assert_array_equal(both_modes_equal(lambda a, j: a[j], X, fnp.asarray(i)), X[expected])


def test_out_of_range_index_arrays_clamp() -> None:
    x = np.array([10.0, 20.0, 30.0], np.float32)
    index = np.array([5, -4, -7, 10**9, -(10**9), 2**40], np.int64)
    out = both_modes_equal(lambda a: a[index], x)
    np.testing.assert_array_equal(out, [30, 10, 10, 30, 10, 30])
    out = both_modes_equal(lambda a, i: a[i], x, np.array([3, -1, -4, 10**9], np.int32))
    np.testing.assert_array_equal(out, [30, 30, 10, 30])
    out = both_modes_equal(lambda a, i: a[i], x, fnp.asarray([2**40, -(2**40)], "int64"))
    np.testing.assert_array_equal(out, [30, 10])


def test_static_integer_out_of_range_clamps_on_reads_and_is_dropped_on_updates_as_jax() -> None:
    x = fnp.asarray(X)
    np.testing.assert_array_equal(x[3].numpy(), X[2])
    np.testing.assert_array_equal(x[0, :, -6].numpy(), X[0, :, 0])
    np.testing.assert_array_equal(x[[0], 4].numpy(), X[[0], 3])
    np.testing.assert_array_equal(x.at[3].set(-1).numpy(), X)  # dropped
    np.testing.assert_array_equal(x.at[0, 9, 1].add(100).numpy(), X)
    with pytest.raises(IndexError, match="index 0 is out of bounds for axis 0 with size 0"):
        fnp.ones(0)[0]
    jnp = pytest.importorskip("jax.numpy")
    for index in [3, -4, (0, slice(None), -6), (1, 7, 2)]:
        np.testing.assert_array_equal(x[index].numpy(), np.asarray(jnp.asarray(X)[index]))
        np.testing.assert_array_equal(x.at[index].set(0).numpy(), np.asarray(jnp.asarray(X).at[index].set(0)))


def test_bad_indices_raise_clear_errors() -> None:
    x = fnp.asarray(X)
    with pytest.raises(IndexError, match="too many indices for array: array is 3-dimensional, but 4"):
        x[0, 0, 0, 0]
    with pytest.raises(IndexError, match="too many indices"):
        x[X > 1, 0]
    with pytest.raises(IndexError, match="valid indices; got 1.0"):
        x[1.0]
    with pytest.raises(IndexError, match="dtype float32"):
        x[fnp.asarray([0.0, 1.0])]
    with pytest.raises(IndexError, match="dtype float64"):
        x[np.array([0.5])]
    with pytest.raises(IndexError, match="valid indices"):
        x["a"]
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., 0, ...]
    with pytest.raises(IndexError, match="boolean index did not match indexed array along axis 1; size of "
                                         "axis is 4 but size of corresponding boolean axis is 3"):
        x[:, np.array([True, False, True])]
    with pytest.raises(IndexError, match=r"could not be broadcast together with shapes \(2,\) \(3,\)"):
        x[[0, 1], [0, 1, 2]]
    with pytest.raises(TypeError, match="slice indices must be integers"):
        x[0.5:]
    with pytest.raises(TypeError, match="immutable.*at\\[index\\].set"):
        x[0] = 1.0


def test_traced_boolean_mask_raises_concretization_error() -> None:
    fn = lambda a, m: a[m]
    with pytest.raises(fg.ConcretizationError, match="value-dependent shape.*fnp.where"):
        fg.make_ir(fn)(X, X > 3)
    with pytest.raises(TypeError):  # ConcretizationError is a TypeError
        fg.make_ir(lambda a: a[a > 3])(X)
    with pytest.raises(fg.ConcretizationError, match="value-dependent shape"):
        fg.make_ir(lambda a, flag: a[flag])(X, True)  # a traced scalar bool decides the shape too
    # a concrete mask closed over by a trace is fine
    np.testing.assert_array_equal(both_modes_equal(lambda a: a[X > 50], X), X[X > 50])


def test_scalar_bool_indices_add_an_axis() -> None:
    x = fnp.asarray(X)
    assert x[True].shape == (1, 3, 4, 5) and x[False].shape == (0, 3, 4, 5)
    assert x[..., True].shape == (3, 4, 5, 1)
    np.testing.assert_array_equal(fnp.asarray(7.0)[True].numpy(), np.float32(7.0)[True])


def test_iteration_and_len_use_indexing() -> None:
    rows = list(fnp.asarray(X))
    assert len(rows) == 3
    np.testing.assert_array_equal(rows[2].numpy(), X[2])


# --- hypothesis: random basic + advanced index tuples -------------------------------------------


class _Slot:
    """Where a traced index array goes in an index tuple."""


@st.composite
def index_tuples(draw: Any) -> tuple[tuple[int, ...], tuple[Any, ...]]:
    """A shape and a valid, in-range NumPy index for it mixing ints, slices, None, ..., integer
    arrays (broadcastable to one batch shape), a scalar True and at most one boolean mask."""
    shape = tuple(draw(st.lists(st.integers(0, 4), min_size=0, max_size=4)))
    batch = tuple(draw(st.lists(st.integers(1, 3), min_size=0, max_size=2)))
    mask_mode = draw(st.booleans()) and draw(st.booleans())  # masks do not broadcast with arrays
    use_mask = mask_mode
    items: list[Any] = []
    for size in shape:
        if draw(st.integers(0, 5)) == 0:
            items.append(None)
        if draw(st.integers(0, 9)) == 0:
            items.append(True)
        kinds = ["slice", "full"] + (["int"] if size > 0 else [])
        kinds += ["array"] if size > 0 and not mask_mode else []
        kind = draw(st.sampled_from(kinds + (["mask"] if use_mask else [])))
        if kind == "mask":
            items.append(np.array(draw(st.lists(st.booleans(), min_size=size, max_size=size)), bool))
            use_mask = False
        elif kind == "int":
            items.append(draw(st.integers(-size, size - 1)))
        elif kind == "array":
            arr_shape = batch[draw(st.integers(0, len(batch))):]
            count = int(np.prod(arr_shape))
            values = draw(st.lists(st.integers(-size, size - 1), min_size=count, max_size=count))
            items.append(np.array(values, np.int64).reshape(arr_shape))
        elif kind == "slice":
            bound = st.one_of(st.none(), st.integers(-6, 6))
            step = draw(st.one_of(st.none(), st.sampled_from([-3, -2, -1, 1, 2, 3])))
            items.append(slice(draw(bound), draw(bound), step))
        else:
            items.append(slice(None))
    if draw(st.booleans()):  # replace a run of full slices (maybe empty) with an ellipsis
        start = draw(st.integers(0, len(items)))
        stop = start
        while stop < len(items) and isinstance(items[stop], slice) and items[stop] == slice(None):
            stop += 1
        items[start:stop] = [Ellipsis]
    elif draw(st.booleans()):  # drop trailing full slices: they are implicit
        while items and isinstance(items[-1], slice) and items[-1] == slice(None):
            items.pop()
    return shape, tuple(items)


@settings(max_examples=40, deadline=None)
@given(case=index_tuples(), traced_arrays=st.booleans())
def test_random_index_tuples_match_numpy(case: Any, traced_arrays: bool) -> None:
    shape, index = case
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    expected = x[index]
    arrays = [item for item in index if isinstance(item, np.ndarray) and item.dtype != bool]
    if traced_arrays and arrays:  # pass the index arrays as traced inputs
        template = tuple(_Slot() if isinstance(i, np.ndarray) and i.dtype != bool else i for i in index)

        def fn(a: Any, *dynamic: Any) -> Any:
            feed = iter(dynamic)
            return a[tuple(next(feed) if isinstance(i, _Slot) else i for i in template)]
        out = both_modes_equal(fn, x, *(a.astype(np.int32) for a in arrays))
    else:
        out = both_modes_equal(lambda a: a[index], x)
    assert out.shape == expected.shape
    np.testing.assert_array_equal(out, expected)

    # the same index updates: add accumulates over repeated positions, as np.add.at does
    updates = (np.arange(expected.size, dtype=np.float32) % 7 + 1).reshape(expected.shape)
    reference = x.copy()
    np.add.at(reference, index, updates)
    added = both_modes_equal(lambda a, u: a.at[index].add(u), x, updates)
    np.testing.assert_array_equal(added, reference)


# --- x.at[index] --------------------------------------------------------------------------------


def test_at_set_matches_numpy_assignment_and_leaves_x_unchanged() -> None:
    for index in [(0, slice(None), [1, -1]), (slice(None, None, -1), 2), (Ellipsis, None, 3),
                  (X > 40,), ([[0], [2]], slice(1, 3), [0, 4]), (), (1, True, slice(None, None, -2))]:
        values = np.float32(-1.0)
        expected = X.copy()
        expected[index] = values
        out = both_modes_equal(lambda a, i=index, v=values: a.at[i].set(v), X)
        np.testing.assert_array_equal(out, expected)
    x = fnp.asarray(X)
    x.at[0].set(0.0)
    np.testing.assert_array_equal(x.numpy(), X)


def test_at_values_broadcast_and_are_cast_to_x_dtype() -> None:
    ints = np.arange(12, dtype=np.int32).reshape(3, 4)
    out = both_modes_equal(lambda a, v: a.at[:, 1:3].set(v), ints, np.array([2.7, -3.9], np.float32))
    expected = ints.copy()
    expected[:, 1:3] = [2, -3]  # float -> int truncates toward zero
    np.testing.assert_array_equal(out, expected)
    assert out.dtype == np.int32
    out = both_modes_equal(lambda a: a.at[1].set(np.ones((1, 4), np.float32) * 9), ints)  # leading 1 dropped
    np.testing.assert_array_equal(out[1], [9, 9, 9, 9])
    with pytest.raises(ValueError, match=r"values of shape \(3,\) cannot be broadcast to the indexed shape"):
        fnp.asarray(ints).at[0].set(fnp.asarray([1, 2, 3]))


def test_at_add_accumulates_repeated_indices() -> None:
    x = np.zeros(5, np.float32)
    index = np.array([0, 0, 2, 0, -1, 4])
    out = both_modes_equal(lambda a, v: a.at[index].add(v), x, np.arange(1, 7, dtype=np.float32))
    np.testing.assert_array_equal(out, [1 + 2 + 4, 0, 3, 0, 5 + 6])
    out = both_modes_equal(lambda a, i: a.at[i].add(1.0), x, index.astype(np.int32))  # traced indices
    np.testing.assert_array_equal(out, [3, 0, 1, 0, 2])


def test_at_update_operations_match_numpy_ufunc_at() -> None:
    rng = np.random.default_rng(1)
    x = rng.uniform(0.5, 2.0, (4, 3)).astype(np.float32)
    index = ([0, 2, 2, -1], slice(None))
    values = rng.uniform(0.5, 2.0, (4, 3)).astype(np.float32)
    rows = np.array([0, 2, 2, 3])
    for method, ufunc in [("add", np.add), ("multiply", np.multiply), ("mul", np.multiply),
                          ("min", np.minimum), ("max", np.maximum)]:
        expected = x.astype(np.float64)
        ufunc.at(expected, (rows,), values.astype(np.float64))
        out, traced = check_both_modes(lambda a, v, m=method: getattr(a.at[index], m)(v), fnp.asarray(x),
                                       fnp.asarray(values))
        assert out.dtype == np.float32
        assert_close(out, expected)
        assert_close(traced, expected)
    expected = x.astype(np.float64)
    np.subtract.at(expected, (rows,), values.astype(np.float64))
    assert_close(both_modes_equal(lambda a, v: a.at[index].subtract(v), x, values), expected)
    expected = x.astype(np.float64)
    np.divide.at(expected, (rows,), values.astype(np.float64))
    assert_close(both_modes_equal(lambda a, v: a.at[index].divide(v), x, values), expected)
    expected = x.astype(np.float64)
    expected[[0, 3]] **= values[[0, 3]]
    expected[2] **= values[1].astype(np.float64) * values[2]  # repeated exponents multiply, as in JAX
    assert_close(both_modes_equal(lambda a, v: a.at[index].power(v), x, values), expected, rtol=1e-5)
    np.testing.assert_array_equal(both_modes_equal(lambda a: a.at[index].get(), x), x[rows])


def test_at_divide_of_integers_gives_floats_as_jax() -> None:
    out = both_modes_equal(lambda a: a.at[1].divide(2), np.array([3, 5, 7], np.int32))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [3.0, 2.5, 7.0])


def test_at_min_max_with_repeated_indices_and_ints() -> None:
    x = np.array([5, 5, 5], np.int32)
    index = [0, 0, 1]
    np.testing.assert_array_equal(both_modes_equal(lambda a: a.at[index].min(np.array([3, 1, 9])), x),
                                  [1, 5, 5])
    np.testing.assert_array_equal(both_modes_equal(lambda a: a.at[index].max(np.array([3, 8, 9])), x),
                                  [8, 9, 5])


def test_at_drops_out_of_range_updates() -> None:
    x = np.array([1.0, 2.0, 3.0], np.float32)
    index = np.array([0, 3, -4, 10**9, -(10**9), -1, 2**40])
    out = both_modes_equal(lambda a: a.at[index].set(9.0), x)
    np.testing.assert_array_equal(out, [9.0, 2.0, 9.0])  # only 0 and -1 (-> 2) are in range
    out = both_modes_equal(lambda a, i: a.at[i].add(100.0), x, np.array([3, -4, 10**9, 1], np.int32))
    np.testing.assert_array_equal(out, [1.0, 102.0, 3.0])
    out = both_modes_equal(lambda a, i: a.at[i].set(0.0), x, np.int32(10**9))  # far out of range
    np.testing.assert_array_equal(out, x)
    out = both_modes_equal(lambda a, i: a.at[i].set(0.0), x, -2)  # static eagerly, traced under make_ir
    np.testing.assert_array_equal(out, [1.0, 0.0, 3.0])
    out = both_modes_equal(lambda a, i: a.at[i].set(0.0), x, np.int32(-2))
    np.testing.assert_array_equal(out, [1.0, 0.0, 3.0])


def test_at_on_zero_dim_and_empty_arrays() -> None:
    np.testing.assert_array_equal(both_modes_equal(lambda a: a.at[()].add(2.0), np.float32(5)), 7.0)
    np.testing.assert_array_equal(both_modes_equal(lambda a: a.at[...].set(1.0), np.float32(5)), 1.0)
    np.testing.assert_array_equal(both_modes_equal(lambda a: a.at[False].set(1.0), np.float32(5)), 5.0)
    empty = np.zeros((0, 3), np.float32)
    assert both_modes_equal(lambda a: a.at[:, 1].set(1.0), empty).shape == (0, 3)


# --- take, take_along_axis, put_along_axis ------------------------------------------------------


def _wrap_then_clip(indices: np.ndarray, size: int) -> np.ndarray:
    """jax.numpy's clamping rule: negative indices wrap once, then clip into [0, size)."""
    indices = np.asarray(indices)
    return np.clip(np.where(indices < 0, indices + size, indices), 0, size - 1)


def test_take_matches_numpy() -> None:
    index = np.array([[2, 0], [-1, 4]])
    for axis in (0, 1, 2, -1, None):
        size = X.size if axis is None else X.shape[axis]
        expected = np.take(X, _wrap_then_clip(index, size), axis=axis)
        out = both_modes_equal(lambda a, ax=axis: fnp.take(a, index, axis=ax), X)
        np.testing.assert_array_equal(out, expected)
        out = both_modes_equal(lambda a, i, ax=axis: fnp.take(a, i, axis=ax), X, index.astype(np.int32))
        np.testing.assert_array_equal(out, expected)
    out = both_modes_equal(lambda a: fnp.take(a, 1, axis=1), X)
    np.testing.assert_array_equal(out, np.take(X, 1, axis=1))


def test_take_modes() -> None:
    x = np.array([10, 20, 30], np.int32)
    index = np.array([-5, -1, 2, 3, 10**9])
    np.testing.assert_array_equal(fnp.take(x, index).numpy(), [10, 30, 30, 30, 30])  # clip (default)
    np.testing.assert_array_equal(fnp.take(x, index, mode="wrap").numpy(), np.take(x, index, mode="wrap"))
    out = both_modes_equal(lambda a, i: fnp.take(a, i, mode="wrap"), x, index.astype(np.int32))
    np.testing.assert_array_equal(out, np.take(x, index, mode="wrap"))
    np.testing.assert_array_equal(fnp.take(x, [0, -3], mode="raise").numpy(), [10, 10])
    with pytest.raises(IndexError, match="out of bounds for axis 0 with size 3"):
        fnp.take(x, [3], mode="raise")
    with pytest.raises(fg.ConcretizationError, match="concrete indices"):
        fg.make_ir(lambda a, i: fnp.take(a, i, mode="raise"))(x, np.array([0]))
    with pytest.raises(ValueError, match="mode must be one of"):
        fnp.take(x, [0], mode="fill")
    with pytest.raises(IndexError, match="indices must be integers"):
        fnp.take(x, fnp.asarray([0.5]))
    with pytest.raises(ValueError, match="axis 3 is out of bounds for an array of rank 1"):
        fnp.take(x, [0], axis=3)


def test_take_along_axis_matches_numpy() -> None:
    rng = np.random.default_rng(2)
    x = rng.normal(size=(3, 4, 5)).astype(np.float32)
    order = np.argsort(x, axis=1)
    for axis in (0, 1, 2, -1):
        order = np.argsort(x, axis=axis)
        expected = np.take_along_axis(x, order, axis=axis)
        out = both_modes_equal(lambda a, i, ax=axis: fnp.take_along_axis(a, i, ax), x, order.astype(np.int32))
        np.testing.assert_array_equal(out, expected)
    first = np.zeros((3, 1, 5), np.int64)  # broadcast against the other axes
    np.testing.assert_array_equal(both_modes_equal(lambda a: fnp.take_along_axis(a, first, 1), x),
                                  np.take_along_axis(x, first, 1))
    broad = np.array([[[1], [0]]])  # (1, 2, 1): broadcasts against x's axes 0 and 2
    np.testing.assert_array_equal(both_modes_equal(lambda a: fnp.take_along_axis(a, broad, 1), x),
                                  np.take_along_axis(x, np.broadcast_to(broad, (3, 2, 5)), 1))
    flat = np.array([0, 59, -1, 100])
    np.testing.assert_array_equal(both_modes_equal(lambda a: fnp.take_along_axis(a, flat, None), x),
                                  x.ravel()[_wrap_then_clip(flat, 60)])


def test_take_along_axis_bad_input() -> None:
    with pytest.raises(ValueError, match=r"indices of shape \(2,\) must have the same rank as the array of "
                                         r"shape \(3, 4, 5\)"):
        fnp.take_along_axis(X, np.array([0, 1]), 0)
    with pytest.raises(IndexError, match="integer array, got dtype float"):
        fnp.take_along_axis(X, np.zeros((1, 1, 1)), 0)
    with pytest.raises(ValueError, match="do not broadcast"):
        fnp.take_along_axis(X, np.zeros((2, 1, 1), int), 1)


def test_put_along_axis_matches_numpy() -> None:
    x = np.zeros((3, 4), np.float32)
    index = np.array([[1], [3], [-1]])
    expected = x.copy()
    np.put_along_axis(expected, index, 7.0, 1)
    out = both_modes_equal(lambda a, i: fnp.put_along_axis(a, i, 7.0, 1, inplace=False), x,
                           index.astype(np.int32))
    np.testing.assert_array_equal(out, expected)
    expected = x.copy()
    np.put_along_axis(expected, np.array([0, 5, 11]), np.array([1.0, 2.0, 3.0]), None)
    out = both_modes_equal(lambda a: fnp.put_along_axis(a, np.array([0, 5, 11]), np.array([1.0, 2.0, 3.0]),
                                                        None, inplace=False), x)
    np.testing.assert_array_equal(out, expected)
    with pytest.raises(ValueError, match="inplace=False"):
        fnp.put_along_axis(x, index, 7.0, 1)


# --- select, choose, compress -------------------------------------------------------------------


def test_select_matches_numpy() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(4, 5)).astype(np.float32)
    conds = [x < -0.5, x > 0.5]
    choices = [x * 2, np.float32(-1.0) * np.ones((1, 5), np.float32)]
    out = both_modes_equal(lambda a: fnp.select([a < -0.5, a > 0.5], [a * 2, -fnp.ones((1, 5))], 3.0), x)
    assert out.dtype == np.float32
    assert_close(out, np.select(conds, [c.astype(np.float64) for c in choices], 3.0))
    # the first true condition wins
    both = np.array([True, True])
    np.testing.assert_array_equal(fnp.select([both, both], [1, 2]).numpy(), [1, 1])


def test_select_promotes_like_jax() -> None:
    choice = fnp.asarray([1, 2], "int8")
    assert fnp.select([np.array([True, False])], [choice]).dtype == np.int8  # weak default 0
    assert fnp.select([np.array([True, False])], [choice], 0.5).dtype == np.float32
    out = fnp.select([np.array([True, False])], [choice], fnp.asarray([9, 9], "uint8"))
    assert out.dtype == np.int16 and out.tolist() == [1, 9]


def test_select_bad_input() -> None:
    with pytest.raises(ValueError, match="same length, got 2 and 1"):
        fnp.select([np.array(True), np.array(False)], [1])
    with pytest.raises(ValueError, match="empty condition list"):
        fnp.select([], [])
    with pytest.raises(TypeError, match="condlist entry 0 must be a bool array, got int32"):
        fnp.select([fnp.asarray([1, 0])], [fnp.asarray([1, 2])])


def test_choose_matches_numpy() -> None:
    choices = [np.array([0, 1, 2, 3], np.int32), np.array([10, 11, 12, 13], np.int32), np.int32(20)]
    a = np.array([2, 0, 1, 1], np.int32)
    np.testing.assert_array_equal(both_modes_equal(lambda s: fnp.choose(s, choices, mode="clip"), a),
                                  np.choose(a, choices))
    wild = np.array([5, -1, 1, 3], np.int32)
    for mode in ("clip", "wrap"):
        out = both_modes_equal(lambda s, m=mode: fnp.choose(s, choices, mode=m), wild)
        np.testing.assert_array_equal(out, np.choose(wild, choices, mode=mode))
    np.testing.assert_array_equal(fnp.choose(a, choices).numpy(), np.choose(a, choices))
    with pytest.raises(ValueError, match=r"entries of a must be in \[0, 3\)"):
        fnp.choose(wild, choices)
    with pytest.raises(fg.ConcretizationError):
        fg.make_ir(lambda s: fnp.choose(s, choices))(a)


def test_compress_matches_numpy_and_needs_a_concrete_condition() -> None:
    cond = np.array([True, False, True, True])
    np.testing.assert_array_equal(both_modes_equal(lambda a: fnp.compress(cond, a, axis=1), X),
                                  np.compress(cond, X, axis=1))
    np.testing.assert_array_equal(fnp.compress(cond[:3], X).numpy(), np.compress(cond[:3], X))
    with pytest.raises(fg.ConcretizationError, match="value-dependent shape"):
        fg.make_ir(lambda a, c: fnp.compress(c, a, axis=1))(X, cond)
    with pytest.raises(IndexError, match="out of bounds for axis 0 with size 3"):
        fnp.compress(cond, X, axis=0)


# --- index helpers ------------------------------------------------------------------------------


def test_index_helpers_match_numpy() -> None:
    cases = [("diag_indices", (3,), {}), ("diag_indices", (2, 3), {}), ("tril_indices", (4,), {}),
             ("tril_indices", (3, -1, 5), {}), ("triu_indices", (4, 1), {}), ("triu_indices", (2, 0, 4), {}),
             ("tril_indices_from", (np.zeros((3, 2)),), {}),
             ("triu_indices_from", (np.zeros((2, 3)),), {"k": 1}),
             ("diag_indices_from", (np.zeros((3, 3, 3)),), {})]
    for name, args, kwargs in cases:
        ours, theirs = getattr(fnp, name)(*args, **kwargs), getattr(np, name)(*args, **kwargs)
        assert len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            assert a.dtype == np.int32
            np.testing.assert_array_equal(a.numpy(), b)
    square = np.arange(16, dtype=np.float32).reshape(4, 4)
    np.testing.assert_array_equal(both_modes_equal(lambda a: a[fnp.triu_indices(4, 1)], square),
                                  square[np.triu_indices(4, 1)])
    with pytest.raises(ValueError, match="at least 2 axes of equal size"):
        fnp.diag_indices_from(np.zeros((2, 3)))
    with pytest.raises(ValueError, match="2-d array"):
        fnp.tril_indices_from(np.zeros(3))


def test_ix_matches_numpy() -> None:
    args = ([0, 2], np.array([True, False, True, True]), fnp.asarray([4, 0]))
    ours = fnp.ix_(*args)
    theirs = np.ix_([0, 2], np.array([True, False, True, True]), np.array([4, 0]))
    for a, b in zip(ours, theirs):
        assert a.dtype == np.int32 and a.shape == b.shape
        np.testing.assert_array_equal(a.numpy(), b)
    np.testing.assert_array_equal(both_modes_equal(lambda a: a[fnp.ix_([0, 2], [3, 1], [4])], X),
                                  X[np.ix_([0, 2], [3, 1], [4])])
    out = both_modes_equal(lambda a, r: a[fnp.ix_(r, [3, 1])], X[0], np.array([2, 0]))  # traced r
    np.testing.assert_array_equal(out, X[0][np.ix_([2, 0], [3, 1])])
    with pytest.raises(ValueError, match="1-dimensional, argument 0 has shape"):
        fnp.ix_(np.zeros((2, 2), int))
    with pytest.raises(TypeError, match="integer or bool arrays"):
        fnp.ix_([0.5])
