"""The register-tiled micro-kernel (funcgrad/lower/render_tile.py) against NumPy in float64.

Kernels come from the schedule of small programs (matrix products with epilogues, batched products,
convolutions) and are compiled with explicit tile actions, every tile shape of ``TILES``, with
remainder rows and columns (masked vectors) and short reduction blocks, so each code path of the
renderer runs on shapes that do not divide evenly.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices.cpu import CPUDevice
from funcgrad.lower import render_tile
from funcgrad.lower.kernel import Kernel, Opt, evaluate_kernel
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.schedule import KernelStep, inline_calls, schedule

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU code generation, whatever DEVICE says


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> CPUDevice:
    return CPUDevice(cache_dir=tmp_path_factory.mktemp("cache"))


def kernels_of(f, *args) -> list[Kernel]:  # noqa: ANN001
    ir = fg.make_ir(f)(*args)
    return [step.kernel for step in schedule(inline_calls(ir)) if isinstance(step, KernelStep)]


def tiled(kernel: Kernel, width: int, height: int, block: int = 0) -> Kernel:
    rows, last = len(kernel.shape) - 2, len(kernel.shape) - 1
    opts = (Opt("tile", last, width), Opt("upcast", rows, height)) + ((Opt("split", 0, block),) if block else ())
    return attrs.evolve(kernel, opts=opts)


def run(device: CPUDevice, kernel: Kernel, inputs: list[np.ndarray]) -> list[np.ndarray]:
    outputs = [np.empty(aval.shape, aval.dtype) for aval in kernel.out_avals]
    device.compile(kernel)(inputs, outputs)
    return outputs


def product_kernel(m: int, k: int, n: int, epilogue: bool = False) -> Kernel:
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    bias = np.ones(n, np.float32)
    if epilogue:
        return kernels_of(lambda a, b, bias: fnp.maximum(a @ b + bias, 0.0), a, b, bias)[0]
    return kernels_of(lambda a, b: a @ b, a, b)[0]


def random_inputs(kernel: Kernel, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(aval.shape).astype(aval.dtype) for aval in kernel.in_avals]


def assert_matches_reference(kernel: Kernel, got: list[np.ndarray], inputs: list[np.ndarray]) -> None:
    """Compare with the kernel evaluator run in float64 (tolerance: float32 rounding of the sum)."""
    wide = attrs.evolve(kernel, opts=None)
    expected = evaluate_kernel(wide, [x.astype(np.float64) for x in inputs])
    terms = int(np.prod(kernel.reduce_shape))
    for actual, want in zip(got, expected):
        want = np.asarray(want, np.float64).reshape(actual.shape)
        scale = np.sqrt(terms) * 4 * np.finfo(np.float32).eps * max(1.0, float(np.abs(want).max()))
        np.testing.assert_allclose(actual.astype(np.float64), want, rtol=0, atol=scale)


SHAPES = [(37, 19, 16), (50, 33, 20), (29, 64, 70), (14, 300, 64), (100, 5, 130), (1, 40, 48), (23, 7, 97),
          (40, 70, 10)]  # the last: fewer columns than a vector (one masked vector)


@pytest.mark.parametrize("m,k,n", SHAPES, ids=lambda v: str(v))
def test_every_tile_shape_matches_the_reference(device: CPUDevice, m: int, k: int, n: int) -> None:
    kernel = product_kernel(m, k, n, epilogue=True)
    inputs = random_inputs(kernel)
    for width, height in render_tile.TILES:
        for block in (0, 3):  # the default block, and blocks of 3 that leave a short last block
            variant = tiled(kernel, width, height, block)
            assert "fmuladd" in render_llvm(variant)
            assert_matches_reference(variant, run(device, variant, inputs), inputs)


def test_batched_product_rows_cross_the_batch_axis(device: CPUDevice) -> None:
    a, b = np.ones((3, 17, 20), np.float32), np.ones((3, 20, 40), np.float32)
    kernel = kernels_of(lambda a, b: fnp.einsum("bij,bjk->bik", a, b), a, b)[0]
    assert kernel.shape == (3, 17, 40)
    inputs = random_inputs(kernel, seed=1)
    for width, height in ((32, 14), (16, 16)):
        variant = tiled(kernel, width, height)
        assert_matches_reference(variant, run(device, variant, inputs), inputs)


def test_convolution_kernels_tile(device: CPUDevice) -> None:
    """A channels-last convolution (forward) and the product behind its weight gradient."""
    x = np.ones((2, 3, 9, 9), np.float32)
    w = np.ones((20, 3, 3, 3), np.float32)

    def loss(x, w):  # noqa: ANN001, ANN202
        return (fg.nn.functional.conv2d(x, w) ** 2).sum()

    kernels = kernels_of(fg.grad(loss, argnums=(0, 1)), x, w)
    candidates = [kn for kn in kernels if render_tile._tileable(kn) and kn.shape[-1] >= render_tile.LANES]
    assert candidates, "expected a product-shaped convolution kernel"
    for kernel in candidates:
        inputs = random_inputs(kernel, seed=2)
        variant = tiled(kernel, 32, 14, block=2)
        assert_matches_reference(variant, run(device, variant, inputs), inputs)


def test_tiled_programs_match_numpy_through_jit(monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: with the size threshold lowered, jit picks tiles for small products, and the
    results (forward and gradients) match NumPy."""
    monkeypatch.setattr(render_tile, "TILE_MIN_WORK", 0)
    rng = np.random.default_rng(3)
    a = rng.standard_normal((45, 70)).astype(np.float32)
    b = rng.standard_normal((70, 53)).astype(np.float32)

    def f(a, b):  # noqa: ANN001, ANN202
        return fnp.tanh(a @ b).sum()

    value, (ga, gb) = fg.jit(fg.value_and_grad(f, argnums=(0, 1)))(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    t = np.tanh(a64 @ b64)
    np.testing.assert_allclose(float(value), t.sum(), rtol=1e-5)
    np.testing.assert_allclose(np.asarray(ga), (1 - t**2) @ b64.T, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(np.asarray(gb), a64.T @ (1 - t**2), rtol=1e-4, atol=1e-4)
    lowered = fg.jit(lambda a, b: a @ b).lower(a, b)
    assert any("fmuladd" in info.source for info in lowered.kernels)


def test_signed_zero_nan_and_inf(device: CPUDevice) -> None:
    kernel = product_kernel(20, 9, 35)
    a = -np.zeros((20, 9), np.float32)
    b = np.ones((9, 35), np.float32)
    a[3, 4] = np.nan
    a[5, 0] = np.inf
    variant = tiled(kernel, 32, 14)
    (out,) = run(device, variant, [a, b])
    (want,) = run(device, attrs.evolve(kernel, opts=None), [a, b])  # the plain loops: sums start at -0.0
    assert np.isnan(out[3]).all() and np.isinf(out[5]).all()
    rows = [r for r in range(20) if r not in (3, 5)]
    assert (np.signbit(out[rows]) == np.signbit(want[rows])).all() and (out[rows] == 0).all()


def test_long_sums_keep_two_level_precision(device: CPUDevice) -> None:
    """A sum over 2^17 terms in blocks: as accurate as the plain renderer's partial sums."""
    a = np.ones((16, 1 << 17), np.float32)
    b = np.ones((1 << 17, 16), np.float32)
    kernel = kernels_of(lambda a, b: a @ b, a, b)[0]
    rng = np.random.default_rng(4)
    inputs = [rng.uniform(0.5, 1.5, x.shape).astype(np.float32) for x in (a, b)]
    expected = inputs[0].astype(np.float64) @ inputs[1].astype(np.float64)
    (tile_out,) = run(device, tiled(kernel, 16, 16), inputs)
    tile_error = np.abs(tile_out - expected).max() / np.abs(expected).max()
    assert tile_error < 1e-6


def test_tile_opts_choose_only_product_shaped_float_sums() -> None:
    big = product_kernel(128, 256, 300)  # rows 1200 bytes apart, 128 of them: read in place
    assert render_tile.tile_opts(big) == (Opt("tile", 1, 64), Opt("upcast", 0, 6))
    assert render_tile.tile_opts(product_kernel(4, 4, 4)) is None  # too small to gain
    # 10 columns: tiled transposed, one vector along axis 0 by 10 register rows; small (1.3M
    # multiply-adds), so on one thread: a worker's wake-up costs what it saves
    assert render_tile.tile_opts(product_kernel(512, 256, 10)) == (Opt("tile", 0, 16), Opt("upcast", 1, 10),
                                                                   Opt("thread", 0, 1))
    assert render_tile.tile_opts(product_kernel(40, 256, 10)) is None  # too few rows to transpose, too small
    # 10 rows: one tile of all 10 (32 columns wide), not a 6-row tile and 4 single rows
    assert render_tile.tile_opts(product_kernel(10, 256, 576)) == (Opt("tile", 1, 32), Opt("upcast", 0, 10),
                                                                   Opt("thread", 0, 1))
    assert render_tile.tile_opts(product_kernel(512, 256, 7)) is None  # under 8 columns
    ints = kernels_of(lambda a, b: a @ b, np.ones((128, 128), np.int32), np.ones((128, 128), np.int32))[0]
    assert render_tile.tile_opts(ints) is None
    # a sum whose column-varying operand is not contiguous along the columns (a transposed read) is packed
    strided = kernels_of(lambda a, b: a @ b.T, np.ones((256, 256), np.float32), np.ones((256, 256), np.float32))[0]
    assert render_tile._packable(strided) and not render_tile._packable(big)
    # its threads split the columns (swap(0, 1)), so each packs only its own panels
    assert render_tile.tile_opts(strided) == (Opt("tile", 1, 64), Opt("upcast", 0, 6), Opt("swap", 0, 1))
    # ... but not when the column factor also moves with the rows (no shared panel to pack)
    a = np.ones((128, 128), np.float32)
    both = kernels_of(lambda a, b, c: (a[:, None, :] * b[None, :, :] * c[:, :, None]).sum(-1), a, a, a)[0]
    assert not render_tile._packable(both) and render_tile.tile_opts(both) is None
    with pytest.raises(ValueError, match="cannot be register-tiled transposed"):
        render_tile.check_tile_opts(both, (Opt("tile", 0, 16), Opt("upcast", 1, 8)))
    assert render_tile.tile_candidates(big)
    assert all(render_tile.check_tile_opts(big, opts) is None for opts in render_tile.tile_candidates(big))


@pytest.mark.parametrize(("m", "k", "n", "packed"), [
    (256, 256, 256, True),  # 256 rows: the copy is paid for
    (64, 512, 512, True),  # rows 2 KB apart: a panel's block lands on 8 of L1's 64 sets
    (32, 400, 768, True),  # 3 KB apart: 16 sets
    (96, 200, 1000, False),  # 4000 bytes apart, 96 rows: read in place
    (128, 700, 400, False),
    (128, 64, 192, False),
])
def test_contiguous_column_operands_are_packed_when_rows_or_their_stride_call_for_it(
        device: CPUDevice, m: int, k: int, n: int, packed: bool) -> None:
    """``_packs_contiguous``: a contiguous column operand is packed per panel when enough rows share the copy or
    when its rows' stride maps a panel's block onto a few L1 sets; packed or not, the values match."""
    assert not render_tile._packs_contiguous(product_kernel(64, 16, 512))  # 32 KB: stays in L1 whatever its sets
    kernel = product_kernel(m, k, n)
    assert render_tile._packs_contiguous(kernel) is packed and render_tile._packable(kernel) is packed
    opts = render_tile.tile_opts(kernel)
    assert opts is not None and not any(opt.action == "swap" for opt in opts)  # threads take rows
    chosen = attrs.evolve(kernel, opts=opts)
    inputs = random_inputs(kernel, seed=21)
    assert_matches_reference(chosen, run(device, chosen, inputs), inputs)


def test_one_block_stores_its_sums(device: CPUDevice) -> None:
    """A reduction that fits one block stores the register sums (no buffer to clear and add to), signed
    zeros included (-0.0 + x is x): a sum of -0.0 products stays -0.0, as the plain loops give."""
    kernel = product_kernel(50, 40, 70)
    one, two = tiled(kernel, 64, 6, block=40), tiled(kernel, 64, 6, block=20)
    assert "tclear" not in render_llvm(one) and "tclear" in render_llvm(two)
    inputs = random_inputs(kernel, seed=16)
    inputs[0][3, :] = 0.0
    inputs[1][:, :] = -np.abs(inputs[1])  # row 3: +0.0 x negative = -0.0 products
    (plain,) = run(device, attrs.evolve(kernel, opts=None), inputs)
    for variant in (one, two):
        got = run(device, variant, inputs)
        assert_matches_reference(variant, got, inputs)
        np.testing.assert_array_equal(np.signbit(got[0][3]), np.signbit(plain[3]))
    assert np.signbit(plain[3]).all()


def test_invalid_tile_actions_raise() -> None:
    kernel = product_kernel(64, 64, 64)
    with pytest.raises(ValueError, match="multiple of 16"):
        render_tile.check_tile_opts(kernel, (Opt("tile", 1, 20), Opt("upcast", 0, 4)))
    with pytest.raises(ValueError, match="no reorder action"):
        render_tile.check_tile_opts(kernel, (Opt("tile", 1, 32), Opt("upcast", 0, 4), Opt("reorder")))
    ints = kernels_of(lambda a, b: a @ b, np.ones((64, 64), np.int32), np.ones((64, 64), np.int32))[0]
    with pytest.raises(ValueError, match="cannot be register-tiled"):
        render_tile.check_tile_opts(ints, (Opt("tile", 1, 32), Opt("upcast", 0, 4)))


def test_one_row_sums_tile_on_one_thread(device: CPUDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    """A per-feature sum over a batch of channels-last images (BatchNorm's statistics): a rank-1
    output tiled as one row, with a NaN-propagating max in the summand and partial blocks."""
    x = np.ones((64, 5, 5, 48), np.float32)
    mean = np.ones(48, np.float32)
    kernel = kernels_of(lambda x, mean: (fnp.maximum(x - mean, 0.0) ** 2).sum(axis=(0, 1, 2)), x, mean)[0]
    assert kernel.shape == (48,)
    monkeypatch.setattr(render_tile, "TILE_MIN_WORK", 0)
    opts = render_tile.tile_opts(kernel)
    assert opts == (Opt("tile", 0, 48), Opt("thread", 0, 1))
    inputs = random_inputs(kernel, seed=8)
    inputs[0][3, 2, 1, 5] = np.nan
    for block in (0, 7):
        variant = attrs.evolve(kernel, opts=opts + ((Opt("split", 0, block),) if block else ()))
        (out,) = run(device, variant, inputs)
        assert np.isnan(out[5]) and np.isfinite(np.delete(out, 5)).all()
        inputs_ok = [inputs[0].copy(), inputs[1]]
        inputs_ok[0][3, 2, 1, 5] = 0.0
        assert_matches_reference(variant, run(device, variant, inputs_ok), inputs_ok)
    with pytest.raises(ValueError, match="one thread"):
        render_tile.check_tile_opts(kernel, (Opt("tile", 0, 48), Opt("thread", 0, 2)))


def test_beam_neighbours_of_a_tile_are_other_tiles() -> None:
    from funcgrad.lower.optimize import check_opts, heuristic_opts, neighbours
    kernel = product_kernel(256, 256, 256)
    base = heuristic_opts(kernel)
    around = neighbours(kernel, base)
    assert around and base not in around
    for candidate in around:
        check_opts(kernel, candidate)
        assert any(opt.action == "tile" for opt in candidate)
        assert [o for o in candidate if o.action == "thread"] == [o for o in base if o.action == "thread"]


TRANSPOSED_SHAPES = [(37, 19, 16), (50, 33, 20), (29, 64, 70), (14, 300, 64), (23, 7, 97), (40, 70, 10), (9, 10, 130)]


@pytest.mark.parametrize("m,k,n", TRANSPOSED_SHAPES, ids=lambda v: str(v))
def test_packed_transposed_products_match_the_reference(device: CPUDevice, m: int, k: int, n: int) -> None:
    """``relu(A) @ B.T + bias``: the column factor ``B[j, k]`` strides along the columns, so each panel
    is packed; every tile shape, full and short reduction blocks, masked last columns, remainder rows."""
    a, b, bias = np.ones((m, k), np.float32), np.ones((n, k), np.float32), np.ones(n, np.float32)
    kernel = kernels_of(lambda a, b, bias: fnp.maximum(a, 0.0) @ b.T + bias, a, b, bias)[0]
    assert render_tile._packable(kernel)
    inputs = random_inputs(kernel, seed=9)
    for width, height in render_tile.TILES:
        for block in (0, 3):
            variant = tiled(kernel, width, height, block)
            source = render_llvm(variant)
            assert "%inpack" in source and "fmuladd" in source
            # 16 x 16 blocks of the panel are packed transposed in registers, the rest one value at a time
            # (blocks of fewer than 16 terms have none: no transposes that could never run)
            whole = n >= 16 and min(block or render_tile.PACKED_BLOCK_TERMS, k) >= 16
            assert ("<i32 0, i32 16, i32 2, i32 18," in source) == whole, (width, block)  # a transpose round
            assert_matches_reference(variant, run(device, variant, inputs), inputs)


def test_packed_column_factor_may_be_an_expression(device: CPUDevice) -> None:
    """The packed factor is evaluated, not copied: ``A @ max(B * 0.5 - 1, -0.75).T``, NaN and inf
    propagating through it."""
    a, b = np.ones((30, 40), np.float32), np.ones((50, 40), np.float32)
    kernel = kernels_of(lambda a, b: a @ fnp.maximum(b * 0.5 - 1.0, -0.75).T, a, b)[0]
    assert render_tile._packable(kernel)
    inputs = random_inputs(kernel, seed=10)
    variant = tiled(kernel, 32, 14, block=7)
    assert_matches_reference(variant, run(device, variant, inputs), inputs)
    inputs[0][4, 3] = np.nan
    inputs[1][7, 2] = np.inf
    (out,) = run(device, variant, inputs)
    (want,) = run(device, attrs.evolve(kernel, opts=None), inputs)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(want))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(want))
    assert np.isnan(out[4]).all() and np.isinf(out[:, 7]).any()


def test_transposed_products_and_gradients_through_jit(monkeypatch: pytest.MonkeyPatch) -> None:
    """The MLP's input gradient ``dY @ W.T`` (and a short 10-term one, as the output layer's) run
    packed under jit and match NumPy in float64."""
    rng = np.random.default_rng(11)
    x = rng.standard_normal((64, 96)).astype(np.float32)
    w1 = rng.standard_normal((96, 80)).astype(np.float32)
    w2 = rng.standard_normal((80, 10)).astype(np.float32)
    monkeypatch.setattr(render_tile, "TILE_MIN_WORK", 0)

    def loss(x, w1, w2):  # noqa: ANN001, ANN202
        return (fnp.maximum(x @ w1, 0.0) @ w2).sum() ** 2 / 1e4

    grads = fg.jit(fg.grad(loss, argnums=(0, 1, 2)))
    gx, g1, g2 = (np.asarray(g, np.float64) for g in grads(x, w1, w2))
    x64, w164, w264 = (v.astype(np.float64) for v in (x, w1, w2))
    h = x64 @ w164
    total = (np.maximum(h, 0) @ w264).sum()
    dout = np.full((64, 10), 2 * total / 1e4)
    dh = (dout @ w264.T) * (h > 0)
    np.testing.assert_allclose(g2, np.maximum(h, 0).T @ dout, rtol=2e-4, atol=1e-3)
    np.testing.assert_allclose(g1, x64.T @ dh, rtol=2e-4, atol=1e-3)
    np.testing.assert_allclose(gx, dh @ w164.T, rtol=2e-4, atol=1e-3)
    lowered = fg.jit(fg.grad(loss, argnums=0)).lower(x, w1, w2)
    assert any("%inpack" in info.source for info in lowered.kernels)


ROW_PACKED_SHAPES = [(37, 19, 16), (14, 300, 64), (23, 7, 97), (40, 70, 10), (100, 33, 130)]


def row_packed_kernels(m: int, k: int, n: int) -> list[Kernel]:
    """``relu(A) @ B + bias`` (the row factor's loads run along the terms: packed ``[row][term]``) and
    ``relu(A).T @ G`` (they run along the rows: packed ``[term][row]``), as an MLP's next layer and
    weight gradient."""
    a, b, bias, at = (np.ones(s, np.float32) for s in ((m, k), (k, n), (n,), (k, m)))
    forward = kernels_of(lambda a, b, bias: fnp.maximum(a, 0.0) @ b + bias, a, b, bias)[0]
    gradient = kernels_of(lambda at, g: fnp.maximum(at, 0.0).T @ g, at, b)[0]
    return [forward, gradient]


@pytest.mark.parametrize("m,k,n", ROW_PACKED_SHAPES, ids=lambda v: str(v))
def test_computed_row_factors_are_packed_per_chunk(device: CPUDevice, m: int, k: int, n: int) -> None:
    """A row factor that is computed (``max(h, 0)``) is evaluated once per chunk of rows into a stack
    buffer: every tile shape, short blocks, short chunks over several threads, remainder rows and
    masked columns, both buffer layouts; NaN propagates through the packed factor."""
    for kernel, layout in zip(row_packed_kernels(m, k, n), ("[row][term]", "[term][row]")):
        inputs = random_inputs(kernel, seed=12)
        clean = [x.copy() for x in inputs]
        inputs[0].flat[5] = np.nan
        (want,) = run(device, attrs.evolve(kernel, opts=None), inputs)
        extras = ((), (Opt("split", 0, 3),), (Opt("tile", 0, 12), Opt("thread", 0, 3)), (Opt("thread", 0, 2),))
        for (width, height), extra in zip(render_tile.TILES, extras):
            variant = attrs.evolve(kernel, opts=(*tiled(kernel, width, height).opts, *extra))
            assert "%inrows" in render_llvm(variant), layout
            (got,) = run(device, variant, inputs)
            np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
            assert_matches_reference(variant, run(device, variant, clean), clean)


def test_row_factor_packing_needs_a_computed_factor_that_fits() -> None:
    plain = product_kernel(256, 256, 256)
    assert "%inrows" not in render_llvm(attrs.evolve(plain, opts=render_tile.tile_opts(plain)))
    forward, gradient = row_packed_kernels(256, 256, 256)
    for kernel in (forward, gradient):
        assert "%inrows" in render_llvm(attrs.evolve(kernel, opts=render_tile.tile_opts(kernel)))
    # 1024 terms: the default chunk shrinks to 60 rows (240 KB packed); a chunk of 96 rows (384 KB) is
    # over ROW_PACK_BYTES and reads the factor unpacked
    long_sum = row_packed_kernels(256, 1024, 64)[0]
    opts = render_tile.tile_opts(long_sum)
    assert opts is not None and render_tile.tile_shape(attrs.evolve(long_sum, opts=opts))[2] == 60
    assert "%inrows" in render_llvm(attrs.evolve(long_sum, opts=opts))
    assert "%inrows" not in render_llvm(attrs.evolve(long_sum, opts=(*opts, Opt("tile", 0, 96))))


@pytest.mark.parametrize("threads", [2, 3, 5])
def test_threads_may_split_the_columns(device: CPUDevice, threads: int) -> None:
    """``swap(0, 1)`` on a 2-D tile: each thread takes a range of column panels (the last one, masked,
    by the thread whose range ends there; with more threads than panels some get none) over every
    row, for a packed ``A @ B.T`` and a plain ``A @ B``."""
    a, b, bt = np.ones((45, 70), np.float32), np.ones((70, 130), np.float32), np.ones((130, 70), np.float32)
    for kernel in (kernels_of(lambda a, b: a @ b.T, a, bt)[0], kernels_of(lambda a, b: a @ b, a, b)[0]):
        inputs = random_inputs(kernel, seed=13)
        for width, height in ((64, 6), (16, 16)):
            opts = (*tiled(kernel, width, height).opts, Opt("swap", 0, 1), Opt("thread", 0, threads))
            variant = attrs.evolve(kernel, opts=opts)
            assert_matches_reference(variant, run(device, variant, inputs), inputs)


def test_column_split_is_checked() -> None:
    kernel = product_kernel(64, 64, 64)
    render_tile.check_tile_opts(kernel, (Opt("tile", 1, 32), Opt("upcast", 0, 4), Opt("swap", 0, 1)))
    batched = kernels_of(lambda a, b: fnp.einsum("bij,bjk->bik", a, b), np.ones((3, 17, 20), np.float32),
                         np.ones((3, 20, 40), np.float32))[0]
    with pytest.raises(ValueError, match="swap"):
        render_tile.check_tile_opts(batched, (Opt("tile", 2, 32), Opt("upcast", 1, 4), Opt("swap", 0, 1)))


def test_large_contiguous_products_pack_their_panels(device: CPUDevice, monkeypatch: pytest.MonkeyPatch) -> None:
    """A product whose column operand is far beyond L2 packs it although it is contiguous, with long
    chunks and short blocks (the thresholds lowered here so a small ragged product takes that path)."""
    kernel = product_kernel(130, 150, 100, epilogue=True)
    assert not render_tile._packable(kernel)
    monkeypatch.setattr(render_tile, "LARGE_ROWS", 100)
    monkeypatch.setattr(render_tile, "LARGE_BYTES", 1 << 14)
    monkeypatch.setattr(render_tile, "SMALL_TILE_WORK", 0)
    assert render_tile._packable(kernel)
    opts = render_tile.tile_opts(kernel)
    assert opts == (Opt("tile", 1, 64), Opt("upcast", 0, 6), Opt("tile", 0, 516))
    assert render_tile.tile_shape(attrs.evolve(kernel, opts=opts)) == (64, 6, 516, 128)
    inputs = random_inputs(kernel, seed=14)
    for extra in ((), (Opt("thread", 0, 2),), (Opt("tile", 0, 12), Opt("split", 0, 5), Opt("thread", 0, 3))):
        variant = attrs.evolve(kernel, opts=(*opts, *extra) if not extra or extra[0].action == "thread"
                               else (*tiled(kernel, 64, 6).opts, *extra))
        assert "%inpack" in render_llvm(variant)
        assert_matches_reference(variant, run(device, variant, inputs), inputs)


TRANSPOSED_TILE_SHAPES = [(70, 19, 10), (100, 300, 8), (64, 40, 15), (129, 7, 12)]


@pytest.mark.parametrize("m,k,n", TRANSPOSED_TILE_SHAPES, ids=lambda v: str(v))
def test_narrow_products_tile_transposed(device: CPUDevice, m: int, k: int, n: int) -> None:
    """Fewer than 16 columns: vectors run along axis 0 (``tile(0, w) upcast(1, n)``), one register
    row per output column. ``relu(X).T @ Y + bias`` reads its vectors directly; ``relu(A) @ B + bias``
    packs ``relu(A)`` in transposed 16 x 16 blocks (the max computed on the transposed vectors). Masked
    last panels, remainder terms, short blocks, and threads splitting axis 0 (some with no panel)."""
    x, y, a, b, bias = (np.ones(s, np.float32) for s in ((k, m), (k, n), (m, k), (k, n), (n,)))
    direct = kernels_of(lambda x, y, bias: fnp.maximum(x, 0.0).T @ y + bias, x, y, bias)[0]
    packed = kernels_of(lambda a, b, bias: fnp.maximum(a, 0.0) @ b + bias, a, b, bias)[0]
    for kernel in (direct, packed):
        assert render_tile._transposable(kernel)
        inputs = random_inputs(kernel, seed=15)
        for width, extra in ((16, ()), (32, (Opt("thread", 0, 3),)), (16, (Opt("split", 0, 5), Opt("thread", 0, 9)))):
            variant = attrs.evolve(kernel, opts=(Opt("tile", 0, width), Opt("upcast", 1, n), *extra))
            source = render_llvm(variant)
            assert ("%inpack" in source) == (kernel is packed)
            if kernel is packed and min(k, render_tile.tile_shape(variant)[3]) >= 16:  # 16 terms in a block
                assert "<i32 0, i32 16, i32 2, i32 18," in source  # a transpose round
            assert_matches_reference(variant, run(device, variant, inputs), inputs)


@st.composite
def tiled_products(draw: st.DrawFn) -> tuple[str, Kernel, tuple[Opt, ...]]:
    """A 2-D product (plain, transposed operand, computed row factor, narrow) and random tile actions
    valid for it: shape, chunk, block, threads, threads over the columns, the transposed tile."""
    kind = draw(st.sampled_from(["a @ b", "a @ b.T", "relu(a) @ b", "relu(a).T @ b", "narrow"]))
    m, k = draw(st.integers(1, 90)), draw(st.integers(1, 70))
    n = draw(st.integers(8, 15)) if kind == "narrow" else draw(st.integers(16, 140))
    first = np.ones((k, m) if kind == "relu(a).T @ b" else (m, k), np.float32)
    second = np.ones((n, k) if kind == "a @ b.T" else (k, n), np.float32)
    f = {"a @ b": lambda a, b: a @ b, "a @ b.T": lambda a, b: a @ b.T,
         "relu(a) @ b": lambda a, b: fnp.maximum(a, 0.0) @ b, "relu(a).T @ b": lambda a, b: fnp.maximum(a, 0.0).T @ b,
         "narrow": lambda a, b: fnp.maximum(a, 0.0) @ b}[kind]
    kernel = kernels_of(f, first, second)[0]
    transposed = kind == "narrow" and m >= 16 and draw(st.booleans())
    width = draw(st.sampled_from([16, 32]) if transposed else st.sampled_from([w for w, _ in render_tile.TILES]))
    height = n if transposed else draw(st.integers(1, 16))
    opts = [Opt("tile", 0, width), Opt("upcast", 1, height)] if transposed else \
        [Opt("tile", 1, width), Opt("upcast", 0, height)]
    if draw(st.booleans()):
        opts.append(Opt("tile", 1 if transposed else 0, height * draw(st.integers(1, 8))))  # rows per chunk
    if draw(st.booleans()):
        opts.append(Opt("split", 0, draw(st.integers(1, 80))))  # terms per block
    if draw(st.booleans()):
        opts.append(Opt("thread", 0, draw(st.integers(1, 5))))
    if not transposed and draw(st.booleans()):
        opts.append(Opt("swap", 0, 1))  # threads take column panels
    return kind, kernel, tuple(opts)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=tiled_products(), seed=st.integers(0, 2**16))
def test_random_tile_actions_match_the_reference(device: CPUDevice, case: tuple[str, Kernel, tuple[Opt, ...]],
                                                 seed: int) -> None:
    kind, kernel, opts = case
    if not render_tile._tileable(kernel) and not render_tile._transposable(kernel):
        return  # nothing to tile (a column factor that moves with the rows as well)
    variant = attrs.evolve(kernel, opts=opts)
    render_tile.check_tile_opts(kernel, opts)
    inputs = random_inputs(kernel, seed=seed)
    assert_matches_reference(variant, run(device, variant, inputs), inputs)
