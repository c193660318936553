"""The native loop driver (funcgrad/devices/cpu_loop.py): its word program on raw arrays, and compiled scans and
while loops running in it (one native call per loop, nothing per step from Python), checked against the
reference interpreter, NumPy float64 loops and the Python-driven loop of the same plan."""

from __future__ import annotations

import ctypes
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, lax
from funcgrad.devices import cpu_loop, default_device
from funcgrad.devices.cpu_loop import CALL, COPY, END, EXIT, FLIP, LINK, ROW
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower import control, jit_plan
from funcgrad.lower.control import ControlStep
from funcgrad.lower.plan import compile_plan

pytestmark = pytest.mark.skipif(default_device().name != "CPU" or cpu_loop.native_loop() is None,
                                reason="the native loop driver is the CPU's (x86-64 Linux)")
RNG = np.random.default_rng(31)


def table_of(*addresses: int) -> ctypes.Array[ctypes.c_int64]:
    return (ctypes.c_int64 * len(addresses))(*addresses)


def test_rows_copies_links_and_flips_step_by_step() -> None:
    source = np.arange(12, dtype=np.float32).reshape(6, 2)
    backwards = np.zeros((6, 2), np.float32)
    even, odd = np.zeros(1, np.int64), np.zeros(1, np.int64)
    table = table_of(0, 0, 0, 0, 0)  # 0: a row of source, 1: a row of backwards, 2: flipped, 3/4: linked
    driver = cpu_loop.native_loop()
    assert driver is not None
    steps = driver.run(table, cpu_loop.words([
        ROW, 0, source.ctypes.data, 8, ROW, 1, backwards.ctypes.data + 5 * 8, -8, COPY, 1, 0, 8,
        FLIP, 2, even.ctypes.data, odd.ctypes.data, LINK, 3, 2, END]), 6)
    assert steps == 6
    np.testing.assert_array_equal(backwards, source[::-1])  # row s of source into row 5 - s
    assert table[0] == source.ctypes.data + 5 * 8 and table[3] == odd.ctypes.data  # step 5 is odd


def test_exit_stops_at_a_false_flag_and_call_runs_a_kernel() -> None:
    # the kernel: a jitted x + 1 on 4 floats, launched by address; the flag stops the loop after 3 steps
    plan = compile_plan(fg.jit(lambda x: x + 1.0).lower(Tensor(np.zeros(4, np.float32))).ir, default_device())
    assert plan.native_launches is not None
    ((address, outer, chunks),) = plan.native_launches
    assert chunks == 1
    x, out = np.zeros(4, np.float32), np.zeros(4, np.float32)
    flags = np.array([1, 1, 1, 0, 1], np.bool_)
    table = table_of(out.ctypes.data, x.ctypes.data, 0)
    driver = cpu_loop.native_loop()
    assert driver is not None
    steps = driver.run(table, cpu_loop.words([ROW, 2, flags.ctypes.data, 1, EXIT, 2, CALL, address, outer, 2, 0, 1,
                                              COPY, 1, 0, 16, END]), 100)
    assert steps == 3
    np.testing.assert_array_equal(x, np.full(4, 3.0, np.float32))


def _no_python_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Make the Python-driven loops fail the test, and count the driver's calls."""
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("a loop ran its steps from Python")
    monkeypatch.setattr(control, "_python_loop", refuse)
    monkeypatch.setattr(control, "_python_while", refuse)
    calls: list[int] = []
    original = cpu_loop.NativeLoop.run

    def counted(self: Any, table: Any, program: Any, steps: int, pooled: bool = False) -> int:
        calls.append(steps)
        return original(self, table, program, steps, pooled)
    monkeypatch.setattr(cpu_loop.NativeLoop, "run", counted)
    return calls


def rnn_loss(w: Any, u: Any, b: Any, xs: Any, h0: Any) -> Any:
    def step(h: Any, x: Any) -> Any:
        h = fnp.tanh(h @ w + x @ u + b)
        return h, h * h
    h, ys = lax.scan(step, h0, xs)
    return fnp.mean(ys) + fnp.sum(h)


def rnn_numpy_grads(w: np.ndarray, u: np.ndarray, b: np.ndarray, xs: np.ndarray, h0: np.ndarray,
                    eps: float = 1e-6) -> list[np.ndarray]:
    """Central finite differences of the float64 loop, per entry."""
    def loss(w: np.ndarray, u: np.ndarray, b: np.ndarray) -> float:
        h, total = h0.astype(np.float64), 0.0
        for x in xs.astype(np.float64):
            h = np.tanh(h @ w + x @ u + b)
            total += float(np.sum(h * h))
        return total / (xs.shape[0] * h.size) + float(np.sum(h))
    params = [w.astype(np.float64), u.astype(np.float64), b.astype(np.float64)]
    grads = []
    for k, p in enumerate(params):
        g = np.zeros_like(p)
        for index in np.ndindex(p.shape):
            for sign in (1, -1):
                moved = [q.copy() for q in params]
                moved[k][index] += sign * eps
                g[index] += sign * loss(*moved) / (2 * eps)
        grads.append(g)
    return grads


def test_rnn_gradient_runs_both_loops_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    args = (RNG.standard_normal((4, 4)).astype(np.float32) * 0.5, RNG.standard_normal((3, 4)).astype(np.float32) * 0.5,
            RNG.standard_normal(4).astype(np.float32), RNG.standard_normal((7, 2, 3)).astype(np.float32),
            RNG.standard_normal((2, 4)).astype(np.float32))
    grad = fg.grad(rnn_loss, argnums=(0, 1, 2))
    lowered = fg.jit(grad).lower(*[Tensor(a) for a in args])
    expected = eval_ir(lowered.ir, [c.numpy() for c in lowered.consts] + list(args))
    calls = _no_python_steps(monkeypatch)
    got = [g.numpy() for g in fg.jit(grad)(*[Tensor(a) for a in args])]
    assert calls == [7, 7]  # one native call per loop (forward, backward), for its 7 steps
    for g, e, fd in zip(got, expected, rnn_numpy_grads(*args)):
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(g, fd, rtol=1e-4, atol=1e-5)


def test_while_loop_with_a_traced_bound_runs_natively(monkeypatch: pytest.MonkeyPatch) -> None:
    def fn(x: Any, n: Any) -> Any:
        return lax.fori_loop(0, n, lambda i, v: fnp.sin(v) * 0.5 + x, x)
    x = RNG.standard_normal(5).astype(np.float32)
    calls = _no_python_steps(monkeypatch)
    jitted = fg.jit(fn)
    for n in (0, 1, 2, 9):
        want = x.astype(np.float64)
        for _ in range(n):
            want = np.sin(want) * 0.5 + x
        np.testing.assert_allclose(jitted(Tensor(x), Tensor(np.int32(n))).numpy(), want, rtol=1e-5, atol=1e-6)
    assert len(calls) == 4


def test_a_threaded_kernel_in_the_body_is_launched_through_the_native_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    def fn(c: Any, xs: Any) -> Any:
        return lax.scan(lambda c, x: (fnp.tanh(c * 0.9 + x[0]), c.sum()), c, xs)
    c = RNG.standard_normal(1 << 18).astype(np.float32)
    xs = RNG.standard_normal((3, 1)).astype(np.float32)
    lowered = fg.jit(fn).lower(Tensor(c), Tensor(xs))
    (step,) = [s for s in jit_plan(lowered.ir, default_device()).steps if isinstance(s, ControlStep)]
    body = compile_plan(step.eqn.param_dict["body"], default_device())
    if body.native_launches is None or all(chunks == 1 for *_, chunks in body.native_launches):
        pytest.skip("the body's kernels are not threaded on this machine")
    calls = _no_python_steps(monkeypatch)
    carry, sums = (t.numpy() for t in fg.jit(fn)(Tensor(c), Tensor(xs)))
    assert calls == [3]
    want, totals = c.astype(np.float64), []
    for x in xs.astype(np.float64):
        totals.append(want.sum())
        want = np.tanh(want * 0.9 + x[0])
    np.testing.assert_allclose(carry, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(sums, totals, rtol=1e-4)
