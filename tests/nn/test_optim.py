"""Seed-style autograd (backward, .grad, detach, train) and the stateful optimisers, against
hand-computed NumPy updates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

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


# --- every optimiser, functional and stateful, against NumPy float64 and torch.optim -----------------

_A = np.array([[1.0, 0.5, -0.3], [0.2, -1.2, 0.8], [0.4, 0.1, 0.9]])
_TARGET = np.array([0.3, -0.7, 1.1])
_START = np.array([[0.5, -1.0, 2.0], [0.25, 0.75, -1.5]])  # two "layers": the trust ratio is per parameter


def _loss_np(p):
    """sum over rows of ||A p - t||^2 + sum sin(p): its gradient, in float64."""
    return np.stack([2 * _A.T @ (_A @ row - _TARGET) + np.cos(row) for row in p])


def _loss_fg(p):
    residual = p @ Tensor(_A.T.astype(np.float32)) - Tensor(_TARGET.astype(np.float32))
    return fnp.sum(residual ** 2) + fnp.sum(fnp.sin(p))


def _numpy_reference(name, steps, lr, **hyper):
    """The textbook update rules in float64 (written from the papers / PyTorch's docs)."""
    p = _START.copy()
    m, v = np.zeros_like(p), np.zeros_like(p)
    b1, b2, eps, wd = hyper.get("b1", 0.9), hyper.get("b2", 0.999), hyper.get("eps"), hyper.get("weight_decay", 0.0)
    for t in range(1, steps + 1):
        g = _loss_np(p)
        rate = lr(t - 1) if callable(lr) else lr
        if name == "sgd":
            mu, nesterov = hyper.get("momentum", 0.0), hyper.get("nesterov", False)
            g = g + wd * p
            m = g if t == 1 else mu * m + g
            d = (g + mu * m if nesterov else m) if mu else g
            p = p - rate * d
            continue
        if name == "adam":
            g = g + wd * p
        m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
        d = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
        if name == "adamw":
            p = p * (1 - rate * wd)
        if name == "lamb":
            rows = []
            for row, d_row in zip(p, d + wd * p):
                r1, r2 = np.linalg.norm(row), np.linalg.norm(d_row)
                rows.append(row - rate * (r1 / r2 if r1 > 0 and r2 > 0 else 1.0) * d_row)
            p = np.stack(rows)
            continue
        p = p - rate * d
    return p


CONFIGS = [
    ("sgd", dict(lr=0.05)),
    ("sgd", dict(lr=0.05, momentum=0.9)),
    ("sgd", dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.1)),
    ("adam", dict(lr=0.1, eps=1e-8)),
    ("adam", dict(lr=0.1, b1=0.8, b2=0.99, eps=1e-6, weight_decay=0.05)),
    ("adamw", dict(lr=0.1, eps=1e-8, weight_decay=0.1)),
    ("lamb", dict(lr=0.1, eps=1e-6, weight_decay=0.01)),
    ("lamb", dict(lr=0.05, b1=0.5, b2=0.9, eps=1e-6)),
]
STATEFUL = {"sgd": nn.optim.SGD, "adam": nn.optim.Adam, "adamw": nn.optim.AdamW, "lamb": nn.optim.LAMB}


def _functional_run(name, steps=5, **kw):
    opt = getattr(nn.optim, name)(**kw)
    params = [Tensor(row.astype(np.float32)) for row in _START]
    state = opt.init(params)
    for _ in range(steps):
        grads = fg.grad(lambda ps: sum(_loss_fg(p) for p in ps))(params)
        params, state = opt.update(grads, state, params)
    assert state.steps.item() == steps
    return np.stack([p.numpy() for p in params])


def _stateful_run(name, steps=5, **kw):
    params = [Tensor(row.astype(np.float32)) for row in _START]
    opt = STATEFUL[name](params, **kw)
    for _ in range(steps):
        opt.zero_grad()
        sum(_loss_fg(p) for p in params).backward()
        opt.step()
    assert opt.steps == steps
    return np.stack([p.numpy() for p in params])


@pytest.mark.parametrize("name,kw", CONFIGS)
def test_functional_and_stateful_optimisers_match_numpy(name, kw):
    expected = _numpy_reference(name, 5, **kw)
    np.testing.assert_allclose(_functional_run(name, **kw), expected, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(_stateful_run(name, **kw), expected, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("name", ["sgd", "adam", "adamw", "lamb"])
@settings(max_examples=8, deadline=None)
@given(lr=st.floats(0.001, 0.1), b1=st.floats(0.0, 0.95), b2=st.floats(0.9, 0.9999), decay=st.floats(0.0, 0.1),
       nesterov=st.booleans())
def test_functional_optimisers_match_numpy_for_any_hyperparameters(name, lr, b1, b2, decay, nesterov):
    if name == "sgd":
        kw = dict(lr=lr, momentum=b1, nesterov=nesterov and b1 > 0, weight_decay=decay)
    else:
        kw = dict(lr=lr, b1=b1, b2=b2, eps=1e-6, weight_decay=decay)
    np.testing.assert_allclose(_functional_run(name, 3, **kw), _numpy_reference(name, 3, **kw), rtol=1e-4, atol=1e-5)


def _torch_run(name, steps=5, **kw):
    torch = pytest.importorskip("torch")
    params = [torch.tensor(row, dtype=torch.float64, requires_grad=True) for row in _START]
    lr = kw.pop("lr")
    if name == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=kw.get("momentum", 0.0), nesterov=kw.get("nesterov", False),
                              weight_decay=kw.get("weight_decay", 0.0))
    else:
        cls = torch.optim.Adam if name == "adam" else torch.optim.AdamW
        opt = cls(params, lr=lr, betas=(kw.get("b1", 0.9), kw.get("b2", 0.999)), eps=kw["eps"],
                  weight_decay=kw.get("weight_decay", 0.0))
    a, t = torch.tensor(_A), torch.tensor(_TARGET)
    for _ in range(steps):
        opt.zero_grad()
        sum(((a @ p - t) ** 2).sum() + torch.sin(p).sum() for p in params).backward()
        opt.step()
    return np.stack([p.detach().numpy() for p in params])


@pytest.mark.parametrize("name,kw", [c for c in CONFIGS if c[0] != "lamb"])  # torch has no LAMB
def test_optimisers_match_torch(name, kw):
    expected = _torch_run(name, **dict(kw))
    np.testing.assert_allclose(_functional_run(name, **kw), expected, rtol=2e-5, atol=2e-6)
    np.testing.assert_allclose(_stateful_run(name, **kw), expected, rtol=2e-5, atol=2e-6)


def test_functional_optimiser_over_a_nested_pytree_is_pure_and_jits_once():
    params = {"w": Tensor(np.ones((2, 2), np.float32)), "layers": [Tensor(np.full(3, 2.0, np.float32))]}
    opt = nn.optim.adam(0.1)
    state = opt.init(params)
    assert fg.tree.structure(state.slots[0]) == fg.tree.structure(params)
    loss = lambda p: fnp.sum(p["w"] ** 2) + fnp.sum(p["layers"][0] ** 3)

    @fg.jit
    def train_step(params, state):
        return opt.update(fg.grad(loss)(params), state, params)

    eager_params, eager_state = params, state
    for _ in range(4):
        params, state = train_step(params, state)
        eager_params, eager_state = opt.update(fg.grad(loss)(eager_params), eager_state, eager_params)
    assert train_step.trace_count == 1
    for got, expected in zip(fg.tree.leaves((params, state)), fg.tree.leaves((eager_params, eager_state))):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=1e-6)
    fresh = opt.init(params)
    assert fresh.steps.item() == 0 and all(not s.numpy().any() for s in fg.tree.leaves(fresh.slots))


def test_optimiser_bad_hyperparameters_and_state():
    with pytest.raises(ValueError, match="adam: b1 must be a number in \\[0, 1\\), got 1.5"):
        nn.optim.adam(0.1, b1=1.5)
    with pytest.raises(ValueError, match="SGD: lr must be a float >= 0 or a schedule"):
        nn.optim.SGD([Tensor([1.0])], lr=-1.0)
    with pytest.raises(ValueError, match="sgd: Nesterov"):
        nn.optim.sgd(0.1, nesterov=True)
    with pytest.raises(TypeError, match="LAMB: parameters must be floating point"):
        nn.optim.LAMB([Tensor([1, 2])])
    opt = nn.optim.sgd(0.1)
    params = [Tensor([1.0]), Tensor([2.0])]
    with pytest.raises(ValueError, match="grads have structure"):
        opt.update([Tensor([1.0])], opt.init(params), params)
    with pytest.raises(TypeError, match="state must be the OptState"):
        opt.update(params, {}, params)


def test_stateful_optimiser_is_a_pytree_of_its_tensors():
    w = Tensor([1.0, 2.0])
    opt = nn.optim.Adam([w], lr=0.1)
    leaves, treedef = fg.tree.flatten(opt)
    assert leaves[0] is w and leaves[-1] is opt.count and len(leaves) == 4  # param, m, v, count
    rebuilt = fg.tree.unflatten(treedef, leaves)
    assert type(rebuilt) is nn.optim.Adam and rebuilt.params[0] is w and rebuilt.m[0] is opt.m[0]
    other = nn.optim.Adam([Tensor([1.0, 2.0])], lr=0.2)
    assert fg.tree.structure(other) != treedef  # the learning rate is part of the structure: jit retraces


def test_parameters_without_grad_are_left_alone():
    a, b = Tensor([1.0]), Tensor([2.0])
    opt = nn.optim.SGD([a, b], lr=0.5, momentum=0.9)
    opt.zero_grad()
    (a * 3.0).sum().backward()
    opt.step()
    assert a.tolist() == [-0.5] and b.tolist() == [2.0] and opt.state[1][0].tolist() == [0.0]


# --- learning-rate schedules ------------------------------------------------------------------------

def _values(schedule, steps):
    eager = [float(schedule(s)) for s in steps]
    vectorised = schedule(fnp.asarray(np.array(steps, np.int32))).numpy()  # an array of steps, traceable
    jitted = [float(fg.jit(schedule)(np.int32(s))) for s in steps]
    np.testing.assert_allclose(vectorised, eager, rtol=1e-6)
    np.testing.assert_allclose(jitted, eager, rtol=1e-6)
    return eager


def test_schedules_match_hand_computed_values():
    o = nn.optim
    np.testing.assert_allclose(_values(o.constant(0.3), [0, 7]), [0.3, 0.3], rtol=1e-6)
    np.testing.assert_allclose(_values(o.exponential_decay(1.0, 0.5, 2), [0, 1, 2, 5]),
                               [1.0, 0.5 ** 0.5, 0.5, 0.5 ** 2.5], rtol=1e-6)
    np.testing.assert_allclose(_values(o.exponential_decay(1.0, 0.5, 2, staircase=True), [0, 1, 2, 5]),
                               [1.0, 1.0, 0.5, 0.25], rtol=1e-6)
    np.testing.assert_allclose(_values(o.step_decay(0.1, 3, 0.1), [0, 2, 3, 6]), [0.1, 0.1, 0.01, 0.001], rtol=1e-5)
    np.testing.assert_allclose(_values(o.piecewise_constant([2, 5], [1.0, 0.1, 0.01]), [0, 1, 2, 4, 5, 9]),
                               [1.0, 1.0, 0.1, 0.1, 0.01, 0.01], rtol=1e-6)
    np.testing.assert_allclose(_values(o.cosine_decay(2.0, 4, alpha=0.1), [0, 1, 2, 4, 9]),
                               [2.0, 0.2 + 1.8 * (1 + np.cos(np.pi / 4)) / 2, 1.1, 0.2, 0.2], rtol=1e-6)
    np.testing.assert_allclose(_values(o.warmup_cosine_decay(0.0, 1.0, 2, 6, end_value=0.2), [0, 1, 2, 4, 6, 8]),
                               [0.0, 0.5, 1.0, 0.6, 0.2, 0.2], rtol=1e-6, atol=1e-7)


def test_onecycle_matches_torch():
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.1)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=0.5, total_steps=20, pct_start=0.25)
    expected = []
    for _ in range(20):
        expected.append(opt.param_groups[0]["lr"])
        opt.step()
        scheduler.step()
    got = _values(nn.optim.onecycle(20, 0.5, pct_start=0.25), list(range(20)))
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_schedule_as_learning_rate_is_read_at_the_update_count():
    schedule = nn.optim.piecewise_constant([1], [1.0, 0.1])
    expected = _numpy_reference("sgd", 3, lr=lambda t: 1.0 if t < 1 else 0.1)
    np.testing.assert_allclose(_functional_run("sgd", 3, lr=schedule), expected, rtol=1e-5)
    np.testing.assert_allclose(_stateful_run("sgd", 3, lr=schedule), expected, rtol=1e-5)
    expected = _numpy_reference("adam", 3, lr=lambda t: 0.1 * 0.5 ** t, eps=1e-8)
    np.testing.assert_allclose(_stateful_run("adam", 3, lr=nn.optim.exponential_decay(0.1, 0.5, 1)), expected,
                               rtol=1e-5)


def test_schedule_bad_input():
    with pytest.raises(ValueError, match="one more value than boundaries"):
        nn.optim.piecewise_constant([1, 2], [0.1])
    with pytest.raises(ValueError, match="warmup_steps < decay_steps"):
        nn.optim.warmup_cosine_decay(0.0, 1.0, 5, 5)
    with pytest.raises(ValueError, match="transition_steps must be > 0"):
        nn.optim.exponential_decay(1.0, 0.5, 0)
