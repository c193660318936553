"""jit semantics: one trace per signature, static arguments, errors, and jit inside transforms."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp


def test_jit_traces_once_per_signature():
    f = fg.jit(lambda x, y: x * 2 + y)
    assert f(fnp.ones(3), 1.0).tolist() == [3.0, 3.0, 3.0]
    assert f(fnp.ones(3) * 5, 2.0).tolist() == [12.0, 12.0, 12.0]
    assert f.trace_count == 1
    f(fnp.ones(4), 1.0)  # new shape
    assert f.trace_count == 2
    f(fnp.ones(4, dtype="float16"), 1.0)  # new dtype
    assert f.trace_count == 3
    f(fnp.ones(3), 1.0)  # the first signature is still cached
    assert f.trace_count == 3


def test_jit_retraces_on_new_pytree_structure():
    f = fg.jit(lambda tree: sum(fnp.sum(v) for v in fg.tree.leaves(tree)))
    assert f({"a": fnp.ones(2)}).item() == 2.0
    assert f({"a": fnp.ones(2), "b": fnp.ones(3)}).item() == 5.0
    assert f.trace_count == 2


def test_static_argnums_and_argnames_retrace_on_new_values():
    calls = []

    def power(x, n, *, mode="plain"):
        calls.append((n, mode))
        out = x
        for _ in range(n - 1):
            out = out * x
        return -out if mode == "negate" else out

    f = fg.jit(power, static_argnums=1, static_argnames="mode")
    assert f(fnp.asarray(2.0), 3).item() == 8.0
    assert f(fnp.asarray(3.0), 3).item() == 27.0
    assert f(fnp.asarray(2.0), 2).item() == 4.0
    assert f(fnp.asarray(2.0), 2, mode="negate").item() == -4.0
    assert calls == [(3, "plain"), (2, "plain"), (2, "negate")]
    assert f.trace_count == 3


def test_jit_as_decorator_with_options():
    @fg.jit(static_argnums=(1,))
    def repeat(x, times):
        return fnp.concat([x] * times)
    assert repeat(fnp.arange(2), 3).tolist() == [0, 1, 0, 1, 0, 1]

    @fg.jit
    def double(x):
        return x * 2
    assert double(fnp.arange(2)).tolist() == [0, 2]


def test_unhashable_static_argument_is_a_clear_type_error():
    f = fg.jit(lambda x, shape: fnp.reshape(x, shape), static_argnums=1)
    with pytest.raises(TypeError, match="static argument 1 of type list is not hashable"):
        f(fnp.ones(4), [2, 2])
    assert f(fnp.ones(4), (2, 2)).shape == (2, 2)


def test_static_argnums_out_of_range():
    with pytest.raises(ValueError, match="static_argnums 3 is out of range"):
        fg.jit(lambda x: x, static_argnums=3)(1.0)


def test_jit_on_non_callable():
    with pytest.raises(TypeError, match="callable"):
        fg.jit(3)


def test_concretization_inside_jit_names_the_argument_and_alternatives():
    def f(x, threshold):
        return x if x.sum() > threshold else -x
    with pytest.raises(fg.ConcretizationError, match="argument 'x'.*lax.cond.*static_argnums"):
        fg.jit(f)(fnp.ones(3), 0.0)


def test_debug_1_says_why_jit_retraced(monkeypatch, capsys):
    monkeypatch.setenv("DEBUG", "1")
    f = fg.jit(lambda x, y: x.sum() + y.sum())
    f(fnp.ones(3), fnp.ones(3))
    f(fnp.ones(3), fnp.ones(5))
    err = capsys.readouterr().err
    assert "jit(<lambda>): retracing because argument 'y': f32[3] -> f32[5]" in err


def test_jit_call_is_one_equation_inside_other_traces():
    f = fg.jit(lambda x: fnp.sin(x) * 2)
    ir = fg.make_ir(lambda x: f(x) + 1)(fnp.ones(3))
    assert [e.primitive.name for e in ir.eqns] == ["jit", "add"]
    inner = ir.eqns[0].param_dict["ir"]
    assert [e.primitive.name for e in inner.eqns] == ["sin", "mul"]


def test_grad_of_jit_stays_inside_jit_calls():
    f = fg.jit(lambda x: fnp.sum(fnp.sin(x) * x))
    ir = fg.make_ir(fg.grad(f))(fnp.ones(3))
    names = [e.primitive.name for e in ir.eqns]
    assert set(names) <= {"jit", "broadcast_in_dim"}, names  # the seed cotangent may be outside
    assert names.count("jit") == 2  # the forward pass and its transpose, as in JAX
    x = np.array([0.5, 1.0, 2.0], np.float32)
    np.testing.assert_allclose(fg.grad(f)(x).numpy(), np.sin(x) + x * np.cos(x), rtol=1e-6)


def test_jit_of_grad_and_nested_jit_agree():
    def loss(w, x):
        return fnp.sum(fnp.tanh(x @ w) ** 2)
    w = np.random.default_rng(0).normal(size=(3, 2)).astype(np.float32)
    x = np.random.default_rng(1).normal(size=(4, 3)).astype(np.float32)
    expected = fg.grad(loss)(w, x).numpy()
    np.testing.assert_allclose(fg.jit(fg.grad(loss))(w, x).numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(fg.grad(fg.jit(loss))(w, x).numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(fg.jit(fg.jit(fg.grad(fg.jit(loss))))(w, x).numpy(), expected, rtol=1e-5)


def test_jit_with_closure_over_an_outer_tracer_is_not_cached_across_traces():
    def outer(y):
        f = fg.jit(lambda x: x * y)
        return f(fnp.ones(2))
    assert fg.grad(lambda y: fnp.sum(outer(y)))(3.0).item() == 2.0
    assert outer(fnp.asarray(4.0)).tolist() == [4.0, 4.0]


def test_jit_outputs_are_fresh_and_inputs_untouched():
    x = fnp.arange(3.0)
    f = fg.jit(lambda a: a)
    out = f(x)
    assert out.tolist() == [0.0, 1.0, 2.0] and x.tolist() == [0.0, 1.0, 2.0]


def test_jit_accepts_keyword_and_python_scalar_arguments():
    f = fg.jit(lambda x, scale=1.0: x * scale)
    assert f(fnp.ones(2), scale=3.0).tolist() == [3.0, 3.0]
    assert f(fnp.ones(2, dtype="float16"), scale=3.0).dtype == fnp.float16  # scale stays weakly typed


def test_a_tensor_passed_twice_does_not_stand_for_other_arguments_later():
    """A trace on the same Tensor in two places uses one value for both; a later call with two
    different Tensors must trace again, not reuse it (Adam's moments started from one zeros list
    trained to NaN from its third step when it did)."""
    f = fg.jit(lambda a, b: a * 2.0 - b)
    x, y = fnp.asarray([1.0, 2.0]), fnp.asarray([10.0, 20.0])
    assert f(x, x).tolist() == [1.0, 2.0]
    assert f(x, y).tolist() == [-8.0, -16.0]
    assert f(y, x).tolist() == [19.0, 38.0]
    assert f(y, y).tolist() == [10.0, 20.0]

    def step(state, g):
        m, v = state
        return [0.9 * m[0] + g], [0.5 * v[0] + g * g]

    g_step = fg.jit(step)
    zeros = [fnp.zeros(2)]
    g = fnp.asarray([1.0, -2.0])
    m, v = g_step((zeros, list(zeros)), g)  # m and v are one Tensor here
    assert m[0].tolist() == [1.0, -2.0] and v[0].tolist() == [1.0, 4.0]
    m, v = g_step((m, v), g)  # ... and two different ones now
    np.testing.assert_allclose(m[0].numpy(), [1.9, -3.8], rtol=1e-6)
    np.testing.assert_allclose(v[0].numpy(), [1.5, 6.0], rtol=1e-6)
    assert g_step.trace_count == 2
