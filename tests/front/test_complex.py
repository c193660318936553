"""Complex numbers (complex64, complex128) through funcgrad.numpy, the lazy path and jit, and their
derivatives with JAX's conventions.

Values are checked against NumPy in complex128; gradients against JAX where it is installed and
against finite differences of a float64 NumPy reference otherwise (JAX's convention for a real
function f of z = x + iy: grad f = df/dx - i df/dy, the conjugate of the (x, y) gradient packed as a
complex number).
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir import dtypes

rng = np.random.default_rng(7)
Z = (rng.uniform(-1.5, 1.5, (2, 3)) + 1j * rng.uniform(-1.5, 1.5, (2, 3))).astype(np.complex64)
W = (rng.uniform(-1.5, 1.5, (2, 3)) + 1j * rng.uniform(-1.5, 1.5, (2, 3))).astype(np.complex64)
RTOL, ATOL = 2e-5, 2e-5


def close(got, want, rtol=RTOL, atol=ATOL):
    got = np.asarray(got)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True)


# --- dtypes and promotion -----------------------------------------------------------------------

def test_python_complex_and_numpy_arrays_become_complex64():
    assert fnp.asarray(1j).dtype == dtypes.complex64
    assert fnp.asarray(np.array([1 + 2j])).dtype == dtypes.complex64  # complex128 narrowed, like float64
    assert fnp.asarray(np.array([1 + 2j]), dtype="complex128").dtype == dtypes.complex128
    assert fnp.asarray([1, 2j]).dtype == dtypes.complex64
    assert fnp.isdtype(fnp.complex64, "complex floating") and not fnp.isdtype(fnp.float32, "complex floating")


@pytest.mark.parametrize("a,b,expected", [
    ("float32", "complex64", "complex64"), ("float64", "complex64", "complex128"),
    ("float16", "complex64", "complex64"), ("int32", "complex64", "complex64"),
    ("complex64", "complex128", "complex128"), ("bool", "complex64", "complex64"),
])
def test_promotion_of_arrays(a, b, expected):
    x, y = fnp.ones((2,), dtype=a), fnp.ones((2,), dtype=b)
    assert (x + y).dtype == np.dtype(expected)
    assert fnp.result_type(a, b) == np.dtype(expected)


def test_weak_python_complex_follows_the_array():
    assert (fnp.ones(2, dtype="float32") * 1j).dtype == dtypes.complex64
    assert (fnp.ones(2, dtype="float64") * 1j).dtype == dtypes.complex128
    assert (fnp.ones(2, dtype="complex128") + 1.5).dtype == dtypes.complex128
    assert (fnp.ones(2, dtype="int8") + 1j).dtype == dtypes.complex64


def test_promotion_matches_jax():
    jnp = pytest.importorskip("jax.numpy")
    names = ["bool", "int8", "int32", "uint8", "float16", "bfloat16", "float32", "complex64"]
    for a in names:
        for b in names:
            assert fnp.result_type(a, b) == jnp.result_type(a, b), (a, b)
        assert fnp.result_type(a, 1j) == jnp.result_type(a, 1j), a


# --- elementwise functions -----------------------------------------------------------------------

UNARY = ["exp", "log", "sqrt", "sin", "cos", "tan", "sinh", "cosh", "tanh", "asin", "acos", "atan",
         "asinh", "acosh", "atanh", "expm1", "log1p", "square", "negative", "positive", "conj", "real", "imag",
         "abs", "sign", "isnan", "isinf", "isfinite", "reciprocal"]
_NUMPY = {"asin": np.arcsin, "acos": np.arccos, "atan": np.arctan, "asinh": np.arcsinh, "acosh": np.arccosh,
          "atanh": np.arctanh}


def _numpy_sign(z):
    magnitude = np.abs(z)
    return np.where(magnitude == 0, 0, z / np.where(magnitude == 0, 1, magnitude))


@pytest.mark.parametrize("name", UNARY)
def test_unary_matches_numpy_eager_and_jit(name):
    fn = getattr(fnp, name)
    reference = _numpy_sign if name == "sign" else _NUMPY.get(name, getattr(np, name))
    want = reference(Z.astype(np.complex128))
    eager, jitted = fn(Z), fg.jit(fn)(Z)
    for got in (eager, jitted):
        got = np.asarray(got)
        expected_dtype = np.float32 if name in ("real", "imag", "abs") else (
            np.bool_ if name.startswith("is") else np.complex64)
        assert got.dtype == expected_dtype, (name, got.dtype)
        close(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["add", "subtract", "multiply", "divide", "pow", "equal", "not_equal"])
def test_binary_matches_numpy(name):
    fn = getattr(fnp, name)
    reference = np.power if name == "pow" else getattr(np, name)
    want = reference(Z.astype(np.complex128), W.astype(np.complex128))
    close(fn(Z, W), want, rtol=1e-4, atol=1e-5)
    close(fg.jit(fn)(Z, W), want, rtol=1e-4, atol=1e-5)
    # a real operand and a Python complex scalar promote
    close(fn(Z.real, W), reference(Z.real.astype(np.float64), W.astype(np.complex128)), rtol=1e-4, atol=1e-5)
    close(fn(Z, 2 - 1j), reference(Z.astype(np.complex128), 2 - 1j), rtol=1e-4, atol=1e-5)


def test_angle_and_parts_of_special_values():
    z = np.array([1 + 1j, -1 + 0j, complex(np.inf, 0), complex(0, np.nan), 0j], np.complex64)
    close(fnp.angle(z), np.angle(z.astype(np.complex128)), atol=1e-6)
    close(fnp.angle(z, deg=True), np.angle(z.astype(np.complex128), deg=True), rtol=1e-5, atol=1e-5)
    assert fnp.isnan(z).tolist() == [False, False, False, True, False]
    assert fnp.isinf(z).tolist() == [False, False, True, False, False]
    assert fnp.isfinite(z).tolist() == [True, True, False, False, True]


def test_ordering_functions_reject_complex():
    with pytest.raises(TypeError, match="complex"):
        fnp.maximum(Z, W)
    with pytest.raises(TypeError, match="complex"):
        fnp.less(Z, W)


@settings(max_examples=15, deadline=None)
@given(st.lists(st.complex_numbers(max_magnitude=4, allow_nan=False, allow_infinity=False), min_size=1,
                max_size=6))
def test_exp_log_round_trip_and_abs_property(values):
    z = np.array(values, np.complex64)
    t = fnp.asarray(z)
    close(fnp.abs(t * fnp.conj(t)), np.abs(z.astype(np.complex128)) ** 2, rtol=1e-4, atol=1e-4)
    nonzero = z[np.abs(z) > 1e-3]
    if nonzero.size:
        close(fnp.exp(fnp.log(fnp.asarray(nonzero))), nonzero, rtol=1e-4, atol=1e-4)


# --- reductions, products, casts, creation -----------------------------------------------------

def test_reductions_and_products():
    z = Z.astype(np.complex128)
    close(fnp.sum(Z), z.sum(), rtol=1e-5)
    close(fnp.sum(Z, axis=0), z.sum(axis=0), rtol=1e-5)
    close(fnp.prod(Z, axis=1), z.prod(axis=1), rtol=1e-4)
    close(fnp.mean(Z), z.mean(), rtol=1e-5)
    close(fnp.var(Z), z.var(), rtol=1e-5)
    assert fnp.var(Z).dtype == dtypes.float32
    close(fnp.cumsum(Z, axis=1), z.cumsum(axis=1), rtol=1e-5)
    close(Z @ W.T, z @ W.T.astype(np.complex128), rtol=1e-4)
    close(fnp.matmul(Z, W.T), z @ W.T.astype(np.complex128), rtol=1e-4)
    close(fnp.vecdot(Z, W), np.sum(np.conj(z) * W, axis=-1), rtol=1e-4)  # conjugates the first
    close(fnp.vdot(Z, W), np.vdot(z, W), rtol=1e-4)
    close(fnp.linalg.vector_norm(Z), np.linalg.norm(z), rtol=1e-5)
    close(fnp.linalg.matrix_norm(Z), np.linalg.norm(z), rtol=1e-5)
    close(fg.jit(lambda a, b: fnp.sum(a @ b))(Z, W.T), np.sum(z @ W.T), rtol=1e-4)


def test_casts_and_creation():
    assert fnp.zeros((2,), dtype=fnp.complex64).tolist() == [0j, 0j]
    assert fnp.ones((1,), dtype="complex128").dtype == dtypes.complex128
    assert fnp.full((2,), 1 + 2j).tolist() == [1 + 2j, 1 + 2j]
    assert fnp.full((2,), 1 + 2j).dtype == dtypes.complex64
    assert fnp.eye(2, dtype=fnp.complex64).dtype == dtypes.complex64
    assert fnp.astype(fnp.asarray([1.5, -2.0]), fnp.complex64).tolist() == [1.5 + 0j, -2 + 0j]
    # complex -> real keeps the real part (as JAX); -> bool tests for nonzero
    assert fnp.astype(fnp.asarray([1.5 + 2j]), fnp.float32).tolist() == [1.5]
    assert fnp.astype(fnp.asarray([2.7 - 1j]), fnp.int32).tolist() == [2]
    assert fnp.astype(fnp.asarray([0j, 1j]), fnp.bool_).tolist() == [False, True]
    assert complex(fnp.asarray(1 + 2j).item()) == 1 + 2j
    assert complex(fnp.asarray(1 + 2j)) == 1 + 2j
    t = fnp.asarray(Z)
    close(t.real, Z.real)
    close(t.imag, Z.imag)
    close(t.conj(), np.conj(Z))
    assert fnp.asarray([1.5]).real.tolist() == [1.5] and fnp.asarray([1.5]).imag.tolist() == [0.0]


def test_indexing_and_movement_of_complex_arrays():
    t = fnp.asarray(Z)
    close(t[1, ::-1], Z[1, ::-1])
    close(fnp.concat([t, t], axis=0), np.concatenate([Z, Z]))
    close(fnp.reshape(t, (3, 2)).T, Z.reshape(3, 2).T)
    close(t.at[0, 1].set(5j), np.where(np.arange(6).reshape(2, 3) == 1, 5j, Z))
    close(fnp.where(fnp.real(t) > 0, t, 0), np.where(Z.real > 0, Z, 0))


# --- derivatives --------------------------------------------------------------------------------

def _fd_grad(fn64, z: complex, eps: float = 1e-6) -> complex:
    """JAX's gradient convention for real ``fn64`` of complex z, by central differences."""
    dx = (fn64(z + eps) - fn64(z - eps)) / (2 * eps)
    dy = (fn64(z + 1j * eps) - fn64(z - 1j * eps)) / (2 * eps)
    return complex(dx - 1j * dy)


REAL_FUNCTIONS = [  # (funcgrad, numpy float64) real-valued functions of one complex number
    (lambda z: fnp.abs(z) ** 2, lambda z: abs(z) ** 2),
    (lambda z: fnp.abs(z), lambda z: abs(z)),
    (lambda z: fnp.real(fnp.exp(z) * fnp.conj(z)), lambda z: (np.exp(z) * np.conj(z)).real),
    (lambda z: fnp.imag(fnp.sin(z) / (z + 2)), lambda z: (np.sin(z) / (z + 2)).imag),
    (lambda z: fnp.angle(z), lambda z: np.angle(z)),
    (lambda z: fnp.abs(fnp.sqrt(z) + fnp.log(z)), lambda z: abs(np.sqrt(z) + np.log(z))),
]


@pytest.mark.parametrize("index", range(len(REAL_FUNCTIONS)))
def test_grad_of_real_functions_matches_finite_differences(index):
    fn, fn64 = REAL_FUNCTIONS[index]
    z = complex(np.complex64(0.7 - 1.3j))
    want = _fd_grad(fn64, z)
    got = fg.grad(fn)(np.complex64(z))
    assert got.dtype == dtypes.complex64
    close(got, want, rtol=1e-4, atol=1e-4)
    close(fg.jit(fg.grad(fn))(np.complex64(z)), want, rtol=1e-4, atol=1e-4)


def test_grad_conventions_match_jax():
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    z = np.complex64(1 + 2j)
    want = complex(jax.grad(lambda v: jnp.abs(v) ** 2)(z))
    assert want == pytest.approx(2 - 4j)
    assert complex(fg.grad(lambda v: fnp.abs(v) ** 2)(z)) == pytest.approx(want)
    cases = [(lambda v: v * v, lambda v: v * v), (lambda v: fnp.sin(v) * fnp.exp(v), lambda v: jnp.sin(v) * jnp.exp(v)),
             (lambda v: fnp.conj(v) * v, lambda v: jnp.conj(v) * v)]
    for fn, jfn in cases:
        close(fg.grad(fn, holomorphic=True)(z), jax.grad(jfn, holomorphic=True)(z), rtol=1e-5)
    zs = Z.ravel()
    f = lambda v: fnp.sum(fnp.abs(fnp.tanh(v) * 2j + v) ** 3)  # noqa: E731
    jf = lambda v: jnp.sum(jnp.abs(jnp.tanh(v) * 2j + v) ** 3)  # noqa: E731
    close(fg.grad(f)(zs), jax.grad(jf)(zs), rtol=1e-4, atol=1e-4)
    # jvp and vjp of a complex-to-complex function
    primal, tangent = fg.jvp(fnp.exp, (zs,), (zs,))
    jprimal, jtangent = jax.jvp(jnp.exp, (zs,), (zs,))
    close(primal, jprimal, rtol=1e-5)
    close(tangent, jtangent, rtol=1e-5)
    out, pullback = fg.vjp(lambda v: fnp.sin(v) * v, zs)
    jout, jpullback = jax.vjp(lambda v: jnp.sin(v) * v, zs)
    close(pullback(zs)[0], jpullback(zs)[0], rtol=1e-4, atol=1e-5)
    # a real input whose computation goes through complex numbers
    x = np.array([0.5, 1.0, 2.0], np.float32)
    close(fg.grad(lambda v: fnp.abs(fnp.sum(fnp.exp(1j * v))))(x),
          jax.grad(lambda v: jnp.abs(jnp.sum(jnp.exp(1j * v))))(x), rtol=1e-4, atol=1e-4)


def test_grad_errors_name_holomorphic():
    with pytest.raises(TypeError, match="holomorphic=True"):
        fg.grad(lambda v: v * v)(np.complex64(1j))
    with pytest.raises(TypeError, match="complex inputs"):
        fg.grad(lambda v: v * v, holomorphic=True)(np.float32(1.0))
    with pytest.raises(TypeError, match="complex scalar"):
        fg.grad(lambda v: fnp.abs(v), holomorphic=True)(np.complex64(1j))


def test_vmap_of_complex_functions_matches_a_loop():
    fn = lambda v, w: fnp.sum(fnp.conj(v) * fnp.exp(w)) + fnp.abs(v[0])  # noqa: E731
    got = fg.vmap(fn)(Z, W)
    want = [complex(np.sum(np.conj(Z[i].astype(complex)) * np.exp(W[i].astype(complex))) + abs(Z[i, 0]))
            for i in range(2)]
    close(got, np.array(want), rtol=1e-4)
    close(fg.jit(fg.vmap(fg.grad(lambda v: fnp.abs(v) ** 2)))(Z.ravel()), 2 * np.conj(Z.ravel()), rtol=1e-5)


def test_complex_equations_are_host_steps_and_print():
    ir = fg.make_ir(lambda v: fnp.real(v * 2j) + 1.0)(Z)
    text = str(ir)
    assert "c64[2,3]" in text and "real" in text
    from funcgrad.lower.schedule import HostStep, schedule
    steps = schedule(ir)
    assert any(isinstance(step, HostStep) and step.eqn.primitive.name == "mul" for step in steps)


@settings(max_examples=8, deadline=None)
@given(st.complex_numbers(min_magnitude=0.2, max_magnitude=2, allow_nan=False, allow_infinity=False))
def test_grad_convention_property(z):
    """For random z: grad of a real function is df/dx - i df/dy (finite differences), and the
    holomorphic gradient is the complex derivative."""
    z = complex(np.complex64(z))
    fn64 = lambda v: abs(np.sin(v) + v * v) ** 2  # noqa: E731
    want = _fd_grad(fn64, z)
    got = fg.grad(lambda v: fnp.abs(fnp.sin(v) + v * v) ** 2)(np.complex64(z))
    close(got, want, rtol=2e-3, atol=2e-3)
    holo = fg.grad(lambda v: fnp.sin(v) + v * v, holomorphic=True)(np.complex64(z))
    close(holo, np.cos(z) + 2 * z, rtol=1e-4, atol=1e-4)


def test_linspace_round_and_nan_to_num_of_complex():
    close(fnp.linspace(0, 1 + 1j, 5), np.linspace(0, 1 + 1j, 5))
    close(fnp.linspace(1j, 2, 4, endpoint=False, dtype="complex128"), np.linspace(1j, 2, 4, endpoint=False))
    assert fnp.linspace(0, 1, 3, dtype=fnp.complex64).dtype == dtypes.complex64
    close(fnp.round(fnp.asarray([1.6 + 2.5j, -0.5 - 1.5j])), np.round(np.array([1.6 + 2.5j, -0.5 - 1.5j])))
    z = np.array([complex(np.nan, np.inf), complex(-np.inf, 1)], np.complex64)
    close(fnp.nan_to_num(z), np.nan_to_num(z), rtol=1e-6)


def test_complex_runs_on_every_available_device():
    """Complex equations and fft are host steps, so every device runs them; the real kernels around
    them run on the device."""
    from funcgrad.devices import available_devices
    z64, x64 = np.array([1 + 2j, 3j], np.complex128), np.array([1.0, 2.0])
    want = np.abs(np.exp(z64) * 2 + x64) + np.sin(x64)
    for device in available_devices():
        z = fg.Tensor(z64.astype(np.complex64), device=device)
        x = fg.Tensor(x64.astype(np.float32), device=device)
        close(fnp.abs(fnp.exp(z) * 2 + x) + fnp.sin(x), want, rtol=1e-5)
        close(fg.jit(lambda a, b: fnp.real(fnp.fft.fft(a * b)) * b)(z, x), np.real(np.fft.fft(z64 * x64)) * x64)
        close(fg.grad(lambda a: fnp.sum(fnp.abs(a) ** 2))(z), 2 * np.conj(z64))


def test_expm1_special_values_follow_c99():
    inf, nan = np.inf, np.nan
    z = np.array([0j, complex(inf, 0), complex(-inf, inf), complex(inf, inf), complex(-inf, nan),
                  complex(inf, nan), complex(nan, 0), complex(-inf, 2.0)], np.complex64)
    want = [0j, complex(inf, 0), complex(-1, 0), complex(inf, nan), complex(-1, 0), complex(inf, nan),
            complex(nan, 0), complex(-1, 0)]
    got = fnp.expm1(z).tolist()
    for g, w in zip(got, want):
        for part_g, part_w in ((g.real, w.real), (g.imag, w.imag)):
            assert (np.isnan(part_g) and np.isnan(part_w)) or part_g == part_w, (got, want)
    close(fnp.expm1(Z), np.expm1(Z.astype(np.complex128)), rtol=1e-5, atol=1e-6)


def test_jacobians_with_complex_numbers_follow_jax():
    z = Z[0]
    x = Z[0].real.copy()
    close(fg.jacfwd(lambda v: v * fnp.sin(v), holomorphic=True)(z), np.diag(np.sin(z) + z * np.cos(z)), rtol=1e-5)
    close(fg.jacrev(lambda v: v * fnp.sin(v), holomorphic=True)(z), np.diag(np.sin(z) + z * np.cos(z)), rtol=1e-5)
    close(fg.jacfwd(lambda v: fnp.exp(1j * v))(x), np.diag(1j * np.exp(1j * x)), rtol=1e-5)
    with pytest.raises(TypeError, match="jacrev requires real-valued outputs"):
        fg.jacrev(lambda v: fnp.exp(1j * v))(x)
    with pytest.raises(TypeError, match="jacfwd requires real-valued inputs"):
        fg.jacfwd(lambda v: v * v)(z)
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    close(fg.jacrev(lambda v: fnp.abs(v) ** 2)(z), jax.jacrev(lambda v: jnp.abs(v) ** 2)(z), rtol=1e-5)
