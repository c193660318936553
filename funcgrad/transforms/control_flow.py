"""Transformation rules of the control-flow primitives: cond, while and scan.

Each rule transforms the sub-IRs and binds the same primitive again, so control flow stays
control flow after jvp, partial evaluation, transposition and vmap:

* jvp: differentiate the bodies; loops find the carries that get a tangent by a fixed point.
* partial evaluation (reverse mode): split each body into a known and an unknown part. cond gives
  every branch the same residuals (zeros for the others'); scan emits its per-step residuals as
  extra stacked outputs and passes loop-invariant ones as constants. while_loop has no split: its
  transpose raises and points to scan / fori_loop.
* transpose: cond transposes each branch; scan runs the transposed body in the other direction,
  accumulating the cotangents of its constants in the carry.
* vmap: a batched cond predicate becomes a select over every branch's result; a batched while
  predicate runs until every lane is done, freezing finished lanes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from funcgrad.core.tensor import Tensor, bind, evaluate
from funcgrad.core.trace import trace_avals
from funcgrad.ir.core import IR, Eqn, ShapedArray, Var
from funcgrad.ir.higher_order import cond_p, merge_consts, open_ir, scan_p, while_p
from funcgrad.ir.primitives import add_p, broadcast_in_dim_p, eq_p, reduce_max_p, select_p
from funcgrad.transforms.batching import batch_rules, broadcast_batched, move_axis, vmap_eval, vmap_ir
from funcgrad.transforms.jvp import instantiate, jvp_ir, jvp_rules, zeros
from funcgrad.transforms.partial_eval import partial_eval, pe_rules
from funcgrad.transforms.transpose import is_undefined, transpose_ir, transpose_rules


def _reorder_inputs(ir: IR, order: Sequence[int]) -> IR:
    """``ir`` whose inputs are ``ir.in_vars[order[0]], ir.in_vars[order[1]], ...``."""
    return IR([ir.in_vars[i] for i in order], ir.eqns, ir.outputs, ir.const_vars, ir.consts)


def _reorder_outputs(ir: IR, order: Sequence[int]) -> IR:
    return IR(ir.in_vars, ir.eqns, [ir.outputs[i] for i in order], ir.const_vars, ir.consts)


def _fixed_point(initial: list[bool], step: Any) -> list[bool]:
    """Grow a mask until ``step(mask)`` adds nothing (loop carries reached by tangents/unknowns)."""
    mask = list(initial)
    while True:
        grown = [a or b for a, b in zip(mask, step(mask))]
        if grown == mask:
            return mask
        mask = grown


# --- cond ---------------------------------------------------------------------------------------

def _cond_jvp(primals: list[Any], tangents: list[Any], *, branches: tuple[IR, ...]) -> tuple[Any, Any]:
    index, operands, op_tangents = primals[0], primals[1:], tangents[1:]
    has = [t is not None for t in op_tangents]
    union = [any(flags) for flags in zip(*(jvp_ir(b, has)[1] for b in branches))]
    transformed = [jvp_ir(b, has, instantiate_outputs=union)[0] for b in branches]
    merged, consts = merge_consts(transformed)
    outs = bind(cond_p, index, *consts, *operands, *(t for t in op_tangents if t is not None),
                branches=tuple(merged))
    n = len(branches[0].outputs)
    supplied = iter(outs[n:])
    return list(outs[:n]), [next(supplied) if u else None for u in union]


def _cond_partial_eval(eqn: Eqn, unknown: Sequence[bool]) -> tuple[list[Eqn], list[Eqn], list[bool]]:
    if unknown[0]:  # an unknown branch index: everything waits
        return [], [eqn], [True] * len(eqn.outputs)
    branches: tuple[IR, ...] = eqn.param_dict["branches"]
    ops_unknown = list(unknown[1:])
    out_unknown = [any(flags) for flags in zip(*(partial_eval(b, ops_unknown)[2] for b in branches))]
    splits = [partial_eval(b, ops_unknown, instantiate=out_unknown) for b in branches]
    residual_avals = [[a.aval for a in known.outputs[len(known.outputs) - n:]] for known, _, _, n in splits]
    num_known_out = sum(not u for u in out_unknown)

    known_branches = []
    for i, (known, _, _, n_res) in enumerate(splits):
        def run(*args: Tensor, known: IR = known, i: int = i, n_res: int = n_res) -> list[Any]:
            outs = evaluate(known, *args)
            padded: list[Any] = list(outs[:num_known_out])
            for j, avals in enumerate(residual_avals):
                padded += list(outs[num_known_out:]) if j == i else [zeros(a) for a in avals]
            return padded
        known_branches.append(trace_avals(run, list(known.in_avals), "partial_eval(cond)"))
    known_merged, known_consts = merge_consts(known_branches)
    assert not known_consts, "known cond branches captured constants"

    all_residuals = [Var(a) for avals in residual_avals for a in avals]
    unknown_branches = []
    offset = 0
    for _, unknown_ir, _, n_res in splits:
        others_before = [Var(r.aval) for r in all_residuals[:offset]]
        others_after = [Var(r.aval) for r in all_residuals[offset + n_res:]]
        in_vars = list(unknown_ir.in_vars)
        unknown_branches.append(IR(others_before + in_vars[:n_res] + others_after + in_vars[n_res:],
                                   unknown_ir.eqns, unknown_ir.outputs))
        offset += n_res

    known_inputs = [eqn.inputs[0]] + [a for a, u in zip(eqn.inputs[1:], ops_unknown) if not u]
    unknown_inputs = [eqn.inputs[0]] + all_residuals + [a for a, u in zip(eqn.inputs[1:], ops_unknown) if u]
    known_outs = [v for v, u in zip(eqn.outputs, out_unknown) if not u]
    unknown_outs = [v for v, u in zip(eqn.outputs, out_unknown) if u]
    known_eqn = Eqn(cond_p, known_inputs, {"branches": tuple(known_merged)}, known_outs + all_residuals)
    unknown_eqn = Eqn(cond_p, unknown_inputs, {"branches": tuple(unknown_branches)}, unknown_outs)
    return [known_eqn], [unknown_eqn], out_unknown


def _cond_transpose(cts: list[Any], index: Any, *operands: Any, branches: tuple[IR, ...]) -> list[Any]:
    linear = [is_undefined(op) for op in operands]
    cts = [instantiate(ct, aval) for ct, aval in zip(cts, branches[0].out_avals)]
    merged, consts = merge_consts([transpose_ir(b, linear) for b in branches])
    values = [op for op in operands if not is_undefined(op)]
    results = iter(bind(cond_p, index, *consts, *values, *cts, branches=tuple(merged)))
    return [None] + [next(results) if lin else None for lin in linear]


def _cond_batch(args: list[Any], dims: list[Any], *, axis_size: int, branches: tuple[IR, ...]) -> tuple[Any, Any]:
    index, operands = args[0], args[1:]
    index_dim, op_dims = dims[0], dims[1:]
    n_out = len(branches[0].outputs)
    if index_dim is None:
        batched = [vmap_ir(b, op_dims, axis_size, out_dims=[0] * n_out)[0] for b in branches]
        merged, consts = merge_consts(batched)
        return list(bind(cond_p, index, *consts, *operands, branches=tuple(merged))), [0] * n_out
    # a batched predicate: compute every branch, then select per lane
    index = broadcast_batched(index, index_dim, axis_size)
    results = []
    for branch in branches:
        outs, out_dims = vmap_eval(branch, operands, op_dims, axis_size)
        results.append([broadcast_batched(o, d, axis_size)
                         for o, d in zip(outs, out_dims)])
    chosen = results[-1]
    for i in range(len(branches) - 2, -1, -1):
        is_i = bind(eq_p, index, _int32(i))
        chosen = [bind(select_p, bind(broadcast_in_dim_p, is_i, shape=o.shape, broadcast_dimensions=(0,)), o, c)
                  for o, c in zip(results[i], chosen)]
    return chosen, [0] * n_out


def _int32(value: int) -> Any:
    import numpy as np
    return np.int32(value)


jvp_rules[cond_p] = _cond_jvp
pe_rules[cond_p] = _cond_partial_eval
transpose_rules[cond_p] = _cond_transpose
batch_rules[cond_p] = _cond_batch

# --- while --------------------------------------------------------------------------------------


def _while_jvp(primals: list[Any], tangents: list[Any], *, cond_ir: IR, body_ir: IR, cond_nconsts: int,
               body_nconsts: int) -> tuple[Any, Any]:
    nc, nb = cond_nconsts, body_nconsts
    cond_consts, body_consts, carry = primals[:nc], primals[nc:nc + nb], primals[nc + nb:]
    body_tangents, carry_tangents = tangents[nc:nc + nb], tangents[nc + nb:]
    const_has = [t is not None for t in body_tangents]
    carry_has = _fixed_point([t is not None for t in carry_tangents],
                             lambda mask: jvp_ir(body_ir, const_has + mask)[1])
    body_jvp = jvp_ir(body_ir, const_has + carry_has, instantiate_outputs=carry_has)[0]
    # body_jvp inputs: consts, carry, const tangents, carry tangents -> want consts + tangents, carry + tangents
    n_jc, n_ct = len(body_jvp.consts), sum(const_has)
    opened = open_ir(body_jvp)
    nk = len(carry)
    order = (list(range(n_jc)) + [n_jc + i for i in range(nb)] + [n_jc + nb + nk + i for i in range(n_ct)]
             + [n_jc + nb + i for i in range(nk)] + [n_jc + nb + nk + n_ct + i for i in range(sum(carry_has))])
    new_body = _reorder_inputs(opened, order)
    new_cond = IR(list(cond_ir.in_vars) + [Var(a.aval) for a, h in zip(carry, carry_has) if h],
                  cond_ir.eqns, cond_ir.outputs)
    carry_t = [instantiate(t, _aval(c)) for t, c, h in zip(carry_tangents, carry, carry_has) if h]
    outs = bind(while_p, *cond_consts, *body_jvp.consts, *body_consts,
                *(t for t in body_tangents if t is not None), *carry, *carry_t,
                cond_ir=new_cond, body_ir=new_body, cond_nconsts=nc, body_nconsts=n_jc + nb + n_ct)
    supplied = iter(outs[nk:])
    return list(outs[:nk]), [next(supplied) if h else None for h in carry_has]


def _aval(value: Any) -> ShapedArray:
    if isinstance(value, Tensor):
        return value.aval
    return ShapedArray((), value.dtype)


def _while_transpose(cts: Any, *operands: Any, **params: Any) -> list[Any]:
    raise NotImplementedError("reverse-mode differentiation does not work for lax.while_loop (its number of "
                              "steps is only known at run time); use lax.scan, or lax.fori_loop with Python-int "
                              "bounds, which can be differentiated in reverse mode")


def _while_batch(args: list[Any], dims: list[Any], *, axis_size: int, cond_ir: IR, body_ir: IR,
                 cond_nconsts: int, body_nconsts: int) -> tuple[Any, Any]:
    nc, nb = cond_nconsts, body_nconsts
    cond_consts, body_consts, carry = args[:nc], args[nc:nc + nb], args[nc + nb:]
    cc_dims, bc_dims, carry_dims = dims[:nc], dims[nc:nc + nb], dims[nc + nb:]
    carry_batched = _fixed_point([d is not None for d in carry_dims], lambda mask: [
        d is not None for d in vmap_ir(body_ir, bc_dims + [0 if m else None for m in mask], axis_size)[1]])
    _, pred_dims = vmap_ir(cond_ir, cc_dims + [0 if m else None for m in carry_batched], axis_size)
    if pred_dims[0] is not None:
        carry_batched = [True] * len(carry)
    carry = [broadcast_batched(c, d, axis_size) if b else c
             for c, d, b in zip(carry, carry_dims, carry_batched)]
    carry_in_dims = [0 if b else None for b in carry_batched]
    if pred_dims[0] is None:
        new_cond = open_ir(vmap_ir(cond_ir, cc_dims + carry_in_dims, axis_size)[0])
        new_body_closed = vmap_ir(body_ir, bc_dims + carry_in_dims, axis_size, out_dims=carry_in_dims)[0]
        outs = bind(while_p, *cond_consts, *new_body_closed.consts, *body_consts, *carry, cond_ir=new_cond,
                    body_ir=open_ir(new_body_closed), cond_nconsts=nc,
                    body_nconsts=len(new_body_closed.consts) + nb)
        return list(outs), carry_in_dims
    # batched predicate: loop while any lane runs; finished lanes keep their values
    const_avals = [_aval(c) for c in cond_consts + body_consts]
    carry_avals = [_aval(c) for c in carry]

    def any_lane(*values: Tensor) -> list[Any]:
        (pred,), (pred_dim,) = vmap_eval(cond_ir, list(values[:nc]) + list(values[nc:]), cc_dims + carry_in_dims,
                                         axis_size)
        return [bind(reduce_max_p, broadcast_batched(pred, pred_dim, axis_size), axes=(0,))]

    def masked_body(*values: Tensor) -> list[Any]:
        cc, bc, state = values[:nc], values[nc:nc + nb], values[nc + nb:]
        (pred,), (pred_dim,) = vmap_eval(cond_ir, list(cc) + list(state), cc_dims + carry_in_dims, axis_size)
        pred = broadcast_batched(pred, pred_dim, axis_size)
        new, new_dims = vmap_eval(body_ir, list(bc) + list(state), bc_dims + carry_in_dims, axis_size)
        out = []
        for old, value, dim in zip(state, new, new_dims):
            value = broadcast_batched(value, dim, axis_size)
            mask = bind(broadcast_in_dim_p, pred, shape=old.shape, broadcast_dimensions=(0,))
            out.append(bind(select_p, mask, value, old))
        return out

    new_cond = trace_avals(any_lane, const_avals[:nc] + carry_avals, "vmap(while cond)")
    new_body = trace_avals(masked_body, const_avals + carry_avals, "vmap(while body)")
    outs = bind(while_p, *new_cond.consts, *cond_consts, *new_body.consts, *cond_consts, *body_consts, *carry,
                cond_ir=open_ir(new_cond), body_ir=open_ir(new_body), cond_nconsts=len(new_cond.consts) + nc,
                body_nconsts=len(new_body.consts) + nc + nb)
    return list(outs), [0] * len(carry)


jvp_rules[while_p] = _while_jvp
transpose_rules[while_p] = _while_transpose
batch_rules[while_p] = _while_batch

# --- scan ---------------------------------------------------------------------------------------


def _scan_split(values: Sequence[Any], num_consts: int, num_carry: int) -> tuple[list[Any], list[Any], list[Any]]:
    return (list(values[:num_consts]), list(values[num_consts:num_consts + num_carry]),
            list(values[num_consts + num_carry:]))


def _scan_jvp(primals: list[Any], tangents: list[Any], *, body: IR, length: int, reverse: bool, num_consts: int,
              num_carry: int) -> tuple[Any, Any]:
    consts, carry, xs = _scan_split(primals, num_consts, num_carry)
    const_t, carry_t, xs_t = _scan_split(tangents, num_consts, num_carry)
    const_has, xs_has = [t is not None for t in const_t], [t is not None for t in xs_t]
    carry_has = _fixed_point([t is not None for t in carry_t],
                             lambda mask: jvp_ir(body, const_has + mask + xs_has)[1][:num_carry])
    n_y = len(body.outputs) - num_carry
    body_jvp, out_has = jvp_ir(body, const_has + carry_has + xs_has,
                               instantiate_outputs=carry_has + [False] * n_y)
    y_has = out_has[num_carry:]
    n_jc, nc, nk, nx = len(body_jvp.consts), num_consts, num_carry, len(xs)
    n_ct, n_kt, n_xt = sum(const_has), sum(carry_has), sum(xs_has)
    # opened inputs: jvp consts, consts, carry, xs, const tangents, carry tangents, xs tangents
    base = n_jc + nc + nk + nx
    order = (list(range(n_jc)) + list(range(n_jc, n_jc + nc)) + list(range(base, base + n_ct))
             + list(range(n_jc + nc, n_jc + nc + nk)) + list(range(base + n_ct, base + n_ct + n_kt))
             + list(range(n_jc + nc + nk, base)) + list(range(base + n_ct + n_kt, base + n_ct + n_kt + n_xt)))
    new_body = _reorder_inputs(open_ir(body_jvp), order)
    # outputs: carry, ys, carry tangents, y tangents -> carry, carry tangents, ys, y tangents
    n_yt = sum(y_has)
    out_order = (list(range(nk)) + list(range(nk + n_y, nk + n_y + n_kt)) + list(range(nk, nk + n_y))
                 + list(range(nk + n_y + n_kt, nk + n_y + n_kt + n_yt)))
    new_body = _reorder_outputs(new_body, out_order)
    carry_tangents = [instantiate(t, _aval(c)) for t, c, h in zip(carry_t, carry, carry_has) if h]
    outs = bind(scan_p, *body_jvp.consts, *consts, *(t for t in const_t if t is not None), *carry, *carry_tangents,
                *xs, *(t for t in xs_t if t is not None), body=new_body, length=length, reverse=reverse,
                num_consts=n_jc + nc + n_ct, num_carry=nk + n_kt)
    out_carry, out_carry_t = list(outs[:nk]), iter(outs[nk:nk + n_kt])
    ys, ys_t = list(outs[nk + n_kt:nk + n_kt + n_y]), iter(outs[nk + n_kt + n_y:])
    return out_carry + ys, ([next(out_carry_t) if h else None for h in carry_has]
                            + [next(ys_t) if h else None for h in y_has])


def _scan_partial_eval(eqn: Eqn, unknown: Sequence[bool]) -> tuple[list[Eqn], list[Eqn], list[bool]]:
    params = eqn.param_dict
    body: IR = params["body"]
    nc, nk = params["num_consts"], params["num_carry"]
    const_u, carry_u, xs_u = _scan_split(list(unknown), nc, nk)
    carry_u = _fixed_point(carry_u, lambda mask: partial_eval(body, const_u + mask + xs_u)[2][:nk])
    n_y = len(body.outputs) - nk
    flags = const_u + carry_u + xs_u
    known, unknown_ir, out_unknown, n_res = partial_eval(body, flags, instantiate=carry_u + [False] * n_y)
    y_u = out_unknown[nk:]
    residuals = list(known.outputs[len(known.outputs) - n_res:])
    known_const_vars = [v for v, u in zip(body.in_vars[:nc], const_u) if not u]
    known_const_ids = {v.id: i for i, v in enumerate(known_const_vars)}
    # loop-invariant residuals (known consts) are passed as consts; the rest are stacked per step
    invariant = [r for r in residuals if isinstance(r, Var) and r.id in known_const_ids]
    stacked = [r for r in residuals if not (isinstance(r, Var) and r.id in known_const_ids)]
    n_known_out = len(known.outputs) - n_res
    known_body = IR(known.in_vars, known.eqns, list(known.outputs[:n_known_out]) + stacked)
    known_carry_n = sum(not u for u in carry_u)
    const_atoms, carry_atoms, xs_atoms = _scan_split(list(eqn.inputs), nc, nk)
    out_carry_vars, out_y_vars = eqn.outputs[:nk], eqn.outputs[nk:]
    stacked_vars = [Var(ShapedArray((params["length"],) + r.aval.shape, r.aval.dtype)) for r in stacked]
    known_eqn = Eqn(scan_p, [a for a, u in zip(const_atoms, const_u) if not u]
                    + [a for a, u in zip(carry_atoms, carry_u) if not u]
                    + [a for a, u in zip(xs_atoms, xs_u) if not u],
                    {**params, "body": known_body, "num_consts": sum(not u for u in const_u),
                     "num_carry": known_carry_n},
                    [v for v, u in zip(out_carry_vars, carry_u) if not u]
                    + [v for v, u in zip(out_y_vars, y_u) if not u] + stacked_vars)
    # unknown body inputs: residuals (in order), unknown consts, unknown carry, unknown xs
    res_vars = list(unknown_ir.in_vars[:n_res])
    res_index = {r.id: i for i, r in enumerate(residuals) if isinstance(r, Var)}
    invariant_inputs = [res_vars[res_index[r.id]] for r in invariant if isinstance(r, Var)]
    stacked_inputs = [res_vars[res_index[r.id]] for r in stacked if isinstance(r, Var)]
    rest = list(unknown_ir.in_vars[n_res:])
    n_cu, n_ku = sum(const_u), sum(carry_u)
    unknown_body = IR(invariant_inputs + rest[:n_cu] + rest[n_cu:n_cu + n_ku] + stacked_inputs + rest[n_cu + n_ku:],
                      unknown_ir.eqns, unknown_ir.outputs)
    invariant_atoms = [const_atoms[[v.id for v in body.in_vars[:nc]].index(r.id)] for r in invariant]
    unknown_eqn = Eqn(scan_p, invariant_atoms + [a for a, u in zip(const_atoms, const_u) if u]
                      + [a for a, u in zip(carry_atoms, carry_u) if u] + stacked_vars
                      + [a for a, u in zip(xs_atoms, xs_u) if u],
                      {**params, "body": unknown_body, "num_consts": len(invariant) + n_cu, "num_carry": n_ku},
                      [v for v, u in zip(out_carry_vars, carry_u) if u] + [v for v, u in zip(out_y_vars, y_u) if u])
    return [known_eqn], [unknown_eqn], carry_u + y_u


def _scan_transpose(cts: list[Any], *operands: Any, body: IR, length: int, reverse: bool, num_consts: int,
                    num_carry: int) -> list[Any]:
    consts, carry, xs = _scan_split(list(operands), num_consts, num_carry)
    # A defined carry here is an instantiated zero tangent (a known initial value of a carry that later
    # becomes linear): the scan is linear in it all the same, and its own cotangent is not needed.
    carry_defined = [not is_undefined(c) for c in carry]
    const_lin = [is_undefined(c) for c in consts]
    xs_lin = [is_undefined(x) for x in xs]
    body_t = transpose_ir(body, const_lin + [True] * num_carry + xs_lin)
    # body_t: (defined consts, defined xs slices, carry cts, y cts) -> (linear const cts, carry cts, linear xs cts)
    defined_consts = [c for c in consts if not is_undefined(c)]
    defined_xs = [x for x in xs if not is_undefined(x)]
    lin_const_avals = [c.aval for c in consts if is_undefined(c)]
    carry_avals = list(body.out_avals[:num_carry])
    y_avals = list(body.out_avals[num_carry:])
    ct_carry = [instantiate(ct, a) for ct, a in zip(cts[:num_carry], carry_avals)]
    ct_ys = [instantiate(ct, ShapedArray((length,) + a.shape, a.dtype)) for ct, a in zip(cts[num_carry:], y_avals)]
    n_dc, n_lc, n_dx = len(defined_consts), len(lin_const_avals), len(defined_xs)

    def step(*values: Tensor) -> list[Any]:
        dconsts = values[:n_dc]
        acc = values[n_dc:n_dc + n_lc]
        carry_ct = values[n_dc + n_lc:n_dc + n_lc + num_carry]
        dxs = values[n_dc + n_lc + num_carry:n_dc + n_lc + num_carry + n_dx]
        y_ct = values[n_dc + n_lc + num_carry + n_dx:]
        results = evaluate(body_t, *dconsts, *dxs, *carry_ct, *y_ct)
        const_ct, new_carry_ct, xs_ct = results[:n_lc], results[n_lc:n_lc + num_carry], results[n_lc + num_carry:]
        new_acc = [bind(add_p, a, c) for a, c in zip(acc, const_ct)]
        return new_acc + list(new_carry_ct) + list(xs_ct)

    defined_x_avals = [ShapedArray(x.shape[1:], x.dtype) for x in defined_xs]
    step_ir = trace_avals(step, [_aval(c) for c in defined_consts] + lin_const_avals + carry_avals
                          + defined_x_avals + y_avals, "transpose(scan)")
    outs = bind(scan_p, *step_ir.consts, *defined_consts, *(zeros(a) for a in lin_const_avals), *ct_carry,
                *defined_xs, *ct_ys, body=open_ir(step_ir), length=length, reverse=not reverse,
                num_consts=len(step_ir.consts) + n_dc, num_carry=n_lc + num_carry)
    const_cts, carry_cts, xs_cts = iter(outs[:n_lc]), list(outs[n_lc:n_lc + num_carry]), iter(outs[n_lc + num_carry:])
    return ([next(const_cts) if lin else None for lin in const_lin]
            + [None if defined else ct for ct, defined in zip(carry_cts, carry_defined)]
            + [next(xs_cts) if lin else None for lin in xs_lin])


def _scan_batch(args: list[Any], dims: list[Any], *, axis_size: int, body: IR, length: int, reverse: bool,
                num_consts: int, num_carry: int) -> tuple[Any, Any]:
    consts, carry, xs = _scan_split(args, num_consts, num_carry)
    const_dims, carry_dims, xs_dims = _scan_split(dims, num_consts, num_carry)
    # the scan axis of xs is 0: move each batch axis to 1 so the body sees it at 0
    xs = [move_axis(x, d, 1) if d is not None else x for x, d in zip(xs, xs_dims)]
    slice_dims = [0 if d is not None else None for d in xs_dims]
    carry_batched = _fixed_point([d is not None for d in carry_dims], lambda mask: [
        d is not None for d in vmap_ir(body, const_dims + [0 if m else None for m in mask] + slice_dims,
                                       axis_size)[1][:num_carry]])
    carry = [broadcast_batched(c, d, axis_size) if b else c
             for c, d, b in zip(carry, carry_dims, carry_batched)]
    carry_in = [0 if b else None for b in carry_batched]
    n_y = len(body.outputs) - num_carry
    new_body, _ = vmap_ir(body, const_dims + carry_in + slice_dims, axis_size, out_dims=carry_in + [0] * n_y)
    outs = bind(scan_p, *new_body.consts, *consts, *carry, *xs, body=open_ir(new_body), length=length,
                reverse=reverse, num_consts=len(new_body.consts) + num_consts, num_carry=num_carry)
    return list(outs), carry_in + [1] * n_y


jvp_rules[scan_p] = _scan_jvp
pe_rules[scan_p] = _scan_partial_eval
transpose_rules[scan_p] = _scan_transpose
batch_rules[scan_p] = _scan_batch
