"""A native loop driver for compiled control flow: a scan's or a while loop's steps run in generated code, not Python.

``lower/control.py`` runs a loop whose body plan is kernels only on an address table (every value of the
body has a slot holding its buffer's address). Driving that table from Python costs a few microseconds a
step (list updates and one ctypes call per kernel, ~2.5 us each); here the whole loop is one call of
``fg_loop``, a small interpreter of a word program over the table, compiled once per machine:

    fg_loop(table, program, steps, launch, pool_state, scratch) -> steps run

The program is a list of int64 words, run once per step ``s`` (0, 1, ...) until ``steps`` steps have
run or an ``EXIT`` finds its flag false:

- ``ROW slot start delta``: ``table[slot] = start + s * delta`` (a step's row of a stacked input/output;
  a negative ``delta`` walks backwards).
- ``FLIP slot even odd``: ``table[slot] = even`` on even steps, ``odd`` on odd ones (a carry's two buffers).
- ``CALL function outer arity slot...``: the single-threaded kernel ``function(addresses..., 0, outer)``.
- ``POOL function outer chunks arity slot...``: a threaded kernel, through the native pool's
  ``fg_pool_launch`` (``devices/cpu_pool.py``), as ``CompiledKernel.launch`` does.
- ``COPY into source bytes``: ``memmove(table[into], table[source], bytes)``.
- ``LINK into source``: ``table[into] = table[source]`` (a step's carry becomes the next step's input).
- ``EXIT slot``: stop, returning ``s``, when the byte at ``table[slot]`` is zero (a while's condition).
- ``END``: the step is over.

The interpreter costs a few nanoseconds a word; a step is its kernels' own time. ``native_loop()`` is
None where the native code cannot run (not x86-64 Linux, ``FUNCGRAD_NATIVE_LOOP=0``, or its build
failed): the loops then run from Python as before.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence

from funcgrad.devices import cpu_pool
from funcgrad.lower.device import CALL, COPY, END, EXIT, FLIP, LINK, POOL, ROW  # the program's words
from funcgrad.util.debug import debug_level

__all__ = ["END", "ROW", "FLIP", "CALL", "POOL", "COPY", "LINK", "EXIT", "NativeLoop", "native_loop", "loop_source"]

WIDTH = {ROW: 4, FLIP: 4, COPY: 4, LINK: 3, EXIT: 2, END: 1}  # words of the fixed-size instructions


def _word(name: str, offset: int) -> list[str]:
    """Lines loading program word ``pc + offset`` as ``%name``."""
    return [f"  %{name}.i = add i64 %pc, {offset}",
            f"  %{name}.at = getelementptr inbounds i64, ptr %program, i64 %{name}.i",
            f"  %{name} = load i64, ptr %{name}.at"]


def _slot(name: str, slot: str) -> list[str]:
    """Lines making ``%name.at``, the address of table entry ``%slot``."""
    return [f"  %{name}.at = getelementptr inbounds i64, ptr %table, i64 %{slot}"]


_GATHER = """
define internal void @fg_loop_gather(ptr %table, ptr %slots, i64 %arity, ptr %scratch) {
entry:
  %none = icmp eq i64 %arity, 0
  br i1 %none, label %done, label %copy
copy:
  %i = phi i64 [ 0, %entry ], [ %i.next, %copy ]
  %slot.at = getelementptr inbounds i64, ptr %slots, i64 %i
  %slot = load i64, ptr %slot.at
  %value.at = getelementptr inbounds i64, ptr %table, i64 %slot
  %value = load i64, ptr %value.at
  %into = getelementptr inbounds i64, ptr %scratch, i64 %i
  store i64 %value, ptr %into
  %i.next = add i64 %i, 1
  %more = icmp ult i64 %i.next, %arity
  br i1 %more, label %copy, label %done
done:
  ret void
}
declare void @llvm.memmove.p0.p0.i64(ptr, ptr, i64, i1)
"""


def loop_source() -> str:
    """The driver's LLVM IR module: ``fg_loop``, the gather helper and the pool's kernel trampolines."""
    lines = ["; funcgrad native loop driver (funcgrad/devices/cpu_loop.py)", *cpu_pool._trampolines(), _GATHER,
             "define i64 @fg_loop(ptr %table, ptr %program, i64 %steps, ptr %launch, ptr %state, ptr %scratch) {",
             "entry:",
             "  br label %step",
             "step:",
             "  %s = phi i64 [ 0, %entry ], [ %s.next, %end.more ]",
             "  %odd = trunc i64 %s to i1",
             "  br label %dispatch",
             "dispatch:",
             "  %pc = phi i64 [ 0, %step ], [ %pc.row, %row ], [ %pc.flip, %flip ], [ %pc.call, %call ], "
             "[ %pc.pool, %pool ], [ %pc.copy, %copy ], [ %pc.link, %link ], [ %pc.exit, %exit.no ]",
             "  %op.at = getelementptr inbounds i64, ptr %program, i64 %pc",
             "  %op = load i64, ptr %op.at",
             f"  switch i64 %op, label %end [ i64 {ROW}, label %row i64 {FLIP}, label %flip i64 {CALL}, label %call "
             f"i64 {POOL}, label %pool i64 {COPY}, label %copy i64 {LINK}, label %link i64 {EXIT}, label %exit ]",
             "row:", *_word("row.slot", 1), *_word("row.start", 2), *_word("row.delta", 3),
             "  %row.off = mul i64 %s, %row.delta",
             "  %row.value = add i64 %row.start, %row.off", *_slot("row", "row.slot"),
             "  store i64 %row.value, ptr %row.at",
             f"  %pc.row = add i64 %pc, {WIDTH[ROW]}",
             "  br label %dispatch",
             "flip:", *_word("flip.slot", 1), *_word("flip.even", 2), *_word("flip.odd", 3),
             "  %flip.value = select i1 %odd, i64 %flip.odd, i64 %flip.even", *_slot("flip", "flip.slot"),
             "  store i64 %flip.value, ptr %flip.at",
             f"  %pc.flip = add i64 %pc, {WIDTH[FLIP]}",
             "  br label %dispatch",
             "call:", *_word("call.fn", 1), *_word("call.outer", 2), *_word("call.arity", 3),
             "  %call.first = add i64 %pc, 4",
             "  %call.slots = getelementptr inbounds i64, ptr %program, i64 %call.first",
             "  call void @fg_loop_gather(ptr %table, ptr %call.slots, i64 %call.arity, ptr %scratch)",
             "  %call.fnp = inttoptr i64 %call.fn to ptr",
             "  call void @fg_pool_chunk(ptr %call.fnp, ptr %scratch, i64 %call.arity, i64 %call.outer, i64 0, i64 1)",
             "  %pc.call = add i64 %call.first, %call.arity",
             "  br label %dispatch",
             "pool:", *_word("pool.fn", 1), *_word("pool.outer", 2), *_word("pool.chunks", 3), *_word("pool.arity", 4),
             "  %pool.first = add i64 %pc, 5",
             "  %pool.slots = getelementptr inbounds i64, ptr %program, i64 %pool.first",
             "  call void @fg_loop_gather(ptr %table, ptr %pool.slots, i64 %pool.arity, ptr %scratch)",
             "  %pool.fnp = inttoptr i64 %pool.fn to ptr",
             "  %pool.ran = call i64 %launch(ptr %state, ptr %pool.fnp, ptr %scratch, i64 %pool.arity, "
             "i64 %pool.outer, i64 %pool.chunks)",
             "  %pc.pool = add i64 %pool.first, %pool.arity",
             "  br label %dispatch",
             "copy:", *_word("copy.into", 1), *_word("copy.source", 2), *_word("copy.bytes", 3),
             *_slot("copy.dst", "copy.into"), *_slot("copy.src", "copy.source"),
             "  %copy.dst = load ptr, ptr %copy.dst.at",
             "  %copy.src = load ptr, ptr %copy.src.at",
             "  call void @llvm.memmove.p0.p0.i64(ptr %copy.dst, ptr %copy.src, i64 %copy.bytes, i1 false)",
             f"  %pc.copy = add i64 %pc, {WIDTH[COPY]}",
             "  br label %dispatch",
             "link:", *_word("link.into", 1), *_word("link.source", 2),
             *_slot("link.dst", "link.into"), *_slot("link.src", "link.source"),
             "  %link.value = load i64, ptr %link.src.at",
             "  store i64 %link.value, ptr %link.dst.at",
             f"  %pc.link = add i64 %pc, {WIDTH[LINK]}",
             "  br label %dispatch",
             "exit:", *_word("exit.slot", 1), *_slot("exit", "exit.slot"),
             "  %exit.ptr = load ptr, ptr %exit.at",
             "  %exit.flag = load i8, ptr %exit.ptr",
             "  %exit.stop = icmp eq i8 %exit.flag, 0",
             f"  %pc.exit = add i64 %pc, {WIDTH[EXIT]}",
             "  br i1 %exit.stop, label %stopped, label %exit.no",
             "exit.no:",
             "  br label %dispatch",
             "stopped:",
             "  ret i64 %s",
             "end:",
             "  %s.next = add i64 %s, 1",
             "  %more = icmp slt i64 %s.next, %steps",
             "  br i1 %more, label %end.more, label %finished",
             "end.more:",
             "  br label %step",
             "finished:",
             "  ret i64 %s.next",
             "}"]
    return "\n".join(lines)


PIPELINE = 0  # no LLVM optimisation: compiled once per machine, and the kernels are the loop's time


class NativeLoop:
    """The compiled ``fg_loop`` (see the module docstring); ``run`` drives one loop.

    >>> loop = NativeLoop()  # doctest: +SKIP
    >>> loop.run(table, [ROW, 3, base, 512, CALL, fn, 1, 2, 3, 4, END], steps=16)  # doctest: +SKIP
    """

    def __init__(self) -> None:
        from funcgrad.devices.cpu_engines import keep_engine
        target, code = cpu_pool.native_code(loop_source(), "native-loop", PIPELINE)
        engine, address = target.load(code, "fg_loop")
        keep_engine(engine)
        self.function = ctypes.CFUNCTYPE(ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64,
                                         ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(address)
        self.scratch = (ctypes.c_int64 * cpu_pool.MAX_BUFFERS)()

    def pool_ready(self) -> bool:
        """Whether threaded kernels can be launched from ``fg_loop`` (the native pool exists; waits for its build)."""
        return cpu_pool.native_pool(wait=True) is not None

    def run(self, table: ctypes.Array[ctypes.c_int64], program: ctypes.Array[ctypes.c_int64], steps: int,
            pooled: bool = False) -> int:
        """Run ``program`` on ``table`` for up to ``steps`` steps; returns the steps run. ``pooled``: the
        program has ``POOL`` words (the native pool must exist: ``pool_ready`` said so). No array is checked:
        the caller vouches for the table's addresses and the program's slots."""
        launch = state = None
        if pooled:
            pool = cpu_pool.native_pool()
            assert pool is not None, "a POOL program needs the native pool"
            launch, state = ctypes.cast(pool._launch, ctypes.c_void_p).value, pool.state
        return int(self.function(table, program, steps, launch, state, self.scratch))


def words(program: Sequence[int]) -> ctypes.Array[ctypes.c_int64]:
    return (ctypes.c_int64 * max(len(program), 1))(*program)


class _Process:
    def __init__(self) -> None:
        self.loop: NativeLoop | None = None
        self.done = False
        self.lock = threading.Lock()


_PROCESS = _Process()


def native_loop() -> NativeLoop | None:
    """This process's loop driver, built on first call (~20 ms once per machine, then from the disk
    cache); None where it is off or unsupported (see the module docstring; DEBUG=1 says why it failed)."""
    process = _PROCESS
    if process.done:
        return process.loop
    with process.lock:
        if not process.done:
            try:
                if os.environ.get("FUNCGRAD_NATIVE_LOOP", "1") != "0" and cpu_pool.supported():
                    process.loop = NativeLoop()
            except (RuntimeError, OSError) as error:
                if debug_level() >= 1:
                    print(f"funcgrad: the native loop driver is off, loops run from Python: {error}")
            process.done = True
    return process.loop
