"""NCCL's load check (no GPU here): libnccl from the nvidia-nccl-cu12 wheel, ncclGetVersion; the
clear errors where the library or the CUDA driver is missing. The engine's collectives need a GPU
and are not exercised here."""

from __future__ import annotations

import ctypes
import importlib.metadata

import pytest

from funcgrad.distributed import nccl


def _wheel_version() -> str:
    for name in ("nvidia-nccl-cu12", "nvidia-nccl-cu13"):
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    pytest.skip("no nvidia-nccl-cu12 wheel installed (pip install nvidia-nccl-cu12)")


def test_version_from_the_wheel() -> None:
    wheel = _wheel_version()
    assert nccl.nccl_version() == tuple(int(part) for part in wheel.split(".")[:3])
    assert nccl.nccl_library_path().endswith("libnccl.so.2")
    assert "site-packages" in nccl.nccl_library_path() or "dist-packages" in nccl.nccl_library_path()


def test_missing_library_names_where_it_looked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nccl, "_LIBRARY", [])
    monkeypatch.setattr(nccl, "nccl_candidates", lambda: ["/nonexistent/libnccl.so.2"])
    with pytest.raises(nccl.NCCLUnavailableError, match=r"libnccl\.so\.2 cannot be loaded \(pip install "
                       r"nvidia-nccl-cu12\); tried /nonexistent/libnccl\.so\.2 \("):
        nccl.nccl_version()


def test_engine_without_a_cuda_driver() -> None:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        with pytest.raises(nccl.NCCLUnavailableError, match=r"the CUDA driver \(libcuda\.so\.1\) cannot be loaded"):
            nccl._Cuda(0)
    else:
        pytest.skip("a CUDA driver is installed: the engine needs a GPU run (not part of this suite)")
