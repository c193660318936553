"""A short tour of funcgrad: lazy Tensors, funcgrad.numpy, the IR, pytrees and random keys.

Run it with `python3 examples/quickstart.py` after `python3 -m pip install -e .`.
Every computation here runs as compiled, fused kernels (LLVM on the CPU); the printed values are
checked against NumPy where that is easy, so the tour doubles as a smoke test.
"""

import numpy as np

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad import Tensor


def section(title: str) -> None:
    print(f"\n=== {title} {'=' * max(0, 72 - len(title))}")


def tour_lazy_tensors() -> None:
    section("1. Tensor: lazy until you ask for a value")
    x = Tensor.arange(6).reshape(2, 3) * 0.5
    ones = Tensor.ones(2, 3)
    y = (x + ones) * 2 - 1  # nothing has run yet: y is a pending graph
    print("y.shape:", y.shape)
    y.realize()  # runs the pending graph; y now holds its values
    print("y =\n", y.numpy())
    print("y.sum() =", y.sum().numpy(), "  y.sum(axis=0) =", y.sum(axis=0).numpy())
    print("x @ (3x2 of ones) =\n", (x @ Tensor.ones(3, 2)).numpy())
    r = Tensor.rand(2, 3)
    print("Tensor.rand(2, 3) in [0, 1):", bool(((r.numpy() >= 0) & (r.numpy() < 1)).all()))


def tour_numpy() -> None:
    section("2. funcgrad.numpy: NumPy's names and semantics")
    xs = fnp.linspace(0.0, np.pi, 5)
    ys = fnp.sin(xs)
    print("sin(linspace(0, pi, 5)) =", ys.numpy())
    print("sum =", fnp.sum(ys).numpy())
    print("where(y > 0.5, y, 0) =", fnp.where(ys > 0.5, ys, 0.0).numpy())
    a = Tensor.arange(6).reshape(2, 3) * 1.0
    b = Tensor.arange(12).reshape(3, 4) * 1.0
    product = fnp.einsum("ij,jk->ik", a, b)
    print("einsum('ij,jk->ik') =\n", product.numpy())
    print("matches np.einsum:", np.allclose(product.numpy(), np.einsum("ij,jk->ik", a.numpy(), b.numpy())))


def mlp(params, x):
    for w, b in params[:-1]:
        x = fnp.tanh(x @ w + b)
    w, b = params[-1]
    return x @ w + b


def tour_ir() -> None:
    section("3. make_ir: trace a function into the jaxpr-like IR")

    def f(x, y):
        return fnp.sum(fnp.sin(x) * y + 1.0)

    print(fg.make_ir(f)(fnp.ones((3,)), fnp.ones((3,))))

    print("\nA two-layer MLP over a list of (w, b) pairs (a pytree of arrays):")
    keys = fg.random.split(fg.random.key(0), 2)
    params = [(fg.random.normal(k, (4, 4)), fnp.zeros(4)) for k in keys]
    print(fg.make_ir(mlp)(params, fnp.ones((2, 4))))
    print("\nThe same function, evaluated lazily on concrete Tensors:")
    print(mlp(params, Tensor.ones(2, 4)).numpy())


def tour_pytrees() -> None:
    section("4. Pytrees: nested containers of arrays")
    params = {"w": Tensor.ones(2, 2), "b": Tensor.arange(2) * 1.0, "extra": (3.0, None)}
    leaves, treedef = fg.tree.flatten(params)
    print(f"{len(leaves)} leaves; structure: {treedef}")
    doubled = fg.tree.map(lambda leaf: leaf * 2, params)
    print("doubled['w'] =\n", doubled["w"].numpy())
    print("doubled['b'] =", doubled["b"].numpy(), "  doubled['extra'] =", doubled["extra"])


def tour_random() -> None:
    section("5. Random: explicit, splittable threefry keys")
    key = fg.random.key(42)
    normal_key, uniform_key = fg.random.split(key)
    first = fg.random.normal(normal_key, (3,)).numpy()
    print("normal(k, (3,))  =", first)
    print("uniform(k, (3,)) =", fg.random.uniform(uniform_key, (3,)).numpy())
    again = fg.random.normal(normal_key, (3,)).numpy()
    print("same key, same numbers:", np.array_equal(first, again))


def tour_transforms() -> None:
    section("6. Transformations: grad, jit, vmap, in any composition")

    def loss(w, x, y):
        return fnp.mean((fnp.tanh(x @ w) - y) ** 2)

    key_w, key_x = fg.random.split(fg.random.key(0))
    w = fg.random.normal(key_w, (3, 1))
    x = fg.random.normal(key_x, (8, 3))
    y = fnp.ones((8, 1))
    print("loss(w) =", loss(w, x, y).item())
    print("grad(loss)(w) =", fg.grad(loss)(w, x, y).numpy().ravel())
    fast_step = fg.jit(lambda w, x, y: w - 0.5 * fg.grad(loss)(w, x, y))
    for _ in range(20):
        w = fast_step(w, x, y)
    print("after 20 jitted steps: loss =", loss(w, x, y).item(), f"(traced {fast_step.trace_count} time)")
    per_example = fg.vmap(fg.grad(loss), in_axes=(None, 0, 0))(w, x[:, None], y[:, None])
    print("per-example gradients (vmap of grad):", per_example.shape)
    print("The IR of grad(loss):")
    print(fg.make_ir(fg.grad(loss))(w, x, y))


def main() -> None:
    tour_lazy_tensors()
    tour_numpy()
    tour_ir()
    tour_pytrees()
    tour_random()
    tour_transforms()
    print("\nDone. Next: docs/architecture.md explains how these layers fit together.")


if __name__ == "__main__":
    main()
