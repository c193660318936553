"""``Device.copy_within``: device-to-device copies of bytes between buffers (no host), on every available
device with its own memory (CL and WEBGPU here; CUDA through tests/devices/test_device_cuda.py's stand-in
driver), and the ``Transfers`` counts of what crosses between host and device.

Offsets and sizes are in the device's stored bytes (``Device.stored_itemsize``: WEBGPU stores every element
as a 32-bit word, so its copies of whole elements are 4-byte aligned as WebGPU requires).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import funcgrad as fg
from funcgrad.devices import get_device
from funcgrad.ir.core import ShapedArray
from funcgrad.lower.device_control import has_copy_within


@pytest.fixture(scope="module")
def device(device_name: str) -> Any:
    found = get_device(device_name)
    if not found.resident:
        pytest.skip(f"device {device_name} computes on host arrays: it has no buffers to copy between")
    assert has_copy_within(found)
    return found


def aval(array: np.ndarray) -> ShapedArray:
    return ShapedArray(array.shape, array.dtype)


DTYPES = [np.float32, np.int32, np.uint8, np.bool_, np.float16, fg.dtypes.bfloat16]


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_copies_a_range_of_elements_at_offsets(device: Any, dtype: Any) -> None:
    dtype = np.dtype(dtype)
    source = (np.arange(24) % 7 - 3).astype(dtype) if dtype != np.bool_ else np.arange(24) % 3 == 0
    target = np.full(16, 1, dtype)
    item = device.stored_itemsize(dtype)
    src, dst = device.upload(source), device.upload(target)
    device.copy_within(src, 5 * item, dst, 9 * item, 6 * item)  # elements 5..10 into 9..14
    device.copy_within(src, 0, dst, 0, 2 * item)                # and 0..1 into 0..1
    want = target.copy()
    want[9:15] = source[5:11]
    want[0:2] = source[0:2]
    got = device.download(dst, aval(target))
    assert got.dtype == dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8))
    assert np.array_equal(device.download(src, aval(source)), source)  # the source is left as it was


def test_whole_buffer_and_zero_byte_copies(device: Any) -> None:
    source = np.arange(10, dtype=np.float32)
    src = device.upload(source)
    dst = device.allocate(aval(source))
    device.copy_within(src, 0, dst, 0, source.size * device.stored_itemsize(source.dtype))
    device.copy_within(src, 0, dst, 0, 0)  # nothing to copy: allowed (OpenCL itself refuses 0 bytes)
    assert np.array_equal(device.download(dst, aval(source)), source)


def test_copies_are_counted_apart_from_host_transfers(device: Any) -> None:
    src = device.upload(np.arange(8, dtype=np.int32))
    dst = device.allocate(ShapedArray((8,), np.dtype(np.int32)))
    before = device.transfers.snapshot()
    device.copy_within(src, 0, dst, 0, 16)
    device.copy_within(src, 16, dst, 16, 16)
    after = device.transfers
    assert after.host == before.host  # no host involved
    assert (after.copies - before.copies, after.copy_bytes - before.copy_bytes) == (2, 32)
    device.download(dst, ShapedArray((8,), np.dtype(np.int32)))
    assert (after.downloads - before.downloads, after.download_bytes - before.download_bytes) == (1, 32)
    device.upload(np.zeros(3, np.float32))
    assert after.uploads - before.uploads == 1 and after.host == before.host + 2


@pytest.mark.parametrize("src_offset, dst_offset, nbytes, where", [
    (36, 0, 8, "source"),        # reads bytes 36..43 of a 40-byte buffer
    (0, 20, 8, "destination"),   # writes bytes 20..27 of a 24-byte buffer
    (0, 0, 44, "source"),
])
def test_out_of_range_copies_name_the_operation_and_the_values(device: Any, src_offset: int, dst_offset: int,
                                                               nbytes: int, where: str) -> None:
    src = device.upload(np.arange(10, dtype=np.float32))
    dst = device.allocate(ShapedArray((6,), np.dtype(np.float32)))
    before = device.transfers.snapshot()
    with pytest.raises(ValueError, match=rf"{device.name} copy_within: bytes .* out of range of the {where} "
                                         rf"buffer \(src_offset={src_offset}, dst_offset={dst_offset}, "
                                         rf"nbytes={nbytes}, source buffer 40 bytes, destination buffer 24 bytes\)"):
        device.copy_within(src, src_offset, dst, dst_offset, nbytes)
    assert device.transfers.copies == before.copies  # refused before anything was queued


def test_negative_and_non_integer_offsets_are_refused(device: Any) -> None:
    src = device.upload(np.arange(4, dtype=np.float32))
    with pytest.raises(ValueError, match=r"copy_within: negative offset or size \(src_offset=-4"):
        device.copy_within(src, -4, src, 0, 4)
    with pytest.raises(ValueError, match=r"copy_within: negative offset or size .*nbytes=-4"):
        device.copy_within(src, 0, src, 4, -4)
    with pytest.raises(TypeError, match=r"copy_within: offsets and size must be integers \(src_offset=1.5"):
        device.copy_within(src, 1.5, src, 0, 4)


def test_webgpu_refuses_unaligned_copies(device: Any) -> None:
    if device.name != "WEBGPU":
        pytest.skip("only WebGPU's copy_buffer_to_buffer needs 4-byte offsets and sizes")
    src = device.upload(np.arange(8, dtype=np.uint8))
    assert device.stored_itemsize(np.uint8) == 4 and device.stored_itemsize(np.bool_) == 4
    for offsets in ((2, 0, 4), (0, 6, 4), (0, 0, 3)):
        with pytest.raises(ValueError, match=r"WEBGPU copy_within: offsets and size must be multiples of 4 bytes"):
            device.copy_within(src, offsets[0], src, offsets[1], offsets[2])


def test_byte_granular_copies_where_the_device_allows_them(device: Any) -> None:
    if device.stored_itemsize(np.uint8) != 1:
        pytest.skip(f"{device.name} stores uint8 in wider words")
    source = np.arange(1, 12, dtype=np.uint8)
    src, dst = device.upload(source), device.upload(np.zeros(7, np.uint8))
    device.copy_within(src, 3, dst, 1, 5)  # odd offsets and size
    assert device.download(dst, aval(np.zeros(7, np.uint8))).tolist() == [0, 4, 5, 6, 7, 8, 0]


def test_a_device_without_its_own_memory_has_no_copy_within() -> None:
    cpu = get_device("CPU")
    assert not has_copy_within(cpu)
    with pytest.raises(NotImplementedError, match="CPU has no device-to-device copy"):
        cpu.copy_within(None, 0, None, 0, 0)
