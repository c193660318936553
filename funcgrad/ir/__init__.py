"""The IR layer: abstract values, the IR data structures, the primitive registry, the tracer and the
reference interpreter. It imports nothing else of funcgrad."""
