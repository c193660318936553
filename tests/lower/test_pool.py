"""The pool of large array buffers (funcgrad/lower/pool.py) that plan replays allocate from."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.lower import pool

BIG = (512, 1024)  # 2 MB of float32: pooled


@pytest.fixture(autouse=True)
def empty_pool():
    pool.release()
    yield
    pool.release()


def test_pooled_arrays_are_plain_writable_aligned_arrays() -> None:
    a = pool.empty(BIG, np.float32)
    assert a.shape == BIG and a.dtype == np.float32 and a.flags.c_contiguous and a.flags.writeable
    assert a.ctypes.data % pool.ALIGN == 0
    a[...] = 3.0
    assert float(a.sum()) == 3.0 * a.size
    small = pool.empty((10,), np.float32)
    assert small.base is None  # small arrays are NumPy's own


def test_an_allocator_makes_the_same_choice_as_empty() -> None:
    """pool.allocator(shape, dtype)() is empty(shape, dtype) with the size worked out once: large
    arrays come from the pool (a freed buffer is reused), small and zero-size ones from NumPy."""
    make_big, make_small, make_none = (pool.allocator(shape, np.dtype(np.float32)) for shape in (BIG, (10,), (0, 3)))
    a = make_big()
    assert a.shape == BIG and a.dtype == np.float32 and a.flags.writeable and a.ctypes.data % pool.ALIGN == 0
    address = a.ctypes.data
    del a
    gc.collect()
    assert make_big().ctypes.data == address
    small, none = make_small(), make_none()
    assert small.base is None and small.shape == (10,) and none.shape == (0, 3)


def test_a_smaller_request_takes_a_free_buffer_at_most_twice_its_size() -> None:
    big = pool.empty((1024, 1024), np.float32)  # 4 MB
    address = big.ctypes.data
    del big
    gc.collect()
    small = pool.empty((700, 1024), np.float32)  # 2.8 MB: fits the free 4 MB buffer
    assert small.ctypes.data == address and small.shape == (700, 1024) and small.flags.writeable
    small[...] = 2.0
    assert float(small.sum()) == 2.0 * small.size
    tiny = pool.empty((256, 1024), np.float32)  # 1 MB: nothing free within 2x, a fresh buffer
    assert tiny.ctypes.data != address
    del small
    gc.collect()
    assert pool.empty((1024, 1024), np.float32).ctypes.data == address  # back in the pool as 4 MB


def test_a_freed_buffer_is_reused_and_a_held_one_is_not() -> None:
    a = pool.empty(BIG, np.float32)
    a[...] = 1.0
    address = a.ctypes.data
    view = a[3:5]  # a view keeps the buffer
    del a
    gc.collect()
    assert pool.stats()["free_bytes"] == 0
    b = pool.empty(BIG, np.float32)
    assert b.ctypes.data != address and (view == 1.0).all()
    del view
    gc.collect()
    assert pool.stats()["free_bytes"] == 2 << 20
    hits = pool.stats()["hits"]
    c = pool.empty(BIG, np.int32)  # the same number of bytes, another dtype
    assert c.ctypes.data == address and pool.stats()["hits"] == hits + 1
    del b, c


def test_the_pool_keeps_at_most_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCGRAD_POOL_MB", "3")
    arrays = [pool.empty(BIG, np.float32) for _ in range(4)]
    del arrays
    gc.collect()
    assert pool.stats()["free_bytes"] <= 3 << 20


def test_jit_outputs_held_by_the_caller_are_never_reused() -> None:
    f = fg.jit(lambda x: x * 2.0 + 1.0)
    x1 = fnp.asarray(np.full(BIG, 1.0, np.float32))
    x2 = fnp.asarray(np.full(BIG, 5.0, np.float32))
    first = f(x1).numpy()
    for _ in range(3):  # later calls recycle their own dropped outputs, never the held one
        f(x2).numpy()
    assert (first == 3.0).all()
    out = f(x2).numpy()
    assert (out == 11.0).all() and (first == 3.0).all()
    assert pool.stats()["hits"] >= 1


def test_a_one_kernel_plan_takes_its_dropped_output_back_on_every_call() -> None:
    # the one-kernel replay (one closure, no slots) allocated with np.empty: a fresh mmap per call
    if os.environ.get("DEVICE", "CPU").upper() not in ("", "CPU"):
        pytest.skip("the pool holds the CPU's host buffers; other devices allocate their own")
    f = fg.jit(lambda x: x * 2.0 + 1.0)
    x = fnp.asarray(np.full(BIG, 1.0, np.float32))
    f(x).numpy()
    f(x).numpy()
    before = pool.stats()["hits"]
    for _ in range(5):
        assert (f(x).numpy() == 3.0).all()
    assert pool.stats()["hits"] - before == 5


def test_the_step_by_step_run_takes_kernel_outputs_from_the_pool(monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # DEBUG=2 runs a plan step by step and times each kernel; its outputs come from the pool as the
    # replay's do, so the times it prints do not count a fresh mapping's page faults
    if os.environ.get("DEVICE", "CPU").upper() not in ("", "CPU"):
        pytest.skip("the pool holds the CPU's host buffers; other devices allocate their own")
    monkeypatch.setenv("DEBUG", "2")
    f = fg.jit(lambda x: fnp.exp(x) * 2.0 + fnp.sum(x))  # a reduction and an elementwise kernel
    x = fnp.asarray(np.full(BIG, 0.0, np.float32))
    f(x).numpy()
    before = pool.stats()["hits"]
    for _ in range(3):
        assert np.allclose(f(x).numpy(), 2.0)
    assert pool.stats()["hits"] - before >= 3
    assert " us" in capsys.readouterr().err  # the per-kernel times were printed


def test_threads_allocate_and_free_at_once() -> None:
    errors = []

    def work(seed: int) -> None:
        try:
            for i in range(50):
                a = pool.empty(BIG, np.float32)
                a[...] = seed + i
                assert (a == seed + i).all()
                del a
        except Exception as error:  # noqa: BLE001
            errors.append(error)

    threads = [threading.Thread(target=work, args=(k * 100,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert pool.stats()["free_bytes"] <= 4 * (2 << 20)
