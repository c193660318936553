"""tinygrad's neural-network methods of Tensor: activations, losses, pools (``ceil_mode``,
``return_indices``), ``conv_transpose2d``, ``interpolate``, ``max_unpool2d``, attention.

They compose ``funcgrad.numpy`` and ``funcgrad.functional`` (whose pools and convolutions already
lower to fast kernels), so gradients come from the transforms. ``NNMethods`` is one of the groups
``tensor_methods.TensorMethods`` inherits; signatures are tinygrad's (docs/tensor-api.md).
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

import funcgrad.numpy as fnp
from funcgrad import functional as F
from funcgrad.core.tensor import Tensor
from funcgrad.ir import dtypes
from funcgrad.tensor_group import TensorGroup


def _pair(value: Any, name: str, what: str) -> tuple[int, int]:
    pair = (value, value) if isinstance(value, (int, np.integer)) else tuple(value)
    if len(pair) != 2:
        raise ValueError(f"{name}: {what} must be an int or a pair, got {value!r}")
    return int(pair[0]), int(pair[1])


def _float(x: Any, name: str) -> Tensor:
    x = fnp.asarray(x)
    if not dtypes.is_float(x.dtype):
        raise TypeError(f"{name} needs a floating-point Tensor, got dtype {x.dtype.name} (cast with .float())")
    return x


def _pool_geometry(x: Tensor, kernel_size: Any, stride: Any, dilation: Any, padding: Any, ceil_mode: bool,
                   name: str) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int], list[tuple[int, int]]]:
    """Kernel, stride, dilation and the (before, after) padding of the last two axes; with
    ``ceil_mode`` the after-padding grows so a last partial window fits (PyTorch's rule: a window
    must start inside the input or the left padding)."""
    if x.ndim < 2:
        raise ValueError(f"{name}: needs a Tensor of rank >= 2 (..., H, W), got shape {x.shape}")
    kernel = _pair(kernel_size, name, "kernel_size")
    strides = kernel if stride is None else _pair(stride, name, "stride")
    dilations, pads = _pair(dilation, name, "dilation"), _pair(padding, name, "padding")
    if min(kernel) < 1 or min(strides) < 1 or min(dilations) < 1 or min(pads) < 0:
        raise ValueError(f"{name}: kernel_size, stride, dilation must be >= 1 and padding >= 0, got {kernel}, "
                         f"{strides}, {dilations}, {pads}")
    pairs = []
    for size, k, s, d, p in zip(x.shape[-2:], kernel, strides, dilations, pads):
        span = d * (k - 1) + 1
        if span > size + 2 * p:
            raise ValueError(f"{name}: kernel {kernel} (dilation {dilations}) is larger than the padded input "
                             f"{tuple(n + 2 * q for n, q in zip(x.shape[-2:], pads))}")
        extra = 0
        if ceil_mode:
            out = -(-(size + 2 * p - span) // s) + 1
            if (out - 1) * s >= size + p:
                out -= 1
            extra = max((out - 1) * s + span - (size + 2 * p), 0)
        pairs.append((p, p + extra))
    return kernel, strides, dilations, pairs


def _pad_last2(x: Tensor, pairs: Sequence[tuple[int, int]], value: Any) -> Tensor:
    if not any(a or b for a, b in pairs):
        return x
    return fnp.pad(x, [(0, 0)] * (x.ndim - 2) + list(pairs), constant_values=value)


def _crop_or_pad(x: Tensor, pairs: list[tuple[int, int]]) -> Tensor:
    """Pad the last two axes by (before, after) ``pairs``; a negative amount crops instead."""
    crop = tuple(slice(-b if b < 0 else 0, x.shape[-2 + i] + a if a < 0 else None) for i, (b, a) in enumerate(pairs))
    x = x[(slice(None),) * (x.ndim - 2) + crop]
    return _pad_last2(x, [(max(b, 0), max(a, 0)) for b, a in pairs], 0.0)


def _windows(x: Tensor, kernel: tuple[int, int], strides: tuple[int, int], dilations: tuple[int, int]) -> Tensor:
    """(..., H, W) -> (..., OH, OW, KH * KW) windows (functional's window view, kernel axes last)."""
    w = F._windows(x, kernel, strides, dilations)  # (..., KH, OH, KW, OW)
    w = fnp.moveaxis(w, (-4, -2), (-2, -1))
    return fnp.reshape(w, w.shape[:-2] + (kernel[0] * kernel[1],))


def _axis_resample(x: Tensor, axis: int, size: int, mode: str, align_corners: bool) -> Tensor:
    """Resample one axis of ``x`` to ``size`` points, as PyTorch's interpolate does per axis: the
    source indices and weights are computed here (NumPy, static) and applied with take."""
    length = x.shape[axis]
    out = np.arange(size, dtype=np.float64)
    shape = [1] * x.ndim
    shape[axis] = size

    def take(indices: np.ndarray) -> Tensor:
        return fnp.take(x, fnp.asarray(np.clip(indices, 0, length - 1).astype(np.int32)), axis=axis)

    def weight(values: np.ndarray) -> Tensor:
        return fnp.asarray(values.reshape(shape).astype(x.dtype))

    if mode in ("nearest", "nearest-exact"):
        scale = length / size
        source = np.floor(out * scale) if mode == "nearest" else np.floor((out + 0.5) * scale)
        return take(np.minimum(source, length - 1))
    if align_corners:
        source = out * ((length - 1) / (size - 1)) if size > 1 else np.zeros(size)
    else:
        source = (out + 0.5) * (length / size) - 0.5
    if mode == "linear":
        source = np.maximum(source, 0.0) if not align_corners else source
        low = np.floor(source)
        frac = source - low
        return take(low) * weight(1.0 - frac) + take(low + 1) * weight(frac)
    # cubic convolution with a = -0.75 (PyTorch's bicubic), border indices clamped
    a = -0.75
    low = np.floor(source)
    t = source - low

    def near(d: np.ndarray) -> np.ndarray:  # |d| <= 1
        return ((a + 2) * d - (a + 3)) * d * d + 1

    def far(d: np.ndarray) -> np.ndarray:  # 1 < |d| < 2
        return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a

    taps = [(low - 1, far(t + 1)), (low, near(t)), (low + 1, near(1 - t)), (low + 2, far(2 - t))]
    total: Tensor | None = None
    for indices, w in taps:
        term = take(indices) * weight(w)
        total = term if total is None else total + term
    assert total is not None
    return total


class NNMethods(TensorGroup):
    """Activations, losses and layers on Tensor (see docs/tensor-api.md)."""


    # --- activations ---------------------------------------------------------------------------
    def relu(self) -> Tensor: return fnp.maximum(self, 0)
    def relu6(self) -> Tensor: return fnp.clip(self, 0, 6)
    def elu(self, alpha: builtins.float = 1.0) -> Tensor: return F.elu(self, alpha)

    def celu(self, alpha: builtins.float = 1.0) -> Tensor:
        """max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
        x = _float(self, "celu")
        return fnp.maximum(x, 0.0) + alpha * fnp.expm1(fnp.minimum(x, 0.0) / alpha)

    def selu(self, alpha: builtins.float = 1.67326, gamma: builtins.float = 1.0507) -> Tensor:
        """gamma * elu(x, alpha), with tinygrad's rounded constants as defaults."""
        return gamma * F.elu(self, alpha)

    def hardtanh(self, min_val: builtins.float = -1, max_val: builtins.float = 1) -> Tensor:
        return fnp.clip(self, min_val, max_val)

    def hardswish(self) -> Tensor:
        return self * fnp.clip(fnp.asarray(self) + 3.0, 0.0, 6.0) / 6.0

    def hardsigmoid(self, alpha: builtins.float = 1 / 6, beta: builtins.float = 0.5) -> Tensor:
        return fnp.clip(fnp.asarray(self) * alpha + beta, 0.0, 1.0)

    def leaky_relu(self, neg_slope: builtins.float = 0.01) -> Tensor: return F.leaky_relu(self, neg_slope)
    def logsigmoid(self) -> Tensor: return -F.softplus(-fnp.asarray(self))
    def mish(self) -> Tensor: return self * fnp.tanh(F.softplus(self))
    def softplus(self, beta: builtins.float = 1.0) -> Tensor: return F.softplus(self, beta)
    def softsign(self) -> Tensor: return self / (1 + fnp.abs(self))
    def swish(self) -> Tensor: return F.silu(self)
    def silu(self) -> Tensor: return F.silu(self)
    def quick_gelu(self) -> Tensor: return self * fnp.sigmoid(fnp.asarray(self) * 1.702)

    def gelu(self, approximate: str = "tanh") -> Tensor:
        """GELU; tinygrad's default is the tanh approximation, PyTorch's ``approximate='none'``."""
        return F.gelu(self, approximate=approximate)

    def softmax(self, axis: int = -1, dtype: Any = None) -> Tensor:
        x = fnp.asarray(self) if dtype is None else fnp.astype(self, dtype)
        return F.softmax(x if dtypes.is_float(x.dtype) else fnp.astype(x, dtypes.float32), axis)

    def log_softmax(self, axis: int = -1, dtype: Any = None) -> Tensor:
        x = fnp.asarray(self) if dtype is None else fnp.astype(self, dtype)
        return F.log_softmax(x if dtypes.is_float(x.dtype) else fnp.astype(x, dtypes.float32), axis)

    def softmin(self, axis: int = -1, dtype: Any = None) -> Tensor:
        return NNMethods.softmax(-fnp.asarray(self), axis, dtype)

    def normalize(self, p: builtins.float = 2.0, dim: int = 1, eps: builtins.float = 1e-12) -> Tensor:
        """x / max(||x||_p along dim, eps) (PyTorch's F.normalize)."""
        x = _float(self, "normalize")
        norm = fnp.sum(fnp.abs(x) ** p, axis=dim, keepdims=True) ** (1.0 / p)
        return x / fnp.maximum(norm, eps)

    def one_hot(self, num_classes: int = -1) -> Tensor:
        """Integer class indices -> int32 one-hot vectors on a new last axis (-1: max + 1, concrete only)."""
        x = fnp.asarray(self)
        if not dtypes.is_int(x.dtype):
            raise TypeError(f"one_hot: needs integer class indices, got dtype {x.dtype.name}")
        if num_classes == -1:
            num_classes = int(fnp.max(x).item()) + 1 if x.size else 0
        return fnp.astype(fnp.expand_dims(x, -1) == fnp.arange(num_classes, dtype=x.dtype), dtypes.int32)

    # --- losses --------------------------------------------------------------------------------
    def binary_crossentropy(self, Y: Any, reduction: str = "mean") -> Tensor:  # noqa: N803 - tinygrad's name
        return F.binary_crossentropy(self, Y, reduction)

    def binary_crossentropy_logits(self, Y: Any, reduction: str = "mean",  # noqa: N803
                                   pos_weight: Any = None) -> Tensor:
        return F.binary_crossentropy_with_logits(self, Y, reduction, pos_weight=pos_weight)

    def sparse_categorical_crossentropy(self, Y: Any, ignore_index: int = -1,  # noqa: N803
                                        label_smoothing: builtins.float = 0.0, reduction: str = "mean") -> Tensor:
        """Cross-entropy of logits with classes on the *last* axis against integer labels."""
        return F.sparse_categorical_crossentropy(self, Y, ignore_index, label_smoothing, reduction)

    def cross_entropy(self, Y: Any, reduction: str = "mean",  # noqa: N803
                      label_smoothing: builtins.float = 0.0, ignore_index: int = -100) -> Tensor:
        """PyTorch's cross_entropy: classes on axis 1; integer targets or class probabilities."""
        return F.cross_entropy(self, Y, reduction, label_smoothing, ignore_index)

    def nll_loss(self, Y: Any, weight: Any = None, ignore_index: int | None = None,  # noqa: N803
                 reduction: str = "mean") -> Tensor:
        """Negative log-likelihood of integer targets (N, ...) for log-probabilities (N, C, ...) or
        (C,); ``weight`` (C,) weighs each class, and the mean divides by the summed weights (PyTorch)."""
        x = _float(self, "nll_loss")
        target = fnp.asarray(Y)
        if not dtypes.is_int(target.dtype):
            raise TypeError(f"nll_loss: targets must be integers, got dtype {target.dtype.name}")
        classes = x.shape[0 if x.ndim == 1 else 1]
        if not target.is_traced:  # concrete targets are checked, as PyTorch does
            values = target.numpy()
            bad = (values < 0) | (values >= classes)
            if ignore_index is not None:
                bad &= values != ignore_index
            if bad.any():
                raise IndexError(f"nll_loss: target {values[bad].flat[0]} is out of range for {classes} classes")
        class_axis = 0 if x.ndim == 1 else 1
        log_probs = fnp.moveaxis(x, class_axis, -1)
        if target.shape != log_probs.shape[:-1]:
            raise ValueError(f"nll_loss: targets of shape {target.shape} do not match input {x.shape} "
                             f"(expected {log_probs.shape[:-1]})")
        target = fnp.astype(target, dtypes.int32)
        valid = fnp.ones(target.shape, dtype=dtypes.bool_) if ignore_index is None else target != ignore_index
        safe = fnp.where(valid, target, 0)
        picked = fnp.squeeze(fnp.take_along_axis(log_probs, fnp.expand_dims(safe, -1), axis=-1), -1)
        weights = fnp.astype(valid, x.dtype)
        if weight is not None:
            weights = weights * fnp.take(fnp.asarray(weight), safe)
        losses = -picked * weights
        if reduction == "mean":
            return fnp.sum(losses) / fnp.sum(weights)
        if reduction == "sum":
            return fnp.sum(losses)
        if reduction == "none":
            return losses
        raise ValueError(f"nll_loss: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")

    # --- convolutions and pools ----------------------------------------------------------------
    def conv2d(self, weight: Any, bias: Any = None, groups: int = 1, stride: Any = 1, dilation: Any = 1,
               padding: Any = 0, dtype: Any = None) -> Tensor:
        """tinygrad's argument order; ``padding`` may also be tinygrad's flat (left, right, top, bottom)."""
        if isinstance(padding, (tuple, list)) and len(padding) == 4:
            x = NNMethods._flat_pad(self, padding)
            padding = 0
        else:
            x = fnp.asarray(self)
        out = F.conv2d(x, weight, bias, stride=stride, padding=padding, dilation=dilation, groups=groups)
        return out if dtype is None else fnp.astype(out, dtype)

    def _flat_pad(self, padding: Sequence[int]) -> Tensor:
        left, right, top, bottom = (int(p) for p in padding)
        return fnp.pad(self, [(0, 0)] * (self.ndim - 2) + [(top, bottom), (left, right)])

    def conv_transpose2d(self, weight: Any, bias: Any = None, groups: int = 1, stride: Any = 1, dilation: Any = 1,
                         padding: Any = 0, output_padding: Any = 0) -> Tensor:
        """The gradient of conv2d w.r.t. its input, as a layer: x (N, Cin, H, W), weight (Cin, Cout /
        groups, KH, KW). Built as a conv2d of the stride-dilated input with the flipped kernel."""
        name = "conv_transpose2d"
        x, w = _float(self, name), _float(weight, name)
        if x.ndim != 4 or w.ndim != 4 or x.shape[1] != w.shape[0] or w.shape[0] % groups:
            raise ValueError(f"{name}: expected x (N, Cin, H, W) and weight (Cin, Cout/groups, KH, KW) with Cin "
                             f"divisible by groups={groups}; got {x.shape} and {w.shape}")
        strides, dilations = _pair(stride, name, "stride"), _pair(dilation, name, "dilation")
        pads, extra = _pair(padding, name, "padding"), _pair(output_padding, name, "output_padding")
        if any(e >= max(s, d) for e, s, d in zip(extra, strides, dilations)):
            raise ValueError(f"{name}: output_padding {extra} must be smaller than stride {strides} or dilation "
                             f"{dilations}")
        n, cin, height, width = x.shape
        sh, sw = strides
        if sh > 1 or sw > 1:  # put stride - 1 zeros between the input elements
            x = fnp.reshape(x, (n, cin, height, 1, width, 1))
            x = fnp.pad(x, [(0, 0), (0, 0), (0, 0), (0, sh - 1), (0, 0), (0, sw - 1)])
            x = fnp.reshape(x, (n, cin, height * sh, width * sw))[:, :, :(height - 1) * sh + 1, :(width - 1) * sw + 1]
        kh, kw = w.shape[2:]
        pairs = []
        for k, d, p, e in zip((kh, kw), dilations, pads, extra):
            edge = d * (k - 1) - p
            pairs.append((edge, edge + e))
        x = _crop_or_pad(x, pairs)
        cout_g = w.shape[1]
        w = fnp.reshape(w, (groups, cin // groups, cout_g, kh, kw))
        w = fnp.reshape(fnp.swapaxes(w, 1, 2), (groups * cout_g, cin // groups, kh, kw))
        w = fnp.flip(w, axis=(2, 3))
        return F.conv2d(x, w, bias, stride=1, padding=0, dilation=dilations, groups=groups)

    def max_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1, padding: Any = 0,
                   ceil_mode: builtins.bool = False, return_indices: builtins.bool = False) -> Any:
        """Maximum over windows of the last two axes (-inf padding). ``return_indices`` also gives
        each maximum's flat index into H * W (PyTorch's, for ``max_unpool2d``)."""
        x = fnp.asarray(self)
        kernel, strides, dilations, pairs = _pool_geometry(x, kernel_size, stride, dilation, padding, ceil_mode,
                                                           "max_pool2d")
        if not return_indices and not ceil_mode and x.ndim in (3, 4):
            return F.max_pool2d(x, kernel, strides, (pairs[0][0], pairs[1][0]), dilations)
        low = -np.inf if dtypes.is_float(x.dtype) else np.iinfo(x.dtype).min
        windows = _windows(_pad_last2(x, pairs, low), kernel, strides, dilations)
        values = fnp.max(windows, axis=-1)
        if not return_indices:
            return values
        height, width = x.shape[-2:]
        flat = np.arange(height * width, dtype=np.int32).reshape(height, width)
        flat = np.pad(flat, pairs, constant_values=-1)
        places = _windows(fnp.asarray(flat), kernel, strides, dilations)  # (OH, OW, K)
        first = fnp.argmax(windows, axis=-1)  # the first maximum in each window, as PyTorch
        indices = fnp.squeeze(fnp.take_along_axis(fnp.broadcast_to(places, windows.shape),
                                                  fnp.expand_dims(first, -1), axis=-1), -1)
        return values, indices

    def avg_pool2d(self, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1, padding: Any = 0,
                   ceil_mode: builtins.bool = False, count_include_pad: builtins.bool = True) -> Tensor:
        """Mean over windows; the divisor counts the zero padding with ``count_include_pad`` but
        never the extra ``ceil_mode`` positions (as PyTorch)."""
        x = _float(self, "avg_pool2d")
        kernel, strides, dilations, pairs = _pool_geometry(x, kernel_size, stride, dilation, padding, ceil_mode,
                                                           "avg_pool2d")
        sums = fnp.sum(_windows(_pad_last2(x, pairs, 0.0), kernel, strides, dilations), axis=-1)
        inside = np.ones(x.shape[-2:], dtype=x.dtype)
        if count_include_pad:
            inside = np.pad(inside, [(p, p) for p, _ in pairs], constant_values=1)
            inside = np.pad(inside, [(0, b - a) for a, b in pairs])
        else:
            inside = np.pad(inside, pairs)
        counts = fnp.sum(_windows(fnp.asarray(inside), kernel, strides, dilations), axis=-1)
        return sums / counts

    def max_unpool2d(self, indices: Any, kernel_size: Any = (2, 2), stride: Any = None, dilation: Any = 1,
                     padding: Any = 0, output_size: Any = None) -> Tensor:
        """Scatter pooled values back to the flat H * W positions ``indices`` (from
        ``max_pool2d(..., return_indices=True)``); elsewhere zeros."""
        x, idx = fnp.asarray(self), fnp.asarray(indices)
        if x.shape != idx.shape or x.ndim < 2:
            raise ValueError(f"max_unpool2d: values {x.shape} and indices {idx.shape} must have one shape (..., H, W)")
        kernel = _pair(kernel_size, "max_unpool2d", "kernel_size")
        strides = kernel if stride is None else _pair(stride, "max_unpool2d", "stride")
        dilations, pads = _pair(dilation, "max_unpool2d", "dilation"), _pair(padding, "max_unpool2d", "padding")
        if output_size is None:
            output_size = tuple((n - 1) * s - 2 * p + d * (k - 1) + 1
                                for n, s, p, d, k in zip(x.shape[-2:], strides, pads, dilations, kernel))
        height, width = tuple(output_size)[-2:]
        lead = x.shape[:-2]
        flat_x = fnp.reshape(x, lead + (-1,))
        flat_i = fnp.reshape(idx, lead + (-1,))
        out = fnp.zeros(lead + (height * width,), dtype=x.dtype)
        grids = [fnp.broadcast_to(fnp.reshape(fnp.arange(n, dtype=dtypes.int32), (n,) + (1,) * (len(lead) - a)),
                                  flat_i.shape) for a, n in enumerate(lead)]
        out = out.at[tuple(grids) + (flat_i,)].set(flat_x)
        return fnp.reshape(out, lead + (height, width))

    def interpolate(self, size: Sequence[int], mode: str = "linear", align_corners: builtins.bool = False) -> Tensor:
        """Resize the last ``len(size)`` axes with 'nearest', 'nearest-exact', 'linear' (any number of
        axes; 'bilinear' is its 2-axis name) or 'bicubic' (2 axes), with PyTorch's coordinate rules."""
        modes = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic")
        if mode not in modes:
            raise ValueError(f"interpolate: mode must be one of {modes}, got {mode!r}")
        x = fnp.asarray(self)
        size = tuple(int(s) for s in size)
        if not 0 < len(size) <= x.ndim or min(size) <= 0:
            raise ValueError(f"interpolate: size {size} must give positive sizes for up to {x.ndim} trailing axes")
        if mode in ("bilinear", "bicubic") and len(size) != 2:
            raise ValueError(f"interpolate: mode {mode!r} resizes 2 axes, got size {size}")
        if align_corners and mode.startswith("nearest"):
            raise ValueError("interpolate: align_corners applies only to the linear and cubic modes")
        dtype = x.dtype
        if not mode.startswith("nearest") and not dtypes.is_float(dtype):
            x = fnp.astype(x, dtypes.float32)  # computed in float, cast back (tinygrad)
        kind = "linear" if mode == "bilinear" else "cubic" if mode == "bicubic" else mode
        for i, target in enumerate(size):
            axis = x.ndim - len(size) + i
            if x.shape[axis] != target or kind == "cubic":
                x = _axis_resample(x, axis, target, kind, align_corners)
        return x if x.dtype == dtype else fnp.astype(x, dtype)

    # --- attention -----------------------------------------------------------------------------
    def scaled_dot_product_attention(self, key: Any, value: Any, attn_mask: Any = None,
                                     dropout_p: builtins.float = 0.0, is_causal: builtins.bool = False,
                                     enable_gqa: builtins.bool = False) -> Tensor:
        """softmax(q k^T / sqrt(E) + mask) v (PyTorch's): a bool mask says where to attend, a float
        one is added; dropout on the weights applies in ``Tensor.train()`` mode only (tinygrad);
        ``enable_gqa`` repeats the key/value heads (axis -3) to the query's."""
        q, k, v = fnp.asarray(self), fnp.asarray(key), fnp.asarray(value)
        if enable_gqa and q.ndim >= 3 and k.shape[-3] != q.shape[-3]:
            if q.shape[-3] % k.shape[-3]:
                raise ValueError(f"scaled_dot_product_attention: {q.shape[-3]} query heads are not a multiple of "
                                 f"{k.shape[-3]} key heads")
            repeats = q.shape[-3] // k.shape[-3]
            k, v = fnp.repeat(k, repeats, axis=-3), fnp.repeat(v, repeats, axis=-3)
        from funcgrad.autograd import is_training
        if dropout_p == 0.0 or not is_training():
            return F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal)
        scores = fnp.matmul(q, fnp.matrix_transpose(k)) / math.sqrt(q.shape[-1])
        if is_causal:
            attn_mask = fnp.asarray(np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool)))
        if attn_mask is not None:
            mask = fnp.asarray(attn_mask)
            scores = fnp.where(mask, scores, -np.inf) if dtypes.is_bool(mask.dtype) else scores + mask
        weights = F.dropout(F.softmax(scores, -1), dropout_p, training=True)
        return fnp.matmul(weights, v)

