"""The IR layer: abstract values, the IR data structures, the primitive registry, the tracer and the
reference interpreter. It imports nothing else of funcgrad."""

from funcgrad.ir import higher_order as _higher_order  # noqa: F401  (registers jit and friends)
