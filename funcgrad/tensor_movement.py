"""tinygrad's and PyTorch's movement and indexing methods of Tensor: padding, shrinking, joining,
splitting, einops' ``rearrange``, triangles and diagonals, gather/scatter and masks.

Each is a composition of ``funcgrad.numpy`` (slicing, ``fnp.pad``, ``take_along_axis``, the ``.at``
scatters), so gradients come from those primitives' rules. ``MovementMethods`` is one of the
groups ``tensor_methods.TensorMethods`` inherits.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

import funcgrad.numpy as fnp
from funcgrad.core.tensor import Tensor
from funcgrad.ir import dtypes
from funcgrad.tensor_group import TensorGroup

_PAD_MODES = {"constant": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}


def _varargs(first: Any, rest: tuple[Any, ...]) -> tuple[Any, ...]:
    """tinygrad's ``f(2, 3)`` or ``f((2, 3))``."""
    if not rest and isinstance(first, (tuple, list)):
        return tuple(first)
    return (first,) + tuple(rest)


def _axis(x: Tensor, dim: int, name: str) -> int:
    rank = max(x.ndim, 1)
    if not isinstance(dim, (int, np.integer)) or not -rank <= dim < rank:
        raise IndexError(f"{name}: dim {dim} is out of range for a Tensor of shape {x.shape}")
    return int(dim) % rank


def _grouped_padding(x: Tensor, padding: Sequence[Any], name: str) -> list[tuple[int, int]]:
    """Per-axis (before, after) pairs from tinygrad's two spellings: a flat PyTorch-style sequence
    (last axis first: left, right, top, bottom, ...) or one (before, after) pair or None per axis."""
    if all(isinstance(p, (int, np.integer)) for p in padding):
        if len(padding) % 2 or len(padding) > 2 * x.ndim:
            raise ValueError(f"{name}: a flat padding needs an even number of values, at most 2 * ndim = "
                             f"{2 * x.ndim}, got {tuple(padding)}")
        pairs = [(0, 0)] * x.ndim
        for i in range(len(padding) // 2):
            pairs[x.ndim - 1 - i] = (int(padding[2 * i]), int(padding[2 * i + 1]))
        return pairs
    if len(padding) != x.ndim:
        raise ValueError(f"{name}: padding needs one (before, after) pair or None per axis ({x.ndim}), got "
                         f"{tuple(padding)}")
    return [(0, 0) if p is None else (int(p[0]), int(p[1])) for p in padding]


class MovementMethods(TensorGroup):
    """Movement, joining/splitting and indexing methods (see docs/tensor-api.md)."""


    # --- padding and shrinking -----------------------------------------------------------------
    def pad(self, padding: Sequence[Any], mode: str = "constant", value: Any = 0.0) -> Tensor:
        """Pad with ``mode`` 'constant' (``value``), 'reflect', 'replicate' or 'circular'; negative
        amounts crop. ``padding`` is PyTorch's flat form (last axis first) or a pair per axis.

        >>> Tensor([[1, 2]]).pad((1, 0)).tolist()
        [[0, 1, 2]]
        """
        if mode not in _PAD_MODES:
            raise ValueError(f"pad: mode must be one of {sorted(_PAD_MODES)}, got {mode!r}")
        x = fnp.asarray(self)
        pairs = _grouped_padding(x, padding, "pad")
        crop = tuple(slice(-b if b < 0 else 0, x.shape[i] + a if a < 0 else None) for i, (b, a) in enumerate(pairs))
        x = x[crop] if any(b < 0 or a < 0 for b, a in pairs) else x
        grow = [(max(b, 0), max(a, 0)) for b, a in pairs]
        if not any(b or a for b, a in grow):
            return x
        if mode == "constant":
            return fnp.pad(x, grow, constant_values=value)
        if mode == "reflect" and any(b >= s or a >= s for (b, a), s in zip(grow, x.shape)):
            raise ValueError(f"pad: reflect padding {tuple(grow)} must be smaller than the shape {x.shape}")
        return fnp.pad(x, grow, mode=_PAD_MODES[mode])

    def pad_to(self, shape: Any, *args: Any, value: Any = 0) -> Tensor:
        """Pad at the end of each axis up to ``shape`` (None keeps an axis)."""
        target = _varargs(shape, args)
        if len(target) != self.ndim or any(t is not None and t < s for t, s in zip(target, self.shape)):
            raise ValueError(f"pad_to: cannot pad shape {self.shape} to {target}")
        return MovementMethods.pad(self, [None if t is None else (0, t - s) for t, s in zip(target, self.shape)],
                                   value=value)

    def shrink(self, arg: Sequence[Any]) -> Tensor:
        """Keep ``[start, end)`` of each axis (None keeps the whole axis)."""
        if len(arg) != self.ndim:
            raise ValueError(f"shrink: needs one (start, end) or None per axis ({self.ndim}), got {tuple(arg)}")
        for pair, size in zip(arg, self.shape):
            if pair is not None and not 0 <= pair[0] <= pair[1] <= size:
                raise ValueError(f"shrink: {tuple(arg)} is out of bounds for shape {self.shape}")
        return self[tuple(slice(None) if p is None else slice(p[0], p[1]) for p in arg)]

    def shrink_to(self, shape: Any, *args: Any) -> Tensor:
        """Keep the first ``shape[i]`` entries of each axis (None keeps an axis)."""
        target = _varargs(shape, args)
        if len(target) != self.ndim:
            raise ValueError(f"shrink_to: cannot shrink shape {self.shape} to {target}")
        return MovementMethods.shrink(self, [None if t is None else (0, t) for t in target])

    # --- reordering ----------------------------------------------------------------------------
    def flip(self, axis: Any, *args: Any) -> Tensor:
        x = fnp.asarray(self)
        axes = _varargs(axis, args)
        return fnp.flip(x, axis=tuple(_axis(x, a, "flip") for a in axes))

    def roll(self, shifts: int | Sequence[int], dims: int | Sequence[int] | None = None) -> Tensor:
        """PyTorch's roll: without ``dims`` the flattened Tensor is rolled and reshaped back."""
        x = fnp.asarray(self)
        if dims is None:
            return fnp.reshape(fnp.roll(fnp.ravel(x), shifts), x.shape)
        return fnp.roll(x, shifts, axis=dims)

    def transpose(self, dim0: Any = 1, dim1: int = 0, *more: int) -> Tensor:
        """Swap two axes (tinygrad and PyTorch; ``x.transpose()`` swaps axes 1 and 0). A full
        permutation (``x.transpose(1, 2, 0)`` or a tuple) is NumPy's transpose."""
        x = fnp.asarray(self)
        if more or isinstance(dim0, (tuple, list)):
            return fnp.transpose(x, tuple(dim0) if isinstance(dim0, (tuple, list)) else (dim0, dim1, *more))
        if x.ndim < 2 and (dim0, dim1) == (1, 0):
            return x
        return fnp.swapaxes(x, _axis(x, dim0, "transpose"), _axis(x, dim1, "transpose"))

    def squeeze(self, dim: int | Sequence[int] | None = None) -> Tensor:
        """Drop axes of size 1; an axis ``dim`` of another size is kept (PyTorch)."""
        x = fnp.asarray(self)
        if dim is None:
            return fnp.squeeze(x)
        dims = (dim,) if isinstance(dim, (int, np.integer)) else tuple(dim)
        if x.ndim == 0:
            for d in dims:
                _axis(x, d, "squeeze")
            return x
        keep = tuple(a for a in (_axis(x, d, "squeeze") for d in dims) if x.shape[a] == 1)
        return fnp.squeeze(x, keep) if keep else x

    def repeat(self, repeats: Any, *args: Any) -> Tensor:
        """PyTorch's repeat: tile the Tensor ``repeats[i]`` times along axis i (new axes in front)."""
        counts = _varargs(repeats, args)
        if len(counts) < self.ndim:
            raise ValueError(f"repeat: needs at least {self.ndim} repeats for shape {self.shape}, got {counts}")
        return fnp.tile(self, counts)

    def repeat_interleave(self, repeats: int, dim: int | None = None) -> Tensor:
        """Repeat each element ``repeats`` times along ``dim`` (the flattened Tensor without one)."""
        x = fnp.asarray(self)
        if dim is None:
            return fnp.repeat(fnp.ravel(x), repeats)
        return fnp.repeat(x, repeats, axis=_axis(x, dim, "repeat_interleave"))

    # --- joining and splitting -----------------------------------------------------------------
    def cat(self, *args: Any, dim: int = 0) -> Tensor:
        """``x.cat(y, z, dim=1)`` (or ``Tensor.cat(x, y)``): concatenate along ``dim``."""
        tensors = [fnp.asarray(self)] + [fnp.asarray(t) for t in args]
        return fnp.concatenate(tensors, axis=_axis(tensors[0], dim, "cat"))

    def stack(self, *args: Any, dim: int = 0) -> Tensor:
        tensors = [fnp.asarray(self)] + [fnp.asarray(t) for t in args]
        rank = tensors[0].ndim + 1
        if not -rank <= dim < rank:
            raise IndexError(f"stack: dim {dim} is out of range for {rank - 1}-d Tensors")
        return fnp.stack(tensors, axis=dim)

    def split(self, sizes: int | Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
        """Pieces of ``sizes`` along ``dim``: an int is the size of each piece (the last may be
        smaller), a list gives every size (they must add up to the axis)."""
        x = fnp.asarray(self)
        axis = _axis(x, dim, "split")
        length = x.shape[axis]
        if isinstance(sizes, (int, np.integer)):
            if sizes <= 0:
                raise ValueError(f"split: the size of each piece must be positive, got {sizes}")
            sizes = [min(sizes, length - start) for start in range(0, length, sizes)] or [0]
        if sum(sizes) != length:
            raise ValueError(f"split: sizes {list(sizes)} add up to {sum(sizes)}, not dim {dim}'s size {length}")
        bounds = np.cumsum([0] + list(sizes))
        return tuple(x[(slice(None),) * axis + (slice(int(a), int(b)),)] for a, b in zip(bounds[:-1], bounds[1:]))

    def chunk(self, chunks: int, dim: int = 0) -> list[Tensor]:
        """At most ``chunks`` pieces of equal size ceil(n / chunks) along ``dim`` (PyTorch)."""
        if chunks <= 0:
            raise ValueError(f"chunk: chunks must be positive, got {chunks}")
        x = fnp.asarray(self)
        length = x.shape[_axis(x, dim, "chunk")]
        return list(MovementMethods.split(x, max(math.ceil(length / chunks), 1), dim))

    def unflatten(self, dim: int, sizes: Sequence[int]) -> Tensor:
        x = fnp.asarray(self)
        axis = _axis(x, dim, "unflatten")
        return fnp.reshape(x, x.shape[:axis] + tuple(sizes) + x.shape[axis + 1:])

    def unfold(self, dim: int, size: int, step: int) -> Tensor:
        """Windows of ``size`` every ``step`` along ``dim``: that axis becomes the window count and
        a new last axis of length ``size`` holds each window (PyTorch's unfold)."""
        x = fnp.asarray(self)
        axis = _axis(x, dim, "unfold")
        length = x.shape[axis] if x.ndim else 1
        if size < 0 or size > length or step <= 0:
            raise ValueError(f"unfold: size {size} must be in [0, {length}] and step {step} positive")
        count = (length - size) // step + 1
        starts = np.arange(count)[:, None] * step + np.arange(size)[None, :]  # (count, size)
        windows = fnp.take(x if x.ndim else fnp.reshape(x, (1,)), fnp.asarray(starts.astype(np.int32)), axis=axis)
        return fnp.moveaxis(windows, axis + 1, -1)

    def rearrange(self, formula: str, **sizes: int) -> Tensor:
        """einops' rearrange: ``x.rearrange("b c (h w) -> b (c h) w", h=2)``; names, parenthesised
        groups and one ``...`` on each side."""
        return _rearrange(fnp.asarray(self), formula, sizes)

    # --- triangles and diagonals ---------------------------------------------------------------
    def diag(self) -> Tensor:
        """A 1-D Tensor as a diagonal matrix (tinygrad); a matrix's diagonal (PyTorch's other case)."""
        if self.ndim not in (1, 2):
            raise ValueError(f"diag: needs a 1-D or 2-D Tensor, got shape {self.shape}")
        return fnp.diag(self)

    def diagonal(self, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Tensor:
        x = fnp.asarray(self)
        return fnp.diagonal(x, offset, _axis(x, dim1, "diagonal"), _axis(x, dim2, "diagonal"))

    def tril(self, diagonal: int = 0) -> Tensor:
        return fnp.tril(self, k=diagonal)

    def triu(self, diagonal: int = 0) -> Tensor:
        return fnp.triu(self, k=diagonal)

    # --- gather, scatter, masks ----------------------------------------------------------------
    def gather(self, dim: int, index: Any) -> Tensor:
        """``out[i][j] = self[index[i][j]][j]`` for dim 0 (PyTorch); ``index`` may be smaller than
        ``self`` on the other axes."""
        x, index = fnp.asarray(self), fnp.asarray(index)
        axis = _axis(x, dim, "gather")
        _check_index(x, index, axis, "gather")
        window = tuple(slice(None) if a == axis else slice(0, n) for a, n in enumerate(index.shape))
        return fnp.take_along_axis(x[window], index, axis=axis)

    def scatter(self, dim: int, index: Any, src: Any, reduce: str | None = None) -> Tensor:
        """``self`` with ``self[index[i][j]][j] = src[i][j]`` for dim 0 (PyTorch); ``reduce``
        'add' or 'multiply' combines instead of overwriting."""
        x = fnp.asarray(self)
        where = _scatter_index(x, index, dim, "scatter")
        values = _scatter_values(src, fnp.asarray(index).shape, x.dtype)
        if reduce is None:
            return x.at[where].set(values)
        if reduce == "add":
            return x.at[where].add(values)
        if reduce == "multiply":
            return x.at[where].multiply(values)
        raise ValueError(f"scatter: reduce must be None, 'add' or 'multiply', got {reduce!r}")

    def scatter_reduce(self, dim: int, index: Any, src: Any, reduce: str, include_self: bool = True) -> Tensor:
        """Combine ``src`` into ``self`` at ``index`` along ``dim`` with 'sum', 'prod', 'mean',
        'amax' or 'amin'; without ``include_self`` the scattered-to entries of ``self`` are left out."""
        reducers = ("sum", "prod", "mean", "amax", "amin")
        if reduce not in reducers:
            raise ValueError(f"scatter_reduce: reduce must be one of {reducers}, got {reduce!r}")
        x = fnp.asarray(self)
        where = _scatter_index(x, index, dim, "scatter_reduce")
        values = _scatter_values(src, fnp.asarray(index).shape, x.dtype)
        hit = fnp.zeros(x.shape, dtype=dtypes.bool_).at[where].set(True)
        if not include_self:
            identity = {"sum": 0, "mean": 0, "prod": 1,
                        "amax": -np.inf if dtypes.is_float(x.dtype) else np.iinfo(x.dtype).min,
                        "amin": np.inf if dtypes.is_float(x.dtype) else np.iinfo(x.dtype).max}[reduce]
            x = fnp.where(hit, fnp.asarray(identity).astype(x.dtype), x)
        if reduce in ("sum", "mean"):
            total = x.at[where].add(values)
            if reduce == "sum":
                return total
            counts = fnp.zeros(x.shape, dtype=x.dtype).at[where].add(fnp.ones(values.shape, dtype=x.dtype))
            counts = counts + (1 if include_self else 0)
            mean = total / fnp.where(counts == 0, 1, counts)
            return mean if dtypes.is_float(x.dtype) else fnp.floor_divide(total, fnp.where(counts == 0, 1, counts))
        if reduce == "prod":
            return x.at[where].multiply(values)
        return x.at[where].max(values) if reduce == "amax" else x.at[where].min(values)

    def masked_fill(self, mask: Any, value: Any) -> Tensor:
        """``value`` where ``mask`` is True, ``self`` elsewhere (the mask broadcasts)."""
        mask = fnp.asarray(mask)
        if not dtypes.is_bool(mask.dtype):
            raise TypeError(f"masked_fill: mask must be bool, got dtype {mask.dtype.name}")
        return fnp.where(mask, fnp.astype(fnp.asarray(value), self.dtype), self)

    def masked_select(self, mask: Any, size: int | None = None, fill_value: Any = 0) -> Tensor:
        """The elements where ``mask`` (broadcast) is True, as a 1-D Tensor. Its length depends on the
        values, so it needs a concrete mask unless ``size`` fixes it (padded with ``fill_value``)."""
        x, mask = fnp.asarray(self), fnp.asarray(mask)
        if not dtypes.is_bool(mask.dtype):
            raise TypeError(f"masked_select: mask must be bool, got dtype {mask.dtype.name}")
        shape = fnp.broadcast_shapes(x.shape, mask.shape)
        x = fnp.ravel(fnp.broadcast_to(x, shape))
        if not mask.is_traced:  # a concrete mask: its positions are constants (also inside a trace of x)
            positions = np.flatnonzero(np.broadcast_to(mask.numpy(), shape)).astype(np.int32)
            if size is not None:
                picked = fnp.take(x, fnp.asarray(positions[:size]))
                return fnp.pad(picked, (0, max(size - len(positions), 0)), constant_values=fill_value)
            return fnp.take(x, fnp.asarray(positions))
        if size is None:
            raise ValueError("masked_select: a traced mask needs size= (the output length depends on its values)")
        (flat,) = fnp.nonzero(fnp.ravel(fnp.broadcast_to(mask, shape)), size=size, fill_value=-1)
        picked = fnp.take(x, fnp.maximum(flat, 0))
        return fnp.where(flat >= 0, picked, fnp.astype(fnp.asarray(fill_value), x.dtype))

    def nonzero(self, size: int | None = None, fill_value: Any = 0) -> Tensor:
        """The (count, ndim) indices of the nonzero elements (PyTorch's layout)."""
        x = fnp.asarray(self)
        if x.ndim == 0:
            x = fnp.reshape(x, (1,))
            found = fnp.nonzero(x, size=size, fill_value=fill_value)
            return fnp.zeros((found[0].shape[0], 0), dtype=dtypes.int32)
        return fnp.stack(fnp.nonzero(x, size=size, fill_value=fill_value), axis=1)


def _check_index(x: Tensor, index: Tensor, axis: int, name: str) -> None:
    if not dtypes.is_int(index.dtype):
        raise TypeError(f"{name}: index must be an integer Tensor, got dtype {index.dtype.name}")
    if index.ndim != x.ndim:
        raise ValueError(f"{name}: index must have the same rank as the Tensor ({x.ndim}), got shape {index.shape}")
    for a, (n, s) in enumerate(zip(index.shape, x.shape)):
        if a != axis and n > s:
            raise ValueError(f"{name}: index of shape {index.shape} is larger than the Tensor's {x.shape} "
                             f"on dim {a}")


def _scatter_index(x: Tensor, index: Any, dim: int, name: str) -> tuple[Tensor, ...]:
    """The full index tuple for ``x.at[...]``: ``index`` along ``dim``, positions elsewhere."""
    index = fnp.asarray(index)
    axis = _axis(x, dim, name)
    _check_index(x, index, axis, name)
    grids = []
    for a, n in enumerate(index.shape):
        if a == axis:
            grids.append(index)
        else:
            shape = [1] * index.ndim
            shape[a] = n
            grids.append(fnp.broadcast_to(fnp.reshape(fnp.arange(n, dtype=dtypes.int32), shape), index.shape))
    return tuple(grids)


def _scatter_values(src: Any, shape: tuple[int, ...], dtype: np.dtype) -> Tensor:
    """``src`` cut to the index's shape (PyTorch reads only that part) or a scalar broadcast to it."""
    src = fnp.asarray(src)
    if src.ndim == 0:
        return fnp.broadcast_to(fnp.astype(src, dtype), shape)
    if src.ndim != len(shape) or any(n > s for n, s in zip(shape, src.shape)):
        raise ValueError(f"scatter: src of shape {src.shape} is smaller than the index's {shape}")
    return fnp.astype(src[tuple(slice(0, n) for n in shape)], dtype)


def _parse_side(side: str, formula: str) -> list[list[str]]:
    """``"b (h w) ..."`` -> [["b"], ["h", "w"], ["..."]]: each axis as its list of elementary names."""
    groups: list[list[str]] = []
    current: list[str] | None = None
    for token in side.replace("(", " ( ").replace(")", " ) ").split():
        if token == "(":
            if current is not None:
                raise ValueError(f"rearrange: nested parentheses in {formula!r}")
            current = []
        elif token == ")":
            if current is None:
                raise ValueError(f"rearrange: unbalanced ')' in {formula!r}")
            groups.append(current)
            current = None
        elif current is not None:
            current.append(token)
        else:
            groups.append([token])
    if current is not None:
        raise ValueError(f"rearrange: unbalanced '(' in {formula!r}")
    return groups


def _rearrange(x: Tensor, formula: str, sizes: dict[str, int]) -> Tensor:
    if formula.count("->") != 1:
        raise ValueError(f"rearrange: the formula needs exactly one '->', got {formula!r}")
    left_text, right_text = formula.split("->")
    left, right = _parse_side(left_text, formula), _parse_side(right_text, formula)
    names_left = [n for g in left for n in g]
    names_right = [n for g in right for n in g]
    if sorted(names_left) != sorted(names_right) or len(set(names_left)) != len(names_left):
        raise ValueError(f"rearrange: both sides must name the same axes once each, got {formula!r}")
    ellipsis_rank = x.ndim - (len(left) - (1 if ["..."] in left else 0))
    if ellipsis_rank < 0 or (["..."] not in left and ellipsis_rank != 0):
        raise ValueError(f"rearrange: {formula!r} names {len(left)} axes, the Tensor has shape {x.shape}")
    known = dict(sizes)
    elementary: list[int] = []
    dims = iter(x.shape)
    ellipsis_shape: tuple[int, ...] = ()
    for group in left:
        if group == ["..."]:
            ellipsis_shape = tuple(next(dims) for _ in range(ellipsis_rank))
            elementary.extend(ellipsis_shape)
            continue
        total = next(dims)
        unknown = [n for n in group if n not in known]
        if len(unknown) > 1:
            raise ValueError(f"rearrange: cannot infer the sizes of {unknown} in {formula!r}; pass them as keywords")
        fixed = math.prod(known[n] for n in group if n in known)
        if unknown:
            if fixed == 0 or total % fixed:
                raise ValueError(f"rearrange: axis of size {total} does not split into {group} with {sizes}")
            known[unknown[0]] = total // fixed
        elif fixed != total:
            raise ValueError(f"rearrange: axis of size {total} is not {group} = {fixed}")
        elementary.extend(known[n] for n in group)
    order_left = [n for g in left for n in (["..."] if g == ["..."] else g)]
    flat_names: list[str] = []
    for n in order_left:
        flat_names.extend([f"...{i}" for i in range(ellipsis_rank)] if n == "..." else [n])
    x = fnp.reshape(x, tuple(elementary))
    wanted: list[str] = []
    for n in names_right:
        wanted.extend([f"...{i}" for i in range(ellipsis_rank)] if n == "..." else [n])
    x = fnp.permute_dims(x, tuple(flat_names.index(n) for n in wanted))
    out_shape: list[int] = []
    for group in right:
        if group == ["..."]:
            out_shape.extend(ellipsis_shape)
        else:
            out_shape.append(math.prod(known[n] for n in group))
    return fnp.reshape(x, tuple(out_shape))
