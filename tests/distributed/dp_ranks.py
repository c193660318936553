"""The program every rank runs for tests/distributed/test_data_parallel.py (``mpirun -n 2``): each
check compares what the ranks got through ``funcgrad.nn.data_parallel`` with what each rank computes
alone from every rank's inputs (every rank can make every rank's data: it is seeded by rank). Any
failure raises, and ``python -m mpi4py`` then ends the whole job non-zero. Prints one line a rank."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor, nn
from funcgrad.nn import data_parallel as dp
from funcgrad.util.collective_engine import get_engine, set_engine


def rank_values(rank: int) -> dict:
    """A pytree of gradients that differ by rank, in several dtypes."""
    rng = np.random.default_rng(100 + rank)
    return {"w": rng.normal(size=(7, 5)).astype(np.float32), "b": rng.normal(size=5).astype(np.float32),
            "half": rng.normal(size=(3, 3)).astype(np.float16), "wide": rng.normal(size=11),  # float64
            "big": rng.normal(size=(300, 10)).astype(np.float32)}


def check_allreduce(rank: int, size: int) -> None:
    grads = {k: (Tensor(v, dtype=v.dtype) if k != "wide" else v) for k, v in rank_values(rank).items()}
    for bucket_mb in (25.0, 0.004):  # one bucket per dtype; then a bucket every few leaves (4 kB)
        mean = dp.allreduce_gradients(grads, bucket_mb=bucket_mb)
        total = dp.allreduce_gradients(grads, op="sum", bucket_mb=bucket_mb)
        for key in grads:
            exact = sum(rank_values(r)[key].astype(np.float64) for r in range(size))
            tol = 1e-2 if key == "half" else 1e-6
            assert type(mean[key]) is type(grads[key]), key
            assert np.asarray(mean[key]).dtype == np.asarray(grads[key]).dtype, key
            np.testing.assert_allclose(np.asarray(mean[key]), exact / size, rtol=tol, atol=tol, err_msg=key)
            np.testing.assert_allclose(np.asarray(total[key]), exact, rtol=tol, atol=tol, err_msg=key)
            if key != "half":  # a power-of-two rank count: the mean (scaled while packed) is the sum's half exactly
                np.testing.assert_array_equal(np.asarray(mean[key]), np.asarray(total[key]) / size, err_msg=key)


def check_broadcast(rank: int, size: int) -> None:
    Tensor.manual_seed(rank)  # each rank its own weights
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    objects = [id(t) for t in nn.state.get_parameters(model)]
    dp.broadcast_parameters(model, bucket_mb=0.0001)  # 100 bytes: several buckets
    assert [id(t) for t in nn.state.get_parameters(model)] == objects  # the same Tensors, new values
    state = {k: v.numpy() for k, v in nn.state.get_state_dict(model).items()}
    everyone = get_engine().allgather(np.concatenate([v.ravel().astype(np.float64) for v in state.values()]))
    assert (everyone == everyone[0]).all(), "ranks differ after broadcast_parameters"
    Tensor.manual_seed(0)
    reference = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    for key, value in nn.state.get_state_dict(reference).items():
        np.testing.assert_array_equal(state[key], value.numpy(), err_msg=key)

    root = size - 1  # a pytree of mixed leaves, from the last rank
    tree = {"t": Tensor(np.full(3, rank, np.float32)), "i": np.arange(4, dtype=np.int64) * rank,
            "bf": Tensor(np.full(2, rank + 0.5, np.float32)).astype("bfloat16"), "s": float(rank), "n": rank}
    got = dp.broadcast(tree, root=root)
    assert isinstance(got["t"], Tensor) and got["t"].tolist() == [root] * 3
    assert isinstance(got["i"], np.ndarray) and got["i"].tolist() == [root * k for k in range(4)]
    assert got["bf"].dtype == tree["bf"].dtype and got["bf"].astype("float32").tolist() == [root + 0.5] * 2
    assert got["s"] == float(root) and type(got["s"]) is float and got["n"] == root and type(got["n"]) is int

    # ranks that pass different pytrees all get the error (none is left waiting in the broadcast)
    mismatched = {"a": np.zeros(3, np.float32), **({"b": np.zeros(1, np.float32)} if rank == 1 else {})}
    try:
        dp.broadcast(mismatched)
    except ValueError as error:
        assert "rank 0: 1 leaves of 12 bytes, rank 1: 2 leaves of 16 bytes" in str(error), error
    else:
        raise AssertionError("broadcast of different pytrees did not raise")


def check_sync_gradients(rank: int, size: int) -> None:
    """``.grad`` None on some ranks counts as zeros; None on every rank stays None."""
    params = [Tensor(np.zeros(3, np.float32), requires_grad=True) for _ in range(3)]
    opt = nn.optim.SGD(params, lr=1.0)
    params[0].grad = Tensor(np.full(3, rank + 1.0, np.float32))
    params[1].grad = Tensor(np.full(3, 4.0, np.float32)) if rank == 0 else None
    dp.sync_gradients(opt, bucket_mb=1e-6)
    assert params[0].grad.tolist() == [sum(range(1, size + 1)) / size] * 3
    assert params[1].grad.tolist() == [4.0 / size] * 3
    assert params[2].grad is None
    opt.step()
    assert params[0].tolist() == [-sum(range(1, size + 1)) / size] * 3


def loss_fn(params: dict, x: Tensor, y: Tensor) -> Tensor:
    hidden = fnp.tanh(x @ params["w1"] + params["b1"])
    return fnp.mean((hidden @ params["w2"] - y) ** 2)


def train_functional(params: dict, batches: list, optimizer: nn.optim.FunctionalOptimizer) -> dict:
    state = optimizer.init(params)
    value_and_grad, update = fg.jit(fg.value_and_grad(loss_fn)), fg.jit(optimizer.update)
    for x, y in batches:
        _, grads = value_and_grad(params, x, y)
        params, state = update(dp.allreduce_gradients(grads), state, params)
    return params


def check_functional_training(rank: int, size: int) -> None:
    """Each rank trains on its shard; the result is one process's training on the global batches."""
    rng = np.random.default_rng(7)
    X, Y = rng.normal(size=(48, 5)).astype(np.float32), rng.normal(size=(48, 2)).astype(np.float32)
    init = {"w1": rng.normal(size=(5, 8)).astype(np.float32), "b1": np.zeros(8, np.float32),
            "w2": rng.normal(size=(8, 2)).astype(np.float32)}
    optimizer = nn.optim.sgd(0.05, momentum=0.9)
    key = fg.random.key(3)
    params = dp.broadcast({k: Tensor(v) * (rank + 1) for k, v in init.items()})  # rank 0's: init itself
    shard = fg.datasets.DataLoader(X, Y, batch_size=4, shuffle=True, key=key, shard=(rank, size))
    trained = train_functional(params, [b for _ in range(2) for b in shard], optimizer)

    engine = get_engine()
    set_engine(None)  # the single-process reference, on this rank alone
    try:
        whole = fg.datasets.DataLoader(X, Y, batch_size=4 * size, shuffle=True, key=key)
        alone = train_functional({k: Tensor(v) for k, v in init.items()}, [b for _ in range(2) for b in whole],
                                 optimizer)
    finally:
        set_engine(engine)
    for key_name in init:
        np.testing.assert_allclose(trained[key_name].numpy(), alone[key_name].numpy(), rtol=1e-5, atol=1e-6,
                                   err_msg=key_name)


def run_example(arguments: list[str]) -> None:
    """examples/data_parallel_mnist.py in this job (one launch of mpirun for the whole test file)."""
    path = Path(__file__).resolve().parents[2] / "examples" / "data_parallel_mnist.py"
    spec = importlib.util.spec_from_file_location("data_parallel_mnist", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.main(arguments)


def main() -> None:
    fg.distributed.initialize()
    rank, size = fg.distributed.process_index(), fg.distributed.process_count()
    assert size >= 2, f"run with mpirun -n 2 (got {size} process)"
    checks = [check_allreduce, check_broadcast, check_sync_gradients, check_functional_training]
    for check in checks:
        check(rank, size)
    print(f"rank {rank} of {size}: {len(checks)} checks passed", flush=True)
    if len(sys.argv) > 1:  # the example's arguments follow
        run_example(sys.argv[1:])


if __name__ == "__main__":
    main()
