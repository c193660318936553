"""The layers of docs/architecture.md, checked on the source: every import of a funcgrad module by
another (at module level and inside functions alike) runs down the layer list, and no modules import
one another in a circle. Imports under ``if TYPE_CHECKING:`` are declarations for the type checker,
never executed, and are left out; everything else counts, with no allowlist.

    util  ->  ir  ->  core  ->  transforms
                  \\->  lower  ->  devices
    front (lazy, the jit runtime, autograd, numpy/, lax, random, Tensor methods, ...) -> all of the above
    nn/, datasets and the package face (funcgrad/__init__.py: the public API) -> front and below
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "funcgrad"

# what each layer may import (itself included); transforms and lower are siblings
ALLOWED: dict[str, set[str]] = {
    "util": {"util"},
    "ir": {"util", "ir"},
    "core": {"util", "ir", "core"},
    "transforms": {"util", "ir", "core", "transforms"},
    "lower": {"util", "ir", "lower"},
    "devices": {"util", "ir", "lower", "devices"},
    "front": {"util", "ir", "core", "transforms", "lower", "devices", "front"},
    "nn": {"util", "ir", "core", "transforms", "lower", "devices", "front", "nn"},
}
LAYER_PACKAGES = {"util", "ir", "core", "transforms", "lower", "devices", "nn"}


def layer_of(module: str) -> str:
    """funcgrad.<package>... -> that package's layer; the package face (``import funcgrad``) is the
    public API, the top; the rest of the top level is the front."""
    parts = module.split(".")
    if module == "funcgrad":
        return "nn"
    if len(parts) > 1 and parts[1] in LAYER_PACKAGES:
        return parts[1]
    if len(parts) > 1 and parts[1] == "datasets":
        return "nn"
    return "front"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking_block(node: ast.AST) -> bool:
    return isinstance(node, ast.If) and ast.unparse(node.test) in ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def imports(known: dict[str, Path]) -> list[tuple[str, str, int]]:
    """(importer, imported module, line) for every executed import of funcgrad code."""

    def resolve(name: str) -> str:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name

    edges = []
    for module, path in known.items():
        package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]

        def visit(node: ast.AST, module: str = module, package: list[str] = package) -> None:
            for child in ast.iter_child_nodes(node):
                if _is_type_checking_block(child):
                    for other in child.orelse:
                        visit(ast.Module(body=[other], type_ignores=[]))
                    continue
                if isinstance(child, ast.Import):
                    edges.extend((module, resolve(alias.name), child.lineno)
                                 for alias in child.names if alias.name.split(".")[0] == "funcgrad")
                elif isinstance(child, ast.ImportFrom):
                    base = package[:len(package) - child.level + 1] if child.level else []
                    name = ".".join(base + ([child.module] if child.module else []))
                    if name.split(".")[0] != "funcgrad":
                        continue
                    for alias in child.names:
                        full = f"{name}.{alias.name}"
                        edges.append((module, full if full in known else resolve(name), child.lineno))
                visit(child)

        visit(ast.parse(path.read_text(), str(path)))
    return edges


def import_cycles(edges: list[tuple[str, str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    graph: dict[str, set[str]] = defaultdict(set)
    for source, target, _ in edges:
        if source != target:
            graph[source].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in sorted(graph[node]):
            if successor not in index:
                connect(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            connect(node)
    return cycles


KNOWN = modules()
EDGES = imports(KNOWN)


def test_the_walk_sees_the_package() -> None:
    assert {"funcgrad", "funcgrad.util.tree", "funcgrad.ir.core", "funcgrad.lower.plan"} <= set(KNOWN)
    assert ("funcgrad.lower.plan", "funcgrad.lower.kernel") in {(a, b) for a, b, _ in EDGES}


def test_the_checks_catch_what_they_look_for() -> None:
    """The two checks on a made-up graph: an upward edge and a circle are found."""
    assert layer_of("funcgrad.lower.plan") == "lower" and layer_of("funcgrad.lazy") == "front"
    assert layer_of("funcgrad.lazy") not in ALLOWED[layer_of("funcgrad.lower.plan")]
    made_up = [("a", "b", 1), ("b", "c", 1), ("c", "a", 1), ("c", "d", 1)]
    assert import_cycles(made_up) == [["a", "b", "c"]]


def test_every_import_runs_down_the_layers() -> None:
    upward = [f"{KNOWN[source].relative_to(PACKAGE.parent)}:{line}: {source} ({layer_of(source)}) imports "
              f"{target} ({layer_of(target)})"
              for source, target, line in EDGES if layer_of(target) not in ALLOWED[layer_of(source)]]
    assert not upward, "imports up a layer:\n" + "\n".join(sorted(upward))


def test_no_modules_import_each_other_in_a_circle() -> None:
    cycles = import_cycles(EDGES)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_each_layer_has_code(layer: str) -> None:
    assert any(layer_of(module) == layer for module in KNOWN), layer
