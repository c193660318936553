"""The kernel optimiser (funcgrad/lower/optimize.py): heuristic opts pinned to the renderer's old
decisions, every action computing what the NumPy kernel evaluator computes, validity errors, and
BEAM (search, verification, its disk cache)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices import cpu as cpu_module
from funcgrad.devices import cpu_threads
from funcgrad.devices.cpu import CPUDevice
from funcgrad.lower import optimize as optimize_module
from funcgrad.lower.kernel import Kernel, Opt, evaluate_kernel
from funcgrad.lower.optimize import (
    beam_cache_path,
    beam_search,
    cached_opts,
    check_opts,
    heuristic_opts,
    neighbours,
    optimize,
    outputs_match,
)
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.schedule import KernelStep, schedule

RNG = np.random.default_rng(0)


def f32(*shape: int) -> np.ndarray:
    return RNG.uniform(-1, 1, shape).astype(np.float32)


def kernels_of(fn: Callable[..., Any], *args: np.ndarray) -> list[Kernel]:
    ir = fg.make_ir(fn)(*args)
    return [step.kernel for step in schedule(ir) if isinstance(step, KernelStep)]


def only_kernel(fn: Callable[..., Any], *args: np.ndarray) -> Kernel:
    (kernel,) = kernels_of(fn, *args)
    return kernel


def softmax(x: Any) -> Any:
    e = fnp.exp(x - x.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


@pytest.fixture
def two_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_threads, "thread_count", lambda: 2)


@pytest.fixture(autouse=True)
def private_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Every test gets its own kernel cache folder (BEAM choices live there) and no BEAM."""
    monkeypatch.setenv("FUNCGRAD_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("BEAM", raising=False)


def opts(*items: tuple[str, int, int]) -> tuple[Opt, ...]:
    return tuple(Opt(*item) for item in items)


# --- the heuristics reproduce the renderer's old decisions -------------------------------------------

PINNED = [  # (label, program, inputs, heuristic opts on 2 CPUs)
    ("matmul+relu", lambda x, y: fnp.maximum(x @ y + 1.0, 0.0), (f32(24, 40), f32(40, 32)),
     opts(("reorder", 0, 0), ("upcast", 0, 2))),
    ("matmul short row", lambda x, y: x @ y, (f32(30, 50), f32(50, 20)),
     opts(("reorder", 0, 0), ("upcast", 0, 2), ("vectorize", 0, 0))),
    ("matmul one row", lambda x, y: x @ y, (f32(1, 64), f32(64, 100)), opts(("reorder", 0, 0))),
    ("batched matmul", lambda x, y: fnp.einsum("bij,bjk->bik", x, y), (f32(4, 30, 50), f32(4, 50, 70)),
     opts(("reorder", 0, 0), ("upcast", 1, 2), ("thread", 0, 2))),
    ("row sum", lambda x: (x * 2).sum(axis=1), (f32(24, 40),), ()),
    ("long sum", lambda x: x.sum(), (f32(300, 300),), opts(("split", 1, 0))),
    ("long column sum", lambda x: x.sum(axis=(0, 2)), (f32(64, 8, 128),), opts(("split", 1, 0))),
    ("small elementwise", lambda x: fnp.tanh(x) * 3 + 1, (f32(10, 7),), ()),
    ("large elementwise", lambda x: fnp.tanh(x) * 3 + 1, (f32(1000, 700),), opts(("thread", 0, 2))),
]


@pytest.mark.parametrize("label, fn, args, expected", PINNED, ids=[p[0] for p in PINNED])
def test_heuristic_opts_are_the_old_decisions(two_cpus: None, label: str, fn: Callable[..., Any],
                                              args: tuple[np.ndarray, ...], expected: tuple[Opt, ...]) -> None:
    assert heuristic_opts(only_kernel(fn, *args)) == expected


def test_softmax_kernels_thread_only_the_heavy_ones(two_cpus: None) -> None:
    got = [heuristic_opts(k) for k in kernels_of(softmax, f32(512, 512))]
    # max (its float max loop unrolled 4 times: four independent chains), sum of exp, exp / sum
    assert got == [opts(("unroll", 0, 4)), opts(("thread", 0, 2)), opts(("thread", 0, 2))]


@pytest.mark.parametrize("op, threads", [(fnp.exp, 1), (fnp.log, 1), (fnp.arctan, 2)])
def test_inline_float32_exp_counts_less_towards_threads(two_cpus: None, op: Callable[..., Any], threads: int) -> None:
    """float32 exp and log are inline vector polynomials (~1 ns), arctan a libm call (~10 ns): 2^16 of
    them are worth a second thread only for arctan (softmax's 256 x 10 x 10 backward sum of exps took
    40 us on two threads against 13 us on one)."""
    kernel = only_kernel(lambda x: op(x) + 1, RNG.uniform(0.5, 1, (256, 256)).astype(np.float32))
    assert heuristic_opts(kernel) == (opts(("thread", 0, 2)) if threads == 2 else ())


def test_one_cpu_means_no_thread_opt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cpu_threads, "thread_count", lambda: 1)
    assert heuristic_opts(only_kernel(lambda x: fnp.tanh(x) * 3 + 1, f32(1000, 700))) == ()


def test_unoptimised_kernels_render_with_the_heuristic_opts() -> None:
    kernel = only_kernel(lambda x, y: x @ y, f32(30, 50), f32(50, 20))
    explicit = render_llvm(attrs.evolve(kernel, opts=heuristic_opts(kernel)))
    assert render_llvm(kernel) == explicit
    assert "%row1 = alloca" in explicit and '"llvm.loop.unroll.disable"' in explicit
    plain = render_llvm(attrs.evolve(kernel, opts=()))
    assert "%row0" not in plain and "llvm.loop" not in plain


def test_kernel_text_shows_its_opts() -> None:
    kernel = only_kernel(lambda x, y: x @ y, f32(30, 50), f32(50, 20))
    assert "opts" not in str(kernel)
    optimized = attrs.evolve(kernel, opts=opts(("reorder", 0, 0), ("upcast", 0, 2), ("thread", 0, 2)))
    assert str(optimized).splitlines()[-1] == "  opts: reorder(0, 0) upcast(0, 2) thread(0, 2)"
    assert str(attrs.evolve(kernel, opts=())).splitlines()[-1] == "  opts: none"


@pytest.mark.usefixtures("on_cpu")  # the CPU device's kernels carry opts
def test_debug_3_prints_kernels_with_their_opts(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DEBUG", "3")
    x, y = f32(30, 50), f32(50, 20)
    fg.jit(lambda a, b: (a @ b) * 3.0)(x, y).numpy()
    assert "  opts: reorder(0, 0) upcast(0, 2) vectorize(0, 0)" in capsys.readouterr().err


# --- every action computes the same result -------------------------------------------------------------

PROGRAMS = [
    ("matmul", lambda x, y: fnp.maximum(x @ y + 1.0, 0.0), (f32(33, 40), f32(40, 48))),
    ("short row matmul", lambda x, y: x @ y, (f32(9, 70), f32(70, 20))),
    ("batched", lambda x, y: fnp.einsum("bij,bjk->bik", x, y), (f32(3, 7, 20), f32(3, 20, 33))),
    ("softmax", softmax, (f32(37, 129),)),
    ("long sum", lambda x: x.sum(axis=(0, 2)), (f32(40, 3, 130),)),
    ("elementwise", lambda x: fnp.tanh(x) * 3 + fnp.exp(x), (f32(50, 90),)),
    ("int sum", lambda x: (x > 0).astype(np.int32).sum(axis=0), (f32(70, 60),)),
]


def run_compiled(kernel: Kernel, inputs: Sequence[np.ndarray], device: CPUDevice) -> list[np.ndarray]:
    outputs = [np.empty(aval.shape, aval.dtype) for aval in kernel.out_avals]
    device.compile(kernel)(inputs, outputs)
    return outputs


def kernel_inputs(kernel: Kernel) -> list[np.ndarray]:
    return [RNG.uniform(-1, 1, a.shape).astype(a.dtype) if a.dtype.kind == "f" else np.zeros(a.shape, a.dtype)
            for a in kernel.in_avals]


@pytest.mark.parametrize("label, fn, args", PROGRAMS, ids=[p[0] for p in PROGRAMS])
def test_every_neighbouring_choice_matches_the_evaluator(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                         label: str, fn: Callable[..., Any],
                                                         args: tuple[np.ndarray, ...]) -> None:
    monkeypatch.setenv("FUNCGRAD_OPT", "3")  # loop hints only matter to an optimised build
    device = CPUDevice(cache_dir=tmp_path)
    checked = 0
    for kernel in kernels_of(fn, *args):
        inputs = kernel_inputs(kernel)
        want = evaluate_kernel(kernel, inputs)
        for choice in (heuristic_opts(kernel), *neighbours(kernel, heuristic_opts(kernel))):
            got = run_compiled(attrs.evolve(kernel, opts=choice), inputs, device)
            assert outputs_match(got, want, int(np.prod(kernel.reduce_shape))), (kernel.name, choice)
            checked += 1
    assert checked >= 6


@pytest.mark.parametrize("rows", [1, 3, 7])
def test_row_blocks_of_any_height_with_any_thread_split(tmp_path: Path, rows: int) -> None:
    """upcast k blocks k rows with a remainder loop; every block height, with axis 0 cut into any
    number of chunks (so chunks start and end mid-block), gives the evaluator's result."""
    for batch in (1, 3):
        x, y = f32(batch, rows, 24), f32(batch, 24, 40)
        inputs = [x, y] if batch > 1 else [x[0], y[0]]
        kernel = only_kernel((lambda a, b: fnp.einsum("bij,bjk->bik", a, b)) if batch > 1 else fnp.matmul, *inputs)
        want = evaluate_kernel(kernel, inputs)
        device = CPUDevice(cache_dir=tmp_path)
        axis = len(kernel.shape) - 2
        for height in range(1, min(4, rows) + 1):
            for chunks in sorted({1, min(3, kernel.shape[0])}):
                choice = opts(("reorder", 0, 0), ("upcast", axis, height), ("thread", 0, chunks))
                got = [np.full(a.shape, 7, a.dtype) for a in kernel.out_avals]
                device.compile(attrs.evolve(kernel, opts=choice))(inputs, got)
                np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5, err_msg=str(choice))


def test_thread_chunks_run_in_the_caller_without_worker_threads(tmp_path: Path) -> None:
    """On one CPU the worker pool has no threads; a kernel whose opts ask for 3 chunks (a stored or BEAM
    choice) runs them all in the caller (it used to wait for a worker forever)."""
    x, y = f32(7, 24), f32(24, 40)
    kernel = only_kernel(fnp.matmul, x, y)
    compiled = CPUDevice(cache_dir=tmp_path).compile(attrs.evolve(kernel, opts=opts(("reorder", 0, 0),
                                                                                      ("thread", 0, 3))))
    got = np.full((7, 40), 7, np.float32)
    chunks: list[tuple[int, int]] = []

    def recorded(*arguments: Any) -> None:
        chunks.append(arguments[-2:])
        compiled.function(*arguments)
    cpu_module._WorkerPool(0).run(recorded, [(got.ctypes.data, x.ctypes.data, y.ctypes.data, lo, hi)
                                             for lo, hi in ((0, 2), (2, 4), (4, 7))])
    assert chunks == [(0, 2), (2, 4), (4, 7)]
    np.testing.assert_allclose(got, x.astype(np.float64) @ y, rtol=1e-5, atol=1e-5)


def test_unroll_and_width_reach_the_llvm_metadata() -> None:
    kernel = only_kernel(lambda x: x.sum(axis=1), f32(64, 300))
    source = render_llvm(attrs.evolve(kernel, opts=opts(("unroll", 0, 4), ("vectorize", 0, 8))))
    assert '!"llvm.loop.unroll.count", i32 4' in source and '!"llvm.loop.vectorize.width", i32 8' in source
    scalar = render_llvm(attrs.evolve(kernel, opts=opts(("unroll", 0, 1), ("vectorize", 0, 1))))
    assert '"llvm.loop.unroll.disable"' in scalar and '"llvm.loop.vectorize.enable", i1 false' in scalar


def test_thread_opt_sets_the_chunk_count(tmp_path: Path) -> None:
    kernel = only_kernel(lambda x: fnp.tanh(x) * 3 + 1, f32(1000, 700))
    device = CPUDevice(cache_dir=tmp_path)
    x = f32(1000, 700)
    for chunks in (1, 3):
        compiled = device.compile(attrs.evolve(kernel, opts=opts(("thread", 0, chunks))))
        assert compiled.threads == chunks and compiled.parallel == (chunks > 1)
        out = np.empty_like(x)
        compiled([x], [out])
        np.testing.assert_allclose(out, np.tanh(x) * 3 + 1, rtol=1e-6, atol=1e-6)


def test_a_kernel_without_opts_takes_its_threads_from_the_source_it_was_compiled_from(
        two_cpus: None, tmp_path: Path) -> None:
    """A stored plan hands back its steps' unoptimised kernels with the compiled code."""
    kernel = only_kernel(lambda x: fnp.tanh(x) * 3 + 1, f32(1000, 700))
    compiled = CPUDevice(cache_dir=tmp_path).compile(attrs.evolve(kernel, opts=opts(("thread", 0, 3))))
    assert cpu_module.CompiledKernel(kernel, compiled.source, compiled.address, "disk", 0.0).threads == 3
    assert cpu_module.CompiledKernel(kernel, "", compiled.address, "disk", 0.0).threads == 2  # the optimiser's


# --- invalid opts -----------------------------------------------------------------------------------------

def test_invalid_opts_raise_clear_errors() -> None:
    matmul = only_kernel(lambda x, y: x @ y, f32(30, 50), f32(50, 20))
    elementwise = only_kernel(lambda x: x * 2, f32(30, 50))
    long_sum = only_kernel(lambda x: x.sum(), f32(300, 300))
    cases = [
        (elementwise, opts(("reorder", 0, 0)), "needs a reduction"),
        (matmul, opts(("upcast", 0, 2)), "reorder"),
        (matmul, opts(("reorder", 0, 0), ("upcast", 0, 31)), r"amount must be 1\.\.30"),
        (matmul, opts(("reorder", 0, 0), ("upcast", 1, 2)), "second-to-last"),
        (matmul, opts(("unroll", 1, 2)), "this kernel has 1"),
        (matmul, opts(("unroll", 0, 0)), "must be >= 1"),
        (matmul, opts(("thread", 0, 31)), r"n = 1\.\.30"),
        (matmul, opts(("reorder", 0, 0), ("reorder", 0, 0)), "given twice"),
        (elementwise, opts(("split", 1, 0)), "float sums"),
        (long_sum, (), "needs a split"),
        (long_sum, opts(("split", 2, 0)), r"split depth must be 1\.\.1"),
        (elementwise, opts(("vectorize", 0, -1)), "width w >= 0"),
    ]
    for kernel, bad, message in cases:
        with pytest.raises(ValueError, match=f"kernel {kernel.name}: .*{message}"):
            check_opts(kernel, bad)
    with pytest.raises(ValueError, match="unknown kernel optimisation 'spin'"):
        Opt("spin")
    with pytest.raises(fg.devices.cpu.KernelCompileError, match="needs a split"):
        CPUDevice().compile(attrs.evolve(long_sum, opts=()))


# --- BEAM ---------------------------------------------------------------------------------------------------

def elementwise_kernel() -> Kernel:
    return only_kernel(lambda x: fnp.tanh(x) * 3 + 1, f32(64, 128))  # 8192 iterations: big enough to search


def counting(calls: list[Kernel]) -> Callable[[Kernel], Any]:
    def compile_and_count(kernel: Kernel) -> Any:
        calls.append(kernel)
        return optimize_module.compile_for_timing(kernel)
    return compile_and_count


def test_beam_returns_valid_opts_and_stores_them(capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEBUG", "2")
    kernel = elementwise_kernel()
    calls: list[Kernel] = []
    chosen = beam_search(kernel, 2, budget_s=3.0, compile=counting(calls))  # room for a round under load
    check_opts(kernel, chosen)
    assert len(calls) >= 2 and calls[0].opts == heuristic_opts(kernel)
    entry = json.loads(beam_cache_path(kernel).read_text())
    assert [tuple(item) for item in entry["opts"]] == [(o.action, o.axis, o.amount) for o in chosen]
    assert f"BEAM {kernel.name}: {len(calls) - 1} candidates" in capsys.readouterr().err
    # a second search, a fresh process (memory forgotten) and optimize() without BEAM all reuse it
    def refuse(kernel: Kernel) -> Any:
        raise AssertionError("a stored choice must not be timed again")
    assert beam_search(kernel, 2, budget_s=1.0, compile=refuse) == chosen
    monkeypatch.setattr(optimize_module, "_REMEMBERED", {})
    assert beam_search(kernel, 2, budget_s=1.0, compile=refuse) == chosen
    assert optimize(kernel).opts == chosen


def test_beam_env_var_searches_when_compiling(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("BEAM", "1")
    monkeypatch.setenv("FUNCGRAD_BEAM_BUDGET", "0.5")
    kernel = elementwise_kernel()
    compiled = CPUDevice(cache_dir=tmp_path).compile(kernel)
    assert compiled.kernel.opts == cached_opts(kernel) is not None
    x = f32(64, 128)
    out = np.empty_like(x)
    compiled([x], [out])
    np.testing.assert_allclose(out, np.tanh(x) * 3 + 1, rtol=1e-6, atol=1e-6)


def test_corrupt_beam_cache_is_ignored_and_rewritten() -> None:
    kernel = elementwise_kernel()
    path = beam_cache_path(kernel)
    path.parent.mkdir(parents=True)
    for garbage in ('{"format": "funcgrad-beam-v1", "opts": [["upcast", 0, 2]]}', "{not json", ""):
        path.write_text(garbage)
        assert cached_opts(kernel) is None
        assert optimize(kernel).opts == heuristic_opts(kernel)
    calls: list[Kernel] = []
    chosen = beam_search(kernel, 1, budget_s=0.5, compile=counting(calls))
    assert calls and cached_opts(kernel) == chosen
    assert json.loads(path.read_text())["format"] == "funcgrad-beam-v1"


class FakeClock:
    """A timer in which running a candidate takes ``cost(opts)`` seconds."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_beam_finds_the_fastest_combination_and_rejects_wrong_outputs() -> None:
    kernel = only_kernel(lambda x: (x * 2).sum(axis=1), f32(64, 300))
    clock = FakeClock()

    def cost(choice: tuple[Opt, ...]) -> float:
        seconds = 10.0 - 3.0 * (Opt("unroll", 0, 4) in choice) - 2.0 * (Opt("vectorize", 0, 8) in choice)
        return seconds - 9.0 * (Opt("vectorize", 0, 16) in choice)  # fastest, but computes garbage

    def fake_compile(candidate: Kernel) -> Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]:
        def run(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
            clock.now += cost(candidate.opts or ())
            for out, value in zip(outputs, evaluate_kernel(candidate, inputs)):
                out[...] = value + (1.0 if Opt("vectorize", 0, 16) in (candidate.opts or ()) else 0.0)
        return run

    chosen = beam_search(kernel, 2, budget_s=1e9, compile=fake_compile, timer=clock)
    assert set(chosen) == {Opt("unroll", 0, 4), Opt("vectorize", 0, 8)}
    assert cached_opts(kernel) == chosen


def test_beam_keeps_the_heuristic_unless_a_choice_is_clearly_faster() -> None:
    kernel = only_kernel(lambda x: (x * 2).sum(axis=1), f32(64, 300))
    clock = FakeClock()

    def fake_compile(candidate: Kernel) -> Callable[[Sequence[np.ndarray], Sequence[np.ndarray]], None]:
        def run(inputs: Sequence[np.ndarray], outputs: Sequence[np.ndarray]) -> None:
            clock.now += 0.98 if Opt("unroll", 0, 2) in (candidate.opts or ()) else 1.0  # within the noise
            for out, value in zip(outputs, evaluate_kernel(candidate, inputs)):
                out[...] = value
        return run

    assert beam_search(kernel, 2, budget_s=1e9, compile=fake_compile, timer=clock) == heuristic_opts(kernel)


def test_stored_plans_made_before_a_beam_choice_are_not_reused(monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    """The plan disk cache keys plans by the BEAM folder's state, so a choice stored later is used."""
    from funcgrad.lower import plan as plan_module
    monkeypatch.delenv("FUNCGRAD_PLAN_CACHE", raising=False)
    x = f32(64, 128)
    ir = fg.make_ir(lambda a: fnp.tanh(a) * 3 + 1)(x)
    kernel = only_kernel(lambda a: fnp.tanh(a) * 3 + 1, x)
    folder = tmp_path / "cache"  # the private_cache fixture's FUNCGRAD_CACHE: plans and BEAM choices together

    def compiled_opts() -> tuple[Opt, ...] | None:
        plan_module._PLANS.clear()  # a new process: only the disk
        plan = plan_module.compile_plan(ir, CPUDevice(cache_dir=folder))
        (only,) = plan.compiled.values()
        np.testing.assert_allclose(plan.run([x])[0], np.tanh(x) * 3 + 1, rtol=1e-6, atol=1e-6)
        return only.kernel.opts

    assert compiled_opts() == heuristic_opts(kernel)
    choice = opts(("vectorize", 0, 4))
    optimize_module._store(kernel, choice, 1.0, 2.0)
    assert compiled_opts() == choice


def test_small_kernels_keep_the_heuristics_without_timing() -> None:
    kernel = only_kernel(lambda x: x * 2, f32(10, 10))

    def refuse(kernel: Kernel) -> Any:
        raise AssertionError("small kernels are not searched")
    assert beam_search(kernel, 4, budget_s=1.0, compile=refuse) == heuristic_opts(kernel)
    with pytest.raises(ValueError, match="width must be >= 1"):
        beam_search(kernel, 0)
