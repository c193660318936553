"""Layers and initialisers: outputs against NumPy float64 references (always) and outputs plus
gradients against PyTorch (when installed, weights copied over through the state-dict names);
BatchNorm running statistics; init statistics; errors that name the layer and the shapes."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import nn
from funcgrad.nn import init
from tests.conftest import assert_close

F32 = dict(rtol=2e-5, atol=2e-5)


def _normal(shape: tuple[int, ...], seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _key(seed: int = 0) -> fg.Tensor:
    return fg.random.key(seed)


def _grads(layer: nn.Module, x: np.ndarray, upstream: np.ndarray) -> tuple[fg.Tensor, nn.Module, fg.Tensor | None]:
    """(output, d loss / d layer, d loss / d x or None for integer x) for loss = sum(layer(x) * upstream)."""
    out = layer(x)
    loss = lambda m, x: fnp.sum(m(x) * upstream)
    if x.dtype.kind != "f":
        return out, fg.grad(loss)(layer, x), None
    grad_layer, grad_x = fg.grad(loss, argnums=(0, 1))(layer, x)
    return out, grad_layer, grad_x


# --- NumPy float64 references ----------------------------------------------------------------------

def conv2d_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, stride: tuple[int, int],
                     padding: tuple[int, int], dilation: tuple[int, int], groups: int) -> np.ndarray:
    x = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2))
    n, _, h, width = x.shape
    out_channels, group_channels, kh, kw = w.shape
    oh = (h - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (width - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    out = np.zeros((n, out_channels, oh, ow))
    per_group = out_channels // groups
    for g in range(groups):
        xs = x[:, g * group_channels:(g + 1) * group_channels]
        ws = w[g * per_group:(g + 1) * per_group].astype(np.float64)
        for i in range(kh):
            for j in range(kw):
                top, left = i * dilation[0], j * dilation[1]
                rows = slice(top, top + stride[0] * (oh - 1) + 1, stride[0])
                cols = slice(left, left + stride[1] * (ow - 1) + 1, stride[1])
                patch = xs[:, :, rows, cols]
                out[:, g * per_group:(g + 1) * per_group] += np.einsum("nchw,oc->nohw", patch, ws[:, :, i, j])
    return out if b is None else out + b.reshape(1, -1, 1, 1)


def pool_reference(x: np.ndarray, kernel: int, stride: int, reduce: Any) -> np.ndarray:
    n, c, h, w = x.shape
    oh, ow = (h - kernel) // stride + 1, (w - kernel) // stride + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = x[:, :, i * stride:i * stride + kernel, j * stride:j * stride + kernel]
            out[:, :, i, j] = reduce(window, axis=(2, 3))
    return out


def test_linear_matches_numpy() -> None:
    layer = nn.Linear(4, 3, key=_key())
    x = _normal((5, 4))
    expected = x.astype(np.float64) @ layer.weight.numpy().T.astype(np.float64) + layer.bias.numpy()
    assert_close(layer(x).numpy(), expected, **F32)
    no_bias = nn.Linear(4, 3, bias=False, key=_key())
    assert no_bias.bias is None
    assert_close(no_bias(x).numpy(), expected - layer.bias.numpy(), **F32)
    assert layer(_normal((2, 7, 4))).shape == (2, 7, 3)


@pytest.mark.parametrize("stride, padding, dilation, groups", [
    (1, 0, 1, 1), (2, 1, 1, 1), (1, 2, 2, 1), (1, 1, 1, 2),
])
def test_conv2d_matches_numpy(stride: int, padding: int, dilation: int, groups: int) -> None:
    layer = nn.Conv2d(4, 6, 3, stride=stride, padding=padding, dilation=dilation, groups=groups, key=_key())
    assert layer.weight.shape == (6, 4 // groups, 3, 3) and layer.bias.shape == (6,)
    x = _normal((2, 4, 7, 7))
    expected = conv2d_reference(x, layer.weight.numpy(), layer.bias.numpy(), (stride,) * 2, (padding,) * 2,
                                (dilation,) * 2, groups)
    assert_close(layer(x).numpy(), expected, **F32)


def test_conv2d_rectangular_kernel_and_unbatched_input() -> None:
    layer = nn.Conv2d(2, 3, (2, 3), stride=(1, 2), bias=False, key=_key())
    x = _normal((2, 5, 6))
    expected = conv2d_reference(x[None], layer.weight.numpy(), None, (1, 2), (0, 0), (1, 1), 1)[0]
    assert_close(layer(x).numpy(), expected, **F32)


def _batch_norm_reference(x: np.ndarray, mean: np.ndarray, var: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + eps)


def test_batchnorm_train_updates_running_statistics_in_place_and_eval_uses_them() -> None:
    bn = nn.BatchNorm2d(3)
    running_mean = bn.running_mean
    batches = [_normal((4, 3, 2, 2), seed) * 2 + 1 for seed in (1, 2)]
    mean, var = np.zeros(3), np.ones(3)
    bn.train()
    for x in batches:
        x64 = x.astype(np.float64)
        batch_mean, batch_var = x64.mean(axis=(0, 2, 3)), x64.var(axis=(0, 2, 3))
        assert_close(bn(x).numpy(), _batch_norm_reference(x64, batch_mean, batch_var), **F32)
        mean = 0.9 * mean + 0.1 * batch_mean
        var = 0.9 * var + 0.1 * x64.var(axis=(0, 2, 3), ddof=1)
    assert bn.running_mean is running_mean    # the same Tensor object, new value
    assert_close(bn.running_mean.numpy(), mean, **F32)
    assert_close(bn.running_var.numpy(), var, **F32)
    assert bn.num_batches_tracked.item() == 2
    bn.eval()
    assert_close(bn(batches[0]).numpy(), _batch_norm_reference(batches[0].astype(np.float64), mean, var), **F32)
    assert bn.num_batches_tracked.item() == 2


def test_batchnorm_running_statistics_update_under_jit_as_eagerly() -> None:
    eager, jitted = nn.BatchNorm1d(3).train(), nn.BatchNorm1d(3).train()
    running_var = jitted.running_var
    step = fg.jit(lambda model, x: model(x))
    for seed in range(3):
        x = _normal((8, 3), seed)
        assert_close(step(jitted, x).numpy(), eager(x).numpy(), **F32)
    assert step.trace_count == 1 and jitted.running_var is running_var
    for name, buffer in eager.named_buffers():
        assert_close(dict(jitted.named_buffers())[name].numpy(), buffer.numpy(), **F32)
    assert jitted.num_batches_tracked.item() == 3


def test_batchnorm_follows_tensor_train_and_momentum_none_is_a_cumulative_average() -> None:
    bn = nn.BatchNorm1d(2, momentum=None)
    batches = [_normal((5, 2), seed) for seed in (3, 4, 5)]
    with fg.Tensor.train():
        for x in batches:
            bn(x)
    expected = np.mean([x.astype(np.float64).mean(axis=0) for x in batches], axis=0)
    assert_close(bn.running_mean.numpy(), expected, **F32)


def test_batchnorm_without_running_statistics_always_uses_the_batch() -> None:
    bn = nn.BatchNorm1d(2, affine=False, track_running_stats=False)
    assert bn.weight is None and bn.running_mean is None and bn.buffers() == []
    x = _normal((6, 2, 3))
    x64 = x.astype(np.float64)
    expected = _batch_norm_reference(x64, x64.mean(axis=(0, 2)), x64.var(axis=(0, 2)))
    assert_close(bn.eval()(x).numpy(), expected, **F32)


def test_batchnorm_inside_grad_of_a_closure_leaves_the_running_statistics_alone() -> None:
    bn = nn.BatchNorm1d(2).train()
    x = _normal((4, 2))
    fg.grad(lambda x: fnp.sum(bn(x) ** 3))(fnp.asarray(x))
    assert bn.running_mean.tolist() == [0.0, 0.0] and bn.num_batches_tracked.item() == 0


def test_batchnorm_functional_style_returns_the_updated_model_as_aux() -> None:
    bn = nn.BatchNorm1d(2).train()
    x = _normal((4, 2))

    def loss(model: nn.Module, x: Any) -> Any:
        return fnp.sum(model(x) ** 2), model

    grads, updated = fg.grad(loss, has_aux=True)(bn, x)
    assert type(grads) is nn.BatchNorm1d and bn.num_batches_tracked.item() == 0
    assert_close(updated.running_mean.numpy(), 0.1 * x.astype(np.float64).mean(axis=0), **F32)


def test_layernorm_rmsnorm_groupnorm_match_numpy() -> None:
    x = _normal((2, 4, 3))
    x64 = x.astype(np.float64)
    mean, var = x64.mean(axis=(1, 2), keepdims=True), x64.var(axis=(1, 2), keepdims=True)
    assert_close(nn.LayerNorm((4, 3))(x).numpy(), (x64 - mean) / np.sqrt(var + 1e-5), **F32)
    rms = nn.RMSNorm(3, eps=1e-6)(x).numpy()
    assert_close(rms, x64 / np.sqrt((x64**2).mean(axis=-1, keepdims=True) + 1e-6), **F32)
    groups = x64.reshape(2, 2, 6)
    g_mean, g_var = groups.mean(axis=-1, keepdims=True), groups.var(axis=-1, keepdims=True)
    expected = ((groups - g_mean) / np.sqrt(g_var + 1e-5)).reshape(x.shape)
    assert_close(nn.GroupNorm(2, 4)(x).numpy(), expected, **F32)


def test_embedding_dropout_flatten_activations_match_numpy() -> None:
    embedding = nn.Embedding(5, 3, key=_key())
    indices = np.array([[0, 4], [2, 2]])
    assert_close(embedding(indices).numpy(), embedding.weight.numpy()[indices])
    x = _normal((2, 3, 4))
    x64 = x.astype(np.float64)
    assert nn.Flatten()(x).shape == (2, 12)
    assert_close(nn.ReLU()(x).numpy(), np.maximum(x64, 0))
    erf = np.vectorize(math.erf)
    assert_close(nn.GELU()(x).numpy(), 0.5 * x64 * (1 + erf(x64 / math.sqrt(2))), **F32)
    assert_close(nn.SiLU()(x).numpy(), x64 / (1 + np.exp(-x64)), **F32)
    assert_close(nn.Tanh()(x).numpy(), np.tanh(x64), **F32)
    assert_close(nn.Sigmoid()(x).numpy(), 1 / (1 + np.exp(-x64)), **F32)
    assert nn.Identity()(x) is x


def test_dropout_is_identity_in_eval_and_scales_kept_values_in_training() -> None:
    x = fnp.ones(4000)
    dropout = nn.Dropout(0.25)
    assert dropout(x).tolist() == x.tolist()
    dropout.train()
    first, again = dropout(x, key=_key(3)).numpy(), dropout(x, key=_key(3)).numpy()
    np.testing.assert_array_equal(first, again)
    assert set(np.unique(first)) == {0.0, np.float32(1 / 0.75)}
    assert abs(np.mean(first == 0) - 0.25) < 0.03


def test_pools_match_numpy() -> None:
    x = _normal((2, 3, 6, 6))
    x64 = x.astype(np.float64)
    assert_close(nn.MaxPool2d(2)(x).numpy(), pool_reference(x64, 2, 2, np.max))
    assert_close(nn.AvgPool2d(3, stride=1)(x).numpy(), pool_reference(x64, 3, 1, np.mean), **F32)


def test_sequential_and_modulelist_compose_and_index() -> None:
    first, second = nn.Linear(3, 4, key=_key(1)), nn.Linear(4, 2, key=_key(2))
    model = nn.Sequential(first, nn.ReLU(), second, fnp.tanh)
    x = _normal((5, 3))
    expected = np.tanh(second(np.maximum(first(x).numpy(), 0)).numpy())
    assert_close(model(x).numpy(), expected, **F32)
    assert len(model) == 4 and model[0] is first and model[-2] is second
    assert isinstance(model[:2], nn.Sequential) and len(model[:2]) == 2
    layers = nn.ModuleList([first]).append(second)
    assert list(layers) == [first, second]
    assert [name for name, _ in layers.named_parameters()] == ["0.weight", "0.bias", "1.weight", "1.bias"]
    with pytest.raises(IndexError):
        model[4]


# --- initialisers --------------------------------------------------------------------------------------

def test_kaiming_and_glorot_uniform_bounds_and_spread() -> None:
    shape = (256, 128, 2, 2)            # fan_in = 512, fan_out = 1024
    samples = init.kaiming_uniform(shape, a=math.sqrt(5), key=_key()).numpy()
    bound = 1 / math.sqrt(512)          # sqrt(2 / (1 + 5)) * sqrt(3 / 512)
    assert samples.dtype == np.float32 and np.abs(samples).max() <= bound
    assert np.abs(samples).max() > 0.99 * bound
    assert abs(samples.std() - bound / math.sqrt(3)) < 0.01 * bound
    relu = init.kaiming_uniform(shape, nonlinearity="relu", mode="fan_out", key=_key()).numpy()
    assert abs(relu.std() - math.sqrt(2 / 1024)) < 0.01 * math.sqrt(2 / 1024)
    glorot = init.xavier_uniform(shape, key=_key()).numpy()
    glorot_bound = math.sqrt(6 / (512 + 1024))
    assert np.abs(glorot).max() <= glorot_bound and np.abs(glorot).max() > 0.99 * glorot_bound


def test_normal_initialisers_have_the_requested_moments() -> None:
    std = math.sqrt(2 / (1 + 0.01**2)) / math.sqrt(300)
    he = init.kaiming_normal((400, 300), key=_key()).numpy()
    assert abs(he.mean()) < 0.02 * std and abs(he.std() - std) < 0.01 * std
    samples = init.normal((100_000,), mean=2.0, std=0.5, key=_key()).numpy()
    assert abs(samples.mean() - 2.0) < 0.01 and abs(samples.std() - 0.5) < 0.01
    glorot = init.glorot_normal((300, 200), gain=2.0, key=_key()).numpy()
    assert abs(glorot.std() - 2 * math.sqrt(2 / 500)) < 0.02 * 2 * math.sqrt(2 / 500)
    uniform = init.uniform((100_000,), -1.0, 3.0, key=_key()).numpy()
    assert uniform.min() >= -1.0 and uniform.max() < 3.0 and abs(uniform.mean() - 1.0) < 0.02
    assert init.zeros((2, 3)).tolist() == [[0.0] * 3] * 2 and init.ones(2).tolist() == [1.0, 1.0]


def test_keys_make_initialisation_reproducible_and_the_global_key_advances() -> None:
    np.testing.assert_array_equal(nn.Linear(3, 4, key=_key(7)).weight.numpy(),
                                  nn.Linear(3, 4, key=_key(7)).weight.numpy())
    layer = nn.Linear(3, 4, key=_key(7))
    assert not np.array_equal(layer.weight.numpy()[:, 0], layer.bias.numpy())
    fg.Tensor.manual_seed(0)
    first = nn.Conv2d(2, 2, 3).weight.numpy()
    second = nn.Conv2d(2, 2, 3).weight.numpy()
    fg.Tensor.manual_seed(0)
    np.testing.assert_array_equal(nn.Conv2d(2, 2, 3).weight.numpy(), first)
    assert not np.array_equal(first, second)


def test_layers_default_to_pytorch_initialisation() -> None:
    linear = nn.Linear(300, 200, key=_key())
    bound = 1 / math.sqrt(300)
    weight, bias = linear.weight.numpy(), linear.bias.numpy()
    assert np.abs(weight).max() <= bound and abs(weight.std() - bound / math.sqrt(3)) < 0.02 * bound
    assert np.abs(bias).max() <= bound
    conv = nn.Conv2d(8, 16, 3, groups=2, key=_key())       # fan_in = 8 / 2 * 9
    assert np.abs(conv.weight.numpy()).max() <= 1 / 6 and np.abs(conv.bias.numpy()).max() <= 1 / 6
    embedding = nn.Embedding(1000, 64, key=_key()).weight.numpy()
    assert abs(embedding.std() - 1) < 0.02
    norm = nn.LayerNorm(4)
    assert norm.weight.tolist() == [1.0] * 4 and norm.bias.tolist() == [0.0] * 4


# --- errors ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("make, x, message", [
    (lambda: nn.Linear(784, 10), np.zeros((32, 100), np.float32),
     "Linear(784, 10): expected input with last dimension 784, got shape (32, 100)"),
    (lambda: nn.Conv2d(3, 8, 3), np.zeros((2, 4, 8, 8), np.float32),
     "Conv2d(3, 8, kernel_size=(3, 3)): expected input of shape (N, 3, H, W) or (3, H, W), got shape (2, 4, 8, 8)"),
    (lambda: nn.BatchNorm2d(3), np.zeros((2, 3), np.float32),
     "BatchNorm2d(3): expected 4-D input of shape (N, 3, ...), got shape (2, 3)"),
    (lambda: nn.BatchNorm(3), np.zeros((2, 4), np.float32),
     "BatchNorm(3): expected at least 2-D input of shape (N, 3, ...), got shape (2, 4)"),
    (lambda: nn.LayerNorm(5), np.zeros((2, 4), np.float32),
     "LayerNorm((5,)): expected input whose last dimensions are (5,), got shape (2, 4)"),
    (lambda: nn.GroupNorm(2, 4), np.zeros((2, 6), np.float32),
     "GroupNorm(2, 4): expected input of shape (N, 4, ...), got shape (2, 6)"),
    (lambda: nn.MaxPool2d(2), np.zeros((4, 4), np.float32),
     "MaxPool2d(kernel_size=(2, 2)): expected input of shape (N, C, H, W) or (C, H, W), got shape (4, 4)"),
])
def test_wrong_input_shapes_name_the_layer_and_both_shapes(make: Any, x: np.ndarray, message: str) -> None:
    with pytest.raises(ValueError) as info:
        make()(x)
    assert str(info.value) == message


@pytest.mark.parametrize("make, error, match", [
    (lambda: nn.Linear(0, 3), ValueError, "Linear: in_features must be a positive int, got 0"),
    (lambda: nn.Conv2d(4, 6, 3, groups=4), ValueError, "groups=4 must divide in_channels=4 and out_channels=6"),
    (lambda: nn.Conv2d(4, 6, 3, padding="full"), ValueError, "padding must be an int, a pair, 'same' or 'valid'"),
    (lambda: nn.Conv2d(4, 6, (3, 3, 3)), ValueError, "Conv2d: kernel_size must be an int or a pair of ints"),
    (lambda: nn.GroupNorm(3, 4), ValueError, "num_groups=3 must divide num_channels=4"),
    (lambda: nn.Dropout(1.5), ValueError, "Dropout: p must be a probability in \\[0, 1\\], got 1.5"),
    (lambda: nn.GELU("fast"), ValueError, "approximate must be 'none' or 'tanh'"),
    (lambda: nn.Embedding(4, 2)(np.array([0.5])), TypeError, "Embedding\\(4, 2\\): expected integer indices"),
    (lambda: nn.Sequential(nn.ReLU(), 3), TypeError, "every layer must be callable, got int"),
    (lambda: init.kaiming_uniform((3, 4), mode="fan_avg"), ValueError, "mode must be 'fan_in' or 'fan_out'"),
    (lambda: init.glorot_uniform((3,)), ValueError, "need a weight of rank >= 2, got shape \\(3,\\)"),
    (lambda: init.calculate_gain("swish"), ValueError, "unknown nonlinearity 'swish'"),
])
def test_bad_constructor_arguments_raise_clear_errors(make: Any, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        make()


# --- PyTorch: outputs and gradients, weights copied through the state-dict names ------------------------

@pytest.fixture
def torch() -> Any:
    return pytest.importorskip("torch")


def _to_torch(layer: nn.Module, torch_layer: Any, torch: Any) -> Any:
    """Load our parameters and buffers into ``torch_layer`` by name (strict: the names must match)."""
    state = {name: torch.from_numpy(tensor.numpy().astype(np.float64))
             for name, tensor in layer.named_parameters() + layer.named_buffers()}
    torch_layer.double().load_state_dict(state, strict=True)
    return torch_layer


def _check_against_torch(layer: nn.Module, torch_layer: Any, x: np.ndarray, torch: Any, tol: float = 1e-4) -> None:
    upstream = _normal(layer(x).shape, seed=9)
    out, grad_layer, grad_x = _grads(layer, x, upstream)
    is_float = x.dtype.kind == "f"
    torch_x = torch.tensor(x.astype(np.float64) if is_float else x, requires_grad=is_float)
    torch_out = torch_layer(torch_x)
    (torch_out * torch.from_numpy(upstream.astype(np.float64))).sum().backward()
    assert_close(out.numpy(), torch_out.detach().numpy(), rtol=tol, atol=tol)
    if grad_x is not None:
        assert_close(grad_x.numpy(), torch_x.grad.numpy(), rtol=tol, atol=tol)
    ours = dict(grad_layer.named_parameters())
    for name, parameter in torch_layer.named_parameters():
        assert_close(ours[name].numpy(), parameter.grad.numpy(), rtol=tol, atol=tol)


def test_linear_and_embedding_match_torch(torch: Any) -> None:
    layer = nn.Linear(6, 4, key=_key())
    _check_against_torch(layer, _to_torch(layer, torch.nn.Linear(6, 4), torch), _normal((3, 6)), torch)
    embedding = nn.Embedding(7, 3, key=_key())
    _check_against_torch(embedding, _to_torch(embedding, torch.nn.Embedding(7, 3), torch),
                         np.array([[1, 6, 1], [0, 2, 3]]), torch)


@pytest.mark.parametrize("kwargs", [
    dict(kernel_size=3), dict(kernel_size=3, stride=2, padding=1), dict(kernel_size=2, dilation=2, groups=2),
    dict(kernel_size=3, padding="same", bias=False),
])
def test_conv2d_matches_torch(torch: Any, kwargs: dict) -> None:
    layer = nn.Conv2d(4, 6, key=_key(), **kwargs)
    torch_layer = _to_torch(layer, torch.nn.Conv2d(4, 6, **kwargs), torch)
    _check_against_torch(layer, torch_layer, _normal((2, 4, 7, 7)), torch)


@pytest.mark.parametrize("make", [
    lambda nn: nn.LayerNorm((3, 4)), lambda nn: nn.GroupNorm(2, 6), lambda nn: nn.RMSNorm(4, eps=1e-6),
    lambda nn: nn.GELU(approximate="tanh"), lambda nn: nn.MaxPool2d(2, stride=1),
    lambda nn: nn.AvgPool2d(2, padding=1),
])
def test_norms_activations_and_pools_match_torch(torch: Any, make: Any) -> None:
    layer = make(nn)
    if layer.parameters():                  # weights off their ones/zeros init, so the test can fail
        layer = fg.tree.map(lambda t: t + fnp.asarray(_normal(t.shape, 5)), layer)
    torch_layer = _to_torch(layer, make(torch.nn), torch)
    _check_against_torch(layer, torch_layer, _normal((2, 6, 3, 4)), torch)


def test_batchnorm2d_matches_torch_in_training_and_eval(torch: Any) -> None:
    bn = nn.BatchNorm2d(3, momentum=0.2).train()
    bn = fg.tree.map(lambda t: t, bn)
    torch_bn = _to_torch(bn, torch.nn.BatchNorm2d(3, momentum=0.2), torch).train()
    for seed in (1, 2):
        x = _normal((4, 3, 3, 3), seed) * 3 - 1
        assert_close(bn(x).numpy(), torch_bn(torch.from_numpy(x.astype(np.float64))).detach().numpy(), **F32)
    ours = dict(bn.named_buffers())
    for name, buffer in torch_bn.named_buffers():
        assert_close(ours[name].numpy(), buffer.numpy(), **F32)
    _check_against_torch(bn.eval(), torch_bn.eval(), _normal((2, 3, 3, 3), 3), torch)


def test_small_cnn_matches_torch_end_to_end(torch: Any) -> None:
    def build(nn: Any) -> Any:
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.BatchNorm2d(4), nn.MaxPool2d(2),
                             nn.Flatten(), nn.Linear(4 * 3 * 3, 5))

    fg.Tensor.manual_seed(1)
    model = build(nn).train()
    torch_model = _to_torch(model, build(torch.nn), torch).train()
    x = _normal((3, 1, 6, 6), 4)
    _check_against_torch(model, torch_model, x, torch)


def test_init_gains_and_fans_match_torch(torch: Any) -> None:
    for nonlinearity, param in [("relu", None), ("leaky_relu", 0.2), ("tanh", None), ("linear", None)]:
        assert init.calculate_gain(nonlinearity, param) == pytest.approx(
            torch.nn.init.calculate_gain(nonlinearity, param))
    for shape in [(5, 3), (8, 4, 3, 2)]:
        assert init.fans(shape) == torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
