"""Scan rewrites: products that need not run once per step leave the loop (a plan applies them first).

A scan's body runs ``length`` times on a step's worth of data: a product of a 32-row slice costs a kernel
launch and runs far below the speed of the same product over all the rows at once. Two rules move such
work out of the loop, each exact in real arithmetic (float rounding differs as a sum's order does):

- **Products of the inputs** (``hoist``): a ``dot_general`` of an ``xs`` slice and a const (the RNN's
  ``x_t @ U``) is computed for every step before the loop, as one product over the stacked ``xs``; the
  body reads its row as a new ``xs`` slice.
- **Sums of products over the steps** (``accumulate``): a carry that only accumulates,
  ``acc = acc + dot_general(a, b)`` (optionally transposed) or ``acc = acc + reduce_sum(a)``, read by
  nothing else, is what a scan's backward does with every weight's gradient. The carry goes; ``a`` and
  ``b`` become ``ys`` (or are the stacked ``xs`` already), and after the loop one product contracts the
  step axis too: ``acc_final = acc_init + dot_general(A, B)`` with the step axis added to the contracting
  dimensions (merged into the leading contracted axis when the step's product contracts both operands'
  leading axes, so the product is the 2-D one it was, only longer). The per-step weight-gradient products
  (a contraction over the batch only) become one contraction over batch and time.

- **Inputs kept as outputs** (``pass_through``): a ``y`` that is the step's ``xs`` slice (the forward of a
  scan keeping ``x_t`` for its backward) is the stacked ``xs`` operand itself; the output is replaced by
  the operand and the per-step copy of the row goes.

- **Elementwise producers of the inputs** (``sink``): an elementwise equation outside the loop making an
  ``xs`` operand read by nothing else (a scan's backward gets its per-step cotangents so, ``2 * h_t / n``
  from a mean's gradient) moves into the body, on the rows of its own stacked operands (scalar literals,
  broadcast or not, stay literals): the body's kernels fuse it, and the stacked operand is neither
  written nor read again.

All apply to a fixed point, and to nested scans (each body is compiled as a plan of its own, which
rewrites its scans in turn). ``MAX_STACKED_BYTES`` bounds the memory a rule may add (the stacked operands
or products); a scan whose operands would exceed it keeps the work in its loop.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from funcgrad.ir.core import IR, Eqn, Literal, ShapedArray, Var
from funcgrad.ir.higher_order import scan_p
from funcgrad.ir.primitives import add_p, broadcast_in_dim_p, dot_general_p, reduce_sum_p, reshape_p, transpose_p

MAX_STACKED_BYTES = 256 << 20  # memory a rewrite may add per stacked value (the loop's own ys are not counted)


def rewrite_scans(ir: IR) -> IR:
    """``ir`` with every scan equation rewritten by the rules above (unchanged when none applies)."""
    if not any(eqn.primitive is scan_p for eqn in ir.eqns):
        return ir
    eqns: list[Eqn] = []
    changed = False
    same: dict[int, Any] = {}  # an outer scan output -> the outer value it equals (``_pass_through``)
    uses = _outer_uses(ir)
    for eqn in ir.eqns:
        if same and any(isinstance(a, Var) and a.id in same for a in eqn.inputs):
            eqn = Eqn(eqn.primitive, [_renamed(a, same) for a in eqn.inputs], eqn.params, eqn.outputs)
        if eqn.primitive is not scan_p:
            eqns.append(eqn)
            continue
        loop = _Loop.of(eqn)
        before: list[Eqn] = []
        after: list[Eqn] = []
        while _hoist(loop, before) or _accumulate(loop, after) or _pass_through(loop, same, uses) \
                or _sink(loop, eqns, uses, before + after):
            changed = True
        eqns += before + [loop.equation()] + after
    if not changed:
        return ir
    outputs = [_renamed(a, same) for a in ir.outputs]
    return IR(ir.in_vars, _without_dead_broadcasts(eqns, outputs), outputs, ir.const_vars, ir.consts)


def _outer_uses(ir: IR) -> dict[int, int]:
    """How many times each variable of ``ir`` is read (by its equations and as an output)."""
    count: dict[int, int] = {}
    for atom in [a for e in ir.eqns for a in e.inputs] + list(ir.outputs):
        if isinstance(atom, Var):
            count[atom.id] = count.get(atom.id, 0) + 1
    return count


def _without_dead_broadcasts(eqns: list[Eqn], outputs: Sequence[Any]) -> list[Eqn]:
    """``eqns`` less the broadcasts of a literal that ``_sink`` left unread."""
    read = {a.id for e in eqns for a in e.inputs if isinstance(a, Var)} | {a.id for a in outputs if isinstance(a, Var)}
    return [e for e in eqns if not (_literal_broadcast(e) is not None and e.outputs[0].id not in read)]


def _literal_broadcast(eqn: Eqn) -> Literal | None:
    """The scalar literal ``eqn`` broadcasts, when it is a broadcast of one."""
    if eqn.primitive is broadcast_in_dim_p and isinstance(eqn.inputs[0], Literal) and eqn.inputs[0].aval.shape == ():
        return eqn.inputs[0]
    return None


def _sink(loop: _Loop, eqns: list[Eqn], uses: dict[int, int], added: list[Eqn]) -> bool:
    """Move one elementwise equation making an ``xs`` operand, read by nothing else, into the body (see the
    module docstring); ``eqns`` are the outer equations so far (its producer is removed from them), ``added``
    those the other rules put around the loop (an operand they read stays)."""
    read_around = {a.id for e in added for a in e.inputs if isinstance(a, Var)}
    producer = {v.id: (position, e) for position, e in enumerate(eqns) for v in e.outputs}
    broadcast_of = {e.outputs[0].id: literal for e in eqns if (literal := _literal_broadcast(e)) is not None}
    for index, (outer, row) in enumerate(loop.xs):
        if not isinstance(outer, Var) or uses.get(outer.id) != 1 or outer.id not in producer \
                or outer.id in read_around or sum(x is outer for x, _ in loop.xs) != 1:
            continue
        position, eqn = producer[outer.id]
        if eqn.primitive.kernel_op is None or len(eqn.outputs) != 1 or eqn.primitive is scan_p:
            continue
        operands: list[Any] = []
        fresh: list[tuple[Any, Var]] = []
        slice_of = {x.id: v for x, v in loop.xs if isinstance(x, Var)}
        for atom in eqn.inputs:
            if isinstance(atom, Literal) and atom.aval.shape == ():
                operands.append(atom)
            elif isinstance(atom, Var) and atom.id in broadcast_of:
                literal = broadcast_of[atom.id]
                operands.append(Literal(literal.value, literal.aval))
            elif isinstance(atom, Var) and atom.aval.shape == outer.aval.shape:
                if atom.id not in slice_of:
                    slice_of[atom.id] = Var(ShapedArray(atom.aval.shape[1:], atom.aval.dtype))
                    fresh.append((atom, slice_of[atom.id]))
                operands.append(slice_of[atom.id])
            else:
                break
        else:
            if not any(isinstance(atom, Var) for atom in operands):
                continue  # literals only: in the body the equation would make a scalar, not the row
            del loop.xs[index]
            loop.xs += fresh
            loop.eqns.insert(0, Eqn(eqn.primitive, operands, eqn.params, [row]))
            del eqns[position]
            return True
    return False


def _renamed(atom: Any, same: dict[int, Any]) -> Any:
    return same.get(atom.id, atom) if isinstance(atom, Var) else atom


@attrs.define
class _Loop:
    """A scan equation taken apart, to edit: each operand with its variable in the body."""

    consts: list[tuple[Any, Var]]                 # (outer operand, body input)
    carry: list[tuple[Any, Var, Any, Var]]        # (outer init, body input, body output, outer output)
    xs: list[tuple[Any, Var]]                     # (outer stacked operand, body slice input)
    ys: list[tuple[Any, Var]]                     # (body output, outer stacked output)
    eqns: list[Eqn]
    length: int
    reverse: bool

    @staticmethod
    def of(eqn: Eqn) -> _Loop:
        p = eqn.param_dict
        body: IR = p["body"]
        nc, nk = p["num_consts"], p["num_carry"]
        ins, outs = list(eqn.inputs), list(eqn.outputs)
        return _Loop(consts=list(zip(ins[:nc], body.in_vars[:nc])),
                     carry=list(zip(ins[nc:nc + nk], body.in_vars[nc:nc + nk], body.outputs[:nk], outs[:nk])),
                     xs=list(zip(ins[nc + nk:], body.in_vars[nc + nk:])),
                     ys=list(zip(body.outputs[nk:], outs[nk:])),
                     eqns=list(body.eqns), length=p["length"], reverse=p["reverse"])

    def equation(self) -> Eqn:
        body = IR([v for _, v in self.consts] + [k[1] for k in self.carry] + [v for _, v in self.xs],
                  self.eqns, [k[2] for k in self.carry] + [y for y, _ in self.ys])
        return Eqn(scan_p, [c for c, _ in self.consts] + [k[0] for k in self.carry] + [x for x, _ in self.xs],
                   {"body": body, "length": self.length, "reverse": self.reverse,
                    "num_consts": len(self.consts), "num_carry": len(self.carry)},
                   [k[3] for k in self.carry] + [v for _, v in self.ys])

    def uses(self) -> dict[int, int]:
        """How many times each body variable is read (by equations and as a body output)."""
        count: dict[int, int] = {}
        for atom in [a for e in self.eqns for a in e.inputs] + [k[2] for k in self.carry] + [y for y, _ in self.ys]:
            if isinstance(atom, Var):
                count[atom.id] = count.get(atom.id, 0) + 1
        return count

    def stacked_bytes(self, aval: ShapedArray) -> int:
        return self.length * aval.size * aval.dtype.itemsize


def _shifted(axes: Sequence[int]) -> tuple[int, ...]:
    return tuple(a + 1 for a in axes)


def _hoist(loop: _Loop, before: list[Eqn]) -> bool:
    """Move one product of an ``xs`` slice and a const out of the loop (see the module docstring)."""
    const_of = {v.id: outer for outer, v in loop.consts if not isinstance(outer, Literal)}
    stacked_of = {v.id: outer for outer, v in loop.xs}
    for position, eqn in enumerate(loop.eqns):
        if eqn.primitive is not dot_general_p or not all(isinstance(a, Var) for a in eqn.inputs):
            continue
        lhs, rhs = (atom for atom in eqn.inputs if isinstance(atom, Var))
        (lc, rc), (lb, rb) = eqn.param_dict["contracting"], eqn.param_dict["batch"]
        out = eqn.outputs[0]
        if loop.stacked_bytes(out.aval) > MAX_STACKED_BYTES:
            continue
        if lhs.id in stacked_of and rhs.id in const_of:
            operands = [stacked_of[lhs.id], const_of[rhs.id]]
            contracting, batch = (_shifted(lc), tuple(rc)), (_shifted(lb), tuple(rb))
            step_axis = len(lb)  # the step axis is lhs's first free dimension
        elif lhs.id in const_of and rhs.id in stacked_of:
            operands = [const_of[lhs.id], stacked_of[rhs.id]]
            contracting, batch = (tuple(lc), _shifted(rc)), (tuple(lb), _shifted(rb))
            step_axis = len(lb) + lhs.aval.ndim - len(lc) - len(lb)  # after the batch and lhs's free dims
        else:
            continue
        shape = list(out.aval.shape)
        shape.insert(step_axis, loop.length)
        product = Var(ShapedArray(tuple(shape), out.aval.dtype))
        before.append(Eqn(dot_general_p, operands, {"contracting": contracting, "batch": batch}, [product]))
        if step_axis:
            order = (step_axis, *(i for i in range(len(shape)) if i != step_axis))
            rows = Var(ShapedArray(tuple(shape[i] for i in order), out.aval.dtype))
            before.append(Eqn(transpose_p, [product], {"permutation": order}, [rows]))
            product = rows
        del loop.eqns[position]
        loop.xs.append((product, out))  # the product's variable is now the body's slice of it
        return True
    return False


def _accumulate(loop: _Loop, after: list[Eqn]) -> bool:
    """Replace one accumulating carry by a product over all steps after the loop (see the module docstring)."""
    producer = {v.id: e for e in loop.eqns for v in e.outputs}
    uses = loop.uses()
    consts = {v.id for _, v in loop.consts}
    stacked_of = {v.id: outer for outer, v in loop.xs}

    def sole_producer(atom: Any) -> Eqn | None:
        """The equation making ``atom`` when that is all ``atom`` is read for (once)."""
        if not isinstance(atom, Var) or uses.get(atom.id) != 1:
            return None
        return producer.get(atom.id)

    for j, (init, acc_in, acc_out, final) in enumerate(loop.carry):
        add = sole_producer(acc_out)
        if add is None or add.primitive is not add_p or uses.get(acc_in.id) != 1:
            continue
        left, right = add.inputs
        term = right if left is acc_in else left if right is acc_in else None
        chain = [add]
        source = sole_producer(term)
        permutation = None
        if source is not None and source.primitive is transpose_p:
            permutation = source.param_dict["permutation"]
            chain.append(source)
            source = sole_producer(source.inputs[0])
        if source is None or source.primitive not in (dot_general_p, reduce_sum_p):
            continue
        operands = [a for a in source.inputs if isinstance(a, Var)]
        if len(operands) != len(source.inputs) or any(a.id in consts for a in operands) \
                or any(loop.stacked_bytes(a.aval) > MAX_STACKED_BYTES for a in operands if a.id not in stacked_of):
            continue
        chain.append(source)
        stacked = []
        for operand in operands:
            if operand.id in stacked_of:
                stacked.append(stacked_of[operand.id])
                continue
            rows = next((outer for y, outer in loop.ys if y is operand), None)
            if rows is None:
                rows = Var(ShapedArray((loop.length, *operand.aval.shape), operand.aval.dtype))
                loop.ys.append((operand, rows))
            stacked.append(rows)
        loop.eqns = [e for e in loop.eqns if all(e is not c for c in chain)]
        del loop.carry[j]
        total = Var(source.outputs[0].aval)
        if source.primitive is dot_general_p:
            (lc, rc), (lb, rb) = source.param_dict["contracting"], source.param_dict["batch"]
            if (0, 0) in zip(lc, rc):  # the step's product contracts both leading axes: merge the step axis in
                merged = []
                for rows in stacked:
                    flat = Var(ShapedArray((loop.length * rows.aval.shape[1], *rows.aval.shape[2:]), rows.aval.dtype))
                    after.append(Eqn(reshape_p, [rows], {"new_sizes": flat.aval.shape}, [flat]))
                    merged.append(flat)
                after.append(Eqn(dot_general_p, merged, {"contracting": (tuple(lc), tuple(rc)),
                                                         "batch": (tuple(lb), tuple(rb))}, [total]))
            else:
                after.append(Eqn(dot_general_p, stacked, {"contracting": ((0, *_shifted(lc)), (0, *_shifted(rc))),
                                                          "batch": (_shifted(lb), _shifted(rb))}, [total]))
        else:
            after.append(Eqn(reduce_sum_p, stacked, {"axes": (0, *_shifted(source.param_dict["axes"]))}, [total]))
        if permutation is not None and isinstance(term, Var):
            moved = Var(term.aval)
            after.append(Eqn(transpose_p, [total], {"permutation": permutation}, [moved]))
            total = moved
        after.append(Eqn(add_p, [init, total], {}, [final]))
        return True
    return False


def _pass_through(loop: _Loop, same: dict[int, Any], uses: dict[int, int]) -> bool:
    """Drop one ``y`` that is the step's ``xs`` slice itself (a scan keeping its input rows as residuals for
    its backward): its stacked output is that ``xs`` operand, row for row in either direction, so readers of
    the output read the operand (``same``; ``uses`` counts their reads as the operand's) and the loop no
    longer copies the row every step."""
    slice_of = {v.id: outer for outer, v in loop.xs}
    for position, (y, stacked) in enumerate(loop.ys):
        outer = slice_of.get(y.id) if isinstance(y, Var) else None
        if isinstance(outer, Var) and outer.aval.shape == stacked.aval.shape and outer.aval.dtype == stacked.aval.dtype:
            del loop.ys[position]
            same[stacked.id] = outer
            uses[outer.id] = uses.get(outer.id, 0) + uses.get(stacked.id, 0)  # ``_sink`` must leave it outside
            return True
    return False
