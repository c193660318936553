"""Elementwise functions of the Array API standard (2023.12), built on the elementwise primitives.

Functions that are not primitives are compositions written here (``hypot``, ``logaddexp``,
``floor_divide``, ...), so differentiation and batching need no extra rules. Transcendental
functions promote bool and integer inputs to the default float, as JAX does.
"""

from __future__ import annotations

import numpy as np

from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import ArrayLike, apply_elementwise, asarray, astype
from funcgrad.tensor import Tensor, bind


def _float_unary(primitive: P.Primitive, doc: str):  # type: ignore[no-untyped-def]
    def fn(x: ArrayLike, /) -> Tensor:
        return apply_elementwise(primitive, x, to_float=True)
    fn.__name__ = fn.__qualname__ = primitive.name
    fn.__doc__ = doc
    return fn


exp = _float_unary(P.exp_p, "e**x, elementwise.")
exp2 = _float_unary(P.exp2_p, "2**x, elementwise.")
expm1 = _float_unary(P.expm1_p, "exp(x) - 1, accurate near 0.")
log = _float_unary(P.log_p, "Natural logarithm.")
log2 = _float_unary(P.log2_p, "Base-2 logarithm.")
log1p = _float_unary(P.log1p_p, "log(1 + x), accurate near 0.")
sin = _float_unary(P.sin_p, "Sine.")
cos = _float_unary(P.cos_p, "Cosine.")
tan = _float_unary(P.tan_p, "Tangent.")
asin = arcsin = _float_unary(P.asin_p, "Inverse sine.")
acos = arccos = _float_unary(P.acos_p, "Inverse cosine.")
atan = arctan = _float_unary(P.atan_p, "Inverse tangent.")
sinh = _float_unary(P.sinh_p, "Hyperbolic sine.")
cosh = _float_unary(P.cosh_p, "Hyperbolic cosine.")
tanh = _float_unary(P.tanh_p, "Hyperbolic tangent.")
asinh = arcsinh = _float_unary(P.asinh_p, "Inverse hyperbolic sine.")
acosh = arccosh = _float_unary(P.acosh_p, "Inverse hyperbolic cosine.")
atanh = arctanh = _float_unary(P.atanh_p, "Inverse hyperbolic tangent.")
sqrt = _float_unary(P.sqrt_p, "Square root.")
rsqrt = _float_unary(P.rsqrt_p, "1 / sqrt(x).")
erf = _float_unary(P.erf_p, "The error function.")
sigmoid = _float_unary(P.logistic_p, "The logistic function 1 / (1 + exp(-x)), stable for large |x|.")


def log10(x: ArrayLike, /) -> Tensor:
    """Base-10 logarithm."""
    return multiply(log(x), 1 / np.log(10))


def _rounding(primitive: P.Primitive):  # type: ignore[no-untyped-def]
    def fn(x: ArrayLike, /) -> Tensor:
        x = asarray(x)
        return x if not dtypes.is_float(x.dtype) else apply_elementwise(primitive, x)
    fn.__name__ = fn.__qualname__ = primitive.name
    fn.__doc__ = f"{primitive.name.capitalize()} of each element; integers are returned unchanged."
    return fn


floor = _rounding(P.floor_p)
ceil = _rounding(P.ceil_p)
round = _rounding(P.round_p)  # noqa: A001 - the Array API name


def trunc(x: ArrayLike, /) -> Tensor:
    """Round toward zero; integers are returned unchanged."""
    x = asarray(x)
    return x if not dtypes.is_float(x.dtype) else where(less(x, 0), ceil(x), floor(x))


def negative(x: ArrayLike, /) -> Tensor:
    x = asarray(x)
    if dtypes.is_bool(x.dtype):
        raise TypeError("negative is not defined for bool arrays; use logical_not")
    return apply_elementwise(P.neg_p, x)


def positive(x: ArrayLike, /) -> Tensor:
    x = asarray(x)
    if dtypes.is_bool(x.dtype):
        raise TypeError("positive is not defined for bool arrays")
    return x


def abs(x: ArrayLike, /) -> Tensor:  # noqa: A001
    x = asarray(x)
    if dtypes.is_bool(x.dtype) or dtypes.is_unsigned(x.dtype):
        return x
    return apply_elementwise(P.abs_p, x)


def sign(x: ArrayLike, /) -> Tensor:
    x = asarray(x)
    if dtypes.is_bool(x.dtype):
        raise TypeError("sign is not defined for bool arrays")
    return apply_elementwise(P.sign_p, x)


def square(x: ArrayLike, /) -> Tensor:
    return multiply(x, x)


def reciprocal(x: ArrayLike, /) -> Tensor:
    return divide(1.0, x)


def _no_bool(primitive: P.Primitive, x1: ArrayLike, x2: ArrayLike) -> Tensor:
    from funcgrad.numpy.conversion import result_type
    if dtypes.is_bool(result_type(x1, x2)):
        # NumPy and JAX treat bool + bool as logical or and bool * bool as and; keep that
        logical = {P.add_p: P.or_p, P.mul_p: P.and_p}.get(primitive)
        if logical is None:
            raise TypeError(f"{primitive.name} is not defined for bool arrays")
        return apply_elementwise(logical, x1, x2)
    return apply_elementwise(primitive, x1, x2)


def add(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """x1 + x2 with broadcasting and JAX promotion. >>> add(asarray([1, 2]), 1.5)  # float32"""
    return _no_bool(P.add_p, x1, x2)


def subtract(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    return _no_bool(P.sub_p, x1, x2)


def multiply(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    return _no_bool(P.mul_p, x1, x2)


def divide(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """True division; integer inputs give the default float (as ``/`` does in Python)."""
    return apply_elementwise(P.div_p, x1, x2, to_float=True)


def floor_divide(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Division rounding toward negative infinity (Python's ``//``)."""
    from funcgrad.numpy.conversion import promote
    (a, b), dtype, _ = promote(x1, x2)
    if dtypes.is_bool(dtype):
        raise TypeError("floor_divide is not defined for bool arrays")
    if dtypes.is_float(dtype):
        return floor(divide(a, b))
    quotient = apply_elementwise(P.div_p, a, b)
    if dtypes.is_unsigned(dtype):
        return quotient
    # truncation rounds toward zero: step down where the signs differ and the division is inexact
    remainder_nonzero = not_equal(apply_elementwise(P.rem_p, a, b), 0)
    signs_differ = not_equal(less(a, 0), less(b, 0))
    return where(logical_and(remainder_nonzero, signs_differ), subtract(quotient, 1), quotient)


def remainder(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Python's ``%``: the result has the sign of the divisor."""
    from funcgrad.numpy.conversion import promote
    (a, b), dtype, _ = promote(x1, x2)
    if dtypes.is_bool(dtype):
        raise TypeError("remainder is not defined for bool arrays")
    rem = apply_elementwise(P.rem_p, a, b)
    if dtypes.is_unsigned(dtype):
        return rem
    fix = logical_and(not_equal(rem, 0), not_equal(less(rem, 0), less(b, 0)))
    return where(fix, add(rem, b), rem)


def fmod(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """C's fmod: the remainder has the sign of the dividend."""
    return _no_bool(P.rem_p, x1, x2)


def pow(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:  # noqa: A001
    """x1 ** x2. Integer powers of integers stay integers (negative exponents give 0, as JAX)."""
    return _no_bool(P.pow_p, x1, x2)


power = pow


def maximum(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Elementwise maximum; NaN propagates."""
    return apply_elementwise(P.max_p, x1, x2)


def minimum(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    return apply_elementwise(P.min_p, x1, x2)


def atan2(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    return apply_elementwise(P.atan2_p, x1, x2, to_float=True)


arctan2 = atan2


def hypot(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """sqrt(x1**2 + x2**2) without overflow for large inputs."""
    a, b = abs(asarray(x1)), abs(asarray(x2))
    big, small = maximum(a, b), minimum(a, b)
    safe = where(equal(big, 0), 1, big)
    ratio = divide(small, safe)
    return where(equal(big, 0), 0, multiply(big, sqrt(add(1, multiply(ratio, ratio)))))


def logaddexp(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """log(exp(x1) + exp(x2)) computed stably."""
    a, b = asarray(x1), asarray(x2)
    big = maximum(a, b)
    finite_big = where(isfinite(big), big, 0)
    return add(finite_big, log(add(exp(subtract(a, finite_big)), exp(subtract(b, finite_big)))))


def copysign(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """|x1| with the sign of x2 (including the sign of -0.0)."""
    magnitude = abs(asarray(x1))
    return where(signbit(x2), negative(magnitude), magnitude)


def signbit(x: ArrayLike, /) -> Tensor:
    """True where the sign bit is set (so -0.0 counts as negative)."""
    x = asarray(x)
    if not dtypes.is_float(x.dtype):
        return less(x, 0)
    int_dtype = {2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[x.dtype.itemsize]
    return less(bind(P.bitcast_convert_type_p, x, new_dtype=int_dtype), 0)


def _comparison(primitive: P.Primitive):  # type: ignore[no-untyped-def]
    def fn(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
        return apply_elementwise(primitive, x1, x2, keep_weak=False)
    fn.__name__ = fn.__qualname__ = primitive.name
    return fn


equal = _comparison(P.eq_p)
not_equal = _comparison(P.ne_p)
less = _comparison(P.lt_p)
less_equal = _comparison(P.le_p)
greater = _comparison(P.gt_p)
greater_equal = _comparison(P.ge_p)


def isnan(x: ArrayLike, /) -> Tensor:
    x = asarray(x)
    return not_equal(x, x) if dtypes.is_float(x.dtype) else _full_bool(x, False)


def isinf(x: ArrayLike, /) -> Tensor:
    x = asarray(x)
    return equal(abs(x), np.inf) if dtypes.is_float(x.dtype) else _full_bool(x, False)


def isfinite(x: ArrayLike, /) -> Tensor:
    x = asarray(x)
    return apply_elementwise(P.is_finite_p, x) if dtypes.is_float(x.dtype) else _full_bool(x, True)


def _full_bool(like: Tensor, value: bool) -> Tensor:
    from funcgrad.numpy.conversion import broadcast_to
    return broadcast_to(np.bool_(value), like.shape) if like.shape else asarray(value)


def _bitwise(primitive: P.Primitive, name: str):  # type: ignore[no-untyped-def]
    def fn(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
        return apply_elementwise(primitive, x1, x2)
    fn.__name__ = fn.__qualname__ = name
    return fn


bitwise_and = _bitwise(P.and_p, "bitwise_and")
bitwise_or = _bitwise(P.or_p, "bitwise_or")
bitwise_xor = _bitwise(P.xor_p, "bitwise_xor")
bitwise_left_shift = _bitwise(P.shift_left_p, "bitwise_left_shift")
bitwise_right_shift = _bitwise(P.shift_right_p, "bitwise_right_shift")
left_shift, right_shift = bitwise_left_shift, bitwise_right_shift


def bitwise_invert(x: ArrayLike, /) -> Tensor:
    return apply_elementwise(P.not_p, x)


invert = bitwise_not = bitwise_invert


def _as_bool(x: ArrayLike) -> Tensor:
    x = asarray(x)
    return x if dtypes.is_bool(x.dtype) else not_equal(x, 0)


def logical_and(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    return apply_elementwise(P.and_p, _as_bool(x1), _as_bool(x2))


def logical_or(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    return apply_elementwise(P.or_p, _as_bool(x1), _as_bool(x2))


def logical_xor(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    return apply_elementwise(P.xor_p, _as_bool(x1), _as_bool(x2))


def logical_not(x: ArrayLike, /) -> Tensor:
    return apply_elementwise(P.not_p, _as_bool(x))


def where(condition: ArrayLike, x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """Pick ``x1`` where ``condition`` holds, else ``x2``, broadcasting all three.

    >>> where(asarray([True, False]), 1.0, 0.0).tolist()
    [1.0, 0.0]
    """
    from funcgrad.numpy.conversion import broadcast_shapes, broadcast_to, promote
    cond = _as_bool(condition)
    (a, b), _, weak = promote(x1, x2)
    shapes = [cond.shape] + [v.shape for v in (a, b) if isinstance(v, Tensor)]
    shape = broadcast_shapes(*shapes)
    a, b = broadcast_to(a, shape), broadcast_to(b, shape)
    out = bind(P.select_p, broadcast_to(cond, shape), a, b)
    out._weak = weak
    return out


def clip(x: ArrayLike, /, min: ArrayLike | None = None, max: ArrayLike | None = None) -> Tensor:  # noqa: A002
    """Limit values to [min, max] (either bound may be None). The result keeps x's dtype."""
    x = asarray(x)
    out = x
    if min is not None:
        out = maximum(out, min)
    if max is not None:
        out = minimum(out, max)
    return astype(out, x.dtype) if out.dtype != x.dtype else out


def nan_to_num(x: ArrayLike, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Tensor:
    x = asarray(x)
    if not dtypes.is_float(x.dtype):
        return x
    info = dtypes.finfo(x.dtype)
    out = where(isnan(x), nan, x)
    out = where(equal(out, np.inf), float(info.max) if posinf is None else posinf, out)
    return where(equal(out, -np.inf), float(info.min) if neginf is None else neginf, out)


def real(x: ArrayLike, /) -> Tensor:
    """Real part: funcgrad has no complex dtypes, so this is x itself."""
    return asarray(x)


def conj(x: ArrayLike, /) -> Tensor:
    return asarray(x)


def imag(x: ArrayLike, /) -> Tensor:
    x = asarray(x)
    from funcgrad.numpy.conversion import broadcast_to
    return broadcast_to(np.zeros((), x.dtype)[()], x.shape) if x.shape else asarray(np.zeros((), x.dtype))


def nextafter(x1: ArrayLike, x2: ArrayLike, /) -> Tensor:
    """The next representable float after x1 toward x2 (float32/float64 only)."""
    from funcgrad.numpy.conversion import promote
    (a, b), dtype, _ = promote(x1, x2)
    a, b = asarray(a, dtype), asarray(b, dtype)
    if dtype not in (dtypes.float32, dtypes.float64):
        raise TypeError(f"nextafter supports float32 and float64, got {dtype.name}")
    int_dtype = dtypes.int32 if dtype == dtypes.float32 else dtypes.int64
    bits = bind(P.bitcast_convert_type_p, a, new_dtype=int_dtype)
    toward_larger_magnitude = equal(greater(b, a), greater_equal(a, 0))
    stepped = where(toward_larger_magnitude, add(bits, 1), subtract(bits, 1))
    result = bind(P.bitcast_convert_type_p, stepped, new_dtype=dtype)
    smallest = bind(P.bitcast_convert_type_p, asarray(1, int_dtype), new_dtype=dtype)
    from_zero = where(greater(b, a), smallest, negative(smallest))
    result = where(equal(a, 0), from_zero, result)
    return where(logical_or(isnan(a), isnan(b)), np.nan, where(equal(a, b), b, result))


# every public function defined above (aliases included) is part of funcgrad.numpy
__all__ = [name for name, value in list(globals().items())
           if not name.startswith("_") and callable(value) and getattr(value, "__module__", None) == __name__]
