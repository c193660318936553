"""grad, second order, jvp/vjp and vmap of every public ``funcgrad.numpy`` function.

Every public callable of ``funcgrad.numpy`` is either differentiable and listed in one of the
tables below, or listed in ``SKIPPED`` with the reason it has no derivative to check (a class,
integer or boolean output, no array input, ...); ``test_every_public_function_is_covered`` fails
when a new function is in neither.

For each listed function, on float64 inputs chosen away from kinks, ties and singularities
(checks in tests/transform_checks.py):

1. the gradient of ``sum(f(x) * c)`` (random ``c``) against central finite differences;
2. the jvp of that gradient (a Hessian-vector product) against finite differences of it;
3. ``<vjp(ct), t> == <ct, jvp(t)>``;
4. ``vmap`` against a Python loop over the batch, with the batch axis first and, where the
   examples have rank >= 1, at axis 1 (the elementwise tables leave some operands unbatched).

Hypothesis chooses shapes (with broadcasting) for the elementwise functions and shapes, axes and
keepdims for the reductions; the other functions use fixed shapes and static arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import funcgrad.numpy as fnp
from tests.transform_checks import check_gradient, check_hessian_vector_product, check_jvp_vjp, check_vmap

Generator = np.random.Generator
Shape = tuple[int, ...]
Sampler = Callable[[Generator, Shape], np.ndarray]


# --- input samplers: float64 values away from the points where a function is not smooth ---------

def uniform(low: float, high: float) -> Sampler:
    return lambda rng, shape: rng.uniform(low, high, shape)


def away_from_zero(rng: Generator, shape: Shape) -> np.ndarray:
    """|x| in [0.3, 2]: away from the kink of abs, the pole of 1/x, the cusp of cbrt."""
    return rng.choice([-1.0, 1.0], shape) * rng.uniform(0.3, 2.0, shape)


def off_steps(scale: float = 1.0) -> Sampler:
    """Values within 0.05 * scale of (k + 0.25) * scale or (k + 0.75) * scale: away from the jumps of
    floor, ceil, trunc, round (at integer and half-integer multiples of ``scale``) and of sign."""
    def sample(rng: Generator, shape: Shape) -> np.ndarray:
        k = rng.integers(-3, 3, shape)
        return scale * (k + rng.choice([0.25, 0.75], shape) + rng.uniform(-0.05, 0.05, shape))
    return sample


def distinct(rng: Generator, shape: Shape) -> np.ndarray:
    """Values at least 0.15 apart (a shuffled grid plus jitter): no ties for max, sort, median."""
    size = int(np.prod(shape))
    grid = rng.permutation(size) * 0.25 - size * 0.125
    return (grid + rng.uniform(-0.05, 0.05, size)).reshape(shape)


def on_grid(rng: Generator, shape: Shape) -> np.ndarray:
    """Values within 0.05 of a multiple of 0.5; with ``off_grid`` it keeps pairs at least 0.15 apart."""
    return rng.integers(-4, 4, shape) * 0.5 + rng.uniform(-0.05, 0.05, shape)


def off_grid(rng: Generator, shape: Shape) -> np.ndarray:
    return rng.integers(-4, 4, shape) * 0.5 + 0.25 + rng.uniform(-0.05, 0.05, shape)


def near_unit_divisor(rng: Generator, shape: Shape) -> np.ndarray:
    """|x2| within 2% of 1: with x1 from ``off_steps()`` (|x1| < 3.85) x1 / x2 stays 0.12 from an
    integer, away from the jumps of mod, fmod and floor_divide."""
    return rng.choice([-1.0, 1.0], shape) * rng.uniform(0.98, 1.02, shape)


def normal(rng: Generator, shape: Shape) -> np.ndarray:
    return rng.normal(size=shape)


def positive(rng: Generator, shape: Shape) -> np.ndarray:
    return rng.uniform(0.5, 2.0, shape)


# --- elementwise functions (hypothesis picks the shapes) ----------------------------------------

UNARY: dict[str, Sampler] = {
    **dict.fromkeys(["abs", "absolute", "fabs", "cbrt", "reciprocal", "angle"], away_from_zero),
    **dict.fromkeys(["acos", "arccos", "asin", "arcsin", "atanh", "arctanh"], uniform(-0.8, 0.8)),
    **dict.fromkeys(["acosh", "arccosh"], uniform(1.2, 3.0)),
    **dict.fromkeys(["log", "log10", "log2", "sqrt", "rsqrt"], uniform(0.5, 2.0)),
    "log1p": uniform(-0.5, 2.0), "tan": uniform(-1.2, 1.2),
    **dict.fromkeys(["ceil", "floor", "trunc", "fix", "round", "around", "sign"], off_steps()),
    **dict.fromkeys(["asinh", "arcsinh", "atan", "arctan", "conj", "conjugate", "real", "imag", "positive",
                     "negative", "square", "cos", "sin", "cosh", "sinh", "tanh", "deg2rad", "degrees",
                     "rad2deg", "radians", "erf", "exp", "exp2", "expm1", "sigmoid", "nan_to_num"],
                    uniform(-2.0, 2.0)),
}
# name -> samplers of (x1, x2)
BINARY: dict[str, tuple[Sampler, Sampler]] = {
    **dict.fromkeys(["add", "subtract", "multiply", "logaddexp", "logaddexp2"], (normal, normal)),
    **dict.fromkeys(["divide", "true_divide"], (normal, away_from_zero)),
    **dict.fromkeys(["pow", "power", "float_power"], (positive, uniform(-1.5, 1.5))),
    **dict.fromkeys(["arctan2", "atan2"], (normal, away_from_zero)),
    "hypot": (away_from_zero, away_from_zero),
    **dict.fromkeys(["maximum", "minimum", "fmax", "fmin"], (on_grid, off_grid)),
    "copysign": (away_from_zero, away_from_zero),
    "heaviside": (away_from_zero, normal),
    **dict.fromkeys(["mod", "remainder", "fmod", "floor_divide", "divmod"], (off_steps(), near_unit_divisor)),
}


def check_all(fn: Any, make_inputs: Callable[[Generator], list[np.ndarray]], seed: int,
              batch_axes: list[int | None] | None = None) -> None:
    """The four checks on ``fn`` at ``make_inputs(rng)``; vmap on three fresh examples, batched
    along axis 0 and then along ``batch_axes`` if given."""
    rng = np.random.default_rng(seed)
    xs = make_inputs(rng)
    check_gradient(fn, xs, seed)
    check_hessian_vector_product(fn, xs, seed)
    check_jvp_vjp(fn, xs, seed)
    examples = [make_inputs(rng) for _ in range(3)]
    check_vmap(fn, examples, [0] * len(xs))
    if batch_axes is not None:
        check_vmap(fn, examples, batch_axes)


def _axis_one_or_unbatched(shapes: list[Shape]) -> list[int | None]:
    """Batch along axis 1 where an operand has rank >= 1; leave rank-0 operands unbatched."""
    return [1 if len(shape) >= 1 else None for shape in shapes]


@pytest.mark.parametrize("name", sorted(UNARY))
@settings(max_examples=10, deadline=None)
@given(shape=hnp.array_shapes(min_dims=0, max_dims=3, min_side=1, max_side=3), seed=st.integers(0, 2**16))
def test_unary_elementwise_transforms(name: str, shape: Shape, seed: int) -> None:
    def make_inputs(rng: Generator) -> list[np.ndarray]:
        return [np.asarray(UNARY[name](rng, shape), np.float64)]
    check_all(getattr(fnp, name), make_inputs, seed, [1] if len(shape) >= 1 else None)


@pytest.mark.parametrize("name", sorted(BINARY))
@settings(max_examples=10, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
       seed=st.integers(0, 2**16))
def test_binary_elementwise_transforms(name: str, shapes: Any, seed: int) -> None:
    sample_x1, sample_x2 = BINARY[name]
    shape1, shape2 = shapes.input_shapes

    def make_inputs(rng: Generator) -> list[np.ndarray]:
        return [np.asarray(sample_x1(rng, shape1), np.float64), np.asarray(sample_x2(rng, shape2), np.float64)]
    axes = _axis_one_or_unbatched([shape1, shape2])
    check_all(getattr(fnp, name), make_inputs, seed, axes if any(a is not None for a in axes) else None)


# --- reductions (hypothesis picks shape, axis, keepdims) ----------------------------------------

@dataclass(frozen=True)
class Reduction:
    """``call(x, axis, keepdims)`` of function ``name``. ``axis_kind``: 'axes' (None, an int or a
    tuple) or 'int' (one axis); ``keepdims``: whether the function takes it."""
    name: str
    call: Callable[[Any, Any, bool], Any]
    sampler: Sampler = normal
    axis_kind: str = "axes"
    keepdims: bool = True


def _reduction(name: str, sampler: Sampler = normal, **params: Any) -> Reduction:
    return Reduction(name, lambda x, axis, keepdims: getattr(fnp, name)(x, axis=axis, keepdims=keepdims, **params),
                     sampler)


def _along_axis(name: str, sampler: Sampler, **params: Any) -> Reduction:
    """A function of one int axis and no keepdims (cumulative functions, sort)."""
    return Reduction(name, lambda x, axis, _: getattr(fnp, name)(x, axis=axis, **params), sampler, "int", False)


def _signed_near_one(rng: Generator, shape: Shape) -> np.ndarray:
    """|x| in [0.5, 1.5]: products of up to 27 of them stay moderate."""
    return rng.choice([-1.0, 1.0], shape) * rng.uniform(0.5, 1.5, shape)


REDUCTIONS: dict[str, Reduction] = {
    **{name: _reduction(name) for name in ["sum", "mean", "nansum", "nanmean", "logsumexp"]},
    **{name: _reduction(name, correction=1) for name in ["std", "var"]},
    "prod": _reduction("prod", _signed_near_one),
    **{name: _reduction(name, distinct) for name in
       ["max", "min", "amax", "amin", "nanmax", "nanmin", "ptp", "median"]},
    "quantile": Reduction("quantile", lambda x, axis, keepdims: fnp.quantile(x, 0.3, axis=axis, keepdims=keepdims),
                          distinct),
    "percentile": Reduction("percentile",
                            lambda x, axis, keepdims: fnp.percentile(x, 65.0, axis=axis, keepdims=keepdims), distinct),
    "average": _reduction("average"),
    "vector_norm": _reduction("vector_norm", away_from_zero),
    **{name: _along_axis(name, normal) for name in ["cumsum", "cumulative_sum"]},
    **{name: _along_axis(name, _signed_near_one) for name in ["cumprod", "cumulative_prod"]},
    **{name: _along_axis(name, distinct) for name in ["cummax", "cummin", "sort"]},
    "cummax[reverse]": _along_axis("cummax", distinct, reverse=True),
    "sort[descending]": _along_axis("sort", distinct, descending=True),
}


@st.composite
def reduction_arguments(draw: Any, axis_kind: str) -> tuple[Shape, Any, bool]:
    # std/var with one element per reduction are sqrt(0)/0-like: keep every axis at least 2 long
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=2, max_side=3))
    ndim = len(shape)
    if axis_kind == "int":
        axis: Any = draw(st.integers(-ndim, ndim - 1))
    else:
        axis = draw(st.one_of(st.none(), st.integers(-ndim, ndim - 1),
                              st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True)
                              .map(tuple)))
    return shape, axis, draw(st.booleans())


@pytest.mark.parametrize("label", sorted(REDUCTIONS))
@settings(max_examples=10, deadline=None)
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_reduction_transforms(label: str, data: Any, seed: int) -> None:
    reduction = REDUCTIONS[label]
    shape, axis, keepdims = data.draw(reduction_arguments(reduction.axis_kind))
    keepdims = keepdims and reduction.keepdims

    def fn(x: Any) -> Any:
        return reduction.call(x, axis, keepdims)

    def make_inputs(rng: Generator) -> list[np.ndarray]:
        return [np.asarray(reduction.sampler(rng, shape), np.float64)]
    # ``axis`` names an axis of one example: vmap must shift it past the batch axis, wherever that is
    check_all(fn, make_inputs, seed, [1])


# --- everything else: fixed shapes and static arguments -----------------------------------------

@dataclass(frozen=True)
class Case:
    """``fn(*inputs)`` with ``inputs[i] = samplers[i](rng, shapes[i])``."""
    name: str  # the funcgrad.numpy function this case covers
    fn: Callable[..., Any]
    shapes: tuple[Shape, ...]
    samplers: tuple[Sampler, ...] = ()
    label: str = ""
    # check name ('gradient', 'hvp', 'jvp_vjp', 'vmap') -> the bug that makes it fail (strict xfail)
    known_bugs: dict[str, str] = field(default_factory=dict)

    def make_inputs(self, rng: Generator) -> list[np.ndarray]:
        samplers = self.samplers or (normal,) * len(self.shapes)
        return [np.asarray(s(rng, shape), np.float64) for s, shape in zip(samplers, self.shapes)]

    @property
    def id(self) -> str:
        return f"{self.name}[{self.label}]" if self.label else self.name


def case(name: str, fn: Callable[..., Any], *shapes: Shape, samplers: tuple[Sampler, ...] = (),
         label: str = "", known_bugs: dict[str, str] | None = None) -> Case:
    return Case(name, fn, tuple(shapes), samplers, label, known_bugs or {})


_int = np.int32
INDEX_2 = np.array([[2, 0], [1, 1]], _int)  # static index arrays (with a repeated index)
CHOICE = np.array([[0, 2, 1], [1, 0, 2]], _int)
MASK = np.array([[True, False, True], [False, True, True]])
NONFINITE = np.array([[0.0, np.inf, 0.0], [-np.inf, np.nan, 0.0]])

CASES: list[Case] = [
    # conversion
    case("asarray", lambda x: fnp.asarray(x), (2, 3)),
    case("array", lambda x: fnp.array(x), (2, 3)),
    case("astype", lambda x: fnp.astype(x, "float64"), (2, 3)),
    case("broadcast_to", lambda x: fnp.broadcast_to(x, (2, 3, 4)), (3, 1)),
    case("broadcast_arrays", lambda a, b: fnp.broadcast_arrays(a, b), (3, 1), (1, 4)),
    # creation from arrays
    case("full", lambda v: fnp.full((2, 3), v), ()),
    case("full_like", lambda x: fnp.full_like(x, 2.5), (2, 3)),
    case("zeros_like", lambda x: fnp.zeros_like(x) + x, (2, 3)),
    case("ones_like", lambda x: fnp.ones_like(x) * x, (2, 3)),
    case("empty_like", lambda x: fnp.empty_like(x), (2, 3)),
    case("linspace", lambda a, b: fnp.linspace(a, b, 5), (), ()),
    case("linspace", lambda a, b: fnp.linspace(a, b, 5, dtype="float64"), (), (), label="float64"),
    case("linspace", lambda a, b: fnp.linspace(a, b, 4, dtype="float64", endpoint=False), (), (),
         label="no endpoint"),
    case("meshgrid", lambda a, b: fnp.meshgrid(a, b), (3,), (2,)),
    case("meshgrid", lambda a, b: fnp.meshgrid(a, b, indexing="ij"), (3,), (2,), label="ij"),
    case("diag", lambda v: fnp.diag(v, 1), (3,), label="from vector"),
    case("diag", lambda m: fnp.diag(m, -1), (3, 4), label="of matrix"),
    case("tril", lambda x: fnp.tril(x, k=-1), (2, 3, 4)),
    case("triu", lambda x: fnp.triu(x, k=1), (3, 4)),
    # elementwise with static or fixed operands
    case("clip", lambda x: fnp.clip(x, -1.0, 1.0), (2, 3), samplers=(off_grid,), label="scalar bounds"),
    case("clip", lambda x, lo, hi: fnp.clip(x, lo, hi), (2, 3), (3,), (2, 1),
         samplers=(off_grid, lambda rng, s: on_grid(rng, s) - 1.0, lambda rng, s: on_grid(rng, s) + 1.0),
         label="array bounds"),
    case("where", lambda a, b: fnp.where(MASK, a, b), (2, 3), (3,)),
    case("round", lambda x: fnp.round(x, 1), (2, 3), samplers=(off_steps(0.1),), label="decimals=1"),
    case("around", lambda x: fnp.around(x, 2), (2, 3), samplers=(off_steps(0.01),), label="decimals=2"),
    case("nan_to_num", lambda x: fnp.nan_to_num(x + NONFINITE, nan=1.5, posinf=2.0, neginf=-2.0), (2, 3),
         label="nonfinite"),
    case("pow", lambda x: fnp.pow(x, 3), (2, 3), label="integer exponent"),
    case("nextafter", lambda a, b: fnp.nextafter(a, b), (2, 3), (3,)),
    case("multiply", lambda x: 2.5 * x * fnp.multiply(x, 0.5), (2, 3), label="scalars"),
    # manipulation
    case("append", lambda a, b: fnp.append(a, b, axis=0), (2, 3), (1, 3)),
    case("append", lambda a, b: fnp.append(a, b), (2, 3), (2,), label="flattened"),
    case("array_split", lambda x: fnp.array_split(x, 3, axis=1), (2, 4)),
    case("atleast_1d", lambda x: fnp.atleast_1d(x), ()),
    case("atleast_2d", lambda x: fnp.atleast_2d(x), (3,)),
    case("atleast_3d", lambda x: fnp.atleast_3d(x), (2, 3)),
    case("atleast_3d", lambda x, y: fnp.atleast_3d(x, y), (), (3,), label="two arrays"),
    case("column_stack", lambda a, b: fnp.column_stack([a, b]), (3,), (3, 2)),
    case("concat", lambda a, b: fnp.concat([a, b], axis=1), (2, 3), (2, 1)),
    case("concat", lambda a, b: fnp.concat([a, b], axis=None), (2, 3), (4,), label="axis=None"),
    case("concatenate", lambda a, b, c: fnp.concatenate([a, b, c]), (1, 2), (2, 2), (1, 2)),
    case("dsplit", lambda x: fnp.dsplit(x, 2), (2, 2, 4)),
    case("dstack", lambda a, b: fnp.dstack([a, b]), (2, 3), (2, 3)),
    case("expand_dims", lambda x: fnp.expand_dims(x, axis=(0, 2)), (2, 3)),
    case("flatten", lambda x: fnp.flatten(x, start_dim=1), (2, 3, 2)),
    case("flip", lambda x: fnp.flip(x, axis=1), (2, 3)),
    case("flip", lambda x: fnp.flip(x), (2, 3), label="all axes"),
    case("fliplr", fnp.fliplr, (2, 3)),
    case("flipud", fnp.flipud, (2, 3)),
    case("hsplit", lambda x: fnp.hsplit(x, [1, 3]), (2, 4)),
    case("hstack", lambda a, b: fnp.hstack([a, b]), (2, 3), (2, 1)),
    case("matrix_transpose", fnp.matrix_transpose, (2, 3, 4)),
    case("moveaxis", lambda x: fnp.moveaxis(x, 0, -1), (2, 3, 4)),
    case("pad", lambda x: fnp.pad(x, ((1, 0), (0, 2)), constant_values=1.5), (2, 3), label="constant"),
    case("pad", lambda x: fnp.pad(x, 1, mode="empty"), (2, 3), label="empty"),
    case("pad", lambda x: fnp.pad(x, ((1, 2), (2, 1)), mode="edge"), (2, 3), label="edge"),
    case("pad", lambda x: fnp.pad(x, ((1, 1), (2, 0)), mode="reflect"), (2, 3), label="reflect"),
    case("pad", lambda x: fnp.pad(x, ((1, 1), (2, 0)), mode="symmetric"), (2, 3), label="symmetric"),
    case("pad", lambda x: fnp.pad(x, ((3, 1), (2, 4)), mode="wrap"), (2, 3), label="wrap"),
    case("permute_dims", lambda x: fnp.permute_dims(x, (2, 0, 1)), (2, 3, 4)),
    case("ravel", fnp.ravel, (2, 3)),
    case("repeat", lambda x: fnp.repeat(x, 2, axis=1), (2, 3)),
    case("repeat", lambda x: fnp.repeat(x, [1, 0, 3], axis=1), (2, 3), label="per element"),
    case("repeat", lambda x: fnp.repeat(x, 2), (2, 3), label="flattened"),
    case("reshape", lambda x: fnp.reshape(x, (4, -1)), (2, 3, 2)),
    case("roll", lambda x: fnp.roll(x, 1, axis=1), (2, 3)),
    case("roll", lambda x: fnp.roll(x, (1, -2), axis=(0, 1)), (2, 3), label="two axes"),
    case("roll", lambda x: fnp.roll(x, 4), (2, 3), label="flattened"),
    case("rot90", lambda x: fnp.rot90(x), (2, 3)),
    case("rot90", lambda x: fnp.rot90(x, k=3, axes=(1, 2)), (2, 3, 2), label="k=3"),
    case("split", lambda x: fnp.split(x, [1, 3], axis=1), (2, 4)),
    case("split", lambda x: fnp.split(x, 2), (4, 3), label="sections"),
    case("squeeze", lambda x: fnp.squeeze(x, axis=1), (2, 1, 3)),
    case("stack", lambda a, b: fnp.stack([a, b], axis=1), (2, 3), (2, 3)),
    case("swapaxes", lambda x: fnp.swapaxes(x, 0, 2), (2, 3, 4)),
    case("tile", lambda x: fnp.tile(x, (2, 1)), (2, 3)),
    case("tile", lambda x: fnp.tile(x, 2), (2, 3), label="int"),
    case("transpose", fnp.transpose, (2, 3, 4)),
    case("transpose", lambda x: fnp.transpose(x, (1, 0, 2)), (2, 3, 4), label="axes"),
    case("unstack", lambda x: fnp.unstack(x, axis=1), (2, 3)),
    case("vsplit", lambda x: fnp.vsplit(x, 2), (4, 3)),
    case("vstack", lambda a, b: fnp.vstack([a, b]), (3,), (2, 3)),
    # indexing
    case("choose", lambda a, b, c: fnp.choose(CHOICE, [a, b, c]), (2, 3), (2, 3), (3,)),
    case("compress", lambda x: fnp.compress(np.array([True, False, True]), x, axis=1), (2, 3)),
    case("put_along_axis", lambda a, v: fnp.put_along_axis(a, INDEX_2, v, axis=1, inplace=False), (2, 3), (2, 2)),
    case("select", lambda a, b, d: fnp.select([MASK, ~MASK[::-1]], [a, b], d), (2, 3), (3,), (2, 3)),
    case("take", lambda x: fnp.take(x, INDEX_2, axis=1), (2, 3)),
    case("take", lambda x: fnp.take(x, np.array([5, 0, 5], _int)), (2, 3), label="flattened"),
    case("take_along_axis", lambda x: fnp.take_along_axis(x, INDEX_2, 1), (2, 3)),
    # reductions with static arguments
    case("average", lambda a, w: fnp.average(a, axis=1, weights=w), (2, 3), (3,), samplers=(normal, positive),
         label="weights"),
    case("average", lambda a, w: fnp.average(a, axis=0, weights=w, returned=True), (2, 3), (2, 3),
         samplers=(normal, positive), label="returned"),
    case("cumulative_sum", lambda x: fnp.cumulative_sum(x, axis=1, include_initial=True), (2, 3),
         label="include_initial"),
    case("cumulative_prod", lambda x: fnp.cumulative_prod(x, axis=0, include_initial=True), (2, 3),
         samplers=(_signed_near_one,), label="include_initial"),
    case("cumsum", lambda x: fnp.cumsum(x), (2, 3), label="flattened"),
    case("cummin", lambda x: fnp.cummin(x, axis=1, reverse=True), (2, 3), samplers=(distinct,), label="reverse"),
    case("diff", lambda x: fnp.diff(x, n=2, axis=0), (4, 3)),
    case("diff", lambda x, p, a: fnp.diff(x, axis=1, prepend=p, append=a), (2, 3), (2, 1), (2, 2),
         label="prepend/append"),
    case("median", lambda x: fnp.median(x, axis=1), (3, 4), samplers=(distinct,), label="even count"),
    case("quantile", lambda x: fnp.quantile(x, np.array([0.1, 0.5, 0.9]), axis=0), (4, 3), samplers=(distinct,),
         label="several q"),
    case("percentile", lambda x: fnp.percentile(x, 30.0, axis=1, method="midpoint"), (2, 5),
         samplers=(distinct,), label="midpoint"),
    case("top_k", lambda x: fnp.top_k(x, 2), (2, 4), samplers=(distinct,)),
    case("sort", lambda x: fnp.sort(x, axis=None), (2, 3), samplers=(distinct,), label="flattened"),
    case("std", lambda x: fnp.std(x, axis=0, ddof=1), (3, 2), label="ddof"),
    case("logsumexp", lambda x: fnp.logsumexp(x * 40.0, axis=1), (2, 3), label="large values"),
    case("unique", lambda x: fnp.unique(x, size=4), (2, 3), samplers=(distinct,)),
    case("unique_values", lambda x: fnp.unique_values(x, size=8, fill_value=0.0), (2, 3), samplers=(distinct,)),
    case("unique_all", lambda x: fnp.unique_all(x, size=6), (2, 3), samplers=(distinct,)),
    case("unique_counts", lambda x: fnp.unique_counts(x, size=6), (2, 3), samplers=(distinct,)),
    case("unique_inverse", lambda x: fnp.unique_inverse(x, size=6), (2, 3), samplers=(distinct,)),
    # linear algebra
    case("dot", fnp.dot, (2, 3), (3, 4)),
    case("dot", fnp.dot, (3,), (3,), label="vectors"),
    case("diagonal", lambda x: fnp.diagonal(x, 1, 0, 2), (3, 2, 4)),
    case("einsum", lambda a, b: fnp.einsum("bij,jk->bki", a, b), (2, 3, 2), (2, 4)),
    case("einsum", lambda a: fnp.einsum("ii->i", a), (3, 3), label="diagonal"),
    case("einsum", lambda a, b, c: fnp.einsum("i,ij,j", a, b, c), (2,), (2, 3), (3,), label="three operands"),
    case("inner", fnp.inner, (2, 3), (4, 3)),
    case("kron", fnp.kron, (2, 2), (3, 2)),
    case("matmul", fnp.matmul, (2, 3, 4), (4, 2)),
    case("matmul", fnp.matmul, (3,), (2, 3, 4), label="vector @ batch"),
    case("matrix_norm", fnp.matrix_norm, (2, 3, 3), label="fro"),
    case("matrix_norm", lambda x: fnp.matrix_norm(x, ord=1), (3, 3), samplers=(distinct,), label="ord=1"),
    case("matrix_norm", lambda x: fnp.matrix_norm(x, ord=-np.inf, keepdims=True), (3, 3), samplers=(distinct,),
         label="ord=-inf"),
    case("norm", fnp.norm, (2, 3)),
    case("norm", lambda x: fnp.norm(x, ord=1, axis=1), (2, 3), samplers=(away_from_zero,), label="ord=1"),
    case("norm", lambda x: fnp.norm(x, ord=np.inf, axis=(0, 1)), (2, 3), samplers=(distinct,), label="ord=inf"),
    case("vector_norm", lambda x: fnp.vector_norm(x, ord=3, axis=0), (2, 3), samplers=(away_from_zero,),
         label="ord=3"),
    case("vector_norm", lambda x: fnp.vector_norm(x, ord=1), (2, 3), samplers=(away_from_zero,), label="ord=1"),
    case("vector_norm", lambda x: fnp.vector_norm(x, ord=np.inf), (2, 3), samplers=(distinct,),
         label="ord=inf"),
    case("outer", fnp.outer, (3,), (4,)),
    case("tensordot", lambda a, b: fnp.tensordot(a, b, axes=1), (2, 3), (3, 2)),
    case("tensordot", lambda a, b: fnp.tensordot(a, b, 2), (2, 3), (2, 3), label="tensordot[positional]"),
    case("convolve", fnp.convolve, (5,), (3,)),
    case("convolve", lambda a, v: fnp.convolve(a, v, mode="same"), (3,), (4,), label="convolve[same]"),
    case("correlate", fnp.correlate, (5,), (3,)),
    case("correlate", lambda a, v: fnp.correlate(a, v, mode="full"), (3,), (4,), label="correlate[full]"),
    case("tensordot", lambda a, b: fnp.tensordot(a, b, axes=([1, 0], [0, 2])), (2, 3, 2), (3, 4, 2),
         label="axis lists"),
    case("trace", lambda x: fnp.trace(x, offset=1), (3, 4)),
    case("vdot", fnp.vdot, (2, 3), (2, 3)),
    case("vecdot", fnp.vecdot, (2, 3), (3,)),
    case("vecdot", lambda a, b: fnp.vecdot(a, b, axis=0), (3, 2), (3, 2), label="axis=0"),
]
CASE_IDS = [c.id for c in CASES]
assert len(set(CASE_IDS)) == len(CASE_IDS), "every case needs a distinct label"


def cases_for(check: str) -> list[Any]:
    """The cases as pytest params, with a strict xfail where ``check`` hits a known bug."""
    return [pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.known_bugs[check])]
                         if check in c.known_bugs else []) for c in CASES]


def _seed(c: Case) -> int:
    return sum(map(ord, c.id))


@pytest.mark.parametrize("c", cases_for("gradient"))
def test_gradient_matches_finite_differences(c: Case) -> None:
    check_gradient(c.fn, c.make_inputs(np.random.default_rng(_seed(c))), _seed(c))


@pytest.mark.parametrize("c", cases_for("hvp"))
def test_hessian_vector_product_matches_finite_differences(c: Case) -> None:
    check_hessian_vector_product(c.fn, c.make_inputs(np.random.default_rng(_seed(c))), _seed(c))


@pytest.mark.parametrize("c", cases_for("jvp_vjp"))
def test_jvp_agrees_with_vjp(c: Case) -> None:
    check_jvp_vjp(c.fn, c.make_inputs(np.random.default_rng(_seed(c))), _seed(c))


@pytest.mark.parametrize("c", cases_for("vmap"))
def test_vmap_matches_loop(c: Case) -> None:
    rng = np.random.default_rng(_seed(c))
    examples = [c.make_inputs(rng) for _ in range(3)]
    check_vmap(c.fn, examples, [0] * len(c.shapes))
    if any(len(shape) >= 1 for shape in c.shapes):  # batch axis 1 where the operand has one
        check_vmap(c.fn, examples, [1 if len(shape) >= 1 else None for shape in c.shapes])


# --- coverage: every public callable is checked above or skipped here for a stated reason -------

SKIPPED: dict[str, str] = {
    # class: types, not functions
    **dict.fromkeys(["Array", "Tensor", "UniqueAllResult", "UniqueCountsResult", "UniqueInverseResult"], "class"),
    # metadata: take or return dtypes, shapes or axes, not arrays
    **dict.fromkeys(["finfo", "iinfo", "isdtype", "issubdtype", "result_type", "broadcast_shapes"], "metadata"),
    # interchange: wraps another library's memory (tests/front/test_interchange.py), nothing to transform
    "from_dlpack": "interchange",
    # creation: no array input to differentiate or batch (shapes and scalars are static)
    **dict.fromkeys(["arange", "empty", "eye", "identity", "ones", "zeros", "diag_indices", "tril_indices",
                     "triu_indices"], "creation"),
    # integer: integer outputs (indices, counts); derivatives are float0, vmap is tested with the primitives
    **dict.fromkeys(["argmax", "argmin", "argsort", "count_nonzero", "searchsorted", "diag_indices_from",
                     "tril_indices_from", "triu_indices_from", "ix_"], "integer"),
    # boolean: predicates and comparisons
    **dict.fromkeys(["all", "allclose", "any", "equal", "not_equal", "greater", "greater_equal", "less", "less_equal",
                     "isclose", "isfinite", "isinf", "isnan", "isneginf", "isposinf", "isin", "signbit",
                     "logical_and", "logical_or", "logical_xor", "logical_not"], "boolean"),
    # bitwise: defined on integer and boolean inputs only
    **dict.fromkeys(["bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_invert", "bitwise_not",
                     "bitwise_left_shift", "bitwise_right_shift", "left_shift", "right_shift", "invert"],
                    "bitwise"),
    # value-dependent: output shape depends on the values (integer outputs too)
    **dict.fromkeys(["nonzero", "argwhere", "flatnonzero"], "value-dependent"),
    "can_cast": "metadata",  # dtypes in, a bool out
}


def public_callables() -> set[str]:
    return {n for n in dir(fnp) if not n.startswith("_") and callable(getattr(fnp, n))}


def covered() -> set[str]:
    return set(UNARY) | set(BINARY) | {r.name for r in REDUCTIONS.values()} | {c.name for c in CASES}


def test_every_public_function_is_covered() -> None:
    missing = public_callables() - covered() - set(SKIPPED)
    assert not missing, f"public funcgrad.numpy functions with no transform check and no skip reason: {sorted(missing)}"


def test_tables_name_only_public_functions() -> None:
    unknown = (covered() | set(SKIPPED)) - public_callables()
    assert not unknown, f"tables name functions that funcgrad.numpy does not export: {sorted(unknown)}"
    assert not covered() & set(SKIPPED), sorted(covered() & set(SKIPPED))
