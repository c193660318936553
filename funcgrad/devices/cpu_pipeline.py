"""The CPU's choice of LLVM pipeline for a kernel (``cpu_compiler.PIPELINES``)."""

from __future__ import annotations

import os

import numpy as np

from funcgrad.lower.kernel import Kernel

SMALL_KERNEL_WORK = 1 << 12  # loop iterations below which a kernel is compiled without optimisation
SHORT_REDUCTION = 6  # a register tile with a reduction loop shorter than this keeps LLVM's unroller
SHORT_REORDER = 32  # an i-k-j (reorder) kernel summing at most this many terms gets O2 (pipeline 2)
SMALL_ELEMENTWISE_WORK = 1 << 16  # kernels below this many loop iterations (elements x terms) get pipeline 4


def optimization_level(kernel: Kernel) -> int:
    """The LLVM pipeline for a kernel (``cpu_compiler.PIPELINES``); a kernel always gets the same
    one, so results stay deterministic.

    - 0 (no optimisation) for small kernels: O3 costs several times the LLVM time of no
      optimisation, which a kernel over a few thousand elements never earns back.
    - 5 (SROA, then code generation) for register tiles whose every loop the renderer wrote on
      vectors (``render_tile.explicitly_vectorised``: the MLP's products, their packing and
      epilogues): half the LLVM time of 4, the same speed and bits; and for elementwise float32
      loops the renderer wrote on vectors (``render_vector.vector_elementwise``: an Adam update):
      a quarter of the LLVM time of 3 or 4, the same bits.
    - 4 (O1 without LLVM's loop unroller) for other register tiles (a ``tile`` opt), which the renderer
      unrolled and vectorised itself: less LLVM time, the same speed and bits. Unless a
      reduction loop is shorter than SHORT_REDUCTION (a convolution's 3x3 or 5x5 window): at O3,
      whose unroller flattens those, they run faster.
    - 4 also for kernels of under SMALL_ELEMENTWISE_WORK loop iterations, elementwise (the CNN's
      weight updates and layout copies, 5-40 K elements: less LLVM time, about as fast a call, the
      same bits) or reducing (a cross-entropy's sums over 10 classes, a small weight's gradient:
      O3 unrolled and vectorised their short loops in 60-130 ms of LLVM each, 20-30 ms at 4, for
      calls of a few microseconds; O1 sums each output in term order).
    - 2 (O2) for plain loops in i-k-j order (a ``reorder`` opt) summing at most SHORT_REORDER
      terms: O3 fully unrolls the few passes over their stack rows into a lot of code (the CNN's
      10-term linear input gradient: several times O2's LLVM time, no faster). Each output
      element is still summed in term order, so the bits do not depend on how its row is vectorised.
    - 3 (O3) otherwise: plain loops need LLVM's unroller and vectorisers (a pooling window runs
      much slower without unrolling, and O2 made some elementwise kernels slower).

    The measured figures behind these choices are in docs/performance.md.

    ``FUNCGRAD_OPT=0`` or ``3`` gives every kernel that level."""
    forced = os.environ.get("FUNCGRAD_OPT")
    if forced in ("0", "3"):
        return int(forced)
    work = int(np.prod(kernel.shape, dtype=np.int64)) * max(1, int(np.prod(kernel.reduce_shape, dtype=np.int64)))
    if work < SMALL_KERNEL_WORK:
        return 0
    from funcgrad.lower.render_vector import vector_elementwise
    if vector_elementwise(kernel):
        return 5
    tiled = any(opt.action == "tile" for opt in kernel.opts or ())
    if tiled and not any(1 < length < SHORT_REDUCTION for length in kernel.reduce_shape):
        from funcgrad.lower.render_tile import explicitly_vectorised
        return 5 if explicitly_vectorised(kernel) else 4
    if work < SMALL_ELEMENTWISE_WORK:
        return 4
    if any(opt.action == "reorder" for opt in kernel.opts or ()) and int(np.prod(kernel.reduce_shape)) <= SHORT_REORDER:
        return 2
    return 3
