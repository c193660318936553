"""Weight initialisers with PyTorch's formulas (``torch.nn.init``), returning new Tensors.

Each takes a shape and an optional ``key`` (a ``funcgrad.random`` key, for reproducible
initialisation); without a key it draws from the global key behind ``Tensor.manual_seed``.
Fans follow PyTorch: for a weight of shape ``(out, in, *kernel)``, ``fan_in = in * prod(kernel)``
and ``fan_out = out * prod(kernel)``.

>>> w = kaiming_uniform((128, 784), a=math.sqrt(5), key=fg.random.key(0))   # nn.Linear's weight  # doctest: +SKIP
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import funcgrad.numpy as fnp
from funcgrad import random
from funcgrad.core.tensor import Tensor
from funcgrad.ir import dtypes

Shape = int | Sequence[int]


def _shape(shape: Shape, name: str) -> tuple[int, ...]:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if not all(isinstance(d, int) and d >= 0 for d in dims):
        raise ValueError(f"{name}: shape must be non-negative ints, got {shape!r}")
    return dims


def _key(key: Any) -> Tensor:
    return random.next_key() if key is None else key


def _dtype(dtype: Any) -> Any:
    return dtypes.default_float if dtype is None else dtype


def fans(shape: Shape) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight shape, as ``torch.nn.init._calculate_fan_in_and_fan_out``."""
    dims = _shape(shape, "fans")
    if len(dims) < 2:
        raise ValueError(f"fan in and fan out need a weight of rank >= 2, got shape {dims}")
    receptive_field = math.prod(dims[2:])
    return dims[1] * receptive_field, dims[0] * receptive_field


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The gain PyTorch recommends for a nonlinearity (``'relu'``: sqrt(2), ``'leaky_relu'`` with
    slope ``param`` (default 0.01): sqrt(2 / (1 + param^2)), ``'tanh'``: 5/3, linear ones: 1)."""
    if nonlinearity in ("linear", "conv1d", "conv2d", "conv3d", "sigmoid"):
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else param
        return math.sqrt(2.0 / (1 + slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"calculate_gain: unknown nonlinearity {nonlinearity!r}; expected one of 'linear', "
                     "'sigmoid', 'tanh', 'relu', 'leaky_relu', 'selu'")


def _fan(shape: Shape, mode: str, name: str) -> int:
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"{name}: mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = fans(shape)
    return fan_in if mode == "fan_in" else fan_out


def uniform(shape: Shape, low: float = 0.0, high: float = 1.0, key: Any = None, dtype: Any = None) -> Tensor:
    """Samples from U(low, high)."""
    dims = _shape(shape, "uniform")
    return random.uniform(_key(key), dims, _dtype(dtype), low, high)


def normal(shape: Shape, mean: float = 0.0, std: float = 1.0, key: Any = None, dtype: Any = None) -> Tensor:
    """Samples from N(mean, std^2)."""
    dims = _shape(shape, "normal")
    return random.normal(_key(key), dims, _dtype(dtype)) * std + mean


def zeros(shape: Shape, dtype: Any = None) -> Tensor:
    return fnp.zeros(_shape(shape, "zeros"), dtype=_dtype(dtype))


def ones(shape: Shape, dtype: Any = None) -> Tensor:
    return fnp.ones(_shape(shape, "ones"), dtype=_dtype(dtype))


def kaiming_uniform(shape: Shape, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    key: Any = None, dtype: Any = None) -> Tensor:
    """He uniform: U(-b, b) with b = gain * sqrt(3 / fan). ``a`` is the leaky-ReLU slope; nn.Linear
    and nn.Conv2d use ``a=sqrt(5)``, which gives b = 1 / sqrt(fan_in)."""
    gain = calculate_gain(nonlinearity, a)
    bound = gain * math.sqrt(3.0 / _fan(shape, mode, "kaiming_uniform"))
    return uniform(shape, -bound, bound, key, dtype)


def kaiming_normal(shape: Shape, a: float = 0.0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                   key: Any = None, dtype: Any = None) -> Tensor:
    """He normal: N(0, std^2) with std = gain / sqrt(fan)."""
    std = calculate_gain(nonlinearity, a) / math.sqrt(_fan(shape, mode, "kaiming_normal"))
    return normal(shape, 0.0, std, key, dtype)


def glorot_uniform(shape: Shape, gain: float = 1.0, key: Any = None, dtype: Any = None) -> Tensor:
    """Glorot/Xavier uniform: U(-b, b) with b = gain * sqrt(6 / (fan_in + fan_out))."""
    fan_in, fan_out = fans(shape)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform(shape, -bound, bound, key, dtype)


xavier_uniform = glorot_uniform


def glorot_normal(shape: Shape, gain: float = 1.0, key: Any = None, dtype: Any = None) -> Tensor:
    """Glorot/Xavier normal: N(0, std^2) with std = gain * sqrt(2 / (fan_in + fan_out))."""
    fan_in, fan_out = fans(shape)
    return normal(shape, 0.0, gain * math.sqrt(2.0 / (fan_in + fan_out)), key, dtype)


xavier_normal = glorot_normal
