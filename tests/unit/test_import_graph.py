"""No import cycle in rsc_health: the graph of which module imports which, read from the
source (ast), has no strongly connected component larger than one module.

Every import counts, a function's deferred one as much as a module-level one: a deferred
import that closes a cycle is the same tangle (the module cannot be understood, tested or
moved without the other), only hidden from the interpreter. An import under
`if TYPE_CHECKING:` is for annotations alone and does not count. `from package import
submodule` is an edge to the submodule; a submodule's own package, imported first by Python,
is not an edge unless the submodule takes a name the package defines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = "rsc_health"


def _modules(root: Path = ROOT) -> dict[str, Path]:
    mods = {}
    for path in sorted((root / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


def _imports(tree: ast.Module) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement, but those under `if TYPE_CHECKING:`."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    mods = _modules(root)

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(up + ([base] if base else []))
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in mods]
                # Only submodules taken: no name of the package itself is used.
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            for target in targets:
                if target == PACKAGE or target.startswith(PACKAGE + "."):
                    dep = owner(target)
                    if dep and dep != name:
                        deps.add(dep)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(graph: dict[str, set[str]], component: list[str]) -> str:
    inside = set(component)
    return "\n".join(f"  {m} -> {', '.join(sorted(graph[m] & inside))}" for m in component)


def test_rsc_health_has_no_import_cycle():
    graph = import_graph()
    found = cycles(graph)
    assert not found, "import cycles in rsc_health:\n" + "\n\n".join(
        _describe(graph, c) for c in found)


def test_the_graph_sees_a_deferred_import_that_closes_a_cycle(tmp_path):
    """The test itself: a planted pair (a module-level import one way, a function's import the
    other) is a cycle; the same pair with the way back under TYPE_CHECKING is not."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from rsc_health.sub import b\nX = 1\n")
    (pkg / "a.py").write_text("from rsc_health.sub import b\n")
    (pkg / "sub" / "b.py").write_text("def f():\n    from rsc_health import a\n    return a\n")
    graph = import_graph(tmp_path)
    assert graph["rsc_health.a"] == {"rsc_health.sub.b"}  # the submodule, not its package
    assert cycles(graph) == [["rsc_health.a", "rsc_health.sub.b"]]

    (pkg / "sub" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rsc_health import a\n")
    assert cycles(import_graph(tmp_path)) == []

    (pkg / "sub" / "c.py").write_text("from . import X\n")  # a name of its own package
    (pkg / "sub" / "__init__.py").write_text("from .c import *\nX = 1\n")
    assert cycles(import_graph(tmp_path)) == [["rsc_health.sub", "rsc_health.sub.c"]]
