"""Linear algebra: matmul, tensordot, vecdot, einsum and friends, built on ``dot_general``.

``dot_general`` contracts chosen axes of two operands with optional batch axes (XLA's
DotGeneral); everything here arranges its operands into that form.
"""

from __future__ import annotations

from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import ArrayLike, asarray, broadcast_shapes, broadcast_to, promote
from funcgrad.numpy.manipulation import reshape
from funcgrad.tensor import Tensor, bind


def _promoted_pair(x1: ArrayLike, x2: ArrayLike, name: str) -> tuple[Tensor, Tensor]:
    (a, b), dtype, _ = promote(asarray(x1), asarray(x2))
    if dtypes.is_bool(dtype):
        a, b = (bind(P.convert_element_type_p, t, new_dtype=dtypes.default_int) for t in (a, b))
    return a, b


def matmul(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Matrix product with NumPy's rules: 1-d operands are promoted to matrices and the added axis
    removed afterwards; leading (batch) axes broadcast.

    >>> matmul(asarray([[1.0, 2.0]]), asarray([[3.0], [4.0]])).tolist()
    [[11.0]]
    """
    a, b = _promoted_pair(x1, x2, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul needs arrays of rank >= 1, got shapes {a.shape} and {b.shape}; use * for scalars")
    squeeze_front, squeeze_back = a.ndim == 1, b.ndim == 1
    if squeeze_front:
        a = reshape(a, (1, a.shape[0]))
    if squeeze_back:
        b = reshape(b, (b.shape[0], 1))
    if a.shape[-1] != b.shape[-2]:
        raise ValueError(f"matmul: shapes {asarray(x1).shape} and {asarray(x2).shape} do not align "
                         f"({a.shape[-1]} != {b.shape[-2]})")
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    a = broadcast_to(a, batch + a.shape[-2:])
    b = broadcast_to(b, batch + b.shape[-2:])
    nb = len(batch)
    out = bind(P.dot_general_p, a, b, contracting=((nb + 1,), (nb,)),
               batch=(tuple(range(nb)), tuple(range(nb))))
    if squeeze_front:
        out = reshape(out, out.shape[:-2] + out.shape[-1:])
    if squeeze_back:
        out = reshape(out, out.shape[:-1])
    return out


# every public function defined above (aliases included) is part of funcgrad.numpy
__all__ = [name for name, value in list(globals().items())
           if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == __name__]
