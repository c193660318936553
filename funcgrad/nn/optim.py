"""Stateful optimisers for seed-style training: ``opt.zero_grad(); loss.backward(); opt.step()``.

``step()`` computes each parameter's new value from its ``.grad`` (lazily, as fused kernels) and
swaps it into the parameter Tensor (the object stays, so models keep their references), then
realizes parameters and optimiser state together, so graphs do not grow across steps.

>>> opt = SGD([w], lr=0.1); opt.zero_grad(); loss.backward(); opt.step()   # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import funcgrad.numpy as fnp
from funcgrad.lazy import LazyBuffer, realize
from funcgrad.tensor import Tensor


class Optimizer:
    """Holds the parameters (Tensors with ``requires_grad``) and the update rule."""

    def __init__(self, params: Iterable[Tensor], lr: float) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("an optimizer needs at least one parameter")
        for p in self.params:
            if not isinstance(p, Tensor):
                raise TypeError(f"optimizer parameters must be Tensors, got {type(p).__name__}")
            if p.requires_grad is None:
                p.requires_grad = True  # as tinygrad: handing a Tensor to an optimizer makes it trainable
        self.lr = lr
        self.steps = 0

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def step(self) -> None:
        self.steps += 1
        state: list[Tensor] = []
        for index, p in enumerate(self.params):
            if p.grad is None:
                continue
            new_value, new_state = self._update(index, p, p.grad.astype(p.dtype))
            p._data = new_value._data  # swap the value in; the Tensor object stays
            state.extend(new_state)
        realize([t._data for t in self.params + state if isinstance(t._data, LazyBuffer)])

    def _update(self, index: int, param: Tensor, grad: Tensor) -> tuple[Tensor, list[Tensor]]:
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (PyTorch's form), Nesterov momentum and
    weight decay."""

    def __init__(self, params: Iterable[Tensor], lr: float = 0.001, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        super().__init__(params, lr)
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum needs momentum > 0")
        self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
        self.velocity: list[Tensor | None] = [None] * len(self.params)

    def _update(self, index: int, param: Tensor, grad: Tensor) -> tuple[Tensor, list[Tensor]]:
        if self.weight_decay:
            grad = grad + self.weight_decay * param
        if not self.momentum:
            return param - self.lr * grad, []
        previous = self.velocity[index]
        velocity = grad if previous is None else self.momentum * previous + grad
        self.velocity[index] = velocity
        direction = grad + self.momentum * velocity if self.nesterov else velocity
        return param - self.lr * direction, [velocity]


class Adam(Optimizer):
    """Adam (Kingma & Ba); with ``weight_decay`` it is AdamW's decoupled decay."""

    def __init__(self, params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        self.b1, self.b2, self.eps, self.weight_decay = b1, b2, eps, weight_decay
        self.m: list[Any] = [fnp.zeros_like(p) for p in self.params]
        self.v: list[Any] = [fnp.zeros_like(p) for p in self.params]

    def _update(self, index: int, param: Tensor, grad: Tensor) -> tuple[Tensor, list[Tensor]]:
        m = self.b1 * self.m[index] + (1 - self.b1) * grad
        v = self.b2 * self.v[index] + (1 - self.b2) * grad * grad
        self.m[index], self.v[index] = m, v
        m_hat = m / (1 - self.b1 ** self.steps)
        v_hat = v / (1 - self.b2 ** self.steps)
        update = m_hat / (fnp.sqrt(v_hat) + self.eps)
        if self.weight_decay:
            update = update + self.weight_decay * param
        return param - self.lr * update, [m, v]


def AdamW(params: Iterable[Tensor], lr: float = 0.001, b1: float = 0.9, b2: float = 0.999,  # noqa: N802
          eps: float = 1e-8, weight_decay: float = 0.01) -> Adam:
    """Adam with decoupled weight decay (the default 0.01, as PyTorch)."""
    return Adam(params, lr, b1, b2, eps, weight_decay)
