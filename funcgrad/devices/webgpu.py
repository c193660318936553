"""The WEBGPU device: kernels rendered to WGSL (funcgrad/lower/render_wgsl.py) and run through wgpu-py.

    Kernel --render_wgsl--> WGSL --(pipeline cache | create_shader_module + compute pipeline)-->
    pipeline; call: host arrays --storage dtype--> storage buffers --dispatch--> read back --> outputs

Inputs are converted to their storage dtype on the host (bool -> u32, int8 -> i32, float16 -> f32, ...,
see ``render_wgsl.storage_dtype``) and uploaded; outputs are read back and converted to their dtype.
Before a launch the buffer sizes are checked against the device's ``max_storage_buffer_binding_size``;
a kernel with more arrays than ``max_storage_buffers_per_shader_stage`` packs them into one binding
per storage type (``render_wgsl.buffer_layout``). A dispatch over more than 65535
workgroups is split into a 2-D grid. Pipelines are cached by shader source.

The adapter: ``request_adapter_sync(power_preference="high-performance")``, which prefers Vulkan
(lavapipe on a machine without a GPU) over OpenGL. ``XDG_RUNTIME_DIR`` is pointed at a private
0700 folder when unset, which silences harmless warnings of the Mesa drivers.
"""

from __future__ import annotations

import math
import os
import sys
import tempfile
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from funcgrad.ir.core import ShapedArray
from funcgrad.lower.device import Device, Transfers, check_copy
from funcgrad.lower.kernel import Kernel
from funcgrad.lower.plan import run_on_host_arrays
from funcgrad.lower.render_wgsl import (
    WORKGROUP_SIZE,
    BufferLayout,
    WGSLUnsupportedError,
    buffer_layout,
    render_wgsl,
    storage_dtype,
)
from funcgrad.util.caches import LRUCache, cache_size
from funcgrad.util.debug import debug_level

__all__ = ["WebGPUDevice", "WebGPUKernel", "WebGPUError", "probe", "MAX_WORKGROUPS_PER_DIMENSION"]

MAX_WORKGROUPS_PER_DIMENSION = 65535


class WebGPUError(RuntimeError):
    """A kernel cannot be compiled or launched on WEBGPU (the message names the kernel, the limit or
    the device's own compiler message)."""


def _buffer_usage() -> Any:
    import wgpu
    return wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC | wgpu.BufferUsage.COPY_DST


def _quiet_runtime_dir() -> None:
    if not os.environ.get("XDG_RUNTIME_DIR"):
        folder = os.path.join(tempfile.gettempdir(), f"funcgrad-xdg-{os.getuid()}")
        os.makedirs(folder, mode=0o700, exist_ok=True)
        os.environ["XDG_RUNTIME_DIR"] = folder


def _request_adapter() -> Any:
    _quiet_runtime_dir()
    import wgpu
    return wgpu.gpu.request_adapter_sync(power_preference="high-performance")


def probe() -> tuple[bool, str]:
    """(usable, reason): can wgpu be imported and give an adapter?"""
    try:
        import wgpu  # noqa: F401
    except ImportError:
        return False, "wgpu not installed (pip install wgpu)"
    try:
        adapter = _request_adapter()
    except Exception as error:  # noqa: BLE001 - wgpu-native reports a missing driver in several ways
        return False, f"no WebGPU adapter ({error})"
    info = adapter.info
    return True, f"{info.get('device', '?')} via {info.get('backend_type', '?')}"


@attrs.frozen
class GPUArray:
    """A value in device memory: a storage buffer of ``size`` 32-bit words (see ``storage_dtype``)."""

    buffer: Any
    size: int


class WebGPUKernel:
    """A kernel compiled to a compute pipeline; ``compiled(inputs, outputs)`` runs it, writing into
    the preallocated ``outputs``."""

    def __init__(self, device: WebGPUDevice, kernel: Kernel, layout: BufferLayout, source: str, pipeline: Any) -> None:
        self.device = device
        self.kernel = kernel
        self.layout = layout
        self.name = kernel.name
        self.source = source
        self.pipeline = pipeline
        self.size = int(np.prod(kernel.shape, dtype=np.int64))

    def __repr__(self) -> str:
        return f"WebGPUKernel({self.name})"

    def __call__(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
        run_on_host_arrays(self, inputs, outputs, contiguous=False)

    def launch(self, inputs: Sequence[GPUArray], outputs: Sequence[GPUArray]) -> None:
        """Run on device buffers (from ``WebGPUDevice.upload``/``allocate``); the work is queued,
        not waited for. Packed bindings are gathered and scattered with buffer copies on the GPU."""
        if self.size == 0:
            return
        gpu = self.device.gpu
        limit = self.device.max_binding_size
        encoder = gpu.create_command_encoder()
        bound = []
        for binding in self.layout.bindings:
            nbytes = binding.size * 4
            if nbytes > limit:
                held = ", ".join(f"{'output' if binding.writable else 'input'} {m} "
                                 f"{(self.kernel.out_avals if binding.writable else self.kernel.in_avals)[m]}"
                                 for m in binding.members)
                verb = "needs" if len(binding.members) == 1 else "need"
                raise WebGPUError(f"kernel {self.name}: {held} {verb} a {nbytes}-byte storage buffer, over the "
                                  f"device's max_storage_buffer_binding_size of {limit} bytes")
            arrays = outputs if binding.writable else inputs
            if len(binding.members) == 1:
                bound.append(arrays[binding.members[0]].buffer)
                continue
            packed = gpu.create_buffer(size=max(4, nbytes), usage=_buffer_usage())
            if not binding.writable:
                for member, offset in zip(binding.members, binding.offsets):
                    if inputs[member].size:
                        encoder.copy_buffer_to_buffer(inputs[member].buffer, 0, packed, offset * 4,
                                                      inputs[member].size * 4)
            bound.append(packed)
        entries = [{"binding": n, "resource": {"buffer": buffer, "offset": 0, "size": buffer.size}}
                   for n, buffer in enumerate(bound)]
        bind_group = gpu.create_bind_group(layout=self.pipeline.get_bind_group_layout(0), entries=entries)
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(self.pipeline)
        compute.set_bind_group(0, bind_group)
        compute.dispatch_workgroups(*dispatch_grid(self.size))
        compute.end()
        for binding, packed in zip(self.layout.bindings, bound):
            if binding.writable and len(binding.members) > 1:
                for member, offset in zip(binding.members, binding.offsets):
                    if outputs[member].size:
                        encoder.copy_buffer_to_buffer(packed, offset * 4, outputs[member].buffer, 0,
                                                      outputs[member].size * 4)
        gpu.queue.submit([encoder.finish()])


def dispatch_grid(size: int) -> tuple[int, int, int]:
    """Workgroups (x, y, 1) covering ``size`` invocations; 2-D past 65535 groups (the shader
    computes ``gid.x + gid.y * groups.x * WORKGROUP_SIZE`` and skips positions past the end)."""
    groups = max(1, math.ceil(size / WORKGROUP_SIZE))
    if groups <= MAX_WORKGROUPS_PER_DIMENSION:
        return groups, 1, 1
    rows = math.ceil(groups / MAX_WORKGROUPS_PER_DIMENSION)
    return MAX_WORKGROUPS_PER_DIMENSION, rows, 1


SOFTWARE_MAX_REDUCTION = 32768  # values one invocation reduces on a Mesa software adapter (cap: 65,535 iterations)


class WebGPUDevice(Device):
    """Runs kernels as WGSL compute shaders (see the module docstring).

    >>> device = WebGPUDevice()  # doctest: +SKIP
    >>> compiled = device.compile(kernel); compiled(inputs, outputs)  # doctest: +SKIP
    """

    name = "WEBGPU"
    resident = True  # plans keep intermediates in device memory (funcgrad/lower/plan.py)

    def __init__(self) -> None:
        try:
            adapter = _request_adapter()
        except Exception as error:  # noqa: BLE001
            raise WebGPUError(f"WEBGPU is not available: no adapter ({error})") from error
        wanted = ("max_storage_buffer_binding_size", "max_buffer_size", "max_storage_buffers_per_shader_stage")
        limits = {name: adapter.limits[name.replace("_", "-")] for name in wanted}
        self.adapter = adapter
        self.gpu = adapter.request_device_sync(required_limits={k.replace("_", "-"): v for k, v in limits.items()})
        self.max_binding_size = int(min(limits["max_storage_buffer_binding_size"], limits["max_buffer_size"]))
        # Mesa's llvmpipe/lavapipe end a shader's loops after 65,535 iterations, silently: plans split
        # longer reductions in two kernels (funcgrad/lower/split_reductions.py)
        software = "llvmpipe" in str(adapter.info.get("device", "")).lower()
        self.max_reduction: int | None = SOFTWARE_MAX_REDUCTION if software else None
        self.max_buffers = int(limits["max_storage_buffers_per_shader_stage"])
        # by WGSL source; a kernel holds its pipeline, so eviction never breaks a cached plan
        self.pipelines: LRUCache[str, Any] = LRUCache(cache_size("FUNCGRAD_KERNEL_CACHE_SIZE", 4096))
        self._fence = self.gpu.create_buffer(size=4, usage=_buffer_usage())
        self.stats = {"compiled": 0, "cached": 0}
        self.transfers: Transfers = Transfers()

    def __repr__(self) -> str:
        info = self.adapter.info
        return f"WebGPUDevice({info.get('device', '?')} via {info.get('backend_type', '?')})"

    # --- device memory (the plan's resident protocol) ---
    def upload(self, array: np.ndarray) -> GPUArray:
        data = np.ascontiguousarray(array, dtype=storage_dtype(array.dtype)).reshape(-1)
        self.transfers.upload(data.nbytes)
        buffer = self.gpu.create_buffer_with_data(data=data if data.size else np.zeros(1, data.dtype),
                                                  usage=_buffer_usage())
        return GPUArray(buffer, data.size)

    def allocate(self, aval: ShapedArray) -> GPUArray:
        size = int(np.prod(aval.shape, dtype=np.int64))
        return GPUArray(self.gpu.create_buffer(size=max(4, size * 4), usage=_buffer_usage()), size)

    def download(self, array: GPUArray, aval: ShapedArray) -> np.ndarray:
        self.transfers.download(array.size * 4)
        raw = np.frombuffer(self.gpu.queue.read_buffer(array.buffer), storage_dtype(aval.dtype))[:array.size]
        return (raw != 0 if aval.dtype == np.bool_ else raw.astype(aval.dtype)).reshape(aval.shape)

    def copy_within(self, src: GPUArray, src_offset: int, dst: GPUArray, dst_offset: int, nbytes: int) -> None:
        """``copy_buffer_to_buffer`` in a command buffer of its own, submitted in order with the kernels.
        WebGPU requires the offsets and the size to be multiples of 4 bytes; an unaligned copy is refused
        (``ValueError``). Every element is stored as one 32-bit word here (``storage_dtype``), so copies of
        whole elements are always aligned. Bounds are the arrays' ``size`` words."""
        check_copy("WEBGPU", src.size * 4, src_offset, dst.size * 4, dst_offset, nbytes, alignment=4)
        if nbytes:
            self.transfers.copy(nbytes)
            encoder = self.gpu.create_command_encoder()
            encoder.copy_buffer_to_buffer(src.buffer, src_offset, dst.buffer, dst_offset, nbytes)
            self.gpu.queue.submit([encoder.finish()])

    def stored_itemsize(self, dtype: Any) -> int:
        """4: every dtype WEBGPU holds is stored as a 32-bit word (``render_wgsl.storage_dtype``)."""
        return int(storage_dtype(np.dtype(dtype)).itemsize)

    def synchronize(self) -> None:
        """Wait for the queued work (reading a buffer back waits for it; wgpu-py 0.32's
        ``on_submitted_work_done_sync`` fails on a callback signature)."""
        self.gpu.queue.read_buffer(self._fence)

    def render(self, kernel: Kernel) -> str:
        """The kernel's WGSL source (what ``compile`` compiles and DEBUG=4 prints)."""
        return self._render(kernel)[1]

    def _render(self, kernel: Kernel) -> tuple[BufferLayout, str]:
        try:
            layout = buffer_layout(kernel, self.max_buffers)
            return layout, render_wgsl(kernel, layout)
        except WGSLUnsupportedError as error:
            raise WebGPUError(f"kernel {kernel.name} cannot run on WEBGPU: {error}") from error
        except (ValueError, KeyError) as error:
            raise WebGPUError(f"kernel {kernel.name} cannot be rendered for WEBGPU: {error}") from error

    def compile(self, kernel: Kernel) -> WebGPUKernel:
        layout, source = self._render(kernel)
        if debug_level() >= 4:
            print(f"--- WGSL source of kernel {kernel.name} ---\n{source}", file=sys.stderr)
        pipeline = self.pipelines.get(source)
        if pipeline is None:
            pipeline = self.pipelines.put(source, self._build(kernel, source, layout))
            self.stats["compiled"] += 1
        else:
            self.stats["cached"] += 1
        return WebGPUKernel(self, kernel, layout, source, pipeline)

    def _build(self, kernel: Kernel, source: str, buffers: BufferLayout) -> Any:
        import wgpu
        layout_entries = [{"binding": n, "visibility": wgpu.ShaderStage.COMPUTE,
                           "buffer": {"type": wgpu.BufferBindingType.storage if binding.writable
                                      else wgpu.BufferBindingType.read_only_storage}}
                          for n, binding in enumerate(buffers.bindings)]
        try:
            module = self.gpu.create_shader_module(code=source)
            layout = self.gpu.create_pipeline_layout(
                bind_group_layouts=[self.gpu.create_bind_group_layout(entries=layout_entries)])
            return self.gpu.create_compute_pipeline(layout=layout, compute={"module": module, "entry_point": "main"})
        except Exception as error:  # noqa: BLE001 - wgpu raises GPUValidationError and friends
            detail = f"\n{source}" if debug_level() >= 4 else " (DEBUG=4 shows its WGSL source)"
            raise WebGPUError(f"kernel {kernel.name} failed to compile on WEBGPU: {error}{detail}") from error
