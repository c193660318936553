"""Primitives that carry sub-IRs: ``jit`` calls (and, in ``funcgrad.lax``, control flow).

A sub-IR held as a parameter is *open*: it has no consts; the values it closed over are passed
as leading operands. That keeps parameters hashable by identity and lets every transformation
treat consts like any other operand.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from funcgrad.ir.core import IR, ShapedArray, avals_str
from funcgrad.ir.interpreter import eval_ir
from funcgrad.ir.primitives import Primitive


def open_ir(ir: IR) -> IR:
    """``ir`` with its consts turned into leading inputs (values passed separately)."""
    if not ir.const_vars:
        return ir
    return IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)


def check_operands(name: str, ir: IR, avals: tuple[ShapedArray, ...]) -> None:
    if ir.consts:
        raise ValueError(f"{name}: sub-IRs must be open (no consts); pass the consts as operands")
    if tuple(avals) != ir.in_avals:
        raise TypeError(f"{name}: operands typed {avals_str(avals)} do not match the sub-IR's inputs "
                        f"{avals_str(ir.in_avals)}")


def _jit_rule(*avals: ShapedArray, ir: IR, name: str) -> tuple[ShapedArray, ...]:
    check_operands(f"jit call {name}", ir, avals)
    return ir.out_avals


def _jit_impl(*args: np.ndarray, ir: IR, name: str) -> list[Any]:
    return eval_ir(ir, args)


jit_p = Primitive("jit", _jit_rule, _jit_impl, multiple_results=True)


# --- control flow ------------------------------------------------------------------------------

def _cond_rule(index: ShapedArray, *operands: ShapedArray, branches: tuple[IR, ...]) -> tuple[ShapedArray, ...]:
    if index.shape != () or index.dtype != np.dtype("int32"):
        raise TypeError(f"cond: the branch index must be an int32 scalar, got {index}")
    if not branches:
        raise ValueError("cond needs at least one branch")
    for i, branch in enumerate(branches):
        check_operands(f"cond branch {i}", branch, operands)
        if branch.out_avals != branches[0].out_avals:
            raise TypeError(f"cond: branch {i} returns {avals_str(branch.out_avals)} but branch 0 returns "
                            f"{avals_str(branches[0].out_avals)}; every branch must return the same types")
    return branches[0].out_avals


def _cond_impl(index: np.ndarray, *operands: np.ndarray, branches: tuple[IR, ...]) -> list[Any]:
    chosen = int(np.clip(int(index), 0, len(branches) - 1))  # out-of-range indices clamp, as lax.switch
    return eval_ir(branches[chosen], operands)


cond_p = Primitive("cond", _cond_rule, _cond_impl, multiple_results=True)


def _while_rule(*operands: ShapedArray, cond_ir: IR, body_ir: IR, cond_nconsts: int,
                body_nconsts: int) -> tuple[ShapedArray, ...]:
    cond_consts = operands[:cond_nconsts]
    body_consts = operands[cond_nconsts:cond_nconsts + body_nconsts]
    carry = operands[cond_nconsts + body_nconsts:]
    check_operands("while_loop cond_fun", cond_ir, cond_consts + carry)
    check_operands("while_loop body_fun", body_ir, body_consts + carry)
    if cond_ir.out_avals != (ShapedArray((), np.dtype(bool)),):
        raise TypeError(f"while_loop: cond_fun must return a bool scalar, got {avals_str(cond_ir.out_avals)}")
    if body_ir.out_avals != tuple(carry):
        raise TypeError(f"while_loop: body_fun must return the carry's types {avals_str(carry)}, got "
                        f"{avals_str(body_ir.out_avals)}")
    return tuple(carry)


def _while_impl(*operands: np.ndarray, cond_ir: IR, body_ir: IR, cond_nconsts: int, body_nconsts: int) -> list[Any]:
    cond_consts = list(operands[:cond_nconsts])
    body_consts = list(operands[cond_nconsts:cond_nconsts + body_nconsts])
    carry = list(operands[cond_nconsts + body_nconsts:])
    while bool(eval_ir(cond_ir, cond_consts + carry)[0]):
        carry = eval_ir(body_ir, body_consts + carry)
    return carry


while_p = Primitive("while", _while_rule, _while_impl, multiple_results=True)


def _scan_rule(*operands: ShapedArray, body: IR, length: int, reverse: bool, num_consts: int,
               num_carry: int) -> tuple[ShapedArray, ...]:
    consts = operands[:num_consts]
    carry = operands[num_consts:num_consts + num_carry]
    xs = operands[num_consts + num_carry:]
    for x in xs:
        if x.ndim == 0 or x.shape[0] != length:
            raise ValueError(f"scan: every xs leaf needs a leading axis of length {length}, got {x}")
    slices = tuple(ShapedArray(x.shape[1:], x.dtype) for x in xs)
    check_operands("scan body", body, consts + carry + slices)
    outs = body.out_avals
    if outs[:num_carry] != tuple(carry):
        raise TypeError(f"scan: the body must return the carry's types {avals_str(carry)} first, got "
                        f"{avals_str(outs[:num_carry])}")
    ys = tuple(ShapedArray((length,) + y.shape, y.dtype) for y in outs[num_carry:])
    return tuple(carry) + ys


def _scan_impl(*operands: np.ndarray, body: IR, length: int, reverse: bool, num_consts: int,
               num_carry: int) -> list[Any]:
    consts = list(operands[:num_consts])
    carry = list(operands[num_consts:num_consts + num_carry])
    xs = operands[num_consts + num_carry:]
    ys: list[list[np.ndarray]] = [[] for _ in body.outputs[num_carry:]]
    for step in range(length):
        i = length - 1 - step if reverse else step
        outs = eval_ir(body, consts + carry + [x[i] for x in xs])
        carry = outs[:num_carry]
        for acc, y in zip(ys, outs[num_carry:]):
            acc.append(y)
    stacked = []
    for acc, aval in zip(ys, body.out_avals[num_carry:]):
        acc = acc[::-1] if reverse else acc
        stacked.append(np.stack(acc) if acc else np.zeros((0,) + aval.shape, aval.dtype))
    return carry + stacked


scan_p = Primitive("scan", _scan_rule, _scan_impl, multiple_results=True)


# --- gradient control --------------------------------------------------------------------------

def _call_like(name: str) -> Primitive:
    """A primitive that calls its open sub-IR ``ir`` (params beyond ``ir`` are carried along)."""
    def rule(*avals: ShapedArray, ir: IR, **params: Any) -> tuple[ShapedArray, ...]:
        check_operands(name, ir, avals)
        return ir.out_avals

    def impl(*args: np.ndarray, ir: IR, **params: Any) -> list[Any]:
        return eval_ir(ir, args)
    return Primitive(name, rule, impl, multiple_results=True)


checkpoint_p = _call_like("checkpoint")        # params: ir, name, policy
custom_jvp_call_p = _call_like("custom_jvp_call")  # params: ir, jvp (a Python callable), num_consts, name
custom_vjp_call_p = _call_like("custom_vjp_call")  # params: ir, fwd, bwd, num_consts, name, out_tree


def _custom_lin_rule(*avals: ShapedArray, num_residuals: int, bwd: Any, out_avals: tuple[ShapedArray, ...],
                     **params: Any) -> tuple[ShapedArray, ...]:
    return out_avals


def _custom_lin_impl(*args: Any, **params: Any) -> Any:
    raise TypeError("can't apply forward-mode differentiation (jvp, jacfwd, hessian) to a function with a "
                    "custom_vjp rule; give it a custom_jvp rule, or use reverse mode (grad, vjp, jacrev)")


# the linear map of a custom_vjp function: only its transpose (the user's bwd) is ever evaluated
custom_lin_p = Primitive("custom_lin", _custom_lin_rule, _custom_lin_impl, multiple_results=True)


def merge_consts(irs: list[IR]) -> tuple[list[IR], list[Any]]:
    """Open several IRs onto one shared operand list: every IR takes *all* their consts (each
    ignoring the others') before its own inputs. Returns the open IRs and the const values."""
    from funcgrad.ir.core import Var
    const_avals = [[v.aval for v in ir.const_vars] for ir in irs]
    merged = []
    for i, ir in enumerate(irs):
        before = [Var(a) for avals in const_avals[:i] for a in avals]
        after = [Var(a) for avals in const_avals[i + 1:] for a in avals]
        merged.append(IR(before + list(ir.const_vars) + after + list(ir.in_vars), ir.eqns, ir.outputs))
    return merged, [c for ir in irs for c in ir.consts]
