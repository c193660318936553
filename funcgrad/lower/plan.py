"""Executable plans: run a schedule's steps on a device, and the caches that make realize cheap.

``compile_plan(ir, device)`` schedules an IR into kernels and host steps and compiles every kernel;
``Plan.run(inputs)`` allocates the intermediate buffers, launches the kernels in order and runs
the host steps with their NumPy reference implementations. Plans are cached by the IR's structure
(its printed form), so realizing the same graph shape twice, or calling a jit function again,
reuses the compiled kernels.

Plans are cached per (device, IR). A device that keeps values in its own memory (``resident =
True``, e.g. OpenCL) also provides ``upload(array)``, ``allocate(aval)``, ``download(buffer,
aval)`` and kernels with ``launch(input_buffers, output_buffers)``: its plan copies the inputs in
once, keeps intermediates on the device, downloads only what a host step reads and the outputs.
A device with ``compile_many(kernels)`` compiles a plan's kernels together (one OpenCL program).

A device with a ``plan_cache`` (a ``PlanDiskCache``; the CPU has one) also keeps whole plans on
disk, so a second process skips scheduling, rendering and LLVM: the steps are pickled with every
variable replaced by its number, and each kernel by its ``cache_token`` (the device's disk key of
the object code), which ``device.load_cached(kernel, token)`` turns back into a compiled kernel.
``PHASE_SECONDS`` and ``PHASE_COUNTS`` add up where plan building spends its time (DEBUG=2 prints
one line per plan built or loaded).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import io
import math
import os
import pickle
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from funcgrad.ir.core import IR, Literal, Var
from funcgrad.lower import hooks, pool
from funcgrad.lower.control import ControlStep, control_runner, is_control
from funcgrad.lower.device import Device
from funcgrad.lower.device_control import device_control_runner
from funcgrad.lower.fuse import fuse_siblings
from funcgrad.lower.kernel import Kernel
from funcgrad.lower.scan_rewrite import rewrite_scans
from funcgrad.lower.schedule import HostStep, KernelStep, Step, inline_calls, schedule
from funcgrad.lower.split_reductions import split_long_reductions
from funcgrad.util.caches import LRUCache, cache_size, checked_entry, read_checked, write_atomically
from funcgrad.util.config import nonfinite_checks
from funcgrad.util.debug import debug_level
from funcgrad.util.version import code_version

PlanStep = Step | ControlStep  # what a plan runs: kernels, host steps, control flow over sub-plans


def run_on_host_arrays(compiled: Any, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
                       contiguous: bool = False) -> None:
    """Call a resident device's compiled kernel on host arrays: check them against the kernel's
    avals, upload the inputs, launch, download into ``outputs``. ``compiled`` has ``kernel``,
    ``name``, ``device`` (with allocate/upload/download) and ``launch(inputs, outputs)``."""
    kernel = compiled.kernel
    if len(inputs) != len(kernel.in_avals) or len(outputs) != len(kernel.out_avals):
        raise ValueError(f"kernel {compiled.name} takes {len(kernel.in_avals)} inputs and {len(kernel.out_avals)} "
                         f"outputs, got {len(inputs)} and {len(outputs)}")
    for role, arrays, avals in (("input", inputs, kernel.in_avals), ("output", outputs, kernel.out_avals)):
        for number, (array, aval) in enumerate(zip(arrays, avals)):
            if not isinstance(array, np.ndarray) or array.dtype != aval.dtype \
                    or array.size != int(np.prod(aval.shape)) or (contiguous and not array.flags.c_contiguous):
                layout = "C-contiguous " if contiguous else ""
                raise ValueError(f"kernel {compiled.name}: {role} {number} must be a {layout}{aval} array, got "
                                 f"{getattr(array, 'dtype', type(array).__name__)}{getattr(array, 'shape', '')}")
    device = compiled.device
    results = [device.allocate(aval) for aval in kernel.out_avals]
    compiled.launch([device.upload(np.ascontiguousarray(array)) for array in inputs], results)
    for out, buffer, aval in zip(outputs, results, kernel.out_avals):
        out.reshape(-1)[...] = device.download(buffer, aval).reshape(-1)


@attrs.frozen
class KernelInfo:
    """What ``Tensor.schedule()`` and ``jit(f).lower(...).kernels`` show of one kernel."""

    name: str
    device: str
    source: str = attrs.field(repr=False)
    kernel: Kernel = attrs.field(repr=False)

    def __str__(self) -> str:
        return f"{self.name} on {self.device}"


def _data_pointer_offset() -> int | None:
    """Where an ndarray object keeps its data pointer: NumPy's ``PyArrayObject`` has it right after the
    object header. Checked against ``__array_interface__`` on a few arrays (views, offsets, read-only);
    None when it is not there (a debug or free-threaded CPython), and ``data_address`` asks NumPy."""
    offset = 2 * ctypes.sizeof(ctypes.c_void_p)  # reference count and type
    base = np.arange(12, dtype=np.float64)
    probes = [base, base[3:], base[::2], base.reshape(3, 4).T, np.empty(5, np.int8), np.zeros(0, np.float32)]
    probes[0].flags.writeable = False
    for probe in probes:
        if (ctypes.c_void_p.from_address(id(probe) + offset).value or 0) != probe.__array_interface__["data"][0]:
            return None
    return offset


_DATA_POINTER_OFFSET = _data_pointer_offset()


def _make_data_address() -> Callable[[np.ndarray], int | None]:
    offset, pointer_at = _DATA_POINTER_OFFSET, ctypes.c_void_p.from_address
    if offset is None:
        return lambda array: int(array.__array_interface__["data"][0])

    def data_address(array: np.ndarray) -> int | None:
        """The address of ``array``'s first element (None for a null pointer), read from the object:
        a fraction of ``__array_interface__``'s time (docs/performance.md)."""
        return pointer_at(id(array) + offset).value
    return data_address


data_address = _make_data_address()


def _replay_kernel(function: Callable[..., None] | None, tail: tuple[int, ...], input_slots: list[int],
                   output_specs: list[tuple[tuple[int, ...], np.dtype]], output_slots: list[int],
                   ) -> Callable[[list[Any]], None]:
    """One kernel step of the lean replay: allocate its outputs, launch it on raw addresses (outputs
    first), store the outputs in their slots. ``function`` None: an empty kernel, nothing to launch."""
    address = data_address
    makers = [pool.allocator(shape, dtype) for shape, dtype in output_specs]  # large outputs reuse pooled memory
    if len(output_specs) == 1:  # the usual kernel: one output, no list to build
        (make,), (output_slot,) = makers, output_slots

        def run_one_output(slots: list[Any]) -> None:
            output = make()
            if function is not None:
                function(address(output), *map(address, map(slots.__getitem__, input_slots)), *tail)
            slots[output_slot] = output
        return run_one_output

    def run(slots: list[Any]) -> None:
        outputs = [make() for make in makers]
        if function is not None:
            function(*map(address, outputs), *map(address, map(slots.__getitem__, input_slots)), *tail)
        for i, output in zip(output_slots, outputs):
            slots[i] = output
    return run


def _launcher(compiled: Any) -> tuple[Callable[..., None], tuple[int, ...]]:
    """How the replay calls a compiled kernel: a function taking the buffer addresses (outputs first)
    and then the trailing arguments. A single-threaded CPU kernel is its ctypes function, with its
    whole outer range as the trailing arguments; any other goes through ``launch``."""
    function = getattr(compiled, "function", None)
    if function is not None and getattr(compiled, "parallel", True) is False:
        return function, (0, compiled.outer)
    launch = compiled.launch
    return (lambda *pointers: launch(pointers)), ()


class Plan:
    """The compiled form of one IR: kernels (compiled for ``device``) and host steps, in order."""

    def __init__(self, ir: IR, device: Device, restored: tuple[list[PlanStep], list[Any]] | None = None) -> None:
        """Schedule and compile ``ir``; or, with ``restored`` (steps and their compiled kernels, from
        ``PlanDiskCache.load``), take those instead."""
        started = time.perf_counter()
        self.ir = inline_calls(ir)  # the outputs of calls are renamed when their bodies are inlined
        self.ir = rewrite_scans(self.ir)  # products that need not run per step leave the loops
        limit = device.max_reduction  # loop iterations one kernel invocation may run
        if limit:
            self.ir = split_long_reductions(self.ir, limit)
        self.device = device
        row_reductions = bool(device.row_reductions)  # see schedule._materialized
        scheduled: Sequence[PlanStep] = restored[0] if restored is not None else []
        if restored is None:
            fresh = schedule(self.ir, row_reductions)
            scheduled = fuse_siblings(fresh) if device.fuse_siblings else fresh
        # control flow (scan, while, cond): loops and branches over compiled sub-plans (lower/control.py)
        self.steps: list[PlanStep] = [ControlStep(step.eqn) if isinstance(step, HostStep) and is_control(step.eqn)
                                      else step for step in scheduled]
        if restored is None:
            PHASE_SECONDS["schedule"] += time.perf_counter() - started
        # a resident device's control steps run on its buffers (lower/device_control.py)
        self.resident = bool(device.resident)
        self._const_buffers: list[Any] | None = None  # run_buffers' consts, uploaded once
        self._literals: dict[int, Any] = {}  # literals as device buffers, uploaded once (``_literal_buffer``)
        def compile_sub(sub: IR) -> Plan:
            return compile_plan(sub, device)
        self.controls = {id(step): device_control_runner(step.eqn, compile_sub, device) if self.resident
                         else control_runner(step.eqn, compile_sub)
                         for step in self.steps if isinstance(step, ControlStep)}
        kernel_steps = [step for step in self.steps if isinstance(step, KernelStep)]
        self.kernels = [step.kernel for step in kernel_steps]
        compiled = restored[1] if restored is not None else device.compile_many(self.kernels)
        self.compiled = {id(step): kernel for step, kernel in zip(kernel_steps, compiled)}
        self.release_after = _last_uses(self.ir, self.steps)
        self.replay = None if self.resident else self._replay_steps()
        self.launches = self._launches() if self.replay is not None else None
        self.native_launches = self._native_launches() if self.launches is not None else None
        if debug_level() >= 3:  # a device's compiled kernel carries the optimiser's opts
            for kernel, done in zip(self.kernels, compiled):
                print(getattr(done, "kernel", kernel), file=sys.stderr)

    def _launches(self) -> list[tuple[Callable[..., None], tuple[int, ...], tuple[Var, ...], tuple[Var, ...]]] | None:
        """The plan as raw kernel launches, (function, trailing arguments, input vars, output vars) per step,
        the function taking output then input addresses; None unless every step is a non-empty kernel with a
        raw launch. A scan whose body plan has them runs its loop on addresses (``lower/control.py``)."""
        launches = []
        for step in self.steps:
            if not isinstance(step, KernelStep):
                return None
            compiled = self.compiled[id(step)]
            if getattr(compiled, "launch", None) is None or not getattr(compiled, "size", 0):
                return None
            function, tail = _launcher(compiled)
            launches.append((function, tail, step.inputs, step.outputs))
        return launches

    def _native_launches(self) -> list[tuple[int, int, int]] | None:
        """Beside ``launches``, each kernel as native code can launch it (``Device.native_loop``): (address,
        outer range, chunks: 1 for a single-threaded kernel); None when one has no address or more buffers
        (or chunks) than the native pool's trampolines take."""
        native = []
        for step in self.steps:
            compiled = self.compiled[id(step)]
            address = getattr(compiled, "address", None)
            if not isinstance(address, int) or not hasattr(compiled, "outer"):
                return None
            parallel = getattr(compiled, "parallel", True)
            if not getattr(compiled, "native", False):  # more buffers than the trampolines take
                return None
            native.append((address, int(compiled.outer), int(compiled.threads) if parallel else 1))
        return native

    def _replay_steps(self) -> Callable[[list[np.ndarray]], list[np.ndarray]] | None:
        """The lean replay (see ``replay_arrays``), made once: one closure per step, reading and writing a
        list of slots (the plan's consts and inputs first, then intermediates), or one closure for the
        whole plan when it is a single kernel; None when a compiled kernel has no raw ``launch`` (a device
        other than the CPU)."""
        slot_of: dict[int, int] = {}
        for var in (*self.ir.const_vars, *self.ir.in_vars):
            slot_of.setdefault(var.id, len(slot_of))
        inputs = len(slot_of)

        def slot(var: Var) -> int:
            return slot_of.setdefault(var.id, len(slot_of))

        steps: list[tuple[Callable[[list[Any]], None], list[int]]] = []
        for step, released in zip(self.steps, self.release_after):
            if isinstance(step, KernelStep):
                compiled = self.compiled[id(step)]
                if getattr(compiled, "launch", None) is None or not hasattr(compiled, "size"):
                    return None
                function, tail = _launcher(compiled)
                run = _replay_kernel(function if compiled.size else None, tail, [slot(v) for v in step.inputs],
                                     [(v.aval.shape, v.aval.dtype) for v in step.outputs],
                                     [slot(v) for v in step.outputs])
            elif isinstance(step, ControlStep):
                operands = [np.asarray(atom.value, atom.aval.dtype) if isinstance(atom, Literal) else slot(atom)
                            for atom in step.eqn.inputs]
                run = _replay_control(self.controls[id(step)], operands, [slot(v) for v in step.eqn.outputs])
            else:
                for atom in step.eqn.inputs:
                    if isinstance(atom, Var):
                        slot(atom)
                for var in step.eqn.outputs:
                    slot(var)
                run = functools.partial(self._replay_host, step, dict(slot_of))
            steps.append((run, [slot_of[var_id] for var_id in released if var_id in slot_of]))
        outputs: list[int | Literal] = [atom if isinstance(atom, Literal) else slot_of[atom.id]
                                        for atom in self.ir.outputs]
        padding: list[Any] = [None] * (len(slot_of) - inputs)
        only = self.steps[0] if len(self.steps) == 1 else None
        if isinstance(only, KernelStep) and len(only.outputs) == 1 and outputs == [inputs] \
                and self.compiled[id(only)].size:
            # the whole plan is one kernel with one output (a tiny jitted call): one closure, no slots
            function, tail = _launcher(self.compiled[id(only)])
            shape, dtype = only.outputs[0].aval.shape, only.outputs[0].aval.dtype
            # a large output reuses pooled memory (np.empty's fresh mmap faulted a 64 MB GELU output in per call)
            input_slots, address = [slot_of[v.id] for v in only.inputs], data_address
            make = pool.allocator(shape, dtype)

            def replay_one_kernel(arrays: list[np.ndarray]) -> list[np.ndarray]:
                output = make()
                function(address(output), *map(address, map(arrays.__getitem__, input_slots)), *tail)
                return [output]

            def replay_one_kernel_in_order(arrays: list[np.ndarray]) -> list[np.ndarray]:
                output = make()
                function(address(output), *map(address, arrays), *tail)
                return [output]
            return replay_one_kernel_in_order if input_slots == list(range(inputs)) else replay_one_kernel

        def replay(arrays: list[np.ndarray]) -> list[np.ndarray]:
            slots = arrays + padding
            for run, released in steps:
                run(slots)
                for i in released:
                    slots[i] = None
            return [slots[o] if isinstance(o, int) else np.asarray(o.value) for o in outputs]
        return replay

    def _replay(self, args: Sequence[np.ndarray], consts: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        """``run`` without per-kernel checks (DEBUG and NaN checks off): the plan's inputs are checked
        once (dtype, size, C order), then ``replay_arrays`` launches every kernel on raw addresses."""
        arrays = []
        values = (*(self.ir.consts if consts is None else consts), *args)
        for var, value in zip((*self.ir.const_vars, *self.ir.in_vars), values):
            array = np.asarray(value)
            if array.dtype != var.aval.dtype or array.size != math.prod(var.aval.shape):
                raise ValueError(f"plan input {var} got a {array.dtype.name}{list(array.shape)} array")
            arrays.append(array if array.flags.c_contiguous else np.ascontiguousarray(array))
        return self.replay_arrays(arrays)

    def replay_arrays(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run the plan on ``arrays`` (its consts, then its inputs), which the caller vouches for: C-contiguous
        ndarrays of the declared dtypes and sizes (jit's fast path knows them from the call's signature and
        calls ``replay`` itself). Outputs are fresh arrays, or the inputs an output passes through."""
        assert self.replay is not None
        return self.replay(arrays)

    @staticmethod
    def _replay_host(step: HostStep, slot_of: dict[int, int], slots: list[Any]) -> None:
        """One host step of the replay: its NumPy implementation, its outputs made C-contiguous in their dtype."""
        env = {var_id: slots[i] for var_id, i in slot_of.items() if slots[i] is not None}
        _run_host(step, env)
        for var in step.eqn.outputs:
            value = env[var.id]
            if value.dtype != var.aval.dtype or not value.flags.c_contiguous:
                value = np.ascontiguousarray(value, dtype=var.aval.dtype)
            slots[slot_of[var.id]] = value

    def kernel_infos(self) -> list[KernelInfo]:
        return [KernelInfo(k.name, self.device.name, self.device.render(k), k) for k in self.kernels]

    def run(self, args: Sequence[np.ndarray], consts: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        if self.resident:
            return self._run_resident(args, consts)
        if self.replay is not None and not debug_level() and not nonfinite_checks():
            return self._replay(args, consts)
        env: dict[int, np.ndarray] = {}
        for var, value in zip(self.ir.const_vars, self.ir.consts if consts is None else consts):
            env[var.id] = np.asarray(value)
        for var, value in zip(self.ir.in_vars, args):
            env[var.id] = np.asarray(value)
        level = debug_level()
        checks = nonfinite_checks()  # FUNCGRAD_DEBUG_NANS / _INFS: () when off
        for position, step in enumerate(self.steps):
            started = time.perf_counter() if level >= 2 else 0.0
            rates = ""
            if isinstance(step, KernelStep):
                # pooled as in the replay, so DEBUG=2's times do not count a large output's fresh page faults
                outputs = [pool.empty(v.aval.shape, v.aval.dtype) for v in step.outputs]
                inputs = [np.ascontiguousarray(env[v.id]) for v in step.inputs]
                self.compiled[id(step)](inputs, outputs)
                for var, value in zip(step.outputs, outputs):
                    env[var.id] = value
                label = step.kernel.name
                if level >= 2:
                    seconds = max(time.perf_counter() - started, 1e-9)
                    moved = sum(x.nbytes for x in inputs) + sum(x.nbytes for x in outputs)
                    flops = kernel_flops(step.kernel)
                    rates = f" {moved / seconds / 1e9:8.2f} GB/s {flops / seconds / 1e9:8.2f} GFLOP/s"
            elif isinstance(step, ControlStep):
                label = _run_control(step, self.controls[id(step)], env)
            else:
                label = _run_host(step, env)
            if checks:
                hooks.check_step(self.ir, step, lambda var: env[var.id], checks)
            for var_id in self.release_after[position]:  # intermediates nobody reads again
                env.pop(var_id, None)
            if level >= 2:
                elapsed = time.perf_counter() - started
                print(f"  {label:<40s} {elapsed * 1e6:9.1f} us{rates}", file=sys.stderr)
        if level >= 1:
            print(f"realized with {len(self.kernels)} kernels, "
                  f"{sum(isinstance(s, HostStep) for s in self.steps)} host steps{_controls_text(self.steps)}",
                  file=sys.stderr)
        return [np.asarray(a.value) if isinstance(a, Literal) else env[a.id] for a in self.ir.outputs]


    def _run_resident(self, args: Sequence[np.ndarray], consts: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        """``run`` for a device with its own memory: the inputs start on the host, the outputs are downloaded."""
        host: dict[int, np.ndarray] = {}
        for var, value in zip(self.ir.const_vars, self.ir.consts if consts is None else consts):
            host[var.id] = np.asarray(value)
        for var, value in zip(self.ir.in_vars, args):
            host[var.id] = np.asarray(value)
        to_host, _ = self._resident_steps(host, {})
        if debug_level() >= 1:
            print(f"realized with {len(self.kernels)} kernels, "
                  f"{sum(isinstance(s, HostStep) for s in self.steps)} host steps{_controls_text(self.steps)} "
                  f"on {self.device.name}", file=sys.stderr)
        return [np.asarray(a.value) if isinstance(a, Literal) else to_host(a.id) for a in self.ir.outputs]

    def run_buffers(self, buffers: Sequence[Any]) -> list[Any]:
        """Run on a resident device's buffers (one per input of the plan's IR, as ``device.upload`` or a
        kernel made them) and return the outputs as device buffers: nothing crosses to the host but what a
        host step reads (and a control step's predicate or index, ``lower/device_control.py``). The consts
        and literal outputs are uploaded once per plan and shared; an output may be an input buffer. The
        caller must not write into the buffers it gets back (the loops copy out of them)."""
        if not self.resident:
            raise ValueError(f"run_buffers needs a device with its own memory; {self.device.name} has none "
                             "(use run)")
        if len(buffers) != len(self.ir.in_vars):
            raise ValueError(f"plan takes {len(self.ir.in_vars)} input buffers, got {len(buffers)}")
        on_device = {var.id: buffer for var, buffer in zip(self.ir.in_vars, buffers)}
        if self.ir.const_vars:
            if self._const_buffers is None:
                self._const_buffers = [self.device.upload(np.ascontiguousarray(c, v.aval.dtype))
                                       for v, c in zip(self.ir.const_vars, self.ir.consts)]
            on_device.update({v.id: b for v, b in zip(self.ir.const_vars, self._const_buffers)})
        _, to_device = self._resident_steps({}, on_device)
        return [self._literal_buffer(a) if isinstance(a, Literal) else to_device(a) for a in self.ir.outputs]

    def _literal_buffer(self, literal: Literal) -> Any:
        """A literal as a device buffer, uploaded once per plan (loops pass it on every step)."""
        buffer = self._literals.get(id(literal))
        if buffer is None:
            buffer = self._literals[id(literal)] = self.device.upload(np.asarray(literal.value, literal.aval.dtype))
        return buffer

    def _resident_steps(self, host: dict[int, np.ndarray], on_device: dict[int, Any]
                        ) -> tuple[Callable[[int], np.ndarray], Callable[[Var], Any]]:
        """The steps on a device with its own memory: ``host`` and ``on_device`` hold each value where it
        is; a value crosses over once, when a step on the other side first needs it. Kernels and control
        steps (loops over device buffers, ``lower/device_control.py``) read device buffers, host steps host
        arrays. Returns the functions fetching a value to either side."""
        device: Any = self.device
        avals: dict[int, Any] = {v.id: v.aval for v in (*self.ir.const_vars, *self.ir.in_vars)}

        def to_device(var: Any) -> Any:
            if var.id not in on_device:
                on_device[var.id] = device.upload(np.ascontiguousarray(host[var.id], var.aval.dtype))
            return on_device[var.id]

        def to_host(var_id: int) -> np.ndarray:
            if var_id not in host:
                host[var_id] = device.download(on_device[var_id], avals[var_id])
            return host[var_id]

        level = debug_level()
        checks = nonfinite_checks()
        for position, step in enumerate(self.steps):
            started = time.perf_counter() if level >= 2 else 0.0
            if isinstance(step, KernelStep):
                outputs = [device.allocate(v.aval) for v in step.outputs]
                self.compiled[id(step)].launch([to_device(v) for v in step.inputs], outputs)
                for var, buffer in zip(step.outputs, outputs):
                    on_device[var.id], avals[var.id] = buffer, var.aval
                label = step.kernel.name
            elif isinstance(step, ControlStep):  # on device buffers: the carries stay on the device
                eqn = step.eqn
                operands = [self._literal_buffer(a) if isinstance(a, Literal) else to_device(a) for a in eqn.inputs]
                for var, buffer in zip(eqn.outputs, self.controls[id(step)](operands)):
                    on_device[var.id], avals[var.id] = buffer, var.aval
                length = eqn.param_dict.get("length")
                label = f"loop {eqn.primitive.name}" + (f" x{length}" if length is not None else "")
            else:
                for atom in step.eqn.inputs:
                    if not isinstance(atom, Literal):
                        to_host(atom.id)
                label = _run_host(step, host)
                for var in step.eqn.outputs:
                    avals[var.id] = var.aval
            if checks:
                hooks.check_step(self.ir, step, lambda var: to_host(var.id), checks)
            for var_id in self.release_after[position]:
                host.pop(var_id, None)
                on_device.pop(var_id, None)
            if level >= 2:
                device.synchronize()
                print(f"  {label:<40s} {(time.perf_counter() - started) * 1e6:9.1f} us", file=sys.stderr)
        return to_host, to_device


def _last_uses(ir: IR, steps: Sequence[PlanStep]) -> list[list[int]]:
    """For each step, the intermediate buffers it reads (or writes) for the last time: the plan
    drops them then, so their memory is reused by later steps instead of living to the end."""
    keep = {a.id for a in ir.outputs if not isinstance(a, Literal)}
    keep |= {v.id for v in ir.in_vars} | {v.id for v in ir.const_vars}
    last: dict[int, int] = {}
    for position, step in enumerate(steps):
        if isinstance(step, KernelStep):
            touched = [v.id for v in step.inputs] + [v.id for v in step.outputs]
        else:
            touched = [a.id for a in step.eqn.inputs if not isinstance(a, Literal)] + [v.id for v in step.eqn.outputs]
        for var_id in touched:
            last[var_id] = position
    release: list[list[int]] = [[] for _ in steps]
    for var_id, position in last.items():
        if var_id not in keep:
            release[position].append(var_id)
    return release


def kernel_flops(kernel: Kernel) -> int:
    """Arithmetic operations a kernel performs (ALU nodes of its expressions times the iterations
    that evaluate them), for DEBUG=2's GFLOP/s; index arithmetic is not counted."""
    from funcgrad.lower.kernel import INDEX

    def count(roots: Sequence[Any]) -> int:
        seen: set[int] = set()
        stack, total = list(roots), 0
        while stack:
            e = stack.pop()
            if id(e) in seen:
                continue
            seen.add(id(e))
            total += e.dtype != INDEX and e.op not in ("const", "var", "load", "acc", "cast", "bitcast")
            stack.extend(e.args)
        return total

    outer = int(np.prod(kernel.shape, dtype=np.int64))
    inner = int(np.prod(kernel.reduce_shape, dtype=np.int64))
    reduce_ops = (count([kernel.reduce_expr]) + 1) * inner if kernel.reduce_expr is not None else 0
    return outer * (reduce_ops + count(kernel.outputs))


def _replay_control(runner: Callable[[list[np.ndarray]], list[np.ndarray]], operands: list[Any],
                    output_slots: list[int]) -> Callable[[list[Any]], None]:
    """One control step of the lean replay: its operands (slot numbers, or literal arrays) to its runner,
    the results into their slots."""
    def run(slots: list[Any]) -> None:
        outs = runner([slots[o] if type(o) is int else o for o in operands])
        for i, value in zip(output_slots, outs):
            slots[i] = value
    return run


def _controls_text(steps: Sequence[PlanStep]) -> str:
    """DEBUG=1's count of control steps (``, 2 control steps (scan, while)``), empty when there are none."""
    names = [step.eqn.primitive.name for step in steps if isinstance(step, ControlStep)]
    return f", {len(names)} control step{'s' * (len(names) != 1)} ({', '.join(names)})" if names else ""


def _run_control(step: ControlStep, runner: Callable[[list[np.ndarray]], list[np.ndarray]],
                 env: dict[int, np.ndarray]) -> str:
    eqn = step.eqn
    outs = runner([np.asarray(a.value, a.aval.dtype) if isinstance(a, Literal) else env[a.id] for a in eqn.inputs])
    for var, value in zip(eqn.outputs, outs):
        env[var.id] = value
    length = eqn.param_dict.get("length")
    return f"loop {eqn.primitive.name}" + (f" x{length}" if length is not None else "")


def _run_host(step: HostStep, env: dict[int, np.ndarray]) -> str:
    eqn = step.eqn
    args = [np.asarray(a.value) if isinstance(a, Literal) else env[a.id] for a in eqn.inputs]
    with np.errstate(all="ignore"):
        outs = eqn.primitive.impl(*args, **eqn.param_dict)
    outs = outs if eqn.primitive.multiple_results else (outs,)
    for var, value in zip(eqn.outputs, outs):
        env[var.id] = np.asarray(value)
    return f"host {eqn.primitive.name}"


# --- where building plans spends its time ---------------------------------------------------------

# Seconds over the whole process: trace (jit), schedule (inline calls, lower convolutions, fuse),
# optimize (choosing each kernel's opts, BEAM included), render (kernel -> device source), llvm
# (source -> object code -> loaded function, disk hits included), plan_load / plan_store (the plan
# disk cache's own reading, checking and writing).
PHASE_SECONDS: dict[str, float] = dict.fromkeys(
    ("trace", "schedule", "optimize", "render", "llvm", "plan_load", "plan_store"), 0.0)
PHASE_COUNTS: dict[str, int] = dict.fromkeys(
    ("plans_built", "plans_loaded", "kernels_compiled", "kernels_from_disk"), 0)
_trace_not_reported = [0.0]  # traced since the last DEBUG=2 plan line


def record_trace(seconds: float) -> None:
    """jit reports the time of each trace here; DEBUG=2 shows it on the next plan's line."""
    PHASE_SECONDS["trace"] += seconds
    _trace_not_reported[0] += seconds


def reset_phases() -> None:
    """Zero ``PHASE_SECONDS`` and ``PHASE_COUNTS`` (benchmarks measure one workload at a time)."""
    PHASE_SECONDS.update(dict.fromkeys(PHASE_SECONDS, 0.0))
    PHASE_COUNTS.update(dict.fromkeys(PHASE_COUNTS, 0))
    _trace_not_reported[0] = 0.0


def _report_plan(plan: Plan, loaded: bool, seconds: dict[str, float], counts: dict[str, int]) -> None:
    """DEBUG=2's line for one plan: what building it cost, phase by phase, since ``seconds``."""
    spent = {name: (PHASE_SECONDS[name] - seconds[name]) * 1e3 for name in PHASE_SECONDS}
    made = {name: PHASE_COUNTS[name] - counts[name] for name in PHASE_COUNTS}
    trace, _trace_not_reported[0] = _trace_not_reported[0] * 1e3, 0.0
    hosts = sum(isinstance(step, HostStep) for step in plan.steps)
    how = "loaded from the plan cache" if loaded else "built"
    print(f"plan {how}: {len(plan.kernels)} kernels, {hosts} host steps{_controls_text(plan.steps)} | "
          f"trace {trace:.1f} ms, "
          f"schedule {spent['schedule']:.1f} ms, optimize {spent['optimize']:.1f} ms, render {spent['render']:.1f} ms, "
          f"llvm {spent['llvm']:.1f} ms "
          f"({made['kernels_compiled']} compiled, {made['kernels_from_disk']} from disk), "
          f"plan cache load {spent['plan_load']:.1f} ms, store {spent['plan_store']:.1f} ms", file=sys.stderr)


# --- whole plans on disk ------------------------------------------------------------------------------

PLAN_CACHE_FORMAT = "funcgrad-plan-v1"
_PLAN_MAGIC = b"FGPLAN1\n"
# Settings that change what an IR compiles to (the kernel optimiser's), besides funcgrad's own code.
_SETTINGS_THAT_CHANGE_CODE = ("BEAM", "NOOPT")
_SETTINGS_THAT_DO_NOT = ("FUNCGRAD_CACHE", "FUNCGRAD_DATA", "FUNCGRAD_PLAN_CACHE")
MAX_PLAN_FILES = 4096  # plans kept on disk per folder (entries are ~10 KB to a few MB)
TRIM_EVERY = 64  # plans stored between two checks of the folder's size (the first store checks)


def _boundary(ir: IR) -> list[Var]:
    """The variables a plan shares with its caller, in a fixed order: inputs, consts, outputs."""
    return [*ir.in_vars, *ir.const_vars, *(atom for atom in ir.outputs if isinstance(atom, Var))]


class _NumberingPickler(pickle.Pickler):
    """Pickles steps with each variable written as (number, aval): numbers follow first use,
    starting with the boundary, so an equal IR in another process maps onto them."""

    def __init__(self, file: io.BytesIO, boundary: Sequence[Var]) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.numbers: dict[int, int] = {}
        for var in boundary:
            self.numbers.setdefault(id(var), len(self.numbers))

    def persistent_id(self, obj: Any) -> Any:
        if isinstance(obj, Var):
            return (self.numbers.setdefault(id(obj), len(self.numbers)), obj.aval)
        return None


class _NumberingUnpickler(pickle.Unpickler):
    """The reverse of ``_NumberingPickler``: boundary numbers become the caller's variables (their
    avals must agree), every other number a fresh variable."""

    def __init__(self, file: io.BytesIO, boundary: Sequence[Var]) -> None:
        super().__init__(file)
        self.variables: dict[int, Var] = {}
        seen: set[int] = set()
        for var in boundary:
            if id(var) not in seen:
                seen.add(id(var))
                self.variables[len(self.variables)] = var

    def persistent_load(self, pid: Any) -> Var:
        number, aval = pid
        var = self.variables.get(number)
        if var is None:
            var = self.variables[number] = Var(aval)
        elif var.aval != aval:
            raise pickle.UnpicklingError(f"variable {number} is {aval} in the entry but {var.aval} here")
        return var


class PlanDiskCache:
    """Compiled plans on disk, one checksummed file per (IR structure, device and its fingerprint,
    funcgrad's code version, code-changing settings). A missing, unreadable, corrupt or stale entry
    reads as a miss and is rebuilt, never trusted. Entries are pickles: the folder is trusted as the
    object code beside it is.

    >>> cache = PlanDiskCache(Path.home() / ".cache/funcgrad/plans", lambda: "my-cpu")  # doctest: +SKIP
    """

    def __init__(self, folder: str | os.PathLike[str], fingerprint: Callable[[], str]) -> None:
        self.folder = Path(folder)
        self.fingerprint = fingerprint
        self.stats = {"loaded": 0, "stored": 0, "rejected": 0}

    def header(self, structure: str, device_name: str) -> tuple[str, ...]:
        settings = sorted((name, value) for name, value in os.environ.items()
                          if name in _SETTINGS_THAT_CHANGE_CODE
                          or (name.startswith("FUNCGRAD_") and name not in _SETTINGS_THAT_DO_NOT
                              and not name.endswith("_CACHE_SIZE")))
        return (PLAN_CACHE_FORMAT, code_version(), device_name, self.fingerprint(), repr(settings),
                hashlib.sha256(structure.encode()).hexdigest())

    def path(self, header: Sequence[str]) -> Path:
        return self.folder / f"{hashlib.sha256(chr(0).join(header).encode()).hexdigest()}.plan"

    def load(self, structure: str, ir: IR, device: Any) -> Plan | None:
        """The plan stored for ``ir`` (whose ``structure_key`` is ``structure``), its kernels loaded
        through ``device.load_cached`` (one whose object code is gone is compiled again); None on a miss."""
        started = time.perf_counter()
        header = self.header(structure, device.name)
        path = self.path(header)
        payload = read_checked(path, _PLAN_MAGIC)
        if payload is None:
            self.stats["rejected"] += path.exists()
            PHASE_SECONDS["plan_load"] += time.perf_counter() - started
            return None
        inlined = inline_calls(ir)
        try:
            stored_header, steps, tokens = _NumberingUnpickler(io.BytesIO(payload), _boundary(inlined)).load()
            kernel_steps = [step for step in steps if isinstance(step, KernelStep)]
            usable = tuple(stored_header) == header and len(tokens) == len(kernel_steps) \
                and all(isinstance(step, (KernelStep, HostStep, ControlStep)) for step in steps)
        except Exception:  # noqa: BLE001 - any damage the checksum let through reads as a miss
            usable = False
        PHASE_SECONDS["plan_load"] += time.perf_counter() - started
        if not usable:
            self.stats["rejected"] += 1
            return None
        compiled = []
        for step, token in zip(kernel_steps, tokens):
            kernel = device.load_cached(step.kernel, token)
            compiled.append(kernel if kernel is not None else device.compile(step.kernel))
        self.stats["loaded"] += 1
        with contextlib.suppress(OSError):
            os.utime(path)  # recently used: trim keeps it
        return Plan(inlined, device, (list(steps), compiled))

    def store(self, structure: str, plan: Plan) -> bool:
        """Write ``plan``; False (nothing written) when a kernel has no cache token or a step
        cannot be pickled (a host step holding a local function, say)."""
        started = time.perf_counter()
        try:
            tokens = [getattr(plan.compiled[id(step)], "cache_token", None)
                      for step in plan.steps if isinstance(step, KernelStep)]
            if any(token is None for token in tokens):
                return False
            header = self.header(structure, plan.device.name)
            buffer = io.BytesIO()
            try:
                _NumberingPickler(buffer, _boundary(plan.ir)).dump((header, plan.steps, tokens))
            except (pickle.PicklingError, TypeError, AttributeError, RecursionError):
                return False
            # no fsync: a file a crash leaves damaged fails its checksum and is rebuilt
            write_atomically(self.path(header), checked_entry(_PLAN_MAGIC, buffer.getvalue()))
            if self.stats["stored"] % TRIM_EVERY == 0:
                self.trim()
            self.stats["stored"] += 1
            return True
        finally:
            PHASE_SECONDS["plan_store"] += time.perf_counter() - started

    def trim(self) -> int:
        """Keep the folder to ``MAX_PLAN_FILES`` entries: when over, delete the least recently used
        (a load touches its file) down to three quarters of it. Returns how many were deleted."""
        try:
            entries = []
            for path in self.folder.glob("*.plan"):
                with contextlib.suppress(OSError):  # another process may delete it meanwhile
                    entries.append((path.stat().st_mtime, path))
        except OSError:
            return 0
        if len(entries) <= MAX_PLAN_FILES:
            return 0
        doomed = sorted(entries)[:len(entries) - MAX_PLAN_FILES * 3 // 4]
        for _, path in doomed:
            with contextlib.suppress(OSError):
                path.unlink()
        return len(doomed)


# --- the plan cache ------------------------------------------------------------------------------------

# (device name, IR structure) -> plan; each holds its compiled kernels (and so their code) alive
_PLANS: LRUCache[tuple[str, str], Plan] = LRUCache(cache_size("FUNCGRAD_PLAN_CACHE_SIZE", 1024))


def structure_key(ir: IR) -> str:
    """A string equal for IRs that compute the same thing from inputs of the same types."""
    return str(ir)


def compile_plan(ir: IR, device: Device) -> Plan:
    """The plan for ``ir`` on ``device``, from the cache when an equal IR was compiled before (in
    this process, or on disk when the device has a ``plan_cache``).

    The plan's IR has no consts: pass them as leading inputs (``IR`` with consts are opened).
    """
    if nonfinite_checks():  # a cached plan's IR holds another graph's source lines
        return Plan(ir, device)
    structure = structure_key(ir)
    key = (device.name, structure)
    plan = _PLANS.get(key)
    if plan is not None:
        return plan
    seconds, counts = dict(PHASE_SECONDS), dict(PHASE_COUNTS)
    disk: PlanDiskCache | None = device.plan_cache
    plan = disk.load(structure, ir, device) if disk is not None else None
    loaded = plan is not None
    if plan is None:
        plan = Plan(ir, device)
        if disk is not None:
            disk.store(structure, plan)
    PHASE_COUNTS["plans_loaded" if loaded else "plans_built"] += 1
    if debug_level() >= 2:
        _report_plan(plan, loaded, seconds, counts)
    return _PLANS.put(key, plan)  # built outside the cache's lock: another thread's equal plan may win


def run_ir(ir: IR, args: Sequence[np.ndarray], device: Device) -> list[np.ndarray]:
    """Evaluate ``ir`` (consts included) on ``device`` through a cached plan."""
    if ir.const_vars:
        opened = IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)
        return compile_plan(opened, device).run([np.asarray(c) for c in ir.consts] + list(args))
    return compile_plan(ir, device).run(args)


