"""funcgrad.nn: the training layer. ``Module`` (a pytree automatically), the layers
(``Linear``, ``Conv2d``, ``BatchNorm2d``, ...), initialisers (``nn.init``), the optimisers
(``nn.optim``), state dicts (``nn.state``) and data-parallel training across processes
(``nn.data_parallel``).

>>> model = nn.Sequential(nn.Linear(784, 128), nn.ReLU(), nn.Linear(128, 10))   # doctest: +SKIP
>>> grads = fg.grad(lambda m, x, y: loss(m(x), y))(model, x, y)                # doctest: +SKIP
"""

from funcgrad.nn import functional as functional
from funcgrad.nn import init, optim
from funcgrad.nn.module import Module
from funcgrad.nn.layers import (
    AvgPool2d, BatchNorm, BatchNorm1d, BatchNorm2d, Conv2d, Dropout, Embedding, Flatten, GELU, GroupNorm, Identity,
    LayerNorm, Linear, MaxPool2d, ModuleList, ReLU, RMSNorm, Sequential, Sigmoid, SiLU, Tanh,
)

__all__ = [
    "AvgPool2d", "BatchNorm", "BatchNorm1d", "BatchNorm2d", "Conv2d", "Dropout", "Embedding", "Flatten", "GELU",
    "GroupNorm", "Identity", "LayerNorm", "Linear", "MaxPool2d", "Module", "ModuleList", "RMSNorm", "ReLU",
    "Sequential", "SiLU", "Sigmoid", "Tanh", "data_parallel", "functional", "init", "optim", "state",
]


def __getattr__(name: str) -> object:
    """``nn.state`` and ``nn.data_parallel`` are imported on first use: state imports the safetensors
    package and bfloat16's ml_dtypes (~9 MB resident), which a training step does not need."""
    if name in ("state", "data_parallel"):
        import importlib
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
