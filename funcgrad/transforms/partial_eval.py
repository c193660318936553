"""Partial evaluation: split an IR into what can run now and what must wait.

Given which inputs are *unknown*, ``partial_eval`` returns two IRs:

* the known IR: ``(known inputs) -> (known outputs..., residuals...)``
* the unknown IR: ``(residuals..., unknown inputs) -> (unknown outputs)``

An equation is unknown when any of its inputs is, unless its primitive has a rule in ``pe_rules``
(higher-order primitives split their bodies recursively, so a jit call inside a gradient stays a
jit call on both sides). Residuals are the known values the unknown equations read.

Reverse mode is ``jvp`` -> ``partial_eval`` with the tangents unknown (``linearize``) -> transpose
of the unknown part: the known IR is the forward pass, the residuals what it saves for the backward
pass. Every split leaves dead equations; ``dce`` (in ``ir/simplify.py``) removes them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from funcgrad.ir.core import IR, Eqn, Var
from funcgrad.ir.primitives import Primitive
from funcgrad.ir.simplify import dce

# rule(eqn, unknown_inputs) -> (known_eqns, unknown_eqns, unknown_outputs: list[bool])
PartialEvalRule = Callable[[Eqn, Sequence[bool]], tuple[list[Eqn], list[Eqn], list[bool]]]
pe_rules: dict[Primitive, PartialEvalRule] = {}


def partial_eval(ir: IR, unknown_inputs: Sequence[bool],
                 instantiate: Sequence[bool] | None = None) -> tuple[IR, IR, list[bool], int]:
    """Split ``ir``; returns (known IR, unknown IR, which outputs are unknown, number of residuals).

    Outputs flagged in ``instantiate`` are made unknown even when computable now: their value is
    passed to the unknown IR as a residual (control flow needs that to give every branch or loop
    iteration the same split)."""
    if len(unknown_inputs) != len(ir.in_vars):
        raise ValueError(f"partial_eval: {len(unknown_inputs)} flags for {len(ir.in_vars)} inputs")
    unknown: set[int] = {v.id for v, u in zip(ir.in_vars, unknown_inputs) if u}

    def is_unknown(atom: Any) -> bool:
        return isinstance(atom, Var) and atom.id in unknown

    known_eqns: list[Eqn] = []
    unknown_eqns: list[Eqn] = []
    for eqn in ir.eqns:
        flags = [is_unknown(a) for a in eqn.inputs]
        rule = pe_rules.get(eqn.primitive)
        if rule is not None and any(flags):
            known_part, unknown_part, out_flags = rule(eqn, flags)
            known_eqns.extend(known_part)
            unknown_eqns.extend(unknown_part)
            unknown.update(v.id for v, u in zip(eqn.outputs, out_flags) if u)
        elif any(flags):
            unknown_eqns.append(eqn)
            unknown.update(v.id for v in eqn.outputs)
        else:
            known_eqns.append(eqn)

    out_unknown = [is_unknown(a) or bool(instantiate and instantiate[i]) for i, a in enumerate(ir.outputs)]
    defined_unknown = {v.id for v in ir.in_vars if v.id in unknown}
    for eqn in unknown_eqns:
        defined_unknown.update(v.id for v in eqn.outputs)
    residuals: dict[int, Var] = {}
    for eqn in unknown_eqns:
        for atom in eqn.inputs:
            if isinstance(atom, Var) and atom.id not in defined_unknown:
                residuals.setdefault(atom.id, atom)
    for atom, flag in zip(ir.outputs, out_unknown):  # known values forced into the unknown side
        if flag and isinstance(atom, Var) and atom.id not in defined_unknown:
            residuals.setdefault(atom.id, atom)
    residual_vars = list(residuals.values())

    known_inputs = [v for v, u in zip(ir.in_vars, unknown_inputs) if not u]
    known_outputs = [a for a, u in zip(ir.outputs, out_unknown) if not u]
    known_ir = dce(IR(known_inputs, known_eqns, known_outputs + residual_vars, ir.const_vars, ir.consts))
    unknown_inputs_vars = [v for v, u in zip(ir.in_vars, unknown_inputs) if u]
    unknown_ir = dce(IR(residual_vars + unknown_inputs_vars, unknown_eqns,
                        [a for a, u in zip(ir.outputs, out_unknown) if u]))
    return known_ir, unknown_ir, out_unknown, len(residual_vars)
