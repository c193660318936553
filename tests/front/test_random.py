"""Tests of funcgrad.random: the Threefry hash, keys, and every sampler's distribution.

Statistical checks use 10**5 samples and 5-sigma (or p > 1e-4) bounds, so a correct sampler fails
them with negligible probability while a wrong one (bad range, scale, or bias) fails reliably.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import scipy.special
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
import funcgrad.random as fr
from funcgrad.core.tensor import bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from tests.conftest import assert_device_matches_reference, check_both_modes

N = 100_000
KEY = fr.key(1234)

# --- the hash ----------------------------------------------------------------------------------

# Random123's published known-answer vectors for Threefry-2x32 with 20 rounds
KNOWN_ANSWERS = [
    ((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6B200159, 0x99BA4EFE)),
    ((0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 0xFFFFFFFF), (0x1CB996FC, 0xBB002BE7)),
    ((0x13198A2E, 0x03707344), (0x243F6A88, 0x85A308D3), (0xC4923A9C, 0x483DF7A0)),
]


@pytest.mark.parametrize("key_words, counter, expected", KNOWN_ANSWERS)
def test_threefry_reference_matches_random123_vectors(key_words, counter, expected):
    out = P.threefry2x32_numpy(*(np.uint32(v) for v in key_words + counter))
    assert tuple(int(v) for v in out) == expected


def test_threefry_primitive_matches_vectors_eager_and_traced():
    k0, k1, x0, x1 = (np.array([kat[i][j] for kat in KNOWN_ANSWERS], np.uint32)
                      for i, j in ((0, 0), (0, 1), (1, 0), (1, 1)))
    fn = lambda *words: bind(P.threefry2x32_p, *(fnp.asarray(w) for w in words))
    eager, traced = check_both_modes(fn, k0, k1, x0, x1)
    expected = np.array([kat[2] for kat in KNOWN_ANSWERS], np.uint32).T
    np.testing.assert_array_equal(np.stack(eager), expected)
    np.testing.assert_array_equal(np.stack(traced), expected)


# --- keys --------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed, words", [(0, [0, 0]), (42, [0, 42]), (-1, [2**32 - 1, 2**32 - 1]),
                                         (2**40 + 5, [256, 5]), (2**64 - 1, [2**32 - 1, 2**32 - 1])])
def test_key_holds_the_seeds_high_and_low_words(seed, words):
    k = fr.key(seed)
    assert k.dtype == np.uint32 and k.shape == (2,)
    assert k.tolist() == words
    assert fr.PRNGKey(seed).tolist() == words


@pytest.mark.parametrize("seed, dtype", [(7, "int32"), (-5, "int32"), (-3, "int8"), (2**33 + 1, "int64"),
                                         (2**32 - 1, "uint32")])
def test_key_from_an_array_seed_matches_the_python_seed(seed, dtype):
    eager, traced = check_both_modes(fr.key, fg.Tensor(np.asarray(seed, dtype), dtype=dtype))
    np.testing.assert_array_equal(eager, fr.key(seed).numpy())
    np.testing.assert_array_equal(traced, fr.key(seed).numpy())


def test_key_rejects_bad_seeds():
    with pytest.raises(TypeError, match="integer"):
        fr.key(1.5)
    with pytest.raises(TypeError, match="integer"):
        fr.key(True)
    with pytest.raises(TypeError, match=r"shape \(2,\)"):
        fr.key(np.array([1, 2]))
    with pytest.raises(ValueError, match="64 bits"):
        fr.key(2**64)


def test_split_and_samples_match_jax_with_classic_threefry():
    # values printed by jax.random (jax_threefry_partitionable=False, JAX's default before 0.5)
    with fg.config.override(threefry_partitionable=False):
        np.testing.assert_array_equal(fr.split(fr.key(0)).numpy(),
                                      [[4146024105, 967050713], [2718843009, 1272950319]])
        np.testing.assert_allclose(fr.uniform(fr.key(0)).item(), 0.41845703, rtol=1e-7)
        np.testing.assert_allclose(fr.normal(fr.key(0)).item(), -0.20584226, rtol=1e-6)
        expected = [-0.3721109, 0.26423115, -0.18252768, -0.7368197, -0.44030377, -0.1521442,
                    -0.67135346, -0.5908641, 0.73168886, 0.5673026]
        np.testing.assert_allclose(fr.normal(fr.key(0), (10,)).numpy(), expected, rtol=2e-6, atol=1e-7)


def test_split_and_samples_match_jax_with_its_default_partitionable_threefry():
    # values printed by jax.random 0.10.2 with its default config (jax_threefry_partitionable=True)
    assert fg.config.threefry_partitionable
    np.testing.assert_array_equal(fr.split(fr.key(0)).numpy(),
                                  [[1797259609, 2579123966], [928981903, 3453687069]])
    np.testing.assert_allclose(fr.uniform(fr.key(0)).item(), 0.9476670026779175, rtol=1e-7)
    np.testing.assert_allclose(fr.normal(fr.key(0)).item(), 1.622642159461975, rtol=1e-6)
    expected = [1.622642159461975, 2.0252647399902344, -0.4335944354534149, -0.07861734926700592,
                0.17609089612960815, -0.9720892310142517, -0.49529874324798584, 0.49437859654426575,
                0.6643493175506592, -0.9501634836196899]
    np.testing.assert_allclose(fr.normal(fr.key(0), (10,)).numpy(), expected, rtol=2e-6, atol=1e-7)


def test_split_gives_distinct_keys_of_the_requested_shape():
    keys = fr.split(KEY, 5).numpy()
    assert keys.shape == (5, 2) and keys.dtype == np.uint32
    assert len({tuple(k) for k in keys}) == 5
    assert tuple(KEY.tolist()) not in {tuple(k) for k in keys}
    assert fr.split(KEY, (2, 3)).shape == (2, 3, 2)
    np.testing.assert_array_equal(fr.split(KEY, (2, 3)).numpy().reshape(6, 2), fr.split(KEY, 6).numpy())
    assert fr.split(KEY, 0).shape == (0, 2)


def test_split_unpacks_into_keys():
    first, second = fr.split(KEY)
    assert first.shape == (2,) and first.dtype == np.uint32
    assert fr.uniform(first).item() != fr.uniform(second).item()


def test_split_of_a_batch_of_keys_splits_each():
    batch = fr.split(KEY, 3)
    out = fr.split(batch, 4).numpy()
    assert out.shape == (3, 4, 2)
    for i in range(3):
        np.testing.assert_array_equal(out[i], fr.split(batch.numpy()[i], 4).numpy())


def test_split_traced_equals_eager():
    eager, traced = check_both_modes(lambda k: fr.split(k, 3), KEY)
    np.testing.assert_array_equal(eager, traced)


def test_fold_in_differs_by_data_and_is_deterministic():
    folded = [tuple(fr.fold_in(KEY, i).tolist()) for i in range(20)]
    assert len(set(folded)) == 20
    assert tuple(KEY.tolist()) not in folded
    assert fr.fold_in(KEY, 3).tolist() == list(folded[3])
    assert fr.fold_in(KEY, -1).tolist() == fr.fold_in(KEY, 2**32 - 1).tolist()
    eager, traced = check_both_modes(fr.fold_in, KEY, np.int32(3))
    np.testing.assert_array_equal(eager, folded[3])
    np.testing.assert_array_equal(traced, folded[3])
    batch = fr.split(KEY, 3)
    np.testing.assert_array_equal(fr.fold_in(batch, 5).numpy()[1], fr.fold_in(batch.numpy()[1], 5).numpy())


@pytest.mark.parametrize("fn", [
    lambda k: fr.uniform(k, (3,)), lambda k: fr.normal(k), lambda k: fr.split(k),
    lambda k: fr.fold_in(k, 1), lambda k: fr.bits(k, (2,)), lambda k: fr.permutation(k, 4),
    lambda k: fr.categorical(k, fnp.zeros(3)),
], ids=["uniform", "normal", "split", "fold_in", "bits", "permutation", "categorical"])
def test_functions_reject_bad_keys(fn):
    with pytest.raises(TypeError, match="PRNG key"):
        fn(fnp.asarray([1, 2]))  # int32, not uint32
    with pytest.raises(TypeError, match=r"PRNG key.*shape \(3,\)"):
        fn(fnp.asarray(np.array([1, 2, 3], np.uint32)))
    with pytest.raises(TypeError, match="PRNG key.*got int"):
        fn(0)


def test_samplers_reject_batched_keys_with_the_shape():
    with pytest.raises(TypeError, match=r"shape \(3, 2\)"):
        fr.uniform(fr.split(KEY, 3), (2,))


def test_shape_may_be_an_int_or_a_tuple_and_is_checked():
    np.testing.assert_array_equal(fr.uniform(KEY, 4).numpy(), fr.uniform(KEY, (4,)).numpy())
    assert fr.normal(KEY, [2, 3]).shape == (2, 3)
    with pytest.raises(TypeError, match="shape must be an int or a tuple"):
        fr.uniform(KEY, (2.5,))
    with pytest.raises(ValueError, match="negative"):
        fr.uniform(KEY, (-1,))


# --- bits --------------------------------------------------------------------------------------


def test_bits_narrow_and_wide_dtypes_repack_the_32_bit_words_in_the_classic_layout():
    with fg.config.override(threefry_partitionable=False):
        words = fr.bits(KEY, (6,)).numpy()
        assert words.dtype == np.uint32
        np.testing.assert_array_equal(fr.bits(KEY, (24,), "uint8").numpy(), words.view(np.uint8))
        np.testing.assert_array_equal(fr.bits(KEY, (12,), "uint16").numpy(), words.view(np.uint16))
        wide = fr.bits(KEY, (3,), "uint64").numpy()
        np.testing.assert_array_equal(wide, (words[:3].astype(np.uint64) << 32) | words[3:])


def test_bits_hash_each_elements_flat_index_in_the_partitionable_layout():
    k0, k1 = KEY.numpy()
    first, second = P.threefry2x32_numpy(k0, k1, np.zeros(12, np.uint32), np.arange(12, dtype=np.uint32))
    np.testing.assert_array_equal(fr.bits(KEY, (3, 4)).numpy(), (first ^ second).reshape(3, 4))
    np.testing.assert_array_equal(fr.bits(KEY, (12,), "uint8").numpy(), (first ^ second).astype(np.uint8))
    np.testing.assert_array_equal(fr.bits(KEY, (12,), "uint16").numpy(), (first ^ second).astype(np.uint16))
    wide = fr.bits(KEY, (12,), "uint64").numpy()
    np.testing.assert_array_equal(wide, (first.astype(np.uint64) << 32) | second)
    np.testing.assert_array_equal(fr.split(KEY, 12).numpy(), np.stack([first, second], axis=1))
    assert fr.bits(KEY, (2, 5), "uint8").shape == (2, 5)
    with pytest.raises(TypeError, match="uint8, uint16, uint32, uint64"):
        fr.bits(KEY, (2,), "int32")


def test_bits_are_uniform_over_bytes():
    counts = np.bincount(fr.bits(KEY, (N,), "uint8").numpy(), minlength=256)
    assert scipy.stats.chisquare(counts).pvalue > 1e-4


# --- uniform -----------------------------------------------------------------------------------


def _assert_mean_within(samples, mean, std, sigmas=5.0):
    bound = sigmas * std / np.sqrt(samples.size)
    assert abs(samples.astype(np.float64).mean() - mean) < bound, (samples.mean(), mean, bound)


def test_uniform_range_moments_and_distribution():
    x = fr.uniform(KEY, (N,)).numpy()
    assert x.dtype == np.float32 and x.min() >= 0.0 and x.max() < 1.0
    _assert_mean_within(x, 0.5, np.sqrt(1 / 12))
    # the variance of a sample variance of U(0,1) is (1/80 - 1/144) / N
    assert abs(x.var() - 1 / 12) < 5 * np.sqrt((1 / 80 - 1 / 144) / N)
    assert scipy.stats.kstest(x, "uniform").pvalue > 1e-4


def test_uniform_scaled_to_minval_maxval():
    x = fr.uniform(KEY, (N,), minval=-3.0, maxval=5.0).numpy()
    assert x.min() >= -3.0 and x.max() < 5.0
    _assert_mean_within(x, 1.0, 8 / np.sqrt(12))
    assert scipy.stats.kstest(x, "uniform", args=(-3.0, 8.0)).pvalue > 1e-4


def test_uniform_stays_below_maxval_when_rounding_would_reach_it():
    # 1 - 2**-24 scaled to [1, 1 + 2**-20) rounds up to the top in float32 without the clamp
    x = fr.uniform(KEY, (N,), minval=1.0, maxval=1.0 + 2**-20).numpy()
    assert x.max() < np.float32(1.0 + 2**-20) and x.min() >= 1.0
    upper = fnp.asarray(np.float32(1.0 + 2**-20))
    y = fr.uniform(KEY, (N,), minval=fnp.asarray(np.float32(1.0)), maxval=upper).numpy()
    assert y.max() < np.float32(1.0 + 2**-20)


def test_uniform_array_bounds_broadcast_against_shape():
    low = np.array([0.0, 10.0, 100.0], np.float32)
    x = fr.uniform(KEY, (1000, 3), minval=low, maxval=low + 1).numpy()
    assert x.shape == (1000, 3)
    assert np.all((x >= low) & (x < low + 1))
    with pytest.raises(ValueError, match=r"shape \(4,\).*broadcast"):
        fr.uniform(KEY, (4,), minval=low)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_uniform_dtypes(dtype):
    x = fr.uniform(KEY, (N,), dtype=dtype).numpy()
    assert x.dtype == dtypes.canonicalize(dtype)
    wide = x.astype(np.float64)
    assert wide.min() >= 0.0 and wide.max() < 1.0
    # the mantissa trick gives the 2**nmant values k / 2**nmant, whose mean is (1 - 2**-nmant) / 2
    levels = 2 ** dtypes.finfo(x.dtype).nmant
    _assert_mean_within(wide, (1 - 1 / levels) / 2, np.sqrt(1 / 12))
    assert len(np.unique(wide)) == min(levels, len(np.unique(wide))) > min(levels // 2, 1000)


def test_uniform_rejects_integer_dtypes():
    with pytest.raises(TypeError, match="floating dtype.*int32"):
        fr.uniform(KEY, (2,), dtype="int32")


@settings(max_examples=30, deadline=None)
@given(shape=st.lists(st.integers(0, 4), max_size=3), seed=st.integers(-2**63, 2**64 - 1),
       low=st.floats(-100, 100), width=st.floats(0.01, 100))
def test_uniform_property_shape_range_and_determinism(shape, seed, low, width):
    k = fr.key(seed)
    x = fr.uniform(k, tuple(shape), minval=low, maxval=low + width)
    values = x.numpy()
    assert values.shape == tuple(shape) and values.dtype == np.float32
    assert np.all(values >= np.float32(low)) and np.all(values < np.float32(low + width))
    np.testing.assert_array_equal(values, fr.uniform(k, tuple(shape), minval=low, maxval=low + width).numpy())


# --- determinism, eager and traced -------------------------------------------------------------

SAMPLERS = {
    "uniform": lambda k: fr.uniform(k, (5,), minval=-2.0, maxval=3.0),
    "normal": lambda k: fr.normal(k, (2, 3)),
    "truncated_normal": lambda k: fr.truncated_normal(k, -1.0, 2.0, (4,)),
    "bernoulli": lambda k: fr.bernoulli(k, 0.3, (6,)),
    "randint": lambda k: fr.randint(k, (6,), -5, 17),
    "bits": lambda k: fr.bits(k, (5,), "uint8"),
    "permutation": lambda k: fr.permutation(k, 7),
    "permutation_rows": lambda k: fr.permutation(k, fnp.arange(12).reshape(4, 3), axis=1),
    "choice": lambda k: fr.choice(k, 10, (3,), replace=False),
    "choice_p": lambda k: fr.choice(k, 4, (5,), p=fnp.asarray([0.1, 0.2, 0.3, 0.4])),
    "categorical": lambda k: fr.categorical(k, fnp.asarray([[0.0, 1.0, 2.0], [2.0, 1.0, 0.0]])),
    "gumbel": lambda k: fr.gumbel(k, (3,)),
    "exponential": lambda k: fr.exponential(k, (3,)),
    "laplace": lambda k: fr.laplace(k, (3,)),
    "fold_in_then_normal": lambda k: fr.normal(fr.fold_in(k, 2), (2,)),
}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_same_key_same_values_eager_and_traced(name):
    fn = SAMPLERS[name]
    eager, traced = check_both_modes(fn, KEY)
    if name == "gumbel":  # -log(t) near t = 1 turns log's last-place difference into many ulps near 0
        np.testing.assert_allclose(eager, traced, rtol=1e-6, atol=1e-6)
    else:
        assert_device_matches_reference(eager, traced)
    np.testing.assert_array_equal(fn(KEY).numpy(), eager)
    other = fn(fr.key(99)).numpy()
    if name not in ("bernoulli",):  # six coin flips may coincide; everything else is continuous or long
        assert not np.array_equal(other, eager)


def test_traced_key_appears_as_an_input_of_the_ir():
    ir = fg.make_ir(lambda k: fr.uniform(k, (3,)))(KEY)
    text = str(ir)
    assert "threefry2x32" in text and "bitcast_convert_type" in text and "u32[2]" in text


# --- normal and erfinv -------------------------------------------------------------------------


def test_erfinv_matches_scipy_in_float32():
    x = np.concatenate([np.linspace(-1, 1, 4001)[1:-1], 1 - np.logspace(-7, -1, 50),
                        -1 + np.logspace(-7, -1, 50)]).astype(np.float32)
    eager, traced = check_both_modes(fr.erfinv, x)
    expected = scipy.special.erfinv(x.astype(np.float64))
    np.testing.assert_allclose(eager, expected, rtol=1e-6, atol=1e-7)
    assert_device_matches_reference(eager, traced)
    assert eager.dtype == np.float32


def test_erfinv_float64_and_low_precision():
    x = np.concatenate([np.linspace(-1, 1, 2001)[1:-1], 1 - np.logspace(-10, -1, 30)])
    np.testing.assert_allclose(fr.erfinv(fnp.asarray(x, dtype="float64")).numpy(), scipy.special.erfinv(x),
                               rtol=1e-8, atol=1e-12)
    for dtype, rtol in (("float16", 2e-3), ("bfloat16", 1e-2)):
        low = np.linspace(-0.99, 0.99, 101).astype(dtype)
        out = fr.erfinv(fnp.asarray(low)).numpy()
        assert out.dtype == dtypes.canonicalize(dtype)
        np.testing.assert_allclose(out.astype(np.float64), scipy.special.erfinv(low.astype(np.float64)),
                                   rtol=rtol, atol=rtol)


def test_erfinv_endpoints_and_outside():
    out = fr.erfinv(fnp.asarray([1.0, -1.0, 1.5, 0.0])).numpy()
    assert out[0] == np.inf and out[1] == -np.inf and np.isnan(out[2]) and out[3] == 0.0


def test_normal_moments_and_kolmogorov_smirnov():
    x = fr.normal(KEY, (N,)).numpy()
    assert x.dtype == np.float32 and np.all(np.isfinite(x))
    _assert_mean_within(x, 0.0, 1.0)
    assert abs(x.std() - 1.0) < 5 * np.sqrt(0.5 / N)
    assert scipy.stats.kstest(x, "norm").pvalue > 1e-4


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float64"])
def test_normal_dtypes(dtype):
    x = fr.normal(KEY, (N,), dtype=dtype).numpy()
    assert x.dtype == dtypes.canonicalize(dtype)
    wide = x.astype(np.float64)
    assert np.all(np.isfinite(wide))
    # bfloat16 draws from 128 uniform levels (as JAX), so its moments are only roughly right
    tolerance = 0.05 if dtype == "bfloat16" else 5 / np.sqrt(N)
    assert abs(wide.mean()) < tolerance and abs(wide.std() - 1.0) < max(tolerance, 0.01)


def test_truncated_normal_within_bounds_and_distribution():
    x = fr.truncated_normal(KEY, -1.0, 2.0, (N,)).numpy()
    assert x.dtype == np.float32 and x.min() > -1.0 and x.max() < 2.0
    assert scipy.stats.kstest(x, "truncnorm", args=(-1.0, 2.0)).pvalue > 1e-4


def test_truncated_normal_bounds_broadcast_and_default_shape():
    lower = np.array([-3.0, 0.0, 1.0], np.float32)
    x = fr.truncated_normal(KEY, lower, lower + 0.5).numpy()
    assert x.shape == (3,)
    y = fr.truncated_normal(KEY, lower, lower + 0.5, (1000, 3)).numpy()
    assert np.all((y > lower) & (y < lower + 0.5))
    z = fr.truncated_normal(KEY, -np.inf, 0.0, (1000,), dtype="bfloat16").numpy()
    assert z.dtype == dtypes.bfloat16 and np.all(z.astype(np.float32) < 0)


# --- discrete ----------------------------------------------------------------------------------


def test_bernoulli_frequency():
    x = fr.bernoulli(KEY, 0.3, (N,)).numpy()
    assert x.dtype == np.bool_
    _assert_mean_within(x, 0.3, np.sqrt(0.3 * 0.7))


def test_bernoulli_array_p_and_extremes():
    p = fnp.asarray([0.0, 1.0, 0.5])
    x = fr.bernoulli(KEY, p).numpy()
    assert x.shape == (3,) and not x[0] and x[1]
    many = fr.bernoulli(KEY, p, (N, 3)).numpy()
    assert not many[:, 0].any() and many[:, 1].all()
    _assert_mean_within(many[:, 2], 0.5, 0.5)
    with pytest.raises(TypeError, match="floating"):
        fr.bernoulli(KEY, fnp.asarray([1, 0]))


def test_randint_range_and_uniformity():
    x = fr.randint(KEY, (N,), -3, 7).numpy()
    assert x.dtype == np.int32 and x.min() == -3 and x.max() == 6
    assert scipy.stats.chisquare(np.bincount(x + 3)).pvalue > 1e-4


@pytest.mark.parametrize("dtype, low, high", [("int8", -128, 127), ("uint8", 0, 256), ("int16", -5, 1000),
                                              ("uint32", 0, 2**32), ("int64", -10, 10)])
def test_randint_dtypes_and_bounds_beyond_the_dtype(dtype, low, high):
    x = fr.randint(KEY, (20_000,), low, high, dtype=dtype).numpy()
    assert x.dtype == dtypes.canonicalize(dtype)
    info = np.iinfo(dtype)
    assert x.min() >= max(low, info.min) and x.max() <= min(high - 1, info.max)
    if high - low <= 256:  # small spans: every value shows up
        assert len(np.unique(x)) == min(high, info.max + 1) - low


def test_randint_empty_range_gives_minval_and_array_bounds():
    assert set(fr.randint(KEY, (100,), 5, 5).tolist()) == {5}
    assert set(fr.randint(KEY, (100,), 5, 2).tolist()) == {5}
    low = fnp.asarray([0, 100])
    x = fr.randint(KEY, (1000, 2), low, low + 3).numpy()
    assert set(x[:, 0].tolist()) == {0, 1, 2} and set(x[:, 1].tolist()) == {100, 101, 102}
    with pytest.raises(TypeError, match="integer dtype"):
        fr.randint(KEY, (2,), 0, 3, dtype="float32")


def test_permutation_of_an_int_is_a_permutation():
    perms = [fr.permutation(fr.key(s), 50).numpy() for s in range(3)]
    for perm in perms:
        assert perm.dtype == np.int32
        np.testing.assert_array_equal(np.sort(perm), np.arange(50))
    assert not np.array_equal(perms[0], perms[1])
    assert not np.array_equal(perms[0], np.arange(50))


def test_permutation_of_rows_keeps_rows_together():
    x = np.arange(20).reshape(5, 4)
    out = fr.permutation(KEY, x).numpy()
    assert sorted(map(tuple, out)) == sorted(map(tuple, x))
    cols = fr.permutation(KEY, x, axis=1).numpy()
    np.testing.assert_array_equal(cols, x[:, cols[0]])
    independent = fr.permutation(KEY, np.tile(np.arange(30), (6, 1)), axis=1, independent=True).numpy()
    np.testing.assert_array_equal(np.sort(independent, axis=1), np.tile(np.arange(30), (6, 1)))
    assert len({tuple(row) for row in independent}) == 6


def test_permutation_uses_two_sort_rounds_for_long_arrays_and_stays_a_permutation():
    perm = fr.permutation(KEY, 3000).numpy()
    np.testing.assert_array_equal(np.sort(perm), np.arange(3000))


def test_permutation_is_uniform_over_small_permutations():
    firsts = np.array([fr.permutation(fr.key(s), 3).numpy()[0] for s in range(600)])
    assert scipy.stats.chisquare(np.bincount(firsts, minlength=3)).pvalue > 1e-4


def test_permutation_of_a_traced_int_needs_a_concrete_value():
    with pytest.raises(fg.ConcretizationError):
        fg.make_ir(lambda k, n: fr.permutation(k, n))(KEY, fnp.asarray(3))


def test_choice_with_and_without_replacement():
    x = fr.choice(KEY, 5, (N,)).numpy()
    assert x.min() == 0 and x.max() == 4
    assert scipy.stats.chisquare(np.bincount(x)).pvalue > 1e-4
    distinct = fr.choice(KEY, 10, (2, 3), replace=False).numpy()
    assert distinct.shape == (2, 3) and len(set(distinct.ravel().tolist())) == 6
    rows = np.arange(12).reshape(4, 3)
    picked = fr.choice(KEY, rows, (2,), replace=False).numpy()
    assert picked.shape == (2, 3) and all(tuple(r) in set(map(tuple, rows)) for r in picked)
    cols = fr.choice(KEY, rows, (5,), axis=1).numpy()
    assert cols.shape == (4, 5) and np.all(cols % 3 == cols[0] % 3)
    with pytest.raises(ValueError, match="without replacement"):
        fr.choice(KEY, 3, (4,), replace=False)


def test_choice_with_probabilities():
    p = np.array([0.1, 0.0, 0.6, 0.3], np.float32)
    x = fr.choice(KEY, 4, (N,), p=p).numpy()
    counts = np.bincount(x, minlength=4)
    assert counts[1] == 0
    expected = N * p[[0, 2, 3]].astype(np.float64) / p.astype(np.float64).sum()
    assert scipy.stats.chisquare(counts[[0, 2, 3]], expected).pvalue > 1e-4
    no_repeat = fr.choice(KEY, 4, (3,), replace=False, p=p).numpy()
    assert sorted(no_repeat.tolist()) == [0, 2, 3]
    with pytest.raises(ValueError, match=r"p must have shape \(4,\)"):
        fr.choice(KEY, 4, (2,), p=np.ones(3) / 3)


def test_categorical_frequencies_match_softmax():
    logits = np.array([0.0, 1.0, -1.0, 2.0], np.float32)
    x = fr.categorical(KEY, logits, shape=(N,)).numpy()
    assert x.dtype == np.int32 and x.shape == (N,)
    expected = scipy.special.softmax(logits.astype(np.float64)) * N
    assert scipy.stats.chisquare(np.bincount(x, minlength=4), expected).pvalue > 1e-4


def test_categorical_batches_and_axis():
    logits = np.array([[10.0, -10.0, -10.0], [-10.0, -10.0, 10.0]], np.float32)
    np.testing.assert_array_equal(fr.categorical(KEY, logits).numpy(), [0, 2])
    np.testing.assert_array_equal(fr.categorical(KEY, logits.T, axis=0).numpy(), [0, 2])
    many = fr.categorical(KEY, logits, shape=(7, 2)).numpy()
    assert many.shape == (7, 2) and np.all(many == [0, 2])
    with pytest.raises(ValueError, match="broadcast"):
        fr.categorical(KEY, logits, shape=(3,))


@pytest.mark.parametrize("name, dist", [("gumbel", "gumbel_r"), ("exponential", "expon"),
                                        ("laplace", "laplace")])
def test_continuous_distributions_kolmogorov_smirnov(name, dist):
    x = getattr(fr, name)(KEY, (N,)).numpy()
    assert x.dtype == np.float32 and np.all(np.isfinite(x))
    assert scipy.stats.kstest(x, dist).pvalue > 1e-4


# --- stateful Tensor API -----------------------------------------------------------------------


def test_manual_seed_makes_tensor_rand_reproducible():
    fg.Tensor.manual_seed(3)
    a, b = fg.Tensor.rand(2, 3).numpy(), fg.Tensor.randn(4).numpy()
    fg.Tensor.manual_seed(3)
    np.testing.assert_array_equal(fg.Tensor.rand(2, 3).numpy(), a)
    np.testing.assert_array_equal(fg.Tensor.randn((4,)).numpy(), b)
    assert a.shape == (2, 3) and a.dtype == np.float32 and np.all((a >= 0) & (a < 1))
    assert not np.array_equal(fg.Tensor.rand(2, 3).numpy(), a)  # the global key advanced


def test_next_key_is_the_second_half_of_a_split_of_the_global_key():
    fr.manual_seed(11)
    state = fr.key(11)
    for _ in range(3):
        state, expected = fr.split(state)
        np.testing.assert_array_equal(fr.next_key().numpy(), expected.numpy())


def test_next_key_is_thread_safe():
    fr.manual_seed(0)
    keys: list[tuple[int, ...]] = []
    def draw() -> None:
        for _ in range(50):
            keys.append(tuple(fr.next_key().tolist()))
    threads = [threading.Thread(target=draw) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 200


def test_stateful_kinds():
    fr.manual_seed(5)
    ints = fg.Tensor.randint(1000, low=2, high=5).numpy()
    assert ints.dtype == np.int32 and set(ints.tolist()) == {2, 3, 4}
    u = fg.Tensor.uniform(1000, low=-2.0, high=-1.0).numpy()
    assert np.all((u >= -2) & (u < -1))
    half = fg.Tensor.rand(10, dtype="float16").numpy()
    assert half.dtype == np.float16
    kaiming = fg.Tensor.kaiming_uniform(64, 3, 3).numpy()
    bound = np.sqrt(3.0) * np.sqrt(2.0 / (1 + 0.01**2)) / np.sqrt(9)
    assert np.abs(kaiming).max() <= bound and np.abs(kaiming).max() > 0.9 * bound
    glorot = fg.Tensor.glorot_uniform(20, 30).numpy()
    bound = np.sqrt(6 / 50)
    assert np.abs(glorot).max() <= bound and np.abs(glorot).max() > 0.9 * bound
    with pytest.raises(ValueError, match="unknown random kind"):
        fr.stateful("poisson", (2,))
    with pytest.raises(TypeError, match="unexpected keyword"):
        fr.stateful("rand", (2,), low=1)


def test_tensor_rand_inside_a_trace_uses_a_constant_key():
    fr.manual_seed(8)
    ir = fg.make_ir(lambda x: x + fg.Tensor.rand(3))(fnp.zeros(3))
    assert "threefry2x32" in str(ir)


def test_jit_traces_again_when_the_threefry_layout_changes():
    """The layout flag is part of a jitted function's cache key (JAX's trace context): a function traced
    under one layout gives the other layout's bits after ``config.update``, on the fast path too."""
    key = fg.random.PRNGKey(3)
    sample = fg.jit(lambda k: fg.random.bits(k, (6,)))
    layouts = {}
    try:
        for flag in (True, False, True, False):
            fg.config.update("threefry_partitionable", flag)
            bits = np.asarray(sample(key))
            expected = np.asarray(fg.random.bits(key, (6,)))  # eager: traced fresh under the flag
            np.testing.assert_array_equal(bits, expected)
            layouts.setdefault(flag, bits)
            np.testing.assert_array_equal(bits, layouts[flag])
    finally:
        fg.config.update("threefry_partitionable", None)
    assert (layouts[True] != layouts[False]).any()


def test_the_trace_context_follows_every_trace_option(monkeypatch):
    """Each of config.TRACE_OPTIONS, set either way (update, or its environment variable), changes the
    context that jit keys its traces by."""
    from funcgrad.util.config import OPTIONS, TRACE_OPTIONS, config
    base = config.trace_context()
    for name in TRACE_OPTIONS:
        with config.override(**{name: not getattr(config, name)}):
            assert config.trace_context() != base, name
        monkeypatch.setenv(OPTIONS[name][0], "0")
        assert config.trace_context() != base, name
        monkeypatch.delenv(OPTIONS[name][0])
        assert config.trace_context() == base
