"""Threads and processes: jitted functions called from several threads at once (the first calls racing
to trace), eager lazy Tensors in threads, kernels compiled from threads into one device, and two
processes compiling the same kernels into one disk-cache folder at once."""

from __future__ import annotations

import multiprocessing
import queue
import sys
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, nn
from funcgrad.devices import cpu
from funcgrad.lower import plan

THREADS = 4


def run_in_threads(work: Callable[[int], Any], threads: int = THREADS) -> list[Any]:
    """``work(number)`` in ``threads`` threads started behind a barrier; their results, in order. An
    exception in a thread is raised here."""
    barrier = threading.Barrier(threads)
    results: list[Any] = [None] * threads
    errors: list[BaseException] = []

    def body(number: int) -> None:
        try:
            barrier.wait()
            results[number] = work(number)
        except BaseException as error:  # noqa: BLE001 - re-raised in the main thread
            errors.append(error)

    workers = [threading.Thread(target=body, args=(n,)) for n in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(timeout=120)
    assert not any(worker.is_alive() for worker in workers), "a thread hung"
    if errors:
        raise errors[0]
    return results


def reference(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    return np.tanh(x64 @ w64).sum(axis=0) + np.exp(-x64 ** 2).mean()


def test_one_jitted_function_from_four_threads_at_once():
    @fg.jit
    def f(x, w):
        return fnp.tanh(x @ w).sum(axis=0) + fnp.exp(-x ** 2).mean()

    rng = np.random.default_rng(0)
    inputs = [(rng.standard_normal((6, 5)).astype(np.float32), rng.standard_normal((5, 3)).astype(np.float32))
              for _ in range(THREADS * 25)]

    def work(number: int) -> list[np.ndarray]:
        mine = inputs[number::THREADS]
        return [f(Tensor(x), Tensor(w)).numpy() for x, w in mine]  # the first calls of all threads race

    results = run_in_threads(work)
    for number, outs in enumerate(results):
        for (x, w), out in zip(inputs[number::THREADS], outs):
            np.testing.assert_allclose(out, reference(x, w), rtol=1e-5, atol=1e-5)
    assert f.trace_count == 1, "the threads share one trace"


def test_different_jitted_functions_in_four_threads():
    functions = [fg.jit(lambda x, k=k: fnp.sin(x * (k + 1)) + k) for k in range(THREADS)]
    xs = np.linspace(-2, 2, 40, dtype=np.float32).reshape(8, 5)

    def work(number: int) -> list[np.ndarray]:
        return [functions[number](Tensor(xs + step)).numpy() for step in range(20)]

    for number, outs in enumerate(run_in_threads(work)):
        for step, out in enumerate(outs):
            np.testing.assert_allclose(out, np.sin((xs + step).astype(np.float64) * (number + 1)) + number,
                                       rtol=1e-5, atol=1e-5)
    assert [f.trace_count for f in functions] == [1] * THREADS


def test_training_steps_on_separate_models_in_threads():
    """Tracing swaps tracers into the caller's Tensors: four threads tracing one stateful step on their
    own models at once must each train exactly as a single thread does; so must eager steps."""
    def make(seed: int) -> tuple[nn.Linear, nn.optim.SGD, np.ndarray, np.ndarray]:
        Tensor.manual_seed(seed)  # the global random state: made here, in one thread
        model = nn.Linear(4, 2)
        rng = np.random.default_rng(seed)
        return model, nn.optim.SGD([model.weight, model.bias], lr=0.1), \
            rng.standard_normal((8, 4)).astype(np.float32), rng.standard_normal((8, 2)).astype(np.float32)

    def train(step: Callable[..., Any], setup: tuple[Any, ...]) -> np.ndarray:
        model, opt, x, y = setup
        for _ in range(10):
            step(model, opt, Tensor(x), Tensor(y))
        return model.weight.numpy()

    def step_fn(model, opt, x, y):
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()
        return loss

    expected = [train(step_fn, make(seed)) for seed in range(THREADS)]  # eager, one thread
    shared_step = fg.jit(step_fn)
    setups = [make(seed) for seed in range(THREADS)]
    results = run_in_threads(lambda number: train(shared_step, setups[number]))
    for got, want in zip(results, expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert shared_step.trace_count == 1
    setups = [make(seed) for seed in range(THREADS)]  # and eager steps (backward, optimiser) in threads
    for got, want in zip(run_in_threads(lambda number: train(step_fn, setups[number])), expected):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_eager_lazy_tensors_in_threads():
    def work(number: int) -> list[float]:
        values = []
        for step in range(15):
            x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4) + number + step)
            y = (x.exp().log() * 2 - x).sum(axis=1).max()  # pending graph, realized by .item()
            values.append(float(y.item()))
        return values

    for number, values in enumerate(run_in_threads(work)):
        want = [float((np.arange(12).reshape(3, 4) + number + step).sum(axis=1).max()) for step in range(15)]
        np.testing.assert_allclose(values, want, rtol=1e-5)


def test_one_pending_graph_realized_by_four_threads_at_once():
    x = np.linspace(0, 1, 50, dtype=np.float32)
    for _ in range(5):
        shared = (fnp.sqrt(Tensor(x) + 1.0) * 3.0).cumsum()  # pending until a thread asks for it
        outs = run_in_threads(lambda number, shared=shared: shared.numpy())
        for out in outs:
            np.testing.assert_allclose(out, np.cumsum(np.sqrt(x.astype(np.float64) + 1) * 3), rtol=1e-5)


def test_backward_in_threads_while_others_make_leaves():
    """backward() lists the Tensors that asked for gradients while other threads add some; with a tiny
    thread switch interval the unguarded listing failed ('dictionary changed size during iteration')
    in about two runs of three."""
    def work(number: int) -> list[float]:
        grads = []
        for step in range(150):
            weight = Tensor(np.ones(3, np.float32), requires_grad=True)
            (weight * float(step + number)).sum().backward()
            grads.append(float(weight.grad.numpy()[0]))
        return grads

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        results = run_in_threads(work)
    finally:
        sys.setswitchinterval(interval)
    for number, grads in enumerate(results):
        np.testing.assert_allclose(grads, np.arange(150) + number)


def test_training_mode_is_per_thread():
    """``with Tensor.train():`` in one thread does not put another thread's dropout and batch norm
    into training mode (it is per thread, as PyTorch's grad mode)."""
    inside, done = threading.Barrier(2), threading.Event()
    seen: dict[str, bool] = {}

    def work(number: int) -> None:
        if number == 0:  # the trainer: stays inside its block until the other thread has looked
            with Tensor.train():
                inside.wait()
                seen["trainer"] = bool(Tensor.training)
                assert done.wait(timeout=60)
        else:
            inside.wait()
            seen["evaluator"] = bool(Tensor.training)
            with Tensor.train():
                seen["evaluator in its own block"] = bool(Tensor.training)
            seen["evaluator after its block"] = bool(Tensor.training)
            done.set()

    run_in_threads(work, threads=2)
    assert seen == {"trainer": True, "evaluator": False, "evaluator in its own block": True,
                    "evaluator after its block": False}
    assert not Tensor.training


def test_one_device_compiles_the_same_kernels_from_threads(tmp_path):
    """Four threads compile the same kernels on one fresh device at once: every result is right, and
    all threads end up with the one compiled kernel the device cached for each."""
    device = cpu.CPUDevice(tmp_path)
    programs = [fg.make_ir(lambda x, k=k: (fnp.cos(x) * k).sum(axis=0))(np.ones((3, 4 + k), np.float32))
                for k in range(1, 7)]

    def work(number: int) -> list[plan.Plan]:
        return [plan.Plan(ir, device) for ir in programs]

    plans_by_thread = run_in_threads(work)
    for plans in plans_by_thread:
        for k, compiled_plan in enumerate(plans, start=1):
            (out,) = compiled_plan.run([np.full((3, 4 + k), 0.5, np.float32)])
            np.testing.assert_allclose(out, np.full(4 + k, 3 * np.cos(0.5) * k), rtol=1e-5)
    for number in range(len(programs)):
        kernels = [list(plans[number].compiled.values()) for plans in plans_by_thread]
        assert all(len(ks) == 1 for ks in kernels)
        assert len({id(ks[0]) for ks in kernels}) == 1, "the threads share the kernel the device cached"
    assert len(device.memory_cache) == len(programs)


# --- two processes, one cache folder ---------------------------------------------------------------------

def many_kernels(x: Tensor) -> list[Tensor]:
    """About ten different kernels: reductions of differently shaped slices."""
    return [(fnp.sin(x[:k + 1] * (k + 1.0)) ** 2).sum(axis=0) for k in range(10)]


def many_kernels_reference(x: np.ndarray) -> list[np.ndarray]:
    return [(np.sin(x[:k + 1].astype(np.float64) * (k + 1.0)) ** 2).sum(axis=0) for k in range(10)]


def compile_into_shared_cache(barrier: Any, results: Any) -> None:
    """A spawned process: wait for the other one, then jit-compile and run ``many_kernels``."""
    from funcgrad.devices import get_device
    barrier.wait()
    x = np.linspace(-1, 1, 10 * 7, dtype=np.float32).reshape(10, 7)
    outs = [out.numpy() for out in fg.jit(many_kernels)(Tensor(x))]
    results.put((outs, dict(get_device("CPU").stats)))


def gather(processes: list[Any], results: Any) -> list[Any]:
    """One result from each process, failing at once if one dies without sending it."""
    gathered: list[Any] = []
    while len(gathered) < len(processes):
        try:
            gathered.append(results.get(timeout=1))
        except queue.Empty:
            dead = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            assert not dead, f"a compiling process failed with exit code {dead[0]} (its traceback is above)"
    for process in processes:
        process.join(timeout=60)
        assert process.exitcode == 0
    return gathered


def test_two_processes_compile_the_same_kernels_into_one_cache_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCGRAD_CACHE", str(tmp_path))
    monkeypatch.setenv("DEVICE", "CPU")
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(2), context.Queue()
    processes = [context.Process(target=compile_into_shared_cache, args=(barrier, results)) for _ in range(2)]
    for process in processes:
        process.start()
    outcomes = gather(processes, results)
    x = np.linspace(-1, 1, 70, dtype=np.float32).reshape(10, 7)
    want = many_kernels_reference(x)
    assert not list((tmp_path / "cpu").glob(".tmp-*")), "no temporary files left behind"
    entries = list((tmp_path / "cpu").glob("*.o"))
    assert len(entries) >= 5 and all(cpu.DiskCache(tmp_path).load(p.stem) is not None for p in entries)
    for outs, stats in outcomes:
        for got, expected in zip(outs, want):
            np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
        assert stats["compiled"] + stats["disk_hits"] == len(entries), "each kernel compiled or loaded once"

    alone = context.Barrier(1)
    third = context.Process(target=compile_into_shared_cache, args=(alone, results))
    third.start()
    [(outs, stats)] = gather([third], results)
    for got, expected in zip(outs, want):
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
    assert stats["compiled"] == 0 and stats["disk_hits"] == len(entries), stats
