"""The jvp and transpose rules of the first-order primitives (funcgrad/transforms/ad_rules.py).

Each float-differentiable primitive is driven through ``bind`` on float64 inputs and checked
three ways: (1) ``jvp`` against central finite differences, (2) ``vjp`` against ``jvp``
(``<vjp(ct), t> == <ct, jvp(t)>``, which tests every transpose rule), (3) second order: the jvp of
the gradient (forward over reverse) and the gradient of a gradient (reverse over reverse) against
finite differences of the gradient. Hypothesis varies shapes for the elementwise, reduction and
movement primitives; fixed cases cover indices that are out of range or duplicated, zeros in
products, ties, and literal or rank-0 operands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
from funcgrad.core.tensor import bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.primitives import REGISTRY
from funcgrad.transforms.jvp import jvp_rules
from funcgrad.transforms.transpose import transpose_rules

FIRST_ORDER = sorted(p.name for p in vars(P).values() if isinstance(p, P.Primitive) and p.name != "jit")
LINEAR = ["add", "sub", "neg", "mul", "div", "convert_element_type", "reduce_sum", "reshape",
          "broadcast_in_dim", "transpose", "pad", "slice", "flip", "concatenate", "select", "dynamic_slice",
          "dynamic_update_slice", "gather", "scatter", "cumsum", "dot_general", "conv_general_dilated",
          "solve", "real", "imag", "conj", "complex", "fft"]
NOT_LINEAR = ["cholesky", "slogdet", "eigh", "qr", "svd",
              "reduce_prod", "reduce_max", "reduce_min", "cumprod", "cummax", "cummin", "sort", "exp", "pow"]


class Const:
    """Marks a float operand that is held constant (not differentiated)."""

    def __init__(self, value: Any) -> None:
        self.value = value


def _is_diff(operand: Any) -> bool:
    return isinstance(operand, np.ndarray) and operand.dtype.kind == "f"


def _as_operand(operand: Any) -> Any:
    """Constants for bind: arrays become Tensors (keeping their dtype), NumPy scalars stay literals."""
    value = operand.value if isinstance(operand, Const) else operand
    if isinstance(value, np.ndarray):
        return fg.Tensor(value, dtype=value.dtype)
    return value


def bound(name: str, operands: list[Any],
          params: dict[str, Any]) -> tuple[Callable[..., Any], list[np.ndarray]]:
    """``fn(*differentiable operands)`` binding primitive ``name``, and those operands' values.
    Multiple results are returned as a tuple of the floating-point ones."""
    primitive = REGISTRY[name]
    positions = [i for i, x in enumerate(operands) if _is_diff(x)]
    fixed = [_as_operand(x) for x in operands]

    def fn(*diff: Any) -> Any:
        args = list(fixed)
        for i, value in zip(positions, diff):
            args[i] = value
        out = bind(primitive, *args, **params)
        if primitive.multiple_results:
            return tuple(o for o in out if dtypes.is_float(o.dtype))
        return out

    return fn, [operands[i] for i in positions]


def _leaves(value: Any) -> list[np.ndarray]:
    leaves = fg.tree.leaves(value)
    return [np.asarray(v.numpy() if isinstance(v, fg.Tensor) else v, np.float64) for v in leaves]


def _tensors(arrays: list[np.ndarray]) -> list[fg.Tensor]:
    return [fg.Tensor(a, dtype="float64") for a in arrays]


def _inner(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    return float(sum(np.sum(x * y) for x, y in zip(a, b)))


def _finite_difference(fn: Callable[..., Any], xs: list[np.ndarray], ts: list[np.ndarray],
                       step: float = 1e-6) -> list[np.ndarray]:
    plus = _leaves(fn(*_tensors([x + step * t for x, t in zip(xs, ts)])))
    minus = _leaves(fn(*_tensors([x - step * t for x, t in zip(xs, ts)])))
    return [(p - m) / (2 * step) for p, m in zip(plus, minus)]


def check_first_order(fn: Callable[..., Any], xs: list[np.ndarray], seed: int = 0,
                      rtol: float = 1e-6, atol: float = 1e-6, step: float = 1e-6,
                      vjp_rtol: float = 1e-10) -> None:
    """jvp against central differences; vjp against jvp."""
    rng = np.random.default_rng(seed)
    ts = [rng.normal(size=x.shape) for x in xs]
    primals = _tensors(xs)
    out, tangent = fg.jvp(fn, tuple(primals), tuple(_tensors(ts)))
    tangents = _leaves(tangent)
    for got, expected in zip(tangents, _finite_difference(fn, xs, ts, step)):
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)
    np.testing.assert_allclose(_leaves(out)[0], _leaves(fn(*primals))[0], rtol=1e-15)

    value, pullback = fg.vjp(fn, *primals)
    cts = [rng.normal(size=o.shape) for o in _leaves(value)]
    ct_tree = fg.tree.unflatten(fg.tree.structure(value), _tensors(cts))
    cts_in = _leaves(pullback(ct_tree))
    for ct, x in zip(cts_in, xs):
        assert ct.shape == x.shape
    np.testing.assert_allclose(_inner(cts_in, ts), _inner(cts, tangents), rtol=vjp_rtol, atol=vjp_rtol)


def check_second_order(fn: Callable[..., Any], xs: list[np.ndarray], seed: int = 1,
                       rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """For g = <fn(x), w>: jvp(grad g) and grad(<grad g, t>) both equal the Hessian-vector product,
    checked against central differences of grad g."""
    rng = np.random.default_rng(seed)
    weights = _tensors([rng.normal(size=o.shape) for o in _leaves(fn(*_tensors(xs)))])
    argnums = tuple(range(len(xs)))

    def scalar(*args: Any) -> Any:
        return sum((o * w).sum() for o, w in zip(fg.tree.leaves(fn(*args)), weights))

    gradient = fg.grad(scalar, argnums=argnums)
    ts = [rng.normal(size=x.shape) for x in xs]
    expected = _finite_difference(gradient, xs, ts)
    _, forward_over_reverse = fg.jvp(gradient, tuple(_tensors(xs)), tuple(_tensors(ts)))
    directions = _tensors(ts)
    def along_directions(*args: Any) -> Any:
        return sum((g * t).sum() for g, t in zip(gradient(*args), directions))

    reverse_over_reverse = fg.grad(along_directions, argnums=argnums)(*_tensors(xs))
    for got in (_leaves(forward_over_reverse), _leaves(reverse_over_reverse)):
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)


# --- cases: float64 invocations of every differentiable primitive -------------------------------

_rng = np.random.default_rng(42)  # the fixed cases; hypothesis tests seed their own generator


def _uniform(low: float, high: float, shape: tuple[int, ...] = (2, 3), rng: Any = None) -> np.ndarray:
    return np.asarray((rng or _rng).uniform(low, high, shape), np.float64)


def _away_from_zero(shape: tuple[int, ...] = (2, 3), rng: Any = None) -> np.ndarray:
    rng = rng or _rng
    return np.asarray(rng.choice([-1.0, 1.0], shape) * rng.uniform(0.3, 2.0, shape), np.float64)


# input ranges away from singularities and non-differentiable points: (low, high)
DOMAINS: dict[str, tuple[float, float]] = {
    "log": (0.5, 2), "log2": (0.5, 2), "sqrt": (0.5, 2), "rsqrt": (0.5, 2), "log1p": (-0.5, 2),
    "asin": (-0.8, 0.8), "acos": (-0.8, 0.8), "atanh": (-0.8, 0.8), "acosh": (1.2, 3), "tan": (-1.2, 1.2),
}
UNARY = ["neg", "abs", "sign", "exp", "log", "exp2", "log2", "expm1", "log1p", "sin", "cos", "tan", "asin",
         "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "logistic",
         "erf", "floor", "ceil", "round"]
BINARY = ["add", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2"]


def _unary_input(name: str, shape: tuple[int, ...], rng: Any = None) -> np.ndarray:
    if name == "abs":
        return _away_from_zero(shape, rng)
    if name in ("floor", "ceil", "round"):  # keep finite differences off the jumps (at k and k + 1/2)
        return np.asarray(np.round(_uniform(-2, 2, shape, rng) * 2) / 2 + 0.25, np.float64)
    return _uniform(*DOMAINS.get(name, (-2, 2)), shape, rng)


def _binary_inputs(name: str, shape_x: tuple[int, ...], shape_y: tuple[int, ...],
                   rng: Any = None) -> list[np.ndarray]:
    if name == "pow":
        return [_uniform(0.5, 2, shape_x, rng), _uniform(-1.5, 1.5, shape_y, rng)]
    if name == "rem":
        return [_uniform(0.5, 5, shape_x, rng), _uniform(0.7, 1.3, shape_y, rng)]
    if name == "div":
        return [_uniform(-2, 2, shape_x, rng), _away_from_zero(shape_y, rng)]
    return [_uniform(-2, 2, shape_x, rng), _uniform(-2, 2, shape_y, rng)]


def _i32(values: Any) -> np.ndarray:
    return np.array(values, np.int32)


f = _uniform(-2, 2)
CASES: dict[str, tuple[str, list[Any], dict[str, Any]]] = {}
CASES.update({name: (name, [_unary_input(name, (2, 3))], {}) for name in UNARY})
CASES.update({name: (name, _binary_inputs(name, (2, 3), (2, 3)), {}) for name in BINARY})
CASES["name"] = ("name", [_unary_input("neg", (2, 3))], {"name": "a"})  # checkpoint_name: the identity
CASES.update({
    "mul_literal": ("mul", [_uniform(-2, 2), np.float64(3.0)], {}),
    "pow_literal_exponent": ("pow", [_uniform(0.5, 2), np.float64(2.5)], {}),
    "add_rank0": ("add", [_uniform(-2, 2), _uniform(-2, 2, ())], {}),
    "div_rank0_numerator": ("div", [_uniform(-2, 2, ()), _away_from_zero()], {}),
    "max_rank0": ("max", [_uniform(-2, 2, ()), _uniform(-2, 2)], {}),
    "select": ("select", [_rng.random((2, 3)) > 0.5, _uniform(-2, 2), _uniform(-2, 2)], {}),
    "select_rank0_branch": ("select", [_rng.random((2, 3)) > 0.5, _uniform(-2, 2, ()), _uniform(-2, 2)], {}),
    "convert_element_type": ("convert_element_type", [_uniform(-2, 2)], {"new_dtype": dtypes.float64}),
    "reduce_sum": ("reduce_sum", [_uniform(-2, 2, (2, 3, 4))], {"axes": (0, 2)}),
    "reduce_prod": ("reduce_prod", [_uniform(0.5, 1.5, (2, 3, 5))], {"axes": (0, 2)}),
    "reduce_prod_zeros": ("reduce_prod", [np.array([[0.0, 1.5, 2.0, -1.2, 0.7], [0.0, 0.0, 2.0, 1.1, 0.9]])],
                          {"axes": (1,)}),
    "reduce_max": ("reduce_max", [_uniform(-2, 2, (3, 4))], {"axes": (1,)}),
    "reduce_min": ("reduce_min", [_uniform(-2, 2, (3, 4))], {"axes": (0, 1)}),
    "cumsum": ("cumsum", [_uniform(-2, 2, (3, 5))], {"axis": 1, "reverse": True}),
    "cumprod": ("cumprod", [_uniform(0.5, 1.5, (3, 5))], {"axis": 1, "reverse": False}),
    "cumprod_zeros_reverse": ("cumprod", [np.array([[1.5, 0.0, 2.0, -1.0, 0.5, 0.0, 1.2]])],
                              {"axis": 1, "reverse": True}),
    "cummax": ("cummax", [_uniform(-2, 2, (3, 6))], {"axis": 1, "reverse": False}),
    "cummax_reverse": ("cummax", [_uniform(-2, 2, (6, 2))], {"axis": 0, "reverse": True}),
    "cummin": ("cummin", [_uniform(-2, 2, (3, 6))], {"axis": 1, "reverse": False}),
    "cummin_reverse": ("cummin", [_uniform(-2, 2, (3, 6))], {"axis": 1, "reverse": True}),
    "reshape": ("reshape", [f], {"new_sizes": (3, 2)}),
    "broadcast_in_dim": ("broadcast_in_dim", [_uniform(-2, 2, (3, 1))],
                         {"shape": (2, 3, 4), "broadcast_dimensions": (1, 2)}),
    "transpose": ("transpose", [_uniform(-2, 2, (2, 3, 4))], {"permutation": (2, 0, 1)}),
    "pad": ("pad", [f, _uniform(-1, 1, ())], {"low": (1, 0), "high": (0, 2)}),
    "pad_literal_value": ("pad", [f, np.float64(0.5)], {"low": (0, 2), "high": (1, 1)}),
    "slice": ("slice", [_uniform(-2, 2, (5, 7))], {"start": (1, 0), "limit": (5, 7), "strides": (2, 3)}),
    "flip": ("flip", [_uniform(-2, 2, (2, 3, 4))], {"axes": (0, 2)}),
    "concatenate": ("concatenate", [f, Const(_uniform(-2, 2, (1, 3))), _uniform(-2, 2, (3, 3))], {"axis": 0}),
    "dynamic_slice": ("dynamic_slice", [_uniform(-2, 2, (4, 5)), np.int32(1), _i32(9)],  # 9 clamps
                      {"slice_sizes": (2, 3)}),
    "dynamic_update_slice": ("dynamic_update_slice", [_uniform(-2, 2, (4, 5)), _uniform(-2, 2, (2, 3)),
                                                      np.int32(3), _i32(-1)], {}),
    "gather": ("gather", [_uniform(-2, 2, (4, 3)), _i32([[1], [3], [1], [7], [-2]])], {"axes": (0,)}),
    "gather_two_axes": ("gather", [_uniform(-2, 2, (3, 2, 4)), _i32([[[0, 3], [2, 1]], [[2, 3], [0, 0]]])],
                        {"axes": (0, 2)}),
    "dot_general": ("dot_general", [_uniform(-2, 2, (2, 3)), _uniform(-2, 2, (3, 4))],
                    {"contracting": ((1,), (0,)), "batch": ((), ())}),
    "dot_general_permuted": ("dot_general", [_uniform(-2, 2, (2, 3, 4)), _uniform(-2, 2, (4, 3, 5))],
                             {"contracting": ((1, 2), (1, 0)), "batch": ((), ())}),
    "dot_general_batch": ("dot_general", [_uniform(-2, 2, (3, 2, 4)), _uniform(-2, 2, (4, 5, 2))],
                          {"contracting": ((2,), (0,)), "batch": ((1,), (2,))}),
    "dot_general_outer": ("dot_general", [_uniform(-2, 2, (2,)), _uniform(-2, 2, (3,))],
                          {"contracting": ((), ()), "batch": ((), ())}),
    "conv_general_dilated": ("conv_general_dilated", [_uniform(-2, 2, (1, 4, 5)), _uniform(-2, 2, (4, 2, 2))],
                             {"window_strides": (2,), "padding": ((1, 0),), "lhs_dilation": (2,),
                              "rhs_dilation": (1,), "feature_group_count": 2}),
    "sort": ("sort", [_uniform(-2, 2, (3, 5)), _uniform(-2, 2, (3, 5))],
             {"dimension": 1, "num_keys": 1, "descending": False}),
    # the first key has ties (held constant: moving it would reorder), broken by the second key
    "sort_descending_two_keys": ("sort", [Const(_rng.integers(0, 2, (6, 2)).astype(np.float64)),
                                          _uniform(-2, 2, (6, 2))],
                                 {"dimension": 0, "num_keys": 2, "descending": True}),
})
# scatter: duplicate rows (1 twice) and an out-of-range row (5) that must be dropped
_SCATTER_INDICES = _i32([[1], [0], [1], [5]])
for _mode in ("add", "set", "max", "min"):
    CASES[f"scatter_{_mode}"] = ("scatter", [_uniform(-2, 2, (3, 2)), _SCATTER_INDICES,
                                             _uniform(-2, 2, (4, 2))], {"axes": (0,), "mode": _mode})
CASES["scatter_mul"] = ("scatter", [_uniform(-2, 2, (3, 2)), _SCATTER_INDICES, _uniform(0.5, 1.5, (4, 2))],
                        {"axes": (0,), "mode": "mul"})
# one zero update at a position shared with another update: the product of the others is nonzero
CASES["scatter_mul_zero_update"] = ("scatter", [_uniform(-2, 2, (3, 2)), _SCATTER_INDICES,
                                                np.array([[0.0, 1.2], [0.8, 1.1], [1.3, 0.9], [0.6, 0.0]])],
                                    {"axes": (0,), "mode": "mul"})
_TWO_AXIS_INDICES = _i32([[0, 3], [2, 1], [0, 3], [-1, 0]])
CASES["scatter_set_two_axes"] = ("scatter", [_uniform(-2, 2, (3, 2, 4)), _TWO_AXIS_INDICES,
                                             _uniform(-2, 2, (4, 2))], {"axes": (0, 2), "mode": "set"})

def _well_conditioned(shape: tuple[int, ...]) -> np.ndarray:
    """Random matrices plus a multiple of the identity: far from singular, distinct singular values."""
    return _uniform(-1, 1, shape) + 3 * np.eye(shape[-1])


def _symmetric_positive_definite(shape: tuple[int, ...]) -> np.ndarray:
    a = _uniform(-1, 1, shape)
    return a @ np.swapaxes(a, -1, -2) + np.diag(np.arange(1.0, shape[-1] + 1)) + np.eye(shape[-1])


CASES.update({  # linear algebra (host steps): matrices in the last two axes, batch axes carried along
    "cholesky": ("cholesky", [_symmetric_positive_definite((2, 3, 3))], {}),
    "solve": ("solve", [_well_conditioned((3, 3)), _uniform(-2, 2, (3, 2))], {"transpose_a": False}),
    "solve_transposed": ("solve", [_well_conditioned((2, 3, 3)), _uniform(-2, 2, (2, 3, 1))],
                         {"transpose_a": True}),
    "slogdet": ("slogdet", [_well_conditioned((2, 3, 3))], {}),
    "eigh": ("eigh", [_symmetric_positive_definite((3, 3))], {}),
    "qr_tall": ("qr", [_uniform(-2, 2, (4, 3))], {"full_matrices": False}),
    "qr_wide": ("qr", [_uniform(-2, 2, (2, 3, 4))], {"full_matrices": False}),
    "qr_square_complete": ("qr", [_well_conditioned((3, 3))], {"full_matrices": True}),
    "svd_tall": ("svd", [_uniform(-2, 2, (4, 3))], {"full_matrices": False, "compute_uv": True}),
    "svd_wide": ("svd", [_uniform(-2, 2, (3, 4))], {"full_matrices": False, "compute_uv": True}),
    "svd_values": ("svd", [_uniform(-2, 2, (2, 4, 3))], {"full_matrices": False, "compute_uv": False}),
})

# second derivatives at zero updates of scatter mul are not exact (see ad_rules); first order is
SECOND_ORDER_CASES = sorted(set(CASES) - {"scatter_mul_zero_update"})


def test_every_first_order_primitive_has_a_jvp_rule():
    missing = [name for name in FIRST_ORDER if REGISTRY[name] not in jvp_rules]
    assert not missing, f"primitives without a jvp rule: {missing}"


def test_linear_primitives_have_transpose_rules_and_others_do_not():
    assert not [name for name in LINEAR if REGISTRY[name] not in transpose_rules]
    assert not [name for name in NOT_LINEAR if REGISTRY[name] in transpose_rules]


def test_every_differentiable_primitive_has_a_case():
    # stop_gradient (rule in transforms/custom.py) is the identity with a zero derivative by definition
    no_derivative = {"not", "and", "or", "xor", "shift_left", "shift_right", "eq", "ne", "lt", "le", "gt",
                     "ge", "argmax", "argmin", "iota", "threefry2x32", "is_finite", "bitcast_convert_type",
                     "stop_gradient"}
    # complex-valued operands or results: checked against JAX and finite differences in test_complex.py
    complex_valued = {"real", "imag", "conj", "complex", "fft"}
    float_valued = set(FIRST_ORDER) - no_derivative - complex_valued
    assert float_valued <= {primitive for primitive, _, _ in CASES.values()}


@pytest.mark.parametrize("case", sorted(CASES))
def test_jvp_matches_finite_differences_and_vjp_matches_jvp(case):
    name, operands, params = CASES[case]
    fn, xs = bound(name, operands, params)
    check_first_order(fn, xs)


@pytest.mark.parametrize("case", SECOND_ORDER_CASES)
def test_second_order_matches_finite_differences_of_the_gradient(case):
    name, operands, params = CASES[case]
    fn, xs = bound(name, operands, params)
    check_second_order(fn, xs)


def test_convert_to_lower_precision_passes_tangents_through():
    fn, xs = bound("convert_element_type", [_uniform(-2, 2)], {"new_dtype": dtypes.float32})
    check_first_order(fn, xs, rtol=1e-4, atol=1e-4, step=1e-2, vjp_rtol=1e-6)


# --- hypothesis: shapes -------------------------------------------------------------------------

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)
nonscalar_shapes = st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple)
seeds = st.integers(0, 2**16)


def check_both_orders(case: tuple[str, list[Any], dict[str, Any]]) -> None:
    fn, xs = bound(*case)
    check_first_order(fn, xs)
    check_second_order(fn, xs)


@pytest.mark.parametrize("name", UNARY)
@settings(max_examples=15, deadline=None)
@given(shape=shapes, seed=seeds)
def test_unary_rules_over_shapes(name, shape, seed):
    check_both_orders((name, [_unary_input(name, shape, np.random.default_rng(seed))], {}))


@pytest.mark.parametrize("name", BINARY)
@settings(max_examples=15, deadline=None)
@given(shape=shapes, rank0=st.sampled_from(["none", "x", "y"]), seed=seeds)
def test_binary_rules_over_shapes_with_rank0_operands(name, shape, rank0, seed):
    shape_x, shape_y = (() if rank0 == "x" else shape), (() if rank0 == "y" else shape)
    check_both_orders((name, _binary_inputs(name, shape_x, shape_y, np.random.default_rng(seed)), {}))


@pytest.mark.parametrize("name", ["reduce_sum", "reduce_prod", "reduce_max", "reduce_min"])
@settings(max_examples=15, deadline=None)
@given(shape=nonscalar_shapes, data=st.data(), seed=seeds)
def test_reduction_rules_over_shapes_and_axes(name, shape, data, seed):
    rng = np.random.default_rng(seed)
    x = _uniform(0.5, 1.5, shape, rng) if name == "reduce_prod" else _uniform(-2, 2, shape, rng)
    axes = data.draw(st.lists(st.integers(0, len(shape) - 1), unique=True).map(lambda a: tuple(sorted(a))))
    check_both_orders((name, [x], {"axes": axes}))


@pytest.mark.parametrize("name", ["cumsum", "cumprod", "cummax", "cummin"])
@settings(max_examples=15, deadline=None)
@given(shape=nonscalar_shapes, data=st.data(), seed=seeds)
def test_cumulative_rules_over_shapes_and_axes(name, shape, data, seed):
    rng = np.random.default_rng(seed)
    x = _uniform(0.5, 1.5, shape, rng) if name == "cumprod" else _uniform(-2, 2, shape, rng)
    params = {"axis": data.draw(st.integers(0, len(shape) - 1)), "reverse": data.draw(st.booleans())}
    check_both_orders((name, [x], params))


def _movement_params(name: str, shape: tuple[int, ...], x: np.ndarray, draw: Any,
                     rng: Any) -> tuple[list[Any], dict[str, Any]]:
    ndim = len(shape)
    if name == "transpose":
        return [x], {"permutation": tuple(draw(st.permutations(range(ndim))))}
    if name == "reshape":
        return [x], {"new_sizes": (int(np.prod(shape)),)}
    if name == "flip":
        return [x], {"axes": tuple(sorted(draw(st.sets(st.integers(0, ndim - 1)))))}
    if name == "slice":
        start = tuple(draw(st.integers(0, d - 1)) for d in shape)
        limit = tuple(draw(st.integers(s + 1, d)) for s, d in zip(start, shape))
        strides = tuple(draw(st.integers(1, 3)) for _ in shape)
        return [x], {"start": start, "limit": limit, "strides": strides}
    if name == "pad":
        low = tuple(draw(st.integers(0, 2)) for _ in shape)
        high = tuple(draw(st.integers(0, 2)) for _ in shape)
        return [x, _uniform(-1, 1, (), rng)], {"low": low, "high": high}
    if name == "concatenate":
        axis = draw(st.integers(0, ndim - 1))
        other = tuple(draw(st.integers(1, 3)) if d == axis else n for d, n in enumerate(shape))
        return [x, _uniform(-2, 2, other, rng)], {"axis": axis}
    if name == "broadcast_in_dim":
        return [x], {"shape": (2,) + shape, "broadcast_dimensions": tuple(range(1, ndim + 1))}
    if name == "dynamic_slice":  # starts may be out of range: they clamp
        sizes = tuple(draw(st.integers(1, d)) for d in shape)
        return [x, *(np.int32(draw(st.integers(-2, 5))) for _ in shape)], {"slice_sizes": sizes}
    update = _uniform(-2, 2, tuple(draw(st.integers(1, d)) for d in shape), rng)
    return [x, update, *(np.int32(draw(st.integers(-2, 5))) for _ in shape)], {}


@pytest.mark.parametrize("name", ["transpose", "reshape", "flip", "slice", "pad", "concatenate",
                                  "broadcast_in_dim", "dynamic_slice", "dynamic_update_slice"])
@settings(max_examples=15, deadline=None)
@given(shape=nonscalar_shapes, data=st.data(), seed=seeds)
def test_movement_rules_over_shapes(name, shape, data, seed):
    rng = np.random.default_rng(seed)
    operands, params = _movement_params(name, shape, _uniform(-2, 2, shape, rng), data.draw, rng)
    check_both_orders((name, operands, params))


@settings(max_examples=15, deadline=None)
@given(operand_shape=st.lists(st.integers(1, 4), min_size=1, max_size=3).map(tuple),
       batch=st.integers(1, 5), mode=st.sampled_from(["gather", "add", "set", "mul", "max", "min"]),
       data=st.data(), seed=seeds)
def test_gather_and_scatter_rules_over_shapes_and_indices(operand_shape, batch, mode, data, seed):
    """Random (possibly duplicate or out-of-range) indices over a random subset of axes."""
    rng = np.random.default_rng(seed)
    ndim = len(operand_shape)
    axes = tuple(sorted(data.draw(st.sets(st.integers(0, ndim - 1), min_size=1))))
    bounds = np.array([operand_shape[a] for a in axes])
    indices = rng.integers(-1, bounds + 1, (batch, len(axes))).astype(np.int32)
    x = _uniform(-2, 2, operand_shape, rng)
    if mode == "gather":
        case = ("gather", [x, indices], {"axes": axes})
    else:
        rest = tuple(d for i, d in enumerate(operand_shape) if i not in axes)
        low, high = (0.5, 1.5) if mode == "mul" else (-2, 2)
        updates = _uniform(low, high, (batch,) + rest, rng)
        case = ("scatter", [x, indices, updates], {"axes": axes, "mode": mode})
    check_both_orders(case)


# --- specific behaviours ------------------------------------------------------------------------


def _f64(values: Any) -> fg.Tensor:
    return fg.Tensor(np.asarray(values, np.float64), dtype="float64")


def test_max_and_min_split_the_gradient_evenly_at_ties():
    x = _f64([1.0, 2.0, 3.0])
    y = _f64([1.0, 0.0, 3.0])
    for primitive in (P.max_p, P.min_p):
        gx, gy = fg.grad(lambda a, b, p=primitive: bind(p, a, b).sum(), argnums=(0, 1))(x, y)
        assert gx.numpy()[0] == gy.numpy()[0] == 0.5
        assert gx.numpy()[2] == gy.numpy()[2] == 0.5


def test_reduce_max_averages_the_gradient_over_ties():
    x = _f64([[1.0, 3.0, 3.0, 0.0], [2.0, 5.0, 2.0, 5.0]])
    g = fg.grad(lambda a: bind(P.reduce_max_p, a, axes=(1,)).sum())(x)
    np.testing.assert_array_equal(g.numpy(), [[0, 0.5, 0.5, 0], [0, 0.5, 0, 0.5]])


def test_pow_derivatives_at_zero_base_follow_jax():
    x, y = _f64([0.0, 0.0, 2.0]), _f64([2.0, 0.0, 3.0])
    gx, gy = fg.grad(lambda a, b: bind(P.pow_p, a, b).sum(), argnums=(0, 1))(x, y)
    np.testing.assert_allclose(gx.numpy(), [0.0, 0.0, 12.0])
    np.testing.assert_allclose(gy.numpy(), [0.0, 0.0, 8 * np.log(2.0)])


def test_abs_derivative_is_the_sign_and_floor_has_none():
    x = _f64([-2.0, 0.5, 3.0])
    np.testing.assert_array_equal(fg.grad(lambda a: bind(P.abs_p, a).sum())(x).numpy(), [-1, 1, 1])
    _, tangent = fg.jvp(lambda a: bind(P.floor_p, a), (x,), (_f64([1.0, 1.0, 1.0]),))
    np.testing.assert_array_equal(tangent.numpy(), [0, 0, 0])


def test_zero_derivative_rules_leave_no_tangent_equations():
    """Symbolic zeros: through floor (float but piecewise constant) no equation reads the tangent."""
    x = _f64([0.5, 1.5])
    ir = fg.make_ir(lambda a, t: fg.jvp(lambda b: bind(P.floor_p, b) * 2.0, (a,), (t,))[1])(x, x)
    tangent_var = ir.in_vars[1]
    assert not [e for e in ir.eqns if any(getattr(atom, "id", None) == tangent_var.id for atom in e.inputs)]
    assert [e.primitive.name for e in ir.eqns].count("floor") <= 1


def test_integer_valued_primitives_give_no_tangent():
    x = _f64([[0.5, -1.0, 2.0]])
    for primitive, params in [(P.argmax_p, {"axis": 1, "index_dtype": dtypes.int32}), (P.lt_p, {}),
                              (P.is_finite_p, {}), (P.convert_element_type_p, {"new_dtype": dtypes.int32})]:
        args = (x, x) if primitive is P.lt_p else (x,)
        rule_out, rule_tangent = jvp_rules[primitive](list(args), [_f64(np.ones_like(x.numpy()))] * len(args),
                                                      **params)
        assert rule_tangent is None
        assert not dtypes.is_float(rule_out.dtype)


def test_scatter_set_sends_cotangents_only_to_the_landing_update():
    x = _f64([1.0, 2.0, 3.0])
    updates = _f64([10.0, 20.0, 30.0, 40.0])
    indices = fg.Tensor(np.array([[1], [1], [0], [7]], np.int32), dtype="int32")
    weights = _f64([1.0, 2.0, 4.0])

    def loss(a: Any, u: Any) -> Any:
        return (bind(P.scatter_p, a, indices, u, axes=(0,), mode="set") * weights).sum()

    gx, gu = fg.grad(loss, argnums=(0, 1))(x, updates)
    np.testing.assert_array_equal(gx.numpy(), [0.0, 0.0, 4.0])  # positions 0 and 1 are overwritten
    np.testing.assert_array_equal(gu.numpy(), [0.0, 2.0, 1.0, 0.0])  # the last duplicate wins; 7 is dropped


def test_gather_transpose_accumulates_at_clamped_indices():
    x = _f64([1.0, 2.0, 3.0])
    indices = fg.Tensor(np.array([[5], [-1], [1], [1]], np.int32), dtype="int32")
    g = fg.grad(lambda a: bind(P.gather_p, a, indices, axes=(0,)).sum())(x)
    np.testing.assert_array_equal(g.numpy(), [1.0, 2.0, 1.0])


def test_reduce_prod_and_cumprod_gradients_are_exact_at_zeros():
    x = _f64([2.0, 0.0, 3.0, 0.0])
    product = lambda a: bind(P.reduce_prod_p, a, axes=(0,))
    np.testing.assert_array_equal(fg.grad(product)(x).numpy(), [0, 0, 0, 0])
    y = _f64([2.0, 0.0, 3.0, 4.0])
    np.testing.assert_array_equal(fg.grad(product)(y).numpy(), [0, 24, 0, 0])
    hessian_row = fg.grad(lambda a: fg.grad(product)(a)[1])(x)  # d2/dx1 dx3 of the product at two zeros
    np.testing.assert_array_equal(hessian_row.numpy(), [0, 0, 0, 6])
    g = fg.grad(lambda a: bind(P.cumprod_p, a, axis=0, reverse=False).sum())(y)
    np.testing.assert_array_equal(g.numpy(), [1, 2 + 6 + 24, 0, 0])


def test_sort_moves_tangents_with_the_values():
    keys = _f64([3.0, 1.0, 2.0])
    values = _f64([30.0, 10.0, 20.0])
    _, (t_keys, t_values) = fg.jvp(lambda k, v: tuple(bind(P.sort_p, k, v, dimension=0, num_keys=1,
                                                           descending=False)),
                                   (keys, values), (_f64([0.3, 0.1, 0.2]), _f64([3.0, 1.0, 2.0])))
    np.testing.assert_array_equal(t_keys.numpy(), [0.1, 0.2, 0.3])
    np.testing.assert_array_equal(t_values.numpy(), [1.0, 2.0, 3.0])


def test_tanh_second_derivative_uses_the_output():
    x = _f64([0.3, -1.2, 4.0])
    second = fg.grad(lambda a: fg.grad(lambda b: bind(P.tanh_p, b).sum())(a).sum())(x)
    t = np.tanh(x.numpy())
    np.testing.assert_allclose(second.numpy(), -2 * t * (1 - t * t), rtol=1e-12)


def test_float32_rules_keep_the_dtype():
    x = fg.Tensor(np.array([0.5, 1.5], np.float32))
    for primitive in (P.exp2_p, P.erf_p, P.rsqrt_p, P.logistic_p, P.log2_p):
        g = fg.grad(lambda a, p=primitive: bind(p, a).sum())(x)
        assert g.dtype == np.float32
