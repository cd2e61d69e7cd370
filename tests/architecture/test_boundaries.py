"""Module boundaries that STYLE.md promises, enforced on the source (as kopf does with import-linter)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> Iterator[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def _modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def _importers(package: str, target: str) -> set[str]:
    found = set()
    for path in _modules(package):
        if any(name == target or name.startswith(target + ".") for name in _imports(path)):
            found.add(str(path.relative_to(ROOT)))
    return found


def test_only_the_nvml_seam_and_the_simulation_import_pynvml() -> None:
    # The simulation patches pynvml's C-function lookup, so it must import it too.
    users = _importers("exporter", "pynvml")
    offenders = {p for p in users if p != "exporter/nvml.py" and not p.startswith("exporter/sim/")}
    assert offenders == set()
    assert "exporter/nvml.py" in _importers("exporter", "pynvml")


def test_exporter_and_controller_do_not_import_each_other() -> None:
    assert _importers("exporter", "remediation") == set()
    assert _importers("remediation", "exporter") == set()


def test_product_code_never_imports_tests() -> None:
    for package in ("exporter", "remediation", "alerts", "dashboards", "demo"):
        assert _importers(package, "tests") == set(), package


def test_one_module_talks_to_the_kubernetes_api_in_the_controller() -> None:
    users = _importers("remediation", "kubernetes_asyncio")
    assert users == {"remediation/kube/client.py"}, users


def test_the_exporter_talks_to_the_kubernetes_api_through_its_own_client_only() -> None:
    # exporter/kube (below the plug-ins) holds the LIST/WATCH client on aiohttp and the reflector that
    # engines' pod discovery and attribution's ResourceSlice and pod-metadata watches share;
    # kubernetes_asyncio (+37 MiB of RSS) stays the controller's.
    assert _importers("exporter", "kubernetes_asyncio") == set()
