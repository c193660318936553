"""funcgrad.lax: structured control flow that traces (cond, switch, while_loop, fori_loop, scan).

Python's ``if`` and ``for`` run at trace time; these functions put the control flow into the IR
instead, so it works on traced values and under every transformation. Each traces its Python
callables into open sub-IRs (``funcgrad/ir/higher_order.py``), passes their captured constants as
operands, and binds one primitive. Their differentiation and batching rules are in
``funcgrad/transforms/control_flow.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, as_tensor, bind
from funcgrad.core.trace import leaf_aval, trace_flat
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.core import IR, ShapedArray, avals_str
from funcgrad.ir.higher_order import cond_p, merge_consts, open_ir, scan_p, while_p
from funcgrad.ir.primitives import select_p
from funcgrad.util import tree

__all__ = ["cond", "conv_general_dilated", "fori_loop", "map", "scan", "select", "switch", "while_loop"]


def _trace(fn: Callable[..., Any], args: Sequence[Any], label: str) -> tuple[IR, Any, list[Any]]:
    """Trace ``fn(*args)`` over the avals of ``args``; returns (open IR, out tree, consts)."""
    leaves, in_tree = tree.flatten(tuple(args))
    avals = [leaf_aval(leaf, f"an operand of {label}") for leaf in leaves]
    ir, out_tree = trace_flat(fn, avals, in_tree, label)
    return open_ir(ir), out_tree, list(ir.consts)


def _trace_closed(fn: Callable[..., Any], args: Sequence[Any], label: str) -> tuple[IR, Any, IR]:
    """Like ``_trace`` but also returns the closed IR (with its consts)."""
    leaves, in_tree = tree.flatten(tuple(args))
    avals = [leaf_aval(leaf, f"an operand of {label}") for leaf in leaves]
    ir, out_tree = trace_flat(fn, avals, in_tree, label)
    return open_ir(ir), out_tree, ir


def switch(index: Any, branches: Sequence[Callable[..., Any]], *operands: Any) -> Any:
    """Apply ``branches[index](*operands)``; ``index`` is clamped into range, as in JAX.

    All branches must return the same pytree of types. Inside a trace, every branch is traced.
    >>> switch(1, [lambda x: x + 1, lambda x: x * 10], 2.0).item()   # 20.0
    """
    if not branches:
        raise ValueError("switch needs at least one branch")
    index = as_tensor(index)
    if index.shape != () or not dtypes.is_int(index.dtype) and not dtypes.is_bool(index.dtype):
        raise TypeError(f"switch: the index must be an integer scalar, got {index.aval}")
    index = index.astype(dtypes.int32)
    traced = [_trace_closed(branch, operands, f"branch {i} of switch") for i, branch in enumerate(branches)]
    out_tree = traced[0][1]
    for i, (ir, tree_i, _) in enumerate(traced):
        if tree_i != out_tree or ir.out_avals != traced[0][0].out_avals:
            raise TypeError(f"switch/cond: branch {i} returns {tree_i} with types {avals_str(ir.out_avals)} "
                            f"but branch 0 returns {out_tree} with types "
                            f"{avals_str(traced[0][0].out_avals)}")
    # one operand list for every branch: all branches' consts, then the operands
    branch_irs, all_consts = merge_consts([closed for _, _, closed in traced])
    leaves = [as_tensor(x) for x in tree.leaves(tuple(operands))]
    outs = bind(cond_p, index, *all_consts, *leaves, branches=tuple(branch_irs))
    return tree.unflatten(out_tree, list(outs))


def cond(pred: Any, true_fun: Callable[..., Any], false_fun: Callable[..., Any], *operands: Any) -> Any:
    """``true_fun(*operands)`` if ``pred`` else ``false_fun(*operands)``, as one traced conditional.

    >>> cond(x > 0, lambda x: x, lambda x: -x, x)   # |x| without a Python if on a traced value
    """
    pred = as_tensor(pred)
    if pred.shape != ():
        raise TypeError(f"cond: the predicate must be a scalar, got shape {pred.shape}; use fnp.where for "
                        "elementwise selection")
    return switch(pred.astype(dtypes.bool_).astype(dtypes.int32), [false_fun, true_fun], *operands)


def select(pred: Any, on_true: Any, on_false: Any) -> Tensor:
    """Elementwise ``pred ? on_true : on_false`` (shapes must already match; see fnp.where)."""
    return bind(select_p, as_tensor(pred), as_tensor(on_true), as_tensor(on_false))


def while_loop(cond_fun: Callable[[Any], Any], body_fun: Callable[[Any], Any], init_val: Any) -> Any:
    """``while cond_fun(val): val = body_fun(val)`` as one traced loop; ``val`` is any pytree.

    Forward-mode differentiation works; reverse mode does not (the number of steps is unknown):
    use ``scan`` or ``fori_loop`` with static bounds.
    """
    init_leaves, init_tree = tree.flatten(init_val)
    init_leaves = [as_tensor(x) for x in init_leaves]
    carry_avals = [x.aval for x in init_leaves]
    cond_ir, cond_tree, cond_consts = _trace(cond_fun, (init_val,), "while_loop cond_fun")
    if len(cond_ir.outputs) != 1 or cond_ir.out_avals[0].shape != ():
        raise TypeError(f"while_loop: cond_fun must return a scalar, got {avals_str(cond_ir.out_avals)}")
    if cond_ir.out_avals[0].dtype != dtypes.bool_:
        cond_ir = _bool_output(cond_ir)
    body_ir, body_tree, body_consts = _trace(body_fun, (init_val,), "while_loop body_fun")
    if body_tree != init_tree or list(body_ir.out_avals) != carry_avals:
        raise TypeError(f"while_loop: body_fun must return the same structure and types as init_val: got "
                        f"{body_tree} {avals_str(body_ir.out_avals)}, "
                        f"expected {init_tree} {avals_str(carry_avals)}")
    outs = bind(while_p, *cond_consts, *body_consts, *init_leaves, cond_ir=cond_ir, body_ir=body_ir,
                cond_nconsts=len(cond_consts), body_nconsts=len(body_consts))
    return tree.unflatten(init_tree, list(outs))


def _bool_output(ir: IR) -> IR:
    from funcgrad.core.tensor import evaluate
    from funcgrad.core.trace import trace_avals

    def run(*args: Tensor) -> list[Tensor]:
        (out,) = evaluate(ir, *args)
        return [as_tensor(out) != 0]
    return open_ir(trace_avals(run, list(ir.in_avals), "while_loop cond_fun"))


def scan(f: Callable[[Any, Any], tuple[Any, Any]], init: Any, xs: Any = None, length: int | None = None,
         reverse: bool = False) -> tuple[Any, Any]:
    """Loop ``carry, y = f(carry, x)`` over the leading axis of ``xs``; returns ``(carry, stacked ys)``.

    ``xs`` may be None (then ``length`` is required). Differentiable in both modes.
    >>> scan(lambda c, x: (c + x, c), 0.0, fnp.arange(4.0))   # (6.0, [0., 0., 1., 3.])
    """
    init_leaves, init_tree = tree.flatten(init)
    init_leaves = [as_tensor(x) for x in init_leaves]
    xs_leaves, xs_tree = tree.flatten(xs)
    xs_leaves = [as_tensor(x) for x in xs_leaves]
    lengths = {x.shape[0] for x in xs_leaves if x.ndim > 0}
    if any(x.ndim == 0 for x in xs_leaves):
        raise ValueError("scan: every leaf of xs needs a leading axis to scan over; got a scalar")
    if length is not None:
        lengths.add(int(length))
    if len(lengths) > 1:
        raise ValueError(f"scan: xs leaves and length disagree on the number of steps: {sorted(lengths)}")
    if not lengths:
        raise ValueError("scan: give xs or an explicit length")
    steps = lengths.pop()
    x_slices = [ShapedArray(x.shape[1:], x.dtype) for x in xs_leaves]
    slice_examples = tree.unflatten(xs_tree, [_Example(a) for a in x_slices])
    carry_examples = tree.unflatten(init_tree, [_Example(x.aval) for x in init_leaves])
    body_ir, out_tree, consts = _trace_examples(f, (carry_examples, slice_examples), "scan body")
    if out_tree.num_leaves == 0 or out_tree.node_type is not tuple or len(out_tree.children()) != 2:
        raise TypeError(f"scan: f must return a pair (carry, y), got {out_tree}")
    carry_tree, y_tree = out_tree.children()
    carry_avals = [x.aval for x in init_leaves]
    if carry_tree != init_tree or list(body_ir.out_avals[:len(carry_avals)]) != carry_avals:
        raise TypeError(f"scan: f must return a carry of the same structure and types as init: "
                        f"got {carry_tree} {avals_str(body_ir.out_avals[:len(carry_avals)])}, "
                        f"expected {init_tree} {avals_str(carry_avals)}")
    outs = bind(scan_p, *consts, *init_leaves, *xs_leaves, body=body_ir, length=steps, reverse=bool(reverse),
                num_consts=len(consts), num_carry=len(init_leaves))
    carry = tree.unflatten(init_tree, list(outs[:len(init_leaves)]))
    return carry, tree.unflatten(y_tree, list(outs[len(init_leaves):]))


class _Example:
    """A stand-in leaf carrying only an aval, so scan bodies trace on slices of xs."""

    def __init__(self, aval: ShapedArray) -> None:
        self.aval = aval


def _trace_examples(fn: Callable[..., Any], args: Sequence[Any], label: str) -> tuple[IR, Any, list[Any]]:
    leaves, in_tree = tree.flatten(tuple(args))
    avals = [(leaf.aval, False) for leaf in leaves]
    ir, out_tree = trace_flat(fn, avals, in_tree, label)
    return open_ir(ir), out_tree, list(ir.consts)


def fori_loop(lower: Any, upper: Any, body_fun: Callable[[Any, Any], Any], init_val: Any) -> Any:
    """``for i in range(lower, upper): val = body_fun(i, val)``.

    With Python-int bounds it is a ``scan`` (reverse-mode differentiable); with traced bounds a
    ``while_loop``.
    """
    if isinstance(lower, (int, np.integer)) and isinstance(upper, (int, np.integer)):
        count = max(int(upper) - int(lower), 0)

        def step(carry: Any, i: Any) -> tuple[Any, None]:
            new_carry = body_fun(i, carry)
            if tree.structure(new_carry) != tree.structure(carry):  # else scan's error would name scan
                raise TypeError(f"fori_loop: body_fun must return a carry of the same structure as init_val: "
                                f"got {tree.structure(new_carry)}, expected {tree.structure(carry)}")
            return new_carry, None
        from funcgrad.numpy import arange
        if count == 0:
            return init_val
        carry, _ = scan(step, init_val, arange(int(lower), int(upper), dtype=dtypes.int32))
        return carry
    lower_t, upper_t = as_tensor(lower).astype(dtypes.int32), as_tensor(upper).astype(dtypes.int32)

    def loop_cond(state: Any) -> Any:
        return state[0] < upper_t

    def loop_body(state: Any) -> Any:
        i, val = state
        new_val = body_fun(i, val)
        if tree.structure(new_val) != tree.structure(val):  # else while_loop's error would show the (i, carry) pair
            raise TypeError(f"fori_loop: body_fun must return a carry of the same structure as init_val: "
                            f"got {tree.structure(new_val)}, expected {tree.structure(val)}")
        return i + 1, new_val
    return while_loop(loop_cond, loop_body, (lower_t, init_val))[1]


def map(f: Callable[[Any], Any], xs: Any) -> Any:  # noqa: A001 - lax.map
    """``stack([f(x) for x in xs])`` as a scan (sequential, constant memory in the body)."""
    _, ys = scan(lambda carry, x: (carry, f(x)), (), xs)
    return ys


def conv_general_dilated(lhs: Any, rhs: Any, window_strides: Sequence[int], padding: str | Sequence[tuple[int, int]],
                         lhs_dilation: Sequence[int] | None = None, rhs_dilation: Sequence[int] | None = None,
                         feature_group_count: int = 1) -> Tensor:
    """JAX's ``lax.conv_general_dilated`` with NCHW lhs and OIHW rhs (any number of spatial dims).

    ``padding`` is 'VALID', 'SAME' (output size ceil(input / stride)) or one (low, high) pair per
    spatial dim (negative pads crop). Differentiable, batchable; the compiler lowers it to one
    matrix-product kernel with the operand layout chosen per convolution.

    >>> conv_general_dilated(np.ones((1, 2, 5, 5), np.float32), np.ones((3, 2, 3, 3), np.float32), (1, 1), 'SAME').shape
    (1, 3, 5, 5)
    """
    lhs, rhs = as_tensor(lhs), as_tensor(rhs)
    spatial = lhs.ndim - 2
    if spatial < 1:
        raise ValueError(f"conv_general_dilated: lhs must be (N, C, *spatial), got shape {lhs.shape}")
    strides = tuple(int(s) for s in window_strides)
    lhs_dil = tuple(int(d) for d in lhs_dilation) if lhs_dilation is not None else (1,) * spatial
    rhs_dil = tuple(int(d) for d in rhs_dilation) if rhs_dilation is not None else (1,) * spatial
    if isinstance(padding, str):
        mode = padding.upper()
        if mode not in ("SAME", "VALID"):
            raise ValueError(f"conv_general_dilated: padding must be 'SAME', 'VALID' or (low, high) pairs, "
                             f"got {padding!r}")
        pads = []
        for size, kernel, stride, ld, rd in zip(lhs.shape[2:], rhs.shape[2:], strides, lhs_dil, rhs_dil):
            total = 0
            if mode == "SAME":
                dilated, span = (size - 1) * ld + 1, (kernel - 1) * rd + 1
                total = max((-(-dilated // stride) - 1) * stride + span - dilated, 0)
            pads.append((total // 2, total - total // 2))
        pad_pairs = tuple(pads)
    else:
        pad_pairs = tuple((int(lo), int(hi)) for lo, hi in padding)
    return bind(P.conv_general_dilated_p, lhs, rhs, window_strides=strides, padding=pad_pairs,
                lhs_dilation=lhs_dil, rhs_dilation=rhs_dil, feature_group_count=int(feature_group_count))
