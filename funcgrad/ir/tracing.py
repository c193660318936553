"""The tracer: records primitive applications into an IR.

A trace is an ``IRBuilder`` on a global stack. While one is active, every primitive applied goes to
the innermost builder (JAX's "omnistaging"): the builder turns operands into atoms, appends an
equation, and hands back fresh ``Tracer`` handles for the outputs. Operands the builder does not
own are *lifted*:

* a NumPy scalar becomes an inline ``Literal``;
* any other foreign value (a concrete array, or a tracer of an enclosing, still-running trace)
  becomes a constant of this IR, bound to that value. When the finished IR is later evaluated inside
  the enclosing trace, the constant is that trace's value, so nesting composes.

A tracer whose trace has finished has *escaped*; using it raises ``EscapedTracerError`` naming
where it was created. This module knows nothing of Tensor: the array layer wraps Tracers.
"""

from __future__ import annotations

import contextlib
import os
import sysconfig
import threading
import traceback
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from funcgrad.ir.core import IR, Eqn, Literal, ShapedArray, Var
from funcgrad.ir.primitives import Primitive


class TracerError(TypeError):
    """Base of the errors about traced values (a ``TypeError`` subclass, as JAX's are)."""


class ConcretizationError(TracerError):
    """A traced value was used where a concrete Python value is needed."""


class EscapedTracerError(TracerError):
    """A traced value was used after the transformation that created it had finished."""


_STDLIB = os.path.normcase(sysconfig.get_paths()["stdlib"])


def _user_frame() -> str:
    """The innermost stack frame outside funcgrad and the standard library (contextlib, functools),
    as 'file:line (function)'."""
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        in_stdlib = os.path.normcase(frame.filename).startswith(_STDLIB) and "-packages/" not in path
        if "/funcgrad/" not in path and not in_stdlib:
            return f"{frame.filename}:{frame.lineno} ({frame.name})"
    return "<unknown>"


class Tracer:
    """A handle on a Var of a running trace."""

    __slots__ = ("builder", "var")

    def __init__(self, builder: IRBuilder, var: Var) -> None:
        self.builder = builder
        self.var = var

    @property
    def aval(self) -> ShapedArray:
        return self.var.aval


class IRBuilder:
    """Collects equations for one trace. ``label`` names the transformation for error messages."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.level = len(_stack())
        self.alive = True
        self.created_at = _user_frame()
        self.in_vars: list[Var] = []
        self.eqns: list[Eqn] = []
        self.const_vars: list[Var] = []
        self.consts: list[Any] = []
        self._const_index: dict[int, Var] = {}  # id(value) -> its const var
        self.input_names: dict[int, str] = {}  # var id -> the user's name for that input
        # var id -> the concrete value it stands for, or None for an abstract trace. grad, jvp and vjp
        # outside jit trace with the inputs' values known (as JAX's concrete JVP tracers), so Python
        # control flow on a traced value can ask for its value (see core.tensor.known_value)
        self.known: dict[int, Any] | None = None
        self.read_known = False  # whether the traced function asked for a known value (its IR depends on it)

    def inputs_behind(self, var: Var) -> list[str]:
        """Names of the inputs ``var`` depends on (for error messages)."""
        needed = {var.id}
        for eqn in reversed(self.eqns):
            if any(v.id in needed for v in eqn.outputs):
                needed.update(a.id for a in eqn.inputs if isinstance(a, Var))
        return [self.input_names.get(v.id, f"input {i}") for i, v in enumerate(self.in_vars) if v.id in needed]

    def new_input(self, aval: ShapedArray) -> Tracer:
        var = Var(aval)
        self.in_vars.append(var)
        return Tracer(self, var)

    def lift(self, value: Any, aval: ShapedArray, key: Any) -> Var:
        """The const var standing for a foreign ``value`` (deduplicated by ``key``)."""
        if key in self._const_index:
            return self._const_index[key]
        var = Var(aval)
        self._const_index[key] = var
        self.const_vars.append(var)
        self.consts.append(value)
        return var

    def atom(self, operand: Any) -> Var | Literal:
        """``operand``: a Tracer of this builder, a NumPy scalar, or (lifted by the caller) a Var."""
        if isinstance(operand, Tracer):
            if operand.builder is not self:
                raise AssertionError("tracers of other traces must be lifted by the caller")
            return operand.var
        if isinstance(operand, np.generic):
            return Literal.of(operand)
        raise TypeError(f"cannot use {type(operand).__name__} as an operand of a traced primitive")

    def add_eqn(self, primitive: Primitive, inputs: Sequence[Var | Literal], params: dict[str, Any],
                out_avals: Sequence[ShapedArray]) -> list[Tracer]:
        outputs = [Var(aval) for aval in out_avals]
        self.eqns.append(Eqn(primitive, tuple(inputs), params, tuple(outputs)))
        return [Tracer(self, v) for v in outputs]

    def build(self, outputs: Sequence[Var | Literal]) -> IR:
        return IR(self.in_vars, self.eqns, outputs, self.const_vars, self.consts)


_state = threading.local()


def _stack() -> list[IRBuilder]:
    if not hasattr(_state, "stack"):
        _state.stack = []
    stack: list[IRBuilder] = _state.stack
    return stack


def current_builder() -> IRBuilder | None:
    """The innermost running trace of this thread, or None when evaluating eagerly."""
    stack: list[IRBuilder] | None = getattr(_state, "stack", None)  # asked on every operation: no _stack() call
    return stack[-1] if stack else None


@contextlib.contextmanager
def new_trace(label: str) -> Iterator[IRBuilder]:
    """Run the body with a fresh builder on top of this thread's trace stack."""
    builder = IRBuilder(label)
    _stack().append(builder)
    try:
        yield builder
    finally:
        popped = _stack().pop()
        assert popped is builder, "trace stack corrupted"
        builder.alive = False


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Run the body as if no trace were running (binds go to the eager handler); the traces resume
    after it. Used to compute the value of a traced variable whose inputs are known."""
    stack = _stack()
    _state.stack = []
    try:
        yield
    finally:
        _state.stack = stack


def check_alive(tracer: Tracer) -> None:
    if not tracer.builder.alive:
        raise EscapedTracerError(
            f"a traced value of type {tracer.aval} escaped from the {tracer.builder.label} trace started "
            f"at {tracer.builder.created_at}, and was used after that trace finished. Return it from "
            "the transformed function instead of storing it (in a global, a list or self.attribute).")
