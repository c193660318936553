"""Seed-style (PyTorch/tinygrad) autograd on lazy Tensors: ``loss.backward()`` and ``.grad``.

There is no tape: the pending lazy graph behind ``loss`` already records every operation. On
``backward()`` the graph is turned into an IR whose inputs are the realized buffers it reads, and
reverse mode runs on that IR with the transforms' own rules (``funcgrad.vjp``), differentiating
with respect to the inputs that belong to Tensors with ``requires_grad=True``. So
``backward()`` must come before the loss's value is read: reading it computes (and forgets) the
graph.

Inside a trace (a jitted training step) the loss is a tracer: ``backward()`` then slices the
running trace's equations from the traced ``requires_grad`` Tensors to the loss into a sub-IR,
differentiates that with ``vjp`` and records the gradients into the same trace.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

import funcgrad.numpy as fnp
from funcgrad.core.tensor import Tensor, bind, evaluate, grad_leaves
from funcgrad.ir import dtypes
from funcgrad.ir.core import IR, Literal, Var
from funcgrad.ir.tracing import IRBuilder, Tracer, check_alive, current_builder
from funcgrad.lazy import LazyBuffer, graph_to_ir, realize

_training = threading.local()  # .mode, per thread (as PyTorch's grad mode): threads' train() blocks never mix


@contextlib.contextmanager
def train(mode: bool = True) -> Iterator[None]:
    """``with Tensor.train():`` sets ``Tensor.training`` (read by dropout and batch norm) in this thread."""
    previous = is_training()
    _training.mode = mode
    try:
        yield
    finally:
        _training.mode = previous


def is_training() -> bool:
    return bool(getattr(_training, "mode", False))


_grad_writes: list[set[int]] = []  # one set per running jit trace: ids of Tensors whose .grad was assigned


def set_grad(tensor: Tensor, value: Tensor | None) -> None:
    """Assign ``tensor.grad``, noting it for jit's write-back (so a reset to None counts even when
    the value was already None while tracing). ``backward()`` and ``zero_grad()`` assign through it."""
    tensor.grad = value
    for writes in _grad_writes:
        writes.add(id(tensor))


@contextlib.contextmanager
def recording_grad_writes() -> Iterator[set[int]]:
    """Collect the ids of the Tensors whose ``.grad`` ``set_grad`` assigns inside the block."""
    writes: set[int] = set()
    _grad_writes.append(writes)
    try:
        yield writes
    finally:
        _grad_writes.remove(writes)


def backward(loss: Tensor, gradient: Any = None) -> Tensor:
    """Accumulate d loss / d leaf into ``leaf.grad`` for every Tensor with ``requires_grad=True``
    that ``loss`` depends on. ``gradient`` defaults to 1 (``loss`` must then be a scalar)."""
    from funcgrad.transforms.ad import vjp
    data = loss._data
    if gradient is None and loss.shape != ():
        raise ValueError(f"backward() without a gradient needs a scalar loss, got shape {loss.shape}")
    if isinstance(data, Tracer):
        return _traced_backward(loss, data, gradient)
    assert isinstance(data, LazyBuffer)  # outside a trace every value is funcgrad.lazy's
    if data.realized:
        raise RuntimeError("backward() needs the computation that produced this Tensor, but its value was "
                           "already computed (by .item(), .numpy(), print, ...), which discards it; call "
                           "backward() first")
    leaves = {id(t._data): t for t in grad_leaves() if t.requires_grad}
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
        set_grad(leaf, grad if leaf.grad is None else leaf.grad + grad)
    return loss


def _traced_backward(loss: Tensor, data: Tracer, gradient: Any) -> Tensor:
    """``backward()`` of a traced loss: differentiate the slice of the running trace between the
    traced ``requires_grad`` leaves and the loss, recording the gradients into that trace."""
    from funcgrad.transforms.ad import vjp
    check_alive(data)
    builder = data.builder
    if builder is not current_builder():
        raise RuntimeError(f"backward() on a value of the {builder.label} trace while an inner trace runs; "
                           "call backward() in the function that computed the loss")
    leaves: dict[int, Tensor] = {}  # var id -> leaf; one leaf per var (the first Tensor holding it)
    for t in grad_leaves():
        leaf_data = t._data
        if (t.requires_grad and isinstance(leaf_data, Tracer) and leaf_data.builder is builder
                and dtypes.is_float(leaf_data.aval.dtype)):
            leaves.setdefault(leaf_data.var.id, t)
    sub_ir, wrt, free = _slice(builder, [leaves[i]._data.var for i in leaves], data.var)  # type: ignore[union-attr]
    if not wrt:
        raise RuntimeError("backward(): no Tensor this value depends on has requires_grad=True (inside jit, "
                           "pass the model and optimiser as arguments so their Tensors are traced; inside "
                           "fg.grad, use what fg.grad returns)")
    free_values = [Tensor._wrap(Tracer(builder, v)) for v in free]

    def from_leaves(*values: Tensor) -> Any:
        return evaluate(sub_ir, *values, *free_values)[0]

    _, pullback = vjp(from_leaves, *(Tensor._wrap(Tracer(builder, v)) for v in wrt))
    seed = np.ones((), loss.dtype)[()] if gradient is None else gradient
    for var, grad in zip(wrt, pullback(seed)):
        leaf = leaves[var.id]
        set_grad(leaf, grad if leaf.grad is None else leaf.grad + grad)
    return loss


def _slice(builder: IRBuilder, leaf_vars: list[Var], target: Var) -> tuple[IR, list[Var], list[Var]]:
    """The equations of ``builder`` on a path from ``leaf_vars`` to ``target``, as an IR taking
    (the leaves it uses, then every other value it reads) and returning ``target``."""
    leaf_ids = {v.id for v in leaf_vars}
    depends = set(leaf_ids)
    on_path = []
    for eqn in builder.eqns:  # forward: which values depend on a leaf (leaves cut the graph, as in PyTorch)
        if any(isinstance(a, Var) and a.id in depends for a in eqn.inputs) and \
                not any(v.id in leaf_ids for v in eqn.outputs):
            depends.update(v.id for v in eqn.outputs)
            on_path.append(eqn)
    needed, kept = {target.id}, []
    for eqn in reversed(on_path):  # backward: which of those the target needs
        if any(v.id in needed for v in eqn.outputs):
            kept.append(eqn)
            needed.update(a.id for a in eqn.inputs if isinstance(a, Var))
    kept.reverse()
    wrt = [v for v in leaf_vars if v.id in needed]
    defined = {v.id for v in wrt} | {v.id for eqn in kept for v in eqn.outputs}
    free: dict[int, Var] = {}
    for eqn in kept:
        for a in eqn.inputs:
            if isinstance(a, Var) and a.id not in defined:
                free.setdefault(a.id, a)
    if target.id not in defined:  # the loss does not depend on a leaf
        return IR(wrt, [], [target]), [], []
    return IR(wrt + list(free.values()), kept, [target]), wrt, list(free.values())


def gradients(loss: Tensor, targets: tuple[Tensor, ...], gradient: Any = None) -> list[Tensor]:
    """tinygrad's ``loss.gradient(*targets)``: d loss / d target for each target, any Tensor that
    ``loss`` was computed from (a leaf or an intermediate), with no ``.grad`` written. ``gradient``
    seeds a non-scalar loss (1 for a scalar)."""
    from funcgrad.transforms.ad import vjp
    if not targets:
        raise TypeError("gradient() needs at least one target Tensor: loss.gradient(x, y)")
    for i, target in enumerate(targets):
        if not isinstance(target, Tensor) or not dtypes.is_float(target.dtype):
            what = type(target).__name__ if not isinstance(target, Tensor) else f"dtype {target.dtype.name}"
            raise TypeError(f"gradient(): target {i} must be a floating-point Tensor, got {what}")
    if gradient is None and loss.shape != ():
        raise ValueError(f"gradient() without gradient= needs a scalar Tensor, got shape {loss.shape}")
    seed = np.ones((), loss.dtype)[()] if gradient is None else gradient
    data = loss._data
    if isinstance(data, Tracer):
        check_alive(data)
        builder = data.builder
        target_data = [t._data for t in targets]
        if any(not isinstance(d, Tracer) or d.builder is not builder for d in target_data):
            raise RuntimeError(f"gradient(): the targets must be values of the same trace ({builder.label}) as "
                               "the Tensor being differentiated")
        target_vars = [d.var for d in target_data]  # type: ignore[union-attr]
        unique = list({v.id: v for v in target_vars}.values())
        cone, needed = _cone(builder, unique, data.var)
        _check_used(targets, [v.id in needed for v in target_vars])
        cone_inputs = [Tensor._wrap(Tracer(builder, v)) for v in cone.in_vars]

        def traced(*bumps: Tensor) -> Any:
            return _evaluate_bumped(cone, cone_inputs, {v.id: b for v, b in zip(unique, bumps)})

        zeros = [fnp.zeros(v.aval.shape, dtype=v.aval.dtype) for v in unique]
        _, pullback = vjp(traced, *zeros)
        by_var = {v.id: g for v, g in zip(unique, pullback(seed))}
        return [by_var[v.id] for v in target_vars]
    assert isinstance(data, LazyBuffer)
    buffers = [t._data for t in targets]
    if any(not isinstance(b, LazyBuffer) for b in buffers):
        raise RuntimeError("gradient(): a traced target cannot be a source of a concrete Tensor")
    if data.realized:
        raise RuntimeError("gradient() needs the computation that produced this Tensor, but its value was already "
                           "computed (by .item(), .numpy(), print, ...), which discards it; call gradient() first")
    ir, inputs = graph_to_ir([data, *buffers])  # type: ignore[list-item]
    loss_var, target_vars = ir.outputs[0], [v for v in ir.outputs[1:] if isinstance(v, Var)]
    assert isinstance(loss_var, Var) and len(target_vars) == len(targets)  # pending buffers are never literals
    _check_used(targets, [v.id in _needed_by(ir, loss_var) for v in target_vars])
    unique = list({v.id: v for v in target_vars}.values())
    arguments = [Tensor._wrap(b) for b in inputs]

    def perturbed(*bumps: Tensor) -> Any:
        """The loss with a zero ``bump`` added to each target where it is made: d loss / d bump is the
        total derivative w.r.t. that target, also when one target is computed from another."""
        return _evaluate_bumped(ir, arguments, {v.id: b for v, b in zip(unique, bumps)})

    zeros = [Tensor(np.zeros(v.aval.shape, v.aval.dtype), dtype=v.aval.dtype) for v in unique]
    _, pullback = vjp(perturbed, *zeros)
    by_var = {v.id: g for v, g in zip(unique, pullback(seed))}
    return [by_var[v.id] for v in target_vars]


def _cone(builder: IRBuilder, target_vars: list[Var], loss: Var) -> tuple[IR, set[int]]:
    """The equations of ``builder`` on a path from any target to ``loss`` (targets computed from
    other targets included, unlike ``_slice``), as an IR of the values they read; and the ids of
    the values ``loss`` needs along those paths."""
    depends = {v.id for v in target_vars}
    on_path = []
    for eqn in builder.eqns:
        if any(isinstance(a, Var) and a.id in depends for a in eqn.inputs):
            depends.update(v.id for v in eqn.outputs)
            on_path.append(eqn)
    needed, kept = {loss.id}, []
    for eqn in reversed(on_path):
        if any(v.id in needed for v in eqn.outputs):
            kept.append(eqn)
            needed.update(a.id for a in eqn.inputs if isinstance(a, Var))
    kept.reverse()
    defined = {v.id for eqn in kept for v in eqn.outputs}
    reads: dict[int, Var] = {v.id: v for v in target_vars if v.id not in defined and v.id in needed}
    for eqn in kept:
        for a in eqn.inputs:
            if isinstance(a, Var) and a.id not in defined:
                reads.setdefault(a.id, a)
    if loss.id not in defined:
        reads.setdefault(loss.id, loss)
    return IR(list(reads.values()), kept, [loss]), needed


def _needed_by(ir: IR, output: Var) -> set[int]:
    """The ids of the vars ``output`` depends on in ``ir`` (itself included)."""
    needed = {output.id}
    for eqn in reversed(ir.eqns):
        if any(v.id in needed for v in eqn.outputs):
            needed.update(a.id for a in eqn.inputs if isinstance(a, Var))
    return needed


def _evaluate_bumped(ir: IR, arguments: list[Tensor], bumps: dict[int, Tensor]) -> Any:
    """``ir``'s first output, binding its equations with ``bumps[var]`` added to those vars."""
    env: dict[int, Any] = {}

    def store(var: Var, value: Any) -> None:
        env[var.id] = value + bumps[var.id] if var.id in bumps else value

    for var, value in zip(ir.in_vars, arguments):
        store(var, value)
    for eqn in ir.eqns:
        ins = [a.value if isinstance(a, Literal) else env[a.id] for a in eqn.inputs]
        outs = bind(eqn.primitive, *ins, **eqn.param_dict)
        for var, value in zip(eqn.outputs, outs if eqn.primitive.multiple_results else (outs,)):
            store(var, value)
    output = ir.outputs[0]
    return output.value if isinstance(output, Literal) else env[output.id]


def _check_used(targets: tuple[Tensor, ...], used: list[bool]) -> None:
    for i, (target, is_used) in enumerate(zip(targets, used)):
        if not is_used:
            raise RuntimeError(f"gradient(): target {i} (shape {target.shape}) was not used to compute this Tensor")
