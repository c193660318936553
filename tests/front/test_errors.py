"""The bad-input catalogue: every row of docs/errors.md is a row of ``ROWS`` here, and each is run.

A row is (id, trigger, exception type, message pattern). The trigger is the doc's one-line example;
the pattern is the message with its value parts as regexes (``re.escape`` for the static text). Each
test also checks the doc's row: the exception column names the raised type and the message column
(with ``…`` standing for the parts left out) matches the message actually raised, so the catalogue
cannot drift from the code. Triggers run in a fresh temporary folder, so file names are relative.

To add an error: add a Row here and a table row with the same id to docs/errors.md (the failing
test prints the message actually raised, to copy into the doc).
"""

from __future__ import annotations

import functools
import json
import os
import re
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, datasets, lax, nn
from funcgrad.devices import DeviceUnavailableError, available_devices, get_device
from funcgrad.devices.cpu import KernelCompileError
from funcgrad.lazy import DeviceMismatchError
from funcgrad.nn import functional as F
from funcgrad.nn import optim, state

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


class Row(NamedTuple):
    id: str
    trigger: Callable[[], Any]
    exception: type[BaseException]
    pattern: str  # matched with re.fullmatch (DOTALL) against str(exception)


def E(*parts: str | re.Pattern[str]) -> str:
    """A message pattern: str parts are static text (escaped); Pattern objects are regexes."""
    return "".join(p.pattern if isinstance(p, re.Pattern) else re.escape(p) for p in parts)


ANY = re.compile(r".*")
NUM = re.compile(r"-?\d+")
SHAPE = re.compile(r"\([-\d, ]*\)")
NAME = re.compile(r"[\w.<>\[\]-]+")


def ones(*shape: int) -> Tensor:
    return fnp.ones(shape)


def write(name: str, data: bytes) -> str:
    Path(name).write_bytes(data)
    return name


def safetensors(name: str, header: dict[str, Any], data: bytes = b"") -> str:
    text = json.dumps(header).encode()
    return write(name, struct.pack("<Q", len(text)) + text + data)


class _Holder:
    value: Any = None


def _escape_from_grad() -> Any:
    kept = _Holder()

    def loss(x: Tensor) -> Tensor:
        kept.value = x * 2
        return fnp.sum(x)

    fg.grad(loss)(ones(2))
    return kept.value + 1


def _register_twice() -> None:
    class Pair:
        pass
    fg.tree.register(Pair, lambda p: ((), None), lambda aux, children: Pair())
    fg.tree.register(Pair, lambda p: ((), None), lambda aux, children: Pair())


def _custom_vjp_under_jvp() -> Any:
    f = fg.custom_vjp(lambda x: x * 2)
    f.defvjp(lambda x: (x * 2, None), lambda res, ct: (ct * 2,))
    return fg.jvp(f, (ones(2),), (ones(2),))


def _custom_vjp_wrong_count() -> Any:
    f = fg.custom_vjp(lambda x: x * 2)
    f.defvjp(lambda x: (x * 2, None), lambda res, ct: (ct, ct))
    return fg.grad(lambda x: fnp.sum(f(x)))(ones(2))


def _custom_vjp_wrong_shape() -> Any:
    f = fg.custom_vjp(lambda x: x * 2)
    f.defvjp(lambda x: (x * 2, None), lambda res, ct: (ones(3),))
    return fg.grad(lambda x: fnp.sum(f(x)))(ones(2))


def _load_traced_state() -> Any:
    model = nn.Linear(2, 2)
    return fg.jit(lambda w: state.load_state_dict(model, {"weight": w, "bias": ones(2)}))(ones(2, 2))


def _step_with_wrong_grad_shape() -> Any:
    param = Tensor.ones(2, requires_grad=True)
    sgd = optim.SGD([param], lr=0.1)
    param.grad = Tensor.ones(3)
    return sgd.step()


def _default_device_from_environment() -> Any:
    with mock.patch.dict(os.environ, {"DEVICE": "TPU"}), mock.patch.object(fg.Device, "_default", None):
        return fg.Device.DEFAULT

def _webgpu_over_the_binding_limit() -> Any:
    if "WEBGPU" not in available_devices():
        pytest.skip("WEBGPU is not available here")
    x = fnp.arange(512.0).to("WEBGPU")
    with mock.patch.object(get_device("WEBGPU"), "max_binding_size", 1024):  # a small device's limit
        return (x * 2).numpy()

def _jit_reads_a_stale_grad() -> Any:
    weight = Tensor.ones(2, requires_grad=True)
    (weight * 2).sum().backward()  # an eager .grad, then a jitted step that accumulates into it

    def step(weight: Tensor) -> Any:
        (weight * 2).sum().backward()
        return weight.grad
    return fg.jit(step)(weight)

def _mnist_missing() -> Any:
    env = {"FUNCGRAD_DATA": os.getcwd(), "XDG_CACHE_HOME": os.getcwd()}
    with mock.patch.dict(os.environ, env), mock.patch.object(datasets, "SYSTEM_DATA_DIRS", ()):
        return datasets.mnist(download=False)


def _mnist_damaged() -> Any:
    Path("mnist").mkdir()
    write("mnist/train-images-idx3-ubyte", b"\0\0\x08\x01\0\0\0\x01\x07")
    with mock.patch.dict(os.environ, {"FUNCGRAD_DATA": os.getcwd()}):
        return datasets.mnist(download=False)


def _compiled_for_other_types() -> Any:
    compiled = fg.jit(lambda x: x * 2).lower(ones(2)).compile()
    return compiled(ones(3))


def _webgpu_float64() -> Any:
    if "WEBGPU" not in available_devices():
        pytest.skip("WEBGPU is not available here")
    return (fnp.ones(3, dtype="float64").to("WEBGPU") * 2).numpy()


def _kernel_compile_failure() -> Any:
    from test_render_llvm import small_kernel

    from funcgrad.devices import cpu
    from funcgrad.lower.render_llvm import render_llvm

    def broken(kernel: Any) -> str:
        return render_llvm(kernel).replace("ret void", "ret i32 undef_thing")
    with mock.patch.object(cpu, "render_llvm", broken):
        return cpu.CPUDevice(cache_dir=Path("cache")).compile(small_kernel("broken_one"))


def _optimizer_state_for_other_params() -> Any:
    adam = optim.adam(1e-3)
    return adam.update([ones(3)], adam.init([ones(2)]), [ones(3)])


def _step_after_eager_loss() -> Any:
    x = Tensor.ones((), requires_grad=True)
    loss = x * 2
    loss.numpy()
    return loss.backward()


def _custom_vjp_fwd_not_a_pair() -> Any:
    f = fg.custom_vjp(lambda x: x * 2)
    f.defvjp(lambda x: x * 2, lambda res, ct: (ct * 2,))
    return fg.grad(lambda x: fnp.sum(f(x)))(ones(2))


def _custom_vjp_int_cotangent() -> Any:
    f = fg.custom_vjp(lambda x: x * 2)
    f.defvjp(lambda x: (x * 2, None), lambda res, ct: (fnp.ones(2, dtype="int32"),))
    return fg.grad(lambda x: fnp.sum(f(x)))(ones(2))


def _pickle_jitted() -> Any:
    import pickle
    return pickle.dumps(fg.jit(fnp.sin))


def _torch_zip_checkpoint() -> Any:
    import zipfile
    with zipfile.ZipFile("model.pt", "w") as archive:  # what torch.save writes: a zip of pickles
        archive.writestr("model/data.pkl", b"\x80\x02}q\x00.")
    return state.safe_load("model.pt")


def _save_into_a_folder() -> Any:
    os.mkdir("checkpoints")
    return state.safe_save({"w": ones(2)}, "checkpoints")


def _with_environment(variable: str, value: str, read: Callable[[], Any]) -> Callable[[], Any]:
    def trigger() -> Any:
        with mock.patch.dict(os.environ, {variable: value}):
            return read()
    return trigger


def _pool_limit() -> Any:
    from funcgrad.lower import pool
    return pool._limit_bytes()


def _compiler_client() -> Any:
    from funcgrad.devices.cpu_compiler import WorkerClient
    return WorkerClient()


def _disk_cache() -> Any:
    from funcgrad.devices.cpu_disk_cache import DiskCache
    return DiskCache(".")


def _compiler_mode() -> Any:
    from funcgrad.devices.cpu_target import compiler_mode
    return compiler_mode()


def _beam_width() -> Any:
    from funcgrad.lower.optimize import beam_width
    return beam_width()


def _debug_level() -> Any:
    from funcgrad.util.debug import debug_level
    return debug_level()


class _FakeComm:
    """Two ranks as rank 0 sees them, for the distributed rows: rank 1's debug signature is another call;
    a nonblocking collective never completes (rank 1 never joins)."""

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 2

    def Allgather(self, send: np.ndarray, out: np.ndarray) -> None:
        out[0] = send
        other = json.dumps(["allgather float32[3]", "train.py:14"]).encode()
        out[1] = 0
        out[1, :len(other)] = np.frombuffer(other, np.uint8)

    def Iallreduce(self, send: np.ndarray, out: np.ndarray, op: Any = None) -> object:
        return object()


def _fake_mpi_engine() -> Any:
    from funcgrad.distributed.mpi import MPIEngine
    engine = MPIEngine.__new__(MPIEngine)
    engine.comm = _FakeComm()
    engine.MPI = mock.Mock(SUM="sum", MAX="max", MIN="min", Request=mock.Mock(Testall=lambda requests: False))
    return engine


def _mismatched_collective() -> Any:
    with mock.patch.dict(os.environ, {"FUNCGRAD_DEBUG_COLLECTIVES": "1", "FUNCGRAD_COLLECTIVE_TIMEOUT": ""}):
        return _fake_mpi_engine().allreduce(np.ones(4, np.float32))


def _hung_collective() -> Any:
    with mock.patch.dict(os.environ, {"FUNCGRAD_DEBUG_COLLECTIVES": "0", "FUNCGRAD_COLLECTIVE_TIMEOUT": "0.05"}):
        return _fake_mpi_engine().allreduce(np.ones((2, 2), np.float32))


def _nccl_missing() -> Any:
    from funcgrad.distributed import nccl
    with mock.patch.object(nccl, "_LIBRARY", []), \
            mock.patch.object(nccl, "nccl_candidates", lambda: ["libnccl.so.2"]), \
            mock.patch.object(nccl.ctypes, "CDLL", mock.Mock(side_effect=OSError("libnccl.so.2: cannot open shared "
                                                                                 "object file"))):
        return nccl.nccl_version()


def _collective_timeout() -> Any:
    from funcgrad.util.collective_engine import collective_timeout
    return collective_timeout()


ENV_DEFAULT = re.compile(r"; unset it for the default \(.*\)")

CONCRETIZATION_ADVICE = (". Python control flow on traced values cannot be recorded: use fg.lax.cond / "
                         "fg.numpy.where for branches, or mark the argument static (jit's static_argnums / "
                         "static_argnames).")

ROWS: list[Row] = [
    # --- shapes --------------------------------------------------------------------------------------------
    Row("E-shape-1", lambda: ones(2, 3) + ones(4), ValueError,
        E("shapes ", ANY, " cannot be broadcast together")),
    Row("E-shape-2", lambda: ones(2, 3) @ ones(4, 5), TypeError,
        E("matmul: shapes ", SHAPE, " and ", SHAPE, " do not align (", NUM, " != ", NUM, ")")),
    Row("E-shape-3", lambda: fnp.reshape(ones(2, 3), (4, 2)), ValueError,
        E("cannot reshape an array of shape ", SHAPE, " (", NUM, " elements) into shape ", SHAPE)),
    Row("E-shape-4", lambda: ones(2, 3).reshape(5, -1), ValueError,
        E("cannot reshape an array of ", NUM, " elements into shape ", SHAPE)),
    Row("E-shape-5", lambda: fnp.concatenate([ones(2, 3), ones(2, 4)], axis=0), ValueError,
        E("concatenate along axis ", NUM, " needs equal shapes elsewhere, got ", ANY)),
    Row("E-shape-6", lambda: fnp.stack([ones(2), ones(3)]), ValueError,
        E("stack needs arrays of one shape, got [", ANY, "]")),
    Row("E-shape-7", lambda: fnp.zeros((2, -1)), ValueError, E("negative dimension in shape ", SHAPE)),
    Row("E-shape-8", lambda: fnp.transpose(ones(2, 3), (0, 0)), ValueError,
        E(ANY, " is not a permutation of the axes of an array of rank ", NUM)),
    Row("E-shape-9", lambda: fnp.dot(ones(3), ones(4)), TypeError,
        E("dot: shapes ", SHAPE, " and ", SHAPE, " are not aligned (", ANY, ")")),
    Row("E-shape-25", lambda: ones(2, 3, 4) @ ones(3, 4, 5), ValueError,
        E("matmul: the batch dimensions ", SHAPE, " and ", SHAPE, " of shapes ", SHAPE, " and ", SHAPE,
          " do not broadcast")),
    Row("E-shape-10", lambda: fnp.squeeze(ones(2, 3), axis=0), ValueError,
        E("cannot squeeze axis ", NUM, " of shape ", SHAPE, ": its size is ", NUM, ", not 1")),
    Row("E-shape-11", lambda: fnp.split(ones(5), 2), ValueError,
        E("split: axis ", NUM, " of size ", NUM, " (shape ", SHAPE, ") does not divide into ", NUM,
          " equal sections; use array_split")),
    Row("E-shape-12", lambda: fnp.einsum("ij,jk->ik", ones(2, 3), ones(4, 5)), ValueError,
        E("einsum: subscript '", NAME, "' of sizes ", NUM, " and ", NUM, " do not match in ", ANY)),
    Row("E-shape-13", lambda: ones(2).item(), ValueError,
        E("item() needs an array with one element, this one has shape ", SHAPE)),
    Row("E-shape-14", lambda: bool(ones(2)), ValueError,
        E("the truth value of an array of shape ", SHAPE, " is ambiguous; use .any() or .all()")),
    Row("E-shape-15", lambda: len(fnp.ones(())), TypeError, E("len() of a 0-d array")),
    Row("E-shape-16", lambda: fnp.full((2, 3), ones(4)), ValueError,
        E("full: fill_value of shape ", SHAPE, " cannot be broadcast to shape ", SHAPE)),
    Row("E-shape-17", lambda: fnp.arange(0, 5, 0), ValueError, E("arange: step must not be zero")),
    Row("E-shape-18", lambda: Tensor([[1, 2], [3]]), ValueError, E("cannot make an array from list: ", ANY)),
    Row("E-shape-19", lambda: fnp.ones(2.5), TypeError, E("shape must be an int or a sequence of ints, got ", ANY)),
    Row("E-shape-20", lambda: fnp.linspace(0, 1, 2.5), TypeError, E("linspace: num must be an integer, got ", ANY)),
    Row("E-shape-21", lambda: fnp.reshape(ones(2, 3), (2, -1, -1)), ValueError,
        E("reshape: only one dimension may be -1, got shape ", SHAPE)),
    Row("E-shape-22", lambda: ones(2, 3).reshape(2.0, 3), TypeError,
        E("reshape: the shape must be an int or a sequence of ints, got ", ANY)),
    Row("E-shape-23", lambda: fnp.hstack(fnp.ones(0)), ValueError,
        E("hstack needs at least one array, got an array of shape ", SHAPE, " to unstack")),
    Row("E-shape-24", lambda: fnp.broadcast_to(ones(3), None), TypeError,
        E("broadcast_to: a shape must be an int or a sequence of ints, got ", ANY)),
    Row("E-shape-26", lambda: fnp.ones(10**20), ValueError,
        E(NAME, ": shape ", SHAPE, " of ", NAME, " holds ", NUM, " elements (", NUM, " bytes), more than the "
          "9223372036854775807 bytes an array can address")),
    # --- indexing ------------------------------------------------------------------------------------------
    Row("E-index-1", lambda: fnp.ones(0)[0], IndexError,
        E("index ", NUM, " is out of bounds for axis ", NUM, " with size ", NUM)),
    Row("E-index-2", lambda: ones(3)[0, 0], IndexError,
        E("too many indices for array: array is ", NUM, "-dimensional, but ", NUM, " were indexed")),
    Row("E-index-3", lambda: ones(3)[1.5], IndexError,
        E("only integers, slices (`:`), ellipsis (`...`), None (`fnp.newaxis`) and integer or boolean arrays "
          "are valid indices; got ", ANY)),
    Row("E-index-4", lambda: ones(3)[fnp.array([True, False])], IndexError,
        E("boolean index did not match indexed array along axis ", NUM, "; size of axis is ", NUM,
          " but size of corresponding boolean axis is ", NUM)),
    Row("E-index-5", lambda: ones(3).__setitem__(0, 1.0), TypeError,
        E("funcgrad Tensors are immutable; use x = x.at[index].set(value) (as in JAX)")),
    Row("E-index-6", lambda: ones(3).at[0:2].set(ones(3)), ValueError,
        E("x.at[...]: values of shape ", SHAPE, " cannot be broadcast to the indexed shape ", SHAPE,
          " of an array of shape ", SHAPE)),
    Row("E-index-7", lambda: fnp.take(ones(3), fnp.array([5]), mode="raise"), IndexError,
        E("take: an index in [", ANY, "] is out of bounds for axis ", NUM, " with size ", NUM)),
    Row("E-index-8", lambda: fnp.take(ones(3), fnp.array([0.5])), IndexError,
        E("take: indices must be integers, got dtype ", NAME)),
    Row("E-index-9", lambda: ones(3)[::0], ValueError, E("slice step cannot be zero")),
    # --- dtypes --------------------------------------------------------------------------------------------
    Row("E-dtype-1", lambda: fnp.zeros(3, dtype="complex256"), TypeError,
        E("dtype ", NAME, " is not supported by funcgrad; supported: bool, int8, ", ANY)),
    Row("E-dtype-2", lambda: fnp.zeros(3, dtype="foo"), TypeError,
        E("'foo' is not a dtype funcgrad understands; use one of bool, ", ANY)),
    Row("E-dtype-3", lambda: fnp.asarray(np.array(["2020-01-01"], "datetime64[D]")), TypeError,
        E("arrays of dtype ", NAME, " are not supported by funcgrad")),
    Row("E-dtype-4", lambda: Tensor([object()]), TypeError, E("cannot make an array from list holding ", NAME)),
    Row("E-dtype-5", lambda: fnp.bitwise_and(ones(2), ones(2)), TypeError,
        E(NAME, " needs integer or bool arrays, got ", NAME)),
    Row("E-dtype-6", lambda: fnp.array([1], dtype="int8") + 1000, OverflowError,
        E("Python int ", NUM, " does not fit in ", NAME, " (range ", NUM, "..", NUM, ")")),
    Row("E-dtype-7", lambda: fnp.array([True]) % fnp.array([True]), TypeError,
        E("remainder is not defined for bool arrays")),
    Row("E-dtype-8", lambda: fg.lax.select(ones(2), ones(2), ones(2)), TypeError,
        E("select needs a bool predicate, got ", NAME)),
    Row("E-dtype-9", lambda: fg.random.normal(fg.random.key(0), (2,), dtype="int32"), TypeError,
        E("normal needs a floating dtype, got ", NAME)),
    Row("E-dtype-10", lambda: Tensor([2**40]), OverflowError,
        E("Python int ", NUM, " does not fit in ", NAME, " (range ", NUM, "..", NUM, ")")),
    Row("E-dtype-11", lambda: Tensor(2**70), OverflowError,
        E("Python int ", NUM, " does not fit in any funcgrad dtype (int64 or uint64)")),
    Row("E-dtype-12", lambda: fnp.exp(None), TypeError,
        E("cannot make an array from ", ANY, " (a ", NAME, "); arrays hold numbers (bool, int, float, complex) or "
          "nested lists of them")),
    Row("E-dtype-13", lambda: fnp.arange(10**12), OverflowError,
        E("arange: ", NUM, " values from ", NUM, " to ", NUM, " do not fit in ", NAME, " (range ", NUM, "..", NUM,
          "); pass dtype='int64'")),
    # --- complex numbers -----------------------------------------------------------------------------------
    Row("E-complex-1", lambda: fg.grad(lambda z: z * z)(np.complex64(1j)), TypeError,
        E("grad requires a function returning a real scalar, got shape () and dtype complex64; use jacrev or "
          "vjp for other outputs; for holomorphic differentiation pass holomorphic=True")),
    Row("E-complex-2", lambda: fg.grad(lambda z: z * z, holomorphic=True)(np.float32(1.0)), TypeError,
        E("grad with holomorphic=True requires complex inputs, but argument 0 has a leaf of dtype float32. "
          "Cast it with .astype(complex64).")),
    Row("E-complex-3", lambda: fnp.maximum(fnp.asarray([1j]), 1.0), TypeError,
        E("max does not accept complex64 operands (it takes bool or integer or floating arrays)")),
    Row("E-complex-4", lambda: fnp.fft.rfft(fnp.asarray([1j])), TypeError,
        E("rfft needs a real input, got complex64 (use fft for complex arrays)")),
    # --- axes ----------------------------------------------------------------------------------------------
    Row("E-axis-1", lambda: fnp.sum(ones(2, 3), axis=2), ValueError,
        E("axis ", NUM, " is out of bounds for an array of rank ", NUM)),
    Row("E-axis-2", lambda: fnp.sum(ones(2, 3), axis=(0, 0)), ValueError, E("repeated axis in ", ANY)),
    Row("E-axis-3", lambda: fnp.sum(ones(2, 3), axis=1.0), TypeError,
        E("axis must be an integer, a tuple of integers or None, got ", ANY)),
    Row("E-axis-4", lambda: fnp.argmax(fnp.ones((0,))), ValueError,
        E("argmax of an empty axis (shape ", SHAPE, ", axis ", NUM, ") has no answer")),
    Row("E-axis-5", lambda: fnp.max(fnp.ones((0,))), ValueError,
        E("max of an empty axis has no identity (shape ", SHAPE, ", axis ", ANY, "); reduce over non-empty axes "
          "only")),
    Row("E-axis-6", lambda: fnp.expand_dims(ones(2, 3), 5), ValueError,
        E("axis ", NUM, " is out of bounds for an array of rank ", NUM)),
    Row("E-axis-7", lambda: ones(2, 3).unsqueeze(None), TypeError,
        E("expand_dims: axis must be an int or a sequence of ints, got ", ANY)),
    # --- tracers -------------------------------------------------------------------------------------------
    Row("E-tracer-1", lambda: fg.jit(lambda x: x if x > 0 else -x)(fnp.ones(())), fg.ConcretizationError,
        E("bool() needs a concrete value, but this array is traced (an abstract ", NAME, " inside ", ANY,
          "). It depends on the traced argument ", ANY, CONCRETIZATION_ADVICE)),
    Row("E-tracer-2", lambda: fg.jit(lambda x: x.item())(fnp.ones(())), fg.ConcretizationError,
        E("item() needs a concrete value, but this array is traced ", ANY)),
    Row("E-tracer-3", lambda: fg.jit(lambda x: np.asarray(x))(ones(2)), fg.ConcretizationError,
        E("np.asarray() needs a concrete value, but this array is traced ", ANY)),
    Row("E-tracer-4", lambda: fg.jit(lambda n: ones(3)[:n])(fnp.array(2)), fg.ConcretizationError,
        E("slice bounds must be concrete, since they decide the result's shape, but ", ANY, " has a traced bound. "
          "For a window of fixed size k at a traced offset i, index with i + fnp.arange(k) instead.")),
    Row("E-tracer-5", lambda: fg.jit(lambda x: x[x > 0])(ones(3)), fg.ConcretizationError,
        E("boolean indexing has a value-dependent shape, so it needs a concrete mask, but this mask is traced (",
          NAME, "). Use fnp.where(mask, x, other) to select values with a fixed shape instead.")),
    Row("E-tracer-6", lambda: fg.jit(fnp.nonzero)(ones(3)), fg.ConcretizationError,
        E("nonzero: the output shape depends on the values of the input, which are traced here (an abstract ",
          NAME, "). Pass size= (and optionally fill_value=) to fix the output size, as in JAX, or call it "
          "outside the trace.")),
    Row("E-tracer-7", _escape_from_grad, fg.EscapedTracerError,
        E("a traced value of type ", NAME, " escaped from the ", NAME, " trace started at ",
          re.compile(r".*test_errors\.py:\d+ \(\w+\)"), ", and was used after that trace finished. Return it "
          "from the transformed function instead of storing it (in a global, a list or self.attribute).")),
    Row("E-tracer-8", lambda: fg.jit(lambda x, n: x, static_argnums=1)(ones(2), [1]), TypeError,
        E("jit(", NAME, "): static argument ", NUM, " of type ", NAME, " is not hashable; pass a tuple instead "
          "of a list, or make it a traced argument")),
    Row("E-tracer-9", lambda: fg.jit(lambda x: x, static_argnums=3)(ones(2)), ValueError,
        E("jit(", NAME, "): static_argnums ", NUM, " is out of range for ", NUM, " positional arguments")),
    Row("E-tracer-10", lambda: fg.jit(lambda x: "a")(ones(2)), TypeError,
        E("a traced function returned a ", NAME, "; outputs must be pytrees whose leaves are arrays or scalars")),
    Row("E-tracer-11", lambda: fg.jit(lambda x: x)("a"), TypeError,
        E("argument leaf ", NUM, " of type ", NAME, " is not a valid funcgrad type: a traced function takes "
          "pytrees (tuples, lists, dicts, ...) whose leaves are arrays or scalars")),
    Row("E-tracer-12", lambda: fg.jit(3), TypeError, E("jit expects a callable, got ", NAME)),
    Row("E-tracer-13", _compiled_for_other_types, TypeError,
        E("this compiled function was lowered for other argument types: [", ANY, "]")),
    Row("E-tracer-14", lambda: fg.jit(lambda x, y: x, static_argnames="y")(ones(2), y=[1]), TypeError,
        E("jit(", NAME, "): static argument '", NAME, "' of type ", NAME, " is not hashable; pass a tuple instead "
          "of a list, or make it a traced argument")),
    Row("E-tracer-15", lambda: fg.jit(lambda x, y: x, static_argnums=1)(ones(2), {"a": 1}), TypeError,
        E("jit(", NAME, "): static argument 1 of type dict is not hashable; pass a tuple of (key, value) pairs or a "
          "frozen dataclass instead, or make it a traced argument")),
    Row("E-tracer-16", lambda: fg.jit(lambda x, y: x, static_argnums=1)(ones(2), np.ones(2)), TypeError,
        E("jit(", NAME, "): static argument 1 of type ndarray is not hashable; arrays are traced arguments: remove it "
          "from static_argnums/static_argnames (or pass a tuple of its values if it must be static)")),
    Row("E-tracer-17", _pickle_jitted, TypeError,
        E("cannot pickle jit(", NAME, "): a jitted function holds compiled kernels and caches that belong to this "
          "process; pickle its arguments (parameters, optimizer state) and the plain function's module, then call "
          "fg.jit(f) again after loading")),
    # --- transforms ----------------------------------------------------------------------------------------
    Row("E-transform-1", lambda: fg.grad(lambda x: x)(ones(3)), TypeError,
        E("grad requires a function returning a real scalar, got ", ANY, "; use jacrev or vjp for other outputs")),
    Row("E-transform-2", lambda: fg.grad(lambda x: fnp.sum(x * 1.0))(fnp.arange(3)), TypeError,
        E("grad requires real-valued (floating-point) inputs, but argument ", NUM, " has a leaf of dtype ", NAME,
          ". Differentiate only floating-point arguments (argnums=...), or cast with .astype(float32).")),
    Row("E-transform-3", lambda: fg.grad(fnp.sum, argnums=2)(ones(3)), ValueError,
        E("grad: argnums ", NUM, " is out of range for a function called with ", NUM, " positional arguments")),
    Row("E-transform-4", lambda: fg.grad(fnp.sum, has_aux=True)(ones(3)), TypeError,
        E(NAME, " with has_aux=True needs the function to return a pair (output, aux), got ", ANY)),
    Row("E-transform-5", lambda: fg.vmap(lambda a, b: a + b)(ones(2), ones(3)), ValueError,
        E("vmap got inconsistent sizes for the mapped axes: ", ANY)),
    Row("E-transform-6", lambda: fg.vmap(lambda a, b: a + b, in_axes=(0,))(ones(2), ones(2)), ValueError,
        E("vmap in_axes has ", NUM, " entries but the function was called with ", NUM, " arguments")),
    Row("E-transform-7", lambda: fg.vmap(lambda a: a, in_axes=2)(ones(2)), ValueError,
        E("vmap in_axes ", NUM, " is out of range for ", ANY, " of rank ", NUM)),
    Row("E-transform-8", lambda: fg.vmap(lambda a: a, in_axes="x")(ones(2)), TypeError,
        E("vmap in_axes must be ints or None, got ", ANY, " for ", ANY)),
    Row("E-transform-9", lambda: fg.vmap(lambda a: a, in_axes=None)(ones(2)), ValueError,
        E("vmap needs at least one mapped input (in_axes not None) or an explicit axis_size")),
    Row("E-transform-10", lambda: fg.vmap(lambda a: a, out_axes=3)(ones(2)), ValueError,
        E("vmap out_axes ", NUM, " is out of range for an output of rank ", NUM)),
    Row("E-transform-11", lambda: fg.vmap(lambda a: a, in_axes=({"x": 0},))({"y": ones(2)}), ValueError,
        E("the prefix tree ", ANY, " does not match the argument tree ", ANY)),
    Row("E-transform-12", lambda: fg.jvp(lambda x: x, ones(2), ones(2)), TypeError,
        E("jvp takes primals and tangents as tuples (or lists) of arguments")),
    Row("E-transform-13", lambda: fg.jvp(lambda x: x, (ones(2),), (ones(3),)), ValueError,
        E("jvp: tangent ", NUM, " has shape ", SHAPE, " but its primal has shape ", SHAPE)),
    Row("E-transform-14", lambda: fg.jvp(lambda x: x, (ones(2),), (fnp.ones(2, dtype="float64"),)), TypeError,
        E("jvp: tangent ", NUM, " has dtype ", NAME, " but its primal has dtype ", NAME, "; they must match")),
    Row("E-transform-15", lambda: fg.vjp(lambda x: x, ones(2))[1](ones(3)), ValueError,
        E("vjp: cotangent ", NUM, " has shape ", SHAPE, ", the output has shape ", SHAPE)),
    Row("E-transform-16", lambda: fg.custom_jvp(lambda x: x)(ones(2)), AttributeError,
        E("custom_jvp function ", NAME, " has no rule; call .defjvp(rule) first")),
    Row("E-transform-17", _custom_vjp_under_jvp, TypeError,
        E("can't apply forward-mode differentiation (jvp, jacfwd, hessian) to a function with a custom_vjp rule; "
          "give it a custom_jvp rule, or use reverse mode (grad, vjp, jacrev)")),
    Row("E-transform-18", lambda: fg.grad(lambda x: lax.while_loop(lambda c: c < 9.0, lambda c: c * 2, x))(
        fnp.ones(())), NotImplementedError,
        E("reverse-mode differentiation does not work for lax.while_loop (its number of steps is only known at "
          "run time); use lax.scan, or lax.fori_loop with Python-int bounds, which can be differentiated in "
          "reverse mode")),
    Row("E-transform-19", lambda: fg.grad(fnp.sum, argnums="x")(ones(3)), TypeError,
        E("grad: argnums must be an int or a sequence of ints, got ", ANY)),
    Row("E-transform-20", lambda: fg.linearize(lambda x: x * 2, ones(2))[1](ones(3)), ValueError,
        E("linearize: tangent ", NUM, " has shape ", SHAPE, " but its primal has shape ", SHAPE)),
    Row("E-transform-21", lambda: fg.vjp(lambda x: (x, x), ones(2))[1](ones(2)), ValueError,
        E("vjp: the cotangent has structure ", ANY, " but the output has ", ANY)),
    Row("E-transform-22", lambda: fg.vmap(lambda a: a, out_axes=None)(ones(2)), ValueError,
        E("vmap: an output with out_axes=None depends on the mapped axis")),
    Row("E-transform-23", _custom_vjp_wrong_count, TypeError,
        E("the custom_vjp bwd of ", NAME, " returned ", NUM, " cotangents for ", NUM, " arguments")),
    Row("E-transform-24", _custom_vjp_wrong_shape, TypeError,
        E("the custom_vjp bwd of ", NAME, " returned a cotangent of shape ", SHAPE, " for an argument of shape ",
          SHAPE)),
    Row("E-transform-25", _custom_vjp_fwd_not_a_pair, TypeError,
        E("the custom_vjp fwd of ", NAME, " must return a pair (output, residuals), got an array of shape ", SHAPE)),
    Row("E-transform-26", _custom_vjp_int_cotangent, TypeError,
        E("the custom_vjp bwd of ", NAME, " returned a cotangent of dtype int32 for an argument of dtype float32; "
          "return a floating-point cotangent (e.g. ct.astype('float32'))")),
    Row("E-transform-27", lambda: fg.vmap(lambda x: x, out_axes="x"), TypeError,
        E("vmap out_axes must be an int, None, or a pytree of them matching the output, got ", ANY, " in out_axes=",
          ANY)),
    Row("E-transform-28", lambda: fg.vmap(lambda x: (x, x), out_axes=(0,))(ones(3)), ValueError,
        E("vmap out_axes=", ANY, " does not match the structure of the function's output ", ANY,
          ": give one int or None, or a prefix of the output's structure")),
    Row("E-transform-29", lambda: fg.grad(fg.checkpoint(lambda x: fnp.sin(fnp.sin(x)),
                                                        policy=lambda *a, **k: "yes"))(1.0), TypeError,
        E("checkpoint: the policy returned ", ANY, " for ", NAME,
          "; a policy returns True (save) or False (recompute)")),
    # --- control flow (funcgrad.lax) -------------------------------------------------------------------------
    Row("E-control-1", lambda: lax.cond(ones(2) > 0, lambda x: x, lambda x: -x, ones(2)), TypeError,
        E("cond: the predicate must be a scalar, got shape ", SHAPE, "; use fnp.where for elementwise selection")),
    Row("E-control-2", lambda: lax.cond(True, lambda x: x, lambda x: x.astype("int32"), ones(2)), TypeError,
        E("switch/cond: branch ", NUM, " returns ", ANY, " but branch 0 returns ", ANY)),
    Row("E-control-3", lambda: lax.switch(1.5, [lambda x: x], ones(2)), TypeError,
        E("switch: the index must be an integer scalar, got ", NAME)),
    Row("E-control-4", lambda: lax.scan(lambda c, x: (c, x), 0.0, ones(3), length=4), ValueError,
        E("scan: xs leaves and length disagree on the number of steps: [", ANY, "]")),
    Row("E-control-5", lambda: lax.scan(lambda c, x: c, fnp.zeros(()), ones(3)), TypeError,
        E("scan: f must return a pair (carry, y), got ", ANY)),
    Row("E-control-6", lambda: lax.scan(lambda c, x: (c.astype("int32"), x), fnp.zeros(()), ones(3)), TypeError,
        E("scan: f must return a carry of the same structure and types as init: got ", ANY, ", expected ", ANY)),
    Row("E-control-7", lambda: lax.while_loop(lambda c: c < 3, lambda c: (c, c), 0), TypeError,
        E("while_loop: body_fun must return the same structure and types as init_val: got ", ANY)),
    Row("E-control-8", lambda: lax.while_loop(lambda c: ones(2) > 0, lambda c: c, 0), TypeError,
        E("while_loop: cond_fun must return a scalar, got ", ANY)),
    Row("E-control-9", lambda: lax.fori_loop(0, 3, lambda i, c: (c, c), 0.0), TypeError,
        E("fori_loop: body_fun must return a carry of the same structure as init_val: got ", ANY, ", expected ",
          ANY)),
    Row("E-control-10", lambda: fg.jit(lambda n: lax.fori_loop(0, n, lambda i, c: (c, c), 0.0))(fnp.array(3)),
        TypeError, E("fori_loop: body_fun must return a carry of the same structure as init_val: got ", ANY,
                     ", expected ", ANY)),
    # --- pytrees -------------------------------------------------------------------------------------------
    Row("E-tree-1", lambda: fg.tree.structure([1, 2]).unflatten([1]), ValueError,
        E("unflatten: ", ANY, " has ", NUM, " leaves but ", NUM, " leaves were given.")),
    Row("E-tree-2", lambda: fg.tree.map(lambda a, b: a, {"a": 1}, {"b": 1}), ValueError,
        E("map: tree ", NUM, " has a different structure from tree 1; all trees must match exactly.\n  tree 1: ",
          ANY, "\n  tree ", NUM, ": ", ANY)),
    Row("E-tree-3", _register_twice, ValueError,
        E(NAME, " is already registered as a pytree node; register each class once, next to its definition.")),
    Row("E-tree-4", lambda: fg.tree.flatten({1: "a", "b": "c"}), ValueError,
        E("tree.flatten: the keys of a dict must be sortable, but these cannot be compared with each other (key types ",
          ANY, "): ", ANY, "; use keys of one type, or an OrderedDict (flattened in its own order)")),
    # --- random keys ---------------------------------------------------------------------------------------
    Row("E-random-1", lambda: fg.random.normal(3, (2,)), TypeError,
        E("normal expects a PRNG key (a uint32 array of shape (2,), made by fg.random.key(seed)), got ", NAME)),
    Row("E-random-2", lambda: fg.random.normal(ones(2), (2,)), TypeError,
        E("normal expects a PRNG key (a uint32 array of shape (2,), made by fg.random.key(seed)), got an array of "
          "dtype ", NAME, " and shape ", SHAPE)),
    Row("E-random-3", lambda: fg.random.uniform(fg.random.key(0), (2, -1)), ValueError,
        E(NAME, ": shape ", SHAPE, " has a negative dimension")),
    Row("E-random-4", lambda: fg.random.key(2**70), ValueError, E("key: seed ", NUM, " does not fit in 64 bits")),
    Row("E-random-5", lambda: fg.random.key(1.5), TypeError,
        E("key: the seed must be an integer scalar, got an array of dtype ", NAME, " and shape ", SHAPE)),
    Row("E-random-6", lambda: fg.random.choice(fg.random.key(0), 3, (5,), replace=False), ValueError,
        E("choice: cannot take ", NUM, " samples of shape ", SHAPE, " from ", NUM, " entries without replacement")),
    Row("E-random-7", lambda: fg.random.uniform(fg.random.key(0), (3,), minval=ones(2)), ValueError,
        E(NAME, ": shape ", SHAPE, " must be broadcast-compatible with (and at least as large as) the parameter "
          "shapes ", ANY)),
    Row("E-random-8", lambda: fg.random.fold_in(fg.random.key(0), 2**40), ValueError,
        E("fold_in: data ", NUM, " does not fit in 32 bits")),
    Row("E-random-9", lambda: fg.random.normal(fg.random.key(0), ones(2)), TypeError,
        E("normal: shape must be an int or a tuple of ints, got ", ANY)),
    Row("E-random-10", lambda: fg.random.permutation(fg.random.key(0), 2.5), TypeError,
        E("permutation: x must be a non-negative int or an array, got ", ANY)),
    Row("E-random-11", lambda: fg.random.normal(fg.random.key(0), (10**6, 10**6)), ValueError,
        E("normal: shape ", SHAPE, " has ", NUM, " elements, more than the 2147483648 one draw can make (threefry's "
          "counters are 32-bit); split the key and draw in parts")),
    # --- devices -------------------------------------------------------------------------------------------
    Row("E-device-1", lambda: Tensor.ones(2).to("TPU"), DeviceUnavailableError,
        E("device 'TPU' is not available: no such device (known: CPU, CL, CUDA, WEBGPU, REFERENCE); available "
          "devices: CPU", ANY)),
    Row("E-device-2", lambda: Tensor.ones(2).to("CUDA") if "CUDA" not in available_devices()
        else pytest.skip("CUDA is available here"), DeviceUnavailableError,
        E("device 'CUDA' is not available: ", ANY, "; available devices: CPU", ANY)),
    Row("E-device-3", lambda: Tensor.ones(2).to(3), TypeError,
        E("a device is named by a string such as 'CPU' or 'CL', got ", NAME)),
    Row("E-device-4", lambda: Tensor.ones(2).to("REFERENCE") + Tensor.ones(2).to("CPU"), DeviceMismatchError,
        E(NAME, ": operands are on different devices (", NAME, " and ", NAME, "); funcgrad does not copy between "
          "devices silently: move one first, e.g. x.to(", ANY, ") or fg.device_put(x, ", ANY, ")")),
    Row("E-device-5", _webgpu_float64, RuntimeError,
        E("kernel ", NAME, " cannot run on WEBGPU: WEBGPU cannot hold float64 arrays (WGSL has no 64-bit types; "
          "supported: ", ANY)),
    Row("E-device-6", _default_device_from_environment, DeviceUnavailableError,
        E("DEVICE='TPU' (environment variable): device 'TPU' is not available: no such device (known: ", ANY,
          "); available devices: CPU", ANY)),
    Row("E-device-7", _webgpu_over_the_binding_limit, RuntimeError,
        E("kernel ", NAME, ": output 0 f32[512] needs a 2048-byte storage buffer, over the device's "
          "max_storage_buffer_binding_size of 1024 bytes")),
    Row("E-device-8", lambda: Tensor.ones(2).to("CPU:1"), DeviceUnavailableError,
        E("device 'CPU:1' is not available: funcgrad uses one device of each kind, index 0 ('CPU' or 'CPU:0'); got "
          "index '1'")),
    # --- checkpoints (funcgrad.nn.state) ---------------------------------------------------------------------
    Row("E-checkpoint-1", lambda: state.safe_load("missing.safetensors"), FileNotFoundError,
        E("[Errno 2] No such file or directory: 'missing.safetensors'")),
    Row("E-checkpoint-2", lambda: state.safe_load(write("short.safetensors", b"abc")), state.SafetensorsError,
        E(NAME, ": too short for a safetensors file (", NUM, " bytes; the header length alone takes 8)")),
    Row("E-checkpoint-3", lambda: state.safe_load(write("long.safetensors", struct.pack("<Q", 1000) + b"{}")),
        state.SafetensorsError, E(NAME, ": header length ", NUM, " is larger than the rest of the file (", NUM,
                                  " bytes)")),
    Row("E-checkpoint-4", lambda: state.safe_load(write("bad.safetensors", struct.pack("<Q", 3) + b"{x}")),
        state.SafetensorsError, E(NAME, ": the header is not valid JSON: ", ANY)),
    Row("E-checkpoint-5", lambda: state.safe_load(safetensors(
        "c64.safetensors", {"a": {"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}}, bytes(8))),
        state.SafetensorsError, E(NAME, ": '", NAME, "': unknown or unsupported dtype '", NAME, "' (funcgrad reads "
                                  "F64, F32, F16, BF16, I64, I32, I16, I8, U64, U32, U16, U8, BOOL)")),
    Row("E-checkpoint-6", lambda: state.safe_load(safetensors(
        "size.safetensors", {"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8))),
        state.SafetensorsError, E(NAME, ": '", NAME, "': shape ", ANY, " of ", NAME, " needs ", NUM, " bytes but "
                                  "data_offsets ", ANY, " span ", NUM)),
    Row("E-checkpoint-7", lambda: state.safe_load(safetensors(
        "cut.safetensors", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, bytes(4))),
        state.SafetensorsError, E(NAME, ": '", NAME, "': data_offsets ", ANY, " reach past the end of the data (",
                                  NUM, " bytes after the header)")),
    Row("E-checkpoint-8", lambda: state.load_state_dict(nn.Linear(2, 3), {"weight": Tensor.ones(3, 2)}),
        state.StateDictError, E("load_state_dict: the state dict does not fit the object:\n  missing keys (in the "
                                "object, not in the state dict): [", ANY, "]")),
    Row("E-checkpoint-9", lambda: state.load_state_dict(nn.Linear(2, 3), {
        "weight": Tensor.ones(3, 2), "bias": Tensor.ones(3), "extra": Tensor.ones(1)}), state.StateDictError,
        E("load_state_dict: the state dict does not fit the object:\n  unexpected keys (in the state dict, not in "
          "the object): [", ANY, "]")),
    Row("E-checkpoint-10", lambda: state.load_state_dict(nn.Linear(2, 3), {
        "weight": Tensor.ones(2, 2), "bias": Tensor.ones(3)}), state.StateDictError,
        E("load_state_dict: the state dict does not fit the object:\n  '", NAME, "': shape mismatch, the object "
          "has ", SHAPE, ", the state dict ", SHAPE)),
    Row("E-checkpoint-11", lambda: state.load_state_dict(nn.Linear(2, 3), {
        "weight": fnp.ones((3, 2), dtype="int32"), "bias": Tensor.ones(3)}), state.StateDictError,
        E("load_state_dict: the state dict does not fit the object:\n  '", NAME, "': dtype mismatch, the object "
          "has ", NAME, ", the state dict ", NAME)),
    Row("E-checkpoint-12", lambda: state.safe_save({"w": "x"}, "w.safetensors"), TypeError,
        E("safe_save: '", NAME, "' must be a Tensor or a NumPy array, got ", NAME)),
    Row("E-checkpoint-13", lambda: state.safe_save({"w": Tensor.ones(2)}, "w.safetensors", metadata={"step": 1}),
        TypeError, E("safe_save: metadata must be a dict of str to str (safetensors allows nothing else)")),
    Row("E-checkpoint-14", lambda: state.safe_save({"w": Tensor.ones(2)}, "no/such/folder/w.safetensors"),
        FileNotFoundError, E("safe_save: the folder '", ANY, "no/such/folder' of 'no/such/folder/w.safetensors' "
                             "does not exist; create it first")),
    Row("E-checkpoint-15", lambda: state.safe_load(write("text.safetensors", b"not a safetensors file")),
        state.SafetensorsError, E(NAME, ": header length ", NUM, " exceeds the limit of 100000000 bytes (corrupt "
                                  "length field?)")),
    Row("E-checkpoint-16", _load_traced_state, state.StateDictError,
        E("state dict entry '", NAME, "' is a traced value; load concrete arrays outside jit/grad/vmap")),
    Row("E-checkpoint-17", _save_into_a_folder, IsADirectoryError,
        E("safe_save: 'checkpoints' is a folder; give a file name, e.g. 'checkpoints/model.safetensors'")),
    Row("E-checkpoint-18", _torch_zip_checkpoint, state.SafetensorsError,
        E("model.pt: this is a zip archive, as PyTorch's torch.save writes (a .pt/.pth checkpoint holding pickles), "
          "not a safetensors file; convert it once: safe_save(torch.load('model.pt'), 'model.safetensors'), or pass "
          "torch.load(path) to load_state_dict directly")),
    Row("E-checkpoint-19", lambda: state.safe_load(write("legacy.pt", b"\x80\x02\x8a\nl\xfc\x9cF\xf9 j\xa8")),
        state.SafetensorsError,
        E("legacy.pt: this is a Python pickle (PyTorch's legacy torch.save format?), not a safetensors file; funcgrad "
          "does not unpickle files; convert it once: ", ANY)),
    Row("E-checkpoint-20", lambda: state.load_state_dict(nn.Linear(2, 3), {"weight": [[0.0] * 2] * 3, "bias": ones(3)}),
        state.StateDictError,
        E("state dict entry 'weight' must be a Tensor, a NumPy array or a PyTorch tensor, got list")),
    # --- environment variables -------------------------------------------------------------------------------
    Row("E-env-1", _with_environment("BEAM", "abc", _beam_width), ValueError,
        E("BEAM='abc' (environment variable): expected a beam width (an integer; 0: no search) >= 0", ENV_DEFAULT)),
    Row("E-env-2", _with_environment("DEBUG", "abc", _debug_level), ValueError,
        E("DEBUG='abc' (environment variable): expected a level 0..4 (an integer) >= 0", ENV_DEFAULT)),
    Row("E-env-3", _with_environment("FUNCGRAD_POOL_MB", "-1", _pool_limit), ValueError,
        E("FUNCGRAD_POOL_MB='-1' (environment variable): expected a number of megabytes (0: no pool) >= 0",
          ENV_DEFAULT)),
    Row("E-env-4", _with_environment("FUNCGRAD_COMPILER_TIMEOUT", "-5", _compiler_client), ValueError,
        E("FUNCGRAD_COMPILER_TIMEOUT='-5' (environment variable): expected a number of seconds > 0", ENV_DEFAULT)),
    Row("E-env-5", _with_environment("FUNCGRAD_DEBUG_NANS", "maybe", lambda: fg.config.debug_nans), ValueError,
        E("FUNCGRAD_DEBUG_NANS='maybe' (environment variable): expected 1 or 0 (or true/false, yes/no, on/off)",
          ENV_DEFAULT)),
    Row("E-env-6", _with_environment("FUNCGRAD_CACHE_MAX_MB", "0", _disk_cache), ValueError,
        E("FUNCGRAD_CACHE_MAX_MB='0' (environment variable): expected a whole number of megabytes >= 1", ENV_DEFAULT)),
    Row("E-collective-1", lambda: fg.vmap(lambda x: lax.psum(x, "k"), axis_name="i")(ones(3)), NameError,
        E("unbound axis name: 'k' (psum: bind it with fg.vmap(f, axis_name='k') or fg.pmap(f, axis_name='k'); "
          "names bound here: 'i')")),
    Row("E-collective-2", lambda: fg.vmap(lambda x: lax.psum_scatter(x, "i"), axis_name="i")(ones(3, 4)),
        ValueError, E("psum_scatter: dimension 0 of shape (4,) must have the size 3 of axis 'i' (or pass "
                      "tiled=True), got 4")),
    Row("E-collective-3", lambda: fg.vmap(lambda x: lax.psum_scatter(x, "i", tiled=True), axis_name="i")(ones(3, 4)),
        ValueError, E("psum_scatter: dimension 0 of shape (4,) (size 4) is not a multiple of the size 3 of axis 'i'")),
    Row("E-collective-4", lambda: fg.vmap(lambda x: lax.ppermute(x, "i", [(0, 1), (2, 1)]), axis_name="i")(ones(3)),
        ValueError, E("ppermute over axis 'i' of size 3: perm ((0, 1), (2, 1)) names a destination more than once")),
    Row("E-collective-5", lambda: fg.vmap(lambda x: lax.ppermute(x, "i", [(0, 3)]), axis_name="i")(ones(3)),
        ValueError, E("ppermute over axis 'i' of size 3: perm pair (0, 3) names a rank outside 0..2")),
    Row("E-collective-6", lambda: fg.vmap(lambda x: lax.all_gather(x, "i", axis=3), axis_name="i")(ones(3, 2)),
        ValueError, E("all_gather: axis 3 is out of range for an operand of shape (2,) (the new axis counts)")),
    Row("E-collective-7", lambda: fg.vmap(fg.grad(lambda x: lax.pmax(x, "i")), axis_name="i")(ones(3)),
        NotImplementedError, E("differentiation rule for 'pmax' is not implemented (as in JAX: select the maximum "
                               "with a mask and psum it to differentiate)")),
    Row("E-collective-8", lambda: fg.shard_map(lambda g: g * 2, in_specs=fg.parallel.P("i"),
                                               out_specs=fg.parallel.P())(ones(3)),
        ValueError, E("shard_map: an output of spec P() differs between processes (it depends on a block of an "
                      "argument of spec P('i')): reduce it with a collective such as lax.psum, or give it "
                      "out_specs=P('i')")),
    Row("E-collective-9", lambda: fg.shard_map(lambda g: g, in_specs=fg.parallel.P("j"),
                                               out_specs=fg.parallel.P("j"))(ones(3)),
        NameError, E("shard_map: in_specs[0] P('j') names axis 'j'; the process mesh's axis is 'i'")),
    Row("E-collective-10", lambda: fg.vmap(fg.vmap(lambda x: lax.ppermute(x, ("i", "j"), [(0, 1)]), axis_name="j"),
                                           axis_name="i")(ones(2, 2)),
        NotImplementedError, E("ppermute over several axes ('i', 'j') is not implemented: permute over one name at "
                               "a time")),
    Row("E-env-7", _with_environment("FUNCGRAD_COMPILER", "gcc", _compiler_mode), ValueError,
        E("FUNCGRAD_COMPILER='gcc' (environment variable): expected 'worker' or 'inprocess'", ENV_DEFAULT)),
    Row("E-env-8", _with_environment("FUNCGRAD_COLLECTIVE_TIMEOUT", "soon", _collective_timeout), ValueError,
        E("FUNCGRAD_COLLECTIVE_TIMEOUT='soon' (environment variable): expected a number of seconds >= 0 (0: no "
          "timeout)", ENV_DEFAULT)),
    # --- distributed (funcgrad.distributed) ----------------------------------------------------------------
    Row("E-distributed-1", lambda: fg.distributed.initialize(num_processes=4), RuntimeError,
        E("funcgrad.distributed.initialize: num_processes=4, but the job (no launcher, engine local) has 1 process")),
    Row("E-distributed-2", lambda: fg.distributed.initialize(process_id=3), RuntimeError,
        E("funcgrad.distributed.initialize: process_id=3, but the launcher (no launcher, engine local) made this "
          "process rank 0 of 1")),
    Row("E-distributed-3", lambda: fg.distributed.initialize(coordinator_address="10.0.0.1"), ValueError,
        E("funcgrad.distributed.initialize: coordinator_address '10.0.0.1' is not 'host:port'")),
    Row("E-distributed-4", _mismatched_collective, RuntimeError,
        E("allreduce(sum) float32[4] on rank 0: ranks disagree on the collective they call "
          "(FUNCGRAD_DEBUG_COLLECTIVES=1): rank 0: allreduce(sum) float32[4] at ", NAME, ":", NUM, "; rank 1: "
          "allgather float32[3] at train.py:14; every rank must call the same collectives in the same order with the "
          "same shapes and dtypes")),
    Row("E-distributed-5", _hung_collective, TimeoutError,
        E("allreduce(sum) float32[2, 2]: not complete after 0.05 s (FUNCGRAD_COLLECTIVE_TIMEOUT) on rank 0 of 2: "
          "another rank has not called it (it failed, finished, or waits in another collective; "
          "FUNCGRAD_DEBUG_COLLECTIVES=1 names each rank's call)")),
    Row("E-distributed-6", _nccl_missing, ImportError,
        E("funcgrad.distributed.nccl: libnccl.so.2 cannot be loaded (pip install nvidia-nccl-cu12); tried "
          "libnccl.so.2 (libnccl.so.2: cannot open shared object file)")),
    # --- datasets ------------------------------------------------------------------------------------------
    Row("E-dataset-1", lambda: datasets.read_idx("missing.idx"), FileNotFoundError,
        E("[Errno 2] No such file or directory: 'missing.idx'")),
    Row("E-dataset-2", lambda: datasets.read_idx(write("short.idx", b"\0\0")), datasets.IDXError,
        E(NAME, ": too short for an IDX file (", NUM, " bytes)")),
    Row("E-dataset-3", lambda: datasets.read_idx(write("magic.idx", b"\1\2\3\4\0\0\0\0")), datasets.IDXError,
        E(NAME, ": bad magic number 0x", NAME, ": expected 0x0000 then a type code (0x08, 0x09, 0x0B, 0x0C, 0x0D, "
          "0x0E) and the number of dimensions (0x00000803 for images, 0x00000801 for labels)")),
    Row("E-dataset-4", lambda: datasets.read_idx(write("cut.idx", b"\0\0\x08\x01\0\0\0\x05abc")), datasets.IDXError,
        E(NAME, ": the header says shape ", SHAPE, " of ", NAME, " (", NUM, " bytes with the header) but the data "
          "holds ", NUM, " bytes")),
    Row("E-dataset-5", lambda: datasets.read_idx(write("broken.idx.gz", b"\x1f\x8b\x08\0garbage")),
        datasets.IDXError, E(NAME, ": damaged gzip data: ", ANY)),
    Row("E-dataset-6", _mnist_missing, datasets.DatasetNotFoundError,
        E("mnist: train-images-idx3-ubyte was not found; looked for:\n  ", ANY,
          "\n(downloads were turned off)\nTo get it: put the four files (gzipped or raw) into $FUNCGRAD_DATA/mnist/ "
          "or ", ANY)),
    Row("E-dataset-7", _mnist_damaged, datasets.DatasetError,
        E(ANY, "train-images-idx3-ubyte: the IDX contents have SHA-256 ", NAME, ", not the expected ", NAME,
          " of mnist's train-images-idx3-ubyte; the file is damaged or a different data set (delete it to fetch it "
          "again)")),
    Row("E-dataset-8", lambda: datasets.DataLoader(ones(4), batch_size=0), ValueError,
        E("DataLoader: batch_size must be a positive int, got ", ANY)),
    Row("E-dataset-9", lambda: datasets.DataLoader(ones(4), ones(5), batch_size=2), ValueError,
        E("DataLoader: every array needs the same number of rows; array 0 has ", NUM, ", array ", NUM, " has ",
          NUM)),
    Row("E-dataset-10", lambda: datasets.DataLoader(ones(4), batch_size=2, shuffle=True, key=3), TypeError,
        E("DataLoader: key must be a PRNG key made by fg.random.key(seed), got ", ANY)),
    Row("E-dataset-11", lambda: datasets.DataLoader(ones(4), batch_size=2, shard=(2, 2)), ValueError,
        E("DataLoader: shard=(", NUM, ", ", NUM, "): the index must be in 0..", NUM)),
    Row("E-dataset-12", lambda: datasets.DataLoader(ones(4), batch_size=2, shard=2), TypeError,
        E("DataLoader: shard must be (index, count), two ints such as (process_index(), process_count()), got ",
          ANY)),
    Row("E-dataset-13", lambda: datasets.DataLoader(ones(4), batch_size=2, shuffle=True, shard=(0, 2)), ValueError,
        E("DataLoader: shuffle=True with shard=(", NUM, ", ", NUM, ") needs key=fg.random.key(seed), the same on "
          "every rank, so that the shards split one order; a key drawn from the global random state may differ "
          "between processes")),
    # --- nn layers and functions ---------------------------------------------------------------------------
    Row("E-nn-1", lambda: nn.Linear(3, 4)(ones(2, 5)), ValueError,
        E("Linear(", NUM, ", ", NUM, "): expected input with last dimension ", NUM, ", got shape ", SHAPE)),
    Row("E-nn-2", lambda: nn.Conv2d(3, 4, 3)(ones(1, 2, 8, 8)), ValueError,
        E("Conv2d(", NUM, ", ", NUM, ", kernel_size=", SHAPE, "): expected input of shape (N, ", NUM, ", H, W) or (",
          NUM, ", H, W), got shape ", SHAPE)),
    Row("E-nn-3", lambda: nn.Conv2d(3, 4, 3, groups=2), ValueError,
        E("Conv2d: groups=", NUM, " must divide in_channels=", NUM, " and out_channels=", NUM)),
    Row("E-nn-4", lambda: nn.Conv2d(3, 4, 0), ValueError, E("Conv2d: kernel_size must be >= 1, got ", ANY)),
    Row("E-nn-5", lambda: nn.Conv2d(3, 4, 5)(ones(1, 3, 2, 2)), ValueError,
        E("conv2d: kernel of size ", SHAPE, " (dilated: ", SHAPE, ") is larger than the padded input of size ",
          SHAPE)),
    Row("E-nn-6", lambda: nn.BatchNorm2d(4)(ones(2, 3, 5, 5)), ValueError,
        E("BatchNorm2d(", NUM, "): expected 4-D input of shape (N, ", NUM, ", ...), got shape ", SHAPE)),
    Row("E-nn-7", lambda: nn.LayerNorm(4)(ones(2, 3)), ValueError,
        E("LayerNorm(", SHAPE, "): expected input whose last dimensions are ", SHAPE, ", got shape ", SHAPE)),
    Row("E-nn-8", lambda: nn.GroupNorm(3, 4), ValueError,
        E("GroupNorm: num_groups=", NUM, " must divide num_channels=", NUM)),
    Row("E-nn-9", lambda: nn.Embedding(5, 2)(ones(3)), TypeError,
        E("Embedding(", NUM, ", ", NUM, "): expected integer indices, got dtype ", NAME)),
    Row("E-nn-10", lambda: nn.Dropout(1.5), ValueError, E("Dropout: p must be a probability in [0, 1], got ", ANY)),
    Row("E-nn-11", lambda: nn.MaxPool2d(2)(ones(2, 3)), ValueError,
        E("MaxPool2d(kernel_size=", SHAPE, "): expected input of shape (N, C, H, W) or (C, H, W), got shape ",
          SHAPE)),
    Row("E-nn-12", lambda: nn.Sequential(3), TypeError, E("Sequential: every layer must be callable, got ", NAME)),
    Row("E-nn-13", lambda: nn.Module()(ones(2)), NotImplementedError,
        E(NAME, " defines neither forward() nor __call__(); a Module subclass must define one of them")),
    Row("E-nn-14", lambda: F.cross_entropy(ones(4, 3), fnp.array([0, 1, 2])), ValueError,
        E("cross_entropy: labels of shape ", SHAPE, " do not match logits of shape ", SHAPE, " (expected ", SHAPE,
          " with classes last)")),
    Row("E-nn-15", lambda: F.cross_entropy(ones(2, 3), fnp.array([0, 5])), IndexError,
        E("cross_entropy: label ", NUM, " is out of range for ", NUM, " classes (labels must be in [0, ", NUM,
          ") or equal ignore_index=", NUM, ")")),
    Row("E-nn-16", lambda: F.cross_entropy(ones(2, 3), fnp.array([0, 1]), reduction="avg"), ValueError,
        E("cross_entropy: reduction must be 'mean', 'sum' or 'none', got ", ANY)),
    Row("E-nn-17", lambda: F.mse(ones(3), ones(4)), ValueError,
        E("mse: input of shape ", SHAPE, " and target of shape ", SHAPE, " differ")),
    Row("E-nn-18", lambda: F.batch_norm(ones(1, 3), None, None, training=True), ValueError,
        E("batch_norm: training needs more than one value per channel, got input of shape ", SHAPE)),
    Row("E-nn-19", lambda: nn.init.kaiming_uniform((3,)), ValueError,
        E("fan in and fan out need a weight of rank >= 2, got shape ", SHAPE)),
    Row("E-nn-20", lambda: F.conv1d(ones(1, 3, 8), ones(4, 2, 3)), ValueError,
        E("conv1d: weight of shape ", SHAPE, " expects ", NUM, " input channels (groups=", NUM, "), got input of "
          "shape ", SHAPE, " with ", NUM)),
    Row("E-nn-21", lambda: F.layer_norm(ones(2, 3), None), TypeError,
        E("layer_norm: normalized_shape must be an int or a sequence of ints, got ", ANY)),
    Row("E-nn-22", lambda: F.group_norm(ones(2, 4), 3), ValueError,
        E("group_norm: num_groups=", ANY, " must divide the ", NUM, " channels (a positive int)")),
    Row("E-nn-23", lambda: nn.MaxPool2d(None), ValueError,
        E("MaxPool2d: kernel_size must be an int or a pair of ints, got ", ANY)),
    # --- optimisers and autograd ---------------------------------------------------------------------------
    Row("E-optim-1", lambda: optim.SGD([Tensor.ones(2)], lr=-1.0), ValueError,
        E(NAME, ": lr must be a float >= 0 or a schedule (step -> lr), got ", ANY)),
    Row("E-optim-2", lambda: optim.Adam([Tensor.ones(2)], b1=1.5), ValueError,
        E(NAME, ": b1 must be a number in [0, 1), got ", ANY)),
    Row("E-optim-3", lambda: optim.Adam([]), ValueError, E(NAME, ": an optimizer needs at least one parameter")),
    Row("E-optim-4", lambda: optim.Adam([np.ones(2)]), TypeError,
        E(NAME, ": optimizer parameters must be Tensors, got ", NAME)),
    Row("E-optim-5", lambda: optim.Adam([Tensor([1, 2])]), TypeError,
        E(NAME, ": parameters must be floating point, got one of dtype ", NAME)),
    Row("E-optim-6", lambda: optim.SGD([Tensor.ones(2)], nesterov=True), ValueError,
        E("SGD: Nesterov momentum needs momentum > 0")),
    Row("E-optim-7", lambda: optim.adam(1e-3).update([ones(2)], optim.adam(1e-3).init([ones(2)] * 2), [ones(2)] * 2),
        ValueError, E("optim.", NAME, ".update: grads have structure ", ANY, " but params have ", ANY)),
    Row("E-optim-8", _optimizer_state_for_other_params, ValueError,
        E("optim.", NAME, ".update: the state was made by init() for other params (a different number of leaves "
          "or other shapes); call init(params) again")),
    Row("E-optim-9", lambda: optim.adam(1e-3).update([ones(3)], optim.adam(1e-3).init([ones(2)]), [ones(2)]),
        ValueError, E("optim.", NAME, ".update: gradient ", NUM, " has shape ", SHAPE, " but its parameter has shape ",
                      SHAPE)),
    Row("E-optim-10", lambda: optim.onecycle(1, 1.0), ValueError,
        E("onecycle: needs total_steps >= 2 and 0 < pct_start < 1, got ", ANY)),
    Row("E-optim-11", lambda: optim.Adam(Tensor.ones(2)), TypeError,
        E(NAME, ": params must be a list of Tensors, got a single Tensor; pass [tensor] or "
          "nn.state.get_parameters(model)")),
    Row("E-optim-12", _step_with_wrong_grad_shape, ValueError,
        E(NAME, ".step: a parameter of shape ", SHAPE, " has a .grad of shape ", SHAPE)),
    Row("E-optim-13", lambda: optim.step_decay(1.0, 0), ValueError, E("step_decay: step_size must be > 0, got ", ANY)),
    Row("E-optim-14", lambda: nn.data_parallel.allreduce_gradients({"w": ones(3)}, op="max"), ValueError,
        E("allreduce_gradients: op must be one of 'mean', 'sum', got ", ANY)),
    Row("E-optim-15", lambda: fg.jit(nn.data_parallel.allreduce_gradients)({"w": ones(3)}), RuntimeError,
        E("allreduce_gradients: got a traced value (inside fg.jit, fg.grad or fg.vmap); the collective engine needs "
          "concrete arrays, so call it outside the transform: jit the gradient and the update as two functions and "
          "call it between them")),
    Row("E-optim-16", lambda: nn.data_parallel.broadcast_parameters(nn.Linear(2, 2), root=1), ValueError,
        E("broadcast_parameters: root ", NUM, " is not a rank of a job of ", ANY)),
    Row("E-autograd-1", lambda: (Tensor.ones(2, requires_grad=True) * 2).backward(), ValueError,
        E("backward() without a gradient needs a scalar loss, got shape ", SHAPE)),
    Row("E-autograd-2", lambda: (Tensor.ones(()) * 2).backward(), RuntimeError,
        E("backward(): no Tensor this value depends on has requires_grad=True")),
    Row("E-autograd-3", _step_after_eager_loss, RuntimeError,
        E("backward() needs the computation that produced this Tensor, but its value was already computed (by "
          ".item(), .numpy(), print, ...), which discards it; call backward() first")),
    Row("E-autograd-4", lambda: Tensor([1, 2], requires_grad=True), TypeError,
        E("requires_grad=True needs a floating-point Tensor, got dtype ", NAME, "; only floating-point values have "
          "gradients (cast with .float())")),
    Row("E-autograd-5", lambda: fg.jit(lambda x: (x * 2).sum().backward())(ones(2)), RuntimeError,
        E("backward(): no Tensor this value depends on has requires_grad=True (inside jit, pass the model and "
          "optimiser as arguments so their Tensors are traced; inside fg.grad, use what fg.grad returns)")),
    Row("E-autograd-6", _jit_reads_a_stale_grad, RuntimeError,
        E("jit(", NAME, "): the function read a .grad that was computed before this call (e.g. backward() "
          "accumulating into it), which would be frozen into the compiled step as a constant; call opt.zero_grad() "
          "before backward() inside the jitted function, or set the .grad of its arguments to None before calling "
          "it")),
    # --- tinygrad's Tensor methods ---------------------------------------------------------------------------
    Row("E-tensor-1", lambda: (ones(2) * 2).sum().gradient(ones(2)), RuntimeError,
        E("gradient(): target 0 (shape ", SHAPE, ") was not used to compute this Tensor")),
    Row("E-tensor-2", lambda: ones(4, 2).split([1, 2]), ValueError,
        E("split: sizes [1, 2] add up to 3, not dim 0's size 4")),
    Row("E-tensor-3", lambda: ones(2, 3).pad((1, 1), mode="mirror"), ValueError,
        E("pad: mode must be one of ['circular', 'constant', 'reflect', 'replicate'], got 'mirror'")),
    Row("E-tensor-4", lambda: ones(2, 3).gather(0, Tensor([0])), ValueError,
        E("gather: index must have the same rank as the Tensor (2), got shape (1,)")),
    Row("E-tensor-5", lambda: ones(2, 3).div(2, rounding_mode="round"), ValueError,
        E("div: rounding_mode must be None, 'trunc' or 'floor', got 'round'")),
    Row("E-tensor-6", lambda: ones(1, 2, 4).interpolate((3,), mode="bicubic"), ValueError,
        E("interpolate: mode 'bicubic' resizes 2 axes, got size (3,)")),
    # --- kernels -------------------------------------------------------------------------------------------
    Row("E-kernel-1", _kernel_compile_failure, KernelCompileError,
        E("kernel broken_one failed to compile: ", ANY)),
]


# --- the doc's table ----------------------------------------------------------------------------------------

class DocRow(NamedTuple):
    code: str
    exception: str
    message: str


def _cell_text(cell: str) -> str:
    """The text of a table cell written as a code span (`x` or `` x ``), with escaped pipes restored."""
    cell = cell.strip().replace("\\|", "|")
    ticks = len(cell) - len(cell.lstrip("`"))
    if ticks == 0 or not cell.endswith("`" * ticks):
        return cell
    return cell[ticks:-ticks].strip() if ticks > 1 else cell[1:-1]


@functools.cache
def doc_rows() -> dict[str, DocRow]:
    """Rows of docs/errors.md: ``| E-id | code | exception | message | what to do |``."""
    rows: dict[str, DocRow] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| E-"):
            continue
        cells = re.split(r"(?<!\\)\|", line)[1:-1]
        assert len(cells) == 5, f"docs/errors.md row needs 5 cells: {line}"
        row_id = cells[0].strip()
        assert row_id not in rows, f"docs/errors.md lists {row_id} twice"
        rows[row_id] = DocRow(_cell_text(cells[1]), _cell_text(cells[2]), _cell_text(cells[3]))
    return rows


def doc_pattern(message: str) -> str:
    """The doc's message as a regex: exact text, with … standing for any text and \\n for a line break."""
    return ".*?".join(re.escape(part.replace("\\n", "\n")) for part in message.split("…"))


def test_doc_and_test_tables_list_the_same_rows() -> None:
    documented, tested = set(doc_rows()), [row.id for row in ROWS]
    assert len(tested) == len(set(tested)), "an id appears twice in ROWS"
    assert sorted(documented - set(tested)) == [], "rows of docs/errors.md without a test"
    assert sorted(set(tested) - documented) == [], "rows of ROWS missing from docs/errors.md"


def test_every_group_has_rows() -> None:
    groups = {row.id.split("-")[1] for row in ROWS}
    assert {"shape", "index", "dtype", "axis", "tracer", "transform", "control", "tree", "random", "device",
            "checkpoint", "dataset", "nn", "optim", "autograd", "kernel"} <= groups
    assert len(ROWS) >= 60


@pytest.fixture
def in_tmp_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    return tmp_path


@pytest.mark.parametrize("row", ROWS, ids=[row.id for row in ROWS])
def test_row_raises_the_documented_error(row: Row, in_tmp_folder: Path) -> None:
    with pytest.raises(row.exception) as info:
        result = row.trigger()
        if isinstance(result, Tensor):
            result.numpy()  # errors found only when the value is computed count too
    message = str(info.value)
    assert re.fullmatch(row.pattern, message, re.DOTALL), f"{row.id}: message changed:\n{message}"
    documented = doc_rows().get(row.id)
    assert documented is not None, f"{row.id} is not in docs/errors.md"
    assert documented.exception in {cls.__name__ for cls in type(info.value).__mro__}, \
        f"{row.id}: docs/errors.md says {documented.exception}, raised {type(info.value).__name__}"
    assert re.fullmatch(doc_pattern(documented.message), message, re.DOTALL), \
        f"{row.id}: docs/errors.md's message does not match the one raised:\n{message}"
