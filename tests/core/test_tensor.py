"""Tensor: construction, NumPy interop, Python protocols, operators and lazy evaluation."""

from __future__ import annotations

import operator

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor
from funcgrad.ir import dtypes
from funcgrad.lazy import graph_to_ir


def test_construction_canonicalizes_dtypes():
    assert Tensor([1, 2]).dtype == dtypes.int32
    assert Tensor([1.0, 2]).dtype == dtypes.float32
    assert Tensor([True]).dtype == dtypes.bool_
    assert Tensor(np.ones(2, np.float16)).dtype == dtypes.float16
    assert Tensor(np.ones(2, np.uint64)).dtype == dtypes.uint32
    assert Tensor([1, 2], dtype="float16").dtype == dtypes.float16
    assert Tensor(np.ones(2), dtype=dtypes.bfloat16).dtype == dtypes.bfloat16
    assert fg.Array is Tensor


def test_properties():
    x = Tensor(np.zeros((2, 3, 4), np.float32))
    assert (x.shape, x.ndim, x.size, x.device, len(x)) == ((2, 3, 4), 3, 24, fg.Device.DEFAULT, 2)


def test_bad_construction():
    with pytest.raises(ValueError, match="cannot make an array"):
        Tensor([[1, 2], [3]])
    with pytest.raises(TypeError, match="cannot make an array"):
        Tensor(["a", None])
    with pytest.raises(TypeError, match="datetime64"):
        Tensor(np.array(["2020-01-01"], "datetime64[D]"))
    assert Tensor(np.ones(2, np.complex64)).dtype == np.complex64
    with pytest.raises(ValueError, match="device 'TPU' is not available"):
        Tensor([1.0], device="TPU")


def test_numpy_interop_copies_both_ways():
    source = np.arange(4, dtype=np.float32)
    x = Tensor(source)
    source[0] = 100.0  # the Tensor took a copy
    out = x.numpy()
    out[1] = 100.0  # and hands out copies
    assert x.tolist() == [0.0, 1.0, 2.0, 3.0]
    np.testing.assert_array_equal(np.asarray(x), [0, 1, 2, 3])
    assert np.asarray(x, dtype=np.float64).dtype == np.float64


def test_numpy_arrays_combine_with_tensors_into_tensors():
    x = Tensor([1.0, 2.0])
    for result in (np.ones(2) + x, x + np.ones(2), np.float32(2) * x):
        assert isinstance(result, Tensor)
    assert (np.ones(2, np.float32) - x).tolist() == [0.0, -1.0]


def test_item_bool_int_float_and_index():
    assert Tensor([[3.5]]).item() == 3.5
    assert float(Tensor(2)) == 2.0 and int(Tensor(2.7)) == 2
    assert bool(Tensor([1])) is True
    assert [10, 20, 30][Tensor(1)] == 20
    with pytest.raises(ValueError, match="item\\(\\) needs an array with one element"):
        Tensor([1, 2]).item()
    with pytest.raises(ValueError, match="ambiguous"):
        bool(Tensor([1, 2]))
    with pytest.raises(TypeError, match="integer scalar"):
        [1, 2][Tensor(1.0)]


def test_tensors_are_immutable_and_unhashable():
    x = Tensor([1.0, 2.0])
    with pytest.raises(TypeError, match="immutable.*at\\["):
        x[0] = 3.0
    with pytest.raises(TypeError, match="unhashable"):
        hash(x)


def test_iteration_and_len():
    rows = list(Tensor([[1, 2], [3, 4]]))
    assert [r.tolist() for r in rows] == [[1, 2], [3, 4]]
    with pytest.raises(TypeError, match="0-d"):
        iter(Tensor(1.0))
    with pytest.raises(TypeError, match="0-d"):
        len(Tensor(1.0))


_BINARY_OPERATORS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv,
    "//": operator.floordiv, "%": operator.mod, "**": operator.pow, "<": operator.lt, "<=": operator.le,
    ">": operator.gt, ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
}


@pytest.mark.parametrize("op", list(_BINARY_OPERATORS))
def test_binary_operators_match_numpy(op):
    apply = _BINARY_OPERATORS[op]
    a = np.array([[1.5, -2.0, 3.0]], np.float32)
    b = np.array([[2.0], [0.5]], np.float32)
    with np.errstate(invalid="ignore"):  # (-2.0) ** 0.5 is NaN in both
        expected = apply(a.astype(np.float64), b.astype(np.float64))
    for actual in (apply(Tensor(a), Tensor(b)), apply(Tensor(a), b), apply(a, Tensor(b))):
        np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-6)


def test_unary_operators_and_bitwise():
    x = Tensor([1, -2, 3])
    assert (-x).tolist() == [-1, 2, -3] and abs(x).tolist() == [1, 2, 3] and (+x).tolist() == [1, -2, 3]
    assert (~x).tolist() == [-2, 1, -4]
    assert (x & 1).tolist() == [1, 0, 1] and (x | 4).tolist() == [5, -2, 7] and (x ^ 1).tolist() == [0, -1, 2]
    assert (x << 1).tolist() == [2, -4, 6] and (x >> 1).tolist() == [0, -1, 1]
    assert (2 - x).tolist() == [1, 4, -1] and (6 // x).tolist() == [6, -3, 2]


def test_methods_from_the_seed():
    a = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
    assert a.T.shape == (3, 2) and a.permute(1, 0).shape == (3, 2)
    assert a.reshape(3, 2).shape == (3, 2) and a.reshape((6,)).shape == (6,)
    assert a.flatten().shape == (6,) and Tensor.ones(2, 1, 3).flatten(1).shape == (2, 3)
    assert a.sum().item() == 15.0 and a.sum(axis=1).tolist() == [3.0, 12.0]
    assert a.mean().item() == 2.5 and a.max().item() == 5.0
    np.testing.assert_allclose(a.dot(a.T).numpy(), a.numpy() @ a.numpy().T)
    np.testing.assert_allclose(a.matmul(a.T).numpy(), a.numpy() @ a.numpy().T)
    assert (a - 2).relu().tolist() == [[0, 0, 0], [1, 2, 3]]
    np.testing.assert_allclose(a.softmax().numpy().sum(axis=-1), [1, 1], rtol=1e-6)
    np.testing.assert_allclose(a.log_softmax().exp().numpy().sum(axis=-1), [1, 1], rtol=1e-6)


def test_static_constructors():
    assert Tensor.zeros(2, 3).tolist() == [[0.0] * 3] * 2
    assert Tensor.ones((2,)).tolist() == [1.0, 1.0]
    assert Tensor.empty(4, 4).shape == (4, 4)
    assert Tensor.eye(2).tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert Tensor.arange(3).tolist() == [0, 1, 2] and Tensor.arange(1, 2, 0.5).tolist() == [1.0, 1.5]
    assert Tensor.full((2,), 7).tolist() == [7, 7]
    assert Tensor.eye(3, requires_grad=True).requires_grad is True


def test_empty_is_a_realized_buffer_of_the_full_shape_outside_a_trace():
    import funcgrad as fg
    import funcgrad.numpy as fnp
    a = Tensor.empty(3, 5, dtype="int16")
    assert a.shape == (3, 5) and a.dtype == np.int16
    assert a._data.realized and a._data.array.shape == (3, 5)  # memory, not a broadcast scalar
    assert fnp.empty(4)._data.realized and fnp.empty((2, 2), dtype="float16").dtype == np.float16
    assert a.schedule() == [] and (a + 1).schedule()[0].kernel.in_avals[0].shape == (3, 5)
    # under a trace there is no buffer to give: zeros, as jax.numpy.empty
    assert fg.jit(lambda x: fnp.empty((2,)) + x)(Tensor([1.0, 2.0])).tolist() == [1.0, 2.0]


def test_sparse_categorical_crossentropy_matches_numpy():
    logits = np.array([[2.0, 1.0, 0.1], [0.5, 2.5, 0.3]], np.float32)
    labels = np.array([0, 1])
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    expected = -log_probs[np.arange(2), labels].mean()
    loss = Tensor(logits).sparse_categorical_crossentropy(Tensor(labels))
    assert loss.item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ValueError, match="labels of shape \\(3,\\)"):
        Tensor(logits).sparse_categorical_crossentropy(Tensor([0, 1, 2]))


def test_repr_shows_the_values_of_pending_and_computed_tensors_alike():
    x = Tensor([1.0, 2.0]) + 1
    assert not x._data.realized
    assert repr(x) == "Tensor([2., 3.], dtype=float32)"  # computed for the repr, as JAX shows values
    assert x._data.realized
    assert repr(x.realize()) == "Tensor([2., 3.], dtype=float32)"
    assert repr(fg.numpy.asarray(3.0) * 2) == "Tensor(6., dtype=float32, weak_type=True)"
    assert str(Tensor([1, 2])) == "[1 2]"


# --- laziness ----------------------------------------------------------------------------------

def test_operations_are_lazy_until_realized():
    x = Tensor([1.0, 2.0])
    y = (x * 2 + 1).exp()
    assert not y._data.realized and y._data.op.primitive.name == "exp"
    ir, inputs = graph_to_ir([y._data])
    assert [e.primitive.name for e in ir.eqns] == ["mul", "add", "exp"]
    assert y.realize() is y and y._data.realized and y._data.op is None
    np.testing.assert_allclose(y.numpy(), np.exp(np.array([1.0, 2.0]) * 2 + 1), rtol=1e-6)


def test_realizing_frees_the_graph_behind_it():
    import gc
    import weakref
    x = Tensor(np.ones(1000, np.float32))
    intermediate = x * 2
    probe = weakref.ref(intermediate._data)
    y = intermediate + 1
    del intermediate
    y.realize()
    gc.collect()
    assert probe() is None


def test_shared_subgraphs_are_computed_once_per_realize():
    x = Tensor([1.0, 2.0])
    shared = x * 3
    y = shared + shared
    ir, _ = graph_to_ir([y._data])
    assert [e.primitive.name for e in ir.eqns] == ["mul", "add"]
    assert y.tolist() == [6.0, 12.0]


def test_deep_lazy_graphs_realize_without_recursion_errors():
    x = Tensor([0.0])
    for _ in range(5000):
        x = x + 1.0
    assert x.item() == 5000.0


def test_multiple_result_primitive_lazily():
    from funcgrad.core.tensor import bind
    from funcgrad.ir import primitives as P
    keys, values = bind(P.sort_p, Tensor([3.0, 1.0, 2.0]), Tensor([0, 1, 2]), dimension=0, num_keys=1,
                        descending=False)
    assert values.tolist() == [1, 2, 0]
    assert keys.tolist() == [1.0, 2.0, 3.0]


def test_shape_errors_are_raised_when_the_op_is_applied_not_at_realize():
    with pytest.raises(ValueError, match=r"\(2,\), \(3,\) cannot be broadcast"):
        Tensor([1.0, 2.0]) + Tensor([1.0, 2.0, 3.0])
    with pytest.raises(ValueError, match="cannot reshape an array of shape \\(2,\\)"):
        Tensor([1.0, 2.0]).reshape(3)
    with pytest.raises(TypeError, match="do not align"):  # a TypeError, as JAX's
        fnp.ones((2, 3)) @ fnp.ones((2, 3))
