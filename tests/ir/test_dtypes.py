"""dtypes and JAX-style promotion (the table of jax.numpy with 64-bit mode off, plus explicit 64-bit)."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad.numpy as fnp
from funcgrad.ir import dtypes as D

W_INT, W_FLOAT = "i*", "f*"


def _operand(name):
    if name == W_INT:
        return (D.int32, True)
    if name == W_FLOAT:
        return (D.float32, True)
    return (D.canonicalize(name), False)


# (a, b, result): a subset of JAX's published promotion table
PROMOTIONS = [
    ("bool", "int8", "int8"), ("bool", "uint8", "uint8"), ("bool", "float16", "float16"),
    ("bool", W_INT, "int32"), ("bool", W_FLOAT, "float32"),
    ("uint8", "int8", "int16"), ("uint8", "uint16", "uint16"), ("uint8", "int16", "int16"),
    ("uint8", "float16", "float16"), ("uint8", "bfloat16", "bfloat16"), ("uint8", W_INT, "uint8"),
    ("uint8", W_FLOAT, "float32"), ("int8", "uint32", "int64"), ("int16", "uint16", "int32"),
    ("int32", "uint32", "int64"), ("uint16", "int8", "int32"), ("int64", "uint64", "float32"),
    ("float16", "bfloat16", "float32"), ("bfloat16", W_INT, "bfloat16"), ("float16", W_FLOAT, "float16"),
    ("int32", "float16", "float16"), ("int32", W_FLOAT, "float32"), ("int8", W_INT, "int8"),
    ("float32", "float64", "float64"), ("int64", "float32", "float32"), ("float32", "int8", "float32"),
]


@pytest.mark.parametrize("a,b,expected", PROMOTIONS)
def test_promotion_matches_jax_table_and_is_symmetric(a, b, expected):
    assert D.result_type(_operand(a), _operand(b))[0] == D.canonicalize(expected)
    assert D.result_type(_operand(b), _operand(a))[0] == D.canonicalize(expected)


def test_promotion_is_associative_over_all_dtypes():
    nodes = [(d, False) for d in D.ALL_DTYPES] + [(D.int32, True), (D.float32, True)]
    for a in nodes:
        for b in nodes:
            for c in nodes:
                left = D.result_type(D.result_type(a, b), c)
                right = D.result_type(a, D.result_type(b, c))
                assert left[0] == right[0], (a, b, c)


def test_weak_only_operands_stay_weak():
    assert D.result_type((D.int32, True), (D.float32, True)) == (D.float32, True)
    assert D.result_type((D.int32, True), (D.int8, False)) == (D.int8, False)


@pytest.mark.parametrize("spec,expected", [("float32", D.float32), (np.int8, D.int8), (float, D.float32),
                                           (int, D.int32), (bool, D.bool_), ("bfloat16", D.bfloat16),
                                           (np.dtype("uint32"), D.uint32)])
def test_canonicalize_accepts_dtype_likes(spec, expected):
    assert D.canonicalize(spec) == expected


@pytest.mark.parametrize("bad", [np.clongdouble, np.longdouble, object, "U4", "not-a-dtype"])
def test_canonicalize_rejects_unsupported(bad):
    with pytest.raises(TypeError, match="funcgrad"):
        D.canonicalize(bad)


def test_array_results_follow_promotion_with_weak_scalars():
    h = fnp.ones(3, dtype="float16")
    assert (h * 2.0).dtype == D.float16
    assert (h * 2).dtype == D.float16
    assert (fnp.ones(3, dtype="uint8") + 1).dtype == D.uint8
    assert (fnp.ones(3, dtype="int32") + 1.5).dtype == D.float32
    assert (fnp.ones(3, dtype="int8") + fnp.ones(3, dtype="uint8")).dtype == D.int16
    assert (fnp.ones(3, dtype="bfloat16") + fnp.ones(3, dtype="float16")).dtype == D.float32


def test_python_int_too_large_for_the_array_dtype_raises():
    with pytest.raises(OverflowError, match="300 does not fit in uint8"):
        fnp.ones(3, dtype="uint8") + 300


def test_no_silent_float64():
    assert fnp.asarray(np.ones(3)).dtype == D.float32
    assert fnp.asarray([1.5, 2.5]).dtype == D.float32
    assert fnp.asarray(np.arange(3)).dtype == D.int32
    assert (fnp.asarray([1.0]) * np.float64(2.0)).dtype == D.float32
    assert fnp.asarray(np.ones(2), dtype="float64").dtype == D.float64  # asked for explicitly


def test_finfo_and_iinfo():
    assert float(D.finfo("bfloat16").eps) == 2.0 ** -7
    assert D.iinfo("int8").min == -128
