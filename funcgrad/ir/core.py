"""The IR: abstract values, variables, equations and closed programs.

An ``IR`` is a closed, immutable program in A-normal form, like a jaxpr: typed input variables,
constant variables (bound to captured values), a list of equations ``outs = primitive[params] ins``
and output atoms. Every transform in ``funcgrad.transforms`` maps an IR to an IR, and the lowering
layer maps an IR to kernels. ``str(ir)`` prints a jaxpr-like listing; ``typecheck(ir)`` re-derives
every type from the primitive shape rules and fails loudly on any inconsistency.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Sequence
from typing import Any

import attrs
import numpy as np

from funcgrad.ir import dtypes


def _as_tuple(items: Iterable[Any]) -> tuple[Any, ...]:
    """attrs converter: lists and other iterables become tuples (so IR objects stay immutable)."""
    return tuple(items)


@attrs.frozen
class ShapedArray:
    """An abstract value: what the tracer knows about an array (its shape and dtype)."""

    shape: tuple[int, ...] = attrs.field(converter=_as_tuple)
    dtype: np.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    def short_str(self) -> str:
        short = _SHORT_NAME.get(self.dtype)
        if short is None:  # dtype.name is computed by NumPy in Python (slow): look it up once per dtype
            short = _SHORT_NAME.setdefault(self.dtype, _DTYPE_SHORT.get(self.dtype.name, self.dtype.name))
        return f"{short}[{','.join(map(str, self.shape))}]"

    def __str__(self) -> str:
        return self.short_str()


# The largest array funcgrad makes: its bytes must be addressable with a signed 64-bit offset, as
# NumPy's and the kernels' index arithmetic (i64) need. Checked where shapes are created (creation
# functions, arange, random), so a huge shape fails there and not when its value is first read.
MAX_ARRAY_BYTES = 2**63 - 1


def check_array_size(shape: tuple[int, ...], dtype: np.dtype, op: str) -> None:
    """Raise ValueError naming ``op`` if an array of ``shape`` and ``dtype`` could not be addressed."""
    size = math.prod(shape)
    if size * dtype.itemsize > MAX_ARRAY_BYTES:
        raise ValueError(f"{op}: shape {shape} of {dtype.name} holds {size} elements ({size * dtype.itemsize} "
                         f"bytes), more than the {MAX_ARRAY_BYTES} bytes an array can address")


_DTYPE_SHORT = {"float32": "f32", "float16": "f16", "bfloat16": "bf16", "float64": "f64", "int8": "i8",
                "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "uint16": "u16",
                "uint32": "u32", "uint64": "u64", "bool": "bool", "complex64": "c64", "complex128": "c128"}

_SHORT_NAME: dict[np.dtype, str] = {}  # short_str's names by dtype

_var_ids = itertools.count()


@attrs.define(eq=False, frozen=True)
class Var:
    """A variable of the IR. Identity is the variable: two Vars are equal only if they are one."""

    aval: ShapedArray
    id: int = attrs.field(factory=lambda: next(_var_ids), repr=False)


@attrs.frozen
class Literal:
    """A scalar constant written inline in an equation (``mul a 2.0``)."""

    value: Any  # a NumPy scalar of exactly aval.dtype
    aval: ShapedArray

    @staticmethod
    def of(value: np.generic) -> Literal:
        return Literal(value, ShapedArray((), dtypes.canonicalize(value.dtype)))


Atom = Var | Literal


def _params_converter(params: Any) -> tuple[tuple[str, Any], ...]:
    items = params.items() if isinstance(params, dict) else params
    return tuple(sorted(items))


@attrs.frozen
class Eqn:
    """One equation: ``outputs = primitive[params](*inputs)``. Params are hashable and sorted by name."""

    primitive: Any  # funcgrad.ir.primitives.Primitive (kept untyped to avoid an import cycle)
    inputs: tuple[Atom, ...] = attrs.field(converter=_as_tuple)
    params: tuple[tuple[str, Any], ...] = attrs.field(converter=_params_converter)
    outputs: tuple[Var, ...] = attrs.field(converter=_as_tuple)

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)

    # JAX's JaxprEqn spellings, for code written against jaxprs (``eqn.invars``, ``eqn.outvars``)
    @property
    def invars(self) -> tuple[Atom, ...]:
        return self.inputs

    @property
    def outvars(self) -> tuple[Var, ...]:
        return self.outputs


@attrs.frozen(eq=False)
class IR:
    """A closed program. ``consts`` holds the values bound to ``const_vars`` (captured arrays or,
    while an outer trace is running, that trace's values)."""

    in_vars: tuple[Var, ...] = attrs.field(converter=_as_tuple)
    eqns: tuple[Eqn, ...] = attrs.field(converter=_as_tuple)
    outputs: tuple[Atom, ...] = attrs.field(converter=_as_tuple)
    const_vars: tuple[Var, ...] = attrs.field(converter=_as_tuple, default=())
    consts: tuple[Any, ...] = attrs.field(converter=_as_tuple, default=())

    def __attrs_post_init__(self) -> None:
        if len(self.const_vars) != len(self.consts):
            raise ValueError(f"IR has {len(self.const_vars)} const vars but {len(self.consts)} consts")

    @property
    def in_avals(self) -> tuple[ShapedArray, ...]:
        return tuple(v.aval for v in self.in_vars)

    @property
    def out_avals(self) -> tuple[ShapedArray, ...]:
        return tuple(a.aval for a in self.outputs)

    # JAX's ClosedJaxpr / Jaxpr spellings (``closed.jaxpr.eqns``, ``.invars``, ``.outvars``, ``.constvars``,
    # ``.consts``): one IR plays both parts, so ``jaxpr`` is the IR itself
    @property
    def jaxpr(self) -> IR:
        return self

    @property
    def invars(self) -> tuple[Var, ...]:
        return self.in_vars

    @property
    def outvars(self) -> tuple[Atom, ...]:
        return self.outputs

    @property
    def constvars(self) -> tuple[Var, ...]:
        return self.const_vars

    def producers(self) -> dict[int, Eqn]:
        """The producer map: each var id an equation computes -> that equation (inputs and consts
        have none). Built afresh on each call: passes rewrite IRs and ask again."""
        return {v.id: eqn for eqn in self.eqns for v in eqn.outputs}

    def users(self) -> dict[int, list[Eqn]]:
        """The reverse map: each var id -> the equations that read it, in program order, an equation
        once per operand that reads it (``x * x`` lists the ``mul`` twice). Literals have none."""
        found: dict[int, list[Eqn]] = {}
        for eqn in self.eqns:
            for atom in eqn.inputs:
                if isinstance(atom, Var):
                    found.setdefault(atom.id, []).append(eqn)
        return found

    def __str__(self) -> str:
        return pretty_print(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # IPython/Jupyter
        printer.text(pretty_print(self))


# --- printing ----------------------------------------------------------------------------------

class _Namer:
    """Gives variables short names a, b, ..., z, ba, bb, ... in order of first appearance."""

    def __init__(self) -> None:
        self.names: dict[int, str] = {}

    def __call__(self, atom: Atom) -> str:
        if isinstance(atom, Literal):
            return _literal_str(atom)
        if atom.id not in self.names:
            self.names[atom.id] = _nth_name(len(self.names))
        return self.names[atom.id]

    def binder(self, var: Var) -> str:
        return f"{self(var)}:{var.aval.short_str()}"


def _nth_name(n: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    name = ""
    while True:
        name = letters[n % 26] + name
        n //= 26
        if n == 0:
            return name


def _literal_str(literal: Literal) -> str:
    value = literal.value
    if literal.aval.dtype == dtypes.bool_:
        text = str(bool(value))
    elif dtypes.is_float(literal.aval.dtype):
        text = repr(float(value))
    elif dtypes.is_complex(literal.aval.dtype):
        text = repr(complex(value))
    else:
        text = str(int(value))
    return f"{text}:{literal.aval.short_str()}"


def _param_str(value: Any, namer: _Namer, indent: int) -> str:
    if isinstance(value, IR):
        return "\n" + _print_ir(value, namer, indent + 4)
    if isinstance(value, tuple) and value and all(isinstance(v, IR) for v in value):
        return "(" + "".join(_param_str(v, namer, indent) for v in value) + ")"
    if callable(value) and hasattr(value, "__name__"):
        return value.__name__
    if isinstance(value, np.dtype):
        return value.name
    return repr(value) if isinstance(value, str) else str(value)


def _print_ir(ir: IR, namer: _Namer, indent: int) -> str:
    pad = " " * indent
    consts = " ".join(namer.binder(v) for v in ir.const_vars)
    inputs = " ".join(namer.binder(v) for v in ir.in_vars)
    header = f"{{ lambda {consts}; {inputs}. let" if consts else f"{{ lambda {inputs}. let"
    lines = [pad + header]
    for eqn in ir.eqns:
        lhs = " ".join(namer.binder(v) for v in eqn.outputs)
        params = " ".join(f"{k}={_param_str(v, namer, indent + 4)}" for k, v in eqn.params)
        name = f"{eqn.primitive.name}[{params}]" if params else eqn.primitive.name
        rhs = " ".join(namer(a) for a in eqn.inputs)
        lines.append(f"{pad}    {lhs} = {name} {rhs}".rstrip())
    outs = ", ".join(namer(a) for a in ir.outputs)
    lines.append(f"{pad}  in ({outs}{',' if len(ir.outputs) == 1 else ''}) }}")
    return "\n".join(lines)


def pretty_print(ir: IR) -> str:
    """The jaxpr-like text of ``ir``; names are assigned in order of appearance."""
    return _print_ir(ir, _Namer(), 0)


# --- typechecking ------------------------------------------------------------------------------

class IRTypeError(TypeError):
    """Raised by ``typecheck`` when an IR is malformed."""


def typecheck(ir: IR) -> None:
    """Check that ``ir`` is well formed: every variable is defined once before use, every equation's
    output types equal what its primitive's shape rule derives, literals are scalars of their dtype,
    and consts match their variables. Sub-IRs in params are checked too."""
    defined: set[int] = set()

    def define(var: Var) -> None:
        if var.id in defined:
            raise IRTypeError(f"variable {var} is defined twice")
        defined.add(var.id)

    def check_atom(atom: Atom, where: str) -> None:
        if isinstance(atom, Literal):
            if atom.aval.shape != () or np.asarray(atom.value).dtype != atom.aval.dtype:
                raise IRTypeError(f"literal {atom} in {where} is not a scalar of its dtype")
        elif atom.id not in defined:
            raise IRTypeError(f"variable {atom.aval} used in {where} before it is defined")

    for var, value in zip(ir.const_vars, ir.consts):
        define(var)
        shape, dtype = getattr(value, "shape", None), getattr(value, "dtype", None)
        if shape is not None and (tuple(shape) != var.aval.shape or dtype != var.aval.dtype):
            raise IRTypeError(f"const bound to {var.aval} has shape {shape} and dtype {dtype}")
    for var in ir.in_vars:
        define(var)
    for eqn in ir.eqns:
        where = f"equation {eqn.primitive.name}"
        for atom in eqn.inputs:
            check_atom(atom, where)
        expected = eqn.primitive.abstract_eval(*(a.aval for a in eqn.inputs), **eqn.param_dict)
        expected = tuple(expected) if eqn.primitive.multiple_results else (expected,)
        actual = tuple(v.aval for v in eqn.outputs)
        if expected != actual:
            raise IRTypeError(f"{where}: outputs typed {[str(a) for a in actual]} but the shape rule "
                              f"gives {[str(a) for a in expected]}")
        for _, value in eqn.params:
            if isinstance(value, IR):
                typecheck(value)
        for var in eqn.outputs:
            define(var)
    for atom in ir.outputs:
        check_atom(atom, "the outputs")


def avals_str(avals: Sequence[ShapedArray]) -> str:
    return "(" + ", ".join(a.short_str() for a in avals) + ")"
