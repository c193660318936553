"""Specification of funcgrad.numpy's elementwise functions: values against NumPy in float64 (eager
and traced), result dtypes against JAX's promotion rules, NaN/inf and signed-zero behaviour,
float16/bfloat16, and the errors bad input raises."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import assert_close, check_both_modes
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import funcgrad.numpy as fnp
from funcgrad.ir import dtypes

RNG = np.random.default_rng(0)


def _uniform(low: float, high: float, shape: tuple[int, ...] = (3, 4)) -> np.ndarray:
    return RNG.uniform(low, high, shape).astype(np.float32)


# (funcgrad function, NumPy reference, input domain)
FLOAT_UNARY = [
    (fnp.exp, np.exp, (-5, 5)), (fnp.exp2, np.exp2, (-5, 5)), (fnp.expm1, np.expm1, (-1, 1)),
    (fnp.log, np.log, (0.1, 10)), (fnp.log2, np.log2, (0.1, 10)), (fnp.log10, np.log10, (0.1, 10)),
    (fnp.log1p, np.log1p, (-0.5, 5)), (fnp.sin, np.sin, (-4, 4)), (fnp.cos, np.cos, (-4, 4)),
    (fnp.tan, np.tan, (-1.2, 1.2)), (fnp.asin, np.arcsin, (-0.99, 0.99)),
    (fnp.acos, np.arccos, (-0.99, 0.99)),
    (fnp.atan, np.arctan, (-5, 5)), (fnp.sinh, np.sinh, (-3, 3)), (fnp.cosh, np.cosh, (-3, 3)),
    (fnp.tanh, np.tanh, (-3, 3)), (fnp.asinh, np.arcsinh, (-5, 5)), (fnp.acosh, np.arccosh, (1.01, 5)),
    (fnp.atanh, np.arctanh, (-0.99, 0.99)), (fnp.sqrt, np.sqrt, (0, 10)),
    (fnp.rsqrt, lambda x: 1 / np.sqrt(x), (0.1, 10)),
    (fnp.sigmoid, lambda x: 1 / (1 + np.exp(-x)), (-8, 8)),
    (fnp.cbrt, np.cbrt, (-8, 8)), (fnp.deg2rad, np.deg2rad, (-360, 360)),
    (fnp.rad2deg, np.rad2deg, (-7, 7)), (fnp.fabs, np.fabs, (-5, 5)),
    (fnp.reciprocal, np.reciprocal, (0.5, 5)),
]
SAME_DTYPE_UNARY = [
    (fnp.abs, np.abs), (fnp.negative, np.negative), (fnp.positive, np.positive), (fnp.sign, np.sign),
    (fnp.square, np.square), (fnp.floor, np.floor), (fnp.ceil, np.ceil), (fnp.round, np.round),
    (fnp.trunc, np.trunc),
]
PREDICATES = [(fnp.isnan, np.isnan), (fnp.isinf, np.isinf), (fnp.isfinite, np.isfinite),
              (fnp.signbit, np.signbit), (fnp.isposinf, np.isposinf), (fnp.isneginf, np.isneginf),
              (fnp.logical_not, np.logical_not)]
# (funcgrad function, NumPy reference, domain of x1, domain of x2)
FLOAT_BINARY = [
    (fnp.add, np.add, (-5, 5), (-5, 5)), (fnp.subtract, np.subtract, (-5, 5), (-5, 5)),
    (fnp.multiply, np.multiply, (-5, 5), (-5, 5)), (fnp.divide, np.divide, (-5, 5), (0.5, 5)),
    (fnp.maximum, np.maximum, (-5, 5), (-5, 5)), (fnp.minimum, np.minimum, (-5, 5), (-5, 5)),
    (fnp.fmax, np.fmax, (-5, 5), (-5, 5)), (fnp.fmin, np.fmin, (-5, 5), (-5, 5)),
    (fnp.pow, np.power, (0.1, 3), (-2, 2)), (fnp.float_power, np.float_power, (0.1, 3), (-2, 2)),
    (fnp.atan2, np.arctan2, (-5, 5), (-5, 5)), (fnp.hypot, np.hypot, (-5, 5), (-5, 5)),
    (fnp.logaddexp, np.logaddexp, (-5, 5), (-5, 5)), (fnp.logaddexp2, np.logaddexp2, (-5, 5), (-5, 5)),
    (fnp.copysign, np.copysign, (-5, 5), (-5, 5)), (fnp.fmod, np.fmod, (-5, 5), (0.5, 3)),
    (fnp.remainder, np.remainder, (-5, 5), (-3, 3)), (fnp.floor_divide, np.floor_divide, (-5, 5), (-3, 3)),
    (fnp.heaviside, np.heaviside, (-1, 1), (0, 1)),
]
COMPARISONS = [(fnp.equal, np.equal), (fnp.not_equal, np.not_equal), (fnp.less, np.less),
               (fnp.less_equal, np.less_equal), (fnp.greater, np.greater),
               (fnp.greater_equal, np.greater_equal)]


def _check_against(fn, reference, *args, dtype=np.float32):  # type: ignore[no-untyped-def]
    expected = reference(*(np.asarray(a, np.float64) for a in args))
    for result in check_both_modes(fn, *args):
        assert np.asarray(result).dtype == dtype, (np.asarray(result).dtype, dtype)
        assert_close(result, expected, dtype)


@pytest.mark.parametrize(("fn", "reference", "domain"), FLOAT_UNARY, ids=lambda v: getattr(v, "__name__", ""))
def test_float_unary_matches_numpy(fn, reference, domain):  # type: ignore[no-untyped-def]
    _check_against(fn, reference, _uniform(*domain))


@pytest.mark.parametrize(("fn", "reference", "domain"), FLOAT_UNARY, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("in_dtype", ["bool", "int8", "int32", "uint8"])
def test_float_unary_promotes_bool_and_int_to_float32(fn, reference, domain, in_dtype):  # type: ignore[no-untyped-def]
    x = np.array([1, 2, 3]).astype(in_dtype) if in_dtype != "bool" else np.array([True, False, True])
    if domain[0] >= 0.1:  # keep to the domain (log, acosh, rsqrt, reciprocal)
        x = np.array([1, 2, 3]).astype(in_dtype) if in_dtype != "bool" else np.array([True, True])
    if domain[1] <= 1:  # asin, acos, atanh: only 0 and small values
        x = np.zeros(3, in_dtype)
    eager, traced = check_both_modes(fn, x)
    assert eager.dtype == traced.dtype == np.float32
    with np.errstate(all="ignore"):
        assert_close(eager, reference(x.astype(np.float64)), np.float32)


@pytest.mark.parametrize(("fn", "reference", "domain"), FLOAT_UNARY, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("low_dtype", ["float16", "bfloat16"])
def test_float_unary_keeps_low_precision_dtypes(fn, reference, domain, low_dtype):  # type: ignore[no-untyped-def]
    x = _uniform(*domain).astype(dtypes.canonicalize(low_dtype))
    eager, traced = check_both_modes(fn, x)
    assert eager.dtype == traced.dtype == dtypes.canonicalize(low_dtype)
    expected = reference(x.astype(np.float64))
    rtol, atol = (5e-3, 5e-3) if low_dtype == "float16" else (3e-2, 3e-2)
    assert_close(eager.astype(np.float64), expected, rtol=rtol, atol=atol * max(1, np.abs(expected).max()))


@pytest.mark.parametrize(("fn", "reference"), SAME_DTYPE_UNARY, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("dtype", ["float32", "int32", "int8"])
def test_unary_keeps_dtype_and_matches_numpy(fn, reference, dtype):  # type: ignore[no-untyped-def]
    x = np.array([[-2.5, -1.5, -0.5, 0.0], [0.5, 1.5, 2.5, 3.7]]).astype(np.float32)
    x = x if dtype == "float32" else np.round(x * 2).astype(dtype)
    _check_against(fn, reference, x, dtype=np.dtype(dtype))


@pytest.mark.parametrize(("fn", "reference"), PREDICATES, ids=lambda v: getattr(v, "__name__", ""))
@pytest.mark.parametrize("dtype", ["float32", "float16", "int32", "bool"])
def test_predicates_give_bool_and_match_numpy(fn, reference, dtype):  # type: ignore[no-untyped-def]
    values = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -2.0] if dtype.startswith("float") else [0, 1, -3, 2]
    x = np.array(values).astype(dtype) if dtype != "bool" else np.array([True, False])
    eager, traced = check_both_modes(fn, x)
    assert eager.dtype == np.bool_
    np.testing.assert_array_equal(eager, reference(x))
    np.testing.assert_array_equal(traced, reference(x))


@pytest.mark.parametrize(("fn", "reference", "dom1", "dom2"), FLOAT_BINARY,
                         ids=lambda v: getattr(v, "__name__", ""))
def test_float_binary_matches_numpy_with_broadcasting(fn, reference, dom1, dom2):  # type: ignore[no-untyped-def]
    _check_against(fn, reference, _uniform(*dom1, (3, 1, 4)), _uniform(*dom2, (5, 1)))


@pytest.mark.parametrize(("fn", "reference"), COMPARISONS, ids=lambda v: getattr(v, "__name__", ""))
def test_comparisons_match_numpy_including_nan(fn, reference):  # type: ignore[no-untyped-def]
    x = np.array([1.0, np.nan, 2.0, -np.inf, 0.0], np.float32)
    y = np.array([1.0, np.nan, 3.0, -np.inf, -0.0], np.float32)
    eager, traced = check_both_modes(fn, x, y)
    assert eager.dtype == np.bool_
    np.testing.assert_array_equal(eager, reference(x, y))
    np.testing.assert_array_equal(traced, reference(x, y))


@pytest.mark.parametrize(("fn", "reference"), [(fnp.floor_divide, np.floor_divide),
                                               (fnp.remainder, np.remainder), (fnp.fmod, np.fmod)])
@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8", "uint32"])
def test_integer_division_signs_match_numpy(fn, reference, dtype):  # type: ignore[no-untyped-def]
    a = np.array([-7, 7, -7, 7, 0, 6, -6, 5, 1]) if dtype.startswith("int") else np.array([7, 0, 6, 200, 1])
    b = np.array([2, -2, -2, 2, 3, -3, 3, 5, 7]) if dtype.startswith("int") else np.array([2, 3, 4, 7, 9])
    a, b = a.astype(dtype), b.astype(dtype)
    eager, traced = check_both_modes(fn, a, b)
    assert eager.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(eager, reference(a, b))
    np.testing.assert_array_equal(traced, reference(a, b))


def test_integer_division_by_zero_gives_zero():
    a, b = np.array([5, -5, 0], np.int32), np.zeros(3, np.int32)
    np.testing.assert_array_equal(fnp.floor_divide(a, b).numpy(), [0, 0, 0])
    np.testing.assert_array_equal(fnp.remainder(a, b).numpy(), [0, 0, 0])


def test_float_floor_divide_and_remainder_follow_numpy_divmod_edge_cases():
    a = np.array([1.0, -7.0, 7.0, 0.0, -0.0, 1.0, -1.0, 5.0, np.inf, 3.0, -3.0, np.nan, 2.0], np.float32)
    b = np.array([0.1, 2.0, -2.0, 3.0, 3.0, 0.0, 0.0, np.inf, 2.0, np.inf, np.inf, 1.0, -0.0], np.float32)
    with np.errstate(all="ignore"):
        floor_expected, rem_expected = np.floor_divide(a, b), np.remainder(a, b)
    # with an infinite operand the quotient is the standard's IEEE floor(a / b), where NumPy and JAX
    # give NaN for inf // 2 and -1 for -3 // inf (the remainder keeps NumPy's rule)
    floor_expected[8], floor_expected[10] = np.inf, -0.0
    for fn, expected in ((fnp.floor_divide, floor_expected), (fnp.remainder, rem_expected)):
        for result in check_both_modes(fn, a, b):
            np.testing.assert_array_equal(result, expected)  # 1.0 // 0.1 is 9.0, not 10.0
            assert_same_signs(result, expected)  # signed zeros too
    quotient, rem = fnp.divmod(a, b)
    np.testing.assert_array_equal(quotient.numpy(), floor_expected)
    np.testing.assert_array_equal(rem.numpy(), rem_expected)


def test_integer_pow_with_negative_exponents_follows_xla():
    base = np.array([2, -1, -1, 1, 3, 0, 5], np.int32)
    exponent = np.array([-1, -3, -2, -5, 2, 0, 3], np.int32)
    for result in check_both_modes(fnp.pow, base, exponent):
        assert result.dtype == np.int32
        np.testing.assert_array_equal(result, [0, -1, 1, 1, 9, 1, 125])


def test_pow_dtypes():
    assert fnp.pow(np.array([2], np.int8), 2).dtype == dtypes.int8
    assert fnp.pow(np.array([2], np.int32), 0.5).dtype == dtypes.float32
    assert fnp.pow(np.array([2], np.float16), 2).dtype == dtypes.float16
    assert fnp.pow(np.array([True]), np.array([True])).dtype == dtypes.int32  # bool counts as int32
    assert fnp.float_power(np.array([2], np.int32), 2).dtype == dtypes.float32


@pytest.mark.parametrize("dtype", ["int8", "int32", "uint8", "uint32"])
def test_shifts_match_numpy_in_range_and_saturate_out_of_range(dtype):
    bits = np.dtype(dtype).itemsize * 8
    x = np.array([1, 3, 100, 7], dtype) if dtype.startswith("u") else np.array([1, -3, 100, -7], dtype)
    shift = np.array([0, 1, 2, bits - 2], dtype)
    for fn, reference in ((fnp.left_shift, np.left_shift), (fnp.right_shift, np.right_shift)):
        for result in check_both_modes(fn, x, shift):
            assert result.dtype == np.dtype(dtype)
            np.testing.assert_array_equal(result, reference(x, shift))
    big = np.full(4, bits, dtype)
    np.testing.assert_array_equal(fnp.left_shift(x, big).numpy(), np.zeros(4))
    np.testing.assert_array_equal(fnp.right_shift(x, big).numpy(), np.where(x < 0, -1, 0))


@pytest.mark.parametrize(("fn", "reference"), [
    (fnp.bitwise_and, np.bitwise_and), (fnp.bitwise_or, np.bitwise_or), (fnp.bitwise_xor, np.bitwise_xor),
])
@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32"])
def test_bitwise_binary_matches_numpy(fn, reference, dtype):  # type: ignore[no-untyped-def]
    a = (np.arange(12).reshape(3, 4) * 7 - 20).astype(dtype)
    b = (np.arange(4) * 5 + 1).astype(dtype)
    for result in check_both_modes(fn, a, b):
        assert result.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(result, reference(a, b))


def test_bitwise_invert_and_logical_functions():
    ints = np.array([0, 1, -2, 5], np.int8)
    np.testing.assert_array_equal(fnp.bitwise_invert(ints).numpy(), np.invert(ints))
    np.testing.assert_array_equal(fnp.bitwise_invert(np.array([True, False])).numpy(), [False, True])
    a, b = np.array([0.0, 1.0, 2.0, 0.0]), np.array([0, 0, 3, 4])
    for fn, reference in ((fnp.logical_and, np.logical_and), (fnp.logical_or, np.logical_or),
                          (fnp.logical_xor, np.logical_xor)):
        eager, traced = check_both_modes(fn, a, b)
        assert eager.dtype == np.bool_
        np.testing.assert_array_equal(eager, reference(a, b))
        np.testing.assert_array_equal(traced, reference(a, b))


# --- promotion -------------------------------------------------------------------------------

PROMOTIONS = [  # (x1 dtype or Python value, x2, expected result dtype of add) from JAX's lattice
    ("int8", "uint8", "int16"), ("uint32", "int32", "int64"), ("int32", "float16", "float16"),
    ("uint8", "int16", "int16"), ("float16", "bfloat16", "float32"), ("int64", "float16", "float16"),
    ("uint8", "uint32", "uint32"), ("bool", "int8", "int8"), ("bool", "float16", "float16"),
    ("float16", 2.5, "float16"), ("bfloat16", 1.0, "bfloat16"), ("int8", 3, "int8"), ("uint8", 255, "uint8"),
    ("int32", 2.5, "float32"), ("int8", 2.5, "float32"), ("bool", 1, "int32"), ("bool", 1.5, "float32"),
    ("float16", np.float32(1), "float32"), ("bool", "bool", "bool"),
]


def _operand(spec):  # type: ignore[no-untyped-def]
    if isinstance(spec, str):
        return np.ones(2, dtypes.canonicalize(spec))
    return spec


@pytest.mark.parametrize(("a", "b", "expected"), PROMOTIONS)
def test_add_promotes_like_jax(a, b, expected):  # type: ignore[no-untyped-def]
    x1, x2 = _operand(a), _operand(b)
    assert fnp.add(x1, x2).dtype == dtypes.canonicalize(expected)
    assert fnp.add(x2, x1).dtype == dtypes.canonicalize(expected)
    eager, traced = check_both_modes(fnp.add, x1, x2)
    assert eager.dtype == dtypes.canonicalize(expected)


@pytest.mark.parametrize(("a", "b", "expected"), [
    ("int8", "int8", "float32"), ("uint8", "int32", "float32"), ("float16", "float16", "float16"),
    ("bool", "bool", "float32"), ("int32", 2, "float32"), ("float16", 2, "float16"),
])
def test_divide_promotes_integers_to_float32(a, b, expected):  # type: ignore[no-untyped-def]
    assert fnp.divide(_operand(a), _operand(b)).dtype == dtypes.canonicalize(expected)


def test_bool_arithmetic_is_logical_and_subtract_rejects_bool():
    t, f = np.array([True, True, False]), np.array([True, False, False])
    assert fnp.add(t, f).dtype == np.bool_
    np.testing.assert_array_equal(fnp.add(t, f).numpy(), [True, True, False])
    np.testing.assert_array_equal(fnp.multiply(t, f).numpy(), [True, False, False])
    assert fnp.square(t).dtype == dtypes.int32
    with pytest.raises(TypeError, match="subtract is not defined for bool"):
        fnp.subtract(t, f)
    with pytest.raises(TypeError, match="negative is not defined for bool"):
        fnp.negative(t)


def test_weak_python_scalars_do_not_widen_and_overflow_raises():
    u8 = np.array([1, 2], np.uint8)
    assert fnp.add(u8, 200).dtype == dtypes.uint8
    with pytest.raises(OverflowError, match="300"):
        fnp.add(u8, 300)
    with pytest.raises(OverflowError, match="uint8"):
        fnp.less(u8, -1)
    ints = np.array([2, 3], np.int32)
    np.testing.assert_array_equal(fnp.less(ints, 2.5).numpy(), [True, False])  # compared as floats
    np.testing.assert_array_equal(fnp.equal(u8, 2).numpy(), [False, True])
    assert fnp.multiply(np.ones(2, np.float16), 3.0).dtype == dtypes.float16


def test_weak_results_stay_weak_through_compositions():
    half = np.ones(3, np.float16)
    for fn in (fnp.hypot, fnp.logaddexp, fnp.copysign, fnp.floor_divide, fnp.remainder, fnp.atan2):
        assert fn(fnp.add(2.0, 1.0), half).dtype == dtypes.float16, fn.__name__
    assert fnp.log10(half).dtype == dtypes.float16


# --- NaN, infinities, special values ---------------------------------------------------------


def test_maximum_and_minimum_propagate_nan_fmax_ignores_it():
    a = np.array([np.nan, 1.0, np.nan], np.float32)
    b = np.array([2.0, np.nan, np.nan], np.float32)
    np.testing.assert_array_equal(fnp.maximum(a, b).numpy(), np.maximum(a, b))
    np.testing.assert_array_equal(fnp.minimum(a, b).numpy(), np.minimum(a, b))
    np.testing.assert_array_equal(fnp.fmax(a, b).numpy(), np.fmax(a, b))
    np.testing.assert_array_equal(fnp.fmin(a, b).numpy(), np.fmin(a, b))


def assert_same_signs(actual: np.ndarray, expected: np.ndarray) -> None:
    """Sign bits agree, signed zeros included; NaNs are skipped: IEEE 754 leaves the sign of a NaN
    an operation makes unspecified (glibc gives -nan for log(-inf), PoCL's libm +nan)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    numbers = ~np.isnan(expected)
    np.testing.assert_array_equal(np.signbit(actual)[numbers], np.signbit(expected)[numbers])


def test_special_values_match_numpy():
    special = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 1.0], np.float32)
    with np.errstate(all="ignore"):
        for fn, reference in ((fnp.exp, np.exp), (fnp.log, np.log), (fnp.sqrt, np.sqrt), (fnp.sign, np.sign),
                              (fnp.tanh, np.tanh), (fnp.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
                              (fnp.trunc, np.trunc), (fnp.abs, np.abs), (fnp.log1p, np.log1p)):
            # exact at the special values (inf, nan, signed zeros); within 1 ulp elsewhere, since the
            # compiled kernels use the C library's correctly rounded functions, NumPy its own
            numbers = ~np.isnan(reference(special))  # NaN signs are unspecified: see assert_same_signs
            np.testing.assert_array_max_ulp(fn(special).numpy()[numbers],
                                            reference(special).astype(np.float32)[numbers], maxulp=1)
            np.testing.assert_array_equal(np.isnan(fn(special).numpy()), np.isnan(reference(special)))
            assert_same_signs(fn(special).numpy(), reference(special))
        pairs_a = np.array([np.inf, np.inf, -np.inf, np.nan, 3.0, np.inf], np.float32)
        pairs_b = np.array([np.nan, np.inf, -np.inf, 1.0, 4.0, 1.0], np.float32)
        for fn, reference in ((fnp.hypot, np.hypot), (fnp.logaddexp, np.logaddexp), (fnp.atan2, np.arctan2),
                              (fnp.copysign, np.copysign), (fnp.logaddexp2, np.logaddexp2)):
            np.testing.assert_allclose(fn(pairs_a, pairs_b).numpy(), reference(pairs_a, pairs_b), rtol=1e-6)


def test_copysign_and_signbit_see_negative_zero():
    x = np.array([1.0, 2.0, 3.0], np.float32)
    signs = np.array([-0.0, 0.0, -np.inf], np.float32)
    np.testing.assert_array_equal(fnp.copysign(x, signs).numpy(), [-1.0, 2.0, -3.0])
    np.testing.assert_array_equal(fnp.signbit(np.float32(-0.0)).numpy(), True)
    assert fnp.copysign(np.array([1, 2], np.int32), -1).dtype == dtypes.float32


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_nextafter_matches_numpy(dtype):
    a = np.array([1.0, 1.0, 0.0, 0.0, -1.0, 5.0, np.nan], dtype)
    b = np.array([2.0, 0.0, 1.0, -1.0, -2.0, 5.0, 1.0], dtype)
    for result in check_both_modes(fnp.nextafter, a, b):
        assert result.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(result, np.nextafter(a, b))


def test_round_is_half_to_even_and_supports_decimals():
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 1.2345], np.float32)
    np.testing.assert_array_equal(fnp.round(x).numpy(), np.round(x))
    assert_close(fnp.round(x, decimals=2).numpy(), np.round(x.astype(np.float64), 2), np.float32)
    assert fnp.round(np.array([3], np.int32)).dtype == dtypes.int32
    with pytest.raises(NotImplementedError, match="decimals < 0"):
        fnp.round(np.array([15], np.int32), decimals=-1)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_binary_ops_in_low_precision_keep_dtype(dtype):
    low = dtypes.canonicalize(dtype)
    a, b = _uniform(-4, 4).astype(low), _uniform(0.5, 4).astype(low)
    tolerance = {"float16": 2e-3, "bfloat16": 2e-2}[dtype]
    for fn, reference in ((fnp.add, np.add), (fnp.multiply, np.multiply), (fnp.divide, np.divide),
                          (fnp.hypot, np.hypot), (fnp.atan2, np.arctan2), (fnp.maximum, np.maximum),
                          (fnp.logaddexp, np.logaddexp), (fnp.pow, np.power)):
        a_pow = np.abs(a) if fn is fnp.pow else a
        eager, traced = check_both_modes(fn, a_pow, b)
        assert eager.dtype == low
        expected = reference(a_pow.astype(np.float64), b.astype(np.float64))
        assert_close(eager.astype(np.float64), expected, rtol=2 * tolerance, atol=2 * tolerance)
    assert fnp.less(a, b).dtype == np.bool_
    np.testing.assert_array_equal(fnp.isfinite(a).numpy(), np.ones(a.shape, bool))


# --- where, clip, nan_to_num, isclose, complex stubs -----------------------------------------


def test_where_broadcasts_and_promotes():
    cond = np.array([[True], [False]])
    eager, traced = check_both_modes(fnp.where, cond, np.array([1, 2, 3], np.int8), 2.5)
    assert eager.dtype == np.float32
    np.testing.assert_array_equal(eager, np.where(cond, [1, 2, 3], 2.5))
    assert fnp.where(cond, np.ones(3, np.float16), 0.0).dtype == dtypes.float16


def test_clip_keeps_dtype_and_handles_missing_bounds():
    x = np.array([1, 5, 9, -3], np.int32)
    for result in check_both_modes(lambda v: fnp.clip(v, 2, 6), x):
        assert result.dtype == np.int32
        np.testing.assert_array_equal(result, np.clip(x, 2, 6))
    np.testing.assert_array_equal(fnp.clip(x, max=0).numpy(), np.minimum(x, 0))
    np.testing.assert_array_equal(fnp.clip(x, min=0).numpy(), np.maximum(x, 0))
    assert fnp.clip(np.ones(2, np.float16), 0.0, 0.5).dtype == dtypes.float16


def test_nan_to_num_matches_numpy():
    x = np.array([np.nan, np.inf, -np.inf, 1.5], np.float32)
    np.testing.assert_array_equal(fnp.nan_to_num(x).numpy(), np.nan_to_num(x))
    replaced = fnp.nan_to_num(x, nan=-1.0, posinf=9.0, neginf=-9.0)
    np.testing.assert_array_equal(replaced.numpy(), [-1, 9, -9, 1.5])
    assert fnp.nan_to_num(x.astype(np.float16)).dtype == dtypes.float16


def test_isclose_matches_numpy():
    a = np.array([1.0, 1.0, np.inf, np.nan, -np.inf, 0.0], np.float32)
    b = np.array([1.0 + 1e-6, 1.1, np.inf, np.nan, np.inf, 1e-9], np.float32)
    np.testing.assert_array_equal(fnp.isclose(a, b).numpy(), np.isclose(a, b))
    np.testing.assert_array_equal(fnp.isclose(a, b, equal_nan=True).numpy(), np.isclose(a, b, equal_nan=True))


def test_complex_stubs_return_real_values():
    x = np.array([1.0, -2.0], np.float32)
    np.testing.assert_array_equal(fnp.real(x).numpy(), x)
    np.testing.assert_array_equal(fnp.conj(x).numpy(), x)
    imag = fnp.imag(x)
    assert imag.dtype == np.float32
    np.testing.assert_array_equal(imag.numpy(), [0.0, 0.0])


def test_functions_have_docstrings():
    missing = [name for name in fnp.elementwise.__all__ if not getattr(fnp.elementwise, name).__doc__]
    assert missing == []


# --- bad input -------------------------------------------------------------------------------


def test_broadcast_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(2, 3\).*\(4,\)"):
        fnp.add(np.ones((2, 3)), np.ones(4))
    with pytest.raises(ValueError, match=r"\(5,\).*\(2, 1\).*\(3,\)|\(2, 1\).*\(3,\)"):
        fnp.where(np.ones(5, bool), np.ones((2, 1)), np.ones(3))


def test_bad_dtypes_raise_type_errors():
    with pytest.raises(TypeError, match="bitwise_and needs integer or bool arrays, got float32"):
        fnp.bitwise_and(np.ones(2, np.float32), 1)
    with pytest.raises(TypeError, match="bitwise_invert needs integer or bool arrays"):
        fnp.bitwise_invert(np.ones(2, np.float32))
    with pytest.raises(TypeError, match="left_shift|shift_left"):
        fnp.left_shift(np.ones(2, np.float32), 1)
    with pytest.raises(TypeError, match="floor_divide is not defined for bool"):
        fnp.floor_divide(np.array([True]), np.array([True]))
    with pytest.raises(TypeError, match="sign is not defined for bool"):
        fnp.sign(np.array([True]))
    assert fnp.add(np.ones(2, np.float32), 1j).dtype == np.complex64  # complex is supported now
    with pytest.raises(TypeError, match="bitwise_and needs integer or bool arrays, got complex64"):
        fnp.bitwise_and(np.ones(2, np.int32), 1j)


# --- properties ------------------------------------------------------------------------------

BINARY_PROPERTY_OPS = [(fnp.add, np.add), (fnp.subtract, np.subtract), (fnp.multiply, np.multiply),
                       (fnp.maximum, np.maximum), (fnp.atan2, np.arctan2), (fnp.hypot, np.hypot),
                       (fnp.logaddexp, np.logaddexp), (fnp.less, np.less), (fnp.copysign, np.copysign)]


@settings(max_examples=30, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
       op=st.sampled_from(BINARY_PROPERTY_OPS), seed=st.integers(0, 2**16))
def test_binary_ops_broadcast_like_numpy(shapes, op, seed):  # type: ignore[no-untyped-def]
    fn, reference = op
    rng = np.random.default_rng(seed)
    a = rng.uniform(-3, 3, shapes.input_shapes[0]).astype(np.float32)
    b = rng.uniform(-3, 3, shapes.input_shapes[1]).astype(np.float32)
    expected = reference(a.astype(np.float64), b.astype(np.float64))
    for result in check_both_modes(fn, a, b):
        assert result.shape == shapes.result_shape
        assert_close(result, expected, result.dtype)


@settings(max_examples=30, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, max_dims=3, max_side=3),
       op=st.sampled_from([(fnp.floor_divide, np.floor_divide), (fnp.remainder, np.remainder)]),
       dtype=st.sampled_from(["int8", "int32", "float32"]), seed=st.integers(0, 2**16))
def test_floor_divide_and_remainder_agree_with_numpy(shapes, op, dtype, seed):  # type: ignore[no-untyped-def]
    fn, reference = op
    rng = np.random.default_rng(seed)
    a = rng.integers(-20, 20, shapes.input_shapes[0]).astype(dtype)
    b = rng.integers(1, 6, shapes.input_shapes[1]) * rng.choice([-1, 1], shapes.input_shapes[1])
    b = b.astype(dtype)
    if dtype == "float32":
        a = a + np.float32(0.25)
    for result in check_both_modes(fn, a, b):
        assert result.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(result, reference(a, b))
    # the division identity a == (a // b) * b + a % b holds exactly
    np.testing.assert_array_equal(fnp.floor_divide(a, b).numpy() * b + fnp.remainder(a, b).numpy(),
                                  np.broadcast_to(a, shapes.result_shape))
