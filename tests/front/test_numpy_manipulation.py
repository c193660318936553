"""Specification of funcgrad.numpy's manipulation functions: every movement function against NumPy
(eager and traced), hypothesis properties over random shapes, and the errors bad input raises."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import check_both_modes
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir import dtypes


def _x(shape: tuple[int, ...] = (2, 3, 4), dtype: str = "float32") -> np.ndarray:
    return (np.arange(int(np.prod(shape))).reshape(shape) + 1).astype(dtype)


def _check_same(fn, reference, *args):  # type: ignore[no-untyped-def]
    """fn(*args) equals reference(*args) exactly, eagerly and traced, with the input's dtype."""
    expected = reference(*args)
    for result in check_both_modes(fn, *args):
        assert result.dtype == expected.dtype, (result.dtype, expected.dtype)
        assert result.shape == expected.shape, (result.shape, expected.shape)
        np.testing.assert_array_equal(result, expected)


@pytest.mark.parametrize(("fn", "reference"), [
    (lambda x: fnp.reshape(x, (4, -1)), lambda x: np.reshape(x, (4, -1))),
    (lambda x: fnp.reshape(x, 24), lambda x: np.reshape(x, 24)),
    (lambda x: fnp.permute_dims(x, (2, 0, 1)), lambda x: np.transpose(x, (2, 0, 1))),
    (lambda x: fnp.transpose(x), np.transpose),
    (lambda x: fnp.matrix_transpose(x), lambda x: np.swapaxes(x, -1, -2)),
    (lambda x: fnp.moveaxis(x, 0, -1), lambda x: np.moveaxis(x, 0, -1)),
    (lambda x: fnp.moveaxis(x, (0, 2), (2, 0)), lambda x: np.moveaxis(x, (0, 2), (2, 0))),
    (lambda x: fnp.swapaxes(x, 0, 2), lambda x: np.swapaxes(x, 0, 2)),
    (lambda x: fnp.expand_dims(x, -1), lambda x: np.expand_dims(x, -1)),
    (lambda x: fnp.expand_dims(x, (0, 2)), lambda x: np.expand_dims(x, (0, 2))),
    (lambda x: fnp.squeeze(fnp.expand_dims(x, 1), 1), lambda x: x),
    (lambda x: fnp.ravel(x), np.ravel),
    (lambda x: fnp.flatten(x, 1), lambda x: x.reshape(2, 12)),
    (lambda x: fnp.flip(x), np.flip), (lambda x: fnp.flip(x, axis=1), lambda x: np.flip(x, 1)),
    (lambda x: fnp.flip(x, axis=(0, -1)), lambda x: np.flip(x, (0, -1))),
    (lambda x: fnp.fliplr(x), np.fliplr), (lambda x: fnp.flipud(x), np.flipud),
    (lambda x: fnp.rot90(x), np.rot90), (lambda x: fnp.rot90(x, 2), lambda x: np.rot90(x, 2)),
    (lambda x: fnp.rot90(x, -1, axes=(1, 2)), lambda x: np.rot90(x, -1, axes=(1, 2))),
    (lambda x: fnp.broadcast_to(x[0], (5, 3, 4)), lambda x: np.broadcast_to(x[0], (5, 3, 4))),
    (lambda x: fnp.concat([x, x], axis=1), lambda x: np.concatenate([x, x], axis=1)),
    (lambda x: fnp.concat([x, x[:1]], axis=None), lambda x: np.concatenate([x, x[:1]], axis=None)),
    (lambda x: fnp.stack([x, x + 1], axis=-1), lambda x: np.stack([x, x + 1], axis=-1)),
    (lambda x: fnp.append(x, x, axis=2), lambda x: np.append(x, x, axis=2)),
    (lambda x: fnp.append(x, 1.0), lambda x: np.append(x, np.float32(1.0))),
], ids=lambda v: "")
def test_movement_matches_numpy(fn, reference):  # type: ignore[no-untyped-def]
    _check_same(fn, reference, _x())


def test_reshape_and_transpose_that_change_nothing_bind_nothing():
    ir = fg.make_ir(lambda x: fnp.transpose(fnp.reshape(x, (2, 3)), (0, 1)))(np.ones((2, 3), np.float32))
    assert len(ir.eqns) == 0


@pytest.mark.parametrize(("shift", "axis"), [(1, None), (-5, None), (2, 0), (-1, 2), (7, 1), ((1, 2), (0, 2)),
                                             ((1, 1), (1, 1)), (3, (0, 1)), (0, 1), (100, None)])
def test_roll_matches_numpy(shift, axis):  # type: ignore[no-untyped-def]
    _check_same(lambda x: fnp.roll(x, shift, axis=axis), lambda x: np.roll(x, shift, axis=axis), _x())


@pytest.mark.parametrize("shift", [-7, -1, 0, 2, 5, 13])
def test_roll_with_a_traced_shift(shift):
    x = _x((5, 3))
    eager, traced = check_both_modes(lambda v, s: fnp.roll(v, s, axis=0), x, shift)
    np.testing.assert_array_equal(traced, np.roll(x, shift, axis=0))
    np.testing.assert_array_equal(eager, np.roll(x, shift, axis=0))
    _, traced_flat = check_both_modes(lambda v, s: fnp.roll(v, s), x, np.array([shift], np.int32))
    np.testing.assert_array_equal(traced_flat, np.roll(x, shift))


@pytest.mark.parametrize("reps", [2, (2, 1), (1, 2, 3), (2, 1, 1, 2), 0, (1, 0)])
def test_tile_matches_numpy(reps):  # type: ignore[no-untyped-def]
    _check_same(lambda x: fnp.tile(x, reps), lambda x: np.tile(x, reps), _x((2, 3)))


@pytest.mark.parametrize(("repeats", "axis"), [(2, None), (3, 0), (2, -1), (0, 1), ([1, 0, 3], 1),
                                               ([2, 1], 0), ([0, 0], 0), (np.array([1, 2, 3, 0]), 2)])
def test_repeat_matches_numpy(repeats, axis):  # type: ignore[no-untyped-def]
    x = _x((2, 3, 4)) if axis in (2, None) else _x((2, 3))
    _check_same(lambda v: fnp.repeat(v, repeats, axis=axis), lambda v: np.repeat(v, repeats, axis=axis), x)


def test_repeat_counts_must_be_concrete():
    with pytest.raises(fg.ConcretizationError):
        fg.make_ir(lambda x, r: fnp.repeat(x, r))(np.ones(3, np.float32), np.array([1, 2, 0], np.int32))
    with pytest.raises(ValueError, match=r"repeats of shape \(2,\).*size 3"):
        fnp.repeat(np.ones(3), [1, 2])
    with pytest.raises(ValueError, match="non-negative"):
        fnp.repeat(np.ones(3), -1)


PAD_CASES = [1, (2, 3), ((1, 2), (0, 3)), ((4, 5), (7, 2)), ((0, 0), (0, 0)), ((3, 0), (0, 9))]


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "symmetric", "wrap"])
@pytest.mark.parametrize("pad_width", PAD_CASES)
def test_pad_modes_match_numpy(mode, pad_width):  # type: ignore[no-untyped-def]
    x = _x((3, 4), "int32")
    _check_same(lambda v: fnp.pad(v, pad_width, mode=mode), lambda v: np.pad(v, pad_width, mode=mode), x)


def test_pad_small_axes_and_constant_values():
    one = _x((1, 2))
    for mode in ("reflect", "symmetric", "wrap", "edge"):
        _check_same(lambda v, mode=mode: fnp.pad(v, 3, mode=mode),
                    lambda v, mode=mode: np.pad(v, 3, mode=mode), one)
    x = _x((2, 3))
    _check_same(lambda v: fnp.pad(v, 1, constant_values=-1.5),
                lambda v: np.pad(v, 1, constant_values=-1.5), x)
    values = ((1, 2), (3, 4))
    _check_same(lambda v: fnp.pad(v, ((1, 2), (2, 1)), constant_values=values),
                lambda v: np.pad(v, ((1, 2), (2, 1)), constant_values=values), x)
    _, traced = check_both_modes(lambda v, c: fnp.pad(v, 1, constant_values=c), x, np.float32(9))
    np.testing.assert_array_equal(traced, np.pad(x, 1, constant_values=9))
    np.testing.assert_array_equal(fnp.pad(x, 1, mode="empty").shape, (4, 5))


def test_pad_bad_input():
    with pytest.raises(ValueError, match="non-negative"):
        fnp.pad(np.ones(3), -1)
    with pytest.raises(ValueError, match=r"pad_width of shape \(3, 2\).*\(2, 2\)"):
        fnp.pad(np.ones((2, 2)), ((1, 1), (1, 1), (1, 1)))
    with pytest.raises(ValueError, match="'linear_ramp' is not supported"):
        fnp.pad(np.ones(3), 1, mode="linear_ramp")
    with pytest.raises(ValueError, match="empty axis 0"):
        fnp.pad(np.ones((0, 2)), 1, mode="reflect")


@pytest.mark.parametrize(("spec", "axis"), [(2, 0), (3, 1), ([1, 3], 1), ([-1], 2), ([0, 10], 1), ([3, 1], 1),
                                            (np.array([2]), 2)])
def test_split_matches_numpy(spec, axis):  # type: ignore[no-untyped-def]
    x = _x((4, 6, 4))
    expected = np.split(x, spec, axis=axis)
    results = fnp.split(x, spec, axis=axis)
    assert len(results) == len(expected)
    for result, ref in zip(results, expected):
        np.testing.assert_array_equal(result.numpy(), ref)
    traced = check_both_modes(lambda v: fnp.split(v, spec, axis=axis), x)[1]
    traced = traced if isinstance(traced, list) else [traced]
    for result, ref in zip(traced, expected):
        np.testing.assert_array_equal(result, ref)


@pytest.mark.parametrize("sections", [1, 3, 4, 7])
def test_array_split_matches_numpy(sections):
    x = _x((7, 2))
    results = fnp.array_split(x, sections)
    expected = np.array_split(x, sections)
    assert [r.shape for r in results] == [e.shape for e in expected]
    for result, ref in zip(results, expected):
        np.testing.assert_array_equal(result.numpy(), ref)


def test_hsplit_vsplit_dsplit_and_unstack():
    x = _x((2, 4, 6))
    for fn, reference in ((fnp.hsplit, np.hsplit), (fnp.vsplit, np.vsplit), (fnp.dsplit, np.dsplit)):
        for result, ref in zip(fn(x, 2), reference(x, 2)):
            np.testing.assert_array_equal(result.numpy(), ref)
    for axis in (0, 1, -1):
        parts = fnp.unstack(x, axis=axis)
        assert isinstance(parts, tuple) and len(parts) == x.shape[axis]
        for i, part in enumerate(parts):
            np.testing.assert_array_equal(part.numpy(), np.take(x, i, axis=axis))


def test_split_bad_input():
    with pytest.raises(ValueError, match=r"size 5 .*\(5,\).*3 equal sections"):
        fnp.split(np.ones(5), 3)
    with pytest.raises(ValueError, match="must be positive"):
        fnp.array_split(np.ones(5), 0)
    with pytest.raises(ValueError, match=r"rank >= 2, got shape \(3,\)"):
        fnp.vsplit(np.ones(3), 1)
    with pytest.raises(ValueError, match="0-d"):
        fnp.unstack(np.float32(1))


@pytest.mark.parametrize("shape", [(), (3,), (2, 3), (2, 3, 4), (1, 2, 3, 4)])
def test_atleast_nd_match_numpy(shape):
    x = _x(shape) if shape else np.float32(5)
    for fn, reference in ((fnp.atleast_1d, np.atleast_1d), (fnp.atleast_2d, np.atleast_2d),
                          (fnp.atleast_3d, np.atleast_3d)):
        np.testing.assert_array_equal(fn(x).numpy(), reference(x))
        assert fn(x).shape == reference(x).shape
    both = fnp.atleast_2d(x, x)
    assert isinstance(both, list) and len(both) == 2


@pytest.mark.parametrize("shapes", [[(3,), (2,)], [(2, 3), (2, 1)], [(), ()], [(2, 1, 3), (2, 2, 3)]])
def test_hstack_matches_numpy(shapes):
    arrays = [_x(s) if s else np.float32(s == ()) for s in shapes]
    np.testing.assert_array_equal(fnp.hstack(arrays).numpy(), np.hstack(arrays))


@pytest.mark.parametrize(("fn", "reference", "shapes"), [
    (fnp.vstack, np.vstack, [(3,), (3,)]), (fnp.vstack, np.vstack, [(2, 3), (1, 3)]),
    (fnp.dstack, np.dstack, [(3,), (3,)]), (fnp.dstack, np.dstack, [(2, 3), (2, 3)]),
    (fnp.column_stack, np.column_stack, [(3,), (3,)]), (fnp.column_stack, np.column_stack, [(3, 2), (3,)]),
])
def test_stacking_helpers_match_numpy(fn, reference, shapes):  # type: ignore[no-untyped-def]
    arrays = [_x(s) for s in shapes]
    _check_same(lambda *a: fn(list(a)), lambda *a: reference(list(a)), *arrays)
    as_one_array = np.stack(arrays) if len({a.shape for a in arrays}) == 1 else arrays  # iterated over axis 0
    np.testing.assert_array_equal(fn(as_one_array).numpy(), reference(arrays))


def test_concat_and_stack_promote_dtypes():
    out = fnp.concat([np.ones(2, np.int8), np.ones(3, np.uint8)])
    assert out.dtype == dtypes.int16 and out.shape == (5,)
    assert fnp.stack([np.ones(2, np.float16), np.ones(2, np.int32)]).dtype == dtypes.float16


# --- bad input -------------------------------------------------------------------------------


def test_bad_axes_name_the_rank():
    x = _x((2, 3))
    for call in (lambda: fnp.flip(x, axis=2), lambda: fnp.roll(x, 1, axis=-3), lambda: fnp.squeeze(x, 5),
                 lambda: fnp.moveaxis(x, 0, 2), lambda: fnp.concat([x, x], axis=2),
                 lambda: fnp.repeat(x, 2, axis=3), lambda: fnp.split(x, 2, axis=4),
                 lambda: fnp.unstack(x, axis=2)):
        with pytest.raises(ValueError, match="out of bounds for an array of rank"):
            call()
    with pytest.raises(ValueError, match="repeated axis"):
        fnp.flip(x, axis=(0, -2))


def test_bad_reshapes_and_concats():
    x = _x((2, 3))
    with pytest.raises(ValueError, match=r"shape \(2, 3\) \(6 elements\) into shape \(4,\)"):
        fnp.reshape(x, (4,))
    with pytest.raises(ValueError, match=r"6 elements into shape \(4, -1\)"):
        fnp.reshape(x, (4, -1))
    with pytest.raises(ValueError, match="only one dimension may be -1"):
        fnp.reshape(x, (-1, -1))
    with pytest.raises(ValueError, match=r"one rank, got shapes \[\(2, 3\), \(3,\)\]"):
        fnp.concat([x, np.ones(3)])
    with pytest.raises(ValueError, match=r"\(2, 3\), \(2, 2\)"):
        fnp.concat([x, np.ones((2, 2))], axis=0)
    with pytest.raises(ValueError, match=r"one shape, got \[\(2, 3\), \(3, 2\)\]"):
        fnp.stack([x, x.T])
    with pytest.raises(ValueError, match="squeeze axis 1 of shape"):
        fnp.squeeze(x, 1)
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(3, 3\)"):
        fnp.broadcast_to(x, (3, 3))
    with pytest.raises(ValueError, match="negative"):
        fnp.tile(x, (-1, 2))
    with pytest.raises(TypeError, match="list or tuple"):
        fnp.concat(x)


# --- properties ------------------------------------------------------------------------------

small_shapes = hnp.array_shapes(min_dims=1, max_dims=4, min_side=0, max_side=4)


@settings(max_examples=30, deadline=None)
@given(shape=small_shapes, data=st.data())
def test_movement_properties_match_numpy(shape, data):  # type: ignore[no-untyped-def]
    x = _x(shape)
    ndim = len(shape)
    permutation = data.draw(st.permutations(range(ndim)))
    axis = data.draw(st.integers(-ndim, ndim - 1))
    shift = data.draw(st.integers(-10, 10))
    reps = tuple(data.draw(st.lists(st.integers(0, 3), min_size=1, max_size=3)))
    repeats = data.draw(st.integers(0, 3))
    width = data.draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 3)), min_size=ndim, max_size=ndim))
    new_shape = data.draw(st.permutations(shape))
    cases = [
        (lambda v: fnp.reshape(v, tuple(new_shape)), lambda v: np.reshape(v, tuple(new_shape))),
        (lambda v: fnp.permute_dims(v, permutation), lambda v: np.transpose(v, permutation)),
        (lambda v: fnp.flip(v, axis=axis), lambda v: np.flip(v, axis)),
        (lambda v: fnp.roll(v, shift, axis=axis), lambda v: np.roll(v, shift, axis)),
        (lambda v: fnp.tile(v, reps), lambda v: np.tile(v, reps)),
        (lambda v: fnp.repeat(v, repeats, axis=axis), lambda v: np.repeat(v, repeats, axis)),
        (lambda v: fnp.concat([v, v], axis=axis), lambda v: np.concatenate([v, v], axis)),
        (lambda v: fnp.stack([v, v], axis=axis), lambda v: np.stack([v, v], axis)),
        (lambda v: fnp.pad(v, width), lambda v: np.pad(v, width)),
    ]
    if 0 not in shape:  # NumPy cannot reflect or wrap an empty axis either
        mode = data.draw(st.sampled_from(["edge", "reflect", "symmetric", "wrap"]))
        cases.append((lambda v: fnp.pad(v, width, mode=mode), lambda v: np.pad(v, width, mode=mode)))
    for fn, reference in cases:
        _check_same(fn, reference, x)


@settings(max_examples=30, deadline=None)
@given(shape=small_shapes, data=st.data())
def test_split_then_concat_round_trips(shape, data):  # type: ignore[no-untyped-def]
    x = _x(shape)
    axis = data.draw(st.integers(0, len(shape) - 1))
    cuts = sorted(data.draw(st.lists(st.integers(0, shape[axis]), max_size=3)))
    pieces = fnp.split(x, cuts, axis=axis)
    assert len(pieces) == len(cuts) + 1
    np.testing.assert_array_equal(fnp.concat(pieces, axis=axis).numpy(), x)
    if shape[axis]:  # stack needs at least one array
        np.testing.assert_array_equal(fnp.stack(fnp.unstack(x, axis=axis), axis=axis).numpy(), x)
