"""Random small programs of primitives for the differential fuzzers.

A ``Program`` is a straight-line list of ``Step``s over 1-3 inputs: step ``k`` applies one op of
``OPS`` to earlier values (inputs first, then step results) with static parameters, and the program
returns every step result that no later step uses. The same program runs on NumPy
(``run_program(program, np, ...)``, the float64 reference) and on funcgrad
(``run_program(program, fnp, ...)``), inside any transform.

``fuzz_cases()`` is the hypothesis strategy: it draws input shapes (broadcast-compatible variants of
one base shape, rank 0-3, dims 1-5; with ``large=True`` dims up to 129), input values, then 2-8
steps, running NumPy float64 as it goes so every step stays where finite differences are meaningful:

- ``log``/``sqrt`` only of values >= 0.2, ``div`` only by values of magnitude >= 0.3, ``exp`` only of
  values <= 3;
- ``maximum``/``minimum``, ``max`` reductions, ``sort`` and ``where`` only without ties (or a
  condition near 0) within ``TIE_GAP``, so their derivative is defined and a central difference of
  step 1e-6 does not cross a kink;
- every value stays finite, within ``MAX_MAGNITUDE``, at most ``MAX_SIZE`` elements and rank 4.

Large cases (forward values and compiled-vs-interpreter checks only) keep the domain rules but not
the tie rules, and allow ``LARGE_MAX_SIZE`` elements.

A drawn step that breaks one of these becomes ``tanh`` of its first operand (always safe). Each
case records ``scale``, the largest magnitude of any value it computes, for the tolerances.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp

TIE_GAP = 1e-3        # minimal distance from a kink (ties of max/min/sort, where's condition at 0)
MAX_MAGNITUDE = 1e3   # no value may grow past this
MAX_SIZE = 120        # elements per value (finite differences cost two runs per input element)
LARGE_MAX_SIZE = 20000
MAX_RANK = 4


@dataclass(frozen=True)
class Step:
    op: str
    args: tuple[int, ...]          # indices of earlier values
    params: tuple[Any, ...] = ()   # static parameters, hashable


@dataclass(frozen=True)
class Program:
    input_shapes: tuple[tuple[int, ...], ...]
    steps: tuple[Step, ...]
    outputs: tuple[int, ...]

    def __str__(self) -> str:
        names = [f"x{i}" for i in range(len(self.input_shapes))] + [f"v{k}" for k in range(len(self.steps))]
        lines = [f"inputs: {', '.join(f'{n}{list(s)}' for n, s in zip(names, self.input_shapes))}"]
        for k, step in enumerate(self.steps):
            args = ", ".join(names[a] for a in step.args)
            params = f"; {step.params}" if step.params else ""
            lines.append(f"v{k} = {step.op}({args}{params})")
        lines.append(f"return {', '.join(names[o] for o in self.outputs)}")
        return "\n".join(lines)


@dataclass(frozen=True)
class Limits:
    max_size: int   # elements per value
    smooth: bool    # keep away from kinks and ties (for finite differences)


@dataclass(frozen=True)
class FuzzCase:
    program: Program
    inputs: tuple[np.ndarray, ...]   # float64
    scale: float                     # max |value| over every input and step result

    def __repr__(self) -> str:  # what hypothesis prints for a failing example
        values = "\n".join(f"x{i} = np.array({x.tolist()!r})" if x.size <= 200 else f"x{i}: {x.size} values"
                           for i, x in enumerate(self.inputs))
        return f"FuzzCase(scale={self.scale:.3g})\n{self.program}\n{values}"


# --- ops: each is f(xp, *operands, *params) written against the NumPy API, xp = np or fnp ----------

def _logistic(xp: Any, x: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-x)) if xp is np else fg.nn.functional.sigmoid(x)


def _index(spec: tuple[Any, ...]) -> tuple[Any, ...]:
    """A NumPy index from its hashable spec: ('i', n), ('s', start, stop, step), ('a', values), ('n',)."""
    parts: list[Any] = []
    for part in spec:
        kind = part[0]
        if kind == "i":
            parts.append(part[1])
        elif kind == "s":
            parts.append(slice(*part[1:]))
        elif kind == "a":
            parts.append(np.array(part[1], dtype=np.int32))
        else:
            parts.append(None)
    return tuple(parts)


def _matmul(xp: Any, a: Any, b: Any, transpose_b: bool) -> Any:
    return xp.matmul(a, xp.swapaxes(b, -1, -2) if transpose_b else b)


def _softmax(xp: Any, x: Any, axis: int) -> Any:
    if xp is not np:
        return fg.nn.functional.softmax(x, axis)
    exps = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return exps / np.sum(exps, axis=axis, keepdims=True)


def _logsumexp(xp: Any, x: Any, axis: Any, keepdims: bool) -> Any:
    if xp is not np:
        return fg.nn.functional.logsumexp(x, axis=axis, keepdims=keepdims)
    top = np.max(x, axis=axis, keepdims=True)
    result = np.log(np.sum(np.exp(x - top), axis=axis, keepdims=True)) + top
    return result if keepdims else np.squeeze(result, axis=axis)


def _scatter(xp: Any, x: Any, indices: tuple[int, ...], mode: str) -> Any:
    """``x`` with ``sin(x[indices])`` added at (or written to) ``indices`` along the first axis."""
    index = np.array(indices, dtype=np.int32)
    updates = xp.sin(x[index])
    if xp is not np:
        return x.at[index].add(updates) if mode == "add" else x.at[index].set(updates)
    result = np.array(x, dtype=np.float64)
    if mode == "add":
        np.add.at(result, index, updates)
    else:
        result[index] = updates
    return result


def _cond(xp: Any, x: Any) -> Any:
    """``2 sin(x)`` if ``sum(x) > 0`` else ``cos(x)``, through lax.cond."""
    if xp is np:
        return 2 * np.sin(x) if np.sum(x) > 0 else np.cos(x)
    return fg.lax.cond(fnp.sum(x) > 0, lambda v: 2 * fnp.sin(v), lambda v: fnp.cos(v), x)


def _scan(xp: Any, x: Any, reverse: bool) -> Any:
    """A recurrence over the first axis through lax.scan: ``c = tanh(c / 2 + x_t)``, output ``c * x_t``."""
    if xp is np:
        carry, outputs = np.zeros(x.shape[1:]), [None] * len(x)
        for t in (reversed(range(len(x))) if reverse else range(len(x))):
            carry = np.tanh(carry / 2 + x[t])
            outputs[t] = carry * x[t]
        return np.stack(outputs)

    def body(carry: Any, x_t: Any) -> tuple[Any, Any]:
        carry = fnp.tanh(carry / 2 + x_t)
        return carry, carry * x_t
    return fg.lax.scan(body, fnp.zeros_like(x[0]), x, reverse=reverse)[1]


def _fori(xp: Any, x: Any, count: int) -> Any:
    """``count`` steps of ``v = 0.9 v + 0.1 sin(v + i)`` through lax.fori_loop."""
    if xp is np:
        for i in range(count):
            x = 0.9 * x + 0.1 * np.sin(x + i)
        return x
    return fg.lax.fori_loop(0, count, lambda i, v: 0.9 * v + 0.1 * fnp.sin(v + i), x)


def _remat(xp: Any, x: Any) -> Any:
    """``sin(x) * cos(x)``, under checkpoint for funcgrad (its backward pass recomputes the body)."""
    if xp is np:
        return np.sin(x) * np.cos(x)
    return fg.checkpoint(lambda v: fnp.sin(v) * fnp.cos(v))(x)


def _gather_sorted(xp: Any, x: Any, axis: int) -> Any:
    """``x`` sorted along ``axis`` by gathering with its own argsort (indices computed from data)."""
    return xp.take_along_axis(x, xp.argsort(x, axis=axis), axis)


def _gather_max(xp: Any, x: Any, axis: int) -> Any:
    """The maxima along ``axis``, gathered at the argmax (keeping the axis)."""
    return xp.take_along_axis(x, xp.expand_dims(xp.argmax(x, axis=axis), axis), axis)


def _row_of_largest_sum(xp: Any, x: Any) -> Any:
    """``x[i]`` with ``i`` the index of the largest row sum: an index computed from data."""
    return x[xp.argmax(xp.sum(xp.reshape(x, (x.shape[0], -1)), axis=1))]


def _norm(xp: Any, x: Any) -> Any:
    return np.linalg.norm(x) if xp is np else fnp.linalg.norm(x)


OPS: dict[str, Callable[..., Any]] = {
    # unary, smooth everywhere (or guarded by the generator)
    "sin": lambda xp, x: xp.sin(x),
    "cos": lambda xp, x: xp.cos(x),
    "tanh": lambda xp, x: xp.tanh(x),
    "logistic": _logistic,
    "exp": lambda xp, x: xp.exp(x),
    "log": lambda xp, x: xp.log(x),
    "sqrt": lambda xp, x: xp.sqrt(x),
    "square": lambda xp, x: x * x,
    "neg": lambda xp, x: -x,
    "affine": lambda xp, x, mul, add: x * mul + add,
    # binary, broadcasting
    "add": lambda xp, a, b: a + b,
    "sub": lambda xp, a, b: a - b,
    "mul": lambda xp, a, b: a * b,
    "div": lambda xp, a, b: a / b,
    "maximum": lambda xp, a, b: xp.maximum(a, b),
    "minimum": lambda xp, a, b: xp.minimum(a, b),
    "where": lambda xp, c, a, b: xp.where(c > 0, a, b),
    # reductions
    "sum": lambda xp, x, axis, keepdims: xp.sum(x, axis=axis, keepdims=keepdims),
    "mean": lambda xp, x, axis, keepdims: xp.mean(x, axis=axis, keepdims=keepdims),
    "max": lambda xp, x, axis, keepdims: xp.max(x, axis=axis, keepdims=keepdims),
    "cumsum": lambda xp, x, axis: xp.cumsum(x, axis=axis),
    "sort": lambda xp, x, axis: xp.sort(x, axis=axis),
    # movement
    "reshape": lambda xp, x, shape: xp.reshape(x, shape),
    "transpose": lambda xp, x, axes: xp.transpose(x, axes),
    "broadcast_to": lambda xp, x, shape: xp.broadcast_to(x, shape),
    "flip": lambda xp, x, axis: xp.flip(x, axis=axis),
    "pad": lambda xp, x, widths, value: xp.pad(x, widths, constant_values=value),
    "pad_mode": lambda xp, x, widths, mode: xp.pad(x, widths, mode=mode),
    "split": lambda xp, x, sections, axis, piece: xp.split(x, sections, axis=axis)[piece],
    "concatenate": lambda xp, a, b, axis: xp.concatenate([a, b], axis=axis),
    "getitem": lambda xp, x, spec: x[_index(spec)],
    "take": lambda xp, x, indices, axis: xp.take(x, np.array(indices, dtype=np.int32), axis=axis),
    # contraction
    "matmul": _matmul,
    "einsum": lambda xp, a, b, spec: xp.einsum(spec, a, b),
    "stack": lambda xp, a, b, axis: xp.stack([a, b], axis=axis),
    # more unary
    "abs": lambda xp, x: xp.abs(x),
    "clip": lambda xp, x, low, high: xp.clip(x, low, high),
    "expm1": lambda xp, x: xp.expm1(x),
    "log1p": lambda xp, x: xp.log1p(x),
    "sinh": lambda xp, x: xp.sinh(x),
    "arcsinh": lambda xp, x: xp.arcsinh(x),
    "power": lambda xp, x, exponent: xp.power(x, exponent),
    "arctan2": lambda xp, a, b: xp.arctan2(a, b),
    "hypot": lambda xp, a, b: xp.hypot(a, b),
    "logaddexp": lambda xp, a, b: xp.logaddexp(a, b),
    # more reductions and scans
    "prod": lambda xp, x, axis, keepdims: xp.prod(x, axis=axis, keepdims=keepdims),
    "var": lambda xp, x, axis, keepdims, ddof: xp.var(x, axis=axis, keepdims=keepdims, ddof=ddof),
    "logsumexp": _logsumexp,
    "softmax": _softmax,
    "norm": _norm,
    "cumprod": lambda xp, x, axis: xp.cumprod(x, axis=axis),
    "diff": lambda xp, x, axis: xp.diff(x, axis=axis),
    # more movement
    "roll": lambda xp, x, shift, axis: xp.roll(x, shift, axis=axis),
    "repeat": lambda xp, x, repeats, axis: xp.repeat(x, repeats, axis=axis),
    "tile": lambda xp, x, reps: xp.tile(x, reps),
    "diagonal": lambda xp, x, offset, axis1, axis2: xp.diagonal(x, offset, axis1, axis2),
    "tril": lambda xp, x, k: xp.tril(x, k=k),
    "squeeze": lambda xp, x, axis: xp.squeeze(x, axis=axis),
    "expand_dims": lambda xp, x, axis: xp.expand_dims(x, axis),
    "moveaxis": lambda xp, x, source, destination: xp.moveaxis(x, source, destination),
    "take_along_axis": lambda xp, x, indices, shape, axis: xp.take_along_axis(
        x, np.array(indices, dtype=np.int32).reshape(shape), axis),
    "scatter": _scatter,
    "gather_sorted": _gather_sorted,
    "gather_max": _gather_max,
    "row_of_largest_sum": _row_of_largest_sum,
    # control flow and checkpointing
    "cond": _cond,
    "scan": _scan,
    "fori_loop": _fori,
    "remat": _remat,
}

UNARY = ["sin", "cos", "tanh", "logistic", "exp", "log", "sqrt", "square", "neg", "affine", "abs", "expm1",
         "log1p", "sinh", "arcsinh", "cond", "remat"]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "matmul", "concatenate", "where", "einsum", "stack",
          "arctan2", "hypot", "logaddexp"]
STRUCTURAL = ["sum", "mean", "max", "cumsum", "sort", "reshape", "transpose", "broadcast_to", "flip", "pad",
              "getitem", "take", "clip", "power", "prod", "var", "logsumexp", "softmax", "norm", "cumprod", "diff",
              "roll", "repeat", "tile", "diagonal", "tril", "squeeze", "expand_dims", "moveaxis", "take_along_axis",
              "scatter", "scan", "fori_loop", "gather_sorted", "gather_max", "row_of_largest_sum", "pad_mode",
              "split"]
# the ops drawn (uniformly from this list): the ones that need fitting operands, or that exercise
# the most index arithmetic, twice
OP_NAMES = UNARY + BINARY + STRUCTURAL + ["matmul", "concatenate", "where", "pad", "take", "getitem", "transpose"]


def program_values(program: Program, xp: Any, inputs: Sequence[Any]) -> list[Any]:
    """Every value of the program (inputs, then each step's result), computed with ``xp``."""
    values = list(inputs)
    for step in program.steps:
        values.append(OPS[step.op](xp, *(values[a] for a in step.args), *step.params))
    return values


def run_program(program: Program, xp: Any, inputs: Sequence[Any]) -> tuple[Any, ...]:
    """The program's outputs, computed with ``xp`` (``np`` or ``funcgrad.numpy``)."""
    values = program_values(program, xp, inputs)
    return tuple(values[o] for o in program.outputs)


def as_function(program: Program) -> Callable[..., tuple[Any, ...]]:
    """The program as a funcgrad function of its inputs (for transforms)."""
    return lambda *inputs: run_program(program, fnp, inputs)


# --- checks the generator applies to each candidate step ------------------------------------------

def _min_gap_along(x: np.ndarray, axes: tuple[int, ...]) -> float:
    """The smallest distance between two values that share a group of the given axes."""
    if x.ndim == 0 or not axes:
        return np.inf
    moved = np.moveaxis(x, axes, tuple(range(-len(axes), 0)))
    group = int(np.prod([x.shape[a] for a in axes]))
    if group < 2:
        return np.inf
    flat = np.sort(moved.reshape(-1, group), axis=-1)
    return float(np.min(np.diff(flat, axis=-1)))


def _kink_free(op: str, operands: list[np.ndarray], params: tuple[Any, ...], smooth: bool) -> bool:
    """Whether the op's inputs keep away from its poles and, when ``smooth``, from its kinks and ties
    (see the module docstring)."""
    first = operands[0]
    if not smooth and op in ("maximum", "minimum", "where", "max", "sort", "abs", "cond", "clip", "gather_sorted",
                             "gather_max", "row_of_largest_sum"):
        return True
    if op in ("log", "sqrt"):
        return bool(np.min(first) >= 0.2)
    if op == "exp":
        return bool(np.max(first) <= 3.0)
    if op == "div":
        return bool(np.min(np.abs(operands[1])) >= 0.3)
    if op in ("maximum", "minimum"):
        return bool(np.min(np.abs(operands[0] - operands[1])) >= TIE_GAP)
    if op == "where":
        return bool(np.min(np.abs(first)) >= TIE_GAP)
    if op == "max":
        axis = params[0]
        axes = tuple(range(first.ndim)) if axis is None else axis
        return _min_gap_along(first, axes) >= TIE_GAP
    if op in ("sort", "gather_sorted", "gather_max"):
        return _min_gap_along(first, (params[0] % first.ndim,)) >= TIE_GAP
    if op == "row_of_largest_sum":
        sums = np.sort(np.sum(first.reshape(first.shape[0], -1), axis=1))
        return len(sums) < 2 or sums[-1] - sums[-2] >= TIE_GAP
    if op in ("abs", "cond"):
        return bool(np.min(np.abs(first)) >= TIE_GAP) if op == "abs" else abs(float(np.sum(first))) >= TIE_GAP
    if op == "clip":
        return bool(np.min(np.abs(first - params[0])) >= TIE_GAP and np.min(np.abs(first - params[1])) >= TIE_GAP)
    if op in ("expm1", "sinh"):
        return bool(np.max(np.abs(first)) <= 3.0)
    if op == "log1p":
        return bool(np.min(first) >= -0.8)
    if op == "power":
        if params[0] < 0:
            return bool(np.min(np.abs(first)) >= 0.3)
        return float(params[0]).is_integer() or bool(np.min(first) >= 0.2)
    if op == "arctan2":   # the branch cut: y = 0 with x < 0; and the pole at the origin
        y, x = np.broadcast_arrays(*operands)
        return bool(np.all((np.abs(y) >= 0.05) | (x >= 0.05)))
    if op == "hypot":
        return bool(np.min(np.hypot(*operands)) >= 0.1)
    if op == "norm":
        return bool(np.linalg.norm(first) >= 0.1)
    return True


def _applies(op: str, operands: list[np.ndarray], params: tuple[Any, ...], limits: Limits,
             complete: bool = True) -> bool:
    """Whether ``op`` of these operands gives an acceptable, kink-free result; when not ``complete``
    (operands still missing), only whether their shapes broadcast together."""
    if not complete:
        try:
            np.broadcast_shapes(*(o.shape for o in operands))
        except ValueError:
            return False
        return True
    return _evaluate(op, operands, params, limits) is not None


def _evaluate(op: str, operands: list[np.ndarray], params: tuple[Any, ...], limits: Limits) -> np.ndarray | None:
    """The float64 result of a step, or None when NumPy refuses the shapes or the result breaks a rule."""
    try:
        with np.errstate(all="ignore"):
            result = np.asarray(OPS[op](np, *operands, *params), dtype=np.float64)
    except (ValueError, IndexError, TypeError):   # shapes that do not fit together
        return None
    acceptable = _acceptable(result, limits.max_size) and _kink_free(op, operands, params, limits.smooth)
    return result if acceptable else None


def _acceptable(result: np.ndarray, max_size: int) -> bool:
    return (result.ndim <= MAX_RANK and 0 < result.size <= max_size and bool(np.all(np.isfinite(result)))
            and float(np.max(np.abs(result))) <= MAX_MAGNITUDE)


# --- drawing parameters -----------------------------------------------------------------------------

@st.composite
def _axes(draw: Any, ndim: int) -> tuple[int, ...] | None:
    """None (all axes) or a sorted tuple of distinct axes, some written negative."""
    if ndim == 0 or draw(st.booleans()):
        return None if draw(st.booleans()) else ()
    chosen = draw(st.lists(st.integers(0, ndim - 1), min_size=1, max_size=ndim, unique=True))
    return tuple(sorted(a - ndim if draw(st.booleans()) else a for a in chosen))


def _factor_shapes(size: int) -> list[tuple[int, ...]]:
    """Some shapes with ``size`` elements (for reshape)."""
    shapes = [(size,), (1, size), (size, 1)]
    for d in range(2, size):
        if size % d == 0:
            shapes.append((d, size // d))
            if (size // d) % 2 == 0:
                shapes.append((d, 2, size // d // 2))
    return shapes


@st.composite
def _index_spec(draw: Any, shape: tuple[int, ...]) -> tuple[Any, ...]:
    """A basic or advanced NumPy index for ``shape``: ints, slices (any sign of step), None, int arrays."""
    spec: list[Any] = []
    for dim in shape[:draw(st.integers(0, len(shape)))]:
        kind = draw(st.sampled_from("iisan"))
        if kind == "i":
            spec.append(("i", draw(st.integers(-dim, dim - 1))))
        elif kind == "s":
            step = draw(st.sampled_from([None, 1, 2, -1, -2]))
            start = draw(st.none() | st.integers(-dim - 1, dim + 1))
            stop = draw(st.none() | st.integers(-dim - 1, dim + 1))
            spec.append(("s", start, stop, step))
        elif kind == "a":
            spec.append(("a", tuple(draw(st.lists(st.integers(-dim, dim - 1), min_size=1, max_size=4)))))
        else:
            spec.append(("n",))
    if draw(st.booleans()):
        spec.insert(draw(st.integers(0, len(spec))), ("n",))
    return tuple(spec)


@st.composite
def _einsum_spec(draw: Any, a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> str:
    """An einsum of two operands: b's axes reuse a's letters of equal size or get new ones; the
    output keeps a random subset of the letters in a random order (the others are summed)."""
    a_letters = ""
    for size in a_shape:   # a repeated letter takes a diagonal
        same = [letter for letter, d in zip(a_letters, a_shape) if d == size and a_letters.count(letter) == 1]
        a_letters += draw(st.sampled_from(same)) if same and draw(st.integers(0, 3)) == 0 else "abcd"[len(a_letters)]
    b_letters = ""
    for size in b_shape:
        shared = [letter for letter, d in zip(a_letters, a_shape) if d == size and letter not in b_letters]
        if shared and draw(st.booleans()):
            b_letters += draw(st.sampled_from(shared))
        else:
            b_letters += "mnop"[len(b_letters)]
    letters = sorted(set(a_letters + b_letters))
    output = draw(st.permutations(letters))[:draw(st.integers(0, len(letters)))]
    return f"{a_letters},{b_letters}->{''.join(output)}"


@st.composite
def _params(draw: Any, op: str, x: np.ndarray) -> tuple[Any, ...] | None:
    """Static parameters of a one-operand op for ``x``, or None when the op does not apply."""
    ndim = x.ndim
    if op in UNARY:
        if op == "affine":
            return (draw(st.sampled_from([-2.0, -0.5, 0.5, 1.5, 3.0])), draw(st.sampled_from([-1.0, 0.0, 0.75, 2.0])))
        return ()
    if op in ("sum", "mean", "max", "prod", "var", "logsumexp"):
        axes = draw(_axes(ndim))
        if op != "var":
            return (axes, draw(st.booleans()))
        count = x.size if axes is None else math.prod(x.shape[a] for a in axes)
        return (axes, draw(st.booleans()), draw(st.integers(0, 1)) if count > 1 else 0)
    if op == "pad_mode":
        if ndim == 0:
            return None
        widths = tuple((draw(st.integers(0, 3)), draw(st.integers(0, 3))) for _ in range(ndim))
        return (widths, draw(st.sampled_from(["edge", "reflect", "symmetric", "wrap"])))
    if op == "split":
        if ndim == 0:
            return None
        axis = draw(st.integers(-ndim, ndim - 1))
        cuts = tuple(sorted(draw(st.lists(st.integers(0, x.shape[axis]), max_size=3))))
        return (cuts, axis, draw(st.integers(0, len(cuts))))
    if op == "row_of_largest_sum":
        return None if ndim == 0 else ()
    if op in ("cumsum", "sort", "flip", "softmax", "cumprod", "diff", "scatter", "gather_sorted", "gather_max"):
        if ndim == 0:
            return None
        axis = draw(st.integers(-ndim, ndim - 1))
        if op == "diff":
            return (axis,) if x.shape[axis] >= 2 else None
        if op == "scatter":
            indices = draw(st.lists(st.integers(-x.shape[0], x.shape[0] - 1), min_size=1, max_size=4))
            mode = draw(st.sampled_from(["add", "set"]))
            if mode == "set":   # written once each: the order of duplicate writes is unspecified
                indices = list({i % x.shape[0]: i for i in indices}.values())
            return (tuple(indices), mode)
        return (axis,)
    if op == "norm":
        return ()
    if op == "clip":
        low = draw(st.sampled_from([-1.0, -0.25, 0.0, 0.5]))
        return (low, low + draw(st.sampled_from([0.5, 1.0, 2.0])))
    if op == "power":
        return (draw(st.sampled_from([2, 3, 0.5, 1.5, -1.0])),)
    if op == "roll":
        if ndim == 0:
            return None
        if ndim >= 2 and draw(st.booleans()):   # several axes at once
            axes = tuple(draw(st.lists(st.integers(-ndim, ndim - 1), min_size=2, max_size=ndim)))
            return (tuple(draw(st.integers(-6, 6)) for _ in axes), axes)
        return (draw(st.integers(-6, 6)), draw(st.none() | st.integers(-ndim, ndim - 1)))
    if op == "repeat":
        return (draw(st.integers(1, 3)), draw(st.none() | st.integers(-ndim, ndim - 1)) if ndim else None)
    if op == "tile":
        return (tuple(draw(st.lists(st.integers(1, 3), min_size=1, max_size=3))),)
    if op in ("diagonal", "tril"):
        if ndim < 2:
            return None
        if op == "tril":
            return (draw(st.integers(-2, 2)),)
        axis1, axis2 = draw(st.lists(st.integers(0, ndim - 1), min_size=2, max_size=2, unique=True))
        return (draw(st.integers(-2, 2)), axis1, axis2)
    if op == "squeeze":
        ones = [a for a, d in enumerate(x.shape) if d == 1]
        if not ones:
            return None
        return (tuple(draw(st.lists(st.sampled_from(ones), min_size=1, unique=True))) if draw(st.booleans()) else None,)
    if op == "expand_dims":
        return (draw(st.integers(-ndim - 1, ndim)),)
    if op == "moveaxis":
        return None if ndim < 2 else (draw(st.integers(-ndim, ndim - 1)), draw(st.integers(-ndim, ndim - 1)))
    if op == "take_along_axis":
        if ndim == 0:
            return None
        axis = draw(st.integers(-ndim, ndim - 1))
        shape = list(x.shape)
        shape[axis] = draw(st.integers(1, 4))
        index_rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        return (tuple(index_rng.integers(0, x.shape[axis], size=math.prod(shape)).tolist()), tuple(shape), axis)
    if op == "scan":
        return None if ndim == 0 else (draw(st.booleans()),)
    if op == "fori_loop":
        return (draw(st.integers(0, 3)),)
    if op == "reshape":
        return (draw(st.sampled_from(_factor_shapes(x.size) + [(-1,), x.shape + (1,)])),)
    if op == "transpose":
        return None if ndim < 2 else (tuple(draw(st.permutations(range(ndim)))),)
    if op == "broadcast_to":
        extra = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
        shape = extra + tuple(d if d != 1 else draw(st.integers(1, 3)) for d in x.shape)
        return (shape,)
    if op == "pad":
        if ndim == 0:
            return None
        widths = tuple((draw(st.integers(0, 2)), draw(st.integers(0, 2))) for _ in range(ndim))
        return (widths, draw(st.sampled_from([0.0, -1.0, 0.5])))
    if op == "getitem":
        return (draw(_index_spec(x.shape)),)
    if op == "take":
        if ndim == 0:
            return None
        axis = draw(st.integers(-ndim, ndim - 1))
        dim = x.shape[axis]
        indices = draw(st.lists(st.integers(0, dim - 1), min_size=1, max_size=4))
        if draw(st.booleans()) and len(indices) % 2 == 0:
            return (tuple(zip(indices[::2], indices[1::2])), axis)   # a 2-D index array
        return (tuple(indices), axis)
    raise AssertionError(op)


def _candidate(draw: Any, op: str, values: list[np.ndarray], first: int, limits: Limits) -> Step | None:
    """A step applying ``op`` to ``values[first]`` (and fitting other values), or None if none fits."""
    x = values[first]
    if op not in BINARY:
        drawn = draw(_params(op, x))
        return None if drawn is None else Step(op, (first,), drawn)
    params: tuple[Any, ...] = ()
    if op == "einsum":
        other = draw(st.integers(0, len(values) - 1))
        return Step(op, (first, other), (draw(_einsum_spec(x.shape, values[other].shape)),))
    if op == "stack":
        params = (draw(st.integers(-x.ndim - 1, x.ndim)),)
    if op == "concatenate":
        if x.ndim == 0:
            return None
        params = (draw(st.integers(-x.ndim, x.ndim - 1)),)
    elif op == "matmul":
        params = (draw(st.booleans()),)
    args = (first,)
    for more in range(2 if op == "where" else 1, 0, -1):   # operands that fit the ones drawn so far
        fitting = [j for j in range(len(values))
                   if _applies(op, [values[a] for a in args + (j,)], params, limits, complete=more == 1)]
        if not fitting:
            return None
        args += (draw(st.sampled_from(fitting)),)
    return Step(op, args, params)


@st.composite
def _step(draw: Any, values: list[np.ndarray], op_rng: np.random.Generator,
          limits: Limits) -> tuple[Step, np.ndarray]:
    """One step over ``values`` and its float64 result (``tanh`` of the operand when three drawn ops fail)."""
    # mostly the latest value, so the steps form chains rather than many one-step branches
    first = len(values) - 1 if op_rng.random() < 0.6 else int(op_rng.integers(len(values)))
    for _ in range(3):
        # the op comes from the case's own generator: hypothesis favours early list items and small
        # integers, which would make the first ops of the list far more common than the rest
        step = _candidate(draw, OP_NAMES[int(op_rng.integers(len(OP_NAMES)))], values, first, limits)
        if step is not None:
            result = _evaluate(step.op, [values[a] for a in step.args], step.params, limits)
            if result is not None:
                return step, result
    return Step("tanh", (first,)), np.tanh(values[first])


@st.composite
def fuzz_cases(draw: Any, max_steps: int = 8, large: bool = False) -> FuzzCase:
    """A random program and float64 inputs on which every step is smooth (see the module docstring).

    ``large``: dims up to 129 and values up to ``LARGE_MAX_SIZE`` elements, which reach the compiler's
    vectorised, unrolled and split-sum kernels (too large for finite differences in every coordinate).
    """
    limits = Limits(LARGE_MAX_SIZE, smooth=False) if large else Limits(MAX_SIZE, smooth=True)
    max_size = limits.max_size
    base: tuple[int, ...] = ()
    if large:   # from a generator: hypothesis would mostly draw rank 0 and dims of 1
        shape_rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
        for _ in range(int(shape_rng.integers(1, 4))):
            dim = int(shape_rng.choice([2, 3, 5, 8, 16, 17, 32, 64, 129]))
            base += (dim if math.prod(base) * dim <= max_size else 1,)
    else:
        base = tuple(draw(st.lists(st.integers(1, 5), max_size=3)))
    rank = len(base)
    shapes = []
    for _ in range(draw(st.integers(1, 3))):
        dropped = draw(st.integers(0, rank))
        shapes.append(tuple(1 if draw(st.integers(0, 3)) == 0 else d for d in base[dropped:]))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    inputs = [rng.uniform(-1.5, 1.5, size=shape) for shape in shapes]
    op_rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    values = list(inputs)
    steps = []
    for _ in range(int(op_rng.integers(2, max_steps + 1))):   # hypothesis would mostly draw 1 or 2
        step, result = draw(_step(values, op_rng, limits))
        steps.append(step)
        values.append(result)
    # every step result no later step uses is an output, so no step is dead code
    used = {a for step in steps for a in step.args}
    outputs = tuple(k for k in range(len(inputs), len(values)) if k not in used)
    scale = max(float(np.max(np.abs(v))) for v in values)
    return FuzzCase(Program(tuple(shapes), tuple(steps), outputs), tuple(inputs), max(scale, 1.0))


# --- settings shared by the fuzz tests ---------------------------------------------------------------

FUZZ_EXAMPLES = int(os.environ.get("FUNCGRAD_FUZZ_EXAMPLES", "40"))
FUZZ_SEED = os.environ.get("FUNCGRAD_FUZZ_SEED", "")


def fuzz(test: Callable[..., None], share: float = 1.0) -> Callable[..., None]:
    """Hypothesis settings for a fuzz test: ``share`` of ``$FUNCGRAD_FUZZ_EXAMPLES`` examples (40 by
    default), derandomized (the same cases on every run, as CI needs) unless ``$FUNCGRAD_FUZZ_SEED``
    is ``random`` (fresh cases each run) or an integer (the cases of that seed)."""
    configured = settings(max_examples=max(1, round(FUZZ_EXAMPLES * share)), deadline=None, derandomize=FUZZ_SEED == "",
                          database=None, print_blob=FUZZ_SEED != "",
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                                 HealthCheck.function_scoped_fixture])(test)
    if FUZZ_SEED not in ("", "random"):
        configured = seed(int(FUZZ_SEED))(configured)
    return configured
