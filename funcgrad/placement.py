"""``device_put``: place values on a device (a front function: it builds Tensors, which the devices
layer below cannot import)."""

from __future__ import annotations

from typing import Any

from funcgrad.core.tensor import Tensor
from funcgrad.devices import Device
from funcgrad.util import tree


def device_put(x: Any, device: str | None = None) -> Any:
    """``x`` (a Tensor, array-like, or a pytree of them) placed on ``device`` (default:
    ``Device.DEFAULT``) and committed there, as ``Tensor.to`` does.

    >>> import funcgrad as fg
    >>> fg.device_put({"w": fg.numpy.ones(2)}, "CPU")["w"].device
    'CPU'
    """
    target = Device.DEFAULT if device is None else device

    def put(leaf: Any) -> Any:
        return leaf.to(target) if isinstance(leaf, Tensor) else Tensor(leaf, device=target)

    return tree.map(put, x)


def block_until_ready(x: Any) -> Any:
    """Compute every Tensor leaf of ``x`` now and return ``x`` (as ``jax.block_until_ready``); other
    leaves pass through."""
    for leaf in tree.leaves(x):
        if isinstance(leaf, Tensor):
            leaf.block_until_ready()
    return x
