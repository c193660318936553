"""The Device protocol: everything a plan (``funcgrad.lower.plan``) asks of a device.

Lower never imports a device: the caller (lazy realize, the jit runtime) passes a device object in.
Devices (``funcgrad.devices``) subclass ``Device`` and override what they have; the defaults here
are what a device without that capability gets, so plans read every attribute directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import numpy as np

from funcgrad.ir.core import ShapedArray
from funcgrad.lower.kernel import Kernel

if TYPE_CHECKING:
    from funcgrad.lower.plan import PlanDiskCache


class CompiledKernel(Protocol):
    def __call__(self, inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None: ...


# the native loop driver's instructions (``Device.native_loop``; their meaning: devices/cpu_loop.py)
END, ROW, FLIP, CALL, POOL, COPY, LINK, EXIT = range(8)


class Device:
    """A place kernels run. ``name`` and ``compile`` are required; the rest have defaults.

    Scheduling switches (read when a plan is built):

    - ``max_reduction``: loop iterations one kernel invocation may run (None: no limit); longer
      reductions are split into several kernels (``split_reductions``), as a software GPU needs.
    - ``row_reductions``: the renderer computes a reduction fused into its row's pass once per row
      (``schedule._materialized``); False keeps such a reduction in its own kernel.
    - ``fuse_siblings``: plans merge sibling elementwise kernels (``funcgrad.lower.fuse``).

    Memory: ``resident`` devices keep values in their own memory and provide ``upload``,
    ``allocate``, ``download`` and ``synchronize``; their kernels have ``launch(inputs, outputs)``.
    One with ``copy_within`` (device-to-device bytes) runs control flow on its buffers
    (``lower/device_control.py``); ``stored_itemsize`` is the bytes an element takes in its memory, and
    ``transfers`` counts the host<->device traffic.

    Caches: ``memory_cache`` (anything with ``len``: compiled kernels kept in memory, counted by
    ``funcgrad.debug.live_counts``); ``plan_cache`` (a ``PlanDiskCache`` keeping whole plans on disk,
    or None) with ``load_cached(kernel, token)`` turning a stored kernel's ``cache_token`` back into a
    compiled kernel.
    """

    name: str = ""
    max_reduction: int | None = None
    row_reductions: bool = False
    fuse_siblings: bool = False
    resident: bool = False
    memory_cache: Any = ()
    plan_cache: PlanDiskCache | None = None

    def compile(self, kernel: Kernel) -> CompiledKernel:
        """``kernel`` compiled: ``compiled(inputs, outputs)`` writes into preallocated C-contiguous arrays."""
        raise NotImplementedError

    def compile_many(self, kernels: Sequence[Kernel]) -> list[Any]:
        """Every kernel of a plan compiled (a device may compile them together); by default one by one."""
        return [self.compile(kernel) for kernel in kernels]

    def render(self, kernel: Kernel) -> str:
        """The kernel's source as the device compiles it (``Tensor.schedule()``, DEBUG=4); by default its listing."""
        return str(kernel)

    def load_cached(self, kernel: Kernel, token: Any) -> Any:
        """The compiled kernel a stored plan names by ``token``; None when it is gone (it is compiled again)."""
        return None

    def native_loop(self) -> Any:
        """A driver running a loop of kernel launches in native code (``devices/cpu_loop.py``: ``run(table,
        program, steps)``), or None: compiled loops then drive their kernels from Python."""
        return None

    # --- resident devices ---
    transfers: Transfers | None = None  # a resident device's counts of what crosses between host and device

    def upload(self, array: np.ndarray) -> Any:
        raise NotImplementedError(f"{self.name} keeps no values of its own")

    def copy_within(self, src: Any, src_offset: int, dst: Any, dst_offset: int, nbytes: int) -> None:
        """Copy ``nbytes`` bytes from ``src`` (at byte ``src_offset``) to ``dst`` (at ``dst_offset``), both
        buffers of this device, without the host; queued in order with the kernels. Out-of-range copies
        raise ``ValueError`` naming the operation and the values (``check_copy``)."""
        raise NotImplementedError(f"{self.name} has no device-to-device copy")

    def stored_itemsize(self, dtype: Any) -> int:
        """The bytes one element of ``dtype`` takes in this device's buffers (offsets of ``copy_within``)."""
        return int(np.dtype(dtype).itemsize)

    def allocate(self, aval: ShapedArray) -> Any:
        raise NotImplementedError(f"{self.name} keeps no values of its own")

    def download(self, buffer: Any, aval: ShapedArray) -> np.ndarray:
        raise NotImplementedError(f"{self.name} keeps no values of its own")

    def synchronize(self) -> None:
        """Wait for launched work (DEBUG=2 times each step); nothing to wait for by default."""


@attrs.define
class Transfers:
    """What a resident device moved: host->device ``uploads`` and device->host ``downloads`` (calls and
    bytes), and device-to-device ``copies`` (``copy_within``; no host involved)."""

    uploads: int = 0
    upload_bytes: int = 0
    downloads: int = 0
    download_bytes: int = 0
    copies: int = 0
    copy_bytes: int = 0

    @property
    def host(self) -> int:
        """Host<->device transfers, both ways."""
        return self.uploads + self.downloads

    def upload(self, nbytes: int) -> None:
        self.uploads += 1
        self.upload_bytes += nbytes

    def download(self, nbytes: int) -> None:
        self.downloads += 1
        self.download_bytes += nbytes

    def copy(self, nbytes: int) -> None:
        self.copies += 1
        self.copy_bytes += nbytes

    def snapshot(self) -> Transfers:
        return attrs.evolve(self)


def check_copy(device: str, src_size: int, src_offset: int, dst_size: int, dst_offset: int, nbytes: int,
               alignment: int = 1) -> None:
    """Refuse a ``copy_within`` that reads or writes outside its buffers (of ``src_size`` and ``dst_size``
    bytes) or, with ``alignment``, whose offsets or size are not multiples of it; the message names the
    device, the operation and the values."""
    values = (f"src_offset={src_offset}, dst_offset={dst_offset}, nbytes={nbytes}, "
              f"source buffer {src_size} bytes, destination buffer {dst_size} bytes")
    if any(not isinstance(v, (int, np.integer)) or isinstance(v, bool) for v in (src_offset, dst_offset, nbytes)):
        raise TypeError(f"{device} copy_within: offsets and size must be integers ({values})")
    if src_offset < 0 or dst_offset < 0 or nbytes < 0:
        raise ValueError(f"{device} copy_within: negative offset or size ({values})")
    if src_offset + nbytes > src_size:
        raise ValueError(f"{device} copy_within: bytes [{src_offset}, {src_offset + nbytes}) are out of range of "
                         f"the source buffer ({values})")
    if dst_offset + nbytes > dst_size:
        raise ValueError(f"{device} copy_within: bytes [{dst_offset}, {dst_offset + nbytes}) are out of range of "
                         f"the destination buffer ({values})")
    if alignment > 1 and (src_offset % alignment or dst_offset % alignment or nbytes % alignment):
        raise ValueError(f"{device} copy_within: offsets and size must be multiples of {alignment} bytes ({values})")


class OptimizerTarget:
    """What the kernel optimiser (``funcgrad.lower.optimize``, which chooses opts for the LLVM renderer)
    knows of the machine it optimises for. The CPU device provides it (``devices/cpu.py``): its thread
    count and cost model, its kernel cache folder and CPU name (BEAM's choices are kept per CPU), and
    how a candidate is compiled for timing. ``funcgrad.devices`` installs it with
    ``set_optimizer_target`` (loaded on first use)."""

    small_kernel_work: int = 0  # loop iterations below which kernels are compiled unoptimised: BEAM leaves them

    def thread_count(self) -> int:
        """The CPUs kernels may run on (the ``thread`` opt's largest useful amount)."""
        raise NotImplementedError

    def heuristic_threads(self, kernel: Kernel) -> int:
        """Chunks of axis 0 to run in parallel by default (the ``thread`` opt)."""
        raise NotImplementedError

    def cache_folder(self) -> Any:
        """The kernel cache's folder (a ``Path``): BEAM's choices live in ``beam/`` beside it."""
        raise NotImplementedError

    def cpu_name(self) -> str:
        """The host CPU's name, part of a BEAM choice's key."""
        raise NotImplementedError

    def compile_for_timing(self, kernel: Kernel) -> Any:
        """``kernel`` compiled at the level it will really get, outside every cache, to time it."""
        raise NotImplementedError


_OPTIMIZER_TARGET: list[Any] = []  # [a factory of the target] once installed


def set_optimizer_target(factory: Any) -> None:
    """Install ``factory()`` (called on first use, then kept) as the optimiser's target."""
    _OPTIMIZER_TARGET[:] = [factory]


def optimizer_target() -> OptimizerTarget:
    if not _OPTIMIZER_TARGET:
        raise RuntimeError("no optimiser target installed: import funcgrad.devices (importing funcgrad does)")
    entry = _OPTIMIZER_TARGET[0]
    if not isinstance(entry, OptimizerTarget):
        entry = _OPTIMIZER_TARGET[0] = entry()
    return entry
