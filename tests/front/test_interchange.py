"""Conventions users expect from an array library: NumPy's conversion protocol (read-only views,
NumPy 2's ``copy=``), DLPack both ways with NumPy and PyTorch, pickle and deepcopy of Tensors,
Modules, optimisers and TreeDefs, ``format``, ``nbytes``/``itemsize``, ``issubdtype``, reprs and
docstrings. References: NumPy, PyTorch and JAX where installed."""

from __future__ import annotations

import copy
import inspect
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, nn
from funcgrad.nn import optim
from funcgrad.nn.state import get_state_dict, load_state_dict, safe_load, safe_save

ROOT = Path(__file__).resolve().parents[2]


def _pending(tensor: Tensor) -> bool:
    return tensor._data.array is None


# --- NumPy's conversion protocol ----------------------------------------------------------------------------

def test_asarray_is_a_read_only_view_of_the_computed_array() -> None:
    t = fnp.arange(6.0).reshape(2, 3) * 2
    first, second = np.asarray(t), np.asarray(t)
    assert np.shares_memory(first, second) and not first.flags.writeable
    np.testing.assert_array_equal(first, np.arange(6.0).reshape(2, 3) * 2)
    with pytest.raises(ValueError, match="read-only"):
        first[0, 0] = 1.0
    assert np.array(t, copy=False) is not None and np.shares_memory(np.array(t, copy=False), first)


def test_numpy_2_copy_argument() -> None:
    t = fnp.ones(3) * 2
    copied = np.array(t, copy=True)
    assert copied.flags.writeable and not np.shares_memory(copied, np.asarray(t))
    copied[0] = 5  # a copy belongs to the caller; the Tensor does not change
    assert t.tolist() == [2.0, 2.0, 2.0]
    with pytest.raises(ValueError, match=r"copy=False.*float32 to float64 needs a copy"):
        np.array(t, dtype=np.float64, copy=False)
    converted = np.asarray(t, dtype=np.float64)
    assert converted.dtype == np.float64 and converted.tolist() == [2.0, 2.0, 2.0]
    assert t.numpy().flags.writeable  # .numpy() stays a writable copy


# --- DLPack -------------------------------------------------------------------------------------------------

def test_dlpack_to_and_from_numpy_shares_memory() -> None:
    t = fnp.arange(5, dtype="int32") * 3
    assert t.__dlpack_device__() == (1, 0)
    view = np.from_dlpack(t)
    assert np.shares_memory(view, np.asarray(t)) and view.tolist() == [0, 3, 6, 9, 12]
    source = np.arange(12, dtype=np.float32).reshape(3, 4)
    back = fnp.from_dlpack(source)
    assert back.dtype == np.float32 and np.shares_memory(np.asarray(back), source)
    np.testing.assert_array_equal((back * 2).numpy(), source * 2)
    strided = fnp.from_dlpack(source[:, ::2])  # not contiguous: copied, values kept
    np.testing.assert_array_equal(strided.numpy(), source[:, ::2])


def test_dlpack_with_pytorch_is_zero_copy() -> None:
    torch = pytest.importorskip("torch")
    t = fnp.linspace(0, 1, 5) * 4
    as_torch = torch.from_dlpack(t)
    assert as_torch.data_ptr() == np.asarray(t).__array_interface__["data"][0]
    np.testing.assert_array_equal(as_torch.numpy(), [0, 1, 2, 3, 4])
    source = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    back = fnp.from_dlpack(source)
    assert back.dtype == np.float64 and np.asarray(back).__array_interface__["data"][0] == source.data_ptr()
    np.testing.assert_array_equal(fnp.sum(back, axis=0).numpy(), source.sum(0).numpy())


# --- pickle and deepcopy ------------------------------------------------------------------------------------

@pytest.mark.parametrize("clone", [lambda x: pickle.loads(pickle.dumps(x)), copy.deepcopy], ids=["pickle", "deepcopy"])
def test_pending_tensors_pickle_by_value(clone) -> None:
    t = fnp.arange(4.0) * 2 + 1
    assert _pending(t)
    again = clone(t)
    assert isinstance(again, Tensor) and again.dtype == t.dtype and again.tolist() == [1.0, 3.0, 5.0, 7.0]
    leaf = Tensor([1.0, 2.0], requires_grad=True)
    assert clone(leaf).requires_grad is True
    with pytest.raises(TypeError, match="cannot pickle a traced value"):
        fg.jit(lambda x: pickle.dumps(x))(fnp.ones(2))


@pytest.mark.parametrize("clone", [lambda x: pickle.loads(pickle.dumps(x)), copy.deepcopy], ids=["pickle", "deepcopy"])
def test_modules_before_realization_copy_and_run(clone) -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    assert _pending(get_state_dict(model)["0.weight"])  # its initial values are not computed yet
    twin = clone(model)
    x = fnp.linspace(-1, 1, 6).reshape(2, 3)
    np.testing.assert_allclose(twin(x).numpy(), model(x).numpy(), rtol=0, atol=0)


def test_checkpointing_a_training_run_with_pickle_resumes_exactly() -> None:
    model = nn.Linear(3, 2)
    opt = optim.Adam(nn.state.get_parameters(model), lr=0.1)
    x, y = fnp.linspace(-1, 1, 12).reshape(4, 3), fnp.ones((4, 2))

    def step(model: nn.Linear, opt: optim.Optimizer) -> None:
        opt.zero_grad()
        loss = ((model(x) - y) ** 2).mean()
        loss.backward()
        opt.step()

    step(model, opt)
    resumed_model, resumed_opt = pickle.loads(pickle.dumps((model, opt)))
    assert resumed_opt.params[0] is resumed_model.weight  # the optimiser still updates the model it came with
    for _ in range(2):
        step(model, opt)
        step(resumed_model, resumed_opt)
    assert resumed_opt.steps == opt.steps == 3
    np.testing.assert_array_equal(resumed_model.weight.numpy(), model.weight.numpy())


def test_functional_optimizer_state_and_treedefs_pickle() -> None:
    params = {"w": fnp.ones(3), "b": [fnp.zeros(2)]}
    adam = optim.adam(1e-2)
    state = adam.init(params)
    grads = fg.tree.map(lambda p: p + 1, params)
    _, state = adam.update(grads, state, params)
    loaded_adam, loaded_state = pickle.loads(pickle.dumps((adam, state)))
    new_a, _ = adam.update(grads, state, params)
    new_b, _ = loaded_adam.update(grads, loaded_state, params)
    for a, b in zip(fg.tree.leaves(new_a), fg.tree.leaves(new_b)):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
    treedef = fg.tree.structure({"a": [1, (2, None)], "b": nn.Linear(2, 2)})
    assert pickle.loads(pickle.dumps(treedef)) == treedef and copy.deepcopy(treedef) == treedef


# --- formatting, sizes, dtypes, reprs -----------------------------------------------------------------------

def test_format_of_a_scalar_tensor_is_the_number_formatted() -> None:
    loss = fnp.sum(fnp.ones(3)) / 7
    assert f"{loss:.3f}" == f"{3 / 7:.3f}" and f"{loss:8.2e}" == f"{np.float32(3 / 7):8.2e}"
    assert f"{fnp.array(5):04d}" == "0005" and f"{loss}" == str(loss)
    with pytest.raises(TypeError, match=r"format spec '.3f' needs a Tensor with one element.*shape \(2,\)"):
        f"{fnp.ones(2):.3f}"


@pytest.mark.parametrize("dtype", ["bool", "int8", "uint16", "int32", "int64", "float16", "bfloat16", "float32",
                                   "float64"])
def test_nbytes_and_itemsize_match_numpy(dtype: str) -> None:
    t = fnp.zeros((3, 5), dtype=dtype) + 0
    sizes = (t.itemsize, t.nbytes)
    assert _pending(t)  # the sizes come from the shape: nothing was computed
    reference = np.asarray(t)
    assert sizes == (reference.itemsize, reference.nbytes)


def test_issubdtype_matches_numpy_and_jax() -> None:
    kinds = [np.generic, np.number, np.integer, np.signedinteger, np.unsignedinteger, np.inexact, np.floating,
             np.bool_, np.float32, np.int32]
    names = ["bool", "int8", "int32", "uint8", "uint32", "float16", "float32", "float64"]
    for name in names:
        for kind in kinds:
            assert fnp.issubdtype(name, kind) == np.issubdtype(np.dtype(name), kind), (name, kind)
    jnp = pytest.importorskip("jax.numpy")
    for kind in kinds:
        assert fnp.issubdtype(fnp.bfloat16, kind) == jnp.issubdtype(jnp.bfloat16, kind), kind
    assert fnp.issubdtype(fnp.bfloat16, fnp.bfloat16)


def test_optimizer_and_jit_reprs() -> None:
    opt = optim.Adam(nn.state.get_parameters(nn.Linear(3, 2)), lr=0.01)
    assert repr(opt) == ("Adam(2 parameters, 8 values, lr=0.01, steps=0, AdamRule(b1=0.9, b2=0.999, eps=1e-08, "
                         "weight_decay=0.0, decoupled=False))")

    def scale(x, k):
        return x * k

    jitted = fg.jit(scale, static_argnums=1)
    assert repr(jitted) == "jit(scale, static_argnums=(1,), traced 0 times)"
    jitted(fnp.ones(2), 3)
    assert repr(jitted) == "jit(scale, static_argnums=(1,), traced 1 time)"


def test_module_markdown_display_lists_parameters_without_computing_them() -> None:
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    text = model._repr_markdown_()
    assert text.startswith("**Sequential**: 26 values in 4 arrays (26 trainable)")
    assert "| `0.weight` | (4, 3) | float32 | 12 |" in text and "| `1.bias` | (2,) | float32 | 2 |" in text
    assert repr(model) in text
    assert _pending(get_state_dict(model)["0.weight"])


def test_every_public_numpy_function_has_a_docstring() -> None:
    missing = [name for name, value in vars(fnp).items()
               if not name.startswith("_") and callable(value) and not inspect.isclass(value)
               and not isinstance(value, np.dtype) and not (value.__doc__ or "").strip()]
    assert missing == []


# --- PyTorch checkpoints ------------------------------------------------------------------------------------

def test_load_a_pytorch_state_dict_and_convert_it(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    reference = torch.nn.Linear(3, 2)
    path = tmp_path / "model.pt"
    torch.save(reference.state_dict(), path)
    model = nn.Linear(3, 2)
    load_state_dict(model, torch.load(path))
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    np.testing.assert_allclose(model(fnp.asarray(x)).numpy(), reference(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="PyTorch's torch.save writes"):
        safe_load(path)
    safe_save(torch.load(path), tmp_path / "model.safetensors")  # the conversion the message suggests
    loaded = safe_load(tmp_path / "model.safetensors")
    np.testing.assert_array_equal(loaded["weight"].numpy(), reference.weight.detach().numpy())
    half = {"w": torch.ones(2, dtype=torch.bfloat16) * 1.5}
    safe_save(half, tmp_path / "half.safetensors")
    assert safe_load(tmp_path / "half.safetensors")["w"].dtype == fnp.bfloat16


def test_a_device_failing_on_its_environment_raises_the_variables_error() -> None:
    from funcgrad import devices
    from funcgrad.util.config import EnvironmentVariableError, env_error

    def start() -> None:
        raise env_error("FUNCGRAD_FAKE", "x", "a number", 1)

    devices.register_device("FAKE_ENV", start, lambda: (True, "a test device"))
    try:
        with pytest.raises(EnvironmentVariableError, match=r"^FUNCGRAD_FAKE='x' \(environment variable\): expected a "
                                                           r"number; unset it for the default \(1\)$"):
            devices.get_device("FAKE_ENV")
    finally:
        devices._REGISTRY.pop("FAKE_ENV", None)
        devices._PROBES.pop("FAKE_ENV", None)


def test_bad_environment_is_not_reported_as_a_missing_device() -> None:
    variable = "FUNCGRAD_COMPILER"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "HOME": str(Path.home()), variable: "gcc"}
    run = subprocess.run([sys.executable, "-c", "import funcgrad.numpy as fnp; (fnp.ones(3) * 2).numpy()"],
                         env=env, capture_output=True, text=True, timeout=120)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1 and last.startswith(f"funcgrad.util.config.EnvironmentVariableError: {variable}="), \
        run.stderr
    assert "not available" not in run.stderr


def test_copies_of_a_jitted_function_are_the_function_itself():
    # copy.deepcopy of a Module or dict that holds a jitted function must work, as it does for a plain
    # function (which deepcopy returns as is); only pickling is refused
    f = fg.jit(lambda x: x * 2)
    holder = {"step": f, "w": fnp.ones(3)}
    clone = copy.deepcopy(holder)
    assert clone["step"] is f and copy.copy(f) is f
    np.testing.assert_array_equal(np.asarray(clone["step"](clone["w"])), np.full(3, 2.0, np.float32))
