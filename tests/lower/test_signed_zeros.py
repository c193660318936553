"""0.0 and -0.0 are equal numbers but different values: the IR's common-subexpression elimination and
the kernel IR's expression equality (every renderer's cache, the simplifier's memos) must keep them
apart, and ``x - -0.0`` is not ``x`` (for x = -0.0 it is 0.0). Compiled results match NumPy's bits.
(Known and left: kernel.alu still folds a float ``x + 0.0`` to ``x``, which keeps a -0.0 that NumPy
would turn into 0.0; random and dropout kernels rely on that fold.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.lower import kernel as K

X = np.array([1.0, -1.0, 2.0, -0.0, 0.0, -3.0], np.float32)

CASES: list[tuple[str, Callable[[Any], Any], Callable[[np.ndarray], np.ndarray]]] = [
    ("select between the two zeros", lambda x: fnp.where(x > 0, fnp.full_like(x, 0.0), fnp.full_like(x, -0.0)),
     lambda x: np.where(x > 0, np.float32(0.0), np.float32(-0.0))),
    ("minus negative zero", lambda x: x - fnp.full_like(x, -0.0), lambda x: x - np.float32(-0.0)),
]


@pytest.mark.parametrize("name, fn, reference", CASES, ids=[c[0] for c in CASES])
def test_signed_zeros_survive_jit(on_cpu: None, name: str, fn: Callable[[Any], Any],
                                  reference: Callable[[np.ndarray], np.ndarray]) -> None:
    got = fg.jit(fn)(fnp.asarray(X)).numpy()
    want = reference(X)
    assert got.tobytes() == want.tobytes(), (name, got, want)


def test_kernel_expressions_tell_the_zeros_apart() -> None:
    f32 = np.dtype(np.float32)
    plus, minus = K.KExpr("const", f32, (), 0.0), K.KExpr("const", f32, (), -0.0)
    assert plus != minus and len({plus, minus}) == 2
    assert plus == K.KExpr("const", f32, (), 0.0) and hash(plus) == hash(K.KExpr("const", f32, (), 0.0))
    assert K.const(3, K.INDEX) == K.const(3, K.INDEX)
