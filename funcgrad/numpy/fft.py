"""The Array API's fft extension (``funcgrad.numpy.fft``), with NumPy's and JAX's signatures.

Every transform binds the one ``fft`` primitive (``funcgrad.ir.primitives.fft_p``: fft, ifft, rfft or
irfft over the trailing axes, unnormalised forward). This module does the rest, as ``jax.numpy.fft``
does: it moves the requested axes to the end, zero-pads or crops each to its length ``n`` / ``s``,
and applies ``norm`` ("backward", the default, scales the inverse by 1/n; "ortho" both ways by
1/sqrt(n); "forward" the forward by 1/n) by a multiplication. ``hfft`` and ``ihfft`` are irfft and
rfft of the conjugate with the norm's direction swapped.

On every device the transform itself runs as a host step through NumPy's pocketfft (the plan
downloads the operand, calls ``numpy.fft`` and uploads the result); the padding, scaling and
whatever surrounds it are kernels as usual. Differentiation (the transpose of an fft is an fft, see
``funcgrad/transforms/complex_rules.py``), vmap and jit work as for any primitive.

>>> import funcgrad.numpy as fnp
>>> fnp.fft.fft(fnp.asarray([1.0, 0.0, 0.0, 0.0])).tolist()
[(1+0j), (1+0j), (1+0j), (1+0j)]
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import ArrayLike, asarray, astype, normalize_axis
from funcgrad.numpy.elementwise import conj, divide, multiply
from funcgrad.numpy.manipulation import permute_dims, roll

_NORMS = ("backward", "ortho", "forward")


def _norm(norm: str | None, name: str) -> str:
    norm = "backward" if norm is None else norm
    if norm not in _NORMS:
        raise ValueError(f"{name}: norm must be one of {_NORMS} or None, got {norm!r}")
    return norm


def _swap(norm: str) -> str:
    return {"backward": "forward", "forward": "backward", "ortho": "ortho"}[norm]


def _complex_input(x: ArrayLike) -> Tensor:
    x = asarray(x)
    if not dtypes.is_complex(x.dtype):
        x = astype(x, dtypes.complex_dtype(x.dtype if dtypes.is_float(x.dtype) else dtypes.default_float))
    return x


def _real_input(x: ArrayLike, name: str) -> Tensor:
    x = asarray(x)
    if dtypes.is_complex(x.dtype):
        raise TypeError(f"{name} needs a real input, got {x.dtype.name} (use fft for complex arrays)")
    if x.dtype != dtypes.float64:
        x = astype(x, dtypes.float32)
    return x


def _resize(x: Tensor, axis: int, size: int) -> Tensor:
    """Crop or zero-pad ``x`` along ``axis`` to ``size`` (at the end), as NumPy's ``n`` does."""
    current = x.shape[axis]
    if size < current:
        limit = list(x.shape)
        limit[axis] = size
        return bind(P.slice_p, x, start=(0,) * x.ndim, limit=tuple(limit), strides=(1,) * x.ndim)
    if size > current:
        high = [0] * x.ndim
        high[axis] = size - current
        return bind(P.pad_p, x, np.zeros((), x.dtype)[()], low=(0,) * x.ndim, high=tuple(high))
    return x


def _axes_and_sizes(x: Tensor, s: Sequence[int] | None, axes: Any, name: str,
                    default_last: int | None = None) -> tuple[list[int], list[int]]:
    """Normalised axes and the transform length along each; ``default_last`` overrides the default
    length of the last axis (irfft's 2 (m - 1))."""
    if axes is None:
        axes = list(range(x.ndim - len(s), x.ndim)) if s is not None else list(range(x.ndim))
    else:
        axes = [axes] if isinstance(axes, (int, np.integer)) else list(axes)
    if x.ndim == 0:
        raise ValueError(f"{name} needs an array of rank >= 1, got a 0-d array")
    axes = [normalize_axis(a, x.ndim, "axes") for a in axes]
    if len(set(axes)) != len(axes):
        raise ValueError(f"{name}: repeated axis in axes {tuple(axes)}")
    if not axes:
        raise ValueError(f"{name}: axes must name at least one axis")
    if s is None:
        sizes = [x.shape[a] for a in axes]
        if default_last is not None:
            sizes[-1] = default_last
    else:
        sizes = [operator.index(n) for n in s]
        if len(sizes) != len(axes):
            raise ValueError(f"{name}: s {tuple(sizes)} and axes {tuple(axes)} differ in length")
    for n in sizes:
        if n < 1:
            raise ValueError(f"{name}: invalid number of data points ({n}) specified")
    return axes, sizes


def _transform(x: Tensor, axes: list[int], fft_type: str, fft_lengths: list[int]) -> Tensor:
    """Bind the fft primitive over ``axes`` (moved to the end and back)."""
    rest = [a for a in range(x.ndim) if a not in axes]
    order = rest + axes
    if order != list(range(x.ndim)):
        x = permute_dims(x, order)
    out = bind(P.fft_p, x, fft_type=fft_type, fft_lengths=tuple(fft_lengths))
    if order != list(range(x.ndim)):
        out = permute_dims(out, [order.index(a) for a in range(x.ndim)])
    return out


def _scaled(out: Tensor, norm: str, inverse: bool, count: int) -> Tensor:
    """The primitive computes the "backward" norm; rescale for "ortho" and "forward"."""
    if norm == "backward":
        return out
    if norm == "ortho":
        factor = math.sqrt(count) if inverse else 1 / math.sqrt(count)
    else:
        factor = float(count) if inverse else 1 / count
    return multiply(out, factor)  # a weak Python float keeps the dtype


def _complex_fft(x: ArrayLike, s: Sequence[int] | None, axes: Sequence[int] | None, norm: str | None,
                 inverse: bool, name: str) -> Tensor:
    x = _complex_input(x)
    norm = _norm(norm, name)
    axes_, sizes = _axes_and_sizes(x, s, axes, name)
    for axis, n in zip(axes_, sizes):
        x = _resize(x, axis, n)
    out = _transform(x, axes_, "ifft" if inverse else "fft", sizes)
    return _scaled(out, norm, inverse, math.prod(sizes))


def _real_forward(x: ArrayLike, s: Sequence[int] | None, axes: Sequence[int] | None, norm: str | None,
                  name: str) -> Tensor:
    x = _real_input(x, name)
    norm = _norm(norm, name)
    axes_, sizes = _axes_and_sizes(x, s, axes, name)
    for axis, n in zip(axes_, sizes):
        x = _resize(x, axis, n)
    out = _transform(x, axes_, "rfft", sizes)
    return _scaled(out, norm, False, math.prod(sizes))


def _real_inverse(x: ArrayLike, s: Sequence[int] | None, axes: Sequence[int] | None, norm: str | None,
                  name: str) -> Tensor:
    x = _complex_input(x)
    norm = _norm(norm, name)
    axes_, sizes = _axes_and_sizes(x, s, axes, name)
    if s is None:  # the default output length of the last axis is 2 (m - 1) for m input terms
        axes_, sizes = _axes_and_sizes(x, s, axes, name, default_last=2 * (x.shape[axes_[-1]] - 1))
    for axis, n in zip(axes_[:-1], sizes[:-1]):
        x = _resize(x, axis, n)
    x = _resize(x, axes_[-1], sizes[-1] // 2 + 1)
    out = _transform(x, axes_, "irfft", sizes)
    return _scaled(out, norm, True, math.prod(sizes))


def _one_axis(n: int | None, axis: int) -> tuple[list[int] | None, list[int]]:
    return (None if n is None else [n]), [axis]


# --- the transforms ----------------------------------------------------------------------------


def fft(x: ArrayLike, /, n: int | None = None, axis: int = -1, norm: str | None = None) -> Tensor:
    """The discrete Fourier transform along ``axis``, cropped or zero-padded to ``n`` points."""
    return _complex_fft(x, *_one_axis(n, axis), norm, False, "fft")


def ifft(x: ArrayLike, /, n: int | None = None, axis: int = -1, norm: str | None = None) -> Tensor:
    """The inverse of ``fft`` (scaled by 1/n with the default norm)."""
    return _complex_fft(x, *_one_axis(n, axis), norm, True, "ifft")


def fftn(x: ArrayLike, /, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
         norm: str | None = None) -> Tensor:
    """The n-dimensional fft over ``axes`` (all by default, or the last ``len(s)``)."""
    return _complex_fft(x, s, axes, norm, False, "fftn")


def ifftn(x: ArrayLike, /, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
          norm: str | None = None) -> Tensor:
    """The inverse of ``fftn``."""
    return _complex_fft(x, s, axes, norm, True, "ifftn")


def fft2(x: ArrayLike, /, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1),
         norm: str | None = None) -> Tensor:
    """``fftn`` over the last two axes."""
    return _complex_fft(x, s, axes, norm, False, "fft2")


def ifft2(x: ArrayLike, /, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1),
          norm: str | None = None) -> Tensor:
    """``ifftn`` over the last two axes."""
    return _complex_fft(x, s, axes, norm, True, "ifft2")


def rfft(x: ArrayLike, /, n: int | None = None, axis: int = -1, norm: str | None = None) -> Tensor:
    """The fft of a real array: the n // 2 + 1 non-negative frequency terms."""
    return _real_forward(x, *_one_axis(n, axis), norm, "rfft")


def irfft(x: ArrayLike, /, n: int | None = None, axis: int = -1, norm: str | None = None) -> Tensor:
    """The inverse of ``rfft``: ``n`` real points (2 (m - 1) by default) from m frequency terms."""
    return _real_inverse(x, *_one_axis(n, axis), norm, "irfft")


def rfftn(x: ArrayLike, /, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
          norm: str | None = None) -> Tensor:
    """``rfft`` over the last of ``axes`` and ``fft`` over the others."""
    return _real_forward(x, s, axes, norm, "rfftn")


def irfftn(x: ArrayLike, /, s: Sequence[int] | None = None, axes: Sequence[int] | None = None,
           norm: str | None = None) -> Tensor:
    """The inverse of ``rfftn``."""
    return _real_inverse(x, s, axes, norm, "irfftn")


def rfft2(x: ArrayLike, /, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1),
          norm: str | None = None) -> Tensor:
    """``rfftn`` over the last two axes."""
    return _real_forward(x, s, axes, norm, "rfft2")


def irfft2(x: ArrayLike, /, s: Sequence[int] | None = None, axes: Sequence[int] = (-2, -1),
           norm: str | None = None) -> Tensor:
    """``irfftn`` over the last two axes."""
    return _real_inverse(x, s, axes, norm, "irfft2")


def hfft(x: ArrayLike, /, n: int | None = None, axis: int = -1, norm: str | None = None) -> Tensor:
    """The fft of a Hermitian-symmetric signal given by its first half: real, ``n`` points."""
    norm = _norm(norm, "hfft")
    return _real_inverse(conj(_complex_input(x)), *_one_axis(n, axis), _swap(norm), "hfft")


def ihfft(x: ArrayLike, /, n: int | None = None, axis: int = -1, norm: str | None = None) -> Tensor:
    """The inverse of ``hfft``: the n // 2 + 1 terms of a real signal's Hermitian spectrum."""
    norm = _norm(norm, "ihfft")
    return conj(_real_forward(x, *_one_axis(n, axis), _swap(norm), "ihfft"))


# --- helpers: frequencies and shifts -----------------------------------------------------------


def _frequencies(values: np.ndarray, n: int, d: Any, dtype: Any, device: str | None, name: str) -> Tensor:
    dtype = dtypes.default_float if dtype is None else dtypes.canonicalize(dtype)
    if not dtypes.is_float(dtype):
        raise TypeError(f"{name}: dtype must be a real floating dtype, got {np.dtype(dtype).name}")
    ramp = asarray(values.astype(dtype), device=device) if device is not None else asarray(values.astype(dtype))
    return astype(divide(ramp, multiply(d, float(n))), dtype)


def fftfreq(n: int, /, d: Any = 1.0, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """The sample frequencies of an n-point fft: [0, 1, ..., -(n // 2), ..., -1] / (d n)."""
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"fftfreq: n must be a positive integer, got {n}")
    ramp = np.concatenate([np.arange(0, (n - 1) // 2 + 1), np.arange(-(n // 2), 0)])
    return _frequencies(ramp, n, d, dtype, device, "fftfreq")


def rfftfreq(n: int, /, d: Any = 1.0, *, dtype: Any = None, device: str | None = None) -> Tensor:
    """The sample frequencies of an n-point rfft: [0, 1, ..., n // 2] / (d n)."""
    n = operator.index(n)
    if n < 1:
        raise ValueError(f"rfftfreq: n must be a positive integer, got {n}")
    return _frequencies(np.arange(0, n // 2 + 1), n, d, dtype, device, "rfftfreq")


def _shift(x: ArrayLike, axes: int | Sequence[int] | None, inverse: bool) -> Tensor:
    x = asarray(x)
    if axes is None:
        axes = list(range(x.ndim))
    elif isinstance(axes, (int, np.integer)):
        axes = [axes]
    axes = [normalize_axis(a, x.ndim, "axes") for a in axes]
    if not axes:
        return x
    shifts = [-(x.shape[a] // 2) if inverse else x.shape[a] // 2 for a in axes]
    return roll(x, shifts, axis=tuple(axes))


def fftshift(x: ArrayLike, /, axes: int | Sequence[int] | None = None) -> Tensor:
    """Move the zero-frequency term to the centre (a roll by n // 2 along ``axes``, all by default)."""
    return _shift(x, axes, inverse=False)


def ifftshift(x: ArrayLike, /, axes: int | Sequence[int] | None = None) -> Tensor:
    """The inverse of ``fftshift``."""
    return _shift(x, axes, inverse=True)


__all__ = ["fft", "fft2", "fftfreq", "fftn", "fftshift", "hfft", "ifft", "ifft2", "ifftn", "ifftshift",
           "ihfft", "irfft", "irfft2", "irfftn", "rfft", "rfft2", "rfftfreq", "rfftn"]
