"""A functional training loop, JAX style: parameters are a plain pytree, the step is a pure function.

    python3 examples/functional_mlp.py            # Fashion-MNIST, 784-256-10 MLP, 3 epochs
    python3 examples/functional_mlp.py --epochs 1 --batch-size 128

It shows ``fg.value_and_grad`` over a dict of parameters, the functional Adam
(``init``/``update``), ``fg.jit`` around the whole step, and ``fg.vmap(fg.grad(...))`` for
per-example gradients (their mean equals the batch gradient, which the script checks).
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import funcgrad as fg
import funcgrad.numpy as fnp
import funcgrad.random as fr
from funcgrad import nn
from funcgrad.nn import functional as F


def init_params(key, sizes: list[int]) -> list[dict]:
    params = []
    for k, (fan_in, fan_out) in zip(fr.split(key, len(sizes) - 1), zip(sizes[:-1], sizes[1:])):
        bound = float(np.sqrt(6.0 / fan_in))  # He-uniform for ReLU layers
        params.append({"w": fr.uniform(k, (fan_in, fan_out), minval=-bound, maxval=bound),
                       "b": fnp.zeros(fan_out)})
    return params


def predict(params: list[dict], x):
    for layer in params[:-1]:
        x = F.relu(x @ layer["w"] + layer["b"])
    return x @ params[-1]["w"] + params[-1]["b"]


def loss_fn(params: list[dict], x, y):
    return F.cross_entropy(predict(params, x), y)


optimizer = nn.optim.adam(1e-3)


@fg.jit
def train_step(params, state, x, y):
    loss, grads = fg.value_and_grad(loss_fn)(params, x, y)
    params, state = optimizer.update(grads, state, params)
    return params, state, loss


@fg.jit
def accuracy(params, x, y):
    return fnp.mean((fnp.argmax(predict(params, x), axis=-1) == y).astype("float32"))


def per_example_grads(params, x, y):
    """One gradient per example: grad of the loss of a single example, vmapped over the batch."""
    def single(p, xi, yi):
        return loss_fn(p, xi[None], yi[None])
    return fg.jit(fg.vmap(fg.grad(single), in_axes=(None, 0, 0)))(params, x, y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    X_train, Y_train, X_test, Y_test = fg.datasets.fashion_mnist()
    to_rows = lambda images: images.numpy().reshape(len(images.numpy()), -1).astype(np.float32) / 255.0  # noqa: E731
    x_train, x_test = to_rows(X_train), to_rows(X_test)
    y_train, y_test = Y_train.numpy().astype(np.int32), Y_test.numpy().astype(np.int32)

    key = fr.key(args.seed)
    params = init_params(key, [784, args.hidden, 10])
    state = optimizer.init(params)
    loader = fg.datasets.DataLoader(x_train, y_train, batch_size=args.batch_size, shuffle=True,
                                    key=fr.fold_in(key, 1), drop_last=True)

    start = time.perf_counter()
    for epoch in range(args.epochs):
        for x, y in loader:
            params, state, loss = train_step(params, state, x, y)
        test_accuracy = float(accuracy(params, fg.Tensor(x_test), fg.Tensor(y_test)).item())
        print(f"epoch {epoch + 1}: loss {float(loss.item()):.3f}  test accuracy {100 * test_accuracy:.2f}%  "
              f"({time.perf_counter() - start:.1f} s)")

    # per-example gradients: their mean over a batch is the batch gradient
    x, y = fg.Tensor(x_test[:64]), fg.Tensor(y_test[:64])
    per_example = per_example_grads(params, x, y)
    batch_grad = fg.grad(loss_fn)(params, x, y)
    mean_grad = fg.tree.map(lambda g: fnp.mean(g, axis=0), per_example)
    error = max(float(np.abs(a.numpy() - b.numpy()).max())
                for a, b in zip(fg.tree.leaves(mean_grad), fg.tree.leaves(batch_grad)))
    print(f"per-example gradients: {fg.tree.map(lambda g: g.shape, per_example)[0]['w']} for layer 0 weights; "
          f"their mean differs from the batch gradient by at most {error:.1e}")
    print(f"train_step traced {train_step.trace_count} time(s)")


if __name__ == "__main__":
    main()
