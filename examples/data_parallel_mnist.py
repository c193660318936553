"""Data-parallel training on MPI: the same MLP on every rank, each rank on its part of every batch.

    mpirun -n 2 python3 examples/data_parallel_mnist.py                  # 2 ranks, 64 rows each per step
    python3 examples/data_parallel_mnist.py --batch-size 128             # 1 process, the same global batches
    mpirun -n 2 python3 examples/data_parallel_mnist.py --style functional --save params.npz

As root Open MPI wants ``OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1``; pass the
environment on with ``mpirun -x PYTHONPATH ...`` when funcgrad is not installed. Without mpirun the
script runs as one process (every collective is then the identity).

The data-parallel part is five lines (``dp`` is ``funcgrad.nn.data_parallel``): ``initialize()``;
``dp.broadcast_parameters(model)`` (every rank starts from rank 0's weights: here the ranks seed
their models differently on purpose); ``DataLoader(..., shard=(rank, ranks))`` with the same key on
every rank; ``dp.sync_gradients(opt)`` between ``backward()`` and ``opt.step()`` (or
``dp.allreduce_gradients(grads)`` in the functional style). Since the gradients are mean-reduced and
each rank's batch is its part of the global batch, n ranks with batch b end with the parameters of
one process with batch n * b, within float32 rounding (tests/distributed/test_data_parallel.py).

The data set is Fashion-MNIST (``--dataset mnist`` for the digits) where its files are on this
machine, else a small synthetic one of the same shape (``--dataset synthetic`` asks for it).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence

import numpy as np

import funcgrad as fg
import funcgrad.random as fr
from funcgrad import Tensor, nn
from funcgrad.datasets import DataLoader, DatasetNotFoundError
from funcgrad.nn import data_parallel as dp


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))


def synthetic_dataset(rows: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Ten noisy prototype images, MNIST's layout (uint8 (N, 1, 28, 28), labels 0..9): learnable, and
    the same on every rank (one seed)."""
    rng = np.random.default_rng(seed)
    prototypes = rng.uniform(0, 255, (10, 784)) * (rng.uniform(size=(10, 784)) < 0.3)
    labels = rng.integers(0, 10, rows + rows // 4)
    images = np.clip(prototypes[labels] + rng.normal(0, 40, (len(labels), 784)), 0, 255).astype(np.uint8)
    images = images.reshape(-1, 1, 28, 28)
    return images[:rows], labels[:rows].astype(np.uint8), images[rows:], labels[rows:].astype(np.uint8)


def load(name: str, rows: int, seed: int) -> tuple[str, tuple[np.ndarray, ...]]:
    if name != "synthetic":
        try:
            arrays = fg.datasets.mnist(fashion=name == "fashion_mnist", download=False)
            return name, tuple(t.numpy() for t in arrays)
        except DatasetNotFoundError:
            pass  # not on this machine: fall back to the synthetic one
    return "synthetic", synthetic_dataset(rows, seed)


def loss_fn(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return model(x).sparse_categorical_crossentropy(y)


@fg.jit
def backward(model: nn.Module, opt: nn.optim.Optimizer, x: Tensor, y: Tensor) -> Tensor:
    """The stateful half that can be jitted: ``.grad`` of each parameter is written back."""
    opt.zero_grad()
    loss = loss_fn(model, x, y)
    loss.backward()
    return loss


value_and_grad = fg.jit(fg.value_and_grad(loss_fn))


@fg.jit
def correct_count(model: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    return (model(x).argmax(axis=1) == y).sum()


def to_rows(images: np.ndarray) -> np.ndarray:
    return images.reshape(len(images), -1).astype(np.float32) / 255.0


def main(argv: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", choices=["fashion_mnist", "mnist", "synthetic"], default="fashion_mnist")
    parser.add_argument("--style", choices=["stateful", "functional"], default="stateful")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch-size", type=int, default=64, help="rows per rank and step")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--synthetic-rows", type=int, default=4096)
    parser.add_argument("--save", default=None, help="rank 0 writes the final parameters here (.npz)")
    args = parser.parse_args(argv)

    fg.distributed.initialize()                                        # 1: join the job (one process without mpirun)
    rank, ranks = fg.distributed.process_index(), fg.distributed.process_count()
    name, (X_train, Y_train, X_test, Y_test) = load(args.dataset, args.synthetic_rows, args.seed)

    Tensor.manual_seed(args.seed + rank)  # different weights on each rank, on purpose: the broadcast fixes it
    model = make_model()
    dp.broadcast_parameters(model)                                     # 2: rank 0's weights everywhere
    loader = DataLoader(to_rows(X_train), Y_train.astype(np.int32), batch_size=args.batch_size, shuffle=True,
                        key=fr.key(args.seed), drop_last=True, shard=(rank, ranks))  # 3: this rank's rows
    if args.style == "stateful":
        opt = nn.optim.Adam(nn.state.get_parameters(model), lr=args.lr)
    else:
        optimizer = nn.optim.adam(args.lr)
        state = optimizer.init(model)
        update = fg.jit(optimizer.update)

    start, step, loss = time.perf_counter(), 0, Tensor(float("nan"))
    while step < args.steps:
        for x, y in loader:
            if args.style == "stateful":
                loss = backward(model, opt, x, y)
                dp.sync_gradients(opt)                                 # 4: the mean gradient of all ranks
                opt.step()
            else:
                loss, grads = value_and_grad(model, x, y)
                grads = dp.allreduce_gradients(grads)                  # 4 (functional): the same
                model, state = update(grads, state, model)
            step += 1
            if step == args.steps:
                break
    elapsed = time.perf_counter() - start

    weights = {key: value.numpy() for key, value in nn.state.get_state_dict(model).items()}
    # every rank must hold the same parameters: compare each with rank 0's
    from_rank_0 = dp.broadcast(weights)
    spread = max(float(np.abs(from_rank_0[key] - value).max()) for key, value in weights.items())
    tests = slice(0, min(len(X_test), 2000))
    correct = int(correct_count(model, Tensor(to_rows(X_test[tests])), Tensor(Y_test[tests].astype(np.int32))).item())
    if rank == 0:
        print(f"{name}, {ranks} rank(s), {args.style}: {step} steps of {ranks} x {args.batch_size} rows in "
              f"{elapsed:.1f} s; last loss {float(loss.item()):.3f}; test accuracy "
              f"{100 * correct / (tests.stop - tests.start):.2f}%; largest difference between ranks {spread:.1e}")
        if args.save:
            np.savez(args.save, **weights)
    return weights


if __name__ == "__main__":
    main()
