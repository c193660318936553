"""Seed-style (PyTorch/tinygrad) autograd on lazy Tensors: ``loss.backward()`` and ``.grad``.

There is no tape: the pending lazy graph behind ``loss`` already records every operation. On
``backward()`` the graph is turned into an IR whose inputs are the realized buffers it reads, and
reverse mode runs on that IR with the transforms' own rules (``funcgrad.vjp``), differentiating
with respect to the inputs that belong to Tensors with ``requires_grad=True``. So
``backward()`` must come before the loss's value is read: reading it computes (and forgets) the
graph.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from funcgrad.ir import dtypes
from funcgrad.lazy import LazyBuffer, graph_to_ir, realize
from funcgrad.tensor import GRAD_LEAVES, Tensor, evaluate

_training = [False]


@contextlib.contextmanager
def train(mode: bool = True) -> Iterator[None]:
    """``with Tensor.train():`` sets ``Tensor.training`` (read by dropout and batch norm)."""
    previous = _training[0]
    _training[0] = mode
    try:
        yield
    finally:
        _training[0] = previous


def is_training() -> bool:
    return _training[0]


def backward(loss: Tensor, gradient: Any = None) -> Tensor:
    """Accumulate d loss / d leaf into ``leaf.grad`` for every Tensor with ``requires_grad=True``
    that ``loss`` depends on. ``gradient`` defaults to 1 (``loss`` must then be a scalar)."""
    from funcgrad.transforms.ad import vjp
    data = loss._data
    if not isinstance(data, LazyBuffer):
        raise TypeError("backward() works on concrete Tensors; inside transformations use fg.grad")
    if data.realized:
        raise RuntimeError("backward() needs the computation that produced this Tensor, but its value was "
                           "already computed (by .item(), .numpy(), print, ...), which discards it; call "
                           "backward() first")
    if gradient is None and loss.shape != ():
        raise ValueError(f"backward() without a gradient needs a scalar loss, got shape {loss.shape}")
    leaves = {id(t._data): t for t in list(GRAD_LEAVES.values()) if t.requires_grad}
    buffers = [t._data for t in leaves.values() if isinstance(t._data, LazyBuffer)]
    realize([b for b in buffers if not b.realized])  # the leaves become inputs of the graph
    by_buffer = {id(b): leaves[id(b)] for b in buffers}
    ir, inputs = graph_to_ir([data])
    wrt = [i for i, b in enumerate(inputs) if id(b) in by_buffer and dtypes.is_float(b.aval.dtype)]
    if not wrt:
        raise RuntimeError("backward(): no Tensor this value depends on has requires_grad=True")
    arguments = [Tensor._wrap(b) for b in inputs]

    def from_leaves(*values: Tensor) -> Any:
        full = list(arguments)
        for i, value in zip(wrt, values):
            full[i] = value
        return evaluate(ir, *full)[0]

    _, pullback = vjp(from_leaves, *(arguments[i] for i in wrt))
    seed = np.ones((), loss.dtype)[()] if gradient is None else gradient
    for i, grad in zip(wrt, pullback(seed)):
        leaf = by_buffer[id(inputs[i])]
        leaf.grad = grad if leaf.grad is None else leaf.grad + grad
    return loss
