"""The kernel optimiser: choose a kernel's loop-nest actions (``Kernel.opts``) for the CPU renderer.

    kernel --optimize--> attrs.evolve(kernel, opts=(Opt("reorder"), Opt("upcast", 0, 2), ...)) --render_llvm-->

``heuristic_opts`` is the default: the i-k-j order for matrix-product-like reductions
(``reorder``), two output rows per block in it (``upcast``), partial sums for long float sums
(``split``, a precision decision that every choice keeps), a vectorised-but-not-unrolled short row
(``vectorize(0, 0)``) and the number of chunks over axis 0 (``thread``). ``BEAM=N`` searches
instead (``beam_search``): it times candidate opt tuples on random inputs, keeps the best N per
round, accepts a candidate only if its outputs match the heuristic's, and stores the winner on disk,
where every later process finds it (with or without ``BEAM``). ``check_opts`` rejects actions that do
not apply to a kernel.

Action meanings (``Opt(action, axis, amount)``): ``reorder`` run the reduction outside the last
output loop; ``upcast(len(shape) - 2, k)`` k output rows per block in that order; ``split(d)`` sum
reduction loops d.. into a partial; ``unroll(d, k)`` unroll reduction loop d k times (1: never);
``vectorize(0, w)`` the innermost loop's vector width (1: scalar; 0: vectorised, not unrolled);
``thread(0, n)`` n chunks over axis 0; ``tile``/``pad`` belong to ``funcgrad.lower.render_tile``.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from funcgrad.ir.dtypes import ml_dtypes  # imported on first use
from funcgrad.lower.device import optimizer_target
from funcgrad.lower.kernel import OPT_ACTIONS, Kernel, Opt, dtype_class
from funcgrad.lower.render_loops import (
    MAX_ROW,
    ROW_BLOCK,
    SHORT_ROW,
    accumulator_dtype,
    partial_sum_split,
    reduce_outer,
)
from funcgrad.util.caches import write_atomically
from funcgrad.util.config import env_float, env_int
from funcgrad.util.debug import debug_level

__all__ = ["heuristic_opts", "check_opts", "optimize", "beam_search", "cached_opts", "beam_cache_path"]

BEAM_FORMAT = "funcgrad-beam-v1"
DEFAULT_BUDGET_S = 10.0
UPCASTS = (1, 2, 4)
UNROLLS = (1, 2, 4, 8)
WIDTHS = (0, 1, 4, 8, 16)
TIMING_RUNS = 3
CONFIRM_MARGIN = 0.95  # a choice other than the heuristic's must be at least 5% faster on a second timing
SLOW_CANDIDATE = 3.0  # a candidate whose first run takes this many times the best so far is not timed further


def canonical(opts: Sequence[Opt]) -> tuple[Opt, ...]:
    """Opts in a fixed order (by action, then axis), so equal choices compare and print equal."""
    return tuple(sorted(opts, key=lambda opt: (OPT_ACTIONS.index(opt.action), opt.axis)))


def _tile_opts(kernel: Kernel) -> tuple[Opt, ...] | None:
    """The register-tile micro-kernel's opts (``funcgrad.lower.render_tile``), when that file
    exists and takes this kernel."""
    try:
        render_tile = importlib.import_module("funcgrad.lower.render_tile")
    except ImportError:
        return None
    tile_opts = getattr(render_tile, "tile_opts", None)
    chosen = tile_opts(kernel) if tile_opts is not None else None
    return tuple(chosen) if isinstance(chosen, tuple) else None


def _transpose_opts(kernel: Kernel) -> tuple[Opt, ...] | None:
    """The blocked transpose's opts (``funcgrad.lower.render_transpose``) when it takes this kernel."""
    from funcgrad.lower.render_transpose import transpose_opts
    return transpose_opts(kernel)


def _threads(kernel: Kernel) -> int:
    return optimizer_target().heuristic_threads(kernel)


def heuristic_opts(kernel: Kernel, tile: bool = True) -> tuple[Opt, ...]:
    """The default choices (what the renderer decided internally before opts existed); the
    register-tile micro-kernel's first where it takes the kernel (unless ``tile`` is False).

    >>> heuristic_opts(matmul_kernel)  # doctest: +SKIP
    (Opt(action='reorder', axis=0, amount=0), Opt(action='upcast', axis=0, amount=2), ...)
    """
    tiled = _tile_opts(kernel) if tile else None
    threads = _threads(kernel)
    if tiled is not None:
        has_thread = any(opt.action == "thread" for opt in tiled)
        return tiled if has_thread or threads == 1 else (*tiled, Opt("thread", 0, threads))
    opts: list[Opt] = []
    acc_dtype = kernel.acc_dtype
    if acc_dtype is not None and reduce_outer(kernel):
        opts.append(Opt("reorder"))
        if len(kernel.shape) >= 2 and kernel.shape[-2] >= 2:
            opts.append(Opt("upcast", len(kernel.shape) - 2, ROW_BLOCK))
        if kernel.shape[-1] < SHORT_ROW and kernel.shape[-1] % 16 != 0:
            opts.append(Opt("vectorize", 0, 0))
    transposed = _transpose_opts(kernel) if tile and acc_dtype is None else None
    if transposed is not None:
        return (*transposed, Opt("thread", 0, threads)) if threads > 1 else transposed
    if "reorder" not in {opt.action for opt in opts}:
        opts += _innermost_swap(kernel)
        if kernel.reduce_op in ("max", "min") and acc_dtype is not None and dtype_class(acc_dtype) == "f" \
                and kernel.reduce_shape and kernel.reduce_shape[-1] >= UNROLL_MAX_MIN * 16:
            # a float max/min (NaN-propagating) is not vectorised across the loop; four independent
            # chains let the core overlap them (softmax's row max over 4096: docs/performance.md)
            opts.append(Opt("unroll", len(kernel.reduce_shape) - 1, UNROLL_MAX_MIN))
    split = partial_sum_split(kernel, accumulator_dtype(acc_dtype)) if acc_dtype is not None else None
    if split is not None:
        opts.append(Opt("split", split))
    if threads > 1:
        opts.append(Opt("thread", 0, threads))
    return canonical(opts)


UNROLL_MAX_MIN = 4  # unroll of a long float max/min reduction loop (see heuristic_opts)
SWAP_MAX_REDUCE = 16  # a reduction this short is unrolled away, leaving the output loop innermost
SMALL_BUFFER = 1 << 14  # bytes: a buffer this small stays in L1 whatever the loop order


def _innermost_swap(kernel: Kernel) -> list[Opt]:
    """A ``swap`` that puts innermost the output axis along which more large buffers are contiguous
    (loads with stride 1, counted once per reduction step, and the outputs, contiguous along the last
    axis; a tie keeps the order), or nothing. A channels-last
    convolution's result read in NCHW order (bias + ReLU, pooling) otherwise walks memory with a
    stride of the channel count."""
    from funcgrad.lower.kernel import _affine, var
    from funcgrad.lower.render_loops import _loads
    rank = len(kernel.shape)
    if rank < 3 or int(np.prod(kernel.reduce_shape)) > SWAP_MAX_REDUCE:
        return []
    roots = [e for e in (*kernel.outputs, kernel.reduce_expr) if e is not None]
    found: list[Any] = []
    seen: set[int] = set()
    for root in roots:
        _loads(root, found, seen)
    votes = [0] * rank
    repeats = max(1, int(np.prod(kernel.reduce_shape)))  # a window's loads run once per window element
    for load in {(e.arg, e.args[0]) for e in found}:
        aval = kernel.in_avals[load[0]]
        if int(np.prod(aval.shape)) * aval.dtype.itemsize <= SMALL_BUFFER:
            continue
        terms = _affine(load[1]) or {}
        for axis in range(1, rank):
            if terms.get(var(f"g{axis}")) == 1:
                votes[axis] += repeats
    votes[rank - 1] += len(kernel.outputs)  # every output is stored contiguously along the last axis
    best = max(range(1, rank), key=lambda axis: (votes[axis], axis == rank - 1))
    return [] if best == rank - 1 else [Opt("swap", best, rank - 1)]


# --- validity -------------------------------------------------------------------------------------

def check_opts(kernel: Kernel, opts: Sequence[Opt]) -> None:
    """Raise ValueError naming the kernel and the action if ``opts`` cannot apply to ``kernel``."""

    def fail(opt: Opt | None, why: str) -> None:
        what = f"{opt} " if opt is not None else ""
        raise ValueError(f"kernel {kernel.name}: optimisation {what}does not apply: {why}")

    if not isinstance(opts, tuple) or not all(isinstance(opt, Opt) for opt in opts):
        raise ValueError(f"kernel {kernel.name}: opts must be a tuple of Opt, got {opts!r}")
    if any(opt.action in ("tile", "pad") for opt in opts):
        _check_tile(kernel, opts, fail)
        return
    if any(opt.action == "transpose" for opt in opts):
        from funcgrad.lower.render_transpose import check_transpose_opts
        check_transpose_opts(kernel, opts)
        for opt in opts:
            outer = kernel.shape[0] if kernel.shape else 1
            if opt.action == "thread" and (opt.axis != 0 or not 1 <= opt.amount <= max(1, outer)):
                fail(opt, f"thread(0, n) splits axis 0 into n = 1..{max(1, outer)} chunks")
        return
    seen: set[tuple[str, int]] = set()
    for opt in opts:
        key = (opt.action, opt.axis if opt.action == "unroll" else 0)
        if key in seen:
            fail(opt, f"{opt.action} given twice")
        seen.add(key)
    actions = {opt.action for opt in opts}
    reduces = kernel.reduce_expr is not None and len(kernel.reduce_shape) > 0
    acc = accumulator_dtype(kernel.acc_dtype) if kernel.acc_dtype is not None else None
    for opt in opts:
        if opt.action == "reorder":
            if not reduces or not kernel.shape:
                fail(opt, "the i-k-j order needs a reduction and at least one output axis")
            if not 1 <= kernel.shape[-1] <= MAX_ROW:
                fail(opt, f"the last output axis ({kernel.shape[-1]}) must be 1..{MAX_ROW} long (a row on the stack)")
            if opt.axis or opt.amount:
                fail(opt, "reorder takes no axis or amount")
        elif opt.action == "swap":
            rank = len(kernel.shape)
            if "reorder" in actions:
                fail(opt, "the i-k-j (reorder) order fixes its loops")
            if not (1 <= opt.axis < rank and 1 <= opt.amount < rank and opt.axis != opt.amount):
                fail(opt, f"swap(a, b) exchanges two different output axes 1..{rank - 1} (axis 0 stays outermost)")
        elif opt.action == "upcast":
            if "reorder" not in actions or len(kernel.shape) < 2:
                fail(opt, "row blocks exist in the reorder (i-k-j) order of a kernel with >= 2 output axes")
            if opt.axis != len(kernel.shape) - 2:
                fail(opt, f"upcast blocks axis {len(kernel.shape) - 2} (the second-to-last output axis)")
            if not 1 <= opt.amount <= kernel.shape[opt.axis]:
                fail(opt, f"amount must be 1..{kernel.shape[opt.axis]} (the axis' extent)")
        elif opt.action == "split":
            if kernel.reduce_op != "sum" or acc is None or dtype_class(acc) != "f":
                fail(opt, "partial sums apply to float sums")
            if not 1 <= opt.axis < len(kernel.reduce_shape):
                fail(opt, f"split depth must be 1..{len(kernel.reduce_shape) - 1} (reduction loops "
                          f"{list(kernel.reduce_shape)})")
        elif opt.action == "unroll":
            if not 0 <= opt.axis < len(kernel.reduce_shape) or not reduces:
                fail(opt, f"unroll counts reduction loops; this kernel has {len(kernel.reduce_shape)}")
            if opt.amount < 1:
                fail(opt, "the unroll count must be >= 1")
        elif opt.action == "vectorize":
            if opt.axis or opt.amount < 0 or not (kernel.shape or reduces):
                fail(opt, "vectorize(0, w) needs a loop and a width w >= 0")
        elif opt.action == "thread":
            outer = kernel.shape[0] if kernel.shape else 1
            if opt.axis != 0 or not 1 <= opt.amount <= max(1, outer):
                fail(opt, f"thread(0, n) splits axis 0 into n = 1..{max(1, outer)} chunks")
    needed = partial_sum_split(kernel, acc) if acc is not None else None
    if needed is not None and "split" not in actions:
        fail(None, f"its float sum over {int(np.prod(kernel.reduce_shape))} values needs a split (partial sums, "
                   f"heuristic depth {needed}) for precision")


def _check_tile(kernel: Kernel, opts: Sequence[Opt], fail: Callable[[Opt | None, str], None]) -> None:
    try:
        render_tile = importlib.import_module("funcgrad.lower.render_tile")
    except ImportError:
        fail(None, "tile/pad need funcgrad.lower.render_tile, which is not available")
        return
    check = getattr(render_tile, "check_tile_opts", None)
    if check is not None:
        check(kernel, opts)


# --- choosing -------------------------------------------------------------------------------------

def beam_width() -> int:
    """``BEAM`` as an int (0: no search)."""
    return env_int("BEAM", 0, what="a beam width (an integer; 0: no search)")


def beam_budget() -> float:
    """Seconds one kernel's search may take (``FUNCGRAD_BEAM_BUDGET``, default 10)."""
    return env_float("FUNCGRAD_BEAM_BUDGET", DEFAULT_BUDGET_S)


def optimize(kernel: Kernel) -> Kernel:
    """``kernel`` with its opts chosen: a stored BEAM result if there is one, else a search when
    ``BEAM`` is set, else the heuristics. A kernel that has opts already is returned as is."""
    if kernel.opts is not None:
        return kernel
    width = beam_width()
    opts = beam_search(kernel, width, beam_budget()) if width else cached_opts(kernel)
    return attrs.evolve(kernel, opts=opts if opts is not None else heuristic_opts(kernel))


# --- the BEAM cache ---------------------------------------------------------------------------------

_REMEMBERED: dict[str, tuple[Opt, ...]] = {}  # cache path -> opts, for this process


def beam_cache_path(kernel: Kernel) -> Path:
    """Where the BEAM choice for ``kernel`` lives: keyed by its text without opts, the device and
    the host CPU, under the kernel cache folder (``FUNCGRAD_CACHE``)."""
    target = optimizer_target()
    text = str(attrs.evolve(kernel, opts=None))
    key = hashlib.sha256(f"{BEAM_FORMAT}\nCPU\n{target.cpu_name()}\n{text}".encode()).hexdigest()
    return target.cache_folder().parent / "beam" / f"{key}.json"


def cached_opts(kernel: Kernel) -> tuple[Opt, ...] | None:
    """The stored BEAM choice for ``kernel``, or None (also for an unreadable or invalid file)."""
    if not _REMEMBERED and not (optimizer_target().cache_folder().parent / "beam").is_dir():
        return None  # none stored: do not wait for the compiler worker's name of the host CPU (the key)
    path = beam_cache_path(kernel)
    remembered = _REMEMBERED.get(str(path))
    if remembered is not None:
        return remembered
    try:
        entry = json.loads(path.read_text())
        if entry.get("format") != BEAM_FORMAT:
            return None
        opts = tuple(Opt(str(action), int(axis), int(amount)) for action, axis, amount in entry["opts"])
        check_opts(kernel, opts)
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None
    _REMEMBERED[str(path)] = opts
    return opts


def _store(kernel: Kernel, opts: tuple[Opt, ...], seconds: float, heuristic_seconds: float) -> None:
    """Write the choice atomically (temporary file in the same folder, then os.replace)."""
    path = beam_cache_path(kernel)
    entry = {"format": BEAM_FORMAT, "kernel": kernel.name, "opts": [[o.action, o.axis, o.amount] for o in opts],
             "seconds": seconds, "heuristic_seconds": heuristic_seconds}
    if write_atomically(path, json.dumps(entry).encode()):
        _REMEMBERED[str(path)] = opts


# --- the search -------------------------------------------------------------------------------------

def _without(opts: Sequence[Opt], action: str) -> list[Opt]:
    return [opt for opt in opts if opt.action != action]


def neighbours(kernel: Kernel, opts: tuple[Opt, ...]) -> list[tuple[Opt, ...]]:
    """Every valid opt tuple that differs from ``opts`` in one choice: reorder on/off, upcast
    1/2/4, swap of the innermost output axis with another (or none), unroll 1/2/4/8 of the
    innermost reduction loop, vectorize widths, thread 1/n. The split (precision) is never
    dropped. A register tile's neighbours are the other tile shapes and reduction blocks of
    ``render_tile.tile_candidates`` (with the same thread choice); a blocked transpose's, the plain
    loops."""
    if any(opt.action == "transpose" for opt in opts):  # the blocked transpose, or the plain loops
        plain = tuple(opt for opt in heuristic_opts(kernel, tile=False) if opt.action != "thread")
        thread_opts = tuple(opt for opt in opts if opt.action == "thread")
        return [canonical((*plain, *thread_opts))]
    if any(opt.action in ("tile", "pad") for opt in opts):
        from funcgrad.lower.render_tile import tile_candidates
        thread_opts = tuple(opt for opt in opts if opt.action == "thread")
        shapes = [canonical((*_without(candidate, "thread"), *thread_opts)) for candidate in tile_candidates(kernel)]
        return [shape for shape in shapes if shape != canonical(opts)]
    variants: list[list[Opt]] = []
    reorder = any(opt.action == "reorder" for opt in opts)
    if reorder:
        variants.append(_without(_without(opts, "reorder"), "upcast"))
    else:
        rows = [Opt("upcast", len(kernel.shape) - 2, ROW_BLOCK)] if len(kernel.shape) >= 2 else []
        variants.append([*_without(opts, "swap"), Opt("reorder"), *rows])
        variants.append([*_without(opts, "swap"), Opt("reorder")])
        rank = len(kernel.shape)
        variants.append(_without(opts, "swap"))
        variants += [[*_without(opts, "swap"), Opt("swap", axis, rank - 1)] for axis in range(1, rank - 1)]
    if reorder and len(kernel.shape) >= 2:
        for amount in UPCASTS:
            rows = [Opt("upcast", len(kernel.shape) - 2, amount)] if amount > 1 else []
            variants.append([*_without(opts, "upcast"), *rows])
    if kernel.reduce_shape:
        depth = len(kernel.reduce_shape) - 1
        others = [opt for opt in opts if not (opt.action == "unroll" and opt.axis == depth)]
        variants.append(others)
        variants += [[*others, Opt("unroll", depth, amount)] for amount in UNROLLS]
    variants.append(_without(opts, "vectorize"))
    variants += [[*_without(opts, "vectorize"), Opt("vectorize", 0, width)] for width in WIDTHS]
    if kernel.shape and kernel.shape[0] > 1:
        variants.append(_without(opts, "thread"))
        threads = min(optimizer_target().thread_count(), kernel.shape[0])
        if threads > 1:
            variants.append([*_without(opts, "thread"), Opt("thread", 0, threads)])
    found: list[tuple[Opt, ...]] = []
    for variant in variants:
        candidate = canonical(variant)
        if candidate == opts or candidate in found:
            continue
        try:
            check_opts(kernel, candidate)
        except ValueError:
            continue
        found.append(candidate)
    return found


def random_inputs(kernel: Kernel, seed: int = 0) -> list[np.ndarray]:
    """Inputs to time a kernel on: small floats (uniform in [-1, 1)), integers and bools 0, so
    that any index computed from them stays in range."""
    rng = np.random.default_rng(seed)
    arrays = []
    for aval in kernel.in_avals:
        if dtype_class(aval.dtype) in "fh":
            arrays.append(rng.uniform(-1, 1, aval.shape).astype(np.float32).astype(aval.dtype))
        else:
            arrays.append(np.zeros(aval.shape, aval.dtype))
    return arrays


def outputs_match(got: Sequence[np.ndarray], want: Sequence[np.ndarray], reduce_length: int) -> bool:
    """Equal ints and bools; floats within ~16 ulps per reduced value (NaNs equal)."""
    for a, b in zip(got, want):
        if dtype_class(a.dtype) in "fh":
            eps = float(ml_dtypes.finfo(a.dtype).eps)
            tolerance = 16 * eps * max(1, reduce_length)
            wide, reference = a.astype(np.float64), b.astype(np.float64)
            finite = reference[np.isfinite(reference)]
            scale = max(1.0, float(np.abs(finite).max())) if finite.size else 1.0
            if not np.allclose(wide, reference, rtol=tolerance, atol=tolerance * scale, equal_nan=True):
                return False
        elif not np.array_equal(a, b):
            return False
    return True


def compile_for_timing(kernel: Kernel) -> Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]:
    """Compile a candidate (at the optimisation level the kernel will really get) without
    touching the device's caches (``OptimizerTarget.compile_for_timing``)."""
    compiled: Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None] = \
        optimizer_target().compile_for_timing(kernel)
    return compiled


def _time(run: Callable[[], None], timer: Callable[[], float], limit: float = float("inf")) -> float:
    """The best of TIMING_RUNS runs after a warm-up run (page faults, thread pool); a candidate
    whose warm-up already takes over ``limit`` seconds is not run again (it has lost)."""
    started = timer()
    run()
    best = timer() - started
    if best > limit:
        return best
    for _ in range(TIMING_RUNS):
        started = timer()
        run()
        best = min(best, timer() - started)
    return best


PROBE_PARTS = 16  # a candidate is first run on 1/PROBE_PARTS of axis 0 to estimate its time


def _probe(compiled: Any, kernel: Kernel, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray],
           timer: Callable[[], float]) -> float:
    """The time of a full run estimated from a run over the first rows of axis 0 (one chunk, one
    thread), so a hopeless candidate (an i-j-k matmul: seconds) costs a fraction of that; 0.0 when
    ``compiled`` is not a CompiledKernel or axis 0 is short."""
    function = getattr(compiled, "function", None)
    outer = kernel.shape[0] if kernel.shape else 1
    if function is None or outer < PROBE_PARTS:
        return 0.0
    rows = outer // PROBE_PARTS
    pointers = [array.__array_interface__["data"][0] for array in (*outputs, *inputs)]
    started = timer()
    function(*pointers, 0, rows)
    return (timer() - started) * outer / rows / max(1, getattr(compiled, "threads", 1))


def beam_search(kernel: Kernel, width: int, budget_s: float | None = None, *,
                compile: Callable[[Kernel], Any] = compile_for_timing,
                timer: Callable[[], float] = time.perf_counter) -> tuple[Opt, ...]:
    """The fastest opts found for ``kernel`` by a beam search of ``width``, within ``budget_s``
    seconds (``FUNCGRAD_BEAM_BUDGET``); a stored choice is returned without searching, and a new
    one is stored. Small kernels (compiled unoptimised) keep the heuristics. A register-tiled
    kernel's tile is one candidate, searched beside the plain loops (the tile itself is not varied).

    >>> beam_search(kernel, width=2, budget_s=5.0)  # doctest: +SKIP
    (Opt(action='reorder', ...), Opt(action='upcast', axis=0, amount=4), Opt(action='unroll', ...))
    """
    if width < 1:
        raise ValueError(f"beam_search: width must be >= 1, got {width}")
    kernel = attrs.evolve(kernel, opts=None)
    stored = cached_opts(kernel)
    if stored is not None:
        return stored
    base = heuristic_opts(kernel)
    iterations = int(np.prod(kernel.shape)) * max(1, int(np.prod(kernel.reduce_shape)))
    if iterations < optimizer_target().small_kernel_work:
        return base
    budget = beam_budget() if budget_s is None else budget_s
    deadline = timer() + budget
    inputs = random_inputs(kernel)
    reduce_length = int(np.prod(kernel.reduce_shape))

    runners: dict[tuple[Opt, ...], Callable[[], None]] = {}

    def measure(opts: tuple[Opt, ...], limit: float = float("inf")) -> tuple[float, list[np.ndarray] | None]:
        """(seconds, outputs); outputs None when a probe of a few rows shows the candidate has lost."""
        compiled = compile(attrs.evolve(kernel, opts=opts))
        outputs = [np.empty(aval.shape, aval.dtype) for aval in kernel.out_avals]
        estimate = _probe(compiled, kernel, inputs, outputs, timer)
        if estimate > limit:
            return estimate, None
        runners[opts] = lambda: compiled(inputs, outputs)
        return _time(runners[opts], timer, limit), outputs

    base_seconds, base_outputs = measure(base)
    assert base_outputs is not None
    reference = base_outputs
    beam: list[tuple[float, tuple[Opt, ...]]] = [(base_seconds, base)]
    seen, tried, rejected = {base}, 0, 0
    plain = heuristic_opts(kernel, tile=False)
    extra = [plain] if plain != base else []  # a register tile's alternative: the plain loops
    while timer() < deadline:
        fresh = extra + [c for _, opts in beam for c in neighbours(kernel, opts) if c not in seen and c not in extra]
        extra = []
        if not fresh:
            break
        timed = []
        for candidate in fresh:
            if timer() >= deadline:
                break
            seen.add(candidate)
            tried += 1
            try:
                seconds, outputs = measure(candidate, SLOW_CANDIDATE * beam[0][0])
            except (RuntimeError, ValueError) as error:
                rejected += 1
                if debug_level() >= 2:
                    print(f"BEAM {kernel.name}: {' '.join(map(str, candidate))} failed: {error}", file=sys.stderr)
                continue
            if outputs is None:
                continue  # far slower than the best (a probe of a few rows said so)
            if not outputs_match(outputs, reference, reduce_length):
                rejected += 1
                if debug_level() >= 2:
                    print(f"BEAM {kernel.name}: {' '.join(map(str, candidate))} rejected: outputs differ",
                          file=sys.stderr)
                continue
            timed.append((seconds, candidate))
            if debug_level() >= 3:
                print(f"BEAM {kernel.name}: {seconds * 1e3:9.3f} ms [{' '.join(map(str, candidate)) or 'none'}]",
                      file=sys.stderr)
        next_beam = sorted(beam + timed, key=lambda entry: entry[0])[:width]
        if next_beam[0][1] == beam[0][1] and all(entry in beam for entry in next_beam):
            break  # nothing better this round
        beam = next_beam
    best_seconds, best = beam[0]
    if best != base:  # time the winner against the heuristic once more, alternately: noise must not win
        base_seconds = min(base_seconds, _time(runners[base], timer))
        best_seconds = min(best_seconds, _time(runners[best], timer))
        if best_seconds > CONFIRM_MARGIN * base_seconds:
            best_seconds, best = base_seconds, base
    _store(kernel, best, best_seconds, base_seconds)
    if debug_level() >= 2:
        print(f"BEAM {kernel.name}: {tried} candidates ({rejected} rejected), best {best_seconds * 1e3:.3f} ms "
              f"[{' '.join(map(str, best)) or 'none'}] vs heuristic {base_seconds * 1e3:.3f} ms "
              f"[{' '.join(map(str, base)) or 'none'}]: {base_seconds / max(best_seconds, 1e-12):.2f}x",
              file=sys.stderr)
    return best
