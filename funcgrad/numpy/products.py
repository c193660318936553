"""Products and norms: matmul, tensordot, vecdot, einsum, dot, outer, trace, diagonal, kron and norms.

Products are built on ``dot_general``, which contracts chosen axes of two operands with optional
batch axes (XLA's DotGeneral; output axes: batch, then lhs free, then rhs free); everything here
arranges its operands into that form. Operands are promoted to one dtype first; bool products are
computed in int32 and turned back into bool (an OR of ANDs), as JAX returns them.
``diagonal`` gathers the (i, i + offset) pairs with an iota-built index array: one gather, no
mask-and-sum over the whole matrix. Norms use sums, maxima and square roots, and the singular values
(the ``svd`` primitive) for the matrix norms ord=2, -2 and 'nuc'. The decompositions and the
standard's ``linalg`` namespace are in ``funcgrad/numpy/linalg.py``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import (
    ArrayLike,
    asarray,
    astype,
    broadcast_shapes,
    broadcast_to,
    normalize_axes,
    normalize_axis,
    promote,
)
from funcgrad.numpy.elementwise import abs as abs_
from funcgrad.numpy.elementwise import conj, multiply, not_equal, power, sqrt, where
from funcgrad.numpy.manipulation import concat, moveaxis, permute_dims, ravel, reshape
from funcgrad.numpy.reductions import max as max_
from funcgrad.numpy.reductions import min as min_
from funcgrad.numpy.reductions import sum as sum_


def _promoted(*operands: ArrayLike) -> tuple[list[Tensor], bool]:
    """Promote to one dtype; bools become int32 (returns whether to turn the result back to bool)."""
    values, dtype, _ = promote(*(asarray(x) for x in operands))
    if dtypes.is_bool(dtype):
        return [astype(v, dtypes.default_int) for v in values], True
    return list(values), False


def _as_result(out: Tensor, was_bool: bool) -> Tensor:
    return not_equal(out, 0) if was_bool else out


def _dot(lhs: Tensor, rhs: Tensor, contracting: tuple[Sequence[int], Sequence[int]],
         batch: tuple[Sequence[int], Sequence[int]] = ((), ())) -> Tensor:
    return bind(P.dot_general_p, lhs, rhs, contracting=(tuple(contracting[0]), tuple(contracting[1])),
                batch=(tuple(batch[0]), tuple(batch[1])))


def matmul(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Matrix product with NumPy's rules: 1-d operands are promoted to matrices and the added axis
    removed afterwards; leading (batch) axes broadcast.

    >>> matmul(asarray([[1.0, 2.0]]), asarray([[3.0], [4.0]])).tolist()
    [[11.0]]
    """
    (a, b), was_bool = _promoted(x1, x2)
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul needs arrays of rank >= 1, got shapes {a.shape} and {b.shape}; "
                         "use * for scalars")
    squeeze_front, squeeze_back = a.ndim == 1, b.ndim == 1
    if squeeze_front:
        a = reshape(a, (1, a.shape[0]))
    if squeeze_back:
        b = reshape(b, (b.shape[0], 1))
    if a.shape[-1] != b.shape[-2]:  # a TypeError, as JAX's dot_general raises
        raise TypeError(f"matmul: shapes {asarray(x1).shape} and {asarray(x2).shape} do not align "
                        f"({a.shape[-1]} != {b.shape[-2]})")
    try:
        batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    except ValueError:
        raise ValueError(f"matmul: the batch dimensions {a.shape[:-2]} and {b.shape[:-2]} of shapes "
                         f"{asarray(x1).shape} and {asarray(x2).shape} do not broadcast") from None
    if batch and b.ndim == 2:  # (..., m, k) @ (k, n): one product over every row, no broadcast copy of b
        # (its gradient for b is then one product summed over the batch axes too, as jnp.matmul's)
        out = bind(P.dot_general_p, a, b, contracting=((a.ndim - 1,), (0,)), batch=((), ()))
        return _as_result(reshape(out, out.shape[:-1]) if squeeze_back else out, was_bool)
    a = broadcast_to(a, batch + a.shape[-2:])
    b = broadcast_to(b, batch + b.shape[-2:])
    nb = len(batch)
    out = bind(P.dot_general_p, a, b, contracting=((nb + 1,), (nb,)),
               batch=(tuple(range(nb)), tuple(range(nb))))
    if squeeze_front:
        out = reshape(out, out.shape[:-2] + out.shape[-1:])
    if squeeze_back:
        out = reshape(out, out.shape[:-1])
    return _as_result(out, was_bool)


def tensordot(x1: ArrayLike, x2: ArrayLike, /,
              axes: int | tuple[Sequence[int], Sequence[int]] = 2) -> Tensor:
    """Contract the last ``axes`` axes of ``x1`` with the first ones of ``x2``, or the listed pairs;
    ``axes`` may be passed by position, as NumPy and JAX allow (``tensordot(a, b, 2)``).

    >>> tensordot(asarray([[1.0, 2.0]]), asarray([[3.0], [4.0]]), axes=1).tolist()
    [[11.0]]
    """
    (a, b), was_bool = _promoted(x1, x2)
    if isinstance(axes, (int, np.integer)) and not isinstance(axes, bool):
        if not 0 <= axes <= min(a.ndim, b.ndim):
            raise ValueError(f"tensordot: axes={axes} must lie in [0, {min(a.ndim, b.ndim)}] for shapes "
                             f"{a.shape} and {b.shape}")
        a_axes, b_axes = tuple(range(a.ndim - axes, a.ndim)), tuple(range(axes))
    elif isinstance(axes, (tuple, list)) and len(axes) == 2:
        a_axes = normalize_axes(axes[0], a.ndim)
        b_axes = normalize_axes(axes[1], b.ndim)
        if len(a_axes) != len(b_axes):
            raise ValueError(f"tensordot: axes {axes} must name as many axes of each operand")
    else:
        raise TypeError(f"tensordot: axes must be an int or a pair of axis sequences, got {axes!r}")
    for i, j in zip(a_axes, b_axes):
        if a.shape[i] != b.shape[j]:
            raise TypeError(f"tensordot: axis {i} of shape {a.shape} and axis {j} of shape {b.shape} "
                            f"differ in size ({a.shape[i]} != {b.shape[j]})")
    return _as_result(_dot(a, b, (a_axes, b_axes)), was_bool)


def vecdot(x1: ArrayLike, x2: ArrayLike, /, *, axis: int = -1) -> Tensor:
    """Dot products of vectors along ``axis``, broadcasting the other axes (the Array API's vecdot).

    >>> vecdot(asarray([[1.0, 2.0], [3.0, 4.0]]), asarray([1.0, 1.0])).tolist()
    [3.0, 7.0]
    """
    (a, b), was_bool = _promoted(x1, x2)
    shape = broadcast_shapes(a.shape, b.shape)
    if not shape:
        raise ValueError("vecdot needs arrays of rank >= 1, got two 0-d arrays")
    axis = normalize_axis(axis, len(shape))
    sizes = [t.shape[axis - len(shape) + t.ndim] if axis - len(shape) + t.ndim >= 0 else None for t in (a, b)]
    if sizes[0] != sizes[1]:
        raise ValueError(f"vecdot: shapes {a.shape} and {b.shape} differ along axis {axis - len(shape)} "
                         f"({sizes[0]} != {sizes[1]}); that axis does not broadcast")
    a, b = (moveaxis(broadcast_to(t, shape), axis, -1) for t in (a, b))
    a = conj(a)  # the Array API's vecdot conjugates its first argument (as JAX's)
    batch = tuple(range(len(shape) - 1))
    return _as_result(_dot(a, b, ((len(shape) - 1,), (len(shape) - 1,)), (batch, batch)), was_bool)


def outer(a: ArrayLike, b: ArrayLike, /) -> Tensor:
    """Outer product of two vectors (inputs are flattened).

    >>> outer(asarray([1, 2]), asarray([3])).tolist()
    [[3], [6]]
    """
    (x, y), was_bool = _promoted(a, b)
    return _as_result(_dot(ravel(x), ravel(y), ((), ())), was_bool)


def inner(a: ArrayLike, b: ArrayLike, /) -> Tensor:
    """Sum of products over the last axes (scalars multiply). Shape: a.shape[:-1] + b.shape[:-1]."""
    (x, y), was_bool = _promoted(a, b)
    if x.ndim == 0 or y.ndim == 0:
        return _as_result(multiply(x, y), was_bool)
    if x.shape[-1] != y.shape[-1]:
        raise TypeError(f"inner: last dimensions of shapes {x.shape} and {y.shape} differ")
    return _as_result(_dot(x, y, ((x.ndim - 1,), (y.ndim - 1,))), was_bool)


def dot(a: ArrayLike, b: ArrayLike, /) -> Tensor:
    """NumPy's dot: scalars multiply, 1-d with 1-d is the inner product, otherwise the last axis of
    ``a`` is contracted with the second-to-last of ``b`` (its only one if ``b`` is 1-d).

    >>> dot(asarray([[1, 2], [3, 4]]), asarray([1, 1])).tolist()
    [3, 7]
    """
    (x, y), was_bool = _promoted(a, b)
    if x.ndim == 0 or y.ndim == 0:
        return _as_result(multiply(x, y), was_bool)
    y_axis = 0 if y.ndim == 1 else y.ndim - 2
    if x.shape[-1] != y.shape[y_axis]:  # a TypeError, as JAX's
        raise TypeError(f"dot: shapes {x.shape} and {y.shape} are not aligned "
                        f"({x.shape[-1]} (dim {x.ndim - 1}) != {y.shape[y_axis]} (dim {y_axis}))")
    return _as_result(_dot(x, y, ((x.ndim - 1,), (y_axis,))), was_bool)


def vdot(a: ArrayLike, b: ArrayLike, /) -> Tensor:
    """Dot product of the flattened inputs. >>> vdot(asarray([[1, 2]]), asarray([3, 4])).item()  # 11"""
    (x, y), was_bool = _promoted(a, b)
    x = conj(x)  # the first is conjugated, as NumPy and JAX
    if x.size != y.size:
        raise TypeError(f"vdot needs inputs of one size, got shapes {x.shape} and {y.shape}")
    return _as_result(_dot(ravel(x), ravel(y), ((0,), (0,))), was_bool)


def diagonal(a: ArrayLike, offset: int = 0, axis1: int = 0, axis2: int = 1) -> Tensor:
    """The ``offset``-th diagonal of the (axis1, axis2) planes, as a new last axis (NumPy's rule).

    Built as one gather of the index pairs (i, i + offset) (or (i - offset, i) below the main
    diagonal), made with iota, so it costs one read per diagonal element.
    >>> diagonal(asarray([[1, 2], [3, 4]])).tolist()
    [1, 4]
    """
    x = asarray(a)
    if x.ndim < 2:
        raise ValueError(f"diagonal needs an array of rank >= 2, got shape {x.shape}")
    first, second = normalize_axis(axis1, x.ndim, "axis1"), normalize_axis(axis2, x.ndim, "axis2")
    if first == second:
        raise ValueError(f"diagonal: axis1 and axis2 must differ, both are {first}")
    rows, cols = x.shape[first], x.shape[second]
    row_start, col_start = (0, offset) if offset >= 0 else (-offset, 0)
    length = max(0, min(rows - row_start, cols - col_start))
    steps = bind(P.iota_p, dtype=dtypes.int32, shape=(length, 1), dimension=0)
    indices = concat([steps + np.int32(row_start), steps + np.int32(col_start)], axis=1)
    return moveaxis(bind(P.gather_p, x, indices, axes=(first, second)), 0, -1)


def trace(a: ArrayLike, offset: int = 0, axis1: int = 0, axis2: int = 1, dtype: Any = None) -> Tensor:
    """Sum of a diagonal (see ``diagonal``); integer sums widen as ``sum`` does.

    >>> trace(asarray([[1, 2], [3, 4]])).item()
    5
    """
    return sum_(diagonal(a, offset, axis1, axis2), axis=-1, dtype=dtype)


def kron(a: ArrayLike, b: ArrayLike, /) -> Tensor:
    """Kronecker product: blocks ``a[i, j] * b``.

    >>> kron(asarray([1, 2]), asarray([1, 10])).tolist()
    [1, 10, 2, 20]
    """
    (x, y), was_bool = _promoted(a, b)
    ndim = max(x.ndim, y.ndim)
    x = reshape(x, (1,) * (ndim - x.ndim) + x.shape)
    y = reshape(y, (1,) * (ndim - y.ndim) + y.shape)
    interleaved_x = reshape(x, tuple(d for size in x.shape for d in (size, 1)))
    interleaved_y = reshape(y, tuple(d for size in y.shape for d in (1, size)))
    product = multiply(interleaved_x, interleaved_y)  # shape (x0, y0, x1, y1, ...)
    return _as_result(reshape(product, tuple(m * n for m, n in zip(x.shape, y.shape))), was_bool)


# --- einsum ------------------------------------------------------------------------------------


def _parse_einsum(subscripts: str, shapes: Sequence[tuple[int, ...]]) -> tuple[list[list[str]], list[str]]:
    """Label lists per operand and for the output; ``...`` becomes labels ``"...0"``, ``"...1"``, ...
    counted from the right, so ellipsis axes broadcast right-aligned as NumPy does."""
    spec = subscripts.replace(" ", "")
    inputs_spec, arrow, output_spec = spec.partition("->")
    specs = inputs_spec.split(",")
    if len(specs) != len(shapes):
        raise ValueError(f"einsum: {subscripts!r} names {len(specs)} operands but {len(shapes)} were given")

    def labels_of(term: str, ndim: int | None) -> list[str]:
        before, dots, after = term.partition("...")
        for char in before + after:
            if not char.isalpha():
                raise ValueError(f"einsum: invalid subscript {char!r} in {subscripts!r} "
                                 "(use letters and ...)")
        if not dots:
            if ndim is not None and len(term) != ndim:
                raise ValueError(f"einsum: {term!r} has {len(term)} subscripts for an operand of rank {ndim}")
            return list(term)
        rank = ellipsis_rank if ndim is None else ndim - len(before) - len(after)
        if rank < 0:
            raise ValueError(f"einsum: {term!r} has too many subscripts for an operand of rank {ndim}")
        return list(before) + [f"...{k}" for k in reversed(range(rank))] + list(after)

    ellipsis_rank = 0
    inputs = []
    for term, shape in zip(specs, shapes):
        inputs.append(labels_of(term, len(shape)))
        ellipsis_rank = max(ellipsis_rank, sum(label.startswith("...") for label in inputs[-1]))
    if arrow:
        output = labels_of(output_spec, None)
        seen = {label for labels in inputs for label in labels}
        for label in output:
            if label not in seen and not label.startswith("..."):
                raise ValueError(f"einsum: output subscript {label!r} does not appear in the inputs "
                                 f"of {subscripts!r}")
        if len(set(output)) != len(output):
            raise ValueError(f"einsum: repeated output subscript in {subscripts!r}")
    else:  # implicit: ellipsis axes first, then the labels seen exactly once, alphabetically
        counts: dict[str, int] = {}
        for labels in inputs:
            for label in labels:
                counts[label] = counts.get(label, 0) + 1
        output = [f"...{k}" for k in reversed(range(ellipsis_rank))]
        output += sorted(label for label, n in counts.items() if n == 1 and not label.startswith("..."))
    return inputs, output


def _sum_labels(x: Tensor, labels: list[str], drop: set[str]) -> tuple[Tensor, list[str]]:
    axes = tuple(i for i, label in enumerate(labels) if label in drop)
    if not axes:
        return x, labels
    return sum_(x, axis=axes, dtype=x.dtype), [label for label in labels if label not in drop]


def _diagonals(x: Tensor, labels: list[str]) -> tuple[Tensor, list[str]]:
    """Merge repeated labels of one operand (``ii`` -> the diagonal) until all are distinct."""
    while len(set(labels)) != len(labels):
        label = next(lab for lab in labels if labels.count(lab) > 1)
        first = labels.index(label)
        second = labels.index(label, first + 1)
        if x.shape[first] != x.shape[second]:
            raise ValueError(f"einsum: repeated subscript {label!r} labels axes of sizes "
                             f"{x.shape[first]} and {x.shape[second]}")
        x = diagonal(x, 0, first, second)
        labels = [lab for i, lab in enumerate(labels) if i not in (first, second)] + [label]
    return x, labels


def _positions(names: list[str], lhs_labels: list[str], rhs_labels: list[str]) -> tuple[list[int], list[int]]:
    return [lhs_labels.index(name) for name in names], [rhs_labels.index(name) for name in names]


def einsum(subscripts: str, /, *operands: ArrayLike, optimize: Any = None) -> Tensor:
    """Einstein summation, e.g. ``einsum("ij,jk->ik", a, b)``; implicit outputs, repeated subscripts
    within an operand (diagonals, traces) and ``...`` are supported.

    Operands are contracted pairwise from left to right with ``dot_general``: labels shared by
    the pair and still needed later become batch axes, the others are contracted; labels no
    later operand or the output uses are summed out first. ``optimize`` is accepted and ignored.
    >>> einsum("ii", asarray([[1, 2], [3, 4]])).item()
    5
    """
    if not isinstance(subscripts, str):
        raise TypeError(f"einsum takes the subscripts string first, got {type(subscripts).__name__}")
    if not operands:
        raise ValueError("einsum needs at least one operand")
    tensors, was_bool = _promoted(*operands)
    all_labels, output = _parse_einsum(subscripts, [t.shape for t in tensors])
    terms = [_diagonals(t, labels) for t, labels in zip(tensors, all_labels)]

    sizes: dict[str, int] = {}  # ellipsis axes broadcast (1 against n); lettered axes must agree
    for x, labels in terms:
        for label, size in zip(labels, x.shape):
            known = sizes.setdefault(label, size)
            if known == size:
                continue
            if not (label.startswith("...") and 1 in (known, size)):
                what = "ellipsis axes" if label.startswith("...") else f"subscript {label!r}"
                raise ValueError(f"einsum: {what} of sizes {known} and {size} do not match in {subscripts!r} "
                                 f"(shapes {[t.shape for t in tensors]})")
            sizes[label] = max(known, size)
    terms = [(broadcast_to(x, tuple(sizes[label] for label in labels)), labels) for x, labels in terms]

    x, labels = terms[0]
    for position, (y, y_labels) in enumerate(terms[1:], start=1):
        needed = set(output).union(*(set(lab) for _, lab in terms[position + 1:]))
        x, labels = _sum_labels(x, labels, set(labels) - set(y_labels) - needed)
        y, y_labels = _sum_labels(y, y_labels, set(y_labels) - set(labels) - needed)
        shared = [label for label in labels if label in y_labels]
        batch = [label for label in shared if label in needed]
        contracted = [label for label in shared if label not in needed]
        x = _dot(x, y, _positions(contracted, labels, y_labels), _positions(batch, labels, y_labels))
        labels = (batch + [lab for lab in labels if lab not in shared]
                  + [lab for lab in y_labels if lab not in shared])
    x, labels = _sum_labels(x, labels, set(labels) - set(output))
    return _as_result(permute_dims(x, [labels.index(label) for label in output]), was_bool)


# --- norms -------------------------------------------------------------------------------------


def _float(x: ArrayLike) -> Tensor:
    x = asarray(x)
    return x if dtypes.is_inexact(x.dtype) else astype(x, dtypes.default_float)


def vector_norm(x: ArrayLike, /, *, axis: int | tuple[int, ...] | None = None, keepdims: bool = False,
                ord: float = 2) -> Tensor:  # noqa: A002
    """The ``ord``-norm of the vectors along ``axis`` (all axes by default): ord 2 (default), 1,
    inf, -inf, 0 (count of nonzeros) or any other p as ``sum(|x|**p) ** (1/p)``.

    >>> vector_norm(asarray([3.0, 4.0])).item()
    5.0
    """
    x = _float(x)
    if isinstance(ord, (str, bool)):
        raise ValueError(f"vector_norm: ord must be a number, got {ord!r}")
    magnitude = abs_(x)
    if ord == math.inf:
        return max_(magnitude, axis=axis, keepdims=keepdims)
    if ord == -math.inf:
        return min_(magnitude, axis=axis, keepdims=keepdims)
    if ord == 0:
        return sum_(astype(not_equal(x, 0), magnitude.dtype), axis=axis, keepdims=keepdims)
    if ord == 1:
        return sum_(magnitude, axis=axis, keepdims=keepdims)
    if ord == 2:
        square = multiply(magnitude, magnitude) if dtypes.is_complex(x.dtype) else multiply(x, x)
        return _root(sum_(square, axis=axis, keepdims=keepdims), 2.0)
    return _root(sum_(power(magnitude, float(ord)), axis=axis, keepdims=keepdims), float(ord))


def _root(total: Tensor, degree: float) -> Tensor:
    """``total ** (1 / degree)`` whose gradient at a zero total is 0 (PyTorch's subgradient), not the
    0 * inf = NaN of the plain root (JAX's behaviour): the root is taken of 1 where the total is 0."""
    nonzero = not_equal(total, 0)  # NaN and inf totals take the root, so they come out as NaN and inf
    safe = where(nonzero, total, 1.0)
    return where(nonzero, sqrt(safe) if degree == 2.0 else power(safe, 1.0 / degree), 0.0)


def _singular_values(x: Tensor, rows: int, cols: int) -> Tensor:
    """The singular values of the (rows, cols) planes, in a new last axis."""
    (values,) = bind(P.svd_p, moveaxis(x, (rows, cols), (-2, -1)), full_matrices=False, compute_uv=False)
    return values


def _matrix_norm(x: Tensor, rows: int, cols: int, ord: Any, keepdims: bool) -> Tensor:  # noqa: A002
    if ord in (2, -2, "nuc"):  # the largest, smallest or the sum of the singular values
        values = _singular_values(x, rows, cols)
        out = (max_ if ord == 2 else min_ if ord == -2 else sum_)(values, axis=-1)
        if keepdims:
            out = reshape(out, tuple(1 if i in (rows, cols) else d for i, d in enumerate(x.shape)))
        return out
    if ord == "fro":
        magnitude = abs_(x) if dtypes.is_complex(x.dtype) else x
        out = _root(sum_(multiply(magnitude, magnitude), axis=(rows, cols), keepdims=True), 2.0)
    elif ord in (1, -1, math.inf, -math.inf):
        summed_axis, extremum_axis = (rows, cols) if ord in (1, -1) else (cols, rows)
        totals = sum_(abs_(x), axis=summed_axis, keepdims=True)
        pick = max_ if ord in (1, math.inf) else min_
        out = pick(totals, axis=extremum_axis, keepdims=True)
    else:
        raise ValueError(f"invalid matrix norm order {ord!r}; expected 'fro', 1, -1, inf or -inf")
    if keepdims:
        return out
    return reshape(out, tuple(d for i, d in enumerate(out.shape) if i not in (rows, cols)))


def matrix_norm(x: ArrayLike, /, *, keepdims: bool = False, ord: Any = "fro") -> Tensor:  # noqa: A002
    """Norm of the matrices in the last two axes: 'fro' (default), 1 / -1 (max / min column sum),
    inf / -inf (max / min row sum), 2 / -2 (largest / smallest singular value), 'nuc' (their sum).

    >>> matrix_norm(asarray([[1.0, -2.0], [3.0, 4.0]]), ord=1).item()
    6.0
    """
    x = _float(x)
    if x.ndim < 2:
        raise ValueError(f"matrix_norm needs an array of rank >= 2, got shape {x.shape}")
    return _matrix_norm(x, x.ndim - 2, x.ndim - 1, ord, keepdims)


def norm(x: ArrayLike, ord: Any = None, axis: int | tuple[int, ...] | None = None,
         keepdims: bool = False) -> Tensor:  # noqa: A002
    """NumPy's ``linalg.norm``: a vector norm over one axis, a matrix norm over two, and for
    ``axis=None`` the 2-norm of the flattened array (or the ``ord`` norm of a 1-d/2-d array).

    >>> norm(asarray([[3.0, 0.0], [0.0, 4.0]])).item()
    5.0
    """
    x = _float(x)
    if axis is None:
        if ord is None:
            return vector_norm(x, keepdims=keepdims)
        if x.ndim not in (1, 2):
            raise ValueError(f"norm with ord={ord!r} and axis=None needs a 1-d or 2-d array, "
                             f"got shape {x.shape}")
        axis = tuple(range(x.ndim))
    axes = normalize_axes(axis, x.ndim)
    if len(axes) == 1:
        return vector_norm(x, axis=axes[0], keepdims=keepdims, ord=2 if ord is None else ord)
    if len(axes) == 2:
        return _matrix_norm(x, axes[0], axes[1], "fro" if ord is None else ord, keepdims)
    raise ValueError(f"norm: axis must name one or two axes, got {axis}")



def _convolve_full(a: Tensor, v: Tensor) -> Tensor:
    """The full 1-d convolution of ``a`` (length n) and ``v`` (length m): n + m - 1 values, each a
    dot product of a window of ``a`` (zero-padded) with ``v`` reversed."""
    from funcgrad.numpy.manipulation import flip, pad
    n, m = a.shape[0], v.shape[0]
    padded = pad(a, (m - 1, m - 1))
    windows = np.arange(n + m - 1)[:, None] + np.arange(m)[None, :]  # (n + m - 1, m), static
    return matmul(padded[windows], flip(v, axis=0))


def _correlation_mode(name: str, a: ArrayLike, v: ArrayLike, mode: str) -> tuple[Tensor, Tensor, bool]:
    (x, y), was_bool = _promoted(a, v)
    if x.ndim != 1 or y.ndim != 1:
        raise ValueError(f"{name} only supports 1-dimensional inputs, got shapes {x.shape} and {y.shape}")
    if x.shape[0] == 0 or y.shape[0] == 0:
        raise ValueError(f"{name}: inputs cannot be empty, got shapes {x.shape} and {y.shape}")
    if mode not in ("full", "same", "valid"):
        raise ValueError(f"{name}: mode must be 'full', 'same' or 'valid', got {mode!r}")
    return x, y, was_bool


def _cut(full: Tensor, n: int, m: int, mode: str) -> Tensor:
    """The 'same' or 'valid' part of a full convolution of lengths n >= m."""
    if mode == "full":
        return full
    start = (m - 1) // 2 if mode == "same" else m - 1
    length = n if mode == "same" else n - m + 1
    return full[start:start + length]


def convolve(a: ArrayLike, v: ArrayLike, mode: str = "full", *, precision: Any = None,
             preferred_element_type: Any = None) -> Tensor:
    """The discrete 1-d convolution of ``a`` and ``v`` (NumPy's and JAX's ``convolve``).

    >>> convolve(asarray([0.0, 1.0, 2.0, 3.0]), asarray([1.0, 2.0, 3.0])).tolist()
    [0.0, 1.0, 4.0, 10.0, 12.0, 9.0]
    """
    x, y, was_bool = _correlation_mode("convolve", a, v, mode)
    if y.shape[0] > x.shape[0]:  # convolution commutes; the modes count from the longer input
        x, y = y, x
    return _as_result(_cut(_convolve_full(x, y), x.shape[0], y.shape[0], mode), was_bool)


def correlate(a: ArrayLike, v: ArrayLike, mode: str = "valid", *, precision: Any = None,
              preferred_element_type: Any = None) -> Tensor:
    """The 1-d cross-correlation ``c[k] = sum_n a[n + k] * v[n]`` (NumPy's and JAX's ``correlate``).

    >>> correlate(asarray([0.0, 1.0, 2.0, 3.0]), asarray([1.0, 2.0, 3.0])).tolist()
    [8.0, 14.0]
    """
    from funcgrad.numpy.manipulation import flip
    x, y, was_bool = _correlation_mode("correlate", a, v, mode)
    if y.shape[0] > x.shape[0]:  # NumPy: the reversed correlation of the swapped inputs
        out = _cut(_convolve_full(y, flip(x, axis=0)), y.shape[0], x.shape[0], mode)
        return _as_result(flip(out, axis=0), was_bool)
    return _as_result(_cut(_convolve_full(x, flip(y, axis=0)), x.shape[0], y.shape[0], mode), was_bool)


__all__ = [
    "convolve", "correlate", "diagonal", "dot", "einsum", "inner", "kron", "matmul", "matrix_norm", "norm", "outer",
    "tensordot", "trace", "vdot", "vecdot", "vector_norm",
]
