"""The exporter's exceptions live in one module, every one under ExporterError and drawn in its docstring."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from exporter import errors

ROOT = Path(__file__).resolve().parents[2]


def _exception_classes(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ClassDef):
            bases = [
                b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                for b in node.bases
            ]
            if any(b.endswith(("Error", "Exception")) or b == "Expired" for b in bases):
                found.append(node.name)
    return found


def test_no_exception_class_is_defined_outside_errors_py() -> None:
    outside = {
        f"{path.relative_to(ROOT)}:{name}"
        for path in sorted((ROOT / "exporter").rglob("*.py"))
        if path.name != "errors.py" or path.parent.name != "exporter"
        for name in _exception_classes(path)
    }
    assert outside == set()


def test_every_error_is_an_exporter_error_drawn_in_the_docstring() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) > 20
    doc = errors.__doc__ or ""
    for cls in classes:
        assert issubclass(cls, errors.ExporterError), cls
        assert (
            f" {cls.__name__} " in doc
            or doc.strip().startswith(cls.__name__)
            or f"\n    {cls.__name__}\n" in doc
        ), cls
