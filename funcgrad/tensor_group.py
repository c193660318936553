"""The base of the Tensor method groups (tensor_math, tensor_movement, tensor_nn, tensor_creation,
tensor_methods): what their methods use of a Tensor's own attributes, declared once for the type
checker. At run time the class is empty; tensor_methods copies the groups' methods onto Tensor."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from funcgrad.core.tensor import Tensor


class TensorGroup:
    if TYPE_CHECKING:  # provided by Tensor itself
        @property
        def shape(self) -> tuple[int, ...]: ...
        @property
        def ndim(self) -> int: ...
        @property
        def dtype(self) -> np.dtype: ...
        @property
        def size(self) -> int: ...
        def __getitem__(self, index: Any) -> Tensor: ...
        requires_grad: bool | None
