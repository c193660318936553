"""Seed-style autograd (backward, .grad, detach, train) and the stateful optimisers, against
hand-computed NumPy updates."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, nn


def test_backward_accumulates_and_matches_grad():
    w = Tensor(np.array([0.5, -1.0, 2.0], np.float32), requires_grad=True)
    x = Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    loss = (fnp.tanh(w * x) ** 2).sum()
    loss.backward()
    expected = fg.grad(lambda v: (fnp.tanh(v * x) ** 2).sum())(Tensor(w.numpy())).numpy()
    np.testing.assert_allclose(w.grad.numpy(), expected, rtol=1e-6)
    (w * 3.0).sum().backward()  # gradients accumulate, as in PyTorch
    np.testing.assert_allclose(w.grad.numpy(), expected + 3.0, rtol=1e-6)
    assert x.grad is None


def test_backward_errors():
    w = Tensor([1.0, 2.0], requires_grad=True)
    loss = (w * w).sum()
    loss.item()
    with pytest.raises(RuntimeError, match="call backward\\(\\) first"):
        loss.backward()
    with pytest.raises(ValueError, match="scalar loss"):
        (w * 2).backward()
    with pytest.raises(RuntimeError, match="requires_grad=True"):
        (Tensor([1.0]) * 2).sum().backward()


def test_detach_cuts_the_gradient():
    w = Tensor([3.0], requires_grad=True)
    (w * w.detach()).sum().backward()
    assert w.grad.tolist() == [3.0]


def test_training_flag():
    assert Tensor.training is False
    with Tensor.train():
        assert Tensor.training is True
        with Tensor.train(False):
            assert Tensor.training is False
    assert Tensor.training is False


def _run(optimizer_factory, steps=3):
    w = Tensor(np.array([1.0, -2.0], np.float32), requires_grad=True)
    opt = optimizer_factory([w])
    for _ in range(steps):
        opt.zero_grad()
        (w * w * np.array([1.0, 3.0], np.float32)).sum().backward()  # grad = 2 * c * w
        opt.step()
    return w.numpy()


def _grad(w):
    return 2 * np.array([1.0, 3.0]) * w


def test_sgd_with_momentum_and_nesterov_matches_numpy():
    for momentum, nesterov, decay in ((0.0, False, 0.0), (0.9, False, 0.0), (0.9, True, 0.1)):
        w, velocity = np.array([1.0, -2.0]), None
        for _ in range(3):
            g = _grad(w) + decay * w
            velocity = g if velocity is None else momentum * velocity + g
            direction = (g + momentum * velocity if nesterov else velocity) if momentum else g
            w = w - 0.1 * direction
        got = _run(lambda p, m=momentum, n=nesterov, d=decay: nn.optim.SGD(p, lr=0.1, momentum=m, nesterov=n,
                                                                            weight_decay=d))
        np.testing.assert_allclose(got, w, rtol=1e-5)


def test_adam_and_adamw_match_numpy():
    for decay in (0.0, 0.01):
        w, m, v = np.array([1.0, -2.0]), np.zeros(2), np.zeros(2)
        for t in range(1, 4):
            g = _grad(w)
            m, v = 0.9 * m + 0.1 * g, 0.999 * v + 0.001 * g * g
            update = (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8) + decay * w
            w = w - 0.05 * update
        factory = (lambda p: nn.optim.Adam(p, lr=0.05)) if decay == 0 else (lambda p: nn.optim.AdamW(p, lr=0.05))
        np.testing.assert_allclose(_run(factory), w, rtol=1e-5)


def test_optimizer_bad_input():
    with pytest.raises(ValueError, match="at least one parameter"):
        nn.optim.SGD([], lr=0.1)
    with pytest.raises(TypeError, match="must be Tensors"):
        nn.optim.SGD([np.ones(2)], lr=0.1)
    with pytest.raises(ValueError, match="Nesterov"):
        nn.optim.SGD([Tensor([1.0])], lr=0.1, nesterov=True)
