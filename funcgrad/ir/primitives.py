"""The primitive registry: every operation the IR can hold, with its shape rule, NumPy reference
and lowering facts.

A primitive is a name plus these, kept here side by side:

* ``shape_rule(*avals, **params) -> aval`` (or a tuple of avals when ``multiple_results``): it checks
  its operands and raises ``TypeError``/``ValueError`` naming the shapes and dtypes involved;
* ``impl(*arrays, **params) -> array``: the NumPy reference implementation, the oracle of the test
  suite and the evaluator of the interpreter;
* ``kernel_op`` and ``arity``: for an elementwise primitive computed by one ALU operation of the kernel
  IR (``funcgrad.lower.kernel``), that operation's name and its operand count (``kernel.UNARY`` and
  ``kernel.BINARY`` are read from here); None for every other primitive;
* ``cost``: its cost class, one of ``COST_CLASSES``. The lowering layer's "costly op" sets
  (``schedule.EXPENSIVE``, ``render_loops.COSTLY``, ``devices/cpu.TRANSCENDENTAL``) are derived from
  it with ``with_cost``; ``tests/ir/test_lowering_facts.py`` checks that they stay derived.

Transforms keep their rules in their own tables (``transforms/ad.py`` has ``jvp_rules[exp_p]``...);
``tests/ir/test_registry.py`` walks ``REGISTRY`` and fails when any primitive lacks a rule.

Conventions (as in XLA/JAX's lax): elementwise primitives take operands of one dtype and one
shape, except that rank-0 operands broadcast (so ``mul a 2.0`` needs no broadcast). Broadcasting,
promotion and defaults are the job of ``funcgrad.numpy``, which inserts explicit
``broadcast_in_dim`` and ``convert_element_type`` equations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.ir import dtypes
from funcgrad.ir.core import ShapedArray, check_array_size

REGISTRY: dict[str, Primitive] = {}

# What computing one element of a primitive costs, as the lowering layer's heuristics see it. The three
# "costly op" sets were written by hand and disagreed; the classes below name each disagreement, so that
# every set is derived from them with its kernels unchanged (the replay recordings prove it).
COST_CLASSES: dict[str, str] = {
    "cheap": "one or a few ALU instructions",
    "divide": "div, sqrt, rsqrt: one long-latency instruction, vectorised, no library call. Costly to the "
              "scheduler (schedule.EXPENSIVE) and to render_llvm's row reuse (COSTLY); the CPU's work "
              "estimate (devices/cpu.TRANSCENDENTAL) counts it as one simple operation",
    "transcendental": "a library call (libm on the CPU) or an inline polynomial; in all three sets",
    "transcendental_no_row_reuse": "a transcendental function that render_llvm's row reuse (COSTLY) has "
                                   "never counted: counting it would change the CPU kernels of row "
                                   "reductions over it; in the other two sets",
    "float_call": "rem: integer arithmetic, but a library call (fmod) for floats: only the CPU's work "
                  "estimate (TRANSCENDENTAL, on float operands) counts it; the scheduler and the row reuse "
                  "treat it as cheap, and counting it there would change their kernels",
}


class Primitive:
    """A named operation of the IR. Instances are singletons registered in ``REGISTRY``."""

    def __init__(self, name: str, shape_rule: Callable[..., Any], impl: Callable[..., Any],
                 multiple_results: bool = False, *, kernel_op: str | None = None, arity: int | None = None,
                 cost: str = "cheap") -> None:
        if name in REGISTRY:
            raise ValueError(f"primitive {name!r} is already registered")
        if cost not in COST_CLASSES:
            raise ValueError(f"primitive {name!r}: unknown cost class {cost!r}; the classes are "
                             f"{', '.join(COST_CLASSES)}")
        if (kernel_op is None) != (arity is None):
            raise ValueError(f"primitive {name!r}: a kernel op needs its arity, and only a kernel op has one")
        self.name = name
        self.shape_rule = shape_rule
        self.impl = impl
        self.multiple_results = multiple_results
        self.kernel_op = kernel_op  # the kernel IR's ALU op computing it elementwise, or None
        self.arity = arity  # the kernel op's operand count
        self.cost = cost
        REGISTRY[name] = self

    def abstract_eval(self, *avals: ShapedArray, **params: Any) -> Any:
        return self.shape_rule(*avals, **params)

    def __repr__(self) -> str:
        return self.name

    def __reduce__(self) -> tuple[Any, ...]:  # pickle by name so IRs can be cached on disk
        return (lookup, (self.name,))


def with_cost(*classes: str) -> list[Primitive]:
    """The registered primitives whose cost class is one of ``classes`` (in registration order)."""
    unknown = [c for c in classes if c not in COST_CLASSES]
    if unknown:
        raise ValueError(f"unknown cost classes {unknown}; the classes are {', '.join(COST_CLASSES)}")
    return [p for p in REGISTRY.values() if p.cost in classes]


def kernel_ops(arity: int) -> tuple[str, ...]:
    """The kernel ops of the elementwise primitives taking ``arity`` operands (in registration order)."""
    return tuple(p.kernel_op for p in REGISTRY.values() if p.kernel_op is not None and p.arity == arity)


def lookup(name: str) -> Primitive:
    """The registered primitive called ``name``."""
    if name not in REGISTRY:
        raise KeyError(f"no primitive named {name!r}; known: {', '.join(sorted(REGISTRY))}")
    return REGISTRY[name]


# --- helpers for the rules ---------------------------------------------------------------------

_LOW_PRECISION = dtypes.LOW_PRECISION


def _compute_in_f32(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Evaluate a float function in float32 for float16/bfloat16 inputs and round the result back,
    as hardware does; NumPy lacks most ufunc loops for bfloat16."""
    def impl(*xs: np.ndarray, **params: Any) -> np.ndarray:
        dtype = np.asarray(xs[0]).dtype
        if dtype in _LOW_PRECISION:
            return np.asarray(fn(*(np.asarray(x, np.float32) for x in xs), **params)).astype(dtype)
        return np.asarray(fn(*xs, **params))
    return impl


def _check_kinds(name: str, avals: Sequence[ShapedArray], kinds: str) -> None:
    """kinds: any of 'b' (bool), 'i' (signed/unsigned int), 'f' (float), 'c' (complex)."""
    for aval in avals:
        kind = ("b" if dtypes.is_bool(aval.dtype) else "i" if dtypes.is_int(aval.dtype)
                else "c" if dtypes.is_complex(aval.dtype) else "f")
        if kind not in kinds:
            allowed = {"b": "bool", "i": "integer", "f": "floating", "c": "complex"}
            raise TypeError(f"{name} does not accept {aval.dtype.name} operands "
                            f"(it takes {' or '.join(allowed[k] for k in kinds)} arrays)")


def _elementwise_shape(name: str, avals: Sequence[ShapedArray]) -> tuple[int, ...]:
    shapes = {a.shape for a in avals if a.shape != ()}
    if len(shapes) > 1:
        raise ValueError(f"{name} needs operands of one shape (or rank 0), got "
                         f"{', '.join(str(a.shape) for a in avals)}")
    return shapes.pop() if shapes else ()


def _same_dtype(name: str, avals: Sequence[ShapedArray]) -> np.dtype:
    kinds = {a.dtype for a in avals}
    if len(kinds) > 1:
        raise TypeError(f"{name} needs operands of one dtype, got "
                        f"{', '.join(a.dtype.name for a in avals)}")
    return avals[0].dtype


def _unary(name: str, impl: Callable[..., np.ndarray], kinds: str = "if",
           out_dtype: np.dtype | None = None, cost: str = "cheap", kernel: bool = True) -> Primitive:
    """An elementwise primitive of one operand; ``kernel``: computed by the kernel op of its name."""
    def rule(x: ShapedArray) -> ShapedArray:
        _check_kinds(name, [x], kinds)
        return ShapedArray(x.shape, out_dtype or x.dtype)
    return Primitive(name, rule, impl, kernel_op=name if kernel else None, arity=1 if kernel else None, cost=cost)


def _binary(name: str, impl: Callable[..., np.ndarray], kinds: str = "if",
            out_dtype: np.dtype | None = None, cost: str = "cheap") -> Primitive:
    """An elementwise primitive of two operands, computed by the kernel op of its name."""
    def rule(x: ShapedArray, y: ShapedArray) -> ShapedArray:
        dtype = _same_dtype(name, [x, y])
        _check_kinds(name, [x, y], kinds)
        return ShapedArray(_elementwise_shape(name, [x, y]), out_dtype or dtype)
    return Primitive(name, rule, impl, kernel_op=name, arity=2, cost=cost)


def _normalize_axes(name: str, axes: Sequence[int], ndim: int) -> tuple[int, ...]:
    for ax in axes:
        if not 0 <= ax < ndim:
            raise ValueError(f"{name}: axis {ax} is out of range for an array of rank {ndim}")
    if len(set(axes)) != len(axes):
        raise ValueError(f"{name}: repeated axis in {tuple(axes)}")
    return tuple(axes)


def _typed(fn: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Keep the first operand's dtype: NumPy sometimes widens (e.g. int8 + int8 stays, but
    uint32 >> uint32 or bool arithmetic do not)."""
    def impl(*xs: np.ndarray, **params: Any) -> np.ndarray:
        return np.asarray(fn(*xs, **params)).astype(np.asarray(xs[-1]).dtype, copy=False)
    return impl


# --- elementwise: unary ------------------------------------------------------------------------

neg_p = _unary("neg", _typed(np.negative), "ifc")


def _abs_rule(x: ShapedArray) -> ShapedArray:
    _check_kinds("abs", [x], "ifc")
    return ShapedArray(x.shape, dtypes.real_dtype(x.dtype))  # |complex64| is float32


def _abs_impl(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return np.asarray(np.abs(x)).astype(dtypes.real_dtype(x.dtype), copy=False)


abs_p = Primitive("abs", _abs_rule, _abs_impl, kernel_op="abs", arity=1)


def _sign(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    if dtypes.is_complex(x.dtype):  # z / |z| (0 at 0), as JAX and the Array API define it
        magnitude = np.abs(x)
        return np.where(magnitude == 0, 0, x / np.where(magnitude == 0, 1, magnitude)).astype(x.dtype)
    return np.asarray(np.sign(x)).astype(x.dtype, copy=False)


sign_p = _unary("sign", _sign, "ifc")
exp_p = _unary("exp", _compute_in_f32(np.exp), "fc", cost="transcendental")
log_p = _unary("log", _compute_in_f32(np.log), "fc", cost="transcendental")
exp2_p = _unary("exp2", _compute_in_f32(np.exp2), "f", cost="transcendental")
log2_p = _unary("log2", _compute_in_f32(np.log2), "f", cost="transcendental")
def _expm1(x: np.ndarray) -> np.ndarray:
    """NumPy's expm1; for complex x, exp(x) - 1 written as (expm1(a) cos b - 2 sin^2(b/2)) + i e^a sin b
    with C99's special values (NumPy's complex expm1 gives inf + nan j for inf + 0j)."""
    x = np.asarray(x)
    if not dtypes.is_complex(x.dtype):
        return np.asarray(np.expm1(x))
    a, b = x.real, x.imag
    with np.errstate(all="ignore"):
        re = np.expm1(a) * np.cos(b) - 2 * np.sin(b / 2) ** 2
        im = np.where(b == 0, b, np.exp(a) * np.sin(b))
        unbounded_b = ~np.isfinite(b)
        re = np.where(a == -np.inf, -1.0, np.where((a == np.inf) & unbounded_b, np.inf, re))
        im = np.where((a == -np.inf) & unbounded_b, 0.0, np.where((a == np.inf) & unbounded_b, np.nan, im))
        re = np.where((a == 0) & (b == 0), 0.0, re)
    return _complex_impl(re.astype(a.dtype), im.astype(a.dtype))


expm1_p = _unary("expm1", _compute_in_f32(_expm1), "fc", cost="transcendental")
log1p_p = _unary("log1p", _compute_in_f32(np.log1p), "fc", cost="transcendental")
sin_p = _unary("sin", _compute_in_f32(np.sin), "fc", cost="transcendental")
cos_p = _unary("cos", _compute_in_f32(np.cos), "fc", cost="transcendental")
tan_p = _unary("tan", _compute_in_f32(np.tan), "fc", cost="transcendental_no_row_reuse")
asin_p = _unary("asin", _compute_in_f32(np.arcsin), "fc", cost="transcendental_no_row_reuse")
acos_p = _unary("acos", _compute_in_f32(np.arccos), "fc", cost="transcendental_no_row_reuse")
atan_p = _unary("atan", _compute_in_f32(np.arctan), "fc", cost="transcendental_no_row_reuse")
sinh_p = _unary("sinh", _compute_in_f32(np.sinh), "fc", cost="transcendental_no_row_reuse")
cosh_p = _unary("cosh", _compute_in_f32(np.cosh), "fc", cost="transcendental_no_row_reuse")
tanh_p = _unary("tanh", _compute_in_f32(np.tanh), "fc", cost="transcendental")
asinh_p = _unary("asinh", _compute_in_f32(np.arcsinh), "fc", cost="transcendental_no_row_reuse")
acosh_p = _unary("acosh", _compute_in_f32(np.arccosh), "fc", cost="transcendental_no_row_reuse")
atanh_p = _unary("atanh", _compute_in_f32(np.arctanh), "fc", cost="transcendental_no_row_reuse")
sqrt_p = _unary("sqrt", _compute_in_f32(np.sqrt), "fc", cost="divide")
rsqrt_p = _unary("rsqrt", _compute_in_f32(lambda x: 1 / np.sqrt(x)), "fc", cost="divide")
logistic_p = _unary("logistic", _compute_in_f32(lambda x: 0.5 * np.tanh(0.5 * x) + 0.5), "f", cost="transcendental")


def _erf(x: np.ndarray) -> np.ndarray:
    # math.erf is exact to double precision; vectorise it (no SciPy dependency)
    import math
    return np.vectorize(math.erf, otypes=[np.float64])(x).astype(np.asarray(x).dtype)


erf_p = _unary("erf", _compute_in_f32(_erf), "f", cost="transcendental")
floor_p = _unary("floor", _compute_in_f32(np.floor), "f")
ceil_p = _unary("ceil", _compute_in_f32(np.ceil), "f")
round_p = _unary("round", _compute_in_f32(np.rint), "f")  # half to even, as NumPy and the Array API


def _is_finite(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x)
    return np.isfinite(x.astype(np.float32) if x.dtype in _LOW_PRECISION else x)


is_finite_p = _unary("is_finite", _is_finite, "fc", out_dtype=dtypes.bool_)
not_p = _unary("not", np.invert, "bi")  # logical for bool, bitwise for integers
# the identity without a derivative: a kernel reads its operand, no kernel op computes it
stop_gradient_p = _unary("stop_gradient", lambda x: np.array(x, copy=True), "bifc", kernel=False)

# complex numbers: the parts, the conjugate, and a complex number from two parts. Every equation with a
# complex operand or result runs as a host step (see lower/schedule.py: kind_of), so none has a kernel op.


def _part_rule(name: str) -> Callable[[ShapedArray], ShapedArray]:
    def rule(x: ShapedArray) -> ShapedArray:
        _check_kinds(name, [x], "c")
        return ShapedArray(x.shape, dtypes.real_dtype(x.dtype))
    return rule


real_p = Primitive("real", _part_rule("real"), lambda x: np.array(np.real(x)))  # a C-contiguous copy
imag_p = Primitive("imag", _part_rule("imag"), lambda x: np.array(np.imag(x)))
conj_p = _unary("conj", np.conjugate, "c", kernel=False)


def _complex_rule(re: ShapedArray, im: ShapedArray) -> ShapedArray:
    dtype = _same_dtype("complex", [re, im])
    if dtype not in (dtypes.float32, dtypes.float64):
        raise TypeError(f"complex needs float32 or float64 parts, got {dtype.name}")
    return ShapedArray(_elementwise_shape("complex", [re, im]), dtypes.complex_dtype(dtype))


def _complex_impl(re: np.ndarray, im: np.ndarray) -> np.ndarray:
    re, im = np.asarray(re), np.asarray(im)
    out = np.empty(np.broadcast_shapes(re.shape, im.shape), dtypes.complex_dtype(re.dtype))
    out.real, out.imag = re, im  # not re + 1j * im: that turns (inf, 0) into (inf, nan)
    return out


complex_p = Primitive("complex", _complex_rule, _complex_impl)


def _name_rule(x: ShapedArray, *, name: str) -> ShapedArray:
    if not isinstance(name, str):
        raise TypeError(f"checkpoint_name: the name must be a string, got {name!r}")
    return x


# the identity that names a value (``checkpoint_name``) for checkpoint policies; lowered like stop_gradient
name_p = Primitive("name", _name_rule, lambda x, *, name: np.array(x, copy=True))

# --- elementwise: binary -----------------------------------------------------------------------


def _int_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Division rounding toward zero for integers (C and XLA semantics); x / 0 gives 0."""
    x, y = np.asarray(x), np.asarray(y)
    if dtypes.is_inexact(x.dtype):
        return _compute_in_f32(np.true_divide)(x, y).astype(x.dtype, copy=False)
    safe = np.where(y == 0, 1, y)
    if dtypes.is_unsigned(x.dtype):  # the int64 arithmetic below would wrap uint64 values >= 2**63
        return np.where(y == 0, 0, x // safe).astype(x.dtype)
    quotient = np.abs(x.astype(np.int64)) // np.abs(safe.astype(np.int64))
    signed = np.where((x < 0) != (safe < 0), -quotient, quotient)
    return np.where(y == 0, 0, signed).astype(x.dtype)


def _int_rem(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Remainder with the sign of the dividend (C fmod semantics); x % 0 gives 0 for integers."""
    x, y = np.asarray(x), np.asarray(y)
    if dtypes.is_float(x.dtype):
        return _compute_in_f32(np.fmod)(x, y)
    safe = np.where(y == 0, 1, y)
    return np.where(y == 0, 0, np.fmod(x, safe)).astype(x.dtype)


def _pow(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    x, y = np.asarray(x), np.asarray(y)
    if dtypes.is_int(x.dtype):
        # negative integer exponents give 0 except for bases 1 and -1, as in XLA
        safe = np.where(y < 0, 0, y)
        result = np.power(x, safe)
        inverse = np.where(x == 1, 1, np.where(x == -1, np.where(y % 2 == 0, 1, -1), 0))
        # (inverse is int64: mixing it with a uint64 result would go through float64)
        return np.where(y < 0, inverse.astype(x.dtype), result).astype(x.dtype)
    return _compute_in_f32(np.power)(x, y)


add_p = _binary("add", _typed(np.add), "ifc")
sub_p = _binary("sub", _typed(np.subtract), "ifc")
mul_p = _binary("mul", _typed(np.multiply), "ifc")
div_p = _binary("div", _int_div, "ifc", cost="divide")
rem_p = _binary("rem", _int_rem, "if", cost="float_call")
pow_p = _binary("pow", _pow, "ifc", cost="transcendental")
def _ieee_extremum(fn: Callable[..., np.ndarray], negative_wins: bool) -> Callable[..., np.ndarray]:
    """NumPy's maximum/minimum (NaN propagates) with IEEE 754-2019's order of zeros, -0.0 < +0.0,
    which compiled code uses (NumPy returns its second operand when the two compare equal)."""
    def impl(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x, y = np.asarray(x), np.asarray(y)
        out = np.asarray(fn(x, y)).astype(x.dtype, copy=False)
        if not dtypes.is_float(x.dtype):
            return out
        both_zero = (x == 0) & (y == 0)
        negative = np.signbit(x) | np.signbit(y) if negative_wins else np.signbit(x) & np.signbit(y)
        zero = np.where(negative, -0.0, 0.0).astype(x.dtype)
        return np.where(both_zero, zero, out).astype(x.dtype)
    return impl


max_p = _binary("max", _ieee_extremum(np.maximum, negative_wins=False), "bif")  # NaN-propagating, as the Array API
min_p = _binary("min", _ieee_extremum(np.minimum, negative_wins=True), "bif")
atan2_p = _binary("atan2", _compute_in_f32(np.arctan2), "f", cost="transcendental")
and_p = _binary("and", _typed(np.bitwise_and), "bi")
or_p = _binary("or", _typed(np.bitwise_or), "bi")
xor_p = _binary("xor", _typed(np.bitwise_xor), "bi")


def _shift(op: Callable[..., np.ndarray]) -> Callable[..., np.ndarray]:
    """Shifts by >= the bit width (or by a negative amount) give 0, or -1 for arithmetic right
    shifts of negative numbers, as XLA defines them; C leaves them undefined."""
    def impl(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        x, y = np.asarray(x), np.asarray(y)
        bits = x.dtype.itemsize * 8
        out_of_range = (y < 0) | (y >= bits)
        shifted = op(x, np.where(out_of_range, 0, y).astype(x.dtype))
        overflow = np.where(x < 0, -1, 0).astype(x.dtype) if op is np.right_shift else 0  # keep uint64 exact
        return np.where(out_of_range, overflow, shifted).astype(x.dtype)
    return impl


shift_left_p = _binary("shift_left", _shift(np.left_shift), "i")
shift_right_p = _binary("shift_right", _shift(np.right_shift), "i")  # arithmetic if signed

eq_p = _binary("eq", np.equal, "bifc", out_dtype=dtypes.bool_)
ne_p = _binary("ne", np.not_equal, "bifc", out_dtype=dtypes.bool_)
lt_p = _binary("lt", np.less, "bif", out_dtype=dtypes.bool_)
le_p = _binary("le", np.less_equal, "bif", out_dtype=dtypes.bool_)
gt_p = _binary("gt", np.greater, "bif", out_dtype=dtypes.bool_)
ge_p = _binary("ge", np.greater_equal, "bif", out_dtype=dtypes.bool_)


def _select_rule(pred: ShapedArray, on_true: ShapedArray, on_false: ShapedArray) -> ShapedArray:
    if pred.dtype != dtypes.bool_:
        raise TypeError(f"select needs a bool predicate, got {pred.dtype.name}")
    dtype = _same_dtype("select", [on_true, on_false])
    return ShapedArray(_elementwise_shape("select", [pred, on_true, on_false]), dtype)


def _select_impl(pred: np.ndarray, on_true: np.ndarray, on_false: np.ndarray) -> np.ndarray:
    return np.where(pred, on_true, on_false).astype(np.asarray(on_true).dtype)


select_p = Primitive("select", _select_rule, _select_impl)

# --- casts -------------------------------------------------------------------------------------


def _convert_rule(x: ShapedArray, *, new_dtype: np.dtype) -> ShapedArray:
    return ShapedArray(x.shape, dtypes.canonicalize(new_dtype))


def _convert_impl(x: np.ndarray, *, new_dtype: np.dtype) -> np.ndarray:
    x = np.asarray(x)
    if dtypes.is_complex(x.dtype) and not dtypes.is_complex(new_dtype) and new_dtype != dtypes.bool_:
        x = np.array(x.real)  # complex -> real keeps the real part, as JAX (and NumPy, warning)
    if dtypes.is_float(x.dtype) and dtypes.is_int(new_dtype):
        # float -> int truncates toward zero and saturates; NaN becomes 0 (XLA's defined behaviour)
        info = np.iinfo(new_dtype)
        wide = np.nan_to_num(np.trunc(x.astype(np.float64)), nan=0.0)
        # float64 cannot hold the int64/uint64 maximum (clip gives 2**63 or 2**64, which astype wraps)
        too_big = wide >= float(info.max)
        clipped = np.clip(np.where(too_big, 0, wide), info.min, info.max).astype(new_dtype)
        return np.where(too_big, info.max, clipped).astype(new_dtype)
    if new_dtype == dtypes.bool_:
        return x != 0
    with np.errstate(over="ignore", invalid="ignore"):
        return x.astype(new_dtype)


convert_element_type_p = Primitive("convert_element_type", _convert_rule, _convert_impl)


def _bitcast_rule(x: ShapedArray, *, new_dtype: np.dtype) -> ShapedArray:
    if x.dtype.itemsize != np.dtype(new_dtype).itemsize:
        raise TypeError(f"bitcast_convert_type needs dtypes of one width, got {x.dtype.name} "
                        f"and {np.dtype(new_dtype).name}")
    return ShapedArray(x.shape, dtypes.canonicalize(new_dtype))


def _bitcast_impl(x: np.ndarray, *, new_dtype: np.dtype) -> np.ndarray:
    return np.ascontiguousarray(x).view(new_dtype).reshape(np.shape(x))


bitcast_convert_type_p = Primitive("bitcast_convert_type", _bitcast_rule, _bitcast_impl)

# --- reductions --------------------------------------------------------------------------------


def _reduce(name: str, fn: Callable[..., np.ndarray], kinds: str) -> Primitive:
    def rule(x: ShapedArray, *, axes: tuple[int, ...]) -> ShapedArray:
        _check_kinds(name, [x], kinds)
        axes = _normalize_axes(name, axes, x.ndim)
        return ShapedArray(tuple(d for i, d in enumerate(x.shape) if i not in axes), x.dtype)

    def impl(x: np.ndarray, *, axes: tuple[int, ...]) -> np.ndarray:
        x = np.asarray(x)
        if x.dtype in _LOW_PRECISION:
            return np.asarray(fn(x.astype(np.float32), axis=axes)).astype(x.dtype)
        return np.asarray(fn(x, axis=axes)).astype(x.dtype)
    return Primitive(name, rule, impl)


reduce_sum_p = _reduce("reduce_sum", np.sum, "ifc")
reduce_prod_p = _reduce("reduce_prod", np.prod, "ifc")
reduce_max_p = _reduce("reduce_max", np.max, "bif")  # identity is -inf / the dtype's minimum
reduce_min_p = _reduce("reduce_min", np.min, "bif")


def _identity_reduce(fn: Callable[..., np.ndarray],
                     identity: Callable[[np.dtype], Any]) -> Callable[..., Any]:
    """NumPy's max/min refuse empty axes; the IR defines them as the reduction's identity."""
    def impl(x: np.ndarray, *, axes: tuple[int, ...]) -> np.ndarray:
        x = np.asarray(x)
        work = x.astype(np.float32) if x.dtype in _LOW_PRECISION else x
        return np.asarray(fn(work, axis=axes, initial=identity(x.dtype))).astype(x.dtype)
    return impl


def _lowest(dtype: np.dtype) -> Any:
    return False if dtype == dtypes.bool_ else -np.inf if dtypes.is_float(dtype) else np.iinfo(dtype).min


def _highest(dtype: np.dtype) -> Any:
    return True if dtype == dtypes.bool_ else np.inf if dtypes.is_float(dtype) else np.iinfo(dtype).max


reduce_max_p.impl = _identity_reduce(np.max, _lowest)
reduce_min_p.impl = _identity_reduce(np.min, _highest)


def _arg_reduce(name: str, fn: Callable[..., np.ndarray]) -> Primitive:
    def rule(x: ShapedArray, *, axis: int, index_dtype: np.dtype) -> ShapedArray:
        _check_kinds(name, [x], "bif")
        (axis,) = _normalize_axes(name, (axis,), x.ndim)
        if x.shape[axis] == 0:
            raise ValueError(f"{name} of an empty axis (shape {x.shape}, axis {axis}) has no answer")
        if not dtypes.is_int(np.dtype(index_dtype)):
            raise TypeError(f"{name} needs an integer index_dtype, got {np.dtype(index_dtype).name}")
        return ShapedArray(tuple(d for i, d in enumerate(x.shape) if i != axis), np.dtype(index_dtype))

    def impl(x: np.ndarray, *, axis: int, index_dtype: np.dtype) -> np.ndarray:
        x = np.asarray(x)
        x = x.astype(np.float32) if x.dtype in _LOW_PRECISION else x
        return np.asarray(fn(x, axis=axis)).astype(index_dtype)  # first occurrence; NaN wins
    return Primitive(name, rule, impl)


argmax_p = _arg_reduce("argmax", np.argmax)
argmin_p = _arg_reduce("argmin", np.argmin)


def _cumulative(name: str, fn: Callable[..., np.ndarray], kinds: str) -> Primitive:
    def rule(x: ShapedArray, *, axis: int, reverse: bool) -> ShapedArray:
        _check_kinds(name, [x], kinds)
        _normalize_axes(name, (axis,), x.ndim)
        return x

    def impl(x: np.ndarray, *, axis: int, reverse: bool) -> np.ndarray:
        x = np.asarray(x)
        work = x.astype(np.float32) if x.dtype in _LOW_PRECISION else x
        if reverse:
            work = np.flip(work, axis)
        out = np.asarray(fn(work, axis=axis)).astype(x.dtype)
        return np.flip(out, axis) if reverse else out
    return Primitive(name, rule, impl)


cumsum_p = _cumulative("cumsum", np.cumsum, "ifc")
cumprod_p = _cumulative("cumprod", np.cumprod, "ifc")
cummax_p = _cumulative("cummax", np.maximum.accumulate, "bif")
cummin_p = _cumulative("cummin", np.minimum.accumulate, "bif")

# --- movement ----------------------------------------------------------------------------------


def _reshape_rule(x: ShapedArray, *, new_sizes: tuple[int, ...]) -> ShapedArray:
    if any(d < 0 for d in new_sizes) or int(np.prod(new_sizes, dtype=np.int64)) != x.size:
        raise ValueError(f"cannot reshape an array of shape {x.shape} ({x.size} elements) "
                         f"into shape {tuple(new_sizes)}")
    return ShapedArray(new_sizes, x.dtype)


reshape_p = Primitive("reshape", _reshape_rule, lambda x, *, new_sizes: np.reshape(x, new_sizes))


def _broadcast_rule(x: ShapedArray, *, shape: tuple[int, ...],
                    broadcast_dimensions: tuple[int, ...]) -> ShapedArray:
    if len(broadcast_dimensions) != x.ndim:
        raise ValueError(f"broadcast_in_dim: operand of shape {x.shape} needs {x.ndim} "
                         f"broadcast_dimensions, got {broadcast_dimensions}")
    if any(d < 0 for d in shape):
        raise ValueError(f"broadcast_in_dim: negative dimension in shape {shape}")
    check_array_size(shape, x.dtype, "broadcast_to")
    if list(broadcast_dimensions) != sorted(set(broadcast_dimensions)):
        raise ValueError(f"broadcast_in_dim: broadcast_dimensions {broadcast_dimensions} must be "
                         "strictly increasing")
    for src, dst in enumerate(broadcast_dimensions):
        if not 0 <= dst < len(shape) or x.shape[src] not in (1, shape[dst]):
            raise ValueError(f"cannot broadcast an array of shape {x.shape} to shape {shape} "
                             f"along dimensions {broadcast_dimensions}")
    return ShapedArray(shape, x.dtype)


def _broadcast_impl(x: np.ndarray, *, shape: tuple[int, ...],
                    broadcast_dimensions: tuple[int, ...]) -> np.ndarray:
    expanded = [1] * len(shape)
    for src, dst in enumerate(broadcast_dimensions):
        expanded[dst] = np.shape(x)[src]
    return np.broadcast_to(np.reshape(x, expanded), shape).copy()


broadcast_in_dim_p = Primitive("broadcast_in_dim", _broadcast_rule, _broadcast_impl)


def _transpose_rule(x: ShapedArray, *, permutation: tuple[int, ...]) -> ShapedArray:
    if sorted(permutation) != list(range(x.ndim)):
        raise ValueError(f"transpose: {permutation} is not a permutation of the axes of shape {x.shape}")
    return ShapedArray(tuple(x.shape[p] for p in permutation), x.dtype)


transpose_p = Primitive("transpose", _transpose_rule,
                        lambda x, *, permutation: np.transpose(x, permutation).copy())


def _pad_rule(x: ShapedArray, value: ShapedArray, *, low: tuple[int, ...],
              high: tuple[int, ...]) -> ShapedArray:
    if value.shape != () or value.dtype != x.dtype:
        raise TypeError(f"pad: the padding value must be a scalar of dtype {x.dtype.name}, got {value}")
    if len(low) != x.ndim or len(high) != x.ndim:
        raise ValueError(f"pad: need {x.ndim} low and high pads for shape {x.shape}, got {low}, {high}")
    shape = tuple(d + lo + hi for d, lo, hi in zip(x.shape, low, high))
    if any(lo < 0 or hi < 0 for lo, hi in zip(low, high)):
        raise ValueError(f"pad: pads must be non-negative, got low={low} high={high} (use slice to crop)")
    return ShapedArray(shape, x.dtype)


def _pad_impl(x: np.ndarray, value: np.ndarray, *, low: tuple[int, ...], high: tuple[int, ...]) -> np.ndarray:
    if np.ndim(x) == 0:  # nothing to pad (np.pad refuses an empty pad list)
        return np.array(x, copy=True)
    return np.pad(x, list(zip(low, high)), constant_values=value)


pad_p = Primitive("pad", _pad_rule, _pad_impl)


def _slice_rule(x: ShapedArray, *, start: tuple[int, ...], limit: tuple[int, ...],
                strides: tuple[int, ...]) -> ShapedArray:
    if not len(start) == len(limit) == len(strides) == x.ndim:
        raise ValueError(f"slice: need {x.ndim} starts, limits and strides for shape {x.shape}")
    for s, l, st, d in zip(start, limit, strides, x.shape):
        if not (0 <= s <= l <= d) or st < 1:
            raise ValueError(f"slice: start {start}, limit {limit}, strides {strides} are invalid "
                             f"for shape {x.shape}")
    return ShapedArray(tuple(-(-(l - s) // st) for s, l, st in zip(start, limit, strides)), x.dtype)


slice_p = Primitive("slice", _slice_rule, lambda x, *, start, limit, strides: np.asarray(x)[
    tuple(slice(s, l, st) for s, l, st in zip(start, limit, strides))].copy())


def _flip_rule(x: ShapedArray, *, axes: tuple[int, ...]) -> ShapedArray:
    _normalize_axes("flip", axes, x.ndim)
    return x


flip_p = Primitive("flip", _flip_rule, lambda x, *, axes: np.flip(x, axes).copy())


def _concatenate_rule(*xs: ShapedArray, axis: int) -> ShapedArray:
    if not xs:
        raise ValueError("concatenate needs at least one array")
    dtype = _same_dtype("concatenate", xs)
    (axis,) = _normalize_axes("concatenate", (axis,), xs[0].ndim)
    for x in xs:
        if x.ndim != xs[0].ndim or any(a != b for i, (a, b) in enumerate(zip(x.shape, xs[0].shape))
                                       if i != axis):
            raise ValueError(f"concatenate along axis {axis} needs equal shapes elsewhere, got "
                             f"{', '.join(str(a.shape) for a in xs)}")
    shape = list(xs[0].shape)
    shape[axis] = sum(x.shape[axis] for x in xs)
    return ShapedArray(tuple(shape), dtype)


concatenate_p = Primitive("concatenate", _concatenate_rule, lambda *xs, axis: np.concatenate(xs, axis))

# --- dynamic slicing, gather and scatter -------------------------------------------------------


def _check_index_scalars(name: str, indices: Sequence[ShapedArray], ndim: int) -> None:
    if len(indices) != ndim:
        raise ValueError(f"{name} needs {ndim} start indices, got {len(indices)}")
    for idx in indices:
        if idx.shape != () or not dtypes.is_int(idx.dtype):
            raise TypeError(f"{name} start indices must be integer scalars, got {idx}")


def _clamped_starts(starts: Sequence[Any], operand_shape: Sequence[int], sizes: Sequence[int]) -> list[int]:
    return [int(np.clip(int(s), 0, d - n)) for s, d, n in zip(starts, operand_shape, sizes)]


def _dynamic_slice_rule(x: ShapedArray, *starts: ShapedArray, slice_sizes: tuple[int, ...]) -> ShapedArray:
    _check_index_scalars("dynamic_slice", starts, x.ndim)
    if len(slice_sizes) != x.ndim or any(not 0 <= n <= d for n, d in zip(slice_sizes, x.shape)):
        raise ValueError(f"dynamic_slice: slice_sizes {slice_sizes} do not fit shape {x.shape}")
    return ShapedArray(slice_sizes, x.dtype)


def _dynamic_slice_impl(x: np.ndarray, *starts: np.ndarray, slice_sizes: tuple[int, ...]) -> np.ndarray:
    begin = _clamped_starts(starts, np.shape(x), slice_sizes)  # out-of-range starts clamp, as XLA
    return np.asarray(x)[tuple(slice(b, b + n) for b, n in zip(begin, slice_sizes))].copy()


dynamic_slice_p = Primitive("dynamic_slice", _dynamic_slice_rule, _dynamic_slice_impl)


def _dynamic_update_slice_rule(x: ShapedArray, update: ShapedArray, *starts: ShapedArray) -> ShapedArray:
    _check_index_scalars("dynamic_update_slice", starts, x.ndim)
    if update.dtype != x.dtype or update.ndim != x.ndim or any(u > d for u, d in zip(update.shape, x.shape)):
        raise ValueError(f"dynamic_update_slice: update {update} does not fit operand {x}")
    return x


def _dynamic_update_slice_impl(x: np.ndarray, update: np.ndarray, *starts: np.ndarray) -> np.ndarray:
    begin = _clamped_starts(starts, np.shape(x), np.shape(update))
    out = np.array(x, copy=True)
    out[tuple(slice(b, b + n) for b, n in zip(begin, np.shape(update)))] = update
    return out


dynamic_update_slice_p = Primitive("dynamic_update_slice", _dynamic_update_slice_rule,
                                   _dynamic_update_slice_impl)


def _gather_rule(x: ShapedArray, indices: ShapedArray, *, axes: tuple[int, ...]) -> ShapedArray:
    """``out[b..., rest...] = x[indices[b..., 0] on axes[0], ..., rest...]``: the leading dims of
    ``indices`` are batch dims; its last dim has one entry per indexed axis."""
    if not dtypes.is_int(indices.dtype):
        raise TypeError(f"gather indices must be integers, got {indices.dtype.name}")
    axes = _normalize_axes("gather", axes, x.ndim)
    if indices.ndim < 1 or indices.shape[-1] != len(axes):
        raise ValueError(f"gather: indices of shape {indices.shape} must end in a dimension of "
                         f"size {len(axes)} (one per indexed axis {axes})")
    rest = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    return ShapedArray(indices.shape[:-1] + rest, x.dtype)


def _gather_index(x_shape: Sequence[int], indices: np.ndarray, axes: Sequence[int]) -> tuple[Any, ...]:
    """An advanced-indexing tuple over ``x`` moved so the indexed axes lead."""
    clamped = [np.clip(indices[..., k], 0, max(x_shape[ax] - 1, 0)) for k, ax in enumerate(axes)]
    return tuple(clamped)


def _move_axes_first(x: np.ndarray, axes: Sequence[int]) -> np.ndarray:
    return np.moveaxis(x, list(axes), list(range(len(axes))))


def _gather_impl(x: np.ndarray, indices: np.ndarray, *, axes: tuple[int, ...]) -> np.ndarray:
    x = np.asarray(x)
    if any(x.shape[ax] == 0 for ax in axes):  # nothing to clamp into: XLA returns zeros
        shape = _gather_rule(ShapedArray(x.shape, x.dtype), ShapedArray(np.shape(indices), np.dtype(
            np.asarray(indices).dtype)), axes=axes).shape
        return np.zeros(shape, x.dtype)
    return _move_axes_first(x, axes)[_gather_index(x.shape, np.asarray(indices), axes)].copy()


gather_p = Primitive("gather", _gather_rule, _gather_impl)

SCATTER_MODES = ("set", "add", "mul", "min", "max")


def _scatter_rule(x: ShapedArray, indices: ShapedArray, updates: ShapedArray, *, axes: tuple[int, ...],
                  mode: str) -> ShapedArray:
    if mode not in SCATTER_MODES:
        raise ValueError(f"scatter mode must be one of {SCATTER_MODES}, got {mode!r}")
    expected = _gather_rule(x, indices, axes=axes)
    if updates.shape != expected.shape or updates.dtype != x.dtype:
        raise ValueError(f"scatter: updates must have shape {expected.shape} and dtype {x.dtype.name} "
                         f"for operand {x} and indices {indices}, got {updates}")
    return x


def _scatter_impl(x: np.ndarray, indices: np.ndarray, updates: np.ndarray, *, axes: tuple[int, ...],
                  mode: str) -> np.ndarray:
    out = np.array(x, copy=True)
    indices, updates = np.asarray(indices), np.asarray(updates)
    in_range = np.ones(indices.shape[:-1], bool)
    for k, ax in enumerate(axes):  # out-of-range updates are dropped, as XLA and JAX do
        in_range &= (indices[..., k] >= 0) & (indices[..., k] < out.shape[ax])
    index = tuple(indices[..., k][in_range] for k in range(len(axes)))
    target = _move_axes_first(out, axes)  # a view: writes land in ``out``
    updates = updates[in_range]
    if not axes:  # every update addresses the whole operand, in order
        for update in updates:
            out = update.copy() if mode == "set" else {"add": np.add, "mul": np.multiply, "min": np.minimum,
                                                        "max": np.maximum}[mode](out, update).astype(out.dtype)
        return np.asarray(out)
    if mode == "set":
        target[index] = updates
    else:
        ufunc = {"add": np.add, "mul": np.multiply, "min": np.minimum, "max": np.maximum}[mode]
        ufunc.at(target, index, updates)
    return out


scatter_p = Primitive("scatter", _scatter_rule, _scatter_impl)

# --- creation, linear algebra, sorting ---------------------------------------------------------


def _iota_rule(*, dtype: np.dtype, shape: tuple[int, ...], dimension: int) -> ShapedArray:
    _normalize_axes("iota", (dimension,), len(shape))
    dtype = dtypes.canonicalize(dtype)
    if dtypes.is_bool(dtype):
        raise TypeError("iota cannot produce bool values")
    check_array_size(shape, dtype, "iota")  # a backstop: the functions making shapes check with their names
    return ShapedArray(shape, dtype)


def _iota_impl(*, dtype: np.dtype, shape: tuple[int, ...], dimension: int) -> np.ndarray:
    counts = np.arange(shape[dimension]).reshape([-1 if i == dimension else 1 for i in range(len(shape))])
    return np.broadcast_to(counts, shape).astype(dtype)


iota_p = Primitive("iota", _iota_rule, _iota_impl)


def _dot_general_rule(lhs: ShapedArray, rhs: ShapedArray, *,
                      contracting: tuple[tuple[int, ...], tuple[int, ...]],
                      batch: tuple[tuple[int, ...], tuple[int, ...]]) -> ShapedArray:
    """Output dims: batch dims, then lhs free dims, then rhs free dims (XLA's DotGeneral order)."""
    dtype = _same_dtype("dot_general", [lhs, rhs])
    _check_kinds("dot_general", [lhs, rhs], "ifc")
    (lc, rc), (lb, rb) = contracting, batch
    _normalize_axes("dot_general", lc + lb, lhs.ndim)
    _normalize_axes("dot_general", rc + rb, rhs.ndim)
    if len(lc) != len(rc) or len(lb) != len(rb):
        raise ValueError(f"dot_general: contracting {contracting} / batch {batch} dimensions must pair up")
    for a, b in list(zip(lc, rc)) + list(zip(lb, rb)):
        if lhs.shape[a] != rhs.shape[b]:
            raise ValueError(f"dot_general: dimension {a} of lhs {lhs.shape} and dimension {b} of rhs "
                             f"{rhs.shape} must match (sizes {lhs.shape[a]} and {rhs.shape[b]})")
    free_l = [d for i, d in enumerate(lhs.shape) if i not in lc + lb]
    free_r = [d for i, d in enumerate(rhs.shape) if i not in rc + rb]
    return ShapedArray(tuple(lhs.shape[i] for i in lb) + tuple(free_l) + tuple(free_r), dtype)


def _dot_general_impl(lhs: np.ndarray, rhs: np.ndarray, *, contracting: Any, batch: Any) -> np.ndarray:
    lhs, rhs = np.asarray(lhs), np.asarray(rhs)
    (lc, rc), (lb, rb) = contracting, batch
    letters = iter("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
    lhs_sub = [next(letters) for _ in range(lhs.ndim)]
    rhs_sub = [next(letters) for _ in range(rhs.ndim)]
    for a, b in list(zip(lc, rc)) + list(zip(lb, rb)):
        rhs_sub[b] = lhs_sub[a]
    out = [lhs_sub[i] for i in lb]
    out += [s for i, s in enumerate(lhs_sub) if i not in lc + lb]
    out += [s for i, s in enumerate(rhs_sub) if i not in rc + rb]
    spec = f"{''.join(lhs_sub)},{''.join(rhs_sub)}->{''.join(out)}"
    if lhs.dtype in _LOW_PRECISION:
        return np.einsum(spec, lhs.astype(np.float32), rhs.astype(np.float32)).astype(lhs.dtype)
    return np.asarray(np.einsum(spec, lhs, rhs)).astype(lhs.dtype)


dot_general_p = Primitive("dot_general", _dot_general_rule, _dot_general_impl)


def _conv_rule(lhs: ShapedArray, rhs: ShapedArray, *, window_strides: tuple[int, ...],
               padding: tuple[tuple[int, int], ...], lhs_dilation: tuple[int, ...],
               rhs_dilation: tuple[int, ...], feature_group_count: int) -> ShapedArray:
    """lhs (N, C, *spatial), rhs (O, C // groups, *kernel) -> (N, O, *out): XLA's ConvGeneralDilated
    with NCHW / OIHW layouts. Padding pairs may be negative (they crop)."""
    name = "conv_general_dilated"
    dtype = _same_dtype(name, [lhs, rhs])
    _check_kinds(name, [lhs, rhs], "if")
    if lhs.ndim < 3 or rhs.ndim != lhs.ndim:
        raise ValueError(f"{name}: lhs must be (N, C, *spatial) and rhs (O, C // groups, *kernel) of the same "
                         f"rank >= 3, got {lhs.shape} and {rhs.shape}")
    spatial = lhs.ndim - 2
    for what, value in (("window_strides", window_strides), ("lhs_dilation", lhs_dilation),
                        ("rhs_dilation", rhs_dilation), ("padding", padding)):
        if len(value) != spatial:
            raise ValueError(f"{name}: {what} needs {spatial} entries (one per spatial dim), got {value}")
    for what, value in (("window_strides", window_strides), ("lhs_dilation", lhs_dilation),
                        ("rhs_dilation", rhs_dilation)):
        if any(v < 1 for v in value):
            raise ValueError(f"{name}: {what} must be >= 1, got {value}")
    groups, channels, out_channels = feature_group_count, lhs.shape[1], rhs.shape[0]
    if groups < 1 or channels % groups or out_channels % groups:
        raise ValueError(f"{name}: feature_group_count={groups} must divide the input channels ({channels}) "
                         f"and the output channels ({out_channels})")
    if rhs.shape[1] * groups != channels:
        raise ValueError(f"{name}: rhs {rhs.shape} expects {rhs.shape[1] * groups} input channels "
                         f"(feature_group_count={groups}), lhs {lhs.shape} has {channels}")
    out = []
    for size, kernel, stride, (lo, hi), ld, rd in zip(lhs.shape[2:], rhs.shape[2:], window_strides, padding,
                                                      lhs_dilation, rhs_dilation):
        padded = max((size - 1) * ld + 1, 0) + lo + hi
        span = (kernel - 1) * rd + 1
        if padded < span:
            raise ValueError(f"{name}: the dilated kernel ({span}) is larger than the padded input ({padded}) "
                             f"for lhs {lhs.shape}, rhs {rhs.shape}, padding {padding}")
        out.append((padded - span) // stride + 1)
    return ShapedArray((lhs.shape[0], out_channels) + tuple(out), dtype)


def dilate_and_pad(x: np.ndarray, dilation: Sequence[int], padding: Sequence[tuple[int, int]]) -> np.ndarray:
    """The spatial dims (all but the first two) of ``x`` with ``dilation - 1`` zeros between elements,
    then padded by (low, high) zeros per dim; negative pads crop."""
    spatial = x.shape[2:]
    dilated = np.zeros(x.shape[:2] + tuple(max((n - 1) * d + 1, 0) for n, d in zip(spatial, dilation)), x.dtype)
    dilated[(slice(None), slice(None)) + tuple(slice(None, None, d) for d in dilation)] = x
    grown = np.pad(dilated, [(0, 0), (0, 0)] + [(max(lo, 0), max(hi, 0)) for lo, hi in padding])
    crop = tuple(slice(max(-lo, 0), n - max(-hi, 0)) for n, (lo, hi) in zip(grown.shape[2:], padding))
    return grown[(slice(None), slice(None)) + crop]


def _conv_impl(lhs: np.ndarray, rhs: np.ndarray, *, window_strides: tuple[int, ...],
               padding: tuple[tuple[int, int], ...], lhs_dilation: tuple[int, ...],
               rhs_dilation: tuple[int, ...], feature_group_count: int) -> np.ndarray:
    lhs, rhs = np.asarray(lhs), np.asarray(rhs)
    out_dtype = lhs.dtype
    compute = np.float32 if out_dtype in _LOW_PRECISION else out_dtype
    x = dilate_and_pad(lhs.astype(compute), lhs_dilation, padding)
    out_spatial = _conv_rule(ShapedArray(lhs.shape, lhs.dtype), ShapedArray(rhs.shape, rhs.dtype),
                             window_strides=window_strides, padding=padding, lhs_dilation=lhs_dilation,
                             rhs_dilation=rhs_dilation, feature_group_count=feature_group_count).shape[2:]
    groups, batch, out_channels = feature_group_count, lhs.shape[0], rhs.shape[0]
    x = x.reshape((batch, groups, -1) + x.shape[2:])
    w = rhs.astype(compute).reshape((groups, out_channels // groups) + rhs.shape[1:])
    out = np.zeros((batch, groups, out_channels // groups) + out_spatial, compute)
    for tap in np.ndindex(*rhs.shape[2:]):  # one product over the channels per kernel position
        window = tuple(slice(t * d, t * d + (n - 1) * s + 1, s)
                       for t, d, n, s in zip(tap, rhs_dilation, out_spatial, window_strides))
        out += np.einsum("ngc...,goc->ngo...", x[(slice(None),) * 3 + window], w[(Ellipsis,) + tap])
    return out.reshape((batch, out_channels) + out_spatial).astype(out_dtype)


conv_general_dilated_p = Primitive("conv_general_dilated", _conv_rule, _conv_impl)


def _sort_rule(*operands: ShapedArray, dimension: int, num_keys: int,
               descending: bool) -> tuple[ShapedArray, ...]:
    if not operands or not 1 <= num_keys <= len(operands):
        raise ValueError(f"sort needs 1 <= num_keys <= number of operands, "
                         f"got {num_keys} and {len(operands)}")
    if len({o.shape for o in operands}) != 1:
        raise ValueError(f"sort operands must share one shape, got {[o.shape for o in operands]}")
    _normalize_axes("sort", (dimension,), operands[0].ndim)
    return operands


def _sort_impl(*operands: np.ndarray, dimension: int, num_keys: int,
               descending: bool) -> tuple[np.ndarray, ...]:
    """Stable lexicographic sort along ``dimension`` by the first ``num_keys`` operands; NaNs last
    (first when descending); the other operands are permuted alike."""
    arrays = [np.moveaxis(np.asarray(o), dimension, -1) for o in operands]
    keys = [k.astype(np.float32) if k.dtype in _LOW_PRECISION else k for k in arrays[:num_keys]]
    if descending:  # stable descending = reverse of a stable ascending sort of the reversed input
        keys = [k[..., ::-1] for k in keys]
    order = np.lexsort(keys[::-1], axis=-1)
    if descending:
        order = (arrays[0].shape[-1] - 1 - order)[..., ::-1]
    return tuple(np.moveaxis(np.take_along_axis(a, order, -1), -1, dimension).copy() for a in arrays)


sort_p = Primitive("sort", _sort_rule, _sort_impl, multiple_results=True)

# --- random bits -------------------------------------------------------------------------------

THREEFRY_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # per round, alternating blocks of four
THREEFRY_PARITY = 0x1BD11BDA  # the third key word is k0 ^ k1 ^ this


def _rotate_left(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32_numpy(k0: np.ndarray, k1: np.ndarray,
                       x0: np.ndarray, x1: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Threefry-2x32 with 20 rounds (Salmon et al., 2011), the counter-based hash behind JAX's keys."""
    k0, k1, x0, x1 = (np.asarray(v, np.uint32) for v in (k0, k1, x0, x1))
    keys = (k0, k1, k0 ^ k1 ^ np.uint32(THREEFRY_PARITY))
    with np.errstate(over="ignore"):
        x0, x1 = x0 + keys[0], x1 + keys[1]
        for block in range(5):
            for r in THREEFRY_ROTATIONS[block % 2]:
                x0 = x0 + x1
                x1 = _rotate_left(x1, r) ^ x0
            x0 = x0 + keys[(block + 1) % 3]
            x1 = x1 + keys[(block + 2) % 3] + np.uint32(block + 1)
    return x0, x1


def _threefry_rule(k0: ShapedArray, k1: ShapedArray,
                   x0: ShapedArray, x1: ShapedArray) -> tuple[ShapedArray, ...]:
    avals = [k0, k1, x0, x1]
    if any(a.dtype != dtypes.uint32 for a in avals):
        raise TypeError(f"threefry2x32 takes uint32 operands, got {[a.dtype.name for a in avals]}")
    shape = _elementwise_shape("threefry2x32", avals)
    return (ShapedArray(shape, dtypes.uint32),) * 2


threefry2x32_p = Primitive("threefry2x32", _threefry_rule,
                           lambda *xs: tuple(np.broadcast_arrays(*threefry2x32_numpy(*xs))),
                           multiple_results=True)

# --- linear algebra ----------------------------------------------------------------------------
# Each works on the last two axes of its operands and maps over any leading (batch) axes. None has a
# kernel lowering: they are host steps run by their NumPy reference, i.e. LAPACK through numpy.linalg
# (docs/architecture.md, "Linear algebra"). A matrix LAPACK cannot factor (cholesky of a matrix that
# is not positive definite, solve with a singular matrix) gives NaNs, as in JAX, not an exception:
# an exception would escape from the middle of a compiled plan. float16/bfloat16 compute in float32.


def _matrix_operand(name: str, aval: ShapedArray, square: bool = True) -> tuple[int, int]:
    _check_kinds(name, [aval], "f")
    if aval.ndim < 2 or (square and aval.shape[-1] != aval.shape[-2]):
        what = "square matrices" if square else "matrices"
        raise ValueError(f"{name} needs {what} in the last two axes (rank >= 2), got shape {aval.shape}")
    return aval.shape[-2], aval.shape[-1]


def _lapack(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A NumPy linear-algebra reference made total: float16/bfloat16 are computed in float32 and
    results are cast back to the operand dtype; a LinAlgError gives NaN results of the right shapes
    (per matrix: the others of a batch are still computed)."""
    def impl(*operands: np.ndarray, **params: Any) -> Any:
        arrays = [np.asarray(x) for x in operands]
        dtype = arrays[0].dtype
        compute = [x.astype(np.float32) if x.dtype in _LOW_PRECISION else x for x in arrays]
        try:
            out = fn(*compute, **params)
        except np.linalg.LinAlgError:
            batch = compute[0].shape[:-2]
            if not batch:  # the shapes of the results, computed for an identity, filled with NaN
                stand_in = np.eye(*compute[0].shape[-2:], dtype=compute[0].dtype)
                shaped = fn(stand_in, *compute[1:], **params)
                out = (tuple(np.full_like(o, np.nan) for o in shaped) if isinstance(shaped, tuple)
                       else np.full_like(shaped, np.nan))
            else:
                per_matrix = [impl(*(x[index] for x in compute), **params) for index in np.ndindex(*batch)]
                results = per_matrix if isinstance(per_matrix[0], tuple) else [(p,) for p in per_matrix]
                stacked = tuple(np.stack(parts).reshape(batch + parts[0].shape) for parts in zip(*results))
                out = stacked if isinstance(per_matrix[0], tuple) else stacked[0]
        if isinstance(out, tuple):
            return tuple(np.asarray(o).astype(dtype) for o in out)
        return np.asarray(out).astype(dtype)
    return impl


def _symmetrized(a: np.ndarray) -> np.ndarray:
    return (a + np.swapaxes(a, -1, -2)) / 2


def _cholesky_rule(a: ShapedArray) -> ShapedArray:
    _matrix_operand("cholesky", a)
    return a


def _cholesky_impl(a: np.ndarray) -> np.ndarray:
    """The lower factor L of (a + a^T) / 2 = L L^T; NaN where that is not positive definite."""
    return np.linalg.cholesky(_symmetrized(a))


cholesky_p = Primitive("cholesky", _cholesky_rule, _lapack(_cholesky_impl))


def _solve_rule(a: ShapedArray, b: ShapedArray, *, transpose_a: bool) -> ShapedArray:
    n, _ = _matrix_operand("solve", a)
    _check_kinds("solve", [b], "f")
    if a.dtype != b.dtype:
        raise TypeError(f"solve takes operands of one dtype, got {a.dtype.name} and {b.dtype.name}")
    if b.ndim != a.ndim or b.shape[:-2] != a.shape[:-2] or b.shape[-2] != n:
        raise ValueError(f"solve needs b of shape (*batch, {n}, k) for a of shape {a.shape}, got {b.shape}")
    return b


def _solve_impl(a: np.ndarray, b: np.ndarray, *, transpose_a: bool) -> np.ndarray:
    """X with a X = b (a^T X = b when transpose_a); b holds k right-hand sides as columns."""
    return np.linalg.solve(np.swapaxes(a, -1, -2) if transpose_a else a, b)


solve_p = Primitive("solve", _solve_rule, _lapack(_solve_impl))


def _slogdet_rule(a: ShapedArray) -> tuple[ShapedArray, ShapedArray]:
    _matrix_operand("slogdet", a)
    scalar = ShapedArray(a.shape[:-2], a.dtype)
    return scalar, scalar


def _slogdet_impl(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sign, log|det a|): sign 0 and log -inf for a singular matrix."""
    sign, logabsdet = np.linalg.slogdet(a)
    return sign, logabsdet


slogdet_p = Primitive("slogdet", _slogdet_rule, _lapack(_slogdet_impl), multiple_results=True)


def _eigh_rule(a: ShapedArray) -> tuple[ShapedArray, ShapedArray]:
    n, _ = _matrix_operand("eigh", a)
    return ShapedArray(a.shape[:-1], a.dtype), a


def _eigh_impl(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eigenvalues (ascending) and eigenvectors (columns) of (a + a^T) / 2."""
    eigenvalues, eigenvectors = np.linalg.eigh(_symmetrized(a))
    return eigenvalues, eigenvectors


eigh_p = Primitive("eigh", _eigh_rule, _lapack(_eigh_impl), multiple_results=True)


def _qr_rule(a: ShapedArray, *, full_matrices: bool) -> tuple[ShapedArray, ShapedArray]:
    m, n = _matrix_operand("qr", a, square=False)
    k = m if full_matrices else min(m, n)
    batch = a.shape[:-2]
    return ShapedArray(batch + (m, k), a.dtype), ShapedArray(batch + (k, n), a.dtype)


def _qr_impl(a: np.ndarray, *, full_matrices: bool) -> tuple[np.ndarray, np.ndarray]:
    q, r = np.linalg.qr(a, mode="complete" if full_matrices else "reduced")
    return q, r


qr_p = Primitive("qr", _qr_rule, _lapack(_qr_impl), multiple_results=True)


def _svd_rule(a: ShapedArray, *, full_matrices: bool, compute_uv: bool) -> tuple[ShapedArray, ...]:
    m, n = _matrix_operand("svd", a, square=False)
    k, batch = min(m, n), a.shape[:-2]
    values = ShapedArray(batch + (k,), a.dtype)
    if not compute_uv:
        return (values,)
    rows, cols = (m, n) if full_matrices else (k, k)
    return ShapedArray(batch + (m, rows), a.dtype), values, ShapedArray(batch + (cols, n), a.dtype)


def _svd_impl(a: np.ndarray, *, full_matrices: bool, compute_uv: bool) -> tuple[np.ndarray, ...]:
    """(u, s, vh) with a = u diag(s) vh and s descending; (s,) alone when not compute_uv."""
    if not compute_uv:
        return (np.linalg.svd(a, compute_uv=False),)
    u, s, vh = np.linalg.svd(a, full_matrices=full_matrices)
    return u, s, vh


svd_p = Primitive("svd", _svd_rule, _lapack(_svd_impl), multiple_results=True)


# --- fft -----------------------------------------------------------------------------------------
# One primitive, as in XLA: ``fft_type`` is "fft", "ifft", "rfft" or "irfft", over the trailing
# ``len(fft_lengths)`` axes, unnormalised forward and 1/n-scaled inverse (NumPy's "backward" norm).
# funcgrad.numpy.fft moves the user's axes to the end, pads or crops to ``n`` and applies ``norm``.
# It runs as a host step through NumPy's pocketfft on every device (no kernel computes it).
FFT_TYPES = ("fft", "ifft", "rfft", "irfft")


def _fft_rule(x: ShapedArray, *, fft_type: str, fft_lengths: tuple[int, ...]) -> ShapedArray:
    if fft_type not in FFT_TYPES:
        raise ValueError(f"fft: fft_type must be one of {FFT_TYPES}, got {fft_type!r}")
    k = len(fft_lengths)
    if not 1 <= k <= x.ndim or any(n < 1 for n in fft_lengths):
        raise ValueError(f"fft: fft_lengths {fft_lengths} do not fit an operand of shape {x.shape}")
    batch, trailing = x.shape[:x.ndim - k], x.shape[x.ndim - k:]
    if fft_type == "rfft":
        if not dtypes.is_float(x.dtype) or x.dtype not in (dtypes.float32, dtypes.float64):
            raise TypeError(f"fft (rfft) needs a float32 or float64 operand, got {x.dtype.name}")
        if trailing != tuple(fft_lengths):
            raise ValueError(f"fft (rfft): the operand's trailing shape {trailing} must be fft_lengths {fft_lengths}")
        return ShapedArray(batch + tuple(fft_lengths[:-1]) + (fft_lengths[-1] // 2 + 1,),
                           dtypes.complex_dtype(x.dtype))
    if not dtypes.is_complex(x.dtype):
        raise TypeError(f"fft ({fft_type}) needs a complex64 or complex128 operand, got {x.dtype.name}")
    if fft_type == "irfft":
        expected = tuple(fft_lengths[:-1]) + (fft_lengths[-1] // 2 + 1,)
        if trailing != expected:
            raise ValueError(f"fft (irfft): the operand's trailing shape {trailing} must be {expected} "
                             f"for fft_lengths {fft_lengths}")
        return ShapedArray(batch + tuple(fft_lengths), dtypes.real_dtype(x.dtype))
    if trailing != tuple(fft_lengths):
        raise ValueError(f"fft ({fft_type}): the operand's trailing shape {trailing} must be fft_lengths {fft_lengths}")
    return x


def _fft_impl(x: np.ndarray, *, fft_type: str, fft_lengths: tuple[int, ...]) -> np.ndarray:
    x = np.asarray(x)
    axes = tuple(range(x.ndim - len(fft_lengths), x.ndim))
    out: np.ndarray
    if fft_type == "fft":
        out, dtype = np.fft.fftn(x, axes=axes), x.dtype
    elif fft_type == "ifft":
        out, dtype = np.fft.ifftn(x, axes=axes), x.dtype
    elif fft_type == "rfft":
        out, dtype = np.fft.rfftn(x, axes=axes), dtypes.complex_dtype(x.dtype)
    else:
        out, dtype = np.fft.irfftn(x, s=fft_lengths, axes=axes), dtypes.real_dtype(x.dtype)
    return np.array(out, dtype)


fft_p = Primitive("fft", _fft_rule, _fft_impl)
