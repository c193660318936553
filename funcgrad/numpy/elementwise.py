"""Elementwise functions of the Array API standard (2023.12), plus the common NumPy extras.

Each function promotes its operands (JAX's lattice, Python scalars weakly typed), broadcasts them
and binds one elementwise primitive through ``apply_elementwise``. Functions that are not
primitives are compositions written here (``hypot``, ``logaddexp``, ``floor_divide``, ...), so
differentiation and batching need no extra rules. Transcendental functions promote bool and
integer inputs to the default float (float32), as JAX does; float16 and bfloat16 stay as they are.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import (
    ArrayLike,
    apply_elementwise,
    asarray,
    astype,
    broadcast_shapes,
    broadcast_to,
    promote,
    result_type,
)

# --- helpers -----------------------------------------------------------------------------------


def _float_unary(primitive: P.Primitive, name: str, doc: str) -> Callable[[ArrayLike], Tensor]:
    def fn(x: ArrayLike, /) -> Tensor:
        return apply_elementwise(primitive, x, to_float=True)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


def _inexact(*args: ArrayLike) -> tuple[list[Tensor], bool]:
    """Promote ``args`` to one floating or complex dtype (bool/int -> float32) as Tensors; returns (tensors, weak)."""
    values, dtype, weak = promote(*args)
    target = dtype if dtypes.is_inexact(dtype) else dtypes.default_float
    tensors = [astype(v, target) if isinstance(v, Tensor) else asarray(np.asarray(v).astype(target)[()])
               for v in values]
    return tensors, weak


def _weak(out: Tensor, weak: bool) -> Tensor:
    out._weak = weak
    return out


def _reject_bool(name: str, dtype: np.dtype) -> None:
    if dtypes.is_bool(dtype):
        raise TypeError(f"{name} is not defined for bool arrays")


# --- unary: transcendental (always floating) ---------------------------------------------------

exp = _float_unary(P.exp_p, "exp", "e**x, elementwise. >>> exp(0.0).item()  # 1.0")
exp2 = _float_unary(P.exp2_p, "exp2", "2**x, elementwise.")
expm1 = _float_unary(P.expm1_p, "expm1", "exp(x) - 1, accurate near 0.")
log = _float_unary(P.log_p, "log", "Natural logarithm (log(0) = -inf, log(-1) = nan).")
log2 = _float_unary(P.log2_p, "log2", "Base-2 logarithm.")
log1p = _float_unary(P.log1p_p, "log1p", "log(1 + x), accurate near 0.")
sin = _float_unary(P.sin_p, "sin", "Sine (radians).")
cos = _float_unary(P.cos_p, "cos", "Cosine (radians).")
tan = _float_unary(P.tan_p, "tan", "Tangent (radians).")
asin = arcsin = _float_unary(P.asin_p, "asin", "Inverse sine.")
acos = arccos = _float_unary(P.acos_p, "acos", "Inverse cosine.")
atan = arctan = _float_unary(P.atan_p, "atan", "Inverse tangent.")
sinh = _float_unary(P.sinh_p, "sinh", "Hyperbolic sine.")
cosh = _float_unary(P.cosh_p, "cosh", "Hyperbolic cosine.")
tanh = _float_unary(P.tanh_p, "tanh", "Hyperbolic tangent.")
asinh = arcsinh = _float_unary(P.asinh_p, "asinh", "Inverse hyperbolic sine.")
acosh = arccosh = _float_unary(P.acosh_p, "acosh", "Inverse hyperbolic cosine.")
atanh = arctanh = _float_unary(P.atanh_p, "atanh", "Inverse hyperbolic tangent.")
sqrt = _float_unary(P.sqrt_p, "sqrt", "Square root. >>> sqrt(4.0).item()  # 2.0")
rsqrt = _float_unary(P.rsqrt_p, "rsqrt", "1 / sqrt(x).")
erf = _float_unary(P.erf_p, "erf", "The error function.")
sigmoid = _float_unary(P.logistic_p, "sigmoid",
                       "The logistic function 1 / (1 + exp(-x)), stable for large |x|.")


def log10(x: ArrayLike, /) -> Tensor:
    """Base-10 logarithm. >>> log10(100.0).item()  # 2.0"""
    return multiply(log(x), 1 / math.log(10))  # a Python float: weak, so float16 stays float16


def cbrt(x: ArrayLike, /) -> Tensor:
    """Cube root, real for negative inputs: cbrt(-8.0) is -2.0."""
    (x,), weak = _inexact(x)
    return _weak(multiply(sign(x), pow(abs(x), 1 / 3)), weak)


def deg2rad(x: ArrayLike, /) -> Tensor:
    """Degrees to radians."""
    (x,), weak = _inexact(x)
    return _weak(multiply(x, math.pi / 180), weak)


def rad2deg(x: ArrayLike, /) -> Tensor:
    """Radians to degrees."""
    (x,), weak = _inexact(x)
    return _weak(multiply(x, 180 / math.pi), weak)


radians, degrees = deg2rad, rad2deg

# --- unary: rounding, sign, magnitude ----------------------------------------------------------


def _rounding(primitive: P.Primitive, name: str, doc: str) -> Callable[[ArrayLike], Tensor]:
    def fn(x: ArrayLike, /) -> Tensor:
        x = asarray(x)
        return x if not dtypes.is_float(x.dtype) else apply_elementwise(primitive, x)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


floor = _rounding(P.floor_p, "floor", "Largest integer <= x; bool and integer inputs are returned unchanged.")
ceil = _rounding(P.ceil_p, "ceil", "Smallest integer >= x; bool and integer inputs are returned unchanged.")
_rint = _rounding(P.round_p, "round", "")


def round(x: ArrayLike, /, decimals: int = 0) -> Tensor:  # noqa: A001 - the Array API name
    """Round half to even (as NumPy and the Array API); ``decimals`` rounds to that many digits.

    >>> round(asarray([0.5, 1.5, 2.5])).tolist()
    [0.0, 2.0, 2.0]
    """
    x = asarray(x)
    if dtypes.is_complex(x.dtype):  # the parts are rounded separately, as NumPy and JAX
        return complex_from_parts(round(real(x), decimals), round(imag(x), decimals))
    if not dtypes.is_float(x.dtype):
        if decimals < 0:
            raise NotImplementedError("round of integers with decimals < 0 is not implemented (nor in JAX)")
        return x
    if decimals == 0:
        return _rint(x)
    factor = 10.0 ** decimals
    return divide(_rint(multiply(x, factor)), factor)


around = round


def trunc(x: ArrayLike, /) -> Tensor:
    """Round toward zero; bool and integer inputs are returned unchanged."""
    x = asarray(x)
    return x if not dtypes.is_float(x.dtype) else where(less(x, 0), ceil(x), floor(x))


fix = trunc


def negative(x: ArrayLike, /) -> Tensor:
    """-x. Not defined for bool (use logical_not); unsigned integers wrap around."""
    x = asarray(x)
    _reject_bool("negative", x.dtype)
    return apply_elementwise(P.neg_p, x)


def positive(x: ArrayLike, /) -> Tensor:
    """+x, i.e. x itself (not defined for bool)."""
    x = asarray(x)
    _reject_bool("positive", x.dtype)
    return x


def abs(x: ArrayLike, /) -> Tensor:  # noqa: A001 - the Array API name
    """|x|; bool and unsigned inputs are returned unchanged (as in JAX). abs(int8 -128) wraps."""
    x = asarray(x)
    if dtypes.is_bool(x.dtype) or dtypes.is_unsigned(x.dtype):
        return x
    return apply_elementwise(P.abs_p, x)


absolute = abs


def fabs(x: ArrayLike, /) -> Tensor:
    """|x| as a float (NumPy's ``fabs``)."""
    (x,), weak = _inexact(x)
    return _weak(abs(x), weak)


def sign(x: ArrayLike, /) -> Tensor:
    """-1, 0 or 1 with the sign of x (NaN stays NaN); not defined for bool. For complex x it is
    x / |x| (0 at 0), as in JAX and the Array API."""
    x = asarray(x)
    _reject_bool("sign", x.dtype)
    return apply_elementwise(P.sign_p, x)


def square(x: ArrayLike, /) -> Tensor:
    """x * x; bool is squared as int32, as JAX does."""
    x = asarray(x)
    if dtypes.is_bool(x.dtype):
        x = astype(x, dtypes.default_int)
    return multiply(x, x)


def reciprocal(x: ArrayLike, /) -> Tensor:
    """1 / x (integer inputs give the default float)."""
    return divide(1.0, x)


def signbit(x: ArrayLike, /) -> Tensor:
    """True where the sign bit is set, so -0.0 and -nan count as negative."""
    x = asarray(x)
    if dtypes.is_bool(x.dtype):
        return _full_bool(x, False)
    if not dtypes.is_float(x.dtype):
        return less(x, 0)
    int_dtype = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[x.dtype.itemsize]
    return less(bind(P.bitcast_convert_type_p, x, new_dtype=int_dtype), np.zeros((), int_dtype)[()])


def isnan(x: ArrayLike, /) -> Tensor:
    """True where x is NaN (never for bool or integers); complex: where either part is NaN."""
    x = asarray(x)
    if dtypes.is_complex(x.dtype):
        return logical_or(isnan(real(x)), isnan(imag(x)))
    return not_equal(x, x) if dtypes.is_float(x.dtype) else _full_bool(x, False)


def isinf(x: ArrayLike, /) -> Tensor:
    """True where x is +inf or -inf; complex: where either part is infinite."""
    x = asarray(x)
    if dtypes.is_complex(x.dtype):
        return logical_or(isinf(real(x)), isinf(imag(x)))
    return equal(abs(x), np.inf) if dtypes.is_float(x.dtype) else _full_bool(x, False)


def isfinite(x: ArrayLike, /) -> Tensor:
    """True where x is neither infinite nor NaN (complex: both parts)."""
    x = asarray(x)
    return apply_elementwise(P.is_finite_p, x) if dtypes.is_inexact(x.dtype) else _full_bool(x, True)


def isposinf(x: ArrayLike, /) -> Tensor:
    """True where x is +inf."""
    x = asarray(x)
    return equal(x, np.inf) if dtypes.is_float(x.dtype) else _full_bool(x, False)


def isneginf(x: ArrayLike, /) -> Tensor:
    """True where x is -inf."""
    x = asarray(x)
    return equal(x, -np.inf) if dtypes.is_float(x.dtype) else _full_bool(x, False)


def _full_bool(like: Tensor, value: bool) -> Tensor:
    return broadcast_to(np.bool_(value), like.shape)


# --- binary arithmetic -------------------------------------------------------------------------


def _arithmetic(primitive: P.Primitive, name: str, x1: ArrayLike, x2: ArrayLike) -> Tensor:
    if dtypes.is_bool(result_type(x1, x2)):
        # NumPy and JAX treat bool + bool as logical or and bool * bool as logical and
        logical = {P.add_p: P.or_p, P.mul_p: P.and_p}.get(primitive)
        if logical is None:
            raise TypeError(f"{name} is not defined for bool arrays")
        return apply_elementwise(logical, x1, x2)
    return apply_elementwise(primitive, x1, x2)


def add(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """x1 + x2 with broadcasting and JAX promotion. >>> add(asarray([1, 2]), 1.5).dtype  # float32"""
    return _arithmetic(P.add_p, "add", x1, x2)


def subtract(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """x1 - x2 (not defined for bool)."""
    return _arithmetic(P.sub_p, "subtract", x1, x2)


def multiply(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """x1 * x2 (bool * bool is logical and)."""
    return _arithmetic(P.mul_p, "multiply", x1, x2)


def divide(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """True division; bool and integer inputs give the default float. >>> divide(1, 2).item()  # 0.5"""
    return apply_elementwise(P.div_p, x1, x2, to_float=True)


true_divide = divide


def _float_divmod(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """NumPy's (and CPython's) float divmod: quotient floored, remainder with the divisor's sign,
    both exact where ``floor(a / b)`` would round wrongly (``1.0 // 0.1`` is 9.0)."""
    mod = apply_elementwise(P.rem_p, a, b)  # C fmod: exact, with the sign of a
    div = divide(subtract(a, mod), b)
    fix = logical_and(not_equal(mod, 0), not_equal(less(b, 0), less(mod, 0)))
    mod = where(fix, add(mod, b), mod)
    div = where(fix, subtract(div, 1), div)
    mod = where(equal(mod, 0), copysign(0.0, b), mod)
    quotient = floor(div)
    quotient = where(greater(subtract(div, quotient), 0.5), add(quotient, 1), quotient)
    true_quotient = divide(a, b)
    quotient = where(equal(div, 0), copysign(0.0, true_quotient), quotient)
    # an infinite operand: the standard's (IEEE) floor(a / b), so inf // 2 is inf (not NaN) and
    # 1 // -inf is -0 (CPython and NumPy give -1.0); the remainder keeps Python's rule
    quotient = where(logical_or(isinf(a), isinf(b)), floor(true_quotient), quotient)
    return where(equal(b, 0), true_quotient, quotient), mod


def floor_divide(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Division rounding toward -inf (Python's ``//``); integer x // 0 gives 0. With an infinite
    operand the result is the standard's floor(x1 / x2): inf // 2 is inf and -3 // inf is -0
    (NumPy and JAX give NaN and -1.0).

    >>> floor_divide(asarray([-7, 7]), 2).tolist()
    [-4, 3]
    """
    (a, b), dtype, weak = promote(x1, x2)
    _reject_bool("floor_divide", dtype)
    if dtypes.is_float(dtype):
        return _weak(_float_divmod(asarray(a), asarray(b))[0], weak)
    quotient = apply_elementwise(P.div_p, a, b)  # rounds toward zero
    if dtypes.is_unsigned(dtype):
        return quotient
    # step down where the signs differ and the division is inexact
    inexact = not_equal(apply_elementwise(P.rem_p, a, b), 0)
    signs_differ = not_equal(less(a, 0), less(b, 0))
    return where(logical_and(inexact, signs_differ), subtract(quotient, 1), quotient)


def remainder(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Python's ``%``: the result has the sign of the divisor; integer x % 0 gives 0.

    >>> remainder(asarray([-7, 7]), 3).tolist()
    [2, 1]
    """
    (a, b), dtype, weak = promote(x1, x2)
    _reject_bool("remainder", dtype)
    if dtypes.is_float(dtype):
        return _weak(_float_divmod(asarray(a), asarray(b))[1], weak)
    rem = apply_elementwise(P.rem_p, a, b)
    if dtypes.is_unsigned(dtype):
        return rem
    fix = logical_and(not_equal(rem, 0), not_equal(less(rem, 0), less(b, 0)))
    return where(fix, add(rem, b), rem)


mod = remainder


def divmod(x1: ArrayLike, x2: ArrayLike, /) -> tuple[Tensor, Tensor]:  # noqa: A001 - NumPy's name
    """(floor_divide(x1, x2), remainder(x1, x2))."""
    return floor_divide(x1, x2), remainder(x1, x2)


def fmod(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """C's fmod: the remainder has the sign of the dividend."""
    return _arithmetic(P.rem_p, "fmod", x1, x2)


def pow(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:  # noqa: A001 - the Array API name
    """x1 ** x2. Integer powers of integers stay integers; a negative integer exponent gives 0
    (except for bases 1 and -1), as XLA defines it. bool operands count as int32, as in JAX."""
    if dtypes.is_bool(result_type(x1, x2)):
        x1, x2 = astype(x1, dtypes.default_int), astype(x2, dtypes.default_int)
    if (isinstance(x2, int) and not isinstance(x2, bool) and 1 <= x2 <= 4
            and dtypes.is_inexact(result_type(x1, x2))):
        return _integer_power(asarray(x1), x2)
    return apply_elementwise(P.pow_p, x1, x2)


def _integer_power(x: Tensor, exponent: int) -> Tensor:
    """``x ** n`` for a small Python int n as repeated multiplication (JAX's integer_pow): exact
    rounding per step, cheap to vectorize, and simple derivatives."""
    result = x
    for _ in range(exponent - 1):
        result = multiply(result, x)
    return result


power = pow


def float_power(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """x1 ** x2 in floating point (float32 by default; funcgrad never silently uses float64)."""
    (a, b), weak = _inexact(x1, x2)
    return _weak(apply_elementwise(P.pow_p, a, b), weak)


def maximum(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Elementwise maximum; NaN propagates."""
    return apply_elementwise(P.max_p, x1, x2)


def minimum(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Elementwise minimum; NaN propagates."""
    return apply_elementwise(P.min_p, x1, x2)


def fmax(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Elementwise maximum ignoring NaN (NaN only where both are NaN)."""
    a, b = asarray(x1), asarray(x2)
    return where(isnan(a), b, where(isnan(b), a, maximum(a, b)))


def fmin(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Elementwise minimum ignoring NaN (NaN only where both are NaN)."""
    a, b = asarray(x1), asarray(x2)
    return where(isnan(a), b, where(isnan(b), a, minimum(a, b)))


def atan2(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """The angle of the point (x2, x1), in [-pi, pi]."""
    return apply_elementwise(P.atan2_p, x1, x2, to_float=True)


arctan2 = atan2


def hypot(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """sqrt(x1**2 + x2**2) without overflow for large inputs; inf if either is infinite."""
    (a, b), weak = _inexact(x1, x2)
    a, b = abs(a), abs(b)
    any_inf = logical_or(isinf(a), isinf(b))
    big, small = maximum(a, b), minimum(a, b)
    ratio = divide(small, where(equal(big, 0), 1, big))
    out = where(equal(big, 0), 0, multiply(big, sqrt(add(1, multiply(ratio, ratio)))))
    return _weak(where(any_inf, np.inf, out), weak)


def logaddexp(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """log(exp(x1) + exp(x2)) computed stably."""
    (a, b), weak = _inexact(x1, x2)
    big = maximum(a, b)
    finite_big = where(isfinite(big), big, 0)
    return _weak(add(finite_big, log(add(exp(subtract(a, finite_big)), exp(subtract(b, finite_big))))), weak)


def logaddexp2(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """log2(2**x1 + 2**x2) computed stably."""
    (a, b), weak = _inexact(x1, x2)
    big = maximum(a, b)
    finite_big = where(isfinite(big), big, 0)
    return _weak(add(finite_big, log2(add(exp2(subtract(a, finite_big)), exp2(subtract(b, finite_big))))),
                 weak)


def copysign(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """|x1| with the sign of x2 (including the sign of -0.0); the result is floating."""
    (a, b), weak = _inexact(x1, x2)
    magnitude = abs(a)
    return _weak(where(signbit(b), negative(magnitude), magnitude), weak)


def heaviside(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """0 where x1 < 0, x2 where x1 == 0, 1 where x1 > 0 (NaN where x1 is NaN)."""
    (a, b), weak = _inexact(x1, x2)
    step = where(less(a, 0), 0, where(greater(a, 0), 1, b))
    return _weak(where(isnan(a), np.nan, step), weak)


def nextafter(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """The next representable float after x1 toward x2. Its derivative is 1 with respect to x1 and
    0 with respect to x2 (the result differs from x1 by one ulp)."""
    (a, b), weak = _inexact(x1, x2)
    int_dtype = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[a.dtype.itemsize]
    bits = bind(P.bitcast_convert_type_p, a, new_dtype=int_dtype)
    toward_larger_magnitude = equal(greater(b, a), greater_equal(a, 0))
    stepped = where(toward_larger_magnitude, add(bits, 1), subtract(bits, 1))
    result = bind(P.bitcast_convert_type_p, stepped, new_dtype=a.dtype)
    smallest = bind(P.bitcast_convert_type_p, asarray(1, int_dtype), new_dtype=a.dtype)  # least subnormal
    result = where(equal(a, 0), where(greater(b, a), smallest, negative(smallest)), result)
    result = where(logical_or(isnan(a), isnan(b)), np.nan, where(equal(a, b), b, result))
    # the bit manipulation has no derivative; pass x1's through (a straight-through estimator)
    straight = add(a, bind(P.stop_gradient_p, subtract(result, a)))  # exact: result - a is one ulp
    straight = where(equal(a, b), b, straight)  # exactly x2 (so nextafter(+0, -0) is -0, not 0 + -0)
    return _weak(where(logical_and(isfinite(a), isfinite(result)), straight, result), weak)


# --- comparisons -------------------------------------------------------------------------------


def _comparison(primitive: P.Primitive, name: str, symbol: str) -> Callable[[ArrayLike, ArrayLike], Tensor]:
    def fn(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
        return apply_elementwise(primitive, x1, x2, keep_weak=False)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"x1 {symbol} x2 elementwise, after promotion; a bool array. NaN compares unequal."
    return fn


equal = _comparison(P.eq_p, "equal", "==")
not_equal = _comparison(P.ne_p, "not_equal", "!=")
less = _comparison(P.lt_p, "less", "<")
less_equal = _comparison(P.le_p, "less_equal", "<=")
greater = _comparison(P.gt_p, "greater", ">")
greater_equal = _comparison(P.ge_p, "greater_equal", ">=")


def isclose(a: ArrayLike, b: ArrayLike, rtol: float = 1e-05, atol: float = 1e-08,
            equal_nan: bool = False) -> Tensor:
    """|a - b| <= atol + rtol * |b| elementwise (NumPy's ``isclose``); infinities must match."""
    (x, y), _ = _inexact(a, b)
    finite_close = less_equal(abs(subtract(x, y)), add(atol, multiply(rtol, abs(y))))
    close = where(logical_or(isinf(x), isinf(y)), equal(x, y), finite_close)
    if equal_nan:
        close = logical_or(close, logical_and(isnan(x), isnan(y)))
    return close


# --- bitwise and logical -----------------------------------------------------------------------


def _bitwise(primitive: P.Primitive, name: str, doc: str,
             allow_bool: bool = True) -> Callable[[ArrayLike, ArrayLike], Tensor]:
    def fn(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
        dtype = result_type(x1, x2)
        if dtypes.is_inexact(dtype):
            raise TypeError(f"{name} needs integer or bool arrays, got {dtype.name}")
        if dtypes.is_bool(dtype) and not allow_bool:  # shifts count bools as int32, as JAX does
            x1, x2 = astype(x1, dtypes.default_int), astype(x2, dtypes.default_int)
        return apply_elementwise(primitive, x1, x2)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = doc
    return fn


bitwise_and = _bitwise(P.and_p, "bitwise_and", "x1 & x2 for integers and bools.")
bitwise_or = _bitwise(P.or_p, "bitwise_or", "x1 | x2 for integers and bools.")
bitwise_xor = _bitwise(P.xor_p, "bitwise_xor", "x1 ^ x2 for integers and bools.")
bitwise_left_shift = _bitwise(P.shift_left_p, "bitwise_left_shift",
                              "x1 << x2; shifting by the bit width or more gives 0.", allow_bool=False)
bitwise_right_shift = _bitwise(P.shift_right_p, "bitwise_right_shift",
                               "x1 >> x2 (arithmetic for signed integers).", allow_bool=False)
left_shift, right_shift = bitwise_left_shift, bitwise_right_shift


def bitwise_invert(x: ArrayLike, /) -> Tensor:
    """~x: bitwise not for integers, logical not for bools."""
    x = asarray(x)
    if dtypes.is_inexact(x.dtype):
        raise TypeError(f"bitwise_invert needs integer or bool arrays, got {x.dtype.name}")
    return apply_elementwise(P.not_p, x)


invert = bitwise_not = bitwise_invert


def _as_bool(x: ArrayLike) -> Tensor:
    x = asarray(x)
    return x if dtypes.is_bool(x.dtype) else not_equal(x, 0)


def logical_and(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Truth of x1 and x2 (nonzero counts as true)."""
    return apply_elementwise(P.and_p, _as_bool(x1), _as_bool(x2))


def logical_or(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Truth of x1 or x2 (nonzero counts as true)."""
    return apply_elementwise(P.or_p, _as_bool(x1), _as_bool(x2))


def logical_xor(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Truth of exactly one of x1, x2."""
    return apply_elementwise(P.xor_p, _as_bool(x1), _as_bool(x2))


def logical_not(x: ArrayLike, /) -> Tensor:
    """True where x is false or zero."""
    return apply_elementwise(P.not_p, _as_bool(x))


# --- selection and clean-up --------------------------------------------------------------------


def where(condition: ArrayLike, x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Pick ``x1`` where ``condition`` holds, else ``x2``, broadcasting all three.

    >>> where(asarray([True, False]), 1.0, 0.0).tolist()
    [1.0, 0.0]
    """
    cond = _as_bool(condition)
    (a, b), _, weak = promote(x1, x2)
    shapes = [cond.shape] + [v.shape for v in (a, b) if isinstance(v, Tensor)]
    shape = broadcast_shapes(*shapes)
    out = bind(P.select_p, broadcast_to(cond, shape), broadcast_to(a, shape), broadcast_to(b, shape))
    return _weak(out, weak)


def clip(x: ArrayLike, /, min: ArrayLike | None = None, max: ArrayLike | None = None) -> Tensor:  # noqa: A002
    """Limit values to [min, max] (either bound may be None); the result keeps x's dtype.

    >>> clip(asarray([1, 5, 9]), 2, 6).tolist()
    [2, 5, 6]
    """
    x = asarray(x)
    out = x
    if min is not None:
        out = maximum(out, min)
    if max is not None:
        out = minimum(out, max)
    return astype(out, x.dtype) if out.dtype != x.dtype else out


def nan_to_num(x: ArrayLike, nan: float = 0.0, posinf: float | None = None,
               neginf: float | None = None) -> Tensor:
    """Replace NaN by ``nan`` and +-inf by ``posinf``/``neginf`` (default: the dtype's extremes)."""
    x = asarray(x)
    if dtypes.is_complex(x.dtype):  # each part separately, as NumPy and JAX
        return complex_from_parts(nan_to_num(real(x), nan, posinf, neginf), nan_to_num(imag(x), nan, posinf, neginf))
    if not dtypes.is_float(x.dtype):
        return x
    info = dtypes.finfo(x.dtype)
    out = where(isnan(x), nan, x)
    out = where(equal(out, np.inf), float(info.max) if posinf is None else posinf, out)
    return astype(where(equal(out, -np.inf), float(info.min) if neginf is None else neginf, out), x.dtype)


def real(x: ArrayLike, /) -> Tensor:
    """Real part (float32 for complex64); a real x is returned as it is."""
    x = asarray(x)
    return _weak(bind(P.real_p, x), x._weak) if dtypes.is_complex(x.dtype) else x


def conj(x: ArrayLike, /) -> Tensor:
    """Complex conjugate; a real x is returned as it is."""
    x = asarray(x)
    return _weak(bind(P.conj_p, x), x._weak) if dtypes.is_complex(x.dtype) else x


conjugate = conj


def imag(x: ArrayLike, /) -> Tensor:
    """Imaginary part (float32 for complex64); zeros of x's shape and dtype for a real x."""
    x = asarray(x)
    if dtypes.is_complex(x.dtype):
        return _weak(bind(P.imag_p, x), x._weak)
    return broadcast_to(np.zeros((), x.dtype)[()], x.shape)


def angle(z: ArrayLike, /, deg: bool = False) -> Tensor:
    """The argument of z, atan2(imag(z), real(z)), in radians (degrees with ``deg``); real for real z."""
    z = asarray(z)
    if not dtypes.is_inexact(z.dtype):
        z = astype(z, dtypes.default_float)
    out = atan2(imag(z), real(z))
    return multiply(out, 180 / math.pi) if deg else out


def complex_from_parts(re: ArrayLike, im: ArrayLike, /) -> Tensor:
    """re + 1j * im without arithmetic on infinities (lax.complex): float32 parts give complex64."""
    (a, b), weak = _inexact(re, im)
    if a.dtype not in (dtypes.float32, dtypes.float64):
        a, b = astype(a, dtypes.float32), astype(b, dtypes.float32)
    shape = broadcast_shapes(a.shape, b.shape)
    return _weak(bind(P.complex_p, broadcast_to(a, shape), broadcast_to(b, shape)), weak)


__all__ = [
    "abs", "absolute", "acos", "angle", "acosh", "add", "arccos", "arccosh", "arcsin", "arcsinh", "arctan",
    "arctan2", "arctanh", "around", "asin", "asinh", "atan", "atan2", "atanh", "bitwise_and",
    "bitwise_invert", "bitwise_left_shift", "bitwise_not", "bitwise_or", "bitwise_right_shift",
    "bitwise_xor", "cbrt", "ceil", "clip", "conj", "conjugate", "copysign", "cos", "cosh", "deg2rad",
    "degrees", "divide", "divmod", "equal", "erf", "exp", "exp2", "expm1", "fabs", "fix", "float_power",
    "floor", "floor_divide", "fmax", "fmin", "fmod", "greater", "greater_equal", "heaviside", "hypot",
    "imag", "invert", "isclose", "isfinite", "isinf", "isnan", "isneginf", "isposinf", "left_shift",
    "less", "less_equal", "log", "log10", "log1p", "log2", "logaddexp", "logaddexp2", "logical_and",
    "logical_not", "logical_or", "logical_xor", "maximum", "minimum", "mod", "multiply", "nan_to_num",
    "negative", "nextafter", "not_equal", "positive", "pow", "power", "rad2deg", "radians", "real",
    "reciprocal", "remainder", "right_shift", "round", "rsqrt", "sigmoid", "sign", "signbit", "sin",
    "sinh", "sqrt", "square", "subtract", "tan", "tanh", "true_divide", "trunc", "where",
]
