"""nn.Module: a plain Python class whose instances are pytrees automatically.

Attributes that hold arrays -- Tensors, NumPy arrays, Modules, or lists/tuples/dicts containing
them -- are the children; their Tensors are the leaves (parameters and buffers). Every other
attribute (ints, floats, strings, flags, None, functions) is static: it goes into the TreeDef and
is compared by value, so two modules built alike share one TreeDef and jit reuses its trace.
Rebuilding (``unflatten``) makes a new instance without calling ``__init__``, which is how
``fg.grad(loss)(model, x, y)`` returns a model-shaped tree of gradients.

Paths carry attribute names (``GetAttrKey('weight')``) and list indices, so
``tree.leaves_with_path(model)`` spells ``.layers[0].weight`` and ``named_parameters()`` gives
``layers.0.weight``, as PyTorch's state dicts do.

Training mode: ``model.train()`` / ``model.eval()`` set each module's own flag (PyTorch style).
A module whose flag was never set follows the global ``Tensor.training`` (tinygrad style,
``with Tensor.train(): ...``); so an explicit ``train()``/``eval()`` wins over the global flag.
The mode each module runs in is part of its TreeDef, so a jitted step traced in one mode is not
replayed in the other.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from funcgrad.autograd import is_training
from funcgrad.core.tensor import Tensor
from funcgrad.util import tree


class _ChildMarker:
    """The one object standing in a layout for an attribute that is a child (its value is a subtree);
    it unpickles as itself, so a pickled TreeDef still equals the original."""

    def __reduce__(self) -> str:
        return "_CHILD"

    def __repr__(self) -> str:
        return "<child>"


_CHILD = _ChildMarker()


class _ByRepr:
    """An unhashable static attribute (a list of ints, a dict of options) kept in the TreeDef and
    compared by its type and repr."""

    __slots__ = ("value", "_key")

    def __init__(self, value: Any) -> None:
        self.value = value
        self._key = (type(value), repr(value))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _ByRepr) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return repr(self.value)


class _Layout:
    """A module's aux data in its TreeDef: each attribute's name with its static value (or _CHILD),
    in attribute order, and the training mode the module runs in."""

    __slots__ = ("entries", "mode", "_hash")

    def __init__(self, entries: tuple[tuple[str, Any], ...], mode: bool) -> None:
        self.entries, self.mode = entries, mode
        self._hash = hash((entries, mode))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Layout) and self.mode == other.mode and self.entries == other.entries

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        statics = [f"{name}={value!r}" for name, value in self.entries if value is not _CHILD]
        return ", ".join(statics + [f"mode={'train' if self.mode else 'eval'}"])


def _is_array(value: Any) -> bool:
    return isinstance(value, (Tensor, np.ndarray))


_PLAIN_STATICS = (int, float, bool, str, type(None))


def _holds_arrays(value: Any) -> bool:
    """Whether an attribute value is a subtree of the module (holds a Tensor, array or Module)."""
    if isinstance(value, (Tensor, np.ndarray, Module)):
        return True
    if type(value) in _PLAIN_STATICS:
        return False
    leaves = tree.leaves(value, is_leaf=lambda x: isinstance(x, Module))
    return any(isinstance(leaf, (Tensor, np.ndarray, Module)) for leaf in leaves)


def _hashable(value: Any) -> Any:
    try:
        hash(value)
    except TypeError:
        return _ByRepr(value)
    return value


def _module_or_none(x: Any) -> bool:
    return x is None or isinstance(x, Module)


class _Mixed:
    """A container attribute holding arrays or modules next to other things, such as tinygrad's
    ``self.layers = [nn.Conv2d(1, 32, 5), Tensor.relu, ...]``: the child is the container with those
    other things replaced by None (so paths keep their indices), and they are kept here, static."""

    __slots__ = ("treedef", "statics", "_hash")

    def __init__(self, treedef: Any, statics: tuple[tuple[int, Any], ...]) -> None:
        self.treedef, self.statics = treedef, statics
        self._hash = hash((treedef, statics))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Mixed) and self.treedef == other.treedef and self.statics == other.statics

    def __hash__(self) -> int:
        return self._hash

    def __repr__(self) -> str:
        return f"<{len(self.statics)} static item(s)>"

    def merge(self, child: Any) -> Any:
        """Put the static items back into the (possibly transformed) child container."""
        leaves = tree.leaves(child, is_leaf=_module_or_none)
        for index, static in self.statics:
            leaves[index] = static.value if isinstance(static, _ByRepr) else static
        return tree.unflatten(self.treedef, leaves)


def _split_statics(value: Any) -> tuple[Any, _Mixed | None]:
    """``value`` itself when every item in it is an array or a module, else the container with the
    other items replaced by None and a ``_Mixed`` holding them."""
    if isinstance(value, (Tensor, np.ndarray, Module)):
        return value, None
    leaves, treedef = tree.flatten(value, is_leaf=_module_or_none)
    is_child = [isinstance(leaf, (Tensor, np.ndarray, Module)) for leaf in leaves]
    statics = tuple((i, _hashable(leaf)) for i, (leaf, child) in enumerate(zip(leaves, is_child)) if not child)
    if not statics:
        return value, None
    kept = [leaf if child else None for leaf, child in zip(leaves, is_child)]
    return tree.unflatten(treedef, kept), _Mixed(treedef, statics)


def _dotted(path: tree.KeyPath) -> str:
    """``(GetAttrKey('layers'), SequenceKey(0), GetAttrKey('weight'))`` -> ``'layers.0.weight'``."""
    return ".".join(str(entry.key) for entry in path)


class Module:
    """Base class of layers and models: subclass it, set Tensors and sub-modules as attributes in
    ``__init__``, and write ``forward`` (PyTorch style) or ``__call__`` (tinygrad style).

    >>> class MLP(Module):
    ...     def __init__(self):
    ...         self.layers = [Linear(4, 8), Linear(8, 2)]
    ...     def forward(self, x):
    ...         return self.layers[1](self.layers[0](x).relu())
    >>> grads = fg.grad(lambda m, x: m(x).sum())(MLP(), x)   # an MLP holding the gradients  # doctest: +SKIP
    """

    # --- pytree protocol (used by funcgrad.tree) -------------------------------------------------
    def __funcgrad_flatten__(self) -> tuple[list[Any], _Layout]:
        children: list[Any] = []
        entries: list[tuple[str, Any]] = []
        for name, value in vars(self).items():
            if _holds_arrays(value):
                child, statics = _split_statics(value)
                children.append(child)
                entries.append((name, _CHILD if statics is None else statics))
            else:
                entries.append((name, _hashable(value)))
        return children, _Layout(tuple(entries), self.training)

    @classmethod
    def __funcgrad_unflatten__(cls, layout: _Layout, children: tuple[Any, ...]) -> Module:
        module = object.__new__(cls)
        values = iter(children)
        attributes = module.__dict__
        for name, static in layout.entries:
            if static is _CHILD:
                attributes[name] = next(values)
            elif isinstance(static, _Mixed):
                attributes[name] = static.merge(next(values))
            else:
                attributes[name] = static.value if isinstance(static, _ByRepr) else static
        return module

    @classmethod
    def __funcgrad_keys__(cls, layout: _Layout) -> list[tree.KeyEntry]:
        return [tree.GetAttrKey(name) for name, static in layout.entries
                if static is _CHILD or isinstance(static, _Mixed)]

    # --- calling ---------------------------------------------------------------------------------
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.forward(*args, **kwargs)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines neither forward() nor __call__(); "
                                  "a Module subclass must define one of them")

    # --- training mode ---------------------------------------------------------------------------
    @property
    def training(self) -> bool:
        """The mode this module runs in: its own flag once ``train()``/``eval()`` set it, else the
        global ``Tensor.training``."""
        flag = self.__dict__.get("_training")
        return is_training() if flag is None else bool(flag)

    @training.setter
    def training(self, mode: bool | None) -> None:
        self.__dict__["_training"] = mode

    def train(self, mode: bool = True) -> Module:
        """Set this module and every sub-module to training mode (``mode=False``: evaluation).
        Returns ``self``, as PyTorch does."""
        if not isinstance(mode, bool):
            raise TypeError(f"{type(self).__name__}.train(mode): mode must be a bool, got {mode!r}")
        for module in self.modules():
            module.training = mode
        return self

    def eval(self) -> Module:
        """``train(False)``: dropout off, batch norm uses its running statistics."""
        return self.train(False)

    # --- walking the tree ------------------------------------------------------------------------
    def _named_children(self) -> Iterator[tuple[str, Module]]:
        """Direct sub-modules with their dotted names (``'fc'``, ``'layers.0'``)."""
        for name, value in vars(self).items():
            if isinstance(value, Module):
                yield name, value
            elif _holds_arrays(value) and not _is_array(value):
                for path, leaf in tree.leaves_with_path(value, is_leaf=lambda x: isinstance(x, Module)):
                    if isinstance(leaf, Module):
                        yield f"{name}.{_dotted(path)}", leaf

    def children(self) -> list[Module]:
        """The direct sub-modules, in attribute order."""
        return [module for _, module in self._named_children()]

    def modules(self) -> list[Module]:
        """This module and all its sub-modules, depth first (each once, even if shared)."""
        found: dict[int, Module] = {}
        pending = [self]
        while pending:
            module = pending.pop()
            if id(module) not in found:
                found[id(module)] = module
                pending.extend(reversed(module.children()))
        return list(found.values())

    def _buffer_names(self) -> tuple[str, ...]:
        return self.__dict__.get("_buffers", ())

    def register_buffer(self, name: str, value: Tensor) -> None:
        """Keep ``value`` as attribute ``name`` but as a buffer (state such as running statistics):
        it is a pytree leaf and in the state dict, but not among ``parameters()`` and never gets
        ``.grad``."""
        if not isinstance(value, Tensor):
            raise TypeError(f"register_buffer({name!r}): expected a Tensor, got {type(value).__name__}")
        value.requires_grad = False
        setattr(self, name, value)
        if name not in self._buffer_names():
            self.__dict__["_buffers"] = self._buffer_names() + (name,)

    def _named_tensors(self) -> Iterator[tuple[str, Tensor, bool]]:
        """(dotted name, Tensor, is_buffer) for every Tensor leaf, in flatten order."""
        for path, leaf in tree.leaves_with_path(self):
            if isinstance(leaf, Tensor):
                owner: Any = self
                for entry in path[:-1]:
                    owner = getattr(owner, entry.key) if isinstance(entry, tree.GetAttrKey) else owner[entry.key]
                is_buffer = (isinstance(owner, Module) and isinstance(path[-1], tree.GetAttrKey)
                             and path[-1].key in owner._buffer_names())
                yield _dotted(path), leaf, is_buffer

    def named_parameters(self) -> list[tuple[str, Tensor]]:
        """``[('layers.0.weight', w), ...]``: the Tensors that are not buffers, each once."""
        seen: set[int] = set()
        named = []
        for name, tensor, is_buffer in self._named_tensors():
            if not is_buffer and id(tensor) not in seen:
                seen.add(id(tensor))
                named.append((name, tensor))
        return named

    def parameters(self) -> list[Tensor]:
        """The trainable Tensors (not buffers), each once even if shared: hand them to an optimiser."""
        return [tensor for _, tensor in self.named_parameters()]

    def named_buffers(self) -> list[tuple[str, Tensor]]:
        """``[('bn.running_mean', t), ...]``: the Tensors registered with ``register_buffer``."""
        return [(name, tensor) for name, tensor, is_buffer in self._named_tensors() if is_buffer]

    def buffers(self) -> list[Tensor]:
        return [tensor for _, tensor in self.named_buffers()]

    def zero_grad(self) -> None:
        """Forget the ``.grad`` of every parameter (seed-style training, as PyTorch's)."""
        for parameter in self.parameters():
            parameter.grad = None

    # --- printing --------------------------------------------------------------------------------
    def extra_repr(self) -> str:
        """The constructor arguments shown inside ``Name(...)``; layers override it."""
        return ""

    def __repr__(self) -> str:
        children = list(self._named_children())
        if not children:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"{type(self).__name__}({self.extra_repr()}"]
        for name, module in children:
            child = repr(module).replace("\n", "\n  ")
            lines.append(f"  ({name}): {child}")
        return "\n".join(lines) + "\n)"

    def _repr_markdown_(self) -> str:
        """Jupyter's rich display: a table of the parameters (name, shape, dtype, count) under the repr.
        Shapes are known without computing anything, so a model whose values are pending stays pending."""
        from funcgrad.nn.state import get_state_dict  # state imports this module

        rows = [(name, tensor) for name, tensor in get_state_dict(self).items()]
        total = sum(tensor.size for _, tensor in rows)
        trainable = sum(tensor.size for tensor in self.parameters())
        text = repr(self).replace("```", "` ` `")
        lines = [f"**{type(self).__name__}**: {total:,} values in {len(rows)} arrays ({trainable:,} trainable)", "",
                 "```", text, "```", ""]
        if rows:
            lines += ["| name | shape | dtype | values |", "|---|---|---|---:|"]
            lines += [f"| `{name}` | {tensor.shape} | {tensor.dtype.name} | {tensor.size:,} |" for name, tensor in rows]
        return "\n".join(lines) + "\n"
