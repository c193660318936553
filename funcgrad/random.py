"""Counter-based random numbers: Threefry-2x32 keys, as in ``jax.random``.

A key is a uint32 array of shape (2,) made by ``key(seed)``. Nothing here is stateful: every
sampler is a pure function of the key it is given, so the same key gives the same values eagerly
and inside ``make_ir``, and a traced key works like any other traced array. New keys come from
``split`` and ``fold_in``; reusing a key reuses its randomness.

Data flow: ``bits`` and ``split`` hash counters with the key through the ``threefry2x32``
primitive, in one of JAX's two layouts (``fg.config.threefry_partitionable``, on by default as in
JAX): ``_hash_shape(key, shape)`` hashes each element's flat index (the partitionable layout: one
hash per element, 32 bits = the xor of its two words), ``_hash_counters(key, n)`` the counters
0..n-1 split in two halves that form the two words of each block (the classic layout). ``uniform``
turns bits into floats with the mantissa trick; the other samplers transform uniforms (``normal``
by the inverse error function, ``gumbel`` and ``exponential`` by logarithms) or sort by random
words (``permutation``). The constructions are JAX's, so results are jax.random's bit for bit
under the same layout (tests/front/test_random_kernels.py). Under jit and eagerly alike the hash is
kernel arithmetic fused with its consumer (``lower/schedule.py: _threefry``).

The stateful convenience behind ``Tensor.rand``/``randn``/``manual_seed`` (``manual_seed``,
``next_key``, ``stateful``) keeps one global key on the host and splits it under a lock.

>>> import funcgrad.random as fr
>>> k1, k2 = fr.split(fr.key(0))
>>> fr.uniform(k1, (2, 3)).shape
(2, 3)
"""

from __future__ import annotations

import math
import operator
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

import funcgrad.numpy as fnp
from funcgrad.core.tensor import Tensor, bind
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.numpy.conversion import normalize_axis
from funcgrad.util.config import config

__all__ = ["PRNGKey", "bernoulli", "bits", "categorical", "choice", "erfinv", "exponential", "fold_in",
           "gumbel", "key", "laplace", "manual_seed", "next_key", "normal", "permutation", "randint",
           "split", "stateful", "truncated_normal", "uniform"]

Shape = int | Sequence[int]
ArrayLike = Any

_UNSIGNED = {8: dtypes.uint8, 16: dtypes.uint16, 32: dtypes.uint32, 64: dtypes.uint64}
_SIGNED = {16: dtypes.int16, 32: dtypes.int32, 64: dtypes.int64}

# --- argument checking -------------------------------------------------------------------------


# threefry2x32 hashes uint32 counters 0..count-1, two per 64-bit value: so at most 2**31 values a draw
_MAX_DRAW = 2**31


def _shape(shape: Shape, name: str) -> tuple[int, ...]:
    """``shape`` as a tuple of non-negative ints; an int means a 1-D shape."""
    dims = (shape,) if isinstance(shape, (int, np.integer)) else shape
    try:
        result = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise TypeError(f"{name}: shape must be an int or a tuple of ints, got {shape!r}") from None
    if any(d < 0 for d in result):
        raise ValueError(f"{name}: shape {result} has a negative dimension")
    size = math.prod(result)
    if size > _MAX_DRAW:
        raise ValueError(f"{name}: shape {result} has {size} elements, more than the {_MAX_DRAW} one draw can make "
                         f"(threefry's counters are 32-bit); split the key and draw in parts")
    return result


def _check_key(key: Any, name: str, batched: bool = False) -> Tensor:
    """``key`` as a Tensor, after checking it is a uint32 array of shape (2,) (or (..., 2))."""
    expected = "a uint32 array of shape (2,)" + (" or a batch of them, shape (..., 2)" if batched else "")
    if isinstance(key, np.ndarray):
        key = Tensor(key) if key.dtype == np.uint32 else key
    if not isinstance(key, Tensor):
        raise TypeError(f"{name} expects a PRNG key ({expected}, made by fg.random.key(seed)), "
                        f"got {type(key).__name__}")
    good_shape = key.ndim >= 1 and key.shape[-1] == 2 if batched else key.shape == (2,)
    if key.dtype != dtypes.uint32 or not good_shape:
        raise TypeError(f"{name} expects a PRNG key ({expected}, made by fg.random.key(seed)), got an "
                        f"array of dtype {key.dtype.name} and shape {key.shape}")
    return key


def _float_dtype(dtype: Any, name: str) -> np.dtype:
    dtype = dtypes.canonicalize(dtype)
    if not dtypes.is_float(dtype):
        raise TypeError(f"{name} needs a floating dtype, got {dtype.name}")
    return dtype


def _param(value: ArrayLike, dtype: np.dtype) -> Any:
    """A distribution parameter in ``dtype``: an inline literal for scalars, else a Tensor."""
    if isinstance(value, (bool, int, float, np.generic)):
        return np.asarray(value).astype(dtype)[()]
    return fnp.astype(fnp.asarray(value), dtype)


def _check_param_shapes(name: str, shape: tuple[int, ...], *params: Any) -> None:
    param_shapes = [np.shape(p) if not isinstance(p, Tensor) else p.shape for p in params]
    try:
        ok = fnp.broadcast_shapes(shape, *param_shapes) == shape
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{name}: shape {shape} must be broadcast-compatible with (and at least as large "
                         f"as) the parameter shapes {', '.join(str(s) for s in param_shapes)}")


def _broadcast_param_shape(*params: Any) -> tuple[int, ...]:
    return fnp.broadcast_shapes(*(p.shape if isinstance(p, Tensor) else np.shape(p) for p in params))


# --- the hash: keys and bits -------------------------------------------------------------------


def _iota(size: int, dtype: np.dtype = dtypes.uint32) -> Tensor:
    return bind(P.iota_p, dtype=dtype, shape=(size,), dimension=0)


def _take_last(x: Tensor, start: int, stop: int) -> Tensor:
    """``x[..., start:stop]`` via the slice primitive (no dependence on Tensor indexing)."""
    begin = (0,) * (x.ndim - 1) + (start,)
    return bind(P.slice_p, x, start=begin, limit=x.shape[:-1] + (stop,), strides=(1,) * x.ndim)


def _key_words(key: Tensor) -> tuple[Tensor, Tensor]:
    batch = key.shape[:-1]
    first, second = (bind(P.reshape_p, _take_last(key, i, i + 1), new_sizes=batch) for i in range(2))
    return first, second


def _stack_words(first: Tensor, second: Tensor) -> Tensor:
    """Two uint32 arrays of one shape S -> one array of shape S + (2,)."""
    pair = [bind(P.reshape_p, w, new_sizes=w.shape + (1,)) for w in (first, second)]
    return bind(P.concatenate_p, *pair, axis=first.ndim)


def _key_row(keys: Tensor, i: int) -> Tensor:
    """Row ``i`` of a (num, 2) array of keys made by ``split``."""
    row = bind(P.slice_p, keys, start=(i, 0), limit=(i + 1, 2), strides=(1, 1))
    return bind(P.reshape_p, row, new_sizes=(2,))


def _hash_counters(key: Tensor, count: int) -> Tensor:
    """threefry2x32 of the counters 0..count-1 under ``key`` (shape (..., 2)) -> uint32 (..., count).

    As JAX's ``threefry_2x32``: counter i < half is the first word of block i, counter half + i its
    second word; an odd count pads the last block's second word with 0 and drops its last output.
    """
    batch = key.shape[:-1]
    if count == 0:
        return bind(P.broadcast_in_dim_p, np.uint32(0), shape=batch + (0,), broadcast_dimensions=())
    half = (count + 1) // 2
    first = _iota(half)
    second = bind(P.add_p, _iota(count - half), np.uint32(half))
    if 2 * half != count:
        second = bind(P.pad_p, second, np.uint32(0), low=(0,), high=(1,))
    k0, k1 = _key_words(key)
    if batch:
        full = batch + (half,)
        k0, k1 = (bind(P.broadcast_in_dim_p, k, shape=full, broadcast_dimensions=tuple(range(len(batch))))
                  for k in (k0, k1))
        first, second = (bind(P.broadcast_in_dim_p, x, shape=full, broadcast_dimensions=(len(batch),))
                         for x in (first, second))
    out0, out1 = bind(P.threefry2x32_p, k0, k1, first, second)
    words = bind(P.concatenate_p, out0, out1, axis=len(batch))
    return _take_last(words, 0, count) if 2 * half != count else words


def _partitionable() -> bool:
    return bool(config.threefry_partitionable)


def _hash_shape(key: Tensor, shape: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """JAX's partitionable layout: threefry2x32 under ``key`` (shape (..., 2)) of each element's flat
    index in ``shape`` as the counter (high word, low word) -> two uint32 arrays of shape (...,) + shape.
    One hash per element, computed where it is used (the counters are an iota of the kernel's index)."""
    batch = key.shape[:-1]
    size = math.prod(shape)
    if size > 2**32:
        wide = bind(P.iota_p, dtype=dtypes.uint64, shape=(size,), dimension=0)
        high: Any = fnp.astype(bind(P.shift_right_p, wide, np.uint64(32)), dtypes.uint32)
        low = fnp.astype(wide, dtypes.uint32)
        high, low = (bind(P.reshape_p, w, new_sizes=shape) for w in (high, low))
    else:
        high = np.uint32(0)
        low = _iota(size) if len(shape) == 1 else bind(P.reshape_p, _iota(size), new_sizes=shape)
    k0, k1 = _key_words(key)
    if batch:
        full = batch + shape
        k0, k1 = (bind(P.broadcast_in_dim_p, k, shape=full, broadcast_dimensions=tuple(range(len(batch))))
                  for k in (k0, k1))
        low = bind(P.broadcast_in_dim_p, low, shape=full, broadcast_dimensions=tuple(range(len(batch), len(full))))
        if isinstance(high, Tensor):
            high = bind(P.broadcast_in_dim_p, high, shape=full,
                        broadcast_dimensions=tuple(range(len(batch), len(full))))
    first, second = bind(P.threefry2x32_p, k0, k1, high, low)
    return first, second


def key(seed: int | ArrayLike) -> Tensor:
    """A PRNG key (uint32 array of shape (2,)) from an integer seed: its high and low 32 bits.

    Seeds are read as 64-bit two's complement, so negative seeds and seeds above 2**32 give
    distinct keys, as in JAX with 64-bit ints. A traced integer scalar works too.
    >>> key(42).tolist()
    [0, 42]
    """
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError("key: the seed must be an integer, got a bool")
    if isinstance(seed, (int, np.integer)):
        seed = int(seed)
        if not -2**63 <= seed < 2**64:
            raise ValueError(f"key: seed {seed} does not fit in 64 bits")
        bits64 = seed & (2**64 - 1)
        return Tensor(np.array([bits64 >> 32, bits64 & 0xFFFFFFFF], np.uint32))
    seed = fnp.asarray(seed)
    if seed.ndim != 0 or not dtypes.is_int(seed.dtype):
        raise TypeError(f"key: the seed must be an integer scalar, got an array of dtype {seed.dtype.name} "
                        f"and shape {seed.shape}")
    width = seed.dtype.itemsize * 8
    if width == 64:  # arithmetic shift for int64, logical for uint64
        high = fnp.astype(bind(P.shift_right_p, seed, seed.dtype.type(32)), dtypes.uint32)
    elif not dtypes.is_unsigned(seed.dtype):  # sign extension: all ones for a negative seed
        high = fnp.astype(bind(P.shift_right_p, seed, seed.dtype.type(width - 1)), dtypes.uint32)
    else:
        high = fnp.zeros((), dtype=dtypes.uint32)
    return _stack_words(high, fnp.astype(seed, dtypes.uint32))


PRNGKey = key


def split(key: ArrayLike, num: Shape = 2) -> Tensor:
    """``num`` new keys from ``key``, as an array of shape (num, 2) that unpacks into keys.

    ``num`` may be a shape; a batch of keys of shape (..., 2) gives shape (..., num, 2).
    >>> k1, k2 = split(key(0))
    """
    key = _check_key(key, "split", batched=True)
    shape = _shape(num, "split")
    if _partitionable():  # JAX's "foldlike" split: key i is the pair of words hashed from counter i
        return _stack_words(*_hash_shape(key, shape))
    words = _hash_counters(key, 2 * math.prod(shape))
    return bind(P.reshape_p, words, new_sizes=key.shape[:-1] + shape + (2,))


def fold_in(key: ArrayLike, data: int | ArrayLike) -> Tensor:
    """A new key from ``key`` and an integer (e.g. a step or layer number), as JAX's ``fold_in``.

    >>> fold_in(key(0), 1).shape
    (2,)
    """
    key = _check_key(key, "fold_in", batched=True)
    if isinstance(data, (bool, np.bool_)):
        raise TypeError("fold_in: data must be an integer, got a bool")
    if isinstance(data, (int, np.integer)):
        if not -2**31 <= int(data) < 2**32:
            raise ValueError(f"fold_in: data {int(data)} does not fit in 32 bits")
        word: Any = np.uint32(int(data) & 0xFFFFFFFF)
    else:
        word = fnp.asarray(data)
        if word.ndim != 0 or not dtypes.is_int(word.dtype):
            raise TypeError(f"fold_in: data must be an integer scalar, got an array of dtype "
                            f"{word.dtype.name} and shape {word.shape}")
        word = fnp.astype(word, dtypes.uint32)
    k0, k1 = _key_words(key)
    # JAX hashes the counters (high word, low word) of the uint32 datum: (0, data)
    out0, out1 = bind(P.threefry2x32_p, k0, k1, np.uint32(0), word)
    return _stack_words(out0, out1)


def bits(key: ArrayLike, shape: Shape = (), dtype: Any = dtypes.uint32) -> Tensor:
    """Uniformly random unsigned integers (uint8, uint16, uint32 or uint64) of ``shape``.

    8- and 16-bit values are packed from 32-bit words (low bits first) and 64-bit values join two
    words, as JAX does.
    >>> bits(key(0), (3,)).dtype
    dtype('uint32')
    """
    key = _check_key(key, "bits")
    shape = _shape(shape, "bits")
    dtype = dtypes.canonicalize(dtype)
    if dtype not in _UNSIGNED.values():
        raise TypeError(f"bits: dtype must be one of uint8, uint16, uint32, uint64, got {dtype.name}")
    size = math.prod(shape)
    width = dtype.itemsize * 8
    if _partitionable():  # one hash per element: 64 bits are its two words, fewer their xor (truncated)
        first, second = _hash_shape(key, shape)
        if width == 64:
            high, low = (fnp.astype(w, dtype) for w in (first, second))
            return bind(P.or_p, bind(P.shift_left_p, high, np.uint64(32)), low)
        mixed = bind(P.xor_p, first, second)
        return mixed if width == 32 else fnp.astype(mixed, dtype)
    if width == 64:
        words = _hash_counters(key, 2 * size)
        high, low = (fnp.astype(_take_last(words, i * size, (i + 1) * size), dtype) for i in range(2))
        out = bind(P.or_p, bind(P.shift_left_p, high, np.uint64(32)), low)
    elif width == 32:
        out = _hash_counters(key, size)
    else:
        per_word = 32 // width
        num_words = -(-size * width // 32)
        words = bind(P.broadcast_in_dim_p, _hash_counters(key, num_words), shape=(num_words, per_word),
                     broadcast_dimensions=(0,))
        offsets = bind(P.mul_p, bind(P.iota_p, dtype=dtypes.uint32, shape=(num_words, per_word), dimension=1),
                       np.uint32(width))
        pieces = bind(P.and_p, bind(P.shift_right_p, words, offsets), np.uint32(2**width - 1))
        flat = bind(P.reshape_p, pieces, new_sizes=(num_words * per_word,))
        out = fnp.astype(_take_last(flat, 0, size), dtype)
    return out if out.shape == shape else bind(P.reshape_p, out, new_sizes=shape)


# --- floats --------------------------------------------------------------------------------


def _unit_floats(key: Tensor, shape: tuple[int, ...], dtype: np.dtype) -> Tensor:
    """Floats in [0, 1): random mantissa bits under the exponent of 1.0, minus 1.0 (JAX's trick).
    Dtypes with fewer than 8 mantissa bits (bfloat16) draw 8-bit words, as JAX does."""
    width, mantissa = dtype.itemsize * 8, dtypes.finfo(dtype).nmant
    word_bits = 8 if mantissa < 8 else width
    unsigned = _UNSIGNED[width]
    raw = fnp.astype(bits(key, shape, _UNSIGNED[word_bits]), unsigned)
    one = np.asarray(1.0, dtype).view(unsigned)[()]
    float_bits = bind(P.or_p, bind(P.shift_right_p, raw, unsigned.type(word_bits - mantissa)), one)
    return bind(P.sub_p, bind(P.bitcast_convert_type_p, float_bits, new_dtype=dtype), dtype.type(1.0))


def _adjacent_float(value: Any, upward: bool) -> Any:
    """The next float after ``value`` toward +inf (``upward``) or -inf, in its own dtype."""
    if not isinstance(value, Tensor):
        return np.nextafter(value, value.dtype.type(np.inf if upward else -np.inf))
    dtype = value.dtype
    as_int = bind(P.bitcast_convert_type_p, value, new_dtype=_SIGNED[dtype.itemsize * 8])
    away_from_zero = fnp.greater(value, 0) if upward else fnp.less(value, 0)
    # the bit patterns of floats of one sign are ordered by magnitude
    stepped = fnp.where(away_from_zero, fnp.add(as_int, 1), fnp.subtract(as_int, 1))
    tiny = dtype.type(dtypes.finfo(dtype).smallest_subnormal * (1 if upward else -1))
    result = fnp.where(fnp.equal(value, 0), tiny, bind(P.bitcast_convert_type_p, stepped, new_dtype=dtype))
    return fnp.where(fnp.isnan(value), value, result)


def uniform(key: ArrayLike, shape: Shape = (), dtype: Any = dtypes.float32, minval: ArrayLike = 0.0,
            maxval: ArrayLike = 1.0) -> Tensor:
    """Floats drawn uniformly from [minval, maxval) (parameters broadcast against ``shape``).

    >>> x = uniform(key(0), (1000,), minval=-1.0, maxval=1.0)
    >>> bool((x >= -1).all() and (x < 1).all())
    True
    """
    key = _check_key(key, "uniform")
    shape = _shape(shape, "uniform")
    dtype = _float_dtype(dtype, "uniform")
    low, high = _param(minval, dtype), _param(maxval, dtype)
    _check_param_shapes("uniform", shape, low, high)
    scaled = fnp.add(fnp.multiply(_unit_floats(key, shape, dtype), fnp.subtract(high, low)), low)
    # rounding of the scaling can reach maxval; keep the interval half-open (JAX only clamps below)
    return fnp.maximum(low, fnp.minimum(scaled, _adjacent_float(high, upward=False)))


# Giles, "Approximating the erfinv function" (GPU Computing Gems, 2011), single precision: the
# polynomials in w - 2.5 (central, w < 5) and sqrt(w) - 3 (tails), w = -log(1 - x**2). XLA uses them.
_ERFINV_CENTRAL = (2.81022636e-08, 3.43273939e-07, -3.5233877e-06, -4.39150654e-06, 0.00021858087,
                   -0.00125372503, -0.00417768164, 0.246640727, 1.50140941)
_ERFINV_TAIL = (-0.000200214257, 0.000100950558, 0.00134934322, -0.00367342844, 0.00573950773,
                -0.0076224613, 0.00943887047, 1.00167406, 2.83297682)


def _horner(coefficients: Sequence[float], w: Tensor) -> Tensor:
    result = fnp.add(fnp.multiply(w, coefficients[0]), coefficients[1])
    for c in coefficients[2:]:
        result = fnp.add(fnp.multiply(result, w), c)
    return result


def erfinv(x: ArrayLike) -> Tensor:
    """The inverse error function: erf(erfinv(x)) == x for x in (-1, 1); +-inf at +-1, NaN outside.

    float32 uses Giles' single-precision approximation (relative error ~1e-7); float16/bfloat16
    compute in float32; float64 refines that with two Newton steps on erf.
    >>> round(float(erfinv(0.5)), 6)
    0.476936
    """
    x = fnp.asarray(x)
    if not dtypes.is_float(x.dtype):
        x = fnp.astype(x, dtypes.default_float)
    if x.dtype in dtypes.LOW_PRECISION:
        return fnp.astype(erfinv(fnp.astype(x, dtypes.float32)), x.dtype)
    w = fnp.negative(fnp.log(fnp.multiply(fnp.subtract(1.0, x), fnp.add(1.0, x))))
    central = _horner(_ERFINV_CENTRAL, fnp.subtract(fnp.minimum(w, 5.0), 2.5))
    tail = _horner(_ERFINV_TAIL, fnp.subtract(fnp.sqrt(fnp.maximum(w, 5.0)), 3.0))
    result = fnp.multiply(fnp.where(fnp.less(w, 5.0), central, tail), x)
    if x.dtype == dtypes.float64:
        for _ in range(2):  # Newton on erf(y) = x; erf' = 2/sqrt(pi) exp(-y^2)
            slope = fnp.multiply(2 / math.sqrt(math.pi), fnp.exp(fnp.negative(fnp.multiply(result, result))))
            refined = fnp.subtract(result, fnp.divide(fnp.subtract(fnp.erf(result), x), slope))
            result = fnp.where(fnp.isfinite(refined), refined, result)
    return fnp.where(fnp.equal(fnp.abs(x), 1.0), fnp.multiply(x, np.inf), result)


def _sqrt2_erfinv(u: Tensor) -> Tensor:
    return fnp.multiply(erfinv(u), math.sqrt(2))


def normal(key: ArrayLike, shape: Shape = (), dtype: Any = dtypes.float32) -> Tensor:
    """Standard normal samples: sqrt(2) * erfinv(u) for u uniform in (-1, 1), as JAX does.

    >>> normal(key(0), (2, 2)).dtype
    dtype('float32')
    """
    key = _check_key(key, "normal")
    dtype = _float_dtype(dtype, "normal")
    shape = _shape(shape, "normal")
    low = np.nextafter(np.asarray(-1.0, dtype), np.asarray(0.0, dtype))
    return _sqrt2_erfinv(uniform(key, shape, dtype, low, 1.0))


def truncated_normal(key: ArrayLike, lower: ArrayLike, upper: ArrayLike, shape: Shape | None = None,
                     dtype: Any = dtypes.float32) -> Tensor:
    """Standard normal samples conditioned on lower < x < upper (bounds broadcast with ``shape``).

    >>> x = truncated_normal(key(0), -1.0, 2.0, (100,))
    >>> bool((x > -1).all() and (x < 2).all())
    True
    """
    key = _check_key(key, "truncated_normal")
    dtype = _float_dtype(dtype, "truncated_normal")
    low, high = _param(lower, dtype), _param(upper, dtype)
    if shape is None:
        shape = _broadcast_param_shape(low, high)
    shape = _shape(shape, "truncated_normal")
    _check_param_shapes("truncated_normal", shape, low, high)
    erf_low = fnp.erf(fnp.divide(low, math.sqrt(2)))
    erf_high = fnp.erf(fnp.divide(high, math.sqrt(2)))
    samples = _sqrt2_erfinv(uniform(key, shape, dtype, erf_low, erf_high))
    # rounding (or u == erf_low exactly) could land on a bound: keep the interval open
    above = _adjacent_float(low, upward=True)
    below = _adjacent_float(high, upward=False)
    return fnp.minimum(fnp.maximum(samples, above), below)


def bernoulli(key: ArrayLike, p: ArrayLike = 0.5, shape: Shape | None = None) -> Tensor:
    """Booleans that are True with probability ``p`` (which broadcasts against ``shape``).

    >>> bernoulli(key(0), 0.3, (4,)).dtype
    dtype('bool')
    """
    key = _check_key(key, "bernoulli")
    if isinstance(p, (float, int)) and not isinstance(p, bool):
        prob: Any = np.float32(p)
    else:
        prob = fnp.asarray(p)
        if not dtypes.is_float(prob.dtype):
            raise TypeError(f"bernoulli: the probability p must be floating, got dtype {prob.dtype.name}")
    shape = _shape(np.shape(prob) if shape is None else shape, "bernoulli")
    _check_param_shapes("bernoulli", shape, prob)
    return fnp.less(uniform(key, shape, prob.dtype), prob)


def gumbel(key: ArrayLike, shape: Shape = (), dtype: Any = dtypes.float32) -> Tensor:
    """Standard Gumbel samples: -log(-log(u)) with u uniform in [tiny, 1)."""
    key = _check_key(key, "gumbel")
    dtype = _float_dtype(dtype, "gumbel")
    u = uniform(key, shape, dtype, float(dtypes.finfo(dtype).tiny), 1.0)
    return fnp.negative(fnp.log(fnp.negative(fnp.log(u))))


def exponential(key: ArrayLike, shape: Shape = (), dtype: Any = dtypes.float32) -> Tensor:
    """Standard exponential samples (rate 1): -log1p(-u) with u uniform in [0, 1)."""
    key = _check_key(key, "exponential")
    u = uniform(key, shape, _float_dtype(dtype, "exponential"))
    return fnp.negative(fnp.log1p(fnp.negative(u)))


def laplace(key: ArrayLike, shape: Shape = (), dtype: Any = dtypes.float32) -> Tensor:
    """Standard Laplace samples (density exp(-|x|) / 2)."""
    key = _check_key(key, "laplace")
    dtype = _float_dtype(dtype, "laplace")
    u = uniform(key, shape, dtype, -1.0 + float(dtypes.finfo(dtype).epsneg), 1.0)
    return fnp.multiply(fnp.sign(u), fnp.log1p(fnp.negative(fnp.abs(u))))


# --- integers and discrete choices -------------------------------------------------------------


def _integer_bound(value: ArrayLike, dtype: np.dtype, name: str) -> tuple[Any, Any]:
    """``value`` clipped into ``dtype``'s range and cast, and whether it lay above that range."""
    info = np.iinfo(dtype)
    if isinstance(value, (bool, int, float, np.generic)) and not isinstance(value, np.bool_):
        number = int(value)
        return dtype.type(min(max(number, info.min), info.max)), number > info.max
    tensor = fnp.asarray(value)
    if dtypes.is_bool(tensor.dtype) or not dtypes.is_int(tensor.dtype):
        if not dtypes.is_float(tensor.dtype):
            raise TypeError(f"{name}: bounds must be integers, got dtype {tensor.dtype.name}")
        tensor = fnp.astype(tensor, dtypes.default_int)
    source = np.iinfo(tensor.dtype)
    if source.min >= info.min and source.max <= info.max:
        return fnp.astype(tensor, dtype), np.bool_(False)
    low, high = max(source.min, info.min), min(source.max, info.max)
    clipped = fnp.clip(tensor, tensor.dtype.type(low), tensor.dtype.type(high))
    return fnp.astype(clipped, dtype), fnp.greater(tensor, tensor.dtype.type(high))


def randint(key: ArrayLike, shape: Shape, minval: ArrayLike, maxval: ArrayLike,
            dtype: Any = dtypes.int32) -> Tensor:
    """Integers drawn uniformly from [minval, maxval) (bounds clipped to ``dtype``'s range).

    As JAX: two random words per value, reduced modulo the span, so the bias is tiny for small
    spans; spans above 2**16 (2**32 for 64-bit dtypes) wrap in the modular product and are only
    roughly uniform. maxval <= minval gives minval.
    >>> x = randint(key(0), (1000,), 3, 7)
    >>> sorted(set(x.tolist()))
    [3, 4, 5, 6]
    """
    key = _check_key(key, "randint")
    shape = _shape(shape, "randint")
    dtype = dtypes.canonicalize(dtype)
    if not dtypes.is_int(dtype):
        raise TypeError(f"randint needs an integer dtype, got {dtype.name}")
    low, _ = _integer_bound(minval, dtype, "randint")
    high, high_out_of_range = _integer_bound(maxval, dtype, "randint")
    _check_param_shapes("randint", shape, low, high)
    width = dtype.itemsize * 8
    word_dtype = _UNSIGNED[max(width, 32)]
    keys = split(key)
    higher, lower = bits(_key_row(keys, 0), shape, word_dtype), bits(_key_row(keys, 1), shape, word_dtype)
    # the span in the unsigned type of the dtype's width, then widened to the word type
    span = fnp.astype(fnp.astype(fnp.subtract(high, low), _UNSIGNED[width]), word_dtype)
    span = fnp.where(fnp.less_equal(high, low), word_dtype.type(1), span)
    # maxval above the dtype's range means "up to and including the largest value"
    span = fnp.where(fnp.logical_and(high_out_of_range, fnp.greater(high, low)), fnp.add(span, 1), span)
    # (higher * 2**w + lower) % span, with 2**w % span computed as (2**(w/2) % span)**2 % span
    multiplier = fnp.remainder(word_dtype.type(2 ** (word_dtype.itemsize * 4)), span)
    multiplier = fnp.remainder(fnp.multiply(multiplier, multiplier), span)
    offset = fnp.add(fnp.multiply(fnp.remainder(higher, span), multiplier), fnp.remainder(lower, span))
    offset = fnp.remainder(offset, span)
    return fnp.add(low, fnp.astype(offset, dtype))


def _sort_rounds(size: int) -> int:
    """How many sorts by 32-bit random keys make ties negligible (JAX's analysis: exponent 3)."""
    return math.ceil(3 * math.log(max(1, size)) / math.log(2**32 - 1))


def _shuffle(key: Tensor, x: Tensor, axis: int, independent: bool) -> Tensor:
    """Sort ``x`` along ``axis`` by random words: one permutation for every slice, or (when
    ``independent``) one per slice."""
    length = x.shape[axis]
    for _ in range(_sort_rounds(x.size if independent else length)):
        keys = split(key)
        key, subkey = _key_row(keys, 0), _key_row(keys, 1)
        if independent:
            sort_keys = bits(subkey, x.shape)
        else:
            sort_keys = bind(P.broadcast_in_dim_p, bits(subkey, (length,)), shape=x.shape,
                             broadcast_dimensions=(axis,))
        _, x = bind(P.sort_p, sort_keys, x, dimension=axis, num_keys=1, descending=False)
    return x


def permutation(key: ArrayLike, x: int | ArrayLike, axis: int = 0, independent: bool = False) -> Tensor:
    """A random permutation of ``range(x)`` (int ``x``) or of ``x``'s entries along ``axis``.

    ``independent=True`` permutes every slice along ``axis`` separately.
    >>> sorted(permutation(key(0), 5).tolist())
    [0, 1, 2, 3, 4]
    """
    key = _check_key(key, "permutation")
    if isinstance(x, (int, np.integer)) or (isinstance(x, Tensor) and x.ndim == 0):
        count = operator.index(x)  # a traced scalar raises a ConcretizationError here
        if count < 0:
            raise ValueError(f"permutation: x must be a non-negative int or an array, got {count}")
        return _shuffle(key, _iota(count, dtypes.default_int), 0, independent=False)
    array = fnp.asarray(x)
    if array.ndim == 0:
        if not dtypes.is_int(array.dtype):
            raise TypeError(f"permutation: x must be a non-negative int or an array, got {x!r}")
        return permutation(key, operator.index(np.asarray(x)))
    return _shuffle(key, array, normalize_axis(axis, array.ndim), independent)


def _take(array: Tensor, indices: Tensor, axis: int) -> Tensor:
    """``take(array, indices, axis)``: the index dims replace ``axis``, via the gather primitive."""
    index_dims = indices.ndim
    gathered = bind(P.gather_p, array, bind(P.reshape_p, indices, new_sizes=indices.shape + (1,)),
                    axes=(axis,))
    order = ([index_dims + i for i in range(axis)] + list(range(index_dims))
             + [index_dims + i for i in range(axis, array.ndim - 1)])
    return bind(P.transpose_p, gathered, permutation=tuple(order))


def _take_leading(x: Tensor, count: int, axis: int) -> Tensor:
    limit = tuple(count if i == axis else d for i, d in enumerate(x.shape))
    return bind(P.slice_p, x, start=(0,) * x.ndim, limit=limit, strides=(1,) * x.ndim)


def choice(key: ArrayLike, a: int | ArrayLike, shape: Shape = (), replace: bool = True,
           p: ArrayLike | None = None, axis: int = 0) -> Tensor:
    """Random draws from ``range(a)`` (int ``a``) or from ``a``'s entries along ``axis``.

    ``p`` gives the probabilities of the entries (default: uniform). Without replacement the draws
    are distinct (Gumbel top-k when ``p`` is given).
    >>> sorted(choice(key(0), 5, (5,), replace=False).tolist())
    [0, 1, 2, 3, 4]
    """
    key = _check_key(key, "choice")
    shape = _shape(shape, "choice")
    if isinstance(a, (int, np.integer)) or (isinstance(a, Tensor) and a.ndim == 0):
        array, count = None, operator.index(a)
    else:
        array = fnp.asarray(a)
        if array.ndim == 0:
            raise ValueError("choice: a must be an int or an array of rank >= 1")
        axis = normalize_axis(axis, array.ndim)
        count = array.shape[axis]
    draws = math.prod(shape)
    if array is None:
        out_shape = shape
    else:
        out_shape = array.shape[:axis] + shape + array.shape[axis + 1:]
    if draws == 0:
        return fnp.zeros(out_shape, dtype=dtypes.default_int if array is None else array.dtype)
    if count <= 0:
        raise ValueError(f"choice: a must have at least one entry to draw from, got {count}")
    if not replace and draws > count:
        raise ValueError(f"choice: cannot take {draws} samples of shape {shape} from {count} entries "
                         "without replacement")
    if p is None and not replace:
        source = _iota(count, dtypes.default_int) if array is None else array
        chosen = _take_leading(permutation(key, source, 0 if array is None else axis), draws,
                               0 if array is None else axis)
        return bind(P.reshape_p, chosen, new_sizes=out_shape)
    if p is None:
        indices = randint(key, shape, 0, count)
    else:
        probs = fnp.asarray(p)
        if not dtypes.is_float(probs.dtype):
            probs = fnp.astype(probs, dtypes.default_float)
        if probs.shape != (count,):
            raise ValueError(f"choice: p must have shape ({count},) to match a, got {probs.shape}")
        if replace:
            cumulative = fnp.cumsum(probs)
            total = bind(P.reshape_p, _take_last(cumulative, count - 1, count), new_sizes=())
            targets = fnp.multiply(total, fnp.subtract(1.0, uniform(key, shape, probs.dtype)))
            # searchsorted (left) as a count: how many cumulative sums lie below each target
            below = fnp.less(cumulative, fnp.expand_dims(targets, axis=-1))
            indices = fnp.minimum(fnp.sum(fnp.astype(below, dtypes.default_int), axis=-1), count - 1)
        else:
            scores = fnp.add(gumbel(key, (count,), probs.dtype), fnp.log(probs))
            _, order = bind(P.sort_p, scores, _iota(count, dtypes.default_int), dimension=0, num_keys=1,
                            descending=True)
            indices = bind(P.reshape_p, _take_last(order, 0, draws), new_sizes=shape)
    return indices if array is None else _take(array, indices, axis)


def categorical(key: ArrayLike, logits: ArrayLike, axis: int = -1, shape: Shape | None = None) -> Tensor:
    """Category indices drawn with probabilities softmax(logits) along ``axis`` (the Gumbel-max
    trick). ``shape`` defaults to the batch shape (logits' shape without ``axis``); a longer
    ``shape`` draws more samples per batch entry.
    >>> categorical(key(0), fnp.asarray([0.0, 1.0, 2.0]), shape=(4,)).shape
    (4,)
    """
    key = _check_key(key, "categorical")
    logits = fnp.asarray(logits)
    if not dtypes.is_float(logits.dtype):
        logits = fnp.astype(logits, dtypes.default_float)
    if logits.ndim == 0:
        raise ValueError("categorical: logits must have at least one axis")
    axis = normalize_axis(axis, logits.ndim)
    batch_shape = logits.shape[:axis] + logits.shape[axis + 1:]
    shape = batch_shape if shape is None else _shape(shape, "categorical")
    _check_param_shapes("categorical", shape, np.empty(batch_shape))
    prefix = shape[:len(shape) - len(batch_shape)]
    tail = shape[len(prefix):]
    noise_shape = prefix + tail[:axis] + (logits.shape[axis],) + tail[axis:]
    expanded = bind(P.reshape_p, logits, new_sizes=(1,) * len(prefix) + logits.shape)
    scores = fnp.add(gumbel(key, noise_shape, logits.dtype), expanded)
    return fnp.argmax(scores, axis=len(prefix) + axis)


# --- stateful convenience for the Tensor API ---------------------------------------------------

_state_lock = threading.Lock()
_global_key = np.zeros(2, np.uint32)  # key(0)


def _split_on_host(key_words: np.ndarray, num: int) -> np.ndarray:
    """``split`` in NumPy (either layout), so the global key never enters a trace or a lazy graph."""
    if _partitionable():
        first, second = P.threefry2x32_numpy(key_words[0], key_words[1], np.zeros(num, np.uint32),
                                             np.arange(num, dtype=np.uint32))
        return np.stack([first, second], axis=1)
    counters = np.arange(2 * num, dtype=np.uint32)
    first, second = P.threefry2x32_numpy(key_words[0], key_words[1], counters[:num], counters[num:])
    return np.concatenate([first, second]).reshape(num, 2)


def manual_seed(seed: int = 0) -> None:
    """Reset the global key behind ``Tensor.rand``/``randn``/... to ``key(seed)``."""
    global _global_key
    new_key = key(seed).numpy()
    with _state_lock:
        _global_key = new_key


_recorders = threading.local()  # per thread: a stack of lists collecting the keys next_key() hands out


def next_key() -> Tensor:
    """A fresh key from the global state (which advances): ``state, new = split(state)``.

    Inside ``jit`` the key becomes a constant of the trace; jit records it (``recording_keys``)
    and hands the compiled function a new key from the global state on every call, so
    ``Tensor.rand`` and dropout inside a jitted step draw new numbers each step, as eagerly."""
    global _global_key
    with _state_lock:
        keys = _split_on_host(_global_key, 2)
        _global_key = keys[0]
    drawn = Tensor(keys[1])
    stack = getattr(_recorders, "stack", None)
    if stack:
        stack[-1].append(drawn)
    return drawn


class recording_keys:  # noqa: N801 - used as a context manager, like a function
    """``with recording_keys() as drawn:`` collects the keys ``next_key()`` returns meanwhile."""

    def __enter__(self) -> list[Tensor]:
        self.drawn: list[Tensor] = []
        if not hasattr(_recorders, "stack"):
            _recorders.stack = []
        _recorders.stack.append(self.drawn)
        return self.drawn

    def __exit__(self, *exc: Any) -> None:
        _recorders.stack.pop()


def _pop_options(kind: str, options: dict[str, Any], defaults: dict[str, Any]) -> list[Any]:
    unknown = set(options) - set(defaults)
    if unknown:
        raise TypeError(f"{kind} got unexpected keyword arguments {sorted(unknown)}; "
                        f"it takes {sorted(defaults)}")
    return [options.get(name, default) for name, default in defaults.items()]


def stateful(kind: str, shape: Shape, dtype: Any = None, **kwargs: Any) -> Tensor:
    """Samples from the global key, for the Tensor constructors (``Tensor.rand(2, 3)`` etc.).

    kinds: 'rand' (uniform [0, 1)), 'randn' (standard normal), 'randint' (low=0, high=10),
    'uniform' (low=0.0, high=1.0), 'kaiming_uniform' (a=0.01) and 'glorot_uniform', the last two
    with tinygrad's fan conventions (fan_in = prod(shape[1:]), fan_out = shape[0]).
    >>> stateful("rand", (2, 3)).shape
    (2, 3)
    """
    shape = _shape(shape, kind)
    if kind == "randint":
        low, high = _pop_options(kind, kwargs, {"low": 0, "high": 10})
        return randint(next_key(), shape, low, high, dtypes.default_int if dtype is None else dtype)
    dtype = dtypes.default_float if dtype is None else dtype
    if kind == "rand":
        _pop_options(kind, kwargs, {})
        return uniform(next_key(), shape, dtype)
    if kind == "randn":
        _pop_options(kind, kwargs, {})
        return normal(next_key(), shape, dtype)
    if kind == "uniform":
        low, high = _pop_options(kind, kwargs, {"low": 0.0, "high": 1.0})
        return uniform(next_key(), shape, dtype, low, high)
    if kind in ("kaiming_uniform", "glorot_uniform"):
        if not shape:
            raise ValueError(f"{kind} needs a shape of rank >= 1, got {shape}")
        fan_in = math.prod(shape[1:])
        if kind == "kaiming_uniform":
            (a,) = _pop_options(kind, kwargs, {"a": 0.01})
            bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a**2)) / math.sqrt(fan_in)
        else:
            _pop_options(kind, kwargs, {})
            bound = math.sqrt(6 / (shape[0] + fan_in))
        return uniform(next_key(), shape, dtype, -bound, bound)
    raise ValueError(f"unknown random kind {kind!r}; expected one of 'rand', 'randn', 'randint', "
                     "'uniform', 'kaiming_uniform', 'glorot_uniform'")
