"""The kernel IR: what one fused kernel computes, independent of any device.

A ``Kernel`` is a loop nest. Its *global* loops (``g0, g1, ...``) run over ``shape``, the shape of
its outputs; an optional *reduction* (``r0, r1, ...`` over ``reduce_shape``) folds ``reduce_expr``
into an accumulator with ``reduce_op``. After the reduction, each output buffer receives its
``outputs`` expression (which may read the accumulator as ``acc``) at the flat C-order position of
``(g0, g1, ...)``. Inputs are flat, C-contiguous buffers read with ``load``.

Expressions are ``KExpr`` trees: scalar operations on typed values, with loop indices and index
arithmetic in int64. They are immutable and compared by structure, so equal kernels render to
equal source and share a compiled binary. Every renderer (LLVM, OpenCL C, CUDA C, WGSL) consumes
this one representation; ``evaluate_kernel`` runs it with NumPy as a reference.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from funcgrad.ir import dtypes
from funcgrad.ir.core import ShapedArray
from funcgrad.ir.primitives import THREEFRY_PARITY, THREEFRY_ROTATIONS, kernel_ops

INDEX = np.dtype(np.int64)
BOOL = np.dtype(np.bool_)
_INDEX_LOW, _INDEX_HIGH = -(1 << 63), (1 << 63) - 1

# the ALU operations a renderer must support: the kernel ops of the registry's elementwise primitives
UNARY = kernel_ops(1)
BINARY = kernel_ops(2)
COMPARISONS = ("eq", "ne", "lt", "le", "gt", "ge")
REDUCE_OPS = ("sum", "prod", "max", "min")
class UnsupportedDtypeError(TypeError):
    """A device cannot hold or compute with a dtype (WEBGPU has no 64-bit types; OpenCL without
    cl_khr_fp64 has no float64). The message names the device and the dtype."""


LOW_PRECISION = ("float16", "bfloat16")  # computed in float32 by the renderers, stored as 16 bits


# NumPy computes ``dtype.name`` in Python (slow: docs/performance.md): renderers and the optimiser ask for it
# tens of thousands of times per plan, so names and classes are looked up once per dtype
_DTYPE_NAMES: dict[Any, str] = {}
_DTYPE_CLASSES: dict[Any, str] = {}


def dtype_name(dtype: Any) -> str:
    """``np.dtype(dtype).name``, memoised per dtype."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


def dtype_class(dtype: np.dtype) -> str:
    """How renderers treat a dtype: 'b' bool, 's' signed int, 'u' unsigned int, 'f' float32/float64,
    'h' float16/bfloat16."""
    kind = _DTYPE_CLASSES.get(dtype)
    if kind is None:
        name = dtype_name(dtype)
        kind = "b" if name == "bool" else "h" if name in LOW_PRECISION else {"i": "s", "u": "u", "f": "f"}[
            np.dtype(dtype).kind]
        _DTYPE_CLASSES[dtype] = kind
    return kind


OPT_ACTIONS = ("swap", "reorder", "upcast", "tile", "pad", "unroll", "vectorize", "thread", "split", "transpose")


@attrs.frozen
class Opt:
    """One named optimisation action on a kernel's loop nest; a kernel's ``opts`` is a tuple of them,
    chosen by ``funcgrad.lower.optimize`` (heuristics, or a ``BEAM`` search) and obeyed by the renderer.
    ``axis`` counts global axes for upcast/tile/pad/thread and reduction loops for unroll/split."""

    action: str
    axis: int = 0
    amount: int = 0

    def __attrs_post_init__(self) -> None:
        if self.action not in OPT_ACTIONS:
            raise ValueError(f"unknown kernel optimisation {self.action!r}; the actions are {', '.join(OPT_ACTIONS)}")

    def __str__(self) -> str:
        return f"{self.action}({self.axis}, {self.amount})"


def _arg_key(arg: Any) -> Any:
    """What ``KExpr.arg`` is compared and hashed by: the value, with a float zero's sign (0.0 == -0.0
    in Python, so ``where(c, 0.0, -0.0)`` was once rendered with one constant for both)."""
    if type(arg) is float and arg == 0.0:
        return arg, math.copysign(1.0, arg)
    return arg


@attrs.frozen(cache_hash=True, repr=False)
class KExpr:
    """One node of a kernel expression. ``op`` is 'const', 'var', 'load', 'acc', 'where', 'cast',
    'bitcast', or an ALU name from ``UNARY``/``BINARY``."""

    op: str
    dtype: np.dtype
    args: tuple[KExpr, ...] = ()
    arg: Any = attrs.field(default=None, eq=_arg_key)  # const value, loop variable name, or load's buffer number

    def __str__(self) -> str:
        return render_text(self)

    def __repr__(self) -> str:
        """The readable form (shared nodes once, as ``let``), cut at ``REPR_LIMIT`` characters: attrs'
        generated repr prints each node once per path through the DAG (threefry's rounds: exponentially
        many), and pytest prints the arguments of every frame of a failing test's traceback."""
        text = render_text(self)
        if len(text) > REPR_LIMIT:
            text = text[:REPR_LIMIT] + f"... ({len(text)} characters)"
        return f"KExpr({self.dtype.name}: {text})"


REPR_LIMIT = 2000


def _dag_equal(self: KExpr, other: object) -> bool:
    """Structural equality that walks each pair of nodes once: expressions are DAGs (threefry's rounds
    share every node), and attrs' generated ``__eq__`` compares two equal DAGs built apart (a kernel
    looked up in the CPU's memory cache) once per path, exponentially many. Cached hashes reject
    most unequal pairs at once."""
    if self is other:
        return True
    if other.__class__ is not KExpr:
        return NotImplemented
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[KExpr, KExpr]] = [(self, other)]
    while stack:
        a, b = stack.pop()
        if a is b or (id(a), id(b)) in seen:
            continue
        if hash(a) != hash(b) or a.op != b.op or a.dtype != b.dtype or len(a.args) != len(b.args) \
                or _arg_key(a.arg) != _arg_key(b.arg):
            return False
        seen.add((id(a), id(b)))
        stack.extend(zip(a.args, b.args))
    return True


KExpr.__eq__ = _dag_equal  # type: ignore[method-assign,assignment]


# --- constructors with light simplification (mostly index arithmetic) --------------------------

def const(value: Any, dtype: np.dtype) -> KExpr:
    """A constant; its value is kept as a Python bool/int/float that is exact in ``dtype``."""
    if dtype is INDEX and type(value) is int and _INDEX_LOW <= value <= _INDEX_HIGH:
        return KExpr("const", INDEX, (), value)  # index arithmetic's constants: already exact
    dtype = np.dtype(dtype)
    exact = np.asarray(value).astype(dtype)
    if dtype.kind == "b":
        return KExpr("const", dtype, (), bool(exact))
    if dtype.kind in "iu":
        return KExpr("const", dtype, (), int(exact))
    return KExpr("const", dtype, (), float(exact.astype(np.float64)))


def var(name: str) -> KExpr:
    return KExpr("var", INDEX, (), name)


def load(buffer: int, index: KExpr, dtype: np.dtype) -> KExpr:
    return KExpr("load", np.dtype(dtype), (index,), buffer)


def acc(dtype: np.dtype) -> KExpr:
    return KExpr("acc", np.dtype(dtype))


def with_args(e: KExpr, args: tuple[KExpr, ...]) -> KExpr:
    """``e`` with ``args`` for its arguments: ``e`` itself when each is the same object. Identity, not
    ``==``: a rewrite that rebuilt an equal subtree would otherwise be compared node by node at every
    level above it (the CNN step's schedule: 9632 such comparisons before, 6578 after)."""
    if len(args) == len(e.args) and all(a is b for a, b in zip(args, e.args)):
        return e
    return KExpr(e.op, e.dtype, args, e.arg)


def is_const(e: KExpr, value: Any = None) -> bool:
    return e.op == "const" and (value is None or e.arg == value)


def alu(op: str, *args: KExpr, dtype: np.dtype | None = None) -> KExpr:
    """An ALU node; comparisons give bool, others the first operand's dtype. Folds integer
    constants and the identities of index arithmetic (x + 0, x * 1, x * 0)."""
    out_dtype = BOOL if op in _BOOL_RESULTS else (dtype or args[0].dtype)
    kind = out_dtype.kind
    if op in _FOLD and kind in "iub" and all(a.op == "const" for a in args):
        return const(_FOLD[op](*(a.arg for a in args)), out_dtype)
    if op == "add":
        a, b = args
        if a.op == "const" and a.arg == 0:
            return b
        if b.op == "const" and b.arg == 0:
            return a
    elif op == "mul" and kind in "iu":
        a, b = args
        if a.op == "const" and a.arg == 1:
            return b
        if b.op == "const" and b.arg == 1:
            return a
        if (a.op == "const" and a.arg == 0) or (b.op == "const" and b.arg == 0):
            return const(0, out_dtype)
    elif op in ("div", "rem") and kind in "iu" and args[1].op == "const" and args[1].arg == 1:
        return args[0] if op == "div" else const(0, out_dtype)
    return KExpr(op, out_dtype, args)


_BOOL_RESULTS = frozenset((*COMPARISONS, "is_finite"))
_FOLD: dict[str, Any] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "div": lambda a, b: int(a / b) if b else 0, "rem": lambda a, b: int(np.fmod(a, b)) if b else 0,
    "max": max, "min": min, "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
    "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "and": lambda a, b: a & b, "or": lambda a, b: a | b,
}


def where(cond: KExpr, a: KExpr, b: KExpr) -> KExpr:
    if is_const(cond):
        return a if cond.arg else b
    return KExpr("where", a.dtype, (cond, a, b))


def cast(x: KExpr, dtype: np.dtype) -> KExpr:
    dtype = np.dtype(dtype)
    if x.dtype == dtype:
        return x
    if is_const(x) and x.dtype.kind in "iub" and dtype.kind in "iub":
        return const(x.arg, dtype)
    return KExpr("cast", dtype, (x,))


def bitcast(x: KExpr, dtype: np.dtype) -> KExpr:
    return KExpr("bitcast", np.dtype(dtype), (x,))


def rotate_left(x: KExpr, amount: int) -> KExpr:
    """``x`` rotated left by a constant ``amount`` (0 < amount < width): two shifts and an or, which
    LLVM (``fshl``), C compilers and shader compilers turn into one rotate where the target has it."""
    width = x.dtype.itemsize * 8
    left, right = alu("shift_left", x, const(amount, x.dtype)), alu("shift_right", x, const(width - amount, x.dtype))
    return alu("or", left, right)


def threefry2x32(k0: KExpr, k1: KExpr, x0: KExpr, x1: KExpr) -> tuple[KExpr, KExpr]:
    """The two uint32 words of Threefry-2x32 (20 rounds) of counter (x0, x1) under key (k0, k1), as
    kernel expressions of uint32 add, xor and rotate-left: the same arithmetic as the primitive's
    NumPy reference (``ir/primitives.py: threefry2x32_numpy``), so it fuses with what feeds and reads it.
    The result shares nodes heavily (a DAG of ~130 nodes); renderers and passes walk it by node."""
    u32 = np.dtype(np.uint32)
    keys = (k0, k1, alu("xor", alu("xor", k0, k1), const(THREEFRY_PARITY, u32)))
    x0, x1 = alu("add", x0, keys[0]), alu("add", x1, keys[1])
    for block in range(5):
        for r in THREEFRY_ROTATIONS[block % 2]:
            x0 = alu("add", x0, x1)
            x1 = alu("xor", rotate_left(x1, r), x0)
        x0 = alu("add", x0, keys[(block + 1) % 3])
        x1 = alu("add", alu("add", x1, keys[(block + 2) % 3]), const(block + 1, u32))
    return x0, x1


def flat_index(indices: Sequence[KExpr], shape: Sequence[int]) -> KExpr:
    """The C-order flat position of ``indices`` in an array of ``shape``."""
    total = const(0, INDEX)
    stride = 1
    for index, size in reversed(list(zip(indices, shape))):
        if size != 1:
            total = alu("add", total, alu("mul", index, const(stride, INDEX)))
        stride *= size
    return total


@attrs.frozen
class Kernel:
    """One fused loop nest (see the module docstring)."""

    name: str
    shape: tuple[int, ...]
    in_avals: tuple[ShapedArray, ...]
    out_avals: tuple[ShapedArray, ...]
    outputs: tuple[KExpr, ...]
    reduce_shape: tuple[int, ...] = ()
    reduce_op: str | None = None
    reduce_expr: KExpr | None = None
    opts: tuple[Opt, ...] | None = None  # None: not optimised yet (the renderer applies the heuristics)

    def __attrs_post_init__(self) -> None:
        for aval in self.out_avals:
            if math.prod(aval.shape) != math.prod(self.shape):
                raise ValueError(f"kernel {self.name}: output {aval} does not match its loop shape {self.shape}")
        if (self.reduce_op is None) != (self.reduce_expr is None):
            raise ValueError(f"kernel {self.name}: reduce_op and reduce_expr go together")

    @property
    def acc_dtype(self) -> np.dtype | None:
        return None if self.reduce_expr is None else self.reduce_expr.dtype

    def __str__(self) -> str:
        lines = [f"kernel {self.name} global{list(self.shape)}"
                 + (f" reduce[{self.reduce_op}]{list(self.reduce_shape)}" if self.reduce_op else "")]
        lines += [f"  in{i}: {a}" for i, a in enumerate(self.in_avals)]
        roots = ([self.reduce_expr] if self.reduce_expr is not None else []) + list(self.outputs)
        lets, texts = render_listing(roots)
        lines += [f"  {line}" for line in lets]
        if self.reduce_expr is not None:
            lines.append(f"  acc = {self.reduce_op}(acc, {texts.pop(0)})")
        lines += [f"  out{i}: {a} = {t}" for i, (a, t) in enumerate(zip(self.out_avals, texts))]
        if self.opts is not None:
            lines.append("  opts: " + (" ".join(str(opt) for opt in self.opts) or "none"))
        return "\n".join(lines)


_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def render_listing(roots: Sequence[KExpr]) -> tuple[list[str], list[str]]:
    """Readable text for expressions that share subexpressions: returns (lets, roots), where a
    node used more than once is written once as ``tN = ...`` and referred to by name (printing the
    trees naively can take exponential time on a DAG)."""
    uses: dict[KExpr, int] = {}
    stack = list(roots)
    while stack:
        e = stack.pop()
        uses[e] = uses.get(e, 0) + 1
        if uses[e] == 1:
            stack.extend(e.args)
    lets: list[str] = []
    names: dict[KExpr, str] = {}

    def text(e: KExpr) -> str:
        if e in names:
            return names[e]
        if e.op == "const":
            out = repr(e.arg)
        elif e.op in ("var", "acc"):
            out = str(e.arg) if e.op == "var" else "acc"
        elif e.op == "load":
            out = f"in{e.arg}[{text(e.args[0])}]"
        elif e.op == "cast":
            out = f"{e.dtype.name}({text(e.args[0])})"
        elif e.op == "bitcast":
            out = f"bitcast<{e.dtype.name}>({text(e.args[0])})"
        elif e.op in _SYMBOLS:
            out = f"({text(e.args[0])} {_SYMBOLS[e.op]} {text(e.args[1])})"
        else:
            out = f"{e.op}({', '.join(text(a) for a in e.args)})"
        if uses.get(e, 0) > 1 and e.args:
            lets.append(f"t{len(lets)} = {out}")
            out = f"t{len(lets) - 1}"
        names[e] = out
        return out

    return lets, [text(r) for r in roots]


def render_text(e: KExpr) -> str:
    """A readable one-line form of an expression (shared parts as ``let tN = ...;``)."""
    lets, (root,) = render_listing([e])
    return "".join(f"let {line}; " for line in lets) + root


# --- a NumPy reference evaluator for kernels ---------------------------------------------------

def evaluate_kernel(kernel: Kernel, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Run ``kernel`` with NumPy, vectorized over all loop indices at once (the test oracle for
    renderers, and a fallback device)."""
    from funcgrad.ir.primitives import REGISTRY

    flat_inputs = [np.ascontiguousarray(x).reshape(-1) for x in inputs]
    n_global, n_reduce = len(kernel.shape), len(kernel.reduce_shape)
    grid_shape = tuple(kernel.shape) + tuple(kernel.reduce_shape)
    grids = np.indices(grid_shape, dtype=np.int64, sparse=True) if grid_shape else []
    env = {f"g{i}": grids[i] for i in range(n_global)}
    env.update({f"r{i}": grids[n_global + i] for i in range(n_reduce)})
    cache: dict[int, Any] = {}

    def ev(e: KExpr, accumulator: Any = None) -> Any:
        key = id(e)
        if key in cache and e.op != "acc":
            return cache[key]
        if e.op == "const":
            out: Any = np.asarray(e.arg, e.dtype)
        elif e.op == "var":
            out = env[e.arg]
        elif e.op == "acc":
            out = accumulator
        elif e.op == "load":
            index = ev(e.args[0], accumulator)
            out = flat_inputs[e.arg][index]
        elif e.op == "where":
            c, a, b = (ev(x, accumulator) for x in e.args)
            out = np.where(c, a, b)
        elif e.op == "cast":
            out = REGISTRY["convert_element_type"].impl(np.asarray(ev(e.args[0], accumulator)), new_dtype=e.dtype)
        elif e.op == "bitcast":
            out = np.ascontiguousarray(ev(e.args[0], accumulator)).view(e.dtype)
        else:
            out = REGISTRY[e.op].impl(*(np.asarray(ev(a, accumulator)) for a in e.args))
        out = np.asarray(out)
        if e.op != "var" and out.dtype != e.dtype:
            out = out.astype(e.dtype)
        if e.op != "acc":
            cache[key] = out
        return out

    with np.errstate(all="ignore"):
        accumulator = None
        if kernel.reduce_expr is not None:
            values = np.broadcast_to(ev(kernel.reduce_expr), grid_shape)
            axes = tuple(range(n_global, n_global + n_reduce))
            reducers: dict[str, Any] = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}
            reducer = reducers[kernel.reduce_op or ""]
            work = values.astype(np.float32) if values.dtype in dtypes.LOW_PRECISION else values
            if values.size == 0 or not axes:
                identity = {"sum": 0, "prod": 1}.get(kernel.reduce_op or "")
                if kernel.reduce_op in ("max", "min"):
                    from funcgrad.ir.primitives import _highest, _lowest
                    identity = (_lowest if kernel.reduce_op == "max" else _highest)(values.dtype)
                accumulator = reducer(work, axis=axes, initial=identity) if axes else work
            else:
                accumulator = reducer(work, axis=axes)
            accumulator = np.asarray(accumulator).astype(kernel.reduce_expr.dtype)
            # keep the reduced axes as size 1 so epilogue expressions broadcast against the grid
            accumulator = accumulator.reshape(tuple(kernel.shape) + (1,) * n_reduce)
        results = []
        for expr, aval in zip(kernel.outputs, kernel.out_avals):
            value = np.broadcast_to(ev(expr, accumulator), grid_shape if n_reduce == 0 else
                                    tuple(kernel.shape) + (1,) * n_reduce)
            results.append(np.array(value.reshape(aval.shape), dtype=aval.dtype))
    return results


# --- index simplification -----------------------------------------------------------------------
# Movement ops compose into div/mod chains (a reshape of a transpose of a reshape...). Knowing each
# loop variable's range turns most of them back into plain affine sums, which renderers vectorize.

_AFFINE: dict[KExpr, dict[KExpr | None, int] | None] = {}  # _affine's results (read-only: never mutate one)
_AFFINE_LIMIT = 1 << 14  # entries kept before the memo starts afresh (the CNN step needs ~1,500)


def _affine(e: KExpr) -> dict[KExpr | None, int] | None:
    """``e`` as {atom: coefficient} with the constant under None, if it is affine in its atoms.
    Memoised (simplification asks again for every node of a chain); callers must not modify the result."""
    try:
        return _AFFINE[e]
    except KeyError:
        pass
    found = _affine_terms(e)
    if len(_AFFINE) >= _AFFINE_LIMIT:
        _AFFINE.clear()
    _AFFINE[e] = found
    return found


def _affine_terms(e: KExpr) -> dict[KExpr | None, int] | None:
    if e.op == "const" and e.dtype == INDEX:
        return {None: int(e.arg)}
    if e.op in ("add", "sub"):
        a, b = _affine(e.args[0]), _affine(e.args[1])
        if a is None or b is None:
            return None
        sign = 1 if e.op == "add" else -1
        out = dict(a)
        for k, v in b.items():
            out[k] = out.get(k, 0) + sign * v
        return out
    if e.op == "mul" and e.dtype == INDEX and (is_const(e.args[0]) or is_const(e.args[1])):
        factor, other = (e.args[1], e.args[0]) if is_const(e.args[1]) else (e.args[0], e.args[1])
        inner = _affine(other)
        return None if inner is None else {k: v * int(factor.arg) for k, v in inner.items()}
    if e.dtype == INDEX:
        return {e: 1}
    return None


_BUILT: dict[tuple[tuple[KExpr | None, int], ...], KExpr] = {}  # _build's results by the terms' items


def _build(terms: dict[KExpr | None, int]) -> KExpr:
    """The affine sum ``terms`` (as ``_affine`` gives it) as an expression; memoised."""
    key = tuple(terms.items())
    total = _BUILT.get(key)
    if total is None:
        total = const(terms.get(None, 0), INDEX)
        for atom, coef in key:  # insertion order is deterministic, so equal kernels stay equal
            if atom is None or not coef:
                continue
            total = alu("add", total, alu("mul", atom, const(coef, INDEX)))
        if len(_BUILT) >= _AFFINE_LIMIT:
            _BUILT.clear()
        _BUILT[key] = total
    return total


def _range(e: KExpr, bounds: dict[str, int]) -> tuple[int, int] | None:
    """Inclusive (min, max) of an index expression, or None when unknown."""
    if e.op == "const":
        return int(e.arg), int(e.arg)
    if e.op == "var":
        extent = bounds.get(e.arg)
        return None if extent is None else (0, max(extent - 1, 0))
    terms = _affine(e)
    if terms is not None and not (len(terms) == 1 and e in terms):
        low = high = terms.get(None, 0)
        for atom, coef in terms.items():
            if atom is None:
                continue
            r = _range(atom, bounds)
            if r is None:
                return None
            low += min(coef * r[0], coef * r[1])
            high += max(coef * r[0], coef * r[1])
        return low, high
    if e.op in ("div", "rem") and is_const(e.args[1]) and int(e.args[1].arg) > 0:
        r = _range(e.args[0], bounds)
        n = int(e.args[1].arg)
        if r is None or r[0] < 0:
            return None
        return (r[0] // n, r[1] // n) if e.op == "div" else (0, min(n - 1, r[1]))
    if e.op == "where":
        a, b = _range(e.args[1], bounds), _range(e.args[2], bounds)
        return None if a is None or b is None else (min(a[0], b[0]), max(a[1], b[1]))
    return None


def simplify_index(e: KExpr, bounds: dict[str, int], memo: dict[KExpr, KExpr] | None = None) -> KExpr:
    """Simplify the index arithmetic inside ``e`` given loop extents ``bounds`` (name -> extent).
    Every value is kept where div and rem divide non-negative numbers, as kernel indices do wherever
    they are used (a padded view's negative offsets only occur in lanes a where() discards; there the
    result may be floor division's, not the kernels' truncating one)."""
    memo = {} if memo is None else memo
    node = memo.get(e)
    if node is not None:
        return node
    if not e.args:  # a loop variable, constant or accumulator: nothing to simplify
        memo[e] = e
        return e
    args = tuple([simplify_index(a, bounds, memo) for a in e.args])
    node = with_args(e, args)
    op = node.op
    if op in _INDEX_ARITHMETIC and node.dtype == INDEX:
        if op == "div" or op == "rem":
            if node.args[1].op == "const" and int(node.args[1].arg) > 0:
                node = _simplify_divmod(node, bounds)
        else:
            terms = _affine(node)
            if terms is not None:
                node = _build(terms)
    elif op == "load" and node.args[0].dtype == INDEX:
        # fold digit sums only in whole addresses: inside one, a digit sum may still be split by an outer div/rem
        terms = _affine(node.args[0])
        folded = terms if terms is None else _recombine(terms, bounds)
        if folded is not terms and folded is not None:
            node = KExpr(op, node.dtype, (simplify_index(_build(folded), bounds, memo),), node.arg)
    memo[e] = node
    return node


def _recombine(terms: dict[KExpr | None, int], bounds: dict[str, int]) -> dict[KExpr | None, int]:
    """Fold the digits of a mixed-radix split back together (x >= 0, a, b > 0):
    ``c*rem(x, a) + c*a*rem(div(x, a), b)`` -> ``c*rem(x, a*b)`` and ``c*rem(x, a) + c*a*div(x, a)`` ->
    ``c*x``. A flatten of an NCHW image (``rem(g, 3) + 3*rem(div(g, 3), 3) + 9*div(g, 9)``) becomes ``g``
    again, a load the renderers see as contiguous. Returns ``terms`` itself (not modified) when nothing folds."""
    if sum(1 for atom in terms if atom is not None and atom.op in ("div", "rem")) < 2:
        return terms
    out: dict[KExpr | None, int] = {}
    for atom, coef in terms.items():
        if atom is not None and atom.op == "rem":
            atom = alu("rem", _flat_div(atom.args[0], bounds), atom.args[1])
        elif atom is not None:
            atom = _flat_div(atom, bounds)
        out[atom] = out.get(atom, 0) + coef
    folded = False
    while True:
        step = _fold_one(out, bounds)
        if step is None:
            break
        out, folded = step, True
    return {atom: coef for atom, coef in out.items() if coef or atom is None} if folded else terms


def _flat_div(atom: KExpr, bounds: dict[str, int]) -> KExpr:
    """div(div(y, a), b) -> div(y, a*b) for y >= 0 (so the digits of one number name it alike)."""
    while (atom.op == "div" and atom.args[0].op == "div" and is_const(atom.args[1]) and is_const(atom.args[0].args[1])
           and int(atom.args[1].arg) > 0 and int(atom.args[0].args[1].arg) > 0
           and _nonnegative(atom.args[0].args[0], bounds)):
        atom = alu("div", atom.args[0].args[0], const(int(atom.args[0].args[1].arg) * int(atom.args[1].arg), INDEX))
    return atom


def _fold_one(out: dict[KExpr | None, int], bounds: dict[str, int]) -> dict[KExpr | None, int] | None:
    """``out`` with one pair of digits folded (the new terms where the low digit was), or None."""
    for low, c in out.items():
        if low is None or low.op != "rem" or not is_const(low.args[1]) or int(low.args[1].arg) <= 0:
            continue
        x, a = low.args[0], int(low.args[1].arg)
        if not _nonnegative(x, bounds):
            continue
        quotient = alu("div", x, const(a, INDEX))
        if out.get(quotient) == c * a:  # c*rem(x, a) + c*a*div(x, a) == c*x
            return _splice(out, low, quotient, x, c)
        for high, coef in out.items():
            if (high is not None and high.op == "rem" and high.args[0] == quotient and is_const(high.args[1])
                    and int(high.args[1].arg) > 0 and coef == c * a):
                return _splice(out, low, high, alu("rem", x, const(a * int(high.args[1].arg), INDEX)), c)
    return None


def _splice(out: dict[KExpr | None, int], low: KExpr, high: KExpr, value: KExpr,
            c: int) -> dict[KExpr | None, int]:
    """``out`` without atoms ``low`` and ``high``, plus c * ``value``'s terms at ``low``'s place."""
    spliced: dict[KExpr | None, int] = {}
    for atom, coef in out.items():
        if atom == low:
            for inner, k in (_affine(value) or {value: 1}).items():
                spliced[inner] = spliced.get(inner, 0) + c * k
        elif atom != high:
            spliced[atom] = spliced.get(atom, 0) + coef
    return spliced


_INDEX_ARITHMETIC = frozenset(("add", "sub", "mul", "div", "rem"))


def _simplify_divmod(node: KExpr, bounds: dict[str, int]) -> KExpr:
    if node.op == "div":
        node = _flat_div(node, bounds)
    x, n = node.args[0], int(node.args[1].arg)
    terms = _affine(x)
    if terms is None:
        return node
    # split positive coefficients into a multiple of n and a remainder: (k*(n+d) + j) % n == (k*d + j) % n
    # for non-negative atoms (the window views of convolutions and pooling read rows this way)
    multiple: dict[KExpr | None, int] = {}
    rest: dict[KExpr | None, int] = {None: terms.get(None, 0)}
    for atom, coef in terms.items():
        if atom is None:
            continue
        whole, part = divmod(coef, n) if coef > 0 or coef % n == 0 else (0, coef)
        if whole:
            multiple[atom] = whole
        if part:
            rest[atom] = part
    rest_const = rest.get(None, 0)
    # move whole multiples of n out of the constant
    multiple_const, rest[None] = divmod(rest_const, n)
    rest_expr = _build(rest)
    r = _range(rest_expr, bounds)
    if r is None or r[0] < 0:
        return node
    if node.op == "rem":
        # every multiple term vanishes modulo n (the reference rem has the dividend's sign: x >= 0 here)
        if not all(_nonnegative(k, bounds) for k in multiple if k is not None):
            return node
        if r[1] < n:
            return rest_expr
        factored = _common_factor(rest, n, bounds)
        if factored is not None:  # rem(G*y + s, n) == G*rem(y, n/G) + s
            y, s, factor = factored
            return alu("add", alu("mul", alu("rem", y, const(n // factor, INDEX)), const(factor, INDEX)), s)
        return alu("rem", rest_expr, const(n, INDEX))
    if not all(_nonnegative(k, bounds) for k in multiple if k is not None):
        return node
    quotient = dict(multiple)
    quotient[None] = quotient.get(None, 0) + multiple_const
    if r[1] < n:
        return _build(quotient)
    factored = _common_factor(rest, n, bounds)
    if factored is not None:  # div(G*y + s, n) == div(y, n/G): a row of 20 read as half of a 40 (pooling)
        rest_expr, n = factored[0], n // factored[2]
    return alu("add", _build(quotient), _flat_div(alu("div", rest_expr, const(n, INDEX)), bounds))


def _common_factor(terms: dict[KExpr | None, int], n: int,
                   bounds: dict[str, int]) -> tuple[KExpr, KExpr, int] | None:
    """``terms`` (non-negative atoms, constant in [0, n)) as ``G*y + s`` with G > 1 dividing n and
    0 <= s < G: (y, s, G), the atoms with the largest coefficients in y; or None."""
    atoms = sorted(((coef, atom) for atom, coef in terms.items() if atom is not None), key=lambda item: -item[0])
    if any(coef <= 0 or not _nonnegative(atom, bounds) for coef, atom in atoms):
        return None
    for count in range(1, len(atoms) + 1):
        factor = math.gcd(*(coef for coef, _ in atoms[:count]))
        if factor <= 1 or n % factor or factor >= n:
            continue
        whole, part = divmod(terms.get(None, 0), factor)
        small: dict[KExpr | None, int] = {atom: coef for coef, atom in atoms[count:]}
        small[None] = part
        s = _build(small)
        r = _range(s, bounds)
        if r is not None and r[0] >= 0 and r[1] < factor:
            y: dict[KExpr | None, int] = {atom: coef // factor for coef, atom in atoms[:count]}
            y[None] = whole
            return _build(y), s, factor
    return None


def fold_comparisons(e: KExpr, bounds: dict[str, int], memo: dict[KExpr, KExpr] | None = None) -> KExpr:
    """``e`` with every comparison of index values that holds, or fails, for all loop values within
    ``bounds`` replaced by that constant, and the ``and``/``or``/``not``/``where`` nodes it decides
    folded (a padded or concatenated view's tests in a loop range that lies on one side of them)."""
    memo = {} if memo is None else memo
    node = memo.get(e)
    if node is not None:
        return node
    args = tuple([fold_comparisons(a, bounds, memo) for a in e.args])
    node = with_args(e, args)
    if node.op in COMPARISONS and node.args[0].dtype == INDEX:
        r = _range(alu("sub", *node.args), bounds)
        decided: bool | None = None
        if r is not None and node.op in ("eq", "ne"):
            if r[0] == r[1] == 0 or not r[0] <= 0 <= r[1]:
                decided = (r[0] == 0) == (node.op == "eq")
        elif r is not None:  # a monotone test: the same at both ends, the same between them
            low, high = (bool(_FOLD[node.op](value, 0)) for value in r)
            decided = low if low == high else None
        if decided is not None:
            node = const(decided, BOOL)
    elif node.op in ("and", "or") and node.dtype == BOOL:
        absorbing = node.op == "or"  # or(True, x) == True, and(False, x) == False
        if any(is_const(a, absorbing) for a in node.args):
            node = const(absorbing, BOOL)
        else:
            kept = [a for a in node.args if not is_const(a)]
            if len(kept) < len(node.args):
                node = kept[0] if kept else const(not absorbing, BOOL)
    elif node.op == "not" and node.dtype == BOOL and is_const(node.args[0]):
        node = const(not node.args[0].arg, BOOL)
    elif node.op == "where" and is_const(node.args[0]):
        node = node.args[1] if node.args[0].arg else node.args[2]
    memo[e] = node
    return node


def comparison_breaks(roots: Sequence[KExpr], name: str, extent: int) -> list[int]:
    """The positions in (0, extent) of loop ``name`` where a comparison of index values that moves with
    ``name`` alone (``k * name + m`` against 0) changes its truth, in order: between two of them every
    such comparison is decided (``fold_comparisons``)."""
    x = var(name)
    found: set[int] = set()
    seen: set[KExpr] = set()
    stack = list(roots)
    while stack:
        e = stack.pop()
        if e in seen:
            continue
        seen.add(e)
        stack.extend(e.args)
        if e.op not in COMPARISONS or e.args[0].dtype != INDEX:
            continue
        terms = _affine(alu("sub", *e.args))
        if terms is None or set(terms) - {x, None} or not terms.get(x):
            continue
        k, m = terms[x], terms.get(None, 0)
        test = _FOLD[e.op]
        for point in range(-m // k - 1, -m // k + 3):  # a monotone (or eq/ne: a one-point) test turns here
            if 0 < point < extent and test(k * point + m, 0) != test(k * (point - 1) + m, 0):
                found.add(point)
    return sorted(found)


def _nonnegative(e: KExpr, bounds: dict[str, int]) -> bool:
    r = _range(e, bounds)
    return r is not None and r[0] >= 0


def simplify_kernel(kernel: Kernel) -> Kernel:
    """``kernel`` with its index arithmetic simplified using its loop extents, and adjacent loops
    that every index treats as one merged (``merge_loops``)."""
    bounds = {f"g{i}": d for i, d in enumerate(kernel.shape)}
    bounds.update({f"r{i}": d for i, d in enumerate(kernel.reduce_shape)})
    memo: dict[KExpr, KExpr] = {}
    simplified = attrs.evolve(kernel, outputs=tuple(simplify_index(e, bounds, memo) for e in kernel.outputs),
                              reduce_expr=None if kernel.reduce_expr is None else
                              simplify_index(kernel.reduce_expr, bounds, memo))
    return merge_loops(simplified)


def _index_roots(e: KExpr, found: dict[KExpr, None], seen: set[tuple[KExpr, bool]], inside: bool = False) -> None:
    """The maximal index-typed subexpressions of ``e`` (load indices, compared or cast indices)."""
    if (e, inside) in seen:  # a node can be a root in one place and part of a larger index in another
        return
    seen.add((e, inside))
    if e.dtype == INDEX and not inside:
        found[e] = None
    for a in e.args:
        _index_roots(a, found, seen, inside=e.dtype == INDEX)


def _uses(e: KExpr, name: str) -> bool:
    return (e.op == "var" and e.arg == name) or any(_uses(a, name) for a in e.args)


PARTIAL_SUM_MIN = 4096  # float sums at least this long add up partial sums (render_loops.partial_sum_split)


def merge_loops(kernel: Kernel) -> Kernel:
    """Merge adjacent loops ``x_d, x_(d+1)`` (extent E) that every index uses only as
    ``E * c * x_d + c * x_(d+1)``: one loop of the product's length, so the inner loop is long
    enough to vectorise (a sum over the 24 x 24 pixels of an NCHW image is one 576-long loop, an
    elementwise kernel over contiguous arrays one flat loop). Reduction loops after the first (which
    stays apart for partial sums), and the first too in a sum shorter than ``PARTIAL_SUM_MIN``;
    output loops only in kernels without a reduction (a longer last output axis would change a
    reduction's loop order). Repeats until nothing merges."""
    while True:
        roots: dict[KExpr, None] = {}
        seen: set[tuple[KExpr, bool]] = set()
        for e in (*kernel.outputs, *(() if kernel.reduce_expr is None else (kernel.reduce_expr,))):
            _index_roots(e, roots, seen)
        # the outermost reduction loop stays apart, so a long float sum keeps two levels (partial sums);
        # a shorter sum has no partial sums (one accumulator in loop order), so all of its loops merge (a
        # weight gradient's sum over batch and sequence is then a one-loop product: render_tile packs it)
        short = int(np.prod(kernel.reduce_shape)) < PARTIAL_SUM_MIN
        candidates = [("r", d) for d in range(0 if short else 1, len(kernel.reduce_shape) - 1)]
        # output loops: all of them without a reduction; with a one-loop reduction (a product over one
        # contraction), those before the last two: the batch-like loops merge into the rows (a 2-D product
        # reaches the tile's packing, ``render_tile._packable``), the columns stay
        if kernel.reduce_expr is None:
            candidates += [("g", d) for d in range(len(kernel.shape) - 1)]
        elif len(kernel.reduce_shape) == 1:
            candidates += [("g", d) for d in range(len(kernel.shape) - 2)]
        for kind, d in candidates:
            extents = kernel.reduce_shape if kind == "r" else kernel.shape
            if _mergeable(roots, f"{kind}{d}", f"{kind}{d + 1}", extents[d + 1]):
                kernel = _merge(kernel, kind, d, roots)
                break
        else:
            return kernel


def _mergeable(roots: dict[KExpr, None], outer: str, inner: str, extent: int) -> bool:
    for root in roots:
        if not (_uses(root, outer) or _uses(root, inner)):
            continue
        terms = _affine(root)
        if terms is None:
            return False
        for atom in terms:
            if atom is not None and atom.op != "var" and (_uses(atom, outer) or _uses(atom, inner)):
                return False  # inside a div/mod or another non-affine atom
        if terms.get(var(outer), 0) != extent * terms.get(var(inner), 0):
            return False
    return True


def _merge(kernel: Kernel, kind: str, d: int, roots: dict[KExpr, None]) -> Kernel:
    """``kernel`` with loops d and d+1 of ``kind`` ('g' or 'r') merged into loop d; later loops renumbered."""
    extents = list(kernel.reduce_shape if kind == "r" else kernel.shape)
    merged = var(f"{kind}{d}")
    rename = {var(f"{kind}{i}"): var(f"{kind}{i - 1}") for i in range(d + 2, len(extents))}
    renamed: dict[KExpr, KExpr] = {}

    def rename_vars(e: KExpr) -> KExpr:
        if e not in renamed:
            if e.op == "var":
                renamed[e] = rename.get(e, e)
            else:
                args = tuple(rename_vars(a) for a in e.args)
                renamed[e] = with_args(e, args)
        return renamed[e]

    rebuilt: dict[KExpr, KExpr] = {}
    for root in roots:
        terms = _affine(root)
        if terms is None:
            continue
        outer, inner = var(f"{kind}{d}"), var(f"{kind}{d + 1}")
        if outer not in terms and inner not in terms:
            continue  # renamed below like any other expression
        new: dict[KExpr | None, int] = {}
        for atom, coef in terms.items():
            if atom == outer:
                continue
            target = merged if atom == inner else rename_vars(atom) if atom is not None else None
            new[target] = new.get(target, 0) + coef
        rebuilt[root] = _build(new)
    memo: dict[KExpr, KExpr] = {}

    def rewrite(e: KExpr) -> KExpr:
        if e in memo:
            return memo[e]
        if e in rebuilt:
            out = rebuilt[e]
        elif e.op == "var":
            out = rename.get(e, e)
        else:
            args = tuple(rewrite(a) for a in e.args)
            out = with_args(e, args)
        memo[e] = out
        return out

    extents[d:d + 2] = [extents[d] * extents[d + 1]]
    outputs = tuple(rewrite(e) for e in kernel.outputs)
    reduce_expr = None if kernel.reduce_expr is None else rewrite(kernel.reduce_expr)
    if kind == "r":
        return attrs.evolve(kernel, outputs=outputs, reduce_expr=reduce_expr, reduce_shape=tuple(extents))
    return attrs.evolve(kernel, outputs=outputs, reduce_expr=reduce_expr, shape=tuple(extents))


# --- pi in integer arithmetic, for the renderers' trigonometric range reductions -------------------------

def pi_scaled(bits: int) -> int:
    """floor(pi * 2^bits) to within one unit (Machin's formula, with 64 guard bits)."""
    scale = 1 << (bits + 64)

    def arctan_inverse(n: int) -> int:  # atan(1/n) * scale
        total, term, k = 0, scale // n, 0
        while term:
            total += term // (2 * k + 1) * (-1 if k % 2 else 1)
            term //= n * n
            k += 1
        return total

    return (16 * arctan_inverse(5) - 4 * arctan_inverse(239)) >> 64


def two_over_pi_words(count: int) -> list[int]:
    """The first ``count`` 32-bit words of 2/pi's binary fraction, after one word of zeros (so a
    window may start before the point): Payne and Hanek's table, for reductions of any float32."""
    precision = 32 * count + 64
    fraction = (1 << (2 * precision + 1)) // pi_scaled(precision) >> 64  # floor(2/pi * 2^(32 count))
    return [0] + [(fraction >> (32 * (count - 1 - i))) & 0xFFFFFFFF for i in range(count)]
