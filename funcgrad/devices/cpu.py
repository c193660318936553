"""The CPU device: kernels compiled to native code with LLVM (through llvmlite) and run in this process.

    Kernel --render_llvm--> LLVM IR text --(memory cache | disk cache | LLVM: parse, optimise, emit object)-->
    object code --load--> function address --ctypes--> CompiledKernel(inputs, outputs)

Where LLVM runs is ``FUNCGRAD_COMPILER``: ``worker`` (the default on x86-64 Linux) compiles in a
compiler worker process and links the object code into this one with ``cpu_compiler.load_object``,
so this process never loads LLVM (~100 MB resident); ``inprocess`` runs llvmlite here and links with
MCJIT engines. Both emit the same object code and share the disk cache (``WorkerTarget``,
``InProcessTarget``, ``host_target()``).

Compiled code is cached in memory (per device, keyed by the IR text) and on disk under
``$FUNCGRAD_CACHE`` (default ``~/.cache/funcgrad``), keyed by a hash of the IR text, the host CPU
and its features, and the llvmlite/LLVM versions. A disk entry is the object code with a magic
header, its length and a SHA-256 checksum; it is written atomically (temporary file in the same
folder, fsync, ``os.replace``) and a corrupt or truncated entry is recompiled, never trusted.
Both caches are bounded (docs/architecture.md, "Caches and their bounds"): the memory cache keeps the
``FUNCGRAD_KERNEL_CACHE_SIZE`` (default 4096) most recently used kernels, the disk cache deletes its
least recently used files when the folder grows over ``FUNCGRAD_CACHE_MAX_MB`` (default 1024). A
kernel's code (loaded pages or an MCJIT engine) lives as long as a ``CompiledKernel`` uses it (a cached
plan keeps an evicted kernel working), and is freed under the LLVM lock (llvmlite is not thread-safe).

Large kernels are split along their outermost loop across a persistent thread pool (ctypes
releases the GIL); small ones are called directly, because handing work to a thread costs more than
they take (see ``cpu_cost.PARALLEL_MIN_WORK``). The pool is ``cpu_pool.NativePool`` (hand-off and
waiting in generated code) where it runs, else ``cpu_threads._WorkerPool`` (Python threads and queues).

The CPU's concerns have files of their own: ``cpu_target`` (where LLVM runs, the host's identity and
fingerprint), ``cpu_engines`` (kernel code lifetimes), ``cpu_disk_cache`` (object code on disk),
``cpu_threads`` (thread pools, ``thread_count``), ``cpu_cost`` (work estimate, default threads),
``cpu_pipeline`` (the LLVM pipeline of a kernel), ``cpu_compiler`` (the compiler worker, the object
loader) and ``cpu_pool`` (the native pool). This module is the device and its compiled kernels.
"""

from __future__ import annotations

import ctypes
import heapq
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from funcgrad.devices import cpu_threads
from funcgrad.devices.cpu_compiler import symbol_address, undefined_symbols
from funcgrad.devices.cpu_cost import (
    INLINE_TRANSCENDENTAL_COST,
    PARALLEL_MIN_WORK,
    TRANSCENDENTAL,
    TRANSCENDENTAL_COST,
    estimated_work,
    heuristic_threads,
    kernel_threads,
)
from funcgrad.devices.cpu_disk_cache import DiskCache, trim_folder
from funcgrad.devices.cpu_engines import _RETIRED_ENGINES, LIVE_ENGINES, EngineHandle, keep_engine
from funcgrad.devices.cpu_pipeline import (
    SHORT_REDUCTION,
    SHORT_REORDER,
    SMALL_ELEMENTWISE_WORK,
    SMALL_KERNEL_WORK,
    optimization_level,
)
from funcgrad.devices.cpu_pool import MAX_BUFFERS, MAX_CHUNKS, native_pool
from funcgrad.devices.cpu_target import (
    CACHE_FORMAT,
    InProcessTarget,
    WorkerTarget,
    _Target,
    cache_root,
    compiler_mode,
    host_description_path,
    host_identity,
    host_target,
    worker_supported,
)
from funcgrad.devices.cpu_threads import _compile_pool_lock, _WorkerPool, compile_cost, compile_pool, worker_pool
from funcgrad.lower.device import Device, OptimizerTarget
from funcgrad.lower.kernel import Kernel
from funcgrad.lower.optimize import beam_width, optimize
from funcgrad.lower.plan import PHASE_COUNTS, PHASE_SECONDS, PlanDiskCache
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.render_loops import external_symbols, llvm_function_name
from funcgrad.util.caches import LRUCache, cache_size
from funcgrad.util.config import EnvironmentVariableError
from funcgrad.util.debug import debug_level

__all__ = ["CPUDevice", "CompiledKernel", "KernelCompileError", "DiskCache", "PARALLEL_MIN_WORK"]
# the names this module had before its concerns got files of their own (cpu_target, cpu_engines,
# cpu_disk_cache, cpu_threads, cpu_cost, cpu_pipeline), still importable from here
__all__ += ["CACHE_FORMAT", "INLINE_TRANSCENDENTAL_COST", "LIVE_ENGINES", "SHORT_REDUCTION", "SHORT_REORDER",
            "SMALL_ELEMENTWISE_WORK", "SMALL_KERNEL_WORK", "TRANSCENDENTAL", "TRANSCENDENTAL_COST", "EngineHandle",
            "InProcessTarget", "WorkerTarget", "_RETIRED_ENGINES", "_Target", "_WorkerPool", "cache_root",
            "compile_cost", "compile_pool", "compiler_mode", "estimated_work", "heuristic_threads",
            "host_description_path", "host_identity", "host_target", "keep_engine", "kernel_threads",
            "optimization_level", "trim_folder", "undefined_symbols", "worker_pool", "worker_supported"]

SHARED_NAME = "funcgrad_kernel"  # the function in every object: kernels differing only in name share their code


class KernelCompileError(RuntimeError):
    """A kernel could not be rendered or compiled; the message names the kernel (and shows its
    LLVM source when DEBUG >= 4)."""


class CompiledKernel:
    """A kernel compiled for this CPU; ``compiled(inputs, outputs)`` runs it, writing into the
    preallocated C-contiguous ``outputs``. ``origin`` says where the code came from: 'compiled',
    'disk' or 'memory'.

    >>> compiled = CPUDevice().compile(kernel)  # doctest: +SKIP
    >>> compiled([x, y], [out])  # doctest: +SKIP
    """

    def __init__(self, kernel: Kernel, source: str, address: int, origin: str, seconds: float,
                 engine: EngineHandle | None = None) -> None:
        self.kernel = kernel
        self.engine = engine  # the code at ``address`` lives as long as this (None: see keep_engine)
        self.name = kernel.name
        self.source = source
        self.origin = origin
        self.compile_seconds = seconds
        self.cache_token: tuple[str, str, Any] | None = None  # (source, disk key, opts): how a stored plan finds it
        self.address = address
        buffers = len(kernel.out_avals) + len(kernel.in_avals)
        self.function = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * buffers), ctypes.c_int64, ctypes.c_int64)(address)
        self.size = int(np.prod(kernel.shape))
        self.outer = kernel.shape[0] if kernel.shape else 1
        self.work = estimated_work(kernel)
        self.threads = min(kernel_threads(kernel, source), self.outer)  # chunks of axis 0 (the thread opt)
        self.parallel = self.threads > 1
        self.native = buffers <= MAX_BUFFERS and self.threads <= MAX_CHUNKS  # the native pool can launch it
        self._expected = [(aval.dtype, int(np.prod(aval.shape))) for aval in (*kernel.out_avals, *kernel.in_avals)]

    def __repr__(self) -> str:
        return f"CompiledKernel({self.name}, origin={self.origin})"

    def __call__(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        if len(inputs) != len(self.kernel.in_avals) or len(outputs) != len(self.kernel.out_avals):
            raise ValueError(f"kernel {self.name} takes {len(self.kernel.in_avals)} inputs and "
                             f"{len(self.kernel.out_avals)} outputs, got {len(inputs)} and {len(outputs)}")
        buffers = (*outputs, *inputs)
        for array, (dtype, size) in zip(buffers, self._expected):
            if not isinstance(array, np.ndarray) or array.dtype != dtype or array.size != size \
                    or not array.flags.c_contiguous:
                self._reject(outputs, inputs)
        for array in outputs:
            if not array.flags.writeable:
                self._reject(outputs, inputs)
        if self.size:
            self.launch([array.__array_interface__["data"][0] for array in buffers])

    def _reject(self, outputs: Sequence[Any], inputs: Sequence[Any]) -> None:
        kernel = self.kernel
        for role, arrays, avals in (("output", outputs, kernel.out_avals), ("input", inputs, kernel.in_avals)):
            for number, (array, aval) in enumerate(zip(arrays, avals)):
                if not isinstance(array, np.ndarray) or array.dtype != aval.dtype \
                        or array.size != int(np.prod(aval.shape)) or not array.flags.c_contiguous:
                    raise ValueError(f"kernel {self.name}: {role} {number} must be a C-contiguous {aval} array, got "
                                     f"{getattr(array, 'dtype', type(array).__name__)}{getattr(array, 'shape', '')}")
                if role == "output" and not array.flags.writeable:
                    raise ValueError(f"kernel {self.name}: output {number} is read-only")

    def launch(self, pointers: Sequence[int]) -> None:
        """Run on raw buffer addresses (outputs first), unchecked: the fast path for executors that
        validated their buffers once."""
        if not self.parallel:
            self.function(*pointers, 0, self.outer)
            return
        native = native_pool(wait=False) if self.native else None
        if native is not None:
            native.launch(self.address, pointers, self.outer, self.threads)
            return
        pool = worker_pool()
        chunks = self.threads
        bounds = [self.outer * i // chunks for i in range(chunks + 1)]
        pool.run(self.function, [(*pointers, bounds[i], bounds[i + 1]) for i in range(chunks)])


class CPUOptimizerTarget(OptimizerTarget):
    """What the kernel optimiser (``funcgrad.lower.optimize``) knows of this CPU; each call reads this
    module's current functions (tests pin ``thread_count``)."""

    @property
    def small_kernel_work(self) -> int:  # type: ignore[override]
        return SMALL_KERNEL_WORK

    def thread_count(self) -> int:
        return cpu_threads.thread_count()

    def heuristic_threads(self, kernel: Kernel) -> int:
        return heuristic_threads(kernel)

    def cache_folder(self) -> Path:
        return DiskCache().folder

    def cpu_name(self) -> str:
        return host_target().cpu

    def compile_for_timing(self, kernel: Kernel) -> CompiledKernel:
        source = render_llvm(kernel)
        target = host_target()
        object_code = target.compile(source, optimization_level(kernel))
        engine, address = target.load(object_code, llvm_function_name(kernel))
        keep_engine(engine)
        return CompiledKernel(kernel, source, address, "compiled", 0.0)


OPTIMIZER_TARGET = CPUOptimizerTarget()  # installed by funcgrad.devices (set_optimizer_target)


def shared_source(source: str, kernel: Kernel) -> str:
    """What is compiled for a kernel's LLVM ``source``: without the kernel listing above the code
    and with the function named SHARED_NAME, so kernels that differ only in name and shapes the
    code does not read (a flat elementwise loop runs over [start, end)) compile once and share one
    disk-cache entry (each is still loaded, and kept in memory, as itself): the CNN's 89 kernels
    are 76 compiles (a bias's and a filter's Adam update, say), the MLP's 28 are 24."""
    lines = source.splitlines()
    first = next((i for i, line in enumerate(lines) if not line.startswith(";")), len(lines))
    return "\n".join(lines[first:]).replace(f"@{llvm_function_name(kernel)}(", f"@{SHARED_NAME}(") + "\n"


class CPUDevice(Device):
    """Compiles kernels for the host CPU (see the module docstring).

    >>> device = CPUDevice()  # doctest: +SKIP
    >>> compiled = device.compile(kernel); compiled(inputs, outputs)  # doctest: +SKIP
    """

    name = "CPU"
    row_reductions = True  # render_llvm computes a reduction fused into its row's pass once per row
    fuse_siblings = True  # plans merge sibling elementwise kernels (funcgrad.lower.fuse)

    def __init__(self, cache_dir: str | os.PathLike[str] | None = None) -> None:
        self.disk_cache = DiskCache(cache_dir)
        self.memory_cache: LRUCache[str, CompiledKernel] = LRUCache(cache_size("FUNCGRAD_KERNEL_CACHE_SIZE", 4096))
        self.stats = {"compiled": 0, "disk_hits": 0, "memory_hits": 0}
        # whole plans beside the object code (funcgrad.lower.plan); FUNCGRAD_PLAN_CACHE=0 turns it off
        self.plan_cache = None if os.environ.get("FUNCGRAD_PLAN_CACHE") == "0" else \
            PlanDiskCache(self.disk_cache.folder.parent / "plans", self._plan_fingerprint)
        target = host_target()
        if isinstance(target, WorkerTarget):
            target.describe_in_background()

    def native_loop(self) -> Any:
        """The native loop driver (``devices/cpu_loop.py``) that compiled scans and while loops run in."""
        from funcgrad.devices.cpu_loop import native_loop
        return native_loop()

    def render(self, kernel: Kernel) -> str:
        """The kernel's LLVM IR text (what ``compile`` compiles and what DEBUG=4 prints), with the
        optimiser's opts (``funcgrad.lower.optimize``) unless the kernel has its own."""
        try:
            return render_llvm(optimize(kernel))
        except (ValueError, KeyError, TypeError) as error:
            raise KernelCompileError(f"kernel {kernel.name} cannot be rendered for the CPU: {error}") from error

    def compile(self, kernel: Kernel) -> CompiledKernel:
        prepared = self._prepare(kernel)
        if isinstance(prepared, CompiledKernel):
            return prepared
        return self._finish(*prepared, None)

    def compile_many(self, kernels: Sequence[Kernel]) -> list[CompiledKernel]:
        """``compile`` every kernel, running LLVM on up to ``cpu_threads.thread_count()`` kernels at once (each
        thread with its own LLVM context): a plan's first build takes about 1/CPUs of the time.
        Each kernel's LLVM starts as soon as it is rendered, while the next ones render (not under
        BEAM, whose timings would see it); the time spent waiting for LLVM after the last render
        counts as the ``llvm`` phase."""
        if cpu_threads.thread_count() < 2 or len(kernels) < 2:
            return [self.compile(kernel) for kernel in kernels]
        target = host_target()

        def build(source: str, level: int, key: str) -> bytes | BaseException:
            try:
                with self.disk_cache.compiling(key):  # another process compiling it: wait, then read it
                    stored = self.disk_cache.load(key)
                    if stored is not None:
                        return stored
                    self._check_symbols(source)
                    object_code = target.compile_alone(source, level)
                    self.disk_cache.store(key, object_code)
                    return object_code
            except RuntimeError as error:
                return error

        prepared: list[CompiledKernel | tuple[Kernel, str, int, str, str]] = []
        builds: dict[str, Future[bytes | BaseException]] = {}  # one compile per distinct source
        # what waits for a compiling thread, heaviest first (so no long compile is left for last while
        # the other threads idle): (-estimated cost, order, source, pipeline, its future)
        waiting: list[tuple[float, int, str, int, str, Future[bytes | BaseException]]] = []
        waiting_lock = threading.Lock()
        stream = beam_width() == 0

        def build_heaviest() -> None:
            with waiting_lock:
                _, _, source, level, key, future = heapq.heappop(waiting)
            try:
                future.set_result(build(source, level, key))
            except BaseException as error:  # noqa: BLE001 - the waiting caller raises it
                future.set_exception(error)

        with _compile_pool_lock:
            pool = compile_pool()

            def submit(item: CompiledKernel | tuple[Kernel, str, int, str, str]) -> None:
                if not isinstance(item, CompiledKernel) and item[4] not in builds \
                        and self.disk_cache.load(item[3]) is None:
                    builds[item[4]] = Future()
                    with waiting_lock:
                        heapq.heappush(waiting, (-compile_cost(item[4], item[2]), len(builds), item[4], item[2],
                                                 item[3], builds[item[4]]))
                    pool.submit(build_heaviest)

            for kernel in kernels:
                prepared.append(self._prepare(kernel))
                if stream:
                    submit(prepared[-1])
            for item in prepared if not stream else ():
                submit(item)
            started = time.perf_counter()
            objects = {source: future.result() for source, future in builds.items()}
            PHASE_SECONDS["llvm"] += time.perf_counter() - started
        return [p if isinstance(p, CompiledKernel) else self._finish(*p, objects.get(p[4])) for p in prepared]

    def _prepare(self, kernel: Kernel) -> CompiledKernel | tuple[Kernel, str, int, str, str]:
        """Optimise and render ``kernel``: the compiled kernel if memory has it, else (kernel with
        its opts, LLVM source, LLVM pipeline, disk-cache key, the source compiled: ``shared_source``)."""
        started = time.perf_counter()
        try:
            kernel = optimize(kernel)  # heuristics, a stored BEAM choice, or a search when BEAM is set
        except EnvironmentVariableError:
            raise  # BEAM's own message says what to fix
        except ValueError as error:
            raise KernelCompileError(f"kernel {kernel.name} cannot be optimised for the CPU: {error}") from error
        PHASE_SECONDS["optimize"] += time.perf_counter() - started
        started = time.perf_counter()
        source = self.render(kernel)
        PHASE_SECONDS["render"] += time.perf_counter() - started
        if debug_level() >= 4:
            print(f"--- LLVM source of kernel {kernel.name} ---\n{source}", file=sys.stderr)
        level = optimization_level(kernel)
        if level != 3:
            source += f"\n; LLVM pipeline {level}\n"  # a different binary: keep it apart in the caches
        cached = self._from_memory(kernel, source)
        if cached is not None:
            return cached
        shared = shared_source(source, kernel)
        return kernel, source, level, self.disk_cache.key(shared), shared

    def _finish(self, kernel: Kernel, source: str, level: int, key: str, shared: str,
                built: bytes | BaseException | None) -> CompiledKernel:
        """Load the kernel's object code (``built`` by compile_many, else from disk or compiled now)."""
        cached = self._from_memory(kernel, source)  # a twin earlier in compile_many's list
        if cached is not None:
            return cached
        if isinstance(built, BaseException):
            detail = f"\n{source}" if debug_level() >= 4 else " (DEBUG=4 shows its LLVM source)"
            raise KernelCompileError(f"kernel {kernel.name} failed to compile: {built}{detail}") from built
        started = time.perf_counter()
        target = host_target()
        origin, (engine, address) = "disk", (None, 0) if built is not None else self._load_object(key)
        if engine is None:
            origin = "compiled"
            try:
                if built is None:
                    self._check_symbols(source)
                    with self.disk_cache.compiling(key):  # another process compiling it: wait, then read it
                        object_code = self.disk_cache.load(key) or target.compile(shared, level)
                        self.disk_cache.store(key, object_code)
                else:
                    object_code = built
                engine, address = target.load(object_code, SHARED_NAME)
            except RuntimeError as error:
                detail = f"\n{source}" if debug_level() >= 4 else " (DEBUG=4 shows its LLVM source)"
                raise KernelCompileError(f"kernel {kernel.name} failed to compile: {error}{detail}") from error
            self.disk_cache.store(key, object_code)
        self.stats["disk_hits" if origin == "disk" else "compiled"] += 1
        PHASE_COUNTS["kernels_from_disk" if origin == "disk" else "kernels_compiled"] += 1
        PHASE_SECONDS["llvm"] += time.perf_counter() - started
        compiled = CompiledKernel(kernel, source, address, origin, time.perf_counter() - started, EngineHandle(engine))
        compiled.cache_token = (source, key, kernel.opts)
        return self.memory_cache.put(source, compiled)  # a thread that compiled it meanwhile wins

    def _from_memory(self, kernel: Kernel, source: str) -> CompiledKernel | None:
        cached = self.memory_cache.get(source)
        if cached is None:
            return None
        self.stats["memory_hits"] += 1
        if cached.kernel == kernel:
            return cached
        compiled = CompiledKernel(kernel, source, cached.address, "memory", 0.0, cached.engine)
        compiled.cache_token = cached.cache_token
        return compiled

    def _load_object(self, key: str) -> tuple[Any, int]:
        """The disk cache's object code for ``key`` linked into an engine, or (None, 0)."""
        object_code = self.disk_cache.load(key)
        if object_code is None:
            return None, 0
        try:
            return host_target().load(object_code, SHARED_NAME)
        except RuntimeError:
            return None, 0  # a checksummed entry LLVM still rejects: rebuild it

    def _plan_fingerprint(self) -> str:
        """What a stored plan depends on besides its IR: the host CPU, the CPUs this process may use
        (kernels' thread opts count them: a plan stored under ``taskset -c 0`` would run one thread),
        and the BEAM choices on disk (a new one, added to the folder, changes its time: plans then
        rebuild and use it), and the schedule's switches (``row_reductions``, ``fuse_siblings``)."""
        try:
            beam = (self.disk_cache.folder.parent / "beam").stat().st_mtime_ns
        except OSError:
            beam = 0
        return (f"{host_target().fingerprint}\nthreads {cpu_threads.thread_count()}\nbeam choices {beam}\n"
                f"schedule {self.row_reductions} {self.fuse_siblings}")

    def load_cached(self, kernel: Kernel, token: Any) -> CompiledKernel | None:
        """The kernel a stored plan names by ``token`` (a ``cache_token``), from memory or the disk
        cache without optimising, rendering or compiling; None when its object code is gone."""
        source, key, opts = token
        kernel = attrs.evolve(kernel, opts=opts)  # as compile optimised it
        cached = self._from_memory(kernel, source)
        if cached is not None:
            return cached
        started = time.perf_counter()
        engine, address = self._load_object(key)
        if engine is None:
            return None
        self.stats["disk_hits"] += 1
        PHASE_COUNTS["kernels_from_disk"] += 1
        PHASE_SECONDS["llvm"] += time.perf_counter() - started
        compiled = CompiledKernel(kernel, source, address, "disk", time.perf_counter() - started, EngineHandle(engine))
        compiled.cache_token = (source, key, opts)
        return self.memory_cache.put(source, compiled)

    @staticmethod
    def _check_symbols(source: str) -> None:
        """Calls to functions the process cannot resolve would jump to address 0; refuse them."""
        for name in external_symbols(source):
            if not symbol_address(name):
                raise RuntimeError(f"the math library function {name} is not available in this process")
