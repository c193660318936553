"""Tracing with make_ir: inputs, constants, literals, pytrees, nesting, and the tracer errors."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.core.tensor import evaluate
from funcgrad.ir.core import typecheck


def test_python_scalar_arguments_are_weakly_typed_inputs():
    ir = fg.make_ir(lambda x, y: x * y)(np.ones(3, np.float16), 2.0)
    assert [str(v.aval) for v in ir.in_vars] == ["f16[3]", "f32[]"]
    assert ir.out_avals[0].dtype == fnp.float16  # the weak f32 scalar input does not widen float16


def test_numpy_arguments_become_inputs_and_float64_becomes_float32():
    ir = fg.make_ir(lambda x, n: x + n)(np.ones((2, 2)), np.arange(2))
    assert [str(v.aval) for v in ir.in_vars] == ["f32[2,2]", "i32[2]"]


def test_closed_over_arrays_become_constants_and_python_scalars_literals():
    table = np.arange(3.0)
    scale = 3.0
    ir = fg.make_ir(lambda x: x * table + scale)(np.ones(3, np.float32))
    assert len(ir.consts) == 1
    np.testing.assert_array_equal(ir.consts[0].numpy(), table.astype(np.float32))
    assert "add" in str(ir) and "3.0:f32[]" in str(ir)


def test_pytree_arguments_and_outputs():
    def fn(params, x):
        return {"y": params["w"] * x, "extra": [x, None]}
    ir = fg.make_ir(fn)({"w": np.ones(2, np.float32)}, np.ones(2, np.float32))
    assert len(ir.in_vars) == 2 and len(ir.outputs) == 2


def test_static_argnums_are_not_traced():
    def fn(x, power):
        for _ in range(power):
            x = x * x
        return x
    ir = fg.make_ir(fn, static_argnums=1)(np.ones(2, np.float32), 3)
    assert len(ir.in_vars) == 1 and len(ir.eqns) == 3


def test_static_argnums_out_of_range():
    with pytest.raises(ValueError, match="static_argnums 5"):
        fg.make_ir(lambda x: x, static_argnums=5)(1.0)


def test_non_array_arguments_are_rejected():
    with pytest.raises(TypeError, match="str is not a valid funcgrad type"):
        fg.make_ir(lambda x: x)("hello")


def test_nested_traces_lift_outer_values_as_constants():
    def outer(x):
        inner = fg.make_ir(lambda y: y * x + 1.0)(x)
        assert len(inner.consts) == 1 and inner.consts[0] is x  # the outer value, traced or not
        typecheck(inner)
        (result,) = evaluate(inner, x * 2.0)
        return result
    ir = fg.make_ir(outer)(np.full(3, 2.0, np.float32))
    typecheck(ir)
    assert [e.primitive.name for e in ir.eqns] == ["mul", "mul", "add"]
    eager = outer(fg.Tensor(np.full(3, 2.0, np.float32)))
    np.testing.assert_allclose(eager.numpy(), [9.0, 9.0, 9.0])


def test_same_outer_value_is_lifted_once():
    def outer(x):
        inner = fg.make_ir(lambda y: y * x + x)(x)
        assert len(inner.consts) == 1
        return x
    fg.make_ir(outer)(np.ones(2, np.float32))


def test_concrete_tensors_inside_traces_are_recorded_as_constants():
    weights = fg.Tensor(np.eye(2, dtype=np.float32)) * 3.0  # a pending lazy value
    ir = fg.make_ir(lambda x: x @ weights)(np.ones((1, 2), np.float32))
    assert len(ir.consts) == 1 and ir.consts[0] is weights


@pytest.mark.parametrize("use", [bool, float, int, np.asarray, lambda t: t.item(), lambda t: t.numpy(),
                                 lambda t: t.tolist()])
def test_concretizing_a_tracer_raises_a_helpful_type_error(use):
    with pytest.raises(fg.ConcretizationError, match="traced") as info:
        fg.make_ir(lambda x: use(x.sum()))(np.ones(2, np.float32))
    assert isinstance(info.value, TypeError)
    assert "lax.cond" in str(info.value) and "static_argnums" in str(info.value)


def test_python_if_on_a_tracer_names_the_alternatives():
    def relu(x):
        return x if x > 0 else -x
    with pytest.raises(fg.ConcretizationError, match="fnp.where|numpy.where"):
        fg.make_ir(relu)(1.0)


def test_escaped_tracer_raises_when_used_later():
    leaked = []

    def leak(x):
        leaked.append(x)
        return x + 1
    fg.make_ir(leak)(np.ones(2, np.float32))
    with pytest.raises(fg.EscapedTracerError, match="escaped from the make_ir\\(leak\\) trace started at"):
        leaked[0] * 2
    with pytest.raises(fg.EscapedTracerError):
        leaked[0].numpy()
    assert "dead" in repr(leaked[0])


def test_escaped_tracer_used_inside_another_trace():
    leaked = []
    fg.make_ir(lambda x: leaked.append(x) or x)(np.ones(2, np.float32))
    with pytest.raises(fg.EscapedTracerError):
        fg.make_ir(lambda y: y + leaked[0])(np.ones(2, np.float32))


def test_trace_stack_recovers_after_an_exception():
    with pytest.raises(ZeroDivisionError):
        fg.make_ir(lambda x: 1 / 0)(1.0)
    out = fg.Tensor([1.0]) + 1.0  # evaluated eagerly again, not recorded into a dead trace
    assert out.tolist() == [2.0]


def test_tracing_is_per_thread():
    import threading
    results = []

    def worker():
        results.append((fg.Tensor([1.0]) * 2).tolist())

    def traced(x):
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join()
        return x
    fg.make_ir(traced)(1.0)
    assert results == [[2.0]]
