"""The native worker pool (funcgrad/devices/cpu_pool.py): the same bits as the Python pool for every kernel
class, workers that run chunks, sleep and wake, one CPU, forked children, threads launching at once, and the
``FUNCGRAD_NATIVE_POOL=0`` fallback."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.nn.functional as F
import funcgrad.numpy as fnp
from funcgrad.devices import Device, cpu_pool, cpu_threads
from funcgrad.devices import cpu as cpu_module
from funcgrad.devices.cpu import CompiledKernel, CPUDevice
from funcgrad.lower.kernel import Kernel
from funcgrad.lower.schedule import KernelStep, schedule

pytestmark = pytest.mark.skipif(not cpu_pool.supported(), reason="the native pool needs x86-64 Linux")

RNG = np.random.default_rng(7)


def f32(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


def kernels_of(fn: Callable[..., Any], *args: np.ndarray) -> list[Kernel]:
    return [step.kernel for step in schedule(fg.make_ir(fn)(*args)) if isinstance(step, KernelStep)]


def only_kernel(fn: Callable[..., Any], *args: np.ndarray) -> Kernel:
    (kernel,) = kernels_of(fn, *args)
    return kernel


def random_inputs(kernel: Kernel) -> list[np.ndarray]:
    arrays = []
    for aval in kernel.in_avals:
        dtype = np.dtype(aval.dtype)
        if dtype.kind == "f":
            arrays.append(RNG.uniform(-2, 2, aval.shape).astype(dtype))
        elif dtype.kind == "b":
            arrays.append(RNG.random(aval.shape) < 0.5)
        else:
            arrays.append(RNG.integers(0, 5, aval.shape).astype(dtype))
    return arrays


def softmax(x: Any) -> Any:
    e = fnp.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def conv_pool(x: Any, w: Any) -> Any:
    return (F.max_pool2d(F.conv2d(x, w, padding=1), 2) ** 2).sum()


# (label, program, inputs, an opt the heuristics give one of its kernels: the kernel class)
KERNEL_CLASSES = [
    ("elementwise", lambda x: fnp.tanh(x) * 3 + 1, (f32(301, 70),), None),
    ("row reductions (softmax)", softmax, (f32(67, 130),), None),
    ("column sums", lambda x: x.sum(axis=0), (f32(500, 90),), None),
    ("i-k-j matmul", lambda x, y: fnp.maximum(x @ y + 1.0, 0.0), (f32(24, 40), f32(40, 32)), "reorder"),
    ("register tile", lambda x, y: x @ y, (f32(131, 256), f32(256, 192)), "tile"),
    ("transpose", lambda x, b: fnp.maximum(fnp.transpose(x, (0, 2, 1)) + b[:, None], 0.0), (f32(8, 576, 32), f32(32)),
     "transpose"),
    ("convolution, max-pool and their gradients", fg.grad(conv_pool, argnums=(0, 1)),
     (f32(4, 3, 20, 20), f32(8, 3, 3, 3)), None),
    ("int and bool outputs", lambda x: ((x * 100).astype(np.int32) % 7, x > 0.25), (f32(99, 33),), None),
]


@pytest.fixture
def native() -> Iterator[cpu_pool.NativePool]:
    pool = cpu_pool.native_pool()
    if pool is None:
        pytest.skip("the native pool is off in this process (FUNCGRAD_NATIVE_POOL=0 or a failed build)")
    yield pool


def run_chunks(compiled: CompiledKernel, inputs: list[np.ndarray], chunks: int,
               launch: Callable[[list[int], int], Any]) -> list[np.ndarray]:
    outputs = [np.full(aval.shape, 7, aval.dtype) for aval in compiled.kernel.out_avals]
    launch([array.ctypes.data for array in (*outputs, *inputs)], chunks)
    return outputs


@pytest.mark.parametrize("label, program, inputs, kind", KERNEL_CLASSES, ids=[case[0] for case in KERNEL_CLASSES])
def test_every_kernel_class_gives_the_python_pools_bits(label: str, program: Callable[..., Any],
                                                        inputs: tuple[np.ndarray, ...], kind: str | None,
                                                        native: cpu_pool.NativePool, tmp_path: Path) -> None:
    device = CPUDevice(cache_dir=tmp_path)
    kernels = [device.compile(kernel) for kernel in kernels_of(program, *inputs)]
    if kind is not None:
        assert any(opt.action == kind for compiled in kernels for opt in compiled.kernel.opts or ())
    for compiled in kernels:
        compare_pools(compiled, native, label)


def compare_pools(compiled: CompiledKernel, native: cpu_pool.NativePool, label: str) -> None:
    """Chunks of ``compiled`` on random inputs: the native pool writes the Python pool's bits."""
    outer, arrays = compiled.outer, random_inputs(compiled.kernel)

    def python_pool(pointers: list[int], chunks: int) -> None:
        bounds = [outer * i // chunks for i in range(chunks + 1)]
        cpu_module.worker_pool().run(compiled.function, [(*pointers, bounds[i], bounds[i + 1]) for i in range(chunks)])

    def native_pool(pointers: list[int], chunks: int) -> int:
        return native.launch(compiled.address, pointers, outer, chunks)

    whole = run_chunks(compiled, arrays, 1, python_pool)
    for chunks in sorted({2, 3, min(7, outer), outer}):
        by_python = run_chunks(compiled, arrays, chunks, python_pool)
        by_native = run_chunks(compiled, arrays, chunks, native_pool)
        for python_result, native_result, one_chunk in zip(by_python, by_native, whole):
            assert python_result.tobytes() == native_result.tobytes(), f"{label}: {compiled.name}, {chunks} chunks"
            np.testing.assert_allclose(native_result.astype(np.float64), one_chunk.astype(np.float64),
                                       rtol=1e-5, atol=1e-5, err_msg=f"{label}: {compiled.name}, {chunks} chunks")


def probe_kernel(tmp_path: Path, rows: int = 64, columns: int = 20000) -> tuple[CompiledKernel, np.ndarray]:
    x = f32(rows, columns)
    return CPUDevice(cache_dir=tmp_path).compile(only_kernel(lambda a: fnp.tanh(a) * 3 + 1, x)), x


def launch_probe(pool: cpu_pool.NativePool, compiled: CompiledKernel, x: np.ndarray, chunks: int) -> int:
    out = np.zeros_like(x)
    own = pool.launch(compiled.address, [out.ctypes.data, x.ctypes.data], compiled.outer, chunks)
    np.testing.assert_allclose(out, np.tanh(x.astype(np.float64)) * 3 + 1, rtol=1e-5, atol=1e-5)
    return own


def test_a_worker_runs_chunks_then_sleeps_and_a_launch_wakes_it(tmp_path: Path) -> None:
    pool = cpu_pool.NativePool(1, spin_us=0)  # sleeps as soon as it is idle
    try:
        compiled, x = probe_kernel(tmp_path)
        deadline = time.monotonic() + 20
        while pool.stats["worker_chunks"] == 0:  # the caller runs every chunk the worker is late for
            assert time.monotonic() < deadline, "the worker never ran a chunk"
            assert launch_probe(pool, compiled, x, 64) <= 64
        while pool.stats["sleepers"] == 0:
            assert time.monotonic() < deadline, "the idle worker never went to sleep"
            time.sleep(0.001)
        sleeps, wakes = pool.stats["sleeps"], pool.stats["wakes"]
        launch_probe(pool, compiled, x, 64)
        assert pool.stats["wakes"] == wakes + 1  # the launch saw it asleep and woke it
        while pool.stats["sleeps"] == sleeps:  # it woke, found the job (or none left), and slept again
            assert time.monotonic() < deadline, "the worker did not wake"
            time.sleep(0.001)
    finally:
        pool.close()
    assert not any(thread.is_alive() for thread in pool.threads)


def test_a_worker_still_wakes_after_many_quick_launches(tmp_path: Path) -> None:
    """Launches ~2 us apart race a worker that sleeps after every chunk (spin budget 0) and takes ~15 us to
    wake; none may leave it asleep for good (the caller would then run every chunk)."""
    pool = cpu_pool.NativePool(1, spin_us=0)
    try:
        small, x_small = probe_kernel(tmp_path, rows=4, columns=64)
        out = np.zeros_like(x_small)
        pointers = [out.ctypes.data, x_small.ctypes.data]
        for _ in range(20000):  # ~2 us apart: many land while the worker wakes (~15 us)
            pool.launch(small.address, pointers, small.outer, 2)
        np.testing.assert_allclose(out, np.tanh(x_small.astype(np.float64)) * 3 + 1, rtol=1e-5, atol=1e-5)
        compiled, x = probe_kernel(tmp_path)
        chunks = pool.stats["worker_chunks"]
        deadline = time.monotonic() + 10
        while pool.stats["worker_chunks"] == chunks:
            assert time.monotonic() < deadline, "the worker no longer wakes"
            launch_probe(pool, compiled, x, 64)
    finally:
        pool.close()


def test_a_caller_that_waits_sleeps_and_the_worker_wakes_it(tmp_path: Path) -> None:
    x = f32(3, 300_000)  # row sums in 2 chunks: the caller's first has one row, the other two
    compiled = CPUDevice(cache_dir=tmp_path).compile(only_kernel(lambda a: a.sum(axis=1), x))
    assert compiled.outer == 3
    pool = cpu_pool.NativePool(1, spin_us=0, caller_spin_us=0)  # an asleep worker; a caller that sleeps at once
    try:
        deadline = time.monotonic() + 20
        while pool.stats["caller_sleeps"] == 0:  # (a lost wake-up would hang here)
            assert time.monotonic() < deadline, "the caller never had to wait for the worker"
            out = np.zeros(3, np.float32)
            pool.launch(compiled.address, [out.ctypes.data, x.ctypes.data], 3, 2)
            np.testing.assert_allclose(out, x.astype(np.float64).sum(axis=1), rtol=1e-4)
        assert pool.stats["waited_ns"] > 0
    finally:
        pool.close()


def test_without_workers_the_caller_runs_every_chunk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_threads, "thread_count", lambda: 1)
    monkeypatch.setenv("FUNCGRAD_NATIVE_POOL", "1")
    cpu_pool.reset_native_pool()
    try:
        pool = cpu_pool.native_pool()
        assert pool is not None and pool.workers == 0 and not pool.threads
        compiled, x = probe_kernel(tmp_path, rows=9, columns=100)
        assert launch_probe(pool, compiled, x, 5) == 5
    finally:
        monkeypatch.undo()
        cpu_pool.reset_native_pool()


def test_a_busy_pool_leaves_a_second_launch_to_its_own_thread(tmp_path: Path) -> None:
    pool = cpu_pool.NativePool(1)
    try:
        compiled, x = probe_kernel(tmp_path, rows=16, columns=1000)
        pool.words[cpu_pool.BUSY] = 1  # as if another thread were launching
        assert launch_probe(pool, compiled, x, 4) == 4
        pool.words[cpu_pool.BUSY] = 0
        assert launch_probe(pool, compiled, x, 4) <= 4
    finally:
        pool.close()


def test_threads_launching_at_once_get_their_own_results(native: cpu_pool.NativePool, tmp_path: Path) -> None:
    compiled, _ = probe_kernel(tmp_path, rows=32, columns=3000)
    compiled.threads, compiled.parallel = 4, True
    errors: list[BaseException] = []

    def work(number: int) -> None:
        try:
            x = f32(32, 3000) + number
            for _ in range(40):
                out = np.zeros_like(x)
                compiled([x], [out])
                np.testing.assert_allclose(out, np.tanh(x.astype(np.float64)) * 3 + 1, rtol=1e-5, atol=1e-5)
        except BaseException as error:  # noqa: BLE001 - re-raised below
            errors.append(error)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not any(thread.is_alive() for thread in threads), "a launch hung"
    assert not errors, errors[0]


TANH = fg.jit(lambda a: fnp.tanh(a) * 3 + 1)
FORK_INPUT = np.arange(512 * 2000, dtype=np.float32).reshape(512, 2000) / 1e6


def _child(queue: Any) -> None:
    before = cpu_pool.native_pool()
    fresh = dict(before.stats) if before is not None else {}  # the counters before this process launched
    out = TANH(FORK_INPUT)
    pool = cpu_pool.native_pool()
    queue.put((np.asarray(out), pool is not None and all(thread.is_alive() for thread in pool.threads),
               [thread.ident for thread in pool.threads] if pool is not None else [], fresh,
               pool.stats if pool else {}))


@pytest.fixture
def on_the_cpu() -> Iterator[None]:
    """Lazy values and jit on the CPU device (the suite may run with DEVICE=CL or WEBGPU)."""
    previous = Device.DEFAULT
    Device.DEFAULT = "CPU"
    try:
        yield
    finally:
        Device.DEFAULT = previous


def test_a_forked_child_gets_a_fresh_pool(native: cpu_pool.NativePool, monkeypatch: pytest.MonkeyPatch,
                                          on_the_cpu: None) -> None:
    launches: list[int] = []
    real_launch = native.launch
    monkeypatch.setattr(native, "launch", lambda *arguments: launches.append(1) or real_launch(*arguments))
    want = np.asarray(TANH(FORK_INPUT))  # compiled here, before the fork; a threaded kernel (2 ^ 20 tanh)
    assert launches or native.workers == 0
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_child, args=(queue,))
    child.start()
    out, alive, child_threads, fresh, stats = queue.get(timeout=60)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert out.tobytes() == want.tobytes()
    assert alive and len(child_threads) == native.workers
    # its own pool: the child's counters start at zero before its first launch, where an inherited pool
    # would carry the parent's. Only the counters a launch moves are compared: new workers may already
    # count a sleep as they start, and how many chunks the workers take from one launch (and so how many
    # wakes) depends on the load, so the counts after the launch are not pinned
    assert fresh.get("worker_chunks", 0) == fresh.get("wakes", 0) == 0, fresh
    assert set(stats) == set(native.stats)


def test_native_pool_off_uses_the_python_pool(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCGRAD_NATIVE_POOL", "0")
    cpu_pool.reset_native_pool()
    try:
        assert cpu_pool.native_pool() is None
        compiled, x = probe_kernel(tmp_path, rows=8, columns=100)
        compiled.threads, compiled.parallel = 3, True
        calls: list[int] = []
        python_pool = cpu_module.worker_pool()
        real_run = python_pool.run
        monkeypatch.setattr(python_pool, "run",
                            lambda function, sets: calls.append(len(sets)) or real_run(function, sets))
        out = np.zeros_like(x)
        compiled([x], [out])
        assert calls == [3]
        np.testing.assert_allclose(out, np.tanh(x.astype(np.float64)) * 3 + 1, rtol=1e-5, atol=1e-5)
    finally:
        monkeypatch.undo()
        cpu_pool.reset_native_pool()


def test_a_threaded_kernel_launches_through_the_native_pool(native: cpu_pool.NativePool, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    compiled, x = probe_kernel(tmp_path, rows=8, columns=100)
    compiled.threads, compiled.parallel = 3, True
    calls: list[tuple[int, int]] = []
    real_launch = native.launch
    monkeypatch.setattr(native, "launch", lambda function, pointers, outer, chunks:
                        calls.append((outer, chunks)) or real_launch(function, pointers, outer, chunks))
    out = np.zeros_like(x)
    compiled([x], [out])
    assert calls == [(compiled.outer, 3)]
    np.testing.assert_allclose(out, np.tanh(x.astype(np.float64)) * 3 + 1, rtol=1e-5, atol=1e-5)


def test_a_kernel_with_more_buffers_than_the_trampolines_uses_the_python_pool(tmp_path: Path) -> None:
    arrays = [f32(40, 10) for _ in range(cpu_pool.MAX_BUFFERS)]
    compiled = CPUDevice(cache_dir=tmp_path).compile(only_kernel(lambda *xs: sum(xs[1:], xs[0]), *arrays))
    assert not compiled.native
    compiled = CPUDevice(cache_dir=tmp_path).compile(only_kernel(lambda *xs: sum(xs[1:], xs[0]), *arrays[:-1]))
    assert compiled.native


def test_the_spin_budget_is_checked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCGRAD_POOL_SPIN_US", "soon")
    with pytest.raises(ValueError, match="FUNCGRAD_POOL_SPIN_US must be a number of microseconds, got 'soon'"):
        cpu_pool.spin_microseconds()
    monkeypatch.setenv("FUNCGRAD_POOL_SPIN_US", "250")
    assert cpu_pool.spin_microseconds() == 250


def test_a_jitted_step_is_the_same_with_either_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w = f32(256, 300), f32(300, 200)
    step = fg.jit(fg.grad(lambda w, x: fnp.tanh(x @ w).sum() + (w * w).mean()))
    results = []
    for setting in ("1", "0"):
        monkeypatch.setenv("FUNCGRAD_NATIVE_POOL", setting)
        cpu_pool.reset_native_pool()
        cpu_pool.native_pool()
        results.append(np.asarray(step(w, x)))
    monkeypatch.undo()
    cpu_pool.reset_native_pool()
    assert results[0].tobytes() == results[1].tobytes()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two CPUs and sched_setaffinity")
def test_a_worker_on_the_callers_cpu_moves_off_it(tmp_path: Path) -> None:
    """Put the caller and the worker on one CPU (as the scheduler sometimes does: the two chunks then run
    one after the other): the worker's next claim moves it to the other CPUs, and the results stay right."""
    allowed = os.sched_getaffinity(0)
    cpu = min(allowed)
    pool = cpu_pool.NativePool(1)
    try:
        compiled, x = probe_kernel(tmp_path)
        deadline = time.monotonic() + 20
        while pool.tids[0] is None:
            assert time.monotonic() < deadline, "the worker thread never started"
            time.sleep(0.001)
        os.sched_setaffinity(0, {cpu})  # this thread (the caller) only
        os.sched_setaffinity(pool.tids[0], {cpu})
        while pool.stats["moves"] == 0:
            assert time.monotonic() < deadline, "the worker never moved off the caller's CPU"
            launch_probe(pool, compiled, x, 64)
        assert os.sched_getaffinity(pool.tids[0]) == allowed - {cpu}
        moves = pool.stats["moves"]
        for _ in range(20):  # apart now: no more moves while the caller stays where it is
            launch_probe(pool, compiled, x, 64)
        assert pool.stats["moves"] == moves
    finally:
        os.sched_setaffinity(0, allowed)
        pool.close()


def test_pinned_workers_are_not_moved(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCGRAD_PIN_WORKERS", "1")
    pool = cpu_pool.NativePool(1)
    try:
        assert pool.words[cpu_pool.REPAIR] == 0
        compiled, x = probe_kernel(tmp_path)
        for _ in range(5):
            launch_probe(pool, compiled, x, 64)
        assert pool.stats["moves"] == 0
    finally:
        pool.close()
