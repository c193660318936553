"""A native worker pool for the CPU device's threaded kernels: hand-off and waiting in generated code, not Python.

    caller (Python)                    native code (this module's LLVM IR)               worker threads
    CompiledKernel.launch ------> fg_pool_launch(state, kernel, buffer addresses, outer, chunks)
                                    publish the job in ``state`` (one atomic ticket word) --> spinning on the ticket,
                                    claim and run chunks, wait until every chunk is done  <-- claim and run chunks

Each worker is a Python daemon thread that calls ``fg_pool_worker(state)`` once through ctypes (which
releases the GIL) and stays in native code: it spins on the ticket (``pause`` between polls) and runs
chunks as they come, with no GIL and no Python: the second chunk starts far sooner after the first
than with a Python queue (``cpu_threads._WorkerPool``), whether its worker has just finished or has
been idle (docs/performance.md). After ``FUNCGRAD_POOL_SPIN_US`` microseconds without work (default
200) it sleeps on a futex, and a launch that finds sleepers wakes them (slower than a spinning
worker's start, faster than the Python queue's). The launching thread spins for the workers' chunks
up to ``CALLER_SPIN_US``, then sleeps until the worker that finishes a chunk wakes it.

Spinning costs CPU time, not speed: a spinning worker does not slow the caller's thread (measured on
memory- and compute-bound NumPy work), but it keeps a CPU from other processes for its budget after
each threaded kernel. Under SCHED_FIFO (``chrt``) with other runnable processes on the machine, the
kernel stops a thread that spins through its CPU for tens of milliseconds about once a second (a few
MLP steps in hundreds then take that long; with the Python pool none): medians are unaffected, means
are not.

Workers are not pinned, and the scheduler sometimes puts a worker on the CPU of the thread that
launches (seen here: both on one CPU for whole steps of a training loop, the caller then waiting for a
chunk that could only run after its own, 4-12 ms a step). A worker that claims a chunk on the CPU the
caller published at its launch (``sched_getcpu``) sets its own affinity to the process's CPUs less that
one (``sched_setaffinity``, counted in ``stats["moves"]``), which moves it at once; it may come back when
the caller moves (the next clash moves it again). The caller's affinity is never changed (threads and
processes it starts inherit it). ``FUNCGRAD_PIN_WORKERS=1`` pins workers instead and turns this off.

The ticket packs (job number << 32 | chunks << 16 | next unclaimed chunk): the caller and the workers
claim chunks by incrementing it, so whoever is free runs the next chunk (a late or asleep worker leaves
its chunk to the caller: no hand-off can hang) and a worker never runs a chunk of a job that has
finished. Chunk ``c`` of ``chunks`` covers ``[outer * c // chunks, outer * (c + 1) // chunks)``, as in
the Python pool, so results are the same bits. Kernels of every arity up to ``MAX_BUFFERS`` are called
through one ``switch`` of trampolines that load the buffer addresses from an array, so kernels need no
entry of their own.

One launch at a time uses the pool: a second thread that finds it busy runs its chunks itself. A
forked child gets a fresh pool. x86-64 Linux only (futex, ``pause``); elsewhere and with
``FUNCGRAD_NATIVE_POOL=0`` the Python pool runs threaded kernels. The module is compiled once per
machine and kept under ``$FUNCGRAD_CACHE/native-pool``; a process builds its pool on a thread
at its first threaded launch, and launches use the Python pool until it is ready.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from funcgrad.util.debug import debug_level

if TYPE_CHECKING:
    from funcgrad.devices.cpu_target import InProcessTarget, WorkerTarget

__all__ = ["NativePool", "native_pool", "pool_source", "MAX_BUFFERS", "MAX_CHUNKS"]

MAX_BUFFERS = 32  # kernels with more buffers (outputs + inputs) use the Python pool
MAX_CHUNKS = 4096  # the ticket's chunk fields are 16 bits; the caller's last claim may pass ``chunks`` by one
DEFAULT_SPIN_US = 200
CALLER_SPIN_US = 100  # a launching thread waits this long for workers' chunks spinning, then sleeps

# the state: 64-bit words, each group on its own cache line
TICKET, FUNCTION, ARGUMENTS, ARITY, OUTER, DONE, CALLER_ASLEEP, SLEEPERS, BUSY, STOP, EPOCH = \
    0, 8, 9, 10, 11, 16, 17, 24, 32, 40, 48
SPIN_NS, CALLER_SPIN_NS, CALLER_CPU, REPAIR = 56, 57, 58, 59
WORKER_CHUNKS, WAKES, SLEEPS, WAITED_NS, CALLER_SLEEPS, MOVES = 64, 72, 73, 74, 75, 76  # counts for tests
ALLOWED, ALLOWED_WORDS = 80, 16  # the CPUs the workers may use: a cpu_set_t of 1024 bits
STATE_WORDS = 96

_SCHED_SETAFFINITY = 203

_FUTEX, _FUTEX_WAIT_PRIVATE, _FUTEX_WAKE_PRIVATE, _CLOCK_MONOTONIC = 202, 128, 129, 1


def _word(index: int) -> str:
    return f"getelementptr inbounds i64, ptr %state, i64 {index}"


def _trampolines() -> list[str]:
    """``@fg_pool_chunk``: call ``fn(args[0], ..., args[arity - 1], start, end)`` for chunk c of chunks."""
    cases = " ".join(f"i64 {n}, label %call{n}" for n in range(1, MAX_BUFFERS + 1))
    lines = ["define internal void @fg_pool_chunk(ptr %fn, ptr %args, i64 %arity, i64 %outer, i64 %c, i64 %chunks) {",
             "entry:",
             "  %lo.mul = mul i64 %outer, %c",
             "  %start = udiv i64 %lo.mul, %chunks",
             "  %c1 = add i64 %c, 1",
             "  %hi.mul = mul i64 %outer, %c1",
             "  %end = udiv i64 %hi.mul, %chunks",
             f"  switch i64 %arity, label %done [ {cases} ]"]
    for arity in range(1, MAX_BUFFERS + 1):
        lines.append(f"call{arity}:")
        names = []
        for i in range(arity):
            lines += [f"  %a{arity}.{i}.at = getelementptr inbounds ptr, ptr %args, i64 {i}",
                      f"  %a{arity}.{i} = load ptr, ptr %a{arity}.{i}.at"]
            names.append(f"ptr %a{arity}.{i}")
        lines += [f"  call void %fn({', '.join(names + ['i64 %start', 'i64 %end'])})", "  br label %done"]
    lines += ["done:", "  ret void", "}"]
    return lines


_WORKER = f"""
define void @fg_pool_worker(ptr %state, ptr %mask) {{
entry:
  %ticket = {_word(TICKET)}
  %fn.at = {_word(FUNCTION)}
  %args.at = {_word(ARGUMENTS)}
  %arity.at = {_word(ARITY)}
  %outer.at = {_word(OUTER)}
  %done = {_word(DONE)}
  %caller.flag = {_word(CALLER_ASLEEP)}
  %sleepers = {_word(SLEEPERS)}
  %stop = {_word(STOP)}
  %epoch = {_word(EPOCH)}
  %spin.at = {_word(SPIN_NS)}
  %worker.chunks = {_word(WORKER_CHUNKS)}
  %caller.cpu.at = {_word(CALLER_CPU)}
  %repair.at = {_word(REPAIR)}
  %moves = {_word(MOVES)}
  %allowed = {_word(ALLOWED)}
  br label %idle

idle:                                   ; (re)start the spin budget
  %since = call i64 @fg_pool_now()
  br label %poll

poll:
  %polls = phi i64 [ 0, %idle ], [ %polls.next, %pause ], [ %polls.next, %clock ]
  %w = load atomic i64, ptr %ticket acquire, align 8
  %c = and i64 %w, 65535
  %w.hi = lshr i64 %w, 16
  %chunks = and i64 %w.hi, 65535
  %open = icmp ult i64 %c, %chunks
  br i1 %open, label %claim, label %quiet

claim:
  %w.next = add i64 %w, 1
  %swap = cmpxchg ptr %ticket, i64 %w, i64 %w.next seq_cst seq_cst
  %claimed = extractvalue {{ i64, i1 }} %swap, 1
  br i1 %claimed, label %placed, label %pause

placed:                                 ; on the caller's CPU? move off it (see NativePool)
  %repair = load atomic i64, ptr %repair.at monotonic, align 8
  %repairing = icmp ne i64 %repair, 0
  br i1 %repairing, label %where, label %run

where:
  %own.cpu32 = call i32 @sched_getcpu()
  %own.cpu = sext i32 %own.cpu32 to i64
  %caller.cpu = load atomic i64, ptr %caller.cpu.at monotonic, align 8
  %shared = icmp eq i64 %own.cpu, %caller.cpu
  %known = icmp ult i64 %own.cpu, {ALLOWED_WORDS * 64}
  %clash = and i1 %shared, %known
  br i1 %clash, label %move, label %run

move:                                   ; the allowed CPUs less the caller's: the kernel migrates us now
  call void @llvm.memcpy.p0.p0.i64(ptr %mask, ptr %allowed, i64 {ALLOWED_WORDS * 8}, i1 false)
  %bit.word = lshr i64 %own.cpu, 6
  %bit.index = and i64 %own.cpu, 63
  %bit = shl i64 1, %bit.index
  %bit.off = xor i64 %bit, -1
  %mask.word.at = getelementptr inbounds i64, ptr %mask, i64 %bit.word
  %mask.word = load i64, ptr %mask.word.at
  %mask.less = and i64 %mask.word, %bit.off
  store i64 %mask.less, ptr %mask.word.at
  %r7 = call i64 (i64, ...) @syscall(i64 {_SCHED_SETAFFINITY}, i64 0, i64 {ALLOWED_WORDS * 8}, ptr %mask)
  %r8 = atomicrmw add ptr %moves, i64 1 monotonic
  br label %run

run:                                    ; the fields belong to the job whose chunk was claimed
  %fn = load ptr, ptr %fn.at
  %args = load ptr, ptr %args.at
  %arity = load i64, ptr %arity.at
  %outer = load i64, ptr %outer.at
  call void @fg_pool_chunk(ptr %fn, ptr %args, i64 %arity, i64 %outer, i64 %c, i64 %chunks)
  %r1 = atomicrmw add ptr %worker.chunks, i64 1 monotonic
  %r2 = atomicrmw add ptr %done, i64 1 seq_cst
  %caller.asleep = load atomic i64, ptr %caller.flag seq_cst, align 8
  %wake.caller = icmp ne i64 %caller.asleep, 0
  br i1 %wake.caller, label %caller.wake, label %idle

caller.wake:                            ; the launching thread waits on the done count (a long wait)
  %r6 = call i64 (i64, ...) @syscall(i64 {_FUTEX}, ptr %done, i64 {_FUTEX_WAKE_PRIVATE}, i64 1)
  br label %idle

quiet:
  %halt = load atomic i64, ptr %stop acquire, align 8
  %halting = icmp ne i64 %halt, 0
  br i1 %halting, label %exit, label %pause

pause:
  call void @llvm.x86.sse2.pause()
  %polls.next = add i64 %polls, 1
  %check = and i64 %polls.next, 255
  %checking = icmp eq i64 %check, 0
  br i1 %checking, label %clock, label %poll

clock:
  %spin.ns = load atomic i64, ptr %spin.at monotonic, align 8
  %now = call i64 @fg_pool_now()
  %idle.ns = sub i64 %now, %since
  %spun = icmp ugt i64 %idle.ns, %spin.ns
  br i1 %spun, label %sleep, label %poll

sleep:                                  ; mark sleeping, re-check, then wait for the epoch to move
  %s1 = atomicrmw add ptr %sleepers, i64 1 seq_cst
  %e = load atomic i32, ptr %epoch seq_cst, align 8
  %w2 = load atomic i64, ptr %ticket seq_cst, align 8
  %c2 = and i64 %w2, 65535
  %w2.hi = lshr i64 %w2, 16
  %chunks2 = and i64 %w2.hi, 65535
  %open2 = icmp ult i64 %c2, %chunks2
  %halt2 = load atomic i64, ptr %stop seq_cst, align 8
  %halting2 = icmp ne i64 %halt2, 0
  %awake = or i1 %open2, %halting2
  br i1 %awake, label %woken, label %wait

wait:
  %slept = {_word(SLEEPS)}
  %r4 = atomicrmw add ptr %slept, i64 1 monotonic
  %e64 = zext i32 %e to i64
  %r3 = call i64 (i64, ...) @syscall(i64 {_FUTEX}, ptr %epoch, i64 {_FUTEX_WAIT_PRIVATE}, i64 %e64, ptr null)
  br label %woken

woken:
  %s2 = atomicrmw sub ptr %sleepers, i64 1 seq_cst
  br label %idle

exit:
  ret void
}}
"""

def _launch_source() -> str:
    """``@fg_pool_launch``: publish a job, claim and run chunks, wait for the workers' chunks; returns
    the chunks this thread ran."""
    return f"""
define i64 @fg_pool_launch(ptr %state, ptr %fn, ptr %args, i64 %arity, i64 %outer, i64 %chunks) {{
entry:
  %ticket = {_word(TICKET)}
  %done = {_word(DONE)}
  %busy = {_word(BUSY)}
  %sleepers = {_word(SLEEPERS)}
  %epoch = {_word(EPOCH)}
  %wakes = {_word(WAKES)}
  %waited.ns = {_word(WAITED_NS)}
  %caller.flag = {_word(CALLER_ASLEEP)}
  %caller.spin.at = {_word(CALLER_SPIN_NS)}
  %caller.sleeps = {_word(CALLER_SLEEPS)}
  %swap = cmpxchg ptr %busy, i64 0, i64 1 acquire monotonic
  %free = extractvalue {{ i64, i1 }} %swap, 1
  br i1 %free, label %publish, label %alone

alone:                                  ; another thread's launch holds the pool: run every chunk here
  %ac = phi i64 [ 0, %entry ], [ %ac.next, %alone.run ]
  %more = icmp ult i64 %ac, %chunks
  br i1 %more, label %alone.run, label %alone.exit

alone.run:
  call void @fg_pool_chunk(ptr %fn, ptr %args, i64 %arity, i64 %outer, i64 %ac, i64 %chunks)
  %ac.next = add i64 %ac, 1
  br label %alone

alone.exit:
  ret i64 %chunks

publish:
  %cpu32 = call i32 @sched_getcpu()
  %cpu = sext i32 %cpu32 to i64
  %cpu.at = {_word(CALLER_CPU)}
  store atomic i64 %cpu, ptr %cpu.at monotonic, align 8
  %fn.at = {_word(FUNCTION)}
  %args.at = {_word(ARGUMENTS)}
  %arity.at = {_word(ARITY)}
  %outer.at = {_word(OUTER)}
  store ptr %fn, ptr %fn.at
  store ptr %args, ptr %args.at
  store i64 %arity, ptr %arity.at
  store i64 %outer, ptr %outer.at
  store atomic i64 0, ptr %done monotonic, align 8
  %old = load atomic i64, ptr %ticket monotonic, align 8
  %job = lshr i64 %old, 32
  %job.next = add i64 %job, 1
  %job.bits = shl i64 %job.next, 32
  %chunk.bits = shl i64 %chunks, 16
  %new = or i64 %job.bits, %chunk.bits
  store atomic i64 %new, ptr %ticket seq_cst, align 8
  %asleep = load atomic i64, ptr %sleepers seq_cst, align 8
  %any.asleep = icmp ne i64 %asleep, 0
  br i1 %any.asleep, label %wake, label %claim

wake:
  %e = atomicrmw add ptr %epoch, i32 1 seq_cst
  %r1 = call i64 (i64, ...) @syscall(i64 {_FUTEX}, ptr %epoch, i64 {_FUTEX_WAKE_PRIVATE}, i64 2147483647)
  %r2 = atomicrmw add ptr %wakes, i64 1 monotonic
  br label %claim

claim:
  %own = phi i64 [ 0, %publish ], [ 0, %wake ], [ %own.next, %run ]
  %w = atomicrmw add ptr %ticket, i64 1 seq_cst
  %c = and i64 %w, 65535
  %open = icmp ult i64 %c, %chunks
  br i1 %open, label %run, label %claimed

run:
  call void @fg_pool_chunk(ptr %fn, ptr %args, i64 %arity, i64 %outer, i64 %c, i64 %chunks)
  %r3 = atomicrmw add ptr %done, i64 1 seq_cst
  %own.next = add i64 %own, 1
  br label %claim

claimed:                                ; every chunk is taken; the workers' may still run
  %finished.now = load atomic i64, ptr %done acquire, align 8
  %all.now = icmp uge i64 %finished.now, %chunks
  br i1 %all.now, label %exit, label %waiting

waiting:
  %wait.from = call i64 @fg_pool_now()
  br label %wait

wait:
  %polls = phi i64 [ 0, %waiting ], [ %polls.next, %spin ], [ %polls.next, %clock ], [ 0, %woken ]
  %finished = load atomic i64, ptr %done acquire, align 8
  %all = icmp uge i64 %finished, %chunks
  br i1 %all, label %waited, label %spin

waited:                                 ; the time the caller waited, for measurements (two vDSO clock reads)
  %wait.to = call i64 @fg_pool_now()
  %wait.ns = sub i64 %wait.to, %wait.from
  %r5 = atomicrmw add ptr %waited.ns, i64 %wait.ns monotonic
  br label %exit

spin:                                   ; a worker runs a chunk: wait for it
  call void @llvm.x86.sse2.pause()
  %polls.next = add i64 %polls, 1
  %check = and i64 %polls.next, 255
  %checking = icmp eq i64 %check, 0
  br i1 %checking, label %clock, label %wait

clock:
  %caller.spin = load atomic i64, ptr %caller.spin.at monotonic, align 8
  %now = call i64 @fg_pool_now()
  %so.far = sub i64 %now, %wait.from
  %long = icmp ugt i64 %so.far, %caller.spin
  br i1 %long, label %sleep, label %wait

sleep:                                  ; a long wait sleeps: the CPU goes to whoever needs it (a worker queued here)
  store atomic i64 1, ptr %caller.flag seq_cst, align 8
  %seen = load atomic i64, ptr %done seq_cst, align 8
  %over = icmp uge i64 %seen, %chunks
  br i1 %over, label %woken, label %futex

futex:
  %r7 = atomicrmw add ptr %caller.sleeps, i64 1 monotonic
  %seen64 = and i64 %seen, 4294967295
  %r4 = call i64 (i64, ...) @syscall(i64 {_FUTEX}, ptr %done, i64 {_FUTEX_WAIT_PRIVATE}, i64 %seen64, ptr null)
  br label %woken

woken:
  store atomic i64 0, ptr %caller.flag seq_cst, align 8
  br label %wait

exit:
  store atomic i64 0, ptr %busy release, align 8
  ret i64 %own
}}
"""


_SUPPORT = f"""
define internal i64 @fg_pool_now() {{
entry:
  %time = alloca {{ i64, i64 }}
  %r = call i32 @clock_gettime(i32 {_CLOCK_MONOTONIC}, ptr %time)
  %sec.at = getelementptr inbounds {{ i64, i64 }}, ptr %time, i32 0, i32 0
  %nsec.at = getelementptr inbounds {{ i64, i64 }}, ptr %time, i32 0, i32 1
  %sec = load i64, ptr %sec.at
  %nsec = load i64, ptr %nsec.at
  %sec.ns = mul i64 %sec, 1000000000
  %ns = add i64 %sec.ns, %nsec
  ret i64 %ns
}}

declare i32 @clock_gettime(i32, ptr)
declare i32 @sched_getcpu()
declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)
declare i64 @syscall(i64, ...)
declare void @llvm.x86.sse2.pause()
"""


def pool_source() -> str:
    """The pool's LLVM IR module: ``fg_pool_worker``, ``fg_pool_launch`` and their helpers."""
    return "\n".join(["; funcgrad native worker pool (funcgrad/devices/cpu_pool.py)", *_trampolines(),
                      _WORKER, _launch_source(), _SUPPORT])


PIPELINE = 0  # no LLVM optimisation: half O2's compile time, once per machine; the hot loops are a few loads


def native_code(source: str, folder: str, pipeline: int = PIPELINE) -> tuple[InProcessTarget | WorkerTarget, bytes]:
    """(the host target, the object code of ``source``): compiled once per machine, then read from the
    disk cache's ``folder`` (apart from the kernels' folder and its trims). The native pool and the
    native loop driver (cpu_loop.py) are built this way."""
    from funcgrad.devices.cpu_disk_cache import DiskCache
    from funcgrad.devices.cpu_target import cache_root, host_target
    cache = DiskCache(cache_root() / folder)
    key = cache.key(source)
    target = host_target()
    code = cache.load(key)
    if code is None:
        code = target.compile(source, pipeline)
        cache.store(key, code)
    return target, code


class NativePool:
    """``workers`` daemon threads in ``fg_pool_worker`` and the launch entry (see the module docstring).

    >>> pool = NativePool(1)  # doctest: +SKIP
    >>> pool.launch(compiled.address, [out, a, b], outer=512, chunks=2)  # doctest: +SKIP
    """

    def __init__(self, workers: int, spin_us: float = DEFAULT_SPIN_US, caller_spin_us: float = CALLER_SPIN_US) -> None:
        from funcgrad.devices.cpu_engines import keep_engine
        target, code = native_code(pool_source(), "native-pool")
        addresses = []
        for name in ("fg_pool_launch", "fg_pool_worker"):
            engine, address = target.load(code, name)
            keep_engine(engine)  # workers run in this code until the process ends
            addresses.append(address)
        # never freed: daemon workers may still read it while the interpreter shuts down
        libc = ctypes.CDLL(None)
        libc.aligned_alloc.restype, libc.aligned_alloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t, ctypes.c_size_t]
        self.state = libc.aligned_alloc(64, STATE_WORDS * 8)  # the ticket on a cache line of its own
        if not self.state:
            raise OSError("no memory for the native worker pool's state")
        ctypes.memset(self.state, 0, STATE_WORDS * 8)
        self.words = (ctypes.c_int64 * STATE_WORDS).from_address(self.state)
        self.words[SPIN_NS] = int(spin_us * 1000)
        self.words[CALLER_SPIN_NS] = int(caller_spin_us * 1000)
        self._launch = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)(addresses[0])
        self._worker = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(addresses[1])
        self.workers = workers
        pin = os.environ.get("FUNCGRAD_PIN_WORKERS") == "1" and hasattr(os, "sched_getaffinity")
        cpus = sorted(os.sched_getaffinity(0)) if pin else []
        allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
        for cpu in allowed:
            if cpu < ALLOWED_WORDS * 64:
                self.words[ALLOWED + cpu // 64] |= 1 << (cpu % 64) if cpu % 64 < 63 else -(1 << 63)
        # a worker moves off the caller's CPU where the scheduler put both on one (module docstring);
        # not where workers are pinned, nor where one CPU would be left to it
        self.words[REPAIR] = int(not pin and len(allowed) > 1)
        self._masks = [(ctypes.c_int64 * ALLOWED_WORDS)() for _ in range(workers)]
        self.tids: list[int | None] = [None] * workers
        homes = [cpus[(number + 1) % len(cpus)] if cpus else None for number in range(workers)]
        self.threads = [threading.Thread(target=self._work, args=(number, homes[number]),
                                         name=f"funcgrad-native-{number}", daemon=True) for number in range(workers)]
        for thread in self.threads:
            thread.start()

    def _work(self, number: int, cpu: int | None) -> None:
        self.tids[number] = threading.get_native_id()
        if cpu is not None:
            with contextlib.suppress(OSError):
                os.sched_setaffinity(0, {cpu})
        self._worker(self.state, ctypes.addressof(self._masks[number]))  # returns only after close()

    def launch(self, function: int, pointers: Sequence[int], outer: int, chunks: int) -> int:
        """Run ``function(*pointers, start, end)`` on ``chunks`` chunks of ``[0, outer)``, this thread
        taking its share; returns how many chunks this thread ran. ``function`` is a kernel's address
        (``len(pointers) <= MAX_BUFFERS``, ``chunks <= MAX_CHUNKS``)."""
        return int(self._launch(self.state, function, (ctypes.c_void_p * len(pointers))(*pointers), len(pointers),
                                outer, chunks))

    @property
    def stats(self) -> dict[str, int]:
        """Since the pool started: chunks the workers ran, their futex waits and the launches' wakes, the
        time launching threads waited for workers' chunks after running their own, and how often they slept."""
        return {"worker_chunks": self.words[WORKER_CHUNKS], "wakes": self.words[WAKES], "sleeps": self.words[SLEEPS],
                "sleepers": self.words[SLEEPERS], "waited_ns": self.words[WAITED_NS],
                "caller_sleeps": self.words[CALLER_SLEEPS], "moves": self.words[MOVES]}

    def close(self, timeout: float = 5.0) -> None:
        """Stop the workers (they return to Python and end); for tests: the process pool is never closed."""
        self.words[STOP] = 1
        epoch = ctypes.c_int32.from_address(self.state + 8 * EPOCH)
        epoch.value += 1
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall(ctypes.c_long(_FUTEX), ctypes.c_void_p(self.state + 8 * EPOCH),
                     ctypes.c_long(_FUTEX_WAKE_PRIVATE), ctypes.c_long(2**31 - 1))
        for thread in self.threads:
            thread.join(timeout)


def supported() -> bool:
    """The pool's code needs x86-64 (``pause``) and Linux (futex)."""
    return sys.platform.startswith("linux") and platform.machine().lower() in ("x86_64", "amd64")


def spin_microseconds() -> float:
    """``FUNCGRAD_POOL_SPIN_US``: how long an idle worker spins before it sleeps (default 200)."""
    text = os.environ.get("FUNCGRAD_POOL_SPIN_US", "")
    try:
        value = float(text) if text else DEFAULT_SPIN_US
    except ValueError:
        raise ValueError(f"FUNCGRAD_POOL_SPIN_US must be a number of microseconds, got {text!r}") from None
    if not value >= 0:
        raise ValueError(f"FUNCGRAD_POOL_SPIN_US must be >= 0, got {text!r}")
    return value


class _Process:
    """This process's pool: built on first use; a forked child starts again (``os.register_at_fork``)."""

    def __init__(self) -> None:
        self.pool: NativePool | None = None
        self.ready = threading.Event()  # set once the pool is built, or known to be off
        self.building = False
        self.lock = threading.Lock()

    def build(self) -> None:
        try:
            if os.environ.get("FUNCGRAD_NATIVE_POOL", "1") != "0" and supported():
                from funcgrad.devices import cpu_threads
                self.pool = NativePool(cpu_threads.thread_count() - 1, spin_microseconds())
        except ValueError as error:  # a bad FUNCGRAD_POOL_SPIN_US
            print(f"funcgrad: the native worker pool is off: {error}", file=sys.stderr)
        except (RuntimeError, OSError) as error:
            if debug_level() >= 1:
                print(f"funcgrad: the native worker pool is off, threaded kernels use Python threads: {error}",
                      file=sys.stderr)
        finally:
            self.ready.set()


_PROCESS = _Process()


def _forget() -> None:
    global _PROCESS
    _PROCESS = _Process()  # the parent's workers are not in this process


if hasattr(os, "register_at_fork"):  # not on Windows (where the pool is off anyway)
    os.register_at_fork(after_in_child=_forget)


def native_pool(wait: bool = True) -> NativePool | None:
    """This process's native pool, built on first call; None where it is off (``FUNCGRAD_NATIVE_POOL=0``),
    unsupported, or failed to build (DEBUG=1 says why): threaded kernels then use the Python pool.
    ``wait=False`` (kernel launches) does not wait for the build: it runs on a thread of its own
    (a cold machine compiles the module) and None is returned until it is done."""
    process = _PROCESS
    if process.ready.is_set():
        return process.pool
    with process.lock:
        start, process.building = not process.building, True
    if start:
        if wait:
            process.build()
        else:
            try:
                threading.Thread(target=process.build, name="funcgrad-native-pool-build", daemon=True).start()
            except RuntimeError:  # no new threads at interpreter shutdown: the Python pool it is
                process.ready.set()
    if wait:
        process.ready.wait()
    return process.pool


def reset_native_pool() -> None:
    """Forget this process's pool and stop its workers (tests: after changing FUNCGRAD_NATIVE_POOL)."""
    process = _PROCESS
    _forget()
    if process.building:
        process.ready.wait()
    if process.pool is not None:
        process.pool.close()
