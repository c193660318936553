"""Batching (vmap) rules of the first-order primitives, one per primitive (the call and control-flow
primitives keep theirs in ``jit.py``, ``control_flow.py`` and ``custom.py``, with stop_gradient).

A rule is ``rule(args, dims, *, axis_size, **params) -> (out, out_dim)`` (lists for primitives
with several results): ``dims[i]`` is the batch axis of ``args[i]``, or ``None`` when the value is
the same for every example (values read from IR literals are NumPy scalars with ``None``). Rules
keep the batch axis where it is when that costs nothing (unary ops, reductions, slices) and
otherwise move it to the front (``move_to_front``) and shift the axis parameters by one.
Indexing with per-example indices becomes ``gather``/``scatter`` with an iota column for the
batch axis.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.transforms.batching import batch_rules, broadcast_batched, move_axis, move_to_front

Dim = int | None


def _shape(x: Any) -> tuple[int, ...]:
    return tuple(getattr(x, "shape", ()))


def _unbatched_shape(x: Any, dim: Dim) -> tuple[int, ...]:
    shape = _shape(x)
    return shape if dim is None else shape[:dim] + shape[dim + 1:]


def _shift(axes: Sequence[int], dim: int) -> tuple[int, ...]:
    """Axes of the unbatched value, renumbered for a value with a batch axis at ``dim``."""
    return tuple(a + (a >= dim) for a in axes)


def _scalar(value: Any, dtype: np.dtype) -> Any:
    """A NumPy scalar of ``dtype`` (an IR literal when bound)."""
    return np.asarray(value, dtype)[()]


def _single(args: Sequence[Any], dims: Sequence[Dim]) -> tuple[Any, int]:
    """The operand of a one-operand primitive and its batch axis (never None: vmap only calls a
    rule when some operand is batched)."""
    (x,), (dim,) = args, dims
    assert dim is not None
    return x, dim


# --- elementwise -------------------------------------------------------------------------------


def _elementwise_operands(args: Sequence[Any], dims: Sequence[Dim], axis_size: int) -> tuple[list[Any], int]:
    """Operands ready for an elementwise primitive (equal shapes or rank 0), and the batch axis.

    When every batched operand already has the full shape at one common axis and the unbatched
    ones are scalars, nothing moves; otherwise batched operands go to axis 0 and the others are
    broadcast to (axis_size, *shape) where a rank-0 operand would not broadcast by itself.
    """
    shapes = [_unbatched_shape(x, d) for x, d in zip(args, dims)]
    out_shape = next((s for s in shapes if s != ()), ())
    batched_dims = {d for d in dims if d is not None}
    fits = all(s == out_shape if d is not None else s == () for s, d in zip(shapes, dims))
    if len(batched_dims) == 1 and fits:
        return list(args), batched_dims.pop()
    full = (axis_size,) + out_shape
    operands = []
    for x, d, shape in zip(args, dims, shapes):
        if d is not None:
            x = move_to_front(x, d)
            if shape == () and out_shape != ():
                x = bind(P.broadcast_in_dim_p, x, shape=full, broadcast_dimensions=(0,))
        elif shape != ():
            x = broadcast_batched(x, None, axis_size)
        operands.append(x)
    return operands, 0


def _elementwise_rule(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    def rule(args: list[Any], dims: list[Dim], *, axis_size: int, **params: Any) -> tuple[Any, Any]:
        operands, dim = _elementwise_operands(args, dims, axis_size)
        out = bind(primitive, *operands, **params)
        if primitive.multiple_results:
            return list(out), [dim] * len(out)
        return out, dim
    return rule


_ELEMENTWISE = [
    P.neg_p, P.abs_p, P.sign_p, P.exp_p, P.log_p, P.exp2_p, P.log2_p, P.expm1_p, P.log1p_p, P.sin_p,
    P.cos_p, P.tan_p, P.asin_p, P.acos_p, P.atan_p, P.sinh_p, P.cosh_p, P.tanh_p, P.asinh_p, P.acosh_p,
    P.atanh_p, P.sqrt_p, P.rsqrt_p, P.logistic_p, P.erf_p, P.floor_p, P.ceil_p, P.round_p, P.is_finite_p,
    P.not_p, P.add_p, P.sub_p, P.mul_p, P.div_p, P.rem_p, P.pow_p, P.max_p, P.min_p,
    P.atan2_p, P.and_p, P.or_p, P.xor_p, P.shift_left_p, P.shift_right_p, P.eq_p, P.ne_p, P.lt_p,
    P.le_p, P.gt_p, P.ge_p, P.select_p, P.complex_p, P.convert_element_type_p, P.bitcast_convert_type_p,
    P.threefry2x32_p,
]
for _primitive in _ELEMENTWISE:
    batch_rules[_primitive] = _elementwise_rule(_primitive)

# --- reductions and scans along axes -----------------------------------------------------------


def _reduce_batch(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    def rule(args: list[Any], dims: list[Dim], *, axis_size: int, axes: tuple[int, ...]) -> tuple[Any, Any]:
        x, dim = _single(args, dims)
        shifted = _shift(axes, dim)
        out_dim = dim - sum(a < dim for a in shifted)
        return bind(primitive, x, axes=shifted), out_dim
    return rule


def _arg_reduce_batch(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    def rule(args: list[Any], dims: list[Dim], *, axis_size: int, axis: int,
             index_dtype: np.dtype) -> tuple[Any, Any]:
        x, dim = _single(args, dims)
        (shifted,) = _shift((axis,), dim)
        return bind(primitive, x, axis=shifted, index_dtype=index_dtype), dim - (shifted < dim)
    return rule


def _cumulative_batch(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    def rule(args: list[Any], dims: list[Dim], *, axis_size: int, axis: int,
             reverse: bool) -> tuple[Any, Any]:
        x, dim = _single(args, dims)
        (shifted,) = _shift((axis,), dim)
        return bind(primitive, x, axis=shifted, reverse=reverse), dim
    return rule


for _primitive in (P.reduce_sum_p, P.reduce_prod_p, P.reduce_max_p, P.reduce_min_p):
    batch_rules[_primitive] = _reduce_batch(_primitive)
for _primitive in (P.argmax_p, P.argmin_p):
    batch_rules[_primitive] = _arg_reduce_batch(_primitive)
for _primitive in (P.cumsum_p, P.cumprod_p, P.cummax_p, P.cummin_p):
    batch_rules[_primitive] = _cumulative_batch(_primitive)


def _flip_batch(args: list[Any], dims: list[Dim], *, axis_size: int,
                axes: tuple[int, ...]) -> tuple[Any, Any]:
    x, dim = _single(args, dims)
    return bind(P.flip_p, x, axes=_shift(axes, dim)), dim


def _sort_batch(args: list[Any], dims: list[Dim], *, axis_size: int, dimension: int, num_keys: int,
                descending: bool) -> tuple[Any, Any]:
    operands = [broadcast_batched(x, d, axis_size) for x, d in zip(args, dims)]
    outs = bind(P.sort_p, *operands, dimension=dimension + 1, num_keys=num_keys, descending=descending)
    return list(outs), [0] * len(outs)


batch_rules[P.flip_p] = _flip_batch
batch_rules[P.sort_p] = _sort_batch

# --- movement ----------------------------------------------------------------------------------


def _reshape_batch(args: list[Any], dims: list[Dim], *, axis_size: int,
                   new_sizes: tuple[int, ...]) -> tuple[Any, Any]:
    x = move_to_front(args[0], dims[0])
    return bind(P.reshape_p, x, new_sizes=(axis_size,) + tuple(new_sizes)), 0


def _broadcast_in_dim_batch(args: list[Any], dims: list[Dim], *, axis_size: int, shape: tuple[int, ...],
                            broadcast_dimensions: tuple[int, ...]) -> tuple[Any, Any]:
    x = move_to_front(args[0], dims[0])
    out = bind(P.broadcast_in_dim_p, x, shape=(axis_size,) + tuple(shape),
               broadcast_dimensions=(0,) + tuple(b + 1 for b in broadcast_dimensions))
    return out, 0


def _transpose_batch(args: list[Any], dims: list[Dim], *, axis_size: int,
                     permutation: tuple[int, ...]) -> tuple[Any, Any]:
    x, dim = _single(args, dims)
    return bind(P.transpose_p, x, permutation=(dim,) + _shift(permutation, dim)), 0


def _pad_batch(args: list[Any], dims: list[Dim], *, axis_size: int, low: tuple[int, ...],
               high: tuple[int, ...]) -> tuple[Any, Any]:
    (x, value), (x_dim, value_dim) = args, dims
    if value_dim is None:
        x = move_to_front(x, x_dim)
        return bind(P.pad_p, x, value, low=(0,) + tuple(low), high=(0,) + tuple(high)), 0
    # A per-example padding value: pad with zero, then select the value where the mask says "pad".
    x = broadcast_batched(x, x_dim, axis_size)
    value = move_to_front(value, value_dim)
    padded = bind(P.pad_p, x, _scalar(0, x.dtype), low=(0,) + tuple(low), high=(0,) + tuple(high))
    conditions = []  # where the element comes from x (only the bounds that have padding beyond them)
    for axis, (lo, hi, size) in enumerate(zip(low, high, x.shape[1:]), start=1):
        if lo == hi == 0:
            continue
        position = bind(P.iota_p, dtype=dtypes.int32, shape=padded.shape, dimension=axis)
        if lo > 0:
            conditions.append(bind(P.ge_p, position, np.int32(lo)))
        if hi > 0:
            conditions.append(bind(P.lt_p, position, np.int32(lo + size)))
    if not conditions:  # no padding at all
        return padded, 0
    inside = conditions[0]
    for condition in conditions[1:]:
        inside = bind(P.and_p, inside, condition)
    fill = bind(P.broadcast_in_dim_p, value, shape=padded.shape, broadcast_dimensions=(0,))
    return bind(P.select_p, inside, padded, fill), 0


def _slice_batch(args: list[Any], dims: list[Dim], *, axis_size: int, start: tuple[int, ...],
                 limit: tuple[int, ...], strides: tuple[int, ...]) -> tuple[Any, Any]:
    x, dim = _single(args, dims)
    out = bind(P.slice_p, x, start=start[:dim] + (0,) + start[dim:],
               limit=limit[:dim] + (axis_size,) + limit[dim:], strides=strides[:dim] + (1,) + strides[dim:])
    return out, dim


def _concatenate_batch(args: list[Any], dims: list[Dim], *, axis_size: int, axis: int) -> tuple[Any, Any]:
    operands = [broadcast_batched(x, d, axis_size) for x, d in zip(args, dims)]
    return bind(P.concatenate_p, *operands, axis=axis + 1), 0


def _iota_batch(args: list[Any], dims: list[Dim], *, axis_size: int, **params: Any) -> tuple[Any, Any]:
    # iota has no operands, so vmap never batches it; the rule exists so the table is complete
    return bind(P.iota_p, **params), None


batch_rules[P.reshape_p] = _reshape_batch
batch_rules[P.broadcast_in_dim_p] = _broadcast_in_dim_batch
batch_rules[P.transpose_p] = _transpose_batch
batch_rules[P.pad_p] = _pad_batch
batch_rules[P.slice_p] = _slice_batch
batch_rules[P.concatenate_p] = _concatenate_batch
batch_rules[P.iota_p] = _iota_batch

# --- dot_general -------------------------------------------------------------------------------


def _dot_general_batch(args: list[Any], dims: list[Dim], *, axis_size: int,
                       contracting: tuple[tuple[int, ...], tuple[int, ...]],
                       batch: tuple[tuple[int, ...], tuple[int, ...]]) -> tuple[Any, Any]:
    (lhs, rhs), (lhs_dim, rhs_dim) = args, dims
    (lc, rc), (lb, rb) = contracting, batch
    if lhs_dim is not None and rhs_dim is not None:  # the vmapped axis becomes a dot batch dim
        lhs, rhs = move_to_front(lhs, lhs_dim), move_to_front(rhs, rhs_dim)
        out = bind(P.dot_general_p, lhs, rhs, contracting=(_shift(lc, 0), _shift(rc, 0)),
                   batch=((0,) + _shift(lb, 0), (0,) + _shift(rb, 0)))
        return out, 0
    if lhs_dim is not None:  # a free dim of lhs: output dims are batch, lhs free, rhs free
        lc, lb = _shift(lc, lhs_dim), _shift(lb, lhs_dim)
        out_dim = len(lb) + sum(1 for i in range(lhs_dim) if i not in lc + lb)
    else:
        assert rhs_dim is not None
        rc, rb = _shift(rc, rhs_dim), _shift(rb, rhs_dim)
        lhs_free = len(_shape(lhs)) - len(lc) - len(lb)
        out_dim = len(lb) + lhs_free + sum(1 for i in range(rhs_dim) if i not in rc + rb)
    return bind(P.dot_general_p, lhs, rhs, contracting=(lc, rc), batch=(lb, rb)), out_dim


batch_rules[P.dot_general_p] = _dot_general_batch

# --- conv_general_dilated ----------------------------------------------------------------------


def _conv_batch(args: list[Any], dims: list[Dim], *, axis_size: int, **params: Any) -> tuple[Any, Any]:
    """A batched lhs folds the vmapped axis into N; a batched rhs folds it into the output channels
    (per feature group); both batched: into the feature groups, each example its own group."""
    (lhs, rhs), (lhs_dim, rhs_dim) = args, dims
    groups = params["feature_group_count"]
    size = axis_size
    if rhs_dim is None:
        lhs = move_to_front(lhs, lhs_dim)
        folded = bind(P.reshape_p, lhs, new_sizes=(size * lhs.shape[1],) + tuple(lhs.shape[2:]))
        out = bind(P.conv_general_dilated_p, folded, rhs, **params)
        return bind(P.reshape_p, out, new_sizes=(size, lhs.shape[1]) + tuple(out.shape[1:])), 0
    rhs = move_to_front(rhs, rhs_dim)
    out_channels, group_in, *kernel = rhs.shape[1:]
    per_group = out_channels // groups
    if lhs_dim is None:  # output channels ordered (group, example, channel) so each group stays contiguous
        rhs = bind(P.reshape_p, rhs, new_sizes=(size, groups, per_group, group_in, *kernel))
        rhs = bind(P.transpose_p, rhs, permutation=(1, 0, *range(2, rhs.ndim)))
        rhs = bind(P.reshape_p, rhs, new_sizes=(size * out_channels, group_in, *kernel))
        out = bind(P.conv_general_dilated_p, lhs, rhs, **params)
        batch, *spatial = out.shape[:1] + out.shape[2:]
        out = bind(P.reshape_p, out, new_sizes=(batch, groups, size, per_group, *spatial))
        out = bind(P.transpose_p, out, permutation=(0, 2, 1, *range(3, out.ndim)))
        return bind(P.reshape_p, out, new_sizes=(batch, size, out_channels, *spatial)), 1
    lhs = move_to_front(lhs, lhs_dim)  # (B, N, C, ...) -> (N, B * C, ...): example b owns groups b*G ...
    lhs = bind(P.transpose_p, lhs, permutation=(1, 0, *range(2, lhs.ndim)))
    lhs = bind(P.reshape_p, lhs, new_sizes=(lhs.shape[0], size * lhs.shape[2]) + tuple(lhs.shape[3:]))
    rhs = bind(P.reshape_p, rhs, new_sizes=(size * out_channels, group_in, *kernel))
    out = bind(P.conv_general_dilated_p, lhs, rhs, **{**params, "feature_group_count": size * groups})
    return bind(P.reshape_p, out, new_sizes=(out.shape[0], size, out_channels) + tuple(out.shape[2:])), 1


batch_rules[P.conv_general_dilated_p] = _conv_batch

# --- dynamic slicing, gather and scatter -------------------------------------------------------


def _with_batch_column(indices: Any) -> Any:
    """``indices`` of shape (B, ..., k) with an iota column prepended: (B, ..., k + 1), where
    entry [b, ..., 0] is b, so gathering over axes (0, ...) picks each example's own operand."""
    column = bind(P.iota_p, dtype=indices.dtype, shape=indices.shape[:-1] + (1,), dimension=0)
    return bind(P.concatenate_p, column, indices, axis=indices.ndim - 1)


def _window_indices(starts: Sequence[Any], start_dims: Sequence[Dim], operand_shape: Sequence[int],
                    sizes: Sequence[int], axis_size: int, batch_column: bool) -> Any:
    """Per-example indices (B, *sizes, rank) of every element of a window: start + offset per
    axis, with starts clamped into range as dynamic_slice does; ``batch_column`` prepends the
    example number (for a batched operand)."""
    grid = (axis_size,) + tuple(sizes)
    columns = [bind(P.iota_p, dtype=dtypes.int32, shape=grid, dimension=0)] if batch_column else []
    for axis, (start, dim, extent, size) in enumerate(zip(starts, start_dims, operand_shape, sizes)):
        start = move_to_front(start, dim)
        if start.dtype != dtypes.int32:
            start = bind(P.convert_element_type_p, start, new_dtype=dtypes.int32)
        start = bind(P.max_p, bind(P.min_p, start, np.int32(extent - size)), np.int32(0))
        start = bind(P.broadcast_in_dim_p, start, shape=grid,
                     broadcast_dimensions=(0,) if dim is not None else ())
        offset = bind(P.iota_p, dtype=dtypes.int32, shape=grid, dimension=axis + 1)
        columns.append(bind(P.add_p, start, offset))
    columns = [bind(P.reshape_p, c, new_sizes=grid + (1,)) for c in columns]
    return bind(P.concatenate_p, *columns, axis=len(grid))


def _dynamic_slice_batch(args: list[Any], dims: list[Dim], *, axis_size: int,
                         slice_sizes: tuple[int, ...]) -> tuple[Any, Any]:
    (x, *starts), (x_dim, *start_dims) = args, dims
    if all(d is None for d in start_dims):  # one window for all: slice the whole batch axis too
        zero = _scalar(0, starts[0].dtype if starts else dtypes.int32)
        out = bind(P.dynamic_slice_p, x, *starts[:x_dim], zero, *starts[x_dim:],
                   slice_sizes=slice_sizes[:x_dim] + (axis_size,) + slice_sizes[x_dim:])
        return out, x_dim
    batched_operand = x_dim is not None
    x = move_to_front(x, x_dim)
    indices = _window_indices(starts, start_dims, _unbatched_shape(x, 0 if batched_operand else None),
                              slice_sizes, axis_size, batch_column=batched_operand)
    return bind(P.gather_p, x, indices, axes=tuple(range(x.ndim))), 0


def _dynamic_update_slice_batch(args: list[Any], dims: list[Dim], *, axis_size: int) -> tuple[Any, Any]:
    (x, update, *starts), (x_dim, update_dim, *start_dims) = args, dims
    x = broadcast_batched(x, x_dim, axis_size)
    update = broadcast_batched(update, update_dim, axis_size)
    if all(d is None for d in start_dims):
        zero = _scalar(0, starts[0].dtype if starts else dtypes.int32)
        return bind(P.dynamic_update_slice_p, x, update, zero, *starts), 0
    indices = _window_indices(starts, start_dims, x.shape[1:], update.shape[1:], axis_size, batch_column=True)
    return bind(P.scatter_p, x, indices, update, axes=tuple(range(x.ndim)), mode="set"), 0


def _gather_batch(args: list[Any], dims: list[Dim], *, axis_size: int,
                  axes: tuple[int, ...]) -> tuple[Any, Any]:
    (x, indices), (x_dim, indices_dim) = args, dims
    if indices_dim is None:  # the batch axis is one of the operand's kept ("rest") dims
        assert x_dim is not None
        shifted = _shift(axes, x_dim)
        out_dim = indices.ndim - 1 + sum(1 for i in range(x_dim) if i not in shifted)
        return bind(P.gather_p, x, indices, axes=shifted), out_dim
    indices = move_to_front(indices, indices_dim)
    if x_dim is None:  # the batch axis is a leading index dim
        return bind(P.gather_p, x, indices, axes=axes), 0
    x = move_to_front(x, x_dim)
    return bind(P.gather_p, x, _with_batch_column(indices), axes=(0,) + _shift(axes, 0)), 0


def _scatter_batch(args: list[Any], dims: list[Dim], *, axis_size: int, axes: tuple[int, ...],
                   mode: str) -> tuple[Any, Any]:
    (x, indices, updates), (x_dim, indices_dim, updates_dim) = args, dims
    x = broadcast_batched(x, x_dim, axis_size)
    updates = broadcast_batched(updates, updates_dim, axis_size)
    if indices_dim is None:
        # the batch axis is the first kept dim of x; in updates it follows the index dims
        updates = move_axis(updates, 0, indices.ndim - 1)
        return bind(P.scatter_p, x, indices, updates, axes=_shift(axes, 0), mode=mode), 0
    indices = _with_batch_column(move_to_front(indices, indices_dim))
    return bind(P.scatter_p, x, indices, updates, axes=(0,) + _shift(axes, 0), mode=mode), 0


batch_rules[P.dynamic_slice_p] = _dynamic_slice_batch
batch_rules[P.dynamic_update_slice_p] = _dynamic_update_slice_batch
batch_rules[P.gather_p] = _gather_batch
batch_rules[P.scatter_p] = _scatter_batch

# --- linear algebra ----------------------------------------------------------------------------


def _matrix_batch(primitive: P.Primitive) -> Callable[..., tuple[Any, Any]]:
    """The linear-algebra primitives map over leading axes already: the batch axis goes to the front
    of every operand (unbatched ones are broadcast, since ``solve`` wants equal batch shapes)."""
    def rule(args: list[Any], dims: list[Dim], *, axis_size: int, **params: Any) -> tuple[Any, Any]:
        operands = [broadcast_batched(x, d, axis_size) for x, d in zip(args, dims)]
        out = bind(primitive, *operands, **params)
        if primitive.multiple_results:
            return list(out), [0] * len(out)
        return out, 0
    return rule


for _primitive in (P.cholesky_p, P.solve_p, P.slogdet_p, P.eigh_p, P.qr_p, P.svd_p):
    batch_rules[_primitive] = _matrix_batch(_primitive)
