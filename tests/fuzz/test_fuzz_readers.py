"""Fuzzing the file readers: safetensors (``nn.state.safe_load`` / ``safe_load_metadata``) and IDX
(``datasets.read_idx``, raw and gzip).

Inputs are random byte strings and valid files damaged in the ways real files get damaged or
forged: bit flips, truncation, inserted/deleted/duplicated bytes, a forged length field, and
structured header edits (a JSON field replaced by any JSON value, huge or negative sizes and
offsets; IDX magic, type code, rank and dimensions; damaged or extra gzip members).

Every reader must either return what the file says, checked by an independent parser of the
bytes (names, dtypes, shapes, and each tensor's bytes equal to the file's at its offsets, so
nothing was read from outside the file), or raise its own error (``SafetensorsError``,
``IDXError``) naming the file. Any other exception fails, as does a reader running longer than
``TIME_LIMIT_S`` (``signal.alarm``) or leaving a file descriptor open. Where the ``safetensors``
package is installed, it must accept exactly the files ``safe_load`` accepts.

``FUNCGRAD_FUZZ_EXAMPLES`` and ``FUNCGRAD_FUZZ_SEED`` as for every fuzz test (tests/fuzz/README.md).
"""

from __future__ import annotations

import contextlib
import gzip
import json
import math
import os
import signal
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from programs import fuzz

from funcgrad.datasets import IDX_DTYPES, IDXError, read_idx
from funcgrad.nn import state
from funcgrad.nn.state import SafetensorsError

TIME_LIMIT_S = 10

try:
    import safetensors.numpy as safetensors_numpy
except ImportError:  # the differential part needs the package; the rest does not
    safetensors_numpy = None


@contextlib.contextmanager
def time_limit(what: str) -> Iterator[None]:
    """Fail (TimeoutError) if the block runs longer than TIME_LIMIT_S, where SIGALRM exists."""
    if not hasattr(signal, "SIGALRM"):
        yield
        return

    def hung(signum: int, frame: Any) -> None:
        raise TimeoutError(f"{what} ran longer than {TIME_LIMIT_S} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(TIME_LIMIT_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def open_descriptors() -> int | None:
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None


def call_reader(reader: Any, path: Path, error: type[Exception]) -> Any:
    """``reader(path)``, or the ``error`` it raised (which must name the file); nothing else."""
    before = open_descriptors()
    try:
        with time_limit(f"{reader.__name__}({path.name})"):
            result = reader(path)
    except error as err:
        assert str(path) in str(err), f"the error does not name the file: {err}"
        result = err
    assert open_descriptors() == before, f"{reader.__name__} left a file descriptor open"
    return result


# --- byte-level damage, shared by both formats -------------------------------------------------------

INTERESTING_U64 = [0, 1, 7, 8, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 1]


@st.composite
def damaged(draw: Any, content: bytes) -> bytes:
    """``content`` after 1-3 random kinds of damage."""
    data = bytearray(content)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "byte", "truncate", "insert", "delete", "duplicate"]))
        position = draw(st.integers(0, len(data)))
        if kind == "flip" and data:
            index = min(position, len(data) - 1)
            data[index] ^= 1 << draw(st.integers(0, 7))
        elif kind == "byte" and data:
            data[min(position, len(data) - 1)] = draw(st.sampled_from([0, 1, 0x20, 0x22, 0x7B, 0x7F, 0x80, 0xFF]))
        elif kind == "truncate":
            del data[position:]
        elif kind == "insert":
            data[position:position] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[position:position + draw(st.integers(1, 16))]
        elif kind == "duplicate":
            data[position:position] = data[position:position + draw(st.integers(1, 16))]
    return bytes(data)


# --- safetensors ---------------------------------------------------------------------------------------

ST_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2", "I8": "i1",
             "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "u1", "BF16": "<u2"}
ITEMSIZE = {name: np.dtype(code).itemsize for name, code in ST_DTYPES.items()}


def safetensors_bytes(header: Any, data: bytes, pad: bool = True) -> bytes:
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


@st.composite
def valid_safetensors(draw: Any) -> tuple[dict[str, Any], bytes]:
    """(header, file bytes) of a valid file: 0-3 tensors of any dtype, rank 0-3, dims 0-3, metadata or not."""
    header: dict[str, Any] = {}
    if draw(st.booleans()):
        header["__metadata__"] = draw(st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=2))
    data = b""
    names = draw(st.lists(st.text(min_size=1, max_size=4).filter(lambda n: n != "__metadata__"), max_size=3,
                          unique=True))
    for name in names:
        dtype = draw(st.sampled_from(sorted(ST_DTYPES)))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        size = math.prod(shape) * ITEMSIZE[dtype]
        raw = draw(st.binary(min_size=size, max_size=size))
        if dtype == "BOOL":
            raw = bytes(b & 1 for b in raw)
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + size]}
        data += raw
    return header, safetensors_bytes(header, data)


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.sampled_from([-1, 0, 1, 3, 2**31, 2**32, 2**62, 2**63 - 1, 2**63, 2**64, 10**30])
    | st.integers() | st.floats(allow_nan=False) | st.text(max_size=6) | st.sampled_from(sorted(ST_DTYPES)),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3),
    max_leaves=6)


@st.composite
def header_edited(draw: Any, header: dict[str, Any], data: bytes) -> bytes:
    """The file with one header edit: a field of an entry (or the metadata, or the entry itself)
    replaced by any JSON value, a shape/offset made huge, an entry added or removed, or the header
    replaced; the length field is correct unless the edit is to it."""
    header = json.loads(json.dumps(header))
    names = sorted(header)
    kind = draw(st.sampled_from(["field", "entry", "huge", "empty", "add", "remove", "whole", "length", "unpadded"]))
    if kind == "field" and names:
        name = draw(st.sampled_from(names))
        if isinstance(header[name], dict) and header[name]:
            header[name][draw(st.sampled_from(sorted(header[name]) + ["extra"]))] = draw(JSON_VALUES)
    elif kind == "entry" and names:
        header[draw(st.sampled_from(names))] = draw(JSON_VALUES)
    elif kind == "huge" and names:
        entry = header[draw(st.sampled_from(names))]
        if isinstance(entry, dict) and "shape" in entry:
            big = draw(st.sampled_from(INTERESTING_U64))
            if draw(st.booleans()):
                entry["shape"] = draw(st.permutations(entry["shape"] + [big, 0]))
            else:
                entry["data_offsets"] = [entry["data_offsets"][0], big] if draw(st.booleans()) else [big, big]
    elif kind == "empty":   # a consistent empty tensor whose other dims are huge or many
        dims = [0] + ([draw(st.sampled_from(INTERESTING_U64))] if draw(st.booleans()) else [1] * 64)
        header[draw(st.text(max_size=4))] = {"dtype": draw(st.sampled_from(sorted(ST_DTYPES))),
                                             "shape": draw(st.permutations(dims)),
                                             "data_offsets": [len(data), len(data)]}
    elif kind == "add":
        header[draw(st.text(max_size=4))] = {"dtype": draw(st.sampled_from(sorted(ST_DTYPES))),
                                             "shape": draw(st.lists(st.integers(0, 3), max_size=2)),
                                             "data_offsets": sorted(draw(st.lists(st.integers(0, len(data) + 4),
                                                                                  min_size=2, max_size=2)))}
    elif kind == "remove" and names:
        del header[draw(st.sampled_from(names))]
    elif kind == "whole":
        return safetensors_bytes(draw(JSON_VALUES), data)
    elif kind == "length":
        content = bytearray(safetensors_bytes(header, data))
        content[:8] = struct.pack("<Q", draw(st.sampled_from(INTERESTING_U64 + [len(content) - 8, len(content) - 7])))
        return bytes(content)
    return safetensors_bytes(header, data, pad=kind != "unpadded")


@st.composite
def safetensors_inputs(draw: Any) -> bytes:
    kind = draw(st.sampled_from(["random", "damaged", "header", "header+damaged"]))
    if kind == "random":
        return draw(st.binary(max_size=64) | st.builds(lambda n, rest: struct.pack("<Q", n) + rest,
                                                         st.integers(0, 96), st.binary(max_size=96)))
    header, content = draw(valid_safetensors())
    if kind != "damaged":
        data = content[8 + int.from_bytes(content[:8], "little"):]
        content = draw(header_edited(header, data))
    return draw(damaged(content)) if kind != "header" else content


def parse_safetensors(content: bytes) -> tuple[dict[str, Any], bytes]:
    """(header, data section) by an independent reading of a file ``safe_load`` accepted."""
    length = int.from_bytes(content[:8], "little")
    return json.loads(content[8:8 + length]), content[8 + length:]


def check_against_the_file(loaded: dict[str, Any], content: bytes) -> None:
    header, data = parse_safetensors(content)
    metadata = header.pop("__metadata__", None) or {}
    assert list(loaded) == sorted(header, key=lambda n: header[n]["data_offsets"]), (list(loaded), header)
    for name, tensor in loaded.items():
        entry = header[name]
        begin, end = entry["data_offsets"]
        array = tensor.numpy()
        assert list(array.shape) == entry["shape"], (name, array.shape, entry)
        assert array.dtype.itemsize == ITEMSIZE[entry["dtype"]], (name, array.dtype, entry)
        assert array.astype(array.dtype.newbyteorder("<")).tobytes() == data[begin:end], name
    assert sum(tensor.numpy().nbytes for tensor in loaded.values()) == len(data)
    assert isinstance(metadata, dict)


def package_accepts(content: bytes) -> bool:
    """Whether the safetensors package loads every tensor of the file. NumPy has no bfloat16, so the
    package refuses BF16 there: BF16 entries are relabelled U16 (same size) before asking it."""
    assert safetensors_numpy is not None
    try:
        header, data = parse_safetensors(content)
        if isinstance(header, dict) and any(isinstance(v, dict) and v.get("dtype") == "BF16" for v in header.values()):
            content = content[:8] + content[8:8 + int.from_bytes(content[:8], "little")].replace(
                b'"dtype":"BF16"', b'"dtype":"U16" ') + data
    except (ValueError, UnicodeDecodeError, RecursionError):
        pass  # not JSON: the package will say so
    try:
        safetensors_numpy.load(content)
    except Exception:  # the package raises SafetensorError, TypeError or ValueError
        return False
    return True


@fuzz
@given(content=safetensors_inputs())
def test_safetensors_readers_return_the_file_or_raise_their_error(tmp_path_factory: Any, content: bytes) -> None:
    path = tmp_path_factory.mktemp("st") / "fuzz.safetensors"
    path.write_bytes(content)
    loaded = call_reader(state.safe_load, path, SafetensorsError)
    metadata = call_reader(state.safe_load_metadata, path, SafetensorsError)
    if isinstance(loaded, SafetensorsError):
        # the metadata reader validates the header only: it may accept a file whose data is bad (BOOL bytes)
        if not isinstance(metadata, SafetensorsError):
            assert "BOOL" in str(loaded), (loaded, metadata)
    else:
        assert not isinstance(metadata, SafetensorsError), metadata
        check_against_the_file(loaded, content)
        assert metadata == (parse_safetensors(content)[0].get("__metadata__") or {})
    if safetensors_numpy is not None:
        # funcgrad is stricter in one documented way: an entry with fields besides dtype, shape and
        # data_offsets is refused (the package ignores unknown fields)
        stricter = isinstance(loaded, SafetensorsError) and "exactly the fields" in str(loaded)
        if not stricter:
            accepted = not isinstance(loaded, SafetensorsError)
            assert package_accepts(content) == accepted, f"the safetensors package disagrees; funcgrad: {loaded!r}"


# --- IDX ---------------------------------------------------------------------------------------------

def idx_bytes(type_code: int, shape: tuple[int, ...], payload: bytes) -> bytes:
    return bytes([0, 0, type_code, len(shape)]) + b"".join(struct.pack(">I", d) for d in shape) + payload


@st.composite
def valid_idx(draw: Any) -> tuple[int, tuple[int, ...], bytes]:
    type_code = draw(st.sampled_from(sorted(IDX_DTYPES)))
    shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    size = math.prod(shape) * IDX_DTYPES[type_code].itemsize
    return type_code, shape, draw(st.binary(min_size=size, max_size=size))


@st.composite
def idx_inputs(draw: Any) -> bytes:
    """Raw or gzipped IDX bytes: random, damaged, or with a forged header; gzip damage and extra members."""
    kind = draw(st.sampled_from(["random", "forged", "damaged", "header", "header+damaged"]))
    if kind == "random":
        content = draw(st.binary(max_size=48))
    elif kind == "forged":   # a header whose sizes agree with the file: many dims, or empty with huge dims
        type_code = draw(st.sampled_from(sorted(IDX_DTYPES)))
        shape = tuple(draw(st.lists(st.sampled_from([0, 1, 1, 1, 2, 2**31, 2**32 - 1]), max_size=70)))
        size = math.prod(shape) * IDX_DTYPES[type_code].itemsize
        payload = bytes(size) if size <= 64 else draw(st.binary(max_size=8))
        content = bytes([0, 0, type_code, len(shape)]) + b"".join(struct.pack(">I", d) for d in shape) + payload
    else:
        type_code, shape, payload = draw(valid_idx())
        content = idx_bytes(type_code, shape, payload)
        if kind != "damaged":
            header = bytearray(content[:4 + 4 * len(shape)])
            field = draw(st.sampled_from(["magic", "type", "rank", "dim"]))
            if field == "magic":
                header[draw(st.integers(0, 1))] = draw(st.integers(1, 255))
            elif field == "type":
                header[2] = draw(st.integers(0, 255))
            elif field == "rank":
                header[3] = draw(st.sampled_from([0, 1, 2, 3, 4, 64, 255]))
            elif shape:
                index = draw(st.integers(0, len(shape) - 1))
                header[4 + 4 * index: 8 + 4 * index] = struct.pack(">I", draw(st.sampled_from(INTERESTING_U64[:7])))
            content = bytes(header) + content[len(header):]
        if kind != "header":
            content = draw(damaged(content))
    if draw(st.booleans()):
        zipped = gzip.compress(content, mtime=0)
        extra = draw(st.sampled_from(["none", "damaged", "second member", "trailing bytes", "twice"]))
        if extra == "damaged":
            zipped = draw(damaged(zipped))
        elif extra == "second member":
            zipped += gzip.compress(draw(st.binary(max_size=8)), mtime=0)
        elif extra == "trailing bytes":
            zipped += draw(st.binary(min_size=1, max_size=8))
        elif extra == "twice":
            zipped = gzip.compress(zipped, mtime=0)
        content = zipped
    return content


def check_idx_against_the_file(array: np.ndarray, content: bytes) -> None:
    if content[:2] == b"\x1f\x8b":
        content = gzip.decompress(content)
    type_code, rank = content[2], content[3]
    shape = struct.unpack(f">{rank}I", content[4:4 + 4 * rank])
    dtype = IDX_DTYPES[type_code]
    assert content[:2] == b"\0\0" and array.shape == shape and array.dtype == dtype.newbyteorder("=")
    assert array.astype(dtype).tobytes() == content[4 + 4 * rank:]


@fuzz
@given(content=idx_inputs())
def test_read_idx_returns_the_file_or_raises_idx_error(tmp_path_factory: Any, content: bytes) -> None:
    path = tmp_path_factory.mktemp("idx") / "fuzz-idx3-ubyte"
    path.write_bytes(content)
    result = call_reader(read_idx, path, IDXError)
    if not isinstance(result, IDXError):
        check_idx_against_the_file(result, content)


@pytest.mark.parametrize("compress", [False, True], ids=["raw", "gzip"])
def test_read_idx_of_a_valid_file_is_exact(tmp_path: Path, compress: bool) -> None:
    """The oracle above, on a file known to be good (so the fuzz test's accept path is exercised)."""
    content = idx_bytes(0x0C, (2, 3), np.arange(-3, 3, dtype=">i4").tobytes())
    path = tmp_path / "good-idx"
    path.write_bytes(gzip.compress(content) if compress else content)
    array = read_idx(path)
    np.testing.assert_array_equal(array, np.arange(-3, 3).reshape(2, 3))
    check_idx_against_the_file(array, path.read_bytes())
