"""conv_general_dilated: the primitive (shape rule, NumPy reference), its jvp / transpose / batching rules,
lax.conv_general_dilated, and its lowering (lower/conv.py) to one matrix-product kernel per convolution.

The oracle is a direct float64 sum written here from the definition (each output element sums
lhs[n, c, (o * stride + k * rhs_dilation - pad_low) / lhs_dilation] * rhs[f, c, k] over the window),
independent of the reference implementation's dilate-pad-einsum; gradients are checked against finite
differences and PyTorch.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
from funcgrad import lax
from funcgrad.ir.primitives import conv_general_dilated_p
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.render_loops import reduce_outer

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import assert_close, check_both_modes  # noqa: E402
from transform_checks import check_gradient, check_hessian_vector_product, check_jvp_vjp, check_vmap  # noqa: E402


def direct_conv(lhs: np.ndarray, rhs: np.ndarray, strides: Any, padding: Any, lhs_dilation: Any,
                rhs_dilation: Any, groups: int) -> np.ndarray:
    """The definition, one output position and kernel tap at a time, in float64."""
    lhs, rhs = lhs.astype(np.float64), rhs.astype(np.float64)
    batch, channels, *size = lhs.shape
    out_channels, group_in, *kernel = rhs.shape
    out_size = [((n - 1) * ld + 1 + lo + hi - (k - 1) * rd - 1) // s + 1
                for n, k, s, (lo, hi), ld, rd in zip(size, kernel, strides, padding, lhs_dilation, rhs_dilation)]
    out = np.zeros((batch, out_channels, *out_size))
    per_group = out_channels // groups
    for position in itertools.product(*map(range, out_size)):
        for tap in itertools.product(*map(range, kernel)):
            source = []
            for o, k, s, (lo, _), ld, rd, n in zip(position, tap, strides, padding, lhs_dilation, rhs_dilation, size):
                dilated = o * s + k * rd - lo  # index into the dilated (unpadded) input
                if dilated < 0 or dilated % ld or dilated // ld >= n:
                    break
                source.append(dilated // ld)
            else:
                for g in range(groups):
                    x = lhs[(slice(None), slice(g * group_in, (g + 1) * group_in), *source)]  # (N, Cg)
                    w = rhs[(slice(g * per_group, (g + 1) * per_group), slice(None), *tap)]  # (Og, Cg)
                    out[(slice(None), slice(g * per_group, (g + 1) * per_group), *position)] += x @ w.T
    return out


# (lhs shape, rhs shape, strides, padding, lhs_dilation, rhs_dilation, groups)
CASES = [
    ((2, 3, 7, 6), (4, 3, 3, 2), (1, 1), ((0, 0), (0, 0)), (1, 1), (1, 1), 1),
    ((2, 4, 9, 8), (6, 2, 3, 2), (2, 1), ((1, 2), (0, 1)), (1, 1), (2, 1), 2),  # asymmetric pads, groups
    ((1, 2, 6, 7), (3, 2, 2, 3), (1, 2), ((2, 1), (1, 1)), (2, 1), (1, 2), 1),  # lhs dilation (transposed conv)
    ((2, 2, 8, 8), (2, 2, 3, 3), (3, 2), ((-1, 0), (1, -2)), (1, 1), (1, 1), 1),  # negative pads crop
    ((2, 6, 5, 5), (6, 1, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), (1, 1), 6),  # depthwise
    ((3, 2, 11), (4, 2, 3), (2,), ((1, 0),), (3,), (2,), 1),  # 1-D
    ((2, 4, 10), (4, 2, 1), (1,), ((0, 0),), (1,), (1,), 2),  # 1-D, 1x1 kernel
    ((2, 3, 18, 18), (16, 3, 3, 3), (1, 1), ((1, 1), (1, 1)), (1, 1), (1, 1), 1),  # channels-last lowering
    ((2, 4, 6, 6), (32, 2, 3, 3), (2, 1), ((0, 1), (2, 0)), (2, 1), (1, 2), 2),  # channels-last, groups
]
IDS = [f"{len(c[0]) - 2}d-{i}" for i, c in enumerate(CASES)]


def _params(case: tuple) -> dict[str, Any]:
    _, _, strides, padding, lhs_dilation, rhs_dilation, groups = case
    return {"window_strides": strides, "padding": padding, "lhs_dilation": lhs_dilation,
            "rhs_dilation": rhs_dilation, "feature_group_count": groups}


def _operands(case: tuple, dtype: Any = np.float64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.normal(size=case[0]).astype(dtype), rng.normal(size=case[1]).astype(dtype)


def _conv(case: tuple) -> Any:
    p = _params(case)
    return lambda lhs, rhs: lax.conv_general_dilated(lhs, rhs, p["window_strides"], p["padding"], p["lhs_dilation"],
                                                     p["rhs_dilation"], p["feature_group_count"])


# --- the primitive and its reference ------------------------------------------------------------


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_reference_impl_matches_the_definition(case):
    lhs, rhs = _operands(case)
    expected = direct_conv(lhs, rhs, *case[2:])
    got = conv_general_dilated_p.impl(lhs, rhs, **_params(case))
    assert got.shape == conv_general_dilated_p.shape_rule(
        fg.Tensor(lhs).aval, fg.Tensor(rhs).aval, **_params(case)).shape
    assert_close(got, expected)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_compiled_and_traced_match_the_definition(case):
    lhs, rhs = _operands(case)
    eager, traced = check_both_modes(_conv(case), lhs, rhs)  # compiled kernels / reference interpreter
    expected = direct_conv(lhs, rhs, *case[2:])
    assert_close(eager, expected)
    assert_close(traced, expected)
    assert_close(np.asarray(fg.jit(_conv(case))(lhs, rhs)), expected)


@pytest.mark.parametrize("case", CASES[1:4] + CASES[8:], ids=IDS[1:4] + IDS[8:])
def test_reference_device_runs_the_lowered_kernels_like_the_interpreter(case):
    lhs, rhs = _operands(case, np.float32)
    on_reference = _conv(case)(fg.Tensor(lhs, device="REFERENCE"), fg.Tensor(rhs, device="REFERENCE")).numpy()
    assert_close(on_reference, conv_general_dilated_p.impl(lhs, rhs, **_params(case)), rtol=1e-5, atol=1e-5)


def test_float32_and_float16_keep_their_dtype():
    case = CASES[1]
    for dtype, tolerance in ((np.float32, 1e-5), (np.float16, 2e-2)):
        lhs, rhs = _operands(case, dtype)
        got = fg.jit(_conv(case))(lhs, rhs)
        assert got.dtype == dtype
        expected = direct_conv(lhs, rhs, *case[2:])
        assert_close(np.asarray(got).astype(np.float64), expected, rtol=tolerance, atol=tolerance * 4)


@pytest.mark.parametrize("lhs_shape, rhs_shape, params, message", [
    ((2, 3, 5, 5), (4, 3, 3), {}, "same rank"),
    ((2, 3, 5, 5), (4, 2, 3, 3), {}, "expects 2 input channels"),
    ((2, 4, 5, 5), (3, 2, 3, 3), {"feature_group_count": 2}, "must divide"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"window_strides": (1,)}, "window_strides needs 2 entries"),
    ((2, 3, 5, 5), (4, 3, 3, 3), {"rhs_dilation": (0, 1)}, "rhs_dilation must be >= 1"),
    ((2, 3, 2, 5), (4, 3, 3, 3), {}, "larger than the padded input"),
])
def test_shape_rule_errors_name_the_problem(lhs_shape, rhs_shape, params, message):
    full = {"window_strides": (1, 1), "padding": ((0, 0), (0, 0)), "lhs_dilation": (1, 1), "rhs_dilation": (1, 1),
            "feature_group_count": 1, **params}
    with pytest.raises(ValueError, match=message):
        fg.jit(lambda x, w: fg.core.tensor.bind(conv_general_dilated_p, x, w, **full))(
            np.zeros(lhs_shape, np.float32), np.zeros(rhs_shape, np.float32))


def test_operands_of_two_dtypes_are_refused():
    with pytest.raises(TypeError, match="one dtype"):
        fg.core.tensor.bind(conv_general_dilated_p, fg.Tensor(np.zeros((1, 1, 3), np.float32)),
                            fg.Tensor(np.zeros((1, 1, 2), np.int32)), window_strides=(1,), padding=((0, 0),),
                            lhs_dilation=(1,), rhs_dilation=(1,), feature_group_count=1)


# --- lax.conv_general_dilated -------------------------------------------------------------------


@pytest.mark.parametrize("size, kernel, stride, dilation", [(7, 3, 1, 1), (8, 3, 2, 1), (9, 4, 3, 2), (5, 2, 2, 1)])
def test_same_padding_gives_ceil_of_size_over_stride_as_jax(size, kernel, stride, dilation):
    lhs, rhs = np.ones((1, 1, size, size), np.float32), np.ones((1, 1, kernel, kernel), np.float32)
    out = lax.conv_general_dilated(lhs, rhs, (stride, stride), "SAME", rhs_dilation=(dilation, dilation))
    assert out.shape == (1, 1, -(-size // stride), -(-size // stride))
    total = max((-(-size // stride) - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    pads = ((total // 2, total - total // 2),) * 2
    explicit = lax.conv_general_dilated(lhs, rhs, (stride, stride), pads, rhs_dilation=(dilation, dilation))
    np.testing.assert_array_equal(out.numpy(), explicit.numpy())
    valid = lax.conv_general_dilated(lhs, rhs, (stride, stride), "valid", rhs_dilation=(dilation, dilation))
    assert valid.shape[2] == (size - (kernel - 1) * dilation - 1) // stride + 1


def test_lax_refuses_an_unknown_padding_string():
    with pytest.raises(ValueError, match="'SAME', 'VALID'"):
        lax.conv_general_dilated(np.ones((1, 1, 4), np.float32), np.ones((1, 1, 2), np.float32), (1,), "FULL")


# --- differentiation and batching ---------------------------------------------------------------


@pytest.mark.parametrize("case", [CASES[i] for i in (1, 2, 3, 5)], ids=[IDS[i] for i in (1, 2, 3, 5)])
def test_gradients_match_finite_differences(case):
    lhs, rhs = _operands(case)
    lhs, rhs = lhs[:1], rhs  # one example keeps the coordinate-by-coordinate differences quick
    check_gradient(_conv(case), [lhs, rhs])


@pytest.mark.parametrize("case", [CASES[i] for i in (1, 2, 5)], ids=[IDS[i] for i in (1, 2, 5)])
def test_jvp_vjp_and_second_order(case):
    lhs, rhs = _operands(case)
    check_jvp_vjp(_conv(case), [lhs, rhs])
    check_hessian_vector_product(lambda x, w: _conv(case)(x, w) * _conv(case)(x, w), [lhs[:1], rhs])


NO_LHS_DILATION = [(case, name) for case, name in zip(CASES, IDS) if all(d == 1 for d in case[4])]


@pytest.mark.parametrize("case", [c for c, _ in NO_LHS_DILATION], ids=[n for _, n in NO_LHS_DILATION])
def test_gradients_match_pytorch(case):
    """(PyTorch's conv has no lhs dilation; those cases are checked against the definition above.)"""
    torch = pytest.importorskip("torch")
    lhs, rhs = _operands(case, np.float32)
    strides, padding, _, rhs_dilation, groups = case[2:]
    lhs_t, rhs_t = torch.tensor(lhs, requires_grad=True), torch.tensor(rhs, requires_grad=True)
    pads = [p for lo_hi in reversed(padding) for p in lo_hi]  # F.pad: last dim first; negative pads crop
    conv = torch.nn.functional.conv1d if len(strides) == 1 else torch.nn.functional.conv2d
    out_t = conv(torch.nn.functional.pad(lhs_t, pads), rhs_t, stride=strides, dilation=rhs_dilation, groups=groups)
    cotangent = np.random.default_rng(1).normal(size=out_t.shape).astype(np.float32)
    out_t.backward(torch.tensor(cotangent))
    out, pullback = fg.vjp(_conv(case), fg.Tensor(lhs), fg.Tensor(rhs))
    d_lhs, d_rhs = fg.jit(pullback)(cotangent)
    assert_close(out.numpy(), out_t.detach().numpy(), rtol=1e-4, atol=1e-4)
    assert_close(d_lhs.numpy(), lhs_t.grad.numpy(), rtol=1e-4, atol=1e-4)
    assert_close(d_rhs.numpy(), rhs_t.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_transposes_are_convolutions():
    case = CASES[1]
    lhs, rhs = _operands(case, np.float32)
    ir = fg.make_ir(lambda x, w: fg.grad(lambda x, w: _conv(case)(x, w).sum(), argnums=(0, 1))(x, w))(lhs, rhs)
    names = [e.primitive.name for e in ir.eqns]
    assert "dot_general" not in names
    assert names.count("conv_general_dilated") == 3  # the input gradient and one weight gradient per group


@pytest.mark.parametrize("in_axes", [(0, None), (None, 0), (0, 0), (2, 1)])
@pytest.mark.parametrize("case", [CASES[1], CASES[5], CASES[8]], ids=[IDS[1], IDS[5], IDS[8]])
def test_vmap_matches_a_python_loop(case, in_axes):
    rng = np.random.default_rng(3)
    examples = [[rng.normal(size=case[0]), rng.normal(size=case[1])] for _ in range(3)]
    check_vmap(_conv(case), examples, list(in_axes))


# --- lowering -----------------------------------------------------------------------------------


def _product_kernels(kernels: list[Any]) -> list[Any]:
    """The rank >= 4 sums of products the renderer runs in its i-k-j order (the convolutions here, a padded
    one's product guarded by where(inside, x * w, -0.0); not a pooling window's count of maxima over
    channels-last data)."""
    def product(e: Any) -> bool:
        return e is not None and (e.op == "mul" or (e.op == "where" and e.args[1].op == "mul"))
    return [k for k in kernels if len(k.kernel.shape) >= 4 and product(k.kernel.reduce_expr) and reduce_outer(k.kernel)]


def test_each_convolution_of_a_training_step_is_one_product_kernel_with_a_long_last_axis():
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from beautiful_mnist import Model, train_step

    rng = np.random.default_rng(0)
    images, labels = rng.integers(0, 256, (64, 1, 28, 28), dtype=np.uint8), rng.integers(0, 10, 64, dtype=np.uint8)
    fg.Tensor.manual_seed(0)
    model = Model()
    opt = fg.nn.optim.Adam(fg.nn.state.get_parameters(model), lr=1e-3)
    kernels = train_step.lower(model, opt, fg.Tensor(images), fg.Tensor(labels)).kernels
    products = sorted(k.kernel.shape for k in _product_kernels(kernels))
    # 4 forward convolutions (N, OH, OW, O), 3 input gradients (N, H, W, C) (the first layer's input needs
    # none) and 4 weight gradients ([chunks,] KH, KW, C, O) or, with one input channel, (chunks, C, KH, KW, O)
    assert products == sorted([
        (64, 24, 24, 32), (64, 20, 20, 32), (64, 8, 8, 64), (64, 6, 6, 64),
        (64, 24, 24, 32), (64, 10, 10, 32), (64, 8, 8, 64),
        (8, 1, 5, 5, 32), (4, 5, 5, 32, 32), (3, 3, 32, 64), (3, 3, 64, 64)]), products
    assert all(shape[-1] >= 16 for shape in products)


def test_spatial_last_layout_when_there_are_few_output_channels():
    lhs, rhs = np.zeros((2, 3, 12, 20), np.float32), np.zeros((4, 3, 3, 3), np.float32)
    (kernel,) = fg.jit(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "VALID")).lower(lhs, rhs).kernels
    assert kernel.kernel.shape == (2, 4, 10, 18) and reduce_outer(kernel.kernel)
    listing = kernel.source.split("define")[0]
    assert "rem(" not in listing and "div(" not in listing, listing  # the window view is affine


def test_channels_last_kernel_is_stored_once_and_the_padding_is_a_guard():
    lhs, rhs = np.zeros((2, 3, 10, 10), np.float32), np.zeros((32, 3, 3, 3), np.float32)
    kernels = fg.jit(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME")).lower(lhs, rhs).kernels
    shapes = [k.kernel.shape for k in kernels]
    # the kernel as (C, KH, KW, O), the product (N, OH, OW, O) and its NCHW copy (the copies' loops merge
    # where their indices allow, kernel.merge_loops: C*KH*KW, OH*OW); the padded input is not stored: the
    # product reads the input and sums where(inside the padding's bounds, x * w, -0.0)
    assert shapes == [(27, 32), (2, 10, 10, 32), (2, 32, 100)], shapes
    product = kernels[1].kernel
    assert product.in_avals[0].shape == (2, 3, 10, 10)
    term = product.reduce_expr
    assert term.op == "where" and term.args[2].op == "const" and str(term.args[2].arg) == "-0.0", term


def test_spatial_last_stores_its_padded_input_and_a_dilated_lhs_splits_into_phases():
    lhs, rhs = np.zeros((2, 3, 10, 10), np.float32), np.zeros((4, 3, 3, 3), np.float32)  # 4 output channels
    kernels = fg.jit(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME")).lower(lhs, rhs).kernels
    assert [k.kernel.shape for k in kernels][0] == (6, 12, 12)  # the padded input, then the product
    rhs = np.zeros((32, 3, 3, 3), np.float32)
    kernels = fg.jit(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)), lhs_dilation=(2, 2)))\
        .lower(lhs, rhs).kernels
    # a dilated lhs (a strided convolution's input gradient) is not stored with its zeros: one product per
    # output phase reads the undilated input (conv._phase_convolutions), 4 for a dilation of 2 x 2
    assert not [k for k in kernels if k.kernel.shape == (2, 3, 21, 21)]
    assert len(_product_kernels(kernels)) == 4


def test_long_weight_gradient_contraction_is_split_into_chunks():
    lhs, rhs = np.zeros((64, 2, 22, 22), np.float32), np.zeros((16, 2, 3, 3), np.float32)
    cotangent = np.zeros((64, 16, 20, 20), np.float32)  # the weight gradient sums 64 * 20 * 20 terms
    kernels = fg.jit(lambda x, w, ct: fg.vjp(lambda w: lax.conv_general_dilated(x, w, (1, 1), "VALID"), w)[1](ct))\
        .lower(lhs, rhs, cotangent).kernels
    (product,) = _product_kernels(kernels)
    # (chunk, KH, KW, C, O): the batch split into 4 chunks of 16 images (16 * 20 * 20 >= CHUNK_REDUCTION terms);
    # C (even) is the paired row axis since KW is odd
    assert product.kernel.shape == (4, 3, 3, 2, 16) and product.kernel.reduce_shape == (16, 20, 20)


def test_short_rows_keep_a_vectorised_row_loop_and_scalar_reduction_loops():
    lhs, rhs = np.zeros((2, 3, 12, 22), np.float32), np.zeros((4, 3, 3, 3), np.float32)  # rows of 20
    (kernel,) = fg.jit(lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "VALID")).lower(lhs, rhs).kernels
    source = render_llvm(kernel.kernel)
    assert '!"llvm.loop.unroll.disable"' in source and '!"llvm.loop.vectorize.enable", i1 true' in source
    assert source.count('!"llvm.loop.vectorize.enable", i1 false') >= 3  # (KH, KW, C) loops of each row block
