"""Two-stage reductions (funcgrad/lower/split_reductions.py) for devices that cap a kernel's loops."""

from __future__ import annotations

import math

import numpy as np
import pytest

import funcgrad as fg
import funcgrad.numpy as fnp
from funcgrad.ir.interpreter import eval_ir
from funcgrad.lower.plan import Plan
from funcgrad.lower.schedule import KernelStep
from funcgrad.lower.split_reductions import split_long_reductions
from tests.lower.test_schedule import _opened

CASES = {
    "sum over three axes": (lambda x: fnp.sum(x, axis=(0, 2, 3)), (6, 3, 5, 7)),
    "sum of everything": (lambda x: fnp.sum(x), (6, 3, 5, 7)),
    "max over the middle": (lambda x: fnp.max(x, axis=(1, 2)), (4, 11, 13)),
    "min over the last": (lambda x: fnp.min(x, axis=-1), (5, 101)),
    "prod": (lambda x: fnp.prod(x * 0.01 + 1.0, axis=0), (37, 3)),
    "int sum": (lambda x: fnp.sum((x * 10).astype(np.int32), axis=1), (4, 99)),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("limit", [7, 30, 10_000])
def test_split_reductions_match_the_interpreter(name: str, limit: int) -> None:
    fn, shape = CASES[name]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ir = fg.make_ir(fn)(x)
    split = split_long_reductions(ir, limit)
    consts = [c.numpy() for c in ir.consts]
    (want,) = eval_ir(ir, [x], consts)
    (got,) = eval_ir(split, [x], consts)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    reductions = [e for e in split.eqns if e.primitive.name.startswith("reduce_")]
    for eqn in reductions:  # no reduction left longer than the limit
        assert math.prod(eqn.inputs[0].aval.shape[a] for a in eqn.param_dict["axes"]) <= max(limit, 1)
    if limit == 10_000:
        assert split is ir  # nothing to split


def test_a_device_with_a_cap_gets_short_kernels() -> None:
    """A plan for a device that declares ``max_reduction`` runs no reduction loop longer than it."""
    from funcgrad.devices import get_device

    class Capped:  # the CPU device, with a cap on the loop of one invocation
        def __init__(self) -> None:
            self.inner = get_device("CPU")
            self.max_reduction = 100

        def __getattr__(self, name: str):  # noqa: ANN204
            return getattr(self.inner, name)

    x = np.random.default_rng(1).standard_normal((16, 3, 40)).astype(np.float32)
    ir = fg.make_ir(lambda x: (fnp.sum(x, axis=(0, 2)), fnp.max(x)))(x)
    plan = Plan(_opened(ir), Capped())  # type: ignore[arg-type]
    sums, top = plan.run([c.numpy() for c in ir.consts] + [x])
    np.testing.assert_allclose(sums, x.astype(np.float64).sum(axis=(0, 2)), rtol=1e-5)
    assert top == x.max()
    for step in plan.steps:
        if isinstance(step, KernelStep):
            assert math.prod(step.kernel.reduce_shape) <= 100
