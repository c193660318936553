"""The kernel index simplifier (``funcgrad.lower.kernel.simplify_index``) keeps every index's value on
every loop point, and folds mixed-radix digit sums (a flattened NCHW image) back into one variable."""
from __future__ import annotations

import itertools

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from funcgrad.lower import kernel as K

BOUNDS = {"g0": 5, "g1": 36, "r0": 4}


def value(e: K.KExpr, point: dict[str, int]) -> int:
    """An index expression's value with the kernels' integer semantics (div truncates, rem has the
    dividend's sign, division by zero gives 0)."""
    if e.op == "const":
        return int(e.arg)
    if e.op == "var":
        return point[e.arg]
    a, b = (value(x, point) for x in e.args)
    if e.op == "add":
        return a + b
    if e.op == "sub":
        return a - b
    if e.op == "mul":
        return a * b
    if e.op == "div":
        return int(a / b) if b else 0
    if e.op == "rem":
        return a - int(a / b) * b if b else 0
    raise AssertionError(e.op)


def points(bounds: dict[str, int]):
    names = sorted(bounds)
    for values in itertools.product(*(range(bounds[n]) for n in names)):
        yield dict(zip(names, values))


def address(e: K.KExpr, bounds: dict[str, int]) -> K.KExpr:
    """``e`` simplified as the index of a load (digit sums fold only in whole addresses)."""
    return K.simplify_index(K.load(0, e, np.dtype(np.float32)), bounds).args[0]


def same_sum(a: K.KExpr, b: K.KExpr) -> bool:
    """The same affine sum of the same atoms, in any order."""
    terms = K._affine(a)
    return terms is not None and terms == K._affine(b)


def c(n: int) -> K.KExpr:
    return K.const(n, K.INDEX)


def add(*terms: K.KExpr) -> K.KExpr:
    total = terms[0]
    for t in terms[1:]:
        total = K.alu("add", total, t)
    return total


def test_a_flattened_image_index_is_the_flat_variable_again():
    g1, r0 = K.var("g1"), K.var("r0")
    # the CNN's flatten of (64, 3, 3) pooled maps read by the linear layer's weight gradient
    e = add(K.alu("rem", g1, c(3)), K.alu("mul", K.alu("rem", K.alu("div", g1, c(3)), c(3)), c(3)),
            K.alu("mul", K.alu("div", g1, c(9)), c(9)), K.alu("mul", r0, c(576)))
    simple = address(e, {"g1": 576, "r0": 512})
    assert same_sum(simple, add(g1, K.alu("mul", r0, c(576))))


def test_digits_are_not_folded_when_the_weights_do_not_match():
    g1 = K.var("g1")
    e = add(K.alu("rem", g1, c(3)), K.alu("mul", K.alu("div", g1, c(3)), c(4)))  # not 3 * div: a padded row
    simple = address(e, BOUNDS)
    assert "div" in str(simple) and "rem" in str(simple)
    for p in points({"g1": 36}):
        assert value(simple, p) == value(e, p)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.integers(1, 3), st.integers(0, 2), st.booleans())
def test_mixed_radix_digit_sums_fold_to_their_number(radices, scale, outer, top_as_div):
    """A flat loop variable split into digits (as a reshape's index does), beside an outer offset."""
    g0, g1 = K.var("g0"), K.var("g1")
    digits, weight, rest = [], 1, g1
    for radix in radices:
        digits.append(K.alu("mul", K.alu("rem", rest, c(radix)), c(weight * scale)))
        rest, weight = K.alu("div", rest, c(radix)), weight * radix
    if top_as_div:  # the most significant digit written as one division of the number
        digits.append(K.alu("mul", K.alu("div", g1, c(weight)), c(weight * scale)))
    else:
        digits.append(K.alu("mul", rest, c(weight * scale)))
    offset = K.alu("mul", g0, c(36 * scale * (outer + 1)))
    e = add(*digits, offset)
    simple = address(e, BOUNDS)
    assert same_sum(simple, add(K.alu("mul", g1, c(scale)), offset))
    for p in points({"g0": 5, "g1": 36}):
        assert value(simple, p) == value(e, p) == p["g1"] * scale + p["g0"] * 36 * scale * (outer + 1)


def index_expressions():
    leaves = st.one_of(st.sampled_from([K.var("g0"), K.var("g1"), K.var("r0")]),
                       st.integers(-5, 40).map(lambda n: c(n)))
    return st.recursive(leaves, lambda inner: st.tuples(st.sampled_from(["add", "sub", "mul", "div", "rem"]), inner,
                                                         inner).map(lambda t: K.KExpr(t[0], K.INDEX, (t[1], t[2]))),
                        max_leaves=10)


def negative_dividend(e: K.KExpr, point: dict[str, int]) -> bool:
    return bool(e.args) and (any(negative_dividend(a, point) for a in e.args)
                             or (e.op in ("div", "rem") and value(e.args[0], point) < 0))


@settings(max_examples=200, deadline=None)
@given(index_expressions())
def test_simplification_keeps_every_value(e):
    """Wherever no div/rem divides a negative number: kernels index with non-negative values (a padded
    view's negative offsets only occur in lanes a where() discards, where the simplifier may floor)."""
    bounds = {"g0": 5, "g1": 12, "r0": 4}
    simple, addressed = K.simplify_index(e, bounds), address(e, bounds)
    for p in points(bounds):
        if not negative_dividend(e, p):
            assert value(simple, p) == value(addressed, p) == value(e, p), (str(e), str(simple), p)
