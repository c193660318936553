"""Side-by-side benchmarks: funcgrad against NumPy, JAX (jit), PyTorch (eager) and tinygrad, in one process.

    python3 benchmarks/run.py [--quick] [--json out.json] [--only name,...] [--frameworks name,...]

Each row of the registry `WORKLOADS` makes its inputs with NumPy, computes a NumPy reference, and
has one `prepare` function per framework: it converts the inputs and returns a `step` that runs the
workload once and returns a realized result (funcgrad `.realize()`, JAX `block_until_ready()`).
For every workload the runner checks each framework's first result against the reference (`ok`),
warms up, then times repetitions round-robin across the frameworks (so machine noise hits all of
them alike), and reports the medians, funcgrad's time ratio to each peer, and whether the Compiler
issue's targets are met. A framework that uses up its time budget on a workload stops there; one
that cannot finish a single call within it is reported as `>budget` (not waited for: a matmul's
time is estimated from the GFLOP/s the framework reached on the previous matmul).

FUNCGRAD_CACHE points at a fresh temporary folder for the whole run, so every kernel funcgrad uses
is compiled during the run (first calls include compilation). The peers are imported only if
installed; one that is installed but cannot run here is listed with the reason.
"""

from __future__ import annotations

import argparse
import compileall
import dataclasses
import gc
import hashlib
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

# Before NumPy loads OpenBLAS: its idle threads otherwise spin for ~0.1 s after each call, taking a
# core from whichever framework runs next in this process (measured here: JAX's and PyTorch's matmul
# at half speed right after NumPy's). NumPy's own speed is unchanged. A value set by the caller stays.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")

import numpy as np  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parent.parent
FRAMEWORKS = ("funcgrad", "numpy", "jax", "torch", "tinygrad")
PEERS = FRAMEWORKS[1:]
DEFAULT_JSON = REPO_ROOT / "benchmarks" / "latest.json"
SETTLE_BELOW_S = 0.5  # repetitions cheaper than this are preceded by untimed ones (see Running.settles)
# ... for at least this long: PyTorch's OpenMP workers spin for about 8 ms after their last parallel
# region (measured here with /proc's schedstat), and a matmul_1024 call is 4-5 ms, so one untimed call
# left the timed one sharing a core with them (funcgrad right after PyTorch: 6-11 ms, against 4.7)
SETTLE_FOR_S = 0.025


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Problem sizes and timing policy of one run mode."""

    matmul: tuple[int, int, int] = (512, 1024, 2048)
    gelu: int = 1 << 24
    softmax: tuple[int, int] = (4096, 4096)
    layernorm: tuple[int, int] = (8192, 1024)
    dispatch_calls: int = 500         # calls per repetition of the dispatch workload
    mlp: tuple[int, ...] = (784, 512, 512, 10)
    batch: int = 256
    cnn_batch: int = 512
    repetitions: int = 11
    budget_s: float = 30.0            # time one framework may spend on one workload
    # the research rows (two sizes each; see research_workloads)
    transformer: tuple[tuple[int, int, int, int], ...] = ((8, 128, 256, 4), (4, 64, 384, 6))  # batch seq width heads
    attention: tuple[tuple[int, int, int, int], ...] = ((16, 8, 256, 64), (4, 12, 192, 32))  # batch heads seq head
    bmm: tuple[tuple[int, int, int, int, str], ...] = ((96, 64, 64, 64, "nn"), (12, 256, 192, 320, "nt"))  # b m k n
    hvp: tuple[tuple[int, tuple[int, ...]], ...] = ((256, (784, 512, 512, 10)), (96, (200, 1000, 300, 40)))
    strided_conv: tuple[tuple[int, int, int, int, int], ...] = ((32, 64, 32, 32, 128), (12, 24, 56, 56, 48))  # NCHW O
    dilated_conv: tuple[tuple[int, int, int, int, int], ...] = ((16, 32, 32, 32, 64), (6, 48, 40, 40, 40))
    per_example: tuple[tuple[int, tuple[int, ...]], ...] = ((64, (784, 256, 10)), (128, (300, 200, 100, 20)))


FULL = Sizes()
QUICK = Sizes(matmul=(16, 32, 64), gelu=1 << 10, softmax=(32, 48), layernorm=(64, 32), dispatch_calls=5,
              mlp=(20, 16, 16, 10), batch=8, cnn_batch=8, repetitions=2, budget_s=60.0,
              transformer=((2, 8, 16, 2), (1, 6, 24, 3)), attention=((2, 2, 8, 4), (1, 3, 6, 8)),
              bmm=((3, 4, 5, 6, "nn"), (2, 6, 4, 5, "nt")), hvp=((4, (6, 8, 8, 3)), (3, (5, 7, 4, 2))),
              strided_conv=((2, 3, 8, 8, 4), (1, 2, 9, 7, 3)), dilated_conv=((2, 3, 8, 8, 4), (1, 2, 9, 7, 3)),
              per_example=((4, (6, 8, 3)), (3, (5, 7, 4, 2))))


# --- frameworks -----------------------------------------------------------------------------------------

def _probe_tinygrad() -> None:
    from tinygrad import Tensor
    (Tensor.ones(2) + 1).realize()


PROBES: dict[str, Callable[[], None]] = {"tinygrad": _probe_tinygrad}


def available_frameworks(wanted: Sequence[str]) -> tuple[dict[str, str], dict[str, str]]:
    """({name: version} of the usable frameworks, {name: why not} of the others)."""
    versions: dict[str, str] = {}
    missing: dict[str, str] = {}
    for name in wanted:
        try:
            importlib.import_module(name)
            PROBES.get(name, lambda: None)()
        except ImportError:
            missing[name] = "not installed"
            continue
        except Exception as error:  # noqa: BLE001 - an unusable peer is reported, not fatal
            missing[name] = f"installed but cannot run here: {_one_line(error)}"
            continue
        versions[name] = getattr(sys.modules[name], "__version__", None) or importlib.metadata.version(name)
    return versions, missing


def to_numpy(value: Any) -> Any:
    """A framework's result (an array or a list/tuple of them) as NumPy arrays."""
    if isinstance(value, (list, tuple)):
        return [to_numpy(v) for v in value]
    if hasattr(value, "detach"):  # torch
        return value.detach().numpy()
    if hasattr(value, "numpy"):  # funcgrad, tinygrad
        return np.asarray(value.numpy())
    return np.asarray(value)


@dataclasses.dataclass
class Prepared:
    """What a prepare function returns (a bare callable is the `step`): `step` runs the workload once
    and returns a realized result; `snapshot` turns that result into the arrays checked against the
    reference."""

    step: Callable[[], Any]
    snapshot: Callable[[Any], Any] = to_numpy


# --- shared math: one definition, written against a NumPy-like namespace `xp` -----------------------------

GELU_C = float(np.sqrt(2.0 / np.pi))
LAYERNORM_EPS = 1e-5
ADAM = {"lr": 1e-3, "b1": 0.9, "b2": 0.999, "eps": 1e-8}


def gelu(xp: Any, x: Any) -> Any:
    """GELU, tanh form."""
    return 0.5 * x * (1.0 + xp.tanh(GELU_C * (x + 0.044715 * x * x * x)))


def softmax(xp: Any, x: Any) -> Any:
    shifted = x - xp.max(x, axis=-1, keepdims=True)
    e = xp.exp(shifted)
    return e / xp.sum(e, axis=-1, keepdims=True)


def layernorm(xp: Any, x: Any, weight: Any, bias: Any) -> Any:
    mean = xp.mean(x, axis=-1, keepdims=True)
    centered = x - mean
    var = xp.mean(centered * centered, axis=-1, keepdims=True)
    return centered / xp.sqrt(var + LAYERNORM_EPS) * weight + bias


def mlp_loss(xp: Any, params: list[Any], x: Any, onehot: Any) -> Any:
    """Mean softmax cross-entropy of a ReLU MLP; params is [w1, b1, w2, b2, ...], w of shape (in, out)."""
    h = x
    layers = len(params) // 2
    for i in range(layers):
        h = h @ params[2 * i] + params[2 * i + 1]
        if i < layers - 1:
            h = xp.maximum(h, 0.0)
    shifted = h - xp.max(h, axis=1, keepdims=True)
    log_probs = shifted - xp.log(xp.sum(xp.exp(shifted), axis=1, keepdims=True))
    return -xp.mean(xp.sum(onehot * log_probs, axis=1))


def make_train_step(xp: Any, value_and_grad: Callable[..., Any],
                    loss_fn: Callable[..., Any] | None = None) -> Callable[..., Any]:
    """A functional Adam train step: (params, m, v, step, x, y) -> (params, m, v, step, loss), of
    `loss_fn(params, x, y)` (default: the MLP's, y one-hot)."""
    lr, b1, b2, eps = ADAM["lr"], ADAM["b1"], ADAM["b2"], ADAM["eps"]
    loss_of = loss_fn or partial(mlp_loss, xp)

    def train_step(params: list[Any], m: list[Any], v: list[Any], step: Any, x: Any, onehot: Any) -> Any:
        loss, grads = value_and_grad(loss_of)(params, x, onehot)
        step = step + 1.0
        correction1 = 1.0 - b1 ** step
        correction2 = 1.0 - b2 ** step
        m = [b1 * mi + (1.0 - b1) * g for mi, g in zip(m, grads)]
        v = [b2 * vi + (1.0 - b2) * g * g for vi, g in zip(v, grads)]
        params = [p - lr * (mi / correction1) / (xp.sqrt(vi / correction2) + eps)
                  for p, mi, vi in zip(params, m, v)]
        return params, m, v, step, loss

    return train_step


def numpy_train_step(params: list[np.ndarray], m: list[np.ndarray], v: list[np.ndarray], step: float,
                     x: np.ndarray, onehot: np.ndarray) -> tuple[Any, ...]:
    """The same train step with a hand-written backward pass (the reference, and the NumPy peer)."""
    lr, b1, b2, eps = ADAM["lr"], ADAM["b1"], ADAM["b2"], ADAM["eps"]
    layers = len(params) // 2
    activations, pre_activations = [x], []
    h = x
    for i in range(layers):
        z = h @ params[2 * i] + params[2 * i + 1]
        pre_activations.append(z)
        h = np.maximum(z, 0) if i < layers - 1 else z
        activations.append(h)
    shifted = h - h.max(axis=1, keepdims=True)
    exp = np.exp(shifted)
    total = exp.sum(axis=1, keepdims=True)
    loss = -np.mean(np.sum(onehot * (shifted - np.log(total)), axis=1))
    dz = (exp / total - onehot) / x.shape[0]
    grads: list[np.ndarray] = [np.empty(0)] * len(params)
    for i in reversed(range(layers)):
        grads[2 * i] = activations[i].T @ dz
        grads[2 * i + 1] = dz.sum(axis=0)
        if i > 0:
            dz = (dz @ params[2 * i].T) * (pre_activations[i - 1] > 0)
    step += 1
    m = [b1 * mi + (1 - b1) * g for mi, g in zip(m, grads)]
    v = [b2 * vi + (1 - b2) * g * g for vi, g in zip(v, grads)]
    params = [p - lr * (mi / (1 - b1 ** step)) / (np.sqrt(vi / (1 - b2 ** step)) + eps)
              for p, mi, vi in zip(params, m, v)]
    return params, m, v, step, loss


# --- workload inputs and references -----------------------------------------------------------------

def _rng() -> np.random.Generator:
    return np.random.default_rng(0)


def matmul_inputs(n: int) -> dict[str, Any]:
    rng = _rng()
    return {"a": rng.standard_normal((n, n), dtype=np.float32), "b": rng.standard_normal((n, n), dtype=np.float32)}


def gelu_inputs(sizes: Sizes) -> dict[str, Any]:
    return {"x": _rng().standard_normal(sizes.gelu, dtype=np.float32) * 3}


def softmax_inputs(sizes: Sizes) -> dict[str, Any]:
    return {"x": _rng().standard_normal(sizes.softmax, dtype=np.float32) * 4}


def layernorm_inputs(sizes: Sizes) -> dict[str, Any]:
    rng = _rng()
    features = sizes.layernorm[1]
    return {"x": rng.standard_normal(sizes.layernorm, dtype=np.float32) * 2 + 1,
            "weight": rng.standard_normal(features, dtype=np.float32),
            "bias": rng.standard_normal(features, dtype=np.float32)}


def dispatch_inputs(sizes: Sizes) -> dict[str, Any]:
    return {"x": np.arange(8, dtype=np.float32)}


def mlp_inputs(sizes: Sizes) -> dict[str, Any]:
    rng = _rng()
    params = []
    for fan_in, fan_out in zip(sizes.mlp[:-1], sizes.mlp[1:]):
        params.append((rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32))
        params.append((rng.standard_normal(fan_out) * 0.1).astype(np.float32))
    labels = rng.integers(0, sizes.mlp[-1], sizes.batch).astype(np.int32)
    return {"params": params, "x": rng.standard_normal((sizes.batch, sizes.mlp[0]), dtype=np.float32),
            "labels": labels, "onehot": np.eye(sizes.mlp[-1], dtype=np.float32)[labels]}


# beautiful_mnist's CNN: (in, out, kernel) of its convolutions; BatchNorm after the 2nd and 4th
CNN_CONVS = ((1, 32, 5), (32, 32, 5), (32, 64, 3), (64, 64, 3))
BATCHNORM_EPS = 1e-5


def cnn_inputs(sizes: Sizes) -> dict[str, Any]:
    """Parameters in PyTorch's layout and order (conv w, b, [bn weight, bias], ..., linear w (10, 576), b),
    a batch of 28x28 images and their labels."""
    rng = _rng()

    def uniform(shape: tuple[int, ...], fan_in: int) -> np.ndarray:
        return (rng.uniform(-1.0, 1.0, shape) / np.sqrt(fan_in)).astype(np.float32)

    params = []
    for i, (c_in, c_out, k) in enumerate(CNN_CONVS):
        params += [uniform((c_out, c_in, k, k), c_in * k * k), uniform((c_out,), c_in * k * k)]
        if i % 2 == 1:
            params += [(1.0 + 0.1 * rng.standard_normal(c_out)).astype(np.float32),
                       (0.1 * rng.standard_normal(c_out)).astype(np.float32)]
    params += [uniform((10, 576), 576), uniform((10,), 576)]
    return {"params": params, "x": rng.random((sizes.cnn_batch, 1, 28, 28), dtype=np.float32),
            "labels": rng.integers(0, 10, sizes.cnn_batch).astype(np.int32)}


def _float64(inputs: dict[str, Any]) -> dict[str, Any]:
    return {k: v.astype(np.float64) if isinstance(v, np.ndarray) and v.dtype == np.float32 else v
            for k, v in inputs.items()}


def matmul_reference(inputs: dict[str, Any]) -> np.ndarray:
    return inputs["a"].astype(np.float64) @ inputs["b"].astype(np.float64)


def gelu_reference(inputs: dict[str, Any]) -> np.ndarray:
    return gelu(np, inputs["x"].astype(np.float64))


def softmax_reference(inputs: dict[str, Any]) -> np.ndarray:
    return softmax(np, inputs["x"].astype(np.float64))


def layernorm_reference(inputs: dict[str, Any]) -> np.ndarray:
    i = _float64(inputs)
    return layernorm(np, i["x"], i["weight"], i["bias"])


def dispatch_reference(inputs: dict[str, Any]) -> np.ndarray:
    return inputs["x"] * 2 + 1


def mlp_reference(inputs: dict[str, Any]) -> list[Any]:
    """[loss, params after one step..., Adam first moments...] from the initial state, in float64."""
    params = [p.astype(np.float64) for p in inputs["params"]]
    zeros = [np.zeros_like(p) for p in params]
    new_params, m, _, _, loss = numpy_train_step(params, zeros, zeros, 0.0, inputs["x"].astype(np.float64),
                                                 inputs["onehot"].astype(np.float64))
    return [loss, *new_params, *m]


CNN_PEER_FACTOR = 3.0  # a CNN result is also ok within this many times PyTorch float32's error


def cnn_reference(inputs: dict[str, Any]) -> dict[str, Any] | None:
    """The float64 step from PyTorch ([loss, params after one step..., Adam first moments...]) under
    each rule for a max-pool window's tied maxima (see cnn_compare), how far PyTorch's own float32
    step lands from its rule's, per part, and how far the moments may move where float32 cannot tell a
    window's largest values apart (cnn_pool_allowance); None (the check is skipped) where PyTorch is not
    installed: there is no hand-written CNN backward to compare with."""
    try:
        import torch
    except ImportError:
        return None
    arrays = (inputs["x"], inputs["labels"], *inputs["params"])
    key = hashlib.sha256(b"".join(np.ascontiguousarray(a).tobytes() for a in arrays)).hexdigest()
    if key not in _CNN_REFERENCES:  # cnn_first_step and cnn_step share their inputs: one reference (~30 s)
        _CNN_REFERENCES[key] = _cnn_reference(inputs, torch)
    return _CNN_REFERENCES[key]


_CNN_REFERENCES: dict[str, dict[str, Any]] = {}


def _cnn_reference(inputs: dict[str, Any], torch: Any) -> dict[str, Any]:
    values = {}
    for ties in ("first", "split"):
        exact = torch_cnn(inputs, torch.float64, ties)
        values[ties] = [np.asarray(a, dtype=np.float64) for a in exact.snapshot(exact.step())]
    single = torch_cnn(inputs, torch.float32)
    return {"values": values, "float32_errors": _cnn_errors(single.snapshot(single.step()), values["first"]),
            "allowance": cnn_pool_allowance(inputs)}


def _cnn_forward(params: list[Any], x: Any, stats: list[Any] | None = None,
                 forced: tuple[int, tuple[int, ...]] | None = None) -> dict[str, list[Any]]:
    """beautiful_mnist's CNN in torch.nn.functional: {"logits": [logits], "pre": the pre-activations of the
    ReLUs before the two BatchNorms, "pool_in"/"pool_out": the max-pools' inputs and outputs, "stats": the
    BatchNorms' batch (mean, var)}. With ``stats`` the BatchNorms use those; ``forced`` (site, index): that
    ReLU passes its gradient at that element whatever its sign (an element float32 may see positive)."""
    import torch
    F = torch.nn.functional
    w1, b1, w2, b2, g1, c1, w3, b3, w4, b4, g2, c2, wl, bl = params
    found: dict[str, list[Any]] = {"pre": [], "pool_in": [], "pool_out": [], "stats": []}

    def relu_norm_pool(z: Any, gamma: Any, beta: Any) -> Any:
        site = len(found["pre"])
        found["pre"].append(z)
        mask = (z > 0).to(z.dtype)
        if forced is not None and forced[0] == site:
            mask[forced[1]] = 1.0
        h = z * mask
        mean, var = (h.mean((0, 2, 3)), h.var((0, 2, 3), unbiased=False)) if stats is None else stats[site]
        found["stats"].append((mean, var))
        h = (h - mean[:, None, None]) / torch.sqrt(var[:, None, None] + BATCHNORM_EPS) * gamma[:, None, None] \
            + beta[:, None, None]
        found["pool_in"].append(h)
        found["pool_out"].append(F.max_pool2d(h, 2))
        return found["pool_out"][-1]

    h = relu_norm_pool(F.conv2d(F.relu(F.conv2d(x, w1, b1)), w2, b2), g1, c1)
    h = relu_norm_pool(F.conv2d(F.relu(F.conv2d(h, w3, b3)), w4, b4), g2, c2)
    found["logits"] = [h.flatten(1) @ wl.T + bl]
    return found


def cnn_pool_allowance(inputs: dict[str, Any], factor: float = 1.0) -> list[np.ndarray]:
    """How far each Adam first moment may lie from the float64 step's where float32 cannot take the
    float64 step's discrete decisions, at the two max-pools (ReLU, BatchNorm, then the pool), closer
    calls than ``factor`` times PyTorch float32's own largest error at that point:
    - a window whose largest input and another are that close: its gradient may go to either, or be shared;
    - a ReLU input that close to 0: float32 may pass a gradient through it (a window of zeros then has a
      strict maximum) or block one.
    Seen here: one such window moved conv4's weight gradient by 1%, and one ReLU input of conv2 that
    float32 saw positive moved its weight gradient by 3%; PyTorch float32 kept every such decision
    at this seed, JAX and funcgrad did not.

    The bound sums, over each such element b of a window whose float64 maximum is a, the moments'
    change (1 - b1) (|J_b^T g| + |J_a^T g|) for the parameters before the pool, g the pool's output
    gradient there and J_e the Jacobian of the pool's input at e (one sample's; the BatchNorm statistics
    held at the batch's, their share of one element's change being O(1/batch)); for a ReLU decision,
    J_b with that ReLU passing. Zero for the parameters after the pool."""
    import torch
    params64 = [torch.from_numpy(p).double().requires_grad_() for p in inputs["params"]]
    x64 = torch.from_numpy(inputs["x"]).double()
    full = _cnn_forward(params64, x64)
    for output in full["pool_out"]:
        output.retain_grad()
    torch.nn.functional.cross_entropy(full["logits"][0], torch.from_numpy(inputs["labels"]).long()).backward()
    with torch.no_grad():
        single = _cnn_forward([torch.from_numpy(p) for p in inputs["params"]], torch.from_numpy(inputs["x"]))
    stats = [(mean.detach(), var.detach()) for mean, var in full["stats"]]
    allowance = [np.zeros(p.shape) for p in inputs["params"]]
    plain: dict[int, dict[str, list[Any]]] = {}  # sample -> its forward without forcing, kept for reuse

    def add(sample: int, site: int, element: tuple[int, int, int], gradient: float,
            forced: tuple[int, tuple[int, ...]] | None = None) -> None:
        """|J^T g| at ``element`` (channel, row, column) of the pool's input, into the allowance."""
        if forced is None:
            found = plain.get(sample) or plain.setdefault(sample, _cnn_forward(params64, x64[sample:sample + 1], stats))
        else:
            found = _cnn_forward(params64, x64[sample:sample + 1], stats, forced)
        shift = torch.zeros(found["pool_in"][site].shape, dtype=torch.float64)
        shift[(0, element[0], element[1], element[2])] = gradient
        used = params64[:6] if site == 0 else params64[:12]
        changes = torch.autograd.grad(found["pool_in"][site], used, shift, retain_graph=forced is None)
        for i, change in enumerate(changes):
            allowance[i] += (1.0 - ADAM["b1"]) * np.abs(change.numpy())

    for site in range(2):
        values, pre = full["pool_in"][site].detach().numpy(), full["pre"][site].detach().numpy()
        pool_error = float(np.abs(single["pool_in"][site].numpy().astype(np.float64) - values).max())
        pre_error = float(np.abs(single["pre"][site].numpy().astype(np.float64) - pre).max())
        n, c, height, width = values.shape
        windows = values.reshape(n, c, height // 2, 2, width // 2, 2).transpose(0, 1, 2, 4, 3, 5)
        windows = windows.reshape(n, c, height // 2, width // 2, 4)
        top = windows.argmax(-1)
        gaps = windows.max(-1, keepdims=True) - windows
        near_zero = np.abs(pre) < factor * pre_error
        near_zero = near_zero.reshape(n, c, height // 2, 2, width // 2, 2).transpose(0, 1, 2, 4, 3, 5)
        near_zero = near_zero.reshape(windows.shape)
        cotangents = full["pool_out"][site].grad.numpy()
        close = (gaps > 0) & (gaps < factor * pool_error)
        for sample, channel, row, column, element in zip(*np.nonzero(close | near_zero)):
            g = float(cotangents[sample, channel, row, column])
            first = int(top[sample, channel, row, column])
            a = (channel, 2 * row + first // 2, 2 * column + first % 2)
            b = (channel, 2 * row + element // 2, 2 * column + element % 2)
            add(sample, site, a, g)
            add(sample, site, b, g, (site, (0, *b)) if near_zero[sample, channel, row, column, element] else None)
    return allowance


def _cnn_parts(arrays: list[Any]) -> tuple[list[Any], list[Any], list[Any]]:
    count = (len(arrays) - 1) // 2
    return arrays[:1], arrays[1:1 + count], arrays[1 + count:]


def _cnn_errors(actual: list[Any], expected: list[Any]) -> list[float]:
    """Largest absolute error of the loss, the parameters and Adam's first moments."""
    return [allclose(a, e, 0.0, 0.0)[1] for a, e in zip(_cnn_parts(actual), _cnn_parts(expected))]


def cnn_compare(actual: list[Any], expected: dict[str, Any] | None) -> tuple[bool | None, float | None]:
    """ok when the result matches the float64 step under either rule for tied maxima in a max-pool
    window: PyTorch's (the first gets the gradient) or JAX's and funcgrad's (they share it evenly,
    as jnp.max / torch.amax do). After ReLU + BatchNorm a window often holds equal values, and the
    rules' weight gradients then differ by percents (bias gradients not: a window's share stays in
    its channel). The error reported is the smaller one. (None, None) when there is no reference."""
    if expected is None:
        return None, None
    allowance = expected.get("allowance") or [np.zeros(np.shape(m)) for m in _cnn_parts(expected["values"]["first"])[2]]
    checks = [_cnn_check(actual, values, expected["float32_errors"], allowance)
              for values in expected["values"].values()]
    return any(ok for ok, _ in checks), min(error for _, error in checks)


def _cnn_check(actual: list[Any], values: list[Any], peer_errors: list[float],
               allowance: list[np.ndarray]) -> tuple[bool, float]:
    """Each part (loss, parameters, Adam's first moments) passes within mlp_compare's tolerances
    (moments within 1e-3 of their largest, plus each moment's ``allowance`` for max-pool windows float32
    cannot order: cnn_pool_allowance), or within CNN_PEER_FACTOR times PyTorch float32's own error on
    that part: float32 sums over the batch's 512x20x20 positions leave PyTorch float32 up to 2 lr from
    float64 in the parameters (Adam's first step moves each by +-lr, and the sign of a tiny gradient
    may flip)."""
    loss, params, moments = _cnn_parts(values)
    m_scale = max(float(np.abs(g).max()) for g in moments)
    tolerances = [(1e-4, 1e-5), (0.0, 2.1 * ADAM["lr"]), (1e-3, 1e-3 * m_scale)]
    ok, worst = True, 0.0
    for part, (mine, wanted, (rtol, atol), peer_error) in enumerate(zip(_cnn_parts(actual), (loss, params, moments),
                                                                         tolerances, peer_errors)):
        close, error = allclose(mine, wanted, rtol, atol)
        if part == 2 and not close:  # the moments, with each element's allowance added to its tolerance
            close = all(_within(a, e, rtol, atol + allowed) for a, e, allowed in zip(mine, wanted, allowance))
        ok = ok and (close or error <= CNN_PEER_FACTOR * peer_error)
        worst = max(worst, error)
    return ok, worst


def _within(actual: Any, expected: np.ndarray, rtol: float, atol: Any) -> bool:
    """|actual - expected| <= atol + rtol |expected| everywhere (atol may be an array)."""
    actual = np.asarray(actual, dtype=np.float64)
    return actual.shape == expected.shape and bool(np.all(np.abs(actual - expected) <= atol + rtol * np.abs(expected)))


def mlp_compare(actual: list[Any], expected: list[Any]) -> tuple[bool, float]:
    """Loss and gradients (through Adam's m = 0.1 g) tightly; parameters within 2.1 lr, since Adam's
    first step moves each by lr * g/|g| and float32 rounding may flip the sign of a tiny gradient."""
    count = (len(expected) - 1) // 2
    loss_ok, loss_err = allclose(actual[:1], expected[:1], 1e-4, 1e-5)
    params_ok, params_err = allclose(actual[1:1 + count], expected[1:1 + count], 0.0, 2.1 * ADAM["lr"])
    m_scale = max(float(np.abs(g).max()) for g in expected[1 + count:])
    m_ok, m_err = allclose(actual[1 + count:], expected[1 + count:], 1e-3, 1e-4 * m_scale)
    return loss_ok and params_ok and m_ok, max(loss_err, params_err, m_err)


def allclose(actual: Any, expected: Any, rtol: float, atol: float) -> tuple[bool, float]:
    """(all close, largest absolute error) over an array or a list of arrays."""
    pairs = zip(actual, expected) if isinstance(expected, list) else [(actual, expected)]
    ok, worst = True, 0.0
    for a, e in pairs:
        a, e = np.asarray(a, dtype=np.float64), np.asarray(e, dtype=np.float64)
        if a.shape != e.shape:
            return False, float("inf")
        worst = max(worst, float(np.max(np.abs(a - e), initial=0.0)))
        ok = ok and bool(np.allclose(a, e, rtol=rtol, atol=atol))
    return ok, worst


# --- funcgrad ------------------------------------------------------------------------------------------

def funcgrad_matmul(inputs: dict[str, Any]) -> Callable[[], Any]:
    import funcgrad as fg
    import funcgrad.numpy as fnp
    a, b = fnp.asarray(inputs["a"]), fnp.asarray(inputs["b"])
    matmul = fg.jit(lambda a, b: a @ b)
    return lambda: matmul(a, b).realize()


def funcgrad_gelu(inputs: dict[str, Any]) -> Callable[[], Any]:
    import funcgrad as fg
    import funcgrad.numpy as fnp
    x = fnp.asarray(inputs["x"])
    run = fg.jit(partial(gelu, fnp))
    return lambda: run(x).realize()


def funcgrad_softmax(inputs: dict[str, Any]) -> Callable[[], Any]:
    import funcgrad as fg
    import funcgrad.numpy as fnp
    x = fnp.asarray(inputs["x"])
    run = fg.jit(partial(softmax, fnp))
    return lambda: run(x).realize()


def funcgrad_layernorm(inputs: dict[str, Any]) -> Callable[[], Any]:
    import funcgrad as fg
    import funcgrad.numpy as fnp
    x, weight, bias = (fnp.asarray(inputs[k]) for k in ("x", "weight", "bias"))
    run = fg.jit(partial(layernorm, fnp))
    return lambda: run(x, weight, bias).realize()


def funcgrad_dispatch(inputs: dict[str, Any]) -> Callable[[], Any]:
    import funcgrad as fg
    import funcgrad.numpy as fnp
    x = fnp.asarray(inputs["x"])
    run = fg.jit(lambda x: x * 2 + 1)
    return lambda: run(x).realize()


class FuncgradMLP:
    """The functional train step under fg.jit; each call feeds the new state back in."""

    def __init__(self, inputs: dict[str, Any]) -> None:
        import funcgrad as fg
        import funcgrad.numpy as fnp
        self.fg, self.fnp = fg, fnp
        self.inputs = inputs
        self.state = self.initial_state()
        self.train_step = self.new_jit()
        self.x, self.onehot = fnp.asarray(inputs["x"]), fnp.asarray(inputs["onehot"])  # once, as JaxMLP does

    def initial_state(self) -> tuple[Any, ...]:
        fnp = self.fnp
        params = [fnp.asarray(p) for p in self.inputs["params"]]
        zeros = [fnp.zeros(p.shape, dtype=fnp.float32) for p in self.inputs["params"]]
        return params, zeros, list(zeros), fnp.asarray(np.float32(0))

    def new_jit(self) -> Callable[..., Any]:
        return self.fg.jit(make_train_step(self.fnp, self.fg.value_and_grad))

    def step(self) -> Any:
        params, m, v, count, loss = self.train_step(*self.state, self.x, self.onehot)
        for output in (*params, *m, *v, count, loss):  # the first realizes all outputs of the call
            output.realize()
        self.state = (params, m, v, count)
        return [loss, *params, *m]


def funcgrad_mlp_step(inputs: dict[str, Any]) -> Callable[[], Any]:
    return FuncgradMLP(inputs).step


def fresh_first_step(runner: Any) -> Callable[[], Any]:
    """A call that restarts ``runner`` (a functional step with ``state``, ``initial_state``, ``new_jit``)
    from its initial state with a fresh jit: trace + compile + the first step."""

    def first_step() -> Any:
        runner.state, runner.train_step = runner.initial_state(), runner.new_jit()
        return runner.step()

    return first_step


def funcgrad_mlp_first_call(inputs: dict[str, Any]) -> Callable[[], Any]:
    return fresh_first_step(FuncgradMLP(inputs))


class FuncgradCNN:
    """beautiful_mnist's stateful step (nn.Module layers + nn.optim.Adam, seed-style backward) under
    fg.jit, as examples/beautiful_mnist.py runs it; the model and optimiser are written back each call."""

    def __init__(self, inputs: dict[str, Any]) -> None:
        import funcgrad as fg
        self.fg, self.inputs = fg, inputs
        self.new_model()
        self.train_step = self.new_jit()

    def new_model(self) -> None:
        """Fresh layers holding the initial parameters, and a fresh Adam."""
        from funcgrad import Tensor, nn
        convs = [nn.Conv2d(c_in, c_out, k) for c_in, c_out, k in CNN_CONVS]
        norms = [nn.BatchNorm2d(32, eps=BATCHNORM_EPS), nn.BatchNorm2d(64, eps=BATCHNORM_EPS)]
        linear = nn.Linear(576, 10)
        owners: list[Any] = [convs[0], convs[1], norms[0], convs[2], convs[3], norms[1], linear]
        self.params = []
        for owner, (weight, bias) in zip(owners, zip(self.inputs["params"][::2], self.inputs["params"][1::2])):
            owner.weight, owner.bias = Tensor(weight), Tensor(bias)
            self.params += [owner.weight, owner.bias]
        self.model = nn.Sequential(convs[0], Tensor.relu, convs[1], Tensor.relu, norms[0], Tensor.max_pool2d,
                                   convs[2], Tensor.relu, convs[3], Tensor.relu, norms[1], Tensor.max_pool2d,
                                   partial(Tensor.flatten, start_dim=1), linear)
        self.opt = nn.optim.Adam(self.params, lr=ADAM["lr"], b1=ADAM["b1"], b2=ADAM["b2"], eps=ADAM["eps"])

    def new_jit(self) -> Callable[..., Any]:
        Tensor = self.fg.Tensor

        def train_step(model: Any, opt: Any, x: Any, labels: Any) -> Any:
            with Tensor.train():
                opt.zero_grad()
                loss = model(x).sparse_categorical_crossentropy(labels)
                loss.backward()
                opt.step()
            return loss

        return self.fg.jit(train_step)

    def step(self) -> Any:
        Tensor = self.fg.Tensor
        loss = self.train_step(self.model, self.opt, Tensor(self.inputs["x"]), Tensor(self.inputs["labels"]))
        return loss.realize()

    def snapshot(self, loss: Any) -> list[Any]:
        return [loss.numpy(), *(p.numpy() for p in self.params), *(slots[0].numpy() for slots in self.opt.state)]


def funcgrad_cnn_step(inputs: dict[str, Any]) -> Prepared:
    cnn = FuncgradCNN(inputs)
    return Prepared(cnn.step, cnn.snapshot)


def funcgrad_cnn_first_step(inputs: dict[str, Any]) -> Prepared:
    cnn = FuncgradCNN(inputs)

    def first_step() -> Any:
        cnn.new_model()
        cnn.train_step = cnn.new_jit()
        return cnn.step()

    return Prepared(first_step, cnn.snapshot)


# --- NumPy ---------------------------------------------------------------------------------------------

def numpy_matmul(inputs: dict[str, Any]) -> Callable[[], Any]:
    a, b = inputs["a"], inputs["b"]
    return lambda: a @ b


def numpy_gelu(inputs: dict[str, Any]) -> Callable[[], Any]:
    return partial(gelu, np, inputs["x"])


def numpy_softmax(inputs: dict[str, Any]) -> Callable[[], Any]:
    return partial(softmax, np, inputs["x"])


def numpy_layernorm(inputs: dict[str, Any]) -> Callable[[], Any]:
    return partial(layernorm, np, inputs["x"], inputs["weight"], inputs["bias"])


def numpy_dispatch(inputs: dict[str, Any]) -> Callable[[], Any]:
    x = inputs["x"]
    return lambda: x * 2 + 1


def numpy_mlp_step(inputs: dict[str, Any]) -> Callable[[], Any]:
    params = list(inputs["params"])
    state = (params, [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params], 0.0)

    def step() -> Any:
        nonlocal state
        params, m, v, count, loss = numpy_train_step(*state, inputs["x"], inputs["onehot"])
        state = (params, m, v, count)
        return [loss, *params, *m]

    return step


# --- JAX -----------------------------------------------------------------------------------------------

def jax_matmul(inputs: dict[str, Any]) -> Callable[[], Any]:
    import jax
    a, b = jax.device_put(inputs["a"]), jax.device_put(inputs["b"])
    matmul = jax.jit(lambda a, b: a @ b)
    return lambda: matmul(a, b).block_until_ready()


def jax_gelu(inputs: dict[str, Any]) -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp
    x = jax.device_put(inputs["x"])
    run = jax.jit(partial(gelu, jnp))
    return lambda: run(x).block_until_ready()


def jax_softmax(inputs: dict[str, Any]) -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp
    x = jax.device_put(inputs["x"])
    run = jax.jit(partial(softmax, jnp))
    return lambda: run(x).block_until_ready()


def jax_layernorm(inputs: dict[str, Any]) -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp
    x, weight, bias = (jax.device_put(inputs[k]) for k in ("x", "weight", "bias"))
    run = jax.jit(partial(layernorm, jnp))
    return lambda: run(x, weight, bias).block_until_ready()


def jax_dispatch(inputs: dict[str, Any]) -> Callable[[], Any]:
    import jax
    x = jax.device_put(inputs["x"])
    run = jax.jit(lambda x: x * 2 + 1)
    return lambda: run(x).block_until_ready()


class JaxMLP:
    """The same functional train step as funcgrad's, under jax.jit."""

    def __init__(self, inputs: dict[str, Any]) -> None:
        import jax
        import jax.numpy as jnp
        self.jax, self.jnp = jax, jnp
        self.inputs = inputs
        self.x, self.onehot = jax.device_put(inputs["x"]), jax.device_put(inputs["onehot"])
        self.state = self.initial_state()
        self.train_step = self.new_jit()

    def initial_state(self) -> tuple[Any, ...]:
        params = [self.jax.device_put(p) for p in self.inputs["params"]]
        zeros = [self.jnp.zeros_like(p) for p in params]
        return params, zeros, list(zeros), self.jnp.float32(0)

    def new_jit(self) -> Callable[..., Any]:
        return self.jax.jit(make_train_step(self.jnp, self.jax.value_and_grad))

    def step(self) -> Any:
        params, m, v, count, loss = self.jax.block_until_ready(self.train_step(*self.state, self.x, self.onehot))
        self.state = (params, m, v, count)
        return [loss, *params, *m]


def jax_mlp_step(inputs: dict[str, Any]) -> Callable[[], Any]:
    return JaxMLP(inputs).step


def jax_cnn_loss(params: list[Any], x: Any, labels: Any) -> Any:
    """beautiful_mnist's CNN and mean cross-entropy, in JAX (NCHW, PyTorch's weight layouts)."""
    import jax
    import jax.numpy as jnp
    c1, c1b, c2, c2b, g1, b1, c3, c3b, c4, c4b, g2, b2, w, b = params
    channel = lambda v: v[None, :, None, None]

    def conv(h: Any, weight: Any, bias: Any) -> Any:
        out = jax.lax.conv_general_dilated(h, weight, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return jax.nn.relu(out + channel(bias))

    def norm_pool(h: Any, gamma: Any, beta: Any) -> Any:
        mean = jnp.mean(h, axis=(0, 2, 3), keepdims=True)
        var = jnp.mean((h - mean) ** 2, axis=(0, 2, 3), keepdims=True)
        h = (h - mean) / jnp.sqrt(var + BATCHNORM_EPS) * channel(gamma) + channel(beta)
        n, c, height, width = h.shape
        return jnp.max(h.reshape(n, c, height // 2, 2, width // 2, 2), axis=(3, 5))

    h = norm_pool(conv(conv(x, c1, c1b), c2, c2b), g1, b1)
    h = norm_pool(conv(conv(h, c3, c3b), c4, c4b), g2, b2)
    log_probs = jax.nn.log_softmax(h.reshape(h.shape[0], -1) @ w.T + b)
    return -jnp.mean(jnp.take_along_axis(log_probs, labels[:, None], axis=1))


class JaxCNN(JaxMLP):
    """value_and_grad of jax_cnn_loss + the hand-written Adam, under jax.jit."""

    def __init__(self, inputs: dict[str, Any]) -> None:
        super().__init__({**inputs, "onehot": inputs["labels"]})  # the step's third argument: the labels

    def new_jit(self) -> Callable[..., Any]:
        return self.jax.jit(make_train_step(self.jnp, self.jax.value_and_grad, jax_cnn_loss))


def jax_cnn_step(inputs: dict[str, Any]) -> Callable[[], Any]:
    return JaxCNN(inputs).step


def jax_cnn_first_step(inputs: dict[str, Any]) -> Callable[[], Any]:
    return fresh_first_step(JaxCNN(inputs))


def jax_mlp_first_call(inputs: dict[str, Any]) -> Callable[[], Any]:
    return fresh_first_step(JaxMLP(inputs))


# --- PyTorch (eager) -------------------------------------------------------------------------------------

def torch_matmul(inputs: dict[str, Any]) -> Callable[[], Any]:
    import torch
    a, b = torch.from_numpy(inputs["a"]), torch.from_numpy(inputs["b"])
    return lambda: a @ b


def torch_gelu(inputs: dict[str, Any]) -> Callable[[], Any]:
    import torch
    x = torch.from_numpy(inputs["x"])
    return lambda: torch.nn.functional.gelu(x, approximate="tanh")


def torch_softmax(inputs: dict[str, Any]) -> Callable[[], Any]:
    import torch
    x = torch.from_numpy(inputs["x"])
    return lambda: torch.softmax(x, dim=-1)


def torch_layernorm(inputs: dict[str, Any]) -> Callable[[], Any]:
    import torch
    x, weight, bias = (torch.from_numpy(inputs[k]) for k in ("x", "weight", "bias"))
    return lambda: torch.nn.functional.layer_norm(x, weight.shape, weight, bias, eps=LAYERNORM_EPS)


def torch_dispatch(inputs: dict[str, Any]) -> Callable[[], Any]:
    import torch
    x = torch.from_numpy(inputs["x"])
    return lambda: x * 2 + 1


def torch_mlp_step(inputs: dict[str, Any]) -> Prepared:
    import torch
    params = inputs["params"]
    layers: list[torch.nn.Module] = []
    for i in range(len(params) // 2):
        linear = torch.nn.Linear(*params[2 * i].shape)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(params[2 * i].T.copy()))
            linear.bias.copy_(torch.from_numpy(params[2 * i + 1]))
        layers += [linear, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    optimizer = torch.optim.Adam(model.parameters(), lr=ADAM["lr"], betas=(ADAM["b1"], ADAM["b2"]), eps=ADAM["eps"])
    x, labels = torch.from_numpy(inputs["x"]), torch.from_numpy(inputs["labels"]).long()

    step = torch_step(model, optimizer, x, labels)

    def snapshot(loss: Any) -> list[Any]:
        """[loss, params..., m...] in the functional layout (weights as (in, out))."""
        linears = [layer for layer in model if isinstance(layer, torch.nn.Linear)]
        as_ours = lambda w: w.detach().numpy().T if w.ndim == 2 else w.detach().numpy()
        ps = [as_ours(p) for lin in linears for p in (lin.weight, lin.bias)]
        ms = [as_ours(optimizer.state[p]["exp_avg"]) for lin in linears for p in (lin.weight, lin.bias)]
        return [loss.numpy(), *ps, *ms]

    return Prepared(step, snapshot)


def torch_step(model: Any, optimizer: Any, x: Any, labels: Any) -> Callable[[], Any]:
    """One eager PyTorch training step: cross-entropy of ``model(x)``, backward, the optimiser's step."""
    import torch

    def step() -> Any:
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        optimizer.step()
        return loss.detach()

    return step


def torch_cnn(inputs: dict[str, Any], dtype: Any = None, ties: str = "first") -> Prepared:
    """beautiful_mnist's CNN as an eager nn.Sequential with torch.optim.Adam (also the float64 reference).
    `ties`: how max-pooling's gradient treats equal maxima: "first" (nn.MaxPool2d) or "split" evenly."""
    import torch
    dtype = dtype or torch.float32
    nn = torch.nn

    class SplitMaxPool(nn.Module):
        def forward(self, h: Any) -> Any:
            n, c, height, width = h.shape
            return h.reshape(n, c, height // 2, 2, width // 2, 2).amax(dim=(3, 5))  # amax shares ties evenly

    def pool() -> Any:
        return nn.MaxPool2d(2) if ties == "first" else SplitMaxPool()

    convs = [nn.Conv2d(c_in, c_out, k) for c_in, c_out, k in CNN_CONVS]
    model = nn.Sequential(convs[0], nn.ReLU(), convs[1], nn.ReLU(), nn.BatchNorm2d(32, eps=BATCHNORM_EPS),
                          pool(), convs[2], nn.ReLU(), convs[3], nn.ReLU(),
                          nn.BatchNorm2d(64, eps=BATCHNORM_EPS), pool(), nn.Flatten(), nn.Linear(576, 10))
    model = model.to(dtype).train()
    params = list(model.parameters())
    with torch.no_grad():
        for param, value in zip(params, inputs["params"], strict=True):
            param.copy_(torch.from_numpy(value))
    optimizer = torch.optim.Adam(params, lr=ADAM["lr"], betas=(ADAM["b1"], ADAM["b2"]), eps=ADAM["eps"])
    x, labels = torch.from_numpy(inputs["x"]).to(dtype), torch.from_numpy(inputs["labels"]).long()

    step = torch_step(model, optimizer, x, labels)

    def snapshot(loss: Any) -> list[Any]:
        """[loss, params..., m...] in the order of cnn_inputs."""
        return [loss.numpy(), *(p.detach().numpy() for p in params),
                *(optimizer.state[p]["exp_avg"].numpy() for p in params)]

    return Prepared(step, snapshot)


def torch_cnn_step(inputs: dict[str, Any]) -> Prepared:
    return torch_cnn(inputs)


def torch_cnn_first_step(inputs: dict[str, Any]) -> Prepared:
    prepared: Prepared | None = None

    def first_step() -> Any:
        nonlocal prepared
        prepared = torch_cnn(inputs)
        return prepared.step()

    return Prepared(first_step, lambda loss: prepared.snapshot(loss) if prepared else [])


# --- tinygrad ------------------------------------------------------------------------------------------

def _tinygrad_done(t: Any) -> Any:
    """``t`` computed: tinygrad's realize() only queues the work on its default device here (OpenCL on
    PoCL), which then ran during the other frameworks' timings (a 2048 matmul "took" 7 ms, and every
    framework measured in this process lost a core)."""
    from tinygrad import Device
    t.realize()
    Device[t.device].synchronize()
    return t


def tinygrad_matmul(inputs: dict[str, Any]) -> Callable[[], Any]:
    from tinygrad import Tensor
    a, b = Tensor(inputs["a"]).realize(), Tensor(inputs["b"]).realize()
    return lambda: _tinygrad_done(a @ b)


def tinygrad_gelu(inputs: dict[str, Any]) -> Callable[[], Any]:
    from tinygrad import Tensor
    x = Tensor(inputs["x"]).realize()
    return lambda: _tinygrad_done(x.gelu())


def tinygrad_softmax(inputs: dict[str, Any]) -> Callable[[], Any]:
    from tinygrad import Tensor
    x = Tensor(inputs["x"]).realize()
    return lambda: _tinygrad_done(x.softmax(axis=-1))


def tinygrad_layernorm(inputs: dict[str, Any]) -> Callable[[], Any]:
    from tinygrad import Tensor
    x, weight, bias = (Tensor(inputs[k]).realize() for k in ("x", "weight", "bias"))
    return lambda: _tinygrad_done(x.layernorm(axis=-1, eps=LAYERNORM_EPS) * weight + bias)


def tinygrad_dispatch(inputs: dict[str, Any]) -> Callable[[], Any]:
    from tinygrad import Tensor, TinyJit
    x = Tensor(inputs["x"]).realize()
    run = TinyJit(lambda x: (x * 2 + 1).realize())
    return lambda: _tinygrad_done(run(x))


def tinygrad_mlp_step(inputs: dict[str, Any]) -> Prepared:
    from tinygrad import Tensor, TinyJit, nn
    from tinygrad.helpers import Context
    params = inputs["params"]
    linears = []
    for i in range(len(params) // 2):
        linear = nn.Linear(*params[2 * i].shape)
        linear.weight, linear.bias = Tensor(params[2 * i].T.copy()), Tensor(params[2 * i + 1])
        linears.append(linear)
    weights: list[Any] = [t for lin in linears for t in (lin.weight, lin.bias)]
    optimizer = nn.optim.Adam(weights, lr=ADAM["lr"], b1=ADAM["b1"], b2=ADAM["b2"], eps=ADAM["eps"], fused=False)
    x, labels = Tensor(inputs["x"]).realize(), Tensor(inputs["labels"]).realize()

    def forward(x: Any) -> Any:
        for lin in linears[:-1]:
            x = lin(x).relu()
        return linears[-1](x)

    @TinyJit
    def train_step(x: Any, labels: Any) -> Any:
        with Context(TRAINING=1):
            optimizer.zero_grad()
            loss = forward(x).sparse_categorical_crossentropy(labels)
            loss.backward()
            return loss.realize(*optimizer.schedule_step())  # together: the loss of the old weights

    def snapshot(loss: Any) -> list[Any]:
        as_ours = lambda t: t.numpy().T if len(t.shape) == 2 else t.numpy()
        return [loss.numpy(), *(as_ours(w) for w in weights), *(as_ours(m) for m in optimizer.m)]

    return Prepared(lambda: _tinygrad_done(train_step(x, labels)), snapshot)


# --- work in a fresh process ---------------------------------------------------------------------------

RSS_STEPS = 50


def run_child(*args: str, env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run this script with `args` in a new Python process; its last stdout line is a JSON object."""
    process = subprocess.run([sys.executable, str(Path(__file__).resolve()), *args], capture_output=True, text=True,
                             timeout=600, env={**os.environ, **(env or {})})
    if process.returncode != 0:
        raise RuntimeError(f"child {' '.join(args)} failed: {_one_line(Exception(process.stderr[-600:]))}")
    result: dict[str, Any] = json.loads(process.stdout.strip().splitlines()[-1])
    return result


def peak_rss_in_child(framework: str, inputs: dict[str, Any]) -> Prepared:
    """`RSS_STEPS` mlp_step calls of `framework` alone in a new process (peak RSS is per process);
    funcgrad with an empty FUNCGRAD_CACHE, so its compiler's memory counts as JAX's does."""
    def step() -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="funcgrad-bench-rss-") as cache:
            return run_child("--rss-child", framework, *(["--quick"] if inputs["quick"] else []),
                             env={"FUNCGRAD_CACHE": cache})
    return Prepared(step, lambda result: result)


def peak_rss_mb() -> float:
    """This process's peak resident set size in MB of 2^20 bytes: VmHWM, which starts afresh at exec
    (ru_maxrss does not on Linux: a child started by a big process reports the parent's peak)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_child(framework: str, sizes: Sizes) -> dict[str, Any]:
    """In the child: the MLP step `RSS_STEPS` times, then the peak RSS, then (after reading it, so
    the float64 reference does not count) the first step's check."""
    inputs = mlp_inputs(sizes)
    prepared = globals()[f"{framework}_mlp_step"](inputs)
    prepared = prepared if isinstance(prepared, Prepared) else Prepared(prepared)
    first = [np.array(a, copy=True) for a in prepared.snapshot(prepared.step())]  # later steps update in place
    last: Any = None
    for _ in range(RSS_STEPS - 1):
        last = prepared.step()
    peak_mb = peak_rss_mb()
    ok, max_error = mlp_compare(first, mlp_reference(inputs))
    # the later steps must train too (a NaN from step 3 on once passed the first step's check)
    finite = last is None or all(np.isfinite(np.asarray(a, np.float64)).all() for a in prepared.snapshot(last))
    return {"peak_mb": peak_mb, "ok": ok and finite, "max_error": max_error if finite else float("nan")}


FIRST_STEP_CHILDREN = {"mlp_first_call": ("mlp", "funcgrad_mlp_first_call"),
                       "cnn_first_step": ("cnn", "funcgrad_cnn_first_step")}


def first_step_child(workload: str, sizes: Sizes) -> dict[str, Any]:
    """In the child: funcgrad's first step of `workload` (as its row times it), and where the time
    went (funcgrad.lower.plan.PHASE_SECONDS / PHASE_COUNTS)."""
    from funcgrad.lower import plan
    kind, prepare = FIRST_STEP_CHILDREN[workload]
    inputs = mlp_inputs(sizes) if kind == "mlp" else cnn_inputs(sizes)
    prepared = globals()[prepare](inputs)
    step = prepared.step if isinstance(prepared, Prepared) else prepared
    plan.reset_phases()
    started = time.perf_counter()
    step()
    return {"seconds": time.perf_counter() - started, "phases": dict(plan.PHASE_SECONDS),
            "counts": dict(plan.PHASE_COUNTS)}


def first_steps_in_fresh_processes(names: Sequence[str], sizes: Sizes) -> dict[str, dict[str, Any]]:
    """Each first-step workload in a new process twice, sharing one empty FUNCGRAD_CACHE: cold (it
    compiles everything), then warm (the plan and kernel caches from the first process). --quick
    does the MLP only (a cold CNN compiles ~100 kernels: too slow for a smoke test)."""
    figures: dict[str, dict[str, Any]] = {}
    for name in names:
        if sizes == QUICK and name == "cnn_first_step":
            continue
        with tempfile.TemporaryDirectory(prefix="funcgrad-bench-first-") as cache:
            args = ["--first-step-child", name, *(["--quick"] if sizes == QUICK else [])]
            try:
                figures[name] = {state: run_child(*args, env={"FUNCGRAD_CACHE": cache}) for state in ("cold", "warm")}
            except (RuntimeError, subprocess.TimeoutExpired, ValueError) as error:
                figures[name] = {"error": _one_line(error)}
    return figures


def phases_text(figure: dict[str, Any]) -> str:
    """One first step's time and its breakdown, as DEBUG=2 words it."""
    ms, counts = {k: v * 1e3 for k, v in figure["phases"].items()}, figure["counts"]
    return (f"{figure['seconds']:.3f} s = trace {ms['trace']:.0f} + schedule {ms['schedule']:.0f} + optimize "
            f"{ms.get('optimize', 0.0):.0f} + render {ms['render']:.0f} + llvm {ms['llvm']:.0f} ms "
            f"({counts['kernels_compiled']} compiled, {counts['kernels_from_disk']} from disk) + plan cache "
            f"load {ms['plan_load']:.0f} / store {ms['plan_store']:.0f} ms ({counts['plans_built']} built, "
            f"{counts['plans_loaded']} loaded) + the rest {figure['seconds'] * 1e3 - sum(ms.values()):.0f} ms")


def format_first_steps(figures: dict[str, dict[str, Any]]) -> str:
    lines = ["funcgrad's first step in a fresh process (one empty FUNCGRAD_CACHE: cold, then warm from it):"]
    for name, figure in figures.items():
        if "error" in figure:
            lines.append(f"  {name}: ERROR {figure['error']}")
            continue
        lines.append(f"  {name + '_cold':<22} {phases_text(figure['cold'])}")
        lines.append(f"  {name + '_warm':<22} {phases_text(figure['warm'])}")
    return "\n".join(lines)


# --- research workloads: one definition against a framework's `Ops`, for funcgrad, JAX and PyTorch --------
#
# Each of these rows writes its math once (against `Ops.xp`, a NumPy-like namespace, and the framework's
# transforms), so funcgrad, JAX and PyTorch run the same program; the float64 reference is that program
# under PyTorch in float64 (torch.func for the transforms), None where PyTorch is not installed. PyTorch
# runs eagerly (torch.func); torch.compile is not measured: its first compile of these steps takes
# tens of seconds per shape on this 2-core machine, longer than the rest of a row.

class TorchNumpy:
    """The few NumPy-style functions the research rows use, over torch tensors (reductions take axis/keepdims)."""

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        for name in ("exp", "tanh", "sqrt", "log", "swapaxes", "matmul", "einsum", "sum", "mean"):
            setattr(self, name, getattr(torch, name))

    def maximum(self, x: Any, y: Any) -> Any:
        return self.torch.clamp(x, min=y) if isinstance(y, (int, float)) else self.torch.maximum(x, y)

    def max(self, x: Any, axis: Any = None, keepdims: bool = False) -> Any:
        return self.torch.amax(x, dim=axis, keepdim=keepdims)


@dataclasses.dataclass(frozen=True)
class Ops:
    """A framework, as the research rows use it."""

    xp: Any                                       # NumPy-like namespace
    asarray: Callable[[np.ndarray], Any]          # a NumPy input on the framework's device, in its float type
    jit: Callable[[Callable[..., Any]], Callable[..., Any]]
    value_and_grad: Callable[..., Any]            # (fn, argnums) -> (value, grads), as JAX's
    grad: Callable[..., Any]
    vmap: Callable[..., Any]                      # (fn, in_axes)
    jvp: Callable[..., Any]                       # (fn, primals, tangents) -> (out, tangent out)
    conv: Callable[..., Any]                      # (x NCHW, w OIHW, stride, [(lo, hi)] pads, dilation)
    done: Callable[[Any], Any]                    # the result computed (realized / blocked on)


def funcgrad_ops() -> Ops:
    import funcgrad as fg
    import funcgrad.numpy as fnp

    def done(tree: Any) -> Any:
        for leaf in fg.tree.leaves(tree):
            leaf.realize()
        return tree

    return Ops(fnp, fnp.asarray, fg.jit, fg.value_and_grad, fg.grad, fg.vmap, fg.jvp,
               lambda x, w, stride, pads, dilation: fg.lax.conv_general_dilated(x, w, stride, pads,
                                                                                  rhs_dilation=dilation), done)


def jax_ops() -> Ops:
    import jax
    import jax.numpy as jnp
    return Ops(jnp, jax.device_put, jax.jit, jax.value_and_grad, jax.grad, jax.vmap, jax.jvp,
               lambda x, w, stride, pads, dilation: jax.lax.conv_general_dilated(
                   x, w, stride, pads, rhs_dilation=dilation, dimension_numbers=("NCHW", "OIHW", "NCHW")),
               jax.block_until_ready)


def torch_ops(dtype: Any = None) -> Ops:
    import torch
    import torch.func
    dtype = dtype or torch.float32

    def value_and_grad(fn: Callable[..., Any], argnums: Any = 0) -> Callable[..., Any]:
        with_value = torch.func.grad_and_value(fn, argnums)
        return lambda *args: tuple(reversed(with_value(*args)))

    def conv(x: Any, w: Any, stride: Any, pads: Any, dilation: Any) -> Any:
        assert all(lo == hi for lo, hi in pads), pads
        return torch.nn.functional.conv2d(x, w, stride=tuple(stride), padding=tuple(lo for lo, _ in pads),
                                          dilation=tuple(dilation))

    return Ops(TorchNumpy(torch), lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dtype), lambda fn: fn,
               value_and_grad, torch.func.grad, lambda fn, in_axes=0: torch.func.vmap(fn, in_dims=in_axes),
               torch.func.jvp, conv, lambda tree: tree)


def torch_float64_reference(build: Callable[[Ops, dict[str, Any]], Callable[[], Any]],
                            inputs: dict[str, Any]) -> Any:
    """``build``'s first result under PyTorch in float64, as NumPy float64; None without PyTorch."""
    try:
        import torch
    except ImportError:
        return None
    return to_numpy(build(torch_ops(torch.float64), inputs)())


def scaled_compare(rtol: float) -> Callable[[Any, Any], tuple[bool | None, float | None]]:
    """ok when every array is within ``rtol`` times its own largest reference magnitude (a float32
    program's error grows with the values it sums, not with each element); the error reported is the
    largest such relative error. (None, None) without a reference."""
    def compare(actual: Any, expected: Any) -> tuple[bool | None, float | None]:
        if expected is None:
            return None, None
        pairs = list(zip(actual, expected)) if isinstance(expected, list) else [(actual, expected)]
        if isinstance(expected, list) and len(actual) != len(expected):
            return False, float("inf")
        worst = 0.0
        for a, e in pairs:
            a, e = np.asarray(a, dtype=np.float64), np.asarray(e, dtype=np.float64)
            if a.shape != e.shape:
                return False, float("inf")
            worst = max(worst, float(np.max(np.abs(a - e), initial=0.0)) / max(float(np.max(np.abs(e), initial=0.0)),
                                                                               1e-30))
        return worst <= rtol, worst
    return compare


def research_prepare(build: Callable[[Ops, dict[str, Any]], Callable[[], Any]], framework: str,
                     inputs: dict[str, Any]) -> Callable[[], Any]:
    return build({"funcgrad": funcgrad_ops, "jax": jax_ops, "torch": torch_ops}[framework](), inputs)


# transformer: a pre-LayerNorm encoder (causal self-attention + GELU MLP, width 4x), then a final
# LayerNorm; loss: mean squared error to a target; one step: value_and_grad + SGD, returning the new
# parameters, the loss and the gradients (checked against the reference: the loss and gradients)
TRANSFORMER_LAYERS = 2
TRANSFORMER_LR = 0.1


def transformer_inputs(config: tuple[int, int, int, int]) -> dict[str, Any]:
    batch, seq, width, heads = config
    rng = _rng()
    dense = lambda fan_in, fan_out: (rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32)
    near = lambda base, n: (base + 0.1 * rng.standard_normal(n)).astype(np.float32)
    params = []
    for _ in range(TRANSFORMER_LAYERS):
        params += [near(1.0, width), near(0.0, width), dense(width, 3 * width), dense(width, width),
                   near(1.0, width), near(0.0, width), dense(width, 4 * width), near(0.0, 4 * width),
                   dense(4 * width, width), near(0.0, width)]
    params += [near(1.0, width), near(0.0, width)]
    mask = np.where(np.tril(np.ones((seq, seq), dtype=bool)), 0.0, -1e9).astype(np.float32)
    return {"params": params, "x": rng.standard_normal((batch, seq, width), dtype=np.float32),
            "target": rng.standard_normal((batch, seq, width), dtype=np.float32), "mask": mask, "heads": heads}


def transformer_loss(xp: Any, heads: int, params: list[Any], x: Any, target: Any, mask: Any) -> Any:
    batch, seq, width = x.shape
    head = width // heads

    def split(z: Any) -> Any:  # (batch, seq, width) -> (batch, heads, seq, head)
        return xp.swapaxes(z.reshape((batch, seq, heads, head)), 1, 2)

    for layer in range(TRANSFORMER_LAYERS):
        ln1_w, ln1_b, w_qkv, w_out, ln2_w, ln2_b, w1, b1, w2, b2 = params[10 * layer:10 * layer + 10]
        qkv = layernorm(xp, x, ln1_w, ln1_b) @ w_qkv
        q, k, v = (split(qkv[..., i * width:(i + 1) * width]) for i in range(3))
        weights = softmax(xp, (q @ xp.swapaxes(k, -1, -2)) * (1.0 / float(np.sqrt(head))) + mask)
        x = x + xp.swapaxes(weights @ v, 1, 2).reshape((batch, seq, width)) @ w_out
        x = x + gelu(xp, layernorm(xp, x, ln2_w, ln2_b) @ w1 + b1) @ w2 + b2
    out = layernorm(xp, x, params[-2], params[-1])
    return xp.mean((out - target) * (out - target))


def transformer_build(ops: Ops, inputs: dict[str, Any], fresh: bool = False) -> Callable[[], Any]:
    """The training step; ``fresh``: every call starts from the initial parameters with a new jit
    (trace + compile + run: the first call)."""
    loss_fn = partial(transformer_loss, ops.xp, inputs["heads"])

    def train_step(params: list[Any], x: Any, target: Any, mask: Any) -> Any:
        loss, grads = ops.value_and_grad(loss_fn)(params, x, target, mask)
        return [p - TRANSFORMER_LR * g for p, g in zip(params, grads)], loss, grads

    x, target, mask = (ops.asarray(inputs[k]) for k in ("x", "target", "mask"))
    initial = [ops.asarray(p) for p in inputs["params"]]
    state = {"params": initial, "step": ops.jit(train_step)}

    def step() -> Any:
        if fresh:
            state["params"], state["step"] = initial, ops.jit(train_step)
        params, loss, grads = ops.done(state["step"](state["params"], x, target, mask))
        state["params"] = params
        return [loss, *grads]

    return step


# softmax attention, forward and backward: the gradients of sum(attention(q, k, v) * cotangent)
def attention_inputs(config: tuple[int, int, int, int]) -> dict[str, Any]:
    rng = _rng()
    return {name: rng.standard_normal(config, dtype=np.float32) for name in ("q", "k", "v", "cotangent")}


def attention_build(ops: Ops, inputs: dict[str, Any]) -> Callable[[], Any]:
    xp = ops.xp
    scale = 1.0 / float(np.sqrt(inputs["q"].shape[-1]))

    def loss(q: Any, k: Any, v: Any, cotangent: Any) -> Any:
        return xp.sum((softmax(xp, (q @ xp.swapaxes(k, -1, -2)) * scale) @ v) * cotangent)

    run = ops.jit(ops.value_and_grad(loss, argnums=(0, 1, 2)))
    args = [ops.asarray(inputs[k]) for k in ("q", "k", "v", "cotangent")]

    def step() -> Any:
        value, grads = ops.done(run(*args))
        return [value, *grads]

    return step


# batched matmul: (batch, m, k) @ (batch, k, n), or with the second operand stored as (batch, n, k)
def bmm_inputs(config: tuple[int, int, int, int, str]) -> dict[str, Any]:
    batch, m, k, n, layout = config
    rng = _rng()
    b_shape = (batch, k, n) if layout == "nn" else (batch, n, k)
    return {"a": rng.standard_normal((batch, m, k), dtype=np.float32),
            "b": rng.standard_normal(b_shape, dtype=np.float32), "layout": layout}


def bmm_reference(inputs: dict[str, Any]) -> np.ndarray:
    a, b = inputs["a"].astype(np.float64), inputs["b"].astype(np.float64)
    return a @ (b if inputs["layout"] == "nn" else np.swapaxes(b, -1, -2))


def bmm_build(ops: Ops, inputs: dict[str, Any]) -> Callable[[], Any]:
    xp = ops.xp
    product = (lambda a, b: a @ b) if inputs["layout"] == "nn" else (lambda a, b: a @ xp.swapaxes(b, -1, -2))
    run = ops.jit(product)
    a, b = ops.asarray(inputs["a"]), ops.asarray(inputs["b"])
    return lambda: ops.done(run(a, b))


# Hessian-vector product (jvp of grad) of a tanh MLP's mean squared error, and per-example gradients
# (vmap of grad) of a ReLU MLP's softmax cross-entropy
def mlp_params(rng: np.random.Generator, widths: Sequence[int]) -> list[np.ndarray]:
    params = []
    for fan_in, fan_out in zip(widths[:-1], widths[1:]):
        params += [(rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)).astype(np.float32),
                   (0.1 * rng.standard_normal(fan_out)).astype(np.float32)]
    return params


def hvp_inputs(config: tuple[int, tuple[int, ...]]) -> dict[str, Any]:
    batch, widths = config
    rng = _rng()
    return {"params": mlp_params(rng, widths), "tangents": mlp_params(rng, widths),
            "x": rng.standard_normal((batch, widths[0]), dtype=np.float32),
            "y": rng.standard_normal((batch, widths[-1]), dtype=np.float32)}


def tanh_mlp_loss(xp: Any, params: list[Any], x: Any, y: Any) -> Any:
    h = x
    for i in range(0, len(params), 2):
        h = h @ params[i] + params[i + 1]
        if i + 2 < len(params):
            h = xp.tanh(h)
    return xp.mean((h - y) * (h - y))


def hvp_build(ops: Ops, inputs: dict[str, Any]) -> Callable[[], Any]:
    gradient = ops.grad(partial(tanh_mlp_loss, ops.xp))

    def hvp(params: list[Any], tangents: list[Any], x: Any, y: Any) -> Any:
        return ops.jvp(lambda p: gradient(p, x, y), (params,), (tangents,))[1]

    run = ops.jit(hvp)
    params, tangents = ([ops.asarray(p) for p in inputs[k]] for k in ("params", "tangents"))
    x, y = ops.asarray(inputs["x"]), ops.asarray(inputs["y"])
    return lambda: list(ops.done(run(params, tangents, x, y)))


def per_example_inputs(config: tuple[int, tuple[int, ...]]) -> dict[str, Any]:
    batch, widths = config
    rng = _rng()
    labels = rng.integers(0, widths[-1], batch)
    return {"params": mlp_params(rng, widths), "x": rng.standard_normal((batch, widths[0]), dtype=np.float32),
            "onehot": np.eye(widths[-1], dtype=np.float32)[labels]}


def per_example_build(ops: Ops, inputs: dict[str, Any]) -> Callable[[], Any]:
    xp = ops.xp

    def loss(params: list[Any], x: Any, onehot: Any) -> Any:  # one example: x (features,), onehot (classes,)
        return mlp_loss(xp, params, x[None], onehot[None])

    run = ops.jit(ops.vmap(ops.grad(loss), in_axes=(None, 0, 0)))
    params = [ops.asarray(p) for p in inputs["params"]]
    x, onehot = ops.asarray(inputs["x"]), ops.asarray(inputs["onehot"])
    return lambda: list(ops.done(run(params, x, onehot)))


# 3x3 convolution forward + backward: the gradients w.r.t. input and weight of sum(conv(x, w) * cotangent)
def conv_inputs(config: tuple[int, int, int, int, int], stride: int, dilation: int) -> dict[str, Any]:
    n, c, height, width, out = config
    rng = _rng()
    pad = dilation  # 'same' for stride 1
    out_h, out_w = ((size + 2 * pad - dilation * 2 - 1) // stride + 1 for size in (height, width))
    return {"x": rng.standard_normal((n, c, height, width), dtype=np.float32),
            "w": (rng.standard_normal((out, c, 3, 3)) / np.sqrt(9 * c)).astype(np.float32),
            "cotangent": rng.standard_normal((n, out, out_h, out_w), dtype=np.float32),
            "stride": stride, "dilation": dilation}


def conv_build(ops: Ops, inputs: dict[str, Any]) -> Callable[[], Any]:
    stride, dilation = inputs["stride"], inputs["dilation"]
    pads = [(dilation, dilation)] * 2

    def loss(x: Any, w: Any, cotangent: Any) -> Any:
        return ops.xp.sum(ops.conv(x, w, (stride, stride), pads, (dilation, dilation)) * cotangent)

    run = ops.jit(ops.value_and_grad(loss, argnums=(0, 1)))
    x, w, cotangent = (ops.asarray(inputs[k]) for k in ("x", "w", "cotangent"))

    def step() -> Any:
        value, grads = ops.done(run(x, w, cotangent))
        return [value, *grads]

    return step


def conv_flops(config: tuple[int, int, int, int, int], stride: int, dilation: int) -> float:
    """Forward + the two gradients: 3 products of the forward's size."""
    n, c, height, width, out = config
    out_h, out_w = ((size + 2 * dilation - dilation * 2 - 1) // stride + 1 for size in (height, width))
    return 3 * 2.0 * n * out * out_h * out_w * c * 9


RESEARCH_NOTES = {"funcgrad": "fg.jit", "jax": "jax.jit", "torch": "eager, torch.func (torch.compile not measured)"}


def research_workload(name: str, field: str, index: int, describe: Callable[[Any], str],
                      make_inputs: Callable[[Any], dict[str, Any]], build: Callable[[Ops, dict[str, Any]], Any],
                      reference: Callable[[dict[str, Any]], Any] | None = None, rtol: float = 1e-3,
                      **options: Any) -> Workload:
    """A row of `Sizes.<field>[index]`: inputs from ``make_inputs(config)``, every framework running
    ``build``, checked within ``rtol`` (scaled_compare) against ``reference`` (default: the same
    program under PyTorch float64). ``options`` go to Workload (unit, flops given the config, ...)."""
    config = lambda sizes: getattr(sizes, field)[index]
    flops = options.pop("flops", None)
    return Workload(
        name, lambda s: describe(config(s)), lambda s: make_inputs(config(s)),
        reference or partial(torch_float64_reference, build),
        {framework: partial(research_prepare, build, framework) for framework in ("funcgrad", "jax", "torch")},
        compare=scaled_compare(rtol), flops=(lambda s: flops(config(s))) if flops else None,
        target=options.pop("target", Target("jax", 1.0, higher_is_better=options.get("unit") == "GFLOP/s")),
        notes=options.pop("notes", RESEARCH_NOTES), **options)


def _transformer_text(c: Any) -> str:
    return f"2-layer pre-LN, batch {c[0]} seq {c[1]} width {c[2]} heads {c[3]}"


def _mlp_text(c: Any) -> str:
    return f"{'-'.join(map(str, c[1]))}, batch {c[0]}"


def _conv_text(stride: int, dilation: int) -> Callable[[Any], str]:
    return lambda c: f"{c[0]}x{c[1]}x{c[2]}x{c[3]} -> {c[4]}ch, 3x3 stride {stride} dilation {dilation}"


def research_workloads() -> list[Workload]:
    """The rows of the Performance-that-generalises issue, two sizes each (the sizes are Sizes fields)."""
    rows: list[Workload] = []
    for i in range(2):
        rows.append(research_workload(
            f"transformer_first_call_{i + 1}", "transformer", i, lambda c: "trace + compile + 1st step, " +
            _transformer_text(c), transformer_inputs, partial(transformer_build, fresh=True),
            reference=partial(torch_float64_reference, transformer_build), unit="s", first_call_only=True,
            notes={**RESEARCH_NOTES, "funcgrad": "fresh fg.jit, FUNCGRAD_CACHE holds only earlier rows' kernels",
                   "jax": "fresh jax.jit", "torch": "eager, no compilation"}))
    for i in range(2):
        rows.append(research_workload(f"transformer_step_{i + 1}", "transformer", i,
                                      lambda c: "value_and_grad + SGD, " + _transformer_text(c),
                                      transformer_inputs, transformer_build))
    for i in range(2):
        rows.append(research_workload(f"attention_{i + 1}", "attention", i,
                                      lambda c: f"fwd+bwd, batch {c[0]} heads {c[1]} seq {c[2]} head {c[3]}",
                                      attention_inputs, attention_build))
    for i in range(2):
        rows.append(research_workload(
            f"batched_matmul_{i + 1}", "bmm", i,
            lambda c: f"{c[0]} x ({c[1]}x{c[2]} @ {c[2]}x{c[3]})" + (", 2nd stored transposed" if c[4] == "nt" else ""),
            bmm_inputs, bmm_build, reference=bmm_reference, rtol=1e-5, unit="GFLOP/s",
            flops=lambda c: 2.0 * c[0] * c[1] * c[2] * c[3]))
    for i in range(2):
        rows.append(research_workload(f"hvp_mlp_{i + 1}", "hvp", i, lambda c: "jvp of grad, tanh " + _mlp_text(c),
                                      hvp_inputs, hvp_build))
    for kind, stride, dilation in (("strided", 2, 1), ("dilated", 1, 2)):
        for i in range(2):
            rows.append(research_workload(
                f"{kind}_conv_{i + 1}", f"{kind}_conv", i, _conv_text(stride, dilation),
                partial(conv_inputs, stride=stride, dilation=dilation), conv_build, unit="GFLOP/s",
                flops=partial(conv_flops, stride=stride, dilation=dilation)))
    for i in range(2):
        rows.append(research_workload(f"per_example_grads_{i + 1}", "per_example", i,
                                      lambda c: "vmap(grad), ReLU " + _mlp_text(c), per_example_inputs,
                                      per_example_build))
    return rows


# --- the registry ---------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Target:
    """An issue 7 (Performance) target: funcgrad's time at most `factor` x the peer's, or
    (`higher_is_better`) its rate at least `factor` x the peer's; with no peer, its value (seconds,
    or MB of peak RSS) under `factor`."""

    peer: str | None
    factor: float
    higher_is_better: bool = False

    def text(self, unit: str = "s") -> str:
        if self.peer is None:
            return f"{'peak RSS' if unit == 'MB' else 'time'} < {self.factor:g} {unit}"
        return (f"GFLOP/s >= {self.factor:g}x {self.peer}" if self.higher_is_better
                else f"time <= {self.factor:g}x {self.peer}")


@dataclasses.dataclass(frozen=True)
class Workload:
    """One row of the table: how to make its inputs and reference, and each framework's prepare."""

    name: str
    size: Callable[[Sizes], str]
    make_inputs: Callable[[Sizes], dict[str, Any]]
    reference: Callable[[dict[str, Any]], Any]
    prepare: dict[str, Callable[[dict[str, Any]], Any]]
    unit: str = "ms"                     # "ms", "us/call", "GFLOP/s" or "s"
    tolerance: tuple[float, float] = (2e-5, 1e-5)
    compare: Callable[[Any, Any], tuple[bool | None, float | None]] | None = None
    flops: Callable[[Sizes], float] | None = None
    calls_per_repetition: Callable[[Sizes], int] = lambda sizes: 1
    first_call_only: bool = False       # time the very first call, once, instead of repetitions
    measure: Callable[[Any], float] | None = None  # a first_call_only row's value from its output, not its time
    target: Target | None = None
    notes: dict[str, str] = dataclasses.field(default_factory=dict)


def matmul_workload(index: int, default_n: int) -> Workload:
    """The matmul of `sizes.matmul[index]` (named by its size in a full run)."""
    return Workload(
        f"matmul_{default_n}", lambda s: f"{s.matmul[index]}x{s.matmul[index]} @ same",
        lambda s: matmul_inputs(s.matmul[index]), matmul_reference, _by_framework("matmul"),
        unit="GFLOP/s", tolerance=(1e-4, 1e-3), flops=lambda s: 2.0 * s.matmul[index] ** 3,
        target=Target("jax", 1.0, higher_is_better=True))


def _by_framework(suffix: str) -> dict[str, Callable[[dict[str, Any]], Any]]:
    """{framework: its `<framework>_<suffix>` prepare function} for the frameworks that define one."""
    return {name: globals()[f"{name}_{suffix}"] for name in FRAMEWORKS if f"{name}_{suffix}" in globals()}


WORKLOADS: list[Workload] = [
    matmul_workload(0, 512),
    matmul_workload(1, 1024),
    matmul_workload(2, 2048),
    Workload("gelu", lambda s: f"{s.gelu} float32", gelu_inputs, gelu_reference, _by_framework("gelu"),
             tolerance=(1e-5, 1e-5), target=Target("jax", 0.5),
             notes={"torch": "F.gelu(approximate='tanh')", "tinygrad": "Tensor.gelu"}),
    Workload("softmax", lambda s: "x".join(map(str, s.softmax)) + ", last axis", softmax_inputs, softmax_reference,
             _by_framework("softmax"), tolerance=(1e-5, 1e-8), target=Target("jax", 0.5)),
    Workload("layernorm", lambda s: "x".join(map(str, s.layernorm)) + ", last axis, affine", layernorm_inputs,
             layernorm_reference, _by_framework("layernorm"), tolerance=(1e-4, 1e-4), target=Target("jax", 0.5)),
    Workload("dispatch", lambda s: "jitted x*2+1 on (8,)", dispatch_inputs, dispatch_reference,
             _by_framework("dispatch"), unit="us/call", calls_per_repetition=lambda s: s.dispatch_calls,
             target=Target("jax", 1.0),
             notes={"numpy": "plain x*2+1", "torch": "eager x*2+1", "tinygrad": "TinyJit"}),
    # before mlp_step: the first call must find no kernel compiled yet, on disk or in memory
    Workload("mlp_first_call", lambda s: "trace + compile + 1st step", mlp_inputs, mlp_reference,
             _by_framework("mlp_first_call"), unit="s", compare=mlp_compare, first_call_only=True,
             target=Target("jax", 0.5), notes={"funcgrad": "fresh fg.jit, empty FUNCGRAD_CACHE", "jax": "fresh jax.jit",
                    "numpy": "no compilation", "torch": "eager, no compilation", "tinygrad": "not measured"}),
    Workload("mlp_step", lambda s: "-".join(map(str, s.mlp)) + f", batch {s.batch}, Adam", mlp_inputs,
             mlp_reference, _by_framework("mlp_step"), compare=mlp_compare, target=Target("jax", 1.0),
             notes={"funcgrad": "value_and_grad + Adam in one fg.jit", "jax": "value_and_grad + Adam in one jax.jit",
                    "numpy": "hand-written backward", "torch": "nn.Linear + torch.optim.Adam",
                    "tinygrad": "TinyJit step, nn.optim.Adam"}),
    # before cnn_step, for the same reason; the MLP rows may have compiled some shared kernels (Adam's)
    Workload("cnn_first_step", lambda s: "trace + compile + 1st step", cnn_inputs, cnn_reference,
             _by_framework("cnn_first_step"), unit="s", compare=cnn_compare, first_call_only=True,
             target=Target(None, 2.0),
             notes={"funcgrad": "fresh fg.jit; FUNCGRAD_CACHE holds only earlier rows' kernels", "jax": "fresh jax.jit",
                    "numpy": "no CNN written for NumPy", "torch": "eager, no compilation",
                    "tinygrad": "no CNN written for tinygrad here"}),
    Workload("cnn_step", lambda s: f"beautiful_mnist CNN, batch {s.cnn_batch}, Adam", cnn_inputs, cnn_reference,
             _by_framework("cnn_step"), compare=cnn_compare, target=Target("torch", 1.0),
             notes={"funcgrad": "nn layers + nn.optim.Adam step in one fg.jit",
                    "jax": "value_and_grad + Adam in one jax.jit", "numpy": "no CNN written for NumPy",
                    "torch": "eager nn.Sequential + torch.optim.Adam", "tinygrad": "no CNN written for tinygrad here"}),
    Workload("mlp_peak_rss", lambda s: f"{RSS_STEPS} mlp_step steps, own process", lambda s: {"quick": s == QUICK},
             lambda inputs: None, {name: partial(peak_rss_in_child, name) for name in FRAMEWORKS}, unit="MB",
             compare=lambda result, _: (result["ok"], result["max_error"]), first_call_only=True,
             measure=lambda result: result["peak_mb"], target=Target(None, 100.0),
             notes={"funcgrad": "empty FUNCGRAD_CACHE: compiles everything; LLVM runs in the compiler "
                                "worker process (FUNCGRAD_COMPILER), whose own peak (~100 MB) is not counted"}),
    *research_workloads(),
]



# --- rnn_scan (issue 18, control flow): a tanh RNN through lax.scan, forward + backward -----------------------
# loss = mean(h_t^2 over all steps); gradients of W (hidden->hidden), U (input->hidden) and b. Two sizes
# (steps, batch, hidden); the loop must be compiled (funcgrad: a loop over the body's kernels in the plan).

RNN_SIZES = {"full": ((64, 32, 256), (128, 32, 128)), "quick": ((4, 2, 8), (6, 3, 4))}


def rnn_inputs(sizes: Sizes, index: int) -> dict[str, Any]:
    steps, batch, hidden = RNN_SIZES["quick" if sizes == QUICK else "full"][index]
    rng = _rng()
    scale = np.float32(1.0 / np.sqrt(hidden))
    return {"w": rng.standard_normal((hidden, hidden), np.float32) * scale,
            "u": rng.standard_normal((hidden, hidden), np.float32) * scale,
            "b": rng.standard_normal(hidden, np.float32) * np.float32(0.1),
            "xs": rng.standard_normal((steps, batch, hidden), np.float32),
            "h0": np.zeros((batch, hidden), np.float32)}


def rnn_reference(inputs: dict[str, Any], dtype: Any = np.float64) -> list[np.ndarray]:
    """(dW, dU, db) by backpropagation through time, written out (in float64: the reference)."""
    w, u, b, xs, h = (inputs[k].astype(dtype) for k in ("w", "u", "b", "xs", "h0"))
    states = [h]
    for x in xs:
        states.append(np.tanh(states[-1] @ w + x @ u + b))
    count = dtype(np.prod(xs.shape))
    dw, du, db, carry = np.zeros_like(w), np.zeros_like(u), np.zeros_like(b), np.zeros_like(h)
    for t in range(len(xs) - 1, -1, -1):
        dh = carry + dtype(2.0) * states[t + 1] / count
        dz = dh * (dtype(1.0) - states[t + 1] ** 2)
        dw += states[t].T @ dz
        du += xs[t].T @ dz
        db += dz.sum(axis=0)
        carry = dz @ w.T
    return [dw, du, db]


def _rnn_loss(xp: Any, scan: Callable[..., Any], w: Any, u: Any, b: Any, xs: Any, h0: Any) -> Any:
    def step(h: Any, x: Any) -> Any:
        h = xp.tanh(h @ w + x @ u + b)
        return h, h
    _, hs = scan(step, h0, xs)
    return xp.mean(hs * hs)


def funcgrad_rnn_scan(inputs: dict[str, Any]) -> Callable[[], Any]:
    import funcgrad as fg
    import funcgrad.numpy as fnp
    args = [fnp.asarray(inputs[k]) for k in ("w", "u", "b", "xs", "h0")]
    grad = fg.jit(fg.grad(partial(_rnn_loss, fnp, fg.lax.scan), argnums=(0, 1, 2)))
    return lambda: [g.realize() for g in grad(*args)]


def jax_rnn_scan(inputs: dict[str, Any]) -> Callable[[], Any]:
    import jax
    import jax.numpy as jnp
    args = [jax.device_put(inputs[k]) for k in ("w", "u", "b", "xs", "h0")]
    grad = jax.jit(jax.grad(partial(_rnn_loss, jnp, jax.lax.scan), argnums=(0, 1, 2)))
    return lambda: [g.block_until_ready() for g in grad(*args)]


def torch_rnn_scan(inputs: dict[str, Any]) -> Callable[[], Any]:
    import torch
    w, u, b = (torch.from_numpy(inputs[k]).requires_grad_() for k in ("w", "u", "b"))
    xs, h0 = torch.from_numpy(inputs["xs"]), torch.from_numpy(inputs["h0"])

    def step() -> Any:
        h, total = h0, 0.0
        for x in xs:  # eager: a Python loop, autograd through every step
            h = torch.tanh(h @ w + x @ u + b)
            total = total + (h * h).sum()
        return torch.autograd.grad(total / float(xs.numel()), (w, u, b))
    return step


def numpy_rnn_scan(inputs: dict[str, Any]) -> Callable[[], Any]:
    return lambda: rnn_reference(inputs, np.float32)


def rnn_workload(index: int) -> Workload:
    steps, batch, hidden = RNN_SIZES["full"][index]
    return Workload(f"rnn_scan_{steps}x{hidden}",
                    lambda s: "{} steps, batch {}, hidden {}: grad through lax.scan".format(
                        *RNN_SIZES["quick" if s == QUICK else "full"][index]),
                    lambda s: rnn_inputs(s, index), rnn_reference, _by_framework("rnn_scan"),
                    tolerance=(1e-3, 1e-5), target=Target("jax", 1.0),
                    notes={"funcgrad": "fg.jit(fg.grad(loss)), lax.scan", "jax": "jax.jit(jax.grad(loss)), lax.scan",
                           "numpy": "hand-written BPTT", "torch": "eager Python loop + autograd"})


WORKLOADS += [rnn_workload(0), rnn_workload(1)]


# --- random numbers (issue 18: threefry as kernels) ------------------------------------------------------
# One row per sampler and size, each a fresh key's samples; the frameworks' generators differ (torch's
# is not threefry), so a row checks its samples' moments, not their values (tests/front/test_random*.py
# check funcgrad's bits against jax.random's).

RANDOM_SIZES = {"full": (1 << 20, 1 << 22), "quick": (1 << 10, 1 << 12)}
RANDOM_P = 0.3  # bernoulli's probability


def _random_size(sizes: Sizes, index: int) -> int:
    return RANDOM_SIZES["quick" if sizes == QUICK else "full"][index]


def _random_moments(kind: str, actual: Any, expected: Any) -> tuple[bool, float]:
    """Mean and variance within 6 standard errors of the distribution's; the error is the mean's."""
    x = np.asarray(actual, dtype=np.float64).ravel()
    mean, var = {"normal": (0.0, 1.0), "uniform": (0.5, 1 / 12),
                 "bernoulli": (RANDOM_P, RANDOM_P * (1 - RANDOM_P))}[kind]
    error = abs(x.mean() - mean)
    fourth = {"normal": 3.0, "uniform": 1 / 80, "bernoulli": var * (1 - 3 * var)}[kind]  # central 4th moments
    ok = error <= 6 * np.sqrt(var / x.size) and abs(x.var() - var) <= 6 * np.sqrt((fourth - var**2) / x.size) + 1e-12
    return bool(ok and x.size == expected), float(error)


def _random_prepare(kind: str, index: int) -> dict[str, Callable[[dict[str, Any]], Any]]:
    def funcgrad_random(inputs: dict[str, Any]) -> Callable[[], Any]:
        import funcgrad as fg
        import funcgrad.random as fr
        n = inputs["n"]
        draw = {"normal": lambda k: fr.normal(k, (n,)), "uniform": lambda k: fr.uniform(k, (n,)),
                "bernoulli": lambda k: fr.bernoulli(k, RANDOM_P, (n,))}[kind]
        run, key = fg.jit(draw), fr.key(inputs["seed"])
        return lambda: run(key).realize()

    def jax_random(inputs: dict[str, Any]) -> Callable[[], Any]:
        import jax
        n = inputs["n"]
        draw = {"normal": lambda k: jax.random.normal(k, (n,)), "uniform": lambda k: jax.random.uniform(k, (n,)),
                "bernoulli": lambda k: jax.random.bernoulli(k, RANDOM_P, (n,))}[kind]
        run, key = jax.jit(draw), jax.random.PRNGKey(inputs["seed"])
        return lambda: run(key).block_until_ready()

    def torch_random(inputs: dict[str, Any]) -> Callable[[], Any]:
        import torch
        n = inputs["n"]
        generator = torch.Generator().manual_seed(inputs["seed"])
        draw = {"normal": lambda: torch.randn(n, generator=generator),
                "uniform": lambda: torch.rand(n, generator=generator),
                "bernoulli": lambda: torch.rand(n, generator=generator) < RANDOM_P}[kind]
        return draw

    def numpy_random(inputs: dict[str, Any]) -> Callable[[], Any]:
        rng, n = np.random.default_rng(inputs["seed"]), inputs["n"]
        return {"normal": lambda: rng.standard_normal(n, dtype=np.float32),
                "uniform": lambda: rng.random(n, dtype=np.float32),
                "bernoulli": lambda: rng.random(n, dtype=np.float32) < RANDOM_P}[kind]

    return {"funcgrad": funcgrad_random, "numpy": numpy_random, "jax": jax_random, "torch": torch_random}


def random_workloads() -> list[Workload]:
    rows = []
    for kind in ("normal", "uniform", "bernoulli"):
        for index, label in enumerate(("1M", "4M")):
            rows.append(Workload(
                f"random_{kind}_{label}", lambda s, i=index, k=kind: f"{_random_size(s, i)} float32 {k}"
                + (f" p={RANDOM_P}" if k == "bernoulli" else ""),
                lambda s, i=index: {"n": _random_size(s, i), "seed": 0}, lambda inputs: inputs["n"],
                _random_prepare(kind, index), compare=partial(_random_moments, kind), target=Target("jax", 1.0),
                notes={"funcgrad": "fg.jit(fg.random.*)", "jax": "jax.jit(jax.random.*)",
                       "torch": "eager torch.randn/rand (torch.compile not tried: its generator is eager)",
                       "numpy": "Generator (PCG64)", "tinygrad": "not measured"}))
    return rows


WORKLOADS += random_workloads()

# --- running --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Result:
    """One framework on one workload."""

    status: str = "ok"                   # ok | wrong | error | >budget | n/a
    ok: bool | None = None               # the first result matched the reference
    max_error: float | None = None
    first_call_s: float | None = None    # includes tracing and compilation
    times_s: list[float] = dataclasses.field(default_factory=list)  # per call, one entry per repetition
    note: str = ""
    spent_s: float = 0.0

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.times_s) if self.times_s else None


class Running:
    """A framework's prepared workload while it is timed; its time counts against the budget."""

    def __init__(self, prepared: Prepared, result: Result, calls: int) -> None:
        self.prepared, self.result, self.calls = prepared, result, calls
        self.last_call_s = 0.0

    def run(self, calls: int) -> Any:
        """Run the step `calls` times; returns the last output."""
        start = time.perf_counter()
        for _ in range(calls):
            output = self.prepared.step()
        elapsed = time.perf_counter() - start
        self.last_call_s = elapsed / calls
        self.result.spent_s += elapsed
        return output

    def affords_repetition(self, budget_s: float) -> bool:
        repetition_s = self.last_call_s * self.calls
        settling_s = max(repetition_s, SETTLE_FOR_S) if self.settles() else 0.0
        return self.result.spent_s + settling_s + repetition_s <= budget_s

    def settle(self) -> None:
        """Untimed repetitions, at least one and for at least SETTLE_FOR_S."""
        start = time.perf_counter()
        self.run(self.calls)
        while time.perf_counter() - start < SETTLE_FOR_S:
            self.run(self.calls)

    def settles(self) -> bool:
        """Whether a turn starts with an untimed repetition: for cheap calls, the previous framework's
        threads may still be spinning (PyTorch's OpenMP threads do) and this one's may be asleep."""
        return self.last_call_s * self.calls < SETTLE_BELOW_S


def start_framework(workload: Workload, name: str, inputs: dict[str, Any], expected: Any, sizes: Sizes,
                    gflops_seen: dict[str, float]) -> tuple[Result, Running | None]:
    """Prepare one framework, run it once and check the result against the reference, then warm it
    up. Returns its Result and, when it is ready to be timed, its Running."""
    if name not in workload.prepare:
        return Result(status="n/a", note=workload.notes.get(name, "not implemented")), None
    result = Result(note=workload.notes.get(name, ""))
    if workload.flops and name in gflops_seen:  # a matmul too slow for its budget is not waited for
        estimate = workload.flops(sizes) / (gflops_seen[name] * 1e9)
        if 2 * estimate > sizes.budget_s:  # the checked first call and one repetition
            result.status = ">budget"
            result.note = f"one call estimated at {estimate:.0f} s from the previous matmul's GFLOP/s"
            return result, None
    try:
        prepared = workload.prepare[name](inputs)
        running = Running(prepared if isinstance(prepared, Prepared) else Prepared(prepared), result,
                          workload.calls_per_repetition(sizes))
        output = running.run(1)
        result.first_call_s = running.last_call_s
        compare = workload.compare or partial(_compare_with_tolerance, workload.tolerance)
        result.ok, result.max_error = compare(running.prepared.snapshot(output), expected)
    except Exception as error:  # noqa: BLE001 - a failing framework is reported, the others go on
        result.status, result.note = "error", f"{type(error).__name__}: {_one_line(error)}"
        return result, None
    if result.ok is False:  # None: no reference to check against (said in the workload's note)
        result.status = "wrong"
    if workload.first_call_only:  # (mlp_peak_rss records MB, not seconds: see Workload.measure)
        result.times_s.append(workload.measure(output) if workload.measure else result.first_call_s)
        return result, None
    # the checked first call (trace + compile for a jit) neither counts against the timing budget nor
    # estimates a repetition: a warm call does (a jitted transformer step's first call under load took
    # 20 s of a 30 s budget and left it no repetition at 1 s each); one longer than the budget is timed
    # no further
    result.spent_s -= result.first_call_s
    if result.first_call_s <= sizes.budget_s:
        running.run(running.calls)
    return result, running


def time_round_robin(running: dict[str, Running], sizes: Sizes) -> None:
    """Time repetitions, each framework once per round, rotating who goes first, so that noise on
    the machine falls on all of them alike. A framework whose budget is spent drops out. In one
    process the frameworks' thread pools disturb each other; measured on matmul 1024, the settling
    repetitions (`Running.settles`, `SETTLE_FOR_S`) and OPENBLAS_THREAD_TIMEOUT bring NumPy, JAX,
    PyTorch and funcgrad to within a few percent of their speed alone, from about half of it."""
    for repetition in range(sizes.repetitions):
        names = list(running)
        if not names:
            return
        shift = repetition % len(names)
        for name in names[shift:] + names[:shift]:
            run = running[name]
            if not run.affords_repetition(sizes.budget_s):
                run.result.note = _join(run.result.note, f"budget spent after {len(run.result.times_s)} repetitions")
                del running[name]
                continue
            try:
                if run.settles():
                    run.settle()
                run.run(run.calls)
            except Exception as error:  # noqa: BLE001
                run.result.status, run.result.note = "error", f"{type(error).__name__}: {_one_line(error)}"
                del running[name]
                continue
            run.result.times_s.append(run.last_call_s)


def run_workload(workload: Workload, frameworks: Sequence[str], sizes: Sizes,
                 gflops_seen: dict[str, float]) -> dict[str, Result]:
    """Check, warm up and time every framework on one workload. `gflops_seen` carries each framework's
    matmul rate to the next matmul, to estimate whether it fits the budget."""
    inputs = workload.make_inputs(sizes)
    expected = workload.reference(inputs)
    results: dict[str, Result] = {}
    running: dict[str, Running] = {}
    for name in frameworks:
        results[name], run = start_framework(workload, name, inputs, expected, sizes, gflops_seen)
        if run is not None:
            running[name] = run
    time_round_robin(running, sizes)
    for name, result in results.items():
        if result.status in ("ok", "wrong") and not result.times_s:
            result.status = ">budget"
            result.note = _join(result.note, f"the first call took {result.first_call_s:.1f} s")
        if workload.flops and result.median_s:
            gflops_seen[name] = workload.flops(sizes) / result.median_s / 1e9
    return results


def _compare_with_tolerance(tolerance: tuple[float, float], actual: Any, expected: Any) -> tuple[bool, float]:
    return allclose(actual, expected, *tolerance)


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= 300 else text[:297] + "..."


def _join(*parts: str) -> str:
    return "; ".join(p for p in parts if p)


# --- reporting ------------------------------------------------------------------------------------------

def display_value(workload: Workload, sizes: Sizes, seconds: float) -> float:
    """A per-call time in the workload's unit."""
    if workload.unit == "GFLOP/s":
        assert workload.flops is not None
        return workload.flops(sizes) / seconds / 1e9
    return seconds * {"ms": 1e3, "us/call": 1e6, "s": 1.0, "MB": 1.0}[workload.unit]


def ratios(results: dict[str, Result]) -> dict[str, float | None]:
    """funcgrad's median time / each peer's (above 1: funcgrad is slower)."""
    mine = results["funcgrad"].median_s if "funcgrad" in results else None
    out: dict[str, float | None] = {}
    for peer, result in results.items():
        if peer != "funcgrad":
            out[peer] = mine / result.median_s if mine and result.median_s else None
    return out


def target_verdict(workload: Workload, results: dict[str, Result]) -> tuple[bool | None, str]:
    """(met, measured as the issue words it) for the workload's target."""
    target = workload.target
    assert target is not None
    mine = results.get("funcgrad")
    peer = results.get(target.peer) if target.peer else None
    if target.peer and (peer is None or peer.median_s is None):
        return None, f"n/a: no {target.peer} measurement"
    if mine is None or mine.status in ("error", "n/a"):
        return False, f"funcgrad {mine.status if mine else 'not run'}"
    if mine.median_s is None:
        return False, "funcgrad over its time budget"
    if peer is None:
        met, measured = mine.median_s < target.factor, f"{mine.median_s:.3g} {workload.unit}"
        return (False, measured + " (wrong result)") if mine.ok is False else (met, measured)
    assert peer.median_s is not None
    time_ratio = mine.median_s / peer.median_s
    if target.higher_is_better:
        met, measured = 1 / time_ratio >= target.factor, f"{1 / time_ratio:.3g}x"
    else:
        met, measured = time_ratio <= target.factor, f"{time_ratio:.3g}x"
    if mine.ok is False:
        return False, measured + " (wrong result)"
    return met, measured


def _cell(workload: Workload, sizes: Sizes, result: Result | None) -> str:
    if result is None:
        return "-"
    if result.status in ("error", "n/a", ">budget") or result.median_s is None:
        return {"error": "ERROR", "n/a": "n/a", ">budget": ">budget"}.get(result.status, result.status)
    value = display_value(workload, sizes, result.median_s)
    text = f"{value:.4g}" if value < 1e5 else f"{value:.0f}"
    return text + ("!" if result.ok is False else "")


def format_report(rows: list[tuple[Workload, dict[str, Result]]], frameworks: Sequence[str], sizes: Sizes) -> str:
    peers = [f for f in frameworks if f != "funcgrad"]
    header = ["workload", "size", "unit", *frameworks, *(f"fg/{p}" for p in peers), "fg ok"]
    table = [header]
    for workload, results in rows:
        rs = ratios(results)
        fg = results.get("funcgrad")
        table.append([
            workload.name, workload.size(sizes), workload.unit,
            *(_cell(workload, sizes, results.get(f)) for f in frameworks),
            *(f"{rs[p]:.3g}" if rs.get(p) else "-" for p in peers),
            "-" if fg is None or fg.ok is None else ("yes" if fg.ok else "NO"),
        ])
    widths = [max(len(row[i]) for row in table) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) if i < 3 else cell.rjust(width) for i, (cell, width) in
                       enumerate(zip(row, widths))) for row in table]
    lines.insert(1, "-" * len(lines[0]))
    lines.append("values: median over repetitions after warm-up (GFLOP/s: higher is better); fg/peer: funcgrad's "
                 "time / the peer's (above 1: funcgrad slower; for MB, memory); '!' marks a wrong result.")

    lines += ["", "Issue targets (funcgrad vs a peer, side by side, or in seconds)" +
              (": QUICK sizes, not meaningful" if sizes == QUICK else ":")]
    for workload, results in rows:
        if workload.target:
            met, measured = target_verdict(workload, results)
            verdict = "n/a" if met is None else ("met" if met else "NOT MET")
            lines.append(f"  {workload.name:<14} {workload.target.text(workload.unit):<22} measured {measured:<26} "
                         f"{verdict}")

    lines += ["", "How each framework runs a workload, and what went wrong:"]
    for workload, results in rows:
        how = [f"{name}: {result.note}" for name, result in results.items() if result.note and result.status == "ok"]
        if how:
            lines.append(f"  {workload.name}: " + "; ".join(how))
        for name, result in results.items():
            if result.status not in ("ok", "n/a"):
                error = f" (max error {result.max_error:.3g})" if result.status == "wrong" else ""
                lines.append(f"  {workload.name}: {name} {result.status.upper()}{error}" +
                             (f": {result.note}" if result.note else ""))
    return "\n".join(lines)


def to_json(rows: list[tuple[Workload, dict[str, Result]]], sizes: Sizes, meta: dict[str, Any]) -> dict[str, Any]:
    workloads = []
    for workload, results in rows:
        entry: dict[str, Any] = {
            "name": workload.name, "size": workload.size(sizes), "unit": workload.unit,
            "ok": results["funcgrad"].ok if "funcgrad" in results else None,
            "results": {}, "ratio_funcgrad_time_to": ratios(results),
        }
        for name, result in results.items():
            record = dataclasses.asdict(result)
            record["median_s"] = result.median_s
            record["value"] = display_value(workload, sizes, result.median_s) if result.median_s else None
            entry["results"][name] = record
        if workload.target:
            met, measured = target_verdict(workload, results)
            entry["target"] = {"text": workload.target.text(workload.unit), "measured": measured, "met": met}
        workloads.append(entry)
    return {"meta": meta, "workloads": workloads}


# --- main -----------------------------------------------------------------------------------------------

def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="tiny sizes, few repetitions (a smoke test)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help=f"results file (default {DEFAULT_JSON})")
    parser.add_argument("--only", default="", help="comma-separated workload names: " +
                        ",".join(w.name for w in WORKLOADS))
    parser.add_argument("--frameworks", default=",".join(FRAMEWORKS),
                        help="comma-separated frameworks to run (funcgrad always runs)")
    parser.add_argument("--rss-child", default=None, help=argparse.SUPPRESS)  # mlp_peak_rss's own process
    parser.add_argument("--first-step-child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--device", default=None,
                        help="funcgrad's device (CPU, CL, CUDA, WEBGPU; default: $DEVICE, else funcgrad's default). "
                             "Software devices (PoCL, lavapipe) are measured for correctness, not speed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    sizes = QUICK if args.quick else FULL
    selected = [w for w in WORKLOADS if not args.only or w.name in args.only.split(",")]
    unknown = set(filter(None, args.only.split(","))) - {w.name for w in WORKLOADS}
    if unknown:
        sys.exit(f"unknown workload(s) {sorted(unknown)}; choose from {[w.name for w in WORKLOADS]}")
    wanted = ["funcgrad", *(f for f in args.frameworks.split(",") if f in PEERS)]
    if args.rss_child or args.first_step_child:  # one measurement in this fresh process, as a JSON line
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        sys.path.insert(0, str(REPO_ROOT))
        result = rss_child(args.rss_child, sizes) if args.rss_child else first_step_child(args.first_step_child, sizes)
        print(json.dumps(result, default=_json_default))
        return 0

    cache = tempfile.mkdtemp(prefix="funcgrad-bench-cache-")
    os.environ["FUNCGRAD_CACHE"] = cache  # before funcgrad is imported: a first call compiles everything
    if args.device:
        os.environ["DEVICE"] = args.device  # funcgrad's Device.DEFAULT: every funcgrad workload runs there
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, str(REPO_ROOT))  # this checkout's funcgrad, not an installed copy
    # byte-compile this checkout's funcgrad as pip does an installed package (the peers run from compiled
    # site-packages): with PYTHONDONTWRITEBYTECODE set, a fresh process compiled every module it imported
    # (the first steps' lazily imported modules: ~20 ms of mlp_first_call)
    compileall.compile_dir(str(REPO_ROOT / "funcgrad"), quiet=1)
    started = time.perf_counter()
    try:
        versions, missing = available_frameworks(wanted)
        if "funcgrad" not in versions:
            sys.exit(f"funcgrad cannot be imported: {missing.get('funcgrad')}")
        frameworks = [f for f in FRAMEWORKS if f in versions]
        import funcgrad
        try:
            device = funcgrad.Device.DEFAULT
        except ValueError as error:
            sys.exit(str(error))
        meta = {
            "device": device,
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick, "python": platform.python_version(),
            "machine": platform.machine(), "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
            else os.cpu_count(), "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE"),
            "openblas_thread_timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"), "funcgrad_path": funcgrad.__file__,
            "funcgrad_commit": _funcgrad_commit(),
            "funcgrad_cache": "fresh temporary folder", "versions": versions, "unavailable": missing,
            "repetitions": sizes.repetitions, "budget_s": sizes.budget_s,
        }
        print(f"funcgrad {versions['funcgrad']} from {Path(funcgrad.__file__).parent} "
              f"(commit {meta['funcgrad_commit']}) on device {device}")
        print("peers: " + ", ".join(f"{k} {v}" for k, v in versions.items() if k != "funcgrad"))
        for name, why in missing.items():
            print(f"skipped {name}: {why}")
        print(f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(not set)')}; "
              f"OPENBLAS_THREAD_TIMEOUT={os.environ.get('OPENBLAS_THREAD_TIMEOUT')}; {meta['cpus']} CPUs; "
              f"load average {_load_average()}; {sizes.repetitions} repetitions, "
              f"budget {sizes.budget_s:g} s per framework per workload{'; QUICK sizes' if args.quick else ''}")
        sys.stdout.flush()

        rows: list[tuple[Workload, dict[str, Result]]] = []
        gflops_seen: dict[str, float] = {}
        for workload in selected:
            workload_start = time.perf_counter()
            gc.collect()
            gc.disable()  # as timeit does: a collection would land on whichever framework runs then
            try:
                rows.append((workload, run_workload(workload, frameworks, sizes, gflops_seen)))
            finally:
                gc.enable()
            print(f"  {workload.name}: {time.perf_counter() - workload_start:.1f} s", flush=True)
        first_steps = first_steps_in_fresh_processes([w.name for w in selected if w.name in FIRST_STEP_CHILDREN],
                                                     sizes)
        meta["first_step_fresh_process"] = first_steps
        meta["total_s"] = round(time.perf_counter() - started, 1)
        print()
        print(format_report(rows, frameworks, sizes))
        if first_steps:
            print()
            print(format_first_steps(first_steps))
        print(f"\ntotal {meta['total_s']} s; results in {args.json}")
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(to_json(rows, sizes, meta), indent=1, default=_json_default) + "\n")
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    return 0


def _funcgrad_commit() -> str | None:
    """HEAD of this checkout, with "+dirty" when funcgrad/ has uncommitted changes."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--", "funcgrad"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+dirty" if dirty else "")


def _load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "unknown"


def _json_default(value: Any) -> Any:
    if isinstance(value, (np.floating, np.integer, np.bool_)):
        return value.item()
    return str(value)


if __name__ == "__main__":
    sys.exit(main())
