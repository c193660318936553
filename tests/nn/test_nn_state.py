"""nn.state: state dicts of pytrees, load_state_dict, and safetensors files checked against the
safetensors package and PyTorch, a catalogue of corrupt files, and saves killed mid-write."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import ml_dtypes
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import funcgrad as fg
from funcgrad.nn import state
from funcgrad.nn.state import SafetensorsError, StateDictError

# every safetensors dtype funcgrad holds, with a sample that uses the dtype's range
SAMPLES = {
    "F64": np.array([[1.5, -2.25e300], [np.inf, -0.0]], np.float64),
    "F32": np.array([1.0, -3.4e38, np.nan, 1e-45], np.float32),
    "F16": np.array([65504.0, -0.5, 6e-8], np.float16),
    "BF16": np.array([1.0, -3.0e38, 0.0078125], ml_dtypes.bfloat16),
    "I64": np.array([-2**63, 2**63 - 1, 0], np.int64),
    "I32": np.array([[-2**31], [2**31 - 1]], np.int32),
    "I16": np.array([-32768, 32767], np.int16),
    "I8": np.array([-128, 127, 0], np.int8),
    "U8": np.arange(256, dtype=np.uint8).reshape(16, 16),
    "U16": np.array([0, 65535], np.uint16),
    "U32": np.array([0, 2**32 - 1], np.uint32),
    "U64": np.array([0, 2**64 - 1], np.uint64),
    "BOOL": np.array([[True, False, True]]),
}


def as_tensors(arrays: dict[str, np.ndarray]) -> dict[str, fg.Tensor]:
    return {name: fg.Tensor(a, dtype=a.dtype) for name, a in arrays.items()}


def assert_same(actual: dict, expected: dict) -> None:
    assert sorted(actual) == sorted(expected)
    for name, value in expected.items():
        got = actual[name].numpy() if isinstance(actual[name], fg.Tensor) else np.asarray(actual[name])
        want = value.numpy() if isinstance(value, fg.Tensor) else np.asarray(value)
        assert got.dtype == want.dtype, (name, got.dtype, want.dtype)
        assert got.shape == want.shape, (name, got.shape, want.shape)
        assert got.tobytes() == want.tobytes(), name  # bit for bit, NaNs and signed zeros included


# --- state dicts -----------------------------------------------------------------------------------

@dataclasses.dataclass
class Block:
    weight: fg.Tensor
    bias: fg.Tensor
    name: str = dataclasses.field(default="block", metadata={"static": True})


def make_tree() -> dict:
    return {"layers": [Block(fg.Tensor(np.ones((2, 3), np.float32)), fg.Tensor(np.zeros(2, np.float32))),
                       Block(fg.Tensor(np.ones((1, 2), np.float32)), fg.Tensor(np.zeros(1, np.float32)))],
            "scale": fg.Tensor(2.0), "steps": 3}


def test_state_dict_names_follow_attributes_indices_and_keys():
    tree = make_tree()
    sd = state.get_state_dict(tree)
    assert list(sd) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "layers.1.bias", "scale"]
    assert sd["layers.1.weight"] is tree["layers"][1].weight  # the model's own Tensors, not copies


def test_state_dict_keeps_dict_keys_as_they_are():
    # (keys of one type per dict: a dict mixing int and str keys cannot be flattened, as in JAX)
    sd = state.get_state_dict({"enc": {"W_q": fg.Tensor([1.0])}, "layers": {3: fg.Tensor([2.0])}})
    assert set(sd) == {"enc.W_q", "layers.3"}


def test_state_dict_name_collision_is_an_error():
    with pytest.raises(StateDictError, match="'a.b'"):
        state.get_state_dict({"a": {"b": fg.Tensor([1.0])}, "a.b": fg.Tensor([2.0])})


def test_get_parameters_lists_each_tensor_once():
    w = fg.Tensor([1.0, 2.0])
    b = fg.Tensor([0.0])
    params = state.get_parameters({"enc": w, "dec": w, "bias": b, "n": 4})
    assert len(params) == 2 and any(p is w for p in params) and any(p is b for p in params)


def test_load_state_dict_assigns_in_place():
    tree = make_tree()
    weight = tree["layers"][0].weight
    new = {name: fg.Tensor(np.full(t.shape, 7.0, np.float32)) for name, t in state.get_state_dict(tree).items()}
    state.load_state_dict(tree, new)
    assert tree["layers"][0].weight is weight  # same object, new value
    np.testing.assert_array_equal(weight.numpy(), np.full((2, 3), 7.0, np.float32))
    np.testing.assert_array_equal(tree["scale"].numpy(), np.float32(7.0))


def test_load_state_dict_updates_what_an_optimiser_holds():
    w = fg.Tensor(np.ones(3, np.float32), requires_grad=True)
    model = {"w": w}
    opt = fg.nn.optim.SGD([w], lr=1.0)
    state.load_state_dict(model, {"w": np.array([5.0, 5.0, 5.0], np.float32)})
    (model["w"] * fg.Tensor([1.0, 2.0, 3.0])).sum().backward()
    opt.step()
    np.testing.assert_allclose(model["w"].numpy(), [4.0, 3.0, 2.0])


def test_load_state_dict_strict_lists_missing_and_unexpected_keys():
    tree = make_tree()
    sd = {name: t for name, t in state.get_state_dict(tree).items() if name != "scale"}
    sd["extra.weight"] = fg.Tensor([1.0])
    with pytest.raises(StateDictError) as info:
        state.load_state_dict(tree, sd)
    message = str(info.value)
    assert "missing keys" in message and "'scale'" in message
    assert "unexpected keys" in message and "'extra.weight'" in message


def test_load_state_dict_non_strict_skips_missing_and_unexpected():
    tree = make_tree()
    state.load_state_dict(tree, {"scale": fg.Tensor(5.0), "unknown": fg.Tensor([1.0])}, strict=False)
    assert tree["scale"].item() == 5.0
    np.testing.assert_array_equal(tree["layers"][0].weight.numpy(), np.ones((2, 3)))


@pytest.mark.parametrize("strict", [True, False])
def test_load_state_dict_shape_mismatch_names_key_and_shapes(strict):
    tree = make_tree()
    sd = dict(state.get_state_dict(tree))
    sd["layers.0.weight"] = fg.Tensor(np.ones((3, 2), np.float32))
    with pytest.raises(StateDictError, match=r"'layers.0.weight': shape mismatch, the object has \(2, 3\), "
                                             r"the state dict \(3, 2\)"):
        state.load_state_dict(tree, sd, strict=strict)


def test_load_state_dict_dtype_mismatch_changes_nothing():
    tree = make_tree()
    sd = {name: fg.Tensor(np.full(t.shape, 9.0, np.float32)) for name, t in state.get_state_dict(tree).items()}
    sd["scale"] = fg.Tensor(np.float16(1.0), dtype="float16")
    with pytest.raises(StateDictError, match="'scale': dtype mismatch, the object has float32, the state dict float16"):
        state.load_state_dict(tree, sd)
    np.testing.assert_array_equal(tree["layers"][0].weight.numpy(), np.ones((2, 3)))  # nothing was assigned


def test_load_state_dict_rejects_non_arrays():
    with pytest.raises(StateDictError, match="'w' must be a Tensor, a NumPy array or a PyTorch tensor, got list"):
        state.load_state_dict({"w": fg.Tensor([1.0])}, {"w": [1.0]})


def test_state_dict_of_nn_layers():
    linear_cls = getattr(fg.nn, "Linear", None)
    if linear_cls is None:
        pytest.skip("nn.Linear does not exist yet")
    model = fg.nn.Sequential(linear_cls(4, 3), fg.nn.ReLU(), linear_cls(3, 2))
    sd = state.get_state_dict(model)
    assert {name.rsplit(".", 1)[-1] for name in sd} == {"weight", "bias"}
    assert len(sd) == 4 and len(state.get_parameters(model)) == 4
    copy = fg.nn.Sequential(linear_cls(4, 3), fg.nn.ReLU(), linear_cls(3, 2))
    state.load_state_dict(copy, sd)
    x = fg.Tensor(np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32))
    np.testing.assert_array_equal(copy(x).numpy(), model(x).numpy())


# --- safetensors round trips ---------------------------------------------------------------------

def test_round_trip_every_dtype(tmp_path):
    path = tmp_path / "all.safetensors"
    tensors = as_tensors(SAMPLES)
    tensors["empty"] = fg.Tensor(np.zeros((0, 4), np.float32))
    tensors["scalar"] = fg.Tensor(np.int16(-5), dtype="int16")
    state.safe_save(tensors, path, metadata={"format": "pt", "step": "12"})
    loaded = state.safe_load(path)
    assert_same(loaded, tensors)
    assert state.safe_load_metadata(path) == {"format": "pt", "step": "12"}


def test_saved_layout_is_aligned_and_padded(tmp_path):
    path = tmp_path / "a.safetensors"
    state.safe_save({"b": np.ones(3, np.uint8), "a": np.ones(2, np.float64), "c": np.ones(1, np.float16)}, path)
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n])
    assert [header[k]["data_offsets"] for k in ("a", "c", "b")] == [[0, 16], [16, 18], [18, 21]]
    assert "__metadata__" not in header and len(raw) == 8 + n + 21


def test_model_state_round_trip(tmp_path):
    tree = make_tree()
    state.safe_save(state.get_state_dict(tree), tmp_path / "m.safetensors")
    other = make_tree()
    state.load_state_dict(other, {"layers.0.weight": np.full((2, 3), 3.0, np.float32)}, strict=False)
    state.load_state_dict(other, state.safe_load(tmp_path / "m.safetensors"))
    assert_same(state.get_state_dict(other), state.get_state_dict(tree))


def test_files_without_metadata_have_empty_metadata(tmp_path):
    state.safe_save({}, tmp_path / "e.safetensors")
    assert state.safe_load(tmp_path / "e.safetensors") == {}
    assert state.safe_load_metadata(tmp_path / "e.safetensors") == {}


def test_save_rejects_bad_arguments(tmp_path):
    with pytest.raises(TypeError, match="metadata must be a dict of str to str"):
        state.safe_save({"a": np.ones(1)}, tmp_path / "x", metadata={"step": 3})
    with pytest.raises(TypeError, match="'a' has dtype complex64"):
        state.safe_save({"a": np.ones(1, np.complex64)}, tmp_path / "x")
    with pytest.raises(ValueError, match="'__metadata__' is reserved"):
        state.safe_save({"__metadata__": np.ones(1)}, tmp_path / "x")
    assert not os.listdir(tmp_path)  # nothing written, no temporary left behind


def test_big_endian_arrays_are_stored_little_endian(tmp_path):
    state.safe_save({"x": np.array([1, 256], dtype=">i4")}, tmp_path / "be.safetensors")
    assert state.safe_load(tmp_path / "be.safetensors")["x"].tolist() == [1, 256]


def test_bools_are_written_as_zero_or_one(tmp_path):
    odd = np.frombuffer(b"\x00\x02\xff", dtype=np.bool_)  # NumPy bools holding other bytes
    state.safe_save({"m": odd}, tmp_path / "m.safetensors")
    assert (tmp_path / "m.safetensors").read_bytes()[-3:] == b"\x00\x01\x01"
    assert state.safe_load(tmp_path / "m.safetensors")["m"].tolist() == [False, True, True]


def test_package_reads_our_files_and_we_read_its_files(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy")
    ours = tmp_path / "ours.safetensors"
    state.safe_save(as_tensors(SAMPLES), ours, metadata={"who": "funcgrad"})
    assert_same(st_numpy.load_file(str(ours)), SAMPLES)
    theirs = tmp_path / "theirs.safetensors"
    st_numpy.save_file(SAMPLES, str(theirs), metadata={"who": "safetensors"})
    assert_same(state.safe_load(theirs), SAMPLES)
    assert state.safe_load_metadata(theirs) == {"who": "safetensors"}


def test_torch_reads_our_files_and_we_read_its_files(tmp_path):
    torch = pytest.importorskip("torch")
    st_torch = pytest.importorskip("safetensors.torch")
    # torch has no numpy view of bfloat16 or the wide unsigned types, so compare through raw bytes
    ours = tmp_path / "ours.safetensors"
    state.safe_save(as_tensors(SAMPLES), ours)
    loaded = st_torch.load_file(str(ours))
    for name, array in SAMPLES.items():
        t = loaded[name]
        assert tuple(t.shape) == array.shape, name
        assert t.contiguous().view(torch.uint8).numpy().tobytes() == array.tobytes(), name
    theirs = tmp_path / "theirs.safetensors"
    rng = torch.Generator().manual_seed(0)
    torch_tensors = {"w": torch.randn(3, 4, generator=rng), "h": torch.randn(5, generator=rng).to(torch.bfloat16),
                     "i": torch.arange(6, dtype=torch.int64).reshape(2, 3), "m": torch.tensor([True, False])}
    st_torch.save_file(torch_tensors, str(theirs))
    back = state.safe_load(theirs)
    for name, t in torch_tensors.items():
        assert back[name].shape == tuple(t.shape)
        assert back[name].numpy().tobytes() == t.contiguous().view(torch.uint8).numpy().tobytes(), name
    assert back["h"].dtype == fg.dtypes.bfloat16 and back["i"].dtype == fg.dtypes.int64


def test_optimiser_state_round_trip(tmp_path):
    def trained() -> tuple[dict, fg.nn.optim.Adam]:
        params = {"w": fg.Tensor(np.ones(3, np.float32), requires_grad=True)}
        return params, fg.nn.optim.Adam([params["w"]], lr=0.1)

    params, opt = trained()
    for _ in range(2):
        opt.zero_grad()
        (params["w"] * fg.Tensor([1.0, -2.0, 3.0])).sum().backward()
        opt.step()
    state.safe_save({**state.get_state_dict(params), **{f"opt.{k}": v for k, v in state.get_state_dict(opt).items()}},
                    tmp_path / "ckpt.safetensors")
    new_params, new_opt = trained()
    loaded = state.safe_load(tmp_path / "ckpt.safetensors")
    state.load_state_dict(new_params, {k: v for k, v in loaded.items() if not k.startswith("opt.")})
    state.load_state_dict(new_opt, {k[4:]: v for k, v in loaded.items() if k.startswith("opt.")})
    for p, o in ((params, opt), (new_params, new_opt)):  # one more step from the same state: the same result
        o.zero_grad()
        (p["w"] * fg.Tensor([1.0, -2.0, 3.0])).sum().backward()
        o.step()
    np.testing.assert_array_equal(new_params["w"].numpy(), params["w"].numpy())


# --- corrupt files ---------------------------------------------------------------------------------

def file_with(header: object, data: bytes = b"", length: int | None = None, raw_header: bytes | None = None) -> bytes:
    text = raw_header if raw_header is not None else json.dumps(header).encode()
    return (len(text) if length is None else length).to_bytes(8, "little") + text + data


GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
CORRUPT = {
    "empty file": (b"", "too short"),
    "short length field": (b"\x05\x00\x00", "too short"),
    "header length past the end": (file_with(GOOD, bytes(8), length=10_000), "larger than the rest of the file"),
    "huge header length": (file_with(GOOD, bytes(8), length=2**63), "exceeds the limit"),
    "bad JSON": (file_with(None, raw_header=b'{"a": {"dtype": "F32",'), "not valid JSON"),
    "not UTF-8": (file_with(None, raw_header=b'{"\xff": 1}'), "not UTF-8"),
    "JSON array header": (file_with([1, 2]), "must be a JSON object"),
    "duplicate key": (file_with(None, bytes(8), raw_header=json.dumps(GOOD)[:-1].encode() + b', "a": '
                                + json.dumps(GOOD["a"]).encode() + b"}"), "appears twice"),
    "NaN constant": (file_with(None, raw_header=b'{"a": NaN}'), "NaN"),
    "entry not an object": (file_with({"a": [1]}), "must be an object"),
    "missing field": (file_with({"a": {"dtype": "F32", "shape": [2]}}, bytes(8)), "exactly the fields"),
    "extra field": (file_with({"a": {**GOOD["a"], "strides": [1]}}, bytes(8)), "exactly the fields"),
    "unknown dtype": (file_with({"a": {**GOOD["a"], "dtype": "F31"}}, bytes(8)), "unknown or unsupported dtype 'F31'"),
    "dtype not a string": (file_with({"a": {**GOOD["a"], "dtype": 4}}, bytes(8)), "dtype must be a string"),
    "negative dim": (file_with({"a": {**GOOD["a"], "shape": [-2]}}, bytes(8)), "non-negative integers"),
    "float dim": (file_with({"a": {**GOOD["a"], "shape": [2.0]}}, bytes(8)), "non-negative integers"),
    "bool dim": (file_with({"a": {**GOOD["a"], "shape": [True, 2]}}, bytes(8)), "non-negative integers"),
    "offsets reversed": (file_with({"a": {**GOOD["a"], "data_offsets": [8, 0]}}, bytes(8)), "0 <= begin <= end"),
    "offsets wrong length": (file_with({"a": {**GOOD["a"], "data_offsets": [0]}}, bytes(8)), "data_offsets must be"),
    "shape mismatch": (file_with({"a": {**GOOD["a"], "shape": [3]}}, bytes(8)), "needs 12 bytes but data_offsets"),
    "offsets out of range": (file_with({"a": {**GOOD["a"], "data_offsets": [8, 16]}}, bytes(8)), "past the end"),
    "truncated data": (file_with(GOOD, bytes(5)), "past the end"),
    "trailing data": (file_with(GOOD, bytes(12)), "covers 8 bytes of data but the file holds 12"),
    "overlapping": (file_with({"a": GOOD["a"], "b": {"dtype": "U8", "shape": [4], "data_offsets": [4, 8]}},
                              bytes(8)), "overlap"),
    "gap": (file_with({"a": {**GOOD["a"], "data_offsets": [4, 12]}}, bytes(12)), "leaving a gap"),
    "metadata not strings": (file_with({"__metadata__": {"step": 3}}), "'__metadata__' must be"),
    "bad bool bytes": (file_with({"m": {"dtype": "BOOL", "shape": [2], "data_offsets": [0, 2]}}, b"\x01\x07"),
                       "bytes other than 0 and 1"),
    # found by tests/fuzz/test_fuzz_readers.py: these raised NumPy's ValueError or were accepted
    "empty tensor too large for NumPy": (file_with({"a": {"dtype": "F32", "shape": [0, 2**62],
                                                          "data_offsets": [0, 0]}}), "too large for an array"),
    "65 dims": (file_with({"a": {"dtype": "U8", "shape": [0] + [1] * 64, "data_offsets": [0, 0]}}),
                "too large for an array"),
    "lone surrogate in a name": (file_with(None, bytes(8), raw_header=b'{"\\ud800": ' + json.dumps(GOOD["a"]).encode()
                                           + b"}"), "not valid Unicode"),
    "lone surrogate in metadata": (file_with(None, raw_header=b'{"__metadata__": {"k": "\\udc00"}}'),
                                   "not valid Unicode"),
}



@st.composite
def state_dicts(draw) -> dict[str, np.ndarray]:
    names = draw(st.lists(st.text(min_size=1, max_size=8).filter(lambda n: n != "__metadata__"), max_size=5,
                          unique=True))
    result = {}
    for name in names:
        kind = draw(st.sampled_from(sorted(SAMPLES)))
        shape = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
        raw = draw(st.binary(min_size=int(np.prod(shape)) * SAMPLES[kind].dtype.itemsize,
                             max_size=int(np.prod(shape)) * SAMPLES[kind].dtype.itemsize))
        if kind == "BOOL":
            result[name] = (np.frombuffer(raw, dtype=np.uint8) % 2 == 1).reshape(shape)
        else:
            result[name] = np.frombuffer(raw, dtype=SAMPLES[kind].dtype).reshape(shape)
    return result


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(arrays=state_dicts(), metadata=st.none() | st.dictionaries(st.text(max_size=5), st.text(max_size=5)))
def test_any_state_dict_round_trips_bit_for_bit(tmp_path, monkeypatch, arrays, metadata):
    monkeypatch.setattr(os, "fsync", lambda fd: None)  # durability is not what this test is about; syncs are slow
    path = tmp_path / "any.safetensors"
    state.safe_save(arrays, path, metadata=metadata)
    assert_same(state.safe_load(path), arrays)
    assert state.safe_load_metadata(path) == (metadata or {})


# a small valid file: a 2x3 float32, a bool pair, metadata (header, then 24 + 2 data bytes)
VALID_FILE = file_with({"__metadata__": {"k": "v"}, "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
                        "b": {"dtype": "BOOL", "shape": [2], "data_offsets": [24, 26]}},
                       np.arange(6, dtype="<f4").tobytes() + b"\x01\x00")


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_damaged_files_raise_only_safetensors_errors(tmp_path, data):
    path = tmp_path / "f.safetensors"
    content = bytearray(VALID_FILE)
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(content) - 1))
        content[position] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(content)))
    path.write_bytes(bytes(content[:cut]))
    try:
        loaded = state.safe_load(path)
    except SafetensorsError:
        return
    # a damage that left a valid file: its tensors account for every data byte after the header
    header_length = int.from_bytes(content[:8], "little")
    assert sum(t.numpy().nbytes for t in loaded.values()) == cut - 8 - header_length

@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_corrupt_file_raises_clear_error(tmp_path, case):
    content, message = CORRUPT[case]
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    with pytest.raises(SafetensorsError, match=message) as info:
        state.safe_load(path)
    assert str(path) in str(info.value)  # the error names the file


def test_metadata_reader_validates_the_header_too(tmp_path):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(CORRUPT["truncated data"][0])
    with pytest.raises(SafetensorsError, match="past the end"):
        state.safe_load_metadata(path)


def test_safetensors_error_is_a_value_error():
    assert issubclass(SafetensorsError, ValueError) and issubclass(StateDictError, ValueError)


# --- atomic saves ----------------------------------------------------------------------------------

SAVER = textwrap.dedent("""
    import sys, numpy as np
    from funcgrad.nn import state
    path, ready = sys.argv[1], sys.argv[2]
    big = np.arange(4_000_000, dtype=np.float32)
    step = 0
    while True:
        step += 1
        state.safe_save({"big": big + step, "step": np.array([step], np.int64)}, path)
        if step == 2:
            open(ready, "w").close()
""")


def test_a_save_killed_midway_leaves_a_whole_file(tmp_path):
    path = tmp_path / "model.safetensors"
    ready = tmp_path / "ready"
    state.safe_save({"big": np.zeros(4_000_000, np.float32), "step": np.array([0], np.int64)}, path)
    child = subprocess.Popen([sys.executable, "-c", SAVER, str(path), str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert child.poll() is None, "the saving process died on its own"
            assert time.monotonic() < deadline, "the saving process never got going"
            time.sleep(0.01)
        time.sleep(0.137)  # somewhere inside a later save
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    loaded = state.safe_load(path)  # never torn: a complete old or new file
    step = int(loaded["step"].item())
    assert step >= 2
    np.testing.assert_array_equal(loaded["big"].numpy()[:3], np.array([0, 1, 2], np.float32) + step)
    assert loaded["big"].numpy()[-1] == np.float32(3_999_999 + step)


FAILING_SAVER = textwrap.dedent("""
    import resource, sys, numpy as np
    from funcgrad.nn import state
    # writes past 1 MB now fail (EFBIG; Python ignores SIGXFSZ): a disk that fills up mid-save
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    try:
        state.safe_save({"big": np.ones(1_000_000, np.float32)}, sys.argv[1])
    except OSError:
        sys.exit(3)
""")


@pytest.mark.skipif(sys.platform != "linux", reason="uses RLIMIT_FSIZE")
def test_a_save_that_fails_midway_keeps_the_old_file(tmp_path):
    path = tmp_path / "model.safetensors"
    state.safe_save({"small": np.arange(3, dtype=np.int32)}, path)
    result = subprocess.run([sys.executable, "-c", FAILING_SAVER, str(path)])
    assert result.returncode == 3  # the save failed inside a write
    assert state.safe_load(path)["small"].tolist() == [0, 1, 2]
    assert os.listdir(tmp_path) == ["model.safetensors"]  # the temporary file was removed
