"""No import cycles inside the exporter or the shared kernel (the simulator once had an 11-module one).

A cycle makes import order matter: it hung on one late import inside a function. Imports inside
functions count too, since they close a cycle just the same once they run.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHECKED = ("exporter", "gpupulse", "demo")


def _module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports (`from pkg import sub` counts as `pkg.sub`)."""
    paths = {_module_name(root, p): p for package in packages for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, set[str]] = {name: set() for name in paths}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    up = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*up, base] if base else up)
                subs = [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in paths]
                targets = subs if len(subs) == len(node.names) else [base, *subs]
            graph[name].update(t for t in targets if t in paths and t != name)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_exporter_kernel_and_demo_have_no_import_cycles() -> None:
    assert cycles(import_graph(ROOT, CHECKED)) == []


def test_a_cycle_through_a_late_import_is_found(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg.a import A\n")
    (pkg / "a.py").write_text("from pkg import b\nA = 1\n")
    (pkg / "b.py").write_text("def f() -> int:\n    from .c import C\n    return C\n")
    (pkg / "c.py").write_text("from pkg.a import A as C\n")
    (pkg / "d.py").write_text("import pkg.c\n")
    assert cycles(import_graph(tmp_path, ["pkg"])) == [["pkg.a", "pkg.b", "pkg.c"]]
