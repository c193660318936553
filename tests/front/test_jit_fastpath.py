"""jit's fast path (``funcgrad/jit_runtime.py``: ``FastCall``) and the plan's lean replay (``lower/plan.py``).

A call on positional Tensors whose signature was traced before replays the compiled plan at once,
without building a lazy graph. These tests check that it gives the full path's results (NumPy as the
reference) across shapes, dtypes, weak types, pytrees, consts and host steps; that it is taken
(``Jitted.fast_calls``); and that whatever it does not handle (traces, DEBUG, the NaN checks, other
devices, random keys, stateful steps, the reference interpreter) still goes the full way.
"""

from __future__ import annotations

import threading

import hypothesis.strategies as st
import numpy as np
import pytest
from hypothesis import given, settings

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, lazy, nn
from funcgrad import jit_runtime as jit_module
from funcgrad.devices import default_device, get_device
from funcgrad.lazy import DeviceMismatchError, LazyBuffer
from funcgrad.lower import jit_plan
from funcgrad.lower.plan import data_address
from funcgrad.lower.schedule import HostStep


def _replays_here() -> bool:
    """Whether the default device's plans have the lean replay (the CPU; not a device with its own memory)."""
    ir = fg.jit(lambda x: x + 1).lower(Tensor(np.ones(2, np.float32))).ir
    return jit_plan(ir, default_device()).replay is not None


needs_replay = pytest.mark.skipif(not _replays_here(), reason=f"device {default_device().name} has no lean replay")


def _computed(tensor: Tensor) -> bool:
    return isinstance(tensor._data, LazyBuffer) and tensor._data.array is not None


@needs_replay
def test_repeated_calls_take_the_fast_path_and_return_computed_read_only_tensors():
    f = fg.jit(lambda x: x * 2 + 1)
    x = Tensor(np.arange(8, dtype=np.float32))
    f(x)
    for _ in range(5):
        y = f(x)
        assert _computed(y), "the fast path returns a computed Tensor, not a pending one"
        np.testing.assert_array_equal(y.numpy(), np.arange(8, dtype=np.float32) * 2 + 1)
        assert y.realize() is y
        with pytest.raises(ValueError, match="read-only"):
            y._data.array[0] = 5  # Tensors are immutable: the replay's output arrays too
    assert f.fast_calls == 5 and f.trace_count == 1


@needs_replay
@settings(max_examples=25, deadline=None)
@given(calls=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(["float32", "int32", "float16"]), st.booleans()),
                      min_size=1, max_size=6))
def test_fast_path_matches_numpy_as_shapes_dtypes_and_weak_types_change(calls):
    f = fg.jit(lambda x, y: (x * 3 - y, fnp.maximum(x, y).sum()))
    for size, dtype, weak in calls:
        x_np = np.arange(size, dtype=dtype)
        y_np = np.full(size, 2, dtype=dtype)
        x = Tensor(x_np)
        y = Tensor._wrap(Tensor(y_np)._data, weak=weak)  # weak-typed arrays are another signature
        for _ in range(2):
            first, second = f(x, y)
            assert first.dtype == x_np.dtype and first.shape == (size,)
            np.testing.assert_allclose(first.numpy(), x_np * 3 - y_np)
            np.testing.assert_allclose(second.numpy(), np.maximum(x_np, y_np).sum(), rtol=1e-3)
    assert f.fast_calls >= len(calls), "every repeated signature takes the fast path"


@needs_replay
def test_pytree_outputs_consts_literals_and_passed_through_inputs():
    scale = Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    f = fg.jit(lambda x: {"scaled": x * scale, "same": x, "pair": (x.sum(), np.float32(7.0))})
    x = Tensor(np.array([4.0, 5.0, 6.0], np.float32))
    for _ in range(3):
        out = f(x)
        np.testing.assert_array_equal(out["scaled"].numpy(), [4.0, 10.0, 18.0])
        np.testing.assert_array_equal(out["same"].numpy(), [4.0, 5.0, 6.0])
        assert out["pair"][0].item() == 15.0 and out["pair"][1].item() == 7.0
    assert f.fast_calls == 2
    nothing = fg.jit(lambda x: None)
    assert [nothing(x) for _ in range(3)] == [None] * 3 and nothing.fast_calls == 2


@needs_replay
def test_plans_with_host_steps_and_several_kernels_replay():
    f = fg.jit(lambda x: (fnp.sort(x) * 2, fnp.cumsum(x) + 1, fnp.exp(x).sum() / x.max()))
    x_np = np.array([3.0, -1.0, 2.0, 0.5], np.float32)
    ir = f.lower(Tensor(x_np)).ir
    assert any(isinstance(step, HostStep) for step in jit_plan(ir, default_device()).steps)
    for _ in range(3):
        sorted_, summed, ratio = f(Tensor(x_np))
        np.testing.assert_array_equal(sorted_.numpy(), np.sort(x_np) * 2)
        np.testing.assert_allclose(summed.numpy(), np.cumsum(x_np) + 1, rtol=1e-6)
        np.testing.assert_allclose(ratio.numpy(), np.exp(x_np.astype(np.float64)).sum() / 3.0, rtol=1e-5)
    assert f.fast_calls == 2


@needs_replay
def test_sibling_results_of_one_multi_output_kernel_replay():
    f = fg.jit(lambda x, y: (x * 2 + y, x - y, fnp.exp(x)))  # the CPU fuses the three into one kernel
    x_np, y_np = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    for _ in range(3):
        doubled, difference, exp = f(Tensor(x_np), Tensor(y_np))
        np.testing.assert_array_equal(doubled.numpy(), x_np * 2 + y_np)
        np.testing.assert_array_equal(difference.numpy(), x_np - y_np)
        np.testing.assert_allclose(exp.numpy(), np.exp(x_np.astype(np.float64)), rtol=1e-6)
    assert f.fast_calls == 2


@needs_replay
def test_a_large_kernel_split_across_threads_replays():
    f = fg.jit(lambda x: fnp.tanh(x) * 2 + x.sum())
    x_np = np.linspace(-3, 3, 1 << 18, dtype=np.float32)
    for _ in range(2):
        np.testing.assert_allclose(f(Tensor(x_np)).numpy(), np.tanh(x_np) * 2 + x_np.astype(np.float64).sum(),
                                   rtol=1e-5, atol=2e-2)
    assert f.fast_calls == 1


@needs_replay
def test_pending_arguments_are_computed_first_and_non_contiguous_ones_copied():
    f = fg.jit(lambda x: x * 10)
    x = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4))
    f(x)
    pending = x + 1
    assert not _computed(pending)
    np.testing.assert_array_equal(f(pending).numpy(), (np.arange(12).reshape(3, 4) + 1) * 10)
    assert _computed(pending), "a lazy input is realised first"
    transposed = Tensor(np.arange(12, dtype=np.float32).reshape(4, 3).T)  # may hold a Fortran-ordered array
    np.testing.assert_array_equal(f(transposed).numpy(), np.arange(12).reshape(4, 3).T * 10)
    assert f.fast_calls == 2


@needs_replay
def test_a_const_tensor_given_a_new_value_is_read_on_the_next_call():
    weight = Tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    f = fg.jit(lambda x: (x * weight).sum())
    x = Tensor(np.array([3.0, 4.0], np.float32))
    assert f(x).item() == 11.0
    opt = nn.optim.SGD([weight], lr=0.5)
    for expected in ([-0.5, 0.0], [-2.0, -2.0]):
        weight.requires_grad = True
        opt.zero_grad()
        (weight * x).sum().backward()  # grad x = [3, 4]: the step swaps w - 0.5 x into the same Tensor
        opt.step()
        weight.requires_grad = False  # frozen: the calls below may take the fast path
        np.testing.assert_array_equal(weight.numpy(), expected)
        calls = f.fast_calls
        assert f(x).item() == float(np.dot(expected, [3.0, 4.0]))
        assert f.fast_calls == calls + 1
    assert f.trace_count == 1


@needs_replay
def test_backward_through_a_jitted_call_on_tensors_that_require_grad_keeps_working():
    w = Tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    square_sum = fg.jit(lambda v: (v * v).sum())
    square_sum(w)
    loss = square_sum(w)
    loss.backward()  # needs the lazy graph behind loss, which the fast path would not build
    np.testing.assert_allclose(w.grad.numpy(), [2.0, 4.0, 6.0])
    scale = Tensor(np.array([0.5, -1.0], np.float32), requires_grad=True)
    weighted = fg.jit(lambda v: (v * scale).sum())  # scale is a const of the trace
    x = Tensor(np.array([4.0, 8.0], np.float32))
    weighted(x)
    weighted(x).backward()
    np.testing.assert_allclose(scale.grad.numpy(), [4.0, 8.0])
    assert square_sum.fast_calls == 0 and weighted.fast_calls == 0
    np.testing.assert_allclose(weighted(Tensor(w.numpy()[:2])).numpy(), -1.5)  # alike values without grads
    assert weighted.fast_calls == 0, "a const that requires a gradient keeps every call lazy"


@needs_replay
def test_debug_nans_switched_on_takes_effect_on_the_next_call(monkeypatch):
    f = fg.jit(lambda x: fnp.log(x))
    bad = Tensor(np.array([1.0, -1.0], np.float32))
    assert np.isnan(f(bad).numpy()[1]) and np.isnan(f(bad).numpy()[1])
    assert f.fast_calls == 1
    with fg.config.override(debug_nans=True), pytest.raises(FloatingPointError, match="NaN"):
        f(bad).numpy()
    monkeypatch.setenv("FUNCGRAD_DEBUG_NANS", "1")
    with pytest.raises(FloatingPointError, match="NaN"):
        f(bad).numpy()
    monkeypatch.delenv("FUNCGRAD_DEBUG_NANS")
    assert np.isnan(f(bad).numpy()[1])
    assert f.fast_calls == 2, "back on the fast path once the checks are off"


@needs_replay
def test_debug_level_takes_the_full_path_which_prints(monkeypatch, capsys):
    f = fg.jit(lambda x: x - 1)
    x = Tensor(np.ones(3, np.float32))
    f(x).realize()
    monkeypatch.setenv("DEBUG", "1")
    np.testing.assert_array_equal(f(x).numpy(), np.zeros(3))
    assert "realized with 1 kernels" in capsys.readouterr().err
    monkeypatch.setenv("DEBUG", "0")
    f(x).realize()
    assert f.fast_calls == 1


@needs_replay
def test_traces_vmap_and_grad_of_a_jitted_function_use_the_full_path():
    f = fg.jit(lambda x: fnp.sin(x) * x)
    x = Tensor(np.array([0.5, 1.0, 2.0], np.float32))
    f(x)
    f(x)
    calls = f.fast_calls
    x64 = np.array([0.5, 1.0, 2.0])
    np.testing.assert_allclose(fg.grad(lambda v: f(v).sum())(x).numpy(), np.cos(x64) * x64 + np.sin(x64), rtol=1e-5)
    np.testing.assert_allclose(fg.vmap(f)(x).numpy(), np.sin(x64) * x64, rtol=1e-6)
    # a concrete Tensor inside another trace stays a call in that trace (which reads its value per outer call)
    closed_over = Tensor(np.array([1.0, 2.0, 3.0], np.float32))
    outer = fg.jit(lambda y: f(closed_over) + y)
    np.testing.assert_allclose(outer(x).numpy(), np.sin([1.0, 2.0, 3.0]) * [1.0, 2.0, 3.0] + x64, rtol=1e-6)
    assert [eqn.primitive.name for eqn in outer.lower(x).ir.eqns][0] == "jit"
    assert f.fast_calls == calls


def test_the_reference_interpreter_is_not_bypassed(monkeypatch):
    f = fg.jit(lambda x: x * 2)
    x = Tensor(np.ones(2, np.float32))
    f(x).realize()
    monkeypatch.setattr(lazy, "USE_COMPILER", False)
    np.testing.assert_array_equal(f(x).numpy(), [2.0, 2.0])
    assert f.fast_calls == 0


@needs_replay
def test_random_keys_and_stateful_steps_keep_the_full_path():
    noisy = fg.jit(lambda x: x + Tensor.rand(3))
    x = Tensor(np.zeros(3, np.float32))
    draws = [noisy(x).numpy() for _ in range(3)]
    assert not np.array_equal(draws[1], draws[2]), "each call draws fresh numbers"
    assert noisy.fast_calls == 0

    model = nn.Linear(2, 1)
    opt = nn.optim.SGD(nn.state.get_parameters(model), lr=0.1)

    @fg.jit
    def step(model, opt, x):
        opt.zero_grad()
        loss = model(x).sum()
        loss.backward()
        opt.step()
        return loss

    before = model.weight.numpy()
    batch = Tensor(np.ones((4, 2), np.float32))
    step(model, opt, batch)
    step(model, opt, batch)
    np.testing.assert_allclose(model.weight.numpy(), before - 2 * 0.1 * 4, rtol=1e-6)
    assert step.fast_calls == 0


@needs_replay
def test_a_function_of_no_arrays_follows_the_default_device():
    f = fg.jit(lambda: fnp.arange(3) * 2)
    for _ in range(3):
        np.testing.assert_array_equal(f().numpy(), [0, 2, 4])
    assert f.fast_calls == 0 and f.trace_count == 1


@needs_replay
def test_arguments_committed_to_another_device_take_the_full_path():
    f = fg.jit(lambda x, y: x + y)
    x = Tensor(np.ones(2, np.float32))
    f(x, Tensor(np.ones(2, np.float32)))  # (one Tensor twice would be another signature: jit._aliases)
    elsewhere = fg.device_put(x, "REFERENCE")
    here = fg.device_put(x, default_device().name)
    with pytest.raises(DeviceMismatchError, match="different devices"):
        f(elsewhere, here)
    result = f(elsewhere, elsewhere)
    np.testing.assert_array_equal(result.numpy(), [2.0, 2.0])
    assert result.device == "REFERENCE"
    committed = f(here, x)
    assert committed._data.committed, "a committed argument commits the result, as in the full path"
    assert f.fast_calls == 1


@needs_replay
def test_bad_input_errors_are_unchanged():
    f = fg.jit(lambda x: x.reshape(2, 3))
    f(Tensor(np.ones(6, np.float32)))
    with pytest.raises(ValueError, match="reshape"):
        f(Tensor(np.ones(5, np.float32)))
    g = fg.jit(lambda x, n: x * n, static_argnums=1)
    g(Tensor(np.ones(2, np.float32)), 2)
    g(Tensor(np.ones(2, np.float32)), 2)
    with pytest.raises(TypeError, match="static argument 1 of type list is not hashable"):
        g(Tensor(np.ones(2, np.float32)), [2])
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'n'"):  # as JAX: n is a parameter
        g(Tensor(np.ones(2, np.float32)))
    assert g.fast_calls == 1


@needs_replay
def test_static_arguments_take_the_fast_path_and_retrace_on_new_values():
    f = fg.jit(lambda x, n, y: x * n + y, static_argnums=1)
    x, y = Tensor(np.arange(3, dtype=np.float32)), Tensor(np.ones(3, np.float32))
    for n in (2, 3, 2, 3):
        for _ in range(2):
            np.testing.assert_array_equal(f(x, n, y).numpy(), np.arange(3) * n + 1)
    assert f.trace_count == 2 and f.fast_calls == 6
    last = fg.jit(lambda x, shape: x.reshape(shape), static_argnums=-1)
    for shape in ((3, 1), (1, 3), (3, 1)):
        assert last(x, shape).shape == shape and last(x, shape).shape == shape
    assert last.trace_count == 2 and last.fast_calls == 4


@needs_replay
def test_fast_entries_are_bounded_like_the_signature_cache(monkeypatch):
    monkeypatch.setattr(jit_module, "JIT_CACHE_SIZE", 3)
    f = fg.jit(lambda x: x + 1)
    for n in range(1, 8):
        for _ in range(2):
            np.testing.assert_array_equal(f(Tensor(np.zeros(n, np.float32))).numpy(), np.ones(n))
    assert len(f._fast) <= 3 and f.fast_calls == 7


@needs_replay
def test_threads_calling_at_once_get_their_own_results():
    f = fg.jit(lambda x: x * x + 1)
    errors: list[str] = []

    def work(seed: int) -> None:
        rng = np.random.default_rng(seed)
        for _ in range(200):
            x = rng.standard_normal(int(rng.integers(1, 5))).astype(np.float32)
            got = f(Tensor(x)).numpy()
            if not np.allclose(got, x * x + 1, rtol=1e-6):
                errors.append(f"{x} -> {got}")

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    assert f.fast_calls > 0


def test_data_address_is_numpys():
    base = np.arange(24, dtype=np.float64)
    for array in (base, base[5:], base[::3], base.reshape(4, 6).T, np.empty(3, np.int8), np.ones((2, 2), np.float16)):
        assert (data_address(array) or 0) == array.__array_interface__["data"][0]


def test_realize_of_a_computed_tensor_returns_it():
    x = Tensor(np.ones(3, np.float32))
    assert x.realize() is x
    pending = x * 2
    assert pending.realize() is pending and _computed(pending)
    assert get_device(None) is default_device()
