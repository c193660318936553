"""The rules of the collectives (``ir/collectives.py``): jvp, transpose and batching.

Batching is where a named axis gets its meaning. The vmap that binds a name (``vmap_ir(...,
frame=AxisFrame)``) rewrites each collective over it with the rules in ``own_axis_rules``:
``psum`` becomes a ``reduce_sum`` over the batch axis, ``all_gather`` a move of the batch axis into
the value, ``psum_scatter`` a sum whose scattered dimension becomes the batch axis, ``ppermute`` a
concatenation of the members' slices, ``axis_index`` an ``iota``. When the axis spans processes
(``frame.spans_processes``, under ``pmap`` after ``distributed.initialize()``), the same rewrite
reduces over this process's members and then binds one process-level primitive that calls the
engine. A collective over another name (an outer vmap's) is batched like any primitive
(``batch_rules``): the batch axis rides along, and the outer vmap rewrites it later.

Derivatives follow JAX: psum, all_gather, psum_scatter and ppermute are linear; their transposes
are psum, psum_scatter, all_gather and the inverse permutation. pmax and pmin have no derivative
(JAX raises as well).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from funcgrad.core.tensor import bind
from funcgrad.ir import collectives as C
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.collectives import AxisFrame
from funcgrad.transforms.batching import batch_rules, broadcast_batched, move_axis, move_to_front, own_axis_rules
from funcgrad.transforms.jvp import jvp_rules
from funcgrad.transforms.transpose import transpose_rules

Dim = int | None


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(getattr(x, "shape", ()))


def _dtype(x: Any) -> np.dtype:
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def _reshape(x: Any, shape: tuple[int, ...]) -> Any:
    return x if _shape(x) == shape else bind(P.reshape_p, x, new_sizes=shape)


def _front(x: Any, dim: Dim, frame: AxisFrame) -> Any:
    """``x`` with this process's members on axis 0."""
    return broadcast_batched(x, dim, frame.local_size)


def _local_reduce(primitive: P.Primitive, x: Any, dim: Dim, frame: AxisFrame) -> Any:
    """The reduction over this process's members of the axis."""
    if dim is not None:
        return bind(primitive, x, axes=(dim,))
    if primitive is P.reduce_sum_p:
        return bind(P.mul_p, x, np.asarray(frame.local_size, _dtype(x))[()])
    return x


def _gathered(x: Any, dim: Dim, frame: AxisFrame) -> Any:
    """Every member's value stacked on axis 0 (all ``frame.size`` of them, across processes)."""
    stacked = _front(x, dim, frame)
    if frame.spans_processes:
        stacked = bind(C.process_allgather_p, stacked, process_count=frame.process_count)
        stacked = _reshape(stacked, (frame.size,) + _shape(stacked)[2:])
    return stacked


def _rank_offset(frame: AxisFrame) -> int:
    """The index of this process's first member of the axis."""
    if not frame.spans_processes:
        return 0
    return C.get_engine().rank * frame.local_size


# --- the axis a vmap binds --------------------------------------------------------------------


def _reduction_own(local: P.Primitive, op: str) -> Callable[..., tuple[Any, Dim]]:
    def rule(args: list[Any], dims: list[Dim], frame: AxisFrame, *, axis_name: str) -> tuple[Any, Dim]:
        out = _local_reduce(local, args[0], dims[0], frame)
        if frame.spans_processes:
            out = bind(C.process_allreduce_p, out, op=op)
        return out, None
    return rule


own_axis_rules[C.psum_p] = _reduction_own(P.reduce_sum_p, "sum")
own_axis_rules[C.pmax_p] = _reduction_own(P.reduce_max_p, "max")
own_axis_rules[C.pmin_p] = _reduction_own(P.reduce_min_p, "min")


def _all_gather_own(args: list[Any], dims: list[Dim], frame: AxisFrame, *, axis_name: str, axis: int,
                    tiled: bool, axis_size: int) -> tuple[Any, Dim]:
    stacked = _gathered(args[0], dims[0], frame)            # (size, *x.shape)
    out = move_axis(stacked, 0, axis)
    if tiled:
        shape = _shape(out)
        out = _reshape(out, shape[:axis] + (shape[axis] * shape[axis + 1],) + shape[axis + 2:])
    return out, None


own_axis_rules[C.all_gather_p] = _all_gather_own


def _psum_scatter_own(args: list[Any], dims: list[Dim], frame: AxisFrame, *, axis_name: str,
                      scatter_dimension: int, tiled: bool, axis_size: int) -> tuple[Any, Dim]:
    summed = _local_reduce(P.reduce_sum_p, args[0], dims[0], frame)
    shape = _shape(summed)
    chunk = shape[scatter_dimension] // frame.size
    if frame.spans_processes:
        # rows of every member, summed over processes; this process keeps its own members' rows
        rows = move_axis(summed, scatter_dimension, 0)
        mine = bind(C.process_reduce_scatter_p, rows, op="sum", process_count=frame.process_count)
        rest = _shape(mine)[1:]
        return _reshape(mine, (frame.local_size,) + ((chunk,) if tiled else ()) + rest), 0
    if not tiled:
        return summed, scatter_dimension
    split = shape[:scatter_dimension] + (frame.size, chunk) + shape[scatter_dimension + 1:]
    return _reshape(summed, split), scatter_dimension


own_axis_rules[C.psum_scatter_p] = _psum_scatter_own


def _permuted(stacked: Any, perm: tuple[tuple[int, int], ...], size: int) -> Any:
    """Member ``d`` of the result is member ``s`` of ``stacked`` for each pair ``(s, d)``, else zeros."""
    source_of = {destination: source for source, destination in perm}
    rest = _shape(stacked)[1:]
    zero = np.zeros((), _dtype(stacked))[()]
    rows = []
    for destination in range(size):
        source = source_of.get(destination)
        if source is None:
            rows.append(bind(P.broadcast_in_dim_p, zero, shape=(1,) + rest, broadcast_dimensions=()))
        else:
            rows.append(bind(P.slice_p, stacked, start=(source,) + (0,) * len(rest),
                             limit=(source + 1,) + rest, strides=(1,) * (len(rest) + 1)))
    return rows[0] if size == 1 else bind(P.concatenate_p, *rows, axis=0)


def _ppermute_own(args: list[Any], dims: list[Dim], frame: AxisFrame, *, axis_name: str,
                  perm: tuple[tuple[int, int], ...], axis_size: int) -> tuple[Any, Dim]:
    x, dim = args[0], dims[0]
    if frame.spans_processes and frame.local_size == 1:
        # one member per process: the engine moves the buffer point to point
        mine = _reshape(_front(x, dim, frame), _shape(_front(x, dim, frame))[1:])
        out = bind(C.process_ppermute_p, mine, perm=perm)
        return _reshape(out, (1,) + _shape(out)), 0
    everyone = _permuted(_gathered(x, dim, frame), perm, frame.size)
    if not frame.spans_processes:
        return everyone, 0
    offset = _rank_offset(frame)
    rest = _shape(everyone)[1:]
    return bind(P.slice_p, everyone, start=(offset,) + (0,) * len(rest), limit=(offset + frame.local_size,) + rest,
                strides=(1,) * (len(rest) + 1)), 0


own_axis_rules[C.ppermute_p] = _ppermute_own


def _axis_index_own(args: list[Any], dims: list[Dim], frame: AxisFrame, *, axis_name: str) -> tuple[Any, Dim]:
    index = bind(P.iota_p, dtype=dtypes.int32, shape=(frame.local_size,), dimension=0)
    offset = _rank_offset(frame)
    if offset:
        index = bind(P.add_p, index, np.int32(offset))
    return index, 0


own_axis_rules[C.axis_index_p] = _axis_index_own

# --- another (outer) axis: the batch axis rides along ------------------------------------------


def _same_shape_batch(primitive: P.Primitive) -> Callable[..., tuple[Any, Dim]]:
    def rule(args: list[Any], dims: list[Dim], *, axis_size: int, **params: Any) -> tuple[Any, Dim]:
        return bind(primitive, args[0], **params), dims[0]
    return rule


for _primitive in (C.psum_p, C.pmax_p, C.pmin_p, C.ppermute_p, C.process_allreduce_p, C.process_ppermute_p):
    batch_rules[_primitive] = _same_shape_batch(_primitive)


def _all_gather_batch(args: list[Any], dims: list[Dim], *, axis_size: int, axis: int, **params: Any) -> tuple[Any, Dim]:
    return bind(C.all_gather_p, move_to_front(args[0], dims[0]), axis=axis + 1, **params), 0


def _psum_scatter_batch(args: list[Any], dims: list[Dim], *, axis_size: int, scatter_dimension: int,
                        **params: Any) -> tuple[Any, Dim]:
    return bind(C.psum_scatter_p, move_to_front(args[0], dims[0]), scatter_dimension=scatter_dimension + 1,
                **params), 0


def _axis_index_batch(args: list[Any], dims: list[Dim], *, axis_size: int, axis_name: str) -> tuple[Any, Dim]:
    return bind(C.axis_index_p, axis_name=axis_name), None   # no operand: never batched


def _process_allgather_batch(args: list[Any], dims: list[Dim], *, axis_size: int,
                             process_count: int) -> tuple[Any, Dim]:
    assert dims[0] is not None
    return bind(C.process_allgather_p, args[0], process_count=process_count), dims[0] + 1


def _process_reduce_scatter_batch(args: list[Any], dims: list[Dim], *, axis_size: int, op: str,
                                  process_count: int) -> tuple[Any, Dim]:
    # the scattered rows must lead: put the batch axis second
    x = move_axis(move_to_front(args[0], dims[0]), 0, 1)
    return bind(C.process_reduce_scatter_p, x, op=op, process_count=process_count), 1


batch_rules[C.all_gather_p] = _all_gather_batch
batch_rules[C.psum_scatter_p] = _psum_scatter_batch
batch_rules[C.axis_index_p] = _axis_index_batch
batch_rules[C.process_allgather_p] = _process_allgather_batch
batch_rules[C.process_reduce_scatter_p] = _process_reduce_scatter_batch

# --- jvp ---------------------------------------------------------------------------------------


def _linear_jvp(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    def rule(primals: list[Any], tangents: list[Any], **params: Any) -> tuple[Any, Any]:
        return bind(primitive, *primals, **params), bind(primitive, *tangents, **params)
    return rule


def _no_derivative(name: str) -> Callable[..., tuple[Any, Any]]:
    def rule(primals: list[Any], tangents: list[Any], **params: Any) -> tuple[Any, Any]:
        raise NotImplementedError(f"differentiation rule for '{name}' is not implemented (as in JAX: "
                                  "select the maximum with a mask and psum it to differentiate)")
    return rule


for _primitive in (C.psum_p, C.all_gather_p, C.psum_scatter_p, C.ppermute_p, C.process_allgather_p,
                   C.process_reduce_scatter_p, C.process_ppermute_p):
    jvp_rules[_primitive] = _linear_jvp(_primitive)
jvp_rules[C.pmax_p] = _no_derivative("pmax")
jvp_rules[C.pmin_p] = _no_derivative("pmin")
jvp_rules[C.axis_index_p] = lambda primals, tangents, **params: (bind(C.axis_index_p, **params), None)


def _process_allreduce_jvp(primals: list[Any], tangents: list[Any], *, op: str) -> tuple[Any, Any]:
    if op != "sum":
        raise NotImplementedError(f"differentiation rule for 'process_allreduce' with op={op!r} is not implemented")
    return bind(C.process_allreduce_p, primals[0], op=op), bind(C.process_allreduce_p, tangents[0], op=op)


jvp_rules[C.process_allreduce_p] = _process_allreduce_jvp

# --- transpose ---------------------------------------------------------------------------------


def _inverse(perm: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    return tuple((destination, source) for source, destination in perm)


transpose_rules[C.psum_p] = lambda ct, x, *, axis_name: [bind(C.psum_p, ct, axis_name=axis_name)]
transpose_rules[C.all_gather_p] = lambda ct, x, *, axis_name, axis, tiled, axis_size: [
    bind(C.psum_scatter_p, ct, axis_name=axis_name, scatter_dimension=axis, tiled=tiled, axis_size=axis_size)]
transpose_rules[C.psum_scatter_p] = lambda ct, x, *, axis_name, scatter_dimension, tiled, axis_size: [
    bind(C.all_gather_p, ct, axis_name=axis_name, axis=scatter_dimension, tiled=tiled, axis_size=axis_size)]
transpose_rules[C.ppermute_p] = lambda ct, x, *, axis_name, perm, axis_size: [
    bind(C.ppermute_p, ct, axis_name=axis_name, perm=_inverse(perm), axis_size=axis_size)]
transpose_rules[C.process_allreduce_p] = lambda ct, x, *, op: [bind(C.process_allreduce_p, ct, op=op)]
transpose_rules[C.process_ppermute_p] = lambda ct, x, *, perm: [bind(C.process_ppermute_p, ct, perm=_inverse(perm))]


def _process_allgather_transpose(ct: Any, x: Any, *, process_count: int) -> list[Any]:
    mine = bind(C.process_reduce_scatter_p, ct, op="sum", process_count=process_count)
    return [_reshape(mine, x.aval.shape)]


def _process_reduce_scatter_transpose(ct: Any, x: Any, *, op: str, process_count: int) -> list[Any]:
    everyone = bind(C.process_allgather_p, ct, process_count=process_count)
    return [_reshape(everyone, x.aval.shape)]


transpose_rules[C.process_allgather_p] = _process_allgather_transpose
transpose_rules[C.process_reduce_scatter_p] = _process_reduce_scatter_transpose
