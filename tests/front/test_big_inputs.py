"""Sizes near the limits: arange past int32, shapes too large to address, concatenations of thousands
of arrays (eager and under jit). Each was a silent wrong result or a RecursionError once."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.lower import schedule


@pytest.mark.parametrize("call", [lambda: fnp.arange(10**12), lambda: fnp.arange(3 * 10**9),
                                  lambda: fnp.arange(2**31, 2**31 + 3), lambda: fnp.arange(0, 2**32, 2**30)])
def test_arange_past_int32_raises_instead_of_wrapping(call) -> None:
    with pytest.raises(OverflowError, match=r"arange: \d+ values from -?\d+ to \d+ do not fit in int32 .*"
                                            r"pass dtype='int64'"):
        call()


def test_arange_at_the_int32_edge_and_in_int64_is_exact() -> None:
    np.testing.assert_array_equal(fnp.arange(2**31 - 3, 2**31).numpy(), np.arange(2**31 - 3, 2**31, dtype=np.int32))
    np.testing.assert_array_equal(fnp.arange(-2**31, -2**31 + 2).numpy(), [-2**31, -2**31 + 1])
    np.testing.assert_array_equal(fnp.arange(2**31, 2**31 + 3, dtype="int64").numpy(),
                                  np.arange(2**31, 2**31 + 3, dtype=np.int64))
    np.testing.assert_array_equal(fnp.arange(5, -3, -3, dtype="int8").numpy(), np.arange(5, -3, -3, dtype=np.int8))
    with pytest.raises(OverflowError, match="do not fit in int8"):
        fnp.arange(0, 200, dtype="int8")


@pytest.mark.parametrize("call, name", [(lambda: fnp.ones(10**20), "ones"),
                                        (lambda: fnp.zeros((2**31, 2**31)), "zeros"),
                                        (lambda: fnp.full((2**40, 2**30), 1.5), "full"),
                                        (lambda: fnp.empty((2**62, 2)), "empty"),
                                        (lambda: fnp.linspace(0, 1, 10**20), "linspace"),
                                        (lambda: fnp.eye(10**10), "eye"),
                                        (lambda: fnp.broadcast_to(fnp.ones(1), (2**40, 2**40)), "broadcast_to"),
                                        (lambda: fg.Tensor.ones(10**20), "ones")])
def test_unaddressable_shapes_fail_at_creation(call, name) -> None:
    with pytest.raises(ValueError, match=rf"^{name}: shape \(.*\) of \w+ holds \d+ elements \(\d+ bytes\), more than "
                                         r"the 9223372036854775807 bytes an array can address$"):
        call()


def test_random_draws_beyond_the_counter_range_fail_clearly() -> None:
    with pytest.raises(ValueError, match=r"^normal: shape \(1000000, 1000000\) has 1000000000000 elements, more than "
                                         r"the 2147483648 one draw can make"):
        fg.random.normal(fg.random.key(0), (10**6, 10**6))


def _pieces(count: int) -> list[np.ndarray]:
    return [np.full((1, 2), i, np.float32) + np.array([0, 0.5], np.float32) for i in range(count)]


@pytest.mark.parametrize("count", [schedule.WIDE_CONCATENATE + 1, 1100])
def test_concatenate_of_thousands_of_arrays(count: int) -> None:
    pieces = _pieces(count)
    np.testing.assert_array_equal(fnp.concatenate([fnp.asarray(p) for p in pieces]).numpy(),
                                  np.concatenate(pieces))
    np.testing.assert_array_equal(fnp.stack([fnp.asarray(p[0]) for p in pieces], axis=1).numpy(),
                                  np.stack([p[0] for p in pieces], axis=1))


def test_concatenate_of_thousands_under_jit_and_grad() -> None:
    pieces = _pieces(1100)
    joined = fg.jit(lambda xs: fnp.concatenate([x * 2 for x in xs], axis=1))([fnp.asarray(p) for p in pieces])
    np.testing.assert_array_equal(joined.numpy(), np.concatenate(pieces, axis=1) * 2)
    grads = fg.grad(lambda xs: (fnp.stack(xs) * fnp.arange(len(xs), dtype="float32")[:, None, None]).sum())(
        [fnp.asarray(p) for p in pieces[:300]])
    np.testing.assert_array_equal(np.stack([g.numpy() for g in grads])[:, 0, 0], np.arange(300, dtype=np.float32))


def test_wide_concatenates_are_split_into_stored_groups() -> None:
    ir = fg.make_ir(lambda xs: fnp.concatenate(xs))([fnp.ones(1)] * 200)
    split, groups = schedule.split_wide_concatenates(ir)
    widths = [len(e.inputs) for e in split.eqns if e.primitive.name == "concatenate"]
    assert max(widths) <= schedule.WIDE_CONCATENATE and len(groups) == 4 and sum(widths) == 200 + 4
