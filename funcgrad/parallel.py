"""Collectives over named axes (``lax.psum``, ``pmean``, ``pmax``, ``pmin``, ``all_gather``,
``psum_scatter``, ``ppermute``, ``axis_index``), ``pmap`` and ``shard_map``.

A collective checks its axis names against the axis environment (``ir/collectives.py``: the names
``vmap``/``pmap``/``shard_map`` bind while they trace), records the axis size, and binds one
primitive per name; the transform that bound the name gives it its meaning
(``transforms/collective_rules.py``). ``pmap`` is ``vmap`` with a named axis that, after
``funcgrad.distributed.initialize()``, spans every process of the job: each process passes its
local shard and its collectives reduce locally, then call the engine once.

>>> import funcgrad as fg
>>> fg.vmap(lambda x: x / fg.lax.psum(x, 'i'), axis_name='i')(fg.numpy.arange(1.0, 4.0)).tolist()
[0.16666..., 0.33333..., 0.5]
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, as_tensor, bind
from funcgrad.ir import collectives as C
from funcgrad.ir.collectives import AxisFrame, lookup_axis
from funcgrad.transforms.batching import vmap
from funcgrad.util import tree
from funcgrad.util.collective_engine import get_engine

__all__ = ["P", "PartitionSpec", "all_gather", "axis_index", "pmap", "pmax", "pmean", "pmin", "ppermute",
           "psum", "psum_scatter", "shard_map"]


def _names(axis_name: Any) -> tuple[Any, ...]:
    return tuple(axis_name) if isinstance(axis_name, (tuple, list)) else (axis_name,)


def _frames(axis_name: Any, what: str) -> list[AxisFrame]:
    names = _names(axis_name)
    if not names:
        raise ValueError(f"{what}: axis_name must name at least one axis")
    return [lookup_axis(name, what) for name in names]


def _each_leaf(x: Any, apply: Callable[[Tensor], Any]) -> Any:
    return tree.map(lambda leaf: apply(as_tensor(leaf)), x)


def _reduction(primitive: Any, what: str) -> Callable[[Any, Any], Any]:
    def collective(x: Any, axis_name: Any) -> Any:
        frames = _frames(axis_name, what)

        def one(leaf: Tensor) -> Any:
            for frame in frames:
                leaf = bind(primitive, leaf, axis_name=frame.name)
            return leaf
        return _each_leaf(x, one)
    collective.__name__ = what
    collective.__doc__ = (f"The {what.lstrip('p')} of ``x`` (a pytree) over every member of the named axis (or "
                          f"axes) ``axis_name``, on every member (JAX's ``lax.{what}``).")
    return collective


psum = _reduction(C.psum_p, "psum")
pmax = _reduction(C.pmax_p, "pmax")
pmin = _reduction(C.pmin_p, "pmin")


def pmean(x: Any, axis_name: Any) -> Any:
    """The mean of ``x`` over the named axis (or axes): ``psum(x) / size``."""
    size = math.prod(frame.size for frame in _frames(axis_name, "pmean"))
    return tree.map(lambda leaf: leaf / size, psum(x, axis_name))


def axis_index(axis_name: Any) -> Tensor:
    """This member's index along the named axis, an int32 scalar; over several names, the index in
    their row-major product (the first name varies slowest)."""
    frames = _frames(axis_name, "axis_index")
    index: Any = None
    for frame in frames:
        own = bind(C.axis_index_p, axis_name=frame.name)
        index = own if index is None else index * frame.size + own
    return index


def all_gather(x: Any, axis_name: Any, *, axis: int = 0, tiled: bool = False) -> Any:
    """Every member's ``x`` stacked on a new axis ``axis`` (``tiled``: concatenated along ``axis``).

    Over several names the members are ordered row-major (the first name varies slowest).
    """
    frames = _frames(axis_name, "all_gather")

    def one(leaf: Tensor) -> Any:
        rank = leaf.ndim + (0 if tiled else 1)
        if not -rank <= axis < rank:
            raise ValueError(f"all_gather: axis {axis} is out of range for an operand of shape {leaf.shape}"
                             f"{'' if tiled else ' (the new axis counts)'}")
        where = axis % rank
        if not tiled:
            leaf = leaf.reshape(leaf.shape[:where] + (1,) + leaf.shape[where:])
        for frame in reversed(frames):   # the last name innermost
            leaf = bind(C.all_gather_p, leaf, axis_name=frame.name, axis=where, tiled=True, axis_size=frame.size)
        return leaf
    return _each_leaf(x, one)


def psum_scatter(x: Any, axis_name: Any, *, scatter_dimension: int = 0, tiled: bool = False) -> Any:
    """The psum of ``x`` with member ``r`` keeping block ``r`` of ``scatter_dimension`` (untiled: that
    dimension has the axis size and is removed; tiled: it is split into equal blocks)."""
    frames = _frames(axis_name, "psum_scatter")
    total = math.prod(frame.size for frame in frames)

    def one(leaf: Tensor) -> Any:
        if not -leaf.ndim <= scatter_dimension < max(leaf.ndim, 1) or leaf.ndim == 0:
            raise ValueError(f"psum_scatter: scatter_dimension {scatter_dimension} is out of range for an operand "
                             f"of shape {leaf.shape}")
        where = scatter_dimension % leaf.ndim
        length = leaf.shape[where]
        if not tiled and length != total:
            raise ValueError(f"psum_scatter: dimension {where} of shape {leaf.shape} must have the size {total} of "
                             f"axis {axis_name!r} (or pass tiled=True), got {length}")
        if tiled and length % total:
            raise ValueError(f"psum_scatter: dimension {where} of shape {leaf.shape} (size {length}) is not a "
                             f"multiple of the size {total} of axis {axis_name!r}")
        for frame in frames:   # the first name outermost
            leaf = bind(C.psum_scatter_p, leaf, axis_name=frame.name, scatter_dimension=where, tiled=True,
                        axis_size=frame.size)
        if not tiled:
            leaf = leaf.reshape(leaf.shape[:where] + leaf.shape[where + 1:])
        return leaf
    return _each_leaf(x, one)


def ppermute(x: Any, axis_name: Any, perm: Sequence[tuple[int, int]]) -> Any:
    """Member ``d`` receives member ``s``'s ``x`` for each pair ``(s, d)`` of ``perm``; a member that
    is no destination receives zeros."""
    frames = _frames(axis_name, "ppermute")
    if len(frames) != 1:
        raise NotImplementedError(f"ppermute over several axes {axis_name!r} is not implemented: permute over "
                                  "one name at a time")
    frame = frames[0]
    pairs = C.normalize_perm(perm)
    return _each_leaf(x, lambda leaf: bind(C.ppermute_p, leaf, axis_name=frame.name, perm=pairs,
                                           axis_size=frame.size))


# --- pmap ----------------------------------------------------------------------------------------


def pmap(fn: Callable[..., Any], axis_name: Any = None, *, in_axes: Any = 0, out_axes: Any = 0) -> Callable[..., Any]:
    """Map ``fn`` over the leading axis of its arguments as one member each of the axis ``axis_name``.

    In one process this is ``vmap(fn, axis_name=axis_name)``. After ``funcgrad.distributed.initialize()``
    in a job of several processes, every process calls it with its local shard (the leading axis is
    its local member count, the same on every process) and the named axis spans all of them:
    member ``process_index() * local + k``. The outputs are each process's local members.

    >>> fg.pmap(lambda x: fg.lax.psum(x, 'i'), axis_name='i')(fnp.ones(2)).tolist()   # [2.0, 2.0]
    """
    name = axis_name

    def frame_of(local: int) -> AxisFrame:
        engine = get_engine()
        if engine.size > 1:
            # every rank traces this call: a mismatch would give wrong members or a hang later
            counts = engine.allgather(np.array([local], np.int64)).ravel().tolist()
            if len(set(counts)) > 1:
                described = ", ".join(f"rank {rank}: {count}" for rank, count in enumerate(counts))
                raise ValueError(f"pmap over axis {name!r}: the processes pass different local member counts "
                                 f"(the leading axis: {described}); every process must pass the same count")
        return AxisFrame(name, local * engine.size, local, engine.size)

    @functools.wraps(fn)
    def mapped(*args: Any, **kwargs: Any) -> Any:
        return vmap(fn, in_axes=in_axes, out_axes=out_axes, axis_name=name, _frame=frame_of)(*args, **kwargs)
    return mapped


# --- shard_map over the 1-D mesh of processes ----------------------------------------------------


class PartitionSpec(tuple):  # noqa: SLOT001 (a tuple, as JAX's)
    """How a value is laid out over the process mesh: ``P('i')``: its leading axis is split into one block
    per process (each process holds its block), ``P()``: every process holds all of it (replicated)."""

    def __new__(cls, *names: Any) -> PartitionSpec:
        return super().__new__(cls, names)

    def __repr__(self) -> str:
        return f"P({', '.join(repr(n) for n in self)})"


P = PartitionSpec


def _spec_name(spec: Any, what: str) -> Any:
    if not isinstance(spec, PartitionSpec):
        raise TypeError(f"shard_map: {what} must be P('name') or P(), got {spec!r}")
    if len(spec) == 0 or all(n is None for n in spec):
        return None
    if len(spec) != 1:
        raise NotImplementedError(f"shard_map: {what} {spec!r}: only the leading axis is split over the 1-D "
                                  "process mesh (P('i') or P())")
    return spec[0]


def shard_map(fn: Callable[..., Any], *, in_specs: Any, out_specs: Any, axis_name: str = "i") -> Callable[..., Any]:
    """Run ``fn`` once per process on its blocks, with the 1-D mesh of processes named ``axis_name``.

    Each process passes its own block for an argument of spec ``P(axis_name)`` and the same whole value
    for ``P()``; ``fn`` sees exactly that and its collectives over ``axis_name`` span the processes. An
    output of spec ``P(axis_name)`` is this process's block; ``P()`` must be the same on every process
    (a psum's result, say). ``in_specs`` is one spec per positional argument (or one for all).

    >>> step = fg.shard_map(lambda g: fg.lax.pmean(g, 'i'), in_specs=(P('i'),), out_specs=P())
    """
    def check(spec: Any, what: str) -> bool:
        name = _spec_name(spec, what)
        if name is not None and name != axis_name:
            raise NameError(f"shard_map: {what} {spec!r} names axis {name!r}; the process mesh's axis is "
                            f"{axis_name!r}")
        return name is not None

    def frame_of(local: int) -> AxisFrame:
        processes = get_engine().size
        return AxisFrame(axis_name, processes, 1, processes)

    @functools.wraps(fn)
    def mapped(*args: Any) -> Any:
        single = isinstance(in_specs, PartitionSpec) or not isinstance(in_specs, (tuple, list))
        specs = (in_specs,) * len(args) if single else tuple(in_specs)
        if len(specs) != len(args):
            raise ValueError(f"shard_map: {len(specs)} in_specs for {len(args)} arguments")
        sharded = [check(spec, f"in_specs[{i}]") for i, spec in enumerate(specs)]
        # one member per process: a leading axis of 1 on the blocks, none on replicated values
        lifted = [tree.map(lambda leaf: as_tensor(leaf).reshape((1,) + as_tensor(leaf).shape), a) if s else a
                  for a, s in zip(args, sharded)]
        in_axes = tuple(0 if s else None for s in sharded)
        out_sharded = tree.map(lambda spec: check(spec, "out_specs"), out_specs,
                               is_leaf=lambda s: isinstance(s, PartitionSpec))
        out_axes = tree.map(lambda s: 0 if s else None, out_sharded)
        call = vmap(fn, in_axes=in_axes, out_axes=out_axes, axis_size=1, axis_name=axis_name, _frame=frame_of)
        try:
            outs = call(*lifted)
        except ValueError as error:
            if "out_axes=None" not in str(error):
                raise
            raise ValueError(f"shard_map: an output of spec P() differs between processes (it depends on a block "
                             f"of an argument of spec P({axis_name!r})): reduce it with a collective such as "
                             f"lax.psum, or give it out_specs=P({axis_name!r})") from None
        leaves, out_tree = tree.flatten(outs)
        flags = tree.broadcast_prefix(out_sharded, outs)
        return tree.unflatten(out_tree, [out.reshape(out.shape[1:]) if s else out for out, s in zip(leaves, flags)])
    return mapped
