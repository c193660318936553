"""Devices: where kernels run. A device compiles a ``funcgrad.lower.kernel.Kernel`` into a callable
``compiled(inputs, outputs)`` that writes into preallocated C-contiguous arrays.

``cpu.CPUDevice`` (the default) renders kernels to LLVM IR (``funcgrad/lower/render_llvm.py``),
compiles them with llvmlite for the host CPU and caches the object code in memory and on disk.
"""
