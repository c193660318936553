"""Random numbers as kernels: threefry2x32 fuses with what feeds and reads it (no host step), the
compiled bits equal the NumPy reference's, and both layouts equal jax.random's bit for bit (the
partitionable one by default, as JAX's default config; the classic one behind
``fg.config.update("threefry_partitionable", False)``)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
import funcgrad.random as fr
from funcgrad.devices import get_device
from funcgrad.ir import primitives as P
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower.plan import Plan
from funcgrad.lower.schedule import HostStep, KernelStep, schedule
from tests.lower.test_schedule import _opened

KEY = fr.key(1234)
SHAPES = [(), (5,), (3, 4), (2, 3, 5)]


def steps_of(fn, *args):
    return schedule(_opened(fg.make_ir(fn)(*args)))


def plan_and_reference(fn, *args, device):
    ir = fg.make_ir(fn)(*args)
    inputs = [np.asarray(a.numpy() if isinstance(a, fg.Tensor) else a) for a in args]
    consts = [c.numpy() for c in ir.consts]
    return Plan(_opened(ir), device).run(consts + inputs), eval_ir(ir, inputs, consts)


# --- kernels, not host steps ---------------------------------------------------------------------

@pytest.mark.parametrize("partitionable", [True, False])
@pytest.mark.parametrize("sampler", [
    lambda k: fr.bits(k, (6, 7)), lambda k: fr.uniform(k, (6, 7)), lambda k: fr.normal(k, (6, 7)),
    lambda k: fr.bernoulli(k, 0.3, (6, 7)), lambda k: fr.split(k, 5), lambda k: fr.fold_in(k, 3),
    lambda k: fr.bits(k, (9,), "uint8"), lambda k: fr.bits(k, (9,), "uint64"),
], ids=["bits", "uniform", "normal", "bernoulli", "split", "fold_in", "bits8", "bits64"])
def test_random_bits_are_one_kernel_with_no_host_step(sampler, partitionable):
    with fg.config.override(threefry_partitionable=partitionable):
        steps = steps_of(sampler, KEY)
    assert not any(isinstance(s, HostStep) for s in steps), [s.eqn.primitive.name for s in steps
                                                            if isinstance(s, HostStep)]
    assert len(steps) == 1


def test_dropout_is_one_kernel_with_its_mask_computed_where_it_is_used():
    x = np.random.default_rng(0).normal(size=(8, 16)).astype(np.float32)
    steps = steps_of(lambda k, x: fg.nn.functional.dropout(fnp.tanh(x) * 2.0, 0.25, key=k), KEY, x)
    assert len(steps) == 1 and isinstance(steps[0], KernelStep)
    (kernel,) = [s.kernel for s in steps]
    assert [a.shape for a in kernel.in_avals] == [(2,), (8, 16)]  # the key and x: no mask buffer


def test_a_split_key_feeding_samples_stays_in_the_samplers_kernel():
    steps = steps_of(lambda k: fr.normal(fr.split(k)[1], (4, 4)) + fr.uniform(fr.fold_in(k, 7), (4, 4)), KEY)
    assert len(steps) == 1 and isinstance(steps[0], KernelStep)


def test_random_product_operands_are_stored_not_rehashed_in_the_products_loop():
    w = np.ones((32, 8), np.float32)
    steps = steps_of(lambda k, w: fr.uniform(k, (16, 32)) @ w, KEY, w)
    assert [s.kernel.name for s in steps] == ["E_16_32", "r_sum_16_8"]
    assert [a.shape for a in steps[1].kernel.in_avals] == [(16, 32), (32, 8)]


def test_eager_rand_randn_and_samplers_realize_as_one_kernel_each():
    from funcgrad.lazy import graph_to_ir
    fg.Tensor.manual_seed(0)
    for x in (fg.Tensor.rand(64, 32), fg.Tensor.randn(64, 32), fr.normal(KEY, (64, 32))):
        ir, _ = graph_to_ir([x._data])
        steps = schedule(_opened(ir))
        assert len(steps) == 1 and isinstance(steps[0], KernelStep), steps
    values = x.numpy()
    assert values.shape == (64, 32) and abs(values.mean()) < 0.1 and 0.9 < values.std() < 1.1


# --- the kernel against the reference interpreter, per device -------------------------------------

@pytest.mark.parametrize("partitionable", [True, False])
def test_compiled_bits_equal_the_reference_on_each_device(device_name, partitionable):
    device = get_device(device_name)
    with fg.config.override(threefry_partitionable=partitionable):
        out, ref = plan_and_reference(lambda k: (fr.bits(k, (3, 37)), fr.split(k, 3), fr.bits(k, (11,), "uint16")),
                                      KEY, device=device)
    for a, b in zip(out, ref):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_compiled_samplers_match_the_reference_on_each_device(device_name):
    device = get_device(device_name)
    x = np.linspace(-1, 1, 60, dtype=np.float32).reshape(6, 10)
    out, ref = plan_and_reference(lambda k, x: (fr.uniform(k, (6, 10)), fr.bernoulli(k, 0.4, (6, 10)),
                                                fg.nn.functional.dropout(x, 0.5, key=k)), KEY, x, device=device)
    np.testing.assert_array_max_ulp(np.asarray(out[0]), ref[0], maxulp=1)
    np.testing.assert_array_equal(np.asarray(out[1]), ref[1])
    np.testing.assert_array_max_ulp(np.asarray(out[2]), ref[2], maxulp=1)


_CPU_BITS = fg.jit(lambda k: (fr.bits(k, (5, 7)), fr.split(k, 3)))


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1))
def test_compiled_hash_equals_numpy_threefry_for_any_key(k0, k1):
    """The CPU kernel (one compiled plan: the key is an input) against the NumPy Threefry of the same
    counters, for keys hypothesis picks (all-ones and zero words included)."""
    key = np.array([k0, k1], np.uint32)
    bits, keys = (np.asarray(a) for a in _CPU_BITS(key))
    first, second = P.threefry2x32_numpy(key[0], key[1], np.zeros(35, np.uint32), np.arange(35, dtype=np.uint32))
    np.testing.assert_array_equal(bits, (first ^ second).reshape(5, 7))
    np.testing.assert_array_equal(keys, np.stack([first[:3], second[:3]], axis=1))


# --- bit for bit against jax.random ------------------------------------------------------------------

def _jax(partitionable: bool):
    jax = pytest.importorskip("jax")
    before = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", partitionable)
    return jax, before


def _same(ours, theirs, name):
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype, (name, ours.shape, theirs.shape)
    if ours.dtype.kind == "f":  # the samplers' float arithmetic (erfinv, log) may differ in the last place
        np.testing.assert_array_max_ulp(ours, theirs, maxulp=2)
    else:
        np.testing.assert_array_equal(ours, theirs, err_msg=name)


def _samplers(r, key, vmap):
    """The same draws through ``r`` (funcgrad.random or jax.random): {name: array}."""
    out = {"split": r.split(key), "split3": r.split(key, 3), "split2x3": r.split(key, (2, 3)),
           "fold_in": r.fold_in(key, 5), "split_of_keys": vmap(r.split)(r.split(key, 3)),
           "permutation": r.permutation(key, 10), "bfloat16": r.uniform(key, (7,), "bfloat16"),
           "choice": r.choice(key, 10, (4,))}
    for shape in SHAPES:
        out[f"bits{shape}"] = r.bits(key, shape)
        out[f"uniform{shape}"] = r.uniform(key, shape)
        out[f"normal{shape}"] = r.normal(key, shape)
    for dtype in ("uint8", "uint16"):
        out[f"bits_{dtype}"] = r.bits(key, (3, 5), dtype)
    out["bernoulli"] = r.bernoulli(key, 0.3, (4, 5))
    out["randint"] = r.randint(key, (4, 5), -3, 10)
    return out


@pytest.mark.parametrize("partitionable", [True, False])
def test_every_sampler_matches_jax_random_bit_for_bit(partitionable):
    jax, before = _jax(partitionable)
    try:
        # one jit each (one XLA compile, one plan): eager JAX compiles every op of every shape
        theirs = jax.jit(lambda k: _samplers(jax.random, k, jax.vmap))(jax.random.PRNGKey(7))
        with fg.config.override(threefry_partitionable=partitionable):
            ours = fg.jit(lambda k: _samplers(fr, k, fg.vmap))(fr.key(7))
            _same(fr.key(7), jax.random.PRNGKey(7), "key")
        assert set(ours) == set(theirs)
        for name in ours:
            _same(ours[name], theirs[name], name)
    finally:
        jax.config.update("jax_threefry_partitionable", before)


@pytest.mark.parametrize("partitionable", [True, False])
def test_64_bit_words_match_jax_random(partitionable):
    jax, before = _jax(partitionable)
    x64 = jax.config.jax_enable_x64
    try:
        jax.config.update("jax_enable_x64", True)
        with fg.config.override(threefry_partitionable=partitionable):
            for shape in ((), (5,), (2, 3)):
                _same(fr.bits(KEY, shape, "uint64"), jax.random.bits(jax.random.PRNGKey(1234), shape, "uint64"),
                      f"bits64 {shape}")
    finally:
        jax.config.update("jax_enable_x64", x64)
        jax.config.update("jax_threefry_partitionable", before)


# --- the option ----------------------------------------------------------------------------------------

def test_the_partitionable_layout_is_the_default_and_the_variable_switches_it(monkeypatch):
    assert fg.config.threefry_partitionable
    default = fr.bits(KEY, (4,)).numpy()
    monkeypatch.setenv("FUNCGRAD_THREEFRY_PARTITIONABLE", "0")
    assert not fg.config.threefry_partitionable
    classic = fr.bits(KEY, (4,)).numpy()
    assert not np.array_equal(default, classic)
    fg.config.update("jax_threefry_partitionable", True)  # jax.config's spelling works too; update wins
    try:
        np.testing.assert_array_equal(fr.bits(KEY, (4,)).numpy(), default)
    finally:
        fg.config.update("threefry_partitionable", None)
    np.testing.assert_array_equal(fr.bits(KEY, (4,)).numpy(), classic)
    with pytest.raises(TypeError, match="threefry_partitionable"):
        fg.config.update("threefry_partitionable", 1)


def test_kernel_expressions_print_each_shared_node_once():
    """Kernel expressions are DAGs (threefry's rounds share every node); printing one (pytest does, for
    the arguments of each frame of a failing test's traceback) writes each node once and is cut short.
    attrs' generated repr wrote each node once per path: a threefry kernel's held a CI run for half an hour."""
    from funcgrad.lower import kernel as K
    doubled = K.var("g0")
    for _ in range(18):  # 2^18 paths through 19 nodes
        doubled = K.KExpr("add", np.dtype("uint32"), (doubled, doubled))
    text = repr(doubled)
    assert text.startswith("KExpr(uint32: let t0 = (g0 + g0); let t1 = (t0 + t0);") and len(text) < 1000, text
    (kernel,) = [step.kernel for step in steps_of(lambda k: fr.bits(k, (8,)), fr.PRNGKey(0))
                 if isinstance(step, KernelStep)]
    assert len(repr(kernel)) < 4 * K.REPR_LIMIT
