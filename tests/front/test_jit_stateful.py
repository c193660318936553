"""Stateful training steps under jit: ``loss.backward()`` inside a trace, and jit's write-back of
the Tensors a call replaced (optimiser parameters and state, ``.grad``, batch-norm buffers), with
nn layers and with a module-like pytree class of the test's own."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
import funcgrad.random as fr
from funcgrad import Tensor, nn


class TinyLinear:
    """A module-like pytree (its Tensor attributes are its leaves), independent of funcgrad.nn."""

    def __init__(self, weight, bias):
        self.weight, self.bias = Tensor(weight), Tensor(bias)

    def __call__(self, x):
        return fnp.tanh(x @ self.weight + self.bias)

    def __funcgrad_flatten__(self):
        return [self.weight, self.bias], None

    @classmethod
    def __funcgrad_unflatten__(cls, aux, children):
        module = cls.__new__(cls)
        module.weight, module.bias = children
        return module


class RunningMean(TinyLinear):
    """TinyLinear that also tracks a running mean of its input, swapped in place like batch norm."""

    def __init__(self, weight, bias):
        super().__init__(weight, bias)
        self.running = Tensor(np.zeros(weight.shape[0], np.float32))

    def __call__(self, x):
        self.running._data = (0.9 * self.running + 0.1 * x.mean(axis=0))._data
        return super().__call__(x)

    def __funcgrad_flatten__(self):
        return [self.weight, self.bias, self.running], None

    @classmethod
    def __funcgrad_unflatten__(cls, aux, children):
        module = cls.__new__(cls)
        module.weight, module.bias, module.running = children
        return module


rng = np.random.default_rng(0)
W, B = rng.standard_normal((3, 2)).astype(np.float32), rng.standard_normal(2).astype(np.float32)
X, Y = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((5, 2)).astype(np.float32)


def loss_fn(prediction, target):
    return ((fnp.sin(prediction) - target) ** 2).mean()


def stateful_step(model, opt, x, y):
    opt.zero_grad()
    loss = loss_fn(model(x), y)
    loss.backward()
    opt.step()
    return loss


OPTIMISERS = {
    "sgd": (lambda ps: nn.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True), nn.optim.sgd(0.1, 0.9, True)),
    "adam": (lambda ps: nn.optim.Adam(ps, lr=0.05), nn.optim.adam(0.05)),
    "adamw": (lambda ps: nn.optim.AdamW(ps, lr=0.05, weight_decay=0.1), nn.optim.adamw(0.05, weight_decay=0.1)),
    "lamb": (lambda ps: nn.optim.LAMB(ps, lr=0.05, weight_decay=0.01), nn.optim.lamb(0.05, weight_decay=0.01)),
}


def _linear():
    """An nn.Linear holding W.T and B, so the loops below start from the same weights."""
    model = nn.Linear(3, 2)
    model.weight, model.bias = Tensor(W.T.copy()), Tensor(B)
    return model


def _stateful(name, jitted, steps=5):
    model = _linear()
    opt = OPTIMISERS[name][0](model.parameters())
    step = fg.jit(stateful_step) if jitted else stateful_step
    losses = [step(model, opt, Tensor(X), Tensor(Y)).item() for _ in range(steps)]
    if jitted:
        assert step.trace_count == 1  # the step count is an array: no retrace per step
    return losses, [model.weight.numpy(), model.bias.numpy()]


def _functional(name, jitted, steps=5):
    opt = OPTIMISERS[name][1]
    params = _linear()
    state = opt.init(params)

    def step(params, state, x, y):
        loss, grads = fg.value_and_grad(lambda p: loss_fn(p(x), y))(params)
        params, state = opt.update(grads, state, params)
        return loss, params, state

    step = fg.jit(step) if jitted else step
    losses = []
    for _ in range(steps):
        loss, params, state = step(params, state, Tensor(X), Tensor(Y))
        losses.append(loss.item())
    return losses, [params.weight.numpy(), params.bias.numpy()]


@pytest.mark.parametrize("name", sorted(OPTIMISERS))
def test_functional_and_stateful_loops_agree_eager_and_jitted(name):
    reference_losses, reference = _stateful(name, jitted=False)
    for run, jitted in ((_stateful, True), (_functional, False), (_functional, True)):
        losses, params = run(name, jitted)
        np.testing.assert_allclose(losses, reference_losses, rtol=1e-6, atol=1e-7)
        for got, expected in zip(params, reference):
            np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-7)
    assert reference_losses[-1] < reference_losses[0]


def test_write_back_keeps_identity_and_grads_hold_concrete_values():
    eager_model, jit_model = TinyLinear(W, B), TinyLinear(W, B)
    eager_opt = nn.optim.Adam([eager_model.weight, eager_model.bias], lr=0.05)
    jit_opt = nn.optim.Adam([jit_model.weight, jit_model.bias], lr=0.05)
    weight, m, count = jit_model.weight, jit_opt.m[0], jit_opt.count
    step = fg.jit(stateful_step)
    for _ in range(3):
        stateful_step(eager_model, eager_opt, Tensor(X), Tensor(Y))
        step(jit_model, jit_opt, Tensor(X), Tensor(Y))
    assert jit_model.weight is weight and jit_opt.params[0] is weight  # same objects, new values
    assert jit_opt.m[0] is m and jit_opt.count is count and jit_opt.steps == 3
    for name in ("weight", "bias"):
        got = getattr(jit_model, name)
        assert not got.is_traced and not got.grad.is_traced
        np.testing.assert_allclose(got.grad.numpy(), getattr(eager_model, name).grad.numpy(), rtol=1e-6)
    np.testing.assert_allclose(jit_opt.v[1].numpy(), eager_opt.v[1].numpy(), rtol=1e-6)


def test_grads_reset_inside_the_step_are_reset_by_the_call():
    model = TinyLinear(W, B)
    opt = nn.optim.SGD([model.weight, model.bias], lr=0.1)
    reset = fg.jit(lambda model, opt: opt.zero_grad())
    reset(model, opt)  # traced while the grads are None: resetting them changes nothing yet
    loss_fn(model(Tensor(X)), Tensor(Y)).backward()
    assert model.weight.grad is not None
    reset(model, opt)
    assert model.weight.grad is None and model.bias.grad is None and reset.trace_count == 1
    loss_fn(model(Tensor(X)), Tensor(Y)).backward()
    forward = fg.jit(lambda model, x: model(x))
    forward(model, Tensor(X))
    assert model.weight.grad is not None  # a function that does not touch .grad leaves it alone


def test_buffer_swapped_in_a_jitted_forward_is_written_back():
    eager, jitted = RunningMean(W, B), RunningMean(W, B)
    forward = fg.jit(lambda model, x: model(x))
    for i in range(3):
        x = Tensor(X * (i + 1))
        np.testing.assert_allclose(forward(jitted, x).numpy(), eager(x).numpy(), rtol=1e-6)
    np.testing.assert_allclose(jitted.running.numpy(), eager.running.numpy(), rtol=1e-6)
    assert forward.trace_count == 1


def test_pure_function_of_a_module_has_no_extra_outputs():
    model = TinyLinear(W, B)
    forward = fg.jit(lambda model, x: model(x))
    lowered = forward.lower(model, Tensor(X))
    assert len(lowered.ir.outputs) == 1 and lowered.write_back is None
    np.testing.assert_allclose(forward(model, Tensor(X)).numpy(), np.tanh(X @ W + B), rtol=1e-5)
    assert model.weight.numpy().tolist() == W.tolist()


def test_lowered_and_compiled_step_writes_back():
    model = TinyLinear(W, B)
    opt = nn.optim.SGD([model.weight, model.bias], lr=0.1)
    eager_model = TinyLinear(W, B)
    eager_opt = nn.optim.SGD([eager_model.weight, eager_model.bias], lr=0.1)
    compiled = fg.jit(stateful_step).lower(model, opt, Tensor(X), Tensor(Y)).compile()
    for _ in range(2):
        compiled(model, opt, Tensor(X), Tensor(Y))
        stateful_step(eager_model, eager_opt, Tensor(X), Tensor(Y))
    np.testing.assert_allclose(model.weight.numpy(), eager_model.weight.numpy(), rtol=1e-6)


def test_two_updates_in_one_jitted_call_differentiate_the_new_values():
    def two_steps(model, opt, x, y):
        return stateful_step(model, opt, x, y), stateful_step(model, opt, x, y)

    eager_model, jit_model = TinyLinear(W, B), TinyLinear(W, B)
    eager_opt = nn.optim.SGD([eager_model.weight, eager_model.bias], lr=0.2, momentum=0.5)
    jit_opt = nn.optim.SGD([jit_model.weight, jit_model.bias], lr=0.2, momentum=0.5)
    expected = [loss.item() for loss in two_steps(eager_model, eager_opt, Tensor(X), Tensor(Y))]
    got = [loss.item() for loss in fg.jit(two_steps)(jit_model, jit_opt, Tensor(X), Tensor(Y))]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    np.testing.assert_allclose(jit_model.weight.numpy(), eager_model.weight.numpy(), rtol=1e-6)


def test_traced_backward_matches_grad():
    w = Tensor(W, requires_grad=True)

    @fg.jit
    def grad_via_backward(w, x):
        w.grad = None
        (fnp.sin(x @ w) ** 2).sum().backward(gradient=None)
        return w.grad

    expected = fg.grad(lambda v: (fnp.sin(Tensor(X) @ v) ** 2).sum())(Tensor(W))
    np.testing.assert_allclose(grad_via_backward(w, Tensor(X)).numpy(), expected.numpy(), rtol=1e-5)
    np.testing.assert_allclose(w.grad.numpy(), expected.numpy(), rtol=1e-5)  # written back, as eagerly


def test_backward_reading_a_grad_from_before_the_call_raises():
    model = TinyLinear(W, B)
    opt = nn.optim.SGD([model.weight, model.bias], lr=0.1)
    loss_fn(model(Tensor(X)), Tensor(Y)).backward()  # .grad set outside, then accumulated into inside

    def no_zero_grad(model, opt, x, y):
        loss_fn(model(x), y).backward()
        opt.step()

    with pytest.raises(RuntimeError, match="zero_grad\\(\\) before backward\\(\\)"):
        fg.jit(no_zero_grad)(model, opt, Tensor(X), Tensor(Y))
    assert not model.weight.is_traced and not model.weight.grad.is_traced  # restored after the error
    np.testing.assert_array_equal(model.weight.numpy(), W)


def test_traced_backward_errors():
    closed_over = Tensor(W, requires_grad=True)
    with pytest.raises(RuntimeError, match="pass the model and optimiser as arguments"):
        fg.jit(lambda x: (x @ closed_over).sum().backward())(Tensor(X))
    w = Tensor(W, requires_grad=True)
    with pytest.raises(ValueError, match="scalar loss"):
        fg.jit(lambda w: (w * 2).backward())(w)


def test_tracers_escaping_by_other_routes_still_raise():
    model = TinyLinear(W, B)

    def stores_a_new_attribute(model, x):
        model.cache = model(x)  # a new attribute, not a swapped value: not written back
        return model.cache.sum()

    fg.jit(stores_a_new_attribute)(model, Tensor(X))
    with pytest.raises(fg.EscapedTracerError):
        model.cache + 1
    np.testing.assert_array_equal(model.weight.numpy(), W)  # the arguments themselves are restored


def test_nn_linear_and_batchnorm_train_step_under_jit():
    def make():
        Tensor.manual_seed(0)
        model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 2))
        return model, nn.optim.Adam(model.parameters(), lr=0.05)

    def step(model, opt, x, y):
        with Tensor.train():
            return stateful_step(model, opt, x, y)

    (eager_model, eager_opt), (jit_model, jit_opt) = make(), make()
    jitted = fg.jit(step)
    for _ in range(3):
        expected = step(eager_model, eager_opt, Tensor(X), Tensor(Y)).item()
        np.testing.assert_allclose(jitted(jit_model, jit_opt, Tensor(X), Tensor(Y)).item(), expected, rtol=1e-5)
    assert jitted.trace_count == 1
    for got, want in zip(fg.tree.leaves(jit_model), fg.tree.leaves(eager_model)):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-6)
    running_mean, running_var, batches = jit_model.buffers()
    assert batches.item() == 3 and np.abs(running_mean.numpy()).sum() > 0  # the buffers were written back
    np.testing.assert_allclose(running_var.numpy(), eager_model.buffers()[1].numpy(), rtol=1e-5)


def test_scheduled_learning_rate_in_a_jitted_step_traces_once():
    schedule = nn.optim.warmup_cosine_decay(0.0, 0.2, warmup_steps=2, decay_steps=5)
    results = []
    for jitted in (False, True):
        model = _linear()
        opt = nn.optim.SGD(model.parameters(), lr=schedule, momentum=0.9)
        step = fg.jit(stateful_step) if jitted else stateful_step
        losses = [step(model, opt, Tensor(X), Tensor(Y)).item() for _ in range(5)]
        results.append((losses, model.weight.numpy()))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=1e-6)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=1e-6)
    assert results[0][0][0] == results[0][0][1]  # lr 0 at step 0: the first update changes nothing
    assert step.trace_count == 1


# --- randomness from the global state inside jit --------------------------------------------------

def test_jitted_rand_draws_new_numbers_each_call_like_eager():
    """Tensor.rand inside jit takes its key from the global state on every call (not once at trace
    time), and the sequence of draws is the eager one."""
    def noisy(x):
        return x + Tensor.rand(4)

    x = Tensor(np.zeros(4, np.float32))
    Tensor.manual_seed(3)
    eager = [noisy(x).numpy() for _ in range(3)]
    Tensor.manual_seed(3)
    jitted_fn = fg.jit(noisy)
    jitted = [jitted_fn(x).numpy() for _ in range(3)]
    assert jitted_fn.trace_count == 1
    assert not np.array_equal(jitted[0], jitted[1]) and not np.array_equal(jitted[1], jitted[2])
    for a, b in zip(eager, jitted):
        np.testing.assert_allclose(a, b, rtol=1e-6)


def test_dropout_in_a_jitted_training_step_draws_a_new_mask_each_step():
    from funcgrad import nn

    class Net(nn.Module):
        def __init__(self):
            self.linear = nn.Linear(8, 8)
            self.drop = nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(self.linear(x))

    model = Net()
    model.train()
    x = Tensor(np.ones((4, 8), np.float32))
    step = fg.jit(lambda m, x: m(x))
    masks = [(step(model, x).numpy() == 0) for _ in range(3)]
    assert step.trace_count == 1
    assert not np.array_equal(masks[0], masks[1]) and not np.array_equal(masks[1], masks[2])
    for mask in masks:
        assert 0.2 < mask.mean() < 0.8  # about half dropped


def test_explicit_keys_inside_jit_are_untouched():
    """A key passed as an argument is the caller's: jit must not replace it."""
    f = fg.jit(lambda key: fr.uniform(key, (3,)))
    key = fr.key(0)
    np.testing.assert_array_equal(f(key).numpy(), f(key).numpy())
