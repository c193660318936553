"""funcgrad: composable transformations of array programs, compiled into fused kernels.

>>> import funcgrad as fg
>>> import funcgrad.numpy as fnp
>>> print(fg.make_ir(lambda x: fnp.sin(x) * 2)(fnp.ones(3)))
{ lambda a:f32[3]. let
    b:f32[3] = sin a
    c:f32[3] = mul b 2.0:f32[]
  in (c,) }
"""

from funcgrad.util import tree
from funcgrad import lazy as _lazy  # registers the core's eager handler before anything computes a value
from funcgrad import devices  # a package, callable as fg.devices() (see funcgrad/devices/__init__.py)
from funcgrad.devices import Device
from funcgrad.ir import dtypes
from funcgrad.ir.core import IR, ShapedArray
from funcgrad.ir.tracing import ConcretizationError, EscapedTracerError, TracerError
from funcgrad.core.tensor import Array, Tensor
from funcgrad import tensor_methods as _tensor_methods  # attaches operators and methods to Tensor
from funcgrad import numpy
from funcgrad import random
from funcgrad.core.trace import make_ir
from funcgrad.transforms import (
    checkpoint, checkpoint_name, checkpoint_policies, custom_jvp, custom_vjp, eval_shape, grad, hessian, jacfwd,
    jacobian, jacrev, jvp, linearize, print_saved_residuals, saved_residuals, stop_gradient, value_and_grad, vjp, vmap,
)
from funcgrad.jit_runtime import jit
from funcgrad import lax
from funcgrad import nn
from funcgrad import datasets
from funcgrad.parallel import pmap, shard_map
from funcgrad.util import config  # fg.config.update("debug_nans", True), as jax.config
from funcgrad.nan_check import debug_infs, debug_nans
from funcgrad.placement import block_until_ready, device_put

remat = checkpoint

from funcgrad.util.version import __version__


def __getattr__(name: str) -> object:  # fg.distributed is imported on first use (a training step never needs it)
    if name == "distributed":
        import importlib
        return importlib.import_module("funcgrad.distributed")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "Array", "ConcretizationError", "Device", "block_until_ready", "config", "debug_infs", "debug_nans",
    "device_put", "devices",
    "EscapedTracerError", "IR", "ShapedArray", "Tensor", "TracerError",
    "checkpoint", "checkpoint_name", "checkpoint_policies", "print_saved_residuals", "saved_residuals",
    "custom_jvp", "custom_vjp", "datasets", "distributed", "dtypes", "eval_shape", "grad", "hessian", "jacfwd",
    "jacobian", "jacrev",
    "jit", "jvp", "lax", "linearize", "make_ir", "nn", "numpy", "random", "remat", "stop_gradient", "tree",
    "value_and_grad", "vjp", "vmap", "pmap", "shard_map",
]
