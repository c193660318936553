"""tinygrad's constructors on Tensor: ``*_like``, ranges and grids, random draws from the global
key (``Tensor.manual_seed``), initialisers and ``from_blob``.

Random draws go through ``funcgrad.random.stateful`` (the global key, split per call), so they are
reproducible after ``Tensor.manual_seed(n)``. ``CreationMethods`` is one of the groups
``tensor_methods.TensorMethods`` inherits.
"""

from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

import funcgrad.numpy as fnp
from funcgrad.core.tensor import Tensor
from funcgrad.ir import dtypes
from funcgrad.tensor_group import TensorGroup


def _shape_args(shape: tuple[Any, ...]) -> tuple[int, ...]:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def _float_dtype(dtype: Any, like: Any = None) -> Any:
    if dtype is not None:
        return dtype
    if like is not None and dtypes.is_float(like.dtype):
        return like.dtype
    return dtypes.float32


def _finish(tensor: Tensor, requires_grad: bool | None) -> Tensor:
    tensor.requires_grad = requires_grad
    return tensor


class CreationMethods(TensorGroup):
    """Constructors (static methods) and ``*_like`` methods (see docs/tensor-api.md)."""


    def empty_like(self, dtype: Any = None, device: str | None = None) -> Tensor:
        return fnp.empty_like(self, dtype=dtype, device=device)

    def full_like(self, fill_value: Any, dtype: Any = None, device: str | None = None) -> Tensor:
        return fnp.full_like(self, fill_value, dtype=dtype, device=device)

    def rand_like(self, dtype: Any = None, requires_grad: bool | None = None) -> Tensor:
        from funcgrad import random
        return _finish(random.stateful("rand", self.shape, dtype=_float_dtype(dtype, self)), requires_grad)

    def randn_like(self, dtype: Any = None, requires_grad: bool | None = None) -> Tensor:
        from funcgrad import random
        return _finish(random.stateful("randn", self.shape, dtype=_float_dtype(dtype, self)), requires_grad)

    @staticmethod
    def linspace(start: float, stop: float, steps: int, dtype: Any = None) -> Tensor:
        """``steps`` evenly spaced values from ``start`` to ``stop`` inclusive."""
        if steps < 0:
            raise ValueError(f"linspace: steps must be non-negative, got {steps}")
        return fnp.linspace(start, stop, steps, dtype=_float_dtype(dtype))

    def meshgrid(self, *args: Any, indexing: str = "ij") -> tuple[Tensor, ...]:
        """Coordinate grids of 1-D Tensors; 'ij' indexing is the default (tinygrad and PyTorch)."""
        if indexing not in ("ij", "xy"):
            raise ValueError(f"meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
        return tuple(fnp.meshgrid(self, *args, indexing=indexing))

    @staticmethod
    def normal(*shape: Any, mean: float = 0.0, std: float = 1.0, dtype: Any = None,
               requires_grad: bool | None = None) -> Tensor:
        from funcgrad import random
        draw = random.stateful("randn", _shape_args(shape), dtype=_float_dtype(dtype))
        return _finish(draw * std + mean, requires_grad)

    @staticmethod
    def randperm(n: int, device: str | None = None, dtype: Any = dtypes.int32) -> Tensor:
        """A random permutation of 0 .. n-1 (from the global key)."""
        from funcgrad import random
        out = fnp.astype(random.permutation(random.next_key(), n), dtype)
        return out if device is None else out.to(device)

    def multinomial(self, num_samples: int = 1, replacement: bool = False) -> Tensor:
        """Draw class indices with probabilities proportional to ``self`` (C,) or (B, C). Without
        replacement (a superset of tinygrad, which allows one sample) the Gumbel top-k trick is used."""
        from funcgrad import random
        weights = fnp.asarray(self)
        if weights.ndim not in (1, 2) or num_samples < 1:
            raise ValueError(f"multinomial: needs weights of shape (C,) or (B, C) and num_samples >= 1, got "
                             f"{weights.shape} and {num_samples}")
        if not replacement and num_samples > weights.shape[-1]:
            raise ValueError(f"multinomial: cannot draw {num_samples} samples without replacement from "
                             f"{weights.shape[-1]} classes")
        logits = fnp.log(fnp.astype(weights, dtypes.float32))
        if replacement:
            shape = (num_samples,) + weights.shape[:-1]
            draws = random.categorical(random.next_key(), logits, axis=-1, shape=shape)
            return fnp.astype(fnp.moveaxis(draws, 0, -1), dtypes.int32)
        noisy = logits + random.gumbel(random.next_key(), weights.shape)
        order = fnp.argsort(noisy, axis=-1, descending=True)
        return fnp.astype(order[..., :num_samples], dtypes.int32)

    @staticmethod
    def kaiming_normal(*shape: Any, a: float = 0.01, dtype: Any = None, requires_grad: bool | None = None) -> Tensor:
        """Normal with std sqrt(2 / (1 + a^2)) / sqrt(fan_in), fan_in = prod(shape[1:]) (tinygrad)."""
        dims = _shape_args(shape)
        std = math.sqrt(2.0 / (1 + a * a)) / math.sqrt(math.prod(dims[1:]))
        return CreationMethods.normal(*dims, std=std, dtype=dtype, requires_grad=requires_grad)

    @staticmethod
    def scaled_uniform(*shape: Any, dtype: Any = None, requires_grad: bool | None = None) -> Tensor:
        """Uniform in [-1, 1) scaled by prod(shape) ** -0.5 (tinygrad)."""
        from funcgrad import random
        dims = _shape_args(shape)
        draw = random.stateful("uniform", dims, dtype=_float_dtype(dtype), low=-1.0, high=1.0)
        return _finish(draw * math.prod(dims) ** -0.5, requires_grad)

    @staticmethod
    def from_blob(ptr: int, shape: tuple[int, ...], dtype: Any = dtypes.float32, device: str | None = None) -> Tensor:
        """A Tensor holding a *copy* of the ``prod(shape)`` elements at address ``ptr`` (tinygrad
        shares the memory; funcgrad's buffers are owned, so the memory may be freed afterwards)."""
        dtype = dtypes.canonicalize(dtype)
        count = math.prod(shape)
        raw = (ctypes.c_char * (count * dtype.itemsize)).from_address(ptr)
        array = np.frombuffer(raw, dtype=dtype, count=count).reshape(shape)
        return Tensor(array.copy(), dtype=dtype, device=device)
