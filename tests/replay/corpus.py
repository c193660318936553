"""The kernel replay corpus: named programs with fixed example arguments.

Each ``Program`` is a function and a builder of its example arguments (fixed shapes, float32 so every
renderer can take it, values from fixed seeds). ``tests/replay/record.py`` traces a program with
``fg.jit(fn).lower(*args)``, schedules its IR and renders every kernel for every device; the
recordings under ``tests/replay/<device>/<name>.txt`` are what ``tests/lower/test_replay.py`` compares.

Adding a program: decorate a function with ``@program(args_builder)`` (the name is the function's);
run ``python3 -m pytest tests/lower/test_replay.py --update-replay`` and commit the new recordings.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import numpy as np

import funcgrad as fg
import funcgrad.numpy as fnp
import funcgrad.random as fr
from funcgrad import Tensor, lax, nn
from funcgrad.nn import functional as F

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@attrs.frozen
class Program:
    """A corpus entry: ``fn(*make_args())`` is traced under ``fg.jit``."""

    name: str
    fn: Callable[..., Any]
    make_args: Callable[[], tuple[Any, ...]]


PROGRAMS: dict[str, Program] = {}


def program(make_args: Callable[[], tuple[Any, ...]]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register the decorated function (under its own name) with the builder of its arguments."""
    def register(fn: Callable[..., Any]) -> Callable[..., Any]:
        if fn.__name__ in PROGRAMS:
            raise ValueError(f"replay corpus: program {fn.__name__!r} is defined twice")
        PROGRAMS[fn.__name__] = Program(fn.__name__, fn, make_args)
        return fn
    return register


def floats(*shapes: tuple[int, ...], seed: int = 0) -> Callable[[], tuple[Tensor, ...]]:
    """An argument builder: float32 Tensors of these shapes, standard normal from ``seed``."""
    def make() -> tuple[Tensor, ...]:
        rng = np.random.default_rng(seed)
        return tuple(Tensor(rng.standard_normal(shape).astype(np.float32)) for shape in shapes)
    return make


def ints(shape: tuple[int, ...], high: int, seed: int = 1) -> Tensor:
    return Tensor(np.random.default_rng(seed).integers(0, high, shape).astype(np.int32))


# --- single ops and fusions ------------------------------------------------------------------------

@program(floats((16, 32), (16, 32)))
def elementwise_chain(x: Tensor, y: Tensor) -> Tensor:
    return fnp.tanh(fnp.sin(x * 2.0 + 1.0) * y - fnp.exp(-x * x) / (1.0 + fnp.abs(y))) ** 2


@program(floats((8, 1, 16), (4, 1)))
def broadcast_add_mul(x: Tensor, y: Tensor) -> Tensor:
    return (x + y) * fnp.sqrt(fnp.abs(y) + 1.0)


@program(floats((64,)))
def transcendentals(x: Tensor) -> tuple[Tensor, ...]:
    positive = fnp.abs(x) + 0.5
    return fnp.exp(x), fnp.log(positive), fnp.sqrt(positive), fnp.erf(x), fnp.sigmoid(x), fnp.tanh(x), x ** 3


@program(floats((32,), (32,)))
def compare_select(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    return fnp.where(x > y, x, y * 2.0), fnp.maximum(x, 0.0) + fnp.minimum(y, 0.0)


@program(lambda: (ints((8, 8), 100), ints((8, 8), 7, seed=2) + 1))
def integer_arithmetic(a: Tensor, b: Tensor) -> tuple[Tensor, ...]:
    return a // b, a % b, (a & 12) | (b << 2), (a * b - 3) >> 1


@program(floats((8, 8)))
def casts(x: Tensor) -> tuple[Tensor, ...]:
    as_int = (x * 10.0).astype(np.int32)
    return as_int, (x > 0).astype(np.float32) + as_int.astype(np.float32), x.astype(np.uint8)


@program(lambda: (Tensor(np.linspace(-2.0, 2.0, 24).reshape(4, 6), dtype=np.float64),))
def float64_refused_by_webgpu(x: Tensor) -> Tensor:
    """The one float64 program: WGSL has no 64-bit floats, so its WEBGPU recording holds the refusal."""
    return fnp.sum(fnp.exp(x) * 2.0, axis=1)


@program(lambda: (Tensor(np.linspace(-2.0, 2.0, 24, dtype=np.float16)),))
def float16_compute_in_float32(x: Tensor) -> Tensor:
    return fnp.tanh(x * 3.0) + x.astype(np.float32)


@program(floats((12, 20)))
def reduce_sum_axes(x: Tensor) -> tuple[Tensor, ...]:
    return fnp.sum(x, axis=0), fnp.sum(x, axis=1), fnp.sum(x)


@program(floats((12, 20)))
def reduce_max_min(x: Tensor) -> tuple[Tensor, ...]:
    return fnp.max(x, axis=1), fnp.min(x, axis=0), fnp.max(x)


@program(floats((16, 8, 16, 16)))
def long_float_sum(x: Tensor) -> Tensor:
    """4096 values per channel over three loops: the CPU renderer's partial sums."""
    return fnp.sum(x, axis=(0, 2, 3))


@program(floats((6, 10)))
def reduce_prod_mean_var(x: Tensor) -> tuple[Tensor, ...]:
    return fnp.prod(x, axis=1), fnp.mean(x, axis=0), fnp.var(x, axis=1)


@program(floats((6, 10)))
def reduce_any_all(x: Tensor) -> tuple[Tensor, Tensor]:
    return fnp.any(x > 1.0, axis=1), fnp.all(x > -2.0, axis=0)


@program(floats((32, 32), (32, 32)))
def matmul_square(a: Tensor, b: Tensor) -> Tensor:
    return a @ b


@program(floats((256, 256), (256, 256)))
def matmul_large(a: Tensor, b: Tensor) -> Tensor:
    """Big enough for the CPU's blocked / threaded matmul paths."""
    return a @ b


@program(floats((64, 8), (8, 3)))
def matmul_tall_skinny(a: Tensor, b: Tensor) -> Tensor:
    return a @ b


@program(floats((16, 48), (48,)))
def matvec(a: Tensor, v: Tensor) -> Tensor:
    return a @ v


@program(floats((4, 8, 16), (4, 16, 8)))
def batched_matmul(a: Tensor, b: Tensor) -> Tensor:
    return fnp.matmul(a, b)


@program(floats((16, 32), (32, 8), (8,)))
def linear_relu(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return F.relu(x @ w + b)


@program(floats((8, 12), (12, 8)))
def transpose_fusion(x: Tensor, y: Tensor) -> Tensor:
    return (x.T + 1.0) * y + fnp.transpose(x)


@program(floats((4, 6, 8)))
def reshape_fusion(x: Tensor) -> Tensor:
    return fnp.reshape(x * 2.0, (24, 8)).T.reshape(8, 4, 6) + 1.0


@program(floats((6, 7)))
def pad_slice_flip(x: Tensor) -> Tensor:
    padded = fnp.pad(x, ((1, 2), (0, 3)))
    return fnp.flip(padded[1:8:2, 2:], axis=1) * 3.0


@program(floats((4, 5), (4, 3), (2, 8)))
def concatenate_fusion(a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    return fnp.concatenate([fnp.concatenate([a, b], axis=1) * 2.0, c], axis=0) - 1.0


@program(floats((8, 32)))
def softmax(x: Tensor) -> Tensor:
    return F.softmax(x, axis=-1)


@program(floats((8, 32)))
def log_softmax(x: Tensor) -> Tensor:
    return F.log_softmax(x, axis=-1)


@program(floats((8, 32), (32,), (32,)))
def layernorm(x: Tensor, scale: Tensor, bias: Tensor) -> Tensor:
    return F.layer_norm(x, (32,), scale, bias)


@program(floats((256,)))
def gelu_silu(x: Tensor) -> tuple[Tensor, Tensor]:
    return F.gelu(x), F.silu(x)


@program(floats((6, 10)))
def cumsum_host(x: Tensor) -> Tensor:
    return fnp.cumsum(x * 2.0, axis=1) + 1.0


@program(floats((6, 10)))
def sort_argsort_host(x: Tensor) -> tuple[Tensor, Tensor]:
    return fnp.sort(x + 1.0, axis=1), fnp.argsort(x, axis=0)


@program(lambda: (floats((10, 4))()[0], ints((6,), 10)))
def gather_host(table: Tensor, index: Tensor) -> Tensor:
    return fnp.take(table * 2.0, index, axis=0) + 1.0


@program(floats((6, 10)))
def argmax_host(x: Tensor) -> Tensor:
    return fnp.argmax(x * x, axis=1)


# --- transforms of a small MLP ------------------------------------------------------------------------

def mlp_args() -> tuple[Any, ...]:
    rng = np.random.default_rng(3)
    params = [{"w": Tensor(0.3 * rng.standard_normal((fan_in, fan_out)).astype(np.float32)),
               "b": Tensor(np.zeros(fan_out, np.float32))} for fan_in, fan_out in ((12, 16), (16, 4))]
    x = Tensor(rng.standard_normal((8, 12)).astype(np.float32))
    return params, x, ints((8,), 4)


def mlp_loss(params: list[dict[str, Tensor]], x: Tensor, y: Tensor) -> Tensor:
    hidden = fnp.tanh(x @ params[0]["w"] + params[0]["b"])
    return F.cross_entropy(hidden @ params[1]["w"] + params[1]["b"], y)


@program(mlp_args)
def mlp_forward(params: Any, x: Tensor, y: Tensor) -> Tensor:
    return mlp_loss(params, x, y)


@program(mlp_args)
def mlp_grad(params: Any, x: Tensor, y: Tensor) -> Any:
    return fg.grad(mlp_loss)(params, x, y)


@program(mlp_args)
def mlp_value_and_grad_input(params: Any, x: Tensor, y: Tensor) -> Any:
    return fg.value_and_grad(mlp_loss, argnums=1)(params, x, y)


@program(mlp_args)
def mlp_per_example_grads(params: Any, x: Tensor, y: Tensor) -> Any:
    def single(p: Any, xi: Tensor, yi: Tensor) -> Tensor:
        return mlp_loss(p, xi[None], yi[None])
    return fg.vmap(fg.grad(single), in_axes=(None, 0, 0))(params, x, y)


@program(mlp_args)
def mlp_jvp(params: Any, x: Tensor, y: Tensor) -> Any:
    tangent = fg.tree.map(fnp.ones_like, params)
    return fg.jvp(lambda p: mlp_loss(p, x, y), (params,), (tangent,))


@program(mlp_args)
def mlp_hessian_vector_product(params: Any, x: Tensor, y: Tensor) -> Any:
    vector = fg.tree.map(lambda p: p * 0.5 + 1.0, params)
    return fg.jvp(fg.grad(lambda p: mlp_loss(p, x, y)), (params,), (vector,))[1]


@program(mlp_args)
def mlp_nested_jit_remat(params: Any, x: Tensor, y: Tensor) -> Any:
    inner = fg.jit(fg.checkpoint(mlp_loss))
    return fg.grad(inner)(params, x, y)


@program(floats((5, 3)))
def jacfwd_jacrev(x: Tensor) -> tuple[Tensor, Tensor]:
    def f(v: Tensor) -> Tensor:
        return fnp.sin(v) * fnp.sum(v * v)
    return fg.jacfwd(f)(x[0]), fg.jacrev(f)(x[1])


@program(floats((6, 4, 5), (5, 3)))
def vmap_matmul_softmax(x: Tensor, w: Tensor) -> Tensor:
    return fg.vmap(lambda row: F.softmax(row @ w, axis=-1))(x)


# --- control flow (host steps) -------------------------------------------------------------------------

@program(floats((8,)))
def fori_loop_scan(x: Tensor) -> tuple[Tensor, Tensor]:
    looped = lax.fori_loop(0, 3, lambda i, v: v * 0.5 + 1.0, x)
    carry, ys = lax.scan(lambda c, v: (c + v, c * v), fnp.zeros(()), x)
    return looped, carry + fnp.sum(ys)


@program(floats((8,)))
def cond_select(x: Tensor) -> Tensor:
    return lax.cond(fnp.sum(x) > 0, lambda v: v * 2.0, lambda v: -v, x) + lax.select(x > 0, x, x * x)


# --- layers: convolution, pooling, normalisation ----------------------------------------------------

@program(floats((2, 3, 8, 8), (4, 3, 3, 3), (4,)))
def conv2d_forward(x: Tensor, w: Tensor, b: Tensor) -> Tensor:
    return F.conv2d(x, w, b, padding=1)


@program(floats((2, 3, 8, 8), (4, 3, 3, 3), (4,)))
def conv2d_backward(x: Tensor, w: Tensor, b: Tensor) -> Any:
    return fg.grad(lambda *a: fnp.sum(F.relu(F.conv2d(*a, padding=1)) ** 2), argnums=(0, 1, 2))(x, w, b)


@program(floats((2, 4, 9, 9), (4, 2, 3, 3)))
def conv2d_stride_groups(x: Tensor, w: Tensor) -> Tensor:
    return F.conv2d(x, w, stride=2, groups=2)


@program(floats((2, 3, 8, 8)))
def max_pool_forward_backward(x: Tensor) -> tuple[Tensor, Tensor]:
    def pooled_sum(v: Tensor) -> Tensor:
        return fnp.sum(F.max_pool2d(v, 2) ** 2)
    return pooled_sum(x), fg.grad(pooled_sum)(x)


@program(floats((2, 3, 8, 8)))
def avg_pool(x: Tensor) -> Tensor:
    return F.avg_pool2d(x, 2)


@program(floats((4, 3, 5, 5), (3,), (3,)))
def batch_norm_train_backward(x: Tensor, scale: Tensor, bias: Tensor) -> Any:
    def loss(v: Tensor, s: Tensor, b: Tensor) -> Tensor:
        out, _, _ = F.batch_norm(v, fnp.zeros(3), fnp.ones(3), s, b, training=True)
        return fnp.sum(out * out)
    return fg.value_and_grad(loss, argnums=(0, 1, 2))(x, scale, bias)


@program(floats((2, 5, 16), (2, 5, 16), (2, 5, 16)))
def attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    return F.scaled_dot_product_attention(q, k, v)


# --- random keys ------------------------------------------------------------------------------------

@program(lambda: (fr.key(0),))
def random_split_uniform_normal(key: Any) -> tuple[Tensor, ...]:
    first, second = fr.split(key)
    return fr.uniform(first, (4, 8)), fr.normal(second, (16,)), fr.bernoulli(fr.fold_in(key, 3), 0.3, (8,))


@program(lambda: (floats((4, 16))()[0], fr.key(1)))
def dropout(x: Tensor, key: Any) -> Tensor:
    return F.dropout(x, 0.25, key=key, training=True)


# --- the examples' steps -----------------------------------------------------------------------------

def load_example(name: str) -> Any:
    """examples/<name>.py as a module (its ``main`` is not run)."""
    module_name = f"replay_example_{name}"
    if module_name not in sys.modules:
        spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return sys.modules[module_name]


def functional_mlp_args() -> tuple[Any, ...]:
    example = load_example("functional_mlp")
    params = example.init_params(fr.key(0), [784, 32, 10])
    x = Tensor(np.random.default_rng(4).random((8, 784), dtype=np.float32))
    return params, example.optimizer.init(params), x, ints((8,), 10)


@program(functional_mlp_args)
def functional_mlp_adam_step(params: Any, state: Any, x: Tensor, y: Tensor) -> Any:
    return load_example("functional_mlp").train_step.fn(params, state, x, y)


def beautiful_mnist_args() -> tuple[Any, ...]:
    example = load_example("beautiful_mnist")
    fr.manual_seed(0)
    model = example.Model()
    images = Tensor(np.random.default_rng(5).integers(0, 256, (2, 1, 28, 28)).astype(np.uint8))
    return model, nn.optim.Adam(nn.state.get_parameters(model), lr=1e-3), images, Tensor(np.array([3, 7], np.uint8))


@program(beautiful_mnist_args)
def beautiful_mnist_train_step(model: Any, opt: Any, x: Tensor, y: Tensor) -> Tensor:
    return load_example("beautiful_mnist").train_step.fn(model, opt, x, y)


@program(lambda: beautiful_mnist_args()[:1] + beautiful_mnist_args()[2:])
def beautiful_mnist_eval(model: Any, x: Tensor, y: Tensor) -> Tensor:
    return load_example("beautiful_mnist").correct_count.fn(model, x, y)
