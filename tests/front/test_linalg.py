"""funcgrad.numpy.linalg (the standard's linalg extension) against NumPy in float64 and JAX.

Forward values against ``numpy.linalg``; jvp and grad against central finite differences (float64
inputs); vmap against a Python loop; jit against eager; JAX's values and gradients where JAX is
installed; hypothesis properties of the factorizations (L L^T = A, Q R = A with Q orthonormal,
U S Vh = A, A V = V diag(w), A pinv(A) A = A).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp

linalg = fnp.linalg


def _t64(x: np.ndarray) -> fg.Tensor:
    return fg.Tensor(x, dtype="float64")


def _general(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Well-conditioned square matrices (or any shape for the rectangular factorizations)."""
    x = rng.normal(size=shape)
    if shape[-1] == shape[-2]:
        x = x + 3 * np.eye(shape[-1])
    return x


def _spd(rng: np.random.Generator, *shape: int) -> np.ndarray:
    a = rng.normal(size=shape)
    return a @ np.swapaxes(a, -1, -2) + shape[-1] * np.eye(shape[-1])


def _finite_difference_grad(f: Callable[[np.ndarray], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    grad = np.zeros_like(x)
    for index in np.ndindex(*x.shape):
        step = np.zeros_like(x)
        step[index] = eps
        grad[index] = (f(x + step) - f(x - step)) / (2 * eps)
    return grad


# scalar losses of each function, weighted so that every output entry matters; sign-ambiguous
# outputs (eigenvectors, singular vectors, Q) enter through sign-invariant expressions
def _weights(shape: tuple[int, ...]) -> np.ndarray:
    # float32-representable, since funcgrad reads a NumPy float64 constant as float32 (as JAX without x64)
    return np.cos(np.arange(int(np.prod(shape))).reshape(shape)).astype(np.float32).astype(np.float64)


LOSSES: dict[str, tuple[Callable[[Any], Any], Callable[[np.random.Generator], np.ndarray]]] = {
    "cholesky": (lambda x: fnp.sum(linalg.cholesky(x) * _weights((3, 3))), lambda r: _spd(r, 3, 3)),
    "cholesky_upper": (lambda x: fnp.sum(linalg.cholesky(x, upper=True) * _weights((3, 3))), lambda r: _spd(r, 3, 3)),
    "inv": (lambda x: fnp.sum(linalg.inv(x) * _weights((3, 3))), lambda r: _general(r, 3, 3)),
    "solve_matrix": (lambda x: fnp.sum(linalg.solve(x, _weights((3, 2))) * _weights((3, 2))[::-1]),
                     lambda r: _general(r, 3, 3)),
    "solve_vector": (lambda x: fnp.sum(linalg.solve(x, np.arange(3.0)) ** 2), lambda r: _general(r, 3, 3)),
    "det": (lambda x: linalg.det(x), lambda r: _general(r, 3, 3)),
    "slogdet": (lambda x: linalg.slogdet(x).logabsdet, lambda r: _general(r, 3, 3)),
    "eigvalsh": (lambda x: fnp.sum(linalg.eigvalsh(x) * np.arange(1.0, 4.0)), lambda r: _spd(r, 3, 3)),
    "eigh_vectors": (lambda x: fnp.sum(linalg.eigh(x).eigenvectors ** 2 * _weights((3, 3))), lambda r: _spd(r, 3, 3)),
    "qr_tall": (lambda x: fnp.sum(linalg.qr(x).R ** 2 * _weights((3, 3))) + fnp.sum(fnp.abs(linalg.qr(x).Q)),
                lambda r: _general(r, 4, 3)),
    "qr_wide": (lambda x: fnp.sum(linalg.qr(x).R ** 2 * _weights((3, 4))), lambda r: _general(r, 3, 4)),
    "svdvals": (lambda x: fnp.sum(linalg.svdvals(x) * np.arange(1.0, 4.0)), lambda r: _general(r, 4, 3)),
    "svd_vectors": (lambda x: fnp.sum(linalg.svd(x, full_matrices=False).U ** 2 * _weights((3, 3)))
                    + fnp.sum(linalg.svd(x, full_matrices=False).Vh ** 2 * _weights((3, 4))),
                    lambda r: _general(r, 3, 4)),
    "pinv": (lambda x: fnp.sum(linalg.pinv(x) * _weights((3, 4))), lambda r: _general(r, 4, 3)),
    "matrix_power": (lambda x: fnp.sum(linalg.matrix_power(x, -3) * _weights((3, 3))), lambda r: _general(r, 3, 3)),
    "matrix_norm_2": (lambda x: linalg.matrix_norm(x, ord=2), lambda r: _general(r, 3, 4)),
    "matrix_norm_nuc": (lambda x: linalg.matrix_norm(x, ord="nuc"), lambda r: _general(r, 4, 3)),
    "cross": (lambda x: fnp.sum(linalg.cross(x, x[::-1] * 2.0) * _weights((3, 3))), lambda r: r.normal(size=(3, 3))),
}


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_grad_matches_finite_differences(name):
    loss, sample = LOSSES[name]
    x = sample(np.random.default_rng(sorted(LOSSES).index(name)))
    got = fg.grad(loss)(_t64(x)).numpy()
    expected = _finite_difference_grad(lambda y: float(loss(_t64(y)).numpy()), x)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("name", ["cholesky", "inv", "eigh_vectors", "qr_tall", "svd_vectors"])
def test_jvp_matches_finite_differences(name):
    loss, sample = LOSSES[name]
    rng = np.random.default_rng(7)
    x, direction = sample(rng), rng.normal(size=sample(rng).shape)
    _, tangent = fg.jvp(loss, (_t64(x),), (_t64(direction),))
    eps = 1e-6
    plus, minus = (float(loss(_t64(x + sign * eps * direction)).numpy()) for sign in (1, -1))
    expected = (plus - minus) / (2 * eps)
    np.testing.assert_allclose(float(tangent.numpy()), expected, rtol=1e-6, atol=1e-7)


def test_forward_matches_numpy_float64():
    rng = np.random.default_rng(0)
    a, spd, tall = _general(rng, 2, 3, 3), _spd(rng, 2, 3, 3), _general(rng, 2, 5, 3)
    b = rng.normal(size=(2, 3, 2))

    def close(got: Any, expected: Any) -> None:
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-10, atol=1e-10)

    close(linalg.cholesky(_t64(spd)), np.linalg.cholesky(spd))
    close(linalg.solve(_t64(a), _t64(b)), np.linalg.solve(a, b))
    close(linalg.solve(_t64(a), _t64(b[0, :, 0])), np.linalg.solve(a, b[0, :, 0]))  # broadcast vector
    close(linalg.inv(_t64(a)), np.linalg.inv(a))
    close(linalg.det(_t64(a)), np.linalg.det(a))
    sign, logabsdet = linalg.slogdet(_t64(a))
    close(sign, np.linalg.slogdet(a)[0])
    close(logabsdet, np.linalg.slogdet(a)[1])
    close(linalg.eigvalsh(_t64(spd)), np.linalg.eigvalsh(spd))
    close(linalg.svdvals(_t64(tall)), np.linalg.svd(tall, compute_uv=False))
    close(linalg.pinv(_t64(tall)), np.linalg.pinv(tall))
    close(linalg.matrix_rank(_t64(tall)), np.linalg.matrix_rank(tall))
    close(linalg.matrix_power(_t64(a), 5), np.linalg.matrix_power(a, 5))
    close(linalg.matrix_power(_t64(a), -2), np.linalg.matrix_power(a, -2))
    close(linalg.matrix_power(_t64(a), 0), np.broadcast_to(np.eye(3), a.shape))
    close(linalg.cross(_t64(b[..., 0]), _t64(a[0, 0])), np.cross(b[..., 0], a[0, 0]))
    close(linalg.matrix_transpose(_t64(tall)), np.swapaxes(tall, -1, -2))
    close(linalg.diagonal(_t64(tall), offset=-1), np.diagonal(tall, -1, -2, -1))
    close(linalg.trace(_t64(tall), offset=1), np.trace(tall, 1, -2, -1))
    q, r = linalg.qr(_t64(tall))
    close(np.abs(q), np.abs(np.linalg.qr(tall)[0]))
    close(linalg.qr(_t64(tall), mode="complete").Q.shape, (2, 5, 5))
    u, s, vh = linalg.svd(_t64(tall))  # full_matrices=True by default
    assert (u.shape, s.shape, vh.shape) == ((2, 5, 5), (2, 3), (2, 3, 3))


def test_rank_deficient_and_singular_inputs():
    singular = np.array([[1.0, 2.0], [2.0, 4.0]])
    assert linalg.matrix_rank(_t64(singular)).item() == 1
    assert linalg.det(_t64(singular)).item() == 0.0
    assert linalg.slogdet(_t64(singular)).logabsdet.item() == -np.inf
    np.testing.assert_allclose(linalg.pinv(_t64(singular)).numpy(), np.linalg.pinv(singular), atol=1e-12)
    assert np.isnan(linalg.inv(_t64(singular)).numpy()).all()  # NaN, as JAX, not an exception
    not_positive = np.array([[1.0, 2.0], [2.0, 1.0]])
    assert np.isnan(linalg.cholesky(_t64(not_positive)).numpy()).any()
    # a batch with one bad matrix: the others are still computed
    batch = np.stack([_spd(np.random.default_rng(0), 2, 2), not_positive])
    out = linalg.cholesky(_t64(batch)).numpy()
    np.testing.assert_allclose(out[0], np.linalg.cholesky(batch[0]))
    assert np.isnan(out[1]).any()
    # the gradient of pinv at a rank-deficient matrix stays finite (no 1/0 in the branch not taken)
    assert np.isfinite(fg.grad(lambda x: fnp.sum(linalg.pinv(x)))(_t64(singular)).numpy()).all()


@pytest.mark.parametrize("name", ["cholesky", "inv", "det", "slogdet", "eigvalsh", "qr_tall", "svdvals", "pinv"])
def test_vmap_and_jit_of_grad_match_a_loop(name):
    loss, sample = LOSSES[name]
    rng = np.random.default_rng(3)
    xs = np.stack([sample(rng) for _ in range(3)])
    per_example = np.stack([fg.grad(loss)(_t64(x)).numpy() for x in xs])
    np.testing.assert_allclose(fg.vmap(fg.grad(loss))(_t64(xs)).numpy(), per_example, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(fg.jit(fg.vmap(fg.grad(loss)))(_t64(xs)).numpy(), per_example, rtol=1e-10, atol=1e-10)


def test_vmap_of_solve_with_unbatched_matrix_and_in_axes():
    rng = np.random.default_rng(4)
    a, bs = _general(rng, 3, 3), rng.normal(size=(3, 4))  # right-hand sides along axis 1
    got = fg.vmap(lambda b: linalg.solve(_t64(a), b), in_axes=1)(_t64(bs)).numpy()
    np.testing.assert_allclose(got, np.stack([np.linalg.solve(a, bs[:, k]) for k in range(4)]), rtol=1e-12)


def test_jit_float32_runs_as_host_steps():
    rng = np.random.default_rng(5)
    a = _spd(rng, 4, 4).astype(np.float32)
    jitted = fg.jit(lambda x: linalg.cholesky(x) @ linalg.inv(x))
    np.testing.assert_allclose(jitted(a).numpy(), np.linalg.cholesky(a) @ np.linalg.inv(a), rtol=1e-4, atol=1e-5)
    assert jitted(a).dtype == np.float32
    assert linalg.det(np.eye(2, dtype=np.int32)).dtype == np.float32  # integers become the default float


def test_errors_name_the_function_and_shapes():
    with pytest.raises(ValueError, match=r"linalg.cholesky needs square matrices.*\(2, 3\)"):
        linalg.cholesky(np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"linalg.solve: x2 of shape \(4,\) does not fit x1 of shape \(3, 3\)"):
        linalg.solve(np.eye(3), np.ones(4))
    with pytest.raises(ValueError, match="linalg.qr: mode must be"):
        linalg.qr(np.eye(2), mode="economic")
    with pytest.raises(TypeError, match="matrix_power: the exponent must be an integer"):
        linalg.matrix_power(np.eye(2), 1.5)
    with pytest.raises(ValueError, match="linalg.cross needs size 3"):
        linalg.cross(np.ones(2), np.ones(2))
    with pytest.raises(NotImplementedError, match="full_matrices=True"):
        fg.grad(lambda x: fnp.sum(linalg.svd(x).U))(_t64(np.ones((3, 2))))


# --- against JAX -----------------------------------------------------------------------------------


@pytest.fixture
def jax_x64():
    """JAX with float64 for the body of one test (the setting is global: restored after, so that the
    other tests' JAX comparisons, in the same worker, keep JAX's float32 defaults)."""
    jax = pytest.importorskip("jax")
    before = jax.config.jax_enable_x64
    jax.config.update("jax_enable_x64", True)
    yield jax
    jax.config.update("jax_enable_x64", before)


# the conventions finite differences cannot see: symmetrization, signs, which triangle is read
@pytest.mark.parametrize("name", ["cholesky", "slogdet", "eigh_vectors", "qr_tall", "svd_vectors", "pinv"])
def test_values_and_gradients_match_jax(name, jax_x64):
    jax = jax_x64
    jnp = jax.numpy
    loss, sample = LOSSES[name]
    x = sample(np.random.default_rng(11))
    jax_losses = {
        "cholesky": lambda x: jnp.sum(jnp.linalg.cholesky(x) * _weights((3, 3))),
        "inv": lambda x: jnp.sum(jnp.linalg.inv(x) * _weights((3, 3))),
        "det": jnp.linalg.det,
        "slogdet": lambda x: jnp.linalg.slogdet(x)[1],
        "eigvalsh": lambda x: jnp.sum(jnp.linalg.eigvalsh(x) * np.arange(1.0, 4.0)),
        "eigh_vectors": lambda x: jnp.sum(jnp.linalg.eigh(x)[1] ** 2 * _weights((3, 3))),
        "qr_tall": lambda x: jnp.sum(jnp.linalg.qr(x)[1] ** 2 * _weights((3, 3)))
        + jnp.sum(jnp.abs(jnp.linalg.qr(x)[0])),
        "qr_wide": lambda x: jnp.sum(jnp.linalg.qr(x)[1] ** 2 * _weights((3, 4))),
        "svd_vectors": lambda x: jnp.sum(jnp.linalg.svd(x, full_matrices=False)[0] ** 2 * _weights((3, 3)))
        + jnp.sum(jnp.linalg.svd(x, full_matrices=False)[2] ** 2 * _weights((3, 4))),
        "pinv": lambda x: jnp.sum(jnp.linalg.pinv(x) * _weights((3, 4))),
        "matrix_norm_2": lambda x: jnp.linalg.matrix_norm(x, ord=2),
        "solve_vector": lambda x: jnp.sum(jnp.linalg.solve(x, np.arange(3.0)) ** 2),
    }
    value, grad = jax.value_and_grad(jax_losses[name])(jnp.asarray(x))
    got_value, got_grad = fg.value_and_grad(loss)(_t64(x))
    np.testing.assert_allclose(float(got_value.numpy()), float(value), rtol=1e-10)
    np.testing.assert_allclose(got_grad.numpy(), np.asarray(grad), rtol=1e-8, atol=1e-10)


# --- properties ------------------------------------------------------------------------------------

_sizes = st.integers(1, 4)


@settings(max_examples=8, deadline=None)
@given(batch=st.integers(0, 2), rows=_sizes, cols=_sizes, seed=st.integers(0, 2**16))
def test_factorizations_reconstruct_their_input(batch, rows, cols, seed):
    rng = np.random.default_rng(seed)
    shape = (2,) * batch
    a = rng.normal(size=shape + (rows, cols))
    eye_k = np.eye(min(rows, cols))
    q, r = (t.numpy() for t in linalg.qr(_t64(a)))
    np.testing.assert_allclose(q @ r, a, atol=1e-10)
    np.testing.assert_allclose(np.swapaxes(q, -1, -2) @ q, np.broadcast_to(eye_k, shape + eye_k.shape), atol=1e-10)
    assert np.allclose(np.tril(r, -1), 0)
    u, s, vh = (t.numpy() for t in linalg.svd(_t64(a), full_matrices=False))
    np.testing.assert_allclose((u * s[..., None, :]) @ vh, a, atol=1e-10)
    assert (np.diff(s, axis=-1) <= 1e-12).all() and (s >= 0).all()
    p = linalg.pinv(_t64(a)).numpy()
    np.testing.assert_allclose(a @ p @ a, a, atol=1e-8)
    spd = a @ np.swapaxes(a, -1, -2) + np.eye(rows)
    lower = linalg.cholesky(_t64(spd)).numpy()
    np.testing.assert_allclose(lower @ np.swapaxes(lower, -1, -2), spd, atol=1e-10)
    assert np.allclose(np.triu(lower, 1), 0)
    w, v = (t.numpy() for t in linalg.eigh(_t64(spd)))
    np.testing.assert_allclose(spd @ v, v * w[..., None, :], atol=1e-9)
    np.testing.assert_allclose(spd @ linalg.solve(_t64(spd), _t64(a)).numpy(), a, atol=1e-9)


def test_lstsq_multi_dot_and_cond_match_numpy():
    rng = np.random.default_rng(6)
    a, b = rng.normal(size=(5, 3)), rng.normal(size=(5, 2))
    got, expected = linalg.lstsq(_t64(a), _t64(b)), np.linalg.lstsq(a, b)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-10, atol=1e-12)
    assert linalg.lstsq(_t64(a.T), _t64(b[:3, 0])).residuals.shape == (0,)  # underdetermined: no residuals
    grad = fg.grad(lambda m: fnp.sum(linalg.lstsq(m, _t64(b)).solution))(_t64(a)).numpy()
    expected_grad = _finite_difference_grad(lambda m: float(np.linalg.lstsq(m, b)[0].sum()), a)
    np.testing.assert_allclose(grad, expected_grad, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(linalg.multi_dot([_t64(a.T), _t64(a), _t64(b[:3, 0])]).numpy(),
                               np.linalg.multi_dot([a.T, a, b[:3, 0]]), rtol=1e-12)
    for p in (None, -2, 1, "fro"):
        np.testing.assert_allclose(linalg.cond(_t64(a[:3]), p).item(), np.linalg.cond(a[:3], p), rtol=1e-10)


def test_triangle_options_read_only_one_triangle():
    rng = np.random.default_rng(8)
    spd = _spd(rng, 3, 3)
    lower_only = np.tril(spd) + np.triu(rng.normal(size=(3, 3)), 1)  # garbage above the diagonal
    upper_only = np.triu(spd) + np.tril(rng.normal(size=(3, 3)), -1)
    np.testing.assert_allclose(linalg.cholesky(_t64(lower_only), symmetrize_input=False).numpy(),
                               np.linalg.cholesky(spd), rtol=1e-12)
    np.testing.assert_allclose(linalg.eigvalsh(_t64(upper_only), UPLO="U", symmetrize_input=False).numpy(),
                               np.linalg.eigvalsh(spd), rtol=1e-12)
    np.testing.assert_allclose(linalg.eigvalsh(_t64(lower_only), "L", symmetrize_input=False).numpy(),
                               np.linalg.eigvalsh(lower_only, "L"), rtol=1e-12)
    with pytest.raises(ValueError, match="UPLO must be 'L' or 'U'"):
        linalg.eigh(spd, UPLO="X")


@pytest.mark.parametrize("name", ["inv", "det", "cholesky", "eigh", "eigvalsh", "qr", "svd", "svdvals", "slogdet",
                                  "pinv", "matrix_rank", "solve"])
def test_complex_matrices_raise_instead_of_losing_the_imaginary_part(name):
    z = fnp.asarray(np.array([[2 + 1j, 0], [0, 3 - 1j]], np.complex64))
    args = (z, z) if name == "solve" else (z,)
    with pytest.raises(TypeError, match=r"linalg\.\w+ does not support complex matrices yet, got complex64"):
        getattr(linalg, name)(*args)
