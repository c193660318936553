"""What keeps the CPU device's LLVM time down (funcgrad/devices/cpu.py, cpu_compiler.py), tested
without timing: which LLVM pipeline a kernel gets, that the pipelines agree bit for bit, that the
disk caches keep them apart, and that compiling threads do not queue behind llvmlite's lock.
"""

from __future__ import annotations

import gc
import threading
from pathlib import Path

import attrs
import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices import cpu, cpu_threads
from funcgrad.devices import cpu_compiler as compiler
from funcgrad.lower import render_tile
from funcgrad.lower.kernel import Kernel, Opt
from funcgrad.lower.optimize import optimize
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.render_loops import SHORT_PARTIAL, llvm_function_name
from tests.devices.test_cpu_compiler import libm_kernel
from tests.lower.test_render_tile import assert_matches_reference, kernels_of, product_kernel, random_inputs, tiled


@pytest.fixture(scope="module")
def llvm() -> compiler.LLVMCompiler:
    return compiler.LLVMCompiler()


def conv_kernel() -> Kernel:
    """A channels-last convolution's forward kernel: its reduction loops are (3, 3, 3)."""
    x, w = np.ones((2, 3, 12, 12), np.float32), np.ones((32, 3, 3, 3), np.float32)
    kernels = kernels_of(lambda x, w: fg.nn.functional.conv2d(x, w), x, w)
    found = [k for k in kernels if k.reduce_shape and 3 in k.reduce_shape and k.shape[-1] == 32]
    assert found, [(k.name, k.shape, k.reduce_shape) for k in kernels]
    return found[0]


def run_object(kernel: Kernel, object_code: bytes, inputs: list[np.ndarray]) -> list[np.ndarray]:
    memory, address = compiler.load_object(object_code, llvm_function_name(kernel))
    try:
        outputs = [np.empty(aval.shape, aval.dtype) for aval in kernel.out_avals]
        cpu.CompiledKernel(kernel, "", address, "compiled", 0.0)(inputs, outputs)
        return outputs
    finally:
        memory.free()


def tanh_product_kernel(m: int = 64, k: int = 256, n: int = 128) -> Kernel:
    """``tanh(a @ b)``: a register tile whose epilogue the tile does not write on vectors."""
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    return kernels_of(lambda a, b: fnp.tanh(a @ b), a, b)[0]


def test_register_tiles_skip_llvms_unroller_unless_a_reduction_loop_is_short(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FUNCGRAD_OPT", raising=False)
    product = product_kernel(64, 256, 128, epilogue=True)
    assert cpu.optimization_level(tiled(product, 64, 6)) == 5, "a tile written on vectors throughout: SROA only"
    assert cpu.optimization_level(tiled(tanh_product_kernel(), 64, 6)) == 4, "a register tile: O1 without unrolling"
    assert cpu.optimization_level(attrs.evolve(product, opts=(Opt("thread", 0, 2),))) == 3, "plain loops: O3"
    assert cpu.optimization_level(tiled(product_kernel(4, 16, 16), 16, 4)) == 0, "a small kernel: unoptimised"
    conv = conv_kernel()
    assert cpu.optimization_level(tiled(conv, 32, 4)) == 3, "a 3x3 window's loops are worth unrolling"
    monkeypatch.setenv("FUNCGRAD_OPT", "3")
    assert cpu.optimization_level(tiled(product, 64, 6)) == 3


def short_reorder_kernel(rows: int = 64, terms: int = 10, columns: int = 576) -> Kernel:
    """The CNN linear layer's input gradient, dlogits (rows x 10) @ W (10 x 576), in i-k-j order."""
    return attrs.evolve(product_kernel(rows, terms, columns),
                        opts=(Opt("reorder", 0, 0), Opt("upcast", 0, 2), Opt("thread", 0, 2)))


def test_short_reductions_in_ikj_order_get_o2(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FUNCGRAD_OPT", raising=False)
    assert cpu.optimization_level(short_reorder_kernel()) == 2, "O3 would flatten its 10 passes over a 576 row"
    assert cpu.optimization_level(short_reorder_kernel(terms=cpu.SHORT_REORDER + 1)) == 3
    plain = attrs.evolve(product_kernel(64, 10, 576), opts=(Opt("thread", 0, 2),))
    assert cpu.optimization_level(plain) == 3, "not in i-k-j order: a sum in registers, O3"
    assert cpu.optimization_level(short_reorder_kernel(rows=2, columns=16)) == 0, "a small kernel: unoptimised"
    monkeypatch.setenv("FUNCGRAD_OPT", "3")
    assert cpu.optimization_level(short_reorder_kernel()) == 3


def adam_like_kernel(size: int) -> Kernel:
    """An elementwise kernel with a square root, a divide and an exp over ``size`` elements."""
    x = np.ones(size, np.float32)
    kernels = kernels_of(lambda p, g, m: p - 0.1 * (0.9 * m + g) / (fnp.sqrt(g * g) + 1e-8) * fnp.exp(-p), x, x, x)
    assert len(kernels) == 1 and kernels[0].reduce_expr is None
    return kernels[0]


def test_small_elementwise_kernels_get_o1_without_unrolling(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FUNCGRAD_OPT", raising=False)
    assert cpu.optimization_level(adam_like_kernel(cpu.SMALL_ELEMENTWISE_WORK - 1)) == 4
    assert cpu.optimization_level(adam_like_kernel(cpu.SMALL_ELEMENTWISE_WORK)) == 3
    assert cpu.optimization_level(adam_like_kernel(cpu.SMALL_KERNEL_WORK - 1)) == 0


def test_small_reductions_get_o1_without_unrolling_and_sum_right(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cross-entropy's sum over 10 classes for 512 rows (5,120 terms): O3 unrolled it in ~100 ms
    of LLVM; below SMALL_ELEMENTWISE_WORK terms a reduction gets pipeline 4, as elementwise kernels do."""
    monkeypatch.delenv("FUNCGRAD_OPT", raising=False)
    rng = np.random.default_rng(3)

    def row_sums(rows: int, columns: int) -> Kernel:
        x = rng.standard_normal((rows, columns)).astype(np.float32)
        (kernel,) = kernels_of(lambda x: fnp.sum(fnp.exp(x), axis=1), x)
        assert kernel.reduce_expr is not None
        return kernel

    assert cpu.optimization_level(row_sums(512, 10)) == 4
    assert cpu.optimization_level(row_sums(1024, 64)) == 3, "65,536 terms: O3 as before"
    x = rng.standard_normal((512, 10)).astype(np.float32)
    got = fg.jit(lambda x: fnp.sum(fnp.exp(x), axis=1))(fnp.asarray(x)).numpy()
    np.testing.assert_allclose(got, np.exp(x.astype(np.float64)).sum(axis=1), rtol=2e-6)


def test_a_short_partial_sum_stays_a_loop_that_vectorises(llvm: compiler.LLVMCompiler) -> None:
    """BatchNorm's sum over (batch, H*W) per channel: O3 fully unrolled each 64-term partial into a
    scalar chain (5.8 ms at batch 512); kept a loop, it vectorises (0.15 ms)."""
    x = np.random.default_rng(0).standard_normal((96, 64, 64)).astype(np.float32) + 0.5
    kernel = optimize(kernels_of(lambda x: fnp.sum(x, axis=(0, 2)), x)[0])
    assert kernel.reduce_shape == (96, 64) and any(opt.action == "split" for opt in kernel.opts or ())
    source = render_llvm(kernel)
    partial_loop = next(line for line in source.splitlines() if line.strip().startswith("br label %r1.cond,"))
    hint = partial_loop.split("!llvm.loop ")[1]
    assert f'{hint} = distinct !{{{hint}, !{{!"llvm.loop.unroll.disable"}}}}' in source
    assert "llvm.loop" not in next(line for line in source.splitlines() if line.strip().startswith("br label %r0.cond"))
    out = run_object(kernel, llvm.compile(source, cpu.optimization_level(kernel)), [x])[0]
    want = x.astype(np.float64).sum(axis=(0, 2))
    np.testing.assert_allclose(out, want, rtol=2e-6)
    long_inner = optimize(kernels_of(lambda x: fnp.sum(x, axis=(0, 2)), np.ones((8, 4, 1024), np.float32))[0])
    assert long_inner.reduce_shape[-1] > SHORT_PARTIAL and "unroll.disable" not in render_llvm(long_inner)


def test_the_pipelines_compute_the_same_bits(llvm: compiler.LLVMCompiler) -> None:
    for kernel in (tiled(product_kernel(48, 100, 80, epilogue=True), 64, 6), tiled(conv_kernel(), 32, 4),
                   short_reorder_kernel(rows=9, columns=100), adam_like_kernel(5000)):
        source = render_llvm(kernel)
        inputs = random_inputs(kernel, seed=3)
        results = [run_object(kernel, llvm.compile(source, number), inputs) for number in sorted(compiler.PIPELINES)]
        for other in results[1:]:
            for want, got in zip(results[0], other):
                np.testing.assert_array_equal(got, want)


def test_the_disk_caches_keep_the_pipelines_apart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FUNCGRAD_OPT", raising=False)
    device = cpu.CPUDevice(cache_dir=tmp_path)
    kernel = tiled(product_kernel(64, 256, 128), 64, 6)
    prepared = device._prepare(kernel)
    assert not isinstance(prepared, cpu.CompiledKernel) and prepared[2] == 5
    monkeypatch.setenv("FUNCGRAD_OPT", "3")
    at_o3 = device._prepare(kernel)
    assert not isinstance(at_o3, cpu.CompiledKernel) and at_o3[2] == 3
    assert at_o3[3] != prepared[3], "another pipeline's object code has another disk-cache key"
    fingerprint = cpu.host_target().fingerprint
    monkeypatch.setitem(compiler.PIPELINES, 4, (3, ()))
    assert cpu.host_target().fingerprint != fingerprint, "changing a pipeline changes every key and stored plan"


def test_an_unknown_pipeline_is_refused_by_number(llvm: compiler.LLVMCompiler) -> None:
    source = render_llvm(libm_kernel())
    with pytest.raises(ValueError, match="unknown LLVM pipeline 9"):
        llvm.compile(source, 9)
    client = compiler.WorkerClient(idle_seconds=0)
    try:
        with pytest.raises(RuntimeError, match="unknown LLVM pipeline 9"):
            client.compile(source, 9)
        assert client.compile(source, 3) == llvm.compile(source, 3), "and the worker keeps serving"
    finally:
        client.close()


def test_compiling_threads_do_not_wait_for_llvmlites_lock(llvm: compiler.LLVMCompiler) -> None:
    """llvmlite runs every LLVM call under one process-wide lock; a thread compiling in its own
    context skips it, so two threads compile at once. Here another thread holds that lock
    throughout: a compiling thread that waited for it would never finish."""
    from llvmlite.binding import ffi
    source = render_llvm(libm_kernel("asinh_while_locked"))
    want = llvm.compile(source, 3)
    got: list[bytes] = []
    compiled = threading.Event()

    def compile_once() -> None:
        got.append(llvm.compile(source, 3))
        compiled.set()  # (the thread's own context is freed as it ends, under the lock: not waited for here)

    with ffi.lib._lock:
        threading.Thread(target=compile_once, daemon=True).start()
        finished = compiled.wait(timeout=120)
    assert finished, "the compiling thread waited for llvmlite's lock"
    assert got == [want]


def test_a_garbage_collection_in_a_compiling_thread_takes_llvmlites_lock(llvm: compiler.LLVMCompiler) -> None:
    """A collection may free llvmlite objects of the global context (another thread's), which
    need the lock even in a thread that compiles in its own context."""
    lock = llvm.unlocked
    assert lock is not None, "this llvmlite keeps its lock where funcgrad expects it"
    seen: list[bool] = []

    class Cycle:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            seen.append(getattr(lock.skipping, "on", False))

    with lock.skipped():
        Cycle()
        gc.collect()
        still_skipping = lock.skipping.on
    assert seen == [False], "finalizers run by the collection take the lock"
    assert still_skipping and not lock.skipping.on


def test_threads_compiling_at_once_emit_what_one_thread_emits(llvm: compiler.LLVMCompiler) -> None:
    kernels = [tiled(product_kernel(48, 100, 80, epilogue=True), 64, 6), tiled(conv_kernel(), 32, 4),
               libm_kernel("asinh_in_threads"), product_kernel(40, 30, 50)]
    jobs = [(render_llvm(kernel), cpu.optimization_level(kernel)) for kernel in kernels]
    want = [llvm.compile(source, number) for source, number in jobs]
    results: dict[int, list[bytes]] = {}

    def compile_all(worker: int) -> None:
        order = jobs if worker % 2 == 0 else jobs[::-1]
        emitted = [llvm.compile(source, number) for source, number in order]
        results[worker] = emitted if worker % 2 == 0 else emitted[::-1]

    threads = [threading.Thread(target=compile_all, args=(worker,)) for worker in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(results[worker] == want for worker in range(3))


def test_kernels_differing_only_in_name_and_size_compile_once(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """An elementwise loop runs over [start, end): a 64- and a 32-element Adam update of two biases
    are the same code (shared_source), compiled once, each run over its own size."""
    monkeypatch.setattr(cpu_threads, "thread_count", lambda: 2)
    small, large = adam_like_kernel(5000), adam_like_kernel(7000)
    large = attrs.evolve(large, name="renamed_update")
    assert render_llvm(small) != render_llvm(large)
    assert cpu.shared_source(render_llvm(small), small) == cpu.shared_source(render_llvm(large), large)
    device = cpu.CPUDevice(cache_dir=tmp_path)
    sources: list[str] = []
    real_compile = cpu.host_target().compile_alone

    def compile_alone(source: str, level: int = 3) -> bytes:
        sources.append(source)
        return real_compile(source, level)

    monkeypatch.setattr(cpu.host_target(), "compile_alone", compile_alone)
    compiled = device.compile_many([small, large])
    assert len(sources) == 1 and f"@{cpu.SHARED_NAME}(" in sources[0], "one LLVM compile for both"
    keys = [c.cache_token[1] for c in compiled if c.cache_token is not None]
    assert len(keys) == 2 and keys[0] == keys[1], "one disk-cache entry"
    assert all(c.source.startswith(device.render(k)) for c, k in zip(compiled, (small, large))), "each keeps its own"
    for kernel, done in zip((small, large), compiled):
        inputs = random_inputs(kernel, seed=5)
        got = [np.empty(aval.shape, aval.dtype) for aval in kernel.out_avals]
        done(inputs, got)
        want = run_object(kernel, compiler.LLVMCompiler().compile(render_llvm(kernel), 3), inputs)
        np.testing.assert_array_equal(got[0], want[0])
    again = cpu.CPUDevice(cache_dir=tmp_path).load_cached(large, compiled[1].cache_token)
    assert again is not None and again.origin == "disk" and again.source == compiled[1].source


def mlp_like_kernels(m: int, k: int, n: int) -> list[Kernel]:
    """An MLP step's products: a layer with its bias (the activation packed per chunk of rows, along
    the terms), a weight gradient (the activation packed along the rows) and an input gradient with
    the activation's mask in its epilogue (where, comparisons, a divide)."""
    h, w, bias, d, dt = (np.ones(s, np.float32) for s in ((m, k), (k, n), (n,), (m, n), (n, k)))
    return [kernels_of(lambda h, w, bias: fnp.maximum(h, 0.0) @ w + bias, h, w, bias)[0],
            kernels_of(lambda h, d: fnp.maximum(h, 0.0).T @ d, h, d)[0],
            kernels_of(lambda d, w, h: (d @ w) * fnp.where(h > 0.0, 1.0, 0.0) / fnp.where(h == 0.0, 2.0, 1.0),
                       d, dt, h)[0]]


@pytest.mark.parametrize("m,k,n", [(37, 70, 75), (100, 33, 64), (20, 10, 130)], ids=lambda v: str(v))
def test_explicitly_vectorised_tiles_compute_the_bits_of_llvms_vectoriser(
        llvm: compiler.LLVMCompiler, monkeypatch: pytest.MonkeyPatch, m: int, k: int, n: int) -> None:
    """Pipeline 5 (SROA only) on a tile whose packing and epilogue are written on vectors gives the
    bits that pipeline 4's loop vectoriser gives on the scalar loops, and float64's values: masked
    last columns and terms, a chunk's rows not a multiple of 16, short reduction blocks."""
    monkeypatch.delenv("FUNCGRAD_OPT", raising=False)
    monkeypatch.setattr(render_tile, "LARGE_ROWS", 16)  # a large product packs its contiguous operand
    monkeypatch.setattr(render_tile, "LARGE_BYTES", 1 << 12)
    large = product_kernel(m, k, n, epilogue=True)
    assert render_tile._packable(large)
    for kernel in [*mlp_like_kernels(m, k, n), large]:
        inputs = random_inputs(kernel, seed=21)
        for width, height, block in ((64, 6, 0), (32, 14, 5)):
            variant = tiled(kernel, width, height, block)
            assert render_tile.explicitly_vectorised(variant) and cpu.optimization_level(variant) == 5
            source = render_llvm(variant)
            vectors = run_object(variant, llvm.compile(source, 5), inputs)
            try:
                render_tile._Tile.explicit_vectors = False
                scalar_source = render_llvm(variant)
            finally:
                render_tile._Tile.explicit_vectors = True
            assert scalar_source != source and "masked.store" not in scalar_source
            scalar = run_object(variant, llvm.compile(scalar_source, 4), inputs)
            for got, want in zip(vectors, scalar):
                np.testing.assert_array_equal(got, want)
            assert_matches_reference(variant, vectors, inputs)


def test_tiles_that_need_llvms_loop_passes_keep_pipeline_4(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the renderer leaves to LLVM keeps a tile at pipeline 4: a tanh epilogue (scalar), rows
    nested in a batch, an index with div and rem (a flatten LLVM simplifies), vector work that does
    not move with the reduction (LICM's)."""
    monkeypatch.delenv("FUNCGRAD_OPT", raising=False)
    assert not render_tile.explicitly_vectorised(tiled(tanh_product_kernel(), 64, 6))
    a, b = np.ones((3, 40, 64), np.float32), np.ones((3, 64, 80), np.float32)
    batched = kernels_of(lambda a, b: fnp.einsum("bij,bjk->bik", a, b), a, b)[0]
    assert not render_tile.explicitly_vectorised(tiled(batched, 64, 6))
    x, w = np.ones((64, 4, 3, 3), np.float32), np.ones((36, 80), np.float32)
    # a channels-last flatten of NCHW data: digits that do not fold back into one variable
    flatten = kernels_of(lambda x, w: fnp.transpose(x, (0, 2, 3, 1)).reshape(64, 36) @ w, x, w)[0]
    assert "rem(" in str(flatten) and cpu.optimization_level(tiled(flatten, 64, 6)) == 4
    plain_flatten = kernels_of(lambda x, w: x.reshape(64, 36) @ w, x, w)[0]  # folds to r0 + 36*g0: no div/rem
    assert "rem(" not in str(plain_flatten) and cpu.optimization_level(tiled(plain_flatten, 64, 6)) == 5
    x, y = np.ones((200, 64), np.float32), np.ones((64,), np.float32)
    centred = kernels_of(lambda x, y: fnp.sum(fnp.maximum(x + y, 0.0) - fnp.maximum(y, 0.0), axis=0), x, y)[0]
    one_row = attrs.evolve(centred, opts=(Opt("tile", 0, 64), Opt("thread", 0, 1)))
    render_tile.check_tile_opts(centred, one_row.opts or ())
    assert not render_tile.explicitly_vectorised(one_row)
    plain = attrs.evolve(centred, reduce_expr=kernels_of(lambda x: fnp.sum(x, axis=0), x)[0].reduce_expr)
    assert render_tile.explicitly_vectorised(attrs.evolve(plain, opts=one_row.opts)), "the same sum without it"


def test_column_sums_tile_as_one_row_with_the_bits_of_the_plain_loops(
        llvm: compiler.LLVMCompiler, monkeypatch: pytest.MonkeyPatch) -> None:
    """A bias gradient (a 256 x 512 sum over the batch) is a one-row tile from ONE_ROW_MIN_WORK terms
    on, compiled with SROA only; it sums each column in the order the i-k-j loops did."""
    monkeypatch.delenv("FUNCGRAD_OPT", raising=False)
    x = np.ones((256, 520), np.float32)
    kernel = kernels_of(lambda x: fnp.sum(x, axis=0), x)[0]
    tiled_sum = optimize(kernel)
    assert tiled_sum.opts == (Opt("tile", 0, 64), Opt("thread", 0, 1)) and cpu.optimization_level(tiled_sum) == 5
    small = kernels_of(lambda x: fnp.sum(x, axis=0), np.ones((64, 512), np.float32))[0]
    assert not any(opt.action == "tile" for opt in optimize(small).opts or ()), "under ONE_ROW_MIN_WORK"
    monkeypatch.setattr(render_tile, "ONE_ROW_MIN_WORK", 1 << 30)
    plain = optimize(kernel)
    assert not any(opt.action == "tile" for opt in plain.opts or ())
    inputs = random_inputs(kernel, seed=4)
    got = run_object(tiled_sum, llvm.compile(render_llvm(tiled_sum), 5), inputs)
    want = run_object(plain, llvm.compile(render_llvm(plain), cpu.optimization_level(plain)), inputs)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[0], inputs[0].astype(np.float64).sum(axis=0), rtol=1e-5, atol=1e-4)


def test_waiting_kernels_compile_heaviest_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """When more kernels wait than threads compile, the one with the largest estimated LLVM time goes
    next (so the last compile is a short one and no thread idles while another finishes a long one)."""
    from concurrent.futures import ThreadPoolExecutor
    monkeypatch.delenv("FUNCGRAD_OPT", raising=False)
    monkeypatch.setattr(cpu_threads, "thread_count", lambda: 2)
    kernels = [product_kernel(4, 16, 16), tiled(product_kernel(64, 256, 128, epilogue=True), 64, 6),
               adam_like_kernel(5000), libm_kernel("asinh_to_order")]

    class GatedPool:
        """One thread that starts only once every compile is waiting."""

        def __init__(self, expected: int) -> None:
            self.real, self.count, self.expected, self.gate = ThreadPoolExecutor(1), 0, expected, threading.Event()

        def submit(self, task):  # noqa: ANN001, ANN202
            self.count += 1
            if self.count == 1:
                self.real.submit(self.gate.wait)
            if self.count == self.expected:
                self.gate.set()
            return self.real.submit(task)

    pool = GatedPool(len(kernels))
    monkeypatch.setattr(cpu, "compile_pool", lambda: pool)
    order: list[tuple[str, int]] = []
    real_compile = cpu.host_target().compile_alone

    def compile_alone(source: str, level: int = 3) -> bytes:
        order.append((source, level))
        return real_compile(source, level)

    monkeypatch.setattr(cpu.host_target(), "compile_alone", compile_alone)
    compiled = cpu.CPUDevice(cache_dir=tmp_path).compile_many(kernels)
    assert len(order) == len(kernels) and len(compiled) == len(kernels)
    costs = [cpu.compile_cost(source, level) for source, level in order]
    assert costs == sorted(costs, reverse=True) and len(set(costs)) == len(costs)
    pool.real.shutdown()
