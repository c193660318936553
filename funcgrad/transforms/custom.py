"""Controlling differentiation: custom_jvp, custom_vjp, stop_gradient, checkpoint; and eval_shape.

* ``custom_jvp(f)`` with ``f.defjvp(rule)``: ``f`` traces into a ``custom_jvp_call`` holding its IR
  and the rule; evaluation runs the IR, differentiation calls the rule.
* ``custom_vjp(f)`` with ``f.defvjp(fwd, bwd)``: under differentiation ``fwd`` runs in the forward
  pass and the tangent map is a ``custom_lin`` equation whose transpose is ``bwd`` (as in JAX,
  such functions support reverse mode only).
* ``stop_gradient(x)``: the identity, with a zero derivative.
* ``checkpoint(f)`` (remat): a ``checkpoint`` call whose partial evaluation keeps only the inputs
  as residuals, so the backward pass recomputes ``f``'s intermediates instead of storing them.
"""

from __future__ import annotations

import functools
import inspect
import types
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, as_tensor, bind, evaluate
from funcgrad.core.trace import leaf_aval, trace_avals
from funcgrad.ir import dtypes
from funcgrad.ir.core import IR, Eqn, ShapedArray, Var
from funcgrad.ir.higher_order import checkpoint_p, custom_jvp_call_p, custom_lin_p, custom_vjp_call_p, open_ir
from funcgrad.ir.primitives import convert_element_type_p, dot_general_p, name_p, stop_gradient_p
from funcgrad.ir.simplify import dce, simplify
from funcgrad.ir.tracing import current_builder
from funcgrad.transforms.ad import trace_function
from funcgrad.transforms.batching import batch_rules, broadcast_batched, vmap_ir
from funcgrad.transforms.jit import call_batch_rule
from funcgrad.transforms.jvp import instantiate, is_differentiable, jvp_ir, jvp_rules, zeros
from funcgrad.transforms.partial_eval import partial_eval, pe_rules
from funcgrad.transforms.transpose import backward_pass, is_undefined, transpose_rules
from funcgrad.util import tree
from funcgrad.util.caches import LRUCache


class _Named:
    """A callable parameter that prints as its name in IR listings (and hashes by identity)."""

    def __init__(self, fn: Callable[..., Any], name: str) -> None:
        self.fn = fn
        self.__name__ = name

    def __call__(self, *args: Any) -> Any:
        return self.fn(*args)


def _cast(x: Tensor, dtype: Any) -> Tensor:
    """``x`` as ``dtype`` (a rule's tangent or cotangent brought to its value's dtype)."""
    return x if x.dtype == dtype else bind(convert_element_type_p, x, new_dtype=dtype)


# --- stop_gradient ------------------------------------------------------------------------------

def stop_gradient(x: Any) -> Any:
    """The identity on every leaf of ``x``, with a zero derivative (also under higher orders)."""
    def stop(leaf: Any) -> Any:
        leaf = as_tensor(leaf)
        return bind(stop_gradient_p, leaf) if is_differentiable(leaf.aval) else leaf
    return tree.map(stop, x)


jvp_rules[stop_gradient_p] = lambda primals, tangents: (bind(stop_gradient_p, primals[0]), None)
batch_rules[stop_gradient_p] = lambda args, dims, *, axis_size: (bind(stop_gradient_p, args[0]), dims[0])


# --- custom_jvp ---------------------------------------------------------------------------------

class _CustomFunction:
    """What custom_jvp and custom_vjp share: the function, its ``nondiff_argnums``, and its traced IRs
    by argument signature. As in JAX, the function is called no more often than needed: a rule that
    calls the function again on the same types (``return f(x), ...``) reuses the IR traced when the
    call was recorded, unless that trace read a concrete value (Python control flow) or closed over
    a traced value."""

    _label = "custom"

    def __init__(self, fun: Callable[..., Any], nondiff_argnums: int | Sequence[int] = ()) -> None:
        if not callable(fun):
            raise TypeError(f"{self._label} expects a callable, got {type(fun).__name__}")
        self.fun = fun
        self.nondiff_argnums = (nondiff_argnums,) if isinstance(nondiff_argnums, int) else tuple(nondiff_argnums)
        self._traces: LRUCache[Any, tuple[IR, Any, tuple[Any, ...]]] = LRUCache(8)
        functools.update_wrapper(self, fun)

    @property
    def _name(self) -> str:
        return getattr(self.fun, "__name__", "fun")

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        return self if instance is None else types.MethodType(self, instance)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError  # custom_jvp and custom_vjp define the call

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], list[Any], list[int]]:
        """(the differentiable arguments, the nondiff ones, the nondiff positions) of a call."""
        if kwargs:  # keywords go to their positions, as JAX resolves them
            try:
                bound = inspect.signature(self.fun).bind(*args, **kwargs)
            except TypeError as err:
                raise TypeError(f"{self._label} function {self._name}: {err}") from None
            bound.apply_defaults()
            if bound.kwargs:
                raise TypeError(f"{self._label} function {self._name} takes its arguments by position; "
                                f"got keyword-only arguments {sorted(bound.kwargs)}")
            args = bound.args
        for n in self.nondiff_argnums:
            if not -len(args) <= n < len(args):
                raise ValueError(f"{self._label} function {self._name}: nondiff_argnums {n} is out of range for "
                                 f"{len(args)} arguments")
        positions = sorted({n % len(args) for n in self.nondiff_argnums})
        return ([a for i, a in enumerate(args) if i not in positions], [args[i] for i in positions], positions)

    def _merged(self, positions: list[int], nondiff: list[Any]) -> Callable[..., Any]:
        """``fun`` as a function of the differentiable arguments only."""
        def merged(*diff: Any) -> Any:
            return self.fun(*_merge(positions, nondiff, diff))
        return merged

    def _trace(self, diff: list[Any], nondiff: list[Any], positions: list[int]) -> tuple[IR, Any, list[Tensor]]:
        leaves, in_tree = tree.flatten(tuple(diff))
        avals = tuple(leaf_aval(leaf, f"argument leaf {i} of {self._name}") for i, leaf in enumerate(leaves))
        key = (in_tree, avals, tuple(positions), tuple(_static_key(v) for v in nondiff))
        # reused inside a trace only: called eagerly, the function runs each time, as in JAX
        cached = self._traces.get(key) if current_builder() is not None else None
        if cached is not None:
            return cached[0], cached[1], [as_tensor(leaf) for leaf in leaves]
        reads: list[bool] = []
        ir, out_tree, values = trace_function(self._merged(positions, nondiff), diff,
                                              f"{self._label}({self._name})", read_known=reads)
        if not reads[0] and not any(isinstance(c, Tensor) and c.is_traced for c in ir.consts):
            self._traces.put(key, (ir, out_tree, tuple(nondiff)))  # (nondiff kept alive: keys may hold ids)
        return ir, out_tree, values


def _merge(positions: Sequence[int], nondiff: Sequence[Any], diff: Sequence[Any]) -> list[Any]:
    """The full argument list from the differentiable arguments and the nondiff ones at ``positions``."""
    full, it, others = [], iter(diff), dict(zip(positions, nondiff))
    for i in range(len(diff) + len(nondiff)):
        full.append(others[i] if i in others else next(it))
    return full


def _with_weak_types(values: Sequence[Any], weak: Sequence[bool]) -> list[Any]:
    """The rule's arguments with the weak types the call's arguments had (as JAX keeps them), so a
    rule that calls the function again finds the IR traced for the call."""
    return [Tensor._wrap(v._data, weak=w) if isinstance(v, Tensor) and v._weak != w else v
            for v, w in zip(values, weak)]


def _static_key(value: Any) -> Any:
    """A cache key for a nondiff argument: itself where hashable (not an array), else its identity."""
    if isinstance(value, Tensor):
        return ("id", id(value))
    try:
        hash(value)
    except TypeError:
        return ("id", id(value))
    return ("value", type(value), value)


class custom_jvp(_CustomFunction):  # noqa: N801 - named like JAX's decorator
    """A function with a hand-written JVP rule.

    >>> @custom_jvp
    ... def safe_log1pexp(x): return fnp.log1p(fnp.exp(x))
    >>> @safe_log1pexp.defjvp
    ... def _(primals, tangents): (x,), (t,) = primals, tangents; return safe_log1pexp(x), t * fnp.sigmoid(x)

    With ``nondiff_argnums`` (``@partial(custom_jvp, nondiff_argnums=(0,))``) those arguments are
    passed first to the rule, ``rule(*nondiff, primals, tangents)``, and have no tangents.
    """

    _label = "custom_jvp"

    def __init__(self, fun: Callable[..., Any], nondiff_argnums: int | Sequence[int] = ()) -> None:
        super().__init__(fun, nondiff_argnums)
        self.jvp: Callable[..., Any] | None = None

    def defjvp(self, jvp: Callable[..., Any], symbolic_zeros: bool = False) -> Callable[..., Any]:
        """Set the rule ``jvp(primals, tangents) -> (primal_out, tangent_out)`` (tuples of arguments)."""
        if symbolic_zeros:
            raise NotImplementedError(f"custom_jvp {self._name}: symbolic_zeros=True is not supported; tangents "
                                      "of inputs without one are passed as zeros")
        self.jvp = jvp
        return jvp

    def defjvps(self, *jvps: Callable[..., Any] | None) -> None:
        """Set the rule from one function per argument, ``jvp_i(tangent_i, primal_out, *primals)``
        giving that argument's part of the output tangent (None: the argument has none); the parts
        are summed, as JAX's ``defjvps``."""
        if self.nondiff_argnums:
            raise TypeError(f"custom_jvp {self._name}: defjvps cannot be used with nondiff_argnums; use defjvp")

        def rule(primals: tuple[Any, ...], tangents: tuple[Any, ...]) -> tuple[Any, Any]:
            if len(jvps) != len(primals):
                raise TypeError(f"custom_jvp {self._name}: defjvps got {len(jvps)} rules for a call with "
                                f"{len(primals)} arguments")
            out = self(*primals)
            total: Any = None
            for jvp_i, tangent in zip(jvps, tangents):
                if jvp_i is None:
                    continue
                part = jvp_i(tangent, out, *primals)
                total = part if total is None else tree.map(lambda a, b: a + b, total, part)
            if total is None:
                total = tree.map(lambda o: zeros(as_tensor(o).aval), out)
            return out, total

        self.jvp = rule

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self._name
        if self.jvp is None:
            raise AttributeError(f"custom_jvp function {name} has no rule; call .defjvp(rule) first")
        diff, nondiff, positions = self._split(args, kwargs)
        ir, out_tree, leaves = self._trace(diff, nondiff, positions)
        in_tree = tree.structure(tuple(diff))
        user_jvp = self.jvp
        out_avals = ir.out_avals

        weak = [leaf._weak for leaf in leaves]

        def flat_jvp(primal_leaves: list[Any], tangent_leaves: list[Any]) -> tuple[list[Any], list[Any]]:
            primals = tree.unflatten(in_tree, _with_weak_types(primal_leaves, weak))
            tangents = tree.unflatten(in_tree, tangent_leaves)
            out, tangent_out = user_jvp(*nondiff, primals, tangents)
            outs = [as_tensor(o) for o in tree.leaves(out)]
            touts = [as_tensor(t) for t in tree.leaves(tangent_out)]
            if len(outs) != len(out_avals) or len(touts) != len(out_avals):
                raise TypeError(f"the custom_jvp rule of {name} must return (output, tangent) shaped like the "
                                f"function's output {out_tree}")
            for t, aval in zip(touts, out_avals):
                if t.shape != aval.shape:
                    raise TypeError(f"the custom_jvp rule of {name} returned a tangent of shape {t.shape} for an "
                                    f"output of shape {aval.shape}")
            return outs, [_cast(t, a.dtype) for t, a in zip(touts, out_avals)]

        outs = bind(custom_jvp_call_p, *ir.consts, *leaves, ir=open_ir(ir),
                    jvp=_Named(flat_jvp, f"jvp_of_{name}"), num_consts=len(ir.consts), name=name)
        return tree.unflatten(out_tree, list(outs))


def _custom_jvp_jvp(primals: list[Any], tangents: list[Any], *, ir: IR, jvp: Any, num_consts: int,
                    name: str) -> tuple[Any, Any]:
    args = primals[num_consts:]
    arg_tangents = [instantiate(t, _aval(a)) for t, a in zip(tangents[num_consts:], args)]
    return jvp(list(args), arg_tangents)


def _aval(value: Any) -> ShapedArray:
    return value.aval if isinstance(value, Tensor) else ShapedArray((), value.dtype)


def _custom_jvp_batch(args: list[Any], dims: list[Any], *, axis_size: int, ir: IR, jvp: Any, num_consts: int,
                      name: str) -> tuple[Any, Any]:
    from funcgrad.transforms.batching import vmap
    args = [broadcast_batched(as_tensor(a), d, axis_size) for a, d in zip(args, dims)]
    batched, _ = vmap_ir(ir, [0] * len(args), axis_size, out_dims=[0] * len(ir.outputs))
    inner = jvp

    def batched_jvp(primal_leaves: list[Any], tangent_leaves: list[Any]) -> Any:
        return vmap(lambda p, t: tuple(inner(list(p), list(t))))(list(primal_leaves), list(tangent_leaves))

    n_extra = len(batched.consts)
    outs = bind(custom_jvp_call_p, *batched.consts, *args, ir=open_ir(batched),
                jvp=_Named(batched_jvp, f"vmap({inner.__name__})"),
                num_consts=n_extra + num_consts, name=name)
    return list(outs), [0] * len(outs)


jvp_rules[custom_jvp_call_p] = _custom_jvp_jvp
batch_rules[custom_jvp_call_p] = _custom_jvp_batch


# --- custom_vjp ---------------------------------------------------------------------------------

class custom_vjp(_CustomFunction):  # noqa: N801
    """A function with a hand-written VJP: ``fwd(*args) -> (out, residuals)`` and
    ``bwd(residuals, cotangent) -> tuple of one cotangent per argument``. With ``nondiff_argnums``
    those arguments come first to ``bwd`` (``bwd(*nondiff, residuals, cotangent)``), which returns
    cotangents for the other arguments only; ``fwd`` takes all of them, as JAX's."""

    _label = "custom_vjp"

    def __init__(self, fun: Callable[..., Any], nondiff_argnums: int | Sequence[int] = ()) -> None:
        super().__init__(fun, nondiff_argnums)
        self.fwd: Callable[..., Any] | None = None
        self.bwd: Callable[..., Any] | None = None

    def defvjp(self, fwd: Callable[..., Any], bwd: Callable[..., Any], symbolic_zeros: bool = False) -> None:
        if symbolic_zeros:
            raise NotImplementedError(f"custom_vjp {self._name}: symbolic_zeros=True is not supported")
        self.fwd, self.bwd = fwd, bwd

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        name = self._name
        if self.fwd is None or self.bwd is None:
            raise AttributeError(f"custom_vjp function {name} has no rule; call .defvjp(fwd, bwd) first")
        diff, nondiff, positions = self._split(args, kwargs)
        ir, out_tree, leaves = self._trace(diff, nondiff, positions)
        in_tree = tree.structure(tuple(diff))
        in_avals = [leaf.aval for leaf in leaves]
        fwd, bwd = self.fwd, self.bwd
        res_trees: list[Any] = []

        weak = [leaf._weak for leaf in leaves]

        def flat_fwd(arg_leaves: list[Any]) -> tuple[list[Any], list[Any]]:
            arg_leaves = _with_weak_types(arg_leaves, weak)
            result = fwd(*_merge(positions, nondiff, tree.unflatten(in_tree, arg_leaves)))
            if not isinstance(result, (tuple, list)) or len(result) != 2:
                raise TypeError(f"the custom_vjp fwd of {name} must return a pair (output, residuals), got "
                                f"{_describe(result)}")
            out, residuals = result
            if tree.structure(out) != out_tree:
                raise TypeError(f"the custom_vjp fwd of {name} returned an output of structure {tree.structure(out)}, "
                                f"but {name} returns {out_tree}")
            res_leaves, res_tree = tree.flatten(residuals)
            res_trees[:] = [res_tree]
            return [as_tensor(o) for o in tree.leaves(out)], [as_tensor(r) for r in res_leaves]

        def flat_bwd(res_leaves: list[Any], ct_leaves: list[Any]) -> list[Any]:
            cts = bwd(*nondiff, tree.unflatten(res_trees[0], res_leaves), tree.unflatten(out_tree, ct_leaves))
            if not isinstance(cts, tuple):
                raise TypeError(f"the custom_vjp bwd of {name} must return a tuple with one cotangent per "
                                f"differentiable argument, got {type(cts).__name__}")
            ct_leaves_in, ct_tree = tree.flatten(cts, is_leaf=lambda x: x is None)
            if len(cts) != in_tree.num_leaves and ct_tree.num_leaves != len(in_avals):
                raise TypeError(f"the custom_vjp bwd of {name} returned {len(cts)} cotangents for "
                                f"{len(diff)} arguments")
            flat = [zeros(a) if c is None else as_tensor(c) for c, a in zip(ct_leaves_in, in_avals)]
            for c, a in zip(flat, in_avals):
                if c.shape != a.shape:
                    raise TypeError(f"the custom_vjp bwd of {name} returned a cotangent of shape {c.shape} for "
                                    f"an argument of shape {a.shape}")
                if dtypes.is_float(a.dtype) and not dtypes.is_float(c.dtype):
                    raise TypeError(f"the custom_vjp bwd of {name} returned a cotangent of dtype {c.dtype.name} for "
                                    f"an argument of dtype {a.dtype.name}; return a floating-point cotangent "
                                    f"(e.g. ct.astype('{a.dtype.name}'))")
            return [_cast(c, a.dtype) for c, a in zip(flat, in_avals)]

        outs = bind(custom_vjp_call_p, *ir.consts, *leaves, ir=open_ir(ir), fwd=_Named(flat_fwd, f"fwd_{name}"),
                    bwd=_Named(flat_bwd, f"bwd_{name}"), num_consts=len(ir.consts), name=name)
        return tree.unflatten(out_tree, list(outs))


def _describe(value: Any) -> str:
    """A short description of what a user's rule returned, for errors."""
    if isinstance(value, Tensor):
        return f"an array of shape {value.shape}"
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


def _custom_vjp_jvp(primals: list[Any], tangents: list[Any], *, ir: IR, fwd: Any, bwd: Any, num_consts: int,
                    name: str) -> tuple[Any, Any]:
    args = primals[num_consts:]
    outs, residuals = fwd(list(args))
    arg_tangents = [instantiate(t, _aval(a)) for t, a in zip(tangents[num_consts:], args)]
    out_avals = tuple(o.aval for o in outs)
    tangent_outs = bind(custom_lin_p, *residuals, *arg_tangents, num_residuals=len(residuals), bwd=bwd,
                        out_avals=out_avals)
    return outs, list(tangent_outs)


def _custom_lin_transpose(cts: list[Any], *operands: Any, num_residuals: int, bwd: Any,
                          out_avals: tuple[ShapedArray, ...]) -> list[Any]:
    residuals = list(operands[:num_residuals])
    cts = [instantiate(ct, a) for ct, a in zip(cts, out_avals)]
    return [None] * num_residuals + list(bwd(residuals, cts))


def _custom_vjp_batch(args: list[Any], dims: list[Any], *, axis_size: int, ir: IR, fwd: Any, bwd: Any,
                      num_consts: int, name: str) -> tuple[Any, Any]:
    from funcgrad.transforms.batching import vmap
    args = [broadcast_batched(as_tensor(a), d, axis_size) for a, d in zip(args, dims)]
    batched, _ = vmap_ir(ir, [0] * len(args), axis_size, out_dims=[0] * len(ir.outputs))
    n_extra = len(batched.consts)
    # fwd and bwd see only the (now batched) arguments, so they are batched by vmap as a whole
    batched_fwd = _Named(lambda leaves: vmap(lambda xs: tuple(fwd(list(xs))))(list(leaves)), f"vmap({fwd.__name__})")
    batched_bwd = _Named(lambda res, cts: vmap(lambda r, c: bwd(list(r), list(c)))(list(res), list(cts)),
                         f"vmap({bwd.__name__})")
    outs = bind(custom_vjp_call_p, *batched.consts, *args, ir=open_ir(batched), fwd=batched_fwd, bwd=batched_bwd,
                num_consts=n_extra + num_consts, name=name)
    return list(outs), [0] * len(outs)


jvp_rules[custom_vjp_call_p] = _custom_vjp_jvp
transpose_rules[custom_lin_p] = _custom_lin_transpose
batch_rules[custom_vjp_call_p] = _custom_vjp_batch


# --- checkpoint (rematerialization) -------------------------------------------------------------

def checkpoint(fn: Callable[..., Any] | None = None, *, prevent_cse: bool = True,
               policy: Callable[..., bool] | None = None) -> Any:
    """Wrap ``fn`` so reverse mode recomputes its intermediates in the backward pass instead of
    storing them (trading compute for memory). Also available as ``fg.remat``.

    ``policy(primitive, *input_avals, **params) -> bool`` says which intermediates may be saved
    instead (JAX's ``checkpoint_policies``: ``dots_saveable``, ``save_only_these_names`` with
    ``checkpoint_name``, ...); without one nothing is saved but the inputs.
    """
    if fn is None:  # @checkpoint(policy=...)
        return functools.partial(checkpoint, prevent_cse=prevent_cse, policy=policy)
    if policy is not None and not callable(policy):
        raise TypeError(f"checkpoint: policy must be a callable (prim, *avals, **params) -> bool, got {policy!r}")
    name = getattr(fn, "__name__", "fn")
    extra = {} if policy is None else {"policy": policy}

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        ir, out_tree, leaves = trace_function(fn, args, f"checkpoint({name})", concrete=False)
        outs = bind(checkpoint_p, *ir.consts, *leaves, ir=open_ir(ir), name=name, **extra)
        return tree.unflatten(out_tree, list(outs))

    return wrapper


def checkpoint_name(x: Any, name: str) -> Any:
    """``x`` (every leaf), named ``name`` for checkpoint policies (``save_only_these_names``, ...)."""
    if not isinstance(name, str):
        raise TypeError(f"checkpoint_name: the name must be a string, got {name!r}")
    return tree.map(lambda leaf: bind(name_p, as_tensor(leaf), name=name), x)


jvp_rules[name_p] = lambda primals, tangents, *, name: (bind(name_p, primals[0], name=name), tangents[0])
batch_rules[name_p] = lambda args, dims, *, axis_size, name: (bind(name_p, args[0], name=name), dims[0])


def _checkpoint_jvp(primals: list[Any], tangents: list[Any], *, ir: IR, name: str, **extra: Any) -> tuple[Any, Any]:
    has = [t is not None for t in tangents]
    new_ir, out_has = jvp_ir(ir, has)
    outs = bind(checkpoint_p, *new_ir.consts, *primals, *(t for t in tangents if t is not None),
                ir=open_ir(new_ir), name=name, **extra)
    n = len(ir.outputs)
    supplied = iter(outs[n:])
    return list(outs[:n]), [next(supplied) if h else None for h in out_has]


def _checkpoint_partial_eval(eqn: Eqn, unknown: Sequence[bool]) -> tuple[list[Eqn], list[Eqn], list[bool]]:
    """The known side computes only the known outputs; the unknown side re-runs the whole body from
    the inputs (its residuals are just the inputs), so nothing inside is saved. With a policy, the
    known values it calls saveable are saved too (outputs of the known side), and the unknown side
    recomputes the others from the inputs and the saved values."""
    sub: IR = eqn.param_dict["ir"]
    name = eqn.param_dict["name"]
    policy = eqn.param_dict.get("policy")
    if policy is not None:
        return _checkpoint_partial_eval_policy(eqn, unknown, policy)
    known_ir, _, out_unknown, n_res = partial_eval(sub, list(unknown))
    n_known = len(known_ir.outputs) - n_res
    known_only = dce(IR(known_ir.in_vars, known_ir.eqns, known_ir.outputs[:n_known]))
    known_eqn = Eqn(checkpoint_p, [a for a, u in zip(eqn.inputs, unknown) if not u],
                    {"ir": known_only, "name": name}, [v for v, u in zip(eqn.outputs, out_unknown) if not u])
    recompute = dce(sub, used_outputs=out_unknown)
    unknown_eqn = Eqn(checkpoint_p, list(eqn.inputs), {"ir": recompute, "name": name},
                      [v for v, u in zip(eqn.outputs, out_unknown) if u])
    return [known_eqn], [unknown_eqn], out_unknown


def _checkpoint_partial_eval_policy(eqn: Eqn, unknown: Sequence[bool],
                                    policy: Callable[..., Any]) -> tuple[list[Eqn], list[Eqn], list[bool]]:
    """Split as partial evaluation does (known side: outputs and residuals), then keep as residuals
    only the known inputs and the values of equations ``policy`` calls saveable: the equations that
    compute the other residuals move to the unknown side, which recomputes them."""
    params = eqn.param_dict
    sub: IR = params["ir"]
    known_ir, unknown_ir, out_unknown, n_res = partial_eval(sub, list(unknown))
    n_known = len(known_ir.outputs) - n_res
    residuals = list(known_ir.outputs[n_known:])
    # the known equations that compute the residuals; saveable ones are cut (their outputs are saved)
    computing = dce(IR(known_ir.in_vars, known_ir.eqns, residuals))
    saved: dict[int, Var] = {}
    live: set[int] = {a.id for a in residuals if isinstance(a, Var)}
    recompute: list[Eqn] = []
    for inner in reversed(computing.eqns):
        if not any(v.id in live for v in inner.outputs):
            continue
        if _saveable(policy, inner):
            saved.update((v.id, v) for v in inner.outputs if v.id in live)
            continue
        recompute.append(inner)
        live.update(a.id for a in inner.inputs if isinstance(a, Var))
    recompute.reverse()
    saved_vars = list(saved.values())
    known_inputs = [a for a, u in zip(eqn.inputs, unknown) if not u]
    known_side = dce(IR(known_ir.in_vars, known_ir.eqns, list(known_ir.outputs[:n_known]) + saved_vars))
    saved_outer = [Var(v.aval) for v in saved_vars]
    known_eqn = Eqn(checkpoint_p, known_inputs, {**params, "ir": known_side},
                    [v for v, u in zip(eqn.outputs, out_unknown) if not u] + saved_outer)
    unknown_side = dce(IR(saved_vars + list(sub.in_vars), recompute + list(unknown_ir.eqns), unknown_ir.outputs))
    unknown_eqn = Eqn(checkpoint_p, saved_outer + list(eqn.inputs), {**params, "ir": unknown_side},
                      [v for v, u in zip(eqn.outputs, out_unknown) if u])
    return [known_eqn], [unknown_eqn], out_unknown


def _saveable(policy: Callable[..., Any], eqn: Eqn) -> bool:
    """Whether ``policy`` lets the outputs of ``eqn`` be saved (asked as JAX asks: the primitive,
    the input avals, the params; funcgrad's dot_general params are ``contracting`` and ``batch``)."""
    avals = [a.aval for a in eqn.inputs]
    answer = policy(eqn.primitive, *avals, **eqn.param_dict)
    if not isinstance(answer, (bool, np.bool_)):
        raise TypeError(f"checkpoint: the policy returned {answer!r} for {eqn.primitive.name}; a policy returns "
                        "True (save) or False (recompute)")
    return bool(answer)


def _checkpoint_transpose(cts: list[Any], *operands: Any, ir: IR, name: str, **extra: Any) -> list[Any]:
    """The unknown side of a checkpoint recomputes the primal values, so its body is not linear as a
    whole: a call inside it (jit, cond, scan, checkpoint) returns primal and tangent outputs at once.
    Split the body into the recomputation and the linear part first; the transposed call runs the
    recomputation, then the transpose of the linear part."""
    linear = [is_undefined(op) for op in operands]
    known_ir, linear_ir, out_unknown, n_residuals = partial_eval(ir, linear)
    n_known_outputs = len(known_ir.outputs) - n_residuals
    values = [op for op in operands if not is_undefined(op)]
    value_avals = [v.aval for v, lin in zip(ir.in_vars, linear) if not lin]
    linear_avals = [v.aval for v, lin in zip(ir.in_vars, linear) if lin]
    ct_avals = [aval for aval, unknown in zip(ir.out_avals, out_unknown) if unknown]

    def backward(*flat: Tensor) -> list[Tensor]:
        residuals = evaluate(known_ir, *flat[:len(values)])[n_known_outputs:]
        flags = [False] * n_residuals + [True] * len(linear_avals)
        results = backward_pass(linear_ir, flags, residuals, list(flat[len(values):]))
        return [instantiate(ct, aval) for ct, aval in zip(results, linear_avals)]

    transposed = simplify(trace_avals(backward, value_avals + ct_avals, f"transpose({name})"))
    cts = [instantiate(ct, aval) for ct, aval, unknown in zip(cts, ir.out_avals, out_unknown) if unknown]
    results = iter(bind(checkpoint_p, *transposed.consts, *values, *cts, ir=open_ir(transposed),
                        name=f"transpose({name})", **extra))
    return [next(results) if lin else None for lin in linear]


jvp_rules[checkpoint_p] = _checkpoint_jvp
pe_rules[checkpoint_p] = _checkpoint_partial_eval
transpose_rules[checkpoint_p] = _checkpoint_transpose
batch_rules[checkpoint_p] = call_batch_rule(checkpoint_p)


class _DotsSaveable:
    """Save the results of matrix products (``dot_general``); with ``no_batch_dims``, only those
    without batch dimensions."""

    def __init__(self, no_batch_dims: bool) -> None:
        self.no_batch_dims = no_batch_dims

    def __call__(self, prim: Any, *avals: Any, **params: Any) -> bool:
        if prim is not dot_general_p:
            return False
        return not self.no_batch_dims or not any(params.get("batch", ((), ())))

    def __repr__(self) -> str:
        return "dots_with_no_batch_dims_saveable" if self.no_batch_dims else "dots_saveable"


class _Names:
    """A policy on ``checkpoint_name`` values: save those ``keep`` says of their name, nothing else."""

    def __init__(self, label: str, names: Sequence[str], among: bool) -> None:
        self.label, self.names, self.among = label, frozenset(names), among

    def __call__(self, prim: Any, *avals: Any, **params: Any) -> bool:
        if prim is not name_p:
            return False
        return (params["name"] in self.names) == self.among

    def __repr__(self) -> str:
        return f"{self.label}({', '.join(sorted(self.names))})"


def everything_saveable(*_: Any, **__: Any) -> bool:
    """Save everything (as if there were no checkpoint)."""
    return True


def nothing_saveable(*_: Any, **__: Any) -> bool:
    """Save nothing but the inputs: recompute everything (checkpoint's default)."""
    return False


def save_only_these_names(*names: str) -> Callable[..., bool]:
    """Save only the values named (``checkpoint_name``) with one of ``names``."""
    return _Names("save_only_these_names", names, among=True)


def save_any_names_but_these(*names: str) -> Callable[..., bool]:
    """Save every named value except those named with one of ``names``; unnamed values are recomputed."""
    return _Names("save_any_names_but_these", names, among=False)


def save_anything_except_these_names(*names: str) -> Callable[..., bool]:
    """Save every value except the ones named with one of ``names``."""
    def policy(prim: Any, *avals: Any, **params: Any) -> bool:
        return not (prim is name_p and params["name"] in names)
    return policy


def save_from_both_policies(policy_1: Callable[..., bool], policy_2: Callable[..., bool]) -> Callable[..., bool]:
    """Save what either policy saves."""
    def policy(prim: Any, *avals: Any, **params: Any) -> bool:
        return bool(policy_1(prim, *avals, **params)) or bool(policy_2(prim, *avals, **params))
    return policy


dots_saveable = _DotsSaveable(no_batch_dims=False)
dots_with_no_batch_dims_saveable = _DotsSaveable(no_batch_dims=True)

# as jax.checkpoint_policies
checkpoint_policies = types.SimpleNamespace(
    everything_saveable=everything_saveable, nothing_saveable=nothing_saveable,
    dots_saveable=dots_saveable, checkpoint_dots=dots_saveable,
    dots_with_no_batch_dims_saveable=dots_with_no_batch_dims_saveable,
    checkpoint_dots_with_no_batch_dims=dots_with_no_batch_dims_saveable,
    save_only_these_names=save_only_these_names, save_any_names_but_these=save_any_names_but_these,
    save_anything_except_these_names=save_anything_except_these_names,
    save_from_both_policies=save_from_both_policies,
)


def saved_residuals(fn: Callable[..., Any], *args: Any) -> list[tuple[ShapedArray, str]]:
    """What reverse mode saves between the forward and the backward pass of ``fn(*args)``: one
    ``(aval, where it comes from)`` per residual, as JAX's ``saved_residuals``."""
    from funcgrad.core.trace import argument_names
    from funcgrad.transforms.ad import _Linearized
    lin = _Linearized(fn, args, False, "saved_residuals")
    names = argument_names(fn, args)
    known_ir = lin.known_ir
    residuals = list(known_ir.outputs[len(known_ir.outputs) - lin.num_residuals:])
    inputs = {v.id: i for i, v in enumerate(known_ir.in_vars)}
    # the arguments first, in their order (as JAX lists them), then the computed values
    residuals.sort(key=lambda a: inputs.get(a.id, len(inputs)) if isinstance(a, Var) else len(inputs))
    return [(atom.aval, _residual_source(known_ir, atom, names)) for atom in residuals]


def _residual_source(ir: IR, atom: Any, arg_names: Sequence[str] | None) -> str:
    """Where a value of ``ir`` comes from: an argument, a constant, or an equation (looking into
    calls, whose outputs are their bodies')."""
    if not isinstance(atom, Var):
        return "from a literal"
    for i, var in enumerate(ir.in_vars):
        if var.id == atom.id:
            if arg_names is not None and i < len(arg_names):
                return f"from the {arg_names[i]}"
            return f"from the argument at flattened index {i}"
    if any(var.id == atom.id for var in ir.const_vars):
        return "from a constant"
    eqn = ir.producers().get(atom.id)
    if eqn is None:
        return "from an unknown source"
    if eqn.primitive is name_p:
        return f"named '{eqn.param_dict['name']}'"
    sub = eqn.param_dict.get("ir")
    if isinstance(sub, IR) and eqn.primitive.multiple_results:
        index = [v.id for v in eqn.outputs].index(atom.id)
        inner = sub.outputs[index]
        inner_source = _residual_source(sub, inner, None)
        if inner_source.startswith("from the argument at flattened index"):
            position = int(inner_source.rsplit(" ", 1)[1])
            return _residual_source(ir, eqn.inputs[position], arg_names) if position < len(eqn.inputs) \
                else inner_source
        return inner_source
    return f"output of {eqn.primitive.name}"


def print_saved_residuals(fn: Callable[..., Any], *args: Any) -> None:
    """Print ``saved_residuals(fn, *args)``, one line per residual (``f32[3,4] output of sin``)."""
    for aval, source in saved_residuals(fn, *args):
        print(f"{aval} {source}")


# --- eval_shape ---------------------------------------------------------------------------------

def eval_shape(fn: Callable[..., Any], *args: Any) -> Any:
    """The output types of ``fn(*args)`` as a pytree of ``ShapedArray`` (shape, dtype); nothing runs.

    >>> eval_shape(lambda x: x @ x.T, fnp.ones((3, 4)))   # ShapedArray(shape=(3, 3), dtype=float32)
    """
    ir, out_tree, _ = trace_function(fn, args, "eval_shape", concrete=False)
    return tree.unflatten(out_tree, list(ir.out_avals))


def _custom_lin_unsupported(*args: Any, **params: Any) -> Any:
    from funcgrad.ir.higher_order import _custom_lin_impl
    return _custom_lin_impl()


# custom_lin only exists between linearization and transposition; jvp or vmap of it means forward
# mode reached a custom_vjp function, which has no forward rule
jvp_rules[custom_lin_p] = _custom_lin_unsupported
batch_rules[custom_lin_p] = _custom_lin_unsupported
