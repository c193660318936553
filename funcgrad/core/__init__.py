"""The core layer: the Tensor box, ``bind`` (the one door to the primitives), ``evaluate`` and the
tracing entry points (``make_ir``, ``trace_flat``). It imports only ``funcgrad.ir`` and
``funcgrad.util``; outside a trace, ``bind`` hands each operation to the eager handler that
``funcgrad.lazy`` registers (``core.tensor.register_eager_handler``)."""
