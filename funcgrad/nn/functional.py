"""funcgrad.nn.functional: PyTorch's place for the functional layer (``import
funcgrad.nn.functional as F``), re-exporting ``funcgrad.functional``.

The functions themselves (convolution, pooling, norms, activations, dropout, losses, attention)
are pure functions on arrays and live in the front, ``funcgrad/functional.py``, so that the
Tensor methods can call them without importing the training layer.

>>> import funcgrad as fg
>>> from funcgrad.nn import functional as F
>>> F.relu(fg.Tensor([-1.0, 2.0])).tolist()
[0.0, 2.0]
"""

from funcgrad.functional import (
    adaptive_avg_pool2d,
    avg_pool2d,
    batch_norm,
    binary_crossentropy,
    binary_crossentropy_with_logits,
    conv1d,
    conv2d,
    cross_entropy,
    dropout,
    elu,
    embedding,
    gelu,
    group_norm,
    l1_loss,
    layer_norm,
    leaky_relu,
    linear,
    log_softmax,
    logsumexp,
    max_pool2d,
    mse,
    mse_loss,
    nll_loss,
    relu,
    rms_norm,
    scaled_dot_product_attention,
    sigmoid,
    silu,
    softmax,
    softplus,
    sparse_categorical_crossentropy,
    tanh,
)

__all__ = [
    "adaptive_avg_pool2d", "avg_pool2d", "batch_norm", "binary_crossentropy", "binary_crossentropy_with_logits",
    "conv1d", "conv2d", "cross_entropy", "dropout", "elu", "embedding", "gelu", "group_norm", "l1_loss",
    "layer_norm", "leaky_relu", "linear", "log_softmax", "logsumexp", "max_pool2d", "mse", "mse_loss",
    "nll_loss", "relu", "rms_norm", "scaled_dot_product_attention", "sigmoid", "silu", "softmax", "softplus",
    "sparse_categorical_crossentropy", "tanh",
]
