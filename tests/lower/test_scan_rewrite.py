"""The scan rewrites of funcgrad/lower/scan_rewrite.py: products of xs slices and consts leave the loop
before it, accumulating carries become one product after it. Each rewritten IR is evaluated by the
reference interpreter against the original IR (same inputs), and compiled against it; the structure
tests check the rules fired (or, where they must not, did not)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, lax
from funcgrad.devices import default_device
from funcgrad.ir.core import IR
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower.scan_rewrite import rewrite_scans
from funcgrad.lower.schedule import inline_calls

RNG = np.random.default_rng(3)
# the rewrites are device-independent; with DEVICE=CL or WEBGPU each compiled check is a device program
pytestmark = pytest.mark.skipif(default_device().resident,
                                reason=f"device {default_device().name}: the CPU pass checks the rewrites")


def f32(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape).astype(np.float32)


def lowered(fn: Any, *args: np.ndarray) -> tuple[IR, list[np.ndarray]]:
    """``jit(fn)``'s open IR (calls inlined) and its operands (consts, then ``args``)."""
    low = fg.jit(fn).lower(*[Tensor(a) for a in args])
    return inline_calls(low.ir), [c.numpy() for c in low.consts] + list(args)


def scans(ir: IR) -> list[Any]:
    return [e for e in ir.eqns if e.primitive.name == "scan"]


def assert_same(fn: Any, *args: np.ndarray, rtol: float = 1e-5) -> tuple[IR, IR]:
    """The rewritten IR computes what the original does (interpreter), and so does the compiled jit."""
    ir, operands = lowered(fn, *args)
    new = rewrite_scans(ir)
    expected = eval_ir(ir, operands)
    for got, want in zip(eval_ir(new, operands), expected):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=1e-5)
    compiled = fg.jit(fn)(*[Tensor(a) for a in args])
    for got, want in zip(fg.tree.leaves(compiled), expected):
        np.testing.assert_allclose(got.numpy(), want, rtol=rtol, atol=1e-5)
    return ir, new


def rnn(w: Any, u: Any, b: Any, xs: Any, h0: Any, reverse: bool = False) -> Any:
    def step(h: Any, x: Any) -> Any:
        h = fnp.tanh(h @ w + x @ u + b)
        return h, h
    _, hs = lax.scan(step, h0, xs, reverse=reverse)
    return fnp.mean(hs * hs)


@pytest.mark.parametrize("steps", [0, 1, 5])
@pytest.mark.parametrize("reverse", [False, True])
def test_rnn_gradient_loses_its_weight_accumulators_and_input_product(steps: int, reverse: bool) -> None:
    args = (f32(4, 4), f32(3, 4), f32(4), f32(steps, 2, 3), f32(2, 4))
    loss = lambda w, u, b, xs, h0: rnn(w, u, b, xs, h0, reverse=reverse)  # noqa: E731
    ir, new = assert_same(fg.grad(loss, argnums=(0, 1, 2)), *args)
    forward, backward = scans(ir)
    new_forward, new_backward = scans(new)
    count = lambda eqn: sum(e.primitive.name == "dot_general" for e in eqn.param_dict["body"].eqns)  # noqa: E731
    assert count(new_forward) == count(forward) - 1  # x @ u: one product before the loop
    # dW, dU, db accumulate no more: the carries left are the cotangent of h (and nothing else)
    assert backward.param_dict["num_carry"] == 4 and new_backward.param_dict["num_carry"] == 1
    after = new.eqns[new.eqns.index(new_backward) + 1:]
    assert sum(e.primitive.name == "dot_general" for e in after) == 2
    assert sum(e.primitive.name == "reduce_sum" for e in after) >= 1


def test_hoisting_with_the_const_on_the_left_and_with_batch_dimensions() -> None:
    def left(c: Any, xs: Any) -> Any:  # c @ x: the step axis lands after c's free axis, then moves first
        return lax.scan(lambda h, x: (h + (c @ x).sum(), fnp.sin(c @ x)), fnp.zeros((), dtype="float32"), xs)

    def batched(c: Any, xs: Any) -> Any:  # batch axis 0 in both: the step axis lands after it
        return lax.scan(lambda h, x: (h * 0.5 + fnp.matmul(x, c), fnp.matmul(x, c).sum()), fnp.zeros((2, 3, 5),
                                                                                              dtype="float32"), xs)
    for fn, args in ((left, (f32(4, 3), f32(6, 3, 2))), (batched, (f32(2, 4, 5), f32(6, 2, 3, 4)))):
        ir, new = assert_same(fn, *args)
        (loop,) = scans(new)
        assert not [e for e in loop.param_dict["body"].eqns if e.primitive.name == "dot_general"]
        assert any(e.primitive.name == "dot_general" for e in new.eqns[:new.eqns.index(loop)])


def test_accumulators_of_sums_of_transposed_products_and_of_carries() -> None:
    def fn(a0: Any, xs: Any) -> Any:
        def step(carry: Any, x: Any) -> Any:
            h, acc_t, acc_s, acc_h = carry
            h2 = fnp.tanh(h + x.sum(0))
            return (h2, acc_t + (x.T @ x).T, acc_s + x.sum(0), acc_h + fnp.outer(h, h2)), h2
        return lax.scan(step, (a0, fnp.zeros((3, 3), dtype="float32"), fnp.zeros(3, dtype="float32"),
                               fnp.ones((3, 3), dtype="float32")), xs)
    ir, new = assert_same(fn, f32(3), f32(5, 4, 3))
    (loop,) = scans(new)
    assert loop.param_dict["num_carry"] == 1  # h only: the three accumulators became products and a sum after it


def test_a_carry_read_by_the_body_is_not_an_accumulator() -> None:
    def fn(xs: Any) -> Any:
        def step(acc: Any, x: Any) -> Any:
            new = acc + x.T @ x
            return new, fnp.sum(acc)  # acc is read: the per-step values matter
        return lax.scan(step, fnp.zeros((3, 3), dtype="float32"), xs)
    ir, new = assert_same(fn, f32(4, 2, 3))
    assert scans(new)[0].param_dict["num_carry"] == 1
    assert [e.primitive.name for e in new.eqns] == [e.primitive.name for e in ir.eqns]


def test_nested_scans_are_rewritten_when_their_body_is_compiled() -> None:
    def fn(u: Any, xss: Any) -> Any:
        def outer(acc: Any, xs: Any) -> Any:
            def inner(h: Any, x: Any) -> Any:
                return fnp.tanh(h + x @ u), h
            h, hs = lax.scan(inner, fnp.zeros((2, 3), dtype="float32"), xs)
            return acc + hs.sum(), h.sum()
        return lax.scan(outer, fnp.zeros((2, 3), dtype="float32"), xss)
    ir, _ = assert_same(fn, f32(4, 3), f32(3, 5, 2, 4))
    (outer,) = scans(ir)
    inner_body = rewrite_scans(outer.param_dict["body"])  # what the outer body's plan does to it
    (inner,) = scans(inner_body)
    assert not [e for e in inner.param_dict["body"].eqns if e.primitive.name == "dot_general"]


@pytest.mark.parametrize("reverse", [False, True])
def test_an_xs_slice_kept_as_a_y_is_the_stacked_operand(reverse: bool) -> None:
    def fn(xs: Any, c: Any) -> Any:  # the ys: the slice itself (twice), and a computed row
        carry, (same, again, computed) = lax.scan(lambda c, x: (c * x, (x, x, c + x)), c, xs, reverse=reverse)
        return carry, same * 2.0, again, computed
    xs, c = f32(5, 3), f32(3)
    ir, new = assert_same(fn, xs, c)
    (loop,) = scans(new)
    assert len(loop.outputs) == 2  # the carry and the computed ys: no copied rows
    assert new.outputs[2] is new.in_vars[0]  # the output read straight from the operand
    got = fg.jit(fn)(Tensor(xs), Tensor(c))
    np.testing.assert_array_equal(got[2].numpy(), xs)
    want = c.astype(np.float64)
    for x in (xs[::-1] if reverse else xs).astype(np.float64):
        want = want * x
    np.testing.assert_allclose(got[0].numpy(), want, rtol=1e-5)


def test_the_rnn_forward_copies_no_input_row_per_step() -> None:
    ir, new = assert_same(fg.grad(rnn, argnums=(0, 1, 2)), f32(4, 4), f32(4, 4), f32(4), f32(6, 2, 4), f32(2, 4))
    forward = scans(new)[0]
    body = forward.param_dict["body"]
    xs_slices = {v.id for v in body.in_vars[forward.param_dict["num_consts"] + forward.param_dict["num_carry"]:]}
    assert not any(getattr(y, "id", None) in xs_slices for y in body.outputs[forward.param_dict["num_carry"]:])


@pytest.mark.parametrize("reverse", [False, True])
def test_elementwise_producers_of_xs_move_into_the_body(reverse: bool) -> None:
    def fn(a: Any, b: Any, c: Any) -> Any:  # xs = 2 * a * b + 1 (a chain, a broadcast literal), read only by the scan
        xs = 2.0 * a * b + fnp.ones_like(a)
        return lax.scan(lambda h, x: (fnp.tanh(h + x), h * x), c, xs, reverse=reverse)
    a, b, c = f32(6, 3), f32(6, 3), f32(3)
    ir, new = assert_same(fn, a, b, c)
    (loop,) = scans(new)
    assert [e.primitive.name for e in new.eqns] == ["scan"]  # the chain is in the body now
    assert set(loop.inputs[1:]) == {new.in_vars[0], new.in_vars[1]}  # the loop reads the rows of a and b
    want = c.astype(np.float64)
    xs = 2.0 * a.astype(np.float64) * b + 1.0
    for x in (xs[::-1] if reverse else xs):
        want = np.tanh(want + x)
    np.testing.assert_allclose(fg.jit(fn)(Tensor(a), Tensor(b), Tensor(c))[0].numpy(), want, rtol=1e-5)


def test_an_xs_operand_read_outside_the_loop_stays_outside() -> None:
    def fn(a: Any, c: Any) -> Any:
        xs = fnp.exp(a)
        carry, ys = lax.scan(lambda h, x: (h * x, h + x), c, xs)
        return carry, ys + xs  # xs is read after the loop too
    ir, new = assert_same(fn, f32(5, 2), f32(2))
    assert "exp" in [e.primitive.name for e in new.eqns]
    (loop,) = scans(new)
    assert "exp" not in [e.primitive.name for e in loop.param_dict["body"].eqns]


def test_an_xs_operand_kept_as_a_y_and_read_after_the_loop_is_not_sunk() -> None:
    def fn(a: Any, c: Any) -> Any:  # ys[0] is the slice: it becomes xs itself, which must then stay computed outside
        carry, (rows, other) = lax.scan(lambda h, x: (h * x, (x, h + x)), c, fnp.tanh(a))
        return carry, rows * 2.0, other
    a, c = f32(4, 3), f32(3)
    ir, new = assert_same(fn, a, c)
    assert "tanh" in [e.primitive.name for e in new.eqns]
    np.testing.assert_allclose(fg.jit(fn)(Tensor(a), Tensor(c))[1].numpy(), 2.0 * np.tanh(a.astype(np.float64)),
                               rtol=1e-5)


def test_an_xs_operand_made_of_literals_alone_stays_outside() -> None:
    """``mul(broadcast 2, broadcast 3)`` feeding xs (tracing folds it; a rewrite's own output may not): sunk into
    the body it would read two scalars and make a scalar where the body wants a row, so it stays outside."""
    from funcgrad.ir.core import Eqn, Literal, Var, typecheck
    from funcgrad.ir.primitives import broadcast_in_dim_p, mul_p

    ir, operands = lowered(lambda h0: lax.scan(lambda h, x: (h + x, h * x), h0, fnp.ones((5, 3), dtype=np.float32)),
                           f32(3))
    stacked = scans(ir)[0].inputs[1]
    halves = [Var(stacked.aval), Var(stacked.aval)]
    made = [Eqn(broadcast_in_dim_p, [Literal.of(np.float32(v))], {"shape": (5, 3), "broadcast_dimensions": ()}, [h])
            for v, h in zip((2.0, 3.0), halves)] + [Eqn(mul_p, halves, {}, [stacked])]
    hand = IR(ir.in_vars, made + [e for e in ir.eqns if stacked not in e.outputs], ir.outputs)
    typecheck(hand)
    new = rewrite_scans(hand)
    typecheck(new)
    assert any(e.primitive is mul_p for e in new.eqns)  # the product stayed outside the loop
    for got, want in zip(eval_ir(new, operands), eval_ir(hand, operands)):
        np.testing.assert_array_equal(got, want)
