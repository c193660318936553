"""tinygrad's beautiful_mnist, in funcgrad: a small CNN trained with Adam and a jitted step.

    python3 examples/beautiful_mnist.py                  # Fashion-MNIST (apt-get install dataset-fashion-mnist)
    python3 examples/beautiful_mnist.py --dataset mnist  # MNIST digits, where its files are present
    python3 examples/beautiful_mnist.py --steps 300 --batch-size 512 --seed 0

Needs tqdm for its progress bar (``python3 -m pip install -e '.[examples]'``, as the README's demo command).

The step is seed-style (``opt.zero_grad(); loss.backward(); opt.step()``) and runs under ``fg.jit``:
the model and optimiser are arguments, so their parameters, Adam state and BatchNorm statistics are
traced as inputs and written back after every call. Prints the test accuracy and the wall time.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from tqdm import trange  # the examples' one dependency: python3 -m pip install -e '.[examples]'

import funcgrad as fg
from funcgrad import Tensor, nn


class Model(nn.Module):
    """Conv 1->32 5x5, Conv 32->32 5x5, BatchNorm, max-pool, Conv 32->64 3x3, Conv 64->64 3x3,
    BatchNorm, max-pool, Linear 576->10 (tinygrad's beautiful_mnist)."""

    def __init__(self) -> None:
        self.layers = [
            nn.Conv2d(1, 32, 5), Tensor.relu,
            nn.Conv2d(32, 32, 5), Tensor.relu,
            nn.BatchNorm(32), Tensor.max_pool2d,
            nn.Conv2d(32, 64, 3), Tensor.relu,
            nn.Conv2d(64, 64, 3), Tensor.relu,
            nn.BatchNorm(64), Tensor.max_pool2d,
            lambda x: x.flatten(1), nn.Linear(576, 10),
        ]

    def __call__(self, x: Tensor) -> Tensor:
        return x.sequential(self.layers)


def normalize(images: Tensor) -> Tensor:
    return images.astype("float32") / 255.0


@fg.jit
def train_step(model: Model, opt: nn.optim.Optimizer, x: Tensor, y: Tensor) -> Tensor:
    with Tensor.train():
        opt.zero_grad()
        loss = model(normalize(x)).sparse_categorical_crossentropy(y)
        loss.backward()
        opt.step()
    return loss


@fg.jit
def correct_count(model: Model, x: Tensor, y: Tensor) -> Tensor:
    return (model(normalize(x)).argmax(axis=1) == y).sum()


def test_accuracy(model: Model, X_test: np.ndarray, Y_test: np.ndarray, batch: int = 500) -> float:
    correct = 0
    for start in range(0, len(X_test), batch):  # fixed-size chunks: one trace for the whole test set
        correct += int(correct_count(model, Tensor(X_test[start:start + batch]),
                                     Tensor(Y_test[start:start + batch])).item())
    return 100.0 * correct / len(X_test)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dataset", choices=["fashion_mnist", "mnist"], default="fashion_mnist")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1e-3, help="the learning rate (the peak one with onecycle)")
    parser.add_argument("--schedule", choices=["constant", "onecycle"], default="constant")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--target", type=float, default=None, help="stop once the test accuracy reaches this")
    parser.add_argument("--test-samples", type=int, default=None, help="evaluate on the first N test images")
    args = parser.parse_args()

    X_train, Y_train, X_test, Y_test = fg.datasets.mnist(fashion=args.dataset == "fashion_mnist")
    X_train, Y_train, X_test, Y_test = (t.numpy() for t in (X_train, Y_train, X_test, Y_test))
    X_test, Y_test = X_test[:args.test_samples], Y_test[:args.test_samples]
    Tensor.manual_seed(args.seed)
    model = Model()
    lr = nn.optim.onecycle(args.steps, args.lr) if args.schedule == "onecycle" else args.lr
    opt = nn.optim.Adam(nn.state.get_parameters(model), lr=lr)
    rng = np.random.default_rng(args.seed)

    start = time.perf_counter()
    accuracy = float("nan")
    progress = trange(args.steps)
    for step in progress:
        samples = rng.integers(0, len(X_train), args.batch_size)
        loss = train_step(model, opt, Tensor(X_train[samples]), Tensor(Y_train[samples]))
        if step % args.eval_every == args.eval_every - 1 or step == args.steps - 1:
            accuracy = test_accuracy(model, X_test, Y_test)
            if args.target is not None and accuracy >= args.target:
                break
        progress.set_description(f"loss: {loss:6.3f} test_accuracy: {accuracy:5.2f}%")
    elapsed = time.perf_counter() - start
    print(f"{args.dataset}: test accuracy {accuracy:.2f}% after {step + 1} steps of batch {args.batch_size} "
          f"in {elapsed:.1f} s ({elapsed / (step + 1) * 1000:.0f} ms/step incl. evaluation)")


if __name__ == "__main__":
    main()
