"""The OpenCL device (``CL``): kernels rendered to OpenCL C (funcgrad/lower/render_c.py) and run
through pyopencl, on whatever OpenCL platform is installed (PoCL on a CPU here, a GPU elsewhere).

    Kernels of a plan --render_opencl--> one OpenCL C program --clBuildProgram (once per plan;
    pyopencl and the driver cache binaries on disk)--> one cl.Kernel per kernel

The device keeps values in its own memory (``resident``): a plan uploads its inputs once, keeps
intermediates in device buffers and downloads its outputs (funcgrad/lower/plan.py). float64 needs
``cl_khr_fp64``; float16 and bfloat16 are stored as 16-bit patterns and computed in float32, so they
need no extension. A build failure raises ``KernelCompileError`` with the compiler's log.
``FUNCGRAD_CL_DEVICE`` (a substring of the device name) picks among several devices.
"""

from __future__ import annotations

import glob
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.ir.core import ShapedArray
from funcgrad.lower.device import Device, Transfers, check_copy
from funcgrad.lower.kernel import Kernel, UnsupportedDtypeError
from funcgrad.lower.render_c import WORK_GROUP, kernel_function_name, render_opencl
from funcgrad.util.caches import LRUCache, cache_size
from funcgrad.util.debug import debug_level

__all__ = ["OpenCLDevice", "CLKernel", "KernelCompileError", "probe", "preferred"]


class KernelCompileError(RuntimeError):
    """An OpenCL program failed to build; the message holds the compiler's log."""


class Float64UnsupportedError(KernelCompileError, UnsupportedDtypeError):
    """The OpenCL device has no cl_khr_fp64."""


def _choose_device() -> Any:
    import pyopencl as cl
    found = [device for platform in cl.get_platforms() for device in platform.get_devices()]
    if not found:
        raise RuntimeError("OpenCL platforms are installed but offer no device")
    wanted = os.environ.get("FUNCGRAD_CL_DEVICE")
    if wanted:
        matching = [d for d in found if wanted.lower() in d.name.lower()]
        if not matching:
            raise RuntimeError(f"FUNCGRAD_CL_DEVICE={wanted!r} matches none of {[d.name for d in found]}")
        return matching[0]
    gpus = [d for d in found if d.type & cl.device_type.GPU]
    return (gpus or found)[0]


def probe() -> tuple[bool, str]:
    """(usable, why): pyopencl installed, a platform with a device."""
    try:
        import pyopencl  # noqa: F401
    except ImportError as error:
        return False, f"pyopencl is not installed ({error}); pip install pyopencl"
    try:
        device = _choose_device()
    except Exception as error:  # noqa: BLE001 - pyopencl raises its own types for a missing ICD
        return False, f"no OpenCL platform or device ({type(error).__name__}: {error}); install an ICD such " \
                      "as pocl-opencl-icd"
    return True, f"{device.name.strip()} ({device.platform.name.strip()}, {device.version.strip()})"


# where Linux drivers expose GPUs: DRM render nodes, NVIDIA, AMD's compute node, Mali, Adreno
_GPU_DEVICE_FILES = ("/dev/dri/renderD*", "/dev/nvidia[0-9]*", "/dev/kfd", "/dev/mali*", "/dev/kgsl*")


def preferred() -> bool:
    """OpenCL is the default device only on a GPU (on a CPU, the LLVM device is faster). Linux
    without a GPU device file answers without loading the OpenCL runtime (PoCL alone maps ~55 MB
    of LLVM and clang into the process)."""
    if sys.platform.startswith("linux") and not any(glob.glob(pattern) for pattern in _GPU_DEVICE_FILES):
        return False
    import pyopencl as cl
    return bool(_choose_device().type & cl.device_type.GPU)


class CLKernel:
    """One kernel of a built program. ``launch`` runs it on device buffers; calling it with NumPy
    arrays (``compiled(inputs, outputs)``, the generic device protocol) copies them in and out."""

    def __init__(self, device: OpenCLDevice, kernel: Kernel, handle: Any, group: int | None, source: str) -> None:
        self.device, self.kernel, self.handle, self.group, self.source = device, kernel, handle, group, source
        self.name = kernel.name
        self.size = int(np.prod(kernel.shape, dtype=np.int64))
        if group:
            self.global_size, self.local_size = self.size * group, group
        else:
            self.local_size = WORK_GROUP
            self.global_size = -(-self.size // WORK_GROUP) * WORK_GROUP

    def __repr__(self) -> str:
        return f"CLKernel({self.name})"

    def launch(self, inputs: Sequence[Any], outputs: Sequence[Any]) -> None:
        import pyopencl as cl
        if self.size == 0:
            return
        self.handle.set_args(*outputs, *inputs)
        cl.enqueue_nd_range_kernel(self.device.queue, self.handle, (self.global_size,), (self.local_size,))

    def __call__(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        if len(inputs) != len(self.kernel.in_avals) or len(outputs) != len(self.kernel.out_avals):
            raise ValueError(f"kernel {self.name} takes {len(self.kernel.in_avals)} inputs and "
                             f"{len(self.kernel.out_avals)} outputs, got {len(inputs)} and {len(outputs)}")
        device_outputs = [self.device.allocate(a) for a in self.kernel.out_avals]
        self.launch([self.device.upload(np.asarray(x)) for x in inputs], device_outputs)
        for target, buffer, aval in zip(outputs, device_outputs, self.kernel.out_avals):
            target[...] = self.device.download(buffer, aval)


def _bytes_of(array: np.ndarray) -> np.ndarray:
    """A C-contiguous array's memory as bytes (works for bfloat16 and bool, which have no buffer format)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8)


class OpenCLDevice(Device):
    """Compiles kernels to OpenCL C and runs them with pyopencl (see the module docstring)."""

    name = "CL"
    resident = True

    def __init__(self) -> None:
        import pyopencl as cl
        self.cl_device = _choose_device()
        self.context = cl.Context([self.cl_device])
        self.queue = cl.CommandQueue(self.context)
        self.fp64 = "cl_khr_fp64" in self.cl_device.extensions.split()
        # one program per plan, by source; its cl.Kernels hold it, so eviction never breaks a cached plan
        self.programs: LRUCache[str, Any] = LRUCache(cache_size("FUNCGRAD_PLAN_CACHE_SIZE", 1024))
        self.stats = {"builds": 0, "program_hits": 0}
        self.transfers: Transfers = Transfers()

    def __repr__(self) -> str:
        return f"OpenCLDevice({self.cl_device.name.strip()})"

    # --- memory ---
    def upload(self, array: np.ndarray) -> Any:
        import pyopencl as cl
        data = _bytes_of(array)
        if data.size == 0:
            return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, 1)
        self.transfers.upload(data.size)
        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE | cl.mem_flags.COPY_HOST_PTR, hostbuf=data)

    def allocate(self, aval: ShapedArray) -> Any:
        import pyopencl as cl
        size = int(np.prod(aval.shape, dtype=np.int64)) * np.dtype(aval.dtype).itemsize
        return cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(size, 1))

    def download(self, buffer: Any, aval: ShapedArray) -> np.ndarray:
        import pyopencl as cl
        out = np.empty(aval.shape, aval.dtype)
        if out.size:
            self.transfers.download(out.nbytes)
            cl.enqueue_copy(self.queue, out.reshape(-1).view(np.uint8), buffer, is_blocking=True)
        return out

    def copy_within(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        """``clEnqueueCopyBuffer`` on the device's in-order queue (ordered with the kernels, not waited
        for). Bounds are the buffers' allocated sizes (an empty array's buffer holds 1 byte)."""
        import pyopencl as cl
        check_copy("CL", src.size, src_offset, dst.size, dst_offset, nbytes)
        if nbytes:  # OpenCL refuses a copy of 0 bytes
            self.transfers.copy(nbytes)
            cl.enqueue_copy(self.queue, dst, src, src_offset=src_offset, dst_offset=dst_offset, byte_count=nbytes)

    def synchronize(self) -> None:
        self.queue.finish()

    # --- compiling ---
    def supports(self, dtype: Any) -> bool:
        """Whether kernels here can use ``dtype`` (float64 needs cl_khr_fp64; the rest always works)."""
        return self.fp64 or np.dtype(dtype) != np.float64

    def check_dtypes(self, kernel: Kernel) -> None:
        if self.fp64:
            return
        for aval in (*kernel.in_avals, *kernel.out_avals):
            if np.dtype(aval.dtype) == np.float64:
                raise Float64UnsupportedError(f"kernel {kernel.name}: the OpenCL device "
                                              f"{self.cl_device.name.strip()} does not support float64 "
                                              "(no cl_khr_fp64); use float32")

    def render(self, kernel: Kernel) -> str:
        """The OpenCL C source of one kernel (what DEBUG=4 and ``Tensor.schedule()`` show)."""
        return render_opencl([kernel])[0]

    def compile(self, kernel: Kernel) -> CLKernel:
        return self.compile_many([kernel])[0]

    def compile_many(self, kernels: Sequence[Kernel]) -> list[CLKernel]:
        """Every kernel of a plan in one program: one build, however many kernels."""
        import pyopencl as cl
        if not kernels:
            return []
        for kernel in kernels:
            self.check_dtypes(kernel)
        names = [f"k{position}_{kernel_function_name(kernel)}" for position, kernel in enumerate(kernels)]
        try:
            source, groups = render_opencl(kernels, names)
        except (ValueError, KeyError, TypeError) as error:
            raise KernelCompileError(f"kernels {', '.join(k.name for k in kernels)} cannot be rendered "
                                     f"as OpenCL C: {error}") from error
        if debug_level() >= 4:
            print(f"--- OpenCL C source ---\n{source}", file=sys.stderr)
        program = self.programs.get(source)
        if program is None:
            started = time.perf_counter()
            try:
                program = cl.Program(self.context, source).build()
            except (cl.RuntimeError, cl.LogicError) as error:
                detail = f"\n{source}" if debug_level() >= 4 else "\n(DEBUG=4 shows the source)"
                raise KernelCompileError(f"OpenCL build of {', '.join(k.name for k in kernels)} failed: "
                                         f"{error}{detail}") from error
            self.stats["builds"] += 1
            if debug_level() >= 3:
                print(f"OpenCL program of {len(kernels)} kernels built in {time.perf_counter() - started:.3f} s",
                      file=sys.stderr)
            program = self.programs.put(source, program)
        else:
            self.stats["program_hits"] += 1
        return [CLKernel(self, kernel, cl.Kernel(program, name), group, source)
                for kernel, name, group in zip(kernels, names, groups)]
