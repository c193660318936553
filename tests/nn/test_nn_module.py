"""nn.Module as a pytree: attribute-named paths, statics in the TreeDef, rebuilding without
__init__, grad/jit/vmap over modules, parameters and buffers, training mode, printing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import nn
from funcgrad.util.tree import DictKey, GetAttrKey, SequenceKey
from tests.conftest import assert_close


class Affine(nn.Module):
    """y = x * scale + shift, with a static name and an int attribute."""

    def __init__(self, size: int, name: str = "affine") -> None:
        self.size, self.name = size, name
        self.scale = fnp.arange(1.0, size + 1.0)
        self.shift = fnp.ones(size)

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        return x * self.scale + self.shift


class Nested(nn.Module):
    def __init__(self) -> None:
        self.first = Affine(3)
        self.blocks = [Affine(3), Affine(3)]
        self.table = {"b": Affine(3), "a": fnp.zeros(3)}
        self.depth = 2

    def forward(self, x: fg.Tensor) -> fg.Tensor:
        x = self.first(x)
        for block in self.blocks:
            x = block(x)
        return self.table["b"](x) + self.table["a"]


class TinygradStyle(nn.Module):
    def __init__(self) -> None:
        self.w = fnp.full((2,), 3.0)

    def __call__(self, x: fg.Tensor) -> fg.Tensor:
        return x * self.w


def test_flatten_paths_carry_attribute_names_and_list_indices() -> None:
    paths = [path for path, _ in fg.tree.leaves_with_path(Nested())]
    assert paths[:2] == [(GetAttrKey("first"), GetAttrKey("scale")), (GetAttrKey("first"), GetAttrKey("shift"))]
    assert (GetAttrKey("blocks"), SequenceKey(1), GetAttrKey("scale")) in paths
    assert (GetAttrKey("table"), DictKey("a")) in paths
    assert fg.tree.keystr(paths[2]) == ".blocks[0].scale"
    assert len(paths) == 9  # 4 Affines x 2 Tensors + one Tensor in the dict


def test_named_parameters_use_dotted_attribute_paths() -> None:
    names = [name for name, _ in Nested().named_parameters()]
    assert names[:4] == ["first.scale", "first.shift", "blocks.0.scale", "blocks.0.shift"]
    assert "table.a" in names and "table.b.scale" in names
    seq = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    assert [name for name, _ in seq.named_parameters()] == ["0.weight", "0.bias", "2.weight", "2.bias"]


def test_non_array_attributes_are_static_and_compared_by_value() -> None:
    leaves, treedef = fg.tree.flatten(Affine(3))
    assert len(leaves) == 2 and all(isinstance(leaf, fg.Tensor) for leaf in leaves)
    assert fg.tree.structure(Affine(3)) == treedef          # equal structure, other Tensors
    assert hash(fg.tree.structure(Affine(3))) == hash(treedef)
    assert fg.tree.structure(Affine(3, name="other")) != treedef
    assert fg.tree.structure(Affine(4)) != treedef
    rebuilt = treedef.unflatten(leaves)
    assert (rebuilt.size, rebuilt.name) == (3, "affine")


_STATIC_VALUES = st.one_of(st.integers(), st.floats(allow_nan=False), st.text(max_size=4), st.none(),
                           st.booleans(), st.lists(st.integers(), max_size=3), st.tuples(st.integers(), st.text()))


@settings(max_examples=60, deadline=None)
@given(statics=st.dictionaries(st.from_regex(r"s_[a-z]{1,5}", fullmatch=True), _STATIC_VALUES, max_size=4),
       tensor_count=st.integers(0, 3))
def test_flatten_unflatten_round_trip_keeps_every_attribute(statics: dict, tensor_count: int) -> None:
    class Bag(nn.Module):
        pass

    def build() -> Bag:
        bag = Bag()
        for i in range(tensor_count):
            setattr(bag, f"t{i}", fnp.full((2,), float(i)))
        for name, value in statics.items():
            setattr(bag, name, value)
        return bag

    bag = build()
    leaves, treedef = fg.tree.flatten(bag)
    assert len(leaves) == tensor_count
    rebuilt = treedef.unflatten(leaves)
    assert list(vars(rebuilt)) == list(vars(bag))
    for name, value in vars(bag).items():
        assert rebuilt.__dict__[name] is value if isinstance(value, fg.Tensor) else rebuilt.__dict__[name] == value
    assert fg.tree.structure(rebuilt) == treedef == fg.tree.structure(build())


def test_unhashable_statics_are_compared_by_repr() -> None:
    first, second = Affine(3), Affine(3)
    first.sizes, second.sizes = [3, 4], [3, 4]
    assert fg.tree.structure(first) == fg.tree.structure(second)
    second.sizes = [3, 5]
    assert fg.tree.structure(first) != fg.tree.structure(second)
    leaves, treedef = fg.tree.flatten(first)
    assert treedef.unflatten(leaves).sizes == [3, 4]


def test_unflatten_builds_a_new_instance_without_calling_init() -> None:
    class Strict(nn.Module):
        calls = 0

        def __init__(self, size: int) -> None:
            Strict.calls += 1
            self.weight = fnp.ones(size)

    module = Strict(2)
    rebuilt = fg.tree.map(lambda t: t * 2, module)
    assert Strict.calls == 1
    assert type(rebuilt) is Strict and rebuilt is not module
    assert rebuilt.weight.tolist() == [2.0, 2.0] and module.weight.tolist() == [1.0, 1.0]


def test_grad_returns_a_module_of_gradients() -> None:
    model = Affine(3)
    x = fnp.asarray([0.5, -1.0, 2.0])
    grads = fg.grad(lambda m, x: fnp.sum(m(x) ** 2))(model, x)
    assert type(grads) is Affine and grads.name == "affine"
    scale, shift, xs = np.arange(1.0, 4.0), np.ones(3), np.array([0.5, -1.0, 2.0])
    y = xs * scale + shift
    assert_close(grads.scale.numpy(), 2 * y * xs)
    assert_close(grads.shift.numpy(), 2 * y)


def test_grad_over_a_nested_module_and_tree_map_update() -> None:
    model = Nested()
    x = fnp.asarray([1.0, 2.0, 3.0])
    loss = lambda m: fnp.sum(m(x))
    grads = fg.grad(loss)(model)
    assert fg.tree.structure(grads) == fg.tree.structure(model)
    # d loss / d table.a is 1 per element; shift of the last block: 1
    assert grads.table["a"].tolist() == [1.0, 1.0, 1.0]
    assert grads.table["b"].shift.tolist() == [1.0, 1.0, 1.0]
    updated = fg.tree.map(lambda p, g: p - 0.01 * g, model, grads)
    assert float(loss(updated)) < float(loss(model))


def test_jit_accepts_modules_and_reuses_its_trace_for_equal_structure() -> None:
    step = fg.jit(lambda m, x: m(x))
    x = fnp.asarray([1.0, 2.0, 3.0])
    first, second = Affine(3), fg.tree.map(lambda t: t + 1, Affine(3))
    assert_close(step(first, x).numpy(), first(x).numpy())
    assert_close(step(second, x).numpy(), second(x).numpy())
    assert step.trace_count == 1
    step(Affine(3, name="renamed"), x)          # a static attribute changed: a new trace
    assert step.trace_count == 2


def test_vmap_over_inputs_with_a_shared_module() -> None:
    model = Affine(3)
    xs = fnp.reshape(fnp.arange(6.0), (2, 3))
    batched = fg.vmap(lambda m, x: m(x), in_axes=(None, 0))(model, xs)
    assert_close(batched.numpy(), np.arange(6.0).reshape(2, 3) * np.arange(1.0, 4.0) + 1)


def test_vmap_over_a_stacked_ensemble_of_modules() -> None:
    members = [fg.tree.map(lambda t, k=k: t * k, Affine(3)) for k in (1.0, 2.0)]
    ensemble = fg.tree.map(lambda *ts: fnp.stack(ts), *members)
    assert ensemble.scale.shape == (2, 3)
    x = fnp.asarray([1.0, 1.0, 1.0])
    out = fg.vmap(lambda m, x: m(x), in_axes=(0, None))(ensemble, x)
    assert_close(out.numpy(), np.stack([members[0](x).numpy(), members[1](x).numpy()]))


def test_parameters_deduplicate_shared_tensors_and_skip_buffers() -> None:
    model = Nested()
    model.tied = model.first.scale            # the same Tensor twice in the tree
    assert len(fg.tree.leaves(model)) == 10
    assert len(model.parameters()) == 9
    bn = nn.BatchNorm1d(4)
    assert [name for name, _ in bn.named_parameters()] == ["weight", "bias"]
    assert [name for name, _ in bn.named_buffers()] == ["running_mean", "running_var", "num_batches_tracked"]
    assert all(p.requires_grad for p in bn.parameters())
    assert not any(b.requires_grad for b in bn.buffers())


def test_register_buffer_rejects_non_tensors() -> None:
    with pytest.raises(TypeError, match="register_buffer\\('stats'\\): expected a Tensor, got list"):
        Affine(2).register_buffer("stats", [1.0])


def test_seed_style_backward_fills_parameter_grads() -> None:
    layer = nn.Linear(3, 2, key=fg.random.key(0))
    x = fnp.ones((4, 3))
    fnp.sum(layer(x)).backward()
    assert layer.weight.grad is not None and layer.bias.grad is not None
    assert_close(layer.weight.grad.numpy(), np.full((2, 3), 4.0))
    assert_close(layer.bias.grad.numpy(), np.full(2, 4.0))
    layer.zero_grad()
    assert layer.weight.grad is None and layer.bias.grad is None


def test_training_mode_follows_the_global_flag_until_train_or_eval_is_called() -> None:
    model = Nested()
    assert model.training is False and model.first.training is False
    with fg.Tensor.train():
        assert model.training is True and model.blocks[1].training is True
    assert model.train() is model
    assert all(m.training for m in model.modules())
    model.eval()
    with fg.Tensor.train():                   # an explicit eval() wins over the global flag
        assert not any(m.training for m in model.modules())


def test_train_checks_its_argument() -> None:
    with pytest.raises(TypeError, match="mode must be a bool"):
        Affine(2).train("yes")  # type: ignore[arg-type]


def test_jit_retraces_when_the_training_mode_changes() -> None:
    dropout = nn.Dropout(0.5)
    step = fg.jit(lambda m, x: m(x, key=fg.random.key(0)))
    x = fnp.ones(64)
    assert step(dropout, x).tolist() == [1.0] * 64
    with fg.Tensor.train():
        trained = step(dropout, x).numpy()
    assert step.trace_count == 2
    assert set(np.unique(trained)) <= {0.0, 2.0} and 0 < np.count_nonzero(trained) < 64
    dropout.train()                           # the same mode as under Tensor.train(), so the same mask
    assert_close(step(dropout, x).numpy(), trained)
    dropout.eval()
    assert step(dropout, x).tolist() == [1.0] * 64


def test_forward_or_call_style_and_a_clear_error_without_either() -> None:
    assert TinygradStyle()(fnp.ones(2)).tolist() == [3.0, 3.0]
    assert fg.grad(lambda m: fnp.sum(m(fnp.ones(2))))(TinygradStyle()).w.tolist() == [1.0, 1.0]

    class Empty(nn.Module):
        pass

    with pytest.raises(NotImplementedError, match="Empty defines neither forward\\(\\) nor __call__\\(\\)"):
        Empty()(1.0)


def test_repr_lists_children_like_pytorch() -> None:
    model = nn.Sequential(nn.Linear(4, 8, bias=False), nn.ReLU())
    assert repr(model) == ("Sequential(\n"
                           "  (0): Linear(in_features=4, out_features=8, bias=False)\n"
                           "  (1): ReLU()\n"
                           ")")
    assert "(blocks.1): Affine()" in repr(Nested())
    assert "(table.b): Affine()" in repr(Nested())


def test_modules_and_children_walk_each_module_once() -> None:
    model = Nested()
    model.again = model.first
    assert len(model.children()) == 5          # first, blocks.0, blocks.1, table.b, again
    assert len(model.modules()) == 5           # self + 4 distinct Affines


def test_tinygrad_style_layer_list_mixing_modules_and_functions() -> None:
    """tinygrad's beautiful_mnist keeps ``[nn.Conv2d(...), Tensor.relu, ...]`` in one list: the
    functions are static, the modules children, and paths keep the list indices."""
    import funcgrad as fg
    from funcgrad import nn
    from funcgrad.nn import functional as F

    class Model(nn.Module):
        def __init__(self) -> None:
            self.layers = [nn.Linear(3, 4), F.relu, None, nn.Linear(4, 2)]

        def __call__(self, x):
            for layer in self.layers:
                x = x if layer is None else layer(x)
            return x

    model = Model()
    assert [name for name, _ in model.named_parameters()] == [
        "layers.0.weight", "layers.0.bias", "layers.3.weight", "layers.3.bias"]
    x = fg.Tensor(np.linspace(-1, 1, 15, dtype=np.float32).reshape(5, 3))
    grads = fg.grad(lambda m, x: m(x).sum())(model, x)
    assert isinstance(grads, Model) and grads.layers[1] is F.relu and grads.layers[2] is None
    w0, b0 = model.layers[0].weight.numpy(), model.layers[0].bias.numpy()
    w1 = model.layers[3].weight.numpy()
    hidden = x.numpy() @ w0.T + b0
    upstream = (hidden > 0) * w1.sum(axis=0)  # d sum(relu(h) @ w1.T) / d h
    np.testing.assert_allclose(grads.layers[0].bias.numpy(), upstream.sum(axis=0), rtol=1e-5, atol=1e-6)
    jitted = fg.jit(lambda m, x: m(x))
    np.testing.assert_allclose(jitted(model, x).numpy(), model(x).numpy(), rtol=1e-6, atol=1e-6)
    jitted(model, x)
    assert jitted.trace_count == 1
