"""Pytrees: nested containers of arrays, taken apart into leaves plus a structure.

Transforms (jit, grad, vmap) work on flat lists of arrays, while users pass nested tuples, dicts,
dataclasses and modules. `flatten` walks such a container and returns its leaves in a fixed order
together with a `TreeDef` that records everything else; `unflatten` puts new leaves back into the
same shape. A TreeDef hashes in O(1) and compares structurally, so jit can use it as a cache key.

Whether an object is a node (a container) or a leaf is decided by its exact type, in this order:
a class given to `register`/`register_static`; a class with a `__funcgrad_flatten__` hook (and
optionally `__funcgrad_keys__(aux)` naming its children's path entries); a namedtuple; a dataclass;
an attrs class. tuple, list, dict, OrderedDict and None are registered here. Everything else --
arrays, numbers, str, subclasses of list or dict -- is a leaf.

The walking, the TreeDef's hashing and equality and the rebuilding are optree's (C++); what funcgrad
defines differently from optree (dicts rebuilt in sorted key order, unsortable keys refused,
defaultdict/deque/structseq leaves) is checked once per distinct structure (`_check`).
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import functools
import threading
from collections.abc import Callable, Hashable, Iterable
from typing import Any, NamedTuple, TypeVar

import attrs
import optree

PyTree = Any
IsLeaf = Callable[[Any], bool] | None
T = TypeVar("T", bound=type)


# --- path entries: one step from a node to a child, printed the way Python would spell it ---

class KeyEntry:
    """One step of a leaf's path; `str()` gives its Python spelling, e.g. `[0]`, `['w']`, `.bias`."""

    __slots__ = ("key",)
    _spelling = "{}"

    def __init__(self, key: Any) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.key == other.key

    def __hash__(self) -> int:
        return hash((type(self), self.key))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.key!r})"

    def __str__(self) -> str:
        return self._spelling.format(self.key)


class SequenceKey(KeyEntry):
    """Index into a tuple or list, or into a custom node's children."""
    _spelling = "[{!r}]"


class DictKey(KeyEntry):
    """Key of a dict or OrderedDict."""
    _spelling = "[{!r}]"


class GetAttrKey(KeyEntry):
    """Field of a namedtuple, dataclass or attrs class."""
    _spelling = ".{}"


KeyPath = tuple[KeyEntry, ...]


def keystr(path: KeyPath) -> str:
    """Spell a path the way Python indexes it: `keystr(path) == "['params'][0].weight"`."""
    return "".join(str(key) for key in path)


# --- node kinds: one row per kind of container, saying how to take it apart and rebuild it ---

class _NodeKind(NamedTuple):
    flatten: Callable[[Any], tuple[Iterable[Any], Hashable]]   # obj -> (children, aux data)
    unflatten: Callable[[Any, Any, tuple[Any, ...]], Any]       # (cls, aux, children) -> obj
    child_keys: Callable[[Any, Any, int], list[KeyEntry]]      # (cls, aux, n_children) -> keys
    describe: Callable[[Any, Any, list[str]], str]              # (cls, aux, child reprs) -> repr


def _sorted_keys(mapping: dict) -> tuple:
    """Dict children come in sorted key order, so `{'b':.., 'a':..}` and `{'a':.., 'b':..}` share
    one TreeDef (as in JAX). Keys that cannot be compared with each other, such as 1 and "a", raise
    a ValueError, as JAX's flatten does (use an OrderedDict, which keeps its order, or keys of one type)."""
    try:
        return tuple(sorted(mapping))
    except TypeError:
        raise _unsortable(list(mapping)) from None


@functools.cache
def _fields_of(cls: Any) -> tuple[tuple[str, bool], ...]:
    """(name, is_static) for each field of a dataclass or attrs class, in declaration order."""
    if dataclasses.is_dataclass(cls):
        return tuple((f.name, bool(f.metadata.get("static", False))) for f in dataclasses.fields(cls))
    return tuple((a.name, bool(a.metadata.get("static", False))) for a in attrs.fields(cls))


def _flatten_fields(obj: Any) -> tuple[list[Any], tuple[Any, ...]]:
    fields = _fields_of(obj.__class__)
    children = [getattr(obj, name) for name, static in fields if not static]
    return children, tuple(getattr(obj, name) for name, static in fields if static)


def _unflatten_fields(cls: type, aux: tuple[Any, ...], children: tuple[Any, ...]) -> Any:
    # __init__ and __post_init__ may validate or convert arguments, and transforms rebuild objects
    # with tracers or None as leaves, so rebuild by setting fields directly. object.__setattr__
    # gets past frozen dataclasses/attrs classes and works for __slots__.
    obj: Any = object.__new__(cls)
    data, statics = iter(children), iter(aux)
    for name, static in _fields_of(cls):
        object.__setattr__(obj, name, next(statics) if static else next(data))
    return obj


def _describe_fields(cls: type, aux: tuple[Any, ...], parts: list[str]) -> str:
    data, statics = iter(parts), iter(aux)
    items = [f"{name}={next(statics)!r}" if static else f"{name}={next(data)}"
             for name, static in _fields_of(cls)]
    return f"{cls.__name__}({', '.join(items)})"


def _flatten_dict(d: dict) -> tuple[list[Any], tuple]:
    keys = _sorted_keys(d)
    return [d[key] for key in keys], keys


def _index_keys(cls: type, aux: Any, n: int) -> list[KeyEntry]:
    return [SequenceKey(i) for i in range(n)]


def _hook_keys(cls: type, aux: Any, n: int) -> list[KeyEntry]:
    # a hook class may name its children (nn.Module gives GetAttrKey('weight')); else indices
    name_children = getattr(cls, "__funcgrad_keys__", None)
    return list(name_children(aux)) if name_children is not None else _index_keys(cls, aux, n)


def _describe_custom(cls: type, aux: Any, parts: list[str]) -> str:
    shown_aux = "" if aux is None else f"[{aux!r}]"
    return f"{cls.__name__}{shown_aux}({', '.join(parts)})"


_TUPLE = _NodeKind(
    lambda t: (t, None), lambda cls, aux, ch: tuple(ch), _index_keys,
    lambda cls, aux, parts: f"({parts[0]},)" if len(parts) == 1 else f"({', '.join(parts)})")
_LIST = _NodeKind(
    lambda xs: (xs, None), lambda cls, aux, ch: list(ch), _index_keys,
    lambda cls, aux, parts: f"[{', '.join(parts)}]")
_DICT = _NodeKind(
    _flatten_dict,
    lambda cls, aux, ch: dict(zip(aux, ch)),
    lambda cls, aux, n: [DictKey(k) for k in aux],
    lambda cls, aux, parts: "{" + ", ".join(f"{k!r}: {p}" for k, p in zip(aux, parts)) + "}")
_ORDERED_DICT = _NodeKind(
    lambda d: (list(d.values()), tuple(d)),
    lambda cls, aux, ch: collections.OrderedDict(zip(aux, ch)),
    lambda cls, aux, n: [DictKey(k) for k in aux],
    lambda cls, aux, parts: "OrderedDict({" + ", ".join(f"{k!r}: {p}" for k, p in zip(aux, parts)) + "})")
_NONE = _NodeKind(lambda _: ((), None), lambda cls, aux, ch: None, _index_keys, lambda *_: "None")
_NAMEDTUPLE = _NodeKind(
    lambda t: (t, None), lambda cls, aux, ch: cls(*ch),
    lambda cls, aux, n: [GetAttrKey(name) for name in cls._fields],
    lambda cls, aux, parts: f"{cls.__name__}({', '.join(f'{n}={p}' for n, p in zip(cls._fields, parts))})")
_FIELDS = _NodeKind(
    _flatten_fields, _unflatten_fields,
    lambda cls, aux, n: [GetAttrKey(name) for name, static in _fields_of(cls) if not static],
    _describe_fields)
_STATIC = _NodeKind(lambda obj: ((), obj), lambda cls, aux, ch: aux, _index_keys,
                    lambda cls, aux, parts: repr(aux))
_HOOK = _NodeKind(lambda obj: obj.__funcgrad_flatten__(),
                  lambda cls, aux, ch: cls.__funcgrad_unflatten__(aux, ch), _hook_keys, _describe_custom)

_registry: dict[type, _NodeKind] = {
    tuple: _TUPLE, list: _LIST, dict: _DICT, collections.OrderedDict: _ORDERED_DICT, type(None): _NONE,
}
_kind_cache: dict[type, _NodeKind | None] = {}   # type -> kind, or None for a leaf type


def _find_kind(cls: type) -> _NodeKind | None:
    if cls in _registry:
        return _registry[cls]
    if hasattr(cls, "__funcgrad_flatten__"):
        return _HOOK
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        return _NAMEDTUPLE
    if dataclasses.is_dataclass(cls) or attrs.has(cls):
        return _FIELDS
    return None


def _kind_of(cls: type) -> _NodeKind | None:
    try:
        return _kind_cache[cls]
    except KeyError:
        kind = _kind_cache[cls] = _find_kind(cls)
        return kind


def _add_kind(cls: type, kind: _NodeKind) -> None:
    if cls in _registry:
        raise ValueError(f"{cls.__qualname__} is already registered as a pytree node; register each "
                         "class once, next to its definition.")
    _registry[cls] = kind
    _kind_cache.pop(cls, None)
    _seen_types.discard(cls)
    _checked.clear()
    if cls in _in_optree:  # found before as a dataclass/attrs/hook node: its new rules replace those
        optree.unregister_pytree_node(cls, namespace=_NAMESPACE)
        _in_optree.discard(cls)
    _ensure_in_optree(cls, kind)


def register(cls: type, flatten_fn: Callable[[Any], tuple[Iterable[Any], Hashable]],
             unflatten_fn: Callable[[Any, tuple[Any, ...]], Any]) -> None:
    """Make instances of `cls` pytree nodes. `flatten_fn(obj) -> (children, aux)`, where `aux` is
    hashable and goes into the TreeDef; `unflatten_fn(aux, children) -> obj`.

    >>> register(Pair, lambda p: ((p.a, p.b), None), lambda aux, ch: Pair(*ch))
    """
    rebuild = lambda cls, aux, children: unflatten_fn(aux, children)
    _add_kind(cls, _NodeKind(flatten_fn, rebuild, _index_keys, _describe_custom))


def register_static(cls: T) -> T:
    """Make instances of `cls` leaf-less nodes kept whole in the TreeDef (so they must be hashable);
    transforms then treat them as constants. Usable as a class decorator."""
    _add_kind(cls, _STATIC)
    return cls


# --- optree: the C++ walk under flatten/unflatten ---
#
# optree (a maintained C++ pytree library) does the walking, the PyTreeSpec (with C++ hashing and
# equality) and the rebuilding; this module keeps what funcgrad defines on top: which types are
# nodes (found by exact type, lazily for dataclasses, attrs classes and hook classes, which are
# registered with optree, in funcgrad's own namespace, on first sight), JAX's rules where optree's
# differ (dicts rebuilt in sorted key order, dicts with keys that do not sort refused; defaultdict,
# deque and structseq leaves), the messages, key paths, reprs and pickling.

_NAMESPACE = "funcgrad"
_NATIVE = (_TUPLE, _LIST, _DICT, _ORDERED_DICT, _NONE, _NAMEDTUPLE)   # optree knows these itself
_in_optree: set[type] = set()        # the classes registered with optree under _NAMESPACE
_seen_types: set[type] = set()       # leaf types already classified (never a node type)
_Kind = optree.PyTreeKind
_GUARDED = {_Kind.DEFAULTDICT, _Kind.DEQUE, _Kind.STRUCTSEQUENCE} | (
    {_Kind.FROZENDICT} if hasattr(_Kind, "FROZENDICT") else set())   # optree nodes, funcgrad leaves
_NEEDS_GUARD = object()              # a _checked value: flatten again, keeping _GUARDED types whole
_CHECKED_MAX = 4096


def _state(spec: optree.PyTreeSpec) -> Any:
    """optree's pickle state of a spec: (nodes in post-order, none_is_leaf, namespace), each node
    (kind, arity, data, entries, custom type, leaves, nodes, a dict's keys in insertion order)."""
    return spec.__getstate__()  # type: ignore[attr-defined]


def _from_state(state: Any) -> optree.PyTreeSpec:
    spec = optree.PyTreeSpec.__new__(optree.PyTreeSpec)
    spec.__setstate__(state)  # type: ignore[attr-defined]
    return spec


def _ensure_in_optree(cls: type, kind: _NodeKind) -> None:
    if kind in _NATIVE or cls in _in_optree:
        return

    def flatten_node(obj: Any) -> tuple[Iterable[Any], Hashable]:
        return kind.flatten(obj)

    def unflatten_node(aux: Any, children: Iterable[Any]) -> Any:
        return kind.unflatten(cls, aux, tuple(children))

    with _registering:  # two threads meeting a new class at once register it once
        if cls not in _in_optree:
            optree.register_pytree_node(cls, flatten_node, unflatten_node, namespace=_NAMESPACE)
            _in_optree.add(cls)
            _registrations[0] += 1


_registering = threading.Lock()
_registrations = [0]  # classes registered with optree so far: a flatten notes the count when it starts


def _classify(types: set[type], registrations: int) -> bool:
    """Note each new leaf type; True if the flatten that found ``types`` (begun when ``registrations``
    classes were registered) must run again: one of them is a node type optree did not know then. A
    registered node type found as a leaf is one that ``is_leaf`` kept whole, unless it was registered
    while that flatten ran (by another thread: its flatten met the class first, as a leaf)."""
    again = False
    for cls in types - _seen_types:
        kind = _kind_of(cls)
        if kind is None:
            _seen_types.add(cls)
        elif kind not in _NATIVE:
            if cls not in _in_optree:
                _ensure_in_optree(cls, kind)
                again = True
            elif registrations != _registrations[0]:
                again = True
    return again


_kept_whole_cache: dict[type, bool] = {}


def _kept_whole(cls: type) -> bool:
    try:
        return _kept_whole_cache[cls]
    except KeyError:
        kept = _kept_whole_cache[cls] = cls in (collections.defaultdict, collections.deque) or bool(
            optree.is_structseq_class(cls)) or getattr(collections, "frozendict", None) is cls
        return kept


def _guard(is_leaf: IsLeaf) -> Callable[[Any], bool]:
    if is_leaf is None:
        return lambda x: _kept_whole(type(x))
    return lambda x: _kept_whole(type(x)) or bool(is_leaf(x))


def _node_of(kind: Any, data: Any, custom_type: Any) -> tuple[type, Any]:
    """(node type, funcgrad aux data) of one node of a PyTreeSpec's state."""
    if kind == _Kind.CUSTOM:
        return custom_type, data
    if kind == _Kind.DICT:
        return dict, tuple(data)
    if kind == _Kind.ORDEREDDICT:
        return collections.OrderedDict, tuple(data)
    if kind == _Kind.NAMEDTUPLE:
        return data, None
    builtin: dict[Any, type] = {_Kind.NONE: type(None), _Kind.TUPLE: tuple, _Kind.LIST: list}
    return builtin[kind], None


def _unsortable(keys: list) -> ValueError:
    types_seen = sorted({type(key).__name__ for key in keys})
    return ValueError(f"tree.flatten: the keys of a dict must be sortable, but these cannot be compared "
                      f"with each other (key types {', '.join(types_seen)}): {keys!r}; use keys of one "
                      "type, or an OrderedDict (flattened in its own order)")


def _check(spec: optree.PyTreeSpec) -> tuple[Any, bool]:
    """What to keep for a new structure: None (``spec`` as it is), a spec whose dicts rebuild in
    sorted key order (optree keeps each dict's insertion order), or _NEEDS_GUARD. Raises for dict
    keys that do not sort and for unhashable aux data (optree's hash leaves custom nodes' data out,
    while equality compares it). Runs once per distinct structure: the result is cached (the
    second value says whether), except for structures whose custom aux data says
    ``__funcgrad_uncached__`` (it holds large values, such as a linearization's residuals, which a
    cache would keep alive)."""
    nodes, *rest = _state(spec)
    fixed = list(nodes)
    changed, cacheable = False, True
    for i, (kind, _arity, data, _entries, _custom, _leaves, _nodes, original) in enumerate(nodes):
        if kind in _GUARDED:
            return _NEEDS_GUARD, False  # rare: not kept, so nothing in it stays alive
        if kind == _Kind.CUSTOM:
            try:
                hash(data)
            except TypeError:
                raise _unhashable(spec) from None
            if getattr(data, "__funcgrad_uncached__", False):
                cacheable = False
        if kind != _Kind.DICT:
            continue
        keys = list(original) if original is not None else list(data)
        try:
            in_order = sorted(keys)
        except TypeError:
            raise _unsortable(keys) from None
        if keys != in_order:
            node = list(nodes[i])
            node[7] = dict.fromkeys(in_order)
            fixed[i], changed = tuple(node), True
    return (_from_state((tuple(fixed), *rest)) if changed else None), cacheable


def _unhashable(spec: optree.PyTreeSpec) -> TypeError:
    for kind, _arity, data, _entries, custom, *_ in _state(spec)[0]:
        try:
            hash(data)
        except TypeError:
            node_type = _node_of(kind, data, custom)[0]
            return TypeError(
                f"a {getattr(node_type, '__qualname__', node_type)} node carries unhashable data "
                f"{data!r}; static fields, register_static instances and custom aux data become "
                "part of the TreeDef, which is a jit cache key, so they must be hashable (use a tuple, "
                "not a list).")
    return TypeError(f"a PyTreeDef of {spec} is not hashable")


def _optree_flatten(tree: PyTree, is_leaf: IsLeaf) -> tuple[list[Any], TreeDef]:
    registrations = _registrations[0]
    leaves_out, spec = optree.tree_flatten(tree, is_leaf, namespace=_NAMESPACE)
    if not _seen_types.issuperset(builtins.map(type, leaves_out)) and _classify(set(builtins.map(type, leaves_out)),
                                                                               registrations):
        return _optree_flatten(tree, is_leaf)
    treedef = TreeDef._wrap(spec)
    try:
        kept = _checked[treedef]
    except KeyError:
        kept, cacheable = _check(spec)
        if cacheable:
            if len(_checked) >= _CHECKED_MAX:
                _checked.clear()
            _checked[treedef] = kept
    if kept is _NEEDS_GUARD:
        return _optree_flatten(tree, _guard(is_leaf))
    if kept is not None:
        treedef = TreeDef._wrap(kept)
    return leaves_out, treedef


# --- TreeDef ---

class TreeDef:
    """The structure of a pytree without its leaves: immutable, hashable, compared structurally
    (a wrapper of optree's PyTreeSpec).

    >>> structure({'a': 1, 'b': (2, None)})
    PyTreeDef({'a': *, 'b': (*, None)})
    """

    __slots__ = ("_spec", "_hash")
    _spec: optree.PyTreeSpec
    _hash: int                    # precomputed: TreeDefs are hashed on every jit call

    def __init__(self) -> None:
        raise TypeError("TreeDefs come from tree.flatten / tree.structure")

    @classmethod
    def _wrap(cls, spec: optree.PyTreeSpec) -> TreeDef:
        try:
            spec_hash = hash(spec)
        except TypeError:
            raise _unhashable(spec) from None
        self = object.__new__(cls)
        object.__setattr__(self, "_spec", spec)
        object.__setattr__(self, "_hash", spec_hash)
        return self

    @property
    def node_type(self) -> type | None:
        """The root node's type; None for a leaf."""
        return self._spec.type

    @property
    def node_data(self) -> Any:
        """The root node's aux data: a dict's sorted keys, static fields, custom aux data, ..."""
        if self._spec.is_leaf():
            return None
        kind, _arity, data, _entries, custom, *_ = _state(self._spec)[0][-1]
        return _node_of(kind, data, custom)[1]

    @property
    def num_leaves(self) -> int:
        return self._spec.num_leaves

    @property
    def num_nodes(self) -> int:
        """Nodes including leaves, as in JAX."""
        return self._spec.num_nodes

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("TreeDef is immutable")

    def __copy__(self) -> TreeDef:
        return self  # immutable, so sharing is the same as copying

    def __deepcopy__(self, memo: dict) -> TreeDef:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # pickled as optree's state with the custom node classes named first: loading registers
        # their rules (found from the classes, or registered by importing their modules) before it
        state = _state(self._spec)
        custom = tuple(dict.fromkeys(node[4] for node in state[0] if node[0] == _Kind.CUSTOM))
        return _rebuild_treedef, (custom, state)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, TreeDef):
            return NotImplemented
        return self._hash == other._hash and self._spec == other._spec

    def children(self) -> list[TreeDef]:
        """TreeDefs of this node's direct children."""
        return [TreeDef._wrap(child) for child in self._spec.children()]

    def unflatten(self, leaves: Iterable[Any]) -> PyTree:
        """Build a tree of this structure from `leaves`, in flatten order."""
        leaves = list(leaves)
        if len(leaves) != self._spec.num_leaves:
            raise ValueError(f"unflatten: {self} has {self.num_leaves} leaves but {len(leaves)} "
                             "leaves were given.")
        return self._spec.unflatten(leaves)

    def flatten_up_to(self, tree: PyTree) -> list[Any]:
        """The subtrees of ``tree`` at this structure's leaf positions (``tree`` must have this
        structure down to them)."""
        try:
            return self._spec.flatten_up_to(tree)
        except (ValueError, TypeError) as error:
            raise ValueError(f"tree {tree!r} does not have the structure {self} ({error})") from None

    def _nodes(self) -> Any:
        """The structure as nested ``(node type, aux, kind, children)``, None for a leaf."""
        stack: list[Any] = []
        for kind, arity, data, _entries, custom, *_ in _state(self._spec)[0]:
            if kind == _Kind.LEAF:
                stack.append(None)
                continue
            children = stack[len(stack) - arity:]
            del stack[len(stack) - arity:]
            node_type, aux = _node_of(kind, data, custom)
            stack.append((node_type, aux, _kind_of(node_type), children))
        return stack[0]

    def _paths(self, prefix: KeyPath, out: list[KeyPath]) -> None:
        def walk(node: Any, path: KeyPath) -> None:
            if node is None:
                out.append(path)
                return
            node_type, aux, kind, children = node
            for key, child in zip(kind.child_keys(node_type, aux, len(children)), children):
                walk(child, path + (key,))
        walk(self._nodes(), prefix)

    def __repr__(self) -> str:
        def describe(node: Any) -> str:
            if node is None:
                return "*"
            node_type, aux, kind, children = node
            return kind.describe(node_type, aux, [describe(child) for child in children])
        return f"PyTreeDef({describe(self._nodes())})"


_checked: dict[TreeDef, Any] = {}   # a structure as optree gave it -> what _check said of it


def _rebuild_treedef(custom: tuple[type, ...], state: tuple[Any, ...]) -> TreeDef:
    for node_type in custom:
        kind = _kind_of(node_type)
        if kind is None:
            raise TypeError(f"cannot unpickle a PyTreeDef of {node_type.__qualname__}: the class is not registered "
                            "as a pytree node in this process; import the module that registers it first")
        _ensure_in_optree(node_type, kind)
    return TreeDef._wrap(_from_state(state))


# --- public functions ---

def flatten(tree: PyTree, is_leaf: IsLeaf = None) -> tuple[list[Any], TreeDef]:
    """Leaves of `tree` in a fixed order, and its structure. `is_leaf(x)` True stops descent at x.

    >>> flatten({'b': [2, 3], 'a': 1})
    ([1, 2, 3], PyTreeDef({'a': *, 'b': [*, *]}))
    """
    return _optree_flatten(tree, is_leaf)



def unflatten(treedef: TreeDef, leaves: Iterable[Any]) -> PyTree:
    """Inverse of `flatten`: `unflatten(structure((1, [2])), 'xy') == ('x', ['y'])`."""
    return treedef.unflatten(leaves)


def leaves(tree: PyTree, is_leaf: IsLeaf = None) -> list[Any]:
    """Just the leaves: `leaves({'a': 1, 'b': (2, None)}) == [1, 2]`."""
    return flatten(tree, is_leaf)[0]


def structure(tree: PyTree, is_leaf: IsLeaf = None) -> TreeDef:
    """Just the TreeDef: `structure((1, [2])) == structure((7, [8]))`."""
    return flatten(tree, is_leaf)[1]


def map(fn: Callable[..., Any], tree: PyTree, *rest: PyTree, is_leaf: IsLeaf = None) -> PyTree:
    """Apply `fn` leafwise across trees of identical structure, keeping that structure.

    >>> map(lambda x, y: x + y, {'a': 1, 'b': 2}, {'a': 10, 'b': 20})
    {'a': 11, 'b': 22}
    """
    first_leaves, treedef = flatten(tree, is_leaf)
    all_leaves = [first_leaves]
    for position, other in enumerate(rest, start=2):
        other_leaves, other_def = flatten(other, is_leaf)
        if other_def != treedef:
            raise ValueError(f"map: tree {position} has a different structure from tree 1; all trees "
                             f"must match exactly.\n  tree 1: {treedef}\n  tree {position}: {other_def}")
        all_leaves.append(other_leaves)
    return treedef.unflatten([fn(*args) for args in zip(*all_leaves)])


def flatten_with_path(tree: PyTree, is_leaf: IsLeaf = None) -> tuple[list[tuple[KeyPath, Any]], TreeDef]:
    """``(pairs, treedef)``: each leaf with the path that reaches it, in flatten order, and the
    structure (as JAX's ``tree_flatten_with_path``; ``leaves_with_path`` gives just the pairs).

    >>> pairs, _ = flatten_with_path({'params': [Linear(weight=1)]}); [(keystr(p), x) for p, x in pairs]
    [("['params'][0].weight", 1)]
    """
    leaves_out, treedef = flatten(tree, is_leaf)
    paths: list[KeyPath] = []
    treedef._paths((), paths)
    return list(zip(paths, leaves_out)), treedef


def leaves_with_path(tree: PyTree, is_leaf: IsLeaf = None) -> list[tuple[KeyPath, Any]]:
    """Each leaf with the path that reaches it, in flatten order.

    >>> [(keystr(p), x) for p, x in leaves_with_path({'params': [Linear(weight=1)]})]
    [("['params'][0].weight", 1)]
    """
    return flatten_with_path(tree, is_leaf)[0]


def map_with_path(fn: Callable[..., Any], tree: PyTree, *rest: PyTree, is_leaf: IsLeaf = None) -> PyTree:
    """``map`` whose ``fn(path, leaf, *others)`` also gets each leaf's path."""
    pairs, treedef = flatten_with_path(tree, is_leaf)
    others = []
    for position, other in enumerate(rest, start=2):
        other_leaves, other_def = flatten(other, is_leaf)
        if other_def != treedef:
            raise ValueError(f"map_with_path: tree {position} has a different structure from tree 1.\n"
                             f"  tree 1: {treedef}\n  tree {position}: {other_def}")
        others.append(other_leaves)
    return treedef.unflatten([fn(path, leaf, *more) for (path, leaf), *more in zip(pairs, *others)]
                             if others else [fn(path, leaf) for path, leaf in pairs])


def reduce(fn: Callable[[Any, Any], Any], tree: PyTree, *initializer: Any, is_leaf: IsLeaf = None) -> Any:
    """``functools.reduce`` over the leaves of ``tree``."""
    return functools.reduce(fn, leaves(tree, is_leaf), *initializer)


def all(tree: PyTree, is_leaf: IsLeaf = None) -> bool:  # noqa: A001 - jax.tree.all
    """Whether every leaf is truthy."""
    return builtins.all(leaves(tree, is_leaf))


def transpose(outer: TreeDef | None, inner: TreeDef | None, tree: PyTree) -> PyTree:
    """Turn a tree of structure ``outer`` whose leaves-level entries are trees of structure
    ``inner`` into a tree of structure ``inner`` of trees of structure ``outer`` (as JAX's
    ``tree.transpose``; ``inner`` None: taken from the first entry).

    >>> transpose(structure([0, 0]), structure((0, 0)), [(1, 2), (3, 4)])
    ([1, 3], [2, 4])
    """
    if outer is None:
        raise TypeError("tree.transpose needs the outer structure (a TreeDef)")
    entries = outer.flatten_up_to(tree)
    if inner is None:
        if not entries:
            raise ValueError("tree.transpose: inner=None needs at least one entry to take the structure from")
        inner = structure(entries[0])
    columns = [inner.flatten_up_to(entry) for entry in entries]
    per_inner_leaf = [outer.unflatten([column[i] for column in columns]) for i in range(inner.num_leaves)]
    return inner.unflatten(per_inner_leaf)


def register_pytree_node(cls: type, flatten_fn: Callable[[Any], tuple[Iterable[Any], Hashable]],
                         unflatten_fn: Callable[[Any, tuple[Any, ...]], Any]) -> None:
    """JAX's name for ``register``."""
    register(cls, flatten_fn, unflatten_fn)


def register_pytree_node_class(cls: T) -> T:
    """Register a class with ``tree_flatten(self) -> (children, aux)`` and the classmethod
    ``tree_unflatten(aux, children)`` (a class decorator, as JAX's)."""
    for method in ("tree_flatten", "tree_unflatten"):
        if not callable(getattr(cls, method, None)):
            raise TypeError(f"register_pytree_node_class: {cls.__qualname__} has no {method} method")
    rebuild: Any = cls
    register(cls, lambda obj: obj.tree_flatten(), lambda aux, children: rebuild.tree_unflatten(aux, children))
    return cls


def register_dataclass(cls: T, data_fields: Iterable[str] | None = None,
                       meta_fields: Iterable[str] | None = None, drop_fields: Iterable[str] = ()) -> T:
    """Register a class whose ``data_fields`` are children and ``meta_fields`` static (in the TreeDef),
    as JAX's ``register_dataclass``; for a dataclass both default to its fields, split by a
    ``static=True`` field metadata. Usable as a class decorator. Unflattening sets the fields
    directly (``__init__`` is not called)."""
    dropped = set(drop_fields)
    if data_fields is None and meta_fields is None:
        if not dataclasses.is_dataclass(cls):
            raise TypeError(f"register_dataclass: {cls.__qualname__} is not a dataclass; pass data_fields and "
                            "meta_fields")
        fields = [f for f in dataclasses.fields(cls) if f.name not in dropped]
        data = [f.name for f in fields if not f.metadata.get("static", False)]
        meta = [f.name for f in fields if f.metadata.get("static", False)]
    elif data_fields is None or meta_fields is None:
        raise TypeError("register_dataclass: give both data_fields and meta_fields, or neither")
    else:
        data, meta = list(data_fields), list(meta_fields)
        if dataclasses.is_dataclass(cls):
            names = {f.name for f in dataclasses.fields(cls) if f.init} - dropped
            missing = names - set(data) - set(meta)
            if missing:
                raise ValueError(f"register_dataclass: the fields {sorted(missing)} of {cls.__qualname__} are "
                                 "in neither data_fields nor meta_fields (nor drop_fields)")
    data_names, meta_names = tuple(data), tuple(meta)

    def flatten_fn(obj: Any) -> tuple[list[Any], tuple[Any, ...]]:
        return [getattr(obj, name) for name in data_names], tuple(getattr(obj, name) for name in meta_names)

    def unflatten_fn(aux: tuple[Any, ...], children: tuple[Any, ...]) -> Any:
        obj: Any = object.__new__(cls)
        for name, value in zip(data_names, children):
            object.__setattr__(obj, name, value)
        for name, value in zip(meta_names, aux):
            object.__setattr__(obj, name, value)
        return obj

    def keys(cls_: type, aux: Any, n: int) -> list[KeyEntry]:
        return [GetAttrKey(name) for name in data_names]

    def describe(cls_: type, aux: Any, parts: list[str]) -> str:
        items = [f"{name}={part}" for name, part in zip(data_names, parts)]
        items += [f"{name}={value!r}" for name, value in zip(meta_names, aux)]
        return f"{cls_.__name__}({', '.join(items)})"

    _add_kind(cls, _NodeKind(flatten_fn, lambda c, aux, children: unflatten_fn(aux, children), keys, describe))
    return cls


def broadcast_prefix(prefix: PyTree, full: PyTree, is_leaf: IsLeaf = None) -> list[Any]:
    """One entry of ``prefix`` per leaf of ``full``, where ``prefix`` is a tree prefix of ``full``
    (vmap's ``in_axes`` style): a leaf of ``prefix`` applies to the whole subtree under it. Here
    ``None`` in ``prefix`` is a leaf ("not mapped"), not an empty node.

    >>> broadcast_prefix((0, None), ([1, 2], {"a": 3}))
    [0, 0, None]
    """
    result: list[Any] = []

    def one_level(node: PyTree) -> tuple[list[Any], TreeDef]:
        return flatten(node, is_leaf=lambda child: child is not node)

    def walk(p: PyTree, f: PyTree) -> None:
        if p is None or (is_leaf is not None and is_leaf(p)) or _kind_of(type(p)) is None:
            result.extend([p] * len(leaves(f)))
            return
        p_children, p_def = one_level(p)
        f_children, f_def = one_level(f)
        if p_def != f_def:
            raise ValueError(f"the prefix tree {structure(p)} does not match "
                             f"the argument tree {structure(f)}")
        for pc, fc in zip(p_children, f_children):
            walk(pc, fc)

    walk(prefix, full)
    return result
