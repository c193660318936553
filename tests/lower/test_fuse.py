"""Sibling fusion (funcgrad/lower/fuse.py): elementwise kernels over the same elements merge into one
multi-output kernel; results are bit-identical to the unmerged plan and match NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import lower
from funcgrad.devices import cpu
from funcgrad.lower import fuse
from funcgrad.lower import plan as plan_module
from funcgrad.lower.schedule import HostStep, KernelStep, inline_calls, schedule
from funcgrad.util.caches import LRUCache

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU code generation, whatever DEVICE says


def steps_of(f, *args) -> list:  # noqa: ANN001
    return schedule(inline_calls(fg.make_ir(f)(*args)))


def adam(p, m, v, g, t):  # noqa: ANN001, ANN201 - one parameter's Adam update, as the optimisers write it
    m = 0.9 * m + 0.1 * g
    v = 0.999 * v + 0.001 * g * g
    return p - 1e-3 * (m / (1 - 0.9 ** t)) / (fnp.sqrt(v / (1 - 0.999 ** t)) + 1e-8), m, v


def fresh_plans(monkeypatch: pytest.MonkeyPatch, flag: bool) -> None:
    """Sibling fusion on or off for plans built from now on (the plan caches start empty)."""
    monkeypatch.setattr(cpu.CPUDevice, "fuse_siblings", flag)
    monkeypatch.setenv("FUNCGRAD_PLAN_CACHE", "0")
    monkeypatch.setattr(plan_module, "_PLANS", LRUCache(64))
    monkeypatch.setattr(lower, "_JIT_PLANS", LRUCache(64))


def run_both(monkeypatch: pytest.MonkeyPatch, f, *args):  # noqa: ANN001, ANN202
    """(results, kernel count) with sibling fusion off, then on; each from a fresh jit."""
    out = []
    for flag in (False, True):
        fresh_plans(monkeypatch, flag)
        jitted = fg.jit(f)
        results = [np.asarray(r) for r in jitted(*args)]
        out.append((results, len(jitted.lower(*args).kernels)))
    return out


def test_adam_updates_merge_into_one_kernel() -> None:
    rng = np.random.default_rng(0)
    p, m, g = (rng.standard_normal((64, 48)).astype(np.float32) for _ in range(3))
    v = rng.uniform(0, 1, (64, 48)).astype(np.float32)
    steps = steps_of(adam, p, m, v, g, np.float32(3))
    merged = fuse.fuse_siblings(steps)
    kernels = [s for s in merged if isinstance(s, KernelStep)]
    assert len([s for s in steps if isinstance(s, KernelStep)]) == 3 and len(kernels) == 1
    assert len(kernels[0].kernel.outputs) == 3 and len(kernels[0].inputs) == 5  # p, m, v, g, t: each read once


def test_merged_plans_equal_unmerged_ones_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(1)
    p, m, g = (rng.standard_normal((300, 7)).astype(np.float32) for _ in range(3))
    v = rng.uniform(0, 1, (300, 7)).astype(np.float32)
    (plain, plain_count), (fused, fused_count) = run_both(monkeypatch, adam, p, m, v, g, np.float32(5))
    assert fused_count < plain_count
    for a, b in zip(plain, fused):
        np.testing.assert_array_equal(a, b)
    p64, m64, v64, g64 = (x.astype(np.float64) for x in (p, m, v, g))
    m_new, v_new = 0.9 * m64 + 0.1 * g64, 0.999 * v64 + 0.001 * g64 * g64
    expected = p64 - 1e-3 * (m_new / (1 - 0.9**5)) / (np.sqrt(v_new / (1 - 0.999**5)) + 1e-8)
    np.testing.assert_allclose(fused[0], expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(fused[1], m_new, rtol=1e-6, atol=1e-7)


def test_a_sibling_reading_another_position_stays_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    """B reads A's output reversed: not the same element, so no merge (and the values stay right)."""
    x = np.arange(40, dtype=np.float32)

    def f(x):  # noqa: ANN001, ANN202
        a = fnp.exp(x * 0.01)
        return a, a[::-1] + x

    steps = steps_of(f, x)
    assert len(fuse.fuse_siblings(steps)) == len(steps) == 2
    (plain, _), (fused, _) = run_both(monkeypatch, f, x)
    np.testing.assert_array_equal(fused[1], plain[1])
    np.testing.assert_allclose(fused[1], np.exp(x * 0.01)[::-1] + x, rtol=1e-6)


def test_no_merge_across_a_value_made_in_between() -> None:
    """B needs a sum computed after A: it cannot move up to A."""
    x = np.ones((50, 8), np.float32)

    def f(x):  # noqa: ANN001, ANN202
        a = x * 2.0
        total = a.sum()
        return a, x * total

    steps = steps_of(f, x)
    merged = fuse.fuse_siblings(steps)
    assert [type(s) for s in merged] == [type(s) for s in steps]
    assert len(merged) == len(steps)


def test_buffer_limit_and_host_steps() -> None:
    """A merge never passes MAX_BUFFERS arrays, and host steps keep their place."""
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal(32).astype(np.float32) for _ in range(14)]

    def many(*xs):  # noqa: ANN002, ANN202
        return tuple(x * xs[0] for x in xs[1:])

    merged = fuse.fuse_siblings(steps_of(many, *xs))
    for step in merged:
        if isinstance(step, KernelStep):
            assert len(step.inputs) + len(step.outputs) <= fuse.MAX_BUFFERS
    assert sum(isinstance(s, KernelStep) for s in merged) >= 2
    host = [s for s in steps_of(lambda x: (fnp.sort(x) * 2.0, x * 3.0, x * 4.0), xs[0]) if isinstance(s, HostStep)]
    assert host  # sort runs on the host: the pass keeps it (checked through jit below)


def test_stateful_adam_training_is_unchanged(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ten steps of nn + optim.Adam under jit, with and without sibling fusion: the same parameters."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((16, 12)).astype(np.float32)
    finals = []
    for flag in (False, True):
        fresh_plans(monkeypatch, flag)
        fg.Tensor.manual_seed(0)
        model = fg.nn.Sequential(fg.nn.Linear(12, 8), fg.nn.ReLU(), fg.nn.Linear(8, 5))
        opt = fg.nn.optim.Adam(model.parameters(), lr=1e-2)

        def step(model, opt, x):  # noqa: ANN001, ANN202
            opt.zero_grad()
            loss = (model(x) ** 2).mean()
            loss.backward()
            opt.step()
            return loss

        jitted = fg.jit(step)
        with fg.Tensor.train():
            losses = [jitted(model, opt, fg.Tensor(x)).item() for _ in range(10)]
        finals.append((losses, [p.numpy().copy() for p in model.parameters()]))
    assert finals[0][0] == finals[1][0] and finals[1][0][-1] < finals[1][0][0]
    for a, b in zip(finals[0][1], finals[1][1]):
        np.testing.assert_array_equal(a, b)
