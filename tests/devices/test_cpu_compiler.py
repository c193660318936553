"""The CPU device's compiler worker and object loader (funcgrad/devices/cpu_compiler.py).

The worker must produce exactly the object code LLVM produces in this process, the loader must run
it exactly as MCJIT does, the training process must never load LLVM, a warm process must start no
worker, and a worker that dies, idles or is inherited by a fork must not break compiling.
"""

from __future__ import annotations

import os
import signal
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from funcgrad.devices import cpu, cpu_target
from funcgrad.devices import cpu_compiler as compiler
from funcgrad.lower.kernel import evaluate_kernel
from funcgrad.lower.render_llvm import render_llvm
from funcgrad.lower.render_loops import llvm_function_name
from tests.lower.test_render_llvm import alu, elementwise_kernel, g, load, reduction_kernel

REPO = Path(__file__).resolve().parents[2]


def libm_kernel(name: str = "asinh_plus_constants", n: int = 1000) -> cpu.Kernel:
    """A libm call (an undefined symbol to link) and float constants (read-only data to relocate)."""
    x = load(0, g(), np.float32)
    return elementwise_kernel(name, [np.float32], [alu("asinh", x), alu("mul", alu("exp", x), x)], n=n)


@pytest.fixture(scope="module")
def client() -> compiler.WorkerClient:
    made = compiler.WorkerClient(idle_seconds=0)
    yield made
    made.close()


def run_loaded(kernel: cpu.Kernel, address: int, x: np.ndarray) -> list[np.ndarray]:
    outputs = [np.empty(aval.shape, aval.dtype) for aval in kernel.out_avals]
    compiled = cpu.CompiledKernel(kernel, "", address, "compiled", 0.0)
    compiled([x], outputs)
    return outputs


def test_the_worker_emits_the_same_object_code_as_llvm_in_this_process(client: compiler.WorkerClient) -> None:
    here = cpu.host_target("inprocess")
    assert client.describe() == here.description, "the worker targets the host CPU exactly as this process"
    source = render_llvm(libm_kernel())
    for level in (0, 3):
        assert client.compile(source, level) == here.compile_alone(source, level)


def test_loaded_object_code_computes_what_mcjit_and_the_evaluator_compute(client: compiler.WorkerClient) -> None:
    kernel = libm_kernel()
    object_code = client.compile(render_llvm(kernel), 3)
    assert "asinhf" in compiler.undefined_symbols(object_code)
    memory, address = compiler.load_object(object_code, llvm_function_name(kernel))
    engine, mcjit_address = cpu.host_target("inprocess").load(object_code, llvm_function_name(kernel))
    x = np.linspace(-3, 3, 1000, dtype=np.float32)
    ours, theirs = run_loaded(kernel, address, x), run_loaded(kernel, mcjit_address, x)
    for a, b, want in zip(ours, theirs, evaluate_kernel(kernel, [x])):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(a, want, rtol=1e-6, atol=1e-7)
    memory.free()
    assert memory.size == 0
    del engine


@pytest.mark.parametrize("mode", ["worker", "inprocess"])
def test_both_compilers_run_kernels_and_share_the_disk_cache(mode: str, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCGRAD_COMPILER", mode)
    device = cpu.CPUDevice(cache_dir=tmp_path)
    kernels = [libm_kernel(f"asinh_{mode}"), reduction_kernel(f"sum_{mode}", "sum", np.dtype(np.float32), (3, 50, 7))]
    compiled = device.compile_many(kernels)
    assert [c.origin for c in compiled] == ["compiled", "compiled"]
    x = np.linspace(-2, 2, 1000, dtype=np.float32)
    for got, want in zip(run_loaded(kernels[0], compiled[0].address, x), evaluate_kernel(kernels[0], [x])):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    values = np.random.default_rng(0).standard_normal((3, 50, 7)).astype(np.float32)
    out = np.empty(kernels[1].out_avals[0].shape, np.float32)
    compiled[1]([values], [out])
    np.testing.assert_allclose(out, evaluate_kernel(kernels[1], [values])[0], rtol=1e-5, atol=1e-5)
    other = "inprocess" if mode == "worker" else "worker"
    monkeypatch.setenv("FUNCGRAD_COMPILER", other)  # one disk cache serves both: the same object code
    again = cpu.CPUDevice(cache_dir=tmp_path).compile(kernels[0])
    assert again.origin == "disk"
    for got, want in zip(run_loaded(kernels[0], again.address, x), evaluate_kernel(kernels[0], [x])):
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)


def test_an_llvm_error_comes_back_and_the_worker_keeps_serving(client: compiler.WorkerClient) -> None:
    with pytest.raises(RuntimeError, match="undefined_thing"):
        client.compile("define void @f() {\n  ret i32 %undefined_thing\n}\n")
    pid = client.pid()
    assert client.compile(render_llvm(libm_kernel("after_error")), 0)[:4] == b"\x7fELF"
    assert client.pid() == pid


def test_a_killed_worker_is_started_again() -> None:
    made = compiler.WorkerClient(idle_seconds=0)
    source = render_llvm(libm_kernel("after_kill"))
    first = made.compile(source, 0)
    pid = made.pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert made.compile(source, 0) == first
    assert made.starts == 2 and made.pid() != pid
    made.close()


def test_a_worker_that_dies_twice_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    send = compiler._Worker.send

    def send_and_die(self: compiler._Worker, number: int, kind: int, payload: bytes) -> None:
        send(self, number, kind, payload)
        os.kill(self.process.pid, signal.SIGKILL)

    monkeypatch.setattr(compiler._Worker, "send", send_and_die)
    made = compiler.WorkerClient(idle_seconds=0)
    with pytest.raises(RuntimeError, match=r"compiler worker exited with code -9 twice .*FUNCGRAD_COMPILER=inprocess"):
        made.compile(render_llvm(libm_kernel("doomed")), 0)
    assert made.starts == 2


def test_an_idle_worker_exits_and_the_next_request_starts_one() -> None:
    made = compiler.WorkerClient(idle_seconds=0.2)
    source = render_llvm(libm_kernel("idle"))
    made.compile(source, 0)
    process = made.worker.process if made.worker else None
    assert process is not None
    process.wait(timeout=10)  # it exits by itself once idle
    assert made.pid() is None
    made.compile(source, 0)
    assert made.starts == 2
    made.close()


def test_a_forked_child_gets_its_own_worker(client: compiler.WorkerClient) -> None:
    source = render_llvm(libm_kernel("forked"))
    expected = client.compile(source, 0)
    pid = client.pid()
    child = os.fork()
    if child == 0:  # the child: compile with a worker of its own, then leave without cleanup
        ok = client.compile(source, 0) == expected and client.pid() not in (None, pid)
        os._exit(0 if ok else 1)
    _, status = os.waitpid(child, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert client.pid() == pid and client.compile(source, 0) == expected, "the parent's worker is untouched"


def test_the_loader_refuses_what_it_cannot_link(client: compiler.WorkerClient, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:
    kernel = libm_kernel("refused")
    object_code = client.compile(render_llvm(kernel), 0)
    with pytest.raises(compiler.UnsupportedObject, match="not a little-endian ELF64"):
        compiler.load_object(b"MZ" + object_code[2:], "refused")
    elf = compiler._Elf(object_code)
    offset = next(section[4] for section in elf.sections if section[1] == 4)  # the first RELA entry
    damaged = bytearray(object_code)
    info, = struct.unpack_from("<Q", damaged, offset + 8)
    struct.pack_into("<Q", damaged, offset + 8, (info >> 32 << 32) | 10)  # R_X86_64_32: not supported
    with pytest.raises(compiler.UnsupportedObject, match="relocation type 10"):
        compiler.load_object(bytes(damaged), llvm_function_name(kernel))
    with pytest.raises(RuntimeError, match="function no_such_function not found"):
        compiler.load_object(object_code, "no_such_function")
    monkeypatch.setattr(compiler, "symbol_address", lambda name: 0)
    with pytest.raises(RuntimeError, match="needs asinhf"):
        compiler.load_object(object_code, llvm_function_name(kernel))


def test_the_worker_target_falls_back_to_mcjit_for_objects_the_loader_refuses(
        monkeypatch: pytest.MonkeyPatch) -> None:
    kernel = libm_kernel("fallback")
    target = cpu.host_target("worker")
    object_code = target.compile(render_llvm(kernel), 0)

    def refuse(code: bytes, name: str) -> tuple[compiler.CodeMemory, int]:
        raise compiler.UnsupportedObject("refused for the test")

    monkeypatch.setattr(cpu_target, "load_object", refuse)
    engine, address = target.load(object_code, llvm_function_name(kernel))
    assert not isinstance(engine, compiler.CodeMemory)
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    np.testing.assert_allclose(run_loaded(kernel, address, x)[0], evaluate_kernel(kernel, [x])[0], rtol=1e-6)
    cpu.keep_engine(engine)


def test_unused_kernel_code_is_unmapped_by_the_next_load(client: compiler.WorkerClient) -> None:
    kernel = libm_kernel("freed")
    object_code = client.compile(render_llvm(kernel), 0)
    memory, address = compiler.load_object(object_code, llvm_function_name(kernel))
    handle = cpu.EngineHandle(memory)
    del handle
    assert memory in cpu._RETIRED_ENGINES and memory.size > 0
    cpu.host_target("worker").load(object_code, llvm_function_name(kernel))
    assert memory.size == 0 and not cpu._RETIRED_ENGINES


def test_compiler_mode_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCGRAD_COMPILER", "inprocess")
    assert cpu.compiler_mode() == "inprocess" and isinstance(cpu.host_target(), cpu.InProcessTarget)
    monkeypatch.setenv("FUNCGRAD_COMPILER", "worker")
    assert cpu.compiler_mode() == "worker" and isinstance(cpu.host_target(), cpu.WorkerTarget)
    monkeypatch.setenv("FUNCGRAD_COMPILER", "threads")
    with pytest.raises(ValueError, match=r"FUNCGRAD_COMPILER='threads' \(environment variable\): expected 'worker' "
                                         r"or 'inprocess'"):
        cpu.compiler_mode()
    monkeypatch.setattr(cpu_target, "worker_supported", lambda: False)
    monkeypatch.setenv("FUNCGRAD_COMPILER", "worker")
    assert cpu.compiler_mode() == "inprocess", "where the loader cannot run, LLVM stays in this process"


def test_a_training_process_never_loads_llvm_and_a_warm_one_starts_no_worker(tmp_path: Path) -> None:
    script = textwrap.dedent("""
        import sys, numpy as np, funcgrad as fg, funcgrad.numpy as fnp
        from funcgrad.devices import cpu
        x = fnp.asarray(np.linspace(-1, 1, 24, dtype=np.float32).reshape(4, 6))
        step = fg.jit(lambda w: fg.grad(lambda w: (fnp.tanh(w @ w.T) ** 2 + fnp.exp(w).sum()).sum())(w))
        print(step(x).numpy().round(5).tolist())
        maps = open("/proc/self/maps").read()
        starts = cpu.host_target().client.starts
        print("llvmlite.binding" in sys.modules, "libllvmlite" in maps, "libLLVM" in maps, starts)
    """)
    env = {**os.environ, "FUNCGRAD_CACHE": str(tmp_path), "PYTHONPATH": str(REPO)}
    for name in ("FUNCGRAD_COMPILER", "DEVICE", "FUNCGRAD_PLAN_CACHE"):
        env.pop(name, None)
    runs = [subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
            for _ in range(2)]
    for process in runs:
        assert process.returncode == 0, process.stderr
    (cold_values, cold_facts), (warm_values, warm_facts) = (p.stdout.splitlines() for p in runs)
    assert warm_values == cold_values
    assert cold_facts == "False False False 1", "LLVM ran in the worker only"
    assert warm_facts == "False False False 0", "a warm process loads its plan's object code without the worker"
    assert list((tmp_path / "host").glob("*.json")), "the worker's host description is kept for the next process"


def test_the_host_description_is_read_back_without_a_worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCGRAD_CACHE", str(tmp_path))
    described = cpu.WorkerTarget()
    assert described.fingerprint == cpu.host_target("inprocess").fingerprint
    assert described.client.starts == 0, "the disk caches' fingerprint is read without a worker"
    assert described.description == cpu.host_target("inprocess").description
    assert described.client.starts == 1
    described.client.close()
    fresh = cpu.WorkerTarget()
    assert fresh.description == described.description and fresh.client.starts == 0
    path = cpu.host_description_path()
    assert path is not None and path.parent == tmp_path / "host"
    path.write_text("[1, 2]")  # damaged: asked again
    assert cpu.WorkerTarget().description == described.description


def test_a_hung_worker_is_killed_after_the_timeout_and_the_next_request_starts_one(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FUNCGRAD_COMPILER_TIMEOUT", "1")
    assert compiler.WorkerClient(idle_seconds=0).timeout_seconds == 1  # starts no worker
    monkeypatch.delenv("FUNCGRAD_COMPILER_TIMEOUT")
    made = compiler.WorkerClient(idle_seconds=0)
    assert made.timeout_seconds == 300
    source = render_llvm(libm_kernel("hung"))
    first = made.compile(source, 0)  # (a worker's start may take more than a second on a loaded machine)
    pid = made.pid()
    assert pid is not None
    made.timeout_seconds = 1
    os.kill(pid, signal.SIGSTOP)  # alive but never answering
    process = made.worker.process if made.worker else None
    with pytest.raises(RuntimeError, match=r"did not answer within 1 s and was killed .*FUNCGRAD_COMPILER_TIMEOUT"):
        made.compile(source, 0)
    assert process is not None and process.wait(timeout=10) == -signal.SIGKILL
    made.timeout_seconds = 300
    assert made.compile(source, 0) == first  # a new worker
    assert made.starts == 2 and made.pid() != pid
    made.close()
