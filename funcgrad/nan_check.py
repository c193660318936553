"""``debug_nans`` / ``debug_infs``: find the primitive and the user's line that first made a NaN (or inf).

Two halves, both idle unless ``fg.config.debug_nans`` (``FUNCGRAD_DEBUG_NANS=1``) or ``debug_infs`` is on:

* **Where each value was written.** ``bind`` calls ``record_sources`` for its outputs (this module
  registers it with the core, ``register_source_recorder``, when imported): the user's
  ``file:line`` (the innermost frame outside funcgrad and the standard library), kept in a weak side
  table keyed by the output ``Var`` (traced) or ``LazyBuffer`` (eager), so IRs compare as before.
  An equation that a transformation writes (jvp, transpose, vmap, re-evaluation) inherits the line
  of the equation it was derived from: the transform interpreters name the equation they are
  working on ``eqn``, and the frame walk takes the innermost such local. ``carry_source`` follows a
  value when lowering renames it (lazy graph -> IR, inlining a jit call).
* **Checking.** After every step of a plan, ``check_step`` looks for a NaN (inf) in the step's
  float outputs that was not in its inputs. A fused kernel holds many equations: they are re-run
  one at a time with the reference implementations on the step's inputs, and the first equation
  whose output has the NaN while its inputs had none is named in the ``FloatingPointError``.
"""

from __future__ import annotations

import contextlib
import linecache
import os
import sys
import sysconfig
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from funcgrad.core.tensor import register_source_recorder
from funcgrad.ir import dtypes
from funcgrad.ir.core import IR, Eqn, Literal, Var
from funcgrad.lower import hooks
from funcgrad.util.config import config, nonfinite_checks

_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep
_STDLIB = os.path.normcase(sysconfig.get_paths()["stdlib"]) + os.sep


@attrs.frozen
class Source:
    """Where an equation came from: the user's line, and the primitive it was derived from (a
    transformation's equation, e.g. the ``div`` of ``log``'s derivative). ``filename`` is None
    when the line is unknown."""

    filename: str | None
    lineno: int = 0
    function: str = ""
    derived_from: str | None = None

    def describe(self) -> str:
        """'at file:line (in function):' and the line's code, or why the line is unknown."""
        if self.filename is None:
            where = ("at a line unknown: it was traced or recorded before debug_nans was turned on (a jit "
                     "function is not retraced: turn the option on before its first call)")
        else:
            code = linecache.getline(self.filename, self.lineno).strip()
            where = f"at {self.filename}:{self.lineno} (in {self.function})" + (f":\n    {code}" if code else "")
        if self.derived_from is None:
            return where
        return f"from a transformation (e.g. the derivative) of `{self.derived_from}` {where}"


_SOURCES: weakref.WeakKeyDictionary[Any, Source] = weakref.WeakKeyDictionary()


def _is_library(filename: str) -> bool:
    if filename.startswith(_PACKAGE):
        return True
    normalised = os.path.normcase(filename)
    return normalised.startswith(_STDLIB) and "-packages" not in normalised


def _caller_source() -> Source | None:
    """The user's line that is binding a primitive now, or the source of the equation a
    transformation is rewriting (its interpreter's local ``eqn``), whichever frame is innermost."""
    frame = sys._getframe(2)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not _is_library(filename):
            return Source(filename, frame.f_lineno, frame.f_code.co_name)
        if filename.startswith(_PACKAGE) and "eqn" in frame.f_code.co_varnames:
            eqn = frame.f_locals.get("eqn")
            if isinstance(eqn, Eqn):
                known = source_of(eqn)
                if known is None:
                    return Source(None, derived_from=eqn.primitive.name)
                return known if known.derived_from else attrs.evolve(known, derived_from=eqn.primitive.name)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def record_sources(outputs: Sequence[Any]) -> None:
    """Remember where ``outputs`` (Tracers or LazyBuffers just made by ``bind``) were computed."""
    source = _caller_source()
    if source is None:
        return
    for output in outputs:
        _SOURCES[getattr(output, "var", output)] = source  # a Tracer's Var, or the LazyBuffer itself


register_source_recorder(record_sources)


def carry_source(old: Any, new: Any) -> None:
    """``new`` (a Var) stands for ``old`` (a Var or LazyBuffer) from now on: it keeps its source."""
    if len(_SOURCES):
        source = _SOURCES.get(old)
        if source is not None:
            _SOURCES[new] = source


def source_of(eqn: Eqn) -> Source | None:
    for var in eqn.outputs:
        source = _SOURCES.get(var)
        if source is not None:
            return source
    return None


def debug_nans(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """``with fg.debug_nans():`` checks every step of the block for new NaNs (as ``jax.debug_nans``)."""
    return config.override(debug_nans=enabled)


def debug_infs(enabled: bool = True) -> contextlib.AbstractContextManager[None]:
    """``with fg.debug_infs():`` checks every step of the block for new infs."""
    return config.override(debug_infs=enabled)


# --- checking steps ----------------------------------------------------------------------------------

def active_checks() -> tuple[str, ...]:
    """``("NaN",)``, ``("inf",)``, both, or ``()`` when neither option is on (read once per plan run)."""
    return nonfinite_checks()


def _has(kind: str, values: Sequence[np.ndarray]) -> bool:
    test = np.isnan if kind == "NaN" else np.isinf
    for value in values:
        if dtypes.is_float(value.dtype) and value.size:
            as_float = value if value.dtype.kind == "f" else value.astype(np.float32)  # bfloat16
            if test(as_float).any():
                return True
    return False


def _step_equations(ir: IR, inputs: Sequence[Var], outputs: Sequence[Var]) -> list[Eqn] | None:
    """The equations of ``ir`` that compute ``outputs`` from ``inputs`` (one fused kernel), in
    program order; None when a value is not produced in ``ir`` (a lowering pass made it)."""
    producer = ir.producers()
    boundary = {v.id for v in inputs}
    chosen: dict[int, Eqn] = {}
    stack = list(outputs)
    while stack:
        var = stack.pop()
        if var.id in boundary:
            continue
        eqn = producer.get(var.id)
        if eqn is None:
            return None
        if id(eqn) in chosen:
            continue
        chosen[id(eqn)] = eqn
        stack.extend(a for a in eqn.inputs if isinstance(a, Var))
    return [e for e in ir.eqns if id(e) in chosen]


def _first_culprit(kind: str, eqns: Sequence[Eqn], env: dict[int, np.ndarray]) -> Eqn | None:
    """Re-run ``eqns`` with the reference implementations; the first whose output has ``kind``
    while its inputs have none."""
    def read(atom: Any) -> np.ndarray:
        return np.asarray(atom.value) if isinstance(atom, Literal) else env[atom.id]

    with np.errstate(all="ignore"):
        for eqn in eqns:
            ins = [read(a) for a in eqn.inputs]
            outs = eqn.primitive.impl(*ins, **eqn.param_dict)
            outs = [np.asarray(o) for o in (outs if eqn.primitive.multiple_results else (outs,))]
            for var, value in zip(eqn.outputs, outs):
                env[var.id] = value
            if _has(kind, outs) and not _has(kind, ins):
                return eqn
    return None


_A = {"NaN": "a", "inf": "an"}


def check_step(ir: IR, step: Any, read: Callable[[Var], np.ndarray], checks: Sequence[str]) -> None:
    """Raise ``FloatingPointError`` if ``step`` (a KernelStep or HostStep of a plan for ``ir``) made
    a NaN/inf that its inputs did not have, naming the primitive and its source line."""
    host_eqn: Eqn | None = getattr(step, "eqn", None)
    if host_eqn is not None:
        inputs = [a for a in host_eqn.inputs if isinstance(a, Var)]
        outputs: Sequence[Var] = host_eqn.outputs
        label = f"host step {host_eqn.primitive.name}"
    else:
        inputs, outputs, label = list(step.inputs), step.outputs, f"kernel {step.kernel.name}"
    out_values = [read(v) for v in outputs]
    for kind in checks:
        if not _has(kind, out_values):
            continue
        in_values = {v.id: read(v) for v in inputs}
        if _has(kind, list(in_values.values())):
            return  # it came in with the inputs: from the caller's data, or already reported
        eqns = [host_eqn] if host_eqn is not None else _step_equations(ir, inputs, outputs)
        culprit = _first_culprit(kind, eqns, dict(in_values)) if eqns is not None else None
        if culprit is None:
            detail = ("" if eqns is None else " The reference interpreter computes none there from the same inputs: "
                      "the compiled kernel differs from it (rounding, or a low-precision dtype computed in float32).")
            names = "" if eqns is None else " (equations: " + ", ".join(e.primitive.name for e in eqns) + ")"
            raise FloatingPointError(f"debug_{kind.lower()}s: {label}{names} produced {_A[kind]} {kind}.{detail}")
        source = source_of(culprit) or Source(None)
        if source.derived_from == culprit.primitive.name:  # vmap's log of log: the same operation
            source = attrs.evolve(source, derived_from=None)
        raise FloatingPointError(
            f"debug_{kind.lower()}s: `{culprit.primitive.name}` produced {_A[kind]} {kind} from inputs without one "
            f"({label}),\n  {source.describe()}")


hooks.register_step_checker(check_step)  # plans call it after each step while the checks are on
hooks.register_rename_hook(carry_source)  # inlining a jit call keeps each value's source line
