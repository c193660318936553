"""A convolution over a dilated lhs (a strided convolution's input gradient) runs as one product per output
phase over the undilated lhs (``conv._phase_convolutions``), not over the lhs with its inserted zeros:
results against the reference interpreter (forward, and the strided convolution's gradients against
float64 finite differences), and the multiply-adds its products do."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import lax
from funcgrad.ir.interpreter import eval_ir

CASES = [  # (N, C, spatial, O, kernel, lhs dilation, padding per axis, groups)
    (2, 4, (9, 7), 6, (3, 3), (2, 2), ((2, 1), (1, 2)), 1),
    (1, 2, (8, 8), 4, (3, 3), (2, 2), ((0, 0), (0, 0)), 1),
    (2, 4, (10, 9), 4, (5, 5), (3, 3), ((3, 2), (2, 3)), 2),
    (1, 3, (7, 7), 2, (1, 1), (2, 2), ((0, 0), (0, 0)), 1),   # phases without a tap: zeros
    (1, 2, (6, 5), 3, (2, 2), (2, 1), ((1, 1), (1, 1)), 1),   # one axis dilated
    (2, 32, (8, 8), 32, (3, 3), (2, 2), ((2, 1), (2, 1)), 1),  # channels-last products
    (2, 3, (11,), 5, (4,), (3,), ((-1, 2),), 1),             # 1-D, a cropping pad
]


def _conv(dilation: tuple[int, ...], padding: Any, groups: int) -> Any:
    return lambda x, w: lax.conv_general_dilated(x, w, (1,) * len(dilation), padding, lhs_dilation=dilation,
                                                 feature_group_count=groups)


@pytest.mark.parametrize("n, c, spatial, o, kernel, dilation, padding, groups", CASES)
def test_dilated_lhs_convolution_matches_the_reference(n: int, c: int, spatial: tuple[int, ...], o: int,
                                                         kernel: tuple[int, ...], dilation: tuple[int, ...],
                                                         padding: Any, groups: int) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, c, *spatial)).astype(np.float32)
    w = rng.standard_normal((o, c // groups, *kernel)).astype(np.float32)
    conv = _conv(dilation, padding, groups)
    got = fg.jit(conv)(fnp.asarray(x), fnp.asarray(w)).numpy()
    (want,) = eval_ir(fg.make_ir(conv)(fg.Tensor(x), fg.Tensor(w)), [x, w])
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, atol=1e-5 * max(1.0, float(np.abs(want).max())), rtol=0)


def test_products_skip_the_inserted_zeros() -> None:
    x, w = np.zeros((2, 8, 10, 10), np.float32), np.zeros((16, 8, 3, 3), np.float32)
    kernels = fg.jit(_conv((2, 2), ((2, 2), (2, 2)), 1)).lower(x, w).kernels
    products = [k.kernel for k in kernels if k.kernel.reduce_op == "sum" and len(k.kernel.shape) >= 3]
    macs = sum(int(np.prod(k.shape)) * int(np.prod(k.reduce_shape)) for k in products)
    dense = 2 * 16 * 21 * 21 * 8 * 9  # the output (2, 16, 21, 21) times 8 channels x 9 taps of the dilated lhs
    assert len(products) == 4 and macs < 0.35 * dense, (len(products), macs, dense)


@pytest.mark.parametrize("stride, size", [(2, 9), (3, 11)])
def test_strided_convolution_gradients_match_finite_differences(stride: int, size: int) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, size, size)).astype(np.float32)
    w = (rng.standard_normal((4, 3, 3, 3)) / 3).astype(np.float32)
    out = (size + 2 - 3) // stride + 1
    ct = rng.standard_normal((2, 4, out, out)).astype(np.float32)

    def loss(x: Any, w: Any) -> Any:
        return (lax.conv_general_dilated(x, w, (stride, stride), ((1, 1), (1, 1))) * fnp.asarray(ct)).sum()

    dx, dw = fg.jit(fg.grad(loss, argnums=(0, 1)))(fnp.asarray(x), fnp.asarray(w))
    want = eval_ir(fg.make_ir(fg.grad(loss, argnums=(0, 1)))(fg.Tensor(x), fg.Tensor(w)), [x, w])
    for got, expected in zip((dx, dw), want):
        np.testing.assert_allclose(got.numpy(), expected, atol=1e-5 * float(np.abs(expected).max()), rtol=0)

    def numpy_loss(x64: np.ndarray, w64: np.ndarray) -> float:  # the strided convolution in float64
        padded = np.pad(x64, ((0, 0), (0, 0), (1, 1), (1, 1)))
        total = 0.0
        for i in range(out):
            for j in range(out):
                patch = padded[:, :, i * stride:i * stride + 3, j * stride:j * stride + 3]
                total += float((np.einsum("nchw,ochw->no", patch, w64) * ct[:, :, i, j]).sum())
        return total

    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    direction = rng.standard_normal(x.shape)
    eps = 1e-5
    slope = (numpy_loss(x64 + eps * direction, w64) - numpy_loss(x64 - eps * direction, w64)) / (2 * eps)
    assert float((dx.numpy().astype(np.float64) * direction).sum()) == pytest.approx(slope, rel=1e-4)
