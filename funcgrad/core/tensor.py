"""Tensor (alias Array): the array type users hold, and ``bind``, the one door to the primitives.

A Tensor wraps either a concrete buffer (a value of the eager layer, realized or pending) or a
``Tracer`` (a value inside a running trace). Users never see the difference except where a concrete
value is required (``bool(x)``, ``x.item()``, ``np.asarray(x)``): on a tracer those raise a
``ConcretizationError`` that says what to do instead.

``bind(primitive, *operands, **params)`` checks the operands with the primitive's shape rule, then
either appends an equation to the innermost running trace or, outside any trace, hands the
application to the eager handler. Everything else (``funcgrad.numpy``, the Tensor methods, the
transforms) is built on it.

The core knows nothing of how concrete values are stored or computed: the eager layer
(``funcgrad.lazy``) registers an ``EagerHandler`` when it is imported (``import funcgrad`` does),
and ``funcgrad.nan_check`` registers the hook that records where each value was made.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from funcgrad.ir import dtypes
from funcgrad.ir.core import IR, Literal, ShapedArray
from funcgrad.ir.primitives import Primitive, convert_element_type_p
from funcgrad.ir.tracing import ConcretizationError, IRBuilder, Tracer, check_alive, current_builder, suspended
from funcgrad.util import config as _config

# --- the hooks the layers above register ---------------------------------------------------------

class Buffer(Protocol):
    """What the core reads of a concrete value the eager handler made: its aval, its device (a
    canonical name), whether the user placed it there (``committed``), and its host array once
    computed (None while pending)."""

    aval: ShapedArray
    device: str
    committed: bool
    array: np.ndarray | None


class EagerHandler:
    """How values are computed outside any trace; ``funcgrad.lazy`` registers the implementation
    (``register_eager_handler``). Each method says what the core asks of it; until a handler is
    registered each one raises."""

    def from_array(self, array: np.ndarray, device: str | None, committed: bool) -> Buffer:
        """A computed buffer holding ``array`` (of a funcgrad dtype, owned by the buffer from now on)
        on ``device`` (None: the default device), committed there if ``committed``."""
        raise _unregistered("from_array")

    def pending(self, primitive: Primitive, params: dict[str, Any], sources: Sequence[Buffer],
                out_avals: Sequence[ShapedArray]) -> Sequence[Buffer]:
        """The buffers of ``primitive`` applied to ``sources``, one per aval of ``out_avals`` (already
        checked by the shape rule); computing them may wait until ``realize``."""
        raise _unregistered("pending")

    def realize(self, buffers: Sequence[Buffer]) -> None:
        """Compute ``buffers`` now: afterwards each one's ``array`` is set."""
        raise _unregistered("realize")

    def default_device(self) -> str:
        """The name of the device new values go to (``Device.DEFAULT``)."""
        raise _unregistered("default_device")

    def usable_device(self, device: Any) -> str:
        """The canonical name of ``device`` (a name, or a device object), after checking it can run
        here (raising an error that lists the usable devices otherwise)."""
        raise _unregistered("usable_device")

    def move(self, buffer: Buffer, device: str) -> Buffer:
        """``buffer``'s value (computed first) on ``device`` (a canonical name), committed there."""
        raise _unregistered("move")


def _unregistered(method: str) -> RuntimeError:
    return RuntimeError(f"EagerHandler.{method}: no eager handler implements it; import funcgrad (funcgrad.lazy "
                        "registers the handler) before computing values outside a trace")


# the handler bind calls outside a trace: one global lookup on the hot path
_eager: EagerHandler = EagerHandler()


def register_eager_handler(handler: EagerHandler) -> None:
    """Make ``handler`` compute every value made outside a trace (``funcgrad.lazy`` calls this)."""
    global _eager
    _eager = handler


def _no_source_recorder(outputs: Sequence[Any]) -> None:
    return None


_record_sources: Callable[[Sequence[Any]], None] = _no_source_recorder


def register_source_recorder(recorder: Callable[[Sequence[Any]], None]) -> None:
    """``recorder(outputs)`` is called by ``bind`` with the buffers or tracers it made while
    ``config.active`` (debug_nans / debug_infs is on); ``funcgrad.nan_check`` registers it."""
    global _record_sources
    _record_sources = recorder


# --- the Tensor --------------------------------------------------------------------------------


def _short_repr(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _canonical_numpy(data: Any, dtype: np.dtype | None) -> np.ndarray:
    """Convert Python/NumPy data to an array of a funcgrad dtype: float64 -> float32 and
    int64 -> int32 unless ``dtype`` asks for them (no silent 64-bit values, as in JAX)."""
    if dtype is not None:
        dtype = dtypes.canonicalize(dtype)
    try:
        array = np.asarray(data)
    except ValueError as err:  # ragged nested lists
        raise ValueError(f"cannot make an array from {type(data).__name__}: {err}") from None
    if array.dtype == object and isinstance(data, int):
        raise OverflowError(f"Python int {data} does not fit in any funcgrad dtype (int64 or uint64)")
    if array.dtype == object:
        if array.ndim == 0:  # None, a dict, a generator, ...: not a sequence of numbers at all
            raise TypeError(f"cannot make an array from {_short_repr(data)} (a {type(data).__name__}); arrays hold "
                            "numbers (bool, int, float, complex) or nested lists of them")
        raise TypeError(f"cannot make an array from {type(data).__name__} holding {type(array.flat[0]).__name__}")
    if dtype is None:
        kind = array.dtype.kind
        if kind == "f":
            dtype = array.dtype if array.dtype in dtypes.ALL_DTYPES and array.dtype != dtypes.float64 \
                else dtypes.float32
        elif kind == "i":
            dtype = array.dtype if array.dtype != dtypes.int64 else dtypes.int32
        elif kind == "u":
            dtype = array.dtype if array.dtype != dtypes.uint64 else dtypes.uint32
        elif kind == "b":
            dtype = dtypes.bool_
        elif kind == "c":  # complex128 -> complex64 unless asked for, as float64 -> float32
            dtype = dtypes.complex64
        elif dtypes.is_bfloat16(array.dtype):
            dtype = array.dtype
        else:
            raise TypeError(f"arrays of dtype {array.dtype} are not supported by funcgrad")
    from_python = not isinstance(data, np.ndarray | np.generic)
    if from_python and array.dtype.kind in "iu" and dtypes.is_int(dtype) and array.size:
        info = np.iinfo(dtype)  # Python ints that do not fit raise, as NumPy 2 (NumPy arrays convert by wrapping)
        for value in (array.min(), array.max()):
            if not info.min <= value <= info.max:
                raise OverflowError(f"Python int {value} does not fit in {np.dtype(dtype).name} "
                                    f"(range {info.min}..{info.max})")
    return np.array(array, dtype=dtype, copy=True)


if TYPE_CHECKING:  # the methods are attached by tensor_methods.py (it needs funcgrad.numpy, which needs us)
    from funcgrad.tensor_methods import TensorMethods as _Methods
else:
    _Methods = object


class Tensor(_Methods):
    """An immutable n-dimensional array; operations on it are lazy outside traces.

    >>> x = Tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> (x @ x.T).sum().item()
    52.0
    """

    __slots__ = ("_data", "_weak", "_requires_grad", "grad", "__weakref__")
    __array_priority__ = 100  # so ndarray + Tensor defers to Tensor.__radd__

    def __init__(self, data: Any, dtype: Any = None, device: str | None = None,
                 requires_grad: bool | None = None) -> None:
        if isinstance(data, Tensor):
            source = data
            if dtype is not None and data.dtype != dtypes.canonicalize(dtype):
                source = bind(convert_element_type_p, data, new_dtype=dtypes.canonicalize(dtype))
            self._data: Buffer | Tracer = (source if device is None else source.to(device))._data
        else:
            placed = None if device is None else _eager.usable_device(device)
            self._data = _eager.from_array(_canonical_numpy(data, dtype), placed, placed is not None)
        self._weak = False
        self._requires_grad: bool | None = None
        self.requires_grad = requires_grad
        self.grad: Tensor | None = None

    @property
    def requires_grad(self) -> bool | None:
        """Seed/PyTorch-style autograd: ``loss.backward()`` fills ``.grad`` of the Tensors with
        ``requires_grad=True`` that ``loss`` depends on."""
        return self._requires_grad

    @requires_grad.setter
    def requires_grad(self, value: bool | None) -> None:
        if value and not dtypes.is_float(self.dtype):  # else backward() would say no input requires a gradient
            raise TypeError(f"requires_grad=True needs a floating-point Tensor, got dtype {self.dtype.name}; "
                            "only floating-point values have gradients (cast with .float())")
        self._requires_grad = value
        if value:
            with _GRAD_LEAVES_LOCK:
                GRAD_LEAVES[id(self)] = self

    @classmethod
    def _wrap(cls, data: Buffer | Tracer, weak: bool = False) -> Tensor:
        tensor = cls.__new__(cls)
        tensor._data = data
        tensor._weak = weak
        tensor._requires_grad = None
        tensor.grad = None
        return tensor

    # --- what the tracer knows ----------------------------------------------------------------
    @property
    def aval(self) -> ShapedArray:
        return self._data.aval

    @property
    def shape(self) -> tuple[int, ...]:
        return self._data.aval.shape

    @property
    def dtype(self) -> np.dtype:
        return self._data.aval.dtype

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return self._data.aval.size

    @property
    def device(self) -> str:
        """The name of the device this value lives on (``Device.DEFAULT`` for a traced value)."""
        data = self._data
        return _eager.default_device() if isinstance(data, Tracer) else data.device

    def to(self, device: str) -> Tensor:
        """This value on ``device`` (committed there: operations with values committed elsewhere
        raise). A pending value is computed on its current device first; traced values pass through.

        >>> Tensor([1.0]).to("CPU").device
        'CPU'
        """
        target = _eager.usable_device(device)
        data = self._data
        if isinstance(data, Tracer):
            return self
        if data.device == target and data.committed:
            return self
        return Tensor._wrap(_eager.move(data, target), self._weak)

    @property
    def is_traced(self) -> bool:
        return isinstance(self._data, Tracer)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d array")
        return self.shape[0]

    # --- getting concrete values --------------------------------------------------------------
    def _concrete(self, what: str, known_ok: bool = False) -> np.ndarray:
        if isinstance(self._data, Tracer):
            check_alive(self._data)
            value = known_value(self) if known_ok else None
            if value is not None:  # grad/jvp/vjp outside jit: the value is known (Python control flow works)
                return value._concrete(what)
            behind = self._data.builder.inputs_behind(self._data.var)
            source = f" It depends on the traced {', '.join(behind)}." if behind else ""
            raise ConcretizationError(
                f"{what} needs a concrete value, but this array is traced (an abstract {self.aval} "
                f"inside {self._data.builder.label}).{source} Python control flow on traced values cannot be "
                "recorded: use fg.lax.cond / fg.numpy.where for branches, or mark the argument static "
                "(jit's static_argnums / static_argnames).")
        data = self._data
        _eager.realize([data])
        assert data.array is not None
        return data.array

    def realize(self, *lst: Tensor) -> Tensor:
        """Run the pending computation of this Tensor and of ``lst`` now, in one go (no-op for values
        already computed; tinygrad's ``Tensor.realize(a, b)``); returns ``self``."""
        realize_all((self, *lst))
        return self

    def block_until_ready(self) -> Tensor:
        """Wait until the value is computed (JAX's spelling of ``realize``); returns ``self``. A traced
        value has nothing to wait for and is returned as is."""
        return self if isinstance(self._data, Tracer) else self.realize()

    def numpy(self) -> np.ndarray:
        """A NumPy copy of the value. >>> Tensor([1, 2]).numpy()  # array([1, 2], dtype=int32)"""
        return np.array(self._concrete("numpy()"), copy=True)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        """NumPy's conversion protocol: ``np.asarray(t)`` is a read-only view of the computed host
        array (no copy, as JAX's on the CPU); ``copy=True`` gives a writable copy; ``copy=False``
        raises when a copy is needed (another dtype), as NumPy 2 asks."""
        array = self._concrete("np.asarray()")
        if copy:
            return np.array(array, dtype=dtype, copy=True)
        if dtype is None or np.dtype(dtype) == array.dtype:
            return array  # read-only: Tensors are immutable and share their buffers
        if copy is False:
            raise ValueError(f"np.array(copy=False): converting a Tensor of dtype {array.dtype.name} to "
                             f"{np.dtype(dtype).name} needs a copy; pass copy=None (or True)")
        return array.astype(dtype)

    # --- interchange: DLPack, pickle, format ----------------------------------------------------------
    def __dlpack__(self, *, stream: Any = None, max_version: tuple[int, int] | None = None,
                   dl_device: Any = None, copy: bool | None = None) -> Any:
        """DLPack export of the computed host array (zero-copy): ``torch.from_dlpack(t)``,
        ``np.from_dlpack(t)``. The consumer sees it read-only where DLPack 1.0 can say so."""
        array = self._concrete("__dlpack__()")
        if max_version is None or max_version < (1, 0):
            # the old protocol cannot mark memory read-only, and NumPy refuses to export it: lend a copy
            return np.array(array, copy=True).__dlpack__(stream=stream)
        return array.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device, copy=copy)

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU: realized values are host arrays whatever the device (see funcgrad.lazy)

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        """Pickle (and ``copy.deepcopy``) by value: a pending Tensor is computed first."""
        if isinstance(self._data, Tracer):
            raise TypeError(f"cannot pickle a traced value ({self!r}); return it from the traced function and "
                            "pickle the result")
        array = self._concrete("pickle")
        data = self._data
        return _unpickle_tensor, (array, data.device if data.committed else None, self._weak, self._requires_grad,
                                  self.grad)

    def __format__(self, spec: str) -> str:
        """``f"{loss:.3f}"`` formats a one-element Tensor as its Python number; ``f"{t}"`` is ``str(t)``."""
        if not spec:
            return str(self)
        if self.size != 1:
            raise TypeError(f"format spec {spec!r} needs a Tensor with one element, this one has shape {self.shape}; "
                            "format t.tolist() or np.asarray(t) instead")
        return format(self.item(), spec)

    @property
    def itemsize(self) -> int:
        """Bytes per element, as NumPy's ``itemsize``."""
        return self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        """Bytes of the whole array (``size * itemsize``), as NumPy's ``nbytes``."""
        return self.size * self.dtype.itemsize

    def tolist(self) -> Any:
        return self._concrete("tolist()").tolist()

    def item(self) -> Any:
        if self.size != 1:
            raise ValueError(f"item() needs an array with one element, this one has shape {self.shape}")
        return self._concrete("item()", True).item()

    def __bool__(self) -> bool:
        if self.size != 1:
            raise ValueError(f"the truth value of an array of shape {self.shape} is ambiguous; "
                             "use .any() or .all()")
        return bool(self._concrete("bool()", True).item())

    def __int__(self) -> int:
        return int(self._concrete("int()", True).item())

    def __float__(self) -> float:
        return float(self._concrete("float()", True).item())

    def __complex__(self) -> complex:
        return complex(self._concrete("complex()").item())

    def __index__(self) -> int:
        if not dtypes.is_int(self.dtype) or self.size != 1:
            raise TypeError(f"only integer scalar arrays can be used as an index, got {self.aval}")
        return int(self._concrete("using an array as a Python index", True).item())

    def __hash__(self) -> int:
        raise TypeError("Tensors are unhashable (use them as static arguments via a tuple of values)")

    def __iter__(self) -> Any:
        if not self.shape:
            raise TypeError("iteration over a 0-d array")
        return (self[i] for i in range(self.shape[0]))

    def __repr__(self) -> str:
        if isinstance(self._data, Tracer):
            state = "dead " if not self._data.builder.alive else ""
            return f"Traced<{self.aval}>({state}{self._data.builder.label})"
        if self._data.array is None:  # pending: compute it, as JAX shows an array's values
            try:
                _eager.realize([self._data])
            except Exception as err:  # noqa: BLE001 - a repr must not raise (debuggers, notebooks)
                return f"<Tensor {self.aval} pending on {self.device} (computing it failed: {type(err).__name__})>"
        array = self._data.array
        assert array is not None
        body = np.array2string(array, separator=", ", prefix="Tensor(")
        weak = ", weak_type=True" if self._weak else ""
        return f"Tensor({body}, dtype={self.dtype.name}{weak})"

    def __str__(self) -> str:
        if isinstance(self._data, Tracer):
            return repr(self)
        return str(self._concrete("str()"))

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:  # Jupyter/IPython: show the value
        printer.text(repr(self.realize()) if not self.is_traced else repr(self))

    # everything else (operators, reshape, sum, ...) is in funcgrad/tensor_methods.py


def _unpickle_tensor(array: np.ndarray, device: str | None, weak: bool, requires_grad: bool | None,
                     grad: Tensor | None) -> Tensor:
    tensor = Tensor._wrap(_eager.from_array(np.require(array, requirements="C"), None if device is None
                                            else _eager.usable_device(device), device is not None), weak)
    tensor.requires_grad = requires_grad
    tensor.grad = grad
    return tensor


def tensor_from_host(array: np.ndarray) -> Tensor:
    """A Tensor on the default device holding ``array`` itself when it can (C-contiguous, a funcgrad
    dtype): zero-copy, for DLPack. The array is marked read-only through this view."""
    if array.dtype not in dtypes.ALL_DTYPES:
        raise TypeError(f"arrays of dtype {array.dtype} are not supported by funcgrad")
    view = np.require(array, requirements="C").view()  # (ascontiguousarray would make 0-d arrays 1-d)
    return Tensor._wrap(_eager.from_array(view, None, False))


Array = Tensor
# Tensors that asked for gradients, by id (Tensors are unhashable, like NumPy arrays)
GRAD_LEAVES: weakref.WeakValueDictionary[int, Tensor] = weakref.WeakValueDictionary()
_GRAD_LEAVES_LOCK = threading.Lock()  # one thread may add a leaf while backward() in another lists them


def grad_leaves() -> list[Tensor]:
    """The live Tensors that asked for gradients (a snapshot, safe while other threads add some)."""
    with _GRAD_LEAVES_LOCK:
        return list(GRAD_LEAVES.values())

def realize_all(tensors: Sequence[Tensor]) -> None:
    """Compute every pending Tensor of ``tensors`` in one call to the eager handler (so shared work
    is done once); a traced one raises the ConcretizationError that says why it cannot be."""
    pending = []
    for tensor in tensors:
        data = tensor._data
        if isinstance(data, Tracer):
            tensor._concrete("realize()")
        elif data.array is None:
            pending.append(data)
    if pending:
        _eager.realize(pending)


def as_tensor(value: Any) -> Tensor:
    """A pytree leaf as a Tensor (what the transforms hand to ``evaluate``): Tensors pass, a NumPy
    scalar (an IR literal) keeps its exact dtype, a Python scalar becomes a weakly typed rank-0
    Tensor (as ``funcgrad.numpy.asarray`` makes it), anything else goes to ``Tensor(value)``."""
    if isinstance(value, Tensor):
        return value
    if isinstance(value, np.generic):
        return Tensor(value, dtype=value.dtype)
    if isinstance(value, (bool, int, float, complex)):
        dtype = dtypes.python_scalar_dtype(value)
        if dtypes.is_int(dtype) and isinstance(value, int) and not isinstance(value, bool):
            info = np.iinfo(dtype)
            if not info.min <= value <= info.max:
                raise OverflowError(f"Python int {value} does not fit in {dtype.name} "
                                    f"(range {info.min}..{info.max})")
        tensor = Tensor._wrap(Tensor(np.asarray(value).astype(dtype)[()])._data)
        tensor._weak = dtype != dtypes.bool_
        return tensor
    return Tensor(value)


# --- binding primitives ------------------------------------------------------------------------


def aval_of(operand: Any) -> ShapedArray:
    if isinstance(operand, Tensor):
        return operand.aval
    if isinstance(operand, np.generic):
        return ShapedArray((), dtypes.canonicalize(operand.dtype))
    raise TypeError(f"primitives take Tensors or NumPy scalars, got {type(operand).__name__}")


def _atom_for(builder: IRBuilder, operand: Any) -> Any:
    """Turn an operand into an atom of ``builder``'s IR, lifting foreign values as constants."""
    if isinstance(operand, np.generic):
        return Literal.of(operand)
    data = operand._data
    if isinstance(data, Tracer):
        check_alive(data)
        if data.builder is builder:
            return data.var
        return builder.lift(operand, data.aval, key=id(data))
    return builder.lift(operand, data.aval, key=id(data))


def _buffer_for(operand: Any) -> Buffer:
    if isinstance(operand, np.generic):
        return _eager.from_array(np.asarray(operand), None, False)
    data = operand._data
    if isinstance(data, Tracer):  # only reachable with a dead tracer: live ones mean a builder exists
        check_alive(data)
        raise AssertionError("a live tracer was used outside of any trace")
    return data


def bind(primitive: Primitive, *operands: Any, **params: Any) -> Any:
    """Apply ``primitive``: record it in the running trace, or hand it to the eager handler outside
    any trace.

    Returns a Tensor, or a tuple of Tensors for multiple-result primitives.
    """
    out_avals = primitive.abstract_eval(*(aval_of(x) for x in operands), **params)
    avals = out_avals if primitive.multiple_results else (out_avals,)
    builder = current_builder()
    if builder is None:
        data: Sequence[Any] = _eager.pending(primitive, params, [_buffer_for(x) for x in operands], avals)
    else:
        data = builder.add_eqn(primitive, [_atom_for(builder, x) for x in operands], params, avals)
    if _config.active:  # debug_nans / debug_infs: remember the user's line of every value
        _record_sources(data)
    outs = tuple(Tensor._wrap(d) for d in data)
    return outs if primitive.multiple_results else outs[0]


def known_value(tensor: Tensor) -> Tensor | None:
    """The concrete value a traced ``tensor`` stands for, where its trace knows its inputs' values
    (``IRBuilder.known``: grad, jvp and vjp set it outside jit) and every value it depends on is
    known; None otherwise. Computed on demand, by binding the equations it depends on eagerly (the
    trace is suspended meanwhile), and remembered in the trace."""
    data = tensor._data
    if not isinstance(data, Tracer):
        return tensor
    builder = data.builder
    known = builder.known
    if known is None or not builder.alive:
        return None
    builder.read_known = True
    if data.var.id in known:
        value = known[data.var.id]
        return value if not value.is_traced else known_value(value)
    needed = {data.var.id}
    eqns = []
    for eqn in reversed(builder.eqns):
        if any(v.id in needed for v in eqn.outputs):
            eqns.append(eqn)
            needed.update(a.id for a in eqn.inputs if not isinstance(a, Literal) and a.id not in known)
    env: dict[int, Any] = {}
    for var, value in zip(builder.const_vars, builder.consts):
        if var.id in needed:
            resolved = known_value(value) if isinstance(value, Tensor) else value
            if resolved is None:
                return None
            env[var.id] = resolved
    for var in builder.in_vars:
        if var.id in needed:
            return None  # an input whose value is not known (it is abstract)
    with suspended():
        for eqn in reversed(eqns):
            operands = []
            for atom in eqn.inputs:
                if isinstance(atom, Literal):
                    operands.append(atom.value)
                elif atom.id in env:
                    operands.append(env[atom.id])
                else:
                    resolved = known_value(known[atom.id])
                    if resolved is None:
                        return None
                    operands.append(resolved)
            outs = bind(eqn.primitive, *operands, **eqn.param_dict)
            for var, value in zip(eqn.outputs, outs if eqn.primitive.multiple_results else (outs,)):
                env[var.id] = known[var.id] = value
    return env[data.var.id]


def evaluate(ir: IR, *args: Any, consts: Sequence[Any] | None = None) -> list[Any]:
    """Evaluate ``ir`` by binding its equations again, on Tensors (concrete or traced).

    This is how transformed IRs run: inside an enclosing trace the equations are recorded there,
    outside they go to the eager handler (which builds a lazy graph). Outputs that are literals
    come back as NumPy scalars.
    """
    if len(args) != len(ir.in_vars):
        raise TypeError(f"IR takes {len(ir.in_vars)} inputs, got {len(args)}")
    env: dict[int, Any] = {}
    for var, value in zip(ir.const_vars, ir.consts if consts is None else consts):
        env[var.id] = value
    for var, value in zip(ir.in_vars, args):
        env[var.id] = value

    def read(atom: Any) -> Any:
        return atom.value if isinstance(atom, Literal) else env[atom.id]

    for eqn in ir.eqns:
        outs = bind(eqn.primitive, *(read(a) for a in eqn.inputs), **eqn.param_dict)
        for var, value in zip(eqn.outputs, outs if eqn.primitive.multiple_results else (outs,)):
            env[var.id] = value
    return [read(a) for a in ir.outputs]
