"""Model state: parameters and state dicts of any pytree, saved and loaded as safetensors files.

A state dict maps dotted names to Tensors, taken from the paths of ``funcgrad.tree.leaves_with_path``:
attributes and dict keys as they are, list indices as numbers (``"layers.0.weight"``). So it works
on every pytree: dicts and lists of Tensors, dataclasses, Modules, optimiser states.
``load_state_dict`` swaps the loaded values into the model's own Tensor objects, so an optimiser
holding them sees the new values.

Files use the safetensors format: an 8-byte little-endian header length N, N bytes of JSON
(``{"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, "__metadata__": {...}}``),
then the raw little-endian data, each tensor's bytes at its offsets, packed with no gaps. Reading
checks the whole header against the file size before it reads any data (funcgrad's stricter checks
and messages); then the ``safetensors`` package reads the data. Nothing is unpickled or executed.
Writing (funcgrad's own: see docs/architecture.md for why) goes to a temporary file in the same
folder that replaces the target only once it is complete and synced, so a crash leaves the old
file or the new one, never a torn one.

>>> safe_save(get_state_dict(model), "model.safetensors")          # doctest: +SKIP
>>> load_state_dict(model, safe_load("model.safetensors"))          # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import safetensors

from funcgrad.core.tensor import Tensor, tensor_from_host
from funcgrad.ir import dtypes
from funcgrad.util import tree

__all__ = ["SafetensorsError", "StateDictError", "get_parameters", "get_state_dict", "load_state_dict",
           "safe_load", "safe_load_metadata", "safe_save"]

PathLike = str | os.PathLike

# safetensors dtype names and the NumPy dtypes they hold (all little-endian on disk)
SAFETENSORS_DTYPES: dict[str, np.dtype] = {
    "F64": dtypes.float64, "F32": dtypes.float32, "F16": dtypes.float16, "BF16": dtypes.bfloat16,
    "I64": dtypes.int64, "I32": dtypes.int32, "I16": dtypes.int16, "I8": dtypes.int8,
    "U64": dtypes.uint64, "U32": dtypes.uint32, "U16": dtypes.uint16, "U8": dtypes.uint8,
    "BOOL": dtypes.bool_,
}
_NAME_OF_DTYPE = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}
# the safetensors library's own limit; a larger header is treated as a corrupt length field
MAX_HEADER_BYTES = 100_000_000


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file (or one funcgrad cannot represent)."""


class StateDictError(ValueError):
    """A state dict that does not fit the object it is loaded into."""


# --- state dicts ---------------------------------------------------------------------------------

def _dotted_name(path: tree.KeyPath) -> str:
    return ".".join(str(entry.key) for entry in path)


def get_state_dict(obj: Any) -> dict[str, Tensor]:
    """Every Tensor leaf of the pytree ``obj`` under its dotted path; other leaves are skipped.

    >>> sorted(get_state_dict({"layers": [{"w": Tensor([1.0])}], "b": Tensor(0.0)}))
    ['b', 'layers.0.w']
    """
    state: dict[str, Tensor] = {}
    for path, leaf in tree.leaves_with_path(obj):
        if not isinstance(leaf, Tensor):
            continue
        name = _dotted_name(path)
        if name in state:
            raise StateDictError(f"two leaves have the same state-dict name {name!r} (at "
                                 f"{tree.keystr(path)} and an earlier path); rename a dict key or attribute")
        state[name] = leaf
    return state


def get_parameters(obj: Any) -> list[Tensor]:
    """The Tensor leaves of ``obj`` in flatten order, each Tensor object once (tied weights once).

    >>> w = Tensor([1.0]); len(get_parameters({"a": w, "b": w}))
    1
    """
    seen: set[int] = set()
    params: list[Tensor] = []
    for leaf in tree.leaves(obj):
        if isinstance(leaf, Tensor) and id(leaf) not in seen:
            seen.add(id(leaf))
            params.append(leaf)
    return params


def _as_tensor(name: str, value: Any) -> Tensor:
    if isinstance(value, Tensor):
        if value.is_traced:
            raise StateDictError(f"state dict entry {name!r} is a traced value; load concrete arrays "
                                 "outside jit/grad/vmap")
        return value
    if isinstance(value, np.ndarray):
        return Tensor(value, dtype=value.dtype)
    torch_array = _from_torch(value)
    if torch_array is not None:
        return Tensor(torch_array, dtype=torch_array.dtype)
    raise StateDictError(f"state dict entry {name!r} must be a Tensor, a NumPy array or a PyTorch tensor, "
                         f"got {type(value).__name__}")


def _from_torch(value: Any) -> np.ndarray | None:
    """A PyTorch tensor's values as a NumPy array (None for anything else); torch is not imported."""
    if not type(value).__module__.startswith("torch") or not hasattr(value, "detach"):
        return None
    value = value.detach().cpu()
    if str(value.dtype) == "torch.bfloat16":  # NumPy has no bfloat16: move the bits
        import torch  # here only: a PyTorch tensor was given, so torch is installed
        return value.contiguous().view(torch.int16).numpy().view(dtypes.bfloat16)
    return np.asarray(value.numpy())


def load_state_dict(obj: Any, state_dict: Mapping[str, Any], strict: bool = True) -> None:
    """Put the values of ``state_dict`` into the Tensors of ``obj``, in place (the Tensor objects
    stay, so optimisers and other references see the new values).

    With ``strict`` (the default) the names must match exactly; the error lists the missing and the
    unexpected names. ``strict=False`` skips both. A shape or dtype that differs is always an error.
    Everything is checked before anything is assigned, so a failed load changes nothing.

    >>> load_state_dict(model, safe_load("model.safetensors"))      # doctest: +SKIP
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"load_state_dict: state_dict must be a mapping of names to arrays, "
                        f"got {type(state_dict).__name__}")
    targets = get_state_dict(obj)
    problems: list[str] = []
    if strict:
        missing = [name for name in targets if name not in state_dict]
        unexpected = [name for name in state_dict if name not in targets]
        if missing:
            problems.append(f"missing keys (in the object, not in the state dict): {missing}")
        if unexpected:
            problems.append(f"unexpected keys (in the state dict, not in the object): {unexpected}")
    assignments: list[tuple[Tensor, Tensor]] = []
    for name, target in targets.items():
        if name not in state_dict:
            continue
        value = _as_tensor(name, state_dict[name])
        if target.is_traced:
            problems.append(f"{name!r}: the object's Tensor is a traced value; load outside jit/grad/vmap")
        elif value.shape != target.shape:
            problems.append(f"{name!r}: shape mismatch, the object has {target.shape}, the state dict {value.shape}")
        elif value.dtype != target.dtype:
            problems.append(f"{name!r}: dtype mismatch, the object has {target.dtype.name}, "
                            f"the state dict {value.dtype.name}")
        else:
            assignments.append((target, value))
    if problems:
        raise StateDictError("load_state_dict: the state dict does not fit the object:\n  " + "\n  ".join(problems))
    for target, value in assignments:
        target._data = value._data  # swap the value in; the Tensor object stays


# --- writing -------------------------------------------------------------------------------------

def _host_array(name: str, value: Any) -> np.ndarray:
    if isinstance(value, Tensor):
        array = np.asarray(value)  # the computed array itself (read-only), not a copy
    elif isinstance(value, np.ndarray):
        array = value
    elif (torch_array := _from_torch(value)) is not None:
        array = torch_array
    else:
        raise TypeError(f"safe_save: {name!r} must be a Tensor or a NumPy array, got {type(value).__name__}")
    base = array.dtype.newbyteorder("=")
    if base not in _NAME_OF_DTYPE:
        raise TypeError(f"safe_save: {name!r} has dtype {array.dtype}, which safetensors cannot hold here; "
                        f"supported: {', '.join(dt.name for dt in _NAME_OF_DTYPE)}")
    if base == dtypes.bool_:  # a NumPy bool can hold any byte; safetensors readers expect 0 or 1
        return np.asarray(np.asarray(array, order="C").view(np.uint8) != 0)  # (a 0-d comparison gives a scalar)
    return np.asarray(array, dtype=base.newbyteorder("<"), order="C")


def _check_metadata(metadata: Mapping[str, str] | None) -> dict[str, str] | None:
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                    for k, v in metadata.items()):
        raise TypeError("safe_save: metadata must be a dict of str to str (safetensors allows nothing else)")
    return dict(metadata)


def _encode(state_dict: Mapping[str, Any], metadata: Mapping[str, str] | None) -> tuple[bytes, list[np.ndarray]]:
    """The header bytes (length prefix, JSON padded to 8 bytes) and the arrays in file order."""
    if not isinstance(state_dict, Mapping):
        raise TypeError(f"safe_save: state_dict must be a dict of names to Tensors, got {type(state_dict).__name__}")
    arrays: dict[str, np.ndarray] = {}
    for name, value in state_dict.items():
        if not isinstance(name, str):
            raise TypeError(f"safe_save: names must be strings, got {name!r}")
        if name == "__metadata__":
            raise ValueError("safe_save: '__metadata__' is reserved for the metadata; rename that entry")
        arrays[name] = _host_array(name, value)
    # widest items first (then by name), as the safetensors library does, so each tensor's
    # bytes start at a multiple of its item size
    order = sorted(arrays, key=lambda n: (-arrays[n].dtype.itemsize, n))
    header: dict[str, Any] = {}
    checked = _check_metadata(metadata)
    if checked is not None:
        header["__metadata__"] = checked
    offset = 0
    for name in order:
        array = arrays[name]
        header[name] = {"dtype": _NAME_OF_DTYPE[array.dtype.newbyteorder("=")], "shape": list(array.shape),
                        "data_offsets": [offset, offset + array.nbytes]}
        offset += array.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text, [arrays[name] for name in order]


def safe_save(state_dict: Mapping[str, Any], path: PathLike, metadata: Mapping[str, str] | None = None) -> None:
    """Write ``state_dict`` (names to Tensors or NumPy arrays) as a safetensors file, atomically.

    ``metadata`` is an optional dict of str to str stored in the header (``safe_load_metadata``).

    >>> safe_save({"w": Tensor([1.0, 2.0])}, "w.safetensors", metadata={"step": "10"})   # doctest: +SKIP
    """
    header, arrays = _encode(state_dict, metadata)
    path = os.fspath(path)
    if os.path.isdir(path):  # else os.replace's error would name the temporary file
        raise IsADirectoryError(f"safe_save: {path!r} is a folder; give a file name, e.g. "
                                f"{os.path.join(path, 'model.safetensors')!r}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):  # else mkstemp's error would name a temporary file the user never chose
        raise FileNotFoundError(f"safe_save: the folder {folder!r} of {path!r} does not exist; create it first")
    fd, temp_path = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(header)
            for array in arrays:
                file.write(array.reshape(-1).view(np.uint8).data)
            file.flush()
            os.fsync(file.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temp_path, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual permissions
        os.replace(temp_path, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_path)
        raise
    _sync_folder(folder)


def _sync_folder(folder: str) -> None:
    """Make the rename itself durable (where the platform lets a folder be opened and synced)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# --- reading -------------------------------------------------------------------------------------

class _Entry:
    __slots__ = ("name", "dtype", "shape", "begin", "end")

    def __init__(self, name: str, dtype: np.dtype, shape: tuple[int, ...], begin: int, end: int) -> None:
        self.name, self.dtype, self.shape, self.begin, self.end = name, dtype, shape, begin, end


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise SafetensorsError(f"the key {key!r} appears twice")
        if not _is_unicode(key):
            raise SafetensorsError(f"the key {key!r} is not valid Unicode (a lone UTF-16 surrogate escape)")
        result[key] = value
    return result


def _is_unicode(text: str) -> bool:
    """False for a str holding a lone surrogate (JSON allows the escape; UTF-8 and the package do not)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _reject_constant(name: str) -> Any:
    raise SafetensorsError(f"the non-standard JSON constant {name} is not allowed")


def _parse_header(text: bytes, data_size: int, where: str) -> tuple[list[_Entry], dict[str, str]]:
    """Validate the JSON header against the data section's size; return the entries in file order."""
    def fail(problem: str) -> SafetensorsError:
        return SafetensorsError(f"{where}: {problem}")

    try:
        header = json.loads(text.decode("utf-8"), object_pairs_hook=_no_duplicate_keys,
                            parse_constant=_reject_constant)
    except SafetensorsError as err:
        raise fail(f"bad JSON header: {err}") from None
    except UnicodeDecodeError as err:
        raise fail(f"the header is not UTF-8 text: {err}") from None
    except (ValueError, RecursionError) as err:
        raise fail(f"the header is not valid JSON: {err}") from None
    if not isinstance(header, dict):
        raise fail(f"the header must be a JSON object, got {type(header).__name__}")
    metadata = header.pop("__metadata__", None)
    if metadata is None:
        metadata = {}
    elif not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise fail("'__metadata__' must be an object of strings to strings")
    elif not all(_is_unicode(v) for v in metadata.values()):
        raise fail("'__metadata__' holds a string that is not valid Unicode (a lone UTF-16 surrogate escape)")
    entries: list[_Entry] = []
    for name, info in header.items():
        if not isinstance(info, dict):
            raise fail(f"the entry for {name!r} must be an object, got {type(info).__name__}")
        if set(info) != {"dtype", "shape", "data_offsets"}:
            raise fail(f"the entry for {name!r} must have exactly the fields dtype, shape, data_offsets; "
                       f"it has {sorted(info)}")
        dtype_name, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if not isinstance(dtype_name, str):
            raise fail(f"{name!r}: dtype must be a string, got {dtype_name!r}")
        if dtype_name not in SAFETENSORS_DTYPES:
            raise fail(f"{name!r}: unknown or unsupported dtype {dtype_name!r} (funcgrad reads "
                       f"{', '.join(SAFETENSORS_DTYPES)})")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise fail(f"{name!r}: shape must be a list of non-negative integers, got {shape!r}")
        if (not isinstance(offsets, list) or len(offsets) != 2 or not all(_is_int(o) for o in offsets)
                or not 0 <= offsets[0] <= offsets[1]):
            raise fail(f"{name!r}: data_offsets must be [begin, end] with 0 <= begin <= end, got {offsets!r}")
        dtype = SAFETENSORS_DTYPES[dtype_name]
        # an empty tensor may have any other dims and pass the size checks, but NumPy cannot hold it
        if len(shape) > 64 or math.prod(d for d in shape if d) * dtype.itemsize > sys.maxsize:
            raise fail(f"{name!r}: shape {shape} of {dtype_name} is too large for an array (at most 64 "
                       f"dimensions and {sys.maxsize} bytes, not counting zero-sized dims)")
        nbytes = math.prod(shape) * dtype.itemsize
        if offsets[1] - offsets[0] != nbytes:
            raise fail(f"{name!r}: shape {shape} of {dtype_name} needs {nbytes} bytes but data_offsets "
                       f"{offsets} span {offsets[1] - offsets[0]}")
        if offsets[1] > data_size:
            raise fail(f"{name!r}: data_offsets {offsets} reach past the end of the data "
                       f"({data_size} bytes after the header)")
        entries.append(_Entry(name, dtype, tuple(shape), offsets[0], offsets[1]))
    entries.sort(key=lambda e: (e.begin, e.end))
    position = 0
    for entry in entries:
        if entry.begin < position:
            raise fail(f"{entry.name!r}: data_offsets [{entry.begin}, {entry.end}] overlap the previous tensor's "
                       f"(which ends at {position})")
        if entry.begin > position:
            raise fail(f"{entry.name!r}: data_offsets start at {entry.begin}, leaving a gap after byte {position}")
        position = entry.end
    if position != data_size:
        raise fail(f"the header covers {position} bytes of data but the file holds {data_size} after the header")
    return entries, metadata


def _read_header(file: Any, path: str) -> tuple[list[_Entry], dict[str, str], int]:
    """(entries, metadata, data start) of an open file, validated against its size."""
    size = os.fstat(file.fileno()).st_size
    if size < 8:
        raise SafetensorsError(f"{path}: too short for a safetensors file ({size} bytes; the header length "
                               "alone takes 8)")
    first = file.read(8)
    header_length = int.from_bytes(first, "little")
    if header_length > min(MAX_HEADER_BYTES, size - 8):
        _reject_other_formats(first, path)
    if header_length > MAX_HEADER_BYTES:
        raise SafetensorsError(f"{path}: header length {header_length} exceeds the limit of {MAX_HEADER_BYTES} "
                               "bytes (corrupt length field?)")
    if header_length > size - 8:
        raise SafetensorsError(f"{path}: header length {header_length} is larger than the rest of the file "
                               f"({size - 8} bytes)")
    text = file.read(header_length)
    if len(text) != header_length:
        raise SafetensorsError(f"{path}: the file ended inside the header")
    entries, metadata = _parse_header(text, size - 8 - header_length, path)
    return entries, metadata, 8 + header_length


def _reject_other_formats(first: bytes, path: str) -> None:
    """A file whose header length is impossible: say what it is when it is a format we know."""
    convert = (f"; convert it once: safe_save(torch.load({path!r}), 'model.safetensors'), or pass "
               "torch.load(path) to load_state_dict directly")
    if first.startswith(b"PK\x03\x04"):
        raise SafetensorsError(f"{path}: this is a zip archive, as PyTorch's torch.save writes (a .pt/.pth "
                               f"checkpoint holding pickles), not a safetensors file{convert}")
    if first[:1] == b"\x80" and first[1:2] in (b"\x02", b"\x03", b"\x04", b"\x05"):
        raise SafetensorsError(f"{path}: this is a Python pickle (PyTorch's legacy torch.save format?), not a "
                               f"safetensors file; funcgrad does not unpickle files{convert}")


def safe_load_metadata(path: PathLike) -> dict[str, str]:
    """The ``__metadata__`` of a safetensors file ({} when it has none); the header is validated.

    >>> safe_load_metadata("w.safetensors")          # doctest: +SKIP
    {'step': '10'}
    """
    path = os.fspath(path)
    with open(path, "rb") as file:
        return _read_header(file, path)[1]


def safe_load(path: PathLike) -> dict[str, Tensor]:
    """Read a safetensors file into ``{name: Tensor}`` (names in file order). The header is
    checked in full before any data is read; a bad file raises ``SafetensorsError``.

    >>> safe_load("w.safetensors")["w"].tolist()     # doctest: +SKIP
    [1.0, 2.0]
    """
    path = os.fspath(path)
    with open(path, "rb") as file:
        entries, _, _ = _read_header(file, path)  # funcgrad's checks and messages first, on the whole header
    result: dict[str, Tensor] = {}
    try:  # then the safetensors package reads the data (memory-mapped; each array a fresh copy we own)
        with safetensors.safe_open(path, framework="np") as opened:
            arrays = {entry.name: opened.get_tensor(entry.name) for entry in entries}
    except Exception as error:  # noqa: BLE001 - e.g. the file changed after the header was checked
        raise SafetensorsError(f"{path}: {error}") from error
    for entry in entries:
        array = np.require(arrays[entry.name], entry.dtype, "C")
        if entry.dtype == dtypes.bool_ and array.view(np.uint8).max(initial=0) > 1:
            raise SafetensorsError(f"{path}: {entry.name!r} is BOOL but holds bytes other than 0 and 1")
        result[entry.name] = tensor_from_host(array.reshape(entry.shape))
    return result
