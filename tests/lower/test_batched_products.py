"""Products beyond the 2-D one reach the register tile (``schedule._column_operand_layouts``): a product
with batch axes or several free/contracting axes whose column operand is strided along the columns
(attention's ``q @ k.T`` per head, ``dY @ W.T`` over batch and sequence, a batched product of a transposed
operand) stores that operand once in (batch, contracting, free) order, and its kernel then takes the tile.
Results (forward and gradients) against the reference interpreter and NumPy float64."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir.core import IR
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower import kernel as K
from funcgrad.lower import render_tile
from funcgrad.lower import schedule as S


def _opened(ir: IR) -> IR:
    return IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)


def _kernels(fn: Callable[..., Any], *args: np.ndarray) -> list[K.Kernel]:
    ir = fg.make_ir(fn)(*(fg.Tensor(a) for a in args))
    return [s.kernel for s in S.schedule(_opened(ir), row_reductions=True) if isinstance(s, S.KernelStep)]


def _products(kernels: list[K.Kernel]) -> list[K.Kernel]:
    return [k for k in kernels if k.reduce_op == "sum" and k.reduce_expr is not None and k.reduce_expr.op == "mul"]


def _copies(kernels: list[K.Kernel]) -> list[K.Kernel]:
    return [k for k in kernels if k.reduce_op is None and len(k.outputs) == 1 and k.outputs[0].op == "load"]


def _args(*shapes: tuple[int, ...], seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]


def _check(fn: Callable[..., Any], numpy_fn: Callable[..., Any], args: list[np.ndarray]) -> None:
    """fg.jit(fn) against the reference interpreter and NumPy float64, forward and the gradient of
    sum(fn(...) * cotangent) with respect to every argument."""
    out = fg.jit(fn)(*(fnp.asarray(a) for a in args)).numpy()
    expected = numpy_fn(*(a.astype(np.float64) for a in args))
    ir = fg.make_ir(fn)(*(fg.Tensor(a) for a in args))
    (interpreted,) = eval_ir(ir, args)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(out, expected, atol=2e-5 * scale, rtol=0)
    np.testing.assert_allclose(out, interpreted, atol=2e-5 * scale, rtol=0)

    cotangent = _args(expected.shape, seed=1)[0]
    loss = lambda *xs: (fn(*xs) * fnp.asarray(cotangent)).sum()
    argnums = tuple(range(len(args)))
    grads = fg.jit(fg.grad(loss, argnums=argnums))(*(fnp.asarray(a) for a in args))
    grad_ir = fg.make_ir(fg.grad(loss, argnums=argnums))(*(fg.Tensor(a) for a in args))
    interpreted_grads = eval_ir(grad_ir, args)
    for i, (got, want) in enumerate(zip(grads, interpreted_grads)):
        # finite differences of the float64 NumPy function along one random direction
        direction = _args(args[i].shape, seed=2 + i)[0].astype(np.float64)
        base = [a.astype(np.float64) for a in args]
        step = 1e-6
        plus = [*base[:i], base[i] + step * direction, *base[i + 1:]]
        minus = [*base[:i], base[i] - step * direction, *base[i + 1:]]
        slope = ((numpy_fn(*plus) - numpy_fn(*minus)) * cotangent).sum() / (2 * step)
        got = got.numpy()
        assert float((got.astype(np.float64) * direction).sum()) == pytest.approx(slope, rel=1e-4, abs=1e-3)
        np.testing.assert_allclose(got, want, atol=2e-5 * np.abs(want).max(), rtol=0)


def nt(a: Any, b: Any) -> Any:  # batched product with the second operand stored transposed
    return a @ fnp.swapaxes(b, -1, -2)


def nt_numpy(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a @ np.swapaxes(b, -1, -2)


def scores(q: Any, k: Any) -> Any:  # attention's scores per head: (batch, heads, seq, seq)
    return q @ fnp.swapaxes(k, -1, -2)


def back_projection(dy: Any, w: Any) -> Any:  # dY @ W.T over batch and sequence: (batch, seq, in)
    return fnp.einsum("btn,kn->btk", dy, w)


def back_projection_numpy(dy: np.ndarray, w: np.ndarray) -> np.ndarray:
    return np.einsum("btn,kn->btk", dy, w)


CASES = [
    ("batched, rhs transposed", nt, nt_numpy, ((3, 40, 24), (3, 48, 24))),
    ("per head", scores, nt_numpy, ((2, 3, 32, 16), (2, 3, 40, 16))),
    ("over batch and sequence", back_projection, back_projection_numpy, ((2, 24, 40), (32, 40))),
    ("odd sizes", nt, nt_numpy, ((2, 17, 9), (2, 23, 9))),
]


STORED = [c for c in CASES if c[0] != "over batch and sequence"]


@pytest.mark.parametrize("name, fn, numpy_fn, shapes", STORED, ids=[c[0] for c in STORED])
def test_strided_column_operand_is_stored_in_product_order_and_tiled(name: str, fn: Any, numpy_fn: Any,
                                                                     shapes: Any) -> None:
    kernels = _kernels(fn, *_args(*shapes))
    (product,) = _products(kernels)
    (copy,) = _copies(kernels)  # the column operand, stored once contiguous along the columns
    column = f"g{len(product.shape) - 1}"
    loads = [load for load in S._collect(product.reduce_expr, "load", {}, set()) if S._depends_on(load, column)]
    assert [K._affine(load.args[0]).get(K.var(column)) for load in loads] == [1], name
    assert render_tile._tileable(product), name
    assert copy.out_avals[0] == product.in_avals[loads[0].arg], name  # the column operand is the copy


@pytest.mark.parametrize("shapes", [((4, 64, 64), (96, 64)), ((2, 8, 17, 64), (96, 64))], ids=["3-D", "4-D"])
def test_a_product_over_batch_and_sequence_is_2d_and_packs_its_strided_column_operand(shapes: Any) -> None:
    """``dY @ W.T`` over batch and sequence (or more leading axes): its kernel merges the leading loops
    into one row loop (``kernel.merge_loops``), so it is the 2-D product whose strided column operand the
    tile packs per panel (``render_tile._packable``), and no copy of ``W`` is stored first."""
    fn = lambda dy, w: fnp.matmul(dy, fnp.swapaxes(w, 0, 1))
    kernels = _kernels(fn, *_args(*shapes))
    (product,) = _products(kernels)
    assert _copies(kernels) == []
    rows = int(np.prod(shapes[0][:-1]))
    assert product.shape == (rows, shapes[1][0])
    assert render_tile._packable(product) and render_tile.tile_opts(product) is not None
    _check(fn, lambda dy, w: dy @ w.T, _args(*shapes))


@pytest.mark.parametrize("per_batch", [True, False], ids=["epilogue per batch", "epilogue per row"])
def test_an_epilogue_that_keeps_the_loops_apart_stores_the_column_operand(per_batch: bool) -> None:
    """``dY @ W.T + c[:, None, :]``: the epilogue reads per batch, not per row, so the kernel keeps three
    loops; then ``W`` is stored transposed first and the 3-D kernel takes the tile. Read per row
    (``+ c`` of the output's shape) the loops merge and nothing is copied."""
    shapes = ((4, 64, 64), (96, 64), (4, 96) if per_batch else (4, 64, 96))
    fn = (lambda dy, w, c: fnp.matmul(dy, fnp.swapaxes(w, 0, 1)) + c[:, None, :]) if per_batch else \
        (lambda dy, w, c: fnp.matmul(dy, fnp.swapaxes(w, 0, 1)) + c)
    kernels = _kernels(fn, *_args(*shapes))
    (product,) = _products(kernels)
    assert len(_copies(kernels)) == (1 if per_batch else 0)
    assert len(product.shape) == (3 if per_batch else 2) and render_tile.tile_opts(product) is not None
    numpy_fn = (lambda dy, w, c: dy @ w.T + c[:, None, :]) if per_batch else (lambda dy, w, c: dy @ w.T + c)
    _check(fn, numpy_fn, _args(*shapes))


@pytest.mark.parametrize("name, fn, numpy_fn, shapes", CASES, ids=[c[0] for c in CASES])
def test_batched_products_match_the_reference_forward_and_gradients(name: str, fn: Any, numpy_fn: Any,
                                                                     shapes: Any) -> None:
    _check(fn, numpy_fn, _args(*shapes))


def test_big_batched_product_takes_the_tile_on_every_thread() -> None:
    from funcgrad.lower import optimize
    kernels = _kernels(nt, *_args((8, 96, 64), (8, 128, 64)))  # 6.3M multiply-adds: over SMALL_TILE_WORK
    (product,) = _products(kernels)
    opts = optimize.heuristic_opts(product)
    assert render_tile.tile_opts(product) is not None and opts[:2] == render_tile.tile_opts(product)[:2]
    threads = [opt.amount for opt in opts if opt.action == "thread"]
    assert threads == ([optimize._threads(product)] if optimize._threads(product) > 1 else [])


def test_products_the_tile_already_handles_get_no_copy() -> None:
    # a 2-D product over one contraction packs its transposed operand itself
    assert not _copies(_kernels(lambda a, b: a @ b.T, *_args((64, 32), (48, 32))))
    # contiguous along the columns already
    assert not _copies(_kernels(lambda a, b: a @ b, *_args((3, 40, 24), (3, 24, 48))))
    # too few rows to pay for the copy (a matrix-vector product per batch)
    assert not _copies(_kernels(nt, *_args((3, 2, 24), (3, 48, 24))))


def test_convolution_products_keep_their_own_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """conv.py chose its products' layouts (a strided window view included): the rule adds no copy there."""
    x, w = _args((2, 8, 12, 12), (16, 8, 3, 3))
    conv = fg.grad(lambda x, w: fg.lax.conv_general_dilated(x, w, (2, 2), [(1, 1), (1, 1)]).sum(), argnums=(0, 1))
    with_rule = [str(k) for k in _kernels(conv, x, w)]
    monkeypatch.setattr(S, "_column_operand_layouts", lambda ir, stored, products: {})
    assert with_rule == [str(k) for k in _kernels(conv, x, w)]


def linear3d(x: Any, w: Any) -> Any:  # (batch, seq, in) @ (in, out)
    return x @ w


def heads_merged(p: Any, v: Any) -> Any:  # attention's output per head, back in (batch, seq, width)
    b, h, t, d = v.shape
    return fnp.swapaxes(p @ v, 1, 2).reshape((b, t, h * d))


def heads_merged_numpy(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    b, h, t, d = v.shape
    return np.swapaxes(p @ v, 1, 2).reshape((b, t, h * d))


def test_batched_array_times_matrix_is_one_product_without_broadcast() -> None:
    x, w = _args((2, 24, 40), (40, 32))
    ir = fg.make_ir(linear3d)(fg.Tensor(x), fg.Tensor(w))
    (dot,) = [e for e in ir.eqns if e.primitive.name == "dot_general"]
    assert dot.param_dict["batch"] == ((), ()) and not [e for e in ir.eqns if e.primitive.name == "broadcast_in_dim"]
    cotangent = _args((2, 24, 32), seed=3)[0]
    grads = fg.grad(lambda x, w: (linear3d(x, w) * fnp.asarray(cotangent)).sum(), argnums=(0, 1))
    kernels = _kernels(grads, x, w)
    weight = [k for k in _products(kernels) if k.shape == (40, 32)]
    # the weight gradient: one product summing over batch and sequence, not per-batch products then a sum;
    # a sum this short has no partial sums, so its two loops are one (kernel.merge_loops) and the tile packs it
    assert len(weight) == 1 and weight[0].reduce_shape == (48,) and render_tile._tileable(weight[0])
    broadcast_copies = [k for k in kernels if k.reduce_op is None and int(np.prod(k.shape)) >= 2 * 40 * 32]
    assert not broadcast_copies  # no copy of w per batch


def test_product_is_stored_before_a_reshape_that_merges_into_its_columns() -> None:
    kernels = _kernels(heads_merged, *_args((2, 3, 32, 32), (2, 3, 32, 16)))
    (product,) = _products(kernels)
    assert not S._collect(product.reduce_expr, ("div", "rem"), {}, set())
    assert render_tile._tileable(product)


@pytest.mark.parametrize("fn, numpy_fn, shapes", [
    (linear3d, lambda x, w: x @ w, ((2, 24, 40), (40, 32))),
    (heads_merged, heads_merged_numpy, ((2, 3, 32, 32), (2, 3, 32, 16))),
], ids=["linear3d", "heads_merged"])
def test_products_through_movements_match_the_reference(fn: Any, numpy_fn: Any, shapes: Any) -> None:
    _check(fn, numpy_fn, _args(*shapes))


@pytest.mark.parametrize("batch, seq, merged", [(4, 64, True), (8, 512, False)])
def test_a_weight_gradient_sums_over_one_loop_unless_it_is_long_enough_for_partial_sums(
        batch: int, seq: int, merged: bool) -> None:
    """X.T @ dY over batch and sequence: under ``PARTIAL_SUM_MIN`` terms its two reduction loops merge into
    one, so the tile's 2-D rules (packing the column operand) apply; a longer sum keeps two levels."""
    x, w = _args((batch, seq, 24), (24, 16))
    cotangent = _args((batch, seq, 16), seed=3)[0]
    loss = lambda x, w: (linear3d(x, w) * fnp.asarray(cotangent)).sum()
    (weight,) = [k for k in _products(_kernels(fg.grad(loss, argnums=1), x, w)) if k.shape == (24, 16)]
    assert (batch * seq < K.PARTIAL_SUM_MIN) == merged
    assert weight.reduce_shape == ((batch * seq,) if merged else (batch, seq))
    got = fg.jit(fg.grad(loss, argnums=1))(fnp.asarray(x), fnp.asarray(w)).numpy()
    expected = np.einsum("bsi,bsj->ij", x.astype(np.float64), cotangent.astype(np.float64))
    np.testing.assert_allclose(got, expected, atol=2e-5 * np.abs(expected).max(), rtol=0)


def split_heads(x: Any, w: Any) -> Any:  # a fused projection split three ways into heads, as attention does
    b, t, width = x.shape
    qkv = x @ w
    q, k, v = (fnp.swapaxes(qkv[..., i * width:(i + 1) * width].reshape((b, t, 2, width // 2)), 1, 2)
               for i in range(3))
    return fnp.tanh(q @ fnp.swapaxes(k, -1, -2)) @ v


def split_heads_numpy(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    b, t, width = x.shape
    qkv = x @ w
    q, k, v = (np.swapaxes(qkv[..., i * width:(i + 1) * width].reshape((b, t, 2, width // 2)), 1, 2)
               for i in range(3))
    return np.tanh(q @ np.swapaxes(k, -1, -2)) @ v


def test_a_computed_operand_read_by_two_products_is_stored_once_not_copied() -> None:
    """The projection's gradient dY (a concatenation of the three heads' gradients, computed through
    reshapes) is read by X.T @ dY and dY @ W.T. It is stored once: no kernel copies it, and W is not
    stored transposed (dY @ W.T merges to 2-D and the tile packs W itself). Values against the
    interpreter and NumPy float64, forward and gradients."""
    x, w = _args((2, 16, 32), (32, 96))
    cotangent = _args((2, 2, 16, 16), seed=4)[0]
    loss = lambda x, w: (split_heads(x, w) * fnp.asarray(cotangent)).sum()
    kernels = _kernels(fg.grad(loss, argnums=(0, 1)), x, w)
    identity = [k for k in _copies(kernels) if K._affine(k.outputs[0].args[0]) == K._affine(
        K.flat_index([K.var(f"g{d}") for d in range(len(k.shape))], k.shape))]
    assert _copies(kernels) and not identity  # (attention's k.T is a copy in another order; dY is not copied)
    transposes = [k for k in kernels if k.reduce_op is None and k.in_avals and k.in_avals[0].shape == (32, 96)
                  and k.shape == (96, 32)]
    assert not transposes
    _check(split_heads, split_heads_numpy, [x, w])
