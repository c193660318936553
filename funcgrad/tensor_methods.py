"""The methods and operators of Tensor, as thin calls into ``funcgrad.numpy``.

Kept apart from ``tensor.py`` so the array type's core (data, conversion, bind) reads on one
screen, and so there is one implementation of each operation: ``x.sum(0)`` is ``fnp.sum(x, axis=0)``.
Method names follow NumPy/JAX where they agree with PyTorch and tinygrad, and add the tinygrad
spellings the seed uses (``permute``, ``relu``, ``flatten``, ``Tensor.ones(2, 3)``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import funcgrad.numpy as fnp
from funcgrad.ir import dtypes
from funcgrad.tensor import Tensor


def _shape_args(shape: tuple[Any, ...]) -> tuple[int, ...]:
    """Accept both ``f(2, 3)`` and ``f((2, 3))``."""
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        return tuple(shape[0])
    return tuple(shape)


def _binary(fn: Any, reflected: bool = False) -> Any:
    if reflected:
        return lambda self, other: fn(other, self)
    return lambda self, other: fn(self, other)


_OPERATORS = {
    "add": fnp.add, "sub": fnp.subtract, "mul": fnp.multiply, "truediv": fnp.divide,
    "floordiv": fnp.floor_divide, "mod": fnp.remainder, "pow": fnp.pow, "matmul": fnp.matmul,
    "and": fnp.bitwise_and, "or": fnp.bitwise_or, "xor": fnp.bitwise_xor,
    "lshift": fnp.bitwise_left_shift, "rshift": fnp.bitwise_right_shift,
}
for _name, _fn in _OPERATORS.items():
    setattr(Tensor, f"__{_name}__", _binary(_fn))
    setattr(Tensor, f"__r{_name}__", _binary(_fn, reflected=True))

for _name, _fn in {"eq": fnp.equal, "ne": fnp.not_equal, "lt": fnp.less, "le": fnp.less_equal,
                   "gt": fnp.greater, "ge": fnp.greater_equal}.items():
    setattr(Tensor, f"__{_name}__", _binary(_fn))

Tensor.__neg__ = lambda self: fnp.negative(self)  # type: ignore[method-assign,assignment]
Tensor.__pos__ = lambda self: fnp.positive(self)  # type: ignore[attr-defined]
Tensor.__abs__ = lambda self: fnp.abs(self)  # type: ignore[attr-defined]
Tensor.__invert__ = lambda self: fnp.bitwise_invert(self)  # type: ignore[attr-defined]


def _getitem(self: Tensor, index: Any) -> Tensor:
    from funcgrad.numpy.indexing import getitem
    return getitem(self, index)


def _setitem(self: Tensor, index: Any, value: Any) -> None:
    raise TypeError("funcgrad Tensors are immutable; use x = x.at[index].set(value) (as in JAX)")


Tensor.__getitem__ = _getitem  # type: ignore[attr-defined]
Tensor.__setitem__ = _setitem  # type: ignore[attr-defined]


def _at(self: Tensor) -> Any:
    from funcgrad.numpy.indexing import AtIndexer
    return AtIndexer(self)


Tensor.at = property(_at)  # type: ignore[attr-defined]

# --- plain methods -----------------------------------------------------------------------------


class _Methods:
    """Bodies of the Tensor methods; copied onto Tensor below (a mixin would split the class)."""

    def astype(self, dtype: Any, copy: bool = True) -> Tensor:
        return fnp.astype(self, dtype)

    def cast(self, dtype: Any) -> Tensor:
        return fnp.astype(self, dtype)

    def float(self) -> Tensor:
        return fnp.astype(self, dtypes.float32)

    def half(self) -> Tensor:
        return fnp.astype(self, dtypes.float16)

    def contiguous(self) -> Tensor:
        return self

    def reshape(self, *shape: Any) -> Tensor:
        """``x.reshape(2, 3)`` or ``x.reshape((2, 3))``; one dimension may be -1."""
        return fnp.reshape(self, _shape_args(shape))

    def view(self, *shape: Any) -> Tensor:
        return fnp.reshape(self, _shape_args(shape))

    def permute(self, *axes: Any) -> Tensor:
        return fnp.permute_dims(self, _shape_args(axes))

    def transpose(self, *axes: Any) -> Tensor:
        """NumPy's transpose: no argument reverses the axes, else the new order of the axes."""
        return fnp.transpose(self, _shape_args(axes) if axes else None)

    @property
    def T(self) -> Tensor:
        return fnp.transpose(self)

    @property
    def mT(self) -> Tensor:
        return fnp.matrix_transpose(self)

    def flatten(self, start_dim: int = 0, end_dim: int = -1) -> Tensor:
        return fnp.flatten(self, start_dim, end_dim)

    def ravel(self) -> Tensor:
        return fnp.ravel(self)

    def squeeze(self, axis: int | Sequence[int] | None = None) -> Tensor:
        return fnp.squeeze(self, axis)

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

    def sum(self, axis: Any = None, keepdims: bool = False, dtype: Any = None) -> Tensor:
        return fnp.sum(self, axis=axis, keepdims=keepdims, dtype=dtype)

    def prod(self, axis: Any = None, keepdims: bool = False, dtype: Any = None) -> Tensor:
        return fnp.prod(self, axis=axis, keepdims=keepdims, dtype=dtype)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return fnp.mean(self, axis=axis, keepdims=keepdims)

    def var(self, axis: Any = None, keepdims: bool = False, correction: float = 0.0,
            ddof: float | None = None) -> Tensor:
        return fnp.var(self, axis=axis, keepdims=keepdims, correction=correction, ddof=ddof)

    def std(self, axis: Any = None, keepdims: bool = False, correction: float = 0.0,
            ddof: float | None = None) -> Tensor:
        return fnp.std(self, axis=axis, keepdims=keepdims, correction=correction, ddof=ddof)

    def max(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return fnp.max(self, axis=axis, keepdims=keepdims)

    def min(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return fnp.min(self, axis=axis, keepdims=keepdims)

    def all(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return fnp.all(self, axis=axis, keepdims=keepdims)

    def any(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return fnp.any(self, axis=axis, keepdims=keepdims)

    def argmax(self, axis: int | None = None, keepdims: bool = False) -> Tensor:
        return fnp.argmax(self, axis=axis, keepdims=keepdims)

    def argmin(self, axis: int | None = None, keepdims: bool = False) -> Tensor:
        return fnp.argmin(self, axis=axis, keepdims=keepdims)

    def cumsum(self, axis: int | None = None) -> Tensor:
        return fnp.cumsum(self, axis=axis)

    def logsumexp(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        return fnp.logsumexp(self, axis=axis, keepdims=keepdims)

    def dot(self, other: Any) -> Tensor:
        """Matrix product (tinygrad/PyTorch ``dot``: the same as ``@``)."""
        return fnp.matmul(self, other)

    def matmul(self, other: Any) -> Tensor:
        return fnp.matmul(self, other)

    def clip(self, min: Any = None, max: Any = None) -> Tensor:  # noqa: A002
        return fnp.clip(self, min, max)

    clamp = clip

    def maximum(self, other: Any) -> Tensor:
        return fnp.maximum(self, other)

    def minimum(self, other: Any) -> Tensor:
        return fnp.minimum(self, other)

    def where(self, x: Any, y: Any) -> Tensor:
        """tinygrad's ``cond.where(x, y)``."""
        return fnp.where(self, x, y)

    def relu(self) -> Tensor:
        return fnp.maximum(self, 0)

    def sigmoid(self) -> Tensor:
        return fnp.sigmoid(self)

    def softmax(self, axis: int = -1) -> Tensor:
        shifted = self - fnp.max(self, axis=axis, keepdims=True)
        exps = fnp.exp(shifted)
        return exps / fnp.sum(exps, axis=axis, keepdims=True)

    def log_softmax(self, axis: int = -1) -> Tensor:
        return self - fnp.logsumexp(self, axis=axis, keepdims=True)

    def sparse_categorical_crossentropy(self, labels: Any, ignore_index: int = -1,
                                        label_smoothing: float = 0.0) -> Tensor:
        """Mean cross-entropy of logits ``self`` (N, C) against integer ``labels`` (N,)."""
        labels = fnp.asarray(labels)
        if labels.shape != self.shape[:-1]:
            raise ValueError(f"sparse_categorical_crossentropy: labels of shape {labels.shape} do not "
                             f"match logits of shape {self.shape} (expected {self.shape[:-1]})")
        log_probs = self.log_softmax(axis=-1)
        classes = fnp.arange(self.shape[-1])
        one_hot = (fnp.expand_dims(labels, -1) == classes).astype(log_probs.dtype)
        targets = one_hot * (1 - label_smoothing) + label_smoothing / self.shape[-1]
        valid = (labels != ignore_index).astype(log_probs.dtype)
        losses = -fnp.sum(targets * log_probs, axis=-1) * valid
        return fnp.sum(losses) / fnp.maximum(fnp.sum(valid), 1)

    def square(self) -> Tensor:
        return fnp.square(self)

    def reciprocal(self) -> Tensor:
        return fnp.reciprocal(self)

    def abs(self) -> Tensor:
        return fnp.abs(self)

    def neg(self) -> Tensor:
        return fnp.negative(self)


for _name in (n for n in vars(_Methods) if not n.startswith("__")):
    setattr(Tensor, _name, vars(_Methods)[_name])

for _name in ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tan", "tanh", "floor", "ceil",
              "round", "sign", "isnan", "isinf", "isfinite", "logical_not", "erf"):
    setattr(Tensor, _name, getattr(fnp, _name))

# --- constructors ------------------------------------------------------------------------------


def _constructor(fn: Any) -> Any:
    def make(*shape: Any, dtype: Any = None, device: str | None = None, requires_grad: bool | None = None,
             **kwargs: Any) -> Tensor:
        out = fn(_shape_args(shape), dtype=dtype, **kwargs)
        out.requires_grad = requires_grad
        return out
    make.__name__ = fn.__name__
    make.__doc__ = f"``Tensor.{fn.__name__}(2, 3)`` or ``Tensor.{fn.__name__}((2, 3))``: see fnp.{fn.__name__}."
    return staticmethod(make)


Tensor.zeros = _constructor(fnp.zeros)  # type: ignore[attr-defined]
Tensor.ones = _constructor(fnp.ones)  # type: ignore[attr-defined]
Tensor.empty = _constructor(fnp.empty)  # type: ignore[attr-defined]


def _full(shape: Any, fill_value: Any, dtype: Any = None, **kwargs: Any) -> Tensor:
    return fnp.full(tuple(shape) if isinstance(shape, (tuple, list)) else (shape,), fill_value, dtype=dtype)


def _arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None, **kwargs: Any) -> Tensor:
    return fnp.arange(start, stop, step, dtype=dtype)


def _eye(n: int, m: int | None = None, dtype: Any = None, requires_grad: bool | None = None,
         **kwargs: Any) -> Tensor:
    out = fnp.eye(n, m, dtype=dtype)
    out.requires_grad = requires_grad
    return out


def _random(kind: str) -> Any:
    def make(*shape: Any, dtype: Any = None, requires_grad: bool | None = None, **kwargs: Any) -> Tensor:
        from funcgrad import random
        out = random.stateful(kind, _shape_args(shape), dtype=dtype, **kwargs)
        out.requires_grad = requires_grad
        return out
    make.__name__ = kind
    return staticmethod(make)


def _manual_seed(seed: int = 0) -> None:
    from funcgrad import random
    random.manual_seed(seed)


Tensor.full = staticmethod(_full)  # type: ignore[attr-defined]
Tensor.arange = staticmethod(_arange)  # type: ignore[attr-defined]
Tensor.eye = staticmethod(_eye)  # type: ignore[attr-defined]
Tensor.rand = _random("rand")  # type: ignore[attr-defined]
Tensor.randn = _random("randn")  # type: ignore[attr-defined]
Tensor.randint = _random("randint")  # type: ignore[attr-defined]
Tensor.uniform = _random("uniform")  # type: ignore[attr-defined]
Tensor.kaiming_uniform = _random("kaiming_uniform")  # type: ignore[attr-defined]
Tensor.glorot_uniform = _random("glorot_uniform")  # type: ignore[attr-defined]
Tensor.manual_seed = staticmethod(_manual_seed)  # type: ignore[attr-defined]
Tensor.zeros_like = staticmethod(lambda x, **kw: fnp.zeros_like(x, **kw))  # type: ignore[attr-defined]
Tensor.ones_like = staticmethod(lambda x, **kw: fnp.ones_like(x, **kw))  # type: ignore[attr-defined]
