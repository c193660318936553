"""NCCL for CUDA: the library from NVIDIA's ``nvidia-nccl-cu12`` wheel, loaded with ctypes.

``pip install nvidia-nccl-cu12`` (not a dependency of funcgrad: only a CUDA job needs it) puts
``libnccl.so.2`` under ``site-packages/nvidia/nccl/lib``; :func:`find_nccl` looks there, then asks the
system loader. :func:`nccl_version` loads it and calls ``ncclGetVersion``, which needs no GPU: that
is what is checked on a machine without one (tests/distributed/test_nccl.py).

:class:`NCCLEngine` is the collective engine protocol on NCCL, one process per GPU: rank 0 makes the
communicator's unique id (``ncclGetUniqueId``), MPI broadcasts its 128 bytes, every rank calls
``ncclCommInitRank``. Host buffers go to the GPU and back through the CUDA driver API (``libcuda``,
the driver's own library: no toolkit, no pycuda), on the default stream. **Not yet run on a GPU**:
this machine has none, and no part of it is exercised by the tests here beyond the load check.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from funcgrad.util.collective_engine import (
    check_permutation,
    check_reduction,
    collective_timeout,
    debug_collectives,
    describe_call,
)


class NCCLUnavailableError(ImportError):
    """libnccl (or, for the engine, the CUDA driver) cannot be loaded; the message says where it looked."""


def nccl_candidates() -> list[str]:
    """Where ``libnccl.so.2`` is looked for, in order: the wheels' folders, then the loader's name."""
    found = []
    for package in ("nvidia.nccl", "nvidia.cu13", "nvidia"):
        try:
            spec = importlib.util.find_spec(package)
        except (ImportError, ValueError):
            spec = None
        for folder in (spec.submodule_search_locations or []) if spec is not None else []:
            for sub in ("lib", "nccl/lib", "lib64"):
                candidate = Path(folder) / sub / "libnccl.so.2"
                if candidate.exists() and str(candidate) not in found:
                    found.append(str(candidate))
    system = ctypes.util.find_library("nccl")
    found += [system] if system else []
    found.append("libnccl.so.2")
    return found


_LIBRARY: list[ctypes.CDLL] = []


def load_nccl() -> ctypes.CDLL:
    """libnccl, loaded once; ``NCCLUnavailableError`` naming every place tried where none loads."""
    if _LIBRARY:
        return _LIBRARY[0]
    tried = []
    for candidate in nccl_candidates():
        try:
            library = ctypes.CDLL(candidate)
        except OSError as error:
            tried.append(f"{candidate} ({error})")
            continue
        _LIBRARY.append(library)
        return library
    raise NCCLUnavailableError("funcgrad.distributed.nccl: libnccl.so.2 cannot be loaded (pip install "
                               "nvidia-nccl-cu12); tried " + "; ".join(tried))


def nccl_library_path() -> str:
    """The file the loaded libnccl came from."""
    return str(load_nccl()._name)


def nccl_version() -> tuple[int, int, int]:
    """(major, minor, patch) from ``ncclGetVersion`` (needs no GPU)."""
    library = load_nccl()
    code = ctypes.c_int(0)
    _check(library, library.ncclGetVersion(ctypes.byref(code)), "ncclGetVersion")
    value = code.value
    if value >= 10000:  # NCCL_VERSION_CODE since 2.9: major*10000 + minor*100 + patch
        return value // 10000, value // 100 % 100, value % 100
    return value // 1000, value // 100 % 10, value % 100


def _check(library: ctypes.CDLL, result: int, call: str) -> None:
    if result != 0:
        library.ncclGetErrorString.restype = ctypes.c_char_p
        text = library.ncclGetErrorString(result)
        raise RuntimeError(f"{call}: NCCL error {result}: {text.decode() if text else '?'}")


# ncclDataType_t and ncclRedOp_t (nccl.h)
_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5, "float16": 6,
           "float32": 7, "float64": 8, "bfloat16": 9}
_OPS = {"sum": 0, "max": 2, "min": 3}
_UNIQUE_ID_BYTES = 128


class _UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_ubyte * _UNIQUE_ID_BYTES)]


class _Cuda:
    """The few CUDA driver calls the engine needs (libcuda.so.1, shipped with the driver)."""

    def __init__(self, device: int) -> None:
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as error:
            raise NCCLUnavailableError(f"funcgrad.distributed.nccl: the CUDA driver (libcuda.so.1) cannot be "
                                       f"loaded: {error}") from None
        self.call("cuInit", 0)
        handle = ctypes.c_int(0)
        self.call("cuDeviceGet", ctypes.byref(handle), device)
        self.context = ctypes.c_void_p()
        self.call("cuDevicePrimaryCtxRetain", ctypes.byref(self.context), handle)
        self.call("cuCtxSetCurrent", self.context)

    def call(self, name: str, *args: Any) -> None:
        result = getattr(self.lib, name)(*args)
        if result != 0:
            raise RuntimeError(f"{name}: CUDA driver error {result}")

    def upload(self, x: np.ndarray) -> ctypes.c_uint64:
        pointer = ctypes.c_uint64(0)
        self.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(max(x.nbytes, 1)))
        if x.nbytes:
            self.call("cuMemcpyHtoD_v2", pointer, x.ctypes.data_as(ctypes.c_void_p), ctypes.c_size_t(x.nbytes))
        return pointer

    def empty(self, nbytes: int) -> ctypes.c_uint64:
        pointer = ctypes.c_uint64(0)
        self.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(max(nbytes, 1)))
        return pointer

    def download(self, pointer: ctypes.c_uint64, out: np.ndarray) -> np.ndarray:
        self.call("cuCtxSynchronize")
        if out.nbytes:
            self.call("cuMemcpyDtoH_v2", out.ctypes.data_as(ctypes.c_void_p), pointer, ctypes.c_size_t(out.nbytes))
        return out

    def free(self, *pointers: ctypes.c_uint64) -> None:
        for pointer in pointers:
            self.call("cuMemFree_v2", pointer)


class NCCLEngine:
    """The collective engine protocol on NCCL: one process per GPU, wired up over MPI.

    ``device``: the GPU this process drives (default: the rank's index among the processes of its
    host, ``OMPI_COMM_WORLD_LOCAL_RANK`` / ``SLURM_LOCALID`` / ``MPI_LOCALRANKID``, else 0).
    """

    name = "nccl"

    def __init__(self, comm: Any = None, device: int | None = None) -> None:
        from funcgrad.distributed.mpi import MPIEngine, import_mpi
        self.nccl = load_nccl()
        MPI = import_mpi()
        self.mpi = MPI.COMM_WORLD if comm is None else comm
        self.host = MPIEngine(self.mpi)  # the unique id's broadcast and FUNCGRAD_DEBUG_COLLECTIVES's check
        self.device = _local_rank() if device is None else device
        self.cuda = _Cuda(self.device)
        unique = _UniqueId()
        if self.mpi.Get_rank() == 0:
            self._check(self.nccl.ncclGetUniqueId(ctypes.byref(unique)), "ncclGetUniqueId")
        buffer = np.frombuffer(ctypes.string_at(ctypes.addressof(unique), _UNIQUE_ID_BYTES), np.uint8).copy()
        self.mpi.Bcast(buffer, root=0)  # the id over MPI: every rank joins the same NCCL communicator
        ctypes.memmove(ctypes.addressof(unique), buffer.ctypes.data, _UNIQUE_ID_BYTES)
        self.comm = ctypes.c_void_p()
        self._check(self.nccl.ncclCommInitRank(ctypes.byref(self.comm), self.mpi.Get_size(), unique,
                                               self.mpi.Get_rank()), "ncclCommInitRank")

    @property
    def rank(self) -> int:
        return int(self.mpi.Get_rank())

    @property
    def size(self) -> int:
        return int(self.mpi.Get_size())

    def _check(self, result: int, call: str) -> None:
        _check(self.nccl, result, call)

    def _dtype(self, what: str, x: np.ndarray) -> int:
        name = np.dtype(x.dtype).name
        if name not in _DTYPES:
            raise TypeError(f"{what} on NCCL: dtype {name} is not one of {', '.join(_DTYPES)}")
        return _DTYPES[name]

    def _collective(self, what: str, x: np.ndarray, out_shape: tuple[int, ...], launch: Any) -> np.ndarray:
        send = np.ascontiguousarray(x)
        if debug_collectives() and self.size > 1:  # (FUNCGRAD_COLLECTIVE_TIMEOUT covers only this check here)
            self.host._check_same_call(describe_call(what, send), collective_timeout())
        out = np.empty(out_shape, send.dtype)
        device_in = self.cuda.upload(send)
        device_out = self.cuda.empty(out.nbytes)
        try:
            self._check(launch(device_in, device_out, self._dtype(what, send)), what)
            return self.cuda.download(device_out, out)
        finally:
            self.cuda.free(device_in, device_out)

    def allreduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        check_reduction("allreduce", op)
        n = int(np.size(x))
        return self._collective("ncclAllReduce", x, np.shape(x), lambda s, d, t: self.nccl.ncclAllReduce(
            s, d, ctypes.c_size_t(n), t, _OPS[op], self.comm, None))

    def allgather(self, x: np.ndarray) -> np.ndarray:
        n = int(np.size(x))
        return self._collective("ncclAllGather", x, (self.size, *np.shape(x)), lambda s, d, t: self.nccl.ncclAllGather(
            s, d, ctypes.c_size_t(n), t, self.comm, None))

    def reduce_scatter(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        check_reduction("reduce_scatter", op)
        shape = np.shape(x)
        if not shape or shape[0] % self.size:
            raise ValueError(f"reduce_scatter: the leading axis of shape {shape} does not split into "
                             f"{self.size} equal parts")
        out_shape = (shape[0] // self.size, *shape[1:])
        n = int(np.prod(out_shape))
        return self._collective("ncclReduceScatter", x, out_shape, lambda s, d, t: self.nccl.ncclReduceScatter(
            s, d, ctypes.c_size_t(n), t, _OPS[op], self.comm, None))

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        if not 0 <= root < self.size:
            raise ValueError(f"broadcast: root {root} is not a rank of a job of {self.size} processes")
        n = int(np.size(x))
        return self._collective("ncclBroadcast", x, np.shape(x), lambda s, d, t: self.nccl.ncclBroadcast(
            s, d, ctypes.c_size_t(n), t, root, self.comm, None))

    def ppermute(self, x: np.ndarray, perm: Sequence[tuple[int, int]]) -> np.ndarray:
        check_permutation("ppermute", perm, self.size)
        destinations = [d for s, d in perm if s == self.rank]
        sources = [s for s, d in perm if d == self.rank]
        n = int(np.size(x))

        def launch(s: Any, d: Any, t: int) -> int:
            self._check(self.nccl.ncclGroupStart(), "ncclGroupStart")
            for peer in destinations:
                self._check(self.nccl.ncclSend(s, ctypes.c_size_t(n), t, peer, self.comm, None), "ncclSend")
            for peer in sources:
                self._check(self.nccl.ncclRecv(d, ctypes.c_size_t(n), t, peer, self.comm, None), "ncclRecv")
            return int(self.nccl.ncclGroupEnd())

        out = self._collective("ppermute", x, np.shape(x), launch)
        return out if sources else np.zeros_like(out)

    def barrier(self) -> None:
        self.mpi.Barrier()

    def abort(self, code: int = 1) -> None:
        self.mpi.Abort(code)

    def __repr__(self) -> str:
        return f"NCCLEngine(rank={self.rank}, size={self.size}, device={self.device})"


def _local_rank() -> int:
    for name in ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID"):
        if name in os.environ:
            return int(os.environ[name])
    return 0
