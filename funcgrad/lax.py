"""funcgrad.lax: structured control flow that traces (cond, switch, while_loop, fori_loop, scan), and
the primitives by JAX's lax names (``lax.add``, ``lax.mul``, ``lax.dot_general``, ...: no dtype
promotion, Python scalars weakly typed).

Python's ``if`` and ``for`` run at trace time; these functions put the control flow into the IR
instead, so it works on traced values and under every transformation. Each traces its Python
callables into open sub-IRs (``funcgrad/ir/higher_order.py``), passes their captured constants as
operands, and binds one primitive. Their differentiation and batching rules are in
``funcgrad/transforms/control_flow.py``.
"""

from __future__ import annotations

import builtins
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
        count = builtins.max(int(upper) - int(lower), 0)

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
                total = builtins.max((-(-dilated // stride) - 1) * stride + span - dilated, 0)
            pads.append((total // 2, total - total // 2))
        pad_pairs = tuple(pads)
    else:
        pad_pairs = tuple((int(lo), int(hi)) for lo, hi in padding)
    return bind(P.conv_general_dilated_p, lhs, rhs, window_strides=strides, padding=pad_pairs,
                lhs_dilation=lhs_dil, rhs_dilation=rhs_dil, feature_group_count=int(feature_group_count))


# --- the primitives by name, as JAX's lax namespace spells them ------------------------------------
# Thin: each binds one primitive (or a few) on operands of one dtype, without NumPy's promotion; a
# Python scalar takes the dtype of the array operands (weak typing), and rank-0 operands broadcast.

def _lax_operands(name: str, *operands: Any) -> list[Any]:
    """Tensors for the array operands; Python scalars as NumPy scalars of the arrays' dtype."""
    arrays = [x for x in operands if not isinstance(x, (bool, int, float))]
    tensors = [as_tensor(x) for x in arrays]
    dtype = tensors[0].dtype if tensors else None
    out: list[Any] = []
    it = iter(tensors)
    for x in operands:
        if isinstance(x, (bool, int, float)):
            out.append(np.asarray(x, dtype)[()] if dtype is not None else as_tensor(x))
        else:
            out.append(next(it))
    found = {o.dtype for o in out if isinstance(o, Tensor)}
    if len(found) > 1:
        raise TypeError(f"lax.{name} requires arguments to have the same dtypes, got "
                        f"{', '.join(sorted(np.dtype(d).name for d in found))} (lax does not promote: cast with "
                        "lax.convert_element_type, or use funcgrad.numpy)")
    return out


def _lax_unary(name: str, primitive: P.Primitive) -> Callable[[Any], Tensor]:
    def fn(x: Any) -> Tensor:
        return bind(primitive, *_lax_operands(name, x))
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``lax.{name}``: the ``{primitive.name}`` primitive, elementwise."
    return fn


def _lax_binary(name: str, primitive: P.Primitive) -> Callable[[Any, Any], Tensor]:
    def fn(x: Any, y: Any) -> Tensor:
        return bind(primitive, *_lax_operands(name, x, y))
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``lax.{name}``: the ``{primitive.name}`` primitive, elementwise (operands of one dtype)."
    return fn


neg, abs, sign = _lax_unary("neg", P.neg_p), _lax_unary("abs", P.abs_p), _lax_unary("sign", P.sign_p)  # noqa: A001
exp, exp2, log, log1p, expm1 = (_lax_unary("exp", P.exp_p), _lax_unary("exp2", P.exp2_p), _lax_unary("log", P.log_p),
                                _lax_unary("log1p", P.log1p_p), _lax_unary("expm1", P.expm1_p))
sin, cos, tan = _lax_unary("sin", P.sin_p), _lax_unary("cos", P.cos_p), _lax_unary("tan", P.tan_p)
asin, acos, atan = _lax_unary("asin", P.asin_p), _lax_unary("acos", P.acos_p), _lax_unary("atan", P.atan_p)
sinh, cosh, tanh = _lax_unary("sinh", P.sinh_p), _lax_unary("cosh", P.cosh_p), _lax_unary("tanh", P.tanh_p)
asinh, acosh, atanh = _lax_unary("asinh", P.asinh_p), _lax_unary("acosh", P.acosh_p), _lax_unary("atanh", P.atanh_p)
sqrt, rsqrt = _lax_unary("sqrt", P.sqrt_p), _lax_unary("rsqrt", P.rsqrt_p)
logistic = _lax_unary("logistic", P.logistic_p)
erf, floor, ceil = _lax_unary("erf", P.erf_p), _lax_unary("floor", P.floor_p), _lax_unary("ceil", P.ceil_p)
is_finite, bitwise_not = _lax_unary("is_finite", P.is_finite_p), _lax_unary("bitwise_not", P.not_p)
add, sub, mul, div = (_lax_binary("add", P.add_p), _lax_binary("sub", P.sub_p), _lax_binary("mul", P.mul_p),
                      _lax_binary("div", P.div_p))
rem, pow, atan2 = _lax_binary("rem", P.rem_p), _lax_binary("pow", P.pow_p), _lax_binary("atan2", P.atan2_p)  # noqa: A001
max, min = _lax_binary("max", P.max_p), _lax_binary("min", P.min_p)  # noqa: A001
bitwise_and, bitwise_or, bitwise_xor = (_lax_binary("bitwise_and", P.and_p), _lax_binary("bitwise_or", P.or_p),
                                        _lax_binary("bitwise_xor", P.xor_p))
shift_left = _lax_binary("shift_left", P.shift_left_p)
eq, ne, lt = _lax_binary("eq", P.eq_p), _lax_binary("ne", P.ne_p), _lax_binary("lt", P.lt_p)
le, gt, ge = _lax_binary("le", P.le_p), _lax_binary("gt", P.gt_p), _lax_binary("ge", P.ge_p)


def shift_right_arithmetic(x: Any, y: Any) -> Tensor:
    """``lax.shift_right_arithmetic`` (signed integers: the sign bit fills in)."""
    a, b = _lax_operands("shift_right_arithmetic", x, y)
    if dtypes.is_unsigned(a.dtype):  # funcgrad's shift_right is logical on unsigned values
        raise TypeError(f"lax.shift_right_arithmetic of unsigned {a.dtype.name}: use shift_right_logical")
    return bind(P.shift_right_p, a, b)


def shift_right_logical(x: Any, y: Any) -> Tensor:
    """``lax.shift_right_logical`` (zeros fill in): the shift of the values as unsigned integers."""
    a, b = _lax_operands("shift_right_logical", x, y)
    if dtypes.is_unsigned(a.dtype):
        return bind(P.shift_right_p, a, b)
    unsigned = np.dtype(f"uint{a.dtype.itemsize * 8}")
    cast = [bind(P.bitcast_convert_type_p, v if isinstance(v, Tensor) else as_tensor(v), new_dtype=unsigned)
            for v in (a, b)]
    return bind(P.bitcast_convert_type_p, bind(P.shift_right_p, *cast), new_dtype=a.dtype)


def square(x: Any) -> Tensor:
    """``lax.square``: ``x * x``."""
    (a,) = _lax_operands("square", x)
    return bind(P.mul_p, a, a)


def reciprocal(x: Any) -> Tensor:
    """``lax.reciprocal``: ``1 / x``."""
    (a,) = _lax_operands("reciprocal", x)
    return bind(P.div_p, np.ones((), a.dtype)[()], a)


def integer_pow(x: Any, y: int) -> Tensor:
    """``lax.integer_pow``: ``x ** y`` for a Python int ``y`` (repeated multiplication)."""
    if isinstance(y, bool) or not isinstance(y, (int, np.integer)):
        raise TypeError(f"lax.integer_pow needs a Python int exponent, got {y!r}")
    (a,) = _lax_operands("integer_pow", x)
    result: Any = None
    base, n = a, builtins.abs(int(y))
    while n:  # square-and-multiply
        if n & 1:
            result = base if result is None else bind(P.mul_p, result, base)
        n >>= 1
        if n:
            base = bind(P.mul_p, base, base)
    if result is None:
        result = bind(P.broadcast_in_dim_p, np.ones((), a.dtype)[()], shape=a.shape, broadcast_dimensions=())
    return bind(P.div_p, np.ones((), a.dtype)[()], result) if y < 0 else result


def round(x: Any, rounding_method: int = 0) -> Tensor:  # noqa: A001
    """``lax.round``: halves away from zero (``rounding_method=0``, JAX's default) or to even (1)."""
    (a,) = _lax_operands("round", x)
    if int(rounding_method) == 1:
        return bind(P.round_p, a)
    if int(rounding_method) != 0:
        raise ValueError(f"lax.round: rounding_method must be 0 (away from zero) or 1 (to nearest even), "
                         f"got {rounding_method!r}")
    half = np.asarray(0.5, a.dtype)[()]
    return bind(P.mul_p, bind(P.sign_p, a), bind(P.floor_p, bind(P.add_p, bind(P.abs_p, a), half)))


def clamp(min: Any, x: Any, max: Any) -> Tensor:  # noqa: A002 - lax.clamp(min, x, max)
    """``lax.clamp(min, x, max)``."""
    low, value, high = _lax_operands("clamp", min, x, max)
    return bind(P.min_p, bind(P.max_p, value, low), high)


def convert_element_type(operand: Any, new_dtype: Any) -> Tensor:
    """``lax.convert_element_type``: a cast (floats to ints round toward zero)."""
    return bind(P.convert_element_type_p, as_tensor(operand), new_dtype=dtypes.canonicalize(new_dtype))


def bitcast_convert_type(operand: Any, new_dtype: Any) -> Tensor:
    """``lax.bitcast_convert_type``: the same bits read as ``new_dtype`` (of the same width)."""
    return bind(P.bitcast_convert_type_p, as_tensor(operand), new_dtype=dtypes.canonicalize(new_dtype))


def reshape(operand: Any, new_sizes: Sequence[int], dimensions: Sequence[int] | None = None) -> Tensor:
    """``lax.reshape``; ``dimensions`` transposes first, as JAX's."""
    x = as_tensor(operand)
    if dimensions is not None:
        x = transpose(x, dimensions)
    return bind(P.reshape_p, x, new_sizes=tuple(int(d) for d in new_sizes))


def transpose(operand: Any, permutation: Sequence[int]) -> Tensor:
    """``lax.transpose``."""
    return bind(P.transpose_p, as_tensor(operand), permutation=tuple(int(p) for p in permutation))


def broadcast_in_dim(operand: Any, shape: Sequence[int], broadcast_dimensions: Sequence[int]) -> Tensor:
    """``lax.broadcast_in_dim``."""
    return bind(P.broadcast_in_dim_p, as_tensor(operand), shape=tuple(int(d) for d in shape),
                broadcast_dimensions=tuple(int(d) for d in broadcast_dimensions))


def broadcast(operand: Any, sizes: Sequence[int]) -> Tensor:
    """``lax.broadcast``: new leading axes of ``sizes``."""
    x = as_tensor(operand)
    sizes = tuple(int(d) for d in sizes)
    return broadcast_in_dim(x, sizes + x.shape, tuple(range(len(sizes), len(sizes) + x.ndim)))


def squeeze(array: Any, dimensions: Sequence[int]) -> Tensor:
    """``lax.squeeze``: drop the listed axes of size 1."""
    x = as_tensor(array)
    axes = {int(d) % x.ndim for d in dimensions} if x.ndim else set()
    for d in axes:
        if x.shape[d] != 1:
            raise ValueError(f"lax.squeeze: axis {d} of shape {x.shape} has size {x.shape[d]}, not 1")
    return bind(P.reshape_p, x, new_sizes=tuple(s for i, s in enumerate(x.shape) if i not in axes))


def expand_dims(array: Any, dimensions: Sequence[int]) -> Tensor:
    """``lax.expand_dims``: insert axes of size 1 at ``dimensions`` (positions in the result)."""
    x = as_tensor(array)
    rank = x.ndim + len(dimensions)
    where = sorted(int(d) % rank for d in dimensions)
    shape = list(x.shape)
    for d in where:
        shape.insert(d, 1)
    return bind(P.reshape_p, x, new_sizes=tuple(shape))


def rev(operand: Any, dimensions: Sequence[int]) -> Tensor:
    """``lax.rev``: reverse the listed axes."""
    return bind(P.flip_p, as_tensor(operand), axes=tuple(sorted(int(d) for d in dimensions)))


def pad(operand: Any, padding_value: Any, padding_config: Sequence[tuple[int, int, int]]) -> Tensor:
    """``lax.pad`` with ``(low, high, interior)`` per axis, as JAX: ``interior`` values between
    neighbours first, then ``low``/``high`` at the ends, where a negative amount removes elements."""
    x = as_tensor(operand)
    config = [tuple(int(v) for v in c) for c in padding_config]
    if len(config) != x.ndim:
        raise ValueError(f"lax.pad: padding_config has {len(config)} entries for an operand of rank {x.ndim}")
    if any(len(c) != 3 for c in config):
        raise ValueError(f"lax.pad: each padding_config entry is (low, high, interior), got {padding_config!r}")
    if any(c[2] < 0 for c in config):
        raise ValueError(f"lax.pad: interior padding must be non-negative, got {padding_config!r}")
    sizes = [lo + hi + d + builtins.max(d - 1, 0) * interior for d, (lo, hi, interior) in zip(x.shape, config)]
    if any(size < 0 for size in sizes):
        raise ValueError(f"lax.pad: padding_config {padding_config!r} gives the negative shape {tuple(sizes)} "
                         f"for an operand of shape {x.shape}")
    value = np.asarray(padding_value, x.dtype)[()] if not isinstance(padding_value, Tensor) else padding_value
    for axis, (_, _, interior) in enumerate(config):
        n = x.shape[axis]
        if interior and n > 1:  # each element followed by `interior` values: (n, 1) -> (n, 1 + interior), cut the last
            spread = x.reshape((*x.shape[:axis + 1], 1, *x.shape[axis + 1:]))
            spread = bind(P.pad_p, spread, value, low=(0,) * spread.ndim,
                          high=tuple(interior if d == axis + 1 else 0 for d in range(spread.ndim)))
            spread = spread.reshape((*x.shape[:axis], n * (1 + interior), *x.shape[axis + 1:]))
            x = bind(P.slice_p, spread, start=(0,) * x.ndim,
                     limit=tuple(n + (n - 1) * interior if d == axis else x.shape[d] for d in range(x.ndim)),
                     strides=(1,) * x.ndim)
    low = tuple(builtins.max(c[0], 0) for c in config)
    high = tuple(builtins.max(c[1], 0) for c in config)
    if any(low) or any(high):
        x = bind(P.pad_p, x, value, low=low, high=high)
    if any(c[0] < 0 or c[1] < 0 for c in config):  # negative amounts crop
        start = tuple(builtins.max(-c[0], 0) for c in config)
        limit = tuple(d - builtins.max(-c[1], 0) for d, c in zip(x.shape, config))
        x = bind(P.slice_p, x, start=start, limit=limit, strides=(1,) * x.ndim)
    return x if x is not operand else bind(P.pad_p, x, value, low=(0,) * x.ndim, high=(0,) * x.ndim)


def slice(operand: Any, start_indices: Sequence[int], limit_indices: Sequence[int],  # noqa: A001
          strides: Sequence[int] | None = None) -> Tensor:
    """``lax.slice``."""
    x = as_tensor(operand)
    return bind(P.slice_p, x, start=tuple(int(s) for s in start_indices), limit=tuple(int(s) for s in limit_indices),
                strides=tuple(int(s) for s in strides) if strides is not None else (1,) * x.ndim)


def dynamic_slice(operand: Any, start_indices: Sequence[Any], slice_sizes: Sequence[int]) -> Tensor:
    """``lax.dynamic_slice`` (starts are clamped so the slice fits, as in JAX)."""
    starts = [as_tensor(s).astype(dtypes.int32) if not isinstance(s, (int, np.integer)) else np.int32(s)
              for s in start_indices]
    return bind(P.dynamic_slice_p, as_tensor(operand), *starts, slice_sizes=tuple(int(s) for s in slice_sizes))


def dynamic_update_slice(operand: Any, update: Any, start_indices: Sequence[Any]) -> Tensor:
    """``lax.dynamic_update_slice`` (starts are clamped so the update fits, as in JAX)."""
    starts = [as_tensor(s).astype(dtypes.int32) if not isinstance(s, (int, np.integer)) else np.int32(s)
              for s in start_indices]
    return bind(P.dynamic_update_slice_p, as_tensor(operand), as_tensor(update), *starts)


def concatenate(operands: Sequence[Any], dimension: int) -> Tensor:
    """``lax.concatenate``."""
    return bind(P.concatenate_p, *(as_tensor(x) for x in operands), axis=int(dimension))


def iota(dtype: Any, size: int) -> Tensor:
    """``lax.iota``: ``0, 1, ..., size - 1``."""
    return bind(P.iota_p, dtype=dtypes.canonicalize(dtype), shape=(int(size),), dimension=0)


def broadcasted_iota(dtype: Any, shape: Sequence[int], dimension: int) -> Tensor:
    """``lax.broadcasted_iota``: the index along ``dimension`` at every position of ``shape``."""
    return bind(P.iota_p, dtype=dtypes.canonicalize(dtype), shape=tuple(int(d) for d in shape),
                dimension=int(dimension))


def dot_general(lhs: Any, rhs: Any, dimension_numbers: Any, precision: Any = None,
                preferred_element_type: Any = None) -> Tensor:
    """``lax.dot_general`` with ``dimension_numbers = ((lhs_contract, rhs_contract), (lhs_batch, rhs_batch))``."""
    (lc, rc), (lb, rb) = dimension_numbers
    a, b = _lax_operands("dot_general", lhs, rhs)
    out = bind(P.dot_general_p, a, b, contracting=(tuple(int(d) for d in lc), tuple(int(d) for d in rc)),
               batch=(tuple(int(d) for d in lb), tuple(int(d) for d in rb)))
    return out if preferred_element_type is None else convert_element_type(out, preferred_element_type)


def dot(lhs: Any, rhs: Any, precision: Any = None, preferred_element_type: Any = None) -> Tensor:
    """``lax.dot``: vector/matrix products contracting the last axis of ``lhs`` with the first of ``rhs``."""
    a, b = as_tensor(lhs), as_tensor(rhs)
    if a.ndim not in (1, 2) or b.ndim not in (1, 2):
        raise TypeError(f"lax.dot takes rank-1 or rank-2 operands, got shapes {a.shape} and {b.shape}")
    return dot_general(a, b, (((a.ndim - 1,), (0,)), ((), ())), precision, preferred_element_type)


def _lax_reduce(name: str, primitive: P.Primitive) -> Callable[[Any, Sequence[int]], Tensor]:
    def fn(operand: Any, axes: Sequence[int]) -> Tensor:
        x = as_tensor(operand)
        return bind(primitive, x, axes=tuple(sorted(int(a) % x.ndim for a in axes)) if x.ndim else ())
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``lax.{name}`` over ``axes``."
    return fn


reduce_sum, reduce_prod = _lax_reduce("reduce_sum", P.reduce_sum_p), _lax_reduce("reduce_prod", P.reduce_prod_p)
reduce_max, reduce_min = _lax_reduce("reduce_max", P.reduce_max_p), _lax_reduce("reduce_min", P.reduce_min_p)


def argmax(operand: Any, axis: int, index_dtype: Any) -> Tensor:
    """``lax.argmax``."""
    return bind(P.argmax_p, as_tensor(operand), axis=int(axis), index_dtype=dtypes.canonicalize(index_dtype))


def argmin(operand: Any, axis: int, index_dtype: Any) -> Tensor:
    """``lax.argmin``."""
    return bind(P.argmin_p, as_tensor(operand), axis=int(axis), index_dtype=dtypes.canonicalize(index_dtype))


def _lax_cumulative(name: str, primitive: P.Primitive) -> Callable[..., Tensor]:
    def fn(operand: Any, axis: int = 0, reverse: bool = False) -> Tensor:
        x = as_tensor(operand)
        return bind(primitive, x, axis=int(axis) % builtins.max(x.ndim, 1), reverse=bool(reverse))
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``lax.{name}`` along ``axis``."
    return fn


cumsum, cumprod = _lax_cumulative("cumsum", P.cumsum_p), _lax_cumulative("cumprod", P.cumprod_p)
cummax, cummin = _lax_cumulative("cummax", P.cummax_p), _lax_cumulative("cummin", P.cummin_p)


def sort(operand: Any, dimension: int = -1, is_stable: bool = True, num_keys: int = 1) -> Any:
    """``lax.sort``: one array, or a sequence sorted together by the first ``num_keys`` of them."""
    single = isinstance(operand, Tensor) or not isinstance(operand, (list, tuple))
    operands = [as_tensor(operand)] if single else [as_tensor(x) for x in operand]
    outs = bind(P.sort_p, *operands, dimension=int(dimension) % operands[0].ndim, num_keys=int(num_keys),
                descending=False)
    return outs[0] if single else tuple(outs)


def stop_gradient(x: Any) -> Any:
    """``lax.stop_gradient``."""
    from funcgrad.transforms import stop_gradient as stop
    return stop(x)


__all__ += [
    "abs", "acos", "acosh", "add", "argmax", "argmin", "asin", "asinh", "atan", "atan2", "atanh",
    "bitcast_convert_type",
    "bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor", "broadcast", "broadcast_in_dim", "broadcasted_iota",
    "ceil", "clamp", "concatenate", "convert_element_type", "cos", "cosh", "cummax", "cummin", "cumprod", "cumsum",
    "div", "dot", "dot_general", "dynamic_slice", "dynamic_update_slice", "eq", "erf", "exp", "exp2", "expand_dims",
    "expm1", "floor", "ge", "gt", "integer_pow", "iota", "is_finite", "le", "log", "log1p", "logistic", "lt", "max",
    "min", "mul", "ne", "neg", "pad", "pow", "reciprocal", "reduce_max", "reduce_min", "reduce_prod", "reduce_sum",
    "rem", "reshape", "rev", "round", "rsqrt", "shift_left", "shift_right_arithmetic", "shift_right_logical", "sign",
    "sin", "sinh", "slice", "sort", "sqrt", "square", "squeeze", "stop_gradient", "sub", "tan", "tanh", "transpose",
]

# collectives over named axes (vmap/pmap/shard_map bind the names): funcgrad/parallel.py
from funcgrad.parallel import all_gather, axis_index, pmax, pmean, pmin, ppermute, psum, psum_scatter  # noqa: E402

__all__ += ["all_gather", "axis_index", "pmax", "pmean", "pmin", "ppermute", "psum", "psum_scatter"]
