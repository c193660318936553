"""The REFERENCE device: kernels run by the NumPy kernel evaluator (``funcgrad.lower.kernel.evaluate_kernel``),
the oracle the compiled devices are tested against."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from funcgrad.lower.device import CompiledKernel, Device
from funcgrad.lower.kernel import Kernel, evaluate_kernel


class ReferenceDevice(Device):
    """Runs kernels with the NumPy kernel evaluator (for tests and as a fallback)."""

    name = "REFERENCE"

    def compile(self, kernel: Kernel) -> CompiledKernel:
        def run(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
            for out, value in zip(outputs, evaluate_kernel(kernel, inputs)):
                out[...] = value
        return run
