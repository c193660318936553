"""funcgrad.numpy.fft against NumPy (complex128 references) and JAX (where installed): forward
values for every function, n / s / axes / norm, jvp and grad through every transform, vmap, jit,
and property tests (round trips, Parseval's theorem, linearity)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir import dtypes

rng = np.random.default_rng(3)
X = rng.standard_normal((3, 8)).astype(np.float32)
Z = (rng.standard_normal((3, 8)) + 1j * rng.standard_normal((3, 8))).astype(np.complex64)
CUBE = (rng.standard_normal((2, 3, 4)) + 1j * rng.standard_normal((2, 3, 4))).astype(np.complex64)


def close(got, want, rtol=1e-4, atol=1e-4):
    got = np.asarray(got)
    assert got.shape == np.shape(want), (got.shape, np.shape(want))
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


COMPLEX_IN = ["fft", "ifft", "irfft", "hfft"]
REAL_IN = ["rfft", "ihfft"]
N_CASES = [{}, {"n": 5, "norm": "ortho"}, {"n": 11, "norm": "forward"}, {"n": 4, "axis": 0, "norm": "backward"}]


@pytest.mark.parametrize("kwargs", N_CASES, ids=str)
@pytest.mark.parametrize("name", COMPLEX_IN + REAL_IN)
def test_one_dimensional_transforms_match_numpy(name, kwargs):
    x = X if name in REAL_IN else Z
    got = getattr(fnp.fft, name)(x, **kwargs)
    want = getattr(np.fft, name)(x.astype(np.float64 if name in REAL_IN else np.complex128), **kwargs)
    assert got.dtype == (dtypes.float32 if want.dtype.kind == "f" else dtypes.complex64)
    close(got, want)


@pytest.mark.parametrize("kwargs", [{}, {"axes": (0, 2), "norm": "ortho"}, {"s": (3, 5), "axes": (1, 2)},
                                    {"s": (2, 4, 6), "axes": (2, 0, 1), "norm": "forward"}, {"axes": (-1,)}],
                         ids=str)
@pytest.mark.parametrize("name", ["fftn", "ifftn", "rfftn", "irfftn"])
def test_n_dimensional_transforms_match_numpy(name, kwargs):
    x = CUBE.real.copy() if name == "rfftn" else CUBE
    got = getattr(fnp.fft, name)(x, **kwargs)
    want = getattr(np.fft, name)(x.astype(np.complex128 if x.dtype.kind == "c" else np.float64), **kwargs)
    close(got, want)


def test_two_dimensional_aliases_and_real_inputs():
    close(fnp.fft.fft2(CUBE), np.fft.fft2(CUBE.astype(np.complex128)))
    close(fnp.fft.ifft2(CUBE), np.fft.ifft2(CUBE.astype(np.complex128)))
    close(fnp.fft.rfft2(CUBE.real.copy()), np.fft.rfft2(CUBE.real.astype(np.float64)))
    close(fnp.fft.irfft2(CUBE), np.fft.irfft2(CUBE.astype(np.complex128)))
    close(fnp.fft.fft(X), np.fft.fft(X.astype(np.float64)))  # a real input is made complex
    close(fnp.fft.fft(np.arange(6)), np.fft.fft(np.arange(6.0)))
    assert fnp.fft.fft(np.ones(4)).dtype == dtypes.complex64
    assert fnp.fft.fft(fnp.ones(4, dtype="float64")).dtype == dtypes.complex128
    assert fnp.fft.rfft(fnp.ones(4, dtype="float64")).dtype == dtypes.complex128


def test_frequencies_and_shifts():
    close(fnp.fft.fftfreq(7, 0.5), np.fft.fftfreq(7, 0.5), atol=1e-7)
    close(fnp.fft.fftfreq(8), np.fft.fftfreq(8), atol=1e-7)
    close(fnp.fft.rfftfreq(9, d=2.0), np.fft.rfftfreq(9, d=2.0), atol=1e-7)
    assert fnp.fft.fftfreq(4, dtype=fnp.float64).dtype == dtypes.float64
    grid = np.arange(12).reshape(3, 4)
    for axes in (None, 0, (1,), (0, 1)):
        close(fnp.fft.fftshift(grid, axes=axes), np.fft.fftshift(grid, axes=axes))
        close(fnp.fft.ifftshift(grid, axes=axes), np.fft.ifftshift(grid, axes=axes))


def test_bad_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="norm"):
        fnp.fft.fft(Z, norm="sideways")
    with pytest.raises(ValueError, match="invalid number of data points"):
        fnp.fft.fft(Z, n=0)
    with pytest.raises(TypeError, match="rfft needs a real input"):
        fnp.fft.rfft(Z)
    with pytest.raises(ValueError, match="out of bounds"):
        fnp.fft.fft(Z, axis=2)
    with pytest.raises(ValueError, match="differ in length"):
        fnp.fft.fftn(CUBE, s=(2, 2), axes=(0,))


# --- transforms ---------------------------------------------------------------------------------

GRAD_CASES = [("fft", Z, {}), ("ifft", Z, {"n": 6}), ("rfft", X, {}), ("rfft", X, {"n": 5}),
              ("irfft", Z, {}), ("irfft", Z, {"n": 7}), ("hfft", Z, {"n": 6}), ("ihfft", X, {}),
              ("fftn", CUBE, {}), ("rfftn", CUBE.real.copy(), {"axes": (0, 1)}), ("irfftn", CUBE, {})]


def _loss(module, name, kwargs):
    def loss(v):
        y = getattr(module.fft, name)(v, **kwargs)
        return module.sum(module.abs(y) ** 2 * 0.5 + module.real(y) ** 3 - module.imag(y))
    return loss


@pytest.mark.parametrize("name,x,kwargs", GRAD_CASES, ids=[f"{c[0]}{c[2]}" for c in GRAD_CASES])
def test_grad_jit_and_vmap_match_jax(name, x, kwargs):
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    want = jax.grad(_loss(jnp, name, kwargs))(x)
    close(fg.grad(_loss(fnp, name, kwargs))(x), want, rtol=1e-3, atol=1e-3)
    close(fg.jit(fg.grad(_loss(fnp, name, kwargs)))(x), want, rtol=1e-3, atol=1e-3)
    fn = lambda v: getattr(fnp.fft, name)(v, **kwargs)  # noqa: E731
    jfn = lambda v: getattr(jnp.fft, name)(v, **kwargs)  # noqa: E731
    close(fg.vmap(fn)(x), jax.vmap(jfn)(x), rtol=1e-3, atol=1e-3)
    primal, tangent = fg.jvp(fn, (x,), (x * 0.5,))
    close(tangent, jax.jvp(jfn, (x,), (x * 0.5,))[1], rtol=1e-3, atol=1e-3)


@pytest.mark.parametrize("name,x,kwargs", GRAD_CASES[:8], ids=[f"{c[0]}{c[2]}" for c in GRAD_CASES[:8]])
def test_vjp_is_the_transpose_of_jvp(name, x, kwargs):
    """<ct, J t> == <J^T ct, t> with the bilinear (unconjugated) real pairing of JAX's transposes."""
    fn = lambda v: getattr(fnp.fft, name)(v, **kwargs)  # noqa: E731
    tangent = (rng.standard_normal(x.shape) + (1j * rng.standard_normal(x.shape) if x.dtype.kind == "c" else 0))
    tangent = tangent.astype(x.dtype)
    out, jt = fg.jvp(fn, (x,), (tangent,))
    ct = rng.standard_normal(out.shape) + (1j * rng.standard_normal(out.shape) if out.dtype.kind == "c" else 0)
    ct = ct.astype(out.dtype)
    (back,) = fg.vjp(fn, x)[1](ct)

    def pairing(a, b):
        a, b = np.asarray(a).astype(np.complex128), np.asarray(b).astype(np.complex128)
        return float(np.sum(a.real * b.real + a.imag * b.imag))
    # JAX's transpose is the adjoint under re<a, b> of conj(a): compare <conj ct, Jt> and <conj J^T ct, t>
    lhs = pairing(np.conj(ct), jt)
    rhs = pairing(np.conj(back), tangent)
    assert lhs == pytest.approx(rhs, rel=1e-3, abs=1e-3)


# --- properties ---------------------------------------------------------------------------------

_signals = st.integers(1, 9).flatmap(lambda n: st.lists(
    st.floats(-10, 10, allow_nan=False, width=32), min_size=2 * n, max_size=2 * n))


@settings(max_examples=12, deadline=None)
@given(_signals)
def test_round_trips_and_parseval(values):
    half = len(values) // 2
    z = (np.array(values[:half]) + 1j * np.array(values[half:])).astype(np.complex64)
    x = np.array(values, np.float32)
    close(fnp.fft.ifft(fnp.fft.fft(z)), z, rtol=1e-4, atol=1e-3)
    close(fnp.fft.irfft(fnp.fft.rfft(x), n=x.size), x, rtol=1e-4, atol=1e-3)
    close(fnp.fft.hfft(fnp.fft.ihfft(x), n=x.size), x, rtol=1e-4, atol=1e-3)
    spectrum = np.asarray(fnp.fft.fft(z, norm="ortho"))
    assert np.sum(np.abs(spectrum) ** 2) == pytest.approx(np.sum(np.abs(z.astype(np.complex128)) ** 2),
                                                          rel=1e-4, abs=1e-3)
    a, b = fnp.asarray(z), fnp.asarray(z[::-1].copy())
    close(fnp.fft.fft(a * 2 - b), np.asarray(fnp.fft.fft(a)) * 2 - np.asarray(fnp.fft.fft(b)), rtol=1e-4, atol=1e-2)
