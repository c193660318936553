"""Lazy eager evaluation: primitives applied to concrete Tensors build a pending graph.

Nothing runs when an operation is applied outside a trace: the result is a ``LazyBuffer`` that
remembers the primitive and its sources. ``realize`` gathers the pending graph behind the buffers
asked for, turns it into an IR whose inputs are the already-realized buffers, and runs that IR
through a compiled plan on the buffers' device. Realized buffers forget their graph so memory is
freed as soon as no Tensor needs it.

This module is the core's eager handler: importing it registers ``LazyHandler`` with
``funcgrad.core.tensor`` (the core never imports it), so ``bind`` outside a trace lands here.

Placement: every buffer names its device. A buffer placed by the user (``Tensor(..., device=)``,
``Tensor.to``, ``fg.device_put``) is *committed*; one created without a device is not, and follows
the committed operands it meets (as in JAX). An operation on buffers committed to different
devices raises ``DeviceMismatchError``: values never move between devices unless asked. Realized
values are host NumPy arrays whatever the device; a device plan copies them in once per run.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import EagerHandler, register_eager_handler
from funcgrad.devices import Device, canonical_name, get_device
from funcgrad.ir.core import IR, Eqn, ShapedArray, Var
from funcgrad.ir.interpreter import eval_ir
from funcgrad.ir.primitives import Primitive
from funcgrad.nan_check import active_checks, carry_source


class DeviceMismatchError(ValueError):
    """Operands committed to different devices met in one operation."""

USE_COMPILER = True  # False: evaluate with the reference interpreter (the test oracle)


class LazyOp:
    """One pending primitive application; its outputs are held weakly to let them die (their avals,
    found when the op was applied, stay: realize does not evaluate the rule again)."""

    __slots__ = ("primitive", "params", "sources", "outputs", "out_avals")

    def __init__(self, primitive: Primitive, params: dict[str, Any], sources: Sequence[LazyBuffer],
                 out_avals: Sequence[ShapedArray]) -> None:
        self.primitive = primitive
        self.params = params
        self.sources = tuple(sources)
        self.outputs: list[weakref.ref[LazyBuffer]] = []
        self.out_avals = tuple(out_avals)


class LazyBuffer:
    """An array that is either realized (``array`` set) or pending (``op`` set)."""

    __slots__ = ("aval", "op", "array", "device", "committed", "__weakref__")

    def __init__(self, aval: ShapedArray, op: LazyOp | None = None, array: np.ndarray | None = None,
                 device: str | None = None, committed: bool = False) -> None:
        self.aval = aval
        self.op = op
        self.array = array
        self.device = Device.DEFAULT if device is None else device
        self.committed = committed

    @staticmethod
    def from_array(array: np.ndarray, device: str | None = None, committed: bool = False) -> LazyBuffer:
        array.flags.writeable = False  # Tensors are immutable; their buffers are shared freely
        return LazyBuffer(ShapedArray(array.shape, array.dtype), array=array, device=device, committed=committed)

    @staticmethod
    def pending(primitive: Primitive, params: dict[str, Any], sources: Sequence[LazyBuffer],
                out_avals: Sequence[ShapedArray]) -> list[LazyBuffer]:
        device, committed = placement(primitive.name, sources)
        op = LazyOp(primitive, params, sources, out_avals)
        outputs = [LazyBuffer(aval, op=op, device=device, committed=committed) for aval in out_avals]
        op.outputs = [weakref.ref(b) for b in outputs]
        return outputs

    @property
    def realized(self) -> bool:
        return self.array is not None


def placement(what: str, sources: Sequence[LazyBuffer]) -> tuple[str, bool]:
    """(device, committed) of a result of ``what`` applied to ``sources`` (see the module docstring)."""
    device, committed = None, False
    for source in sources:
        if source.committed:
            if committed and source.device != device:
                raise DeviceMismatchError(
                    f"{what}: operands are on different devices ({device} and {source.device}); funcgrad does not "
                    f"copy between devices silently: move one first, e.g. x.to({device!r}) or "
                    f"fg.device_put(x, {device!r})")
            device, committed = source.device, True
        elif device is None:
            device = source.device
    return (Device.DEFAULT if device is None else device), committed


def _pending_ops(targets: Sequence[LazyBuffer]) -> list[LazyOp]:
    """The pending ops behind ``targets`` in dependency order (iterative post-order DFS)."""
    order: list[LazyOp] = []
    visited: set[int] = set()
    stack: list[tuple[LazyOp, bool]] = [(b.op, False) for b in targets if b.op is not None]
    while stack:
        op, expanded = stack.pop()
        if expanded:
            order.append(op)
            continue
        if id(op) in visited:
            continue
        visited.add(id(op))
        stack.append((op, True))
        stack.extend((s.op, False) for s in op.sources if s.op is not None and id(s.op) not in visited)
    return order


def graph_to_ir(targets: Sequence[LazyBuffer]) -> tuple[IR, list[LazyBuffer]]:
    """The IR computing ``targets`` from realized buffers, and those buffers (its inputs)."""
    ops = _pending_ops(targets)
    var_of: dict[int, Var] = {}
    inputs: list[LazyBuffer] = []
    in_vars: list[Var] = []

    def var_for(buffer: LazyBuffer) -> Var:
        if id(buffer) not in var_of:
            assert buffer.realized, "pending buffer used before its op"
            var_of[id(buffer)] = Var(buffer.aval)
            inputs.append(buffer)
            in_vars.append(var_of[id(buffer)])
        return var_of[id(buffer)]

    eqns = []
    keep_alive = []  # output buffers of ops must outlive the id()s we key them by
    for op in ops:
        ins = [var_for(s) for s in op.sources]
        outs = [Var(aval) for aval in op.out_avals]
        for ref, var in zip(op.outputs, outs):
            buffer = ref()  # None when no Tensor holds this output any more
            if buffer is not None:
                keep_alive.append(buffer)
                var_of[id(buffer)] = var
                carry_source(buffer, var)  # debug_nans: the line that made the buffer
        eqns.append(Eqn(op.primitive, ins, op.params, outs))
    outputs = [var_for(t) if t.realized else var_of[id(t)] for t in targets]
    return IR(in_vars, eqns, outputs), inputs


def realize(targets: Sequence[LazyBuffer]) -> None:
    """Compute every pending buffer in ``targets`` and store its array (one plan per device)."""
    pending = [t for t in targets if not t.realized]
    if not pending:
        return
    by_device: dict[str, list[LazyBuffer]] = {}
    for target in pending:
        by_device.setdefault(target.device, []).append(target)
    for device, group in by_device.items():
        _realize_on(device, group)


def _realize_on(device: str, pending: list[LazyBuffer]) -> None:
    pending = [t for t in pending if not t.realized]  # an earlier group may have computed some
    if not pending:
        return
    op = pending[0].op
    if (USE_COMPILER and op is not None and op.primitive.name == "jit" and all(t.op is op for t in pending)
            and all(s.realized for s in op.sources)):
        _realize_jit_call(op, device)  # the common case of a jit call on computed arguments: no graph to build
        return
    if USE_COMPILER and all(_is_fill(t) for t in pending) and not active_checks():
        for t in pending:  # zeros/full made eagerly (optimizer state, initial values): no kernel to compile
            source = None if t.op is None else t.op.sources[0].array  # None: listed twice, filled already
            if source is not None:
                t.array = np.full(t.aval.shape, source.reshape(()), dtype=t.aval.dtype)
                t.array.flags.writeable = False
                t.op = None
        return
    ir, inputs = graph_to_ir(pending)
    arrays = [b.array for b in inputs if b.array is not None]
    if USE_COMPILER:
        from funcgrad.devices import get_device
        from funcgrad.lower import run_ir
        results = run_ir(ir, arrays, get_device(device))
    else:
        results = eval_ir(ir, arrays)
    for buffer, array in zip(pending, results):
        buffer.array = np.asarray(array)
        buffer.array.flags.writeable = False
        buffer.op = None


def _is_fill(buffer: LazyBuffer) -> bool:
    """Is ``buffer`` pending as one computed value broadcast (``full``, ``zeros``)?"""
    op = buffer.op
    if op is None or op.primitive.name != "broadcast_in_dim" or len(op.sources) != 1:
        return False
    source = op.sources[0].array
    return source is not None and source.size == 1 and source.dtype == buffer.aval.dtype


def _realize_jit_call(op: LazyOp, device: str) -> None:
    """Run one jit call whose arguments are computed, with the plan cached for its IR object."""
    from funcgrad.devices import get_device
    from funcgrad.lower import run_jit
    results = run_jit(op.params["ir"], [s.array for s in op.sources if s.array is not None], get_device(device))
    for ref, array in zip(op.outputs, results):
        buffer = ref()
        if buffer is not None:
            buffer.array = np.asarray(array)
            buffer.array.flags.writeable = False
            buffer.op = None


def _usable_device(device: Any) -> str:
    """The canonical name of ``device`` (a name, or a device object), after checking it can run here."""
    name = canonical_name(device if isinstance(device, str) else getattr(device, "name", device))
    get_device(name)  # raises DeviceUnavailableError listing the usable devices and the reason
    return name


def _moved(buffer: LazyBuffer, device: str) -> LazyBuffer:
    """``buffer``'s value on ``device``, committed there (computed first if pending)."""
    realize([buffer])
    assert buffer.array is not None
    return LazyBuffer(buffer.aval, array=buffer.array, device=device, committed=True)


def _default_device() -> str:
    return Device.DEFAULT


class LazyHandler(EagerHandler):
    """The core's eager handler (see ``funcgrad.core.tensor.EagerHandler``): the functions above,
    as static methods so that ``bind`` calls them with no layer in between."""

    # (the core hands back only buffers this handler made: LazyBuffers, narrower than its Buffer)
    from_array = staticmethod(LazyBuffer.from_array)
    pending = staticmethod(LazyBuffer.pending)  # type: ignore[assignment]
    realize = staticmethod(realize)  # type: ignore[assignment]
    default_device = staticmethod(_default_device)
    usable_device = staticmethod(_usable_device)
    move = staticmethod(_moved)  # type: ignore[assignment]


register_eager_handler(LazyHandler())
