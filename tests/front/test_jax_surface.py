"""The parts of JAX's surface that JAX users' code relies on (issue 19): jit's static arguments,
method binding and cache, ``block_until_ready``, ``make_ir``'s jaxpr-style attributes; NumPy-surface
functions (allclose, tensordot with positional axes, convolve, correlate, at[...].get(mode='fill'),
out-of-range static indices, lists rejected); the lax primitives by name; dot's TypeError; the
repr of a pending Tensor. References: NumPy float64, and JAX where installed.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import lax

# --- jit ------------------------------------------------------------------------------------------------


def test_static_argnames_passed_by_position_and_static_argnums_by_name() -> None:
    traces = []

    def scale(a, n):
        traces.append(n)
        assert isinstance(n, int), "a static argument must arrive as the Python value"
        return a * n

    by_name = fg.jit(scale, static_argnames=["n"])
    assert by_name(fnp.asarray(10.0), 20).item() == 200.0
    assert by_name(fnp.asarray(10.0), n=20).item() == 200.0
    by_position = fg.jit(scale, static_argnums=1)
    assert by_position(fnp.asarray(10.0), n=3).item() == 30.0
    assert by_position(fnp.asarray(10.0), 3).item() == 30.0
    assert traces == [20, 20, 3, 3] or traces == [20, 3]  # (as JAX: keyed by value, however it is passed)
    with pytest.raises(ValueError, match="static_argnums 5 is out of range"):
        fg.jit(scale, static_argnums=5)(1.0, 2)


def test_jit_as_a_method_decorator_binds_self() -> None:
    class Model:
        def __init__(self, k: float) -> None:
            self.k = k

        def __hash__(self) -> int:
            return hash(self.k)

        def __eq__(self, other: object) -> bool:
            return isinstance(other, Model) and other.k == self.k

        @partial(fg.jit, static_argnums=0)
        def calc(self, y):
            return y * self.k

    assert Model(3.0).calc(fnp.asarray(2.0)).item() == 6.0
    assert Model(4.0).calc(fnp.asarray(2.0)).item() == 8.0
    assert Model.calc(Model(5.0), fnp.asarray(2.0)).item() == 10.0


def test_jit_made_twice_on_one_function_traces_once() -> None:
    traces = []

    def double(x):
        traces.append(1)
        return x * 2

    fg.jit(double)(fnp.ones(3))
    fg.jit(double)(fnp.ones(3))
    assert len(traces) == 1
    fg.jit(double, static_argnums=())(fnp.ones(4))  # another signature traces
    assert len(traces) == 2


def test_jit_trace_cache_matches_jax_counts() -> None:
    jax = pytest.importorskip("jax")
    counts = {}
    for name, (jit, xp) in {"jax": (jax.jit, jax.numpy), "funcgrad": (fg.jit, fnp)}.items():
        traces: list[int] = []

        def f(x, n, traces=traces):
            traces.append(1)
            return x * n

        jit(f, static_argnames="n")(xp.ones(2), 2)
        jit(f, static_argnames="n")(xp.ones(2), n=2)
        jit(f, static_argnames="n")(xp.ones(2), 3)
        counts[name] = len(traces)
    assert counts["funcgrad"] <= counts["jax"], counts


def test_block_until_ready_and_make_ir_attributes() -> None:
    x = fnp.arange(3.0) * 2
    assert x.block_until_ready() is x and x._data.realized
    tree_in = {"a": fnp.ones(2) + 1, "b": [fnp.zeros(1) - 1, 3]}
    assert fg.block_until_ready(tree_in) is tree_in
    assert tree_in["a"]._data.realized and tree_in["b"][0]._data.realized
    ir = fg.make_ir(lambda x: fnp.sin(x) * 2)(fnp.ones(3))
    assert ir.jaxpr is ir and [e.primitive.name for e in ir.jaxpr.eqns] == ["sin", "mul"]
    assert ir.invars == ir.in_vars and ir.outvars == ir.outputs and ir.constvars == ir.const_vars
    assert ir.eqns[0].invars == (ir.invars[0],) and ir.eqns[1].outvars == tuple(ir.outvars)
    assert ir.consts == () and [str(a) for a in ir.in_avals] == ["f32[3]"]


# --- NumPy surface ----------------------------------------------------------------------------------------


def test_allclose_tensordot_positional_and_jacobian() -> None:
    assert bool(fnp.allclose(fnp.ones(3), fnp.ones(3) + 1e-9))
    assert not bool(fnp.allclose(fnp.ones(3), fnp.asarray([1.0, 1.0, 1.1])))
    a = np.arange(6.0, dtype=np.float32).reshape(2, 3)
    b = np.arange(12.0, dtype=np.float32).reshape(2, 3, 2)
    np.testing.assert_allclose(fnp.tensordot(a, b, 2).numpy(), np.tensordot(a, b, 2), rtol=1e-6)
    np.testing.assert_allclose(fnp.tensordot(a, b, ([0], [0])).numpy(), np.tensordot(a, b, ([0], [0])), rtol=1e-6)
    jac = fg.jacobian(lambda v: fnp.sin(v) * v)(fnp.arange(3.0))
    v = np.arange(3.0)
    np.testing.assert_allclose(jac.numpy(), np.diag(np.cos(v) * v + np.sin(v)), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mode", ["full", "same", "valid"])
@pytest.mark.parametrize("lengths", [(5, 3), (3, 5), (4, 4), (1, 3), (6, 1)])
def test_convolve_and_correlate_match_numpy(mode: str, lengths: tuple[int, int]) -> None:
    rng = np.random.default_rng(sum(lengths))
    a, v = (rng.standard_normal(n) for n in lengths)
    np.testing.assert_allclose(fnp.convolve(a.astype(np.float32), v.astype(np.float32), mode).numpy(),
                               np.convolve(a, v, mode), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(fnp.correlate(a.astype(np.float32), v.astype(np.float32), mode).numpy(),
                               np.correlate(a, v, mode), rtol=1e-5, atol=1e-5)


def test_convolve_is_differentiable_and_checks_its_input() -> None:
    v = np.array([1.0, -2.0, 0.5], np.float32)
    g = fg.grad(lambda a: fnp.convolve(a, v).sum())(fnp.ones(4))
    np.testing.assert_allclose(g.numpy(), np.full(4, v.sum()), rtol=1e-6)  # each a[i] meets every v[j] once
    with pytest.raises(ValueError, match="convolve only supports 1-dimensional inputs"):
        fnp.convolve(fnp.ones((2, 2)), fnp.ones(2))


def test_at_get_fill_and_static_out_of_range_indices() -> None:
    x = fnp.arange(5.0)
    assert x.at[10].get(mode="fill", fill_value=-1).item() == -1
    np.testing.assert_array_equal(x.at[fnp.asarray([1, 10, -1, -7])].get(mode="fill").numpy(),
                                  [1.0, np.nan, 4.0, np.nan])
    m = fnp.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(m.at[:, [0, 5]].get(mode="fill", fill_value=-1).numpy(),
                                  [[0, -1], [4, -1], [8, -1]])
    assert m.at[5, 1:].get(mode="fill").tolist() == [np.iinfo(np.int32).min] * 3
    assert x[10].item() == 4.0 and x[-10].item() == 0.0  # clamped, as JAX
    assert x.at[10].set(7.0).tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]  # dropped, as JAX
    with pytest.raises(ValueError, match="mode must be"):
        x.at[0].get(mode="wrap")
    assert x.at[7].set(1.0, mode="drop").tolist() == x.tolist()
    assert x.at[1].add(2.0, mode="promise_in_bounds", unique_indices=True).tolist() == [0.0, 3.0, 2.0, 3.0, 4.0]
    with pytest.raises(ValueError, match=r"x.at\[...\].set: mode must be None, 'drop'.*'clip', is not supported"):
        x.at[1].set(0.0, mode="clip")


def test_at_get_fill_matches_jax() -> None:
    jnp = pytest.importorskip("jax.numpy")
    m = np.arange(12, dtype=np.float32).reshape(3, 4)
    for index in [(slice(None), np.array([0, 5, -1, -9])), (5, slice(1, None)), (np.array([2, 3]), 1), (-4, -5)]:
        ours = fnp.asarray(m).at[index].get(mode="fill", fill_value=-2.0).numpy()
        theirs = np.asarray(jnp.asarray(m).at[index].get(mode="fill", fill_value=-2.0))
        np.testing.assert_array_equal(ours, theirs)


def test_lists_are_rejected_by_reductions_as_in_jax() -> None:
    with pytest.raises(TypeError, match=r"sum requires an array or a scalar, got a list at position 0"):
        fnp.sum([1, 2, 3])
    with pytest.raises(TypeError, match="mean requires an array"):
        fnp.mean((1.0, 2.0))
    assert fnp.sum(fnp.asarray([1, 2, 3])).item() == 6 and fnp.sum(3).item() == 3


def test_product_shape_mismatches_raise_type_error_naming_the_operation() -> None:
    with pytest.raises(TypeError, match=r"dot: shapes \(2, 3\) and \(4, 5\) are not aligned"):
        fnp.dot(fnp.ones((2, 3)), fnp.ones((4, 5)))
    with pytest.raises(TypeError, match=r"matmul: shapes \(2, 3\) and \(4, 5\) do not align"):
        fnp.ones((2, 3)) @ fnp.ones((4, 5))
    with pytest.raises(ValueError, match=r"matmul: the batch dimensions \(2,\) and \(3,\) of shapes \(2, 3, 4\) and "
                                         r"\(3, 4, 5\) do not broadcast"):
        fnp.ones((2, 3, 4)) @ fnp.ones((3, 4, 5))
    jnp = pytest.importorskip("jax.numpy")
    with pytest.raises(TypeError):
        jnp.dot(jnp.ones((2, 3)), jnp.ones((4, 5)))


# --- lax by name -------------------------------------------------------------------------------------------

XS = np.array([[-2.5, -1.5, 0.5], [1.5, 2.5, 3.7]], np.float32)
YS = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
IS = np.array([-7, 5, 9], np.int32)
JS = np.array([2, -3, 4], np.int32)

LAX_CASES: dict[str, Any] = {
    "add": lambda L, x, y, i, j: L.add(x, y), "sub": lambda L, x, y, i, j: L.sub(x, 1.0),
    "mul": lambda L, x, y, i, j: L.mul(x, y), "div": lambda L, x, y, i, j: L.div(x, y),
    "div_int": lambda L, x, y, i, j: L.div(i, j), "rem_int": lambda L, x, y, i, j: L.rem(i, j),
    "max": lambda L, x, y, i, j: L.max(x, y), "min": lambda L, x, y, i, j: L.min(x, 0.0),
    "exp": lambda L, x, y, i, j: L.exp(x), "tanh": lambda L, x, y, i, j: L.tanh(x),
    "round": lambda L, x, y, i, j: L.round(x), "round_even": lambda L, x, y, i, j: L.round(x, 1),
    "integer_pow": lambda L, x, y, i, j: L.integer_pow(x, 3),
    "integer_pow_neg": lambda L, x, y, i, j: L.integer_pow(y, -2),
    "clamp": lambda L, x, y, i, j: L.clamp(-1.0, x, 1.0), "square": lambda L, x, y, i, j: L.square(x),
    "reciprocal": lambda L, x, y, i, j: L.reciprocal(y),
    "shift_right_logical": lambda L, x, y, i, j: L.shift_right_logical(i, np.ones(3, np.int32)),
    "shift_right_arithmetic": lambda L, x, y, i, j: L.shift_right_arithmetic(i, np.ones(3, np.int32)),
    "dot_general": lambda L, x, y, i, j: L.dot_general(x, y, (((1,), (1,)), ((), ()))),
    "dot": lambda L, x, y, i, j: L.dot(y, L.transpose(y, (1, 0))),
    "reduce_sum": lambda L, x, y, i, j: L.reduce_sum(x, (1,)),
    "reduce_max": lambda L, x, y, i, j: L.reduce_max(x, (0,)),
    "rev": lambda L, x, y, i, j: L.rev(x, (0,)), "pad": lambda L, x, y, i, j: L.pad(x, 0.0, [(1, 0, 0), (0, 2, 0)]),
    "slice": lambda L, x, y, i, j: L.slice(x, (0, 1), (2, 3)),
    "dynamic_slice": lambda L, x, y, i, j: L.dynamic_slice(x, (1, 1), (1, 2)),
    "broadcast": lambda L, x, y, i, j: L.broadcast(i, (2,)), "iota": lambda L, x, y, i, j: L.iota(np.int32, 4),
    "broadcasted_iota": lambda L, x, y, i, j: L.broadcasted_iota(np.int32, (2, 3), 1),
    "cumsum": lambda L, x, y, i, j: L.cumsum(x, 1),
    "cumsum_reverse": lambda L, x, y, i, j: L.cumsum(x, 1, reverse=True),
    "sort": lambda L, x, y, i, j: L.sort(x, 1), "expand_dims": lambda L, x, y, i, j: L.expand_dims(i, (0,)),
    "reshape": lambda L, x, y, i, j: L.reshape(x, (3, 2)),
    "reshape_dims": lambda L, x, y, i, j: L.reshape(x, (3, 2), (1, 0)),
    "argmax": lambda L, x, y, i, j: L.argmax(x, 1, np.int32),
    "convert": lambda L, x, y, i, j: L.convert_element_type(x, np.int32),
    "atan2": lambda L, x, y, i, j: L.atan2(x, y), "ne": lambda L, x, y, i, j: L.ne(x, y),
    "concatenate": lambda L, x, y, i, j: L.concatenate([x, y], 0),
}


def _lax_reference(case: str) -> np.ndarray:
    x, y, i, j = XS.astype(np.float64), YS.astype(np.float64), IS, JS
    return {
        "add": x + y, "sub": x - 1, "mul": x * y, "div": x / y, "div_int": np.trunc(i / j).astype(np.int32),
        "rem_int": np.fmod(i, j),
        "max": np.maximum(x, y),
        "min": np.minimum(x, 0),
        "exp": np.exp(x),
        "tanh": np.tanh(x),
        "round": np.sign(x) * np.floor(np.abs(x) + 0.5), "round_even": np.round(x), "integer_pow": x ** 3,
        "integer_pow_neg": y ** -2.0, "clamp": np.clip(x, -1, 1), "square": x * x, "reciprocal": 1 / y,
        "shift_right_logical": (i.view(np.uint32) >> 1).view(np.int32), "shift_right_arithmetic": i >> 1,
        "dot_general": x @ y.T, "dot": y @ y.T, "reduce_sum": x.sum(1), "reduce_max": x.max(0), "rev": x[::-1],
        "pad": np.pad(x, [(1, 0), (0, 2)]), "slice": x[0:2, 1:3], "dynamic_slice": x[1:2, 1:3],
        "broadcast": np.broadcast_to(i, (2, 3)),
        "iota": np.arange(4),
        "broadcasted_iota": np.broadcast_to(np.arange(3), (2, 3)),
        "cumsum": np.cumsum(x, 1), "cumsum_reverse": np.cumsum(x[:, ::-1], 1)[:, ::-1], "sort": np.sort(x, 1),
        "expand_dims": i[None], "reshape": x.reshape(3, 2), "reshape_dims": x.T.reshape(3, 2), "argmax": x.argmax(1),
        "convert": np.trunc(x).astype(np.int32), "atan2": np.arctan2(x, y), "ne": x != y,
        "concatenate": np.concatenate([x, y], 0),
    }[case]


@pytest.mark.parametrize("case", sorted(LAX_CASES))
def test_lax_primitives_by_name(case: str) -> None:
    out = LAX_CASES[case](lax, *(fnp.asarray(v) for v in (XS, YS, IS, JS)))
    np.testing.assert_allclose(np.asarray(out, np.float64), _lax_reference(case), rtol=1e-5, atol=1e-6)


def test_lax_primitives_match_jax() -> None:
    jax = pytest.importorskip("jax")
    for case, fn in LAX_CASES.items():
        ours = np.asarray(fn(lax, *(fnp.asarray(v) for v in (XS, YS, IS, JS))), np.float64)
        theirs = np.asarray(fn(jax.lax, *(jax.numpy.asarray(v) for v in (XS, YS, IS, JS))), np.float64)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6, err_msg=case)


def test_lax_does_not_promote() -> None:
    with pytest.raises(TypeError, match="lax.add requires arguments to have the same dtypes, got float32, int32"):
        lax.add(fnp.ones(3), fnp.ones(3, dtype=fnp.int32))
    assert lax.add(fnp.ones(3, dtype=fnp.int32), 2).dtype == np.int32  # a Python scalar is weakly typed


# --- repr --------------------------------------------------------------------------------------------------


def test_repr_of_pending_values_shows_them_and_tracers_stay_abstract() -> None:
    x = fnp.asarray([1.0, 2.0]) * 2
    assert repr(x) == "Tensor([2., 4.], dtype=float32)"
    assert f"{x=}" == "x=Tensor([2., 4.], dtype=float32)"
    assert repr([fnp.arange(2)]) == "[Tensor([0, 1], dtype=int32)]"
    seen = []
    fg.jit(lambda v: seen.append(repr(v)) or v)(fnp.ones(2))
    assert seen[0].startswith("Traced<f32[2]>")
