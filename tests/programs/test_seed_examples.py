"""The seed document's three examples (docs/seed-examples.md), run verbatim."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BLOCKS = re.findall(r"```(\w+)\n(.*?)```", (ROOT / "docs" / "seed-examples.md").read_text(), re.S)


def test_the_document_has_the_three_examples():
    assert [language for language, _ in BLOCKS] == ["bash", "python", "python"]


def test_lazy_matmul_is_one_kernel_with_debug_3():
    command = BLOCKS[0][1].strip()
    assert command.startswith("DEBUG=3 python3 -c ")
    code = command[len("DEBUG=3 python3 -c "):].strip().strip('"')
    env = {**os.environ, "DEBUG": "3", "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert "realized with 1 kernels, 0 host steps" in result.stderr
    assert "kernel r_sum_1024_1024 global[1024, 1024] reduce[sum][1024]" in result.stderr
    # Tensor.empty is a real buffer of the full shape (as in tinygrad): the kernel loads two matrices,
    # each element of a row of a and a column of b, not a broadcast scalar
    assert re.search(r"^  in0: f32\[1024,1024\]$", result.stderr, re.M), result.stderr
    assert re.search(r"^  in1: f32\[1024,1024\]$", result.stderr, re.M), result.stderr
    assert "in0[(r0 + (g0 * 1024))] * in1[(g1 + (r0 * 1024))]" in result.stderr, result.stderr


def test_linear_net_trains_with_adam_and_backward(capsys):
    exec(compile(BLOCKS[1][1], "seed-examples.md", "exec"), {})  # noqa: S102 - our own document
    losses = [float(line.split()[1]) for line in capsys.readouterr().out.splitlines()]
    assert len(losses) == 10
    assert losses[-1] < losses[0] / 10, losses


def test_backward_matches_pytorchs_values(capsys):
    exec(compile(BLOCKS[2][1], "seed-examples.md", "exec"), {})  # noqa: S102
    lines = capsys.readouterr().out.splitlines()
    assert lines == ["[[2.0, 2.0, 2.0], [0.0, 0.0, 0.0], [-2.0, -2.0, -2.0]]", "[[1.0, 1.0, 1.0]]"]
