"""tinygrad's and PyTorch's math methods of Tensor: named arithmetic, comparisons, dtype casts,
scans, sorting and statistics, each a thin call into ``funcgrad.numpy``.

``MathMethods`` is one of the groups ``tensor_methods.TensorMethods`` inherits; its members are
copied onto ``Tensor`` when funcgrad is imported. Names and signatures are tinygrad's (``x.add(y,
reverse=True)`` is ``y + x``); where tinygrad and PyTorch agree, PyTorch's behaviour is the
reference (docs/tensor-api.md lists where they differ).
"""

from __future__ import annotations

import builtins
from typing import Any

import funcgrad.numpy as fnp
from funcgrad.core.tensor import Tensor
from funcgrad.ir import dtypes
from funcgrad.tensor_group import TensorGroup


def _moved(x: Tensor, dim: int, name: str) -> int:
    """``dim`` as a non-negative axis of ``x``, with tinygrad's error wording for a bad one."""
    if not -max(x.ndim, 1) <= dim < max(x.ndim, 1):
        raise IndexError(f"{name}: dim {dim} is out of range for a Tensor of rank {x.ndim} (shape {x.shape})")
    return dim % max(x.ndim, 1)


def _operands(self: Any, other: Any, reverse: bool) -> tuple[Any, Any]:
    return (other, self) if reverse else (self, other)


def _cumulative_index(x: Tensor, running: Tensor, axis: int) -> Tensor:
    """Where each running max/min (``running``, from cummax/cummin of ``x``) was first reached
    (tinygrad's rule; PyTorch gives the last of tied positions): the last position j <= i where
    the running value changed."""
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]
    positions = fnp.reshape(fnp.arange(x.shape[axis], dtype=dtypes.int32), shape)
    changed = (running != fnp.roll(running, 1, axis=axis)) | (positions == 0)
    return fnp.cummax(fnp.where(changed, positions, 0), axis=axis)


def _running_extreme(x: Any, axis: int, name: str) -> tuple[Tensor, Tensor]:
    """``cummax``/``cummin`` (``name``) along ``axis`` with the index of each running value."""
    x = fnp.asarray(x)
    if x.ndim == 0:
        return x, fnp.zeros((), dtype=dtypes.int32)
    axis = _moved(x, axis, name)
    values = getattr(fnp, name)(x, axis=axis)
    return values, _cumulative_index(x, values, axis)


class MathMethods(TensorGroup):
    """Arithmetic, comparison, casting, scans, sorting and statistics by name (see docs/tensor-api.md)."""


    # --- named arithmetic (tinygrad's ``reverse=`` swaps the operands) ---------------------------
    def add(self, x: Any, reverse: bool = False) -> Tensor: return fnp.add(*_operands(self, x, reverse))
    def sub(self, x: Any, reverse: bool = False) -> Tensor: return fnp.subtract(*_operands(self, x, reverse))
    def mul(self, x: Any, reverse: bool = False) -> Tensor: return fnp.multiply(*_operands(self, x, reverse))
    def pow(self, x: Any, reverse: bool = False) -> Tensor: return fnp.pow(*_operands(self, x, reverse))

    def div(self, x: Any, reverse: bool = False, rounding_mode: str | None = None) -> Tensor:
        """True division (integers give floats, as PyTorch); ``rounding_mode='trunc'`` rounds toward
        zero and ``'floor'`` toward -inf, keeping integer dtypes.

        >>> Tensor([-7, 7]).div(2, rounding_mode="trunc").tolist()
        [-3, 3]
        """
        a, b = _operands(self, x, reverse)
        if rounding_mode is None:
            return fnp.divide(a, b)
        if rounding_mode == "floor":
            return fnp.floor_divide(a, b)
        if rounding_mode == "trunc":
            a, b = fnp.asarray(a), fnp.asarray(b)
            if dtypes.is_float(fnp.result_type(a, b)):
                return fnp.trunc(fnp.divide(a, b))
            return fnp.floor_divide(a - fnp.fmod(a, b), b)  # exact: a - fmod(a, b) is a multiple of b
        raise ValueError(f"div: rounding_mode must be None, 'trunc' or 'floor', got {rounding_mode!r}")

    def mod(self, x: Any, reverse: bool = False) -> Tensor:
        """Python's ``%``: the remainder has the sign of the divisor (PyTorch's ``remainder``)."""
        return fnp.remainder(*_operands(self, x, reverse))

    def fmod(self, x: Any) -> Tensor:
        """C's fmod: the remainder has the sign of the dividend."""
        return fnp.fmod(self, x)

    def eq(self, x: Any) -> Tensor: return fnp.equal(self, x)
    def ne(self, x: Any) -> Tensor: return fnp.not_equal(self, x)
    def lshift(self, x: Any, reverse: bool = False) -> Tensor:
        return fnp.bitwise_left_shift(*_operands(self, x, reverse))
    def rshift(self, x: Any, reverse: bool = False) -> Tensor:
        return fnp.bitwise_right_shift(*_operands(self, x, reverse))
    def bitwise_and(self, x: Any, reverse: bool = False) -> Tensor:
        return fnp.bitwise_and(*_operands(self, x, reverse))
    def bitwise_or(self, x: Any, reverse: bool = False) -> Tensor:
        return fnp.bitwise_or(*_operands(self, x, reverse))
    def bitwise_xor(self, x: Any, reverse: bool = False) -> Tensor:
        return fnp.bitwise_xor(*_operands(self, x, reverse))
    def bitwise_not(self) -> Tensor: return fnp.bitwise_invert(self)
    def copysign(self, other: Any) -> Tensor: return fnp.copysign(self, other)
    def logaddexp(self, other: Any) -> Tensor: return fnp.logaddexp(self, other)

    def lerp(self, end: Any, weight: Any) -> Tensor:
        """self + (end - self) * weight."""
        return self + (fnp.asarray(end) - self) * weight

    # --- elementwise functions -------------------------------------------------------------------
    def log10(self) -> Tensor: return fnp.log10(self)
    def trunc(self) -> Tensor: return fnp.trunc(self)
    def asin(self) -> Tensor: return fnp.asin(self)
    def acos(self) -> Tensor: return fnp.acos(self)
    def atan(self) -> Tensor: return fnp.atan(self)
    def sinh(self) -> Tensor: return fnp.sinh(self)
    def cosh(self) -> Tensor: return fnp.cosh(self)
    def asinh(self) -> Tensor: return fnp.asinh(self)
    def acosh(self) -> Tensor: return fnp.acosh(self)
    def atanh(self) -> Tensor: return fnp.atanh(self)

    def isinf(self, detect_positive: bool = True, detect_negative: bool = True) -> Tensor:
        """tinygrad's isinf: which infinities count is chosen by the two flags."""
        if detect_positive and detect_negative:
            return fnp.isinf(self)
        if detect_positive:
            return fnp.isposinf(self)
        if detect_negative:
            return fnp.isneginf(self)
        return fnp.zeros(self.shape, dtype=dtypes.bool_)

    def isclose(self, other: Any, rtol: builtins.float = 1e-05, atol: builtins.float = 1e-08,
                equal_nan: builtins.bool = False) -> Tensor:
        return fnp.isclose(self, other, rtol=rtol, atol=atol, equal_nan=equal_nan)

    def allclose(self, other: Any, rtol: builtins.float = 1e-05, atol: builtins.float = 1e-08,
                 equal_nan: builtins.bool = False) -> Tensor:
        """Whether every element is close, as a bool Tensor (tinygrad's; PyTorch returns a Python
        bool, and ``bool(x.allclose(y))`` or ``if x.allclose(y):`` work the same)."""
        return fnp.all(fnp.isclose(self, other, rtol=rtol, atol=atol, equal_nan=equal_nan))

    @staticmethod
    def einsum(formula: str, *operands: Any, dtype: Any = None) -> Tensor:
        """``Tensor.einsum("ij,jk->ik", a, b)``; operands may also be given as one list."""
        if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
            operands = tuple(operands[0])
        out = fnp.einsum(formula, *operands)
        return out if dtype is None else fnp.astype(out, dtype)

    # --- scans ---------------------------------------------------------------------------------
    def cumprod(self, axis: int) -> Tensor:
        return fnp.cumprod(self, axis=_moved(fnp.asarray(self), axis, "cumprod"))

    def cummax(self, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(running maximum, index where it was first reached) along ``axis`` (ties: tinygrad's first)."""
        return _running_extreme(self, axis, "cummax")

    def cummin(self, axis: int = 0) -> tuple[Tensor, Tensor]:
        """(running minimum, index where it was first reached) along ``axis`` (ties: tinygrad's first)."""
        return _running_extreme(self, axis, "cummin")

    def logcumsumexp(self, axis: int = 0) -> Tensor:
        """log(cumsum(exp(x))) along ``axis``, shifted by the maximum so it does not overflow."""
        x = fnp.asarray(self)
        if x.ndim == 0 or x.size == 0:
            return x
        axis = _moved(x, axis, "logcumsumexp")
        peak = fnp.max(x, axis=axis, keepdims=True)
        peak = fnp.where(fnp.isfinite(peak), peak, 0.0)
        from funcgrad.transforms.custom import stop_gradient
        peak = stop_gradient(peak)  # the shift cancels out; differentiating it only adds rounding
        return fnp.log(fnp.cumsum(fnp.exp(x - peak), axis=axis)) + peak

    # --- sorting -------------------------------------------------------------------------------
    def sort(self, dim: int = -1, descending: builtins.bool = False) -> tuple[Tensor, Tensor]:
        """(sorted values, their indices) along ``dim``; ties keep their order (a stable sort)."""
        x = fnp.asarray(self)
        if x.ndim == 0:
            return x, fnp.zeros((), dtype=dtypes.int32)
        dim = _moved(x, dim, "sort")
        order = fnp.argsort(x, axis=dim, descending=descending, stable=True)
        return fnp.take_along_axis(x, order, axis=dim), order

    def argsort(self, dim: int = -1, descending: builtins.bool = False) -> Tensor:
        x = fnp.asarray(self)
        if x.ndim == 0:
            return fnp.zeros((), dtype=dtypes.int32)
        return fnp.argsort(x, axis=_moved(x, dim, "argsort"), descending=descending, stable=True)

    def topk(self, k: int, dim: int = -1, largest: builtins.bool = True,
             sorted_: builtins.bool = True) -> tuple[Tensor, Tensor]:
        """The ``k`` largest (or smallest) values along ``dim`` and their indices, always sorted."""
        x = fnp.asarray(self)
        axis = _moved(x, dim, "topk") if x.ndim else 0
        if x.ndim and not 0 <= k <= x.shape[axis]:
            raise ValueError(f"topk: k={k} is out of range for dim {dim} of size {x.shape[axis]}")
        values, indices = MathMethods.sort(x, axis, descending=largest)
        index = (slice(None),) * axis + (slice(0, k),)
        return values[index], indices[index]

    # --- statistics ----------------------------------------------------------------------------
    def var_mean(self, axis: Any = None, keepdim: builtins.bool = False,
                 correction: builtins.float = 1) -> tuple[Tensor, Tensor]:
        return (fnp.var(self, axis=axis, keepdims=keepdim, correction=correction),
                fnp.mean(self, axis=axis, keepdims=keepdim))

    def std_mean(self, axis: Any = None, keepdim: builtins.bool = False,
                 correction: builtins.float = 1) -> tuple[Tensor, Tensor]:
        return (fnp.std(self, axis=axis, keepdims=keepdim, correction=correction),
                fnp.mean(self, axis=axis, keepdims=keepdim))

    # --- sizes and dtypes ----------------------------------------------------------------------
    def numel(self) -> int:
        return self.size

    def element_size(self) -> int:
        return self.dtype.itemsize

    def is_floating_point(self) -> builtins.bool:
        return dtypes.is_float(self.dtype)

    def int(self) -> Tensor: return fnp.astype(self, dtypes.int32)
    def long(self) -> Tensor: return fnp.astype(self, dtypes.int64)
    def short(self) -> Tensor: return fnp.astype(self, dtypes.int16)
    def bool(self) -> Tensor: return fnp.astype(self, dtypes.bool_)
    def double(self) -> Tensor: return fnp.astype(self, dtypes.float64)
    def bfloat16(self) -> Tensor: return fnp.astype(self, dtypes.bfloat16)

    def bitcast(self, dtype: Any) -> Tensor:
        """The same bits read as ``dtype`` (of the same item size; PyTorch's ``view(dtype)``)."""
        from funcgrad.core.tensor import bind
        from funcgrad.ir import primitives as P
        target = dtypes.canonicalize(dtype)
        if target.itemsize != self.dtype.itemsize:
            raise ValueError(f"bitcast: {self.dtype.name} ({self.dtype.itemsize} bytes) and {target.name} "
                             f"({target.itemsize} bytes) differ in size; bitcast needs equal item sizes")
        result: Tensor = bind(P.bitcast_convert_type_p, self, new_dtype=target)
        return result

    def newton_schulz(self, steps: builtins.int, params: tuple[builtins.float, ...],
                      eps: builtins.float = 1e-7) -> Tensor:
        """tinygrad's orthogonalisation (Muon's): scale the last two axes to unit Frobenius norm, then
        ``steps`` times G <- sum_i params[i] * (G G^T)^i G; a tall matrix is done transposed.

        >>> Tensor([[3.0, 0.0], [0.0, 4.0]]).newton_schulz(1, (1.0,)).tolist()  # params (1,): only the scaling
        [[0.6000000238418579, 0.0], [0.0, 0.800000011920929]]
        """
        x = fnp.asarray(self)
        if x.ndim < 2:
            raise ValueError(f"newton_schulz: needs a matrix (..., M, N), got shape {x.shape}")
        if x.shape[-2] > x.shape[-1]:
            return fnp.matrix_transpose(MathMethods.newton_schulz(fnp.matrix_transpose(x), steps, params, eps))
        g = x / (fnp.sqrt(fnp.sum(x * x, axis=(-2, -1), keepdims=True)) + eps)
        for _ in range(steps):
            gram = fnp.matmul(g, fnp.matrix_transpose(g))
            term, total = g, params[0] * g
            for coefficient in params[1:]:
                term = fnp.matmul(gram, term)
                total = total + coefficient * term
            g = total
        return g

    # --- decompositions (funcgrad.numpy.linalg's; tinygrad's layouts) ---------------------------------
    def qr(self) -> tuple[Tensor, Tensor]:
        """(Q, R) with Q square (M, M) and R (M, N) upper triangular, x = Q R (tinygrad's complete QR)."""
        q, r = _linalg("qr")(self, mode="complete")
        return q, r

    def svd(self, full_matrices: builtins.bool = True) -> tuple[Tensor, Tensor, Tensor]:
        """(U, S, Vh) with x = U diag(S) Vh, S descending (tinygrad and NumPy return Vh, not V)."""
        u, s, vh = _linalg("svd")(self, full_matrices=full_matrices)
        return u, s, vh


def _linalg(name: str) -> Any:
    """``funcgrad.numpy.linalg.<name>``, or an error saying it is not in this build yet."""
    from funcgrad.numpy import linalg
    function = getattr(linalg, name, None)
    if function is None:
        raise NotImplementedError(f"Tensor.{name} needs funcgrad.numpy.linalg.{name}, which this build does not have")
    return function
