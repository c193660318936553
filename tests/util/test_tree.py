"""Specification of funcgrad.tree: which objects are nodes, how they flatten, and what TreeDefs mean."""

import collections
import copy
import dataclasses
import subprocess
import sys
from pathlib import Path
from typing import Any, NamedTuple

import attrs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from funcgrad.util import tree


class Point(NamedTuple):
    x: Any
    y: Any


@dataclasses.dataclass
class Plain:
    a: Any
    b: Any


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenLinear:
    weight: Any
    bias: Any
    activation: str = dataclasses.field(default="relu", metadata={"static": True})
    post_init_calls = 0  # a class attribute, not a field

    def __post_init__(self) -> None:
        type(self).post_init_calls += 1
        if not isinstance(self.weight, np.ndarray):
            raise TypeError("weight must be an array")


@attrs.frozen  # frozen and slotted
class AttrsLayer:
    _scale: Any = attrs.field(validator=attrs.validators.instance_of(float))
    name: str = attrs.field(default="layer", metadata={"static": True})


class Pair:
    """A plain class made a node by `register` below."""

    init_calls = 0

    def __init__(self, first: Any, second: Any, tag: str = "") -> None:
        type(self).init_calls += 1
        self.first, self.second, self.tag = first, second, tag

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Pair) and (self.first, self.second, self.tag) == (
            other.first, other.second, other.tag)


tree.register(Pair, lambda p: ((p.first, p.second), p.tag), lambda tag, ch: Pair(ch[0], ch[1], tag))


@tree.register_static
@dataclasses.dataclass(frozen=True)
class Config:
    depth: int


class Hooked:
    """A node through the `__funcgrad_flatten__` hook, without registration (as nn.Module will be)."""

    def __init__(self, params: dict, kind: str) -> None:
        self.params, self.kind = params, kind

    def __funcgrad_flatten__(self) -> tuple[list, str]:
        return [self.params], self.kind

    @classmethod
    def __funcgrad_unflatten__(cls, aux: str, children: tuple) -> "Hooked":
        return cls(children[0], aux)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Hooked) and (self.params, self.kind) == (other.params, other.kind)


def roundtrip(value: Any) -> Any:
    leaves, treedef = tree.flatten(value)
    return tree.unflatten(treedef, leaves)


# --- round trips and node types ---

@pytest.mark.parametrize("value", [
    (1, 2.0, "s"),
    [1, [2, 3]],
    {"b": 1, "a": (2, 3)},
    collections.OrderedDict([("z", 1), ("a", 2)]),
    None,
    Point(1, [2, 3]),
    Plain(a=1, b={"c": 2}),
    FrozenLinear(np.ones(2), np.zeros(2), "tanh"),
    AttrsLayer(2.0, "head"),
    Pair(1, (2, 3), "t"),
    Hooked({"w": 1.0}, "linear"),
    [Point(1, None), {"k": (Plain(1, 2),)}, Pair(None, [3], "x")],
], ids=lambda value: type(value).__name__)
def test_unflatten_of_flatten_rebuilds_an_equal_object_of_the_same_type(value: Any) -> None:
    rebuilt = roundtrip(value)
    assert type(rebuilt) is type(value)
    if isinstance(value, FrozenLinear):  # numpy arrays do not compare with ==
        assert rebuilt.weight is value.weight and rebuilt.bias is value.bias
        assert rebuilt.activation == value.activation
    else:
        assert rebuilt == value


def test_leaves_come_out_depth_first_left_to_right() -> None:
    assert tree.leaves([1, (2, [3, 4]), Point(5, 6), Plain(7, 8)]) == [1, 2, 3, 4, 5, 6, 7, 8]


def test_dict_children_are_in_sorted_key_order_and_rebuilt_sorted() -> None:
    value = {"b": 2, "c": 3, "a": 1}
    assert tree.leaves(value) == [1, 2, 3]
    assert tree.structure(value) == tree.structure({"a": 0, "b": 0, "c": 0})
    assert list(roundtrip(value)) == ["a", "b", "c"]


def test_dict_with_keys_that_cannot_be_compared_raises_as_jax_does() -> None:
    value = {"a": "str-key", 1: "int-key", 0: "int-key-0"}
    with pytest.raises(ValueError, match="keys of a dict must be sortable.*int, str"):
        tree.leaves(value)
    ordered = collections.OrderedDict(value)  # keeps its own order: no sorting needed
    assert tree.leaves(ordered) == ["str-key", "int-key", "int-key-0"]


def test_ordered_dict_keeps_its_order_and_differs_from_dict() -> None:
    value = collections.OrderedDict([("z", 1), ("a", 2)])
    assert tree.leaves(value) == [1, 2]
    assert list(roundtrip(value)) == ["z", "a"]
    assert tree.structure(value) != tree.structure(dict(value))
    assert tree.structure(value) != tree.structure(collections.OrderedDict([("a", 2), ("z", 1)]))


def test_none_is_a_node_without_leaves_not_a_leaf() -> None:
    assert tree.leaves(None) == []
    assert tree.leaves([None, (None, 1)]) == [1]
    assert tree.structure(None).num_leaves == 0
    assert tree.structure(None) != tree.structure(0)
    assert tree.map(lambda x: x + 1, (None, 1)) == (None, 2)


def test_strings_arrays_and_container_subclasses_are_leaves() -> None:
    class MyDict(dict):
        pass

    array, subclassed = np.arange(3), MyDict(a=1)
    found = tree.leaves(["abc", array, subclassed])
    assert found[0] == "abc" and found[1] is array and found[2] is subclassed


def test_namedtuple_is_rebuilt_as_its_own_class_and_differs_from_tuple() -> None:
    assert roundtrip(Point(1, 2)).x == 1
    assert tree.structure(Point(1, 2)) != tree.structure((1, 2))


# --- dataclasses and attrs: rebuilt without __init__, static fields in the TreeDef ---

def test_dataclass_rebuild_skips_post_init_so_leaves_may_be_any_value() -> None:
    layer = FrozenLinear(np.ones(2), np.zeros(2))
    calls_before = FrozenLinear.post_init_calls
    rebuilt = tree.map(str, layer)  # __post_init__ would reject a str weight
    assert FrozenLinear.post_init_calls == calls_before
    assert rebuilt.weight == "[1. 1.]" and rebuilt.activation == "relu"
    with pytest.raises(dataclasses.FrozenInstanceError):
        rebuilt.weight = 0  # still frozen afterwards


def test_dataclass_static_field_is_not_a_leaf_but_part_of_the_structure() -> None:
    relu, tanh = FrozenLinear(np.ones(1), np.ones(1)), FrozenLinear(np.ones(1), np.ones(1), "tanh")
    assert len(tree.leaves(relu)) == 2
    assert tree.structure(relu) != tree.structure(tanh)
    assert repr(tree.structure(tanh)) == "PyTreeDef(FrozenLinear(weight=*, bias=*, activation='tanh'))"


def test_attrs_rebuild_skips_init_and_validators_and_keeps_private_field_names() -> None:
    layer = AttrsLayer(2.0, "head")
    rebuilt = tree.map(lambda x: "not a float", layer)  # the validator would reject this
    assert rebuilt._scale == "not a float" and rebuilt.name == "head"
    assert tree.leaves(layer) == [2.0]
    assert tree.structure(layer) != tree.structure(AttrsLayer(2.0, "tail"))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        rebuilt.name = "x"


def test_unhashable_static_field_raises_a_type_error_that_says_to_make_it_hashable() -> None:
    with pytest.raises(TypeError, match="must be hashable"):
        tree.flatten(FrozenLinear(np.ones(1), np.ones(1), activation=["relu"]))  # type: ignore[arg-type]


# --- custom nodes ---

def test_registered_class_flattens_with_its_functions_and_aux_data() -> None:
    value = Pair(1, (2, 3), "t")
    assert tree.leaves(value) == [1, 2, 3]
    assert tree.structure(value) != tree.structure(Pair(1, (2, 3), "other tag"))
    assert repr(tree.structure(value)) == "PyTreeDef(Pair['t'](*, (*, *)))"


def test_registering_a_class_twice_or_a_builtin_node_raises_value_error() -> None:
    with pytest.raises(ValueError, match="already registered"):
        tree.register(Pair, lambda p: ((), None), lambda aux, ch: Pair(0, 0))
    with pytest.raises(ValueError, match="already registered"):
        tree.register(dict, lambda d: ((), None), lambda aux, ch: {})


def test_registration_applies_even_after_the_class_was_flattened_as_a_leaf() -> None:
    class Box:
        def __init__(self, content: Any) -> None:
            self.content = content

    assert tree.structure(Box(1)).num_leaves == 1 and tree.leaves(Box(1))[0].content == 1
    tree.register(Box, lambda b: ((b.content,), None), lambda aux, ch: Box(ch[0]))
    assert tree.leaves(Box((1, 2))) == [1, 2]


def test_register_static_instances_have_no_leaves_and_live_in_the_treedef() -> None:
    config = Config(3)
    leaves, treedef = tree.flatten({"config": config, "x": 1})
    assert leaves == [1]
    assert tree.unflatten(treedef, [2])["config"] is config
    assert treedef == tree.structure({"config": Config(3), "x": 5})
    assert treedef != tree.structure({"config": Config(4), "x": 5})


def test_funcgrad_flatten_hook_makes_a_node_without_registration() -> None:
    value = Hooked({"w": 1.0, "b": 2.0}, "linear")
    assert tree.leaves(value) == [2.0, 1.0]
    assert tree.map(lambda x: x * 10, value) == Hooked({"w": 10.0, "b": 20.0}, "linear")
    assert tree.structure(value) != tree.structure(Hooked({"w": 1.0, "b": 2.0}, "conv"))


# --- is_leaf and map ---

def test_is_leaf_stops_descent_at_matching_subtrees() -> None:
    value = [(1, 2), {"a": (3,)}, None]
    assert tree.leaves(value, is_leaf=lambda x: isinstance(x, tuple)) == [(1, 2), (3,)]
    assert tree.leaves(value, is_leaf=lambda x: x is None) == [1, 2, 3, None]
    assert tree.map(len, value, is_leaf=lambda x: isinstance(x, tuple)) == [2, {"a": 1}, None]


def test_map_applies_fn_leafwise_across_trees_of_the_same_structure() -> None:
    params = {"w": [1.0, 2.0], "b": Point(3.0, None)}
    grads = {"w": [0.5, 0.5], "b": Point(1.0, None)}
    scales = {"w": [2, 2], "b": Point(3, None)}
    updated = tree.map(lambda p, g, s: p - s * g, params, grads, scales)
    assert updated == {"w": [0.0, 1.0], "b": Point(0.0, None)}


def test_map_structure_mismatch_raises_value_error_showing_both_structures() -> None:
    with pytest.raises(ValueError) as error:
        tree.map(lambda a, b: a + b, {"a": 1, "b": (2,)}, {"a": 1, "b": [2]})
    message = str(error.value)
    assert "PyTreeDef({'a': *, 'b': (*,)})" in message
    assert "PyTreeDef({'a': *, 'b': [*]})" in message
    assert "tree 2" in message


# --- TreeDef ---

def test_treedefs_of_same_structure_are_equal_and_hash_equal_whatever_the_leaves() -> None:
    first = tree.structure({"a": [1, 2], "b": Plain(3, None)})
    second = tree.structure({"b": Plain("x", None), "a": ["y", np.ones(3)]})
    assert first == second and first is not second
    assert hash(first) == hash(second)
    assert {first: "cached"}[second] == "cached"


@pytest.mark.parametrize("other", [[1, 2, 3], (1, 2), (1, (2, 3)), Point(1, 2), {"a": 1}, (1, None, 3)])
def test_treedefs_of_different_structure_are_unequal(other: Any) -> None:
    assert tree.structure((1, 2, 3)) != tree.structure(other)


def test_treedef_equality_compares_structure_even_when_hashes_collide() -> None:
    # In CPython hash(-1) == hash(-2), so these static nodes hash alike but are different constants.
    minus_one, minus_two = tree.structure(Config(-1)), tree.structure(Config(-2))
    assert hash(minus_one) == hash(minus_two)
    assert minus_one != minus_two


def test_treedef_counts_children_and_repr() -> None:
    treedef = tree.structure({"a": 1, "b": (2, None)})
    assert treedef.num_leaves == 2
    assert treedef.num_nodes == 5  # dict, leaf, tuple, leaf, None
    assert treedef.children() == [tree.structure(0), tree.structure((0, None))]
    assert repr(treedef) == "PyTreeDef({'a': *, 'b': (*, None)})"
    assert repr(tree.structure([(1,), Point(1, 2)])) == "PyTreeDef([(*,), Point(x=*, y=*)])"


def test_treedef_is_immutable_so_copies_are_the_same_object() -> None:
    treedef = tree.structure((1, 2))
    with pytest.raises(AttributeError):
        treedef.num_leaves = 5
    assert treedef.num_leaves == 2
    assert copy.copy(treedef) is treedef and copy.deepcopy({"def": treedef})["def"] is treedef


def test_unflatten_with_wrong_leaf_count_names_both_counts() -> None:
    treedef = tree.structure((1, [2, 3]))
    with pytest.raises(ValueError, match="has 3 leaves but 2 leaves were given"):
        treedef.unflatten([1, 2])
    assert tree.unflatten(treedef, iter("xyz")) == ("x", ["y", "z"])


def test_flatten_handles_trees_a_few_hundred_levels_deep() -> None:
    value: Any = 0
    for _ in range(300):
        value = [value]
    assert roundtrip(value) == value
    assert tree.structure(value).num_nodes == 301


# --- paths ---

def test_flatten_with_path_gives_readable_keys_for_every_node_type() -> None:
    value = {"params": [FrozenLinear(np.ones(1), 2.0)], "step": Point(3, None), "pair": Pair(4, 5)}
    paths = [(tree.keystr(path), leaf) for path, leaf in tree.leaves_with_path(value)]
    assert [p for p, _ in paths] == ["['pair'][0]", "['pair'][1]", "['params'][0].weight",
                                     "['params'][0].bias", "['step'].x"]
    assert [leaf for _, leaf in paths][-1] == 3


def test_path_entries_are_typed_and_comparable() -> None:
    [(path, leaf)] = tree.leaves_with_path({"a": [Point(None, 7)]})
    assert path == (tree.DictKey("a"), tree.SequenceKey(0), tree.GetAttrKey("y")) and leaf == 7
    assert tree.DictKey(0) != tree.SequenceKey(0)
    assert repr(path[0]) == "DictKey('a')"


# --- properties ---

trees = st.recursive(
    st.none() | st.integers(),
    lambda children: (st.lists(children, max_size=4)
                      | st.lists(children, max_size=4).map(tuple)
                      | (st.dictionaries(st.integers(0, 5), children, max_size=4)
                         | st.dictionaries(st.text(max_size=2), children, max_size=4))),
    max_leaves=40)


def count_ints(value: Any) -> int:
    if isinstance(value, int):
        return 1
    if isinstance(value, dict):
        return sum(count_ints(v) for v in value.values())
    return sum(count_ints(v) for v in value) if value is not None else 0


@given(trees)
def test_random_trees_round_trip_and_keep_every_int_as_a_leaf(value: Any) -> None:
    leaves, treedef = tree.flatten(value)
    assert tree.unflatten(treedef, leaves) == value
    assert treedef.num_leaves == len(leaves) == count_ints(value)
    assert all(isinstance(leaf, int) for leaf in leaves)
    assert tree.structure(tree.map(str, value)) == treedef
    assert len(tree.leaves_with_path(value)) == len(leaves)


# --- packaging ---

def test_module_imports_standalone_without_the_funcgrad_package() -> None:
    path = Path(tree.__file__)
    script = ("import importlib.util, sys\n"
              f"spec = importlib.util.spec_from_file_location('standalone_tree', {str(path)!r})\n"
              "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
              "assert 'funcgrad' not in sys.modules\n"
              "print(module.structure((1, None)))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd="/")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "PyTreeDef((*, None))"


# --- where optree (the C++ walk under flatten) has other rules, funcgrad's hold ---

def test_defaultdict_deque_and_structseq_are_leaves_as_before_optree() -> None:
    import os
    import time
    counts, queue, stamp = collections.defaultdict(int, {"a": 1}), collections.deque([1, 2]), time.gmtime(0)
    assert isinstance(os.stat("."), tuple)  # a structseq: optree alone would take it apart
    for _ in range(2):  # the second time through the cache of checked structures
        found = tree.leaves({"q": queue, "c": counts, "t": stamp, "x": [1, (2,)]})
        assert found[0] is counts and found[1] is queue and found[2] is stamp and found[3:] == [1, 2]
    assert tree.leaves([queue, (1, 2)], is_leaf=lambda x: isinstance(x, tuple)) == [queue, (1, 2)]
    assert tree.map(lambda x: x, [counts])[0] is counts


def test_nested_dicts_rebuild_in_sorted_key_order_whatever_the_insertion_order() -> None:
    for value in ({"b": [{"z": 1, "a": 2}], "a": 0}, {"a": 0, "b": [{"a": 2, "z": 1}]}):
        rebuilt = roundtrip(value)
        assert list(rebuilt) == ["a", "b"] and list(rebuilt["b"][0]) == ["a", "z"]
        assert rebuilt == value
        assert list(tree.map(str, value)["b"][0]) == ["a", "z"]


def test_unsortable_keys_raise_every_time_not_only_the_first() -> None:
    for _ in range(2):
        with pytest.raises(ValueError, match="keys of a dict must be sortable"):
            tree.structure([{"a": 1, 2: 3}])


def test_unhashable_aux_raises_for_a_nested_node_every_time() -> None:
    for _ in range(2):
        with pytest.raises(TypeError, match="FrozenLinear node carries unhashable data"):
            tree.structure({"k": [FrozenLinear(np.ones(1), np.ones(1), activation=["relu"])]})  # type: ignore[arg-type]


def test_treedef_pickles_and_loads_in_a_process_that_has_not_flattened_the_class_yet() -> None:
    import pickle
    blob = pickle.dumps(tree.structure({"b": Plain(1, Point(2, 3)), "a": Pair(4, 5, "t")}))
    script = ("import pickle, sys\n"
              f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
              "import test_tree\n"
              f"treedef = pickle.loads({blob!r})\n"
              "print(treedef, treedef == test_tree.tree.structure({'a': test_tree.Pair(0, 0, 't'), "
              "'b': test_tree.Plain(0, test_tree.Point(0, 0))}))\n"
              "print(treedef.unflatten(range(5)))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    shown, rebuilt = result.stdout.strip().splitlines()
    assert shown == "PyTreeDef({'a': Pair['t'](*, *), 'b': Plain(a=*, b=Point(x=*, y=*))}) True"
    assert rebuilt.startswith("{'a': <") and "Plain(a=2, b=Point(x=3, y=4))" in rebuilt


def test_aux_data_marked_uncached_is_not_kept_alive_by_the_structure_cache() -> None:
    import gc
    import weakref

    class Residuals:  # stands for a linearization's saved values (transforms/ad.py marks its aux so)
        __funcgrad_uncached__ = True

        def __eq__(self, other: object) -> bool:
            return self is other

        def __hash__(self) -> int:
            return id(self)

    class Held:
        def __init__(self, value: Any, aux: Residuals) -> None:
            self.value, self.aux = value, aux

    tree.register(Held, lambda h: ((h.value,), h.aux), lambda aux, ch: Held(ch[0], aux))
    aux = Residuals()
    alive = weakref.ref(aux)
    leaves, treedef = tree.flatten({"h": Held(1.0, aux)})
    assert leaves == [1.0] and tree.unflatten(treedef, [2.0])["h"].aux is aux
    del aux, treedef
    gc.collect()
    assert alive() is None
    plain = weakref.ref(kept := Config(7))  # a structure without the mark is cached (it stays alive)
    tree.structure([kept, Plain(1, 2)])
    del kept
    gc.collect()
    assert plain() is not None


def test_threads_meeting_a_new_node_class_at_once_all_flatten_it_as_a_node():
    """A dataclass is registered with optree the first time a flatten meets it; a thread whose flatten
    met it as a leaf just before another thread registered it must flatten again (it once kept the
    whole object as one leaf: an optimizer passed to jit in a thread was 'not a valid funcgrad type')."""
    import dataclasses
    import threading

    from funcgrad.util import tree as T
    wrong = []
    for round_ in range(40):
        Node = dataclasses.make_dataclass(f"Node{round_}", ["a", "b"])
        barrier = threading.Barrier(4)

        def work(Node=Node, barrier=barrier):
            barrier.wait()
            leaves, _ = T.flatten([Node(1.0, 2.0), Node(3.0, 4.0)])
            if leaves != [1.0, 2.0, 3.0, 4.0]:
                wrong.append(leaves)
        threads = [threading.Thread(target=work) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert not wrong, wrong[:3]
