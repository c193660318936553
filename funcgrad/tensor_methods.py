"""The methods and operators of Tensor, as thin calls into ``funcgrad.numpy``.

Kept apart from ``tensor.py`` so the array type's core (data, conversion, bind) reads on one
screen, and so there is one implementation of each operation: ``x.sum(0)`` is ``fnp.sum(x, axis=0)``.
Method names follow NumPy/JAX where they agree with PyTorch and tinygrad, and add the tinygrad
spellings the seed uses (``permute``, ``relu``, ``flatten``, ``Tensor.ones(2, 3)``).

``TensorMethods`` holds them all; its members are copied onto ``Tensor`` when funcgrad is
imported (``tensor.py`` cannot import this module: funcgrad.numpy needs Tensor first). Type
checkers see ``Tensor`` as a subclass of ``TensorMethods``.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import funcgrad.numpy as fnp
from funcgrad.core.tensor import Tensor
from funcgrad.ir import dtypes
from funcgrad.tensor_creation import CreationMethods
from funcgrad.tensor_math import MathMethods
from funcgrad.tensor_movement import MovementMethods
from funcgrad.tensor_nn import NNMethods


def _shape_args(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """Accept both ``f(2, 3)`` and ``f((2, 3))``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def _keep(keepdim: bool, keepdims: bool | None) -> bool:
    """tinygrad's/PyTorch's ``keepdim`` or NumPy's ``keepdims`` (which wins when given)."""
    return keepdim if keepdims is None else keepdims


def _axis_arg(axis: Any, dim: Any) -> Any:
    """NumPy's/tinygrad's ``axis`` or PyTorch's ``dim``."""
    if dim is not None and axis is not None:
        raise TypeError("give the reduction axes as axis= or dim=, not both")
    return axis if dim is None else dim


class TensorMethods(MathMethods, MovementMethods, NNMethods, CreationMethods):
    """Everything a Tensor can do besides holding data (see funcgrad.numpy for the semantics). The
    groups it inherits hold tinygrad's math, movement, nn and creation methods."""


    # --- operators ----------------------------------------------------------------------------
    def __add__(self, other: Any) -> Tensor: return fnp.add(self, other)
    def __radd__(self, other: Any) -> Tensor: return fnp.add(other, self)
    def __sub__(self, other: Any) -> Tensor: return fnp.subtract(self, other)
    def __rsub__(self, other: Any) -> Tensor: return fnp.subtract(other, self)
    def __mul__(self, other: Any) -> Tensor: return fnp.multiply(self, other)
    def __rmul__(self, other: Any) -> Tensor: return fnp.multiply(other, self)
    def __truediv__(self, other: Any) -> Tensor: return fnp.divide(self, other)
    def __rtruediv__(self, other: Any) -> Tensor: return fnp.divide(other, self)
    def __floordiv__(self, other: Any) -> Tensor: return fnp.floor_divide(self, other)
    def __rfloordiv__(self, other: Any) -> Tensor: return fnp.floor_divide(other, self)
    def __mod__(self, other: Any) -> Tensor: return fnp.remainder(self, other)
    def __rmod__(self, other: Any) -> Tensor: return fnp.remainder(other, self)
    def __pow__(self, other: Any) -> Tensor: return fnp.pow(self, other)
    def __rpow__(self, other: Any) -> Tensor: return fnp.pow(other, self)
    def __matmul__(self, other: Any) -> Tensor: return fnp.matmul(self, other)
    def __rmatmul__(self, other: Any) -> Tensor: return fnp.matmul(other, self)
    def __and__(self, other: Any) -> Tensor: return fnp.bitwise_and(self, other)
    def __rand__(self, other: Any) -> Tensor: return fnp.bitwise_and(other, self)
    def __or__(self, other: Any) -> Tensor: return fnp.bitwise_or(self, other)
    def __ror__(self, other: Any) -> Tensor: return fnp.bitwise_or(other, self)
    def __xor__(self, other: Any) -> Tensor: return fnp.bitwise_xor(self, other)
    def __rxor__(self, other: Any) -> Tensor: return fnp.bitwise_xor(other, self)
    def __lshift__(self, other: Any) -> Tensor: return fnp.bitwise_left_shift(self, other)
    def __rlshift__(self, other: Any) -> Tensor: return fnp.bitwise_left_shift(other, self)
    def __rshift__(self, other: Any) -> Tensor: return fnp.bitwise_right_shift(self, other)
    def __rrshift__(self, other: Any) -> Tensor: return fnp.bitwise_right_shift(other, self)
    def __eq__(self, other: Any) -> Tensor: return fnp.equal(self, other)  # type: ignore[override]
    def __ne__(self, other: Any) -> Tensor: return fnp.not_equal(self, other)  # type: ignore[override]
    def __lt__(self, other: Any) -> Tensor: return fnp.less(self, other)
    def __le__(self, other: Any) -> Tensor: return fnp.less_equal(self, other)
    def __gt__(self, other: Any) -> Tensor: return fnp.greater(self, other)
    def __ge__(self, other: Any) -> Tensor: return fnp.greater_equal(self, other)
    def __neg__(self) -> Tensor: return fnp.negative(self)
    def __pos__(self) -> Tensor: return fnp.positive(self)
    def __abs__(self) -> Tensor: return fnp.abs(self)
    def __invert__(self) -> Tensor: return fnp.bitwise_invert(self)

    def __getitem__(self, index: Any) -> Tensor:
        from funcgrad.numpy.indexing import getitem
        return getitem(self, index)

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError("funcgrad Tensors are immutable; use x = x.at[index].set(value) (as in JAX)")

    # --- the Array API standard's array object: its namespace, devices ------------------------
    def __array_namespace__(self, /, *, api_version: str | None = None) -> Any:
        """The namespace of this array's functions (``funcgrad.numpy``), for library-agnostic code."""
        return fnp

    def to_device(self, device: str, /, *, stream: Any = None) -> Tensor:
        """The standard's spelling of ``.to(device)``."""
        return self.to(device)  # type: ignore[attr-defined]

    def __complex__(self) -> complex:
        return complex(self.item())  # type: ignore[attr-defined]

    @property
    def at(self) -> Any:
        """JAX's functional updates: ``x.at[i].set(v)``, ``.add``, ``.multiply``, ``.min``, ``.max``, ``.get``."""
        from funcgrad.numpy.indexing import AtIndexer
        return AtIndexer(self)

    # --- methods ------------------------------------------------------------------------------
    def astype(self, dtype: Any, copy: bool = True) -> Tensor:
        return fnp.astype(self, dtype)

    def cast(self, dtype: Any) -> Tensor:
        return fnp.astype(self, dtype)

    def float(self) -> Tensor:
        return fnp.astype(self, dtypes.float32)

    def half(self) -> Tensor:
        return fnp.astype(self, dtypes.float16)

    def contiguous(self) -> Tensor:
        return fnp.asarray(self)

    def reshape(self, *shape: Any) -> Tensor:
        """``x.reshape(2, 3)`` or ``x.reshape((2, 3))``; one dimension may be -1."""
        return fnp.reshape(self, _shape_args(shape))

    def view(self, *shape: Any) -> Tensor:
        return fnp.reshape(self, _shape_args(shape))

    def permute(self, *axes: Any) -> Tensor:
        return fnp.permute_dims(self, _shape_args(axes))

    @property
    def T(self) -> Tensor:
        return fnp.transpose(self)

    @property
    def mT(self) -> Tensor:
        return fnp.matrix_transpose(self)

    @property
    def real(self) -> Tensor:
        """The real part (the array itself for real dtypes), as ``x.real`` in NumPy and JAX."""
        return fnp.real(self)

    @property
    def imag(self) -> Tensor:
        """The imaginary part (zeros for real dtypes)."""
        return fnp.imag(self)

    def conj(self) -> Tensor:
        return fnp.conj(self)

    conjugate = conj

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        return fnp.flatten(self, start_dim, end_dim)

    def ravel(self) -> Tensor:
        return fnp.ravel(self)

    def unsqueeze(self, axis: int) -> Tensor:
        return fnp.expand_dims(self, axis)

    def expand(self, *shape: Any) -> Tensor:
        """Broadcast to ``shape``; -1 keeps a dimension (PyTorch's expand)."""
        target = _shape_args(shape)
        offset = len(target) - self.ndim
        target = tuple(self.shape[i - offset] if d == -1 else d for i, d in enumerate(target))
        return fnp.broadcast_to(self, target)

    def broadcast_to(self, shape: Sequence[int]) -> Tensor:
        return fnp.broadcast_to(self, shape)

    def sum(self, axis: Any = None, keepdim: bool = False, dtype: Any = None, *, keepdims: bool | None = None,
            dim: Any = None) -> Tensor:
        """The sum over ``axis`` (tinygrad's ``keepdim``; NumPy's ``keepdims`` and PyTorch's ``dim`` also work)."""
        return fnp.sum(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims), dtype=dtype)

    def prod(self, axis: Any = None, keepdim: bool = False, dtype: Any = None, *, keepdims: bool | None = None,
             dim: Any = None) -> Tensor:
        return fnp.prod(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims), dtype=dtype)

    def mean(self, axis: Any = None, keepdim: bool = False, *, keepdims: bool | None = None, dim: Any = None) -> Tensor:
        return fnp.mean(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims))

    def var(self, axis: Any = None, keepdim: bool = False, correction: builtins.float = 1, *,
            keepdims: bool | None = None, dim: Any = None, ddof: builtins.float | None = None) -> Tensor:
        """Variance with Bessel's ``correction`` (1 by default, as tinygrad and PyTorch; NumPy's is 0)."""
        return fnp.var(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims),
                       correction=correction if ddof is None else ddof)

    def std(self, axis: Any = None, keepdim: bool = False, correction: builtins.float = 1, *,
            keepdims: bool | None = None, dim: Any = None, ddof: builtins.float | None = None) -> Tensor:
        """Standard deviation with ``correction`` 1 by default (tinygrad and PyTorch)."""
        return fnp.std(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims),
                       correction=correction if ddof is None else ddof)

    def max(self, axis: Any = None, keepdim: bool = False, *, keepdims: bool | None = None, dim: Any = None) -> Tensor:
        return fnp.max(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims))

    def min(self, axis: Any = None, keepdim: bool = False, *, keepdims: bool | None = None, dim: Any = None) -> Tensor:
        return fnp.min(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims))

    def all(self, axis: Any = None, keepdim: bool = False, *, keepdims: bool | None = None, dim: Any = None) -> Tensor:
        return fnp.all(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims))

    def any(self, axis: Any = None, keepdim: bool = False, *, keepdims: bool | None = None, dim: Any = None) -> Tensor:
        return fnp.any(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims))

    def argmax(self, axis: int | None = None, keepdim: bool = False, *, keepdims: bool | None = None,
               dim: int | None = None) -> Tensor:
        return fnp.argmax(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims))

    def argmin(self, axis: int | None = None, keepdim: bool = False, *, keepdims: bool | None = None,
               dim: int | None = None) -> Tensor:
        return fnp.argmin(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims))

    def cumsum(self, axis: int = 0) -> Tensor:
        """Running sum along ``axis`` (0 by default, as tinygrad; a 0-d Tensor is returned as is)."""
        return fnp.cumsum(self, axis=axis) if self.ndim else fnp.asarray(self)

    def logsumexp(self, axis: Any = None, keepdim: bool = False, *, keepdims: bool | None = None,
                  dim: Any = None) -> Tensor:
        return fnp.logsumexp(self, axis=_axis_arg(axis, dim), keepdims=_keep(keepdim, keepdims))

    def dot(self, w: Any, dtype: Any = None) -> Tensor:
        """Matrix product (tinygrad/PyTorch ``dot``: the same as ``@``); ``dtype`` casts the result."""
        out = fnp.matmul(self, w)
        return out if dtype is None else fnp.astype(out, dtype)

    def matmul(self, x: Any, reverse: bool = False, dtype: Any = None) -> Tensor:
        out = fnp.matmul(x, self) if reverse else fnp.matmul(self, x)
        return out if dtype is None else fnp.astype(out, dtype)

    def clip(self, min_: Any = None, max_: Any = None, *, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
        """Clamp to [min_, max_] (tinygrad's names; PyTorch's ``min=``/``max=`` keywords also work)."""
        return fnp.clip(self, min_ if min is None else min, max_ if max is None else max)

    clamp = clip

    def maximum(self, other: Any) -> Tensor:
        return fnp.maximum(self, other)

    def minimum(self, other: Any) -> Tensor:
        return fnp.minimum(self, other)

    def where(self, x: Any, y: Any) -> Tensor:
        """tinygrad's ``cond.where(x, y)``."""
        return fnp.where(self, x, y)

    # --- tinygrad's nn methods, delegating to funcgrad.functional ------------------------------------
    def sequential(self, layers: Sequence[Any]) -> Tensor:
        """Apply each callable of ``layers`` in turn (tinygrad's ``x.sequential(self.layers)``)."""
        result: Any = self
        for layer in layers:
            result = layer(result)
        return result

    def linear(self, weight: Any, bias: Any = None, dtype: Any = None) -> Tensor:
        """tinygrad's ``x.linear(w, b)``: ``x @ w + b`` with w of shape (in, out), unlike functional.linear."""
        out = fnp.matmul(self, weight)
        out = out if bias is None else out + bias
        return out if dtype is None else fnp.astype(out, dtype)

    def layernorm(self, axis: Any = -1, eps: builtins.float = 1e-5) -> Tensor:
        """tinygrad's layernorm: normalize over ``axis`` (no scale or shift)."""
        mean = fnp.mean(self, axis=axis, keepdims=True)
        centered = self - mean
        return centered * fnp.rsqrt(fnp.mean(centered * centered, axis=axis, keepdims=True) + eps)

    def batchnorm(self, weight: Any, bias: Any, mean: Any, invstd: Any, axis: int | tuple[int, ...] = 1) -> Tensor:
        """tinygrad's batchnorm: ``(x - mean) * weight * invstd + bias`` with vectors along ``axis`` (1)."""
        axes = (axis,) if isinstance(axis, int) else tuple(axis)
        axes = tuple(a % self.ndim for a in axes)
        shape = tuple(self.shape[a] if a in axes else 1 for a in range(self.ndim))
        out = self - fnp.reshape(mean, shape)
        if weight is not None:
            out = out * fnp.reshape(weight, shape)
        out = out * (fnp.reshape(invstd, shape) if fnp.asarray(invstd).ndim == 1 else invstd)
        return out if bias is None else out + fnp.reshape(bias, shape)

    def dropout(self, p: builtins.float = 0.5) -> Tensor:
        """tinygrad's dropout: active only in ``Tensor.train()`` mode, drawing from the global key."""
        from funcgrad import functional as F
        from funcgrad.autograd import is_training
        return F.dropout(self, p, training=is_training())

    def square(self) -> Tensor:
        return fnp.square(self)

    def reciprocal(self) -> Tensor:
        return fnp.reciprocal(self)

    def abs(self) -> Tensor:
        return fnp.abs(self)

    def backward(self, gradient: Any = None) -> Tensor:
        """Fill ``.grad`` of the ``requires_grad`` Tensors this one depends on (see funcgrad.autograd)."""
        from funcgrad.autograd import backward
        return backward(self, gradient)  # type: ignore[arg-type]

    def gradient(self, *targets: Tensor, gradient: Any = None) -> list[Tensor]:
        """d self / d target for each of ``targets`` (tinygrad's): nothing is written to ``.grad``.
        ``gradient`` seeds a non-scalar ``self``.

        >>> x = Tensor([1.0, 2.0]); (x * x).sum().gradient(x)[0].tolist()
        [2.0, 4.0]
        """
        from funcgrad.autograd import gradients
        return gradients(self, targets, gradient)  # type: ignore[arg-type]

    def assign(self, x: Any) -> Tensor:
        """Make this Tensor hold ``x``'s value (same shape; cast to this dtype), as tinygrad's
        optimizers update weights in place; returns self. Other Tensors are not affected."""
        value = fnp.asarray(x)
        if value.shape != self.shape:
            value = fnp.broadcast_to(value, self.shape)
        if value.dtype != self.dtype:
            value = fnp.astype(value, self.dtype)
        self._data = value._data
        return self  # type: ignore[return-value]

    def clone(self, device: str | None = None) -> Tensor:
        """A new Tensor with the same value (gradients flow through it, as PyTorch's clone)."""
        copy = Tensor._wrap(self._data)  # values are immutable: sharing is a copy
        return copy if device is None else copy.to(device)

    def contiguous_backward(self) -> Tensor:
        """The same value (tinygrad makes its gradient contiguous; funcgrad's layouts are the lowering's)."""
        return fnp.asarray(self)

    def requires_grad_(self, requires_grad: bool = True) -> Tensor:
        self.requires_grad = requires_grad
        return self  # type: ignore[return-value]

    def to_(self, device: str) -> Tensor:
        """Move this Tensor to ``device`` in place; returns self."""
        self._data = self.to(device)._data  # type: ignore[attr-defined]
        return self  # type: ignore[return-value]

    def data(self) -> memoryview:
        """The value's bytes as a (read-only copy) memoryview (tinygrad's ``data()``)."""
        return memoryview(self.numpy())  # type: ignore[attr-defined]

    def sigmoid(self) -> Tensor:
        return fnp.sigmoid(self)

    def detach(self) -> Tensor:
        """The same value, cut off from gradients (``backward`` and the transforms see a constant)."""
        from funcgrad.transforms.custom import stop_gradient
        result: Tensor = stop_gradient(self)
        return result

    @staticmethod
    def train(mode: bool = True) -> Any:
        """``with Tensor.train(): ...`` (tinygrad/PyTorch style training mode)."""
        from funcgrad.autograd import train
        return train(mode)

    def schedule(self) -> list[Any]:
        """The kernels realizing this Tensor would run (compiled, not run); [] if already computed.

        >>> a, b = Tensor.empty(4, 4), Tensor.empty(4, 4)
        >>> len((a.reshape(4, 1, 4) * b.T.reshape(1, 4, 4)).sum(axis=2).schedule())   # the seed's matmul
        1
        """
        from funcgrad.devices import get_device
        from funcgrad.lazy import LazyBuffer, graph_to_ir
        from funcgrad.lower import compile_plan
        data = self._data
        if not isinstance(data, LazyBuffer):
            raise TypeError("schedule() needs a concrete (lazy) Tensor, not a traced one")
        if data.realized:
            return []
        ir, _ = graph_to_ir([data])
        return compile_plan(ir, get_device(data.device)).kernel_infos()

    def neg(self) -> Tensor:
        return fnp.negative(self)

    def exp(self) -> Tensor: return fnp.exp(self)
    def exp2(self) -> Tensor: return fnp.exp2(self)
    def log(self) -> Tensor: return fnp.log(self)
    def log2(self) -> Tensor: return fnp.log2(self)
    def sqrt(self) -> Tensor: return fnp.sqrt(self)
    def rsqrt(self) -> Tensor: return fnp.rsqrt(self)
    def sin(self) -> Tensor: return fnp.sin(self)
    def cos(self) -> Tensor: return fnp.cos(self)
    def tan(self) -> Tensor: return fnp.tan(self)
    def tanh(self) -> Tensor: return fnp.tanh(self)
    def erf(self) -> Tensor: return fnp.erf(self)
    def floor(self) -> Tensor: return fnp.floor(self)
    def ceil(self) -> Tensor: return fnp.ceil(self)
    def round(self) -> Tensor: return fnp.round(self)
    def sign(self) -> Tensor: return fnp.sign(self)
    def isnan(self) -> Tensor: return fnp.isnan(self)
    def isfinite(self) -> Tensor: return fnp.isfinite(self)
    def logical_not(self) -> Tensor: return fnp.logical_not(self)

    # --- constructors (``Tensor.ones(2, 3)`` or ``Tensor.ones((2, 3))``) ------------------------
    @staticmethod
    def zeros(*shape: Any, dtype: Any = None, device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        return _with_grad(_placed(fnp.zeros(_shape_args(shape), dtype=dtype, device=device), device), requires_grad)

    @staticmethod
    def ones(*shape: Any, dtype: Any = None, device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        return _with_grad(_placed(fnp.ones(_shape_args(shape), dtype=dtype, device=device), device), requires_grad)

    @staticmethod
    def empty(*shape: Any, dtype: Any = None, device: str | None = None, requires_grad: bool | None = None) -> Tensor:
        return _with_grad(_placed(fnp.empty(_shape_args(shape), dtype=dtype, device=device), device), requires_grad)

    @staticmethod
    def full(shape: Any, fill_value: Any, dtype: Any = None, device: str | None = None,
             requires_grad: bool | None = None) -> Tensor:
        shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
        return _with_grad(_placed(fnp.full(shape, fill_value, dtype=dtype), device), requires_grad)

    @staticmethod
    def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None) -> Tensor:
        return fnp.arange(start, stop, step, dtype=dtype)

    @staticmethod
    def eye(n: int, m: int | None = None, dtype: Any = None, requires_grad: bool | None = None) -> Tensor:
        return _with_grad(fnp.eye(n, m, dtype=dtype), requires_grad)

    @staticmethod
    def zeros_like(x: Any, dtype: Any = None) -> Tensor:
        return fnp.zeros_like(x, dtype=dtype)

    @staticmethod
    def ones_like(x: Any, dtype: Any = None) -> Tensor:
        return fnp.ones_like(x, dtype=dtype)

    @staticmethod
    def rand(*shape: Any, dtype: Any = None, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        """Uniform [0, 1) from the global key (``Tensor.manual_seed`` resets it)."""
        return _random("rand", shape, dtype, requires_grad, kwargs)

    @staticmethod
    def randn(*shape: Any, dtype: Any = None, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        return _random("randn", shape, dtype, requires_grad, kwargs)

    @staticmethod
    def randint(*shape: Any, dtype: Any = None, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        return _random("randint", shape, dtype, requires_grad, kwargs)

    @staticmethod
    def uniform(*shape: Any, dtype: Any = None, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        return _random("uniform", shape, dtype, requires_grad, kwargs)

    @staticmethod
    def kaiming_uniform(*shape: Any, dtype: Any = None, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        return _random("kaiming_uniform", shape, dtype, requires_grad, kwargs)

    @staticmethod
    def glorot_uniform(*shape: Any, dtype: Any = None, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        return _random("glorot_uniform", shape, dtype, requires_grad, kwargs)

    @staticmethod
    def manual_seed(seed: int = 0) -> None:
        from funcgrad import random
        random.manual_seed(seed)


def _placed(tensor: Tensor, device: str | None) -> Tensor:
    """``tensor`` committed to ``device`` when one is named (see ``Tensor.to``)."""
    return tensor if device is None else tensor.to(device)


def _with_grad(tensor: Tensor, requires_grad: bool | None) -> Tensor:
    tensor.requires_grad = requires_grad
    return tensor


def _random(kind: str, shape: tuple[Any, ...], dtype: Any, requires_grad: bool | None,
            kwargs: dict[str, Any]) -> Tensor:
    from funcgrad import random
    return _with_grad(random.stateful(kind, _shape_args(shape), dtype=dtype, **kwargs), requires_grad)


_NOT_COPIED = {"__dict__", "__weakref__", "__module__", "__doc__", "__qualname__", "__annotations__"}
_CORE_OWNED = set(vars(Tensor))  # what tensor.py defines itself stays
for _group in reversed(TensorMethods.__mro__[:-1]):  # the groups first, so TensorMethods' own win
    for _name, _member in vars(_group).items():
        if _name not in _NOT_COPIED and _name not in _CORE_OWNED:
            setattr(Tensor, _name, _member)


class _TrainingFlag:
    """``Tensor.training``: read-only class attribute backed by funcgrad.autograd."""

    def __get__(self, instance: Any, owner: Any = None) -> bool:
        from funcgrad.autograd import is_training
        return is_training()


Tensor.training = _TrainingFlag()  # type: ignore[attr-defined]
