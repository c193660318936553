"""Every primitive has a shape rule and a NumPy reference implementation that agree.

Each primitive needs a sample invocation below; adding a primitive without one fails
``test_every_primitive_has_a_sample``. Later issues extend the walk to jvp, transpose, batching and
lowering rules.
"""

from __future__ import annotations

import numpy as np
import pytest

from funcgrad.ir import dtypes
from funcgrad.ir.core import ShapedArray
from funcgrad.ir.primitives import REGISTRY, Primitive

f32 = np.array([[0.5, -1.5, 2.0], [0.25, 3.0, -0.75]], np.float32)
positive = np.abs(f32) + 0.5
unit = np.clip(f32 / 4, -0.9, 0.9)
i32 = np.array([[3, -7, 2], [0, 5, -1]], np.int32)
u32 = np.array([1, 2, 3], np.uint32)
boolean = np.array([[True, False, True], [False, False, True]])

_UNARY_FLOAT = ["exp", "log", "exp2", "log2", "expm1", "log1p", "sin", "cos", "tan", "asin", "acos",
                "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "logistic", "erf",
                "floor", "ceil", "round", "is_finite", "neg", "abs", "sign"]
_BINARY = ["add", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2",
           "eq", "ne", "lt", "le", "gt", "ge"]

SAMPLES: dict[str, tuple[tuple, dict]] = {name: ((positive,), {}) for name in _UNARY_FLOAT}
SAMPLES.update({"asin": ((unit,), {}), "acos": ((unit,), {}), "atanh": ((unit,), {}),
                "acosh": ((positive + 1,), {})})
SAMPLES.update({name: ((f32, positive), {}) for name in _BINARY})
SAMPLES.update({
    "not": ((boolean,), {}),
    "and": ((i32, i32), {}), "or": ((boolean, boolean), {}), "xor": ((i32, i32), {}),
    "shift_left": ((u32, np.uint32(3)), {}), "shift_right": ((i32, np.full_like(i32, 1)), {}),
    "select": ((boolean, f32, positive), {}),
    "convert_element_type": ((f32,), {"new_dtype": dtypes.int32}),
    "bitcast_convert_type": ((f32,), {"new_dtype": dtypes.uint32}),
    "reduce_sum": ((f32,), {"axes": (1,)}), "reduce_prod": ((f32,), {"axes": (0, 1)}),
    "reduce_max": ((f32,), {"axes": (0,)}), "reduce_min": ((i32,), {"axes": (1,)}),
    "argmax": ((f32,), {"axis": 1, "index_dtype": dtypes.int32}),
    "argmin": ((f32,), {"axis": 0, "index_dtype": dtypes.int32}),
    "cumsum": ((f32,), {"axis": 1, "reverse": False}), "cumprod": ((f32,), {"axis": 0, "reverse": True}),
    "cummax": ((i32,), {"axis": 1, "reverse": False}), "cummin": ((f32,), {"axis": 1, "reverse": True}),
    "reshape": ((f32,), {"new_sizes": (3, 2)}),
    "broadcast_in_dim": ((f32[0],), {"shape": (4, 3), "broadcast_dimensions": (1,)}),
    "transpose": ((f32,), {"permutation": (1, 0)}),
    "pad": ((f32, np.float32(0)), {"low": (1, 0), "high": (0, 2)}),
    "slice": ((f32,), {"start": (0, 1), "limit": (2, 3), "strides": (1, 2)}),
    "flip": ((f32,), {"axes": (1,)}),
    "concatenate": ((f32, positive), {"axis": 0}),
    "dynamic_slice": ((f32, np.int32(1), np.int32(5)), {"slice_sizes": (1, 2)}),
    "dynamic_update_slice": ((f32, np.ones((1, 2), np.float32), np.int32(0), np.int32(1)), {}),
    "gather": ((f32, np.array([[1, 2], [0, 0]], np.int32)), {"axes": (0, 1)}),
    "scatter": ((f32, np.array([[1], [0]], np.int32), np.ones((2, 3), np.float32)),
                {"axes": (0,), "mode": "add"}),
    "iota": ((), {"dtype": dtypes.int32, "shape": (2, 3), "dimension": 1}),
    "dot_general": ((f32, positive), {"contracting": ((1,), (1,)), "batch": ((), ())}),
    "conv_general_dilated": ((f32.reshape(1, 2, 3), positive.reshape(1, 2, 3)[:, :, :2]),
                             {"window_strides": (1,), "padding": ((1, 0),), "lhs_dilation": (1,),
                              "rhs_dilation": (1,), "feature_group_count": 1}),
    "sort": ((f32, i32), {"dimension": 1, "num_keys": 1, "descending": False}),
    "threefry2x32": ((np.uint32(1), np.uint32(2), u32, u32), {}),
    "real": ((f32 + 1j * positive,), {}), "imag": ((f32 + 1j * positive,), {}),
    "conj": (((f32 + 1j * positive).astype(np.complex64),), {}), "complex": ((f32, positive), {}),
    "fft": (((f32 - 1j * positive).astype(np.complex64),), {"fft_type": "fft", "fft_lengths": (3,)}),
})
_square = np.array([[2.0, 0.5, -0.25], [0.5, 3.0, 0.0], [-0.25, 0.0, 1.5]], np.float32)
SAMPLES.update({
    "cholesky": ((_square,), {}), "solve": ((_square, f32.T.copy()), {"transpose_a": True}),
    "slogdet": ((np.stack([_square, -_square]),), {}), "eigh": ((_square,), {}),
    "qr": ((f32,), {"full_matrices": False}), "svd": ((f32.T.copy(),), {"full_matrices": True, "compute_uv": True}),
})


def _sub_ir(fn, *avals):
    """An open IR of ``fn`` traced on zeros of ``avals`` (for higher-order samples)."""
    import funcgrad as fg
    from funcgrad.ir.higher_order import open_ir
    return open_ir(fg.make_ir(fn)(*[np.zeros(a.shape, a.dtype) for a in avals]))


_F = ShapedArray((3,), dtypes.float32)
_S = ShapedArray((), dtypes.float32)
_B = ShapedArray((), dtypes.bool_)
_vec = np.array([1.0, -2.0, 0.5], np.float32)
SAMPLES.update({
    "stop_gradient": ((f32,), {}),
    "name": ((f32,), {"name": "a"}),
    "jit": ((_vec,), {"ir": _sub_ir(lambda x: x * 2, _F), "name": "double"}),
    "checkpoint": ((_vec,), {"ir": _sub_ir(lambda x: x * 2, _F), "name": "double"}),
    "custom_jvp_call": ((_vec,), {"ir": _sub_ir(lambda x: x * 2, _F), "jvp": None,
                                  "num_consts": 0, "name": "f"}),
    "custom_vjp_call": ((_vec,), {"ir": _sub_ir(lambda x: x * 2, _F), "fwd": None, "bwd": None,
                                  "num_consts": 0, "name": "f"}),
    "custom_lin": ((_vec, _vec), {"num_residuals": 1, "bwd": None, "out_avals": (_F,)}),
    "cond": ((np.int32(1), _vec), {"branches": (_sub_ir(lambda x: x * 2, _F), _sub_ir(lambda x: -x, _F))}),
    "while": ((np.float32(1.0),), {"cond_ir": _sub_ir(lambda x: x < 10, _S),
                                   "body_ir": _sub_ir(lambda x: x * 3, _S),
                                   "cond_nconsts": 0, "body_nconsts": 0}),
    "scan": ((np.float32(0.0), _vec), {"body": _sub_ir(lambda c, x: (c + x, c * x), _S, _S), "length": 3,
                                       "reverse": False, "num_consts": 0, "num_carry": 1}),
})
SAMPLES.update({
    "psum": ((_vec,), {"axis_name": "i"}), "pmax": ((_vec,), {"axis_name": "i"}),
    "pmin": ((_vec,), {"axis_name": "i"}),
    "all_gather": ((_vec,), {"axis_name": "i", "axis": 0, "tiled": False, "axis_size": 2}),
    "psum_scatter": ((f32,), {"axis_name": "i", "scatter_dimension": 0, "tiled": False, "axis_size": 2}),
    "ppermute": ((_vec,), {"axis_name": "i", "perm": ((0, 1), (1, 0)), "axis_size": 2}),
    "axis_index": ((), {"axis_name": "i"}),
    # one process (the local engine): the identity, or its one-rank meaning
    "process_allreduce": ((_vec,), {"op": "sum"}), "process_allgather": ((_vec,), {"process_count": 1}),
    "process_reduce_scatter": ((f32,), {"op": "max", "process_count": 1}),
    "process_ppermute": ((_vec,), {"perm": ((0, 0),)}),
})
# only its transpose (the user's bwd) is ever evaluated; a named-axis collective means something only
# under the vmap/pmap binding its name (which rewrites it)
IMPL_RAISES = {"custom_lin": (TypeError, "forward-mode")}
IMPL_RAISES.update({name: (NameError, "outside the vmap/pmap") for name in
                    ("psum", "pmax", "pmin", "all_gather", "psum_scatter", "ppermute", "axis_index")})


def test_every_primitive_has_a_sample():
    assert set(SAMPLES) == set(REGISTRY), (
        f"primitives without a sample: {sorted(set(REGISTRY) - set(SAMPLES))}; "
        f"samples without a primitive: {sorted(set(SAMPLES) - set(REGISTRY))}")


@pytest.mark.parametrize("name", sorted(REGISTRY))
def test_shape_rule_and_reference_impl_agree(name):
    primitive = REGISTRY[name]
    assert isinstance(primitive, Primitive) and primitive.name == name
    assert callable(primitive.shape_rule) and callable(primitive.impl)
    operands, params = SAMPLES[name]
    avals = [ShapedArray(np.shape(x), np.asarray(x).dtype) for x in operands]
    expected = primitive.abstract_eval(*avals, **params)
    expected = expected if primitive.multiple_results else (expected,)
    if name in IMPL_RAISES:
        error, message = IMPL_RAISES[name]
        with pytest.raises(error, match=message):
            primitive.impl(*operands, **params)
        return
    with np.errstate(all="ignore"):
        results = primitive.impl(*operands, **params)
    results = results if primitive.multiple_results else (results,)
    assert len(results) == len(expected)
    for result, aval in zip(results, expected):
        result = np.asarray(result)
        assert (result.shape, result.dtype) == (aval.shape, aval.dtype)


def test_primitives_pickle_by_name():
    import pickle
    for primitive in REGISTRY.values():
        assert pickle.loads(pickle.dumps(primitive)) is primitive


def test_registering_a_duplicate_name_fails():
    with pytest.raises(ValueError, match="already registered"):
        Primitive("add", lambda x: x, lambda x: x)


def test_every_primitive_has_jvp_and_batching_rules():
    import funcgrad  # noqa: F401  (registers the transformation rules)
    from funcgrad.transforms.batching import batch_rules
    from funcgrad.transforms.jvp import jvp_rules
    assert not [n for n, p in REGISTRY.items() if p not in jvp_rules], "primitives without a jvp rule"
    assert not [n for n, p in REGISTRY.items() if p not in batch_rules], "primitives without a batching rule"


HIGHER_ORDER_TRANSPOSABLE = {"jit", "cond", "scan", "while", "checkpoint", "custom_lin"}


def test_higher_order_primitives_have_transpose_and_partial_eval_rules():
    import funcgrad  # noqa: F401
    from funcgrad.transforms.partial_eval import pe_rules
    from funcgrad.transforms.transpose import transpose_rules
    missing = [n for n in HIGHER_ORDER_TRANSPOSABLE if REGISTRY[n] not in transpose_rules]
    assert not missing, f"higher-order primitives without a transpose rule: {missing}"
    # splitting their bodies keeps them one call on each side of a gradient
    assert {p.name for p in pe_rules} == {"jit", "cond", "scan", "checkpoint"}
