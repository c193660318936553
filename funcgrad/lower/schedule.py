"""Scheduling: group an IR's equations into fused kernels, tinygrad-style.

The rules (see docs/architecture.md):

* elementwise equations are inlined into every consumer (recomputed, never stored), except a large
  value that several kernels would compute through a gather (div/rem loads: a max-pool's backward
  feeding BatchNorm's backward sums), stored once in the axis order of the largest buffer it reads
  (``_shared_gathers``); a pooling window's reduction over a channels-last image is stored in the
  image's order (``_window_layouts``);
* movement equations (reshape, broadcast_in_dim, transpose, slice, pad, flip, concatenate) become
  index arithmetic on the loads of their operand, not copies;
* a reduction (reduce_* or dot_general) takes its elementwise prologue (everything inlined into
  its input) and its epilogue (elementwise equations consuming it at the same index) into one
  kernel; it is stored when anything else reads it (broadcast back, reshaped, read twice, or fed
  to another reduction);
* a product goes on into its consumer's kernel only through movements that keep its loads affine
  along the columns (``keeps_columns``), and a product with batch or several free/contracting axes
  whose column operand is strided along the columns stores that operand first, in (batch,
  contracting, free) order (``_column_operand_layouts``), so both reach the register tile;
* a transpose of a sum of products whose permutation swaps their free axes is computed as the swapped
  products (``products_in_reader_layout``), stored in the layout the transpose's readers use;
* a value is stored where it must be: outputs, the results of reductions read elsewhere, and the
  operands of *host* equations (primitives without a kernel lowering yet, run by their NumPy
  reference: sort, scatter, gather, cumulative ops, argmax, control flow, fft, and every equation
  with a complex operand or result, ...).

``schedule(ir)`` returns the ordered steps; ``lower/plan.py`` runs them.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.core import IR, Eqn, Literal, ShapedArray, Var
from funcgrad.ir.higher_order import checkpoint_p, custom_jvp_call_p, custom_vjp_call_p, jit_p
from funcgrad.lower import hooks
from funcgrad.lower import kernel as K
from funcgrad.lower.conv import lower_convolutions

ELEMENTWISE = {p.name for p in P.REGISTRY.values() if p.kernel_op is not None} | {
    "select", "convert_element_type", "bitcast_convert_type", "stop_gradient", "name", "iota", "threefry2x32"}
MOVEMENT = {"reshape", "broadcast_in_dim", "transpose", "slice", "pad", "flip", "concatenate"}
MAX_FUSED_SIZE = 160  # equations inlined into one kernel at most; bigger graphs are cut into several
EXPENSIVE = {p.name for p in P.with_cost("divide", "transcendental", "transcendental_no_row_reuse")}
BIJECTIVE = {"reshape", "transpose", "flip"}  # movements that renumber elements without repeating any
REDUCTIONS = {"reduce_sum": "sum", "reduce_prod": "prod", "reduce_max": "max", "reduce_min": "min",
              "dot_general": "sum"}
CALLS = (jit_p, checkpoint_p, custom_jvp_call_p, custom_vjp_call_p)
_LOW_PRECISION = dtypes.LOW_PRECISION


def _touches_complex(eqn: Eqn) -> bool:
    return any(dtypes.is_complex(a.aval.dtype) for a in (*eqn.inputs, *eqn.outputs))


def kind_of(eqn: Eqn) -> str:
    """'elementwise', 'movement', 'reduce' or 'host'. Every equation with a complex operand or result
    is a host step (NumPy computes it): no kernel renderer knows complex types (docs/architecture.md)."""
    name = eqn.primitive.name
    if _touches_complex(eqn):
        return "host"
    if name in ELEMENTWISE:
        return "elementwise"
    if name in MOVEMENT:
        return "movement"
    if name in REDUCTIONS:
        return "reduce"
    return "host"


# --- steps --------------------------------------------------------------------------------------

@attrs.frozen(eq=False)
class KernelStep:
    kernel: K.Kernel
    inputs: tuple[Var, ...]   # the buffers the kernel loads, in buffer-number order
    outputs: tuple[Var, ...]


@attrs.frozen(eq=False)
class HostStep:
    eqn: Eqn


Step = KernelStep | HostStep


# --- inlining calls -----------------------------------------------------------------------------

def inline_calls(ir: IR) -> IR:
    """Replace jit / checkpoint / custom_* calls by their bodies, so fusion crosses them."""
    if not any(e.primitive in CALLS for e in ir.eqns):
        return ir
    substitution: dict[int, Any] = {}

    def resolve(atom: Any) -> Any:
        while isinstance(atom, Var) and atom.id in substitution:
            atom = substitution[atom.id]
        return atom

    eqns: list[Eqn] = []
    for eqn in ir.eqns:
        inputs = [resolve(a) for a in eqn.inputs]
        if eqn.primitive not in CALLS:
            eqns.append(Eqn(eqn.primitive, inputs, eqn.params, eqn.outputs))
            continue
        body = inline_calls(eqn.param_dict["ir"])
        # fresh variables for the body so inlining the same IR twice stays in SSA form
        renamed: dict[int, Any] = {v.id: a for v, a in zip(body.in_vars, inputs)}

        def rename(atom: Any, renamed: dict[int, Any] = renamed) -> Any:
            return renamed.get(atom.id, atom) if isinstance(atom, Var) else atom

        for inner in body.eqns:
            outs = [Var(v.aval) for v in inner.outputs]
            renamed.update((v.id, o) for v, o in zip(inner.outputs, outs))
            for v, o in zip(inner.outputs, outs):
                hooks.renamed(v, o)  # debug_nans: the inlined copy keeps its source line
            eqns.append(Eqn(inner.primitive, [rename(a) for a in inner.inputs], inner.params, outs))
        for out_var, atom in zip(eqn.outputs, body.outputs):
            substitution[out_var.id] = rename(atom)
    return IR(ir.in_vars, eqns, [resolve(a) for a in ir.outputs], ir.const_vars, ir.consts)


# A concatenation of more arrays than this is cut into stored groups of this many: one kernel per
# group, then one joining the groups. A kernel's buffers are its function's arguments (ctypes calls at
# most 1024; WebGPU packs bindings), so thousands of operands cannot be one kernel.
WIDE_CONCATENATE = 64


def split_wide_concatenates(ir: IR) -> tuple[IR, frozenset[int]]:
    """``ir`` with every concatenate of more than ``WIDE_CONCATENATE`` operands joined group by group
    (a tree, so any number of operands works), and the ids of the groups' results, which are stored."""
    if not any(e.primitive is P.concatenate_p and len(e.inputs) > WIDE_CONCATENATE for e in ir.eqns):
        return ir, frozenset()
    eqns: list[Eqn] = []
    groups: set[int] = set()
    for eqn in ir.eqns:
        operands = list(eqn.inputs)
        axis = eqn.param_dict["axis"] if eqn.primitive is P.concatenate_p else None
        while axis is not None and len(operands) > WIDE_CONCATENATE:
            joined: list[Any] = []
            for first in range(0, len(operands), WIDE_CONCATENATE):
                group = operands[first:first + WIDE_CONCATENATE]
                if len(group) == 1:
                    joined.append(group[0])
                    continue
                shape = list(group[0].aval.shape)
                shape[axis] = sum(a.aval.shape[axis] for a in group)
                out = Var(ShapedArray(tuple(shape), eqn.outputs[0].aval.dtype))
                eqns.append(Eqn(P.concatenate_p, group, eqn.params, (out,)))
                groups.add(out.id)
                joined.append(out)
            operands = joined
        eqns.append(eqn if len(operands) == len(eqn.inputs) else Eqn(eqn.primitive, operands, eqn.params, eqn.outputs))
    return IR(ir.in_vars, eqns, ir.outputs, ir.const_vars, ir.consts), frozenset(groups)


# --- deciding what is stored --------------------------------------------------------------------

def _materialized(ir: IR, keep: frozenset[int] = frozenset(), row_reductions: bool = False) -> set[int]:
    """Ids of the vars that are stored in memory (besides inputs and consts); ``keep`` are stored
    whatever their consumers (layouts a lowering pass chose, e.g. ``conv.py``'s). With
    ``row_reductions``, a reduction over trailing axes broadcast back over its own input's shape is
    computed inside the one elementwise kernel that reads it (see ``row_broadcast``)."""
    producer = ir.producers()
    consumers = ir.users()
    stored: set[int] = {a.id for a in ir.outputs if isinstance(a, Var) and a.id in producer} | set(keep)
    for eqn in ir.eqns:
        if kind_of(eqn) == "host":
            stored.update(a.id for a in eqn.inputs if isinstance(a, Var) and a.id in producer)
            stored.update(v.id for v in eqn.outputs)

    # a product reads each element of an operand once per element of the other side's free axes: an
    # operand computed with transcendental functions (softmax's gradient before the output layer's
    # weight gradient) is stored, not recomputed hundreds of times inside the product's loop
    def expensive(var: Var) -> bool:
        seen: set[int] = set()
        stack = [var]
        while stack:
            current = stack.pop()
            if current.id in seen or current.id not in producer or (current is not var and current.id in stored):
                continue
            seen.add(current.id)
            eqn = producer[current.id]
            if kind_of(eqn) not in ("elementwise", "movement"):
                continue
            if eqn.primitive.name in EXPENSIVE or eqn.primitive is P.threefry2x32_p:  # ~130 integer ops
                return True
            stack.extend(a for a in eqn.inputs if isinstance(a, Var))
        return False

    for eqn in ir.eqns:
        if eqn.primitive.name != "dot_general":
            continue
        for operand in eqn.inputs:
            source = operand
            while isinstance(source, Var) and source.id in producer and kind_of(producer[source.id]) == "movement":
                source = producer[source.id].inputs[0]
            if isinstance(source, Var) and source.id in producer and source.id not in stored \
                    and kind_of(producer[source.id]) == "elementwise" and expensive(source):
                stored.add(source.id)

    pending_reduce: dict[int, int] = {}  # var id -> the unstored reduction its kernel would hold (one_round)

    def identity_edge(consumer: Eqn, operand: Var) -> bool:
        """Does ``consumer`` read ``operand`` once per output element, so a reduction in ``operand``
        can be computed inside the consumer's kernel? True for same-shape elementwise ops and for
        the bijective movements (reshape, transpose, flip), which only renumber the elements."""
        if consumer.primitive.name in BIJECTIVE:
            reduction = pending_reduce.get(operand.id)
            return reduction is None or producer[reduction].primitive is not P.dot_general_p \
                or keeps_columns(consumer)
        return kind_of(consumer) == "elementwise" and operand.aval.shape == consumer.outputs[0].aval.shape

    def keeps_columns(movement: Eqn) -> bool:
        """Does a renumbering leave a product's loads affine along the kernel's columns (its last axis)?
        Transposes and flips do, and reshapes that only split axes or keep the last axis as it is; a
        reshape that merges axes into the last one (attention's per-head output, transposed, merged back
        into (batch, seq, width)) would make the product's operands move with the columns through
        div/rem, which the register tile cannot take: the product is stored before it, and the reshape
        is index arithmetic for its readers instead."""
        if movement.primitive.name != "reshape":
            return True
        source, shape = movement.inputs[0].aval.shape, movement.outputs[0].aval.shape
        return _splits_only(source, shape) or (bool(source) and bool(shape) and source[-1] == shape[-1])

    # bound how big one kernel's expression may grow: it is built recursively and compiled whole, and
    # LLVM's optimiser slows down sharply on huge functions. ``members`` are the equations a value
    # would inline (shared parts counted once).
    members: dict[int, frozenset[int]] = {}
    for position, eqn in enumerate(ir.eqns):
        if kind_of(eqn) == "host":
            continue
        inlined = frozenset({position}).union(*(members.get(a.id, frozenset()) for a in eqn.inputs
                                                 if isinstance(a, Var) and a.id not in stored))
        for out in eqn.outputs:
            if len(inlined) > MAX_FUSED_SIZE:
                stored.add(out.id)
            members[out.id] = frozenset() if out.id in stored else inlined

    def users_of(var_id: int) -> list[Eqn]:
        return list({id(e): e for e in consumers.get(var_id, [])}.values())

    def row_broadcast(consumer: Eqn, operand: Var, reduction: int) -> bool:
        """Does broadcast ``consumer`` spread a per-row value of trailing-axes reduction ``reduction``
        back over the reduction's input shape (softmax's sum, layernorm's variance)? Then the
        consumer's kernel can compute the reduction once per row (render_llvm opens the trailing
        output loops after it) instead of storing it and reading it back."""
        if consumer.primitive.name != "broadcast_in_dim":
            return False
        eqn = producer[reduction]
        source = eqn.inputs[0].aval.shape
        axes = tuple(sorted(eqn.param_dict.get("axes", ())))
        kept = len(source) - len(axes)
        if eqn.primitive is P.dot_general_p or not axes or axes != tuple(range(kept, len(source))):
            return False
        if consumer.outputs[0].aval.shape != source:
            return False
        dims = consumer.param_dict["broadcast_dimensions"]
        return all(size == 1 or dim < kept for size, dim in zip(operand.aval.shape, dims))

    def one_round() -> bool:
        """Follow every unstored reduction to its kernel's root; store what cannot share a kernel.
        True when something was stored (what later values carry may then change)."""
        changed = False
        pending_reduce.clear()
        row_source: dict[int, int] = {}  # var id -> the per-row value it carries was broadcast from
        for eqn in ir.eqns:
            if kind_of(eqn) == "host":
                continue
            for out in eqn.outputs:
                source = None
                if kind_of(eqn) == "reduce":
                    carried = [out.id]
                else:
                    edges = [(pending_reduce[a.id], row_source.get(a.id)) for a in eqn.inputs if isinstance(a, Var)
                             and a.id in pending_reduce and identity_edge(eqn, a)
                             and (a.id not in row_source or kind_of(eqn) == "elementwise")]
                    if row_reductions:
                        edges += [(pending_reduce[a.id], a.id) for a in eqn.inputs if isinstance(a, Var)
                                  and a.id in pending_reduce and a.id not in row_source
                                  and row_broadcast(eqn, a, pending_reduce[a.id])]
                    carried = sorted({reduction for reduction, _ in edges})
                    if len(carried) > 1:  # two reductions cannot share one kernel: store all but one
                        rows = {reduction: via for reduction, via in edges if via is not None}
                        if any(reduction in rows for reduction in carried):  # keep one, store the others' sources
                            stored.update(rows.get(reduction, reduction) for reduction in carried[1:])
                            return True
                        stored.update(carried[1:])
                        changed = True
                    source = next((via for reduction, via in edges if carried and reduction == carried[0]
                                   and via is not None), None)
                if out.id in stored or not carried:
                    continue  # a stored value is a kernel root: its reduction ends there
                users = users_of(out.id)
                if source is not None:
                    # a per-row value goes on only through same-shape elementwise ops into one consumer;
                    # anything else (read twice, reshaped, reduced again) stores what was broadcast
                    if len(users) > 1 or any(kind_of(user) != "elementwise" or not identity_edge(user, out)
                                             for user in users):
                        stored.add(source)
                        return True
                    pending_reduce[out.id], row_source[out.id] = carried[0], source
                    continue
                pending_reduce[out.id] = carried[0]
                # read twice, through a broadcast/slice/pad, by a reduction or a host op: store it
                if len(users) > 1 or any(not identity_edge(user, out) and not
                                         (row_reductions and row_broadcast(user, out, carried[0])) for user in users):
                    stored.add(out.id)
                    del pending_reduce[out.id]
                    changed = True
        return changed

    while one_round():  # storing a value can change what later values carry: repeat until stable
        pass
    return stored


def _splits_only(source: Sequence[int], shape: Sequence[int]) -> bool:
    """Does a reshape from ``source`` to ``shape`` only split axes (and add or drop size-1 ones)?"""
    dims = [d for d in shape if d != 1]
    at = 0
    for size in (d for d in source if d != 1):
        product = 1
        while product < size and at < len(dims):
            product *= dims[at]
            at += 1
        if product != size:
            return False
    return at == len(dims)


# --- building kernel expressions ----------------------------------------------------------------

class _KernelBuilder:
    """Builds the expression of one stored var, inlining everything that is not stored."""

    def __init__(self, producer: dict[int, Eqn], stored: Callable[[Var], bool]) -> None:
        self.producer = producer
        self.is_stored = stored
        self.loads: list[Var] = []
        self.memo: dict[tuple[int, tuple[K.KExpr, ...]], K.KExpr] = {}
        self.reduce: tuple[str, tuple[int, ...], K.KExpr] | None = None
        self.reduce_var: int | None = None

    def buffer(self, var: Var) -> int:
        for i, v in enumerate(self.loads):
            if v is var:
                return i
        self.loads.append(var)
        return len(self.loads) - 1

    def value(self, atom: Any, idx: Sequence[K.KExpr], root: bool = False) -> K.KExpr:
        if isinstance(atom, Literal):
            return K.const(atom.value, atom.aval.dtype)
        if not root and (atom.id not in self.producer or self.is_stored(atom)):
            shape = atom.aval.shape
            index = K.flat_index(idx, shape)
            return K.load(self.buffer(atom), index, atom.aval.dtype)
        key = (atom.id, tuple(idx))
        if key not in self.memo:
            eqn = self.producer[atom.id]
            if eqn.primitive is P.threefry2x32_p:  # two results from one hash: both memoised, shared
                for out, word in zip(eqn.outputs, _threefry(self, eqn, list(idx))):
                    self.memo[(out.id, key[1])] = word
            else:
                self.memo[key] = LOWERINGS[eqn.primitive.name](self, eqn, list(idx))
        return self.memo[key]


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """Low-precision floats compute in float32 (as the reference interpreter does)."""
    return dtypes.float32 if dtype in _LOW_PRECISION else dtype


def _operand(b: _KernelBuilder, eqn: Eqn, i: int, idx: Sequence[K.KExpr]) -> K.KExpr:
    atom = eqn.inputs[i]
    if atom.aval.shape == ():  # rank-0 operands broadcast
        return b.value(atom, [])
    return b.value(atom, idx)


def _elementwise(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> K.KExpr:
    out_dtype = eqn.outputs[0].aval.dtype
    args = [_operand(b, eqn, i, idx) for i in range(len(eqn.inputs))]
    name = eqn.primitive.name
    if name in ("stop_gradient", "name"):  # identities (name marks a value for checkpoint policies)
        return args[0]
    if name == "select":
        return K.where(args[0], args[1], args[2])
    if name == "convert_element_type":
        return K.cast(args[0], out_dtype)
    if name == "bitcast_convert_type":
        return K.bitcast(args[0], out_dtype)
    if name == "iota":
        params = eqn.param_dict
        return K.cast(idx[params["dimension"]], out_dtype)
    # low-precision floats: compute in float32, round on the way out
    compute = [K.cast(a, _compute_dtype(a.dtype)) for a in args]
    op = eqn.primitive.kernel_op
    assert op is not None, name  # the primitives without a kernel op are the cases above
    result = K.alu(op, *compute)
    target = out_dtype if op not in K.COMPARISONS else dtypes.bool_
    return K.cast(result, target)


def _threefry(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> tuple[K.KExpr, K.KExpr]:
    """Both words of ``threefry2x32`` at ``idx``: the random bits are computed where they are used."""
    k0, k1, x0, x1 = (_operand(b, eqn, i, idx) for i in range(4))
    return K.threefry2x32(k0, k1, x0, x1)


def _reshape(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> K.KExpr:
    src = eqn.inputs[0].aval.shape
    flat = K.flat_index(idx, eqn.outputs[0].aval.shape)
    return b.value(eqn.inputs[0], unflatten_index(flat, src))


def unflatten_index(flat: K.KExpr, shape: Sequence[int]) -> list[K.KExpr]:
    """The multi-index of C-order position ``flat`` in ``shape`` (div/mod arithmetic)."""
    out = []
    stride = math.prod(shape)
    for size in shape:
        stride //= max(size, 1)
        if size == 1:
            out.append(K.const(0, K.INDEX))
            continue
        index = K.alu("div", flat, K.const(stride, K.INDEX)) if stride != 1 else flat
        out.append(K.alu("rem", index, K.const(size, K.INDEX)))
    return out


def _broadcast(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> K.KExpr:
    params = eqn.param_dict
    src = eqn.inputs[0].aval.shape
    src_idx = [K.const(0, K.INDEX) if src[i] == 1 else idx[d] for i, d in enumerate(params["broadcast_dimensions"])]
    return b.value(eqn.inputs[0], src_idx)


def _transpose(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> K.KExpr:
    perm = eqn.param_dict["permutation"]
    src_idx: list[K.KExpr] = [K.const(0, K.INDEX)] * len(perm)
    for out_axis, src_axis in enumerate(perm):
        src_idx[src_axis] = idx[out_axis]
    return b.value(eqn.inputs[0], src_idx)


def _slice(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> K.KExpr:
    params = eqn.param_dict
    src_idx = [K.alu("add", K.alu("mul", i, K.const(st, K.INDEX)), K.const(s, K.INDEX))
               for i, s, st in zip(idx, params["start"], params["strides"])]
    return b.value(eqn.inputs[0], src_idx)


def _flip(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> K.KExpr:
    shape = eqn.inputs[0].aval.shape
    axes = eqn.param_dict["axes"]
    src_idx = [K.alu("sub", K.const(shape[a] - 1, K.INDEX), i) if a in axes else i for a, i in enumerate(idx)]
    return b.value(eqn.inputs[0], src_idx)


def _pad(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> K.KExpr:
    params = eqn.param_dict
    shape = eqn.inputs[0].aval.shape
    valid: K.KExpr | None = None
    src_idx: list[K.KExpr] = []
    for i, lo, size in zip(idx, params["low"], shape):
        shifted = K.alu("sub", i, K.const(lo, K.INDEX))
        if lo == 0 and params["high"][len(src_idx)] == 0:
            src_idx.append(shifted)
            continue
        inside = K.alu("and", K.alu("ge", shifted, K.const(0, K.INDEX)), K.alu("lt", shifted, K.const(size, K.INDEX)))
        valid = inside if valid is None else K.alu("and", valid, inside)
        # keep the load in bounds where the value is not used
        src_idx.append(K.where(inside, shifted, K.const(0, K.INDEX)))
    inner = b.value(eqn.inputs[0], src_idx) if all(shape) else None
    pad_value = b.value(eqn.inputs[1], [])
    if valid is None:
        return inner if inner is not None else pad_value
    return K.where(valid, inner, pad_value) if inner is not None else pad_value


# Pieces of a concatenation selected by one chain of ``where``s; more pieces are split in halves
# first (a tree of selects on the position), so an expression's depth grows with log(pieces) and
# thousands of pieces neither recurse too deep in the passes over it nor test every boundary.
_CONCAT_CHAIN = 8


def _concatenate(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> K.KExpr:
    axis = eqn.param_dict["axis"]
    offsets = [0] + list(itertools.accumulate(a.aval.shape[axis] for a in eqn.inputs))
    pieces = [(atom, start, stop) for atom, start, stop in zip(eqn.inputs, offsets, offsets[1:]) if start != stop]
    return _select_piece(b, pieces, idx, axis)


def _select_piece(b: _KernelBuilder, pieces: list[tuple[Any, int, int]], idx: list[K.KExpr],
                  axis: int) -> K.KExpr:
    """The value of the concatenation at ``idx``, whose position on ``axis`` lies in ``pieces``."""
    if len(pieces) > _CONCAT_CHAIN:
        half = len(pieces) // 2
        boundary = pieces[half][1]
        in_left = K.alu("lt", idx[axis], K.const(boundary, K.INDEX))
        # each half sees the position clamped into its own range, so its loads stay in bounds
        left_idx, right_idx = list(idx), list(idx)
        left_idx[axis] = K.where(in_left, idx[axis], K.const(pieces[0][1], K.INDEX))
        right_idx[axis] = K.where(in_left, K.const(boundary, K.INDEX), idx[axis])
        return K.where(in_left, _select_piece(b, pieces[:half], left_idx, axis),
                       _select_piece(b, pieces[half:], right_idx, axis))
    result: K.KExpr | None = None
    for atom, start, stop in reversed(pieces):
        src_idx: list[K.KExpr] = list(idx)
        src_idx[axis] = K.alu("sub", idx[axis], K.const(start, K.INDEX))
        if result is None:
            result = b.value(atom, src_idx)
            continue
        inside = K.alu("lt", idx[axis], K.const(stop, K.INDEX))
        # clamp so the load of the unused branch stays in bounds
        src_idx[axis] = K.where(inside, src_idx[axis], K.const(0, K.INDEX))
        result = K.where(inside, b.value(atom, src_idx), result)
    assert result is not None
    return result


def _reduce(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> K.KExpr:
    """Record this reduction as the kernel's reduction; its value in the kernel is ``acc``."""
    if b.reduce is not None:
        raise AssertionError("the scheduler put two reductions in one kernel")
    op = REDUCTIONS[eqn.primitive.name]
    out_dtype = eqn.outputs[0].aval.dtype
    if eqn.primitive is P.dot_general_p:
        reduce_shape, expr = _dot_reduction(b, eqn, idx)
    else:
        axes = eqn.param_dict["axes"]
        src = eqn.inputs[0].aval.shape
        reduce_shape = tuple(src[a] for a in axes)
        kept = iter(idx)
        reduce_vars = iter(K.var(f"r{i}") for i in range(len(axes)))
        src_idx = [next(reduce_vars) if a in axes else next(kept) for a in range(len(src))]
        expr = b.value(eqn.inputs[0], src_idx)
    acc_dtype = _compute_dtype(out_dtype)
    b.reduce = (op, reduce_shape, K.cast(expr, acc_dtype))
    return K.cast(K.acc(acc_dtype), out_dtype)


def _dot_reduction(b: _KernelBuilder, eqn: Eqn, idx: list[K.KExpr]) -> tuple[tuple[int, ...], K.KExpr]:
    params = eqn.param_dict
    (lc, rc), (lb, rb) = params["contracting"], params["batch"]
    lhs, rhs = eqn.inputs[0].aval, eqn.inputs[1].aval
    n_batch = len(lb)
    lhs_free = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
    rhs_free = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
    lhs_idx: list[K.KExpr] = [K.const(0, K.INDEX)] * lhs.ndim
    rhs_idx: list[K.KExpr] = [K.const(0, K.INDEX)] * rhs.ndim
    for k, (dl, dr) in enumerate(zip(lb, rb)):
        lhs_idx[dl] = rhs_idx[dr] = idx[k]
    for k, d in enumerate(lhs_free):
        lhs_idx[d] = idx[n_batch + k]
    for k, d in enumerate(rhs_free):
        rhs_idx[d] = idx[n_batch + len(lhs_free) + k]
    for k, (dl, dr) in enumerate(zip(lc, rc)):
        lhs_idx[dl] = rhs_idx[dr] = K.var(f"r{k}")
    left = b.value(eqn.inputs[0], lhs_idx)
    right = b.value(eqn.inputs[1], rhs_idx)
    compute = _compute_dtype(eqn.outputs[0].aval.dtype)
    product = K.alu("mul", K.cast(left, compute), K.cast(right, compute))
    return tuple(lhs.shape[d] for d in lc), product


LOWERINGS: dict[str, Callable[[_KernelBuilder, Eqn, list[K.KExpr]], K.KExpr]] = {
    **{name: _elementwise for name in ELEMENTWISE},
    "reshape": _reshape, "broadcast_in_dim": _broadcast, "transpose": _transpose, "slice": _slice,
    "flip": _flip, "pad": _pad, "concatenate": _concatenate,
    **{name: _reduce for name in REDUCTIONS},
}


# --- storing values that several kernels would gather ---------------------------------------------

SHARED_MIN_BYTES = 1 << 16  # smaller values are recomputed: an extra kernel costs more than their gathers
SMALL_LOAD_BYTES = 1 << 14  # a buffer this small stays in L1 (a per-channel scale): its loads cost nothing


def _kernel_roots(ir: IR, stored: set[int]) -> dict[int, frozenset[int]]:
    """For every computed var, the stored vars whose kernels compute it (itself if it is stored)."""
    users = ir.users()
    roots: dict[int, frozenset[int]] = {}
    for eqn in reversed(ir.eqns):  # every user comes after its operands' producers
        for out in eqn.outputs:
            if out.id in stored or kind_of(eqn) == "host":
                roots[out.id] = frozenset({out.id})
                continue
            roots[out.id] = frozenset().union(*(roots.get(o.id, frozenset()) for user in users.get(out.id, [])
                                               if kind_of(user) != "host" for o in user.outputs))
    return roots


def _gather_layout(producer: dict[int, Eqn], stored: set[int], var: Var) -> tuple[int, ...] | None:
    """If ``var``'s expression, computed at its own elements, loads a large buffer through div/rem index
    arithmetic (a gather: a pooling window's backward, an upsampling), the axis order to store it in: that
    of the largest buffer it loads (the order its readers will likely read beside it), as the address's
    steps from the origin tell; C order if that buffer does not move with every axis. None if it gathers
    nothing (or carries a reduction)."""
    builder = _KernelBuilder(producer, lambda v: v.id in stored)
    shape = var.aval.shape
    expr = builder.value(var, [K.var(f"g{i}") for i in range(len(shape))], root=True)
    if builder.reduce is not None or expr.op == "load":
        return None  # a reduction's epilogue, or a renumbering of a stored array (a copy computes nothing)
    expr = K.simplify_index(expr, {f"g{i}": d for i, d in enumerate(shape)})
    loads: dict[K.KExpr, None] = {}
    _collect(expr, "load", loads, set())
    large = [load for load in loads if builder.loads[load.arg].aval.size * builder.loads[load.arg].aval.dtype.itemsize
             > SMALL_LOAD_BYTES]
    if not any(_collect(load.args[0], ("div", "rem"), {}, set()) for load in large):
        return None
    widest = max(large, key=lambda load: builder.loads[load.arg].aval.size)
    return _axis_order(widest.args[0], shape, {}) or tuple(range(len(shape)))


def _axis_order(address: K.KExpr, shape: Sequence[int], others: dict[str, int]) -> tuple[int, ...] | None:
    """The output axes sorted by how far ``address`` moves along each (largest step first), from its value at
    the origin (``others`` fixes the other loop variables) and one step along each axis; None when it does
    not move with some axis of more than one element or is not plain index arithmetic."""
    origin = {f"g{i}": 0 for i in range(len(shape))} | others
    base = _index_at(address, origin)
    steps = [_index_at(address, {**origin, f"g{axis}": 1}) for axis in range(len(shape))]
    if base is None or any(step is None for step in steps):
        return None
    strides = [abs(step - base) for step in steps if step is not None]
    if any(stride == 0 and size > 1 for stride, size in zip(strides, shape)):
        return None
    return tuple(sorted(range(len(shape)), key=lambda axis: -strides[axis]))


def _collect(e: K.KExpr, ops: str | tuple[str, ...], found: dict[K.KExpr, None], seen: set[int]) -> dict[K.KExpr, None]:
    """The nodes of ``e`` whose op is in ``ops`` (in first-seen order)."""
    if id(e) in seen:
        return found
    seen.add(id(e))
    if e.op in ((ops,) if isinstance(ops, str) else ops):
        found[e] = None
    for a in e.args:
        _collect(a, ops, found, seen)
    return found


_INDEX_OPS: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: int(a / b) if b else 0, "rem": lambda a, b: a - int(a / b) * b if b else 0,  # as kernels do
    "max": max, "min": min,
    "lt": lambda a, b: int(a < b), "le": lambda a, b: int(a <= b), "gt": lambda a, b: int(a > b),
    "ge": lambda a, b: int(a >= b), "eq": lambda a, b: int(a == b), "ne": lambda a, b: int(a != b),
    "and": lambda a, b: a & b, "or": lambda a, b: a | b}


def _index_at(e: K.KExpr, point: dict[str, int], memo: dict[int, int | None] | None = None) -> int | None:
    """The value of index expression ``e`` at loop variables ``point`` (None if it is not plain index arithmetic).
    ``memo`` (by node identity) keeps a DAG's shared nodes from being walked once per path."""
    if e.op == "const":
        return int(e.arg)
    if e.op == "var":
        return point.get(e.arg)
    memo = {} if memo is None else memo
    if id(e) in memo:
        return memo[id(e)]
    args = [_index_at(a, point, memo) for a in e.args]
    value: int | None
    if any(a is None for a in args):
        value = None
    elif e.op == "where":
        value = args[1] if args[0] else args[2]
    else:
        function = _INDEX_OPS.get(e.op)
        value = None if function is None or len(args) != 2 else function(*args)  # type: ignore[arg-type]
    memo[id(e)] = value
    return value


def _shared_gathers(ir: IR, stored: set[int]) -> dict[int, tuple[int, ...]]:
    """Values to store besides ``stored``, by var id, with the axis order to store each in.

    An elementwise value that several kernels would recompute (the graph branches there: each
    consumer leads to fewer kernels) and that gathers (see ``_gather_layout``) costs each of them the
    gather: div/rem index arithmetic, no vector loads, no register tile, and everything under it
    recomputed per term. BatchNorm's backward after a max-pool is the case: the pool's backward
    (the cotangent gathered per window times the argmax mask, with BatchNorm's output recomputed) feeds
    three per-channel sums and the input gradient. Stored once in the layout of what it reads
    (channels-last there), each reader loads it contiguously; a sum of it becomes a column sum."""
    producer = ir.producers()
    users = ir.users()
    roots = _kernel_roots(ir, stored)
    # div/rem index arithmetic comes only from reshapes that split or merge axes: the values computed
    # from one (through equations not stored) are the only ones worth building an expression for
    regrouped: set[int] = set()
    chosen: dict[int, tuple[int, ...]] = {}
    for eqn in ir.eqns:
        if kind_of(eqn) not in ("elementwise", "movement"):
            continue
        var = eqn.outputs[0]
        if not (eqn.primitive is P.reshape_p and _regroups(eqn.inputs[0].aval.shape, var.aval.shape)) and not any(
                isinstance(a, Var) and a.id in regrouped and a.id not in stored for a in eqn.inputs):
            continue
        regrouped.add(var.id)
        reached = roots.get(var.id, frozenset())
        if var.id in stored or len(reached) < 2 or var.aval.size * var.aval.dtype.itemsize < SHARED_MIN_BYTES:
            continue
        if any(roots.get(o.id) == reached for user in users.get(var.id, []) for o in user.outputs):
            continue  # not where the graph branches: the value goes on whole into one consumer
        order = _gather_layout(producer, stored | set(chosen), var)
        if order is not None:
            chosen[var.id] = order
    return chosen


_LAYOUT_FREE_READERS = ELEMENTWISE | {"broadcast_in_dim", "transpose"}  # they read any layout as cheaply


def _window_layouts(ir: IR, stored: set[int]) -> dict[int, tuple[int, ...]]:
    """Stored window reductions to store in another axis order: var id -> the order of the largest buffer
    they read, when that buffer moves with every output axis in another order than C's.

    A max-pool (or its backward's count of maxima) over a channels-last convolution output otherwise
    writes its result with a stride of H*W, and the readers that pair it with channels-last arrays (the
    pool's backward: ``_shared_gathers``) gather it. Products are not window reductions (their layouts are
    ``conv.py``'s), and a value that a reshape reads keeps C order (the reshape's flat index would
    become a gather)."""
    producer = ir.producers()
    fixed = {a.id for a in ir.outputs if isinstance(a, Var)}
    fixed.update(a.id for eqn in ir.eqns if kind_of(eqn) == "host" for a in eqn.inputs if isinstance(a, Var))
    readers = ir.users()
    carries: set[int] = set()  # vars whose kernel would hold a window reduction
    chosen: dict[int, tuple[int, ...]] = {}
    for eqn in ir.eqns:
        var = eqn.outputs[0]
        window = kind_of(eqn) == "reduce" and eqn.primitive is not P.dot_general_p
        epilogue = kind_of(eqn) == "elementwise" and any(isinstance(a, Var) and a.id in carries
                                                         and a.id not in stored for a in eqn.inputs)
        if window or epilogue:
            carries.add(var.id)
        if var.id not in carries or var.id not in stored or var.id in fixed or var.aval.ndim < 2 \
                or var.aval.size * var.aval.dtype.itemsize < SHARED_MIN_BYTES \
                or any(r.primitive.name not in _LAYOUT_FREE_READERS for r in readers.get(var.id, [])):
            continue
        builder = _KernelBuilder(producer, lambda v: v.id in stored)
        shape = var.aval.shape
        builder.value(var, [K.var(f"g{i}") for i in range(len(shape))], root=True)
        if builder.reduce is None:
            continue
        loads = list(_collect(builder.reduce[2], "load", {}, set()))
        if not loads:
            continue
        widest = max(loads, key=lambda load: builder.loads[load.arg].aval.size)
        order = _axis_order(widest.args[0], shape, {f"r{i}": 0 for i in range(len(builder.reduce[1]))})
        if order is not None and order != tuple(range(len(shape))):
            chosen[var.id] = order
    return chosen


def _regroups(source: Sequence[int], shape: Sequence[int]) -> bool:
    """Does a reshape from ``source`` to ``shape`` split or merge axes (not only add or drop size-1 ones)?"""
    return [d for d in source if d != 1] != [d for d in shape if d != 1]


def _store_in_order(ir: IR, chosen: dict[int, tuple[int, ...]]) -> tuple[IR, set[int]]:
    """``ir`` where each chosen var is stored as ``transpose(var, order)`` and read back through the inverse
    transpose (index arithmetic for its readers); and the ids to store."""
    substitution: dict[int, Var] = {}
    keep: set[int] = set()
    eqns: list[Eqn] = []
    for eqn in ir.eqns:
        inputs = [substitution.get(a.id, a) if isinstance(a, Var) else a for a in eqn.inputs]
        eqns.append(eqn if inputs == list(eqn.inputs) else Eqn(eqn.primitive, inputs, eqn.params, eqn.outputs))
        for out in eqn.outputs:
            order = chosen.get(out.id)
            if order is None:
                continue
            if _keeps_axes(order):
                keep.add(out.id)
                continue
            stored = Var(ShapedArray(tuple(out.aval.shape[a] for a in order), out.aval.dtype))
            inverse = tuple(int(a) for a in np.argsort(order))
            back = Var(out.aval)
            eqns.append(Eqn(P.transpose_p, [out], {"permutation": order}, [stored]))
            eqns.append(Eqn(P.transpose_p, [stored], {"permutation": inverse}, [back]))
            substitution[out.id] = back
            keep.add(stored.id)
    outputs = [substitution.get(a.id, a) if isinstance(a, Var) else a for a in ir.outputs]
    return IR(ir.in_vars, eqns, outputs, ir.const_vars, ir.consts), keep


# --- products whose column operand is strided along the columns ---------------------------------------

PRODUCT_MIN_ROWS = 16  # a copy of the column operand pays off once each of its elements feeds this many rows
PRODUCT_MIN_COLUMNS = 8  # narrower column axes are not vectorised along anyway


def _keeps_axes(order: tuple[int, ...]) -> bool:
    """Whether a stored layout ``order`` (a permutation of the value's axes) is the value's own."""
    return order == tuple(range(len(order)))


def _column_operand_layouts(ir: IR, stored: set[int], products: set[int]) -> dict[int, tuple[int, ...]]:
    """Products whose column operand to store first, in another axis order: eqn position -> the order
    (the operand's batch, contracting, then free axes) of a float32 ``dot_general`` among ``products``
    (the program's own, not ``conv.py``'s, which choose their layouts) whose kernel would load that
    operand with a stride other than 1 along the output's last axis (the columns).

    The register tile reads the column operand as vectors along the columns; a 2-D product over one
    contraction packs a strided one per panel itself (``render_tile._packable``), any other product (with
    batch axes: attention's ``q @ k.T`` per head; several free or contracting axes: ``dY @ W.T`` over
    batch and sequence) would run the plain loops. Stored as (batch, contracting, free), the operand is
    contiguous along the columns, and the copy (one pass over the operand) is paid back by the
    ``rows >= PRODUCT_MIN_ROWS`` multiply-adds each of its elements feeds."""
    producer = ir.producers()
    readers: dict[int, list[Eqn]] = {}
    for other in ir.eqns:
        for atom in other.inputs:
            if isinstance(atom, Var):
                readers.setdefault(atom.id, []).append(other)
    chosen: dict[int, tuple[int, ...]] = {}
    for position, eqn in enumerate(ir.eqns):
        if id(eqn) not in products or eqn.outputs[0].aval.dtype != dtypes.float32:
            continue
        (lc, rc), (lb, rb) = eqn.param_dict["contracting"], eqn.param_dict["batch"]
        lhs, rhs = eqn.inputs[0].aval, eqn.inputs[1].aval
        if eqn.outputs[0].aval.ndim == 2 and len(lc) == 1:
            continue  # the tile packs it (render_tile._packable)
        if len(lc) == 1 and not lb and rhs.ndim == 2 and _consecutive_free(lhs.ndim, lc) \
                and _kernels_merge_to_2d(eqn, stored, producer, readers):
            continue  # 2-D once its kernel merges the lhs's free loops (kernel.merge_loops): the tile packs it
        lhs_free = [d for d in range(lhs.ndim) if d not in lc and d not in lb]
        rhs_free = [d for d in range(rhs.ndim) if d not in rc and d not in rb]
        if not rc or not rhs_free or not isinstance(eqn.inputs[1], Var):
            continue
        column = rhs_free[-1]
        if math.prod(lhs.shape[d] for d in lhs_free) < PRODUCT_MIN_ROWS or rhs.shape[column] < PRODUCT_MIN_COLUMNS:
            continue
        builder = _KernelBuilder(producer, lambda v: v.id in stored)
        expr = builder.value(eqn.inputs[1], [K.var(f"g{d}") for d in range(rhs.ndim)])
        if builder.reduce is not None:
            continue
        expr = K.simplify_index(expr, {f"g{d}": size for d, size in enumerate(rhs.shape)})
        along = K.var(f"g{column}")
        strides = [(K._affine(load.args[0]) or {}).get(along, None) for load in _collect(expr, "load", {}, set())
                   if _depends_on(load.args[0], f"g{column}")]
        if strides and all(stride != 1 for stride in strides):
            chosen[position] = (*rb, *rc, *rhs_free)
    # operands kept in their order are stored first, alone: a product sharing one (a gradient's dY read by
    # dY @ W.T and X.T @ dY) may then merge to 2-D and pack its own operand (the caller looks again)
    kept = {position: order for position, order in chosen.items() if _keeps_axes(order)}
    return kept or chosen


def _kernels_merge_to_2d(eqn: Eqn, stored: set[int], producer: dict[int, Eqn],
                         readers: dict[int, list[Eqn]]) -> bool:
    """Whether every kernel computing ``eqn``'s product (the stored values reached from its output through
    inlined ones; ``readers``: the equations reading each variable) has two loops once its loops merge: an
    epilogue that reads something per batch, not per row (``+ c[:, None, :]``), keeps the loops apart, and
    then the column operand must be stored instead."""
    roots: dict[int, Var] = {}
    todo, seen = [eqn.outputs[0]], set()
    while todo:
        var = todo.pop()
        if var.id in seen:
            continue
        seen.add(var.id)
        if var.id in stored:
            roots[var.id] = var
            continue
        todo += [out for reader in readers.get(var.id, []) for out in reader.outputs]
    return bool(roots) and all(len(_kernel_step(eqn, root, producer, stored).kernel.shape) == 2
                               for root in roots.values())


def _consecutive_free(ndim: int, contracting: Sequence[int]) -> bool:
    free = [d for d in range(ndim) if d not in contracting]
    return free == list(range(free[0], free[0] + len(free))) if free else False


def _depends_on(e: K.KExpr, name: str) -> bool:
    return (e.op == "var" and e.arg == name) or any(_depends_on(a, name) for a in e.args)


def _store_column_operands(ir: IR, chosen: dict[int, tuple[int, ...]]) -> tuple[IR, set[int]]:
    """``ir`` where each chosen product reads its rhs through ``transpose(stored, inverse)`` of a stored
    ``transpose(rhs, order)`` (index arithmetic in the product's kernel); and the ids to store. An order
    that keeps the axes (a computed operand, a gather through reshapes) stores the rhs itself: a copy of
    it would be a second pass over a value stored anyway once a second reader needs it."""
    eqns: list[Eqn] = []
    keep: set[int] = set()
    for position, eqn in enumerate(ir.eqns):
        order = chosen.get(position)
        if order is None:
            eqns.append(eqn)
            continue
        rhs = eqn.inputs[1]
        if _keeps_axes(order) and isinstance(rhs, Var):  # (chosen only for a Var rhs)
            eqns.append(eqn)
            keep.add(rhs.id)
            continue
        copy = Var(ShapedArray(tuple(rhs.aval.shape[a] for a in order), rhs.aval.dtype))
        back = Var(rhs.aval)
        eqns.append(Eqn(P.transpose_p, [rhs], {"permutation": order}, [copy]))
        eqns.append(Eqn(P.transpose_p, [copy], {"permutation": tuple(int(a) for a in np.argsort(order))}, [back]))
        eqns.append(Eqn(eqn.primitive, [eqn.inputs[0], back, *eqn.inputs[2:]], eqn.params, eqn.outputs))
        keep.add(copy.id)
    return IR(ir.in_vars, eqns, ir.outputs, ir.const_vars, ir.consts), keep


# --- a sum of products read through one transpose --------------------------------------------------

_LINEAR = (P.add_p, P.sub_p, P.neg_p)  # what a transpose moves through onto the products below it


def _swapped_product(eqn: Eqn, permutation: tuple[int, ...]) -> bool:
    """Is ``transpose(eqn's product, permutation)`` the product with its operands swapped: batch axes in
    place, then the rhs's free axes, then the lhs's, each group in order?"""
    if eqn.primitive is not P.dot_general_p or not all(isinstance(a, Var) for a in eqn.inputs):
        return False
    (lc, _), (lb, _) = eqn.param_dict["contracting"], eqn.param_dict["batch"]
    nb, nl = len(lb), eqn.inputs[0].aval.ndim - len(lc) - len(lb)
    nr = eqn.outputs[0].aval.ndim - nb - nl
    return nl > 0 and nr > 0 and permutation == (*range(nb), *range(nb + nl, nb + nl + nr), *range(nb, nb + nl))


def _linear_tree(var: Var, permutation: tuple[int, ...], producer: dict[int, Eqn], uses: dict[int, int],
                 dropped: set[int], tree: list[Eqn]) -> int:
    """Collect into ``tree`` the single-use add/sub/neg equations above ``var`` and the swappable products
    at their leaves; the number of those products."""
    source = producer.get(var.id)
    if source is None or uses.get(var.id, 0) != 1 or id(source) in dropped:
        return 0
    if source.primitive in _LINEAR and all(isinstance(a, Var) and a.aval.shape == var.aval.shape
                                           for a in source.inputs):
        tree.append(source)
        return sum(_linear_tree(a, permutation, producer, uses, dropped, tree)
                   for a in source.inputs if isinstance(a, Var))
    if _swapped_product(source, permutation):
        tree.append(source)
        return 1
    return 0


def _emit_transposed(var: Var, out: Var | None, permutation: tuple[int, ...], producer: dict[int, Eqn],
                     inside: set[int], moved: dict[int, Var], emitted: list[Eqn]) -> Var:
    """Append to ``emitted`` the equations computing ``transpose(var, permutation)`` (into ``out`` when
    given): the tree's products swapped, its sums of transposed operands, a transpose of anything else."""
    if var.id in moved:
        return moved[var.id]
    source = producer.get(var.id)
    shape = tuple(var.aval.shape[a] for a in permutation)
    result = out if out is not None else Var(ShapedArray(shape, var.aval.dtype))
    if source is None or id(source) not in inside:
        emitted.append(Eqn(P.transpose_p, [var], {"permutation": permutation}, [result]))
    elif source.primitive is P.dot_general_p:
        (lc, rc), (lb, rb) = source.param_dict["contracting"], source.param_dict["batch"]
        params = {**source.param_dict, "contracting": (rc, lc), "batch": (rb, lb)}
        emitted.append(Eqn(P.dot_general_p, [source.inputs[1], source.inputs[0]], params, [result]))
    else:
        operands = [_emit_transposed(a, None, permutation, producer, inside, moved, emitted)  # type: ignore[arg-type]
                    for a in source.inputs]
        emitted.append(Eqn(source.primitive, operands, source.params, [result]))
    moved[var.id] = result
    return result


def products_in_reader_layout(ir: IR) -> IR:
    """``transpose(p)`` or ``transpose(p1 + p2 - ...)`` of products ``p = dot_general(a, b)``, each read only
    there, whose permutation swaps the lhs's and rhs's free axes, computed as (the sum of) the swapped
    products ``dot_general(b, a)``: the same terms, computed and stored in the layout the transpose's
    readers use. A transpose after the last product of a kernel is fused into it (it iterates over the
    transposed output), but any other product is a stored buffer a later kernel reads through the
    transpose, a stride of a whole row per element: a weight gradient's ``X.T @ dY + (dY.T @ X).T`` in
    a Hessian-vector product, where the transpose rule of ``dot_general`` emits
    ``transpose(dot_general(dY, X))``. Other operands of the sum are read through the transpose as
    before (index arithmetic)."""
    producer = ir.producers()
    uses: dict[int, int] = {}
    for eqn in ir.eqns:
        for a in eqn.inputs:
            if isinstance(a, Var):
                uses[a.id] = uses.get(a.id, 0) + 1
    for a in ir.outputs:
        if isinstance(a, Var):
            uses[a.id] = uses.get(a.id, 0) + 2  # an output is read outside the program: never rewritten
    replaced: dict[int, list[Eqn]] = {}  # id of a transpose -> the equations computing its result instead
    dropped: set[int] = set()  # ids of the equations these make dead
    for eqn in ir.eqns:
        if eqn.primitive is not P.transpose_p or not isinstance(eqn.inputs[0], Var):
            continue
        permutation = tuple(eqn.param_dict["permutation"])
        tree: list[Eqn] = []
        if not _linear_tree(eqn.inputs[0], permutation, producer, uses, dropped, tree):
            continue
        inside = {id(t) for t in tree}
        emitted: list[Eqn] = []
        _emit_transposed(eqn.inputs[0], eqn.outputs[0], permutation, producer, inside, {}, emitted)
        replaced[id(eqn)] = emitted
        dropped |= inside
    if not replaced:
        return ir
    eqns: list[Eqn] = []
    for eqn in ir.eqns:
        if id(eqn) in dropped:
            continue
        eqns.extend(replaced.get(id(eqn), [eqn]))
    return IR(ir.in_vars, eqns, ir.outputs, ir.const_vars, ir.consts)


# --- the schedule -------------------------------------------------------------------------------

_names = itertools.count()


def schedule(ir: IR, row_reductions: bool = False) -> list[Step]:
    """The ordered kernels and host steps computing ``ir`` (after inlining calls and lowering convolutions).
    ``row_reductions``: fuse a trailing-axes reduction into the elementwise pass that broadcasts it back
    (for devices whose renderer computes it once per row: the CPU's; see ``_materialized``)."""
    ir, wide = split_wide_concatenates(inline_calls(ir))
    ir = products_in_reader_layout(ir)
    products = {id(eqn) for eqn in ir.eqns if eqn.primitive is P.dot_general_p}  # the program's, not conv.py's
    ir, keep = lower_convolutions(ir)
    keep = keep | wide
    producer = ir.producers()
    stored = _materialized(ir, keep, row_reductions)
    for _ in range(3):  # a second look once computed operands are stored: a product reading one may merge to 2-D
        operands = _column_operand_layouts(ir, stored, products)
        if not operands:
            break
        # store them (in the product's order), then decide again what the rest inline
        ir, copies = _store_column_operands(ir, operands)
        keep = frozenset(keep | copies)
        producer = ir.producers()
        stored = _materialized(ir, keep, row_reductions)
    shared = _shared_gathers(ir, stored) | _window_layouts(ir, stored)
    if shared:  # store them (in their layouts), then decide again what the rest inline
        ir, extra = _store_in_order(ir, shared)
        producer = ir.producers()
        stored = _materialized(ir, (keep - set(shared)) | extra, row_reductions)
    steps: list[Step] = []
    for eqn in ir.eqns:
        if kind_of(eqn) == "host":
            steps.append(HostStep(eqn))
            continue
        for out in eqn.outputs:
            if out.id not in stored:
                continue
            steps.append(_kernel_step(eqn, out, producer, stored))
    return steps


def _kernel_step(eqn: Eqn, out: Var, producer: dict[int, Eqn], stored: set[int]) -> KernelStep:
    """The kernel computing the stored value ``out`` (of ``eqn``), inlining every value not ``stored``."""
    builder = _KernelBuilder(producer, lambda v: v.id in stored)
    shape = out.aval.shape
    idx = [K.var(f"g{i}") for i in range(len(shape))]
    if out.aval.size == 0:  # nothing to compute (and nothing may be loaded)
        value = K.const(0, out.aval.dtype)
    else:
        value = K.cast(builder.value(out, idx, root=True), out.aval.dtype)
    reduce_op, reduce_shape, reduce_expr = builder.reduce or (None, (), None)
    kernel = K.simplify_kernel(K.Kernel(name=_kernel_name(eqn, reduce_op), shape=shape,
                      in_avals=tuple(v.aval for v in builder.loads), out_avals=(out.aval,),
                      outputs=(value,), reduce_shape=reduce_shape, reduce_op=reduce_op,
                      reduce_expr=reduce_expr))
    return KernelStep(kernel, tuple(builder.loads), (out,))


def _kernel_name(eqn: Eqn, reduce_op: str | None) -> str:
    shape = "_".join(str(d) for d in eqn.outputs[0].aval.shape) or "scalar"
    kind = f"r_{reduce_op}" if reduce_op else "E"
    return f"{kind}_{shape}"
