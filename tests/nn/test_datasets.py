"""funcgrad.datasets: the IDX reader on small synthetic files, where MNIST-like files are looked
for, checksums, the no-network error, Fashion-MNIST from the Debian package, and DataLoader."""

from __future__ import annotations

import gzip
import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.random as fr
from funcgrad import datasets
from funcgrad.datasets import DataLoader, DatasetError, DatasetNotFoundError, IDXError

DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")


def idx_bytes(array: np.ndarray, type_code: int) -> bytes:
    big_endian = array.astype(array.dtype.newbyteorder(">"))
    header = bytes([0, 0, type_code, array.ndim]) + b"".join(d.to_bytes(4, "big") for d in array.shape)
    return header + big_endian.tobytes()


@pytest.fixture
def no_data_anywhere(tmp_path, monkeypatch):
    """Empty search folders and a downloader that fails as with no network; returns the calls made."""
    monkeypatch.setenv("FUNCGRAD_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "SYSTEM_DATA_DIRS", (str(tmp_path / "system"),))
    calls: list[str] = []

    def offline(url, destination):
        calls.append(url)
        raise OSError("network is unreachable")

    monkeypatch.setattr(datasets, "_download", offline)
    return calls


# --- IDX files -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype,code", [(np.uint8, 0x08), (np.int8, 0x09), (np.int16, 0x0B), (np.int32, 0x0C),
                                        (np.float32, 0x0D), (np.float64, 0x0E)])
@pytest.mark.parametrize("zipped", [False, True])
def test_read_idx_round_trips_every_type(tmp_path, dtype, code, zipped):
    array = (np.arange(24).reshape(2, 3, 4) - 7).astype(dtype)
    data = idx_bytes(array, code)
    path = tmp_path / ("x.gz" if zipped else "x")
    path.write_bytes(gzip.compress(data) if zipped else data)
    result = datasets.read_idx(path)
    assert result.dtype == np.dtype(dtype) and result.dtype.isnative
    np.testing.assert_array_equal(result, array)


def test_read_idx_images_and_labels_magic(tmp_path):
    images = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    data = idx_bytes(images, 0x08)
    assert data[:4] == b"\x00\x00\x08\x03"
    (tmp_path / "i").write_bytes(data)
    assert datasets.read_idx(tmp_path / "i").shape == (2, 28, 28)
    labels = idx_bytes(np.array([3, 1, 4], np.uint8), 0x08)
    assert labels[:4] == b"\x00\x00\x08\x01"


@pytest.mark.parametrize("content,message", [
    (b"\x00\x00", "too short"),
    (b"\x08\x03\x00\x00" + bytes(8), "bad magic number 0x08030000"),
    (b"\x00\x00\x07\x01" + bytes(8), "bad magic number 0x00000701"),
    (b"\x00\x00\x08\x03\x00\x00", "ends inside the header"),
    (idx_bytes(np.zeros((2, 3), np.uint8), 0x08)[:-1], r"shape \(2, 3\) of uint8 \(18 bytes with the header\) but "
                                                       "the data holds 17 bytes"),
    (idx_bytes(np.zeros((2, 3), np.uint8), 0x08) + b"\x00", "the data holds 19 bytes"),
    (idx_bytes(np.zeros(2, np.int32), 0x0C)[:-2], "shape"),
    # found by tests/fuzz/test_fuzz_readers.py: NumPy's ValueError escaped from these
    (b"\x00\x00\x08\x41" + b"\x00\x00\x00\x01" * 65 + b"\x07", "too large for an array"),
    (b"\x00\x00\x0e\x03" + bytes(4) + b"\xff" * 8, r"shape \(0, 4294967295, 4294967295\) of float64, too large"),
])
def test_read_idx_rejects_bad_files_naming_them(tmp_path, content, message):
    path = tmp_path / "bad-idx"
    path.write_bytes(content)
    with pytest.raises(IDXError, match=message) as info:
        datasets.read_idx(path)
    assert str(path) in str(info.value)


@pytest.mark.parametrize("damage", ["truncated", "flipped byte", "bad crc"])
def test_read_idx_rejects_damaged_gzip(tmp_path, damage):
    zipped = bytearray(gzip.compress(idx_bytes(np.arange(1000, dtype=np.int32), 0x0C), mtime=0))
    if damage == "truncated":
        zipped = zipped[:-10]
    elif damage == "flipped byte":
        zipped[12] ^= 0xFF
    else:
        zipped[-8] ^= 0x01
    path = tmp_path / "bad.gz"
    path.write_bytes(bytes(zipped))
    with pytest.raises(IDXError, match=f"{path}: damaged gzip data"):
        datasets.read_idx(path)


# --- finding, checking and downloading MNIST-like files ------------------------------------------

def fake_dataset(tmp_path: Path, n_train: int = 5, n_test: int = 3) -> tuple[datasets._Dataset, list[np.ndarray]]:
    """A tiny MNIST-like data set whose digests are those of the files written here."""
    rng = np.random.default_rng(0)
    arrays = [rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_train, dtype=np.uint8),
              rng.integers(0, 256, (n_test, 28, 28), dtype=np.uint8), rng.integers(0, 10, n_test, dtype=np.uint8)]
    files = []
    for template, array in zip(datasets.MNIST.files, arrays):
        contents = idx_bytes(array, 0x08)
        zipped = gzip.compress(contents)
        (tmp_path / "mirror").mkdir(exist_ok=True)
        (tmp_path / "mirror" / f"{template.name}.gz").write_bytes(zipped)
        files.append(datasets._File(template.name, hashlib.sha256(zipped).hexdigest(),
                                    hashlib.sha256(contents).hexdigest()))
    dataset = datasets._Dataset("tiny", ((tmp_path / "mirror").as_uri() + "/",), tuple(files))
    return dataset, arrays


def test_files_are_found_in_funcgrad_data_first(tmp_path, no_data_anywhere):
    dataset, arrays = fake_dataset(tmp_path)
    folder = tmp_path / "data" / "tiny"
    folder.mkdir(parents=True)
    for file in dataset.files:  # raw (not gzipped) files work too
        (folder / file.name).write_bytes(gzip.decompress((tmp_path / "mirror" / f"{file.name}.gz").read_bytes()))
    X_train, Y_train, X_test, Y_test = datasets._load(dataset, download=True)
    assert no_data_anywhere == []
    assert X_train.shape == (5, 1, 28, 28) and X_train.dtype == np.uint8
    assert Y_test.shape == (3,) and Y_test.dtype == np.uint8
    np.testing.assert_array_equal(X_train.numpy()[:, 0], arrays[0])
    np.testing.assert_array_equal(Y_test.numpy(), arrays[3])


def test_search_order_is_env_cache_system(tmp_path, no_data_anywhere):
    assert datasets.search_dirs("mnist") == [tmp_path / "data" / "mnist",
                                             tmp_path / "cache" / "funcgrad" / "datasets" / "mnist",
                                             tmp_path / "system" / "mnist"]


def test_cache_honours_xdg_cache_home_and_home(monkeypatch, tmp_path):
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert datasets.cache_dir("mnist") == tmp_path / ".cache" / "funcgrad" / "datasets" / "mnist"


def test_download_goes_into_the_cache_with_a_checked_digest(tmp_path, no_data_anywhere, monkeypatch):
    dataset, arrays = fake_dataset(tmp_path)
    monkeypatch.setattr(datasets, "_download", lambda url, dest: Path(dest).write_bytes(
        (tmp_path / "mirror" / url.rsplit("/", 1)[1]).read_bytes()))
    X_train, *_ = datasets._load(dataset, download=True)
    np.testing.assert_array_equal(X_train.numpy()[:, 0], arrays[0])
    cached = sorted(os.listdir(datasets.cache_dir("tiny")))
    assert cached == sorted(f"{file.name}.gz" for file in dataset.files)  # no temporary files left


def test_the_real_downloader_fetches_from_a_file_url(tmp_path, monkeypatch):
    monkeypatch.setenv("FUNCGRAD_DATA", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setattr(datasets, "SYSTEM_DATA_DIRS", ())
    dataset, arrays = fake_dataset(tmp_path)
    _, _, _, Y_test = datasets._load(dataset, download=True)
    np.testing.assert_array_equal(Y_test.numpy(), arrays[3])


def test_a_download_with_a_wrong_digest_is_rejected(tmp_path, no_data_anywhere, monkeypatch):
    dataset, _ = fake_dataset(tmp_path)
    monkeypatch.setattr(datasets, "_download", lambda url, dest: Path(dest).write_bytes(b"not the file"))
    with pytest.raises(DatasetNotFoundError, match="is not the published") as info:
        datasets._load(dataset, download=True)
    assert dataset.mirrors[0] in str(info.value)
    assert os.listdir(datasets.cache_dir("tiny")) == []  # the bad download was not kept


def test_a_local_file_with_other_contents_is_rejected(tmp_path, no_data_anywhere):
    dataset, _ = fake_dataset(tmp_path)
    folder = tmp_path / "data" / "tiny"
    folder.mkdir(parents=True)
    (folder / f"{dataset.files[0].name}.gz").write_bytes(gzip.compress(idx_bytes(np.zeros((5, 28, 28), np.uint8),
                                                                                8)))
    with pytest.raises(DatasetError, match=f"{folder}.*SHA-256 .* not the expected"):
        datasets._load(dataset, download=False)


def test_no_network_error_says_where_it_looked_and_what_to_do(no_data_anywhere, tmp_path):
    with pytest.raises(DatasetNotFoundError) as info:
        datasets.fashion_mnist()
    message = str(info.value)
    assert "train-images-idx3-ubyte" in message
    for folder in datasets.search_dirs("fashion-mnist"):
        assert str(folder) in message
    assert "network is unreachable" in message
    assert "apt-get install dataset-fashion-mnist" in message and "$FUNCGRAD_DATA" in message
    assert len(no_data_anywhere) == len(datasets.FASHION_MNIST.mirrors)  # every mirror was tried
    assert not any(Path(datasets.cache_dir("fashion-mnist")).iterdir())


def test_download_false_does_not_touch_the_network(no_data_anywhere):
    with pytest.raises(DatasetNotFoundError, match="downloads were turned off"):
        datasets.mnist(download=False)
    assert no_data_anywhere == []


# --- the real Fashion-MNIST from the Debian package ----------------------------------------------

@pytest.mark.skipif(not (DEBIAN_FASHION / "train-images-idx3-ubyte.gz").exists(),
                    reason="Fashion-MNIST is not installed (apt-get install dataset-fashion-mnist)")
def test_fashion_mnist_loads_from_the_debian_package(tmp_path, no_data_anywhere, monkeypatch):
    monkeypatch.setattr(datasets, "SYSTEM_DATA_DIRS", ("/usr/share/datasets",))
    X_train, Y_train, X_test, Y_test = datasets.fashion_mnist()
    assert no_data_anywhere == []  # found locally, nothing downloaded
    assert (X_train.shape, X_train.dtype) == ((60000, 1, 28, 28), np.uint8)
    assert (Y_train.shape, Y_train.dtype) == ((60000,), np.uint8)
    assert (X_test.shape, Y_test.shape) == ((10000, 1, 28, 28), (10000,))
    labels = Y_train.numpy()
    assert labels[:10].tolist() == [9, 0, 0, 3, 0, 2, 7, 2, 5, 5]  # Fashion-MNIST's first training labels
    assert np.bincount(labels).tolist() == [6000] * 10 and np.bincount(Y_test.numpy()).tolist() == [1000] * 10
    assert X_test.numpy().max() == 255 and X_test.numpy().min() == 0


# --- DataLoader ------------------------------------------------------------------------------------

def test_loader_batches_in_order_without_shuffle():
    x = np.arange(10, dtype=np.float32).reshape(10, 1)
    y = np.arange(10, dtype=np.int32)
    loader = DataLoader(x, y, batch_size=4)
    batches = list(loader)
    assert len(loader) == 3 and len(batches) == 3
    assert [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert batches[0][0].shape == (4, 1) and batches[0][0].dtype == np.float32 and batches[0][1].dtype == np.int32


def test_loader_drop_last():
    loader = DataLoader(np.arange(10), batch_size=4, drop_last=True)
    assert len(loader) == 2 and [b[0].shape for b in loader] == [(4,), (4,)]


def test_loader_keeps_tensor_dtypes():
    images = fg.Tensor(np.arange(12, dtype=np.uint8).reshape(6, 2))
    wide = fg.Tensor(np.arange(6, dtype=np.int64), dtype="int64")
    x, w = next(iter(DataLoader(images, wide, batch_size=6)))
    assert x.dtype == np.uint8 and w.dtype == np.int64
    np.testing.assert_array_equal(x.numpy(), images.numpy())


def test_loader_shuffle_is_a_permutation_that_changes_per_epoch_and_repeats_per_key():
    x = np.arange(50, dtype=np.int32)
    labels = x * 10
    loader = DataLoader(x, labels, batch_size=8, shuffle=True, key=fr.key(1))
    epochs = []
    for _ in range(2):
        rows, pairs = [], []
        for xb, yb in loader:
            rows.extend(xb.tolist())
            pairs.append((xb.numpy() * 10 == yb.numpy()).all())
        assert sorted(rows) == list(range(50)) and all(pairs)  # every row once, arrays kept aligned
        epochs.append(rows)
    assert epochs[0] != epochs[1] and epochs[0] != list(range(50))
    again = DataLoader(x, labels, batch_size=8, shuffle=True, key=fr.key(1))
    assert [r for xb, _ in again for r in xb.tolist()] == epochs[0]
    expected = fr.permutation(fr.fold_in(fr.key(1), 0), 50).numpy()
    np.testing.assert_array_equal(np.array(epochs[0]), expected)


def test_loader_without_key_uses_the_global_seed():
    x = np.arange(20, dtype=np.int32)
    fg.Tensor.manual_seed(3)
    first = [r for (b,) in DataLoader(x, batch_size=5, shuffle=True) for r in b.tolist()]
    fg.Tensor.manual_seed(3)
    second = [r for (b,) in DataLoader(x, batch_size=5, shuffle=True) for r in b.tolist()]
    assert first == second and sorted(first) == list(range(20))


@pytest.mark.parametrize("arrays,kwargs,message", [
    ((), {"batch_size": 2}, "at least one array"),
    ((np.zeros(3),), {"batch_size": 0}, "batch_size must be a positive int"),
    ((np.zeros(3),), {"batch_size": 2.0}, "batch_size must be a positive int"),
    ((np.zeros(3), np.zeros(4)), {"batch_size": 2}, "array 0 has 3, array 1 has 4"),
    ((np.float32(1.0),), {"batch_size": 2}, "array 0 is a scalar"),
])
def test_loader_rejects_bad_arguments(arrays, kwargs, message):
    with pytest.raises(ValueError, match=message):
        DataLoader(*arrays, **kwargs)
