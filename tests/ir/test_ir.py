"""The IR data structures: immutability, printing, typechecking."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.core import IR, Eqn, IRTypeError, Literal, ShapedArray, Var, pretty_print, typecheck


def mlp(params, x):
    for w, b in params[:-1]:
        x = fnp.maximum(x @ w + b, 0.0)
    w, b = params[-1]
    return fnp.sum(x @ w + b)


MLP_LISTING = """\
{ lambda a:f32[4,8] b:f32[8] c:f32[8,2] d:f32[2] e:f32[3,4]. let
    f:f32[3,8] = dot_general[batch=((), ()) contracting=((1,), (0,))] e a
    g:f32[3,8] = broadcast_in_dim[broadcast_dimensions=(1,) shape=(3, 8)] b
    h:f32[3,8] = add f g
    i:f32[3,8] = max h 0.0:f32[]
    j:f32[3,2] = dot_general[batch=((), ()) contracting=((1,), (0,))] i c
    k:f32[3,2] = broadcast_in_dim[broadcast_dimensions=(1,) shape=(3, 2)] d
    l:f32[3,2] = add j k
    m:f32[] = reduce_sum[axes=(0, 1)] l
  in (m,) }"""


def mlp_params():
    return [(np.ones((4, 8), np.float32), np.zeros(8, np.float32)),
            (np.ones((8, 2), np.float32), np.zeros(2, np.float32))]


def test_mlp_ir_prints_as_jaxpr_like_listing():
    ir = fg.make_ir(mlp)(mlp_params(), np.ones((3, 4), np.float32))
    assert str(ir) == MLP_LISTING


def test_printing_shows_constants_before_a_semicolon():
    captured = fg.Tensor([1.0, 2.0, 3.0])
    ir = fg.make_ir(lambda x: x * captured)(np.ones(3, np.float32))
    assert str(ir).splitlines()[0] == "{ lambda a:f32[3]; b:f32[3]. let"
    assert len(ir.consts) == 1 and ir.consts[0] is captured


def test_multiple_outputs_and_literal_outputs_print():
    ir = fg.make_ir(lambda x: (x, 2.0))(np.ones(2, np.float32))
    assert str(ir).splitlines()[-1] == "  in (a, 2.0:f32[]) }"
    assert len(ir.outputs) == 2


def test_ir_objects_are_immutable():
    ir = fg.make_ir(lambda x: x + 1)(np.ones(2, np.float32))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ir.eqns = ()  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        ir.eqns[0].primitive = P.sub_p  # type: ignore[misc]
    assert isinstance(ir.eqns, tuple) and isinstance(ir.eqns[0].params, tuple)


def test_vars_compare_by_identity_and_avals_by_value():
    aval = ShapedArray((2, 3), dtypes.float32)
    assert aval == ShapedArray([2, 3], np.dtype("float32"))
    assert hash(aval) == hash(ShapedArray((2, 3), dtypes.float32))
    assert Var(aval) != Var(aval)
    assert aval.short_str() == "f32[2,3]" and aval.size == 6 and aval.ndim == 2


def test_eqn_params_are_sorted_and_hashable():
    x = Var(ShapedArray((2, 3), dtypes.float32))
    out = Var(ShapedArray((3, 2), dtypes.float32))
    eqn = Eqn(P.transpose_p, (x,), {"permutation": (1, 0)}, (out,))
    assert eqn.param_dict == {"permutation": (1, 0)}
    hash(eqn.params)


def test_typecheck_accepts_traced_programs():
    typecheck(fg.make_ir(mlp)(mlp_params(), np.ones((3, 4), np.float32)))


def test_typecheck_rejects_wrong_output_type():
    x = Var(ShapedArray((2,), dtypes.float32))
    bad = Var(ShapedArray((3,), dtypes.float32))
    ir = IR((x,), (Eqn(P.exp_p, (x,), {}, (bad,)),), (bad,))
    with pytest.raises(IRTypeError, match="shape rule gives"):
        typecheck(ir)


def test_typecheck_rejects_use_before_definition():
    x = Var(ShapedArray((2,), dtypes.float32))
    y = Var(ShapedArray((2,), dtypes.float32))
    z = Var(ShapedArray((2,), dtypes.float32))
    ir = IR((x,), (Eqn(P.add_p, (x, y), {}, (z,)),), (z,))
    with pytest.raises(IRTypeError, match="before it is defined"):
        typecheck(ir)


def test_typecheck_rejects_double_definition():
    x = Var(ShapedArray((2,), dtypes.float32))
    ir = IR((x,), (Eqn(P.exp_p, (x,), {}, (x,)),), (x,))
    with pytest.raises(IRTypeError, match="defined twice"):
        typecheck(ir)


def test_typecheck_rejects_mistyped_literal():
    x = Var(ShapedArray((2,), dtypes.float32))
    z = Var(ShapedArray((2,), dtypes.float32))
    literal = Literal(np.float64(2.0), ShapedArray((), dtypes.float32))
    ir = IR((x,), (Eqn(P.mul_p, (x, literal), {}, (z,)),), (z,))
    with pytest.raises(IRTypeError, match="literal"):
        typecheck(ir)


def test_ir_rejects_mismatched_consts():
    with pytest.raises(ValueError, match="const vars"):
        IR((), (), (), (Var(ShapedArray((), dtypes.float32)),), ())


def test_pretty_print_names_many_variables_uniquely():
    def chain(x):
        for _ in range(30):
            x = x + 1.0
        return x
    text = pretty_print(fg.make_ir(chain)(np.ones(2, np.float32)))
    names = [line.split(":")[0].strip() for line in text.splitlines()[1:-1]]
    assert len(set(names)) == 30 and "ba" in names


def test_producer_and_user_maps():
    x = Var(ShapedArray((2,), dtypes.float32))
    y, z = Var(ShapedArray((2,), dtypes.float32)), Var(ShapedArray((2,), dtypes.float32))
    square = Eqn(P.mul_p, [x, x], (), [y])
    plus = Eqn(P.add_p, [y, Literal(1.0, ShapedArray((), dtypes.float32))], (), [z])
    ir = IR([x], [square, plus], [z])
    assert ir.producers() == {y.id: square, z.id: plus}  # inputs have no producer
    # an equation once per operand that reads the var; literals and unread vars have no entry
    assert ir.users() == {x.id: [square, square], y.id: [plus]}
