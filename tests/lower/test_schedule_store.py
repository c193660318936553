"""Shared gathers (``schedule._shared_gathers``): an elementwise value that several kernels would
recompute through a gather (a max-pool's backward feeding BatchNorm's backward sums) is stored once, in
the layout of the largest buffer it reads, and the index simplifier's common-factor rule
(``kernel._common_factor``) that turns a pooling window's row index back into an affine one."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.nn.functional as F
from funcgrad.ir.core import IR
from funcgrad.lower import kernel as K
from funcgrad.lower import schedule as S
from funcgrad.lower.conv import lower_convolutions


def _opened(ir: IR) -> IR:
    return IR(tuple(ir.const_vars) + tuple(ir.in_vars), ir.eqns, ir.outputs)


C_IN, C, HW = 3, 32, 16  # conv output (8, 32, 16, 16): 256 KB of float32; pooled: 64 KB (SHARED_MIN_BYTES)


def _net(x: Any, w: Any, b: Any, gamma: Any, beta: Any, ct: Any) -> Any:
    """conv (channels-last product) -> ReLU -> BatchNorm (batch statistics) -> 2x2 max-pool, dotted with ``ct``."""
    y = F.relu(F.conv2d(x, w, b, padding=1))
    y = F.batch_norm(y, None, None, gamma, beta, training=True)[0]
    return (F.max_pool2d(y, 2) * ct).sum()


def _args(dtype: Any = np.float32, batch: int = 8, hw: int = HW) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [a.astype(dtype) for a in (rng.standard_normal((batch, C_IN, hw, hw)),
                                      rng.standard_normal((C, C_IN, 3, 3)) * 0.3, rng.standard_normal(C) * 0.1,
                                      1 + 0.2 * rng.standard_normal(C), 0.1 * rng.standard_normal(C),
                                      rng.standard_normal((batch, C, hw // 2, hw // 2)))]


GRAD = fg.grad(_net, argnums=(0, 1, 2, 3, 4))


def _kernels(fn: Any, *args: Any) -> list[K.Kernel]:
    ir = fg.make_ir(fn)(*(fg.Tensor(a) for a in args))
    return [s.kernel for s in S.schedule(_opened(ir), row_reductions=True) if isinstance(s, S.KernelStep)]


def _ops(e: K.KExpr | None) -> set[str]:
    if e is None:
        return set()
    return {node.op for node in S._collect(e, tuple(K.BINARY) + tuple(K.UNARY) + ("load",), {}, set())}


def _load_indices(e: K.KExpr | None) -> list[K.KExpr]:
    return [] if e is None else [load.args[0] for load in S._collect(e, "load", {}, set())]


def _gathers(e: K.KExpr | None) -> bool:
    return any(S._collect(index, ("div", "rem"), {}, set()) for index in _load_indices(e))


def test_pool_backward_under_batchnorm_is_stored_once_channels_last() -> None:
    kernels = _kernels(GRAD, *_args())
    channels_last = (8, HW, HW, C)
    stores = [k for k in kernels if k.reduce_op is None and k.shape == channels_last and _gathers(k.outputs[0])]
    assert len(stores) == 1, [(k.name, k.shape) for k in kernels]
    assert stores[0].out_avals[0].shape == channels_last
    # BatchNorm's backward sums per channel read it (and the conv output) without any gather now
    sums = [k for k in kernels if k.reduce_op == "sum" and k.shape == (C,)]
    assert len(sums) >= 3
    assert not any(_gathers(k.reduce_expr) for k in sums), [str(k) for k in sums if _gathers(k.reduce_expr)]
    # the pool (max) and its backward's count of maxima are stored channels-last too (_window_layouts), so
    # the stored gather reads them contiguously along the channels
    pooled = (8, HW // 2, HW // 2, C)
    assert sorted(k.reduce_op for k in kernels if k.shape == pooled and k.reduce_shape == (2, 2)) == ["max", "sum"]
    assert not any(k.shape == (8, C, HW // 2, HW // 2) and k.reduce_shape == (2, 2) for k in kernels)
    # ... and loop over their windows innermost (render_llvm.reduce_outer: no i-k-j order for a 2x2 window
    # whose loads all run along the channels; it read the pool 4 times per output there and ran 2x slower)
    from funcgrad.lower.optimize import heuristic_opts
    for k in kernels:
        if k.shape == pooled and k.reduce_shape == (2, 2):
            assert not any(opt.action == "reorder" for opt in heuristic_opts(k)), (k.name, heuristic_opts(k))


def test_the_rule_is_off_without_the_gather_and_for_small_values() -> None:
    """BatchNorm's backward alone (no pool) gathers nothing; the same net at a tiny size stores nothing new."""
    def bn_only(x: Any, w: Any, b: Any, gamma: Any, beta: Any) -> Any:
        return (F.batch_norm(F.relu(F.conv2d(x, w, b, padding=1)), None, None, gamma, beta,
                             training=True)[0] ** 2).sum()

    for fn, args in [(fg.grad(bn_only, argnums=(0, 1, 3)), _args()[:5]), (GRAD, _args(batch=2, hw=4))]:
        ir = fg.make_ir(fn)(*(fg.Tensor(a) for a in args))
        lowered, keep = lower_convolutions(S.inline_calls(_opened(ir)))
        stored = S._materialized(lowered, keep, True)
        assert S._shared_gathers(lowered, stored) == {}


@pytest.mark.parametrize("name, fn, shapes", [
    ("softmax", lambda x: fg.grad(lambda v: (F.softmax(v, -1) * v).sum())(x), [(64, 300)]),
    ("layernorm", lambda x: fg.grad(lambda v: (F.layer_norm(v, (300,)) ** 2).sum())(x), [(64, 300)]),
    ("mlp", lambda x, w1, w2: fg.grad(lambda a, b: (F.gelu(x @ a) @ b).sum(), argnums=(0, 1))(w1, w2),
     [(64, 128), (128, 256), (256, 10)]),
])
def test_softmax_layernorm_mlp_gather_nothing(name: str, fn: Any, shapes: list[tuple[int, ...]]) -> None:
    rng = np.random.default_rng(1)
    ir = fg.make_ir(fn)(*(fg.Tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes))
    lowered, keep = lower_convolutions(S.inline_calls(_opened(ir)))
    assert S._shared_gathers(lowered, S._materialized(lowered, keep, True)) == {}, name


def test_upsampled_value_read_by_two_sums_is_stored_in_its_source_layout() -> None:
    """A nearest-neighbour upsampling times exp(x), with x read transposed, feeding two sums over the
    leading axes and an elementwise output: stored once, in x's memory order (x is the largest buffer it
    reads), and the results equal float64 NumPy's."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((24, 64, 40)).astype(np.float32)      # (c, h, w) memory, read as (h, w, c)
    small = rng.standard_normal((32, 20, 24)).astype(np.float32)  # (h/2, w/2, c)

    def f(x: Any, small: Any) -> Any:
        up = fg.numpy.repeat(fg.numpy.repeat(small, 2, axis=0), 2, axis=1)  # (64, 40, 24)
        xt = x.transpose(1, 2, 0)
        g = fg.numpy.exp(xt) * up
        return g.sum(axis=(0, 1)), (g * xt).sum(axis=(0, 1)), g + 1.0

    ir = fg.make_ir(f)(fg.Tensor(x), fg.Tensor(small))
    lowered, keep = lower_convolutions(S.inline_calls(_opened(ir)))
    chosen = S._shared_gathers(lowered, S._materialized(lowered, keep, True))
    assert list(chosen.values()) == [(2, 0, 1)]  # stored as (c, h, w): x's order
    xt = x.astype(np.float64).transpose(1, 2, 0)
    g = np.exp(xt) * np.repeat(np.repeat(small.astype(np.float64), 2, axis=0), 2, axis=1)
    got = fg.jit(f)(fg.Tensor(x), fg.Tensor(small))
    for value, expected in zip(got, (g.sum(axis=(0, 1)), (g * xt).sum(axis=(0, 1)), g + 1.0)):
        np.testing.assert_allclose(value.numpy(), expected, rtol=2e-5, atol=2e-5 * np.abs(expected).max())


def test_gradients_match_torch_float64() -> None:
    """The net's float32 gradients (pool, count and pool backward stored channels-last) against PyTorch's
    in float64."""
    torch = pytest.importorskip("torch")
    ours = [g.numpy().astype(np.float64) for g in fg.jit(GRAD)(*(fg.Tensor(a) for a in _args()))]
    leaves = [torch.tensor(a, requires_grad=i < 5) for i, a in enumerate(_args(np.float64))]
    x, w, b, gamma, beta, ct = leaves
    y = torch.nn.functional.relu(torch.nn.functional.conv2d(x, w, b, padding=1))
    y = torch.nn.functional.batch_norm(y, None, None, gamma, beta, training=True)
    (torch.nn.functional.max_pool2d(y, 2) * ct).sum().backward()
    for mine, leaf in zip(ours, leaves):
        reference = leaf.grad.numpy()
        assert np.abs(mine - reference).max() <= 2e-5 * np.abs(reference).max()


# --- the index simplifier's common factor -------------------------------------------------------

def _value(e: K.KExpr, point: dict[str, int]) -> int:
    if e.op == "const":
        return int(e.arg)
    if e.op == "var":
        return point[e.arg]
    a, b = (_value(x, point) for x in e.args)
    return {"add": a + b, "sub": a - b, "mul": a * b, "div": a // b if b else 0, "rem": a % b if b else 0}[e.op]


def _c(n: int) -> K.KExpr:
    return K.const(n, K.INDEX)


@pytest.mark.parametrize("op", ["div", "rem"])
@pytest.mark.parametrize("inner, row, n", [(20, 20, 40), (4, 8, 16), (6, 12, 36), (5, 10, 20), (3, 5, 10)])
def test_common_factor_keeps_values_and_drops_the_inner_axis(op: str, inner: int, row: int, n: int) -> None:
    """div(w + row*h, n) with w < inner <= row: the pooling row index div(h, n/row) when row divides n."""
    h, w = K.var("h"), K.var("w")
    bounds = {"h": 9, "w": inner}
    e = K.alu(op, K.alu("add", w, K.alu("mul", h, _c(row))), _c(n))
    simplified = K.simplify_index(e, bounds)
    for point in (dict(zip(bounds, p)) for p in itertools.product(*(range(b) for b in bounds.values()))):
        assert _value(simplified, point) == _value(e, point), (str(e), str(simplified), point)
    if op == "div":
        assert "w" not in str(simplified) and str(simplified) == f"div(h, {n // row})"


def test_pool_row_index_becomes_affine_in_a_load() -> None:
    """(rem(w, 2)*32 + div(w, 2)*64 + rem(h, 2)*640 + div(w + 20h, 40)*1280): the channels-last address of
    a 2x2 max-pool's backward read back at (h, w) is w*32 + h*640."""
    h, w = K.var("g1"), K.var("g2")
    index = K.alu("add", K.alu("add", K.alu("mul", K.alu("rem", w, _c(2)), _c(32)),
                               K.alu("mul", K.alu("div", w, _c(2)), _c(64))),
                  K.alu("add", K.alu("mul", K.alu("rem", h, _c(2)), _c(640)),
                        K.alu("mul", K.alu("div", K.alu("add", w, K.alu("mul", h, _c(20))), _c(40)), _c(1280))))
    load = K.simplify_index(K.load(0, index, np.dtype(np.float32)), {"g1": 20, "g2": 20})
    assert K._affine(load.args[0]) == {w: 32, h: 640}
