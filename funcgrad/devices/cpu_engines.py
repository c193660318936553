"""The CPU's kernel code lifetimes: an MCJIT engine or the loader's ``CodeMemory`` lives while a compiled
kernel holds its ``EngineHandle``, and is freed under the LLVM lock (llvmlite is not thread-safe)."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from funcgrad.devices.cpu_compiler import CodeMemory

LLVM_LOCK = threading.Lock()  # this process's global LLVM context, MCJIT engines and freeing kernel code


class EngineHandle:
    """Keeps kernel code (an MCJIT engine or the loader's ``CodeMemory``) alive while a
    ``CompiledKernel`` holds this handle. The last holder may die in any thread, perhaps while
    another one compiles, and LLVM's context is not thread-safe: the code is then only queued, and
    the next compile or load frees it under the LLVM lock."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine
        weakref.finalize(self, _RETIRED_ENGINES.append, engine)
        LIVE_ENGINES.add(self)


LIVE_ENGINES: weakref.WeakSet[EngineHandle] = weakref.WeakSet()  # for funcgrad.debug.live_counts
_RETIRED_ENGINES: list[Any] = []  # used by no kernel; freed by free_retired


def free_retired() -> None:
    """Free the code of kernels no one uses (called with LLVM_LOCK held)."""
    for engine in _RETIRED_ENGINES:
        if isinstance(engine, CodeMemory):
            engine.free()
    _RETIRED_ENGINES.clear()  # MCJIT engines are disposed of when their last reference goes


_LIVE_ENGINES: list[Any] = []  # kept for the life of the process (keep_engine)


def keep_engine(engine: Any) -> None:
    """Keep kernel code (an engine or ``CodeMemory``) alive for the life of the process (BEAM's candidates use this)."""
    _LIVE_ENGINES.append(engine)
