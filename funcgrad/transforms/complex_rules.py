"""Differentiation and batching rules of the complex-number primitives (real, imag, conj, complex)
and of fft.

JAX's conventions, which these rules reproduce: a transpose rule is the plain (bilinear, not
Hermitian) transpose of the linear map over the reals, so ``mul``'s transpose multiplies by the other
factor without conjugating it, ``conj``'s transpose is ``conj``, ``real``'s makes ``complex(ct, 0)``
and ``imag``'s ``complex(0, -ct)``. With those, ``grad`` of a real-valued function of a complex
input returns the conjugate of the gradient with respect to (re, im) packed as re + i im: for
``f(z) = |z|**2`` it is ``2 * conj(z)`` (``jax.grad(lambda z: jnp.abs(z)**2)(1+2j)`` is 2-4j), and
``grad(f, holomorphic=True)`` returns f'(z).

fft is linear: its jvp is the fft of the tangent. The DFT matrix is symmetric, so the transpose of
an fft (or an ifft) is the same transform of the cotangent; rfft and irfft, which map between real
and half-spectrum complex arrays, transpose as written at ``_rfft_transpose`` and ``_irfft_transpose``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.transforms.batching import batch_rules, move_to_front
from funcgrad.transforms.jvp import jvp_rules
from funcgrad.transforms.transpose import transpose_rules

__all__: list[str] = []  # this module only registers rules


def _zero_like(x: Any, dtype: np.dtype) -> Any:
    zero = np.zeros((), dtype)[()]
    return bind(P.broadcast_in_dim_p, zero, shape=tuple(x.shape), broadcast_dimensions=())


def _complex(re: Any, im: Any) -> Any:
    return bind(P.complex_p, re, im)


def _linear_unary(primitive: P.Primitive) -> Any:
    def rule(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
        (x,), (t,) = primals, tangents
        return bind(primitive, x), bind(primitive, t)
    return rule


for _p in (P.real_p, P.imag_p, P.conj_p):
    jvp_rules[_p] = _linear_unary(_p)


def _real_transpose(ct: Any, x: Any) -> list[Any]:
    return [_complex(ct, _zero_like(ct, ct.dtype))]


def _imag_transpose(ct: Any, x: Any) -> list[Any]:
    return [_complex(_zero_like(ct, ct.dtype), bind(P.neg_p, ct))]


transpose_rules[P.real_p] = _real_transpose
transpose_rules[P.imag_p] = _imag_transpose
transpose_rules[P.conj_p] = lambda ct, x: [bind(P.conj_p, ct)]


def _complex_jvp(primals: list[Any], tangents: list[Any]) -> tuple[Any, Any]:
    (re, im), (t_re, t_im) = primals, tangents
    out = _complex(re, im)
    if t_re is None and t_im is None:
        return out, None
    part = dtypes.real_dtype(out.dtype)
    t_re = _zero_like(out, part) if t_re is None else _fit(t_re, out.shape)
    t_im = _zero_like(out, part) if t_im is None else _fit(t_im, out.shape)
    return out, _complex(t_re, t_im)


def _fit(t: Any, shape: tuple[int, ...]) -> Any:
    if tuple(t.shape) == tuple(shape):
        return t
    return bind(P.broadcast_in_dim_p, t, shape=tuple(shape), broadcast_dimensions=())


def _unbroadcast(ct: Any, operand: Any) -> Any:
    shape = operand.aval.shape
    if tuple(shape) == tuple(ct.shape):
        return ct
    return bind(P.reduce_sum_p, ct, axes=tuple(range(ct.ndim)))


def _complex_transpose(ct: Any, re: Any, im: Any) -> list[Any]:
    from funcgrad.transforms.transpose import is_undefined
    return [_unbroadcast(bind(P.real_p, ct), re) if is_undefined(re) else None,
            _unbroadcast(bind(P.neg_p, bind(P.imag_p, ct)), im) if is_undefined(im) else None]


jvp_rules[P.complex_p] = _complex_jvp
transpose_rules[P.complex_p] = _complex_transpose

# --- fft -----------------------------------------------------------------------------------------


def _fft(x: Any, fft_type: str, fft_lengths: tuple[int, ...]) -> Any:
    return bind(P.fft_p, x, fft_type=fft_type, fft_lengths=tuple(fft_lengths))


def _fft_jvp(primals: list[Any], tangents: list[Any], *, fft_type: str,
             fft_lengths: tuple[int, ...]) -> tuple[Any, Any]:
    (x,), (t,) = primals, tangents
    return _fft(x, fft_type, fft_lengths), _fft(t, fft_type, fft_lengths)


def _rfft_transpose(ct: Any, fft_lengths: tuple[int, ...]) -> Any:
    """rfft(x) = fft(complex(x))[..., :n//2 + 1] on the last axis: its transpose zero-pads the
    cotangent back to n, applies fft's transpose (fft itself), and takes the real part (the
    transpose of real -> complex)."""
    n = fft_lengths[-1]
    pad = n - ct.shape[-1]
    zero = np.zeros((), ct.dtype)[()]
    padded = bind(P.pad_p, ct, zero, low=(0,) * ct.ndim, high=(0,) * (ct.ndim - 1) + (pad,))
    return bind(P.real_p, _fft(padded, "fft", fft_lengths))


def _irfft_transpose(ct: Any, fft_lengths: tuple[int, ...]) -> Any:
    """irfft(y) = real(ifft(y extended by Hermitian symmetry)) / scaled by 1/N. Its transpose is
    rfft(ct) / N with the bins that appear twice in the full spectrum (all but DC and, for even n,
    Nyquist) doubled, conjugated (the plain transpose of the symmetric extension, JAX's convention)."""
    spectrum = _fft(ct, "rfft", fft_lengths)
    m, n = spectrum.shape[-1], fft_lengths[-1]
    weights = np.full((m,), 2.0)
    weights[0] = 1.0
    if n % 2 == 0:
        weights[-1] = 1.0
    weights = (weights / math.prod(fft_lengths)).astype(spectrum.dtype)
    scale = bind(P.broadcast_in_dim_p, Tensor(weights, dtype=weights.dtype), shape=tuple(spectrum.shape),
                 broadcast_dimensions=(spectrum.ndim - 1,)) if m > 1 else weights[0]
    return bind(P.conj_p, bind(P.mul_p, spectrum, scale))


def _fft_transpose(ct: Any, x: Any, *, fft_type: str, fft_lengths: tuple[int, ...]) -> list[Any]:
    if fft_type == "rfft":
        return [_rfft_transpose(ct, fft_lengths)]
    if fft_type == "irfft":
        return [_irfft_transpose(ct, fft_lengths)]
    return [_fft(ct, fft_type, fft_lengths)]  # the DFT matrix is symmetric


def _fft_batch(args: list[Any], dims: list[Any], *, axis_size: int, fft_type: str,
               fft_lengths: tuple[int, ...]) -> tuple[Any, Any]:
    (x,), (dim,) = args, dims
    x = move_to_front(x, dim)  # the fft acts on the trailing axes: any leading axis is a batch axis
    return _fft(x, fft_type, fft_lengths), 0


def _unary_batch(primitive: P.Primitive) -> Any:
    def rule(args: list[Any], dims: list[Any], *, axis_size: int) -> tuple[Any, Any]:
        (x,), (dim,) = args, dims
        return bind(primitive, x), dim
    return rule


jvp_rules[P.fft_p] = _fft_jvp
transpose_rules[P.fft_p] = _fft_transpose
batch_rules[P.fft_p] = _fft_batch
for _p in (P.real_p, P.imag_p, P.conj_p):
    batch_rules[_p] = _unary_batch(_p)
