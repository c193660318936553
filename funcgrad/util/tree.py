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
"""

from __future__ import annotations

import builtins
import collections
import dataclasses
import functools
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any, NamedTuple, TypeVar

import attrs

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
        types_seen = sorted({type(key).__name__ for key in mapping})
        raise ValueError(f"tree.flatten: the keys of a dict must be sortable, but these cannot be compared "
                         f"with each other (key types {', '.join(types_seen)}): {list(mapping)!r}; use keys of one "
                         "type, or an OrderedDict (flattened in its own order)") from None


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


# --- TreeDef ---

class TreeDef:
    """The structure of a pytree without its leaves: immutable, hashable, compared structurally.

    >>> structure({'a': 1, 'b': (2, None)})
    PyTreeDef({'a': *, 'b': (*, None)})
    """

    __slots__ = ("node_type", "node_data", "_children", "_kind", "num_leaves", "num_nodes", "_hash")
    node_type: type | None        # None for a leaf
    node_data: Any                # the node's aux data: dict keys, static fields, ...
    num_leaves: int
    num_nodes: int                # nodes including leaves, as in JAX
    _children: tuple[TreeDef, ...]
    _kind: _NodeKind | None       # how to rebuild; not part of equality (node_type decides it)
    _hash: int                    # precomputed: TreeDefs are hashed on every jit call

    def __init__(self, kind: _NodeKind | None, node_type: type | None, node_data: Any,
                 children: tuple[TreeDef, ...]) -> None:
        try:
            node_hash = hash((node_type, node_data, children))
        except TypeError:
            raise TypeError(
                f"a {getattr(node_type, '__qualname__', node_type)} node carries unhashable data "
                f"{node_data!r}; static fields, register_static instances and custom aux data become "
                "part of the TreeDef, which is a jit cache key, so they must be hashable (use a tuple, "
                "not a list).") from None
        set_ = functools.partial(object.__setattr__, self)
        set_("node_type", node_type)
        set_("node_data", node_data)
        set_("_children", children)
        set_("_kind", kind)
        set_("num_leaves", 1 if node_type is None else sum(c.num_leaves for c in children))
        set_("num_nodes", 1 + sum(c.num_nodes for c in children))
        set_("_hash", node_hash)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("TreeDef is immutable")

    def __copy__(self) -> TreeDef:
        return self  # immutable, so sharing is the same as copying

    def __deepcopy__(self, memo: dict) -> TreeDef:
        return self

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        # pickled by node type, data and children; loading finds the node type's rules in the registry
        return _rebuild_treedef, (self.node_type, self.node_data, self._children)

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, TreeDef):
            return NotImplemented
        return (self._hash == other._hash and self.node_type is other.node_type
                and self.node_data == other.node_data and self._children == other._children)

    def children(self) -> list[TreeDef]:
        """TreeDefs of this node's direct children."""
        return list(self._children)

    def unflatten(self, leaves: Iterable[Any]) -> PyTree:
        """Build a tree of this structure from `leaves`, in flatten order."""
        leaves = list(leaves)
        if len(leaves) != self.num_leaves:
            raise ValueError(f"unflatten: {self} has {self.num_leaves} leaves but {len(leaves)} "
                             "leaves were given.")
        return self._build(iter(leaves))

    def _build(self, leaves: Iterator[Any]) -> PyTree:
        if self._kind is None:
            return next(leaves)
        children = tuple([child._build(leaves) for child in self._children])
        return self._kind.unflatten(self.node_type, self.node_data, children)

    def flatten_up_to(self, tree: PyTree) -> list[Any]:
        """The subtrees of ``tree`` at this structure's leaf positions (``tree`` must have this
        structure down to them)."""
        out: list[Any] = []
        self._up_to(tree, out)
        return out

    def _up_to(self, tree: PyTree, out: list[Any]) -> None:
        if self._kind is None:
            out.append(tree)
            return
        kind = _kind_of(type(tree))
        if type(tree) is not self.node_type or kind is None:
            raise ValueError(f"tree {tree!r} does not have the structure {self} (a "
                             f"{getattr(self.node_type, '__name__', self.node_type)} node was expected, got "
                             f"{type(tree).__name__})")
        children, aux = kind.flatten(tree)
        children = list(children)
        if aux != self.node_data or len(children) != len(self._children):
            raise ValueError(f"tree {tree!r} does not have the structure {self}")
        for child_def, child in zip(self._children, children):
            child_def._up_to(child, out)

    def _describe(self) -> str:
        if self._kind is None:
            return "*"
        parts = [child._describe() for child in self._children]
        return self._kind.describe(self.node_type, self.node_data, parts)

    def _paths(self, prefix: KeyPath, out: list[KeyPath]) -> None:
        if self._kind is None:
            out.append(prefix)
            return
        keys = self._kind.child_keys(self.node_type, self.node_data, len(self._children))
        for key, child in zip(keys, self._children):
            child._paths(prefix + (key,), out)

    def __repr__(self) -> str:
        return f"PyTreeDef({self._describe()})"


_LEAF = TreeDef(None, None, None, ())


def _rebuild_treedef(node_type: type | None, node_data: Any, children: tuple[TreeDef, ...]) -> TreeDef:
    if node_type is None:
        return _LEAF
    kind = _kind_of(node_type)
    if kind is None:
        raise TypeError(f"cannot unpickle a PyTreeDef of {node_type.__qualname__}: the class is not registered as a "
                        "pytree node in this process; import the module that registers it first")
    return TreeDef(kind, node_type, node_data, children)


# --- public functions ---

def _flatten_into(tree: PyTree, is_leaf: IsLeaf, leaves: list[Any]) -> TreeDef:
    kind = None if is_leaf is not None and is_leaf(tree) else _kind_of(type(tree))
    if kind is None:
        leaves.append(tree)
        return _LEAF
    children, aux = kind.flatten(tree)
    return TreeDef(kind, type(tree), aux, tuple([_flatten_into(c, is_leaf, leaves) for c in children]))


def flatten(tree: PyTree, is_leaf: IsLeaf = None) -> tuple[list[Any], TreeDef]:
    """Leaves of `tree` in a fixed order, and its structure. `is_leaf(x)` True stops descent at x.

    >>> flatten({'b': [2, 3], 'a': 1})
    ([1, 2, 3], PyTreeDef({'a': *, 'b': [*, *]}))
    """
    leaves_out: list[Any] = []
    treedef = _flatten_into(tree, is_leaf, leaves_out)
    return leaves_out, treedef


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
