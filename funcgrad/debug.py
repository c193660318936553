"""The DEBUG ladder: one place that reads the ``DEBUG`` environment variable.

1: why a jit function retraced, and kernels per realize; 2: each step's time; 3: the kernel IR;
4: the generated source. Read on every use, so tests and notebooks can change it at run time.
``live_counts()`` says what a long run keeps alive (buffers, plans, kernels, engines, traces).
"""

from __future__ import annotations

import gc

from funcgrad.util.debug import debug_level  # noqa: F401 - funcgrad.debug.debug_level, as before


def live_counts() -> dict[str, int]:
    """How many of each thing that could pile up over a long run exist now; in a steady training loop
    none of them grows. ``lazy_buffers`` (arrays some Tensor or pending graph holds) and
    ``lazy_bytes`` (the realized ones' memory), ``plans`` (compiled plans cached) and ``jit_plans``
    (their index by jit IR), ``kernels`` (compiled kernels in the devices' memory caches),
    ``engines`` (LLVM execution engines alive), ``jit_functions`` (live ``jit`` wrappers) and
    ``jit_traces`` (signatures they have cached).

    >>> funcgrad.debug.live_counts()["plans"]  # doctest: +SKIP
    3
    """
    from funcgrad import lower
    from funcgrad.devices import _INSTANCES
    from funcgrad.devices.cpu_engines import LIVE_ENGINES
    from funcgrad.jit_runtime import LIVE_JITTED
    from funcgrad.lazy import LazyBuffer
    from funcgrad.lower import plan

    gc.collect()
    buffers = [o for o in gc.get_objects() if type(o) is LazyBuffer]
    jitted = list(LIVE_JITTED)
    return {
        "lazy_buffers": len(buffers),
        "lazy_bytes": sum(b.array.nbytes for b in buffers if b.array is not None),
        "plans": len(plan._PLANS),
        "jit_plans": len(lower._JIT_PLANS),
        "kernels": sum(len(device.memory_cache) for device in list(_INSTANCES.values())),
        "engines": len(LIVE_ENGINES),
        "jit_functions": len(jitted),
        "jit_traces": sum(len(f._cache) for f in jitted),
    }
