"""Numerical stability of the softmax family, the losses, the normalisations and the norms: values and
gradients at logits of +-1e4 and +-1e30, at tiny values (1e-30), at -inf (masked) logits and in
float16 / bfloat16 are finite and match float64 references (NumPy; PyTorch float64 where installed;
funcgrad's own float64 gradient always).

Each row-wise function gets one batch whose rows are the regimes (ordinary, +-1e4, +-1e30, tiny, ties),
so one kernel run covers them all.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.nn import functional as F
from tests.conftest import assert_close

try:
    import torch
except ImportError:  # CI runs without torch: the NumPy and float64 references still run
    torch = None

LOGITS = np.array([
    [0.5, -1.25, 2.0, 0.0, 3.5],
    [1e4, -1e4, 0.0, 5e3, 1e4 - 3.0],
    [-1e4, -1e4 + 1.0, -1e4 + 2.0, -1e4, -1e4 + 0.5],
    [1e30, -1e30, 0.0, 1.0, 1e30],
    [-1e30, 5.0, 5.0, -1e30, 4.0],
    [1e-30, -1e-30, 0.0, 1e-30, 2e-30],
    [3.0, 3.0, 3.0, 3.0, 3.0],
], dtype=np.float32)
LABELS = np.array([2, 1, 0, 3, 0, 4, 1])
PROBS = np.array([[0.1, 0.2, 0.3, 0.25, 0.15]] * len(LOGITS), dtype=np.float32)
WEIGHTS = np.linspace(-1.0, 1.5, LOGITS.size, dtype=np.float32).reshape(LOGITS.shape)  # cotangents of the outputs


def np_logsumexp(x: np.ndarray) -> np.ndarray:
    peak = x.max(-1, keepdims=True)
    return (np.log(np.exp(x - peak).sum(-1, keepdims=True)) + peak)[..., 0]


def np_log_softmax(x: np.ndarray) -> np.ndarray:
    """(x - max) - log(sum(exp(x - max))): ``x - logsumexp(x)`` would lose log(2) next to 1e30."""
    shifted = x - x.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def np_cross_entropy(x: np.ndarray, labels: np.ndarray, smoothing: float = 0.0) -> float:
    log_probs = np_log_softmax(x)
    picked = log_probs[np.arange(len(labels)), labels]
    losses = -(1 - smoothing) * picked
    return float(np.mean(losses - smoothing * log_probs.mean(-1) if smoothing else losses))


def np_bce_with_logits(x: np.ndarray, target: np.ndarray) -> np.ndarray:
    return np.maximum(x, 0) - x * target + np.log1p(np.exp(-np.abs(x)))


# name: (funcgrad function, NumPy float64 reference of the value, torch function or None)
ROWWISE: dict[str, tuple[Any, Any, Any]] = {
    # torch.logsumexp's gradient exp(x - result) is off next to 1e30 (two tied maxima get 1 each):
    # x - log_softmax(x) has the same value and the softmax as its gradient
    "logsumexp": (lambda x: fnp.logsumexp(x, axis=-1), np_logsumexp,
                  lambda t: (t - torch.log_softmax(t, -1))[..., 0]),
    "softmax": (lambda x: F.softmax(x, -1), lambda x: np.exp(np_log_softmax(x)),
                lambda t: torch.softmax(t, -1)),
    "log_softmax": (lambda x: F.log_softmax(x, -1), np_log_softmax,
                    lambda t: torch.log_softmax(t, -1)),
    "cross_entropy": (lambda x: F.cross_entropy(x, LABELS[:x.shape[0]]), lambda x: np_cross_entropy(x, LABELS[:len(x)]),
                      lambda t: torch.nn.functional.cross_entropy(t, torch.tensor(LABELS[:len(t)]))),
    "cross_entropy_smoothed": (lambda x: F.cross_entropy(x, LABELS[:x.shape[0]], label_smoothing=0.1),
                               lambda x: np_cross_entropy(x, LABELS[:len(x)], 0.1),
                               lambda t: torch.nn.functional.cross_entropy(t, torch.tensor(LABELS[:len(t)]),
                                                                           label_smoothing=0.1)),
    "cross_entropy_probs": (lambda x: F.cross_entropy(x, PROBS), lambda x: float(np.mean(
                                -(PROBS * np_log_softmax(x)).sum(-1))),
                            lambda t: torch.nn.functional.cross_entropy(t, torch.tensor(PROBS, dtype=t.dtype))),
    "cross_entropy_probs_smoothed": (
        lambda x: F.cross_entropy(x, fnp.asarray(PROBS, dtype=x.dtype), label_smoothing=0.2),
        lambda x: float(np.mean(-((PROBS * 0.8 + 0.2 / 5) * np_log_softmax(x)).sum(-1))),
        lambda t: torch.nn.functional.cross_entropy(t, torch.tensor(PROBS, dtype=t.dtype), label_smoothing=0.2)),
    "sigmoid": (F.sigmoid, lambda x: np.exp(-np.logaddexp(0.0, -x)), lambda t: torch.sigmoid(t)),
    "softplus": (F.softplus, lambda x: np.where(x > 20, x, np.logaddexp(0.0, x)),
                 lambda t: torch.nn.functional.softplus(t)),
    "bce_with_logits": (lambda x: F.binary_crossentropy_with_logits(x, PROBS),
                        lambda x: float(np.mean(np_bce_with_logits(x, PROBS))),
                        lambda t: torch.nn.functional.binary_cross_entropy_with_logits(
                            t, torch.tensor(PROBS, dtype=t.dtype))),
}


def weighted(fn: Any, x: Any) -> Any:
    """sum(fn(x) * w): a scalar whose gradient pulls a different cotangent through every output."""
    out = fn(x)
    if out.ndim == 0:
        return out
    return fnp.sum(out * fnp.asarray(WEIGHTS[:len(out)] if out.ndim == 2 else WEIGHTS[:len(out), 0], dtype=x.dtype))


def torch_weighted(fn: Any, t: Any) -> Any:
    out = fn(t)
    if out.ndim == 0:
        return out
    w = WEIGHTS[:len(out)] if out.ndim == 2 else WEIGHTS[:len(out), 0]
    return (out * torch.tensor(w, dtype=t.dtype)).sum()


def check_value_and_gradient(fn: Any, reference: Any, torch_fn: Any, x: np.ndarray, rtol: float = 2e-5,
                             grad_atol: float = 1e-6) -> None:
    """float32 value == NumPy float64 value; float32 gradient finite == funcgrad float64 gradient
    (and == PyTorch float64 where installed)."""
    value = fn(fnp.asarray(x)).numpy()
    expected = reference(x.astype(np.float64))
    assert np.isfinite(value).all(), value
    assert_close(value, np.asarray(expected, np.float32), rtol=rtol, atol=1e-6)
    grad32 = fg.grad(lambda x: weighted(fn, x))(fnp.asarray(x)).numpy()
    grad64 = fg.grad(lambda x: weighted(fn, x))(fnp.asarray(x, dtype=fnp.float64)).numpy()
    assert np.isfinite(grad32).all(), grad32
    assert_close(grad32, grad64.astype(np.float32), rtol=rtol, atol=grad_atol)
    if torch is not None:
        t = torch.tensor(x.astype(np.float64), requires_grad=True)
        torch_weighted(torch_fn, t).backward()
        assert_close(grad64, t.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", sorted(ROWWISE))
def test_rowwise_values_and_gradients_at_extreme_logits(name):
    fn, reference, torch_fn = ROWWISE[name]
    check_value_and_gradient(fn, reference, torch_fn, LOGITS)


@pytest.mark.parametrize("jitted", [False, True])
def test_binary_crossentropy_at_probabilities_0_and_1(jitted):
    """The logs are clamped at -100; the gradient is PyTorch's (p - t) / max(p (1 - p), 1e-12): finite
    (0 for a perfect prediction), where the clamped logs' own derivative gave 0 * inf = NaN."""
    p = np.array([0.0, 1.0, 0.0, 1.0, 0.3, 1e-30, 0.5], np.float32)
    t = np.array([0.0, 1.0, 1.0, 0.0, 0.5, 0.0, 1.0], np.float32)
    p64, t64 = p.astype(np.float64), t.astype(np.float64)
    with np.errstate(divide="ignore"):
        expected = -(t64 * np.maximum(np.log(p64), -100) + (1 - t64) * np.maximum(np.log1p(-p64), -100))
    expected_grad = (p64 - t64) / np.maximum(p64 * (1 - p64), 1e-12) / len(p)
    grad_fn = fg.grad(lambda p: F.binary_crossentropy(p, t))
    grad = (fg.jit(grad_fn) if jitted else grad_fn)(fnp.asarray(p)).numpy()
    assert_close(F.binary_crossentropy(fnp.asarray(p), t, reduction="none").numpy(), expected.astype(np.float32),
                 rtol=1e-6, atol=1e-7)
    assert np.isfinite(grad).all()
    assert_close(grad, expected_grad.astype(np.float32), rtol=1e-6, atol=1e-12)
    if torch is not None:
        tp = torch.tensor(p64, requires_grad=True)
        torch.nn.functional.binary_cross_entropy(tp, torch.tensor(t64)).backward()
        assert_close(expected_grad, tp.grad.numpy(), rtol=1e-8, atol=0)  # torch's 1e-12 is a float32 constant


@pytest.mark.parametrize("name", ["logsumexp", "softmax", "log_softmax", "cross_entropy", "cross_entropy_smoothed"])
def test_masked_logits_minus_inf(name):
    """-inf logits (masked classes, never a label) give finite values, and gradients that are finite
    (zero there, except log_softmax's own -inf outputs, which pass their cotangent through)."""
    fn, reference, torch_fn = ROWWISE[name]
    x = LOGITS[:3].copy()
    x[:, [3, 4]] = -np.inf  # the labels of the first three rows are 2, 1, 0
    value = fn(fnp.asarray(x)).numpy()
    expected = np.asarray(reference(x.astype(np.float64)), np.float32)
    if name != "cross_entropy_smoothed":  # smoothing averages log-probabilities, -inf among them
        assert np.isfinite(value[np.isfinite(expected)]).all()
    assert_close(value, expected, rtol=2e-5, atol=1e-6)
    grad = fg.grad(lambda x: weighted(fn, x))(fnp.asarray(x)).numpy()
    if name == "cross_entropy_smoothed":
        return
    assert np.isfinite(grad).all(), grad
    if name != "log_softmax":
        assert (grad[:, [3, 4]] == 0).all()
    if torch is not None:
        t = torch.tensor(x.astype(np.float64), requires_grad=True)
        torch_weighted(torch_fn, t).backward()
        assert_close(grad, t.grad.numpy().astype(np.float32), rtol=2e-5, atol=1e-6)


def test_logsumexp_of_all_minus_inf_and_plus_inf():
    x = np.array([[-np.inf, -np.inf], [np.inf, 1.0]], np.float32)
    assert fnp.logsumexp(fnp.asarray(x), axis=-1).tolist() == [-np.inf, np.inf]


def test_logsumexp_gradient_is_exactly_softmax_at_ties():
    """The max is a constant for the gradient: ties do not shift the result by rounding."""
    x = fnp.asarray(LOGITS)
    grad = fg.grad(lambda x: fnp.sum(fnp.logsumexp(x, axis=-1)))(x).numpy()
    assert_close(grad, F.softmax(x, -1).numpy(), rtol=1e-6, atol=1e-7)
    assert_close(grad.sum(-1), np.ones(len(LOGITS), np.float32), rtol=1e-6)


# --- normalisations --------------------------------------------------------------------------------------

def norm_inputs() -> np.ndarray:
    """(N=4, C=4, L=6): an ordinary sample, one offset by 1e4 (cancellation in the mean), one of scale
    1e4 (squares near 1e8), one of scale 1e-30 (squares underflow: eps dominates)."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((4, 4, 6))
    return np.stack([base[0], 1e4 + base[1], 1e4 * base[2], 1e-30 * base[3]]).astype(np.float32)


def np_normalize(x: np.ndarray, axes: tuple[int, ...], eps: float) -> np.ndarray:
    mean = x.mean(axes, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axes, keepdims=True) + eps)


NORMS: dict[str, tuple[Any, Any, Any]] = {
    "layer_norm": (lambda x: F.layer_norm(x, (4, 6)), lambda x: np_normalize(x, (1, 2), 1e-5),
                   lambda t: torch.nn.functional.layer_norm(t, (4, 6))),
    "rms_norm": (lambda x: F.rms_norm(x, 6), lambda x: x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-6),
                 lambda t: torch.nn.functional.rms_norm(t, (6,), eps=1e-6)),
    "group_norm": (lambda x: F.group_norm(x, 2), lambda x: np_normalize(x.reshape(len(x), 2, -1), (2,), 1e-5).reshape(
                       x.shape), lambda t: torch.nn.functional.group_norm(t, 2)),
    "batch_norm": (lambda x: F.batch_norm(x, None, None, training=True)[0],
                   lambda x: np_normalize(x, (0, 2), 1e-5),
                   lambda t: torch.nn.functional.batch_norm(t, None, None, training=True)),
}


def norm_weighted(fn: Any, x: Any) -> Any:
    w = np.cos(np.arange(x.size)).reshape(x.shape)
    return fnp.sum(fn(x) * fnp.asarray(w, dtype=x.dtype))


@pytest.mark.parametrize("name", sorted(NORMS))
def test_normalisations_at_offset_large_and_tiny_inputs(name):
    fn, reference, torch_fn = NORMS[name]
    x = norm_inputs()
    if name == "batch_norm":  # statistics over the batch: one regime per channel instead
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    value = fn(fnp.asarray(x)).numpy()
    assert np.isfinite(value).all()
    assert_close(value, reference(x.astype(np.float64)).astype(np.float32), rtol=1e-4, atol=2e-4)
    grad32 = fg.grad(lambda x: norm_weighted(fn, x))(fnp.asarray(x)).numpy()
    grad64 = fg.grad(lambda x: norm_weighted(fn, x))(fnp.asarray(x, dtype=fnp.float64)).numpy()
    assert np.isfinite(grad32).all()
    scale = np.abs(grad64).max()
    assert np.abs(grad32 - grad64).max() <= 1e-4 * scale
    if torch is not None:
        t = torch.tensor(x.astype(np.float64), requires_grad=True)
        (torch_fn(t) * torch.tensor(np.cos(np.arange(x.size)).reshape(x.shape))).sum().backward()
        assert np.abs(grad64 - t.grad.numpy()).max() <= 1e-9 * scale


def test_variance_is_never_negative():
    """Constant rows (variance exactly 0 in exact arithmetic) at a large offset: the two-pass variance
    cannot cancel below zero, so rsqrt never sees a negative number."""
    x = np.full((3, 8), 12345.678, np.float32)
    out = F.layer_norm(fnp.asarray(x), 8).numpy()
    assert np.isfinite(out).all() and (out == 0).all()
    grad = fg.grad(lambda x: fnp.sum(F.layer_norm(x, 8) * fnp.arange(8.0)))(fnp.asarray(x)).numpy()
    assert np.isfinite(grad).all()


# --- low precision ---------------------------------------------------------------------------------------

LOW = ["float16", "bfloat16"]
LOW_TOLERANCE = {"float16": 4e-3, "bfloat16": 3e-2}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", ["logsumexp", "softmax", "log_softmax", "cross_entropy", "cross_entropy_probs",
                                  "sigmoid", "softplus", "bce_with_logits"])
def test_rowwise_in_low_precision(name, dtype):
    fn, reference, _ = ROWWISE[name]
    x = LOGITS[[0, 1, 2, 5, 6]]  # +-1e4 fits float16 (max 65504); 1e30 does not
    labels_rows = [0, 1, 2, 5, 6]
    low = fnp.asarray(x, dtype=dtype)
    rounded = low.astype(fnp.float32).numpy().astype(np.float64)
    if name.startswith("cross_entropy"):
        target = LABELS[labels_rows] if name == "cross_entropy" else PROBS[labels_rows]
        value = F.cross_entropy(low, target).astype(fnp.float32).numpy()
        expected = (np_cross_entropy(rounded, target) if name == "cross_entropy"
                    else float(np.mean(-(target * np_log_softmax(rounded)).sum(-1))))
        grad = fg.grad(lambda x: F.cross_entropy(x, target))(low)
    elif name == "bce_with_logits":
        target = PROBS[labels_rows]
        value = F.binary_crossentropy_with_logits(low, target).astype(fnp.float32).numpy()
        expected = float(np.mean(np_bce_with_logits(rounded, target)))
        grad = fg.grad(lambda x: F.binary_crossentropy_with_logits(x, target))(low)
    else:
        value = fn(low).astype(fnp.float32).numpy()
        expected = reference(rounded)
        grad = fg.grad(lambda x: fnp.sum(fn(x)))(low)
    assert grad.dtype == low.dtype
    assert np.isfinite(value).all() and np.isfinite(grad.astype(fnp.float32).numpy()).all()
    scale = max(1.0, float(np.abs(expected).max()))
    assert np.abs(value - expected).max() <= LOW_TOLERANCE[dtype] * scale


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", sorted(NORMS))
def test_normalisations_in_low_precision(name, dtype):
    """Statistics of float16 values overflow float16 (squares of 300 exceed 65504): they are computed in
    float32, as PyTorch and Flax do, and the result is cast back."""
    fn, reference, _ = NORMS[name]
    x = norm_inputs()[:3] * np.array([1.0, 1.0, 0.05], np.float32)[:, None, None]  # scale 500: squares 2.5e5
    if name == "batch_norm":
        x = np.ascontiguousarray(x.transpose(1, 0, 2))
    low = fnp.asarray(x, dtype=dtype)
    rounded = low.astype(fnp.float32).numpy().astype(np.float64)
    out = fn(low)
    assert out.dtype == low.dtype
    value = out.astype(fnp.float32).numpy()
    assert np.isfinite(value).all()
    assert np.abs(value - reference(rounded)).max() <= 8 * LOW_TOLERANCE[dtype] * max(1.0, np.abs(value).max())
    grad = fg.grad(lambda x: norm_weighted(fn, x))(low)
    assert grad.dtype == low.dtype and np.isfinite(grad.astype(fnp.float32).numpy()).all()


# --- vector norms ------------------------------------------------------------------------------------------

def test_norm_values_for_large_small_and_zero_vectors():
    x = np.array([[3.0, 4.0, 0.0], [3e15, -4e15, 0.0], [3e-15, 4e-15, 0.0], [0.0, 0.0, 0.0]], np.float32)
    out = fnp.linalg.norm(fnp.asarray(x), axis=1).numpy()
    assert_close(out, np.linalg.norm(x.astype(np.float64), axis=1).astype(np.float32), rtol=1e-6, atol=0)


def test_norm_keeps_nan_and_inf():
    """The zero-gradient guard must not hide a NaN (gradient clipping would then pass NaNs on)."""
    x = np.array([[np.nan, 1.0], [np.inf, 1.0], [0.0, 0.0]], np.float32)
    out = fnp.linalg.norm(fnp.asarray(x), axis=1).numpy()
    assert np.isnan(out[0]) and np.isinf(out[1]) and out[2] == 0


def test_norm_squares_without_rescaling_like_numpy_and_pytorch():
    """Documented limit: float32 squares overflow above ~1.8e19 and underflow below ~1e-19 (NumPy float32,
    PyTorch and JAX do the same); rescale such vectors first."""
    x = np.array([[3e20, 4e20], [3e-25, 4e-25]], np.float32)
    out = fnp.linalg.norm(fnp.asarray(x), axis=1).numpy()
    assert np.isinf(out[0]) and out[1] == 0.0
    with np.errstate(over="ignore"):
        assert np.isinf(np.linalg.norm(x[0])) and np.linalg.norm(x[1]) == 0.0


@pytest.mark.parametrize("ord", [None, 2, 1, 3, 1.5, np.inf])
def test_norm_gradient_at_zero_is_zero_not_nan(ord):
    """As PyTorch (a subgradient); JAX's jnp.linalg.norm gives NaN there. Elsewhere it is x / |x|."""
    def f(x):
        return fnp.sum(fnp.linalg.norm(x, ord=ord, axis=-1))

    x = np.array([[0.0, 0.0, 0.0], [3.0, -4.0, 1.0]], np.float32)
    grad = fg.grad(f)(fnp.asarray(x)).numpy()
    assert (grad[0] == 0).all()
    expected = fg.grad(lambda v: fnp.linalg.norm(v, ord=ord))(fnp.asarray(x[1], dtype=fnp.float64)).numpy()
    assert_close(grad[1], expected.astype(np.float32), rtol=1e-5, atol=1e-6)
    if torch is not None:
        t = torch.tensor(x.astype(np.float64), requires_grad=True)
        torch.linalg.vector_norm(t, ord=2 if ord is None else ord, dim=-1).sum().backward()
        assert_close(grad, t.grad.numpy().astype(np.float32), rtol=1e-5, atol=1e-6)


def test_frobenius_norm_gradient_at_zero_is_zero():
    grad = fg.grad(lambda x: fnp.linalg.norm(x))(fnp.zeros((2, 3))).numpy()
    assert (grad == 0).all()
    grad = fg.grad(lambda x: fnp.linalg.matrix_norm(x))(fnp.zeros((2, 3))).numpy()
    assert (grad == 0).all()
