"""Lowering: IR -> fused kernels -> executable plans.

``schedule.py`` groups an IR into kernels (the kernel IR of ``kernel.py``) and host steps;
``plan.py`` compiles them for a device and runs them, with a cache keyed by the IR's structure.
``run_ir`` is what lazy realize and jit call.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from funcgrad.util.caches import LRUCache, cache_size
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


# (id of a jit IR, id of the device) -> (that IR, its plan): holding both keeps their ids from being reused
_JIT_PLANS: LRUCache[tuple[int, int], tuple[IR, Plan]] = LRUCache(cache_size("FUNCGRAD_PLAN_CACHE_SIZE", 1024))


def jit_plan(ir: IR, device: Device) -> Plan:
    """The compiled plan of a jit call's (open) IR on ``device``. jit keeps one IR object per signature,
    so its plan is found by identity: no graph to build, no key to print."""
    entry = _JIT_PLANS.get((id(ir), id(device)))
    if entry is None:
        entry = _JIT_PLANS.put((id(ir), id(device)), (ir, compile_plan(ir, device)))
    return entry[1]


def run_jit(ir: IR, args: Sequence[np.ndarray], device: Device | None = None) -> list[np.ndarray]:
    """Run a jit call's (open) IR through its plan (``jit_plan``)."""
    return jit_plan(ir, device or default_device()).run(args)


__all__ = [
    "Device", "Plan", "ReferenceDevice", "compile_plan", "default_device", "jit_plan", "run_ir", "run_jit",
    "set_default_device",
]
