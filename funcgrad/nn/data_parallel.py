"""Data-parallel training across processes: every rank holds the whole model, trains on its own
shard of each batch, and all ranks apply the same mean gradient, so they stay identical.

Five lines turn a training loop into a data-parallel one (launch it with ``mpirun -n 2 python3 ...``)::

    fg.distributed.initialize()                          # join the job (one process without mpirun)
    dp.broadcast_parameters(model)                       # every rank starts from rank 0's weights
    loader = DataLoader(X, Y, batch_size=64, shuffle=True, key=fr.key(0),
                        shard=(fg.distributed.process_index(), fg.distributed.process_count()))
    for x, y in loader:                                  # this rank's rows of each global batch
        opt.zero_grad(); loss_fn(model(x), y).backward(); dp.sync_gradients(opt); opt.step()

The functional form is ``params = dp.broadcast(params)`` once and
``grads = dp.allreduce_gradients(grads)`` between ``fg.grad`` and ``optimizer.update``.

How the gradients travel (PyTorch DDP's buckets, Horovod's tensor fusion): the leaves are grouped
by the dtype they are summed in and packed, in order, into contiguous host buffers of about
``bucket_mb`` (25 MB) each; a leaf larger than that has a bucket of its own. Each bucket is one
``allreduce`` of the engine (``funcgrad.util.collective_engine.get_engine()``), divided by the
number of processes, and split back into leaves (views of the reduced buffer, no copy). The
layout depends only on the leaves' shapes and dtypes, so every rank builds the same buckets.
16-bit floats are summed in float32 (MPI has no bfloat16 sum; float32 is also the more accurate).
Broadcasts pack raw bytes, so one bucket carries leaves of every dtype.

With one process (the local engine) every function here is the identity and returns its input
unchanged: the same script runs with and without ``mpirun``. The all-reduce needs concrete values,
so it runs outside ``fg.jit``: jit the gradient and the update as two functions and all-reduce
between them (docs/distributed.md, "Data-parallel training").
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.autograd import set_grad
from funcgrad.core.tensor import Tensor, tensor_from_host
from funcgrad.ir import dtypes
from funcgrad.lazy import LazyBuffer, realize
from funcgrad.lower import pool
from funcgrad.nn.optim import Optimizer
from funcgrad.nn.state import get_parameters
from funcgrad.util import tree
from funcgrad.util.collective_engine import CollectiveEngine, get_engine

__all__ = ["DEFAULT_BUCKET_MB", "Bucket", "allreduce_gradients", "broadcast", "broadcast_parameters",
           "plan_buckets", "sync_gradients"]

DEFAULT_BUCKET_MB = 25.0
BROADCAST_ALIGN = 16  # byte offset of every leaf in a broadcast bucket (each dtype's view stays aligned)
_REDUCTIONS = ("mean", "sum")


@dataclasses.dataclass(frozen=True)
class Bucket:
    """One contiguous buffer of the wire dtype: ``members[k]`` (a leaf index) occupies elements
    ``offsets[k] : offsets[k] + sizes[k]``."""

    wire: np.dtype
    members: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    @property
    def length(self) -> int:
        return self.offsets[-1] + self.sizes[-1] if self.members else 0


def _wire_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a gradient of ``dtype`` is summed in: 16-bit floats in float32, others as they are."""
    return np.dtype(np.float32) if dtype.itemsize < 4 and dtypes.is_float(dtype) else np.dtype(dtype)


def _bucket_bytes(what: str, bucket_mb: float) -> int:
    if isinstance(bucket_mb, bool) or not isinstance(bucket_mb, (int, float)) or not bucket_mb > 0:
        raise ValueError(f"{what}: bucket_mb must be a number > 0 (megabytes per fused buffer), got {bucket_mb!r}")
    return max(1, int(bucket_mb * 1e6))


def plan_buckets(shapes: Sequence[tuple[int, ...]], leaf_dtypes: Sequence[Any],
                 bucket_mb: float = DEFAULT_BUCKET_MB) -> list[Bucket]:
    """Group leaves (by shape and dtype) into buckets of at most ``bucket_mb`` megabytes each (a
    larger leaf alone), one wire dtype per bucket (16-bit floats join the float32 ones), leaves in
    their order within each wire dtype.

    >>> [b.members for b in plan_buckets([(3,), (2, 2), (5,)], ["float32", "float64", "float16"])]
    [(0, 2), (1,)]
    """
    return list(_plan(tuple(tuple(int(d) for d in shape) for shape in shapes),
                      tuple(np.dtype(dtype) for dtype in leaf_dtypes), _bucket_bytes("plan_buckets", bucket_mb)))


@functools.lru_cache(maxsize=64)  # a training loop asks for the same layout every step
def _plan(shapes: tuple[tuple[int, ...], ...], leaf_dtypes: tuple[np.dtype, ...], limit: int) -> tuple[Bucket, ...]:
    open_buckets: dict[np.dtype, list[tuple[int, int]]] = {}  # wire dtype -> (leaf, size) of the bucket being filled
    done: list[tuple[np.dtype, list[tuple[int, int]]]] = []
    for index, (shape, dtype) in enumerate(zip(shapes, leaf_dtypes)):
        wire = _wire_dtype(dtype)
        size = math.prod(shape)
        current = open_buckets.setdefault(wire, [])
        used = sum(n for _, n in current) * wire.itemsize
        if current and used + size * wire.itemsize > limit:
            done.append((wire, current))
            current = open_buckets[wire] = []
        current.append((index, size))
    done.extend((wire, members) for wire, members in open_buckets.items() if members)
    buckets = []
    for wire, members in sorted(done, key=lambda item: item[1][0][0]):  # in order of each bucket's first leaf
        sizes = tuple(n for _, n in members)
        offsets = tuple(itertools.accumulate(sizes[:-1], initial=0))
        buckets.append(Bucket(wire, tuple(i for i, _ in members), offsets, sizes))
    return tuple(buckets)


# --- host values in and out ----------------------------------------------------------------------

def _check_concrete(what: str, leaves: Sequence[Any]) -> None:
    for leaf in leaves:
        if isinstance(leaf, Tensor) and leaf.is_traced:
            raise RuntimeError(f"{what}: got a traced value (inside fg.jit, fg.grad or fg.vmap); the collective "
                               "engine needs concrete arrays, so call it outside the transform: jit the gradient "
                               "and the update as two functions and call it between them")


def _host_arrays(leaves: Sequence[Any]) -> list[np.ndarray]:
    """Each leaf as a host array (Tensors computed together first, then read without copies)."""
    pending = [leaf._data for leaf in leaves if isinstance(leaf, Tensor) and isinstance(leaf._data, LazyBuffer)]
    if pending:
        realize(pending)
    return [np.asarray(leaf) for leaf in leaves]


def _like(leaf: Any, value: np.ndarray) -> Any:
    """``value`` in the form of ``leaf``: a Tensor on its device, a NumPy array, or a Python scalar.
    A Tensor holds ``value`` itself (no copy: the reduced bucket is fresh and nothing else writes it)."""
    if isinstance(leaf, Tensor):
        result = tensor_from_host(value.astype(leaf.dtype, copy=False))
        return result if result.device == leaf.device else result.to(leaf.device)
    if isinstance(leaf, np.ndarray):
        return value
    if isinstance(leaf, (bool, int, float, complex)):
        return type(leaf)(value.item())
    return value  # NumPy scalars and other array-likes come back as arrays


def _check_op(what: str, op: str) -> None:
    if op not in _REDUCTIONS:
        raise ValueError(f"{what}: op must be one of {', '.join(map(repr, _REDUCTIONS))}, got {op!r}")


def _reduce_leaves(what: str, arrays: Sequence[np.ndarray], op: str, bucket_mb: float,
                   engine: CollectiveEngine) -> list[np.ndarray]:
    """Sum (or average) every array over the ranks, one engine allreduce per bucket."""
    for index, array in enumerate(arrays):
        if not (dtypes.is_float(array.dtype) or np.issubdtype(array.dtype, np.complexfloating)):
            raise TypeError(f"{what}: leaf {index} has dtype {array.dtype.name}; gradients are floating point")
    results: list[np.ndarray] = [np.empty(0)] * len(arrays)
    # the mean over a power-of-two number of ranks: each leaf scaled by 1/size while it is packed (exact:
    # a power of two), which saves the division's pass over the reduced bucket
    prescale = op == "mean" and engine.size & (engine.size - 1) == 0
    for bucket in plan_buckets([a.shape for a in arrays], [a.dtype for a in arrays], bucket_mb):
        alone = arrays[bucket.members[0]]
        packed = not (len(bucket.members) == 1 and alone.dtype == bucket.wire and alone.flags.c_contiguous)
        if not packed:
            buffer = alone.reshape(-1)  # one leaf: no packing (the engine only reads its input)
        else:
            buffer = pool.empty((bucket.length,), bucket.wire)  # large ones recycled: no fresh pages a step
            for member, offset, size in zip(bucket.members, bucket.offsets, bucket.sizes):
                if prescale:
                    np.multiply(arrays[member].reshape(-1), 1.0 / engine.size, out=buffer[offset:offset + size],
                                dtype=bucket.wire)
                else:
                    buffer[offset:offset + size] = arrays[member].reshape(-1)
        reduced = engine.allreduce(buffer, "sum")
        if np.may_share_memory(reduced, buffer) or not reduced.flags.writeable:
            reduced = np.array(reduced, copy=True)  # an engine that handed back its input: never write into a leaf
        if op == "mean" and not (prescale and packed):
            reduced /= engine.size
        for member, offset, size in zip(bucket.members, bucket.offsets, bucket.sizes):
            results[member] = reduced[offset:offset + size].astype(arrays[member].dtype, copy=False) \
                .reshape(arrays[member].shape)
    return results


# --- the functional form ---------------------------------------------------------------------------

def allreduce_gradients(grads: Any, op: str = "mean", bucket_mb: float = DEFAULT_BUCKET_MB) -> Any:
    """The mean (or sum, ``op="sum"``) over all processes of each leaf of the pytree ``grads``, in a
    pytree of the same structure and leaf types. Every rank must pass the same structure, shapes
    and dtypes. With one process it returns ``grads`` itself.

    >>> loss, grads = fg.value_and_grad(loss_fn)(params, x, y)           # doctest: +SKIP
    >>> grads = dp.allreduce_gradients(grads)                           # doctest: +SKIP
    >>> params, state = optimizer.update(grads, state, params)          # doctest: +SKIP
    """
    _check_op("allreduce_gradients", op)
    _bucket_bytes("allreduce_gradients", bucket_mb)
    leaves, treedef = tree.flatten(grads)
    _check_concrete("allreduce_gradients", leaves)
    engine = get_engine()
    if engine.size == 1 or not leaves:
        return grads
    reduced = _reduce_leaves("allreduce_gradients", _host_arrays(leaves), op, bucket_mb, engine)
    return tree.unflatten(treedef, [_like(leaf, value) for leaf, value in zip(leaves, reduced)])


def _check_root(what: str, root: int, engine: CollectiveEngine) -> None:
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)) or not 0 <= root < engine.size:
        processes = "1 process" if engine.size == 1 else f"{engine.size} processes"
        raise ValueError(f"{what}: root {root!r} is not a rank of a job of {processes}")


def _broadcast_arrays(what: str, arrays: Sequence[np.ndarray], root: int, bucket_mb: float,
                      engine: CollectiveEngine) -> list[np.ndarray]:
    """Rank ``root``'s arrays on every rank: raw bytes packed into buckets, one broadcast each."""
    limit = _bucket_bytes(what, bucket_mb)
    spans = [-(-a.nbytes // BROADCAST_ALIGN) * BROADCAST_ALIGN for a in arrays]
    groups: list[list[int]] = []
    used = 0
    for index, span in enumerate(spans):
        if not groups or (used and used + span > limit):
            groups.append([])
            used = 0
        groups[-1].append(index)
        used += span
    results: list[np.ndarray] = [np.empty(0)] * len(arrays)
    for group in groups:
        offsets = np.concatenate([[0], np.cumsum([spans[i] for i in group])]).astype(int)
        buffer = np.zeros(int(offsets[-1]), np.uint8)
        if engine.rank == root:
            for index, offset in zip(group, offsets):
                buffer[offset:offset + arrays[index].nbytes] = np.ascontiguousarray(arrays[index]).reshape(-1) \
                    .view(np.uint8)
        received = engine.broadcast(buffer, root)
        for index, offset in zip(group, offsets):
            array = arrays[index]
            results[index] = received[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
    return results


def _signature_check(what: str, arrays: Sequence[np.ndarray], engine: CollectiveEngine) -> None:
    """Every rank learns every rank's leaf count and byte total; all raise alike when they differ
    (a broadcast of different sizes would otherwise hang or cut the data)."""
    mine = np.array([len(arrays), sum(a.nbytes for a in arrays)], np.int64)
    everyone = engine.allgather(mine)
    if (everyone != everyone[0]).any():
        described = ", ".join(f"rank {r}: {int(n)} leaves of {int(b)} bytes" for r, (n, b) in enumerate(everyone))
        raise ValueError(f"{what}: the ranks passed different pytrees ({described}); every rank must build the "
                         "same model before the broadcast")


def broadcast(values: Any, root: int = 0, bucket_mb: float = DEFAULT_BUCKET_MB) -> Any:
    """Rank ``root``'s values of the pytree ``values`` on every rank, in a new pytree of the same
    structure and leaf types (Tensors stay Tensors, NumPy arrays arrays, Python scalars scalars).
    With one process it returns ``values`` itself.

    >>> params = dp.broadcast(init_params(fr.key(rank_seed)))   # every rank now has rank 0's   # doctest: +SKIP
    """
    leaves, treedef = tree.flatten(values)
    _check_concrete("broadcast", leaves)
    engine = get_engine()
    _bucket_bytes("broadcast", bucket_mb)
    _check_root("broadcast", root, engine)
    if engine.size == 1:
        return values
    arrays = _host_arrays(leaves)
    _signature_check("broadcast", arrays, engine)
    received = _broadcast_arrays("broadcast", arrays, root, bucket_mb, engine)
    return tree.unflatten(treedef, [_like(leaf, value) for leaf, value in zip(leaves, received)])


# --- the stateful form: Tensors updated in place ---------------------------------------------------

def _tensors_of(what: str, obj: Any) -> list[Tensor]:
    tensors = obj.params if isinstance(obj, Optimizer) else get_parameters(obj)
    if not tensors:
        raise ValueError(f"{what}: {type(obj).__name__} holds no Tensors")
    return list(tensors)


def broadcast_parameters(obj: Any, root: int = 0, bucket_mb: float = DEFAULT_BUCKET_MB) -> None:
    """Put rank ``root``'s values into every Tensor of ``obj`` (a Module with its buffers, an
    optimiser with its state, a list or dict of Tensors), in place: the Tensor objects stay, so an
    optimiser made before or after sees them. With one process it changes nothing.

    >>> model = Model(); dp.broadcast_parameters(model)          # doctest: +SKIP
    """
    tensors = get_parameters(obj)
    _check_concrete("broadcast_parameters", tensors)
    engine = get_engine()
    _bucket_bytes("broadcast_parameters", bucket_mb)
    _check_root("broadcast_parameters", root, engine)
    if engine.size == 1:
        return
    arrays = _host_arrays(tensors)
    _signature_check("broadcast_parameters", arrays, engine)
    received = _broadcast_arrays("broadcast_parameters", arrays, root, bucket_mb, engine)
    for tensor, value in zip(tensors, received):
        tensor._data = _like(tensor, value)._data  # swap the value in; the Tensor object stays


def sync_gradients(obj: Any, op: str = "mean", bucket_mb: float = DEFAULT_BUCKET_MB) -> None:
    """Replace the ``.grad`` of every trainable Tensor of ``obj`` (an optimiser's parameters, or the
    Tensors with ``requires_grad`` of a Module or list) by its mean over all processes, in place;
    call it between ``loss.backward()`` and ``opt.step()``. A ``.grad`` that is None on some ranks
    counts as zeros there; it stays None only where it is None on every rank. With one process it
    changes nothing.

    >>> opt.zero_grad(); loss.backward(); dp.sync_gradients(opt); opt.step()   # doctest: +SKIP
    """
    _check_op("sync_gradients", op)
    _bucket_bytes("sync_gradients", bucket_mb)
    params = _tensors_of("sync_gradients", obj)
    if not isinstance(obj, Optimizer):
        params = [p for p in params if p.requires_grad]
    grads = [p.grad for p in params]
    _check_concrete("sync_gradients", [g for g in grads if g is not None])
    engine = get_engine()
    if engine.size == 1 or not params:
        return
    for p, g in zip(params, grads):
        if g is not None and g.shape != p.shape:
            raise ValueError(f"sync_gradients: a parameter of shape {p.shape} has a .grad of shape {g.shape}")
    present = [g is not None for g in grads]
    counts = engine.allreduce(np.array(present, np.float32), "sum")  # which ranks have each gradient
    host = _host_arrays([g for g in grads if g is not None])
    filled = iter(host)
    arrays = [next(filled).astype(p.dtype, copy=False) if has else np.zeros(p.shape, p.dtype)
              for p, has in zip(params, present)]
    reduced = _reduce_leaves("sync_gradients", arrays, op, bucket_mb, engine)
    for p, count, value in zip(params, counts, reduced):
        set_grad(p, _like(p, value) if count > 0 else None)
