"""Lowering: IR -> fused kernels -> executable plans.

``schedule.py`` groups an IR into kernels (the kernel IR of ``kernel.py``) and host steps;
``plan.py`` compiles them for a device and runs them, with a cache keyed by the IR's structure.
``run_ir`` is what lazy realize and jit call, with the device object to run on
(``lower/device.py`` says what a plan asks of it; lower never imports a device).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from funcgrad.util.caches import LRUCache, cache_size
from funcgrad.ir.core import IR
from funcgrad.lower.device import Device
from funcgrad.lower.plan import Plan, compile_plan
from funcgrad.lower.plan import run_ir as _run_ir_on


def run_ir(ir: IR, args: Sequence[np.ndarray], device: Device) -> list[np.ndarray]:
    """Evaluate ``ir`` on NumPy arrays through a cached, compiled plan on ``device``."""
    return _run_ir_on(ir, args, device)


# (id of a jit IR, id of the device) -> (that IR, its plan): holding both keeps their ids from being reused
_JIT_PLANS: LRUCache[tuple[int, int], tuple[IR, Plan]] = LRUCache(cache_size("FUNCGRAD_PLAN_CACHE_SIZE", 1024))


def jit_plan(ir: IR, device: Device) -> Plan:
    """The compiled plan of a jit call's (open) IR on ``device``. jit keeps one IR object per signature,
    so its plan is found by identity: no graph to build, no key to print."""
    entry = _JIT_PLANS.get((id(ir), id(device)))
    if entry is None:
        entry = _JIT_PLANS.put((id(ir), id(device)), (ir, compile_plan(ir, device)))
    return entry[1]


def run_jit(ir: IR, args: Sequence[np.ndarray], device: Device) -> list[np.ndarray]:
    """Run a jit call's (open) IR through its plan (``jit_plan``) on ``device``."""
    return jit_plan(ir, device).run(args)


__all__ = ["Device", "Plan", "compile_plan", "jit_plan", "run_ir", "run_jit"]
