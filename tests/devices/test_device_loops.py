"""Control flow on devices with their own memory (funcgrad/lower/device_control.py): ``scan``, ``while`` and
``cond`` run on device buffers, on every available such device (CL = PoCL and WEBGPU here).

Results and gradients are checked against the reference interpreter on the same IR; the transfer counts
(``Device.transfers``) show that a scan's host transfers do not grow with its length (the carries stay on
the device, the ``xs``/``ys`` rows are device-to-device copies), that a while loop reads back one predicate
per iteration and a cond one index.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, lax
from funcgrad.devices import get_device
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower import device_control
from funcgrad.lower.control import ControlStep
from funcgrad.lower.plan import Plan, compile_plan

RNG = np.random.default_rng(21)


@pytest.fixture(scope="module")
def device(device_name: str) -> Any:
    found = get_device(device_name)
    if not found.resident:
        pytest.skip(f"device {device_name} computes on host arrays: its loops are lower/control.py's")
    return found


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def lowered(fn: Any, *args: Any) -> tuple[Any, list[np.ndarray]]:
    low = fg.jit(fn).lower(*[Tensor(a) for a in args])
    return low.ir, [c.numpy() for c in low.consts] + [np.asarray(a) for a in args]


def run_counted(device: Any, fn: Any, *args: Any, plan_of: Any = None) -> tuple[list[np.ndarray], Any, Any]:
    """The plan of ``jit(fn)`` on ``device`` run once (built first), its results checked against the
    reference interpreter; returns the results, the plan and the transfers of the run."""
    ir, arrays = lowered(fn, *args)
    plan = (plan_of or compile_plan)(ir, device)
    assert any(isinstance(step, ControlStep) for step in plan.steps)
    before = device.transfers.snapshot()
    got = plan.run(arrays)
    after = device.transfers.snapshot()
    moved = type(after)(*(getattr(after, f) - getattr(before, f) for f in
                          ("uploads", "upload_bytes", "downloads", "download_bytes", "copies", "copy_bytes")))
    want = eval_ir(ir, arrays)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == np.asarray(w).dtype and g.shape == np.shape(w)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
    return got, plan, moved


def rnn(w: Any, xs: Any, h0: Any, reverse: bool = False) -> Any:
    def step(h: Any, x: Any) -> Any:
        h = fnp.tanh(h @ w + x)
        return h, h * h
    h, ys = lax.scan(step, h0, xs, reverse=reverse)
    return fnp.sum(ys) + fnp.sum(h * h0)


def rnn_args(steps: int) -> tuple[np.ndarray, ...]:
    return f32(4, 4) * 0.5, f32(steps, 3, 4), f32(3, 4)


# --- results and gradients against the interpreter --------------------------------------------------

@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_scan_values_and_gradients_match_the_interpreter(device: Any, reverse: bool) -> None:
    args = rnn_args(6)
    run_counted(device, lambda *a: rnn(*a, reverse=reverse), *args)
    (gw, gxs, gh0), _, moved = run_counted(device, fg.grad(lambda *a: rnn(*a, reverse=reverse), argnums=(0, 1, 2)),
                                           *args)
    assert moved.copies > 0  # the rows moved on the device
    assert gxs.shape == (6, 3, 4) and np.abs(gxs).sum() > 0


def test_scan_ys_carries_of_several_dtypes_and_an_xs_row_passed_on_as_the_carry(device: Any) -> None:
    def program(xs: Any, init: Any, counts: Any) -> Any:
        def step(carry: Any, row: Any) -> Any:
            previous, count = carry
            x, c = row
            # the carry becomes this step's xs row (the loop must copy it out of the row buffer it refills)
            return (x, count + c), (previous * 2.0, x > 0, count)
        return lax.scan(step, (init, np.int32(0)), (xs, counts))
    xs, init, counts = f32(7, 5), f32(5), RNG.integers(-3, 4, 7).astype(np.int32)
    (last, total, doubled, signs, running), _, _ = run_counted(device, program, xs, init, counts)
    np.testing.assert_array_equal(last, xs[-1])
    assert int(total) == int(counts.sum()) and signs.dtype == np.bool_
    np.testing.assert_allclose(doubled, np.concatenate([init[None], xs[:-1]]) * 2.0)
    np.testing.assert_array_equal(running, np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int32))


def test_a_scan_inside_a_scan_and_literal_outputs(device: Any) -> None:
    def program(xs: Any, h: Any) -> Any:
        def outer(carry: Any, row: Any) -> Any:
            def inner(c: Any, x: Any) -> Any:
                return fnp.sin(c + x), 1.0  # a literal y
            carry, ones = lax.scan(inner, carry, row)
            return carry * 0.5, fnp.sum(ones)
        return lax.scan(outer, h, xs)
    run_counted(device, program, f32(3, 4, 2), f32(2))


EDGE_CASES = {  # (program, operands): the buffer aliasing and dtypes the device loop must get right
    "no_steps": (lambda c, xs: lax.scan(lambda h, x: (h + x, h * x), c, xs), (f32(3), np.zeros((0, 3), np.float32))),
    "carry_passed_on_and_returned_twice": (
        lambda c, xs: lax.scan(lambda h, x: ((h[0], h[0] + x), (h[0], h[0])), (c, c), xs), (f32(3), f32(4, 3))),
    "literal_carry": (lambda c, xs: lax.scan(lambda h, x: (fnp.zeros(3), h + x), c, xs), (f32(3), f32(4, 3))),
    "scalar_rows": (lambda c, xs: lax.scan(lambda h, x: (h * x, h), c, xs), (np.float32(1.5), f32(6))),
    "host_step_in_the_body": (lambda c, xs: lax.scan(lambda h, x: (fnp.sort(h + x), fnp.argsort(x)), c, xs),
                              (f32(3), f32(4, 3))),
    "bool_and_uint8_carries": (
        lambda xs: lax.scan(lambda h, x: ((h[0] ^ (x > 0), h[1] + (x > 0).astype(np.uint8)), h[1]),
                            (np.zeros(3, np.bool_), np.zeros(3, np.uint8)), xs), (f32(5, 3),)),
    "literal_switch_index": (lambda v: lax.switch(1, [lambda a: a, lambda a: a * 3.0], v), (f32(3),)),
}


@pytest.mark.parametrize("case", list(EDGE_CASES))
def test_loop_edge_cases_match_the_interpreter(device: Any, case: str) -> None:
    program, operands = EDGE_CASES[case]
    run_counted(device, program, *operands)


def test_while_loop_and_fori_loop_with_a_traced_bound(device: Any) -> None:
    def program(x: Any, n: Any) -> Any:
        y = lax.fori_loop(0, n, lambda i, v: fnp.tanh(v + x * i.astype(fnp.float32)), x)
        return lax.while_loop(lambda s: s[0] < 10.0, lambda s: (s[0] * 2.0 + 1.0, s[1] + 1), (fnp.sum(y * y), 0))
    run_counted(device, program, f32(3), np.int32(5))


@pytest.mark.parametrize("index", [-2, 0, 1, 2, 7], ids=lambda i: f"index{i}")
def test_cond_and_switch_pick_the_branch_on_the_device(device: Any, index: int) -> None:
    def program(i: Any, x: Any) -> Any:
        picked = lax.switch(i, [lambda v: v * 2.0, lambda v: -v, lambda v: fnp.exp(v)], x)
        return lax.cond(fnp.sum(picked) > 0, lambda v: v + 1.0, lambda v: v - 1.0, picked)
    run_counted(device, program, np.int32(index), f32(4))


def test_grad_through_a_while_free_cond_in_a_scan(device: Any) -> None:
    def loss(w: Any, xs: Any) -> Any:
        def step(h: Any, x: Any) -> Any:
            h = lax.cond(fnp.sum(x) > 0, lambda v: fnp.tanh(v @ w), lambda v: v * 0.9, h + x)
            return h, fnp.sum(h)
        _, ys = lax.scan(step, fnp.zeros(3), xs)
        return fnp.sum(ys * ys)
    run_counted(device, fg.grad(loss, argnums=(0, 1)), f32(3, 3), f32(5, 3))


def test_jit_on_committed_device_values(device: Any) -> None:
    args = rnn_args(4)
    got = fg.jit(fg.grad(rnn, argnums=(0, 2)))(*[fg.device_put(a, device.name) for a in args])
    want = fg.jit(fg.grad(rnn, argnums=(0, 2)))(*[fg.device_put(a, "CPU") for a in args])
    assert got[0].device == device.name
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.numpy(), w.numpy(), rtol=1e-4, atol=1e-5)


# --- host transfers do not grow with the number of steps ---------------------------------------------

@pytest.mark.parametrize("grad", [False, True], ids=["forward", "gradient"])
def test_scan_host_transfers_do_not_grow_with_the_step_count(device: Any, grad: bool) -> None:
    fn = fg.grad(rnn, argnums=(0, 1, 2)) if grad else rnn
    _, _, short = run_counted(device, fn, *rnn_args(5))
    _, _, long = run_counted(device, fn, *rnn_args(50))
    assert (long.uploads, long.downloads) == (short.uploads, short.downloads)
    assert long.download_bytes - short.download_bytes == (45 * 3 * 4 * device.stored_itemsize(np.float32)
                                                          if grad else 0)  # only the xs gradient is bigger
    assert long.copies > short.copies  # the rows are copied on the device, per step


def test_while_reads_back_one_predicate_per_iteration(device: Any) -> None:
    def program(x: Any, n: Any) -> Any:
        return lax.fori_loop(0, n, lambda i, v: fnp.tanh(v + x), x)
    _, _, short = run_counted(device, program, f32(4), np.int32(5))
    _, _, long = run_counted(device, program, f32(4), np.int32(50))
    assert long.uploads == short.uploads
    assert long.downloads - short.downloads == 45  # one predicate per extra iteration, nothing else
    assert long.download_bytes - short.download_bytes == 45 * device.stored_itemsize(np.bool_)


def test_cond_reads_back_only_its_index(device: Any) -> None:
    def program(i: Any, x: Any) -> Any:
        return lax.switch(i, [lambda v: v * 2.0, lambda v: -v], x)
    _, _, moved = run_counted(device, program, np.int32(1), f32(16))
    assert moved.downloads == 2  # the index, then the result
    assert moved.download_bytes == device.stored_itemsize(np.int32) + 16 * device.stored_itemsize(np.float32)


def test_without_copy_within_the_host_path_crosses_per_step(device: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The counter sees per-step traffic where it happens: a resident device without ``copy_within`` (here
    made so) runs its loops through the host, and its transfers grow with the steps."""
    monkeypatch.setattr(device_control, "has_copy_within", lambda _: False)
    counts = [run_counted(device, rnn, *rnn_args(steps), plan_of=Plan)[2] for steps in (5, 50)]
    assert counts[1].host > counts[0].host + 45
    assert counts[1].copies == counts[0].copies == 0


def test_run_buffers_returns_device_buffers(device: Any) -> None:
    ir, arrays = lowered(rnn, *rnn_args(3))
    plan = compile_plan(ir, device)
    buffers = [device.upload(a) for a in arrays]
    before = device.transfers.snapshot()
    (out,) = plan.run_buffers(buffers)
    assert device.transfers.host == before.host  # nothing came back to the host
    np.testing.assert_allclose(device.download(out, ir.out_avals[0]), eval_ir(ir, arrays)[0], rtol=1e-4)
    with pytest.raises(ValueError, match="plan takes 3 input buffers, got 2"):
        plan.run_buffers(buffers[:2])


def test_run_buffers_needs_a_device_with_its_own_memory() -> None:
    ir, _ = lowered(rnn, *rnn_args(3))
    with pytest.raises(ValueError, match="run_buffers needs a device with its own memory; CPU has none"):
        compile_plan(ir, get_device("CPU")).run_buffers([])
