"""The public differentiation API: jvp, linearize, vjp, grad, value_and_grad, jacfwd, jacrev, hessian.

Each wrapper traces the user's function into an IR, transforms the IR (``jvp_ir``, then
``partial_eval`` and ``transpose_ir`` for reverse mode), and evaluates the result by binding its
equations, so it composes with every other transformation and with itself.

Reverse mode is linearize + transpose, as in JAX: ``vjp`` runs the known part of the linearized
IR now (the forward pass, which saves residuals) and returns a function that evaluates the
transposed linear part on the cotangents (the backward pass).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from funcgrad.core.tensor import Tensor, as_tensor, bind, evaluate
from funcgrad.core.trace import argument_names, leaf_aval, trace_flat
from funcgrad.ir import dtypes
from funcgrad.ir import primitives as P
from funcgrad.ir.core import IR
from funcgrad.transforms.jvp import is_differentiable, jvp_ir, zeros
from funcgrad.transforms.partial_eval import partial_eval
from funcgrad.transforms.transpose import transpose_ir
from funcgrad.util import tree


def trace_function(fn: Callable[..., Any], args: Sequence[Any], label: str,
                   concrete: bool = True, read_known: list[bool] | None = None) -> tuple[IR, Any, list[Tensor]]:
    """Trace ``fn(*args)``; returns (IR, output tree, flat input leaves as Tensors).

    With ``concrete`` (grad, jvp, vjp), as in JAX, the inputs' values are known to the trace, so
    ``if x < 3:`` works in ``fn`` outside jit (a value traced by jit or vmap stays abstract: its
    trace knows no value for it, and the concretization error is raised as before)."""
    leaves, in_tree = tree.flatten(tuple(args))
    avals = [leaf_aval(leaf, f"argument leaf {i} of {label}") for i, leaf in enumerate(leaves)]
    values = [as_tensor(leaf) for leaf in leaves]
    ir, out_tree = trace_flat(fn, avals, in_tree, label, argument_names(fn, args),
                              known=values if concrete else None, read_known=read_known)
    return ir, out_tree, values


def _check_tangent(primal: Tensor, tangent: Any, index: int) -> Tensor:
    tangent = as_tensor(tangent)
    if tangent.shape != primal.shape:
        raise ValueError(f"jvp: tangent {index} has shape {tangent.shape} but its primal has shape {primal.shape}")
    if is_differentiable(primal.aval) and tangent.dtype != primal.dtype:
        raise TypeError(f"jvp: tangent {index} has dtype {tangent.dtype.name} but its primal has dtype "
                        f"{primal.dtype.name}; they must match")
    return tangent


def jvp(fn: Callable[..., Any], primals: Sequence[Any], tangents: Sequence[Any]) -> tuple[Any, Any]:
    """Forward-mode derivative: ``(fn(*primals), d fn(*primals) . tangents)``.

    >>> jvp(fnp.sin, (0.0,), (1.0,))   # (0.0, 1.0)
    """
    if not isinstance(primals, (tuple, list)) or not isinstance(tangents, (tuple, list)):
        raise TypeError("jvp takes primals and tangents as tuples (or lists) of arguments")
    primal_leaves, primal_tree = tree.flatten(tuple(primals))
    tangent_leaves, tangent_tree = tree.flatten(tuple(tangents))
    if primal_tree != tangent_tree:
        raise ValueError(f"jvp: primals {primal_tree} and tangents {tangent_tree} have different structures")
    ir, out_tree, primal_values = trace_function(fn, primals, "jvp")
    has_tangent = [is_differentiable(v.aval) for v in ir.in_vars]
    tangent_values = [_check_tangent(p, t, i) for i, (p, t, h) in
                      enumerate(zip(primal_values, tangent_leaves, has_tangent)) if h]
    jir, out_has_tangent = jvp_ir(ir, has_tangent, instantiate_outputs=True)
    _reject_custom_lin(jir)
    results = [as_tensor(r) for r in evaluate(jir, *primal_values, *tangent_values)]
    outs, out_tangents = results[:len(ir.outputs)], iter(results[len(ir.outputs):])
    tangents_out = [next(out_tangents) if h else zeros(o.aval) for o, h in zip(outs, out_has_tangent)]
    return tree.unflatten(out_tree, outs), tree.unflatten(out_tree, tangents_out)


def _reject_custom_lin(ir: IR) -> None:
    """Raise now (not at realize time) if forward mode reached a custom_vjp function."""
    from funcgrad.ir.higher_order import _custom_lin_impl, custom_lin_p
    if any(eqn.primitive is custom_lin_p for eqn in ir.eqns):
        _custom_lin_impl()


class _Linearized:
    """The result of linearizing: residuals of the forward pass plus the linear IR that uses them."""

    def __init__(self, fn: Callable[..., Any], primals: Sequence[Any], has_aux: bool, label: str) -> None:
        ir, out_tree, values = trace_function(fn, primals, label)
        if has_aux:
            if out_tree.num_leaves == 0 or not _is_pair(out_tree):
                raise TypeError(f"{label} with has_aux=True needs the function to return a pair (output, aux), "
                                f"got {out_tree}")
            out_tree, self.aux_tree = out_tree.children()
            n_main = out_tree.num_leaves
        else:
            n_main = len(ir.outputs)
        self.in_tree = tree.structure(tuple(primals))
        self.out_tree = out_tree
        self.in_avals = ir.in_avals
        self.has_tangent = [is_differentiable(v.aval) for v in ir.in_vars]
        main_ir = IR(ir.in_vars, ir.eqns, ir.outputs[:n_main], ir.const_vars, ir.consts)
        jir, out_has_tangent = jvp_ir(main_ir, self.has_tangent, instantiate_outputs=True)
        n_in = len(ir.in_vars)
        known_ir, self.linear_ir, out_unknown, self.num_residuals = partial_eval(
            jir, [False] * n_in + [True] * sum(self.has_tangent))
        self.known_ir = known_ir  # (outputs, then residuals: saved_residuals reads where they come from)
        known = [as_tensor(r) for r in evaluate(known_ir, *values)]
        self.outs = known[:n_main]
        self.residuals = known[len(known) - self.num_residuals:]
        # which outputs have a tangent that depends on the inputs (the others' derivative is zero)
        tangent_unknown = out_unknown[n_main:]
        it = iter(tangent_unknown)
        self.out_linear = [next(it) if h else False for h in out_has_tangent]
        self.out_avals = [o.aval for o in self.outs]
        aux_ir = IR(ir.in_vars, ir.eqns, ir.outputs[n_main:], ir.const_vars, ir.consts) if has_aux else None
        self.aux = tree.unflatten(self.aux_tree, [as_tensor(a) for a in evaluate(aux_ir, *values)]) \
            if aux_ir is not None else None
        self._transposed: IR | None = None

    def pullback(self, cotangents: Sequence[Any]) -> list[Tensor]:
        """Cotangents of every flat input (zeros for non-differentiable inputs)."""
        if self._transposed is None:
            linear = [False] * self.num_residuals + [True] * sum(self.has_tangent)
            self._transposed = transpose_ir(self.linear_ir, linear)
        cts = [ct for ct, lin in zip(cotangents, self.out_linear) if lin]
        results = iter(as_tensor(r) for r in evaluate(self._transposed, *self.residuals, *cts))
        return [next(results) if h else zeros(aval) for aval, h in zip(self.in_avals, self.has_tangent)]


def _is_pair(treedef: Any) -> bool:
    return treedef.node_type in (tuple, list) and len(treedef.children()) == 2


class VjpFunction:
    """The function ``vjp`` returns, ``vjp_fn(cotangent) -> (one cotangent per primal)``. As JAX's it
    is a pytree whose leaves are the saved residuals (the rest, the linear IR, is its structure), so
    it can be returned from ``jit`` or ``make_ir`` and passed to a jitted function."""

    def __init__(self, lin: _Linearized) -> None:
        self._lin = lin

    def __call__(self, cotangent: Any) -> tuple[Any, ...]:
        lin = self._lin
        ct_leaves, ct_tree = tree.flatten(cotangent)
        if ct_tree != lin.out_tree:
            raise ValueError(f"vjp: the cotangent has structure {ct_tree} but the output has {lin.out_tree}")
        checked: list[Any] = []  # Tensors, or NumPy scalars that stay literals
        for i, (ct, aval) in enumerate(zip(ct_leaves, lin.out_avals)):
            if isinstance(ct, np.generic) and ct.dtype == aval.dtype:
                checked.append(ct)  # stays an inline literal in traced IRs (grad's seed 1.0)
                continue
            ct = as_tensor(ct)
            if ct.shape != aval.shape:
                raise ValueError(f"vjp: cotangent {i} has shape {ct.shape}, the output has shape {aval.shape}")
            if is_differentiable(aval) and ct.dtype != aval.dtype:
                ct = bind(P.convert_element_type_p, ct, new_dtype=aval.dtype)
            checked.append(ct)
        cts_in = lin.pullback(checked)
        return tuple(tree.unflatten(lin.in_tree, cts_in))

    def __repr__(self) -> str:
        return f"<vjp function of {self._lin.in_tree} with {len(self._lin.residuals)} residuals>"


class LinearizedFunction:
    """The function ``linearize`` returns, ``jvp_fn(*tangents)``: a pytree of its residuals too."""

    def __init__(self, lin: _Linearized) -> None:
        self._lin = lin

    def __call__(self, *tangents: Any) -> Any:
        lin = self._lin
        leaves, t_tree = tree.flatten(tuple(tangents))
        if t_tree != lin.in_tree:
            raise ValueError(f"linearize: tangents {t_tree} do not match the primals {lin.in_tree}")
        values = [as_tensor(t) for t, h in zip(leaves, lin.has_tangent) if h]
        expected = [aval for aval, h in zip(lin.in_avals, lin.has_tangent) if h]
        for index, (tangent, aval) in enumerate(zip(values, expected)):
            if tangent.shape != aval.shape:
                raise ValueError(f"linearize: tangent {index} has shape {tangent.shape} but its primal has shape "
                                 f"{aval.shape}")
        _reject_custom_lin(lin.linear_ir)
        results = iter(as_tensor(r) for r in evaluate(lin.linear_ir, *lin.residuals, *values))
        outs = [next(results) if linear else zeros(aval) for aval, linear in zip(lin.out_avals, lin.out_linear)]
        return tree.unflatten(lin.out_tree, outs)


def _flatten_linear(fn: VjpFunction | LinearizedFunction) -> tuple[list[Any], Any]:
    return list(fn._lin.residuals), _Static(fn._lin)


def _unflatten_linear(cls: type) -> Callable[[Any, Sequence[Any]], Any]:
    def unflatten(static: _Static, residuals: Sequence[Any]) -> Any:
        lin = copy.copy(static.lin)  # the same linear IR (and transposition cache), new residual values
        lin.residuals = list(residuals)
        return cls(lin)
    return unflatten


class _Static:
    """A linearization's structure in a TreeDef: compared by identity (the same linear IR)."""

    __funcgrad_uncached__ = True  # it holds the residuals: tree's cache of checked structures must not keep it

    def __init__(self, lin: _Linearized) -> None:
        self.lin = lin

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Static) and other.lin.linear_ir is self.lin.linear_ir

    def __hash__(self) -> int:
        return id(self.lin.linear_ir)

    def __repr__(self) -> str:
        return f"linearized({self.lin.in_tree})"


tree.register(VjpFunction, _flatten_linear, _unflatten_linear(VjpFunction))
tree.register(LinearizedFunction, _flatten_linear, _unflatten_linear(LinearizedFunction))


def vjp(fn: Callable[..., Any], *primals: Any, has_aux: bool = False) -> Any:
    """Reverse-mode derivative: ``(fn(*primals), vjp_fn)`` where ``vjp_fn(cotangent)`` returns a tuple
    with one cotangent per primal (pytrees like the primals). With ``has_aux``, returns
    ``(out, vjp_fn, aux)``. ``vjp_fn`` is a pytree of the saved residuals (it can leave a jit).

    >>> out, pullback = vjp(lambda x: x * x, 3.0); pullback(1.0)   # (6.0,)
    """
    lin = _Linearized(fn, primals, has_aux, "vjp")
    out = tree.unflatten(lin.out_tree, lin.outs)
    vjp_fn = VjpFunction(lin)
    return (out, vjp_fn, lin.aux) if has_aux else (out, vjp_fn)


def linearize(fn: Callable[..., Any], *primals: Any) -> tuple[Any, Callable[..., Any]]:
    """``(fn(*primals), jvp_fn)`` where ``jvp_fn(*tangents)`` evaluates the linearized function
    without re-running the forward pass (it uses the saved residuals)."""
    lin = _Linearized(fn, primals, False, "linearize")
    return tree.unflatten(lin.out_tree, lin.outs), LinearizedFunction(lin)


def _check_argnums(argnums: int | Sequence[int], num_args: int, label: str) -> tuple[int, ...]:
    nums = (argnums,) if isinstance(argnums, int) else tuple(argnums)
    if not nums:
        raise ValueError(f"{label}: argnums must name at least one argument")
    for n in nums:
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"{label}: argnums must be an int or a sequence of ints, got {argnums!r}")
        if not -num_args <= n < num_args:
            raise ValueError(f"{label}: argnums {n} is out of range for a function called with {num_args} "
                             "positional arguments")
    return tuple(n % num_args for n in nums)


def _check_float_inputs(args: Sequence[Any], argnums: Sequence[int], label: str,
                        holomorphic: bool = False) -> None:
    for n in argnums:
        for leaf in tree.leaves(args[n]):
            aval, _ = leaf_aval(leaf, f"argument {n}")
            if holomorphic and not dtypes.is_complex(aval.dtype):
                raise TypeError(f"{label} with holomorphic=True requires complex inputs, but argument {n} has a "
                                f"leaf of dtype {aval.dtype.name}. Cast it with .astype(complex64).")
            if not dtypes.is_inexact(aval.dtype):
                raise TypeError(f"{label} requires real-valued (floating-point) inputs, but argument {n} has a "
                                f"leaf of dtype {aval.dtype.name}. Differentiate only floating-point arguments "
                                "(argnums=...), or cast with .astype(float32).")


def value_and_grad(fn: Callable[..., Any], argnums: int | Sequence[int] = 0,
                   has_aux: bool = False, holomorphic: bool = False) -> Callable[..., Any]:
    """A function returning ``(fn(*args), gradient)``; with ``has_aux`` ``((value, aux), gradient)``.
    The gradient has the structure of the ``argnums`` argument(s). ``fn`` must return a real scalar,
    or with ``holomorphic=True`` a complex one (of complex inputs: the gradient is f'(z)). For a real
    function of complex inputs the gradient is JAX's: the conjugate of d f/d re + i d f/d im."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        nums = _check_argnums(argnums, len(args), "grad")
        _check_float_inputs(args, nums, "grad", holomorphic)

        def partial(*diff_args: Any) -> Any:
            full = list(args)
            for n, value in zip(nums, diff_args):
                full[n] = value
            return fn(*full, **kwargs)

        result = vjp(partial, *(args[n] for n in nums), has_aux=has_aux)
        value, pullback = result[0], result[1]
        wanted = dtypes.is_complex if holomorphic else dtypes.is_float
        if not isinstance(value, Tensor) or value.shape != () or not wanted(value.dtype):
            described = (f"shape {value.shape} and dtype {value.dtype.name}" if isinstance(value, Tensor)
                         else type(value).__name__)
            if holomorphic:
                raise TypeError(f"grad with holomorphic=True requires a function returning a complex scalar, "
                                f"got {described}")
            hint = ("; for holomorphic differentiation pass holomorphic=True"
                    if isinstance(value, Tensor) and dtypes.is_complex(value.dtype) else "")
            raise TypeError(f"grad requires a function returning a real scalar, got {described}; "
                            f"use jacrev or vjp for other outputs{hint}")
        grads = pullback(np.ones((), value.dtype)[()])
        grads = grads[0] if isinstance(argnums, int) else grads
        return ((value, result[2]), grads) if has_aux else (value, grads)

    return wrapper


def grad(fn: Callable[..., Any], argnums: int | Sequence[int] = 0, has_aux: bool = False,
         holomorphic: bool = False) -> Callable[..., Any]:
    """The gradient of a scalar function with respect to argument(s) ``argnums``.

    >>> grad(lambda x: (x ** 2).sum())(fnp.arange(3.0)).tolist()   # [0.0, 2.0, 4.0]
    """
    value_and_grad_fn = value_and_grad(fn, argnums, has_aux, holomorphic)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        (value_or_pair, grads) = value_and_grad_fn(*args, **kwargs)
        return (grads, value_or_pair[1]) if has_aux else grads

    return wrapper


# --- the Jacobians' array plumbing, bound as funcgrad.numpy would (the same IR) -----------------

def _reshape(x: Tensor, shape: tuple[int, ...]) -> Tensor:
    return x if x.shape == shape else bind(P.reshape_p, x, new_sizes=shape)


def _rows(x: Tensor, axis: int, start: int, size: int) -> Tensor:
    """``x[..., start:start + size, ...]`` on ``axis`` (a basic slice, as ``x[:, a:b]`` binds it)."""
    if size == x.shape[axis]:
        return x
    starts = [0] * x.ndim
    limits = list(x.shape)
    starts[axis], limits[axis] = (start, start + size) if size else (0, 0)
    return bind(P.slice_p, x, start=tuple(starts), limit=tuple(limits), strides=(1,) * x.ndim)


def _eye(n: int, dtype: np.dtype) -> Tensor:
    """The n x n identity matrix of ``dtype``."""
    rows = bind(P.iota_p, dtype=dtypes.int32, shape=(n, n), dimension=0)
    cols = bind(P.iota_p, dtype=dtypes.int32, shape=(n, n), dimension=1)
    on_diagonal = bind(P.eq_p, bind(P.sub_p, cols, rows), np.int32(0))
    dtype = dtypes.canonicalize(dtype)
    return on_diagonal if dtype == dtypes.bool_ else bind(P.convert_element_type_p, on_diagonal, new_dtype=dtype)


def _split_basis(leaves: Sequence[Tensor], dtype: np.dtype) -> list[Tensor]:
    """Rows of an identity matrix over all elements of ``leaves``, one block per leaf shaped
    ``(total, *leaf.shape)``: the standard basis vectors, as pytree leaves."""
    sizes = [leaf.size for leaf in leaves]
    basis = _eye(sum(sizes), dtype)
    pieces, start = [], 0
    for leaf, size in zip(leaves, sizes):
        pieces.append(_reshape(_rows(basis, 1, start, size), (sum(sizes),) + leaf.shape))
        start += size
    return pieces


def _check_complex_use(label: str, what: str, leaves: Sequence[Any], holomorphic: bool) -> None:
    """JAX's rule: jacfwd's inputs and jacrev's outputs are real unless ``holomorphic`` (then complex)."""
    for leaf in leaves:
        dtype = leaf_aval(leaf)[0].dtype
        if holomorphic and not dtypes.is_complex(dtype):
            raise TypeError(f"{label} with holomorphic=True requires complex {what}, got {dtype.name}")
        if not holomorphic and dtypes.is_complex(dtype):
            raise TypeError(f"{label} requires real-valued {what} (a floating dtype), but got {dtype.name}. "
                            "For holomorphic differentiation, pass holomorphic=True.")


def _jacobian(fn: Callable[..., Any], argnums: int | Sequence[int], forward: bool,
              holomorphic: bool = False) -> Callable[..., Any]:
    from funcgrad.transforms.batching import vmap
    label = "jacfwd" if forward else "jacrev"

    @functools.wraps(fn)
    def wrapper(*args: Any) -> Any:
        nums = _check_argnums(argnums, len(args), label)
        _check_float_inputs(args, nums, label, holomorphic)
        if forward:
            _check_complex_use(label, "inputs", tree.leaves(tuple(args[n] for n in nums)), holomorphic)

        def partial(*diff_args: Any) -> Any:
            full = list(args)
            for n, value in zip(nums, diff_args):
                full[n] = value
            return fn(*full)

        diff = tuple(args[n] for n in nums)
        in_leaves, in_tree = tree.flatten(diff)
        in_leaves = [as_tensor(leaf) for leaf in in_leaves]
        if forward:  # one jvp per input element: columns of the Jacobian
            out_leaves, out_tree = tree.flatten(partial(*diff))
            out_leaves = [as_tensor(o) for o in out_leaves]
            if holomorphic:
                _check_complex_use(label, "outputs", out_leaves, holomorphic)

            def push(*tangent_leaves: Tensor) -> Any:
                return jvp(partial, diff, tree.unflatten(in_tree, tangent_leaves))[1]

            columns = tree.leaves(vmap(push)(*_split_basis(in_leaves, in_leaves[0].dtype)))
            # columns[k] has shape (N, *out_k); block for input leaf j is rows [start_j, start_j + size_j)
            blocks = [[_block(col, in_leaves, j, leading=True, other_shape=o.shape)
                       for j in range(len(in_leaves))] for col, o in zip(columns, out_leaves)]
        else:  # one vjp per output element: rows of the Jacobian
            out_value, pullback = vjp(partial, *diff)
            out_leaves, out_tree = tree.flatten(out_value)
            _check_complex_use(label, "outputs", out_leaves, holomorphic)
            rows = tree.leaves(vmap(lambda *cts: pullback(tree.unflatten(out_tree, cts)))(
                *_split_basis(out_leaves, out_leaves[0].dtype)))
            # rows[j] has shape (M, *in_j); block for output leaf k is rows [start_k, start_k + size_k)
            blocks = [[_block(rows[j], out_leaves, k, leading=False, other_shape=in_leaves[j].shape)
                       for j in range(len(in_leaves))] for k in range(len(out_leaves))]
        per_output = [tree.unflatten(in_tree, row) for row in blocks]
        if isinstance(argnums, int):
            per_output = [p[0] for p in per_output]
        return tree.unflatten(out_tree, per_output)

    return wrapper


def _block(stacked: Tensor, leaves: Sequence[Tensor], index: int, leading: bool,
           other_shape: tuple[int, ...]) -> Tensor:
    """Cut leaf ``index``'s rows out of a vmapped basis result and shape them as out + in."""
    start = sum(leaf.size for leaf in leaves[:index])
    size = leaves[index].size
    part = _rows(stacked, 0, start, size)  # (size, *other)
    if leading:  # jacfwd: part is (in_size, *out) -> (*out, *in)
        if part.ndim > 1:  # the leading axis moved last
            part = bind(P.transpose_p, part, permutation=tuple(range(1, part.ndim)) + (0,))
        return _reshape(part, other_shape + leaves[index].shape)
    return _reshape(part, leaves[index].shape + other_shape)  # jacrev: (out_size, *in) -> (*out, *in)


def jacfwd(fn: Callable[..., Any], argnums: int | Sequence[int] = 0,
           holomorphic: bool = False) -> Callable[..., Any]:
    """The Jacobian by forward mode (one jvp per input element, batched with vmap); for an array
    input and output its shape is ``out.shape + in.shape``. Inputs are real unless ``holomorphic``."""
    return _jacobian(fn, argnums, forward=True, holomorphic=holomorphic)


def jacrev(fn: Callable[..., Any], argnums: int | Sequence[int] = 0,
           holomorphic: bool = False) -> Callable[..., Any]:
    """The Jacobian by reverse mode (one vjp per output element, batched with vmap). Outputs are
    real unless ``holomorphic`` (complex inputs and outputs), as in JAX."""
    return _jacobian(fn, argnums, forward=False, holomorphic=holomorphic)


def jacobian(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """JAX's ``jacobian``: the Jacobian by reverse mode (``jacrev``)."""
    return jacrev(fn, argnums)


def hessian(fn: Callable[..., Any], argnums: int | Sequence[int] = 0) -> Callable[..., Any]:
    """The Hessian: ``jacfwd(jacrev(fn))``."""
    return jacfwd(jacrev(fn, argnums), argnums)
