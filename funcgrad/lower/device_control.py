"""Control flow on a device with its own memory (CL, WEBGPU, CUDA): ``scan``, ``while`` and ``cond`` over
device buffers, so a loop's carries never cross to the host.

``lower/control.py`` runs control flow on host arrays (the CPU's loops on addresses and its native loop
driver). On a ``resident`` device the plan (``Plan._resident_steps``) hands a control step its operands as
device buffers and gets device buffers back; the runners here drive the compiled sub-plans through
``Plan.run_buffers``:

- ``scan``: each step runs the body's plan on the consts, the carries (the buffers the previous step's
  kernels wrote, passed on as they are) and one buffer per ``xs`` operand holding the step's row, filled by
  a device-to-device copy (``Device.copy_within``) from the stacked input; each ``y`` is copied into its row
  of a stacked output allocated once. A carry that is the body's ``xs`` row buffer (a row passed on as the
  carry) is copied out, since the next step refills that buffer. ``reverse`` walks the rows backwards.
  Nothing crosses to the host per step (unless the body has a host step: that step's operands do).
- ``while``: per iteration the condition's plan runs on device buffers and only its boolean is read back
  (one download of one element), then the body's plan.
- ``cond``: only the index is read back; the chosen branch (clamped into range, as ``lax.switch``) runs on
  the operand buffers.

Offsets are in the device's stored bytes (``Device.stored_itemsize``: WEBGPU keeps every element in a
32-bit word). A resident device without ``copy_within`` keeps the host path: operands are downloaded, the
host runner of ``lower/control.py`` runs (its sub-plans through their resident ``run``), outputs uploaded.
The backward of a scan is a scan, so gradients take the same path.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.ir.core import IR, Eqn, Literal, ShapedArray
from funcgrad.lower.control import CONTROL_FLOW, control_runner
from funcgrad.lower.device import Device

BufferRunner = Callable[[list[Any]], list[Any]]  # device buffers in, device buffers out


def has_copy_within(device: Any) -> bool:
    """Whether ``device`` overrides ``Device.copy_within`` (and so can run loops on its buffers)."""
    return getattr(type(device), "copy_within", Device.copy_within) is not Device.copy_within


def device_control_runner(eqn: Eqn, compile_ir: Callable[[IR], Any], device: Any) -> BufferRunner:
    """The function running control-flow equation ``eqn`` on ``device`` buffers (its operands, in order),
    returning its outputs as device buffers; ``compile_ir`` turns each sub-IR into a plan on ``device``."""
    name = eqn.primitive.name
    params = eqn.param_dict
    if name not in CONTROL_FLOW:
        raise ValueError(f"device_control_runner: {name} is not a control-flow primitive (one of "
                         f"{sorted(CONTROL_FLOW)})")
    if not has_copy_within(device):
        return _through_host(control_runner(eqn, compile_ir), eqn, device)
    if name == "scan":
        return _scan(compile_ir(params["body"]), params["length"], params["reverse"], params["num_consts"],
                     params["num_carry"], device)
    if name == "while":
        return _while(compile_ir(params["cond_ir"]), compile_ir(params["body_ir"]), params["cond_nconsts"],
                      params["body_nconsts"], device)
    return _cond([compile_ir(b) for b in params["branches"]], eqn.inputs[0].aval, device)


def _through_host(runner: Callable[[list[np.ndarray]], list[np.ndarray]], eqn: Eqn, device: Any) -> BufferRunner:
    """The host runner on a device without ``copy_within``: operands down, outputs up, once per step."""
    in_avals = [atom.aval for atom in eqn.inputs]

    def run(buffers: list[Any]) -> list[Any]:
        outs = runner([device.download(b, aval) for b, aval in zip(buffers, in_avals)])
        return [device.upload(np.ascontiguousarray(o, v.aval.dtype)) for o, v in zip(outs, eqn.outputs)]
    return run


def _stored_bytes(device: Any, aval: Any) -> int:
    """The bytes of one ``aval`` in ``device``'s buffers: the distance between two rows of a stack of them."""
    return math.prod(aval.shape) * device.stored_itemsize(aval.dtype)


def _scan(body_plan: Any, length: int, reverse: bool, num_consts: int, num_carry: int, device: Any) -> BufferRunner:
    body = body_plan.ir
    first_x = num_consts + num_carry
    x_avals = [var.aval for var in body.in_vars[first_x:]]
    y_avals = list(body.out_avals[num_carry:])
    stacked = [ShapedArray((length, *aval.shape), aval.dtype) for aval in y_avals]
    x_bytes = [_stored_bytes(device, aval) for aval in x_avals]
    y_bytes = [_stored_bytes(device, aval) for aval in y_avals]
    carry_bytes = [_stored_bytes(device, aval) for aval in body.out_avals[:num_carry]]
    carry_avals = list(body.out_avals[:num_carry])
    order = range(length - 1, -1, -1) if reverse else range(length)
    copy, run_body = device.copy_within, body_plan.run_buffers

    def run_scan(values: list[Any]) -> list[Any]:
        consts, carry, xs = values[:num_consts], values[num_consts:first_x], values[first_x:]
        ys = [device.allocate(aval) for aval in stacked]
        rows = [device.allocate(aval) for aval in x_avals]  # the step's xs rows, refilled every step
        row_ids = {id(row) for row in rows}
        steps = [(x, row, nbytes) for x, row, nbytes in zip(xs, rows, x_bytes) if nbytes]
        outputs = [(y, nbytes) for y, nbytes in zip(ys, y_bytes) if nbytes]
        for step in order:
            for x, row, nbytes in steps:
                copy(x, step * nbytes, row, 0, nbytes)
            outs = run_body(consts + carry + rows)
            carry = outs[:num_carry]
            for k, value in enumerate(carry):
                if id(value) in row_ids:  # an xs row passed on as a carry: the next step refills its buffer
                    carry[k] = device.allocate(carry_avals[k])
                    copy(value, 0, carry[k], 0, carry_bytes[k])
            for (y, nbytes), value in zip(outputs, (o for o, n in zip(outs[num_carry:], y_bytes) if n)):
                copy(value, 0, y, step * nbytes, nbytes)
        return carry + ys
    return run_scan


def _while(cond_plan: Any, body_plan: Any, cond_nconsts: int, body_nconsts: int, device: Any) -> BufferRunner:
    first_carry = cond_nconsts + body_nconsts
    flag = cond_plan.ir.outputs[0]
    flag_aval = cond_plan.ir.out_avals[0]
    constant = bool(flag.value) if isinstance(flag, Literal) else None  # a literal predicate needs no read-back
    test, step = cond_plan.run_buffers, body_plan.run_buffers

    def run_while(values: list[Any]) -> list[Any]:
        cond_consts, body_consts = values[:cond_nconsts], values[cond_nconsts:first_carry]
        carry = values[first_carry:]
        while True:
            if constant is None:
                (predicate,) = test(cond_consts + carry)
                if not device.download(predicate, flag_aval)[()]:  # the one read-back per iteration
                    break
            elif not constant:
                break
            carry = step(body_consts + carry)
        return carry
    return run_while


def _cond(plans: Sequence[Any], index_aval: Any, device: Any) -> BufferRunner:
    last = len(plans) - 1

    def run_cond(values: list[Any]) -> list[Any]:
        index = int(device.download(values[0], index_aval))  # the one read-back
        return list(plans[min(max(index, 0), last)].run_buffers(values[1:]))  # clamped, as lax.switch
    return run_cond
