"""Run-time options, like ``jax.config``: ``fg.config.update("debug_nans", True)``.

Each option also has an environment variable, read on every use (so a notebook or a test can
change it at run time); a value set with ``update`` or ``override`` wins over the variable.

>>> import funcgrad as fg
>>> fg.config.update("debug_nans", True); fg.config.debug_nans
True
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

# option name -> (environment variable, what it does)
OPTIONS: dict[str, tuple[str, str]] = {
    "debug_nans": ("FUNCGRAD_DEBUG_NANS", "raise FloatingPointError at the first step that produces a NaN"),
    "debug_infs": ("FUNCGRAD_DEBUG_INFS", "raise FloatingPointError at the first step that produces an inf"),
    "threefry_partitionable": ("FUNCGRAD_THREEFRY_PARTITIONABLE",
                               "random bits in JAX's default layout: element i hashes counter (0, i), one hash "
                               "per element (off: JAX's classic layout, counters split in halves); read when "
                               "a sampler is traced"),
    "debug_collectives": ("FUNCGRAD_DEBUG_COLLECTIVES",
                          "before each collective across processes, check that every rank calls the same one "
                          "with the same shapes and dtypes (one small allgather more a call); raise on every "
                          "rank naming each rank's call"),
}
DEFAULTS: dict[str, bool] = {"threefry_partitionable": True}  # the value when neither update nor the variable sets it
# the options that change what tracing produces: part of every jit cache key (JAX's trace context), so
# that a function traced under one value is traced again under the other
TRACE_OPTIONS: tuple[str, ...] = ("threefry_partitionable",)


def _environment_getter() -> Callable[[bytes], bytes | None]:
    """``get`` of the bytes dict behind ``os.environ`` on POSIX, which ``os.environ[...] = ...`` (and
    pytest's monkeypatch) keep up to date; where the layout differs, a function that asks ``os.environ``."""
    data = getattr(os.environ, "_data", None)
    encode = getattr(os.environ, "encodekey", None)
    if os.name == "posix" and isinstance(data, dict) and encode is not None and encode("DEBUG") == b"DEBUG":
        return data.get

    def get(name: bytes) -> bytes | None:
        value = os.environ.get(os.fsdecode(name))
        return None if value is None else os.fsencode(value)
    return get


environment_get = _environment_getter()
"""``environment_get(b"DEBUG")``: the variable's value as bytes, or None; read on every call, in a
fraction of ``os.environ.get``'s time (a jitted call checks three settings; docs/performance.md)."""


def env_value(variable: str) -> str | None:
    """``os.environ.get(variable)``, through ``environment_get``."""
    value = environment_get(variable.encode())
    return None if value is None else os.fsdecode(value)


class EnvironmentVariableError(ValueError):
    """An environment variable holds a value funcgrad cannot use; the message names the variable, its
    value and what it takes. Raised where the value is read, never turned into another error."""


def env_error(variable: str, text: str, expected: str, default: object) -> EnvironmentVariableError:
    return EnvironmentVariableError(f"{variable}={text!r} (environment variable): expected {expected}; "
                                    f"unset it for the default ({default})")


def env_int(variable: str, default: int, minimum: int = 0, what: str = "an integer") -> int:
    """The integer in ``variable`` (``default`` when unset or empty); below ``minimum`` or not a number raises
    ``EnvironmentVariableError``.

    >>> env_int("BEAM", 0)  # 0 unless BEAM is set
    0
    """
    text = (env_value(variable) or "").strip()
    if not text:
        return default
    try:
        value = int(text)
    except ValueError:
        value = minimum - 1
    if value < minimum:
        raise env_error(variable, text, f"{what} >= {minimum}", default)
    return value


def env_float(variable: str, default: float, what: str = "a number of seconds") -> float:
    """The positive number in ``variable`` (``default`` when unset or empty), else ``EnvironmentVariableError``."""
    text = (env_value(variable) or "").strip()
    if not text:
        return default
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value > 0 or value != value:
        raise env_error(variable, text, f"{what} > 0", default)
    return value


_FLAG_VALUES = {"": False, "0": False, "false": False, "no": False, "off": False,
                "1": True, "true": True, "yes": True, "on": True}


def _env_flag(variable: str, default: bool = False) -> bool:
    text = (env_value(variable) or "").strip()
    if not text:
        return default
    value = _FLAG_VALUES.get(text.lower())
    if value is None:
        raise env_error(variable, text, "1 or 0 (or true/false, yes/no, on/off)", "on" if default else "off")
    return value


class Config:
    """The option values: ``config.debug_nans``; set with ``update`` or, for a block, ``override``."""

    def __init__(self) -> None:
        self._set: dict[str, bool] = {}

    def _check(self, name: str) -> str:
        name = name.removeprefix("jax_")  # jax.config spells them jax_debug_nans
        if name not in OPTIONS:
            raise AttributeError(f"funcgrad has no option {name!r}; options: {', '.join(sorted(OPTIONS))}")
        return name

    def __getattr__(self, name: str) -> bool:
        if name.startswith("_"):
            raise AttributeError(name)
        name = self._check(name)
        value = self._set.get(name)
        return _env_flag(OPTIONS[name][0], DEFAULTS.get(name, False)) if value is None else value

    def trace_context(self) -> tuple[object, ...]:
        """What a jit signature key holds besides its arguments: for each of ``TRACE_OPTIONS``, the value
        set with ``update`` and the variable's raw bytes (read on every jitted call, so not parsed: a
        changed spelling of the same value only traces once more; a bad value raises where tracing reads it)."""
        # spelled out (one option today; a loop over TRACE_OPTIONS costs 5x: 0.5 us of a 7 us call), and
        # checked against TRACE_OPTIONS by tests/front/test_random.py
        return (self._set.get("threefry_partitionable"), environment_get(b"FUNCGRAD_THREEFRY_PARTITIONABLE"))

    def update(self, name: str, value: bool | None) -> None:
        """Set option ``name``; ``None`` goes back to its environment variable."""
        name = self._check(name)
        if value is None:
            self._set.pop(name, None)
        elif not isinstance(value, bool):
            raise TypeError(f"config option {name!r} takes True, False or None, got {value!r}")
        else:
            self._set[name] = value
        nonfinite_checks()

    @contextlib.contextmanager
    def override(self, **values: bool) -> Iterator[None]:
        """Set options for the body of a ``with`` block. >>> with fg.config.override(debug_nans=True): ..."""
        names = {self._check(name): value for name, value in values.items()}
        before = {name: self._set.get(name) for name in names}
        try:
            for name, value in names.items():
                self.update(name, value)
            yield
        finally:
            for name, previous in before.items():
                self.update(name, previous)

    def __repr__(self) -> str:
        return "Config(" + ", ".join(f"{name}={getattr(self, name)}" for name in OPTIONS) + ")"


config = Config()
update = config.update
override = config.override


def __getattr__(name: str) -> bool:  # fg.config.debug_nans: this module is the config object's face
    value: bool = getattr(config, name)
    return value


def nonfinite_checks() -> tuple[str, ...]:
    """What each step is checked for now: ``()``, ``("NaN",)``, ``("inf",)`` or both. Every plan run
    reads it (so the environment variables count from the next run on) and stores it in ``active``."""
    global active
    values = config._set
    nans = values.get("debug_nans")
    infs = values.get("debug_infs")
    if nans is None:
        nans = _env_flag(OPTIONS["debug_nans"][0])
    if infs is None:
        infs = _env_flag(OPTIONS["debug_infs"][0])
    active = ("NaN",) * nans + ("inf",) * infs
    return active


# the checks as last read: what ``bind`` tests per operation (an attribute read, far cheaper than an
# environment lookup per operation: docs/performance.md); refreshed by every plan run and every ``update``
active: tuple[str, ...] = ()
nonfinite_checks()
