"""What a cold first step no longer does (issue 7): compile kernels for eager zeros/full, ask NumPy for a
dtype's name every time, walk the same expressions again. Each shortcut must give what the long way gave."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad.numpy as fnp
from funcgrad.ir import dtypes
from funcgrad.lower import kernel as K
from funcgrad.lower import plan
from funcgrad.lower.render_loops import substitute

FILLS = [((3, 4), 0.0, np.float32), ((2, 5), -0.0, np.float32), ((7,), float("nan"), np.float64), ((2, 2), 7, np.int8),
         ((4, 1, 3), True, np.bool_), ((), 2.5, np.float16), ((0, 3), 1.0, np.float32), ((3,), 1.5, dtypes.bfloat16)]


def test_eager_fills_are_made_without_a_plan(on_cpu: None) -> None:
    built = plan.PHASE_COUNTS["plans_built"] + plan.PHASE_COUNTS["plans_loaded"]
    tensors = [fnp.full(shape, value, dtype=dtype) for shape, value, dtype in FILLS]
    got = [t.numpy() for t in tensors]
    assert plan.PHASE_COUNTS["plans_built"] + plan.PHASE_COUNTS["plans_loaded"] == built
    assert not any(t._data.array.flags.writeable for t in tensors)  # realized buffers stay immutable
    for array, (shape, value, dtype) in zip(got, FILLS):
        want = np.full(shape, value, dtype=dtype)
        assert array.dtype == want.dtype and array.shape == want.shape
        assert array.tobytes() == want.tobytes()  # bit for bit: -0.0 and NaN included


def test_a_fill_read_by_another_pending_value_still_computes_both(on_cpu: None) -> None:
    zeros = fnp.zeros((4, 3))
    shifted = zeros + np.arange(3, dtype=np.float32)
    from funcgrad.lazy import realize
    realize([zeros._data, shifted._data])
    np.testing.assert_array_equal(zeros.numpy(), np.zeros((4, 3), np.float32))
    np.testing.assert_array_equal(shifted.numpy(), np.tile(np.arange(3, dtype=np.float32), (4, 1)))


@pytest.mark.parametrize("dtype", ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                                   "float16", "float32", "float64", dtypes.bfloat16])
def test_dtype_names_and_classes_are_numpys(dtype: object) -> None:
    expected = np.dtype(dtype).name
    for spelling in (dtype, np.dtype(dtype)):
        assert K.dtype_name(spelling) == expected
        assert K.dtype_class(spelling) == K.dtype_class(np.dtype(dtype))
    assert K.dtype_class(np.dtype(dtype)) == ("b" if expected == "bool" else "h" if expected in K.LOW_PRECISION
                                              else {"i": "s", "u": "u", "f": "f"}[np.dtype(dtype).kind])


def index_expressions() -> st.SearchStrategy[K.KExpr]:
    leaves = st.one_of(st.sampled_from([K.var("g0"), K.var("g1"), K.var("r0")]),
                       st.integers(-5, 40).map(lambda n: K.const(n, K.INDEX)))
    return st.recursive(leaves, lambda inner: st.tuples(st.sampled_from(["add", "sub", "mul", "div", "rem"]), inner,
                                                         inner).map(lambda t: K.KExpr(t[0], K.INDEX, (t[1], t[2]))),
                        max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(index_expressions(), st.sampled_from(["g0", "g1", "r0"]), st.integers(1, 17))
def test_memoised_simplification_and_substitution_equal_a_fresh_walk(e: K.KExpr, name: str, offset: int) -> None:
    bounds = {"g0": 6, "g1": 9, "r0": 4}
    first = K.simplify_index(e, bounds)
    K._AFFINE.clear()
    K._BUILT.clear()
    assert K.simplify_index(e, bounds) == first  # the memos only remember, they do not decide
    assert substitute(e, name, offset) == substitute(e, name, offset, {})
