"""The CPU's LLVM targets and the host's identity: where LLVM runs (``FUNCGRAD_COMPILER``: a compiler
worker process, or llvmlite in this process as MCJIT), what object code depends on (the fingerprint
that keys the disk caches), and ``$FUNCGRAD_CACHE``."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import functools
import hashlib
import importlib.util
import json
import os
import platform
import sys
import threading
from pathlib import Path
from typing import Any

from funcgrad.devices.cpu_compiler import (
    PIPELINES,
    LLVMCompiler,
    UnsupportedObject,
    WorkerClient,
    load_object,
    symbol_address,
    undefined_symbols,
)
from funcgrad.devices.cpu_engines import LLVM_LOCK, free_retired
from funcgrad.util.caches import write_atomically
from funcgrad.util.config import env_error
from funcgrad.util.debug import debug_level

CACHE_FORMAT = "funcgrad-cpu-object-v3"  # v2: kernels get different LLVM pipelines; v3: objects name it SHARED_NAME


def worker_supported() -> bool:
    """Whether this process can load the worker's object code itself (``cpu_compiler.load_object``)."""
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


def compiler_mode() -> str:
    """``FUNCGRAD_COMPILER``: 'worker' (LLVM in a compiler process; the default where supported) or
    'inprocess' (llvmlite in this process, as MCJIT)."""
    requested = os.environ.get("FUNCGRAD_COMPILER", "")
    if requested not in ("", "worker", "inprocess"):
        raise env_error("FUNCGRAD_COMPILER", requested, "'worker' or 'inprocess'", "worker where supported")
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
        self.lock = LLVM_LOCK  # LLVM's global context is used by one thread at a time
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
            free_retired()  # free code no kernel uses any more, while no other thread uses LLVM
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
            free_retired()
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
        starts the worker while it traces its first step."""
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
        with LLVM_LOCK:
            free_retired()
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
