"""``funcgrad.numpy.linalg``: the Array API standard's linear-algebra extension (as ``jax.numpy.linalg``).

Decompositions and solves bind the linear-algebra primitives of ``funcgrad.ir.primitives``
(cholesky, solve, slogdet, eigh, qr, svd), each a host step that runs LAPACK through NumPy on the
CPU and maps over leading batch axes; their jvp rules (``transforms/ad_rules.py``) make everything
here differentiable, and the batching rules make it vmap-able. The rest is built from those and from
the products of ``funcgrad.numpy.products``: inv and solve from ``solve``; det from ``slogdet``;
pinv, matrix_rank, svdvals and the 2-norms from ``svd``. Integer and bool inputs are converted to
the default float dtype first, as in JAX.

``diagonal`` and ``trace`` here follow the standard (the last two axes, ``offset`` by keyword), unlike
``funcgrad.numpy.diagonal``/``trace``, which take NumPy's ``axis1``/``axis2``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy import products
from funcgrad.numpy.conversion import ArrayLike, asarray, astype, broadcast_shapes, broadcast_to
from funcgrad.numpy.creation import eye, tril, triu
from funcgrad.numpy.elementwise import exp, greater, multiply, subtract, where
from funcgrad.numpy.manipulation import expand_dims, matrix_transpose, reshape, stack
from funcgrad.numpy.products import matmul, matrix_norm, norm, outer, tensordot, vecdot, vector_norm
from funcgrad.numpy.reductions import max as max_
from funcgrad.numpy.reductions import sum as sum_


class EighResult(NamedTuple):
    eigenvalues: Tensor
    eigenvectors: Tensor


class QRResult(NamedTuple):
    Q: Tensor
    R: Tensor


class SlogdetResult(NamedTuple):
    sign: Tensor
    logabsdet: Tensor


class SVDResult(NamedTuple):
    U: Tensor
    S: Tensor
    Vh: Tensor


def _matrices(x: ArrayLike, name: str, square: bool = True) -> Tensor:
    """``x`` as a float array with matrices in its last two axes (checked here, so the error names
    the function the user called)."""
    x = asarray(x)
    if dtypes.is_complex(x.dtype):  # the LAPACK steps are real: never drop an imaginary part silently
        raise TypeError(f"linalg.{name} does not support complex matrices yet, got {x.dtype.name}; "
                        "split them into real and imaginary parts or compute with NumPy")
    if not dtypes.is_float(x.dtype):
        x = astype(x, dtypes.default_float)
    if x.ndim < 2 or (square and x.shape[-1] != x.shape[-2]):
        what = "square matrices" if square else "matrices"
        raise ValueError(f"linalg.{name} needs {what} in the last two axes (rank >= 2), got shape {x.shape}")
    return x


def _eye_like(x: Tensor) -> Tensor:
    n = x.shape[-1]
    return broadcast_to(eye(n, dtype=x.dtype), x.shape)


def _from_triangle(x: Tensor, lower: bool) -> Tensor:
    """The symmetric matrices whose lower (or upper) triangle is that of ``x`` (the other is not read)."""
    if lower:
        return tril(x) + matrix_transpose(tril(x, k=-1))
    return triu(x) + matrix_transpose(triu(x, k=1))


def cholesky(x: ArrayLike, /, *, upper: bool = False, symmetrize_input: bool = True) -> Tensor:
    """The Cholesky factor L (lower triangular, x = L L^T) of symmetric positive-definite matrices;
    U = L^T with ``upper=True``. The symmetric part (x + x^T) / 2 is read, as in JAX; with
    ``symmetrize_input=False`` only the lower triangle. A matrix that is not positive definite
    gives NaNs.

    >>> cholesky(asarray([[4.0, 2.0], [2.0, 5.0]])).tolist()
    [[2.0, 0.0], [1.0, 2.0]]
    """
    a = _matrices(x, "cholesky")
    lower = bind(P.cholesky_p, a if symmetrize_input else _from_triangle(a, lower=True))
    return matrix_transpose(lower) if upper else lower


def solve(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """The solution X of x1 X = x2. ``x2`` is a stack of matrices (..., M, K), or one vector (M,) when
    it is 1-d (NumPy 2's and the standard's rule); batch axes broadcast. A singular x1 gives NaNs.

    >>> solve(asarray([[2.0, 0.0], [0.0, 4.0]]), asarray([2.0, 2.0])).tolist()
    [1.0, 0.5]
    """
    a = _matrices(x1, "solve")
    b = asarray(x2)
    dtype = dtypes.result_type((a.dtype, False), (b.dtype, False))[0]
    if dtypes.is_complex(dtype):
        raise TypeError(f"linalg.solve does not support complex matrices yet, got {dtype.name}; "
                        "split them into real and imaginary parts or compute with NumPy")
    if not dtypes.is_float(dtype):
        dtype = dtypes.default_float
    a, b = astype(a, dtype), astype(b, dtype)
    n = a.shape[-1]
    vector = b.ndim == 1
    if b.ndim == 0 or b.shape[-1 if vector else -2] != n:
        raise ValueError(f"linalg.solve: x2 of shape {asarray(x2).shape} does not fit x1 of shape {a.shape}; "
                         f"x2 must be ({n},) or (..., {n}, K)")
    if vector:
        b = reshape(b, (n, 1))
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = broadcast_to(a, batch + a.shape[-2:])
    b = broadcast_to(b, batch + b.shape[-2:])
    out = bind(P.solve_p, a, b, transpose_a=False)
    return reshape(out, batch + (n,)) if vector else out


def inv(x: ArrayLike, /) -> Tensor:
    """The inverse of square matrices (solve against the identity); a singular matrix gives NaNs.

    >>> inv(asarray([[2.0, 0.0], [0.0, 4.0]])).tolist()
    [[0.5, 0.0], [0.0, 0.25]]
    """
    a = _matrices(x, "inv")
    return bind(P.solve_p, a, _eye_like(a), transpose_a=False)


def slogdet(x: ArrayLike, /, *, method: str | None = None) -> SlogdetResult:
    """(sign, log|det|) of square matrices: sign 0 and logabsdet -inf for a singular one. ``method``
    (JAX's choice of factorization) is accepted; LAPACK's LU is used either way.

    >>> slogdet(asarray([[-2.0, 0.0], [0.0, 3.0]])).sign.item()
    -1.0
    """
    sign, logabsdet = bind(P.slogdet_p, _matrices(x, "slogdet"))
    return SlogdetResult(sign, logabsdet)


def det(x: ArrayLike, /) -> Tensor:
    """The determinant, sign * exp(logabsdet) (so it neither overflows nor loses sign halfway); its
    gradient det * inv(x)^T is NaN at a singular matrix.

    >>> round(det(asarray([[1.0, 2.0], [3.0, 4.0]])).item(), 5)
    -2.0
    """
    sign, logabsdet = slogdet(x)
    return multiply(sign, exp(logabsdet))


def eigh(x: ArrayLike, /, UPLO: str | None = None, symmetrize_input: bool = True) -> EighResult:  # noqa: N803
    """Eigenvalues (ascending) and eigenvectors (columns) of symmetric matrices. The symmetric part
    (x + x^T) / 2 is read (JAX's default); with ``symmetrize_input=False`` the triangle ``UPLO``
    names ('L', the default, or 'U'). The eigenvectors' derivative drops the terms of repeated
    eigenvalues, whose eigenvectors are not unique (JAX gives infinities there).

    >>> eigh(asarray([[2.0, 0.0], [0.0, 1.0]])).eigenvalues.tolist()
    [1.0, 2.0]
    """
    if UPLO not in (None, "L", "U"):
        raise ValueError(f"linalg.eigh: UPLO must be 'L' or 'U', got {UPLO!r}")
    a = _matrices(x, "eigh")
    if not symmetrize_input:
        a = _from_triangle(a, lower=UPLO != "U")
    eigenvalues, eigenvectors = bind(P.eigh_p, a)
    return EighResult(eigenvalues, eigenvectors)


def eigvalsh(x: ArrayLike, /, UPLO: str | None = None, symmetrize_input: bool = True) -> Tensor:  # noqa: N803
    """The eigenvalues (ascending) of symmetric matrices (see ``eigh``).

    >>> eigvalsh(asarray([[2.0, 0.0], [0.0, 1.0]])).tolist()
    [1.0, 2.0]
    """
    return eigh(x, UPLO, symmetrize_input).eigenvalues


def qr(x: ArrayLike, /, *, mode: str = "reduced") -> Any:
    """Q with orthonormal columns and upper-triangular R with x = Q R. ``mode``: 'reduced' (Q is
    (M, K), R (K, N), K = min(M, N)), 'complete' (Q is (M, M)) or NumPy's 'r' (R alone).

    >>> [round(v, 5) for v in qr(asarray([[3.0], [4.0]])).R.ravel().tolist()]
    [-5.0]
    """
    if mode not in ("reduced", "complete", "r"):
        raise ValueError(f"linalg.qr: mode must be 'reduced', 'complete' or 'r', got {mode!r}")
    q, r = bind(P.qr_p, _matrices(x, "qr", square=False), full_matrices=mode == "complete")
    return r if mode == "r" else QRResult(q, r)


def svd(x: ArrayLike, /, full_matrices: bool = True, compute_uv: bool = True, hermitian: bool = False) -> Any:
    """Singular value decomposition x = U diag(S) Vh, S descending. ``full_matrices=True`` (the
    default, as in NumPy, JAX and the standard) gives square U and Vh; the derivative needs
    ``full_matrices=False`` unless x is square. ``compute_uv=False`` returns S alone. ``hermitian``
    is accepted for NumPy/JAX compatibility (the general SVD is used).

    >>> svd(asarray([[3.0, 0.0], [0.0, -4.0]])).S.tolist()
    [4.0, 3.0]
    """
    a = _matrices(x, "svd", square=False)
    if not compute_uv:
        return svdvals(a)
    u, s, vh = bind(P.svd_p, a, full_matrices=bool(full_matrices), compute_uv=True)
    return SVDResult(u, s, vh)


def svdvals(x: ArrayLike, /) -> Tensor:
    """The singular values, descending. >>> svdvals(asarray([[3.0, 0.0], [0.0, -4.0]])).tolist()  # [4.0, 3.0]"""
    (s,) = bind(P.svd_p, _matrices(x, "svdvals", square=False), full_matrices=False, compute_uv=False)
    return s


def _cutoff(s: Tensor, shape: tuple[int, ...], rtol: ArrayLike | None) -> Tensor:
    """rtol * largest singular value, per matrix, shaped to compare with ``s``; the default rtol is
    max(M, N) * eps, as in NumPy, JAX and the standard."""
    if rtol is None:
        rtol = max(shape[-2:]) * float(np.finfo(s.dtype).eps)
    rtol = asarray(rtol, dtype=s.dtype)
    return multiply(expand_dims(rtol, -1), max_(s, axis=-1, keepdims=True))


def pinv(x: ArrayLike, /, rtol: ArrayLike | None = None, *, hermitian: bool = False) -> Tensor:
    """The Moore-Penrose pseudo-inverse V diag(1/S) U^T, dropping singular values at or below
    rtol * max(S). ``hermitian`` is accepted for NumPy/JAX compatibility (the SVD is used either way).

    >>> pinv(asarray([[2.0, 0.0], [0.0, 0.0]])).tolist()
    [[0.5, 0.0], [0.0, 0.0]]
    """
    a = _matrices(x, "pinv", square=False)
    if 0 in a.shape[-2:]:
        return matrix_transpose(a)
    u, s, vh = bind(P.svd_p, a, full_matrices=False, compute_uv=True)
    keep = greater(s, _cutoff(s, a.shape, rtol))
    inverse_s = where(keep, 1.0 / where(keep, s, 1.0), 0.0)  # no 1/0 even in the branch not taken
    return matmul(matrix_transpose(vh) * expand_dims(inverse_s, -2), matrix_transpose(u))


def matrix_rank(x: ArrayLike, /, *, rtol: ArrayLike | None = None, tol: ArrayLike | None = None) -> Tensor:
    """The number of singular values above rtol * max(S) (or above the absolute ``tol``, NumPy's name).

    >>> matrix_rank(asarray([[1.0, 2.0], [2.0, 4.0]])).item()
    1
    """
    a = _matrices(x, "matrix_rank", square=False)
    if a.ndim < 2:
        raise ValueError(f"linalg.matrix_rank needs matrices, got shape {a.shape}")
    s = svdvals(a)
    threshold = expand_dims(asarray(tol, dtype=s.dtype), -1) if tol is not None else _cutoff(s, a.shape, rtol)
    return sum_(astype(greater(s, threshold), dtypes.default_int), axis=-1)


def matrix_power(x: ArrayLike, n: int, /) -> Tensor:
    """x multiplied by itself n times (by repeated squaring); n = 0 gives the identity and n < 0
    powers of the inverse.

    >>> matrix_power(asarray([[1, 1], [0, 1]]), 3).tolist()
    [[1, 3], [0, 1]]
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise TypeError(f"linalg.matrix_power: the exponent must be an integer, got {n!r}")
    a = asarray(x)
    if a.ndim < 2 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"linalg.matrix_power needs square matrices in the last two axes, got shape {a.shape}")
    if n == 0:
        return broadcast_to(eye(a.shape[-1], dtype=a.dtype), a.shape)
    if n < 0:
        a, n = inv(a), -n
    result: Tensor | None = None
    square = a
    while n:
        if n & 1:
            result = square if result is None else matmul(result, square)
        n >>= 1
        if n:
            square = matmul(square, square)
    assert result is not None
    return result


def cross(x1: ArrayLike, x2: ArrayLike, /, *, axis: int = -1) -> Tensor:
    """The cross product of 3-vectors along ``axis`` (the other axes broadcast).

    >>> cross(asarray([1.0, 0.0, 0.0]), asarray([0.0, 1.0, 0.0])).tolist()
    [0.0, 0.0, 1.0]
    """
    a, b = asarray(x1), asarray(x2)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"linalg.cross needs arrays of rank >= 1, got shapes {a.shape} and {b.shape}")
    ndim = max(a.ndim, b.ndim)
    if not -ndim <= axis < ndim or not (-a.ndim <= axis < a.ndim and -b.ndim <= axis < b.ndim):
        raise ValueError(f"linalg.cross: axis {axis} is out of range for shapes {a.shape} and {b.shape}")
    if a.shape[axis] != 3 or b.shape[axis] != 3:
        raise ValueError(f"linalg.cross needs size 3 along axis {axis}, got shapes {a.shape} and {b.shape}")
    shape = broadcast_shapes(a.shape, b.shape)
    position = axis % ndim
    a, b = broadcast_to(a, shape), broadcast_to(b, shape)

    def part(v: Tensor, i: int) -> Tensor:
        return v[(slice(None),) * position + (i,)]

    components = [subtract(multiply(part(a, (i + 1) % 3), part(b, (i + 2) % 3)),
                           multiply(part(a, (i + 2) % 3), part(b, (i + 1) % 3))) for i in range(3)]
    return stack(components, axis=position)


class LstsqResult(NamedTuple):
    solution: Tensor
    residuals: Tensor
    rank: Tensor
    singular_values: Tensor


def lstsq(a: ArrayLike, b: ArrayLike, rcond: float | None = None) -> LstsqResult:
    """The least-squares solution of a x = b (b a vector or columns) through the pseudo-inverse,
    with NumPy's other results: residuals (the squared 2-norms of b - a x per column when a has more
    rows than columns, 0 where it lacks full column rank; empty otherwise), rank and singular values.

    >>> [round(v, 5) for v in lstsq(asarray([[1.0], [1.0]]), asarray([1.0, 3.0])).solution.tolist()]
    [2.0]
    """
    matrix = _matrices(a, "lstsq", square=False)
    rhs = astype(asarray(b), matrix.dtype)
    if matrix.ndim != 2 or rhs.ndim not in (1, 2) or rhs.shape[0] != matrix.shape[0]:
        raise ValueError(f"linalg.lstsq needs a of shape (M, N) and b of shape (M,) or (M, K), got "
                         f"{matrix.shape} and {rhs.shape}")
    m, n = matrix.shape
    rtol = None if rcond is None or rcond < 0 else rcond
    solution = matmul(pinv(matrix, rtol), rhs)
    values = svdvals(matrix)
    rank = matrix_rank(matrix, rtol=rtol)
    residual = subtract(rhs, matmul(matrix, solution))
    squared = sum_(multiply(residual, residual), axis=0)
    if m > n:  # where a lacks full column rank the residuals are 0 (a static shape under jit, as JAX)
        residuals = where(rank == n, squared, 0.0)
        residuals = reshape(residuals, (1,)) if rhs.ndim == 1 else residuals
    else:
        residuals = reshape(squared, (-1,))[:0]
    return LstsqResult(solution, residuals, rank, values)


def multi_dot(arrays: Any, /) -> Tensor:
    """The product of a sequence of matrices (first and last may be vectors), left to right.

    >>> multi_dot([asarray([1.0, 2.0]), asarray([[1.0], [1.0]])]).tolist()
    [3.0]
    """
    operands = list(arrays)
    if len(operands) < 2:
        raise ValueError(f"linalg.multi_dot needs at least two arrays, got {len(operands)}")
    out = asarray(operands[0])
    for operand in operands[1:]:
        out = matmul(out, operand)
    return out


def cond(x: ArrayLike, p: Any = None) -> Tensor:
    """The condition number: largest over smallest singular value (p None or 2), their inverse ratio
    for p = -2, else norm(x, p) * norm(inv(x), p).

    >>> cond(asarray([[2.0, 0.0], [0.0, 0.5]])).item()
    4.0
    """
    a = _matrices(x, "cond", square=p not in (None, 2, -2))
    if p in (None, 2, -2):
        values = svdvals(a)
        largest, smallest = values[..., 0], values[..., -1]
        return largest / smallest if p != -2 else smallest / largest
    return multiply(matrix_norm(a, ord=p), matrix_norm(inv(a), ord=p))


def diagonal(x: ArrayLike, /, *, offset: int = 0) -> Tensor:
    """The ``offset``-th diagonal of the matrices in the last two axes. >>> diagonal(asarray([[1, 2], [3, 4]]))"""
    return products.diagonal(x, offset, -2, -1)


def trace(x: ArrayLike, /, *, offset: int = 0, dtype: Any = None) -> Tensor:
    """Sums of the ``offset``-th diagonals of the matrices in the last two axes.

    >>> trace(asarray([[1, 2], [3, 4]])).item()
    5
    """
    return products.trace(x, offset, -2, -1, dtype)


__all__ = [
    "EighResult", "LstsqResult", "QRResult", "SVDResult", "SlogdetResult", "cholesky", "cond", "cross", "det",
    "diagonal", "eigh", "eigvalsh", "inv", "lstsq", "matmul", "multi_dot", "matrix_norm", "matrix_power",
    "matrix_rank", "matrix_transpose", "norm", "outer", "pinv", "qr", "slogdet", "solve", "svd", "svdvals",
    "tensordot", "trace", "vecdot", "vector_norm",
]
