"""Control flow compiled into plans (funcgrad/lower/control.py): scan, while and cond under jit run as
ControlSteps, loops and branches over compiled sub-plans, not as host steps of the reference interpreter.

Values (forward and gradients) are checked against the reference interpreter on the same IR, against a
float64 NumPy loop, and against JAX where it is installed; the plan-structure tests check that the loop
is no host step, that its body is scheduled once, and that the carries go from one body replay to the
next as the very arrays the kernels wrote (no copy, no trace, no schedule per step).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, lax
from funcgrad.devices import default_device, get_device
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower import jit_plan
from funcgrad.lower.control import ControlStep
from funcgrad.lower.plan import PHASE_COUNTS, compile_plan
from funcgrad.lower.schedule import HostStep
from funcgrad.util import tree

RNG = np.random.default_rng(18)
# With DEVICE=CL or WEBGPU every sub-plan is a device program built per test (minutes under load): the
# default-device pass (CPU) runs this file, and its device test runs CL and WebGPU plans explicitly.
pytestmark = pytest.mark.skipif(default_device().resident, reason=f"device {default_device().name}: the CPU pass "
                                "runs these, and test_control_steps_on_a_device_with_its_own_memory its plans")


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def reference(fn: Any, *args: np.ndarray) -> list[np.ndarray]:
    """``jit(fn)``'s IR evaluated by the reference interpreter (NumPy, primitive by primitive)."""
    lowered = fg.jit(fn).lower(*[Tensor(a) for a in args])
    return eval_ir(lowered.ir, [c.numpy() for c in lowered.consts] + list(args))


def check(fn: Any, *args: np.ndarray, rtol: float = 2e-5, atol: float = 2e-5) -> list[np.ndarray]:
    """``jit(fn)`` (the compiled plan, twice: built, then replayed) equals the reference interpreter."""
    jitted = fg.jit(fn)
    expected = reference(fn, *args)
    for _ in range(2):
        got = [np.asarray(leaf.numpy()) for leaf in tree.leaves(jitted(*[Tensor(a) for a in args]))]
        assert len(got) == len(expected)
        for g, e in zip(got, expected):
            assert g.shape == np.shape(e) and g.dtype == np.asarray(e).dtype
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol)
    return got


def plan_of(fn: Any, *args: np.ndarray, device: Any = None) -> Any:
    lowered = fg.jit(fn).lower(*[Tensor(a) for a in args])
    return jit_plan(lowered.ir, device or default_device())


# --- the tanh RNN: forward, gradients, reverse --------------------------------------------------------

def rnn(w: Any, u: Any, b: Any, xs: Any, h0: Any, reverse: bool = False) -> Any:
    def step(h: Any, x: Any) -> Any:
        h = fnp.tanh(h @ w + x @ u + b)
        return h, h * h
    h, ys = lax.scan(step, h0, xs, reverse=reverse)
    return fnp.sum(ys) + fnp.sum(h * h0)


def rnn_numpy(w: np.ndarray, u: np.ndarray, b: np.ndarray, xs: np.ndarray, h0: np.ndarray,
              reverse: bool = False) -> float:
    w, u, b, xs, h = (a.astype(np.float64) for a in (w, u, b, xs, h0))
    total = 0.0
    for t in (range(len(xs) - 1, -1, -1) if reverse else range(len(xs))):
        h = np.tanh(h @ w + xs[t] @ u + b)
        total += float(np.sum(h * h))
    return total + float(np.sum(h * h0))


def rnn_args(steps: int = 5, batch: int = 3, hidden: int = 4) -> tuple[np.ndarray, ...]:
    return (f32(hidden, hidden) * 0.5, f32(hidden, hidden) * 0.5, f32(hidden), f32(steps, batch, hidden),
            f32(batch, hidden))


@pytest.mark.parametrize("reverse", [False, True])
def test_rnn_forward_and_gradients_match_the_interpreter_numpy_and_jax(reverse: bool) -> None:
    args = rnn_args()
    (value,) = check(lambda *a: rnn(*a, reverse=reverse), *args)
    assert float(value) == pytest.approx(rnn_numpy(*args, reverse=reverse), rel=1e-5)
    grads = check(fg.grad(lambda *a: rnn(*a, reverse=reverse), argnums=(0, 1, 2, 3, 4)), *args)
    # finite differences (float64 NumPy) on a few entries of each argument
    for which, grad in enumerate(grads):
        for index in list(np.ndindex(args[which].shape))[:3]:
            up = [a.copy() for a in args]
            down = [a.copy() for a in args]
            up[which][index] += 1e-2
            down[which][index] -= 1e-2
            numeric = (rnn_numpy(*up, reverse=reverse) - rnn_numpy(*down, reverse=reverse)) / 2e-2
            assert grad[index] == pytest.approx(numeric, rel=2e-2, abs=2e-3)
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def rnn_jax(w: Any, u: Any, b: Any, xs: Any, h0: Any) -> Any:
        def step(h: Any, x: Any) -> Any:
            h = jnp.tanh(h @ w + x @ u + b)
            return h, h * h
        h, ys = jax.lax.scan(step, h0, xs, reverse=reverse)
        return jnp.sum(ys) + jnp.sum(h * h0)
    for got, want in zip(grads, jax.grad(rnn_jax, argnums=(0, 1, 2, 3, 4))(*args)):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-5)


def test_lstm_gradient_with_gate_slices_and_a_pair_of_carries() -> None:
    def loss(wx: Any, wh: Any, b: Any, xs: Any) -> Any:
        hidden = wh.shape[0]

        def step(carry: Any, x: Any) -> Any:
            h, c = carry
            g = x @ wx + h @ wh + b
            i, f, o = (1 / (1 + fnp.exp(-g[:, k * hidden:(k + 1) * hidden])) for k in range(3))
            c = f * c + i * fnp.tanh(g[:, 3 * hidden:])
            h = o * fnp.tanh(c)
            return (h, c), h
        zeros = fnp.zeros((xs.shape[1], hidden), dtype="float32")
        _, hs = lax.scan(step, (zeros, zeros), xs)
        return fnp.mean(hs * hs)
    args = (f32(3, 8) * 0.5, f32(2, 8) * 0.5, f32(8) * 0.1, f32(4, 3, 3))
    grads = check(fg.grad(loss, argnums=(0, 1, 2, 3)), *args)
    jax = pytest.importorskip("jax")
    jnp = jax.numpy

    def loss_jax(wx: Any, wh: Any, b: Any, xs: Any) -> Any:
        def step(carry: Any, x: Any) -> Any:
            h, c = carry
            g = x @ wx + h @ wh + b
            i, f, o = (jax.nn.sigmoid(g[:, k * 2:(k + 1) * 2]) for k in range(3))
            c = f * c + i * jnp.tanh(g[:, 6:])
            return (o * jnp.tanh(c), c), o * jnp.tanh(c)
        zeros = jnp.zeros((3, 2), jnp.float32)
        return jnp.mean(jax.lax.scan(step, (zeros, zeros), xs)[1] ** 2)
    for got, want in zip(grads, jax.grad(loss_jax, argnums=(0, 1, 2, 3))(*args)):
        np.testing.assert_allclose(got, np.asarray(want), rtol=1e-4, atol=1e-6)


def test_second_order_through_scan_hvp_and_grad_of_grad() -> None:
    w, u, b, xs, h0 = rnn_args()

    def loss(w: Any, u: Any) -> Any:
        return rnn(w, u, b, xs, h0)
    v = f32(4, 4)
    check(lambda w, u, v: fg.jvp(lambda w: fg.grad(loss, argnums=(0, 1))(w, u), (w,), (v,))[1], w, u, v)
    check(fg.grad(lambda w, u: fg.grad(loss)(w, u).sum(), argnums=(0, 1)), w, u)


@pytest.mark.parametrize("steps", [0, 1, 2])
def test_scan_of_length_zero_one_and_two(steps: int) -> None:
    args = rnn_args(steps=steps)

    def fn(w: Any, u: Any, b: Any, xs: Any, h0: Any) -> Any:
        def step(h: Any, x: Any) -> Any:
            h = fnp.tanh(h @ w + x @ u + b)
            return h, (h, x.sum())
        return lax.scan(step, h0, xs)
    carry, ys, sums = check(fn, *args)
    assert ys.shape == (steps, 3, 4) and sums.shape == (steps,)
    if steps == 0:
        np.testing.assert_array_equal(carry, args[4])
    check(fg.grad(lambda *a: rnn(*a), argnums=(0, 4)), *args)


def test_pytree_carries_and_ys_with_consts_passthrough_and_literals() -> None:
    scale = fnp.asarray(np.float32(1.5))  # a const closed over by the body

    def fn(x0: Any, v0: Any, xs: Any) -> Any:
        def step(carry: Any, x: Any) -> Any:
            a, (b, c) = carry["a"], carry["bc"]
            new = {"a": a * scale + x["p"], "bc": (c, b + fnp.sin(x["q"]).sum())}  # b, c swap places
            return new, {"twice": a * 2.0, "one": np.float32(1.0), "same": c}
        return lax.scan(step, {"a": x0, "bc": (v0, v0 * 0.5)}, xs)
    x0, v0 = f32(3), f32()
    xs = {"p": f32(4, 3), "q": f32(4, 2)}
    leaves = [xs["p"], xs["q"]]
    check(lambda x0, v0, p, q: fn(x0, v0, {"p": p, "q": q}), x0, v0, *leaves)
    check(fg.grad(lambda x0, v0, p, q: sum(leaf.sum() for leaf in tree.leaves(fn(x0, v0, {"p": p, "q": q}))),
                  argnums=(0, 1, 2, 3)), x0, v0, *leaves)


def test_nested_scans_with_consts() -> None:
    def fn(w: Any, xs: Any) -> Any:
        def outer(c: Any, row: Any) -> Any:
            def inner(d: Any, x: Any) -> Any:
                return fnp.cos(d * w + x), d * x
            d, ys = lax.scan(inner, c, row, reverse=True)
            return d + c, ys.sum()
        return lax.scan(outer, fnp.ones(3, dtype="float32"), xs)
    w, xs = f32(3), f32(4, 5, 3)
    check(fn, w, xs)
    check(fg.grad(lambda w, xs: fn(w, xs)[0].sum() + fn(w, xs)[1].sum(), argnums=(0, 1)), w, xs)
    plan = plan_of(fn, w, xs)
    (outer,) = [s for s in plan.steps if isinstance(s, ControlStep)]
    body_plan = compile_plan(outer.eqn.param_dict["body"], default_device())
    assert [s.eqn.primitive.name for s in body_plan.steps if isinstance(s, ControlStep)] == ["scan"]


# --- fori_loop, while_loop, cond ----------------------------------------------------------------------

def test_fori_loop_static_and_traced_bounds() -> None:
    def power(x: Any) -> Any:
        return lax.fori_loop(0, 5, lambda i, v: v * x + i.astype("float32"), fnp.ones_like(x))
    x = f32(4)
    check(power, x)
    check(fg.grad(lambda x: power(x).sum()), x)

    def traced(x: Any, n: Any) -> Any:
        return lax.fori_loop(0, n, lambda i, v: fnp.tanh(v + x), x)
    for n in (0, 1, 7):
        got = check(traced, x, np.int32(n))[0]
        want = x.astype(np.float64)
        for _ in range(n):
            want = np.tanh(want + x)
        np.testing.assert_allclose(got, want, rtol=1e-5)
    assert any(s.eqn.primitive.name == "while" for s in plan_of(traced, x, np.int32(3)).steps
               if isinstance(s, ControlStep))


def test_a_while_loop_of_kernels_runs_on_addresses() -> None:
    def fn(x: Any, n: Any) -> Any:  # carries of two dtypes, returned in another order than their kernels run
        return lax.fori_loop(0, n, lambda i, v: fnp.sin(v) * 0.5 + x, x)
    x = f32(5)
    lowered = fg.jit(fn).lower(Tensor(x), Tensor(np.int32(3)))
    (step,) = [s for s in jit_plan(lowered.ir, default_device()).steps if isinstance(s, ControlStep)]
    plans = [compile_plan(step.eqn.param_dict[name], default_device()) for name in ("cond_ir", "body_ir")]
    if any(plan.launches is None for plan in plans):
        pytest.skip(f"device {default_device().name} has no raw kernel launches")
    calls: list[tuple[list[int], list[int]]] = []
    originals = [_watch_replays(plan, calls) for plan in plans]
    try:
        for n in (0, 1, 2, 9):
            want = x.astype(np.float64)
            for _ in range(n):
                want = np.sin(want) * 0.5 + x
            np.testing.assert_allclose(fg.jit(fn)(Tensor(x), Tensor(np.int32(n))).numpy(), want, rtol=1e-5)
    finally:
        for plan, original in zip(plans, originals):
            plan.replay = original
    assert not calls


def test_while_loop_forward_and_jvp() -> None:
    def collatz_like(x: Any) -> Any:
        def cond(state: Any) -> Any:
            return (state[1] < 50) & (state[0].sum() < 100.0)

        def body(state: Any) -> Any:
            v, k = state
            return v * 1.3 + 0.1, k + 1
        return lax.while_loop(cond, body, (x, fnp.asarray(np.int32(0))))
    x = np.abs(f32(3))
    v, k = check(collatz_like, x)
    assert 0 < int(k) < 50
    check(lambda x, t: fg.jvp(lambda y: collatz_like(y)[0], (x,), (t,)), x, f32(3))


def test_cond_forward_gradients_and_cond_inside_scan() -> None:
    def piecewise(x: Any) -> Any:
        return lax.cond(x.sum() > 0, lambda y: fnp.sin(y) * y, lambda y: y ** 3, x)
    for sign in (1.0, -1.0):
        x = np.abs(f32(3)) * np.float32(sign)
        check(piecewise, x)
        check(fg.grad(lambda x: piecewise(x).sum()), x)
    branches = [lambda y: y + 1.0, lambda y: y * 10.0, lambda y: -y]
    for index in (-3, 0, 1, 2, 9):  # clamped into range, as lax.switch
        check(lambda i, y: lax.switch(i, branches, y), np.int32(index), f32(2))

    def gated(w: Any, xs: Any) -> Any:
        def step(h: Any, x: Any) -> Any:
            h = lax.cond(h.sum() > 0, lambda v: fnp.tanh(v * w + x), lambda v: v * 0.5 + x, h)
            return h, h.sum()
        return lax.scan(step, fnp.zeros(3, dtype="float32"), xs)
    w, xs = f32(3), f32(6, 3)
    check(gated, w, xs)
    check(fg.grad(lambda w, xs: gated(w, xs)[1].sum(), argnums=(0, 1)), w, xs)


def test_vmap_of_scan_and_of_while_under_jit() -> None:
    args = rnn_args()
    batched_h0 = f32(2, 3, 4)
    check(fg.vmap(lambda h0: rnn(*args[:4], h0)), batched_h0)
    loop = [rnn(*args[:4], Tensor(h)).item() for h in batched_h0]
    np.testing.assert_allclose(fg.jit(fg.vmap(lambda h0: rnn(*args[:4], h0)))(Tensor(batched_h0)).numpy(), loop,
                               rtol=1e-5)
    limits = np.array([1, 4, 0], np.int32)
    check(fg.vmap(lambda n, x: lax.fori_loop(0, n, lambda i, v: v * 2.0, x)), limits, f32(3))


# --- the plan's structure -----------------------------------------------------------------------------

def test_scan_and_its_backward_are_control_steps_not_host_steps() -> None:
    args = rnn_args()
    for fn in (rnn, fg.grad(rnn, argnums=(0, 1, 2))):
        plan = plan_of(fn, *args)
        assert not [s for s in plan.steps if isinstance(s, HostStep)]
        controls = [s.eqn.primitive.name for s in plan.steps if isinstance(s, ControlStep)]
        assert controls == (["scan"] if fn is rnn else ["scan", "scan"])  # the backward is a scan too
        for step in plan.steps:
            if isinstance(step, ControlStep):
                body = compile_plan(step.eqn.param_dict["body"], default_device())
                assert body.kernels and not [s for s in body.steps if isinstance(s, HostStep)]


def _watch_replays(plan: Any, calls: list[tuple[list[int], list[int]]]) -> Any:
    """Wrap ``plan.replay`` to record the ids of each call's inputs and outputs; returns the original."""
    original = plan.replay

    def watched(arrays: list[np.ndarray]) -> list[np.ndarray]:
        outs = original(arrays)
        calls.append(([id(a) for a in arrays], [id(o) for o in outs]))
        return outs
    plan.replay = watched
    return original


def test_the_loops_run_on_addresses_with_no_trace_schedule_or_body_replay() -> None:
    args = rnn_args(steps=6)
    grad = fg.jit(fg.grad(rnn, argnums=(0, 1, 2)))
    tensors = [Tensor(a) for a in args]
    first = [g.numpy() for g in grad(*tensors)]
    plan = plan_of(fg.grad(rnn, argnums=(0, 1, 2)), *args)
    bodies = [compile_plan(s.eqn.param_dict["body"], default_device()) for s in plan.steps
              if isinstance(s, ControlStep)]
    if any(body.launches is None for body in bodies):
        pytest.skip(f"device {default_device().name} has no raw kernel launches")
    calls: list[tuple[list[int], list[int]]] = []
    originals = [_watch_replays(body, calls) for body in bodies]
    built = PHASE_COUNTS["plans_built"]
    try:
        again = [g.numpy() for g in grad(*tensors)]
    finally:
        for body, original in zip(bodies, originals):
            body.replay = original
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)
    assert not calls  # both loops (forward and backward) ran their kernels on addresses
    assert grad.trace_count == 1 and PHASE_COUNTS["plans_built"] == built

    def states(w: Any, u: Any, b: Any, xs: Any, h0: Any) -> Any:
        return lax.scan(lambda h, x: (fnp.tanh(h @ w + x @ u + b),) * 2, h0, xs)
    lowered = fg.jit(states).lower(*tensors)
    h, hs = jit_plan(lowered.ir, default_device()).run([c.numpy() for c in lowered.consts] + list(args))
    np.testing.assert_array_equal(h, hs[-1])
    assert np.shares_memory(h, hs)  # the carry lives in the ys row its kernel wrote: no copy


def test_a_body_with_a_host_step_replays_its_plan_and_passes_carries_through_uncopied() -> None:
    def fn(w: Any, xs: Any) -> Any:
        return lax.scan(lambda c, x: (fnp.sort(fnp.tanh(c * w + x)), c.sum()), fnp.zeros(4, dtype="float32"), xs)
    w, xs = f32(4), f32(6, 4)
    carry, ys = check(fn, w, xs)
    want = np.zeros(4)
    for x in xs.astype(np.float64):
        want = np.sort(np.tanh(want * w + x))
    np.testing.assert_allclose(carry, want, rtol=1e-5)
    (step,) = [s for s in plan_of(fn, w, xs).steps if isinstance(s, ControlStep)]
    body = compile_plan(step.eqn.param_dict["body"], default_device())
    if body.replay is None:
        pytest.skip(f"device {default_device().name} has no lean replay")
    assert body.launches is None and any(isinstance(s, HostStep) for s in body.steps)
    calls: list[tuple[list[int], list[int]]] = []
    original = _watch_replays(body, calls)
    try:
        fg.jit(fn)(Tensor(w), Tensor(xs))[0].numpy()
    finally:
        body.replay = original
    assert len(calls) == 6
    for (_, outs), (ins, _) in zip(calls, calls[1:]):  # step t's carry is step t+1's input, the same object
        assert ins[1] == outs[0]


def test_debug_lines_name_the_loop(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    args = rnn_args(steps=3)
    fn = fg.jit(rnn)
    fn(*[Tensor(a) for a in args]).numpy()
    monkeypatch.setenv("DEBUG", "2")
    fn(*[Tensor(a) for a in args]).numpy()
    err = capsys.readouterr().err
    assert "0 host steps, 1 control step (scan)" in err and "loop scan x3" in err
    assert "host scan" not in err


@pytest.mark.parametrize("name", ["CL", "WEBGPU"])
def test_control_steps_on_a_device_with_its_own_memory(name: str) -> None:
    try:
        device = get_device(name)
    except Exception as error:  # noqa: BLE001 - any reason the backend cannot start
        pytest.skip(f"device {name} unavailable: {error}")
    args = rnn_args(steps=3)
    fn = fg.grad(rnn, argnums=(0, 3)) if name == "CL" else rnn  # WebGPU's compiles are slow: the forward only

    def loops(x: Any, n: Any) -> Any:  # a while (traced bound) and a cond
        y = lax.fori_loop(0, n, lambda i, v: fnp.tanh(v + x), x)
        return lax.cond(y.sum() > 0, lambda v: v * 2.0, lambda v: -v, y)
    for program, operands in ((fn, args), (loops, (f32(3), np.int32(4)))):
        lowered = fg.jit(program).lower(*[Tensor(a) for a in operands])
        plan = compile_plan(lowered.ir, device)
        assert any(isinstance(s, ControlStep) for s in plan.steps)
        arrays = [c.numpy() for c in lowered.consts] + list(operands)
        for got, want in zip(plan.run(arrays), eval_ir(lowered.ir, arrays)):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_a_plan_with_a_loop_round_trips_through_the_disk_cache(tmp_path: Any) -> None:
    from funcgrad.devices.cpu import CPUDevice
    from funcgrad.lower import plan as plan_module
    if default_device().name != "CPU":
        pytest.skip("the plan disk cache is the CPU's")
    args = rnn_args(steps=4)
    lowered = fg.jit(fg.grad(rnn, argnums=(0, 3))).lower(*[Tensor(a) for a in args])
    arrays = [c.numpy() for c in lowered.consts] + list(args)
    plan_module._PLANS.clear()  # as a new process: the plan comes from the disk
    os.environ.pop("FUNCGRAD_PLAN_CACHE", None)
    try:
        first = compile_plan(lowered.ir, CPUDevice(cache_dir=tmp_path)).run(arrays)
        plan_module._PLANS.clear()
        device = CPUDevice(cache_dir=tmp_path)
        loaded_before = device.plan_cache.stats["loaded"]
        plan = compile_plan(lowered.ir, device)
        assert device.plan_cache.stats["loaded"] > loaded_before
        assert any(isinstance(s, ControlStep) for s in plan.steps)
        for a, b in zip(plan.run(arrays), first):
            np.testing.assert_array_equal(a, b)
    finally:
        plan_module._PLANS.clear()  # no plan of these devices stays behind
