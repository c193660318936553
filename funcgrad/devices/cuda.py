"""The CUDA device: kernels rendered to CUDA C (funcgrad/lower/render_cuda.py), compiled by nvcc and run
through pycuda's driver API.

    Kernel --render_cuda--> CUDA C --nvcc -cubin -arch=sm_XY--> cubin --cuModuleLoadData--> function
    plan: host arrays --memcpy HtoD--> device buffers --launch(grid, block)...--> memcpy DtoH --> outputs

The device is resident: a plan uploads its inputs once, keeps intermediates in device memory and
copies back only outputs and what host steps need. Buffers hold the same bytes as the NumPy arrays
(bool as one byte, float16/bfloat16 as 16-bit patterns), so nothing is converted on the way.
Modules are cached by source. ``compile_cuda`` (nvcc to PTX or cubin, failing with nvcc's log)
needs no driver, which is how the renderer is tested on machines without a GPU. ``probe()``
reports "pycuda not installed" or "no CUDA driver" when the runtime cannot start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from funcgrad.ir.core import ShapedArray
from funcgrad.lower.device import Device, Transfers, check_copy
from funcgrad.lower.kernel import Kernel
from funcgrad.lower.plan import run_on_host_arrays
from funcgrad.lower.render_c import kernel_function_name
from funcgrad.lower.render_cuda import render_cuda
from funcgrad.util.debug import debug_level

__all__ = ["CUDADevice", "CUDAKernel", "CUDAArray", "CUDAError", "compile_cuda", "nvcc_path", "ptxas_report", "probe",
           "BLOCK_SIZE"]

BLOCK_SIZE = 256  # threads per block for one-output-per-thread kernels


class CUDAError(RuntimeError):
    """A kernel failed to compile (the message holds nvcc's log) or to launch on CUDA."""


def nvcc_path() -> str | None:
    """nvcc on PATH, else under ``$CUDA_HOME``/``$CUDA_PATH``/``/usr/local/cuda``."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.path.exists(os.path.join(root, "bin", "nvcc")):
            return os.path.join(root, "bin", "nvcc")
    return None


def compile_cuda(source: str, arch: str = "sm_90", output: str = "ptx") -> bytes:
    """Compile CUDA C with nvcc to ``output`` ('ptx' or 'cubin') for ``arch``; raises ``CUDAError``
    with nvcc's log on failure.

    >>> ptx = compile_cuda(render_cuda([kernel])[0])  # doctest: +SKIP
    """
    nvcc = nvcc_path()
    if nvcc is None:
        raise CUDAError("nvcc not found (install the CUDA toolkit or set CUDA_HOME)")
    with tempfile.TemporaryDirectory(prefix="funcgrad-cuda-") as folder:
        source_path = os.path.join(folder, "kernels.cu")
        target_path = os.path.join(folder, f"kernels.{output}")
        with open(source_path, "w") as handle:
            handle.write(source)
        command = [nvcc, f"-{output}", f"-arch={arch}", "-O3", source_path, "-o", target_path]
        finished = subprocess.run(command, capture_output=True, text=True)
        if finished.returncode != 0:
            raise CUDAError(f"nvcc failed ({' '.join(command[1:4])}):\n{finished.stderr}{finished.stdout}")
        with open(target_path, "rb") as handle:
            return handle.read()


def ptxas_report(ptx: bytes, arch: str = "sm_90") -> str:
    """ptxas's resource report (registers, shared memory, spills per kernel) for PTX text."""
    ptxas = shutil.which("ptxas") or (os.path.join(os.path.dirname(nvcc_path() or ""), "ptxas"))
    with tempfile.TemporaryDirectory(prefix="funcgrad-ptxas-") as folder:
        path = os.path.join(folder, "kernels.ptx")
        with open(path, "wb") as handle:
            handle.write(ptx)
        finished = subprocess.run([ptxas, f"-arch={arch}", "-v", path, "-o", os.path.join(folder, "kernels.cubin")],
                                  capture_output=True, text=True)
    if finished.returncode != 0:
        raise CUDAError(f"ptxas failed:\n{finished.stderr}")
    return finished.stderr


def probe() -> tuple[bool, str]:
    """(usable, reason): pycuda imports, the driver starts and sees a device, nvcc is there."""
    try:
        import pycuda.driver as driver
    except ImportError as error:
        return False, f"pycuda not installed ({error})"
    try:
        driver.init()
        count = driver.Device.count()
    except Exception as error:  # noqa: BLE001 - pycuda raises its own errors for a missing driver
        return False, f"no CUDA driver ({error})"
    if count == 0:
        return False, "no CUDA device"
    if nvcc_path() is None:
        return False, "nvcc not found (kernels are compiled with it)"
    return True, driver.Device(0).name()


class CUDAKernel:
    """A kernel loaded into the device's context; ``compiled(inputs, outputs)`` runs it."""

    def __init__(self, device: CUDADevice, kernel: Kernel, source: str, function: Any, block: int | None) -> None:
        self.device = device
        self.kernel = kernel
        self.name = kernel.name
        self.source = source
        self.function = function
        self.size = int(np.prod(kernel.shape, dtype=np.int64))
        self.local_block = block  # a block per output (shared-memory reduction), or None

    def __repr__(self) -> str:
        return f"CUDAKernel({self.name})"

    def launch_shape(self) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
        """(grid, block): a block per output for a shared-memory reduction, else one thread each."""
        if self.local_block is not None:
            return (self.size, 1, 1), (self.local_block, 1, 1)
        return (-(-self.size // BLOCK_SIZE), 1, 1), (BLOCK_SIZE, 1, 1)

    def __call__(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        run_on_host_arrays(self, inputs, outputs, contiguous=True)

    def launch(self, inputs: Sequence[CUDAArray], outputs: Sequence[CUDAArray]) -> None:
        """Run on device buffers (from ``CUDADevice.upload``/``allocate``), asynchronously."""
        if self.size == 0:
            return
        import pycuda.driver as driver
        grid, block = self.launch_shape()
        with self.device.active():
            try:
                self.function(*(a.allocation for a in (*outputs, *inputs)), grid=grid, block=block)
            except driver.Error as error:
                raise CUDAError(f"kernel {self.name} failed on CUDA: {error}") from error


@attrs.frozen
class CUDAArray:
    """A value in device memory: an allocation holding the array's bytes, as NumPy lays them out."""

    allocation: Any
    nbytes: int


class CUDADevice(Device):
    """Runs kernels on the first CUDA GPU (see the module docstring).

    >>> device = CUDADevice()  # doctest: +SKIP
    >>> compiled = device.compile(kernel); compiled(inputs, outputs)  # doctest: +SKIP
    """

    name = "CUDA"
    resident = True  # plans keep intermediates in device memory (funcgrad/lower/plan.py)

    def __init__(self, ordinal: int = 0) -> None:
        ok, reason = probe()
        if not ok:
            raise CUDAError(f"CUDA is not available: {reason}")
        import pycuda.driver as driver
        self.gpu = driver.Device(ordinal)
        major, minor = self.gpu.compute_capability()
        self.arch = f"sm_{major}{minor}"
        self.context = self.gpu.retain_primary_context()
        self.lock = threading.Lock()
        self.modules: dict[str, Any] = {}
        self.stats = {"compiled": 0, "cached": 0}
        self.transfers: Transfers = Transfers()

    def __repr__(self) -> str:
        return f"CUDADevice({self.gpu.name()}, {self.arch})"

    def active(self) -> _ActiveContext:
        return _ActiveContext(self)

    # --- device memory (the plan's resident protocol); copies go as bytes, since NumPy cannot export
    # bfloat16 (an ml_dtypes type) through the buffer protocol
    def upload(self, array: np.ndarray) -> CUDAArray:
        import pycuda.driver as driver
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        with self.active():
            allocation = driver.mem_alloc(max(1, data.nbytes))
            if data.nbytes:
                self.transfers.upload(data.nbytes)
                driver.memcpy_htod(allocation, data)
        return CUDAArray(allocation, data.nbytes)

    def allocate(self, aval: ShapedArray) -> CUDAArray:
        import pycuda.driver as driver
        nbytes = int(np.prod(aval.shape, dtype=np.int64)) * aval.dtype.itemsize
        with self.active():
            return CUDAArray(driver.mem_alloc(max(1, nbytes)), nbytes)

    def download(self, array: CUDAArray, aval: ShapedArray) -> np.ndarray:
        import pycuda.driver as driver
        out = np.empty(aval.shape, aval.dtype)
        if array.nbytes:
            self.transfers.download(array.nbytes)
            with self.active():
                driver.memcpy_dtoh(out.reshape(-1).view(np.uint8), array.allocation)
        return out

    def copy_within(self, src: CUDAArray, src_offset: int, dst: CUDAArray, dst_offset: int, nbytes: int) -> None:
        """``cuMemcpyDtoD`` (pycuda's ``memcpy_dtod``) between device pointers offset into the two
        allocations: on the default stream, so ordered with the kernels. Bounds are the arrays' ``nbytes``;
        any byte alignment is allowed. (Not yet run on a GPU: tests run it against a stand-in driver.)"""
        import pycuda.driver as driver
        check_copy("CUDA", src.nbytes, src_offset, dst.nbytes, dst_offset, nbytes)
        if nbytes:
            self.transfers.copy(nbytes)
            with self.active():
                try:
                    driver.memcpy_dtod(int(dst.allocation) + dst_offset, int(src.allocation) + src_offset, nbytes)
                except driver.Error as error:
                    raise CUDAError(f"CUDA copy_within of {nbytes} bytes failed: {error}") from error

    def synchronize(self) -> None:
        import pycuda.driver as driver
        with self.active():
            driver.Context.synchronize()

    def render(self, kernel: Kernel) -> str:
        """The kernel's CUDA C source (what ``compile`` compiles and DEBUG=4 prints)."""
        try:
            return render_cuda([kernel])[0]
        except (ValueError, KeyError) as error:
            raise CUDAError(f"kernel {kernel.name} cannot be rendered for CUDA: {error}") from error

    def compile(self, kernel: Kernel) -> CUDAKernel:
        import pycuda.driver as driver
        source, (block,) = render_cuda([kernel])
        if debug_level() >= 4:
            print(f"--- CUDA source of kernel {kernel.name} ---\n{source}", file=sys.stderr)
        module = self.modules.get(source)
        if module is None:
            try:
                cubin = compile_cuda(source, self.arch, "cubin")
            except CUDAError as error:
                raise CUDAError(f"kernel {kernel.name} failed to compile: {error}") from error
            with self.active():
                module = driver.module_from_buffer(cubin)
            self.modules[source] = module
            self.stats["compiled"] += 1
        else:
            self.stats["cached"] += 1
        with self.active():
            function = module.get_function(kernel_function_name(kernel))
        return CUDAKernel(self, kernel, source, function, block)


class _ActiveContext:
    """Makes the device's context current on this thread for a block of driver calls."""

    def __init__(self, device: CUDADevice) -> None:
        self.device = device

    def __enter__(self) -> None:
        self.device.lock.acquire()
        self.device.context.push()

    def __exit__(self, *exc: object) -> None:
        import pycuda.driver as driver
        try:
            driver.Context.pop()
        finally:
            self.device.lock.release()
