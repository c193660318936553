"""The Array API standard's namespace and array-object surface that its test suite
(``../shared/array-api-tests``) checks: inspection (``__array_namespace_info__``), ``can_cast``,
``finfo``/``iinfo``, the array methods, list results, and IEEE special cases
(each a regression test for a failure of that suite)."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp

INF = np.inf


def test_namespace_info_describes_devices_and_dtypes():
    assert fnp.__array_api_version__ == "2024.12"  # the suite reads the version from here
    info = fnp.__array_namespace_info__()
    capabilities = info.capabilities()
    assert capabilities["boolean indexing"] is True and capabilities["max dimensions"] is None
    assert info.default_device() in info.devices()
    defaults = info.default_dtypes(device=info.default_device())
    assert (defaults["real floating"], defaults["integral"], defaults["indexing"]) == (fnp.float32, fnp.int32,
                                                                                      fnp.int32)
    assert set(info.dtypes(kind="signed integer")) == {"int8", "int16", "int32", "int64"}
    assert set(info.dtypes(kind=("bool", "real floating"))) == {"bool", "float32", "float64"}
    assert info.dtypes()["uint8"] == fnp.uint8
    with pytest.raises(ValueError, match="unknown kind 'float'"):
        info.dtypes(kind="float")


def test_can_cast_follows_numpy_safe_casting():
    names = ["bool", "int8", "uint8", "int32", "uint32", "float32", "float64"]
    for source in names:
        for target in names + ["int16", "int64", "uint16"]:
            expected = np.can_cast(source, target)
            assert fnp.can_cast(np.dtype(source), target) == expected, (source, target)
            array = fg.Tensor(np.zeros(1, source), dtype=source)
            assert fnp.can_cast(array, np.dtype(target)) == expected, (source, target)


def test_finfo_and_iinfo_give_python_numbers():
    for dtype in (fnp.float32, fnp.float64, fnp.asarray(1.0), fnp.asarray(1.0).dtype):
        facts = fnp.finfo(dtype)
        expected = np.finfo(facts.dtype)
        for field in ("eps", "max", "min", "smallest_normal"):
            assert type(getattr(facts, field)) is float
            assert getattr(facts, field) == float(getattr(expected, field))
        assert type(facts.bits) is int and facts.dtype == np.float32 if dtype is not fnp.float64 else True
    info = fnp.iinfo(fnp.asarray([1], dtype="int8"))
    assert (type(info.max), info.max, info.min, info.bits) == (int, 127, -128, 8)


def test_array_object_methods_of_the_standard():
    x = fnp.asarray([1.0, 2.0]) * 2
    assert x.__array_namespace__() is fnp
    assert x.to_device(x.device).tolist() == [2.0, 4.0]
    assert complex(fnp.asarray(2.5)) == 2.5 + 0j


def test_meshgrid_broadcast_arrays_and_devices_return_lists():  # the standard 2024.12's type, and JAX's
    grids = fnp.meshgrid(fnp.arange(2), fnp.arange(3))
    assert type(grids) is list and [g.shape for g in grids] == [(3, 2), (3, 2)]
    out = fnp.broadcast_arrays(fnp.ones((2, 1)), fnp.ones(3))
    assert type(out) is list and [o.shape for o in out] == [(2, 3), (2, 3)]
    assert type(fnp.__array_namespace_info__().devices()) is list


# (x1, x2, the standard's result) for floor_divide with an infinite operand: floor(x1 / x2) in IEEE
# arithmetic (CPython and NumPy give NaN for inf // 2 and -1.0 for 1 // -inf)
FLOOR_DIVIDE_SPECIAL = [(INF, 2.0, INF), (INF, -2.0, -INF), (-INF, 2.0, -INF), (-INF, -2.0, INF),
                        (1.0, -INF, -0.0), (-1.0, INF, -0.0), (1.0, INF, 0.0), (-1.0, -INF, 0.0),
                        (INF, INF, np.nan), (7.0, 2.0, 3.0), (-7.0, 2.0, -4.0), (1.0, 0.1, 9.0)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_floor_divide_special_cases_follow_the_standard(dtype):
    x1, x2, expected = (np.array(column, dtype) for column in zip(*FLOOR_DIVIDE_SPECIAL))
    for got in (fnp.floor_divide(x1, x2).numpy(), (fnp.asarray(x1) // fnp.asarray(x2)).numpy()):
        np.testing.assert_array_equal(got, expected)
        signed = ~np.isnan(expected)
        np.testing.assert_array_equal(np.signbit(got)[signed], np.signbit(expected)[signed])


def test_nextafter_between_signed_zeros_returns_x2():
    got = fnp.nextafter(fnp.asarray([0.0, -0.0]), fnp.asarray([-0.0, 0.0])).numpy()
    np.testing.assert_array_equal(np.signbit(got), [True, False])
