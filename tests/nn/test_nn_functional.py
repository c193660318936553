"""funcgrad.nn.functional against NumPy float64 references written here (always run) and against PyTorch
(values and gradients; skipped where torch is not installed), plus transforms, finite differences and
the errors bad arguments get."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.nn import functional as F
from tests.conftest import assert_close

# --- NumPy references ----------------------------------------------------------------------------


def conv2d_ref(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: int, padding: int, dilation: int,
               groups: int) -> np.ndarray:
    x, w = x.astype(np.float64), w.astype(np.float64)
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    n, c, h, wd = xp.shape
    o, cg, kh, kw = w.shape
    oh, ow = (h - dilation * (kh - 1) - 1) // stride + 1, (wd - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((n, o, oh, ow))
    og = o // groups
    for g in range(groups):
        xs = xp[:, g * cg:(g + 1) * cg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dilation:i * dilation + stride * (oh - 1) + 1:stride,
                           j * dilation:j * dilation + stride * (ow - 1) + 1:stride]
                out[:, g * og:(g + 1) * og] += np.einsum("nchw,oc->nohw", patch, w[g * og:(g + 1) * og, :, i, j])
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def pool_ref(x: np.ndarray, k: int, stride: int, padding: int, mode: str) -> np.ndarray:
    fill = -np.inf if mode == "max" else 0.0
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding, padding), (padding, padding)), constant_values=fill)
    oh, ow = (xp.shape[2] - k) // stride + 1, (xp.shape[3] - k) // stride + 1
    out = np.empty(x.shape[:2] + (oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = xp[:, :, i * stride:i * stride + k, j * stride:j * stride + k]
            out[:, :, i, j] = window.max(axis=(2, 3)) if mode == "max" else window.mean(axis=(2, 3))
    return out


def log_softmax_ref(x: np.ndarray, axis: int) -> np.ndarray:
    x = x.astype(np.float64)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


def erf_ref(x: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf)(x.astype(np.float64))


def rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape) * scale).astype(np.float32)


CONV_CASES = [  # stride, padding, dilation, groups
    (1, 0, 1, 1), (2, 0, 1, 1), (1, 1, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (3, 1, 2, 1), (1, 1, 1, 2), (2, 0, 1, 4),
]


# --- convolution ----------------------------------------------------------------------------------


@pytest.mark.parametrize("stride,padding,dilation,groups", CONV_CASES)
def test_conv2d_matches_numpy_values_and_grads(rng: np.random.Generator, stride: int, padding: int, dilation: int,
                                               groups: int) -> None:
    x, w, b = rand(rng, 2, 4, 9, 8), rand(rng, 8, 4 // groups, 3, 3), rand(rng, 8)
    expected = conv2d_ref(x, w, b, stride, padding, dilation, groups)
    out = F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
    assert_close(out.numpy(), expected, rtol=1e-4, atol=1e-4)
    cotangent = rand(rng, *expected.shape)

    def loss(x: Any, w: Any) -> Any:
        return fnp.sum(F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups) * cotangent)

    dx, dw = fg.grad(loss, argnums=(0, 1))(x, w)
    # d/dw <ct, conv(x, w)>: the conv is linear in w, so each entry is the conv with a one-hot weight
    ref_dw = np.zeros_like(w, dtype=np.float64)
    for index in np.ndindex(*w.shape):
        basis = np.zeros_like(w)
        basis[index] = 1.0
        ref_dw[index] = np.sum(conv2d_ref(x, basis, None, stride, padding, dilation, groups) * cotangent)
    assert_close(dw.numpy(), ref_dw, rtol=1e-4, atol=1e-4)
    # d/dx via the transposed correlation: scatter every cotangent tap back into the padded input
    ref_dx = _conv2d_input_grad_ref(cotangent, w, x.shape, stride, padding, dilation, groups)
    assert_close(dx.numpy(), ref_dx, rtol=1e-4, atol=1e-4)


def _conv2d_input_grad_ref(ct: np.ndarray, w: np.ndarray, x_shape: tuple[int, ...], stride: int, padding: int,
                           dilation: int, groups: int) -> np.ndarray:
    n, c, h, wd = x_shape
    grad = np.zeros((n, c, h + 2 * padding, wd + 2 * padding))
    o, cg, kh, kw = w.shape
    og, (oh, ow) = o // groups, ct.shape[2:]
    for g in range(groups):
        for i in range(kh):
            for j in range(kw):
                contribution = np.einsum("nohw,oc->nchw", ct[:, g * og:(g + 1) * og], w[g * og:(g + 1) * og, :, i, j])
                grad[:, g * cg:(g + 1) * cg, i * dilation:i * dilation + stride * (oh - 1) + 1:stride,
                     j * dilation:j * dilation + stride * (ow - 1) + 1:stride] += contribution
    return grad[:, :, padding:padding + h, padding:padding + wd]


def test_conv2d_same_padding_and_unbatched_input(rng: np.random.Generator) -> None:
    x, w = rand(rng, 3, 7, 6), rand(rng, 5, 3, 4, 3)
    out = F.conv2d(x, w, padding="same", dilation=2)
    assert out.shape == (5, 7, 6)
    # 'same' pads d*(k-1) in total, the smaller half first: 3 rows above and 3 below, 2 and 2 columns
    padded = np.pad(x, ((0, 0), (3, 3), (2, 2)))
    assert_close(out.numpy(), conv2d_ref(padded[None], w, None, 1, 0, 2, 1)[0], rtol=1e-4, atol=1e-4)
    assert F.conv2d(x, w, padding="valid").shape == (5, 4, 4)


def test_conv1d_matches_numpy(rng: np.random.Generator) -> None:
    x, w, b = rand(rng, 2, 3, 11), rand(rng, 4, 3, 3), rand(rng, 4)
    out = F.conv1d(x, w, b, stride=2, padding=1, dilation=2)
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1)))
    length = (xp.shape[2] - 2 * 2 - 1) // 2 + 1
    ref = np.stack([np.einsum("nck,ock->no", xp[:, :, 2 * i:2 * i + 5:2], w) for i in range(length)], axis=-1)
    assert_close(out.numpy(), ref + b[:, None], rtol=1e-4, atol=1e-4)


def test_conv2d_under_jit_vmap_and_jvp(rng: np.random.Generator) -> None:
    x, w = rand(rng, 2, 3, 6, 6), rand(rng, 4, 3, 3, 3)
    eager = F.conv2d(x, w, stride=2, padding=1).numpy()
    jitted = fg.jit(lambda x, w: F.conv2d(x, w, stride=2, padding=1))(x, w).numpy()
    np.testing.assert_allclose(jitted, eager, rtol=1e-5, atol=1e-5)
    weights = rand(rng, 3, 4, 3, 3, 3)  # vmap over a stack of weights
    batched = fg.vmap(lambda w: F.conv2d(x, w, padding=1))(weights).numpy()
    for i in range(3):
        assert_close(batched[i], conv2d_ref(x, weights[i], None, 1, 1, 1, 1), rtol=1e-4, atol=1e-4)
    tx, tw = rand(rng, *x.shape), rand(rng, *w.shape)
    _, tangent = fg.jvp(lambda x, w: F.conv2d(x, w), (x, w), (tx, tw))
    expected = conv2d_ref(tx, w, None, 1, 0, 1, 1) + conv2d_ref(x, tw, None, 1, 0, 1, 1)
    assert_close(tangent.numpy(), expected, rtol=1e-4, atol=1e-4)


def test_conv2d_gradient_matches_finite_differences(rng: np.random.Generator) -> None:
    x, w = rng.standard_normal((1, 2, 5, 5)), rng.standard_normal((2, 2, 3, 3))
    x64, w64 = fnp.asarray(x, dtype=fnp.float64), fnp.asarray(w, dtype=fnp.float64)

    def loss(w: Any) -> Any:
        return fnp.sum(fnp.tanh(F.conv2d(x64, w, stride=2, padding=1)))

    analytic = fg.grad(loss)(w64).numpy()
    eps = 1e-6
    for index in [(0, 0, 0, 0), (1, 1, 2, 1), (0, 1, 1, 2)]:
        bump = np.zeros_like(w)
        bump[index] = eps
        numeric = (loss(fnp.asarray(w + bump, dtype=fnp.float64)).item()
                   - loss(fnp.asarray(w - bump, dtype=fnp.float64)).item()) / (2 * eps)
        assert abs(analytic[index] - numeric) < 1e-6


@pytest.mark.parametrize("call,message", [
    (lambda: F.conv2d(np.ones((1, 3, 5, 5), np.float32), np.ones((2, 2, 3, 3), np.float32)), "expects 2 input"),
    (lambda: F.conv2d(np.ones((1, 4, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32), groups=2),
     "must divide"),
    (lambda: F.conv2d(np.ones((1, 1, 2, 2), np.float32), np.ones((1, 1, 3, 3), np.float32)), "larger than"),
    (lambda: F.conv2d(np.ones((1, 1, 5, 5), np.float32), np.ones((1, 1, 3, 3), np.float32), padding="full"),
     "'same' or 'valid'"),
    (lambda: F.conv2d(np.ones((1, 1, 5, 5), np.float32), np.ones((1, 1, 3, 3), np.float32), padding="same",
                      stride=2), "stride 1"),
    (lambda: F.conv2d(np.ones((5, 5), np.float32), np.ones((1, 1, 3, 3), np.float32)), "N C H W"),
    (lambda: F.conv2d(np.ones((1, 1, 5, 5), np.float32), np.ones((1, 3, 3), np.float32)), "weight must be"),
    (lambda: F.max_pool2d(np.ones((1, 1, 2, 2), np.float32), 3), "larger than"),
    (lambda: F.linear(np.ones((2, 3), np.float32), np.ones((4, 5), np.float32)), "expected the last input axis"),
    (lambda: F.layer_norm(np.ones((2, 3), np.float32), (4,)), "normalized_shape"),
    (lambda: F.cross_entropy(np.ones((2, 3), np.float32), np.ones(3, np.int32)), "do not match"),
    (lambda: F.mse(np.ones(3, np.float32), np.ones(2, np.float32)), "differ"),
    (lambda: F.mse(np.ones(3, np.float32), np.ones(3, np.float32), reduction="avg"), "reduction"),
    (lambda: F.batch_norm(np.ones((2, 3), np.float32), None, None), "needs running_mean"),
    (lambda: F.dropout(np.ones(3, np.float32), 1.5), "rate"),
    (lambda: F.group_norm(np.ones((2, 6, 2), np.float32), 4), "must divide"),
])
def test_bad_arguments_get_clear_errors(call: Any, message: str) -> None:
    with pytest.raises((ValueError, TypeError), match=message):
        call()


# --- pooling --------------------------------------------------------------------------------------


@pytest.mark.parametrize("k,stride,padding", [(2, 2, 0), (3, 2, 1), (3, 1, 1), (2, 3, 0)])
def test_pooling_matches_numpy(rng: np.random.Generator, k: int, stride: int, padding: int) -> None:
    x = rand(rng, 2, 3, 7, 8)
    assert_close(F.max_pool2d(x, k, stride, padding).numpy(), pool_ref(x, k, stride, padding, "max"))
    assert_close(F.avg_pool2d(x, k, stride, padding).numpy(), pool_ref(x, k, stride, padding, "avg"), rtol=1e-5)


def test_max_pool_gradient_goes_to_the_maximum() -> None:
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    grad = fg.grad(lambda x: fnp.sum(F.max_pool2d(x, 2)))(x).numpy()
    expected = np.zeros((4, 4), np.float32)
    expected[1::2, 1::2] = 1.0
    np.testing.assert_array_equal(grad[0, 0], expected)


def test_adaptive_avg_pool2d_matches_numpy_bins(rng: np.random.Generator) -> None:
    x = rand(rng, 2, 3, 7, 6)
    out = F.adaptive_avg_pool2d(x, (3, 4)).numpy()
    ref = np.empty((2, 3, 3, 4))
    for i in range(3):
        for j in range(4):
            rows = slice(i * 7 // 3, -(-(i + 1) * 7 // 3))
            cols = slice(j * 6 // 4, -(-(j + 1) * 6 // 4))
            ref[:, :, i, j] = x[:, :, rows, cols].astype(np.float64).mean(axis=(2, 3))
    assert_close(out, ref, rtol=1e-5)
    assert_close(F.adaptive_avg_pool2d(x[:, :, :6], 1).numpy(), x[:, :, :6].mean(axis=(2, 3), keepdims=True),
                 rtol=1e-5)


# --- linear, norms, dropout -----------------------------------------------------------------------


def test_linear_and_norms_match_numpy(rng: np.random.Generator) -> None:
    x, w, b = rand(rng, 4, 6), rand(rng, 3, 6), rand(rng, 3)
    assert_close(F.linear(x, w, b).numpy(), x.astype(np.float64) @ w.T + b, rtol=1e-5, atol=1e-5)
    x3, gamma, beta = rand(rng, 2, 3, 4), rand(rng, 3, 4), rand(rng, 3, 4)
    x64 = x3.astype(np.float64)
    mean, var = x64.mean(axis=(1, 2), keepdims=True), x64.var(axis=(1, 2), keepdims=True)
    assert_close(F.layer_norm(x3, (3, 4), gamma, beta).numpy(), (x64 - mean) / np.sqrt(var + 1e-5) * gamma + beta,
                 rtol=1e-4, atol=1e-5)
    rms = x64 / np.sqrt((x64 ** 2).mean(axis=-1, keepdims=True) + 1e-6) * gamma[0]
    assert_close(F.rms_norm(x3, 4, gamma[0]).numpy(), rms, rtol=1e-4, atol=1e-5)
    x4 = rand(rng, 2, 6, 3, 2)
    grouped = x4.astype(np.float64).reshape(2, 3, -1)
    normed = ((grouped - grouped.mean(-1, keepdims=True)) / np.sqrt(grouped.var(-1, keepdims=True) + 1e-5))
    scale, shift = rand(rng, 6), rand(rng, 6)
    expected = normed.reshape(x4.shape) * scale[:, None, None] + shift[:, None, None]
    assert_close(F.group_norm(x4, 3, scale, shift).numpy(), expected, rtol=1e-4, atol=1e-5)


def test_batch_norm_training_and_eval(rng: np.random.Generator) -> None:
    x = rand(rng, 5, 3, 2, 2) * 2 + 1
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
    running_mean, running_var = rand(rng, 3), np.abs(rand(rng, 3)) + 0.5
    weight, bias = rand(rng, 3), rand(rng, 3)
    y, new_mean, new_var = F.batch_norm(x, running_mean, running_var, weight, bias, training=True, momentum=0.2)
    expected = (x64 - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * weight[:, None, None]
    assert_close(y.numpy(), expected + bias[:, None, None], rtol=1e-4, atol=1e-5)
    assert_close(new_mean.numpy(), 0.8 * running_mean + 0.2 * mean, rtol=1e-5, atol=1e-6)
    assert_close(new_var.numpy(), 0.8 * running_var + 0.2 * var * 20 / 19, rtol=1e-5, atol=1e-6)
    y, same_mean, same_var = F.batch_norm(x, running_mean, running_var, weight, bias, training=False)
    expected = (x64 - running_mean[:, None, None]) / np.sqrt(running_var[:, None, None] + 1e-5)
    assert_close(y.numpy(), expected * weight[:, None, None] + bias[:, None, None], rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(same_mean.numpy(), running_mean)
    np.testing.assert_array_equal(same_var.numpy(), running_var)


def test_dropout_keyed_is_pure_and_scales_kept_values() -> None:
    x = np.ones((1000,), np.float32)
    key = fg.random.key(3)
    first, second = F.dropout(x, 0.25, key).numpy(), F.dropout(x, 0.25, key).numpy()
    np.testing.assert_array_equal(first, second)
    assert set(np.unique(first).tolist()) <= {0.0, float(np.float32(1.0 / 0.75))}
    assert 0.18 < np.mean(first == 0) < 0.32
    np.testing.assert_array_equal(F.dropout(x, 0.25, key, training=False).numpy(), x)
    np.testing.assert_array_equal(F.dropout(x, 0.0).numpy(), x)
    fg.Tensor.manual_seed(7)
    a = F.dropout(x, 0.5).numpy()
    fg.Tensor.manual_seed(7)
    np.testing.assert_array_equal(F.dropout(x, 0.5).numpy(), a)
    assert not np.array_equal(F.dropout(x, 0.5).numpy(), a)  # the global key moved on


# --- activations ----------------------------------------------------------------------------------


ACTIVATIONS: dict[str, tuple[Any, Any]] = {
    "relu": (F.relu, lambda x: np.maximum(x, 0)),
    "sigmoid": (F.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    "tanh": (F.tanh, np.tanh),
    "silu": (F.silu, lambda x: x / (1 + np.exp(-x))),
    "gelu": (F.gelu, lambda x: 0.5 * x * (1 + erf_ref(x / np.sqrt(2)))),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"),
                  lambda x: 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))),
    "leaky_relu": (lambda x: F.leaky_relu(x, 0.2), lambda x: np.where(x >= 0, x, 0.2 * x)),
    "elu": (F.elu, lambda x: np.where(x > 0, x, np.expm1(np.minimum(x, 0)))),
    "softplus": (F.softplus, lambda x: np.logaddexp(0, x)),
    "softmax": (F.softmax, lambda x: np.exp(log_softmax_ref(x, -1))),
    "log_softmax": (F.log_softmax, lambda x: log_softmax_ref(x, -1)),
}


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activations_match_numpy_and_stay_finite_for_huge_inputs(rng: np.random.Generator, name: str) -> None:
    ours, reference = ACTIVATIONS[name]
    x = rand(rng, 3, 5, scale=3.0)
    assert_close(ours(x).numpy(), reference(x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    huge = np.array([[-1e4, -30.0, 0.0, 30.0, 1e4]], np.float32)
    values = ours(huge).numpy()
    grads = fg.grad(lambda x: fnp.sum(ours(x)))(huge).numpy()
    assert np.all(np.isfinite(values)) and np.all(np.isfinite(grads)), (values, grads)


def test_logsumexp_is_stable() -> None:
    out = F.logsumexp(np.array([1e4, 1e4], np.float32)).item()
    assert out == pytest.approx(1e4 + math.log(2))


# --- losses ---------------------------------------------------------------------------------------


def test_cross_entropy_matches_numpy_with_smoothing_and_ignore(rng: np.random.Generator) -> None:
    logits = rand(rng, 6, 4, scale=2.0)
    labels = np.array([0, 3, 1, -100, 2, 2], np.int32)
    log_probs = log_softmax_ref(logits, 1)
    valid = labels != -100
    picked = log_probs[np.arange(6), np.where(valid, labels, 0)]
    smooth = 0.1
    per = -(1 - smooth) * picked - smooth * log_probs.mean(axis=1)
    out = F.cross_entropy(logits, labels, label_smoothing=smooth)
    assert_close(out.numpy(), per[valid].mean(), rtol=1e-5)
    assert_close(F.cross_entropy(logits, labels, reduction="none").numpy(), np.where(valid, -picked, 0), rtol=1e-5)
    assert_close(F.nll_loss(log_probs.astype(np.float32), labels, reduction="sum").numpy(), -picked[valid].sum(),
                 rtol=1e-5)
    probs = np.exp(log_softmax_ref(rand(rng, 6, 4), 1)).astype(np.float32)
    assert_close(F.cross_entropy(logits, probs).numpy(), -(probs * log_probs).sum(axis=1).mean(), rtol=1e-5)


def test_cross_entropy_over_spatial_axes_and_huge_logits() -> None:
    logits = np.zeros((2, 3, 4), np.float32)
    logits[:, 1] = 1e4
    labels = np.ones((2, 4), np.int32)
    assert F.cross_entropy(logits, labels).item() == 0.0
    labels[0, 0] = 0
    assert F.cross_entropy(logits, labels, reduction="sum").item() == pytest.approx(1e4)
    grad = fg.grad(lambda z: F.cross_entropy(z, labels))(logits).numpy()
    assert np.all(np.isfinite(grad))


def test_sparse_categorical_crossentropy_is_tinygrads_and_the_tensor_method_agrees(rng: np.random.Generator) -> None:
    logits, labels = rand(rng, 5, 3), np.array([0, 2, -1, 1, 1], np.int32)
    log_probs = log_softmax_ref(logits, -1)
    valid = labels != -1
    smooth = 0.2
    per = -(1 - smooth) * log_probs[np.arange(5), np.where(valid, labels, 0)] - smooth * log_probs.mean(-1)
    expected = per[valid].sum() / valid.sum()
    assert_close(F.sparse_categorical_crossentropy(logits, labels, label_smoothing=smooth).numpy(), expected,
                 rtol=1e-5)
    method = fg.Tensor(logits).sparse_categorical_crossentropy(labels, label_smoothing=smooth)
    assert_close(method.numpy(), expected, rtol=1e-5)


def test_binary_and_regression_losses_match_numpy(rng: np.random.Generator) -> None:
    logits, target = rand(rng, 8, scale=3.0), (rng.random(8) > 0.5).astype(np.float32)
    x64 = logits.astype(np.float64)
    p = 1 / (1 + np.exp(-x64))
    bce = -(target * np.log(p) + (1 - target) * np.log(1 - p))
    assert_close(F.binary_crossentropy(p.astype(np.float32), target).numpy(), bce.mean(), rtol=1e-4)
    assert_close(F.binary_crossentropy_with_logits(logits, target).numpy(), bce.mean(), rtol=1e-5)
    weighted = -(2.0 * target * np.log(p) + (1 - target) * np.log(1 - p))
    assert_close(F.binary_crossentropy_with_logits(logits, target, pos_weight=2.0).numpy(), weighted.mean(),
                 rtol=1e-5)
    huge = np.array([1e4, -1e4], np.float32)
    assert F.binary_crossentropy_with_logits(huge, np.array([0.0, 1.0], np.float32), reduction="sum").item() == 2e4
    assert F.binary_crossentropy(np.array([0.0], np.float32), np.array([1.0], np.float32)).item() == 100.0
    pred = rand(rng, 4, 3)
    assert_close(F.mse(pred, target[:4, None] * np.ones(3, np.float32)).numpy(),
                 ((pred - target[:4, None]) ** 2).mean(), rtol=1e-5)
    assert_close(F.l1_loss(pred, np.zeros_like(pred), reduction="sum").numpy(), np.abs(pred).sum(), rtol=1e-5)


# --- attention and embeddings ---------------------------------------------------------------------


def test_attention_matches_numpy_with_masks(rng: np.random.Generator) -> None:
    q, k, v = rand(rng, 2, 4, 8), rand(rng, 2, 5, 8), rand(rng, 2, 5, 3)
    scores = np.einsum("ble,bse->bls", q.astype(np.float64), k) / np.sqrt(8)

    def attend(s: np.ndarray) -> np.ndarray:
        return np.einsum("bls,bsd->bld", np.exp(log_softmax_ref(s, -1)), v)

    assert_close(F.scaled_dot_product_attention(q, k, v).numpy(), attend(scores), rtol=1e-4, atol=1e-5)
    keep = rng.random((4, 5)) > 0.3
    keep[:, 0] = True
    assert_close(F.scaled_dot_product_attention(q, k, v, mask=keep).numpy(), attend(np.where(keep, scores, -np.inf)),
                 rtol=1e-4, atol=1e-5)
    additive = rand(rng, 4, 5)
    assert_close(F.scaled_dot_product_attention(q, k, v, mask=additive, scale=0.5).numpy(),
                 attend(scores * np.sqrt(8) * 0.5 + additive), rtol=1e-4, atol=1e-5)
    causal = np.tril(np.ones((4, 5), bool))
    assert_close(F.scaled_dot_product_attention(q, k, v, is_causal=True).numpy(),
                 attend(np.where(causal, scores, -np.inf)), rtol=1e-4, atol=1e-5)


def test_embedding_picks_rows(rng: np.random.Generator) -> None:
    weight, indices = rand(rng, 10, 4), np.array([[1, 9], [0, 1]], np.int32)
    np.testing.assert_array_equal(F.embedding(indices, weight).numpy(), weight[indices])
    grad = fg.grad(lambda w: fnp.sum(F.embedding(indices, w)))(weight).numpy()
    np.testing.assert_array_equal(grad[:, 0], np.bincount(indices.ravel(), minlength=10).astype(np.float32))


# --- against PyTorch ------------------------------------------------------------------------------


@pytest.mark.parametrize("stride,padding,dilation,groups", CONV_CASES[:5])
def test_conv2d_and_pooling_match_torch_values_and_grads(rng: np.random.Generator, stride: int, padding: int,
                                                         dilation: int, groups: int) -> None:
    torch = pytest.importorskip("torch")
    x, w, b = rand(rng, 2, 4, 10, 9), rand(rng, 6, 4 // groups, 3, 3), rand(rng, 6)

    def ours(x: Any, w: Any, b: Any) -> Any:
        y = F.conv2d(x, w, b, stride=stride, padding=padding, dilation=dilation, groups=groups)
        return fnp.sum(F.max_pool2d(F.relu(y), 2) ** 2) + fnp.sum(F.avg_pool2d(y, 2, 1, 1))

    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    ty = torch.nn.functional.conv2d(tx, tw, tb, stride=stride, padding=padding, dilation=dilation, groups=groups)
    tloss = ((torch.nn.functional.max_pool2d(torch.relu(ty), 2) ** 2).sum()
             + torch.nn.functional.avg_pool2d(ty, 2, 1, 1).sum())
    tloss.backward()
    loss, grads = fg.value_and_grad(ours, argnums=(0, 1, 2))(x, w, b)
    assert_close(loss.numpy(), tloss.item(), rtol=1e-4)
    for g, t in zip(grads, (tx, tw, tb)):
        assert_close(g.numpy(), t.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_norms_and_losses_match_torch_values_and_grads(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    # float64: in float32 the chain of three normalizations loses ~1e-4 of the bias gradient to cancellation
    x, gamma, beta = (rng.standard_normal(shape) for shape in ((4, 6, 3, 3), (6,), (6,)))
    labels = rng.integers(0, 6, (4, 3, 3)).astype(np.int64)
    running_mean, running_var = np.zeros(6), np.ones(6)

    def ours(x: Any, gamma: Any, beta: Any) -> Any:
        y, _, _ = F.batch_norm(x, running_mean, running_var, gamma, beta, training=True)
        y = F.group_norm(F.gelu(y), 3, gamma, beta)
        y = F.layer_norm(F.silu(y), (3, 3))
        return F.cross_entropy(F.elu(y) * 3, labels, label_smoothing=0.1) + F.mse(F.softplus(y), F.tanh(y))

    tx, tg, tb = (torch.tensor(a, requires_grad=True) for a in (x, gamma, beta))
    trm, trv = torch.tensor(running_mean), torch.tensor(running_var)
    y = tf.batch_norm(tx, trm, trv, tg, tb, training=True)
    y = tf.layer_norm(tf.silu(tf.group_norm(tf.gelu(y), 3, tg, tb)), (3, 3))
    tloss = tf.cross_entropy(tf.elu(y) * 3, torch.tensor(labels), label_smoothing=0.1) + tf.mse_loss(tf.softplus(y),
                                                                                                      torch.tanh(y))
    tloss.backward()
    loss, grads = fg.value_and_grad(ours, argnums=(0, 1, 2))(*(fnp.asarray(a, dtype=fnp.float64)
                                                                for a in (x, gamma, beta)))
    assert_close(loss.numpy(), tloss.item(), rtol=1e-10)
    for g, t in zip(grads, (tx, tg, tb)):
        assert_close(g.numpy(), t.grad.numpy(), rtol=1e-9, atol=1e-12)
    x = fnp.asarray(x, dtype=fnp.float64)
    running_mean, running_var = (fnp.asarray(a, dtype=fnp.float64) for a in (running_mean, running_var))
    _, new_mean, new_var = F.batch_norm(x, running_mean, running_var, training=True)
    assert_close(new_mean.numpy(), trm.numpy(), rtol=1e-5, atol=1e-6)  # torch updated its stats in place
    assert_close(new_var.numpy(), trv.numpy(), rtol=1e-5, atol=1e-6)


def test_binary_losses_and_attention_match_torch_grads(rng: np.random.Generator) -> None:
    torch = pytest.importorskip("torch")
    tf = torch.nn.functional
    logits, target = rand(rng, 6, scale=3.0), rng.random(6).astype(np.float32)
    q, k, v = rand(rng, 2, 3, 4), rand(rng, 2, 5, 4), rand(rng, 2, 5, 2)

    def ours(logits: Any, q: Any) -> Any:
        attention = F.scaled_dot_product_attention(q, k, v, is_causal=False, mask=np.tril(np.ones((3, 5), bool)))
        return (F.binary_crossentropy_with_logits(logits, target, pos_weight=1.5)
                + F.binary_crossentropy(F.sigmoid(logits), target, reduction="sum")
                + F.l1_loss(attention, fnp.zeros_like(attention)) + F.leaky_relu(logits, 0.1).sum())

    tl, tq = torch.tensor(logits, requires_grad=True), torch.tensor(q, requires_grad=True)
    attention = tf.scaled_dot_product_attention(tq, torch.tensor(k), torch.tensor(v),
                                                attn_mask=torch.tensor(np.tril(np.ones((3, 5), bool))))
    tt = torch.tensor(target)
    tloss = (tf.binary_cross_entropy_with_logits(tl, tt, pos_weight=torch.tensor(1.5))
             + tf.binary_cross_entropy(torch.sigmoid(tl), tt, reduction="sum")
             + tf.l1_loss(attention, torch.zeros_like(attention)) + tf.leaky_relu(tl, 0.1).sum())
    tloss.backward()
    loss, (g_logits, g_q) = fg.value_and_grad(ours, argnums=(0, 1))(logits, q)
    assert_close(loss.numpy(), tloss.item(), rtol=1e-4)
    assert_close(g_logits.numpy(), tl.grad.numpy(), rtol=1e-4, atol=1e-5)
    assert_close(g_q.numpy(), tq.grad.numpy(), rtol=1e-4, atol=1e-5)


# --- seed-style Tensor methods and the compiled form ----------------------------------------------


def test_tensor_methods_delegate_with_tinygrad_conventions(rng: np.random.Generator) -> None:
    x, w = rand(rng, 2, 3, 6, 6), rand(rng, 4, 3, 3, 3)
    t = fg.Tensor(x)
    np.testing.assert_allclose(t.conv2d(w, padding=1, stride=2).numpy(),
                               F.conv2d(x, w, stride=2, padding=1).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(t.max_pool2d().numpy(), F.max_pool2d(x, 2).numpy())
    np.testing.assert_allclose(t.avg_pool2d(3, 1, padding=1).numpy(), pool_ref(x, 3, 1, 1, "avg"), rtol=1e-5, atol=1e-6)
    features, weight_in_out = rand(rng, 5, 3), rand(rng, 3, 2)  # tinygrad's linear takes (in, out)
    assert_close(fg.Tensor(features).linear(weight_in_out, np.ones(2, np.float32)).numpy(),
                 features.astype(np.float64) @ weight_in_out + 1, rtol=1e-5, atol=1e-6)
    assert_close(t.gelu().numpy(), F.gelu(x, approximate="tanh").numpy())
    assert_close(t.silu().numpy(), x / (1 + np.exp(-x.astype(np.float64))), rtol=1e-5, atol=1e-6)
    assert_close(t.layernorm().numpy(), F.layer_norm(x, 6).numpy(), rtol=1e-5, atol=1e-6)
    mean, invstd, scale, shift = rand(rng, 3), np.abs(rand(rng, 3)), rand(rng, 3), rand(rng, 3)
    expected = (x - mean[:, None, None]) * scale[:, None, None] * invstd[:, None, None] + shift[:, None, None]
    assert_close(t.batchnorm(scale, shift, mean, invstd).numpy(), expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(t.dropout(0.5).numpy(), x)  # not in training mode
    with fg.Tensor.train():
        assert np.mean(t.dropout(0.5).numpy() == 0) > 0.2
    probs, labels = np.array([0.2, 0.9], np.float32), np.array([0.0, 1.0], np.float32)
    assert_close(fg.Tensor(probs).binary_crossentropy(labels).numpy(), -np.log([0.8, 0.9]).mean(), rtol=1e-5)
    logits = np.log(probs / (1 - probs))
    assert_close(fg.Tensor(logits).binary_crossentropy_logits(labels).numpy(), -np.log([0.8, 0.9]).mean(),
                 rtol=1e-5)


def test_conv2d_compiles_to_one_kernel_with_affine_indices() -> None:
    x, w = fg.Tensor(np.zeros((2, 3, 12, 12), np.float32)), fg.Tensor(np.zeros((4, 3, 3, 3), np.float32))
    for kernel_list in (F.conv2d(x, w).schedule(), F.conv2d(x, w, dilation=2).schedule(),
                        F.max_pool2d(x, 3, 2).schedule()):
        assert len(kernel_list) == 1
        listing = kernel_list[0].source.split("define")[0]  # the kernel IR printed above the LLVM code
        assert "rem(" not in listing and "div(" not in listing, listing


@pytest.mark.parametrize("loss", ["cross_entropy", "sparse_categorical_crossentropy"])
def test_unsigned_labels_with_negative_ignore_index(loss):
    """datasets.mnist() gives uint8 labels; the default ignore_index (-100 or -1) must not trip on them."""
    logits = np.array([[2.0, 0.5, -1.0], [0.1, 0.2, 0.3]], np.float32)
    labels = np.array([0, 2], np.uint8)
    expected = np.mean([-(logits[i] - np.log(np.exp(logits[i].astype(np.float64)).sum()))[labels[i]]
                        for i in range(2)])
    got = getattr(F, loss)(fg.Tensor(logits), fg.Tensor(labels))
    np.testing.assert_allclose(got.item(), expected, rtol=1e-6)


def test_float32_gradients_of_conv_relu_batchnorm_match_float64():
    """conv -> ReLU -> BatchNorm, differentiated under jit in float32, stays within a few ulps-per-sum
    of float64 (as PyTorch's float32 does). Long reductions (the batch statistics over N*H*W, the weight
    gradient over the batch) used to run one float32 accumulator per output and lost ~1e-5 per
    stage, which compounded to percents over beautiful_mnist's two stages."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((16, 32, 24, 24))
    w = rng.standard_normal((32, 32, 5, 5)) * 0.05
    ct = rng.standard_normal((16, 32, 20, 20))

    def f(x, w, c):
        return (F.batch_norm(F.relu(F.conv2d(x, w)), None, None, training=True)[0] * c).sum()

    grads = {}
    for dt in (np.float64, np.float32):
        args = [fg.Tensor(a.astype(dt), dtype=dt) for a in (x, w, ct)]
        grads[dt] = [g.numpy().astype(np.float64) for g in fg.jit(fg.grad(f, argnums=(0, 1)))(*args)]
    for single, double in zip(grads[np.float32], grads[np.float64]):
        assert np.abs(single - double).max() <= 4e-6 * np.abs(double).max()
