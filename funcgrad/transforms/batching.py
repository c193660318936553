"""Vectorization (vmap) as an IR-to-IR transformation.

``vmap_ir(ir, in_dims, axis_size)`` returns an IR whose inputs carry an extra batch axis at
``in_dims`` (``None``: not batched) and the batch dimension of each output. It traces
``vmap_eval``, which walks the IR keeping each value's batch dimension: equations whose inputs
are all unbatched are re-bound unchanged; the others go through ``batch_rules``.

A rule is ``rule(args, dims, **params) -> (out, out_dim)`` (lists for multiple results), with
``dims[i]`` the batch axis of ``args[i]`` or ``None``. Every primitive has a rule: there is no
fallback loop. Most rules move the batch axis to the front (``move_to_front``) and shift their
axis parameters by one.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.core.trace import trace_avals
from funcgrad.ir.collectives import NAMED_COLLECTIVES, AxisFrame, axis_frame, sub_irs, uses_axis
from funcgrad.ir.core import IR, Literal, ShapedArray
from funcgrad.ir.primitives import Primitive, broadcast_in_dim_p, transpose_p
from funcgrad.ir.simplify import simplify

BatchRule = Callable[..., tuple[Any, Any]]
batch_rules: dict[Primitive, BatchRule] = {}
# rules of the named-axis collectives over the axis this vmap binds: rule(args, dims, frame, **params)
# (``transforms/collective_rules.py``); ``batch_rules`` holds their rules over any other axis
own_axis_rules: dict[Primitive, Callable[..., tuple[Any, Any]]] = {}

# The axis the running vmap_ir binds (None: unnamed). Rules of higher-order primitives batch their
# sub-IRs with vmap_ir/vmap_eval, which inherit it, so a psum inside a jit, cond or scan sees its axis.
_INHERIT: Any = object()


class _RunningFrames(threading.local):
    def __init__(self) -> None:
        self.stack: list[AxisFrame | None] = [None]


_running = _RunningFrames()


def move_to_front(x: Any, dim: int | None) -> Any:
    """``x`` with its batch axis ``dim`` moved to position 0 (unbatched values unchanged)."""
    if dim is None or dim == 0:
        return x
    perm = (dim,) + tuple(i for i in range(x.ndim) if i != dim)
    return bind(transpose_p, x, permutation=perm)


def move_axis(x: Tensor, source: int, destination: int) -> Tensor:
    if source == destination:
        return x
    order = [i for i in range(x.ndim) if i != source]
    order.insert(destination, source)
    return bind(transpose_p, x, permutation=tuple(order))


def broadcast_batched(x: Any, dim: int | None, axis_size: int) -> Tensor:
    """``x`` with a batch axis of ``axis_size`` at position 0, broadcasting unbatched values."""
    if dim is not None:
        return move_to_front(x, dim)
    shape = getattr(x, "shape", ())
    return bind(broadcast_in_dim_p, x, shape=(axis_size,) + tuple(shape),
                broadcast_dimensions=tuple(range(1, len(shape) + 1)))


def batched_aval(aval: ShapedArray, dim: int | None, axis_size: int) -> ShapedArray:
    if dim is None:
        return aval
    shape = list(aval.shape)
    shape.insert(dim, axis_size)
    return ShapedArray(tuple(shape), aval.dtype)


def vmap_eval(ir: IR, args: Sequence[Any], dims: Sequence[int | None],
              axis_size: int, frame: AxisFrame | None = _INHERIT) -> tuple[list[Any], list[int | None]]:
    frame = _running.stack[-1] if frame is _INHERIT else frame
    env: dict[int, tuple[Any, int | None]] = {}
    for var, const in zip(ir.const_vars, ir.consts):
        env[var.id] = (const, None)
    for var, arg, dim in zip(ir.in_vars, args, dims):
        env[var.id] = (arg, dim)

    def read(atom: Any) -> tuple[Any, int | None]:
        return (atom.value, None) if isinstance(atom, Literal) else env[atom.id]

    for eqn in ir.eqns:
        values, in_dims = zip(*(read(a) for a in eqn.inputs)) if eqn.inputs else ((), ())
        multiple = eqn.primitive.multiple_results
        own_axis = frame is not None and _names_axis(eqn, frame.name)
        out_dims: Any
        if own_axis and eqn.primitive in own_axis_rules:
            assert frame is not None
            outs, out_dims = own_axis_rules[eqn.primitive](list(values), list(in_dims), frame, **eqn.param_dict)
        elif all(d is None for d in in_dims) and not own_axis:
            outs = bind(eqn.primitive, *values, **eqn.param_dict)
            out_dims = [None] * len(eqn.outputs) if multiple else None
        else:
            rule = batch_rules.get(eqn.primitive)
            if rule is None:
                raise NotImplementedError(f"vmap of '{eqn.primitive.name}' is not implemented (no batching rule)")
            outs, out_dims = rule(list(values), list(in_dims), axis_size=axis_size, **eqn.param_dict)
        for var, value, dim in zip(eqn.outputs, outs if multiple else [outs], out_dims if multiple else [out_dims]):
            env[var.id] = (value, dim)
    results = [read(a) for a in ir.outputs]
    return [r[0] for r in results], [r[1] for r in results]


def _names_axis(eqn: Any, name: str) -> bool:
    """Whether the equation is a collective over ``name`` or holds a sub-IR with one."""
    if eqn.primitive in NAMED_COLLECTIVES:
        return bool(eqn.param_dict["axis_name"] == name)
    return any(uses_axis(sub, name) for sub in sub_irs(eqn.param_dict.values()))


def vmap_ir(ir: IR, in_dims: Sequence[int | None], axis_size: int,
            out_dims: Sequence[int | None] | None = None,
            frame: AxisFrame | None = _INHERIT) -> tuple[IR, list[int | None]]:
    """Batch ``ir``. With ``out_dims`` given, each batched output is moved to that axis (and an
    unbatched output is broadcast when its ``out_dims`` entry is not None). ``frame`` is the named
    axis this batching binds (its collectives become operations over the batch axis); by default the
    one of the vmap_ir running (a sub-IR of a call or a loop), else none."""
    found_dims: list[int | None] = []
    frame = _running.stack[-1] if frame is _INHERIT else frame

    def run(*args: Tensor) -> list[Any]:
        _running.stack.append(frame)
        try:
            outs, dims = vmap_eval(ir, args, in_dims, axis_size, frame)
        finally:
            _running.stack.pop()
        if out_dims is not None:
            moved = []
            for out, dim, want in zip(outs, dims, out_dims):
                if want is None:
                    if dim is not None:
                        raise ValueError("vmap: an output with out_axes=None depends on the mapped axis")
                    moved.append(out)
                    continue
                if dim is None:
                    out = broadcast_batched(out, None, axis_size)
                    dim = 0
                moved.append(move_axis(out, dim, want))
            outs, dims = moved, list(out_dims)
        found_dims[:] = dims
        return outs

    avals = [batched_aval(v.aval, d, axis_size) for v, d in zip(ir.in_vars, in_dims)]
    return simplify(trace_avals(run, avals, "vmap")), found_dims


def _normalize_in_axis(axis: Any, ndim: int, where: str) -> int | None:
    if axis is None:
        return None
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"vmap in_axes must be ints or None, got {axis!r} for {where}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"vmap in_axes {axis} is out of range for {where} of rank {ndim}")
    return axis % ndim


def vmap(fn: Callable[..., Any], in_axes: Any = 0, out_axes: Any = 0,
         axis_size: int | None = None, axis_name: Any = None, *,
         _frame: Callable[[int], AxisFrame] | None = None) -> Callable[..., Any]:
    """Vectorize ``fn`` over an axis of its arguments.

    ``in_axes`` is an int, None, or a pytree prefix of the argument tuple (lists of per-argument
    axes); ``out_axes`` likewise for the output. ``axis_size`` is needed when no input is mapped.
    ``axis_name`` names the mapped axis for the collectives in ``fn`` (``lax.psum(x, 'i')`` sums
    over it). ``_frame`` (for ``pmap``) makes the frame binding the name from the local size.

    >>> vmap(lambda x, y: x @ y, in_axes=(0, None))(fnp.ones((5, 3)), fnp.ones(3)).shape   # (5,)
    """
    import functools

    from funcgrad.core.tensor import as_tensor, evaluate
    from funcgrad.core.trace import leaf_aval, trace_flat
    from funcgrad.util import tree

    for leaf in tree.leaves(out_axes):
        if isinstance(leaf, bool) or not isinstance(leaf, int):
            raise TypeError(f"vmap out_axes must be an int, None, or a pytree of them matching the output, "
                            f"got {leaf!r} in out_axes={out_axes!r}")

    @functools.wraps(fn)
    def batched(*args: Any, **kwargs: Any) -> Any:
        if isinstance(in_axes, list):  # JAX accepts a list for the argument tuple
            axes_prefix: Any = tuple(in_axes)
        else:
            axes_prefix = in_axes
        if isinstance(axes_prefix, tuple) and len(axes_prefix) != len(args):
            raise ValueError(f"vmap in_axes has {len(axes_prefix)} entries but the function was called "
                             f"with {len(args)} arguments")
        # keyword arguments are mapped over their leading axis, as JAX maps them (in_axes is positional)
        per_argument = axes_prefix if isinstance(axes_prefix, tuple) else (axes_prefix,) * len(args)
        if kwargs:
            call_args: tuple[Any, ...] = (*args, kwargs)
            per_argument = (*per_argument, 0)
        else:
            call_args = tuple(args)
        leaves, in_tree = tree.flatten(call_args)
        per_leaf = tree.broadcast_prefix(per_argument, call_args)
        values = [as_tensor(leaf) for leaf in leaves]
        paths = [tree.keystr(path) for path, _ in tree.leaves_with_path(tuple(args))]
        if kwargs:
            paths += [f" '{key}'" + tree.keystr(path) for key, value in kwargs.items()
                      for path, _ in tree.leaves_with_path(value)]
        dims = [_normalize_in_axis(a, v.ndim, f"argument{p}") for a, v, p in zip(per_leaf, values, paths)]
        sizes = {v.shape[d] for v, d in zip(values, dims) if d is not None}
        if len(sizes) > 1:
            described = ", ".join(f"argument{p} axis {d} has size {v.shape[d]}"
                                  for v, d, p in zip(values, dims, paths) if d is not None)
            raise ValueError(f"vmap got inconsistent sizes for the mapped axes: {described}")
        if axis_size is not None and sizes and sizes != {axis_size}:
            raise ValueError(f"vmap axis_size={axis_size} but the mapped axes have size {sizes.pop()}")
        if not sizes and axis_size is None:
            raise ValueError("vmap needs at least one mapped input (in_axes not None) or an explicit axis_size")
        size = axis_size if axis_size is not None else sizes.pop()
        unbatched = [leaf_aval(v)[0] if d is None else
                     ShapedArray(v.shape[:d] + v.shape[d + 1:], v.dtype) for v, d in zip(values, dims)]
        call = (lambda *a: fn(*a[:-1], **a[-1])) if kwargs else fn
        frame = None
        if axis_name is not None:
            frame = _frame(size) if _frame is not None else AxisFrame(axis_name, size, size)
        with axis_frame(frame) if frame is not None else contextlib.nullcontext():
            ir, out_tree = trace_flat(call, [(a, False) for a in unbatched], in_tree, "vmap")
        # array placeholders: a Module counts only array-valued attributes as children
        out_placeholder = tree.unflatten(out_tree, [np.zeros(()) for _ in range(out_tree.num_leaves)])
        try:
            wanted = tree.broadcast_prefix(out_axes, out_placeholder)
        except ValueError:
            raise ValueError(f"vmap out_axes={out_axes!r} does not match the structure of the function's output "
                             f"{out_tree}: give one int or None, or a prefix of the output's structure") from None
        normalized: list[int | None] = []
        for want, atom in zip(wanted, ir.outputs):
            if want is None:
                normalized.append(None)
            else:
                rank = atom.aval.ndim + 1
                if not -rank <= want < rank:
                    raise ValueError(f"vmap out_axes {want} is out of range for an output of rank {rank}")
                normalized.append(want % rank)
        batched_ir, _ = vmap_ir(ir, dims, size, normalized, frame=frame)
        outs = [as_tensor(o) for o in evaluate(batched_ir, *values)]
        return tree.unflatten(out_tree, outs)

    return batched
