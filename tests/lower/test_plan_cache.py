"""The whole-plan disk cache (funcgrad/lower/plan.py ``PlanDiskCache``) and the phase timings.

A plan stored by one CPUDevice is loaded by a second one with the same folder (as a second process
would) without scheduling, rendering or compiling; damaged or stale entries are rebuilt and the
result is still right; different IRs never share an entry. ``fresh_process`` empties the in-memory
plan cache so each compile_plan goes to the disk."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices import cpu as cpu_module
from funcgrad.devices import cpu_threads
from funcgrad.devices.cpu import CPUDevice
from funcgrad.ir.core import IR
from funcgrad.lower import plan as plan_module
from funcgrad.lower.plan import PHASE_COUNTS, PHASE_SECONDS, compile_plan

REPO = Path(__file__).resolve().parents[2]
RNG = np.random.default_rng(7)
X = RNG.standard_normal((8, 4)).astype(np.float32)
Y = RNG.standard_normal((4, 5)).astype(np.float32)


def program(x: Any, y: Any) -> Any:
    """Two kernels and two host steps (sort, cumsum)."""
    return fnp.sort(fnp.tanh(x @ y), axis=1)[:, ::-1] + fnp.cumsum(x, axis=0)[:, :1]


def expected(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x64, y64 = x.astype(np.float64), y.astype(np.float64)
    return np.sort(np.tanh(x64 @ y64), axis=1)[:, ::-1] + np.cumsum(x64, axis=0)[:, :1]


def make_ir(fn: Callable[..., Any] = program, *args: np.ndarray) -> IR:
    return fg.make_ir(fn)(*(args or (X, Y)))


@pytest.fixture
def fresh_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """No plan in memory (the disk is all a new process would have)."""
    plan_module._PLANS.clear()
    monkeypatch.delenv("FUNCGRAD_PLAN_CACHE", raising=False)


def new_process(monkeypatch: pytest.MonkeyPatch, folder: Path) -> CPUDevice:
    """Forget every plan held in memory and return a new device on ``folder``."""
    plan_module._PLANS.clear()
    return CPUDevice(cache_dir=folder)


def forbid_building(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a plan loaded from disk was scheduled or rendered")
    monkeypatch.setattr(plan_module, "schedule", refuse)
    monkeypatch.setattr(cpu_module, "render_llvm", refuse)


def run(ir: IR, device: CPUDevice, *args: np.ndarray) -> np.ndarray:
    return compile_plan(ir, device).run(list(args or (X, Y)))[0]


def entries(folder: Path) -> list[Path]:
    return sorted((folder / "plans").glob("*.plan"))


def test_a_plan_round_trips_through_the_disk_without_scheduling_or_compiling(
        fresh_process: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    first = CPUDevice(cache_dir=tmp_path)
    np.testing.assert_allclose(run(make_ir(), first), expected(X, Y), rtol=1e-5, atol=1e-5)
    assert first.stats["compiled"] == 2 and first.plan_cache is not None and first.plan_cache.stats["stored"] == 1
    assert len(entries(tmp_path)) == 1

    second = new_process(monkeypatch, tmp_path)
    forbid_building(monkeypatch)
    loads_before = PHASE_COUNTS["plans_loaded"]
    other_x, other_y = (RNG.standard_normal(a.shape).astype(np.float32) for a in (X, Y))
    plan = compile_plan(make_ir(), second)
    np.testing.assert_allclose(plan.run([other_x, other_y])[0], expected(other_x, other_y), rtol=1e-5, atol=1e-5)
    assert second.stats == {"compiled": 0, "disk_hits": 2, "memory_hits": 0}
    assert second.plan_cache is not None and second.plan_cache.stats["loaded"] == 1
    assert PHASE_COUNTS["plans_loaded"] == loads_before + 1
    assert [type(step).__name__ for step in plan.steps] == ["KernelStep", "HostStep", "HostStep", "KernelStep"]
    assert all(kernel.origin == "disk" for kernel in plan.compiled.values())


def test_a_plan_whose_object_code_is_gone_recompiles_only_its_kernels(
        fresh_process: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    run(make_ir(), CPUDevice(cache_dir=tmp_path))
    for object_file in (tmp_path / "cpu").glob("*.o"):
        object_file.unlink()
    device = new_process(monkeypatch, tmp_path)
    monkeypatch.setattr(plan_module, "schedule", lambda ir: pytest.fail("scheduled again"))
    np.testing.assert_allclose(run(make_ir(), device), expected(X, Y), rtol=1e-5, atol=1e-5)
    assert device.stats["compiled"] == 2 and device.plan_cache is not None and device.plan_cache.stats["loaded"] == 1


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x10
    path.write_bytes(bytes(data))


def empty(path: Path) -> None:
    path.write_bytes(b"")


@pytest.mark.parametrize("damage", [truncate, flip_a_byte, empty])
def test_a_damaged_entry_is_rebuilt_and_the_result_is_right(
        fresh_process: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, damage: Callable[[Path], None]) -> None:
    run(make_ir(), CPUDevice(cache_dir=tmp_path))
    [entry] = entries(tmp_path)
    damage(entry)
    device = new_process(monkeypatch, tmp_path)
    scheduled_before = PHASE_COUNTS["plans_built"]
    np.testing.assert_allclose(run(make_ir(), device), expected(X, Y), rtol=1e-5, atol=1e-5)
    assert device.plan_cache is not None
    assert device.plan_cache.stats == {"loaded": 0, "stored": 1, "rejected": 1}
    assert PHASE_COUNTS["plans_built"] == scheduled_before + 1
    again = new_process(monkeypatch, tmp_path)  # the rebuilt entry is whole again
    run(make_ir(), again)
    assert again.plan_cache is not None and again.plan_cache.stats["loaded"] == 1


def test_an_entry_of_another_funcgrad_version_is_not_trusted(
        fresh_process: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A well-formed entry (valid checksum) whose header names other code, put where the current
    code's entry belongs, is rejected; another code version also looks for its plans elsewhere."""
    current = plan_module.code_version()
    monkeypatch.setattr(plan_module, "code_version", lambda: "0.0.1+old")
    old = CPUDevice(cache_dir=tmp_path)
    run(make_ir(), old)
    [stale] = entries(tmp_path)
    monkeypatch.setattr(plan_module, "code_version", lambda: current)
    device = new_process(monkeypatch, tmp_path)
    assert device.plan_cache is not None
    header = device.plan_cache.header(plan_module.structure_key(make_ir()), "CPU")
    assert device.plan_cache.path(header) != stale
    stale.rename(device.plan_cache.path(header))
    np.testing.assert_allclose(run(make_ir(), device), expected(X, Y), rtol=1e-5, atol=1e-5)
    assert device.plan_cache.stats == {"loaded": 0, "stored": 1, "rejected": 1}


def test_a_code_changing_setting_keeps_plans_apart(fresh_process: None, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    run(make_ir(), CPUDevice(cache_dir=tmp_path))
    monkeypatch.setenv("BEAM", "2")
    device = CPUDevice(cache_dir=tmp_path)
    assert device.plan_cache is not None
    structure = plan_module.structure_key(make_ir())
    assert not device.plan_cache.path(device.plan_cache.header(structure, "CPU")).exists()


def test_a_plan_stored_with_fewer_cpus_is_not_reused_with_more(fresh_process: None, monkeypatch: pytest.MonkeyPatch,
                                                               tmp_path: Path) -> None:
    # kernels' thread opts count the CPUs: a plan stored under `taskset -c 0` must not run one thread later
    monkeypatch.setattr(cpu_threads, "thread_count", lambda: 1)
    run(make_ir(), CPUDevice(cache_dir=tmp_path))
    monkeypatch.setattr(cpu_threads, "thread_count", lambda: 2)
    device = CPUDevice(cache_dir=tmp_path)
    assert device.plan_cache is not None
    structure = plan_module.structure_key(make_ir())
    assert not device.plan_cache.path(device.plan_cache.header(structure, "CPU")).exists()


def test_different_irs_never_share_an_entry(fresh_process: None, monkeypatch: pytest.MonkeyPatch,
                                            tmp_path: Path) -> None:
    small = RNG.standard_normal((3, 4)).astype(np.float32)
    cases = [(lambda a: a * 2.0, X), (lambda a: a + 2.0, X), (lambda a: a * 3.0, X), (lambda a: a * 2.0, small),
             (lambda a: (a * 2.0).astype(np.float64), X)]
    references = [lambda a: a * 2.0, lambda a: a + 2.0, lambda a: a * 3.0, lambda a: a * 2.0, lambda a: a * 2.0]
    irs = [fg.make_ir(fn)(arg) for fn, arg in cases]
    device = CPUDevice(cache_dir=tmp_path)
    for ir, (_, arg) in zip(irs, cases):
        run(ir, device, arg)
    assert len(entries(tmp_path)) == len(cases)
    loaded = new_process(monkeypatch, tmp_path)
    forbid_building(monkeypatch)
    for ir, (_, arg), reference in zip(irs, cases, references):
        out = run(ir, loaded, arg)
        assert out.dtype == ir.out_avals[0].dtype and out.shape == arg.shape
        np.testing.assert_allclose(out, reference(arg.astype(np.float64)), rtol=1e-6)
    assert loaded.plan_cache is not None and loaded.plan_cache.stats["loaded"] == len(cases)


def test_a_plan_returning_an_input_and_a_literal_round_trips(fresh_process: None, monkeypatch: pytest.MonkeyPatch,
                                                             tmp_path: Path) -> None:
    ir = fg.make_ir(lambda a, b: (b, a * b, b, np.float32(3.0)))(X[0], X[1])
    run(ir, CPUDevice(cache_dir=tmp_path), X[0], X[1])
    device = new_process(monkeypatch, tmp_path)
    outs = compile_plan(ir, device).run([X[2], X[3]])
    assert device.plan_cache is not None and device.plan_cache.stats["loaded"] == 1
    for out, want in zip(outs, [X[3], X[2] * X[3], X[3], np.float32(3.0)]):
        np.testing.assert_array_equal(out, want)


def test_the_folder_keeps_the_most_recently_used_plans(fresh_process: None, monkeypatch: pytest.MonkeyPatch,
                                                        tmp_path: Path) -> None:
    monkeypatch.setattr(plan_module, "MAX_PLAN_FILES", 4)
    device = CPUDevice(cache_dir=tmp_path)
    irs = [fg.make_ir(lambda a, k=k: a * float(k))(X) for k in range(6)]
    for ir in irs:
        run(ir, device, X)
    assert device.plan_cache is not None and len(entries(tmp_path)) == 6  # checked on the first store only
    for age, path in enumerate(entries(tmp_path)):
        os.utime(path, (1000 + age, 1000 + age))
    newest = entries(tmp_path)[-3:]
    assert device.plan_cache.trim() == 3
    assert entries(tmp_path) == newest


def test_plan_cache_can_be_turned_off(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("FUNCGRAD_PLAN_CACHE", "0")
    assert CPUDevice(cache_dir=tmp_path).plan_cache is None


def test_debug_2_prints_one_line_per_plan_with_its_phases(fresh_process: None, monkeypatch: pytest.MonkeyPatch,
                                                          tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("DEBUG", "2")
    schedule_before = PHASE_SECONDS["schedule"]
    run(make_ir(), CPUDevice(cache_dir=tmp_path))
    run(make_ir(), new_process(monkeypatch, tmp_path))
    lines = [line for line in capfd.readouterr().err.splitlines() if line.startswith("plan ")]
    assert len(lines) == 2
    assert lines[0].startswith("plan built: 2 kernels, 2 host steps | trace ")
    assert "(2 compiled, 0 from disk)" in lines[0]
    assert lines[1].startswith("plan loaded from the plan cache: 2 kernels") and "(0 compiled, 2 from disk)" in lines[1]
    assert "schedule 0.0 ms, optimize 0.0 ms, render 0.0 ms" in lines[1]
    assert PHASE_SECONDS["schedule"] > schedule_before


def test_jit_records_its_trace_time(monkeypatch: pytest.MonkeyPatch) -> None:
    before = PHASE_SECONDS["trace"]
    fg.jit(lambda a: fnp.exp(a) * 3.0 - 1.0)(fnp.ones(7))
    assert PHASE_SECONDS["trace"] > before


def test_reset_phases_zeroes_the_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan_module, "PHASE_SECONDS", dict(PHASE_SECONDS))
    monkeypatch.setattr(plan_module, "PHASE_COUNTS", dict(PHASE_COUNTS))
    plan_module.PHASE_SECONDS["llvm"], plan_module.PHASE_COUNTS["plans_built"] = 1.5, 3
    plan_module.reset_phases()
    assert set(plan_module.PHASE_SECONDS.values()) == {0.0} and set(plan_module.PHASE_COUNTS.values()) == {0}


def test_a_second_process_starts_warm(tmp_path: Path) -> None:
    """The real thing: the same jitted step in two processes sharing FUNCGRAD_CACHE; the second
    builds no plan and compiles nothing, and gets the same numbers."""
    script = textwrap.dedent("""
        import numpy as np, funcgrad as fg, funcgrad.numpy as fnp
        from funcgrad.lower.plan import PHASE_COUNTS
        x = fnp.asarray(np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6))
        step = fg.jit(lambda w: fg.grad(lambda w: (fnp.tanh(w @ w.T) ** 2).sum())(w))
        print(step(x).numpy().round(5).tolist())
        print(PHASE_COUNTS["plans_built"], PHASE_COUNTS["plans_loaded"], PHASE_COUNTS["kernels_compiled"])
    """)
    env = {**os.environ, "FUNCGRAD_CACHE": str(tmp_path), "PYTHONPATH": str(REPO), "DEVICE": "CPU"}  # CPU plans
    env.pop("FUNCGRAD_PLAN_CACHE", None)
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    for process in runs:
        assert process.returncode == 0, process.stderr
    (cold_values, cold_counts), (warm_values, warm_counts) = (p.stdout.splitlines() for p in runs)
    assert warm_values == cold_values
    built, loaded, compiled = map(int, cold_counts.split())
    assert built >= 1 and loaded == 0 and compiled >= 1
    assert warm_counts.split() == ["0", str(built), "0"]
