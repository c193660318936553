"""Optimisers in two forms that share one implementation of the update math, and learning-rate schedules.

* Functional (optax-like, pure, usable inside ``fg.jit``): ``opt = optim.adam(1e-3)``,
  ``state = opt.init(params)``, ``params, state = opt.update(grads, state, params)`` over any pytree.
  The state is a pytree of arrays, with the step count an int32 array, so a jitted step traces once.
* Stateful (seed/PyTorch style): ``opt = optim.Adam([w, b], lr=1e-3)``; ``opt.zero_grad();
  loss.backward(); opt.step()``. ``step()`` swaps each parameter's new value into the same Tensor
  object (models keep their references) and does the same with the optimiser's state Tensors, then
  realizes them together, so graphs never grow across steps. An optimiser is a pytree (leaves: its
  parameters, state and step count), so a step that updates it in place can be jitted: jit writes
  the swapped values back (see ``funcgrad.jit_runtime``).

Each algorithm is a ``Rule``: ``init(param) -> slots`` and ``apply(param, grad, slots, lr, step) ->
(new_param, new_slots)`` for one parameter; both forms call it. ``lr`` is a float or a schedule
``step -> lr`` (see the schedules below), evaluated at the number of updates done so far.

>>> opt = SGD([w], lr=0.1); opt.zero_grad(); loss.backward(); opt.step()   # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

import funcgrad.numpy as fnp
from funcgrad.autograd import set_grad
from funcgrad.core.tensor import Tensor
from funcgrad.ir import dtypes
from funcgrad.lazy import LazyBuffer, realize
from funcgrad.util import tree

Schedule = Callable[[Any], Tensor]
LearningRate = float | Schedule


# --- the update math of each algorithm, for one parameter ---------------------------------------

def _bias_correction(beta: float, step: Tensor) -> Any:
    """``1 - beta ** step`` without float32 cancellation (``-expm1(step * log(beta))``)."""
    if beta == 0:
        return 1.0
    return -fnp.expm1(step * math.log(beta))


@dataclasses.dataclass(frozen=True)
class SGDRule:
    """SGD with PyTorch's momentum (``v = momentum * v + g``, no dampening), Nesterov momentum and L2
    weight decay (added to the gradient)."""

    momentum: float = 0.0
    nesterov: bool = False
    weight_decay: float = 0.0

    def init(self, param: Tensor) -> tuple[Tensor, ...]:
        return (fnp.zeros_like(param),) if self.momentum else ()

    def apply(self, param: Tensor, grad: Tensor, slots: Sequence[Tensor], lr: Any,
              step: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        if self.weight_decay:
            grad = grad + self.weight_decay * param
        if not self.momentum:
            return param - lr * grad, ()
        velocity = self.momentum * slots[0] + grad  # PyTorch starts from v = g: the same as from v = 0
        direction = grad + self.momentum * velocity if self.nesterov else velocity
        return param - lr * direction, (velocity,)


@dataclasses.dataclass(frozen=True)
class AdamRule:
    """Adam (Kingma & Ba). ``decoupled=False``: PyTorch Adam's L2 weight decay (added to the
    gradient); ``decoupled=True``: AdamW's (``param * (1 - lr * weight_decay)``)."""

    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0
    decoupled: bool = False

    def init(self, param: Tensor) -> tuple[Tensor, ...]:
        return fnp.zeros_like(param), fnp.zeros_like(param)

    def moments(self, grad: Tensor, slots: Sequence[Tensor], step: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The new first and second moments and the bias-corrected update direction."""
        m = self.b1 * slots[0] + (1 - self.b1) * grad
        v = self.b2 * slots[1] + (1 - self.b2) * (grad * grad)
        m_hat = m / _bias_correction(self.b1, step)
        v_hat = v / _bias_correction(self.b2, step)
        return m, v, m_hat / (fnp.sqrt(v_hat) + self.eps)

    def apply(self, param: Tensor, grad: Tensor, slots: Sequence[Tensor], lr: Any,
              step: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        if self.weight_decay and not self.decoupled:
            grad = grad + self.weight_decay * param
        m, v, direction = self.moments(grad, slots, step)
        if self.weight_decay and self.decoupled:
            direction = direction + self.weight_decay * param
        return param - lr * direction, (m, v)


@dataclasses.dataclass(frozen=True)
class LAMBRule:
    """LAMB (You et al. 2019): the Adam direction plus decoupled weight decay, scaled per parameter
    by the trust ratio ``||param|| / ||direction||`` (1 where either norm is 0)."""

    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-6
    weight_decay: float = 0.0

    def init(self, param: Tensor) -> tuple[Tensor, ...]:
        return fnp.zeros_like(param), fnp.zeros_like(param)

    def apply(self, param: Tensor, grad: Tensor, slots: Sequence[Tensor], lr: Any,
              step: Tensor) -> tuple[Tensor, tuple[Tensor, ...]]:
        m, v, direction = AdamRule(self.b1, self.b2, self.eps).moments(grad, slots, step)
        if self.weight_decay:
            direction = direction + self.weight_decay * param
        param_norm = fnp.sqrt(fnp.sum(param * param))
        direction_norm = fnp.sqrt(fnp.sum(direction * direction))
        usable = (param_norm > 0) & (direction_norm > 0)
        trust = fnp.where(usable, param_norm / fnp.where(usable, direction_norm, 1.0), 1.0)
        return param - (lr * trust) * direction, (m, v)


Rule = SGDRule | AdamRule | LAMBRule


def _check_hyperparameters(name: str, lr: Any, **values: float) -> None:
    if not callable(lr) and not (isinstance(lr, (int, float)) and lr >= 0):
        raise ValueError(f"{name}: lr must be a float >= 0 or a schedule (step -> lr), got {lr!r}")
    for key, value in values.items():
        low, high = (0.0, 1.0) if key in ("b1", "b2") else (0.0, math.inf)
        if not isinstance(value, (int, float)) or not low <= value < high:
            bounds = "in [0, 1)" if key in ("b1", "b2") else ">= 0"
            raise ValueError(f"{name}: {key} must be a number {bounds}, got {value!r}")


def _shape_of(value: Any) -> tuple[int, ...]:
    return tuple(value.shape) if hasattr(value, "shape") else np.shape(value)


def _learning_rate(lr: LearningRate, count: Tensor) -> Any:
    return lr(count) if callable(lr) else lr


# --- functional form ------------------------------------------------------------------------------

class OptState(NamedTuple):
    """A functional optimiser's state: ``steps``, the number of updates done (int32), and one pytree per
    slot (SGD momentum: ``(velocity,)``; Adam/LAMB: ``(m, v)``), each shaped like the parameters."""

    steps: Tensor
    slots: tuple[Any, ...]


class FunctionalOptimizer:
    """``init(params) -> state`` and ``update(grads, state, params) -> (new_params, new_state)``: pure
    functions over pytrees of arrays, usable inside ``fg.jit``, ``fg.grad`` and ``fg.vmap``."""

    def __init__(self, name: str, rule: Rule, lr: LearningRate) -> None:
        self.name, self.rule, self.lr = name, rule, lr

    def __repr__(self) -> str:
        return f"optim.{self.name}(lr={self.lr!r}, {self.rule})"

    def init(self, params: Any) -> OptState:
        leaves, treedef = tree.flatten(params)
        per_leaf = [self.rule.init(fnp.asarray(p)) for p in leaves]
        slot_count = len(self.rule.init(fnp.zeros(())))
        slots = tuple(tree.unflatten(treedef, [s[k] for s in per_leaf]) for k in range(slot_count))
        return OptState(fnp.zeros((), dtype=dtypes.int32), slots)

    def update(self, grads: Any, state: OptState, params: Any) -> tuple[Any, OptState]:
        param_leaves, treedef = tree.flatten(params)
        grad_leaves, grad_def = tree.flatten(grads)
        if grad_def != treedef:
            raise ValueError(f"optim.{self.name}.update: grads have structure {grad_def} but params have {treedef}")
        if not isinstance(state, OptState):
            raise TypeError(f"optim.{self.name}.update: state must be the OptState from init(), "
                            f"got {type(state).__name__}")
        param_shapes = [_shape_of(p) for p in param_leaves]
        for i, (g, shape) in enumerate(zip(grad_leaves, param_shapes)):
            if _shape_of(g) != shape:
                raise ValueError(f"optim.{self.name}.update: gradient {i} has shape {_shape_of(g)} but its "
                                 f"parameter has shape {shape}")
        slot_leaves = [tree.leaves(s) for s in state.slots]
        if any([_shape_of(x) for x in s] != param_shapes for s in slot_leaves):
            raise ValueError(f"optim.{self.name}.update: the state was made by init() for other params "
                             "(a different number of leaves or other shapes); call init(params) again")
        lr = _learning_rate(self.lr, state.steps)
        step = (state.steps + 1).astype(dtypes.float32)
        new_params, new_slots = [], []
        for i, (p, g) in enumerate(zip(param_leaves, grad_leaves)):
            p = fnp.asarray(p)
            new_p, slots = self.rule.apply(p, fnp.asarray(g).astype(p.dtype), [s[i] for s in slot_leaves], lr, step)
            new_params.append(new_p.astype(p.dtype))
            new_slots.append(slots)
        slots_out = tuple(tree.unflatten(treedef, [s[k] for s in new_slots]) for k in range(len(state.slots)))
        return tree.unflatten(treedef, new_params), OptState(state.steps + 1, slots_out)


def sgd(lr: LearningRate, momentum: float = 0.0, nesterov: bool = False,
        weight_decay: float = 0.0) -> FunctionalOptimizer:
    """Functional SGD. >>> opt = sgd(0.1, momentum=0.9); state = opt.init(params)  # doctest: +SKIP"""
    _check_hyperparameters("sgd", lr, momentum=momentum, weight_decay=weight_decay)
    if nesterov and momentum <= 0:
        raise ValueError("sgd: Nesterov momentum needs momentum > 0")
    return FunctionalOptimizer("sgd", SGDRule(momentum, nesterov, weight_decay), lr)


def adam(lr: LearningRate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
         weight_decay: float = 0.0) -> FunctionalOptimizer:
    """Functional Adam; ``weight_decay`` is L2 (added to the gradient), as PyTorch's Adam."""
    _check_hyperparameters("adam", lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    return FunctionalOptimizer("adam", AdamRule(b1, b2, eps, weight_decay, decoupled=False), lr)


def adamw(lr: LearningRate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
          weight_decay: float = 0.01) -> FunctionalOptimizer:
    """Functional AdamW: Adam with decoupled weight decay (default 0.01, as PyTorch)."""
    _check_hyperparameters("adamw", lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    return FunctionalOptimizer("adamw", AdamRule(b1, b2, eps, weight_decay, decoupled=True), lr)


def lamb(lr: LearningRate, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
         weight_decay: float = 0.0) -> FunctionalOptimizer:
    """Functional LAMB (layer-wise adaptive Adam)."""
    _check_hyperparameters("lamb", lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
    return FunctionalOptimizer("lamb", LAMBRule(b1, b2, eps, weight_decay), lr)


# --- stateful form --------------------------------------------------------------------------------

class Optimizer:
    """Holds the parameters (Tensors with ``requires_grad``), their state Tensors, the step count
    and a ``Rule``. A pytree: its leaves are the parameters, the state and the step count."""

    params: list[Tensor]
    state: list[tuple[Tensor, ...]]
    count: Tensor
    lr: LearningRate
    rule: Rule

    def __init__(self, params: Iterable[Tensor], lr: LearningRate, rule: Rule) -> None:
        name = type(self).__name__
        if isinstance(params, Tensor):  # iterating it would give row copies, which no update would reach
            raise TypeError(f"{name}: params must be a list of Tensors, got a single Tensor; pass [tensor] or "
                            "nn.state.get_parameters(model)")
        self.params = list(params)
        if not self.params:
            raise ValueError(f"{name}: an optimizer needs at least one parameter")
        for p in self.params:
            if not isinstance(p, Tensor):
                raise TypeError(f"{name}: optimizer parameters must be Tensors, got {type(p).__name__}")
            if not dtypes.is_float(p.dtype):
                raise TypeError(f"{name}: parameters must be floating point, got one of dtype {p.dtype.name}")
            if p.requires_grad is None:
                p.requires_grad = True  # as tinygrad: handing a Tensor to an optimizer makes it trainable
        self.lr, self.rule = lr, rule
        self.state = [rule.init(p) for p in self.params]
        self.count = fnp.zeros((), dtype=dtypes.int32)

    def __repr__(self) -> str:
        values = sum(p.size for p in self.params)
        steps = "traced" if self.count.is_traced else str(self.steps)
        return (f"{type(self).__name__}({len(self.params)} parameters, {values} values, lr={self.lr!r}, "
                f"steps={steps}, {self.rule})")

    @property
    def steps(self) -> int:
        """How many times ``step()`` ran."""
        return int(self.count.item())

    def zero_grad(self) -> None:
        for p in self.params:
            set_grad(p, None)

    def step(self) -> None:
        """Update every parameter that has a ``.grad`` in place (the Tensor objects stay)."""
        lr = _learning_rate(self.lr, self.count)
        step = (self.count + 1).astype(dtypes.float32)
        for p, slots in zip(self.params, self.state):
            if p.grad is None:
                continue
            if p.grad.shape != p.shape:
                raise ValueError(f"{type(self).__name__}.step: a parameter of shape {p.shape} has a .grad of shape "
                                 f"{p.grad.shape}")
            new_value, new_slots = self.rule.apply(p, p.grad.astype(p.dtype), slots, lr, step)
            p._data = new_value.astype(p.dtype)._data  # swap the value in; the Tensor object stays
            for slot, new in zip(slots, new_slots):
                slot._data = new._data
        self.count._data = (self.count + 1)._data
        leaves = self.params + [s for slots in self.state for s in slots] + [self.count]
        # outside traces, compute everything now in one go; inside jit the values are tracers
        realize([t._data for t in leaves if isinstance(t._data, LazyBuffer)])

    def __funcgrad_flatten__(self) -> tuple[list[Any], Any]:
        return [self.params, self.state, self.count], (self.lr, self.rule)

    @classmethod
    def __funcgrad_unflatten__(cls, aux: Any, children: Sequence[Any]) -> Optimizer:
        opt = cls.__new__(cls)
        opt.params, opt.state, opt.count = list(children[0]), [tuple(s) for s in children[1]], children[2]
        opt.lr, opt.rule = aux
        return opt


class SGD(Optimizer):
    """Stochastic gradient descent with optional momentum (PyTorch's form), Nesterov momentum and
    L2 weight decay."""

    def __init__(self, params: Iterable[Tensor], lr: LearningRate = 0.001, momentum: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        _check_hyperparameters("SGD", lr, momentum=momentum, weight_decay=weight_decay)
        if nesterov and momentum <= 0:
            raise ValueError("SGD: Nesterov momentum needs momentum > 0")
        super().__init__(params, lr, SGDRule(momentum, nesterov, weight_decay))


class Adam(Optimizer):
    """Adam (Kingma & Ba); ``weight_decay`` is L2 (added to the gradient), as PyTorch's Adam."""

    def __init__(self, params: Iterable[Tensor], lr: LearningRate = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.0) -> None:
        _check_hyperparameters(type(self).__name__, lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
        super().__init__(params, lr, AdamRule(b1, b2, eps, weight_decay, decoupled=isinstance(self, AdamW)))

    @property
    def m(self) -> list[Tensor]:
        """The first-moment Tensors, one per parameter."""
        return [slots[0] for slots in self.state]

    @property
    def v(self) -> list[Tensor]:
        """The second-moment Tensors, one per parameter."""
        return [slots[1] for slots in self.state]


class AdamW(Adam):
    """Adam with decoupled weight decay (the default 0.01, as PyTorch)."""

    def __init__(self, params: Iterable[Tensor], lr: LearningRate = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-8, weight_decay: float = 0.01) -> None:
        super().__init__(params, lr, b1, b2, eps, weight_decay)


class LAMB(Optimizer):
    """LAMB (You et al. 2019): Adam with decoupled weight decay and a per-parameter trust ratio."""

    def __init__(self, params: Iterable[Tensor], lr: LearningRate = 0.001, b1: float = 0.9, b2: float = 0.999,
                 eps: float = 1e-6, weight_decay: float = 0.0) -> None:
        _check_hyperparameters("LAMB", lr, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay)
        super().__init__(params, lr, LAMBRule(b1, b2, eps, weight_decay))


# --- learning-rate schedules: step (int or int array) -> float32 learning rate -----------------------

def _step_float(step: Any) -> Tensor:
    return fnp.asarray(step).astype(dtypes.float32)


def _cosine_between(start: float, end: float, fraction: Any) -> Any:
    """From ``start`` (fraction 0) to ``end`` (fraction 1) along half a cosine."""
    return end + (start - end) * 0.5 * (1 + fnp.cos(np.pi * fraction))


def constant(value: float) -> Schedule:
    """``lr = value`` at every step."""
    return lambda step: fnp.full(fnp.asarray(step).shape, value, dtype=dtypes.float32)


def exponential_decay(init_value: float, decay_rate: float, transition_steps: int,
                      staircase: bool = False) -> Schedule:
    """``init_value * decay_rate ** (step / transition_steps)`` (the exponent floored when
    ``staircase``), as optax. ``transition_steps=1`` is PyTorch's ExponentialLR."""
    if transition_steps <= 0:
        raise ValueError(f"exponential_decay: transition_steps must be > 0, got {transition_steps}")

    def schedule(step: Any) -> Tensor:
        exponent = _step_float(step) / transition_steps
        return init_value * fnp.power(np.float32(decay_rate), fnp.floor(exponent) if staircase else exponent)
    return schedule


def piecewise_constant(boundaries: Sequence[int], values: Sequence[float]) -> Schedule:
    """``values[i]`` from step ``boundaries[i-1]`` on (``values[0]`` before the first boundary).

    >>> piecewise_constant([10, 20], [0.1, 0.01, 0.001])(15)   # 0.01
    """
    if len(values) != len(boundaries) + 1:
        raise ValueError(f"piecewise_constant: needs one more value than boundaries, got {len(boundaries)} "
                         f"boundaries and {len(values)} values")
    if list(boundaries) != sorted(boundaries):
        raise ValueError(f"piecewise_constant: boundaries must be increasing, got {list(boundaries)}")

    def schedule(step: Any) -> Tensor:
        lr = fnp.full(fnp.asarray(step).shape, values[0], dtype=dtypes.float32)
        for boundary, value in zip(boundaries, values[1:]):
            lr = fnp.where(fnp.asarray(step) >= boundary, np.float32(value), lr)
        return lr
    return schedule


def step_decay(init_value: float, step_size: int, gamma: float = 0.1) -> Schedule:
    """``init_value * gamma ** (step // step_size)`` (PyTorch's StepLR)."""
    if step_size <= 0:
        raise ValueError(f"step_decay: step_size must be > 0, got {step_size}")
    return exponential_decay(init_value, gamma, step_size, staircase=True)


def cosine_decay(init_value: float, decay_steps: int, alpha: float = 0.0) -> Schedule:
    """Half a cosine from ``init_value`` to ``alpha * init_value`` over ``decay_steps``, then flat
    (PyTorch's CosineAnnealingLR with ``eta_min = alpha * init_value`` up to ``T_max``)."""
    if decay_steps <= 0:
        raise ValueError(f"cosine_decay: decay_steps must be > 0, got {decay_steps}")
    return lambda step: _cosine_between(init_value, alpha * init_value,
                                        fnp.minimum(_step_float(step), decay_steps) / decay_steps)


def warmup_cosine_decay(init_value: float, peak_value: float, warmup_steps: int, decay_steps: int,
                        end_value: float = 0.0) -> Schedule:
    """Linear from ``init_value`` to ``peak_value`` over ``warmup_steps``, then half a cosine down to
    ``end_value`` at step ``decay_steps`` (which counts the warmup, as optax), then flat."""
    if not 0 <= warmup_steps < decay_steps:
        raise ValueError(f"warmup_cosine_decay: needs 0 <= warmup_steps < decay_steps, got {warmup_steps} "
                         f"and {decay_steps}")

    def schedule(step: Any) -> Tensor:
        t = _step_float(step)
        warm = init_value + (peak_value - init_value) * t / max(warmup_steps, 1)
        fraction = fnp.clip((t - warmup_steps) / (decay_steps - warmup_steps), 0.0, 1.0)
        return fnp.where(t < warmup_steps, warm, _cosine_between(peak_value, end_value, fraction))
    return schedule


def onecycle(total_steps: int, peak_value: float, pct_start: float = 0.3, div_factor: float = 25.0,
             final_div_factor: float = 1e4) -> Schedule:
    """PyTorch's OneCycleLR (two phases, cosine): from ``peak_value / div_factor`` up to
    ``peak_value`` at step ``pct_start * total_steps - 1``, then down to
    ``peak_value / div_factor / final_div_factor`` at step ``total_steps - 1``."""
    if total_steps < 2 or not 0 < pct_start < 1:
        raise ValueError(f"onecycle: needs total_steps >= 2 and 0 < pct_start < 1, got {total_steps} and {pct_start}")
    initial = peak_value / div_factor
    final = initial / final_div_factor
    up_end, down_end = pct_start * total_steps - 1, total_steps - 1
    if not 0 < up_end < down_end:
        raise ValueError(f"onecycle: pct_start * total_steps = {pct_start * total_steps} leaves no room for a phase")

    def schedule(step: Any) -> Tensor:
        t = _step_float(step)
        rising = _cosine_between(initial, peak_value, fnp.clip(t / up_end, 0.0, 1.0))
        falling = _cosine_between(peak_value, final, fnp.clip((t - up_end) / (down_end - up_end), 0.0, 1.0))
        return fnp.where(t <= up_end, rising, falling)
    return schedule
