"""The benchmark command (benchmarks/run.py) runs end to end on tiny sizes: every workload of the
Compiler issue gets a row, funcgrad's column is a number whose result matched NumPy, and the
table and JSON say how each installed peer did. Timings are never asserted: they are noise here."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

RUN = Path(__file__).resolve().parent.parent / "benchmarks" / "run.py"
WORKLOADS = ["matmul_512", "matmul_1024", "matmul_2048", "gelu", "softmax", "layernorm", "dispatch",
             "mlp_first_call", "mlp_step", "cnn_first_step", "cnn_step"]
PEERS = ["numpy", "jax", "torch", "tinygrad"]


def run_benchmarks(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(RUN), "--quick", *args], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict[str, Any]]:
    out = tmp_path_factory.mktemp("benchmarks") / "results.json"
    process = run_benchmarks("--json", str(out))
    assert process.returncode == 0, process.stdout + process.stderr
    return process.stdout, json.loads(out.read_text())


def rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["name"]: row for row in report["workloads"]}


def test_every_workload_has_a_row(quick_run: tuple[str, dict[str, Any]]) -> None:
    _, report = quick_run
    assert [row["name"] for row in report["workloads"]] == WORKLOADS


@pytest.mark.parametrize("workload", WORKLOADS)
def test_funcgrad_column_is_a_number_and_its_result_matched_numpy(quick_run: tuple[str, dict[str, Any]],
                                                                   workload: str) -> None:
    row = rows(quick_run[1])[workload]
    funcgrad = row["results"]["funcgrad"]
    assert funcgrad["status"] == "ok", funcgrad["note"]
    assert isinstance(funcgrad["value"], float) and math.isfinite(funcgrad["value"]) and funcgrad["value"] > 0
    assert funcgrad["ok"] is True and row["ok"] is True
    assert len(funcgrad["times_s"]) >= 1


@pytest.mark.parametrize("peer", PEERS)
def test_each_installed_peer_is_measured_or_explained(quick_run: tuple[str, dict[str, Any]], peer: str) -> None:
    stdout, report = quick_run
    meta = report["meta"]
    if peer not in meta["versions"]:
        assert peer in meta["unavailable"]
        assert f"skipped {peer}" in stdout
        pytest.skip(f"{peer}: {meta['unavailable'][peer]}")
    for name, row in rows(report).items():
        result = row["results"][peer]
        if result["status"] == "n/a":
            continue
        assert result["status"] == "ok", (name, result["status"], result["note"])
        assert result["ok"] is True, (name, result["max_error"])
        assert result["value"] > 0
        ratio = row["ratio_funcgrad_time_to"][peer]
        assert ratio == pytest.approx(row["results"]["funcgrad"]["median_s"] / result["median_s"])


def test_table_shows_every_workload_and_each_target_verdict(quick_run: tuple[str, dict[str, Any]]) -> None:
    stdout, report = quick_run
    assert "OPENBLAS_CORETYPE=" in stdout
    for workload in WORKLOADS:
        assert f"\n{workload} " in stdout
    targets = {row["name"]: row["target"] for row in report["workloads"] if "target" in row}
    assert set(targets) == {"matmul_1024", "gelu", "softmax", "layernorm", "dispatch", "mlp_step",
                            "cnn_first_step", "cnn_step"}
    for name, target in targets.items():
        verdict = {True: "met", False: "NOT MET", None: "n/a"}[target["met"]]
        assert any(line.split()[:1] == [name] and line.endswith(verdict) for line in stdout.splitlines()), name


def test_only_selects_workloads_and_frameworks(tmp_path: Path) -> None:
    out = tmp_path / "only.json"
    process = run_benchmarks("--only", "dispatch,gelu", "--frameworks", "numpy", "--json", str(out))
    assert process.returncode == 0, process.stdout + process.stderr
    report = json.loads(out.read_text())
    assert [row["name"] for row in report["workloads"]] == ["gelu", "dispatch"]
    assert all(set(row["results"]) == {"funcgrad", "numpy"} for row in report["workloads"])


def test_unknown_workload_is_refused_with_the_known_names() -> None:
    process = run_benchmarks("--only", "matmul_999")
    assert process.returncode != 0
    assert "matmul_999" in process.stderr and "mlp_step" in process.stderr
