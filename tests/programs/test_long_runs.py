"""Long runs and bounded caches: a training loop's memory and caches stop growing after warm-up, and
every cache that grows with the programs a process runs (jit signatures, plans, compiled kernels,
LLVM engines, the disk cache) has a bound and evicts safely."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, lower, nn
from funcgrad import jit_runtime as jit_module
from funcgrad.debug import live_counts
from funcgrad.devices import cpu, get_device
from funcgrad.devices.reference import ReferenceDevice
from funcgrad.lower import plan
from funcgrad.util.caches import LRUCache, cache_size

# --- long runs ---------------------------------------------------------------------------------------


def resident_mb() -> float:
    """This process's resident memory in MiB (Linux /proc)."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


class TinyMLP(nn.Module):
    def __init__(self) -> None:
        self.hidden, self.out = nn.Linear(16, 32), nn.Linear(32, 4)

    def __call__(self, x: Tensor) -> Tensor:
        return self.out(self.hidden(x).relu())


def training_step(model: TinyMLP, opt: nn.optim.Optimizer, x: Tensor, y: Tensor) -> Tensor:
    opt.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y)
    loss.backward()
    opt.step()
    return loss


def run_training(step, steps: int, checkpoints: tuple[int, ...]) -> dict[int, tuple[float, dict[str, int], float]]:
    """Train TinyMLP for ``steps`` steps of ``step``; at each checkpoint: (RSS MiB, live_counts, loss)."""
    Tensor.manual_seed(0)
    model = TinyMLP()
    opt = nn.optim.Adam(nn.state.get_parameters(model), lr=1e-2)
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((8, 32, 16)).astype(np.float32)
    labels = (inputs[..., :4].argmax(-1)).astype(np.int32)  # learnable: the largest of the first 4 features
    seen = {}
    for number in range(1, steps + 1):
        loss = float(step(model, opt, Tensor(inputs[number % 8]), Tensor(labels[number % 8])).item())
        if number in checkpoints:
            seen[number] = (resident_mb(), live_counts(), loss)
    return seen


def check_steady(seen: dict[int, tuple[float, dict[str, int], float]], label: str) -> None:
    (rss_warm, counts_warm, loss_warm), (rss_end, counts_end, loss_end) = seen[200], seen[2000]
    print(f"{label}: RSS {rss_warm:.1f} MiB at step 200, {rss_end:.1f} MiB at step 2000; {counts_end}")
    assert loss_end < loss_warm, "the loop does not train"
    assert counts_end == counts_warm, f"{label}: live objects grew after warm-up: {counts_warm} -> {counts_end}"
    assert rss_end - rss_warm < 5.0, f"{label}: resident memory grew {rss_end - rss_warm:.1f} MiB after warm-up"


def _long_run(mode: str) -> None:
    """2000 steps of TinyMLP, jitted or eager, checked steady after warm-up (run in its own process)."""
    started = time.perf_counter()
    seen = run_training(fg.jit(training_step) if mode == "jitted" else training_step, 2000, (200, 2000))
    check_steady(seen, f"2000 {mode} steps ({time.perf_counter() - started:.0f} s)")
    if mode == "jitted":
        assert seen[2000][1]["jit_traces"] >= 1


def _in_a_fresh_process(mode: str) -> None:
    """Resident memory is measured in a process of its own: in the suite's (1.1 GB, every cache at its
    bound) the heap's churn from other tests' leftovers once showed as 9 MiB of growth."""
    repo = Path(__file__).resolve().parents[2]
    code = f"from tests.programs.test_long_runs import _long_run; _long_run({mode!r})"
    child = subprocess.run([sys.executable, "-c", code],
                           cwd=repo, env={**os.environ, "PYTHONPATH": str(repo)}, capture_output=True, text=True,
                           timeout=900)
    print(child.stdout)
    assert child.returncode == 0, child.stdout + child.stderr[-3000:]


@pytest.mark.slow
def test_jitted_training_loop_stops_growing_after_warm_up():
    _in_a_fresh_process("jitted")


@pytest.mark.slow
def test_eager_training_loop_stops_growing_after_warm_up():
    _in_a_fresh_process("eager")


def test_live_counts_see_buffers_plans_kernels_and_traces():
    before = live_counts()
    kept = [Tensor(np.full(1000, i, np.float32)) for i in range(3)]
    f = fg.jit(lambda x: fnp.sin(x) * 3.0 + 1.0)
    result = f(Tensor(np.arange(7, dtype=np.float32) + 1e3))  # shape seen nowhere else: a new plan
    np.testing.assert_allclose(result.numpy(), np.sin(np.arange(7) + 1e3) * 3 + 1, rtol=1e-5)
    after = live_counts()
    assert after["lazy_buffers"] >= before["lazy_buffers"] + 4  # kept, result (the argument is gone)
    assert after["lazy_bytes"] >= before["lazy_bytes"] + 3 * 4000
    assert after["jit_functions"] == before["jit_functions"] + 1 and after["jit_traces"] == before["jit_traces"] + 1
    assert after["plans"] >= 1 and after["kernels"] >= 1 and after["engines"] >= 1
    del kept, f, result
    assert live_counts()["jit_functions"] == before["jit_functions"]


# --- bounded caches ------------------------------------------------------------------------------------

def test_lru_cache_evicts_the_least_recently_used():
    cache = LRUCache[str, int](2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1  # "a" is now the most recently used
    cache.put("c", 3)
    assert cache.get("b") is None and cache.get("a") == 1 and cache.get("c") == 3
    assert len(cache) == 2 and cache.evictions == 1
    assert cache.put("a", 10) == 1, "the first value stored wins"
    cache.max_entries = 1
    cache.put("d", 4)
    assert cache.values() == [4]
    with pytest.raises(ValueError, match="at least 1"):
        LRUCache(0)


def test_cache_sizes_come_from_the_environment(monkeypatch):
    monkeypatch.delenv("FUNCGRAD_PLAN_CACHE_SIZE", raising=False)
    assert cache_size("FUNCGRAD_PLAN_CACHE_SIZE", 1024) == 1024
    monkeypatch.setenv("FUNCGRAD_PLAN_CACHE_SIZE", "7")
    assert cache_size("FUNCGRAD_PLAN_CACHE_SIZE", 1024) == 7
    for bad in ("0", "-3", "many"):
        monkeypatch.setenv("FUNCGRAD_PLAN_CACHE_SIZE", bad)
        with pytest.raises(ValueError, match=f"FUNCGRAD_PLAN_CACHE_SIZE='{bad}' \\(environment variable\\): expected a "
                                             "whole number of cache entries >= 1"):
            cache_size("FUNCGRAD_PLAN_CACHE_SIZE", 1024)


def test_jit_keeps_a_bounded_number_of_signatures(monkeypatch):
    monkeypatch.setattr(jit_module, "JIT_CACHE_SIZE", 3)
    f = fg.jit(lambda x: x * 2 + 1)
    for n in range(1, 7):
        np.testing.assert_array_equal(f(Tensor(np.ones(n, np.float32))).numpy(), np.full(n, 3.0))
    assert len(f._cache) == 3 and len(f._simple_cache) == 3 and f.trace_count == 6
    np.testing.assert_array_equal(f(Tensor(np.ones(6, np.float32))).numpy(), np.full(6, 3.0))
    assert f.trace_count == 6, "a recent signature stays cached"
    np.testing.assert_array_equal(f(Tensor(np.ones(1, np.float32))).numpy(), np.full(1, 3.0))
    assert f.trace_count == 7, "an evicted signature is traced again, and gives the same result"


@pytest.fixture
def small_plan_cache():
    """The process's plan cache limited to 3 plans for one test."""
    saved = plan._PLANS.max_entries
    plan._PLANS.max_entries = 3
    yield plan._PLANS
    plan._PLANS.max_entries = saved


def test_plan_cache_is_bounded(small_plan_cache):
    for n in range(1, 9):
        x = Tensor(np.arange(n, dtype=np.float32) + 0.5)
        np.testing.assert_allclose(fnp.cos(x * 5.0).sum().numpy(), np.cos((np.arange(n) + 0.5) * 5).sum(), rtol=1e-5)
        assert len(small_plan_cache) <= 3


def test_sixty_new_shapes_later_every_cache_is_at_its_bound(small_plan_cache, monkeypatch):
    """A jitted function called on ever new shapes (variable-length batches): traces, plans, kernels and
    engines stay at their bounds, and each result is right."""
    device = get_device(None)
    if not isinstance(device, cpu.CPUDevice):
        pytest.skip(f"counts the CPU device's kernels and engines; the default device is {device.name}")
    monkeypatch.setattr(jit_module, "JIT_CACHE_SIZE", 4)
    monkeypatch.setattr(lower._JIT_PLANS, "max_entries", 3)
    monkeypatch.setattr(device.memory_cache, "max_entries", 6)
    f = fg.jit(lambda x: (fnp.tanh(x) * 2.0).sum())
    start = live_counts()
    for n in range(1, 61):
        x = np.linspace(-1, 1, n, dtype=np.float32)
        np.testing.assert_allclose(f(Tensor(x)).numpy(), 2 * np.tanh(x.astype(np.float64)).sum(), rtol=1e-5, atol=1e-5)
    end = live_counts()
    assert f.trace_count == 60 and len(f._cache) == 4
    assert end["plans"] <= 3 and end["jit_plans"] <= 3 and len(device.memory_cache) <= 6
    assert end["engines"] - start["engines"] <= 6 + 2 * 3, f"engines: {start['engines']} -> {end['engines']}"


def test_evicted_kernels_keep_working_in_cached_plans(tmp_path):
    """A kernel evicted from the device's memory cache is still used by a plan that holds it: its LLVM
    engine must live on; once nothing holds it, the engine is freed (by the next compile)."""
    device = cpu.CPUDevice(tmp_path)
    device.memory_cache.max_entries = 1
    programs = [fg.make_ir(lambda x, k=k: fnp.exp(x * float(k)).sum())(np.ones(5 + k, np.float32)) for k in range(5)]
    plans = [plan.Plan(ir, device) for ir in programs[:4]]  # uncached plans, on this device only
    assert len(device.memory_cache) == 1 and device.stats["compiled"] >= 4
    engines = len(cpu.LIVE_ENGINES)
    gc.collect()
    plan.Plan(programs[4], device)  # a compile: frees the engines no kernel uses (none yet)
    for k, compiled_plan in enumerate(plans):
        (value,) = compiled_plan.run([np.ones(5 + k, np.float32)])
        np.testing.assert_allclose(value, (5 + k) * np.exp(float(k)), rtol=1e-5)
    del plans, compiled_plan
    gc.collect()
    assert len(cpu.LIVE_ENGINES) <= engines - 3, "the evicted kernels' engines are released with their plans"
    assert cpu._RETIRED_ENGINES, "... and queued to be freed under the LLVM lock"
    kept = cpu.CPUDevice(tmp_path / "other").compile(plan.Plan(programs[0], ReferenceDevice()).kernels[0])
    assert kept.origin == "compiled" and not cpu._RETIRED_ENGINES, "the next load or compile frees them"


def _fill_cache_folder(folder: Path, sizes: list[int]) -> list[Path]:
    folder.mkdir(parents=True)
    paths = []
    for number, size in enumerate(sizes):
        path = folder / f"{number:02d}.o"
        path.write_bytes(b"x" * size)
        os.utime(path, (1000.0 + number, 1000.0 + number))  # older first
        paths.append(path)
    return paths


def test_trim_folder_deletes_the_least_recently_used_files(tmp_path):
    paths = _fill_cache_folder(tmp_path / "cpu", [100] * 10)
    stale = tmp_path / "cpu" / ".tmp-dead.o"
    stale.write_bytes(b"y" * 50)
    os.utime(stale, (1000.0, 1000.0))
    assert cpu.trim_folder(tmp_path / "cpu", 2000) == 50, "under the bound only stale temporary files go"
    assert all(p.exists() for p in paths) and not stale.exists()
    deleted = cpu.trim_folder(tmp_path / "cpu", 800)  # 1000 bytes > 800: down to 600 (keep_fraction 0.75)
    assert deleted == 400
    assert [p.exists() for p in paths] == [False] * 4 + [True] * 6


def test_disk_cache_stays_under_its_bound_and_a_hit_counts_as_a_use(tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCGRAD_CACHE_MAX_MB", "1")
    cache = cpu.DiskCache(tmp_path)
    assert cache.max_bytes == 2**20
    entry_size = 48 + 1000  # header (magic, SHA-256, length) + payload
    cache.max_bytes = 3 * entry_size + 10
    for age, name in enumerate(["first", "second", "third"]):
        cache.store(name, name[0].encode() * 1000)
        os.utime(cache.path(name), (1000.0 + age, 1000.0 + age))
    assert cache.load("first") == b"f" * 1000
    assert cache.path("first").stat().st_mtime > 2000, "a hit makes the entry the most recently used"
    cache.store("fourth", b"4" * 1000)  # over the bound: the oldest go, down to 3/4 of it
    assert [cache.load(name) is not None for name in ("first", "second", "third", "fourth")] == [
        True, False, False, True]
    assert sum(p.stat().st_size for p in cache.folder.iterdir()) == 2 * entry_size
