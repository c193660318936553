"""Tracing Python functions over pytrees of arrays into an IR: ``make_ir`` and the helper every
transformation uses, ``trace_flat``.

Arguments are flattened as pytrees; every array-like leaf (Tensor, NumPy array, Python or NumPy
scalar) becomes a typed input of the IR, with Python scalars weakly typed as in JAX. Arrays the
function closes over become constants of the IR. Outputs are flattened the same way.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from funcgrad.core.tensor import Tensor, _atom_for
from funcgrad.ir import dtypes
from funcgrad.ir.core import IR, ShapedArray
from funcgrad.ir.simplify import simplify
from funcgrad.ir.tracing import new_trace
from funcgrad.util import tree


def leaf_aval(leaf: Any, where: str = "argument") -> tuple[ShapedArray, bool]:
    """The (aval, weak_type) a pytree leaf traces as; raises TypeError for non-array leaves."""
    if isinstance(leaf, Tensor):
        return leaf.aval, leaf._weak
    if isinstance(leaf, np.ndarray):
        if leaf.dtype.kind == "f" and leaf.dtype not in dtypes.ALL_DTYPES:
            raise TypeError(f"{where} has unsupported dtype {leaf.dtype}")
        return ShapedArray(leaf.shape, _default_dtype(leaf.dtype)), False
    if isinstance(leaf, np.generic):
        return ShapedArray((), _default_dtype(leaf.dtype)), False
    if isinstance(leaf, (bool, int, float, complex)):
        dtype = dtypes.python_scalar_dtype(leaf)
        return ShapedArray((), dtype), dtype != dtypes.bool_
    raise TypeError(f"{where} of type {type(leaf).__name__} is not a valid funcgrad type: a traced "
                    "function takes pytrees (tuples, lists, dicts, ...) whose leaves are arrays or scalars")


_NARROWED: dict[np.dtype, np.dtype] = {
    dtypes.float64: dtypes.float32, dtypes.int64: dtypes.int32, dtypes.uint64: dtypes.uint32,
    dtypes.complex128: dtypes.complex64,
}


def _default_dtype(dtype: np.dtype) -> np.dtype:
    """NumPy's 64-bit defaults become funcgrad's 32-bit ones (no silent 64-bit values)."""
    dtype = np.dtype(dtype)
    return _NARROWED[dtype] if dtype in _NARROWED else dtypes.canonicalize(dtype)


def as_output(value: Any) -> Tensor | np.generic:
    """A function's output leaf as a Tensor, or a NumPy scalar for Python scalars (which the IR
    holds as literal outputs). NumPy arrays are accepted, as JAX does."""
    if isinstance(value, (Tensor, np.generic)):
        return value
    if isinstance(value, (bool, int, float, complex)):
        return cast(np.generic, np.asarray(value, dtypes.python_scalar_dtype(value))[()])
    if isinstance(value, np.ndarray):
        return Tensor(value)
    raise TypeError(f"a traced function returned a {type(value).__name__}; outputs must be pytrees "
                    "whose leaves are arrays or scalars")


def trace_flat(fn: Callable[..., Any], in_avals: Sequence[tuple[ShapedArray, bool]], in_tree: Any,
               label: str, input_names: Sequence[str] | None = None,
               known: Sequence[Any] | None = None, read_known: list[bool] | None = None) -> tuple[IR, Any]:
    """Trace ``fn(*unflatten(in_tree, inputs))`` with one IR input per aval; returns (IR, out_tree).

    ``in_tree`` describes the positional argument tuple ``(args...)``. ``known``: the inputs' values
    (Tensors; a traced one stands for its own trace's known value), for traces whose Python control
    flow may read them (grad, jvp and vjp outside jit); the trace stays abstract without it.
    ``read_known`` (a list) gets whether ``fn`` read one of them (its IR then holds for these values only).
    """
    with new_trace(label) as builder:
        tracers = [builder.new_input(aval) for aval, _ in in_avals]
        builder.input_names.update((t.var.id, n) for t, n in zip(tracers, input_names or ()))
        if known is not None:
            builder.known = {t.var.id: value for t, value in zip(tracers, known)}
        inputs = [Tensor._wrap(t, weak=weak) for t, (_, weak) in zip(tracers, in_avals)]
        out = fn(*tree.unflatten(in_tree, inputs))
        out_leaves, out_tree = tree.flatten(out)
        atoms = [_atom_for(builder, as_output(leaf)) for leaf in out_leaves]
        ir = builder.build(atoms)
    if read_known is not None:
        read_known.append(builder.read_known)
    return ir, out_tree


def argument_names(fn: Callable[..., Any], args: Sequence[Any], positions: Sequence[int] | None = None,
                   kwargs: dict[str, Any] | None = None) -> list[str]:
    """A readable name per flattened leaf of ``(args, kwargs)`` ("argument 'params'['w']"), for error
    messages. ``positions`` maps each of ``args`` to its position in ``fn``'s signature."""
    try:
        parameters = [p.name for p in inspect.signature(fn).parameters.values()
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        parameters = []
    names = []
    for i, arg in enumerate(args):
        position = positions[i] if positions is not None else i
        label = f"argument '{parameters[position]}'" if position < len(parameters) else f"argument {position}"
        names += [label + tree.keystr(path) for path, _ in tree.leaves_with_path(arg)]
    for key, value in (kwargs or {}).items():
        names += [f"argument '{key}'" + tree.keystr(path) for path, _ in tree.leaves_with_path(value)]
    return names


def make_ir(fn: Callable[..., Any], static_argnums: int | Sequence[int] = (),
            simplified: bool = True) -> Callable[..., IR]:
    """Return a function that traces ``fn`` on example arguments and gives back its IR, cleaned up
    by ``ir.simplify`` (constant folding, CSE, DCE) unless ``simplified=False``.

    >>> print(make_ir(lambda x: x * 2 + 1)(Tensor.ones(3)))
    { lambda a:f32[3]. let
        b:f32[3] = mul a 2.0:f32[]
        c:f32[3] = add b 1.0:f32[]
      in (c,) }
    """
    static = {static_argnums} if isinstance(static_argnums, int) else set(static_argnums)

    @functools.wraps(fn)
    def traced(*args: Any) -> IR:
        for i in static:
            if not -len(args) <= i < len(args):
                raise ValueError(f"static_argnums {i} is out of range for {len(args)} arguments")
        static_pos = {i % len(args) for i in static}
        dynamic = [a for i, a in enumerate(args) if i not in static_pos]

        def with_statics(*dynamic_args: Any) -> Any:
            it = iter(dynamic_args)
            return fn(*(args[i] if i in static_pos else next(it) for i in range(len(args))))

        leaves, in_tree = tree.flatten(tuple(dynamic))
        avals = [leaf_aval(leaf, f"argument leaf {n}") for n, leaf in enumerate(leaves)]
        names = argument_names(fn, dynamic, [i for i in range(len(args)) if i not in static_pos])
        ir, _ = trace_flat(with_statics, avals, in_tree, f"make_ir({getattr(fn, '__name__', 'fn')})", names)
        return simplify(ir) if simplified else ir

    return traced


def trace_avals(fn: Callable[..., Sequence[Any]], avals: Sequence[ShapedArray], label: str) -> IR:
    """Trace ``fn(*tracers) -> list of outputs`` over flat inputs of ``avals`` into an IR.

    The transformations use this to build their output IRs: ``fn`` walks the input IR and binds
    new equations, which land in the fresh trace.
    """
    with new_trace(label) as builder:
        inputs = [Tensor._wrap(builder.new_input(aval)) for aval in avals]
        outs = fn(*inputs)
        ir = builder.build([_atom_for(builder, as_output(out)) for out in outs])
    return ir
