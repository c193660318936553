"""The same model and loop as examples/beautiful_mnist.py, in PyTorch, for a wall-time comparison.

    python3 benchmarks/beautiful_mnist_torch.py --target 91

Same data (funcgrad.datasets), same model (tinygrad's beautiful_mnist CNN), Adam lr 1e-3, batch 512,
random batches drawn the same way, evaluation every 100 steps on the test set; stops at --target.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import funcgrad as fg  # noqa: E402  (only for the data set)


def model() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 32, 5), nn.ReLU(), nn.Conv2d(32, 32, 5), nn.ReLU(), nn.BatchNorm2d(32), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.Conv2d(64, 64, 3), nn.ReLU(), nn.BatchNorm2d(64), nn.MaxPool2d(2),
        nn.Flatten(1), nn.Linear(576, 10))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--eval-every", type=int, default=100)
    parser.add_argument("--target", type=float, default=None)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--schedule", choices=["constant", "onecycle"], default="constant")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    X_train, Y_train, X_test, Y_test = (t.numpy() for t in fg.datasets.fashion_mnist())
    x_train = torch.from_numpy(X_train.astype(np.float32) / 255)
    y_train = torch.from_numpy(Y_train.astype(np.int64))
    x_test = torch.from_numpy(X_test.astype(np.float32) / 255)
    y_test = torch.from_numpy(Y_test.astype(np.int64))
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    schedule = (torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=args.steps,
                                                             cycle_momentum=False)
                if args.schedule == "onecycle" else None)
    rng = np.random.default_rng(args.seed)
    start = time.perf_counter()
    accuracy = float("nan")
    for step in range(args.steps):
        samples = torch.from_numpy(rng.integers(0, len(x_train), args.batch_size))
        net.train()
        opt.zero_grad()
        loss = nn.functional.cross_entropy(net(x_train[samples]), y_train[samples])
        loss.backward()
        opt.step()
        if schedule is not None:
            schedule.step()
        if step % args.eval_every == args.eval_every - 1 or step == args.steps - 1:
            net.eval()
            with torch.no_grad():
                correct = sum(int((net(x_test[i:i + 500]).argmax(1) == y_test[i:i + 500]).sum())
                              for i in range(0, len(x_test), 500))
            accuracy = 100.0 * correct / len(x_test)
            print(f"step {step + 1}: loss {loss.item():.3f} test accuracy {accuracy:.2f}% "
                  f"({time.perf_counter() - start:.1f} s)", flush=True)
            if args.target is not None and accuracy >= args.target:
                break
    elapsed = time.perf_counter() - start
    print(f"pytorch {torch.__version__}: test accuracy {accuracy:.2f}% after {step + 1} steps of batch "
          f"{args.batch_size} in {elapsed:.1f} s ({elapsed / (step + 1) * 1000:.0f} ms/step incl. evaluation)")


if __name__ == "__main__":
    main()
