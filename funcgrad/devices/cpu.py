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
releases the GIL); small ones are called directly, because handing work to a thread costs tens of
microseconds (see ``PARALLEL_MIN_WORK``). The pool is ``cpu_pool.NativePool`` (hand-off and waiting in
generated code) where it runs, else ``_WorkerPool`` (Python threads and queues).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import heapq
import importlib.util
import json
import os
import platform
import queue
import re
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from funcgrad.devices.cpu_compiler import (
    PIPELINES,
    CodeMemory,
    LLVMCompiler,
    UnsupportedObject,
    WorkerClient,
    load_object,
    symbol_address,
    undefined_symbols,
)
from funcgrad.devices.cpu_pool import MAX_BUFFERS, MAX_CHUNKS, native_pool
from funcgrad.ir.primitives import with_cost
from funcgrad.lower.kernel import Kernel, KExpr
from funcgrad.lower.optimize import beam_width, optimize
from funcgrad.lower.plan import PHASE_COUNTS, PHASE_SECONDS, PlanDiskCache
from funcgrad.lower.render_llvm import external_symbols, is_inline_math, llvm_function_name, render_llvm
from funcgrad.util.caches import LRUCache, cache_size, write_atomically
from funcgrad.util.debug import debug_level

__all__ = ["CPUDevice", "CompiledKernel", "KernelCompileError", "DiskCache", "PARALLEL_MIN_WORK"]

# Estimated work above which a kernel is split across threads. Work is loop iterations (global x
# reduction) times the operations per iteration, with a transcendental function (a scalar libm
# call, ~10 ns) counting as TRANSCENDENTAL_COST simple vectorized operations, and float32 exp, tanh
# and logistic (inline vector polynomials, render_llvm.FLOAT32_OPS: ~1 ns) as INLINE_TRANSCENDENTAL_COST.
# A thread hand-off cost 30-80 us here with the Python pool (the native pool, cpu_pool.py: ~0.1 us to a
# spinning worker, 15-20 us to a sleeping one; not re-tuned since) and a memory-bound kernel gains only
# ~1.1x from a second core; measured on one core: 2^18 iterations of x*x+1 take ~40 us, 2^16 of a libm
# tanh ~850 us. So x*x+1 goes parallel from 2^19 elements, a libm tanh from 2^14, a float32 tanh from
# 2^17. (At 100, softmax's 256 x 10 x 10 backward sum went to two threads: 40 us there against 13 us on one.)
PARALLEL_MIN_WORK = 1 << 21
TRANSCENDENTAL_COST = 100
INLINE_TRANSCENDENTAL_COST = 10
TRANSCENDENTAL = {p.kernel_op for p in with_cost("transcendental", "transcendental_no_row_reuse", "float_call")}
CACHE_FORMAT = "funcgrad-cpu-object-v3"  # v2: kernels get different LLVM pipelines; v3: objects name it SHARED_NAME
SHARED_NAME = "funcgrad_kernel"  # the function in every object: kernels differing only in name share their code
_MAGIC = b"FGOBJ01\n"


class KernelCompileError(RuntimeError):
    """A kernel could not be rendered or compiled; the message names the kernel (and shows its
    LLVM source when DEBUG >= 4)."""


# --- the LLVM targets ---------------------------------------------------------------------------------

_LLVM_LOCK = threading.Lock()  # this process's global LLVM context, MCJIT engines and freeing kernel code


def worker_supported() -> bool:
    """Whether this process can load the worker's object code itself (``cpu_compiler.load_object``)."""
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


def compiler_mode() -> str:
    """``FUNCGRAD_COMPILER``: 'worker' (LLVM in a compiler process; the default where supported) or
    'inprocess' (llvmlite in this process, as MCJIT)."""
    requested = os.environ.get("FUNCGRAD_COMPILER", "")
    if requested not in ("", "worker", "inprocess"):
        raise ValueError(f"FUNCGRAD_COMPILER must be 'worker' or 'inprocess', got {requested!r}")
    if requested == "inprocess":
        return "inprocess"
    if not worker_supported():
        if debug_level() >= 1:
            print(f"funcgrad: the CPU compiler runs in this process: loading object code from a compiler worker needs "
                  f"x86-64 Linux, this is {sys.platform} {platform.machine()}", file=sys.stderr)
        return "inprocess"
    return "worker"


class _Target:
    """What both targets share: ``description`` (llvmlite and LLVM versions, triple, CPU name and
    features) and the fingerprint that keys the disk caches."""

    @property
    def description(self) -> list[str]:
        raise NotImplementedError

    @property
    def cpu(self) -> str:
        return self.description[3]

    @property
    def fingerprint(self) -> str:
        """What object code depends on: the host as ``host_identity`` reads it without LLVM (so a
        cold process looks up its plans and kernels while the compiler worker is still starting),
        else LLVM's ``description``; and the LLVM pipelines."""
        host = host_identity()
        return "\n".join([CACHE_FORMAT, *([host] if host is not None else self.description),
                          f"pipelines {sorted(PIPELINES.items())}"])


class InProcessTarget(_Target):
    """LLVM in this process: object code linked by MCJIT engines (libm and libgcc are loaded so
    compiled code can call them)."""

    def __init__(self) -> None:
        import llvmlite.binding as llvm
        self.llvm = llvm
        self.compiler = LLVMCompiler()
        for library in ("m", "gcc_s"):  # libm for erf & co; libgcc_s for half-precision libcalls
            path = ctypes.util.find_library(library)
            if path:
                with contextlib.suppress(RuntimeError):
                    llvm.load_library_permanently(path)
        self.triple = self.compiler.triple
        self.lock = _LLVM_LOCK  # LLVM's global context is used by one thread at a time
        self.machine = self.compiler.new_machine()
        self.pass_builders = {number: self.compiler.pass_builder(self.machine, number) for number in PIPELINES}

    @property
    def description(self) -> list[str]:
        return self.compiler.description

    def compile(self, source: str, pipeline: int = 3) -> bytes:
        """LLVM IR text -> native object code, optimised with ``PIPELINES[pipeline]`` (``optimization_level``)."""
        if pipeline not in self.pass_builders:
            raise ValueError(f"unknown LLVM pipeline {pipeline}; the pipelines are {sorted(PIPELINES)}")
        with self.lock:
            _free_retired()  # free code no kernel uses any more, while no other thread uses LLVM
            module = self.llvm.parse_assembly(source)
            return self.compiler.optimize_and_emit(module, self.machine, self.pass_builders[pipeline])

    def compile_alone(self, source: str, pipeline: int = 3) -> bytes:
        """``compile`` in this thread's own LLVM context and target machine, without the locks, so
        kernels compile on every CPU at once (``CPUDevice.compile_many``)."""
        return self.compiler.compile(source, pipeline)

    def load(self, object_code: bytes, function_name: str) -> tuple[Any, int]:
        """Link object code into a fresh MCJIT engine; the engine must outlive every call."""
        missing = [name for name in undefined_symbols(object_code) if not symbol_address(name)]
        if missing:
            raise RuntimeError(f"the compiled code needs {', '.join(missing)}, which this process does not provide")
        llvm = self.llvm
        with self.lock:
            _free_retired()
            empty = llvm.parse_assembly("")
            empty.triple = self.triple
            engine = llvm.create_mcjit_compiler(empty, self.compiler.new_machine())  # the engine owns its machine
            engine.add_object_file(llvm.ObjectFileRef.from_data(object_code))
            engine.finalize_object()
            address = engine.get_function_address(function_name)
        if not address:
            raise RuntimeError(f"function {function_name} not found in the object code")
        return engine, address


class WorkerTarget(_Target):
    """LLVM in a compiler worker process (``cpu_compiler.WorkerClient``); its object code is linked
    into this process by ``cpu_compiler.load_object``, so this process never loads LLVM. The
    description comes from the worker once per machine and is kept under ``$FUNCGRAD_CACHE/host``,
    so a process that finds its kernels on disk starts no worker at all."""

    def __init__(self) -> None:
        self.client = WorkerClient()
        atexit.register(self.client.close)
        self._description: list[str] | None = None
        self._describe_lock = threading.Lock()

    @property
    def description(self) -> list[str]:
        with self._describe_lock:
            if self._description is None:
                self._description = self._stored_description()
            return self._description

    def describe_in_background(self) -> None:
        """Read (or ask the worker for) the description on a thread of its own: a cold process then
        starts the worker (~0.15 s) while it traces its first step."""
        if self._description is None:
            threading.Thread(target=self._describe_quietly, name="funcgrad-compiler-start", daemon=True).start()

    def _describe_quietly(self) -> None:
        with contextlib.suppress(Exception):  # the caller that needs it will see the error
            self.description  # noqa: B018 - computed for its side effect

    def _stored_description(self) -> list[str]:
        path = host_description_path()
        if path is not None:
            with contextlib.suppress(OSError, ValueError):
                stored = json.loads(path.read_text())
                if isinstance(stored, list) and len(stored) == 5 and all(isinstance(part, str) for part in stored):
                    return stored
        described = self.client.describe()
        if path is not None:
            write_atomically(path, json.dumps(described).encode())
        return described

    def compile(self, source: str, pipeline: int = 3) -> bytes:
        """LLVM IR text -> native object code, compiled by the worker."""
        return self.client.compile(source, pipeline)

    compile_alone = compile  # the worker compiles concurrent requests on one thread per CPU

    def load(self, object_code: bytes, function_name: str) -> tuple[Any, int]:
        """Link object code into this process (MCJIT in this process for objects the loader refuses)."""
        with _LLVM_LOCK:
            _free_retired()
        try:
            return load_object(object_code, function_name)
        except UnsupportedObject as error:
            if debug_level() >= 1:
                print(f"funcgrad: {function_name} is linked by MCJIT in this process: {error}", file=sys.stderr)
            return host_target("inprocess").load(object_code, function_name)


def cache_root() -> Path:
    """``$FUNCGRAD_CACHE``, default ``~/.cache/funcgrad``: object code, plans, BEAM choices, host descriptions."""
    return Path(os.environ.get("FUNCGRAD_CACHE") or Path.home() / ".cache" / "funcgrad")


_CPUINFO_KEYS = ("vendor_id", "cpu family", "model", "model name", "stepping", "flags")


def host_description_path() -> Path | None:
    """Where the worker's description of this machine is kept, named by ``host_identity``; None
    where that cannot be read."""
    identity = host_identity()
    if identity is None:
        return None
    return cache_root() / "host" / f"{hashlib.sha256(identity.encode()).hexdigest()}.json"


@functools.cache
def host_identity() -> str | None:
    """What LLVM's host detection and code depend on, read without LLVM: the first CPU's
    /proc/cpuinfo identity and flags, and the llvmlite library file; None where that cannot be read."""
    try:
        first_cpu = Path("/proc/cpuinfo").read_text().split("\n\n")[0]
        spec = importlib.util.find_spec("llvmlite")
        assert spec is not None and spec.origin is not None
        libraries = sorted((Path(spec.origin).parent / "binding").glob("libllvmlite*"))
        files = [f"{p.resolve()} {p.stat().st_size} {p.stat().st_mtime_ns}" for p in libraries]
    except (OSError, AssertionError, ImportError, ValueError):
        return None
    cpu = [line for line in first_cpu.splitlines() if line.split(":")[0].strip() in _CPUINFO_KEYS]
    if not files or not cpu:
        return None
    return "\n".join([CACHE_FORMAT, sys.platform, platform.machine(), *files, *cpu])


_SINGLETONS_LOCK = threading.Lock()  # two threads' first calls must not build two targets (two LLVM locks)


@functools.cache
def _make_host_target(mode: str) -> InProcessTarget | WorkerTarget:
    return InProcessTarget() if mode == "inprocess" else WorkerTarget()


def host_target(mode: str | None = None) -> InProcessTarget | WorkerTarget:
    """The target that compiles and loads kernels: ``compiler_mode()``'s unless ``mode`` names one."""
    mode = mode or compiler_mode()
    with _SINGLETONS_LOCK:
        return _make_host_target(mode)


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
_RETIRED_ENGINES: list[Any] = []  # used by no kernel; freed by _free_retired


def _free_retired() -> None:
    """Free the code of kernels no one uses (called with _LLVM_LOCK held)."""
    for engine in _RETIRED_ENGINES:
        if isinstance(engine, CodeMemory):
            engine.free()
    _RETIRED_ENGINES.clear()  # MCJIT engines are disposed of when their last reference goes


_LIVE_ENGINES: list[Any] = []  # kept for the life of the process (keep_engine)


def keep_engine(engine: Any) -> None:
    """Keep kernel code (an engine or ``CodeMemory``) alive for the life of the process (BEAM's candidates use this)."""
    _LIVE_ENGINES.append(engine)


# --- the disk cache ----------------------------------------------------------------------------------

class DiskCache:
    """Object code on disk, one checksummed file per key; unreadable or corrupt entries read as
    missing. A folder that cannot be created disables the cache silently."""

    def __init__(self, folder: str | os.PathLike[str] | None = None) -> None:
        self.folder = Path(folder or cache_root()) / "cpu"
        self.max_bytes = cache_size("FUNCGRAD_CACHE_MAX_MB", 1024) << 20
        self._unchecked_bytes: int | None = None  # written since the folder was last trimmed (None: not yet)

    def key(self, source: str) -> str:
        return hashlib.sha256((host_target().fingerprint + "\n" + source).encode()).hexdigest()

    def path(self, key: str) -> Path:
        return self.folder / f"{key}.o"

    def load(self, key: str) -> bytes | None:
        try:
            data = self.path(key).read_bytes()
        except OSError:
            return None
        header = len(_MAGIC) + 32 + 8
        if len(data) < header or not data.startswith(_MAGIC):
            return None
        checksum = data[len(_MAGIC):len(_MAGIC) + 32]
        length = int.from_bytes(data[len(_MAGIC) + 32:header], "little")
        payload = data[header:]
        if len(payload) != length or hashlib.sha256(payload).digest() != checksum:
            return None
        with contextlib.suppress(OSError):
            os.utime(self.path(key))  # a hit makes the entry recently used for trim_folder
        return payload

    def store(self, key: str, payload: bytes) -> None:
        entry = _MAGIC + hashlib.sha256(payload).digest() + len(payload).to_bytes(8, "little") + payload
        # not fsynced (~0.5 ms a file, 40-50 ms of a cold CNN step): an entry a crash tears or empties
        # fails its checksum and reads as missing
        if not write_atomically(self.path(key), entry):
            return
        # trim on the first store of the process, then after every eighth of the bound written
        if self._unchecked_bytes is None or self._unchecked_bytes + len(entry) > self.max_bytes // 8:
            self._unchecked_bytes = 0
            trim_folder(self.folder, self.max_bytes)
        else:
            self._unchecked_bytes += len(entry)


def trim_folder(folder: Path, max_bytes: int, keep_fraction: float = 0.75) -> int:
    """When the files in ``folder`` add up to more than ``max_bytes``, delete the least recently used
    (oldest modification time: a disk-cache hit touches its file) down to ``keep_fraction`` of it;
    temporary files over an hour old (their writer died) go always. Other processes may use or trim
    the folder meanwhile: a file read while it is deleted stays readable (POSIX), a missing one is a
    miss. Returns the bytes deleted."""
    try:
        paths = list(folder.iterdir())
    except OSError:
        return 0
    entries = []
    for path in paths:
        with contextlib.suppress(OSError):  # deleted by another process meanwhile
            info = path.stat()
            entries.append((info.st_mtime, info.st_size, path))
    deleted = 0
    stale = time.time() - 3600
    for mtime, size, path in entries:
        if path.name.startswith(".tmp-") and mtime < stale:
            with contextlib.suppress(OSError):
                path.unlink()
                deleted += size
    total = sum(size for _, size, path in entries if not path.name.startswith(".tmp-"))
    if total <= max_bytes:
        return deleted
    for _, size, path in sorted(entry for entry in entries if not entry[2].name.startswith(".tmp-")):
        if total <= max_bytes * keep_fraction:
            break
        with contextlib.suppress(OSError):
            path.unlink()
            deleted += size
        total -= size
    return deleted


# --- threads -------------------------------------------------------------------------------------------

class _WorkerPool:
    """Persistent daemon threads, one per extra CPU; the calling thread runs the first chunk. Threaded
    kernels use it where the native pool (``cpu_pool``) is off, unsupported or not built yet.

    Workers are not pinned to CPUs (``FUNCGRAD_PIN_WORKERS=1`` pins worker k to the k+1-th CPU, as
    before): the caller is not pinned, and a worker's wake-up of the caller (the last chunk done) lets
    the scheduler place the caller on the worker's CPU, so the next launch's worker, pinned there,
    waited for the caller's whole chunk: two chunks ran one after the other on one CPU (seen here:
    the caller on the worker's CPU after 40 of 40 launches)."""

    def __init__(self, workers: int) -> None:
        self.tasks: queue.SimpleQueue[tuple[Callable[..., Any], tuple[Any, ...], queue.SimpleQueue[Any]]] = \
            queue.SimpleQueue()
        pin = os.environ.get("FUNCGRAD_PIN_WORKERS") == "1" and hasattr(os, "sched_getaffinity")
        cpus = sorted(os.sched_getaffinity(0)) if pin else []
        for number in range(workers):
            cpu = cpus[(number + 1) % len(cpus)] if cpus else None
            threading.Thread(target=self._work, args=(cpu,), name=f"funcgrad-cpu-{number}", daemon=True).start()
        self.workers = workers

    def _work(self, cpu: int | None) -> None:
        if cpu is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, {cpu})
        while True:
            function, arguments, done = self.tasks.get()
            try:
                function(*arguments)
                done.put(None)
            except BaseException as error:  # noqa: BLE001 - handed back to the caller
                done.put(error)

    def run(self, function: Callable[..., Any], argument_sets: Sequence[tuple[Any, ...]]) -> None:
        if not self.workers:  # one CPU (a kernel's thread opt may still ask for chunks): the caller runs them all
            for arguments in argument_sets:
                function(*arguments)
            return
        done: queue.SimpleQueue[Any] = queue.SimpleQueue()
        for arguments in argument_sets[1:]:
            self.tasks.put((function, arguments, done))
        function(*argument_sets[0])
        errors = [done.get() for _ in argument_sets[1:]]
        for error in errors:
            if error is not None:
                raise error


_compile_pool_lock = threading.Lock()  # one compile_many at a time uses the pool's threads


def compile_cost(source: str, pipeline: int) -> float:
    """A rough estimate of LLVM's milliseconds for ``source`` at ``pipeline`` (to compile the heaviest
    first): mostly code generation, ~30 us a line, plus ~10 ms for a standard pipeline's passes."""
    lines = source.count("\n")
    return lines * (0.02 if pipeline == 0 else 0.035) + (0.0 if pipeline in (0, 5) else 10.0)


@functools.cache
def compile_pool() -> ThreadPoolExecutor:
    """Threads that run LLVM for ``CPUDevice.compile_many`` (one per CPU)."""
    return ThreadPoolExecutor(max_workers=thread_count(), thread_name_prefix="funcgrad-llvm")


def thread_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@functools.cache
def _make_worker_pool() -> _WorkerPool:
    return _WorkerPool(thread_count() - 1)


def worker_pool() -> _WorkerPool:
    with _SINGLETONS_LOCK:  # one pool, even when threads make their first parallel call at once
        return _make_worker_pool()


# --- compiled kernels ----------------------------------------------------------------------------------

def estimated_work(kernel: Kernel) -> int:
    """Loop iterations times the cost of one iteration (see PARALLEL_MIN_WORK)."""
    seen: set[KExpr] = set()

    def cost(e: KExpr) -> int:
        if e in seen or e.op in ("const", "var", "acc"):
            return 0
        seen.add(e)
        own = 1
        if e.op in TRANSCENDENTAL and e.dtype.kind in "fV":
            own = INLINE_TRANSCENDENTAL_COST if is_inline_math(e) else TRANSCENDENTAL_COST
        return own + sum(cost(a) for a in e.args)

    per_iteration = sum(cost(e) for e in (*kernel.outputs, kernel.reduce_expr) if e is not None)
    iterations = int(np.prod(kernel.shape)) * max(1, int(np.prod(kernel.reduce_shape)))
    return iterations * max(1, per_iteration)


def heuristic_threads(kernel: Kernel) -> int:
    """Chunks of axis 0 to run in parallel by default (the optimiser's ``thread`` action): one per
    CPU for work above PARALLEL_MIN_WORK, else 1."""
    outer = kernel.shape[0] if kernel.shape else 1
    if estimated_work(kernel) < PARALLEL_MIN_WORK or outer < 2 or thread_count() < 2:
        return 1
    return min(thread_count(), outer)


_SOURCE_THREADS = re.compile(r"^;\s+opts: .*\bthread\(0, (\d+)\)", re.MULTILINE)


def kernel_threads(kernel: Kernel, source: str = "") -> int:
    """The chunk count a kernel's ``thread`` opt asks for (1 without one). A kernel without opts (a
    stored plan's) takes it from the opts line ``render_llvm`` wrote into its source, else from the
    optimiser."""
    if kernel.opts is None:
        if ";     opts: " in source:
            found = _SOURCE_THREADS.search(source)
            return int(found.group(1)) if found else 1
        kernel = optimize(kernel)
    return next((opt.amount for opt in kernel.opts or () if opt.action == "thread"), 1)


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


SMALL_KERNEL_WORK = 1 << 12  # loop iterations below which a kernel is compiled without optimisation
SHORT_REDUCTION = 6  # a register tile with a reduction loop shorter than this keeps LLVM's unroller
SHORT_REORDER = 32  # an i-k-j (reorder) kernel summing at most this many terms gets O2 (pipeline 2)
SMALL_ELEMENTWISE_WORK = 1 << 16  # elementwise kernels below this many elements get pipeline 4


def optimization_level(kernel: Kernel) -> int:
    """The LLVM pipeline for a kernel (``cpu_compiler.PIPELINES``); a kernel always gets the same
    one, so results stay deterministic.

    - 0 (no optimisation) for small kernels: O3 costs ~16 ms a kernel against ~3 ms unoptimised,
      which a kernel over a few thousand elements never earns back.
    - 5 (SROA, then code generation) for register tiles whose every loop the renderer wrote on
      vectors (``render_tile.explicitly_vectorised``: the MLP's products, their packing and
      epilogues): half the LLVM time of 4, the same speed and bits.
    - 4 (O1 without LLVM's loop unroller) for other register tiles (a ``tile`` opt), which the renderer
      unrolled and vectorised itself: 35-80% less LLVM time, the same speed and bits. Unless a
      reduction loop is shorter than SHORT_REDUCTION (a convolution's 3x3 or 5x5 window): at O3,
      whose unroller flattens those, they run up to 10% faster.
    - 4 also for elementwise kernels under SMALL_ELEMENTWISE_WORK elements (the CNN's weight
      updates and layout copies, 5-40 K elements): 8-10 ms of LLVM instead of 8-32 ms, within a
      few microseconds a call, the same bits (no reduction to reassociate).
    - 2 (O2) for plain loops in i-k-j order (a ``reorder`` opt) summing at most SHORT_REORDER
      terms: O3 fully unrolls the few passes over their stack rows into a lot of code (the CNN's
      10-term linear input gradient: 0.29 s of LLVM at O3, 0.08 s at O2, as fast). Each output
      element is still summed in term order, so the bits do not depend on how its row is vectorised.
    - 3 (O3) otherwise: plain loops need LLVM's unroller and vectorisers (a pooling window runs
      4-9x slower without unrolling; O2 made some elementwise kernels 2-10x slower).

    ``FUNCGRAD_OPT=0`` or ``3`` gives every kernel that level."""
    forced = os.environ.get("FUNCGRAD_OPT")
    if forced in ("0", "3"):
        return int(forced)
    work = int(np.prod(kernel.shape, dtype=np.int64)) * max(1, int(np.prod(kernel.reduce_shape, dtype=np.int64)))
    if work < SMALL_KERNEL_WORK:
        return 0
    tiled = any(opt.action == "tile" for opt in kernel.opts or ())
    if tiled and not any(1 < length < SHORT_REDUCTION for length in kernel.reduce_shape):
        from funcgrad.lower.render_tile import explicitly_vectorised
        return 5 if explicitly_vectorised(kernel) else 4
    if kernel.reduce_expr is None and work < SMALL_ELEMENTWISE_WORK:
        return 4
    if any(opt.action == "reorder" for opt in kernel.opts or ()) and int(np.prod(kernel.reduce_shape)) <= SHORT_REORDER:
        return 2
    return 3


def shared_source(source: str, kernel: Kernel) -> str:
    """What is compiled for a kernel's LLVM ``source``: without the kernel listing above the code
    and with the function named SHARED_NAME, so kernels that differ only in name and shapes the
    code does not read (a flat elementwise loop runs over [start, end)) compile once and share one
    disk-cache entry (each is still loaded, and kept in memory, as itself): the CNN's 89 kernels
    are 76 compiles (a bias's and a filter's Adam update, say), the MLP's 28 are 24."""
    lines = source.splitlines()
    first = next((i for i, line in enumerate(lines) if not line.startswith(";")), len(lines))
    return "\n".join(lines[first:]).replace(f"@{llvm_function_name(kernel)}(", f"@{SHARED_NAME}(") + "\n"


class CPUDevice:
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
        """``compile`` every kernel, running LLVM on up to ``thread_count()`` kernels at once (each
        thread with its own LLVM context): a plan's first build takes about 1/CPUs of the time.
        Each kernel's LLVM starts as soon as it is rendered, while the next ones render (not under
        BEAM, whose timings would see it); the time spent waiting for LLVM after the last render
        counts as the ``llvm`` phase."""
        if thread_count() < 2 or len(kernels) < 2:
            return [self.compile(kernel) for kernel in kernels]
        target = host_target()

        def build(source: str, level: int) -> bytes | BaseException:
            try:
                self._check_symbols(source)
                return target.compile_alone(source, level)
            except RuntimeError as error:
                return error

        prepared: list[CompiledKernel | tuple[Kernel, str, int, str, str]] = []
        builds: dict[str, Future[bytes | BaseException]] = {}  # one compile per distinct source
        # what waits for a compiling thread, heaviest first (so no long compile is left for last while
        # the other threads idle): (-estimated cost, order, source, pipeline, its future)
        waiting: list[tuple[float, int, str, int, Future[bytes | BaseException]]] = []
        waiting_lock = threading.Lock()
        stream = beam_width() == 0

        def build_heaviest() -> None:
            with waiting_lock:
                _, _, source, level, future = heapq.heappop(waiting)
            try:
                future.set_result(build(source, level))
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
                                                 builds[item[4]]))
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
                object_code = built if built is not None else target.compile(shared, level)
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
        return (f"{host_target().fingerprint}\nthreads {thread_count()}\nbeam choices {beam}\n"
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
