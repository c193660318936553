"""Layers: Modules holding parameters, with PyTorch's constructor signatures, parameter names,
shapes and initialisation; the computation is ``funcgrad.nn.functional``.

Each layer takes an optional ``key=`` (a ``funcgrad.random`` key) for reproducible
initialisation; without one it draws from the global key (``Tensor.manual_seed``). Parameters
have ``requires_grad=True`` (as PyTorch's), buffers (BatchNorm's running statistics)
``requires_grad=False``. A wrong input shape raises a ValueError that names the layer, the
expected and the actual shape.

>>> model = Sequential(Linear(784, 128), ReLU(), Linear(128, 10))   # doctest: +SKIP
>>> logits = model(x)                                               # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from typing import Any

import funcgrad.numpy as fnp
from funcgrad import random
from funcgrad.core.tensor import Tensor
from funcgrad.ir import dtypes
from funcgrad.lazy import LazyBuffer, realize
from funcgrad.nn import functional as F
from funcgrad.nn import init
from funcgrad.nn.module import Module


def _keys(key: Any, count: int) -> list[Any]:
    """``count`` independent keys from ``key``, or ``None`` each (draw from the global key)."""
    if key is None:
        return [None] * count
    keys = random.split(key, count)
    return [keys[i] for i in range(count)]


def _parameter(value: Tensor) -> Tensor:
    value.requires_grad = True
    return value


def _positive_ints(layer: str, **values: Any) -> None:
    for name, value in values.items():
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            raise ValueError(f"{layer}: {name} must be a positive int, got {value!r}")


def _pair(layer: str, name: str, value: int | Sequence[int], minimum: int = 1) -> tuple[int, int]:
    pair: tuple[Any, ...] = (value, value) if not isinstance(value, Sequence) else tuple(value)
    if len(pair) != 2 or not all(isinstance(v, int) for v in pair):
        raise ValueError(f"{layer}: {name} must be an int or a pair of ints, got {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{layer}: {name} must be >= {minimum}, got {value!r}")
    return pair[0], pair[1]


def _as_tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else fnp.asarray(x)


def _fan_in_bound(fan_in: int) -> float:
    return 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0


# --- layers with parameters ------------------------------------------------------------------------

class Linear(Module):
    """``y = x @ weight.T + bias``; weight ``(out_features, in_features)``, PyTorch's init:
    kaiming_uniform(a=sqrt(5)) weight, bias U(-1/sqrt(in), 1/sqrt(in))."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, key: Any = None) -> None:
        _positive_ints("Linear", in_features=in_features, out_features=out_features)
        weight_key, bias_key = _keys(key, 2)
        self.in_features, self.out_features = in_features, out_features
        self.weight = _parameter(init.kaiming_uniform((out_features, in_features), a=math.sqrt(5), key=weight_key))
        bound = _fan_in_bound(in_features)
        self.bias = _parameter(init.uniform((out_features,), -bound, bound, bias_key)) if bias else None

    def forward(self, x: Any) -> Tensor:
        x = _as_tensor(x)
        if x.shape[-1:] != (self.in_features,):
            raise ValueError(f"Linear({self.in_features}, {self.out_features}): expected input with last "
                             f"dimension {self.in_features}, got shape {x.shape}")
        return F.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class Conv2d(Module):
    """2-D convolution over ``(N, C, H, W)`` (or unbatched ``(C, H, W)``) input; weight
    ``(out_channels, in_channels // groups, kh, kw)``, initialised as PyTorch's."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int | Sequence[int],
                 stride: int | Sequence[int] = 1, padding: int | Sequence[int] | str = 0,
                 dilation: int | Sequence[int] = 1, groups: int = 1, bias: bool = True, key: Any = None) -> None:
        _positive_ints("Conv2d", in_channels=in_channels, out_channels=out_channels, groups=groups)
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"Conv2d: groups={groups} must divide in_channels={in_channels} and "
                             f"out_channels={out_channels}")
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, groups
        self.kernel_size = _pair("Conv2d", "kernel_size", kernel_size)
        self.stride = _pair("Conv2d", "stride", stride)
        self.dilation = _pair("Conv2d", "dilation", dilation)
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Conv2d: padding must be an int, a pair, 'same' or 'valid', got {padding!r}")
            self.padding: tuple[int, int] | str = padding
        else:
            self.padding = _pair("Conv2d", "padding", padding, minimum=0)
        weight_key, bias_key = _keys(key, 2)
        shape = (out_channels, in_channels // groups, *self.kernel_size)
        self.weight = _parameter(init.kaiming_uniform(shape, a=math.sqrt(5), key=weight_key))
        bound = _fan_in_bound(init.fans(shape)[0])
        self.bias = _parameter(init.uniform((out_channels,), -bound, bound, bias_key)) if bias else None

    def forward(self, x: Any) -> Tensor:
        x = _as_tensor(x)
        if x.ndim not in (3, 4) or x.shape[-3] != self.in_channels:
            raise ValueError(f"{self._short_name()}: expected input of shape (N, {self.in_channels}, H, W) or "
                             f"({self.in_channels}, H, W), got shape {x.shape}")
        return F.conv2d(x, self.weight, self.bias, self.stride, self.padding, self.dilation, self.groups)

    def _short_name(self) -> str:
        return f"Conv2d({self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size})"

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}"
        if self.padding != (0, 0):
            text += f", padding={self.padding}"
        if self.dilation != (1, 1):
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        return text + ("" if self.bias is not None else ", bias=False")


def _swap_in(buffer: Tensor, new_value: Tensor) -> None:
    """Replace a buffer's value in place (the Tensor object stays, as optimisers do), so models and
    jit's write-back keep their references. Eagerly, the previous value is computed first if it is
    still pending, so the chain of running statistics never grows beyond one step. A transformation
    of a function that closes over the model (not an argument) leaves the buffer alone: its traced
    value must not escape into a concrete Tensor."""
    if new_value.is_traced and not buffer.is_traced:
        return
    if isinstance(buffer._data, LazyBuffer) and not buffer._data.realized:
        realize([buffer._data])
    buffer._data = new_value.astype(buffer.dtype)._data


class BatchNorm(Module):
    """Batch normalisation over the channel axis 1 of ``(N, C, ...)`` input (PyTorch's BatchNorm1d/2d/3d).

    In training mode it normalises with the batch statistics and updates the running ones
    (``running = (1 - momentum) * running + momentum * batch``, with the unbiased batch variance;
    ``momentum=None`` is the cumulative average); in eval mode it uses the running statistics.
    The running statistics are buffers, updated in place (see ``Module.register_buffer``).
    """

    _ranks: tuple[int, ...] = ()   # input ranks the subclass accepts; () accepts any rank >= 2

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float | None = 0.1, affine: bool = True,
                 track_running_stats: bool = True) -> None:
        _positive_ints(type(self).__name__, num_features=num_features)
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        self.weight = _parameter(init.ones((num_features,))) if affine else None
        self.bias = _parameter(init.zeros((num_features,))) if affine else None
        self.running_mean: Tensor | None
        self.running_var: Tensor | None
        self.num_batches_tracked: Tensor | None
        if track_running_stats:
            self.register_buffer("running_mean", init.zeros((num_features,)))
            self.register_buffer("running_var", init.ones((num_features,)))
            # a float32 count (exact to 2**24 steps), so fg.grad accepts a model holding it
            self.register_buffer("num_batches_tracked", init.zeros(()))
        else:
            self.running_mean = self.running_var = self.num_batches_tracked = None

    def forward(self, x: Any) -> Tensor:
        x = _as_tensor(x)
        rank_ok = x.ndim in self._ranks if self._ranks else x.ndim >= 2
        if not rank_ok or x.shape[1] != self.num_features:
            ranks = " or ".join(f"{r}-D" for r in self._ranks) if self._ranks else "at least 2-D"
            raise ValueError(f"{type(self).__name__}({self.num_features}): expected {ranks} input of shape "
                             f"(N, {self.num_features}, ...), got shape {x.shape}")
        mean, var, count = self.running_mean, self.running_var, self.num_batches_tracked
        if not self.training or mean is None or var is None or count is None:
            # eval mode normalises with the running statistics; without them, always with the batch's
            y, _, _ = F.batch_norm(x, mean, var, self.weight, self.bias, training=mean is None, eps=self.eps)
            return y
        momentum: Any = 1.0 / (count + 1) if self.momentum is None else self.momentum   # None: cumulative average
        y, new_mean, new_var = F.batch_norm(x, mean, var, self.weight, self.bias, True, momentum, self.eps)
        assert new_mean is not None and new_var is not None   # given running statistics, F returns new ones
        _swap_in(mean, new_mean)
        _swap_in(var, new_var)
        _swap_in(count, count + 1)
        return y

    def extra_repr(self) -> str:
        return (f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, affine={self.affine}, "
                f"track_running_stats={self.track_running_stats}")


class BatchNorm1d(BatchNorm):
    """BatchNorm over ``(N, C)`` or ``(N, C, L)`` input."""
    _ranks = (2, 3)


class BatchNorm2d(BatchNorm):
    """BatchNorm over ``(N, C, H, W)`` input."""
    _ranks = (4,)


def _normalized_shape(layer: str, shape: int | Sequence[int]) -> tuple[int, ...]:
    dims: tuple[Any, ...] = (shape,) if not isinstance(shape, Sequence) else tuple(shape)
    if not dims or not all(isinstance(d, int) and d > 0 for d in dims):
        raise ValueError(f"{layer}: normalized_shape must be a positive int or a tuple of them, got {shape!r}")
    return dims


def _check_trailing(layer: str, x: Tensor, shape: tuple[int, ...]) -> None:
    if x.shape[x.ndim - len(shape):] != shape or x.ndim < len(shape):
        raise ValueError(f"{layer}: expected input whose last dimensions are {shape}, got shape {x.shape}")


class LayerNorm(Module):
    """Normalise over the trailing ``normalized_shape`` dimensions; weight ones, bias zeros."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float = 1e-5, elementwise_affine: bool = True,
                 bias: bool = True) -> None:
        self.normalized_shape = _normalized_shape("LayerNorm", normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = _parameter(init.ones(self.normalized_shape)) if elementwise_affine else None
        self.bias = _parameter(init.zeros(self.normalized_shape)) if elementwise_affine and bias else None

    def forward(self, x: Any) -> Tensor:
        x = _as_tensor(x)
        _check_trailing(f"LayerNorm({self.normalized_shape})", x, self.normalized_shape)
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class RMSNorm(Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the trailing dimensions; ``eps=None`` is the
    machine epsilon of the input's dtype, as PyTorch."""

    def __init__(self, normalized_shape: int | Sequence[int], eps: float | None = None,
                 elementwise_affine: bool = True) -> None:
        self.normalized_shape = _normalized_shape("RMSNorm", normalized_shape)
        self.eps, self.elementwise_affine = eps, elementwise_affine
        self.weight = _parameter(init.ones(self.normalized_shape)) if elementwise_affine else None

    def forward(self, x: Any) -> Tensor:
        x = _as_tensor(x)
        _check_trailing(f"RMSNorm({self.normalized_shape})", x, self.normalized_shape)
        eps = float(fnp.finfo(x.dtype).eps) if self.eps is None else self.eps
        return F.rms_norm(x, self.normalized_shape, self.weight, eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}"


class GroupNorm(Module):
    """Normalise ``(N, C, ...)`` input over groups of ``C // num_groups`` channels; per-channel affine."""

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
        _positive_ints("GroupNorm", num_groups=num_groups, num_channels=num_channels)
        if num_channels % num_groups:
            raise ValueError(f"GroupNorm: num_groups={num_groups} must divide num_channels={num_channels}")
        self.num_groups, self.num_channels, self.eps, self.affine = num_groups, num_channels, eps, affine
        self.weight = _parameter(init.ones((num_channels,))) if affine else None
        self.bias = _parameter(init.zeros((num_channels,))) if affine else None

    def forward(self, x: Any) -> Tensor:
        x = _as_tensor(x)
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(f"GroupNorm({self.num_groups}, {self.num_channels}): expected input of shape "
                             f"(N, {self.num_channels}, ...), got shape {x.shape}")
        return F.group_norm(x, self.num_groups, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}"


class Embedding(Module):
    """A lookup table: integer indices of any shape -> rows of ``weight (num_embeddings,
    embedding_dim)``, initialised N(0, 1) as PyTorch. Out-of-range indices clamp (gather semantics)."""

    def __init__(self, num_embeddings: int, embedding_dim: int, key: Any = None) -> None:
        _positive_ints("Embedding", num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = _parameter(init.normal((num_embeddings, embedding_dim), key=key))

    def forward(self, indices: Any) -> Tensor:
        indices = _as_tensor(indices)
        if not dtypes.is_int(indices.dtype):
            raise TypeError(f"Embedding({self.num_embeddings}, {self.embedding_dim}): expected integer "
                            f"indices, got dtype {indices.dtype}")
        return F.embedding(indices, self.weight)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"


class Dropout(Module):
    """Zero each element with probability ``p`` and scale the rest by ``1 / (1 - p)`` in training
    mode; the identity in eval mode. ``layer(x, key=k)`` makes the mask reproducible; without a
    key it comes from the global key."""

    def __init__(self, p: float = 0.5) -> None:
        if not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ValueError(f"Dropout: p must be a probability in [0, 1], got {p!r}")
        self.p = p

    def forward(self, x: Any, key: Any = None) -> Tensor:
        return F.dropout(_as_tensor(x), self.p, key=key, training=self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"


# --- containers ---------------------------------------------------------------------------------------

class ModuleList(Module):
    """A list of modules kept as attributes ``'0'``, ``'1'``, ... (as PyTorch), so their parameters are
    named ``'layers.0.weight'``. A plain Python list attribute works as well."""

    def __init__(self, modules: Sequence[Any] = ()) -> None:
        for module in modules:
            self.append(module)

    def __len__(self) -> int:
        return sum(1 for name in vars(self) if name.isdigit())

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return ModuleList([self[i] for i in range(len(self))[index]])
        position = range(len(self))[index]   # negative indices, IndexError
        return getattr(self, str(position))

    def __iter__(self) -> Iterator[Any]:
        return (getattr(self, str(i)) for i in range(len(self)))

    def append(self, module: Any) -> ModuleList:
        setattr(self, str(len(self)), module)
        return self

    def extend(self, modules: Sequence[Any]) -> ModuleList:
        for module in modules:
            self.append(module)
        return self


class Sequential(ModuleList):
    """Calls its layers in order: ``Sequential(Linear(4, 8), ReLU(), Linear(8, 2))(x)``. Layers may
    be Modules or plain functions (``fnp.tanh``)."""

    def __init__(self, *layers: Any) -> None:
        for layer in layers:
            if not callable(layer):
                raise TypeError(f"Sequential: every layer must be callable, got {type(layer).__name__}")
        super().__init__(layers)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return Sequential(*[self[i] for i in range(len(self))[index]])
        return super().__getitem__(index)

    def forward(self, x: Any) -> Any:
        for layer in self:
            x = layer(x)
        return x


# --- stateless wrappers -------------------------------------------------------------------------------

class Identity(Module):
    def forward(self, x: Any) -> Any:
        return x


class ReLU(Module):
    def forward(self, x: Any) -> Tensor:
        return F.relu(_as_tensor(x))


class GELU(Module):
    """``approximate='none'`` (erf) or ``'tanh'``, as PyTorch."""

    def __init__(self, approximate: str = "none") -> None:
        if approximate not in ("none", "tanh"):
            raise ValueError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def forward(self, x: Any) -> Tensor:
        return F.gelu(_as_tensor(x), approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class SiLU(Module):
    """``x * sigmoid(x)``."""

    def forward(self, x: Any) -> Tensor:
        return F.silu(_as_tensor(x))


class Sigmoid(Module):
    def forward(self, x: Any) -> Tensor:
        return F.sigmoid(_as_tensor(x))


class Tanh(Module):
    def forward(self, x: Any) -> Tensor:
        return F.tanh(_as_tensor(x))


class Flatten(Module):
    """Flatten dimensions ``start_dim..end_dim`` into one (default: all but the batch dimension)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Any) -> Tensor:
        return _as_tensor(x).flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class _Pool2d(Module):
    def __init__(self, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
                 padding: int | Sequence[int] = 0) -> None:
        name = type(self).__name__
        self.kernel_size = _pair(name, "kernel_size", kernel_size)
        self.stride = self.kernel_size if stride is None else _pair(name, "stride", stride)
        self.padding = _pair(name, "padding", padding, minimum=0)

    def _checked(self, x: Any) -> Tensor:
        x = _as_tensor(x)
        if x.ndim not in (3, 4):
            raise ValueError(f"{type(self).__name__}(kernel_size={self.kernel_size}): expected input of shape "
                             f"(N, C, H, W) or (C, H, W), got shape {x.shape}")
        return x

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class MaxPool2d(_Pool2d):
    """Max over ``kernel_size`` windows (stride defaults to the kernel size); padding is -inf."""

    def __init__(self, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
                 padding: int | Sequence[int] = 0, dilation: int | Sequence[int] = 1) -> None:
        super().__init__(kernel_size, stride, padding)
        self.dilation = _pair("MaxPool2d", "dilation", dilation)

    def forward(self, x: Any) -> Tensor:
        return F.max_pool2d(self._checked(x), self.kernel_size, self.stride, self.padding, self.dilation)


class AvgPool2d(_Pool2d):
    """Mean over ``kernel_size`` windows (stride defaults to the kernel size); the zero padding counts
    towards the divisor unless ``count_include_pad=False``."""

    def __init__(self, kernel_size: int | Sequence[int], stride: int | Sequence[int] | None = None,
                 padding: int | Sequence[int] = 0, count_include_pad: bool = True) -> None:
        super().__init__(kernel_size, stride, padding)
        self.count_include_pad = count_include_pad

    def forward(self, x: Any) -> Tensor:
        return F.avg_pool2d(self._checked(x), self.kernel_size, self.stride, self.padding, self.count_include_pad)
