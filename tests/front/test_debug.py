"""The DEBUG ladder: what each level prints (to stderr) when lazy Tensors are realized."""

from __future__ import annotations

import numpy as np
import pytest

import funcgrad.numpy as fnp


def _realize_a_fresh_graph(rows: int) -> None:
    # a shape used nowhere else, so the plan (and its kernels) is built in this test
    x = fnp.asarray(np.arange(rows * 13, dtype=np.float32).reshape(rows, 13))
    (fnp.exp(x * 0.01) + 1.0).sum(axis=1).realize()


@pytest.mark.parametrize("level,expected", [
    (1, "realized with 1 kernels, 0 host steps"),
    (2, "GFLOP/s"),
    (3, "kernel r_sum_"),
    (4, "define void @r_sum_"),
])
@pytest.mark.usefixtures("on_cpu")  # the CPU device prints GFLOP/s and LLVM source
def test_each_debug_level_prints_its_part(monkeypatch, capsys, level, expected):
    monkeypatch.setenv("DEBUG", str(level))
    from funcgrad.devices import get_device
    monkeypatch.setattr(get_device("CPU"), "plan_cache", None)  # a plan stored by an earlier run skips the source
    _realize_a_fresh_graph(rows=3 + level * 10)
    err = capsys.readouterr().err
    assert expected in err, err
    if level >= 2:
        assert "GB/s" in err


def test_debug_0_prints_nothing(monkeypatch, capsys):
    monkeypatch.setenv("DEBUG", "0")
    _realize_a_fresh_graph(rows=61)
    assert capsys.readouterr().err == ""
