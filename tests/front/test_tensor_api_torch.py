"""tinygrad's Tensor methods (tensor_math, tensor_movement, tensor_nn, tensor_creation and the
autodiff ones) against PyTorch: forward values and the gradient w.r.t. every float input, on random
inputs of several shapes (broadcasting, zero-size, rank 0 where the method takes them), plus the
errors bad arguments get. Each row of CASES is one method and one set of input shapes."""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
from funcgrad import Tensor

torch = pytest.importorskip("torch")
tF = torch.nn.functional


@dataclass
class In:
    """One input: a float (``kind='f'``, differentiated), int or bool array of ``shape`` in [low, high)."""

    shape: tuple[int, ...]
    kind: str = "f"
    low: float = -2.0
    high: float = 2.0


@dataclass
class Case:
    name: str
    ours: Callable[..., Any]
    theirs: Callable[..., Any]
    inputs: list[In]
    grad: bool = True
    rtol: float = 2e-4
    atol: float = 2e-5
    pick: int = 0  # which output is differentiated when the method returns several
    frozen: tuple[int, ...] = ()  # float inputs torch does not differentiate (class weights, pos_weight)
    extra: dict[str, Any] = field(default_factory=dict)


def F32(*shape: int, low: float = -2.0, high: float = 2.0) -> In:  # noqa: N802
    return In(shape, "f", low, high)


def I32(*shape: int, low: int = 0, high: int = 5) -> In:  # noqa: N802
    return In(shape, "i", low, high)


def B(*shape: int) -> In:  # noqa: N802
    return In(shape, "b")


def _unary(name: str, torch_fn: Callable[..., Any], low: float = -2.0, high: float = 2.0,
           shapes: tuple[tuple[int, ...], ...] = ((3, 4), (), (0, 3)), **kw: Any) -> list[Case]:
    return [Case(f"{name}{list(s)}", lambda x, n=name: getattr(x, n)(**kw), torch_fn, [F32(*s, low=low, high=high)])
            for s in shapes]


def _binary(name: str, torch_fn: Callable[..., Any], low: float = -2.0, high: float = 2.0, grad: bool = True,
            **kw: Any) -> list[Case]:
    shapes = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((4,), (2, 3, 4)), ((), (2, 3)), ((0, 3), (3,))]
    return [Case(f"{name}{list(a)}{list(b)}", lambda x, y, n=name: getattr(x, n)(y, **kw), torch_fn,
                 [F32(*a, low=low, high=high), F32(*b, low=low, high=high)], grad=grad) for a, b in shapes]


def _reduction(name: str, torch_fn: Callable[..., Any], **kw: Any) -> list[Case]:
    cases = []
    for shape, axis, keep in [((3, 4), 1, True), ((2, 3, 4), (0, 2), False), ((3, 4), None, False),
                              ((3, 4), 0, False), ((2, 0, 3), 2, True)]:
        if shape == (2, 0, 3) and name in ("max", "min", "var", "std", "var_mean", "std_mean"):
            continue
        cases.append(Case(f"{name}{list(shape)}axis={axis},keepdim={keep}",
                          lambda x, n=name, a=axis, k=keep: getattr(x, n)(a, keepdim=k, **kw),
                          lambda x, a=axis, k=keep: torch_fn(x, a, k), [F32(*shape)]))
    return cases


def _t_reduce(fn: Callable[..., Any]) -> Callable[..., Any]:
    def reduce(x: Any, axis: Any, keep: bool) -> Any:
        if axis is None:
            return fn(x)
        return fn(x, dim=axis, keepdim=keep)
    return reduce


def _t_amax(x: Any, axis: Any, keep: bool) -> Any:
    return torch.amax(x) if axis is None else torch.amax(x, dim=axis, keepdim=keep)


def _t_amin(x: Any, axis: Any, keep: bool) -> Any:
    return torch.amin(x) if axis is None else torch.amin(x, dim=axis, keepdim=keep)


def _t_var_mean(correction: int) -> Callable[..., Any]:
    def var_mean(x: Any, axis: Any, keep: bool) -> Any:
        return torch.var_mean(x, dim=axis, keepdim=keep, correction=correction)
    return var_mean


def _t_std_mean(x: Any, axis: Any, keep: bool) -> Any:
    return torch.std_mean(x, dim=axis, keepdim=keep)


def _scatter_reduce_case(reduce: str, include_self: bool) -> Case:
    index = np.array([[0, 1, 0, 2], [2, 2, 1, 0]], dtype=np.int32)
    return Case(f"scatter_reduce[{reduce},include_self={include_self}]",
                lambda x, s: x.scatter_reduce(1, Tensor(index), s, reduce, include_self=include_self),
                lambda x, s: x.scatter_reduce(1, torch.tensor(index, dtype=torch.int64), s, reduce,
                                              include_self=include_self),
                [F32(2, 3, low=0.5, high=2.0), F32(2, 4, low=0.5, high=2.0)])


_GATHER_INDEX = np.array([[0, 2], [1, 1], [2, 0]], dtype=np.int32)
_SCATTER_INDEX = np.array([[0, 1, 2], [2, 0, 1]], dtype=np.int32)  # no duplicates along dim 0 per column


def _torch_newton_schulz(x: Any, steps: int, params: tuple[float, ...]) -> Any:
    """The Newton-Schulz iteration written out in torch (float64), transposing tall matrices."""
    if x.shape[-2] > x.shape[-1]:
        return _torch_newton_schulz(x.mT, steps, params).mT
    g = x / (x.square().sum((-2, -1), keepdim=True).sqrt() + 1e-7)
    for _ in range(steps):
        gram = g @ g.mT
        term, total = g, params[0] * g
        for coefficient in params[1:]:
            term = gram @ term
            total = total + coefficient * term
        g = total
    return g


def _torch_index(array: np.ndarray) -> Any:
    return torch.tensor(array, dtype=torch.int64)


CASES: list[Case] = [
    # --- math: named arithmetic, with broadcasting and rank 0 ------------------------------------
    *_binary("add", torch.add), *_binary("sub", torch.sub), *_binary("mul", torch.mul),
    *_binary("div", torch.div, low=0.5, high=2.0),
    *_binary("pow", torch.pow, low=0.5, high=2.0),
    *_binary("logaddexp", torch.logaddexp),
    *_binary("copysign", torch.copysign),
    *_binary("mod", torch.remainder, low=0.5, high=3.0, grad=False),
    *_binary("fmod", torch.fmod, low=0.5, high=3.0, grad=False),
    Case("div_trunc", lambda x, y: x.div(y, rounding_mode="trunc"), lambda x, y: torch.div(x, y, rounding_mode="trunc"),
         [F32(3, 4, low=-5, high=5), F32(3, 4, low=0.5, high=2)], grad=False),
    Case("div_floor", lambda x, y: x.div(y, rounding_mode="floor"), lambda x, y: torch.div(x, y, rounding_mode="floor"),
         [F32(3, 4, low=-5, high=5), F32(3, 4, low=0.5, high=2)], grad=False),
    Case("div_trunc_int", lambda x, y: x.div(y, rounding_mode="trunc"),
         lambda x, y: torch.div(x, y, rounding_mode="trunc"), [I32(3, 4, low=-9, high=9), I32(3, 4, low=1, high=4)]),
    Case("sub_reverse", lambda x, y: x.sub(y, reverse=True), lambda x, y: y - x, [F32(3, 4), F32(4)]),
    Case("lerp", lambda a, b, w: a.lerp(b, w), torch.lerp, [F32(3, 4), F32(3, 4), F32(3, 4, low=0, high=1)]),
    Case("lerp_broadcast", lambda a, b, w: a.lerp(b, w), torch.lerp, [F32(3, 1), F32(4), F32(3, 4, low=0, high=1)]),
    Case("eq", lambda a, b: a.eq(b), torch.eq, [I32(3, 4), I32(3, 4)]),
    Case("ne", lambda a, b: a.ne(b), torch.ne, [I32(3, 4), I32(4)]),
    Case("lshift", lambda a, b: a.lshift(b), torch.bitwise_left_shift, [I32(3, 4, high=100), I32(3, 4, high=4)]),
    Case("rshift", lambda a, b: a.rshift(b), torch.bitwise_right_shift, [I32(3, 4, high=100), I32(3, 4, high=4)]),
    Case("bitwise_and", lambda a, b: a.bitwise_and(b), torch.bitwise_and, [I32(3, 4, high=16), I32(3, 4, high=16)]),
    Case("bitwise_or", lambda a, b: a.bitwise_or(b), torch.bitwise_or, [I32(3, 4, high=16), I32(3, 4, high=16)]),
    Case("bitwise_xor", lambda a, b: a.bitwise_xor(b), torch.bitwise_xor, [I32(3, 4, high=16), I32(1, 4, high=16)]),
    Case("bitwise_not", lambda a: a.bitwise_not(), torch.bitwise_not, [I32(3, 4, low=-8, high=8)]),
    Case("isclose", lambda a, b: a.isclose(b, atol=0.5),
         lambda a, b: torch.isclose(a, b, atol=0.5), [F32(3, 4), F32(4)]),
    Case("isinf_positive", lambda a: (a / 0.0).isinf(detect_negative=False), lambda a: torch.isposinf(a / 0.0),
         [F32(3, 4)]),
    Case("einsum", lambda a, b: Tensor.einsum("ij,jk->ik", a, b), lambda a, b: torch.einsum("ij,jk->ik", a, b),
         [F32(3, 4), F32(4, 2)]),
    Case("einsum_list", lambda a, b: Tensor.einsum("bij,bj->bi", [a, b]), lambda a, b: torch.einsum("bij,bj->bi", a, b),
         [F32(2, 3, 4), F32(2, 4)]),
    Case("newton_schulz", lambda x: x.newton_schulz(3, (3.4445, -4.7750, 2.0315)),
         lambda x: _torch_newton_schulz(x, 3, (3.4445, -4.7750, 2.0315)), [F32(3, 5)], rtol=1e-3, atol=1e-4),
    Case("newton_schulz_tall_batched", lambda x: x.newton_schulz(2, (1.5, -0.5)),
         lambda x: _torch_newton_schulz(x, 2, (1.5, -0.5)), [F32(2, 4, 3)], rtol=1e-3, atol=1e-4),
    # --- math: elementwise functions ---------------------------------------------------------
    *_unary("log10", torch.log10, 0.1, 3.0), *_unary("trunc", torch.trunc, -5.0, 5.0),
    *_unary("asin", torch.asin, -0.9, 0.9), *_unary("acos", torch.acos, -0.9, 0.9), *_unary("atan", torch.atan),
    *_unary("sinh", torch.sinh), *_unary("cosh", torch.cosh), *_unary("asinh", torch.asinh),
    *_unary("acosh", torch.acosh, 1.1, 3.0), *_unary("atanh", torch.atanh, -0.9, 0.9),
    # --- math: reductions take keepdim= (tinygrad/PyTorch), var/std correction= ---------------------
    *_reduction("sum", _t_reduce(torch.sum)), *_reduction("mean", _t_reduce(torch.mean)),
    *_reduction("max", _t_amax), *_reduction("min", _t_amin),
    *_reduction("logsumexp", lambda x, a, k: torch.logsumexp(x, dim=a if a is not None else tuple(range(x.ndim)),
                                                             keepdim=k)),
    *_reduction("var", _t_reduce(torch.var)), *_reduction("std", _t_reduce(torch.std)),
    *_reduction("var_mean", _t_var_mean(1)), *_reduction("std_mean", _t_std_mean),
    Case("var_correction0", lambda x: x.var(1, correction=0), lambda x: torch.var(x, 1, correction=0), [F32(3, 4)]),
    Case("prod_keepdim", lambda x: x.prod(1, keepdim=True), lambda x: torch.prod(x, 1, keepdim=True), [F32(3, 4)]),
    Case("sum_dim", lambda x: x.sum(dim=0), lambda x: x.sum(dim=0), [F32(3, 4)]),
    Case("argmax_keepdim", lambda x: x.argmax(1, keepdim=True), lambda x: x.argmax(1, keepdim=True), [F32(3, 4)]),
    # --- math: scans and sorting ---------------------------------------------------------------
    Case("cumsum", lambda x: x.cumsum(1), lambda x: torch.cumsum(x, 1), [F32(3, 4)]),
    Case("cumsum_default", lambda x: x.cumsum(), lambda x: torch.cumsum(x, 0), [F32(3, 4)]),
    Case("cumprod", lambda x: x.cumprod(1), lambda x: torch.cumprod(x, 1), [F32(3, 4, low=0.5, high=1.5)]),
    Case("cumprod_neg_axis", lambda x: x.cumprod(-1), lambda x: torch.cumprod(x, -1), [F32(2, 3, 4)]),
    Case("cummax", lambda x: x.cummax(1), lambda x: tuple(torch.cummax(x, 1)), [F32(3, 5)]),
    Case("cummin", lambda x: x.cummin(0), lambda x: tuple(torch.cummin(x, 0)), [F32(5, 3)]),
    Case("logcumsumexp", lambda x: x.logcumsumexp(1),
         lambda x: torch.logcumsumexp(x, 1), [F32(3, 5, low=-20, high=20)]),
    Case("logcumsumexp_zero_size", lambda x: x.logcumsumexp(0), lambda x: torch.logcumsumexp(x, 0), [F32(0, 3)]),
    Case("sort", lambda x: x.sort(), lambda x: tuple(torch.sort(x, stable=True)), [F32(3, 5)]),
    Case("sort_descending_dim0", lambda x: x.sort(0, descending=True),
         lambda x: tuple(torch.sort(x, dim=0, descending=True, stable=True)), [F32(4, 3)]),
    Case("argsort", lambda x: x.argsort(1, descending=True),
         lambda x: torch.argsort(x, dim=1, descending=True, stable=True),
         [F32(3, 5)]),
    Case("topk", lambda x: x.topk(2), lambda x: tuple(torch.topk(x, 2)), [F32(3, 5)]),
    Case("topk_smallest_dim0", lambda x: x.topk(3, dim=0, largest=False),
         lambda x: tuple(torch.topk(x, 3, dim=0, largest=False)), [F32(4, 2)]),
    # --- movement ------------------------------------------------------------------------------
    Case("pad_flat", lambda x: x.pad((1, 2)), lambda x: tF.pad(x, (1, 2)), [F32(3, 4)]),
    Case("pad_flat_2d_value", lambda x: x.pad((1, 0, 2, 1), value=3.0), lambda x: tF.pad(x, (1, 0, 2, 1), value=3.0),
         [F32(2, 3, 4)]),
    Case("pad_negative", lambda x: x.pad((-1, 2, 1, -2)), lambda x: tF.pad(x, (-1, 2, 1, -2)), [F32(4, 5)]),
    Case("pad_grouped", lambda x: x.pad(((1, 2), None)), lambda x: tF.pad(x, (0, 0, 1, 2)), [F32(3, 4)]),
    Case("pad_reflect", lambda x: x.pad((2, 1, 1, 2), mode="reflect"),
         lambda x: tF.pad(x, (2, 1, 1, 2), mode="reflect"),
         [F32(1, 2, 4, 5)]),
    Case("pad_replicate", lambda x: x.pad((2, 1, 3, 0), mode="replicate"),
         lambda x: tF.pad(x, (2, 1, 3, 0), mode="replicate"), [F32(1, 2, 4, 5)]),
    Case("pad_circular", lambda x: x.pad((2, 1, 1, 2), mode="circular"),
         lambda x: tF.pad(x, (2, 1, 1, 2), mode="circular"), [F32(1, 2, 4, 5)]),
    Case("pad_to", lambda x: x.pad_to(4, None, 6), lambda x: tF.pad(x, (0, 2, 0, 0, 0, 1)), [F32(3, 2, 4)]),
    Case("shrink", lambda x: x.shrink(((1, 3), None)), lambda x: x[1:3], [F32(4, 5)]),
    Case("shrink_to", lambda x: x.shrink_to(2, 3), lambda x: x[:2, :3], [F32(4, 5)]),
    Case("flip", lambda x: x.flip(0, 2), lambda x: torch.flip(x, (0, 2)), [F32(2, 3, 4)]),
    Case("flip_tuple", lambda x: x.flip((-1,)), lambda x: torch.flip(x, (-1,)), [F32(3, 4)]),
    Case("roll", lambda x: x.roll(2, 1), lambda x: torch.roll(x, 2, 1), [F32(3, 5)]),
    Case("roll_multi", lambda x: x.roll((1, -2), (0, 1)), lambda x: torch.roll(x, (1, -2), (0, 1)), [F32(3, 5)]),
    Case("roll_flat", lambda x: x.roll(3), lambda x: torch.roll(x, 3), [F32(3, 5)]),
    Case("repeat", lambda x: x.repeat(2, 1, 3), lambda x: x.repeat(2, 1, 3), [F32(3, 2)]),
    Case("repeat_tuple", lambda x: x.repeat((2, 2)), lambda x: x.repeat(2, 2), [F32(3, 2)]),
    Case("repeat_interleave", lambda x: x.repeat_interleave(2, 1), lambda x: x.repeat_interleave(2, 1), [F32(3, 2)]),
    Case("repeat_interleave_flat", lambda x: x.repeat_interleave(3), lambda x: x.repeat_interleave(3), [F32(3, 2)]),
    Case("cat", lambda a, b: a.cat(b, dim=1), lambda a, b: torch.cat([a, b], 1), [F32(3, 2), F32(3, 4)]),
    Case("cat_zero_size", lambda a, b, c: a.cat(b, c), lambda a, b, c: torch.cat([a, b, c]),
         [F32(2, 3), F32(0, 3), F32(1, 3)]),
    Case("cat_static", lambda a, b: Tensor.cat(a, b, dim=-1),
         lambda a, b: torch.cat([a, b], -1), [F32(2, 3), F32(2, 1)]),
    Case("stack", lambda a, b: a.stack(b, dim=1), lambda a, b: torch.stack([a, b], 1), [F32(3, 2), F32(3, 2)]),
    Case("stack_rank0", lambda a, b: Tensor.stack(a, b), lambda a, b: torch.stack([a, b]), [F32(), F32()]),
    Case("split_int", lambda x: x.split(2, dim=1), lambda x: torch.split(x, 2, dim=1), [F32(3, 5)]),
    Case("split_sizes", lambda x: x.split([1, 3]), lambda x: torch.split(x, [1, 3]), [F32(4, 2)]),
    Case("chunk", lambda x: x.chunk(3, 1), lambda x: torch.chunk(x, 3, 1), [F32(2, 7)]),
    Case("unflatten", lambda x: x.unflatten(1, (2, 3)), lambda x: x.unflatten(1, (2, 3)), [F32(4, 6)]),
    Case("unfold", lambda x: x.unfold(1, 3, 2), lambda x: x.unfold(1, 3, 2), [F32(2, 7, 3)]),
    Case("unfold_last", lambda x: x.unfold(-1, 2, 1), lambda x: x.unfold(-1, 2, 1), [F32(3, 4)]),
    Case("rearrange_merge", lambda x: x.rearrange("b c (h w) -> b (c h) w", h=2),
         lambda x: x.reshape(2, 3, 2, 2).reshape(2, 6, 2), [F32(2, 3, 4)]),
    Case("rearrange_permute", lambda x: x.rearrange("b h w c -> b c h w"), lambda x: x.permute(0, 3, 1, 2),
         [F32(2, 3, 4, 5)]),
    Case("rearrange_ellipsis", lambda x: x.rearrange("... (a b) -> ... b a", a=2),
         lambda x: x.reshape(2, 3, 2, 2).transpose(-1, -2), [F32(2, 3, 4)]),
    Case("transpose", lambda x: x.transpose(), lambda x: x.transpose(1, 0), [F32(3, 4)]),
    Case("transpose_dims", lambda x: x.transpose(0, 2), lambda x: x.transpose(0, 2), [F32(2, 3, 4)]),
    Case("squeeze_dim", lambda x: x.squeeze(1), lambda x: x.squeeze(1), [F32(3, 1, 4)]),
    Case("squeeze_not_one", lambda x: x.squeeze(0), lambda x: x.squeeze(0), [F32(3, 1, 4)]),
    Case("diag", lambda x: x.diag(), torch.diag, [F32(4)]),
    Case("diag_of_matrix", lambda x: x.diag(), torch.diag, [F32(3, 3)]),
    Case("diagonal", lambda x: x.diagonal(1, 1, 2), lambda x: torch.diagonal(x, 1, 1, 2), [F32(2, 3, 4)]),
    Case("tril", lambda x: x.tril(), torch.tril, [F32(3, 4)]),
    Case("triu_offset", lambda x: x.triu(1), lambda x: torch.triu(x, 1), [F32(2, 3, 4)]),
    Case("tril_negative", lambda x: x.tril(-1), lambda x: torch.tril(x, -1), [F32(4, 3)]),
    Case("gather", lambda x: x.gather(1, Tensor(_GATHER_INDEX)), lambda x: x.gather(1, _torch_index(_GATHER_INDEX)),
         [F32(3, 4)]),
    Case("gather_smaller_index", lambda x: x.gather(0, Tensor(_GATHER_INDEX[:2, :1])),
         lambda x: x.gather(0, _torch_index(_GATHER_INDEX[:2, :1])), [F32(3, 4)]),
    Case("scatter", lambda x, s: x.scatter(0, Tensor(_SCATTER_INDEX), s),
         lambda x, s: x.scatter(0, _torch_index(_SCATTER_INDEX), s), [F32(3, 3), F32(2, 3)]),
    Case("scatter_scalar", lambda x: x.scatter(1, Tensor(_SCATTER_INDEX), 5.0),
         lambda x: x.scatter(1, _torch_index(_SCATTER_INDEX), 5.0), [F32(2, 3)]),
    Case("scatter_add", lambda x, s: x.scatter(1, Tensor(_SCATTER_INDEX), s, reduce="add"),
         lambda x, s: x.scatter_add(1, _torch_index(_SCATTER_INDEX), s), [F32(2, 3), F32(2, 3)]),
    *[_scatter_reduce_case(r, inc) for r in ("sum", "prod", "mean", "amax", "amin") for inc in (True, False)],
    Case("masked_fill", lambda x, m: x.masked_fill(m, -1.5), lambda x, m: x.masked_fill(m, -1.5), [F32(3, 4), B(3, 4)]),
    Case("masked_fill_broadcast", lambda x, m: x.masked_fill(m, 2.0), lambda x, m: x.masked_fill(m, 2.0),
         [F32(3, 4), B(4)]),
    Case("masked_select", lambda x, m: x.masked_select(m), lambda x, m: x.masked_select(m), [F32(3, 4), B(3, 4)]),
    Case("nonzero", lambda x: x.nonzero(), lambda x: torch.nonzero(x), [I32(3, 4, low=0, high=2)]),
    # --- nn: activations -----------------------------------------------------------------------
    *_unary("relu6", tF.relu6, -8, 8), *_unary("elu", tF.elu), *_unary("celu", tF.celu),
    *_unary("hardtanh", tF.hardtanh), *_unary("hardswish", tF.hardswish, -5, 5),
    *_unary("hardsigmoid", tF.hardsigmoid, -5, 5), *_unary("leaky_relu", tF.leaky_relu),
    *_unary("logsigmoid", tF.logsigmoid, -30, 30), *_unary("mish", tF.mish), *_unary("softplus", tF.softplus),
    *_unary("softsign", tF.softsign), *_unary("swish", tF.silu),
    *_unary("quick_gelu", lambda x: x * torch.sigmoid(1.702 * x)),
    Case("selu", lambda x: x.selu(1.6732632423543772, 1.0507009873554805), tF.selu, [F32(3, 4)]),
    Case("selu_tinygrad_constants", lambda x: x.selu(), tF.selu, [F32(3, 4)], rtol=1e-4),
    Case("celu_alpha", lambda x: x.celu(0.5), lambda x: tF.celu(x, 0.5), [F32(3, 4)]),
    Case("elu_alpha", lambda x: x.elu(2.0), lambda x: tF.elu(x, 2.0), [F32(3, 4)]),
    Case("leaky_relu_slope", lambda x: x.leaky_relu(0.2), lambda x: tF.leaky_relu(x, 0.2), [F32(3, 4)]),
    Case("softplus_beta", lambda x: x.softplus(2.0), lambda x: tF.softplus(x, 2.0), [F32(3, 4, low=-20, high=20)]),
    Case("hardtanh_bounds", lambda x: x.hardtanh(-0.5, 1.5), lambda x: tF.hardtanh(x, -0.5, 1.5), [F32(3, 4)]),
    Case("gelu_tanh", lambda x: x.gelu(), lambda x: tF.gelu(x, approximate="tanh"), [F32(3, 4)]),
    Case("gelu_none", lambda x: x.gelu(approximate="none"), tF.gelu, [F32(3, 4)]),
    Case("softmin", lambda x: x.softmin(1), lambda x: tF.softmin(x, 1), [F32(3, 4)]),
    Case("softmax_dtype", lambda x: x.softmax(0, dtype="float32"), lambda x: tF.softmax(x, 0), [F32(3, 4)]),
    Case("normalize", lambda x: x.normalize(), tF.normalize, [F32(3, 4)]),
    Case("normalize_p1", lambda x: x.normalize(1.0, 0), lambda x: tF.normalize(x, 1.0, 0), [F32(3, 4)]),
    Case("one_hot", lambda x: x.one_hot(5), lambda x: tF.one_hot(x, 5), [I32(3, 4)]),
    # --- nn: losses ----------------------------------------------------------------------------
    Case("bce_logits_pos_weight", lambda x, y, w: x.binary_crossentropy_logits(y, pos_weight=w),
         lambda x, y, w: tF.binary_cross_entropy_with_logits(x, y, pos_weight=w),
         [F32(3, 4), F32(3, 4, low=0, high=1), F32(4, low=0.5, high=2)], frozen=(2,)),
    Case("bce_logits_sum", lambda x, y: x.binary_crossentropy_logits(y, reduction="sum"),
         lambda x, y: tF.binary_cross_entropy_with_logits(x, y, reduction="sum"), [F32(5), F32(5, low=0, high=1)]),
    Case("cross_entropy", lambda x, y: x.cross_entropy(y), tF.cross_entropy, [F32(4, 5), I32(4)]),
    Case("cross_entropy_smoothing_none", lambda x, y: x.cross_entropy(y, reduction="none", label_smoothing=0.2),
         lambda x, y: tF.cross_entropy(x, y, reduction="none", label_smoothing=0.2), [F32(4, 5, 2), I32(4, 2)]),
    Case("cross_entropy_ignore_index", lambda x, y: x.cross_entropy(y, ignore_index=1),
         lambda x, y: tF.cross_entropy(x, y, ignore_index=1), [F32(6, 3), I32(6, high=3)]),
    Case("cross_entropy_probabilities", lambda x, y: x.cross_entropy(y), tF.cross_entropy,
         [F32(4, 5), F32(4, 5, low=0, high=1)]),
    Case("nll_loss", lambda x, y: x.nll_loss(y), tF.nll_loss, [F32(4, 5), I32(4)]),
    Case("nll_loss_weight_ignore", lambda x, y, w: x.nll_loss(y, w, ignore_index=2),
         lambda x, y, w: tF.nll_loss(x, y, w, ignore_index=2),
         [F32(6, 4), I32(6, high=4), F32(4, low=0.5, high=2)], frozen=(2,)),
    Case("nll_loss_spatial_sum", lambda x, y: x.nll_loss(y, reduction="sum"),
         lambda x, y: tF.nll_loss(x, y, reduction="sum"), [F32(2, 3, 4), I32(2, 4, high=3)]),
    Case("sparse_categorical_crossentropy_none", lambda x, y: x.sparse_categorical_crossentropy(y, reduction="none"),
         lambda x, y: tF.cross_entropy(x, y, reduction="none"), [F32(4, 5), I32(4)]),
    # --- nn: convolutions, pools, resampling, attention ---------------------------------------------
    Case("conv2d_flat_padding", lambda x, w: x.conv2d(w, padding=(1, 0, 2, 1)),
         lambda x, w: tF.conv2d(tF.pad(x, (1, 0, 2, 1)), w), [F32(1, 2, 5, 5), F32(3, 2, 3, 3)]),
    Case("conv_transpose2d", lambda x, w, b: x.conv_transpose2d(w, b), tF.conv_transpose2d,
         [F32(2, 3, 4, 4), F32(3, 2, 3, 3), F32(2)]),
    Case("conv_transpose2d_stride_padding", lambda x, w: x.conv_transpose2d(w, stride=2, padding=1, output_padding=1),
         lambda x, w: tF.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1),
         [F32(1, 2, 3, 4), F32(2, 3, 3, 2)]),
    Case("conv_transpose2d_groups_dilation", lambda x, w: x.conv_transpose2d(w, groups=2, dilation=2, stride=(1, 2)),
         lambda x, w: tF.conv_transpose2d(x, w, groups=2, dilation=2, stride=(1, 2)),
         [F32(1, 4, 3, 3), F32(4, 1, 2, 3)]),
    Case("max_pool2d_ceil_mode", lambda x: x.max_pool2d(2, ceil_mode=True),
         lambda x: tF.max_pool2d(x, 2, ceil_mode=True),
         [F32(1, 2, 5, 5)]),
    Case("max_pool2d_ceil_stride_padding", lambda x: x.max_pool2d(3, 2, padding=1, ceil_mode=True),
         lambda x: tF.max_pool2d(x, 3, 2, padding=1, ceil_mode=True), [F32(2, 1, 6, 7)]),
    Case("max_pool2d_return_indices", lambda x: x.max_pool2d(2, return_indices=True),
         lambda x: tuple(tF.max_pool2d(x, 2, return_indices=True)), [F32(1, 2, 4, 6)]),
    Case("max_pool2d_indices_padded_dilated", lambda x: x.max_pool2d(3, 2, dilation=2, padding=1, return_indices=True),
         lambda x: tuple(tF.max_pool2d(x, 3, 2, padding=1, dilation=2, return_indices=True)), [F32(1, 1, 7, 8)]),
    Case("avg_pool2d_ceil_mode", lambda x: x.avg_pool2d(2, ceil_mode=True),
         lambda x: tF.avg_pool2d(x, 2, ceil_mode=True),
         [F32(1, 2, 5, 5)]),
    Case("avg_pool2d_ceil_padding", lambda x: x.avg_pool2d(3, 2, padding=1, ceil_mode=True),
         lambda x: tF.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True), [F32(1, 1, 6, 7)]),
    Case("avg_pool2d_no_pad_count", lambda x: x.avg_pool2d(3, 2, padding=1, ceil_mode=True, count_include_pad=False),
         lambda x: tF.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True, count_include_pad=False), [F32(1, 1, 6, 7)]),
    Case("max_unpool2d", lambda x: Tensor.max_unpool2d(*x.max_pool2d(2, return_indices=True), 2),
         lambda x: tF.max_unpool2d(*tF.max_pool2d(x, 2, return_indices=True), 2), [F32(1, 2, 4, 6)]),
    Case("interpolate_nearest", lambda x: x.interpolate((5, 3), mode="nearest"),
         lambda x: tF.interpolate(x, (5, 3), mode="nearest"), [F32(1, 2, 3, 4)]),
    Case("interpolate_nearest_exact", lambda x: x.interpolate((7,), mode="nearest-exact"),
         lambda x: tF.interpolate(x, (7,), mode="nearest-exact"), [F32(1, 2, 3)]),
    Case("interpolate_linear", lambda x: x.interpolate((7,)), lambda x: tF.interpolate(x, (7,), mode="linear"),
         [F32(2, 3, 4)]),
    Case("interpolate_linear_align", lambda x: x.interpolate((7,), align_corners=True),
         lambda x: tF.interpolate(x, (7,), mode="linear", align_corners=True), [F32(2, 3, 4)]),
    Case("interpolate_bilinear_down", lambda x: x.interpolate((3, 2), mode="bilinear"),
         lambda x: tF.interpolate(x, (3, 2), mode="bilinear"), [F32(1, 2, 5, 6)]),
    Case("interpolate_bilinear_align", lambda x: x.interpolate((6, 5), mode="bilinear", align_corners=True),
         lambda x: tF.interpolate(x, (6, 5), mode="bilinear", align_corners=True), [F32(1, 1, 3, 4)]),
    Case("interpolate_bicubic", lambda x: x.interpolate((6, 7), mode="bicubic"),
         lambda x: tF.interpolate(x, (6, 7), mode="bicubic"), [F32(1, 2, 4, 5)]),
    Case("interpolate_bicubic_align", lambda x: x.interpolate((3, 6), mode="bicubic", align_corners=True),
         lambda x: tF.interpolate(x, (3, 6), mode="bicubic", align_corners=True), [F32(1, 1, 4, 4)]),
    Case("sdpa", lambda q, k, v: q.scaled_dot_product_attention(k, v), tF.scaled_dot_product_attention,
         [F32(2, 3, 4), F32(2, 5, 4), F32(2, 5, 6)]),
    Case("sdpa_bool_mask", lambda q, k, v, m: q.scaled_dot_product_attention(k, v, m | (Tensor.arange(5) == 0)),
         lambda q, k, v, m: tF.scaled_dot_product_attention(q, k, v, m | (torch.arange(5) == 0)),
         [F32(2, 3, 4), F32(2, 5, 4), F32(2, 5, 6), B(3, 5)]),
    Case("sdpa_float_mask", lambda q, k, v, m: q.scaled_dot_product_attention(k, v, m),
         lambda q, k, v, m: tF.scaled_dot_product_attention(q, k, v, m), [F32(3, 4), F32(5, 4), F32(5, 2), F32(3, 5)]),
    Case("sdpa_causal", lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True),
         lambda q, k, v: tF.scaled_dot_product_attention(q, k, v, is_causal=True),
         [F32(1, 2, 4, 3), F32(1, 2, 4, 3), F32(1, 2, 4, 3)]),
    Case("sdpa_gqa", lambda q, k, v: q.scaled_dot_product_attention(k, v, enable_gqa=True),
         lambda q, k, v: tF.scaled_dot_product_attention(q, k, v, enable_gqa=True),
         [F32(1, 4, 3, 2), F32(1, 2, 5, 2), F32(1, 2, 5, 3)]),
    # --- zero-size and rank-0 inputs of the movement, scan and sort methods -----------------------
    Case("pad_zero_size", lambda x: x.pad((1, 2)), lambda x: tF.pad(x, (1, 2)), [F32(0, 3)]),
    Case("flip_zero_size", lambda x: x.flip(0), lambda x: torch.flip(x, (0,)), [F32(0, 3)]),
    Case("roll_zero_size", lambda x: x.roll(1, 1), lambda x: torch.roll(x, 1, 1), [F32(0, 3)]),
    Case("repeat_zero_size", lambda x: x.repeat(2, 3), lambda x: x.repeat(2, 3), [F32(0, 2)]),
    Case("repeat_rank0", lambda x: x.repeat(3), lambda x: x.repeat(3), [F32()]),
    Case("split_zero_size", lambda x: x.split(2), lambda x: torch.split(x, 2), [F32(0, 3)]),
    Case("unflatten_inferred", lambda x: x.unflatten(0, (2, -1)), lambda x: x.unflatten(0, (2, -1)), [F32(6, 2)]),
    Case("tril_zero_size", lambda x: x.tril(), torch.tril, [F32(0, 3)]),
    Case("cumsum_rank0", lambda x: x.cumsum(), lambda x: torch.cumsum(x, 0), [F32()]),
    Case("cumsum_zero_size", lambda x: x.cumsum(1), lambda x: torch.cumsum(x, 1), [F32(0, 4)]),
    Case("cumprod_zero_size", lambda x: x.cumprod(0), lambda x: torch.cumprod(x, 0), [F32(0, 4)]),
    Case("cummax_rank0", lambda x: x.cummax(0), lambda x: tuple(torch.cummax(x, 0)), [F32()]),
    Case("sort_rank0", lambda x: x.sort(), lambda x: tuple(torch.sort(x)), [F32()]),
    Case("sort_zero_size", lambda x: x.sort(), lambda x: tuple(torch.sort(x)), [F32(2, 0)]),
    Case("topk_zero", lambda x: x.topk(0), lambda x: tuple(torch.topk(x, 0)), [F32(3, 4)]),
    Case("gather_zero_size", lambda x: x.gather(1, Tensor(np.zeros((3, 0), np.int32))),
         lambda x: x.gather(1, torch.zeros((3, 0), dtype=torch.int64)), [F32(3, 4)]),
    Case("masked_fill_rank0_mask", lambda x: x.masked_fill(Tensor(True), 0.5), lambda x: x.masked_fill(
         torch.tensor(True), 0.5), [F32(2, 3)]),
    Case("squeeze_rank0", lambda x: x.squeeze(0), lambda x: x.squeeze(0), [F32()]),
    Case("transpose_rank1", lambda x: x.transpose(0, 0), lambda x: x.transpose(0, 0), [F32(3)]),
    Case("max_pool2d_unbatched", lambda x: x.max_pool2d(2, return_indices=True),
         lambda x: tuple(tF.max_pool2d(x, 2, return_indices=True)), [F32(2, 4, 4)]),
    Case("interpolate_nearest_3d", lambda x: x.interpolate((2, 5, 3), mode="nearest"),
         lambda x: tF.interpolate(x, (2, 5, 3), mode="nearest"), [F32(1, 1, 3, 2, 4)]),
    Case("interpolate_trilinear", lambda x: x.interpolate((2, 5, 3)),
         lambda x: tF.interpolate(x, (2, 5, 3), mode="trilinear"), [F32(1, 2, 3, 2, 4)]),
]


def _inputs(case: Case, rng: np.random.Generator) -> list[np.ndarray]:
    arrays = []
    for spec in case.inputs:
        if spec.kind == "f":
            arrays.append(rng.uniform(spec.low, spec.high, spec.shape).astype(np.float32))
        elif spec.kind == "i":
            arrays.append(rng.integers(int(spec.low), int(spec.high), spec.shape).astype(np.int32))
        else:
            arrays.append(rng.random(spec.shape) < 0.5)
    return arrays


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value]


def _torch_input(array: np.ndarray, needs_grad: bool) -> Any:
    if array.dtype == np.float32:
        return torch.tensor(array.astype(np.float64), requires_grad=needs_grad)
    if array.dtype == np.int32:
        return torch.tensor(array.astype(np.int64))
    return torch.tensor(array)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_forward_and_gradients_match_torch(case: Case) -> None:
    rng = np.random.default_rng(zlib.crc32(case.name.encode()))
    arrays = _inputs(case, rng)
    floats = [i for i, a in enumerate(arrays) if a.dtype == np.float32 and i not in case.frozen]
    ours = _as_list(case.ours(*(Tensor(a) for a in arrays)))
    torch_inputs = [_torch_input(a, case.grad and i in floats) for i, a in enumerate(arrays)]
    theirs = _as_list(case.theirs(*torch_inputs))
    assert len(ours) == len(theirs), f"{case.name}: {len(ours)} outputs, torch gives {len(theirs)}"
    for mine, reference in zip(ours, theirs):
        expected = reference.detach().numpy()
        assert mine.shape == expected.shape, f"{case.name}: shape {mine.shape}, torch {expected.shape}"
        if expected.dtype.kind in "iub":
            np.testing.assert_array_equal(mine.numpy(), expected, err_msg=case.name)
        else:
            np.testing.assert_allclose(mine.numpy(), expected, rtol=case.rtol, atol=case.atol, err_msg=case.name)
    if not case.grad or not floats or not ours[case.pick].size or not ours[case.pick].is_floating_point():
        return
    cotangent = rng.standard_normal(ours[case.pick].shape)

    def scalar(*values: Tensor) -> Tensor:
        args: list[Any] = [Tensor(a) for a in arrays]
        for i, value in zip(floats, values):
            args[i] = value
        out = _as_list(case.ours(*args))[case.pick]
        return (out * cotangent.astype(np.float32)).sum()

    grads = _as_list(fg.grad(scalar, argnums=tuple(range(len(floats))))(*(Tensor(arrays[i]) for i in floats)))
    (theirs[case.pick] * torch.tensor(cotangent)).sum().backward()
    for i, grad in zip(floats, grads):
        expected = torch_inputs[i].grad
        expected = np.zeros(arrays[i].shape) if expected is None else expected.numpy()
        np.testing.assert_allclose(grad.numpy(), expected, rtol=case.rtol * 5, atol=case.atol * 5,
                                   err_msg=f"{case.name}: gradient w.r.t. input {i}")


# --- autodiff and realizing ------------------------------------------------------------------------


def test_gradient_gives_total_derivatives_like_torch_autograd_grad() -> None:
    rng = np.random.default_rng(0)
    x_np, w_np = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((4, 2)).astype(np.float32)
    x, w = Tensor(x_np), Tensor(w_np)
    hidden = (x @ w).tanh()
    loss = (hidden * hidden).sum()
    g_x, g_w, g_hidden = loss.gradient(x, w, hidden)
    tx, tw = (torch.tensor(a.astype(np.float64), requires_grad=True) for a in (x_np, w_np))
    t_hidden = (tx @ tw).tanh()
    expected = torch.autograd.grad((t_hidden * t_hidden).sum(), (tx, tw, t_hidden))
    for mine, theirs in zip((g_x, g_w, g_hidden), expected):
        np.testing.assert_allclose(mine.numpy(), theirs.numpy(), rtol=1e-4, atol=1e-5)
    assert x.grad is None and w.grad is None  # no side effects, unlike backward()


def test_gradient_inside_jit_gives_the_eager_total_derivatives() -> None:
    def both(x: Tensor) -> Tensor:
        y = x * 3
        gx, gy = (y * y).sum().gradient(x, y)  # d/dx = 18 x (through y), d/dy = 2 y = 6 x
        return gx + gy

    x = Tensor([1.0, -2.0])
    np.testing.assert_allclose(fg.jit(both)(x).numpy(), both(x).numpy())
    np.testing.assert_allclose(both(x).numpy(), [24.0, -48.0])


def test_gradient_seed_for_non_scalar_and_inside_grad() -> None:
    x = Tensor([1.0, 2.0, 3.0])
    (g,) = (x * x).gradient(x, gradient=Tensor([1.0, 0.0, 2.0]))
    np.testing.assert_allclose(g.numpy(), [2.0, 0.0, 12.0])
    second = fg.grad(lambda a: (a ** 3).sum().gradient(a)[0].sum())(Tensor([1.0, 2.0]))  # d/da 3a^2 = 6a
    np.testing.assert_allclose(second.numpy(), [6.0, 12.0], rtol=1e-6)


def test_gradient_errors_say_what_is_wrong() -> None:
    x, unused = Tensor([1.0, 2.0]), Tensor([3.0])
    with pytest.raises(RuntimeError, match="target 1 .* was not used"):
        (x * 2).sum().gradient(x, unused)
    with pytest.raises(ValueError, match="scalar"):
        (x * 2).gradient(x)
    with pytest.raises(TypeError, match="floating-point"):
        (x * 2).sum().gradient(Tensor([1, 2]))


def test_realize_several_assign_clone_and_requires_grad_() -> None:
    a, b = Tensor([1.0, 2.0]) + 1, Tensor([3.0]) * 2
    assert a.realize(b) is a
    assert a.tolist() == [2.0, 3.0] and b.tolist() == [6.0]
    weight = Tensor([1.0, 2.0])
    other = weight
    assert weight.assign(weight - 0.5) is weight and weight.tolist() == [0.5, 1.5]
    assert other.tolist() == [0.5, 1.5]  # the same Tensor object
    with pytest.raises(ValueError):
        weight.assign(Tensor([1.0, 2.0, 3.0]))
    leaf = Tensor([2.0, 3.0]).requires_grad_()
    assert leaf.requires_grad is True
    (leaf.clone() * leaf).sum().backward()
    tleaf = torch.tensor([2.0, 3.0], requires_grad=True)
    (tleaf.clone() * tleaf).sum().backward()
    np.testing.assert_allclose(leaf.grad.numpy(), tleaf.grad.numpy())
    assert leaf.contiguous_backward().tolist() == [2.0, 3.0]
    assert bytes(Tensor(np.arange(3, dtype=np.int32)).data()) == np.arange(3, dtype=np.int32).tobytes()


def test_cummax_cummin_indices_of_ties_are_the_first_as_tinygrad() -> None:
    # tinygrad 0.14 gives the first tied position; PyTorch the last ([0, 1, 1, 3, 4] here)
    assert Tensor([1.0, 1.0, 0.0, 2.0, 2.0]).cummax(0)[1].tolist() == [0, 0, 0, 3, 3]
    assert Tensor([0.0, 0.0, 1.0, -1.0, -1.0]).cummin(0)[1].tolist() == [0, 0, 0, 3, 3]
    values, indices = Tensor([[3.0, 1.0, 3.0]]).cummax(1)
    assert values.tolist() == [[3.0, 3.0, 3.0]] and indices.tolist() == [[0, 0, 0]]


# --- creation -------------------------------------------------------------------------------------


def test_like_constructors_linspace_meshgrid() -> None:
    x = Tensor(np.zeros((2, 3), np.float32))
    assert x.empty_like().shape == (2, 3) and x.empty_like(dtype="int32").dtype == np.int32
    np.testing.assert_array_equal(x.full_like(7).numpy(), torch.full_like(torch.zeros(2, 3), 7).numpy())
    np.testing.assert_allclose(Tensor.linspace(-1, 2, 7).numpy(), torch.linspace(-1, 2, 7).numpy(), rtol=1e-6)
    assert Tensor.linspace(0, 1, 0).shape == (0,)
    a, b = Tensor([1, 2, 3]), Tensor([4, 5])
    for mine, theirs in zip(a.meshgrid(b), torch.meshgrid(torch.tensor([1, 2, 3]), torch.tensor([4, 5]),
                                                          indexing="ij")):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())
    for mine, theirs in zip(a.meshgrid(b, indexing="xy"), torch.meshgrid(torch.tensor([1, 2, 3]),
                                                                         torch.tensor([4, 5]), indexing="xy")):
        np.testing.assert_array_equal(mine.numpy(), theirs.numpy())


def test_random_constructors_have_the_right_distribution() -> None:
    Tensor.manual_seed(3)
    x = Tensor.zeros(200, 100)
    assert x.rand_like().shape == (200, 100) and 0.0 <= float(x.rand_like().min()) < float(x.rand_like().max()) < 1.0
    assert abs(float(x.randn_like().std()) - 1.0) < 0.03
    normal = Tensor.normal(200, 100, mean=2.0, std=0.5)
    assert abs(float(normal.mean()) - 2.0) < 0.02 and abs(float(normal.std()) - 0.5) < 0.02
    he = Tensor.kaiming_normal(256, 64, a=0.0)
    assert abs(float(he.std()) - np.sqrt(2.0 / 64)) < 0.01
    scaled = Tensor.scaled_uniform(64, 64)
    assert float(scaled.abs().max()) <= 1 / 64 and abs(float(scaled.std()) - (1 / 64) / np.sqrt(3)) < 0.001
    perm = Tensor.randperm(10)
    assert sorted(perm.tolist()) == list(range(10)) and perm.dtype == np.int32
    probs = Tensor([0.1, 0.0, 0.6, 0.3])
    draws = probs.multinomial(4000, replacement=True).numpy()
    assert 1 not in draws and abs(np.mean(draws == 2) - 0.6) < 0.03
    unique = Tensor([[0.2, 0.3, 0.5], [1.0, 1.0, 0.0]]).multinomial(2).numpy()
    assert unique.shape == (2, 2) and all(len(set(row)) == 2 for row in unique) and 2 not in unique[1]


def test_from_blob_copies_the_memory() -> None:
    source = np.arange(6, dtype=np.float32)
    blob = Tensor.from_blob(source.ctypes.data, (2, 3), dtype="float32")
    source[:] = 0
    assert blob.tolist() == [[0.0, 1.0, 2.0], [3.0, 4.0, 5.0]]


def test_sizes_and_casts() -> None:
    x = Tensor(np.ones((2, 3), np.float32))
    nbytes = x.nbytes() if callable(x.nbytes) else x.nbytes  # NumPy's property, if core/tensor.py defines one
    assert x.numel() == 6 and x.element_size() == 4 and nbytes == 24 and x.is_floating_point()
    assert not Tensor([1]).is_floating_point()
    for method, _dtype in [("int", torch.int32), ("long", torch.int64), ("short", torch.int16), ("bool", torch.bool),
                          ("double", torch.float64), ("bfloat16", torch.bfloat16)]:
        mine = getattr(Tensor([1.5, -2.0, 0.0]), method)()
        theirs = getattr(torch.tensor([1.5, -2.0, 0.0]), method)()
        assert str(mine.dtype) == str(theirs.dtype).replace("torch.", ""), method
        np.testing.assert_array_equal(mine.numpy().astype(np.float64), theirs.to(torch.float64).numpy())
    bits = Tensor([1.0, -2.0]).bitcast("int32")
    np.testing.assert_array_equal(bits.numpy(), torch.tensor([1.0, -2.0]).view(torch.int32).numpy())
    assert bool(Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.0 + 1e-7]))) is torch.allclose(
        torch.tensor([1.0, 2.0]), torch.tensor([1.0, 2.0 + 1e-7])) is True
    assert not Tensor([1.0, 2.0]).allclose(Tensor([1.0, 2.1]))


# --- errors: PyTorch's kind of exception or a clearer one, naming the method -------------------------


ERRORS = [
    ("split_sizes", lambda x: x.split([1, 3], dim=0), lambda x: torch.split(x, [1, 3], dim=0), "split"),
    ("cat_dim", lambda x: x.cat(x, dim=2), lambda x: torch.cat([x, x], 2), "cat"),
    ("gather_rank", lambda x: x.gather(0, Tensor([0])), lambda x: x.gather(0, torch.tensor([0])), "gather"),
    ("gather_float_index", lambda x: x.gather(0, Tensor([[0.0]])), lambda x: x.gather(0, torch.tensor([[0.0]])),
     "gather"),
    ("topk_k", lambda x: x.topk(5), lambda x: torch.topk(x, 5), "topk"),
    ("pad_mode", lambda x: x.pad((1, 1), mode="mirror"), lambda x: tF.pad(x, (1, 1), mode="mirror"), "pad"),
    ("pad_reflect_too_big", lambda x: x.pad((3, 3), mode="reflect"), lambda x: tF.pad(x, (3, 3), mode="reflect"),
     "pad"),
    ("masked_fill_float_mask", lambda x: x.masked_fill(x, 0.0), lambda x: x.masked_fill(x, 0.0), "masked_fill"),
    ("unfold_size", lambda x: x.unfold(0, 5, 1), lambda x: x.unfold(0, 5, 1), "unfold"),
    ("interpolate_mode", lambda x: x.interpolate((4,), mode="area2"), lambda x: tF.interpolate(x, (4,), mode="area2"),
     "interpolate"),
    ("div_rounding", lambda x: x.div(2, rounding_mode="round"), lambda x: torch.div(x, 2, rounding_mode="round"),
     "div"),
    ("scatter_reduce_kind", lambda x: x.scatter_reduce(0, Tensor([[0, 1]]), x, "median"),
     lambda x: x.scatter_reduce(0, torch.tensor([[0, 1]]), x, "median"), "scatter_reduce"),
    ("transpose_dim", lambda x: x.transpose(0, 3), lambda x: x.transpose(0, 3), "transpose"),
    ("one_hot_float", lambda x: x.one_hot(3), lambda x: tF.one_hot(x, 3), "one_hot"),
    ("nll_loss_target_range", lambda x: x.nll_loss(Tensor([0, 7])), lambda x: tF.nll_loss(x, torch.tensor([0, 7])),
     "nll_loss"),
]


@pytest.mark.parametrize("name, ours, theirs, method", ERRORS, ids=[e[0] for e in ERRORS])
def test_bad_arguments_raise_like_torch_or_clearer(name: str, ours: Callable[..., Any], theirs: Callable[..., Any],
                                                   method: str) -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
    with pytest.raises(Exception) as torch_error:  # noqa: PT011 - any error torch gives; ours must be an error too
        theirs(torch.tensor(array))
    with pytest.raises((ValueError, TypeError, IndexError, RuntimeError)) as our_error:
        ours(Tensor(array))
    assert method in str(our_error.value), f"{name}: the message should name {method}: {our_error.value}"
    assert torch_error.value is not None


def test_qr_and_svd_reconstruct_like_torch() -> None:
    import funcgrad.numpy as fnp
    if not hasattr(fnp.linalg, "qr") or not hasattr(fnp.linalg, "svd"):
        with pytest.raises(NotImplementedError, match="Tensor.qr needs funcgrad.numpy.linalg.qr"):
            Tensor(np.eye(2, dtype=np.float32)).qr()
        pytest.skip("funcgrad.numpy.linalg has no qr/svd in this build")
    a = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    q, r = Tensor(a).qr()
    tq, tr = torch.linalg.qr(torch.tensor(a, dtype=torch.float64), mode="complete")
    assert q.shape == tuple(tq.shape) and r.shape == tuple(tr.shape)
    np.testing.assert_allclose(q.numpy() @ r.numpy(), a, atol=1e-5)
    np.testing.assert_allclose(np.abs(r.numpy()), np.abs(tr.numpy()), atol=1e-5)  # unique up to signs
    u, s, vh = Tensor(a).svd()
    tu, ts, tvh = torch.linalg.svd(torch.tensor(a, dtype=torch.float64), full_matrices=True)
    assert (u.shape, s.shape, vh.shape) == (tuple(tu.shape), tuple(ts.shape), tuple(tvh.shape))
    np.testing.assert_allclose(s.numpy(), ts.numpy(), rtol=1e-5)
    np.testing.assert_allclose((u.numpy()[:, :3] * s.numpy()) @ vh.numpy(), a, atol=1e-5)
