"""Control flow in plans: ``scan``, ``while`` and ``cond`` run as loops and branches over compiled sub-plans.

The scheduler leaves a control-flow equation whole (its sub-IRs are not fused into the kernels around
it); the plan (``lower/plan.py``) turns it into a ``ControlStep`` and compiles each of its sub-IRs
(a scan's body, a while loop's condition and body, every branch of a cond) into a plan of its own, once,
when the outer plan is built. Running the step is then a loop of sub-plan replays:

- ``scan``: one replay of the body's plan per step, on the consts, the carries (the arrays the previous
  step's kernels wrote, passed on as they are: never copied, never traced or scheduled again) and the
  step's slices of ``xs`` (views of the stacked inputs, no copy); each step's ``ys`` are written into
  their row of a stacked output allocated once. ``reverse`` walks the rows backwards.
- ``while``: replays of the condition's plan and the body's plan until the condition's bool is false.
- ``cond``: the branch the index picks (clamped into range, as ``lax.switch``) is replayed once.

When a body's plan is kernels only (``Plan.launches``: no host or control step in it), the loop does not
even replay it: ``_address_loop`` (scan) and ``_address_while`` run the kernels' raw functions on
addresses from one table, updated per step only where a value moves (rows of ``xs`` and ``ys``, the
carries), so a step makes, copies and inspects no array.

A sub-plan may hold control steps itself (a scan in a scan's body). The backward of a scan is a scan
(``transforms/control_flow.py``), so it runs the same way; ``lower/scan_rewrite.py`` first moves the
products that need not run per step out of the loop. The per-step cost is the kernel calls and a few
list operations, whatever the number of steps. With DEBUG or the NaN/inf checks on, each step is the
sub-plan's checked ``run`` instead (DEBUG=2 then shows every step's kernels). A device that keeps values
in its own memory (``resident``) runs control flow on its buffers instead (``lower/device_control.py``:
the carries stay on the device); these host runners serve it only when it has no ``copy_within``.
"""

from __future__ import annotations

import ctypes
import itertools
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import numpy as np

from funcgrad.ir.core import IR, Eqn, Literal, Var
from funcgrad.lower import pool
from funcgrad.lower.device import CALL, COPY, END, EXIT, FLIP, LINK, POOL, ROW
from funcgrad.util.config import nonfinite_checks
from funcgrad.util.debug import debug_level

CONTROL_FLOW = frozenset({"scan", "while", "cond"})  # primitives a plan runs as a ControlStep

Runner = Callable[[list[np.ndarray]], list[np.ndarray]]


@attrs.frozen(eq=False)
class ControlStep:
    """A control-flow equation of a plan, run over compiled sub-plans (see the module docstring)."""

    eqn: Eqn


def is_control(eqn: Eqn) -> bool:
    return eqn.primitive.name in CONTROL_FLOW


def _caller(plan: Any) -> Runner:
    """How to run a sub-plan on a list of arrays now: its lean replay, or its checked ``run`` when DEBUG or
    the NaN/inf checks are on or the plan has no replay (a resident device)."""
    replay = plan.replay
    if replay is None or debug_level() or nonfinite_checks():
        return plan.run
    return replay


def _fixers(ir: IR) -> list[tuple[int, np.ndarray]]:
    """A sub-plan's outputs that are literals, as the arrays of their exact dtype (a replay hands literals
    back as ``np.asarray(value)``): the loop puts these in their place."""
    return [(i, np.asarray(atom.value, dtype=atom.aval.dtype)) for i, atom in enumerate(ir.outputs)
            if isinstance(atom, Literal)]


def _contiguous(values: Sequence[Any], avals: Sequence[Any]) -> list[np.ndarray]:
    """The step's operands as C-contiguous arrays of their declared dtypes (the replays' contract)."""
    out = []
    for value, aval in zip(values, avals):
        array = np.asarray(value)
        if array.dtype != aval.dtype or not array.flags.c_contiguous:
            array = np.ascontiguousarray(array, dtype=aval.dtype)
        out.append(array)
    return out


def control_runner(eqn: Eqn, compile_ir: Callable[[IR], Any]) -> Runner:
    """The function running control-flow equation ``eqn`` on its operand arrays, returning its outputs;
    ``compile_ir`` turns each sub-IR into a plan (the caller's device, its plan cache)."""
    name = eqn.primitive.name
    params = eqn.param_dict
    in_avals = [atom.aval for atom in eqn.inputs]
    if name == "scan":
        return _scan_runner(compile_ir(params["body"]), params["body"], params["length"], params["reverse"],
                            params["num_consts"], params["num_carry"], in_avals)
    if name == "while":
        return _while_runner(compile_ir(params["cond_ir"]), compile_ir(params["body_ir"]), params["body_ir"],
                             params["cond_nconsts"], params["body_nconsts"], in_avals)
    if name == "cond":
        branches = params["branches"]
        return _cond_runner([compile_ir(b) for b in branches], branches, in_avals)
    raise ValueError(f"control_runner: {name} is not a control-flow primitive (one of {sorted(CONTROL_FLOW)})")


def _scan_runner(body_plan: Any, body: IR, length: int, reverse: bool, num_consts: int, num_carry: int,
                 in_avals: Sequence[Any]) -> Runner:
    y_avals = body.out_avals[num_carry:]
    y_makers = [pool.allocator((length, *aval.shape), aval.dtype) for aval in y_avals]
    fixes = _fixers(body)
    carry_fixes = [(i, value) for i, value in fixes if i < num_carry]
    y_fixes = [(i - num_carry, value) for i, value in fixes if i >= num_carry]
    first_x = num_consts + num_carry
    order = range(length - 1, -1, -1) if reverse else range(length)

    flat = _address_loop(body_plan, length, reverse, num_consts, num_carry, y_makers)

    def run_scan(values: list[np.ndarray]) -> list[np.ndarray]:
        values = _contiguous(values, in_avals)
        if flat is not None and not debug_level() and not nonfinite_checks():
            return flat(values)
        consts, carry, xs = values[:num_consts], values[num_consts:first_x], values[first_x:]
        ys = [make() for make in y_makers]
        for i, value in y_fixes:  # a literal y: the same in every row
            ys[i][...] = value
        call = _caller(body_plan)
        y_rows = [(y, i) for i, y in enumerate(ys) if all(p != i for p, _ in y_fixes)]
        for row in order:
            outs = call(consts + carry + [x[row, ...] for x in xs])  # views (0-d arrays, not scalars)
            for i, value in carry_fixes:
                outs[i] = value
            carry = outs[:num_carry]
            for y, i in y_rows:
                y[row] = outs[num_carry + i]
        return carry + ys
    return run_scan


def _address_loop(body_plan: Any, length: int, reverse: bool, num_consts: int, num_carry: int,
                  y_makers: list[Callable[[], np.ndarray]]) -> Runner | None:
    """The scan as a loop over raw kernel launches, when its body plan is kernels only (``Plan.launches``)
    and each body output is a distinct kernel output: every value of the body gets a slot in an address
    table, filled once per run (consts, intermediates in buffers allocated once) and per step only where
    it moves (the step's rows of ``xs``; the ``ys`` rows the kernels write straight into; carries, which
    live in the ``ys`` row that holds them or else alternate between two buffers). A step is then the
    kernel calls on addresses from the table: no array is made, copied or looked at. None when the body
    does not qualify (the loop of body replays runs instead)."""
    launches = body_plan.launches
    if launches is None:
        return None
    ir = body_plan.ir
    outs = list(ir.outputs)
    carry_out, y_out = outs[:num_carry], outs[num_carry:]
    if not all(isinstance(atom, Var) for atom in outs) \
            or len({v.id for v in carry_out}) != len(carry_out) or len({v.id for v in y_out}) != len(y_out):
        return None  # a literal output, or one value returned twice as carries (or as ys)
    slot: dict[int, int] = {}
    for var in ir.in_vars:
        slot.setdefault(var.id, len(slot))
    inputs_of_body = set(slot)
    y_index = {v.id: i for i, v in enumerate(y_out)}
    carry_ids = {v.id for v in carry_out}
    y_homes: list[tuple[int, int]] = []               # (slot, y number): written into the step's row
    alternating: list[tuple[int, Any]] = []           # (slot, aval): a carry only, in two buffers in turn
    intermediates: list[tuple[int, Any]] = []         # (slot, aval): one buffer for every step
    home: dict[int, int] = {}                         # an output's var -> the slot it is written to
    numbers = itertools.count(len(slot))

    def place(var: Var) -> int:
        number = home[var.id] = next(numbers)
        if var.id in y_index:
            y_homes.append((number, y_index[var.id]))
        elif var.id in carry_ids:
            alternating.append((number, var.aval))
        else:
            intermediates.append((number, var.aval))
        return number

    program: list[tuple[Callable[..., None], list[int], tuple[int, ...]]] = []
    for function, tail, inputs, outputs in launches:
        for var in outputs:
            slot[var.id] = place(var)
        program.append((function, [slot[v.id] for v in outputs] + [slot[v.id] for v in inputs], tail))
    # outputs that are inputs of the body (a carry passed on, an xs row kept as a y): copied to their home
    copies = [(slot[v.id], place(v), v.aval.size * v.aval.dtype.itemsize)
              for v in {v.id: v for v in outs if v.id in inputs_of_body}.values()]
    first_x = num_consts + num_carry
    x_rows = [(slot[var.id], i, _row_bytes(var.aval)) for i, var in enumerate(ir.in_vars[first_x:])]
    y_rows = [(number, i, _row_bytes(y_out[i].aval)) for number, i in y_homes]
    links = [(slot[ir.in_vars[num_consts + k].id], home[v.id]) for k, v in enumerate(carry_out)]
    final_y = [y_index.get(v.id) for v in carry_out]  # where each carry ends: its ys row, or its buffers
    order = list(range(length - 1, -1, -1) if reverse else range(length))
    driver, calls, pooled = _native(body_plan, [arguments for _, arguments, _ in program])
    fetchers, constants = _fetchers(program, numbers)
    size = next(numbers)

    def run_flat(values: list[np.ndarray]) -> list[np.ndarray]:
        ys = [make() for make in y_makers]
        if not order:
            return values[num_consts:first_x] + ys
        table = [0] * size
        for number, constant in constants:
            table[number] = constant
        for number, value in enumerate(values[:first_x]):
            table[number] = value.ctypes.data
        buffers = [np.empty(aval.shape, aval.dtype) for _, aval in intermediates]
        for (number, _), buffer in zip(intermediates, buffers):
            table[number] = buffer.ctypes.data
        pairs = [(np.empty(aval.shape, aval.dtype), np.empty(aval.shape, aval.dtype)) for _, aval in alternating]
        flips = [(number, pair[1].ctypes.data, pair[0].ctypes.data) for (number, _), pair in zip(alternating, pairs)]
        rows = [(number, values[first_x + i].ctypes.data, stride) for number, i, stride in x_rows]
        rows += [(number, ys[i].ctypes.data, stride) for number, i, stride in y_rows]
        if driver is not None:  # the whole loop in one native call (devices/cpu_loop.py)
            words: list[int] = []
            for number, base, stride in rows:
                words += [ROW, number, base + order[0] * stride, -stride if reverse else stride]
            for number, even_address, odd_address in flips:
                words += [FLIP, number, even_address, odd_address]
            words += calls
            for source, into, count in copies:
                words += [COPY, into, source, count]
            for into, source in links:
                words += [LINK, into, source]
            words.append(END)
            driver.run((ctypes.c_int64 * size)(*table), (ctypes.c_int64 * len(words))(*words), length, pooled)
            odd = length % 2 == 1
        else:
            odd = _python_loop(order, rows, flips, fetchers, copies, links, table)
        last = order[-1]  # the last step wrote the second buffer of each pair after an odd number of steps
        by_slot = {number: pair[1] if odd else pair[0] for (number, _), pair in zip(alternating, pairs)}
        carry = [ys[i][last, ...] if i is not None else by_slot[home[v.id]] for i, v in zip(final_y, carry_out)]
        return carry + ys
    return run_flat


def _python_loop(order: list[int], rows: list[tuple[int, int, int]], flips: list[tuple[int, int, int]],
                 fetchers: Fetchers, copies: list[tuple[int, int, int]], links: list[tuple[int, int]],
                 table: list[int]) -> bool:
    """The scan's steps driven from Python over ``table``; returns whether an odd number of steps ran."""
    memmove = ctypes.memmove
    odd = False
    for row in order:
        for number, base, stride in rows:
            table[number] = base + row * stride
        for number, even_address, odd_address in flips:  # step 0 writes the second buffer
            table[number] = odd_address if odd else even_address
        for function, fetch in fetchers:
            function(*fetch(table))
        for source, into, count in copies:
            memmove(table[into], table[source], count)
        for into, source in links:
            table[into] = table[source]
        odd = not odd
    return odd


def _native(plan: Any, arguments: list[list[int]]) -> tuple[Any, list[int], bool]:
    """The device's native loop driver, the words launching ``plan``'s kernels (``CALL`` or ``POOL`` each, on
    the given argument slots, outputs first) and whether a ``POOL`` is among them, when the device has a
    driver and every kernel can be launched from native code (``Plan.native_launches``); else (None, [], False)."""
    native = getattr(plan, "native_launches", None)
    driver = plan.device.native_loop() if native is not None else None
    if driver is None or native is None:
        return None, [], False
    words: list[int] = []
    for (address, outer, chunks), slots in zip(native, arguments):
        if chunks == 1:
            words += [CALL, address, outer, len(slots), *slots]
        else:
            words += [POOL, address, outer, chunks, len(slots), *slots]
    pooled = any(chunks > 1 for _, _, chunks in native)
    if pooled and not driver.pool_ready():
        return None, [], False
    return driver, words, pooled


Program = list[tuple[Callable[..., None], list[int], tuple[int, ...]]]  # (function, argument slots, trailing args)
Fetchers = list[tuple[Callable[..., None], Callable[[list[int]], Any]]]


def _fetchers(program: Program, numbers: Any) -> tuple[Fetchers, list[tuple[int, int]]]:
    """Each kernel with a function collecting its arguments from the table in one C call (an itemgetter),
    and the (slot, value) pairs of the trailing arguments, which get slots (from ``numbers``) too."""
    constants: list[tuple[int, int]] = []
    fetchers: Fetchers = []
    for function, arguments, tail in program:
        for value in tail:
            number = next(numbers)
            constants.append((number, value))
            arguments = [*arguments, number]
        fetch = operator.itemgetter(*arguments)  # a tuple; a bare value for one argument
        fetchers.append((function, fetch if len(arguments) > 1 else _as_tuple(fetch)))
    return fetchers, constants


def _kernel_table(plan: Any, first: Callable[[Var], int], numbers: Any, carries: dict[int, int]
                  ) -> tuple[Program, list[tuple[int, Any]], list[tuple[int, Any]]] | None:
    """A kernels-only plan (``Plan.launches``) as a program over an address table: ``first(var)`` gives the
    slot of each of the plan's inputs, ``carries`` maps the output variables that are carries to their
    number. Returns the program, the carries' slots with their avals (their buffers alternate), and the
    intermediates' slots with their avals; None when the plan has no launches."""
    if plan.launches is None:
        return None
    slot = {var.id: first(var) for var in plan.ir.in_vars}
    alternating: list[tuple[int, Any]] = []
    intermediates: list[tuple[int, Any]] = []
    program: Program = []
    for function, tail, inputs, outputs in plan.launches:
        for var in outputs:
            number = slot[var.id] = next(numbers)
            (alternating if var.id in carries else intermediates).append((number, var.aval))
        program.append((function, [slot[v.id] for v in outputs] + [slot[v.id] for v in inputs], tail))
    return program, alternating, intermediates


def _address_while(cond_plan: Any, body_plan: Any, cond_nconsts: int, body_nconsts: int) -> Runner | None:
    """The while loop over raw kernel launches when its condition's and body's plans are kernels only and the
    body's outputs are distinct kernel outputs: one address table for both, the carries alternating between
    two buffers each, the condition's bool read from its one-byte buffer. None when they do not qualify."""
    outs = list(body_plan.ir.outputs)
    flag = cond_plan.ir.outputs[0]
    if body_plan.launches is None or cond_plan.launches is None or not isinstance(flag, Var) \
            or not all(isinstance(v, Var) for v in outs) or len({v.id for v in outs}) != len(outs) \
            or any(v.id not in {o.id for *_, os_ in body_plan.launches for o in os_} for v in outs):
        return None
    count = len(outs)
    numbers = itertools.count(cond_nconsts + body_nconsts + count)  # consts of both, then the current carries
    cond_in, body_in = cond_plan.ir.in_vars, body_plan.ir.in_vars
    cond_slot = {v.id: (i if i < cond_nconsts else cond_nconsts + body_nconsts + i - cond_nconsts)
                 for i, v in enumerate(cond_in)}
    body_slot = {v.id: (cond_nconsts + i if i < body_nconsts else cond_nconsts + body_nconsts + i - body_nconsts)
                 for i, v in enumerate(body_in)}
    tested = _kernel_table(cond_plan, lambda v: cond_slot[v.id], numbers, {})
    stepped = _kernel_table(body_plan, lambda v: body_slot[v.id], numbers, {v.id: i for i, v in enumerate(outs)})
    if tested is None or stepped is None:
        return None
    cond_program, _, cond_buffers = tested
    body_program, alternating, body_buffers = stepped
    flag_slot = next(number for (number, _), var in zip(cond_buffers, _outputs_in_order(cond_plan)) if var is flag)
    slot_of_output = {var.id: number for (number, _), var in zip(alternating, _carries_in_order(body_plan, outs))}
    homes = [slot_of_output[v.id] for v in outs]
    driver, test_words, test_pooled = _native(cond_plan, [arguments for _, arguments, _ in cond_program])
    _, step_words, step_pooled = _native(body_plan, [arguments for _, arguments, _ in body_program])
    if not step_words:
        driver = None
    test, test_constants = _fetchers(cond_program, numbers)
    step, step_constants = _fetchers(body_program, numbers)
    size = next(numbers)
    first_carry = cond_nconsts + body_nconsts

    def run_while(values: list[np.ndarray]) -> list[np.ndarray]:
        table = [0] * size
        for number, constant in test_constants + step_constants:
            table[number] = constant
        for number, value in enumerate(values):
            table[number] = value.ctypes.data
        buffers = {number: np.empty(aval.shape, aval.dtype) for number, aval in cond_buffers + body_buffers}
        for number, buffer in buffers.items():
            table[number] = buffer.ctypes.data
        flag_value = buffers[flag_slot]
        pairs = [(np.empty(v.aval.shape, v.aval.dtype), np.empty(v.aval.shape, v.aval.dtype)) for v in outs]  # as homes
        addresses = [(pair[0].ctypes.data, pair[1].ctypes.data) for pair in pairs]
        current = list(range(first_carry, first_carry + count))  # the slots holding the carries' addresses
        if driver is not None:  # the whole loop in one native call (devices/cpu_loop.py)
            words = [*test_words, EXIT, flag_slot]
            for home, (even_address, odd_address) in zip(homes, addresses):  # step 0 writes the second buffer
                words += [FLIP, home, odd_address, even_address]
            words += step_words
            for k, home in enumerate(homes):
                words += [LINK, first_carry + k, home]
            words.append(END)
            native_table = (ctypes.c_int64 * size)(*table)
            driver.run(native_table, (ctypes.c_int64 * len(words))(*words), _FOREVER, test_pooled or step_pooled)
            table = list(native_table)
        else:
            _python_while(test, step, flag_value, homes, addresses, first_carry, table)
        result = []
        for k, (pair, value) in enumerate(zip(pairs, values[first_carry:])):
            address = table[current[k]]
            result.append(value if address == value.ctypes.data else pair[0] if address == addresses[k][0] else pair[1])
        return result
    return run_while


_FOREVER = (1 << 63) - 1  # a while loop's step limit: none


def _python_while(test: Fetchers, step: Fetchers, flag: np.ndarray, homes: list[int], addresses: list[tuple[int, int]],
                  first_carry: int, table: list[int]) -> None:
    """The while loop's iterations driven from Python over ``table`` (the carries' slots updated in place)."""
    odd = False
    while True:
        for function, fetch in test:
            function(*fetch(table))
        if not flag[()]:
            break
        for home, (even_address, odd_address) in zip(homes, addresses):  # step 0 writes the second buffer
            table[home] = even_address if odd else odd_address
        for function, fetch in step:
            function(*fetch(table))
        for k, home in enumerate(homes):
            table[first_carry + k] = table[home]
        odd = not odd


def _outputs_in_order(plan: Any) -> list[Var]:
    return [var for *_, outputs in plan.launches for var in outputs]


def _carries_in_order(plan: Any, outs: list[Var]) -> list[Var]:
    wanted = {v.id for v in outs}
    return [var for *_, outputs in plan.launches for var in outputs if var.id in wanted]


def _as_tuple(fetch: Callable[[list[int]], Any]) -> Callable[[list[int]], tuple[Any, ...]]:
    return lambda table: (fetch(table),)


def _row_bytes(aval: Any) -> int:
    """The bytes of one ``aval``: the distance between two rows of a C-contiguous stack of them."""
    return math.prod(aval.shape) * aval.dtype.itemsize


def _while_runner(cond_plan: Any, body_plan: Any, body: IR, cond_nconsts: int, body_nconsts: int,
                  in_avals: Sequence[Any]) -> Runner:
    fixes = _fixers(body)
    first_carry = cond_nconsts + body_nconsts
    flat = _address_while(cond_plan, body_plan, cond_nconsts, body_nconsts)

    def run_while(values: list[np.ndarray]) -> list[np.ndarray]:
        values = _contiguous(values, in_avals)
        if flat is not None and not debug_level() and not nonfinite_checks():
            return flat(values)
        cond_consts, body_consts = values[:cond_nconsts], values[cond_nconsts:first_carry]
        carry = values[first_carry:]
        test, step = _caller(cond_plan), _caller(body_plan)
        while test(cond_consts + carry)[0]:
            carry = step(body_consts + carry)
            for i, value in fixes:
                carry[i] = value
        return carry
    return run_while


def _cond_runner(plans: list[Any], branches: Sequence[IR], in_avals: Sequence[Any]) -> Runner:
    fixes = [_fixers(branch) for branch in branches]
    last = len(plans) - 1

    def run_cond(values: list[np.ndarray]) -> list[np.ndarray]:
        values = _contiguous(values, in_avals)
        chosen = min(max(int(values[0]), 0), last)  # out-of-range indices clamp, as lax.switch
        outs = list(_caller(plans[chosen])(values[1:]))
        for i, value in fixes[chosen]:
            outs[i] = value
        return outs
    return run_cond
