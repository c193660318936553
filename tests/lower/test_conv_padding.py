"""Convolutions over a zero-padded lhs: ``lower/conv.py``'s masked product (a channels-last product sums
``where(inside, x * w, -0.0)`` over the unpadded lhs instead of reading a stored padded copy) and the
register tile's bounds on a guarded sum's loops (``render_tile``: loops narrowed per outer row, the tap
loop unrolled in static edge row tiles, anything else tested per term).

Checked: every layout the lowering makes (odd sizes, strides 1 and 2, rhs dilation, padding larger than
the kernel, groups, a batch of 1, 1-D and 3-D) against PyTorch in float64, forward and both gradients,
with the tile forced on at these small sizes; bit for bit against the same convolution over an
explicitly padded lhs (the zeros multiplied, as before); a non-finite kernel element that meets only
the padding (left out, as in PyTorch's input gradients and the float64 definition in test_conv.py);
how the tile sorts each kernel's conditions; a hand-made guarded sum with conditions it cannot bound.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import lax
from funcgrad.devices.cpu import CPUDevice
from funcgrad.ir.core import ShapedArray
from funcgrad.lower import render_tile
from funcgrad.lower.kernel import INDEX, Kernel, KExpr, Opt, alu, const, evaluate_kernel, load, var, where
from funcgrad.lower.optimize import optimize
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.render_loops import _FunctionBuilder
from funcgrad.lower.schedule import KernelStep, inline_calls, schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from test_conv import direct_conv  # noqa: E402

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU code generation, whatever DEVICE says
FLOAT32 = np.dtype(np.float32)


@pytest.fixture
def tiles_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tile for every product-shaped sum, however small (these tests' convolutions are)."""
    monkeypatch.setattr(render_tile, "TILE_MIN_WORK", 0)


def kernels_of(f: Any, *args: Any) -> list[Kernel]:
    ir = fg.make_ir(f)(*args)
    return [step.kernel for step in schedule(inline_calls(ir)) if isinstance(step, KernelStep)]


def run_steps(device: CPUDevice, f: Any, *args: np.ndarray) -> tuple[list[np.ndarray], list[Kernel]]:
    """``f``'s outputs computed kernel by kernel with the optimiser's opts chosen now (so a patched
    threshold counts: jit's plans are cached by the program alone), and the optimised kernels."""
    ir = fg.make_ir(f)(*args)
    env: dict[int, np.ndarray] = {v.id: np.asarray(a) for v, a in zip(ir.in_vars, args)}
    env.update((v.id, np.asarray(c)) for v, c in zip(ir.const_vars, ir.consts))
    kernels = []
    for step in schedule(inline_calls(ir)):
        assert isinstance(step, KernelStep), step
        kernel = optimize(step.kernel)
        kernels.append(kernel)
        outputs = [np.empty(v.aval.shape, v.aval.dtype) for v in step.outputs]
        device.compile(kernel)([np.ascontiguousarray(env[v.id]) for v in step.inputs], outputs)
        env.update((v.id, out) for v, out in zip(step.outputs, outputs))
    return [env[v.id] for v in ir.outputs], kernels


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> CPUDevice:
    return CPUDevice(cache_dir=tmp_path_factory.mktemp("cache"))


def guarded(kernels: list[Kernel]) -> list[Kernel]:
    return [k for k in kernels if k.reduce_expr is not None and render_tile._guard(k.reduce_expr) is not None]


def tile_of(kernel: Kernel) -> render_tile._Tile:
    """The tile the renderer would make of ``kernel`` with its default opts (to read its analysis)."""
    opts = render_tile.tile_opts(kernel)
    assert opts is not None, kernel
    return render_tile._Tile(_FunctionBuilder(), attrs.evolve(kernel, opts=opts))


# (N, C, spatial, O, kernel, stride, padding per spatial axis, rhs dilation, groups)
CASES = [
    (2, 16, (9, 11), 32, 3, 1, ((1, 1), (1, 1)), 1, 1),  # odd sizes; weight gradient rows along N
    (3, 16, (9, 11), 32, 3, 1, ((1, 1), (1, 1)), 1, 1),  # odd batch
    (2, 16, (9, 11), 32, 3, 2, ((1, 1), (1, 1)), 1, 1),  # stride 2 (its input gradient: a dilated lhs, stored)
    (2, 16, (10, 9), 32, 3, 1, ((2, 2), (2, 2)), 2, 1),  # rhs dilation
    (1, 16, (5, 6), 32, 3, 1, ((4, 4), (4, 4)), 1, 1),  # padding larger than the kernel, a batch of 1
    (2, 32, (8, 8), 32, 3, 1, ((1, 1), (1, 1)), 1, 2),  # groups
    (2, 16, (7, 9), 32, 3, 1, ((2, 0), (1, 3)), 1, 1),  # asymmetric padding
    (2, 16, (13,), 32, 5, 1, ((2, 2),), 1, 1),  # 1-D
    (2, 16, (5, 4, 6), 32, 3, 1, ((1, 1),) * 3, 1, 1),  # 3-D
    (1, 32, (12, 12), 32, 5, 1, ((0, 0), (0, 0)), 1, 1),  # unpadded: its input gradient pads by 4 (the CNN's)
]
IDS = ["odd", "odd-batch", "stride2", "dilation", "pad>kernel", "groups", "asymmetric", "1d", "3d", "valid"]


def _conv(case: tuple) -> Any:
    _, _, spatial, _, _, stride, padding, dilation, groups = case
    rank = len(spatial)
    return lambda x, w: lax.conv_general_dilated(x, w, (stride,) * rank, padding, rhs_dilation=(dilation,) * rank,
                                                 feature_group_count=groups)


def _torch_conv(case: tuple, x: Any, w: Any) -> Any:
    _, _, spatial, _, _, stride, padding, dilation, groups = case
    pads = [p for low_high in reversed(padding) for p in low_high]  # F.pad: last axis first
    conv = {1: torch.nn.functional.conv1d, 2: torch.nn.functional.conv2d, 3: torch.nn.functional.conv3d}[len(spatial)]
    return conv(torch.nn.functional.pad(x, pads), w, stride=stride, dilation=dilation, groups=groups)


def _operands(case: tuple, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    batch, channels, spatial, out_channels, kernel, _, _, _, groups = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, channels, *spatial)).astype(np.float32)
    w = rng.standard_normal((out_channels, channels // groups, *(kernel,) * len(spatial))).astype(np.float32)
    return x, w


def tiled(kernels: list[Kernel]) -> list[Kernel]:
    return [k for k in kernels if any(opt.action == "tile" for opt in k.opts or ())]


def _check_against_pytorch(device: CPUDevice, case: tuple) -> list[Kernel]:
    """The convolution's output and both gradients (one vjp) against PyTorch in float64; the kernels."""
    x, w = _operands(case)
    x_t, w_t = torch.tensor(x, dtype=torch.float64, requires_grad=True), torch.tensor(w, dtype=torch.float64,
                                                                                        requires_grad=True)
    out_t = _torch_conv(case, x_t, w_t)
    cotangent = np.random.default_rng(1).standard_normal(out_t.shape).astype(np.float32)
    out_t.backward(torch.tensor(cotangent, dtype=torch.float64))

    def step(x: Any, w: Any, ct: Any) -> Any:
        out, pullback = fg.vjp(_conv(case), x, w)
        return (out, *pullback(ct))

    got, kernels = run_steps(device, step, x, w, cotangent)
    for actual, expected in zip(got, (out_t.detach(), x_t.grad, w_t.grad)):
        expected = expected.numpy()
        scale = max(1.0, float(np.abs(expected).max()))
        np.testing.assert_allclose(actual, expected, rtol=0, atol=2e-5 * scale)
    return kernels


@pytest.mark.usefixtures("tiles_everywhere")
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_forward_and_gradients_match_pytorch_float64(device: CPUDevice, case: tuple) -> None:
    kernels = _check_against_pytorch(device, case)
    assert tiled(guarded(kernels)), "expected a tiled convolution over a padded lhs"


@st.composite
def padded_convolutions(draw: st.DrawFn) -> tuple:
    """A channels-last convolution (16 or 32 output channels per group) over a padded lhs: 1-D or 2-D,
    sizes 3-11, kernels 1-5, strides 1-2, rhs dilation 1-2, pads 0-6 on either side, 1-2 groups."""
    rank = draw(st.integers(1, 2))
    groups = draw(st.integers(1, 2))
    kernel, dilation = draw(st.integers(1, 5)), draw(st.integers(1, 2))
    span = (kernel - 1) * dilation + 1
    padding = tuple((draw(st.integers(0, 6)), draw(st.integers(0, 6))) for _ in range(rank))
    spatial = tuple(draw(st.integers(max(3, span - low - high), 11)) for low, high in padding)
    return (draw(st.integers(1, 3)), 8 * groups, spatial, draw(st.sampled_from([16, 32])) * groups, kernel,
            draw(st.integers(1, 2)), padding, dilation, groups)


@pytest.mark.usefixtures("tiles_everywhere")
@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=padded_convolutions())
def test_random_padded_convolutions_match_pytorch_float64(device: CPUDevice, case: tuple) -> None:
    _check_against_pytorch(device, case)


@pytest.mark.usefixtures("tiles_everywhere")
@pytest.mark.parametrize("lhs_shape, rhs_shape, padding", [
    ((2, 32, 20, 20), (32, 32, 5, 5), ((4, 4), (4, 4))),  # the CNN's conv 2 input gradient
    ((3, 16, 7, 9), (32, 16, 3, 3), ((1, 2), (3, 0))),
    ((1, 8, 6, 5), (48, 8, 3, 3), ((5, 5), (5, 5))),  # outputs whose window is all padding
    ((2, 16, 11), (32, 16, 4), ((3, 3),)),
])
def test_bits_equal_the_convolution_of_an_explicitly_padded_lhs(device: CPUDevice, lhs_shape: tuple,
                                                                  rhs_shape: tuple, padding: tuple) -> None:
    """Leaving the padding's terms out changes no bit of a sum (-0.0 is its identity) except the sign of
    an all-zero one: the tile's bounded loops add the other terms in the same order as the tile over
    the padded lhs (whose zeros it multiplies) does."""
    rng = np.random.default_rng(2)
    x, w = rng.standard_normal(lhs_shape).astype(np.float32), rng.standard_normal(rhs_shape).astype(np.float32)
    strides = (1,) * len(padding)
    (masked,), kernels = run_steps(device, lambda x, w: lax.conv_general_dilated(x, w, strides, padding), x, w)
    assert len(tiled(guarded(kernels))) == 1
    pads = [(0, 0), (0, 0)] + list(padding)
    (explicit,), kernels = run_steps(device, lambda x, w: lax.conv_general_dilated(fnp.pad(x, pads), w, strides,
                                                                                   "VALID"), x, w)
    assert tiled(kernels) and not guarded(kernels)
    zero = explicit == 0
    np.testing.assert_array_equal(masked[~zero].view(np.uint32), explicit[~zero].view(np.uint32))
    np.testing.assert_array_equal(masked[zero], 0.0)


@pytest.mark.parametrize("tile", [True, False], ids=["tile", "plain"])
def test_a_non_finite_kernel_element_does_not_reach_outputs_through_the_padding(
        device: CPUDevice, tile: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The terms on the padding are left out, not multiplied by zero (inf * 0 would be NaN): as in the
    definition (test_conv.direct_conv) and PyTorch's input gradients, on the tile and the plain loops."""
    monkeypatch.setattr(render_tile, "TILE_MIN_WORK", 0 if tile else 1 << 60)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 16, 8, 8)).astype(np.float32)
    w = rng.standard_normal((32, 16, 3, 3)).astype(np.float32)
    w[:, :, 0, 0] = np.inf  # the top-left tap
    w[:4, :, 2, 1] = np.nan
    (got,), kernels = run_steps(device, lambda x, w: lax.conv_general_dilated(x, w, (1, 1), "SAME"), x, w)
    assert bool(tiled(guarded(kernels))) == tile
    with np.errstate(invalid="ignore"):  # (inf - inf in the definition's sums)
        expected = direct_conv(x, w, (1, 1), ((1, 1), (1, 1)), (1, 1), (1, 1), 1)
    np.testing.assert_allclose(got, expected, rtol=2e-5, atol=2e-5)  # NaN where it has them
    assert np.isfinite(got[:, 4:, 0, :]).all()  # tap (0, 0) meets only padding on the first row
    # the input gradient (a convolution of the cotangent padded by 2) against PyTorch's
    x_t, w_t = torch.tensor(x, requires_grad=True), torch.tensor(w)
    out_t = torch.nn.functional.conv2d(x_t, w_t)
    cotangent = rng.standard_normal(out_t.shape).astype(np.float32)
    out_t.backward(torch.tensor(cotangent))

    def input_gradient(x: Any, ct: Any) -> Any:
        return fg.vjp(lambda x: lax.conv_general_dilated(x, w, (1, 1), "VALID"), x)[1](ct)[0]

    (d_x,), kernels = run_steps(device, input_gradient, x, cotangent)
    assert bool(tiled(guarded(kernels))) == tile
    expected = x_t.grad.numpy()
    assert np.isfinite(expected[:, :, -1, -1]).all() and np.isnan(expected).any()
    np.testing.assert_allclose(d_x, expected, rtol=2e-5, atol=2e-4)


def test_the_tile_bounds_the_cnn_input_gradient_loops() -> None:
    """conv 2's input gradient: (N, H, W, C) rows along W; the kernel row loop (r1) is narrowed per
    image row, the kernel column loop (r2) unrolled and left out per edge row tile; nothing is tested
    per term, and the lhs's own padding tests are gone from the term."""
    ct, w = np.ones((2, 32, 20, 20), np.float32), np.ones((32, 32, 5, 5), np.float32)
    (kernel,) = guarded(kernels_of(lambda ct, w: lax.conv_general_dilated(ct, w, (1, 1), ((4, 4), (4, 4))), ct, w))
    assert kernel.shape == (2, 24, 24, 32) and kernel.reduce_shape == (32, 5, 5)
    tile = tile_of(kernel)
    assert sorted(tile.outer_bounds) == [1] and len(tile.outer_bounds[1]) == 2  # 0 <= h + kh - 4 < 20
    assert [bound.depth for bound in tile.row_bounds] == [2, 2] and tile.unroll_from == 2
    assert tile.residual is None
    assert "where" not in str(tile.reduce_expr)
    # rows in tiles of 12: both touch an edge, so both are static, with 50 of their 60 (row, tap) terms
    source = render_llvm(attrs.evolve(kernel, opts=render_tile.tile_opts(kernel)))
    assert source.count("call <16 x float> @llvm.fmuladd") == 2 * 2 * 50  # (tiles, vectors, terms)


def test_weight_gradients_and_forward_rows_along_the_batch_bound_outer_loops() -> None:
    x, w = np.ones((2, 16, 9, 11), np.float32), np.ones((32, 16, 3, 3), np.float32)

    def loss(x: Any, w: Any) -> Any:
        return (lax.conv_general_dilated(x, w, (1, 1), "SAME") ** 2).sum()

    kernels = guarded(kernels_of(fg.grad(loss, argnums=(0, 1)), x, w))
    by_shape = {k.shape: tile_of(k) for k in kernels}
    weight = by_shape[(3, 3, 16, 32)]  # (KH, KW, C, O) summed over (N, H, W): both image loops narrowed
    assert sorted(weight.outer_bounds) == [1, 2] and not weight.row_bounds and weight.residual is None
    forward = by_shape[(9, 11, 2, 32)]  # odd width: rows along N, (H, W) outer
    assert sorted(forward.outer_bounds) == [1, 2] and not forward.row_bounds and forward.residual is None


@pytest.mark.usefixtures("tiles_everywhere")
def test_long_rows_run_their_interior_tiles_in_a_loop(device: CPUDevice) -> None:
    """A 1-D convolution over 100 positions: the edge tiles are static, the tiles between them one loop."""
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 16, 100)).astype(np.float32), rng.standard_normal((32, 16, 5)).astype(np.float32)
    (got,), kernels = run_steps(device, lambda x, w: lax.conv_general_dilated(x, w, (1,), ((2, 2),)), x, w)
    (kernel,) = tiled(guarded(kernels))
    tile = render_tile._Tile(_FunctionBuilder(), kernel)
    height = tile.height
    interior = [start for start in range(0, 100 - height + 1, height) if tile.interior(start, height)]
    assert len(interior) >= 2 and 0 not in interior
    expected = direct_conv(x, w, (1,), ((2, 2),), (1,), (1,), 1)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-5 * max(1.0, float(np.abs(expected).max())))


def _guarded_kernel(condition: KExpr) -> Kernel:
    """sum over r0 < 70, r1 < 3 of where(condition, a[g0, g1 + r1, r0] * b[r0, r1, g2], -0.0): (3, 10, 20)."""
    a = load(0, alu("add", alu("add", alu("mul", alu("add", var("g1"), var("r1")), const(70, INDEX)), var("r0")),
                    alu("mul", var("g0"), const(12 * 70, INDEX))), FLOAT32)
    b = load(1, alu("add", alu("add", var("g2"), alu("mul", var("r1"), const(20, INDEX))),
                    alu("mul", var("r0"), const(60, INDEX))), FLOAT32)
    term = where(condition, alu("mul", a, b), const(-0.0, FLOAT32))
    return Kernel("r_sum_guarded", (3, 10, 20), (ShapedArray((3, 12, 70), FLOAT32), ShapedArray((70, 3, 20), FLOAT32)),
                  (ShapedArray((3, 10, 20), FLOAT32),), (KExpr("acc", FLOAT32),), (70, 3), "sum", term)


@pytest.mark.parametrize("name", ["row and outer", "first loop", "not affine", "row bound"])
def test_conditions_the_tile_cannot_bound_are_tested_per_term(name: str, tmp_path: Path) -> None:
    g0, g1, r0, r1 = var("g0"), var("g1"), var("r0"), var("r1")
    condition = {
        "row and outer": alu("lt", alu("add", alu("add", g0, g1), r1), const(9, INDEX)),  # row (g1) and outer (g0)
        "first loop": alu("ge", alu("add", g1, r0), const(5, INDEX)),  # bounds the blocked loop r0
        "not affine": alu("lt", alu("rem", alu("add", g1, r1), const(3, INDEX)), const(2, INDEX)),
        "row bound": alu("and", alu("ge", alu("add", g1, r1), const(2, INDEX)),
                         alu("lt", alu("add", g1, r1), const(10, INDEX))),  # a padding test: bounded statically
    }[name]
    kernel = _guarded_kernel(condition)
    assert render_tile._tileable(kernel)
    tiled = attrs.evolve(kernel, opts=(Opt("tile", 2, 16), Opt("upcast", 1, 4), Opt("split", 0, 16),
                                       Opt("thread", 0, 1)))
    tile = render_tile._Tile(_FunctionBuilder(), tiled)
    assert (tile.residual is None) == (name == "row bound")
    rng = np.random.default_rng(5)
    inputs = [rng.standard_normal(aval.shape).astype(np.float32) for aval in kernel.in_avals]
    outputs = [np.empty((3, 10, 20), np.float32)]
    CPUDevice(cache_dir=tmp_path).compile(tiled)(inputs, outputs)
    expected = evaluate_kernel(kernel, [x.astype(np.float64) for x in inputs])[0]
    np.testing.assert_allclose(outputs[0], np.asarray(expected).reshape(3, 10, 20), rtol=0, atol=1e-4)
