"""Collective primitives over named axes, the axis environment that binds the names, and the
process-level primitives that carry a collective to the other processes of a job.

A *named-axis* collective (``psum``, ``pmax``, ``pmin``, ``all_gather``, ``psum_scatter``,
``ppermute``, ``axis_index``) reduces or moves values across the members of one named axis. The
name is bound by ``vmap(f, axis_name=...)`` or ``pmap(f, axis_name=...)`` while they trace ``f``:
they push an :class:`AxisFrame` on the axis environment (``axis_frame``), ``funcgrad.lax`` reads it
to check the name (a ``NameError`` naming it, as JAX) and to record the axis size in the equation.
Each equation names one axis (a collective over several names is several equations). The vmap
transform that bound the name rewrites the equation into ordinary array primitives over its
batch axis (``transforms/collective_rules.py``); so a named-axis collective has no meaning of its
own, and its reference implementation raises.

An axis that spans processes (``pmap`` after ``funcgrad.distributed.initialize()``) is rewritten
the same way into the local reduction over this process's members plus one *process-level*
primitive (``process_allreduce``, ``process_allgather``, ``process_reduce_scatter``,
``process_ppermute``) whose implementation is one call on
``funcgrad.util.collective_engine.get_engine()`` with host NumPy buffers. The lowering runs
them as host steps of a plan, so inside ``jit`` a collective is one step handing its buffer to the engine.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import numpy as np

from funcgrad.ir import dtypes
from funcgrad.ir.core import IR, ShapedArray
from funcgrad.ir.primitives import Primitive
from funcgrad.util.collective_engine import check_permutation, check_reduction, get_engine

# --- the axis environment ----------------------------------------------------------------------


@attrs.frozen
class AxisFrame:
    """A bound axis name: ``size`` members in all, ``local_size`` of them in this process
    (``process_count * local_size == size``; one process for vmap)."""

    name: str
    size: int
    local_size: int
    process_count: int = 1

    @property
    def spans_processes(self) -> bool:
        return self.process_count > 1


class _AxisEnv(threading.local):
    def __init__(self) -> None:
        self.frames: list[AxisFrame] = []


_env = _AxisEnv()


@contextmanager
def axis_frame(frame: AxisFrame) -> Iterator[AxisFrame]:
    """Bind ``frame.name`` while the body runs (innermost binding wins, as nested vmaps)."""
    _env.frames.append(frame)
    try:
        yield frame
    finally:
        _env.frames.pop()


def lookup_axis(name: Any, what: str) -> AxisFrame:
    """The innermost frame binding ``name``; a NameError naming it (and the bound names) otherwise."""
    for frame in reversed(_env.frames):
        if frame.name == name:
            return frame
    bound = ", ".join(repr(f.name) for f in reversed(_env.frames)) or "none"
    raise NameError(f"unbound axis name: {name!r} ({what}: bind it with fg.vmap(f, axis_name={name!r}) or "
                    f"fg.pmap(f, axis_name={name!r}); names bound here: {bound})")


def axis_env_key() -> tuple[tuple[str, int, int, int], ...]:
    """The bound axes as a hashable value: part of a jit signature (sizes are recorded in the IR)."""
    return tuple((f.name, f.size, f.local_size, f.process_count) for f in _env.frames)


# --- named-axis primitives ---------------------------------------------------------------------


def _unbound_impl(name: str) -> Any:
    def impl(*arrays: np.ndarray, axis_name: str, **params: Any) -> np.ndarray:
        raise NameError(f"{name} over axis {axis_name!r} was evaluated outside the vmap/pmap that binds the "
                        "name (a collective has a value only under the transform that binds its axis)")
    return impl


def _same_aval(name: str) -> Any:
    def rule(x: ShapedArray, *, axis_name: str) -> ShapedArray:
        return x
    return rule


psum_p = Primitive("psum", _same_aval("psum"), _unbound_impl("psum"))
pmax_p = Primitive("pmax", _same_aval("pmax"), _unbound_impl("pmax"))
pmin_p = Primitive("pmin", _same_aval("pmin"), _unbound_impl("pmin"))


def _all_gather_rule(x: ShapedArray, *, axis_name: str, axis: int, tiled: bool, axis_size: int) -> ShapedArray:
    if not 0 <= axis <= x.ndim - (1 if tiled else 0):
        raise ValueError(f"all_gather: axis {axis} is out of range for an operand of shape {x.shape}")
    shape = list(x.shape)
    if tiled:
        shape[axis] *= axis_size
    else:
        shape.insert(axis, axis_size)
    return ShapedArray(tuple(shape), x.dtype)


all_gather_p = Primitive("all_gather", _all_gather_rule, _unbound_impl("all_gather"))


def _psum_scatter_rule(x: ShapedArray, *, axis_name: str, scatter_dimension: int, tiled: bool,
                       axis_size: int) -> ShapedArray:
    if not 0 <= scatter_dimension < x.ndim:
        raise ValueError(f"psum_scatter: scatter_dimension {scatter_dimension} is out of range for an operand "
                         f"of shape {x.shape}")
    length = x.shape[scatter_dimension]
    shape = list(x.shape)
    if tiled:
        if length % axis_size:
            raise ValueError(f"psum_scatter: dimension {scatter_dimension} of shape {x.shape} (size {length}) is "
                             f"not a multiple of the size {axis_size} of axis {axis_name!r}")
        shape[scatter_dimension] = length // axis_size
    else:
        if length != axis_size:
            raise ValueError(f"psum_scatter: dimension {scatter_dimension} of shape {x.shape} must have the size "
                             f"{axis_size} of axis {axis_name!r} (or pass tiled=True), got {length}")
        del shape[scatter_dimension]
    return ShapedArray(tuple(shape), x.dtype)


psum_scatter_p = Primitive("psum_scatter", _psum_scatter_rule, _unbound_impl("psum_scatter"))


def _ppermute_rule(x: ShapedArray, *, axis_name: str, perm: tuple[tuple[int, int], ...],
                   axis_size: int) -> ShapedArray:
    check_permutation(f"ppermute over axis {axis_name!r} of size {axis_size}", perm, axis_size)
    return x


ppermute_p = Primitive("ppermute", _ppermute_rule, _unbound_impl("ppermute"))


def _axis_index_rule(*, axis_name: str) -> ShapedArray:
    return ShapedArray((), dtypes.int32)


axis_index_p = Primitive("axis_index", _axis_index_rule, _unbound_impl("axis_index"))

NAMED_COLLECTIVES = (psum_p, pmax_p, pmin_p, all_gather_p, psum_scatter_p, ppermute_p, axis_index_p)


def uses_axis(ir: IR, name: str) -> bool:
    """Whether ``ir`` (or an IR held in one of its equations' parameters) has a collective over ``name``."""
    for eqn in ir.eqns:
        params = eqn.param_dict
        if eqn.primitive in NAMED_COLLECTIVES and params["axis_name"] == name:
            return True
        if any(uses_axis(sub, name) for sub in sub_irs(params.values())):
            return True
    return False


def sub_irs(values: Any) -> Iterator[IR]:
    """The IRs among parameter values (directly or in tuples)."""
    for value in values:
        if isinstance(value, IR):
            yield value
        elif isinstance(value, tuple):
            yield from sub_irs(value)


# --- process-level primitives (one engine call each) -------------------------------------------


def _process_allreduce_impl(x: np.ndarray, *, op: str) -> np.ndarray:
    return get_engine().allreduce(np.ascontiguousarray(x), op)


def _process_allreduce_rule(x: ShapedArray, *, op: str) -> ShapedArray:
    check_reduction("process_allreduce", op)
    return x


process_allreduce_p = Primitive("process_allreduce", _process_allreduce_rule, _process_allreduce_impl)


def _process_allgather_rule(x: ShapedArray, *, process_count: int) -> ShapedArray:
    return ShapedArray((process_count,) + x.shape, x.dtype)


def _process_allgather_impl(x: np.ndarray, *, process_count: int) -> np.ndarray:
    out = get_engine().allgather(np.ascontiguousarray(x))
    if out.shape[0] != process_count:
        raise RuntimeError(f"process_allgather: traced for {process_count} processes, the engine has {out.shape[0]}")
    return out


process_allgather_p = Primitive("process_allgather", _process_allgather_rule, _process_allgather_impl)


def _process_reduce_scatter_rule(x: ShapedArray, *, op: str, process_count: int) -> ShapedArray:
    check_reduction("process_reduce_scatter", op)
    if not x.shape or x.shape[0] % process_count:
        raise ValueError(f"process_reduce_scatter: the leading axis of shape {x.shape} must be a multiple of the "
                         f"process count {process_count}")
    return ShapedArray((x.shape[0] // process_count,) + x.shape[1:], x.dtype)


def _process_reduce_scatter_impl(x: np.ndarray, *, op: str, process_count: int) -> np.ndarray:
    return get_engine().reduce_scatter(np.ascontiguousarray(x), op)


process_reduce_scatter_p = Primitive("process_reduce_scatter", _process_reduce_scatter_rule,
                                     _process_reduce_scatter_impl)


def _process_ppermute_rule(x: ShapedArray, *, perm: tuple[tuple[int, int], ...]) -> ShapedArray:
    return x


def _process_ppermute_impl(x: np.ndarray, *, perm: tuple[tuple[int, int], ...]) -> np.ndarray:
    return get_engine().ppermute(np.ascontiguousarray(x), perm)


process_ppermute_p = Primitive("process_ppermute", _process_ppermute_rule, _process_ppermute_impl)

PROCESS_COLLECTIVES = (process_allreduce_p, process_allgather_p, process_reduce_scatter_p, process_ppermute_p)


def normalize_perm(perm: Sequence[Sequence[int]]) -> tuple[tuple[int, int], ...]:
    return tuple((int(source), int(destination)) for source, destination in perm)
