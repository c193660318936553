"""The blocked transpose (funcgrad/lower/render_transpose.py) against NumPy and the plain loops.

Elementwise kernels that read an operand contiguous along another axis than the output's last one
(a channels-last result read in NCHW order and back) are rendered in 16 x 16 blocks transposed in
registers; every value must equal the plain renderer's bit for bit (the arithmetic is the same, only
the order of the loads changes), on shapes with and without remainders, NaN and infinities included.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices.cpu import CPUDevice
from funcgrad.lower import render_transpose
from funcgrad.lower.kernel import Opt
from funcgrad.lower.optimize import check_opts, heuristic_opts, neighbours
from funcgrad.lower.render_llvm import render_llvm
from tests.lower.test_render_tile import kernels_of, run

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU code generation, whatever DEVICE says


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> CPUDevice:
    return CPUDevice(cache_dir=tmp_path_factory.mktemp("cache"))


def nchw_relu(x, b):  # noqa: ANN001, ANN201 - a channels-last (N, P, C) array read as (N, C, P), + bias, ReLU
    return fnp.maximum(fnp.transpose(x, (0, 2, 1)) + b[:, None], 0.0)


@pytest.mark.parametrize("lanes", [8, 16])
def test_shuffle_rounds_transpose_the_vectors(lanes: int) -> None:
    """The shuffle rounds (three on 8 vectors: the 8 x 8 float64 block; four on 16), simulated on NumPy
    vectors, turn rows into columns; a count of vectors that is not a power of two is refused."""
    matrix = np.arange(lanes * lanes).reshape(lanes, lanes)

    def shuffle(x: np.ndarray, y: np.ndarray, mask: str) -> np.ndarray:
        lanes = [int(part.split()[1]) for part in mask.strip("<>").split(",")]
        return np.concatenate([x, y])[lanes]

    rows = render_transpose.transpose_rows([matrix[j] for j in range(lanes)], shuffle)  # type: ignore[arg-type]
    np.testing.assert_array_equal(np.stack(rows), matrix.T)
    with pytest.raises(ValueError, match="power-of-two"):
        render_transpose.transpose_rows(["a", "b", "c"], lambda x, y, mask: x)


SHAPES = [(2, 64, 32), (3, 37, 50), (1, 16, 17), (2, 100, 16), (1, 15, 40)]  # whole blocks and remainders


@pytest.mark.parametrize("n,p,c", SHAPES, ids=lambda v: str(v))
def test_blocked_transpose_equals_the_plain_loops(device: CPUDevice, n: int, p: int, c: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, p, c)).astype(np.float32)
    b = rng.standard_normal(c).astype(np.float32)
    x[0, 3 % p, 5 % c] = np.nan
    x[-1, -1, 0] = np.inf
    (kernel,) = kernels_of(nchw_relu, x, b)
    assert render_transpose._transposed_loads(kernel, 1)
    blocked = attrs.evolve(kernel, opts=(Opt("transpose", 1, 16),))
    check_opts(blocked, blocked.opts)
    assert "shufflevector" in render_llvm(blocked) or min(p, c) < 16
    (got,) = run(device, blocked, [x, b])
    (plain,) = run(device, attrs.evolve(kernel, opts=()), [x, b])
    np.testing.assert_array_equal(got, plain)  # NaN in the same places, the same bits elsewhere
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(got.reshape(n, c, p), np.maximum(np.transpose(x, (0, 2, 1)) + b[:, None], 0))


def test_two_transposed_operands_and_a_contiguous_one(device: CPUDevice) -> None:
    """Two channels-last operands (each its own block buffer) and one already in the output's order,
    split over threads (the thread action's chunks of axis 0)."""
    rng = np.random.default_rng(1)
    x, y = (rng.standard_normal((4, 48, 32)).astype(np.float32) for _ in range(2))
    z = rng.standard_normal((4, 32, 48)).astype(np.float32)
    (kernel,) = kernels_of(lambda x, y, z: fnp.transpose(x, (0, 2, 1)) * fnp.transpose(y, (0, 2, 1)) - z, x, y, z)
    assert len(render_transpose._transposed_loads(kernel, 1)) == 2
    blocked = attrs.evolve(kernel, opts=(Opt("thread", 0, 2), Opt("transpose", 1, 16)))
    (got,) = run(device, blocked, [x, y, z])
    expected = np.transpose(x, (0, 2, 1)) * np.transpose(y, (0, 2, 1)) - z
    np.testing.assert_array_equal(got.reshape(expected.shape), expected)


def test_heuristic_takes_large_transposed_reads_only() -> None:
    x, b = np.ones((64, 576, 32), np.float32), np.ones(32, np.float32)
    (kernel,) = kernels_of(nchw_relu, x, b)
    assert render_transpose.transpose_opts(kernel) == (Opt("transpose", 1, 16),)
    assert heuristic_opts(kernel)[0] == Opt("transpose", 1, 16)
    around = neighbours(kernel, heuristic_opts(kernel))  # BEAM may go back to the plain loops
    assert around and all(not any(opt.action == "transpose" for opt in candidate) for candidate in around)
    (small,) = kernels_of(nchw_relu, np.ones((1, 20, 16), np.float32), np.ones(16, np.float32))
    assert render_transpose.transpose_opts(small) is None  # stays in L1: nothing to gain
    (plain,) = kernels_of(lambda x: x * 2.0 + 1.0, np.ones((64, 32, 576), np.float32))
    assert render_transpose.transpose_opts(plain) is None
    # a pooling window's div/rem index beside the transposed read would gather: left to the plain loops
    pooled = np.ones((64, 32, 12, 12), np.float32)

    def unpool(x, g):  # noqa: ANN001, ANN202
        return fnp.transpose(x, (0, 3, 1, 2)) * fnp.repeat(fnp.repeat(g, 2, axis=2), 2, axis=3)

    kernel = kernels_of(unpool, np.ones((64, 24, 24, 32), np.float32), pooled)[-1]
    assert render_transpose.transpose_opts(kernel) is None


def test_invalid_transpose_actions_raise() -> None:
    x, b = np.ones((2, 64, 32), np.float32), np.ones(32, np.float32)
    (kernel,) = kernels_of(nchw_relu, x, b)
    with pytest.raises(ValueError, match="output axis a in 0..1"):
        check_opts(kernel, (Opt("transpose", 2, 16),))
    with pytest.raises(ValueError, match="one transpose action"):
        check_opts(kernel, (Opt("swap", 1, 2), Opt("transpose", 1, 16)))
    (plain,) = kernels_of(lambda x, b: x + b[None, :, None], np.ones((2, 64, 32), np.float32), np.ones(64, np.float32))
    assert len(plain.shape) == 3
    with pytest.raises(ValueError, match="nothing to transpose"):
        check_opts(plain, (Opt("transpose", 1, 16),))
    (summed,) = kernels_of(lambda x: x.sum(axis=1), np.ones((2, 64, 32), np.float32))
    with pytest.raises(ValueError, match="elementwise"):
        check_opts(summed, (Opt("transpose", 1, 16),))


def test_transposes_through_jit_and_grad() -> None:
    """End to end: a channels-last convolution's NCHW read and its gradient going back, under jit,
    against NumPy in float64."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 2, 20, 20)).astype(np.float32)
    w = rng.standard_normal((32, 2, 3, 3)).astype(np.float32)

    def loss(x, w):  # noqa: ANN001, ANN202
        y = fnp.maximum(fg.nn.functional.conv2d(x, w), 0.0)
        return (y * y).sum()

    lowered = fg.jit(fg.grad(loss, argnums=1)).lower(x, w)
    value = fg.jit(loss)(x, w)
    grad = np.asarray(fg.jit(fg.grad(loss, argnums=1))(x, w), np.float64)
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    windows = np.lib.stride_tricks.sliding_window_view(x64, (3, 3), axis=(2, 3))  # (8, 2, 18, 18, 3, 3)
    y = np.maximum(np.einsum("ncijkl,ockl->noij", windows, w64), 0)
    np.testing.assert_allclose(float(value), (y * y).sum(), rtol=1e-4)
    np.testing.assert_allclose(grad, np.einsum("noij,ncijkl->ockl", 2 * y, windows), rtol=2e-4, atol=2e-3)
    transposed = [info.kernel.name for info in lowered.kernels if "opts: transpose(1, 16)" in info.source]
    assert len(transposed) == 2  # the ReLU's NCHW read of the channels-last product, and its gradient back
