"""Lowering convolutions: each ``conv_general_dilated`` becomes movement equations and one ``dot_general``.

Runs on the IR right before scheduling (``schedule.schedule``), so the transforms see one primitive
(short rules whose transposes are again convolutions) and the compiler needs no kernel of its own:

* lhs: dilated (reshape, pad, reshape, slice) and padded; a dilated lhs, or a padded one of a spatial-last
  product, is *stored*, so the product reads a plain array instead of testing bounds per element. A
  channels-last product over a padded (undilated) lhs reads the lhs itself and sums ``where(inside,
  x * w, -0.0)`` (``_masked_product``): the register tile bounds its loops to the terms inside, so no
  multiply-add is spent on the padding (30-44% of a 'full' convolution's: an input gradient's);
* a window view per spatial axis (length L -> (kernel, out)) built from broadcast, reshape and strided
  slices whose indices the kernel simplifier turns into affine loads (no im2col buffer);
* one ``dot_general`` in the layout that lets the CPU renderer run its fast i-k-j loop order (the last
  output axis has >= ``FAST_ROW`` elements and an operand is contiguous along it):

  - *channels-last* when a group has >= ``FAST_ROW`` output channels: out (N, *out_spatial, Og) with the
    kernel stored as (Cg, *K, Og). The product is stored and transposed to NCHW by its readers' index
    arithmetic. A long contraction (a weight gradient sums over the batch and the image) is split into
    chunks of the feature axis, summed afterwards, so each chunk's operands stay in cache;
  - *spatial-last* otherwise: out (Og, N, *out_spatial), the window view contiguous along the last axis.

  Channels-last rows of 32 run much faster than spatial-last rows of 20-24 (docs/performance.md);
* operands computed by something other than movement (a ReLU, a cotangent carrying the pooling and norm
  backward passes) are stored once instead of being recomputed at every window element.

``lower_convolutions(ir)`` returns the new IR and the ids of the values the schedule must store.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.core import IR, Eqn, Literal, ShapedArray, Var

FAST_ROW = 16  # render_loops.reduce_outer: the i-k-j order needs a last output axis of at least this length
SPLIT_REDUCTION = 16384  # contractions longer than this are split along the feature axis (split-K)
CHUNK_REDUCTION = 4096  # ... into chunks of at least this many terms


def lower_convolutions(ir: IR) -> tuple[IR, frozenset[int]]:
    """``ir`` with every conv_general_dilated replaced by its lowering, and the var ids to store."""
    if not any(e.primitive is P.conv_general_dilated_p for e in ir.eqns):
        return ir, frozenset()
    builder = _Builder()
    producer = ir.producers()
    for eqn in ir.eqns:
        if eqn.primitive is P.conv_general_dilated_p:
            for operand in eqn.inputs:
                source = _computed_source(operand, producer)
                if source is not None:
                    builder.stored.add(source.id)
            _lower_conv(builder, eqn)
        else:
            builder.eqns.append(eqn)
    return IR(ir.in_vars, builder.eqns, ir.outputs, ir.const_vars, ir.consts), frozenset(builder.stored)


_RENUMBERING = (P.reshape_p, P.transpose_p, P.flip_p, P.slice_p)
_MOVEMENT = (P.broadcast_in_dim_p, P.pad_p, P.concatenate_p) + _RENUMBERING


def _computed_source(operand: Any, producer: dict[int, Eqn]) -> Var | None:
    """The value an operand renumbers (through reshapes, transposes, flips, slices) when an equation
    other than a movement computes it: such an operand is stored once, not recomputed at every
    window element (a cotangent carrying the pooling and norm backward passes, a ReLU before a conv)."""
    while isinstance(operand, Var) and operand.id in producer:
        eqn = producer[operand.id]
        if eqn.primitive not in _RENUMBERING:
            return operand if eqn.primitive not in _MOVEMENT else None
        operand = eqn.inputs[0]
    return None


class _Builder:
    """Appends equations (types from the shape rules) and remembers which values to store."""

    def __init__(self) -> None:
        self.eqns: list[Eqn] = []
        self.stored: set[int] = set()

    def bind(self, primitive: P.Primitive, *inputs: Any, out: Var | None = None, **params: Any) -> Var:
        aval = primitive.shape_rule(*(a.aval for a in inputs), **params)
        var = out if out is not None else Var(aval)
        assert var.aval == aval, (var.aval, aval)
        self.eqns.append(Eqn(primitive, inputs, params, [var]))
        return var

    def reshape(self, x: Var, shape: Sequence[int], out: Var | None = None) -> Var:
        if tuple(shape) == x.aval.shape and out is None:
            return x
        return self.bind(P.reshape_p, x, new_sizes=tuple(shape), out=out)

    def transpose(self, x: Var, permutation: Sequence[int], out: Var | None = None) -> Var:
        if tuple(permutation) == tuple(range(x.aval.ndim)) and out is None:
            return x
        return self.bind(P.transpose_p, x, permutation=tuple(permutation), out=out)

    def slice_axis(self, x: Var, axis: int, start: int, stop: int, step: int = 1) -> Var:
        shape = x.aval.shape
        if (start, stop, step) == (0, shape[axis], 1):
            return x
        starts, limits, strides = [0] * len(shape), list(shape), [1] * len(shape)
        starts[axis], limits[axis], strides[axis] = start, stop, step
        return self.bind(P.slice_p, x, start=tuple(starts), limit=tuple(limits), strides=tuple(strides))

    def pad_axis(self, x: Var, axis: int, low: int, high: int) -> Var:
        if low == high == 0:
            return x
        lows, highs = [0] * x.aval.ndim, [0] * x.aval.ndim
        lows[axis], highs[axis] = low, high
        zero = Literal.of(x.aval.dtype.type(0))
        return self.bind(P.pad_p, x, zero, low=tuple(lows), high=tuple(highs))


def _lower_conv(b: _Builder, eqn: Eqn) -> None:
    params = eqn.param_dict
    if any(d > 1 for d in params["lhs_dilation"]) and all(s == 1 for s in params["window_strides"]) \
            and all(d == 1 for d in params["rhs_dilation"]):
        _phase_convolutions(b, eqn)
        return
    lhs, rhs = eqn.inputs
    assert isinstance(lhs, Var) and isinstance(rhs, Var)  # literals are scalars; convolutions take rank >= 3
    params = eqn.param_dict
    out_var = eqn.outputs[0]
    batch, out_channels = out_var.aval.shape[:2]
    out_spatial = out_var.aval.shape[2:]
    _, group_in, *kernel = rhs.aval.shape
    groups = params["feature_group_count"]
    per_group = out_channels // groups
    spatial = len(kernel)

    # a channels-last product skips the lhs's zero padding (see _masked_product); others read it stored
    masked = per_group >= FAST_ROW and all(d == 1 for d in params["lhs_dilation"])
    x, valid = _dilated_padded(b, lhs, params["lhs_dilation"], params["padding"], masked)
    for i in range(spatial):  # (N, C, *S) -> (N, C, K1, O1, K2, O2, ...); the mask (*S) -> (K1, O1, K2, O2, ...)
        window = (kernel[i], params["window_strides"][i], params["rhs_dilation"][i], out_spatial[i])
        x = _window_axis(b, x, 2 + 2 * i, *window)
        if valid is not None:
            valid = _window_axis(b, valid, 2 * i, *window)
    # (N, [G,] Cg, K1, O1, ...): axis numbers of the view after splitting the groups
    grouped = groups > 1
    g_axis, c_axis = (1, 2) if grouped else (None, 1)
    first_k = c_axis + 1
    win = b.reshape(x, (batch,) + ((groups,) if grouped else ()) + (group_in,) + x.aval.shape[2:])
    k_axes = [first_k + 2 * i for i in range(spatial)]

    if per_group >= FAST_ROW:
        _channels_last_product(b, win, rhs, out_var, groups, g_axis, c_axis, k_axes, valid)
    else:
        _spatial_last_product(b, win, rhs, out_var, groups, g_axis, c_axis, k_axes)


def _phase_convolutions(b: _Builder, eqn: Eqn) -> None:
    """A stride-1 convolution of an lhs dilated by s (a strided convolution's input gradient) as the s^d
    convolutions of the undilated lhs, one per output phase, interleaved: output ``y = s * Y + p`` only
    meets the kernel taps ``k = k0 + s * m`` with ``k0 = (low - p) mod s`` (the others land on the
    inserted zeros), at lhs element ``Y + m + (p + k0 - low) / s``. The dilated lhs would spend
    ``1 - 1/s^d`` of the multiply-adds on zeros (3 of 4 for a stride-2 3x3 convolution's gradient)."""
    lhs, rhs = eqn.inputs
    assert isinstance(lhs, Var) and isinstance(rhs, Var)
    params = eqn.param_dict
    out_var = eqn.outputs[0]
    dilation, padding = params["lhs_dilation"], params["padding"]
    lengths, kernel, out = lhs.aval.shape[2:], rhs.aval.shape[2:], out_var.aval.shape[2:]
    spatial = len(kernel)
    dtype = out_var.aval.dtype
    lead = out_var.aval.shape[:2]
    longest = [-(-o // s) for o, s in zip(out, dilation)]  # phase 0's length: every other phase's or one more

    def phase_piece(phase: tuple[int, ...]) -> Var:
        """Phase ``phase``'s outputs (N, O, *longest), padded at the end to the longest phase's length."""
        taps, pads, sizes = [], [], []
        for i, p in enumerate(phase):
            s, (low, _) = dilation[i], padding[i]
            size = -(-(out[i] - p) // s) if out[i] > p else 0
            first = (low - p) % s
            count = len(range(first, kernel[i], s))
            low_p = -((p + first - low) // s)
            taps.append((first, count))
            pads.append((low_p, size + count - 1 - lengths[i] - low_p))
            sizes.append(size)
        shape = (*lead, *sizes)
        if any(count == 0 for _, count in taps) or any(size == 0 for size in sizes):
            piece = b.bind(P.broadcast_in_dim_p, Literal.of(dtype.type(0)), shape=shape, broadcast_dimensions=())
        else:
            w = rhs
            for i, (first, count) in enumerate(taps):
                w = b.slice_axis(w, 2 + i, first, first + dilation[i] * (count - 1) + 1, dilation[i])
            piece = Var(ShapedArray(shape, dtype))
            _lower_conv(b, Eqn(P.conv_general_dilated_p, [lhs, w],
                               {**params, "padding": tuple(pads), "lhs_dilation": (1,) * spatial}, [piece]))
        for i, size in enumerate(sizes):
            piece = b.pad_axis(piece, 2 + i, 0, longest[i] - size)
        # (N, O, *longest) -> (N, O, L1, 1, L2, 1, ...): a unit axis after each spatial axis for its phase
        return b.reshape(piece, (*lead, *(d for length in longest for d in (length, 1))))

    def interleaved(axis: int, prefix: tuple[int, ...]) -> Var:
        """The phases from ``prefix`` on along spatial axis ``axis`` and the later ones, concatenated
        along each spatial axis's phase axis: (N, O, L1, s1, L2, s2, ...) for ``axis`` 0."""
        if axis == spatial:
            return phase_piece(prefix)
        parts = [interleaved(axis + 1, (*prefix, p)) for p in range(dilation[axis])]
        return parts[0] if len(parts) == 1 else b.bind(P.concatenate_p, *parts, axis=3 + 2 * axis)

    whole = interleaved(0, ())
    whole = b.reshape(whole, (*lead, *(length * s for length, s in zip(longest, dilation))))
    for i, size in enumerate(out):
        whole = b.slice_axis(whole, 2 + i, 0, size)
    b.bind(P.reshape_p, whole, new_sizes=out_var.aval.shape, out=out_var)


def _dilated_padded(b: _Builder, x: Var, dilation: Sequence[int], padding: Sequence[tuple[int, int]],
                    masked: bool = False) -> tuple[Var, Var | None]:
    """The lhs with ``dilation - 1`` zeros between elements and padded (negative pads crop), and None;
    stored when it is more than a crop of the lhs. With ``masked`` (and no dilation) the padding is not
    stored: the padded lhs is index arithmetic, returned with a bool mask of its spatial shape that is
    False on the padding."""
    original = x
    grown = False
    for i, (d, (low, high)) in enumerate(zip(dilation, padding)):
        axis = 2 + i
        if d > 1:  # (.., L, ..) -> (.., L, 1, ..) -> pad to (.., L, d, ..) -> flatten -> crop (L - 1) * d + 1
            shape = x.aval.shape
            length = shape[axis]
            x = b.reshape(x, shape[:axis + 1] + (1,) + shape[axis + 1:])
            x = b.pad_axis(x, axis + 1, 0, d - 1)
            x = b.reshape(x, shape[:axis] + (length * d,) + shape[axis + 1:])
            x = b.slice_axis(x, axis, 0, (length - 1) * d + 1)
            grown = True
        size = x.aval.shape[axis]
        x = b.slice_axis(x, axis, max(-low, 0), size - max(-high, 0))
        x = b.pad_axis(x, axis, max(low, 0), max(high, 0))
        grown = grown or low > 0 or high > 0
    if not grown or x is original:
        return x, None
    if not masked:
        b.stored.add(x.id)
        return x, None
    inside = tuple(size - max(-low, 0) - max(-high, 0) for size, (low, high) in zip(original.aval.shape[2:], padding))
    valid = b.bind(P.broadcast_in_dim_p, Literal.of(np.bool_(True)), shape=inside, broadcast_dimensions=())
    for axis, (low, high) in enumerate(padding):
        valid = b.pad_axis(valid, axis, max(low, 0), max(high, 0))
    return x, valid


def _window_axis(b: _Builder, x: Var, axis: int, kernel: int, stride: int, dilation: int, out: int) -> Var:
    """Replace ``axis`` (length L) by (kernel, out) with value ``x[o * stride + j * dilation]`` at (j, o):
    the axis repeated, flattened and re-read in rows of L + dilation (tinygrad's pool trick)."""
    shape = x.aval.shape
    length = shape[axis]
    before, after = shape[:axis], shape[axis + 1:]
    if kernel == 1:
        x = b.slice_axis(x, axis, 0, (out - 1) * stride + 1, stride)
        return b.reshape(x, before + (1, out) + after)
    row = length + dilation
    repeats = -(-kernel * row // length)
    x = b.bind(P.broadcast_in_dim_p, x, shape=before + (repeats, length) + after,
               broadcast_dimensions=tuple(range(axis)) + tuple(range(axis + 1, len(shape) + 1)))
    x = b.reshape(x, before + (repeats * length,) + after)
    x = b.slice_axis(x, axis, 0, kernel * row)
    x = b.reshape(x, before + (kernel, row) + after)
    return b.slice_axis(x, axis + 1, 0, (out - 1) * stride + 1, stride)


def _spatial_last_product(b: _Builder, win: Var, rhs: Var, out_var: Var, groups: int, g_axis: int | None,
                          c_axis: int, k_axes: list[int]) -> None:
    """out (G, Og, N, *O) = w (G, Og, Cg, *K) . window view, contracted in the order (*K, Cg): the last
    contracted axis then has no unit stride, so the renderer runs i-k-j with the last output axis innermost."""
    out_channels, group_in, *kernel = rhs.aval.shape
    w = b.reshape(rhs, ((groups,) if g_axis is not None else ()) + (out_channels // groups, group_in, *kernel))
    w_first_k = 3 if g_axis is not None else 2
    w_contract = tuple(w_first_k + i for i in range(len(kernel))) + (w_first_k - 1,)
    product = b.bind(P.dot_general_p, w, win, contracting=(w_contract, tuple(k_axes) + (c_axis,)),
                     batch=((0,), (g_axis,)) if g_axis is not None else ((), ()))
    spatial = len(kernel)
    if g_axis is None:  # (Og, N, *O) -> (N, O, *O)
        b.transpose(product, (1, 0) + tuple(range(2, 2 + spatial)), out=out_var)
        return
    moved = b.transpose(product, (2, 0, 1) + tuple(range(3, 3 + spatial)))  # (N, G, Og, *O)
    b.reshape(moved, out_var.aval.shape, out=out_var)


def _channels_last_product(b: _Builder, win: Var, rhs: Var, out_var: Var, groups: int, g_axis: int | None,
                           c_axis: int, k_axes: list[int], valid: Var | None = None) -> None:
    """out (N, *O, Og) = window view . w' with the kernel stored as w' (G, Cg, *K, Og), contiguous along
    the output's last axis; contracted in the order (Cg, *K). Long contractions are split along Cg.
    Axes are tracked by label: n, g, c (or chunk, c), k0, o0, k1, o1, ..., og."""
    out_channels, group_in, *kernel = rhs.aval.shape
    spatial = len(kernel)
    per_group = out_channels // groups
    w = b.reshape(rhs, (groups, per_group, group_in, *kernel))
    w = b.transpose(w, (0, 2) + tuple(range(3, 3 + spatial)) + (1,))  # (G, Cg, *K, Og)
    w_labels = ["g", "c"] + [f"k{i}" for i in range(spatial)] + ["og"]
    if g_axis is None:
        w = b.reshape(w, w.aval.shape[1:])
        w_labels.remove("g")
    b.stored.add(w.id)
    win_labels = ["n"] + (["g"] if g_axis is not None else []) + ["c"]
    win_labels += [label for i in range(spatial) for label in (f"k{i}", f"o{i}")]
    assert win_labels.index("c") == c_axis and [win_labels.index(f"k{i}") for i in range(spatial)] == k_axes

    chunks = _chunk_count(group_in, int(np.prod(kernel))) if group_in * int(np.prod(kernel)) > SPLIT_REDUCTION else 1
    if chunks > 1:  # split Cg into (chunk, Cg / chunk); the chunk axis becomes a batch axis of the product
        win = b.reshape(win, win.aval.shape[:c_axis] + (chunks, group_in // chunks) + win.aval.shape[c_axis + 1:])
        w_c = w_labels.index("c")
        w = b.reshape(w, w.aval.shape[:w_c] + (chunks, group_in // chunks) + w.aval.shape[w_c + 1:])
        win_labels.insert(c_axis, "chunk")
        w_labels.insert(w_c, "chunk")
    batch, last_spatial = out_var.aval.shape[0], out_var.aval.shape[-1]
    if last_spatial % 2 and batch % 2 == 0:
        # the renderer computes output rows in pairs along the second-to-last output axis: with an odd
        # last spatial extent (a weight gradient's kernel width) make N that axis, so no row is left alone
        order = [i for i, label in enumerate(win_labels) if label != "n"] + [win_labels.index("n")]
        win = b.transpose(win, order)
        win_labels = [win_labels[i] for i in order]
    batch_labels = [label for label in ("chunk", "g") if label in win_labels]
    contract_labels = ["c"] + [f"k{i}" for i in range(spatial)]
    labels = batch_labels + [label for label in win_labels if label not in contract_labels + batch_labels] + ["og"]
    if valid is not None:
        mask_labels = [label for i in range(spatial) for label in (f"k{i}", f"o{i}")]
        product = _masked_product(b, (win, win_labels), (w, w_labels), (valid, mask_labels), labels, contract_labels)
    else:
        product = b.bind(P.dot_general_p, win, w,
                         contracting=(tuple(win_labels.index(label) for label in contract_labels),
                                      tuple(w_labels.index(label) for label in contract_labels)),
                         batch=(tuple(win_labels.index(label) for label in batch_labels),
                                tuple(w_labels.index(label) for label in batch_labels)))
    b.stored.add(product.id)
    if chunks > 1:
        product = b.bind(P.reduce_sum_p, product, axes=(labels.index("chunk"),))
        labels.remove("chunk")
    final = ["n"] + (["g"] if g_axis is not None else []) + ["og"] + [f"o{i}" for i in range(spatial)]
    permutation = [labels.index(label) for label in final]
    if g_axis is None:
        b.transpose(product, permutation, out=out_var)
        return
    b.reshape(b.transpose(product, permutation), out_var.aval.shape, out=out_var)


def _masked_product(b: _Builder, lhs: tuple[Var, list[str]], rhs: tuple[Var, list[str]], mask: tuple[Var, list[str]],
                    out_labels: list[str], contract_labels: list[str]) -> Var:
    """The product of ``lhs`` and ``rhs`` (each a value with its axis labels) summed over
    ``contract_labels``, counting only the terms where ``mask`` is True: ``sum(select(mask, lhs * rhs,
    -0.0))``, in the axis order ``out_labels``. A term on the lhs's padding is left out rather than
    multiplied by zero (-0.0 is the sum's identity: the other terms sum bit for bit as before, and an
    inf or NaN in the kernel does not reach the outputs through the padding, as in PyTorch's input
    gradients), and the register tile (render_tile) bounds its loops to the valid terms."""
    full = out_labels + contract_labels
    sizes = {label: size for value, labels in (lhs, rhs, mask) for label, size in zip(labels, value.aval.shape)}
    shape = tuple(sizes[label] for label in full)

    def spread(value: Var, labels: list[str]) -> Var:  # transposed into ``full``'s order and broadcast to it
        present = [label for label in full if label in labels]
        value = b.transpose(value, [labels.index(label) for label in present])
        return b.bind(P.broadcast_in_dim_p, value, shape=shape,
                      broadcast_dimensions=tuple(full.index(label) for label in present))

    dtype = lhs[0].aval.dtype
    compute = dtypes.float32 if dtype in dtypes.LOW_PRECISION else dtype  # as dot_general's
    x, y = (spread(value, labels) for value, labels in (lhs, rhs))
    if compute != dtype:
        x, y = (b.bind(P.convert_element_type_p, v, new_dtype=compute) for v in (x, y))
    identity = Literal.of(compute.type(-0.0 if dtypes.is_float(compute) else 0))
    terms = b.bind(P.select_p, spread(*mask), b.bind(P.mul_p, x, y), identity)
    out = b.bind(P.reduce_sum_p, terms, axes=tuple(range(len(out_labels), len(full))))
    return out if compute == dtype else b.bind(P.convert_element_type_p, out, new_dtype=dtype)


def _chunk_count(features: int, per_feature: int) -> int:
    """How many chunks to split ``features`` into: each chunk (a divisor) holds at least
    ``CHUNK_REDUCTION`` terms of the contraction."""
    for size in range(1, features + 1):
        if features % size == 0 and size * per_feature >= CHUNK_REDUCTION:
            return features // size
    return 1
