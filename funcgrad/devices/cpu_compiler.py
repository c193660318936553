"""LLVM for the CPU device, in this process or in a compiler worker process, and a loader for its object code.

    training process                                      compiler worker (python cpu_compiler.py)
    CPUDevice --WorkerClient.compile(source, pipeline)--> LLVMCompiler: parse, optimise, emit object (a thread each)
              <------------ ELF object code -------------
    load_object: copy sections into mmap'd memory, apply relocations, mprotect read+exec -> function address

The worker keeps LLVM (its code pages, target machines and pass builders: ~100 MB resident) out of the
training process, which only ever loads object code. Objects are what ``LLVMCompiler`` emits for the
host CPU with the large code model, so every relocation is an absolute 64-bit address and
``load_object`` needs no linker: it links external calls (libm's ``erff``, libgcc's half-precision
conversions) with ``dlsym``. Anything it does not know (another machine type or relocation) raises
``UnsupportedObject`` and the caller links in-process with MCJIT instead.

The worker starts on first need, speaks length-prefixed frames over its stdin/stdout, compiles
requests on one thread per CPU, and exits when its stdin closes: when this process exits, after
``FUNCGRAD_COMPILER_IDLE`` seconds without work (default 60), or in a forked child's copy. A worker
that dies is restarted once per request; a second death is an error that says so. This file runs
as the worker's script and imports only the standard library (and llvmlite, in the worker).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import gc
import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import IO, Any, BinaryIO

__all__ = ["LLVMCompiler", "WorkerClient", "load_object", "CodeMemory", "UnsupportedObject", "undefined_symbols",
           "symbol_address", "PIPELINES", "PassList"]


# --- LLVM (in whichever process runs it) -------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class PassList:
    """A pipeline that runs exactly these llvmlite new-pass-manager passes (``add_<name>_pass``), then
    code generation, instead of one of LLVM's standard pipelines."""

    passes: tuple[str, ...]


# LLVM's pass pipelines for kernels, by number (what CPUDevice asks for and the worker is sent):
# (speed level, PipelineTuningOptions switched from that level's defaults), or a PassList. The object
# code depends on this table, so it is part of the disk caches' fingerprint (cpu._Target.fingerprint).
PIPELINES: dict[int, tuple[int, tuple[tuple[str, bool], ...]] | PassList] = {
    0: (0, ()),  # small kernels: no optimisation
    # O2, for plain i-k-j loops over a short reduction (cpu.optimization_level): O3's more eager full
    # unroller flattens their 10 passes over 576-wide stack rows into several times the code and LLVM
    # time of O2's, which runs as fast with the same bits (docs/performance.md)
    2: (2, ()),
    3: (3, ()),  # O3
    # O1 without LLVM's loop unroller, for register tiles (funcgrad.lower.render_tile), which are
    # unrolled and vectorised already: O3's unrolling and extra passes only make code to compile
    # (half O3's LLVM time on the MLP's tile, as fast; a 2048 matmul's inner loop is the same code as
    # O3's without its 2x unrolling); and small elementwise kernels;
    # see cpu.optimization_level
    4: (1, (("loop_unrolling", False),)),
    # SROA alone (the renderer's stack counters and accumulators become registers), for register tiles
    # whose every loop the renderer wrote on vectors (render_tile.explicitly_vectorised): code generation
    # does the rest (strength reduction, machine LICM, scheduling): about half pipeline 4's LLVM time, as
    # fast and the same bits (docs/performance.md; docs/architecture.md, "LLVM time")
    5: PassList(("sroa",)),
}

class _SkippableLock:
    """Stands in for the re-entrant lock inside llvmlite's ``ffi.lib`` lock, which llvmlite takes
    around every LLVM call of the process (its objects share LLVM's global context by default). A
    thread that compiles in a context and target machine of its own (``LLVMCompiler.compile``) shares
    nothing with the others, so it skips the lock, and kernels compile on every CPU at once (with the
    lock, a plan takes as long however many threads compile it: docs/performance.md). Every
    other thread and call still takes the real lock, and so does a garbage collection, which may
    free any thread's llvmlite objects (``gc.callbacks``)."""

    def __init__(self, real: Any) -> None:
        self.real = real
        self.skipping = threading.local()
        gc.callbacks.append(self._collecting)

    @contextlib.contextmanager
    def skipped(self) -> Iterator[None]:
        """Skip the lock in this thread (which must use only LLVM objects of its own) while inside."""
        self.skipping.on = True
        try:
            yield
        finally:
            self.skipping.on = False

    def _collecting(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self.skipping.paused, self.skipping.on = getattr(self.skipping, "on", False), False
        else:
            self.skipping.on = getattr(self.skipping, "paused", False)

    def acquire(self, *args: Any, **kwargs: Any) -> bool:
        return True if getattr(self.skipping, "on", False) else bool(self.real.acquire(*args, **kwargs))

    def release(self) -> None:
        if not getattr(self.skipping, "on", False):
            self.real.release()


_SKIPPABLE_LOCK_GUARD = threading.Lock()


def _skippable_llvmlite_lock() -> _SkippableLock | None:
    """llvmlite's lock made skippable by threads that say so (installed once per process); None if
    this llvmlite keeps its lock elsewhere (then compiling threads take it: correct, one at a time)."""
    from llvmlite.binding import ffi
    with _SKIPPABLE_LOCK_GUARD:
        outer = getattr(getattr(ffi, "lib", None), "_lock", None)
        inner = getattr(outer, "_lock", None)
        if isinstance(inner, _SkippableLock):
            return inner
        if inner is None or not hasattr(inner, "acquire") or not hasattr(inner, "release"):
            return None
        skippable = _SkippableLock(inner)
        outer._lock = skippable  # type: ignore[union-attr]
        return skippable


class LLVMCompiler:
    """LLVM IR text -> object code for the host CPU. Each calling thread gets its own LLVM context,
    target machine and pass builders, so threads compile at once, without llvmlite's lock
    (``_SkippableLock``)."""

    def __init__(self) -> None:
        import llvmlite
        import llvmlite.binding as llvm
        llvm.initialize_native_target()
        llvm.initialize_native_asmprinter()
        self.unlocked = _skippable_llvmlite_lock()
        self.llvm = llvm
        self.triple = llvm.get_process_triple()
        self.cpu = llvm.get_host_cpu_name()
        self.features = llvm.get_host_cpu_features().flatten()
        # what object code depends on (CPUDevice's cache key starts with these)
        self.description = [llvmlite.__version__, ".".join(map(str, llvm.llvm_version_info)),
                            self.triple, self.cpu, self.features]
        self.per_thread = threading.local()

    def new_machine(self) -> Any:
        target = self.llvm.Target.from_triple(self.triple)
        return target.create_target_machine(cpu=self.cpu, features=self.features, opt=3, codemodel="jitdefault")

    def pass_builder(self, machine: Any, pipeline: int) -> _Passes:
        """LLVM's pass pipeline number ``pipeline`` (a key of ``PIPELINES``) for ``machine``, ready to run."""
        if pipeline not in PIPELINES:
            raise ValueError(f"unknown LLVM pipeline {pipeline}; the pipelines are {sorted(PIPELINES)}")
        spec = PIPELINES[pipeline]
        if isinstance(spec, PassList):
            options = self.llvm.create_pipeline_tuning_options(speed_level=0)
            return _Passes(self.llvm, self.llvm.create_pass_builder(machine, options), spec.passes)
        speed_level, switches = spec
        options = self.llvm.create_pipeline_tuning_options(speed_level=speed_level)
        for name, value in switches:
            setattr(options, name, value)
        return _Passes(self.llvm, self.llvm.create_pass_builder(machine, options), None)

    def compile(self, source: str, pipeline: int = 3) -> bytes:
        """Parse, verify, optimise with ``PIPELINES[pipeline]`` and emit object code, in this thread's context."""
        own = self.per_thread.__dict__
        # nothing below touches what another thread uses (see _SkippableLock)
        with self.unlocked.skipped() if self.unlocked is not None else contextlib.nullcontext():
            if "machine" not in own:
                own["context"] = self.llvm.create_context()
                own["machine"] = self.new_machine()
                own["pass_builders"] = {number: self.pass_builder(own["machine"], number) for number in PIPELINES}
            if pipeline not in own["pass_builders"]:
                raise ValueError(f"unknown LLVM pipeline {pipeline}; the pipelines are {sorted(PIPELINES)}")
            return self.optimize_and_emit(self.llvm.parse_assembly(source, context=own["context"]), own["machine"],
                                          own["pass_builders"][pipeline])

    def optimize_and_emit(self, module: Any, machine: Any, passes: _Passes) -> bytes:
        module.triple = self.triple
        module.data_layout = str(machine.target_data)
        module.verify()
        passes.run(module)
        return bytes(machine.emit_object(module))


class _Passes:
    """A pipeline ready to run on modules: a pass builder's standard pipeline, or a PassList's passes
    (``names``) run with a pass builder at speed level 0."""

    def __init__(self, llvm: Any, builder: Any, names: tuple[str, ...] | None) -> None:
        self.llvm, self.builder, self.names = llvm, builder, names

    def run(self, module: Any) -> None:
        if self.names is None:
            manager = self.builder.getModulePassManager()
        else:
            manager = self.llvm.create_new_module_pass_manager()
            for name in self.names:
                getattr(manager, f"add_{name}_pass")()
        manager.run(module, self.builder)


# --- symbols ---------------------------------------------------------------------------------------------

_LIBRARIES: list[ctypes.CDLL] = []
_LIBRARIES_LOCK = threading.Lock()


def _libraries() -> list[ctypes.CDLL]:
    """This process, libm (erf & co) and libgcc_s (half-precision libcalls): where kernels' calls go."""
    with _LIBRARIES_LOCK:
        if not _LIBRARIES:
            _LIBRARIES.append(ctypes.CDLL(None))
            for soname, short in (("libm.so.6", "m"), ("libgcc_s.so.1", "gcc_s")):
                for name in (soname, ctypes.util.find_library(short)):
                    if name:
                        with contextlib.suppress(OSError):
                            _LIBRARIES.append(ctypes.CDLL(name, mode=ctypes.RTLD_GLOBAL))
                            break
        return list(_LIBRARIES)


def symbol_address(name: str) -> int:
    """The address of a C function this process can call (0 when none has that name)."""
    import _ctypes
    for library in _libraries():
        with contextlib.suppress(OSError):
            address = _ctypes.dlsym(library._handle, name)
            if address:
                return int(address)
    return 0


# --- ELF object files ------------------------------------------------------------------------------------

class UnsupportedObject(RuntimeError):
    """Object code ``load_object`` cannot link (not x86-64 ELF, or an unknown relocation)."""


_SHT_SYMTAB, _SHT_RELA, _SHT_NOBITS, _SHT_REL = 2, 4, 8, 9
_SHF_WRITE, _SHF_ALLOC = 1, 2
_SHN_UNDEF, _SHN_ABS = 0, 0xFFF1
_R_64, _R_PC32, _R_PLT32, _R_PC64 = 1, 2, 4, 24


class _Elf:
    """The parts of an ELF64 relocatable file a loader needs: section headers, symbols, relocations."""

    def __init__(self, data: bytes) -> None:
        if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
            raise UnsupportedObject("not a little-endian ELF64 object")
        self.data = data
        self.machine, = struct.unpack_from("<H", data, 0x12)
        offset, = struct.unpack_from("<Q", data, 0x28)
        entry_size, count = struct.unpack_from("<HH", data, 0x3A)
        # (name, type, flags, address, offset, size, link, info, alignment, entry size)
        self.sections = [struct.unpack_from("<IIQQQQIIQQ", data, offset + i * entry_size) for i in range(count)]

    def symbols(self) -> list[tuple[str, int, int]]:
        """(name, section index, value) of every .symtab entry, in order."""
        result = []
        for _, kind, _, _, offset, size, link, _, _, _ in self.sections:
            if kind != _SHT_SYMTAB:
                continue
            strings = self.sections[link][4]
            for entry in range(offset, offset + size, 24):
                name_offset, _, _, section, value, _ = struct.unpack_from("<IBBHQQ", self.data, entry)
                end = self.data.index(b"\0", strings + name_offset)
                result.append((self.data[strings + name_offset:end].decode(), section, value))
        return result


def undefined_symbols(object_code: bytes) -> list[str]:
    """The symbols an ELF64 object file imports (its .symtab entries with no section); [] for
    anything that is not ELF64 (another OS: nothing to check here)."""
    try:
        elf = _Elf(object_code)
    except UnsupportedObject:
        return []
    return [name for name, section, _ in elf.symbols() if section == _SHN_UNDEF and name]


class _LibC:
    def __init__(self) -> None:
        libc = ctypes.CDLL(None, use_errno=True)
        self.mmap, self.mprotect, self.munmap = libc.mmap, libc.mprotect, libc.munmap
        self.mmap.restype = ctypes.c_void_p
        self.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        self.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]


_libc: _LibC | None = None
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class CodeMemory:
    """Pages holding one loaded object; ``free`` unmaps them (only when no code there can run)."""

    def __init__(self, address: int, size: int) -> None:
        self.address, self.size = address, size

    def free(self) -> None:
        if self.size and _libc is not None:
            _libc.munmap(self.address, self.size)
            self.size = 0


def load_object(object_code: bytes, function_name: str) -> tuple[CodeMemory, int]:
    """Link an x86-64 ELF object into fresh pages of this process: (its memory, the address of
    ``function_name``). Read-only sections and code end read+execute, writable ones read+write."""
    global _libc
    elf = _Elf(object_code)
    if elf.machine != 62:  # EM_X86_64
        raise UnsupportedObject(f"ELF machine {elf.machine} is not x86-64")
    placed: dict[int, int] = {}  # section index -> offset in the image
    size = read_only_size = 0
    for writable in (False, True):  # code and constants first, then (page-aligned) writable data
        if writable:
            read_only_size = size
            size = -(-size // _PAGE) * _PAGE
        for index, (_, _, flags, _, _, section_size, _, _, alignment, _) in enumerate(elf.sections):
            if flags & _SHF_ALLOC and bool(flags & _SHF_WRITE) == writable:
                size = -(-size // max(alignment, 1)) * max(alignment, 1)
                placed[index] = size
                size += section_size
    total = max(-(-size // _PAGE) * _PAGE, _PAGE)
    image = bytearray(total)
    for index, offset in placed.items():
        _, kind, _, _, file_offset, section_size, _, _, _, _ = elf.sections[index]
        if kind != _SHT_NOBITS:
            image[offset:offset + section_size] = object_code[file_offset:file_offset + section_size]
    if _libc is None:
        _libc = _LibC()
    base = _libc.mmap(None, total, 3, 0x22, -1, 0)  # PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS
    if base in (None, ctypes.c_void_p(-1).value):
        raise MemoryError(f"mmap of {total} bytes for kernel code failed (errno {ctypes.get_errno()})")
    memory = CodeMemory(base, total)
    try:
        symbols = elf.symbols()
        _relocate(elf, image, base, placed, symbols)
        ctypes.memmove(base, bytes(image), total)
        if read_only_size and _libc.mprotect(base, -(-read_only_size // _PAGE) * _PAGE, 5) != 0:  # READ | EXEC
            raise UnsupportedObject(f"this process may not run generated code (mprotect errno {ctypes.get_errno()})")
        function = next((base + placed[section] + value for name, section, value in symbols
                         if name == function_name and section in placed), 0)
        if not function:
            raise RuntimeError(f"function {function_name} not found in the object code")
        return memory, function
    except BaseException:
        memory.free()
        raise


def _relocate(elf: _Elf, image: bytearray, base: int, placed: dict[int, int],
              symbols: list[tuple[str, int, int]]) -> None:
    """Apply every relocation of the sections ``placed`` in ``image`` (to be copied to ``base``)."""
    for _, kind, _, _, offset, size, _, target, _, _ in elf.sections:
        if kind == _SHT_REL:
            raise UnsupportedObject("REL relocations (without addends) are not supported")
        if kind != _SHT_RELA or target not in placed:
            continue
        for entry in range(offset, offset + size, 24):
            where, info, addend = struct.unpack_from("<QQq", elf.data, entry)
            name, section, value = symbols[info >> 32]
            if section == _SHN_UNDEF:
                value = symbol_address(name)
                if not value:
                    raise RuntimeError(f"the compiled code needs {name}, which this process does not provide")
            elif section != _SHN_ABS:
                if section not in placed:
                    raise UnsupportedObject(f"a relocation refers to section {section}, which is not loaded")
                value += base + placed[section]
            place = placed[target] + where
            relocation = info & 0xFFFFFFFF
            if relocation == _R_64:
                struct.pack_into("<Q", image, place, (value + addend) & (2**64 - 1))
            elif relocation == _R_PC64:
                struct.pack_into("<Q", image, place, (value + addend - base - place) & (2**64 - 1))
            elif relocation in (_R_PC32, _R_PLT32):
                relative = value + addend - base - place
                if not -2**31 <= relative < 2**31:
                    raise UnsupportedObject(f"a 32-bit relative relocation to {name or 'a section'} does not reach")
                struct.pack_into("<i", image, place, relative)
            else:
                raise UnsupportedObject(f"relocation type {relocation} is not supported")


# --- the worker process and its client ---------------------------------------------------------------

_FRAME = struct.Struct("<QBQ")  # request number, kind (request) or 1 = ok / 0 = error (reply), payload length
_DESCRIBE, _COMPILE = 1, 2


def _read_exactly(stream: BinaryIO | IO[bytes], count: int) -> bytes | None:
    chunks, left = [], count
    while left:
        chunk = stream.read(left)
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(stream: BinaryIO | IO[bytes]) -> tuple[int, int, bytes] | None:
    header = _read_exactly(stream, _FRAME.size)
    if header is None:
        return None
    number, kind, length = _FRAME.unpack(header)
    payload = _read_exactly(stream, length)
    return None if payload is None else (number, kind, payload)


class WorkerDied(RuntimeError):
    """The compiler worker exited with requests pending."""


class _Worker:
    """One running worker process and the requests it owes answers to."""

    def __init__(self, client: WorkerClient) -> None:
        command = [sys.executable, *(["-P"] if sys.version_info >= (3, 11) else []), os.path.abspath(__file__)]
        try:
            self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                                            close_fds=True)
        except OSError as error:
            raise RuntimeError(f"the compiler worker cannot be started ({error}); FUNCGRAD_COMPILER=inprocess "
                               "runs LLVM in this process instead") from error
        self.pending: dict[int, Future[bytes]] = {}
        self.send_lock = threading.Lock()  # one frame at a time; not the client's lock, which replies need
        self.client = client
        self.last_used = time.monotonic()
        self.closed = False
        threading.Thread(target=self._read_replies, name="funcgrad-compiler-replies", daemon=True).start()

    def send(self, number: int, kind: int, payload: bytes) -> None:
        assert self.process.stdin is not None
        with self.send_lock:
            self.process.stdin.write(_FRAME.pack(number, kind, len(payload)) + payload)

    def _read_replies(self) -> None:
        assert self.process.stdout is not None
        while (frame := _read_frame(self.process.stdout)) is not None:
            number, ok, payload = frame
            with self.client.lock:
                future = self.pending.pop(number, None)
                self.last_used = time.monotonic()
            if future is not None:
                if ok:
                    future.set_result(payload)
                else:
                    future.set_exception(RuntimeError(payload.decode(errors="replace")))
        code = self.process.wait()
        with self.client.lock:
            self.closed = True
            pending, self.pending = self.pending, {}
            if self.client.worker is self:
                self.client.worker = None
        for future in pending.values():
            future.set_exception(WorkerDied(f"the compiler worker exited with code {code}"))

    def kill(self) -> None:
        """End a hung worker now; its reply reader then fails what it still owes (WorkerDied)."""
        self.closed = True
        with contextlib.suppress(OSError):
            self.process.kill()

    def close(self) -> None:
        """Close its stdin: it finishes what it has and exits (called with the client's lock held)."""
        self.closed = True
        with contextlib.suppress(OSError):
            assert self.process.stdin is not None
            self.process.stdin.close()


class WorkerClient:
    """Requests to the compiler worker process, from any thread; the worker starts on first need.

    >>> WorkerClient().compile(llvm_source, 3)  # doctest: +SKIP
    b'\\x7fELF...'
    """

    def __init__(self, idle_seconds: float | None = None) -> None:
        self.lock = threading.Lock()
        from funcgrad.util.config import env_float  # here: the worker's script imports only the standard library

        self.worker: _Worker | None = None
        self.next_number = 0
        self.starts = 0  # workers started by this client (for tests and DEBUG)
        self.idle_seconds = idle_seconds if idle_seconds is not None else \
            env_float("FUNCGRAD_COMPILER_IDLE", 60.0)
        # how long one request may wait for its answer before the worker counts as hung and is killed
        self.timeout_seconds = env_float("FUNCGRAD_COMPILER_TIMEOUT", 300.0)
        self._idle_watch: threading.Thread | None = None
        os.register_at_fork(after_in_child=self._forget)

    def compile(self, source: str, pipeline: int = 3) -> bytes:
        """Object code for LLVM IR ``source`` optimised by ``PIPELINES[pipeline]``; RuntimeError with LLVM's message."""
        return self._request(_COMPILE, bytes([pipeline]) + source.encode())

    def describe(self) -> list[str]:
        """The worker's LLVMCompiler.description (llvmlite and LLVM versions, triple, CPU, features)."""
        return [str(part) for part in json.loads(self._request(_DESCRIBE, b""))]

    def pid(self) -> int | None:
        with self.lock:
            return self.worker.process.pid if self.worker is not None else None

    def _request(self, kind: int, payload: bytes) -> bytes:
        for attempt in (1, 2):
            future: Future[bytes] = Future()
            with self.lock:
                if self.worker is None or self.worker.closed:
                    self.worker = _Worker(self)
                    self.starts += 1
                    self._watch_idle()
                worker = self.worker
                self.next_number += 1
                number = self.next_number
                worker.pending[number] = future
                worker.last_used = time.monotonic()
            with contextlib.suppress(OSError, ValueError):  # it died (or was closed): its reply reader fails the future
                worker.send(number, kind, payload)
            try:
                return future.result(timeout=self.timeout_seconds if self.timeout_seconds > 0 else None)
            except FutureTimeout:
                with self.lock:
                    if self.worker is worker:
                        self.worker = None
                worker.kill()  # every request it owed fails (WorkerDied) and is asked again of a new worker
                raise RuntimeError(f"the compiler worker did not answer within {self.timeout_seconds:g} s and was "
                                   "killed (FUNCGRAD_COMPILER_TIMEOUT sets the limit; FUNCGRAD_COMPILER=inprocess "
                                   "runs LLVM in this process instead)") from None
            except WorkerDied as died:
                if attempt == 2:
                    raise RuntimeError(f"{died} twice while compiling (started again once); "
                                       "FUNCGRAD_COMPILER=inprocess runs LLVM in this process instead") from died
        raise AssertionError("unreachable")

    def _watch_idle(self) -> None:
        """Close the worker after idle_seconds without requests (a thread, started with the first worker)."""
        if self._idle_watch is not None or self.idle_seconds <= 0:
            return

        def watch() -> None:
            while True:
                time.sleep(min(self.idle_seconds, 5.0))
                with self.lock:
                    worker = self.worker
                    if worker is not None and not worker.pending \
                            and time.monotonic() - worker.last_used > self.idle_seconds:
                        worker.close()
                        self.worker = None

        self._idle_watch = threading.Thread(target=watch, name="funcgrad-compiler-idle", daemon=True)
        self._idle_watch.start()

    def close(self) -> None:
        """Let the worker exit (a later request starts a new one) and wait for it briefly."""
        with self.lock:
            worker, self.worker = self.worker, None
            if worker is not None:
                worker.close()
        if worker is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                worker.process.wait(timeout=5)

    def _forget(self) -> None:
        """In a forked child: the parent's worker is not ours; drop our copies of its pipes."""
        self.lock = threading.Lock()
        worker, self.worker, self._idle_watch = self.worker, None, None
        if worker is not None:
            for stream in (worker.process.stdin, worker.process.stdout):
                with contextlib.suppress(OSError):
                    if stream is not None:
                        stream.close()  # unbuffered: closes our copy of the descriptor, writes nothing
            worker.pending = {}
            worker.process.returncode = 0  # never wait for another process's child


# --- the worker's side -----------------------------------------------------------------------------------

def serve(requests: BinaryIO, replies: BinaryIO) -> None:
    """The worker's loop: answer frames from ``requests`` until it closes, compiling on one thread per CPU."""
    compiler = LLVMCompiler()
    write_lock = threading.Lock()

    def reply(number: int, ok: bool, payload: bytes) -> None:
        with write_lock:
            replies.write(_FRAME.pack(number, int(ok), len(payload)) + payload)
            replies.flush()

    def compile_one(number: int, payload: bytes) -> None:
        try:
            reply(number, True, compiler.compile(payload[1:].decode(), payload[0]))
        except Exception as error:  # noqa: BLE001 - LLVM's message goes back to the caller
            reply(number, False, str(error).encode())

    threads = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="funcgrad-llvm") as pool:
        while (frame := _read_frame(requests)) is not None:
            number, kind, payload = frame
            # replies are written by the pool, never here: this loop must keep reading, or a client
            # blocked writing a request while its reply pipe is full would wait forever
            if kind == _DESCRIBE:
                pool.submit(reply, number, True, json.dumps(compiler.description).encode())
            elif kind == _COMPILE:
                pool.submit(compile_one, number, payload)
            else:
                pool.submit(reply, number, False, f"unknown request kind {kind}".encode())


if __name__ == "__main__":
    import signal
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the training process; it closes our stdin
    replies = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)  # anything LLVM or Python prints goes to stderr, never into the replies
    serve(sys.stdin.buffer, replies)
