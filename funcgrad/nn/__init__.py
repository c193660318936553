"""funcgrad.nn: the training layer. Today: the stateful optimisers of ``nn.optim`` (used with
``loss.backward()``). Layers, losses, state and the functional optimiser forms come with the
training-layer issue."""

from funcgrad.nn import optim

__all__ = ["optim"]
