"""Lowering: IR -> fused kernels -> executable plans.

``schedule.py`` groups an IR into kernels (the kernel IR of ``kernel.py``) and host steps;
``plan.py`` compiles them for a device and runs them, with a cache keyed by the IR's structure.
``run_ir`` is what lazy realize and jit call.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from funcgrad.ir.core import IR
from funcgrad.lower.plan import Device, Plan, ReferenceDevice, compile_plan
from funcgrad.lower.plan import run_ir as _run_ir_on

def default_device() -> Device:
    """The device lazy Tensors and jit run on by default: ``Device.DEFAULT`` from the registry
    (``$DEVICE`` if set, else the best available; see ``funcgrad.devices``)."""
    from funcgrad.devices import get_device
    device: Device = get_device(None)
    return device


def set_default_device(device: Device | str) -> None:
    """Make ``device`` (a registered name, or a device object, which is registered under its name) the default."""
    from funcgrad.devices import Device as Registry
    from funcgrad.devices import register_device
    if not isinstance(device, str):
        instance = device
        register_device(instance.name, lambda: instance, lambda: (True, "set as the default"))
        device = instance.name
    Registry.DEFAULT = device


def run_ir(ir: IR, args: Sequence[np.ndarray], device: Device | None = None) -> list[np.ndarray]:
    """Evaluate ``ir`` on NumPy arrays through a cached, compiled plan."""
    return _run_ir_on(ir, args, device or default_device())


_JIT_PLANS: OrderedDict[int, tuple[IR, Plan]] = OrderedDict()


def run_jit(ir: IR, args: Sequence[np.ndarray], device: Device | None = None) -> list[np.ndarray]:
    """Run a jit call's (open) IR. jit keeps one IR object per signature, so its plan is found by
    identity: no graph to build, no key to print."""
    device = device or default_device()
    entry = _JIT_PLANS.get(id(ir))
    if entry is None or entry[0] is not ir or entry[1].device is not device:
        entry = (ir, compile_plan(ir, device))
        _JIT_PLANS[id(ir)] = entry  # holding ``ir`` keeps its id from being reused
        if len(_JIT_PLANS) > 1024:
            _JIT_PLANS.popitem(last=False)
    return entry[1].run(args)


__all__ = [
    "Device", "Plan", "ReferenceDevice", "compile_plan", "default_device", "run_ir", "run_jit",
    "set_default_device",
]
