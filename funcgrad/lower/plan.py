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
"""

from __future__ import annotations

import sys
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any, Protocol

import attrs
import numpy as np

from funcgrad import nan_check
from funcgrad.debug import debug_level
from funcgrad.ir.core import IR, Literal
from funcgrad.lower.kernel import Kernel, evaluate_kernel
from funcgrad.lower.schedule import HostStep, KernelStep, Step, inline_calls, schedule


class CompiledKernel(Protocol):
    def __call__(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None: ...


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


class Device(Protocol):
    name: str

    def compile(self, kernel: Kernel) -> CompiledKernel: ...


class ReferenceDevice:
    """Runs kernels with the NumPy kernel evaluator (for tests and as a fallback)."""

    name = "REFERENCE"

    def compile(self, kernel: Kernel) -> CompiledKernel:
        def run(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
            for out, value in zip(outputs, evaluate_kernel(kernel, inputs)):
                out[...] = value
        return run


@attrs.frozen
class KernelInfo:
    """What ``Tensor.schedule()`` and ``jit(f).lower(...).kernels`` show of one kernel."""

    name: str
    device: str
    source: str = attrs.field(repr=False)
    kernel: Kernel = attrs.field(repr=False)

    def __str__(self) -> str:
        return f"{self.name} on {self.device}"


class Plan:
    """The compiled form of one IR: kernels (compiled for ``device``) and host steps, in order."""

    def __init__(self, ir: IR, device: Device) -> None:
        self.ir = inline_calls(ir)  # the outputs of calls are renamed when their bodies are inlined
        self.device = device
        self.steps: list[Step] = schedule(self.ir)
        kernel_steps = [step for step in self.steps if isinstance(step, KernelStep)]
        self.kernels = [step.kernel for step in kernel_steps]
        compile_many = getattr(device, "compile_many", None)
        compiled = compile_many(self.kernels) if compile_many is not None else [device.compile(k) for k in self.kernels]
        self.compiled = {id(step): kernel for step, kernel in zip(kernel_steps, compiled)}
        self.resident = bool(getattr(device, "resident", False))
        self.release_after = _last_uses(self.ir, self.steps)
        if debug_level() >= 3:  # a device's compiled kernel carries the optimiser's opts
            for kernel, done in zip(self.kernels, compiled):
                print(getattr(done, "kernel", kernel), file=sys.stderr)

    def kernel_infos(self) -> list[KernelInfo]:
        render = getattr(self.device, "render", str)
        return [KernelInfo(k.name, self.device.name, render(k), k) for k in self.kernels]

    def run(self, args: Sequence[np.ndarray], consts: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        if self.resident:
            return self._run_resident(args, consts)
        env: dict[int, np.ndarray] = {}
        for var, value in zip(self.ir.const_vars, self.ir.consts if consts is None else consts):
            env[var.id] = np.asarray(value)
        for var, value in zip(self.ir.in_vars, args):
            env[var.id] = np.asarray(value)
        level = debug_level()
        checks = nan_check.active_checks()  # FUNCGRAD_DEBUG_NANS / _INFS: () when off
        for position, step in enumerate(self.steps):
            started = time.perf_counter() if level >= 2 else 0.0
            rates = ""
            if isinstance(step, KernelStep):
                outputs = [np.empty(v.aval.shape, v.aval.dtype) for v in step.outputs]
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
            else:
                label = _run_host(step, env)
            if checks:
                nan_check.check_step(self.ir, step, lambda var: env[var.id], checks)
            for var_id in self.release_after[position]:  # intermediates nobody reads again
                env.pop(var_id, None)
            if level >= 2:
                elapsed = time.perf_counter() - started
                print(f"  {label:<40s} {elapsed * 1e6:9.1f} us{rates}", file=sys.stderr)
        if level >= 1:
            print(f"realized with {len(self.kernels)} kernels, "
                  f"{sum(isinstance(s, HostStep) for s in self.steps)} host steps", file=sys.stderr)
        return [np.asarray(a.value) if isinstance(a, Literal) else env[a.id] for a in self.ir.outputs]


    def _run_resident(self, args: Sequence[np.ndarray], consts: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        """``run`` for a device with its own memory: ``host`` and ``on_device`` hold each value
        where it is; a value crosses over once, when a step on the other side first needs it."""
        device: Any = self.device
        host: dict[int, np.ndarray] = {}
        on_device: dict[int, Any] = {}
        avals: dict[int, Any] = {}
        for var, value in zip(self.ir.const_vars, self.ir.consts if consts is None else consts):
            host[var.id] = np.asarray(value)
        for var, value in zip(self.ir.in_vars, args):
            host[var.id] = np.asarray(value)

        def to_device(var: Any) -> Any:
            if var.id not in on_device:
                on_device[var.id] = device.upload(np.ascontiguousarray(host[var.id], var.aval.dtype))
            return on_device[var.id]

        def to_host(var_id: int) -> np.ndarray:
            if var_id not in host:
                host[var_id] = device.download(on_device[var_id], avals[var_id])
            return host[var_id]

        level = debug_level()
        checks = nan_check.active_checks()
        for position, step in enumerate(self.steps):
            started = time.perf_counter() if level >= 2 else 0.0
            if isinstance(step, KernelStep):
                outputs = [device.allocate(v.aval) for v in step.outputs]
                self.compiled[id(step)].launch([to_device(v) for v in step.inputs], outputs)
                for var, buffer in zip(step.outputs, outputs):
                    on_device[var.id], avals[var.id] = buffer, var.aval
                label = step.kernel.name
            else:
                for atom in step.eqn.inputs:
                    if not isinstance(atom, Literal):
                        to_host(atom.id)
                label = _run_host(step, host)
            if checks:
                nan_check.check_step(self.ir, step, lambda var: to_host(var.id), checks)
            for var_id in self.release_after[position]:
                host.pop(var_id, None)
                on_device.pop(var_id, None)
            if level >= 2:
                device.synchronize()
                print(f"  {label:<40s} {(time.perf_counter() - started) * 1e6:9.1f} us", file=sys.stderr)
        if level >= 1:
            print(f"realized with {len(self.kernels)} kernels, "
                  f"{sum(isinstance(s, HostStep) for s in self.steps)} host steps on {device.name}", file=sys.stderr)
        return [np.asarray(a.value) if isinstance(a, Literal) else to_host(a.id) for a in self.ir.outputs]


def _last_uses(ir: IR, steps: Sequence[Step]) -> list[list[int]]:
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


def _run_host(step: HostStep, env: dict[int, np.ndarray]) -> str:
    eqn = step.eqn
    args = [np.asarray(a.value) if isinstance(a, Literal) else env[a.id] for a in eqn.inputs]
    with np.errstate(all="ignore"):
        outs = eqn.primitive.impl(*args, **eqn.param_dict)
    outs = outs if eqn.primitive.multiple_results else (outs,)
    for var, value in zip(eqn.outputs, outs):
        env[var.id] = np.asarray(value)
    return f"host {eqn.primitive.name}"


_PLANS: OrderedDict[tuple[str, str], Plan] = OrderedDict()
MAX_CACHED_PLANS = 1024


def structure_key(ir: IR) -> str:
    """A string equal for IRs that compute the same thing from inputs of the same types."""
    return str(ir)


def compile_plan(ir: IR, device: Device) -> Plan:
    """The plan for ``ir`` on ``device``, from the cache when an equal IR was compiled before.

    The plan's IR has no consts: pass them as leading inputs (``IR`` with consts are opened).
    """
    if nan_check.active_checks():  # a cached plan's IR holds another graph's source lines
        return Plan(ir, device)
    key = (device.name, structure_key(ir))
    plan = _PLANS.get(key)
    if plan is None:
        plan = Plan(ir, device)
        _PLANS[key] = plan
        if len(_PLANS) > MAX_CACHED_PLANS:
            _PLANS.popitem(last=False)
    else:
        _PLANS.move_to_end(key)
    return plan


def run_ir(ir: IR, args: Sequence[np.ndarray], device: Device) -> list[np.ndarray]:
    """Evaluate ``ir`` (consts included) on ``device`` through a cached plan."""
    if ir.const_vars:
        opened = IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)
        return compile_plan(opened, device).run([np.asarray(c) for c in ir.consts] + list(args))
    return compile_plan(ir, device).run(args)


