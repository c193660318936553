"""``jit``, the runtime: trace once per input signature, then run the traced IR as one ``jit`` call.

``jit(f)(*args)`` flattens the arguments, builds a signature key (pytree structure, shapes,
dtypes, weak types, static argument values), traces ``f`` on a miss and caches the open IR, and
binds the ``jit`` primitive with the IR as a parameter. Outside any trace that records one lazy
op, which ``funcgrad.lazy`` realizes by running the IR's compiled plan (cached per IR) on the
arguments' device, or with the reference interpreter when ``lazy.USE_COMPILER`` is off. Inside a
trace it is one equation holding the IR, so ``grad(jit(f))`` differentiates the inner IR and the
derivative stays inside jit calls: the jit primitive's rules (``funcgrad/transforms/jit.py``)
transform the sub-IR (jvp, partial evaluation, transposition, batching).

Stateful steps (``opt.zero_grad(); loss.backward(); opt.step()`` on a model and an optimiser passed
as arguments) work by tracing on the caller's own objects: each Tensor leaf of the arguments gets a
tracer swapped into it for the trace (and its value restored after), so Tensors shared between
arguments stay shared. A Tensor whose value (``_data``) or ``.grad`` was replaced during the call is
*written back*: its final value is an extra output of the traced IR, stored into that same Tensor
object on every call. A function that mutates nothing has no extra outputs.

Fast path: a call on positional Tensors (and hashable static arguments) whose signature was traced
before, outside any trace, with DEBUG and the NaN/inf checks off, skips the lazy graph: ``FastCall``
replays the signature's compiled plan at once on the arguments' arrays and wraps the results as
computed Tensors (``Jitted.fast_calls`` counts them). Anything it does not handle (tracers, another
device, a stateful step, fresh random keys, an argument or const with ``requires_grad``, whose lazy
result ``backward()`` must be able to follow) takes the full path below, which gives the same values.

Threads: the signature cache is an ``LRUCache`` (``FUNCGRAD_JIT_CACHE_SIZE`` signatures per function,
default 256), and tracing holds one process-wide re-entrant lock (traces nest), because the swap
above writes into the caller's objects; cached calls run concurrently.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
import time
import types
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from funcgrad import lazy
from funcgrad.autograd import recording_grad_writes
from funcgrad.core.tensor import Tensor, _atom_for, as_tensor, bind
from funcgrad.core.trace import argument_names, as_output, leaf_aval
from funcgrad.ir.collectives import axis_env_key
from funcgrad.ir.core import IR
from funcgrad.ir.higher_order import jit_p, open_ir
from funcgrad.ir.simplify import simplify
from funcgrad.ir.tracing import current_builder, new_trace
from funcgrad.lazy import LazyBuffer, realize
from funcgrad.transforms import jit as _jit_rules  # noqa: F401 - the jit primitive's rules, registered
from funcgrad.util import config as _config
from funcgrad.util import tree
from funcgrad.util.caches import LRUCache, cache_size
from funcgrad.util.config import environment_get
from funcgrad.util.debug import debug_level


class WriteBack(NamedTuple):
    """What a traced call replaced in its argument Tensors, by flat leaf index: ``values``, the
    Tensors whose value was swapped (one extra output each, in order), then ``grads``, those whose
    ``.grad`` was set (``True``: one extra output) or reset to None (``False``)."""

    values: tuple[int, ...]
    grads: tuple[tuple[int, bool], ...]

    def apply(self, leaves: Sequence[Any], extras: Sequence[Tensor]) -> None:
        """Store the extra outputs of one call into the caller's Tensors."""
        new = iter(extras)
        for index in self.values:
            leaves[index]._data = next(new)._data
        for index, has_value in self.grads:
            leaves[index].grad = next(new) if has_value else None


# (open IR, output tree, consts, write-back, positions of the consts that are keys drawn from the global
# random state: each call replaces them with fresh keys)
Entry = tuple[IR, Any, list[Any], WriteBack | None, tuple[int, ...]]

JIT_CACHE_SIZE = cache_size("FUNCGRAD_JIT_CACHE_SIZE", 256)  # traced signatures kept per jitted function
_TRACE_LOCK = threading.RLock()  # one trace at a time: tracing swaps tracers into the caller's Tensors
LIVE_JITTED: weakref.WeakSet[Jitted] = weakref.WeakSet()  # for funcgrad.debug.live_counts


def fresh_consts(consts: list[Any], key_positions: tuple[int, ...]) -> list[Any]:
    """``consts`` with a new key from the global random state at each of ``key_positions``."""
    if not key_positions:
        return consts
    from funcgrad.random import next_key
    consts = list(consts)
    for position in key_positions:
        consts[position] = next_key()
    return consts


_UNSET = (None, b"", b"0")


def _settings_quiet() -> bool:
    """DEBUG, debug_nans and debug_infs are all off: nothing to print or check per step (read per call,
    as the full path does; a value other than unset, empty or 0 takes the full path, which parses it)."""
    get = environment_get
    return (get(b"DEBUG") in _UNSET and get(b"FUNCGRAD_DEBUG_NANS") in _UNSET and get(b"FUNCGRAD_DEBUG_INFS") in _UNSET
            and True not in (_config.config._set.get("debug_nans"), _config.config._set.get("debug_infs")))


FULL_PATH: Any = object()  # what a FastCall returns for a call it does not handle (None is a result)


class FastCall:
    """The lean call of one traced signature (see the module docstring): its consts, its plan on
    ``device`` (fetched on first use), its output avals and tree. ``__call__`` returns ``FULL_PATH``
    when the call must take the full path."""

    __slots__ = ("ir", "consts", "device", "replay", "out_avals", "out_tree", "single")

    def __init__(self, entry: Entry, device: str) -> None:
        ir, out_tree, consts, _, _ = entry
        self.ir = ir
        self.consts: tuple[Tensor, ...] = tuple(consts)
        self.device = device
        self.replay: Any = None  # the plan's lean replay (fetched on the first call); False where it has none
        self.out_avals = ir.out_avals
        self.out_tree = out_tree
        self.single = out_tree.node_type is None and out_tree.num_leaves == 1  # f returns one array

    @staticmethod
    def usable(entry: Entry) -> bool:
        """Whether a signature can take the fast path at all: no write-back, no fresh keys, consts
        that are computed Tensors (their values are read on every call, as the full path does)."""
        _, _, consts, write_back, key_positions = entry
        return write_back is None and not key_positions and \
            all(type(c) is Tensor and isinstance(c._data, LazyBuffer) for c in consts)

    def __call__(self, args: tuple[Tensor, ...]) -> Any:
        if not lazy.USE_COMPILER or current_builder() is not None or not _settings_quiet():
            return FULL_PATH
        replay = self.replay
        if replay is None:
            replay = self._fetch_replay()
        if replay is False:
            return FULL_PATH
        device = self.device
        arrays = self._const_arrays() if self.consts else []
        if arrays is None:
            return FULL_PATH
        committed = False
        for tensor in args:
            data = tensor._data
            if type(data) is not LazyBuffer or data.device != device or tensor._requires_grad:
                return FULL_PATH  # traced, on another device, or wanting a lazy graph for backward()
            array = data.array if data.array is not None else _computed(data)
            arrays.append(array if array.flags.c_contiguous else np.ascontiguousarray(array))
            committed = committed or data.committed
        if _config.active:  # the checks were switched off since the last plan run: bind can stop recording
            _config.nonfinite_checks()
        outputs = replay(arrays)
        if self.single:
            array = outputs[0]
            array.setflags(write=False)
            return Tensor._wrap(LazyBuffer(self.out_avals[0], None, array, device, committed))
        results = []
        for array, aval in zip(outputs, self.out_avals):
            array.setflags(write=False)
            results.append(Tensor._wrap(LazyBuffer(aval, None, array, device, committed)))
        return self.out_tree.unflatten(results)

    def _fetch_replay(self) -> Any:
        """The lean replay of the signature's compiled plan (``Plan.replay_arrays``), once; False where the
        plan has none (a resident device)."""
        from funcgrad.devices import get_device
        from funcgrad.lower import jit_plan
        replay = jit_plan(self.ir, get_device(self.device)).replay
        self.replay = replay if replay is not None else False
        return self.replay

    def _const_arrays(self) -> list[np.ndarray] | None:
        """The consts' current arrays (a const Tensor may have been given a new value since the trace, as
        an optimiser step does); None when one is now of another type or elsewhere (the full path says so),
        or requires a gradient (the full path's lazy result lets ``backward()`` reach it)."""
        arrays = []
        for tensor, aval in zip(self.consts, self.ir.in_avals):
            data = tensor._data
            if type(data) is not LazyBuffer or data.device != self.device or data.aval != aval or tensor._requires_grad:
                return None
            array = data.array if data.array is not None else _computed(data)
            arrays.append(array if array.flags.c_contiguous else np.ascontiguousarray(array))
        return arrays


def _computed(data: LazyBuffer) -> np.ndarray:
    """The array of a pending argument, computed now (the full path computes pending arguments first too)."""
    realize([data])
    assert data.array is not None
    return data.array


def _static_hint(value: Any) -> str:
    """What to pass instead of the unhashable static argument ``value``."""
    if isinstance(value, list):
        return "pass a tuple instead of a list, or make it a traced argument"
    if isinstance(value, (set, bytearray)):
        return f"pass a {'frozenset' if isinstance(value, set) else 'bytes'} instead, or make it a traced argument"
    if isinstance(value, dict):
        return "pass a tuple of (key, value) pairs or a frozen dataclass instead, or make it a traced argument"
    if isinstance(value, (np.ndarray, Tensor)):
        return ("arrays are traced arguments: remove it from static_argnums/static_argnames (or pass a tuple of its "
                "values if it must be static)")
    return "give its class __hash__ and __eq__ (e.g. a frozen dataclass), or make it a traced argument"


class Jitted:
    """A jit-wrapped function. ``trace_count`` says how many times it traced; ``DEBUG=1`` prints why
    it retraced."""

    def __init__(self, fn: Callable[..., Any], static_argnums: int | Sequence[int] = (),
                 static_argnames: str | Sequence[str] = ()) -> None:
        if not callable(fn):
            raise TypeError(f"jit expects a callable, got {type(fn).__name__}")
        self.fn = fn
        user_argnums = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
        user_argnames = (static_argnames,) if isinstance(static_argnames, str) else tuple(static_argnames)
        self._user_argnums = user_argnums  # checked against each call's arguments (the inferred ones are not)
        self._user_argnames = user_argnames  # as given, for the repr
        # as JAX: a static argument is static however it is passed, so each name gets its position and
        # each position its name (from the signature, for parameters that can be passed both ways)
        self.static_argnums, self.static_argnames = _static_both_ways(fn, user_argnums, user_argnames)
        self._positional = _positional_count(fn)
        self.trace_count = 0
        # the trace caches belong to (fn, options), as JAX's: jit(f) made twice traces f once
        shared = _shared_caches(fn, (self.static_argnums, self.static_argnames))
        self._cache: LRUCache[Any, Entry] = shared.cache
        self._simple_cache: LRUCache[Any, Entry] = shared.simple_cache  # keyed by argument types only
        self._fast: dict[Any, FastCall | None] = shared.fast  # the same keys: the fast path (a plain dict)
        self._fast_lock = shared.fast_lock
        self.fast_calls = 0  # calls that took the fast path (for tests; not exact under threads)
        self._static_positions: dict[int, tuple[int, ...]] = {}  # number of arguments -> static positions
        self._last_key: Any = None
        self._this_thread = threading.local()  # .just_traced: the entry this thread's call traced (fresh keys)
        LIVE_JITTED.add(self)
        # copy the name and docstring only: updating __dict__ would copy the state of a wrapped Jitted
        functools.update_wrapper(self, fn, updated=())

    @property
    def name(self) -> str:
        return getattr(self.fn, "__name__", "fn")

    def __repr__(self) -> str:
        options = (("static_argnums", self._user_argnums), ("static_argnames", self._user_argnames))
        statics = "".join(f", {label}={value!r}" for label, value in options if value)
        return f"jit({self.name}{statics}, traced {self.trace_count} time{'s' if self.trace_count != 1 else ''})"

    def __reduce__(self) -> Any:
        raise TypeError(f"cannot pickle jit({self.name}): a jitted function holds compiled kernels and caches that "
                        "belong to this process; pickle its arguments (parameters, optimizer state) and the plain "
                        "function's module, then call fg.jit(f) again after loading")

    def __copy__(self) -> Jitted:  # as copy.copy/deepcopy of a plain function: the same function
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Jitted:
        return self

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        """Used as a method decorator (``@partial(jit, static_argnums=0) def calc(self, y)``), the
        jitted function binds ``self`` as a plain function would."""
        return self if instance is None else types.MethodType(self, instance)

    def _check_argnums(self, count: int) -> None:
        """A ``static_argnums`` must name a positional parameter (of the signature where it has no
        ``*args``, as JAX checks; else of this call); one passed by keyword is fine."""
        count = self._positional if self._positional is not None else count
        for n in self._user_argnums:
            if not -count <= n < count:
                raise ValueError(f"jit({self.name}): static_argnums {n} is out of range for {count} "
                                 "positional arguments")

    def _positions(self, count: int) -> tuple[int, ...]:
        """The static positions among ``count`` positional arguments (a position inferred from a
        static name but passed by keyword is simply absent)."""
        positions = self._static_positions.get(count)
        if positions is None:
            positions = self._static_positions[count] = tuple(sorted(
                {n % count for n in self.static_argnums if -count <= n < count}))
        return positions

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, tuple[Any, ...], Callable[..., Any]]:
        self._check_argnums(len(args))
        static_pos = list(self._positions(len(args)))
        static_values: tuple[tuple[int | str, Any], ...] = tuple((n, args[n]) for n in static_pos)
        static_values += tuple(sorted((k, v) for k, v in kwargs.items() if k in self.static_argnames))
        for where, value in static_values:
            try:
                hash(value)
            except TypeError:
                label = f"argument {where}" if isinstance(where, int) else f"argument '{where}'"
                raise TypeError(f"jit({self.name}): static {label} of type {type(value).__name__} is not "
                                f"hashable; {_static_hint(value)}") from None
        dynamic_args = tuple(a for i, a in enumerate(args) if i not in static_pos)
        dynamic_kwargs = {k: v for k, v in kwargs.items() if k not in self.static_argnames}

        def call_with(dyn_args: tuple[Any, ...], dyn_kwargs: dict[str, Any]) -> Any:
            it = iter(dyn_args)
            full = [args[i] if i in static_pos else next(it) for i in range(len(args))]
            return self.fn(*full, **dyn_kwargs, **{k: v for k, v in kwargs.items() if k in self.static_argnames})

        return (dynamic_args, dynamic_kwargs), static_values, call_with

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # the common call, positional Tensors (and hashable static arguments) only: its signature is
        # just their types (and the static values)
        simple = False
        dynamic: tuple[Any, ...] = args
        # under named axes the signature includes them: the full path
        positional = not kwargs and not axis_env_key()
        split = None if not positional else self._positional_split(args) if self.static_argnums else (args, ())
        if split is not None:
            dynamic, statics = split
            # (shape, dtype) rather than the aval: hashed in C, not by attrs' generated __hash__
            avals = [(a._data.aval.shape, a._data.aval.dtype, a._weak) for a in dynamic if type(a) is Tensor]
            # one Tensor passed twice is traced as one value (see _aliases): not this signature's plan
            simple = len(avals) == len(dynamic) and (len(dynamic) < 2 or len({id(a) for a in dynamic}) == len(dynamic))
            key: Any = (tuple(avals), _config.config.trace_context())
            if simple and statics:
                key = (key, statics)
                try:
                    hash(key)
                except TypeError:  # an unhashable static argument: the full path says what to do
                    simple = False
        if simple:
            fast = self._fast.get(key)
            if fast is not None:
                outs = fast(dynamic)
                if outs is not FULL_PATH:
                    self.fast_calls += 1
                    return outs
            entry = self._simple_cache.get(key)
            if entry is not None:
                if key not in self._fast:
                    self._remember_fast(key, entry, dynamic)
                return self._call(entry, list(dynamic))
        entry, leaves, cached = self._trace(args, kwargs)
        if simple and cached:
            self._simple_cache.put(key, entry)
            self._remember_fast(key, entry, dynamic)
        return self._call(entry, [as_tensor(leaf) for leaf in leaves])

    def _positional_split(self, args: tuple[Any, ...]) -> tuple[tuple[Any, ...], tuple[Any, ...]] | None:
        """(the dynamic arguments, the static ones) of a call without keywords; None where a
        ``static_argnums`` is out of range (the full path raises)."""
        limit = self._positional if self._positional is not None else len(args)
        if not all(-limit <= n < limit for n in self._user_argnums):
            return None
        positions = self._positions(len(args))
        return (tuple([a for i, a in enumerate(args) if i not in positions]),
                tuple([args[i] for i in positions]))

    def _remember_fast(self, key: Any, entry: Entry, args: tuple[Tensor, ...]) -> None:
        """Give a signature its ``FastCall`` (None where it cannot have one), placed on the device its
        current arguments' call goes to; not yet while they are traced."""
        fast: FastCall | None = None
        if FastCall.usable(entry):
            sources = [t._data for t in (*entry[2], *args)]
            if not all(isinstance(data, LazyBuffer) for data in sources):
                return
            try:  # (without sources, each call goes to the default device of the day: the full path)
                fast = FastCall(entry, lazy.placement("jit", sources)[0]) if sources else None
            except lazy.DeviceMismatchError:
                return  # the full path raises it
        with self._fast_lock:  # bounded like the signature cache: the oldest goes first
            while len(self._fast) >= self._simple_cache.max_entries:
                del self._fast[next(iter(self._fast))]
            self._fast[key] = fast

    def _call(self, entry: Entry, leaves: list[Tensor]) -> Any:
        ir, out_tree, consts, write_back, key_positions = entry
        if getattr(self._this_thread, "just_traced", None) is entry:  # its keys were drawn just now: use them
            self._this_thread.just_traced = None
        else:
            consts = fresh_consts(consts, key_positions)
        operands = consts + leaves
        # a jit call is a compilation boundary: compute pending arguments once, so repeated calls on
        # them replay the cached plan instead of recomputing their graphs
        pending = [x._data for x in operands if isinstance(x, Tensor) and isinstance(x._data, LazyBuffer)
                   and not x._data.realized]
        if pending:
            realize(pending)
        outs = bind(jit_p, *operands, ir=ir, name=self.name)
        if write_back is not None:
            write_back.apply(leaves, outs[out_tree.num_leaves:])
            outs = outs[:out_tree.num_leaves]
        return tree.unflatten(out_tree, list(outs))

    def lower(self, *args: Any, **kwargs: Any) -> Lowered:
        """The traced IR and its compiled plan for these arguments, without running anything (as
        JAX's ``jit(f).lower(x)``): ``.ir``, ``.kernels`` (name, device, source) and ``.compile()``."""
        (ir, out_tree, consts, write_back, key_positions), _, _ = self._trace(args, kwargs)
        return Lowered(self, ir, out_tree, consts, write_back, key_positions)

    def _trace(self, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> tuple[Entry, list[Any], bool]:
        """The (open IR, output tree, consts, write-back) for this signature, tracing on a miss; the flat
        dynamic argument leaves; and whether the entry is cached (closures over another trace's
        values are not)."""
        dynamic, static_values, call_with = self._split(args, kwargs)
        leaves, in_tree = tree.flatten(dynamic)
        avals = [leaf_aval(leaf, f"argument leaf {i}") for i, leaf in enumerate(leaves)]
        # the bound axes: under vmap/pmap with named axes, the collectives recorded their sizes
        key = (in_tree, tuple(avals), static_values, _aliases(leaves), _config.config.trace_context(), axis_env_key())
        entry = self._cache.get(key)
        if entry is not None:
            return entry, leaves, True
        with _TRACE_LOCK:
            entry = self._cache.get(key)  # another thread may have traced it meanwhile
            if entry is not None:
                return entry, leaves, True
            static_pos = set(self._positions(len(args)))
            names = argument_names(self.fn, dynamic[0], [i for i in range(len(args)) if i not in static_pos],
                                   dynamic[1])
            self._explain_retrace(key, names)
            from funcgrad.lower.plan import record_trace
            from funcgrad.random import recording_keys
            started = time.perf_counter()
            with recording_keys() as drawn:
                traced, out_tree, write_back, grads_in = _trace_in_place(call_with, dynamic, leaves, avals, in_tree,
                                                                         f"jit({self.name})", names)
            traced = simplify(traced)
            record_trace(time.perf_counter() - started)  # DEBUG=2 and PHASE_SECONDS["trace"]
            _check_no_outside_grads(traced, grads_in, self.name)
            drawn_ids = {id(k) for k in drawn}
            key_positions = tuple(i for i, c in enumerate(traced.consts) if id(c) in drawn_ids)
            entry = (open_ir(traced), out_tree, list(traced.consts), write_back, key_positions)
            self._this_thread.just_traced = entry
            self.trace_count += 1
            cacheable = not any(isinstance(c, Tensor) and c.is_traced for c in traced.consts)
            if cacheable:  # closures over another trace's values cannot be reused
                self._cache.put(key, entry)
        return entry, leaves, cacheable

    def _explain_retrace(self, key: Any, leaf_names: list[str]) -> None:
        previous = self._last_key
        self._last_key = key
        if previous is None or debug_level() < 1:
            return
        reason = "the argument structure changed"
        if previous[0] == key[0]:
            changed = [f"{name}: {old[0]} -> {new[0]}" for name, old, new in
                       zip(leaf_names, previous[1], key[1]) if old != new]
            if changed:
                reason = "; ".join(changed)
            elif previous[2] != key[2]:
                reason = f"static arguments changed: {previous[2]} -> {key[2]}"
        print(f"jit({self.name}): retracing because {reason}", file=sys.stderr)


class Lowered:
    """A jit function lowered for one signature: its IR (consts as leading inputs) and kernels."""

    def __init__(self, jitted: Jitted, ir: IR, out_tree: Any, consts: list[Any],
                 write_back: WriteBack | None = None, key_positions: tuple[int, ...] = ()) -> None:
        self.jitted, self.ir, self.out_tree, self.consts = jitted, ir, out_tree, consts
        self.write_back, self.key_positions = write_back, key_positions

    @property
    def kernels(self) -> list[Any]:
        return self._plan().kernel_infos()

    def _plan(self) -> Any:
        from funcgrad.devices import default_device
        from funcgrad.lower import compile_plan
        return compile_plan(self.ir, default_device())

    def compile(self) -> Compiled:
        return Compiled(self)

    def __str__(self) -> str:
        return str(self.ir)


class Compiled:
    """A lowered jit function ready to run: calling it runs the plan directly on the arguments."""

    def __init__(self, lowered: Lowered) -> None:
        self.lowered = lowered
        self.plan = lowered._plan()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        import numpy as np

        dynamic, _, _ = self.lowered.jitted._split(args, kwargs)
        leaves = [as_tensor(leaf) for leaf in tree.leaves(dynamic)]
        if [x.aval for x in leaves] != list(self.lowered.ir.in_avals[len(self.lowered.consts):]):
            raise TypeError("this compiled function was lowered for other argument types: "
                            f"{[str(a) for a in self.lowered.ir.in_avals[len(self.lowered.consts):]]}")
        consts = fresh_consts(self.lowered.consts, self.lowered.key_positions)
        arrays = [np.asarray(c) for c in consts] + [np.asarray(x) for x in leaves]
        outs = [Tensor(o, dtype=o.dtype) for o in self.plan.run(arrays)]
        n = self.lowered.out_tree.num_leaves
        if self.lowered.write_back is not None:
            self.lowered.write_back.apply(leaves, outs[n:])
        return tree.unflatten(self.lowered.out_tree, outs[:n])


def _static_both_ways(fn: Callable[..., Any], argnums: tuple[int, ...],
                      argnames: tuple[str, ...]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """``(static_argnums, static_argnames)`` completed from ``fn``'s signature: the position of each
    static name and the name of each static position (as JAX's jit infers them)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or a callable without a signature: nothing to infer
        return argnums, argnames
    for name in argnames:
        if not isinstance(name, str):
            raise TypeError(f"jit: static_argnames must be strings, got {name!r}")
    both_ways = [p.name if p.kind is p.POSITIONAL_OR_KEYWORD else None
                 for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    more_nums = tuple(i for i, name in enumerate(both_ways) if name in argnames and i not in argnums)
    more_names = tuple(name for i, name in enumerate(both_ways)
                       if name is not None and name not in argnames
                       and any(n == i or n == i - len(both_ways) for n in argnums))
    return argnums + more_nums, argnames + more_names


def _positional_count(fn: Callable[..., Any]) -> int | None:
    """How many positional parameters ``fn`` has; None with ``*args`` or without a signature."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in parameters):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in parameters)


class _SharedCaches:
    """The caches that every ``jit(fn, same options)`` shares."""

    def __init__(self) -> None:
        self.cache: LRUCache[Any, Entry] = LRUCache(JIT_CACHE_SIZE)
        self.simple_cache: LRUCache[Any, Entry] = LRUCache(JIT_CACHE_SIZE)
        self.fast: dict[Any, FastCall | None] = {}
        self.fast_lock = threading.Lock()


# fn -> options -> its caches; weak on fn, so the caches go with the function
_CACHES_BY_FUNCTION: weakref.WeakKeyDictionary[Any, dict[Any, _SharedCaches]] = weakref.WeakKeyDictionary()
_CACHES_LOCK = threading.Lock()


def _shared_caches(fn: Callable[..., Any], options: Any) -> _SharedCaches:
    """The caches of ``(fn, options)``; fresh ones where ``fn`` cannot be weakly referenced or is
    not hashable (a bound method is made anew on each attribute access: its caches would not be found)."""
    try:
        with _CACHES_LOCK:
            per_options = _CACHES_BY_FUNCTION.setdefault(fn, {})
            shared = per_options.get(options)
            if shared is None:
                shared = per_options[options] = _SharedCaches()
            return shared
    except TypeError:
        return _SharedCaches()


def _aliases(leaves: list[Any]) -> tuple[int, ...] | None:
    """For each leaf, the index of the first leaf that is the same Tensor object, or None when no
    Tensor appears twice. Tracing happens on the caller's objects (``_trace_in_place``), so a Tensor
    passed twice (Adam's moments started from one zeros list) is one input of the trace: that trace
    holds only for calls that alias the same leaves, and the pattern is part of its cache key."""
    seen: dict[int, int] = {}
    pattern = []
    for index, leaf in enumerate(leaves):
        pattern.append(seen.setdefault(id(leaf), index) if isinstance(leaf, Tensor) else index)
    return tuple(pattern) if len(seen) < sum(isinstance(leaf, Tensor) for leaf in leaves) else None


def _trace_in_place(fn: Callable[..., Any], dynamic: Any, leaves: list[Any], avals: list[Any], in_tree: Any,
                    label: str, names: list[str]) -> tuple[IR, Any, WriteBack | None, list[Tensor]]:
    """Trace ``fn(args, kwargs)`` on the caller's own objects, with a tracer swapped into each Tensor
    leaf (restored afterwards). Returns the IR (outputs, then the values and grads to write back),
    the output tree, the write-back (None if nothing was replaced) and the ``.grad`` values the
    arguments had on entry (a trace must not read them: they would be baked in as constants)."""
    with new_trace(label) as builder:
        tracers = [builder.new_input(aval) for aval, _ in avals]
        builder.input_names.update((t.var.id, n) for t, n in zip(tracers, names))
        saved: dict[int, tuple[int, Tensor, Any, Any]] = {}  # id -> (first leaf index, Tensor, value, grad)
        traced_leaves = []
        for index, (leaf, tracer, (_, weak)) in enumerate(zip(leaves, tracers, avals)):
            if isinstance(leaf, Tensor):
                if id(leaf) not in saved:
                    saved[id(leaf)] = (index, leaf, leaf._data, leaf.grad)
                    leaf._data = tracer
                traced_leaves.append(leaf)
            else:
                traced_leaves.append(Tensor._wrap(tracer, weak=weak))
        try:
            args, kwargs = tree.unflatten(in_tree, traced_leaves)
            # an argument whose leaves are all Tensors is passed as the caller's object itself
            args = tuple(a if _all_tensors(a) else b for a, b in zip(dynamic[0], args))
            kwargs = {k: dynamic[1][k] if _all_tensors(dynamic[1][k]) else v for k, v in kwargs.items()}
            with recording_grad_writes() as grad_writes:
                out_leaves, out_tree = tree.flatten(fn(args, kwargs))
            atoms = [_atom_for(builder, as_output(leaf)) for leaf in out_leaves]
            replaced = [(i, t) for i, t, _, _ in saved.values() if t._data is not tracers[i]]
            regraded = [(i, t.grad) for i, t, _, grad in saved.values() if t.grad is not grad or id(t) in grad_writes]
            atoms += [_atom_for(builder, t) for _, t in replaced]
            atoms += [_atom_for(builder, as_output(grad)) for _, grad in regraded if grad is not None]
            ir = builder.build(atoms)
        finally:
            for _, tensor, data, grad in saved.values():
                tensor._data, tensor.grad = data, grad
    write_back = WriteBack(tuple(i for i, _ in replaced), tuple((i, g is not None) for i, g in regraded)) \
        if replaced or regraded else None
    return ir, out_tree, write_back, [grad for _, _, _, grad in saved.values() if grad is not None]


def _all_tensors(arg: Any) -> bool:
    arg_leaves = tree.leaves(arg)
    return bool(arg_leaves) and all(isinstance(leaf, Tensor) for leaf in arg_leaves)


def _check_no_outside_grads(traced: IR, grads_in: list[Tensor], name: str) -> None:
    """A traced step must not read a ``.grad`` computed before the call (the usual cause: calling
    ``backward()`` without ``zero_grad()`` first)."""
    incoming = {id(g._data) for g in grads_in}
    if any(isinstance(c, Tensor) and id(c._data) in incoming for c in traced.consts):
        raise RuntimeError(f"jit({name}): the function read a .grad that was computed before this call (e.g. "
                           "backward() accumulating into it), which would be frozen into the compiled step as a "
                           "constant; call opt.zero_grad() before backward() inside the jitted function, or set "
                           "the .grad of its arguments to None before calling it")


def jit(fn: Callable[..., Any] | None = None, *, static_argnums: int | Sequence[int] = (),
        static_argnames: str | Sequence[str] = ()) -> Any:
    """Trace ``fn`` once per input signature and run it as one compiled unit.

    Usable as ``jit(f)``, ``@jit`` or ``@jit(static_argnums=1)``.

    Stateful steps work: Tensors of the arguments whose value or ``.grad`` the function replaces
    (``optimizer.step()``, batch-norm running statistics, ``loss.backward()``) get their new values
    written back after every call, as if the function had run eagerly; objects shared between the
    arguments (an optimiser's parameters are the model's) stay shared. Other ways of keeping traced
    values (a global, a new attribute) raise ``EscapedTracerError`` when the value is used later.

    >>> @jit
    ... def train_step(model, opt, x, y):
    ...     opt.zero_grad(); loss = loss_fn(model(x), y); loss.backward(); opt.step(); return loss

    >>> f = jit(lambda x: x * 2 + 1); f(fnp.ones(3)).tolist(); f.trace_count   # [3.0, 3.0, 3.0], 1
    """
    if fn is None:
        return functools.partial(jit, static_argnums=static_argnums, static_argnames=static_argnames)
    return Jitted(fn, static_argnums, static_argnames)
