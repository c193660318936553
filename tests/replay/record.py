"""Render the replay corpus: each program's kernels, as text, per device.

    program --fg.jit(fn).lower(*args).ir--> IR --schedule(inline_calls(ir))--> steps
            --per device: (CPU: optimize) + render--> one text per (program, device)

The text lists every step (kernels and host steps), each kernel's ``str()`` and its source as the
device's renderer writes it (pure functions: no device needs to be present). A renderer that refuses
a kernel (WGSL has no 64-bit types) is recorded with its reason. Nothing is compiled or run.

    python3 tests/replay/record.py            # one sha256 per recording (compare two processes)
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import attrs

import funcgrad as fg
from funcgrad.lower.kernel import Kernel
from funcgrad.lower.render_c import render_opencl
from funcgrad.lower.render_cuda import render_cuda
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.render_wgsl import buffer_layout, render_wgsl
from funcgrad.lower.schedule import HostStep, KernelStep, Step, inline_calls, schedule

if __package__ in (None, ""):  # run as a script: make ``replay`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from replay.corpus import PROGRAMS  # noqa: E402

RECORDINGS = Path(__file__).resolve().parent
UPDATE_HINT = "python3 -m pytest tests/lower/test_replay.py --update-replay"

# WebGPU guarantees 8 storage buffers per shader stage (adapters may allow more: lavapipe 32). The
# recordings use the guaranteed limit, so they do not depend on the adapter and show the packing.
WGSL_MAX_BUFFERS = 8


def optimize_for_cpu(kernel: Kernel) -> Kernel:
    """The kernel with the opts the CPU device chooses by default: the heuristics (a BEAM search or
    its stored choices depend on this machine's timings). Unchanged if funcgrad has no optimiser."""
    try:
        optimize = importlib.import_module("funcgrad.lower.optimize")
    except ModuleNotFoundError:
        return kernel
    heuristic_opts = getattr(optimize, "heuristic_opts", None)
    if heuristic_opts is not None:
        return attrs.evolve(kernel, opts=tuple(heuristic_opts(kernel)))
    optimized: Kernel = optimize.optimize(kernel)
    return optimized


def render_cpu(kernel: Kernel) -> tuple[Kernel, str]:
    kernel = optimize_for_cpu(kernel)
    return kernel, render_llvm(kernel)


def render_cl(kernel: Kernel) -> tuple[Kernel, str]:
    return kernel, render_opencl([kernel])[0]


def render_cuda_c(kernel: Kernel) -> tuple[Kernel, str]:
    return kernel, render_cuda([kernel])[0]


def render_webgpu(kernel: Kernel) -> tuple[Kernel, str]:
    return kernel, render_wgsl(kernel, buffer_layout(kernel, WGSL_MAX_BUFFERS))


@attrs.frozen
class Renderer:
    device: str
    language: str
    render: Callable[[Kernel], tuple[Kernel, str]]


RENDERERS = {r.device: r for r in (
    Renderer("CPU", "LLVM IR (render_llvm, after the CPU optimiser)", render_cpu),
    Renderer("CL", "OpenCL C (render_opencl)", render_cl),
    Renderer("CUDA", "CUDA C (render_cuda)", render_cuda_c),
    Renderer("WEBGPU", f"WGSL (render_wgsl, at most {WGSL_MAX_BUFFERS} storage buffers)", render_webgpu),
)}


# The CPU optimiser's thread opt counts this machine's cores; the recordings assume this many, so
# they read the same on every machine (the thread count changes no source, only the opts line).
RECORDED_CPU_THREADS = 2


@contextmanager
def reproducible_environment() -> Iterator[None]:
    """No BEAM search, no DEBUG printing and a fixed CPU thread count while rendering: the recordings
    are the default path, the same on every machine."""
    from funcgrad.devices import cpu_threads
    saved = {name: os.environ.pop(name, None) for name in ("BEAM", "DEBUG")}
    saved_thread_count = cpu_threads.thread_count
    cpu_threads.thread_count = lambda: RECORDED_CPU_THREADS
    try:
        yield
    finally:
        cpu_threads.thread_count = saved_thread_count
        os.environ.update({name: value for name, value in saved.items() if value is not None})


_STEPS: dict[tuple[str, bool], list[Step]] = {}
ROW_REDUCTIONS = {"CPU": True}  # devices whose plans fuse row reductions into their rows' passes (CPUDevice)


def program_steps(name: str, row_reductions: bool = False) -> list[Step]:
    """The scheduled steps of corpus program ``name`` (traced once per process), as a plan on a device
    with (or without) ``row_reductions`` schedules them."""
    if (name, row_reductions) not in _STEPS:
        entry = PROGRAMS[name]
        with reproducible_environment():
            ir = fg.jit(entry.fn).lower(*entry.make_args()).ir
            _STEPS[name, row_reductions] = schedule(inline_calls(ir), row_reductions)
    return _STEPS[name, row_reductions]


def step_label(step: Step) -> str:
    if isinstance(step, KernelStep):
        return f"kernel {step.kernel.name}"
    assert isinstance(step, HostStep)
    return f"host {step.eqn.primitive.name}"


def render_recording(name: str, device: str) -> str:
    """The recording text of program ``name`` on ``device``."""
    renderer = RENDERERS[device]
    steps = program_steps(name, ROW_REDUCTIONS.get(device, False))
    kernels = [step.kernel for step in steps if isinstance(step, KernelStep)]
    lines = [f"# kernel replay: program {name} on {device}, {renderer.language}",
             f"# {len(kernels)} kernels, {len(steps) - len(kernels)} host steps; regenerate with {UPDATE_HINT}",
             "# steps: " + ", ".join(step_label(step) for step in steps), ""]
    first_with_source: dict[str, int] = {}
    with reproducible_environment():
        for position, kernel in enumerate(kernels):
            lines.append(f"=== kernel {position}: {kernel.name}")
            try:
                rendered, source = renderer.render(kernel)
            except (ValueError, KeyError, TypeError, NotImplementedError) as error:
                lines += [str(kernel), f"--- not rendered for {device}: {type(error).__name__}: {error}", ""]
                continue
            lines.append(str(rendered))
            if rendered.opts is not None and "opts:" not in str(rendered):
                lines.append("  opts: " + " ".join(str(opt) for opt in rendered.opts))
            source_lines = source.rstrip("\n").split("\n")
            digest = hashlib.sha256(source.encode()).hexdigest()
            lines.append(f"--- source: {len(source_lines)} lines, sha256 {digest}")
            if digest in first_with_source:  # a kernel computed twice (forward values in a backward pass)
                lines += [f"(the same source as kernel {first_with_source[digest]})", ""]
                continue
            first_with_source[digest] = position
            lines += source_lines
            lines.append("")
    return "\n".join(lines)


def recording_path(name: str, device: str) -> Path:
    return RECORDINGS / device / f"{name}.txt"


def main() -> None:
    """Print a sha256 per (program, device) recording; ``--write`` also rewrites the files."""
    import argparse
    parser = argparse.ArgumentParser(description="render the kernel replay corpus")
    parser.add_argument("--programs", default=",".join(PROGRAMS), help="comma-separated corpus programs, in order")
    parser.add_argument("--write", action="store_true", help="rewrite the recordings")
    args = parser.parse_args()
    for name in args.programs.split(","):
        for device in RENDERERS:
            text = render_recording(name, device)
            if args.write:
                recording_path(name, device).parent.mkdir(exist_ok=True)
                recording_path(name, device).write_text(text)
            print(f"{hashlib.sha256(text.encode()).hexdigest()}  {device}/{name}")


if __name__ == "__main__":
    main()

