"""Devices: where kernels run, and the registry that names them.

A device compiles a ``funcgrad.lower.kernel.Kernel`` into a callable ``compiled(inputs, outputs)``
that writes into preallocated C-contiguous arrays (see ``funcgrad.lower.device.Device``, the protocol
every device subclasses); a device with its own memory (``resident = True``) also moves buffers, so a
plan keeps its intermediates there.

The registry maps a name to a module holding the device class and an availability ``probe()``
that returns ``(ok, reason)`` without raising: a missing package, no platform or no driver is a
reason, not a crash. Modules are imported only when a device is probed or used.

    name       module                        what it runs on
    CPU        funcgrad.devices.cpu          LLVM IR compiled by llvmlite (in a worker process)
    CL         funcgrad.devices.opencl       OpenCL C through pyopencl (PoCL, a GPU, ...)
    CUDA       funcgrad.devices.cuda         CUDA C (added by its own module)
    WEBGPU     funcgrad.devices.webgpu       WGSL through wgpu (added by its own module)
    REFERENCE  funcgrad.devices.reference    the NumPy kernel evaluator, for tests

``Device.DEFAULT`` is ``$DEVICE`` when set, else the best available device (CUDA, then an OpenCL
GPU, then the CPU). ``devices()`` lists every registered device and why an unusable one is not.

>>> from funcgrad import Device
>>> Device.DEFAULT  # doctest: +SKIP
'CPU'
"""

from __future__ import annotations

import sys
import types

import importlib
import os
import threading
from collections.abc import Callable
from typing import Any

import attrs

from funcgrad.lower.device import set_optimizer_target
from funcgrad.util.config import EnvironmentVariableError

__all__ = ["Device", "DeviceInfo", "DeviceUnavailableError", "available_devices", "canonical_name", "default_device",
           "devices", "get_device", "register_device", "register_module", "set_default_device"]


class DeviceUnavailableError(ValueError):
    """A device was asked for that cannot be used here; the message lists the usable ones."""


@attrs.frozen
class DeviceInfo:
    """One registered device: whether it can be used here and, if not, why."""

    name: str
    available: bool
    reason: str

    def __str__(self) -> str:
        return f"{self.name}: {'available' if self.available else 'unavailable'} ({self.reason})"


@attrs.define
class _Entry:
    factory: Callable[[], Any]
    probe: Callable[[], tuple[bool, str]]
    priority: int  # higher wins when no DEVICE is set, among the available devices that prefer themselves
    preferred: Callable[[], bool] = lambda: True  # e.g. OpenCL only on a GPU, not on a CPU runtime


_REGISTRY: dict[str, _Entry] = {}
_INSTANCES: dict[str, Any] = {}
_PROBES: dict[str, tuple[bool, str]] = {}
_LOCK = threading.RLock()
ALIASES = {"OPENCL": "CL", "GPU": "CL", "WGPU": "WEBGPU", "LLVM": "CPU"}


def canonical_name(name: str) -> str:
    """The registry's spelling of a device name: upper case, aliases resolved, a ``:0`` index dropped."""
    if not isinstance(name, str):
        raise TypeError(f"a device is named by a string such as 'CPU' or 'CL', got {type(name).__name__}")
    upper, _, index = name.strip().upper().partition(":")
    if index not in ("", "0"):  # one device of each kind: another index must not silently mean device 0
        raise DeviceUnavailableError(f"device {name!r} is not available: funcgrad uses one device of each kind, "
                                     f"index 0 ('{upper}' or '{upper}:0'); got index {index!r}")
    return ALIASES.get(upper, upper)


def register_device(name: str, factory: Callable[[], Any], probe: Callable[[], tuple[bool, str]],
                    priority: int = 0, preferred: Callable[[], bool] = lambda: True) -> None:
    """Add (or replace) a device. ``factory()`` builds it (called once, on first use);
    ``probe()`` says whether it can run here, as ``(ok, reason)``, and must not raise. Without
    ``$DEVICE``, the available device of highest ``priority > 0`` whose ``preferred()`` holds is
    the default (else the CPU)."""
    with _LOCK:
        _REGISTRY[canonical_name(name)] = _Entry(factory, probe, priority, preferred)
        _INSTANCES.pop(canonical_name(name), None)
        _PROBES.pop(canonical_name(name), None)


def register_module(name: str, module: str, class_name: str, priority: int = 0) -> None:
    """Register a device whose class, ``probe()`` and optional ``preferred()`` live in ``module``
    (imported lazily). A module that is missing or fails to import makes the device unavailable,
    with the import error as the reason."""

    def load() -> Any:
        return importlib.import_module(module)

    def factory() -> Any:
        return getattr(load(), class_name)()

    def probe() -> tuple[bool, str]:
        try:
            loaded = load()
        except ImportError as error:
            return False, f"{module} cannot be imported: {error}"
        module_probe = getattr(loaded, "probe", None)
        return module_probe() if module_probe is not None else (True, f"{module} imports")

    def preferred() -> bool:
        module_preferred = getattr(load(), "preferred", None)
        return bool(module_preferred()) if module_preferred is not None else True

    register_device(name, factory, probe, priority, preferred)


def _probe(name: str) -> tuple[bool, str]:
    with _LOCK:
        if name not in _PROBES:
            try:
                _PROBES[name] = _REGISTRY[name].probe()
            except EnvironmentVariableError:
                raise
            except Exception as error:  # noqa: BLE001 - a probe must never take the library down
                _PROBES[name] = (False, f"probe failed: {type(error).__name__}: {error}")
        return _PROBES[name]


def devices() -> list[DeviceInfo]:
    """Every registered device, usable or not, with the reason.

    >>> [d.name for d in devices() if d.available]  # doctest: +SKIP
    ['CPU', 'CL', 'REFERENCE']
    """
    return [DeviceInfo(name, *_probe(name)) for name in _REGISTRY]


def available_devices() -> list[str]:
    """Names of the devices that can run here."""
    return [info.name for info in devices() if info.available]


def _unavailable(name: str, why: str) -> DeviceUnavailableError:
    usable = ", ".join(available_devices()) or "none"
    return DeviceUnavailableError(f"device {name!r} is not available: {why}; available devices: {usable}")


def get_device(name: str | None = None) -> Any:
    """The device object for ``name`` (the default device when None), built once and shared.

    Raises ``DeviceUnavailableError`` naming the usable devices and why ``name`` is not one.
    """
    key = Device.DEFAULT if name is None else canonical_name(name)
    with _LOCK:
        instance = _INSTANCES.get(key)
        if instance is not None:
            return instance
        if key not in _REGISTRY:
            raise _unavailable(key, f"no such device (known: {', '.join(_REGISTRY)})")
        ok, reason = _probe(key)
        if not ok:
            raise _unavailable(key, reason)
        try:
            instance = _REGISTRY[key].factory()
        except EnvironmentVariableError:
            raise  # the variable's own message says what to fix; "not available" would mislead
        except Exception as error:
            raise _unavailable(key, f"it failed to start: {type(error).__name__}: {error}") from error
        _INSTANCES[key] = instance
        return instance


class _DeviceMeta(type):
    _default: str | None = None

    @property
    def DEFAULT(cls) -> str:  # noqa: N802 - the tinygrad spelling
        """The device new Tensors are placed on: ``$DEVICE``, else the best available."""
        if cls._default is None:
            cls._default = _choose_default()
        return cls._default

    @DEFAULT.setter
    def DEFAULT(cls, name: str) -> None:  # noqa: N802
        key = canonical_name(name)
        get_device(key)  # refuse an unusable default now, with the reason
        cls._default = key


class Device(metaclass=_DeviceMeta):
    """Device names and the default: ``Device.DEFAULT`` (settable), ``Device.canonicalize(name)``."""

    @staticmethod
    def canonicalize(name: str) -> str:
        return canonical_name(name)


def default_device() -> Any:
    """The device object lazy Tensors and jit run on by default: ``Device.DEFAULT``'s."""
    return get_device(None)


def set_default_device(device: Any) -> None:
    """Make ``device`` (a registered name, or a device object, which is registered under its name) the default."""
    if not isinstance(device, str):
        instance = device
        register_device(instance.name, lambda: instance, lambda: (True, "set as the default"))
        device = instance.name
    Device.DEFAULT = device


def _choose_default() -> str:
    asked = os.environ.get("DEVICE")
    if asked:
        key = canonical_name(asked)
        try:
            get_device(key)
        except DeviceUnavailableError as error:  # say where the name came from, with the available devices
            raise DeviceUnavailableError(f"DEVICE={asked!r} (environment variable): {error}") from None
        return key
    candidates = [(entry.priority, name) for name, entry in _REGISTRY.items() if entry.priority > 0]
    for _, name in sorted(candidates, reverse=True):
        if _prefers_itself(name) and _probe(name)[0]:
            return name
    return "CPU"


def _prefers_itself(name: str) -> bool:
    """``preferred()``, asked before the probe, which may load a whole runtime (OpenCL's loads PoCL
    on a machine without a GPU); a failure is a no."""
    try:
        return bool(_REGISTRY[name].preferred())
    except Exception:  # noqa: BLE001 - an unusable device is not the default
        return False


def _reference_device() -> Any:
    from funcgrad.devices.reference import ReferenceDevice
    return ReferenceDevice()


register_module("CPU", "funcgrad.devices.cpu", "CPUDevice")
# the kernel optimiser's machine (lower cannot import a device): this CPU's, loaded on first use
set_optimizer_target(lambda: importlib.import_module("funcgrad.devices.cpu").OPTIMIZER_TARGET)
register_module("CL", "funcgrad.devices.opencl", "OpenCLDevice", priority=10)  # preferred on a GPU only
register_module("CUDA", "funcgrad.devices.cuda", "CUDADevice", priority=20)
register_module("WEBGPU", "funcgrad.devices.webgpu", "WebGPUDevice")
register_device("REFERENCE", _reference_device, lambda: (True, "NumPy kernel evaluator"))


class _CallableModule(types.ModuleType):
    """``funcgrad.devices`` is both this package (``funcgrad.devices.cpu``, ...) and, as JAX's
    ``jax.devices()``, a function: ``fg.devices()`` lists the devices."""

    def __call__(self) -> list[DeviceInfo]:
        return devices()


sys.modules[__name__].__class__ = _CallableModule
