"""Blocked transposes along axis 0 (funcgrad/lower/render_transpose.py): rank-2 copies such as a
weight gradient computed in the transposed layout, 8 x 8 blocks for 8-byte elements, and the rule
that picks them (the plain loops keep a transposed read whose column walk stays in L1).

Every value must equal NumPy's transpose exactly, for any shape (blocks, edges, a thread's chunk of
rows that is not a multiple of the block), and the heuristic must block exactly where its rule says.
"""

from __future__ import annotations

import attrs
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.devices.cpu import CPUDevice
from funcgrad.lower import render_transpose
from funcgrad.lower.kernel import Kernel, Opt
from funcgrad.lower.optimize import check_opts, heuristic_opts
from funcgrad.lower.render_llvm import render_llvm
from tests.lower.test_render_tile import kernels_of, run

pytestmark = pytest.mark.usefixtures("on_cpu")  # CPU code generation, whatever DEVICE says

BLOCK_OF = {"float32": 16, "int32": 16, "float64": 8, "int64": 8}


@pytest.fixture(scope="module")
def device(tmp_path_factory: pytest.TempPathFactory) -> CPUDevice:
    return CPUDevice(cache_dir=tmp_path_factory.mktemp("cache"))


def copy_kernel(shape: tuple[int, ...], dtype: str, perm: tuple[int, ...] = (1, 0)) -> Kernel:
    (kernel,) = kernels_of(lambda x: fnp.transpose(x, perm), fnp.asarray(np.zeros(shape), dtype=dtype))
    return kernel


def values(shape: tuple[int, ...], dtype: str, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype.startswith("int"):
        return rng.integers(-2**30, 2**30, shape).astype(dtype)
    x = rng.standard_normal(shape).astype(dtype)
    x.flat[:: max(1, x.size // 3)] = [np.nan, np.inf, -0.0][: len(x.flat[:: max(1, x.size // 3)])]
    return x


def assert_same_bits(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype and got.shape == expected.shape
    np.testing.assert_array_equal(got.view(f"u{got.itemsize}"), expected.view(f"u{expected.itemsize}"))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.integers(2, 90), columns=st.integers(2, 90), dtype=st.sampled_from(sorted(BLOCK_OF)),
       threads=st.sampled_from([1, 2, 3]))
def test_blocked_rank2_copy_equals_numpy(device: CPUDevice, rows: int, columns: int, dtype: str, threads: int) -> None:
    """Any shape (whole blocks, edges, fewer rows than a block) and a thread split whose chunks of
    axis 0 start off the blocks: the output is NumPy's transpose, bit for bit."""
    x = values((rows, columns), dtype)
    kernel = copy_kernel(x.shape, dtype)
    opts = (Opt("transpose", 0, BLOCK_OF[dtype]),) + ((Opt("thread", 0, threads),) if threads <= columns else ())
    blocked = attrs.evolve(kernel, opts=opts)
    check_opts(blocked, opts)
    (got,) = run(device, blocked, [x])
    assert_same_bits(got, x.T.copy())


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("shape", [(64, 64), (300, 1000), (1000, 300), (384, 1536), (1536, 384), (257, 513),
                                   (513, 257)], ids=str)
def test_heuristic_copies_equal_numpy(device: CPUDevice, shape: tuple[int, int], dtype: str) -> None:
    """The shapes the rule was measured at, with the heuristic's own opts (blocked or not)."""
    x = values(shape, dtype, seed=1)
    kernel = copy_kernel(shape, dtype)
    (got,) = run(device, attrs.evolve(kernel, opts=heuristic_opts(kernel)), [x])
    assert_same_bits(got, x.T.copy())



def transpose_of(kernel: Kernel) -> Opt | None:
    return next((opt for opt in heuristic_opts(kernel) if opt.action == "transpose"), None)


@pytest.mark.parametrize("shape,dtype,expected", [
    ((384, 1536), "float32", Opt("transpose", 0, 16)),  # the column walk of 384 lines falls in 2 of 64 sets
    ((1536, 384), "float32", Opt("transpose", 0, 16)),  # 1536 lines: more than L1 holds
    ((1000, 300), "float32", Opt("transpose", 0, 16)),  # 1000 lines, 16 to a set
    ((384, 384), "float64", None),  # 8 x 8 blocks: valid, not chosen (HEURISTIC_BLOCKS)
    ((128, 128), "float32", Opt("transpose", 0, 16)),  # 128 lines in 8 sets
    ((300, 1000), "float32", None),  # 300 lines of a 4000-byte stride: <= 5 to a set, they stay in L1
    ((257, 513), "float64", None),
    ((513, 257), "float32", None),
    ((64, 64), "float32", None),  # 16 KB: under MIN_ELEMENTS
], ids=str)
def test_heuristic_blocks_where_the_plain_walk_leaves_l1(shape: tuple[int, int], dtype: str,
                                                         expected: Opt | None) -> None:
    kernel = copy_kernel(shape, dtype)
    assert transpose_of(kernel) == expected
    if expected is not None:
        assert "shufflevector" in render_llvm(attrs.evolve(kernel, opts=heuristic_opts(kernel)))


def test_heuristic_rank3_rules() -> None:
    """Axis 1 of rank-3 kernels: a strided row shorter than PLAIN_ROW is blocked even when its walk
    fits L1 (the CNN's gradient back to channels-last, (N, P, 32)); a long row that fits is left to
    the plain loops; a transposed axis 0 of a rank-3 kernel is blocked too."""
    assert transpose_of(copy_kernel((64, 32, 576), "float32", (0, 2, 1))) == Opt("transpose", 1, 16)
    assert transpose_of(copy_kernel((8, 300, 100), "float32", (0, 2, 1))) is None
    assert transpose_of(copy_kernel((64, 16, 1024), "float32", (0, 2, 1))) == Opt("transpose", 1, 16)
    assert transpose_of(copy_kernel((24, 96, 512), "float32", (2, 0, 1))) == Opt("transpose", 0, 16)


def test_rank3_blocked_equals_numpy(device: CPUDevice) -> None:
    """out[c, n, p] = x[n, p, c]: the transposed axis is axis 0, the loop over n outside the blocks; and
    axis 1 of a kernel whose rows are long enough to run the column blocks outermost."""
    x = values((5, 40, 37), "float32", seed=3)
    kernel = copy_kernel(x.shape, "float32", (2, 0, 1))
    assert render_transpose._transposed_loads(kernel, 0)
    for opts in [(Opt("transpose", 0, 16),), (Opt("thread", 0, 2), Opt("transpose", 0, 16))]:
        (got,) = run(device, attrs.evolve(kernel, opts=opts), [x])
        assert_same_bits(got, np.transpose(x, (2, 0, 1)).copy())
    y = values((3, 70, 53), "float32", seed=5)  # rows of 70: column blocks outermost (COLUMNS_OUTER)
    kernel = copy_kernel(y.shape, "float32", (0, 2, 1))
    assert kernel.shape[-1] > render_transpose.COLUMNS_OUTER * 16
    for opts in [(Opt("transpose", 1, 16),), (Opt("thread", 0, 2), Opt("transpose", 1, 16))]:
        (got,) = run(device, attrs.evolve(kernel, opts=opts), [y])
        assert_same_bits(got, np.transpose(y, (0, 2, 1)).copy())


def test_invalid_axis0_actions_raise() -> None:
    kernel = copy_kernel((64, 48), "float32")
    with pytest.raises(ValueError, match="block side n in"):
        check_opts(kernel, (Opt("transpose", 0, 12),))
    with pytest.raises(ValueError, match="output axis a in 0..0"):
        check_opts(kernel, (Opt("transpose", 1, 16),))
    with pytest.raises(ValueError, match="8-byte elements"):
        check_opts(kernel, (Opt("transpose", 0, 8),))  # float32 elements: 16 x 16 blocks only
    (halves,) = kernels_of(lambda x: fnp.transpose(x), fnp.asarray(np.zeros((64, 48)), dtype=fnp.float16))
    with pytest.raises(ValueError, match="nothing to transpose"):
        check_opts(halves, (Opt("transpose", 0, 16),))


def test_weight_gradient_through_jit_copies_no_weight() -> None:
    """End to end: a two-layer MLP's gradients over batch and sequence match NumPy in float64; the
    backward products ``dY @ W.T`` read the weights in place (their kernels merge batch and sequence
    into rows and the tile packs W per panel: ``kernel.merge_loops``, ``schedule._column_operand_layouts``),
    so no kernel copies a weight transposed, and the kernel names are the scheduler's."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((4, 24, 384)).astype(np.float32)
    w1 = (rng.standard_normal((384, 1536)) * 0.05).astype(np.float32)
    w2 = (rng.standard_normal((1536, 384)) * 0.05).astype(np.float32)

    def loss(w1, w2, x):  # noqa: ANN001, ANN202
        return fnp.tanh(fnp.tanh(x @ w1) @ w2).sum()

    grad = fg.jit(fg.grad(loss, argnums=(0, 1)))
    lowered = grad.lower(w1, w2, x)
    g1, g2 = (np.asarray(g, np.float64) for g in grad(w1, w2, x))
    x64, w164, w264 = (v.astype(np.float64) for v in (x, w1, w2))
    h = np.tanh(x64 @ w164)
    dy = 1 - np.tanh(h @ w264) ** 2
    dh = (dy @ w264.T) * (1 - h * h)
    np.testing.assert_allclose(g2, np.einsum("bsi,bsj->ij", h, dy), rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(g1, np.einsum("bsi,bsj->ij", x64, dh), rtol=1e-4, atol=1e-3)
    scheduled = kernels_of(fg.grad(loss, argnums=(0, 1)), w1, w2, x)  # what the scheduler makes, before opts
    assert [info.kernel.name for info in lowered.kernels] == [kernel.name for kernel in scheduled]
    weight_copies = [k for k in scheduled if k.reduce_expr is None and len(k.in_avals) == 1
                     and k.in_avals[0].shape in ((384, 1536), (1536, 384))]
    assert weight_copies == []


def test_a_returned_rank2_transpose_through_jit_takes_the_blocked_path() -> None:
    """A jitted program returning ``tanh(a).T`` of a 384 x 1536 matrix: one kernel, blocked, equal to NumPy."""
    a = np.random.default_rng(5).standard_normal((384, 1536)).astype(np.float32)
    fn = fg.jit(lambda a: fnp.tanh(a).T)
    (info,) = fn.lower(a).kernels
    assert "transpose(0, 16)" in info.source
    np.testing.assert_allclose(np.asarray(fn(a)), np.tanh(a).T, rtol=1e-6, atol=1e-6)
