"""funcgrad.functional: convolution, pooling, norms, activations, dropout, losses and attention as
pure functions on arrays (PyTorch's ``torch.nn.functional`` names, argument orders and layouts:
NCHW inputs, OIHW weights, (out, in) linear weights).

Like ``jax.nn`` it is part of the array front, below the training layer: the Tensor methods
(``x.conv2d``, ``x.relu``, ...) call it, and ``funcgrad.nn.functional`` (the name users import,
``import funcgrad.nn.functional as F``) re-exports it for the layers of ``funcgrad.nn``.

Everything here is a composition of ``funcgrad.numpy`` operations (and the convolution primitive), so
it works eagerly on lazy Tensors and under ``jit``, ``grad``, ``vmap`` and ``jvp`` without rules of its own.

Convolution binds the ``conv_general_dilated`` primitive (``lax.conv_general_dilated``), whose
gradients are again convolutions; the compiler lowers it (``lower/conv.py``). Pooling sees its input
through *window views* built from movement operations only (pad, broadcast, reshape, strided slice;
the trick tinygrad's ``_pool`` uses): the view of an axis of length L as (k, o) windows is the axis
repeated, flattened and re-read with rows of L + d elements, so element (j, i) is
x[i * stride + j * dilation]. The compiler turns those reshapes back into affine indices, so a
pooling is one reduction. When windows do not overlap (stride >= kernel, e.g. 2x2 pooling) a plain
reshape is enough.

>>> import funcgrad as fg
>>> from funcgrad import functional as F
>>> F.conv2d(fg.Tensor.ones(1, 1, 4, 4), fg.Tensor.ones(1, 1, 3, 3)).tolist()
[[[[9.0, 9.0], [9.0, 9.0]]]]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

import funcgrad.numpy as fnp
from funcgrad import random
from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import ArrayLike
from funcgrad.transforms import custom_jvp

__all__ = [
    "adaptive_avg_pool2d", "avg_pool2d", "batch_norm", "binary_crossentropy", "binary_crossentropy_with_logits",
    "conv1d", "conv2d", "cross_entropy", "dropout", "elu", "embedding", "gelu", "group_norm", "l1_loss",
    "layer_norm", "leaky_relu", "linear", "log_softmax", "logsumexp", "max_pool2d", "mse", "mse_loss",
    "nll_loss", "relu", "rms_norm", "scaled_dot_product_attention", "sigmoid", "silu", "softmax", "softplus",
    "sparse_categorical_crossentropy", "tanh",
]

IntPair = int | Sequence[int]


def _float_tensor(x: ArrayLike, name: str, what: str = "input") -> Tensor:
    x = fnp.asarray(x)
    if not dtypes.is_float(x.dtype):
        raise TypeError(f"{name}: {what} must be a floating-point array, got dtype {x.dtype.name}")
    return x


def _pair(value: IntPair, name: str, what: str) -> tuple[int, int]:
    if isinstance(value, (int, np.integer)):
        return int(value), int(value)
    pair = tuple(value)
    if len(pair) != 2 or not all(isinstance(v, (int, np.integer)) for v in pair):
        raise ValueError(f"{name}: {what} must be an int or a pair of ints, got {value!r}")
    return int(pair[0]), int(pair[1])


# --- window views --------------------------------------------------------------------------------


def _window_axis(x: Tensor, axis: int, kernel: int, stride: int, dilation: int) -> Tensor:
    """Replace ``axis`` (length L) by two axes (kernel, out) with value ``x[o * stride + j * dilation]``
    at (j, o), using movement operations only."""
    length = x.shape[axis]
    span = dilation * (kernel - 1) + 1
    out = (length - span) // stride + 1
    before, after = x.shape[:axis], x.shape[axis + 1:]
    if dilation == 1 and kernel <= stride:
        # windows do not overlap: crop to out * stride and split the axis into (out, stride)
        needed = out * stride
        if needed > length:  # the last window ends before the padding the reshape needs
            x = fnp.pad(x, [(0, 0)] * axis + [(0, needed - length)] + [(0, 0)] * len(after))
        x = _slice(x, axis, 0, needed)
        x = fnp.reshape(x, before + (out, stride) + after)
        x = _slice(x, axis + 1, 0, kernel)
        return fnp.moveaxis(x, axis + 1, axis)
    # overlapping windows: repeat the axis, flatten, and re-read it in rows of L + dilation
    row = length + dilation
    repeats = -(-kernel * row // length)
    x = fnp.expand_dims(x, axis)
    x = fnp.broadcast_to(x, before + (repeats, length) + after)
    x = fnp.reshape(x, before + (repeats * length,) + after)
    x = _slice(x, axis, 0, kernel * row)
    x = fnp.reshape(x, before + (kernel, row) + after)
    return _slice(x, axis + 1, 0, (out - 1) * stride + 1, stride)


def _slice(x: Tensor, axis: int, start: int, stop: int, step: int = 1) -> Tensor:
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop, step)
    return x[tuple(index)]


def _windows(x: Tensor, kernel: tuple[int, int], stride: tuple[int, int],
             dilation: tuple[int, int]) -> Tensor:
    """(..., H, W) -> (..., KH, OH, KW, OW) window view of the last two axes."""
    x = _window_axis(x, x.ndim - 2, kernel[0], stride[0], dilation[0])
    return _window_axis(x, x.ndim - 1, kernel[1], stride[1], dilation[1])


def _pad_spatial(x: Tensor, padding: tuple[tuple[int, int], tuple[int, int]], value: float = 0.0) -> Tensor:
    if not any(sum(p) for p in padding):
        return x
    return fnp.pad(x, [(0, 0)] * (x.ndim - 2) + list(padding), constant_values=value)


def _batched(x: Tensor, name: str, spatial: int = 2) -> tuple[Tensor, bool]:
    """Accept (C, *spatial) as PyTorch does by adding a batch axis; returns (x, was_unbatched)."""
    if x.ndim == spatial + 1:
        return fnp.expand_dims(x, 0), True
    if x.ndim != spatial + 2:
        dims = "HW"[-spatial:] if spatial <= 2 else ""
        raise ValueError(f"{name}: input must be N C {' '.join(dims)} or C {' '.join(dims)} "
                         f"(rank {spatial + 2} or {spatial + 1}), got shape {x.shape}")
    return x, False


# --- convolution ---------------------------------------------------------------------------------


def _conv_padding(padding: IntPair | str, kernel: tuple[int, int], stride: tuple[int, int],
                  dilation: tuple[int, int], name: str) -> tuple[tuple[int, int], tuple[int, int]]:
    if isinstance(padding, str):
        if padding == "valid":
            return (0, 0), (0, 0)
        if padding == "same":
            if stride != (1, 1):
                raise ValueError(f"{name}: padding='same' needs stride 1, got stride {stride}")
            totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
            return (totals[0] // 2, totals[0] - totals[0] // 2), (totals[1] // 2, totals[1] - totals[1] // 2)
        raise ValueError(f"{name}: padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
    ph, pw = _pair(padding, name, "padding")
    if ph < 0 or pw < 0:
        raise ValueError(f"{name}: padding must be non-negative, got {padding!r}")
    return (ph, ph), (pw, pw)


def conv2d(x: ArrayLike, weight: ArrayLike, bias: ArrayLike | None = None, stride: IntPair = 1,
           padding: IntPair | str = 0, dilation: IntPair = 1, groups: int = 1) -> Tensor:
    """2-d convolution (cross-correlation, as PyTorch): x (N, C, H, W) or (C, H, W), weight
    (O, C // groups, KH, KW), bias (O,). Returns (N, O, OH, OW).

    >>> conv2d(fnp.ones((1, 2, 5, 5)), fnp.ones((3, 2, 3, 3)), padding=1).shape
    (1, 3, 5, 5)
    """
    name = "conv2d"
    x, unbatched = _batched(_float_tensor(x, name), name)
    weight = _float_tensor(weight, name, "weight")
    if weight.ndim != 4:
        raise ValueError(f"{name}: weight must be (out_channels, in_channels // groups, KH, KW), got shape "
                         f"{weight.shape}")
    channels = x.shape[1]
    out_channels, group_channels, kh, kw = weight.shape
    if not isinstance(groups, int) or groups < 1:
        raise ValueError(f"{name}: groups must be a positive int, got {groups!r}")
    if channels % groups or out_channels % groups:
        raise ValueError(f"{name}: groups={groups} must divide both the input channels ({channels}) and the "
                         f"output channels ({out_channels})")
    if group_channels * groups != channels:
        raise ValueError(f"{name}: weight of shape {weight.shape} expects {group_channels * groups} input "
                         f"channels (groups={groups}), got input of shape {x.shape} with {channels}")
    stride2, dilation2 = _pair(stride, name, "stride"), _pair(dilation, name, "dilation")
    if min(stride2) < 1 or min(dilation2) < 1:
        raise ValueError(f"{name}: stride and dilation must be >= 1, got stride={stride!r} dilation={dilation!r}")
    pads = _conv_padding(padding, (kh, kw), stride2, dilation2, name)
    spans = [d * (k - 1) + 1 for k, d in zip((kh, kw), dilation2)]
    padded = [size + lo + hi for size, (lo, hi) in zip(x.shape[2:], pads)]
    if spans[0] > padded[0] or spans[1] > padded[1]:
        raise ValueError(f"{name}: kernel of size {(kh, kw)} (dilated: {tuple(spans)}) is larger than the padded "
                         f"input of size {tuple(padded)}")
    dtype = fnp.result_type(x, weight)
    out = bind(P.conv_general_dilated_p, x.astype(dtype), weight.astype(dtype), window_strides=stride2,
               padding=pads, lhs_dilation=(1, 1), rhs_dilation=dilation2, feature_group_count=groups)
    if bias is not None:
        out = out + _channel_vector(bias, out_channels, name, "bias", out.ndim)
    return out[0] if unbatched else out


def _channel_vector(value: ArrayLike, channels: int, name: str, what: str, ndim: int) -> Tensor:
    """A per-channel (C,) vector shaped to broadcast against (N, C, ...)."""
    value = fnp.asarray(value)
    if value.shape != (channels,):
        raise ValueError(f"{name}: {what} must have shape ({channels},), got {value.shape}")
    return fnp.reshape(value, (channels,) + (1,) * (ndim - 2))


def conv1d(x: ArrayLike, weight: ArrayLike, bias: ArrayLike | None = None, stride: int = 1,
           padding: int | str = 0, dilation: int = 1, groups: int = 1) -> Tensor:
    """1-d convolution: x (N, C, L) or (C, L), weight (O, C // groups, K); a conv2d with H = 1."""
    name = "conv1d"
    x, unbatched = _batched(_float_tensor(x, name), name, spatial=1)
    weight = _float_tensor(weight, name, "weight")
    if weight.ndim != 3:
        raise ValueError(f"{name}: weight must be (out_channels, in_channels // groups, K), got shape {weight.shape}")
    if x.shape[1] != weight.shape[1] * groups:  # checked here, else conv2d's message would show the inserted axis
        raise ValueError(f"{name}: weight of shape {weight.shape} expects {weight.shape[1] * groups} input channels "
                         f"(groups={groups}), got input of shape {x.shape} with {x.shape[1]}")
    padding2d: IntPair | str = padding if isinstance(padding, str) else (0, padding)
    out = conv2d(fnp.expand_dims(x, 2), fnp.expand_dims(weight, 2), bias, stride=(1, stride), padding=padding2d,
                 dilation=(1, dilation), groups=groups)
    out = out[:, :, 0]
    return out[0] if unbatched else out


def linear(x: ArrayLike, weight: ArrayLike, bias: ArrayLike | None = None) -> Tensor:
    """``x @ weight.T + bias`` with weight (out_features, in_features), as PyTorch.

    >>> linear(fnp.ones((2, 3)), fnp.ones((4, 3))).shape
    (2, 4)
    """
    x, weight = fnp.asarray(x), fnp.asarray(weight)
    if weight.ndim != 2:
        raise ValueError(f"linear: weight must be (out_features, in_features), got shape {weight.shape}")
    if x.ndim < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"linear: input of shape {x.shape} does not match weight of shape {weight.shape} "
                         f"(expected the last input axis to be {weight.shape[1]})")
    out = fnp.matmul(x, fnp.matrix_transpose(weight))
    if bias is not None:
        bias = fnp.asarray(bias)
        if bias.shape != (weight.shape[0],):
            raise ValueError(f"linear: bias must have shape ({weight.shape[0]},), got {bias.shape}")
        out = out + bias
    return out


# --- pooling -------------------------------------------------------------------------------------


def _pool_args(x: ArrayLike, kernel_size: IntPair, stride: IntPair | None, padding: IntPair, dilation: IntPair,
               name: str) -> tuple[Tensor, bool, tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]:
    x, unbatched = _batched(fnp.asarray(x), name)
    kernel = _pair(kernel_size, name, "kernel_size")
    strides = kernel if stride is None else _pair(stride, name, "stride")
    pads, dilations = _pair(padding, name, "padding"), _pair(dilation, name, "dilation")
    if min(kernel) < 1 or min(strides) < 1 or min(dilations) < 1:
        raise ValueError(f"{name}: kernel_size, stride and dilation must be >= 1, got {kernel}, {strides}, "
                         f"{dilations}")
    if any(p < 0 or 2 * p > k for p, k in zip(pads, kernel)):
        raise ValueError(f"{name}: padding must be between 0 and half the kernel size {kernel}, got {pads}")
    for size, pad, k, d in zip(x.shape[2:], pads, kernel, dilations):
        if d * (k - 1) + 1 > size + 2 * pad:
            raise ValueError(f"{name}: kernel of size {kernel} (dilation {dilations}) is larger than the padded "
                             f"input of size {tuple(s + 2 * p for s, p in zip(x.shape[2:], pads))}")
    return x, unbatched, kernel, strides, pads, dilations


def max_pool2d(x: ArrayLike, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               dilation: IntPair = 1) -> Tensor:
    """Maximum over (KH, KW) windows of (N, C, H, W) or (C, H, W); stride defaults to the kernel size,
    padding is -inf (as PyTorch).

    >>> max_pool2d(fnp.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
    [[[[5.0, 7.0], [13.0, 15.0]]]]
    """
    x, unbatched, kernel, strides, pads, dilations = _pool_args(x, kernel_size, stride, padding, dilation,
                                                                "max_pool2d")
    low = -np.inf if dtypes.is_float(x.dtype) else dtypes.iinfo(x.dtype).min
    x = _pad_spatial(x, ((pads[0], pads[0]), (pads[1], pads[1])), low)
    out = fnp.max(_windows(x, kernel, strides, dilations), axis=(-4, -2))
    return out[0] if unbatched else out


def avg_pool2d(x: ArrayLike, kernel_size: IntPair, stride: IntPair | None = None, padding: IntPair = 0,
               count_include_pad: bool = True) -> Tensor:
    """Mean over (KH, KW) windows; with ``count_include_pad`` (PyTorch's default) the zero padding counts
    towards the divisor, otherwise only the input elements in each window do.

    >>> avg_pool2d(fnp.arange(16.0).reshape(1, 1, 4, 4), 2).tolist()
    [[[[2.5, 4.5], [10.5, 12.5]]]]
    """
    x, unbatched, kernel, strides, pads, dilations = _pool_args(_float_tensor(x, "avg_pool2d"), kernel_size, stride,
                                                                padding, 1, "avg_pool2d")
    padding2 = ((pads[0], pads[0]), (pads[1], pads[1]))
    sums = fnp.sum(_windows(_pad_spatial(x, padding2), kernel, strides, dilations), axis=(-4, -2))
    if count_include_pad or not any(pads):
        out = sums / (kernel[0] * kernel[1])
    else:
        ones = _pad_spatial(fnp.ones(x.shape[2:], dtype=x.dtype), padding2)
        counts = fnp.sum(_windows(ones, kernel, strides, dilations), axis=(-4, -2))
        out = sums / counts
    return out[0] if unbatched else out


def _adaptive_matrix(size: int, out: int, dtype: Any) -> Tensor:
    """(out, size) averaging matrix of PyTorch's adaptive pooling bins [floor(i*n/o), ceil((i+1)*n/o))."""
    matrix = np.zeros((out, size))
    for i in range(out):
        start, stop = (i * size) // out, -(-((i + 1) * size) // out)
        matrix[i, start:stop] = 1.0 / (stop - start)
    return fnp.asarray(matrix, dtype=dtype)


def adaptive_avg_pool2d(x: ArrayLike, output_size: IntPair) -> Tensor:
    """Average pooling to a fixed (OH, OW), with PyTorch's bins (possibly overlapping)."""
    name = "adaptive_avg_pool2d"
    x, unbatched = _batched(_float_tensor(x, name), name)
    oh, ow = _pair(output_size, name, "output_size")
    h, w = x.shape[2:]
    if oh < 1 or ow < 1:
        raise ValueError(f"{name}: output_size must be positive, got {output_size!r}")
    if h % oh == 0 and w % ow == 0:
        out = avg_pool2d(x, (h // oh, w // ow))
    else:
        rows, cols = _adaptive_matrix(h, oh, x.dtype), _adaptive_matrix(w, ow, x.dtype)
        out = fnp.einsum("nchw,ph,qw->ncpq", x, rows, cols)
    return out[0] if unbatched else out


# --- normalization -------------------------------------------------------------------------------


def _normalized_axes(x: Tensor, normalized_shape: int | Sequence[int], name: str) -> tuple[int, ...]:
    if isinstance(normalized_shape, (int, np.integer)):
        shape: tuple[int, ...] = (int(normalized_shape),)
    elif isinstance(normalized_shape, Sequence) and all(isinstance(d, (int, np.integer)) for d in normalized_shape):
        shape = tuple(normalized_shape)
    else:
        raise TypeError(f"{name}: normalized_shape must be an int or a sequence of ints, got {normalized_shape!r}")
    if len(shape) > x.ndim or tuple(x.shape[x.ndim - len(shape):]) != shape:
        raise ValueError(f"{name}: normalized_shape {shape} does not match the trailing axes of the input "
                         f"of shape {x.shape}")
    return tuple(range(x.ndim - len(shape), x.ndim))


def _check_shape(value: ArrayLike | None, shape: tuple[int, ...], name: str, what: str) -> Tensor | None:
    if value is None:
        return None
    value = fnp.asarray(value)
    if value.shape != shape:
        raise ValueError(f"{name}: {what} must have shape {shape}, got {value.shape}")
    return value


def _statistics_dtype(x: Tensor) -> Tensor:
    """float16/bfloat16 statistics in float32 (as PyTorch and Flax): squares of values above ~256
    overflow float16, and a low-precision mean loses most of its digits."""
    return x.astype(dtypes.float32) if x.dtype in dtypes.LOW_PRECISION else x


def _shift(x: Tensor, axes: tuple[int, ...]) -> Tensor:
    """The first element over ``axes`` of each group, a constant for differentiation. Statistics of
    ``x - shift`` lose nothing to a large common offset (1e4 + noise, or a constant row, whose
    centered values then come out exactly 0); the result does not depend on the shift."""
    first = x[tuple(slice(0, 1) if axis in axes else slice(None) for axis in range(x.ndim))]
    return bind(P.stop_gradient_p, first)


def _normalize(x: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
    low = _statistics_dtype(x)
    shifted = low - _shift(low, axes)
    centered = shifted - fnp.mean(shifted, axis=axes, keepdims=True)
    variance = fnp.mean(fnp.square(centered), axis=axes, keepdims=True)
    return (centered * fnp.rsqrt(variance + eps)).astype(x.dtype)


def layer_norm(x: ArrayLike, normalized_shape: int | Sequence[int], weight: ArrayLike | None = None,
               bias: ArrayLike | None = None, eps: float = 1e-5) -> Tensor:
    """Normalize over the trailing ``normalized_shape`` axes (biased variance), then scale and shift.

    >>> [round(v, 4) for v in layer_norm(fnp.asarray([[1.0, 3.0]]), 2)[0].tolist()]
    [-1.0, 1.0]
    """
    x = _float_tensor(x, "layer_norm")
    axes = _normalized_axes(x, normalized_shape, "layer_norm")
    shape = tuple(x.shape[a] for a in axes)
    out = _normalize(x, axes, eps)
    if (w := _check_shape(weight, shape, "layer_norm", "weight")) is not None:
        out = out * w
    if (b := _check_shape(bias, shape, "layer_norm", "bias")) is not None:
        out = out + b
    return out


def rms_norm(x: ArrayLike, normalized_shape: int | Sequence[int], weight: ArrayLike | None = None,
             eps: float = 1e-6) -> Tensor:
    """``x / sqrt(mean(x**2) + eps) * weight`` over the trailing ``normalized_shape`` axes."""
    x = _float_tensor(x, "rms_norm")
    axes = _normalized_axes(x, normalized_shape, "rms_norm")
    low = _statistics_dtype(x)
    out = (low * fnp.rsqrt(fnp.mean(fnp.square(low), axis=axes, keepdims=True) + eps)).astype(x.dtype)
    w = _check_shape(weight, tuple(x.shape[a] for a in axes), "rms_norm", "weight")
    return out if w is None else out * w


def group_norm(x: ArrayLike, num_groups: int, weight: ArrayLike | None = None, bias: ArrayLike | None = None,
               eps: float = 1e-5) -> Tensor:
    """Normalize (N, C, ...) over each group of C // num_groups channels and all spatial axes, then apply a
    per-channel scale and shift."""
    name = "group_norm"
    x = _float_tensor(x, name)
    if x.ndim < 2:
        raise ValueError(f"{name}: input must be (N, C, ...), got shape {x.shape}")
    channels = x.shape[1]
    if isinstance(num_groups, bool) or not isinstance(num_groups, (int, np.integer)) or num_groups < 1 \
            or channels % num_groups:
        raise ValueError(f"{name}: num_groups={num_groups!r} must divide the {channels} channels (a positive int)")
    grouped = fnp.reshape(x, (x.shape[0], num_groups, -1))
    out = fnp.reshape(_normalize(grouped, (2,), eps), x.shape)
    if weight is not None:
        out = out * _channel_vector(weight, channels, name, "weight", x.ndim)
    if bias is not None:
        out = out + _channel_vector(bias, channels, name, "bias", x.ndim)
    return out


def batch_norm(x: ArrayLike, running_mean: ArrayLike | None, running_var: ArrayLike | None,
               weight: ArrayLike | None = None, bias: ArrayLike | None = None, training: bool = False,
               momentum: float = 0.1, eps: float = 1e-5) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Batch normalization of (N, C, ...) per channel C. Returns ``(y, new_running_mean, new_running_var)``
    without mutating anything: in training the batch statistics normalize and the running ones move by
    ``momentum`` towards the batch mean and *unbiased* variance (as PyTorch); in eval the running
    statistics normalize and come back unchanged.

    >>> y, mean, var = batch_norm(fnp.asarray([[1.0], [3.0]]), fnp.zeros(1), fnp.ones(1), training=True)
    >>> mean.tolist(), var.tolist()
    ([0.20000000298023224], [1.100000023841858])
    """
    name = "batch_norm"
    x = given = _float_tensor(x, name)
    if x.ndim < 2:
        raise ValueError(f"{name}: input must be (N, C, ...), got shape {x.shape}")
    channels = x.shape[1]
    axes = (0,) + tuple(range(2, x.ndim))
    count = x.size // channels
    mean_in = _check_shape(running_mean, (channels,), name, "running_mean")
    var_in = _check_shape(running_var, (channels,), name, "running_var")
    if (mean_in is None) != (var_in is None):
        raise ValueError(f"{name}: give both running_mean and running_var, or neither")
    if training:
        if count < 2:
            raise ValueError(f"{name}: training needs more than one value per channel, got input of shape "
                             f"{x.shape}")
        x = _statistics_dtype(x)
        shift = _shift(x, axes)
        shifted = x - shift
        shifted_mean = fnp.mean(shifted, axis=axes)
        centered = shifted - _channel_vector(shifted_mean, channels, name, "mean", x.ndim)
        variance = fnp.mean(fnp.square(centered), axis=axes)
        mean = shifted_mean + fnp.reshape(shift, (channels,))
        new_mean, new_var = mean_in, var_in
        if mean_in is not None and var_in is not None:
            new_mean = ((1 - momentum) * mean_in + momentum * mean).astype(mean_in.dtype)
            new_var = ((1 - momentum) * var_in + momentum * variance * (count / (count - 1))).astype(var_in.dtype)
    else:
        if mean_in is None or var_in is None:
            raise ValueError(f"{name}: eval mode (training=False) needs running_mean and running_var")
        mean, variance, new_mean, new_var = mean_in, var_in, mean_in, var_in
        centered = x - _channel_vector(mean, channels, name, "mean", x.ndim)
    # (x - mean) * scale, not x * scale - mean * scale: the gradient of the scale is then one sum of
    # dy * (x - mean), not the difference of two large sums (which lost percents in float32)
    scale = fnp.rsqrt(variance + eps)
    if weight is not None:
        scale = scale * _check_shape(weight, (channels,), name, "weight")
    y = centered * _channel_vector(scale, channels, name, "scale", x.ndim)
    if bias is not None:
        y = y + _channel_vector(_check_shape(bias, (channels,), name, "bias"), channels, name, "bias", x.ndim)
    return y.astype(given.dtype), new_mean, new_var


def dropout(x: ArrayLike, rate: float = 0.5, key: ArrayLike | None = None, training: bool = True) -> Tensor:
    """Zero each element with probability ``rate`` and scale the rest by 1 / (1 - rate). With a ``key``
    (funcgrad.random) it is pure; with ``key=None`` it draws from the global key (``Tensor.manual_seed``)
    when called, so inside ``jit`` the mask drawn at trace time is reused by every call: pass a key there.
    The identity when not training or when rate is 0.

    >>> dropout(fnp.ones(3), 0.5, training=False).tolist()
    [1.0, 1.0, 1.0]
    """
    x = _float_tensor(x, "dropout")
    if not isinstance(rate, (int, float)) or not 0.0 <= rate <= 1.0:
        raise ValueError(f"dropout: rate must be in [0, 1], got {rate!r}")
    if not training or rate == 0.0:
        return x
    if rate == 1.0:
        return fnp.zeros_like(x)
    keep = random.bernoulli(random.next_key() if key is None else key, 1.0 - rate, x.shape)
    return fnp.where(keep, x / (1.0 - rate), 0.0).astype(x.dtype)


# --- activations ---------------------------------------------------------------------------------


def relu(x: ArrayLike) -> Tensor:
    """max(x, 0)."""
    return fnp.maximum(x, 0)


def sigmoid(x: ArrayLike) -> Tensor:
    """1 / (1 + exp(-x))."""
    return fnp.sigmoid(x)


def tanh(x: ArrayLike) -> Tensor:
    """The hyperbolic tangent."""
    return fnp.tanh(x)


def silu(x: ArrayLike) -> Tensor:
    """x * sigmoid(x) (also called swish)."""
    x = fnp.asarray(x)
    return x * fnp.sigmoid(x)


def gelu(x: ArrayLike, approximate: str = "none") -> Tensor:
    """x * Phi(x) with the exact error function, or its tanh approximation (``approximate='tanh'``)."""
    x = _float_tensor(x, "gelu")
    if approximate == "none":
        return 0.5 * x * (1.0 + fnp.erf(x * (1.0 / math.sqrt(2.0))))
    if approximate == "tanh":
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)
        return 0.5 * x * (1.0 + fnp.tanh(inner))
    raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")


def leaky_relu(x: ArrayLike, negative_slope: float = 0.01) -> Tensor:
    """x where x >= 0, negative_slope * x elsewhere."""
    x = fnp.asarray(x)
    return fnp.where(x >= 0, x, x * negative_slope)


def elu(x: ArrayLike, alpha: float = 1.0) -> Tensor:
    """x where x > 0, alpha * (exp(x) - 1) elsewhere."""
    x = _float_tensor(x, "elu")
    # expm1 of min(x, 0): the unused branch must not overflow, or its zero cotangent times inf is NaN
    return fnp.where(x > 0, x, alpha * fnp.expm1(fnp.minimum(x, 0.0)))


def softplus(x: ArrayLike, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """log(1 + exp(beta * x)) / beta, linear where beta * x > threshold (as PyTorch); stable for any x."""
    x = _float_tensor(x, "softplus")
    z = x * beta
    smooth = (fnp.maximum(z, 0.0) + fnp.log1p(fnp.exp(-fnp.abs(z)))) / beta
    return fnp.where(z > threshold, x, smooth)


def _minus_max(x: Tensor, axis: int) -> Tensor:
    """x - max(x) along ``axis``, the max a constant for differentiation (it cancels out of softmax and
    log_softmax; differentiating it only adds rounding at the maxima). A row without a finite max
    (all -inf) is shifted by 0."""
    peak = fnp.max(x, axis=axis, keepdims=True)
    return x - bind(P.stop_gradient_p, fnp.where(fnp.isfinite(peak), peak, 0.0))


def softmax(x: ArrayLike, axis: int = -1) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis`` (the max is subtracted first)."""
    x = _float_tensor(x, "softmax")
    exps = fnp.exp(_minus_max(x, axis))
    return exps / fnp.sum(exps, axis=axis, keepdims=True)


def log_softmax(x: ArrayLike, axis: int = -1) -> Tensor:
    """(x - max) - log(sum(exp(x - max))) along ``axis``, as PyTorch: ``x - logsumexp(x)`` would round
    twice at the scale of x (2e-4 off at logits of 1e4, log(2) off at 1e30)."""
    x = _float_tensor(x, "log_softmax")
    shifted = _minus_max(x, axis)
    return shifted - fnp.log(fnp.sum(fnp.exp(shifted), axis=axis, keepdims=True))


def logsumexp(x: ArrayLike, axis: Any = None, keepdims: bool = False) -> Tensor:
    """log(sum(exp(x))) along ``axis``, computed stably."""
    return fnp.logsumexp(x, axis=axis, keepdims=keepdims)


# --- losses --------------------------------------------------------------------------------------


def _reduce(losses: Tensor, reduction: str, name: str) -> Tensor:
    if reduction == "mean":
        return fnp.mean(losses)
    if reduction == "sum":
        return fnp.sum(losses)
    if reduction == "none":
        return losses
    raise ValueError(f"{name}: reduction must be 'mean', 'sum' or 'none', got {reduction!r}")


def _class_losses(log_probs: Tensor, labels: Tensor, label_smoothing: float, ignore_index: int,
                  name: str) -> tuple[Tensor, Tensor]:
    """Per-example smoothed negative log-likelihoods of integer ``labels`` (classes on the last axis of
    ``log_probs``) and the float mask of examples whose label is not ``ignore_index``."""
    if not dtypes.is_int(labels.dtype):
        raise TypeError(f"{name}: class targets must be integers, got dtype {labels.dtype.name}")
    if labels.dtype.kind == "u":  # uint8 labels (datasets.mnist's) must compare with a negative ignore_index
        labels = labels.astype(dtypes.int32)
    if labels.shape != log_probs.shape[:-1]:
        raise ValueError(f"{name}: labels of shape {labels.shape} do not match logits of shape "
                         f"{log_probs.shape} (expected {log_probs.shape[:-1]} with classes last)")
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"{name}: label_smoothing must be in [0, 1], got {label_smoothing}")
    classes = log_probs.shape[-1]
    if not labels.is_traced:  # concrete labels are checked, as PyTorch does; traced ones cannot be (as in JAX)
        values = labels.numpy()
        bad = (values != ignore_index) & ((values < 0) | (values >= classes))
        if bad.any():
            raise IndexError(f"{name}: label {values[bad].flat[0]} is out of range for {classes} classes (labels "
                             f"must be in [0, {classes}) or equal ignore_index={ignore_index})")
    one_hot = fnp.expand_dims(labels, -1) == fnp.arange(classes)
    picked = fnp.sum(fnp.where(one_hot, log_probs, 0.0), axis=-1)  # not one_hot * log_probs: 0 * -inf is NaN
    losses = -(1.0 - label_smoothing) * picked
    if label_smoothing:
        losses = losses - label_smoothing * fnp.mean(log_probs, axis=-1)
    valid = (labels != ignore_index).astype(log_probs.dtype)
    return losses * valid, valid


def _reduce_valid(losses: Tensor, valid: Tensor, reduction: str, name: str) -> Tensor:
    """Like _reduce, but the mean is over the examples that were not ignored (as PyTorch)."""
    if reduction == "mean":
        return fnp.sum(losses) / fnp.sum(valid)
    return _reduce(losses, reduction, name)


def cross_entropy(logits: ArrayLike, target: ArrayLike, reduction: str = "mean", label_smoothing: float = 0.0,
                  ignore_index: int = -100) -> Tensor:
    """Cross-entropy of logits (N, C, ...) or (C,), classes on axis 1 as in PyTorch, against integer class
    targets (N, ...) or class probabilities shaped like the logits.

    >>> round(cross_entropy(fnp.asarray([[0.0, 0.0]]), fnp.asarray([1])).item(), 4)
    0.6931
    """
    name = "cross_entropy"
    logits, target = _float_tensor(logits, name, "logits"), fnp.asarray(target)
    class_axis = 0 if logits.ndim == 1 else 1
    log_probs = fnp.moveaxis(log_softmax(logits, axis=class_axis), class_axis, -1)
    if dtypes.is_float(target.dtype):  # class probabilities
        if target.shape != logits.shape:
            raise ValueError(f"{name}: probability targets must have the logits' shape {logits.shape}, got "
                             f"{target.shape}")
        probs = fnp.moveaxis(target, class_axis, -1)
        if label_smoothing:
            probs = probs * (1.0 - label_smoothing) + label_smoothing / logits.shape[class_axis]
        return _reduce(-fnp.sum(probs * log_probs, axis=-1), reduction, name)
    losses, valid = _class_losses(log_probs, target, label_smoothing, ignore_index, name)
    return _reduce_valid(losses, valid, reduction, name)


def nll_loss(log_probs: ArrayLike, target: ArrayLike, reduction: str = "mean", ignore_index: int = -100) -> Tensor:
    """Negative log-likelihood of integer targets (N, ...) given log-probabilities (N, C, ...) or (C,)."""
    name = "nll_loss"
    log_probs = _float_tensor(log_probs, name, "log_probs")
    class_axis = 0 if log_probs.ndim == 1 else 1
    losses, valid = _class_losses(fnp.moveaxis(log_probs, class_axis, -1), fnp.asarray(target), 0.0,
                                  ignore_index, name)
    return _reduce_valid(losses, valid, reduction, name)


def sparse_categorical_crossentropy(logits: ArrayLike, labels: ArrayLike, ignore_index: int = -1,
                                    label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """tinygrad's loss: classes on the *last* axis of ``logits``, integer ``labels`` of the leading shape;
    the mean is over the labels that are not ``ignore_index``.

    >>> round(sparse_categorical_crossentropy(fnp.asarray([[0.0, 0.0]]), fnp.asarray([1])).item(), 4)
    0.6931
    """
    name = "sparse_categorical_crossentropy"
    logits = _float_tensor(logits, name, "logits")
    losses, valid = _class_losses(log_softmax(logits, axis=-1), fnp.asarray(labels), label_smoothing,
                                  ignore_index, name)
    return _reduce_valid(losses, valid, reduction, name)


def _matching(prediction: ArrayLike, target: ArrayLike, name: str) -> tuple[Tensor, Tensor]:
    prediction = _float_tensor(prediction, name)
    target = fnp.asarray(target)
    if prediction.shape != target.shape:
        raise ValueError(f"{name}: input of shape {prediction.shape} and target of shape {target.shape} differ")
    return prediction, target.astype(prediction.dtype)


def _clamped_logs(probs: Tensor) -> tuple[Tensor, Tensor]:
    return fnp.maximum(fnp.log(probs), -100.0), fnp.maximum(fnp.log1p(-probs), -100.0)


@custom_jvp
def _binary_crossentropy_terms(probs: Tensor, target: Tensor) -> Tensor:
    log_p, log_not_p = _clamped_logs(probs)
    return -(target * log_p + (1.0 - target) * log_not_p)


@_binary_crossentropy_terms.defjvp
def _binary_crossentropy_jvp(primals: Any, tangents: Any) -> tuple[Tensor, Tensor]:
    """PyTorch's derivative (p - t) / max(p (1 - p), 1e-12) in p: finite at p = 0 and 1, where the
    clamped logs' own derivative is 0 * inf = NaN."""
    (probs, target), (d_probs, d_target) = primals, tangents
    log_p, log_not_p = _clamped_logs(probs)
    slope = (probs - target) / fnp.maximum(probs * (1.0 - probs), 1e-12)
    return _binary_crossentropy_terms(probs, target), slope * d_probs + (log_not_p - log_p) * d_target


def binary_crossentropy(probs: ArrayLike, target: ArrayLike, reduction: str = "mean") -> Tensor:
    """-(t log p + (1 - t) log(1 - p)), each log clamped at -100 as PyTorch does (and PyTorch's
    gradient, finite at p = 0 and 1)."""
    probs, target = _matching(probs, target, "binary_crossentropy")
    return _reduce(_binary_crossentropy_terms(probs, target), reduction, "binary_crossentropy")


def binary_crossentropy_with_logits(logits: ArrayLike, target: ArrayLike, reduction: str = "mean",
                                    pos_weight: ArrayLike | None = None) -> Tensor:
    """binary_crossentropy(sigmoid(logits), target) computed stably from the logits."""
    logits, target = _matching(logits, target, "binary_crossentropy_with_logits")
    log_sigmoid_neg = fnp.maximum(-logits, 0.0) + fnp.log1p(fnp.exp(-fnp.abs(logits)))  # -log(sigmoid(x))
    if pos_weight is None:
        losses = (1.0 - target) * logits + log_sigmoid_neg
    else:
        weight = 1.0 + (fnp.asarray(pos_weight) - 1.0) * target
        losses = (1.0 - target) * logits + weight * log_sigmoid_neg
    return _reduce(losses, reduction, "binary_crossentropy_with_logits")


def mse(prediction: ArrayLike, target: ArrayLike, reduction: str = "mean") -> Tensor:
    """Mean squared error."""
    prediction, target = _matching(prediction, target, "mse")
    return _reduce(fnp.square(prediction - target), reduction, "mse")


mse_loss = mse


def l1_loss(prediction: ArrayLike, target: ArrayLike, reduction: str = "mean") -> Tensor:
    """Mean absolute error."""
    prediction, target = _matching(prediction, target, "l1_loss")
    return _reduce(fnp.abs(prediction - target), reduction, "l1_loss")


# --- attention and embeddings --------------------------------------------------------------------


def scaled_dot_product_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, mask: ArrayLike | None = None,
                                 is_causal: bool = False, scale: float | None = None) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v for q (..., L, E), k (..., S, E), v (..., S, Ev). A boolean
    mask says where to attend; a float mask is added to the scores; ``is_causal`` attends to j <= i.

    >>> scaled_dot_product_attention(fnp.ones((2, 4)), fnp.ones((3, 4)), fnp.ones((3, 5))).shape
    (2, 5)
    """
    name = "scaled_dot_product_attention"
    q, k, v = _float_tensor(q, name, "q"), _float_tensor(k, name, "k"), _float_tensor(v, name, "v")
    if q.ndim < 2 or k.ndim < 2 or v.ndim < 2 or q.shape[-1] != k.shape[-1] or k.shape[-2] != v.shape[-2]:
        raise ValueError(f"{name}: expected q (..., L, E), k (..., S, E), v (..., S, Ev); got {q.shape}, "
                         f"{k.shape}, {v.shape}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = fnp.matmul(q, fnp.matrix_transpose(k)) * scale
    length, source = q.shape[-2], k.shape[-2]
    if is_causal:
        if mask is not None:
            raise ValueError(f"{name}: give either mask or is_causal, not both")
        mask = fnp.asarray(np.tril(np.ones((length, source), dtype=bool)))
    if mask is not None:
        mask = fnp.asarray(mask)
        if dtypes.is_bool(mask.dtype):
            scores = fnp.where(mask, scores, -np.inf)
        else:
            scores = scores + mask
    return fnp.matmul(softmax(scores, axis=-1), v)


def embedding(indices: ArrayLike, weight: ArrayLike) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by integer ``indices``: shape indices.shape + (dim,)."""
    indices, weight = fnp.asarray(indices), fnp.asarray(weight)
    if not dtypes.is_int(indices.dtype):
        raise TypeError(f"embedding: indices must be integers, got dtype {indices.dtype.name}")
    if weight.ndim != 2:
        raise ValueError(f"embedding: weight must be (num_embeddings, dim), got shape {weight.shape}")
    return fnp.take(weight, indices, axis=0)
