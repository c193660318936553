"""Data sets and a batch iterator: IDX files (MNIST, Fashion-MNIST) and ``DataLoader``.

``mnist()`` and ``fashion_mnist()`` return ``(X_train, Y_train, X_test, Y_test)`` as tinygrad's
``nn.datasets.mnist`` does: images uint8 of shape (N, 1, 28, 28) with values 0..255, labels uint8
of shape (N,). Convert as needed, e.g. ``X.astype(fnp.float32) / 255``.

Each of the four files (``train-images-idx3-ubyte`` etc., gzipped or raw) is looked for in turn in
``$FUNCGRAD_DATA/<name>/``, the cache ``$XDG_CACHE_HOME/funcgrad/datasets/<name>/`` (default
``~/.cache/...``) and the Debian package folder ``/usr/share/datasets/<name>/`` (``apt-get install
dataset-fashion-mnist``); where it is in none of them, it is downloaded into the cache from the
official mirrors. Every file is checked against the SHA-256 of its IDX contents (downloads first
against the digest of the published ``.gz``), so a damaged or different file is never used.

The Fashion-MNIST digests were computed from the Debian package's files; their deflate streams are
upstream's byte for byte (rebuilding the gzip header upstream used gives the published MD5s and
SHA-256s, which are the ``gz`` digests below); only the gzip header differs.

>>> X_train, Y_train, X_test, Y_test = fashion_mnist()     # doctest: +SKIP
>>> for x, y in DataLoader(X_train, Y_train, batch_size=128, shuffle=True, key=fr.key(0)): ...  # doctest: +SKIP
"""

from __future__ import annotations

import gzip
import hashlib
import math
import os
import re
import sys
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from funcgrad import random as fr
from funcgrad.core.tensor import Tensor

__all__ = ["DataLoader", "DatasetError", "DatasetNotFoundError", "IDXError", "batches", "fashion_mnist", "mnist",
           "read_idx"]

PathLike = str | os.PathLike


class IDXError(ValueError):
    """A file that is not a well-formed IDX file."""


class DatasetError(ValueError):
    """A data set file that is not the one expected (checksum mismatch) or a failed download."""


class DatasetNotFoundError(FileNotFoundError):
    """A data set that is not on this machine and could not be downloaded."""


# --- IDX files -----------------------------------------------------------------------------------

# IDX type codes (third byte of the magic number) and the big-endian dtypes they stand for
IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}


def _read_bytes(path: str) -> bytes:
    """The file's contents, decompressed when it starts with the gzip magic bytes."""
    with open(path, "rb") as file:
        start = file.read(2)
        file.seek(0)
        if start != b"\x1f\x8b":
            return file.read()
    try:
        with gzip.open(path, "rb") as zipped:
            return zipped.read()
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise IDXError(f"{path}: damaged gzip data: {err}") from None


def _parse_idx(data: bytes, path: str) -> np.ndarray:
    if len(data) < 4:
        raise IDXError(f"{path}: too short for an IDX file ({len(data)} bytes)")
    zero, type_code, ndim = int.from_bytes(data[:2], "big"), data[2], data[3]
    if zero != 0 or type_code not in IDX_DTYPES:
        raise IDXError(f"{path}: bad magic number 0x{data[:4].hex()}: expected 0x0000 then a type code "
                       f"({', '.join(f'0x{c:02X}' for c in IDX_DTYPES)}) and the number of dimensions "
                       "(0x00000803 for images, 0x00000801 for labels)")
    header_size = 4 + 4 * ndim
    if len(data) < header_size:
        raise IDXError(f"{path}: the file ends inside the header ({ndim} dimensions need {header_size} bytes, "
                       f"the file has {len(data)})")
    shape = tuple(int.from_bytes(data[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    dtype = IDX_DTYPES[type_code]
    # an empty array may have any other dims and match the file's size, but NumPy cannot hold it
    if ndim > 64 or math.prod(d for d in shape if d) * dtype.itemsize > sys.maxsize:
        raise IDXError(f"{path}: the header says shape {shape} of {dtype.name}, too large for an array (at most "
                       f"64 dimensions and {sys.maxsize} bytes, not counting zero-sized dims)")
    expected = header_size + math.prod(shape) * dtype.itemsize
    if len(data) != expected:
        raise IDXError(f"{path}: the header says shape {shape} of {dtype.name} ({expected} bytes with the header) "
                       f"but the data holds {len(data)} bytes")
    array = np.frombuffer(data, dtype=dtype, offset=header_size).reshape(shape)
    return array.astype(dtype.newbyteorder("="))


def read_idx(path: PathLike) -> np.ndarray:
    """Read an IDX file (gzipped or raw) into a NumPy array of the dtype and shape its header gives.

    >>> read_idx("/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz").shape   # doctest: +SKIP
    (10000,)
    """
    path = os.fspath(path)
    return _parse_idx(_read_bytes(path), path)


# --- MNIST-like data sets ------------------------------------------------------------------------

class _File(NamedTuple):
    name: str          # without ".gz"
    gz_sha256: str     # of the published .gz (checked on download)
    idx_sha256: str    # of the decompressed IDX contents (checked on every load)


class _Dataset(NamedTuple):
    name: str          # folder name under each search root
    mirrors: tuple[str, ...]
    files: tuple[_File, _File, _File, _File]  # train images, train labels, test images, test labels


MNIST = _Dataset("mnist", (
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
), (
    _File("train-images-idx3-ubyte", "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
          "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db"),
    _File("train-labels-idx1-ubyte", "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
          "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5"),
    _File("t10k-images-idx3-ubyte", "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
          "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7"),
    _File("t10k-labels-idx1-ubyte", "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
          "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2"),
))

FASHION_MNIST = _Dataset("fashion-mnist", (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",  # plain HTTP upstream; the digests protect it
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
), (
    _File("train-images-idx3-ubyte", "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
          "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888"),
    _File("train-labels-idx1-ubyte", "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
          "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9"),
    _File("t10k-images-idx3-ubyte", "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
          "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b"),
    _File("t10k-labels-idx1-ubyte", "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
          "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34"),
))

# folders where system packages put data sets (Debian: /usr/share/datasets/fashion-mnist/)
SYSTEM_DATA_DIRS: tuple[str, ...] = ("/usr/share/datasets",)
DOWNLOAD_TIMEOUT_S = 60.0


def cache_dir(name: str) -> Path:
    """Where downloads of data set ``name`` go: ``$XDG_CACHE_HOME/funcgrad/datasets/<name>``."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "funcgrad" / "datasets" / name


def search_dirs(name: str) -> list[Path]:
    """The folders searched for data set ``name``, in order."""
    folders = []
    if os.environ.get("FUNCGRAD_DATA"):
        folders.append(Path(os.environ["FUNCGRAD_DATA"]) / name)
    folders.append(cache_dir(name))
    folders.extend(Path(root) / name for root in SYSTEM_DATA_DIRS)
    return folders


def _download(url: str, destination: Path) -> None:
    """Fetch ``url`` into ``destination`` (a temporary file; the caller checks and renames it)."""
    with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, open(destination, "wb") as out:
        while chunk := response.read(1 << 20):
            out.write(chunk)


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _fetch_into_cache(dataset: _Dataset, file: _File) -> tuple[Path | None, list[str]]:
    """Download ``file`` into the cache, trying each mirror; (path or None, what went wrong)."""
    folder = cache_dir(dataset.name)
    failures: list[str] = []
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        return None, [f"cannot create the cache folder {folder}: {err}"]
    for mirror in dataset.mirrors:
        url = mirror + file.name + ".gz"
        try:
            # pooch downloads into a temporary file, checks the published SHA-256 and moves the file into
            # place only when it matches; the transfer itself is ours (urllib: https and file URLs alike)
            import pooch  # (~11 MB resident with its requests/tqdm imports): only where a download happens
            fetched = pooch.retrieve(url, known_hash=f"sha256:{file.gz_sha256}", fname=f"{file.name}.gz",
                                     path=folder, downloader=lambda url, output, _: _download(url, Path(output)))
            return Path(fetched), failures
        except ValueError as err:  # pooch's hash mismatch (the bad download is deleted)
            digest = re.search(r"\(([0-9a-f]{64})\)", str(err))
            got = digest.group(1) if digest else "of another file"
            failures.append(f"{url}: SHA-256 {got} is not the published {file.gz_sha256}")
        except OSError as err:  # URLError, timeouts and HTTP errors are OSErrors
            failures.append(f"{url}: {err}")
    return None, failures


def _find(dataset: _Dataset, file: _File) -> Path | None:
    for folder in search_dirs(dataset.name):
        for candidate in (folder / f"{file.name}.gz", folder / file.name):
            if candidate.is_file():
                return candidate
    return None


def _load_file(dataset: _Dataset, file: _File, download: bool) -> np.ndarray:
    path = _find(dataset, file)
    failures: list[str] = []
    if path is None and download:
        path, failures = _fetch_into_cache(dataset, file)
    if path is None:
        where = "\n  ".join(str(folder / f"{file.name}[.gz]") for folder in search_dirs(dataset.name))
        tried = ("\ndownloads failed:\n  " + "\n  ".join(failures)) if failures else \
            ("" if download else "\n(downloads were turned off)")
        hint = ("apt-get install dataset-fashion-mnist, or " if dataset is FASHION_MNIST else "")
        raise DatasetNotFoundError(
            f"{dataset.name}: {file.name} was not found; looked for:\n  {where}{tried}\n"
            f"To get it: {hint}put the four files (gzipped or raw) into $FUNCGRAD_DATA/{dataset.name}/ "
            f"or {cache_dir(dataset.name)}/, or let this machine reach {dataset.mirrors[0]} "
            "(with download=True, the default)")
    contents = _read_bytes(str(path))
    digest = _sha256(contents)
    if digest != file.idx_sha256:
        raise DatasetError(f"{path}: the IDX contents have SHA-256 {digest}, not the expected {file.idx_sha256} "
                           f"of {dataset.name}'s {file.name}; the file is damaged or a different data set "
                           "(delete it to fetch it again)")
    return _parse_idx(contents, str(path))


def _load(dataset: _Dataset, download: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    train_x, train_y, test_x, test_y = (_load_file(dataset, file, download) for file in dataset.files)
    return (Tensor(train_x.reshape(-1, 1, 28, 28)), Tensor(train_y),
            Tensor(test_x.reshape(-1, 1, 28, 28)), Tensor(test_y))


def mnist(fashion: bool = False, download: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """MNIST (or Fashion-MNIST with ``fashion=True``) as ``(X_train, Y_train, X_test, Y_test)``:
    uint8 images (60000 or 10000, 1, 28, 28) in 0..255 and uint8 labels 0..9, as tinygrad's.

    >>> X_train, Y_train, X_test, Y_test = mnist()      # doctest: +SKIP
    >>> X_train.shape, Y_train.dtype
    ((60000, 1, 28, 28), dtype('uint8'))
    """
    return _load(FASHION_MNIST if fashion else MNIST, download)


def fashion_mnist(download: bool = True) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fashion-MNIST as ``(X_train, Y_train, X_test, Y_test)``, laid out as ``mnist()``."""
    return _load(FASHION_MNIST, download)


# --- batches -------------------------------------------------------------------------------------

class DataLoader:
    """Iterate over equal-length arrays in batches: each step yields a tuple of Tensors, one per
    array, holding the same rows of each.

    With ``shuffle`` the rows come in a random order drawn from ``key`` (a ``funcgrad.random`` key;
    ``None`` takes one from the global key of ``Tensor.manual_seed``) folded with the epoch number,
    so every pass over the data (every ``iter()``) has a new order and a run is reproducible.
    ``drop_last`` leaves out a final batch smaller than ``batch_size``.

    ``shard=(index, count)`` (data-parallel training: ``(process_index(), process_count())``) makes
    this loader one of ``count`` that split every epoch: the global batch ``k`` is
    ``count * batch_size`` consecutive rows of the epoch's order (the same on every rank: pass the
    same ``key``), and shard ``index`` yields its ``index``-th part, ``batch_size`` rows. The shards
    are disjoint and equal-sized, and together they are what one loader of ``count * batch_size``
    rows yields. The ``num_rows % count`` rows at the end of each epoch's order are left out (a
    different few each shuffled epoch), so that every shard has the same number of batches.

    >>> loader = DataLoader(X, Y, batch_size=32, shuffle=True, key=fr.key(0))   # doctest: +SKIP
    >>> for x, y in loader: ...                                                # doctest: +SKIP
    >>> DataLoader(X, Y, batch_size=32, shuffle=True, key=fr.key(0), shard=(rank, ranks))  # doctest: +SKIP
    """

    def __init__(self, *arrays: Any, batch_size: int, shuffle: bool = False, key: Any = None,
                 drop_last: bool = False, shard: tuple[int, int] | None = None) -> None:
        if not arrays:
            raise ValueError("DataLoader needs at least one array")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"DataLoader: batch_size must be a positive int, got {batch_size!r}")
        tensors = [a if isinstance(a, Tensor) else Tensor(a) for a in arrays]  # NumPy float64 -> float32, as Tensor()
        for i, t in enumerate(tensors):
            if t.ndim == 0:
                raise ValueError(f"DataLoader: array {i} is a scalar; arrays need a leading axis of rows")
            if t.shape[0] != tensors[0].shape[0]:
                raise ValueError(f"DataLoader: every array needs the same number of rows; array 0 has "
                                 f"{tensors[0].shape[0]}, array {i} has {t.shape[0]}")
        # rows are taken on the host: one NumPy copy per array, then each batch is a fresh Tensor
        self._host = [t.numpy() for t in tensors]
        self._dtypes = [t.dtype for t in tensors]
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        if shuffle and key is not None and not (isinstance(key, Tensor | np.ndarray) and key.shape == (2,)
                                                and key.dtype == np.uint32):
            raise TypeError(f"DataLoader: key must be a PRNG key made by fg.random.key(seed), got {key!r}")
        self.shard_index, self.shard_count = _check_shard(shard, self.num_rows)
        if shuffle and key is None and self.shard_count > 1:
            raise ValueError(f"DataLoader: shuffle=True with shard={tuple(shard or ())} needs key=fg.random.key(seed), "
                             "the same on every rank, so that the shards split one order; a key drawn from the "
                             "global random state may differ between processes")
        self.key = (fr.next_key() if key is None else key) if shuffle else None
        self.epoch = 0

    @property
    def num_rows(self) -> int:
        return self._host[0].shape[0]

    @property
    def shard_rows(self) -> int:
        """The rows this loader yields in one epoch (before ``drop_last``): ``num_rows // count``."""
        return self.num_rows // self.shard_count

    def __len__(self) -> int:
        """The number of batches in one epoch."""
        full, rest = divmod(self.shard_rows, self.batch_size)
        return full + (1 if rest and not self.drop_last else 0)

    def order(self, epoch: int) -> np.ndarray:
        """The row order of epoch ``epoch`` (0, 1, ...)."""
        if not self.shuffle:
            return np.arange(self.num_rows)
        return fr.permutation(fr.fold_in(self.key, epoch), self.num_rows).numpy()

    def batch_rows(self, epoch: int) -> list[np.ndarray]:
        """The rows of each batch this loader yields in epoch ``epoch``: of each global batch of
        ``count * batch_size`` consecutive rows of ``order(epoch)``, the ``index``-th part."""
        rows, count = self.order(epoch), self.shard_count
        batches = []
        for batch in range(len(self)):
            start = batch * self.batch_size
            size = min(self.batch_size, self.shard_rows - start)  # the last batch may be shorter, alike on every shard
            first = start * count + self.shard_index * size
            batches.append(rows[first:first + size])
        return batches

    def __iter__(self) -> Iterator[tuple[Tensor, ...]]:
        batches = self.batch_rows(self.epoch)
        self.epoch += 1
        for index in batches:
            yield tuple(Tensor(host[index], dtype=dtype) for host, dtype in zip(self._host, self._dtypes))


def _check_shard(shard: Any, num_rows: int) -> tuple[int, int]:
    """``shard`` as ``(index, count)``; ``None`` is the whole data set, ``(0, 1)``."""
    if shard is None:
        return 0, 1
    is_int = lambda value: isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))  # noqa: E731
    if not isinstance(shard, (tuple, list)) or len(shard) != 2 or not all(is_int(v) for v in shard):
        raise TypeError(f"DataLoader: shard must be (index, count), two ints such as (process_index(), "
                        f"process_count()), got {shard!r}")
    index, count = int(shard[0]), int(shard[1])
    if count < 1:
        raise ValueError(f"DataLoader: shard=({index}, {count}): the count of shards must be >= 1")
    if not 0 <= index < count:
        raise ValueError(f"DataLoader: shard=({index}, {count}): the index must be in 0..{count - 1}")
    if count > num_rows:
        raise ValueError(f"DataLoader: shard=({index}, {count}): {num_rows} rows cannot give each of {count} "
                         "shards a row")
    return index, count


def batches(*arrays: Any, batch_size: int, shuffle: bool = False, key: Any = None,
            drop_last: bool = False, shard: tuple[int, int] | None = None) -> Iterator[tuple[Tensor, ...]]:
    """One epoch of ``DataLoader(*arrays, ...)``."""
    return iter(DataLoader(*arrays, batch_size=batch_size, shuffle=shuffle, key=key, drop_last=drop_last,
                           shard=shard))

