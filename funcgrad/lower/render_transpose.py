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

``A`` may be axis 0, the one the threads split: a rank-2 copy ``out[i, j] = x[j, i]`` (a weight
gradient that comes out of its product in the other layout) runs its whole blocks of rows from the
thread's ``%start``, the rows left over element by element. 8-byte elements (float64, int64) take
``transpose(A, 8)``: 8 x 8 blocks, three shuffle rounds (valid opts, not chosen by the heuristic:
they measured 0.5x to 2x the plain loops). The heuristic leaves to the plain loops a
transposed read whose column walk stays in L1 (``_plain_walk_fits_l1``) along rows of >= 64.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import numpy as np

from funcgrad.lower.kernel import INDEX, Kernel, KExpr, Opt, _affine, alu, const, var, with_args
from funcgrad.lower.render_loops import (
    _FunctionBuilder,
    _loads,
    _store_outputs,
    loop_variables,
    memory_type,
    substitute,
)

__all__ = ["transpose_opts", "check_transpose_opts", "render_transpose", "BLOCK", "BLOCKS"]

BLOCK = 16  # float32 lanes in one 512-bit register: a block is 16 x 16
VECTOR_BYTES = 64  # one 512-bit register (and one cache line): a block's side is this many bytes
BLOCKS = {16: ("float", "i32"), 8: ("double", "i64")}  # block side -> the element types it transposes
HEURISTIC_BLOCKS = (16,)  # 8 x 8 float64 blocks measured mixed (0.5x to 2x the plain loops): chosen by hand only
MIN_ELEMENTS = 1 << 14  # smaller kernels gain less than the compile time they cost
MIN_BYTES = 1 << 15  # an operand this small stays in L1 whatever the order of its loads
# The plain loops walk a transposed operand down a column, one cache line per element, and reuse each
# line for the next rows of axis A; that stays fast while those lines stay in L1. The model: 64-byte
# lines in L1_SETS sets, at most L1_WAYS lines of the walk to a set (this CPU's 48 KB L1d has 12 ways:
# two are left to the outputs' lines). docs/performance.md has the measurements behind it.
CACHE_LINE = 64
L1_SETS = 64
L1_WAYS = 10
# Rows of more than this many blocks run their column blocks outermost: each block then reads n input
# rows along their length (n sequential streams) and the output is written in column strips; with row
# blocks outermost a block writes n long output rows at once, slow when the output is not in cache (a
# 384 x 1536 copy with a cold output: 1.47x the plain loops row blocks first, 0.80x column blocks
# first; 0.43x and 0.37x hot). The CNN's rows of 2 blocks measured ~10% better row blocks first.
COLUMNS_OUTER = 2
PLAIN_ROW = 64  # the plain loops' strided rows shorter than this run slowly, whatever the cache does
SIMULATED_LINES = 1 << 16  # a walk longer than this is taken not to fit L1 without counting its lines


def _block_type(dtype: np.dtype, block: int) -> bool:
    return dtype.kind != "b" and np.dtype(dtype).itemsize * block == VECTOR_BYTES \
        and memory_type(dtype) in BLOCKS.get(block, ())


def _transposed_loads(kernel: Kernel, axis: int, block: int = BLOCK) -> list[KExpr]:
    """The loads of ``kernel`` whose elements are ``VECTOR_BYTES / block`` bytes wide (float32 or
    int32 for 16, float64 or int64 for 8), contiguous along output axis ``axis`` and moving with a
    stride other than 0 or 1 along the last axis, with no other use of either axis in their index."""
    last = len(kernel.shape) - 1
    found: list[KExpr] = []
    for load in _loads_of(kernel):
        if not _block_type(load.dtype, block):
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
    """``(transpose(A, 16),)`` for an elementwise kernel that reads a large operand of 4-byte elements
    transposed (see the module docstring), choosing the axis ``A`` most such bytes move along; else
    None. 8 x 8 blocks of 8-byte elements are valid opts but not chosen (``HEURISTIC_BLOCKS``)."""
    rank = len(kernel.shape)
    if kernel.reduce_expr is not None or kernel.reduce_shape or rank < 2:
        return None
    if int(np.prod(kernel.shape)) < MIN_ELEMENTS:
        return None
    best, best_bytes = None, 0
    for block in HEURISTIC_BLOCKS:
        if kernel.shape[-1] < block:
            continue
        for axis in range(rank - 1):
            if kernel.shape[axis] < block:
                continue
            transposed = _transposed_loads(kernel, axis, block)
            moved = sum(int(np.prod(kernel.in_avals[load.arg].shape)) * load.dtype.itemsize for load in transposed)
            if moved >= MIN_BYTES and moved > best_bytes and _others_vectorise(kernel, transposed) \
                    and (kernel.shape[-1] < PLAIN_ROW or not all(_plain_walk_fits_l1(kernel, axis, load)
                                                                for load in transposed)):
                best, best_bytes = Opt("transpose", axis, block), moved
    return None if best is None else (best,)


def _plain_walk_fits_l1(kernel: Kernel, axis: int, load: KExpr) -> bool:
    """Whether the plain loops' walk of ``load`` over the axes after ``axis`` (what runs between two
    reads of one cache line) puts at most ``L1_WAYS`` distinct lines into any of ``L1_SETS`` sets: then
    the lines stay in L1 for the next rows of ``axis`` and the blocked transpose has nothing to gain
    (a 513 x 257 float32 copy ran 10-35% slower blocked; 384 x 1536, whose column walk falls in 2 sets,
    2.7x faster)."""
    terms = _affine(load.args[0]) or {}
    extents = kernel.shape[axis + 1:]
    if int(np.prod(extents)) > SIMULATED_LINES:
        return False
    offsets = np.zeros((), np.int64)
    for depth, extent in enumerate(extents, start=axis + 1):
        step = terms.get(var(f"g{depth}"), 0)
        offsets = np.add.outer(offsets, np.arange(extent, dtype=np.int64) * int(step))
    lines = np.unique(offsets.ravel() * load.dtype.itemsize // CACHE_LINE)
    return int(np.bincount(lines % L1_SETS, minlength=L1_SETS).max()) <= L1_WAYS


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
    if kernel.reduce_expr is not None or kernel.reduce_shape or rank < 2:
        raise ValueError(f"kernel {kernel.name}: transpose applies to elementwise kernels of rank >= 2")
    if opt.amount not in BLOCKS or not 0 <= opt.axis < rank - 1:
        raise ValueError(f"kernel {kernel.name}: transpose(a, n) takes an output axis a in 0..{rank - 2} and a "
                         f"block side n in {sorted(BLOCKS)}, got {opt}")
    if not _transposed_loads(kernel, opt.axis, opt.amount):
        raise ValueError(f"kernel {kernel.name}: no operand of {VECTOR_BYTES // opt.amount}-byte elements is "
                         f"contiguous along axis {opt.axis} and strided along the last axis: there is nothing "
                         f"to transpose")


def _shuffle_masks(bit: int, lanes: int = BLOCK) -> tuple[str, str]:
    """The two shuffle masks of one transpose round: it exchanges bit ``bit`` of the row number (of a
    pair of rows p, q = p + 2^bit) with bit ``bit`` of the lane number."""
    step = 1 << bit
    low = [lane if not lane & step else lanes + lane - step for lane in range(lanes)]
    high = [lane + step if not lane & step else lanes + lane for lane in range(lanes)]
    return ("<" + ", ".join(f"i32 {x}" for x in low) + ">", "<" + ", ".join(f"i32 {x}" for x in high) + ">")


def transpose_rows(rows: list[str], shuffle: Callable[[str, str, str], str]) -> list[str]:
    """Transpose n vectors (``rows[j]`` lane ``a``, n a power of two) into n vectors (lane ``j`` of
    vector ``a``) with ``shuffle(x, y, mask) -> name``: log2(n) rounds of n two-input shuffles."""
    lanes = len(rows)
    if lanes & (lanes - 1) or lanes < 2:
        raise ValueError(f"transpose_rows takes a power-of-two count of vectors, got {lanes}")
    current = list(rows)
    for bit in range(lanes.bit_length() - 1):
        low, high = _shuffle_masks(bit, lanes)
        step = 1 << bit
        nxt = list(current)
        for p in range(lanes):
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
        opt = next(opt for opt in kernel.opts or () if opt.action == "transpose")
        self.axis, self.n = opt.axis, opt.amount
        self.last = len(kernel.shape) - 1
        self.loads = _transposed_loads(kernel, self.axis, self.n)
        self.allocas: list[str] = []
        self.count = 0

    def loop(self, kind: str) -> str:
        self.count += 1
        name = f"x{kind}{self.count}"
        self.allocas.append(f"%{name}.addr = alloca i64")
        return name

    def render(self) -> None:
        """The loops over the other axes (axis 0, split by the threads, outermost), then the blocks:
        rows of axis ``A`` in blocks of n (over the thread's [start, end) when ``A`` is axis 0) and
        columns in blocks of n, the column blocks outermost when a row has more than COLUMNS_OUTER
        of them; the edges that do not fill a block element by element."""
        b, kernel, n = self.b, self.kernel, self.n
        entry = len(b.lines)
        names = {}
        for depth in range(self.last):
            if depth != self.axis:
                names[depth] = self.loop(f"g{depth}.")
                b.open_loop(names[depth], "%start" if depth == 0 else "0",
                            "%end" if depth == 0 else str(kernel.shape[depth]))
                b.var_names[f"g{depth}"] = names[depth]
        rows, columns = kernel.shape[self.axis], kernel.shape[self.last]
        whole_columns = columns - columns % n
        if self.axis == 0:  # this thread's rows: whole blocks from %start, the rest element by element
            row_start, row_end = "%start", "%end"
            count = b.instantiate("{out} = sub i64 %end, %start")
            whole = b.instantiate("{out} = and i64 {x}, " + str(-n), x=count)
            whole_end = b.instantiate("{out} = add i64 %start, {x}", x=whole)
        else:
            row_start, row_end, whole_end = "0", str(rows), str(rows - rows % n)
        if whole_columns > COLUMNS_OUTER * n and whole_end != "0":  # column blocks outermost
            row_block, column_block = self.loop("ab"), self.loop("jb")
            b.open_loop(column_block, "0", str(whole_columns))
            b.open_loop(row_block, row_start, whole_end)
            self.block(row_block, column_block)
            b.close_loop(row_block, n)
            b.close_loop(column_block, n)
            if whole_columns < columns:  # the last columns of the whole rows, element by element
                self.plain(row_start, whole_end, str(whole_columns), str(columns))
            if whole_end != row_end:
                self.plain(whole_end, row_end, "0", str(columns))
        elif whole_columns and whole_end != "0":  # short rows: row blocks outermost
            row_block, column_block = self.loop("ab"), self.loop("jb")
            b.open_loop(row_block, row_start, whole_end)
            b.open_loop(column_block, "0", str(whole_columns))
            self.block(row_block, column_block)
            b.close_loop(column_block, n)
            if whole_columns < columns:  # the last columns of these rows, element by element
                self.plain(f"%{row_block}", b.instantiate("{out} = add i64 %" + row_block + f", {n}"),
                           str(whole_columns), str(columns))
            b.close_loop(row_block, n)
            if whole_end != row_end:
                self.plain(whole_end, row_end, "0", str(columns))
        else:
            self.plain(row_start, row_end, "0", str(columns))
        for depth in reversed(range(self.last)):
            if depth in names:
                b.close_loop(names[depth])
        for depth in range(self.last + 1):
            b.var_names.pop(f"g{depth}", None)
        b.lines[entry:entry] = ["  " + line for line in self.allocas]

    def block(self, row_block: str, column_block: str) -> None:
        """One n x n block from rows ``%row_block`` and columns ``%column_block``."""
        b, n = self.b, self.n
        saved = dict(b.cache)
        axis, last = f"g{self.axis}", f"g{self.last}"
        b.var_names[axis], b.var_names[last] = row_block, column_block
        buffers: dict[KExpr, KExpr] = {}
        inner_row, inner_column = self.loop("a"), self.loop("j")
        for number, load in enumerate(self.loads):
            name = f"tb{self.count}.{number}"
            element = memory_type(load.dtype)
            vector = f"<{n} x {element}>"
            self.allocas.append(f"%in{name} = alloca [{n * n} x {element}], align 64")
            vectors = []
            for column in range(n):
                index = b.value(substitute(load.args[0], last, column))
                pointer = b.instantiate("{out} = getelementptr inbounds {t}, ptr %in{n}, i64 {i}",
                                        t=element, n=load.arg, i=index)
                vectors.append(b.instantiate("{out} = load " + vector + ", ptr {p}, align 4", p=pointer))
            shuffle = "{out} = shufflevector " + vector + " {x}, " + vector + " {y}, <" + str(n) + " x i32> "

            def shuffled(x: str, y: str, mask: str, template: str = shuffle) -> str:
                return b.instantiate(template + mask, x=x, y=y)

            rows = transpose_rows(vectors, shuffled)
            for row, value in enumerate(rows):
                slot = b.instantiate("{out} = getelementptr inbounds " + element + ", ptr %in" + name
                                     + f", i64 {row * n}")
                b.emit(f"store {vector} {value}, ptr {slot}, align 64")
            position = alu("add", alu("mul", var(inner_row), const(n, INDEX)), var(inner_column))
            buffers[load] = KExpr("load", load.dtype, (position,), name)
        outputs = tuple(_replace_loads(e, buffers, {}) for e in self.kernel.outputs)
        b.cache = dict(saved)
        b.open_loop(inner_row, "0", str(n))
        b.open_loop(inner_column, "0", str(n))
        b.var_names[axis] = b.instantiate("{out} = add i64 %" + row_block + ", %" + inner_row)[1:]
        b.var_names[last] = b.instantiate("{out} = add i64 %" + column_block + ", %" + inner_column)[1:]
        _store_outputs(b, attrs.evolve(self.kernel, outputs=outputs), [f"g{d}" for d in range(len(self.kernel.shape))])
        b.close_loop(inner_column, hints=("vectorize", f"width={n}", "no_unroll"))  # one vector per row
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
    out = with_args(e, args)
    memo[e] = out
    return out


def render_transpose(builder: _FunctionBuilder, kernel: Kernel) -> None:
    """Emit the blocked loops of ``kernel`` (which carries a transpose action) into ``builder``."""
    _Transpose(builder, kernel).render()
