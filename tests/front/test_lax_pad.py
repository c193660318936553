"""``lax.pad`` with JAX's semantics: interior padding between neighbours, then low/high at the ends,
where a negative amount crops; forward, gradient (eager and under jit) and errors, against a NumPy
construction of the same definition and, where installed, ``jax.lax.pad`` itself."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import lax

CONFIGS = [
    [(1, 2, 0), (0, 0, 1), (-1, 2, 2)],
    [(-1, -1, 0), (2, -3, 3), (0, 0, 0)],
    [(0, 0, 0), (0, 0, 0), (0, 0, 0)],
    [(0, -2, 1), (1, 1, 0), (-4, 0, 1)],
    [(-3, 0, 0), (-2, -2, 0), (0, 0, 5)],  # an axis cropped to nothing
]


def _positions(shape: tuple[int, ...], config: list[tuple[int, int, int]]) -> tuple[tuple[int, ...], list[np.ndarray]]:
    """The padded shape and, per axis, where each input element lands (out of range: cropped)."""
    sizes = tuple(lo + hi + d + max(d - 1, 0) * interior for d, (lo, hi, interior) in zip(shape, config))
    return sizes, [lo + np.arange(d) * (interior + 1) for d, (lo, _, interior) in zip(shape, config)]


def numpy_pad(x: np.ndarray, value: float, config: list[tuple[int, int, int]]) -> np.ndarray:
    sizes, where = _positions(x.shape, config)
    out = np.full(sizes, value, x.dtype)
    keep = [(w >= 0) & (w < n) for w, n in zip(where, sizes)]
    out[np.ix_(*(w[k] for w, k in zip(where, keep)))] = x[np.ix_(*keep)]
    return out


def numpy_pad_grad(shape: tuple[int, ...], cotangent: np.ndarray, config: list[tuple[int, int, int]]) -> np.ndarray:
    sizes, where = _positions(shape, config)
    grad = np.zeros(shape, cotangent.dtype)
    keep = [(w >= 0) & (w < n) for w, n in zip(where, sizes)]
    grad[np.ix_(*keep)] = cotangent[np.ix_(*(w[k] for w, k in zip(where, keep)))]
    return grad


@pytest.mark.parametrize("config", CONFIGS)
def test_pad_matches_the_definition_forward_and_backward(config: list[tuple[int, int, int]]) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 4)).astype(np.float32)
    expected = numpy_pad(x, 0.5, config)
    got = lax.pad(fnp.asarray(x), np.float32(0.5), config).numpy()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got, expected)
    cotangent = rng.standard_normal(expected.shape).astype(np.float32)
    loss = lambda x: fnp.sum(lax.pad(x, np.float32(0.5), config) * fnp.asarray(cotangent))
    want = numpy_pad_grad(x.shape, cotangent, config)
    np.testing.assert_array_equal(fg.grad(loss)(fnp.asarray(x)).numpy(), want)
    np.testing.assert_array_equal(fg.jit(fg.grad(loss))(fnp.asarray(x)).numpy(), want)


@pytest.mark.parametrize("config", CONFIGS)
def test_pad_matches_jax(config: list[tuple[int, int, int]]) -> None:
    jax = pytest.importorskip("jax")
    x = np.random.default_rng(1).standard_normal((3, 5, 4)).astype(np.float32)
    want = np.asarray(jax.lax.pad(jax.numpy.asarray(x), np.float32(-2.0), config))
    np.testing.assert_array_equal(lax.pad(fnp.asarray(x), np.float32(-2.0), config).numpy(), want)


def test_pad_errors_name_the_config_and_shape() -> None:
    x = fnp.zeros((3, 5))
    with pytest.raises(ValueError, match=r"negative shape \(-3, 5\).*shape \(3, 5\)"):
        lax.pad(x, np.float32(0), [(-3, -3, 0), (0, 0, 0)])
    with pytest.raises(ValueError, match="interior padding must be non-negative"):
        lax.pad(x, np.float32(0), [(0, 0, -1), (0, 0, 0)])
    with pytest.raises(ValueError, match="1 entries for an operand of rank 2"):
        lax.pad(x, np.float32(0), [(0, 0, 0)])
