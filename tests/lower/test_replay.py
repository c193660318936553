"""Kernel replay: the kernels of the corpus programs (tests/replay/corpus.py), rendered for every
device, must equal the recordings under tests/replay/<device>/. A refactor proves it changed no
kernel; an intended change shows its diff and is accepted with
``python3 -m pytest tests/lower/test_replay.py --update-replay`` (then commit the recordings).
Rendering only: nothing is compiled or run, no device needs to be present.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from replay.corpus import PROGRAMS
from replay.record import (
    RECORDED_CPU_THREADS,
    RECORDINGS,
    RENDERERS,
    UPDATE_HINT,
    program_steps,
    recording_path,
    render_recording,
)

import funcgrad as fg
from funcgrad.devices import cpu, cpu_threads
from funcgrad.devices.reference import ReferenceDevice
from funcgrad.lower.plan import Plan
from funcgrad.lower.schedule import KernelStep

MAX_DIFF_LINES = 200


def replay_diff(recorded: str, rendered: str, label: str, max_lines: int = MAX_DIFF_LINES) -> str:
    """A unified diff from the recording to the fresh rendering, cut after ``max_lines`` lines."""
    lines = list(difflib.unified_diff(recorded.splitlines(), rendered.splitlines(), f"recorded {label}",
                                      f"rendered now {label}", lineterm=""))
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... ({len(lines) - max_lines} more diff lines)"]
    return "\n".join(lines)


def kernel_headers(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("=== kernel ")]


def mismatch_message(name: str, device: str, recorded: str, rendered: str) -> str:
    before, after = kernel_headers(recorded), kernel_headers(rendered)
    changed = sorted(set(before) ^ set(after))
    summary = f"kernels: {len(before)} recorded, {len(after)} now" + (f"; differing headers: {changed[:6]}"
                                                                         if changed else "")
    return (f"the {device} kernels of replay program {name} differ from {recording_path(name, device)} ({summary})\n"
            f"{replay_diff(recorded, rendered, f'{device}/{name}')}\n"
            f"If the change is intended, accept it with: {UPDATE_HINT}")


@pytest.fixture
def update_replay(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-replay"))


@pytest.mark.parametrize("device", list(RENDERERS))
@pytest.mark.parametrize("name", list(PROGRAMS))
def test_kernels_match_the_recording(name: str, device: str, update_replay: bool) -> None:
    rendered = render_recording(name, device)
    path = recording_path(name, device)
    if update_replay:
        if not path.exists() or path.read_text() != rendered:
            path.parent.mkdir(exist_ok=True)
            path.write_text(rendered)
        return
    if not path.exists():
        pytest.fail(f"replay program {name} has no {device} recording at {path}; record it with: {UPDATE_HINT}")
    recorded = path.read_text()
    if recorded != rendered:
        pytest.fail(mismatch_message(name, device, recorded, rendered), pytrace=False)


def stale_recordings() -> list[Path]:
    """Recording files of programs or devices no longer in the corpus."""
    wanted = {recording_path(name, device) for name in PROGRAMS for device in RENDERERS}
    return sorted(path for path in RECORDINGS.glob("*/*.txt") if path not in wanted)


def test_no_stale_recordings(update_replay: bool) -> None:
    stale = stale_recordings()
    if update_replay:
        for path in stale:
            path.unlink()
        return
    assert not stale, f"recordings of programs no longer in the corpus: {[str(p) for p in stale]}; {UPDATE_HINT}"


def test_the_corpus_covers_ops_transforms_and_the_examples() -> None:
    assert len(PROGRAMS) >= 50
    for needed in ("matmul_square", "softmax", "layernorm", "mlp_hessian_vector_product", "conv2d_backward",
                   "functional_mlp_adam_step", "beautiful_mnist_train_step", "random_split_uniform_normal"):
        assert needed in PROGRAMS


def test_a_recording_lists_each_kernel_with_its_source() -> None:
    text = render_recording("softmax", "CPU")  # the row max, then the sum fused into the normalising pass
    assert "# 2 kernels, 0 host steps" in text
    assert len(kernel_headers(text)) == 2
    assert text.count("define void @") == 2  # the LLVM function of each kernel
    assert "# 3 kernels, 0 host steps" in render_recording("softmax", "CL")  # other devices keep 3
    host = render_recording("cumsum_host", "CL")
    assert "host cumsum" in host.splitlines()[2]


def test_a_renderer_refusing_a_kernel_is_recorded_with_its_reason() -> None:
    text = render_recording("float64_refused_by_webgpu", "WEBGPU")
    assert "--- not rendered for WEBGPU" in text and "float64" in text
    assert "not rendered" not in render_recording("float64_refused_by_webgpu", "CL")


def test_a_changed_kernel_fails_with_a_diff_and_the_update_hint() -> None:
    recorded = render_recording("matmul_tall_skinny", "CUDA")
    changed = recorded.replace("8)", "9)", 1)
    assert changed != recorded
    message = mismatch_message("matmul_tall_skinny", "CUDA", recorded, changed)
    assert "-" in message and "+" in message and UPDATE_HINT in message
    assert any(line.startswith("+") and "9)" in line for line in message.splitlines())


def test_long_diffs_are_cut() -> None:
    recorded = "\n".join(f"line {i}" for i in range(1000))
    rendered = "\n".join(f"line {i} changed" for i in range(1000))
    diff = replay_diff(recorded, rendered, "x", max_lines=50)
    assert len(diff.splitlines()) == 51 and diff.splitlines()[-1].startswith("... (")


def test_rendering_is_the_same_in_another_process() -> None:
    """No dict/set order, id() or hash seed leaks into the kernels: a fresh process with another hash
    seed, tracing the programs in another order, renders the same text."""
    names = ["beautiful_mnist_eval", "random_split_uniform_normal", "mlp_per_example_grads", "softmax"]
    here = {f"{device}/{name}": hashlib.sha256(render_recording(name, device).encode()).hexdigest()
            for name in names for device in RENDERERS}
    package_root = Path(fg.__file__).resolve().parents[1]  # the child imports the same funcgrad
    env = {**os.environ, "PYTHONHASHSEED": "12345", "PYTHONPATH": os.pathsep.join(
        [str(package_root), os.environ.get("PYTHONPATH", "")])}
    result = subprocess.run([sys.executable, str(RECORDINGS / "record.py"), "--programs", ",".join(names)],
                            capture_output=True, text=True, env=env, timeout=120, check=True)
    there = dict(reversed(line.split("  ")) for line in result.stdout.splitlines())
    assert there == here


def test_the_cpu_thread_count_is_pinned(monkeypatch: pytest.MonkeyPatch) -> None:
    """The optimiser's thread opt counts cores; the recordings use RECORDED_CPU_THREADS instead, so they
    read the same on a 2-core and a 16-core machine."""
    pytest.importorskip("funcgrad.lower.optimize")
    from replay import record
    monkeypatch.setattr(record, "RECORDED_CPU_THREADS", 3)
    opts = [line for line in record.render_recording("matmul_large", "CPU").splitlines() if "opts:" in line]
    assert opts and all("thread(0, 3)" in line for line in opts), opts


@pytest.mark.parametrize("name", ["softmax", "matmul_large", "beautiful_mnist_eval"])
def test_cpu_recordings_hold_what_the_cpu_device_compiles(name: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU device's own render path (optimiser, then render_llvm) gives the recorded sources, with
    no BEAM choice stored (an empty cache folder) and the recorded thread count."""
    monkeypatch.delenv("BEAM", raising=False)
    monkeypatch.setenv("FUNCGRAD_CACHE", str(tmp_path))
    monkeypatch.setattr(cpu_threads, "thread_count", lambda: RECORDED_CPU_THREADS)
    device = cpu.CPUDevice(tmp_path)
    compiled_digests = [hashlib.sha256(device.render(step.kernel).encode()).hexdigest()
                        for step in program_steps(name, device.row_reductions) if isinstance(step, KernelStep)]
    recorded_digests = [line.rsplit(" ", 1)[1] for line in render_recording(name, "CPU").splitlines()
                        if line.startswith("--- source:")]
    assert recorded_digests == compiled_digests


@pytest.mark.parametrize("name", ["softmax", "mlp_grad", "beautiful_mnist_train_step"])
def test_the_replay_schedules_as_a_jit_plan_does(name: str) -> None:
    """The recorded kernels are the ones a jit call's plan runs (same IR, same scheduling)."""
    entry = PROGRAMS[name]
    plan = Plan(fg.jit(entry.fn).lower(*entry.make_args()).ir, ReferenceDevice())
    assert plan.kernels == [step.kernel for step in program_steps(name) if isinstance(step, KernelStep)]


def test_the_recordings_stay_small() -> None:
    """Full sources make the best diffs; if they pass this, record less of them (see README.md)."""
    total = sum(path.stat().st_size for path in RECORDINGS.glob("*/*.txt"))
    assert total < 6_000_000, f"the replay recordings take {total / 1e6:.1f} MB"
