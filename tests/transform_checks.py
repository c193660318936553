"""Transform checks for functions of float64 arrays, used by tests/transforms/test_numpy_transforms.py.

Each check takes ``fn`` (a function of one or more float64 Tensors returning a Tensor or a pytree
of float Tensors) and ``xs`` (the NumPy float64 values of its arguments):

- ``check_gradient``: the gradient of a random linear functional ``sum(fn(x) * c)`` against
  central finite differences, coordinate by coordinate;
- ``check_hessian_vector_product``: the jvp of that gradient (forward over reverse) along a random
  direction against central differences of the gradient along that direction;
- ``check_jvp_vjp``: ``<vjp(ct), t> == <ct, jvp(t)>`` for random ``t`` and ``ct``;
- ``check_vmap``: ``vmap(fn, in_axes)`` on stacked examples against a Python loop over them.

The finite differences evaluate ``fn`` eagerly, so every check compares a transform against the
plain function and never against another transform.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

import funcgrad as fg
import funcgrad.numpy as fnp

Fn = Callable[..., Any]


def tensors(arrays: Sequence[np.ndarray]) -> list[fg.Tensor]:
    return [fnp.asarray(np.asarray(a, np.float64), dtype="float64") for a in arrays]


def float_leaves(value: Any) -> list[np.ndarray]:
    """The float leaves of a pytree of Tensors, as NumPy float64 arrays (integer leaves dropped)."""
    leaves = [leaf.numpy() if isinstance(leaf, fg.Tensor) else np.asarray(leaf) for leaf in fg.tree.leaves(value)]
    return [leaf.astype(np.float64) for leaf in leaves if leaf.dtype.kind == "f"]


def _inner(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return float(sum(np.sum(x * y) for x, y in zip(a, b)))


def _float_outputs(fn: Fn, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``fn(xs)``'s float outputs, which must exist and be float64 (no silent downcast)."""
    outs = [leaf.numpy() for leaf in fg.tree.leaves(fn(*tensors(xs)))]
    floats = [o for o in outs if o.dtype.kind == "f"]
    assert floats, "the function has no float output to differentiate"
    assert all(o.dtype == np.float64 for o in floats), [o.dtype for o in floats]
    return floats


def linear_functional(fn: Fn, weights: Sequence[np.ndarray]) -> Fn:
    """``x -> sum_i sum(fn(x)_i * weights_i)`` over the float outputs of ``fn``."""
    weight_tensors = tensors(weights)

    def scalar(*args: Any) -> Any:
        outs = [o for o in fg.tree.leaves(fn(*args)) if o.dtype.kind == "f"]
        return sum(fnp.sum(o * w) for o, w in zip(outs, weight_tensors))

    return scalar


def _scalar_value(fn: Fn, xs: Sequence[np.ndarray]) -> float:
    return float(np.asarray(fn(*tensors(xs)).numpy()))


def check_gradient(fn: Fn, xs: Sequence[np.ndarray], seed: int = 0, step: float = 1e-6,
                   rtol: float = 1e-6, atol: float = 1e-6) -> None:
    """grad of ``sum(fn(x) * c)`` against central differences in every coordinate of every input."""
    rng = np.random.default_rng(seed)
    weights = [rng.normal(size=o.shape) for o in _float_outputs(fn, xs)]
    scalar = linear_functional(fn, weights)
    gradients = fg.grad(scalar, argnums=tuple(range(len(xs))))(*tensors(xs))
    for i, (x, gradient) in enumerate(zip(xs, gradients)):
        got = gradient.numpy()
        assert got.shape == x.shape and got.dtype == np.float64, (i, got.shape, got.dtype)
        expected = np.zeros(x.shape)
        for index in np.ndindex(x.shape):
            plus, minus = [np.array(a, np.float64) for a in xs], [np.array(a, np.float64) for a in xs]
            plus[i][index] += step
            minus[i][index] -= step
            expected[index] = (_scalar_value(scalar, plus) - _scalar_value(scalar, minus)) / (2 * step)
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol, err_msg=f"gradient of argument {i}")


def check_hessian_vector_product(fn: Fn, xs: Sequence[np.ndarray], seed: int = 1, step: float = 1e-5,
                                 rtol: float = 1e-5, atol: float = 1e-5) -> None:
    """jvp(grad(sum(fn(x) * c)), x, t) against central differences of the gradient along ``t``."""
    rng = np.random.default_rng(seed)
    weights = [rng.normal(size=o.shape) for o in _float_outputs(fn, xs)]
    gradient = fg.grad(linear_functional(fn, weights), argnums=tuple(range(len(xs))))
    directions = [rng.normal(size=x.shape) for x in xs]
    _, hvp = fg.jvp(gradient, tuple(tensors(xs)), tuple(tensors(directions)))
    plus = float_leaves(gradient(*tensors([x + step * t for x, t in zip(xs, directions)])))
    minus = float_leaves(gradient(*tensors([x - step * t for x, t in zip(xs, directions)])))
    for i, (got, p, m) in enumerate(zip(float_leaves(hvp), plus, minus)):
        np.testing.assert_allclose(got, (p - m) / (2 * step), rtol=rtol, atol=atol,
                                   err_msg=f"Hessian-vector product, argument {i}")


def check_jvp_vjp(fn: Fn, xs: Sequence[np.ndarray], seed: int = 2, rtol: float = 1e-10) -> None:
    """``<vjp(ct), t> == <ct, jvp(t)>``; jvp's and vjp's primal outputs equal ``fn(x)``."""
    rng = np.random.default_rng(seed)
    primals = tensors(xs)
    directions = [rng.normal(size=x.shape) for x in xs]
    expected_out = float_leaves(fn(*primals))
    out, tangent = fg.jvp(fn, tuple(primals), tuple(tensors(directions)))
    value, pullback = fg.vjp(fn, *primals)
    for got_jvp, got_vjp, expected in zip(float_leaves(out), float_leaves(value), expected_out):
        np.testing.assert_allclose(got_jvp, expected, rtol=1e-14, atol=1e-14)
        np.testing.assert_allclose(got_vjp, expected, rtol=1e-14, atol=1e-14)
    # a cotangent for every output leaf; zero on integer leaves (their cotangent is ignored)
    leaves = fg.tree.leaves(value)
    cotangents = [fnp.asarray(rng.normal(size=v.shape), dtype="float64") if v.dtype.kind == "f"
                  else fnp.zeros_like(v) for v in leaves]
    cts_in = [ct.numpy() for ct in pullback(fg.tree.unflatten(fg.tree.structure(value), cotangents))]
    for ct, x in zip(cts_in, xs):
        assert ct.shape == x.shape, (ct.shape, x.shape)
    float_cts = [c.numpy() for c, v in zip(cotangents, leaves) if v.dtype.kind == "f"]
    lhs, rhs = _inner(cts_in, directions), _inner(float_cts, float_leaves(tangent))
    np.testing.assert_allclose(lhs, rhs, rtol=rtol, atol=rtol)


def check_vmap(fn: Fn, examples: Sequence[Sequence[np.ndarray]], in_axes: Sequence[int | None]) -> None:
    """``vmap(fn, in_axes)`` against ``stack([fn(*example) for example in examples])``.

    ``examples[b][i]`` is argument ``i`` of example ``b``; an argument whose axis is None is taken
    from the first example, passed unbatched, and used for every example of the loop."""
    examples = [[example[i] if axis is not None else examples[0][i] for i, axis in enumerate(in_axes)]
                for example in examples]
    batched_args = [examples[0][i] if axis is None else np.stack([example[i] for example in examples], axis=axis)
                    for i, axis in enumerate(in_axes)]
    got = fg.vmap(fn, in_axes=tuple(in_axes))(*tensors(batched_args))
    looped = [fn(*tensors(example)) for example in examples]
    got_leaves = [leaf.numpy() for leaf in fg.tree.leaves(got)]
    looped_leaves = [[leaf.numpy() for leaf in fg.tree.leaves(out)] for out in looped]
    assert fg.tree.structure(got) == fg.tree.structure(looped[0])
    for j, leaf in enumerate(got_leaves):
        expected = np.stack([leaves[j] for leaves in looped_leaves])
        assert leaf.dtype == expected.dtype and leaf.shape == expected.shape, \
            (j, leaf.dtype, leaf.shape, expected.dtype, expected.shape)
        np.testing.assert_allclose(leaf, expected, rtol=1e-12, atol=1e-12, err_msg=f"output leaf {j}")
