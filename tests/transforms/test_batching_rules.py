"""Every first-order primitive's batching rule agrees with a Python loop over the batch.

Each case binds one primitive on sample operands; ``vmap`` of it (eagerly and traced, with the
batched IR typechecked) must equal the stack of the NumPy reference applied example by example,
with the batch axis first, last or in the middle and with some operands unbatched. Hypothesis
picks shapes and batch sizes for elementwise, reduction and movement primitives.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
from funcgrad.core.tensor import bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.primitives import REGISTRY, Primitive
from funcgrad.transforms.batching import batch_rules
from tests.conftest import check_both_modes

f32 = np.array([[0.5, -1.5, 2.0], [0.25, 3.0, -0.75]], np.float32)
positive = np.abs(f32) + 0.5
unit = np.clip(f32 / 4, -0.9, 0.9)
i32 = np.array([[3, -7, 2], [0, 5, -1]], np.int32)
u32 = np.array([1, 2, 3], np.uint32)
boolean = np.array([[True, False, True], [False, False, True]])
cube = np.arange(24, dtype=np.float32).reshape(2, 3, 4) / 7 - 1

_UNARY_FLOAT = ["exp", "log", "exp2", "log2", "expm1", "log1p", "sin", "cos", "tan", "asin", "acos", "atan",
                "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "sqrt", "rsqrt", "logistic", "erf",
                "floor", "ceil", "round", "is_finite", "neg", "abs", "sign", "stop_gradient"]
_BINARY = ["add", "sub", "mul", "div", "rem", "pow", "max", "min", "atan2",
           "eq", "ne", "lt", "le", "gt", "ge"]

# case label -> (primitive name, operands of one example, params)
CASES: dict[str, tuple[str, tuple, dict]] = {name: (name, (positive,), {}) for name in _UNARY_FLOAT}
CASES.update({"asin": ("asin", (unit,), {}), "acos": ("acos", (unit,), {}), "atanh": ("atanh", (unit,), {}),
              "acosh": ("acosh", (positive + 1,), {})})
CASES.update({name: (name, (f32, positive), {}) for name in _BINARY})
CASES.update({
    "not": ("not", (boolean,), {}),
    "name": ("name", (positive,), {"name": "a"}),
    "and": ("and", (i32, i32), {}), "or": ("or", (boolean, boolean), {}), "xor": ("xor", (i32, i32), {}),
    "shift_left": ("shift_left", (u32, np.uint32(3)), {}),
    "shift_right": ("shift_right", (i32, np.full_like(i32, 1)), {}),
    "select": ("select", (boolean, f32, positive), {}),
    "convert_element_type": ("convert_element_type", (f32,), {"new_dtype": dtypes.int32}),
    "bitcast_convert_type": ("bitcast_convert_type", (f32,), {"new_dtype": dtypes.uint32}),
    "reduce_sum": ("reduce_sum", (f32,), {"axes": (1,)}),
    "reduce_prod": ("reduce_prod", (f32,), {"axes": (0, 1)}),
    "reduce_max": ("reduce_max", (f32,), {"axes": (0,)}),
    "reduce_min": ("reduce_min", (i32,), {"axes": (1,)}),
    "argmax": ("argmax", (f32,), {"axis": 1, "index_dtype": dtypes.int32}),
    "argmin": ("argmin", (f32,), {"axis": 0, "index_dtype": dtypes.int32}),
    "cumsum": ("cumsum", (f32,), {"axis": 1, "reverse": False}),
    "cumprod": ("cumprod", (f32,), {"axis": 0, "reverse": True}),
    "cummax": ("cummax", (i32,), {"axis": 1, "reverse": False}),
    "cummin": ("cummin", (f32,), {"axis": 1, "reverse": True}),
    "reshape": ("reshape", (f32,), {"new_sizes": (3, 2)}),
    "broadcast_in_dim": ("broadcast_in_dim", (f32[0],), {"shape": (4, 3), "broadcast_dimensions": (1,)}),
    "transpose": ("transpose", (f32,), {"permutation": (1, 0)}),
    "pad": ("pad", (f32, np.float32(0)), {"low": (1, 0), "high": (0, 2)}),
    "slice": ("slice", (f32,), {"start": (0, 1), "limit": (2, 3), "strides": (1, 2)}),
    "flip": ("flip", (f32,), {"axes": (1,)}),
    "concatenate": ("concatenate", (f32, positive), {"axis": 0}),
    "dynamic_slice": ("dynamic_slice", (f32, np.int32(1), np.int32(5)), {"slice_sizes": (1, 2)}),
    "dynamic_update_slice": ("dynamic_update_slice",
                             (f32, np.ones((1, 2), np.float32), np.int32(0), np.int32(1)), {}),
    "gather": ("gather", (f32, np.array([[1, 2], [0, 0]], np.int32)), {"axes": (0, 1)}),
    "scatter": ("scatter", (f32, np.array([[1], [0]], np.int32), np.ones((2, 3), np.float32)),
                {"axes": (0,), "mode": "add"}),
    "dot_general": ("dot_general", (f32, positive), {"contracting": ((1,), (1,)), "batch": ((), ())}),
    "sort": ("sort", (f32, i32), {"dimension": 1, "num_keys": 1, "descending": False}),
    "threefry2x32": ("threefry2x32", (np.uint32(1), np.uint32(2), u32, u32), {}),
})
_square = np.array([[2.0, 0.5, -0.25], [0.5, 3.0, 0.0], [-0.25, 0.0, 1.5]], np.float32)
CASES.update({  # linear algebra: permuted examples may not be positive definite or regular: NaN both ways
    "cholesky": ("cholesky", (_square,), {}),
    "solve": ("solve", (_square, f32.T.copy()), {"transpose_a": False}),
    "solve_transposed_batched": ("solve", (np.stack([_square, _square.T]), cube[:, :, :1].copy()),
                                 {"transpose_a": True}),
    "slogdet": ("slogdet", (_square,), {}), "eigh": ("eigh", (_square,), {}),
    "qr": ("qr", (cube,), {"full_matrices": True}),
    "svd": ("svd", (f32,), {"full_matrices": False, "compute_uv": True}),
    "svd_values": ("svd", (cube,), {"full_matrices": False, "compute_uv": False}),
})
CASES.update({  # the corners of the rules
    "add_scalar_and_array": ("add", (np.float32(2.0), f32), {}),
    "select_scalar_predicate": ("select", (np.bool_(True), f32, positive), {}),
    "threefry2x32_arrays": ("threefry2x32", (u32, u32[::-1].copy(), np.uint32(7), u32), {}),
    "reduce_sum_rank3": ("reduce_sum", (cube,), {"axes": (0, 2)}),
    "reduce_max_all": ("reduce_max", (cube,), {"axes": (0, 1, 2)}),
    "transpose_rank3": ("transpose", (cube,), {"permutation": (2, 0, 1)}),
    "reshape_rank3": ("reshape", (cube,), {"new_sizes": (4, 6)}),
    "broadcast_in_dim_middle": ("broadcast_in_dim", (f32[:, :1],),
                                {"shape": (2, 5, 3), "broadcast_dimensions": (0, 2)}),
    "pad_rank1": ("pad", (u32, np.uint32(9)), {"low": (2,), "high": (1,)}),
    "slice_rank3": ("slice", (cube,), {"start": (1, 0, 1), "limit": (2, 3, 4), "strides": (1, 2, 2)}),
    "flip_rank3": ("flip", (cube,), {"axes": (0, 2)}),
    "concatenate_three": ("concatenate", (f32, positive, f32[:, :1]), {"axis": 1}),
    "dynamic_slice_rank3": ("dynamic_slice", (cube, np.int32(0), np.int32(2), np.int32(-3)),
                            {"slice_sizes": (2, 1, 3)}),
    "dynamic_update_slice_clamped": ("dynamic_update_slice",
                                     (cube, -np.ones((1, 2, 2), np.float32),
                                      np.int32(4), np.int32(1), np.int32(3)),
                                     {}),
    "gather_one_axis": ("gather", (cube, np.array([[[2], [0]], [[1], [3]]], np.int32)), {"axes": (2,)}),
    "gather_clamped": ("gather", (f32, np.array([[5, -2], [1, 1], [0, 9]], np.int32)), {"axes": (1, 0)}),
    "scatter_set": ("scatter", (cube, np.array([[1, 3], [0, 0]], np.int32), np.full((2, 3), 5, np.float32)),
                    {"axes": (0, 2), "mode": "set"}),
    "scatter_max": ("scatter", (i32, np.array([[2], [0], [2]], np.int32), i32[[0, 1, 0]][:, :2].copy()),
                    {"axes": (1,), "mode": "max"}),
    "scatter_mul_dropped": ("scatter", (f32, np.array([[1], [7]], np.int32), positive),
                            {"axes": (0,), "mode": "mul"}),
    "dot_general_batched": ("dot_general", (cube, cube[:, :, :2].copy()),
                            {"contracting": ((1,), (1,)), "batch": ((0,), (0,))}),
    "dot_general_matmul": ("dot_general", (f32, positive.T.copy()),
                           {"contracting": ((1,), (0,)), "batch": ((), ())}),
    "dot_general_outer": ("dot_general", (u32.astype(np.int32), i32[0]),
                          {"contracting": ((), ()), "batch": ((), ())}),
    "conv_general_dilated": ("conv_general_dilated", (cube.reshape(1, 4, 6), cube.reshape(4, 2, 3)[:, :, :2].copy()),
                             {"window_strides": (2,), "padding": ((1, 0),), "lhs_dilation": (1,),
                              "rhs_dilation": (2,), "feature_group_count": 2}),
    "sort_two_keys_descending": ("sort", (i32 % 2, f32, i32),
                                 {"dimension": 1, "num_keys": 2, "descending": True}),
    "argmax_rank3": ("argmax", (cube,), {"axis": 2, "index_dtype": dtypes.int32}),
    "cumsum_rank3": ("cumsum", (cube,), {"axis": 0, "reverse": True}),
})

BATCH = 3


c64 = (f32 + 1j * positive).astype(np.complex64)
CASES.update({  # complex numbers and fft (tests/front/test_complex.py checks their values against JAX)
    "real": ("real", (c64,), {}), "imag": ("imag", (c64,), {}), "conj": ("conj", (c64,), {}),
    "complex": ("complex", (f32, positive), {}),
    "fft": ("fft", (c64,), {"fft_type": "fft", "fft_lengths": (3,)}),
    "ifft_2d": ("fft", (c64,), {"fft_type": "ifft", "fft_lengths": (2, 3)}),
    "rfft": ("fft", (f32,), {"fft_type": "rfft", "fft_lengths": (3,)}),
    "irfft": ("fft", (c64[:, :2],), {"fft_type": "irfft", "fft_lengths": (3,)}),
    "mul_complex": ("mul", (c64, c64[::-1]), {}),
})


def _examples(x: Any, axis: int | None, batch: int, rng: np.random.Generator) -> Any:
    """``x`` itself when unbatched, else ``batch`` variations of it stacked along ``axis``."""
    if axis is None:
        return x
    if np.ndim(x) == 0:
        values = [np.asarray(x.item() ^ (k % 2) if x.dtype == np.bool_ else x + k, x.dtype)
                  for k in range(batch)]
    else:
        values = [rng.permutation(x.ravel()).reshape(x.shape) for _ in range(batch)]
    return np.stack(values, axis=axis)


def _loop(primitive: Primitive, args: list[Any], axes: list[int | None], params: dict,
          batch: int) -> list[np.ndarray]:
    """The reference: the primitive's NumPy implementation, example by example, stacked on axis 0."""
    per_example = []
    for b in range(batch):
        operands = [x if a is None else np.take(x, b, axis=a) for x, a in zip(args, axes)]
        with np.errstate(all="ignore"):
            out = primitive.impl(*operands, **params)
        per_example.append(out if primitive.multiple_results else (out,))
    return [np.stack([np.asarray(o[k]) for o in per_example]) for k in range(len(per_example[0]))]


def check_against_loop(name: str, operands: tuple, params: dict, axes: list[int | None], seed: int = 0,
                       batch: int = BATCH) -> None:
    """vmap of ``bind(name, ...)`` with per-operand batch ``axes`` equals the loop, eager and traced;
    unbatched NumPy scalars are closed over so they reach the rules as IR literals."""
    primitive = REGISTRY[name]
    rng = np.random.default_rng(seed)
    args = [_examples(x, a, batch, rng) for x, a in zip(operands, axes)]
    passed = [i for i, (x, a) in enumerate(zip(args, axes)) if not (a is None and isinstance(x, np.generic))]

    def fn(*values: Any) -> Any:
        full = list(args)
        for i, value in zip(passed, values):
            full[i] = value
        out = bind(primitive, *full, **params)
        return list(out) if primitive.multiple_results else out

    batched = fg.vmap(fn, in_axes=tuple(axes[i] for i in passed), axis_size=batch)
    with np.errstate(all="ignore"):
        eager, traced = check_both_modes(batched, *(fg.Tensor(args[i]) for i in passed))
    expected = _loop(primitive, args, axes, params, batch)
    if not primitive.multiple_results:
        eager, traced = [eager], [traced]
    elif not isinstance(traced, (list, tuple)):  # the traced run returns a lone output unwrapped
        traced = [traced]
    for got_eager, got_traced, want in zip(eager, traced, expected):
        for got in (np.asarray(got_eager), np.asarray(got_traced)):
            assert (got.shape, got.dtype) == (want.shape, want.dtype)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6, equal_nan=True)


def _position(x: Any, where: str) -> int:
    ndim = np.ndim(x)
    return {"first": 0, "last": ndim, "middle": (ndim + 1) // 2}[where]


@pytest.mark.parametrize("where", ["first", "last", "middle"])
@pytest.mark.parametrize("label", sorted(CASES))
def test_all_operands_batched(label, where):
    name, operands, params = CASES[label]
    check_against_loop(name, operands, params, [_position(x, where) for x in operands])


def _partial_patterns() -> list[tuple[str, tuple[int, ...]]]:
    """(label, indices of the batched operands): each operand left out in turn, and each alone."""
    out = []
    for label, (_, operands, _) in sorted(CASES.items()):
        n = len(operands)
        if n < 2:
            continue
        patterns = {tuple(j for j in range(n) if j != i) for i in range(n)} | {(i,) for i in range(n)}
        out += [(label, pattern) for pattern in sorted(patterns)]
    return out


@pytest.mark.parametrize("label,batched", _partial_patterns())
def test_some_operands_unbatched(label, batched):
    name, operands, params = CASES[label]
    axes = [_position(x, "last" if i % 2 else "middle") if i in batched else None
            for i, x in enumerate(operands)]
    check_against_loop(name, operands, params, axes, seed=len(batched))


def test_every_first_order_primitive_has_a_batching_rule_and_a_case():
    first_order = {p for p in vars(P).values() if isinstance(p, Primitive)}
    assert first_order <= set(REGISTRY.values())
    missing = sorted(p.name for p in first_order if p not in batch_rules)
    assert not missing, f"primitives without a batching rule: {missing}"
    uncovered = sorted({p.name for p in first_order} - {name for name, _, _ in CASES.values()} - {"iota"})
    assert not uncovered, f"primitives without a vmap test case: {uncovered}"


def test_every_registered_primitive_has_a_batching_rule():
    """Including jit, control flow and the custom-rule primitives, whose rules live elsewhere."""
    missing = sorted(name for name, p in REGISTRY.items() if p not in batch_rules)
    assert not missing, f"primitives without a batching rule: {missing}"


def test_iota_is_never_batched_but_mixes_with_batched_values():
    out, dim = batch_rules[P.iota_p]([], [], axis_size=4, dtype=dtypes.int32, shape=(2, 3), dimension=1)
    assert dim is None and out.shape == (2, 3)
    x = np.arange(12, dtype=np.int32).reshape(4, 3)

    def fn(row: Any) -> Any:
        return bind(P.add_p, row, bind(P.iota_p, dtype=dtypes.int32, shape=(3,), dimension=0))

    eager, traced = check_both_modes(fg.vmap(fn), fg.Tensor(x))
    np.testing.assert_array_equal(eager, x + np.arange(3))
    np.testing.assert_array_equal(traced, x + np.arange(3))


def test_elementwise_with_one_common_batch_axis_adds_no_transpose():
    ir = fg.make_ir(fg.vmap(lambda a, b: bind(P.mul_p, bind(P.sin_p, a), b), in_axes=(1, 1), out_axes=1))(
        fg.Tensor(f32), fg.Tensor(positive))
    assert [e.primitive.name for e in ir.eqns] == ["sin", "mul"]


def test_batched_start_indices_become_a_gather():
    def fn(x: Any, i: Any) -> Any:
        return bind(P.dynamic_slice_p, x, i, np.int32(0), slice_sizes=(1, 3))
    ir = fg.make_ir(fg.vmap(fn, in_axes=(None, 0)))(fg.Tensor(f32), fg.Tensor(np.array([0, 1, 4], np.int32)))
    names = [e.primitive.name for e in ir.eqns]
    assert "gather" in names and "dynamic_slice" not in names


def test_batched_operand_with_shared_starts_stays_a_dynamic_slice():
    def fn(x: Any) -> Any:
        return bind(P.dynamic_slice_p, x, np.int32(1), np.int32(0), slice_sizes=(1, 3))
    ir = fg.make_ir(fg.vmap(fn))(fg.Tensor(cube))
    assert [e.primitive.name for e in ir.eqns] == ["dynamic_slice"]


# --- hypothesis: random shapes, batch sizes and axes --------------------------------------------

shapes = st.lists(st.integers(1, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def batched_case(draw: Any, n_operands: int) -> tuple[tuple[int, ...], list[int | None], int]:
    shape = draw(shapes)
    size = draw(st.integers(1, 4))
    axes = [draw(st.one_of(st.none(), st.integers(0, len(shape)))) for _ in range(n_operands)]
    if all(a is None for a in axes):
        axes[0] = 0
    return shape, axes, size


def _hypothesis_check(name: str, operands: list[np.ndarray], axes: list[int | None], size: int,
                      params: dict) -> None:
    check_against_loop(name, tuple(operands), params, axes, batch=size)


@settings(max_examples=15, deadline=None)
@given(batched_case(2), st.sampled_from(["add", "mul", "max", "atan2", "lt"]), st.booleans(),
       st.integers(0, 99))
def test_binary_elementwise_over_random_shapes(case, name, scalar_second, seed):
    shape, axes, size = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(np.float32)
    y = np.float32(rng.standard_normal()) if scalar_second else rng.standard_normal(shape).astype(np.float32)
    axes = [axes[0], None if axes[1] is None else min(axes[1], np.ndim(y))]
    _hypothesis_check(name, [x, y], axes, size, {})


@settings(max_examples=15, deadline=None)
@given(batched_case(1), st.sampled_from(["sin", "exp", "neg", "floor"]), st.integers(0, 99))
def test_unary_elementwise_over_random_shapes(case, name, seed):
    shape, axes, size = case
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    _hypothesis_check(name, [x], axes, size, {})


@settings(max_examples=15, deadline=None)
@given(batched_case(1), st.sampled_from(["reduce_sum", "reduce_max", "argmin", "cumsum", "cummax"]),
       st.data())
def test_reductions_over_random_shapes(case, name, data):
    shape, axes, size = case
    if not shape:
        shape = (2,)
        axes = [data.draw(st.integers(0, 1))]
    x = np.random.default_rng(len(shape)).standard_normal(shape).astype(np.float32)
    if name.startswith("reduce"):
        params: dict = {"axes": tuple(sorted(data.draw(st.sets(st.integers(0, len(shape) - 1)))))}
    elif name == "argmin":
        params = {"axis": data.draw(st.integers(0, len(shape) - 1)), "index_dtype": dtypes.int32}
    else:
        params = {"axis": data.draw(st.integers(0, len(shape) - 1)), "reverse": data.draw(st.booleans())}
    _hypothesis_check(name, [x], axes, size, params)


@settings(max_examples=15, deadline=None)
@given(batched_case(1), st.sampled_from(["transpose", "reshape", "broadcast_in_dim", "slice", "flip", "pad"]),
       st.data())
def test_movement_over_random_shapes(case, name, data):
    shape, axes, size = case
    if name == "pad" and not shape:  # the NumPy reference (np.pad) rejects rank-0 operands
        shape, axes = (2,), [min(axes[0], 1)]
    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    operands = [x]
    ndim = len(shape)
    if name == "transpose":
        params: dict = {"permutation": tuple(data.draw(st.permutations(range(ndim))))}
    elif name == "reshape":
        params = {"new_sizes": (int(np.prod(shape)),)}
    elif name == "broadcast_in_dim":
        params = {"shape": (2,) + shape, "broadcast_dimensions": tuple(range(1, ndim + 1))}
    elif name == "slice":
        start = tuple(data.draw(st.integers(0, d)) for d in shape)
        limit = tuple(data.draw(st.integers(s, d)) for s, d in zip(start, shape))
        strides = tuple(data.draw(st.integers(1, 2)) for _ in shape)
        params = {"start": start, "limit": limit, "strides": strides}
    elif name == "flip":
        params = {"axes": tuple(sorted(data.draw(st.sets(st.integers(0, max(ndim - 1, 0)), max_size=ndim))))}
    else:
        operands.append(np.float32(-1))
        axes = axes + [data.draw(st.one_of(st.none(), st.just(0)))]
        params = {"low": tuple(data.draw(st.integers(0, 2)) for _ in shape),
                  "high": tuple(data.draw(st.integers(0, 2)) for _ in shape)}
    _hypothesis_check(name, operands, axes, size, params)
