"""The CPU's cost model: a kernel's estimated work, and how many threads it runs on by default
(the optimiser's ``thread`` opt)."""

from __future__ import annotations

import re

import numpy as np

from funcgrad.devices import cpu_threads
from funcgrad.ir.primitives import with_cost
from funcgrad.lower.kernel import Kernel, KExpr
from funcgrad.lower.optimize import optimize
from funcgrad.lower.render_loops import is_inline_math

# Estimated work above which a kernel is split across threads. Work is loop iterations (global x
# reduction) times the operations per iteration, with a transcendental function (a scalar libm
# call) counting as TRANSCENDENTAL_COST simple vectorized operations, and float32 exp, tanh, logistic
# and the log family (inline vector polynomials, render_loops.FLOAT32_OPS, an order of magnitude cheaper) as
# INLINE_TRANSCENDENTAL_COST. A thread hand-off costs far more than a short loop, and a memory-bound
# kernel gains little from a second core, so only large kernels go parallel (the measured hand-off
# and loop times, and the thresholds they give, are in docs/performance.md).
PARALLEL_MIN_WORK = 1 << 21
TRANSCENDENTAL_COST = 100
INLINE_TRANSCENDENTAL_COST = 10
TRANSCENDENTAL = {p.kernel_op for p in with_cost("transcendental", "transcendental_no_row_reuse", "float_call")}


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
    if estimated_work(kernel) < PARALLEL_MIN_WORK or outer < 2 or cpu_threads.thread_count() < 2:
        return 1
    return min(cpu_threads.thread_count(), outer)


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
