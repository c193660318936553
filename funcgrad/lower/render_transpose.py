"""Blocked transposes for elementwise kernels (the CPU's ``transpose`` action).

An elementwise kernel whose output is contiguous along its last axis ``J`` but which reads a float32
operand contiguous along another axis ``A`` (``out[n, c, p] = relu(x[n, p, c] + b[c])``: a
channels-last convolution's result read in NCHW order, and its gradient going back) walks that
operand with a stride of ``A``'s extent: every load touches a new cache line and nothing vectorises.

The ``transpose(A, 16)`` action renders it in blocks of 16 x 16 (``A`` x ``J``): for each such
operand, 16 vector loads along ``A`` (one per column ``j`` of the block), a transpose in registers
(four rounds of two-input shuffles, each exchanging one bit of the row number with one bit of the
lane number), and 16 vector stores into a small stack buffer laid out ``[a][j]``; then the kernel's
outputs are computed for the block's 256 elements with that operand read from the buffer, contiguous
along ``j`` like every other operand, so the loop vectorises. Positions outside whole blocks (an
extent that is not a multiple of 16) run the kernel's plain per-element code.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np

from funcgrad.lower.kernel import INDEX, Kernel, KExpr, Opt, _affine, alu, const, var
from funcgrad.lower.render_loops import _FunctionBuilder, _loads, _store_outputs, loop_variables, substitute

__all__ = ["transpose_opts", "check_transpose_opts", "render_transpose", "BLOCK"]

FLOAT32 = np.dtype(np.float32)
BLOCK = 16  # float32 lanes in one 512-bit register: a block is 16 x 16
MIN_ELEMENTS = 1 << 14  # smaller kernels gain less than the compile time they cost
MIN_BYTES = 1 << 15  # an operand this small stays in L1 whatever the order of its loads


def _transposed_loads(kernel: Kernel, axis: int) -> list[KExpr]:
    """The float32 loads of ``kernel`` that are contiguous along output axis ``axis`` and move with a
    stride other than 0 or 1 along the last axis, with no other use of either axis in their index."""
    last = len(kernel.shape) - 1
    found: list[KExpr] = []
    for load in _loads_of(kernel):
        if load.dtype != FLOAT32:
            continue
        terms = _affine(load.args[0])
        if terms is None or terms.get(var(f"g{axis}")) != 1 or terms.get(var(f"g{last}"), 0) in (0, 1):
            continue
        plain = {var(f"g{axis}"), var(f"g{last}"), None}
        if any(atom is not None and atom not in plain and loop_variables(atom) & {f"g{axis}", f"g{last}"}
               for atom in terms):
            continue
        if load not in found:
            found.append(load)
    return found


def _loads_of(kernel: Kernel) -> list[KExpr]:
    found: list[KExpr] = []
    seen: set[int] = set()
    for e in kernel.outputs:
        _loads(e, found, seen)
    return found


def transpose_opts(kernel: Kernel) -> tuple[Opt, ...] | None:
    """``(transpose(A, 16),)`` for an elementwise kernel that reads a large float32 operand transposed
    (see the module docstring), choosing the axis ``A`` most such bytes are contiguous along; else None."""
    rank = len(kernel.shape)
    if kernel.reduce_expr is not None or kernel.reduce_shape or rank < 3 or kernel.shape[-1] < BLOCK:
        return None
    if int(np.prod(kernel.shape)) < MIN_ELEMENTS:
        return None
    best, best_bytes = None, 0
    for axis in range(1, rank - 1):
        if kernel.shape[axis] < BLOCK:
            continue
        transposed = _transposed_loads(kernel, axis)
        moved = sum(int(np.prod(kernel.in_avals[load.arg].shape)) * 4 for load in transposed)
        if moved >= MIN_BYTES and moved > best_bytes and _others_vectorise(kernel, transposed):
            best, best_bytes = axis, moved
    return None if best is None else (Opt("transpose", best, BLOCK),)


def _others_vectorise(kernel: Kernel, transposed: list[KExpr]) -> bool:
    """Whether every other large load is contiguous along, or constant over, the last axis: then the
    block's loop vectorises; a gather there (a pooling window's div/rem index) costs more than the
    transpose saves (a max-pool backward ran slower transposed: docs/performance.md)."""
    last = var(f"g{len(kernel.shape) - 1}")
    for load in _loads_of(kernel):
        aval = kernel.in_avals[load.arg]
        if load in transposed or int(np.prod(aval.shape)) * aval.dtype.itemsize < MIN_BYTES:
            continue
        terms = _affine(load.args[0])
        if terms is None or terms.get(last, 0) not in (0, 1):
            return False
        if any(atom is not None and atom != last and last.arg in loop_variables(atom) for atom in terms):
            return False
    return True


def check_transpose_opts(kernel: Kernel, opts: tuple[Opt, ...]) -> None:
    """Raise ValueError unless ``opts`` (a transpose and perhaps a thread action) fit ``kernel``."""
    rank = len(kernel.shape)
    transposes = [opt for opt in opts if opt.action == "transpose"]
    others = [opt.action for opt in opts if opt.action not in ("transpose", "thread")]
    if len(transposes) != 1 or others:
        raise ValueError(f"kernel {kernel.name}: a blocked transpose takes one transpose action and a thread "
                         f"action, got {', '.join(map(str, opts))}")
    opt = transposes[0]
    if kernel.reduce_expr is not None or kernel.reduce_shape or rank < 3:
        raise ValueError(f"kernel {kernel.name}: transpose applies to elementwise kernels of rank >= 3")
    if opt.amount != BLOCK or not 1 <= opt.axis < rank - 1:
        raise ValueError(f"kernel {kernel.name}: transpose(a, {BLOCK}) takes an output axis a in 1..{rank - 2}, "
                         f"got {opt}")
    if not _transposed_loads(kernel, opt.axis):
        raise ValueError(f"kernel {kernel.name}: no float32 operand is contiguous along axis {opt.axis} and "
                         f"strided along the last axis: there is nothing to transpose")


def _shuffle_masks(bit: int) -> tuple[str, str]:
    """The two shuffle masks of one transpose round: it exchanges bit ``bit`` of the row number (of a
    pair of rows p, q = p + 2^bit) with bit ``bit`` of the lane number."""
    step = 1 << bit
    low = [lane if not lane & step else BLOCK + lane - step for lane in range(BLOCK)]
    high = [lane + step if not lane & step else BLOCK + lane for lane in range(BLOCK)]
    return ("<" + ", ".join(f"i32 {x}" for x in low) + ">", "<" + ", ".join(f"i32 {x}" for x in high) + ">")


def transpose_rows(rows: list[str], shuffle: Callable[[str, str, str], str]) -> list[str]:
    """Transpose 16 vectors (``rows[j]`` lane ``a``) into 16 vectors (lane ``j`` of vector ``a``) with
    ``shuffle(x, y, mask) -> name``: four rounds of 16 two-input shuffles."""
    current = list(rows)
    for bit in range(4):
        low, high = _shuffle_masks(bit)
        step = 1 << bit
        nxt = list(current)
        for p in range(BLOCK):
            if p & step:
                continue
            q = p + step
            nxt[p] = shuffle(current[p], current[q], low)
            nxt[q] = shuffle(current[p], current[q], high)
        current = nxt
    return current


class _Transpose:
    def __init__(self, builder: _FunctionBuilder, kernel: Kernel) -> None:
        self.b, self.kernel = builder, kernel
        self.axis = next(opt.axis for opt in kernel.opts or () if opt.action == "transpose")
        self.last = len(kernel.shape) - 1
        self.loads = _transposed_loads(kernel, self.axis)
        self.allocas: list[str] = []
        self.count = 0
        self.vector = f"<{BLOCK} x float>"

    def loop(self, kind: str) -> str:
        self.count += 1
        name = f"x{kind}{self.count}"
        self.allocas.append(f"%{name}.addr = alloca i64")
        return name

    def render(self) -> None:
        b, kernel = self.b, self.kernel
        entry = len(b.lines)
        rank = len(kernel.shape)
        names = {depth: self.loop(f"g{depth}.") for depth in range(rank) if depth not in (self.axis, self.last)}
        b.open_loop(names[0], "%start", "%end")
        b.var_names["g0"] = names[0]
        for depth in range(1, rank - 1):
            if depth != self.axis:
                b.open_loop(names[depth], "0", str(kernel.shape[depth]))
                b.var_names[f"g{depth}"] = names[depth]
        rows, columns = kernel.shape[self.axis], kernel.shape[self.last]
        whole_rows, whole_columns = rows - rows % BLOCK, columns - columns % BLOCK
        if whole_rows and whole_columns:
            row_block, column_block = self.loop("ab"), self.loop("jb")
            b.open_loop(row_block, "0", str(whole_rows))
            b.open_loop(column_block, "0", str(whole_columns))
            self.block(row_block, column_block)
            b.close_loop(column_block, BLOCK)
            if whole_columns < columns:  # the last columns of these rows, element by element
                self.plain(f"%{row_block}", b.instantiate("{out} = add i64 %" + row_block + f", {BLOCK}"),
                           str(whole_columns), str(columns))
            b.close_loop(row_block, BLOCK)
        if whole_rows < rows or not whole_columns:
            start = str(whole_rows) if whole_columns else "0"
            self.plain(start, str(rows), "0", str(columns))
        for depth in reversed(range(1, rank - 1)):
            if depth != self.axis:
                b.close_loop(names[depth])
        b.close_loop(names[0])
        for depth in range(rank):
            b.var_names.pop(f"g{depth}", None)
        b.lines[entry:entry] = ["  " + line for line in self.allocas]

    def block(self, row_block: str, column_block: str) -> None:
        """One 16 x 16 block from rows ``%row_block`` and columns ``%column_block``."""
        b = self.b
        saved = dict(b.cache)
        axis, last = f"g{self.axis}", f"g{self.last}"
        b.var_names[axis], b.var_names[last] = row_block, column_block
        buffers: dict[KExpr, KExpr] = {}
        inner_row, inner_column = self.loop("a"), self.loop("j")
        for number, load in enumerate(self.loads):
            name = f"tb{self.count}.{number}"
            self.allocas.append(f"%in{name} = alloca [{BLOCK * BLOCK} x float], align 64")
            vectors = []
            for column in range(BLOCK):
                index = b.value(substitute(load.args[0], last, column))
                pointer = b.instantiate("{out} = getelementptr inbounds float, ptr %in{n}, i64 {i}",
                                        n=load.arg, i=index)
                vectors.append(b.instantiate("{out} = load " + self.vector + ", ptr {p}, align 4", p=pointer))
            rows = transpose_rows(vectors, lambda x, y, mask: b.instantiate(
                "{out} = shufflevector " + self.vector + " {x}, " + self.vector + " {y}, <16 x i32> " + mask, x=x, y=y))
            for row, value in enumerate(rows):
                slot = b.instantiate("{out} = getelementptr inbounds float, ptr %in" + name + f", i64 {row * BLOCK}")
                b.emit(f"store {self.vector} {value}, ptr {slot}, align 64")
            position = alu("add", alu("mul", var(inner_row), const(BLOCK, INDEX)), var(inner_column))
            buffers[load] = KExpr("load", FLOAT32, (position,), name)
        outputs = tuple(_replace_loads(e, buffers, {}) for e in self.kernel.outputs)
        b.cache = dict(saved)
        b.open_loop(inner_row, "0", str(BLOCK))
        b.open_loop(inner_column, "0", str(BLOCK))
        b.var_names[axis] = b.instantiate("{out} = add i64 %" + row_block + ", %" + inner_row)[1:]
        b.var_names[last] = b.instantiate("{out} = add i64 %" + column_block + ", %" + inner_column)[1:]
        _store_outputs(b, attrs.evolve(self.kernel, outputs=outputs), [f"g{d}" for d in range(len(self.kernel.shape))])
        b.close_loop(inner_column, hints=("vectorize", f"width={BLOCK}", "no_unroll"))  # one vector per row
        b.close_loop(inner_row)
        b.cache = saved
        del b.var_names[axis], b.var_names[last]

    def plain(self, row_start: str, row_end: str, column_start: str, column_end: str) -> None:
        """Rows [row_start, row_end) x columns [column_start, column_end), element by element."""
        b = self.b
        saved = dict(b.cache)
        row, column = self.loop("ra"), self.loop("rj")
        b.open_loop(row, row_start, row_end)
        b.open_loop(column, column_start, column_end)
        b.var_names[f"g{self.axis}"], b.var_names[f"g{self.last}"] = row, column
        _store_outputs(b, self.kernel, [f"g{d}" for d in range(len(self.kernel.shape))])
        b.close_loop(column)
        b.close_loop(row)
        b.cache = saved
        del b.var_names[f"g{self.axis}"], b.var_names[f"g{self.last}"]


def _replace_loads(e: KExpr, table: dict[KExpr, KExpr], memo: dict[KExpr, KExpr]) -> KExpr:
    if e in table:
        return table[e]
    if e in memo:
        return memo[e]
    args = tuple(_replace_loads(a, table, memo) for a in e.args)
    out = e if args == e.args else KExpr(e.op, e.dtype, args, e.arg)
    memo[e] = out
    return out


def render_transpose(builder: _FunctionBuilder, kernel: Kernel) -> None:
    """Emit the blocked loops of ``kernel`` (which carries a transpose action) into ``builder``."""
    _Transpose(builder, kernel).render()
