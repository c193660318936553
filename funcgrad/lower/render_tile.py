"""Register-tiled micro-kernels for reductions shaped like a matrix product (the CPU's ``tile`` action).

A float32 sum whose last output axis is long enough and whose operands are either contiguous along
that axis or do not move with it (``C[m, j] = sum_k A[m, k] * B[k, j]``, and every convolution once
``lower/conv.py`` has made it a product) is rendered with explicit ``<16 x float>`` vectors: a tile of
``rows`` output rows by ``vectors`` x 16 columns is held in registers for the whole reduction; each
step of the reduction loads ``vectors`` vectors of the operand that varies along the columns (shared
by every row), broadcasts one value of the other operand per row, and issues ``rows * vectors``
fused multiply-adds. The 14 x 32 tile keeps 28 of AVX-512's 32 vector registers as accumulators.

Rows are every output axis but the last, flattened, so a convolution's (batch, height, width) rows
tile without remainders at image borders; the loop over columns is outermost, so the column panel
of the shared operand stays in cache while the rows stream past it. Columns that do not fill a tile
take a narrower tile whose last vector is masked (no out-of-bounds load or store); rows that do not
fill one run one at a time. The epilogue (bias, activation, casts: anything the kernel fuses after
the reduction) runs per element from a stack copy of the tile, as in the plain renderer.

A product whose column operand is contiguous along the reduction instead (``C[m, j] = sum_k A[m, k] *
B[j, k]``: a gradient ``dY @ W.T``) is *packed*: per column panel and reduction block, the factor that
varies with the columns is evaluated once into a stack buffer laid out ``[k][column]`` (BLIS's packed
panel), and the register tile reads that buffer as it reads a contiguous operand.

A computed row factor (``max(h, 0) @ W``) is evaluated once per chunk of rows into a stack buffer;
a strided column factor made of one load is packed in 16 x 16 blocks transposed in registers; a
large product packs even a contiguous column operand. ``swap(0, 1)`` has each thread take column
panels rather than rows, and ``tile(0, 16) upcast(1, n)`` tiles a product with fewer than 16 columns
transposed: vectors along axis 0, one register row per output column.

A sum of ``where(condition, term, -0.0)`` with rank >= 3 (a convolution over its lhs's padding, see
``lower/conv.py``) skips the terms the condition excludes: a bound on one reduction loop by the outer
rows narrows that loop per outer row, a bound by the tile's row unrolls that loop and leaves out the
excluded terms of the edge row tiles, rendered at their static positions; the rest is tested per term.

A long float sum keeps its two-level order (``render_loops.partial_sum_split``): the registers hold
the partial over the trailing loops, folded into a total tile in memory once per outer iteration.

The loops around the register tile are written on vectors too where their expressions allow it: the
epilogue (``acc`` plus float32 loads along the columns, arithmetic, comparisons, selects), a computed
row factor's packing and a packed operand contiguous along the columns, each with a masked last
vector. A tile with nothing left for LLVM's loop vectoriser or LICM (``explicitly_vectorised``)
compiles with SROA alone (``cpu_compiler.PIPELINES[5]``), to the same bits as the scalar loops under
pipeline 4's vectoriser.
"""

from __future__ import annotations

import itertools

import attrs
import numpy as np

from funcgrad.lower.kernel import (
    BOOL,
    COMPARISONS,
    INDEX,
    Kernel,
    KExpr,
    Opt,
    _affine,
    alu,
    const,
    flat_index,
    var,
    with_args,
)
from funcgrad.lower.render_loops import FLOAT_OPS, _FunctionBuilder, _store_outputs, render_const, substitute

__all__ = ["tile_opts", "tile_candidates", "check_tile_opts", "render_tile", "explicitly_vectorised", "LANES"]

FLOAT32 = np.dtype(np.float32)
LANES = 16  # float32 lanes in one 512-bit register
CHUNK_ROWS = 96  # rows of the shared operand's other side kept in L2 while the column panels pass
BLOCK_TERMS = 256  # reduction terms per block: a block of both operands stays in L1/L2
TILE_MIN_WORK = 1 << 19  # multiply-adds below which the plain loops are as fast (and compile faster)
# ... for a one-row sum (a bias gradient's sum over the batch), whose tile compiles with SROA only
# (pipeline 5): a fraction of the i-k-j loops' LLVM time at O3, and as fast (docs/performance.md)
ONE_ROW_MIN_WORK = 1 << 16
MIN_COLUMNS = 8  # narrower rows (a 10-class output layer) run as one masked vector from 8 columns on
MIN_TERMS = 64  # shorter sums spend more on the tile's buffer and epilogue than they gain
MIN_PACKED_TERMS = 8  # ... except against a transposed operand's strided scalar loops, which are far slower
SMALL_TILE_WORK = 1 << 22  # multiply-adds below which a tile runs on one thread (too short to hand off)
LARGE_ROWS, LARGE_BYTES = 1024, 1 << 22  # products whose contiguous column operand is packed too (_large)
LARGE_CHUNK_ROWS = 512  # their rows per chunk
PACK_ROWS = 256  # a contiguous column operand read by this many rows is packed (_packs_contiguous)
PACK_MIN_BYTES = 1 << 16  # ... when it is larger than L1 (a smaller one stays there unpacked)
CONFLICT_STRIDE = 1024  # bytes: rows a multiple of this apart put a 64-column panel on <= 16 of L1's 64 sets
PACKED_BLOCK_TERMS = 128  # a packed panel's block: 128 terms x 64 columns (32 KB) stays in L1
ROW_PACK_BYTES = 1 << 18  # a chunk's computed row factor (all its terms) packed on the stack at most
PACKED_CHUNK_ROWS = 384  # a packed panel is built once per chunk of rows: longer chunks pay for it less often
# column-varying operations the tile renders (max/min propagate NaN, as the scalar renderer's)
VECTOR_OPS = {"add": "fadd {t} {x}, {y}", "sub": "fsub {t} {x}, {y}", "mul": "fmul {t} {x}, {y}",
              "max": "call {t} @llvm.maximum.v16f32({t} {x}, {t} {y})",
              "min": "call {t} @llvm.minimum.v16f32({t} {x}, {t} {y})"}
# further float32 operations an epilogue renders on vectors (``_Tile.operand``), as the scalar renderer does
EPILOGUE_OPS = {"div": "fdiv {t} {x}, {y}", "abs": "call {t} @llvm.fabs.v16f32({t} {x})",
                "sqrt": "call {t} @llvm.sqrt.v16f32({t} {x})"}
ROW, COLUMN, OUTER = "m", "c", "o"  # the tile's loop variables: row, column, outer row
# first column of a packed panel, first term of a reduction block, first row of a chunk
PANEL, BLOCK, CHUNK = "tpanel", "tblock", "tchunk0"
# (columns, rows) of the register tile, widest first; each keeps 24-28 of the 32 vector registers as
# accumulators (the wide ones first: they measured faster than 14 x 32, docs/performance.md)
TILES = ((64, 6), (48, 8), (32, 14), (16, 16))  # the tile's loop variables: flattened row, column
VECTOR = f"<{LANES} x float>"
DECLARATIONS = {  # the vector intrinsics the tile uses, each added to the module when first used
    "fmuladd": f"declare {VECTOR} @llvm.fmuladd.v{LANES}f32({VECTOR}, {VECTOR}, {VECTOR})",
    "masked.load": f"declare {VECTOR} @llvm.masked.load.v{LANES}f32.p0(ptr, i32 immarg, <{LANES} x i1>, {VECTOR})",
    "masked.store": f"declare void @llvm.masked.store.v{LANES}f32.p0({VECTOR}, ptr, i32 immarg, <{LANES} x i1>)",
    "abs": f"declare {VECTOR} @llvm.fabs.v{LANES}f32({VECTOR})",
    "sqrt": f"declare {VECTOR} @llvm.sqrt.v{LANES}f32({VECTOR})",
    "max": f"declare {VECTOR} @llvm.maximum.v{LANES}f32({VECTOR}, {VECTOR})",
    "min": f"declare {VECTOR} @llvm.minimum.v{LANES}f32({VECTOR}, {VECTOR})"}


def _depends(e: KExpr, name: str, memo: dict[KExpr, bool]) -> bool:
    if e not in memo:
        memo[e] = (e.op == "var" and e.arg == name) or any(_depends(a, name, memo) for a in e.args)
    return memo[e]


def _nodes(e: KExpr) -> list[KExpr]:
    """``e`` and every node below it, depth first (shared nodes once)."""
    seen: dict[KExpr, None] = {}
    stack = [e]
    while stack:
        node = stack.pop()
        if node not in seen:
            seen[node] = None
            stack.extend(reversed(node.args))
    return list(seen)


def _vectorisable(e: KExpr, column: str, memo: dict[KExpr, bool]) -> bool:
    """Every column-varying node is a float32 add/sub/mul/neg or a load contiguous along the columns."""
    if not _depends(e, column, memo):
        return True  # computed once per row as a scalar, then broadcast
    if e.dtype != FLOAT32:
        return False
    if e.op == "load":
        terms = _affine(e.args[0])
        return terms is not None and terms.get(var(column)) == 1 and not any(
            atom is not None and atom != var(column) and _depends(atom, column, memo) for atom in terms)
    if e.op in VECTOR_OPS or e.op == "neg":
        return all(_vectorisable(a, column, memo) for a in e.args)
    return False


def _varies(e: KExpr, column: str, memo: dict[KExpr, bool]) -> bool:
    """Whether ``e`` moves with the columns or reads the reduction's result (``acc``)."""
    if e not in memo:
        memo[e] = e.op == "acc" or (e.op == "var" and e.arg == column) or any(_varies(a, column, memo) for a in e.args)
    return memo[e]


def _vector_expression(e: KExpr, column: str, memo: dict[KExpr, bool]) -> bool:
    """Whether ``_Tile.operand`` renders ``e`` at 16 consecutive columns: values that do not vary
    (float32 or bool, broadcast), ``acc``, float32 loads contiguous along the columns, and float32
    arithmetic, comparisons and selects of such values."""
    if not _varies(e, column, memo):
        return e.dtype in (FLOAT32, BOOL)
    if e.op == "acc":
        return e.dtype == FLOAT32
    if e.op == "load":
        return _vectorisable(e, column, {})
    if e.op == "where":
        return e.dtype == FLOAT32 and e.args[0].dtype == BOOL and all(
            _vector_expression(a, column, memo) for a in e.args)
    if e.op in COMPARISONS:
        return e.dtype == BOOL and all(a.dtype == FLOAT32 and _vector_expression(a, column, memo) for a in e.args)
    if e.op in VECTOR_OPS or e.op in EPILOGUE_OPS or e.op == "neg":
        return e.dtype == FLOAT32 and all(a.dtype == FLOAT32 and _vector_expression(a, column, memo) for a in e.args)
    return False


def declare(b: _FunctionBuilder, name: str) -> None:
    """Add the declaration of vector intrinsic ``name`` (a key of ``DECLARATIONS``) to ``b``'s module."""
    if name in DECLARATIONS:
        b.helpers.setdefault(f"declare.{name}", DECLARATIONS[name])


def lane_mask(b: _FunctionBuilder, count: str) -> str:
    """A ``<16 x i1>`` mask of the lanes below ``count`` (a constant or an i64 value)."""
    lanes = ", ".join(f"i64 {lane}" for lane in range(LANES))
    if count.lstrip("-").isdigit():
        return b.instantiate(f"{{out}} = icmp slt <{LANES} x i64> <{lanes}>, splat (i64 {count})")
    one = b.instantiate(f"{{out}} = insertelement <{LANES} x i64> poison, i64 {count}, i64 0")
    splat = b.instantiate(f"{{out}} = shufflevector <{LANES} x i64> {one}, <{LANES} x i64> poison, "
                          f"<{LANES} x i32> zeroinitializer")
    return b.instantiate(f"{{out}} = icmp slt <{LANES} x i64> <{lanes}>, {splat}")


def store_vector(b: _FunctionBuilder, value: str, pointer: str, mask: str | None) -> None:
    """Store a float vector at ``pointer``, only its ``mask`` lanes when there is one."""
    if mask is None:
        b.emit(f"store {VECTOR} {value}, ptr {pointer}, align 4")
    else:
        declare(b, "masked.store")  # (called with its function type: render_llvm declares other void calls)
        b.emit(f"call void ({VECTOR}, ptr, i32, <{LANES} x i1>) @llvm.masked.store.v{LANES}f32.p0("
               f"{VECTOR} {value}, ptr {pointer}, i32 4, <{LANES} x i1> {mask})")


def vector_operand(b: _FunctionBuilder, e: KExpr, column: str, mask: str | None,
                   cache: dict[tuple[KExpr, bool], str], broadcasts: dict[str, str],
                   acc_vector: str | None = None) -> str:
    """``e`` (``_vector_expression(e, column, ...)``) at 16 consecutive values of loop variable
    ``column``: a vector value; loads are ``mask``ed when it is given. A value that does not move with
    ``column`` is computed as a scalar by ``b`` and broadcast once (``broadcasts``); ``cache`` holds
    the vectors computed in the current block. ``acc_vector`` stands for ``acc``."""
    def operand(a: KExpr) -> str:
        return vector_operand(b, a, column, mask, cache, broadcasts, acc_vector)

    if e.op == "acc":
        assert acc_vector is not None
        return acc_vector
    if not _varies(e, column, {}):
        scalar = b.value(e)
        if scalar not in broadcasts:
            kind = "float" if e.dtype == FLOAT32 else "i1"
            one = b.instantiate(f"{{out}} = insertelement <{LANES} x {kind}> poison, {kind} {{x}}, i64 0", x=scalar)
            broadcasts[scalar] = b.instantiate(f"{{out}} = shufflevector <{LANES} x {kind}> {{x}}, <{LANES} x "
                                               f"{kind}> poison, <{LANES} x i32> zeroinitializer", x=one)
        return broadcasts[scalar]
    key = (e, mask is not None)
    if key in cache:
        return cache[key]
    if e.op == "load":
        pointer = b.instantiate("{out} = getelementptr inbounds float, ptr %in{n}, i64 {i}", n=e.arg,
                                i=b.value(e.args[0]))
        if mask is None:
            out = b.instantiate("{out} = load " + VECTOR + ", ptr {p}, align 4", p=pointer)
        else:
            declare(b, "masked.load")
            out = b.instantiate(f"{{out}} = call {VECTOR} @llvm.masked.load.v{LANES}f32.p0(ptr {pointer}, "
                                f"i32 4, <{LANES} x i1> {mask}, {VECTOR} zeroinitializer)")
    elif e.op == "neg":
        out = b.instantiate("{out} = fneg " + VECTOR + " {x}", x=operand(e.args[0]))
    elif e.op == "where":
        c, x, y = (operand(a) for a in e.args)
        out = b.instantiate(f"{{out}} = select <{LANES} x i1> {c}, {VECTOR} {x}, {VECTOR} {y}")
    elif e.op in COMPARISONS or e.op in EPILOGUE_OPS:
        operands = [operand(a) for a in e.args]
        declare(b, e.op)
        template = FLOAT_OPS[e.op] if e.op in COMPARISONS else "{out} = " + EPILOGUE_OPS[e.op]
        out = b.instantiate(template, t=VECTOR, x=operands[0], y=operands[-1])
    else:
        x, y = (operand(a) for a in e.args)
        declare(b, e.op)
        out = b.instantiate("{out} = " + VECTOR_OPS[e.op].format(t=VECTOR, x=x, y=y))
    cache[key] = out
    return out


def tile_opts(kernel: Kernel) -> tuple[Opt, ...] | None:
    """The tile actions for ``kernel`` (``tile`` on the last axis: its width in columns; ``upcast``
    on the rows: the tile's height), or None when the kernel is not a float32 product-like sum or is
    too small to gain from it. A 2-D product with 8-15 columns gets the transposed tile (``tile(0, 16)
    upcast(1, n)``); one under ``SMALL_TILE_WORK`` ``thread(0, 1)``; a large packed one a long chunk
    (``tile(0, rows)``), a strided packed one ``swap(0, 1)`` (threads take column panels)."""
    work = int(np.prod(kernel.shape)) * int(np.prod(kernel.reduce_shape))
    if _transposable(kernel) and work >= TILE_MIN_WORK and kernel.reduce_shape[0] >= MIN_PACKED_TERMS:
        # one vector along axis 0 by one register row per output column (faster than a 32-row tile and
        # than the untransposed loops on the MLP's 10-wide products: docs/performance.md)
        opts: tuple[Opt, ...] = (Opt("tile", 0, LANES), Opt("upcast", 1, kernel.shape[1]))
        return (*opts, Opt("thread", 0, 1)) if work < SMALL_TILE_WORK else opts
    if not _tileable(kernel):
        return None
    columns = kernel.shape[-1]
    if columns < MIN_COLUMNS or work < (ONE_ROW_MIN_WORK if len(kernel.shape) == 1 else TILE_MIN_WORK):
        return None
    if int(np.prod(kernel.reduce_shape)) < (MIN_PACKED_TERMS if _packable(kernel) else MIN_TERMS):
        return None
    width, height = next((w, h) for w, h in TILES if columns >= w or w == LANES)  # 8..15 columns: one masked vector
    if len(kernel.shape) == 1:  # one row (a sum over a batch, per feature): one thread runs it
        return (Opt("tile", 0, width), Opt("thread", 0, 1))
    if len(kernel.shape) == 2 and kernel.shape[0] <= LANES and kernel.shape[0] % height:  # 10 rows: one tile of
        width = next(w for w, h in TILES if h >= kernel.shape[0])  # them all, not 6 and 4 single rows
        height = kernel.shape[0]
    if len(kernel.shape) >= 3:  # the row axis in equal blocks (20 rows: 2 x 10, not 14 + 6)
        blocks = -(-kernel.shape[-2] // height)
        height = -(-kernel.shape[-2] // blocks)
    opts = (Opt("tile", len(kernel.shape) - 1, width), Opt("upcast", len(kernel.shape) - 2, height))
    if work < SMALL_TILE_WORK:  # waking a worker costs more than half of such a kernel saves
        return (*opts, Opt("thread", 0, 1))
    if len(kernel.shape) == 2 and _packable(kernel):
        if _large(kernel):  # long chunks amortise the packing
            opts = (*opts, Opt("tile", 0, height * -(-LARGE_CHUNK_ROWS // height)))
        elif -(-columns // width) >= 4 and not _packs_contiguous(kernel):
            opts = (*opts, Opt("swap", 0, 1))  # threads take column panels: each packs only its own strided panels
    return opts


def tile_candidates(kernel: Kernel) -> list[tuple[Opt, ...]]:
    """Tile shapes worth timing for ``kernel`` (for BEAM): every fitting shape of ``TILES``, each with
    the default and a longer reduction block."""
    if tile_opts(kernel) is None:
        return []
    last, rows = len(kernel.shape) - 1, len(kernel.shape) - 2
    inner = int(np.prod(kernel.reduce_shape[1:]))
    out: list[tuple[Opt, ...]] = []
    for width, height in TILES:
        if width <= max(kernel.shape[-1], LANES) + LANES:
            for terms in (BLOCK_TERMS, 4 * BLOCK_TERMS):
                out.append((Opt("tile", last, width), Opt("upcast", rows, height),
                            Opt("split", 0, max(1, terms // max(1, inner)))))
    return out


def check_tile_opts(kernel: Kernel, opts: tuple[Opt, ...]) -> None:
    """Raise ValueError unless ``opts`` describe a tile this kernel can run."""
    if _swapped(attrs.evolve(kernel, opts=opts)):
        if not _transposed_tileable(kernel):
            raise ValueError(f"kernel {kernel.name} cannot be register-tiled transposed (upcast(1, n)): it is not a "
                             f"2-D float32 sum over one loop whose operands are contiguous along, constant over or "
                             f"packable along its axis 0")
    elif not _tileable(kernel):
        raise ValueError(f"kernel {kernel.name} cannot be register-tiled: it is not a float32 sum whose operands "
                         f"are contiguous along, or constant over, its last axis")
    tile_shape(attrs.evolve(kernel, opts=opts))
    for opt in opts:
        if opt.action == "pad":
            raise ValueError("the register tile masks its last columns itself: it takes no pad action")
        if opt.action == "swap" and (len(kernel.shape) != 2 or (opt.axis, opt.amount) != (0, 1)):
            raise ValueError(f"kernel {kernel.name}: swap(0, 1) on a tile has threads split the columns of a 2-D "
                             f"kernel, not its rows; got {opt} on a kernel of shape {kernel.shape}")
        if opt.action in ("reorder", "unroll", "vectorize"):
            raise ValueError(f"a register-tiled kernel takes no {opt.action} action (its loops are its own)")


def _float_sum(kernel: Kernel) -> bool:
    return (kernel.reduce_op == "sum" and kernel.reduce_expr is not None and len(kernel.shape) >= 1
            and bool(kernel.reduce_shape) and kernel.reduce_expr.dtype == FLOAT32)


def _tileable(kernel: Kernel) -> bool:
    # a sum that does not move with the columns is one value per row (a row statistic fused into its
    # row's pass, see schedule.py): render_llvm computes it once per row, the tile would per column
    column = f"g{len(kernel.shape) - 1}"
    if not _float_sum(kernel) or kernel.reduce_expr is None:
        return False
    guard = _guard(kernel.reduce_expr)
    if guard is not None:  # a term counted where a condition holds (a convolution's padding): rank >= 3 only
        conditions, term = guard
        return len(kernel.shape) >= 3 and not any(_depends(c, column, {}) for c in conditions) and \
            _depends(term, column, {}) and _vectorisable(term, column, {})
    return _depends(kernel.reduce_expr, column, {}) and (
        _vectorisable(kernel.reduce_expr, column, {}) or _packable(kernel))


# --- guarded terms: sum(where(condition, term, -0.0)), a convolution over its lhs's padding ---------------
# (lower/conv.py). The condition's parts that bound one reduction loop are not tested per term: a bound
# by the outer rows alone narrows that loop once per outer row (a padded image's top and bottom rows); a
# bound by the tile's row and a reduction loop (its left and right columns) unrolls that loop and leaves
# out the terms it excludes, statically, in the row tiles at the edges. Anything else is tested per term.

MAX_UNROLLED_TAPS = 32  # reduction terms unrolled per step at most (a 5 x 5 window's row of 5)


def _guard(e: KExpr) -> tuple[list[KExpr], KExpr] | None:
    """(conjuncts of the condition, the term) when ``e`` is ``where(condition, term, -0.0)``: -0.0 is
    the sum's identity, so a term left out where the condition fails gives the same bits."""
    if e.op != "where" or e.dtype != FLOAT32:
        return None
    identity = e.args[2]
    if identity.op != "const" or identity.arg != 0 or not np.signbit(identity.arg):
        return None
    return _conjuncts(e.args[0]), e.args[1]


def _conjuncts(c: KExpr) -> list[KExpr]:
    """The parts of a bool condition joined by ``and`` (``where(a, b, False)`` is ``a and b``)."""
    if c.op == "const" and c.arg is True:
        return []
    if c.op == "and" and c.dtype == np.bool_:
        return _conjuncts(c.args[0]) + _conjuncts(c.args[1])
    if c.op == "where" and c.dtype == np.bool_ and c.args[2].op == "const" and c.args[2].arg is False:
        return _conjuncts(c.args[0]) + _conjuncts(c.args[1])
    return [c]


@attrs.frozen
class _Bound:
    """``low <= coefficient * r<depth> + row * ROW + rest < high`` (either end may be None); ``rest``
    varies with the outer rows only (no ``ROW`` term) or is a constant (a ``row`` term)."""

    depth: int
    coefficient: int
    row: int
    rest: KExpr
    low: int | None
    high: int | None

    def holds(self, row: int, tap: int) -> bool:
        """Whether the condition holds at tile row ``row`` and reduction index ``tap`` (``rest`` constant)."""
        value = self.coefficient * tap + self.row * row + int(self.rest.arg)
        return (self.low is None or value >= self.low) and (self.high is None or value < self.high)


_FLIPPED = {"ge": "le", "gt": "lt", "lt": "gt", "le": "ge"}


def _bound(atom: KExpr, depths: int) -> _Bound | None:
    """``atom`` as a bound on one reduction loop, if it is ``t >= c``, ``t > c``, ``t < c`` or ``t <= c``
    with ``t`` affine in one reduction variable and either the outer rows or the tile's row."""
    if atom.op not in _FLIPPED or len(atom.args) != 2:
        return None
    x, y = atom.args
    op = atom.op
    if x.op == "const" and y.op != "const":
        x, y, op = y, x, _FLIPPED[op]
    terms = _affine(x)
    if y.op != "const" or y.dtype != INDEX or terms is None:
        return None
    names = {f"r{depth}" for depth in range(depths)}
    reductions = [(int(key.arg[1:]), coefficient) for key, coefficient in terms.items()
                  if key is not None and coefficient and key.op == "var" and key.arg in names]
    others = [(key, coefficient) for key, coefficient in terms.items() if key is not None and coefficient
              and key != var(ROW) and not (key.op == "var" and key.arg in names)]
    if len(reductions) != 1 or any(_depends(key, name, {}) for key, _ in others for name in (ROW, COLUMN, *names)):
        return None
    row = terms.get(var(ROW), 0)
    if row and others:  # both the tile's row and the outer rows: tested per term
        return None
    rest = const(terms.get(None, 0), INDEX)
    for key, coefficient in others:
        rest = alu("add", rest, alu("mul", key, const(coefficient, INDEX)))
    depth, coefficient = reductions[0]
    bound = int(y.arg) + (op in ("gt", "le"))
    low, high = (bound, None) if op in ("ge", "gt") else (None, bound)
    return _Bound(depth, coefficient, row, rest, low, high)


def _strip(e: KExpr, known: set[KExpr], memo: dict[KExpr, KExpr]) -> KExpr:
    """``e`` with every ``where`` whose condition's parts are all in ``known`` (true) replaced by its
    first branch (the lhs's own padding test and its guarded load index)."""
    if e in memo:
        return memo[e]
    out = e
    if e.op == "where" and all(part in known for part in _conjuncts(e.args[0])):
        out = _strip(e.args[1], known, memo)
    elif e.args:
        args = tuple(_strip(a, known, memo) for a in e.args)
        out = with_args(e, args)
    memo[e] = out
    return out


def _split_product(e: KExpr, column: str, row: str) -> tuple[KExpr, KExpr] | None:
    """``e`` as (row factor, column factor) when it is a float32 product of a factor that does not
    move with the columns and one that moves with the columns but not with the rows."""
    if e.op != "mul" or e.dtype != FLOAT32:
        return None
    for x, y in (e.args, e.args[::-1]):
        memo: dict[KExpr, bool] = {}
        if not _depends(x, column, memo) and _depends(y, column, memo) and not _depends(y, row, {}):
            return x, y
    return None


def _packable(kernel: Kernel) -> bool:
    """A 2-D float32 sum over one loop of (row factor) x (column factor) whose column factor the tile
    cannot read as vectors (a transposed operand): it is packed per panel (see the module docstring)."""
    if not _float_sum(kernel) or len(kernel.shape) != 2 or len(kernel.reduce_shape) != 1:
        return False
    assert kernel.reduce_expr is not None
    column, row = _axes(kernel)
    if _vectorisable(kernel.reduce_expr, column, {}) and (_swapped(kernel) or not _packs_contiguous(kernel)):
        return False
    return _split_product(kernel.reduce_expr, column, row) is not None


def _swapped(kernel: Kernel) -> bool:
    """Whether the kernel's tile runs transposed: vectors along axis 0 (``upcast(1, rows)`` on a 2-D kernel)."""
    return len(kernel.shape) == 2 and any(opt.action == "upcast" and opt.axis == 1 for opt in kernel.opts or ())


def _axes(kernel: Kernel) -> tuple[str, str]:
    """The loop variables of the tile's (columns, rows)."""
    if _swapped(kernel):
        return "g0", "g1"
    return f"g{len(kernel.shape) - 1}", f"g{len(kernel.shape) - 2}"


def _one_load(e: KExpr, column: str) -> KExpr | None:
    """The one column-varying load of ``e`` when ``e`` is add/sub/mul/max/min/neg of it and of values
    that do not move with the columns (so a vector of it gives a vector of ``e``), else None."""
    memo: dict[KExpr, bool] = {}
    loads: set[KExpr] = set()
    stack = [e]
    while stack:  # the column-varying nodes above the loads
        node = stack.pop()
        if not _depends(node, column, memo):
            continue
        if node.op == "load":
            loads.add(node)
        elif node.dtype == FLOAT32 and (node.op in VECTOR_OPS or node.op == "neg"):
            stack.extend(node.args)
        else:
            return None
    return next(iter(loads)) if len(loads) == 1 else None


def _transposed_tileable(kernel: Kernel) -> bool:
    """A 2-D float32 sum over one loop that moves with axis 0 and whose operands are contiguous along
    it, constant over it, or a factor that can be packed (what a transposed tile can run)."""
    if not _float_sum(kernel) or len(kernel.shape) != 2 or len(kernel.reduce_shape) != 1:
        return False
    assert kernel.reduce_expr is not None
    return _depends(kernel.reduce_expr, "g0", {}) and (
        _vectorisable(kernel.reduce_expr, "g0", {}) or _split_product(kernel.reduce_expr, "g0", "g1") is not None)


def _transposable(kernel: Kernel) -> bool:
    """A 2-D product with fewer than 16 columns and many rows (the 10-class layer's ``relu(H).T @ dZ``,
    ``relu(H) @ W``): it tiles transposed, vectors along axis 0 and a register row per column, so a
    broadcast feeds several vectors instead of one mostly masked one."""
    if not _transposed_tileable(kernel) or not MIN_COLUMNS <= kernel.shape[1] < LANES or kernel.shape[0] < 4 * LANES:
        return False
    assert kernel.reduce_expr is not None
    if _vectorisable(kernel.reduce_expr, "g0", {}):
        return True
    return _column_stride(kernel, "g0", "g1") == 1  # packed in transposed 16 x 16 blocks


def _computed_rows(kernel: Kernel) -> bool:
    """A 2-D product over one loop whose row factor is computed (not one load) and moves with the
    terms: the tile packs it per chunk of rows (``_Tile.row_packing``)."""
    if not _float_sum(kernel) or len(kernel.shape) != 2 or len(kernel.reduce_shape) != 1 or _swapped(kernel):
        return False
    assert kernel.reduce_expr is not None
    split = _split_product(kernel.reduce_expr, "g1", "g0")
    return split is not None and split[0].op != "load" and _depends(split[0], "r0", {})


def _large(kernel: Kernel) -> bool:
    """A 2-D product whose column operand (terms x columns) is far beyond L2 and whose rows are many:
    its column panels are packed even when contiguous, in long chunks of rows (``LARGE_CHUNK_ROWS``;
    a 2048 product runs faster: docs/performance.md)."""
    return kernel.shape[0] >= LARGE_ROWS and kernel.shape[1] * kernel.reduce_shape[0] * FLOAT32.itemsize >= LARGE_BYTES


def _packs_contiguous(kernel: Kernel) -> bool:
    """A 2-D product whose contiguous column operand is packed anyway, per panel and block: a large one
    (``_large``), one read by enough rows to pay for the copy (``PACK_ROWS``), or one whose rows lie a
    multiple of ``CONFLICT_STRIDE`` bytes apart, so that a panel's block falls on a quarter of L1's
    sets or fewer and misses L1 at every step, however few the rows (a 512-wide weight: 1.3-1.7x
    faster packed, docs/performance.md). Not one that fits in L1, or of fewer rows than a vector."""
    if len(kernel.shape) != 2 or len(kernel.reduce_shape) != 1 or kernel.reduce_expr is None \
            or not _vectorisable(kernel.reduce_expr, f"g{len(kernel.shape) - 1}", {}):
        return False  # not a product of one loop, or a strided operand (packed anyway)
    if _large(kernel):
        return True
    operand = kernel.shape[1] * kernel.reduce_shape[0] * FLOAT32.itemsize
    if operand < PACK_MIN_BYTES or kernel.shape[0] < LANES:
        return False
    if kernel.shape[0] >= PACK_ROWS:
        return True
    stride = _column_stride(kernel, f"g{len(kernel.shape) - 1}", f"g{len(kernel.shape) - 2}")
    return stride is not None and stride * FLOAT32.itemsize % CONFLICT_STRIDE == 0


def _column_stride(kernel: Kernel, column: str, row: str) -> int | None:
    """Elements between consecutive reduction terms of the column factor's one load (the factor moving
    with ``column``, not ``row``), when it has one."""
    assert kernel.reduce_expr is not None
    split = _split_product(kernel.reduce_expr, column, row)
    load = _one_load(split[1], column) if split is not None else None
    terms = _affine(load.args[0]) if load is not None else None
    stride = terms.get(var("r0")) if terms is not None else None
    return stride if isinstance(stride, int) and stride > 0 else None


def _replace(e: KExpr, table: dict[str, KExpr], memo: dict[KExpr, KExpr]) -> KExpr:
    """``e`` with the loop variables named in ``table`` replaced by expressions."""
    if e in memo:
        return memo[e]
    if e.op == "var" and e.arg in table:
        out = table[e.arg]
    else:
        args = tuple(_replace(a, table, memo) for a in e.args)
        out = with_args(e, args)
    memo[e] = out
    return out


def tile_shape(kernel: Kernel) -> tuple[int, int, int, int]:
    """(columns, rows, chunk rows, reduction block) of the kernel's tile from its actions: ``tile`` on
    the last axis (columns, a multiple of 16; axis 0 for a transposed tile, ``upcast(1, n)``),
    ``upcast`` (rows in registers), ``tile`` on the other axis
    (rows per cache chunk, default about 96) and ``split`` of reduction loop 0 (its block length,
    default about 256 terms per block)."""
    last = 0 if _swapped(kernel) else len(kernel.shape) - 1  # the axis along the vectors
    width = height = chunk = block = 0
    for opt in kernel.opts or ():
        if opt.action == "tile" and opt.axis == last:
            width = opt.amount
        elif opt.action == "tile":
            chunk = opt.amount
        elif opt.action == "upcast":
            height = opt.amount
        elif opt.action == "split" and opt.axis == 0:
            block = opt.amount
    if len(kernel.shape) == 1:
        height = 1
        if any(opt.action == "thread" and opt.amount != 1 for opt in kernel.opts or ()):
            raise ValueError(f"kernel {kernel.name}: a one-row tile runs on one thread (thread(0, 1))")
    if width <= 0 or width % LANES or height <= 0:
        raise ValueError(f"kernel {kernel.name}: a tile needs a width that is a multiple of {LANES} and a "
                         f"height (tile and upcast actions), got {width} x {height}")
    inner = int(np.prod(kernel.reduce_shape[1:]))
    rows = PACKED_CHUNK_ROWS if _packable(kernel) else CHUNK_ROWS
    if _computed_rows(kernel):  # the packed row factor of a default chunk fits ROW_PACK_BYTES
        rows = min(rows, max(height, ROW_PACK_BYTES // (kernel.reduce_shape[0] * FLOAT32.itemsize) // height * height))
    chunk = chunk if chunk > 0 else height * -(-rows // height)
    block = block if block > 0 else PACKED_BLOCK_TERMS if _packable(kernel) else max(1, BLOCK_TERMS // max(1, inner))
    return width, height, max(chunk, height), block


class _Tile:
    """Renders one kernel's tiled loops into a function builder."""

    # write a lean tile's epilogue and packing on vectors (``lean``; False: scalar loops for LLVM's loop
    # vectoriser, as every other tile has them; the tests compare the two bit for bit)
    explicit_vectors = True

    def __init__(self, builder: _FunctionBuilder, kernel: Kernel) -> None:
        self.b = builder
        self.kernel = kernel
        self.width, self.height, self.chunk, self.block = tile_shape(kernel)
        # transposed (vectors along axis 0): the launch's share of axis 0 is a share of the columns
        self.swapped = _swapped(kernel)
        self.columns = kernel.shape[0] if self.swapped else kernel.shape[-1]
        self.row_count = kernel.shape[1] if self.swapped else int(np.prod(kernel.shape[:-1]))
        self.split_columns = self.swapped or len(kernel.shape) == 2 and any(
            opt.action == "swap" and (opt.axis, opt.amount) == (0, 1) for opt in kernel.opts or ())
        # 2-D kernels tile their rows (split across threads) with a remainder of single rows; higher
        # ranks loop over the outer rows (every axis before the last two) and tile the row axis whole,
        # a remainder block of rows included, so a row's address is the tile's plus a constant
        self.nested = len(kernel.shape) >= 3
        self.row_extent = kernel.shape[-2] if len(kernel.shape) >= 2 else 1
        column_axis, row_axis = _axes(kernel)
        table: dict[str, KExpr] = {column_axis: var(COLUMN), row_axis: var(ROW)}
        stride = 1
        for axis in reversed(range(len(kernel.shape) - 2)):
            index = alu("div", var(OUTER), const(stride, INDEX)) if stride > 1 else var(OUTER)
            if axis > 0:
                index = alu("rem", index, const(kernel.shape[axis], INDEX))
            table[f"g{axis}"] = index
            stride *= kernel.shape[axis]
        if self.nested:
            self.chunk = self.row_extent
        else:  # a chunk never holds more rows than the kernel has (its stack buffers are sized by it)
            self.chunk = min(self.chunk, self.row_count)
        memo: dict[KExpr, KExpr] = {}
        assert kernel.reduce_expr is not None
        self.reduce_expr = _replace(kernel.reduce_expr, table, memo)
        self.outer_bounds: dict[int, list[_Bound]] = {}  # reduction depth -> its bounds by the outer rows
        self.row_bounds: list[_Bound] = []  # bounds by the tile's row (static per row tile)
        self.unroll_from = len(kernel.reduce_shape)  # reduction loops from this depth on are unrolled
        self.residual: KExpr | None = None  # the rest of a guard's condition, tested per term
        self.tap_ranges: dict[int, tuple[str, str]] = {}  # reduction depth -> [start, end) for this outer row
        guard = _guard(self.reduce_expr)
        if guard is not None:
            self.reduce_expr = self.guarded(*guard)
        self.packed = _split_product(self.reduce_expr, COLUMN, ROW) if _packable(kernel) else None
        self.row_pack = self.row_packing()
        self.one_block = self.block >= kernel.reduce_shape[0]  # the whole first reduction loop in one block
        self.outputs = tuple(_replace(e, table, memo) for e in kernel.outputs)
        # the epilogue can run on vectors when every output is a float32 computed from vectorisable
        # values (a bias, an activation's mask); a computed row factor's packing when it runs along its
        # layout; a packed column factor when it runs along the columns (pack_columns) or along the
        # terms (16 x 16 transposes; blocks under 16 terms pack a few values one at a time)
        varies: dict[KExpr, bool] = {}
        self.vector_epilogue = not self.swapped and all(
            aval.dtype == FLOAT32 and _vector_expression(e, COLUMN, varies)
            for e, aval in zip(self.outputs, kernel.out_avals))
        self.vector_rows = self.row_pack is not None and _vectorisable(self.row_pack_vectors()[0], COLUMN, {})
        vector_pack = self.packed is None or _vectorisable(self.packed[1], COLUMN, {}) or \
            self.terms_contiguous(self.packed[1])
        # ... and they do when that leaves nothing for LLVM's loop passes (pipeline 5); other tiles keep
        # the scalar loops pipeline 3 or 4 vectorises
        self.lean = self.explicit_vectors and self.leaves_nothing_to_llvm(vector_pack)
        self.vector_epilogue = self.vector_epilogue and self.lean
        self.vector_rows = self.vector_rows and self.lean
        self.acc_vector: str | None = None
        self.allocas: list[str] = []
        self.count = 0
        identity = render_const(-0.0, FLOAT32)  # a non-empty sum starts at -0.0, as render_llvm's
        self.zero = "<" + ", ".join([f"float {identity}"] * LANES) + ">"
        self.vector = VECTOR

    def guarded(self, conditions: list[KExpr], term: KExpr) -> KExpr:
        """Sort a guard's conditions into bounds on the reduction loops and a residual test; return the
        term with the lhs's own tests of the bounded conditions taken out (they hold wherever it runs)."""
        shape = self.kernel.reduce_shape
        parsed = [(c, _bound(c, len(shape)) if self.nested else None) for c in conditions]
        by_row = [bound for _, bound in parsed if bound is not None and bound.row]
        first = min((bound.depth for bound in by_row), default=len(shape))
        if by_row and first > 0 and int(np.prod(shape[first:])) <= MAX_UNROLLED_TAPS:
            self.unroll_from = first
        known: set[KExpr] = set()
        residual: list[KExpr] = []
        for condition, bound in parsed:
            if bound is not None and bound.row and self.unroll_from < len(shape):
                self.row_bounds.append(bound)
            elif bound is not None and not bound.row and 0 < bound.depth < self.unroll_from and bound.coefficient > 0:
                self.outer_bounds.setdefault(bound.depth, []).append(bound)
            else:
                residual.append(condition)
                continue
            known.add(condition)
        for condition in residual:
            self.residual = condition if self.residual is None else alu("and", self.residual, condition)
        return _strip(term, known, {})

    def loop_ranges(self) -> None:
        """[start, end) of each reduction loop bounded by the outer rows, for the current outer row:
        ``low <= c * r + rest < high`` gives ``ceil((low - rest) / c) <= r < ceil((high - rest) / c)``."""
        zero = const(0, INDEX)

        def ceil_over(x: KExpr, coefficient: int) -> KExpr:  # ceil(max(x, 0) / coefficient)
            x = alu("max", x, zero)
            if coefficient == 1:
                return x
            return alu("div", alu("add", x, const(coefficient - 1, INDEX)), const(coefficient, INDEX))

        for depth, bounds in sorted(self.outer_bounds.items()):
            start, end = zero, const(self.kernel.reduce_shape[depth], INDEX)
            for bound in bounds:
                if bound.low is not None:
                    gap = alu("sub", const(bound.low, INDEX), bound.rest)
                    start = alu("max", start, ceil_over(gap, bound.coefficient))
                if bound.high is not None:
                    gap = alu("sub", const(bound.high, INDEX), bound.rest)
                    end = alu("min", end, ceil_over(gap, bound.coefficient))
            self.tap_ranges[depth] = (self.b.value(start), self.b.value(end))

    def interior(self, start: int, rows: int) -> bool:
        """Whether every term of rows [start, start + rows) passes the row bounds (a tile without edges)."""
        shape = self.kernel.reduce_shape
        return all(bound.holds(row, tap) for bound in self.row_bounds for row in range(start, start + rows)
                   for tap in range(shape[bound.depth]))

    def row_packing(self) -> tuple[KExpr, KExpr, bool] | None:
        """(row factor, column factor, terms contiguous) when the row factor of a 2-D product over one
        loop is computed (``max(h, 0) * W``: an activation fused into the next layer) and a chunk of it
        fits ``ROW_PACK_BYTES``: it is then evaluated once per chunk into a stack buffer, not once per
        column panel, and its broadcasts become plain loads."""
        kernel = self.kernel
        if not _computed_rows(kernel) or self.chunk * kernel.reduce_shape[0] * FLOAT32.itemsize > ROW_PACK_BYTES:
            return None
        split = _split_product(self.reduce_expr, COLUMN, ROW)
        assert split is not None
        loads = [e for e in _nodes(split[0]) if e.op == "load"]
        terms = _affine(loads[0].args[0]) if loads else None
        return split[0], split[1], terms is not None and terms.get(var("r0")) == 1

    def leaves_nothing_to_llvm(self, vector_pack: bool) -> bool:
        """Whether, with its epilogue and packing on vectors, the tile leaves nothing that LLVM's loop
        vectoriser or LICM would improve (``explicitly_vectorised``)."""
        kernel = self.kernel
        if self.nested:  # nested rows: their long index sums want LICM
            return False
        if not ((self.row_pack is None or self.vector_rows) and (self.vector_epilogue or self.swapped) and vector_pack):
            return False
        reduction = {f"r{depth}" for depth in range(len(kernel.reduce_shape))}
        names: dict[KExpr, frozenset[str]] = {}  # the loop variables below each node

        def below(e: KExpr) -> frozenset[str]:
            if e not in names:
                names[e] = frozenset([e.arg]) if e.op == "var" else frozenset().union(*(below(a) for a in e.args))
            return names[e]

        for node in _nodes(self.reduce_expr):
            if node.op in ("div", "rem") and node.dtype == INDEX:
                return False  # an index LLVM's instcombine would simplify (a flatten's div and rem)
            if node.dtype == FLOAT32 and COLUMN in below(node) and not below(node) & reduction:
                return False  # vector work the reduction loop would redo each step: LICM's job
        return True

    @staticmethod
    def terms_contiguous(factor: KExpr) -> bool:
        """Whether ``factor`` is computed from one load contiguous along the terms (pack_block's case)."""
        load = _one_load(factor, COLUMN)
        terms = _affine(load.args[0]) if load is not None else None
        return terms is not None and terms.get(var("r0")) == 1

    def row_pack_vectors(self) -> tuple[KExpr, str]:
        """The row factor with the loop variable its packed layout runs along (the terms for
        ``[row][term]``, the rows for ``[term][row]``) renamed COLUMN, and that variable's name."""
        assert self.row_pack is not None
        along = "r0" if self.row_pack[2] else ROW
        return _replace(self.row_pack[0], {along: var(COLUMN)}, {}), along

    def pack_rows(self) -> None:
        """Evaluate the row factor for the chunk's rows and every term into ``%inrows`` (layout
        ``[row][term]`` when its loads run along the terms, else ``[term][row]``, so the loop that
        fills it reads its source contiguously)."""
        assert self.row_pack is not None
        b = self.b
        factor, _, along_terms = self.row_pack
        extent = self.kernel.reduce_shape[0]
        self.allocas.append(f"%inrows = alloca [{self.chunk * extent} x float], align 64")
        if self.vector_rows:
            self.pack_rows_vectors()
            return
        saved = dict(b.cache)
        rows, terms = self.loop_name("prow"), self.loop_name("pterm")
        loops = [(rows, self.chunk_start, self.chunk_end), (terms, "0", str(extent))]
        for name, low, high in loops if along_terms else loops[::-1]:
            b.open_loop(name, low, high)
        b.var_names[ROW], b.var_names["r0"] = rows, terms
        value = b.value(factor)
        local = b.instantiate("{out} = sub i64 %" + rows + ", " + self.chunk_start)
        if along_terms:
            offset = b.instantiate("{out} = mul i64 {x}, " + str(extent), x=local)
            offset = b.instantiate("{out} = add i64 {x}, %" + terms, x=offset)
        else:
            offset = b.instantiate("{out} = mul i64 %" + terms + ", " + str(self.chunk))
            offset = b.instantiate("{out} = add i64 {x}, {y}", x=offset, y=local)
        slot = b.instantiate("{out} = getelementptr inbounds float, ptr %inrows, i64 {i}", i=offset)
        b.emit(f"store float {value}, ptr {slot}")
        for name, _, _ in loops[::-1] if along_terms else loops:
            b.close_loop(name)
        del b.var_names[ROW], b.var_names["r0"]
        b.cache = saved

    def pack_rows_vectors(self) -> None:
        """``pack_rows`` 16 values at a time along the packed layout's rows: along the terms (a
        constant count, the last vector masked) or along the chunk's rows (the last vector masked
        by the rows left)."""
        assert self.row_pack is not None
        b = self.b
        factor, along = self.row_pack_vectors()
        extent = self.kernel.reduce_shape[0]
        saved = dict(b.cache)
        outer, inner = self.loop_name("prow"), self.loop_name("pterm")
        if along == "r0":  # [row][term]: rows outside, 16 terms at a time
            b.open_loop(outer, self.chunk_start, self.chunk_end)
            b.var_names[ROW] = outer
            local = b.instantiate("{out} = sub i64 %" + outer + ", " + self.chunk_start)
            base = b.instantiate("{out} = mul i64 {x}, " + str(extent), x=local)
            low, high, tail = "0", str(extent - extent % LANES), extent % LANES
        else:  # [term][row]: terms outside, 16 rows at a time
            b.open_loop(outer, "0", str(extent))
            b.var_names["r0"] = outer
            base = b.instantiate("{out} = mul i64 %" + outer + ", " + str(self.chunk))
            base = b.instantiate("{out} = sub i64 {x}, " + self.chunk_start, x=base)
            low, high, tail = self.chunk_start, b.instantiate("{out} = sub i64 " + self.chunk_end + ", 15"), -1
        row_cache = dict(b.cache)

        def store(position: str, mask: str | None) -> None:
            b.var_names[COLUMN] = position[1:]
            value = self.operand(factor, mask, {}, {})
            offset = b.instantiate("{out} = add i64 {x}, " + position, x=base)
            slot = b.instantiate("{out} = getelementptr inbounds float, ptr %inrows, i64 {i}", i=offset)
            self.store_vector(value, slot, mask)
            b.cache = dict(row_cache)

        b.open_loop(inner, low, high)
        store(f"%{inner}", None)
        b.close_loop(inner, LANES)
        if tail > 0:
            store(b.instantiate("{out} = add i64 0, " + high), self.lane_mask(str(tail)))
        elif tail < 0:  # the rows left after the whole vectors: maybe none, then the mask is all off
            done = b.fresh()
            b.emit(f"{done} = load i64, ptr %{inner}.addr")
            left = b.instantiate("{out} = sub i64 " + self.chunk_end + ", {x}", x=done)
            store(done, self.lane_mask(left))
        b.close_loop(outer)
        del b.var_names[COLUMN]
        b.var_names.pop(ROW, None)
        b.var_names.pop("r0", None)
        b.cache = saved

    def lane_mask(self, count: str) -> str:
        """A ``<16 x i1>`` mask of the lanes below ``count`` (a constant or an i64 value)."""
        return lane_mask(self.b, count)

    def store_vector(self, value: str, pointer: str, mask: str | None) -> None:
        """Store a float vector at ``pointer``, only its ``mask`` lanes when there is one."""
        store_vector(self.b, value, pointer, mask)

    def row_term(self) -> KExpr:
        """The product's row factor as the tile reads it: a load from the packed rows, or the factor."""
        assert self.row_pack is not None or self.packed is not None
        if self.row_pack is None:
            assert self.packed is not None
            return self.packed[0]
        extent, along_terms = self.kernel.reduce_shape[0], self.row_pack[2]
        local = alu("sub", var(ROW), var(CHUNK))
        index = alu("add", alu("mul", local, const(extent, INDEX)), var("r0")) if along_terms else \
            alu("add", alu("mul", var("r0"), const(self.chunk, INDEX)), local)
        return KExpr("load", FLOAT32, (index,), "rows")

    def declare(self, name: str) -> None:
        declare(self.b, name)

    def loop_name(self, kind: str) -> str:
        self.count += 1
        name = f"t{kind}{self.count}"
        self.allocas.append(f"%{name}.addr = alloca i64")
        return name

    def render(self) -> None:
        b = self.b
        entry = len(b.lines)
        if self.nested:
            inner = int(np.prod(self.kernel.shape[1:-2]))
            b.emit(f"%tile.lo = mul i64 %start, {inner}\n%tile.hi = mul i64 %end, {inner}")
            outer = self.loop_name("outer")
            b.open_loop(outer, "%tile.lo", "%tile.hi")
            b.var_names[OUTER] = outer
            self.chunk_start, self.chunk_end = "0", str(self.row_extent)
            self.loop_ranges()
        else:
            bounds = ("0", "1") if len(self.kernel.shape) == 1 else ("%start", "%end")  # rank 1: one row
            if self.split_columns:  # every row; the thread's share of axis 0 picks its column panels
                bounds = ("0", str(self.row_count))
            b.emit(f"%tile.lo = add i64 {bounds[0]}, 0\n%tile.hi = add i64 {bounds[1]}, 0")
            chunk = outer = self.loop_name("chunk")
            b.open_loop(chunk, "%tile.lo", "%tile.hi")
            after = b.instantiate("{out} = add i64 %" + chunk + ", " + str(self.chunk))
            short = b.instantiate("{out} = icmp slt i64 {x}, %tile.hi", x=after)
            self.chunk_end = b.instantiate("{out} = select i1 {c}, i64 {x}, i64 %tile.hi", c=short, x=after)
            self.chunk_start = f"%{chunk}"
            b.var_names[CHUNK] = chunk
            if self.row_pack is not None:
                self.pack_rows()
        full = self.columns - self.columns % self.width
        tail = self.columns - full
        spans = ["0", str(full), str(full), str(full + 1)]  # columns of the whole panels, the tail's panel
        if self.split_columns:  # this thread's panels: [start, end) of axis 0 scaled to the panel count
            panels, outer_extent = full // self.width + (1 if tail else 0), self.kernel.shape[0]
            first, last = (b.instantiate("{out} = udiv i64 {x}, " + str(outer_extent),
                                         x=b.instantiate("{out} = mul i64 %" + end + ", " + str(panels)))
                           for end in ("start", "end"))
            whole = full // self.width
            low = b.instantiate("{out} = mul i64 {x}, " + str(self.width), x=first)
            capped = b.instantiate("{out} = call i64 @llvm.umin.i64(i64 {x}, i64 " + str(whole) + ")", x=last)
            high = b.instantiate("{out} = mul i64 {x}, " + str(self.width), x=capped)
            tail_low = b.instantiate("{out} = call i64 @llvm.umax.i64(i64 {x}, i64 " + str(whole) + ")", x=first)
            spans = [low, high, tail_low, last]
        if full:
            column = self.loop_name("col")
            b.open_loop(column, spans[0], spans[1])
            self.panel(f"%{column}", self.width // LANES, 0)
            b.close_loop(column, self.width)
        if tail:
            if self.split_columns:  # the thread whose share ends at the last panel runs the tail
                last_panel = self.loop_name("tail")
                b.open_loop(last_panel, spans[2], spans[3])
                self.panel(str(full), -(-tail // LANES), tail % LANES)
                b.close_loop(last_panel)
            else:
                self.panel(str(full), -(-tail // LANES), tail % LANES)
        b.close_loop(outer, 1 if self.nested else self.chunk)
        b.var_names.pop(OUTER, None)
        b.var_names.pop(CHUNK, None)
        b.lines[entry:entry] = ["  " + line for line in self.allocas]

    def panel(self, column: str, vectors: int, masked_lanes: int) -> None:
        """The chunk's rows times the columns from ``column``: sums in a stack buffer, reduction
        blocks outside the register tiles, then the epilogue."""
        b, kernel = self.b, self.kernel
        stride = vectors * LANES
        buffer = f"%buffer{self.count}"
        self.allocas.append(f"{buffer} = alloca [{self.chunk * stride} x float], align 64")
        if not self.one_block:  # (one block stores its sums instead: -0.0 + x is x, bit for bit)
            clear = self.loop_name("clear")
            b.open_loop(clear, "0", str(self.chunk * vectors))
            offset = b.instantiate("{out} = mul i64 %" + clear + ", " + str(LANES))
            slot = b.instantiate("{out} = getelementptr inbounds float, ptr " + buffer + ", i64 {i}", i=offset)
            b.emit(f"store {self.vector} {self.zero}, ptr {slot}, align 64")
            b.close_loop(clear)
        mask = None
        if masked_lanes:
            mask = b.fresh()
            lanes = ", ".join(f"i32 {lane}" for lane in range(LANES))
            bound = ", ".join([f"i32 {masked_lanes}"] * LANES)
            b.emit(f"{mask} = icmp ult <{LANES} x i32> <{lanes}>, <{bound}>")
        extent = kernel.reduce_shape[0]
        block = self.loop_name("block")
        b.open_loop(block, "0", str(extent))
        after = b.instantiate("{out} = add i64 %" + block + ", " + str(self.block))
        short = b.instantiate("{out} = icmp slt i64 {x}, " + str(extent), x=after)
        block_end = b.instantiate("{out} = select i1 {c}, i64 {x}, i64 " + str(extent), c=short, x=after)
        if self.packed:
            expr = self.pack(column, vectors, masked_lanes, block, block_end, stride)
        elif self.row_pack is not None:
            expr = KExpr("mul", FLOAT32, (self.row_term(), self.row_pack[1]))
        else:
            expr = self.reduce_expr
        arguments = (expr, column, vectors, mask, f"%{block}", block_end, buffer, stride)
        if self.nested and self.row_bounds:
            self.edge_tiles(arguments)
        elif self.nested:  # whole blocks of rows, then one block of the remaining rows
            height = min(self.height, self.row_extent)
            whole = self.row_extent - self.row_extent % height
            row = self.loop_name("row")
            b.open_loop(row, "0", str(whole))
            self.micro(row, height, *arguments)
            b.close_loop(row, height)
            if whole < self.row_extent:
                last = b.instantiate("{out} = add i64 0, " + str(whole))
                self.micro(last[1:], self.row_extent - whole, *arguments)
        else:  # blocks of rows, then single rows (a thread's share need not divide evenly)
            height = min(self.height, max(1, self.row_count))
            row = self.loop_name("row")
            limit = b.instantiate("{out} = sub i64 " + self.chunk_end + ", " + str(height - 1))
            b.open_loop(row, self.chunk_start, limit)
            self.micro(row, height, *arguments)
            b.close_loop(row, height)
            if height > 1:
                done, rest = b.fresh(), self.loop_name("rest")
                b.emit(f"{done} = load i64, ptr %{row}.addr")
                b.open_loop(rest, done, self.chunk_end)
                self.micro(rest, 1, *arguments)
                b.close_loop(rest)
        b.close_loop(block, self.block)
        if self.vector_epilogue:
            self.epilogue_vectors(column, vectors, mask, buffer, stride)
        else:
            self.epilogue(column, stride - ((LANES - masked_lanes) % LANES if masked_lanes else 0), buffer, stride)

    def edge_tiles(self, arguments: tuple[KExpr, str, int, str | None, str, str, str, int]) -> None:
        """The row tiles of a kernel with row bounds: a tile with rows whose terms the bounds exclude
        (an image's left or right edge) at its static position, leaving those terms out; a run of
        tiles without such rows in one loop, as usual."""
        b = self.b
        height = min(self.height, self.row_extent)
        whole = self.row_extent - self.row_extent % height
        tiles = [(start, height) for start in range(0, whole, height)]
        tiles += [(whole, self.row_extent - whole)] if whole < self.row_extent else []
        k = 0
        while k < len(tiles):
            start, rows = tiles[k]
            end = k
            while end < len(tiles) and tiles[end][1] == height and self.interior(*tiles[end]):
                end += 1
            if end - k > 1:
                row = self.loop_name("row")
                b.open_loop(row, str(start), str(tiles[end - 1][0] + height))
                self.micro(row, height, *arguments)
                b.close_loop(row, height)
                k = end
                continue
            first = b.instantiate("{out} = add i64 0, " + str(start))
            self.micro(first[1:], rows, *arguments, static_row=start)
            k += 1

    def pack(self, column: str, vectors: int, masked_lanes: int, block: str, block_end: str, stride: int) -> KExpr:
        """Evaluate the column factor for the panel's columns from ``column`` and the reduction block
        from ``%block`` into a stack buffer ``[term][column]``; return the reduction expression that
        reads it (the row factor times a load from the buffer, contiguous along the columns)."""
        assert self.packed is not None
        b = self.b
        column_factor = self.packed[1]
        name = f"pack{self.count}"
        self.allocas.append(f"%in{name} = alloca [{self.block * stride} x float], align 64")
        columns = (vectors - 1) * LANES + masked_lanes if masked_lanes else stride
        load = _one_load(column_factor, COLUMN)
        terms = _affine(load.args[0]) if load is not None else None
        # 16 x 16 blocks need 16 terms in a block (a 10-term product has none: no dead transposes to compile)
        whole_terms = min(self.block, self.kernel.reduce_shape[0]) >= LANES
        groups = columns // LANES if terms is not None and terms.get(var("r0")) == 1 and whole_terms else 0
        if not groups:
            self.pack_scalar(name, column, f"%{block}", "0", str(columns), f"%{block}", block_end, stride)
        else:  # 16 x 16 blocks: 16 loads along the terms, transposed in registers, 16 stores along the columns
            span = b.instantiate("{out} = sub i64 " + block_end + ", %" + block)
            whole = b.instantiate("{out} = and i64 {x}, -" + str(LANES), x=span)
            whole_end = b.instantiate("{out} = add i64 %" + block + ", {x}", x=whole)
            group = self.loop_name("pg")
            b.open_loop(group, "0", str(groups * LANES))
            saved = dict(b.cache)
            first = b.instantiate("{out} = add i64 " + column + ", %" + group)
            terms_loop = self.loop_name("pt")
            b.open_loop(terms_loop, f"%{block}", whole_end)
            assert load is not None
            self.pack_block(name, column_factor, load, first, f"%{group}", terms_loop, f"%{block}", stride)
            b.close_loop(terms_loop, LANES)
            b.cache = dict(saved)
            if self.block % LANES or self.kernel.reduce_shape[0] % LANES:  # (else every block is whole vectors)
                after = b.instantiate("{out} = add i64 %" + group + ", " + str(LANES))
                self.pack_scalar(name, column, f"%{block}", f"%{group}", after, whole_end, block_end, stride)
            b.cache = saved
            b.close_loop(group, LANES)
            if groups * LANES < columns:
                self.pack_scalar(name, column, f"%{block}", str(groups * LANES), str(columns), f"%{block}", block_end,
                                 stride)
        index = alu("add", alu("mul", alu("sub", var("r0"), var(BLOCK)), const(stride, INDEX)),
                    alu("sub", var(COLUMN), var(PANEL)))
        return KExpr("mul", FLOAT32, (self.row_term(), KExpr("load", FLOAT32, (index,), name)))

    def pack_scalar(self, name: str, column: str, block: str, low: str, high: str, first: str, last: str,
                    stride: int) -> None:
        """Pack the column factor at panel columns [low, high) and terms [first, last), one value at a
        time (columns outermost unless the factor's loads run along the columns)."""
        assert self.packed is not None
        b = self.b
        column_factor = self.packed[1]
        saved = dict(b.cache)
        along = _vectorisable(column_factor, COLUMN, {})
        if along and self.lean and low.isdigit() and high.isdigit():
            self.pack_columns(name, column, block, int(low), int(high), first, last, stride)
            return
        across, down = self.loop_name("pc"), self.loop_name("pk")
        loops = [(across, low, high), (down, first, last)]
        for loop, start, end in loops[::-1] if along else loops:
            b.open_loop(loop, start, end)
        b.var_names[COLUMN] = b.instantiate("{out} = add i64 " + column + ", %" + across)[1:]
        b.var_names["r0"] = down
        value = b.value(column_factor)
        term = b.instantiate("{out} = sub i64 %" + down + ", " + block)
        offset = b.instantiate("{out} = mul i64 {x}, " + str(stride), x=term)
        offset = b.instantiate("{out} = add i64 {x}, %" + across, x=offset)
        slot = b.instantiate("{out} = getelementptr inbounds float, ptr %in" + name + ", i64 {i}", i=offset)
        b.emit(f"store float {value}, ptr {slot}")
        for loop, _, _ in loops if along else loops[::-1]:
            b.close_loop(loop)
        del b.var_names[COLUMN], b.var_names["r0"]
        b.cache = saved

    def pack_columns(self, name: str, column: str, block: str, low: int, high: int, first: str, last: str,
                     stride: int) -> None:
        """``pack_scalar`` for a factor contiguous along the columns (a large product's packed
        operand): per term, the panel columns [low, high) as vectors, the last one masked."""
        assert self.packed is not None
        b = self.b
        saved = dict(b.cache)
        down = self.loop_name("pk")
        b.open_loop(down, first, last)
        b.var_names["r0"] = down
        term = b.instantiate("{out} = sub i64 %" + down + ", " + block)
        base = b.instantiate("{out} = mul i64 {x}, " + str(stride), x=term)
        row_cache = dict(b.cache)
        for start in range(low, high, LANES):
            mask = self.lane_mask(str(high - start)) if high - start < LANES else None
            b.var_names[COLUMN] = b.instantiate("{out} = add i64 " + column + ", " + str(start))[1:]
            value = self.operand(self.packed[1], mask, {}, {})
            offset = b.instantiate("{out} = add i64 {x}, " + str(start), x=base)
            slot = b.instantiate("{out} = getelementptr inbounds float, ptr %in" + name + ", i64 {i}", i=offset)
            self.store_vector(value, slot, mask)
            b.cache = dict(row_cache)
        b.close_loop(down)
        del b.var_names[COLUMN], b.var_names["r0"]
        b.cache = saved

    def pack_block(self, name: str, factor: KExpr, load: KExpr, first: str, local: str, terms: str, block: str,
                   stride: int) -> None:
        """Pack 16 columns from ``first`` (``local`` within the panel) x 16 terms from ``%terms`` of a
        column factor computed from one load contiguous along the terms: 16 vector loads, transposed
        with shuffles (render_transpose.transpose_rows), the factor computed on those vectors, 16
        vector stores into the panel."""
        from funcgrad.lower.render_transpose import transpose_rows
        b = self.b
        saved = dict(b.cache)
        b.var_names[COLUMN], b.var_names["r0"] = first[1:], terms
        rows = []
        for lane in range(LANES):
            pointer = b.instantiate("{out} = getelementptr inbounds float, ptr %in{n}, i64 {i}", n=load.arg,
                                    i=b.value(substitute(load.args[0], COLUMN, lane)))
            rows.append(b.instantiate("{out} = load " + self.vector + ", ptr {p}, align 4", p=pointer))
        columns = transpose_rows(rows, lambda x, y, mask: b.instantiate(
            "{out} = shufflevector " + self.vector + " {x}, " + self.vector + " {y}, <16 x i32> " + mask, x=x, y=y))
        if factor != load:  # each transposed vector is the load at one term: compute the factor on it
            seeded = {(substitute(load, "r0", t), False): value for t, value in enumerate(columns)}
            columns = [self.operand(substitute(factor, "r0", t), None, seeded, {}) for t in range(LANES)]
        term = b.instantiate("{out} = sub i64 %" + terms + ", " + block)
        base = b.instantiate("{out} = mul i64 {x}, " + str(stride), x=term)
        base = b.instantiate("{out} = add i64 {x}, " + local, x=base)
        for number, value in enumerate(columns):
            offset = b.instantiate("{out} = add i64 {x}, " + str(number * stride), x=base)
            slot = b.instantiate("{out} = getelementptr inbounds float, ptr %in" + name + ", i64 {i}", i=offset)
            b.emit(f"store {self.vector} {value}, ptr {slot}, align 64")
        del b.var_names[COLUMN], b.var_names["r0"]
        b.cache = saved

    def micro(self, row: str, height: int, reduce_expr: KExpr, column: str, vectors: int, mask: str | None, low: str,
              high: str, buffer: str, stride: int, static_row: int | None = None) -> None:
        """One register tile of ``reduce_expr``: ``height`` rows from ``%row``, ``vectors`` vectors from
        ``column``, the first reduction loop over [low, high); the sums are added into ``buffer``. A
        guarded sum's unrolled loops run as unrolled terms, those the row bounds exclude at rows from
        ``static_row`` left out (every term runs when it is None: rows without edges)."""
        b, kernel = self.b, self.kernel
        saved = dict(b.cache)
        b.var_names[ROW] = row
        column_alias = b.instantiate("{out} = add i64 " + column + ", 0")
        b.var_names[COLUMN] = column_alias[1:]
        b.var_names[PANEL], b.var_names[BLOCK] = column_alias[1:], low[1:]
        tag = self.count
        slots = [[f"%acc{tag}.{r}.{v}" for v in range(vectors)] for r in range(height)]
        for line in slots:
            for slot in line:
                self.allocas.append(f"{slot} = alloca {self.vector}")
                b.emit(f"store {self.vector} {self.zero}, ptr {slot}")
        unrolled = kernel.reduce_shape[self.unroll_from:]
        if unrolled:  # unrolled loops: their variables are 0, each term adds its offsets
            zero = b.instantiate("{out} = add i64 0, 0")
            b.var_names.update((f"r{depth}", zero[1:]) for depth in range(self.unroll_from, len(kernel.reduce_shape)))
        loops = []
        for depth, extent in enumerate(kernel.reduce_shape[:self.unroll_from]):
            name = self.loop_name(f"r{depth}.")
            start, end = (low, high) if depth == 0 else self.tap_ranges.get(depth, ("0", str(extent)))
            b.open_loop(name, start, end)
            b.var_names[f"r{depth}"] = name
            loops.append(name)
        body_cache = dict(b.cache)
        vector_cache: dict[tuple[KExpr, bool], str] = {}
        broadcasts: dict[str, str] = {}
        for tap in itertools.product(*map(range, unrolled)):  # in loop order, so each sum adds in the same order
            term, residual = reduce_expr, self.residual
            for depth, index in enumerate(tap, self.unroll_from):
                term = substitute(term, f"r{depth}", index)
                residual = None if residual is None else substitute(residual, f"r{depth}", index)
            for r in range(height):
                if static_row is not None and not all(bound.holds(static_row + r, tap[bound.depth - self.unroll_from])
                                                      for bound in self.row_bounds):
                    continue
                test = None if residual is None else b.value(substitute(residual, ROW, r))
                for v in range(vectors):
                    self.accumulate(substitute(substitute(term, ROW, r), COLUMN, v * LANES),
                                    mask if v == vectors - 1 else None, slots[r][v], test, vector_cache, broadcasts)
        b.cache = body_cache
        for depth in reversed(range(len(loops))):
            b.close_loop(loops[depth], hints=("no_vectorize",))
            del b.var_names[f"r{depth}"]
        for depth in range(self.unroll_from, len(kernel.reduce_shape)):
            del b.var_names[f"r{depth}"]
        b.cache = dict(saved)
        local = b.instantiate("{out} = sub i64 %" + row + ", " + self.chunk_start)
        base = b.instantiate("{out} = mul i64 {x}, " + str(stride), x=local)
        for r in range(height):  # fold this block's sums into the buffer (a two-level sum, see the docstring)
            for v in range(vectors):
                offset = b.instantiate("{out} = add i64 {x}, " + str(r * stride + v * LANES), x=base)
                slot = b.instantiate("{out} = getelementptr inbounds float, ptr " + buffer + ", i64 {i}", i=offset)
                total = acc = b.instantiate("{out} = load " + self.vector + ", ptr " + slots[r][v])
                if not self.one_block:
                    old = b.instantiate("{out} = load " + self.vector + ", ptr {p}, align 64", p=slot)
                    total = b.instantiate(f"{{out}} = fadd {self.vector} {{x}}, {{y}}", x=old, y=acc)
                b.emit(f"store {self.vector} {total}, ptr {slot}, align 64")
        b.cache = dict(saved)
        del b.var_names[ROW], b.var_names[COLUMN], b.var_names[PANEL], b.var_names[BLOCK]

    def accumulate(self, expr: KExpr, mask: str | None, slot: str, test: str | None,
                   cache: dict[tuple[KExpr, bool], str], broadcasts: dict[str, str]) -> None:
        """Add ``expr`` at 16 columns to the accumulator in ``slot`` (a product as one fused multiply-add);
        with ``test`` (an i1), only where it holds."""
        b = self.b
        old = b.instantiate("{out} = load " + self.vector + ", ptr " + slot)
        if expr.op == "mul":
            self.declare("fmuladd")
            x, y = (self.operand(a, mask, cache, broadcasts) for a in expr.args)
            new = b.instantiate(f"{{out}} = call {self.vector} @llvm.fmuladd.v{LANES}f32({self.vector} {x}, "
                                f"{self.vector} {y}, {self.vector} {old})")
        else:
            value = self.operand(expr, mask, cache, broadcasts)
            new = b.instantiate(f"{{out}} = fadd reassoc contract {self.vector} {old}, {value}")
        if test is not None:
            new = b.instantiate(f"{{out}} = select i1 {test}, {self.vector} {new}, {self.vector} {old}")
        b.emit(f"store {self.vector} {new}, ptr {slot}")

    def operand(self, e: KExpr, mask: str | None, cache: dict[tuple[KExpr, bool], str],
                broadcasts: dict[str, str]) -> str:
        """``e`` at 16 consecutive columns: a vector value."""
        return vector_operand(self.b, e, COLUMN, mask, cache, broadcasts, self.acc_vector)

    def epilogue_vectors(self, column: str, vectors: int, mask: str | None, buffer: str, stride: int) -> None:
        """``epilogue`` on vectors: per row of the chunk, each output at ``vectors`` vectors of 16
        columns from ``column`` (the last one ``mask``ed), from the sums in ``buffer``."""
        b = self.b
        saved = dict(b.cache)
        out_row = self.loop_name("erow")
        b.open_loop(out_row, self.chunk_start, self.chunk_end)
        b.var_names[ROW] = out_row
        b.var_names[COLUMN] = b.instantiate("{out} = add i64 " + column + ", 0")[1:]
        local_row = b.instantiate("{out} = sub i64 %" + out_row + ", " + self.chunk_start)
        base = b.instantiate("{out} = mul i64 {x}, " + str(stride), x=local_row)
        assert not self.nested and not self.swapped  # (a lean tile: rows and columns of a 2-D kernel)
        position = flat_index([var(ROW), var(COLUMN)], (self.row_count, self.columns))
        broadcasts: dict[str, str] = {}
        for v in range(vectors):
            masked = mask if v == vectors - 1 else None
            offset = b.instantiate("{out} = add i64 {x}, " + str(v * LANES), x=base)
            slot = b.instantiate("{out} = getelementptr inbounds float, ptr " + buffer + ", i64 {i}", i=offset)
            self.acc_vector = b.instantiate("{out} = load " + self.vector + ", ptr {p}, align 64", p=slot)
            cache: dict[tuple[KExpr, bool], str] = {}
            where = b.value(substitute(position, COLUMN, v * LANES))
            for number, expr in enumerate(self.outputs):
                value = self.operand(substitute(expr, COLUMN, v * LANES), masked, cache, broadcasts)
                pointer = b.instantiate("{out} = getelementptr inbounds float, ptr %out{n}, i64 {i}", n=number, i=where)
                self.store_vector(value, pointer, masked)
        self.acc_vector = None
        b.close_loop(out_row)
        del b.var_names[ROW], b.var_names[COLUMN]
        b.cache = saved

    def epilogue(self, column: str, width: int, buffer: str, stride: int) -> None:
        """Apply the kernel's outputs to the chunk's sums (``width`` columns from ``column``) and store them."""
        b, kernel = self.b, self.kernel
        saved = dict(b.cache)
        columns_end = b.instantiate("{out} = add i64 " + column + ", " + str(width))
        out_row, out_column = self.loop_name("erow"), self.loop_name("ecol")
        b.open_loop(out_row, self.chunk_start, self.chunk_end)
        b.open_loop(out_column, column, columns_end)
        b.var_names[ROW], b.var_names[COLUMN] = out_row, out_column
        local_row = b.instantiate("{out} = sub i64 %" + out_row + ", " + self.chunk_start)
        local_column = b.instantiate("{out} = sub i64 %" + out_column + ", " + column)
        offset = b.instantiate("{out} = mul i64 {x}, " + str(stride), x=local_row)
        offset = b.instantiate("{out} = add i64 {x}, {y}", x=offset, y=local_column)
        slot = b.instantiate("{out} = getelementptr inbounds float, ptr " + buffer + ", i64 {i}", i=offset)
        b.acc_value = b.instantiate("{out} = load float, ptr {p}", p=slot)
        if self.nested:
            outer_rows = self.row_count // self.row_extent
            flat = attrs.evolve(kernel, shape=(outer_rows, self.row_extent, self.columns), outputs=self.outputs,
                                reduce_shape=(), reduce_op=None, reduce_expr=None, opts=None)
            _store_outputs(b, flat, [OUTER, ROW, COLUMN])
        else:
            shape = kernel.shape if self.swapped else (self.row_count, self.columns)
            flat = attrs.evolve(kernel, shape=shape, outputs=self.outputs, reduce_shape=(), reduce_op=None,
                                reduce_expr=None, opts=None)
            _store_outputs(b, flat, [COLUMN, ROW] if self.swapped else [ROW, COLUMN])
        b.acc_value = None
        b.close_loop(out_column)
        b.close_loop(out_row)
        del b.var_names[ROW], b.var_names[COLUMN]
        b.cache = saved


def explicitly_vectorised(kernel: Kernel) -> bool:
    """Whether every loop of the kernel's tile that would gain from LLVM's loop vectoriser is written
    on vectors already (the register tile, a computed row factor's packing, the epilogue), so a lean
    pass list compiles it as fast as a full pipeline (``cpu.optimization_level``)."""
    return kernel.reduce_expr is not None and _Tile(_FunctionBuilder(), kernel).lean


def render_tile(builder: _FunctionBuilder, kernel: Kernel) -> None:
    """Emit the tiled loops of ``kernel`` (which carries tile and upcast actions) into ``builder``,
    right after the function's first allocas."""
    _Tile(builder, kernel).render()
