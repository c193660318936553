"""The reference interpreter: evaluate an IR on NumPy arrays with each primitive's NumPy ``impl``.

It is the oracle the compiled paths are tested against, and (until the compiler lands) the
evaluator behind lazy Tensors and jit. It works in the IR's own dtypes (float32 stays float32),
so its rounding is what a float32 device should reproduce within a few ulps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from funcgrad.ir.core import IR, Literal, Var


def eval_ir(ir: IR, args: Sequence[Any], consts: Sequence[Any] | None = None) -> list[np.ndarray]:
    """Evaluate ``ir`` on NumPy arrays ``args``; ``consts`` default to ``ir.consts`` (as arrays).

    >>> # ir = make_ir(lambda x: x * 2)(Tensor.ones(3)); eval_ir(ir, [np.ones(3, np.float32)])
    """
    if len(args) != len(ir.in_vars):
        raise TypeError(f"IR takes {len(ir.in_vars)} inputs, got {len(args)}")
    consts = ir.consts if consts is None else consts
    env: dict[int, np.ndarray] = {}
    for var, value in zip(ir.const_vars, consts):
        env[var.id] = np.asarray(value)
    for var, value in zip(ir.in_vars, args):
        env[var.id] = np.asarray(value)

    def read(atom: Var | Literal) -> np.ndarray:
        return np.asarray(atom.value) if isinstance(atom, Literal) else env[atom.id]

    with np.errstate(all="ignore"):  # IEEE results (inf, nan) are the defined behaviour
        for eqn in ir.eqns:
            outs = eqn.primitive.impl(*(read(a) for a in eqn.inputs), **eqn.param_dict)
            outs = outs if eqn.primitive.multiple_results else (outs,)
            for var, value in zip(eqn.outputs, outs):
                value = np.asarray(value)
                if value.dtype != var.aval.dtype or value.shape != var.aval.shape:
                    raise AssertionError(f"{eqn.primitive.name} impl returned {value.dtype}{value.shape}, "
                                         f"its shape rule says {var.aval}")
                env[var.id] = value
    return [read(a) for a in ir.outputs]
