"""jax.tree_util's spellings in funcgrad.tree (issue 19): register_pytree_node_class,
register_dataclass, transpose, flatten_with_path's (pairs, treedef), and mixed-key dicts raising.
Compared with jax.tree_util where JAX is installed."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.util import tree


@tree.register_pytree_node_class
class Box:
    def __init__(self, value: Any, label: str) -> None:
        self.value, self.label = value, label

    def tree_flatten(self) -> tuple[tuple[Any, ...], str]:
        return (self.value,), self.label

    @classmethod
    def tree_unflatten(cls, label: str, children: tuple[Any, ...]) -> Box:
        return cls(children[0], label)


@dataclasses.dataclass
class Params:
    w: Any
    b: Any
    name: str


tree.register_dataclass(Params, data_fields=["w", "b"], meta_fields=["name"])


def test_register_pytree_node_class_round_trips_and_works_under_transforms() -> None:
    leaves, treedef = tree.flatten(Box([1, 2], "x"))
    assert leaves == [1, 2]
    rebuilt = tree.unflatten(treedef, [3, 4])
    assert isinstance(rebuilt, Box) and rebuilt.value == [3, 4] and rebuilt.label == "x"
    grad = fg.grad(lambda box: (box.value * box.value).sum())(Box(fnp.arange(3.0), "y"))
    assert isinstance(grad, Box) and grad.value.tolist() == [0.0, 2.0, 4.0] and grad.label == "y"
    with pytest.raises(TypeError, match="has no tree_flatten"):
        tree.register_pytree_node_class(type("Plain", (), {}))


def test_register_dataclass_with_data_and_meta_fields() -> None:
    p = Params(w=fnp.ones(2), b=fnp.zeros(()), name="layer")
    leaves, treedef = tree.flatten(p)
    assert len(leaves) == 2
    assert str(treedef) == "PyTreeDef(Params(w=*, b=*, name='layer'))"
    doubled = fg.jit(lambda p: tree.map(lambda v: v * 2, p))(p)
    assert isinstance(doubled, Params) and doubled.name == "layer" and doubled.w.tolist() == [2.0, 2.0]
    assert [tree.keystr(path) for path, _ in tree.leaves_with_path(p)] == [".w", ".b"]

    @dataclasses.dataclass
    class Partial:
        a: Any
        b: Any

    with pytest.raises(ValueError, match=r"fields \['b'\] of .*Partial are in neither"):
        tree.register_dataclass(Partial, data_fields=["a"], meta_fields=[])


def test_flatten_with_path_returns_pairs_and_treedef() -> None:
    value = {"a": [1, 2], "b": (3,)}
    pairs, treedef = tree.flatten_with_path(value)
    assert [(tree.keystr(p), leaf) for p, leaf in pairs] == [("['a'][0]", 1), ("['a'][1]", 2), ("['b'][0]", 3)]
    assert treedef == tree.structure(value)
    assert tree.map_with_path(lambda p, x: tree.keystr(p) + str(x), value) == \
        {"a": ["['a'][0]1", "['a'][1]2"], "b": ("['b'][0]3",)}
    assert tree.reduce(lambda a, b: a + b, value) == 6 and tree.all(value) and not tree.all([1, 0])


def test_transpose_swaps_outer_and_inner_structures() -> None:
    outer, inner = tree.structure([0, 0]), tree.structure((0, 0, 0))
    assert tree.transpose(outer, inner, [(1, 2, 3), (4, 5, 6)]) == ([1, 4], [2, 5], [3, 6])
    assert tree.transpose(outer, None, [{"a": 1, "b": 2}, {"a": 3, "b": 4}]) == {"a": [1, 3], "b": [2, 4]}
    with pytest.raises(ValueError, match="does not have the structure"):
        tree.transpose(outer, inner, [(1, 2), (3, 4)])


def test_dict_with_mixed_key_types_raises() -> None:
    with pytest.raises(ValueError, match="cannot be compared"):
        tree.flatten({1: "a", "b": "c"})


def test_matches_jax_tree_util() -> None:
    jax = pytest.importorskip("jax")
    value = {"x": [1, (2, 3)], "y": None, "z": {"q": 4}}
    ours, theirs = tree.flatten_with_path(value), jax.tree_util.tree_flatten_with_path(value)
    assert [leaf for _, leaf in ours[0]] == [leaf for _, leaf in theirs[0]]
    assert [tree.keystr(p) for p, _ in ours[0]] == [jax.tree_util.keystr(p) for p, _ in theirs[0]]
    nested = [(1, 2, 3), (4, 5, 6)]
    assert tree.transpose(tree.structure([0, 0]), tree.structure((0, 0, 0)), nested) == \
        jax.tree.transpose(jax.tree.structure([0, 0]), jax.tree.structure((0, 0, 0)), nested)
    with pytest.raises(ValueError):
        jax.tree_util.tree_flatten({1: "a", "b": "c"})
